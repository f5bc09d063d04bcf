/*
 * codec_common.h - what every codec's implementation shares with kernels/codec.h, in a header of
 * its own so that a format implemented beside the dispatch (kernels/topk.c) needs nothing of
 * codec.c: the element limit of a buffer, the RNG key of one encode and its uniform draw u_k
 * (codec.h, "RNG"), and how a decode writes its values. codec.h includes it.
 * Layer: kernels.
 */
#ifndef PSAGG_KERNELS_CODEC_COMMON_H
#define PSAGG_KERNELS_CODEC_COMMON_H

#include <stdint.h>

#include "kernels/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element indices are 32-bit: a buffer holds at most this many elements. */
#define PSAGG_CODEC_MAX_ELEMS 0xFFFFFFFFull

/* The RNG key of one encode: derived once from (seed, stream). */
typedef struct psagg__rng_key {
    uint32_t k0, k1;
} psagg__rng_key;

/* u_k of codec.h's "RNG"; its hash32 is kernels/rng.h's, which every implementation includes. */
static inline float psagg__rng_uniform(psagg__rng_key key, uint32_t k)
{
    return psagg__rng_u(psagg__rng_hash32(key.k0, key.k1, k >> 1), k);
}

/* How a decode writes each decoded value y_k into out. */
typedef enum psagg__decode_op {
    PSAGG_DECODE_SET = 0,   /* out_k = y_k */
    PSAGG_DECODE_ADD = 1,   /* out_k = out_k + y_k */
    PSAGG_DECODE_FIRST = 2, /* out_k = 0.0f + y_k: the first term of a sum (see "Fused server
                               operation"), written without reading out (a -0 becomes +0) */
    PSAGG_DECODE_SCALE = 3, /* out_k = y_k * factor (one binary32 product) */
} psagg__decode_op;

#ifdef __cplusplus
}
#endif
#endif
