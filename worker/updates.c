/*
 * updates.c - an update's arrival (the communication thread): its source and, with
 * data_auth, its MAC (runtime/gate.h: the servers' fabric addresses and data keys) before
 * anything in it is believed; its fields (runtime/message.h), that it comes from its chunk's
 * owner, for the round in flight, once, in the codec pushed; [server] quorum's contributor
 * bitmap (a push left out is carried into the next one; an update that comes before this
 * worker's push of its round waits in ctx->early); then the operation's buffer operations
 * decode it (worker.h: psagg__bufops). Any bad update fails the job, naming the server and
 * the field.
 */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/gate.h"
#include "runtime/message.h"
#include "worker.h"

/* The gate's view of the servers (runtime/gate.h): the server whose fabric address is addr
 * (or -1), and server s's data key. */
int updates_server_at(const void *owner, psagg__peer addr)
{
    const psagg_ctx *ctx = owner;
    for (int s = 0; addr != PSAGG_PEER_UNKNOWN && s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].addr == addr)
            return s;
    return -1;
}

static psagg__data_rx *server_rx(void *owner, int s)
{
    return &((psagg_ctx *)owner)->servers[s].rx;
}

void updates_gate(psagg_ctx *ctx, psagg__gate *gate)
{
    *gate = (psagg__gate){.peer_kind = "server",
                          .n_peers = ctx->cfg.n_servers,
                          .source_reliable = ctx->source_reliable,
                          .tag_bytes = ctx->tag_bytes,
                          .log = &ctx->log,
                          .peer_at = updates_server_at,
                          .rx_of = server_rx,
                          .owner = ctx};
}

/* Whether a [server] quorum update's contributor bitmap (after its payload) names worker
 * `rank` (0..world-1: the bitmap's bytes cover them). */
static int bitmap_has(const psagg__msg_hdr *mh, int rank)
{
    return psagg__bitmap_has((const uint8_t *)mh + sizeof *mh + mh->len, (uint32_t)rank);
}

/*
 * [server] quorum: check an update's contributor bitmap (after its payload) against `summed`
 * and say whether this worker's push is in it: 1 in, 0 left out, -1 the job failed.
 */
static int bitmap_has_me(psagg_ctx *ctx, const psagg__msg_hdr *mh, const char *name)
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
static int keep_early(psagg_ctx *ctx, const struct psagg_handle *h, const psagg__rxbuf *rb,
                      const psagg__msg_codec *mc)
{
    const psagg__msg_hdr *mh = (const psagg__msg_hdr *)rb->buf;
    const psagg__tensor_info *ti = &ctx->layout.tensors[mh->key];
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
                        ((const psagg__msg_hdr *)ctx->early[g]->msg)->round, mh->round);
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
 * A checked update for operation h (or NULL): that it is of h's round and kind, then hand it
 * to h's buffer operations (with [server] quorum, first carry this worker's push if the round
 * left it out). Returns 1 when it was h's last update (h is completing: its caller completes
 * it), else 0 (also when the job failed).
 */
int update_apply(psagg_ctx *ctx, struct psagg_handle *h, const uint8_t *msg,
                 const psagg__msg_codec *mcp)
{
    const psagg__msg_hdr *mh = (const psagg__msg_hdr *)msg;
    const psagg__tensor_info *ti = &ctx->layout.tensors[mh->key];
    const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + mh->chunk];
    enum psagg__msg_type type =
        mh->type == PSAGG_MSG_WEIGHTS ? PSAGG_MSG_WEIGHTS : PSAGG_MSG_UPDATE;
    psagg__msg_codec mc = *mcp;
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
        return 0;
    }
    if (type == PSAGG_MSG_WEIGHTS) {
        mode = PSAGG_DECODE_SET; /* the exact weights (msg_check: fp32, a parameter's) */
    } else if (mc.generation != (h->gen & PSAGG_MSG_GEN_MASK) ||
               !psagg__codec_equal(&mc.codec, &h->codec)) {
        char a[40], b[40];
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %u sent the update of tensor '%s' chunk %u round %u in %s "
                        "(assignment generation %u); this worker pushed it in %s (generation %u)",
                        mh->sender, ti->name, mh->chunk, mh->round,
                        psagg_codec_name(&mc.codec, a, sizeof a), mc.generation,
                        psagg_codec_name(&h->codec, b, sizeof b), h->gen);
        return 0;
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
        return 0;
    }
    if (ctx->bitmap_bytes && (in = bitmap_has_me(ctx, mh, ti->name)) < 0)
        return 0;
    if (ctx->quorum && h->need_rank >= 0 && (!in || !bitmap_has(mh, h->need_rank))) {
        /* a broadcast's round without its root's push (the others would take zeros for its
           bytes) or without this worker's (carried, its header would land in the next
           round's bytes) */
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "psagg_broadcast: server %u closed round %u of tensor '%s' chunk %u "
                        "without %s %d's push ([server] quorum, grace_ms): a broadcast cannot "
                        "carry a push to a later round",
                        mh->sender, mh->round, ti->name, mh->chunk, in ? "root" : "this worker,",
                        in ? h->need_rank : ctx->rank);
        return 0;
    }
    if (!in) { /* the round closed without this worker's push: its next push carries it */
        if (kind != PSAGG_PARAM_GRAD || !h->ops->carry) {
            worker_fail_all(ctx, PSAGG_EPROTO,
                            "server %u left this worker's push out of tensor '%s' chunk %u "
                            "round %u, which %s",
                            mh->sender, ti->name, mh->chunk, mh->round,
                            kind != PSAGG_PARAM_GRAD ? "every worker's push must be in"
                                                     : "its buffers cannot carry");
            return 0;
        }
        if ((st = h->ops->carry(ctx, h, ci))) {
            worker_fail_all(ctx, st, "%s", psagg_last_error());
            return 0;
        }
        atomic_fetch_add(&ctx->left_out, 1);
    }
    h->chunk_scale[mh->chunk] = 1.0f / (float)mh->summed;
    t0 = psagg__now_ns();
    st = h->ops->update(ctx, h, ci, &mc.codec, mode, msg + sizeof *mh, mc.len);
    if (h->done_chunks + 1 < ti->n_chunks) /* the last one's decode is in t_done - t_updates */
        h->update_ns += (uint64_t)(psagg__now_ns() - t0);
    else
        h->t_updates = t0;
    if (st) { /* its message says which tensor, chunk and server */
        worker_fail_all(ctx, PSAGG_EPROTO, "%s", psagg_last_error());
        return 0;
    }
    h->chunk_done[mh->chunk] = 1;
    /* (a lost owner's next owner may need it relayed; its bitmap goes to the copies) */
    failover_keep_update(ctx, (uint32_t)(ci - ctx->layout.chunks), msg,
                         sizeof *mh + mh->len + ctx->bitmap_bytes);
    if (++h->done_chunks < ti->n_chunks)
        return 0;
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
    return 1;
}

/*
 * One update arrived: check its source (a server of this job; on tcp libfabric names it) and,
 * with data_auth, its MAC under that server's data key before believing anything in it; then
 * its fields, and that it comes from the chunk's owner; then apply it (apply_update), or keep
 * it until this worker's own push of its round is encoded ([server] quorum). Returns the
 * operation whose last update it was (to complete), or NULL.
 */
struct psagg_handle *update_arrived(psagg_ctx *ctx, psagg__gate *gate, const psagg__rxbuf *rb,
                                    psagg__peer src)
{
    const psagg__msg_hdr *mh = (const psagg__msg_hdr *)rb->buf;
    const psagg__chunk_info *ci;
    const psagg__tensor_info *ti;
    psagg__msg_codec mc;
    enum psagg__msg_type type;
    const char *bad;
    int from;
    uint32_t owner;

    if ((from = psagg__gate_sender(gate, rb->buf, rb->len, src)) < 0)
        return NULL;
    /* what a lost server sent before (its chunks move; once this worker reported its rounds,
       the next owner sends them: under a quorum, maybe other bytes), or one out of the view */
    if (failover_lost(ctx, from))
        return NULL;
    type = rb->len >= sizeof *mh && mh->type == PSAGG_MSG_WEIGHTS ? PSAGG_MSG_WEIGHTS
                                                                  : PSAGG_MSG_UPDATE;
    bad = psagg__msg_check(rb->buf, rb->len, ctx->tag_bytes + ctx->bitmap_bytes, type, &ctx->layout,
                           &ci, &mc);
    if (bad) {
        worker_fail_all(ctx, PSAGG_EPROTO, "an update's field %s is invalid (%zu bytes)", bad,
                        rb->len);
        return NULL;
    }
    ti = &ctx->layout.tensors[mh->key];
    owner = chunk_owner(ctx, (uint32_t)(ci - ctx->layout.chunks));
    /* a round summed again after a takeover, applied already, or the chunk's owner before
       the view that moved it (its new owner sends the round): dropped */
    if (failover_stale_update(ctx, mh, from)) {
        atomic_fetch_add(&ctx->bytes_received, rb->len);
        return NULL;
    }
    if (mh->sender != owner || from != (int)owner) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %d sent an update of tensor '%s' chunk %u (field sender %u), "
                        "whose owner is server %u",
                        from, ti->name, mh->chunk, mh->sender, owner);
        return NULL;
    }
    atomic_fetch_add(&ctx->bytes_received, rb->len);
    if (ctx->quorum && keep_early(ctx, ctx->tensors[mh->key].op, rb, &mc))
        return NULL;
    return update_apply(ctx, ctx->tensors[mh->key].op, rb->buf, &mc) ? ctx->tensors[mh->key].op
                                                                     : NULL;
}
