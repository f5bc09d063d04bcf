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
 * by round parity); an update of a round it has already applied is then dropped. The rounds
 * whose update some workers had from the lost owner and others not come from one worker that
 * has it (the view's relayer: it keeps its last two updates of each sum chunk), through the
 * new owner, which sends them on instead of its own sum.
 *
 * A server out of the view is connected again every half second (it may have been restarted):
 * HELLO as to a server that rejoins, the declaration, and once its READY comes, this worker
 * reports it back (SERVER_BACK phase 0) to the coordinator; when every worker has, the
 * coordinator asks each to hold its pushes of that server's chunks (phase 1) and takes their
 * rounds; the view that admits it moves the chunks back, as a takeover does.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/agree.h"
#include "runtime/channel.h"
#include "worker.h"

/* An update this worker applied, kept for a relay (failover_keep_update). */
struct kept_update {
    uint8_t *buf; /* header, payload, quorum bitmap (no MAC) */
    uint32_t len, cap;
};

/* A server, as this worker sees it. */
enum {
    S_IN,         /* in the view, connected */
    S_LOST,       /* lost here (reported), still in the view */
    S_OUT,        /* out of the view: connected again now and then */
    S_CONNECTING, /* out: a connection under way */
    S_DECLARED,   /* out: HELLO and DECLARE sent, its READY awaited */
    S_BACK,       /* out: READY came, reported back to the coordinator */
    S_HOLDING,    /* out: the coordinator asked for the hold: its chunks' pushes wait */
};

struct psagg__failover {
    psagg__acceptor acc;
    uint8_t *state;        /* per server (above) */
    int64_t *next;         /* per server: S_OUT the next attempt, S_BACK the next report,
                              S_CONNECTING when the attempt gives up */
    int *cfd;              /* per server: S_CONNECTING's socket (servers[s].fd once connected) */
    psagg__tcp_addr *addr; /* per server: its address, resolved at the first attempt */
    uint32_t *resend_from; /* per chunk: the round from which to push again, UINT32_MAX: none */
    /* per chunk: where its last move's relayed rounds end (the rounds before: relayed) */
    uint32_t *relay_end;
    uint32_t *prev_owner; /* per chunk: its owner before the view that moved it last */
    uint8_t *held;        /* per chunk: its pushes wait for the next view (a hold) */
    uint8_t *fresh; /* per server: it came back without parameter state (PSAGG_VIEW_LIVE_NEW) */
    /* per chunk x 2 (round parity): a sum chunk's last two updates applied */
    struct kept_update *kept;
    push_buf **copyq; /* parameter pushes waiting for room to go to a copy (send_pending 2) */
    uint32_t n_copyq;
    int resends;              /* chunks with one */
    uint64_t dropped;         /* updates of rounds applied already, dropped */
    psagg__ctl_declare *decl; /* the declaration, for a server that rejoins */
    size_t decl_bytes;
    /* psagg_close: this worker says DONE to every server of its view (done_sent, per server)
       and waits for one's DONE: every worker is done (finishing and all_done: ctx->mu's) */
    uint8_t *done_sent;
    int finishing, all_done;
};

/* How often a server out of the view is connected again, and how long an attempt may take. */
#define REJOIN_EVERY_MS   500
#define REJOIN_CONNECT_MS 2000

psagg_status failover_setup(psagg_ctx *ctx, const psagg__ctl_declare *d, size_t bytes)
{
    struct psagg__failover *fo;
    uint32_t n = ctx->layout.n_chunks ? ctx->layout.n_chunks : 1;
    size_t n_s = (size_t)ctx->cfg.n_servers;
    if (!ctx->cfg.server_replicas)
        return PSAGG_OK;
    if (!(fo = calloc(1, sizeof *fo)))
        return psagg__fail(PSAGG_ENOMEM, "the server views");
    ctx->failover = fo;
    fo->state = calloc(n_s, 1);
    fo->next = calloc(n_s, sizeof *fo->next);
    fo->cfd = malloc(n_s * sizeof *fo->cfd);
    for (size_t s = 0; fo->cfd && s < n_s; s++) /* (before any failure: failover_free closes) */
        fo->cfd[s] = -1;
    fo->addr = calloc(n_s, sizeof *fo->addr);
    fo->resend_from = malloc(n * sizeof *fo->resend_from);
    fo->relay_end = calloc(n, sizeof *fo->relay_end);
    fo->prev_owner = malloc(n * sizeof *fo->prev_owner);
    fo->held = calloc(n, 1);
    fo->fresh = calloc(n_s, 1);
    fo->copyq = calloc(2 * (size_t)n, sizeof *fo->copyq);
    fo->kept = calloc(2 * (size_t)n, sizeof *fo->kept);
    ctx->follow_round = malloc(2 * (size_t)n * sizeof *ctx->follow_round);
    ctx->follow_bits = calloc(2 * (size_t)n, ctx->follow_bytes ? ctx->follow_bytes : 1);
    fo->decl = malloc(bytes);
    fo->done_sent = calloc(n_s, 1);
    if (!fo->state || !fo->next || !fo->cfd || !fo->addr || !fo->resend_from || !fo->relay_end ||
        !fo->prev_owner || !fo->held || !fo->fresh || !fo->copyq || !fo->kept || !fo->decl ||
        !fo->done_sent || !ctx->follow_round || !ctx->follow_bits) {
        failover_free(ctx);
        return psagg__fail(PSAGG_ENOMEM, "the server views");
    }
    memcpy(fo->decl, d, bytes);
    fo->decl_bytes = bytes;
    for (size_t i = 0; i < 2 * (size_t)n; i++)
        ctx->follow_round[i] = UINT32_MAX;
    for (uint32_t g = 0; g < ctx->layout.n_chunks; g++) {
        fo->resend_from[g] = UINT32_MAX;
        fo->prev_owner[g] = UINT32_MAX;
    }
    psagg__acceptor_init(&fo->acc, 1);
    return PSAGG_OK;
}

void failover_free(psagg_ctx *ctx)
{
    struct psagg__failover *fo = ctx->failover;
    if (!fo)
        return;
    psagg__acceptor_free(&fo->acc);
    for (int s = 0; fo->cfd && s < ctx->cfg.n_servers; s++)
        if (fo->cfd[s] >= 0)
            close(fo->cfd[s]);
    free(fo->cfd);
    free(fo->addr);
    free(fo->state);
    free(fo->next);
    free(fo->resend_from);
    free(fo->relay_end);
    free(fo->prev_owner);
    free(fo->held);
    free(fo->fresh);
    free(fo->copyq);
    for (uint32_t i = 0; fo->kept && i < 2 * ctx->layout.n_chunks; i++)
        free(fo->kept[i].buf);
    free(fo->kept);
    free(ctx->follow_round);
    free(ctx->follow_bits);
    ctx->follow_round = NULL;
    ctx->follow_bits = NULL;
    free(fo->decl);
    free(fo->done_sent);
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
    ctx->ckpt.skip[s] = 0; /* (answers of that connection will never come) */
}

/* The coordinator of this worker's view (the lowest server in it and connected) but `but`. */
static int coordinator(const psagg_ctx *ctx, int but)
{
    for (int k = 0; k < ctx->cfg.n_servers; k++)
        if (ctx->failover->state[k] == S_IN && k != but)
            return k;
    return -1;
}

/*
 * Send the coordinator (but `but`) a report: SERVER_LOST or SERVER_BACK of server s, phase
 * `phase`, with this worker's rounds when `rounds`. A coordinator it cannot send to is lost in
 * turn (reported to the next). 0, or -1 when the job failed.
 */
static int report(psagg_ctx *ctx, uint16_t type, int s, uint32_t phase, int rounds)
{
    psagg__ctl_server_lost *sl;
    size_t len = sizeof *sl + (rounds ? (size_t)ctx->layout.n_chunks * sizeof(uint32_t) : 0);
    int to = coordinator(ctx, type == PSAGG_CTL_SERVER_LOST ? s : -1);
    if (to < 0) {
        worker_fail_all(ctx, PSAGG_EPEER, "every server is lost; the last, server %d", s);
        return -1;
    }
    if (!(sl = calloc(1, len))) {
        worker_fail_all(ctx, PSAGG_ENOMEM, "no memory to report server %d", s);
        return -1;
    }
    pthread_mutex_lock(&ctx->mu);
    *sl = (psagg__ctl_server_lost){.server = (uint32_t)s,
                                   .epoch = ctx->epoch,
                                   .n_chunks = rounds ? ctx->layout.n_chunks : 0,
                                   .phase = phase};
    for (uint32_t g = 0; rounds && g < ctx->layout.n_chunks; g++) {
        uint32_t r = next_update(ctx, g);
        memcpy((uint8_t *)(sl + 1) + (size_t)g * sizeof r, &r, sizeof r);
    }
    pthread_mutex_unlock(&ctx->mu);
    if (psagg__ctl_send(ctx->servers[to].fd, &ctx->servers[to].auth, type, sl, (uint32_t)len)) {
        char m[200];
        snprintf(m, sizeof m, "sending it %s: %s",
                 type == PSAGG_CTL_SERVER_LOST ? "SERVER_LOST" : "SERVER_BACK", psagg_last_error());
        free(sl);
        failover_server_lost(ctx, to, m);
        return worker_failed(ctx) ? -1 : 0;
    }
    free(sl);
    return 0;
}

/*
 * Server s is lost here: the pushes whose send to it is still under way are no longer held for
 * it (a stopped or cut-off server may never take them, and the same rounds must go to the new
 * owner from the same buffers): each such send is abandoned (push_ctx: its completion, if it
 * comes, is dropped) and a parameter push goes on to its next copy.
 */
static void abandon_sends(psagg_ctx *ctx, int s)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < ctx->layout.n_chunks; g++)
        for (int k = 0; k < 2; k++) {
            push_buf *pb = &ctx->chunks[g].p[k];
            if (pb->send_pending != 1 || pb->to != (uint32_t)s)
                continue;
            pb->gen++;
            pb->send_pending = 0;
            ctx->servers[s].inflight--;
            n++;
            failover_copy(ctx, pb);
        }
    if (n)
        LOG_INFO(&ctx->log, "%u push(es) still on their way to server %d: abandoned", n, s);
}

/*
 * ([server] quorum) Chunk g's update kept until this worker's push is encoded (updates.c's
 * keep_early), from an owner lost or moved away: never applied, as the rounds this worker
 * reports (next_update) say; the next owner sends that round.
 */
static void forget_early(psagg_ctx *ctx, uint32_t g)
{
    if (ctx->early && ctx->early[g]) {
        free(ctx->early[g]);
        ctx->early[g] = NULL;
    }
}

int failover_server_lost(psagg_ctx *ctx, int s, const char *why)
{
    struct psagg__failover *fo = ctx->failover;
    if (!fo)
        return 0;
    switch (fo->state[s]) {
    case S_IN:
        break;
    case S_CONNECTING:
    case S_DECLARED:
    case S_BACK:
    case S_HOLDING: /* a return that failed: connected again later (a hold ends with a view) */
        LOG_INFO(&ctx->log, "server %d, out of the view, did not come back: %s", s, why);
        close_server(ctx, s);
        fo->state[s] = S_OUT;
        fo->next[s] = psagg__now_ms() + 2 * REJOIN_EVERY_MS;
        return 1;
    default:
        return 1;
    }
    fo->state[s] = S_LOST;
    close_server(ctx, s);
    abandon_sends(ctx, s);
    for (uint32_t g = 0; g < ctx->layout.n_chunks; g++)
        if (ctx->owner[g] == (uint32_t)s)
            forget_early(ctx, g);
    LOG_WARN(&ctx->log, "lost server %d (%s): reporting it to server %d", s, why,
             coordinator(ctx, s));
    /* every server lost here and still in the view, s too: the coordinator may be new (s was
       it, or the one a report went to before it died) */
    for (int k = 0; k < ctx->cfg.n_servers && !worker_failed(ctx); k++)
        if (fo->state[k] == S_LOST)
            report(ctx, PSAGG_CTL_SERVER_LOST, k, 0, 1);
    return 1;
}

static uint32_t ring_offset(const psagg_ctx *ctx, uint32_t g, uint32_t s);
static void copy_kept(psagg_ctx *ctx, int s);

/* Whether chunk g has copies: a parameter's, or any when the servers keep a residual. */
static int has_copies(const psagg_ctx *ctx, uint32_t g)
{
    return ctx->server_residual || ctx->layout.tensors[ctx->layout.chunks[g].key].param;
}

/* Check a decided view's bytes against this job: NULL, or what is wrong. */
static const char *view_bad(const psagg_ctx *ctx, const uint8_t *v, uint32_t len,
                            psagg__view_hdr *vh)
{
    const uint8_t *live = v + sizeof *vh;
    const char *bad;
    if (len < sizeof *vh)
        return "shorter than its header";
    memcpy(vh, v, sizeof *vh);
    if (vh->n_servers != (uint32_t)ctx->cfg.n_servers || vh->n_chunks != ctx->layout.n_chunks ||
        vh->n_moves > vh->n_chunks || vh->n_workers != (uint32_t)ctx->world ||
        len != psagg__view_bytes(vh->n_servers, vh->n_chunks, vh->n_moves, vh->n_workers))
        return "fields n_servers, n_chunks, n_moves, n_workers do not match the job or its length";
    if ((bad = psagg__view_members_bad(v, vh, ctx->cfg.elastic)))
        return bad;
    for (uint32_t s = 0; s < vh->n_servers; s++)
        if (live[s] > PSAGG_VIEW_LIVE_NEW)
            return "a live[] byte is none of 0, 1, 2";
    for (uint32_t g = 0; g < vh->n_chunks; g++) {
        uint32_t o = psagg__view_owner(v, vh->n_servers, g);
        if (o >= vh->n_servers || !live[o] || (has_copies(ctx, g) && live[o] != PSAGG_VIEW_LIVE))
            return "a chunk's owner is not a live server (a chunk with copies: one live since "
                   "the start)";
    }
    for (uint32_t i = 0; i < vh->n_moves; i++) {
        psagg__view_move m = psagg__view_move_at(v, vh->n_servers, vh->n_chunks, i);
        if (m.chunk >= vh->n_chunks)
            return "a move names a chunk that does not exist";
        if (psagg__view_relay_bad(&m, (uint32_t)ctx->world, has_copies(ctx, m.chunk),
                                  ctx->follow_bytes != 0))
            return "a move's relayed rounds are not 0..2 rounds from its start by a worker of the "
                   "job (none for a chunk with copies, whose copy may follow them under a quorum)";
    }
    return NULL;
}

/*
 * This worker relays move m's rounds (view `epoch`): to the chunk's new owner, a STATE RELAY of
 * each round's update it keeps (out_len 0 for one it has no more: the new owner fails the job).
 */
static void relay_updates(psagg_ctx *ctx, const psagg__view_move *m, uint32_t epoch)
{
    const psagg__chunk_info *ci = &ctx->layout.chunks[m->chunk];
    server_conn *sc = &ctx->servers[m->owner];
    if (failover_lost(ctx, (int)m->owner) || sc->fd < 0)
        return; /* (lost here too: the next view moves it again) */
    for (uint32_t r = m->start; r < m->relay_end; r++) {
        const struct kept_update *k = &ctx->failover->kept[2 * (size_t)m->chunk + (r & 1)];
        const psagg__msg_hdr *mh = (const psagg__msg_hdr *)k->buf;
        int has =
            k->buf && mh->round == r && sizeof(psagg__ctl_state) + k->len <= PSAGG_CTL_MAX_FRAME;
        psagg__ctl_state sh = {.kind = PSAGG_STATE_RELAY,
                               .server = m->owner,
                               .epoch = epoch,
                               .chunk = m->chunk,
                               .round = r,
                               .out_len = has ? k->len : 0};
        uint8_t *frame = malloc(sizeof sh + sh.out_len);
        psagg_status st;
        if (!frame) {
            worker_fail_all(ctx, PSAGG_ENOMEM, "no memory to relay an update");
            return;
        }
        memcpy(frame, &sh, sizeof sh);
        if (has)
            memcpy(frame + sizeof sh, k->buf, k->len);
        st = psagg__ctl_send(sc->fd, &sc->auth, PSAGG_CTL_STATE, frame,
                             (uint32_t)(sizeof sh + sh.out_len));
        free(frame);
        if (st) {
            failover_server_lost(ctx, (int)m->owner, psagg_last_error());
            return;
        }
        if (has)
            LOG_INFO(&ctx->log,
                     "tensor '%s' chunk %u: round %u's update relayed to server %u (%u bytes)",
                     ctx->layout.tensors[ci->key].name, ci->index, r, m->owner, sh.out_len);
        else
            LOG_INFO(&ctx->log,
                     "tensor '%s' chunk %u: round %u's update is no longer here (not relayed to "
                     "server %u)",
                     ctx->layout.tensors[ci->key].name, ci->index, r, m->owner);
    }
}

void failover_keep_update(psagg_ctx *ctx, uint32_t g, const uint8_t *msg, size_t len)
{
    struct psagg__failover *fo = ctx->failover;
    struct kept_update *k;
    uint32_t round = ((const psagg__msg_hdr *)msg)->round;
    if (fo && has_copies(ctx, g) && ctx->follow_bytes) { /* its bitmap, for the trailers */
        size_t i = 2 * (size_t)g + (round & 1);
        ctx->follow_round[i] = round;
        memcpy(ctx->follow_bits + i * ctx->follow_bytes, msg + len - ctx->follow_bytes,
               ctx->follow_bytes);
    }
    if (!fo || has_copies(ctx, g))
        return;
    k = &fo->kept[2 * (size_t)g + (((const psagg__msg_hdr *)msg)->round & 1)];
    if (k->cap < len) {
        uint8_t *b = realloc(k->buf, len);
        if (!b) { /* (not kept: relayed as "none", which fails the job if it is needed) */
            free(k->buf);
            *k = (struct kept_update){0};
            return;
        }
        k->buf = b;
        k->cap = (uint32_t)len;
    }
    memcpy(k->buf, msg, len);
    k->len = (uint32_t)len;
}

/*
 * The epoch of view v, and the members it names (elastic jobs: every membership change is a
 * view), taken at once: the live ranks change, and a view without this worker ends it: a
 * failure, or, once it is done (psagg_close), its leave. 1 when this worker is out.
 */
static int take_members(psagg_ctx *ctx, const uint8_t *v, const psagg__view_hdr *vh)
{
    struct psagg__failover *fo = ctx->failover;
    const uint8_t *member = v + psagg__view_members_at(vh->n_servers, vh->n_chunks, vh->n_moves);
    char left[96] = "", joined[96] = "";
    size_t nl = 0, nj = 0;
    int rank = 0;
    if (!member[ctx->rank] && ctx->joiner && !ctx->declared) {
        LOG_INFO(&ctx->log, "view %u does not admit this worker yet", vh->epoch);
        return 1; /* (one decided while its admission was proposed) */
    }
    if (!ctx->cfg.elastic) {
        pthread_mutex_lock(&ctx->mu);
        ctx->epoch = vh->epoch;
        pthread_mutex_unlock(&ctx->mu);
        return 0;
    }
    for (int w = 0; w < ctx->world; w++) {
        if (ctx->live[w] && !member[w])
            nl = psagg__list_int(left, sizeof left, nl, w);
        if (!ctx->live[w] && member[w])
            nj = psagg__list_int(joined, sizeof joined, nj, w);
        rank += w < ctx->rank && member[w];
    }
    pthread_mutex_lock(&ctx->mu);
    ctx->epoch = vh->epoch;
    memcpy(ctx->live, member, (size_t)ctx->world);
    ctx->n_live = (int)vh->n_members;
    if (!member[ctx->rank]) {
        if (fo->finishing && !fo->all_done) {
            fo->all_done = 1;
            LOG_INFO(&ctx->log, "view %u: this worker, done while the others run on, leaves",
                     vh->epoch);
            pthread_cond_broadcast(&ctx->cv);
            pthread_mutex_unlock(&ctx->mu);
            return 1;
        }
        pthread_mutex_unlock(&ctx->mu);
        worker_fail_all(ctx, PSAGG_EPEER,
                        "view %u removed this worker from the job (the coordinator of the server "
                        "view lost it)",
                        vh->epoch);
        return 1;
    }
    pthread_mutex_unlock(&ctx->mu);
    if (!nl && !nj)
        return 0;
    LOG_WARN(&ctx->log, "membership in view %u:%s%s%s%s; %u workers now, this one is rank %d",
             vh->epoch, nl ? " workers " : "", left, nj ? " joined: " : (nl ? " left" : ""), joined,
             vh->n_members, rank);
    return 0;
}

/* Take the decided view v (of epoch acc.epoch - 1): owners, epoch, re-sends, relays, reports. */
static void take_view(psagg_ctx *ctx, int from, const uint8_t *v, uint32_t len)
{
    struct psagg__failover *fo = ctx->failover;
    psagg__view_hdr vh;
    const uint8_t *live;
    const char *bad = view_bad(ctx, v, len, &vh);
    psagg__ctl_agree a;
    uint8_t *frame;
    int64_t now = psagg__now_ms();
    uint64_t with_state = 0;

    if (bad) {
        worker_fail_all(ctx, PSAGG_EPROTO, "server %d: a decided view: %s", from, bad);
        return;
    }
    live = v + sizeof vh;
    for (uint32_t g = 0; g < vh.n_chunks; g++) {
        uint32_t o = psagg__view_owner(v, vh.n_servers, g);
        if (o != ctx->owner[g]) {
            fo->prev_owner[g] = ctx->owner[g];
            forget_early(ctx, g);
        }
        ctx->owner[g] = o;
    }
    for (uint32_t i = 0; i < vh.n_moves; i++) {
        psagg__view_move m = psagg__view_move_at(v, vh.n_servers, vh.n_chunks, i);
        if (fo->resend_from[m.chunk] == UINT32_MAX)
            fo->resends++;
        fo->resend_from[m.chunk] = m.start;
        fo->relay_end[m.chunk] = m.relay_end;
    }
    memset(fo->held, 0, ctx->layout.n_chunks); /* a view ends every hold */
    if (take_members(ctx, v, &vh))
        return;
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        uint8_t *st = &fo->state[s];
        fo->fresh[s] = live[s] == PSAGG_VIEW_LIVE_NEW;
        if (live[s] && (*st == S_BACK || *st == S_HOLDING)) { /* admitted */
            *st = S_IN;
            ctx->servers[s].heard_at = now;
            LOG_WARN(&ctx->log, "server %d is back in view %u", s, vh.epoch);
            if (live[s] == PSAGG_VIEW_LIVE) /* (with its chunks' state) */
                with_state |= UINT64_C(1) << s;
        } else if (live[s] && *st != S_IN && *st != S_LOST) { /* (its return failed here) */
            close_server(ctx, s);
            if (fo->cfd[s] >= 0) /* (a connection under way: S_CONNECTING) */
                close(fo->cfd[s]);
            fo->cfd[s] = -1;
            *st = S_LOST;
        } else if (!live[s] && (*st == S_IN || *st == S_LOST)) {
            close_server(ctx, s);
            abandon_sends(ctx, s); /* (a lost one's too: pushes sent again since it was lost) */
            *st = S_OUT;
            fo->next[s] = now + REJOIN_EVERY_MS;
        } else if (!live[s] && *st == S_HOLDING) { /* that view was not this one */
            *st = S_BACK;
            fo->next[s] = now;
        }
    }
    LOG_WARN(&ctx->log, "server view %u: %u chunk(s) moved", vh.epoch, vh.n_moves);
    /* relay it to the other servers in it: each applies it before the pushes of the new view */
    a = (psagg__ctl_agree){.kind = PSAGG_AGREE_DECIDED, .epoch = vh.epoch, .value_len = len};
    if (!(frame = malloc(sizeof a + len))) {
        worker_fail_all(ctx, PSAGG_ENOMEM, "no memory to relay view %u", vh.epoch);
        return;
    }
    memcpy(frame, &a, sizeof a);
    memcpy(frame + sizeof a, v, len);
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (s != from && fo->state[s] == S_IN && ctx->servers[s].fd >= 0 &&
            psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_VIEW, frame,
                            (uint32_t)(sizeof a + len)))
            LOG_WARN(&ctx->log, "relaying view %u to server %d: %s", vh.epoch, s,
                     psagg_last_error());
    free(frame);
    for (uint32_t i = 0; i < vh.n_moves && !worker_failed(ctx); i++) {
        psagg__view_move m = psagg__view_move_at(v, vh.n_servers, vh.n_chunks, i);
        if (m.relay_end > m.start && m.relayer == (uint32_t)ctx->rank)
            relay_updates(ctx, &m, vh.epoch);
    }
    for (int s = 0; s < ctx->cfg.n_servers; s++)
        if (with_state >> s & 1)
            copy_kept(ctx, s);
    /* what the coordinator decides one at a time: a loss not in this view, a return */
    for (int s = 0; s < ctx->cfg.n_servers && !worker_failed(ctx); s++)
        if (fo->state[s] == S_LOST)
            report(ctx, PSAGG_CTL_SERVER_LOST, s, 0, 1);
}

/* The state, for a frame (`name`) of server s of at least `need` bytes in a job with replicas;
   else the job failed: NULL. */
static struct psagg__failover *frame_of(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, size_t need,
                                        const char *name)
{
    if (ctx->failover && h->len >= need)
        return ctx->failover;
    worker_fail_all(ctx, PSAGG_EPROTO, "server %d sent %s frame of %u bytes%s", s, name, h->len,
                    ctx->failover ? "" : " in a job without server_replicas");
    return NULL;
}

void failover_agree(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body)
{
    struct psagg__failover *fo = frame_of(ctx, s, h, sizeof(psagg__ctl_agree), "an AGREE");
    psagg__ctl_agree a;
    psagg__agree_msg in, out;
    int r;
    if (!fo)
        return;
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

void failover_back(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body)
{
    struct psagg__failover *fo = ctx->failover;
    psagg__ctl_server_lost sl;
    uint32_t n = 0;
    if (!fo || h->len != sizeof sl) {
        worker_fail_all(ctx, PSAGG_EPROTO, "server %d sent a SERVER_BACK frame of %u bytes%s", s,
                        h->len, fo ? "" : " in a job without server_replicas");
        return;
    }
    memcpy(&sl, body, sizeof sl);
    if (sl.phase != 1 || sl.n_chunks || sl.server >= (uint32_t)ctx->cfg.n_servers ||
        (int)sl.server == s) {
        worker_fail_all(ctx, PSAGG_EPROTO,
                        "server %d: SERVER_BACK fields phase, n_chunks, server: %u, %u, %u", s,
                        sl.phase, sl.n_chunks, sl.server);
        return;
    }
    if (sl.epoch != ctx->epoch || coordinator(ctx, -1) != s)
        return; /* (an ask of a view gone by) */
    /* from now until the next view, no push of its chunks goes to their owner of this one, nor
       of a chunk with copies whose state it holds (relayed to it meanwhile: STATE); under
       [server] quorum none, since none moves back (server/failover.c, make_view) */
    for (uint32_t g = 0; g < ctx->layout.n_chunks && !ctx->quorum; g++)
        if (has_copies(ctx, g)
                ? ring_offset(ctx, g, sl.server) <= (uint32_t)ctx->cfg.server_replicas
                : ctx->layout.chunks[g].owner == sl.server && ctx->owner[g] != sl.server) {
            fo->held[g] = 1;
            n++;
        }
    if (fo->state[sl.server] == S_BACK)
        fo->state[sl.server] = S_HOLDING;
    LOG_INFO(&ctx->log, "server %u comes back: %u chunk(s) held until the next view", sl.server, n);
    report(ctx, PSAGG_CTL_SERVER_BACK, (int)sl.server, 1, 1);
}

/* Send a STATE frame on to server `to`; a send that fails loses it here. */
static void relay_state(psagg_ctx *ctx, int to, const psagg__ctl_hdr *h, const void *body)
{
    if (ctx->servers[to].fd < 0)
        return;
    if (psagg__ctl_send(ctx->servers[to].fd, &ctx->servers[to].auth, PSAGG_CTL_STATE, body, h->len))
        failover_server_lost(ctx, to, psagg_last_error());
}

void failover_state(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body)
{
    struct psagg__failover *fo = frame_of(ctx, s, h, sizeof(psagg__ctl_state), "a STATE");
    psagg__ctl_state sh;
    if (!fo)
        return;
    memcpy(&sh, body, sizeof sh);
    if (sh.server >= (uint32_t)ctx->cfg.n_servers ||
        (sh.kind == PSAGG_STATE_DONE && sh.server != (uint32_t)s)) {
        worker_fail_all(ctx, PSAGG_EPROTO, "server %d: STATE fields kind, server: %u, %u", s,
                        sh.kind, sh.server);
        return;
    }
    switch (sh.kind) {
    case PSAGG_STATE_ASK: /* the coordinator's: to every server of the view (it too) */
        LOG_INFO(&ctx->log, "server %u comes back: relaying the state of its chunks to it",
                 sh.server);
        for (int k = 0; k < ctx->cfg.n_servers; k++)
            if (fo->state[k] == S_IN)
                relay_state(ctx, k, h, body);
        break;
    case PSAGG_STATE_CHUNK: /* an owner's: to the server that comes back */
        if (fo->state[sh.server] == S_HOLDING)
            relay_state(ctx, (int)sh.server, h, body);
        break;
    case PSAGG_STATE_DONE: /* the returning server's: to the coordinator */
        if (coordinator(ctx, -1) >= 0)
            relay_state(ctx, coordinator(ctx, -1), h, body);
        break;
    default:
        worker_fail_all(ctx, PSAGG_EPROTO, "server %d: STATE field kind: %u", s, sh.kind);
    }
}

int failover_ready(psagg_ctx *ctx, int s)
{
    struct psagg__failover *fo = ctx->failover;
    if (!fo || fo->state[s] != S_DECLARED)
        return 0;
    fo->state[s] = S_BACK;
    fo->next[s] = psagg__now_ms() + ctx->cfg.op_timeout_ms / 2;
    LOG_WARN(&ctx->log, "server %d is back (READY): reporting it to server %d", s,
             coordinator(ctx, -1));
    report(ctx, PSAGG_CTL_SERVER_BACK, s, 0, 0);
    return 1;
}

/* Connect again to server s, out of the view; its READY comes on the control connection. */
static void rejoin_step(psagg_ctx *ctx, int s, int64_t now)
{
    struct psagg__failover *fo = ctx->failover;
    server_conn *sc = &ctx->servers[s];
    psagg_status st;
    int r;
    if (fo->state[s] == S_OUT) {
        fo->next[s] = now + REJOIN_EVERY_MS;
        if (psagg__tcp_connect_start(&ctx->cfg.servers[s], &fo->addr[s], &fo->cfd[s])) {
            LOG_DEBUG(&ctx->log, "server %d: %s", s, psagg_last_error());
            fo->cfd[s] = -1;
            return;
        }
        fo->state[s] = S_CONNECTING;
        fo->next[s] = now + REJOIN_CONNECT_MS;
    }
    r = psagg__tcp_connect_done(fo->cfd[s]);
    if (r == 0 && now < fo->next[s])
        return;
    if (r <= 0) {
        LOG_DEBUG(&ctx->log, "server %d is not back: %s", s,
                  r ? psagg_last_error() : "no connection");
        close(fo->cfd[s]);
        fo->cfd[s] = -1;
        fo->state[s] = S_OUT;
        fo->next[s] = now + REJOIN_EVERY_MS;
        return;
    }
    /* the server speaks first: wait for its CHALLENGE here, not in hello_declare, whose wait
       would keep this thread from everything else (a stopped server's kernel accepts) */
    {
        struct pollfd p = {.fd = fo->cfd[s], .events = POLLIN};
        if (poll(&p, 1, 0) == 0) {
            if (now < fo->next[s])
                return;
            LOG_DEBUG(&ctx->log, "server %d accepts but says nothing (stopped?)", s);
            close(fo->cfd[s]);
            fo->cfd[s] = -1;
            fo->state[s] = S_OUT;
            fo->next[s] = now + 4 * REJOIN_EVERY_MS;
            return;
        }
    }
    close_server(ctx, s);
    sc->fd = fo->cfd[s];
    fo->cfd[s] = -1;
    if ((st = hello_declare(ctx, s, fo->decl, fo->decl_bytes,
                            now + psagg__ping_interval_ms(ctx->cfg.op_timeout_ms), HELLO_REJOIN))) {
        /* (another configuration, a refusal: an operator's mistake, said louder) */
        if (hello_transient(st))
            LOG_INFO(&ctx->log, "server %d answers, but not as a server that rejoins: %s", s,
                     psagg_last_error());
        else
            LOG_WARN(&ctx->log, "server %d answers, but cannot rejoin: %s (tried again later)", s,
                     psagg_last_error());
        close_server(ctx, s);
        fo->state[s] = S_OUT;
        fo->next[s] = now + 4 * REJOIN_EVERY_MS;
        return;
    }
    fo->state[s] = S_DECLARED;
    sc->heard_at = now;
    LOG_INFO(&ctx->log, "server %d answers again: declared, waiting for its READY", s);
}

void failover_tick(psagg_ctx *ctx, int64_t now)
{
    struct psagg__failover *fo = ctx->failover;
    int finishing;
    if (!fo || worker_failed(ctx))
        return;
    pthread_mutex_lock(&ctx->mu);
    finishing = fo->finishing && !fo->all_done;
    pthread_mutex_unlock(&ctx->mu);
    for (int s = 0; s < ctx->cfg.n_servers; s++) {
        if ((fo->state[s] == S_OUT && now >= fo->next[s]) || fo->state[s] == S_CONNECTING)
            rejoin_step(ctx, s, now);
        else if (fo->state[s] == S_BACK && now >= fo->next[s]) { /* (not taken up yet) */
            fo->next[s] = now + ctx->cfg.op_timeout_ms / 2;
            report(ctx, PSAGG_CTL_SERVER_BACK, s, 0, 0);
        }
        if (fo->state[s] != S_IN) /* (a server back in a later view is told again) */
            fo->done_sent[s] = 0;
        else if (finishing && !fo->done_sent[s] && ctx->servers[s].fd >= 0) {
            fo->done_sent[s] = 1;
            if (psagg__ctl_send(ctx->servers[s].fd, &ctx->servers[s].auth, PSAGG_CTL_DONE, NULL, 0))
                failover_server_lost(ctx, s, psagg_last_error());
        }
    }
}

int failover_done(psagg_ctx *ctx, int s)
{
    struct psagg__failover *fo = ctx->failover;
    int took;
    if (!fo)
        return 0;
    pthread_mutex_lock(&ctx->mu);
    took = fo->finishing && fo->done_sent[s];
    if (took && !fo->all_done) {
        fo->all_done = 1;
        LOG_INFO(&ctx->log, "server %d: every worker is done with its rounds", s);
        pthread_cond_broadcast(&ctx->cv);
    }
    pthread_mutex_unlock(&ctx->mu);
    return took;
}

void failover_finish(psagg_ctx *ctx)
{
    struct psagg__failover *fo = ctx->failover;
    int64_t t0 = psagg__now_ms();
    if (!fo)
        return;
    pthread_mutex_lock(&ctx->mu);
    fo->finishing = 1;
    if (!ctx->failed)
        LOG_INFO(&ctx->log, "psagg_close: waiting for every worker to be done with its rounds "
                            "([cluster] server_replicas: this worker's last pushes are summed "
                            "again if a server dies before the others have its updates)");
    while (!fo->all_done && !ctx->failed) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until); /* (ctx->cv's clock) */
        until.tv_sec += 10;
        if (pthread_cond_timedwait(&ctx->cv, &ctx->mu, &until) == ETIMEDOUT && !fo->all_done &&
            !ctx->failed)
            LOG_INFO(&ctx->log,
                     "psagg_close: still waiting after %lld s for the other workers to "
                     "be done (one that evaluates or saves first keeps the rest here)",
                     (long long)(psagg__now_ms() - t0) / 1000);
    }
    if (fo->all_done)
        LOG_INFO(&ctx->log, "psagg_close: every worker is done (waited %lld ms)",
                 (long long)(psagg__now_ms() - t0));
    pthread_mutex_unlock(&ctx->mu);
}

/* The last round of chunk g this worker pushed, in *last: 0 if none (a push not sent yet, or
   held, is not one). */
static int last_pushed(const psagg_ctx *ctx, uint32_t g, uint32_t *last)
{
    const psagg__chunk_info *ci = &ctx->layout.chunks[g];
    const tensor_state *ts = &ctx->tensors[ci->key];
    const struct psagg_handle *h = ts->op;
    if (h && h->encoded && h->next_send > ci->index)
        return *last = h->round, 1;
    if (h)
        return *last = h->round - 1, h->round > 0;
    return *last = ts->round - 1, ts->round > 0;
}

/*
 * Server s came back with the state of its chunks with copies (PSAGG_VIEW_LIVE): the pushes
 * this worker keeps of those it copies go to it too (as copies: after their owner's send), since
 * it runs their rounds from the round its state is at (the pushes of rounds before are dropped
 * there); the pushes still to come go to it with the others.
 */
static void copy_kept(psagg_ctx *ctx, int s)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < ctx->layout.n_chunks; g++) {
        uint32_t d = ring_offset(ctx, g, (uint32_t)s), last;
        if (!has_copies(ctx, g) || d > (uint32_t)ctx->cfg.server_replicas ||
            chunk_owner(ctx, g) == (uint32_t)s || !last_pushed(ctx, g, &last))
            continue;
        for (uint32_t r = last > 0 ? last - 1 : 0; r <= last; r++) {
            push_buf *pb = chunk_push(ctx, g, r);
            if (((const psagg__msg_hdr *)pb->buf)->round != r ||
                !(pb->sent_to & ~(UINT64_C(1) << d)))
                continue; /* (not this round's, or never sent) */
            pb->sent_to &= ~(UINT64_C(1) << d);
            n++;
            if (!pb->send_pending)
                failover_copy(ctx, pb);
        }
    }
    LOG_INFO(&ctx->log, "server %d is back with its chunks' state: %u kept push(es) sent to it", s,
             n);
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
        uint32_t from = fo->resend_from[g], last;
        int has_last;
        if (from == UINT32_MAX)
            continue;
        has_last = last_pushed(ctx, g, &last);
        if (failover_lost(ctx, (int)chunk_owner(ctx, g)))
            continue; /* (its new owner is lost here too: the next view moves it again) */
        while (has_last && from <= last) {
            server_conn *sc = &ctx->servers[chunk_owner(ctx, g)];
            push_buf *pb = chunk_push(ctx, g, from);
            const psagg__msg_hdr *mh = (const psagg__msg_hdr *)pb->buf;
            psagg_status st;
            if ((last - from > 1 || mh->round != from) && from < fo->relay_end[g]) {
                from++; /* (a relayed round this worker no longer keeps, or never pushed (a
                           quorum's): the others' pushes again are the sign that they took
                           the view, and its update comes relayed) */
                continue;
            }
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
            failover_pushed(ctx, pb, g);
            st = push_send(ctx, pb, chunk_owner(ctx, g));
            if (st) { /* (the rounds sent so far are not sent again) */
                fo->resend_from[g] = from;
                if (st != PSAGG_EAGAIN)
                    failover_server_lost(ctx, (int)pb->to, psagg_last_error());
                return 1;
            }
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

/* Server s's offset on the ring from chunk g's layout owner. */
static uint32_t ring_offset(const psagg_ctx *ctx, uint32_t g, uint32_t s)
{
    uint32_t n = (uint32_t)ctx->cfg.n_servers;
    return (s + n - ctx->layout.chunks[g].owner) % n;
}

void failover_pushed(psagg_ctx *ctx, push_buf *pb, uint32_t g)
{
    if (ctx->failover)
        pb->sent_to |= UINT64_C(1) << ring_offset(ctx, g, chunk_owner(ctx, g));
}

/*
 * The next server that pb's push of chunk g (has_copies) goes to: a copy of the chunk (one of
 * the server_replicas servers after its layout owner, in this view since the start, not lost
 * here, not its owner) that it has not gone to, or -1.
 */
static int next_copy(const psagg_ctx *ctx, const push_buf *pb, uint32_t g)
{
    const struct psagg__failover *fo = ctx->failover;
    uint32_t n = (uint32_t)ctx->cfg.n_servers;
    if (!has_copies(ctx, g))
        return -1;
    for (uint32_t d = 0; d <= (uint32_t)ctx->cfg.server_replicas; d++) {
        uint32_t s = (ctx->layout.chunks[g].owner + d) % n;
        if (s != chunk_owner(ctx, g) && fo->state[s] == S_IN && !fo->fresh[s] &&
            !(pb->sent_to & (UINT64_C(1) << d)))
            return (int)s;
    }
    return -1;
}

/* The chunk whose push buffer pb is (chunk_buf: two by round parity). */
static uint32_t push_chunk(const psagg_ctx *ctx, const push_buf *pb)
{
    return (uint32_t)((pb - &ctx->chunks[0].p[0]) / 2);
}

/*
 * Where copies follow their owner (ctx->follow_bytes), the owner's send comes after the copies'
 * (wire.h): -1 while pb has gone to chunk g's owner or the owner is lost here (the next view
 * moves the chunk, and the pushes go to its new owner again), else the owner.
 */
static int owner_last(const psagg_ctx *ctx, const push_buf *pb, uint32_t g)
{
    uint32_t o = chunk_owner(ctx, g);
    if (!ctx->follow_bytes || (pb->sent_to & (UINT64_C(1) << ring_offset(ctx, g, o))) ||
        ctx->failover->state[o] != S_IN)
        return -1;
    return (int)o;
}

uint32_t failover_first(psagg_ctx *ctx, push_buf *pb, uint32_t g)
{
    int s = ctx->failover && ctx->follow_bytes ? next_copy(ctx, pb, g) : -1;
    uint32_t to = s >= 0 ? (uint32_t)s : chunk_owner(ctx, g);
    if (ctx->failover)
        pb->sent_to |= UINT64_C(1) << ring_offset(ctx, g, to);
    return to;
}

/*
 * Send pb's push on to its next copies (and then, where copies follow, to its owner), until
 * one send is under way (1) or must wait for room or for the next view (send_pending 2, in
 * copyq: 2), or none is left (0). A server a send fails to is lost here.
 */
static int copy_step(psagg_ctx *ctx, push_buf *pb)
{
    uint32_t g = push_chunk(ctx, pb);
    int s;
    while (!worker_failed(ctx) &&
           ((s = next_copy(ctx, pb, g)) >= 0 || (s = owner_last(ctx, pb, g)) >= 0)) {
        /* (a chunk held for a server that comes back goes to no owner until the next view) */
        psagg_status st = ctx->servers[s].inflight < ctx->cfg.max_inflight &&
                                  !(s == (int)chunk_owner(ctx, g) && failover_held(ctx, g))
                              ? push_send(ctx, pb, (uint32_t)s)
                              : PSAGG_EAGAIN;
        if (st == PSAGG_EAGAIN) {
            pb->send_pending = 2;
            return 2;
        }
        pb->sent_to |= UINT64_C(1) << ring_offset(ctx, g, (uint32_t)s);
        if (!st)
            return 1;
        failover_server_lost(ctx, s, psagg_last_error());
    }
    pb->send_pending = 0;
    return 0;
}

void failover_copy(psagg_ctx *ctx, push_buf *pb)
{
    struct psagg__failover *fo = ctx->failover;
    if (fo && copy_step(ctx, pb) == 2)
        fo->copyq[fo->n_copyq++] = pb;
}

int failover_send_copies(psagg_ctx *ctx)
{
    struct psagg__failover *fo = ctx->failover;
    uint32_t kept = 0;
    if (!fo)
        return 0;
    for (uint32_t i = 0; i < fo->n_copyq; i++)
        if (copy_step(ctx, fo->copyq[i]) == 2)
            fo->copyq[kept++] = fo->copyq[i];
    fo->n_copyq = kept;
    return kept > 0;
}

int failover_stale_update(psagg_ctx *ctx, const psagg__msg_hdr *mh, int from)
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
    if (mh->chunk < ctx->layout.tensors[mh->key].n_chunks &&
        fo->prev_owner[ctx->layout.tensors[mh->key].first_chunk + mh->chunk] == (uint32_t)from) {
        fo->dropped++; /* the owner before the view: its new owner sends the round again */
        return 1;
    }
    return 0;
}

int failover_held(const psagg_ctx *ctx, uint32_t g)
{
    return ctx->failover && ctx->failover->held[g];
}

int failover_deciding(const psagg_ctx *ctx)
{
    for (int s = 0; ctx->failover && s < ctx->cfg.n_servers; s++)
        if (ctx->failover->state[s] == S_LOST)
            return 1;
    return 0;
}

int failover_lost(const psagg_ctx *ctx, int s)
{
    return ctx->failover && ctx->failover->state[s] != S_IN;
}

int failover_coordinator(const psagg_ctx *ctx)
{
    for (int s = 0; ctx->failover && s < ctx->cfg.n_servers; s++)
        if (ctx->failover->state[s] == S_IN || ctx->failover->state[s] == S_LOST)
            return s;
    return 0; /* (no views: every server is in the layout's) */
}

int failover_waits_ready(const psagg_ctx *ctx, int s)
{
    return ctx->failover && ctx->failover->state[s] == S_DECLARED;
}
