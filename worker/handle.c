/*
 * handle.c - the life of one push_pull (a psagg_handle): created and queued by the calling
 * thread, taken by the communication thread, completed once (success, its own failure, or
 * the context's), then waited on and released by its owner. And failing the whole context,
 * and the send of one push to a server (push_send: the send path of comm.c and failover.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "worker.h"

/* A handle of tensor key, not yet claimed; the deadline runs from now. */
static struct psagg_handle *handle_alloc(psagg_ctx *ctx, uint32_t key, const psagg__bufops *ops,
                                         const float *in, float *out, const char *what,
                                         psagg_status *st)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[key];
    struct psagg_handle *h = calloc(1, sizeof *h + ti->n_chunks * (sizeof(float) + 1));
    if (!h) {
        *st = psagg__fail(PSAGG_ENOMEM, "%s", what);
        return NULL;
    }
    *h = (struct psagg_handle){.ctx = ctx,
                               .ops = ops,
                               .key = key,
                               .in = in,
                               .out = out,
                               .codec = ti->codec,
                               .need_rank = -1,
                               .chunk_scale = (float *)(h + 1),
                               .chunk_done = (uint8_t *)((float *)(h + 1) + ti->n_chunks)};
    /* 2 x op_timeout_ms: silent peers and late workers are named sooner, by whoever knows
     * (runtime/channel.h), and that verdict should reach us before our own timeout */
    h->t_submit = psagg__now_ns();
    h->deadline_ms = h->t_submit / 1000000 + PSAGG_OP_DEADLINE_MS(ctx->cfg.op_timeout_ms);
    return h;
}

/*
 * Claim tensor h->key's in-flight slot for h (under ctx->mu), unless the context failed, the
 * tensor is busy, a checkpoint is being written, or a parameter's kind (h->prm) does not fit
 * its state: INIT once, first. A gradient of a parameter takes the tensor's learning rate and
 * weight decay now; an INIT's round is 0 (the servers answer with the chunks' round). On a
 * refusal h is freed.
 */
static psagg_status handle_claim(psagg_ctx *ctx, struct psagg_handle *h, const char *what)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    tensor_state *ts = &ctx->tensors[h->key];
    uint32_t kind = h->prm.flags & PSAGG_PARAM_KIND_MASK;
    psagg_status st = PSAGG_OK;

    pthread_mutex_lock(&ctx->mu);
    if (ctx->failed)
        st = psagg__fail(ctx->failed_status, "%s", ctx->failed_msg);
    else if (ts->op)
        st = psagg__fail(PSAGG_EINVAL, "%s: tensor '%s' already has an operation in flight", what,
                         ti->name);
    else if (ctx->ckpt.state)
        st = psagg__fail(PSAGG_EINVAL, "%s: tensor '%s': a checkpoint is being written", what,
                         ti->name);
    else if (ti->param && kind == PSAGG_PARAM_INIT && ts->inited)
        st = psagg__fail(PSAGG_EINVAL, "%s: tensor '%s' was initialized already", what, ti->name);
    else if (ti->param && kind != PSAGG_PARAM_INIT && !ts->inited)
        st =
            psagg__fail(PSAGG_EINVAL, "%s: tensor '%s' is a parameter: call psagg_param_init first",
                        what, ti->name);
    if (!st) {
        h->prm.weight = 1.0f;
        if (ti->param && kind == PSAGG_PARAM_GRAD) {
            h->prm.lr = ts->lr;
            h->prm.weight_decay = ts->weight_decay;
            h->prm.tag = ts->tag;
            h->prm.weight = ts->weight;
        }
        h->round = ti->param && kind == PSAGG_PARAM_INIT ? 0 : ts->round;
        h->step = h->round - (h->round ? ts->pulls : 0);
        h->seq = ctx->next_seq++;
        ts->op = h;
    }
    pthread_mutex_unlock(&ctx->mu);
    if (st)
        free(h);
    return st;
}

struct psagg_handle *handle_new(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                                psagg_reduce op, int priority, const psagg__bufops *ops,
                                psagg_status *st)
{
    struct psagg_handle *h;
    const psagg__tensor_info *ti;

    psagg__clear_error();
    *st = PSAGG_OK;
    if (!ctx || !in || !out || (op != PSAGG_SUM && op != PSAGG_AVERAGE)) {
        *st = psagg__fail(PSAGG_EINVAL, "push_pull: NULL argument or unknown reduce op");
        return NULL;
    }
    if (!ctx->declared) {
        *st = psagg__fail(PSAGG_EINVAL, "push_pull: call psagg_declare first");
        return NULL;
    }
    /* keys past the user's are internal: only the communication thread pushes them */
    if (key >= ctx->layout.n_tensors ||
        (key >= ctx->n_user && !pthread_equal(pthread_self(), ctx->comm_tid))) {
        *st = psagg__fail(PSAGG_EINVAL, "push_pull: key %u, only %u tensors declared", key,
                          ctx->n_user);
        return NULL;
    }
    ti = &ctx->layout.tensors[key];
    if (ti->param && in == out) {
        *st = psagg__fail(PSAGG_EINVAL,
                          "push_pull: tensor '%s' is a parameter: in (its gradient) and out (its "
                          "weights) must be different buffers",
                          ti->name);
        return NULL;
    }
    if (!(h = handle_alloc(ctx, key, ops, in, out, "push_pull", st)))
        return NULL;
    h->op = op;
    h->priority = priority;
    if (ti->param)
        h->prm.flags = PSAGG_PARAM_GRAD | (op == PSAGG_AVERAGE ? PSAGG_PARAM_AVERAGE : 0);
    return (*st = handle_claim(ctx, h, "push_pull")) ? NULL : h;
}

struct psagg_handle *handle_new_param(psagg_ctx *ctx, uint32_t key, float *out, uint32_t kind,
                                      uint32_t flags, psagg_status *st)
{
    const char *what = kind == PSAGG_PARAM_INIT ? "psagg_param_init" : "psagg_pull_weights";
    struct psagg_handle *h;

    psagg__clear_error();
    *st = PSAGG_OK;
    if (!ctx || !ctx->declared || key >= ctx->n_user || !ctx->layout.tensors[key].param) {
        *st = psagg__fail(PSAGG_EINVAL, "%s: key %u is no declared parameter tensor", what, key);
        return NULL;
    }
    if (!out) {
        *st = psagg__fail(PSAGG_EINVAL, "%s: tensor '%s': NULL weights buffer", what,
                          ctx->layout.tensors[key].name);
        return NULL;
    }
    if (!(h = handle_alloc(ctx, key, &psagg__host_ops, out, out, what, st)))
        return NULL;
    h->prm.flags = kind | flags;
    return (*st = handle_claim(ctx, h, what)) ? NULL : h;
}

void handle_submit(psagg_ctx *ctx, struct psagg_handle *h)
{
    pthread_mutex_lock(&ctx->mu);
    h->submitted = 1;
    if (ctx->failed) { /* after handle_new: worker_fail_all left it to us */
        handle_complete_locked(ctx, h, ctx->failed_status, ctx->failed_msg);
        if (ctx->tensors[h->key].op == h)
            ctx->tensors[h->key].op = NULL;
    } else {
        h->next = ctx->queue;
        ctx->queue = h;
    }
    pthread_mutex_unlock(&ctx->mu);
    /* the comm thread reads the queue under mu after setting comm_idle: one of us sees it */
    if (atomic_load(&ctx->comm_idle))
        psagg__fabric_wake(ctx->fab);
}

void handle_abandon(psagg_ctx *ctx, struct psagg_handle *h)
{
    pthread_mutex_lock(&ctx->mu);
    if (ctx->tensors[h->key].op == h)
        ctx->tensors[h->key].op = NULL;
    pthread_mutex_unlock(&ctx->mu);
    free(h);
}

void handle_complete_locked(psagg_ctx *ctx, struct psagg_handle *h, psagg_status status,
                            const char *msg)
{
    if (h->done)
        return;
    if (status && h->ops && h->ops->drain) /* its owner may free its buffers on waking */
        h->ops->drain(ctx, h);
    h->status = status;
    snprintf(h->msg, sizeof h->msg, "%s", msg ? msg : "");
    h->done = 1;
    pthread_cond_broadcast(&ctx->cv);
}

/*
 * This worker failed: tell the servers it is still connected to why, in an ABORT, so that
 * they fail the job naming the cause (a dead server, say) instead of only this worker.
 */
void worker_tell_servers(psagg_ctx *ctx)
{
    char msg[sizeof ctx->failed_msg];
    psagg_status status;
    int aborted;
    pthread_mutex_lock(&ctx->mu);
    status = ctx->failed_status;
    aborted = ctx->aborted;
    snprintf(msg, sizeof msg, "%s", ctx->failed_msg);
    pthread_mutex_unlock(&ctx->mu);
    if ((status == PSAGG_ECLOSED && !aborted) || atomic_exchange(&ctx->told_servers, 1))
        return; /* (told once; psagg_close tells nobody) */
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0 &&
            psagg__ctl_send_error(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_ABORT,
                                  status, msg))
            LOG_DEBUG(&ctx->log, "server %d: could not send the ABORT: %s", s, psagg_last_error());
}

/* Fail everything queued or active; later calls see ctx->failed. */
void worker_fail_all(psagg_ctx *ctx, psagg_status status, const char *fmt, ...)
{
    va_list ap;
    int first;
    pthread_mutex_lock(&ctx->mu);
    first = !ctx->failed;
    if (first) {
        ctx->failed = 1;
        ctx->failed_status = status;
        va_start(ap, fmt);
        vsnprintf(ctx->failed_msg, sizeof ctx->failed_msg, fmt, ap);
        va_end(ap);
        if (status != PSAGG_ECLOSED)
            LOG_ERROR(&ctx->log, "%s", ctx->failed_msg);
    }
    pthread_mutex_unlock(&ctx->mu);
    /* the servers hear why before the caller wakes (it may exit at once, without psagg_close,
       and its connections would close before the communication thread's next turn) */
    if (first && atomic_load(&ctx->running) && pthread_equal(pthread_self(), ctx->comm_tid))
        worker_tell_servers(ctx);
    pthread_mutex_lock(&ctx->mu);
    /*
     * Complete every pending handle and forget it: once complete, its owner may release it
     * at any time, so nothing here may point at it afterwards (the comm thread drops its
     * active list as soon as it sees ctx->failed). One not yet submitted is its creator's,
     * who may still be enqueueing work for it: handle_submit completes it.
     */
    for (uint32_t t = 0; ctx->tensors && t < ctx->layout.n_tensors; t++)
        if (ctx->tensors[t].op && ctx->tensors[t].op->submitted) {
            handle_complete_locked(ctx, ctx->tensors[t].op, ctx->failed_status, ctx->failed_msg);
            ctx->tensors[t].op = NULL;
        }
    for (struct psagg_handle *h = ctx->queue; h; h = h->next)
        handle_complete_locked(ctx, h, ctx->failed_status, ctx->failed_msg);
    ctx->queue = NULL;
    pthread_cond_broadcast(&ctx->cv);
    pthread_mutex_unlock(&ctx->mu);
}

int worker_failed(psagg_ctx *ctx)
{
    int failed;
    pthread_mutex_lock(&ctx->mu);
    failed = ctx->failed;
    pthread_mutex_unlock(&ctx->mu);
    return failed;
}

void handle_timing(const struct psagg_handle *h, psagg_timing *out)
{
    out->queued_ns = (uint64_t)(h->t_taken - h->t_submit);
    out->encode_ns = (uint64_t)(h->t_encoded - h->t_taken);
    out->send_ns = (uint64_t)(h->t_sent - h->t_encoded);
    out->wait_ns = (uint64_t)(h->t_updates - h->t_sent);
    out->decode_ns = h->update_ns + (uint64_t)(h->t_done - h->t_updates);
    out->total_ns = (uint64_t)(h->t_done - h->t_submit);
}

void worker_stats(const psagg_ctx *ctx, psagg_stats *out)
{
    /* push_pulls first: the sums read after it hold every operation it counts (comm.c adds
       an operation's times before counting it) */
    out->push_pulls = atomic_load(&ctx->push_pulls);
    out->bytes_sent = atomic_load(&ctx->bytes_sent);
    out->bytes_received = atomic_load(&ctx->bytes_received);
    out->bytes_raw = atomic_load(&ctx->bytes_raw);
    out->time.queued_ns = atomic_load(&ctx->time_ns[0]);
    out->time.encode_ns = atomic_load(&ctx->time_ns[1]);
    out->time.send_ns = atomic_load(&ctx->time_ns[2]);
    out->time.wait_ns = atomic_load(&ctx->time_ns[3]);
    out->time.decode_ns = atomic_load(&ctx->time_ns[4]);
    out->time.total_ns = atomic_load(&ctx->time_ns[5]);
}

/*
 * psagg.h's rule for structs that grow: a caller's struct_size must be a size of the struct
 * this library knows. This version knows one, its own sizeof; one that appends fields accepts
 * the earlier sizes too and reads or fills only what they hold.
 */
psagg_status worker_struct_size(const char *type, size_t got, size_t known)
{
    if (got == known)
        return PSAGG_OK;
    return psagg__fail(PSAGG_EINVAL,
                       "%s.struct_size is %zu, not a size of %s this library knows (%zu): set it "
                       "to sizeof(%s)",
                       type, got, type, known, type);
}

/*
 * The trailer of push mh into out, in a job with a quorum and replicas (wire.h): the bitmap of
 * its chunk's update of the round before as this worker applied it (a chunk with copies, which
 * step that round with it: failover.c keeps it), else zeros. Returns its bytes (0 in another
 * job).
 */
static size_t push_trailer(const psagg_ctx *ctx, const psagg__msg_hdr *mh, uint8_t *out)
{
    size_t nb = ctx->follow_bytes, i;
    if (!nb)
        return 0;
    i = 2 * ((size_t)ctx->layout.tensors[mh->key].first_chunk + mh->chunk) + ((mh->round - 1) & 1);
    if (mh->round && ctx->follow_round[i] == mh->round - 1)
        memcpy(out, ctx->follow_bits + i * nb, nb);
    else
        memset(out, 0, nb);
    return nb;
}

psagg_status push_send(psagg_ctx *ctx, push_buf *pb, uint32_t s)
{
    server_conn *sc = &ctx->servers[s];
    psagg__msg_hdr *mh = (psagg__msg_hdr *)pb->buf;
    size_t len = sizeof *mh + mh->len; /* (the header encode_op wrote has the payload's length) */
    psagg_status st;
    len += push_trailer(ctx, mh, pb->buf + len);
    /* sealed for its server alone, under a number of its own, as it goes: a server view may
       have moved the chunk since the encode (and its epoch is the view's) */
    if (ctx->failover)
        mh->epoch = (uint16_t)ctx->epoch;
    if (ctx->tag_bytes)
        psagg__node_seal(&ctx->node, &sc->push_key, ++sc->push_seq, pb->buf, len);
    pb->to = s;
    st = psagg__fabric_try_send(ctx->fab, sc->addr, pb->buf, len + ctx->tag_bytes, pb->desc,
                                push_ctx(pb));
    if (st)
        return st;
    pb->send_pending = 1;
    sc->inflight++;
    atomic_fetch_add(&ctx->bytes_sent, len);
    return PSAGG_OK;
}
