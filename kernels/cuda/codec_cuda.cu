/*
 * codec_cuda.cu - the host API of the CUDA codecs (codec_cuda.h): argument checks with the CPU
 * library's own rules (psagg__codec_check, psagg__encoded_size: one definition of a valid codec
 * and of every size), the launches through launch.h (device code in kernels.cu), device error
 * words, the blocking wrappers, and the server's host-memory context. Layer: kernels.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "codec_cuda_math.h"
#include "kernels/codec.h"
#include "kernels/thc.h"
#include "kernels/topk.h"
#include "kernels/cuda/codec_cuda.h"
#include "launch.h"

using namespace psagg__cuda;

namespace
{

/* One call's checked codec and sizes: the CPU library's rules, nothing re-derived here. */
struct Layout {
    psagg_codec c;         /* checked: bucket filled in */
    uint64_t n, nb;        /* elements, maxmin buckets (topk: blocks) */
    uint64_t payload;      /* maxmin payload bytes */
    uint64_t size;         /* encoded bytes */
    psagg__topk_layout tk; /* topk: its streams (kernels/topk.h) */
};

psagg_status layout_make(const psagg_codec *codec, size_t n, Layout *L)
{
    psagg_status st;
    if (!codec)
        return psagg__fail(PSAGG_EINVAL, "cuda codec: codec is NULL");
    if ((uint64_t)n > PSAGG_CODEC_MAX_ELEMS)
        return psagg__fail(PSAGG_EINVAL, "cuda codec: n = %zu exceeds %llu", n,
                           (unsigned long long)PSAGG_CODEC_MAX_ELEMS);
    memset(L, 0, sizeof *L);
    L->c = *codec;
    if ((st = psagg__codec_check(&L->c)))
        return psagg__fail_context(st, "cuda ");
    L->n = n;
    L->size = psagg__encoded_size(&L->c, n);
    if (L->c.id == PSAGG_CODEC_MAXMIN) {
        L->nb = psagg__mm_nbuckets(n, L->c.bucket);
        L->payload = psagg__mm_payload_bytes(n, L->c.bits);
    } else if (L->c.id == PSAGG_CODEC_TOPK) {
        const psagg__topk_format f = {L->c.bits, L->c.bucket, L->c.k, L->c.rounding};
        L->tk = psagg__topk_layout_of(&f, n);
        L->nb = L->tk.nb;
    }
    return PSAGG_OK;
}

/* The aggregate's refusal of topk (the server's sparse sum runs on the CPU), or PSAGG_OK. */
psagg_status no_topk_sum(const Layout &L)
{
    if (L.c.id != PSAGG_CODEC_TOPK)
        return PSAGG_OK;
    return psagg__fail(PSAGG_EUNSUPPORTED,
                       "cuda aggregate: topk has no CUDA sum (the server's sparse sum runs on the "
                       "CPU)");
}

/* The generic functions' refusal of thc (its own functions below), or PSAGG_OK. */
psagg_status not_thc(const Layout &L, const char *what)
{
    if (L.c.id != PSAGG_CODEC_THC)
        return PSAGG_OK;
    return psagg__fail(
        PSAGG_EINVAL,
        "%s: thc's pushes take their chunk's scales and rotation and its updates "
        "are integer sums: psagg__cuda_thc_push_encode, psagg__cuda_thc_update_decode "
        "(the server's fold runs on the CPU)",
        what);
}

psagg_status cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return PSAGG_OK;
    /* clear our own non-sticky error so it is reported once; one the caller left pending
       (a different error) stays for the caller's cudaGetLastError */
    if (cudaPeekAtLastError() == e)
        (void)cudaGetLastError();
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorNoKernelImageForDevice)
        return psagg__fail(PSAGG_EUNSUPPORTED, "%s: %s", what, cudaGetErrorString(e));
    return psagg__fail(PSAGG_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

inline bool aligned(const void *p, uintptr_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

KArgs kargs_make(const Layout &L, psagg__rng_key key, bool vec)
{
    KArgs a;
    memset(&a, 0, sizeof a);
    a.n = L.n;
    a.nb = L.nb;
    a.payload = L.payload;
    a.bucket = L.c.id == PSAGG_CODEC_MAXMIN ? L.c.bucket : 0;
    a.bits = L.c.id == PSAGG_CODEC_MAXMIN || L.c.id == PSAGG_CODEC_TOPK ? L.c.bits : 0;
    a.levels = !a.bits                      ? 0u
               : L.c.id == PSAGG_CODEC_TOPK ? L.tk.levels /* 2^(b-1) - 1: the sign bit apart */
                                            : (1u << a.bits) - 1u;
    a.levels_f = (float)a.levels;
    a.k0 = key.k0;
    a.k1 = key.k1;
    a.sr = (L.c.id == PSAGG_CODEC_MAXMIN || L.c.id == PSAGG_CODEC_TOPK) &&
           L.c.rounding == PSAGG_ROUND_STOCHASTIC;
    a.vec = vec;
    if (L.c.id == PSAGG_CODEC_TOPK) {
        a.tk_block = L.c.bucket;
        a.tk_k = L.c.k;
        a.tk_ib = L.tk.ib;
        a.tk_kept = L.tk.kept;
        a.tk_idx_off = L.tk.idx_off;
        a.tk_val_off = L.tk.val_off;
        a.tk_size = L.size;
    }
    return a;
}

psagg_status check_ptr(const void *p, uintptr_t align, const char *what)
{
    if (!aligned(p, align))
        return psagg__fail(PSAGG_EINVAL, "cuda codec: %s %p not %u-byte aligned", what, p,
                           (unsigned)align);
    return PSAGG_OK;
}

struct SyncErr { /* temporary device error word for the *_sync wrappers */
    uint64_t *d = nullptr;
    cudaStream_t s;
    explicit SyncErr(cudaStream_t st) : s(st) {}
    psagg_status alloc()
    {
        psagg_status st =
            cuda_status(cudaMallocAsync((void **)&d, sizeof *d, s), "cudaMallocAsync");
        if (st)
            return st;
        return psagg__cuda_err_reset(d, s);
    }
    /* Wait for the stream and turn the word into a status. */
    psagg_status finish(size_t *bad_index)
    {
        uint64_t word = PSAGG_CUDA_ERR_NONE;
        psagg_status st =
            cuda_status(cudaMemcpyAsync(&word, d, sizeof word, cudaMemcpyDeviceToHost, s),
                        "cudaMemcpyAsync(error word)");
        if (!st)
            st = cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        if (!st)
            st = psagg__cuda_err_status(word, bad_index);
        return st;
    }
    ~SyncErr()
    {
        if (d)
            (void)cudaFreeAsync(d, s);
    }
};

} /* namespace */

/* ================================================================ public API */

extern "C" psagg_status psagg__cuda_scale(float *x, size_t n, float s, cudaStream_t stream)
{
    if (!n)
        return PSAGG_OK;
    if (!x)
        return psagg__fail(PSAGG_EINVAL, "psagg__cuda_scale: x is NULL");
    return cuda_status(launch_scale(x, n, s, stream), "scale_kernel");
}

extern "C" int psagg__cuda_device_count(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        if (cudaPeekAtLastError() == e) /* ours, not a pending error of the caller's */
            (void)cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" size_t psagg__cuda_encoded_size(const psagg_codec *codec, size_t n)
{
    Layout L;
    if (layout_make(codec, n, &L))
        return 0;
    return (size_t)L.size;
}

extern "C" psagg_status psagg__cuda_err_reset(uint64_t *d_err, cudaStream_t stream)
{
    if (!d_err)
        return psagg__fail(PSAGG_EINVAL, "cuda codec: error word is NULL");
    return cuda_status(cudaMemsetAsync(d_err, 0xFF, sizeof *d_err, stream), "cudaMemsetAsync");
}

extern "C" psagg_status psagg__cuda_err_status(uint64_t w, size_t *bad_index)
{
    if (w == PSAGG_CUDA_ERR_NONE)
        return PSAGG_OK;
    uint32_t code = (uint32_t)(w & 0xFF), stage = (uint32_t)(w >> 40);
    size_t index = (size_t)((w >> 8) & 0xFFFFFFFFull);
    if (bad_index)
        *bad_index = index;
    switch (code) {
    case PCM_ERR_NONFINITE:
        return psagg__fail(PSAGG_ENONFINITE, "cuda codec: %s %zu: NaN or Inf",
                           stage ? "element" : "input", index);
    case PCM_ERR_RANGE:
        return psagg__fail(PSAGG_ERANGE, "cuda codec: element %zu out of the codec's range", index);
    case PCM_ERR_BADMETA: /* (stage 1: a thc sum above what its block's pushes make) */
        return psagg__fail(PSAGG_EBADMETA, "cuda codec: %s %zu: invalid %s",
                           stage ? "coordinate" : "input", index, stage ? "sum" : "meta");
    default:
        return psagg__fail(PSAGG_ECUDA, "cuda codec: corrupt error word %#llx",
                           (unsigned long long)w);
    }
}

extern "C" psagg_status psagg__cuda_encode(const psagg_codec *codec, const float *x,
                                           float *residual, size_t n, psagg__rng_key key, void *out,
                                           size_t out_len, uint64_t *d_err, cudaStream_t stream)
{
    Layout L;
    psagg_status st = layout_make(codec, n, &L);
    if (st || (st = not_thc(L, "cuda encode")))
        return st;
    if (out_len != L.size)
        return psagg__fail(PSAGG_EBADLEN, "cuda encode: out_len %zu, codec needs %llu", out_len,
                           (unsigned long long)L.size);
    if (n == 0)
        return PSAGG_OK;
    if (!x || !out)
        return psagg__fail(PSAGG_EINVAL, "cuda encode: NULL buffer");
    if ((st = check_ptr(x, 4, "x")) || (st = check_ptr(residual, 4, "residual")) ||
        (st = check_ptr(out, 8, "out")))
        return st;
    const bool vec = aligned(x, 16) && aligned(residual, 16) && aligned(out, 16);
    return cuda_status(launch_encode(L.c.id, kargs_make(L, key, vec), x, residual,
                                     static_cast<uint8_t *>(out), d_err, stream),
                       "cuda encode launch");
}

template <bool ADD>
static psagg_status decode_common(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                                  float *out, uint64_t *d_err, cudaStream_t stream)
{
    Layout L;
    psagg_status st = layout_make(codec, n, &L);
    if (st || (st = not_thc(L, "cuda decode")))
        return st;
    if (in_len != L.size)
        return psagg__fail(PSAGG_EBADLEN, "cuda decode: in_len %zu, codec needs %llu", in_len,
                           (unsigned long long)L.size);
    if (n == 0)
        return PSAGG_OK;
    if (!in || !out)
        return psagg__fail(PSAGG_EINVAL, "cuda decode: NULL buffer");
    if ((st = check_ptr(in, 8, "in")) || (st = check_ptr(out, 4, "out")))
        return st;
    return cuda_status(
        launch_decode(L.c.id, ADD,
                      kargs_make(L, psagg__rng_key{0, 0}, aligned(in, 16) && aligned(out, 16)),
                      static_cast<const uint8_t *>(in), out, d_err, stream),
        ADD ? "cuda decode_add launch" : "cuda decode launch");
}

extern "C" psagg_status psagg__cuda_decode(const psagg_codec *codec, const void *in, size_t in_len,
                                           size_t n, float *out, uint64_t *d_err,
                                           cudaStream_t stream)
{
    return decode_common<false>(codec, in, in_len, n, out, d_err, stream);
}

extern "C" psagg_status psagg__cuda_decode_add(const psagg_codec *codec, const void *in,
                                               size_t in_len, size_t n, float *acc, uint64_t *d_err,
                                               cudaStream_t stream)
{
    return decode_common<true>(codec, in, in_len, n, acc, d_err, stream);
}

extern "C" psagg_status psagg__cuda_aggregate(const psagg_codec *codec, const void *const *in,
                                              size_t n_in, size_t in_len, size_t n, float *residual,
                                              psagg__rng_key key, void *out, size_t out_len,
                                              uint64_t *d_err, cudaStream_t stream)
{
    Layout L;
    psagg_status st = layout_make(codec, n, &L);
    if (st || (st = no_topk_sum(L)) || (st = not_thc(L, "cuda aggregate")))
        return st;
    if (n_in > PSAGG_CUDA_MAX_INPUTS || (n_in && !in))
        return psagg__fail(PSAGG_EINVAL, "cuda aggregate: n_in %zu not in 0..%d", n_in,
                           PSAGG_CUDA_MAX_INPUTS);
    if ((n_in && in_len != L.size) || out_len != L.size)
        return psagg__fail(PSAGG_EBADLEN,
                           "cuda aggregate: in_len %zu / out_len %zu, codec needs "
                           "%llu",
                           in_len, out_len, (unsigned long long)L.size);
    if (n == 0)
        return PSAGG_OK;
    if (!out)
        return psagg__fail(PSAGG_EINVAL, "cuda aggregate: out is NULL");
    if ((st = check_ptr(residual, 4, "residual")) || (st = check_ptr(out, 8, "out")))
        return st;
    InPtrs ptrs;
    memset(&ptrs, 0, sizeof ptrs);
    bool vec = aligned(residual, 16) && aligned(out, 16);
    for (size_t i = 0; i < n_in; i++) {
        if (!in[i])
            return psagg__fail(PSAGG_EINVAL, "cuda aggregate: input %zu is NULL", i);
        if ((st = check_ptr(in[i], 8, "input")))
            return st;
        vec = vec && aligned(in[i], 16);
        ptrs.p[i] = static_cast<const uint8_t *>(in[i]);
    }
    return cuda_status(launch_aggregate(L.c.id, kargs_make(L, key, vec), ptrs, (uint32_t)n_in,
                                        residual, static_cast<uint8_t *>(out), d_err, stream),
                       "cuda aggregate launch");
}

/* ---- blocking wrappers ---- */

/* ---- thc (kernels/thc.h) ---- */

namespace
{
/* A thc call's checked codec and the arguments of its kernels (rotation, sizes). */
psagg_status thc_args(const psagg_codec *codec, size_t n, psagg__rng_key rot, psagg__rng_key key,
                      const char *what, Layout *L, KArgs *a)
{
    psagg_status st = layout_make(codec, n, L);
    if (st)
        return st;
    if (L->c.id != PSAGG_CODEC_THC)
        return psagg__fail(PSAGG_EINVAL, "%s: codec %u is not thc", what, (unsigned)L->c.id);
    if (n == 0)
        return psagg__fail(PSAGG_EINVAL, "%s: no elements", what);
    memset(a, 0, sizeof *a);
    a->n = n;
    a->nb = psagg__thc_blocks(n, L->c.bucket);
    a->bits = L->c.bits;
    a->levels = (1u << a->bits) - 1u;
    a->k0 = key.k0;
    a->k1 = key.k1;
    a->rk0 = rot.k0;
    a->rk1 = rot.k1;
    a->th_block = L->c.bucket;
    a->th_np = psagg__thc_rotated_len(n, L->c.bucket);
    return PSAGG_OK;
}

/* The scratch of blocks too large for shared memory (N' floats, stream-ordered), or none. */
psagg_status thc_scratch(const KArgs &a, float **scratch, cudaStream_t s)
{
    *scratch = nullptr;
    if (a.th_block <= thc_smem_max())
        return PSAGG_OK;
    return cuda_status(cudaMallocAsync((void **)scratch, a.th_np * sizeof(float), s),
                       "cudaMallocAsync(thc scratch)");
}

psagg_status thc_launched(cudaError_t e, float *scratch, cudaStream_t s, const char *what)
{
    psagg_status st = cuda_status(e, what);
    if (scratch)
        (void)cudaFreeAsync(scratch, s); /* (after the kernel, in stream order) */
    return st;
}
} /* namespace */

extern "C" psagg_status psagg__cuda_thc_push_encode(const psagg_codec *codec, psagg__rng_key rot,
                                                    const float *scales, const float *x,
                                                    float *residual, size_t n, psagg__rng_key key,
                                                    void *out, size_t out_len, uint64_t *d_err,
                                                    cudaStream_t stream)
{
    Layout L;
    KArgs a;
    float *scratch;
    psagg_status st = thc_args(codec, n, rot, key, "cuda thc push", &L, &a);
    if (st)
        return st;
    if (out_len != L.size)
        return psagg__fail(PSAGG_EBADLEN, "cuda thc push: out_len %zu, %zu elements take %llu",
                           out_len, n, (unsigned long long)L.size);
    if (!x || !out || !scales)
        return psagg__fail(PSAGG_EINVAL, "cuda thc push: NULL buffer");
    if ((st = check_ptr(x, 4, "x")) || (st = check_ptr(residual, 4, "residual")) ||
        (st = check_ptr(scales, 4, "scales")) || (st = check_ptr(out, 8, "out")))
        return st;
    a.th_meta = PSAGG_THC_PUSH_META * a.nb;
    a.th_size = L.size;
    if ((st = thc_scratch(a, &scratch, stream)))
        return st;
    return thc_launched(launch_thc_encode(a, x, residual, scales, static_cast<uint8_t *>(out),
                                          scratch, d_err, stream),
                        scratch, stream, "cuda thc push launch");
}

extern "C" psagg_status psagg__cuda_thc_update_decode(const psagg_codec *codec, psagg__rng_key rot,
                                                      const void *in, size_t in_len, size_t n,
                                                      float factor, psagg__decode_op op, float *out,
                                                      uint64_t *d_err, cudaStream_t stream)
{
    Layout L;
    KArgs a;
    float *scratch;
    psagg_status st = thc_args(codec, n, rot, psagg__rng_key{0, 0}, "cuda thc update", &L, &a);
    if (st)
        return st;
    for (uint32_t inputs : {15u / a.levels, 255u / a.levels, 65535u / a.levels}) /* width: length */
        if (in_len == psagg__thc_update_bytes(a.bits, a.th_block, n, inputs)) {
            a.th_inputs = inputs;
            a.th_width = psagg__thc_sum_width(a.bits, inputs);
        }
    if (!a.th_inputs)
        return psagg__fail(PSAGG_EBADLEN,
                           "cuda thc update: in_len %zu; %zu elements take %zu, %zu or %zu (4-, "
                           "8- or 16-bit sums)",
                           in_len, n,
                           psagg__thc_update_bytes(a.bits, a.th_block, n, 15u / a.levels),
                           psagg__thc_update_bytes(a.bits, a.th_block, n, 255u / a.levels),
                           psagg__thc_update_bytes(a.bits, a.th_block, n, 65535u / a.levels));
    if (op != PSAGG_DECODE_SET && op != PSAGG_DECODE_ADD && op != PSAGG_DECODE_FIRST &&
        op != PSAGG_DECODE_SCALE)
        return psagg__fail(PSAGG_EINVAL, "cuda thc update: op %d", (int)op);
    if (!in || !out)
        return psagg__fail(PSAGG_EINVAL, "cuda thc update: NULL buffer");
    if ((st = check_ptr(in, 8, "in")) || (st = check_ptr(out, 4, "out")))
        return st;
    a.th_meta = PSAGG_THC_UPDATE_META * a.nb;
    a.th_size = in_len;
    a.th_factor = factor;
    a.th_op = (int)op;
    if ((st = thc_scratch(a, &scratch, stream)))
        return st;
    return thc_launched(
        launch_thc_decode(a, static_cast<const uint8_t *>(in), out, scratch, d_err, stream),
        scratch, stream, "cuda thc update launch");
}

extern "C" psagg_status psagg__cuda_encode_sync(const psagg_codec *codec, const float *x,
                                                float *residual, size_t n, psagg__rng_key key,
                                                void *out, size_t out_len, size_t *bad_index,
                                                cudaStream_t stream)
{
    SyncErr e(stream);
    psagg_status st = e.alloc();
    if (!st)
        st = psagg__cuda_encode(codec, x, residual, n, key, out, out_len, e.d, stream);
    return st ? st : e.finish(bad_index);
}

extern "C" psagg_status psagg__cuda_decode_sync(const psagg_codec *codec, const void *in,
                                                size_t in_len, size_t n, float *out,
                                                size_t *bad_index, cudaStream_t stream)
{
    SyncErr e(stream);
    psagg_status st = e.alloc();
    if (!st)
        st = psagg__cuda_decode(codec, in, in_len, n, out, e.d, stream);
    return st ? st : e.finish(bad_index);
}

extern "C" psagg_status psagg__cuda_decode_add_sync(const psagg_codec *codec, const void *in,
                                                    size_t in_len, size_t n, float *acc,
                                                    size_t *bad_index, cudaStream_t stream)
{
    SyncErr e(stream);
    psagg_status st = e.alloc();
    if (!st)
        st = psagg__cuda_decode_add(codec, in, in_len, n, acc, e.d, stream);
    return st ? st : e.finish(bad_index);
}

extern "C" psagg_status psagg__cuda_aggregate_sync(const psagg_codec *codec, const void *const *in,
                                                   size_t n_in, size_t in_len, size_t n,
                                                   float *residual, psagg__rng_key key, void *out,
                                                   size_t out_len, size_t *bad_index,
                                                   cudaStream_t stream)
{
    SyncErr e(stream);
    psagg_status st = e.alloc();
    if (!st)
        st = psagg__cuda_aggregate(codec, in, n_in, in_len, n, residual, key, out, out_len, e.d,
                                   stream);
    return st ? st : e.finish(bad_index);
}

/* ---- host-memory context ---- */

struct psagg__cuda_ctx {
    int device;
    cudaStream_t stream;
    uint8_t *d_ws; /* device workspace */
    size_t d_cap;
    uint8_t *h_pin; /* pinned staging, same layout as d_ws */
    size_t h_cap;
    uint64_t *d_err;
    uint64_t *h_err; /* pinned */
};

static size_t round256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

extern "C" psagg_status psagg__cuda_ctx_create(int device, psagg__cuda_ctx **out)
{
    psagg_status st;
    psagg__cuda_ctx *c;
    if (!out)
        return psagg__fail(PSAGG_EINVAL, "cuda ctx: out is NULL");
    *out = NULL;
    if (psagg__cuda_device_count() <= device || device < 0)
        return psagg__fail(PSAGG_EUNSUPPORTED, "cuda ctx: no CUDA device %d", device);
    c = (psagg__cuda_ctx *)calloc(1, sizeof *c);
    if (!c)
        return psagg__fail(PSAGG_ENOMEM, "cuda ctx: out of memory");
    c->device = device;
    if ((st = cuda_status(cudaSetDevice(device), "cudaSetDevice")))
        goto err_free;
    if ((st = cuda_status(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                          "cudaStreamCreate")))
        goto err_free;
    if ((st = cuda_status(cudaMalloc((void **)&c->d_err, sizeof *c->d_err), "cudaMalloc")))
        goto err_stream;
    if ((st = cuda_status(cudaMallocHost((void **)&c->h_err, sizeof *c->h_err), "cudaMallocHost")))
        goto err_derr;
    *out = c;
    return PSAGG_OK;
err_derr:
    cudaFree(c->d_err);
err_stream:
    cudaStreamDestroy(c->stream);
err_free:
    free(c);
    return st;
}

extern "C" void psagg__cuda_ctx_destroy(psagg__cuda_ctx *c)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cudaFree(c->d_ws);
    cudaFreeHost(c->h_pin);
    cudaFree(c->d_err);
    cudaFreeHost(c->h_err);
    cudaStreamDestroy(c->stream);
    free(c);
}

static psagg_status ctx_reserve(psagg__cuda_ctx *c, size_t bytes)
{
    psagg_status st;
    if (c->d_cap < bytes) {
        cudaFree(c->d_ws);
        c->d_ws = NULL;
        c->d_cap = 0;
        if ((st = cuda_status(cudaMalloc((void **)&c->d_ws, bytes), "cudaMalloc(workspace)")))
            return st;
        c->d_cap = bytes;
    }
    if (c->h_cap < bytes) {
        cudaFreeHost(c->h_pin);
        c->h_pin = NULL;
        c->h_cap = 0;
        if ((st =
                 cuda_status(cudaMallocHost((void **)&c->h_pin, bytes), "cudaMallocHost(staging)")))
            return st;
        c->h_cap = bytes;
    }
    return PSAGG_OK;
}

extern "C" psagg_status psagg__cuda_aggregate_host(psagg__cuda_ctx *c, const psagg_codec *codec,
                                                   const void *const *in, size_t n_in,
                                                   size_t in_len, size_t n, float *residual,
                                                   psagg__rng_key key, void *out, size_t out_len,
                                                   size_t *bad_index)
{
    Layout L;
    psagg_status st;
    const void *d_in[PSAGG_CUDA_MAX_INPUTS];
    if (!c)
        return psagg__fail(PSAGG_EINVAL, "cuda aggregate_host: ctx is NULL");
    if ((st = layout_make(codec, n, &L)) || (st = no_topk_sum(L))) /* (before any staging) */
        return st;
    if (n_in > PSAGG_CUDA_MAX_INPUTS || (n_in && !in))
        return psagg__fail(PSAGG_EINVAL, "cuda aggregate: n_in %zu not in 0..%d", n_in,
                           PSAGG_CUDA_MAX_INPUTS);
    if ((n_in && in_len != L.size) || out_len != L.size)
        return psagg__fail(PSAGG_EBADLEN,
                           "cuda aggregate: in_len %zu / out_len %zu, codec needs "
                           "%llu",
                           in_len, out_len, (unsigned long long)L.size);
    for (size_t i = 0; i < n_in; i++)
        if (!in[i])
            return psagg__fail(PSAGG_EINVAL, "cuda aggregate: input %zu is NULL", i);
    if (n == 0)
        return PSAGG_OK;
    if (!out)
        return psagg__fail(PSAGG_EINVAL, "cuda aggregate: out is NULL");

    /* workspace: [in 0 | in 1 | ... | residual | out]; H2D copies up to the residual's end,
     * D2H from the residual's start, each in one piece. */
    const size_t stride = round256(in_len);
    const size_t res_off = stride * n_in;
    const size_t res_len = residual ? round256(4 * n) : 0;
    const size_t out_off = res_off + res_len;
    const size_t total = out_off + round256(out_len);
    if ((st = cuda_status(cudaSetDevice(c->device), "cudaSetDevice")))
        return st;
    if ((st = ctx_reserve(c, total)))
        return st;
    for (size_t i = 0; i < n_in; i++) {
        memcpy(c->h_pin + i * stride, in[i], in_len);
        d_in[i] = c->d_ws + i * stride;
    }
    if (residual)
        memcpy(c->h_pin + res_off, residual, 4 * n);
    float *d_res = residual ? reinterpret_cast<float *>(c->d_ws + res_off) : NULL;
    /* once something is enqueued, every return waits for the stream: the staging and the
       workspace are reused by the next call (and freed by ctx_destroy) */
    if ((st = cuda_status(
             cudaMemcpyAsync(c->d_ws, c->h_pin, out_off, cudaMemcpyHostToDevice, c->stream),
             "cudaMemcpyAsync(H2D)")) ||
        (st = psagg__cuda_err_reset(c->d_err, c->stream)) ||
        (st = psagg__cuda_aggregate(codec, d_in, n_in, in_len, n, d_res, key, c->d_ws + out_off,
                                    out_len, c->d_err, c->stream)) ||
        (st = cuda_status(cudaMemcpyAsync(c->h_pin + res_off, c->d_ws + res_off,
                                          out_off + out_len - res_off, cudaMemcpyDeviceToHost,
                                          c->stream),
                          "cudaMemcpyAsync(D2H)")) ||
        (st = cuda_status(cudaMemcpyAsync(c->h_err, c->d_err, sizeof *c->h_err,
                                          cudaMemcpyDeviceToHost, c->stream),
                          "cudaMemcpyAsync(error word)"))) {
        (void)cudaStreamSynchronize(c->stream);
        return st;
    }
    if ((st = cuda_status(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize")))
        return st;
    if ((st = psagg__cuda_err_status(*c->h_err, bad_index)))
        return st;
    memcpy(out, c->h_pin + out_off, out_len);
    if (residual)
        memcpy(residual, c->h_pin + res_off, 4 * n);
    return PSAGG_OK;
}
