/*
 * api.c - libpsagg's public functions (psagg.h): start-up, declaration, push_pull, handles.
 * psagg_push_pull_cuda lives with the rest of the device side, in cuda.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/optim.h"
#include "runtime/auth.h"
#include "runtime/adaptive.h"
#include "runtime/control.h"
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

/*
 * Same-host copies with server s (wire.h): send it our large pushes by descriptor when it
 * copies them (its WELCOME says so), and copy its updates when its offer checks out (our
 * DECLARE tells it). Anything that does not work leaves that direction on the provider.
 */
static void local_copy_setup(psagg_ctx *ctx, int s, const psagg_ctl_welcome *w, const char *peer)
{
    server_conn *sc = &ctx->servers[s];
    int reads, sends;

    sends = (w->local_flags & PSAGG_LOCAL_READS) && !psagg_fabric_local_send(ctx->fab, sc->addr);
    reads = w->local_pid && !psagg_fabric_local_accept(ctx->fab, sc->addr, w->local_pid,
                                                       w->local_probe, w->epname, w->epname_len);
    if (w->local_pid && !reads)
        LOG_DEBUG(&ctx->log, "%s offers same-host copies; not taken: %s", peer, psagg_last_error());
    sc->local_reads = reads;
    if (sends || reads)
        LOG_INFO(&ctx->log, "%s is on this host: %s by same-host copy", peer,
                 sends && reads ? "pushes and updates"
                 : sends        ? "pushes"
                                : "updates");
}

/* One HELLO on server s's connection and its answer. */
static psagg_status hello_once(psagg_ctx *ctx, int s, int64_t deadline, const char *peer)
{
    psagg_ctl_hello hello = {.rank = (uint32_t)ctx->rank,
                             .world_size = (uint32_t)ctx->world,
                             .flags = ctx->cfg.data_auth ? PSAGG_HELLO_DATA_AUTH : 0};
    psagg_ctl_hdr h;
    void *body = NULL;
    const char *refusal;
    size_t len = sizeof hello.epname;
    psagg_status st;

    snprintf(hello.job_id, sizeof hello.job_id, "%s", ctx->cfg.job_id);
    memcpy(hello.nonce, ctx->nonce, sizeof hello.nonce);
    snprintf(hello.provider, sizeof hello.provider, "%s", psagg_fabric_provider(ctx->fab));
    psagg_hello_token(&ctx->job_key, ctx->cfg.job_id, (uint32_t)ctx->rank, hello.flags, hello.nonce,
                      hello.auth);
    if ((st = psagg_fabric_name(ctx->fab, hello.epname, &len)))
        return st;
    hello.epname_len = (uint32_t)len;
    if (ctx->cfg.local_copy) {
        uint32_t pid;
        psagg_fabric_local_self(ctx->fab, &pid, &hello.local_probe);
        hello.local_pid = pid;
    }
    if ((st = psagg_ctl_send(ctx->servers[s].fd, PSAGG_CTL_HELLO, &hello, sizeof hello)))
        return psagg_fail_context(st, "%s: ", peer);
    if ((st = psagg_ctl_recv(ctx->servers[s].fd, &h, &body, deadline, peer)))
        return st;
    if ((st = psagg_ctl_error_parse(&h, body, &refusal))) {
        psagg_fail(st, "%s refused worker %d: %s", peer, ctx->rank, refusal);
    } else if (h.type != PSAGG_CTL_WELCOME || h.len != sizeof(psagg_ctl_welcome)) {
        st = psagg_fail(PSAGG_EPROTO, "%s answered HELLO with frame type %u", peer, h.type);
    } else {
        psagg_ctl_welcome *w = body;
        if (w->server_rank != (uint32_t)s || w->n_servers != (uint32_t)ctx->cfg.n_servers)
            st = psagg_fail(PSAGG_ECONFIG,
                            "%s says it is server %u of %u; this worker's config lists it as "
                            "server %d of %d",
                            peer, w->server_rank, w->n_servers, s, ctx->cfg.n_servers);
        else if (w->flags != hello.flags)
            st = psagg_fail(PSAGG_ECONFIG, "%s has data_auth %s, this worker %s", peer,
                            w->flags & PSAGG_HELLO_DATA_AUTH ? "on" : "off",
                            hello.flags ? "on" : "off");
        else if (strncmp(w->provider, hello.provider, PSAGG_PROVIDER_MAX - 1))
            st = psagg_fail(PSAGG_ECONFIG,
                            "%s opened fabric provider '%.31s', this worker '%.31s': every "
                            "process of a job must open the same one (name it in [cluster] "
                            "provider)",
                            peer, w->provider, hello.provider);
        else if (w->epname_len == 0 || w->epname_len > PSAGG_EPNAME_MAX)
            st =
                psagg_fail(PSAGG_EPROTO, "%s: WELCOME field epname_len is %u", peer, w->epname_len);
        else if (s > 0 && memcmp(&w->optim, &ctx->optim, sizeof w->optim))
            st = psagg_fail(
                PSAGG_ECONFIG,
                "%s runs [server] optimizer = %s (momentum %g, dampening %g, nesterov "
                "%u, beta1 %g, beta2 %g, eps %g, sync_interval %u), server 0 runs %s "
                "(%g, %g, %u, %g, %g, %g, %u): start every server with the same "
                "[server] optimizer keys",
                peer, psagg_optim_name((psagg_optim_kind)w->optim.kind), (double)w->optim.momentum,
                (double)w->optim.dampening, w->optim.nesterov, (double)w->optim.beta1,
                (double)w->optim.beta2, (double)w->optim.eps, w->optim.sync_interval,
                psagg_optim_name((psagg_optim_kind)ctx->optim.kind), (double)ctx->optim.momentum,
                (double)ctx->optim.dampening, ctx->optim.nesterov, (double)ctx->optim.beta1,
                (double)ctx->optim.beta2, (double)ctx->optim.eps, ctx->optim.sync_interval);
        else if ((st = psagg_fabric_add_peer(ctx->fab, w->epname, w->epname_len,
                                             &ctx->servers[s].addr)))
            psagg_fail_context(st, "%s: ", peer);
        else
            psagg_data_key_make(&ctx->job_key, ctx->cfg.job_id, w->nonce, &ctx->servers[s].key);
        if (!st && s == 0)
            ctx->optim = w->optim;
        if (!st && ctx->cfg.local_copy)
            local_copy_setup(ctx, s, w, peer);
    }
    free(body);
    return st;
}

/*
 * HELLO server s and read its WELCOME. A server closes a connection it has no room for
 * (while it is flooded with others) without a word: then connect and say HELLO again, until
 * the start-up deadline. A refusal (an ERROR frame) is final.
 */
static psagg_status hello_server(psagg_ctx *ctx, int s, int64_t deadline)
{
    char peer[96];
    psagg_status st;
    snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
             ctx->cfg.servers[s].port);
    for (;;) {
        st = hello_once(ctx, s, deadline, peer);
        if (st != PSAGG_EPEER || psagg_now_ms() + 100 >= deadline)
            return st;
        LOG_INFO(&ctx->log, "%s closed the connection before answering HELLO (%s); again", peer,
                 psagg_last_error());
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
        usleep(100 * 1000);
        if ((st = psagg_tcp_connect(&ctx->cfg.servers[s], deadline, peer, &ctx->log,
                                    &ctx->servers[s].fd)))
            return st;
    }
}

psagg_status psagg_init(const char *ini_path, int rank, int world_size, psagg_ctx **out)
{
    psagg_ctx *ctx;
    psagg_fabric_opts fo = {0};
    char local[PSAGG_HOST_MAX] = "", role[32];
    int64_t deadline;
    psagg_status st;

    psagg_clear_error();
    if (!out)
        return psagg_fail(PSAGG_EINVAL, "psagg_init: out is NULL");
    *out = NULL;
    if (!ini_path)
        ini_path = getenv("PSAGG_CONFIG");
    if (!ini_path)
        return psagg_fail(PSAGG_EINVAL, "psagg_init: no config file (argument or PSAGG_CONFIG)");
    if (rank < 0)
        rank = env_int("PSAGG_RANK", -1);
    if (world_size < 0)
        world_size = env_int("PSAGG_WORLD_SIZE", -1);
    if (rank < 0 || world_size < 1 || rank >= world_size)
        return psagg_fail(PSAGG_EINVAL,
                          "psagg_init: rank %d of world size %d (set the arguments or PSAGG_RANK "
                          "and PSAGG_WORLD_SIZE)",
                          rank, world_size);
    ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return psagg_fail(PSAGG_ENOMEM, "psagg_init");
    pthread_mutex_init(&ctx->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&ctx->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if ((st = psagg_config_load(ini_path, &ctx->cfg)))
        goto err_config;
    if (world_size != ctx->cfg.n_workers) {
        st = psagg_fail(PSAGG_ECONFIG,
                        "%s: [cluster] workers = %d, but this worker was started "
                        "with world size %d",
                        ini_path, ctx->cfg.n_workers, world_size);
        goto err_config;
    }
    ctx->rank = rank;
    ctx->world = world_size;
    snprintf(role, sizeof role, "worker %d", rank);
    psagg_logger_init(&ctx->log, role, ctx->cfg.log_level);
    if ((st = psagg_timeline_open(ctx->cfg.timeline, "worker", rank, &ctx->timeline)))
        goto err_config;
    ctx->servers = calloc((size_t)ctx->cfg.n_servers, sizeof *ctx->servers);
    if (!ctx->servers) {
        st = psagg_fail(PSAGG_ENOMEM, "psagg_init");
        goto err_config;
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        ctx->servers[s].fd = -1;
    if ((st = psagg_job_key_load(&ctx->cfg, &ctx->job_key)))
        goto err_connect;
    psagg_nonce_make(ctx->nonce);
    psagg_data_key_make(&ctx->job_key, ctx->cfg.job_id, ctx->nonce, &ctx->data_key);
    ctx->tag_bytes = ctx->cfg.data_auth ? PSAGG_MSG_MAC_BYTES : 0;

    /* Control connections first: the one to server 0 tells which local address to use. */
    deadline = psagg_now_ms() + ctx->cfg.connect_timeout_ms;
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        char what[32];
        snprintf(what, sizeof what, "server %d", s);
        if ((st = psagg_tcp_connect(&ctx->cfg.servers[s], deadline, what, &ctx->log,
                                    &ctx->servers[s].fd))) {
            psagg_fail_context(st, "worker %d: ", rank);
            goto err_connect;
        }
    }
    if (ctx->cfg.worker_fabric_node[0])
        snprintf(local, sizeof local, "%s", ctx->cfg.worker_fabric_node);
    else if ((st = psagg_tcp_local_addr(ctx->servers[0].fd, local, sizeof local)))
        goto err_connect;
    ctx->max_msg = psagg_max_message(&ctx->cfg);
    fo.provider = ctx->cfg.provider;
    fo.node = strcmp(ctx->cfg.provider, "shm") ? local : NULL;
    fo.max_msg = ctx->max_msg;
    fo.log = &ctx->log;
    fo.post_timeout_ms = ctx->cfg.op_timeout_ms;
    if ((st = psagg_fabric_open(&fo, &ctx->fab)))
        goto err_connect;
    ctx->source_reliable = psagg_fabric_source_reliable(ctx->fab);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if ((st = hello_server(ctx, s, deadline)))
            goto err_hello;
    *out = ctx;
    return PSAGG_OK;

err_hello:
    psagg_fabric_close(ctx->fab);
err_connect:
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (ctx->servers[s].fd >= 0)
            close(ctx->servers[s].fd);
    free(ctx->servers);
err_config:
    psagg_timeline_close(ctx->timeline, &ctx->log);
    pthread_cond_destroy(&ctx->cv);
    pthread_mutex_destroy(&ctx->mu);
    free(ctx);
    return st;
}

/* Allocate and register push buffers, residuals and posted receive buffers. */
static psagg_status setup_buffers(psagg_ctx *ctx, const psagg_tensor_desc *tensors)
{
    const psagg_layout *l = &ctx->layout;
    size_t rsize = sizeof(psagg_msg_hdr) +
                   (l->max_param_bytes > l->max_enc_bytes ? l->max_param_bytes : l->max_enc_bytes) +
                   ctx->tag_bytes;
    psagg_status st;

    if (rsize > ctx->max_msg)
        return psagg_fail(PSAGG_EINVAL, "chunks of %zu bytes exceed the fabric limit of %zu", rsize,
                          ctx->max_msg);
    ctx->tensors = calloc(l->n_tensors, sizeof *ctx->tensors);
    ctx->chunks = calloc(l->n_chunks, sizeof *ctx->chunks);
    if (!ctx->tensors || !ctx->chunks)
        return psagg_fail(PSAGG_ENOMEM, "tensor tables");
    for (uint32_t t = 0; t < ctx->n_user; t++) { /* internal tensors keep no residual */
        const psagg_tensor_info *ti = &l->tensors[t];
        ctx->tensors[t].lr = ctx->cfg.lr;
        ctx->tensors[t].weight_decay = ctx->cfg.weight_decay;
        int ef =
            tensors[t].error_feedback < 0 ? ctx->cfg.error_feedback : tensors[t].error_feedback;
        if (ef && ti->codec.id != PSAGG_CODEC_FP32) {
            ctx->tensors[t].residual = psagg_alloc(ti->count * sizeof(float), 1);
            if (!ctx->tensors[t].residual)
                return psagg_fail(PSAGG_ENOMEM, "residual of tensor '%s'", ti->name);
        }
    }
    for (uint32_t c = 0; c < l->n_chunks; c++) {
        const psagg_chunk_info *ci = &l->chunks[c];
        size_t body = l->tensors[ci->key].param && 4 * ci->count > ci->cap_bytes
                          ? 4 * ci->count /* worker 0's INIT */
                          : ci->cap_bytes;
        size_t sz = sizeof(psagg_msg_hdr) + body + sizeof(psagg_msg_param) + ctx->tag_bytes;
        ctx->chunks[c].buf = psagg_alloc(sz, 1);
        if (!ctx->chunks[c].buf)
            return psagg_fail(PSAGG_ENOMEM, "push buffers");
        if ((st = psagg_fabric_reg(ctx->fab, ctx->chunks[c].buf, sz, &ctx->chunks[c].desc)))
            return st;
    }
    /* a window of updates per server, and a few more */
    return psagg_rxpool_create(
        &ctx->rx, ctx->fab,
        psagg_rxpool_count(ctx->cfg.n_servers * ctx->cfg.max_inflight + 8, rsize, 256ull << 20),
        rsize, sizeof(psagg_rxbuf));
}

/*
 * Send the declaration to every server and wait for each answer. A server's own verdict (an
 * ERROR frame: mismatch, timeout) explains a failure better than a connection that another
 * server's verdict made the other workers drop, so the first ERROR frame wins; a send or
 * receive failure is reported only when no server said why.
 */
static psagg_status declare_all(psagg_ctx *ctx, psagg_ctl_declare *d, size_t bytes)
{
    /*
     * The servers enforce connect_timeout_ms and then say which workers are missing; wait a
     * little longer than they do so that their verdict, not our own timeout, is reported.
     */
    int grace = ctx->cfg.connect_timeout_ms / 4 > 1000 ? ctx->cfg.connect_timeout_ms / 4 : 1000;
    int64_t deadline = psagg_now_ms() + ctx->cfg.connect_timeout_ms + grace;
    psagg_status verdict = PSAGG_OK, other = PSAGG_OK;
    char verdict_msg[512] = "", other_msg[512] = "";
    int *sent = calloc((size_t)ctx->cfg.n_servers, sizeof *sent);

    if (!sent)
        return psagg_fail(PSAGG_ENOMEM, "psagg_declare");
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        psagg_status st;
        d->local_flags = ctx->servers[s].local_reads ? PSAGG_LOCAL_READS : 0;
        st = psagg_ctl_send(ctx->servers[s].fd, PSAGG_CTL_DECLARE, d, (uint32_t)bytes);
        sent[s] = !st;
        if (st && !other) {
            other = st;
            snprintf(other_msg, sizeof other_msg, "declaring to server %d: %s", s,
                     psagg_last_error());
        }
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        psagg_ctl_hdr h;
        void *body = NULL;
        const char *text;
        char peer[96];
        psagg_status st, refused;
        snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
                 ctx->cfg.servers[s].port);
        /* a server we could not send to may still have sent its verdict: read it briefly */
        st = psagg_ctl_recv(ctx->servers[s].fd, &h, &body,
                            sent[s] ? deadline : psagg_now_ms() + 500, peer);
        if (!st && (refused = psagg_ctl_error_parse(&h, body, &text))) {
            if (!verdict) {
                verdict = refused;
                snprintf(verdict_msg, sizeof verdict_msg, "%s: %s", peer, text);
            }
        } else if (!st && h.type != PSAGG_CTL_READY) {
            st = psagg_fail(PSAGG_EPROTO, "%s answered DECLARE with frame type %u", peer, h.type);
        } else if (st == PSAGG_ETIMEDOUT) {
            psagg_fail(st, "%s: not all workers declared within connect_timeout_ms=%d", peer,
                       ctx->cfg.connect_timeout_ms);
        }
        if (st && !other) {
            other = st;
            snprintf(other_msg, sizeof other_msg, "%s", psagg_last_error());
        }
        free(body);
    }
    free(sent);
    if (verdict)
        return psagg_fail(verdict, "%s", verdict_msg);
    if (other)
        return psagg_fail(other, "%s", other_msg);
    return PSAGG_OK;
}

psagg_status psagg_declare(psagg_ctx *ctx, const psagg_tensor_desc *tensors, size_t n,
                           uint32_t *keys_out)
{
    psagg_ctl_declare *d;
    psagg_ctl_tensor *wire;
    size_t bytes;
    psagg_status st = PSAGG_OK;
    uint32_t n_adaptive = 0, n_wire = (uint32_t)n;

    psagg_clear_error();
    if (!ctx || !tensors || n == 0 || n > PSAGG_MAX_TENSORS)
        return psagg_fail(PSAGG_EINVAL, "psagg_declare: %zu tensors", n);
    if (ctx->declared)
        return psagg_fail(PSAGG_EINVAL, "psagg_declare: tensors were already declared");
    for (size_t t = 0; t < n; t++) /* tensors[0] first: its size is the array's stride */
        if ((st = worker_struct_size("psagg_tensor_desc", tensors[t].struct_size, sizeof *tensors)))
            return psagg_fail_context(st, "psagg_declare: tensor %zu: ", t);
    /* room for the adaptive statistics tensor, last (runtime/adaptive.h) */
    bytes = sizeof *d + (n + 1) * sizeof *wire;
    d = calloc(1, bytes);
    if (!d)
        return psagg_fail(PSAGG_ENOMEM, "psagg_declare");
    wire = (psagg_ctl_tensor *)(d + 1);
    d->chunk_elems = psagg_chunk_elems(&ctx->cfg);
    for (size_t t = 0; t < n; t++) {
        psagg_codec c = tensors[t].codec;
        if (c.id == PSAGG_CODEC_DEFAULT) {
            c = ctx->cfg.codec;
            if (tensors[t].count < ctx->cfg.min_compress_elems)
                c = (psagg_codec){.id = PSAGG_CODEC_FP32};
        }
        if ((st = psagg_codec_check(&c)) ||
            (st = psagg_tensor_to_wire(tensors[t].name, tensors[t].count, &c, &wire[t]))) {
            psagg_fail_context(st, "psagg_declare: tensor %zu: ", t);
            goto out;
        }
        if (tensors[t].flags & ~PSAGG_TENSOR_PARAMETER) {
            st = psagg_fail(PSAGG_EINVAL, "psagg_declare: tensor %zu '%s': unknown flags 0x%x", t,
                            tensors[t].name, tensors[t].flags);
            goto out;
        }
        if (tensors[t].flags & PSAGG_TENSOR_PARAMETER) {
            if (ctx->optim.kind == PSAGG_OPTIM_NONE) {
                st = psagg_fail(PSAGG_EINVAL,
                                "psagg_declare: tensor %zu '%s' is a parameter, but the servers "
                                "run no optimizer ([server] optimizer = none)",
                                t, tensors[t].name);
                goto out;
            }
            wire[t].flags = PSAGG_DECL_PARAM;
        }
        if (keys_out)
            keys_out[t] = (uint32_t)t;
        n_adaptive += c.id == PSAGG_CODEC_MAXMIN;
    }
    if (ctx->cfg.adaptive && !n_adaptive)
        LOG_WARN(&ctx->log, "[codec] adaptive is on, but no tensor is compressed with maxmin: "
                            "every codec stays as declared");
    if (ctx->cfg.adaptive && n_adaptive) {
        psagg_codec f = {.id = PSAGG_CODEC_FP32};
        d->adapt_interval = (uint32_t)ctx->cfg.adaptive_interval;
        d->adapt_budget = ctx->cfg.adaptive_budget;
        d->adapt_flags = (ctx->cfg.adaptive_budget_bits ? PSAGG_ADAPT_BUDGET_BITS : 0) |
                         (ctx->cfg.error_feedback ? PSAGG_ADAPT_WORKER_EF : 0);
        if ((st = psagg_tensor_to_wire(PSAGG_ADAPT_STATS_NAME,
                                       (uint64_t)n_adaptive * PSAGG_ADAPT_MAX_BUCKETS, &f,
                                       &wire[n]))) {
            psagg_fail_context(st, "psagg_declare: ");
            goto out;
        }
        n_wire++;
    }
    d->count = n_wire;
    bytes = sizeof *d + n_wire * sizeof *wire;
    ctx->n_user = (uint32_t)n;
    if ((st = psagg_layout_build(wire, n_wire, d->chunk_elems, (uint32_t)ctx->cfg.n_servers,
                                 d->adapt_interval, &ctx->layout))) {
        psagg_fail_context(st, "psagg_declare: ");
        goto out;
    }

    /* Buffers are ready (and receives posted) before any server can send an update. */
    if ((st = setup_buffers(ctx, tensors)))
        goto out;
    if ((st = adapt_setup(ctx))) { /* after the residuals: they decide nearest rounding */
        psagg_fail_context(st, "psagg_declare: ");
        goto out;
    }
    st = declare_all(ctx, d, bytes);
    if (st)
        goto out;
    if ((st = comm_start(ctx)))
        goto out;
    ctx->declared = 1;
    LOG_INFO(&ctx->log, "declared %zu tensors in %u chunks over %d servers", n,
             ctx->layout.n_chunks, ctx->cfg.n_servers);
out:
    free(d);
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
        return psagg_fail(PSAGG_EINVAL, "handle is NULL");
    *handle = NULL;
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

psagg_status psagg_set_lr(psagg_ctx *ctx, uint32_t key, float lr, float weight_decay)
{
    psagg_clear_error();
    if (!ctx || !ctx->declared)
        return psagg_fail(PSAGG_EINVAL, "psagg_set_lr: call psagg_declare first");
    if (!isfinite(lr) || lr < 0 || !isfinite(weight_decay) || weight_decay < 0)
        return psagg_fail(PSAGG_EINVAL,
                          "psagg_set_lr: learning rate %g and weight decay %g must be finite and "
                          ">= 0",
                          (double)lr, (double)weight_decay);
    if (key != PSAGG_ALL_KEYS && (key >= ctx->n_user || !ctx->layout.tensors[key].param))
        return psagg_fail(PSAGG_EINVAL, "psagg_set_lr: key %u is no declared parameter tensor",
                          key);
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t t = 0; t < ctx->n_user; t++)
        if ((key == PSAGG_ALL_KEYS || t == key) && ctx->layout.tensors[t].param) {
            ctx->tensors[t].lr = lr;
            ctx->tensors[t].weight_decay = weight_decay;
        }
    pthread_mutex_unlock(&ctx->mu);
    return PSAGG_OK;
}

psagg_status psagg_tensor_round(psagg_ctx *ctx, uint32_t key, uint32_t *round)
{
    psagg_clear_error();
    if (!ctx || !ctx->declared || key >= ctx->n_user || !round)
        return psagg_fail(PSAGG_EINVAL, "psagg_tensor_round: key %u is not declared", key);
    pthread_mutex_lock(&ctx->mu);
    *round = ctx->tensors[key].round;
    pthread_mutex_unlock(&ctx->mu);
    return PSAGG_OK;
}

psagg_status psagg_checkpoint(psagg_ctx *ctx)
{
    struct timespec until;
    psagg_status st = PSAGG_OK;

    psagg_clear_error();
    if (!ctx || !ctx->declared)
        return psagg_fail(PSAGG_EINVAL, "psagg_checkpoint: call psagg_declare first");
    /* the servers write on their control thread: give them the operations' deadline */
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += PSAGG_OP_DEADLINE_MS(ctx->cfg.op_timeout_ms) / 1000;
    pthread_mutex_lock(&ctx->mu);
    if (ctx->failed) {
        st = psagg_fail(ctx->failed_status, "%s", ctx->failed_msg);
        goto out;
    }
    if (ctx->ckpt_state) {
        st = psagg_fail(PSAGG_EINVAL, "psagg_checkpoint: one is being written already");
        goto out;
    }
    for (uint32_t t = 0; t < ctx->layout.n_tensors; t++) /* queued ones hold their slot too */
        if (ctx->tensors[t].op) {
            st = psagg_fail(PSAGG_EINVAL,
                            "psagg_checkpoint: tensor '%s' has an operation in flight; call it "
                            "between steps",
                            ctx->layout.tensors[t].name);
            goto out;
        }
    ctx->ckpt_state = 1;
    ctx->ckpt_left = ctx->cfg.n_servers;
    ctx->ckpt_status = PSAGG_OK;
    ctx->ckpt_msg[0] = '\0';
    if (atomic_load(&ctx->comm_idle))
        psagg_fabric_wake(ctx->fab);
    while (ctx->ckpt_state && !ctx->failed)
        if (pthread_cond_timedwait(&ctx->cv, &ctx->mu, &until) == ETIMEDOUT)
            break;
    if (ctx->failed)
        st = psagg_fail(ctx->failed_status, "%s", ctx->failed_msg);
    else if (ctx->ckpt_state)
        st = psagg_fail(PSAGG_ETIMEDOUT, "psagg_checkpoint: %d server(s) did not answer in time",
                        ctx->ckpt_left);
    else if (ctx->ckpt_status)
        st = psagg_fail(ctx->ckpt_status, "psagg_checkpoint: %s", ctx->ckpt_msg);
    ctx->ckpt_state = 0; /* after a timeout, answers that come later are dropped */
out:
    pthread_mutex_unlock(&ctx->mu);
    return st;
}

psagg_status psagg_push_pull(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                             psagg_reduce op, int priority, psagg_handle **handle)
{
    psagg_status st;
    struct psagg_handle *h;
    if (!handle)
        return psagg_fail(PSAGG_EINVAL, "psagg_push_pull: handle is NULL");
    *handle = NULL;
    h = handle_new(ctx, key, in, out, op, priority, &psagg_host_ops, &st);
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
        return psagg_fail(PSAGG_EINVAL, "psagg_wait: NULL handle");
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
            return psagg_fail(PSAGG_ETIMEDOUT, "psagg_wait: not complete after %d ms", timeout_ms);
        }
    }
    st = h->status;
    if (st)
        psagg_fail(st, "%s", h->msg);
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
        return psagg_fail(st, "%s: the push_pull has not completed", fn);
    if (st)
        return psagg_fail(st, "%s: the push_pull failed: %s", fn, h->msg);
    return PSAGG_OK;
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
    return psagg_fail(PSAGG_EINVAL,
                      "%s.struct_size is %zu, not a size of %s this library knows (%zu): set it "
                      "to sizeof(%s)",
                      type, got, type, known, type);
}

psagg_status psagg_handle_timing(psagg_handle *h, psagg_timing *out)
{
    psagg_status st;
    if (!h || !out)
        return psagg_fail(PSAGG_EINVAL, "psagg_handle_timing: NULL argument");
    if ((st = worker_struct_size("psagg_timing", out->struct_size, sizeof *out)))
        return psagg_fail_context(st, "psagg_handle_timing: ");
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
        return psagg_fail(PSAGG_EINVAL, "psagg_handle_codec: NULL argument");
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
        return psagg_fail(PSAGG_EINVAL, "psagg_get_stats: NULL argument");
    if ((st = worker_struct_size("psagg_stats", out->struct_size, sizeof *out)))
        return psagg_fail_context(st, "psagg_get_stats: ");
    worker_stats(ctx, out);
    out->time.struct_size = sizeof out->time;
    return PSAGG_OK;
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

psagg_status psagg_close(psagg_ctx *ctx)
{
    int failed;
    if (!ctx)
        return PSAGG_OK;
    comm_stop(ctx);
    pthread_mutex_lock(&ctx->mu);
    failed = ctx->failed;
    pthread_mutex_unlock(&ctx->mu);
    /* pending operations fail; the comm thread is gone, so nothing references them */
    worker_fail_all(ctx, PSAGG_ECLOSED, "psagg_close: the context was closed");
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        if (ctx->servers[s].fd < 0)
            continue;
        /* a server that is already gone needs no BYE; it has failed the job by itself */
        if (!failed && psagg_ctl_send(ctx->servers[s].fd, PSAGG_CTL_BYE, NULL, 0))
            LOG_WARN(&ctx->log, "server %d: BYE: %s", s, psagg_last_error());
        close(ctx->servers[s].fd);
    }
    psagg_fabric_close(ctx->fab);
    psagg_timeline_close(ctx->timeline, &ctx->log);
    if (ctx->device_destroy)
        ctx->device_destroy(ctx);
    for (uint32_t t = 0; ctx->tensors && t < ctx->layout.n_tensors; t++)
        psagg_free(ctx->tensors[t].residual);
    for (uint32_t c = 0; ctx->chunks && c < ctx->layout.n_chunks; c++)
        psagg_free(ctx->chunks[c].buf);
    psagg_rxpool_destroy(&ctx->rx);
    adapt_free(ctx);
    free(ctx->chunks);
    free(ctx->tensors);
    psagg_layout_free(&ctx->layout);
    free(ctx->servers);
    pthread_cond_destroy(&ctx->cv);
    pthread_mutex_destroy(&ctx->mu);
    free(ctx);
    return PSAGG_OK;
}
