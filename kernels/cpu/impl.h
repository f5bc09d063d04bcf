/*
 * cpu/impl.h - private interface between kernels/codec.c (argument checks, validation,
 * dispatch) and the per-ISA CPU implementations (scalar.c, avx2.c, avx512.c).
 *
 * codec.c calls these only with a checked codec (psagg_codec_check passed, bucket != 0),
 * n <= PSAGG_CODEC_MAX_ELEMS, non-NULL buffers of the exact encoded size, and (for decode and
 * aggregate) inputs that psagg_validate accepted. Every implementation must produce the same
 * bytes, residuals and decoded floats as scalar.c for every input.
 */
#ifndef PSAGG_KERNELS_CPU_IMPL_H
#define PSAGG_KERNELS_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

typedef struct psagg_codec_impl {
    const char *name;
    /* Encode x (+ residual) into out; on a bad element return its status and set *bad. */
    psagg_status (*encode)(const psagg_codec *c, const float *x, float *residual, size_t n,
                           psagg_rng_key key, uint8_t *out, size_t *bad);
    /* Decode in into out (accumulate == 0) or out_k = out_k + y_k (accumulate != 0). */
    void (*decode)(const psagg_codec *c, const uint8_t *in, size_t n, float *out, int accumulate);
    /* s_k = (((0 + y0_k) + y1_k) + ...), then encode s (+ residual) into out. */
    psagg_status (*aggregate)(const psagg_codec *c, const uint8_t *const *in, size_t n_in, size_t n,
                              float *residual, psagg_rng_key key, uint8_t *out, size_t *bad);
} psagg_codec_impl;

extern const psagg_codec_impl psagg_impl_scalar;
extern const psagg_codec_impl psagg_impl_avx2;   /* encode == NULL when not built */
extern const psagg_codec_impl psagg_impl_avx512; /* encode == NULL when not built */

/*
 * Report the bad element i whose value (x + residual) is v: NaN/Inf -> PSAGG_ENONFINITE,
 * finite -> PSAGG_ERANGE, with a message naming the element. Sets *bad = i. (codec.c)
 */
psagg_status psagg_codec_bad_value(const psagg_codec *c, size_t i, float v, size_t *bad);

/* Bucket scratch for the maxmin paths: stack buffer when it fits, else heap (codec.c). */
#define PSAGG_SCRATCH_STACK 4096
float *psagg_scratch_get(float *stack_buf, size_t elems);
void psagg_scratch_put(float *stack_buf, float *p);

/* Layout of maxmin buffers. */
static inline size_t psagg_mm_nbuckets(size_t n, uint32_t bucket)
{
    return (n + bucket - 1) / bucket;
}

static inline size_t psagg_mm_payload_bytes(size_t n, uint32_t bits)
{
    return 8 * ((n * bits + 63) / 64);
}

/*
 * The bucket minimum used for lo: the IEEE 754-2019 "minimum" order, in which -0 < +0, so
 * that lo does not depend on the order the values are visited in (a SIMD min reduction
 * returns either zero otherwise). hi's sign never matters (range = hi - lo).
 */

#endif
