/* arena.c - see arena.h. */
#include "arena.h"

#include <jemalloc/jemalloc.h>
#include <string.h>

/*
 * jemalloc's options for the whole server process (read by jemalloc at start-up; MALLOC_CONF
 * in the environment still adds to them). Never return freed pages to the system: a job's
 * buffers (ours, and the ones libfabric allocates and frees per message) are reused round
 * after round, and pages given back by jemalloc's decay came back as page faults with a kernel
 * clear of every page (about 600 faults a step, in bursts, on a ResNet-50 fp32 server). The
 * price is that the server keeps its peak footprint until it exits.
 */
const char *malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";

/* The calling aggregation thread's arena + 1 (0: jemalloc's automatic choice). A server is
 * an executable, so this thread-local is its own state, not a library's. */
static _Thread_local unsigned thread_arena;

int arena_thread_init(void)
{
    unsigned arena;
    size_t sz = sizeof arena;
    if (mallctl("arenas.create", &arena, &sz, NULL, 0) != 0)
        return -1;
    thread_arena = arena + 1;
    return 0;
}

void *arena_alloc(size_t size)
{
    int flags = MALLOCX_ALIGN(64);
    void *p;
    if (thread_arena)
        flags |= MALLOCX_ARENA(thread_arena - 1);
    p = mallocx(size ? size : 1, flags);
    /*
     * Zeroed by writing every page: fresh pages that jemalloc knows are zero (MALLOCX_ZERO
     * skips them) would otherwise fault in one by one during the job's first rounds, and on
     * whichever thread touched them first. Here they fault once, at start-up.
     */
    if (p)
        memset(p, 0, size);
    return p;
}

void arena_free(void *p)
{
    if (p)
        dallocx(p, 0);
}
