/*
 * membership.c - elastic membership ([cluster] elastic; the wire side is in runtime/wire.h).
 *
 * Who belongs to the job is decided in one place, the membership's owner (membership_owner:
 * the coordinator of the server view applied, server 0 as long as it lives), so that the
 * servers, which have no channel between them, can never hold two different views: when the
 * owner loses a worker (control.c's drop_worker: a closed connection, its ABORT, silence, a bad
 * message) it starts the next epoch without it and sends MEMBERSHIP to every live worker; each
 * worker relays the frame unchanged to the other servers, which apply epochs strictly in order
 * and compare every further copy of an applied epoch with the first (a difference fails the
 * job, naming the two relays). Another server that loses a worker itself only closes it and
 * waits: the worker, cut off from a server, gives up and so leaves the owner as well. (With
 * [cluster] server_replicas no MEMBERSHIP frame is used: every membership change is a server
 * view that the members of the view before it accept (failover.c: failover_member_left,
 * failover_admit), so a coordinator that dies takes no decision with it; docs/design.md,
 * "Elastic workers with replicas".)
 *
 * Applying an epoch (the control thread): the leavers' connections are closed, member[] is
 * cleared for them, and every owned chunk gets a retry in its aggregation thread, which
 * completes a round that now has every member's push (aggregate.c's agg_settle). A push of
 * a leaver that came before stays in its round.
 *
 * Joins. A worker may take the rank of one that left: it connects to every server of the
 * running job (admission.c: authenticated as any worker; the rank must have left, a live
 * member's is refused), declares (the job's declaration exactly, control.c), and sends the
 * owner a JOIN. The owner admits it at the members' next SYNC barrier (psagg_sync_membership, at a
 * point where no member has an operation in flight, so every chunk on every server is between
 * two rounds): the first member's SYNC of a barrier number decides whether it admits (a JOIN
 * is waiting) or lets everyone pass at once; an admitting barrier waits for every member,
 * then starts the epoch with the joiners live (MEMBERSHIP to every live worker, joiners
 * included, relayed to the other servers as any epoch) and answers SYNC_DONE with the
 * members' tensor rounds, where the joiners start, and ([codec] adaptive) the codec
 * assignments they keep, which the joiners take (every member's SYNC must carry the same
 * states and assignments: a worker sends it once its statistics are summed and solved). A push of
 * the new epoch that reaches a server before the epoch's relay waits for it (progress.c). An
 * admitting barrier that some member does not reach within 1.5 x op_timeout_ms lets the waiting
 * members go and refuses the joiners (naming the members it waited for); admissions are one epoch
 * per barrier, so a worker that joins and dies again and again costs the others one barrier each
 * time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/adaptive.h"
#include "runtime/channel.h"
#include "server.h"

/* A relayed MEMBERSHIP frame of an epoch ahead of the next one here (membership.c). */
#define MEMBERSHIP_AHEAD_MAX 8
typedef struct ahead_frame {
    uint32_t epoch;
    int from; /* the worker that relayed it */
    uint32_t len;
    int64_t since; /* when it came */
    void *frame;
} ahead_frame;

/* membership.c's own part of the membership (srv->mb.own; the control thread's). */
struct membership {
    void *epoch_frame; /* the MEMBERSHIP frame of the epoch applied (later copies must equal it) */
    uint32_t epoch_frame_len;
    int epoch_frame_from; /* the worker that relayed it (servers > 0) */
    void *start_frame;    /* servers > 0: server 0's start as the first worker relayed it */
    int start_frame_from;
    /* servers > 0: epochs a joiner relayed before the ones between came */
    ahead_frame ahead[MEMBERSHIP_AHEAD_MAX];
    int n_ahead;
    /* joins (the owner): the admitting barrier (seq, since when; 0: none open), the highest
       barrier let pass at once, and the members' SYNC at it after its header: the tensor
       states and the codec assignments (wire.h; sync_tail_len bytes) */
    uint32_t admit_seq;
    int64_t admit_since;
    uint32_t free_seq;
    uint8_t *sync_tail;
    size_t sync_tail_len;
    int sync_state_from; /* the worker whose SYNC was kept, or -1 */
};

psagg_status membership_init(server *srv)
{
    srv->mb.elastic = srv->cfg.elastic;
    srv->mb.n = srv->start_workers;
    atomic_store(&srv->mb.epoch, 0);
    srv->mb.own = calloc(1, sizeof *srv->mb.own);
    srv->mb.member = malloc((size_t)srv->n_workers * sizeof *srv->mb.member);
    if (!srv->mb.own || !srv->mb.member)
        return psagg__fail(PSAGG_ENOMEM, "no memory for the membership");
    for (int w = 0; w < srv->n_workers; w++) /* ranks from `workers` on join later */
        atomic_init(&srv->mb.member[w], w < srv->start_workers);
    srv->mb.own->sync_state_from = -1;
    return PSAGG_OK;
}

void membership_fini(server *srv)
{
    free(srv->job_decl);
    srv->job_decl = NULL;
    free(srv->mb.member);
    srv->mb.member = NULL;
    if (!srv->mb.own)
        return;
    free(srv->mb.own->sync_tail);
    free(srv->mb.own->epoch_frame);
    srv->mb.own->epoch_frame = NULL;
    free(srv->mb.own->start_frame);
    srv->mb.own->start_frame = NULL;
    for (int i = 0; i < srv->mb.own->n_ahead; i++)
        free(srv->mb.own->ahead[i].frame);
    free(srv->mb.own);
    srv->mb.own = NULL;
}

/* Server 0: send epoch frame m (len bytes) to every live worker, which relays it. */
static void announce(server *srv, const psagg__ctl_membership *m, uint32_t len)
{
    const uint8_t *live = (const uint8_t *)(m + 1);
    for (int k = 0; k < srv->n_workers; k++) {
        worker_conn *wc = &srv->workers[k];
        if (!live[k] || wc->fd < 0)
            continue;
        if (psagg__ctl_send(wc->fd, &wc->auth, PSAGG_CTL_MEMBERSHIP, m, len))
            server_close_worker(srv, k, "sending membership epoch %u: %s", m->epoch,
                                psagg_last_error());
    }
}

void membership_refuse(server *srv, int w, psagg_status status, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    server_verdict(srv, wc->fd, &wc->auth, PSAGG_CTL_ERROR, status, why);
    close(wc->fd);
    wc->fd = -1;
    psagg__ctl_reader_reset(&wc->rd);
    wc->state = W_DEAD;
    wc->joining = 0;
}

/* Keep the frame of the epoch applied last (a copy: later relays must equal it). */
static void keep_frame(server *srv, const void *frame, uint32_t len)
{
    void *copy = malloc(len);
    if (!copy) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for membership epoch %u",
                        atomic_load(&srv->mb.epoch));
        return;
    }
    memcpy(copy, frame, len);
    free(srv->mb.own->epoch_frame);
    srv->mb.own->epoch_frame = copy;
    srv->mb.own->epoch_frame_len = len;
}

static void admit_try(server *srv);

int membership_owner(const server *srv)
{
    return failover_coordinator(srv);
}

/*
 * Worker w leaves the job (a member): the owner starts the next epoch without it; the others
 * wait for that epoch. bye: it said BYE (psagg_close: it is done), which is no failure, so
 * fewer than min_workers left go on; a lost one below min_workers fails the job.
 */
static void leaves(server *srv, int w, const char *why, int bye)
{
    psagg__ctl_membership *m;
    uint32_t len = (uint32_t)(sizeof *m + (size_t)srv->n_workers), epoch;
    uint8_t *live;

    if (!atomic_load(&srv->mb.member[w]))
        return;
    if (membership_owner(srv) != srv->rank) {
        /* the owner decides; the worker, cut off from this server, leaves it too */
        if (bye)
            LOG_INFO(&srv->log,
                     "worker %d said BYE while the job runs; its rounds wait for server %d's "
                     "next membership epoch",
                     w, membership_owner(srv));
        else
            LOG_WARN(&srv->log,
                     "worker %d lost here (%s); its rounds wait for server %d's next membership "
                     "epoch",
                     w, why, membership_owner(srv));
        return;
    }
    if (srv->cfg.server_replicas) { /* (the next server view removes it: failover.c) */
        failover_member_left(srv, w, why, bye);
        return;
    }
    epoch = atomic_load(&srv->mb.epoch) + 1;
    server_member_leave(srv, w, epoch, why);
    if (!bye && srv->mb.n < srv->cfg.min_workers) {
        server_fail_job(srv, PSAGG_EPEER,
                        "worker %d failed (%s): %d workers left, fewer than min_workers=%d", w, why,
                        srv->mb.n, srv->cfg.min_workers);
        return;
    }
    if (!(m = calloc(1, len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for membership epoch %u", epoch);
        return;
    }
    m->epoch = epoch;
    m->n_workers = (uint32_t)srv->n_workers;
    m->n_live = (uint32_t)srv->mb.n;
    m->left = w;
    m->flags = bye ? PSAGG_MEMBERSHIP_DONE : 0;
    snprintf(m->why, sizeof m->why, "%s", why);
    live = (uint8_t *)(m + 1);
    for (int k = 0; k < srv->n_workers; k++)
        live[k] = atomic_load(&srv->mb.member[k]);
    atomic_store(&srv->mb.epoch, epoch);
    keep_frame(srv, m, len);
    /* (a worker that is done is no news: every worker leaves so at the job's end) */
    psagg__log(&srv->log, bye ? PSAGG_LOG_INFO : PSAGG_LOG_WARN,
               "membership epoch %u: worker %d left (%s); %d workers go on", epoch, w, why,
               srv->mb.n);
    metrics_membership(srv, epoch, srv->mb.n);
    announce(srv, m, len);
    free(m);
    agg_settle_routed(srv);
    if (srv->mb.own->admit_seq)
        admit_try(srv); /* the barrier may have waited only for the leaver */
}

void membership_lost(server *srv, int w, const char *why)
{
    leaves(srv, w, why, 0);
}

void membership_bye(server *srv, int w)
{
    leaves(srv, w, "it left the job (psagg_close)", 1);
}

/*
 * Apply relayed epoch frame m (checked by membership_relayed; its epoch is the next one here).
 */
static void apply_relayed(server *srv, int from, const psagg__ctl_membership *m, uint32_t len)
{
    const uint8_t *live = (const uint8_t *)(m + 1);

    /* an epoch either removes one worker (left) or admits joiners (left = -1), never both */
    for (int k = 0; k < srv->n_workers; k++) {
        int was = atomic_load(&srv->mb.member[k]);
        if ((m->left >= 0 && live[k] && !was) || (m->left < 0 && !live[k] && was)) {
            server_fail_job(srv, PSAGG_EPROTO,
                            "membership epoch %u (relayed by worker %d) %s worker %d, which %s",
                            m->epoch, from, live[k] ? "has" : "lacks", k,
                            live[k] ? "left in an earlier epoch" : "no epoch removed");
            return;
        }
    }
    for (int k = 0; k < srv->n_workers; k++) {
        if (!live[k] && atomic_load(&srv->mb.member[k]))
            server_member_leave(srv, k, m->epoch, m->why);
        if (live[k] && !atomic_load(&srv->mb.member[k])) {
            worker_conn *wc = &srv->workers[k];
            if (!wc->joining || wc->state != W_DECLARED)
                LOG_WARN(&srv->log,
                         "membership epoch %u admits worker %d, which has not joined this server "
                         "(its rounds here wait for it until server %d removes it)",
                         m->epoch, k, membership_owner(srv));
            server_member_admit(srv, k);
        }
    }
    atomic_store(&srv->mb.epoch, m->epoch);
    keep_frame(srv, m, len);
    srv->mb.own->epoch_frame_from = from;
    if (m->left >= 0)
        psagg__log(&srv->log, m->flags & PSAGG_MEMBERSHIP_DONE ? PSAGG_LOG_INFO : PSAGG_LOG_WARN,
                   "membership epoch %u (server %d's, relayed by worker %d): worker %d left "
                   "(%s); %d workers go on",
                   m->epoch, membership_owner(srv), from, m->left, m->why, srv->mb.n);
    else
        LOG_WARN(&srv->log,
                 "membership epoch %u (server %d's, relayed by worker %d): %s; %d workers now",
                 m->epoch, membership_owner(srv), from, m->why, srv->mb.n);
    metrics_membership(srv, m->epoch, srv->mb.n);
    agg_settle_routed(srv);
}

/* The frame of epoch e kept ahead (membership_relayed), or NULL. */
static ahead_frame *ahead_of(server *srv, uint32_t e)
{
    for (int i = 0; i < srv->mb.own->n_ahead; i++)
        if (srv->mb.own->ahead[i].epoch == e)
            return &srv->mb.own->ahead[i];
    return NULL;
}

/*
 * An epoch relayed ahead of this server's next one: kept until the epochs before it come.
 * Only a joiner here relays that way (the owner announces an epoch that removes a worker and
 * at once one that admits the joiner; the joiner has and relays only the second, and every
 * later one in order, while the members relay every one in order, perhaps later): its frame
 * admitting it, or the next after one of its own kept here. Anything else ahead is a skipped
 * epoch, which fails the job. Returns 0 when kept (or equal to a copy kept), -1 when not.
 */
static int keep_ahead(server *srv, int from, const psagg__ctl_membership *m, uint32_t len)
{
    const uint8_t *live = (const uint8_t *)(m + 1);
    ahead_frame *a = ahead_of(srv, m->epoch), *prev = ahead_of(srv, m->epoch - 1);
    void *copy;

    if (server_member(srv, from) || !srv->workers[from].joining ||
        !((m->left == -1 && live[from]) || (prev && prev->from == from)))
        return -1;
    if (a) {
        if (a->len != len || memcmp(a->frame, m, len))
            server_fail_job(srv, PSAGG_EPROTO,
                            "membership epoch %u as worker %d relayed it differs from the copy "
                            "worker %d relayed first",
                            m->epoch, from, a->from);
        return 0;
    }
    if (srv->mb.own->n_ahead == MEMBERSHIP_AHEAD_MAX || !(copy = malloc(len))) {
        server_fail_job(srv, PSAGG_EPROTO,
                        "worker %d relayed membership epoch %u while this server is at epoch %u "
                        "and already keeps %d epochs ahead: the epochs between never came",
                        from, m->epoch, atomic_load(&srv->mb.epoch), srv->mb.own->n_ahead);
        return 0;
    }
    memcpy(copy, m, len);
    srv->mb.own->ahead[srv->mb.own->n_ahead++] = (ahead_frame){
        .epoch = m->epoch, .from = from, .len = len, .since = psagg__now_ms(), .frame = copy};
    LOG_INFO(&srv->log,
             "membership epoch %u (relayed by worker %d, which it admits) came before epoch %u: "
             "kept until the epochs before it are relayed",
             m->epoch, from, atomic_load(&srv->mb.epoch) + 1);
    return 0;
}

void membership_relayed(server *srv, int from, const psagg__ctl_hdr *h, const void *body)
{
    const psagg__ctl_membership *m = body;
    const uint8_t *live;
    uint32_t cur = atomic_load(&srv->mb.epoch);
    int n_live = 0;
    ahead_frame *a;

    if (membership_owner(srv) == srv->rank || !srv->mb.elastic || srv->cfg.server_replicas) {
        server_close_worker(srv, from, "sent a MEMBERSHIP frame to server %d, which %s", srv->rank,
                            !srv->mb.elastic ? "runs a job that is not elastic"
                            : srv->cfg.server_replicas
                                ? "runs a job with server replicas (a server view changes the "
                                  "membership)"
                                : "decides the membership itself");
        return;
    }
    if (h->len != sizeof *m + (size_t)srv->n_workers || m->n_workers != (uint32_t)srv->n_workers) {
        server_close_worker(srv, from,
                            "MEMBERSHIP field n_workers: a frame of %u bytes for %u workers "
                            "(this job has %d)",
                            h->len, h->len >= sizeof *m ? m->n_workers : 0, srv->n_workers);
        return;
    }
    live = (const uint8_t *)(m + 1);
    for (int k = 0; k < srv->n_workers; k++) {
        if (live[k] > 1) {
            server_close_worker(srv, from, "MEMBERSHIP field live[%d] is %u (0 or 1)", k, live[k]);
            return;
        }
        n_live += live[k];
    }
    if ((uint32_t)n_live != m->n_live || m->left < -1 || m->left >= srv->n_workers ||
        (m->left >= 0 && live[m->left]) || memchr(m->why, 0, sizeof m->why) == NULL ||
        (m->flags & ~PSAGG_MEMBERSHIP_DONE) || (m->flags && m->left < 0)) {
        server_close_worker(srv, from,
                            "MEMBERSHIP fields n_live, left, flags or why are inconsistent");
        return;
    }
    if (m->epoch <= cur) { /* a copy of an epoch applied: it must be the same */
        const psagg__ctl_membership *e = srv->mb.own->epoch_frame;
        if (m->epoch == cur &&
            (h->len != srv->mb.own->epoch_frame_len || memcmp(body, e, h->len) != 0))
            server_fail_job(srv, PSAGG_EPROTO,
                            "membership epoch %u as worker %d relayed it (worker %d left, %u "
                            "live) differs from the copy applied first, worker %d's (worker %d "
                            "left, %u live)",
                            m->epoch, from, m->left, m->n_live, srv->mb.own->epoch_frame_from,
                            e->left, e->n_live);
        return;
    }
    if (m->epoch != cur + 1) {
        if (keep_ahead(srv, from, m, h->len))
            server_fail_job(srv, PSAGG_EPROTO,
                            "worker %d relayed membership epoch %u, but this server is at epoch "
                            "%u: an epoch was skipped",
                            from, m->epoch, cur);
        return;
    }
    apply_relayed(srv, from, m, h->len);
    /* the epochs a joiner relayed ahead of this one go on from here, in order */
    while (!atomic_load(&srv->job.failed) && (a = ahead_of(srv, atomic_load(&srv->mb.epoch) + 1))) {
        ahead_frame k = *a;
        *a = srv->mb.own->ahead[--srv->mb.own->n_ahead];
        apply_relayed(srv, k.from, k.frame, k.len);
        free(k.frame);
    }
}

/* ---- start-up ---- */

void *membership_start_frame(const server *srv, uint32_t *len)
{
    psagg__ctl_membership *m;
    uint8_t *live;
    *len = (uint32_t)(sizeof *m + (size_t)srv->n_workers);
    if (!(m = calloc(1, *len)))
        return NULL;
    live = (uint8_t *)(m + 1);
    m->n_workers = (uint32_t)srv->n_workers;
    m->left = -1;
    for (int w = 0; w < srv->start_workers; w++)
        m->n_live += live[w] = srv->workers[w].state == W_DECLARED;
    snprintf(m->why, sizeof m->why, "the job started");
    return m;
}

void membership_start_relayed(server *srv, int from, const psagg__ctl_hdr *h, const void *body)
{
    const psagg__ctl_membership *m = body;
    const uint8_t *live = (const uint8_t *)(m + 1);
    uint32_t n_live = 0;

    if (membership_owner(srv) == srv->rank || !srv->mb.elastic ||
        h->len != sizeof *m + (size_t)srv->n_workers || m->n_workers != (uint32_t)srv->n_workers ||
        m->epoch || m->left != -1) {
        server_close_worker(srv, from,
                            "START field n_workers, epoch or left: a frame of %u bytes (this "
                            "elastic job has %d workers; server %d)",
                            h->len, srv->n_workers, srv->rank);
        return;
    }
    for (int k = 0; k < srv->n_workers; k++) {
        if (live[k] > 1 || (live[k] && k >= srv->start_workers)) {
            server_close_worker(srv, from, "START field live[%d] is %u", k, live[k]);
            return;
        }
        n_live += live[k];
    }
    if (n_live != m->n_live || !live[from]) {
        server_close_worker(srv, from, "START fields n_live or live[%d] are inconsistent", from);
        return;
    }
    if (srv->mb.own->start_frame) { /* every starting worker relays it: the copies must agree */
        if (memcmp(srv->mb.own->start_frame, body, h->len))
            server_fail_job(srv, PSAGG_EPROTO,
                            "workers %d and %d relayed different starts of server 0",
                            srv->mb.own->start_frame_from, from);
        return;
    }
    if (!(srv->mb.own->start_frame = malloc(h->len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for the start");
        return;
    }
    memcpy(srv->mb.own->start_frame, body, h->len);
    srv->mb.own->start_frame_from = from;
    /* server 0 started without them (it lost them after their HELLO): so does this server */
    for (int k = 0; k < srv->start_workers; k++) {
        worker_conn *wc = &srv->workers[k];
        const char *why = "server 0 started the job without it (it died there during start-up)";
        if (live[k] || wc->state == W_DEAD)
            continue;
        if (wc->fd >= 0)
            membership_refuse(srv, k, PSAGG_EPEER, why);
        wc->state = W_DEAD;
        wc->lost = 1; /* (the control loop settles it when the job starts: it leaves then) */
        wc->lost_status = PSAGG_EPEER;
        snprintf(wc->why_lost, sizeof wc->why_lost, "%s", why);
        LOG_WARN(&srv->log, "worker %d: %s; as relayed by worker %d", k, why, from);
    }
}

/* ---- joins (the owner) ---- */

/* The codec assignments a SYNC carries in this job (wire.h): PSAGG_ADAPT_RING of the adaptive
   tensors' choices when it has some, else none. */
static void sync_adapt_shape(const server *srv, uint32_t *gens, uint32_t *tensors)
{
    uint32_t n = 0;
    for (uint32_t t = 0; t < srv->layout.n_tensors; t++)
        n += srv->layout.tensors[t].adaptive != 0;
    *gens = n ? PSAGG_ADAPT_RING : 0;
    *tensors = n;
}

/*
 * Answer worker w's SYNC of barrier seq: joined workers (when > 0, the members' tensor states
 * and codec assignments follow, as the SYNC kept had them).
 */
static void sync_done(server *srv, int w, uint32_t seq, uint32_t joined)
{
    worker_conn *wc = &srv->workers[w];
    size_t tail = joined ? srv->mb.own->sync_tail_len : 0;
    size_t len = sizeof(psagg__ctl_sync_done) + tail;
    psagg__ctl_sync_done *d = calloc(1, len);
    if (!d) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for SYNC_DONE");
        return;
    }
    *d = (psagg__ctl_sync_done){.seq = seq, .epoch = atomic_load(&srv->mb.epoch), .joined = joined};
    if (tail) {
        d->n_tensors = srv->layout.n_tensors;
        sync_adapt_shape(srv, &d->adapt_gens, &d->adapt_tensors);
        memcpy(d + 1, srv->mb.own->sync_tail, tail);
    }
    if (wc->fd >= 0 && psagg__ctl_send(wc->fd, &wc->auth, PSAGG_CTL_SYNC_DONE, d, (uint32_t)len))
        server_close_worker(srv, w, "sending SYNC_DONE of barrier %u: %s", seq, psagg_last_error());
    free(d);
}

/* Close the admitting barrier: every member in it passes (with `joined` admitted). */
static void barrier_release(server *srv, uint32_t joined)
{
    uint32_t seq = srv->mb.own->admit_seq;
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (wc->in_barrier || (joined && wc->sync_seq == seq && server_member(srv, w)))
            sync_done(srv, w, seq, joined);
        wc->in_barrier = 0;
        wc->view_admit = 0;
    }
    srv->mb.own->free_seq = seq;
    srv->mb.own->admit_seq = 0;
    srv->mb.own->sync_state_from = -1;
}

/* Refuse the joiners that were waiting (the barrier could not admit them). */
static void refuse_joiners(server *srv, const char *why)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (wc->joining && wc->fd >= 0 && wc->join_asked)
            membership_refuse(srv, w, PSAGG_EPEER, why);
    }
}

/*
 * The admitting barrier of a job with server replicas: once every member is in it, the joiners
 * go to the coordinator's next view (failover.c: every membership change is a view), and once
 * that view admitted them (this server applied it), the barrier is released.
 */
static void admit_by_view(server *srv)
{
    int n_join = 0;
    for (int w = 0; w < srv->n_workers; w++)
        if (server_member(srv, w) && !srv->workers[w].in_barrier && !srv->workers[w].view_admit)
            return; /* not all members are in it yet (the joiners it admitted are not) */
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (wc->view_admit && wc->joining && wc->fd >= 0)
            return; /* (the view that admits it is not applied here yet) */
        n_join += wc->view_admit;
    }
    if (n_join) {
        for (int w = 0; w < srv->n_workers; w++)
            srv->workers[w].view_admit = 0;
        LOG_WARN(&srv->log, "%d worker(s) admitted at barrier %u (a server view)", n_join,
                 srv->mb.own->admit_seq);
        barrier_release(srv, (uint32_t)n_join);
        return;
    }
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (wc->joining && wc->join_asked && wc->fd >= 0 && wc->state == W_DECLARED) {
            wc->sync_seq = srv->mb.own->admit_seq;
            wc->view_admit = 1;
            n_join++;
            failover_admit(srv, w);
        }
    }
    if (!n_join) /* the joiners left meanwhile: everyone passes */
        barrier_release(srv, 0);
}

/* The admitting barrier: once every member is in it, admit the joiners in one epoch. */
static void admit_try(server *srv)
{
    psagg__ctl_membership *m;
    uint32_t len = (uint32_t)(sizeof *m + (size_t)srv->n_workers), epoch;
    uint8_t *live;
    char who[200] = "";
    size_t used = 0;
    int n_join = 0;

    if (srv->cfg.server_replicas) {
        admit_by_view(srv);
        return;
    }
    for (int w = 0; w < srv->n_workers; w++)
        if (server_member(srv, w) && !srv->workers[w].in_barrier)
            return; /* not all members are in it yet */
    if (atomic_load(&srv->job.failed))
        return;
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (wc->joining && wc->join_asked && wc->fd >= 0 && wc->state == W_DECLARED) {
            n_join++;
            used = psagg__list_int(who, sizeof who, used, w);
        }
    }
    if (!n_join) { /* the joiners left meanwhile: everyone passes */
        barrier_release(srv, 0);
        return;
    }
    if (!(m = calloc(1, len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for a membership epoch");
        return;
    }
    epoch = atomic_load(&srv->mb.epoch) + 1;
    live = (uint8_t *)(m + 1);
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (wc->joining && wc->join_asked && wc->fd >= 0 && wc->state == W_DECLARED) {
            wc->sync_seq = srv->mb.own->admit_seq;
            server_member_admit(srv, w);
        }
        live[w] = atomic_load(&srv->mb.member[w]);
    }
    m->epoch = epoch;
    m->n_workers = (uint32_t)srv->n_workers;
    m->n_live = (uint32_t)srv->mb.n;
    m->left = -1;
    snprintf(m->why, sizeof m->why, "worker%s %s joined", n_join > 1 ? "s" : "", who);
    atomic_store(&srv->mb.epoch, epoch);
    keep_frame(srv, m, len);
    LOG_WARN(&srv->log, "membership epoch %u: %s at barrier %u; %d workers now", epoch, m->why,
             srv->mb.own->admit_seq, srv->mb.n);
    metrics_membership(srv, epoch, srv->mb.n);
    announce(srv, m, len);
    free(m);
    barrier_release(srv, (uint32_t)n_join);
}

void membership_join(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    worker_conn *wc = &srv->workers[w];
    (void)h, (void)body;
    wc->join_asked = 1;
    if (membership_owner(srv) != srv->rank) { /* (server replicas: control.c's routes) */
        LOG_INFO(&srv->log,
                 "worker %d asks to join (it asks every server); admitted at the members' next "
                 "SYNC barrier if this server coordinates before then",
                 w);
        return;
    }
    LOG_INFO(&srv->log,
             "worker %d asks to join (declared on every server); admitted at the members' next "
             "SYNC barrier",
             w);
    if (srv->mb.own->admit_seq)
        admit_try(srv); /* (a barrier open with other joiners admits it too) */
}

/* Whether a joiner waits for admission. */
static int joiner_waiting(const server *srv)
{
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->workers[w].joining && srv->workers[w].join_asked && srv->workers[w].fd >= 0)
            return 1;
    return 0;
}

/* The newest generation among a SYNC's `gens` codec assignments (wire.h), 0 when none. */
static uint32_t newest_gen(const uint8_t *assignments, uint32_t gens)
{
    uint32_t newest = 0;
    for (uint32_t r = 0; r < gens; r++) {
        uint32_t g;
        memcpy(&g, assignments + r * sizeof g, sizeof g);
        if (g != PSAGG_ADAPT_NO_GEN && g > newest)
            newest = g;
    }
    return newest;
}

void membership_sync(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    worker_conn *wc = &srv->workers[w];
    const psagg__ctl_sync *sy = body;
    const psagg__ctl_tensor_state *ts = (const psagg__ctl_tensor_state *)(sy + 1);
    uint32_t n = srv->layout.n_tensors, gens, adapt_tensors;
    size_t tail;

    sync_adapt_shape(srv, &gens, &adapt_tensors);
    tail = (size_t)psagg__ctl_sync_tail(n, gens, adapt_tensors);
    if (h->len != sizeof *sy + tail || sy->n_tensors != n || sy->adapt_gens != gens ||
        sy->adapt_tensors != adapt_tensors) {
        server_close_worker(srv, w,
                            "SYNC fields n_tensors, adapt_gens, adapt_tensors: a frame of %u "
                            "bytes (the job has %u tensors, %u of them adaptive: %u codec "
                            "assignments)",
                            h->len, n, adapt_tensors, gens);
        return;
    }
    /* (with server replicas this server may have become the owner since the worker's last
       barrier, which another one passed) */
    if (srv->cfg.server_replicas ? (int32_t)(sy->seq - wc->sync_seq) <= 0
                                 : sy->seq != wc->sync_seq + 1) {
        server_close_worker(srv, w, "SYNC field seq is %u, after barrier %u", sy->seq,
                            wc->sync_seq);
        return;
    }
    for (uint32_t t = 0; t < n; t++) {
        if (ts[t].flags & ~PSAGG_TSTATE_INITED) {
            server_close_worker(srv, w, "SYNC field flags of tensor %u is 0x%x", t, ts[t].flags);
            return;
        }
        if (ts[t].pulls > ts[t].round) {
            server_close_worker(srv, w, "SYNC field pulls of tensor %u is %u, above its round %u",
                                t, ts[t].pulls, ts[t].round);
            return;
        }
    }
    wc->sync_seq = sy->seq;
    if (!srv->mb.own->admit_seq) {
        if ((int32_t)(sy->seq - srv->mb.own->free_seq) <= 0 || !joiner_waiting(srv)) {
            if ((int32_t)(sy->seq - srv->mb.own->free_seq) > 0)
                srv->mb.own->free_seq = sy->seq;
            sync_done(srv, w, sy->seq, 0); /* nobody to admit: pass at once */
            return;
        }
        srv->mb.own->admit_seq = sy->seq; /* a joiner waits: this barrier admits it */
        srv->mb.own->admit_since = psagg__now_ms();
        srv->mb.own->sync_state_from = -1;
    } else if ((int32_t)(sy->seq - srv->mb.own->admit_seq) < 0) {
        sync_done(srv, w, sy->seq, 0); /* an earlier barrier, which let everyone pass */
        return;
    } else if (sy->seq != srv->mb.own->admit_seq) {
        server_close_worker(srv, w, "SYNC of barrier %u while barrier %u waits for it", sy->seq,
                            srv->mb.own->admit_seq);
        return;
    }
    if (srv->mb.own->sync_state_from < 0) {
        uint8_t *copy = realloc(srv->mb.own->sync_tail, tail);
        if (!copy && tail) {
            server_fail_job(srv, PSAGG_ENOMEM, "no memory for the SYNC barrier");
            return;
        }
        srv->mb.own->sync_tail = copy;
        srv->mb.own->sync_tail_len = tail;
        memcpy(srv->mb.own->sync_tail, ts, tail);
        srv->mb.own->sync_state_from = w;
    } else {
        const psagg__ctl_tensor_state *kept =
            (const psagg__ctl_tensor_state *)srv->mb.own->sync_tail;
        for (uint32_t t = 0; t < n; t++)
            if (memcmp(&ts[t], &kept[t], sizeof *ts)) {
                server_fail_job(srv, PSAGG_EPROTO,
                                "at barrier %u the workers disagree on tensor '%s': worker %d "
                                "is at round %u (flags %u, pulls %u), worker %d at round %u "
                                "(flags %u, pulls %u)",
                                sy->seq, srv->layout.tensors[t].name, srv->mb.own->sync_state_from,
                                kept[t].round, kept[t].flags, kept[t].pulls, w, ts[t].round,
                                ts[t].flags, ts[t].pulls);
                return;
            }
        if (memcmp(ts + n, kept + n, tail - (size_t)n * sizeof *ts)) {
            uint32_t a = newest_gen((const uint8_t *)(kept + n), gens);
            uint32_t b = newest_gen((const uint8_t *)(ts + n), gens);
            server_fail_job(srv, PSAGG_EPROTO,
                            "at barrier %u the workers disagree on the codec assignments "
                            "([codec] adaptive): worker %d keeps up to generation %u, worker %d "
                            "up to generation %u%s",
                            sy->seq, srv->mb.own->sync_state_from, a, w, b,
                            a == b ? ", with other choices" : "");
            return;
        }
    }
    wc->in_barrier = 1;
    admit_try(srv);
}

/*
 * An epoch kept ahead (keep_ahead) whose predecessors did not come within 1.5 x op_timeout_ms
 * (every member relays every epoch at once): the job fails, naming it.
 */
static void check_ahead(server *srv, int64_t now)
{
    for (int i = 0; i < srv->mb.own->n_ahead; i++)
        if (now - srv->mb.own->ahead[i].since > PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms)) {
            server_fail_job(srv, PSAGG_ETIMEDOUT,
                            "worker %d relayed membership epoch %u, but no worker relayed "
                            "epoch %u within 1.5 x op_timeout_ms=%d",
                            srv->mb.own->ahead[i].from, srv->mb.own->ahead[i].epoch,
                            atomic_load(&srv->mb.epoch) + 1, srv->cfg.op_timeout_ms);
            return;
        }
}

void membership_tick(server *srv, int64_t now)
{
    char missing[128] = "", why[300];
    size_t used = 0;
    check_ahead(srv, now);
    if (srv->cfg.server_replicas && srv->mb.own->admit_seq)
        admit_try(srv); /* (the view that admits its joiners may have come) */
    if (!srv->mb.own->admit_seq ||
        now - srv->mb.own->admit_since <= PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms))
        return;
    for (int w = 0; w < srv->n_workers; w++)
        if (server_member(srv, w) && !srv->workers[w].in_barrier)
            used = psagg__list_int(missing, sizeof missing, used, w);
    snprintf(why, sizeof why,
             "not admitted: members %s did not reach barrier %u (psagg_sync_membership) within "
             "1.5 x op_timeout_ms=%d",
             missing, srv->mb.own->admit_seq, srv->cfg.op_timeout_ms);
    LOG_WARN(&srv->log, "%s; the members that waited go on, the joiners are refused", why);
    refuse_joiners(srv, why);
    barrier_release(srv, 0);
}
