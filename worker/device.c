/*
 * device.c - libpsagg's device-buffer path: psagg_push_pull_cuda and its buffer operations
 * (psagg__bufops, worker.h), written once against an executor (devexec.h): CUDA's (cuda.c) in
 * production, the simulator's in the tests. Everything on the device side is owned here;
 * the rest of the worker sees only the operations and ctx->device / ctx->device_destroy.
 *
 * One push_pull of tensor t, on the context's own stream of the device that holds the
 * caller's buffers (the caller's current device is restored before every return):
 *   the calling thread (psagg_push_pull_cuda): checks the buffers (device, alignment) before
 *     anything is enqueued; after an event recorded on the caller's stream: every chunk's
 *     encode (error feedback fused, residual kept on the device; one error word per chunk),
 *     one device-to-host copy of the compressed bytes into pinned staging, the error words,
 *     and the event ev_enc. Then the handle is submitted.
 *   the communication thread: encode (ev_enc fired: the words checked in chunk order, the
 *     bytes copied into the push buffers), update (each update staged in pinned memory),
 *     complete (the last update in: one host-to-device copy, every chunk's decode into the
 *     output, the 1/N scale for PSAGG_AVERAGE, the error words, the event ev_dec; then OK
 *     once ev_dec fired and every word is clean).
 *
 * Lifetime, the rule everything here keeps: a handle never completes while work that reads
 * or writes its buffers (the caller's d_in and d_out, the tensor's staging) is queued. Each
 * tensor's `queued` says work of its operation in flight may still be queued; drain
 * (psagg__bufops) waits for the stream before any failure completes the handle (the worker
 * calls it on every failure path: its own, the job's, psagg_close's), and an enqueue that
 * fails partway waits for what it did enqueue before it returns. The set-up and every
 * enqueue sequence hold the state's mutex, which drain takes too, so a failure of the job
 * on another thread cannot complete a handle between two enqueues.
 *
 * Errors, as the CPU path (host.c) reports them: a bad gradient fails the push_pull with the
 * first bad element of the tensor (chunks in order, the element's index in the tensor) and
 * resets the residual; an invalid update, or a device failure while decoding, fails the job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "devexec.h"
#include "kernels/codec.h"
#include "worker.h"

typedef struct dev_tensor {
    int ready;
    int queued;         /* work of the operation in flight may be queued (see above) */
    int decoding;       /* complete() enqueued the decode of the operation in flight */
    int residual_stale; /* a reset could not be enqueued: zero it before the next encode */
    size_t enc_total, upd_total;
    size_t *enc_off;            /* per chunk: offset in the tensor's encoded bytes */
    size_t *upd_off;            /* ... and in its updates' (thc's are wider than its pushes) */
    size_t *upd_len;            /* per chunk: the update's length (thc: as the pushes summed) */
    size_t res_elems;           /* the residual's floats (thc: rotated coordinates) */
    float *d_residual;          /* error feedback, or NULL */
    float *d_scales, *h_scales; /* thc: the blocks' scales of the push (device, pinned) */
    uint8_t *d_enc, *h_enc;     /* encoded pushes: device, pinned host */
    uint8_t *d_upd, *h_upd;     /* updates: device, pinned host */
    uint64_t *d_err, *h_err;    /* error words: n_chunks for the encode, then n_chunks decode */
    void *ev_in, *ev_enc, *ev_dec;
} dev_tensor;

typedef struct dev_state {
    const psagg__devexec *ex;
    int device; /* the device of the first push_pull_cuda's buffers; the stream is its */
    void *stream;
    dev_tensor *t;
    pthread_mutex_t mu; /* set-up, enqueue sequences and drain (see above) */
} dev_state;

/* The caller's current device, switched to the state's for a call and back. */
typedef struct dev_scope {
    int saved, switched;
} dev_scope;

static psagg_status scope_enter(const psagg__devexec *ex, int device, dev_scope *sc)
{
    psagg_status st;
    sc->switched = 0;
    if ((st = ex->get_device(&sc->saved)))
        return st;
    if (sc->saved == device)
        return PSAGG_OK;
    if ((st = ex->set_device(device)))
        return st;
    sc->switched = 1;
    return PSAGG_OK;
}

static void scope_leave(const psagg__devexec *ex, dev_scope *sc)
{
    if (sc->switched)
        (void)ex->set_device(sc->saved);
}

static void dev_destroy(psagg_ctx *ctx);

psagg_status psagg__device_use(psagg_ctx *ctx, const psagg__devexec *ex)
{
    if (!ctx || !ex)
        return psagg__fail(PSAGG_EINVAL, "psagg__device_use: NULL argument");
    if (ctx->device)
        return psagg__fail(PSAGG_EINVAL, "psagg__device_use: the device path is in use already");
    ctx->devexec = ex;
    return PSAGG_OK;
}

/* The device path's state, made by the first push_pull_cuda on the device that holds its
 * buffers (`device`). */
static psagg_status state_get(psagg_ctx *ctx, int device, dev_state **out)
{
    const psagg__devexec *ex = ctx->devexec ? ctx->devexec : psagg__cuda_exec;
    dev_state *g;
    dev_scope sc;
    psagg_status st = PSAGG_OK;

    pthread_mutex_lock(&ctx->mu);
    if ((g = ctx->device))
        goto out;
    g = calloc(1, sizeof *g);
    if (g)
        g->t = calloc(ctx->layout.n_tensors, sizeof *g->t);
    if (!g || !g->t) {
        st = psagg__fail(PSAGG_ENOMEM, "device path state");
        goto fail;
    }
    g->ex = ex;
    g->device = device;
    if ((st = scope_enter(ex, device, &sc)))
        goto fail;
    st = ex->stream_create(&g->stream);
    scope_leave(ex, &sc);
    if (st) {
        psagg__fail_context(st, "creating the stream on device %d: ", device);
        goto fail;
    }
    pthread_mutex_init(&g->mu, NULL);
    ctx->device = g;
    ctx->device_destroy = dev_destroy;
    goto out;
fail:
    if (g)
        free(g->t);
    free(g);
    g = NULL;
out:
    pthread_mutex_unlock(&ctx->mu);
    *out = g;
    return st;
}

/* Free what a tensor's set-up made (the stream has nothing of it queued). */
static void tensor_free(const psagg__devexec *ex, dev_tensor *gt)
{
    if (gt->d_enc)
        ex->dev_free(gt->d_enc);
    if (gt->d_upd)
        ex->dev_free(gt->d_upd);
    if (gt->d_err)
        ex->dev_free(gt->d_err);
    if (gt->d_residual)
        ex->dev_free(gt->d_residual);
    if (gt->d_scales)
        ex->dev_free(gt->d_scales);
    if (gt->h_scales)
        ex->host_free(gt->h_scales);
    if (gt->h_enc)
        ex->host_free(gt->h_enc);
    if (gt->h_upd)
        ex->host_free(gt->h_upd);
    if (gt->h_err)
        ex->host_free(gt->h_err);
    if (gt->ev_in)
        ex->event_destroy(gt->ev_in);
    if (gt->ev_enc)
        ex->event_destroy(gt->ev_enc);
    if (gt->ev_dec)
        ex->event_destroy(gt->ev_dec);
    free(gt->enc_off);
    free(gt->upd_off);
    free(gt->upd_len);
    memset(gt, 0, sizeof *gt);
}

/*
 * Allocate one tensor's device and pinned buffers on its first device push_pull (g->mu held,
 * the state's device current). On a failure everything allocated is freed and the tensor is
 * as before, so a later call sets it up afresh.
 */
static psagg_status tensor_setup(psagg_ctx *ctx, dev_state *g, uint32_t key)
{
    const psagg__devexec *ex = g->ex;
    const psagg__tensor_info *ti = &ctx->layout.tensors[key];
    dev_tensor *gt = &g->t[key];
    size_t words = 2 * (size_t)ti->n_chunks * sizeof(uint64_t);
    psagg_status st;

    if (gt->ready)
        return PSAGG_OK;
    gt->enc_off = calloc(ti->n_chunks, sizeof *gt->enc_off);
    gt->upd_off = calloc(ti->n_chunks, sizeof *gt->upd_off);
    gt->upd_len = calloc(ti->n_chunks, sizeof *gt->upd_len);
    if (!gt->enc_off || !gt->upd_off || !gt->upd_len) {
        tensor_free(ex, gt);
        return psagg__fail(PSAGG_ENOMEM, "device path: chunk offsets");
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        gt->enc_off[c] = gt->enc_total;
        gt->upd_off[c] = gt->upd_total;
        /* 256-byte aligned pieces keep the kernels on their vector paths */
        gt->enc_total += (ci->enc_bytes + 255) & ~(size_t)255;
        gt->upd_total += (psagg__update_cap(&ti->codec, ci->count) + 255) & ~(size_t)255;
    }
    if ((st = ex->dev_alloc((void **)&gt->d_enc, gt->enc_total)) ||
        (st = ex->dev_alloc((void **)&gt->d_upd, gt->upd_total)) ||
        (st = ex->host_alloc((void **)&gt->h_enc, gt->enc_total)) ||
        (st = ex->host_alloc((void **)&gt->h_upd, gt->upd_total)) ||
        (st = ex->dev_alloc((void **)&gt->d_err, words)) ||
        (st = ex->host_alloc((void **)&gt->h_err, words)) || (st = ex->event_create(&gt->ev_in)) ||
        (st = ex->event_create(&gt->ev_enc)) || (st = ex->event_create(&gt->ev_dec)))
        goto fail;
    if (ctx->tensors[key].residual) { /* error feedback: the residual lives on the device */
        gt->res_elems = tensor_residual_elems(&ctx->layout, ti);
        if ((st = ex->dev_alloc((void **)&gt->d_residual, gt->res_elems * sizeof(float))))
            goto fail;
        gt->residual_stale = 1; /* zeroed, stream-ordered, before the first encode */
    }
    if (ti->codec.id == PSAGG_CODEC_THC) { /* the blocks' scales: the host's, copied each push */
        size_t nb = psagg__thc_blocks(ti->count, ti->codec.bucket) * sizeof(float);
        if ((st = ex->dev_alloc((void **)&gt->d_scales, nb)) ||
            (st = ex->host_alloc((void **)&gt->h_scales, nb)))
            goto fail;
    }
    gt->ready = 1;
    return PSAGG_OK;
fail:
    tensor_free(ex, gt);
    return psagg__fail_context(st, "setting up its buffers: ");
}

/* Wait for everything queued on the state's stream (g->mu held). */
static void stream_drain(dev_state *g, dev_tensor *gt)
{
    dev_scope sc;
    if (!gt->queued)
        return;
    /* a failed sync means the device failed: nothing queued will run any more either */
    if (!scope_enter(g->ex, g->device, &sc)) {
        (void)g->ex->stream_sync(g->stream);
        scope_leave(g->ex, &sc);
    }
    gt->queued = 0;
}

/* A failed encode (part of the residual was updated): zero the residual, as the CPU path
 * does; when that cannot be enqueued, before the next encode (g->mu held, device current). */
static void residual_reset(dev_state *g, dev_tensor *gt)
{
    if (!gt->d_residual)
        return;
    gt->residual_stale = 1;
    if (!g->ex->fill(gt->d_residual, 0, gt->res_elems * sizeof(float), g->stream)) {
        gt->residual_stale = 0;
        gt->queued = 1;
    }
}

/* Enqueue the encode of every chunk of h and the copy of its bytes to pinned memory (g->mu
 * held, device current). On a failure, what was enqueued has run when this returns. */
static psagg_status enqueue_encode(psagg_ctx *ctx, dev_state *g, struct psagg_handle *h, void *user)
{
    const psagg__devexec *ex = g->ex;
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    dev_tensor *gt = &g->t[h->key];
    size_t words = (size_t)ti->n_chunks * sizeof(uint64_t);
    psagg_status st;

    if ((st = ex->event_record(gt->ev_in, user)))
        return psagg__fail_context(st, "recording an event on the caller's stream: ");
    gt->queued = 1;
    if ((st = ex->stream_wait_event(g->stream, gt->ev_in)))
        goto fail;
    if (gt->residual_stale) {
        if ((st = ex->fill(gt->d_residual, 0, gt->res_elems * sizeof(float), g->stream)))
            goto fail;
        gt->residual_stale = 0;
    }
    if ((st = ex->fill(gt->d_err, 0xFF, words, g->stream)))
        goto fail;
    if (gt->d_scales) { /* thc: at the scales the last update set (host.c's encode) */
        size_t bytes = psagg__thc_blocks(ti->count, ti->codec.bucket) * sizeof(float);
        thc_scales(&ctx->layout, ti, &ctx->tensors[h->key], h->codec.bits);
        memcpy(gt->h_scales, ctx->tensors[h->key].thc_scale, bytes);
        if ((st = ex->copy(gt->d_scales, gt->h_scales, bytes, g->stream)))
            goto fail;
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        psagg__rng_key key = psagg__rng_chunk_key(ctx->cfg.seed, PSAGG_RNG_WORKER,
                                                  (uint32_t)ctx->rank, ci->key, ci->index, h->step);
        float *res = gt->d_residual ? gt->d_residual + ci->offset : NULL;
        st = gt->d_scales
                 ? ex->thc_encode(&h->codec, thc_rotation(ctx, ci),
                                  gt->d_scales + ci->offset / h->codec.bucket, h->in + ci->offset,
                                  res, ci->count, key, gt->d_enc + gt->enc_off[c], ci->enc_bytes,
                                  &gt->d_err[c], g->stream)
                 : ex->encode(&h->codec, h->in + ci->offset, res, ci->count, key,
                              gt->d_enc + gt->enc_off[c], ci->enc_bytes, &gt->d_err[c], g->stream);
        if (st)
            goto fail;
    }
    if ((st = ex->copy(gt->h_enc, gt->d_enc, gt->enc_total, g->stream)) ||
        (st = ex->copy(gt->h_err, gt->d_err, words, g->stream)) ||
        (st = ex->event_record(gt->ev_enc, g->stream)))
        goto fail;
    return PSAGG_OK;
fail:
    /* earlier chunks' encodes are queued and updated part of the residual for a push that
       is never sent: let them finish (they read the caller's input), then start afresh */
    stream_drain(g, gt);
    residual_reset(g, gt);
    stream_drain(g, gt);
    return psagg__fail_context(st, "enqueueing its encode: ");
}

static psagg_status dev_encode(psagg_ctx *ctx, struct psagg_handle *h);
static psagg_status dev_update(psagg_ctx *ctx, struct psagg_handle *h, const psagg__chunk_info *ci,
                               const psagg_codec *codec, int mode, const uint8_t *payload,
                               size_t payload_len);
static psagg_status dev_complete(psagg_ctx *ctx, struct psagg_handle *h);
static void dev_drain(psagg_ctx *ctx, struct psagg_handle *h);

static const psagg__bufops device_ops = {
    .kind = "cuda",
    .encode = dev_encode,
    .update = dev_update,
    .complete = dev_complete,
    .drain = dev_drain,
};

/* The device that holds d_in and d_out, checked before anything is enqueued. */
static psagg_status check_buffers(psagg_ctx *ctx, const psagg__devexec *ex, const float *d_in,
                                  float *d_out, int *device)
{
    int din, dout;
    psagg_status st;

    if (((uintptr_t)d_in | (uintptr_t)d_out) & 3)
        return psagg__fail(PSAGG_EINVAL, "d_in %p and d_out %p must be 4-byte aligned (floats)",
                           (const void *)d_in, (void *)d_out);
    if ((st = ex->device_of(d_in, &din)))
        return psagg__fail_context(st, "d_in: ");
    if ((st = ex->device_of(d_out, &dout)))
        return psagg__fail_context(st, "d_out: ");
    if (din != dout)
        return psagg__fail(PSAGG_EINVAL, "d_in is on device %d and d_out on device %d", din, dout);
    if (ctx->device && ((dev_state *)ctx->device)->device != din)
        return psagg__fail(PSAGG_EINVAL,
                           "its buffers are on device %d, but this context's device path runs on "
                           "device %d (one device per worker context)",
                           din, ((dev_state *)ctx->device)->device);
    *device = din;
    return PSAGG_OK;
}

psagg_status psagg_push_pull_cuda(psagg_ctx *ctx, uint32_t key, const float *d_in, float *d_out,
                                  psagg_reduce op, int priority, void *stream,
                                  psagg_handle **handle)
{
    const psagg__devexec *ex;
    struct psagg_handle *h;
    dev_state *g = NULL;
    dev_scope sc;
    int device = 0;
    psagg_status st;

    if (!handle)
        return psagg__fail(PSAGG_EINVAL, "psagg_push_pull_cuda: handle is NULL");
    *handle = NULL;
    ex = ctx && ctx->devexec ? ctx->devexec : psagg__cuda_exec;
    if (!ex)
        return psagg__fail(
            PSAGG_EUNSUPPORTED,
            "psagg_push_pull_cuda: libpsagg was built without CUDA (PSAGG_CUDA=OFF)");
    h = handle_new(ctx, key, d_in, d_out, op, priority, &device_ops, &st);
    if (!h)
        return st;
    if (ctx->layout.tensors[key].codec.id == PSAGG_CODEC_THC && !ex->thc_encode) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "its codec is thc, which the device executor '%s' cannot run: push it "
                         "from host memory (psagg_push_pull)",
                         ex->name);
        goto err;
    }
    if (ctx->layout.tensors[key].adaptive) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "its codec is adaptive ([codec] adaptive = on), which the CUDA path "
                         "does not support yet: push it from host memory (psagg_push_pull)");
        goto err;
    }
    if (ctx->tensors[key].residual && ctx->tensors[key].ef_beta != 1.0f) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "its error feedback decays (error_feedback_beta %g), which the CUDA path "
                         "does not support yet: push it from host memory (psagg_push_pull)",
                         (double)ctx->tensors[key].ef_beta);
        goto err;
    }
    if (ctx->quorum) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "the servers run [server] quorum, whose left-out pushes the CUDA path "
                         "cannot carry yet: push it from host memory (psagg_push_pull)");
        goto err;
    }
    if (ctx->keep_pushes) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "the job keeps every push for a takeover ([cluster] server_replicas), "
                         "which the CUDA path is not tested with yet: push it from host memory "
                         "(psagg_push_pull)");
        goto err;
    }
    if (ctx->layout.tensors[key].param) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "it is a parameter ([server] optimizer), which the CUDA path does not "
                         "support yet: push it from host memory (psagg_push_pull)");
        goto err;
    }
    if ((st = check_buffers(ctx, ex, d_in, d_out, &device)) || (st = state_get(ctx, device, &g)))
        goto err;
    if ((st = scope_enter(g->ex, g->device, &sc)))
        goto err;
    pthread_mutex_lock(&g->mu);
    st = tensor_setup(ctx, g, key);
    if (!st) {
        g->t[key].decoding = 0;
        st = enqueue_encode(ctx, g, h, stream);
    }
    pthread_mutex_unlock(&g->mu);
    scope_leave(g->ex, &sc);
    if (st)
        goto err;
    handle_submit(ctx, h); /* a failed job completes it here: after a drain */
    *handle = h;
    return PSAGG_OK;
err:
    psagg__fail_context(st, "psagg_push_pull_cuda: tensor '%s': ", ctx->layout.tensors[key].name);
    handle_abandon(ctx, h); /* nothing of it is queued */
    return st;
}

/* encode: the device encoded the input and copied it to pinned memory; fill the push buffers. */
static psagg_status dev_encode(psagg_ctx *ctx, struct psagg_handle *h)
{
    dev_state *g = ctx->device;
    dev_tensor *gt = &g->t[h->key];
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    psagg_status st = g->ex->event_query(gt->ev_enc);

    if (st == PSAGG_BUF_PENDING)
        return st;
    if (st)
        return psagg__fail_context(st, "tensor '%.63s': encoding on the device: ", ti->name);
    gt->queued = 0;
    for (uint32_t c = 0; c < ti->n_chunks; c++) { /* the first bad element, as the CPU's */
        size_t bad = 0;
        if ((st = g->ex->err_status(gt->h_err[c], &bad))) {
            dev_scope sc;
            psagg__fail_context(
                st, "tensor '%.63s': element %llu: ", ti->name,
                (unsigned long long)(ctx->layout.chunks[ti->first_chunk + c].offset + bad));
            pthread_mutex_lock(&g->mu);
            if (!scope_enter(g->ex, g->device, &sc)) {
                residual_reset(g, gt); /* drain (finish_op) waits for it */
                scope_leave(g->ex, &sc);
            }
            pthread_mutex_unlock(&g->mu);
            return st;
        }
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        memcpy(chunk_push(ctx, ti->first_chunk + c, h->round)->buf + sizeof(psagg__msg_hdr),
               gt->h_enc + gt->enc_off[c], ci->enc_bytes);
    }
    return PSAGG_OK;
}

/* update: keep the chunk's bytes in pinned memory for the decode on the device. Nothing of
 * the tensor is queued: its encode has run, its decode waits for every update. */
static psagg_status dev_update(psagg_ctx *ctx, struct psagg_handle *h, const psagg__chunk_info *ci,
                               const psagg_codec *codec, int mode, const uint8_t *payload,
                               size_t payload_len)
{
    dev_tensor *gt = &((dev_state *)ctx->device)->t[h->key];
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    /* the round's codec is h->codec (no parameters here: psagg_push_pull_cuda refuses them),
       and the decode on the device scales for AVERAGE itself */
    (void)codec, (void)mode;
    if (payload_len > psagg__update_cap(&h->codec, ci->count))
        return psagg__fail(PSAGG_EBADLEN,
                           "update of tensor '%.63s' chunk %u from server %u: %zu bytes, more "
                           "than %zu",
                           ti->name, ci->index, chunk_owner(ctx, ti->first_chunk + ci->index),
                           payload_len, psagg__update_cap(&h->codec, ci->count));
    if (h->codec.id == PSAGG_CODEC_THC) { /* its meta here (the device checks the sums), and
                                             the scales of the chunk's next push */
        size_t inputs;
        float *peaks = ctx->tensors[h->key].thc_peak + ci->offset / h->codec.bucket;
        psagg_status st = psagg__thc_update_meta(h->codec.bits, h->codec.bucket, payload,
                                                 payload_len, ci->count, &inputs, NULL, NULL);
        if (st)
            return psagg__fail_context(
                st, "update of tensor '%.63s' chunk %u from server %u: ", ti->name, ci->index,
                chunk_owner(ctx, ti->first_chunk + ci->index));
        psagg__thc_update_peaks(h->codec.bucket, payload, ci->count, peaks);
    }
    memcpy(gt->h_upd + gt->upd_off[ci->index], payload, payload_len);
    gt->upd_len[ci->index] = payload_len;
    return PSAGG_OK;
}

/* Every update is staged: enqueue its copy to the device and the decode into h->out (g->mu
 * held, device current). */
static psagg_status enqueue_decode(psagg_ctx *ctx, dev_state *g, struct psagg_handle *h)
{
    const psagg__devexec *ex = g->ex;
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    dev_tensor *gt = &g->t[h->key];
    uint64_t *d_words = gt->d_err + ti->n_chunks;
    size_t words = (size_t)ti->n_chunks * sizeof(uint64_t);
    psagg_status st;

    gt->queued = 1;
    if ((st = ex->fill(d_words, 0xFF, words, g->stream)))
        return st;
    /* (thc's staging holds the widest sums: each chunk's update as long as it came) */
    for (uint32_t c = 0; c < (gt->d_scales ? ti->n_chunks : 1); c++)
        if ((st = ex->copy(gt->d_upd + gt->upd_off[c], gt->h_upd + gt->upd_off[c],
                           gt->d_scales ? gt->upd_len[c] : gt->upd_total, g->stream)))
            return st;
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        const uint8_t *in = gt->d_upd + gt->upd_off[c];
        /* thc scales each coordinate before its inverse rotation (host.c's decode) */
        st = gt->d_scales
                 ? ex->thc_decode(&h->codec, thc_rotation(ctx, ci), in, gt->upd_len[c], ci->count,
                                  h->chunk_scale[c],
                                  h->op == PSAGG_AVERAGE ? PSAGG_DECODE_SCALE : PSAGG_DECODE_SET,
                                  h->out + ci->offset, &d_words[c], g->stream)
                 : ex->decode(&h->codec, in, gt->upd_len[c], ci->count, h->out + ci->offset,
                              &d_words[c], g->stream);
        if (st)
            return st;
    }
    if (h->op == PSAGG_AVERAGE && !gt->d_scales) { /* one scale, unless the chunks summed
                                                      different workers */
        uint32_t same = 1;
        for (uint32_t c = 1; c < ti->n_chunks && same; c++)
            same = h->chunk_scale[c] == h->chunk_scale[0];
        for (uint32_t c = 0; c < (same ? 1 : ti->n_chunks); c++) {
            const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
            if ((st = ex->scale(h->out + (same ? 0 : ci->offset), same ? ti->count : ci->count,
                                h->chunk_scale[c], g->stream)))
                return st;
        }
    }
    if ((st = ex->copy(gt->h_err + ti->n_chunks, d_words, words, g->stream)) ||
        (st = ex->event_record(gt->ev_dec, g->stream)))
        return st;
    return PSAGG_OK;
}

/*
 * complete: enqueue the decode once (PSAGG_BUF_PENDING), then PSAGG_OK once its event fired
 * and every chunk decoded cleanly. A failure fails the job (comm.c), which drains first.
 */
static psagg_status dev_complete(psagg_ctx *ctx, struct psagg_handle *h)
{
    dev_state *g = ctx->device;
    dev_tensor *gt = &g->t[h->key];
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    psagg_status st;

    if (!gt->decoding) {
        dev_scope sc;
        gt->decoding = 1;
        pthread_mutex_lock(&g->mu);
        if (!(st = scope_enter(g->ex, g->device, &sc))) {
            st = enqueue_decode(ctx, g, h);
            scope_leave(g->ex, &sc);
        }
        pthread_mutex_unlock(&g->mu);
        if (st)
            return psagg__fail_context(
                st, "tensor '%.63s': enqueueing the update's decode: ", ti->name);
        return PSAGG_BUF_PENDING;
    }
    if ((st = g->ex->event_query(gt->ev_dec)) == PSAGG_BUF_PENDING)
        return st;
    if (st)
        return psagg__fail_context(st,
                                   "tensor '%.63s': decoding the update on the device: ", ti->name);
    gt->queued = 0;
    for (uint32_t c = 0; c < ti->n_chunks; c++) { /* what the CPU's update would have said */
        size_t bad = 0;
        if ((st = g->ex->err_status(gt->h_err[ti->n_chunks + c], &bad)))
            return psagg__fail_context(PSAGG_EPROTO,
                                       "update of tensor '%.63s' chunk %u from server %u: at %zu: ",
                                       ti->name, c, chunk_owner(ctx, ti->first_chunk + c), bad);
    }
    return PSAGG_OK;
}

/* drain: h is about to complete with a failure; wait until none of its work is queued. */
static void dev_drain(psagg_ctx *ctx, struct psagg_handle *h)
{
    dev_state *g = ctx->device;
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    stream_drain(g, &g->t[h->key]);
    pthread_mutex_unlock(&g->mu);
}

static void dev_destroy(psagg_ctx *ctx)
{
    dev_state *g = ctx->device;
    dev_scope sc;
    if (!g)
        return;
    if (!scope_enter(g->ex, g->device, &sc)) {
        (void)g->ex->stream_sync(g->stream); /* this context's work only */
        for (uint32_t t = 0; t < ctx->layout.n_tensors; t++)
            tensor_free(g->ex, &g->t[t]);
        g->ex->stream_destroy(g->stream);
        scope_leave(g->ex, &sc);
    }
    pthread_mutex_destroy(&g->mu);
    free(g->t);
    free(g);
    ctx->device = NULL;
}
