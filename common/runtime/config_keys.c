/*
 * runtime/config_keys.c - what psagg's configuration keys are and what their values mean: the
 * table of keys (section, name, field, parser, limits), the built-in defaults, the per-type
 * value parsers (with host:port) and their inverse, the formatter psagg__config_print uses.
 * Where values come from (the INI file, the environment) and the checks across keys are
 * config.c. See config.h for the contract.
 *
 * Every key is one row of `config_keys[]`: config.c's file handler and environment pass look a
 * key up there and run its parser, so adding a key is adding a row. Parsers only say what they
 * expected ("an integer 1..1024"); the caller prefixes where the value came from
 * ("conf/x.ini:12: " or "env PSAGG_X: ").
 */
#include "runtime/config_keys.h"

#include "base/error.h"
#include "base/log.h"
#include "kernels/codec.h"
#include "kernels/optim.h"
#include "runtime/adaptive.h"
#include "runtime/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

/* ---- key table ---- */

/* One row of keys[]: the designated extras (limits, choices, flags) follow the parser. */
#define KEY(sec, nm, field, parser, ...)                                                           \
    {                                                                                              \
        .section = sec, .name = nm, .offset = offsetof(psagg__config, field),                      \
        .size = sizeof(((psagg__config *)0)->field), .parse = parser, __VA_ARGS__                  \
    }

static int parse_number(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_enum(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_name(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_path(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_host(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_servers(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_worker_hosts(const struct key *, const char *, int, psagg__config *, char *,
                              size_t);
static int parse_codec(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_bucket(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_budget(const struct key *, const char *, int, psagg__config *, char *, size_t);
static int parse_real(const struct key *, const char *, int, psagg__config *, char *, size_t);

static const char *const bool_names[] = {"off", "on", "false", "true", "0", "1", "no", "yes", NULL};
static const int bool_values[] = {0, 1, 0, 1, 0, 1, 0, 1};
static const char *const data_auth_names[] = {"off", "on", "auto", "false", "true",
                                              "0",   "1",  "no",   "yes",   NULL};
static const int data_auth_values[] = {0, 1, PSAGG_DATA_AUTH_AUTO, 0, 1, 0, 1, 0, 1};
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

const struct key config_keys[] = {
    /* [cluster] */
    KEY("cluster", "job_id", job_id, parse_name, .flags = KEY_REQUIRED),
    KEY("cluster", "servers", servers, parse_servers, .flags = KEY_REQUIRED | KEY_LINES),
    KEY("cluster", "workers", n_workers, parse_number, .min = 1, .max = PSAGG_MAX_WORKERS,
        .flags = KEY_REQUIRED),
    KEY("cluster", "provider", provider, parse_name, .flags = 0),
    KEY("cluster", "local_copy", local_copy, parse_enum, .choices = bool_names,
        .values = bool_values),
    KEY("cluster", "connect_timeout_ms", connect_timeout_ms, parse_number, .min = 1, .max = DAY_MS),
    KEY("cluster", "op_timeout_ms", op_timeout_ms, parse_number, .min = 100, .max = DAY_MS),
    KEY("cluster", "secret_file", secret_file, parse_path, .flags = 0),
    KEY("cluster", "data_auth", data_auth, parse_enum, .choices = data_auth_names,
        .values = data_auth_values),
    KEY("cluster", "worker_hosts", worker_hosts, parse_worker_hosts, .flags = 0),
    KEY("cluster", "elastic", elastic, parse_enum, .choices = bool_names, .values = bool_values),
    KEY("cluster", "min_workers", min_workers, parse_number, .min = 1, .max = PSAGG_MAX_WORKERS),
    KEY("cluster", "max_workers", max_workers, parse_number, .min = 0, .max = PSAGG_MAX_WORKERS),
    KEY("cluster", "server_replicas", server_replicas, parse_number, .min = 0,
        .max = PSAGG_MAX_SERVERS - 1),
    /* [server] */
    KEY("server", "threads", server_threads, parse_number, .min = 0, .max = 1024),
    KEY("server", "error_feedback", server_error_feedback, parse_enum, .choices = bool_names,
        .values = bool_values),
    KEY("server", "gpu", gpu, parse_enum, .choices = gpu_names, .values = gpu_values),
    KEY("server", "gpu_min_elems", gpu_min_elems, parse_number, .min = 0, .max = 1ull << 40),
    KEY("server", "fabric_node", server_fabric_node, parse_host, .flags = 0),
    KEY("server", "memory_budget_mb", server_memory_budget_mb, parse_number, .min = 0,
        .max = 1ull << 30),
    KEY("server", "quorum", quorum, parse_number, .min = 0, .max = PSAGG_MAX_WORKERS),
    KEY("server", "grace_ms", grace_ms, parse_number, .min = 0, .max = DAY_MS),
    KEY("server", "metrics_port", server_metrics_port, parse_number, .min = 0, .max = 65535),
    KEY("server", "optimizer", optimizer, parse_enum, .choices = optimizer_names,
        .values = optimizer_values),
    KEY("server", "lr", lr, parse_real, .fmin = 0, .fmax = PSAGG_LR_MAX),
    KEY("server", "weight_decay", weight_decay, parse_real, .fmin = 0, .fmax = PSAGG_LR_MAX),
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
    KEY("codec", "error_feedback_beta", error_feedback_beta, parse_real, .fmin = 1e-6, .fmax = 1),
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
    KEY("log", "mac_trace", mac_trace, parse_path, .flags = 0),
};
const size_t config_n_keys = sizeof config_keys / sizeof config_keys[0];
_Static_assert(sizeof config_keys / sizeof config_keys[0] <= CONFIG_KEYS_MAX,
               "more keys than CONFIG_KEYS_MAX: raise it (runtime/config_keys.h)");

const char *const config_sections[] = {"cluster", "server", "worker", "codec", "log"};
_Static_assert(sizeof config_sections / sizeof config_sections[0] == CONFIG_N_SECTIONS,
               "CONFIG_N_SECTIONS (runtime/config_keys.h)");

/* Every key's built-in default (what neither the file nor the environment sets). */
void config_set_defaults(psagg__config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->provider, sizeof cfg->provider, "tcp");
    cfg->local_copy = 1;
    cfg->data_auth = PSAGG_DATA_AUTH_AUTO;
    cfg->connect_timeout_ms = 30000;
    cfg->op_timeout_ms = 60000;
    cfg->min_workers = 1;
    cfg->server_threads = 0;
    cfg->server_error_feedback = 0;
    cfg->quorum = 0;
    cfg->grace_ms = 10;
    cfg->gpu = PSAGG_GPU_AUTO;
    cfg->gpu_min_elems = 262144;
    cfg->chunk_bytes = 1048576;
    cfg->seed = 1;
    cfg->max_inflight = 64;
    cfg->codec = (psagg_codec){
        .id = PSAGG_CODEC_MAXMIN, .bits = 4, .bucket = 1024, .rounding = PSAGG_ROUND_STOCHASTIC};
    cfg->error_feedback = 1;
    cfg->error_feedback_beta = 1.0f;
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
static int parse_number(const struct key *k, const char *val, int append, psagg__config *cfg,
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

static int parse_bucket(const struct key *k, const char *val, int append, psagg__config *cfg,
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
static int parse_budget(const struct key *k, const char *val, int append, psagg__config *cfg,
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
static int parse_real(const struct key *k, const char *val, int append, psagg__config *cfg,
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

static int parse_enum(const struct key *k, const char *val, int append, psagg__config *cfg,
                      char *why, size_t whylen)
{
    size_t used = 0;
    (void)append;
    for (int i = 0; k->choices[i]; i++) {
        if (!strcasecmp(val, k->choices[i])) {
            /* every enum field (int, psagg__gpu_mode, psagg_rounding) is int-sized */
            *(int *)((char *)cfg + k->offset) = k->values ? k->values[i] : i;
            return 0;
        }
    }
    used = (size_t)snprintf(why, whylen, "one of");
    for (int i = 0; k->choices[i] && used < whylen; i++)
        used += (size_t)snprintf(why + used, whylen - used, "%s%s", i ? "|" : " ", k->choices[i]);
    return -1;
}

static int store_string(const struct key *k, const char *val, psagg__config *cfg, char *why,
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
static int parse_name(const struct key *k, const char *val, int append, psagg__config *cfg,
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

static int parse_path(const struct key *k, const char *val, int append, psagg__config *cfg,
                      char *why, size_t whylen)
{
    (void)append;
    return store_string(k, val, cfg, why, whylen, "a file path");
}

/* A host name or address literal; "auto" (or nothing) means: work it out at start-up. */
static int parse_host(const struct key *k, const char *val, int append, psagg__config *cfg,
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
static int parse_servers(const struct key *k, const char *val, int append, psagg__config *cfg,
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
        psagg__hostport hp;
        if (cfg->n_servers >= PSAGG_MAX_SERVERS) {
            snprintf(why, whylen, "at most %d servers", PSAGG_MAX_SERVERS);
            goto out;
        }
        if (psagg__parse_hostport(tok, &hp) != PSAGG_OK) {
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
static int parse_worker_hosts(const struct key *k, const char *val, int append, psagg__config *cfg,
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
static int parse_codec(const struct key *k, const char *val, int append, psagg__config *cfg,
                       char *why, size_t whylen)
{
    psagg_codec c;
    (void)k;
    (void)append;
    if (strchr(val, '/') || psagg_codec_parse(val, &c) != PSAGG_OK) {
        snprintf(why, whylen,
                 "a codec name: fp32, fp16, bf16, maxmin1..maxmin8, thc2 or thc4 (bucket and "
                 "rounding are separate keys)");
        return -1;
    }
    if (c.id == PSAGG_CODEC_TOPK) {
        snprintf(why, whylen,
                 "topk is a tensor's codec (psagg_tensor_desc.codec, psagg.torch's codec=), not "
                 "yet a job's default: fp32, fp16, bf16, maxmin1..maxmin8, thc2 or thc4 here");
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
psagg_status psagg__parse_hostport(const char *text, psagg__hostport *out)
{
    char host[PSAGG_HOST_MAX];
    const char *port, *colon;
    size_t hlen;
    uint64_t p;

    if (!text || !*text)
        return psagg__fail(PSAGG_EINVAL, "empty address (expected host:port)");
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        struct in6_addr a6;
        if (!close || close[1] != ':')
            return psagg__fail(PSAGG_EINVAL, "bad address '%s' (expected [ipv6]:port)", text);
        hlen = (size_t)(close - text - 1);
        if (hlen == 0 || hlen >= sizeof host)
            return psagg__fail(PSAGG_EINVAL, "bad address '%s' (bad IPv6 literal)", text);
        memcpy(host, text + 1, hlen);
        host[hlen] = '\0';
        if (inet_pton(AF_INET6, host, &a6) != 1)
            return psagg__fail(PSAGG_EINVAL, "bad address '%s' (bad IPv6 literal)", text);
        port = close + 2;
    } else {
        colon = strchr(text, ':');
        if (!colon)
            return psagg__fail(PSAGG_EINVAL, "bad address '%s' (expected host:port)", text);
        if (strchr(colon + 1, ':'))
            return psagg__fail(PSAGG_EINVAL,
                               "bad address '%s' (write IPv6 addresses as [addr]:port)", text);
        hlen = (size_t)(colon - text);
        if (hlen == 0 || hlen >= sizeof host)
            return psagg__fail(PSAGG_EINVAL, "bad address '%s' (host empty or longer than %d)",
                               text, PSAGG_HOST_MAX - 1);
        memcpy(host, text, hlen);
        host[hlen] = '\0';
        if (!valid_hostname(host))
            return psagg__fail(PSAGG_EINVAL, "bad address '%s' (bad host name or IPv4 address)",
                               text);
        port = colon + 1;
    }
    if (read_u64(port, &p) || port[0] == '0' || p < 1 || p > 65535)
        return psagg__fail(PSAGG_EINVAL, "bad address '%s' (port must be 1..65535)", text);
    memcpy(out->host, host, hlen + 1);
    out->port = (uint16_t)p;
    return PSAGG_OK;
}

/* ---- formatting ---- */

/* One key's value as the INI would spell it: the inverse of its parser. */
void config_format_value(const psagg__config *cfg, const struct key *k, char *out, size_t len)
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
