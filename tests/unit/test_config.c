/*
 * test_config.c - psagg__config_load(): the shipped conf/ INI files, defaults, every error
 * class with its file:line and key, environment overrides, and psagg__parse_hostport().
 */
#include "../testutil.h"
#include "base/log.h"
#include "kernels/optim.h"
#include "runtime/config.h"
#include "runtime/features.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];
static char conf_dir[PATH_MAX];
static int n_files;

/* Write `text` to a fresh file under tmpdir and return its path (static storage). */
static const char *write_ini(const char *text)
{
    static char path[PATH_MAX];
    FILE *f;
    snprintf(path, sizeof path, "%s/t%d.ini", tmpdir, n_files++);
    f = fopen(path, "w");
    CHECK(f, "cannot create %s", path);
    CHECK(fputs(text, f) >= 0, "write %s", path);
    CHECK(fclose(f) == 0, "close %s", path);
    return path;
}

static void remove_tmpdir(void)
{
    char path[PATH_MAX];
    for (int i = 0; i < n_files; i++) {
        snprintf(path, sizeof path, "%s/t%d.ini", tmpdir, i);
        unlink(path);
    }
    if (tmpdir[0])
        rmdir(tmpdir);
}

#define MINIMAL     "[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkers = 2\n"
#define TWO_SERVERS "[cluster]\njob_id = j\nservers = 127.0.0.1:1 127.0.0.1:2\nworkers = 2\n"

/*
 * Load `text` and expect ECONFIG with a message that contains "<path>:<line>: " (line > 0)
 * and each of the (NULL-terminated) fragments.
 */
static void expect_error_at(int src_line, const char *text, int line, ...)
{
    psagg__config cfg;
    const char *path = write_ini(text);
    char where[PATH_MAX + 32];
    const char *msg;
    va_list ap;
    int rc = psagg__config_load(path, &cfg);

    msg = psagg_last_error();
    CHECK(rc == PSAGG_ECONFIG, "(test line %d) rc %d, expected ECONFIG; msg '%s'", src_line, rc,
          msg);
    snprintf(where, sizeof where, "%s:%d: ", path, line);
    CHECK(strstr(msg, where) == msg, "(test line %d) message '%s' does not start with '%s'",
          src_line, msg, where);
    va_start(ap, line);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        CHECK(strstr(msg, frag), "(test line %d) message '%s' lacks '%s'", src_line, msg, frag);
    va_end(ap);
}
#define EXPECT_ERROR(text, line, ...) expect_error_at(__LINE__, text, line, __VA_ARGS__, NULL)

/* worker_hosts: normalized, checked against workers; server addresses must resolve */
static void test_worker_hosts(void)
{
    psagg__config cfg;
    CHECK(psagg__config_load(write_ini(MINIMAL "worker_hosts = n1:1, n-2.example\n"), &cfg) == 0,
          "worker_hosts: %s", psagg_last_error());
    CHECK(!strcmp(cfg.worker_hosts, "n1:1 n-2.example:1"), "normalized '%s'", cfg.worker_hosts);
    EXPECT_ERROR(MINIMAL "worker_hosts = a:2 b\n", 5, "3 worker slots", "workers = 2");
    EXPECT_ERROR(MINIMAL "worker_hosts = a:0 b\n", 5, "worker_hosts", "'a:0'");
    EXPECT_ERROR(MINIMAL "worker_hosts = a:x\n", 5, "worker_hosts", "'a:x'");
    EXPECT_ERROR(MINIMAL "worker_hosts = a/b:2\n", 5, "worker_hosts", "'/'");
    CHECK(psagg__config_load(write_ini(MINIMAL), &cfg) == 0 && !cfg.worker_hosts[0] &&
              psagg__config_check_addresses(&cfg) == 0,
          "no worker_hosts, 127.0.0.1 resolves: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini("[cluster]\njob_id = j\nworkers = 2\nservers = 127.0.0.1:1 "
                                       "no-such-host.invalid:2\n"),
                             &cfg) == 0,
          "load: %s", psagg_last_error());
    CHECK(psagg__config_check_addresses(&cfg) == PSAGG_ECONFIG &&
              strstr(psagg_last_error(), ":4: [cluster] servers: server 1 'no-such-host.invalid' "
                                         "does not resolve"),
          "unresolvable server: '%s'", psagg_last_error());
}

static void test_shipped_local(void)
{
    psagg__config cfg;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/local.ini", conf_dir);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK, "%s: %s", path, psagg_last_error());
    CHECK(!strcmp(cfg.job_id, "local-demo"), "job_id '%s'", cfg.job_id);
    CHECK(cfg.n_servers == 2, "n_servers %d", cfg.n_servers);
    CHECK(!strcmp(cfg.servers[0].host, "127.0.0.1") && cfg.servers[0].port == 19500, "server 0");
    CHECK(!strcmp(cfg.servers[1].host, "127.0.0.1") && cfg.servers[1].port == 19501, "server 1");
    CHECK(cfg.n_workers == 4, "n_workers %d", cfg.n_workers);
    CHECK(!strcmp(cfg.provider, "tcp"), "provider '%s'", cfg.provider);
    CHECK(cfg.codec.id == PSAGG_CODEC_MAXMIN && cfg.codec.bits == 4, "codec %d/%u", cfg.codec.id,
          cfg.codec.bits);
    CHECK(!strcmp(cfg.path, path), "path '%s'", cfg.path);
}

static void test_shipped_cluster(void)
{
    psagg__config cfg;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/cluster.ini", conf_dir);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK, "%s: %s", path, psagg_last_error());
    CHECK(!strcmp(cfg.job_id, "resnet50-run1"), "job_id '%s'", cfg.job_id);
    CHECK(cfg.n_servers == 4, "n_servers %d (continuation line)", cfg.n_servers);
    CHECK(!strcmp(cfg.servers[3].host, "10.0.0.14") && cfg.servers[3].port == 19500, "server 3");
    CHECK(cfg.n_workers == 16, "n_workers %d", cfg.n_workers);
    CHECK(cfg.codec.id == PSAGG_CODEC_MAXMIN && cfg.codec.bits == 4 && cfg.codec.bucket == 1024 &&
              cfg.codec.rounding == PSAGG_ROUND_STOCHASTIC,
          "codec");
    CHECK(cfg.log_level == PSAGG_LOG_INFO, "level %d", cfg.log_level);
    CHECK(cfg.worker_fabric_node[0] == '\0', "fabric_node auto -> ''");
    CHECK(cfg.optimizer == PSAGG_OPTIM_NONE && cfg.lr == 0.001f && cfg.beta2 == 0.999f &&
              cfg.eps == 1e-8f && !cfg.resume && !cfg.checkpoint_dir[0],
          "optimizer keys as shipped");
}

static void test_defaults(void)
{
    psagg__config cfg;
    CHECK(psagg__config_load(write_ini(MINIMAL), &cfg) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(!strcmp(cfg.job_id, "j") && cfg.n_servers == 1 && cfg.n_workers == 2, "required");
    CHECK(!strcmp(cfg.provider, "tcp"), "provider");
    CHECK(cfg.connect_timeout_ms == 30000 && cfg.op_timeout_ms == 60000, "timeouts");
    CHECK(cfg.secret_file[0] == '\0', "secret_file");
    CHECK(cfg.server_threads == 0 && cfg.server_error_feedback == 0, "server");
    CHECK(cfg.gpu == PSAGG_GPU_AUTO && cfg.gpu_min_elems == 262144, "gpu");
    CHECK(cfg.server_fabric_node[0] == '\0' && cfg.worker_fabric_node[0] == '\0', "fabric");
    CHECK(cfg.chunk_bytes == 1048576 && cfg.seed == 1 && cfg.max_inflight == 64, "worker");
    CHECK(cfg.codec.id == PSAGG_CODEC_MAXMIN && cfg.codec.bits == 4 && cfg.codec.bucket == 1024 &&
              cfg.codec.rounding == PSAGG_ROUND_STOCHASTIC,
          "codec");
    CHECK(cfg.error_feedback == 1 && cfg.min_compress_elems == 1024, "codec ef/min");
    CHECK(cfg.log_level == PSAGG_LOG_INFO, "log");
}

static void test_all_keys(void)
{
    psagg__config cfg;
    char secret[PATH_MAX], text[PATH_MAX + 2048];
    snprintf(secret, sizeof secret, "%s", write_ini("a job's secret\n"));
    snprintf(text, sizeof text,
             "; comment\n# comment\n[cluster]\njob_id = a.b_c-1\n"
             "servers = h1:1, [::1]:2 ; inline\n  h3:3 ; continued\n\n  h4:65535\n"
             "workers = 1024\nprovider = verbs;ofi_rxm\nconnect_timeout_ms = 5\n"
             "op_timeout_ms = 86400000\nsecret_file = %s\ndata_auth = on\n"
             "[server]\nthreads = 3\nerror_feedback = TRUE\ngpu = off\n"
             "gpu_min_elems = 0\nfabric_node = node-7\nmemory_budget_mb = 123\n"
             "metrics_port = 9100\n"
             "[worker]\nchunk_bytes = 4096\nseed = 0xffffffffffffffff\n"
             "max_inflight = 1\nfabric_node = 10.1.0.1\n"
             "[codec]\ndefault = bf16\nbucket = 64\nrounding = nearest\n"
             "error_feedback = 0\nmin_compress_elems = 0\nadaptive = on\n"
             "adaptive_budget = 2.5 bits\nadaptive_interval = 2\n[log]\nlevel = debug\n"
             "stats_interval_ms = 250\ntimeline = /tmp/psagg trace\n",
             secret);
    CHECK(psagg__config_load(write_ini(text), &cfg) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(!strcmp(cfg.job_id, "a.b_c-1"), "job_id");
    CHECK(cfg.n_servers == 4, "n_servers %d", cfg.n_servers);
    CHECK(!strcmp(cfg.servers[1].host, "::1") && cfg.servers[1].port == 2, "v6");
    CHECK(!strcmp(cfg.servers[2].host, "h3") && cfg.servers[3].port == 65535, "continuation");
    CHECK(cfg.n_workers == 1024 && !strcmp(cfg.provider, "verbs;ofi_rxm"), "workers/provider");
    CHECK(cfg.connect_timeout_ms == 5 && cfg.op_timeout_ms == 86400000, "timeouts");
    CHECK(!strcmp(cfg.secret_file, secret) && cfg.data_auth == 1, "secret, data_auth");
    CHECK(cfg.server_memory_budget_mb == 123, "memory_budget_mb");
    CHECK(cfg.server_metrics_port == 9100, "metrics_port");
    CHECK(cfg.server_threads == 3 && cfg.server_error_feedback == 1 && cfg.gpu == PSAGG_GPU_OFF,
          "server");
    CHECK(cfg.gpu_min_elems == 0 && !strcmp(cfg.server_fabric_node, "node-7"), "server 2");
    CHECK(cfg.chunk_bytes == 4096 && cfg.seed == UINT64_MAX && cfg.max_inflight == 1, "worker");
    CHECK(!strcmp(cfg.worker_fabric_node, "10.1.0.1"), "worker fabric");
    CHECK(cfg.codec.id == PSAGG_CODEC_BF16 && cfg.codec.bucket == 64 &&
              cfg.codec.rounding == PSAGG_ROUND_NEAREST,
          "codec");
    CHECK(cfg.error_feedback == 0 && cfg.min_compress_elems == 0, "codec 2");
    CHECK(cfg.adaptive == 1 && cfg.adaptive_budget == 2500000 && cfg.adaptive_budget_bits == 1 &&
              cfg.adaptive_interval == 2,
          "adaptive");
    CHECK(cfg.log_level == PSAGG_LOG_DEBUG, "log");
    CHECK(cfg.stats_interval_ms == 250 && !strcmp(cfg.timeline, "/tmp/psagg trace"), "log 2");
}

/* The server-side optimizer's keys, and the combinations that are refused at their line. */
static void test_optimizer(void)
{
    psagg__config cfg;
    CHECK(psagg__config_load(write_ini(MINIMAL "[server]\noptimizer = SGD\nlr = 0.5\n"
                                               "weight_decay = 1e-4\nmomentum = 0.9\n"
                                               "dampening = 0\nnesterov = on\nbeta1 = 0.8\n"
                                               "beta2 = 0.99\neps = 1e-6\nsync_interval = 7\n"
                                               "checkpoint_dir = /tmp/ck\nresume = on\n"),
                             &cfg) == PSAGG_OK,
          "%s", psagg_last_error());
    CHECK(cfg.optimizer == PSAGG_OPTIM_SGD && cfg.lr == 0.5f && cfg.weight_decay == 1e-4f &&
              cfg.momentum == 0.9f && cfg.nesterov == 1 && cfg.beta1 == 0.8f &&
              cfg.beta2 == 0.99f && cfg.eps == 1e-6f && cfg.sync_interval == 7 &&
              !strcmp(cfg.checkpoint_dir, "/tmp/ck") && cfg.resume == 1,
          "optimizer keys");
    EXPECT_ERROR(MINIMAL "[server]\noptimizer = rmsprop\n", 6, "optimizer", "none|sgd|adam|adamw");
    EXPECT_ERROR(MINIMAL "[server]\nlr = -1\n", 6, "lr", "a number in 0..1e+06");
    EXPECT_ERROR(MINIMAL "[server]\nlr = 1e-3x\n", 6, "lr");
    EXPECT_ERROR(MINIMAL "[server]\nlr = nan\n", 6, "lr");
    EXPECT_ERROR(MINIMAL "[server]\nbeta1 = 1\n", 6, "beta1");
    EXPECT_ERROR(MINIMAL "[server]\neps = 0\n", 6, "eps");
    EXPECT_ERROR(MINIMAL "[server]\nmomentum = 1.5\n", 6, "momentum");
    EXPECT_ERROR(MINIMAL "[server]\noptimizer = sgd\nnesterov = on\n", 7, "nesterov",
                 "needs momentum > 0");
    EXPECT_ERROR(MINIMAL "[server]\nresume = on\n", 6, "resume", "needs [server] checkpoint_dir");
    EXPECT_ERROR(MINIMAL "[server]\noptimizer = adam\n[codec]\nadaptive = on\n", 8, "adaptive",
                 "does not work with [server] optimizer", "docs/features.md");
}

/* Elastic membership: min_workers <= workers <= max_workers, at file:line; defaults. */
static void test_elastic(void)
{
    psagg__config cfg;
    CHECK(psagg__config_load(write_ini(MINIMAL "elastic = on\n"), &cfg) == PSAGG_OK &&
              cfg.elastic == 1 && cfg.min_workers == 1 && cfg.max_workers == 2,
          "elastic defaults: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini(MINIMAL), &cfg) == PSAGG_OK && cfg.elastic == 0,
          "elastic is off by default: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini(MINIMAL "elastic = on\nmin_workers = 2\nmax_workers = 2\n"),
                             &cfg) == PSAGG_OK &&
              cfg.min_workers == 2,
          "elastic, min = max = workers: %s", psagg_last_error());
    EXPECT_ERROR(MINIMAL "elastic = on\nmin_workers = 0\n", 6, "min_workers", "1..1024");
    EXPECT_ERROR(MINIMAL "elastic = on\nmin_workers = 3\n", 6, "min_workers = 3",
                 "more than workers = 2");
    EXPECT_ERROR(MINIMAL "elastic = on\nmax_workers = 1\n", 6, "max_workers = 1",
                 "less than workers = 2");
    CHECK(psagg__config_load(write_ini(MINIMAL "elastic = on\nmax_workers = 3\n"), &cfg) ==
                  PSAGG_OK &&
              cfg.max_workers == 3 && cfg.n_workers == 2,
          "elastic, max_workers above workers (a rank that joins later): %s", psagg_last_error());
    /* [server] quorum: within workers; with elastic it works, with what the feature table
       refuses not (runtime/features.h: at the first key's line, both named, and why) */
    EXPECT_ERROR(MINIMAL "[server]\nquorum = 3\n", 6, "quorum = 3", "more than workers = 2");
    CHECK(psagg__config_load(write_ini(MINIMAL "elastic = on\n[server]\nquorum = 2\n"), &cfg) ==
                  PSAGG_OK &&
              cfg.elastic && cfg.quorum == 2,
          "quorum with elastic: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini(MINIMAL "[server]\nquorum = 2\ncheckpoint_dir = /tmp\n"),
                             &cfg) == PSAGG_OK &&
              cfg.quorum == 2,
          "quorum with checkpoints (a collective checkpoint): %s", psagg_last_error());
    EXPECT_ERROR(MINIMAL "[server]\nquorum = 2\n[codec]\nadaptive = on\n", 6, "[server] quorum",
                 "does not work with [codec] adaptive = on yet", "statistics");
    for (size_t i = 0; i < psagg__n_combos; i++) { /* every refusal of the table has its why */
        const psagg__combo *c = &psagg__combos[i];
        CHECK(c->why && c->why[0] && c->a != c->b && psagg__combo_of(c->b, c->a) == c,
              "feature table row %zu", i);
    }
    EXPECT_ERROR(MINIMAL "elastic = maybe\n", 5, "elastic");
}

/* [cluster] server_replicas: fewer than the servers, without a server residual, and what the
   feature table refuses at its line naming both */
static void test_replicas(void)
{
    psagg__config cfg;
    CHECK(psagg__config_load(write_ini(MINIMAL), &cfg) == PSAGG_OK && cfg.server_replicas == 0,
          "server_replicas is 0 by default: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n"), &cfg) == PSAGG_OK &&
              cfg.server_replicas == 1,
          "server_replicas = 1 with 2 servers: %s", psagg_last_error());
    EXPECT_ERROR(TWO_SERVERS "server_replicas = 2\n", 5, "server_replicas = 2",
                 "more than 2 servers");
    EXPECT_ERROR(MINIMAL "server_replicas = 1\n", 5, "server_replicas = 1", "more than 1 servers");
    EXPECT_ERROR(TWO_SERVERS "server_replicas = -1\n", 5, "server_replicas");
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\n"
                                                   "error_feedback = on\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [server] error_feedback (copies of every chunk): %s",
          psagg_last_error());
    /* elastic workers with replicas: summed gradients, a server optimizer, a residual, a quorum
       (copies that follow their owner) */
    {
        static const char *const with[] = {"", "[server]\noptimizer = sgd\n",
                                           "[server]\nerror_feedback = on\n",
                                           "[server]\nquorum = 1\n"};
        for (size_t i = 0; i < sizeof with / sizeof with[0]; i++) {
            char text[256];
            snprintf(text, sizeof text, TWO_SERVERS "server_replicas = 1\nelastic = on\n%s",
                     with[i]);
            CHECK(psagg__config_load(write_ini(text), &cfg) == PSAGG_OK,
                  "server_replicas with elastic and '%s': %s", with[i], psagg_last_error());
        }
    }
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\noptimizer = "
                                                   "sgd\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [server] optimizer (copies of parameter chunks): %s",
          psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[codec]\nadaptive = on\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [codec] adaptive (the statistics are a sum tensor): %s",
          psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\noptimizer = "
                                                   "sgd\ncheckpoint_dir = /tmp\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [server] checkpoint_dir (each owner writes its chunks): %s",
          psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\nquorum = 1\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [server] quorum (a relayed round's update): %s",
          psagg_last_error());
    /* (a chunk's copies step each round with its owner's contributors: wire.h's trailer) */
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\nquorum = 1\n"
                                                   "optimizer = sgd\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [server] quorum and optimizer: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\nquorum = 1\n"
                                                   "error_feedback = on\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with [server] quorum and error_feedback: %s", psagg_last_error());
    /* a chunk's update, and with copies its state, must fit in one control frame (64 MiB) */
    EXPECT_ERROR(TWO_SERVERS "server_replicas = 1\n[worker]\nchunk_bytes = 67108864\n", 7,
                 "[worker] chunk_bytes = 67108864", "server_replicas (", ":5)", "at most 67096576");
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[worker]\n"
                                                   "chunk_bytes = 67096576\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas with the largest chunk_bytes it allows: %s", psagg_last_error());
    EXPECT_ERROR(TWO_SERVERS "server_replicas = 1\n[server]\noptimizer = adam\n[worker]\n"
                             "chunk_bytes = 16777216\n",
                 9, "chunk_bytes = 16777216", "weights and optimizer state", "at most 13418496");
    /* plain sgd keeps the weights and their view only */
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\noptimizer = "
                                                   "sgd\n[worker]\nchunk_bytes = 16777216\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas and plain sgd with chunk_bytes = 16 MiB: %s", psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "server_replicas = 1\n[server]\noptimizer = "
                                                   "adam\n[worker]\nchunk_bytes = 13418496\n"),
                             &cfg) == PSAGG_OK,
          "server_replicas and adam with the largest chunk_bytes they allow: %s",
          psagg_last_error());
    CHECK(psagg__config_load(write_ini(TWO_SERVERS "[worker]\nchunk_bytes = 1073741824\n"), &cfg) ==
              PSAGG_OK,
          "chunk_bytes = 2^30 without replicas: %s", psagg_last_error());
}

/* data_auth = auto (the default): on with a secret_file, off without; on and off as said. */
static void test_data_auth_default(void)
{
    char text[PATH_MAX + 128], secret[PATH_MAX];
    psagg__config cfg;
    snprintf(secret, sizeof secret, "%s", write_ini("a secret\n"));
    CHECK(psagg__config_load(write_ini(MINIMAL), &cfg) == PSAGG_OK && cfg.data_auth == 0,
          "no secret: data_auth %d", cfg.data_auth);
    snprintf(text, sizeof text, MINIMAL "secret_file = %s\n", secret);
    CHECK(psagg__config_load(write_ini(text), &cfg) == PSAGG_OK && cfg.data_auth == 1,
          "a secret and data_auth by default: %d", cfg.data_auth);
    snprintf(text, sizeof text, MINIMAL "secret_file = %s\ndata_auth = auto\n", secret);
    CHECK(psagg__config_load(write_ini(text), &cfg) == PSAGG_OK && cfg.data_auth == 1,
          "a secret and data_auth = auto: %d", cfg.data_auth);
    snprintf(text, sizeof text, MINIMAL "secret_file = %s\ndata_auth = off\n", secret);
    CHECK(psagg__config_load(write_ini(text), &cfg) == PSAGG_OK && cfg.data_auth == 0,
          "a secret and data_auth = off: %d", cfg.data_auth);
    CHECK(psagg__config_load(write_ini(MINIMAL "data_auth = auto\n"), &cfg) == PSAGG_OK &&
              cfg.data_auth == 0,
          "no secret and data_auth = auto: %d", cfg.data_auth);
}

/* A secret_file that cannot be used is a start-up error at its line, not a refused HELLO. */
static void test_secret_errors(void)
{
    char text[PATH_MAX + 128], empty[PATH_MAX];
    snprintf(empty, sizeof empty, "%s", write_ini(""));
    EXPECT_ERROR(MINIMAL "op_timeout_ms = 500\nsecret_file = /nonexistent/psagg.secret\n", 6,
                 "secret_file", "/nonexistent/psagg.secret", "cannot be read",
                 "No such file or directory");
    snprintf(text, sizeof text, MINIMAL "secret_file = %s\n", empty);
    EXPECT_ERROR(text, 5, "secret_file", "is empty");
    EXPECT_ERROR(MINIMAL "data_auth = on\n", 5, "data_auth", "needs [cluster] secret_file");
    /* a FIFO or a device would hold start-up (or never end): only regular files */
    EXPECT_ERROR(MINIMAL "secret_file = /dev/zero\n", 5, "secret_file", "not a regular file");
    EXPECT_ERROR(MINIMAL "secret_file = /tmp\n", 5, "secret_file", "/tmp", "not a regular file");
    EXPECT_ERROR(MINIMAL "[server]\nmemory_budget_mb = 2000000000\n", 6, "memory_budget_mb");
    EXPECT_ERROR(MINIMAL "[server]\nmetrics_port = 65536\n", 6, "metrics_port");
}

static void test_errors(void)
{
    /* unknown key / section */
    EXPECT_ERROR(MINIMAL "[worker]\nseed = 2\nbogus = 1\n", 7, "unknown key 'bogus' in [worker]");
    EXPECT_ERROR(MINIMAL "\n[nosuch]\n", 6, "unknown section [nosuch]");
    EXPECT_ERROR(MINIMAL "[nosuch]\nx = 1\n", 5, "unknown section [nosuch]");
    EXPECT_ERROR("job_id = x\n" MINIMAL, 1, "'job_id' outside any section");
    /* control characters in a value (a tab, an escape, DEL), at file:line */
    EXPECT_ERROR(MINIMAL "[server]\ncheckpoint_dir = /tmp/a\tb\n", 6, "[server] checkpoint_dir",
                 "control character (U+0009) at byte 6");
    EXPECT_ERROR("[cluster]\njob_id = j\x1b\nservers = 127.0.0.1:1\nworkers = 2\n", 2,
                 "[cluster] job_id", "control character (U+001B)");
    EXPECT_ERROR(MINIMAL "[log]\ntimeline = /tmp/t\x7f\n", 6, "control character (U+007F)");
    /* and the line breaks of Unicode, which Python's str.splitlines honours: NEL (U+0085, any
       C1 control), LINE and PARAGRAPH SEPARATOR (U+2028, U+2029), in UTF-8 */
    EXPECT_ERROR(MINIMAL "[server]\ncheckpoint_dir = /tmp/a\xc2\x85"
                         "b\n",
                 6, "[server] checkpoint_dir", "control character (U+0085) at byte 6");
    EXPECT_ERROR(MINIMAL "[log]\ntimeline = /t\xe2\x80\xa8"
                         "x\n",
                 6, "control character (U+2028)");
    EXPECT_ERROR(MINIMAL "[log]\ntimeline = /t\xe2\x80\xa9"
                         "x\n",
                 6, "control character (U+2029)");
    /* bad values, with the expectation */
    EXPECT_ERROR(MINIMAL "[worker]\n; c\nseed = abc\n", 7, "seed", "'abc'", "expected");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkers = 0\n", 4, "workers",
                 "1..1024");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkers = 1025\n", 4, "workers",
                 "1..1024");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkers = -1\n", 4, "workers");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkers = 2x\n", 4, "workers");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = 127.0.0.1\nworkers = 2\n", 3, "servers",
                 "host:port");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = a:1 b:0\nworkers = 2\n", 3, "servers",
                 "1..65535");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = a:1 b:65536\nworkers = 2\n", 3, "servers");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = a:1 a:1\nworkers = 2\n", 3, "listed twice");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = a:1\n  b:x\nworkers = 2\n", 4, "servers", "b:x");
    EXPECT_ERROR("[cluster]\njob_id = j\nservers = 300.1.1.1:5\nworkers = 2\n", 3, "servers");
    EXPECT_ERROR("[cluster]\njob_id = has space\nservers = a:1\nworkers = 2\n", 2, "job_id");
    EXPECT_ERROR(MINIMAL "[codec]\ndefault = maxmin9\n", 6, "default", "maxmin9", "codec");
    EXPECT_ERROR(MINIMAL "[codec]\ndefault = zstd\n", 6, "default", "zstd");
    EXPECT_ERROR(MINIMAL "[codec]\ndefault = maxmin4/512\n", 6, "default", "separate keys");
    /* thc: its block is [codec] bucket, a power of two; it rounds stochastically */
    EXPECT_ERROR(MINIMAL "[codec]\ndefault = thc2\nbucket = 192\n", 7, "thc2", "block 192",
                 "power of two");
    EXPECT_ERROR(MINIMAL "[codec]\ndefault = thc4\nrounding = nearest\n", 7, "thc4",
                 "rounding must be stochastic");
    EXPECT_ERROR(MINIMAL "[codec]\ndefault = thc3\n", 6, "default", "thc3");
    {
        psagg__config cfg;
        CHECK(!psagg__config_load(write_ini(MINIMAL "[codec]\ndefault = thc2\nbucket = 4096\n"),
                                  &cfg) &&
                  cfg.codec.id == PSAGG_CODEC_THC && cfg.codec.bits == 2 &&
                  cfg.codec.bucket == 4096,
              "thc2/4096: %s", psagg_last_error());
    }
    EXPECT_ERROR(MINIMAL "[codec]\nbucket = 100\n", 6, "bucket", "multiple of 64");
    EXPECT_ERROR(MINIMAL "[codec]\nbucket = 0\n", 6, "bucket");
    EXPECT_ERROR(MINIMAL "[codec]\nadaptive_budget = 0.01\n", 6, "adaptive_budget", "0.05..4");
    EXPECT_ERROR(MINIMAL "[codec]\nadaptive_budget = 1 byte\n", 6, "adaptive_budget", "3bits");
    EXPECT_ERROR(MINIMAL "[codec]\nadaptive_budget = 64bits\n", 6, "adaptive_budget", "1.5..32");
    EXPECT_ERROR(MINIMAL "[codec]\nadaptive_interval = 1\n", 6, "adaptive_interval");
    EXPECT_ERROR(MINIMAL "[codec]\nbucket = 2097152\n", 6, "bucket", "64..1048576");
    EXPECT_ERROR(MINIMAL "[codec]\nrounding = up\n", 6, "rounding", "stochastic|nearest");
    EXPECT_ERROR(MINIMAL "[codec]\nerror_feedback = maybe\n", 6, "error_feedback", "on");
    EXPECT_ERROR(MINIMAL "[server]\ngpu = yes\n", 6, "gpu", "auto");
    EXPECT_ERROR(MINIMAL "[worker]\nchunk_bytes = 5000\n", 6, "chunk_bytes", "multiple of 256");
    EXPECT_ERROR(MINIMAL "[worker]\nseed = 18446744073709551616\n", 6, "seed");
    EXPECT_ERROR(MINIMAL "[log]\nlevel = loud\n", 6, "level", "error|warn|info|debug");
    EXPECT_ERROR(MINIMAL "[log]\nstats_interval_ms = -1\n", 6, "stats_interval_ms");
    EXPECT_ERROR(MINIMAL "[worker]\nmax_inflight = 1\n  2\n", 7, "only servers may span");
    /* duplicates, also across repeated sections */
    EXPECT_ERROR(MINIMAL "provider = shm\n\nprovider = tcp\n", 7, "duplicate key 'provider'",
                 "[cluster]", "line 5");
    EXPECT_ERROR(MINIMAL "[codec]\nbucket = 64\n[cluster]\n[codec]\nbucket = 128\n", 9,
                 "duplicate key 'bucket'", "line 6");
    /* syntax, line length */
    EXPECT_ERROR(MINIMAL "[worker]\nseed\n", 6, "syntax error");
    {
        char text[600];
        snprintf(text, sizeof text, MINIMAL "[cluster]\n; %0250d\n", 0);
        EXPECT_ERROR(text, 6, "line too long");
    }
    /* first error wins */
    EXPECT_ERROR(MINIMAL "[worker]\nseed = x\nbogus = 1\n", 6, "seed");
}

static void test_missing(void)
{
    psagg__config cfg;
    const char *path;
    const char *cases[][2] = {
        {"[cluster]\nservers = a:1\nworkers = 2\n", "job_id"},
        {"[cluster]\njob_id = j\nworkers = 2\n", "servers"},
        {"[cluster]\njob_id = j\nservers = a:1\n", "workers"},
        {"", "job_id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        path = write_ini(cases[i][0]);
        CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG, "case %zu", i);
        CHECK(strstr(psagg_last_error(), path) == psagg_last_error(), "'%s' lacks path",
              psagg_last_error());
        CHECK(strstr(psagg_last_error(), "missing required key") &&
                  strstr(psagg_last_error(), cases[i][1]),
              "'%s' lacks key %s", psagg_last_error(), cases[i][1]);
    }

    char nofile[PATH_MAX + 16];
    snprintf(nofile, sizeof nofile, "%s/does-not-exist.ini", tmpdir);
    CHECK(psagg__config_load(nofile, &cfg) == PSAGG_ECONFIG, "missing file");
    CHECK(strstr(psagg_last_error(), nofile) && strstr(psagg_last_error(), "No such file"), "'%s'",
          psagg_last_error());
    /* a directory opens but cannot be read */
    CHECK(psagg__config_load(tmpdir, &cfg) == PSAGG_ECONFIG, "directory");
    CHECK(strstr(psagg_last_error(), tmpdir), "'%s'", psagg_last_error());
}

static void test_env(void)
{
    psagg__config cfg;
    char path[PATH_MAX]; /* write_ini() reuses its buffer */
    snprintf(path, sizeof path, "%s", write_ini(MINIMAL "provider = tcp\n[worker]\nseed = 5\n"));

    /* overrides win over the file, and can supply required keys */
    setenv("PSAGG_CLUSTER_PROVIDER", "shm", 1);
    setenv("PSAGG_WORKER_SEED", "3", 1);
    setenv("PSAGG_CODEC_DEFAULT", "fp32", 1);
    setenv("PSAGG_CLUSTER_SERVERS", "h:1 h:2 h:3", 1);
    setenv("PSAGG_CLUSTER_CONNECT_TIMEOUT_MS", "7", 1);
    setenv("PSAGG_WORKER_FABRIC_NODE", "n1", 1);
    /* launcher / logger / kernel variables are not config keys and not errors */
    setenv("PSAGG_RANK", "1", 1);
    setenv("PSAGG_WORLD_SIZE", "4", 1);
    setenv("PSAGG_SERVER_RANK", "0", 1);
    setenv("PSAGG_LOG_LEVEL", "whatever", 1);
    setenv("PSAGG_CODEC_ISA", "avx2", 1);
    setenv("PSAGG_SERVER_BIN", "/bin/true", 1);
    setenv("PSAGG_SOMETHING_ELSE", "x", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(!strcmp(cfg.provider, "shm"), "provider '%s'", cfg.provider);
    CHECK(cfg.seed == 3, "seed %llu", (unsigned long long)cfg.seed);
    CHECK(cfg.codec.id == PSAGG_CODEC_FP32, "codec");
    CHECK(cfg.n_servers == 3 && cfg.servers[2].port == 3, "servers replaced, n=%d", cfg.n_servers);
    CHECK(cfg.connect_timeout_ms == 7, "timeout");
    CHECK(!strcmp(cfg.worker_fabric_node, "n1"), "fabric");
    CHECK(cfg.log_level == PSAGG_LOG_INFO, "PSAGG_LOG_LEVEL must not touch the config");

    /* PSAGG_TIMELINE is the short name of PSAGG_LOG_TIMELINE, which wins */
    setenv("PSAGG_TIMELINE", "/tmp/short", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK && !strcmp(cfg.timeline, "/tmp/short"),
          "PSAGG_TIMELINE: '%s'", cfg.timeline);
    setenv("PSAGG_LOG_TIMELINE", "/tmp/long", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK && !strcmp(cfg.timeline, "/tmp/long"),
          "PSAGG_LOG_TIMELINE: '%s'", cfg.timeline);
    unsetenv("PSAGG_TIMELINE");
    unsetenv("PSAGG_LOG_TIMELINE");

    setenv("PSAGG_CLUSTER_JOB_ID", "from-env", 1);
    setenv("PSAGG_CLUSTER_WORKERS", "8", 1);
    CHECK(psagg__config_load(write_ini("[codec]\nbucket = 128\n"), &cfg) == PSAGG_OK, "%s",
          psagg_last_error());
    CHECK(!strcmp(cfg.job_id, "from-env") && cfg.n_workers == 8 && cfg.n_servers == 3,
          "required from env");
    CHECK(cfg.codec.bucket == 128, "bucket kept with env codec");
    unsetenv("PSAGG_CLUSTER_JOB_ID");
    unsetenv("PSAGG_CLUSTER_WORKERS");

    /* bad values */
    setenv("PSAGG_WORKER_SEED", "three", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG, "bad env");
    CHECK(strstr(psagg_last_error(), "env PSAGG_WORKER_SEED: ") == psagg_last_error() &&
              strstr(psagg_last_error(), "three"),
          "'%s'", psagg_last_error());
    setenv("PSAGG_WORKER_SEED", "3", 1);
    setenv("PSAGG_CODEC_BUCKET", "65", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG, "bad env bucket");
    CHECK(strstr(psagg_last_error(), "env PSAGG_CODEC_BUCKET: ") == psagg_last_error(), "'%s'",
          psagg_last_error());
    unsetenv("PSAGG_CODEC_BUCKET");

    /* control characters: never in a value (a newline in a path would print an extra line in
       --check-config, which the launchers parse) */
    setenv("PSAGG_SERVER_CHECKPOINT_DIR", "/tmp/x\ncluster.workers = 99", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG &&
              strstr(psagg_last_error(), "env PSAGG_SERVER_CHECKPOINT_DIR: ") ==
                  psagg_last_error() &&
              strstr(psagg_last_error(), "control character (U+000A) at byte 6"),
          "a newline in an env value: '%s'", psagg_last_error());
    /* the attack run's: a NEL, then a config line for psagg-ssh's plan */
    setenv("PSAGG_SERVER_CHECKPOINT_DIR",
           "/tmp/x\xc2\x85"
           "cluster.workers = 99",
           1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG &&
              strstr(psagg_last_error(), "control character (U+0085) at byte 6"),
          "a NEL in an env value: '%s'", psagg_last_error());
    setenv("PSAGG_SERVER_CHECKPOINT_DIR",
           "/tmp/x\xe2\x80\xa8"
           "cluster.workers = 99",
           1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG &&
              strstr(psagg_last_error(), "control character (U+2028) at byte 6"),
          "a LINE SEPARATOR in an env value: '%s'", psagg_last_error());
    setenv("PSAGG_SERVER_CHECKPOINT_DIR", "/tmp/caf\xc3\xa9", 1); /* other UTF-8 is fine */
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK, "an e-acute in an env value: '%s'",
          psagg_last_error());
    unsetenv("PSAGG_SERVER_CHECKPOINT_DIR");
    setenv("PSAGG_TIMELINE", "/tmp/t\x1b[2J", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG &&
              strstr(psagg_last_error(), "env PSAGG_TIMELINE: ") &&
              strstr(psagg_last_error(), "control character (U+001B)"),
          "an escape in PSAGG_TIMELINE: '%s'", psagg_last_error());
    unsetenv("PSAGG_TIMELINE");

    /* unknown key in a known section */
    setenv("PSAGG_CLUSTER_BOGUS", "1", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_ECONFIG, "unknown env");
    CHECK(strstr(psagg_last_error(), "env PSAGG_CLUSTER_BOGUS"), "'%s'", psagg_last_error());
    unsetenv("PSAGG_CLUSTER_BOGUS");

    /* env-only codec parts: bucket and rounding from env, codec from the file */
    setenv("PSAGG_CODEC_ROUNDING", "nearest", 1);
    setenv("PSAGG_CODEC_DEFAULT", "maxmin2", 1);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(cfg.codec.id == PSAGG_CODEC_MAXMIN && cfg.codec.bits == 2 &&
              cfg.codec.rounding == PSAGG_ROUND_NEAREST && cfg.codec.bucket == 1024,
          "codec from env");

    const char *vars[] = {"PSAGG_CLUSTER_PROVIDER",
                          "PSAGG_WORKER_SEED",
                          "PSAGG_CODEC_DEFAULT",
                          "PSAGG_CLUSTER_SERVERS",
                          "PSAGG_CLUSTER_CONNECT_TIMEOUT_MS",
                          "PSAGG_WORKER_FABRIC_NODE",
                          "PSAGG_RANK",
                          "PSAGG_WORLD_SIZE",
                          "PSAGG_SERVER_RANK",
                          "PSAGG_LOG_LEVEL",
                          "PSAGG_CODEC_ISA",
                          "PSAGG_SERVER_BIN",
                          "PSAGG_SOMETHING_ELSE",
                          "PSAGG_CODEC_ROUNDING"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    CHECK(psagg__config_load(path, &cfg) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(cfg.seed == 5 && !strcmp(cfg.provider, "tcp"), "file values back");
}

static void test_hostport(void)
{
    psagg__hostport hp;
    CHECK(psagg__parse_hostport("example.org:80", &hp) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(!strcmp(hp.host, "example.org") && hp.port == 80, "name");
    CHECK(psagg__parse_hostport("[fe80::1]:65535", &hp) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(!strcmp(hp.host, "fe80::1") && hp.port == 65535, "v6");
    CHECK(psagg__parse_hostport("10.0.0.1:1", &hp) == PSAGG_OK && hp.port == 1, "v4");
    const char *bad[] = {"",           "host",        ":80",      "host:",   "host:0",   "host:-1",
                         "host:65536", "host:8x",     "::1:80",   "[::1]80", "[zz]:80",  "[]:80",
                         "a b:80",     "1.2.3.999:8", "host:080", "h:+80",   "host: 80", "[::1:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(psagg__parse_hostport(bad[i], &hp) == PSAGG_EINVAL, "'%s' accepted", bad[i]);
        CHECK(psagg_last_error()[0], "no message for '%s'", bad[i]);
    }
    char longhost[PSAGG_HOST_MAX + 8];
    memset(longhost, 'a', PSAGG_HOST_MAX);
    snprintf(longhost + PSAGG_HOST_MAX, 8, ":1");
    CHECK(psagg__parse_hostport(longhost, &hp) == PSAGG_EINVAL, "long host");
}

/* The caller's PSAGG_* overrides would change every expectation here: drop them. */
static void clear_psagg_env(void)
{
    extern char **environ;
    char name[256];
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; e && *e; e++) {
            const char *eq = strchr(*e, '=');
            size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
            if (!strncmp(*e, "PSAGG_", 6) && strncmp(*e, "PSAGG_TEST_DATA=", 16) &&
                len < sizeof name) {
                memcpy(name, *e, len);
                name[len] = '\0';
                unsetenv(name);
                again = 1;
                break;
            }
        }
    }
}

int main(void)
{
    const char *data = getenv("PSAGG_TEST_DATA");
    const char *tmp = getenv("TMPDIR");

    if (data)
        snprintf(conf_dir, sizeof conf_dir, "%s/../../conf", data);
    else
        snprintf(conf_dir, sizeof conf_dir, "conf"); /* run from the source root */
    snprintf(tmpdir, sizeof tmpdir, "%s/psagg-test-config-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(tmpdir), "mkdtemp %s", tmpdir);
    atexit(remove_tmpdir);
    clear_psagg_env();

    test_shipped_local();
    test_shipped_cluster();
    test_defaults();
    test_all_keys();
    test_errors();
    test_secret_errors();
    test_data_auth_default();
    test_elastic();
    test_replicas();
    test_missing();
    test_env();
    test_hostport();
    test_worker_hosts();
    test_optimizer();
    printf("test_config: ok\n");
    return 0;
}
