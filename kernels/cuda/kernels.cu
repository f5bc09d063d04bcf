/*
 * kernels.cu - the device side of the CUDA codecs: the kernels of kernels/codec.h's formats,
 * byte-identical to the CPU paths, and the launch functions of launch.h. Argument checks,
 * error words and contexts are the host API's (codec_cuda.cu). Layer: kernels.
 *
 * Arithmetic: every float step goes through codec_cuda_math.h (one __f*_rn op at a time; the
 * file is also built with -fmad=false -ftz=false -prec-div=true). Layout of the work:
 *
 *  - fp32/fp16/bf16 (and every decode): one thread per group of 8 consecutive elements,
 *    vectorized 16-byte loads/stores when the buffers are 16-byte aligned and the group is
 *    full; a partial last group goes element by element.
 *  - maxmin encode / aggregate: one "team" of TS lanes (8, 16 or 32, inside one warp) per
 *    bucket. Lane l of a team handles groups l, l+TS, l+2TS, ... of 8 elements (so a warp
 *    reads contiguous memory), reduces lo/hi with shuffles, then quantizes each group of 8
 *    into exactly b payload bytes (8 elements * b bits; B*b % 64 == 0 keeps groups
 *    byte-aligned) and writes them with one aligned store for b = 1, 2, 4, 8. Buckets of up
 *    to 4 chunks (B <= 1024 with TS = 32) keep their values in registers between the two
 *    passes; larger buckets recompute them (deterministically) in the second pass.
 *  - topk encode / decode: one thread block per block of C elements (the section below).
 *  - thc push / update decode: one thread block per block of D elements (its section).
 *
 * Errors go to the caller's device error word (codec_cuda.h) with atomicMin; each thread
 * first reduces its own candidates so a clean run issues no atomics.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "codec_cuda_math.h"
#include "launch.h"

namespace psagg__cuda
{

namespace
{
template <class T> struct Same {
    using type = T;
};

/*
 * Enqueue kernel k on s with cudaLaunchKernel (and `shared` bytes of dynamic shared memory),
 * which returns this launch's own error: the runtime's last error (the caller's, perhaps) is
 * neither read nor cleared.
 */
template <class... P>
cudaError_t launch_shared(void (*k)(P...), unsigned blocks, unsigned threads, size_t shared,
                          cudaStream_t s, typename Same<P>::type... args)
{
    void *argv[] = {const_cast<void *>(static_cast<const void *>(&args))..., nullptr};
    return cudaLaunchKernel(reinterpret_cast<const void *>(k), dim3(blocks), dim3(threads), argv,
                            shared, s);
}

/* (no dynamic shared memory) */
template <class... P>
cudaError_t launch(void (*k)(P...), unsigned blocks, unsigned threads, cudaStream_t s,
                   typename Same<P>::type... args)
{
    return launch_shared(k, blocks, threads, 0, s, args...);
}
} // namespace
namespace
{

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr uint64_t kNoErr = ~0ull;

__device__ __forceinline__ uint64_t err_word(uint32_t stage, uint64_t index, uint32_t code)
{
    return ((uint64_t)stage << 40) | (index << 8) | code;
}

__device__ __forceinline__ void err_flush(uint64_t *err, uint64_t w)
{
    if (err && w != kNoErr)
        atomicMin((unsigned long long *)err, (unsigned long long)w);
}

/* 8 floats of p starting at element e (< n); elements >= n read as 0. */
__device__ __forceinline__ void load8(const float *__restrict__ p, uint64_t e, uint64_t n, bool vec,
                                      float v[8])
{
    if (vec && e + 8 <= n) {
        const float4 *q = reinterpret_cast<const float4 *>(p + e);
        float4 a = q[0], b = q[1];
        v[0] = a.x;
        v[1] = a.y;
        v[2] = a.z;
        v[3] = a.w;
        v[4] = b.x;
        v[5] = b.y;
        v[6] = b.z;
        v[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = e + j < n ? p[e + j] : 0.0f;
    }
}

__device__ __forceinline__ void store8(float *__restrict__ p, uint64_t e, uint64_t n, bool vec,
                                       const float v[8])
{
    if (vec && e + 8 <= n) {
        float4 *q = reinterpret_cast<float4 *>(p + e);
        q[0] = make_float4(v[0], v[1], v[2], v[3]);
        q[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (e + j < n)
                p[e + j] = v[j];
    }
}

/* 8 x 16-bit words at element e (< n); missing ones read as 0. */
__device__ __forceinline__ void load8_u16(const uint8_t *__restrict__ p, uint64_t e, uint64_t n,
                                          bool vec, uint16_t h[8])
{
    const uint16_t *s = reinterpret_cast<const uint16_t *>(p);
    if (vec && e + 8 <= n) {
        uint4 w = *reinterpret_cast<const uint4 *>(s + e);
        h[0] = (uint16_t)w.x;
        h[1] = (uint16_t)(w.x >> 16);
        h[2] = (uint16_t)w.y;
        h[3] = (uint16_t)(w.y >> 16);
        h[4] = (uint16_t)w.z;
        h[5] = (uint16_t)(w.z >> 16);
        h[6] = (uint16_t)w.w;
        h[7] = (uint16_t)(w.w >> 16);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            h[j] = e + j < n ? s[e + j] : (uint16_t)0;
    }
}

__device__ __forceinline__ void store8_u16(uint8_t *__restrict__ p, uint64_t e, uint64_t n,
                                           bool vec, const uint16_t h[8])
{
    uint16_t *d = reinterpret_cast<uint16_t *>(p);
    if (vec && e + 8 <= n) {
        uint4 w;
        w.x = h[0] | ((uint32_t)h[1] << 16);
        w.y = h[2] | ((uint32_t)h[3] << 16);
        w.z = h[4] | ((uint32_t)h[5] << 16);
        w.w = h[6] | ((uint32_t)h[7] << 16);
        *reinterpret_cast<uint4 *>(d + e) = w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (e + j < n)
                d[e + j] = h[j];
    }
}

/* Payload bytes of the group of 8 elements starting at e: nbytes = b for a full group. */
__device__ __forceinline__ uint32_t group_bytes(uint64_t e, uint64_t n, uint32_t bits)
{
    uint64_t cnt = n - e < 8 ? n - e : 8;
    return (uint32_t)((cnt * bits + 7) / 8);
}

/* Read the b-bit levels of one group (LSB-first) as a 64-bit word. payload is 8-aligned. */
__device__ __forceinline__ uint64_t get_group(const uint8_t *__restrict__ payload, uint64_t e,
                                              uint64_t n, uint32_t bits)
{
    const uint8_t *p = payload + (e / 8) * bits;
    uint32_t nbytes = group_bytes(e, n, bits);
    if (nbytes == bits) {
        switch (bits) {
        case 8:
            return *reinterpret_cast<const uint64_t *>(p);
        case 4:
            return *reinterpret_cast<const uint32_t *>(p);
        case 2:
            return *reinterpret_cast<const uint16_t *>(p);
        case 1:
            return *p;
        default:
            break;
        }
    }
    uint64_t w = 0;
    for (uint32_t i = 0; i < nbytes; i++)
        w |= (uint64_t)p[i] << (8 * i);
    return w;
}

__device__ __forceinline__ void put_group(uint8_t *__restrict__ payload, uint64_t e, uint64_t n,
                                          uint32_t bits, uint64_t w)
{
    uint8_t *p = payload + (e / 8) * bits;
    uint32_t nbytes = group_bytes(e, n, bits);
    if (nbytes == bits) {
        switch (bits) {
        case 8:
            *reinterpret_cast<uint64_t *>(p) = w;
            return;
        case 4:
            *reinterpret_cast<uint32_t *>(p) = (uint32_t)w;
            return;
        case 2:
            *reinterpret_cast<uint16_t *>(p) = (uint16_t)w;
            return;
        case 1:
            *p = (uint8_t)w;
            return;
        default:
            break;
        }
    }
    for (uint32_t i = 0; i < nbytes; i++)
        p[i] = (uint8_t)(w >> (8 * i));
}

__device__ __forceinline__ float2 get_meta(const uint8_t *__restrict__ enc, uint64_t bucket)
{
    return *reinterpret_cast<const float2 *>(enc + 8 * bucket); /* .x = scale, .y = lo */
}

/* Decode the 8 elements of maxmin buffer `enc` at e; stage-0 BADMETA into bad (as `index`). */
__device__ __forceinline__ void mm_decode8(const uint8_t *__restrict__ enc, uint64_t e,
                                           const KArgs &a, uint64_t index, float y[8],
                                           uint64_t &bad)
{
    float2 m = get_meta(enc, e / a.bucket);
    if (!pcm_mm_meta_ok(m.x, m.y, a.levels))
        bad = min(bad, err_word(0, index, PCM_ERR_BADMETA));
    uint64_t w = get_group(enc + 8 * a.nb, e, a.n, a.bits);
#pragma unroll
    for (int j = 0; j < 8; j++)
        y[j] = pcm_mm_value(m.y, m.x, (uint32_t)(w >> (j * a.bits)) & a.levels);
}

/* Decode 8 elements of an fp-format buffer; NaN/Inf inputs are stage-0 NONFINITE errors at
 * `index` (or at the element itself when index == kNoErr). */
template <int ID>
__device__ __forceinline__ void fp_decode8(const uint8_t *__restrict__ enc, uint64_t e,
                                           const KArgs &a, uint64_t index, float y[8],
                                           uint64_t &bad)
{
    uint32_t er[8];
    if (ID == PSAGG_CODEC_FP32) {
        load8(reinterpret_cast<const float *>(enc), e, a.n, a.vec, y);
#pragma unroll
        for (int j = 0; j < 8; j++)
            er[j] = pcm_fp32_check(y[j]);
    } else {
        uint16_t h[8];
        load8_u16(enc, e, a.n, a.vec, h);
#pragma unroll
        for (int j = 0; j < 8; j++)
            y[j] = ID == PSAGG_CODEC_FP16 ? pcm_f16_to_f32(h[j], &er[j])
                                          : pcm_bf16_to_f32(h[j], &er[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (er[j] && e + j < a.n)
            bad = min(bad, err_word(0, index == kNoErr ? e + j : index, er[j]));
}

/* ---- value sources: what gets encoded (before the residual is added) ---- */

struct SrcX { /* encode: the caller's x */
    const float *__restrict__ x;
    __device__ __forceinline__ void load(uint64_t e, const KArgs &a, float v[8], uint64_t &) const
    {
        load8(x, e, a.n, a.vec, v);
    }
};

template <int ID> struct SrcAgg { /* aggregate: s = ((0 + y0) + y1) + ... over the inputs */
    InPtrs in;
    uint32_t n_in;
    __device__ __forceinline__ void load(uint64_t e, const KArgs &a, float v[8],
                                         uint64_t &bad) const
    {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = 0.0f;
        for (uint32_t i = 0; i < n_in; i++) {
            float y[8];
            if constexpr (ID == PSAGG_CODEC_MAXMIN)
                mm_decode8(in.p[i], e, a, i, y, bad);
            else
                fp_decode8<ID>(in.p[i], e, a, i, y, bad);
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = PCM_ADD(v[j], y[j]);
        }
    }
};

/* v = src (+ residual) for the group at e. */
template <class Src>
__device__ __forceinline__ void load_v(const Src &src, const float *__restrict__ res, uint64_t e,
                                       const KArgs &a, float v[8], uint64_t &bad)
{
    src.load(e, a, v, bad);
    if (res) {
        float r[8];
        load8(res, e, a.n, a.vec, r);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = PCM_ADD(v[j], r[j]);
    }
}

/* ---------------------------------------------------------------- maxmin encode / aggregate */

template <int TS>
__device__ __forceinline__ void scan_group(const float v[8], uint64_t e, uint64_t bend, float &lo,
                                           float &hi, uint64_t &bad)
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (e + j < bend) {
            uint32_t code = pcm_maxmin_check(v[j]);
            if (code)
                bad = min(bad, err_word(1, e + j, code));
            lo = pcm_min(lo, v[j]);
            hi = pcm_max(hi, v[j]);
        }
    }
}

__device__ __forceinline__ void quantize_group(const float v[8], uint64_t e, uint64_t bend,
                                               float lo, float scale, float inv, const KArgs &a,
                                               float *__restrict__ res,
                                               uint8_t *__restrict__ payload)
{
    uint64_t w = 0;
    uint32_t h = 0;
    float r[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint64_t k = e + j; /* e is even: elements j and j + 1 (j even) share one RNG hash */
        r[j] = 0.0f;
        if (a.sr && (j & 1) == 0)
            h = psagg__rng_hash32(a.k0, a.k1, (uint32_t)k >> 1);
        if (k < bend) {
            float u = a.sr ? psagg__rng_u(h, (uint32_t)k) : 0.5f;
            uint32_t q = pcm_mm_level(v[j], lo, scale, inv, a.levels_f, u) & a.levels;
            w |= (uint64_t)q << (j * a.bits);
            r[j] = PCM_SUB(v[j], pcm_mm_value(lo, scale, q));
        }
    }
    put_group(payload, e, a.n, a.bits, w);
    if (res)
        store8(res, e, a.n, a.vec, r);
}

/*
 * One team of TS lanes per bucket; CACHE > 0 keeps up to CACHE chunks (TS*8 elements each) of
 * v in registers between the min/max pass and the quantize pass (the host picks a CACHE that
 * covers the bucket); CACHE == 0 recomputes v in the second pass.
 */
template <class Src, int TS, int CACHE>
__global__ void __launch_bounds__(kThreads)
    mm_encode_kernel(const __grid_constant__ Src src, float *__restrict__ res,
                     uint8_t *__restrict__ out, KArgs a, uint64_t *err)
{
    const uint32_t tl = threadIdx.x & (TS - 1);
    const uint64_t bucket = ((uint64_t)blockIdx.x * kThreads + threadIdx.x) / TS;
    const bool active = bucket < a.nb;
    const uint64_t b0 = bucket * a.bucket;
    const uint64_t bend = active ? min(a.n, b0 + a.bucket) : b0; /* inactive: no elements */
    const uint32_t chunks = a.bucket / (8 * TS);
    uint8_t *payload = out + 8 * a.nb;
    uint64_t bad = kNoErr;
    float lo = __int_as_float(0x7F800000), hi = __int_as_float(0xFF800000);
    float cache[CACHE > 0 ? CACHE : 1][8];

    /* pass 1: v, range checks, lo/hi */
    if (CACHE > 0) {
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const uint64_t e = b0 + ((uint64_t)c * TS + tl) * 8;
            if ((uint32_t)c < chunks && e < bend) {
                load_v(src, res, e, a, cache[c], bad);
                scan_group<TS>(cache[c], e, bend, lo, hi, bad);
            }
        }
    } else {
        for (uint32_t c = 0; c < chunks; c++) {
            const uint64_t e = b0 + ((uint64_t)c * TS + tl) * 8;
            if (e < bend) {
                float v[8];
                load_v(src, res, e, a, v, bad);
                scan_group<TS>(v, e, bend, lo, hi, bad);
            }
        }
    }
#pragma unroll
    for (int off = TS / 2; off > 0; off >>= 1) {
        lo = pcm_min(lo, __shfl_xor_sync(kFull, lo, off));
        hi = pcm_max(hi, __shfl_xor_sync(kFull, hi, off));
    }
    err_flush(err, bad);
    if (!active)
        return;

    float scale, inv;
    pcm_mm_params(lo, hi, a.levels, &scale, &inv);
    if (tl == 0) {
        *reinterpret_cast<float2 *>(out + 8 * bucket) = make_float2(scale, lo);
        if (bucket == a.nb - 1) { /* zero the payload bytes after the last level */
            for (uint64_t i = (a.n * a.bits + 7) / 8; i < a.payload; i++)
                payload[i] = 0;
        }
    }

    /* pass 2: quantize, pack, residual */
    if (CACHE > 0) {
#pragma unroll
        for (int c = 0; c < CACHE; c++) {
            const uint64_t e = b0 + ((uint64_t)c * TS + tl) * 8;
            if ((uint32_t)c < chunks && e < bend)
                quantize_group(cache[c], e, bend, lo, scale, inv, a, res, payload);
        }
    } else {
        for (uint32_t c = 0; c < chunks; c++) {
            const uint64_t e = b0 + ((uint64_t)c * TS + tl) * 8;
            if (e < bend) {
                float v[8];
                uint64_t ignored = kNoErr;
                load_v(src, res, e, a, v, ignored);
                quantize_group(v, e, bend, lo, scale, inv, a, res, payload);
            }
        }
    }
}

/* ---------------------------------------------------------------- fp encode / aggregate */

template <int ID, class Src>
__global__ void __launch_bounds__(kThreads)
    fp_encode_kernel(const __grid_constant__ Src src, float *__restrict__ res,
                     uint8_t *__restrict__ out, KArgs a, uint64_t *err)
{
    const uint64_t groups = (a.n + 7) / 8;
    uint64_t bad = kNoErr;
    for (uint64_t g = (uint64_t)blockIdx.x * kThreads + threadIdx.x; g < groups;
         g += (uint64_t)gridDim.x * kThreads) {
        const uint64_t e = g * 8;
        float v[8], r[8];
        uint32_t er[8];
        load_v(src, res, e, a, v, bad);
        if (ID == PSAGG_CODEC_FP32) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                er[j] = pcm_fp32_check(v[j]);
                r[j] = PCM_SUB(v[j], v[j]);
            }
            store8(reinterpret_cast<float *>(out), e, a.n, a.vec, v);
        } else {
            uint16_t h[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                uint32_t dummy;
                h[j] = ID == PSAGG_CODEC_FP16 ? pcm_f32_to_f16(v[j], &er[j])
                                              : pcm_f32_to_bf16(v[j], &er[j]);
                float y = ID == PSAGG_CODEC_FP16 ? pcm_f16_to_f32(h[j], &dummy)
                                                 : pcm_bf16_to_f32(h[j], &dummy);
                r[j] = PCM_SUB(v[j], y);
            }
            store8_u16(out, e, a.n, a.vec, h);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (er[j] && e + j < a.n)
                bad = min(bad, err_word(1, e + j, er[j]));
        if (res)
            store8(res, e, a.n, a.vec, r);
    }
    err_flush(err, bad);
}

/* ---------------------------------------------------------------- decode (+ accumulate) */

template <int ID, bool ADD>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const uint8_t *__restrict__ in, float *__restrict__ out, KArgs a, uint64_t *err)
{
    const uint64_t groups = (a.n + 7) / 8;
    uint64_t bad = kNoErr;
    for (uint64_t g = (uint64_t)blockIdx.x * kThreads + threadIdx.x; g < groups;
         g += (uint64_t)gridDim.x * kThreads) {
        const uint64_t e = g * 8;
        float y[8];
        if (ID == PSAGG_CODEC_MAXMIN)
            mm_decode8(in, e, a, e / a.bucket, y, bad);
        else
            fp_decode8<ID>(in, e, a, kNoErr, y, bad);
        if (ADD) {
            float acc[8];
            load8(out, e, a.n, a.vec, acc);
#pragma unroll
            for (int j = 0; j < 8; j++)
                y[j] = PCM_ADD(acc[j], y[j]);
        }
        store8(out, e, a.n, a.vec, y);
    }
    err_flush(err, bad);
}

/* ---------------------------------------------------------------- launch helpers */

unsigned elementwise_blocks(uint64_t n)
{
    uint64_t groups = (n + 7) / 8;
    uint64_t blocks = (groups + kThreads - 1) / kThreads;
    return (unsigned)(blocks < (1u << 30) ? blocks : (1u << 30));
}

template <class Src, int TS>
cudaError_t launch_mm_ts(const Src &src, float *res, uint8_t *out, const KArgs &a, uint64_t *err,
                         cudaStream_t s)
{
    const uint32_t chunks = a.bucket / (8 * TS);
    const unsigned blocks = (unsigned)((a.nb * TS + kThreads - 1) / kThreads);
    if (chunks == 1)
        return launch(mm_encode_kernel<Src, TS, 1>, blocks, kThreads, s, src, res, out, a, err);
    else if (chunks <= 4)
        return launch(mm_encode_kernel<Src, TS, 4>, blocks, kThreads, s, src, res, out, a, err);
    else
        return launch(mm_encode_kernel<Src, TS, 0>, blocks, kThreads, s, src, res, out, a, err);
}

template <class Src>
cudaError_t launch_mm(const Src &src, float *res, uint8_t *out, const KArgs &a, uint64_t *err,
                      cudaStream_t s)
{
    const uint32_t groups = a.bucket / 8; /* a multiple of 8 */
    if (groups % 32 == 0)
        return launch_mm_ts<Src, 32>(src, res, out, a, err, s);
    else if (groups % 16 == 0)
        return launch_mm_ts<Src, 16>(src, res, out, a, err, s);
    else
        return launch_mm_ts<Src, 8>(src, res, out, a, err, s);
}

/* x_k = x_k * s, one IEEE multiply per element (as the CPU worker's PSAGG_AVERAGE). */
__global__ void scale_kernel(float *x, size_t n, float s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

/* Blocks of 256 threads for a grid-stride loop over n elements (scale_kernel, fill_kernel). */
unsigned grid_stride_blocks(uint64_t n)
{
    uint64_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 4096 ? 4096 : blocks);
}

/* x_k = v for every k (topk's decode: every entry not kept is -0). */
__global__ void fill_kernel(float *x, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

/* ---------------------------------------------------------------- topk (kernels/topk.h)
 *
 * One thread block per block of C elements, as the CPU encodes them one at a time:
 *   pass 0     v_i = x_i (+ r_i) checked (stage-1 errors), the histogram of |v_i|'s first
 *              digit (11 bits) in shared memory, the largest |v_i| (the kept entries' hi);
 *   select     the radix select of topk.c: per digit, thread 0 walks the bins from the top to
 *              the one where the k-th largest lies; digits 2 and 3 count only the entries
 *              whose bits so far match (v is computed again from x and r: the same IEEE add);
 *              the k-th largest magnitude is the kept entries' lo;
 *   keep       tiles of kTopkThreads entries in index order: an entry above the threshold is
 *              kept, and of those equal to it the first `ties` (a block-wide rank of the
 *              equal ones: ballots and a count per warp); each kept entry's rank among the
 *              kept ones is its place in the streams, its index and value or-ed into them
 *              (atomicOr: neighbours share words), the residual written.
 * The output is zeroed first (cudaMemsetAsync), so the padding bits stay zero.
 */
constexpr int kTopkThreads = 256;

__device__ __forceinline__ float topk_v(const float *__restrict__ x, const float *r, uint32_t i)
{
    return r ? PCM_ADD(x[i], r[i]) : x[i];
}

/* The rank of this thread's flag among the block's set flags before it (thread order) and, in
   total, how many are set. Every thread of the block calls it; sh: one word per warp. */
__device__ __forceinline__ uint32_t block_rank(bool flag, uint32_t *sh, uint32_t &total)
{
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned ballot = __ballot_sync(kFull, flag);
    uint32_t before = 0, sum = 0;
    if (lane == 0)
        sh[warp] = (uint32_t)__popc(ballot);
    __syncthreads();
    for (unsigned w = 0; w < kTopkThreads / 32; w++) {
        before += w < warp ? sh[w] : 0u;
        sum += sh[w];
    }
    __syncthreads(); /* (sh is the next call's) */
    total = sum;
    return before + (uint32_t)__popc(ballot & ((1u << lane) - 1u));
}

/* Or w <= 16 bits v into the LSB-first stream s (32-bit words) at bit pos. */
__device__ __forceinline__ void topk_put(uint32_t *s, uint64_t pos, uint32_t w, uint32_t v)
{
    const uint32_t sh = (uint32_t)(pos & 31u);
    atomicOr(s + (pos >> 5), v << sh);
    if (sh + w > 32u)
        atomicOr(s + (pos >> 5) + 1, v >> (32u - sh));
}

/* w <= 16 bits at bit pos of the LSB-first byte stream p. */
__device__ __forceinline__ uint32_t topk_get(const uint8_t *__restrict__ p, uint64_t pos,
                                             uint32_t w)
{
    const uint32_t bytes = ((uint32_t)(pos & 7u) + w + 7u) / 8u;
    uint32_t x = 0;
    for (uint32_t i = 0; i < bytes; i++)
        x |= (uint32_t)p[(pos >> 3) + i] << (8u * i);
    return (x >> (pos & 7u)) & ((1u << w) - 1u);
}

__global__ void __launch_bounds__(kTopkThreads)
    topk_encode_kernel(const float *__restrict__ x, float *__restrict__ res,
                       uint8_t *__restrict__ out, KArgs a, uint64_t *err)
{
    __shared__ uint32_t count[2048], wsum[kTopkThreads / 32];
    __shared__ uint32_t s_bad, s_maxu, s_bin, s_acc;
    const uint64_t m = blockIdx.x, base = m * a.tk_block;
    const uint32_t len = (uint32_t)(a.n - base < a.tk_block ? a.n - base : a.tk_block);
    const uint32_t km = len < a.tk_k ? len : a.tk_k;
    const unsigned tid = threadIdx.x;
    const float *xb = x + base;
    float *rb = res ? res + base : nullptr;
    uint64_t bad = kNoErr;
    uint32_t maxu = 0, prefix = 0, mask = 0, above = 0;

    for (uint32_t b = tid; b < 2048u; b += kTopkThreads)
        count[b] = 0;
    if (tid == 0)
        s_bad = s_maxu = 0;
    __syncthreads();
    for (uint32_t i = tid; i < len; i += kTopkThreads) { /* pass 0 */
        const uint32_t u = pcm_mag(topk_v(xb, rb, i));
        if (u >= PCM_ABS_2_126) {
            bad = min(bad,
                      err_word(1, base + i, u >= PCM_ABS_INF ? PCM_ERR_NONFINITE : PCM_ERR_RANGE));
            continue;
        }
        atomicAdd(&count[u >> 20], 1u);
        maxu = u > maxu ? u : maxu;
    }
    if (bad != kNoErr) {
        err_flush(err, bad);
        atomicOr(&s_bad, 1u);
    }
    atomicMax(&s_maxu, maxu);
    __syncthreads();
    if (s_bad) /* (the same for every thread: its output is unspecified, as the CPU's) */
        return;

    /* the digits of |v|'s 31 bits, most significant first: 11 bits, 11, then 9 (topk.c) */
    for (int d = 0; d < 3; d++) {
        const int sh = d == 0 ? 20 : d == 1 ? 9 : 0;
        const uint32_t bins = d == 2 ? 512u : 2048u;
        if (d > 0) {
            for (uint32_t b = tid; b < bins; b += kTopkThreads)
                count[b] = 0;
            __syncthreads();
            for (uint32_t i = tid; i < len; i += kTopkThreads) {
                const uint32_t u = pcm_mag(topk_v(xb, rb, i));
                if ((u & mask) == prefix)
                    atomicAdd(&count[(u >> sh) & (bins - 1u)], 1u);
            }
            __syncthreads();
        }
        if (tid == 0) { /* the bin where the count from the top reaches need */
            uint32_t need = km - above, acc = 0, bin = 0;
            for (uint32_t b = bins; b-- > 0;) {
                if (acc + count[b] >= need) {
                    bin = b;
                    break;
                }
                acc += count[b];
            }
            s_bin = bin;
            s_acc = acc;
        }
        __syncthreads();
        above += s_acc; /* entries in the bins above: larger than any in this bin */
        prefix |= s_bin << sh;
        mask |= (bins - 1u) << sh;
        __syncthreads(); /* (s_bin, s_acc and count are the next digit's) */
    }

    /* prefix is the k-th largest magnitude: the kept entries' lo; the largest is their hi */
    const float lo = PCM_FLOAT(prefix);
    const uint32_t ties = km - above;
    float scale, inv;
    pcm_mm_params(lo, PCM_FLOAT(s_maxu), a.levels, &scale, &inv);
    if (tid == 0)
        *reinterpret_cast<float2 *>(out + 8 * m) = make_float2(scale, lo);
    uint32_t *idx = reinterpret_cast<uint32_t *>(out + a.tk_idx_off);
    uint32_t *val = reinterpret_cast<uint32_t *>(out + a.tk_val_off);
    const uint64_t pos0 = m * (uint64_t)a.tk_k; /* (every block before is whole: k_m = k) */
    uint32_t eq_base = 0, keep_base = 0;
    for (uint32_t t0 = 0; t0 < len; t0 += kTopkThreads) { /* (the same trips for every thread) */
        const uint32_t i = t0 + tid;
        const float v = i < len ? topk_v(xb, rb, i) : 0.0f;
        const uint32_t u = pcm_mag(v);
        uint32_t n_eq, n_keep;
        const bool eq = i < len && u == prefix, gt = i < len && u > prefix;
        const uint32_t eq_rank = eq_base + block_rank(eq, wsum, n_eq);
        const bool keep = gt || (eq && eq_rank < ties);
        const uint32_t j = keep_base + block_rank(keep, wsum, n_keep);
        eq_base += n_eq;
        keep_base += n_keep;
        if (i >= len)
            continue;
        if (!keep) { /* an entry not kept keeps all of v_i */
            if (rb)
                rb[i] = v;
            continue;
        }
        const uint32_t sign = PCM_BITS(v) >> 31, gi = (uint32_t)(base + i);
        const float uniform =
            a.sr ? psagg__rng_u(psagg__rng_hash32(a.k0, a.k1, gi >> 1), gi) : 0.5f;
        const uint32_t q = pcm_mm_level(PCM_FLOAT(u), lo, scale, inv, a.levels_f, uniform);
        topk_put(idx, (pos0 + j) * a.tk_ib, a.tk_ib, i);
        topk_put(val, (pos0 + j) * a.bits, a.bits, sign | q << 1);
        if (rb) {
            const float y = pcm_mm_value(lo, scale, q);
            rb[i] = PCM_SUB(v, sign ? -y : y);
        }
    }
}

/* 1 if the bits of the stream at s from bit `used` to its end (the next multiple of 64) are
   zero. s is 8-byte aligned. */
__device__ __forceinline__ bool topk_tail_ok(const uint8_t *__restrict__ s, uint64_t used)
{
    const uint32_t rem = (uint32_t)(used & 63u);
    return !rem || !(*reinterpret_cast<const uint64_t *>(s + (used >> 6) * 8) >> rem);
}

/* Validate block m's meta and indices (stage-0 BADMETA, index m; the streams' padding: index
   nb, checked by block 0) and write each kept entry's y into out (ADD: out + y). */
template <bool ADD>
__global__ void __launch_bounds__(kTopkThreads)
    topk_decode_kernel(const uint8_t *__restrict__ in, float *__restrict__ out, KArgs a,
                       uint64_t *err)
{
    const uint64_t m = blockIdx.x, base = m * a.tk_block, pos0 = m * (uint64_t)a.tk_k;
    const uint32_t len = (uint32_t)(a.n - base < a.tk_block ? a.n - base : a.tk_block);
    const uint32_t km = len < a.tk_k ? len : a.tk_k;
    const float2 meta = get_meta(in, m); /* .x = scale, .y = lo */
    const bool meta_ok = pcm_topk_meta_ok(meta.x, meta.y, a.levels);
    const uint8_t *idx = in + a.tk_idx_off, *val = in + a.tk_val_off;
    uint64_t bad = meta_ok ? kNoErr : err_word(0, m, PCM_ERR_BADMETA);
    if (m == 0 && threadIdx.x == 0 &&
        (!topk_tail_ok(idx, a.tk_kept * a.tk_ib) || !topk_tail_ok(val, a.tk_kept * a.bits)))
        bad = min(bad, err_word(0, a.nb, PCM_ERR_BADMETA));
    for (uint32_t j = threadIdx.x; j < km; j += kTopkThreads) {
        const uint32_t i = topk_get(idx, (pos0 + j) * a.tk_ib, a.tk_ib);
        if (i >= len || (j && i <= topk_get(idx, (pos0 + j - 1) * a.tk_ib, a.tk_ib))) {
            bad = min(bad, err_word(0, m, PCM_ERR_BADMETA));
            continue;
        }
        if (!meta_ok)
            continue;
        const uint32_t w = topk_get(val, (pos0 + j) * a.bits, a.bits);
        float y = pcm_mm_value(meta.y, meta.x, w >> 1);
        if (w & 1u)
            y = -y;
        float *o = out + base + i;
        *o = ADD ? PCM_ADD(*o, y) : y;
    }
    err_flush(err, bad);
}

cudaError_t launch_topk_encode(const KArgs &a, const float *x, float *residual, uint8_t *out,
                               uint64_t *err, cudaStream_t s)
{
    cudaError_t e = cudaMemsetAsync(out, 0, a.tk_size, s);
    if (e != cudaSuccess)
        return e;
    return launch(topk_encode_kernel, (unsigned)a.nb, kTopkThreads, s, x, residual, out, a, err);
}

template <bool ADD>
cudaError_t launch_topk_decode(const KArgs &a, const uint8_t *in, float *out, uint64_t *err,
                               cudaStream_t s)
{
    if (!ADD) { /* every entry not kept decodes to -0 */
        cudaError_t e =
            launch(fill_kernel, grid_stride_blocks(a.n), 256, s, out, (size_t)a.n, -0.0f);
        if (e != cudaSuccess)
            return e;
    }
    return launch(topk_decode_kernel<ADD>, (unsigned)a.nb, kTopkThreads, s, in, out, a, err);
}

/* ---------------------------------------------------------------- thc (kernels/thc.h)
 *
 * One thread block per thc block of P coordinates, as the CPU rotates them one at a time; the
 * block's coordinates in shared memory (D <= kThcSmem) or in the caller's scratch (N' floats).
 * Each phase of codec_cuda_math.h's thc section is a loop of the block's threads over its
 * indices, with a barrier between phases (test_cuda_math.c runs the same phases on the host):
 *   encode  load (stage-1 errors at the element), the stages, rotated (the peak: atomicMax of
 *           |v|'s bits), the meta (the scale given, the peak), pack (byte by byte: its 8 / b
 *           indices and their residuals);
 *   decode  the block's meta (stage-0 BADMETA, index the block), unplane (a sum above what
 *           the block's pushes make: stage-1 BADMETA at its coordinate), the stages, store.
 * The index stream's padding is zeroed first (cudaMemsetAsync).
 */
constexpr int kThcThreads = 256;
constexpr uint32_t kThcSmem = 8192; /* coordinates in shared memory: 32 KB */

/* y <- H y: the stages h = 1, 2, .., P/2, a barrier after each. */
__device__ __forceinline__ void thc_stages(float *y, uint32_t p)
{
    for (uint32_t h = 1; h < p; h <<= 1) {
        for (uint32_t k = threadIdx.x; k < p / 2; k += kThcThreads)
            pcm_thc_butterfly(y, k, h);
        __syncthreads();
    }
}

__global__ void __launch_bounds__(kThcThreads)
    thc_encode_kernel(const float *__restrict__ x, float *res, const float *__restrict__ scales,
                      uint8_t *__restrict__ out, float *scratch, KArgs a, uint64_t *err)
{
    extern __shared__ float sh_thc[];
    __shared__ uint32_t s_peak;
    const uint64_t m = blockIdx.x, e0 = m * a.th_block;
    const uint32_t len = (uint32_t)(a.n - e0 < a.th_block ? a.n - e0 : a.th_block);
    const uint32_t p = pcm_thc_pad(len, a.th_block);
    float *y = a.th_block <= kThcSmem ? sh_thc : scratch + e0;
    float *rb = res ? res + e0 : nullptr;
    uint64_t bad = kNoErr;
    uint32_t top = 0;

    if (threadIdx.x == 0)
        s_peak = 0;
    for (uint32_t i = threadIdx.x; i < p; i += kThcThreads) {
        const uint32_t code = pcm_thc_load(x + e0, len, a.rk0, a.rk1, e0, i, y);
        if (code)
            bad = min(bad, err_word(1, e0 + i, code));
    }
    err_flush(err, bad);
    __syncthreads();
    thc_stages(y, p);
    const float f = pcm_thc_f(p);
    for (uint32_t i = threadIdx.x; i < p; i += kThcThreads) {
        const uint32_t u = pcm_thc_rotated(y, rb, i, f);
        top = u > top ? u : top;
    }
    atomicMax(&s_peak, top);
    __syncthreads();
    const float c = scales[m];
    float step = 0.0f, slope = 0.0f;
    if (c > 0)
        pcm_thc_table(c, a.levels, &step, &slope);
    if (threadIdx.x == 0)
        *reinterpret_cast<float2 *>(out + 8 * m) = make_float2(c, PCM_FLOAT(s_peak));
    uint8_t *idx = out + a.th_meta + e0 * a.bits / 8;
    for (uint32_t o = threadIdx.x; o < p * a.bits / 8; o += kThcThreads)
        idx[o] = (uint8_t)pcm_thc_pack(y, rb, o, a.bits, c, step, slope, a.k0, a.k1, e0);
}

__global__ void __launch_bounds__(kThcThreads)
    thc_decode_kernel(const uint8_t *__restrict__ in, float *__restrict__ out, float *scratch,
                      KArgs a, uint64_t *err)
{
    extern __shared__ float sh_thc[];
    const uint64_t m = blockIdx.x, e0 = m * a.th_block;
    const uint32_t len = (uint32_t)(a.n - e0 < a.th_block ? a.n - e0 : a.th_block);
    const uint32_t p = pcm_thc_pad(len, a.th_block);
    float *z = a.th_block <= kThcSmem ? sh_thc : scratch + e0;
    const uint8_t *mt = in + 12 * m;
    const float c = *reinterpret_cast<const float *>(mt),
                peak = *reinterpret_cast<const float *>(mt + 4);
    const uint32_t count = *reinterpret_cast<const uint32_t *>(mt + 8);
    uint64_t bad = kNoErr;

    if (!pcm_thc_meta_ok(c, peak, count, a.th_inputs)) { /* (the same for every thread) */
        if (threadIdx.x == 0)
            err_flush(err, err_word(0, m, PCM_ERR_BADMETA));
        return;
    }
    float step = 0.0f, slope;
    if (c > 0)
        pcm_thc_table(c, a.levels, &step, &slope);
    const uint32_t top = count * a.levels;
    const float fz = a.th_op == PSAGG_DECODE_SCALE ? a.th_factor : 1.0f;
    for (uint32_t i = threadIdx.x; i < p; i += kThcThreads)
        if (pcm_thc_unplane(a.bits, a.th_width, in + a.th_meta, e0, i, top, (int32_t)top, step, fz,
                            z))
            bad = min(bad, err_word(1, e0 + i, PCM_ERR_BADMETA));
    err_flush(err, bad);
    __syncthreads();
    thc_stages(z, p);
    const float f = pcm_thc_f(p);
    for (uint32_t i = threadIdx.x; i < len; i += kThcThreads)
        pcm_thc_store(z, i, f, a.rk0, a.rk1, e0, a.th_op, out + e0 + i);
}

size_t thc_shared(const KArgs &a)
{
    return a.th_block <= kThcSmem ? a.th_block * sizeof(float) : 0;
}

} /* namespace */

uint32_t thc_smem_max()
{
    return kThcSmem;
}

cudaError_t launch_thc_encode(const KArgs &a, const float *x, float *residual, const float *scales,
                              uint8_t *out, float *scratch, uint64_t *err, cudaStream_t s)
{
    const uint64_t used = a.th_meta + a.th_np * a.bits / 8;
    if (used < a.th_size) {
        cudaError_t e = cudaMemsetAsync(out + used, 0, a.th_size - used, s);
        if (e != cudaSuccess)
            return e;
    }
    return launch_shared(thc_encode_kernel, (unsigned)a.nb, kThcThreads, thc_shared(a), s, x,
                         residual, scales, out, scratch, a, err);
}

cudaError_t launch_thc_decode(const KArgs &a, const uint8_t *in, float *out, float *scratch,
                              uint64_t *err, cudaStream_t s)
{
    return launch_shared(thc_decode_kernel, (unsigned)a.nb, kThcThreads, thc_shared(a), s, in, out,
                         scratch, a, err);
}

namespace
{
} /* namespace */

cudaError_t launch_encode(int id, const KArgs &a, const float *x, float *residual, uint8_t *out,
                          uint64_t *err, cudaStream_t s)
{
    SrcX src{x};
    switch (id) {
    case PSAGG_CODEC_MAXMIN:
        return launch_mm(src, residual, out, a, err, s);
    case PSAGG_CODEC_TOPK:
        return launch_topk_encode(a, x, residual, out, err, s);
    case PSAGG_CODEC_FP32:
        return launch(fp_encode_kernel<PSAGG_CODEC_FP32, SrcX>, elementwise_blocks(a.n), kThreads,
                      s, src, residual, out, a, err);
    case PSAGG_CODEC_FP16:
        return launch(fp_encode_kernel<PSAGG_CODEC_FP16, SrcX>, elementwise_blocks(a.n), kThreads,
                      s, src, residual, out, a, err);
    default:
        return launch(fp_encode_kernel<PSAGG_CODEC_BF16, SrcX>, elementwise_blocks(a.n), kThreads,
                      s, src, residual, out, a, err);
    }
}

template <bool ADD>
static cudaError_t launch_decode_t(int id, const KArgs &a, const uint8_t *in, float *out,
                                   uint64_t *err, cudaStream_t s)
{
    const unsigned blocks = elementwise_blocks(a.n);
    switch (id) {
    case PSAGG_CODEC_TOPK:
        return launch_topk_decode<ADD>(a, in, out, err, s);
    case PSAGG_CODEC_MAXMIN:
        return launch(decode_kernel<PSAGG_CODEC_MAXMIN, ADD>, blocks, kThreads, s, in, out, a, err);
    case PSAGG_CODEC_FP32:
        return launch(decode_kernel<PSAGG_CODEC_FP32, ADD>, blocks, kThreads, s, in, out, a, err);
    case PSAGG_CODEC_FP16:
        return launch(decode_kernel<PSAGG_CODEC_FP16, ADD>, blocks, kThreads, s, in, out, a, err);
    default:
        return launch(decode_kernel<PSAGG_CODEC_BF16, ADD>, blocks, kThreads, s, in, out, a, err);
    }
}

cudaError_t launch_decode(int id, bool accumulate, const KArgs &a, const uint8_t *in, float *out,
                          uint64_t *err, cudaStream_t s)
{
    if (accumulate)
        return launch_decode_t<true>(id, a, in, out, err, s);
    else
        return launch_decode_t<false>(id, a, in, out, err, s);
}

cudaError_t launch_aggregate(int id, const KArgs &a, const InPtrs &in, uint32_t n_in,
                             float *residual, uint8_t *out, uint64_t *err, cudaStream_t s)
{
    const unsigned blocks = elementwise_blocks(a.n);
    switch (id) {
    case PSAGG_CODEC_MAXMIN:
        return launch_mm(SrcAgg<PSAGG_CODEC_MAXMIN>{in, n_in}, residual, out, a, err, s);
    case PSAGG_CODEC_FP32:
        return launch(fp_encode_kernel<PSAGG_CODEC_FP32, SrcAgg<PSAGG_CODEC_FP32>>, blocks,
                      kThreads, s, SrcAgg<PSAGG_CODEC_FP32>{in, n_in}, residual, out, a, err);
    case PSAGG_CODEC_FP16:
        return launch(fp_encode_kernel<PSAGG_CODEC_FP16, SrcAgg<PSAGG_CODEC_FP16>>, blocks,
                      kThreads, s, SrcAgg<PSAGG_CODEC_FP16>{in, n_in}, residual, out, a, err);
    default:
        return launch(fp_encode_kernel<PSAGG_CODEC_BF16, SrcAgg<PSAGG_CODEC_BF16>>, blocks,
                      kThreads, s, SrcAgg<PSAGG_CODEC_BF16>{in, n_in}, residual, out, a, err);
    }
}

cudaError_t launch_scale(float *x, size_t n, float factor, cudaStream_t s)
{
    return launch(scale_kernel, grid_stride_blocks(n), 256, s, x, n, factor);
}

} // namespace psagg__cuda
