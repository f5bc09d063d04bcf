/*
 * main.c - psagg-server's command line: serve one job; or (--check-config) check the config
 * with psagg's own parser and print it resolved; or (--fabric-env) print the libfabric
 * environment that every process of the job should start with (runtime/transport.h). The
 * server does not set that environment itself: rxm refuses connections between processes
 * whose limits differ, so a server that raised its own would shut out workers started
 * without the launcher. The launchers give the same lines to every process.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "runtime/config.h"
#include "runtime/features.h"
#include "runtime/layout.h"
#include "runtime/transport.h"
#include "runtime/wire.h"
#include "server.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* The NAME=VALUE lines of psagg__fabric_env_hint for this job's largest message. */
static void print_fabric_env(const psagg__config *cfg)
{
    psagg__fabric_env env[4];
    int n = psagg__fabric_env_hint(cfg->provider, psagg__max_message(cfg), env, 4);
    for (int i = 0; i < n; i++)
        printf("%s=%s\n", env[i].name, env[i].value);
}

static void usage(FILE *to)
{
    fprintf(to, "usage: psagg-server --config FILE.ini [--rank I]\n"
                "       psagg-server --config FILE.ini --check-config\n"
                "       psagg-server --config FILE.ini --fabric-env\n"
                "       psagg-server --features | --version\n"
                "  Serves one job: aggregates the chunks that server I of [cluster] servers owns\n"
                "  and exits when every worker has finished (non-zero if the job failed).\n"
                "  --rank defaults to $PSAGG_SERVER_RANK. Keys can be overridden with\n"
                "  PSAGG_<SECTION>_<KEY> environment variables (see conf/cluster.ini).\n"
                "  --check-config checks the file and the environment overrides and prints\n"
                "  every key resolved, as 'section.key = value' lines (exit 0), or the first\n"
                "  error with its file:line (exit 2), including a server address that does not\n"
                "  resolve here. Scripts read this instead of the INI.\n"
                "  --fabric-env prints the NAME=VALUE lines of libfabric environment that every\n"
                "  process of the job (servers and workers alike) should start with for full\n"
                "  speed; deploy/psagg-local passes them on.\n"
                "  --features prints which of psagg's opt-in features work together, and why\n"
                "  the others do not yet (docs/features.md), as Markdown; --version prints\n"
                "  psagg's version and the protocol version it speaks.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"rank", required_argument, NULL, 'r'},
        {"fabric-env", no_argument, NULL, 'e'},   {"check-config", no_argument, NULL, 'k'},
        {"features", no_argument, NULL, 'f'},     {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},      {NULL, 0, NULL, 0}};
    const char *config = getenv("PSAGG_CONFIG"), *rank_text = getenv("PSAGG_SERVER_RANK");
    psagg__config *cfg;
    char *end;
    long rank;
    int c, rc, print_env = 0, check_only = 0;
    struct sigaction sa = {.sa_handler = on_signal};

    while ((c = getopt_long(argc, argv, "c:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'r':
            rank_text = optarg;
            break;
        case 'e':
            print_env = 1;
            break;
        case 'k':
            check_only = 1;
            break;
        case 'f':
            psagg__features_print(stdout);
            return 0;
        case 'V':
            printf("psagg-server %s (protocol version %d)\n", psagg_version(), PSAGG_PROTO_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!config || (!rank_text && !print_env && !check_only)) {
        usage(stderr);
        return 2;
    }
    if (print_env || check_only) {
        psagg__config *pc = malloc(sizeof *pc);
        if (!pc || psagg__config_load(config, pc) ||
            (check_only && psagg__config_check_addresses(pc))) {
            fprintf(stderr, "psagg-server: %s\n", pc ? psagg_last_error() : "out of memory");
            free(pc);
            return 2;
        }
        if (check_only)
            psagg__config_print(pc, stdout);
        if (print_env)
            print_fabric_env(pc);
        free(pc);
        return 0;
    }
    rank = strtol(rank_text, &end, 10);
    if (end == rank_text || *end || rank < 0) {
        fprintf(stderr, "psagg-server: --rank '%s' is not a non-negative integer\n", rank_text);
        return 2;
    }
    cfg = malloc(sizeof *cfg);
    if (!cfg)
        return 1;
    if (psagg__config_load(config, cfg)) {
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
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = server_run(cfg, (int)rank, &stop_requested);
    free(cfg);
    if (rc == SERVER_RESTART) { /* (its stale copies: it rejoins the job as a restarted one) */
        fflush(NULL);
        close_range(3, ~0U, 0); /* (a descriptor the libraries left open stays no longer) */
        execv("/proc/self/exe", argv);
        fprintf(stderr, "psagg-server: cannot start again (execv /proc/self/exe): %s\n",
                strerror(errno));
        return 1;
    }
    return rc;
}
