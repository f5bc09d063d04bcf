/*
 * rng.h - the stochastic-rounding hash of kernels/codec.h ("RNG"), written once for every
 * implementation: the CPU reference (codec.h's psagg__rng_uniform), the CUDA kernels
 * (cuda/kernels.cu, device code; tests/gpu/test_cuda_math.c runs the same math on the host),
 * and the SIMD loops (cpu/avx2.c, cpu/avx512_lanes.h), which keep their vector forms but take
 * every constant from here. So a change to the hash is one change, and the golden tests
 * (tests/unit/test_codec_golden.c) keep it bit-exact.
 *
 * Plain C11 and CUDA C++: nothing here depends on psagg's other headers.
 * Layer: kernels.
 */
#ifndef PSAGG_KERNELS_RNG_H
#define PSAGG_KERNELS_RNG_H

#include <stdint.h>

/* Functions callable from host and device code alike. */
#if defined(__CUDACC__)
#define PSAGG_HOST_DEVICE __host__ __device__
#else
#define PSAGG_HOST_DEVICE
#endif

/*
 * hash32 (Wellons' "lowbias32"): x ^= x >> S1; x *= M1; x ^= x >> S2; x *= M2; x ^= x >> S3,
 * on x = (m ^ k1) + k0 for the pair m = k >> 1 of elements (2m, 2m + 1).
 */
#define PSAGG_RNG_S1 16
#define PSAGG_RNG_M1 0x7FEB352Du
#define PSAGG_RNG_S2 15
#define PSAGG_RNG_M2 0x846CA68Bu
#define PSAGG_RNG_S3 16

/*
 * Each element takes 16 bits of its pair's hash, d_k: the low half for even k, the high half
 * for odd k. u_k = (2 * d_k + 1) * PSAGG_RNG_U_SCALE. In a SIMD lane, d_k moved to bits
 * 1..16 is (h << 1) or (h >> (PSAGG_RNG_D_BITS - 1)), masked with PSAGG_RNG_D2_MASK, | 1.
 */
#define PSAGG_RNG_D_BITS  16
#define PSAGG_RNG_D_MASK  0xFFFFu
#define PSAGG_RNG_D2_MASK 0x1FFFEu /* PSAGG_RNG_D_MASK << 1 */
#define PSAGG_RNG_U_SCALE 0x1p-17f /* 2^-(PSAGG_RNG_D_BITS + 1) */

/* h_m = hash32((m ^ k1) + k0), uint32 arithmetic. */
static inline PSAGG_HOST_DEVICE uint32_t psagg__rng_hash32(uint32_t k0, uint32_t k1, uint32_t m)
{
    uint32_t x = (m ^ k1) + k0;
    x ^= x >> PSAGG_RNG_S1;
    x *= PSAGG_RNG_M1;
    x ^= x >> PSAGG_RNG_S2;
    x *= PSAGG_RNG_M2;
    x ^= x >> PSAGG_RNG_S3;
    return x;
}

/* u_k from h = psagg__rng_hash32(k0, k1, k >> 1): in (0, 1), on the 2^-17 grid. */
static inline PSAGG_HOST_DEVICE float psagg__rng_u(uint32_t h, uint32_t k)
{
    uint32_t d = (h >> (PSAGG_RNG_D_BITS * (k & 1))) & PSAGG_RNG_D_MASK;
#if defined(__CUDA_ARCH__)
    /* both steps are exact; the intrinsics keep nvcc from contracting them into an FMA */
    return __fmul_rn(__uint2float_rn(2 * d + 1), PSAGG_RNG_U_SCALE);
#else
    return (float)(2 * d + 1) * PSAGG_RNG_U_SCALE; /* both steps exact */
#endif
}

#endif
