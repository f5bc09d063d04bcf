/*
 * cuda.c - libpsagg's device-buffer path: psagg_push_pull_cuda and its buffer operations
 * (psagg_bufops, worker.h). This file owns everything on the device side; the rest of the
 * worker sees only the operations and ctx->device / ctx->device_destroy.
 *
 * The calling thread enqueues, on the context's own CUDA stream and after an event recorded
 * on the caller's stream: the encode of every chunk (error feedback fused, residual kept on
 * the device), one device-to-host copy of the compressed bytes into pinned staging, and an
 * event. The communication thread sends once that event has fired. Updates are staged in
 * pinned memory as they arrive (update); when the last one is in, one host-to-device copy
 * and the decode kernels (plus the 1/N scale for PSAGG_AVERAGE) run on the stream
 * (complete's first call), and the handle completes when their event fires. Only compressed bytes
 * cross PCIe, nothing synchronizes the device, and the GPU kernels produce the same bytes as the
 * CPU codecs, so a GPU worker and a CPU worker of one job apply identical updates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/codec.h"
#include "worker.h"

#ifdef PSAGG_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/codec_cuda.h"

typedef struct gpu_tensor {
    int ready;
    int decoding; /* complete() has enqueued the decode of the operation in flight */
    size_t enc_total;
    size_t *enc_off;         /* per chunk: offset in the tensor's encoded bytes */
    float *d_residual;       /* error feedback, or NULL */
    uint8_t *d_enc, *h_enc;  /* encoded pushes: device, pinned host */
    uint8_t *d_upd, *h_upd;  /* updates: device, pinned host */
    uint64_t *d_err, *h_err; /* [0] encode, [1] decode error words */
    cudaEvent_t ev_in, ev_enc, ev_dec;
} gpu_tensor;

typedef struct gpu_state {
    int device;
    cudaStream_t stream;
    gpu_tensor *t;
    pthread_mutex_t mu; /* lazy per-tensor set-up */
} gpu_state;

static int cuda_fail(cudaError_t e, const char *what)
{
    return psagg_fail(PSAGG_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, #call);                                                           \
    } while (0)

static void gpu_destroy(psagg_ctx *ctx);

static psagg_status gpu_state_get(psagg_ctx *ctx, gpu_state **out)
{
    gpu_state *g;
    pthread_mutex_lock(&ctx->mu);
    g = ctx->device;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (g)
            g->t = calloc(ctx->layout.n_tensors, sizeof *g->t);
        if (!g || !g->t) {
            free(g);
            pthread_mutex_unlock(&ctx->mu);
            return psagg_fail(PSAGG_ENOMEM, "GPU state");
        }
        pthread_mutex_init(&g->mu, NULL);
        if (cudaGetDevice(&g->device) != cudaSuccess ||
            cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess) {
            (void)cudaGetLastError();
            free(g->t);
            free(g);
            pthread_mutex_unlock(&ctx->mu);
            return psagg_fail(PSAGG_EUNSUPPORTED, "psagg_push_pull_cuda: no usable CUDA device");
        }
        ctx->device = g;
        ctx->device_destroy = gpu_destroy;
    }
    pthread_mutex_unlock(&ctx->mu);
    *out = g;
    return PSAGG_OK;
}

/* Allocate one tensor's device and pinned buffers on its first device push_pull. */
static psagg_status gpu_tensor_setup(psagg_ctx *ctx, gpu_state *g, uint32_t key)
{
    const psagg_tensor_info *ti = &ctx->layout.tensors[key];
    gpu_tensor *gt = &g->t[key];
    int ef = ctx->tensors[key].residual != NULL;

    if (gt->ready)
        return PSAGG_OK;
    gt->enc_off = calloc(ti->n_chunks, sizeof *gt->enc_off);
    if (!gt->enc_off)
        return psagg_fail(PSAGG_ENOMEM, "GPU chunk offsets");
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        gt->enc_off[c] = gt->enc_total;
        /* 256-byte aligned pieces keep the kernels on their vector paths */
        gt->enc_total += (ctx->layout.chunks[ti->first_chunk + c].enc_bytes + 255) & ~(size_t)255;
    }
    CUDA_TRY(cudaMalloc((void **)&gt->d_enc, gt->enc_total));
    CUDA_TRY(cudaMalloc((void **)&gt->d_upd, gt->enc_total));
    CUDA_TRY(cudaMallocHost((void **)&gt->h_enc, gt->enc_total));
    CUDA_TRY(cudaMallocHost((void **)&gt->h_upd, gt->enc_total));
    CUDA_TRY(cudaMalloc((void **)&gt->d_err, 2 * sizeof(uint64_t)));
    CUDA_TRY(cudaMallocHost((void **)&gt->h_err, 2 * sizeof(uint64_t)));
    if (ef) {
        CUDA_TRY(cudaMalloc((void **)&gt->d_residual, ti->count * sizeof(float)));
        CUDA_TRY(cudaMemsetAsync(gt->d_residual, 0, ti->count * sizeof(float), g->stream));
    }
    CUDA_TRY(cudaEventCreateWithFlags(&gt->ev_in, cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&gt->ev_enc, cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&gt->ev_dec, cudaEventDisableTiming));
    gt->ready = 1;
    return PSAGG_OK;
}

/* Enqueue the encode of every chunk of h and the copy of the bytes to pinned memory. */
static psagg_status gpu_enqueue_encode(psagg_ctx *ctx, gpu_state *g, struct psagg_handle *h,
                                       cudaStream_t user)
{
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
    gpu_tensor *gt = &g->t[h->key];
    psagg_status st;

    CUDA_TRY(cudaEventRecord(gt->ev_in, user));
    CUDA_TRY(cudaStreamWaitEvent(g->stream, gt->ev_in, 0));
    if ((st = psagg_cuda_err_reset(&gt->d_err[0], g->stream)))
        return st;
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        st = psagg_cuda_encode(&ti->codec, h->in + ci->offset,
                               gt->d_residual ? gt->d_residual + ci->offset : NULL, ci->count,
                               psagg_rng_chunk_key(ctx->cfg.seed, PSAGG_RNG_WORKER,
                                                   (uint32_t)ctx->rank, ci->key, ci->index,
                                                   h->round),
                               gt->d_enc + gt->enc_off[c], ci->enc_bytes, &gt->d_err[0], g->stream);
        if (st)
            return st;
    }
    CUDA_TRY(
        cudaMemcpyAsync(gt->h_enc, gt->d_enc, gt->enc_total, cudaMemcpyDeviceToHost, g->stream));
    CUDA_TRY(cudaMemcpyAsync(&gt->h_err[0], &gt->d_err[0], sizeof(uint64_t), cudaMemcpyDeviceToHost,
                             g->stream));
    CUDA_TRY(cudaEventRecord(gt->ev_enc, g->stream));
    return PSAGG_OK;
}

static psagg_status cuda_encode(psagg_ctx *ctx, struct psagg_handle *h);
static psagg_status cuda_update(psagg_ctx *ctx, struct psagg_handle *h, const psagg_chunk_info *ci,
                                const psagg_codec *codec, int mode, const uint8_t *payload,
                                size_t payload_len);
static psagg_status cuda_complete(psagg_ctx *ctx, struct psagg_handle *h);

static const psagg_bufops cuda_ops = {
    .kind = "cuda",
    .encode = cuda_encode,
    .update = cuda_update,
    .complete = cuda_complete,
};

psagg_status psagg_push_pull_cuda(psagg_ctx *ctx, uint32_t key, const float *d_in, float *d_out,
                                  psagg_reduce op, int priority, void *stream,
                                  psagg_handle **handle)
{
    struct psagg_handle *h;
    gpu_state *g = NULL;
    psagg_status st;

    if (!handle)
        return psagg_fail(PSAGG_EINVAL, "psagg_push_pull_cuda: handle is NULL");
    *handle = NULL;
    h = handle_new(ctx, key, d_in, d_out, op, priority, &cuda_ops, &st);
    if (!h)
        return st;
    if (ctx->layout.tensors[key].adaptive) {
        st = psagg_fail(PSAGG_EUNSUPPORTED,
                        "its codec is adaptive ([codec] adaptive = on), which the CUDA path "
                        "does not support yet: push it from host memory (psagg_push_pull)");
        goto err;
    }
    if (ctx->layout.tensors[key].param) {
        st = psagg_fail(PSAGG_EUNSUPPORTED,
                        "it is a parameter ([server] optimizer), which the CUDA path does not "
                        "support yet: push it from host memory (psagg_push_pull)");
        goto err;
    }
    if ((st = gpu_state_get(ctx, &g)))
        goto err;
    pthread_mutex_lock(&g->mu);
    st = gpu_tensor_setup(ctx, g, key);
    pthread_mutex_unlock(&g->mu);
    if (st || (st = gpu_enqueue_encode(ctx, g, h, (cudaStream_t)stream)))
        goto err;
    g->t[key].decoding = 0;
    handle_submit(ctx, h);
    *handle = h;
    return PSAGG_OK;
err:
    psagg_fail_context(st, "psagg_push_pull_cuda: tensor '%s': ", ctx->layout.tensors[key].name);
    handle_abandon(ctx, h);
    return st;
}

/* Event state: PSAGG_OK fired, PSAGG_BUF_PENDING not yet, PSAGG_ECUDA (psagg_fail) failed. */
static psagg_status event_state(cudaEvent_t ev)
{
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady)
        return PSAGG_BUF_PENDING;
    if (e != cudaSuccess)
        return psagg_fail(PSAGG_ECUDA, "CUDA: %s", cudaGetErrorString(e));
    return PSAGG_OK;
}

/* encode: the GPU encoded the input and copied it to pinned memory; fill the push buffers. */
static psagg_status cuda_encode(psagg_ctx *ctx, struct psagg_handle *h)
{
    gpu_state *g = ctx->device;
    gpu_tensor *gt = &g->t[h->key];
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
    size_t bad = 0;
    psagg_status st = event_state(gt->ev_enc);

    if (st)
        return st;
    cudaSetDevice(g->device);
    st = psagg_cuda_err_status(gt->h_err[0], &bad);
    if (st) {
        psagg_fail_context(st, "tensor '%.63s': element %zu: ", ti->name, bad);
        if (gt->d_residual) /* part of it was updated: start error feedback afresh */
            cudaMemsetAsync(gt->d_residual, 0, ti->count * sizeof(float), g->stream);
        return st;
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        memcpy(ctx->chunks[ti->first_chunk + c].buf + sizeof(psagg_msg_hdr),
               gt->h_enc + gt->enc_off[c], ci->enc_bytes);
    }
    return PSAGG_OK;
}

/* update: keep the chunk's bytes in pinned memory for the decode on the device. */
static psagg_status cuda_update(psagg_ctx *ctx, struct psagg_handle *h, const psagg_chunk_info *ci,
                                const psagg_codec *codec, int mode, const uint8_t *payload,
                                size_t payload_len)
{
    gpu_state *g = ctx->device;
    /* the round's codec is h->codec (no parameters here: psagg_push_pull_cuda refuses them),
       and the decode on the device scales for AVERAGE itself */
    (void)codec, (void)mode;
    memcpy(g->t[h->key].h_upd + g->t[h->key].enc_off[ci->index], payload, payload_len);
    return PSAGG_OK;
}

/*
 * Every update is staged: copy them to the device and enqueue the decode into h->out.
 * PSAGG_BUF_PENDING once enqueued (the decode's event says when it is done).
 */
static psagg_status start_decode(psagg_ctx *ctx, struct psagg_handle *h)
{
    gpu_state *g = ctx->device;
    gpu_tensor *gt = &g->t[h->key];
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
    psagg_status st;
    cudaError_t e;

    cudaSetDevice(g->device); /* the communication thread's first CUDA call */
    st = psagg_cuda_err_reset(&gt->d_err[1], g->stream);
    e = cudaMemcpyAsync(gt->d_upd, gt->h_upd, gt->enc_total, cudaMemcpyHostToDevice, g->stream);
    if (!st && e != cudaSuccess)
        st = cuda_fail(e, "cudaMemcpyAsync(updates)");
    for (uint32_t c = 0; !st && c < ti->n_chunks; c++) {
        const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        st = psagg_cuda_decode(&ti->codec, gt->d_upd + gt->enc_off[c], ci->enc_bytes, ci->count,
                               h->out + ci->offset, &gt->d_err[1], g->stream);
    }
    if (!st && h->op == PSAGG_AVERAGE)
        st = psagg_cuda_scale(h->out, ti->count, 1.0f / (float)ctx->world, g->stream);
    if (!st && ((e = cudaMemcpyAsync(&gt->h_err[1], &gt->d_err[1], sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, g->stream)) != cudaSuccess ||
                (e = cudaEventRecord(gt->ev_dec, g->stream)) != cudaSuccess))
        st = cuda_fail(e, "enqueueing the update decode");
    if (st)
        return psagg_fail_context(st, "tensor '%.63s': decoding the update on the GPU: ", ti->name);
    return PSAGG_BUF_PENDING;
}

/* complete: start the decode once, then PSAGG_OK when its event has fired. */
static psagg_status cuda_complete(psagg_ctx *ctx, struct psagg_handle *h)
{
    gpu_tensor *gt = &((gpu_state *)ctx->device)->t[h->key];
    size_t bad = 0;
    psagg_status st;
    if (!gt->decoding) {
        gt->decoding = 1;
        return start_decode(ctx, h);
    }
    if ((st = event_state(gt->ev_dec)))
        return st;
    if (psagg_cuda_err_status(gt->h_err[1], &bad))
        return psagg_fail_context(PSAGG_EPROTO, "update of tensor '%.63s' is invalid at %zu: ",
                                  ctx->layout.tensors[h->key].name, bad);
    return PSAGG_OK;
}

static void gpu_destroy(psagg_ctx *ctx)
{
    gpu_state *g = ctx->device;
    if (!g)
        return;
    cudaSetDevice(g->device);
    cudaStreamSynchronize(g->stream); /* this context's work only */
    for (uint32_t t = 0; t < ctx->layout.n_tensors; t++) {
        gpu_tensor *gt = &g->t[t];
        if (!gt->enc_off)
            continue;
        cudaFree(gt->d_enc);
        cudaFree(gt->d_upd);
        cudaFree(gt->d_err);
        cudaFree(gt->d_residual);
        cudaFreeHost(gt->h_enc);
        cudaFreeHost(gt->h_upd);
        cudaFreeHost(gt->h_err);
        if (gt->ready) {
            cudaEventDestroy(gt->ev_in);
            cudaEventDestroy(gt->ev_enc);
            cudaEventDestroy(gt->ev_dec);
        }
        free(gt->enc_off);
    }
    cudaStreamDestroy(g->stream);
    pthread_mutex_destroy(&g->mu);
    free(g->t);
    free(g);
    ctx->device = NULL;
}

#else /* built without CUDA: the device path is unavailable */

psagg_status psagg_push_pull_cuda(psagg_ctx *ctx, uint32_t key, const float *d_in, float *d_out,
                                  psagg_reduce op, int priority, void *stream,
                                  psagg_handle **handle)
{
    (void)ctx, (void)key, (void)d_in, (void)d_out, (void)op, (void)priority, (void)stream;
    if (handle)
        *handle = NULL;
    return psagg_fail(PSAGG_EUNSUPPORTED,
                      "psagg_push_pull_cuda: libpsagg was built without CUDA (PSAGG_CUDA=OFF)");
}

#endif
