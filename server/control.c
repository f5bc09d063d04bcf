/*
 * control.c - psagg-server's control state machine, on the main thread. Every socket is
 * non-blocking and every frame is read piece by piece (psagg_ctl_reader), so no peer, slow or
 * silent or hostile, holds up the others.
 *
 *   start-up   accept connections and authenticate their HELLO (admission.c); each that
 *              checks out becomes its worker, answered with WELCOME. The start-up deadline
 *              (connect_timeout_ms) runs from the first authenticated HELLO. Every worker's
 *              DECLARE is checked, all must be identical
 *              (else EMISMATCH naming the tensor and the workers), the layout must fit the
 *              server's memory budget, then the data path and the aggregation pool start and
 *              every worker gets READY;
 *   running    serve BYE, PING and closed connections; PING every worker and close one that
 *              is silent for op_timeout_ms (runtime/channel.h); close the workers the data
 *              path names (state.c) and abort the job for the others, with the status and
 *              message of the first failure (a round past 1.5 x op_timeout_ms names the
 *              workers it waits for);
 *   end        when every worker is gone (0: every one said BYE and the job never failed).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "server.h"

/* Send an ERROR (start-up) or ABORT (running job) to every connected worker but `except`. */
static void tell_workers(server *srv, int except, uint16_t type, psagg_status status,
                         const char *msg)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (w == except || wc->fd < 0 || wc->state == W_BYE)
            continue;
        admission_verdict(srv, wc->fd, &wc->auth, type, status, msg);
    }
}

/*
 * Close worker w's control connection and abort the job for the others: with PSAGG_EPEER, or
 * PSAGG_ETIMEDOUT when the worker gave up on a deadline (its ABORT), so that every worker
 * sees what kind of failure stopped the job.
 */
static void drop_worker(server *srv, int w, psagg_status status, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    psagg_status job_status = status == PSAGG_ETIMEDOUT ? PSAGG_ETIMEDOUT : PSAGG_EPEER;
    char reason[256], msg[320];
    if (wc->fd < 0)
        return;
    /* `why` may be psagg_last_error(), which the sends below overwrite: copy it first */
    snprintf(reason, sizeof reason, "%s", why);
    if (atomic_load(&srv->job.failed)) /* the workers leave a failed job: expected */
        LOG_INFO(&srv->log, "closing worker %d: %s", w, reason);
    else
        LOG_ERROR(&srv->log, "closing worker %d: %s", w, reason);
    admission_verdict(srv, wc->fd, &wc->auth, PSAGG_CTL_ERROR, status, reason);
    close(wc->fd);
    wc->fd = -1;
    psagg_ctl_reader_reset(&wc->rd);
    wc->state = W_DEAD;
    if (srv->mb.elastic && srv->ctl.job_running && !atomic_load(&srv->job.failed)) {
        membership_lost(srv, w, reason); /* the job goes on without it */
        return;
    }
    if (srv->mb.elastic && !srv->ctl.job_running && !atomic_load(&srv->job.failed)) {
        /* start-up: the job starts without it (min_workers permitting), and leaves it then */
        snprintf(wc->bad_reason_startup, sizeof wc->bad_reason_startup, "%s", reason);
        return;
    }
    snprintf(msg, sizeof msg, "worker %d failed: %s", w, reason);
    server_fail_job(srv, job_status, "%s", msg);
    snprintf(msg, sizeof msg, "server %d: worker %d failed: %s", srv->rank, w, reason);
    tell_workers(srv, w, PSAGG_CTL_ABORT, job_status, msg);
}

/* ---- declarations ---- */

static void codec_text(const psagg_ctl_tensor *t, char *buf, size_t len)
{
    psagg_codec c = {(psagg_codec_id)t->codec, t->bits, t->bucket, (psagg_rounding)t->rounding};
    psagg_codec_name(&c, buf, len);
}

/*
 * The starting workers declared (an elastic job's: those that did not die meanwhile): compare
 * every list with the first one's (srv->ctl.decl_ref). 0 if identical.
 */
static int compare_declarations(server *srv, char *msg, size_t len)
{
    const int r0 = srv->ctl.decl_ref;
    const worker_conn *w0 = &srv->workers[r0];
    for (int w = r0 + 1; w < srv->start_workers; w++) {
        const worker_conn *wc = &srv->workers[w];
        if (wc->state != W_DECLARED)
            continue;
        if (wc->decl_hdr.count != w0->decl_hdr.count) {
            snprintf(msg, len, "worker %d declared %u tensors, worker %d declared %u", r0,
                     w0->decl_hdr.count, w, wc->decl_hdr.count);
            return -1;
        }
        if (wc->decl_hdr.chunk_elems != w0->decl_hdr.chunk_elems) {
            snprintf(msg, len, "worker %d uses chunks of %llu elements, worker %d of %llu", r0,
                     (unsigned long long)w0->decl_hdr.chunk_elems, w,
                     (unsigned long long)wc->decl_hdr.chunk_elems);
            return -1;
        }
        if (wc->decl_hdr.adapt_interval != w0->decl_hdr.adapt_interval ||
            wc->decl_hdr.adapt_budget != w0->decl_hdr.adapt_budget ||
            wc->decl_hdr.adapt_flags != w0->decl_hdr.adapt_flags) {
            snprintf(msg, len,
                     "worker %d and worker %d differ in [codec] adaptive settings (interval %u / "
                     "%u, budget %.6f / %.6f%s, error feedback %s / %s)",
                     r0, w, w0->decl_hdr.adapt_interval, wc->decl_hdr.adapt_interval,
                     w0->decl_hdr.adapt_budget / 1e6, wc->decl_hdr.adapt_budget / 1e6,
                     (w0->decl_hdr.adapt_flags & PSAGG_ADAPT_BUDGET_BITS) ? " bits" : "",
                     (w0->decl_hdr.adapt_flags & PSAGG_ADAPT_WORKER_EF) ? "on" : "off",
                     (wc->decl_hdr.adapt_flags & PSAGG_ADAPT_WORKER_EF) ? "on" : "off");
            return -1;
        }
    }
    for (uint32_t t = 0; t < w0->decl_hdr.count; t++) {
        const psagg_ctl_tensor *a = &w0->decl[t];
        char differ[128] = "";
        int first = -1;
        for (int w = r0 + 1; w < srv->start_workers; w++) {
            const psagg_ctl_tensor *b = &srv->workers[w].decl[t];
            if (srv->workers[w].state != W_DECLARED)
                continue;
            if (memcmp(a, b, sizeof *a)) {
                size_t used = strlen(differ);
                if (first < 0)
                    first = w;
                snprintf(differ + used, sizeof differ - used, "%s%d", used ? "," : "", w);
            }
        }
        if (first >= 0) {
            const psagg_ctl_tensor *b = &srv->workers[first].decl[t];
            char ca[40], cb[40];
            codec_text(a, ca, sizeof ca);
            codec_text(b, cb, sizeof cb);
            snprintf(msg, len,
                     "tensor %u: worker 0 declared '%.40s' (%llu elements, %.24s), worker %d "
                     "declared '%.40s' (%llu elements, %.24s); workers differing from worker 0: "
                     "%.40s",
                     t, a->name, (unsigned long long)a->count, ca, first, b->name,
                     (unsigned long long)b->count, cb, differ);
            return -1;
        }
    }
    return 0;
}

/*
 * A joiner's declaration (membership.c): the job's, exactly (the tensors, their order, codecs
 * and chunking), else it is refused by name and the job goes on; then READY. It is no member
 * until server 0 admits it.
 */
static void join_declared(server *srv, int w)
{
    worker_conn *wc = &srv->workers[w];
    const psagg_ctl_declare *a = &srv->job_decl_hdr, *b = &wc->decl_hdr;
    char msg[400];

    msg[0] = '\0';
    if (b->count != a->count || b->chunk_elems != a->chunk_elems ||
        b->adapt_interval != a->adapt_interval || b->adapt_budget != a->adapt_budget ||
        b->adapt_flags != a->adapt_flags)
        snprintf(msg, sizeof msg,
                 "its declaration differs from the job's: %u tensors in chunks of %llu elements "
                 "(the job: %u in chunks of %llu), or other [codec] adaptive settings",
                 b->count, (unsigned long long)b->chunk_elems, a->count,
                 (unsigned long long)a->chunk_elems);
    for (uint32_t t = 0; !msg[0] && t < a->count; t++)
        if (memcmp(&wc->decl[t], &srv->job_decl[t], sizeof *wc->decl)) {
            char ca[40], cb[40];
            codec_text(&srv->job_decl[t], ca, sizeof ca);
            codec_text(&wc->decl[t], cb, sizeof cb);
            snprintf(msg, sizeof msg,
                     "its tensor %u is '%.40s' (%llu elements, %.24s), the job's is '%.40s' "
                     "(%llu elements, %.24s)",
                     t, wc->decl[t].name, (unsigned long long)wc->decl[t].count, cb,
                     srv->job_decl[t].name, (unsigned long long)srv->job_decl[t].count, ca);
        }
    if (msg[0]) {
        char m[480];
        snprintf(m, sizeof m, "server %d refuses worker %d's join: %s", srv->rank, w, msg);
        LOG_WARN(&srv->log, "%s", m);
        membership_refuse(srv, w, PSAGG_EMISMATCH, m);
        return;
    }
    if (psagg_ctl_send(wc->fd, &wc->auth, PSAGG_CTL_READY, NULL, 0)) {
        drop_worker(srv, w, PSAGG_EPEER, psagg_last_error());
        return;
    }
    LOG_INFO(&srv->log, "worker %d declared the job's tensors: it waits to be admitted", w);
}

/* Keep worker w's DECLARE (checked by psagg_ctl_declare_check). */
static void read_declare(server *srv, int w, const psagg_ctl_hdr *h, const void *body)
{
    worker_conn *wc = &srv->workers[w];
    char peer[32];
    snprintf(peer, sizeof peer, "worker %d", w);
    if (psagg_ctl_declare_check(h, body, peer)) {
        drop_worker(srv, w, PSAGG_EPROTO, psagg_last_error());
        return;
    }
    wc->decl_hdr = *(const psagg_ctl_declare *)body;
    /* the worker copies our updates out of our memory (wire.h): send them by descriptor */
    if ((wc->decl_hdr.local_flags & PSAGG_LOCAL_READS) && srv->cfg.local_copy) {
        if (psagg_fabric_local_send(srv->fab, wc->addr))
            LOG_WARN(&srv->log, "worker %d: same-host copies of updates: %s", w,
                     psagg_last_error());
        else
            LOG_INFO(&srv->log, "worker %d is on this host: updates by same-host copy", w);
    }
    wc->decl = malloc((size_t)wc->decl_hdr.count * sizeof *wc->decl);
    if (!wc->decl) {
        drop_worker(srv, w, PSAGG_ENOMEM, "no memory for the declaration");
        return;
    }
    memcpy(wc->decl, (const psagg_ctl_declare *)body + 1,
           (size_t)wc->decl_hdr.count * sizeof *wc->decl);
    wc->state = W_DECLARED;
    if (wc->joining)
        join_declared(srv, w);
}

static int count_state(const server *srv, enum worker_state s)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].state == s;
    return n;
}

/* Workers connected to join the running job, not admitted yet. */
static int count_joiners(const server *srv)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].joining && srv->workers[w].fd >= 0 && srv->workers[w].state != W_BYE &&
             srv->workers[w].state != W_DEAD;
    return n;
}

/* Workers lost without leaving the job: any dead one, unless it left an elastic job's epoch. */
static int dead_members(const server *srv)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].state == W_DEAD && (!srv->mb.elastic || server_member(srv, w));
    return n;
}

/* The workers whose state is below `below` (still connected: below W_BYE, fd open). */
static void missing_workers(const server *srv, enum worker_state below, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int w = 0; w < srv->n_workers && used + 8 < len; w++)
        if (srv->workers[w].state < below && (below != W_BYE || srv->workers[w].fd >= 0) &&
            (below != W_DECLARED || w < srv->start_workers)) /* (the rest join later) */
            used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", w);
}

/* All declarations are in and identical (the job's): check the budget, build the layout, start. */
static psagg_status start_job(server *srv)
{
    const psagg_ctl_declare *d = &srv->job_decl_hdr;
    psagg_status st;
    size_t rbuf_size;
    int n_rbufs;

    /* refuse what would not fit before building anything (the layout itself included) */
    if ((st = agg_check_budget(srv, srv->job_decl, d->count, d->chunk_elems, d->adapt_interval)))
        return st;
    st = psagg_layout_build(srv->job_decl, d->count, d->chunk_elems, (uint32_t)srv->cfg.n_servers,
                            d->adapt_interval, &srv->layout);
    if (st)
        return st;
    /* a parameter's push: its body (INIT: fp32 weights) and its trailer */
    rbuf_size =
        sizeof(psagg_msg_hdr) +
        (srv->layout.max_param_bytes > srv->layout.max_enc_bytes ? srv->layout.max_param_bytes
                                                                 : srv->layout.max_enc_bytes) +
        (srv->layout.max_param_bytes ? sizeof(psagg_msg_param) : 0) + srv->tag_bytes;
    if (rbuf_size > srv->max_msg)
        return psagg_fail(PSAGG_EINVAL,
                          "chunks of %zu bytes exceed this server's largest message of %zu "
                          "([worker] chunk_bytes must not be larger for workers than for servers)",
                          rbuf_size, srv->max_msg);
    st = agg_setup(srv);
    if (!st)
        st = optim_check_job(srv); /* before agg_start loads a checkpoint into the chunks */
    if (st)
        return st;
    /* enough receive buffers for every worker to have several chunks in flight */
    n_rbufs = psagg_rxpool_count(16 * srv->n_workers < 1024 ? 16 * srv->n_workers : 1024, rbuf_size,
                                 512ull << 20);
    st = psagg_rxpool_create(&srv->dp.rxpool, srv->fab, n_rbufs, rbuf_size, sizeof(recv_buf));
    if (st)
        return st;
    srv->pool.rx_hold_max = n_rbufs / 2;
    st = agg_start(srv);
    if (st)
        return st;
    optim_loaded(srv);        /* a restored checkpoint is in the chunks now */
    metrics_job_started(srv); /* before any push can reach an aggregation thread */
    st = progress_start(srv);
    if (st)
        return st;
    LOG_INFO(&srv->log,
             "job '%s': %u tensors, %u chunks, %u owned here (%llu bytes per worker per round), "
             "%d aggregation threads, provider %s%s",
             srv->cfg.job_id, srv->layout.n_tensors, srv->layout.n_chunks, srv->n_owned,
             (unsigned long long)srv->layout.owned_bytes[srv->rank], srv->pool.n_threads,
             psagg_fabric_provider(srv->fab), srv->cfg.data_auth ? ", data_auth" : "");
    return PSAGG_OK;
}

/*
 * Checkpoints. A worker asks (CHECKPOINT) with no operation in flight. When every round waits
 * for every member, its chunks are then all between the same two rounds: the checkpoint is
 * written at once. When the round policy lets rounds close without a worker ([server] quorum),
 * others may be a round ahead of the one asking: only when every member is between steps are
 * all chunks between the same rounds, so every member asks at the same step (a collective,
 * round_policy.collective_checkpoint) and the file is written once the last has, within 1.5 x
 * op_timeout_ms of the first (checkpoint_tick), or each gets why not, naming who did not ask.
 */
static void checkpoint_answer(server *srv, int w, psagg_status st, const char *m)
{
    worker_conn *wc = &srv->workers[w];
    wc->ckpt_wanted = 0;
    if (wc->fd >= 0 && psagg_ctl_send_error(wc->fd, &wc->auth, PSAGG_CTL_CHECKPOINT_DONE, st, m))
        drop_worker(srv, w, PSAGG_EPEER, psagg_last_error());
}

/* Write the checkpoint now and answer every worker that asked for it. */
static void checkpoint_write(server *srv)
{
    char path[PATH_MAX + 16], m[300];
    int64_t t0 = psagg_now_ns();
    psagg_status st;
    agg_barrier(srv); /* the aggregation threads' writes of finished rounds, visible */
    st = optim_checkpoint(srv, path, sizeof path);
    metrics_checkpoint(srv, psagg_now_ns() - t0, !st);
    snprintf(m, sizeof m, "%.290s", st ? psagg_last_error() : path);
    if (st)
        LOG_ERROR(&srv->log, "a checkpoint was asked for: %s", m);
    srv->ctl.checkpoint_since = 0;
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->workers[w].ckpt_wanted)
            checkpoint_answer(srv, w, st, m);
}

static void checkpoint_request(server *srv, int w)
{
    srv->workers[w].ckpt_wanted = 1;
    if (!srv->pool.policy->collective_checkpoint) {
        checkpoint_write(srv);
        return;
    }
    if (!srv->ctl.checkpoint_since)
        srv->ctl.checkpoint_since = psagg_now_ms();
    checkpoint_tick(srv, psagg_now_ms());
}

void checkpoint_tick(server *srv, int64_t now)
{
    char missing[128] = "", m[300];
    size_t used = 0;
    int all = 1;
    if (!srv->ctl.checkpoint_since)
        return;
    for (int w = 0; w < srv->n_workers; w++)
        if (server_member(srv, w) && !srv->workers[w].ckpt_wanted) {
            all = 0;
            if (used + 8 < sizeof missing)
                used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                         used ? "," : "", w);
        }
    if (all) {
        checkpoint_write(srv);
        return;
    }
    if (now - srv->ctl.checkpoint_since <= PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms))
        return;
    snprintf(m, sizeof m,
             "server %d: no checkpoint: with [server] quorum every worker calls psagg_checkpoint "
             "at the same step (rounds may close without one), and workers %s did not within "
             "1.5 x op_timeout_ms=%d",
             srv->rank, missing, srv->cfg.op_timeout_ms);
    LOG_WARN(&srv->log, "%s", m);
    srv->ctl.checkpoint_since = 0;
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->workers[w].ckpt_wanted)
            checkpoint_answer(srv, w, PSAGG_ETIMEDOUT, m);
}

/* A worker's socket is readable: BYE, DECLARE, its ABORT (why it failed), or a dead connection. */
static void serve_worker(server *srv, int w)
{
    worker_conn *wc = &srv->workers[w];
    psagg_ctl_hdr h;
    void *body;
    const char *text;
    char name[32];
    psagg_status st;

    snprintf(name, sizeof name, "worker %d", w);
    st = psagg_ctl_reader_feed(&wc->rd, wc->fd, name);
    wc->heard_at = psagg_now_ms(); /* readable: it is alive, whatever came */
    if (st == PSAGG_EAGAIN)
        return;
    if (st) {
        drop_worker(srv, w, st, psagg_last_error());
        return;
    }
    body = psagg_ctl_reader_take(&wc->rd, &h);
    if (h.type == PSAGG_CTL_PING && h.len == 0) {
        /* still there (heard_at is set) */
    } else if (h.type == PSAGG_CTL_BYE) {
        LOG_INFO(&srv->log, "worker %d said BYE", w);
        wc->state = W_BYE;
        close(wc->fd);
        wc->fd = -1;
        psagg_ctl_reader_reset(&wc->rd);
        /* an elastic job goes on without a worker that is done (the others may not be) */
        if (srv->mb.elastic && srv->ctl.job_running && !atomic_load(&srv->job.failed))
            membership_bye(srv, w);
    } else if (h.type == PSAGG_CTL_DECLARE && wc->state == W_HELLO) {
        read_declare(srv, w, &h, body);
    } else if (h.type == PSAGG_CTL_CHECKPOINT && h.len == 0 && srv->pool.started) {
        checkpoint_request(srv, w);
    } else if (h.type == PSAGG_CTL_MEMBERSHIP && wc->state == W_DECLARED && srv->ctl.job_running &&
               (server_member(srv, w) || wc->joining)) { /* (a joiner relays its admission) */
        membership_relayed(srv, w, &h, body);
    } else if (h.type == PSAGG_CTL_SYNC && wc->state == W_DECLARED && srv->ctl.job_running &&
               srv->mb.elastic && srv->rank == 0 && server_member(srv, w)) {
        membership_sync(srv, w, &h, body);
    } else if (h.type == PSAGG_CTL_START && wc->state == W_DECLARED && !srv->ctl.job_running &&
               srv->mb.elastic && srv->rank > 0) {
        membership_start_relayed(srv, w, &h, body);
    } else if (h.type == PSAGG_CTL_START && srv->ctl.job_running && srv->rank > 0 &&
               srv->mb.elastic) {
        /* (the job started here first: every worker relays server 0's start) */
    } else if (h.type == PSAGG_CTL_JOIN && h.len == 0 && wc->state == W_DECLARED && wc->joining &&
               !wc->join_asked && srv->rank == 0) {
        membership_join(srv, w);
    } else if (h.type == PSAGG_CTL_ABORT && (st = psagg_ctl_error_parse(&h, body, &text))) {
        char m[300];
        snprintf(m, sizeof m, "it gave up: %s", text);
        drop_worker(srv, w, st, m);
    } else {
        char m[120];
        snprintf(m, sizeof m, "unexpected control frame type %u in state %d", h.type, wc->state);
        drop_worker(srv, w, PSAGG_EPROTO, m);
    }
    free(body);
}

/* The data-path threads ask for peers to be closed (state.c): close them here. */
static void close_named_workers(server *srv)
{
    for (int w = 0; w < srv->n_workers; w++) {
        char reason[200];
        pthread_mutex_lock(&srv->job.mu);
        snprintf(reason, sizeof reason, "%s", srv->workers[w].bad_reason);
        srv->workers[w].bad_reason[0] = '\0';
        pthread_mutex_unlock(&srv->job.mu);
        if (reason[0])
            drop_worker(srv, w, PSAGG_EPROTO, reason);
    }
}

/* Start-up is over, one way or the other: tell every connected worker why it failed. */
static int startup_failed(server *srv, psagg_status status, const char *msg)
{
    LOG_ERROR(&srv->log, "%s", msg);
    tell_workers(srv, -1, PSAGG_CTL_ERROR, status, msg);
    return 1;
}

/* Every worker declared: compare, start the job and answer READY. 0 when the job runs. */
static int start_or_refuse(server *srv, int *rc)
{
    char msg[512];

    if (compare_declarations(srv, msg, sizeof msg)) {
        *rc = startup_failed(srv, PSAGG_EMISMATCH, msg);
        return -1;
    }
    /* the job's declaration, kept as its own: a joiner's must equal it, and checkpoints and
       the layout read it, never a worker's (which may die, or rejoin and declare again) */
    srv->job_decl_hdr = srv->workers[srv->ctl.decl_ref].decl_hdr;
    srv->job_decl = malloc((size_t)srv->job_decl_hdr.count * sizeof *srv->job_decl);
    if (!srv->job_decl) {
        *rc = startup_failed(srv, PSAGG_ENOMEM, "no memory for the job's declaration");
        return -1;
    }
    memcpy(srv->job_decl, srv->workers[srv->ctl.decl_ref].decl,
           (size_t)srv->job_decl_hdr.count * sizeof *srv->job_decl);
    {
        psagg_status st = start_job(srv);
        if (st) {
            snprintf(msg, sizeof msg, "server %d cannot start the job: %.220s", srv->rank,
                     psagg_last_error());
            *rc = startup_failed(srv, st, msg);
            return -1;
        }
    }
    {
        /* an elastic job: server 0 names the starting workers, relayed to the others (START) */
        uint32_t len = 0;
        void *start = srv->mb.elastic && srv->rank == 0 ? membership_start_frame(srv, &len) : NULL;
        if (srv->mb.elastic && srv->rank == 0 && !start) {
            *rc = startup_failed(srv, PSAGG_ENOMEM, "no memory for READY");
            return -1;
        }
        for (int w = 0; w < srv->start_workers; w++) /* (the ranks beyond join later) */
            if (srv->workers[w].state == W_DECLARED &&
                psagg_ctl_send(srv->workers[w].fd, &srv->workers[w].auth, PSAGG_CTL_READY, start,
                               len))
                drop_worker(srv, w, PSAGG_EPEER, psagg_last_error()); /* fails the job */
        free(start);
    }
    return 0;
}

/*
 * While the job runs: PING every worker now and then, and close a worker that has sent
 * nothing for op_timeout_ms (stopped or hung), which fails the job naming it.
 */
static void check_liveness(server *srv, int64_t now)
{
    int op = srv->cfg.op_timeout_ms;
    /* an elastic job gives a worker up sooner: the others wait for it meanwhile */
    int64_t limit = srv->mb.elastic ? psagg_member_timeout_ms(op) : op;
    if (now >= srv->ctl.next_ping) {
        for (int w = 0; w < srv->n_workers; w++) {
            worker_conn *wc = &srv->workers[w];
            if (wc->fd >= 0 && wc->state == W_DECLARED &&
                psagg_ctl_send(wc->fd, &wc->auth, PSAGG_CTL_PING, NULL, 0))
                LOG_DEBUG(&srv->log, "worker %d: PING: %s", w, psagg_last_error());
        }
        srv->ctl.next_ping = now + psagg_ping_interval_ms(op);
    }
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        char why[160];
        if (wc->fd >= 0 && wc->joining && wc->state == W_HELLO &&
            now - wc->heard_at > srv->cfg.connect_timeout_ms) {
            drop_worker(srv, w, PSAGG_ETIMEDOUT,
                        "it connected to join but did not declare within connect_timeout_ms");
            continue;
        }
        if (wc->fd < 0 || wc->state != W_DECLARED || now - wc->heard_at <= limit)
            continue;
        if (srv->mb.elastic)
            snprintf(why, sizeof why,
                     "worker %d sent nothing for %.1f s, more than 3 PING intervals of %d ms "
                     "(stopped, hung or cut off)",
                     w, (double)(now - wc->heard_at) / 1e3, psagg_ping_interval_ms(op));
        else
            snprintf(why, sizeof why,
                     "worker %d sent nothing for %.1f s, more than op_timeout_ms=%d (stopped, "
                     "hung or cut off)",
                     w, (double)(now - wc->heard_at) / 1e3, op);
        drop_worker(srv, w, PSAGG_ETIMEDOUT, why);
    }
}

/*
 * The control loop: returns the process exit code. Phases: STARTING (accept, HELLO, DECLARE;
 * the start-up deadline runs from the first authenticated HELLO), RUNNING (BYE, deaths,
 * data-path reports), ABORTED (the job failed and every worker was told; wait for them to go).
 */
int control_serve(server *srv)
{
    enum { STARTING, RUNNING, ABORTED } phase = STARTING;
    int64_t aborted_at = 0;
    size_t cap = (size_t)srv->n_workers + PENDING_MAX + 1;
    struct pollfd *pfd = calloc(cap, sizeof *pfd);
    int *who = calloc(cap, sizeof *who); /* >= 0 worker, -1 listen, -2 - i pending slot i */
    int rc = 1;

    if (!pfd || !who) {
        LOG_ERROR(&srv->log, "no memory for the control loop");
        goto out;
    }
    for (;;) {
        int n = 0;
        int64_t now = psagg_now_ms();
        char missing[128], msg[512];

        if (*srv->stop) {
            LOG_INFO(&srv->log, "stopping on signal");
            tell_workers(srv, -1, PSAGG_CTL_ABORT, PSAGG_ECLOSED, "server stopped by a signal");
            rc = phase != STARTING && !atomic_load(&srv->job.failed) &&
                         count_state(srv, W_BYE) + count_state(srv, W_NONE) == srv->n_workers
                     ? 0
                     : 143;
            break;
        }
        close_named_workers(srv);
        if (phase == RUNNING && atomic_load(&srv->job.failed)) {
            psagg_status status;
            pthread_mutex_lock(&srv->job.mu);
            snprintf(msg, sizeof msg, "server %d: %.200s", srv->rank, srv->job.error);
            status = srv->job.status ? srv->job.status : PSAGG_EPEER;
            pthread_mutex_unlock(&srv->job.mu);
            LOG_ERROR(&srv->log, "job failed: %s", msg);
            tell_workers(srv, -1, PSAGG_CTL_ABORT, status, msg);
            phase = ABORTED;
            aborted_at = now;
        }
        if (phase == RUNNING) {
            check_liveness(srv, now);
            checkpoint_tick(srv, now); /* (a collective checkpoint's members, its deadline) */
            if (srv->mb.elastic) {     /* joins: admission stays open (admission.c, membership.c) */
                membership_tick(srv, now);
                admission_expire(srv, now);
                n = admission_poll_add(srv, pfd, who, n);
            }
        }
        if (phase == ABORTED && now - aborted_at > srv->cfg.op_timeout_ms) {
            /* every worker was told; one that is still connected is stuck or stopped */
            missing_workers(srv, W_BYE, missing, sizeof missing);
            LOG_ERROR(&srv->log,
                      "the job failed and workers %s are still connected op_timeout_ms=%d "
                      "later; leaving",
                      missing, srv->cfg.op_timeout_ms);
            rc = 1;
            break;
        }
        if (phase != STARTING && /* (W_NONE: a rank beyond `workers` that never joined) */
            count_state(srv, W_BYE) + count_state(srv, W_DEAD) + count_state(srv, W_NONE) +
                    count_joiners(srv) ==
                srv->n_workers) {
            if (count_joiners(srv))
                tell_workers(srv, -1, PSAGG_CTL_ERROR, PSAGG_EPEER,
                             "the job ended before this worker could join it: every member is "
                             "gone");
            /* (the workers that left an elastic job are no failure of it; one lost here that
               server 0 never removed is) */
            rc = atomic_load(&srv->job.failed) || dead_members(srv) ? 1 : 0;
            LOG_INFO(&srv->log, "all workers gone, job %s", rc ? "failed" : "done");
            metrics_usage(srv);
            break;
        }
        if (phase == STARTING) {
            int dead = count_state(srv, W_DEAD), declared = count_state(srv, W_DECLARED);
            if (dead > 0 && !srv->mb.elastic) {
                rc = startup_failed(srv, PSAGG_EPEER, "another worker failed during start-up");
                break;
            }
            if (dead > 0 && srv->start_workers - dead < srv->cfg.min_workers) {
                snprintf(msg, sizeof msg,
                         "server %d: %d workers died during start-up: %d left, fewer than "
                         "min_workers=%d",
                         srv->rank, dead, srv->start_workers - dead, srv->cfg.min_workers);
                rc = startup_failed(srv, PSAGG_EPEER, msg);
                break;
            }
            /* (elastic: the workers that died start out of it, as joinable ranks) */
            if (declared > 0 && declared + dead == srv->start_workers) {
                for (srv->ctl.decl_ref = 0; srv->workers[srv->ctl.decl_ref].state != W_DECLARED;)
                    srv->ctl.decl_ref++;
                if (start_or_refuse(srv, &rc))
                    break;
                for (int w = 0; w < srv->start_workers; w++)
                    if (srv->workers[w].state == W_DEAD)
                        membership_lost(srv, w,
                                        srv->workers[w].bad_reason_startup[0]
                                            ? srv->workers[w].bad_reason_startup
                                            : "it died during start-up");
                if (!srv->mb.elastic) {
                    /* nobody else may join now: later connections are refused by the kernel */
                    close(srv->ctl.listen_fd);
                    srv->ctl.listen_fd = -1;
                    admission_close_all(srv);
                }
                for (int w = 0; w < srv->n_workers; w++) /* their silence counts from now */
                    srv->workers[w].heard_at = now;
                phase = RUNNING;
                srv->ctl.job_running = 1;
                continue; /* a READY that could not be sent has failed the job */
            }
            if (admission_deadline(srv) >= 0 && now > admission_deadline(srv)) {
                missing_workers(srv, W_DECLARED, missing, sizeof missing);
                snprintf(msg, sizeof msg,
                         "server %d: workers %s did not arrive and declare within "
                         "connect_timeout_ms=%d of the first worker",
                         srv->rank, missing, srv->cfg.connect_timeout_ms);
                rc = startup_failed(srv, PSAGG_ETIMEDOUT, msg);
                break;
            }
            admission_expire(srv, now);
            n = admission_poll_add(srv, pfd, who, n);
        }
        for (int w = 0; w < srv->n_workers; w++)
            if (srv->workers[w].fd >= 0) {
                pfd[n] = (struct pollfd){.fd = srv->workers[w].fd, .events = POLLIN};
                who[n++] = w;
            }
        if (poll(pfd, (nfds_t)n, 50) < 0 && errno != EINTR) {
            LOG_ERROR(&srv->log, "poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (who[i] < 0)
                admission_serve(srv, who[i], pfd[i].fd);
            else if (who[i] >= 0 && srv->workers[who[i]].fd >= 0)
                serve_worker(srv, who[i]);
        }
    }
out:
    admission_close_all(srv);
    free(pfd);
    free(who);
    return rc;
}
