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

/* hash32((m ^ k1) + k0) of codec.h's RNG for 16 pair indices m */
static inline __m512i psagg_avx512_rng_hash(__m512i m, __m512i k0, __m512i k1)
{
    __m512i h = _mm512_add_epi32(_mm512_xor_si512(m, k1), k0);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x7FEB352Du));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x846CA68Bu));
    return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

/*
 * u_k = (2 * d_k + 1) * 2^-17 from t, a hash moved so that d_k is in bits 1..16: h << 1 for
 * the low half (even k), h >> 15 for the high half (odd k). Both steps are exact.
 */
static inline __m512 psagg_avx512_rng_u(__m512i t)
{
    t = _mm512_ternarylogic_epi32(t, _mm512_set1_epi32(0x1FFFE), _mm512_set1_epi32(1),
                                  0xEA); /* (t & 0x1FFFE) | 1 */
    return _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(0x1p-17f));
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
