/*
 * server.c - psagg-server: start-up, the control loop and the progress loop.
 *
 *   server_run()      listen, accept HELLOs (version and job id first), collect DECLAREs,
 *                     check that every worker declared the same tensors, build the layout,
 *                     start aggregation, answer READY; then serve BYE / disconnects.
 *   progress_main()   drives libfabric: every received push is checked against the layout
 *                     (peer and field named on any error) and handed to the aggregation
 *                     thread its chunk is pinned to; send completions free update buffers.
 *
 * Failure handling: a bad frame or a lost connection closes that worker (logged with the
 * reason) and aborts the job for the others with an ABORT naming it, so pending operations
 * fail at once instead of hanging; the server itself keeps running until every worker is
 * gone, and exits non-zero if the job did not end cleanly.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "control.h"
#include "error.h"
#include "log.h"
#include "server.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

void server_repost(server *srv, recv_buf *rb)
{
    if (psagg_fabric_post_recv(srv->fab, rb->buf, rb->size, rb->desc, rb) &&
        atomic_load(&srv->running))
        server_fail_job(srv, "cannot repost a receive buffer: %s", psagg_last_error());
}

void server_close_worker(server *srv, int w, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&srv->mu);
    if (!srv->workers[w].bad_reason[0]) {
        va_start(ap, fmt);
        vsnprintf(srv->workers[w].bad_reason, sizeof srv->workers[w].bad_reason, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&srv->mu);
}

void server_fail_job(server *srv, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&srv->mu);
    if (!srv->job_error[0]) {
        va_start(ap, fmt);
        vsnprintf(srv->job_error, sizeof srv->job_error, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&srv->mu);
    atomic_store(&srv->job_failed, 1);
}

/* ---- data path ---- */

/* Check a received push against the layout; route it or close its sender. */
static void route_push(server *srv, recv_buf *rb)
{
    const psagg_msg_hdr *h = (const psagg_msg_hdr *)rb->buf;
    const psagg_layout *l = &srv->layout;
    const psagg_chunk_info *ci;
    const char *bad = NULL;
    char why[160];

    if (rb->len < sizeof *h) {
        LOG_ERROR("dropped a %zu-byte message: shorter than the 32-byte header", rb->len);
        server_repost(srv, rb);
        return;
    }
    if (h->sender >= srv->n_workers) {
        LOG_ERROR("dropped a message whose field sender is %u (job has %d workers)", h->sender,
                  srv->n_workers);
        server_repost(srv, rb);
        return;
    }
    if (h->magic != PSAGG_MSG_MAGIC)
        bad = "magic";
    else if (h->version != PSAGG_PROTO_VERSION)
        bad = "version";
    else if (h->type != PSAGG_MSG_PUSH)
        bad = "type";
    else if (h->epoch != 0)
        bad = "epoch";
    else if (h->key >= l->n_tensors)
        bad = "key";
    else if (h->chunk >= l->tensors[h->key].n_chunks)
        bad = "chunk";
    if (bad) {
        snprintf(why, sizeof why, "push field %s is invalid (key %u chunk %u)", bad, h->key,
                 h->chunk);
        server_close_worker(srv, h->sender, "%s", why);
        server_repost(srv, rb);
        return;
    }
    ci = &l->chunks[l->tensors[h->key].first_chunk + h->chunk];
    if (ci->owner != (uint32_t)srv->rank) {
        server_close_worker(srv, h->sender,
                            "push of tensor %u chunk %u sent to server %d, owner is %u", h->key,
                            h->chunk, srv->rank, ci->owner);
        server_repost(srv, rb);
        return;
    }
    if (h->len != ci->enc_bytes || rb->len != sizeof *h + h->len) {
        server_close_worker(srv, h->sender,
                            "push of tensor %u chunk %u: field len is %u, message has %zu bytes, "
                            "codec needs %zu",
                            h->key, h->chunk, h->len, rb->len - sizeof *h, ci->enc_bytes);
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
                recv_buf *rb = ev[i].ctx;
                rb->len = ev[i].len;
                route_push(srv, rb);
                break;
            }
            case PSAGG_FABRIC_SEND_ERROR:
                LOG_WARN("sending an update failed: %s", ev[i].msg);
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
                LOG_WARN("a receive failed: %s", ev[i].msg);
                server_repost(srv, rb);
                break;
            }
            }
        }
    }
    return NULL;
}

/* ---- control channel ---- */

static void abort_others(server *srv, int except, int status, const char *msg)
{
    for (int w = 0; w < srv->n_workers; w++) {
        worker_conn *wc = &srv->workers[w];
        if (w == except || wc->fd < 0 || wc->state == W_BYE)
            continue;
        psagg_ctl_send_error(wc->fd, PSAGG_CTL_ABORT, status, msg);
    }
}

/* Close worker w's control connection and abort the job for the others. */
static void drop_worker(server *srv, int w, int status, const char *why)
{
    worker_conn *wc = &srv->workers[w];
    char reason[200], msg[240];
    if (wc->fd < 0)
        return;
    /* `why` may be psagg_last_error(), which the sends below overwrite: copy it first */
    snprintf(reason, sizeof reason, "%s", why);
    LOG_ERROR("closing worker %d: %s", w, reason);
    psagg_ctl_send_error(wc->fd, PSAGG_CTL_ERROR, status, reason);
    close(wc->fd);
    wc->fd = -1;
    wc->state = W_DEAD;
    snprintf(msg, sizeof msg, "worker %d failed: %.200s", w, reason);
    server_fail_job(srv, "%s", msg);
    snprintf(msg, sizeof msg, "server %d: worker %d failed: %.200s", srv->rank, w, reason);
    abort_others(srv, w, PSAGG_EPEER, msg);
}

/* Read the HELLO of a new connection; on success it becomes worker hello->rank. */
static int accept_hello(server *srv, int fd, int64_t deadline)
{
    psagg_ctl_hdr h;
    psagg_ctl_hello *hello = NULL;
    char msg[240];
    int st = psagg_ctl_recv(fd, &h, (void **)&hello, deadline, "a new connection");
    int rank;

    if (st) {
        LOG_WARN("rejected a connection: %s", psagg_last_error());
        if (st == PSAGG_EPROTO)
            psagg_ctl_send_error(fd, PSAGG_CTL_ERROR, st, psagg_last_error());
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
    srv->workers[rank].fd = fd;
    srv->workers[rank].state = W_HELLO;
    {
        psagg_ctl_welcome wel = {.server_rank = (uint32_t)srv->rank,
                                 .n_servers = (uint32_t)srv->cfg.n_servers};
        size_t len = sizeof wel.epname;
        psagg_fabric_name(srv->fab, wel.epname, &len);
        wel.epname_len = (uint32_t)len;
        psagg_ctl_send(fd, PSAGG_CTL_WELCOME, &wel, sizeof wel);
    }
    LOG_INFO("worker %d connected", rank);
    free(hello);
    return 0;
reject_msg:
    LOG_WARN("rejected a connection: %s", msg);
    psagg_ctl_send_error(fd, PSAGG_CTL_ERROR, PSAGG_EPROTO, msg);
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
    uint64_t budget = 512ull << 20;

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
    srv->n_rbufs = 16 * srv->n_workers;
    if (srv->n_rbufs > 1024)
        srv->n_rbufs = 1024;
    if ((uint64_t)srv->n_rbufs * rbuf_size > budget)
        srv->n_rbufs = (int)(budget / rbuf_size);
    if (srv->n_rbufs < 8)
        srv->n_rbufs = 8;
    srv->rbufs = calloc((size_t)srv->n_rbufs, sizeof *srv->rbufs);
    if (!srv->rbufs)
        return psagg_fail(PSAGG_ENOMEM, "receive buffer table");
    for (int i = 0; i < srv->n_rbufs; i++) {
        recv_buf *rb = &srv->rbufs[i];
        rb->size = rbuf_size;
        rb->buf = psagg_alloc(rbuf_size, 0);
        if (!rb->buf)
            return psagg_fail(PSAGG_ENOMEM, "receive buffers of %zu bytes", rbuf_size);
        if ((st = psagg_fabric_reg(srv->fab, rb->buf, rbuf_size, &rb->desc)) ||
            (st = psagg_fabric_post_recv(srv->fab, rb->buf, rbuf_size, rb->desc, rb)))
            return st;
    }
    st = agg_start(srv);
    if (st)
        return st;
    atomic_store(&srv->running, 1);
    if (pthread_create(&srv->progress_tid, NULL, progress_main, srv)) {
        atomic_store(&srv->running, 0);
        return psagg_fail(PSAGG_EIO, "cannot start the progress thread");
    }
    LOG_INFO("job '%s': %u tensors, %u chunks, %u owned here (%llu bytes per worker per round), "
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
    int st;
    snprintf(name, sizeof name, "worker %d", w);
    st = psagg_ctl_recv(wc->fd, &h, &body, psagg_now_ms() + 5000, name);
    if (st) {
        drop_worker(srv, w, st, psagg_last_error());
        return;
    }
    if (h.type == PSAGG_CTL_BYE) {
        LOG_INFO("worker %d said BYE", w);
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

/* The control loop: returns the process exit code. */
static int serve_control(server *srv)
{
    int64_t deadline = -1;
    int started = 0;
    struct pollfd *pfd = calloc((size_t)srv->n_workers + 1, sizeof *pfd);
    int *who = calloc((size_t)srv->n_workers + 1, sizeof *who);
    int rc = 1;

    if (!pfd || !who)
        goto out;
    for (;;) {
        int n = 0;
        char missing[128], msg[512];

        if (stop_requested) {
            LOG_INFO("stopping on signal");
            abort_others(srv, -1, PSAGG_ECLOSED, "server stopped by a signal");
            rc = started && !atomic_load(&srv->job_failed) &&
                         count_state(srv, W_BYE) == srv->n_workers
                     ? 0
                     : 143;
            break;
        }
        /* data-path threads ask for peers to be closed */
        for (int w = 0; w < srv->n_workers; w++) {
            char reason[200];
            pthread_mutex_lock(&srv->mu);
            snprintf(reason, sizeof reason, "%s", srv->workers[w].bad_reason);
            srv->workers[w].bad_reason[0] = '\0';
            pthread_mutex_unlock(&srv->mu);
            if (reason[0])
                drop_worker(srv, w, PSAGG_EPROTO, reason);
        }
        if (atomic_load(&srv->job_failed) && started == 1) {
            pthread_mutex_lock(&srv->mu);
            snprintf(msg, sizeof msg, "server %d: %.200s", srv->rank, srv->job_error);
            pthread_mutex_unlock(&srv->mu);
            LOG_ERROR("job failed: %s", msg + 0);
            abort_others(srv, -1, PSAGG_EPEER, msg);
            started = 2; /* aborted; wait for the workers to go */
        }
        if (started && count_state(srv, W_BYE) + count_state(srv, W_DEAD) == srv->n_workers) {
            rc = atomic_load(&srv->job_failed) || count_state(srv, W_DEAD) ? 1 : 0;
            LOG_INFO("all workers gone, job %s", rc ? "failed" : "done");
            break;
        }
        if (!started && count_state(srv, W_DEAD) > 0) {
            rc = 1;
            LOG_ERROR("a worker failed during start-up; giving up on this job");
            abort_others(srv, -1, PSAGG_EPEER, "another worker failed during start-up");
            break;
        }
        if (!started && count_state(srv, W_DECLARED) == srv->n_workers) {
            if (compare_declarations(srv, msg, sizeof msg)) {
                LOG_ERROR("declarations differ: %s", msg);
                for (int w = 0; w < srv->n_workers; w++)
                    psagg_ctl_send_error(srv->workers[w].fd, PSAGG_CTL_ERROR, PSAGG_EMISMATCH, msg);
                rc = 1;
                break;
            }
            if (start_job(srv)) {
                snprintf(msg, sizeof msg, "server %d cannot start the job: %.200s", srv->rank,
                         psagg_last_error());
                LOG_ERROR("%s", msg);
                for (int w = 0; w < srv->n_workers; w++)
                    psagg_ctl_send_error(srv->workers[w].fd, PSAGG_CTL_ERROR, PSAGG_EINVAL, msg);
                rc = 1;
                break;
            }
            for (int w = 0; w < srv->n_workers; w++)
                psagg_ctl_send(srv->workers[w].fd, PSAGG_CTL_READY, NULL, 0);
            started = 1;
        }
        if (!started && deadline >= 0 && psagg_now_ms() > deadline) {
            missing_workers(srv, W_DECLARED, missing, sizeof missing);
            snprintf(msg, sizeof msg,
                     "server %d: workers %s did not arrive and declare within "
                     "connect_timeout_ms=%d",
                     srv->rank, missing, srv->cfg.connect_timeout_ms);
            LOG_ERROR("%s", msg);
            for (int w = 0; w < srv->n_workers; w++)
                if (srv->workers[w].fd >= 0)
                    psagg_ctl_send_error(srv->workers[w].fd, PSAGG_CTL_ERROR, PSAGG_ETIMEDOUT, msg);
            rc = 1;
            break;
        }

        if (!started) {
            pfd[n] = (struct pollfd){.fd = srv->listen_fd, .events = POLLIN};
            who[n++] = -1;
        }
        for (int w = 0; w < srv->n_workers; w++)
            if (srv->workers[w].fd >= 0) {
                pfd[n] = (struct pollfd){.fd = srv->workers[w].fd, .events = POLLIN};
                who[n++] = w;
            }
        if (poll(pfd, (nfds_t)n, 50) < 0 && errno != EINTR) {
            LOG_ERROR("poll: %s", strerror(errno));
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

int server_run(const psagg_config *cfg, int rank)
{
    server srv = {.cfg = *cfg, .rank = rank, .listen_fd = -1};
    psagg_fabric_opts fo = {0};
    struct sigaction sa = {.sa_handler = on_signal};
    int rc = 1;

    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&srv.mu, NULL);
    srv.n_workers = cfg->n_workers;
    srv.workers = calloc((size_t)srv.n_workers, sizeof *srv.workers);
    if (!srv.workers)
        goto err_workers;
    for (int w = 0; w < srv.n_workers; w++)
        srv.workers[w].fd = -1;

    srv.max_msg = psagg_max_message(cfg);
    fo.provider = cfg->provider;
    fo.node = cfg->server_fabric_node[0] ? cfg->server_fabric_node : cfg->servers[rank].host;
    fo.max_msg = srv.max_msg;
    if (!strcmp(cfg->provider, "shm"))
        fo.node = NULL;
    if (psagg_fabric_open(&fo, &srv.fab)) {
        LOG_ERROR("%s", psagg_last_error());
        goto err_fabric;
    }
    if (psagg_tcp_listen(&cfg->servers[rank], &srv.listen_fd)) {
        LOG_ERROR("%s", psagg_last_error());
        goto err_listen;
    }
    LOG_INFO("serving job '%s' for %d workers on %s:%u (fabric %s)", cfg->job_id, srv.n_workers,
             cfg->servers[rank].host, cfg->servers[rank].port, psagg_fabric_provider(srv.fab));

    rc = serve_control(&srv);

    atomic_store(&srv.running, 0);
    if (srv.progress_tid)
        pthread_join(srv.progress_tid, NULL);
    agg_stop(&srv);
    for (int w = 0; w < srv.n_workers; w++)
        if (srv.workers[w].fd >= 0)
            close(srv.workers[w].fd);
    close(srv.listen_fd);
err_listen:
    psagg_fabric_close(srv.fab);
    agg_teardown(&srv);
    for (int i = 0; srv.rbufs && i < srv.n_rbufs; i++)
        psagg_free(srv.rbufs[i].buf);
    free(srv.rbufs);
    psagg_layout_free(&srv.layout);
err_fabric:
    for (int w = 0; w < srv.n_workers; w++)
        free(srv.workers[w].decl);
    free(srv.workers);
err_workers:
    pthread_mutex_destroy(&srv.mu);
    return rc;
}
