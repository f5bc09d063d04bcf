/* base/alloc.c - see base/alloc.h. */
#include "base/alloc.h"

#include <jemalloc/jemalloc.h>

static _Thread_local unsigned thread_arena; /* 0: jemalloc's automatic choice */

int psagg_alloc_thread_arena(void)
{
    unsigned arena;
    size_t sz = sizeof arena;
    if (mallctl("arenas.create", &arena, &sz, NULL, 0) != 0)
        return -1;
    thread_arena = arena + 1;
    return 0;
}

void *psagg_alloc(size_t size, int zero)
{
    int flags = MALLOCX_ALIGN(PSAGG_ALIGN) | (zero ? MALLOCX_ZERO : 0);
    if (thread_arena)
        flags |= MALLOCX_ARENA(thread_arena - 1);
    return mallocx(size ? size : 1, flags);
}

void psagg_free(void *p)
{
    if (p)
        dallocx(p, 0);
}
