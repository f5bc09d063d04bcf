/*
 * api.c - libpsagg's public functions (psagg.h): start-up, declaration, push_pull, handles.
 * What is said to the servers at start-up is handshake.c's; psagg_push_pull_cuda lives with
 * the rest of the device side, in cuda.c.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/optim.h"
#include "runtime/adaptive.h"
#include "runtime/channel.h"
#include "worker.h"

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    char *end;
    long x;
    if (!v || !*v)
        return fallback;
    x = strtol(v, &end, 10);
    return (*end || x < 0 || x > 1 << 30) ? -2 : (int)x;
}

psagg_status psagg_init(const char *ini_path, int rank, int world_size, psagg_ctx **out)
{
    psagg_ctx *ctx;
    char local[PSAGG_HOST_MAX] = "";
    int64_t deadline;
    psagg_status st;

    psagg__clear_error();
    if (!out)
        return psagg__fail(PSAGG_EINVAL, "psagg_init: out is NULL");
    *out = NULL;
    if (!ini_path)
        ini_path = getenv("PSAGG_CONFIG");
    if (!ini_path)
        return psagg__fail(PSAGG_EINVAL, "psagg_init: no config file (argument or PSAGG_CONFIG)");
    if (rank < 0)
        rank = env_int("PSAGG_RANK", -1);
    if (world_size < 0)
        world_size = env_int("PSAGG_WORLD_SIZE", -1);
    if (rank < 0 || world_size < 1)
        return psagg__fail(PSAGG_EINVAL,
                           "psagg_init: rank %d of world size %d (set the arguments or PSAGG_RANK "
                           "and PSAGG_WORLD_SIZE)",
                           rank, world_size);
    ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return psagg__fail(PSAGG_ENOMEM, "psagg_init");
    ctx->mac_trace_fd = -1; /* (psagg__node_open sets it; the error paths close it) */
    pthread_mutex_init(&ctx->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&ctx->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if ((st = psagg__config_load(ini_path, &ctx->cfg)))
        goto err_config;
    ctx->keep_pushes = ctx->cfg.server_replicas > 0; /* (worker.h, chunk_buf) */
    if (world_size != ctx->cfg.n_workers) {
        st = psagg__fail(PSAGG_ECONFIG,
                         "%s: [cluster] workers = %d, but this worker was started "
                         "with world size %d",
                         ini_path, ctx->cfg.n_workers, world_size);
        goto err_config;
    }
    {
        /* an elastic job's ranks go up to max_workers: those from `workers` on join it later */
        int ranks = ctx->cfg.elastic ? ctx->cfg.max_workers : world_size;
        if (rank >= ranks) {
            st = ctx->cfg.elastic ? psagg__fail(PSAGG_EINVAL,
                                                "psagg_init: rank %d, but %s: [cluster] "
                                                "max_workers = %d: a job's ranks are 0..%d",
                                                rank, ini_path, ranks, ranks - 1)
                                  : psagg__fail(PSAGG_EINVAL,
                                                "psagg_init: rank %d of world size %d (set the "
                                                "arguments or PSAGG_RANK and PSAGG_WORLD_SIZE)",
                                                rank, world_size);
            goto err_config;
        }
        ctx->rank = rank;
        ctx->world = ranks;
    }
    /* the logger, the job key, this worker's nonce */
    if ((st = psagg__node_open(&ctx->cfg, "worker", rank, &ctx->node)))
        goto err_config;
    if ((st = psagg__timeline_open(ctx->cfg.timeline, "worker", rank, &ctx->timeline)))
        goto err_config;
    ctx->servers = calloc((size_t)ctx->cfg.n_servers, sizeof *ctx->servers);
    ctx->live = calloc((size_t)ctx->world, 1);
    ctx->n_live = world_size; /* the ranks that start the job (elastic: others join later) */
    if (ctx->live)
        memset(ctx->live, 1, (size_t)world_size);
    if (!ctx->servers || !ctx->live) {
        st = psagg__fail(PSAGG_ENOMEM, "psagg_init");
        goto err_config;
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        ctx->servers[s].fd = -1;
        ctx->servers[s].addr = PSAGG_PEER_UNKNOWN; /* (until its WELCOME: hello.c) */
    }

    /* Control connections first: the one to server 0 tells which local address to use. */
    deadline = psagg__now_ms() + ctx->cfg.connect_timeout_ms;
    if ((st = handshake_connect(ctx, deadline)))
        goto err_connect;
    if (ctx->cfg.worker_fabric_node[0])
        snprintf(local, sizeof local, "%s", ctx->cfg.worker_fabric_node);
    else if ((st = psagg__tcp_local_addr(ctx->servers[handshake_first(ctx)].fd, local,
                                         sizeof local)))
        goto err_connect;
    if ((st = psagg__node_open_fabric(&ctx->node, &ctx->cfg, local)))
        goto err_connect;
    if ((st = handshake_hello(ctx, deadline)))
        goto err_hello;
    {
        int n = 0;
        for (int s = 0; s < ctx->cfg.n_servers; s++)
            n += ctx->servers[s].fd >= 0;
        LOG_INFO(&ctx->log,
                 "psagg %s (protocol version %d): worker %d of %d connected to %d of %d servers",
                 psagg_version(), PSAGG_PROTO_VERSION, rank, ctx->world, n, ctx->cfg.n_servers);
    }
    *out = ctx;
    return PSAGG_OK;

err_hello:
err_connect:
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0)
            close(ctx->servers[s].fd);
    free(ctx->servers);
    free(ctx->live);
err_config:
    psagg__node_close(&ctx->node); /* (the fabric and the mac_trace list, if they were opened) */
    psagg__timeline_close(ctx->timeline, &ctx->log);
    pthread_cond_destroy(&ctx->cv);
    pthread_mutex_destroy(&ctx->mu);
    free(ctx);
    return st;
}

/* Allocate and register push buffers, residuals and posted receive buffers. */
static psagg_status setup_buffers(psagg_ctx *ctx, const psagg_tensor_desc *tensors)
{
    const psagg__layout *l = &ctx->layout;
    size_t body = l->max_param_bytes > l->max_enc_bytes ? l->max_param_bytes : l->max_enc_bytes;
    size_t rsize = sizeof(psagg__msg_hdr) +
                   (l->max_update_bytes > body ? l->max_update_bytes : body) + ctx->bitmap_bytes +
                   ctx->tag_bytes;
    psagg_status st;

    if (rsize > ctx->max_msg)
        return psagg__fail(PSAGG_EINVAL, "chunks of %zu bytes exceed the fabric limit of %zu",
                           rsize, ctx->max_msg);
    ctx->tensors = calloc(l->n_tensors, sizeof *ctx->tensors);
    ctx->chunks = calloc(l->n_chunks, sizeof *ctx->chunks);
    ctx->owner = calloc(l->n_chunks ? l->n_chunks : 1, sizeof *ctx->owner);
    if (ctx->quorum)
        ctx->early = calloc(l->n_chunks, sizeof *ctx->early);
    if (!ctx->tensors || !ctx->chunks || !ctx->owner || (ctx->quorum && !ctx->early))
        return psagg__fail(PSAGG_ENOMEM, "tensor tables");
    for (uint32_t c = 0; c < l->n_chunks; c++)
        ctx->owner[c] = l->chunks[c].owner;
    for (uint32_t t = 0; t < ctx->n_user; t++) { /* internal tensors keep no residual */
        const psagg__tensor_info *ti = &l->tensors[t];
        ctx->tensors[t].lr = ctx->cfg.lr;
        ctx->tensors[t].weight_decay = ctx->cfg.weight_decay;
        ctx->tensors[t].weight = 1.0f;
        ctx->tensors[t].ef_beta = tensors[t].error_feedback_beta > 0
                                      ? tensors[t].error_feedback_beta
                                      : ctx->cfg.error_feedback_beta;
        int ef =
            tensors[t].error_feedback < 0 ? ctx->cfg.error_feedback : tensors[t].error_feedback;
        int thc = ti->codec.id == PSAGG_CODEC_THC; /* (its first push keeps all: always one) */
        if (thc || (ef && ti->codec.id != PSAGG_CODEC_FP32)) {
            size_t n = tensor_residual_elems(l, ti);
            ctx->tensors[t].residual = psagg__alloc(n * sizeof(float), 1);
            if (thc) {
                ctx->tensors[t].thc_scale =
                    psagg__alloc((n / ti->codec.bucket + 1) * sizeof(float), 1);
                ctx->tensors[t].thc_peak =
                    psagg__alloc((n / ti->codec.bucket + 1) * sizeof(float), 1);
            }
            if (!ctx->tensors[t].residual ||
                (thc && (!ctx->tensors[t].thc_scale || !ctx->tensors[t].thc_peak)))
                return psagg__fail(PSAGG_ENOMEM, "residual of tensor '%s'", ti->name);
        }
    }
    for (uint32_t c = 0; c < l->n_chunks; c++) {
        const psagg__chunk_info *ci = &l->chunks[c];
        size_t body = l->tensors[ci->key].param && 4 * ci->count > ci->cap_bytes
                          ? 4 * ci->count /* worker 0's INIT */
                          : ci->cap_bytes;
        size_t sz = sizeof(psagg__msg_hdr) + body + sizeof(psagg__msg_param) + ctx->follow_bytes +
                    ctx->tag_bytes;
        for (int b = 0; b < 1 + ctx->keep_pushes; b++) {
            push_buf *pb = &ctx->chunks[c].p[b];
            if (!(pb->buf = psagg__alloc(sz, 1)))
                return psagg__fail(PSAGG_ENOMEM, "push buffers");
            if ((st = psagg__fabric_reg(ctx->fab, pb->buf, sz, &pb->desc)))
                return st;
        }
    }
    /* a window of updates per server, and a few more */
    return psagg__rxpool_create(
        &ctx->rx, ctx->fab,
        psagg__rxpool_count(ctx->cfg.n_servers * ctx->cfg.max_inflight + 8, rsize, 256ull << 20),
        rsize, sizeof(psagg__rxbuf));
}

/* psagg_tensor_desc's struct_size before error_feedback_beta (psagg.h) */
#define TENSOR_DESC_V1 offsetof(psagg_tensor_desc, error_feedback_beta)

psagg_status psagg_declare(psagg_ctx *ctx, const psagg_tensor_desc *given, size_t n,
                           uint32_t *keys_out)
{
    psagg_tensor_desc *tensors = NULL; /* the caller's, each at this library's size */
    psagg__ctl_declare *d;
    psagg__ctl_tensor *wire;
    size_t bytes;
    psagg_status st = PSAGG_OK;
    uint32_t n_adaptive = 0, n_wire = (uint32_t)n;
    size_t n_topk_sums = 0, first_topk = 0; /* (summed in topk without a server residual) */

    psagg__clear_error();
    if (!ctx || !given || n == 0 || n > PSAGG_MAX_TENSORS)
        return psagg__fail(PSAGG_EINVAL, "psagg_declare: %zu tensors", n);
    if (ctx->declared)
        return psagg__fail(PSAGG_EINVAL, "psagg_declare: tensors were already declared");
    {
        /* given[0]'s size is the array's stride: this psagg.h's, or the one before
           error_feedback_beta (whose fields are read, the rest zero: the config's) */
        size_t stride = given[0].struct_size;
        if (stride != TENSOR_DESC_V1 &&
            (st = worker_struct_size("psagg_tensor_desc", stride, sizeof *tensors)))
            return psagg__fail_context(st, "psagg_declare: tensor 0: ");
        if (!(tensors = calloc(n, sizeof *tensors)))
            return psagg__fail(PSAGG_ENOMEM, "psagg_declare");
        for (size_t t = 0; t < n; t++) {
            memcpy(&tensors[t], (const char *)given + t * stride, stride);
            if (tensors[t].struct_size != stride) {
                size_t got = tensors[t].struct_size;
                free(tensors);
                return psagg__fail(PSAGG_EINVAL,
                                   "psagg_declare: tensor %zu: psagg_tensor_desc.struct_size is "
                                   "%zu, tensor 0's %zu: every element of the array says the "
                                   "array's stride",
                                   t, got, stride);
            }
            if (stride == TENSOR_DESC_V1)
                tensors[t].reserved = 0, tensors[t].error_feedback_beta = 0;
        }
    }
    /* room for the adaptive statistics tensor, last (runtime/adaptive.h) */
    bytes = sizeof *d + (n + 1) * sizeof *wire;
    d = calloc(1, bytes);
    if (!d) {
        free(tensors);
        return psagg__fail(PSAGG_ENOMEM, "psagg_declare");
    }
    wire = (psagg__ctl_tensor *)(d + 1);
    d->chunk_elems = psagg__chunk_elems(&ctx->cfg);
    for (size_t t = 0; t < n; t++) {
        psagg_codec c = tensors[t].codec;
        if (c.id == PSAGG_CODEC_DEFAULT) {
            c = ctx->cfg.codec;
            if (tensors[t].count < ctx->cfg.min_compress_elems)
                c = (psagg_codec){.id = PSAGG_CODEC_FP32};
        }
        if ((st = psagg__codec_check(&c)) ||
            (st = psagg__tensor_to_wire(tensors[t].name, tensors[t].count, &c, &wire[t]))) {
            psagg__fail_context(st, "psagg_declare: tensor %zu: ", t);
            goto out;
        }
        /* 1-bit maxmin's error is as large as its bucket's range, so a residual that carries it
           (times beta) makes the next range up to 1 + 2 beta times as large: it grows every
           round unless beta < 0.5. The servers' residual (beta 1) on the sum does the same to
           the updates (a parameter's update is no requantized sum) */
        if (c.id == PSAGG_CODEC_MAXMIN && c.bits == 1 && ctx->server_residual &&
            !(tensors[t].flags & PSAGG_TENSOR_PARAMETER)) {
            st = psagg__fail(PSAGG_EINVAL,
                             "psagg_declare: tensor %zu '%s': maxmin1 with the servers' error "
                             "feedback ([server] error_feedback = on) diverges (the sum's "
                             "rounding error is as large as a bucket's range, which the servers' "
                             "residual then doubles every round): use maxmin2 or more bits for "
                             "it, or turn [server] error_feedback off",
                             t, tensors[t].name);
            goto out;
        }
        if (c.id == PSAGG_CODEC_MAXMIN && c.bits == 1 &&
            (tensors[t].error_feedback < 0 ? ctx->cfg.error_feedback : tensors[t].error_feedback) &&
            (tensors[t].error_feedback_beta > 0 ? tensors[t].error_feedback_beta
                                                : ctx->cfg.error_feedback_beta) >= 0.5f) {
            st = psagg__fail(PSAGG_EINVAL,
                             "psagg_declare: tensor %zu '%s': maxmin1 with error feedback "
                             "diverges (its rounding error is as large as a bucket's range, "
                             "which the residual then doubles every round): use maxmin2 or "
                             "more bits, turn error feedback off for it ([codec] "
                             "error_feedback = off), or decay it (error_feedback_beta < 0.5)",
                             t, tensors[t].name);
            goto out;
        }
        if (tensors[t].flags & ~(PSAGG_TENSOR_PARAMETER | PSAGG_TENSOR_RARE)) {
            st = psagg__fail(PSAGG_EINVAL, "psagg_declare: tensor %zu '%s': unknown flags 0x%x", t,
                             tensors[t].name, tensors[t].flags);
            goto out;
        }
        if (tensors[t].reserved) {
            st = psagg__fail(PSAGG_EINVAL, "psagg_declare: tensor %zu '%s': reserved is %u, not 0",
                             t, tensors[t].name, tensors[t].reserved);
            goto out;
        }
        if (!(tensors[t].error_feedback_beta == 0 ||
              (tensors[t].error_feedback_beta >= 1e-6f && tensors[t].error_feedback_beta <= 1))) {
            st = psagg__fail(PSAGG_EINVAL,
                             "psagg_declare: tensor %zu '%s': error_feedback_beta %g is not 0 (the "
                             "config's) or in 1e-06..1",
                             t, tensors[t].name, (double)tensors[t].error_feedback_beta);
            goto out;
        }
        if (tensors[t].flags & PSAGG_TENSOR_PARAMETER) {
            if (ctx->optim.kind == PSAGG_OPTIM_NONE) {
                st = psagg__fail(PSAGG_EINVAL,
                                 "psagg_declare: tensor %zu '%s' is a parameter, but the servers "
                                 "run no optimizer ([server] optimizer = none)",
                                 t, tensors[t].name);
                goto out;
            }
            wire[t].flags = PSAGG_DECL_PARAM;
        }
        if (tensors[t].flags & PSAGG_TENSOR_RARE)
            wire[t].flags |= PSAGG_DECL_RARE;
        if (keys_out)
            keys_out[t] = (uint32_t)t;
        n_adaptive += psagg__adapt_declarable(&c);
        if (c.id == PSAGG_CODEC_TOPK && !(tensors[t].flags & PSAGG_TENSOR_PARAMETER) &&
            !ctx->server_residual && !n_topk_sums++)
            first_topk = t;
    }
    if (n_topk_sums && ctx->rank == 0) /* (a parameter's sparse delta keeps its own residual) */
        LOG_WARN(&ctx->log,
                 "%zu tensors ('%s' first) are summed in topk, but the servers keep no residual "
                 "([server] error_feedback = off): what their top-k of each sum leaves out is "
                 "lost, so the workers' average is biased; set [server] error_feedback = on",
                 n_topk_sums, tensors[first_topk].name);
    if (ctx->cfg.adaptive && !n_adaptive)
        LOG_WARN(&ctx->log,
                 "[codec] adaptive is on, but no tensor is compressed with maxmin or thc: "
                 "every codec stays as declared");
    if (ctx->cfg.adaptive && n_adaptive) {
        psagg_codec f = {.id = PSAGG_CODEC_FP32};
        d->adapt_interval = (uint32_t)ctx->cfg.adaptive_interval;
        d->adapt_budget = ctx->cfg.adaptive_budget;
        d->adapt_flags = (ctx->cfg.adaptive_budget_bits ? PSAGG_ADAPT_BUDGET_BITS : 0) |
                         (ctx->cfg.error_feedback ? PSAGG_ADAPT_WORKER_EF : 0);
        if ((st = psagg__tensor_to_wire(PSAGG_ADAPT_STATS_NAME,
                                        (uint64_t)n_adaptive * PSAGG_ADAPT_MAX_BUCKETS, &f,
                                        &wire[n]))) {
            psagg__fail_context(st, "psagg_declare: ");
            goto out;
        }
        n_wire++;
    }
    d->count = n_wire;
    bytes = sizeof *d + n_wire * sizeof *wire;
    ctx->n_user = (uint32_t)n;
    if ((st = psagg__layout_build(wire, n_wire, d->chunk_elems, (uint32_t)ctx->cfg.n_servers,
                                  d->adapt_interval, &ctx->layout))) {
        psagg__fail_context(st, "psagg_declare: ");
        goto out;
    }

    /* Buffers are ready (and receives posted) before any server can send an update. */
    if ((st = setup_buffers(ctx, tensors)))
        goto out;
    if ((st = adapt_setup(ctx))) { /* after the residuals: they decide nearest rounding */
        psagg__fail_context(st, "psagg_declare: ");
        goto out;
    }
    if ((st = failover_setup(ctx, d, bytes)))
        goto out;
    st = handshake_declare(ctx, d, bytes);
    if (st)
        goto out;
    if (handshake_report_lost(ctx)) { /* (servers given up during the start-up) */
        st = ctx->failed_status ? ctx->failed_status : PSAGG_EPEER;
        psagg__fail(st, "%s", ctx->failed_msg);
        goto out;
    }
    if ((st = comm_start(ctx)))
        goto out;
    ctx->declared = 1;
    LOG_INFO(&ctx->log, "declared %zu tensors in %u chunks over %d servers", n,
             ctx->layout.n_chunks, ctx->cfg.n_servers);
out:
    free(d);
    free(tensors);
    if (st) {
        pthread_mutex_lock(&ctx->mu);
        ctx->failed = 1;
        ctx->failed_status = st;
        snprintf(ctx->failed_msg, sizeof ctx->failed_msg, "%s", psagg_last_error());
        pthread_mutex_unlock(&ctx->mu);
    }
    return st;
}

/* Queue a parameter's INIT or PULL. */
static psagg_status param_op(psagg_ctx *ctx, uint32_t key, float *out, uint32_t kind,
                             uint32_t flags, psagg_handle **handle)
{
    struct psagg_handle *h;
    psagg_status st;
    if (!handle)
        return psagg__fail(PSAGG_EINVAL, "handle is NULL");
    *handle = NULL;
    if (kind == PSAGG_PARAM_INIT && ctx && ctx->declared && ctx->joiner && key < ctx->n_user) {
        /* a joiner's parameter is the job's already: its INIT is the pull that the members
           make after the barrier that admitted it (psagg_sync_membership) */
        int inited;
        pthread_mutex_lock(&ctx->mu);
        inited = ctx->tensors[key].inited;
        pthread_mutex_unlock(&ctx->mu);
        if (inited) {
            kind = PSAGG_PARAM_PULL;
            flags = PSAGG_PARAM_SYNC;
        }
    }
    h = handle_new_param(ctx, key, out, kind, flags, &st);
    if (!h)
        return st;
    handle_submit(ctx, h);
    *handle = h;
    return PSAGG_OK;
}

psagg_status psagg_param_init(psagg_ctx *ctx, uint32_t key, float *weights, psagg_handle **handle)
{
    return param_op(ctx, key, weights, PSAGG_PARAM_INIT, 0, handle);
}

psagg_status psagg_pull_weights(psagg_ctx *ctx, uint32_t key, float *out, int sync,
                                psagg_handle **handle)
{
    return param_op(ctx, key, out, PSAGG_PARAM_PULL, sync ? PSAGG_PARAM_SYNC : 0, handle);
}

/*
 * The parameter settings' calls (psagg_set_lr, psagg_set_param_sync): key must name a declared
 * parameter tensor, or be PSAGG_ALL_KEYS (PSAGG_EINVAL naming `fn` otherwise); param_key_has
 * says whether tensor t is one the call sets.
 */
static psagg_status param_key_check(const psagg_ctx *ctx, uint32_t key, const char *fn)
{
    if (key != PSAGG_ALL_KEYS && (key >= ctx->n_user || !ctx->layout.tensors[key].param))
        return psagg__fail(PSAGG_EINVAL, "%s: key %u is no declared parameter tensor", fn, key);
    return PSAGG_OK;
}

static int param_key_has(const psagg_ctx *ctx, uint32_t key, uint32_t t)
{
    return (key == PSAGG_ALL_KEYS || t == key) && ctx->layout.tensors[t].param;
}

psagg_status psagg_set_lr(psagg_ctx *ctx, uint32_t key, float lr, float weight_decay)
{
    psagg_status st;
    psagg__clear_error();
    if (!ctx || !ctx->declared)
        return psagg__fail(PSAGG_EINVAL, "psagg_set_lr: call psagg_declare first");
    if (!isfinite(lr) || lr < 0 || lr > PSAGG_LR_MAX || !isfinite(weight_decay) ||
        weight_decay < 0 || weight_decay > PSAGG_LR_MAX)
        return psagg__fail(PSAGG_EINVAL,
                           "psagg_set_lr: learning rate %g and weight decay %g must be in 0..%g "
                           "(as [server] lr and weight_decay)",
                           (double)lr, (double)weight_decay, (double)PSAGG_LR_MAX);
    if ((st = param_key_check(ctx, key, "psagg_set_lr")))
        return st;
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t t = 0; t < ctx->n_user; t++)
        if (param_key_has(ctx, key, t)) {
            ctx->tensors[t].lr = lr;
            ctx->tensors[t].weight_decay = weight_decay;
        }
    pthread_mutex_unlock(&ctx->mu);
    return PSAGG_OK;
}

psagg_status psagg_set_param_sync(psagg_ctx *ctx, uint32_t key, uint32_t tag, float weight)
{
    psagg_status st;
    psagg__clear_error();
    if (!ctx || !ctx->declared)
        return psagg__fail(PSAGG_EINVAL, "psagg_set_param_sync: call psagg_declare first");
    if (!isfinite(weight) || !(weight > 0) || weight > PSAGG_PARAM_WEIGHT_MAX)
        return psagg__fail(PSAGG_EINVAL, "psagg_set_param_sync: weight %g must be in (0, %g]",
                           (double)weight, (double)PSAGG_PARAM_WEIGHT_MAX);
    if ((st = param_key_check(ctx, key, "psagg_set_param_sync")))
        return st;
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t t = 0; t < ctx->n_user; t++)
        if (param_key_has(ctx, key, t)) {
            ctx->tensors[t].tag = tag;
            ctx->tensors[t].weight = weight;
        }
    pthread_mutex_unlock(&ctx->mu);
    return PSAGG_OK;
}

psagg_status psagg_get_server_optim(const psagg_ctx *ctx, psagg_server_optim *out)
{
    psagg_status st;
    if (!ctx || !out)
        return psagg__fail(PSAGG_EINVAL, "psagg_get_server_optim: NULL argument");
    if ((st = worker_struct_size("psagg_server_optim", out->struct_size, sizeof *out)))
        return psagg__fail_context(st, "psagg_get_server_optim: ");
    *out = (psagg_server_optim){.struct_size = sizeof *out,
                                .kind = psagg__optim_name((psagg__optim_kind)ctx->optim.kind),
                                .momentum = ctx->optim.momentum,
                                .dampening = ctx->optim.dampening,
                                .beta1 = ctx->optim.beta1,
                                .beta2 = ctx->optim.beta2,
                                .eps = ctx->optim.eps,
                                .nesterov = (int)ctx->optim.nesterov,
                                .sync_interval = ctx->optim.sync_interval};
    return PSAGG_OK;
}

psagg_status psagg_get_tensor_round(const psagg_ctx *ctx, uint32_t key, uint32_t *round)
{
    psagg_ctx *c = (psagg_ctx *)ctx; /* (its lock only) */
    psagg__clear_error();
    if (!ctx || !ctx->declared || key >= ctx->n_user || !round)
        return psagg__fail(PSAGG_EINVAL, "psagg_get_tensor_round: key %u is not declared", key);
    pthread_mutex_lock(&c->mu);
    *round = ctx->tensors[key].round - ctx->tensors[key].pulls;
    pthread_mutex_unlock(&c->mu);
    return PSAGG_OK;
}

/* (the name before the scheme: deprecated, for one version) */
psagg_status psagg_tensor_round(psagg_ctx *ctx, uint32_t key, uint32_t *round)
{
    return psagg_get_tensor_round(ctx, key, round);
}

psagg_status psagg_checkpoint(psagg_ctx *ctx)
{
    psagg__clear_error();
    if (!ctx || !ctx->declared)
        return psagg__fail(PSAGG_EINVAL, "psagg_checkpoint: call psagg_declare first");
    /* two phases (server/checkpoint.c): every server asked prepares its file, and only when
       every one did are they committed; each answers, its file or why not (control.c) */
    {
        struct timespec now;
        psagg__ctl_checkpoint ck = {.phase = PSAGG_CKPT_PREPARE};
        psagg_status st;
        clock_gettime(CLOCK_REALTIME, &now);
        ck.sequence = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
        if ((st = control_request(ctx, &ctx->ckpt, "psagg_checkpoint", ctx->cfg.n_servers, &ck,
                                  sizeof ck)))
            return st;
        ck.phase = PSAGG_CKPT_COMMIT;
        return control_request(ctx, &ctx->ckpt, "psagg_checkpoint (its commit)", ctx->cfg.n_servers,
                               &ck, sizeof ck);
    }
}

psagg_status psagg_push_pull(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                             psagg_reduce op, int priority, psagg_handle **handle)
{
    psagg_status st;
    struct psagg_handle *h;
    if (!handle)
        return psagg__fail(PSAGG_EINVAL, "psagg_push_pull: handle is NULL");
    *handle = NULL;
    h = handle_new(ctx, key, in, out, op, priority, &psagg__host_ops, &st);
    if (!h)
        return st;
    handle_submit(ctx, h);
    *handle = h;
    return PSAGG_OK;
}

int psagg_test(psagg_handle *h)
{
    int done;
    if (!h)
        return 1;
    pthread_mutex_lock(&h->ctx->mu);
    done = h->done;
    pthread_mutex_unlock(&h->ctx->mu);
    return done;
}

psagg_status psagg_wait(psagg_handle *h, int timeout_ms)
{
    psagg_ctx *ctx;
    struct timespec until;
    int st;

    if (!h)
        return psagg__fail(PSAGG_EINVAL, "psagg_wait: NULL handle");
    ctx = h->ctx;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms >= 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
    }
    pthread_mutex_lock(&ctx->mu);
    while (!h->done) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&ctx->cv, &ctx->mu);
        } else if (pthread_cond_timedwait(&ctx->cv, &ctx->mu, &until) == ETIMEDOUT && !h->done) {
            pthread_mutex_unlock(&ctx->mu);
            return psagg__fail(PSAGG_ETIMEDOUT, "psagg_wait: not complete after %d ms", timeout_ms);
        }
    }
    st = h->status;
    if (st)
        psagg__fail(st, "%s", h->msg);
    pthread_mutex_unlock(&ctx->mu);
    return st;
}

void psagg_release(psagg_handle *h)
{
    if (!h)
        return;
    psagg_wait(h, -1);
    free(h);
}

/* What a question about a completed handle answers when it did not complete successfully. */
static psagg_status handle_succeeded(psagg_handle *h, const char *fn)
{
    psagg_status st;
    pthread_mutex_lock(&h->ctx->mu);
    st = h->done ? (psagg_status)h->status : PSAGG_EAGAIN;
    pthread_mutex_unlock(&h->ctx->mu);
    if (st == PSAGG_EAGAIN)
        return psagg__fail(st, "%s: the push_pull has not completed", fn);
    if (st)
        return psagg__fail(st, "%s: the push_pull failed: %s", fn, h->msg);
    return PSAGG_OK;
}

psagg_status psagg_handle_timing(psagg_handle *h, psagg_timing *out)
{
    psagg_status st;
    if (!h || !out)
        return psagg__fail(PSAGG_EINVAL, "psagg_handle_timing: NULL argument");
    if ((st = worker_struct_size("psagg_timing", out->struct_size, sizeof *out)))
        return psagg__fail_context(st, "psagg_handle_timing: ");
    *out = (psagg_timing){.struct_size = sizeof *out};
    if ((st = handle_succeeded(h, "psagg_handle_timing")))
        return st;
    handle_timing(h, out);
    return PSAGG_OK;
}

psagg_status psagg_handle_codec(psagg_handle *h, psagg_codec *codec, uint32_t *generation)
{
    psagg_status st;
    if (!h || !codec)
        return psagg__fail(PSAGG_EINVAL, "psagg_handle_codec: NULL argument");
    if ((st = handle_succeeded(h, "psagg_handle_codec")))
        return st;
    *codec = h->codec;
    if (generation)
        *generation = h->gen;
    return PSAGG_OK;
}

psagg_status psagg_get_stats(const psagg_ctx *ctx, psagg_stats *out)
{
    psagg_status st;
    if (!ctx || !out)
        return psagg__fail(PSAGG_EINVAL, "psagg_get_stats: NULL argument");
    size_t size = out->struct_size;
    if (size != offsetof(psagg_stats, left_out) && /* (before left_out was appended) */
        (st = worker_struct_size("psagg_stats", size, sizeof *out)))
        return psagg__fail_context(st, "psagg_get_stats: ");
    {
        psagg_stats all = {.struct_size = size};
        worker_stats(ctx, &all);
        all.time.struct_size = sizeof all.time;
        all.left_out = atomic_load(&ctx->left_out);
        memcpy(out, &all, size);
    }
    return PSAGG_OK;
}

psagg_status psagg_get_membership(const psagg_ctx *ctx, psagg_membership *out)
{
    psagg_status st;
    psagg_ctx *c = (psagg_ctx *)ctx; /* its mutex only */
    int rank = 0;
    if (!ctx || !out)
        return psagg__fail(PSAGG_EINVAL, "psagg_get_membership: NULL argument");
    if ((st = worker_struct_size("psagg_membership", out->struct_size, sizeof *out)))
        return psagg__fail_context(st, "psagg_get_membership: ");
    pthread_mutex_lock(&c->mu);
    for (int k = 0; k < ctx->rank; k++)
        rank += ctx->live[k];
    *out = (psagg_membership){.struct_size = sizeof *out,
                              .epoch = ctx->epoch,
                              .rank = rank,
                              .size = ctx->n_live,
                              .elastic = ctx->cfg.elastic,
                              .joined = (int)ctx->sync_joined,
                              .joiner = ctx->joiner};
    pthread_mutex_unlock(&c->mu);
    return PSAGG_OK;
}

psagg_status psagg_sync_membership(psagg_ctx *ctx, psagg_membership *out)
{
    psagg_status st;

    psagg__clear_error();
    if (!ctx || !ctx->declared)
        return psagg__fail(PSAGG_EINVAL, "psagg_sync_membership: call psagg_declare first");
    if (out && (st = worker_struct_size("psagg_membership", out->struct_size, sizeof *out)))
        return psagg__fail_context(st, "psagg_sync_membership: ");
    if (!ctx->cfg.elastic)
        return out ? psagg_get_membership(ctx, out) : PSAGG_OK;
    /* the membership's owner lets every member pass the barrier once all are in it (control.c) */
    st = control_request(ctx, &ctx->barrier, "psagg_sync_membership", 1, NULL, 0);
    if (st == PSAGG_ETIMEDOUT && !worker_failed(ctx)) { /* the barrier is lost: so is the job */
        char msg[200];
        uint32_t seq;
        pthread_mutex_lock(&ctx->mu);
        seq = ctx->sync_seq + 1;
        pthread_mutex_unlock(&ctx->mu);
        snprintf(msg, sizeof msg,
                 "psagg_sync_membership: the membership's owner did not let this worker pass "
                 "barrier %u within 2 x op_timeout_ms=%d",
                 seq, ctx->cfg.op_timeout_ms);
        worker_fail_all(ctx, PSAGG_ETIMEDOUT, "%s", msg);
        return psagg__fail(PSAGG_ETIMEDOUT, "%s", msg);
    }
    if (!st && out)
        st = psagg_get_membership(ctx, out);
    return st;
}

int psagg_rank(const psagg_ctx *ctx)
{
    return ctx->rank;
}

int psagg_world_size(const psagg_ctx *ctx)
{
    return ctx->world;
}

uint64_t psagg_min_compress_elems(const psagg_ctx *ctx)
{
    return ctx->cfg.min_compress_elems;
}

/* psagg_close's goodbye: BYE to every server, then wait (bounded) until each has read it and
 * closed its end. Closing at once would race the server: a frame it sent meanwhile (a
 * membership epoch, a PING) that this end never read makes the close a reset, and the reset
 * discards the BYE still unread in the server's socket, so a worker that finished would count
 * as failed. Reading until the server's close, then closing, is the orderly way out. */
static void say_bye(psagg_ctx *ctx, int failed)
{
    int64_t until =
        psagg__now_ms() + (ctx->cfg.op_timeout_ms < 5000 ? ctx->cfg.op_timeout_ms : 5000);
    int open = 0;
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        int fd = ctx->servers[s].fd;
        if (fd < 0)
            continue;
        /* a server that is already gone needs no BYE; it has failed the job by itself */
        if (failed || psagg__ctl_send(fd, &ctx->servers[s].auth, PSAGG_CTL_BYE, NULL, 0)) {
            if (!failed)
                LOG_WARN(&ctx->log, "server %d: BYE: %s", s, psagg_last_error());
            close(fd);
            ctx->servers[s].fd = -1;
            continue;
        }
        shutdown(fd, SHUT_WR);
        open++;
    }
    /* the servers read their BYEs meanwhile, so one deadline for all, read in turn, is enough */
    for (int s = 0; s < ctx->cfg.n_servers && open > 0; s++) {
        struct pollfd pf = {.fd = ctx->servers[s].fd, .events = POLLIN};
        int left;
        while (pf.fd >= 0 && (left = (int)(until - psagg__now_ms())) > 0 &&
               poll(&pf, 1, left) > 0) {
            char sink[4096];
            ssize_t got = recv(pf.fd, sink, sizeof sink, MSG_DONTWAIT);
            if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR)))
                continue; /* (what it sent after the BYE: nobody reads it now) */
            close(pf.fd); /* its end is closed: it has read the BYE */
            ctx->servers[s].fd = pf.fd = -1;
            open--;
        }
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        if (ctx->servers[s].fd < 0)
            continue;
        LOG_INFO(&ctx->log, "server %d did not close its end within %d ms of the BYE", s,
                 ctx->cfg.op_timeout_ms < 5000 ? ctx->cfg.op_timeout_ms : 5000);
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
    }
}

psagg_status psagg_abort(psagg_ctx *ctx, const char *why)
{
    if (!ctx)
        return PSAGG_OK;
    pthread_mutex_lock(&ctx->mu);
    ctx->aborted = !ctx->failed; /* (a job failed already: nothing more to tell) */
    pthread_mutex_unlock(&ctx->mu);
    LOG_WARN(&ctx->log, "psagg_abort: %s", why ? why : "no reason given");
    worker_fail_all(ctx, PSAGG_ECLOSED, "worker %d gave up (psagg_abort): %.300s", ctx->rank,
                    why ? why : "no reason given");
    return psagg_close(ctx);
}

psagg_status psagg_close(psagg_ctx *ctx)
{
    int failed;
    if (!ctx)
        return PSAGG_OK;
    if (atomic_load(&ctx->running))
        failover_finish(ctx); /* ([cluster] server_replicas: every worker done first) */
    comm_stop(ctx);
    pthread_mutex_lock(&ctx->mu);
    failed = ctx->failed;
    pthread_mutex_unlock(&ctx->mu);
    /* pending operations fail; the comm thread is gone, so nothing references them */
    worker_fail_all(ctx, PSAGG_ECLOSED, "psagg_close: the context was closed");
    say_bye(ctx, failed);
    if (ctx->quorum && atomic_load(&ctx->left_out))
        LOG_INFO(&ctx->log,
                 "[server] quorum: %llu chunk rounds closed without this worker's push (each "
                 "carried into its next push)",
                 (unsigned long long)atomic_load(&ctx->left_out));
    psagg__node_close(&ctx->node);
    psagg__timeline_close(ctx->timeline, &ctx->log);
    if (ctx->device_destroy)
        ctx->device_destroy(ctx);
    for (uint32_t t = 0; ctx->tensors && t < ctx->layout.n_tensors; t++) {
        psagg__free(ctx->tensors[t].residual);
        psagg__free(ctx->tensors[t].thc_scale);
        psagg__free(ctx->tensors[t].thc_peak);
        psagg__free(ctx->tensors[t].carry);
    }
    for (uint32_t c = 0; ctx->chunks && c < ctx->layout.n_chunks; c++) {
        psagg__free(ctx->chunks[c].p[0].buf);
        psagg__free(ctx->chunks[c].p[1].buf);
        if (ctx->early)
            free(ctx->early[c]);
    }
    free(ctx->early);
    psagg__rxpool_destroy(&ctx->rx);
    adapt_free(ctx);
    failover_free(ctx);
    free(ctx->chunks);
    free(ctx->owner);
    free(ctx->tensors);
    psagg__layout_free(&ctx->layout);
    free(ctx->servers);
    free(ctx->live);
    pthread_cond_destroy(&ctx->cv);
    pthread_mutex_destroy(&ctx->mu);
    free(ctx);
    return PSAGG_OK;
}
