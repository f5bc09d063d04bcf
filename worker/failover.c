/*
 * failover.c - a worker's side of servers that fail ([cluster] server_replicas; docs/design.md,
 * "Servers that fail and join"), on the communication thread.
 *
 * A server this worker loses (its control connection closes or errs, a push to it fails, or it
 * is silent for op_timeout_ms) no longer fails the job: the worker stops pushing to it and
 * reports it (SERVER_LOST, with the round of the next update it takes of every chunk) to the
 * lowest server it has not lost. That server proposes the next view, which the workers decide
 * as the acceptors of runtime/agree.c (AGREE frames). Once this worker learns the decided view
 * it relays it to every other live server (VIEW), points each moved chunk at its new owner and
 * sends it again the pushes it keeps of the rounds from the view's start (chunk_buf keeps two
 * by round parity); an update of a round it has already applied is then dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/agree.h"
#include "runtime/channel.h"
#include "worker.h"

struct psagg__failover {
    psagg__acceptor acc;
    uint8_t *lost;         /* per server: lost here, or out of the view */
    uint32_t *resend_from; /* per chunk: the round from which to push again, UINT32_MAX: none */
    int resends;           /* chunks with one */
    uint64_t dropped;      /* updates of rounds applied already, dropped */
};

psagg_status failover_setup(psagg_ctx *ctx)
{
    struct psagg__failover *fo;
    uint32_t n = ctx->layout.n_chunks;
    if (!ctx->cfg.server_replicas)
        return PSAGG_OK;
    if (!(fo = calloc(1, sizeof *fo)) || !(fo->lost = calloc((size_t)ctx->cfg.n_servers, 1)) ||
        !(fo->resend_from = malloc((size_t)(n ? n : 1) * sizeof *fo->resend_from))) {
        if (fo)
            free(fo->lost);
        free(fo);
        return psagg__fail(PSAGG_ENOMEM, "the server views");
    }
    for (uint32_t g = 0; g < n; g++)
        fo->resend_from[g] = UINT32_MAX;
    psagg__acceptor_init(&fo->acc, 1);
    ctx->failover = fo;
    return PSAGG_OK;
}

void failover_free(psagg_ctx *ctx)
{
    struct psagg__failover *fo = ctx->failover;
    if (!fo)
        return;
    psagg__acceptor_free(&fo->acc);
    free(fo->lost);
    free(fo->resend_from);
    free(fo);
    ctx->failover = NULL;
}

/* The round of the next update of chunk g this worker takes. */
static uint32_t next_update(const psagg_ctx *ctx, uint32_t g)
{
    const psagg__chunk_info *ci = &ctx->layout.chunks[g];
    const tensor_state *ts = &ctx->tensors[ci->key];
    const struct psagg_handle *h = ts->op;
    if (!h)
        return ts->round;
    return h->chunk_done[ci->index] ? h->round + 1 : h->round;
}

static void close_server(psagg_ctx *ctx, int s)
{
    if (ctx->servers[s].fd >= 0)
        close(ctx->servers[s].fd);
    ctx->servers[s].fd = -1;
}

int failover_server_lost(psagg_ctx *ctx, int s, const char *why)
{
    struct psagg__failover *fo = ctx->failover;
    psagg__ctl_server_lost *sl;
    size_t len;
    int to = -1;
    if (!fo)
        return 0;
    if (fo->lost[s])
        return 1;
    fo->lost[s] = 1;
    close_server(ctx, s);
    for (int k = 0; k < ctx->cfg.n_servers && to < 0; k++)
        if (!fo->lost[k])
            to = k;
    LOG_WARN(&ctx->log, "lost server %d (%s): reporting it to server %d", s, why, to);
    if (to < 0) {
        worker_fail_all(ctx, PSAGG_EPEER, "every server is lost; the last, server %d: %s", s, why);
        return 1;
    }
    len = sizeof *sl + (size_t)ctx->layout.n_chunks * sizeof(uint32_t);
    if (!(sl = calloc(1, len))) {
        worker_fail_all(ctx, PSAGG_ENOMEM, "no memory to report server %d lost", s);
        return 1;
    }
    pthread_mutex_lock(&ctx->mu);
    *sl = (psagg__ctl_server_lost){
        .server = (uint32_t)s, .epoch = ctx->epoch, .n_chunks = ctx->layout.n_chunks};
    for (uint32_t g = 0; g < ctx->layout.n_chunks; g++) {
        uint32_t r = next_update(ctx, g);
        memcpy((uint8_t *)(sl + 1) + (size_t)g * sizeof r, &r, sizeof r);
    }
    pthread_mutex_unlock(&ctx->mu);
    if (psagg__ctl_send(ctx->servers[to].fd, &ctx->servers[to].auth, PSAGG_CTL_SERVER_LOST, sl,
                        (uint32_t)len)) {
        char m[200];
        snprintf(m, sizeof m, "sending it SERVER_LOST: %s", psagg_last_error());
        free(sl);
        return failover_server_lost(ctx, to, m);
    }
    free(sl);
    return 1;
}

/* Take the decided view v (of epoch acc.epoch - 1): owners, epoch, re-sends, relays. */
static void take_view(psagg_ctx *ctx, int from, const uint8_t *v, uint32_t len)
{
    struct psagg__failover *fo = ctx->failover;
    psagg__view_hdr vh;
    const uint8_t *live;
    const uint8_t *moves;
    psagg__ctl_agree a;
    uint8_t *frame;

    memcpy(&vh, v, sizeof vh);
    if (len < sizeof vh || vh.n_servers != (uint32_t)ctx->cfg.n_servers ||
        len != psagg__view_bytes(vh.n_servers, vh.n_moves) || vh.n_moves > ctx->layout.n_chunks) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %d: a decided view of %u bytes (fields n_servers, n_moves)", from,
                        len);
        return;
    }
    live = v + sizeof vh;
    moves = live + (vh.n_servers + 3) / 4 * 4;
    for (uint32_t i = 0; i < vh.n_moves; i++) {
        psagg__view_move m;
        memcpy(&m, moves + (size_t)i * sizeof m, sizeof m);
        if (m.chunk >= ctx->layout.n_chunks || m.owner >= vh.n_servers || !live[m.owner]) {
            worker_fail_all(ctx, PSAGG_EPROTO,
                            "server %d: view %u moves chunk %u to server %u, which it does not "
                            "name live",
                            from, vh.epoch, m.chunk, m.owner);
            return;
        }
        ctx->owner[m.chunk] = m.owner;
        if (fo->resend_from[m.chunk] == UINT32_MAX)
            fo->resends++;
        fo->resend_from[m.chunk] = m.start;
    }
    pthread_mutex_lock(&ctx->mu);
    ctx->epoch = vh.epoch;
    pthread_mutex_unlock(&ctx->mu);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (!live[s] && !fo->lost[s]) {
            fo->lost[s] = 1;
            close_server(ctx, s);
        }
    LOG_WARN(&ctx->log, "server view %u: %u chunk(s) moved to live servers", vh.epoch, vh.n_moves);
    /* relay it to the other live servers: each applies it before the pushes of the new view */
    a = (psagg__ctl_agree){.kind = PSAGG_AGREE_DECIDED, .epoch = vh.epoch, .value_len = len};
    if (!(frame = malloc(sizeof a + len))) {
        worker_fail_all(ctx, PSAGG_ENOMEM, "no memory to relay view %u", vh.epoch);
        return;
    }
    memcpy(frame, &a, sizeof a);
    memcpy(frame + sizeof a, v, len);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (s != from && ctx->servers[s].fd >= 0 &&
            psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_VIEW, frame,
                            (uint32_t)(sizeof a + len)))
            LOG_WARN(&ctx->log, "relaying view %u to server %d: %s", vh.epoch, s,
                     psagg_last_error());
    free(frame);
}

void failover_agree(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body)
{
    struct psagg__failover *fo = ctx->failover;
    psagg__ctl_agree a;
    psagg__agree_msg in, out;
    int r;
    if (!fo || h->len < sizeof a) {
        worker_fail_all(ctx, PSAGG_EPROTO, "server %d sent an AGREE frame of %u bytes%s", s, h->len,
                        fo ? "" : " in a job without server_replicas");
        return;
    }
    memcpy(&a, body, sizeof a);
    if (h->len != sizeof a + (size_t)a.value_len) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %d: AGREE field value_len: %u in a frame of %u bytes", s,
                        a.value_len, h->len);
        return;
    }
    in = (psagg__agree_msg){.kind = a.kind,
                            .epoch = a.epoch,
                            .ballot = a.ballot,
                            .accepted = a.accepted,
                            .value = a.value_len ? (const uint8_t *)body + sizeof a : NULL,
                            .value_len = a.value_len};
    r = psagg__acceptor_on(&fo->acc, &in, &out);
    if (r < 0) {
        worker_fail_all(ctx, (psagg_status)r, "the agreement on a server view");
        return;
    }
    if (r == 1) {
        size_t len = sizeof a + out.value_len;
        uint8_t *frame = malloc(len);
        if (!frame) {
            worker_fail_all(ctx, PSAGG_ENOMEM, "no memory for an AGREE frame");
            return;
        }
        a = (psagg__ctl_agree){.kind = out.kind,
                               .epoch = out.epoch,
                               .ballot = out.ballot,
                               .accepted = out.accepted,
                               .value_len = out.value_len};
        memcpy(frame, &a, sizeof a);
        if (out.value_len)
            memcpy(frame + sizeof a, out.value, out.value_len);
        if (ctx->servers[s].fd >= 0 && psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth,
                                                       PSAGG_CTL_AGREE, frame, (uint32_t)len))
            LOG_WARN(&ctx->log, "answering server %d's AGREE: %s", s, psagg_last_error());
        free(frame);
    } else if (r == 2) {
        take_view(ctx, s, fo->acc.last, fo->acc.last_len);
    }
}

/*
 * Push again what the moved chunks' new owners need: for chunk g, each push this worker made
 * of a round from resend_from[g] on (at most the last two, which chunk_buf keeps). Returns 1
 * while some wait (a buffer still being sent, a full window or provider queue), else 0.
 */
int failover_resend(psagg_ctx *ctx)
{
    struct psagg__failover *fo = ctx->failover;
    int waiting = 0;
    if (!fo || !fo->resends)
        return 0;
    for (uint32_t g = 0; g < ctx->layout.n_chunks; g++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[g];
        const tensor_state *ts = &ctx->tensors[ci->key];
        const struct psagg_handle *h = ts->op;
        uint32_t from = fo->resend_from[g], last;
        int has_last;
        if (from == UINT32_MAX)
            continue;
        /* the last round of g this worker pushed (a push not sent yet goes to the new owner) */
        if (h && h->encoded && h->next_send > ci->index)
            last = h->round, has_last = 1;
        else if (h)
            last = h->round - 1, has_last = h->round > 0;
        else
            last = ts->round - 1, has_last = ts->round > 0;
        while (has_last && from <= last) {
            server_conn *sc = &ctx->servers[chunk_owner(ctx, g)];
            push_buf *pb = chunk_push(ctx, g, from);
            psagg__msg_hdr *mh = (psagg__msg_hdr *)pb->buf;
            size_t len = sizeof *mh + mh->len;
            psagg_status st;
            if (last - from > 1 || mh->round != from) {
                worker_fail_all(ctx, PSAGG_EPROTO,
                                "tensor '%s' chunk %u moved to server %u from round %u; this "
                                "worker keeps its pushes of round %u on only",
                                ctx->layout.tensors[ci->key].name, ci->index, chunk_owner(ctx, g),
                                from, last ? last - 1 : 0);
                return 0;
            }
            if (pb->send_pending || sc->inflight >= ctx->cfg.max_inflight) {
                waiting = 1;
                break;
            }
            mh->epoch = (uint16_t)ctx->epoch;
            if (ctx->tag_bytes)
                psagg__node_seal(&ctx->node, &sc->push_key, ++sc->push_seq, pb->buf, len);
            pb->send_pending = 1;
            pb->to = chunk_owner(ctx, g);
            st = psagg__fabric_try_send(ctx->fab, sc->addr, pb->buf, len + ctx->tag_bytes, pb->desc,
                                        pb);
            if (st == PSAGG_EAGAIN) {
                pb->send_pending = 0;
                return 1;
            }
            if (st) {
                pb->send_pending = 0;
                failover_server_lost(ctx, (int)pb->to, psagg_last_error());
                return 1;
            }
            sc->inflight++;
            atomic_fetch_add(&ctx->bytes_sent, len);
            LOG_DEBUG(&ctx->log, "tensor '%s' chunk %u round %u pushed again to server %u",
                      ctx->layout.tensors[ci->key].name, ci->index, from, pb->to);
            from++;
        }
        if (!has_last || from > last) {
            fo->resend_from[g] = UINT32_MAX;
            fo->resends--;
        } else {
            fo->resend_from[g] = from;
        }
    }
    return waiting;
}

int failover_stale_update(psagg_ctx *ctx, const psagg__msg_hdr *mh)
{
    struct psagg__failover *fo = ctx->failover;
    const tensor_state *ts;
    const struct psagg_handle *h;
    if (!fo || ctx->epoch == 0 || mh->key >= ctx->layout.n_tensors)
        return 0;
    ts = &ctx->tensors[mh->key];
    h = ts->op;
    if (h ? mh->round < h->round || (mh->round == h->round && h->chunk_done[mh->chunk])
          : mh->round < ts->round) {
        fo->dropped++;
        return 1;
    }
    return 0;
}

int failover_lost(const psagg_ctx *ctx, int s)
{
    return ctx->failover && ctx->failover->lost[s];
}
