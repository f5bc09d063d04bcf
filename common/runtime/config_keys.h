/*
 * runtime/config_keys.h - the table of configuration keys and what their values mean, shared
 * by config.c (reading the INI file and the environment, checks across keys, printing) and
 * config_keys.c (the table, the defaults, the per-type value parsers and formatters).
 * Layer: runtime. INTERNAL: included by runtime/config*.c only (the API is runtime/config.h).
 */
#ifndef PSAGG_RUNTIME_CONFIG_KEYS_H
#define PSAGG_RUNTIME_CONFIG_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/config.h"

struct key;
/* Parse `val` into the key's field; on failure write what was expected into `why`. */
typedef int (*key_parser)(const struct key *k, const char *val, int append, psagg__config *cfg,
                          char *why, size_t whylen);

enum {
    KEY_REQUIRED = 1, /* psagg__config_load fails without it */
    KEY_LINES = 2,    /* the value may continue on indented lines (servers) */
};

struct key {
    const char *section;
    const char *name;
    size_t offset; /* of the field in psagg__config */
    size_t size;   /* of the field (string capacity) */
    key_parser parse;
    uint64_t min, max;          /* numbers: inclusive range */
    uint64_t multiple;          /* numbers: must be a multiple of this (0: any) */
    double fmin, fmax;          /* reals (float fields): inclusive range */
    const char *const *choices; /* enums: names, index = stored value; NULL-terminated */
    const int *values;          /* enums: value stored for each choice (NULL: the index) */
    int flags;
};

/* Room for per-key bookkeeping in config.c (a static assert in config_keys.c keeps it true). */
#define CONFIG_KEYS_MAX   64
#define CONFIG_N_SECTIONS 5

/* Every key, in the order of conf/cluster.ini (psagg__config_print's order). */
extern const struct key config_keys[];
extern const size_t config_n_keys;
/* The sections a file may have: cluster, server, worker, codec, log. */
extern const char *const config_sections[];

void config_set_defaults(psagg__config *cfg);
/* One key's value as the INI would spell it (psagg__config_print). */
void config_format_value(const psagg__config *cfg, const struct key *k, char *out, size_t len);

#endif
