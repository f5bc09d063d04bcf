/*
 * cpu/avx512.h - what avx512.c and avx512_bytes.c share: the vector width, lane masks, and the
 * whole-byte maxmin paths of avx512_bytes.c. Included only where AVX-512 is compiled in.
 * Layer: kernels.
 */
#ifndef PSAGG_KERNELS_CPU_AVX512_H
#define PSAGG_KERNELS_CPU_AVX512_H

#include <immintrin.h>

#include "impl.h"

#define W 16

static inline __mmask16 lane_mask(size_t rem)
{
    return rem >= W ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1);
}

static inline __m512 abs16(__m512 v)
{
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

/*
 * maxmin with b in {1, 2, 4, 8} and buckets of whole 16-byte groups (avx512_bytes.c):
 * psagg_avx512_bytes_ok says whether a codec takes this path; the others are the maxmin
 * encode and aggregate for such codecs (n_in >= 1), with codec.c's scratch.
 */
int psagg_avx512_bytes_ok(const psagg_codec *c);
psagg_status psagg_avx512_bytes_encode(const psagg_codec *c, const float *x, float *residual,
                                       size_t n, psagg_rng_key key, uint8_t *out, psagg_scratch *ws,
                                       size_t *badi);
psagg_status psagg_avx512_bytes_aggregate(const psagg_codec *c, const uint8_t *const *in,
                                          size_t n_in, size_t n, float *residual, psagg_rng_key key,
                                          uint8_t *out, psagg_scratch *ws, size_t *badi);

#endif
