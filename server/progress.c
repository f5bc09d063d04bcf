/*
 * progress.c - the server's data path: one progress thread drives libfabric. Every received
 * push is checked against the layout (psagg_msg_check, then who may send it) and handed to
 * the aggregation thread its chunk is pinned to; a bad one closes its sender (named, with
 * the field) and is dropped. Send completions free update buffers and wake deferred rounds.
 */
#include <stdio.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/message.h"
#include "server.h"

/* Check a received push against the layout; route it or close its sender. */
static void route_push(server *srv, recv_buf *rb)
{
    const psagg_msg_hdr *h = (const psagg_msg_hdr *)rb->rx.buf;
    const psagg_chunk_info *ci;
    const char *bad;

    /* who sent it comes first: a bad message is that sender's fault, and nobody else's */
    if (rb->rx.len < sizeof *h) {
        LOG_ERROR(&srv->log, "dropped a %zu-byte message: shorter than the %zu-byte header",
                  rb->rx.len, sizeof *h);
        server_repost(srv, rb);
        return;
    }
    if (h->sender >= srv->n_workers) {
        LOG_ERROR(&srv->log, "dropped a message whose field sender is %u (job has %d workers)",
                  h->sender, srv->n_workers);
        server_repost(srv, rb);
        return;
    }
    bad = psagg_msg_check(rb->rx.buf, rb->rx.len, PSAGG_MSG_PUSH, &srv->layout, &ci);
    if (bad) {
        server_close_worker(srv, h->sender,
                            "push field %s is invalid (key %u chunk %u len %u, message of %zu "
                            "bytes)",
                            bad, h->key, h->chunk, h->len, rb->rx.len);
        server_repost(srv, rb);
        return;
    }
    if (ci->owner != (uint32_t)srv->rank) {
        server_close_worker(srv, h->sender,
                            "push of tensor %u chunk %u sent to server %d, owner is %u", h->key,
                            h->chunk, srv->rank, ci->owner);
        server_repost(srv, rb);
        return;
    }
    agg_enqueue(srv, &srv->chunks[ci->slot], rb);
}

static void *progress_main(void *arg)
{
    server *srv = arg;
    psagg_fabric_event ev[64];

    while (atomic_load(&srv->running)) {
        int n = psagg_fabric_poll(srv->fab, ev, 64, 10);
        if (n < 0) {
            server_fail_job(srv, "completion queue failed: %s", psagg_last_error());
            break;
        }
        for (int i = 0; i < n; i++) {
            switch (ev[i].kind) {
            case PSAGG_FABRIC_RECV_DONE: {
                recv_buf *rb = ev[i].ctx; /* the psagg_rxbuf is its first member */
                rb->rx.len = ev[i].len;
                route_push(srv, rb);
                break;
            }
            case PSAGG_FABRIC_SEND_ERROR:
                LOG_WARN(&srv->log, "sending an update failed: %s", ev[i].msg);
                /* the buffer is free again either way */
                __attribute__((fallthrough));
            case PSAGG_FABRIC_SEND_DONE: {
                send_ctx *sc = ev[i].ctx;
                if (atomic_fetch_sub(&sc->chunk->sends_pending[sc->parity], 1) == 1 &&
                    sc->chunk->deferred)
                    agg_enqueue(srv, sc->chunk, NULL);
                break;
            }
            case PSAGG_FABRIC_RECV_ERROR: {
                recv_buf *rb = ev[i].ctx;
                if (!atomic_load(&srv->running))
                    break;
                LOG_WARN(&srv->log, "a receive failed: %s", ev[i].msg);
                server_repost(srv, rb);
                break;
            }
            }
        }
    }
    return NULL;
}

psagg_status progress_start(server *srv)
{
    atomic_store(&srv->running, 1);
    if (pthread_create(&srv->progress_tid, NULL, progress_main, srv)) {
        atomic_store(&srv->running, 0);
        return psagg_fail(PSAGG_EIO, "cannot start the progress thread");
    }
    return PSAGG_OK;
}

void progress_stop(server *srv)
{
    atomic_store(&srv->running, 0);
    if (srv->progress_tid)
        pthread_join(srv->progress_tid, NULL);
    srv->progress_tid = 0;
}
