/*
 * comm.c - libpsagg's communication thread: scheduling, pushes, updates, failure detection.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control.h"
#include "error.h"
#include "log.h"
#include "worker.h"

#define MAX_ACTIVE 4096

typedef struct comm_state {
    psagg_ctx *ctx;
    struct psagg_handle **active; /* taken from the queue, not complete; by priority */
    int n_active;
    int64_t next_ctl_check;
} comm_state;

void comm_complete_locked(psagg_ctx *ctx, struct psagg_handle *h, int status, const char *msg)
{
    if (h->done)
        return;
    h->status = status;
    snprintf(h->msg, sizeof h->msg, "%s", msg ? msg : "");
    h->done = 1;
    pthread_cond_broadcast(&ctx->cv);
}

/* Fail everything queued or active; later calls see ctx->failed. */
void comm_fail_all(psagg_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&ctx->mu);
    if (!ctx->failed) {
        ctx->failed = 1;
        ctx->failed_status = status;
        va_start(ap, fmt);
        vsnprintf(ctx->failed_msg, sizeof ctx->failed_msg, fmt, ap);
        va_end(ap);
        if (status != PSAGG_ECLOSED)
            LOG_ERROR("%s", ctx->failed_msg);
    }
    /*
     * Complete every pending handle and forget it: once complete, its owner may release it
     * at any time, so nothing here may point at it afterwards (the comm thread drops its
     * active list as soon as it sees ctx->failed).
     */
    for (uint32_t t = 0; ctx->tensors && t < ctx->layout.n_tensors; t++)
        if (ctx->tensors[t].op) {
            comm_complete_locked(ctx, ctx->tensors[t].op, ctx->failed_status, ctx->failed_msg);
            ctx->tensors[t].op = NULL;
        }
    for (struct psagg_handle *h = ctx->queue; h; h = h->next)
        comm_complete_locked(ctx, h, ctx->failed_status, ctx->failed_msg);
    ctx->queue = NULL;
    pthread_cond_broadcast(&ctx->cv);
    pthread_mutex_unlock(&ctx->mu);
}

static int ctx_failed(psagg_ctx *ctx)
{
    int failed;
    pthread_mutex_lock(&ctx->mu);
    failed = ctx->failed;
    pthread_mutex_unlock(&ctx->mu);
    return failed;
}

/* Move newly submitted operations into the active list, ordered by priority then age. */
static void take_queue(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    struct psagg_handle *q;
    pthread_mutex_lock(&ctx->mu);
    q = ctx->queue;
    ctx->queue = NULL;
    pthread_mutex_unlock(&ctx->mu);
    while (q) {
        struct psagg_handle *h = q;
        int i;
        q = q->next;
        h->next = NULL;
        i = cs->n_active++;
        while (i > 0 &&
               (cs->active[i - 1]->priority < h->priority ||
                (cs->active[i - 1]->priority == h->priority && cs->active[i - 1]->seq > h->seq))) {
            cs->active[i] = cs->active[i - 1];
            i--;
        }
        cs->active[i] = h;
    }
}

static void remove_active(comm_state *cs, struct psagg_handle *h)
{
    for (int i = 0; i < cs->n_active; i++)
        if (cs->active[i] == h) {
            memmove(&cs->active[i], &cs->active[i + 1],
                    (size_t)(cs->n_active - i - 1) * sizeof *cs->active);
            cs->n_active--;
            return;
        }
}

static void finish_op(comm_state *cs, struct psagg_handle *h, int status, const char *msg)
{
    psagg_ctx *ctx = cs->ctx;
    remove_active(cs, h);
    pthread_mutex_lock(&ctx->mu);
    if (ctx->tensors[h->key].op == h) {
        ctx->tensors[h->key].op = NULL;
        if (!status)
            ctx->tensors[h->key].round++;
    }
    comm_complete_locked(ctx, h, status, msg);
    pthread_mutex_unlock(&ctx->mu);
    if (!status)
        atomic_fetch_add(&ctx->push_pulls, 1);
}

psagg_rng_key comm_push_key(const psagg_ctx *ctx, const psagg_chunk_info *ci, uint32_t round)
{
    uint64_t stream = psagg_mix64(
        psagg_mix64(0x3030ull << 32 | (uint32_t)ctx->rank, (uint64_t)ci->key << 32 | ci->index),
        round);
    return psagg_rng_key_make(ctx->cfg.seed, stream);
}

/*
 * Encode every chunk of h (so a bad gradient fails the call before anything is sent).
 * Returns 1 when encoded, 0 when a chunk buffer is still being sent (try later), -1 failed.
 */
static int encode_op(comm_state *cs, struct psagg_handle *h)
{
    psagg_ctx *ctx = cs->ctx;
    const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
    tensor_state *ts = &ctx->tensors[h->key];
    char msg[256];

    for (uint32_t c = 0; c < ti->n_chunks; c++)
        if (ctx->chunks[ti->first_chunk + c].send_pending)
            return 0;
    if (h->gpu) {
        int r = gpu_payloads_ready(ctx, h, msg, sizeof msg);
        if (r < 0)
            finish_op(cs, h, r, msg);
        if (r <= 0)
            return r < 0 ? -1 : 0;
    }
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg_chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        chunk_buf *cb = &ctx->chunks[ti->first_chunk + c];
        psagg_msg_hdr *mh = (psagg_msg_hdr *)cb->buf;
        size_t bad = 0;
        psagg_status st = PSAGG_OK;
        if (!h->gpu)
            st = psagg_encode(&ti->codec, h->in + ci->offset,
                              ts->residual ? ts->residual + ci->offset : NULL, ci->count,
                              comm_push_key(ctx, ci, h->round), cb->buf + sizeof *mh, ci->enc_bytes,
                              &bad);
        if (st) {
            snprintf(msg, sizeof msg, "tensor '%.63s': element %llu: %.150s", ti->name,
                     (unsigned long long)(ci->offset + bad), psagg_last_error());
            if (ts->residual) /* part of it was updated: start error feedback afresh */
                memset(ts->residual, 0, ti->count * sizeof(float));
            finish_op(cs, h, st, msg);
            return -1;
        }
        *mh = (psagg_msg_hdr){.magic = PSAGG_MSG_MAGIC,
                              .type = PSAGG_MSG_PUSH,
                              .version = PSAGG_PROTO_VERSION,
                              .sender = (uint16_t)ctx->rank,
                              .round = h->round,
                              .key = ci->key,
                              .chunk = ci->index,
                              .len = (uint32_t)ci->enc_bytes};
    }
    h->encoded = 1;
    return 1;
}

/* Push what the windows allow, highest priority first. Returns 1 if anything is waiting. */
static int schedule(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    int waiting = 0;

    for (int i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
        if (!h->encoded) {
            int r = encode_op(cs, h);
            if (r < 0) {
                i--; /* h left the active list */
                continue;
            }
            if (r == 0) {
                waiting = 1;
                continue;
            }
        }
        while (h->next_send < ti->n_chunks) {
            uint32_t g = ti->first_chunk + h->next_send;
            const psagg_chunk_info *ci = &ctx->layout.chunks[g];
            server_conn *sc = &ctx->servers[ci->owner];
            psagg_status st;
            if (sc->inflight >= ctx->cfg.max_inflight) {
                waiting = 1;
                break;
            }
            ctx->chunks[g].send_pending = 1;
            st = psagg_fabric_send(ctx->fab, sc->addr, ctx->chunks[g].buf,
                                   sizeof(psagg_msg_hdr) + ci->enc_bytes, ctx->chunks[g].desc,
                                   &ctx->chunks[g]);
            if (st) {
                ctx->chunks[g].send_pending = 0;
                comm_fail_all(ctx, PSAGG_EPEER, "pushing tensor '%s' chunk %u to server %u: %s",
                              ti->name, ci->index, ci->owner, psagg_last_error());
                return 0;
            }
            sc->inflight++;
            h->next_send++;
            atomic_fetch_add(&ctx->bytes_sent, sizeof(psagg_msg_hdr) + ci->enc_bytes);
            atomic_fetch_add(&ctx->bytes_raw, ci->count * sizeof(float));
        }
    }
    return waiting;
}

/* One update arrived: check it, decode it into the caller's buffer. */
static void on_update(comm_state *cs, recv_slot *rs, size_t len)
{
    psagg_ctx *ctx = cs->ctx;
    const psagg_msg_hdr *mh = (const psagg_msg_hdr *)rs->buf;
    const psagg_layout *l = &ctx->layout;
    const psagg_chunk_info *ci;
    const psagg_tensor_info *ti;
    struct psagg_handle *h;
    const char *bad = NULL;
    psagg_status st;

    if (len < sizeof *mh || mh->magic != PSAGG_MSG_MAGIC)
        bad = "magic";
    else if (mh->version != PSAGG_PROTO_VERSION)
        bad = "version";
    else if (mh->type != PSAGG_MSG_UPDATE)
        bad = "type";
    else if (mh->key >= l->n_tensors)
        bad = "key";
    else if (mh->chunk >= l->tensors[mh->key].n_chunks)
        bad = "chunk";
    if (bad) {
        comm_fail_all(ctx, PSAGG_EPROTO, "an update's field %s is invalid (%zu bytes)", bad, len);
        return;
    }
    ti = &l->tensors[mh->key];
    ci = &l->chunks[ti->first_chunk + mh->chunk];
    h = ctx->tensors[mh->key].op;
    if (mh->sender != ci->owner || mh->len != ci->enc_bytes || len != sizeof *mh + mh->len) {
        comm_fail_all(ctx, PSAGG_EPROTO,
                      "update of tensor '%s' chunk %u from server %u: field %s is wrong", ti->name,
                      mh->chunk, mh->sender, mh->sender != ci->owner ? "sender" : "len");
        return;
    }
    if (!h || mh->round != h->round || h->chunk_done[mh->chunk]) {
        comm_fail_all(ctx, PSAGG_EPROTO,
                      "server %u sent an unexpected update of tensor '%s' chunk %u round %u",
                      mh->sender, ti->name, mh->chunk, mh->round);
        return;
    }
    if (h->gpu) {
        gpu_stage_update(ctx, h, ci, rs->buf + sizeof *mh);
        st = PSAGG_OK;
    } else {
        st =
            psagg_decode(&ti->codec, rs->buf + sizeof *mh, mh->len, ci->count, h->out + ci->offset);
    }
    if (st) {
        comm_fail_all(ctx, PSAGG_EPROTO, "update of tensor '%s' chunk %u from server %u: %s",
                      ti->name, mh->chunk, mh->sender, psagg_last_error());
        return;
    }
    if (h->op == PSAGG_AVERAGE && !h->gpu) {
        const float scale = 1.0f / (float)ctx->world;
        float *o = h->out + ci->offset;
        for (uint64_t i = 0; i < ci->count; i++)
            o[i] = o[i] * scale;
    }
    atomic_fetch_add(&ctx->bytes_received, len);
    h->chunk_done[mh->chunk] = 1;
    if (++h->done_chunks < ti->n_chunks)
        return;
    if (h->gpu) {
        char msg[256];
        int r = gpu_start_decode(ctx, h, msg, sizeof msg);
        if (r < 0)
            finish_op(cs, h, r, msg);
        else
            h->gpu_decoding = 1; /* completes in poll_gpu_decodes */
        return;
    }
    finish_op(cs, h, PSAGG_OK, NULL);
}

/* Complete the device-buffer operations whose decode has finished on the GPU. */
static void poll_gpu_decodes(comm_state *cs)
{
    if (ctx_failed(cs->ctx)) {
        cs->n_active = 0;
        return;
    }
    for (int i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        char msg[256];
        int r;
        if (!h->gpu_decoding)
            continue;
        r = gpu_decode_done(cs->ctx, h, msg, sizeof msg);
        if (r == 0)
            continue;
        finish_op(cs, h, r < 0 ? r : PSAGG_OK, r < 0 ? msg : NULL);
        i--;
    }
}

/* Control connections: an ABORT/ERROR frame or a closed socket fails everything. */
static void check_control(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        struct pollfd p = {.fd = ctx->servers[s].fd, .events = POLLIN};
        psagg_ctl_hdr h;
        void *body = NULL;
        char peer[96];
        if (p.fd < 0 || poll(&p, 1, 0) <= 0)
            continue;
        snprintf(peer, sizeof peer, "server %d (%s:%u)", s, ctx->cfg.servers[s].host,
                 ctx->cfg.servers[s].port);
        if (psagg_ctl_recv(p.fd, &h, &body, psagg_now_ms() + 2000, peer)) {
            comm_fail_all(ctx, PSAGG_EPEER, "%s", psagg_last_error());
        } else if ((h.type == PSAGG_CTL_ABORT || h.type == PSAGG_CTL_ERROR) &&
                   h.len == sizeof(psagg_ctl_error)) {
            psagg_ctl_error *e = body;
            e->msg[sizeof e->msg - 1] = '\0';
            comm_fail_all(ctx, e->status < 0 ? e->status : PSAGG_EPEER, "%s: %s", peer, e->msg);
        } else {
            comm_fail_all(ctx, PSAGG_EPROTO, "%s sent control frame type %u during the job", peer,
                          h.type);
        }
        free(body);
        close(ctx->servers[s].fd);
        ctx->servers[s].fd = -1;
    }
}

static void check_deadlines(comm_state *cs)
{
    psagg_ctx *ctx = cs->ctx;
    int64_t now = psagg_now_ms();
    if (ctx_failed(ctx)) {
        cs->n_active = 0; /* completed by comm_fail_all; their owners may free them */
        return;
    }
    for (int i = 0; i < cs->n_active; i++) {
        struct psagg_handle *h = cs->active[i];
        const psagg_tensor_info *ti = &ctx->layout.tensors[h->key];
        char waiting[96] = "";
        size_t used = 0;
        if (now < h->deadline_ms)
            continue;
        for (uint32_t c = 0; c < ti->n_chunks && used + 8 < sizeof waiting; c++)
            if (!h->chunk_done[c])
                used +=
                    (size_t)snprintf(waiting + used, sizeof waiting - used, "%s%u", used ? "," : "",
                                     ctx->layout.chunks[ti->first_chunk + c].owner);
        comm_fail_all(ctx, PSAGG_ETIMEDOUT,
                      "push_pull of tensor '%s' round %u: no update within op_timeout_ms=%d "
                      "(waiting on servers %s)",
                      ti->name, h->round, ctx->cfg.op_timeout_ms, waiting);
        return;
    }
}

/* A push's send completed (or failed): its buffer and its window slot are free again. */
static void push_sent(psagg_ctx *ctx, chunk_buf *cb)
{
    if (!cb || !cb->send_pending)
        return;
    cb->send_pending = 0;
    ctx->servers[ctx->layout.chunks[cb - ctx->chunks].owner].inflight--;
}

static void *comm_main(void *arg)
{
    comm_state cs = {.ctx = arg};
    psagg_ctx *ctx = cs.ctx;
    psagg_fabric_event ev[64];

    cs.active = calloc(MAX_ACTIVE + 1, sizeof *cs.active);
    if (!cs.active) {
        comm_fail_all(ctx, PSAGG_ENOMEM, "communication thread state");
        return NULL;
    }
    while (atomic_load(&ctx->running)) {
        int waiting, n;
        int64_t now;
        take_queue(&cs);
        if (ctx_failed(ctx))
            cs.n_active = 0; /* everything was completed with the failure */
        waiting = schedule(&cs);
        n = psagg_fabric_poll(ctx->fab, ev, 64,
                              cs.n_active && !waiting ? 1 : (cs.n_active ? 0 : 2));
        if (n < 0) {
            comm_fail_all(ctx, PSAGG_EFABRIC, "completion queue: %s", psagg_last_error());
            break;
        }
        for (int i = 0; i < n; i++) {
            switch (ev[i].kind) {
            case PSAGG_FABRIC_SEND_DONE:
                push_sent(ctx, ev[i].ctx);
                break;
            case PSAGG_FABRIC_SEND_ERROR:
                push_sent(ctx, ev[i].ctx);
                comm_fail_all(ctx, ev[i].status ? ev[i].status : PSAGG_EPEER, "a push failed: %s",
                              ev[i].msg);
                break;
            case PSAGG_FABRIC_RECV_DONE: {
                recv_slot *rs = ev[i].ctx;
                if (ctx_failed(ctx))
                    cs.n_active = 0;
                else
                    on_update(&cs, rs, ev[i].len);
                if (psagg_fabric_post_recv(ctx->fab, rs->buf, rs->size, rs->desc, rs))
                    comm_fail_all(ctx, PSAGG_EFABRIC, "reposting a receive: %s",
                                  psagg_last_error());
                break;
            }
            case PSAGG_FABRIC_RECV_ERROR:
                if (atomic_load(&ctx->running))
                    comm_fail_all(ctx, ev[i].status ? ev[i].status : PSAGG_EFABRIC,
                                  "a receive failed: %s", ev[i].msg);
                break;
            }
        }
        poll_gpu_decodes(&cs);
        now = psagg_now_ms();
        if (now >= cs.next_ctl_check) {
            check_control(&cs);
            check_deadlines(&cs);
            cs.next_ctl_check = now + 20;
        }
    }
    free(cs.active);
    return NULL;
}

psagg_status comm_start(psagg_ctx *ctx)
{
    atomic_store(&ctx->running, 1);
    if (pthread_create(&ctx->comm_tid, NULL, comm_main, ctx)) {
        atomic_store(&ctx->running, 0);
        return psagg_fail(PSAGG_EIO, "cannot start the communication thread");
    }
    return PSAGG_OK;
}

void comm_stop(psagg_ctx *ctx)
{
    if (!atomic_load(&ctx->running))
        return;
    atomic_store(&ctx->running, 0);
    pthread_join(ctx->comm_tid, NULL);
}
