/*
 * control.c - psagg-server's control state machine, on the main thread.
 *
 *   start-up   accept connections, read each HELLO (version and job id first, then the
 *              secret's token), answer WELCOME; collect every worker's DECLARE, check that
 *              all are identical (else EMISMATCH naming the tensor and the workers), build the
 *              layout, start the data path and the aggregation pool, answer READY;
 *   running    serve BYE and closed connections; close the workers the data path names
 *              (state.c) and abort the job for the others;
 *   end        when every worker is gone (0: every one said BYE and the job never failed).
 *
 * Failure handling: a bad frame or a lost connection closes that worker (logged with the
 * reason) and aborts the job for the others with an ABORT naming it, so pending operations
 * fail at once instead of hanging; the server itself keeps running until every worker is
 * gone, and exits non-zero if the job did not end cleanly.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/control.h"
#include "server.h"

/*
 * Tell a peer why it is being refused or the job is ending. The peer may already be gone, so
 * a failed send is only logged: there is nobody else to tell.
 */
static void send_verdict(server *srv, int fd, uint16_t type, psagg_status status, const char *msg)
{
    if (psagg_ctl_send_error(fd, type, status, msg))
        LOG_DEBUG(&srv->log, "could not deliver \"%s\": %s", msg, psagg_last_error());
}

/* Send an ERROR (start-up) or ABORT (running job) to every connected worker but `except`. */
static void tell_workers(server *srv, int except, uint16_t type, psagg_status status,
                         const char *msg)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (w == except || wc->fd < 0 || wc->state == W_BYE)
            continue;
        send_verdict(srv, wc->fd, type, status, msg);
    }
}

/* Close worker w's control connection and abort the job for the others. */
static void drop_worker(server *srv, int w, psagg_status status, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    char reason[200], msg[240];
    if (wc->fd < 0)
        return;
    /* `why` may be psagg_last_error(), which the sends below overwrite: copy it first */
    snprintf(reason, sizeof reason, "%s", why);
    LOG_ERROR(&srv->log, "closing worker %d: %s", w, reason);
    send_verdict(srv, wc->fd, PSAGG_CTL_ERROR, status, reason);
    close(wc->fd);
    wc->fd = -1;
    wc->state = W_DEAD;
    snprintf(msg, sizeof msg, "worker %d failed: %.200s", w, reason);
    server_fail_job(srv, "%s", msg);
    snprintf(msg, sizeof msg, "server %d: worker %d failed: %.200s", srv->rank, w, reason);
    tell_workers(srv, w, PSAGG_CTL_ABORT, PSAGG_EPEER, msg);
}

/* Read the HELLO of a new connection; on success it becomes worker hello->rank. */
static int accept_hello(server *srv, int fd, int64_t deadline)
{
    psagg_ctl_hdr h;
    psagg_ctl_hello *hello = NULL;
    char msg[240];
    psagg_status st = psagg_ctl_recv(fd, &h, (void **)&hello, deadline, "a new connection");
    int rank;

    if (st) {
        snprintf(msg, sizeof msg, "%s", psagg_last_error());
        LOG_WARN(&srv->log, "rejected a connection: %s", msg);
        if (st == PSAGG_EPROTO)
            send_verdict(srv, fd, PSAGG_CTL_ERROR, st, msg);
        goto reject;
    }
    if (h.type != PSAGG_CTL_HELLO || h.len != sizeof *hello) {
        snprintf(msg, sizeof msg, "server %d: expected HELLO of %zu bytes, got type %u len %u",
                 srv->rank, sizeof *hello, h.type, h.len);
        goto reject_msg;
    }
    hello->job_id[PSAGG_JOB_ID_MAX - 1] = '\0';
    if (strcmp(hello->job_id, srv->cfg.job_id)) {
        snprintf(msg, sizeof msg, "server %d serves job '%s', not '%s'", srv->rank, srv->cfg.job_id,
                 hello->job_id);
        goto reject_msg;
    }
    if ((int)hello->world_size != srv->n_workers || hello->rank >= hello->world_size) {
        snprintf(msg, sizeof msg, "server %d: worker rank %u of %u, but the job has %d workers",
                 srv->rank, hello->rank, hello->world_size, srv->n_workers);
        goto reject_msg;
    }
    rank = (int)hello->rank;
    {
        uint8_t expect[32];
        if (psagg_hello_token(&srv->cfg, hello->rank, expect) ||
            !psagg_token_equal(expect, hello->auth)) {
            snprintf(msg, sizeof msg,
                     "server %d: worker rank %d failed authentication (secret_file differs)",
                     srv->rank, rank);
            goto reject_msg;
        }
    }
    if (srv->workers[rank].state != W_NONE) {
        snprintf(msg, sizeof msg, "server %d: worker rank %d connected twice", srv->rank, rank);
        goto reject_msg;
    }
    if (hello->epname_len == 0 || hello->epname_len > PSAGG_EPNAME_MAX) {
        snprintf(msg, sizeof msg, "server %d: HELLO field epname_len is %u", srv->rank,
                 hello->epname_len);
        goto reject_msg;
    }
    if (psagg_fabric_add_peer(srv->fab, hello->epname, hello->epname_len,
                              &srv->workers[rank].addr)) {
        snprintf(msg, sizeof msg, "server %d: worker %d's fabric address: %.150s", srv->rank, rank,
                 psagg_last_error());
        goto reject_msg;
    }
    {
        psagg_ctl_welcome wel = {.server_rank = (uint32_t)srv->rank,
                                 .n_servers = (uint32_t)srv->cfg.n_servers};
        size_t len = sizeof wel.epname;
        if ((st = psagg_fabric_name(srv->fab, wel.epname, &len))) {
            snprintf(msg, sizeof msg, "server %d: its own fabric name: %.180s", srv->rank,
                     psagg_last_error());
            goto reject_msg;
        }
        wel.epname_len = (uint32_t)len;
        if ((st = psagg_ctl_send(fd, PSAGG_CTL_WELCOME, &wel, sizeof wel))) {
            LOG_WARN(&srv->log, "worker %d left before its WELCOME: %s", rank, psagg_last_error());
            goto reject;
        }
    }
    srv->workers[rank].fd = fd;
    srv->workers[rank].state = W_HELLO;
    LOG_INFO(&srv->log, "worker %d connected", rank);
    free(hello);
    return 0;
reject_msg:
    LOG_WARN(&srv->log, "rejected a connection: %s", msg);
    send_verdict(srv, fd, PSAGG_CTL_ERROR, PSAGG_EPROTO, msg);
reject:
    free(hello);
    close(fd);
    return -1;
}

static void codec_text(const psagg_ctl_tensor *t, char *buf, size_t len)
{
    psagg_codec c = {(psagg_codec_id)t->codec, t->bits, t->bucket, (psagg_rounding)t->rounding};
    psagg_codec_name(&c, buf, len);
}

/* All workers declared: compare every list with worker 0's. Returns 0 if identical. */
static int compare_declarations(server *srv, char *msg, size_t len)
{
    const worker_conn *w0 = &srv->workers[0];
    for (int w = 1; w < srv->n_workers; w++) {
        const worker_conn *wc = &srv->workers[w];
        if (wc->decl_hdr.count != w0->decl_hdr.count) {
            snprintf(msg, len, "worker 0 declared %u tensors, worker %d declared %u",
                     w0->decl_hdr.count, w, wc->decl_hdr.count);
            return -1;
        }
        if (wc->decl_hdr.chunk_elems != w0->decl_hdr.chunk_elems) {
            snprintf(msg, len, "worker 0 uses chunks of %llu elements, worker %d of %llu",
                     (unsigned long long)w0->decl_hdr.chunk_elems, w,
                     (unsigned long long)wc->decl_hdr.chunk_elems);
            return -1;
        }
    }
    for (uint32_t t = 0; t < w0->decl_hdr.count; t++) {
        const psagg_ctl_tensor *a = &w0->decl[t];
        char differ[128] = "";
        int first = -1;
        for (int w = 1; w < srv->n_workers; w++) {
            const psagg_ctl_tensor *b = &srv->workers[w].decl[t];
            if (memcmp(a, b, sizeof *a)) {
                size_t used = strlen(differ);
                if (first < 0)
                    first = w;
                snprintf(differ + used, sizeof differ - used, "%s%d", used ? "," : "", w);
            }
        }
        if (first >= 0) {
            const psagg_ctl_tensor *b = &srv->workers[first].decl[t];
            char ca[40], cb[40];
            codec_text(a, ca, sizeof ca);
            codec_text(b, cb, sizeof cb);
            snprintf(msg, len,
                     "tensor %u: worker 0 declared '%.40s' (%llu elements, %.24s), worker %d "
                     "declared '%.40s' (%llu elements, %.24s); workers differing from worker 0: "
                     "%.40s",
                     t, a->name, (unsigned long long)a->count, ca, first, b->name,
                     (unsigned long long)b->count, cb, differ);
            return -1;
        }
    }
    return 0;
}

/* Read one DECLARE from worker w (called when its socket is readable). */
static int read_declare(server *srv, int w, psagg_ctl_hdr *h, void *body)
{
    worker_conn *wc = &srv->workers[w];
    psagg_ctl_declare *d = body;
    if (h->len < sizeof *d) {
        drop_worker(srv, w, PSAGG_EPROTO, "DECLARE shorter than its header");
        return -1;
    }
    if (d->count == 0 || d->count > PSAGG_MAX_TENSORS ||
        h->len != sizeof *d + (uint64_t)d->count * sizeof(psagg_ctl_tensor)) {
        char m[160];
        snprintf(m, sizeof m, "DECLARE field count is %u but the frame has %u bytes", d->count,
                 h->len);
        drop_worker(srv, w, PSAGG_EPROTO, m);
        return -1;
    }
    wc->decl_hdr = *d;
    wc->decl = malloc((size_t)d->count * sizeof *wc->decl);
    if (!wc->decl) {
        drop_worker(srv, w, PSAGG_ENOMEM, "no memory for the declaration");
        return -1;
    }
    memcpy(wc->decl, d + 1, (size_t)d->count * sizeof *wc->decl);
    wc->state = W_DECLARED;
    return 0;
}

static int count_state(const server *srv, enum worker_state s)
{
    int n = 0;
    for (int w = 0; w < srv->n_workers; w++)
        n += srv->workers[w].state == s;
    return n;
}

static void missing_workers(const server *srv, enum worker_state below, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int w = 0; w < srv->n_workers && used + 8 < len; w++)
        if (srv->workers[w].state < below)
            used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", w);
}

/* All declarations are in and identical: build the layout and start the data path. */
static psagg_status start_job(server *srv)
{
    const worker_conn *w0 = &srv->workers[0];
    psagg_status st;
    size_t rbuf_size;
    int n_rbufs;

    st = psagg_layout_build(w0->decl, w0->decl_hdr.count, w0->decl_hdr.chunk_elems,
                            (uint32_t)srv->cfg.n_servers, &srv->layout);
    if (st)
        return st;
    rbuf_size = sizeof(psagg_msg_hdr) + srv->layout.max_enc_bytes;
    if (rbuf_size > srv->max_msg)
        return psagg_fail(PSAGG_EINVAL, "chunks of %zu bytes exceed the fabric limit of %zu",
                          rbuf_size, srv->max_msg);
    st = agg_setup(srv);
    if (st)
        return st;
    /* enough receive buffers for every worker to have several chunks in flight */
    n_rbufs = psagg_rxpool_count(16 * srv->n_workers < 1024 ? 16 * srv->n_workers : 1024, rbuf_size,
                                 512ull << 20);
    st = psagg_rxpool_create(&srv->rxpool, srv->fab, n_rbufs, rbuf_size, sizeof(recv_buf));
    if (st)
        return st;
    st = agg_start(srv);
    if (st)
        return st;
    st = progress_start(srv);
    if (st)
        return st;
    LOG_INFO(&srv->log,
             "job '%s': %u tensors, %u chunks, %u owned here (%llu bytes per worker per round), "
             "%d aggregation threads, provider %s",
             srv->cfg.job_id, srv->layout.n_tensors, srv->layout.n_chunks, srv->n_owned,
             (unsigned long long)srv->layout.owned_bytes[srv->rank], srv->n_threads,
             psagg_fabric_provider(srv->fab));
    return PSAGG_OK;
}

/* Handle one readable worker socket once the job runs (BYE, or a dead connection). */
static void serve_worker(server *srv, int w)
{
    worker_conn *wc = &srv->workers[w];
    psagg_ctl_hdr h;
    void *body = NULL;
    char name[32];
    psagg_status st;
    snprintf(name, sizeof name, "worker %d", w);
    st = psagg_ctl_recv(wc->fd, &h, &body, psagg_now_ms() + 5000, name);
    if (st) {
        drop_worker(srv, w, st, psagg_last_error());
        return;
    }
    if (h.type == PSAGG_CTL_BYE) {
        LOG_INFO(&srv->log, "worker %d said BYE", w);
        wc->state = W_BYE;
        close(wc->fd);
        wc->fd = -1;
    } else if (h.type == PSAGG_CTL_DECLARE && wc->state == W_HELLO) {
        read_declare(srv, w, &h, body);
    } else {
        char m[120];
        snprintf(m, sizeof m, "unexpected control frame type %u in state %d", h.type, wc->state);
        drop_worker(srv, w, PSAGG_EPROTO, m);
    }
    free(body);
}

/* The data-path threads ask for peers to be closed (state.c): close them here. */
static void close_named_workers(server *srv)
{
    for (int w = 0; w < srv->n_workers; w++) {
        char reason[200];
        pthread_mutex_lock(&srv->mu);
        snprintf(reason, sizeof reason, "%s", srv->workers[w].bad_reason);
        srv->workers[w].bad_reason[0] = '\0';
        pthread_mutex_unlock(&srv->mu);
        if (reason[0])
            drop_worker(srv, w, PSAGG_EPROTO, reason);
    }
}

/* Start-up is over, one way or the other: tell every connected worker why it failed. */
static int startup_failed(server *srv, psagg_status status, const char *msg)
{
    LOG_ERROR(&srv->log, "%s", msg);
    tell_workers(srv, -1, PSAGG_CTL_ERROR, status, msg);
    return 1;
}

/* Every worker declared: compare, start the job and answer READY. 0 when the job runs. */
static int start_or_refuse(server *srv, int *rc)
{
    char msg[512];

    if (compare_declarations(srv, msg, sizeof msg)) {
        *rc = startup_failed(srv, PSAGG_EMISMATCH, msg);
        return -1;
    }
    if (start_job(srv)) {
        snprintf(msg, sizeof msg, "server %d cannot start the job: %.200s", srv->rank,
                 psagg_last_error());
        *rc = startup_failed(srv, PSAGG_EINVAL, msg);
        return -1;
    }
    for (int w = 0; w < srv->n_workers; w++)
        if (psagg_ctl_send(srv->workers[w].fd, PSAGG_CTL_READY, NULL, 0))
            drop_worker(srv, w, PSAGG_EPEER, psagg_last_error()); /* fails the job */
    return 0;
}

/*
 * The control loop: returns the process exit code. Phases: STARTING (accept, HELLO, DECLARE;
 * the start-up deadline runs from the first connection), RUNNING (BYE, deaths, data-path
 * reports), ABORTED (the job failed and every worker was told; wait for them to go).
 */
int control_serve(server *srv)
{
    enum { STARTING, RUNNING, ABORTED } phase = STARTING;
    int64_t deadline = -1;
    struct pollfd *pfd = calloc((size_t)srv->n_workers + 1, sizeof *pfd);
    int *who = calloc((size_t)srv->n_workers + 1, sizeof *who);
    int rc = 1;

    if (!pfd || !who) {
        LOG_ERROR(&srv->log, "no memory for the control loop");
        goto out;
    }
    for (;;) {
        int n = 0;
        char missing[128], msg[512];

        if (*srv->stop) {
            LOG_INFO(&srv->log, "stopping on signal");
            tell_workers(srv, -1, PSAGG_CTL_ABORT, PSAGG_ECLOSED, "server stopped by a signal");
            rc = phase != STARTING && !atomic_load(&srv->job_failed) &&
                         count_state(srv, W_BYE) == srv->n_workers
                     ? 0
                     : 143;
            break;
        }
        close_named_workers(srv);
        if (phase == RUNNING && atomic_load(&srv->job_failed)) {
            pthread_mutex_lock(&srv->mu);
            snprintf(msg, sizeof msg, "server %d: %.200s", srv->rank, srv->job_error);
            pthread_mutex_unlock(&srv->mu);
            LOG_ERROR(&srv->log, "job failed: %s", msg);
            tell_workers(srv, -1, PSAGG_CTL_ABORT, PSAGG_EPEER, msg);
            phase = ABORTED;
        }
        if (phase != STARTING &&
            count_state(srv, W_BYE) + count_state(srv, W_DEAD) == srv->n_workers) {
            rc = atomic_load(&srv->job_failed) || count_state(srv, W_DEAD) ? 1 : 0;
            LOG_INFO(&srv->log, "all workers gone, job %s", rc ? "failed" : "done");
            break;
        }
        if (phase == STARTING) {
            if (count_state(srv, W_DEAD) > 0) {
                rc = startup_failed(srv, PSAGG_EPEER, "another worker failed during start-up");
                break;
            }
            if (count_state(srv, W_DECLARED) == srv->n_workers) {
                if (start_or_refuse(srv, &rc))
                    break;
                phase = RUNNING;
                continue; /* a READY that could not be sent has failed the job */
            }
            if (deadline >= 0 && psagg_now_ms() > deadline) {
                missing_workers(srv, W_DECLARED, missing, sizeof missing);
                snprintf(msg, sizeof msg,
                         "server %d: workers %s did not arrive and declare within "
                         "connect_timeout_ms=%d",
                         srv->rank, missing, srv->cfg.connect_timeout_ms);
                rc = startup_failed(srv, PSAGG_ETIMEDOUT, msg);
                break;
            }
            pfd[n] = (struct pollfd){.fd = srv->listen_fd, .events = POLLIN};
            who[n++] = -1;
        }
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
            if (who[i] < 0) {
                int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
                if (fd < 0)
                    continue;
                if (deadline < 0)
                    deadline = psagg_now_ms() + srv->cfg.connect_timeout_ms;
                accept_hello(srv, fd, psagg_now_ms() + 5000);
            } else if (srv->workers[who[i]].fd >= 0) {
                serve_worker(srv, who[i]);
            }
        }
    }
out:
    free(pfd);
    free(who);
    return rc;
}
