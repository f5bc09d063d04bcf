/*
 * gpu_model.c - GPU workers modelled for psagg-bench-exchange (gpu_model.h says what is run and
 * what is only waited for).
 */
#include "gpu_model.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "worker/worker.h"

typedef struct model_tensor {
    uint8_t *h_enc, *h_upd; /* the CUDA path's pinned staging: encoded chunks, updates */
    size_t *off;            /* each chunk's place in them */
    size_t *off_upd;        /* ... in h_upd (thc's updates are wider than its pushes) */
    int64_t cost_ns;        /* one encode or decode on the modelled GPU */
    int encoded_once;       /* h_enc holds the codec's bytes (comm thread) */
    int decoding;           /* complete has started the modelled decode (comm thread) */
    int64_t enc_ready_ns, dec_ready_ns;
} model_tensor;

static struct {
    pthread_mutex_t mu;  /* gpu_free_ns: the submitting thread and the comm thread */
    int64_t gpu_free_ns; /* when the modelled GPU stream has done what it was given */
    model_tensor *t;
    uint32_t n;
} model = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Queue cost_ns of work on the modelled GPU stream; when it will be done. */
static int64_t gpu_enqueue(int64_t cost_ns)
{
    int64_t now = now_ns(), done;
    pthread_mutex_lock(&model.mu);
    done = (model.gpu_free_ns > now ? model.gpu_free_ns : now) + cost_ns;
    model.gpu_free_ns = done;
    pthread_mutex_unlock(&model.mu);
    return done;
}

/* encode: once the modelled encode is done, copy the encoded bytes into the push buffers. */
static psagg_status model_encode(psagg_ctx *ctx, struct psagg_handle *h)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    model_tensor *t = &model.t[h->key];

    if (now_ns() < t->enc_ready_ns)
        return PSAGG_BUF_PENDING;
    if (!t->encoded_once) { /* the codec's bytes, once: the CPU encodes them */
        psagg_status st = psagg__host_ops.encode(ctx, h);
        if (st)
            return st;
        for (uint32_t c = 0; c < ti->n_chunks; c++)
            memcpy(t->h_enc + t->off[c],
                   chunk_push(ctx, ti->first_chunk + c, h->round)->buf + sizeof(psagg__msg_hdr),
                   ctx->layout.chunks[ti->first_chunk + c].enc_bytes);
        t->encoded_once = 1;
        return PSAGG_OK;
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++)
        memcpy(chunk_push(ctx, ti->first_chunk + c, h->round)->buf + sizeof(psagg__msg_hdr),
               t->h_enc + t->off[c], ctx->layout.chunks[ti->first_chunk + c].enc_bytes);
    return PSAGG_OK;
}

/* update: keep the chunk's bytes in (modelled pinned) memory for the decode on the device. */
static psagg_status model_update(psagg_ctx *ctx, struct psagg_handle *h,
                                 const psagg__chunk_info *ci, const psagg_codec *codec, int mode,
                                 const uint8_t *payload, size_t payload_len)
{
    model_tensor *t = &model.t[h->key];
    (void)ctx, (void)codec, (void)mode;
    memcpy(t->h_upd + t->off_upd[ci->index], payload, payload_len);
    return PSAGG_OK;
}

/* complete: queue the modelled decode once, then PSAGG_OK when it is done. */
static psagg_status model_complete(psagg_ctx *ctx, struct psagg_handle *h)
{
    model_tensor *t = &model.t[h->key];
    (void)ctx;
    if (!t->decoding) {
        t->dec_ready_ns = gpu_enqueue(t->cost_ns);
        t->decoding = 1;
    }
    if (now_ns() < t->dec_ready_ns)
        return PSAGG_BUF_PENDING;
    t->decoding = 0;
    return PSAGG_OK;
}

static const psagg__bufops model_ops = {
    .kind = "gpu-model",
    .encode = model_encode,
    .update = model_update,
    .complete = model_complete,
};

psagg_status gpu_model_init(psagg_ctx *ctx, double gelem_s, double pcie_gbyte_s)
{
    model.n = ctx->layout.n_tensors;
    model.t = calloc(model.n, sizeof *model.t);
    if (!model.t)
        return psagg__fail(PSAGG_ENOMEM, "gpu model: out of memory");
    for (uint32_t k = 0; k < model.n; k++) {
        const psagg__tensor_info *ti = &ctx->layout.tensors[k];
        model_tensor *t = &model.t[k];
        size_t total = 0, total_upd = 0;
        t->off = calloc(ti->n_chunks, sizeof *t->off);
        t->off_upd = calloc(ti->n_chunks, sizeof *t->off_upd);
        if (!t->off || !t->off_upd)
            return psagg__fail(PSAGG_ENOMEM, "gpu model: out of memory");
        for (uint32_t c = 0; c < ti->n_chunks; c++) {
            const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
            t->off[c] = total;
            total += ci->enc_bytes;
            t->off_upd[c] = total_upd;
            total_upd += psagg__update_cap(&ti->codec, ci->count);
        }
        /* touched now: no page faults inside the timed steps */
        t->h_enc = calloc(1, total);
        t->h_upd = calloc(1, total_upd);
        if (!t->h_enc || !t->h_upd)
            return psagg__fail(PSAGG_ENOMEM, "gpu model: out of memory");
        memset(t->h_enc, 0, total);
        memset(t->h_upd, 0, total_upd);
        t->cost_ns = (int64_t)((gelem_s > 0 ? (double)ti->count / (gelem_s * 1e9) : 0) * 1e9 +
                               (pcie_gbyte_s > 0 ? (double)total / (pcie_gbyte_s * 1e9) : 0) * 1e9);
    }
    return PSAGG_OK;
}

psagg_status gpu_model_push_pull(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                                 psagg_reduce op, int priority, psagg_handle **handle)
{
    psagg_status st;
    struct psagg_handle *h = handle_new(ctx, key, in, out, op, priority, &model_ops, &st);
    if (!h)
        return st;
    /* as psagg_push_pull_cuda: the encode goes on the device's stream when the call is made */
    model.t[key].enc_ready_ns = gpu_enqueue(model.t[key].cost_ns);
    handle_submit(ctx, h);
    *handle = h;
    return PSAGG_OK;
}

void gpu_model_free(void)
{
    for (uint32_t k = 0; model.t && k < model.n; k++) {
        free(model.t[k].h_enc);
        free(model.t[k].h_upd);
        free(model.t[k].off);
        free(model.t[k].off_upd);
    }
    free(model.t);
    model.t = NULL;
}
