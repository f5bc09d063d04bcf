/*
 * codec_cuda.h - psagg's codecs on an NVIDIA GPU, byte-identical to the CPU codecs of
 * kernels/codec.h (same wire formats, same RNG, same rounding, same error rules).
 *
 * Layer: kernels. Host API in codec_cuda.cu (it checks codecs and sizes with the CPU
 * library's psagg__codec_check and psagg__encoded_size), device code in kernels.cu.
 *
 * Two layers:
 *
 *  1. Stream-ordered device functions (psagg__cuda_encode/decode/decode_add/aggregate). Every
 *     pointer except `codec` and the aggregate's pointer array is DEVICE memory. They check
 *     their arguments on the host, enqueue work on `stream` and return at once; they never
 *     synchronize the device or the stream. Data errors (NaN/Inf, out-of-range values, bad
 *     meta) are found by the kernels and reported through an optional device "error word"
 *     (d_err, one uint64_t in device memory):
 *        - psagg__cuda_err_reset(d_err, stream) sets it to PSAGG_CUDA_ERR_NONE;
 *        - kernels atomicMin an entry ((stage << 40) | (index << 8) | code) into it, so after
 *          the stream work it holds the error the CPU codec would return: input-validation
 *          errors (stage 0) before encode errors (stage 1), then the lowest index;
 *        - psagg__cuda_err_status(word, &index) turns the word read back into a psagg_status
 *          and the bad index (the element of x [+ residual], or the input's position for
 *          aggregate's invalid inputs, or the element / bucket for decode).
 *     d_err may be NULL: then nothing is checked and outputs of bad inputs are garbage.
 *     On an error, out, acc and residual are unspecified (as on the CPU, except that the CPU
 *     decode_add leaves acc untouched on invalid input and the GPU one may not).
 *
 *  2. Blocking conveniences: the *_sync wrappers (same arguments plus bad_index; they
 *     synchronize `stream` only) and psagg__cuda_aggregate_host, which works on host buffers
 *     through a psagg__cuda_ctx (cached device workspace + pinned staging, its own stream).
 *
 * Alignment: float arrays (x, residual, out, acc) must be 4-byte aligned and encoded buffers
 * 8-byte aligned (cudaMalloc gives 256); 16-byte alignment takes the vectorized paths.
 * n is at most PSAGG_CODEC_MAX_ELEMS. Buffers of one call must not overlap.
 *
 * Status: PSAGG_EINVAL / PSAGG_EBADLEN for bad arguments (on the host, nothing enqueued),
 * PSAGG_EUNSUPPORTED when there is no usable CUDA device or driver, PSAGG_ECUDA for any other
 * CUDA failure (message with cudaGetErrorString in psagg_last_error()).
 *
 * Thread safety: the device functions are safe from any thread (they keep no state). A
 * psagg__cuda_ctx is used by one thread at a time: make one per thread.
 */
#ifndef PSAGG_KERNELS_CUDA_CODEC_CUDA_H
#define PSAGG_KERNELS_CUDA_CODEC_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PSAGG_CUDA_ERR_NONE   UINT64_MAX
#define PSAGG_CUDA_MAX_INPUTS 64 /* aggregate: n_in limit (pointers travel as kernel args) */

/* Number of usable CUDA devices; 0 when there is none or no (suitable) driver. Never fails. */
int psagg__cuda_device_count(void);

/* Encoded size of n elements, as psagg__encoded_size; 0 for an invalid codec (bits, bucket). */
size_t psagg__cuda_encoded_size(const psagg_codec *codec, size_t n);

/* Set *d_err (device) to PSAGG_CUDA_ERR_NONE, stream-ordered. */
psagg_status psagg__cuda_err_reset(uint64_t *d_err, cudaStream_t stream);

/*
 * Interpret an error word read back from the device: PSAGG_OK for PSAGG_CUDA_ERR_NONE, else
 * PSAGG_ENONFINITE, PSAGG_ERANGE or PSAGG_EBADMETA with *bad_index (if given) set.
 */
psagg_status psagg__cuda_err_status(uint64_t err_word, size_t *bad_index);

/*
 * Encode n floats x into out (out_len == psagg__encoded_size). With residual != NULL the
 * error-feedback step is fused in: v = x + residual is encoded and residual = v - decode(out)
 * is written back in the same pass. Errors as psagg__encode (first bad element of v).
 */
psagg_status psagg__cuda_encode(const psagg_codec *codec, const float *x, float *residual, size_t n,
                                psagg__rng_key key, void *out, size_t out_len, uint64_t *d_err,
                                cudaStream_t stream);

/*
 * Decode in (in_len bytes, n elements) into out (overwrite). Validation is fused: bad maxmin
 * meta reports PSAGG_EBADMETA with the bucket index, NaN/Inf in an fp format PSAGG_ENONFINITE
 * with the element index.
 */
psagg_status psagg__cuda_decode(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                                float *out, uint64_t *d_err, cudaStream_t stream);

/* As psagg__cuda_decode, but acc_k = acc_k + y_k (one fp32 add per element). */
psagg_status psagg__cuda_decode_add(const psagg_codec *codec, const void *in, size_t in_len,
                                    size_t n, float *acc, uint64_t *d_err, cudaStream_t stream);

/*
 * The fused server operation: in is a HOST array of n_in (0..PSAGG_CUDA_MAX_INPUTS) DEVICE
 * pointers, each in_len bytes of n encoded elements. s_k = (((0 + y0_k) + y1_k) + ...) in the
 * order given (n_in = 0 encodes zeros, as the CPU does), then s (+ residual, updated, when residual
 * != NULL) is encoded into out. topk has no CUDA sum (PSAGG_EUNSUPPORTED; its encode and decode
 * above have kernels), nor thc (its integer fold is the CPU's, kernels/thc.h). The pointer array is
 * copied into the launch, so it may be reused as soon as this returns. Invalid inputs report
 * stage-0 errors whose index is the input's position.
 */
psagg_status psagg__cuda_aggregate(const psagg_codec *codec, const void *const *in, size_t n_in,
                                   size_t in_len, size_t n, float *residual, psagg__rng_key key,
                                   void *out, size_t out_len, uint64_t *d_err, cudaStream_t stream);

/*
 * thc (kernels/thc.h): the generic functions above refuse it. A worker's push of n floats x at
 * the blocks' scales (DEVICE, psagg__thc_blocks floats; each +0 or in the table's range: the
 * NEXT SCALE of the update before, not checked here) with its residual (N' floats, rotated
 * coordinates: psagg__thc_rotated_len) into out (psagg__thc_push_bytes), rotation key rot; the
 * CPU's psagg__thc_push_encode byte for byte. Stage-1 errors: the first element not finite
 * (PSAGG_ENONFINITE) or beyond 2^100 (PSAGG_ERANGE). A block rotates in shared memory up to
 * 8,192 elements; larger blocks (thc4/16384 ..) take a scratch of N' floats per call, from the
 * stream-ordered allocator (cudaMallocAsync), as does the decode below.
 */
psagg_status psagg__cuda_thc_push_encode(const psagg_codec *codec, psagg__rng_key rot,
                                         const float *scales, const float *x, float *residual,
                                         size_t n, psagg__rng_key key, void *out, size_t out_len,
                                         uint64_t *d_err, cudaStream_t stream);
/*
 * An update's decode (in_len bytes: its width from its length) into n floats out as op says
 * (SET, ADD, FIRST; SCALE: z times factor), the CPU's psagg__thc_update_decode byte for byte.
 * PSAGG_EBADMETA: stage 0 a block's meta (index: the block), stage 1 a sum above what the
 * block's pushes make (index: the coordinate). The next scales are the host's
 * (psagg__thc_update_next_scales: the update came through host memory).
 */
psagg_status psagg__cuda_thc_update_decode(const psagg_codec *codec, psagg__rng_key rot,
                                           const void *in, size_t in_len, size_t n, float factor,
                                           psagg__decode_op op, float *out, uint64_t *d_err,
                                           cudaStream_t stream);

/*
 * Blocking wrappers (tests, tools): run the function above with a temporary error word,
 * synchronize `stream` (not the device) and return the data error, if any, with *bad_index.
 */
psagg_status psagg__cuda_encode_sync(const psagg_codec *codec, const float *x, float *residual,
                                     size_t n, psagg__rng_key key, void *out, size_t out_len,
                                     size_t *bad_index, cudaStream_t stream);
psagg_status psagg__cuda_decode_sync(const psagg_codec *codec, const void *in, size_t in_len,
                                     size_t n, float *out, size_t *bad_index, cudaStream_t stream);
psagg_status psagg__cuda_decode_add_sync(const psagg_codec *codec, const void *in, size_t in_len,
                                         size_t n, float *acc, size_t *bad_index,
                                         cudaStream_t stream);
psagg_status psagg__cuda_aggregate_sync(const psagg_codec *codec, const void *const *in,
                                        size_t n_in, size_t in_len, size_t n, float *residual,
                                        psagg__rng_key key, void *out, size_t out_len,
                                        size_t *bad_index, cudaStream_t stream);

/* x_k = x_k * s on the device (one IEEE multiply per element, as the CPU path), stream-ordered. */
psagg_status psagg__cuda_scale(float *x, size_t n, float s, cudaStream_t stream);

/* ---- host-memory GPU assist for the server ---- */

typedef struct psagg__cuda_ctx psagg__cuda_ctx;

/*
 * A context on `device` (index as cudaSetDevice; the calling thread's current device is set
 * to it here and in every call) with its own non-blocking stream, a device workspace and
 * pinned staging buffers that grow on demand and are kept. PSAGG_EUNSUPPORTED without a
 * device. One thread at a time per context.
 */
psagg_status psagg__cuda_ctx_create(int device, psagg__cuda_ctx **out);
void psagg__cuda_ctx_destroy(psagg__cuda_ctx *ctx);

/*
 * psagg__aggregate on the GPU with HOST buffers (same arguments and results, byte-identical):
 * in[i] are host pointers, residual (optional) and out host buffers. Inputs are staged
 * through pinned memory in one H2D copy, the result (and residual) come back in one D2H copy;
 * returns when out (and residual) are written. On error *bad_index as psagg__aggregate.
 */
psagg_status psagg__cuda_aggregate_host(psagg__cuda_ctx *ctx, const psagg_codec *codec,
                                        const void *const *in, size_t n_in, size_t in_len, size_t n,
                                        float *residual, psagg__rng_key key, void *out,
                                        size_t out_len, size_t *bad_index);

#ifdef __cplusplus
}
#endif

#endif /* PSAGG_KERNELS_CUDA_CODEC_CUDA_H */
