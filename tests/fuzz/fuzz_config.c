/*
 * fuzz_config.c - the INI parser and its environment overrides (runtime/config.c).
 *
 * Input: an INI file, then optionally a NUL and lines NAME=VALUE, each set as the environment
 * variable PSAGG_NAME for the load (PSAGG_CLUSTER_WORKERS=3 and so on).
 * Properties: a load never crashes, leaks or reads out of bounds; a refusal has a message
 * naming the file or the variable; an accepted config is within its documented limits, and
 * printing it (psagg__config_print, what --check-config shows) and loading the printout again
 * gives the same config.
 */
#include <ini.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "fuzz.h"
#include "runtime/config.h"

#define MAX_ENV 8

static char ini_path[64], again_path[64];
static char env_names[MAX_ENV][64];
static int n_env;

static void remove_files(void)
{
    unlink(ini_path);
    unlink(again_path);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, len, f) == len && fclose(f) == 0, "cannot write %s", path);
}

/* psagg__config_print into a malloc'd string */
static char *print_config(const psagg__config *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f, "open_memstream");
    psagg__config_print(cfg, f);
    fclose(f);
    return text;
}

/*
 * One "key = value" line, or for servers (the one key that may span lines) as many as its
 * addresses need: each line of an INI file holds at most INI_MAX_LINE - 2 characters. 0 if the
 * value cannot be written so (one address, or another key's value, longer than a line).
 */
static int write_key(FILE *f, const char *key, size_t klen, const char *value, size_t vlen)
{
    const size_t max = INI_MAX_LINE - 2;
    int lines = klen == 7 && !strncmp(key, "servers", 7), first = 1;
    size_t used = (size_t)fprintf(f, "%.*s =", (int)klen, key);
    while (vlen) {
        size_t n = lines ? strcspn(value, " ") : vlen;
        if (n > vlen)
            n = vlen;
        if (used + 1 + n > max) {
            if (!lines || first || 2 + n > max)
                return 0;
            fputs("\n ", f);
            used = 1;
        }
        used += (size_t)fprintf(f, " %.*s", (int)n, value);
        first = 0;
        value += n;
        vlen -= n;
        while (vlen && *value == ' ')
            value++, vlen--;
    }
    fputc('\n', f);
    return 1;
}

/* The printout as an INI file: "sec.key = value" lines under [sec] headers. 0 if it cannot
 * be one (a value that INI would read differently: comment characters, edge spaces, a value
 * longer than a line). */
static int printout_to_ini(const char *text, const char *path)
{
    FILE *f = fopen(path, "w");
    char section[32] = "";
    const char *line = text;
    CHECK(f, "cannot write %s", path);
    while (*line) {
        const char *end = strchr(line, '\n'), *dot = strchr(line, '.'), *eq = strstr(line, " = ");
        const char *value;
        size_t vlen;
        CHECK(end && dot && eq && dot < eq && eq < end, "printout line: %.*s",
              (int)(end ? end - line : 20), line);
        value = eq + 3;
        vlen = (size_t)(end - value);
        if (vlen && (memchr(value, ';', vlen) || memchr(value, '#', vlen) || value[0] == ' ' ||
                     value[vlen - 1] == ' ' || memchr(value, '\r', vlen))) {
            fclose(f);
            return 0;
        }
        if ((size_t)(dot - line) >= sizeof section ||
            strncmp(section, line, (size_t)(dot - line)) || section[dot - line]) {
            snprintf(section, sizeof section, "%.*s", (int)(dot - line), line);
            fprintf(f, "[%s]\n", section);
        }
        if (vlen && /* an empty value is the default: leave the key out */
            !write_key(f, dot + 1, (size_t)(eq - dot - 1), value, vlen)) {
            fclose(f);
            return 0;
        }
        line = end + 1;
    }
    fclose(f);
    return 1;
}

static void clear_env(void)
{
    for (int i = 0; i < n_env; i++)
        unsetenv(env_names[i]);
    n_env = 0;
}

/* NAME=VALUE lines -> PSAGG_NAME=VALUE (at most MAX_ENV; names of [A-Z0-9_]) */
static void set_env(const uint8_t *p, size_t len)
{
    const uint8_t *end = p + len;
    while (p < end && n_env < MAX_ENV) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p)), *eq;
        size_t n;
        char name[64], value[512];
        if (!nl)
            nl = end;
        eq = memchr(p, '=', (size_t)(nl - p));
        n = eq ? (size_t)(eq - p) : 0;
        if (eq && n > 0 && n < 40 && (size_t)(nl - eq - 1) < sizeof value) {
            int ok = 1;
            for (size_t i = 0; i < n; i++)
                ok &= (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '_';
            memcpy(value, eq + 1, (size_t)(nl - eq - 1));
            value[nl - eq - 1] = '\0';
            if (ok && !memchr(value, '\0', (size_t)(nl - eq - 1))) {
                snprintf(name, sizeof name, "PSAGG_%.*s", (int)n, (const char *)p);
                setenv(name, value, 1);
                snprintf(env_names[n_env++], sizeof env_names[0], "%s", name);
            }
        }
        p = nl + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t ini_len = nul ? (size_t)(nul - data) : size;
    psagg__config *cfg = malloc(sizeof *cfg), *again = malloc(sizeof *again);
    psagg_status st;

    if (!ini_path[0]) {
        snprintf(ini_path, sizeof ini_path, "/tmp/psagg-fuzz-config-%d.ini", (int)getpid());
        snprintf(again_path, sizeof again_path, "/tmp/psagg-fuzz-config-%d-again.ini",
                 (int)getpid());
        atexit(remove_files);
    }
    CHECK(cfg && again, "memory");
    write_file(ini_path, data, ini_len);
    if (nul)
        set_env(nul + 1, size - ini_len - 1);
    st = psagg__config_load(ini_path, cfg);
    clear_env();
    if (st) {
        const char *msg = psagg_last_error();
        CHECK(st == PSAGG_ECONFIG || st == PSAGG_ENOMEM, "status %d: %s", st, msg);
        CHECK(!strncmp(msg, ini_path, strlen(ini_path)) || !strncmp(msg, "env PSAGG_", 10),
              "a refusal that names neither the file nor the variable: %s", msg);
    } else {
        char *text = print_config(cfg);
        CHECK(cfg->n_servers >= 1 && cfg->n_servers <= PSAGG_MAX_SERVERS, "n_servers %d",
              cfg->n_servers);
        CHECK(cfg->n_workers >= 1 && cfg->n_workers <= PSAGG_MAX_WORKERS, "n_workers %d",
              cfg->n_workers);
        CHECK(cfg->op_timeout_ms >= 100 && cfg->connect_timeout_ms >= 1, "timeouts");
        CHECK(cfg->chunk_bytes >= 4096 && cfg->chunk_bytes % 256 == 0, "chunk_bytes");
        CHECK(!cfg->data_auth || cfg->secret_file[0], "data_auth without a secret");
        for (int i = 0; i < cfg->n_servers; i++)
            CHECK(cfg->servers[i].host[0] && cfg->servers[i].port, "server %d", i);
        /* what --check-config prints loads back to the same config */
        if (printout_to_ini(text, again_path)) {
            char *text2;
            st = psagg__config_load(again_path, again);
            CHECK(st == PSAGG_OK, "the printout does not load: %s\n%s", psagg_last_error(), text);
            text2 = print_config(again);
            CHECK(!strcmp(text, text2), "the printout loads differently:\n%s\n---\n%s", text,
                  text2);
            free(text2);
        }
        free(text);
    }
    free(cfg);
    free(again);
    return 0;
}
