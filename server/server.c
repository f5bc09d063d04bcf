/*
 * server.c - the life of one psagg-server: start its node (runtime/node.h: the logger, the
 * keys, the libfabric endpoint), open the control port, run the control loop (control.c)
 * until every worker is gone, then stop the data path and the aggregation pool and free
 * everything.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "runtime/layout.h"
#include "server.h"

/* [server] memory_budget_mb, or half of this host's memory. */
static uint64_t memory_budget(const psagg__config *cfg)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (cfg->server_memory_budget_mb)
        return cfg->server_memory_budget_mb << 20;
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 4ull << 30;
}

/*
 * Everything of a server but its control port and the job: its node (the logger even on
 * failure, the keys, the libfabric endpoint), the per-worker tables, admission, metrics and
 * membership, the optimizer's settings (and a checkpoint to resume). NULL when it cannot (why
 * is logged); server_close frees what was made.
 */
server *server_open(const psagg__config *cfg, int rank, const volatile sig_atomic_t *stop)
{
    server *srv = calloc(1, sizeof *srv);

    if (!srv) {
        fprintf(stderr, "psagg-server: out of memory\n");
        return NULL;
    }
    srv->cfg = *cfg;
    srv->rank = rank;
    srv->stop = stop;
    srv->ctl.listen_fd = -1;
    srv->mac_trace_fd = -1; /* (psagg__node_open sets it) */
    pthread_mutex_init(&srv->job.mu, NULL);
    pthread_mutex_init(&srv->pool.startup.mu, NULL);
    pthread_cond_init(&srv->pool.startup.cv, NULL);
    pthread_mutex_init(&srv->pool.barrier_mu, NULL);
    pthread_mutex_init(&srv->pool.spill_mu, NULL);
    pthread_cond_init(&srv->pool.barrier_cv, NULL);
    pthread_mutex_init(&srv->dp.sendq_mu, NULL);
    /* the logger, the job key, this server's nonce and data key (the logger even on failure) */
    if (psagg__node_open(cfg, "server", rank, &srv->node)) {
        LOG_ERROR(&srv->log, "%s", psagg_last_error());
        goto err;
    }
    psagg__update_key_make(&srv->job_key, cfg->job_id, srv->nonce, (uint32_t)rank,
                           &srv->pool.update_key);
    /* an elastic job's ranks: up to max_workers, of which `workers` start it (membership.c) */
    srv->n_workers = cfg->elastic ? cfg->max_workers : cfg->n_workers;
    srv->start_workers = cfg->n_workers;
    /* [server] quorum: rounds may close without stragglers, and say whose pushes they sum in
       a bitmap of every rank (an elastic job's max_workers) */
    srv->pool.policy = cfg->quorum ? &quorum_policy : &every_member_policy;
    /* with replicas and a quorum or elastic workers, a chunk's copies follow their owner: a
       push ends with the bitmap of its chunk's round before (wire.h) */
    srv->pool.follow_bytes = cfg->server_replicas && (cfg->quorum || cfg->elastic)
                                 ? ((size_t)srv->n_workers + 7) / 8
                                 : 0;
    srv->pool.bitmap_bytes =
        cfg->quorum ? ((size_t)srv->n_workers + 7) / 8 : srv->pool.follow_bytes;
    srv->workers = calloc((size_t)srv->n_workers, sizeof *srv->workers);
    srv->rank_at = calloc((size_t)srv->n_workers, sizeof *srv->rank_at);
    if (!srv->workers || !srv->rank_at || admission_init(srv) || metrics_init(srv) ||
        membership_init(srv) || checkpoint_init(srv)) {
        LOG_ERROR(&srv->log, "out of memory");
        goto err;
    }
    for (int w = 0; w < srv->n_workers; w++) {
        srv->workers[w].fd = -1;
        srv->rank_at[w] = -1;
    }
    if (psagg__timeline_open(cfg->timeline, "server", rank, &srv->pool.timeline) ||
        optim_init(srv)) {
        LOG_ERROR(&srv->log, "%s", psagg_last_error());
        goto err;
    }
    srv->pool.budget = memory_budget(cfg);
    if (psagg__node_open_fabric(&srv->node, cfg,
                                cfg->server_fabric_node[0] ? cfg->server_fabric_node
                                                           : cfg->servers[rank].host)) {
        LOG_ERROR(&srv->log, "%s", psagg_last_error());
        goto err;
    }
    if (cfg->secret_file[0] && !srv->source_reliable && !cfg->data_auth)
        LOG_WARN(&srv->log,
                 "provider %s cannot tell which process sent a message: with data_auth off, "
                 "any process on this host can push data as a worker",
                 psagg__fabric_provider(srv->fab));
    return srv;
err:
    server_close(srv);
    return NULL;
}

void server_close(server *srv)
{
    if (!srv)
        return;
    progress_stop(srv);
    agg_stop(srv);
    psagg__timeline_close(srv->pool.timeline, &srv->log); /* its spans name tensors of the layout */
    srv->pool.timeline = NULL;
    metrics_stop(srv); /* before the fabric: a scrape names its provider */
    for (int w = 0; srv->workers && w < srv->n_workers; w++)
        if (srv->workers[w].fd >= 0)
            close(srv->workers[w].fd);
    if (srv->ctl.listen_fd >= 0) /* closed once the job started */
        close(srv->ctl.listen_fd);
    psagg__node_close(&srv->node);
    agg_teardown(srv);
    psagg__rxpool_destroy(&srv->dp.rxpool);
    psagg__layout_free(&srv->layout);
    for (int w = 0; srv->workers && w < srv->n_workers; w++) {
        free(srv->workers[w].decl);
        psagg__ctl_reader_reset(&srv->workers[w].rd);
    }
    free(srv->workers);
    free(srv->rank_at);
    admission_fini(srv);
    membership_fini(srv);
    failover_fini(srv);
    checkpoint_fini(srv);
    optim_fini(srv);
    pthread_cond_destroy(&srv->pool.barrier_cv);
    pthread_mutex_destroy(&srv->pool.barrier_mu);
    pthread_mutex_destroy(&srv->pool.spill_mu);
    pthread_mutex_destroy(&srv->dp.sendq_mu);
    pthread_cond_destroy(&srv->pool.startup.cv);
    pthread_mutex_destroy(&srv->pool.startup.mu);
    pthread_mutex_destroy(&srv->job.mu);
    free(srv);
}

int server_run(const psagg__config *cfg, int rank, const volatile sig_atomic_t *stop)
{
    server *srv = server_open(cfg, rank, stop);
    int rc = 1;

    if (!srv)
        return 1;
    if (psagg__tcp_listen(&cfg->servers[rank], &srv->ctl.listen_fd) || metrics_start(srv)) {
        LOG_ERROR(&srv->log, "%s", psagg_last_error());
        server_close(srv);
        return 1;
    }
    LOG_INFO(&srv->log,
             "serving job '%s' for %d workers on %s:%u (fabric %s, memory budget %llu MiB%s%s)",
             cfg->job_id, srv->n_workers, cfg->servers[rank].host, cfg->servers[rank].port,
             psagg__fabric_provider(srv->fab), (unsigned long long)(srv->pool.budget >> 20),
             srv->job_key.secret ? ", secret" : "", cfg->data_auth ? ", data_auth" : "");
    rc = control_serve(srv);
    progress_stop(srv);
    agg_stop(srv);
    metrics_report(srv);
    server_close(srv);
    return rc;
}
