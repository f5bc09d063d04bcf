/*
 * cpu/avx512_lanes.h - the lane helpers that avx512.c and avx512_bytes.c share: the vector
 * width, lane masks, |v|, and codec.h's RNG in 16 lanes (kernels/rng.h's hash, constants
 * included, in vector form). Included only where AVX-512 is compiled in. A header of its own,
 * so that neither .c file takes these from the other.
 * Layer: kernels.
 */
#ifndef PSAGG_KERNELS_CPU_AVX512_LANES_H
#define PSAGG_KERNELS_CPU_AVX512_LANES_H

#include <immintrin.h>
#include <stddef.h>

#include "kernels/rng.h"

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

/* psagg__rng_hash32(k0, k1, m) of kernels/rng.h for 16 pair indices m */
static inline __m512i psagg__avx512_rng_hash(__m512i m, __m512i k0, __m512i k1)
{
    __m512i h = _mm512_add_epi32(_mm512_xor_si512(m, k1), k0);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, PSAGG_RNG_S1));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)PSAGG_RNG_M1));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, PSAGG_RNG_S2));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)PSAGG_RNG_M2));
    return _mm512_xor_si512(h, _mm512_srli_epi32(h, PSAGG_RNG_S3));
}

/*
 * u_k = (2 * d_k + 1) * 2^-17 from t, a hash moved so that d_k is in bits 1..16: h << 1 for
 * the low half (even k, psagg__avx512_rng_u_lo), h >> 15 for the high half (odd k,
 * psagg__avx512_rng_u_hi). Both steps are exact.
 */
static inline __m512 psagg__avx512_rng_u(__m512i t)
{
    t = _mm512_ternarylogic_epi32(t, _mm512_set1_epi32((int)PSAGG_RNG_D2_MASK),
                                  _mm512_set1_epi32(1), 0xEA); /* (t & D2_MASK) | 1 */
    return _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(PSAGG_RNG_U_SCALE));
}

static inline __m512 psagg__avx512_rng_u_lo(__m512i h)
{
    return psagg__avx512_rng_u(_mm512_slli_epi32(h, 1));
}

static inline __m512 psagg__avx512_rng_u_hi(__m512i h)
{
    return psagg__avx512_rng_u(_mm512_srli_epi32(h, PSAGG_RNG_D_BITS - 1));
}

/*
 * u_k of codec.h for the 16 elements idx (consecutive, idx even): each lane hashes its pair
 * m = k >> 1 (lanes 2i and 2i + 1 hash the same m) and takes its half of the hash.
 */
static inline __m512 psagg__avx512_rng16(__m512i idx, __m512i k0, __m512i k1)
{
    __m512i h = psagg__avx512_rng_hash(_mm512_srli_epi32(idx, 1), k0, k1);
    return psagg__avx512_rng_u(_mm512_mask_srli_epi32(_mm512_slli_epi32(h, 1), (__mmask16)0xAAAA, h,
                                                      PSAGG_RNG_D_BITS - 1));
}

#endif
