/*
 * startup.c - a job's start (the control thread): every starting worker's DECLARE is kept and
 * checked (psagg__ctl_declare_check), all must be identical (else EMISMATCH naming the tensor
 * and the workers); the first is kept as the job's declaration, the layout must fit the
 * server's memory budget, then the aggregation pool and the data path start and every
 * starting worker gets READY (an elastic job's carries server 0's list of who starts it). A
 * worker that declares later joins the running job: its declaration must be the job's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "server.h"

static void codec_text(const psagg__ctl_tensor *t, char *buf, size_t len)
{
    psagg_codec c = psagg__tensor_codec(t);
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
    for (int w = r0 + 1; w < server_start_ranks(srv); w++) {
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
        const psagg__ctl_tensor *a = &w0->decl[t];
        char differ[128] = "";
        size_t used = 0;
        int first = -1;
        for (int w = r0 + 1; w < server_start_ranks(srv); w++) {
            const psagg__ctl_tensor *b = &srv->workers[w].decl[t];
            if (srv->workers[w].state != W_DECLARED)
                continue;
            if (memcmp(a, b, sizeof *a)) {
                if (first < 0)
                    first = w;
                used = psagg__list_int(differ, sizeof differ, used, w);
            }
        }
        if (first >= 0) {
            const psagg__ctl_tensor *b = &srv->workers[first].decl[t];
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
    const psagg__ctl_declare *a = &srv->job_decl_hdr, *b = &wc->decl_hdr;
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
    if (psagg__ctl_send(wc->fd, &wc->auth, PSAGG_CTL_READY, NULL, 0)) {
        server_drop_worker(srv, w, PSAGG_EPEER, psagg_last_error());
        return;
    }
    LOG_INFO(&srv->log, "worker %d declared the job's tensors: it waits to be admitted", w);
}

void startup_declare(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    worker_conn *wc = &srv->workers[w];
    char peer[32];
    snprintf(peer, sizeof peer, "worker %d", w);
    if (psagg__ctl_declare_check(h, body, peer)) {
        server_drop_worker(srv, w, PSAGG_EPROTO, psagg_last_error());
        return;
    }
    wc->decl_hdr = *(const psagg__ctl_declare *)body;
    /* the worker copies our updates out of our memory (wire.h): send them by descriptor */
    if ((wc->decl_hdr.local_flags & PSAGG_LOCAL_READS) && srv->cfg.local_copy) {
        if (psagg__fabric_local_send(srv->fab, wc->addr))
            LOG_WARN(&srv->log, "worker %d: same-host copies of updates: %s", w,
                     psagg_last_error());
        else
            LOG_INFO(&srv->log, "worker %d is on this host: updates by same-host copy", w);
    }
    wc->decl = malloc((size_t)wc->decl_hdr.count * sizeof *wc->decl);
    if (!wc->decl) {
        server_drop_worker(srv, w, PSAGG_ENOMEM, "no memory for the declaration");
        return;
    }
    memcpy(wc->decl, (const psagg__ctl_declare *)body + 1,
           (size_t)wc->decl_hdr.count * sizeof *wc->decl);
    wc->state = W_DECLARED;
    if (wc->joining)
        join_declared(srv, w);
}

/* All declarations are in and identical (the job's): check the budget, build the layout, start. */
static psagg_status start_job(server *srv)
{
    const psagg__ctl_declare *d = &srv->job_decl_hdr;
    psagg_status st;
    size_t rbuf_size;
    int n_rbufs;

    /* refuse what would not fit before building anything (the layout itself included) */
    if ((st = agg_check_budget(srv, srv->job_decl, d->count, d->chunk_elems, d->adapt_interval)))
        return st;
    st = psagg__layout_build(srv->job_decl, d->count, d->chunk_elems, (uint32_t)srv->cfg.n_servers,
                             d->adapt_interval, &srv->layout);
    if (st)
        return st;
    /* a parameter's push: its body (INIT: fp32 weights) and its trailer */
    rbuf_size =
        sizeof(psagg__msg_hdr) +
        (srv->layout.max_param_bytes > srv->layout.max_enc_bytes ? srv->layout.max_param_bytes
                                                                 : srv->layout.max_enc_bytes) +
        (srv->layout.max_param_bytes ? sizeof(psagg__msg_param) : 0) + srv->pool.follow_bytes +
        srv->tag_bytes;
    if (rbuf_size > srv->max_msg)
        return psagg__fail(PSAGG_EINVAL,
                           "chunks of %zu bytes exceed this server's largest message of %zu "
                           "([worker] chunk_bytes must not be larger for workers than for servers)",
                           rbuf_size, srv->max_msg);
    st = agg_setup(srv);
    if (!st)
        st = optim_check_job(srv); /* before agg_start loads a checkpoint into the chunks */
    if (st)
        return st;
    /* enough receive buffers for every worker to have several chunks in flight */
    n_rbufs = psagg__rxpool_count(16 * srv->n_workers < 1024 ? 16 * srv->n_workers : 1024,
                                  rbuf_size, 512ull << 20);
    st = psagg__rxpool_create(&srv->dp.rxpool, srv->fab, n_rbufs, rbuf_size, sizeof(recv_buf));
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
             "%u held for a takeover, %d aggregation threads, provider %s%s",
             srv->cfg.job_id, srv->layout.n_tensors, srv->layout.n_chunks, srv->n_owned,
             (unsigned long long)srv->layout.owned_bytes[srv->rank], srv->n_held - srv->n_owned,
             srv->pool.n_threads, psagg__fabric_provider(srv->fab),
             srv->cfg.data_auth ? ", data_auth" : "");
    return PSAGG_OK;
}

psagg_status startup_start(server *srv, char *msg, size_t len)
{
    psagg_status st;
    uint32_t start_len = 0;
    void *start;
    int owner;

    for (srv->ctl.decl_ref = 0; srv->workers[srv->ctl.decl_ref].state != W_DECLARED;)
        srv->ctl.decl_ref++;
    if (compare_declarations(srv, msg, len))
        return PSAGG_EMISMATCH;
    /* the job's declaration, kept as its own: a joiner's must equal it, and checkpoints and
       the layout read it, never a worker's (which may die, or rejoin and declare again) */
    srv->job_decl_hdr = srv->workers[srv->ctl.decl_ref].decl_hdr;
    srv->job_decl = malloc((size_t)srv->job_decl_hdr.count * sizeof *srv->job_decl);
    if (!srv->job_decl) {
        snprintf(msg, len, "no memory for the job's declaration");
        return PSAGG_ENOMEM;
    }
    memcpy(srv->job_decl, srv->workers[srv->ctl.decl_ref].decl,
           (size_t)srv->job_decl_hdr.count * sizeof *srv->job_decl);
    if ((st = start_job(srv))) {
        snprintf(msg, len, "server %d cannot start the job: %.220s", srv->rank, psagg_last_error());
        return st;
    }
    /* an elastic job: the membership's owner (server 0: no view moved it yet) names the
       starting workers, relayed to the others (START) */
    owner = srv->mb.elastic && membership_owner(srv) == srv->rank;
    start = owner ? membership_start_frame(srv, &start_len) : NULL;
    if (owner && !start) {
        snprintf(msg, len, "no memory for READY");
        return PSAGG_ENOMEM;
    }
    for (int w = 0; w < server_start_ranks(srv); w++) /* (the ranks beyond join later) */
        if (srv->workers[w].state == W_DECLARED &&
            psagg__ctl_send(srv->workers[w].fd, &srv->workers[w].auth, PSAGG_CTL_READY, start,
                            start_len))
            server_drop_worker(srv, w, PSAGG_EPEER, psagg_last_error()); /* (the loop settles it) */
    free(start);
    return PSAGG_OK;
}
