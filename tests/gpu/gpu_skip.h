/*
 * gpu_skip.h - what a GPU test does when CUDA finds no usable device: skip (exit 77) on a host
 * without an NVIDIA device node, fail (exit 1, saying so) on a host that has one (the driver
 * or the runtime is broken there, and a skip would hide it).
 */
#ifndef PSAGG_TESTS_GPU_SKIP_H
#define PSAGG_TESTS_GPU_SKIP_H

#include <glob.h>
#include <stdio.h>

static inline int gpu_absent_exit(const char *test, const char *why)
{
    glob_t g;
    int nodes = glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    if (nodes)
        globfree(&g);
    if (!nodes) {
        printf("SKIP: %s: no CUDA device on this host (%s)\n", test, why);
        return 77;
    }
    fprintf(stderr,
            "FAIL: %s: this host has %d NVIDIA device node(s) (/dev/nvidia*), but CUDA finds no "
            "usable device (%s): the driver or the CUDA runtime is broken\n",
            test, nodes, why);
    return 1;
}

#endif
