/*
 * hello.c - one HELLO on a server's control connection and its WELCOME, checked (its token:
 * the server has the secret; its rank, data_auth, provider and optimizer; its fabric address
 * and data key; same-host copies), for the start-up (handshake.c, on the caller's thread) and
 * for a server that rejoins the running job (failover.c, on the communication thread), and the
 * declaration sent after it to a server greeted late (handshake.c, failover.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
 * One HELLO on server s's connection and its answer (worker.h). The first WELCOME taken says
 * what the job runs (the optimizer, quorum, a server residual, whether it runs already); every
 * other is checked against it. HELLO_REJOIN: the job runs, and server s comes back into it
 * (failover.c), starting again (its WELCOME says so, also to a worker that joined the job);
 * HELLO_AGAIN: server s, lost during the start-up, answers again (handshake.c). Same-host copies
 * are set up only at a server's first HELLO (HELLO_START): on the others the provider carries
 * everything.
 */
psagg_status hello_exchange(psagg_ctx *ctx, int s, int64_t deadline, const char *peer,
                            enum hello_kind kind)
{
    const uint32_t flags = ctx->cfg.data_auth ? PSAGG_HELLO_DATA_AUTH : 0;
    const int other = ctx->welcomed > 0, ref = ctx->welcomed - 1; /* the first WELCOME's server */
    const int rejoin = kind == HELLO_REJOIN, local = kind == HELLO_START && ctx->cfg.local_copy;
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
    if (rejoin && ctx->cfg.elastic) { /* (the server that comes back waits for them) */
        pthread_mutex_lock(&ctx->mu);
        hello.members = (uint32_t)ctx->n_live;
        pthread_mutex_unlock(&ctx->mu);
    }
    ctx->servers[s].local_reads = 0; /* (a new connection: set again below when taken) */
    if (local) {
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
        else if ((w->flags & ~(PSAGG_WELCOME_JOINING | PSAGG_WELCOME_QUORUM |
                               PSAGG_WELCOME_RESIDUAL | PSAGG_WELCOME_FOLLOW)) != flags)
            st = psagg__fail(PSAGG_ECONFIG, "%s has data_auth %s, this worker %s", peer,
                             w->flags & PSAGG_HELLO_DATA_AUTH ? "on" : "off", flags ? "on" : "off");
        else if (rejoin && (w->flags & PSAGG_WELCOME_JOINING))
            st = psagg__fail(PSAGG_EPROTO,
                             "%s says the job runs there: not a server that starts again; try "
                             "again in a moment",
                             peer);
        else if (other && !rejoin && !!(w->flags & PSAGG_WELCOME_JOINING) != ctx->joiner)
            st = psagg__fail(PSAGG_EPROTO,
                             "%s says the job %s, server %d that it %s: try again in a moment",
                             peer, w->flags & PSAGG_WELCOME_JOINING ? "runs" : "is starting", ref,
                             ctx->joiner ? "runs" : "is starting");
        else if (other && !!(w->flags & PSAGG_WELCOME_QUORUM) != ctx->quorum)
            st = psagg__fail(PSAGG_ECONFIG,
                             "%s runs [server] quorum %s, server %d %s: start every server with "
                             "the same [server] quorum",
                             peer, w->flags & PSAGG_WELCOME_QUORUM ? "on" : "off", ref,
                             ctx->quorum ? "on" : "off");
        else if (other && !!(w->flags & PSAGG_WELCOME_FOLLOW) != !!ctx->follow_bytes)
            st = psagg__fail(PSAGG_ECONFIG,
                             "%s's chunk copies %s their owner, server %d's %s: start every "
                             "server with the same [cluster] server_replicas and elastic",
                             peer, w->flags & PSAGG_WELCOME_FOLLOW ? "follow" : "do not follow",
                             ref, ctx->follow_bytes ? "do" : "do not");
        else if (other && !!(w->flags & PSAGG_WELCOME_RESIDUAL) != ctx->server_residual)
            st = psagg__fail(PSAGG_ECONFIG,
                             "%s runs [server] error_feedback = %s, server %d %s: start every "
                             "server with the same [server] error_feedback",
                             peer, w->flags & PSAGG_WELCOME_RESIDUAL ? "on" : "off", ref,
                             ctx->server_residual ? "on" : "off");
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
                "%u, beta1 %g, beta2 %g, eps %g, sync_interval %u), server %d runs %s "
                "(%g, %g, %u, %g, %g, %g, %u): start every server with the same "
                "[server] optimizer keys",
                peer, psagg__optim_name((psagg__optim_kind)w->optim.kind),
                (double)w->optim.momentum, (double)w->optim.dampening, w->optim.nesterov,
                (double)w->optim.beta1, (double)w->optim.beta2, (double)w->optim.eps,
                w->optim.sync_interval, ref, psagg__optim_name((psagg__optim_kind)ctx->optim.kind),
                (double)ctx->optim.momentum, (double)ctx->optim.dampening, ctx->optim.nesterov,
                (double)ctx->optim.beta1, (double)ctx->optim.beta2, (double)ctx->optim.eps,
                ctx->optim.sync_interval);
        else if ((st = psagg__fabric_add_peer(ctx->fab, w->epname, w->epname_len,
                                              &ctx->servers[s].addr)))
            psagg__fail_context(st, "%s: ", peer);
        else
            session_keys(ctx, s, &hello, w);
        if (!st && !other) {
            ctx->welcomed = s + 1;
            ctx->optim = w->optim;
            ctx->joiner = !!(w->flags & PSAGG_WELCOME_JOINING);
            ctx->quorum = !!(w->flags & PSAGG_WELCOME_QUORUM);
            ctx->follow_bytes = w->flags & PSAGG_WELCOME_FOLLOW ? ((size_t)ctx->world + 7) / 8 : 0;
            ctx->bitmap_bytes = ctx->quorum ? ((size_t)ctx->world + 7) / 8 : ctx->follow_bytes;
            ctx->server_residual = !!(w->flags & PSAGG_WELCOME_RESIDUAL);
            if (ctx->joiner)
                LOG_WARN(&ctx->log,
                         "the job is running: worker %d joins it (admitted at the members' next "
                         "barrier)",
                         ctx->rank);
        }
        if (!st && local)
            local_copy_setup(ctx, s, w, peer);
    }
    free(body);
    return st;
}

int hello_transient(psagg_status st)
{
    /* EPROTO: a WELCOME whose token does not check out (a process without the secret) */
    return st == PSAGG_EPEER || st == PSAGG_ETIMEDOUT || st == PSAGG_EAGAIN || st == PSAGG_EPROTO;
}

void hello_peer(const psagg_ctx *ctx, int s, char *buf, size_t len)
{
    snprintf(buf, len, "server %d (%s:%u)", s, ctx->cfg.servers[s].host, ctx->cfg.servers[s].port);
}

psagg_status hello_declare(psagg_ctx *ctx, int s, psagg__ctl_declare *d, size_t bytes,
                           int64_t deadline, enum hello_kind kind)
{
    char peer[96];
    psagg_status st;
    hello_peer(ctx, s, peer, sizeof peer);
    if ((st = hello_exchange(ctx, s, deadline, peer, kind)))
        return st;
    d->local_flags = ctx->servers[s].local_reads ? PSAGG_LOCAL_READS : 0;
    if ((st = psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_DECLARE, d,
                              (uint32_t)bytes)))
        return psagg__fail_context(st, "declaring to %s: ", peer);
    return PSAGG_OK;
}
