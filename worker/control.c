/*
 * control.c - the control connections while the job runs (the communication thread), and
 * the requests a calling thread makes over them.
 *
 * Requests (ctl_request, worker.h): psagg_checkpoint asks every server for a checkpoint (one
 * answer each: CHECKPOINT_DONE, its file or why not), psagg_sync_membership asks the
 * membership's owner (server 0 unless a server view moved it) to pass a barrier (SYNC with every
 * tensor's state and the codec assignments; one answer: SYNC_DONE, the workers it admitted). One
 * mechanism serves both: the caller (control_request) checks that no operation is in flight, marks
 * the request asked and waits; the communication thread sends it (control_requests_send) and counts
 * the answers (request_answer) until the last one wakes the caller, or the deadline or the job's
 * failure does.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "worker.h"

/* ---- requests ---- */

/* Under ctx->mu: PSAGG_EINVAL naming `fn` when a tensor has an operation in flight (a queued
 * one holds its slot too), for the calls made between steps. The internal ones (an adaptive
 * job's statistics push) are the communication thread's: a barrier's SYNC waits for them
 * (control_requests_send); a checkpoint, of parameters only, need not. */
static psagg_status between_steps(psagg_ctx *ctx, const char *fn)
{
    for (uint32_t t = 0; t < ctx->n_user; t++)
        if (ctx->tensors[t].op)
            return psagg__fail(PSAGG_EINVAL,
                               "%s: tensor '%s' has an operation in flight; call it between steps",
                               fn, ctx->layout.tensors[t].name);
    return PSAGG_OK;
}

psagg_status control_request(psagg_ctx *ctx, ctl_request *rq, const char *fn, int answers,
                             const void *body, uint32_t body_len)
{
    struct timespec until;
    psagg_status st = PSAGG_OK;

    /* the servers answer on their control thread, after the slowest member: the op deadline */
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += PSAGG_OP_DEADLINE_MS(ctx->cfg.op_timeout_ms) / 1000;
    pthread_mutex_lock(&ctx->mu);
    if (ctx->failed) {
        st = psagg__fail(ctx->failed_status, "%s", ctx->failed_msg);
        goto out;
    }
    if (rq->state) {
        st = psagg__fail(PSAGG_EINVAL, "%s: another thread is in it", fn);
        goto out;
    }
    if ((st = between_steps(ctx, fn)))
        goto out;
    rq->left = answers;
    rq->body_len = body_len <= sizeof rq->body ? body_len : 0;
    if (rq->body_len)
        memcpy(rq->body, body, rq->body_len);
    rq->status = PSAGG_OK;
    rq->msg[0] = '\0';
    rq->state = 1;
    if (atomic_load(&ctx->comm_idle))
        psagg__fabric_wake(ctx->fab);
    while (rq->state && !ctx->failed)
        if (pthread_cond_timedwait(&ctx->cv, &ctx->mu, &until) == ETIMEDOUT)
            break;
    if (ctx->failed)
        st = psagg__fail(ctx->failed_status, "%s", ctx->failed_msg);
    else if (rq->state)
        st = psagg__fail(PSAGG_ETIMEDOUT,
                         "%s: %d of %d answers did not come within 2 x "
                         "op_timeout_ms=%d",
                         fn, rq->left, answers, ctx->cfg.op_timeout_ms);
    else if (rq->status)
        st = psagg__fail(rq->status, "%s: %s", fn, rq->msg);
    rq->state = 0; /* (after a timeout, answers that come later are dropped) */
out:
    pthread_mutex_unlock(&ctx->mu);
    return st;
}

/* One answer to rq (the communication thread): the first failure is kept; the last answer
 * wakes the caller. 0 when rq waits for none (an answer nobody asked for). */
static int request_answer(psagg_ctx *ctx, ctl_request *rq, psagg_status status, const char *msg)
{
    int waited;
    pthread_mutex_lock(&ctx->mu);
    waited = rq->state == 2;
    if (waited && status && !rq->status) {
        rq->status = status;
        snprintf(rq->msg, sizeof rq->msg, "%s", msg);
    }
    if (waited && --rq->left == 0) {
        rq->state = 0;
        pthread_cond_broadcast(&ctx->cv);
    }
    pthread_mutex_unlock(&ctx->mu);
    return waited;
}

/* psagg_checkpoint's: a CHECKPOINT to every server (with server replicas, every server in the
   view this worker has not lost: each writes the chunks it owns). */
static psagg_status checkpoint_send(psagg_ctx *ctx)
{
    int asked = 0;
    for (int s = 0; s < ctx->cfg.n_servers; s++) /* an earlier call that timed out: its answer
                                                   comes first (one connection, in order) */
        if (ctx->ckpt.from[s] && ctx->ckpt.skip[s] < UINT8_MAX)
            ctx->ckpt.skip[s]++;
    memset(ctx->ckpt.from, 0, sizeof ctx->ckpt.from);
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        if (failover_lost(ctx, s))
            continue;
        if (ctx->servers[s].fd < 0 ||
            psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_CHECKPOINT,
                            ctx->ckpt.body, ctx->ckpt.body_len)) {
            char why[200];
            snprintf(why, sizeof why, "asking server %d for a checkpoint: %s", s,
                     ctx->servers[s].fd < 0 ? "not connected" : psagg_last_error());
            if (!ctx->failover || !failover_server_lost(ctx, s, why))
                return psagg__fail(PSAGG_EPEER, "%s", why);
            /* (with server replicas it is lost, and checkpoint_lost fails this checkpoint) */
        }
        ctx->ckpt.from[s] = 1;
        asked++;
    }
    pthread_mutex_lock(&ctx->mu);
    ctx->ckpt.left = asked;
    pthread_mutex_unlock(&ctx->mu);
    return PSAGG_OK;
}

/* With server replicas: a server asked for a checkpoint and lost before it answered fails the
   checkpoint (its chunks' new owners did not write them), instead of its answer's deadline. */
static void checkpoint_lost(psagg_ctx *ctx)
{
    char m[300];
    int waiting;
    pthread_mutex_lock(&ctx->mu);
    waiting = ctx->ckpt.state == 2;
    pthread_mutex_unlock(&ctx->mu);
    for (int s = 0; s < ctx->cfg.n_servers && waiting; s++)
        if (ctx->ckpt.from[s] && failover_lost(ctx, s)) {
            ctx->ckpt.from[s] = 0;
            snprintf(m, sizeof m,
                     "server %d was lost before it wrote its part of the checkpoint (the chunks "
                     "it owned are in no file of it): call psagg_checkpoint again",
                     s);
            request_answer(ctx, &ctx->ckpt, PSAGG_EPEER, m);
        }
}

/* Server s answered a CHECKPOINT (a psagg__ctl_error: status 0 and its file, or why not). */
static void checkpoint_done(psagg_ctx *ctx, int s, psagg__ctl_error *e)
{
    char m[300];
    e->msg[sizeof e->msg - 1] = '\0';
    snprintf(m, sizeof m, "server %d: %.250s", s, e->msg);
    if (ctx->ckpt.skip[s]) { /* the answer to a call that timed out, never this one's */
        ctx->ckpt.skip[s]--;
        return;
    }
    if (!ctx->ckpt.from[s])
        return; /* (not asked: a server that came back meanwhile, or an answer given twice) */
    ctx->ckpt.from[s] = 0;
    if (request_answer(ctx, &ctx->ckpt,
                       !e->status                            ? PSAGG_OK
                       : psagg__status_is_failure(e->status) ? (psagg_status)e->status
                                                             : PSAGG_EPEER,
                       m) &&
        !e->status)
        LOG_INFO(&ctx->log, "checkpoint: server %d %s %s", s,
                 ((const psagg__ctl_checkpoint *)(const void *)ctx->ckpt.body)->phase ==
                         PSAGG_CKPT_COMMIT
                     ? "committed"
                     : "prepared",
                 e->msg);
}

/*
 * psagg_sync_membership's: a SYNC with every tensor's state and the codec assignments this
 * worker keeps ([codec] adaptive) to the membership's owner; sent once adapt_settled
 * (control_requests_send).
 */
static psagg_status barrier_send(psagg_ctx *ctx)
{
    uint32_t n = ctx->layout.n_tensors, seq, gens, adapt_tensors;
    int o = failover_coordinator(ctx);
    size_t adapt_len = adapt_sync_size(ctx, &gens, &adapt_tensors);
    size_t len = sizeof(psagg__ctl_sync) + (size_t)n * sizeof(psagg__ctl_tensor_state) + adapt_len;
    psagg__ctl_sync *sy = calloc(1, len);
    psagg__ctl_tensor_state *ts;
    psagg_status st;

    if (!sy)
        return psagg__fail(PSAGG_ENOMEM, "no memory for a SYNC");
    ts = (psagg__ctl_tensor_state *)(sy + 1);
    pthread_mutex_lock(&ctx->mu);
    seq = ctx->sync_seq + 1;
    sy->seq = seq;
    sy->n_tensors = n;
    sy->adapt_gens = gens;
    sy->adapt_tensors = adapt_tensors;
    for (uint32_t t = 0; t < n; t++)
        ts[t] = (psagg__ctl_tensor_state){.round = ctx->tensors[t].round,
                                          .flags = ctx->tensors[t].inited ? PSAGG_TSTATE_INITED : 0,
                                          .pulls = ctx->tensors[t].pulls};
    adapt_sync_write(ctx, (uint8_t *)(ts + n));
    pthread_mutex_unlock(&ctx->mu);
    st = ctx->servers[o].fd < 0 ? psagg__fail(PSAGG_EPEER, "not connected")
                                : psagg__ctl_send(ctx->servers[o].fd, &ctx->servers[o].auth,
                                                  PSAGG_CTL_SYNC, sy, (uint32_t)len);
    free(sy);
    ctx->barrier_to = o;
    if (st && failover_server_lost(ctx, o, psagg_last_error())) {
        pthread_mutex_lock(&ctx->mu); /* (with replicas: sent again to the next owner) */
        if (ctx->barrier.state == 2)
            ctx->barrier.state = 1;
        pthread_mutex_unlock(&ctx->mu);
        return PSAGG_OK;
    }
    return st ? psagg__fail(PSAGG_EPEER, "sending server %d the SYNC of barrier %u: %s", o, seq,
                            psagg_last_error())
              : PSAGG_OK;
}

/* Server s, the membership's owner, let this worker pass barrier seq (having admitted `joined`
   workers). */
static void barrier_done(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h,
                         const psagg__ctl_sync_done *d)
{
    int state;
    pthread_mutex_lock(&ctx->mu);
    state = ctx->barrier.state;
    if (state == 2 && d->seq == ctx->sync_seq + 1 &&
        h->len == sizeof *d + psagg__ctl_sync_tail(d->n_tensors, d->adapt_gens, d->adapt_tensors)) {
        ctx->sync_seq = d->seq;
        ctx->sync_joined = d->joined;
        pthread_mutex_unlock(&ctx->mu);
        request_answer(ctx, &ctx->barrier, PSAGG_OK, NULL);
        return;
    }
    pthread_mutex_unlock(&ctx->mu);
    worker_fail_all(ctx, PSAGG_EPROTO,
                    "server %d sent SYNC_DONE of barrier %u (%u bytes) while this worker %s", s,
                    d->seq, h->len, state == 2 ? "waited in another barrier" : "was in none");
}

/* Send rq if a caller asked for it and ready(ctx) holds (its state 1 becomes 2: sent, answers
   awaited); ready, the communication thread's own test, is asked only then. */
static void request_send(psagg_ctx *ctx, ctl_request *rq, int (*ready)(const psagg_ctx *ctx),
                         psagg_status (*send)(psagg_ctx *ctx))
{
    psagg_status st;
    pthread_mutex_lock(&ctx->mu);
    if (rq->state != 1 || !ready(ctx)) {
        pthread_mutex_unlock(&ctx->mu);
        return;
    }
    rq->state = 2;
    pthread_mutex_unlock(&ctx->mu);
    if ((st = send(ctx)))
        worker_fail_all(ctx, st, "%s", psagg_last_error());
}

/* A checkpoint goes out, with server replicas, once no lost server's chunks wait for the view
   that moves them (the servers would write none of them). */
static int checkpoint_ready(const psagg_ctx *ctx)
{
    return !failover_deciding(ctx);
}

/* A barrier's SYNC goes out once the statistics are settled (adapt.c) and, with server
   replicas, no lost server waits for the view that removes it (it may be the owner). */
static int barrier_ready(const psagg_ctx *ctx)
{
    return adapt_settled(ctx) && !failover_deciding(ctx);
}

void control_requests_send(psagg_ctx *ctx)
{
    request_send(ctx, &ctx->ckpt, checkpoint_ready, checkpoint_send);
    if (ctx->failover)
        checkpoint_lost(ctx);
    /* a barrier right after a statistics round waits for their push and their solve: every
       member's SYNC then holds the same assignments, which a joiner takes (adapt.c) */
    /* with server replicas: a SYNC whose owner was lost since goes to the next one, once the
       view that removes it came (its SYNC_DONE may never come) */
    if (ctx->failover && !failover_deciding(ctx)) {
        pthread_mutex_lock(&ctx->mu);
        if (ctx->barrier.state == 2 && ctx->barrier_to != failover_coordinator(ctx))
            ctx->barrier.state = 1;
        pthread_mutex_unlock(&ctx->mu);
    }
    request_send(ctx, &ctx->barrier, barrier_ready, barrier_send);
}

/* ---- membership epochs ---- */

/*
 * Server `from`, the membership's owner (failover_coordinator: server 0 unless a server view
 * moved it), started a membership epoch (elastic jobs; runtime/wire.h): check it, take it, and
 * relay the frame unchanged to every other server, which applies it (server/membership.c).
 * A frame that does not check out, or one that leaves this worker out, fails it.
 */
psagg_status membership_take(psagg_ctx *ctx, int from, const psagg__ctl_hdr *h, const void *body,
                             int joining)
{
    const psagg__ctl_membership *m = body;
    const uint8_t *live = (const uint8_t *)(m + 1);
    int n_live = 0, rank = 0;
    psagg_status st;

    if (h->len != sizeof *m + (size_t)ctx->world || m->n_workers != (uint32_t)ctx->world)
        return psagg__fail(PSAGG_EPROTO,
                           "server %d sent a MEMBERSHIP frame of %u bytes (field n_workers): "
                           "this job has %d workers",
                           from, h->len, ctx->world);
    for (int k = 0; k < ctx->world; k++) {
        n_live += live[k] == 1;
        rank += k < ctx->rank && live[k] == 1;
    }
    /* a joiner takes the epoch that admits it, whatever its number */
    if ((joining ? m->left != -1 : m->epoch != ctx->epoch + 1) || (uint32_t)n_live != m->n_live ||
        m->left < -1 || m->left >= ctx->world || memchr(m->why, 0, sizeof m->why) == NULL ||
        (m->flags & ~PSAGG_MEMBERSHIP_DONE) || (m->flags && m->left < 0))
        return psagg__fail(PSAGG_EPROTO,
                           "server %d sent membership epoch %u (fields epoch, n_live, left) "
                           "after epoch %u%s",
                           from, m->epoch, ctx->epoch,
                           joining ? ", to a worker waiting to join" : "");
    if (live[ctx->rank] != 1)
        return psagg__fail(joining ? PSAGG_EPROTO : PSAGG_EPEER,
                           "server %d %s this worker in membership epoch %u: %s", from,
                           joining ? "did not admit" : "removed", m->epoch, m->why);
    pthread_mutex_lock(&ctx->mu);
    ctx->epoch = m->epoch;
    ctx->n_live = n_live;
    memcpy(ctx->live, live, (size_t)ctx->world);
    pthread_mutex_unlock(&ctx->mu);
    if (!joining && m->left >= 0) /* (a joiner's admission: handshake.c says so) */
        psagg__log(&ctx->log, m->flags & PSAGG_MEMBERSHIP_DONE ? PSAGG_LOG_INFO : PSAGG_LOG_WARN,
                   "membership epoch %u: worker %d left (%s); %d workers go on, this one is rank "
                   "%d of them",
                   m->epoch, m->left, m->why, n_live, rank);
    else if (!joining)
        LOG_WARN(&ctx->log, "membership epoch %u: %s; %d workers now, this one is rank %d",
                 m->epoch, m->why, n_live, rank);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (s != from && ctx->servers[s].fd >= 0 &&
            (st = psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_MEMBERSHIP,
                                  body, h->len)))
            return psagg__fail(PSAGG_EPEER, "relaying membership epoch %u to server %d: %s",
                               m->epoch, s, psagg_last_error());
    return PSAGG_OK;
}

/* ---- the connections ---- */

/*
 * The control connections, every 20 ms: PINGs both ways (runtime/channel.h); the answers to
 * requests; the membership's epochs (its owner's); an ABORT/ERROR frame, a closed socket or a
 * server silent for op_timeout_ms fails everything.
 */
void control_check(psagg_ctx *ctx, int64_t now, int64_t *next_ping)
{
    int op = ctx->cfg.op_timeout_ms;
    int ping = now >= *next_ping, bulk = 0, reread = -1;
    if (ping)
        *next_ping = now + psagg__ping_interval_ms(op);
    failover_tick(ctx, now); /* (servers out of the view, connected again) */
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        struct pollfd p = {.fd = ctx->servers[s].fd, .events = POLLIN};
        psagg__ctl_hdr h;
        void *body = NULL;
        const char *text;
        char peer[96];
        psagg_status st;
        if (p.fd < 0)
            continue;
        hello_peer(ctx, s, peer, sizeof peer);
        if (ping && s != reread &&
            psagg__ctl_send(p.fd, &ctx->servers[s].auth, PSAGG_CTL_PING, NULL, 0))
            LOG_DEBUG(&ctx->log, "%s: PING: %s", peer, psagg_last_error());
        if (poll(&p, 1, 0) <= 0) {
            /* (a server that rejoins is silent until every worker declared to it) */
            if (now - ctx->servers[s].heard_at > op && !failover_waits_ready(ctx, s)) {
                char why[160];
                snprintf(why, sizeof why, "it sent nothing for %.1f s, more than op_timeout_ms",
                         (double)(now - ctx->servers[s].heard_at) / 1e3);
                if (failover_server_lost(ctx, s, why))
                    continue;
                worker_fail_all(ctx, PSAGG_ETIMEDOUT,
                                "%s sent nothing for %.1f s, more than op_timeout_ms=%d "
                                "(stopped, hung or cut off)",
                                peer, (double)(now - ctx->servers[s].heard_at) / 1e3, op);
                return;
            }
            continue;
        }
        ctx->servers[s].heard_at = now;
        st = psagg__ctl_recv(p.fd, &ctx->servers[s].auth, &h, &body, psagg__now_ms() + 2000, peer);
        if (st == PSAGG_EAGAIN) /* (an injected frame, dropped) */
            continue;
        if (!st && h.type == PSAGG_CTL_PING && h.len == 0) {
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_CHECKPOINT_DONE && h.len == sizeof(psagg__ctl_error)) {
            checkpoint_done(ctx, s, body);
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_MEMBERSHIP && s == failover_coordinator(ctx) &&
            ctx->cfg.elastic) {
            if ((st = membership_take(ctx, s, &h, body, 0)))
                worker_fail_all(ctx, st, "%s", psagg_last_error());
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_AGREE) {
            failover_agree(ctx, s, &h, body);
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_SERVER_BACK) {
            failover_back(ctx, s, &h, body);
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_STATE) {
            failover_state(ctx, s, &h, body);
            free(body);
            if (++bulk < 256) /* (a server's chunk states come in a burst: read on now) */
                reread = s--;
            continue;
        }
        if (!st && h.type == PSAGG_CTL_DONE && h.len == 0 && failover_done(ctx, s)) {
            free(body);
            continue;
        }
        if (!st && h.type == PSAGG_CTL_READY && h.len == 0 && failover_ready(ctx, s)) {
            free(body);
            continue;
        }
        if (st && failover_server_lost(ctx, s, psagg_last_error())) /* its connection is gone */
            continue;
        if (!st && h.type == PSAGG_CTL_SYNC_DONE && s == failover_coordinator(ctx) &&
            ctx->cfg.elastic && h.len >= sizeof(psagg__ctl_sync_done)) {
            barrier_done(ctx, s, &h, body);
            free(body);
            continue;
        }
        if (!st && failover_lost(ctx, s)) { /* one that rejoins refused, or spoke out of turn */
            char why[200];
            if (psagg__ctl_error_parse(&h, body, &text))
                snprintf(why, sizeof why, "%s", text);
            else
                snprintf(why, sizeof why, "control frame type %u", h.type);
            failover_server_lost(ctx, s, why);
            free(body);
            continue;
        }
        if (st)
            worker_fail_all(ctx, PSAGG_EPEER, "%s", psagg_last_error());
        else if ((st = psagg__ctl_error_parse(&h, body, &text)))
            worker_fail_all(ctx, st, "%s: %s", peer, text);
        else
            worker_fail_all(ctx, PSAGG_EPROTO, "%s sent control frame type %u during the job", peer,
                            h.type);
        free(body);
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
    }
}
