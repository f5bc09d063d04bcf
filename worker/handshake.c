/*
 * handshake.c - the worker's side of the control channel's start-up (runtime/wire.h): connect
 * to every server, read its CHALLENGE, say HELLO (its token bound to that server and that
 * challenge) and check its WELCOME (its token: the server has the secret; that server's rank,
 * data_auth, provider, optimizer; its fabric address and data key; same-host copies), then
 * send the declaration
 * and wait for every server's READY. psagg_init and psagg_declare (api.c) call it, on the
 * caller's thread, before the communication thread exists.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/optim.h"
#include "runtime/auth.h"
#include "runtime/channel.h"
#include "worker.h"

/*
 * Same-host copies with server s (wire.h): send it our large pushes by descriptor when it
 * copies them (its WELCOME says so), and copy its updates when its offer checks out (our
 * DECLARE tells it). Anything that does not work leaves that direction on the provider.
 */
static void local_copy_setup(psagg_ctx *ctx, int s, const psagg__ctl_welcome *w, const char *peer)
{
    server_conn *sc = &ctx->servers[s];
    int reads, sends;

    sends = (w->local_flags & PSAGG_LOCAL_READS) && !psagg__fabric_local_send(ctx->fab, sc->addr);
    reads = w->local_pid &&
            !psagg__fabric_local_accept(ctx->fab, sc->addr, w->local_pid, w->local_probe,
                                        w->local_commit, w->epname, w->epname_len);
    if (w->local_pid && !reads)
        LOG_DEBUG(&ctx->log, "%s offers same-host copies; not taken: %s", peer, psagg_last_error());
    sc->local_reads = reads;
    if (sends || reads)
        LOG_INFO(&ctx->log, "%s is on this host: %s by same-host copy", peer,
                 sends && reads ? "pushes and updates"
                 : sends        ? "pushes"
                                : "updates");
}

/*
 * Server s welcomed this worker: the keys of this pair of sessions (runtime/auth.h): its
 * control frames both ways from now on, this worker's pushes to it and its updates.
 */
static void session_keys(psagg_ctx *ctx, int s, const psagg__ctl_hello *hello,
                         const psagg__ctl_welcome *w)
{
    server_conn *sc = &ctx->servers[s];
    psagg__ctl_auth_make(&ctx->job_key, hello->auth, ctx->nonce, w->nonce, (uint32_t)s, 0,
                         &sc->auth);
    sc->auth.log = &ctx->log;
    psagg__push_key_make(&ctx->job_key, ctx->cfg.job_id, ctx->nonce, w->nonce, (uint32_t)s,
                         &sc->push_key);
    sc->push_seq = 0;
    psagg__update_key_make(&ctx->job_key, ctx->cfg.job_id, w->nonce, (uint32_t)s, &sc->rx.key);
    memset(&sc->rx.seen, 0, sizeof sc->rx.seen);
}

/*
 * One HELLO on server s's connection and its answer. `rejoin`: the job runs, and server s
 * comes back into it (failover.c): its WELCOME is checked as another server's is against
 * server 0's, and same-host copies stay off (the provider carries everything).
 */
static psagg_status hello_once(psagg_ctx *ctx, int s, int64_t deadline, const char *peer,
                               int rejoin)
{
    const uint32_t flags = ctx->cfg.data_auth ? PSAGG_HELLO_DATA_AUTH : 0;
    const int other = s > 0 || rejoin; /* checked against what server 0 said */
    psagg__ctl_hello hello = {.rank = (uint32_t)ctx->rank,
                              .world_size = (uint32_t)ctx->world,
                              .flags = flags | (rejoin ? PSAGG_HELLO_REJOIN : 0)};
    psagg__ctl_hdr h;
    void *body = NULL;
    const char *refusal;
    size_t len = sizeof hello.epname;
    uint8_t expect[PSAGG_TOKEN_BYTES];
    psagg_status st;

    /* the server speaks first: this connection's challenge */
    if ((st = psagg__ctl_recv(ctx->servers[s].fd, NULL, &h, &body, deadline, peer)))
        return st;
    if (h.type != PSAGG_CTL_CHALLENGE || h.len != sizeof(psagg__ctl_challenge)) {
        const char *why = NULL;
        psagg_status es = psagg__ctl_error_parse(&h, body, &why); /* why: an ERROR frame's */
        st = why ? psagg__fail(es, "%s refused worker %d: %s", peer, ctx->rank, why)
                 : psagg__fail(PSAGG_EPROTO,
                               "%s opened with control frame type %u, not a CHALLENGE (a psagg "
                               "server of protocol version %d?)",
                               peer, h.type, PSAGG_PROTO_VERSION);
        free(body);
        return st;
    }
    snprintf(hello.job_id, sizeof hello.job_id, "%s", ctx->cfg.job_id);
    memcpy(hello.nonce, ctx->nonce, sizeof hello.nonce);
    snprintf(hello.provider, sizeof hello.provider, "%s", psagg__fabric_provider(ctx->fab));
    if ((st = psagg__fabric_name(ctx->fab, hello.epname, &len))) {
        free(body);
        return st;
    }
    hello.epname_len = (uint32_t)len;
    if (ctx->cfg.local_copy && !rejoin) {
        uint32_t pid;
        psagg__fabric_local_self(ctx->fab, &pid, &hello.local_probe, hello.local_commit);
        hello.local_pid = pid;
    }
    psagg__hello_token(&ctx->job_key, &hello, (uint32_t)s,
                       ((const psagg__ctl_challenge *)body)->challenge, hello.auth);
    free(body);
    body = NULL;
    if ((st = psagg__ctl_send(ctx->servers[s].fd, NULL, PSAGG_CTL_HELLO, &hello, sizeof hello)))
        return psagg__fail_context(st, "%s: ", peer);
    if ((st = psagg__ctl_recv(ctx->servers[s].fd, NULL, &h, &body, deadline, peer)))
        return st;
    if ((st = psagg__ctl_error_parse(&h, body, &refusal))) {
        psagg__fail(st, "%s refused worker %d: %s", peer, ctx->rank, refusal);
    } else if (h.type != PSAGG_CTL_WELCOME || h.len != sizeof(psagg__ctl_welcome)) {
        st = psagg__fail(PSAGG_EPROTO, "%s answered HELLO with frame type %u", peer, h.type);
    } else {
        psagg__ctl_welcome *w = body;
        psagg__welcome_token(&ctx->job_key, w, hello.auth, expect);
        if (!psagg__token_equal(expect, w->auth))
            st = psagg__fail(PSAGG_EPROTO,
                             "%s: its WELCOME's token does not check out: it does not have this "
                             "job's secret, or something between us changed the frame",
                             peer);
        else if (w->server_rank != (uint32_t)s || w->n_servers != (uint32_t)ctx->cfg.n_servers)
            st = psagg__fail(PSAGG_ECONFIG,
                             "%s says it is server %u of %u; this worker's config lists it as "
                             "server %d of %d",
                             peer, w->server_rank, w->n_servers, s, ctx->cfg.n_servers);
        else if ((w->flags & ~(PSAGG_WELCOME_JOINING | PSAGG_WELCOME_QUORUM)) != flags)
            st = psagg__fail(PSAGG_ECONFIG, "%s has data_auth %s, this worker %s", peer,
                             w->flags & PSAGG_HELLO_DATA_AUTH ? "on" : "off",
                             flags ? "on" : "off");
        else if (other && !!(w->flags & PSAGG_WELCOME_JOINING) != ctx->joiner)
            st = psagg__fail(PSAGG_EPROTO,
                             "%s says the job %s, server 0 that it %s: try again in a moment", peer,
                             w->flags & PSAGG_WELCOME_JOINING ? "runs" : "is starting",
                             ctx->joiner ? "runs" : "is starting");
        else if (other && !!(w->flags & PSAGG_WELCOME_QUORUM) != !!ctx->bitmap_bytes)
            st = psagg__fail(PSAGG_ECONFIG,
                             "%s runs [server] quorum %s, server 0 %s: start every server with "
                             "the same [server] quorum",
                             peer, w->flags & PSAGG_WELCOME_QUORUM ? "on" : "off",
                             ctx->bitmap_bytes ? "on" : "off");
        else if (strncmp(w->provider, hello.provider, PSAGG_PROVIDER_MAX - 1))
            st = psagg__fail(PSAGG_ECONFIG,
                             "%s opened fabric provider '%.31s', this worker '%.31s': every "
                             "process of a job must open the same one (name it in [cluster] "
                             "provider)",
                             peer, w->provider, hello.provider);
        else if (w->epname_len == 0 || w->epname_len > PSAGG_EPNAME_MAX)
            st = psagg__fail(PSAGG_EPROTO, "%s: WELCOME field epname_len is %u", peer,
                             w->epname_len);
        else if (other && memcmp(&w->optim, &ctx->optim, sizeof w->optim))
            st = psagg__fail(
                PSAGG_ECONFIG,
                "%s runs [server] optimizer = %s (momentum %g, dampening %g, nesterov "
                "%u, beta1 %g, beta2 %g, eps %g, sync_interval %u), server 0 runs %s "
                "(%g, %g, %u, %g, %g, %g, %u): start every server with the same "
                "[server] optimizer keys",
                peer, psagg__optim_name((psagg__optim_kind)w->optim.kind),
                (double)w->optim.momentum, (double)w->optim.dampening, w->optim.nesterov,
                (double)w->optim.beta1, (double)w->optim.beta2, (double)w->optim.eps,
                w->optim.sync_interval, psagg__optim_name((psagg__optim_kind)ctx->optim.kind),
                (double)ctx->optim.momentum, (double)ctx->optim.dampening, ctx->optim.nesterov,
                (double)ctx->optim.beta1, (double)ctx->optim.beta2, (double)ctx->optim.eps,
                ctx->optim.sync_interval);
        else if ((st = psagg__fabric_add_peer(ctx->fab, w->epname, w->epname_len,
                                              &ctx->servers[s].addr)))
            psagg__fail_context(st, "%s: ", peer);
        else
            session_keys(ctx, s, &hello, w);
        if (!st && !other) {
            ctx->optim = w->optim;
            ctx->joiner = !!(w->flags & PSAGG_WELCOME_JOINING);
            ctx->bitmap_bytes = w->flags & PSAGG_WELCOME_QUORUM ? ((size_t)ctx->world + 7) / 8 : 0;
            if (ctx->joiner)
                LOG_WARN(&ctx->log,
                         "the job is running: worker %d joins it (admitted at the members' next "
                         "barrier)",
                         ctx->rank);
        }
        if (!st && ctx->cfg.local_copy && !rejoin)
            local_copy_setup(ctx, s, w, peer);
    }
    free(body);
    return st;
}

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
        st = hello_once(ctx, s, deadline, peer, 0);
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

psagg_status handshake_rejoin(psagg_ctx *ctx, int s, psagg__ctl_declare *d, size_t bytes,
                              int64_t deadline)
{
    char peer[96];
    psagg_status st;
    snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
             ctx->cfg.servers[s].port);
    if ((st = hello_once(ctx, s, deadline, peer, 1)))
        return st;
    d->local_flags = 0;
    if ((st = psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_DECLARE, d,
                              (uint32_t)bytes)))
        return psagg__fail_context(st, "declaring to %s: ", peer);
    return PSAGG_OK;
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
