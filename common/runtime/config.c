/*
 * runtime/config.c - psagg_config_load(): defaults, then the INI file (inih), then
 * PSAGG_<SECTION>_<KEY> environment overrides, then the required-key check. See config.h for the
 * contract.
 *
 * Every key is one row of `keys[]` (section, name, field offset, parser, limits); the file
 * handler and the environment pass look a key up there and run its parser, so adding a key
 * is adding a row. Parsers only say what they expected ("an integer 1..1024"); the caller
 * prefixes where the value came from ("conf/x.ini:12: " or "env PSAGG_X: ").
 *
 * Debian's inih does not pass line numbers to the handler, so the file is read through
 * ini_parse_stream() with our own line reader, which counts lines, rejects over-long lines
 * (inih would silently split them) and validates section headers (inih reports only keys,
 * so an empty unknown section would otherwise go unnoticed).
 */
#include "runtime/config.h"

#include "base/error.h"
#include "base/log.h"
#include "kernels/codec.h"
#include "kernels/optim.h"
#include "runtime/adaptive.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

/* ---- key table ---- */

struct key;
/* Parse `val` into the key's field; on failure write what was expected into `why`. */
typedef int (*key_parser)(const struct key *k, const char *val, int append, psagg_config *cfg,
                          char *why, size_t whylen);

enum { KEY_REQUIRED = 1 };

struct key {
    const char *section;
    const char *name;
    size_t offset; /* of the field in psagg_config */
    size_t size;   /* of the field (string capacity) */
    key_parser parse;
    uint64_t min, max;          /* numbers: inclusive range */
    uint64_t multiple;          /* numbers: must be a multiple of this (0: any) */
    double fmin, fmax;          /* reals (float fields): inclusive range */
    const char *const *choices; /* enums: names, index = stored value; NULL-terminated */
    const int *values;          /* enums: value stored for each choice (NULL: the index) */
    int flags;
};

/* One row of keys[]: the designated extras (limits, choices, flags) follow the parser. */
#define KEY(sec, nm, field, parser, ...)                                                           \
    {                                                                                              \
        .section = sec, .name = nm, .offset = offsetof(psagg_config, field),                       \
        .size = sizeof(((psagg_config *)0)->field), .parse = parser, __VA_ARGS__                   \
    }

static int parse_number(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_enum(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_name(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_path(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_host(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_servers(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_worker_hosts(const struct key *, const char *, int, psagg_config *, char *,
                              size_t);
static int parse_codec(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_bucket(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_budget(const struct key *, const char *, int, psagg_config *, char *, size_t);
static int parse_real(const struct key *, const char *, int, psagg_config *, char *, size_t);

static const char *const bool_names[] = {"off", "on", "false", "true", "0", "1", "no", "yes", NULL};
static const int bool_values[] = {0, 1, 0, 1, 0, 1, 0, 1};
static const char *const gpu_names[] = {"off", "on", "auto", NULL};
static const int gpu_values[] = {PSAGG_GPU_OFF, PSAGG_GPU_ON, PSAGG_GPU_AUTO};
static const char *const rounding_names[] = {"stochastic", "nearest", NULL};
static const int rounding_values[] = {PSAGG_ROUND_STOCHASTIC, PSAGG_ROUND_NEAREST};
static const char *const optimizer_names[] = {"none", "sgd", "adam", "adamw", NULL};
static const int optimizer_values[] = {PSAGG_OPTIM_NONE, PSAGG_OPTIM_SGD, PSAGG_OPTIM_ADAM,
                                       PSAGG_OPTIM_ADAMW};
static const char *const level_names[] = {"error", "warn", "info", "debug", NULL};
static const int level_values[] = {PSAGG_LOG_ERROR, PSAGG_LOG_WARN, PSAGG_LOG_INFO,
                                   PSAGG_LOG_DEBUG};

#define DAY_MS 86400000u

static const struct key keys[] = {
    /* [cluster] */
    KEY("cluster", "job_id", job_id, parse_name, .flags = KEY_REQUIRED),
    KEY("cluster", "servers", servers, parse_servers, .flags = KEY_REQUIRED),
    KEY("cluster", "workers", n_workers, parse_number, .min = 1, .max = PSAGG_MAX_WORKERS,
        .flags = KEY_REQUIRED),
    KEY("cluster", "provider", provider, parse_name, .flags = 0),
    KEY("cluster", "local_copy", local_copy, parse_enum, .choices = bool_names,
        .values = bool_values),
    KEY("cluster", "connect_timeout_ms", connect_timeout_ms, parse_number, .min = 1, .max = DAY_MS),
    KEY("cluster", "op_timeout_ms", op_timeout_ms, parse_number, .min = 100, .max = DAY_MS),
    KEY("cluster", "secret_file", secret_file, parse_path, .flags = 0),
    KEY("cluster", "data_auth", data_auth, parse_enum, .choices = bool_names,
        .values = bool_values),
    KEY("cluster", "worker_hosts", worker_hosts, parse_worker_hosts, .flags = 0),
    /* [server] */
    KEY("server", "threads", server_threads, parse_number, .min = 0, .max = 1024),
    KEY("server", "error_feedback", server_error_feedback, parse_enum, .choices = bool_names,
        .values = bool_values),
    KEY("server", "gpu", gpu, parse_enum, .choices = gpu_names, .values = gpu_values),
    KEY("server", "gpu_min_elems", gpu_min_elems, parse_number, .min = 0, .max = 1ull << 40),
    KEY("server", "fabric_node", server_fabric_node, parse_host, .flags = 0),
    KEY("server", "memory_budget_mb", server_memory_budget_mb, parse_number, .min = 0,
        .max = 1ull << 30),
    KEY("server", "metrics_port", server_metrics_port, parse_number, .min = 0, .max = 65535),
    KEY("server", "optimizer", optimizer, parse_enum, .choices = optimizer_names,
        .values = optimizer_values),
    KEY("server", "lr", lr, parse_real, .fmin = 0, .fmax = 1e6),
    KEY("server", "weight_decay", weight_decay, parse_real, .fmin = 0, .fmax = 1e6),
    KEY("server", "momentum", momentum, parse_real, .fmin = 0, .fmax = 1),
    KEY("server", "dampening", dampening, parse_real, .fmin = 0, .fmax = 1),
    KEY("server", "nesterov", nesterov, parse_enum, .choices = bool_names, .values = bool_values),
    KEY("server", "beta1", beta1, parse_real, .fmin = 0, .fmax = 0.999999),
    KEY("server", "beta2", beta2, parse_real, .fmin = 0, .fmax = 0.999999),
    KEY("server", "eps", eps, parse_real, .fmin = 1e-30, .fmax = 1),
    KEY("server", "sync_interval", sync_interval, parse_number, .min = 0, .max = UINT32_MAX),
    KEY("server", "checkpoint_dir", checkpoint_dir, parse_path, .flags = 0),
    KEY("server", "resume", resume, parse_enum, .choices = bool_names, .values = bool_values),
    /* [worker] */
    KEY("worker", "chunk_bytes", chunk_bytes, parse_number, .min = 4096, .max = 1ull << 30,
        .multiple = 256),
    KEY("worker", "seed", seed, parse_number, .min = 0, .max = UINT64_MAX),
    KEY("worker", "max_inflight", max_inflight, parse_number, .min = 1, .max = 65536),
    KEY("worker", "fabric_node", worker_fabric_node, parse_host, .flags = 0),
    /* [codec]: `default` sets id/bits, `bucket` and `rounding` the rest of cfg->codec */
    KEY("codec", "default", codec, parse_codec, .flags = 0),
    KEY("codec", "bucket", codec.bucket, parse_bucket, .min = 64, .max = 1u << 20, .multiple = 64),
    KEY("codec", "rounding", codec.rounding, parse_enum, .choices = rounding_names,
        .values = rounding_values),
    KEY("codec", "error_feedback", error_feedback, parse_enum, .choices = bool_names,
        .values = bool_values),
    KEY("codec", "min_compress_elems", min_compress_elems, parse_number, .min = 0,
        .max = 1ull << 40),
    KEY("codec", "adaptive", adaptive, parse_enum, .choices = bool_names, .values = bool_values),
    KEY("codec", "adaptive_budget", adaptive_budget, parse_budget, .flags = 0),
    KEY("codec", "adaptive_interval", adaptive_interval, parse_number, .min = PSAGG_ADAPT_LAG,
        .max = PSAGG_ADAPT_MAX_INTERVAL),
    /* [log] */
    KEY("log", "level", log_level, parse_enum, .choices = level_names, .values = level_values),
    KEY("log", "stats_interval_ms", stats_interval_ms, parse_number, .min = 0, .max = DAY_MS),
    KEY("log", "timeline", timeline, parse_path, .flags = 0),
};
#define N_KEYS (sizeof keys / sizeof keys[0])

static const char *const sections[] = {"cluster", "server", "worker", "codec", "log"};
#define N_SECTIONS (sizeof sections / sizeof sections[0])

/*
 * PSAGG_* variables that look like PSAGG_<SECTION>_<KEY> but belong to the launcher, the
 * logger or the kernels, not to the config. PSAGG_LOG_LEVEL is read by log.c itself.
 */
static const char *const env_reserved[] = {"PSAGG_SERVER_RANK", "PSAGG_SERVER_BIN",
                                           "PSAGG_LOG_LEVEL", "PSAGG_CODEC_ISA"};

static int env_is_reserved(const char *var, size_t len)
{
    for (size_t i = 0; i < sizeof env_reserved / sizeof env_reserved[0]; i++)
        if (strlen(env_reserved[i]) == len && !strncmp(var, env_reserved[i], len))
            return 1;
    return 0;
}

static void set_defaults(psagg_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->provider, sizeof cfg->provider, "tcp");
    cfg->local_copy = 1;
    cfg->connect_timeout_ms = 30000;
    cfg->op_timeout_ms = 60000;
    cfg->server_threads = 0;
    cfg->server_error_feedback = 0;
    cfg->gpu = PSAGG_GPU_AUTO;
    cfg->gpu_min_elems = 262144;
    cfg->chunk_bytes = 1048576;
    cfg->seed = 1;
    cfg->max_inflight = 64;
    cfg->codec = (psagg_codec){
        .id = PSAGG_CODEC_MAXMIN, .bits = 4, .bucket = 1024, .rounding = PSAGG_ROUND_STOCHASTIC};
    cfg->error_feedback = 1;
    cfg->min_compress_elems = 1024;
    cfg->adaptive = 0;
    cfg->adaptive_budget = 1000000; /* 1.0: the uniform codec's bytes */
    cfg->adaptive_budget_bits = 0;
    cfg->adaptive_interval = 100;
    cfg->log_level = PSAGG_LOG_INFO;
    cfg->optimizer = PSAGG_OPTIM_NONE;
    cfg->lr = 0.001f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
}

/* ---- value parsers ---- */

/* Strict unsigned decimal (or 0x hex): no sign, no spaces, no trailing junk. */
static int read_u64(const char *val, uint64_t *out)
{
    int base = 10;
    const char *digits = val;
    char *end;
    unsigned long long v;

    if (val[0] == '0' && (val[1] == 'x' || val[1] == 'X')) {
        base = 16;
        digits = val + 2;
    }
    if (!isxdigit((unsigned char)digits[0]) || (base == 10 && !isdigit((unsigned char)digits[0])))
        return -1;
    errno = 0;
    v = strtoull(digits, &end, base);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int check_number(const struct key *k, const char *val, uint64_t *v, char *why, size_t whylen)
{
    if (read_u64(val, v) || *v < k->min || *v > k->max || (k->multiple && *v % k->multiple)) {
        if (k->multiple)
            snprintf(why, whylen, "a multiple of %" PRIu64 " in %" PRIu64 "..%" PRIu64, k->multiple,
                     k->min, k->max);
        else
            snprintf(why, whylen, "an integer in %" PRIu64 "..%" PRIu64, k->min, k->max);
        return -1;
    }
    return 0;
}

/* An int or uint64_t field (told apart by the field's size), range-checked. */
static int parse_number(const struct key *k, const char *val, int append, psagg_config *cfg,
                        char *why, size_t whylen)
{
    uint64_t v;
    void *field = (char *)cfg + k->offset;
    (void)append;
    if (check_number(k, val, &v, why, whylen))
        return -1;
    if (k->size == sizeof(uint64_t))
        *(uint64_t *)field = v;
    else
        *(int *)field = (int)v;
    return 0;
}

static int parse_bucket(const struct key *k, const char *val, int append, psagg_config *cfg,
                        char *why, size_t whylen)
{
    uint64_t v;
    (void)append;
    if (check_number(k, val, &v, why, whylen))
        return -1;
    cfg->codec.bucket = (uint32_t)v;
    return 0;
}

/*
 * adaptive_budget: a fraction of the uniform codec's bytes ("0.8", 0.05..4), or average bits
 * per element ("3bits", "2.5 bits": 1.5..32), kept in millionths.
 */
static int parse_budget(const struct key *k, const char *val, int append, psagg_config *cfg,
                        char *why, size_t whylen)
{
    char *end;
    double v;
    int bits;
    (void)k, (void)append;
    errno = 0;
    v = strtod(val, &end);
    while (*end == ' ')
        end++;
    bits = !strcmp(end, "bits") || !strcmp(end, "bit") || !strcmp(end, "b");
    if (end == val || errno || (*end && !bits) ||
        !(bits ? v >= 1.5 && v <= 32 : v >= 0.05 && v <= 4)) {
        snprintf(why, whylen,
                 "'%s' is not a budget: a fraction of the uniform codec's bytes (0.05..4, e.g. "
                 "0.8) or average bits per element (1.5..32, e.g. 3bits)",
                 val);
        return -1;
    }
    cfg->adaptive_budget = (uint32_t)(v * 1e6 + 0.5);
    cfg->adaptive_budget_bits = bits;
    return 0;
}

/* A float field: a decimal or exponent number in [fmin, fmax], stored as binary32. */
static int parse_real(const struct key *k, const char *val, int append, psagg_config *cfg,
                      char *why, size_t whylen)
{
    char *end;
    double v;
    (void)append;
    errno = 0;
    v = strtod(val, &end);
    if (end == val || *end || errno || !(v >= k->fmin && v <= k->fmax) ||
        isspace((unsigned char)*val)) {
        snprintf(why, whylen, "a number in %g..%g", k->fmin, k->fmax);
        return -1;
    }
    *(float *)((char *)cfg + k->offset) = (float)v;
    return 0;
}

static int parse_enum(const struct key *k, const char *val, int append, psagg_config *cfg,
                      char *why, size_t whylen)
{
    size_t used = 0;
    (void)append;
    for (int i = 0; k->choices[i]; i++) {
        if (!strcasecmp(val, k->choices[i])) {
            /* every enum field (int, psagg_gpu_mode, psagg_rounding) is int-sized */
            *(int *)((char *)cfg + k->offset) = k->values ? k->values[i] : i;
            return 0;
        }
    }
    used = (size_t)snprintf(why, whylen, "one of");
    for (int i = 0; k->choices[i] && used < whylen; i++)
        used += (size_t)snprintf(why + used, whylen - used, "%s%s", i ? "|" : " ", k->choices[i]);
    return -1;
}

static int store_string(const struct key *k, const char *val, psagg_config *cfg, char *why,
                        size_t whylen, const char *what)
{
    size_t n = strlen(val);
    if (n == 0 || n >= k->size) {
        snprintf(why, whylen, "%s of 1..%zu characters", what, k->size - 1);
        return -1;
    }
    memcpy((char *)cfg + k->offset, val, n + 1);
    return 0;
}

/* Identifiers (job id, provider name): letters, digits and . _ - ; (as in "verbs;ofi_rxm"). */
static int parse_name(const struct key *k, const char *val, int append, psagg_config *cfg,
                      char *why, size_t whylen)
{
    (void)append;
    for (const char *p = val; *p; p++) {
        if (!isalnum((unsigned char)*p) && !strchr("._-;", *p)) {
            snprintf(why, whylen, "a name of letters, digits and . _ - ; (1..%zu characters)",
                     k->size - 1);
            return -1;
        }
    }
    return store_string(k, val, cfg, why, whylen, "a name");
}

static int parse_path(const struct key *k, const char *val, int append, psagg_config *cfg,
                      char *why, size_t whylen)
{
    (void)append;
    return store_string(k, val, cfg, why, whylen, "a file path");
}

/* A host name or address literal; "auto" (or nothing) means: work it out at start-up. */
static int parse_host(const struct key *k, const char *val, int append, psagg_config *cfg,
                      char *why, size_t whylen)
{
    (void)append;
    if (!strcasecmp(val, "auto")) {
        ((char *)cfg + k->offset)[0] = '\0';
        return 0;
    }
    for (const char *p = val; *p; p++) {
        if (!isalnum((unsigned char)*p) && !strchr(".-_:", *p)) {
            snprintf(why, whylen, "a host name or address literal, or auto");
            return -1;
        }
    }
    return store_string(k, val, cfg, why, whylen, "a host name or address");
}

/* Appends to cfg->servers; the caller empties the list unless this is a continuation line. */
static int parse_servers(const struct key *k, const char *val, int append, psagg_config *cfg,
                         char *why, size_t whylen)
{
    char *buf, *save = NULL, *tok;
    int rc = -1;
    (void)k;

    if (!append)
        cfg->n_servers = 0;
    buf = strdup(val);
    if (!buf) {
        snprintf(why, whylen, "a value that fits in memory");
        return -1;
    }
    tok = strtok_r(buf, " \t,", &save);
    if (!tok && !append) {
        snprintf(why, whylen, "a list of host:port addresses");
        goto out;
    }
    for (; tok; tok = strtok_r(NULL, " \t,", &save)) {
        psagg_hostport hp;
        if (cfg->n_servers >= PSAGG_MAX_SERVERS) {
            snprintf(why, whylen, "at most %d servers", PSAGG_MAX_SERVERS);
            goto out;
        }
        if (psagg_parse_hostport(tok, &hp) != PSAGG_OK) {
            snprintf(why, whylen, "host:port addresses separated by spaces (%s)",
                     psagg_last_error());
            goto out;
        }
        for (int i = 0; i < cfg->n_servers; i++) {
            if (cfg->servers[i].port == hp.port && !strcmp(cfg->servers[i].host, hp.host)) {
                snprintf(why, whylen, "distinct addresses ('%s' is listed twice)", tok);
                goto out;
            }
        }
        cfg->servers[cfg->n_servers++] = hp;
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

/* "host[:slots] ...": stored normalized ("a:2 b:1"); the sum is checked against `workers`. */
static int parse_worker_hosts(const struct key *k, const char *val, int append, psagg_config *cfg,
                              char *why, size_t whylen)
{
    char *buf, *save = NULL, *tok, out[sizeof cfg->worker_hosts] = "";
    size_t used = 0;
    int rc = -1;
    (void)k;
    (void)append;

    buf = strdup(val);
    if (!buf) {
        snprintf(why, whylen, "a value that fits in memory");
        return -1;
    }
    for (tok = strtok_r(buf, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
        char *colon = strrchr(tok, ':');
        uint64_t slots = 1;
        int n;
        if (colon) {
            char *end;
            errno = 0;
            slots = strtoull(colon + 1, &end, 10);
            if (end == colon + 1 || *end || errno || slots < 1 || slots > PSAGG_MAX_WORKERS) {
                snprintf(why, whylen, "host or host:slots entries, slots 1..%d ('%s')",
                         PSAGG_MAX_WORKERS, tok);
                goto out;
            }
            *colon = '\0';
        }
        if (!*tok || strlen(tok) >= PSAGG_HOST_MAX) {
            snprintf(why, whylen, "host names of 1..%d characters ('%s')", PSAGG_HOST_MAX - 1, tok);
            goto out;
        }
        for (const char *p = tok; *p; p++) {
            if (!isalnum((unsigned char)*p) && !strchr(".-_@", *p)) {
                snprintf(why, whylen, "host or host:slots entries ('%s' has '%c')", tok, *p);
                goto out;
            }
        }
        n = snprintf(out + used, sizeof out - used, "%s%s:%" PRIu64, used ? " " : "", tok, slots);
        if (n < 0 || (size_t)n >= sizeof out - used) {
            snprintf(why, whylen, "a list of at most %zu characters", sizeof out - 1);
            goto out;
        }
        used += (size_t)n;
    }
    if (!used) {
        snprintf(why, whylen, "a list of host or host:slots entries");
        goto out;
    }
    memcpy(cfg->worker_hosts, out, used + 1);
    rc = 0;
out:
    free(buf);
    return rc;
}

/* Only the codec's name: bucket and rounding have their own keys, so "/512" is refused. */
static int parse_codec(const struct key *k, const char *val, int append, psagg_config *cfg,
                       char *why, size_t whylen)
{
    psagg_codec c;
    (void)k;
    (void)append;
    if (strchr(val, '/') || psagg_codec_parse(val, &c) != PSAGG_OK) {
        snprintf(why, whylen,
                 "a codec name: fp32, fp16, bf16 or maxmin1..maxmin8 (bucket and rounding "
                 "are separate keys)");
        return -1;
    }
    cfg->codec.id = c.id;
    cfg->codec.bits = c.bits;
    return 0;
}

/* ---- host:port ---- */

static int valid_hostname(const char *h)
{
    int all_numeric = 1;
    if (!*h)
        return 0;
    for (const char *p = h; *p; p++) {
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.' && *p != '_')
            return 0;
        if (!isdigit((unsigned char)*p) && *p != '.')
            all_numeric = 0;
    }
    if (all_numeric) { /* looks like IPv4: must be a valid dotted quad */
        struct in_addr a;
        return inet_pton(AF_INET, h, &a) == 1;
    }
    return 1;
}

/*
 * "host:port" or "[v6-literal]:port". The host is kept without brackets; the port must be
 * 1..65535 in decimal. Returns PSAGG_EINVAL with the reason (config callers wrap it).
 */
psagg_status psagg_parse_hostport(const char *text, psagg_hostport *out)
{
    char host[PSAGG_HOST_MAX];
    const char *port, *colon;
    size_t hlen;
    uint64_t p;

    if (!text || !*text)
        return psagg_fail(PSAGG_EINVAL, "empty address (expected host:port)");
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        struct in6_addr a6;
        if (!close || close[1] != ':')
            return psagg_fail(PSAGG_EINVAL, "bad address '%s' (expected [ipv6]:port)", text);
        hlen = (size_t)(close - text - 1);
        if (hlen == 0 || hlen >= sizeof host)
            return psagg_fail(PSAGG_EINVAL, "bad address '%s' (bad IPv6 literal)", text);
        memcpy(host, text + 1, hlen);
        host[hlen] = '\0';
        if (inet_pton(AF_INET6, host, &a6) != 1)
            return psagg_fail(PSAGG_EINVAL, "bad address '%s' (bad IPv6 literal)", text);
        port = close + 2;
    } else {
        colon = strchr(text, ':');
        if (!colon)
            return psagg_fail(PSAGG_EINVAL, "bad address '%s' (expected host:port)", text);
        if (strchr(colon + 1, ':'))
            return psagg_fail(PSAGG_EINVAL,
                              "bad address '%s' (write IPv6 addresses as [addr]:port)", text);
        hlen = (size_t)(colon - text);
        if (hlen == 0 || hlen >= sizeof host)
            return psagg_fail(PSAGG_EINVAL, "bad address '%s' (host empty or longer than %d)", text,
                              PSAGG_HOST_MAX - 1);
        memcpy(host, text, hlen);
        host[hlen] = '\0';
        if (!valid_hostname(host))
            return psagg_fail(PSAGG_EINVAL, "bad address '%s' (bad host name or IPv4 address)",
                              text);
        port = colon + 1;
    }
    if (read_u64(port, &p) || port[0] == '0' || p < 1 || p > 65535)
        return psagg_fail(PSAGG_EINVAL, "bad address '%s' (port must be 1..65535)", text);
    memcpy(out->host, host, hlen + 1);
    out->port = (uint16_t)p;
    return PSAGG_OK;
}

/* ---- the file ---- */

struct load_state {
    psagg_config *cfg;
    FILE *file;
    int lineno;             /* line the reader returned last = the line being handled */
    int indented;           /* that line starts with white space */
    int in_key;             /* a key was seen since the last section header */
    const struct key *prev; /* the key of the previous key line (for continuations) */
    int set_line[N_KEYS];   /* line that set each key from the file, 0: not set */
    int env_set[N_KEYS];    /* set from the environment */
    int err_line;           /* line of the first error (0: none) */
    int err_status;         /* its status (the message is in psagg_last_error()) */
};

static const struct key *find_key(const char *section, const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static int known_section(const char *s, size_t len)
{
    for (size_t i = 0; i < N_SECTIONS; i++)
        if (strlen(sections[i]) == len && !strncmp(sections[i], s, len))
            return 1;
    return 0;
}

static int file_error(struct load_state *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Record the first error as "path:line: message"; later ones are dropped. */
static int file_error(struct load_state *st, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    if (st->err_line)
        return 0;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st->err_line = st->lineno;
    st->err_status = psagg_fail(PSAGG_ECONFIG, "%s:%d: %s", st->cfg->path, st->lineno, msg);
    return 0;
}

/*
 * inih line reader: one whole line per call. Counts lines, refuses lines inih would split,
 * and checks section headers, mirroring inih's rules (an indented line after a key is a
 * continuation of that key, even when it looks like a header). Returns NULL at the end or
 * after the first error, which stops inih.
 */
static char *read_line(char *str, int num, void *stream)
{
    struct load_state *st = stream;
    char *line = NULL, *p;
    size_t cap = 0;
    ssize_t n;

    if (st->err_line)
        return NULL;
    errno = 0;
    n = getline(&line, &cap, st->file);
    if (n < 0) {
        if (ferror(st->file)) {
            st->lineno++;
            file_error(st, "read error: %s", strerror(errno ? errno : EIO));
        }
        free(line);
        return NULL;
    }
    st->lineno++;
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    if (n >= num - 1 || (ssize_t)strlen(line) != n) {
        file_error(st,
                   "line too long or contains a NUL byte (at most %d characters; continue "
                   "a long servers list on indented lines)",
                   num - 2);
        free(line);
        return NULL;
    }
    memcpy(str, line, (size_t)n + 1);
    free(line);

    p = str;
    if (st->lineno == 1 && !strncmp(p, "\xEF\xBB\xBF", 3))
        p += 3;
    st->indented = (*p == ' ' || *p == '\t');
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '[' && !(st->indented && st->in_key)) {
        const char *close = strchr(p, ']');
        st->in_key = 0;
        st->prev = NULL;
        if (close && !known_section(p + 1, (size_t)(close - p - 1)))
            file_error(st,
                       "unknown section [%.*s] (expected cluster, server, worker, codec or log)",
                       (int)(close - p - 1), p + 1);
    }
    return str;
}

/* Continuation values keep inih's inline comments; cut " ; comment" off here. */
static void strip_inline_comment(char *s)
{
    for (char *p = s; *p; p++) {
        if (*p == ';' && (p == s || p[-1] == ' ' || p[-1] == '\t')) {
            *p = '\0';
            break;
        }
    }
}

static int on_key(void *user, const char *section, const char *name, const char *value)
{
    struct load_state *st = user;
    const struct key *k;
    char why[300], val[INI_MAX_LINE + 1];
    int cont;
    size_t idx;

    if (st->err_line)
        return 0;
    cont = st->indented && st->in_key && st->prev && !strcmp(st->prev->name, name) &&
           !strcmp(st->prev->section, section);
    st->in_key = 1;
    if (!*section)
        return file_error(st, "key '%s' outside any section", name);
    k = find_key(section, name);
    if (!k)
        return file_error(st, "unknown key '%s' in [%s]", name, section);
    idx = (size_t)(k - keys);
    snprintf(val, sizeof val, "%s", value);
    if (cont) {
        strip_inline_comment(val);
        if (k->parse != parse_servers)
            return file_error(st,
                              "indented line continues [%s] %s, but only servers may span "
                              "lines (remove the indentation)",
                              section, name);
    } else if (st->set_line[idx]) {
        return file_error(st, "duplicate key '%s' in [%s] (first set on line %d)", name, section,
                          st->set_line[idx]);
    }
    st->prev = k;
    if (!cont)
        st->set_line[idx] = st->lineno;
    if (k->parse(k, val, cont, st->cfg, why, sizeof why))
        return file_error(st, "[%s] %s = '%s': expected %s", section, name, val, why);
    return 1;
}

static int load_file(struct load_state *st, const char *path)
{
    int ret;

    st->file = fopen(path, "r");
    if (!st->file)
        return psagg_fail(PSAGG_ECONFIG, "%s: cannot open config file: %s", path, strerror(errno));
    ret = ini_parse_stream(read_line, st, on_key, st);
    fclose(st->file);
    st->file = NULL;
    if (ret > 0 && (!st->err_line || ret < st->err_line))
        return psagg_fail(PSAGG_ECONFIG,
                          "%s:%d: syntax error (expected '[section]', 'key = value' or a "
                          "comment starting with ; or #)",
                          path, ret);
    if (st->err_line)
        return st->err_status;
    if (ret < 0)
        return psagg_fail(PSAGG_ENOMEM, "%s: inih could not allocate its line buffer", path);
    return PSAGG_OK;
}

/* ---- the environment ---- */

/* "PSAGG_" + upper(section) + "_" + upper(name) */
static void env_name(const struct key *k, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "PSAGG_%s_%s", k->section, k->name);
    for (size_t i = 6; i < n && i < len; i++)
        buf[i] = (char)toupper((unsigned char)buf[i]);
}

/*
 * Variables named PSAGG_<known section>_... must each be a key (or a reserved launcher /
 * logger variable); anything else is a typo we refuse rather than ignore.
 */
static int check_env_names(void)
{
    for (char **e = environ; e && *e; e++) {
        const char *var = *e, *eq = strchr(var, '=');
        size_t len = eq ? (size_t)(eq - var) : strlen(var);
        int matched = 0, in_section = 0;
        char name[128];

        if (strncmp(var, "PSAGG_", 6) || len >= 128)
            continue;
        for (size_t i = 0; i < N_SECTIONS && !in_section; i++) {
            size_t sl = strlen(sections[i]);
            in_section =
                len > 6 + sl + 1 && !strncasecmp(var + 6, sections[i], sl) && var[6 + sl] == '_';
        }
        if (!in_section)
            continue;
        matched = env_is_reserved(var, len);
        for (size_t i = 0; i < N_KEYS && !matched; i++) {
            env_name(&keys[i], name, sizeof name);
            matched = strlen(name) == len && !strncmp(var, name, len);
        }
        if (!matched)
            return psagg_fail(PSAGG_ECONFIG,
                              "env %.*s: no such config key (PSAGG_<SECTION>_<KEY> names a key "
                              "of conf/cluster.ini)",
                              (int)len, var);
    }
    return PSAGG_OK;
}

static int apply_env(struct load_state *st)
{
    int rc = check_env_names();
    if (rc)
        return rc;
    for (size_t i = 0; i < N_KEYS; i++) {
        const struct key *k = &keys[i];
        char name[128], why[300];
        const char *val;

        env_name(k, name, sizeof name);
        val = getenv(name);
        if (!val || env_is_reserved(name, strlen(name)))
            continue;
        if (k->parse(k, val, 0, st->cfg, why, sizeof why))
            return psagg_fail(PSAGG_ECONFIG, "env %s: '%s' for [%s] %s: expected %s", name, val,
                              k->section, k->name, why);
        st->env_set[i] = 1;
    }
    /* PSAGG_TIMELINE: the short name of PSAGG_LOG_TIMELINE (like HOROVOD_TIMELINE) */
    {
        const struct key *k = find_key("log", "timeline");
        const char *val = getenv("PSAGG_TIMELINE");
        char why[300];
        if (val && !getenv("PSAGG_LOG_TIMELINE")) {
            if (k->parse(k, val, 0, st->cfg, why, sizeof why))
                return psagg_fail(PSAGG_ECONFIG, "env PSAGG_TIMELINE: '%s': expected %s", val, why);
            st->env_set[k - keys] = 1;
        }
    }
    return PSAGG_OK;
}

/* Where key `name` of `section` got its value: "path:line", "env PSAGG_X", or the path. */
static void key_origin(const struct load_state *st, const char *section, const char *name,
                       char *buf, size_t len)
{
    const struct key *k = find_key(section, name);
    size_t i = (size_t)(k - keys);
    if (st->env_set[i]) {
        char env[128];
        env_name(k, env, sizeof env);
        snprintf(buf, len, "env %s", env);
    } else if (st->set_line[i]) {
        snprintf(buf, len, "%s:%d", st->cfg->path, st->set_line[i]);
    } else {
        snprintf(buf, len, "%s", st->cfg->path);
    }
}

/*
 * A secret_file must be readable and not empty now, at start-up, rather than make every HELLO
 * fail later ("secret differs"); data_auth needs a secret to derive its keys from.
 */
static psagg_status check_secret(const struct load_state *st)
{
    const psagg_config *cfg = st->cfg;
    char where[300];
    struct stat sb;
    unsigned char byte;
    int fd, rc, c, err;

    if (cfg->data_auth && !cfg->secret_file[0]) {
        key_origin(st, "cluster", "data_auth", where, sizeof where);
        return psagg_fail(PSAGG_ECONFIG,
                          "%s: [cluster] data_auth = on needs [cluster] secret_file (the data "
                          "keys derive from the job's secret)",
                          where);
    }
    if (!cfg->secret_file[0])
        return PSAGG_OK;
    key_origin(st, "cluster", "secret_file", where, sizeof where);
    /* O_NONBLOCK: a FIFO or a device must not hold start-up; only regular files are secrets */
    fd = open(cfg->secret_file, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return psagg_fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' cannot be read: %s", where,
                          cfg->secret_file, strerror(errno));
    rc = fstat(fd, &sb);
    c = rc == 0 && S_ISREG(sb.st_mode) ? (int)read(fd, &byte, 1) : -1;
    err = errno;
    close(fd);
    if (rc || !S_ISREG(sb.st_mode))
        return psagg_fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' is not a regular file",
                          where, cfg->secret_file);
    if (c < 0)
        return psagg_fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' cannot be read: %s", where,
                          cfg->secret_file, strerror(err));
    if (c == 0)
        return psagg_fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' is empty", where,
                          cfg->secret_file);
    if (sb.st_size > PSAGG_SECRET_MAX)
        return psagg_fail(PSAGG_ECONFIG,
                          "%s: [cluster] secret_file '%s' has %lld bytes, more than %d", where,
                          cfg->secret_file, (long long)sb.st_size, PSAGG_SECRET_MAX);
    return PSAGG_OK;
}

/* worker_hosts, when given, must place exactly `workers` workers. */
static psagg_status check_worker_hosts(const struct load_state *st)
{
    const psagg_config *cfg = st->cfg;
    const char *p = cfg->worker_hosts;
    uint64_t total = 0;
    char where[300];

    if (!*p)
        return PSAGG_OK;
    for (; (p = strchr(p, ':')); p++) /* parse_worker_hosts wrote "host:slots ..." */
        total += strtoull(p + 1, NULL, 10);
    if (total == (uint64_t)cfg->n_workers)
        return PSAGG_OK;
    key_origin(st, "cluster", "worker_hosts", where, sizeof where);
    return psagg_fail(PSAGG_ECONFIG,
                      "%s: [cluster] worker_hosts gives %" PRIu64 " worker slots ('%s') but "
                      "workers = %d; they must agree",
                      where, total, cfg->worker_hosts, cfg->n_workers);
}

/* The optimizer's keys that only make sense together. */
static psagg_status check_optimizer(const struct load_state *st)
{
    const psagg_config *cfg = st->cfg;
    char where[300];

    if (cfg->nesterov && cfg->optimizer == PSAGG_OPTIM_SGD &&
        (cfg->momentum == 0.0f || cfg->dampening != 0.0f)) {
        key_origin(st, "server", "nesterov", where, sizeof where);
        return psagg_fail(PSAGG_ECONFIG,
                          "%s: [server] nesterov = on needs momentum > 0 and dampening = 0 (as "
                          "torch.optim.SGD)",
                          where);
    }
    if (cfg->optimizer != PSAGG_OPTIM_NONE && cfg->adaptive) {
        key_origin(st, "codec", "adaptive", where, sizeof where);
        return psagg_fail(PSAGG_ECONFIG,
                          "%s: [codec] adaptive = on cannot be combined with [server] optimizer = "
                          "%s yet",
                          where, psagg_optim_name((psagg_optim_kind)cfg->optimizer));
    }
    if (cfg->resume && !cfg->checkpoint_dir[0]) {
        key_origin(st, "server", "resume", where, sizeof where);
        return psagg_fail(PSAGG_ECONFIG, "%s: [server] resume = on needs [server] checkpoint_dir",
                          where);
    }
    return PSAGG_OK;
}

/*
 * Defaults, file, environment, required keys. On failure *cfg holds partial values and
 * psagg_last_error() says where ("path:line: ..." or "env PSAGG_X: ...") and what.
 */
psagg_status psagg_config_load(const char *path, psagg_config *cfg)
{
    struct load_state *st;
    int rc;

    if (!path || !cfg)
        return psagg_fail(PSAGG_EINVAL, "psagg_config_load: path and cfg are required");
    set_defaults(cfg);
    if (strlen(path) >= sizeof cfg->path)
        return psagg_fail(PSAGG_ECONFIG, "%s: config path longer than %zu characters", path,
                          sizeof cfg->path - 1);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);

    st = calloc(1, sizeof *st);
    if (!st)
        return psagg_fail(PSAGG_ENOMEM, "%s: out of memory", path);
    st->cfg = cfg;
    rc = load_file(st, path);
    if (rc)
        goto out;
    rc = apply_env(st);
    if (rc)
        goto out;
    for (size_t i = 0; i < N_KEYS; i++) {
        if ((keys[i].flags & KEY_REQUIRED) && !st->set_line[i] && !st->env_set[i]) {
            char name[128];
            env_name(&keys[i], name, sizeof name);
            rc = psagg_fail(PSAGG_ECONFIG, "%s: missing required key '%s' in [%s] (or env %s)",
                            path, keys[i].name, keys[i].section, name);
            goto out;
        }
    }
    rc = check_secret(st);
    if (!rc)
        rc = check_worker_hosts(st);
    if (!rc)
        rc = check_optimizer(st);
    key_origin(st, "cluster", "servers", cfg->servers_where, sizeof cfg->servers_where);
out:
    free(st);
    return rc;
}

psagg_status psagg_config_check_addresses(const psagg_config *cfg)
{
    for (int i = 0; i < cfg->n_servers; i++) {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        char port[16];
        int rc;
        snprintf(port, sizeof port, "%u", cfg->servers[i].port);
        rc = getaddrinfo(cfg->servers[i].host, port, &hints, &res);
        if (rc)
            return psagg_fail(PSAGG_ECONFIG,
                              "%s: [cluster] servers: server %d '%s' does not resolve here: %s",
                              cfg->servers_where, i, cfg->servers[i].host,
                              rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        freeaddrinfo(res);
    }
    return PSAGG_OK;
}

/* ---- printing the resolved config ---- */

/* One key's value as the INI would spell it. */
static void format_value(const psagg_config *cfg, const struct key *k, char *out, size_t len)
{
    const void *field = (const char *)cfg + k->offset;
    size_t used = 0;
    out[0] = '\0';
    if (k->parse == parse_number || k->parse == parse_bucket) {
        uint64_t v = k->parse == parse_bucket      ? cfg->codec.bucket
                     : k->size == sizeof(uint64_t) ? *(const uint64_t *)field
                                                   : (uint64_t) * (const int *)field;
        snprintf(out, len, "%" PRIu64, v);
    } else if (k->parse == parse_enum) {
        int v = *(const int *)field;
        for (int i = 0; k->choices[i]; i++)
            if ((k->values ? k->values[i] : i) == v) {
                snprintf(out, len, "%s", k->choices[i]);
                break;
            }
    } else if (k->parse == parse_servers) {
        for (int i = 0; i < cfg->n_servers && used < len; i++)
            used += (size_t)snprintf(out + used, len - used,
                                     strchr(cfg->servers[i].host, ':') ? "%s[%s]:%u" : "%s%s:%u",
                                     i ? " " : "", cfg->servers[i].host, cfg->servers[i].port);
    } else if (k->parse == parse_real) { /* the shortest that reads back as the same float */
        float v = *(const float *)field;
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(out, len, "%.*g", digits, (double)v);
            if (strtof(out, NULL) == v)
                break;
        }
    } else if (k->parse == parse_budget) {
        snprintf(out, len, "%.6g%s", cfg->adaptive_budget / 1e6,
                 cfg->adaptive_budget_bits ? "bits" : "");
    } else if (k->parse == parse_codec) {
        psagg_codec c = cfg->codec;
        char name[64];
        psagg_codec_name(&c, name, sizeof name);
        /* the name of the codec alone: bucket and rounding are keys of their own */
        snprintf(out, len, "%.*s", (int)strcspn(name, "/"), name);
    } else { /* names, paths, hosts */
        snprintf(out, len, "%s", (const char *)field);
    }
}

void psagg_config_print(const psagg_config *cfg, FILE *to)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        char value[PSAGG_MAX_SERVERS * (PSAGG_HOST_MAX + 9) + 1];
        format_value(cfg, &keys[i], value, sizeof value);
        fprintf(to, "%s.%s = %s\n", keys[i].section, keys[i].name, value);
    }
}
