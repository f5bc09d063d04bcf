/* runtime/rxpool.c - see runtime/rxpool.h. */
#include "runtime/rxpool.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

int psagg__rxpool_count(int want, size_t size, uint64_t budget)
{
    if (size && (uint64_t)want * size > budget)
        want = (int)(budget / size);
    return want < 8 ? 8 : want;
}

psagg__rxbuf *psagg__rxpool_at(const psagg__rxpool *p, int i)
{
    return (psagg__rxbuf *)(void *)(p->elems + (size_t)i * p->elem_size);
}

psagg_status psagg__rxpool_create(psagg__rxpool *p, psagg__fabric *f, int count, size_t size,
                                  size_t elem_size)
{
    psagg_status st;

    *p = (psagg__rxpool){.fab = f, .elem_size = elem_size, .count = 0};
    if (count <= 0 || size == 0 || elem_size < sizeof(psagg__rxbuf))
        return psagg__fail(PSAGG_EINVAL, "receive pool: %d buffers of %zu bytes", count, size);
    p->elems = calloc((size_t)count, elem_size);
    if (!p->elems)
        return psagg__fail(PSAGG_ENOMEM, "receive pool of %d buffers", count);
    for (int i = 0; i < count; i++) {
        psagg__rxbuf *b = psagg__rxpool_at(p, i);
        b->size = size;
        b->buf = psagg__alloc(size, 0);
        if (!b->buf)
            return psagg__fail(PSAGG_ENOMEM, "receive buffers of %zu bytes", size);
        /* fault every page in now: the receive path must not take first-touch page faults
           (a kernel TCP copy into a fresh page clears it first) in the middle of a job */
        memset(b->buf, 0, size);
        p->count = i + 1;
        if ((st = psagg__fabric_reg(f, b->buf, size, &b->desc)) ||
            (st = psagg__fabric_post_recv(f, b->buf, size, b->desc, b)))
            return st;
    }
    return PSAGG_OK;
}

psagg_status psagg__rxpool_repost(const psagg__rxpool *p, psagg__rxbuf *b)
{
    return psagg__fabric_post_recv(p->fab, b->buf, b->size, b->desc, b);
}

void psagg__rxpool_destroy(psagg__rxpool *p)
{
    for (int i = 0; p->elems && i < p->count; i++)
        psagg__free(psagg__rxpool_at(p, i)->buf);
    free(p->elems);
    memset(p, 0, sizeof *p);
}
