/*
 * server.c - the life of one psagg-server: open the libfabric endpoint and the control port,
 * run the control loop (control.c) until every worker is gone, then stop the data path and
 * the aggregation pool and free everything.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/control.h"
#include "runtime/layout.h"
#include "server.h"

int server_run(const psagg_config *cfg, int rank, const volatile sig_atomic_t *stop)
{
    server *srv = calloc(1, sizeof *srv);
    psagg_fabric_opts fo = {0};
    char role[32];
    int rc = 1;

    if (!srv) {
        fprintf(stderr, "psagg-server: out of memory\n");
        return 1;
    }
    srv->cfg = *cfg;
    srv->rank = rank;
    srv->stop = stop;
    srv->listen_fd = -1;
    snprintf(role, sizeof role, "server %d", rank);
    psagg_logger_init(&srv->log, role, cfg->log_level);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_mutex_init(&srv->startup.mu, NULL);
    pthread_cond_init(&srv->startup.cv, NULL);
    srv->n_workers = cfg->n_workers;
    srv->workers = calloc((size_t)srv->n_workers, sizeof *srv->workers);
    if (!srv->workers) {
        LOG_ERROR(&srv->log, "out of memory");
        goto err_workers;
    }
    for (int w = 0; w < srv->n_workers; w++)
        srv->workers[w].fd = -1;

    srv->max_msg = psagg_max_message(cfg);
    fo.provider = cfg->provider;
    fo.node = cfg->server_fabric_node[0] ? cfg->server_fabric_node : cfg->servers[rank].host;
    fo.max_msg = srv->max_msg;
    fo.log = &srv->log;
    if (!strcmp(cfg->provider, "shm"))
        fo.node = NULL;
    if (psagg_fabric_open(&fo, &srv->fab)) {
        LOG_ERROR(&srv->log, "%s", psagg_last_error());
        goto err_fabric;
    }
    if (psagg_tcp_listen(&cfg->servers[rank], &srv->listen_fd)) {
        LOG_ERROR(&srv->log, "%s", psagg_last_error());
        goto err_listen;
    }
    LOG_INFO(&srv->log, "serving job '%s' for %d workers on %s:%u (fabric %s)", cfg->job_id,
             srv->n_workers, cfg->servers[rank].host, cfg->servers[rank].port,
             psagg_fabric_provider(srv->fab));

    rc = control_serve(srv);

    progress_stop(srv);
    agg_stop(srv);
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->workers[w].fd >= 0)
            close(srv->workers[w].fd);
    close(srv->listen_fd);
err_listen:
    psagg_fabric_close(srv->fab);
    agg_teardown(srv);
    psagg_rxpool_destroy(&srv->rxpool);
    psagg_layout_free(&srv->layout);
err_fabric:
    for (int w = 0; w < srv->n_workers; w++)
        free(srv->workers[w].decl);
    free(srv->workers);
err_workers:
    pthread_cond_destroy(&srv->startup.cv);
    pthread_mutex_destroy(&srv->startup.mu);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
    return rc;
}
