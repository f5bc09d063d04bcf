/*
 * kernels/cuda/launch.h - the private seam between the CUDA host API (codec_cuda.cu: argument
 * checks, error words, contexts) and the kernels (kernels.cu: device code and launches).
 * C++ only (both are CUDA translation units). Layer: kernels.
 */
#ifndef PSAGG_KERNELS_CUDA_LAUNCH_H
#define PSAGG_KERNELS_CUDA_LAUNCH_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels/cuda/codec_cuda.h"

namespace psagg__cuda
{

/* Everything a kernel needs to know about the codec and the buffer (codec_cuda.cu fills it). */
struct KArgs {
    uint64_t n;
    uint64_t nb;
    uint64_t payload; /* maxmin payload bytes; the payload starts at 8 * nb */
    uint32_t bucket, bits, levels;
    float levels_f;
    uint32_t k0, k1;
    int sr;
    int vec; /* every float array and encoded buffer of the call is 16-byte aligned */
    /* topk (kernels/topk.h; bits and levels above are b and 2^(b-1) - 1, nb the blocks): */
    uint32_t tk_block, tk_k, tk_ib;           /* C, k, log2(C) */
    uint64_t tk_kept;                         /* K: entries kept in all */
    uint64_t tk_idx_off, tk_val_off, tk_size; /* where the streams start; the encoded size */
    /* thc (kernels/thc.h; n, nb the blocks, bits, levels 2^b - 1, k0/k1 the worker's key): */
    uint32_t th_block;            /* D */
    uint32_t rk0, rk1;            /* the rotation's key */
    uint32_t th_width, th_inputs; /* an update's sum width and the inputs that width holds */
    uint64_t th_meta, th_size;    /* the meta's bytes (8 or 12 per block); the message's size */
    uint64_t th_np;               /* N': the rotated coordinates */
    float th_factor;              /* decode: z times it (op PSAGG_DECODE_SCALE) */
    int th_op;                    /* decode: a psagg__decode_op */
};

/* The aggregate's input pointers, passed by value in the launch. */
struct InPtrs {
    const uint8_t *p[PSAGG_CUDA_MAX_INPUTS];
};

/*
 * Enqueue the kernels of one operation on `s` for a codec `id` (psagg_codec_id) whose
 * arguments codec_cuda.cu has checked; the launch's own error is returned (cudaLaunchKernel),
 * the runtime's last error is left alone.
 */
cudaError_t launch_encode(int id, const KArgs &a, const float *x, float *residual, uint8_t *out,
                          uint64_t *err, cudaStream_t s);
cudaError_t launch_decode(int id, bool accumulate, const KArgs &a, const uint8_t *in, float *out,
                          uint64_t *err, cudaStream_t s);
cudaError_t launch_aggregate(int id, const KArgs &a, const InPtrs &in, uint32_t n_in,
                             float *residual, uint8_t *out, uint64_t *err, cudaStream_t s);
cudaError_t launch_scale(float *x, size_t n, float factor, cudaStream_t s);
/* thc: a push at the blocks' scales (device, nb floats), and an update's decode. scratch: N'
   floats when D > thc_smem_max(), else unused. */
cudaError_t launch_thc_encode(const KArgs &a, const float *x, float *residual, const float *scales,
                              uint8_t *out, float *scratch, uint64_t *err, cudaStream_t s);
cudaError_t launch_thc_decode(const KArgs &a, const uint8_t *in, float *out, float *scratch,
                              uint64_t *err, cudaStream_t s);
uint32_t thc_smem_max();

} // namespace psagg__cuda

#endif
