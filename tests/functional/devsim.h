/*
 * devsim.h - a simulated device for the tests: an executor (worker/devexec.h) with CUDA's
 * asynchronous contract on the CPU, so the device path's ordering logic (worker/device.c) is
 * tested here exactly as it runs on a GPU.
 *
 * "Device" and "pinned" memory are host memory. Each stream is a queue drained by a thread of
 * its own, which waits `delay_ms` before each piece of work; events fire when the work before
 * them has run. The codecs are the CPU's (same bytes as the GPU's). The simulator checks, when
 * each piece of work runs, that every buffer it touches is live (allocated and not freed: a
 * buffer freed by its owner while work on it was still queued is a violation, and the work is
 * skipped) and, when it is enqueued, that the calling thread's current device is the
 * stream's and the memory is that device's. Enqueues, allocations and stream creation fail
 * on demand; a hook runs before the nth enqueue. Tests only; not thread-safe to configure
 * while work runs except where said.
 */
#ifndef PSAGG_TESTS_DEVSIM_H
#define PSAGG_TESTS_DEVSIM_H

#include <stddef.h>

#include "devexec.h"

void devsim_init(int n_devices, int delay_ms);
const psagg__devexec *devsim_exec(void);
void devsim_set_delay(int delay_ms);

/* The caller's device buffers and streams (the library's come through the executor). */
void *devsim_user_alloc(int device, size_t bytes);
void devsim_user_free(void *p);
void *devsim_user_stream(int device);

/* The nth enqueue / allocation from now (1: the next) fails; 0 cancels. */
void devsim_fail_enqueue(long nth);
void devsim_fail_alloc(long nth);
void devsim_fail_stream_create(int on);
/* Run fn(arg) on the enqueuing thread before the nth enqueue from now. */
void devsim_on_enqueue(long nth, void (*fn)(void *), void *arg);
/* The next host-to-device copy writes NaN bytes over the start of what it copied. */
void devsim_corrupt_next_upload(void);

long devsim_enqueues(void);   /* enqueues so far */
long devsim_lib_allocs(void); /* live allocations made through the executor */
size_t devsim_lib_bytes(void);
void devsim_quiesce(void); /* wait until every stream is idle */
/* Violations so far (each printed to stderr when it happened). */
int devsim_violations(void);

#endif
