/* main.c - psagg-server's command line. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "log.h"

int server_run(const psagg_config *cfg, int rank);

static void usage(FILE *to)
{
    fprintf(to, "usage: psagg-server --config FILE.ini [--rank I]\n"
                "  Serves one job: aggregates the chunks that server I of [cluster] servers owns\n"
                "  and exits when every worker has finished (non-zero if the job failed).\n"
                "  --rank defaults to $PSAGG_SERVER_RANK. Keys can be overridden with\n"
                "  PSAGG_<SECTION>_<KEY> environment variables (see conf/cluster.ini).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"rank", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *config = getenv("PSAGG_CONFIG"), *rank_text = getenv("PSAGG_SERVER_RANK");
    psagg_config *cfg;
    char role[32], *end;
    long rank;
    int c, rc;

    while ((c = getopt_long(argc, argv, "c:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'r':
            rank_text = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!config || !rank_text) {
        usage(stderr);
        return 2;
    }
    rank = strtol(rank_text, &end, 10);
    if (end == rank_text || *end || rank < 0) {
        fprintf(stderr, "psagg-server: --rank '%s' is not a non-negative integer\n", rank_text);
        return 2;
    }
    cfg = malloc(sizeof *cfg);
    if (!cfg)
        return 1;
    if (psagg_config_load(config, cfg)) {
        fprintf(stderr, "psagg-server: %s\n", psagg_last_error());
        free(cfg);
        return 2;
    }
    if (rank >= cfg->n_servers) {
        fprintf(stderr, "psagg-server: --rank %ld but %s lists %d servers\n", rank, config,
                cfg->n_servers);
        free(cfg);
        return 2;
    }
    snprintf(role, sizeof role, "server %ld", rank);
    psagg_log_init(role, cfg->log_level);
    rc = server_run(cfg, (int)rank);
    free(cfg);
    return rc;
}
