/*
 * cuda.c - the CUDA runtime as the device path's executor (devexec.h): device.c's ordering
 * logic runs on it in every build with CUDA. Each function is one CUDA call (or one of the
 * GPU codecs of kernels/cuda); errors are reported with cudaGetErrorString, and only an error
 * of our own call is cleared from the runtime's last error, never one the caller left pending.
 */
#include <stddef.h>

#include "base/error.h"
#include "devexec.h"
#include "worker.h"

#ifdef PSAGG_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/codec_cuda.h"

static psagg_status cu(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return PSAGG_OK;
    if (cudaPeekAtLastError() == e) /* ours: a non-sticky error is reported once */
        (void)cudaGetLastError();
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return psagg__fail(PSAGG_EUNSUPPORTED, "%s: %s", what, cudaGetErrorString(e));
    if (e == cudaErrorMemoryAllocation)
        return psagg__fail(PSAGG_ENOMEM, "%s: %s", what, cudaGetErrorString(e));
    return psagg__fail(PSAGG_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

static psagg_status cx_get_device(int *dev)
{
    return cu(cudaGetDevice(dev), "cudaGetDevice");
}

static psagg_status cx_set_device(int dev)
{
    return cu(cudaSetDevice(dev), "cudaSetDevice");
}

static psagg_status cx_device_of(const void *p, int *dev)
{
    struct cudaPointerAttributes a;
    psagg_status st = cu(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
    if (st)
        return st;
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return psagg__fail(PSAGG_EINVAL,
                           "%p is not device memory (a host pointer: use psagg_push_pull)", p);
    *dev = a.device;
    return PSAGG_OK;
}

static psagg_status cx_dev_alloc(void **p, size_t bytes)
{
    return cu(cudaMalloc(p, bytes), "cudaMalloc");
}

static psagg_status cx_host_alloc(void **p, size_t bytes)
{
    return cu(cudaMallocHost(p, bytes), "cudaMallocHost");
}

static void cx_dev_free(void *p)
{
    (void)cu(cudaFree(p), "cudaFree");
}

static void cx_host_free(void *p)
{
    (void)cu(cudaFreeHost(p), "cudaFreeHost");
}

static psagg_status cx_stream_create(void **s)
{
    return cu(cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
}

static void cx_stream_destroy(void *s)
{
    (void)cu(cudaStreamDestroy(s), "cudaStreamDestroy");
}

static psagg_status cx_stream_sync(void *s)
{
    return cu(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

static psagg_status cx_event_create(void **e)
{
    return cu(cudaEventCreateWithFlags((cudaEvent_t *)e, cudaEventDisableTiming),
              "cudaEventCreateWithFlags");
}

static void cx_event_destroy(void *e)
{
    (void)cu(cudaEventDestroy(e), "cudaEventDestroy");
}

static psagg_status cx_event_record(void *e, void *s)
{
    return cu(cudaEventRecord(e, s), "cudaEventRecord");
}

static psagg_status cx_stream_wait_event(void *s, void *e)
{
    return cu(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent");
}

static psagg_status cx_event_query(void *e)
{
    cudaError_t r = cudaEventQuery(e);
    return r == cudaErrorNotReady ? PSAGG_BUF_PENDING : cu(r, "cudaEventQuery");
}

static psagg_status cx_copy(void *dst, const void *src, size_t bytes, void *s)
{
    return cu(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
}

static psagg_status cx_fill(void *dst, int byte, size_t bytes, void *s)
{
    return cu(cudaMemsetAsync(dst, byte, bytes, s), "cudaMemsetAsync");
}

static psagg_status cx_encode(const psagg_codec *codec, const float *x, float *residual, size_t n,
                              psagg__rng_key key, void *out, size_t out_len, uint64_t *d_err,
                              void *s)
{
    return psagg__cuda_encode(codec, x, residual, n, key, out, out_len, d_err, s);
}

static psagg_status cx_decode(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                              float *out, uint64_t *d_err, void *s)
{
    return psagg__cuda_decode(codec, in, in_len, n, out, d_err, s);
}

static psagg_status cx_scale(float *x, size_t n, float f, void *s)
{
    return psagg__cuda_scale(x, n, f, s);
}

static psagg_status cx_thc_encode(const psagg_codec *codec, psagg__rng_key rot, const float *scales,
                                  const float *x, float *residual, size_t n, psagg__rng_key key,
                                  void *out, size_t out_len, uint64_t *d_err, void *s)
{
    return psagg__cuda_thc_push_encode(codec, rot, scales, x, residual, n, key, out, out_len, d_err,
                                       s);
}

static psagg_status cx_thc_decode(const psagg_codec *codec, psagg__rng_key rot, const void *in,
                                  size_t in_len, size_t n, float factor, psagg__decode_op op,
                                  float *out, uint64_t *d_err, void *s)
{
    return psagg__cuda_thc_update_decode(codec, rot, in, in_len, n, factor, op, out, d_err, s);
}

static const psagg__devexec cuda_exec = {
    .name = "cuda",
    .get_device = cx_get_device,
    .set_device = cx_set_device,
    .device_of = cx_device_of,
    .dev_alloc = cx_dev_alloc,
    .host_alloc = cx_host_alloc,
    .dev_free = cx_dev_free,
    .host_free = cx_host_free,
    .stream_create = cx_stream_create,
    .stream_destroy = cx_stream_destroy,
    .stream_sync = cx_stream_sync,
    .event_create = cx_event_create,
    .event_destroy = cx_event_destroy,
    .event_record = cx_event_record,
    .stream_wait_event = cx_stream_wait_event,
    .event_query = cx_event_query,
    .copy = cx_copy,
    .fill = cx_fill,
    .encode = cx_encode,
    .decode = cx_decode,
    .scale = cx_scale,
    .thc_encode = cx_thc_encode,
    .thc_decode = cx_thc_decode,
    .err_status = psagg__cuda_err_status,
};

const psagg__devexec *const psagg__cuda_exec = &cuda_exec;

#else /* built without CUDA: no executor (psagg_push_pull_cuda says so) */

const psagg__devexec *const psagg__cuda_exec = NULL;

#endif
