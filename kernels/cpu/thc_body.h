/*
 * thc_body.h - the workers' side of thc (kernels/thc.h, "THE WORKERS' SIDE") one block at a
 * time, written for the compiler to vectorize: included by cpu/thc_scalar.c, thc_avx2.c and
 * thc_avx512.c, each compiled at -O3 for its ISA with -ffp-contract=off, so every path does the
 * same binary32 operations in the same order and writes the same bytes (unit.thc compares
 * them). Each file defines PSAGG_THC_WORKER (its psagg__thc_worker) before including this.
 * Layer: kernels.
 */
#ifndef PSAGG_THC_WORKER
#error "define PSAGG_THC_WORKER before including thc_body.h"
#endif

#include <string.h>

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

/* y <- H y in place (thc.h's stages: pairs (i, i + h), i & h == 0, in runs of h). */
static inline __attribute__((always_inline)) void thc_hadamard(float *y, uint32_t p)
{
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

const psagg__thc_worker PSAGG_THC_WORKER = {
    .encode_block = thc_encode_block,
    .decode_block = thc_decode_block,
};
