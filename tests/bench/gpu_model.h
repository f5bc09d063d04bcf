/*
 * gpu_model.h - psagg-bench-exchange --model-gpu: workers modelled as GPU workers, so that the
 * cost of the servers and the network can be seen without the CPU codecs of the workers.
 *
 * A push_pull made through gpu_model_push_pull goes through the worker library's own
 * communication thread, windows and wire exactly like psagg_push_pull_cuda's, with buffer
 * operations (worker/worker.h: psagg__bufops) that do on the CPU only what the CUDA path does on
 * the CPU (worker/cuda.c): copy the encoded chunks from pinned memory into the push buffers, and
 * each update's bytes into pinned memory. The GPU's share (encode, decode, the copies over
 * PCIe) is not run but waited for: one GPU stream per worker, each encode and decode taking
 * elements / gelem_s + encoded bytes / pcie_gbyte_s, in the order the CUDA path enqueues them.
 * The first encode of each tensor is real (CPU codecs, in the warm-up step), so the bytes on
 * the wire are the codec's; later rounds send the same bytes again and decode nothing: the
 * outputs are not written.
 */
#ifndef PSAGG_BENCH_GPU_MODEL_H
#define PSAGG_BENCH_GPU_MODEL_H

#include <stdint.h>

#include "psagg.h"

/* After psagg_declare. gelem_s: GPU codec rate in 1e9 elements/s (0: no GPU time at all);
 * pcie_gbyte_s: host<->device copy rate in GB/s (0: no copy time). */
psagg_status gpu_model_init(psagg_ctx *ctx, double gelem_s, double pcie_gbyte_s);
psagg_status gpu_model_push_pull(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                                 psagg_reduce op, int priority, psagg_handle **handle);
void gpu_model_free(void);

#endif
