/*
 * comm.c - libpsagg's communication thread: scheduling, pushes, updates, failure detection.
 *
 * It takes submitted operations into its active list (by priority, then age), has each one's
 * chunks encoded by the operation's buffer operations (worker.h: psagg__bufops) once their
 * push buffers are free, pushes them within each server's in-flight window, checks every
 * update (updates.c) and hands it to the operation's buffer operations, and completes the
 * operation when they say its output is written. Every 20 ms it reads the control
 * connections (control.c: an ABORT or a closed connection fails everything; requests'
 * answers, membership epochs) and checks the operations' deadlines.
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
    psagg__gate gate;   /* who sent an update (runtime/gate.h) */
    int64_t next_ping;  /* when the servers get their next PING (control.c) */
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
        h->t_taken = psagg__now_ns();
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
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
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
        psagg__span sp = {.name = ti->name,
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
        psagg__timeline_span(ctx->timeline, &sp);
    }
}

static void finish_op(comm_state *cs, struct psagg_handle *h, psagg_status status, const char *msg)
{
    psagg_ctx *ctx = cs->ctx;
    int internal = adapt_is_stats(ctx, h); /* the adaptive statistics: nobody waits on it */
    remove_active(cs, h);
    if (!status && !internal) { /* counted before it completes: a waiter's stats include it */
        h->t_done = psagg__now_ns();
        account_op(ctx, h);
        atomic_fetch_add(&ctx->push_pulls, 1);
    }
    pthread_mutex_lock(&ctx->mu);
    if (ctx->tensors[h->key].op == h) {
        tensor_state *ts = &ctx->tensors[h->key];
        int param = ctx->layout.tensors[h->key].param;
        uint32_t kind = h->prm.flags & PSAGG_PARAM_KIND_MASK;
        ts->op = NULL;
        /* with server replicas INIT and PULL count a round too */
        int every = ctx->cfg.server_replicas > 0;
        if (!status && param && kind == PSAGG_PARAM_INIT) { /* the chunks' round */
            ts->inited = 1;
            ts->round = h->reply_round + (uint32_t)every;
            ts->pulls += (uint32_t)every;
        } else if (!status && (!param || kind == PSAGG_PARAM_GRAD || every)) {
            ts->round++; /* INIT and PULL do not count a round, but with server replicas */
            ts->pulls += (uint32_t)(param && kind != PSAGG_PARAM_GRAD);
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
 * (none): written into the push buffers; PSAGG_OK, or a negative status (psagg__fail).
 */
static psagg_status param_body(psagg_ctx *ctx, struct psagg_handle *h)
{
    static const psagg_codec fp32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];

    if ((h->prm.flags & PSAGG_PARAM_KIND_MASK) != PSAGG_PARAM_INIT || ctx->rank != 0)
        return PSAGG_OK;
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        size_t bad = 0;
        psagg_status st = psagg__encode(
            &fp32, h->out + ci->offset, NULL, ci->count, (psagg__rng_key){0, 0},
            chunk_push(ctx, ti->first_chunk + c, h->round)->buf + sizeof(psagg__msg_hdr),
            4 * ci->count, &bad);
        if (st)
            return psagg__fail_context(st,
                                       "psagg_param_init: tensor '%.63s': weight %llu: ", ti->name,
                                       (unsigned long long)(ci->offset + bad));
    }
    return PSAGG_OK;
}

/*
 * Have every chunk of h encoded (so a bad gradient fails the call before anything is sent),
 * then write the headers. Returns 1 when encoded, 0 when not yet (a chunk buffer is still
 * being sent, or the encode is still running), -1 when h failed (and left the active list).
 */
static int encode_op(comm_state *cs, struct psagg_handle *h)
{
    psagg_ctx *ctx = cs->ctx;
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    char msg[256];
    psagg_status st;
    int r;

    for (uint32_t c = 0; c < ti->n_chunks; c++)
        if (chunk_push(ctx, ti->first_chunk + c, h->round)->send_pending)
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
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        uint8_t *buf = chunk_push(ctx, ti->first_chunk + c, h->round)->buf;
        psagg__msg_hdr *mh = (psagg__msg_hdr *)buf;
        psagg__msg_init(mh, PSAGG_MSG_PUSH, (uint32_t)ctx->rank, h->round, ci, &h->codec, h->gen);
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
    }
    h->encoded = 1;
    h->t_encoded = psagg__now_ns();
    if (ctx->early) /* [server] quorum: updates that came first (their chunks are not sent) */
        for (uint32_t c = 0; c < ti->n_chunks && !worker_failed(ctx); c++) {
            struct early_update *e = ctx->early[ti->first_chunk + c];
            if (!e || ((const psagg__msg_hdr *)e->msg)->round != h->round)
                continue; /* (or of the next round: the next operation's) */
            ctx->early[ti->first_chunk + c] = NULL;
            update_apply(ctx, h, e->msg, &e->mc); /* (poll_completing completes h) */
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
    /* first: the rounds a moved chunk's new owner needs, then the copies waiting */
    int waiting = failover_resend(ctx) | failover_send_copies(ctx);

    for (uint32_t i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
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
            const psagg__chunk_info *ci = &ctx->layout.chunks[g];
            uint32_t owner = chunk_owner(ctx, g), to;
            if (h->chunk_done[h->next_send]) { /* its round closed without it ([server] quorum) */
                if (++h->next_send == ti->n_chunks)
                    h->t_sent = psagg__now_ns();
                continue;
            }
            /* its server comes back, or is lost here (given up during the start-up, or before
               this push): the next view says where */
            if (failover_held(ctx, g) || failover_lost(ctx, (int)owner)) {
                waiting = waiting ? waiting : 1;
                break;
            }
            push_buf *pb = chunk_push(ctx, g, h->round);
            psagg_status st;
            pb->sent_to = 0;
            to = failover_first(ctx, pb, g); /* (its owner, or where copies follow its copy) */
            if (ctx->servers[to].inflight >= ctx->cfg.max_inflight) {
                waiting = waiting ? waiting : 1;
                break;
            }
            st = push_send(ctx, pb, to);
            if (st == PSAGG_EAGAIN) /* the provider's queue is full: after the next poll */
                return waiting ? waiting : 1;
            if (st) {
                worker_fail_all(ctx, PSAGG_EPEER, "pushing tensor '%s' chunk %u to server %u: %s",
                                ti->name, ci->index, to, psagg_last_error());
                return 0;
            }
            if (++h->next_send == ti->n_chunks)
                h->t_sent = psagg__now_ns();
            atomic_fetch_add(&ctx->bytes_raw, ci->count * sizeof(float));
        }
    }
    return waiting;
}

/*
 * h's buffer operations are writing its output: complete it once they are done. Their
 * failure (an invalid update found on a device, or the device failed) fails the job, as an
 * invalid update does on the host (updates.c).
 */
static void try_complete(comm_state *cs, struct psagg_handle *h)
{
    psagg_status st = h->ops->complete(cs->ctx, h);
    if (st == PSAGG_OK)
        finish_op(cs, h, st, NULL);
    else if (st != PSAGG_BUF_PENDING)
        worker_fail_all(cs->ctx, st, "%s", psagg_last_error());
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

static void check_deadlines(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    int64_t now = psagg__now_ms();
    for (uint32_t i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
        char waiting[96] = "";
        size_t used = 0;
        int n = 0;
        if (now < h->deadline_ms)
            continue;
        if (adapt_waiting(ctx, h, cs->why, sizeof cs->why)) {
            worker_fail_all(ctx, PSAGG_ETIMEDOUT, "%s", cs->why);
            return;
        }
        for (int s = 0; s < ctx->cfg.n_servers; s++) {
            int owes = 0; /* s owns a chunk of h whose update has not come */
            for (uint32_t c = 0; c < ti->n_chunks && !owes; c++)
                owes = !h->chunk_done[c] && chunk_owner(ctx, ti->first_chunk + c) == (uint32_t)s;
            if (owes) {
                used = psagg__list_int(waiting, sizeof waiting, used, s);
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
static void push_sent(psagg_ctx *ctx, push_buf *pb)
{
    if (!pb || pb->send_pending != 1)
        return;
    pb->send_pending = 0;
    ctx->servers[pb->to].inflight--;
    failover_copy(ctx, pb); /* (a parameter chunk's push goes on to its copies) */
}

/*
 * Once the context has failed, every operation was completed by worker_fail_all and its
 * owner may release it at any time: forget them all.
 */
static int drop_if_failed(comm_state *cs)
{
    if (!worker_failed(cs->ctx))
        return 0;
    cs->n_active = 0;
    worker_tell_servers(cs->ctx); /* (once: it may have told them already) */
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
    comm_state cs = {.ctx = ctx};
    psagg__fabric_event ev[64];

    updates_gate(ctx, &cs.gate);
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
        control_requests_send(ctx); /* (psagg_checkpoint's, psagg_sync_membership's) */
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
        syncing = ctx->barrier.state != 0; /* (its answer comes on the owner's control channel) */
        pthread_mutex_unlock(&ctx->mu);
        n = psagg__fabric_poll(ctx->fab, ev, 64,
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
            case PSAGG_FABRIC_SEND_DONE: {
                int stale;
                push_buf *pb = push_of(ev[i].ctx, &stale);
                if (!stale) /* (else a send abandoned to a lost server: failover.c) */
                    push_sent(ctx, pb);
                break;
            }
            case PSAGG_FABRIC_SEND_ERROR: {
                /* name the server: a dead one fails our sends before its socket's EOF is read */
                int stale;
                push_buf *pb = push_of(ev[i].ctx, &stale);
                int s = pb ? (int)pb->to : -1;
                if (stale)
                    break; /* (abandoned: its server is lost already) */
                push_sent(ctx, pb);
                if (s >= 0 && (failover_lost(ctx, s) || failover_server_lost(ctx, s, ev[i].msg)))
                    break; /* ([cluster] server_replicas: the job goes on without it) */
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
                psagg__rxbuf *rb = ev[i].ctx;
                rb->len = ev[i].len;
                if (!drop_if_failed(&cs)) {
                    struct psagg_handle *h = update_arrived(ctx, &cs.gate, rb, ev[i].src);
                    if (h)
                        try_complete(&cs, h);
                }
                if (psagg__rxpool_repost(&ctx->rx, rb))
                    worker_fail_all(ctx, PSAGG_EFABRIC, "reposting a receive: %s",
                                    psagg_last_error());
                break;
            }
            case PSAGG_FABRIC_RECV_ERROR: {
                /* a same-host copy out of a server that died ([cluster] server_replicas: the
                   job goes on without it; the receive buffer is posted again) */
                int s = updates_server_at(ctx, ev[i].src);
                /* (a provider that names no peer: a connection reset by a server that died;
                   the control channel tells which, and a live one's lost update is named by
                   the operation's deadline) */
                if (s < 0 && ev[i].ctx && ctx->failover)
                    LOG_WARN(&ctx->log, "a receive failed: %s (a server that died?)", ev[i].msg);
                if (ev[i].ctx && ((s < 0 && ctx->failover) ||
                                  (s >= 0 && (failover_lost(ctx, s) ||
                                              failover_server_lost(ctx, s, ev[i].msg))))) {
                    if (psagg__rxpool_repost(&ctx->rx, ev[i].ctx))
                        worker_fail_all(ctx, PSAGG_EFABRIC, "reposting a receive: %s",
                                        psagg_last_error());
                    break;
                }
                if (atomic_load(&ctx->running))
                    worker_fail_all(ctx, ev[i].status ? (psagg_status)ev[i].status : PSAGG_EFABRIC,
                                    "a receive failed: %s", ev[i].msg);
                break;
            }
            }
        }
        if (!drop_if_failed(&cs))
            poll_completing(&cs);
        now = psagg__now_ms();
        if (now >= cs.next_ctl_check || syncing) {
            control_check(ctx, now, &cs.next_ping);
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
    psagg__gate_flush(&cs.gate);
    free(cs.active);
    return NULL;
}

psagg_status comm_start(psagg_ctx *ctx)
{
    for (int s = 0; s < ctx->cfg.n_servers; s++) /* their silence counts from READY */
        ctx->servers[s].heard_at = psagg__now_ms();
    atomic_store(&ctx->running, 1);
    if (pthread_create(&ctx->comm_tid, NULL, comm_main, ctx)) {
        atomic_store(&ctx->running, 0);
        return psagg__fail(PSAGG_EIO, "cannot start the communication thread");
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
