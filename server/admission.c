/*
 * admission.c - connections that have not authenticated yet (the control thread, during
 * start-up). Every accepted connection waits in a pending slot until it has sent a whole HELLO:
 * it has HELLO_TIMEOUT_MS (at most connect_timeout_ms) to do so and at most PENDING_MAX wait at
 * a time (the oldest is closed first), so idle or slow connections can neither stall the
 * control loop nor crowd out the job's workers. Each is sent a CHALLENGE of its own at once;
 * its HELLO must carry this build's protocol version and a token that binds it to this server
 * and that challenge (runtime/auth.h) before anything about the job is said; then its
 * connection becomes its worker's (control.c), answered with a WELCOME whose token binds it
 * to that HELLO. Closed connections are counted and reported at most every 5 s.
 */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/auth.h"
#include "runtime/channel.h"
#include "server.h"

/*
 * A connection that has not authenticated yet (admission.c): it has until `deadline` to send a
 * whole HELLO, and at most PENDING_MAX of them are kept (the oldest goes first), so idle or
 * slow connections can neither stall the control loop nor crowd out the job's workers.
 */
typedef struct pending_conn {
    int fd;
    int64_t deadline;
    psagg__ctl_reader rd;
    uint8_t challenge[PSAGG_CHALLENGE_BYTES]; /* sent in its CHALLENGE; its HELLO must bind it */
    char peer[80];                            /* "connection from ADDR:PORT", for the log */
} pending_conn;

/* The admission component (the control thread's; srv->adm). */
struct admission {
    pending_conn pending[PENDING_MAX]; /* fd < 0 when free */
    uint64_t refused_idle;             /* unauthenticated connections closed for time or room */
    int64_t refused_logged_at;         /* when they were last reported */
    psagg__lograte refused_hello;      /* refused HELLOs (a flood of them: one record a second) */
    int64_t startup_deadline;          /* -1 until the first authenticated HELLO */
};

#define HELLO_TIMEOUT_MS 5000 /* for a connection to deliver its whole HELLO */

static void pending_close(pending_conn *p)
{
    close(p->fd);
    p->fd = -1;
    psagg__ctl_reader_reset(&p->rd);
}

/* How long a connection may take to send its whole HELLO. */
static int hello_timeout_ms(const server *srv)
{
    return srv->cfg.connect_timeout_ms < HELLO_TIMEOUT_MS ? srv->cfg.connect_timeout_ms
                                                          : HELLO_TIMEOUT_MS;
}

/* Accept the connections the listening socket has, each into a pending slot: at most
   PENDING_MAX a turn, so that a flood of them cannot keep the control loop from the workers'
   frames (the socket stays readable: the rest are accepted on the next turns). */
static void accept_all(server *srv)
{
    for (int turn = 0; turn < PENDING_MAX; turn++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        pending_conn *slot = NULL, *oldest = NULL;
        char host[48], port[8];
        int fd =
            accept4(srv->ctl.listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN: all taken; anything else: try again on the next poll */
        for (int i = 0; i < PENDING_MAX && !slot; i++) {
            pending_conn *p = &srv->adm->pending[i];
            if (p->fd < 0)
                slot = p;
            else if (!oldest || p->deadline < oldest->deadline)
                oldest = p;
        }
        if (!slot) { /* full: the connection that has waited longest makes room */
            pending_close(oldest);
            srv->adm->refused_idle++;
            slot = oldest;
        }
        slot->fd = fd;
        slot->deadline = psagg__now_ms() + hello_timeout_ms(srv);
        psagg__ctl_reader_init(&slot->rd, sizeof(psagg__ctl_hello), NULL);
        psagg__challenge_make(slot->challenge);
        { /* 28 bytes into a fresh socket's empty buffer: a failure means it is gone */
            psagg__ctl_challenge c;
            memcpy(c.challenge, slot->challenge, sizeof c.challenge);
            if (psagg__ctl_send(fd, NULL, PSAGG_CTL_CHALLENGE, &c, sizeof c)) {
                pending_close(slot);
                srv->adm->refused_idle++;
                continue;
            }
        }
        if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, port, sizeof port,
                        NI_NUMERICHOST | NI_NUMERICSERV))
            snprintf(host, sizeof host, "?"), snprintf(port, sizeof port, "?");
        snprintf(slot->peer, sizeof slot->peer, "connection from %s:%s", host, port);
    }
}

/* Say how many unauthenticated connections were closed: at most every 5 s, or now (final). */
static void report_refused(server *srv, int64_t now, int final)
{
    static const int64_t every_ms = 5000;
    if (!srv->adm->refused_idle || (!final && now < srv->adm->refused_logged_at + every_ms))
        return;
    LOG_WARN(&srv->log,
             "closed %llu connection(s) that sent no whole HELLO within %d ms, found no room "
             "(at most %d may wait for their HELLO at once) or came after the job started",
             (unsigned long long)srv->adm->refused_idle, hello_timeout_ms(srv), PENDING_MAX);
    srv->adm->refused_idle = 0;
    srv->adm->refused_logged_at = now;
}

/* Close the pending connections whose HELLO did not come in time; say so now and then. */
void admission_expire(server *srv, int64_t now)
{
    for (int i = 0; i < PENDING_MAX; i++)
        if (srv->adm->pending[i].fd >= 0 && now > srv->adm->pending[i].deadline) {
            pending_close(&srv->adm->pending[i]);
            srv->adm->refused_idle++;
        }
    report_refused(srv, now, 0);
}

/*
 * Same-host copies with a worker (wire.h): offer ours in its WELCOME, and take its offer when
 * it checks out (its pushes are then copied out of its memory; the WELCOME says so).
 */
static void local_copy_offer(server *srv, int rank, const psagg__ctl_hello *hello,
                             psagg__ctl_welcome *wel)
{
    psagg__peer addr = srv->workers[rank].addr;
    uint32_t pid;

    psagg__fabric_local_self(srv->fab, &pid, &wel->local_probe, wel->local_commit);
    wel->local_pid = pid;
    if (!hello->local_pid)
        return;
    if (psagg__fabric_local_accept(srv->fab, addr, hello->local_pid, hello->local_probe,
                                   hello->local_commit, hello->epname, hello->epname_len)) {
        LOG_DEBUG(&srv->log, "worker %d offers same-host copies; not taken: %s", rank,
                  psagg_last_error());
        return;
    }
    wel->local_flags = PSAGG_LOCAL_READS;
    LOG_INFO(&srv->log, "worker %d is on this host: pushes by same-host copy", rank);
}

/*
 * A restarted server of an elastic job whose first HELLOs said that the job starts, until
 * worker `by` (authenticated) said that it runs and that this server ran it before: those were
 * joiners, restarted with this server and quicker than the members (which say HELLO_REJOIN
 * every REJOIN_EVERY_MS); taken for the job's start they would hold the members' HELLOs off
 * until connect_timeout_ms failed this server. Each is forgotten (its connection closed with
 * EAGAIN, its slot free again), and joins once this server runs the job with the members.
 */
static void forget_joiners(server *srv, int by)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        char why[200];
        if (w == by || wc->state == W_NONE)
            continue;
        snprintf(why, sizeof why,
                 "server %d: worker %d says the job runs and that this server comes back to it: "
                 "worker %d joins it once it runs here: try again",
                 srv->rank, by, w);
        LOG_WARN(&srv->log, "%s", why);
        if (wc->fd >= 0) {
            server_verdict(srv, wc->fd, &wc->auth, PSAGG_CTL_ERROR, PSAGG_EAGAIN, why);
            close(wc->fd);
            wc->fd = -1;
        }
        psagg__ctl_reader_reset(&wc->rd);
        if (wc->addr < (psagg__peer)srv->n_workers && srv->rank_at[wc->addr] == w)
            srv->rank_at[wc->addr] = -1;
        free(wc->decl);
        wc->decl = NULL;
        wc->state = W_NONE;
        wc->lost = 0;
        wc->joining = 0;
    }
}

/*
 * Authenticate a HELLO and register its worker: 0, or -1 with the refusal in msg (-2: a
 * joiner that may try again in a moment). Until the token checks out the refusal says
 * nothing about this job (not its id, not its size).
 */
static int accept_hello(server *srv, const pending_conn *p, const psagg__ctl_hello *hello,
                        char *msg, size_t len)
{
    int fd = p->fd;
    const char *peer = p->peer;
    uint8_t expect[PSAGG_TOKEN_BYTES];
    uint32_t flags = srv->cfg.data_auth ? PSAGG_HELLO_DATA_AUTH : 0;
    char job_id[PSAGG_JOB_ID_MAX];
    worker_conn *wc;
    int rank;

    snprintf(job_id, sizeof job_id, "%.*s", PSAGG_JOB_ID_MAX - 1, hello->job_id);
    if (srv->job_key.secret) {
        /* the token of this HELLO as a worker of *this* job would have made it: a worker of
           another job id with the same secret fails here, learning nothing */
        psagg__ctl_hello mine = *hello;
        memset(mine.job_id, 0, sizeof mine.job_id);
        snprintf(mine.job_id, sizeof mine.job_id, "%s", srv->cfg.job_id);
        psagg__hello_token(&srv->job_key, &mine, (uint32_t)srv->rank, p->challenge, expect);
        if (!psagg__token_equal(expect, hello->auth)) {
            snprintf(msg, len,
                     "server %d: authentication failed (the job id or the secret_file differs, "
                     "or the HELLO was not made for this connection's challenge: a replay)",
                     srv->rank);
            return -1;
        }
    } else if (strcmp(job_id, srv->cfg.job_id)) {
        snprintf(msg, len, "server %d serves another job (job id '%.63s' is not it)", srv->rank,
                 job_id);
        return -1;
    }
    /* authenticated: from here on a refusal may say what this job is */
    if ((int)hello->world_size != srv->n_workers || hello->rank >= hello->world_size) {
        snprintf(msg, len,
                 "server %d: worker rank %u of %u, but the job has %d worker ranks (workers, or "
                 "an elastic job's max_workers)",
                 srv->rank, hello->rank, hello->world_size, srv->n_workers);
        return -1;
    }
    rank = (int)hello->rank;
    wc = &srv->workers[rank];
    if (hello->flags & PSAGG_HELLO_REJOIN) {
        /* the workers ran the job with this server before it (re)started (failover.c) */
        if (!srv->cfg.server_replicas) {
            snprintf(msg, len,
                     "server %d: worker %d runs the job already, which this server left: it "
                     "rejoins only with [cluster] server_replicas >= 1",
                     srv->rank, rank);
            return -1;
        }
        if (srv->ctl.job_running) {
            snprintf(msg, len,
                     "server %d: worker %d asks it to rejoin, but it runs the job still (cut off "
                     "and moved out of the view): it rejoins once it is restarted",
                     srv->rank, rank);
            return -1;
        }
    }
    if (srv->adm->startup_deadline < 0) { /* the first worker says whether the job runs */
        srv->ctl.rejoin = !!(hello->flags & PSAGG_HELLO_REJOIN);
    } else if (!srv->ctl.job_running && !srv->ctl.rejoin && (hello->flags & PSAGG_HELLO_REJOIN) &&
               srv->mb.elastic) {
        forget_joiners(srv, rank); /* (the job runs: those before it were joiners) */
        srv->ctl.rejoin = 1;
        srv->adm->startup_deadline = -1; /* (its start-up runs from this worker, below) */
    } else if (!srv->ctl.job_running && srv->ctl.rejoin != !!(hello->flags & PSAGG_HELLO_REJOIN)) {
        snprintf(msg, len,
                 "server %d: worker %d says the job %s, the workers before it that it %s: try "
                 "again",
                 srv->rank, rank, hello->flags & PSAGG_HELLO_REJOIN ? "runs" : "starts",
                 srv->ctl.rejoin ? "runs" : "starts");
        return -2; /* (a worker that took a view in between: it says HELLO again in a moment) */
    }
    if ((hello->flags & ~PSAGG_HELLO_REJOIN) != flags) {
        snprintf(msg, len, "server %d: worker %d has data_auth %s, this server %s", srv->rank, rank,
                 hello->flags & PSAGG_HELLO_DATA_AUTH ? "on" : "off", flags ? "on" : "off");
        return -1;
    }
    if (strncmp(hello->provider, psagg__fabric_provider(srv->fab), PSAGG_PROVIDER_MAX - 1)) {
        snprintf(msg, len,
                 "server %d: worker %d opened fabric provider '%.31s', this server '%.31s': every "
                 "process of a job must open the same one (name it in [cluster] provider)",
                 srv->rank, rank, hello->provider, psagg__fabric_provider(srv->fab));
        return -1;
    }
    if ((hello->flags & PSAGG_HELLO_REJOIN) && srv->mb.elastic) { /* (it waits for the members,
                                                                     not the start's) */
        if (!hello->members || hello->members > (uint32_t)srv->n_workers) {
            snprintf(msg, len,
                     "server %d: worker %d's HELLO names %u members; the job has %d ranks",
                     srv->rank, rank, hello->members, srv->n_workers);
            return -1;
        }
        srv->ctl.rejoin_members = (int)hello->members;
    } else if (!srv->ctl.job_running && rank >= srv->start_workers) {
        snprintf(msg, len,
                 "server %d: worker rank %d is beyond workers = %d: it joins the job once it "
                 "runs: try again",
                 srv->rank, rank, srv->start_workers);
        return -2; /* (PSAGG_EAGAIN: the worker says HELLO again in a moment) */
    }
    if (srv->ctl.job_running) { /* an elastic job (else nobody listens): a join (membership.c) */
        if (server_member(srv, rank) && wc->state == W_DEAD && wc->fd < 0) {
            snprintf(msg, len,
                     "server %d: worker rank %d is leaving the job (server 0's membership epoch "
                     "without it has not reached this server yet): try again",
                     srv->rank, rank);
            return -2; /* (PSAGG_EAGAIN: the worker says HELLO again in a moment) */
        }
        if (server_member(srv, rank)) {
            snprintf(msg, len,
                     "server %d: worker rank %d is a live member of the running job: a joiner "
                     "takes the rank of a worker that left",
                     srv->rank, rank);
            return -1;
        }
        if (wc->state != W_DEAD && !(wc->state == W_NONE && rank >= srv->start_workers)) {
            snprintf(msg, len, "server %d: worker rank %d %s", srv->rank, rank,
                     wc->state == W_BYE ? "finished the job (it said BYE)"
                                        : "is joining already on another connection");
            return -1;
        }
    } else if (wc->state != W_NONE) {
        snprintf(msg, len, "server %d: worker rank %d connected twice", srv->rank, rank);
        return -1;
    }
    if (hello->epname_len == 0 || hello->epname_len > PSAGG_EPNAME_MAX) {
        snprintf(msg, len, "server %d: HELLO field epname_len is %u", srv->rank, hello->epname_len);
        return -1;
    }
    {
        psagg__peer old = wc->addr;
        if (psagg__fabric_add_peer(srv->fab, hello->epname, hello->epname_len, &wc->addr)) {
            snprintf(msg, len, "server %d: worker %d's fabric address: %.150s", srv->rank, rank,
                     psagg_last_error());
            return -1;
        }
        /* a joiner's rank: the address of the worker that left names nobody from now on */
        if (srv->ctl.job_running && old < (psagg__peer)srv->n_workers && old != wc->addr)
            srv->rank_at[old] = -1;
    }
    {
        psagg__ctl_welcome wel = {
            .server_rank = (uint32_t)srv->rank,
            .n_servers = (uint32_t)srv->cfg.n_servers,
            .flags = flags | (srv->ctl.job_running ? PSAGG_WELCOME_JOINING : 0) |
                     (srv->cfg.quorum ? PSAGG_WELCOME_QUORUM : 0) |
                     (srv->cfg.server_error_feedback ? PSAGG_WELCOME_RESIDUAL : 0) |
                     (srv->pool.follow_bytes ? PSAGG_WELCOME_FOLLOW : 0)};
        size_t elen = sizeof wel.epname;
        memcpy(wel.nonce, srv->nonce, sizeof wel.nonce);
        optim_welcome(srv, &wel.optim);
        snprintf(wel.provider, sizeof wel.provider, "%s", psagg__fabric_provider(srv->fab));
        if (psagg__fabric_name(srv->fab, wel.epname, &elen)) {
            snprintf(msg, len, "server %d: its own fabric name: %.150s", srv->rank,
                     psagg_last_error());
            return -1;
        }
        wel.epname_len = (uint32_t)elen;
        if (srv->cfg.local_copy && !srv->ctl.job_running && !srv->ctl.rejoin) /* (not for a
                                                    joiner or a rejoin: by the provider) */
            local_copy_offer(srv, rank, hello, &wel);
        psagg__welcome_token(&srv->job_key, &wel, hello->auth, wel.auth);
        if (psagg__ctl_send(fd, NULL, PSAGG_CTL_WELCOME, &wel, sizeof wel)) {
            snprintf(msg, len, "worker %d left before its WELCOME: %.150s", rank,
                     psagg_last_error());
            return -1;
        }
    }
    wc->fd = fd;
    wc->state = W_HELLO;
    wc->joining = srv->ctl.job_running;
    wc->join_asked = 0;
    wc->in_barrier = 0;
    wc->heard_at = psagg__now_ms();
    free(wc->decl);
    wc->decl = NULL;
    /* its frames from now on, both ways, and its pushes: keys of this session pair alone */
    psagg__ctl_auth_make(&srv->job_key, hello->auth, hello->nonce, srv->nonce, (uint32_t)srv->rank,
                         1, &wc->auth);
    wc->auth.log = &srv->log;
    psagg__ctl_reader_init(&wc->rd, PSAGG_CTL_MAX_FRAME, &wc->auth);
    psagg__push_key_make(&srv->job_key, srv->cfg.job_id, hello->nonce, srv->nonce,
                         (uint32_t)srv->rank, &wc->rx.key);
    memset(&wc->rx.seen, 0, sizeof wc->rx.seen);
    if (wc->addr < (psagg__peer)srv->n_workers)
        srv->rank_at[wc->addr] = rank;
    if (srv->adm->startup_deadline < 0) /* the start-up deadline runs from the first worker */
        srv->adm->startup_deadline = psagg__now_ms() + srv->cfg.connect_timeout_ms;
    LOG_INFO(&srv->log, "worker %d %s (%s)", rank,
             wc->joining ? "connected to join the running job" : "connected", peer);
    return 0;
}

/* A pending connection is readable: read what it sent; a whole HELLO decides its fate. */
static void serve_pending(server *srv, pending_conn *p)
{
    int r;
    psagg_status st = psagg__ctl_reader_feed(&p->rd, p->fd, p->peer);
    psagg__ctl_hdr h;
    void *body;
    char msg[240];

    if (st == PSAGG_EAGAIN)
        return;
    if (st) {
        snprintf(msg, sizeof msg, "%s", psagg_last_error());
        LOG_DEBUG(&srv->log, "refused a connection: %s", msg);
        if (st == PSAGG_EPROTO) /* a wrong version or a stranger: says nothing of the job */
            server_verdict(srv, p->fd, NULL, PSAGG_CTL_ERROR, st, msg);
        pending_close(p);
        return;
    }
    body = psagg__ctl_reader_take(&p->rd, &h);
    if (h.type != PSAGG_CTL_HELLO || h.len != sizeof(psagg__ctl_hello)) {
        snprintf(msg, sizeof msg, "server %d: expected HELLO of %zu bytes, got type %u len %u",
                 srv->rank, sizeof(psagg__ctl_hello), h.type, h.len);
        st = PSAGG_EPROTO;
    } else if ((r = accept_hello(srv, p, body, msg, sizeof msg)) == 0) {
        p->fd = -1; /* it is a worker's connection now */
        free(body);
        return;
    } else {
        st = r == -2 ? PSAGG_EAGAIN : PSAGG_EPROTO;
    }
    /* (a flood of refused HELLOs, e.g. joins with a wrong secret, is one record a second) */
    psagg__lograte_note(&srv->adm->refused_hello, &srv->log, 1000, "refused a %s: %s", p->peer,
                        msg);
    server_verdict(srv, p->fd, NULL, PSAGG_CTL_ERROR, st, msg);
    pending_close(p);
    free(body);
}

/* Poll the listening socket and every pending connection: pfd/who from index n; the new n. */
int admission_poll_add(server *srv, struct pollfd *pfd, int *who, int n)
{
    pfd[n] = (struct pollfd){.fd = srv->ctl.listen_fd, .events = POLLIN};
    who[n++] = -1;
    for (int i = 0; i < PENDING_MAX; i++)
        if (srv->adm->pending[i].fd >= 0) {
            pfd[n] = (struct pollfd){.fd = srv->adm->pending[i].fd, .events = POLLIN};
            who[n++] = -2 - i;
        }
    return n;
}

/* Entry `who` (admission_poll_add's: -1 the listening socket, -2 - i slot i) of fd is ready. */
void admission_serve(server *srv, int who, int fd)
{
    if (who == -1)
        accept_all(srv);
    else if (who <= -2 && srv->adm->pending[-2 - who].fd == fd)
        serve_pending(srv, &srv->adm->pending[-2 - who]);
}

/* Close every pending connection (counted as refused) and report the refusals now. */
void admission_close_all(server *srv)
{
    for (int i = 0; srv->adm && i < PENDING_MAX; i++)
        if (srv->adm->pending[i].fd >= 0) {
            pending_close(&srv->adm->pending[i]);
            srv->adm->refused_idle++;
        }
    report_refused(srv, psagg__now_ms(), 1);
    psagg__lograte_flush(&srv->adm->refused_hello, &srv->log);
}

/* The pending-connection table, all slots free; no start-up deadline yet. */
psagg_status admission_init(server *srv)
{
    srv->adm = calloc(1, sizeof *srv->adm);
    if (!srv->adm)
        return psagg__fail(PSAGG_ENOMEM, "connection table");
    for (int i = 0; i < PENDING_MAX; i++)
        srv->adm->pending[i].fd = -1;
    srv->adm->startup_deadline = -1;
    return PSAGG_OK;
}

int64_t admission_deadline(const server *srv)
{
    return srv->adm->startup_deadline;
}

void admission_fini(server *srv)
{
    free(srv->adm);
    srv->adm = NULL;
}
