/*
 * runtime/config.c - psagg__config_load(): defaults, then the INI file (inih), then
 * PSAGG_<SECTION>_<KEY> environment overrides, then the required-key check and the checks
 * across keys; psagg__config_print. See config.h for the contract.
 *
 * The keys themselves (the table, defaults, value parsers and formatters) are config_keys.c,
 * behind the internal config_keys.h: every key is one row of `config_keys[]`; the file handler
 * and the environment pass look a key up there and run its parser, which only says what it
 * expected ("an integer 1..1024"); this file prefixes where the value came from
 * ("conf/x.ini:12: " or "env PSAGG_X: ").
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
#include "runtime/config_keys.h"
#include "runtime/features.h"
#include "runtime/layout.h"

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

/* ---- the file ---- */

struct load_state {
    psagg__config *cfg;
    FILE *file;
    int lineno;                    /* line the reader returned last = the line being handled */
    int indented;                  /* that line starts with white space */
    int in_key;                    /* a key was seen since the last section header */
    const struct key *prev;        /* the key of the previous key line (for continuations) */
    int set_line[CONFIG_KEYS_MAX]; /* line that set each key from the file, 0: not set */
    int env_set[CONFIG_KEYS_MAX];  /* set from the environment */
    int err_line;                  /* line of the first error (0: none) */
    int err_status;                /* its status (the message is in psagg_last_error()) */
};

static const struct key *find_key(const char *section, const char *name)
{
    for (size_t i = 0; i < config_n_keys; i++)
        if (!strcmp(config_keys[i].section, section) && !strcmp(config_keys[i].name, name))
            return &config_keys[i];
    return NULL;
}

static int known_section(const char *s, size_t len)
{
    for (size_t i = 0; i < CONFIG_N_SECTIONS; i++)
        if (strlen(config_sections[i]) == len && !strncmp(config_sections[i], s, len))
            return 1;
    return 0;
}

static int file_error(struct load_state *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * The position of the first control character in val, or -1, with its code point in *cp: a
 * byte below 0x20, 0x7f, a C1 control (U+0080..U+009F, NEL among them) or a line or paragraph
 * separator (U+2028, U+2029) in UTF-8. No value may hold one: a path with a newline would
 * print as two lines in --check-config, which the launchers parse, and Python's
 * str.splitlines also splits at the others.
 */
static long control_at(const char *val, unsigned *cp)
{
    for (const unsigned char *p = (const unsigned char *)val; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            *cp = *p;
        else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            *cp = p[1];
        else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
            *cp = 0x2000u | (unsigned)(p[2] - 0x80);
        else
            continue;
        return (long)(p - (const unsigned char *)val);
    }
    return -1;
}

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
    st->err_status = psagg__fail(PSAGG_ECONFIG, "%s:%d: %s", st->cfg->path, st->lineno, msg);
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
    long at;
    unsigned cp;
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
    idx = (size_t)(k - config_keys);
    snprintf(val, sizeof val, "%s", value);
    if (cont) {
        strip_inline_comment(val);
        if (!(k->flags & KEY_LINES))
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
    if ((at = control_at(val, &cp)) >= 0)
        return file_error(st,
                          "[%s] %s: the value has a control character (U+%04X) at byte %ld: "
                          "no value may contain one",
                          section, name, cp, at);
    if (k->parse(k, val, cont, st->cfg, why, sizeof why))
        return file_error(st, "[%s] %s = '%s': expected %s", section, name, val, why);
    return 1;
}

static int load_file(struct load_state *st, const char *path)
{
    int ret;

    st->file = fopen(path, "r");
    if (!st->file)
        return psagg__fail(PSAGG_ECONFIG, "%s: cannot open config file: %s", path, strerror(errno));
    ret = ini_parse_stream(read_line, st, on_key, st);
    fclose(st->file);
    st->file = NULL;
    if (ret > 0 && (!st->err_line || ret < st->err_line))
        return psagg__fail(PSAGG_ECONFIG,
                           "%s:%d: syntax error (expected '[section]', 'key = value' or a "
                           "comment starting with ; or #)",
                           path, ret);
    if (st->err_line)
        return st->err_status;
    if (ret < 0)
        return psagg__fail(PSAGG_ENOMEM, "%s: inih could not allocate its line buffer", path);
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
        for (size_t i = 0; i < CONFIG_N_SECTIONS && !in_section; i++) {
            size_t sl = strlen(config_sections[i]);
            in_section = len > 6 + sl + 1 && !strncasecmp(var + 6, config_sections[i], sl) &&
                         var[6 + sl] == '_';
        }
        if (!in_section)
            continue;
        matched = env_is_reserved(var, len);
        for (size_t i = 0; i < config_n_keys && !matched; i++) {
            env_name(&config_keys[i], name, sizeof name);
            matched = strlen(name) == len && !strncmp(var, name, len);
        }
        if (!matched)
            return psagg__fail(PSAGG_ECONFIG,
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
    for (size_t i = 0; i < config_n_keys; i++) {
        const struct key *k = &config_keys[i];
        char name[128], why[300];
        const char *val;
        long at;
        unsigned cp;

        env_name(k, name, sizeof name);
        val = getenv(name);
        if (!val || env_is_reserved(name, strlen(name)))
            continue;
        if ((at = control_at(val, &cp)) >= 0)
            return psagg__fail(PSAGG_ECONFIG,
                               "env %s: the value has a control character (U+%04X) at byte %ld: "
                               "no value may contain one ([%s] %s)",
                               name, cp, at, k->section, k->name);
        if (k->parse(k, val, 0, st->cfg, why, sizeof why))
            return psagg__fail(PSAGG_ECONFIG, "env %s: '%s' for [%s] %s: expected %s", name, val,
                               k->section, k->name, why);
        st->env_set[i] = 1;
    }
    /* PSAGG_TIMELINE: the short name of PSAGG_LOG_TIMELINE (like HOROVOD_TIMELINE) */
    {
        const struct key *k = find_key("log", "timeline");
        const char *val = getenv("PSAGG_TIMELINE");
        char why[300];
        if (val && !getenv("PSAGG_LOG_TIMELINE")) {
            unsigned cp;
            long at = control_at(val, &cp);
            if (at >= 0)
                return psagg__fail(PSAGG_ECONFIG,
                                   "env PSAGG_TIMELINE: the value has a control character (U+%04X) "
                                   "at byte %ld: no value may contain one",
                                   cp, at);
            if (k->parse(k, val, 0, st->cfg, why, sizeof why))
                return psagg__fail(PSAGG_ECONFIG, "env PSAGG_TIMELINE: '%s': expected %s", val,
                                   why);
            st->env_set[k - config_keys] = 1;
        }
    }
    return PSAGG_OK;
}

/* Where key `name` of `section` got its value: "path:line", "env PSAGG_X", or the path. */
static void key_origin(const struct load_state *st, const char *section, const char *name,
                       char *buf, size_t len)
{
    const struct key *k = find_key(section, name);
    size_t i = (size_t)(k - config_keys);
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
    psagg__config *cfg = st->cfg;
    char where[300];
    struct stat sb;
    unsigned char byte;
    int fd, rc, c, err;

    if (cfg->data_auth == PSAGG_DATA_AUTH_AUTO) /* a secret means the data is authenticated */
        cfg->data_auth = cfg->secret_file[0] != 0;
    if (cfg->data_auth && !cfg->secret_file[0]) {
        key_origin(st, "cluster", "data_auth", where, sizeof where);
        return psagg__fail(PSAGG_ECONFIG,
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
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' cannot be read: %s",
                           where, cfg->secret_file, strerror(errno));
    rc = fstat(fd, &sb);
    c = rc == 0 && S_ISREG(sb.st_mode) ? (int)read(fd, &byte, 1) : -1;
    err = errno;
    close(fd);
    if (rc || !S_ISREG(sb.st_mode))
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' is not a regular file",
                           where, cfg->secret_file);
    if (c < 0)
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' cannot be read: %s",
                           where, cfg->secret_file, strerror(err));
    if (c == 0)
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' is empty", where,
                           cfg->secret_file);
    if (sb.st_size > PSAGG_SECRET_MAX)
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [cluster] secret_file '%s' has %lld bytes, more than %d", where,
                           cfg->secret_file, (long long)sb.st_size, PSAGG_SECRET_MAX);
    return PSAGG_OK;
}

/* worker_hosts, when given, must place exactly `workers` workers. */
static psagg_status check_worker_hosts(const struct load_state *st)
{
    const psagg__config *cfg = st->cfg;
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
    return psagg__fail(PSAGG_ECONFIG,
                       "%s: [cluster] worker_hosts gives %" PRIu64 " worker slots ('%s') but "
                       "workers = %d; they must agree",
                       where, total, cfg->worker_hosts, cfg->n_workers);
}

/* Elastic membership: min_workers <= workers <= max_workers (0: `workers`). */
static psagg_status check_elastic(const struct load_state *st)
{
    psagg__config *cfg = st->cfg;
    char where[300];

    if (!cfg->max_workers)
        cfg->max_workers = cfg->n_workers;
    if (!cfg->elastic)
        return PSAGG_OK; /* (the keys are kept, and mean nothing) */
    if (cfg->min_workers > cfg->n_workers) {
        key_origin(st, "cluster", "min_workers", where, sizeof where);
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [cluster] min_workers = %d is more than workers = %d (the job "
                           "starts with `workers`)",
                           where, cfg->min_workers, cfg->n_workers);
    }
    if (cfg->max_workers < cfg->n_workers) {
        key_origin(st, "cluster", "max_workers", where, sizeof where);
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [cluster] max_workers = %d is less than workers = %d", where,
                           cfg->max_workers, cfg->n_workers);
    }
    return PSAGG_OK;
}

/* Servers that fail: fewer replicas than servers, at most 63. */
static psagg_status check_replicas(const struct load_state *st)
{
    const psagg__config *cfg = st->cfg;
    char where[300];

    if (!cfg->server_replicas)
        return PSAGG_OK;
    key_origin(st, "cluster", "server_replicas", where, sizeof where);
    if (cfg->server_replicas >= cfg->n_servers)
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [cluster] server_replicas = %d needs more than %d servers (a "
                           "chunk's owner and its replicas are different servers)",
                           where, cfg->server_replicas, cfg->n_servers);
    if (cfg->server_replicas > 63)
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [cluster] server_replicas = %d: at most 63 (a worker records "
                           "which of a chunk's servers a push went to in 64 bits)",
                           where, cfg->server_replicas);
    /* a takeover relays a chunk's update, and a return its state (a parameter chunk's
       weights, its view and the optimizer's arrays; a residual), each in one control frame;
       the update is bounded by the widest codec's */
    {
        psagg__optim opt = {.kind = (psagg__optim_kind)cfg->optimizer, .momentum = cfg->momentum};
        uint64_t arrays = cfg->optimizer ? 2 + (uint64_t)psagg__optim_state_arrays(&opt)
                          : cfg->server_error_feedback ? 1
                                                       : 0;
        uint64_t fixed =
            sizeof(psagg__ctl_state) + psagg__max_message(cfg) + ((uint64_t)cfg->n_workers + 7) / 8;
        if (fixed + arrays * cfg->chunk_bytes > PSAGG_CTL_MAX_FRAME) {
            /* (the update is about chunk_bytes and its headers: a value under this fits) */
            uint64_t other = fixed - 4 * psagg__chunk_elems(cfg) + 8192;
            char at[300];
            key_origin(st, "worker", "chunk_bytes", at, sizeof at);
            return psagg__fail(PSAGG_ECONFIG,
                               "%s: [worker] chunk_bytes = %" PRIu64 " with [cluster] "
                               "server_replicas (%s): a takeover relays a chunk's update%s in "
                               "one control frame of at most %u bytes; set chunk_bytes to at "
                               "most %" PRIu64,
                               at, cfg->chunk_bytes, where,
                               cfg->optimizer ? ", and a server that comes back receives its "
                                                "weights and optimizer state,"
                               : arrays ? ", and a server that comes back receives its residual,"
                                        : "",
                               PSAGG_CTL_MAX_FRAME,
                               (PSAGG_CTL_MAX_FRAME - other) / (arrays + 1) / 4096 * 4096);
        }
    }
    return PSAGG_OK;
}

/* Straggler tolerance: 1 <= quorum <= workers. */
static psagg_status check_quorum(const struct load_state *st)
{
    const psagg__config *cfg = st->cfg;
    char where[300];

    if (!cfg->quorum)
        return PSAGG_OK;
    key_origin(st, "server", "quorum", where, sizeof where);
    if (cfg->quorum > cfg->n_workers)
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [server] quorum = %d is more than workers = %d (a round never "
                           "has more pushes than workers)",
                           where, cfg->quorum, cfg->n_workers);
    return PSAGG_OK;
}

/* The default codec with its bucket and rounding (thc: a power-of-two block, stochastic). */
static psagg_status check_codec(const struct load_state *st)
{
    psagg_codec c = st->cfg->codec;
    char where[300];
    if (!psagg__codec_check(&c))
        return PSAGG_OK;
    key_origin(st, "codec", c.rounding != PSAGG_ROUND_STOCHASTIC ? "rounding" : "bucket", where,
               sizeof where);
    return psagg__fail_context(PSAGG_ECONFIG, "%s: [codec] default = %s%u with this %s: ", where,
                               c.id == PSAGG_CODEC_THC ? "thc" : "maxmin", c.bits,
                               c.rounding != PSAGG_ROUND_STOCHASTIC ? "rounding" : "bucket");
}

/*
 * What composes (runtime/features.h): a pair of features the table refuses is an error at
 * the origin of its first key, naming both and why.
 */
static psagg_status check_features(const struct load_state *st)
{
    const psagg__combo *c = psagg__features_refused(st->cfg);
    const psagg__feature *a, *b;
    char where[300];
    if (!c)
        return PSAGG_OK;
    a = &psagg__features[c->a];
    b = &psagg__features[c->b];
    key_origin(st, a->section, a->key, where, sizeof where);
    return psagg__fail(PSAGG_ECONFIG, "%s: %s does not work with %s yet (%s; docs/features.md)",
                       where, a->spelled, b->spelled, c->why);
}

/* The optimizer's keys that only make sense together. */
static psagg_status check_optimizer(const struct load_state *st)
{
    const psagg__config *cfg = st->cfg;
    char where[300];

    if (cfg->nesterov && cfg->optimizer == PSAGG_OPTIM_SGD &&
        (cfg->momentum == 0.0f || cfg->dampening != 0.0f)) {
        key_origin(st, "server", "nesterov", where, sizeof where);
        return psagg__fail(PSAGG_ECONFIG,
                           "%s: [server] nesterov = on needs momentum > 0 and dampening = 0 (as "
                           "torch.optim.SGD)",
                           where);
    }
    if (cfg->resume && !cfg->checkpoint_dir[0]) {
        key_origin(st, "server", "resume", where, sizeof where);
        return psagg__fail(PSAGG_ECONFIG, "%s: [server] resume = on needs [server] checkpoint_dir",
                           where);
    }
    return PSAGG_OK;
}

/*
 * Defaults, file, environment, required keys. On failure *cfg holds partial values and
 * psagg_last_error() says where ("path:line: ..." or "env PSAGG_X: ...") and what.
 */
psagg_status psagg__config_load(const char *path, psagg__config *cfg)
{
    struct load_state *st;
    int rc;

    if (!path || !cfg)
        return psagg__fail(PSAGG_EINVAL, "psagg__config_load: path and cfg are required");
    config_set_defaults(cfg);
    if (strlen(path) >= sizeof cfg->path)
        return psagg__fail(PSAGG_ECONFIG, "%s: config path longer than %zu characters", path,
                           sizeof cfg->path - 1);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);

    st = calloc(1, sizeof *st);
    if (!st)
        return psagg__fail(PSAGG_ENOMEM, "%s: out of memory", path);
    st->cfg = cfg;
    rc = load_file(st, path);
    if (rc)
        goto out;
    rc = apply_env(st);
    if (rc)
        goto out;
    for (size_t i = 0; i < config_n_keys; i++) {
        if ((config_keys[i].flags & KEY_REQUIRED) && !st->set_line[i] && !st->env_set[i]) {
            char name[128];
            env_name(&config_keys[i], name, sizeof name);
            rc = psagg__fail(PSAGG_ECONFIG, "%s: missing required key '%s' in [%s] (or env %s)",
                             path, config_keys[i].name, config_keys[i].section, name);
            goto out;
        }
    }
    rc = check_secret(st);
    if (!rc)
        rc = check_worker_hosts(st);
    if (!rc)
        rc = check_optimizer(st);
    if (!rc)
        rc = check_elastic(st);
    if (!rc)
        rc = check_quorum(st);
    if (!rc)
        rc = check_replicas(st);
    if (!rc)
        rc = check_codec(st);
    if (!rc)
        rc = check_features(st);
    key_origin(st, "cluster", "servers", cfg->servers_where, sizeof cfg->servers_where);
out:
    free(st);
    return rc;
}

psagg_status psagg__config_check_addresses(const psagg__config *cfg)
{
    for (int i = 0; i < cfg->n_servers; i++) {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        char port[16];
        int rc;
        snprintf(port, sizeof port, "%u", cfg->servers[i].port);
        rc = getaddrinfo(cfg->servers[i].host, port, &hints, &res);
        if (rc)
            return psagg__fail(PSAGG_ECONFIG,
                               "%s: [cluster] servers: server %d '%s' does not resolve here: %s",
                               cfg->servers_where, i, cfg->servers[i].host,
                               rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        freeaddrinfo(res);
    }
    return PSAGG_OK;
}

/* ---- printing the resolved config ---- */

void psagg__config_print(const psagg__config *cfg, FILE *to)
{
    for (size_t i = 0; i < config_n_keys; i++) {
        char value[PSAGG_MAX_SERVERS * (PSAGG_HOST_MAX + 9) + 1];
        config_format_value(cfg, &config_keys[i], value, sizeof value);
        fprintf(to, "%s.%s = %s\n", config_keys[i].section, config_keys[i].name, value);
    }
}
