/*
 * control.c - psagg-server's control loop, on the main thread: a dispatcher. It polls the
 * listening socket and the connections that have not authenticated (admission.c) and the
 * workers' connections, and hands each worker frame to the component it is for (the table
 * `routes`: startup.c, membership.c, checkpoint.c); between polls it moves the job through its
 * phases. Every socket is non-blocking and every frame is read piece by piece
 * (psagg__ctl_reader), so no peer, slow or silent or hostile, holds up the others.
 *
 *   STARTING  admission until every starting worker declared (startup.c), within
 *             connect_timeout_ms of the first authenticated HELLO; then the job starts
 *   RUNNING   BYE, PING, ABORT and closed connections; PING every worker and close one that
 *             is silent for op_timeout_ms (runtime/channel.h); close the workers the data
 *             path names (job.c); what a loss means is decided here (settle_losses): an
 *             elastic job goes on without it (membership.c), any other fails, and every
 *             worker is told why (the status and message of the first failure)
 *   ABORTED   the job failed and every worker was told; wait for them to go
 * and it ends when every worker is gone (0: every one said BYE and the job never failed).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "server.h"

enum phase { STARTING, RUNNING, ABORTED };

typedef struct control_loop {
    enum phase phase;
    int64_t aborted_at;
    int done; /* leave the loop with rc */
    int rc;
} control_loop;

/* ---- the workers, counted ---- */

static int count_state(const server *srv, enum worker_state s)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].state == s;
    return n;
}

/* Workers connected to join the running job, not admitted yet. */
static int count_joiners(const server *srv)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].joining && srv->workers[w].fd >= 0 && srv->workers[w].state != W_BYE &&
             srv->workers[w].state != W_DEAD;
    return n;
}

/* Workers lost without leaving the job: any dead one, unless it left an elastic job's epoch. */
static int dead_members(const server *srv)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].state == W_DEAD && (!srv->mb.elastic || server_member(srv, w));
    return n;
}

/* The workers whose state is below `below` (still connected: below W_BYE, fd open). */
static void missing_workers(const server *srv, enum worker_state below, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->workers[w].state < below && (below != W_BYE || srv->workers[w].fd >= 0) &&
            (below != W_DECLARED || w < server_start_ranks(srv))) /* (the rest join later) */
            used = psagg__list_int(buf, len, used, w);
}

/* ---- losses ---- */

/* The data-path threads ask for peers to be closed (job.c): close them here. */
static void close_named_workers(server *srv)
{
    for (int w = 0; w < srv->n_workers; w++) {
        char reason[200];
        psagg_status status;
        pthread_mutex_lock(&srv->job.mu);
        snprintf(reason, sizeof reason, "%s", srv->workers[w].bad_reason);
        status = srv->workers[w].bad_status;
        srv->workers[w].bad_reason[0] = '\0';
        pthread_mutex_unlock(&srv->job.mu);
        if (reason[0])
            server_drop_worker(srv, w, status, reason);
    }
}

/*
 * What each worker closed since (server_drop_worker) means for the job: an elastic job goes
 * on without it (once it runs: one lost during start-up starts out of it, min_workers
 * permitting); any other job fails, with PSAGG_EPEER, or PSAGG_ETIMEDOUT when the worker gave
 * up on a deadline (its ABORT), so that every worker sees what kind of failure stopped it.
 */
static void settle_losses(server *srv)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        psagg_status status = wc->lost_status == PSAGG_ETIMEDOUT ? PSAGG_ETIMEDOUT : PSAGG_EPEER;
        char msg[320];
        if (!wc->lost)
            continue;
        if (srv->mb.elastic && !atomic_load(&srv->job.failed)) {
            if (!srv->ctl.job_running)
                continue; /* (settled when the job starts) */
            wc->lost = 0;
            membership_lost(srv, w, wc->why_lost);
            continue;
        }
        wc->lost = 0;
        snprintf(msg, sizeof msg, "worker %d failed: %.250s", w, wc->why_lost);
        server_fail_job(srv, status, "%s", msg);
        snprintf(msg, sizeof msg, "server %d: worker %d failed: %.250s", srv->rank, w,
                 wc->why_lost);
        server_tell_workers(srv, w, PSAGG_CTL_ABORT, status, msg);
    }
}

/* ---- worker frames ---- */

/* BYE: it is done (psagg_close); an elastic job goes on without it (the others may not be). */
static void worker_bye(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    worker_conn *wc = &srv->workers[w];
    (void)h, (void)body;
    LOG_INFO(&srv->log, "worker %d said BYE", w);
    wc->state = W_BYE;
    close(wc->fd);
    wc->fd = -1;
    psagg__ctl_reader_reset(&wc->rd);
    if (srv->mb.elastic && srv->ctl.job_running && !atomic_load(&srv->job.failed))
        membership_bye(srv, w);
    failover_done_check(srv); /* (the others' DONE may wait for it) */
}

/* ABORT: it gave up (why, and on what kind of failure). */
static void worker_abort(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    const char *text;
    char m[300];
    psagg__ctl_error e; /* (parsed in a copy: it ends the text) */
    psagg_status st = PSAGG_OK;
    if (h->len == sizeof e) {
        memcpy(&e, body, sizeof e);
        st = psagg__ctl_error_parse(h, &e, &text);
    }
    if (!st) {
        server_drop_worker(srv, w, PSAGG_EPROTO, "an ABORT frame without a failure");
        return;
    }
    snprintf(m, sizeof m, "it gave up: %s", text);
    server_drop_worker(srv, w, st, m);
}

/* When a frame is expected (all of a route's flags must hold). */
enum {
    EMPTY = 1 << 0,     /* it has no body */
    HELLOED = 1 << 1,   /* the worker authenticated and has not declared */
    DECLARED = 1 << 2,  /* it declared */
    BEFORE = 1 << 3,    /* the job has not started here */
    RUNS = 1 << 4,      /* the job runs */
    ELASTIC = 1 << 5,   /* [cluster] elastic */
    OWNER = 1 << 6,     /* on the membership's owner (membership_owner) */
    OTHERS = 1 << 7,    /* on another server */
    MEMBER = 1 << 8,    /* the worker is a member */
    JOINING = 1 << 9,   /* the worker is a joiner (not admitted) */
    NO_JOIN = 1 << 10,  /* ... that has not asked to join yet */
    POOL = 1 << 11,     /* the aggregation pool runs */
    REPLICAS = 1 << 12, /* [cluster] server_replicas */
    MEMBER_OR_JOINING = MEMBER | JOINING,
};

typedef struct frame_route {
    uint16_t type;
    unsigned when;
    /* NULL: expected, and nothing to do (PING: its bytes made the worker heard) */
    void (*serve)(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
} frame_route;

static const frame_route routes[] = {
    {PSAGG_CTL_PING, EMPTY, NULL},
    {PSAGG_CTL_BYE, 0, worker_bye},
    {PSAGG_CTL_ABORT, 0, worker_abort},
    {PSAGG_CTL_DECLARE, HELLOED, startup_declare},
    {PSAGG_CTL_CHECKPOINT, DECLARED | POOL, checkpoint_asked}, /* (a joiner's: refused) */
    /* elastic membership: relayed epochs and starts, joins' barriers */
    {PSAGG_CTL_MEMBERSHIP, DECLARED | RUNS | MEMBER_OR_JOINING, membership_relayed},
    {PSAGG_CTL_SYNC, DECLARED | RUNS | ELASTIC | OWNER | MEMBER, membership_sync},
    {PSAGG_CTL_START, DECLARED | BEFORE | ELASTIC | OTHERS, membership_start_relayed},
    {PSAGG_CTL_START, RUNS | ELASTIC | OTHERS, NULL}, /* (each worker relays it: one did) */
    {PSAGG_CTL_JOIN, EMPTY | DECLARED | JOINING | NO_JOIN | OWNER, membership_join},
    /* (server replicas: a joiner asks every server; kept until this one coordinates) */
    {PSAGG_CTL_JOIN, EMPTY | DECLARED | JOINING | NO_JOIN | OTHERS | REPLICAS, membership_join},
    /* servers that fail: a worker's report, the agreement's answers, a decided view relayed */
    {PSAGG_CTL_SERVER_LOST, DECLARED | RUNS | REPLICAS, failover_lost},
    {PSAGG_CTL_AGREE, DECLARED | RUNS | REPLICAS, failover_agree},
    {PSAGG_CTL_VIEW, DECLARED | RUNS | REPLICAS, failover_view},
    {PSAGG_CTL_SERVER_BACK, DECLARED | RUNS | REPLICAS, failover_back},
    {PSAGG_CTL_DONE, EMPTY | DECLARED | RUNS | REPLICAS, failover_done}, /* (psagg_close) */
    {PSAGG_CTL_STATE, DECLARED | RUNS | REPLICAS, failover_state},
};

static int route_holds(const server *srv, int w, const psagg__ctl_hdr *h, unsigned when)
{
    const worker_conn *wc = &srv->workers[w];
    unsigned now = (h->len == 0 ? EMPTY : 0) | (wc->state == W_HELLO ? HELLOED : 0) |
                   (wc->state == W_DECLARED ? DECLARED : 0) |
                   (srv->ctl.job_running ? RUNS : BEFORE) | (srv->mb.elastic ? ELASTIC : 0) |
                   (membership_owner(srv) == srv->rank ? OWNER : OTHERS) |
                   (server_member(srv, w) ? MEMBER : 0) | (wc->joining ? JOINING : 0) |
                   (!wc->join_asked ? NO_JOIN : 0) | (srv->pool.started ? POOL : 0) |
                   (srv->cfg.server_replicas ? REPLICAS : 0);
    unsigned need = when & ~(unsigned)MEMBER_OR_JOINING;
    if ((now & need) != need)
        return 0;
    /* MEMBER and JOINING: either will do when a route names both */
    return !(when & MEMBER_OR_JOINING) || (now & when & MEMBER_OR_JOINING);
}

/* A worker's socket is readable: a whole frame goes to its route, a dead connection closes. */
static void serve_worker(server *srv, int w)
{
    worker_conn *wc = &srv->workers[w];
    const frame_route *r = NULL;
    psagg__ctl_hdr h;
    void *body;
    char name[32];
    psagg_status st;

    snprintf(name, sizeof name, "worker %d", w);
    st = psagg__ctl_reader_feed(&wc->rd, wc->fd, name);
    wc->heard_at = psagg__now_ms(); /* readable: it is alive, whatever came */
    if (st == PSAGG_EAGAIN)
        return;
    if (st) {
        server_drop_worker(srv, w, st, psagg_last_error());
        return;
    }
    body = psagg__ctl_reader_take(&wc->rd, &h);
    for (size_t i = 0; i < sizeof routes / sizeof *routes && !r; i++)
        if (routes[i].type == h.type && route_holds(srv, w, &h, routes[i].when))
            r = &routes[i];
    if (!r) {
        char m[120];
        snprintf(m, sizeof m, "unexpected control frame type %u in state %d", h.type, wc->state);
        server_drop_worker(srv, w, PSAGG_EPROTO, m);
    } else if (r->serve) {
        r->serve(srv, w, &h, body);
    }
    free(body);
}

/* ---- the phases ---- */

/* Start-up is over, one way or the other: tell every connected worker why it failed. */
static void startup_failed(server *srv, control_loop *l, psagg_status status, const char *msg)
{
    LOG_ERROR(&srv->log, "%s", msg);
    server_tell_workers(srv, -1, PSAGG_CTL_ERROR, status, msg);
    l->rc = 1;
    l->done = 1;
}

/* STARTING: start the job once every starting worker declared; fail on deaths or the deadline. */
static void starting(server *srv, control_loop *l, int64_t now)
{
    int dead = count_state(srv, W_DEAD), declared = count_state(srv, W_DECLARED);
    char missing[128], msg[512];
    psagg_status st;

    if (dead > 0 && !srv->mb.elastic) { /* (named, with the first one's reason) */
        int first = -1;
        size_t used = 0;
        for (int w = 0; w < srv->n_workers; w++)
            if (srv->workers[w].state == W_DEAD) {
                used = psagg__list_int(missing, sizeof missing, used, w);
                first = first < 0 ? w : first;
            }
        snprintf(msg, sizeof msg, "server %d: worker%s %s failed during start-up: %.300s",
                 srv->rank, dead > 1 ? "s" : "", missing, srv->workers[first].why_lost);
        startup_failed(srv, l, PSAGG_EPEER, msg);
        return;
    }
    if (dead > 0 && srv->start_workers - dead < srv->cfg.min_workers) {
        snprintf(msg, sizeof msg,
                 "server %d: %d workers died during start-up: %d left, fewer than "
                 "min_workers=%d",
                 srv->rank, dead, srv->start_workers - dead, srv->cfg.min_workers);
        startup_failed(srv, l, PSAGG_EPEER, msg);
        return;
    }
    /* (elastic: the workers that died start out of it, as joinable ranks) */
    if (declared > 0 && declared + dead >= server_start_count(srv)) {
        if ((st = startup_start(srv, msg, sizeof msg))) {
            startup_failed(srv, l, st, msg);
            return;
        }
        if (!srv->mb.elastic) {
            /* nobody else may join now: later connections are refused by the kernel */
            close(srv->ctl.listen_fd);
            srv->ctl.listen_fd = -1;
            admission_close_all(srv);
        }
        for (int w = 0; w < srv->n_workers; w++) /* their silence counts from now */
            srv->workers[w].heard_at = now;
        l->phase = RUNNING;
        srv->ctl.job_running = 1;
        settle_losses(srv); /* the job goes on without those lost during start-up */
        return;
    }
    if (admission_deadline(srv) >= 0 && now > admission_deadline(srv)) {
        missing_workers(srv, W_DECLARED, missing, sizeof missing);
        if (missing[0]) {
            snprintf(msg, sizeof msg,
                     "server %d: workers %s did not arrive and declare within "
                     "connect_timeout_ms=%d of the first worker",
                     srv->rank, missing, srv->cfg.connect_timeout_ms);
        } else { /* every rank declared, but some said BYE before the job could start */
            size_t used = 0;
            for (int w = 0; w < srv->n_workers; w++)
                if (srv->workers[w].state == W_BYE)
                    used = psagg__list_int(missing, sizeof missing, used, w);
            snprintf(msg, sizeof msg,
                     "server %d: workers %s declared and then left (BYE) before the job started; "
                     "the others waited connect_timeout_ms=%d of the first worker",
                     srv->rank, missing[0] ? missing : "?", srv->cfg.connect_timeout_ms);
        }
        startup_failed(srv, l, PSAGG_ETIMEDOUT, msg);
        return;
    }
    admission_expire(srv, now);
}

/*
 * RUNNING, now and then: PING every worker, and close a worker that has sent nothing for
 * op_timeout_ms (stopped or hung), which fails the job naming it.
 */
static void check_liveness(server *srv, int64_t now)
{
    int op = srv->cfg.op_timeout_ms;
    /* an elastic job gives a worker up sooner: the others wait for it meanwhile */
    int64_t limit = srv->mb.elastic ? psagg__member_timeout_ms(op) : op;
    if (now >= srv->ctl.next_ping) {
        for (int w = 0; w < srv->n_workers; w++) {
            worker_conn *wc = &srv->workers[w];
            if (wc->fd >= 0 && wc->state == W_DECLARED &&
                psagg__ctl_send(wc->fd, &wc->auth, PSAGG_CTL_PING, NULL, 0))
                LOG_DEBUG(&srv->log, "worker %d: PING: %s", w, psagg_last_error());
        }
        srv->ctl.next_ping = now + psagg__ping_interval_ms(op);
    }
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        char why[160];
        if (wc->fd >= 0 && wc->joining && wc->state == W_HELLO &&
            now - wc->heard_at > srv->cfg.connect_timeout_ms) {
            server_drop_worker(srv, w, PSAGG_ETIMEDOUT,
                               "it connected to join but did not declare within "
                               "connect_timeout_ms");
            continue;
        }
        if (wc->fd < 0 || wc->state != W_DECLARED || now - wc->heard_at <= limit)
            continue;
        if (srv->mb.elastic)
            snprintf(why, sizeof why,
                     "worker %d sent nothing for %.1f s, more than 3 PING intervals of %d ms "
                     "(stopped, hung or cut off)",
                     w, (double)(now - wc->heard_at) / 1e3, psagg__ping_interval_ms(op));
        else
            snprintf(why, sizeof why,
                     "worker %d sent nothing for %.1f s, more than op_timeout_ms=%d (stopped, "
                     "hung or cut off)",
                     w, (double)(now - wc->heard_at) / 1e3, op);
        server_drop_worker(srv, w, PSAGG_ETIMEDOUT, why);
    }
    settle_losses(srv);
}

/* RUNNING: a failed job aborts (every worker told); the rest of the components' deadlines. */
static void running(server *srv, control_loop *l, int64_t now)
{
    if (atomic_load(&srv->job.failed)) {
        char msg[512];
        psagg_status status;
        pthread_mutex_lock(&srv->job.mu);
        snprintf(msg, sizeof msg, "server %d: %.200s", srv->rank, srv->job.error);
        status = srv->job.status ? srv->job.status : PSAGG_EPEER;
        pthread_mutex_unlock(&srv->job.mu);
        LOG_ERROR(&srv->log, "job failed: %s", msg);
        server_tell_workers(srv, -1, PSAGG_CTL_ABORT, status, msg);
        l->phase = ABORTED;
        l->aborted_at = now;
        return;
    }
    check_liveness(srv, now);
    checkpoint_tick(srv, now);            /* (a collective checkpoint's members, its deadline) */
    failover_tick(srv, now);              /* (a lost server's reports, the agreement's retries) */
    if (failover_restart_due(srv, now)) { /* (its stale copies: failover.c) */
        l->rc = SERVER_RESTART;
        l->done = 1;
        return;
    }
    if (srv->mb.elastic) { /* joins: admission stays open (admission.c, membership.c) */
        membership_tick(srv, now);
        admission_expire(srv, now);
    }
}

/* ABORTED: every worker was told; one that is still connected later is stuck or stopped. */
static void aborted(server *srv, control_loop *l, int64_t now)
{
    char missing[128];
    if (now - l->aborted_at <= srv->cfg.op_timeout_ms)
        return;
    missing_workers(srv, W_BYE, missing, sizeof missing);
    LOG_ERROR(&srv->log,
              "the job failed and workers %s are still connected op_timeout_ms=%d later; leaving",
              missing, srv->cfg.op_timeout_ms);
    l->rc = 1;
    l->done = 1;
}

/* Once the job started: every worker is gone (W_NONE: a rank beyond `workers` that never
   joined), so the loop ends; 0 when none failed. */
static void every_worker_gone(server *srv, control_loop *l)
{
    if (count_state(srv, W_BYE) + count_state(srv, W_DEAD) + count_state(srv, W_NONE) +
            count_joiners(srv) !=
        srv->n_workers)
        return;
    if (count_joiners(srv))
        server_tell_workers(srv, -1, PSAGG_CTL_ERROR, PSAGG_EPEER,
                            "the job ended before this worker could join it: every member is "
                            "gone");
    /* (the workers that left an elastic job are no failure of it; one lost here that the
       membership's owner never removed is) */
    l->rc = atomic_load(&srv->job.failed) || dead_members(srv) ? 1 : 0;
    LOG_INFO(&srv->log, "all workers gone, job %s", l->rc ? "failed" : "done");
    metrics_usage(srv);
    l->done = 1;
}

/* A signal: tell every worker, and exit 0 only if the job was done anyway. */
static void stopped(server *srv, control_loop *l)
{
    LOG_INFO(&srv->log, "stopping on signal");
    server_tell_workers(srv, -1, PSAGG_CTL_ABORT, PSAGG_ECLOSED, "server stopped by a signal");
    l->rc = l->phase != STARTING && !atomic_load(&srv->job.failed) &&
                    count_state(srv, W_BYE) + count_state(srv, W_NONE) == srv->n_workers
                ? 0
                : 143;
    l->done = 1;
}

/*
 * The control loop: returns the process exit code. Each turn: the data path's reports and
 * the losses, the phase's own work, then one poll of every socket and each ready one served.
 */
int control_serve(server *srv)
{
    control_loop l = {.phase = STARTING, .rc = 1};
    size_t cap = (size_t)srv->n_workers + PENDING_MAX + 1;
    struct pollfd *pfd = calloc(cap, sizeof *pfd);
    int *who = calloc(cap, sizeof *who); /* >= 0 worker, -1 listen, -2 - i pending slot i */

    if (!pfd || !who) {
        LOG_ERROR(&srv->log, "no memory for the control loop");
        l.done = 1;
    }
    while (!l.done) {
        int64_t now = psagg__now_ms();
        int n = 0;

        if (*srv->stop) {
            stopped(srv, &l);
            break;
        }
        close_named_workers(srv);
        settle_losses(srv);
        if (l.phase == STARTING)
            starting(srv, &l, now);
        else if (l.phase == RUNNING)
            running(srv, &l, now);
        else
            aborted(srv, &l, now);
        if (!l.done && l.phase != STARTING)
            every_worker_gone(srv, &l);
        if (l.done)
            break;
        if (l.phase == STARTING || (l.phase == RUNNING && srv->mb.elastic))
            n = admission_poll_add(srv, pfd, who, n);
        for (int w = 0; w < srv->n_workers; w++)
            if (srv->workers[w].fd >= 0) {
                pfd[n] = (struct pollfd){.fd = srv->workers[w].fd, .events = POLLIN};
                who[n++] = w;
            }
        if (poll(pfd, (nfds_t)n, 50) < 0 && errno != EINTR) {
            LOG_ERROR(&srv->log, "poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (who[i] < 0)
                admission_serve(srv, who[i], pfd[i].fd);
            else if (srv->workers[who[i]].fd >= 0)
                serve_worker(srv, who[i]);
            settle_losses(srv);
        }
    }
    admission_close_all(srv);
    free(pfd);
    free(who);
    return l.rc;
}
