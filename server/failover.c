/*
 * failover.c - servers that fail ([cluster] server_replicas; docs/design.md, "Servers that
 * fail and join"), on the control thread.
 *
 * The coordinator's side: a worker that lost a server reports it (SERVER_LOST, with the round
 * of the next update it takes of every chunk) to the lowest live server but that one; once
 * every worker has, that server proposes the next view (the lost server out, each of its
 * chunks to the first live server after the chunk's layout owner that holds its standby
 * state, from the lowest round reported) and has it decided by the workers (runtime/agree.c,
 * AGREE frames: the workers accept, a majority decides), then sends the decision to them all.
 * Every server's side: a decided view (its own, or relayed by a worker: VIEW) is applied
 * once, in order: a chunk it now owns starts at the view's round (its standby state becomes
 * routed: srv->route), and the push headers' epoch becomes the view's, so that a push of the
 * new view waits (progress.c) until the view is applied here.
 *
 * What is not built yet: a second loss while one is decided (the job fails naming both), a
 * worker that dies meanwhile, moving chunks back, servers that join.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/agree.h"
#include "runtime/channel.h"
#include "server.h"

struct failover {
    uint32_t epoch;  /* the view applied here (0: the layout's) */
    uint8_t *live;   /* per server, in that view */
    uint32_t *owner; /* per chunk of the layout, in that view */
    uint8_t *last;   /* the view decided for `epoch` (NULL at 0) */
    uint32_t last_len;
    /* the coordinator's: a loss being decided */
    int lost;          /* the server, or -1 */
    uint8_t *reported; /* per worker: its SERVER_LOST came */
    uint32_t *start;   /* per chunk: the lowest next-update round reported */
    int64_t since;     /* the first report */
    int proposing;
    int64_t retry_at; /* 0, or when to propose again (an attempt lost) */
    psagg__proposer prop;
};

static struct failover *fo_get(server *srv)
{
    struct failover *fo = srv->failover;
    uint32_t n = srv->layout.n_chunks;
    if (fo)
        return fo;
    if (!(fo = calloc(1, sizeof *fo)))
        return NULL;
    fo->live = malloc((size_t)srv->cfg.n_servers);
    fo->owner = malloc((size_t)(n ? n : 1) * sizeof *fo->owner);
    fo->start = malloc((size_t)(n ? n : 1) * sizeof *fo->start);
    fo->reported = calloc((size_t)srv->n_workers, 1);
    if (!fo->live || !fo->owner || !fo->start || !fo->reported) {
        free(fo->live), free(fo->owner), free(fo->start), free(fo->reported), free(fo);
        return NULL;
    }
    memset(fo->live, 1, (size_t)srv->cfg.n_servers);
    for (uint32_t g = 0; g < n; g++)
        fo->owner[g] = srv->layout.chunks[g].owner;
    fo->lost = -1;
    psagg__proposer_init(&fo->prop, (uint32_t)srv->rank);
    srv->failover = fo;
    return fo;
}

void failover_fini(server *srv)
{
    struct failover *fo = srv->failover;
    if (!fo)
        return;
    psagg__proposer_free(&fo->prop);
    free(fo->live), free(fo->owner), free(fo->last), free(fo->start), free(fo->reported);
    free(fo);
    srv->failover = NULL;
}

/* The lowest live server of the view but `but`, or -1. */
static int coordinator(const server *srv, const struct failover *fo, int but)
{
    for (int s = 0; s < srv->cfg.n_servers; s++)
        if (fo->live[s] && s != but)
            return s;
    return -1;
}

/* Send an AGREE (with its view, when it carries one) to worker w; a failed send closes it. */
static void send_agree(server *srv, int w, const psagg__agree_msg *m)
{
    worker_conn *wc = &srv->workers[w];
    size_t len = sizeof(psagg__ctl_agree) + m->value_len;
    psagg__ctl_agree *a;
    if (wc->fd < 0 || wc->state == W_BYE || wc->state == W_DEAD)
        return;
    if (!(a = calloc(1, len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for an AGREE frame");
        return;
    }
    *a = (psagg__ctl_agree){.kind = m->kind,
                            .epoch = m->epoch,
                            .ballot = m->ballot,
                            .accepted = m->accepted,
                            .value_len = m->value_len};
    if (m->value_len)
        memcpy(a + 1, m->value, m->value_len);
    if (psagg__ctl_send(wc->fd, &wc->auth, PSAGG_CTL_AGREE, a, (uint32_t)len))
        server_close_worker(srv, w, "sending AGREE: %s", psagg_last_error());
    free(a);
}

static void send_all(server *srv, const psagg__agree_msg *m)
{
    for (int w = 0; w < srv->n_workers; w++)
        send_agree(srv, w, m);
}

/*
 * Check a view's bytes (the next epoch's, of this job): NULL if they hold, else what is wrong.
 * *moves points at its moves.
 */
static const char *view_check(const server *srv, const struct failover *fo, const uint8_t *v,
                              uint32_t len, const psagg__view_move **moves)
{
    psagg__view_hdr vh;
    const uint8_t *live;
    int n_live = 0;
    if (len < sizeof vh)
        return "shorter than its header";
    memcpy(&vh, v, sizeof vh);
    if (vh.n_servers != (uint32_t)srv->cfg.n_servers)
        return "field n_servers differs from the job's servers";
    if (vh.n_moves > srv->layout.n_chunks || len != psagg__view_bytes(vh.n_servers, vh.n_moves))
        return "field n_moves does not match its length";
    if (vh.epoch != fo->epoch + 1)
        return "field epoch is not the next epoch";
    live = v + sizeof vh;
    for (uint32_t s = 0; s < vh.n_servers; s++) {
        if (live[s] > 1 || (live[s] && !fo->live[s]))
            return "a server comes back to life";
        n_live += live[s];
    }
    if (!n_live)
        return "no server is live";
    *moves = (const psagg__view_move *)(const void *)(live + (vh.n_servers + 3) / 4 * 4);
    for (uint32_t i = 0; i < vh.n_moves; i++) {
        psagg__view_move m;
        memcpy(&m, &(*moves)[i], sizeof m);
        if (m.chunk >= srv->layout.n_chunks || m.owner >= vh.n_servers || !live[m.owner])
            return "a move names a chunk that does not exist or an owner that is not live";
    }
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++) { /* every chunk keeps a live owner */
        int moved = 0;
        for (uint32_t i = 0; i < vh.n_moves && !moved; i++) {
            psagg__view_move m;
            memcpy(&m, &(*moves)[i], sizeof m);
            moved = m.chunk == g;
        }
        if (!moved && !live[fo->owner[g]])
            return "a chunk of a server it removes stays there";
    }
    return NULL;
}

/* The state this server holds of chunk g for a takeover, or NULL. */
static chunk_state *standby_of(server *srv, uint32_t g)
{
    for (uint32_t i = srv->n_owned; i < srv->n_held; i++)
        if (srv->chunks[i].standby && srv->chunks[i].info == &srv->layout.chunks[g])
            return &srv->chunks[i];
    return NULL;
}

/*
 * Apply the decided view v of the next epoch: a chunk this server now owns starts at its
 * round here; the epoch moves on, and the progress thread routes the pushes that waited for it.
 */
static void apply_view(server *srv, struct failover *fo, const uint8_t *v, uint32_t len)
{
    const psagg__view_move *moves;
    const char *bad = view_check(srv, fo, v, len, &moves);
    psagg__view_hdr vh;
    uint32_t taken = 0, first = 0;
    uint8_t *copy;
    if (bad) {
        server_fail_job(srv, PSAGG_EPROTO, "a decided view: %s", bad);
        return;
    }
    if (!(copy = malloc(len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
        return;
    }
    memcpy(copy, v, len);
    memcpy(&vh, v, sizeof vh);
    if (!v[sizeof vh + (size_t)srv->rank]) {
        free(copy);
        server_fail_job(srv, PSAGG_EPEER,
                        "view %u removes this server (the workers lost it): it leaves the job",
                        vh.epoch);
        return;
    }
    for (uint32_t i = 0; i < vh.n_moves; i++) {
        psagg__view_move m;
        memcpy(&m, &moves[i], sizeof m);
        fo->owner[m.chunk] = m.owner;
        if (m.owner == (uint32_t)srv->rank) {
            chunk_state *c = standby_of(srv, m.chunk);
            if (!c) {
                free(copy);
                server_fail_job(srv, PSAGG_EPROTO,
                                "view %u makes this server own chunk %u, of which it holds no "
                                "state",
                                vh.epoch, m.chunk);
                return;
            }
            c->round = m.start; /* (its aggregation thread sees it through the queue) */
            c->standby = 0;
            c->taken_over = 1;
            atomic_store(&srv->route[m.chunk], (int)(c - srv->chunks));
            first = taken++ ? first : m.start;
        }
    }
    memcpy(fo->live, v + sizeof vh, (size_t)vh.n_servers);
    free(fo->last);
    fo->last = copy;
    fo->last_len = len;
    fo->epoch = vh.epoch;
    fo->lost = -1;
    fo->proposing = 0;
    memset(fo->reported, 0, (size_t)srv->n_workers);
    atomic_store(&srv->mb.epoch, vh.epoch); /* the push headers' epoch in this job */
    psagg__fabric_wake(srv->fab);
    LOG_WARN(&srv->log,
             "server view %u: %u chunk(s) moved, %u of them to this server (from round %u)",
             vh.epoch, vh.n_moves, taken, first);
}

/* The view without server `lost`, its chunks moved: into *out (malloc'd); 0, or -1 failed. */
static int make_view(server *srv, struct failover *fo, int lost, uint8_t **out, uint32_t *len)
{
    uint32_t n_s = (uint32_t)srv->cfg.n_servers, n_moves = 0, k = 0;
    psagg__view_hdr vh;
    psagg__view_move *moves;
    uint8_t *v;
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++)
        n_moves += fo->owner[g] == (uint32_t)lost;
    *len = (uint32_t)psagg__view_bytes(n_s, n_moves);
    if (!(v = calloc(1, *len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
        return -1;
    }
    vh = (psagg__view_hdr){.epoch = fo->epoch + 1, .n_servers = n_s, .n_moves = n_moves};
    memcpy(v, &vh, sizeof vh);
    memcpy(v + sizeof vh, fo->live, n_s);
    v[sizeof vh + (size_t)lost] = 0;
    moves = (psagg__view_move *)(void *)(v + sizeof vh + (n_s + 3) / 4 * 4);
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++) {
        const psagg__chunk_info *ci = &srv->layout.chunks[g];
        int to = -1;
        if (fo->owner[g] != (uint32_t)lost)
            continue;
        /* the first live server after the layout's owner that holds its standby state */
        for (uint32_t d = 1; d <= (uint32_t)srv->cfg.server_replicas && to < 0; d++) {
            uint32_t s = (ci->owner + d) % n_s;
            if (s != (uint32_t)lost && fo->live[s] && s != fo->owner[g])
                to = (int)s;
        }
        if (to < 0) {
            free(v);
            server_fail_job(srv, PSAGG_EPEER,
                            "server %d was lost, and with it tensor '%s' chunk %u: its layout "
                            "owner %u and its %d replica(s) are all gone",
                            lost, srv->layout.tensors[ci->key].name, ci->index, ci->owner,
                            srv->cfg.server_replicas);
            return -1;
        }
        moves[k++] = (psagg__view_move){.chunk = g, .owner = (uint32_t)to, .start = fo->start[g]};
    }
    *out = v;
    return 0;
}

/* Propose the view without fo->lost (again, after a lost attempt). */
static void propose(server *srv, struct failover *fo)
{
    psagg__agree_msg out;
    uint8_t *v;
    uint32_t len;
    if (make_view(srv, fo, fo->lost, &v, &len))
        return;
    if (fo->last) { /* the epoch before, for a worker that missed it */
        psagg__view_hdr vh;
        memcpy(&vh, fo->last, sizeof vh);
        send_all(srv, &(psagg__agree_msg){.kind = PSAGG_AGREE_DECIDED,
                                          .epoch = vh.epoch,
                                          .value = fo->last,
                                          .value_len = fo->last_len});
    }
    if (psagg__proposer_start(&fo->prop, fo->epoch + 1, (uint32_t)srv->n_workers, v, len, &out)) {
        free(v);
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a proposal");
        return;
    }
    free(v);
    fo->proposing = 1;
    fo->retry_at = 0;
    LOG_WARN(&srv->log, "every worker lost server %d: proposing view %u without it", fo->lost,
             fo->epoch + 1);
    send_all(srv, &out);
}

void failover_lost(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    struct failover *fo = fo_get(srv);
    psagg__ctl_server_lost sl;
    const uint8_t *rounds = (const uint8_t *)body + sizeof sl;
    int all = 1;
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a lost server");
        return;
    }
    if (h->len < sizeof sl) {
        server_close_worker(srv, w, "a SERVER_LOST frame of %u bytes", h->len);
        return;
    }
    memcpy(&sl, body, sizeof sl);
    if (sl.n_chunks != srv->layout.n_chunks ||
        h->len != sizeof sl + (size_t)sl.n_chunks * sizeof(uint32_t) ||
        sl.server >= (uint32_t)srv->cfg.n_servers || sl.server == (uint32_t)srv->rank) {
        server_close_worker(srv, w,
                            "SERVER_LOST fields server, n_chunks: server %u, %u chunks in %u "
                            "bytes (the job has %d servers and %u chunks)",
                            sl.server, sl.n_chunks, h->len, srv->cfg.n_servers,
                            srv->layout.n_chunks);
        return;
    }
    if (sl.epoch < fo->epoch) { /* it missed the decision: tell it */
        send_agree(srv, w,
                   &(psagg__agree_msg){.kind = PSAGG_AGREE_DECIDED,
                                       .epoch = fo->epoch,
                                       .value = fo->last,
                                       .value_len = fo->last_len});
        return;
    }
    if (sl.epoch > fo->epoch || !fo->live[sl.server] ||
        coordinator(srv, fo, (int)sl.server) != srv->rank) {
        LOG_WARN(&srv->log,
                 "worker %d reports server %u lost in view %u; this server is at view %u and "
                 "does not coordinate it",
                 w, sl.server, sl.epoch, fo->epoch);
        return;
    }
    if (fo->lost >= 0 && fo->lost != (int)sl.server) {
        server_fail_job(srv, PSAGG_EPEER,
                        "servers %d and %u were lost at once (worker %d lost %u while server "
                        "%d's loss was being decided): not built yet",
                        fo->lost, sl.server, w, sl.server, fo->lost);
        return;
    }
    if (fo->lost < 0) {
        fo->lost = (int)sl.server;
        fo->since = psagg__now_ms();
        memset(fo->reported, 0, (size_t)srv->n_workers);
        for (uint32_t g = 0; g < srv->layout.n_chunks; g++)
            fo->start[g] = UINT32_MAX;
        LOG_WARN(&srv->log, "worker %d lost server %u: waiting for every worker's report", w,
                 sl.server);
    }
    fo->reported[w] = 1;
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++) {
        uint32_t r;
        memcpy(&r, rounds + (size_t)g * sizeof r, sizeof r);
        if (r < fo->start[g])
            fo->start[g] = r;
    }
    for (int v = 0; v < srv->n_workers; v++)
        all &= fo->reported[v];
    if (all && !fo->proposing)
        propose(srv, fo);
}

/*
 * The state, with an AGREE or VIEW frame's header in *a (its view follows it in body): NULL
 * when there is no memory (the job failed) or the frame is malformed (worker w closed).
 */
static struct failover *agree_frame(server *srv, int w, const psagg__ctl_hdr *h, const void *body,
                                    const char *name, psagg__ctl_agree *a)
{
    struct failover *fo = fo_get(srv);
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
        return NULL;
    }
    if (h->len < sizeof *a) {
        server_close_worker(srv, w, "a %s frame of %u bytes", name, h->len);
        return NULL;
    }
    memcpy(a, body, sizeof *a);
    if (h->len != sizeof *a + (size_t)a->value_len) {
        server_close_worker(srv, w, "%s field value_len: %u in a frame of %u bytes", name,
                            a->value_len, h->len);
        return NULL;
    }
    return fo;
}

void failover_agree(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    psagg__ctl_agree a;
    struct failover *fo = agree_frame(srv, w, h, body, "AGREE", &a);
    psagg__agree_msg in, out;
    int ev;
    if (!fo)
        return;
    in = (psagg__agree_msg){.kind = a.kind,
                            .epoch = a.epoch,
                            .ballot = a.ballot,
                            .accepted = a.accepted,
                            .value = a.value_len ? (const uint8_t *)body + sizeof a : NULL,
                            .value_len = a.value_len};
    if (!fo->proposing)
        return; /* (an answer to an attempt over) */
    ev = psagg__proposer_on(&fo->prop, (uint32_t)w, &in, &out);
    switch (ev) {
    case PSAGG_AGREE_EV_SEND:
        send_all(srv, &out);
        break;
    case PSAGG_AGREE_EV_DECIDED: {
        uint8_t *v = malloc(out.value_len ? out.value_len : 1);
        uint32_t len = out.value_len;
        if (!v) {
            server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
            break;
        }
        memcpy(v, out.value, len);
        send_all(srv, &out);
        apply_view(srv, fo, v, len);
        free(v);
        break;
    }
    case PSAGG_AGREE_EV_LEARNED: /* another server decided it: take that one */
        apply_view(srv, fo, fo->prop.value, fo->prop.value_len);
        break;
    case PSAGG_AGREE_EV_LOST:
        fo->retry_at = psagg__now_ms() + 10 + rand() % 90;
        fo->proposing = 0;
        break;
    default:
        if (ev < 0)
            server_fail_job(srv, (psagg_status)ev, "the agreement on view %u", fo->epoch + 1);
        break;
    }
}

void failover_view(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    psagg__ctl_agree a;
    struct failover *fo = agree_frame(srv, w, h, body, "VIEW", &a);
    const uint8_t *v = (const uint8_t *)body + sizeof a;
    if (!fo)
        return;
    if (a.kind != PSAGG_AGREE_DECIDED) {
        server_close_worker(srv, w, "VIEW field kind: %u, not a decided view", a.kind);
        return;
    }
    if (a.epoch == fo->epoch && fo->last) { /* another worker's copy: the same bytes */
        if (a.value_len != fo->last_len || memcmp(v, fo->last, a.value_len))
            server_fail_job(srv, PSAGG_EPROTO,
                            "worker %d relayed a view %u that differs from the one applied", w,
                            a.epoch);
        return;
    }
    if (a.epoch <= fo->epoch)
        return; /* (an older copy) */
    apply_view(srv, fo, v, a.value_len);
}

void failover_tick(server *srv, int64_t now)
{
    struct failover *fo = srv->failover;
    if (!fo || fo->lost < 0)
        return;
    if (!fo->proposing && fo->retry_at && now >= fo->retry_at) {
        propose(srv, fo);
        return;
    }
    if (!fo->proposing && now - fo->since > srv->cfg.op_timeout_ms) {
        char missing[128] = "";
        size_t used = 0;
        for (int w = 0; w < srv->n_workers && used + 8 < sizeof missing; w++)
            if (!fo->reported[w])
                used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                         used ? "," : "", w);
        server_fail_job(srv, PSAGG_ETIMEDOUT,
                        "server %d was lost, and workers %s did not report it within "
                        "op_timeout_ms=%d",
                        fo->lost, missing, srv->cfg.op_timeout_ms);
    }
}
