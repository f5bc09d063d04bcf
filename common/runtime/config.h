/*
 * runtime/config.h - psagg's INI configuration (read with inih), shared by servers and workers.
 * Layer: runtime.
 *
 * Sources, later ones win: built-in defaults, the INI file, then environment variables
 * PSAGG_<SECTION>_<KEY> (upper case, e.g. PSAGG_CLUSTER_PROVIDER=shm). Unknown sections or
 * keys, bad values and missing required keys are PSAGG_ECONFIG with "file:line: ..." (or
 * "env PSAGG_X: ...") in psagg_last_error(). Every key is documented in conf/cluster.ini.
 */
#ifndef PSAGG_RUNTIME_CONFIG_H
#define PSAGG_RUNTIME_CONFIG_H

#include <stdio.h>
#include <stdint.h>

#include "base/error.h"
#include "psagg/types.h"

#define PSAGG_MAX_SERVERS 256
#define PSAGG_MAX_WORKERS 1024
#define PSAGG_HOST_MAX    64

typedef struct psagg__hostport {
    char host[PSAGG_HOST_MAX]; /* IPv4/IPv6 literal or name */
    uint16_t port;
} psagg__hostport;

typedef enum psagg__gpu_mode {
    PSAGG_GPU_OFF = 0,
    PSAGG_GPU_ON = 1,
    PSAGG_GPU_AUTO = 2
} psagg__gpu_mode;

/* The most bytes a [cluster] secret_file may hold (it must be a regular file). */
#define PSAGG_SECRET_MAX (1 << 20)

#define PSAGG_DATA_AUTH_AUTO 2 /* [cluster] data_auth = auto (only while the config loads) */

/* [server] lr and weight_decay, psagg_set_lr's and every parameter push's: 0..this */
#define PSAGG_LR_MAX 1e6f
/* psagg_set_param_sync's weight: (0, this] */
#define PSAGG_PARAM_WEIGHT_MAX 1e9f

typedef struct psagg__config {
    char path[256];

    /* [cluster] */
    char job_id[64]; /* required; every process of a job must agree */
    int n_servers;   /* from `servers`, required: "host:port host:port ..." */
    psagg__hostport servers[PSAGG_MAX_SERVERS];
    int n_workers;          /* `workers`, required, 1..PSAGG_MAX_WORKERS */
    char provider[32];      /* `provider`: tcp (default) | shm | any libfabric provider */
    int local_copy;         /* `local_copy`, default on: large messages between processes on one
                               host are copied out of the sender (transport.h), not sent */
    int connect_timeout_ms; /* `connect_timeout_ms`, default 30000: start-up deadline */
    int op_timeout_ms; /* `op_timeout_ms`, default 60000: liveness and deadlines (runtime/channel.h)
                        */
    char secret_file[256];   /* `secret_file`, optional: the job's shared secret (HELLO token,
                                data keys); must be readable and not empty */
    int data_auth;           /* `data_auth`, default auto: a MAC on every data message (needs
                                secret_file); auto is on with a secret_file, off without, and
                                is resolved by psagg__config_load (0 or 1 afterwards) */
    char worker_hosts[1024]; /* `worker_hosts`, optional: "host:slots host ..." where cluster
                                launchers start the workers (slots default 1; they sum to
                                `workers`); the processes themselves do not use it */
    int elastic;         /* `elastic`, default off: a worker that dies leaves the job, which goes on
                            with the others (server/membership.c); off: any death ends the job */
    int min_workers;     /* `min_workers`, default 1 (elastic): fewer live workers end the job */
    int max_workers;     /* `max_workers`, default 0 = `workers` (elastic): the job's ranks are
                            0..max_workers-1, of which 0..workers-1 start it and the others may
                            join it while it runs; the loaded config holds the number */
    int server_replicas; /* `server_replicas`, default 0: a dead server ends the job; R >= 1:
                            every chunk's state is kept on R + 1 servers and the job goes on
                            without a dead one (docs/design.md, "Servers that fail and join") */
    char servers_where[300]; /* where `servers` was set ("path:line" or "env PSAGG_..."), for
                                messages about the addresses */

    /* [server] */
    int server_threads;        /* `threads`, default 0 = one per online core */
    int server_error_feedback; /* `error_feedback`, default off: residual on the requantized sum */
    psagg__gpu_mode gpu;       /* `gpu` = auto|on|off, default auto */
    uint64_t gpu_min_elems;    /* `gpu_min_elems`, default 262144 */
    char server_fabric_node[PSAGG_HOST_MAX]; /* `fabric_node`, default: the host in `servers` */
    uint64_t server_memory_budget_mb;        /* `memory_budget_mb`, default 0 = half the host's
                                                memory: a declaration needing more is refused */
    int server_metrics_port; /* `metrics_port`, default 0 = off: server rank r serves Prometheus
                                text on metrics_port + r (server/metrics.c) */
    /* straggler tolerance (server/aggregate.c): a round closes once `quorum` live workers
       pushed and grace_ms passed, without the rest; a left-out push is carried by its worker */
    int quorum;   /* `quorum`, default 0 = off: every live worker's push, every round */
    int grace_ms; /* `grace_ms`, default 10: how long a round waits after its quorum */
    /* the server-side optimizer (kernels/optim.h), for tensors declared as parameters */
    int optimizer;      /* `optimizer` = none|sgd|adam|adamw (psagg__optim_kind), default none */
    float lr;           /* `lr`, default 0.001: the workers' learning rate until they set one */
    float weight_decay; /* `weight_decay`, default 0: likewise */
    float momentum;     /* `momentum`, default 0 (sgd) */
    float dampening;    /* `dampening`, default 0 (sgd) */
    int nesterov;       /* `nesterov`, default off (sgd; needs momentum) */
    float beta1, beta2; /* `beta1`, `beta2`, default 0.9, 0.999 (adam, adamw) */
    float eps;          /* `eps`, default 1e-8 (adam, adamw) */
    uint64_t sync_interval;   /* `sync_interval`, default 0 = never: every sync_interval steps a
                                 parameter's update is its exact fp32 weights */
    char checkpoint_dir[256]; /* `checkpoint_dir`, optional: where checkpoints are written */
    int resume;               /* `resume`, default off: start from checkpoint_dir's checkpoint */

    /* [worker] */
    uint64_t chunk_bytes; /* `chunk_bytes`, default 1048576 (fp32 bytes per chunk) */
    uint64_t seed;        /* `seed`, default 1: stochastic rounding seed */
    int max_inflight;     /* `max_inflight`, default 64: chunks in flight per server */
    char worker_fabric_node[PSAGG_HOST_MAX]; /* `fabric_node`, default: auto */

    /* [codec] */
    psagg_codec codec;           /* `default` codec (default maxmin4), with `bucket`, `rounding` */
    int error_feedback;          /* `error_feedback`, default on (worker residual) */
    float error_feedback_beta;   /* `error_feedback_beta`, default 1: the residual's decay */
    uint64_t min_compress_elems; /* `min_compress_elems`, default 1024: smaller tensors go fp32 */
    int adaptive;                /* `adaptive`, default off: per-tensor codecs chosen every
                                    adaptive_interval rounds under adaptive_budget
                                    (runtime/adaptive.h) */
    uint32_t adaptive_budget;    /* `adaptive_budget` x 10^6, default 1.0: a fraction of the
                                    uniform `default` codec's bytes, or ... */
    int adaptive_budget_bits;    /* ... average bits per element when written "<x>bits" */
    int adaptive_interval;       /* `adaptive_interval`, default 100 rounds (>= 2) */

    /* [log] */
    int log_level;         /* `level` = error|warn|info|debug, default info */
    int stats_interval_ms; /* `stats_interval_ms`, default 0 = off: a worker's stats line */
    char timeline[256];    /* `timeline`, optional (also PSAGG_TIMELINE): the path prefix of
                              the Chrome traces, PREFIX.<role><rank>.json (base/timeline.h) */
    char mac_trace[256];   /* `mac_trace`, optional (tests): the path prefix of the lists of
                              data messages sealed, PREFIX.<role><rank>.<pid> (node.h) */
} psagg__config;

/* Fill defaults, read `path`, apply environment overrides, check required keys. */
PSAGG_NODISCARD psagg_status psagg__config_load(const char *path, psagg__config *cfg);

/*
 * Print every key as "section.key = value", resolved (defaults, file, environment), one per
 * line in the order of conf/cluster.ini: what psagg-server --check-config shows, and what
 * scripts read instead of parsing INI themselves.
 */
void psagg__config_print(const psagg__config *cfg, FILE *to);

/*
 * Check that every server address resolves here (getaddrinfo); the error names the server,
 * its address and where `servers` was set. psagg-server --check-config runs it.
 */
PSAGG_NODISCARD psagg_status psagg__config_check_addresses(const psagg__config *cfg);

/* Parse "host:port" ("[v6]:port" for IPv6). */
psagg_status psagg__parse_hostport(const char *text, psagg__hostport *out);

#endif
