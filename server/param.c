/*
 * param.c - parameter chunks ([server] optimizer): the optimizer's rounds (param_chunk_ops,
 * server.h's chunk_ops) and their state's checkpoints (ckpt_file.c writes and reads the file).
 *
 * A tensor declared as a parameter (runtime/wire.h, PSAGG_DECL_PARAM) keeps, per chunk, fp32
 * master weights w, the weights every worker holds (view) and the optimizer's state, in the
 * chunk's aggregation thread's arena. Its rounds (the push trailer's kind):
 *   INIT  worker 0's weights become w and view (unless a checkpoint was restored, whose
 *         state wins); every worker gets WEIGHTS of view and the chunk's round.
 *   GRAD  the pushes are summed as any tensor's; then one optimizer step (kernels/optim.h)
 *         with the round's lr and weight decay, and the update is the delta w - view in the
 *         tensor's codec, which the server adds to view exactly as every worker adds it to
 *         its weights (psagg__decode_into, PSAGG_DECODE_ADD): what the codec dropped stays in
 *         w - view and goes out in later rounds (error feedback on the weights). Every
 *         sync_interval steps the update is w itself (WEIGHTS), and view = w.
 *   PULL  WEIGHTS of w; with PSAGG_PARAM_SYNC, view = w.
 *
 * Checkpoints: optim_checkpoint writes the state of every parameter chunk (when a worker asks:
 * checkpoint.c), optim_init reads one back with resume (the file's format: ckpt_file.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "arena.h"
#include "server.h"

/* The parameter store (srv->params): the optimizer's settings, and the checkpoint a resumed
   job starts from until the aggregation threads have loaded it (optim_loaded). */
struct param_store {
    psagg__optim optim;
    struct ckpt_file *restore;
};

psagg_status optim_init(server *srv)
{
    const psagg__config *cfg = &srv->cfg;

    if (!(srv->params = calloc(1, sizeof *srv->params)))
        return psagg__fail(PSAGG_ENOMEM, "no memory for the parameter store");
    srv->params->optim = (psagg__optim){.kind = (psagg__optim_kind)cfg->optimizer,
                                        .momentum = cfg->momentum,
                                        .dampening = cfg->dampening,
                                        .nesterov = cfg->nesterov,
                                        .beta1 = cfg->beta1,
                                        .beta2 = cfg->beta2,
                                        .eps = cfg->eps};
    return cfg->resume ? ckpt_open(srv, &srv->params->restore) : PSAGG_OK;
}

void optim_fini(server *srv)
{
    if (!srv->params)
        return;
    ckpt_close(srv->params->restore);
    free(srv->params);
    srv->params = NULL;
}

static int chunk_arrays(const server *srv);

void optim_loaded(server *srv)
{
    uint32_t n = 0;
    uint64_t elems = 0, step = 0;
    for (uint32_t i = 0; i < srv->n_owned; i++)
        if (srv->chunks[i].param) {
            n++;
            elems += srv->chunks[i].info->count;
            step = srv->chunks[i].param->step;
        }
    if (n)
        LOG_INFO(
            &srv->log,
            "optimizer %s on %u parameter chunks here (%llu elements, %d bytes of state each)%s"
            "%s",
            psagg__optim_name(srv->params->optim.kind), n, (unsigned long long)elems,
            4 * chunk_arrays(srv), srv->params->restore ? ", restored from " : "",
            srv->params->restore ? ckpt_file_path(srv->params->restore) : "");
    if (srv->params->restore && n)
        LOG_INFO(&srv->log, "resume: the parameters go on from optimizer step %llu",
                 (unsigned long long)step);
    ckpt_close(srv->params->restore);
    srv->params->restore = NULL;
}

void optim_welcome(const server *srv, psagg__ctl_optim *out)
{
    *out = (psagg__ctl_optim){.kind = (uint32_t)srv->params->optim.kind,
                              .nesterov = (uint32_t)srv->params->optim.nesterov,
                              .momentum = srv->params->optim.momentum,
                              .dampening = srv->params->optim.dampening,
                              .beta1 = srv->params->optim.beta1,
                              .beta2 = srv->params->optim.beta2,
                              .eps = srv->params->optim.eps,
                              .sync_interval = (uint32_t)srv->cfg.sync_interval};
}

/* Binary32 arrays a parameter chunk keeps: w, view and the optimizer's state. */
static int chunk_arrays(const server *srv)
{
    return 2 + psagg__optim_state_arrays(&srv->params->optim);
}

/* param_chunk_ops' state: the param_state and its arrays. */
static uint64_t param_state_bytes(const server *srv, uint64_t count)
{
    return sizeof(param_state) + (uint64_t)chunk_arrays(srv) * 4 * count;
}

/* An update is the delta in the tensor's codec or the fp32 weights, whichever is larger. */
static uint64_t param_out_bytes(const psagg_codec *codec, uint64_t count, uint64_t enc)
{
    (void)codec;
    return enc > 4 * count ? enc : 4 * count;
}

psagg_status optim_check_job(server *srv)
{
    const psagg__layout *l = &srv->layout;
    for (uint32_t t = 0; t < l->n_tensors; t++)
        if (l->tensors[t].param && srv->params->optim.kind == PSAGG_OPTIM_NONE)
            return psagg__fail(PSAGG_EINVAL,
                               "tensor %u '%s' is declared a parameter, but this server runs "
                               "[server] optimizer = none",
                               t, l->tensors[t].name);
    return srv->params->restore
               ? ckpt_match(srv, srv->params->restore, srv->params->optim.kind, chunk_arrays(srv))
               : PSAGG_OK;
}

/*
 * param_chunk_ops' alloc, in c's aggregation thread: its state (and, with resume, what the
 * checkpoint holds of it). acc is its sum's (cpu_sum_ops: host_sum); a parameter has no server
 * residual, its view is its error feedback.
 */
static psagg_status param_alloc(server *srv, chunk_state *c)
{
    param_state *ps;
    size_t bytes = c->info->count * sizeof(float);
    int state = psagg__optim_state_arrays(&srv->params->optim);

    if (!(ps = c->param = calloc(1, sizeof *c->param)))
        return psagg__fail(PSAGG_ENOMEM, "state of tensor %u chunk %u", c->info->key,
                           c->info->index);
    ps->w = arena_alloc(bytes);
    ps->view = arena_alloc(bytes);
    ps->m1 = state >= 1 ? arena_alloc(bytes) : NULL;
    ps->m2 = state >= 2 ? arena_alloc(bytes) : NULL;
    if (!ps->w || !ps->view || (state >= 1 && !ps->m1) || (state >= 2 && !ps->m2))
        return psagg__fail(PSAGG_ENOMEM, "optimizer state of tensor %u chunk %u", c->info->key,
                           c->info->index);
    if (!(ps->weight = calloc((size_t)srv->n_workers, sizeof *ps->weight)))
        return psagg__fail(PSAGG_ENOMEM, "state of tensor %u chunk %u", c->info->key,
                           c->info->index);
    ps->awaiting_init = 1;
    ps->every_op_counts = srv->cfg.server_replicas > 0;
    {
        uint32_t arrays = 0, round = 0;
        const float *a = ckpt_state(srv->params->restore, (uint32_t)(c - srv->chunks), &arrays,
                                    &ps->step, &round);
        float *dst[4] = {ps->w, ps->view, ps->m1, ps->m2};
        for (uint32_t i = 0; a && i < arrays; i++)
            memcpy(dst[i], a + i * c->info->count, bytes);
        if (a) {
            /* with server replicas every operation counts a round, and the workers' count of
               their pulls starts again: the round restarts at the step, on every holder alike
               (psagg_get_tensor_round says the step) */
            c->round = ps->every_op_counts ? (uint32_t)ps->step : round;
            ps->restored = 1;
        }
    }
    return PSAGG_OK;
}

static void param_free(chunk_state *c)
{
    if (!c->param)
        return;
    arena_free(c->param->w);
    arena_free(c->param->view);
    arena_free(c->param->m1);
    arena_free(c->param->m2);
    free(c->param->weight);
    free(c->param);
    c->param = NULL;
}

static const char *kind_name(uint32_t flags)
{
    static const char *const names[] = {"GRAD", "INIT", "PULL", "?"};
    return names[flags & PSAGG_PARAM_KIND_MASK];
}

/*
 * param_chunk_ops' admit: a push's kind (its trailer) that the chunk's state allows (INIT once,
 * first), else its worker is closed (1). An INIT carries round 0: it counts for the chunk's
 * round (which the worker learns from the answer).
 */
static int param_admit(server *srv, chunk_state *c, const recv_buf *rb, uint32_t *round)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    uint32_t kind = rb->mc.prm.flags & PSAGG_PARAM_KIND_MASK;
    const char *name = srv->layout.tensors[c->info->key].name;

    if (kind == PSAGG_PARAM_INIT && !c->param->awaiting_init) {
        server_close_worker(srv, h->sender,
                            "INIT of parameter tensor '%s' chunk %u, which was initialized "
                            "already",
                            name, c->info->index);
        return 1;
    }
    if (kind != PSAGG_PARAM_INIT && c->param->awaiting_init) {
        server_close_worker(srv, h->sender,
                            "%s of parameter tensor '%s' chunk %u before its INIT (call "
                            "psagg_param_init first)",
                            kind_name(kind), name, c->info->index);
        return 1;
    }
    if (kind == PSAGG_PARAM_INIT)
        *round = c->round;
    return 0;
}

/* param_chunk_ops' open: the round's trailer is its first push's. */
static void param_open(chunk_state *c, const psagg__msg_codec *mc)
{
    c->param->prm = mc->prm;
}

/*
 * param_chunk_ops' agree: a push whose trailer (kind, lr, weight decay, flags) differs from
 * the round's first push's (worker c->codec_by's) fails the job.
 */
static int param_agree(server *srv, chunk_state *c, int w, const psagg__msg_codec *mc)
{
    const param_state *ps = c->param;
    const psagg__msg_param *prm = &mc->prm;
    /* everything but the weight (each worker's own) */
    if (ps->prm.lr == prm->lr && ps->prm.weight_decay == prm->weight_decay &&
        ps->prm.flags == prm->flags && ps->prm.tag == prm->tag)
        return 0;
    /* only what differs, so that the reason survives being relayed (and clipped) by peers */
    char d[240];
    size_t n = 0;
    d[0] = '\0';
    if (ps->prm.flags != prm->flags)
        n += (size_t)snprintf(d + n, sizeof d - n, " kind %s/%s (flags 0x%x/0x%x);",
                              kind_name(ps->prm.flags), kind_name(prm->flags), ps->prm.flags,
                              prm->flags);
    if (n < sizeof d && ps->prm.tag != prm->tag)
        n += (size_t)snprintf(d + n, sizeof d - n, " fragment %u step %u / fragment %u step %u;",
                              ps->prm.tag >> 24, ps->prm.tag & 0xFFFFFFu, prm->tag >> 24,
                              prm->tag & 0xFFFFFFu);
    if (n < sizeof d && ps->prm.lr != prm->lr)
        n += (size_t)snprintf(d + n, sizeof d - n, " lr %g/%g;", (double)ps->prm.lr,
                              (double)prm->lr);
    if (n < sizeof d && ps->prm.weight_decay != prm->weight_decay)
        snprintf(d + n, sizeof d - n, " weight decay %g/%g;", (double)ps->prm.weight_decay,
                 (double)prm->weight_decay);
    n = strlen(d);
    if (n && d[n - 1] == ';')
        d[n - 1] = '\0';
    server_fail_job(srv, PSAGG_EPROTO,
                    "the workers disagree on parameter tensor '%s' chunk %u round %u, worker "
                    "%u/worker %d:%s",
                    srv->layout.tensors[c->info->key].name, c->info->index, c->round, c->codec_by,
                    w, d);
    return -1;
}

/*
 * param_chunk_ops' settle: a GRAD round as its sum says; INIT and PULL once every member is in.
 * An INIT without worker 0's weights (it left before pushing them, and no checkpoint gave
 * them) cannot give the workers any: the job fails.
 */
static int param_settle(server *srv, chunk_state *c)
{
    if ((c->param->prm.flags & PSAGG_PARAM_KIND_MASK) == PSAGG_PARAM_GRAD)
        return c->sum->settle(srv, c);
    if (!server_members_in(srv, c))
        return 0;
    if ((c->param->prm.flags & PSAGG_PARAM_KIND_MASK) == PSAGG_PARAM_INIT && !c->arrived[0] &&
        !c->param->restored) {
        server_fail_job(srv, PSAGG_EPEER,
                        "parameter tensor '%s' chunk %u: worker 0 left before pushing its "
                        "initial weights, which only it sends",
                        srv->layout.tensors[c->info->key].name, c->info->index);
        c->broken = 1;
        return 0;
    }
    return CHUNK_COMPLETE;
}

/*
 * param_chunk_ops' collect: a GRAD push is summed by the chunk's sum (into acc); INIT and PULL
 * have no sum: all in, in any order, then the reply. Of an INIT, worker 0's body is the weights
 * (unless a checkpoint's were restored).
 */
static int param_collect(server *srv, chunk_state *c, int w, recv_buf *rb)
{
    uint32_t kind = rb->mc.prm.flags & PSAGG_PARAM_KIND_MASK;
    if (kind == PSAGG_PARAM_GRAD) {
        c->param->weight[w] = rb->mc.prm.weight;
        return c->sum->collect(srv, c, w, rb);
    }
    if (kind == PSAGG_PARAM_INIT && w == 0 && !c->param->restored)
        memcpy(c->param->w, rb->rx.buf + sizeof(psagg__msg_hdr), c->info->count * sizeof(float));
    c->arrived[w] = 1;
    c->n_arrived++;
    return param_settle(srv, c);
}

/* The payload of a WEIGHTS message: src, exactly. */
static long weights(server *srv, chunk_state *c, uint8_t *out, const float *src)
{
    static const psagg_codec fp32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
    memcpy(out + sizeof(psagg__msg_hdr), src, c->info->count * sizeof(float));
    psagg__msg_init((psagg__msg_hdr *)out, PSAGG_MSG_WEIGHTS, (uint32_t)srv->rank, c->round,
                    c->info, &fp32, 0);
    return (long)(c->info->count * sizeof(float));
}

/*
 * param_chunk_ops' finish: all pushes of c's round are in (GRAD: summed into acc): the step
 * and its update into out (header included), a delta requantized with `key` (the round's
 * server RNG stream); returns the payload bytes, or -1 (the job failed).
 */
static long param_finish(server *srv, chunk_state *c, uint8_t *out, psagg__rng_key key)
{
    param_state *ps = c->param;
    const psagg__msg_param *prm = &ps->prm;
    size_t n = c->info->count, bad = 0;
    const char *name = srv->layout.tensors[c->info->key].name;
    float scale = 1.0f;
    psagg_status st;
    int64_t t0;

    switch (prm->flags & PSAGG_PARAM_KIND_MASK) {
    case PSAGG_PARAM_INIT:
        if (!ps->restored)
            memcpy(ps->view, ps->w, n * sizeof(float));
        ps->awaiting_init = 0;
        return weights(srv, c, out, ps->view);
    case PSAGG_PARAM_PULL:
        if (prm->flags & PSAGG_PARAM_SYNC)
            memcpy(ps->view, ps->w, n * sizeof(float));
        return weights(srv, c, out, ps->w);
    default:
        break;
    }
    t0 = psagg__now_ns();
    if (prm->flags & PSAGG_PARAM_AVERAGE) { /* the sum over the sum of the weights, in order */
        float weights = 0.0f;
        for (int k = 0; k < srv->n_workers; k++)
            if (c->arrived[k]) /* (an elastic job's round may lack a leaver's push) */
                weights += ps->weight[k];
        scale = 1.0f / weights; /* 1 each: 1 / workers, as before */
    }
    st = psagg__optim_step(&srv->params->optim, prm->lr, prm->weight_decay, ps->step + 1, scale,
                           c->acc, ps->w, ps->m1, ps->m2, n);
    if (st)
        goto fail;
    ps->step++;
    if (srv->cfg.sync_interval && ps->step % srv->cfg.sync_interval == 0) {
        memcpy(ps->view, ps->w, n * sizeof(float));
        metrics_optim_step(srv, psagg__now_ns() - t0, 1);
        return weights(srv, c, out, ps->w);
    }
    for (size_t k = 0; k < n; k++) /* the delta, in the accumulator (free after the step) */
        c->acc[k] = ps->w[k] - ps->view[k];
    st = psagg__encode(&c->codec, c->acc, NULL, n, key, out + sizeof(psagg__msg_hdr), c->enc, &bad);
    if (!st)
        st = psagg__decode_into(&c->codec, out + sizeof(psagg__msg_hdr), c->enc, n, ps->view,
                                PSAGG_DECODE_ADD, 1.0f);
    if (st)
        goto fail;
    psagg__msg_init((psagg__msg_hdr *)out, PSAGG_MSG_UPDATE, (uint32_t)srv->rank, c->round, c->info,
                    &c->codec, 0);
    metrics_optim_step(srv, psagg__now_ns() - t0, 0);
    return (long)c->enc;
fail:
    server_fail_job(srv, st,
                    "parameter tensor '%s' chunk %u round %u (step %llu): %s (the gradient sum or "
                    "the weights went out of range: lower the learning rate?)",
                    name, c->info->index, c->round, (unsigned long long)ps->step + 1,
                    psagg_last_error());
    return -1;
}

/* param_chunk_ops' partial: a GRAD round (INIT and PULL wait for every member). */
static int param_partial(const chunk_state *c)
{
    return (c->param->prm.flags & PSAGG_PARAM_KIND_MASK) == PSAGG_PARAM_GRAD;
}

/* param_chunk_ops' advances: INIT and PULL do not count a round, unless the job has server
   replicas (then every operation is a round of its own, so that a copy and a new owner tell
   them apart by round alone: docs/design.md, "Stateful chunks are copied"). */
static int param_advances(const chunk_state *c)
{
    return c->param->every_op_counts || param_partial(c);
}

/* param_chunk_ops' state: w, view and the optimizer's arrays, its step, whether INIT came. */
static uint32_t param_state_get(const server *srv, chunk_state *c, float **arrays, uint64_t *step,
                                uint32_t *flags)
{
    param_state *ps = c->param;
    float *a[4] = {ps->w, ps->view, ps->m1, ps->m2};
    int n = chunk_arrays(srv);
    memcpy(arrays, a, (size_t)n * sizeof *a);
    *step = ps->step;
    *flags = (ps->awaiting_init ? PSAGG_STATE_AWAITING_INIT : 0) |
             (ps->restored ? PSAGG_STATE_RESTORED : 0);
    return (uint32_t)n;
}

static void param_state_set(chunk_state *c, uint64_t step, uint32_t flags)
{
    c->param->step = step;
    c->param->awaiting_init = (flags & PSAGG_STATE_AWAITING_INIT) != 0;
    c->param->restored = (flags & PSAGG_STATE_RESTORED) != 0;
}

const chunk_ops param_chunk_ops = {
    .name = "parameter",
    .host_sum = 1, /* the step reads the fp32 sum in acc */
    .sum = NULL,
    .out_bytes = param_out_bytes,
    .state_bytes = param_state_bytes,
    .alloc = param_alloc,
    .free = param_free,
    .admit = param_admit,
    .open = param_open,
    .agree = param_agree,
    .collect = param_collect,
    .settle = param_settle,
    .finish = param_finish,
    .advances = param_advances,
    .partial = param_partial,
    .state = param_state_get,
    .set_state = param_state_set,
};

psagg_status optim_checkpoint(server *srv, const uint8_t *owned, uint64_t seq, char *path,
                              size_t len)
{
    if (!srv->cfg.checkpoint_dir[0])
        return psagg__fail(PSAGG_ECONFIG, "server %d has no [server] checkpoint_dir", srv->rank);
    if (srv->params->optim.kind == PSAGG_OPTIM_NONE)
        return psagg__fail(PSAGG_EINVAL, "server %d runs no optimizer: nothing to checkpoint",
                           srv->rank);
    /* every chunk's last round is finished, and the caller's agg_barrier made what its
       thread wrote visible here */
    return ckpt_write(srv, chunk_arrays(srv), owned, seq, path, len);
}
