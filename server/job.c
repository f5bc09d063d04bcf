/*
 * job.c - the job as every thread of the server shares it: its outcome (the first failure
 * wins), the request to close a misbehaving worker, who is at which fabric address and
 * whether a round has every member, and the queues where the aggregation threads hand the
 * progress thread updates to send and receive buffers to post again. The data-path threads only
 * record here; the control loop (control.c) acts on it. And the control thread's own: closing a
 * worker's connection (the loop then settles what the loss means for the job) and telling workers
 * why.
 */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "server.h"

static void close_worker(server *srv, int w, psagg_status status, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&srv->job.mu);
    if (!srv->workers[w].bad_reason[0]) {
        vsnprintf(srv->workers[w].bad_reason, sizeof srv->workers[w].bad_reason, fmt, ap);
        srv->workers[w].bad_status = status;
    }
    pthread_mutex_unlock(&srv->job.mu);
}

void server_close_worker(server *srv, int w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    close_worker(srv, w, PSAGG_EPROTO, fmt, ap);
    va_end(ap);
}

void server_evict_worker(server *srv, int w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    close_worker(srv, w, PSAGG_ETIMEDOUT, fmt, ap);
    va_end(ap);
}

void server_fail_job(server *srv, psagg_status status, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&srv->job.mu);
    if (!srv->job.error[0]) {
        va_start(ap, fmt);
        vsnprintf(srv->job.error, sizeof srv->job.error, fmt, ap);
        va_end(ap);
        srv->job.status = status;
    }
    pthread_mutex_unlock(&srv->job.mu);
    atomic_store(&srv->job.failed, 1);
}

/*
 * Worker ranks by fabric address. An AV of type FI_AV_TABLE numbers addresses 0, 1, ... in
 * the order they were inserted (one per accepted HELLO), so rank_at finds them at once; for
 * other AV types this is a scan of at most [cluster] workers entries.
 */
int server_worker_at(const server *srv, psagg__peer addr)
{
    if (addr == PSAGG_PEER_UNKNOWN)
        return -1;
    if (addr < (psagg__peer)srv->n_workers && srv->rank_at[addr] >= 0)
        return srv->rank_at[addr];
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->workers[w].state != W_NONE && srv->workers[w].addr == addr)
            return w;
    return -1;
}

/*
 * The aggregation threads' updates: queued here, sent by the progress thread (progress.c), the only
 * thread that calls into the endpoint (no lock contention in libfabric, no thread woken per
 * message). The wake-up handshake: the progress thread sets progress_idle before it looks at
 * the queue one last time and sleeps; a producer queues and then reads progress_idle (seq_cst
 * atomics), so either the progress thread sees the item or the producer sees it idle and
 * wakes it, once per update at most, and only when it may be asleep.
 */
void server_queue_update(server *srv, send_ctx *sc)
{
    sc->next_worker = 0;
    sc->next = NULL;
    pthread_mutex_lock(&srv->dp.sendq_mu);
    if (srv->dp.sendq_tail)
        srv->dp.sendq_tail->next = sc;
    else
        srv->dp.sendq_head = sc;
    srv->dp.sendq_tail = sc;
    pthread_mutex_unlock(&srv->dp.sendq_mu);
    atomic_fetch_add(&srv->dp.sendq_len, 1);
    if (atomic_load(&srv->dp.idle))
        psagg__fabric_wake(srv->fab);
}

/*
 * A lock-free stack: producers push, the progress thread takes the whole stack at once. Only
 * the push onto an empty stack wakes an idle progress thread: one wake per batch.
 */
void server_queue_repost(server *srv, recv_buf *rb)
{
    recv_buf *old = atomic_load(&srv->dp.repostq);
    do
        rb->item.next = old ? &old->item : NULL;
    while (!atomic_compare_exchange_weak(&srv->dp.repostq, &old, rb));
    if (!old && atomic_load(&srv->dp.idle))
        psagg__fabric_wake(srv->fab);
}

int server_start_ranks(const server *srv)
{
    return srv->ctl.rejoin && srv->mb.elastic ? srv->n_workers : srv->start_workers;
}

int server_start_count(const server *srv)
{
    return srv->ctl.rejoin && srv->mb.elastic && srv->ctl.rejoin_members ? srv->ctl.rejoin_members
                                                                         : srv->start_workers;
}

int server_closing(server *srv, int w)
{
    int closing;
    pthread_mutex_lock(&srv->job.mu);
    closing = srv->workers[w].bad_reason[0] != '\0';
    pthread_mutex_unlock(&srv->job.mu);
    /* (state is the control thread's: a stale read is a push parked or not once more) */
    return closing || srv->workers[w].state >= W_BYE;
}

int server_member(const server *srv, int w)
{
    return atomic_load_explicit(&srv->mb.member[w], memory_order_acquire);
}

/* Whether chunk c's round waits for its owner's bitmap ([server] quorum with replicas: a copy,
   or a copy that took it over, up to follow_until; chunk_state's follow_*). */
int server_follows(const server *srv, const chunk_state *c)
{
    return srv->pool.follow_bytes && (c->shadow || c->round < c->follow_until);
}

/*
 * Whether chunk c's round does not wait for worker w: its push came, or the round closes
 * without the missing ones, or w is no member; a round that follows its owner (server_follows)
 * waits for the owner's bitmap, and then for exactly the pushes it names.
 */
int server_passes(const server *srv, const chunk_state *c, int w)
{
    if (server_follows(srv, c))
        return c->follow_has && (c->arrived[w] || !psagg__bitmap_has(c->follow_bits, (uint32_t)w));
    return c->arrived[w] || c->closing || !server_member(srv, w);
}

int server_members_in(const server *srv, const chunk_state *c)
{
    if (!c->n_arrived)
        return 0;
    for (int w = 0; w < srv->n_workers; w++)
        if (!server_passes(srv, c, w))
            return 0;
    return 1;
}

/*
 * Tell a peer why it is being refused or the job is ending. The peer may already be gone, so
 * a failed send is only logged: there is nobody else to tell.
 */
void server_verdict(server *srv, int fd, psagg__ctl_auth *auth, uint16_t type, psagg_status status,
                    const char *msg)
{
    if (psagg__ctl_send_error(fd, auth, type, status, msg))
        LOG_DEBUG(&srv->log, "could not deliver \"%s\": %s", msg, psagg_last_error());
}

void server_tell_workers(server *srv, int except, uint16_t type, psagg_status status,
                         const char *msg)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (w == except || wc->fd < 0 || wc->state == W_BYE)
            continue;
        server_verdict(srv, wc->fd, &wc->auth, type, status, msg);
    }
}

void server_drop_worker(server *srv, int w, psagg_status status, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    if (wc->fd < 0)
        return;
    /* `why` may be psagg_last_error(), which the send below overwrites: copy it first */
    snprintf(wc->why_lost, sizeof wc->why_lost, "%s", why);
    if (atomic_load(&srv->job.failed)) /* the workers leave a failed job: expected */
        LOG_INFO(&srv->log, "closing worker %d: %s", w, wc->why_lost);
    else
        LOG_ERROR(&srv->log, "closing worker %d: %s", w, wc->why_lost);
    server_verdict(srv, wc->fd, &wc->auth, PSAGG_CTL_ERROR, status, wc->why_lost);
    close(wc->fd);
    wc->fd = -1;
    psagg__ctl_reader_reset(&wc->rd);
    wc->state = W_DEAD;
    wc->lost = 1;
    wc->lost_status = status;
}

void server_member_leave(server *srv, int w, uint32_t epoch, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    atomic_store(&srv->mb.member[w], 0);
    srv->mb.n--;
    if (wc->fd >= 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "removed from the job in membership epoch %u: %s", epoch, why);
        server_verdict(srv, wc->fd, &wc->auth, PSAGG_CTL_ERROR, PSAGG_EPEER, msg);
        close(wc->fd);
        wc->fd = -1;
        psagg__ctl_reader_reset(&wc->rd);
    }
    if (wc->state != W_BYE)
        wc->state = W_DEAD;
}

void server_member_admit(server *srv, int w)
{
    worker_conn *wc = &srv->workers[w];
    wc->joining = 0;
    wc->join_asked = 0;
    wc->heard_at = psagg__now_ms();
    atomic_store(&srv->mb.member[w], 1);
    srv->mb.n++;
}
