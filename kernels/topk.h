/*
 * topk.h - the k entries of largest magnitude of a block, in linear time, and the sparse
 * format built on it (below): codec `topk` (codec id 4; docs/design.md, "Sparse outer
 * gradients").
 *
 * Layer: kernels. The order is total and the same on every path: by |v| (compared as the
 * binary32 bit patterns of |v|, which for non-negative floats order as the values do; -0 and +0
 * are one magnitude), ties by the lower index. So which entries a block keeps depends on its
 * values alone, and every implementation (scalar, the AVX2 and AVX-512 block passes of
 * kernels/cpu/, and the CUDA kernels of kernels/cuda/kernels.cu) keeps the same ones.
 *
 * The threshold is found by a radix select over those bit patterns, most significant digit
 * first (digits of 11, 11 and 9 bits): a pass counts the candidates' next digit, keeps the bin
 * where the k-th largest lies, and the next pass looks only at that bin's entries (gathered
 * into scratch), so the work is a few passes over n entries, never a sort.
 */
#ifndef PSAGG_KERNELS_TOPK_H
#define PSAGG_KERNELS_TOPK_H

#include <stddef.h>
#include <stdint.h>

#include "psagg/types.h"
#include "kernels/codec_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Write to idx, in ascending order, the indices of the k entries of v[0..n) of largest
 * magnitude (ties: the lower index first), 1 <= k <= n. scratch: n uint32_t of working space.
 * Returns the k-th largest magnitude's bit pattern (|v| as uint32: the threshold; every kept
 * entry's is >= it, every other's <= it). NaN has no place in the order: the caller refuses
 * non-finite inputs first (the codec does, by name).
 */
uint32_t psagg__topk_select(const float *v, uint32_t n, uint32_t k, uint32_t *idx,
                            uint32_t *scratch);

/*
 * The encode's passes over a block's entries first..n-1 (the whole block: first = 0), which a
 * CPU path may vectorize (kernels/cpu/avx2.c, avx512.c) and hand its tail to the scalar pass
 * (psagg__topk_scalar_passes) with first where it stopped; each returns exactly what the scalar
 * one returns.
 *   load    v_i = x_i (+ r_i when r); returns n when every v_i is finite with |v_i| < 2^126,
 *           else the first i that is not (v is then partly written)
 *   filter  the j with (|v_j| as uint32 & mask) == prefix, ascending, into out; returns how many
 *   keep    the i with |v_i| > want, and the first `ties` with |v_i| == want, ascending, into
 *           idx; returns how many
 */
typedef struct psagg__topk_passes {
    uint32_t (*load)(const float *x, const float *r, uint32_t first, uint32_t n, float *v);
    uint32_t (*filter)(const float *v, uint32_t first, uint32_t n, uint32_t mask, uint32_t prefix,
                       uint32_t *out);
    uint32_t (*keep)(const float *v, uint32_t first, uint32_t n, uint32_t want, uint32_t ties,
                     uint32_t *idx);
} psagg__topk_passes;

extern const psagg__topk_passes psagg__topk_scalar_passes;

/*
 * THE SPARSE FORMAT (top-k; the wire format of codec `topk`)
 *
 * Parameters: b bits per kept value (2..8), blocks of C elements (a power of two,
 * 256..65536), k entries kept per block (1..C), rounding (stochastic or nearest, as maxmin's).
 * A buffer of n elements has nb = ceil(n / C) blocks; block m covers [m*C, min(n, (m+1)*C)) of
 * len_m elements and keeps k_m = min(k, len_m) of them; K = sum of k_m; ib = log2(C);
 * L = 2^(b-1) - 1 magnitude levels. Little-endian, LSB-first bit streams as maxmin's:
 *   [ meta:    nb x { binary32 scale; binary32 lo; }            8*nb bytes             ]
 *   [ indices: K x ib bits, block by block, each block's indices
 *              (within the block) strictly ascending             8*ceil(K*ib/64) bytes  ]
 *   [ values:  K x b bits, in the indices' order: bit 0 the sign
 *              (1: negative), bits 1..b-1 the magnitude level q  8*ceil(K*b/64) bytes   ]
 * Bits after the last index and after the last value are zero.
 *
 * Encode, per block, over its values v_i (x_i, or x_i + r_i with error feedback), every v_i
 * finite with |v_i| < 2^126 (PSAGG_ENONFINITE / PSAGG_ERANGE as maxmin):
 *   the k_m entries of largest |v_i|, ties to the lower index (psagg__topk_select);
 *   lo = min |v_i|, hi = max |v_i| over them, range = hi - lo;
 *   range < 2^-100: scale = 0, every q = 0; else scale = range / (float)L, inv = 1.0f / scale,
 *   q = (uint32)(min((|v_i| - lo) * inv + u_i, (float)L)), u_i as maxmin's (0.5f, or
 *   psagg__rng_uniform(key, i) with i the element's index in the whole buffer);
 *   sign = the sign bit of v_i.
 * Decode: a kept entry y_i = lo + scale * (float)q, negated when its sign is set; every other
 *   entry decodes to -0.0f (so that adding it changes nothing, a -0 included: a sparse ADD
 *   touches only the kept entries and is still exactly out_k + y_k).
 * Error feedback: r_i = v_i - y_i (for an entry not kept: v_i, all of it).
 * A buffer is valid iff its length is exact, every block has lo and scale finite with their
 * sign bits clear and lo + scale * (float)L finite, its indices strictly ascending and below
 * len_m, and the padding bits zero; anything else is PSAGG_EBADMETA naming the block and field.
 */
typedef struct psagg__topk_format {
    uint32_t bits;  /* b, 2..8 */
    uint32_t block; /* C, a power of two, 256..65536 */
    uint32_t k;     /* entries kept per block, 1..C */
    psagg_rounding rounding;
} psagg__topk_format;

#define PSAGG_TOPK_MIN_BLOCK     256u
#define PSAGG_TOPK_MAX_BLOCK     65536u
#define PSAGG_TOPK_DEFAULT_BLOCK 4096u

/* PSAGG_EINVAL naming the field that is out of range, or PSAGG_OK. */
psagg_status psagg__topk_check(const psagg__topk_format *f);
/* Where the parts of a buffer of n elements lie (the format above; f checked). */
typedef struct psagg__topk_layout {
    size_t nb, kept;         /* blocks, entries kept in all (K) */
    size_t idx_off, val_off; /* where the streams start */
    size_t idx_bytes, val_bytes;
    uint32_t ib, levels; /* index bits (log2 C), L */
} psagg__topk_layout;
psagg__topk_layout psagg__topk_layout_of(const psagg__topk_format *f, size_t n);
/* The exact encoded size of n elements (0 for a format the check refuses). */
size_t psagg__topk_encoded_size(const psagg__topk_format *f, size_t n);
/* Encode, validate and decode as psagg__encode, psagg__validate, psagg__decode_into (codec.h).
   The encode runs its block passes with `passes` (NULL: the scalar ones). */
psagg_status psagg__topk_encode(const psagg__topk_format *f, const float *x, float *residual,
                                size_t n, psagg__rng_key key, void *out, size_t out_len,
                                size_t *bad_index);
psagg_status psagg__topk_encode_with(const psagg__topk_passes *passes, const psagg__topk_format *f,
                                     const float *x, float *residual, size_t n, psagg__rng_key key,
                                     void *out, size_t out_len, size_t *bad_index);
psagg_status psagg__topk_validate(const psagg__topk_format *f, const void *in, size_t in_len,
                                  size_t n);
psagg_status psagg__topk_decode_into(const psagg__topk_format *f, const void *in, size_t in_len,
                                     size_t n, float *out, psagg__decode_op op, float factor);

#ifdef __cplusplus
}
#endif
#endif /* PSAGG_KERNELS_TOPK_H */
