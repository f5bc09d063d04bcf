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
 * [cluster] server_replicas >= 1: a server the start-up cannot reach, or that dies, stops or
 * errs before its READY, is given up instead of failing the job (once the start-up deadline
 * has passed without it, or at once when it says why it ends the start-up); once the job
 * runs, that loss is reported as any other (failover.c), the job starts in the view without
 * it, and a restarted server rejoins. Without replicas any of that fails the start-up.
 */
static int replicas(const psagg_ctx *ctx)
{
    return ctx->cfg.server_replicas > 0;
}

static void give_up(psagg_ctx *ctx, int s, const char *why)
{
    server_conn *sc = &ctx->servers[s];
    snprintf(sc->lost_at_start, sizeof sc->lost_at_start, "%s", why);
    if (sc->fd >= 0)
        close(sc->fd);
    sc->fd = -1;
    LOG_WARN(&ctx->log,
             "server %d given up during the start-up: %s; the job starts without it "
             "([cluster] server_replicas = %d) and it may rejoin",
             s, why, ctx->cfg.server_replicas);
}

/* Servers not given up. */
static int live_servers(const psagg_ctx *ctx)
{
    int n = 0;
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        n += !ctx->servers[s].lost_at_start[0];
    return n;
}

/*
 * HELLO server s and read its WELCOME. A server closes a connection it has no room for
 * (while it is flooded with others) without a word: then connect and say HELLO again, until
 * the start-up deadline; so does a joiner told EAGAIN (its rank is still leaving there).
 * Any other refusal (an ERROR frame) is final.
 */
static psagg_status hello_server(psagg_ctx *ctx, int s, int64_t deadline, enum hello_kind kind)
{
    char peer[96];
    psagg_status st;
    hello_peer(ctx, s, peer, sizeof peer);
    for (;;) {
        st = hello_exchange(ctx, s, deadline, peer, kind);
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

/*
 * With replicas: connect to the servers and HELLO them, without letting one that does not
 * answer hold up the others (their start-up deadlines run from the first worker to reach
 * them): pass after pass over those not welcomed yet, each attempt at most start_try_ms, until
 * one pass has welcomed at least one (`first_only`: until one accepts a connection; its address
 * is this worker's). The rest are tried again while psagg_declare waits (declare_again), and
 * given up at its deadline. By `deadline` some server must have answered.
 */
static int64_t start_try_ms(const psagg_ctx *ctx) /* how long one attempt on a server may take */
{
    int ms = ctx->cfg.connect_timeout_ms / 8;
    return ms < 250 ? 250 : ms > 2000 ? 2000 : ms;
}

static psagg_status connect_hello_each(psagg_ctx *ctx, int64_t deadline, int first_only)
{
    int n = ctx->cfg.n_servers, welcomed = 0;
    char why[200] = "";
    psagg_status st = PSAGG_OK;
    for (;;) {
        for (int s = 0; s < n; s++) {
            server_conn *sc = &ctx->servers[s];
            char what[32];
            /* each server's attempt its own time: one that accepts and says nothing (stopped)
               must not use up the next one's */
            int64_t now = psagg__now_ms(),
                    until = now + start_try_ms(ctx) < deadline ? now + start_try_ms(ctx) : deadline;
            if (sc->addr != PSAGG_PEER_UNKNOWN) /* (welcomed) */
                continue;
            snprintf(what, sizeof what, "server %d", s);
            if (sc->fd < 0 &&
                (st = psagg__tcp_connect(&ctx->cfg.servers[s], now, what, NULL, &sc->fd))) {
                const char *e = strrchr(psagg_last_error(), ':');
                if (st != PSAGG_ETIMEDOUT && st != PSAGG_EIO)
                    return st;
                if (!s)
                    snprintf(why, sizeof why, "%s", e ? e + 2 : psagg_last_error());
                continue;
            }
            if (first_only)
                return PSAGG_OK;
            if ((st = hello_server(ctx, s, until, HELLO_START))) {
                /* a refusal or a configuration that differs is final; a WELCOME whose token
                   does not check out (a process without the secret on its port) is not the
                   server: tried again, and given up at the deadline if it stays */
                if (!hello_transient(st))
                    return st;
                if (!s)
                    snprintf(why, sizeof why, "%s", psagg_last_error());
                LOG_INFO(&ctx->log, "server %d: %s: tried again while declaring", s,
                         psagg_last_error());
                if (sc->fd >= 0)
                    close(sc->fd);
                sc->fd = -1;
                continue;
            }
            welcomed++;
        }
        if (welcomed || psagg__now_ms() >= deadline)
            break;
        usleep(50 * 1000);
    }
    if (!welcomed)
        return psagg__fail(PSAGG_ETIMEDOUT,
                           "worker %d reached no server within connect_timeout_ms=%d (server 0: "
                           "%s)",
                           ctx->rank, ctx->cfg.connect_timeout_ms, why);
    return PSAGG_OK;
}

/*
 * Connect to the servers by `deadline`: to every one (with replicas: to the first that
 * answers, the others at handshake_hello); the first tells which local address to use.
 */
psagg_status handshake_connect(psagg_ctx *ctx, int64_t deadline)
{
    if (replicas(ctx))
        return connect_hello_each(ctx, deadline, 1);
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

int handshake_first(const psagg_ctx *ctx)
{
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0)
            return s;
    return 0;
}

/* HELLO every server in turn, by `deadline`. */
psagg_status handshake_hello(psagg_ctx *ctx, int64_t deadline)
{
    psagg_status st;
    if (replicas(ctx))
        return connect_hello_each(ctx, deadline, 0);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if ((st = hello_server(ctx, s, deadline, HELLO_START)))
            return st;
    return PSAGG_OK;
}

/*
 * A joiner's SYNC_DONE (after its MEMBERSHIP): the members' tensor states, where it starts,
 * and the codec assignments they keep ([codec] adaptive), which it takes (adapt.c).
 */
static psagg_status join_states(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body)
{
    const psagg__ctl_sync_done *d = body;
    const psagg__ctl_tensor_state *ts = (const psagg__ctl_tensor_state *)(d + 1);
    uint32_t n = ctx->layout.n_tensors;

    if (h->len < sizeof *d || d->n_tensors != n ||
        h->len != sizeof *d + psagg__ctl_sync_tail(n, d->adapt_gens, d->adapt_tensors) ||
        d->joined == 0 || d->epoch != ctx->epoch)
        return psagg__fail(PSAGG_EPROTO,
                           "server %d admitted this worker with a SYNC_DONE of %u bytes "
                           "(fields n_tensors, adapt_gens, adapt_tensors, joined, epoch; %u "
                           "tensors, membership epoch %u here)",
                           s, h->len, n, ctx->epoch);
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t t = 0; t < n; t++) {
        ctx->tensors[t].round = ts[t].round;
        ctx->tensors[t].pulls = ts[t].pulls; /* (the members' step is round - pulls) */
        ctx->tensors[t].inited = !!(ts[t].flags & PSAGG_TSTATE_INITED);
    }
    ctx->sync_seq = d->seq;
    ctx->sync_joined = d->joined;
    pthread_mutex_unlock(&ctx->mu);
    return adapt_join(ctx, (const uint8_t *)(ts + n), d->adapt_gens, d->adapt_tensors);
}

/* The lowest server this joiner still reaches and the view does not name lost, or -1. */
static int lowest_reached(const psagg_ctx *ctx)
{
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0 && !failover_lost(ctx, s))
            return s;
    return -1;
}

/*
 * (server replicas) Server s ended its connection or fell silent while this worker waits for
 * its admission: it is given up as in the start-up (the members report its loss; this worker,
 * which has no rounds yet, reports it once admitted if no view removed it by then:
 * handshake_report_lost). The JOIN is with every other server already. 1 when the wait goes
 * on, 0 when the loss fails it.
 */
static int join_loses(psagg_ctx *ctx, int s, const char *why)
{
    if (!ctx->failover || live_servers(ctx) < 2)
        return 0;
    give_up(ctx, s, why);
    return lowest_reached(ctx) >= 0;
}

/* join_loses for a connection that ended (a failed send or read: psagg_last_error says how). */
static int join_closed(psagg_ctx *ctx, int s)
{
    char why[200];
    snprintf(why, sizeof why, "its connection ended while this worker waited to join: %s",
             psagg_last_error());
    return join_loses(ctx, s, why);
}

/*
 * Ask to be admitted: server 0, the membership's owner; with server replicas every server this
 * joiner reaches and the view does not name lost. Each keeps the JOIN until it coordinates (the
 * lowest of them does now, unless one died with its loss not decided yet), so that when the
 * coordinator dies, stops or is cut off the next one admits it (join_wait gives it up). One
 * whose connection ended since the declaration is given up here (join_closed).
 */
static psagg_status join_ask(psagg_ctx *ctx)
{
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        server_conn *sc = &ctx->servers[s];
        psagg_status st;
        if (ctx->failover ? sc->fd < 0 || failover_lost(ctx, s) : s != 0)
            continue;
        if ((st = psagg__ctl_send(sc->fd, &sc->auth, PSAGG_CTL_JOIN, NULL, 0)) &&
            !join_closed(ctx, s))
            return psagg__fail_context(st, "asking server %d to join: ", s);
    }
    return PSAGG_OK;
}

/* The server whose barrier admits this joiner: server 0; with server replicas the lowest it
   reaches (join_ask), -1 when none is left. */
static int join_owner(const psagg_ctx *ctx)
{
    return ctx->failover ? lowest_reached(ctx) : 0;
}

/*
 * A joiner, declared on every server: ask the membership's owner to admit it and wait for the
 * members' next barrier, PINGing the servers meanwhile (they give up a silent worker); then its
 * MEMBERSHIP (relayed) and SYNC_DONE (the rounds where it starts). Up to 2 x op_timeout_ms: the
 * members call psagg_sync_membership between steps (psagg.torch's elastic wrappers do every step).
 * With server replicas the admission is a server view (AGREE DECIDED), which it takes whole; a
 * server that dies or is silent for op_timeout_ms meanwhile is given up (join_loses), and when
 * it was the one to admit it, the wait starts again with the next.
 */
static psagg_status join_wait(psagg_ctx *ctx)
{
    int op = ctx->cfg.op_timeout_ms, admitted = 0, o = join_owner(ctx);
    int64_t t0 = psagg__now_ms(), deadline = t0 + PSAGG_OP_DEADLINE_MS(op), next_ping = 0;
    char why[200];
    psagg_status st;

    if ((st = join_ask(ctx))) /* (none reached: o < 0 fails it below) */
        return st;
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        ctx->servers[s].heard_at = t0;
    while (!admitted) {
        int64_t now = psagg__now_ms();
        for (int s = 0; ctx->failover && s < ctx->cfg.n_servers; s++) {
            server_conn *sc = &ctx->servers[s];
            if (sc->fd < 0 || failover_lost(ctx, s) || now - sc->heard_at <= op)
                continue;
            snprintf(why, sizeof why,
                     "it sent nothing for %.1f s while this worker waited to join, more than "
                     "op_timeout_ms=%d (stopped, hung or cut off)",
                     (double)(now - sc->heard_at) / 1e3, op);
            if (!join_loses(ctx, s, why))
                return psagg__fail(PSAGG_ETIMEDOUT, "server %d: %s", s, why);
        }
        if (join_owner(ctx) != o) { /* (the one to admit it is lost: wait for the next) */
            o = join_owner(ctx);
            deadline = now + PSAGG_OP_DEADLINE_MS(op);
        }
        if (o < 0)
            return psagg__fail(PSAGG_EPEER, "worker %d reaches no server of the view to join",
                               ctx->rank);
        if (now > deadline)
            return psagg__fail(PSAGG_ETIMEDOUT,
                               "worker %d was not admitted to the running job within 2 x "
                               "op_timeout_ms=%d: its members did not reach a barrier "
                               "(psagg_sync_membership; psagg.torch's elastic wrappers call it "
                               "every step)",
                               ctx->rank, op);
        if (now >= next_ping) {
            for (int s = 0; s < ctx->cfg.n_servers; s++) { /* (not one given up: replicas) */
                server_conn *sc = &ctx->servers[s];
                if (sc->fd >= 0 && psagg__ctl_send(sc->fd, &sc->auth, PSAGG_CTL_PING, NULL, 0) &&
                    !join_closed(ctx, s))
                    return psagg__fail_context(PSAGG_EPEER, "server %d: ", s);
            }
            next_ping = now + psagg__ping_interval_ms(op);
        }
        for (int s = 0; s < ctx->cfg.n_servers && !admitted; s++) {
            struct pollfd p = {.fd = ctx->servers[s].fd, .events = POLLIN};
            psagg__ctl_hdr h;
            void *body = NULL;
            const char *text;
            char peer[96];
            if (p.fd < 0 || poll(&p, 1, s == o ? 50 : 0) <= 0)
                continue;
            hello_peer(ctx, s, peer, sizeof peer);
            st = psagg__ctl_recv(p.fd, &ctx->servers[s].auth, &h, &body, psagg__now_ms() + 2000,
                                 peer);
            if (st == PSAGG_EAGAIN) /* (an injected frame, dropped) */
                continue;
            if (st == PSAGG_EPEER && join_closed(ctx, s))
                continue;
            if (st)
                return st;
            ctx->servers[s].heard_at = psagg__now_ms();
            if (h.type == PSAGG_CTL_PING && h.len == 0)
                st = PSAGG_OK;
            else if (s == o && h.type == PSAGG_CTL_MEMBERSHIP && !ctx->failover)
                st = membership_take(ctx, s, &h, body, 1);
            else if (h.type == PSAGG_CTL_AGREE && ctx->failover) {
                /* (with server replicas the views, the one that admits it too, from whichever
                   server coordinates them: failover.c takes them, as a member's; the view that
                   admits it names the servers lost meanwhile, and so the one to admit it) */
                failover_agree(ctx, s, &h, body);
                st = worker_failed(ctx) ? psagg__fail(ctx->failed_status, "%s", ctx->failed_msg)
                                        : PSAGG_OK;
            } else if (s == o && h.type == PSAGG_CTL_SYNC_DONE && ctx->epoch > 0) {
                st = join_states(ctx, s, &h, body);
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

/* A server's part in handshake_declare: refused or given up, its READY awaited, to be connected
   again (with replicas), or READY. */
enum { D_DONE, D_WAIT, D_AGAIN, D_READY };

/*
 * With replicas, server s (lost before its READY: its connection closed or erred) is connected
 * again, said HELLO to and declared to, now and then until the deadline: a server killed
 * during the start-up and restarted at once starts the job with every worker. PSAGG_OK once
 * declared, PSAGG_EAGAIN to try again later, another status when its answer is final (a
 * refusal, another configuration: the start-up fails as it would in psagg_init). why: the
 * attempt's failure.
 */
static psagg_status declare_again(psagg_ctx *ctx, int s, psagg__ctl_declare *d, size_t bytes,
                                  int64_t deadline, char *why, size_t why_len)
{
    psagg_status st;
    char peer[96];
    /* (bounded by a PING interval: the servers READY already count this worker's silence) */
    int64_t now = psagg__now_ms(), try_ms = psagg__ping_interval_ms(ctx->cfg.op_timeout_ms);
    int64_t until = now + try_ms < deadline ? now + try_ms : deadline;
    /* welcomed before: a new process now, with no same-host copies */
    int again = ctx->servers[s].addr != PSAGG_PEER_UNKNOWN;
    snprintf(peer, sizeof peer, "server %d", s);
    if ((st = psagg__tcp_connect(&ctx->cfg.servers[s], now, peer, NULL, &ctx->servers[s].fd))) {
        const char *e = strrchr(psagg_last_error(), ':');
        snprintf(why, why_len, "%s", e ? e + 2 : psagg_last_error());
        return st == PSAGG_ETIMEDOUT || st == PSAGG_EIO ? PSAGG_EAGAIN : st;
    }
    hello_peer(ctx, s, peer, sizeof peer);
    if ((st = hello_declare(ctx, s, d, bytes, until, again ? HELLO_AGAIN : HELLO_START))) {
        snprintf(why, why_len, "%s", psagg_last_error());
        LOG_DEBUG(&ctx->log, "%s: %s", peer, psagg_last_error());
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
        return hello_transient(st) ? PSAGG_EAGAIN : st; /* (as in psagg_init) */
    }
    LOG_INFO(&ctx->log, "%s answers %sduring the start-up: declared to it", peer,
             again ? "again " : "");
    return PSAGG_OK;
}

/* Whether fd has bytes to read now. */
static int readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return fd >= 0 && poll(&p, 1, 0) > 0;
}

/* PING the servers READY already, when due (their silence limit runs from their READY). */
static void ping_ready(psagg_ctx *ctx, const uint8_t *state, int64_t *next_ping)
{
    int64_t now = psagg__now_ms();
    if (now < *next_ping)
        return;
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (state[s] == D_READY &&
            psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_PING, NULL, 0))
            LOG_DEBUG(&ctx->log, "server %d: PING: %s", s, psagg_last_error());
    *next_ping = now + psagg__ping_interval_ms(ctx->cfg.op_timeout_ms) / 2;
}

/* Whether a server's refusal at start-up ends only that server's part (with replicas). */
static int refusal_loses_server(psagg_status refused)
{
    /* its start-up timed out (a worker that gave it up) or another worker died there */
    return refused == PSAGG_ETIMEDOUT || refused == PSAGG_EPEER;
}

/*
 * Send the declaration to every server and wait for each answer. A server's own verdict (an
 * ERROR frame: mismatch, timeout) explains a failure better than a connection that another
 * server's verdict made the other workers drop, so the first ERROR frame wins; a send or
 * receive failure is reported only when no server said why. With replicas a server that is
 * lost before its READY is connected again until the deadline (declare_again), then given up
 * (give_up), and so is one whose start-up failed on a timeout; the servers READY meanwhile
 * are PINGed (their silence limit runs from their READY).
 */
psagg_status handshake_declare(psagg_ctx *ctx, psagg__ctl_declare *d, size_t bytes)
{
    /*
     * The servers enforce connect_timeout_ms and then say which workers are missing; wait a
     * little longer than they do so that their verdict, not our own timeout, is reported.
     */
    int grace = ctx->cfg.connect_timeout_ms / 4 > 1000 ? ctx->cfg.connect_timeout_ms / 4 : 1000;
    int64_t deadline = psagg__now_ms() + ctx->cfg.connect_timeout_ms + grace, next_ping = 0;
    int n = ctx->cfg.n_servers, R = replicas(ctx), waiting;
    int aligned = 0; /* (with replicas) a READY came: the deadline counts from the first */
    psagg_status verdict = PSAGG_OK, other = PSAGG_OK, lost = PSAGG_OK;
    char verdict_msg[512] = "", other_msg[512] = "", lost_msg[512] = "";
    int *sent = calloc((size_t)n, sizeof *sent);
    uint8_t *state = calloc((size_t)n, 1);
    int64_t *until = calloc((size_t)n, sizeof *until);
    struct pollfd *pfd = calloc((size_t)n, sizeof *pfd);
    int *pfd_s = calloc((size_t)n, sizeof *pfd_s);
    char(*why)[200] = calloc((size_t)n, sizeof *why); /* per server: its last attempt's failure */

    if (!sent || !state || !until || !pfd || !pfd_s || !why) {
        free(sent), free(state), free(until), free(pfd), free(pfd_s), free(why);
        return psagg__fail(PSAGG_ENOMEM, "psagg_declare");
    }
    for (int s = 0; s < n; s++) {
        psagg_status st;
        if (ctx->servers[s].fd < 0 && R) { /* (not welcomed in psagg_init) */
            state[s] = D_AGAIN;
            continue;
        }
        d->local_flags = ctx->servers[s].local_reads ? PSAGG_LOCAL_READS : 0;
        st = psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_DECLARE, d,
                             (uint32_t)bytes);
        sent[s] = !st;
        if (st && R) { /* (its connection is gone: a new one later) */
            snprintf(why[s], sizeof why[s], "declaring to it: %s", psagg_last_error());
            close(ctx->servers[s].fd);
            ctx->servers[s].fd = -1;
            state[s] = D_AGAIN;
            continue;
        }
        if (st && !other) {
            other = st;
            snprintf(other_msg, sizeof other_msg, "declaring to server %d: %s", s,
                     psagg_last_error());
        }
        /* a server we could not send to may still have sent its verdict: read it briefly */
        state[s] = D_WAIT;
        until[s] = sent[s] ? deadline : psagg__now_ms() + 500;
    }
    for (;;) {
        int64_t now = psagg__now_ms();
        int np = 0;
        waiting = 0;
        for (int s = 0; s < n; s++) {
            char peer[96];
            if (R)
                ping_ready(ctx, state, &next_ping);
            if (state[s] == D_DONE || state[s] == D_READY)
                continue;
            hello_peer(ctx, s, peer, sizeof peer);
            if (state[s] == D_AGAIN && now >= deadline) {
                char m[400];
                snprintf(m, sizeof m, "%s within connect_timeout_ms%s (the last attempt: %s)",
                         ctx->servers[s].addr == PSAGG_PEER_UNKNOWN
                             ? "it did not answer"
                             : "it closed the connection before its READY and did not answer "
                               "again",
                         aligned ? " of the first server's READY" : "",
                         why[s][0] ? why[s] : "none");
                give_up(ctx, s, m);
                if (!lost) {
                    lost = PSAGG_EPEER;
                    snprintf(lost_msg, sizeof lost_msg, "%s: closed before its READY", peer);
                }
                state[s] = D_DONE;
            } else if (state[s] == D_AGAIN && now >= until[s]) {
                psagg_status st = declare_again(ctx, s, d, bytes, deadline, why[s], sizeof why[s]);
                if (!st) {
                    state[s] = D_WAIT;
                    sent[s] = 1;
                    until[s] = deadline;
                } else if (st == PSAGG_EAGAIN) {
                    until[s] = psagg__now_ms() + 250;
                } else { /* (a server that answers late with another configuration) */
                    if (!verdict) {
                        verdict = st;
                        snprintf(verdict_msg, sizeof verdict_msg, "%s: %s", peer, why[s]);
                    }
                    state[s] = D_DONE;
                }
            } else if (state[s] == D_WAIT && now >= until[s] && R && sent[s] &&
                       now < deadline + 1000 && readable(ctx->servers[s].fd)) {
                until[s] = now + 1000; /* (its READY came as the deadline passed: read it) */
            } else if (state[s] == D_WAIT && now >= until[s]) {
                char m[256];
                if (R) {
                    snprintf(m, sizeof m,
                             "no READY within connect_timeout_ms=%d and %d ms%s (stopped, hung or "
                             "cut off?)",
                             ctx->cfg.connect_timeout_ms, grace,
                             aligned ? " of the first server's READY" : "");
                    give_up(ctx, s, m);
                    if (!lost) {
                        lost = PSAGG_ETIMEDOUT;
                        snprintf(lost_msg, sizeof lost_msg, "%s: %s", peer, m);
                    }
                } else if (!other) {
                    snprintf(m, sizeof m,
                             "%s: not all workers declared within connect_timeout_ms=%d", peer,
                             ctx->cfg.connect_timeout_ms);
                    other = psagg__fail(PSAGG_ETIMEDOUT, "%s", m);
                    snprintf(other_msg, sizeof other_msg, "%s", m);
                }
                state[s] = D_DONE;
            }
            if (state[s] == D_WAIT) {
                pfd[np] = (struct pollfd){.fd = ctx->servers[s].fd, .events = POLLIN};
                pfd_s[np++] = s;
            }
            waiting += state[s] != D_DONE;
        }
        if (!waiting)
            break;
        if (poll(pfd, (nfds_t)np, 50) <= 0)
            continue;
        for (int i = 0; i < np; i++) {
            int s = pfd_s[i];
            psagg__ctl_hdr h;
            void *body = NULL;
            const char *text;
            char peer[96];
            psagg_status st, refused;
            if (!pfd[i].revents)
                continue;
            hello_peer(ctx, s, peer, sizeof peer);
            st = psagg__ctl_recv(ctx->servers[s].fd, &ctx->servers[s].auth, &h, &body, until[s],
                                 peer);
            if (st == PSAGG_EAGAIN) /* (an injected frame, dropped: wait on for the server's) */
                continue;
            state[s] = D_DONE;
            if (!st && (refused = psagg__ctl_error_parse(&h, body, &text))) {
                if (R && refusal_loses_server(refused)) {
                    char m[256];
                    snprintf(m, sizeof m, "its start-up failed: %s", text);
                    give_up(ctx, s, m);
                    if (!lost) { /* (the reason, should every server be given up) */
                        lost = refused;
                        snprintf(lost_msg, sizeof lost_msg, "%s: %s", peer, text);
                    }
                } else if (!verdict) {
                    verdict = refused;
                    snprintf(verdict_msg, sizeof verdict_msg, "%s: %s", peer, text);
                }
            } else if (!st && h.type != PSAGG_CTL_READY) {
                st = psagg__fail(PSAGG_EPROTO, "%s answered DECLARE with frame type %u", peer,
                                 h.type);
            } else if (!st) {
                state[s] = D_READY;
                /*
                 * The servers that answer send READY to every worker at once (when the last
                 * worker declared), so counting the deadline for the others from the first
                 * READY gives them up on every worker at about the same time: all report them
                 * lost within the coordinator's op_timeout_ms and start their first round
                 * together, however far apart the workers called psagg_declare.
                 */
                if (R && !aligned) {
                    int64_t d2 = psagg__now_ms() + ctx->cfg.connect_timeout_ms + grace;
                    aligned = 1;
                    for (int k = 0; k < n; k++)
                        if (state[k] == D_WAIT && until[k] == deadline)
                            until[k] = d2;
                    deadline = d2; /* (never earlier: it counted from before the READY) */
                }
                if (s == 0 && h.len && !ctx->joiner)
                    st = relay_start(ctx, &h, body, sent);
            } else if (R) { /* (closed or erred before its READY) */
                LOG_INFO(&ctx->log, "%s: connecting again until the start-up's deadline",
                         psagg_last_error());
                close(ctx->servers[s].fd);
                ctx->servers[s].fd = -1;
                state[s] = D_AGAIN;
                until[s] = psagg__now_ms() + 100;
                st = PSAGG_OK;
            }
            if (st && !other) {
                other = st;
                snprintf(other_msg, sizeof other_msg, "%s", psagg_last_error());
            }
            free(body);
        }
    }
    free(sent), free(state), free(until), free(pfd), free(pfd_s), free(why);
    if (verdict)
        return psagg__fail(verdict, "%s", verdict_msg);
    if (other)
        return psagg__fail(other, "%s", other_msg);
    if (R && !live_servers(ctx)) /* (every server given up: the first reason) */
        return psagg__fail(lost ? lost : PSAGG_EPEER, "%s", lost_msg);
    return ctx->joiner ? join_wait(ctx) : PSAGG_OK;
}

/*
 * With replicas: report each server given up during the start-up (a loss, to the lowest server
 * left: failover.c) before the job's first round. 0, or -1 when that failed the job.
 */
int handshake_report_lost(psagg_ctx *ctx)
{
    for (int s = 0; s < ctx->cfg.n_servers && !worker_failed(ctx); s++) {
        server_conn *sc = &ctx->servers[s];
        if (sc->lost_at_start[0]) {
            char why[sizeof sc->lost_at_start + 40];
            snprintf(why, sizeof why, "given up during the start-up: %s", sc->lost_at_start);
            sc->lost_at_start[0] = '\0';
            failover_server_lost(ctx, s, why);
        }
    }
    return worker_failed(ctx) ? -1 : 0;
}
