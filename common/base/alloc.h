/*
 * base/alloc.h - psagg's buffers: cache-line aligned, from the C library, so that a library
 * built on the base layer (libpsagg above all) never brings its own allocator into its host
 * process. psagg-server keeps per-thread jemalloc arenas for its aggregation buffers in its
 * own executable (server/arena.c).
 *
 * Layer: base.
 */
#ifndef PSAGG_BASE_ALLOC_H
#define PSAGG_BASE_ALLOC_H

#include <stddef.h>

#define PSAGG_ALIGN 64

/* size bytes aligned to PSAGG_ALIGN (zeroed if zero != 0); NULL when out of memory. */
void *psagg__alloc(size_t size, int zero);
void psagg__free(void *p);

#endif
