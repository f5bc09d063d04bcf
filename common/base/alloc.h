/*
 * base/alloc.h - psagg's buffers come from jemalloc: cache-line aligned, and each aggregation
 * thread can take an arena of its own so threads never contend on one allocator lock.
 *
 * Layer: base.
 */
#ifndef PSAGG_BASE_ALLOC_H
#define PSAGG_BASE_ALLOC_H

#include <stddef.h>

#define PSAGG_ALIGN 64

/* size bytes aligned to PSAGG_ALIGN (zeroed if zero != 0), from the calling thread's arena. */
void *psagg_alloc(size_t size, int zero);
void psagg_free(void *p);
/* Give the calling thread a jemalloc arena of its own; 0 on success. */
int psagg_alloc_thread_arena(void);

#endif
