/*
 * progress.c - the server's data path: one progress thread drives libfabric. Every received
 * push is checked for its source (runtime/gate.h: the fabric address of the worker that
 * authenticated on the control channel, and with data_auth its MAC), then against the layout
 * (psagg__msg_check), and handed to the aggregation
 * thread its chunk is pinned to. A message from an address that is not one of the job's
 * workers is dropped and logged and blames nobody; a bad one from a worker closes that worker
 * (named, with the field). Send completions free update buffers and wake deferred rounds.
 */
#include <stddef.h>
#include <stdio.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/gate.h"
#include "runtime/message.h"
#include "server.h"

void progress_repost(server *srv, recv_buf *rb)
{
    if (rb->spilled) { /* (a heap copy: aggregate.c's wait_ahead) */
        agg_spill_free(srv, rb);
        return;
    }
    if (psagg__rxpool_repost(&srv->dp.rxpool, &rb->rx) && atomic_load(&srv->dp.running))
        server_fail_job(srv, PSAGG_EFABRIC, "cannot repost a receive buffer: %s",
                        psagg_last_error());
}

/* The gate's view of the workers (runtime/gate.h). */
static int worker_at(const void *srv, psagg__peer addr)
{
    return server_worker_at(srv, addr);
}

static psagg__data_rx *worker_rx(void *srv, int w)
{
    return &((server *)srv)->workers[w].rx;
}

/*
 * A push whose sender is in a membership epoch this server has not applied yet (elastic: the
 * MEMBERSHIP frame comes by another channel, relayed by a worker) waits here until it has:
 * a joiner's push must count in its round, and a member's must not be summed with the old
 * membership. Returns 1 when rb was parked. The progress thread's own list.
 */
static int park_early(server *srv, recv_buf *rb, int from)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    uint16_t ahead = (uint16_t)(h->epoch - (uint16_t)atomic_load(&srv->mb.epoch));
    if ((!srv->mb.elastic && !srv->cfg.server_replicas) || ahead == 0 || ahead >= 0x8000)
        return 0;
    /* epochs are relayed at once: nobody is that far ahead of a server (but of one that
       rejoins, before it took its first view: failover.c) */
    if (ahead > 16 && !(srv->ctl.rejoin && atomic_load(&srv->mb.epoch) == 0)) {
        server_close_worker(srv, from, "push field epoch is %u, %u epochs ahead of this server's",
                            h->epoch, ahead);
        progress_repost(srv, rb);
        return 1;
    }
    if (server_closing(srv, from)) { /* (closed, or to be: it may not hold buffers) */
        progress_repost(srv, rb);
        return 1;
    }
    rb->from = from;
    rb->parked_at = psagg__now_ms();
    rb->item.next = srv->dp.parked ? &srv->dp.parked->item : NULL;
    srv->dp.parked = rb;
    return 1;
}

static recv_buf *parked_next(recv_buf *rb)
{
    agg_item *next = rb->item.next;
    return next ? (recv_buf *)((char *)next - offsetof(recv_buf, item)) : NULL;
}

/*
 * Pushes that waited 1.5 x op_timeout_ms (the membership's own deadline for an epoch to be
 * relayed, membership.c) for an epoch that never came here: their senders are
 * closed, naming the field, and the receive buffers let go. Epochs are relayed at once, so a
 * member's push waits milliseconds; a worker that stamps its pushes with an epoch ahead (a
 * broken or hostile one) would otherwise hold the pool's buffers, and with them every other
 * worker's pushes, for good.
 */
static void expire_parked(server *srv)
{
    int64_t now = psagg__now_ms();
    recv_buf *rb = srv->dp.parked, *kept = NULL, *last = NULL;
    uint32_t epoch = (uint32_t)atomic_load(&srv->mb.epoch);
    if (srv->ctl.rejoin && epoch == 0) /* (a server that rejoins waits for its first view) */
        return;
    while (rb) { /* (newest first, and kept so) */
        recv_buf *next = parked_next(rb);
        if (now - rb->parked_at > PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms)) {
            const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
            server_close_worker(srv, rb->from,
                                "push field epoch is %u; this server's stayed %u for 1.5 x "
                                "op_timeout_ms=%d",
                                h->epoch, epoch, srv->cfg.op_timeout_ms);
            progress_repost(srv, rb);
        } else {
            rb->item.next = NULL;
            if (last)
                last->item.next = &rb->item;
            else
                kept = rb;
            last = rb;
        }
        rb = next;
    }
    srv->dp.parked = kept;
}

static void route_checked(server *srv, recv_buf *rb, int from);

/*
 * The epoch moved on: route the parked pushes again, in the order they came; those still
 * ahead of it wait again (a joiner's push of epoch e+2 while this server went from e to
 * e+1 would count as a non-member's, dropped, and its round would never have it).
 */
void progress_route_parked(server *srv)
{
    recv_buf *rb = srv->dp.parked, *rev = NULL;
    uint32_t epoch = atomic_load(&srv->mb.epoch);
    if (!rb)
        return;
    if (epoch == srv->dp.parked_epoch) {
        expire_parked(srv);
        return;
    }
    srv->dp.parked_epoch = epoch;
    srv->dp.parked = NULL;
    while (rb) { /* the list is newest first */
        recv_buf *next = parked_next(rb);
        rb->item.next = rev ? &rev->item : NULL;
        rev = rb;
        rb = next;
    }
    while (rev) { /* (one parked again, for a later epoch, waits from now: park_early) */
        recv_buf *next = parked_next(rev);
        if (!park_early(srv, rev, rev->from))
            route_checked(srv, rev, rev->from);
        rev = next;
    }
}

/* Check a received push's source and fields; route it, or drop it and close its sender. */
void progress_route(server *srv, recv_buf *rb, psagg__peer src)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    int from;

    /* who sent it comes first: a bad message is that sender's fault, and nobody else's */
    from = psagg__gate_sender(&srv->dp.gate, rb->rx.buf, rb->rx.len, src);
    if (from < 0) {
        metrics_drop(srv);
        progress_repost(srv, rb);
        return;
    }
    if (rb->rx.len < sizeof *h) {
        server_close_worker(srv, from, "a %zu-byte push: shorter than the %zu-byte header",
                            rb->rx.len, sizeof *h);
        progress_repost(srv, rb);
        return;
    }
    if (park_early(srv, rb, from))
        return;
    route_checked(srv, rb, from);
}

/* route_push's part after the source and the epoch. */
static void route_checked(server *srv, recv_buf *rb, int from)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    const psagg__chunk_info *ci;
    const char *bad;
    int slot;

    /* it left the job (elastic): nothing of it counts now; but where copies follow, a copy
       may need it (its owner's bitmap names it): aggregate.c's handle_push decides */
    if (!srv->pool.follow_bytes && !server_member(srv, from)) {
        LOG_DEBUG(&srv->log, "a push from worker %d, which is no member, dropped", from);
        metrics_drop(srv);
        progress_repost(srv, rb);
        return;
    }
    if (h->sender != (uint32_t)from) {
        server_close_worker(srv, from, "push field sender is %u, but it came from worker %d",
                            h->sender, from);
        progress_repost(srv, rb);
        return;
    }
    bad = psagg__msg_check(rb->rx.buf, rb->rx.len, srv->pool.follow_bytes + srv->tag_bytes,
                           PSAGG_MSG_PUSH, &srv->layout, &ci, &rb->mc);
    if (bad) {
        server_close_worker(srv, from,
                            "push field %s is invalid (key %u chunk %u len %u, message of %zu "
                            "bytes)",
                            bad, h->key, h->chunk, h->len, rb->rx.len);
        progress_repost(srv, rb);
        return;
    }
    slot = atomic_load(&srv->route[ci - srv->layout.chunks]);
    if (slot < 0 && srv->cfg.server_replicas && h->epoch != (uint16_t)atomic_load(&srv->mb.epoch)) {
        /* sent in a server view before this one, which moved the chunk away from here (its
           sender sends it again to the chunk's owner in this view, failover.c) */
        LOG_DEBUG(&srv->log,
                  "push of tensor %u chunk %u round %u of server view %u: not owned here "
                  "any more, dropped",
                  h->key, h->chunk, h->round, h->epoch);
        metrics_drop(srv);
        progress_repost(srv, rb);
        return;
    }
    if (slot < 0) {
        server_close_worker(srv, from,
                            "push of tensor %u chunk %u sent to server %d, which does not own it "
                            "(the layout's owner is %u)",
                            h->key, h->chunk, srv->rank, ci->owner);
        progress_repost(srv, rb);
        return;
    }
    metrics_push(srv, from, rb->rx.len);
    agg_enqueue(srv, &srv->chunks[slot], rb);
}

/* The updates and receive buffers the aggregation threads handed over (job.c). */
static void repost_queued(server *srv)
{
    recv_buf *rb = atomic_exchange(&srv->dp.repostq, NULL);
    while (rb) {
        agg_item *next = rb->item.next;
        progress_repost(srv, rb);
        rb = next ? (recv_buf *)((char *)next - offsetof(recv_buf, item)) : NULL;
    }
}

/*
 * Send what is queued, in order. A provider queue that is full (PSAGG_EAGAIN) leaves the
 * update at the head, to go on from the same worker after the next poll has drained some
 * completions. A send that fails closes that worker, as a failed send always has. Returns 1
 * when the provider's queue is full (its send completions will wake the poll), else 0.
 */
static int send_queued(server *srv)
{
    while (atomic_load(&srv->dp.sendq_len) > 0) {
        send_ctx *sc;
        chunk_state *c;
        size_t bytes;
        pthread_mutex_lock(&srv->dp.sendq_mu);
        sc = srv->dp.sendq_head;
        pthread_mutex_unlock(&srv->dp.sendq_mu);
        c = sc->chunk;
        bytes = sizeof(psagg__msg_hdr) + ((const psagg__msg_hdr *)c->out[sc->parity])->len +
                srv->pool.bitmap_bytes + srv->tag_bytes;
        for (; sc->next_worker < srv->n_workers; sc->next_worker++) {
            int w = sc->next_worker;
            psagg_status st;
            if (!sc->to[w]) /* no member when the round finished (not counted in pending) */
                continue;
            if (!server_member(srv, w)) {
                /* it left since (elastic): nobody waits for this update, and a send to a dead
                   peer may never be taken (EAGAIN for good), which would hold up the queue */
                agg_send_done(srv, sc);
                continue;
            }
            st = psagg__fabric_try_send(srv->fab, srv->workers[w].addr, c->out[sc->parity], bytes,
                                        c->out_desc[sc->parity], sc);
            if (st == PSAGG_EAGAIN)
                return 1;
            if (st) {
                agg_send_done(srv, sc);
                server_close_worker(srv, w, "sending the update of tensor %u chunk %u failed: %s",
                                    c->info->key, c->info->index, psagg_last_error());
            }
        }
        pthread_mutex_lock(&srv->dp.sendq_mu);
        srv->dp.sendq_head = sc->next;
        if (!srv->dp.sendq_head)
            srv->dp.sendq_tail = NULL;
        pthread_mutex_unlock(&srv->dp.sendq_mu);
        atomic_fetch_sub(&srv->dp.sendq_len, 1);
    }
    return 0;
}

static void *progress_main(void *arg)
{
    server *srv = arg;
    psagg__fabric_event ev[64];

    while (atomic_load(&srv->dp.running)) {
        int n, wait, full;
        progress_route_parked(srv);
        repost_queued(srv);
        full = send_queued(srv);
        /*
         * Sleep in the completion wait unless an update came meanwhile (see server_queue_update);
         * a full provider queue sleeps too: the completions of its sends end the wait.
         */
        atomic_store(&srv->dp.idle, 1);
        wait = (!full && atomic_load(&srv->dp.sendq_len) > 0) || atomic_load(&srv->dp.repostq) ? 0
                                                                                               : 10;
        n = psagg__fabric_poll(srv->fab, ev, 64, wait);
        atomic_store(&srv->dp.idle, 0);
        if (n < 0) {
            server_fail_job(srv, PSAGG_EFABRIC, "completion queue failed: %s", psagg_last_error());
            break;
        }
        for (int i = 0; i < n; i++) {
            switch (ev[i].kind) {
            case PSAGG_FABRIC_RECV_DONE: {
                recv_buf *rb = ev[i].ctx; /* the psagg__rxbuf is its first member */
                rb->rx.len = ev[i].len;
                progress_route(srv, rb, ev[i].src);
                break;
            }
            case PSAGG_FABRIC_SEND_ERROR:
                LOG_WARN(&srv->log, "sending an update failed: %s", ev[i].msg);
                /* the buffer is free again either way */
                __attribute__((fallthrough));
            case PSAGG_FABRIC_SEND_DONE: {
                agg_send_done(srv, ev[i].ctx);
                break;
            }
            case PSAGG_FABRIC_RECV_ERROR: {
                recv_buf *rb = ev[i].ctx;
                int from = ev[i].src == PSAGG_PEER_UNKNOWN ? -1 : server_worker_at(srv, ev[i].src);
                if (!atomic_load(&srv->dp.running))
                    break;
                if (from >= 0) /* a same-host copy that worker's message made fail */
                    server_close_worker(srv, from, "%s", ev[i].msg);
                else
                    LOG_WARN(&srv->log, "a receive failed: %s", ev[i].msg);
                progress_repost(srv, rb);
                break;
            }
            }
        }
    }
    psagg__gate_flush(&srv->dp.gate);
    return NULL;
}

void progress_init(server *srv)
{
    srv->dp.gate = (psagg__gate){.peer_kind = "worker",
                                 .n_peers = srv->n_workers,
                                 .source_reliable = srv->source_reliable,
                                 .tag_bytes = srv->tag_bytes,
                                 .log = &srv->log,
                                 .peer_at = worker_at,
                                 .rx_of = worker_rx,
                                 .owner = srv};
}

psagg_status progress_start(server *srv)
{
    progress_init(srv);
    atomic_store(&srv->dp.running, 1);
    if (pthread_create(&srv->dp.tid, NULL, progress_main, srv)) {
        atomic_store(&srv->dp.running, 0);
        return psagg__fail(PSAGG_EIO, "cannot start the progress thread");
    }
    return PSAGG_OK;
}

void progress_stop(server *srv)
{
    atomic_store(&srv->dp.running, 0);
    if (srv->dp.tid)
        pthread_join(srv->dp.tid, NULL);
    srv->dp.tid = 0;
}
