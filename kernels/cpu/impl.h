/*
 * cpu/impl.h - private interface between kernels/codec.c (argument checks, validation,
 * scratch memory and the choice of path) and the per-ISA CPU implementations (scalar.c,
 * avx2.c, avx512.c with avx512_bytes.c).
 *
 * Layer: kernels. isa.c picks the ISA and codec.c, within it, the function for the codec's
 * format (thc.c its thc parts); an implementation only computes. codec.c calls these only with a
 * checked codec (psagg__codec_check passed, bucket != 0) of the function's format,
 * n <= PSAGG_CODEC_MAX_ELEMS, non-NULL buffers of the exact encoded size, inputs that
 * psagg__validate accepted (decode, aggregate), and a scratch area as described below. Every
 * implementation must produce the same bytes, residuals and decoded floats as scalar.c for
 * every input.
 */
#ifndef PSAGG_KERNELS_CPU_IMPL_H
#define PSAGG_KERNELS_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/codec.h"
#include "kernels/thc.h"
#include "kernels/topk.h"

/*
 * Scratch memory that codec.c provides for one call (on its stack when small, else from the
 * heap), so no implementation allocates:
 *   acc   acc_elems floats, 64-byte aligned: one maxmin bucket (acc_elems >= bucket), or a
 *         block of sums for the fp aggregates (acc_elems >= PSAGG_SCRATCH_BLOCK);
 *   pay   aggregate: n_in pointers (each input's payload);
 *   meta  aggregate: 2 * n_in floats (each input's {scale, lo} of the current bucket);
 *   tab   aggregate: PSAGG_SCRATCH_TAB bytes per input, 64-byte aligned (decode tables).
 */
#define PSAGG_SCRATCH_BLOCK 4096
#define PSAGG_SCRATCH_TAB   128

typedef struct psagg__scratch {
    float *acc;
    size_t acc_elems;
    const uint8_t **pay;
    float *meta;
    void *tab;
} psagg__scratch;

/*
 * thc's workers' side one block at a time (kernels/thc.h; cpu/thc_body.h, compiled for each
 * ISA): encode x (len floats) rotated at p with the residual r (p floats, or NULL) at scale c
 * into out (p * bits / 8 bytes; y: p floats and q: p bytes of scratch), *peak its max |v|;
 * decode the sums S of a block (p) into out (len floats) as op says; unplane a sum stream's
 * groups (thc.h's planes, sums `width` bits wide) into S in element order; the largest of p
 * sums; the largest |x_i| of len floats as its bits (above 0x7F800000: a NaN).
 */
typedef struct psagg__thc_worker {
    void (*encode_block)(uint32_t bits, uint32_t p, uint32_t len, float c, psagg__rng_key rot,
                         psagg__rng_key key, size_t e0, const float *x, float *r, float *y,
                         uint8_t *q, uint8_t *out, float *peak);
    void (*decode_block)(uint32_t p, uint32_t len, float step, float fz, int32_t off,
                         psagg__rng_key rot, size_t e0, const uint16_t *S, float *z,
                         psagg__decode_op op, float *out);
    void (*unplane)(uint32_t bits, uint32_t width, const uint8_t *sum, size_t groups, uint16_t *S);
    uint32_t (*sums_max)(const uint16_t *S, uint32_t p);
    uint32_t (*abs_max_bits)(const float *x, size_t len);
} psagg__thc_worker;

extern const psagg__thc_worker psagg__thc_worker_scalar;
extern const psagg__thc_worker psagg__thc_worker_avx2;
extern const psagg__thc_worker psagg__thc_worker_avx512;

typedef struct psagg__codec_impl {
    const char *name;
    /* fp32, fp16, bf16. Encode x (+ residual); on a bad element return its status, set *bad. */
    psagg_status (*fp_encode)(const psagg_codec *c, const float *x, float *residual, size_t n,
                              uint8_t *out, size_t *bad);
    /*
     * Decode into out as op says (factor for PSAGG_DECODE_SCALE); returns nonzero if some
     * input is NaN or Inf (out is then unspecified).
     */
    int (*fp_decode)(const psagg_codec *c, const uint8_t *in, size_t n, float *out,
                     psagg__decode_op op, float factor);
    /* s_k = (((0 + y0_k) + y1_k) + ...), then encode s (+ residual) into out. */
    psagg_status (*fp_aggregate)(const psagg_codec *c, const uint8_t *const *in, size_t n_in,
                                 size_t n, float *residual, uint8_t *out, psagg__scratch *ws,
                                 size_t *bad);
    /* maxmin: the same three operations. */
    psagg_status (*mm_encode)(const psagg_codec *c, const float *x, float *residual, size_t n,
                              psagg__rng_key key, uint8_t *out, psagg__scratch *ws, size_t *bad);
    void (*mm_decode)(const psagg_codec *c, const uint8_t *in, size_t n, float *out,
                      psagg__decode_op op, float factor);
    psagg_status (*mm_aggregate)(const psagg_codec *c, const uint8_t *const *in, size_t n_in,
                                 size_t n, float *residual, psagg__rng_key key, uint8_t *out,
                                 psagg__scratch *ws, size_t *bad);
    /* topk: the encode's block passes (kernels/topk.h; the format itself is topk.c's) */
    const psagg__topk_passes *topk;
    /* thc: the integer fold over whole groups (kernels/thc.h; psagg__thc_fold_scalar's bytes) */
    void (*thc_fold)(uint32_t bits, uint32_t width, const uint8_t *const *in, size_t n_in,
                     size_t groups, uint8_t *out);
    /* thc: the workers' side */
    const psagg__thc_worker *thc_worker;
} psagg__codec_impl;

/* The implementation of the process's ISA (kernels/isa.c; psagg__codec_isa). */
const psagg__codec_impl *psagg__impl_current(void);

extern const psagg__codec_impl psagg__impl_scalar;
extern const psagg__codec_impl psagg__impl_avx2;   /* all NULL when not built */
extern const psagg__codec_impl psagg__impl_avx512; /* all NULL when not built */

/*
 * The fp entry points of a SIMD file (fp_encode, fp_decode, fp_aggregate of its
 * psagg__codec_impl), defined from its always-inlined enc_fp_as / dec_fp_as / agg_fp_as, which
 * take the format as their first argument: here it becomes a compile-time constant of each
 * loop, so the files' per-vector format switches fold away (one loop per format).
 */
#define PSAGG_FP_ENTRY_POINTS                                                                      \
    static psagg_status enc_fp(const psagg_codec *c, const float *x, float *r, size_t n,           \
                               uint8_t *out, size_t *badi)                                         \
    {                                                                                              \
        if (c->id == PSAGG_CODEC_FP32)                                                             \
            return enc_fp_as(PSAGG_CODEC_FP32, c, x, r, n, out, badi);                             \
        if (c->id == PSAGG_CODEC_FP16)                                                             \
            return enc_fp_as(PSAGG_CODEC_FP16, c, x, r, n, out, badi);                             \
        return enc_fp_as(PSAGG_CODEC_BF16, c, x, r, n, out, badi);                                 \
    }                                                                                              \
    static int dec_fp(const psagg_codec *c, const uint8_t *in, size_t n, float *out,               \
                      psagg__decode_op op, float f)                                                \
    {                                                                                              \
        if (c->id == PSAGG_CODEC_FP32)                                                             \
            return dec_fp_as(PSAGG_CODEC_FP32, in, n, out, op, f);                                 \
        if (c->id == PSAGG_CODEC_FP16)                                                             \
            return dec_fp_as(PSAGG_CODEC_FP16, in, n, out, op, f);                                 \
        return dec_fp_as(PSAGG_CODEC_BF16, in, n, out, op, f);                                     \
    }                                                                                              \
    static psagg_status agg_fp(const psagg_codec *c, const uint8_t *const *in, size_t n_in,        \
                               size_t n, float *r, uint8_t *out, psagg__scratch *ws, size_t *badi) \
    {                                                                                              \
        (void)ws;                                                                                  \
        if (c->id == PSAGG_CODEC_FP32)                                                             \
            return agg_fp_as(PSAGG_CODEC_FP32, c, in, n_in, n, r, out, badi);                      \
        if (c->id == PSAGG_CODEC_FP16)                                                             \
            return agg_fp_as(PSAGG_CODEC_FP16, c, in, n_in, n, r, out, badi);                      \
        return agg_fp_as(PSAGG_CODEC_BF16, c, in, n_in, n, r, out, badi);                          \
    }

/*
 * Report the bad element i whose value (x + residual) is v: NaN/Inf -> PSAGG_ENONFINITE,
 * finite -> PSAGG_ERANGE, with a message naming the element. Sets *bad = i. (codec.c)
 */
psagg_status psagg__codec_bad_value(const psagg_codec *c, size_t i, float v, size_t *bad);

/*
 * The bucket minimum used for lo: the IEEE 754-2019 "minimum" order, in which -0 < +0, so
 * that lo does not depend on the order the values are visited in (a SIMD min reduction
 * returns either zero otherwise). hi's sign never matters (range = hi - lo).
 */

/*
 * A SIMD file's thc_fold (psagg__codec_impl.thc_fold), from its always-inlined thc_fold_as(bits,
 * width, ...): each of the six (bits, width) pairs becomes a loop of its own, as
 * PSAGG_FP_ENTRY_POINTS does for the fp formats.
 */
#define PSAGG_THC_FOLD_ENTRY_POINT                                                                 \
    static void thc_fold(uint32_t bits, uint32_t width, const uint8_t *const *in, size_t n_in,     \
                         size_t groups, uint8_t *out)                                              \
    {                                                                                              \
        if (bits == 4 && width == 4)                                                               \
            thc_fold_as(4, 4, in, n_in, groups, out);                                              \
        else if (bits == 4 && width == 8)                                                          \
            thc_fold_as(4, 8, in, n_in, groups, out);                                              \
        else if (bits == 4)                                                                        \
            thc_fold_as(4, 16, in, n_in, groups, out);                                             \
        else if (width == 4)                                                                       \
            thc_fold_as(2, 4, in, n_in, groups, out);                                              \
        else if (width == 8)                                                                       \
            thc_fold_as(2, 8, in, n_in, groups, out);                                              \
        else                                                                                       \
            thc_fold_as(2, 16, in, n_in, groups, out);                                             \
    }

#endif
