/*
 * codec_cuda_math.h - the per-element arithmetic of the CUDA codecs (kernels/codec.h spec),
 * written once and compiled twice: as device code by codec_cuda.cu, and as plain C11 by
 * tests/gpu/test_cuda_math.c, which runs it on the host against the CPU reference. So the
 * exact expressions the kernels evaluate are checked even on machines without a GPU.
 *
 * Every floating-point step is one IEEE-754 binary32 operation with round-to-nearest-even:
 * on the device through the __f*_rn intrinsics (never contracted into FMA), on the host
 * through plain operators (the build uses -ffp-contract=off and SSE arithmetic).
 * Conversions fp32 <-> fp16/bf16 are done on the bit patterns, so they do not depend on the
 * hardware converters' subnormal handling.
 *
 * Layer: kernels.
 */
#ifndef PSAGG_CODEC_CUDA_MATH_H
#define PSAGG_CODEC_CUDA_MATH_H

#include <stdint.h>
#if !defined(__CUDA_ARCH__)
#include <string.h>
#endif

#include "kernels/rng.h"

#if defined(__CUDACC__)
#define PCM_FN static __host__ __device__ __forceinline__
#else
#define PCM_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define PCM_ADD(a, b) __fadd_rn((a), (b))
#define PCM_SUB(a, b) __fsub_rn((a), (b))
#define PCM_MUL(a, b) __fmul_rn((a), (b))
#define PCM_DIV(a, b) __fdiv_rn((a), (b))
#define PCM_U2F(u)    __uint2float_rn(u)
#define PCM_F2U_RZ(f) __float2uint_rz(f)
#define PCM_BITS(f)   __float_as_uint(f)
#define PCM_FLOAT(u)  __uint_as_float(u)
#else
#define PCM_ADD(a, b) ((float)(a) + (float)(b))
#define PCM_SUB(a, b) ((float)(a) - (float)(b))
#define PCM_MUL(a, b) ((float)(a) * (float)(b))
#define PCM_DIV(a, b) ((float)(a) / (float)(b))
#define PCM_U2F(u)    ((float)(uint32_t)(u))
#define PCM_F2U_RZ(f) ((uint32_t)(f)) /* only ever called on values in [0, 255] */
PCM_FN uint32_t pcm_bits_host(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
PCM_FN float pcm_float_host(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define PCM_BITS(f)   pcm_bits_host(f)
#define PCM_FLOAT(u)  pcm_float_host(u)
#endif

/* Error codes stored in the low byte of an error word (see codec_cuda.h). */
#define PCM_ERR_NONFINITE 1u
#define PCM_ERR_RANGE     2u
#define PCM_ERR_BADMETA   3u

#define PCM_MIN_RANGE 0x1p-100f   /* PSAGG_MAXMIN_MIN_RANGE */
#define PCM_ABS_INF   0x7F800000u /* |x| bits >= this: NaN or Inf */
#define PCM_ABS_2_126 0x7E800000u /* |x| bits >= this: |x| >= 2^126 (PSAGG_MAXMIN_MAX_ABS) */

/* ---- RNG (codec.h "RNG"): psagg__rng_hash32 and psagg__rng_u of kernels/rng.h ---- */

/*
 * min/max for the bucket range. For finite values the result is order-independent (the
 * kernels reduce in tree order): equal values give -0 for min of {-0, +0} and +0 for max.
 * Non-finite inputs are reported separately, their result does not matter.
 */
PCM_FN float pcm_min(float a, float b)
{
    if (a == b)
        return PCM_FLOAT(PCM_BITS(a) | PCM_BITS(b));
    return a < b ? a : b;
}

PCM_FN float pcm_max(float a, float b)
{
    if (a == b)
        return PCM_FLOAT(PCM_BITS(a) & PCM_BITS(b));
    return a > b ? a : b;
}

/* 0, or the error code of a maxmin input value (|v| must be < 2^126 and finite). */
PCM_FN uint32_t pcm_maxmin_check(float v)
{
    uint32_t a = PCM_BITS(v) & 0x7FFFFFFFu;
    if (a >= PCM_ABS_INF)
        return PCM_ERR_NONFINITE;
    return a >= PCM_ABS_2_126 ? PCM_ERR_RANGE : 0u;
}

PCM_FN uint32_t pcm_fp32_check(float v)
{
    return (PCM_BITS(v) & 0x7FFFFFFFu) >= PCM_ABS_INF ? PCM_ERR_NONFINITE : 0u;
}

/* ---- maxmin ---- */

/* scale and inv of a bucket from its lo and hi (scale = 0: constant bucket, every q = 0). */
PCM_FN void pcm_mm_params(float lo, float hi, uint32_t levels, float *scale, float *inv)
{
    float range = PCM_SUB(hi, lo);
    if (range < PCM_MIN_RANGE) {
        *scale = 0.0f;
        *inv = 0.0f;
    } else {
        *scale = PCM_DIV(range, PCM_U2F(levels));
        *inv = PCM_DIV(1.0f, *scale);
    }
}

/* q = (uint32)min((v - lo) * inv + u, L); scale == 0 gives 0. */
PCM_FN uint32_t pcm_mm_level(float v, float lo, float scale, float inv, float levels_f, float u)
{
    float t, s;
    if (scale == 0.0f)
        return 0u;
    t = PCM_MUL(PCM_SUB(v, lo), inv);
    s = PCM_ADD(t, u);
    s = s < levels_f ? s : levels_f; /* NaN cannot occur for valid input; it maps to L */
    return PCM_F2U_RZ(s);
}

/* y = lo + scale * (float)q (multiply, then add) */
PCM_FN float pcm_mm_value(float lo, float scale, uint32_t q)
{
    return PCM_ADD(lo, PCM_MUL(scale, PCM_U2F(q)));
}

/* A bucket's meta is valid iff lo finite, scale finite and >= 0 (not -0), lo + scale*L finite. */
PCM_FN int pcm_mm_meta_ok(float scale, float lo, uint32_t levels)
{
    uint32_t sb = PCM_BITS(scale), lb = PCM_BITS(lo);
    if ((lb & 0x7FFFFFFFu) >= PCM_ABS_INF)
        return 0;
    if (sb >= PCM_ABS_INF) /* sign set (negative or -0), NaN or Inf */
        return 0;
    return (PCM_BITS(pcm_mm_value(lo, scale, levels)) & 0x7FFFFFFFu) < PCM_ABS_INF;
}

/* ---- topk (kernels/topk.h): maxmin's level arithmetic over |v|, L = 2^(b-1) - 1 ---- */

/* |v| as its binary32 bit pattern: the order topk selects by (-0 and +0 are one magnitude). */
PCM_FN uint32_t pcm_mag(float v)
{
    return PCM_BITS(v) & 0x7FFFFFFFu;
}

/* A block's meta is valid iff scale and lo are finite with their sign bits clear and
   lo + scale * L is finite. */
PCM_FN int pcm_topk_meta_ok(float scale, float lo, uint32_t levels)
{
    return PCM_BITS(lo) < PCM_ABS_INF && pcm_mm_meta_ok(scale, lo, levels);
}

/* ---- fp16: round-to-nearest-even on the bit pattern, subnormals kept ---- */

/* *err = 0, PCM_ERR_NONFINITE or PCM_ERR_RANGE (|x| >= 65520 rounds to Inf). */
PCM_FN uint16_t pcm_f32_to_f16(float x, uint32_t *err)
{
    uint32_t u = PCM_BITS(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t h;
    *err = 0;
    if (a >= PCM_ABS_INF) {
        *err = PCM_ERR_NONFINITE;
        h = a > PCM_ABS_INF ? 0x7E00u : 0x7C00u;
    } else if (a >= 0x477FF000u) { /* 65520: rounds to Inf */
        *err = PCM_ERR_RANGE;
        h = 0x7C00u;
    } else if (a >= 0x38800000u) { /* 2^-14: normal half */
        h = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    } else if (a <= 0x33000000u) { /* <= 2^-25: rounds to 0 (2^-25 is a tie, to even) */
        h = 0;
    } else { /* subnormal half: value / 2^-24 = mant * 2^(e - 126), rounded to even */
        uint32_t e = a >> 23, mant = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        h = mant >> shift;
        if (rem > halfway || (rem == halfway && (h & 1u)))
            h++;
    }
    return (uint16_t)(sign | h);
}

/* Exact. *err = PCM_ERR_NONFINITE for Inf/NaN encodings. */
PCM_FN float pcm_f16_to_f32(uint16_t hv, uint32_t *err)
{
    uint32_t h = hv, sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    *err = 0;
    if (e == 0x1Fu) {
        *err = PCM_ERR_NONFINITE;
        return PCM_FLOAT(sign | 0x7F800000u | (m << 13));
    }
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
        float f = PCM_MUL(PCM_U2F(m), 0x1p-24f);
        return PCM_FLOAT(sign | PCM_BITS(f));
    }
    return PCM_FLOAT(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- bf16: (u + 0x7FFF + ((u >> 16) & 1)) >> 16 ---- */
PCM_FN uint16_t pcm_f32_to_bf16(float x, uint32_t *err)
{
    uint32_t u = PCM_BITS(x);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    *err = 0;
    if ((u & 0x7FFFFFFFu) >= PCM_ABS_INF) {
        *err = PCM_ERR_NONFINITE;
        r = u >> 16; /* unspecified on error; avoid wrapping NaN into a number */
    } else if ((r & 0x7F80u) == 0x7F80u) {
        *err = PCM_ERR_RANGE;
    }
    return (uint16_t)r;
}

PCM_FN float pcm_bf16_to_f32(uint16_t hv, uint32_t *err)
{
    uint32_t u = (uint32_t)hv << 16;
    *err = (u & 0x7F800000u) == 0x7F800000u ? PCM_ERR_NONFINITE : 0u;
    return PCM_FLOAT(u);
}

#endif /* PSAGG_CODEC_CUDA_MATH_H */
