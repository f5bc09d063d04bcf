/* base/alloc.c - see base/alloc.h. */
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

void *psagg__alloc(size_t size, int zero)
{
    size_t bytes = (size + PSAGG_ALIGN - 1) & ~(size_t)(PSAGG_ALIGN - 1);
    void *p = aligned_alloc(PSAGG_ALIGN, bytes ? bytes : PSAGG_ALIGN);
    if (p && zero)
        memset(p, 0, bytes);
    return p;
}

void psagg__free(void *p)
{
    free(p);
}
