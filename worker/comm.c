/*
 * comm.c - libpsagg's communication thread: scheduling, pushes, updates, failure detection.
 *
 * It takes submitted operations into its active list (by priority, then age), has each one's
 * chunks encoded by the operation's buffer operations (worker.h: psagg_bufops) once their
 * push buffers are free, pushes them within each server's in-flight window, checks every
 * update (runtime/message.h, then: from the chunk's owner, for the round in flight, once) and
 * hands it to the operation's buffer operations, and completes the operation when they say
 * its output is written. Every 20 ms it reads the control connections (an ABORT or a closed
 * connection fails everything) and checks the operations' deadlines.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "runtime/gate.h"
#include "runtime/message.h"
#include "worker.h"

typedef struct comm_state {
    psagg_ctx *ctx;
    /* taken from the queue, not complete; by priority. At most one operation per tensor is
     * in flight (handle_new), so the declaration bounds it: cap = the number of tensors. */
    struct psagg_handle **active;
    uint32_t n_active, cap;
    int64_t next_ctl_check;
    psagg_gate gate;    /* who sent an update (runtime/gate.h) */
    int told_servers;   /* the servers heard why this worker failed */
    int64_t next_ping;  /* when the servers get their next PING */
    int64_t next_stats; /* when the next stats line is due ([log] stats_interval_ms) */
    psagg_stats last;   /* the counters at the last stats line */
    char why[512];      /* a deadline's message */
} comm_state;

/* Move newly submitted operations into the active list, ordered by priority then age. */
static void take_queue(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    struct psagg_handle *q;
    pthread_mutex_lock(&ctx->mu);
    q = ctx->queue;
    ctx->queue = NULL;
    pthread_mutex_unlock(&ctx->mu);
    while (q) {
        struct psagg_handle *h = q;
        uint32_t i;
        q = q->next;
        h->next = NULL;
        h->t_taken = psagg_now_ns();
        if (cs->n_active == cs->cap) { /* cannot happen: one operation per tensor */
            worker_fail_all(ctx, PSAGG_EINVAL, "more operations in flight than tensors (%u)",
                            cs->cap);
            return;
        }
        i = cs->n_active++;
        while (i > 0 &&
               (cs->active[i - 1]->priority < h->priority ||
                (cs->active[i - 1]->priority == h->priority && cs->active[i - 1]->seq > h->seq))) {
            cs->active[i] = cs->active[i - 1];
            i--;
        }
        cs->active[i] = h;
    }
}

static void remove_active(comm_state *cs, struct psagg_handle *h)
{
    for (uint32_t i = 0; i < cs->n_active; i++)
        if (cs->active[i] == h) {
            memmove(&cs->active[i], &cs->active[i + 1],
                    (size_t)(cs->n_active - i - 1) * sizeof *cs->active);
            cs->n_active--;
            return;
        }
}

/*
 * h succeeded: its phases go into the context's sums and, with [log] timeline, into the
 * trace (a span with its phases' durations, on a lane no other span overlaps there).
 */
static void account_op(psagg_ctx *ctx, struct psagg_handle *h)
{
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
    psagg_timing t;

    handle_timing(h, &t);
    atomic_fetch_add(&ctx->time_ns[0], t.queued_ns);
    atomic_fetch_add(&ctx->time_ns[1], t.encode_ns);
    atomic_fetch_add(&ctx->time_ns[2], t.send_ns);
    atomic_fetch_add(&ctx->time_ns[3], t.wait_ns);
    atomic_fetch_add(&ctx->time_ns[4], t.decode_ns);
    atomic_fetch_add(&ctx->time_ns[5], t.total_ns);
    if (!ctx->timeline)
        return;
    {
        /* the phases of psagg_timing: queued, encode, send, wait, decode */
        static const char *const keys[] = {"round", "key", "chunks", "bytes", "decode_ns"};
        psagg_span sp = {.name = ti->name,
                         .cat = "push_pull",
                         .start_ns = h->t_submit,
                         .ends = {h->t_taken, h->t_encoded, h->t_sent, h->t_updates, h->t_done},
                         .n_phases = 5,
                         .keys = keys,
                         .n_args = 5,
                         .args = {h->round, h->key, ti->n_chunks,
                                  (int64_t)(ti->count * sizeof(float)), (int64_t)t.decode_ns},
                         .str_key = "buffers",
                         .str_val = h->ops->kind};
        psagg_timeline_span(ctx->timeline, &sp);
    }
}

static void finish_op(comm_state *cs, struct psagg_handle *h, psagg_status status, const char *msg)
{
    psagg_ctx *ctx = cs->ctx;
    int internal = adapt_is_stats(ctx, h); /* the adaptive statistics: nobody waits on it */
    remove_active(cs, h);
    if (!status && !internal) { /* counted before it completes: a waiter's stats include it */
        h->t_done = psagg_now_ns();
        account_op(ctx, h);
        atomic_fetch_add(&ctx->push_pulls, 1);
    }
    pthread_mutex_lock(&ctx->mu);
    if (ctx->tensors[h->key].op == h) {
        tensor_state *ts = &ctx->tensors[h->key];
        int param = ctx->layout.tensors[h->key].param;
        uint32_t kind = h->prm.flags & PSAGG_PARAM_KIND_MASK;
        ts->op = NULL;
        if (!status && param && kind == PSAGG_PARAM_INIT) { /* the chunks' round */
            ts->inited = 1;
            ts->round = h->reply_round;
        } else if (!status && (!param || kind == PSAGG_PARAM_GRAD)) {
            ts->round++; /* INIT and PULL do not count a round */
        }
    }
    if (!internal)
        handle_complete_locked(ctx, h, status, msg);
    pthread_mutex_unlock(&ctx->mu);
    if (internal)
        adapt_stats_done(ctx, h, status, msg); /* frees it */
}

/*
 * The body of a parameter's INIT (worker 0: the fp32 weights, which must be finite) or PULL
 * (none): written into the push buffers; PSAGG_OK, or a negative status (psagg_fail).
 */
static psagg_status param_body(psagg_ctx *ctx, struct psagg_handle *h)
{
    static const psagg_codec fp32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC};
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];

    if ((h->prm.flags & PSAGG_PARAM_KIND_MASK) != PSAGG_PARAM_INIT || ctx->rank != 0)
        return PSAGG_OK;
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        size_t bad = 0;
        psagg_status st = psagg_encode(
            &fp32, h->out + ci->offset, NULL, ci->count, (psagg_rng_key){0, 0},
            ctx->chunks[ti->first_chunk + c].buf + sizeof(psagg_msg_hdr), 4 * ci->count, &bad);
        if (st)
            return psagg_fail_context(st,
                                      "psagg_param_init: tensor '%.63s': weight %llu: ", ti->name,
                                      (unsigned long long)(ci->offset + bad));
    }
    return PSAGG_OK;
}

static void apply_update(comm_state *cs, struct psagg_handle *h, const uint8_t *msg,
                         const psagg_msg_codec *mc, int complete);

/* [server] quorum: an update that came before this worker's push of its round (wire.h). */
struct early_update {
    psagg_msg_codec mc; /* as psagg_msg_check read it */
    uint8_t msg[];      /* the checked message: header, payload, bitmap (and MAC) */
};

/*
 * Have every chunk of h encoded (so a bad gradient fails the call before anything is sent),
 * then write the headers. Returns 1 when encoded, 0 when not yet (a chunk buffer is still
 * being sent, or the encode is still running), -1 when h failed (and left the active list).
 */
static int encode_op(comm_state *cs, struct psagg_handle *h)
{
    psagg_ctx *ctx = cs->ctx;
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
    char msg[256];
    psagg_status st;
    int r;

    for (uint32_t c = 0; c < ti->n_chunks; c++)
        if (ctx->chunks[ti->first_chunk + c].send_pending)
            return 0;
    r = adapt_codec(ctx, h, msg, sizeof msg); /* this round's codec (adaptive: may wait) */
    if (r < 0) {
        finish_op(cs, h, (psagg_status)r, msg);
        return -1;
    }
    if (r == 0)
        return 0;
    adapt_measure(ctx, h); /* a statistics round: before the encode moves the residual */
    if (ti->param && (h->prm.flags & PSAGG_PARAM_KIND_MASK) != PSAGG_PARAM_GRAD)
        st = param_body(ctx, h);
    else
        st = h->ops->encode(ctx, h);
    if (st == PSAGG_BUF_PENDING)
        return 0;
    if (st) {
        finish_op(cs, h, st, psagg_last_error());
        return -1;
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        uint8_t *buf = ctx->chunks[ti->first_chunk + c].buf;
        psagg_msg_hdr *mh = (psagg_msg_hdr *)buf;
        psagg_msg_init(mh, PSAGG_MSG_PUSH, (uint32_t)ctx->rank, h->round, ci, &h->codec, h->gen);
        mh->epoch = (uint16_t)ctx->epoch; /* (read without the lock: informational) */
        if (ti->param) {                  /* the body's length for its kind, then the trailer */
            uint32_t kind = h->prm.flags & PSAGG_PARAM_KIND_MASK;
            if (kind == PSAGG_PARAM_PULL || (kind == PSAGG_PARAM_INIT && ctx->rank != 0))
                mh->len = 0;
            else if (kind == PSAGG_PARAM_INIT)
                mh->len = (uint32_t)(4 * ci->count);
            memcpy(buf + sizeof *mh + mh->len, &h->prm, sizeof h->prm);
            mh->len += (uint32_t)sizeof h->prm;
        }
        if (ctx->tag_bytes) { /* sealed for its server alone, under a number of its own */
            server_conn *sc = &ctx->servers[ci->owner];
            psagg_node_seal(&ctx->node, &sc->push_key, ++sc->push_seq, buf, sizeof *mh + mh->len);
        }
    }
    h->encoded = 1;
    h->t_encoded = psagg_now_ns();
    if (ctx->early) /* [server] quorum: updates that came first (their chunks are not sent) */
        for (uint32_t c = 0; c < ti->n_chunks && !worker_failed(ctx); c++) {
            struct early_update *e = ctx->early[ti->first_chunk + c];
            if (!e || ((const psagg_msg_hdr *)e->msg)->round != h->round)
                continue; /* (or of the next round: the next operation's) */
            ctx->early[ti->first_chunk + c] = NULL;
            apply_update(cs, h, e->msg, &e->mc, 0); /* (poll_completing completes h) */
            free(e);
        }
    return worker_failed(ctx) ? 0 : 1;
}

/*
 * Push what the windows allow, highest priority first. Returns 2 if an encode is still running
 * on a device (nothing in the fabric will say when it is done), 1 if pushes wait for room in
 * a window or in the provider's queue (a completion will end the wait), else 0.
 */
static int schedule(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    int waiting = 0;

    for (uint32_t i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
        if (!h->encoded) {
            int r = encode_op(cs, h);
            if (r < 0) {
                i--; /* h left the active list */
                continue;
            }
            if (r == 0) {
                waiting = 2;
                continue;
            }
        }
        while (h->next_send < ti->n_chunks) {
            uint32_t g = ti->first_chunk + h->next_send;
            const psagg_chunk_info *ci = &ctx->layout.chunks[g];
            server_conn *sc = &ctx->servers[ci->owner];
            if (h->chunk_done[h->next_send]) { /* its round closed without it ([server] quorum) */
                if (++h->next_send == ti->n_chunks)
                    h->t_sent = psagg_now_ns();
                continue;
            }
            /* the header encode_op wrote has the payload's length */
            size_t len = sizeof(psagg_msg_hdr) + ((const psagg_msg_hdr *)ctx->chunks[g].buf)->len;
            psagg_status st;
            if (sc->inflight >= ctx->cfg.max_inflight) {
                waiting = waiting ? waiting : 1;
                break;
            }
            ctx->chunks[g].send_pending = 1;
            st = psagg_fabric_try_send(ctx->fab, sc->addr, ctx->chunks[g].buf, len + ctx->tag_bytes,
                                       ctx->chunks[g].desc, &ctx->chunks[g]);
            if (st == PSAGG_EAGAIN) { /* the provider's queue is full: after the next poll */
                ctx->chunks[g].send_pending = 0;
                return waiting ? waiting : 1;
            }
            if (st) {
                ctx->chunks[g].send_pending = 0;
                worker_fail_all(ctx, PSAGG_EPEER, "pushing tensor '%s' chunk %u to server %u: %s",
                                ti->name, ci->index, ci->owner, psagg_last_error());
                return 0;
            }
            sc->inflight++;
            if (++h->next_send == ti->n_chunks)
                h->t_sent = psagg_now_ns();
            atomic_fetch_add(&ctx->bytes_sent, len);
            atomic_fetch_add(&ctx->bytes_raw, ci->count * sizeof(float));
        }
    }
    return waiting;
}

/*
 * h's buffer operations are writing its output: complete it once they are done. Their
 * failure (an invalid update found on a device, or the device failed) fails the job, as an
 * invalid update does on the host (on_update).
 */
static void try_complete(comm_state *cs, struct psagg_handle *h)
{
    psagg_status st = h->ops->complete(cs->ctx, h);
    if (st == PSAGG_OK)
        finish_op(cs, h, st, NULL);
    else if (st != PSAGG_BUF_PENDING)
        worker_fail_all(cs->ctx, st, "%s", psagg_last_error());
}

/* The gate's view of the servers (runtime/gate.h): the server whose fabric address is addr
 * (or -1), and server s's data key. */
static int server_at(const void *owner, psagg_peer addr)
{
    const psagg_ctx *ctx = owner;
    for (int s = 0; addr != PSAGG_PEER_UNKNOWN && s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].addr == addr)
            return s;
    return -1;
}

static psagg_data_rx *server_rx(void *owner, int s)
{
    return &((psagg_ctx *)owner)->servers[s].rx;
}

/* Whether a [server] quorum update's contributor bitmap (after its payload) names worker
 * `rank` (0..world-1: the bitmap's bytes cover them). */
static int bitmap_has(const psagg_msg_hdr *mh, int rank)
{
    const uint8_t *bits = (const uint8_t *)mh + sizeof *mh + mh->len;
    return bits[rank / 8] >> (rank % 8) & 1;
}

/*
 * [server] quorum: check an update's contributor bitmap (after its payload) against `summed`
 * and say whether this worker's push is in it: 1 in, 0 left out, -1 the job failed.
 */
static int bitmap_has_me(psagg_ctx *ctx, const psagg_msg_hdr *mh, const char *name)
{
    const uint8_t *bits = (const uint8_t *)mh + sizeof *mh + mh->len;
    unsigned n = 0;
    for (size_t i = 0; i < ctx->bitmap_bytes; i++)
        for (int b = 0; b < 8; b++)
            if (bits[i] >> b & 1) {
                if ((int)(8 * i) + b >= ctx->world) {
                    worker_fail_all(ctx, PSAGG_EPROTO,
                                    "server %u sent the update of tensor '%s' chunk %u round %u "
                                    "naming worker %zu in its bitmap; the job has %d",
                                    mh->sender, name, mh->chunk, mh->round, 8 * i + (size_t)b,
                                    ctx->world);
                    return -1;
                }
                n++;
            }
    if (n != mh->summed) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %u sent the update of tensor '%s' chunk %u round %u summing %u "
                        "workers, but its bitmap names %u",
                        mh->sender, name, mh->chunk, mh->round, mh->summed, n);
        return -1;
    }
    return bitmap_has(mh, ctx->rank);
}

/*
 * [server] quorum: an update of a round this worker has not encoded yet (the next operation's,
 * or the one in flight's before its encode) waits in early[] until that operation is encoded
 * (encode_op). Returns 1 when it was kept (or the job failed), 0 when it is not an early one.
 */
static int keep_early(psagg_ctx *ctx, const struct psagg_handle *h, const psagg_rxbuf *rb,
                      const psagg_msg_codec *mc)
{
    const psagg_msg_hdr *mh = (const psagg_msg_hdr *)rb->buf;
    const psagg_tensor_info *ti = &ctx->layout.tensors[mh->key];
    uint32_t g = ti->first_chunk + mh->chunk;
    struct early_update *e;

    /* the round of the operation in flight before it is encoded; the next round while one is
       in flight (its other chunks' updates still to come); with none, the next operation's */
    if (h ? !(mh->round == h->round + 1 || (mh->round == h->round && !h->encoded))
          : mh->round != ctx->tensors[mh->key].round)
        return 0;
    if (ctx->early[g]) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %u sent two updates of tensor '%s' chunk %u (rounds %u and %u) "
                        "before this worker pushed it: a worker is never left more than one "
                        "round behind",
                        mh->sender, ti->name, mh->chunk,
                        ((const psagg_msg_hdr *)ctx->early[g]->msg)->round, mh->round);
        return 1;
    }
    if (!(e = malloc(sizeof *e + rb->len))) {
        worker_fail_all(ctx, PSAGG_ENOMEM, "keeping an early update of tensor '%s'", ti->name);
        return 1;
    }
    e->mc = *mc;
    memcpy(e->msg, rb->buf, rb->len);
    ctx->early[g] = e;
    return 1;
}

/*
 * One update arrived: check its source (a server of this job; on tcp libfabric names it) and,
 * with data_auth, its MAC under that server's data key before believing anything in it; then
 * its fields, and that it comes from the chunk's owner; then apply it (apply_update), or keep
 * it until this worker's own push of its round is encoded ([server] quorum).
 */
static void on_update(comm_state *cs, const psagg_rxbuf *rb, psagg_peer src)
{
    psagg_ctx *ctx = cs->ctx;
    const psagg_msg_hdr *mh = (const psagg_msg_hdr *)rb->buf;
    const psagg_chunk_info *ci;
    const psagg_tensor_info *ti;
    psagg_msg_codec mc;
    enum psagg_msg_type type;
    const char *bad;
    int from;

    if ((from = psagg_gate_sender(&cs->gate, rb->buf, rb->len, src)) < 0)
        return;
    type = rb->len >= sizeof *mh && mh->type == PSAGG_MSG_WEIGHTS ? PSAGG_MSG_WEIGHTS
                                                                  : PSAGG_MSG_UPDATE;
    bad = psagg_msg_check(rb->buf, rb->len, ctx->tag_bytes + ctx->bitmap_bytes, type, &ctx->layout,
                          &ci, &mc);
    if (bad) {
        worker_fail_all(ctx, PSAGG_EPROTO, "an update's field %s is invalid (%zu bytes)", bad,
                        rb->len);
        return;
    }
    ti = &ctx->layout.tensors[mh->key];
    if (mh->sender != ci->owner || from != (int)ci->owner) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %d sent an update of tensor '%s' chunk %u (field sender %u), "
                        "whose owner is server %u",
                        from, ti->name, mh->chunk, mh->sender, ci->owner);
        return;
    }
    atomic_fetch_add(&ctx->bytes_received, rb->len);
    if (ctx->bitmap_bytes && keep_early(ctx, ctx->tensors[mh->key].op, rb, &mc))
        return;
    apply_update(cs, ctx->tensors[mh->key].op, rb->buf, &mc, 1);
}

/*
 * A checked update for operation h (or NULL): that it is of h's round and kind, then hand it
 * to h's buffer operations (with [server] quorum, first carry this worker's push if the round
 * left it out). complete: complete h now when it was its last update (else poll_completing
 * does).
 */
static void apply_update(comm_state *cs, struct psagg_handle *h, const uint8_t *msg,
                         const psagg_msg_codec *mcp, int complete)
{
    psagg_ctx *ctx = cs->ctx;
    const psagg_msg_hdr *mh = (const psagg_msg_hdr *)msg;
    const psagg_tensor_info *ti = &ctx->layout.tensors[mh->key];
    const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + mh->chunk];
    enum psagg_msg_type type = mh->type == PSAGG_MSG_WEIGHTS ? PSAGG_MSG_WEIGHTS : PSAGG_MSG_UPDATE;
    psagg_msg_codec mc = *mcp;
    psagg_status st;
    int mode, in = 1;
    uint32_t kind;
    int64_t t0;

    kind = h ? h->prm.flags & PSAGG_PARAM_KIND_MASK : PSAGG_PARAM_GRAD;
    /* an INIT's answers name the chunks' round (a restored checkpoint's): one for all */
    if (h && ti->param && kind == PSAGG_PARAM_INIT && !h->reply_set) {
        h->reply_round = mh->round;
        h->reply_set = 1;
    }
    if (!h || mh->round != (kind == PSAGG_PARAM_INIT ? h->reply_round : h->round) ||
        h->chunk_done[mh->chunk] || (kind != PSAGG_PARAM_GRAD && type != PSAGG_MSG_WEIGHTS)) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %u sent an unexpected %s of tensor '%s' chunk %u round %u",
                        mh->sender, type == PSAGG_MSG_WEIGHTS ? "WEIGHTS" : "update", ti->name,
                        mh->chunk, mh->round);
        return;
    }
    if (type == PSAGG_MSG_WEIGHTS) {
        mode = PSAGG_DECODE_SET; /* the exact weights (msg_check: fp32, a parameter's) */
    } else if (mc.generation != (h->gen & PSAGG_MSG_GEN_MASK) ||
               !psagg_codec_equal(&mc.codec, &h->codec)) {
        char a[40], b[40];
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %u sent the update of tensor '%s' chunk %u round %u in %s "
                        "(assignment generation %u); this worker pushed it in %s (generation %u)",
                        mh->sender, ti->name, mh->chunk, mh->round,
                        psagg_codec_name(&mc.codec, a, sizeof a), mc.generation,
                        psagg_codec_name(&h->codec, b, sizeof b), h->gen);
        return;
    } else {
        mode = ti->param                ? PSAGG_DECODE_ADD /* the weights += the delta */
               : h->op == PSAGG_AVERAGE ? PSAGG_DECODE_SCALE
                                        : PSAGG_DECODE_SET;
    }
    if (ctx->cfg.elastic || ctx->bitmap_bytes ? mh->summed > ctx->world || !mh->summed
                                              : mh->summed != ctx->world) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %u sent the update of tensor '%s' chunk %u round %u summing %u "
                        "workers; the job has %d%s",
                        mh->sender, ti->name, mh->chunk, mh->round, mh->summed, ctx->world,
                        ctx->cfg.elastic || ctx->bitmap_bytes ? "" : " and is not elastic");
        return;
    }
    if (ctx->bitmap_bytes && (in = bitmap_has_me(ctx, mh, ti->name)) < 0)
        return;
    if (ctx->bitmap_bytes && h->need_rank >= 0 && (!in || !bitmap_has(mh, h->need_rank))) {
        /* a broadcast's round without its root's push (the others would take zeros for its
           bytes) or without this worker's (carried, its header would land in the next
           round's bytes) */
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "psagg_broadcast: server %u closed round %u of tensor '%s' chunk %u "
                        "without %s %d's push ([server] quorum, grace_ms): a broadcast cannot "
                        "carry a push to a later round",
                        mh->sender, mh->round, ti->name, mh->chunk, in ? "root" : "this worker,",
                        in ? h->need_rank : ctx->rank);
        return;
    }
    if (!in) { /* the round closed without this worker's push: its next push carries it */
        if (kind != PSAGG_PARAM_GRAD || !h->ops->carry) {
            worker_fail_all(ctx, PSAGG_EPROTO,
                            "server %u left this worker's push out of tensor '%s' chunk %u "
                            "round %u, which %s",
                            mh->sender, ti->name, mh->chunk, mh->round,
                            kind != PSAGG_PARAM_GRAD ? "every worker's push must be in"
                                                     : "its buffers cannot carry");
            return;
        }
        if ((st = h->ops->carry(ctx, h, ci))) {
            worker_fail_all(ctx, st, "%s", psagg_last_error());
            return;
        }
        atomic_fetch_add(&ctx->left_out, 1);
    }
    h->chunk_scale[mh->chunk] = 1.0f / (float)mh->summed;
    t0 = psagg_now_ns();
    st = h->ops->update(ctx, h, ci, &mc.codec, mode, msg + sizeof *mh, mc.len);
    if (h->done_chunks + 1 < ti->n_chunks) /* the last one's decode is in t_done - t_updates */
        h->update_ns += (uint64_t)(psagg_now_ns() - t0);
    else
        h->t_updates = t0;
    if (st) { /* its message says which tensor, chunk and server */
        worker_fail_all(ctx, PSAGG_EPROTO, "%s", psagg_last_error());
        return;
    }
    h->chunk_done[mh->chunk] = 1;
    if (++h->done_chunks < ti->n_chunks)
        return;
    if (ctx->cfg.elastic || ctx->bitmap_bytes) { /* say when chunks summed different workers */
        float lo = h->chunk_scale[0], hi = lo;
        for (uint32_t c = 1; c < ti->n_chunks; c++) {
            lo = h->chunk_scale[c] < lo ? h->chunk_scale[c] : lo;
            hi = h->chunk_scale[c] > hi ? h->chunk_scale[c] : hi;
        }
        if (lo != hi)
            LOG_DEBUG(&ctx->log,
                      "tensor '%s' round %u: its chunks summed %.0f to %.0f workers (one left "
                      "during the round, or [server] quorum closed some without a straggler); "
                      "each chunk's update says its own",
                      ti->name, h->round, 1.0f / hi, 1.0f / lo);
    }
    h->completing = 1;
    if (complete)
        try_complete(cs, h);
}

/* Whether an operation waits for its buffer operations (a device's decodes) to finish. */
static int any_completing(const comm_state *cs)
{
    for (uint32_t i = 0; i < cs->n_active; i++)
        if (cs->active[i]->completing)
            return 1;
    return 0;
}

/* Complete the operations whose output their buffer operations have finished writing. */
static void poll_completing(comm_state *cs)
{
    for (uint32_t i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        uint32_t before = cs->n_active;
        if (!h->completing)
            continue;
        try_complete(cs, h);
        if (cs->n_active < before)
            i--; /* h left the active list */
    }
}

/* psagg_checkpoint asked: send every server a CHECKPOINT (under ctx->mu's protection). */
static void checkpoint_send(psagg_ctx *ctx)
{
    pthread_mutex_lock(&ctx->mu);
    if (ctx->ckpt_state != 1) {
        pthread_mutex_unlock(&ctx->mu);
        return;
    }
    ctx->ckpt_state = 2;
    pthread_mutex_unlock(&ctx->mu);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd < 0 || psagg_ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth,
                                                     PSAGG_CTL_CHECKPOINT, NULL, 0)) {
            worker_fail_all(ctx, PSAGG_EPEER, "asking server %d for a checkpoint: %s", s,
                            ctx->servers[s].fd < 0 ? "not connected" : psagg_last_error());
            return;
        }
}

/* Server s answered a CHECKPOINT (a psagg_ctl_error: status 0 and its file, or why not). */
static void checkpoint_done(psagg_ctx *ctx, int s, psagg_ctl_error *e)
{
    e->msg[sizeof e->msg - 1] = '\0';
    pthread_mutex_lock(&ctx->mu);
    if (ctx->ckpt_state == 2) {
        if (e->status && !ctx->ckpt_status) {
            ctx->ckpt_status =
                psagg_status_is_failure(e->status) ? (psagg_status)e->status : PSAGG_EPEER;
            snprintf(ctx->ckpt_msg, sizeof ctx->ckpt_msg, "server %d: %.250s", s, e->msg);
        }
        if (!e->status)
            LOG_INFO(&ctx->log, "checkpoint: server %d wrote %s", s, e->msg);
        if (--ctx->ckpt_left == 0) {
            ctx->ckpt_state = 0;
            pthread_cond_broadcast(&ctx->cv);
        }
    }
    pthread_mutex_unlock(&ctx->mu);
}

/* psagg_sync_membership asked: send server 0 a SYNC with every tensor's state. */
static void sync_send(psagg_ctx *ctx)
{
    uint32_t n = ctx->layout.n_tensors, seq;
    size_t len = sizeof(psagg_ctl_sync) + (size_t)n * sizeof(psagg_ctl_tensor_state);
    psagg_ctl_sync *sy;
    psagg_ctl_tensor_state *ts;
    psagg_status st;

    pthread_mutex_lock(&ctx->mu);
    if (ctx->sync_state != 1) {
        pthread_mutex_unlock(&ctx->mu);
        return;
    }
    ctx->sync_state = 2;
    seq = ctx->sync_seq + 1;
    if (!(sy = calloc(1, len))) {
        pthread_mutex_unlock(&ctx->mu);
        worker_fail_all(ctx, PSAGG_ENOMEM, "no memory for a SYNC");
        return;
    }
    ts = (psagg_ctl_tensor_state *)(sy + 1);
    sy->seq = seq;
    sy->n_tensors = n;
    for (uint32_t t = 0; t < n; t++)
        ts[t] = (psagg_ctl_tensor_state){.round = ctx->tensors[t].round,
                                         .flags = ctx->tensors[t].inited ? PSAGG_TSTATE_INITED : 0};
    pthread_mutex_unlock(&ctx->mu);
    st = ctx->servers[0].fd < 0 ? psagg_fail(PSAGG_EPEER, "not connected")
                                : psagg_ctl_send(ctx->servers[0].fd, &ctx->servers[0].auth,
                                                 PSAGG_CTL_SYNC, sy, (uint32_t)len);
    free(sy);
    if (st)
        worker_fail_all(ctx, PSAGG_EPEER, "sending server 0 the SYNC of barrier %u: %s", seq,
                        psagg_last_error());
}

/* Server 0 let this worker pass barrier seq (having admitted `joined` workers). */
static void sync_done(psagg_ctx *ctx, const psagg_ctl_hdr *h, const psagg_ctl_sync_done *d)
{
    pthread_mutex_lock(&ctx->mu);
    if (ctx->sync_state != 2 || d->seq != ctx->sync_seq + 1 ||
        h->len != sizeof *d + (size_t)d->n_tensors * sizeof(psagg_ctl_tensor_state)) {
        int state = ctx->sync_state;
        pthread_mutex_unlock(&ctx->mu);
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server 0 sent SYNC_DONE of barrier %u (%u bytes) while this worker %s",
                        d->seq, h->len, state == 2 ? "waited in another barrier" : "was in none");
        return;
    }
    ctx->sync_seq = d->seq;
    ctx->sync_joined = d->joined;
    ctx->sync_state = 0;
    pthread_cond_broadcast(&ctx->cv);
    pthread_mutex_unlock(&ctx->mu);
}

/*
 * Server 0 started a membership epoch (elastic jobs; runtime/wire.h): check it, take it, and
 * relay the frame unchanged to every other server, which applies it (server/membership.c).
 * A frame that does not check out, or one that leaves this worker out, fails it.
 */
psagg_status membership_take(psagg_ctx *ctx, const psagg_ctl_hdr *h, const void *body, int joining)
{
    const psagg_ctl_membership *m = body;
    const uint8_t *live = (const uint8_t *)(m + 1);
    int n_live = 0, rank = 0;
    psagg_status st;

    if (h->len != sizeof *m + (size_t)ctx->world || m->n_workers != (uint32_t)ctx->world)
        return psagg_fail(PSAGG_EPROTO,
                          "server 0 sent a MEMBERSHIP frame of %u bytes (field n_workers): this "
                          "job has %d workers",
                          h->len, ctx->world);
    for (int k = 0; k < ctx->world; k++) {
        n_live += live[k] == 1;
        rank += k < ctx->rank && live[k] == 1;
    }
    /* a joiner takes the epoch that admits it, whatever its number */
    if ((joining ? m->left != -1 : m->epoch != ctx->epoch + 1) || (uint32_t)n_live != m->n_live ||
        m->left < -1 || m->left >= ctx->world || memchr(m->why, 0, sizeof m->why) == NULL ||
        (m->flags & ~PSAGG_MEMBERSHIP_DONE) || (m->flags && m->left < 0))
        return psagg_fail(PSAGG_EPROTO,
                          "server 0 sent membership epoch %u (fields epoch, n_live, left) after "
                          "epoch %u%s",
                          m->epoch, ctx->epoch, joining ? ", to a worker waiting to join" : "");
    if (live[ctx->rank] != 1)
        return psagg_fail(joining ? PSAGG_EPROTO : PSAGG_EPEER,
                          "server 0 %s this worker in membership epoch %u: %s",
                          joining ? "did not admit" : "removed", m->epoch, m->why);
    pthread_mutex_lock(&ctx->mu);
    ctx->epoch = m->epoch;
    ctx->n_live = n_live;
    memcpy(ctx->live, live, (size_t)ctx->world);
    pthread_mutex_unlock(&ctx->mu);
    if (!joining && m->left >= 0) /* (a joiner's admission: handshake.c says so) */
        psagg_log(&ctx->log, m->flags & PSAGG_MEMBERSHIP_DONE ? PSAGG_LOG_INFO : PSAGG_LOG_WARN,
                  "membership epoch %u: worker %d left (%s); %d workers go on, this one is rank "
                  "%d of them",
                  m->epoch, m->left, m->why, n_live, rank);
    else if (!joining)
        LOG_WARN(&ctx->log, "membership epoch %u: %s; %d workers now, this one is rank %d",
                 m->epoch, m->why, n_live, rank);
    for (int s = 1; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0 &&
            (st = psagg_ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_MEMBERSHIP,
                                 body, h->len)))
            return psagg_fail(PSAGG_EPEER, "relaying membership epoch %u to server %d: %s",
                              m->epoch, s, psagg_last_error());
    return PSAGG_OK;
}

/*
 * Control connections: PINGs both ways (runtime/channel.h); an ABORT/ERROR frame, a closed
 * socket or a server silent for op_timeout_ms fails everything.
 */
static void check_control(comm_state *cs, int64_t now)
{
    psagg_ctx *ctx = cs->ctx;
    int op = ctx->cfg.op_timeout_ms;
    int ping = now >= cs->next_ping;
    if (ping)
        cs->next_ping = now + psagg_ping_interval_ms(op);
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        struct pollfd p = {.fd = ctx->servers[s].fd, .events = POLLIN};
        psagg_ctl_hdr h;
        void *body = NULL;
        const char *text;
        char peer[96];
        psagg_status st;
        if (p.fd < 0)
            continue;
        snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
                 ctx->cfg.servers[s].port);
        if (ping && psagg_ctl_send(p.fd, &ctx->servers[s].auth, PSAGG_CTL_PING, NULL, 0))
            LOG_DEBUG(&ctx->log, "%s: PING: %s", peer, psagg_last_error());
        if (poll(&p, 1, 0) <= 0) {
            if (now - ctx->servers[s].heard_at > op) {
                worker_fail_all(ctx, PSAGG_ETIMEDOUT,
                                "%s sent nothing for %.1f s, more than op_timeout_ms=%d "
                                "(stopped, hung or cut off)",
                                peer, (double)(now - ctx->servers[s].heard_at) / 1e3, op);
                return;
            }
            continue;
        }
        ctx->servers[s].heard_at = now;
        st = psagg_ctl_recv(p.fd, &ctx->servers[s].auth, &h, &body, psagg_now_ms() + 2000, peer);
        if (st == PSAGG_EAGAIN) /* (an injected frame, dropped) */
            continue;
        if (!st && h.type == PSAGG_CTL_PING && h.len == 0) {
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_CHECKPOINT_DONE && h.len == sizeof(psagg_ctl_error)) {
            checkpoint_done(ctx, s, body);
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_MEMBERSHIP && s == 0 && ctx->cfg.elastic) {
            if ((st = membership_take(ctx, &h, body, 0)))
                worker_fail_all(ctx, st, "%s", psagg_last_error());
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_SYNC_DONE && s == 0 && ctx->cfg.elastic &&
            h.len >= sizeof(psagg_ctl_sync_done)) {
            sync_done(ctx, &h, body);
            free(body);
            continue;
        }
        if (st)
            worker_fail_all(ctx, PSAGG_EPEER, "%s", psagg_last_error());
        else if ((st = psagg_ctl_error_parse(&h, body, &text)))
            worker_fail_all(ctx, st, "%s: %s", peer, text);
        else
            worker_fail_all(ctx, PSAGG_EPROTO, "%s sent control frame type %u during the job", peer,
                            h.type);
        free(body);
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
    }
}

static void check_deadlines(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    int64_t now = psagg_now_ms();
    for (uint32_t i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
        char waiting[96] = "";
        size_t used = 0;
        int n = 0;
        if (now < h->deadline_ms)
            continue;
        if (adapt_waiting(ctx, h, cs->why, sizeof cs->why)) {
            worker_fail_all(ctx, PSAGG_ETIMEDOUT, "%s", cs->why);
            return;
        }
        for (int s = 0; s < ctx->cfg.n_servers && used + 8 < sizeof waiting; s++) {
            int owes = 0; /* s owns a chunk of h whose update has not come */
            for (uint32_t c = 0; c < ti->n_chunks && !owes; c++)
                owes = !h->chunk_done[c] &&
                       ctx->layout.chunks[ti->first_chunk + c].owner == (uint32_t)s;
            if (owes) {
                used += (size_t)snprintf(waiting + used, sizeof waiting - used, "%s%d",
                                         n ? "," : "", s);
                n++;
            }
        }
        worker_fail_all(ctx, PSAGG_ETIMEDOUT,
                        "push_pull of tensor '%s' round %u: no update from %s %s within 2 x "
                        "op_timeout_ms=%d",
                        ti->name, h->round, n == 1 ? "server" : "servers", waiting,
                        ctx->cfg.op_timeout_ms);
        return;
    }
}

/* A push's send completed (or failed): its buffer and its window slot are free again. */
static void push_sent(psagg_ctx *ctx, chunk_buf *cb)
{
    if (!cb || !cb->send_pending)
        return;
    cb->send_pending = 0;
    ctx->servers[ctx->layout.chunks[cb - ctx->chunks].owner].inflight--;
}

/*
 * Once the context has failed, every operation was completed by worker_fail_all and its
 * owner may release it at any time: forget them all.
 */
/*
 * This worker failed: tell the servers it is still connected to why, in an ABORT, so that
 * they fail the job naming the cause (a dead server, say) instead of only this worker.
 */
static void tell_servers(psagg_ctx *ctx)
{
    char msg[sizeof ctx->failed_msg];
    psagg_status status;
    pthread_mutex_lock(&ctx->mu);
    status = ctx->failed_status;
    snprintf(msg, sizeof msg, "%s", ctx->failed_msg);
    pthread_mutex_unlock(&ctx->mu);
    if (status == PSAGG_ECLOSED)
        return;
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0 &&
            psagg_ctl_send_error(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_ABORT, status,
                                 msg))
            LOG_DEBUG(&ctx->log, "server %d: could not send the ABORT: %s", s, psagg_last_error());
}

static int drop_if_failed(comm_state *cs)
{
    if (!worker_failed(cs->ctx))
        return 0;
    cs->n_active = 0;
    if (!cs->told_servers) {
        tell_servers(cs->ctx);
        cs->told_servers = 1;
    }
    return 1;
}

/* [log] stats_interval_ms: what the push_pulls did since the last line, at info. */
static void stats_line(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    psagg_stats now;
    uint64_t n;
    double ms;

    worker_stats(ctx, &now);
    n = now.push_pulls - cs->last.push_pulls;
    ms = n ? 1e-6 / (double)n : 0;
    LOG_INFO(&ctx->log,
             "stats: %llu push_pulls, %.1f MB raw, %.1f MB sent, %.1f MB received; mean ms "
             "queued %.3f encode %.3f send %.3f wait %.3f decode %.3f total %.3f",
             (unsigned long long)n, (double)(now.bytes_raw - cs->last.bytes_raw) / 1e6,
             (double)(now.bytes_sent - cs->last.bytes_sent) / 1e6,
             (double)(now.bytes_received - cs->last.bytes_received) / 1e6,
             (double)(now.time.queued_ns - cs->last.time.queued_ns) * ms,
             (double)(now.time.encode_ns - cs->last.time.encode_ns) * ms,
             (double)(now.time.send_ns - cs->last.time.send_ns) * ms,
             (double)(now.time.wait_ns - cs->last.time.wait_ns) * ms,
             (double)(now.time.decode_ns - cs->last.time.decode_ns) * ms,
             (double)(now.time.total_ns - cs->last.time.total_ns) * ms);
    cs->last = now;
}

static void *comm_main(void *arg)
{
    psagg_ctx *ctx = arg;
    comm_state cs = {.ctx = ctx,
                     .gate = {.peer_kind = "server",
                              .n_peers = ctx->cfg.n_servers,
                              .source_reliable = ctx->source_reliable,
                              .tag_bytes = ctx->tag_bytes,
                              .log = &ctx->log,
                              .peer_at = server_at,
                              .rx_of = server_rx,
                              .owner = ctx}};
    psagg_fabric_event ev[64];

    cs.cap = ctx->layout.n_tensors;
    cs.active = calloc(cs.cap, sizeof *cs.active);
    if (!cs.active) {
        worker_fail_all(ctx, PSAGG_ENOMEM, "communication thread state for %u tensors", cs.cap);
        return NULL;
    }
    while (atomic_load(&ctx->running)) {
        int waiting, n, syncing;
        int64_t now;
        take_queue(&cs);
        drop_if_failed(&cs);
        checkpoint_send(ctx);
        sync_send(ctx);
        waiting = schedule(&cs);
        /*
         * Sleep in the completion wait: completions and updates end it, and so does a new
         * operation (handle_submit wakes this thread while comm_idle says it may sleep). Only
         * work on a device (an encode or the decodes of a completing operation) is polled,
         * every millisecond; the control checks need a turn every 20 ms.
         */
        atomic_store(&ctx->comm_idle, 1);
        pthread_mutex_lock(&ctx->mu);
        n = ctx->queue != NULL;
        syncing = ctx->sync_state != 0; /* its answer comes on server 0's control channel */
        pthread_mutex_unlock(&ctx->mu);
        n = psagg_fabric_poll(ctx->fab, ev, 64,
                              n                                                ? 0
                              : waiting == 2 || syncing || any_completing(&cs) ? 1
                                                                               : 10);
        atomic_store(&ctx->comm_idle, 0);
        if (n < 0) {
            worker_fail_all(ctx, PSAGG_EFABRIC, "completion queue: %s", psagg_last_error());
            break;
        }
        for (int i = 0; i < n; i++) {
            switch (ev[i].kind) {
            case PSAGG_FABRIC_SEND_DONE:
                push_sent(ctx, ev[i].ctx);
                break;
            case PSAGG_FABRIC_SEND_ERROR: {
                /* name the server: a dead one fails our sends before its socket's EOF is read */
                chunk_buf *cb = ev[i].ctx;
                int s = cb ? (int)ctx->layout.chunks[cb - ctx->chunks].owner : -1;
                push_sent(ctx, cb);
                if (s >= 0)
                    worker_fail_all(ctx, ev[i].status ? (psagg_status)ev[i].status : PSAGG_EPEER,
                                    "a push to server %d (%s:%u) failed: %s", s,
                                    ctx->cfg.servers[s].host, ctx->cfg.servers[s].port, ev[i].msg);
                else
                    worker_fail_all(ctx, ev[i].status ? (psagg_status)ev[i].status : PSAGG_EPEER,
                                    "a push failed: %s", ev[i].msg);
                break;
            }
            case PSAGG_FABRIC_RECV_DONE: {
                psagg_rxbuf *rb = ev[i].ctx;
                rb->len = ev[i].len;
                if (!drop_if_failed(&cs))
                    on_update(&cs, rb, ev[i].src);
                if (psagg_rxpool_repost(&ctx->rx, rb))
                    worker_fail_all(ctx, PSAGG_EFABRIC, "reposting a receive: %s",
                                    psagg_last_error());
                break;
            }
            case PSAGG_FABRIC_RECV_ERROR:
                if (atomic_load(&ctx->running))
                    worker_fail_all(ctx, ev[i].status ? (psagg_status)ev[i].status : PSAGG_EFABRIC,
                                    "a receive failed: %s", ev[i].msg);
                break;
            }
        }
        if (!drop_if_failed(&cs))
            poll_completing(&cs);
        now = psagg_now_ms();
        if (now >= cs.next_ctl_check || syncing) {
            check_control(&cs, now);
            if (!drop_if_failed(&cs))
                check_deadlines(&cs);
            cs.next_ctl_check = now + 20;
        }
        if (ctx->cfg.stats_interval_ms && now >= cs.next_stats) {
            if (cs.next_stats)
                stats_line(&cs);
            cs.next_stats = now + ctx->cfg.stats_interval_ms;
        }
    }
    drop_if_failed(&cs); /* a failure psagg_close stopped us right after: tell the servers */
    psagg_gate_flush(&cs.gate);
    free(cs.active);
    return NULL;
}

psagg_status comm_start(psagg_ctx *ctx)
{
    for (int s = 0; s < ctx->cfg.n_servers; s++) /* their silence counts from READY */
        ctx->servers[s].heard_at = psagg_now_ms();
    atomic_store(&ctx->running, 1);
    if (pthread_create(&ctx->comm_tid, NULL, comm_main, ctx)) {
        atomic_store(&ctx->running, 0);
        return psagg_fail(PSAGG_EIO, "cannot start the communication thread");
    }
    return PSAGG_OK;
}

void comm_stop(psagg_ctx *ctx)
{
    if (!atomic_load(&ctx->running))
        return;
    atomic_store(&ctx->running, 0);
    pthread_join(ctx->comm_tid, NULL);
}
