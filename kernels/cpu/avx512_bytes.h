/*
 * cpu/avx512_bytes.h - the whole-byte maxmin paths of avx512_bytes.c, which avx512.c
 * dispatches to. Included only where AVX-512 is compiled in.
 * Layer: kernels.
 */
#ifndef PSAGG_KERNELS_CPU_AVX512_BYTES_H
#define PSAGG_KERNELS_CPU_AVX512_BYTES_H

#include <stddef.h>
#include <stdint.h>

#include "impl.h"

/*
 * maxmin with b in {1, 2, 4, 8} and buckets of whole 16-byte groups (avx512_bytes.c):
 * psagg__avx512_bytes_ok says whether a codec takes this path; the others are the maxmin
 * encode and aggregate for such codecs (n_in >= 1), with codec.c's scratch.
 */
int psagg__avx512_bytes_ok(const psagg_codec *c);
psagg_status psagg__avx512_bytes_encode(const psagg_codec *c, const float *x, float *residual,
                                        size_t n, psagg__rng_key key, uint8_t *out,
                                        psagg__scratch *ws, size_t *badi);
psagg_status psagg__avx512_bytes_aggregate(const psagg_codec *c, const uint8_t *const *in,
                                           size_t n_in, size_t n, float *residual,
                                           psagg__rng_key key, uint8_t *out, psagg__scratch *ws,
                                           size_t *badi);

#endif
