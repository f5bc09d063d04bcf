/*
 * gpu.c - the server's GPU assist ([server] gpu = auto|on|off, gpu_min_elems).
 *
 * When enabled, each aggregation thread owns a CUDA context (kernels/cuda: its own stream,
 * device workspace and pinned staging). Chunks of at least gpu_min_elems elements pinned to
 * such a thread are summed by gpu_sum_ops: they keep every contribution of a round compressed
 * in its slot, and the round's end runs the fused operation on the GPU
 * (psagg__cuda_aggregate_host): the inputs are summed in worker order and requantized exactly
 * as the CPU does, so the update bytes are the same.
 * Without CUDA in the build, gpu = on is a start-up error and auto means off.
 */
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "server.h"

/*
 * gpu_sum_ops' collect: validate the payload now (the GPU's decode would only find a bad
 * one at the round's end, with no worker to blame) and keep it in its slot.
 */
static int gpu_collect(server *srv, chunk_state *c, int w, recv_buf *rb)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    const uint8_t *payload = rb->rx.buf + sizeof *h;

    if (psagg__validate(&c->codec, payload, c->enc, c->info->count)) {
        server_close_worker(srv, w, "push of tensor %u chunk %u round %u: payload: %s", h->key,
                            h->chunk, h->round, psagg_last_error());
        return 0;
    }
    memcpy(c->slots + (size_t)w * c->info->cap_bytes, payload, c->enc);
    c->arrived[w] = 1;
    c->n_arrived++;
    /* the GPU sums all inputs in worker order at once */
    return server_members_in(srv, c) ? CHUNK_COMPLETE : 0;
}

/* gpu_sum_ops' settle: complete once every member's push is in (the leavers' that came too). */
static int gpu_settle(server *srv, chunk_state *c)
{
    return server_members_in(srv, c) ? CHUNK_COMPLETE : 0;
}

/* The sum is made on the device: no accumulator on the host. */
static psagg_status gpu_alloc(server *srv, chunk_state *c)
{
    (void)srv, (void)c;
    return PSAGG_OK;
}

static void gpu_free(chunk_state *c)
{
    (void)c;
}

#ifdef PSAGG_WITH_CUDA
#include "kernels/cuda/codec_cuda.h"

psagg_status gpu_thread_init(server *srv, agg_thread *t)
{
    psagg__cuda_ctx *ctx = NULL;
    psagg_status st;
    if (srv->cfg.gpu == PSAGG_GPU_OFF)
        return PSAGG_OK;
    if (psagg__cuda_device_count() == 0) {
        if (srv->cfg.gpu == PSAGG_GPU_ON)
            return psagg__fail(PSAGG_EUNSUPPORTED,
                               "[server] gpu = on, but no CUDA device is usable on this host");
        return PSAGG_OK;
    }
    st = psagg__cuda_ctx_create(0, &ctx);
    if (st) {
        if (srv->cfg.gpu == PSAGG_GPU_ON)
            return psagg__fail_context(st, "[server] gpu = on: ");
        LOG_WARN(&srv->log, "GPU assist off: %s", psagg_last_error());
        return PSAGG_OK;
    }
    t->cuda = ctx;
    return PSAGG_OK;
}

void gpu_thread_fini(agg_thread *t)
{
    psagg__cuda_ctx_destroy(t->cuda);
    t->cuda = NULL;
}

/*
 * gpu_sum_ops' encode: sum c's inputs (all in its slots, in worker order) and requantize on
 * the GPU. When the GPU fails (out of memory, a lost or faulted device: not the data's fault)
 * the chunk is folded on the CPU instead, which gives the same bytes (the residual is only
 * written back by a GPU sum that succeeded), and the job goes on: the first failure of each
 * thread is logged as a warning, later ones at debug.
 */
static psagg_status gpu_encode(server *srv, chunk_state *c, psagg__rng_key key, uint8_t *out,
                               size_t *bad)
{
    const void *in[PSAGG_CUDA_MAX_INPUTS];
    agg_thread *t = &srv->pool.threads[c->thread];
    size_t enc = c->enc, n_in = 0; /* the pushes that came, in worker order */
    psagg_status st;
    for (int w = 0; w < srv->n_workers; w++)
        if (c->arrived[w])
            in[n_in++] = c->slots + (size_t)w * c->info->cap_bytes;
    st = psagg__cuda_aggregate_host(t->cuda, &c->codec, in, n_in, enc, c->info->count, c->residual,
                                    key, out, enc, bad);
    if (st != PSAGG_ECUDA && st != PSAGG_ENOMEM && st != PSAGG_EUNSUPPORTED)
        return st; /* done, or the sum's own error (the CPU would say the same) */
    if (t->gpu_failed++ == 0)
        LOG_WARN(&srv->log,
                 "GPU assist: tensor '%s' chunk %u round %u: %s; summed on the CPU instead "
                 "(and so is every chunk the GPU fails later; see debug logs)",
                 srv->layout.tensors[c->info->key].name, c->info->index, c->round,
                 psagg_last_error());
    else
        LOG_DEBUG(&srv->log, "GPU assist failed %llu times; the latest: %s",
                  (unsigned long long)t->gpu_failed, psagg_last_error());
    return psagg__aggregate(&c->codec, in, n_in, enc, c->info->count, c->residual, key, out, enc,
                            bad);
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
        return psagg__fail(PSAGG_EUNSUPPORTED, "[server] gpu = on, but this psagg-server was "
                                               "built without CUDA (PSAGG_CUDA=OFF or no nvcc)");
    return PSAGG_OK;
}

void gpu_thread_fini(agg_thread *t)
{
    (void)t;
}

static psagg_status gpu_encode(server *srv, chunk_state *c, psagg__rng_key key, uint8_t *out,
                               size_t *bad)
{
    (void)srv, (void)c, (void)key, (void)out, (void)bad;
    return psagg__fail(PSAGG_EUNSUPPORTED, "GPU assist not built");
}

int gpu_max_inputs(void)
{
    return 0;
}
#endif

const chunk_sum_ops gpu_sum_ops = {
    .name = "gpu",
    .device = 1,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .collect = gpu_collect,
    .settle = gpu_settle,
    .encode = gpu_encode,
};
