/*
 * runtime/rxpool.h - a pool of registered receive buffers kept posted on a fabric endpoint.
 *
 * Layer: runtime. Server and worker both receive every data message into one of these: each
 * buffer is allocated and registered once, posted, and reposted after its message has been
 * used, so the steady state allocates nothing. A pool element may be larger than a
 * psagg__rxbuf (elem_size), with the psagg__rxbuf first, so an owner can keep its own
 * per-buffer state beside it (the server's aggregation queue entry).
 */
#ifndef PSAGG_RUNTIME_RXPOOL_H
#define PSAGG_RUNTIME_RXPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "runtime/transport.h"

typedef struct psagg__rxbuf {
    uint8_t *buf; /* size bytes, registered with the pool's fabric */
    void *desc;
    size_t size;
    size_t len; /* bytes of the message last received (the owner sets it on completion) */
} psagg__rxbuf;

typedef struct psagg__rxpool {
    psagg__fabric *fab;
    uint8_t *elems; /* count elements of elem_size bytes, each starting with a psagg__rxbuf */
    size_t elem_size;
    int count;
} psagg__rxpool;

/* How many buffers of `size` bytes to post: `want`, within `budget` bytes, and at least 8. */
int psagg__rxpool_count(int want, size_t size, uint64_t budget);

/*
 * Allocate, register and post `count` buffers of `size` bytes, in elements of elem_size
 * (>= sizeof(psagg__rxbuf)) zeroed bytes. Each receive completes with its psagg__rxbuf as the
 * context. On failure *p can be passed to psagg__rxpool_destroy.
 */
PSAGG_NODISCARD psagg_status psagg__rxpool_create(psagg__rxpool *p, psagg__fabric *f, int count,
                                                  size_t size, size_t elem_size);

/* Buffer i of the pool. */
psagg__rxbuf *psagg__rxpool_at(const psagg__rxpool *p, int i);

/* Post b again once its message has been used. */
PSAGG_NODISCARD psagg_status psagg__rxpool_repost(const psagg__rxpool *p, psagg__rxbuf *b);

/* Free the buffers (after psagg__fabric_close, which cancels what is still posted). */
void psagg__rxpool_destroy(psagg__rxpool *p);

#endif
