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
 * A server that comes back (restarted: the workers connect to it again; it started with every
 * chunk on standby, admission.c) is reported by each worker (SERVER_BACK phase 0); once every
 * worker has, the coordinator asks them to hold their pushes of the chunks whose layout owner
 * it is (phase 1), takes their rounds, and proposes the view with it live and those chunks
 * moved back, from the lowest round reported: the same steps as a takeover. The server that
 * rejoins takes the first decided view that names it live, whatever its epoch (a view carries
 * every chunk's owner). One change of the view is decided at a time: a loss first (a return
 * whose view is not proposed yet is dropped for it, and reported again after the loss's view);
 * reports of another change are sent again by the workers with the next view.
 *
 * Two losses at once are two views, one after the other (a server reported lost is no takeover
 * target meanwhile). What is not built yet: a worker that dies meanwhile.
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
    /* per chunk this server took over with relayed rounds: the worker the view names to relay
       them (UINT32_MAX: none) */
    uint32_t *relay_by;
    uint8_t *last; /* the view decided for `epoch` (NULL at 0) */
    /* the coordinator's, in an elastic job: members lost or done (a view removes them, 2:
       done), and joiners a view is to admit */
    uint8_t *gone, *admit;
    int members_step;   /* a view that only changes the members is being decided */
    int64_t *done_at;   /* per worker: when its DONE came */
    int64_t prop_since; /* when the proposal of the next view began */
    uint32_t last_len;
    int rejoining; /* this server restarted into the running job: no view applied yet */
    /* the coordinator's: one change of the view decided at a time */
    int lost;          /* a loss being decided: the server, or -1 */
    int back;          /* a server coming back: the server, or -1 */
    int holding;       /* (back) the workers were asked to hold its chunks' pushes */
    uint8_t *reported; /* per worker: its report of this change came */
    uint8_t *suspect;  /* per server: a worker reported it lost (since the last view) */
    /* per worker x chunk: the next-update round it reported (make_view takes each chunk's
       lowest and highest over the members, and a member with the highest as its relayer) */
    uint32_t *rounds;
    int64_t since; /* the first report (of this step) */
    int proposing;
    int64_t retry_at; /* 0, or when to propose again (an attempt lost) */
    psagg__proposer prop;
    uint8_t *done; /* per worker: its DONE came (psagg_close), 2: answered */
    /* (back) the state of its chunks with copies, relayed to it (STATE frames): */
    int state_wait;  /* the coordinator: ASK sent, its DONE awaited */
    int with_state;  /* the coordinator: DONE came: the view admits it PSAGG_VIEW_LIVE */
    uint8_t *loaded; /* the returning server: per chunk, its state came */
    uint32_t n_loaded, n_needed; /* (of the chunks it holds state of: count_state) */
    uint32_t load_epoch;         /* the returning server: the view its states came after */
    /* a stale copy here (failover_restart_due): when the last view was applied, when the
       server first saw the stale copy with nothing under way, and whether it said why it waits */
    int64_t applied_at, stale_at;
    int restart_told;
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
    fo->relay_by = malloc((size_t)(n ? n : 1) * sizeof *fo->relay_by);
    fo->rounds = malloc((size_t)(n ? n : 1) * (size_t)srv->n_workers * sizeof *fo->rounds);
    fo->reported = calloc((size_t)srv->n_workers, 1);
    fo->suspect = calloc((size_t)srv->cfg.n_servers, 1);
    fo->done = calloc((size_t)srv->n_workers, 1);
    fo->gone = calloc((size_t)srv->n_workers, 1);
    fo->admit = calloc((size_t)srv->n_workers, 1);
    fo->done_at = calloc((size_t)srv->n_workers, sizeof *fo->done_at);
    fo->loaded = calloc(n ? n : 1, 1);
    if (!fo->live || !fo->owner || !fo->relay_by || !fo->rounds || !fo->reported || !fo->suspect ||
        !fo->done || !fo->loaded || !fo->gone || !fo->admit || !fo->done_at) {
        free(fo->live), free(fo->owner), free(fo->rounds), free(fo->reported), free(fo->relay_by);
        free(fo->suspect), free(fo->done), free(fo->loaded), free(fo->gone);
        free(fo->admit), free(fo->done_at), free(fo);
        return NULL;
    }
    memset(fo->live, 1, (size_t)srv->cfg.n_servers);
    for (uint32_t g = 0; g < n; g++) {
        fo->owner[g] = srv->layout.chunks[g].owner;
        fo->relay_by[g] = UINT32_MAX;
    }
    fo->rejoining = srv->ctl.rejoin;
    fo->lost = -1;
    fo->back = -1;
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
    free(fo->live), free(fo->owner), free(fo->last), free(fo->rounds), free(fo->reported);
    free(fo->relay_by), free(fo->gone), free(fo->admit), free(fo->done_at);
    free(fo->suspect), free(fo->done), free(fo->loaded), free(fo);
    srv->failover = NULL;
}

/* No return is being decided any more (its view applied, or dropped for a loss). */
static void return_over(struct failover *fo)
{
    fo->back = -1;
    fo->holding = 0;
    fo->state_wait = 0;
    fo->with_state = 0;
}

/* The lowest live server of the view but `but` and those reported lost, or -1. */
static int coordinator(const server *srv, const struct failover *fo, int but)
{
    for (int s = 0; s < srv->cfg.n_servers; s++)
        if (fo->live[s] && s != but && !fo->suspect[s])
            return s;
    return -1;
}

/* Whether chunk g has copies (a parameter's; any with a server residual). */
static int copied(const server *srv, uint32_t g)
{
    return srv->layout.tensors[srv->layout.chunks[g].key].param || srv->cfg.server_error_feedback;
}

/* Whether server s holds state of chunk g: g has copies, s is its layout owner or a copy. */
static int holds_state(const server *srv, uint32_t g, int s)
{
    uint32_t n = (uint32_t)srv->cfg.n_servers;
    return copied(srv, g) && ((uint32_t)s + n - srv->layout.chunks[g].owner) % n <=
                                 (uint32_t)srv->cfg.server_replicas;
}

/* How many chunks server s holds state of. */
static uint32_t count_state(const server *srv, int s)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++)
        n += holds_state(srv, g, s);
    return n;
}

static int usable(const server *srv, int w)
{
    const worker_conn *wc = &srv->workers[w];
    return wc->fd >= 0 && wc->state != W_BYE && wc->state != W_DEAD;
}

/* A usable member: one that holds pushes and state (a joiner not admitted yet has neither: it
   takes the view that admits it whole, which names the servers as they are then). */
static int holder(const server *srv, int w)
{
    return usable(srv, w) && server_member(srv, w);
}

/* Send an AGREE (with its view, when it carries one) to worker w; a failed send closes it. */
static void send_agree(server *srv, int w, const psagg__agree_msg *m)
{
    worker_conn *wc = &srv->workers[w];
    size_t len = sizeof(psagg__ctl_agree) + m->value_len;
    psagg__ctl_agree *a;
    if (!usable(srv, w))
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

/* To every member of the view applied here, and (a DECIDED) the joiners it admits. */
static void send_all(server *srv, const psagg__agree_msg *m)
{
    const struct failover *fo = srv->failover;
    for (int w = 0; w < srv->n_workers; w++)
        if (server_member(srv, w) || (m->kind == PSAGG_AGREE_DECIDED && fo->admit[w]))
            send_agree(srv, w, m);
}

/* The decided view of this server's epoch, to worker w (it missed it), if there is one. */
static void send_last(server *srv, struct failover *fo, int w)
{
    if (fo->last)
        send_agree(srv, w,
                   &(psagg__agree_msg){.kind = PSAGG_AGREE_DECIDED,
                                       .epoch = fo->epoch,
                                       .value = fo->last,
                                       .value_len = fo->last_len});
}

/*
 * Check a view's bytes against this job (and, unless this server rejoins, against the view
 * applied here: a chunk changes its owner only by a move): NULL if they hold, else what is
 * wrong. Its epoch is the caller's to check.
 */
static const char *view_check(const server *srv, const struct failover *fo, const uint8_t *v,
                              uint32_t len)
{
    psagg__view_hdr vh;
    const uint8_t *live = v + sizeof vh;
    uint8_t *moved;
    const char *bad = NULL;
    int n_live = 0;
    if (len < sizeof vh)
        return "shorter than its header";
    memcpy(&vh, v, sizeof vh);
    if (vh.n_servers != (uint32_t)srv->cfg.n_servers)
        return "field n_servers differs from the job's servers";
    if (vh.n_chunks != srv->layout.n_chunks)
        return "field n_chunks differs from the layout's chunks";
    if (vh.n_workers != (uint32_t)srv->n_workers)
        return "field n_workers differs from the job's worker ranks";
    if (vh.n_moves > vh.n_chunks ||
        len != psagg__view_bytes(vh.n_servers, vh.n_chunks, vh.n_moves, vh.n_workers))
        return "field n_moves does not match its length";
    if (!vh.n_members)
        return "field n_members is 0";
    if ((bad = psagg__view_members_bad(v, &vh, srv->mb.elastic)))
        return bad;
    for (uint32_t s = 0; s < vh.n_servers; s++) {
        if (live[s] > PSAGG_VIEW_LIVE_NEW)
            return "a live[] byte is none of 0, 1, 2";
        n_live += live[s] != 0;
    }
    if (!n_live)
        return "no server is live";
    for (uint32_t g = 0; g < vh.n_chunks; g++) {
        uint32_t o = psagg__view_owner(v, vh.n_servers, g);
        if (o >= vh.n_servers || !live[o])
            return "a chunk's owner is not a live server";
    }
    if (!(moved = calloc(vh.n_chunks ? vh.n_chunks : 1, 1)))
        return "no memory to check it";
    for (uint32_t i = 0; i < vh.n_moves && !bad; i++) {
        psagg__view_move m = psagg__view_move_at(v, vh.n_servers, vh.n_chunks, i);
        if (m.chunk >= vh.n_chunks || moved[m.chunk])
            bad = "a move names a chunk that does not exist, or one moved twice";
        else if (m.owner != psagg__view_owner(v, vh.n_servers, m.chunk))
            bad = "a move's owner is not the chunk's owner in owner[]";
        else if (psagg__view_relay_bad(&m, (uint32_t)srv->n_workers, copied(srv, m.chunk),
                                       srv->pool.follow_bytes != 0))
            bad = "a move's relayed rounds are not 0..2 rounds from its start by a worker of "
                  "the job (none for a chunk with copies, whose copy may follow them under a "
                  "quorum)";
        else
            moved[m.chunk] = 1;
    }
    for (uint32_t g = 0; g < vh.n_chunks && !bad && !fo->rejoining; g++)
        if (!moved[g] && psagg__view_owner(v, vh.n_servers, g) != fo->owner[g])
            bad = "a chunk changes its owner without a move (and the round it starts at)";
    free(moved);
    return bad;
}

int failover_coordinator(const server *srv)
{
    const struct failover *fo = srv->failover;
    if (srv->ctl.rejoin && (!fo || fo->rejoining))
        return -1; /* (a server that rejoins knows the view once one admits it) */
    for (int s = 0; fo && s < srv->cfg.n_servers; s++)
        if (fo->live[s])
            return s;
    return 0; /* the layout's view: every server live */
}

int failover_owns(const server *srv, uint32_t g)
{
    const struct failover *fo = srv->failover;
    if (srv->ctl.rejoin && (!fo || fo->rejoining))
        return 0; /* (a server that rejoins owns nothing before a view gives it chunks) */
    return (fo ? fo->owner[g] : srv->layout.chunks[g].owner) == (uint32_t)srv->rank;
}

/* The slot of the state this server holds of chunk g (owned, or on standby), or -1. */
static int held_slot(const server *srv, uint32_t g)
{
    for (uint32_t i = 0; i < srv->n_held; i++)
        if (srv->chunks[i].info == &srv->layout.chunks[g])
            return (int)i;
    return -1;
}

/*
 * The members view v names (an elastic job's): a member out of it leaves, a worker new to it is
 * admitted (it joined here, or it rejoins nothing and its rounds wait for it until a view
 * removes it); the coordinator's changes it settled are over.
 */
static void apply_members(server *srv, struct failover *fo, const uint8_t *v,
                          const psagg__view_hdr *vh)
{
    const uint8_t *member = v + psagg__view_members_at(vh->n_servers, vh->n_chunks, vh->n_moves);
    char left[96] = "", joined[96] = "";
    size_t nl = 0, nj = 0;
    for (int w = 0; w < srv->n_workers; w++) {
        if (server_member(srv, w) && !member[w]) {
            server_member_leave(srv, w, vh->epoch,
                                fo->gone[w] == 2 ? "it is done (psagg_close)"
                                                 : "the coordinator of the server view lost it");
            nl = psagg__list_int(left, sizeof left, nl, w);
        } else if (!server_member(srv, w) && member[w]) {
            if (!srv->workers[w].joining || srv->workers[w].state != W_DECLARED)
                LOG_WARN(&srv->log,
                         "view %u admits worker %d, which has not joined this server (its rounds "
                         "here wait for it until a view removes it)",
                         vh->epoch, w);
            server_member_admit(srv, w);
            nj = psagg__list_int(joined, sizeof joined, nj, w);
        }
        if (!member[w])
            fo->gone[w] = 0;
        else
            fo->admit[w] = 0;
    }
    if (!nl && !nj)
        return;
    LOG_WARN(&srv->log, "membership in view %u:%s%s%s%s; %d workers now", vh->epoch,
             nl ? " workers " : "", left, nj ? " joined: " : (nl ? " left" : ""), joined,
             srv->mb.n);
    metrics_membership(srv, vh->epoch, srv->mb.n);
    agg_settle_routed(srv);
}

static void propose(server *srv, struct failover *fo);
static int members_pending(const server *srv, const struct failover *fo);

/*
 * Apply the decided view v: a chunk this server now owns starts at its move's round here, one
 * it owned no more is given up (aggregate.c's agg_move, in queue order with the pushes); the
 * epoch moves on, and the progress thread routes the pushes that waited for it. A server that
 * rejoins takes the first view that names it live, whatever its epoch.
 */
static void apply_view(server *srv, struct failover *fo, const uint8_t *v, uint32_t len)
{
    const char *bad = view_check(srv, fo, v, len);
    psagg__view_hdr vh;
    uint32_t taken = 0, given = 0, first = 0, relayed = 0;
    psagg__view_move *move = NULL; /* per chunk: its move (start UINT32_MAX: none) */
    uint8_t *copy, *gave = NULL;
    if (bad) {
        server_fail_job(srv, PSAGG_EPROTO, "a decided view: %s", bad);
        return;
    }
    memcpy(&vh, v, sizeof vh);
    if (fo->rejoining ? vh.epoch <= fo->epoch : vh.epoch != fo->epoch + 1) {
        server_fail_job(srv, PSAGG_EPROTO, "a decided view of epoch %u at view %u here", vh.epoch,
                        fo->epoch);
        return;
    }
    if (!v[sizeof vh + (size_t)srv->rank]) {
        if (fo->rejoining) { /* (a loss decided while this server came back) */
            LOG_INFO(&srv->log, "server view %u does not name this server yet", vh.epoch);
            return;
        }
        server_fail_job(srv, PSAGG_EPEER,
                        "view %u removes this server (the workers lost it): it leaves the job",
                        vh.epoch);
        return;
    }
    if (!(copy = malloc(len)) || !(move = malloc((vh.n_chunks ? vh.n_chunks : 1) * sizeof *move)) ||
        !(gave = calloc(vh.n_chunks ? vh.n_chunks : 1, 1))) {
        free(copy), free(move);
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
        return;
    }
    memcpy(copy, v, len);
    for (uint32_t g = 0; g < vh.n_chunks; g++)
        move[g].start = UINT32_MAX;
    for (uint32_t i = 0; i < vh.n_moves; i++) {
        psagg__view_move m = psagg__view_move_at(v, vh.n_servers, vh.n_chunks, i);
        move[m.chunk] = m;
    }
    /* back with the state of its chunks with copies (STATE): each runs as a copy from the
       round its state is at, and those the view gives it are taken over from there */
    for (uint32_t g = 0; fo->rejoining && v[sizeof vh + (size_t)srv->rank] == PSAGG_VIEW_LIVE &&
                         g < vh.n_chunks && !atomic_load(&srv->job.failed);
         g++) {
        int slot = holds_state(srv, g, srv->rank) ? held_slot(srv, g) : -1;
        if (slot < 0)
            continue;
        if (!fo->loaded[g]) {
            server_fail_job(srv, PSAGG_EPROTO,
                            "view %u admits this server with the state of its chunks, but that "
                            "of chunk %u did not come",
                            vh.epoch, g);
            break;
        }
        if (agg_move(srv, &srv->chunks[slot], AGG_COPY, NULL, vh.epoch))
            break;
        atomic_store(&srv->route[g], slot);
    }
    for (uint32_t g = 0; g < vh.n_chunks; g++) {
        uint32_t now = psagg__view_owner(v, vh.n_servers, g);
        int mine = now == (uint32_t)srv->rank;
        int was = !fo->rejoining && fo->owner[g] == (uint32_t)srv->rank;
        int slot = mine != was ? held_slot(srv, g) : -1;
        fo->owner[g] = now;
        if (mine == was)
            continue;
        if (slot < 0 || (mine && move[g].start == UINT32_MAX)) {
            server_fail_job(srv, PSAGG_EPROTO,
                            "view %u makes this server own chunk %u, of which it %s", vh.epoch, g,
                            slot < 0 ? "holds no state" : "names no round to start at");
            break;
        }
        if (mine) { /* queued before the first push routed to it: it starts at its round */
            if (agg_move(srv, &srv->chunks[slot], AGG_OWN, &move[g], vh.epoch))
                break;
            fo->relay_by[g] = move[g].relay_end > move[g].start ? move[g].relayer : UINT32_MAX;
            atomic_store(&srv->route[g], slot);
            first = taken++ ? first : move[g].start;
            if (move[g].relayer != PSAGG_VIEW_FOLLOW)
                relayed += move[g].relay_end - move[g].start;
        } else if (holds_state(srv, g, srv->rank)) { /* (moved back: this server copies it) */
            if (agg_move(srv, &srv->chunks[slot], AGG_COPY, NULL, vh.epoch))
                break;
            given++;
        } else { /* (its route is cleared once the epoch moved: below) */
            if (agg_move(srv, &srv->chunks[slot], AGG_GIVE_UP, NULL, vh.epoch))
                break;
            gave[g] = 1;
            given++;
        }
    }
    free(move);
    memcpy(fo->live, v + sizeof vh, (size_t)vh.n_servers);
    free(fo->last);
    fo->last = copy;
    fo->last_len = len;
    fo->epoch = vh.epoch;
    fo->rejoining = 0;
    fo->applied_at = psagg__now_ms();
    fo->lost = -1;
    return_over(fo);
    fo->proposing = 0;
    fo->retry_at = 0;
    memset(fo->reported, 0, (size_t)srv->n_workers);
    memset(fo->suspect, 0, (size_t)srv->cfg.n_servers); /* (reported again if still lost) */
    atomic_store(&srv->mb.epoch, vh.epoch);             /* the push headers' epoch in this job */
    apply_members(srv, fo, v, &vh);
    fo->members_step = 0;
    /* a chunk given up stops routing only now: a push of the view before that comes meanwhile
       is dropped by its standby state (its new owner sums it), not taken for a stranger's */
    for (uint32_t g = 0; g < vh.n_chunks; g++)
        if (gave[g])
            atomic_store(&srv->route[g], -1);
    free(gave);
    psagg__fabric_wake(srv->fab);
    LOG_WARN(&srv->log,
             "server view %u: %u chunk(s) moved, %u of them to this server (from round %u; %u "
             "round(s) of them with an update a worker relays), %u given back",
             vh.epoch, vh.n_moves, taken, first, relayed, given);
    if (coordinator(srv, fo, -1) == srv->rank && members_pending(srv, fo)) {
        fo->members_step = 1; /* (changes that came while this view was decided) */
        propose(srv, fo);
    }
}

/* Worker w's rounds (one u32 per chunk: the next update it takes), kept for make_view. */
static void take_rounds(server *srv, struct failover *fo, int w, const void *rounds)
{
    memcpy(fo->rounds + (size_t)w * srv->layout.n_chunks, rounds,
           (size_t)srv->layout.n_chunks * sizeof *fo->rounds);
}

/*
 * Chunk g's rounds over the members whose report came: the lowest next update (where a moved
 * chunk starts), the highest, and the lowest member that reported the highest (its relayer:
 * it has the updates of the rounds between). A worker that left since it reported counts no
 * more (elastic jobs): a relayer must be there to relay.
 */
static void chunk_rounds(const server *srv, const struct failover *fo, uint32_t g, uint32_t *start,
                         uint32_t *end, uint32_t *relayer)
{
    int first = 1;
    *start = *end = *relayer = 0;
    for (int w = 0; w < srv->n_workers; w++) {
        uint32_t r = fo->rounds[(size_t)w * srv->layout.n_chunks + g];
        if (!fo->reported[w] || !server_member(srv, w) || fo->gone[w])
            continue;
        if (first || r < *start)
            *start = r;
        if (first || r > *end) {
            *end = r;
            *relayer = (uint32_t)w;
        }
        first = 0;
    }
}

/* Whether every member reported this step (a worker that left need not: elastic jobs). */
static int all_reported(const server *srv, const struct failover *fo)
{
    for (int w = 0; w < srv->n_workers; w++)
        if (!fo->reported[w] && server_member(srv, w) && !fo->gone[w])
            return 0;
    return 1;
}

static void start_step(server *srv, struct failover *fo)
{
    fo->since = psagg__now_ms();
    memset(fo->reported, 0, (size_t)srv->n_workers);
}

/*
 * The next view: without fo->lost (its chunks to the first live server from their layout owner
 * on that holds their state), or with fo->back (the chunks of its layout moved back to it),
 * each move from the lowest round the members reported (chunk_rounds). Into *out (malloc'd); 0,
 * or -1 (the job failed).
 */
static int make_view(server *srv, struct failover *fo, uint8_t **out, uint32_t *len)
{
    uint32_t n_s = (uint32_t)srv->cfg.n_servers, n_c = srv->layout.n_chunks, n_moves = 0, k = 0;
    psagg__view_hdr vh;
    uint8_t *v, *live, *member;
    uint32_t *to = malloc((n_c ? n_c : 1) * sizeof *to);
    if (!to) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
        return -1;
    }
    for (uint32_t g = 0; g < n_c; g++) {
        const psagg__chunk_info *ci = &srv->layout.chunks[g];
        int has_copies = copied(srv, g);
        to[g] = fo->owner[g];
        /* (a chunk with copies moves back only with its state: else it stays where it is;
           under [server] quorum none moves back: the owner it has may close a round without a
           straggler after the workers reported their rounds, and a worker that applied that
           update before the view and one that did not would then take different bytes) */
        if (fo->back >= 0 && ci->owner == (uint32_t)fo->back && (!has_copies || fo->with_state) &&
            !srv->cfg.quorum)
            to[g] = (uint32_t)fo->back;
        if (fo->lost >= 0 && fo->owner[g] == (uint32_t)fo->lost) {
            int found = -1;
            for (uint32_t d = 0; d <= (uint32_t)srv->cfg.server_replicas && found < 0; d++) {
                uint32_t s = (ci->owner + d) % n_s;
                /* a chunk with copies goes to a copy: a server live since the start */
                if (s != (uint32_t)fo->lost && fo->live[s] && !fo->suspect[s] &&
                    (!has_copies || fo->live[s] == PSAGG_VIEW_LIVE))
                    found = (int)s;
            }
            if (found < 0) {
                free(to);
                server_fail_job(srv, PSAGG_EPEER,
                                "server %d was lost, and with it tensor '%s' chunk %u: its layout "
                                "owner %u and its %d replica(s) are all gone (or lost too%s)",
                                fo->lost, srv->layout.tensors[ci->key].name, ci->index, ci->owner,
                                srv->cfg.server_replicas,
                                has_copies ? ", or came back without the chunk's state" : "");
                return -1;
            }
            to[g] = (uint32_t)found;
        }
        n_moves += to[g] != fo->owner[g];
    }
    *len = (uint32_t)psagg__view_bytes(n_s, n_c, n_moves, (uint32_t)srv->n_workers);
    if (!(v = calloc(1, *len))) {
        free(to);
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a view");
        return -1;
    }
    vh = (psagg__view_hdr){.epoch = fo->epoch + 1,
                           .n_servers = n_s,
                           .n_moves = n_moves,
                           .n_chunks = n_c,
                           .n_workers = (uint32_t)srv->n_workers};
    member = v + psagg__view_members_at(n_s, n_c, n_moves);
    for (int w = 0; w < srv->n_workers; w++) { /* (the lost and done out, the joiners in) */
        member[w] = (uint8_t)((server_member(srv, w) && !fo->gone[w]) ||
                              (!server_member(srv, w) && fo->admit[w]));
        vh.n_members += member[w];
    }
    memcpy(v, &vh, sizeof vh);
    live = v + sizeof vh;
    memcpy(live, fo->live, n_s);
    if (fo->lost >= 0)
        live[fo->lost] = 0;
    if (fo->back >= 0)
        live[fo->back] = fo->with_state ? PSAGG_VIEW_LIVE : PSAGG_VIEW_LIVE_NEW;
    for (uint32_t g = 0; g < n_c; g++) {
        uint16_t o = (uint16_t)to[g];
        memcpy(v + psagg__view_owners_at(n_s) + (size_t)g * sizeof o, &o, sizeof o);
        if (to[g] != fo->owner[g]) {
            /* (a chunk with copies: the copy's state has the round's sum as the owner's had;
               under a quorum, the rounds some worker has the update of it steps with the
               owner's bitmap that the workers' pushes carry: wire.h) */
            uint32_t start, end, relayer;
            int relay, follow;
            chunk_rounds(srv, fo, g, &start, &end, &relayer);
            relay = !copied(srv, g) && end > start;
            follow = copied(srv, g) && srv->pool.follow_bytes && end > start;
            psagg__view_move m = {.chunk = g,
                                  .owner = to[g],
                                  .start = start,
                                  .relay_end = relay || follow ? end : start,
                                  .relayer = relay    ? relayer
                                             : follow ? PSAGG_VIEW_FOLLOW
                                                      : 0};
            memcpy(v + psagg__view_moves_at(n_s, n_c) + (size_t)k++ * sizeof m, &m, sizeof m);
        }
    }
    free(to);
    *out = v;
    return 0;
}

/* Propose the next view (again, after a lost attempt): the loss or the return being decided. */
static void propose(server *srv, struct failover *fo)
{
    psagg__agree_msg out;
    uint8_t *v, *member; /* (the acceptors: the members of the view applied here) */
    uint32_t len;
    psagg_status st;
    if (make_view(srv, fo, &v, &len))
        return;
    if (!(member = malloc((size_t)srv->n_workers))) {
        free(v);
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a proposal");
        return;
    }
    for (int w = 0; w < srv->n_workers; w++) { /* the epoch before, for a worker that missed it */
        member[w] = (uint8_t)server_member(srv, w);
        if (member[w])
            send_last(srv, fo, w);
    }
    st = psagg__proposer_start(&fo->prop, fo->epoch + 1, (uint32_t)srv->n_workers, member, v, len,
                               &out);
    free(member);
    if (st) {
        free(v);
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a proposal");
        return;
    }
    free(v);
    fo->proposing = 1;
    if (!fo->retry_at)
        fo->prop_since = psagg__now_ms();
    fo->retry_at = 0;
    if (fo->lost >= 0)
        LOG_WARN(&srv->log, "every member lost server %d: proposing view %u without it", fo->lost,
                 fo->epoch + 1);
    else if (fo->back >= 0)
        LOG_WARN(&srv->log, "server %d is back at every member: proposing view %u with it",
                 fo->back, fo->epoch + 1);
    else
        LOG_WARN(&srv->log, "proposing view %u: the members change", fo->epoch + 1);
    send_all(srv, &out);
}

/*
 * A SERVER_LOST or SERVER_BACK frame's fields, in *sl (its rounds after it in body, when
 * `rounds`): the state, or NULL (worker w closed, or the job failed). A frame of a view before
 * this server's gets that view; one this server does not coordinate is logged and left.
 */
static struct failover *report_frame(server *srv, int w, const psagg__ctl_hdr *h, const void *body,
                                     const char *name, int rounds, psagg__ctl_server_lost *sl)
{
    struct failover *fo = fo_get(srv);
    uint32_t n = rounds ? srv->layout.n_chunks : 0;
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a server view");
        return NULL;
    }
    if (h->len >= sizeof *sl)
        memcpy(sl, body, sizeof *sl);
    if (h->len < sizeof *sl || sl->n_chunks != n || h->len != sizeof *sl + (size_t)n * 4 ||
        sl->server >= (uint32_t)srv->cfg.n_servers || sl->server == (uint32_t)srv->rank) {
        server_close_worker(
            srv, w,
            "%s fields server, n_chunks, phase: server %u, %u chunks, phase %u in "
            "%u bytes (the job has %d servers and %u chunks)",
            name, h->len >= sizeof *sl ? sl->server : 0, h->len >= sizeof *sl ? sl->n_chunks : 0,
            h->len >= sizeof *sl ? sl->phase : 0, h->len, srv->cfg.n_servers, srv->layout.n_chunks);
        return NULL;
    }
    if (fo->rejoining) {
        LOG_INFO(&srv->log,
                 "worker %d's %s of server %u: this server rejoins, it coordinates nothing yet", w,
                 name, sl->server);
        return NULL;
    }
    if (sl->epoch < fo->epoch) { /* it missed the decision: tell it */
        send_last(srv, fo, w);
        return NULL;
    }
    return fo;
}

void failover_lost(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    psagg__ctl_server_lost sl;
    struct failover *fo = report_frame(srv, w, h, body, "SERVER_LOST", 1, &sl);
    if (!fo)
        return;
    if (sl.epoch == fo->epoch && fo->live[sl.server])
        fo->suspect[sl.server] = 1; /* (no chunk moves to it, nor does it coordinate, meanwhile) */
    if (sl.epoch > fo->epoch || !fo->live[sl.server] ||
        coordinator(srv, fo, (int)sl.server) != srv->rank) {
        LOG_WARN(&srv->log,
                 "worker %d reports server %u lost in view %u; this server is at view %u and "
                 "does not coordinate it",
                 w, sl.server, sl.epoch, fo->epoch);
        return;
    }
    if (fo->back >= 0 && (fo->proposing || fo->retry_at)) { /* (sent again with that view) */
        LOG_WARN(&srv->log,
                 "worker %d lost server %u while server %d's return is decided: after it", w,
                 sl.server, fo->back);
        return;
    }
    if (fo->back >= 0) { /* a loss goes first: the return is reported again after its view */
        /* (no view of the return was proposed yet: the workers' hold of its chunks ends with the
           loss's view, and state that came for it is sent again at its next attempt, whose
           owners may differ: the lost server may have been one) */
        LOG_WARN(&srv->log,
                 "server %u was lost while server %d comes back (%s): the loss is decided first, "
                 "the return after its view",
                 sl.server, fo->back,
                 fo->state_wait ? "its chunks' state on its way"
                 : fo->holding  ? "its chunks held"
                                : "reported back");
        return_over(fo);
    }
    if (fo->lost >= 0 && fo->lost != (int)sl.server) { /* one at a time: sent again after */
        LOG_WARN(&srv->log,
                 "worker %d lost server %u while server %d's loss is decided: it is decided "
                 "next",
                 w, sl.server, fo->lost);
        return;
    }
    if (fo->lost < 0) {
        fo->lost = (int)sl.server;
        start_step(srv, fo);
        LOG_WARN(&srv->log, "worker %d lost server %u: waiting for every worker's report", w,
                 sl.server);
    }
    fo->reported[w] = 1;
    take_rounds(srv, fo, w, (const uint8_t *)body + sizeof sl);
    if (all_reported(srv, fo) && !fo->proposing)
        propose(srv, fo);
}

/* Ask every worker to hold its pushes of server fo->back's chunks and report its rounds. */
static void ask_hold(server *srv, struct failover *fo)
{
    psagg__ctl_server_lost sl = {
        .server = (uint32_t)fo->back, .epoch = fo->epoch, .n_chunks = 0, .phase = 1};
    fo->holding = 1;
    start_step(srv, fo);
    LOG_WARN(&srv->log, "server %d is back at every worker: asking them to hold its chunks",
             fo->back);
    for (int w = 0; w < srv->n_workers; w++)
        if (holder(srv, w) && psagg__ctl_send(srv->workers[w].fd, &srv->workers[w].auth,
                                              PSAGG_CTL_SERVER_BACK, &sl, sizeof sl))
            server_close_worker(srv, w, "sending SERVER_BACK: %s", psagg_last_error());
}

/*
 * Every worker holds the pushes of server fo->back's chunks: if it holds state of chunks with
 * copies, ask one worker to have that state relayed to it (STATE ASK; not under a quorum, whose
 * rounds go on meanwhile: it is admitted without state, PSAGG_VIEW_LIVE_NEW); the view waits for
 * its DONE (failover_state), or for op_timeout_ms (failover_tick: the workers' held operations have
 * 2 x op_timeout_ms in all), or until a loss is reported. 1 if asked, else 0.
 */
static int ask_state(server *srv, struct failover *fo)
{
    psagg__ctl_state sh = {
        .kind = PSAGG_STATE_ASK, .server = (uint32_t)fo->back, .epoch = fo->epoch};
    uint32_t n = count_state(srv, fo->back);
    int w = 0;
    while (w < srv->n_workers && !holder(srv, w))
        w++;
    if (!n || w == srv->n_workers)
        return 0;
    if (srv->cfg.quorum && srv->pool.follow_bytes) { /* (its copies could not catch up: a
                                                          quorum's rounds do not wait for the
                                                          hold, and pushes are kept 2 rounds) */
        LOG_WARN(&srv->log,
                 "server %d comes back under [server] quorum: it stands by without the state of "
                 "its %u chunk(s) with copies (the job does not pause for it: it copies none)",
                 fo->back, n);
        return 0;
    }
    if (psagg__ctl_send(srv->workers[w].fd, &srv->workers[w].auth, PSAGG_CTL_STATE, &sh,
                        sizeof sh)) {
        server_close_worker(srv, w, "sending STATE: %s", psagg_last_error());
        return 0;
    }
    fo->state_wait = 1;
    fo->since = psagg__now_ms();
    LOG_WARN(&srv->log,
             "server %d comes back holding state of %u chunk(s): worker %d relays it from their "
             "owners",
             fo->back, n, w);
    return 1;
}

void failover_back(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    psagg__ctl_server_lost sl;
    int phase = h->len >= sizeof sl ? (int)((const psagg__ctl_server_lost *)body)->phase : 0;
    struct failover *fo = report_frame(srv, w, h, body, "SERVER_BACK", phase == 1, &sl);
    if (!fo)
        return;
    if (sl.phase > 1) {
        server_close_worker(srv, w, "SERVER_BACK field phase: %u", sl.phase);
        return;
    }
    if (sl.epoch > fo->epoch || fo->live[sl.server] || coordinator(srv, fo, -1) != srv->rank) {
        LOG_INFO(&srv->log,
                 "worker %d reports server %u back in view %u; this server is at view %u, "
                 "where it is %s, and %s",
                 w, sl.server, sl.epoch, fo->epoch, fo->live[sl.server] ? "live" : "out",
                 coordinator(srv, fo, -1) == srv->rank ? "coordinates" : "does not coordinate");
        return;
    }
    if (fo->lost >= 0 || (fo->back >= 0 && fo->back != (int)sl.server)) {
        LOG_INFO(&srv->log,
                 "worker %d reports server %u back while server %d's %s is decided: "
                 "it reports it again after that",
                 w, sl.server, fo->lost >= 0 ? fo->lost : fo->back,
                 fo->lost >= 0 ? "loss" : "return");
        return;
    }
    if (sl.phase == 0) {
        if (fo->holding)
            return; /* (a report sent again before the hold was asked) */
        if (fo->back < 0) {
            fo->back = (int)sl.server;
            start_step(srv, fo);
            LOG_WARN(&srv->log, "worker %d has server %u back: waiting for every worker", w,
                     sl.server);
        }
        fo->reported[w] = 1;
        if (all_reported(srv, fo))
            ask_hold(srv, fo);
        return;
    }
    if (fo->back != (int)sl.server || !fo->holding)
        return; /* (an answer to a hold over) */
    fo->reported[w] = 1;
    take_rounds(srv, fo, w, (const uint8_t *)body + sizeof sl);
    if (all_reported(srv, fo) && !fo->proposing && !fo->state_wait && !ask_state(srv, fo))
        propose(srv, fo);
}

/*
 * Worker w, a member, is lost (why) or done (bye) here, on the coordinator of an elastic job
 * (membership.c's owner): the next view removes it. A step that waited for its report goes on
 * without it; with no step under way, a view that only removes it is proposed. A view being
 * decided already is not changed: the change goes into the one after it (apply_view).
 */
void failover_member_left(server *srv, int w, const char *why, int bye)
{
    struct failover *fo = fo_get(srv);
    int n = 0;
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a server view");
        return;
    }
    if (!server_member(srv, w) || fo->gone[w] || (bye && fo->done[w] == 2))
        return; /* (a BYE after every member was done: the job's end) */
    fo->gone[w] = bye ? 2 : 1;
    for (int k = 0; k < srv->n_workers; k++)
        n += server_member(srv, k) && !fo->gone[k];
    if (!bye && n < srv->cfg.min_workers) {
        server_fail_job(srv, PSAGG_EPEER,
                        "worker %d failed (%s): %d workers left, fewer than min_workers=%d", w, why,
                        n, srv->cfg.min_workers);
        return;
    }
    LOG_WARN(&srv->log, "worker %d %s (%s): the next view removes it; %d workers go on", w,
             bye ? "is done" : "lost", why, n);
    if (fo->proposing || fo->retry_at)
        return;
    if (fo->lost < 0 && fo->back < 0) {
        fo->members_step = 1;
        propose(srv, fo);
    } else if (!all_reported(srv, fo)) {
        return;
    } else if (fo->lost >= 0) {
        propose(srv, fo);
    } else if (!fo->holding) {
        ask_hold(srv, fo);
    } else if (!fo->state_wait && !ask_state(srv, fo)) {
        propose(srv, fo);
    }
}

void failover_admit(server *srv, int w)
{
    struct failover *fo = fo_get(srv);
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a server view");
        return;
    }
    if (server_member(srv, w) || fo->admit[w])
        return;
    fo->admit[w] = 1;
    if (fo->proposing || fo->retry_at || fo->lost >= 0 || fo->back >= 0)
        return; /* (the view after the one under way: apply_view) */
    fo->members_step = 1;
    propose(srv, fo);
}

/* Whether the coordinator has members to remove or joiners to admit that no view did yet. */
static int members_pending(const server *srv, const struct failover *fo)
{
    for (int w = 0; w < srv->n_workers; w++)
        if ((fo->gone[w] && server_member(srv, w)) || (fo->admit[w] && !server_member(srv, w)))
            return 1;
    return 0;
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
    case PSAGG_AGREE_EV_BEHIND: /* (views this server missed come relayed: VIEW; until then
                                   it tries again, as after a lost attempt) */
        LOG_INFO(&srv->log,
                 "worker %d is at view %u, past the view %u this server proposes: it waits for "
                 "the views it missed",
                 w, fo->prop.behind_epoch, fo->epoch + 1);
        fo->retry_at = psagg__now_ms() + 10 + rand() % 90;
        fo->proposing = 0;
        break;
    default:
        if (ev < 0)
            server_fail_job(srv, (psagg_status)ev, "the agreement on view %u", fo->epoch + 1);
        break;
    }
}

/*
 * The end of a job (psagg_close): once every worker said DONE (or BYE) here, each that said DONE
 * is answered DONE. Until then they stay: a worker's last pushes may still be needed (a server
 * that dies after sending some workers a round's update but not others: the new owner sums
 * that round again). An elastic job's workers that left are not waited for; one done while the
 * others run on leaves op_timeout_ms later (failover_tick).
 */
void failover_done_check(server *srv)
{
    struct failover *fo = srv->failover;
    int n = 0;
    if (!fo)
        return;
    for (int k = 0; k < srv->n_workers; k++)
        if (!fo->done[k] && srv->workers[k].state != W_BYE && server_member(srv, k))
            return;
    for (int k = 0; k < srv->n_workers; k++) {
        worker_conn *wc = &srv->workers[k];
        if (fo->done[k] != 1 || !usable(srv, k))
            continue;
        fo->done[k] = 2;
        n++;
        if (psagg__ctl_send(wc->fd, &wc->auth, PSAGG_CTL_DONE, NULL, 0))
            server_drop_worker(srv, k, PSAGG_EPEER, psagg_last_error());
    }
    if (n)
        LOG_INFO(&srv->log, "every worker is done with its rounds: %d told (DONE)", n);
}

/* DONE: worker w is closing with every update of its rounds (a second one: answered again). */
void failover_done(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    struct failover *fo = fo_get(srv);
    (void)h, (void)body;
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a server view");
        return;
    }
    LOG_INFO(&srv->log, "worker %d is done with its rounds (DONE)", w);
    if (!fo->done[w])
        fo->done_at[w] = psagg__now_ms();
    fo->done[w] = 1;
    failover_done_check(srv);
}

/* Whether this server sends server s the state of chunk g: it owns g, s holds state of it. */
static int sends_state(const server *srv, const struct failover *fo, uint32_t g, int s)
{
    return fo->owner[g] == (uint32_t)srv->rank && holds_state(srv, g, s);
}

/* STATE ASK, on every live server: the state of each chunk it owns that the returning server
   holds, taken between two rounds (agg_barrier), sent to the worker that relays it. */
static void send_states(server *srv, struct failover *fo, int w, const psagg__ctl_state *ask)
{
    uint32_t n = 0, sent = 0;
    uint8_t **frames;
    size_t *lens, bytes = 0;
    psagg_status st = PSAGG_OK;
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++)
        n += sends_state(srv, fo, g, (int)ask->server);
    if (!n)
        return;
    frames = calloc(n, sizeof *frames);
    lens = calloc(n, sizeof *lens);
    if (!frames || !lens) {
        free(frames), free(lens);
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for the state of %u chunks", n);
        return;
    }
    agg_barrier(srv); /* (the chunks stay between two rounds until agg_release) */
    for (uint32_t g = 0, k = 0; g < srv->layout.n_chunks && !st; g++) {
        int slot = sends_state(srv, fo, g, (int)ask->server) ? held_slot(srv, g) : -1;
        psagg__ctl_state sh = {.server = ask->server, .epoch = ask->epoch, .chunk = g};
        if (slot >= 0 && !(st = agg_state_save(srv, &srv->chunks[slot], &sh, &frames[k], &lens[k])))
            k++;
    }
    agg_release(srv);
    for (uint32_t k = 0; k < n && !st && frames[k]; k++, sent++) {
        if (psagg__ctl_send(srv->workers[w].fd, &srv->workers[w].auth, PSAGG_CTL_STATE, frames[k],
                            (uint32_t)lens[k])) {
            server_close_worker(srv, w, "sending STATE: %s", psagg_last_error());
            break;
        }
        bytes += lens[k];
    }
    for (uint32_t k = 0; k < n; k++)
        free(frames[k]);
    free(frames), free(lens);
    if (st)
        LOG_WARN(&srv->log, "the state of server %u's chunks: %s (it comes back without it)",
                 ask->server, psagg_last_error());
    else
        LOG_INFO(&srv->log, "the state of %u chunk(s) (%.1f MB) to server %u, through worker %d",
                 sent, (double)bytes / 1e6, ask->server, w);
}

/* STATE CHUNK, on the returning server: its state of chunk sh->chunk; once every chunk it holds
   state of came, DONE to the worker that relays them. */
static void load_state(server *srv, struct failover *fo, int w, const psagg__ctl_state *sh,
                       const uint8_t *data, size_t len)
{
    int slot = sh->chunk < srv->layout.n_chunks && holds_state(srv, sh->chunk, srv->rank)
                   ? held_slot(srv, sh->chunk)
                   : -1;
    psagg_status st;
    if (slot < 0 || sh->server != (uint32_t)srv->rank) {
        server_close_worker(srv, w,
                            "STATE fields server, chunk: %u, %u: not a chunk of which "
                            "this server holds state",
                            sh->server, sh->chunk);
        return;
    }
    if (sh->epoch != fo->load_epoch) { /* (a return tried again: its states come again) */
        memset(fo->loaded, 0, srv->layout.n_chunks);
        fo->n_loaded = 0;
        fo->n_needed = count_state(srv, srv->rank);
        fo->load_epoch = sh->epoch;
    }
    agg_barrier(srv);
    st = agg_state_load(srv, &srv->chunks[slot], sh, data, len);
    agg_release(srv);
    if (st) {
        server_close_worker(srv, w, "%s", psagg_last_error());
        return;
    }
    fo->n_loaded += !fo->loaded[sh->chunk];
    fo->loaded[sh->chunk] = 1;
    if (fo->n_loaded == fo->n_needed) {
        psagg__ctl_state done = {.kind = PSAGG_STATE_DONE,
                                 .server = (uint32_t)srv->rank,
                                 .epoch = sh->epoch,
                                 .chunk = fo->n_needed};
        LOG_WARN(&srv->log, "the state of its %u chunk(s) with copies came: reporting it",
                 fo->n_needed);
        if (psagg__ctl_send(srv->workers[w].fd, &srv->workers[w].auth, PSAGG_CTL_STATE, &done,
                            sizeof done))
            server_close_worker(srv, w, "sending STATE: %s", psagg_last_error());
    }
}

/*
 * STATE RELAY, on a chunk's new owner: the update of one of the move's relayed rounds, from the
 * worker that relays it, for the chunk's aggregation thread (agg_relay). One of a view gone by
 * (the chunk moved again since) is dropped.
 */
static void relay_frame(server *srv, struct failover *fo, int w, const psagg__ctl_state *sh,
                        const uint8_t *data, size_t len)
{
    const psagg__layout *l = &srv->layout;
    const psagg__chunk_info *ci = NULL;
    psagg__msg_hdr mh = {0};
    uint8_t *bytes = NULL;
    const char *bad = NULL;
    int slot;
    if (len) { /* (an update as a worker takes one: its quorum bitmap, no MAC) */
        bad = psagg__msg_check(data, len, srv->pool.bitmap_bytes, PSAGG_MSG_UPDATE, l, &ci, NULL);
        if (!bad)
            memcpy(&mh, data, sizeof mh);
    }
    if (sh->chunk >= l->n_chunks || sh->arrays || sh->out_len != len ||
        sh->server != (uint32_t)srv->rank || bad ||
        (len && (ci != &l->chunks[sh->chunk] || mh.round != sh->round))) {
        server_close_worker(srv, w,
                            "STATE RELAY fields chunk, round, server, out_len: %u, %u, %u, %u in "
                            "%zu bytes: not an update of that chunk and round for this server%s%s",
                            sh->chunk, sh->round, sh->server, sh->out_len, len,
                            bad ? ": its field " : "", bad ? bad : "");
        return;
    }
    /* (of this view or one before: a later view may have come first on another worker's
       connection; the chunk's thread keeps only a round of its relay window, relay_take) */
    slot = fo->rejoining || sh->epoch > fo->epoch || fo->owner[sh->chunk] != (uint32_t)srv->rank
               ? -1
               : held_slot(srv, sh->chunk);
    if (slot >= 0 && fo->relay_by[sh->chunk] != (uint32_t)w && sh->epoch == fo->epoch) {
        server_close_worker(srv, w,
                            "STATE RELAY of chunk %u round %u: view %u names worker %d to relay "
                            "that chunk's rounds, not this one",
                            sh->chunk, sh->round, sh->epoch, (int)fo->relay_by[sh->chunk]);
        return;
    }
    if (slot < 0 || fo->relay_by[sh->chunk] != (uint32_t)w) { /* (a late one of a view before) */
        LOG_INFO(&srv->log,
                 "worker %d relays chunk %u's update of round %u (view %u); this server is at "
                 "view %u, where it does not own the chunk or another worker relays it: dropped",
                 w, sh->chunk, sh->round, sh->epoch, fo->epoch);
        return;
    }
    if (len && mh.len > srv->chunks[slot].out_cap) { /* (adaptive codecs: wider than declared) */
        server_close_worker(srv, w,
                            "STATE RELAY of chunk %u round %u: an update of %u bytes, more than "
                            "the chunk's %zu",
                            sh->chunk, sh->round, mh.len, srv->chunks[slot].out_cap);
        return;
    }
    if (len && !(bytes = malloc(len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a relayed update");
        return;
    }
    if (len)
        memcpy(bytes, data, len);
    if (agg_relay(srv, &srv->chunks[slot], sh->round, bytes, (uint32_t)len))
        server_fail_job(srv, PSAGG_ENOMEM, "%s", psagg_last_error());
}

void failover_state(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    struct failover *fo = fo_get(srv);
    psagg__ctl_state sh = {0};
    if (!fo) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a server view");
        return;
    }
    if (h->len >= sizeof sh)
        memcpy(&sh, body, sizeof sh);
    if (h->len < sizeof sh || sh.server >= (uint32_t)srv->cfg.n_servers ||
        (sh.kind != PSAGG_STATE_CHUNK && sh.kind != PSAGG_STATE_RELAY && h->len != sizeof sh)) {
        server_close_worker(srv, w, "a STATE frame of %u bytes (field kind %u, server %u)", h->len,
                            sh.kind, sh.server);
        return;
    }
    switch (sh.kind) {
    case PSAGG_STATE_ASK: /* (one of a view gone by, or about this server: nothing to send) */
        if (!fo->rejoining && sh.epoch == fo->epoch && !fo->live[sh.server])
            send_states(srv, fo, w, &sh);
        break;
    case PSAGG_STATE_CHUNK:
        if (fo->rejoining)
            load_state(srv, fo, w, &sh, (const uint8_t *)body + sizeof sh, h->len - sizeof sh);
        break;
    case PSAGG_STATE_RELAY:
        relay_frame(srv, fo, w, &sh, (const uint8_t *)body + sizeof sh, h->len - sizeof sh);
        break;
    case PSAGG_STATE_DONE:
        if (fo->state_wait && fo->back == (int)sh.server && sh.epoch == fo->epoch) {
            LOG_WARN(&srv->log, "server %u holds the state of its %u chunk(s) with copies",
                     sh.server, sh.chunk);
            fo->state_wait = 0;
            fo->with_state = 1;
            propose(srv, fo);
        }
        break;
    default:
        server_close_worker(srv, w, "STATE field kind: %u", sh.kind);
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

/*
 * The coordinator of an elastic job: a member done (DONE) op_timeout_ms ago while others are
 * not leaves, unless a step is under way (its last pushes may be needed till then). Workers
 * that end a job together are done within far less: they stay members to the end.
 */
static void done_leave(server *srv, struct failover *fo, int64_t now)
{
    if (!srv->mb.elastic || coordinator(srv, fo, -1) != srv->rank || fo->lost >= 0 ||
        fo->back >= 0 || fo->proposing || fo->retry_at)
        return;
    for (int w = 0; w < srv->n_workers; w++)
        if (fo->done[w] == 1 && server_member(srv, w) && !fo->gone[w] &&
            now - fo->done_at[w] > srv->cfg.op_timeout_ms)
            failover_member_left(srv, w, "it is done while the others run on", 1);
}

void failover_tick(server *srv, int64_t now)
{
    struct failover *fo = srv->failover;
    char missing[128] = "";
    size_t used = 0;
    if (fo)
        done_leave(srv, fo, now);
    if (!fo || (fo->lost < 0 && fo->back < 0 && !fo->members_step))
        return;
    if (!fo->proposing && fo->retry_at && now >= fo->retry_at) {
        propose(srv, fo);
        return;
    }
    /* (an elastic job's members may be gone: without a majority of them nothing is decided) */
    if ((fo->proposing || fo->retry_at) && srv->mb.elastic &&
        now - fo->prop_since > srv->cfg.op_timeout_ms) {
        int n = 0;
        for (int w = 0; w < srv->n_workers; w++)
            n += server_member(srv, w);
        server_fail_job(srv, PSAGG_ETIMEDOUT,
                        "view %u was not decided within op_timeout_ms=%d: fewer than a "
                        "majority of the %d members of view %u answer (an elastic job with "
                        "server_replicas goes on while more than half of each view's members live)",
                        fo->epoch + 1, srv->cfg.op_timeout_ms, n, fo->epoch);
        return;
    }
    if (fo->members_step)
        return;
    if (fo->state_wait) { /* (the workers hold its chunks meanwhile: not for ever) */
        if (now - fo->since > srv->cfg.op_timeout_ms) {
            LOG_WARN(&srv->log,
                     "server %d did not say within op_timeout_ms=%d that the state of its "
                     "chunks came: it comes back without it",
                     fo->back, srv->cfg.op_timeout_ms);
            fo->state_wait = 0;
            propose(srv, fo);
        }
        return;
    }
    /* (every report came: a lost ballot waits for its retry, no timeout; an elastic job's
       member that stopped is lost after op_timeout_ms of silence, and need not report) */
    if (fo->proposing || fo->retry_at ||
        now - fo->since <= (srv->mb.elastic ? PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms)
                                            : srv->cfg.op_timeout_ms))
        return;
    for (int w = 0; w < srv->n_workers; w++)
        if (!fo->reported[w] && server_member(srv, w) && !fo->gone[w])
            used = psagg__list_int(missing, sizeof missing, used, w);
    if (fo->lost >= 0) {
        server_fail_job(srv, PSAGG_ETIMEDOUT,
                        "server %d was lost, and workers %s did not report it within "
                        "op_timeout_ms=%d",
                        fo->lost, missing, srv->cfg.op_timeout_ms);
    } else if (!fo->holding) { /* it stays out; the workers report it again */
        LOG_WARN(&srv->log,
                 "server %d came back, but workers %s did not reach it within op_timeout_ms=%d: "
                 "it stays out of the view for now",
                 fo->back, missing, srv->cfg.op_timeout_ms);
        fo->back = -1;
    } else { /* the others hold their pushes: they cannot go on without a view */
        server_fail_job(srv, PSAGG_ETIMEDOUT,
                        "server %d came back, and workers %s did not answer the hold of its "
                        "chunks within op_timeout_ms=%d",
                        fo->back, missing, srv->cfg.op_timeout_ms);
    }
}

/* Whether server s has chunk g's state in the view applied here (a copied chunk it holds on
   the ring or owns now). */
static int state_at(const server *srv, const struct failover *fo, uint32_t g, int s)
{
    return copied(srv, g) && (holds_state(srv, g, s) || fo->owner[g] == (uint32_t)s);
}

/* The first chunk whose state no live server of the view has but this one, or n_chunks. */
static uint32_t held_alone(const server *srv, const struct failover *fo)
{
    for (uint32_t g = 0; g < srv->layout.n_chunks; g++) {
        int s = 0;
        if (!state_at(srv, fo, g, srv->rank))
            continue;
        while (s < srv->cfg.n_servers &&
               (s == srv->rank || !fo->live[s] || fo->suspect[s] || !state_at(srv, fo, g, s)))
            s++;
        if (s == srv->cfg.n_servers)
            return g;
    }
    return srv->layout.n_chunks;
}

/*
 * A copy here that is stale (aggregate.c, follow_stale) takes its owner's state again the way
 * a server that comes back does: this server leaves the job and starts anew (main.c executes
 * it again with its command line), the view gives its chunks to their copies, and its return
 * brings it the state of every chunk it holds ("Copies that follow their owner", design.md).
 * Only when that loses nothing: no change of the view under way here, no worker done, and
 * every chunk with state here held by another live server of the view; and only once the view
 * stood still for (1 + rank) x op_timeout_ms / 2, so that two servers with stale copies (one
 * worker's pushes lost to both) do not leave together: the first one's loss, which the workers
 * see at once (its connections close), reaches the other's view well before its own time.
 */
int failover_restart_due(server *srv, int64_t now)
{
    struct failover *fo;
    int64_t calm;
    uint32_t g;
    if (!atomic_load(&srv->pool.n_stale) || !srv->cfg.server_replicas || !(fo = fo_get(srv)))
        return 0;
    if (fo->rejoining || fo->lost >= 0 || fo->back >= 0 || fo->members_step || fo->proposing ||
        fo->retry_at || fo->state_wait) {
        fo->stale_at = 0;
        return 0;
    }
    for (int w = 0; w < srv->n_workers; w++)
        if (fo->done[w]) /* (the job ends: its copies are needed no more) */
            return 0;
    if (!fo->stale_at)
        fo->stale_at = now;
    calm = fo->stale_at > fo->applied_at ? fo->stale_at : fo->applied_at;
    if (now - calm < (int64_t)(1 + srv->rank) * srv->cfg.op_timeout_ms / 2)
        return 0;
    if ((g = held_alone(srv, fo)) < srv->layout.n_chunks) {
        if (!fo->restart_told)
            LOG_WARN(
                &srv->log,
                "%d stale cop%s here: this server does not start anew to take their state "
                "while no other live server holds tensor '%s' chunk %u (it waits for one)",
                atomic_load(&srv->pool.n_stale), atomic_load(&srv->pool.n_stale) == 1 ? "y" : "ies",
                srv->layout.tensors[srv->layout.chunks[g].key].name, srv->layout.chunks[g].index);
        fo->restart_told = 1;
        return 0;
    }
    LOG_WARN(&srv->log,
             "%d stale cop%s here: this server leaves the job and starts anew, to take the state "
             "of every chunk it holds from the live servers as a restarted server does",
             atomic_load(&srv->pool.n_stale), atomic_load(&srv->pool.n_stale) == 1 ? "y" : "ies");
    return 1;
}
