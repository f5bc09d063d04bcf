/*
 * runtime/features.h - what composes: psagg's opt-in features, and for every pair of them
 * whether they work together or are refused, and why. One table (features.c), read by the
 * config check (a refused pair is an error at the file:line of its first key, naming both and
 * why: psagg_features_check) and printed by `psagg-server --features` as the table of
 * docs/features.md (lint.docs compares the two). A pair not in the table works.
 *
 * Layer: runtime.
 */
#ifndef PSAGG_RUNTIME_FEATURES_H
#define PSAGG_RUNTIME_FEATURES_H

#include <stdio.h>

#include "runtime/config.h"

typedef enum psagg__feature_id {
    PSAGG_F_ELASTIC,    /* [cluster] elastic = on */
    PSAGG_F_QUORUM,     /* [server] quorum */
    PSAGG_F_CHECKPOINT, /* [server] checkpoint_dir */
    PSAGG_F_OPTIMIZER,  /* [server] optimizer */
    PSAGG_F_ADAPTIVE,   /* [codec] adaptive = on */
    PSAGG_F_DEVICE,     /* psagg_push_pull_cuda (checked at the call) */
    PSAGG_F_REPLICAS,   /* [cluster] server_replicas */
    PSAGG_F_COUNT
} psagg__feature_id;

typedef struct psagg__feature {
    const char *name;    /* "elastic" */
    const char *section; /* its config key ("cluster", "elastic"), or NULL: an API call */
    const char *key;
    const char *spelled;                /* how a message names it: "[cluster] elastic = on" */
    int (*on)(const psagg__config *cfg); /* whether cfg turns it on (NULL: decided at a call) */
} psagg__feature;

/* A pair's verdict: works (refused = 0, with what the pair does, or NULL), or refused. */
typedef struct psagg__combo {
    psagg__feature_id a, b;
    int refused;
    const char *why; /* refused: why not yet; works: how the two meet (one sentence) */
} psagg__combo;

extern const psagg__feature psagg__features[PSAGG_F_COUNT];
extern const psagg__combo psagg__combos[];
extern const size_t psagg__n_combos;

/* The verdict of a pair (in either order), or NULL: not in the table, it works. */
const psagg__combo *psagg__combo_of(psagg__feature_id a, psagg__feature_id b);

/*
 * The first refused pair that cfg turns on, or NULL. The config check reports it at the
 * origin of the pair's first key.
 */
const psagg__combo *psagg__features_refused(const psagg__config *cfg);

/* The table as Markdown (docs/features.md): one row per feature, one column per feature. */
void psagg__features_print(FILE *out);

#endif
