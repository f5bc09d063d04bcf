/*
 * thc_body.h - the workers' side of thc (kernels/thc.h, "THE WORKERS' SIDE") one block at a
 * time, written for the compiler to vectorize: included by cpu/thc_scalar.c, thc_avx2.c and
 * thc_avx512.c, each compiled at -O3 for its ISA with -ffp-contract=off, so every path does the
 * same binary32 operations in the same order and writes the same bytes (unit.thc compares
 * them). Two loops the compiler left scalar are written with the ISA's intrinsics: the
 * Hadamard transform's first three stages (within 8 coordinates: in registers) and the signs
 * (the hash's bits as lane masks); the same operations, so the same bytes. Each file defines
 * PSAGG_THC_WORKER (its psagg__thc_worker) before including this. Layer: kernels.
 */
#ifndef PSAGG_THC_WORKER
#error "define PSAGG_THC_WORKER before including thc_body.h"
#endif

#include <string.h>

/* The intrinsics' paths where this file is compiled for AVX-512 or AVX2; never in the plain C
   reference (thc_scalar.c defines PSAGG_THC_PLAIN), even when built with -march=native. */
#if !defined(PSAGG_THC_PLAIN) && defined(__AVX512F__)
#define THC_AVX512 1
#elif !defined(PSAGG_THC_PLAIN) && defined(__AVX2__)
#define THC_AVX2 1
#endif
#if defined(THC_AVX512) || defined(THC_AVX2)
#include <immintrin.h>
#endif

#include "impl.h"
#include "kernels/rng.h"

/* dst_i = s_(e0 + i) * src_i for i < len: the sign bit flipped where thc.h's hash bit is set;
   e0 is a multiple of 64 (blocks rotate at powers of two >= 64), so each 32 signs share one
   hash. */
static inline __attribute__((always_inline)) void
thc_signs(psagg__rng_key rot, size_t e0, const float *src, float *dst, uint32_t len)
{
    for (uint32_t w = 0; w < len; w += 32) {
        const uint32_t h = psagg__rng_hash32(rot.k0, rot.k1, (uint32_t)((e0 + w) >> 5));
        const uint32_t n = len - w < 32 ? len - w : 32;
#if defined(THC_AVX512)
        if (n == 32) { /* (the hash's bits as two lane masks: xor the sign where set) */
            const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
            for (uint32_t q = 0; q < 2; q++) {
                __m512i v = _mm512_loadu_si512(src + w + 16 * q);
                v = _mm512_mask_xor_epi32(v, (__mmask16)(h >> (16 * q)), v, sign);
                _mm512_storeu_si512(dst + w + 16 * q, v);
            }
            continue;
        }
#elif defined(THC_AVX2)
        if (n == 32) { /* (each lane's bit of the hash, shifted to the sign) */
            const __m256i lane = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
            for (uint32_t q = 0; q < 4; q++) {
                const __m256i bits = _mm256_set1_epi32((int)(h >> (8 * q)));
                __m256i v = _mm256_loadu_si256((const __m256i *)(src + w + 8 * q));
                v = _mm256_xor_si256(v, _mm256_and_si256(_mm256_sllv_epi32(bits, lane),
                                                         _mm256_set1_epi32((int)0x80000000u)));
                _mm256_storeu_si256((__m256i *)(dst + w + 8 * q), v);
            }
            continue;
        }
#endif
        for (uint32_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &src[w + i], 4);
            u ^= ((h >> i) & 1u) << 31;
            memcpy(&dst[w + i], &u, 4);
        }
    }
}

/* (a_i, b_i) <- (a_i + b_i, a_i - b_i) for i < h: a run of one stage, whose halves do not
   overlap (restrict: the compiler vectorizes it without a check) */
static inline __attribute__((always_inline)) void thc_butterflies(float *restrict a,
                                                                  float *restrict b, uint32_t h)
{
    for (uint32_t i = 0; i < h; i++) {
        float x = a[i], z = b[i];
        a[i] = x + z;
        b[i] = x - z;
    }
}

/* y <- H y in place (thc.h's stages: pairs (i, i + h), i & h == 0, in runs of h). The first
   three stages (h = 1, 2, 4) act within each 8 coordinates: a vector unit does them in its
   registers, each pair's a + b and a - b the same operations as the scalar loops' (p >= 64). */
static inline __attribute__((always_inline)) void thc_hadamard(float *y, uint32_t p)
{
#if defined(THC_AVX512)
    for (uint32_t j = 0; j < p; j += 16) {
        __m512 v = _mm512_loadu_ps(y + j), w;
        w = _mm512_permute_ps(v, 0xB1); /* h = 1: lane i + 1 <-> i */
        v = _mm512_mask_blend_ps(0xAAAA, _mm512_add_ps(v, w), _mm512_sub_ps(w, v));
        w = _mm512_permute_ps(v, 0x4E); /* h = 2 */
        v = _mm512_mask_blend_ps(0xCCCC, _mm512_add_ps(v, w), _mm512_sub_ps(w, v));
        w = _mm512_shuffle_f32x4(v, v, 0xB1); /* h = 4: 128-bit lanes swapped */
        v = _mm512_mask_blend_ps(0xF0F0, _mm512_add_ps(v, w), _mm512_sub_ps(w, v));
        _mm512_storeu_ps(y + j, v);
    }
#elif defined(THC_AVX2)
    for (uint32_t j = 0; j < p; j += 8) {
        __m256 v = _mm256_loadu_ps(y + j), w;
        w = _mm256_permute_ps(v, 0xB1); /* h = 1 */
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xAA);
        w = _mm256_permute_ps(v, 0x4E); /* h = 2 */
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xCC);
        w = _mm256_permute2f128_ps(v, v, 0x01); /* h = 4: halves swapped */
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xF0);
        _mm256_storeu_ps(y + j, v);
    }
#else
    for (uint32_t j = 0; j < p; j += 2) { /* h = 1 */
        float a = y[j], b = y[j + 1];
        y[j] = a + b;
        y[j + 1] = a - b;
    }
    for (uint32_t j = 0; j < p; j += 4) /* h = 2 */
        for (uint32_t i = j; i < j + 2; i++) {
            float a = y[i], b = y[i + 2];
            y[i] = a + b;
            y[i + 2] = a - b;
        }
    for (uint32_t j = 0; j < p; j += 8) /* h = 4 */
        for (uint32_t i = j; i < j + 4; i++) {
            float a = y[i], b = y[i + 4];
            y[i] = a + b;
            y[i + 4] = a - b;
        }
#endif
    for (uint32_t h = 8; h < p; h <<= 1)
        for (uint32_t j = 0; j < p; j += 2 * h)
            thc_butterflies(y + j, y + j + h, h);
}

/*
 * One block of a push: x (len floats) rotated at p into y, then each coordinate quantized at
 * scale c (0: none yet) with the residual r (p floats, or NULL), its index into q (p bytes),
 * packed into out (p * bits / 8 bytes); *peak receives max |v|.
 */
static void thc_encode_block(uint32_t bits, uint32_t p, uint32_t len, float c, psagg__rng_key rot,
                             psagg__rng_key key, size_t e0, const float *x, float *r, float *y,
                             uint8_t *q, uint8_t *out, float *peak)
{
    const uint32_t L = 1u << bits;
    const float f = 1.0f / sqrtf((float)p), step = c / (float)(L - 1),
                a = c > 0 ? (float)(L - 1) / (2 * c) : 0, nc = -c;
    uint32_t top = 0;

    thc_signs(rot, e0, x, y, len);
    memset(y + len, 0, (p - len) * sizeof *y);
    thc_hadamard(y, p);
    for (uint32_t i = 0; i < p; i++) {
        float v = y[i] * f;
        uint32_t u;
        if (r)
            v = v + r[i];
        y[i] = v;
        memcpy(&u, &v, 4);
        u &= 0x7FFFFFFFu; /* |v| (finite): its bits order as its values */
        top = u > top ? u : top;
    }
    memcpy(peak, &top, 4);
    if (c > 0) {
        for (uint32_t i = 0; i < p; i++) {
            const uint32_t e = (uint32_t)(e0 + i);
            const uint32_t h = psagg__rng_hash32(key.k0, key.k1, e >> 1);
            const uint32_t d = (h >> (PSAGG_RNG_D_BITS * (e & 1))) & PSAGG_RNG_D_MASK;
            const float ue = (float)(int32_t)(2 * d + 1) * PSAGG_RNG_U_SCALE;
            float v = y[i], cl = v < nc ? nc : v > c ? c : v;
            int32_t k = (int32_t)((cl + c) * a + ue); /* (>= 0: the truncation of thc.h) */
            k = k > (int32_t)(L - 1) ? (int32_t)(L - 1) : k;
            q[i] = (uint8_t)k;
            if (r)
                r[i] = v - (float)(2 * k - (int32_t)(L - 1)) * step;
        }
    } else { /* no scale yet: nothing sent, all of it kept */
        memset(q, 0, p);
        if (r)
            memcpy(r, y, p * sizeof *y);
    }
    if (bits == 4)
        for (uint32_t i = 0; i < p / 2; i++)
            out[i] = (uint8_t)(q[2 * i] | q[2 * i + 1] << 4);
    else
        for (uint32_t i = 0; i < p / 4; i++)
            out[i] =
                (uint8_t)(q[4 * i] | q[4 * i + 1] << 2 | q[4 * i + 2] << 4 | q[4 * i + 3] << 6);
}

/*
 * One block of an update's decode: the sums S (p of them) at step, offset off, times fz, the
 * inverse rotation into z, the first len written into out as op says.
 */
static void thc_decode_block(uint32_t p, uint32_t len, float step, float fz, int32_t off,
                             psagg__rng_key rot, size_t e0, const uint16_t *S, float *z,
                             psagg__decode_op op, float *out)
{
    const float f = 1.0f / sqrtf((float)p);
    for (uint32_t i = 0; i < p; i++) /* (2 S - off: within +-2^17, exact) */
        z[i] = ((float)(2 * (int32_t)S[i] - off) * step) * fz;
    thc_hadamard(z, p);
    for (uint32_t i = 0; i < len; i++)
        z[i] = z[i] * f;
    thc_signs(rot, e0, z, z, len);
    if (op == PSAGG_DECODE_ADD)
        for (uint32_t i = 0; i < len; i++)
            out[i] = out[i] + z[i];
    else if (op == PSAGG_DECODE_FIRST)
        for (uint32_t i = 0; i < len; i++)
            out[i] = 0.0f + z[i];
    else /* SET, and SCALE (factor in z) */
        memcpy(out, z, len * sizeof *z);
}

/* The sums of a sum stream's groups in element order (thc.h's planes undone), for one (b, w):
   within a group S[i P + j] = plane j's sum i (at w = 4 planes j and j + P/2 share a run). */
static inline __attribute__((always_inline)) void thc_unplane_as(const uint32_t bits,
                                                                 const uint32_t width,
                                                                 const uint8_t *sum, size_t groups,
                                                                 uint16_t *S)
{
    const uint32_t P = 8 / bits, G = 512 / bits;
    for (size_t g = 0; g < groups; g++, S += G) {
        const uint8_t *run = sum + g * G * width / 8;
        for (uint32_t i = 0; i < 64; i++)
            for (uint32_t j = 0; j < P; j++) {
                if (width == 4)
                    S[i * P + j] =
                        (uint16_t)((run[(j % (P / 2)) * 64 + i] >> (j / (P / 2) * 4)) & 15);
                else if (width == 8)
                    S[i * P + j] = run[j * 64 + i];
                else
                    S[i * P + j] =
                        (uint16_t)(run[2 * (j * 64 + i)] | run[2 * (j * 64 + i) + 1] << 8);
            }
    }
}

static void thc_unplane(uint32_t bits, uint32_t width, const uint8_t *sum, size_t groups,
                        uint16_t *S)
{
    if (bits == 2 && width == 4)
        thc_unplane_as(2, 4, sum, groups, S);
    else if (bits == 2 && width == 8)
        thc_unplane_as(2, 8, sum, groups, S);
    else if (bits == 2)
        thc_unplane_as(2, 16, sum, groups, S);
    else if (width == 4)
        thc_unplane_as(4, 4, sum, groups, S);
    else if (width == 8)
        thc_unplane_as(4, 8, sum, groups, S);
    else
        thc_unplane_as(4, 16, sum, groups, S);
}

static uint32_t thc_sums_max(const uint16_t *S, uint32_t p)
{
    uint16_t top = 0;
    for (uint32_t i = 0; i < p; i++)
        top = S[i] > top ? S[i] : top;
    return top;
}

static uint32_t thc_abs_max_bits(const float *x, size_t len)
{
    uint32_t top = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u &= 0x7FFFFFFFu;
        top = u > top ? u : top;
    }
    return top;
}

const psagg__thc_worker PSAGG_THC_WORKER = {
    .encode_block = thc_encode_block,
    .decode_block = thc_decode_block,
    .unplane = thc_unplane,
    .sums_max = thc_sums_max,
    .abs_max_bits = thc_abs_max_bits,
};
