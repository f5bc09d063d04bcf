/*
 * membership.c - elastic membership ([cluster] elastic; the wire side is in runtime/wire.h).
 *
 * Who belongs to the job is decided in one place, server 0, so that the servers, which have no
 * channel between them, can never hold two different views: when server 0 loses a worker
 * (control.c's drop_worker: a closed connection, its ABORT, silence, a bad message) it starts
 * the next epoch without it and sends MEMBERSHIP to every live worker; each worker relays the
 * frame unchanged to the other servers, which apply epochs strictly in order and compare every
 * further copy of an applied epoch with the first (a difference fails the job, naming the two
 * relays). A server s > 0 that loses a worker itself only closes it and waits: the worker, cut
 * off from a server, gives up and so leaves server 0 as well.
 *
 * Applying an epoch (the control thread): the leavers' connections are closed, member[] is
 * cleared for them, and every owned chunk gets a retry in its aggregation thread, which
 * completes a round that now has every member's push (aggregate.c's agg_settle). A push of
 * a leaver that came before stays in its round.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "server.h"

psagg_status membership_init(server *srv)
{
    srv->elastic = srv->cfg.elastic;
    srv->n_members = srv->n_workers;
    atomic_store(&srv->epoch, 0);
    srv->member = malloc((size_t)srv->n_workers * sizeof *srv->member);
    if (!srv->member)
        return psagg_fail(PSAGG_ENOMEM, "no memory for the membership");
    for (int w = 0; w < srv->n_workers; w++)
        atomic_init(&srv->member[w], 1);
    return PSAGG_OK;
}

void membership_fini(server *srv)
{
    free(srv->member);
    srv->member = NULL;
    free(srv->epoch_frame);
    srv->epoch_frame = NULL;
}

/* Let every owned chunk look at its round again (the aggregation threads). */
static void settle_all(server *srv)
{
    if (!srv->threads_started)
        return;
    for (uint32_t i = 0; i < srv->n_owned; i++)
        agg_enqueue(srv, &srv->chunks[i], NULL);
}

/* Close worker w (a leaver) here: it is no member from now on. */
static void leave(server *srv, int w, uint32_t epoch, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    atomic_store(&srv->member[w], 0);
    srv->n_members--;
    if (wc->fd >= 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "removed from the job in membership epoch %u: %s", epoch, why);
        admission_verdict(srv, wc->fd, PSAGG_CTL_ERROR, PSAGG_EPEER, msg);
        close(wc->fd);
        wc->fd = -1;
        psagg_ctl_reader_reset(&wc->rd);
    }
    if (wc->state != W_BYE)
        wc->state = W_DEAD;
}

/* Keep the frame of the epoch applied last (a copy: later relays must equal it). */
static void keep_frame(server *srv, const void *frame, uint32_t len)
{
    void *copy = malloc(len);
    if (!copy) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for membership epoch %u",
                        atomic_load(&srv->epoch));
        return;
    }
    memcpy(copy, frame, len);
    free(srv->epoch_frame);
    srv->epoch_frame = copy;
    srv->epoch_frame_len = len;
}

void membership_lost(server *srv, int w, const char *why)
{
    psagg_ctl_membership *m;
    uint32_t len = (uint32_t)(sizeof *m + (size_t)srv->n_workers), epoch;
    uint8_t *live;

    if (!atomic_load(&srv->member[w]))
        return;
    if (srv->rank != 0) {
        /* server 0 decides; the worker, cut off from this server, leaves it too */
        LOG_WARN(&srv->log,
                 "worker %d lost here (%s); its rounds wait for server 0's next membership epoch",
                 w, why);
        return;
    }
    epoch = atomic_load(&srv->epoch) + 1;
    leave(srv, w, epoch, why);
    if (srv->n_members < srv->cfg.min_workers) {
        server_fail_job(srv, PSAGG_EPEER,
                        "worker %d failed (%s): %d workers left, fewer than min_workers=%d", w, why,
                        srv->n_members, srv->cfg.min_workers);
        return;
    }
    if (!(m = calloc(1, len))) {
        server_fail_job(srv, PSAGG_ENOMEM, "no memory for membership epoch %u", epoch);
        return;
    }
    m->epoch = epoch;
    m->n_workers = (uint32_t)srv->n_workers;
    m->n_live = (uint32_t)srv->n_members;
    m->left = w;
    snprintf(m->why, sizeof m->why, "%s", why);
    live = (uint8_t *)(m + 1);
    for (int k = 0; k < srv->n_workers; k++)
        live[k] = atomic_load(&srv->member[k]);
    atomic_store(&srv->epoch, epoch);
    keep_frame(srv, m, len);
    LOG_WARN(&srv->log, "membership epoch %u: worker %d left (%s); %d workers go on", epoch, w, why,
             srv->n_members);
    metrics_membership(srv, epoch, srv->n_members);
    for (int k = 0; k < srv->n_workers; k++) {
        worker_conn *wc = &srv->workers[k];
        if (!live[k] || wc->fd < 0)
            continue;
        if (psagg_ctl_send(wc->fd, PSAGG_CTL_MEMBERSHIP, m, len))
            server_close_worker(srv, k, "sending membership epoch %u: %s", epoch,
                                psagg_last_error());
    }
    free(m);
    settle_all(srv);
}

void membership_relayed(server *srv, int from, const psagg_ctl_hdr *h, const void *body)
{
    const psagg_ctl_membership *m = body;
    const uint8_t *live;
    uint32_t cur = atomic_load(&srv->epoch);
    int n_live = 0;
    char peer[32];

    snprintf(peer, sizeof peer, "worker %d", from);
    if (srv->rank == 0 || !srv->elastic) {
        server_close_worker(srv, from, "sent a MEMBERSHIP frame to server %d, which %s", srv->rank,
                            srv->rank == 0 ? "decides the membership itself"
                                           : "runs a job that is not elastic");
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
    if ((uint32_t)n_live != m->n_live || m->left < 0 || m->left >= srv->n_workers ||
        live[m->left] || memchr(m->why, 0, sizeof m->why) == NULL) {
        server_close_worker(srv, from, "MEMBERSHIP fields n_live, left or why are inconsistent");
        return;
    }
    if (m->epoch <= cur) { /* a copy of an epoch applied: it must be the same */
        const psagg_ctl_membership *a = srv->epoch_frame;
        if (m->epoch == cur && (h->len != srv->epoch_frame_len || memcmp(body, a, h->len) != 0))
            server_fail_job(srv, PSAGG_EPROTO,
                            "membership epoch %u as worker %d relayed it (worker %d left, %u "
                            "live) differs from the copy applied first, worker %d's (worker %d "
                            "left, %u live)",
                            m->epoch, from, m->left, m->n_live, srv->epoch_frame_from, a->left,
                            a->n_live);
        return;
    }
    if (m->epoch != cur + 1) {
        server_fail_job(srv, PSAGG_EPROTO,
                        "worker %d relayed membership epoch %u, but this server is at epoch %u: "
                        "an epoch was skipped",
                        from, m->epoch, cur);
        return;
    }
    for (int k = 0; k < srv->n_workers; k++) /* epochs only remove (no joins yet) */
        if (live[k] && !atomic_load(&srv->member[k])) {
            server_fail_job(srv, PSAGG_EPROTO,
                            "membership epoch %u (relayed by worker %d) has worker %d, which left "
                            "in an earlier epoch",
                            m->epoch, from, k);
            return;
        }
    for (int k = 0; k < srv->n_workers; k++)
        if (!live[k] && atomic_load(&srv->member[k]))
            leave(srv, k, m->epoch, m->why);
    atomic_store(&srv->epoch, m->epoch);
    keep_frame(srv, body, h->len);
    srv->epoch_frame_from = from;
    LOG_WARN(&srv->log,
             "membership epoch %u (server 0's, relayed by worker %d): worker %d left "
             "(%s); %d workers go on",
             m->epoch, from, m->left, m->why, srv->n_members);
    metrics_membership(srv, m->epoch, srv->n_members);
    settle_all(srv);
}
