/*
 * devexec.h - what libpsagg's device path (device.c: psagg_push_pull_cuda and its buffer
 * operations) needs from a device: an executor.
 *
 * device.c holds the ordering logic, once: which work goes on which stream in which order,
 * which event says what is done, when a handle may complete, what a failure at each step
 * undoes. An executor only runs it. There are two: the CUDA runtime (cuda.c, in builds with
 * CUDA) and a simulator for the tests (tests/functional/devsim.c: host memory, one thread per
 * stream that runs each piece of work after a delay, enqueues that fail on demand, and a check
 * of every pointer a piece of work touches against the live allocations), so the lifetime and
 * ordering rules tested on a CPU are the ones a GPU runs.
 *
 * The executor's contract is CUDA's: work enqueued on a stream runs later, in the order it was
 * enqueued; an event recorded on a stream fires when the work before it has run;
 * stream_wait_event makes a stream's later work wait for an event. Device and pinned memory
 * are addressed by pointers (unified addressing: copy needs no direction). An enqueue or an
 * allocation that fails returns a negative psagg_status with its message set (psagg__fail)
 * and enqueues nothing; work enqueued before it stays queued. Every call acts on the calling
 * thread's current device (get_device/set_device), as CUDA's do.
 */
#ifndef PSAGG_WORKER_DEVEXEC_H
#define PSAGG_WORKER_DEVEXEC_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/codec.h"
#include "psagg.h"

typedef struct psagg__devexec {
    const char *name; /* "cuda", "devsim" */
    /* the calling thread's current device, and the device that holds device memory p
       (PSAGG_EINVAL when p is not device memory) */
    psagg_status (*get_device)(int *dev);
    psagg_status (*set_device)(int dev);
    psagg_status (*device_of)(const void *p, int *dev);
    /* memory on the current device, and pinned host memory */
    psagg_status (*dev_alloc)(void **p, size_t bytes);
    psagg_status (*host_alloc)(void **p, size_t bytes);
    void (*dev_free)(void *p);
    void (*host_free)(void *p);
    /* streams and events (of the current device) */
    psagg_status (*stream_create)(void **stream);
    void (*stream_destroy)(void *stream);
    psagg_status (*stream_sync)(void *stream); /* every piece of work enqueued on it has run */
    psagg_status (*event_create)(void **event);
    void (*event_destroy)(void *event);
    psagg_status (*event_record)(void *event, void *stream);
    psagg_status (*stream_wait_event)(void *stream, void *event);
    /* PSAGG_OK fired (or never recorded), PSAGG_BUF_PENDING not yet, or a failure */
    psagg_status (*event_query)(void *event);
    /* work: bytes; a byte value; the codecs (codec_cuda.h's contract, error words included) */
    psagg_status (*copy)(void *dst, const void *src, size_t bytes, void *stream);
    psagg_status (*fill)(void *dst, int byte, size_t bytes, void *stream);
    psagg_status (*encode)(const psagg_codec *codec, const float *x, float *residual, size_t n,
                           psagg__rng_key key, void *out, size_t out_len, uint64_t *d_err,
                           void *stream);
    psagg_status (*decode)(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                           float *out, uint64_t *d_err, void *stream);
    psagg_status (*scale)(float *x, size_t n, float s, void *stream);
    /* thc (codec_cuda.h's psagg__cuda_thc_push_encode and psagg__cuda_thc_update_decode): a
       push at the blocks' scales (device memory), an update's decode as op says */
    psagg_status (*thc_encode)(const psagg_codec *codec, psagg__rng_key rot, const float *scales,
                               const float *x, float *residual, size_t n, psagg__rng_key key,
                               void *out, size_t out_len, uint64_t *d_err, void *stream);
    psagg_status (*thc_decode)(const psagg_codec *codec, psagg__rng_key rot, const void *in,
                               size_t in_len, size_t n, float factor, psagg__decode_op op,
                               float *out, uint64_t *d_err, void *stream);
    /* an error word read back (all bytes 0xFF: none) as a status and the chunk-local index */
    psagg_status (*err_status)(uint64_t word, size_t *bad_index);
} psagg__devexec;

/* cuda.c: the CUDA runtime's executor, or NULL in a build without CUDA. */
extern const psagg__devexec *const psagg__cuda_exec;

#endif
