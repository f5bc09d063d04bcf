/*
 * runtime/rxpool.h - a pool of registered receive buffers kept posted on a fabric endpoint.
 *
 * Layer: runtime. Server and worker both receive every data message into one of these: each
 * buffer is allocated and registered once, posted, and reposted after its message has been
 * used, so the steady state allocates nothing. A pool element may be larger than a
 * psagg_rxbuf (elem_size), with the psagg_rxbuf first, so an owner can keep its own
 * per-buffer state beside it (the server's aggregation queue entry).
 */
#ifndef PSAGG_RUNTIME_RXPOOL_H
#define PSAGG_RUNTIME_RXPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "runtime/transport.h"

typedef struct psagg_rxbuf {
    uint8_t *buf; /* size bytes, registered with the pool's fabric */
    void *desc;
    size_t size;
    size_t len; /* bytes of the message last received (the owner sets it on completion) */
} psagg_rxbuf;

typedef struct psagg_rxpool {
    psagg_fabric *fab;
    uint8_t *elems; /* count elements of elem_size bytes, each starting with a psagg_rxbuf */
    size_t elem_size;
    int count;
} psagg_rxpool;

/* How many buffers of `size` bytes to post: `want`, within `budget` bytes, and at least 8. */
int psagg_rxpool_count(int want, size_t size, uint64_t budget);

/*
 * Allocate, register and post `count` buffers of `size` bytes, in elements of elem_size
 * (>= sizeof(psagg_rxbuf)) zeroed bytes. Each receive completes with its psagg_rxbuf as the
 * context. On failure *p can be passed to psagg_rxpool_destroy.
 */
PSAGG_NODISCARD psagg_status psagg_rxpool_create(psagg_rxpool *p, psagg_fabric *f, int count,
                                                 size_t size, size_t elem_size);

/* Buffer i of the pool. */
psagg_rxbuf *psagg_rxpool_at(const psagg_rxpool *p, int i);

/* Post b again once its message has been used. */
PSAGG_NODISCARD psagg_status psagg_rxpool_repost(const psagg_rxpool *p, psagg_rxbuf *b);

/* Free the buffers (after psagg_fabric_close, which cancels what is still posted). */
void psagg_rxpool_destroy(psagg_rxpool *p);

#endif
