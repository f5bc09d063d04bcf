/*
 * handshake.c - the worker's side of the control channel's start-up (runtime/wire.h): connect
 * to every server, say HELLO to each and check its WELCOME (hello.c), then send the
 * declaration and wait for every server's READY. psagg_init and psagg_declare (api.c) call it, on
 * the caller's thread, before the communication thread exists.
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
#include "worker.h"

/*
 * HELLO server s and read its WELCOME. A server closes a connection it has no room for
 * (while it is flooded with others) without a word: then connect and say HELLO again, until
 * the start-up deadline; so does a joiner told EAGAIN (its rank is still leaving there).
 * Any other refusal (an ERROR frame) is final.
 */
static psagg_status hello_server(psagg_ctx *ctx, int s, int64_t deadline)
{
    char peer[96];
    psagg_status st;
    snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
             ctx->cfg.servers[s].port);
    for (;;) {
        st = hello_exchange(ctx, s, deadline, peer, 0);
        if ((st != PSAGG_EPEER && st != PSAGG_EAGAIN) || psagg__now_ms() + 100 >= deadline)
            return st;
        /* EAGAIN: a joiner whose rank is still leaving at that server (its next epoch) */
        LOG_INFO(&ctx->log, "%s: %s; again", peer,
                 st == PSAGG_EAGAIN ? psagg_last_error() : "closed before answering HELLO");
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
        usleep(100 * 1000);
        if ((st = psagg__tcp_connect(&ctx->cfg.servers[s], deadline, peer, &ctx->log,
                                     &ctx->servers[s].fd)))
            return st;
    }
}

/* Connect to every server by `deadline` (the first connection tells which local address to use). */
psagg_status handshake_connect(psagg_ctx *ctx, int64_t deadline)
{
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        char what[32];
        psagg_status st;
        snprintf(what, sizeof what, "server %d", s);
        if ((st = psagg__tcp_connect(&ctx->cfg.servers[s], deadline, what, &ctx->log,
                                     &ctx->servers[s].fd)))
            return psagg__fail_context(st, "worker %d: ", ctx->rank);
    }
    return PSAGG_OK;
}

/* HELLO every server in turn, by `deadline`. */
psagg_status handshake_hello(psagg_ctx *ctx, int64_t deadline)
{
    psagg_status st;
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if ((st = hello_server(ctx, s, deadline)))
            return st;
    return PSAGG_OK;
}

/*
 * A joiner's SYNC_DONE (after its MEMBERSHIP): the members' tensor states, where it starts,
 * and the codec assignments they keep ([codec] adaptive), which it takes (adapt.c).
 */
static psagg_status join_states(psagg_ctx *ctx, const psagg__ctl_hdr *h, const void *body)
{
    const psagg__ctl_sync_done *d = body;
    const psagg__ctl_tensor_state *ts = (const psagg__ctl_tensor_state *)(d + 1);
    uint32_t n = ctx->layout.n_tensors;

    if (h->len < sizeof *d || d->n_tensors != n ||
        h->len != sizeof *d + psagg__ctl_sync_tail(n, d->adapt_gens, d->adapt_tensors) ||
        d->joined == 0 || d->epoch != ctx->epoch)
        return psagg__fail(PSAGG_EPROTO,
                           "server 0 admitted this worker with a SYNC_DONE of %u bytes (fields "
                           "n_tensors, adapt_gens, adapt_tensors, joined, epoch; %u tensors, "
                           "membership epoch %u here)",
                           h->len, n, ctx->epoch);
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t t = 0; t < n; t++) {
        ctx->tensors[t].round = ts[t].round;
        ctx->tensors[t].inited = !!(ts[t].flags & PSAGG_TSTATE_INITED);
    }
    ctx->sync_seq = d->seq;
    ctx->sync_joined = d->joined;
    pthread_mutex_unlock(&ctx->mu);
    return adapt_join(ctx, (const uint8_t *)(ts + n), d->adapt_gens, d->adapt_tensors);
}

/*
 * A joiner, declared on every server: ask server 0 to admit it and wait for the members' next
 * barrier, PINGing the servers meanwhile (they give up a silent worker); then its MEMBERSHIP
 * (relayed) and SYNC_DONE (the rounds where it starts). Up to 2 x op_timeout_ms: the members
 * call psagg_sync_membership between steps (psagg.torch's elastic wrappers do every step).
 */
static psagg_status join_wait(psagg_ctx *ctx)
{
    int op = ctx->cfg.op_timeout_ms, admitted = 0;
    int64_t t0 = psagg__now_ms(), deadline = t0 + PSAGG_OP_DEADLINE_MS(op), next_ping = 0;
    psagg_status st;

    if ((st = psagg__ctl_send(ctx->servers[0].fd, &ctx->servers[0].auth, PSAGG_CTL_JOIN, NULL, 0)))
        return psagg__fail_context(st, "asking server 0 to join: ");
    while (!admitted) {
        int64_t now = psagg__now_ms();
        if (now > deadline)
            return psagg__fail(PSAGG_ETIMEDOUT,
                               "worker %d was not admitted to the running job within 2 x "
                               "op_timeout_ms=%d: its members did not reach a barrier "
                               "(psagg_sync_membership; psagg.torch's elastic wrappers call it "
                               "every step)",
                               ctx->rank, op);
        if (now >= next_ping) {
            for (int s = 0; s < ctx->cfg.n_servers; s++)
                if (psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_PING, NULL,
                                    0))
                    return psagg__fail_context(PSAGG_EPEER, "server %d: ", s);
            next_ping = now + psagg__ping_interval_ms(op);
        }
        for (int s = 0; s < ctx->cfg.n_servers && !admitted; s++) {
            struct pollfd p = {.fd = ctx->servers[s].fd, .events = POLLIN};
            psagg__ctl_hdr h;
            void *body = NULL;
            const char *text;
            char peer[96];
            if (poll(&p, 1, s == 0 ? 50 : 0) <= 0)
                continue;
            snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
                     ctx->cfg.servers[s].port);
            st = psagg__ctl_recv(p.fd, &ctx->servers[s].auth, &h, &body, psagg__now_ms() + 2000,
                                 peer);
            if (st == PSAGG_EAGAIN) /* (an injected frame, dropped) */
                continue;
            if (st)
                return st;
            if (h.type == PSAGG_CTL_PING && h.len == 0)
                st = PSAGG_OK;
            else if (s == 0 && h.type == PSAGG_CTL_MEMBERSHIP)
                st = membership_take(ctx, &h, body, 1);
            else if (s == 0 && h.type == PSAGG_CTL_SYNC_DONE && ctx->epoch > 0) {
                st = join_states(ctx, &h, body);
                admitted = !st;
            } else if ((st = psagg__ctl_error_parse(&h, body, &text)))
                psagg__fail(st, "%s refused worker %d's join: %s", peer, ctx->rank, text);
            else
                st = psagg__fail(PSAGG_EPROTO, "%s sent control frame type %u to a joining worker",
                                 peer, h.type);
            free(body);
            if (st)
                return st;
        }
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        ctx->servers[s].heard_at = psagg__now_ms();
    LOG_WARN(&ctx->log,
             "worker %d joined the running job in membership epoch %u (%d workers) after %.2f s",
             ctx->rank, ctx->epoch, ctx->n_live, (double)(psagg__now_ms() - t0) / 1e3);
    return PSAGG_OK;
}

/*
 * An elastic job's READY from server 0 names the workers that start it (wire.h): relay it to
 * every other server before waiting for theirs, so that one that never heard of a starting
 * worker which died after its HELLO to server 0 starts without it too.
 */
static psagg_status relay_start(psagg_ctx *ctx, const psagg__ctl_hdr *h, const void *body,
                                const int *sent)
{
    const psagg__ctl_membership *m = body;
    psagg_status st;
    if (!ctx->cfg.elastic || h->len != sizeof *m + (size_t)ctx->world ||
        m->n_workers != (uint32_t)ctx->world || !((const uint8_t *)(m + 1))[ctx->rank])
        return psagg__fail(PSAGG_EPROTO,
                           "server 0 answered DECLARE with a READY of %u bytes that does not name "
                           "this worker among the %d starting ones",
                           h->len, ctx->world);
    for (int s = 1; s < ctx->cfg.n_servers; s++)
        if (sent[s] && (st = psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth,
                                             PSAGG_CTL_START, body, h->len)))
            return psagg__fail_context(st, "relaying server 0's start to server %d: ", s);
    return PSAGG_OK;
}

/*
 * Send the declaration to every server and wait for each answer. A server's own verdict (an
 * ERROR frame: mismatch, timeout) explains a failure better than a connection that another
 * server's verdict made the other workers drop, so the first ERROR frame wins; a send or
 * receive failure is reported only when no server said why.
 */
psagg_status handshake_declare(psagg_ctx *ctx, psagg__ctl_declare *d, size_t bytes)
{
    /*
     * The servers enforce connect_timeout_ms and then say which workers are missing; wait a
     * little longer than they do so that their verdict, not our own timeout, is reported.
     */
    int grace = ctx->cfg.connect_timeout_ms / 4 > 1000 ? ctx->cfg.connect_timeout_ms / 4 : 1000;
    int64_t deadline = psagg__now_ms() + ctx->cfg.connect_timeout_ms + grace;
    psagg_status verdict = PSAGG_OK, other = PSAGG_OK;
    char verdict_msg[512] = "", other_msg[512] = "";
    int *sent = calloc((size_t)ctx->cfg.n_servers, sizeof *sent);

    if (!sent)
        return psagg__fail(PSAGG_ENOMEM, "psagg_declare");
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        psagg_status st;
        d->local_flags = ctx->servers[s].local_reads ? PSAGG_LOCAL_READS : 0;
        st = psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_DECLARE, d,
                             (uint32_t)bytes);
        sent[s] = !st;
        if (st && !other) {
            other = st;
            snprintf(other_msg, sizeof other_msg, "declaring to server %d: %s", s,
                     psagg_last_error());
        }
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        psagg__ctl_hdr h;
        void *body = NULL;
        const char *text;
        char peer[96];
        psagg_status st, refused;
        snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
                 ctx->cfg.servers[s].port);
        /* a server we could not send to may still have sent its verdict: read it briefly */
        {
            int64_t until = sent[s] ? deadline : psagg__now_ms() + 500;
            do /* (an injected frame is dropped: wait on for the server's) */
                st = psagg__ctl_recv(ctx->servers[s].fd, &ctx->servers[s].auth, &h, &body, until,
                                     peer);
            while (st == PSAGG_EAGAIN && psagg__now_ms() < until);
        }
        if (!st && (refused = psagg__ctl_error_parse(&h, body, &text))) {
            if (!verdict) {
                verdict = refused;
                snprintf(verdict_msg, sizeof verdict_msg, "%s: %s", peer, text);
            }
        } else if (!st && h.type != PSAGG_CTL_READY) {
            st = psagg__fail(PSAGG_EPROTO, "%s answered DECLARE with frame type %u", peer, h.type);
        } else if (!st && s == 0 && h.len && !ctx->joiner) {
            st = relay_start(ctx, &h, body, sent);
        } else if (st == PSAGG_ETIMEDOUT) {
            psagg__fail(st, "%s: not all workers declared within connect_timeout_ms=%d", peer,
                        ctx->cfg.connect_timeout_ms);
        }
        if (st && !other) {
            other = st;
            snprintf(other_msg, sizeof other_msg, "%s", psagg_last_error());
        }
        free(body);
    }
    free(sent);
    if (verdict)
        return psagg__fail(verdict, "%s", verdict_msg);
    if (other)
        return psagg__fail(other, "%s", other_msg);
    return ctx->joiner ? join_wait(ctx) : PSAGG_OK;
}
