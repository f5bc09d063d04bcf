/*
 * gpu.c - the server's GPU assist ([server] gpu = auto|on|off, gpu_min_elems).
 *
 * When enabled, each aggregation thread owns a CUDA context (kernels/cuda: its own stream,
 * device workspace and pinned staging). Chunks of at least gpu_min_elems elements pinned to
 * such a thread keep every contribution of a round compressed in its slot, and the last one
 * runs the fused operation on the GPU (psagg_cuda_aggregate_host): the inputs are summed in
 * worker order and requantized exactly as the CPU does, so the update bytes are the same.
 * Without CUDA in the build, gpu = on is a start-up error and auto means off.
 */
#include "base/error.h"
#include "base/log.h"
#include "server.h"

#ifdef PSAGG_WITH_CUDA
#include "kernels/cuda/codec_cuda.h"

psagg_status gpu_thread_init(server *srv, agg_thread *t)
{
    psagg_cuda_ctx *ctx = NULL;
    psagg_status st;
    if (srv->cfg.gpu == PSAGG_GPU_OFF)
        return PSAGG_OK;
    if (psagg_cuda_device_count() == 0) {
        if (srv->cfg.gpu == PSAGG_GPU_ON)
            return psagg_fail(PSAGG_EUNSUPPORTED,
                              "[server] gpu = on, but no CUDA device is usable on this host");
        return PSAGG_OK;
    }
    st = psagg_cuda_ctx_create(0, &ctx);
    if (st) {
        if (srv->cfg.gpu == PSAGG_GPU_ON)
            return psagg_fail_context(st, "[server] gpu = on: ");
        LOG_WARN(&srv->log, "GPU assist off: %s", psagg_last_error());
        return PSAGG_OK;
    }
    t->cuda = ctx;
    return PSAGG_OK;
}

void gpu_thread_fini(agg_thread *t)
{
    psagg_cuda_ctx_destroy(t->cuda);
    t->cuda = NULL;
}

psagg_status gpu_aggregate(server *srv, chunk_state *c, const psagg_codec *codec, psagg_rng_key key,
                           uint8_t *out, size_t *bad)
{
    const void *in[PSAGG_CUDA_MAX_INPUTS];
    size_t enc = c->enc;
    for (int w = 0; w < srv->n_workers; w++)
        in[w] = c->slots + (size_t)w * c->info->cap_bytes;
    return psagg_cuda_aggregate_host(srv->threads[c->thread].cuda, codec, in,
                                     (size_t)srv->n_workers, enc, c->info->count, c->residual, key,
                                     out, enc, bad);
}

int gpu_max_inputs(void)
{
    return PSAGG_CUDA_MAX_INPUTS;
}

#else /* built without CUDA */

psagg_status gpu_thread_init(server *srv, agg_thread *t)
{
    (void)t;
    if (srv->cfg.gpu == PSAGG_GPU_ON)
        return psagg_fail(PSAGG_EUNSUPPORTED, "[server] gpu = on, but this psagg-server was "
                                              "built without CUDA (PSAGG_CUDA=OFF or no nvcc)");
    return PSAGG_OK;
}

void gpu_thread_fini(agg_thread *t)
{
    (void)t;
}

psagg_status gpu_aggregate(server *srv, chunk_state *c, const psagg_codec *codec, psagg_rng_key key,
                           uint8_t *out, size_t *bad)
{
    (void)srv, (void)c, (void)codec, (void)key, (void)out, (void)bad;
    return psagg_fail(PSAGG_EUNSUPPORTED, "GPU assist not built");
}

int gpu_max_inputs(void)
{
    return 0;
}
#endif
