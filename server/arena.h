/*
 * arena.h - the aggregation threads' buffers: each thread takes a jemalloc arena of its own
 * and allocates its chunks' buffers from it, so threads never contend on one allocator lock
 * and each chunk's memory stays with the thread that touches it. The server executable links
 * jemalloc; the libraries use base/alloc.h.
 *
 * Layer: server.
 */
#ifndef PSAGG_SERVER_ARENA_H
#define PSAGG_SERVER_ARENA_H

#include <stddef.h>

/* Give the calling thread a jemalloc arena of its own; 0 on success. */
int arena_thread_init(void);
/*
 * size bytes, 64-byte aligned, from the calling thread's arena: zeroed by writing them, so
 * their pages fault in now (start-up) rather than in the job's first rounds.
 */
void *arena_alloc(size_t size);
/* Free what arena_alloc returned (from any thread). */
void arena_free(void *p);

#endif
