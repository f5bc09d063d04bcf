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
#include <math.h>
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
#define PCM_SQRT(a)   __fsqrt_rn(a)
#define PCM_U2F(u)    __uint2float_rn(u)
#define PCM_I2F(i)    __int2float_rn(i)
#define PCM_F2U_RZ(f) __float2uint_rz(f)
#define PCM_BITS(f)   __float_as_uint(f)
#define PCM_FLOAT(u)  __uint_as_float(u)
#else
#define PCM_ADD(a, b) ((float)(a) + (float)(b))
#define PCM_SUB(a, b) ((float)(a) - (float)(b))
#define PCM_MUL(a, b) ((float)(a) * (float)(b))
#define PCM_DIV(a, b) ((float)(a) / (float)(b))
#define PCM_SQRT(a)   sqrtf(a)
#define PCM_U2F(u)    ((float)(uint32_t)(u))
#define PCM_I2F(i)    ((float)(int32_t)(i))
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

/* ---- thc (kernels/thc.h, "THE WORKERS' SIDE"): one block of P coordinates at a time ----
 *
 * The kernels (one thread block per thc block) and test_cuda_math.c's emulation run the same
 * phases over these functions, each a loop over its indices with a barrier between phases:
 *   encode  load (i < P), the stages h = 1, 2, .., P/2 (butterflies k < P/2), rotated (i < P,
 *           the peak), pack (byte o < P * b / 8: its 8 / b indices, their residuals);
 *   decode  unplane (i < P, the sums' bound), the stages, store (i < len).
 * e0 is the block's first coordinate (a multiple of 64; every block before it is whole, so it
 * is also the block's first element).
 */
#define PCM_THC_MAX_ABS 0x71800000u /* bits of 2^100 (PSAGG_THC_MAX_ABS) */

/* The length block m of len elements rotates at (thc.h): D, or for a shorter last block the
   least power of two >= max(64, len). */
PCM_FN uint32_t pcm_thc_pad(uint32_t len, uint32_t D)
{
    uint32_t p = 64;
    if (len >= D)
        return D;
    while (p < len)
        p <<= 1;
    return p;
}

/* 0, or the error code of an input: finite, |x| <= 2^100 */
PCM_FN uint32_t pcm_thc_check(float x)
{
    uint32_t a = PCM_BITS(x) & 0x7FFFFFFFu;
    if (a >= PCM_ABS_INF)
        return PCM_ERR_NONFINITE;
    return a > PCM_THC_MAX_ABS ? PCM_ERR_RANGE : 0u;
}

/* s_e v: v's sign bit flipped where bit (e & 31) of hash32(rot, e >> 5) is set */
PCM_FN float pcm_thc_sign(uint32_t rk0, uint32_t rk1, uint64_t e, float v)
{
    uint32_t h = psagg__rng_hash32(rk0, rk1, (uint32_t)(e >> 5));
    return PCM_FLOAT(PCM_BITS(v) ^ (((h >> (e & 31u)) & 1u) << 31));
}

/* f = 1 / sqrt(P) */
PCM_FN float pcm_thc_f(uint32_t p)
{
    return PCM_DIV(1.0f, PCM_SQRT(PCM_U2F(p)));
}

/* encode, load: y_i = s_(e0+i) x_i for i < len, +0 beyond; the error code of x_i */
PCM_FN uint32_t pcm_thc_load(const float *xb, uint32_t len, uint32_t rk0, uint32_t rk1, uint64_t e0,
                             uint32_t i, float *y)
{
    if (i >= len) {
        y[i] = 0.0f;
        return 0u;
    }
    y[i] = pcm_thc_sign(rk0, rk1, e0 + i, xb[i]);
    return pcm_thc_check(xb[i]);
}

/* butterfly k (< P/2) of stage h: (y_i, y_(i+h)) <- (y_i + y_(i+h), y_i - y_(i+h)), i the k-th
   index with i & h == 0 */
PCM_FN void pcm_thc_butterfly(float *y, uint32_t k, uint32_t h)
{
    const uint32_t i = ((k & ~(h - 1u)) << 1) | (k & (h - 1u));
    const float a = y[i], b = y[i + h];
    y[i] = PCM_ADD(a, b);
    y[i + h] = PCM_SUB(a, b);
}

/* encode, rotated: v_i = y_i f (+ r_i) into y_i; |v_i|'s bits (the peak is their max) */
PCM_FN uint32_t pcm_thc_rotated(float *y, const float *r, uint32_t i, float f)
{
    float v = PCM_MUL(y[i], f);
    if (r)
        v = PCM_ADD(v, r[i]);
    y[i] = v;
    return PCM_BITS(v) & 0x7FFFFFFFu;
}

/* The table of a block at scale c (> 0): step = c / (L - 1), a = (L - 1) / (2 c). */
PCM_FN void pcm_thc_table(float c, uint32_t levels, float *step, float *a)
{
    *step = PCM_DIV(c, PCM_U2F(levels));
    *a = PCM_DIV(PCM_U2F(levels), PCM_MUL(2.0f, c));
}

/* encode, pack: byte o of the block's index stream from its 8 / b coordinates (scale c, 0: all
   indices 0 and the residual keeps v), their residuals (r: NULL or the block's) written */
PCM_FN uint32_t pcm_thc_pack(const float *y, float *r, uint32_t o, uint32_t bits, float c,
                             float step, float a, uint32_t k0, uint32_t k1, uint64_t e0)
{
    const uint32_t per = 8u / bits, levels = (1u << bits) - 1u;
    uint32_t byte = 0;
    for (uint32_t j = 0; j < per; j++) {
        const uint32_t i = o * per + j, e = (uint32_t)(e0 + i);
        const float v = y[i];
        uint32_t q;
        if (!(c > 0)) {
            if (r)
                r[i] = v;
            continue;
        }
        {
            const float u = psagg__rng_u(psagg__rng_hash32(k0, k1, e >> 1), e);
            const float cl = v < -c ? -c : v > c ? c : v;
            q = PCM_F2U_RZ(PCM_ADD(PCM_MUL(PCM_ADD(cl, c), a), u));
            q = q > levels ? levels : q;
        }
        if (r)
            r[i] = PCM_SUB(v, PCM_MUL(PCM_I2F(2 * (int32_t)q - (int32_t)levels), step));
        byte |= q << (j * bits);
    }
    return byte;
}

/* An update's block meta (thc.h's UPDATE): a scale of +0 or in [2^-100, 2^100], a peak finite
   and >= +0, a count up to the width's inputs and 0 exactly when the scale is. */
PCM_FN int pcm_thc_meta_ok(float c, float peak, uint32_t count, uint32_t inputs)
{
    const uint32_t cb = PCM_BITS(c);
    const int scale_ok = cb == 0 || (c >= 0x1p-100f && c <= 0x1p100f);
    return scale_ok && PCM_BITS(peak) < PCM_ABS_INF && count <= inputs && (count == 0) == (cb == 0);
}

/* Element e's sum in a sum stream of width w (4, 8 or 16) at b bits (thc.h's planes; at w = 4
   planes j and j + P/2 share a run of 64 bytes, low and high nibbles). */
PCM_FN uint32_t pcm_thc_sum_at(uint32_t bits, uint32_t width, const uint8_t *sum, uint64_t e)
{
    const uint64_t G = 512u / bits, P = 8u / bits, g = e / G, r = e % G, j = r % P, i = r / P;
    const uint64_t at = g * G + j * 64u + i;
    if (width == 4)
        return (uint32_t)(sum[g * G / 2u + (j % (P / 2u)) * 64u + i] >> (j / (P / 2u) * 4u)) & 15u;
    return width == 8 ? sum[at] : (uint32_t)sum[2 * at] | (uint32_t)sum[2 * at + 1] << 8;
}

/* decode, unplane: z_i = ((2 S - off) step) fz for coordinate e0 + i; 1 when S exceeds top
   (more than the block's pushes can make: PCM_ERR_BADMETA at that coordinate) */
PCM_FN uint32_t pcm_thc_unplane(uint32_t bits, uint32_t width, const uint8_t *sum, uint64_t e0,
                                uint32_t i, uint32_t top, int32_t off, float step, float fz,
                                float *z)
{
    const uint32_t S = pcm_thc_sum_at(bits, width, sum, e0 + i);
    z[i] = PCM_MUL(PCM_MUL(PCM_I2F(2 * (int32_t)S - off), step), fz);
    return S > top;
}

/* decode, store: x = s_(e0+i) (z_i f) into *out as op says (0 SET or SCALE, 1 ADD, 2 FIRST:
   psagg__decode_op's) */
PCM_FN void pcm_thc_store(const float *z, uint32_t i, float f, uint32_t rk0, uint32_t rk1,
                          uint64_t e0, int op, float *out)
{
    const float x = pcm_thc_sign(rk0, rk1, e0 + i, PCM_MUL(z[i], f));
    *out = op == 1 ? PCM_ADD(*out, x) : op == 2 ? PCM_ADD(0.0f, x) : x;
}

#endif /* PSAGG_CODEC_CUDA_MATH_H */
