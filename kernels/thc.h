/*
 * thc.h - integer aggregation (THC, "Tensor Homomorphic Compression", NSDI'24): the index
 * streams the workers push and the sum stream a server folds them into by adding integers,
 * without decoding. Layer: kernels.
 *
 * The workers (not built yet: the rotation, the shared scale and the table that turn a
 * gradient into indices, and back) send, per chunk, b-bit indices into a table every worker
 * shares, so the sum of the W workers' values is the table applied to the sum of their
 * indices: the server adds the indices and nothing else, with no float math and no second
 * rounding. This file specifies the two streams and the fold; kernels/cpu/ vectorizes it.
 *
 * THE INDEX STREAM (b = 2 or 4 bits; N elements): element e's index q_e (0 <= q_e < 2^b) at
 * bits [b*e, b*e + b) of a little-endian, LSB-first bit stream (as maxmin's levels), padded with
 * zero bits to whole groups of 64 bytes: psagg__thc_index_bytes(b, N) = 64 * ceil(N * b / 512).
 * A group holds G = 512 / b elements (256 at 2 bits, 128 at 4).
 *
 * THE SUM STREAM (W index streams of the same N): per element the sum S_e = q_e(1) + ... +
 * q_e(W) as an unsigned integer of w bits, w = psagg__thc_sum_width(b, W): 8 when
 * W * (2^b - 1) <= 255, else 16 when W * (2^b - 1) <= 65535, else refused. So a sum cannot
 * overflow its width by construction: 2^b - 1 is the largest index, and W of them fit. At
 * b = 4 that is 8 bits up to 17 workers and 16 bits up to 4,369; at b = 2, 85 and 21,845 (a
 * job's 1,024 workers always fit 16 bits).
 * Layout: group by group as the index stream's (group g covers elements g*G .. g*G + G - 1,
 * padding elements included: their sum is 0). Within a group, P = 8 / b planes of 64 sums each:
 * plane j holds the elements e = g*G + i*P + j for i = 0..63, in order of i; a sum of w = 16
 * bits is little-endian. So plane j of a group is the sums of "the j-th index of each of the
 * group's 64 input bytes", which a vector unit computes without shuffling. A group takes
 * G * w / 8 bytes: psagg__thc_sum_bytes(b, W, N) = (its groups) * G * w / 8.
 */
#ifndef PSAGG_KERNELS_THC_H
#define PSAGG_KERNELS_THC_H

#include <stddef.h>
#include <stdint.h>

#include "psagg/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PSAGG_THC_GROUP_BYTES 64u /* one group of the index stream */

/* Bytes of an index stream of n elements at b bits (0 for b other than 2 or 4). */
size_t psagg__thc_index_bytes(uint32_t bits, size_t n);
/* The sum's width in bits for `inputs` streams at b bits: 8, 16, or 0 when it would not fit. */
uint32_t psagg__thc_sum_width(uint32_t bits, size_t inputs);
/* Bytes of the sum stream of `inputs` index streams of n elements (0 when refused). */
size_t psagg__thc_sum_bytes(uint32_t bits, size_t inputs, size_t n);

/*
 * Fold n_in index streams of n elements (each psagg__thc_index_bytes long) into the sum stream
 * out (psagg__thc_sum_bytes long). PSAGG_EINVAL naming the argument: b not 2 or 4, no input,
 * too many inputs for 16 bits, a wrong length. Any index stream is valid (every b-bit field is
 * an index), so the fold reads no data it could refuse. The path is the process's ISA
 * (kernels/codec.h, psagg__codec_set_isa); every path writes the same bytes.
 */
psagg_status psagg__thc_fold(uint32_t bits, const uint8_t *const *in, size_t n_in, size_t in_len,
                             size_t n, uint8_t *out, size_t out_len);

/* The element e's index in an index stream, and its sum in a sum stream (scalar, for tests and
   the workers' decode). */
uint32_t psagg__thc_index_at(uint32_t bits, const uint8_t *in, size_t e);
uint32_t psagg__thc_sum_at(uint32_t bits, uint32_t width, const uint8_t *sum, size_t e);

/* The scalar fold over whole groups (kernels/cpu/ paths must equal it). */
void psagg__thc_fold_scalar(uint32_t bits, uint32_t width, const uint8_t *const *in, size_t n_in,
                            size_t groups, uint8_t *out);

#ifdef __cplusplus
}
#endif
#endif /* PSAGG_KERNELS_THC_H */
