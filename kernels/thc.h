/*
 * thc.h - integer aggregation (THC, "Tensor Homomorphic Compression", NSDI'24): the index
 * streams the workers push and the sum stream a server folds them into by adding integers,
 * without decoding. Layer: kernels.
 *
 * The workers send, per chunk, b-bit indices into a table every worker shares (after a seeded
 * rotation that makes the coordinates near-Gaussian, at a scale every worker of the round
 * shares), so the sum of the W workers' values is the table applied to the sum of their
 * indices: the server adds the indices and nothing else, with no float math and no second
 * rounding. This file specifies the codec (its push and update formats below, "THE WIRE
 * FORMAT"), the two streams and the fold; kernels/cpu/ vectorizes the fold.
 *
 * THE INDEX STREAM (b = 2 or 4 bits; N elements): element e's index q_e (0 <= q_e < 2^b) at
 * bits [b*e, b*e + b) of a little-endian, LSB-first bit stream (as maxmin's levels), padded with
 * zero bits to whole groups of 64 bytes: psagg__thc_index_bytes(b, N) = 64 * ceil(N * b / 512).
 * A group holds G = 512 / b elements (256 at 2 bits, 128 at 4).
 *
 * THE SUM STREAM (W index streams of the same N): per element the sum S_e = q_e(1) + ... +
 * q_e(W) as an unsigned integer of w bits, w = psagg__thc_sum_width(b, W): 4 when
 * W * (2^b - 1) <= 15, else 8 when W * (2^b - 1) <= 255, else 16 when W * (2^b - 1) <= 65535,
 * else refused. So a sum cannot overflow its width by construction: 2^b - 1 is the largest
 * index, and W of them fit. At b = 2 that is 4 bits up to 5 workers, 8 up to 85 and 16 up to
 * 21,845; at b = 4, 4 bits for 1, 8 up to 17 and 16 up to 4,369 (a job's 1,024 workers always
 * fit 16 bits). The sums go down about b + log2(W) bits wide, as THC's do, rounded up to 4, 8
 * or 16 so that a vector unit adds them in place.
 * Layout: group by group as the index stream's (group g covers elements g*G .. g*G + G - 1,
 * padding elements included: their sum is 0). Within a group, P = 8 / b planes of 64 sums each:
 * plane j holds the elements e = g*G + i*P + j for i = 0..63, in order of i. So plane j of a
 * group is the sums of "the j-th index of each of the group's 64 input bytes", which a vector
 * unit computes without shuffling. At w = 16 a plane is 64 little-endian sums, at w = 8 64
 * bytes; at w = 4 the planes pair up, plane j and plane j + P/2 (j < P/2) in one run of 64
 * bytes, plane j in the bytes' low nibbles and plane j + P/2 in their high ones (at b = 2 that
 * run is the sum of each input byte's bits 0x33 after a shift right by 2j; at b = 4, one input,
 * the input itself). A group takes G * w / 8 bytes: psagg__thc_sum_bytes(b, W, N) = (its
 * groups) * G * w / 8.
 */
#ifndef PSAGG_KERNELS_THC_H
#define PSAGG_KERNELS_THC_H

#include <stddef.h>
#include <stdint.h>

#include "psagg/types.h"
#include "kernels/codec_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PSAGG_THC_GROUP_BYTES 64u /* one group of the index stream */

/* Bytes of an index stream of n elements at b bits (0 for b other than 2 or 4). */
size_t psagg__thc_index_bytes(uint32_t bits, size_t n);
/* The sum's width in bits for `inputs` streams at b bits: 4, 8, 16, or 0 when it would not fit. */
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

/*
 * THE WORKERS' SIDE (scalar reference; every CPU path runs it). A chunk of n floats is cut
 * into blocks of D elements (D a power of two, 64..65536); block m has len_m elements (D, or
 * fewer for the last) and is rotated at P_m = D, or for a shorter last block the least power of
 * two >= max(64, len_m), its missing elements taken as +0. The rotated chunk has
 * N' = sum P_m coordinates (psagg__thc_rotated_len), coordinate e of the chunk's sequence:
 *   signs      s_e = +1 or -1: bit (e & 31) of hash32(rk.k0, rk.k1, e >> 5) set means -1
 *              (rk: the rotation key, the same on every worker of a round's chunk)
 *   rotate     y = f * H (s .* x) per block, H the P x P Walsh-Hadamard matrix in Sylvester
 *              order, computed in place by the stages h = 1, 2, 4, .., P/2 of butterflies
 *              (a, b) <- (a + b, a - b) over the pairs (i, i + h), i & h == 0; then each
 *              coordinate times f = 1.0f / sqrtf((float)P) (binary32, in this order)
 *   table      L = 2^b indices; block m's scale c_m (0, or finite in [PSAGG_THC_MIN_SCALE,
 *              PSAGG_THC_MAX_SCALE]; the same on every worker); step = c_m / (float)(L - 1);
 *              index q stands for t_q = (float)(2q - (L - 1)) * step (uniform over [-c_m, c_m])
 *   encode     v_e = y_e + r_e (r: the residual, in rotated coordinates, or 0);
 *              u = (min(max(v_e, -c_m), c_m) + c_m) * ((float)(L - 1) / (2 * c_m));
 *              q_e = min(L - 1, (uint32_t)(u + u_e)), u_e = psagg__rng_uniform(key, e) (the
 *              encoding worker's key); r_e = v_e - t_q (what clipping and rounding left out).
 *              A block whose scale is 0 (none agreed yet) sends q_e = 0 and keeps r_e = v_e.
 *              The block's peak p_m = max |v_e| over its P coordinates (exact: no rounding)
 *   decode     of a sum stream of W workers: z_e = ((float)(2 S_e - W (L - 1)) * step) *
 *              factor (factor 1 for the sum, 1 / W for the average: PSAGG_DECODE_SCALE); then
 *              per block
 *              w = H z (the same stages), x_i = s_e * (w_i * f) for the block's first len_m
 *              coordinates (H H = P I and f^2 P = 1 up to rounding: the rotation's inverse)
 * x_e must be finite (PSAGG_ENONFINITE naming it) and |x_e| <= PSAGG_THC_MAX_ABS
 * (PSAGG_ERANGE), so that no rotated coordinate overflows. v_e is clipped into the table's
 * range, so what falls outside comes back through the residual.
 *
 * THE WIRE FORMAT (codec "thc<b>[/<D>]": psagg_codec id PSAGG_CODEC_THC, bits b = 2 or 4,
 * bucket D = the block, default PSAGG_THC_DEFAULT_BLOCK; stochastic rounding only). A chunk
 * holds whole blocks (psagg__codec_chunk_elems); its nb blocks rotate to N' coordinates.
 *   rotation   rk = psagg__rng_chunk_key(seed, PSAGG_RNG_ROTATE, 0, tensor key, chunk, 0): the
 *              same for every worker and every round, so the residual (kept in rotated
 *              coordinates) stays in one basis
 *   PUSH       [ nb x { binary32 scale c_m; binary32 peak p_m; } ]  8 * nb bytes
 *              [ index stream of N' elements ]                     psagg__thc_index_bytes
 *              c_m the scale block m was encoded at (every nonzero one of a round's pushes
 *              the same bits, else the push is refused); p_m its peak (finite, >= +0). A
 *              block of scale 0 has every index 0; the stream's padding bits are 0.
 *   UPDATE     of a round that summed W pushes (the message header's `summed`):
 *              [ nb x { binary32 scale c_m; binary32 peak P_m; uint32 count n_m; } ] 12 * nb
 *              [ sum stream of N' elements and W inputs ]         psagg__thc_sum_bytes
 *              c_m the round's scale of block m (0 when no push had one), n_m the pushes with
 *              c_m != 0 (only theirs are in the block's sums: the others are 0), P_m the
 *              largest peak of the W pushes (compared as bit patterns: no float math).
 *              Decode (psagg__thc_decode with n_m inputs' offset): z_e = ((float)(2 S_e -
 *              n_m (L - 1)) * step) * factor, then the inverse rotation; factor 1 / W averages.
 *   NEXT SCALE every worker sets block m's scale for its next push of the chunk from the update
 *              it applied: c'_m = kappa_b * P_m (kappa_2 = 0.25, kappa_4 = 0.625: the clip
 *              level that minimised a Gaussian block's error, measured in docs/results.md),
 *              or 0 when that is below PSAGG_THC_MIN_SCALE. So the workers agree on a scale
 *              with no round trip of their own: the previous round's peaks are the scale, and
 *              what the clipping cuts returns through the residual. The first push of a chunk
 *              (and a joining worker's) has scale 0 and sends nothing: its values wait in its
 *              residual one round, which is why a thc tensor always keeps one.
 * Bound: a sum of W inputs is at most W (2^b - 1), which psagg__thc_sum_width's width holds;
 * a job has at most 1,024 workers, which 16 bits hold at b = 4 (4,369) and b = 2 (21,845).
 */
#define PSAGG_THC_MIN_BLOCK     64u
#define PSAGG_THC_MAX_BLOCK     65536u
#define PSAGG_THC_DEFAULT_BLOCK 1024u
#define PSAGG_THC_MIN_SCALE     0x1p-100f
#define PSAGG_THC_MAX_SCALE     0x1p100f
#define PSAGG_THC_MAX_ABS       0x1p100f
#define PSAGG_THC_PUSH_META     8u  /* bytes per block: scale, peak */
#define PSAGG_THC_UPDATE_META   12u /* bytes per block: scale, peak, count */

/* N' of a chunk of n elements in blocks of D (0 for a D out of range). */
size_t psagg__thc_rotated_len(size_t n, uint32_t block);
/* The number of blocks (and scales) of a chunk of n elements. */
size_t psagg__thc_blocks(size_t n, uint32_t block);

/* Encode n floats x (and residual: N' floats or NULL) into an index stream of N' elements
   (out_len = psagg__thc_index_bytes(bits, N')). scales: psagg__thc_blocks values; peaks (the
   same count, or NULL) receives each block's peak. */
psagg_status psagg__thc_encode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                               const float *scales, const float *x, float *residual, size_t n,
                               psagg__rng_key key, uint8_t *out, size_t out_len, size_t *bad_index,
                               float *peaks);
/* Decode a sum stream of `inputs` index streams (psagg__thc_sum_bytes(bits, inputs, N')) into
   n floats out as op says (SET, ADD, FIRST; SCALE: SET with z_e times factor, the decode's
   "factor 1 / W"), each block's offset that of counts[m] inputs (NULL: `inputs`). */
psagg_status psagg__thc_decode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                               const float *scales, const uint8_t *sum, size_t sum_len,
                               size_t inputs, const uint32_t *counts, size_t n, float factor,
                               psagg__decode_op op, float *out);

/* ---- the wire format (THE WIRE FORMAT above) ---- */

/* Bytes of a push of n elements, and of an update that summed `summed` pushes (0: refused). */
size_t psagg__thc_push_bytes(uint32_t bits, uint32_t block, size_t n);
size_t psagg__thc_update_bytes(uint32_t bits, uint32_t block, size_t n, size_t summed);
/* The largest update of n elements a job can get (its sums at 16 bits). */
size_t psagg__thc_update_cap(uint32_t bits, uint32_t block, size_t n);
/* The next round's scale of a block whose update said peak P (NEXT SCALE). */
float psagg__thc_next_scale(uint32_t bits, float peak);

/* A worker's push: encode n floats x at the chunk's scales (nb values) with its residual (N'
   floats, rotated coordinates) into out (psagg__thc_push_bytes). */
psagg_status psagg__thc_push_encode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                                    const float *scales, const float *x, float *residual, size_t n,
                                    psagg__rng_key key, uint8_t *out, size_t out_len,
                                    size_t *bad_index);
/* Check a push (its meta, zero-scale blocks, padding); PSAGG_EBADMETA naming the block. */
psagg_status psagg__thc_push_check(uint32_t bits, uint32_t block, const uint8_t *push, size_t len,
                                   size_t n);
/* Block m's scale in a checked push. */
float psagg__thc_push_scale(const uint8_t *push, size_t m);
/* Add a push's table values into acc (N' floats, rotated: a push left out of its round goes
   back into the residual it came from). */
psagg_status psagg__thc_push_values(uint32_t bits, uint32_t block, const uint8_t *push, size_t len,
                                    size_t n, float *acc);
/* The server: fold n_in checked pushes (whose nonzero scales agree) into an update (out_len
   = psagg__thc_update_bytes(.., n_in)). No float math: the peaks' max compares bit patterns. */
psagg_status psagg__thc_update_fold(uint32_t bits, uint32_t block, const uint8_t *const *pushes,
                                    size_t n_in, size_t push_len, size_t n, uint8_t *out,
                                    size_t out_len);
/* A worker: check and decode an update (its width from its length) into n floats out as op
   says (factor: 1 / the workers summed to average), and the next scales (nb floats) when
   next_scales != NULL. PSAGG_EBADMETA names what is wrong. */
psagg_status psagg__thc_update_decode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                                      const uint8_t *update, size_t len, size_t n, float factor,
                                      psagg__decode_op op, float *out, float *next_scales);

/* Check an update's length and meta (THE WIRE FORMAT's UPDATE) without reading its sums:
   *inputs the widest count its width holds, each block's scale and count (nb values, or NULL).
   PSAGG_EBADMETA names the block. (A device decodes what this passed, and checks the sums.) */
psagg_status psagg__thc_update_meta(uint32_t bits, uint32_t block, const uint8_t *update,
                                    size_t len, size_t n, size_t *inputs, float *scales,
                                    uint32_t *counts);
/* NEXT SCALE: the scales (nb floats) of the chunk's next push from a checked update. */
void psagg__thc_update_next_scales(uint32_t bits, uint32_t block, const uint8_t *update, size_t n,
                                   float *next_scales);
/* The peaks P_m (nb floats) of a checked update: with [codec] adaptive the next push's bits
   may differ from the update's, so a worker keeps these and takes its scales from them with
   the bits of the push (psagg__thc_next_scale). */
void psagg__thc_update_peaks(uint32_t block, const uint8_t *update, size_t n, float *peaks);

/* The scalar fold over whole groups (kernels/cpu/ paths must equal it). */
void psagg__thc_fold_scalar(uint32_t bits, uint32_t width, const uint8_t *const *in, size_t n_in,
                            size_t groups, uint8_t *out);

#ifdef __cplusplus
}
#endif
#endif /* PSAGG_KERNELS_THC_H */
