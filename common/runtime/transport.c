/*
 * runtime/transport.c - the libfabric data path behind runtime/transport.h.
 *
 * One fabric, domain, completion queue, address vector and FI_EP_RDM endpoint per process;
 * plain FI_MSG sends into receive buffers the caller pre-posts. Every operation carries an
 * internal context (struct fabric_op) that records whether it was a send or a receive: some
 * providers (ofi_rxm among them) write error entries without FI_SEND/FI_RECV flags, and the
 * same context doubles as the fi_context2 that providers with FI_CONTEXT/FI_CONTEXT2 modes
 * need. The contexts come from a free list and are reused, so the steady state allocates
 * nothing.
 *
 * Completions read by a send or post_recv that meets -FI_EAGAIN (they must read the CQ to
 * drive progress) go to a bounded backlog that the next psagg__fabric_poll returns first.
 *
 * Same-host copies (transport.h) are transport_local.c, behind transport_impl.h: cq_fetch
 * hands it the receives that may hold a descriptor or an ACK, fabric_send the sends to a
 * peer that copies ours, and poll its look for dead readers.
 */
#include "runtime/transport.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/transport_impl.h"
#include "runtime/wire.h"

#define FABRIC_API_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)

/* Completions read from the CQ per fi_cq_read call. */
#define CQ_BATCH 64
/*
 * Most completions a send/post_recv may park for the next poll (about 12 MB of events). Each
 * one belongs to an operation the caller has in flight, so a caller that polls never gets
 * near it; past it, send/post_recv return PSAGG_EAGAIN instead of reading (and losing) more.
 */
#define BACKLOG_MAX 65536
/* How long one send/post_recv keeps meeting -FI_EAGAIN before it gives up (dead shm peer),
 * unless the owner gives its own bound (psagg__fabric_opts.post_timeout_ms). */
#define POST_RETRY_MS 30000
/* Longest single fi_cq_sread inside a poll, so completions parked by senders are seen. */
#define SREAD_SLICE_MS 20

/*
 * Map a libfabric error number (positive, as in fi_cq_err_entry.err or -ret) to a psagg
 * status. Connection-level failures mean the peer died or cannot be reached (PSAGG_EPEER);
 * a message longer than the receive buffer is the peer breaking the protocol (PSAGG_EPROTO);
 * everything else is a libfabric failure.
 */
static int status_from_fi(int err)
{
    switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case FI_EHOSTDOWN:
    case FI_EHOSTUNREACH:
    case FI_ENETDOWN:
    case FI_ENETUNREACH:
    case FI_ETIMEDOUT:
    case FI_EREMOTEIO:
    case FI_EIO:
    case EPIPE:
        return PSAGG_EPEER;
    case FI_ETRUNC:
        return PSAGG_EPROTO;
    case FI_ECANCELED:
        return PSAGG_ECLOSED;
    case FI_ENOMEM:
        return PSAGG_ENOMEM;
    default:
        return PSAGG_EFABRIC;
    }
}

/* Take an operation context from the free list (growing it by a slab); NULL if out of memory. */
struct fabric_op *fab_op_get(psagg__fabric *f, void *ctx, int kind)
{
    struct fabric_op *op;

    pthread_mutex_lock(&f->lock);
    if (f->free_ops == NULL) {
        struct op_slab *s = calloc(1, sizeof(*s));
        if (s == NULL) {
            pthread_mutex_unlock(&f->lock);
            return NULL;
        }
        s->next = f->slabs;
        f->slabs = s;
        for (int i = OP_SLAB - 1; i >= 0; i--) {
            s->ops[i].next = f->free_ops;
            f->free_ops = &s->ops[i];
        }
    }
    op = f->free_ops;
    f->free_ops = op->next;
    pthread_mutex_unlock(&f->lock);

    memset(op, 0, sizeof(*op));
    op->ctx = ctx;
    op->kind = kind;
    return op;
}

void fab_op_put_locked(psagg__fabric *f, struct fabric_op *op)
{
    op->next = f->free_ops;
    f->free_ops = op;
}

void fab_op_put(psagg__fabric *f, struct fabric_op *op)
{
    pthread_mutex_lock(&f->lock);
    fab_op_put_locked(f, op);
    pthread_mutex_unlock(&f->lock);
}

/*
 * Read up to max completions (at most CQ_BATCH) and translate them into ev, returning their
 * operation contexts to the free list. wait_ms > 0 blocks in fi_cq_sread up to that long (only
 * when the CQ has a wait object). Returns the count, 0 if none, or a negative psagg_status if
 * the CQ itself failed. An error entry is returned as one *_ERROR event; the provider's text
 * is copied while its err_data is still valid (until the next fi_cq_readerr).
 */
static int cq_fetch(psagg__fabric *f, psagg__fabric_event *ev, int max, int wait_ms)
{
    struct fi_cq_msg_entry ent[CQ_BATCH];
    fi_addr_t src[CQ_BATCH];
    struct fi_cq_err_entry err;
    struct fabric_op *op = NULL;
    ssize_t ret;
    int n = max < CQ_BATCH ? max : CQ_BATCH;

    fab_local_flush(f);
    fab_lock(f);
    if (wait_ms > 0)
        ret = fi_cq_sreadfrom(f->cq, ent, (size_t)n, src, NULL, wait_ms);
    else
        ret = fi_cq_readfrom(f->cq, ent, (size_t)n, src);
    if (ret == -FI_EAVAIL) {
        char text[128];
        memset(&err, 0, sizeof(err));
        ret = fi_cq_readerr(f->cq, &err, 0);
        if (ret == 1) {
            const char *pt =
                fi_cq_strerror(f->cq, err.prov_errno, err.err_data, text, sizeof(text));
            op = err.op_context;
            ev->ctx = op ? op->ctx : NULL;
            if (op)
                ev->kind = op->kind == OP_RECV ? PSAGG_FABRIC_RECV_ERROR : PSAGG_FABRIC_SEND_ERROR;
            else
                ev->kind =
                    (err.flags & FI_RECV) ? PSAGG_FABRIC_RECV_ERROR : PSAGG_FABRIC_SEND_ERROR;
            ev->len = err.len;
            ev->src = PSAGG_PEER_UNKNOWN;
            ev->status = status_from_fi(err.err);
            snprintf(ev->msg, sizeof(ev->msg), "%s: %s (provider errno %d: %s)", f->prov,
                     fi_strerror(err.err), err.prov_errno, pt ? pt : "?");
        }
        fab_unlock(f);
        if (ret == 1) {
            if (op)
                fab_op_put(f, op);
            return 1;
        }
        if (ret == -FI_EAGAIN)
            return 0; /* another thread took the error entry */
        return psagg__fail(PSAGG_EFABRIC, "%s: fi_cq_readerr: %s", f->prov, fi_strerror((int)-ret));
    }
    fab_unlock(f);
    /* sread: -FI_EAGAIN on timeout, -FI_ECANCELED after fi_cq_signal, -FI_EINTR on signals */
    if (ret == -FI_EAGAIN || ret == -FI_ECANCELED || ret == -FI_EINTR)
        return 0;
    if (ret < 0)
        return psagg__fail(PSAGG_EFABRIC, "%s: %s: %s", f->prov,
                           wait_ms > 0 ? "fi_cq_sread" : "fi_cq_read", fi_strerror((int)-ret));

    struct fabric_op *done = NULL, *done_last = NULL; /* to the free list, under one lock */
    int out = 0;
    for (ssize_t i = 0; i < ret; i++) {
        psagg__fabric_event *e = &ev[out];
        op = ent[i].op_context;
        if (op && op->kind == OP_RECV && ent[i].len == sizeof(psagg__msg_local) && f->local_ok) {
            int r = fab_local_recv(f, op, src[i], e);
            if (r >= 0) {
                out += r;
                continue;
            }
        }
        if (op) {
            e->kind = op->kind == OP_RECV ? PSAGG_FABRIC_RECV_DONE : PSAGG_FABRIC_SEND_DONE;
            e->ctx = op->ctx;
            op->next = done;
            done = op;
            if (done_last == NULL)
                done_last = op;
        } else {
            e->kind = (ent[i].flags & FI_RECV) ? PSAGG_FABRIC_RECV_DONE : PSAGG_FABRIC_SEND_DONE;
            e->ctx = NULL;
        }
        e->len = e->kind == PSAGG_FABRIC_RECV_DONE ? ent[i].len : 0;
        /* FI_SOURCE: the sender's AV entry; FI_ADDR_NOTAVAIL for one that is not in the AV */
        e->src = e->kind == PSAGG_FABRIC_RECV_DONE && src[i] != FI_ADDR_NOTAVAIL
                     ? (psagg__peer)src[i]
                     : PSAGG_PEER_UNKNOWN;
        e->status = PSAGG_OK;
        e->msg[0] = '\0';
        out++;
    }
    if (done) {
        pthread_mutex_lock(&f->lock);
        done_last->next = f->free_ops;
        f->free_ops = done;
        pthread_mutex_unlock(&f->lock);
    }
    return out;
}

/* Move up to max parked completions into ev, oldest first. */
static int backlog_pop(psagg__fabric *f, psagg__fabric_event *ev, int max)
{
    int n = 0;

    pthread_mutex_lock(&f->lock);
    while (n < max && f->bl_count > 0) {
        ev[n++] = f->backlog[f->bl_head];
        f->bl_head = (f->bl_head + 1) % f->bl_cap;
        f->bl_count--;
    }
    pthread_mutex_unlock(&f->lock);
    return n;
}

/* Park completions; the caller made sure they fit under BACKLOG_MAX. */
int fab_backlog_push(psagg__fabric *f, const psagg__fabric_event *ev, int n)
{
    pthread_mutex_lock(&f->lock);
    if (f->bl_count + (size_t)n > f->bl_cap) {
        size_t cap = f->bl_cap ? f->bl_cap : 256;
        while (cap < f->bl_count + (size_t)n)
            cap *= 2;
        psagg__fabric_event *nb = malloc(cap * sizeof(*nb));
        if (nb == NULL) {
            pthread_mutex_unlock(&f->lock);
            return psagg__fail(PSAGG_ENOMEM, "%s: no memory to park %d completions", f->prov, n);
        }
        for (size_t i = 0; i < f->bl_count; i++)
            nb[i] = f->backlog[(f->bl_head + i) % f->bl_cap];
        free(f->backlog);
        f->backlog = nb;
        f->bl_cap = cap;
        f->bl_head = 0;
    }
    for (int i = 0; i < n; i++)
        f->backlog[(f->bl_head + f->bl_count + (size_t)i) % f->bl_cap] = ev[i];
    f->bl_count += (size_t)n;
    pthread_mutex_unlock(&f->lock);
    return PSAGG_OK;
}

/*
 * Drive progress from a send/post_recv that met -FI_EAGAIN: read the CQ and park what it
 * returns for the next poll. Returns the number of completions read, PSAGG_EAGAIN when the
 * backlog is full (the caller must poll first), or a fatal status.
 */
static int drive_progress(psagg__fabric *f)
{
    psagg__fabric_event ev[CQ_BATCH];
    size_t room;
    int n, st;

    pthread_mutex_lock(&f->lock);
    room = BACKLOG_MAX - f->bl_count;
    pthread_mutex_unlock(&f->lock);
    if (room == 0)
        return psagg__fail(PSAGG_EAGAIN,
                           "%s: %d completions are waiting for psagg__fabric_poll; poll first",
                           f->prov, BACKLOG_MAX);
    n = cq_fetch(f, ev, room < CQ_BATCH ? (int)room : CQ_BATCH, 0);
    if (n <= 0)
        return n;
    st = fab_backlog_push(f, ev, n);
    if (st < 0)
        return st;
    if (f->cq_wait)
        (void)fi_cq_signal(f->cq); /* wake a poll blocked in fi_cq_sread */
    return n;
}

/*
 * Post one send or receive, driving progress and retrying while the provider answers
 * -FI_EAGAIN. Gives up with PSAGG_ETIMEDOUT after POST_RETRY_MS of nothing but -FI_EAGAIN
 * (the peer's queue never drains, e.g. a dead shm peer), so no call blocks forever.
 */
int fab_post_op(psagg__fabric *f, struct fabric_op *op, fi_addr_t to, const void *sbuf, void *rbuf,
                size_t len, void *desc, int once)
{
    const char *what = op->kind == OP_SEND    ? "fi_send"
                       : op->kind == OP_LSEND ? "fi_inject"
                                              : "fi_recv";
    int64_t deadline = 0;
    unsigned idle = 0;
    ssize_t ret;
    int n;

    for (;;) {
        fab_lock(f);
        if (op->kind == OP_SEND)
            ret = fi_send(f->ep, sbuf, len, desc, to, &op->fictx);
        else if (op->kind == OP_LSEND)
            ret = fi_inject(f->ep, sbuf, len, to);
        else
            ret = fi_recv(f->ep, rbuf, len, desc, FI_ADDR_UNSPEC, &op->fictx);
        fab_unlock(f);
        if (ret == 0)
            return PSAGG_OK;
        if (ret != -FI_EAGAIN) {
            if (op->kind != OP_RECV)
                return psagg__fail(status_from_fi((int)-ret),
                                   "%s: %s to peer %" PRIu64 " (%zu bytes): %s", f->prov, what,
                                   (uint64_t)to, len, fi_strerror((int)-ret));
            return psagg__fail(status_from_fi((int)-ret), "%s: fi_recv (%zu bytes): %s", f->prov,
                               len, fi_strerror((int)-ret));
        }
        n = drive_progress(f);
        if (n < 0)
            return n;
        if (once) /* the caller retries later, watching everything else meanwhile */
            return psagg__fail(PSAGG_EAGAIN, "%s: %s: the provider's queue is full", f->prov, what);
        if (deadline == 0) {
            deadline = psagg__now_ms() + f->post_timeout_ms;
            LOG_DEBUG(&f->log, "%s: %s: queue full, driving progress", f->prov, what);
        } else if (psagg__now_ms() > deadline) {
            return psagg__fail(PSAGG_ETIMEDOUT,
                               "%s: %s (%zu bytes) met -FI_EAGAIN for %d ms; peer %" PRIu64
                               " not draining",
                               f->prov, what, len, f->post_timeout_ms,
                               op->kind != OP_RECV ? (uint64_t)to : UINT64_MAX);
        }
        if (n > 0) {
            idle = 0;
        } else if (++idle < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/*
 * tcp;ofi_rxm (what "tcp" falls back to where libfabric has no native TCP RDM provider) sends
 * messages above FI_OFI_RXM_SAR_LIMIT (128 KiB) by rendezvous: the receiver reads the data with an
 * RMA read whose request travels on the same TCP connection as the bulk data going the other way,
 * so the two directions of a link take turns instead of overlapping (measured: ResNet-50 maxmin4 at
 * 1 Gbit/s, 440-500 ms a step against 300-320 ms with eager sends). psagg's messages are bounded by
 * max_msg (one chunk), so every one can go eagerly when rxm's limits are at least that. rxm reads
 * them from the environment once, when libfabric initialises its providers (the first fi_getinfo of
 * the process), and keeps them process-wide: there is no per-endpoint setting (libfabric 1.17
 * refuses an inject_size hint above them), and rxm refuses a connection from a peer whose eager
 * limit differs ("eager_limit mismatch"), so every process of a job must start with the same
 * values. A library must not change its host process's environment (setenv races with
 * every getenv of other threads), and a process that raised its own limits would shut out
 * peers started without them, so no psagg code sets them: psagg__fabric_env_hint says what to
 * set, the launchers give it to every process (psagg-server --fabric-env prints it), and
 * psagg__fabric_open warns when an rxm endpoint opens without it (still correct, but slower).
 */
int psagg__fabric_env_hint(const char *provider, size_t max_msg, psagg__fabric_env *out, int max)
{
    /* "tcp" may fall back to rxm (fabric_getinfo): its limits then, harmless otherwise */
    if (!provider || (strcmp(provider, "tcp") != 0 && !strstr(provider, "ofi_rxm")) || max < 2)
        return 0;
    out[0] = (psagg__fabric_env){.name = "FI_OFI_RXM_EAGER_LIMIT"};
    snprintf(out[0].value, sizeof out[0].value, "%zu", max_msg);
    out[1] = (psagg__fabric_env){.name = "FI_OFI_RXM_SAR_LIMIT"};
    snprintf(out[1].value, sizeof out[1].value, "%zu", 2 * max_msg);
    return 2;
}

/* Warn when the environment does not give rxm the limits psagg__fabric_env_hint asks for. */
static void check_env(size_t max_msg, const psagg__logger *log)
{
    psagg__fabric_env env[2];
    int n = psagg__fabric_env_hint("tcp;ofi_rxm", max_msg, env, 2);
    for (int i = 0; i < n; i++) {
        const char *have = getenv(env[i].name);
        if (!have || strtoull(have, NULL, 10) < strtoull(env[i].value, NULL, 10)) {
            LOG_WARN(log,
                     "%s is %s%s: large chunks go by rendezvous (slower). For full speed give "
                     "every process of the job %s=%s %s=%s (psagg-server --fabric-env; "
                     "deploy/psagg-local does)",
                     env[i].name, have ? "" : "unset", have ? have : "", env[0].name, env[0].value,
                     env[1].name, env[1].value);
            return;
        }
    }
}

/*
 * fi_getinfo for provider prov_name: FI_EP_RDM with FI_MSG, every mr_mode bit we can honour,
 * FI_THREAD_SAFE if the provider grants it (else the best it offers, and we serialize).
 */
static int getinfo_prov(const char *prov, const char *node, struct fi_info **out)
{
    struct fi_info *hints = fi_allocinfo();
    int ret;

    if (hints == NULL)
        return -FI_ENOMEM;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_SOURCE; /* every receive names its sender (psagg__fabric_event.src) */
    hints->mode = FI_CONTEXT | FI_CONTEXT2; /* every op carries a struct fi_context2 */
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->fabric_attr->prov_name = strdup(prov);
    if (hints->fabric_attr->prov_name == NULL) {
        fi_freeinfo(hints);
        return -FI_ENOMEM;
    }
    ret = fi_getinfo(FABRIC_API_VERSION, node, NULL, node ? FI_SOURCE : 0, hints, out);
    if (ret == -FI_ENODATA) {
        /* Maybe only a lower threading level: take it and serialize ourselves. */
        hints->domain_attr->threading = FI_THREAD_UNSPEC;
        ret = fi_getinfo(FABRIC_API_VERSION, node, NULL, node ? FI_SOURCE : 0, hints, out);
    }
    fi_freeinfo(hints);
    return ret;
}

/*
 * Which libfabric provider a configured name means. "tcp" is TCP with whatever libfabric
 * offers best for FI_EP_RDM: its native RDM TCP provider first ("net" in libfabric 1.17,
 * renamed "tcp" in 1.18), then tcp under the ofi_rxm utility provider. The native one reads
 * every message straight from the socket into the posted receive buffer; rxm lands eager
 * messages in its own bounce buffers (one more copy, and memory that pages in and out:
 * ResNet-50 on loopback, 4 workers, 2 servers: 300-900 server page faults a step under rxm,
 * none under net; docs/cluster.md, "libfabric provider and environment"). Its costs, in 1.17: a
 * send to a dead peer meets -FI_EAGAIN while it keeps reconnecting (transport.h), and it leaks an
 * fi_info per endpoint and connection (tests/sanitizer_defaults.c). "tcp;ofi_rxm" (or any other
 * libfabric name) asks for exactly that provider; "shm" binds no node.
 */
static int fabric_getinfo(const psagg__fabric_opts *opts, struct fi_info **out)
{
    static const char *const tcp_order[] = {"net", "tcp"};
    const char *node = strcmp(opts->provider, "shm") == 0 ? NULL : opts->node;
    int ret;

    if (strcmp(opts->provider, "tcp") == 0) {
        for (size_t i = 0; i < sizeof tcp_order / sizeof tcp_order[0]; i++) {
            ret = getinfo_prov(tcp_order[i], node, out);
            if (ret != -FI_ENODATA)
                break;
        }
    } else {
        ret = getinfo_prov(opts->provider, node, out);
    }
    if (ret == -FI_ENOMEM)
        return psagg__fail(PSAGG_ENOMEM, "fabric: out of memory");
    if (ret != 0)
        return psagg__fail(PSAGG_EFABRIC,
                           "fabric provider \"%s\" (node %s): fi_getinfo for FI_EP_RDM messaging "
                           "failed: %s%s",
                           opts->provider, node ? node : "(any)", fi_strerror(-ret),
                           strcmp(opts->provider, "tcp") == 0
                               ? " (tried libfabric's \"net\", \"tcp\" and \"tcp;ofi_rxm\")"
                               : "");
    return PSAGG_OK;
}

/*
 * Open the completion queue, with an FD wait object where the provider has one (poll blocks in
 * fi_cq_sread). Only FI_WAIT_FD: with FI_WAIT_UNSPEC libfabric 1.17 shm picks a yield wait
 * whose fi_cq_sread did not return at its timeout (seen here), and shm has no FD wait, so shm
 * polls with fi_cq_read and short sleeps instead.
 */
static int fabric_cq_open(psagg__fabric *f)
{
    struct fi_cq_attr attr;
    size_t size = f->info->tx_attr->size + f->info->rx_attr->size;
    int ret;

    memset(&attr, 0, sizeof(attr));
    attr.format = FI_CQ_FORMAT_MSG;
    attr.size = size < 1024 ? 1024 : size;
    attr.wait_obj = f->serialize ? FI_WAIT_NONE : FI_WAIT_FD;
    ret = fi_cq_open(f->domain, &attr, &f->cq, NULL);
    if (ret != 0 && attr.wait_obj != FI_WAIT_NONE) {
        LOG_DEBUG(&f->log, "%s: CQ with a wait object: %s; polling without one", f->prov,
                  fi_strerror(-ret));
        attr.wait_obj = FI_WAIT_NONE;
        ret = fi_cq_open(f->domain, &attr, &f->cq, NULL);
    }
    if (ret != 0)
        return psagg__fail(PSAGG_EFABRIC, "%s: fi_cq_open: %s", f->prov, fi_strerror(-ret));
    f->cq_wait = attr.wait_obj != FI_WAIT_NONE;
    return PSAGG_OK;
}

/*
 * Open the whole stack: fabric, domain, CQ, AV, endpoint (bound and enabled). On failure
 * everything opened so far is closed again in reverse order and *out is untouched.
 */
/*
 * Debian's libfabric links the psm provider's libinfinipath, whose constructor installs its own
 * handlers for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGABRT (and more) that call exit() from the
 * handler, in every process that loads libfabric: a crash then exits 1 instead of dying by its
 * signal (no core, a launcher reports "exit code 1"), and a SIGTERM during the exit that
 * follows runs exit() again inside it (a psagg.torch worker hung that way; the Python package
 * keeps the handlers it had when it loads libpsagg). psagg uses no PSM hardware: a handler that
 * lives in such a library is put back to the default; a handler of the process's own stays.
 */
static void default_psm_signals(const psagg__logger *log)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV,
                               SIGBUS, SIGABRT, SIGILL, SIGFPE};
    char reset[64] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction sa;
        Dl_info where;
        void *fn;
        if (sigaction(sigs[i], NULL, &sa))
            continue;
        fn = (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
        if (fn == (void *)SIG_DFL || fn == (void *)SIG_IGN || !dladdr(fn, &where) ||
            !where.dli_fname ||
            (!strstr(where.dli_fname, "libinfinipath") && !strstr(where.dli_fname, "libpsm")))
            continue;
        signal(sigs[i], SIG_DFL);
        used = psagg__list_int(reset, sizeof reset, used, sigs[i]);
    }
    if (used)
        LOG_DEBUG(log, "signals %s: the psm library's handlers (exit() inside) put back to default",
                  reset);
}

psagg_status psagg__fabric_open(const psagg__fabric_opts *opts, psagg__fabric **out)
{
    psagg__fabric *f;
    struct fi_av_attr av_attr;
    uint64_t mr_mode;
    char name[PSAGG_FABRIC_NAME_MAX];
    int ret, st;

    if (opts == NULL || out == NULL || opts->provider == NULL || opts->provider[0] == '\0')
        return psagg__fail(PSAGG_EINVAL, "fabric: no provider given");
    if (opts->max_msg == 0 || opts->max_msg > (size_t)SSIZE_MAX)
        return psagg__fail(PSAGG_EINVAL, "fabric %s: max_msg %zu out of range (1..%zd)",
                           opts->provider, opts->max_msg, (ssize_t)SSIZE_MAX);

    f = calloc(1, sizeof(*f));
    if (f == NULL)
        return psagg__fail(PSAGG_ENOMEM, "fabric: out of memory");
    f->max_msg = opts->max_msg;
    f->post_timeout_ms = opts->post_timeout_ms > 0 ? opts->post_timeout_ms : POST_RETRY_MS;
    if (opts->log)
        f->log = *opts->log;
    else
        psagg__logger_init(&f->log, "psagg", -1);
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->fab_lock, NULL);
    default_psm_signals(&f->log);

    st = fabric_getinfo(opts, &f->info);
    if (st < 0)
        goto err_free;
    snprintf(f->prov, sizeof(f->prov), "%s", f->info->fabric_attr->prov_name);
    if (strstr(f->prov, "ofi_rxm") != NULL)
        check_env(opts->max_msg, &f->log);

    if (f->info->ep_attr->max_msg_size < opts->max_msg) {
        st = psagg__fail(PSAGG_EUNSUPPORTED,
                         "%s: max_msg %zu exceeds the provider's max_msg_size %zu", f->prov,
                         opts->max_msg, f->info->ep_attr->max_msg_size);
        goto err_info;
    }
    mr_mode = (uint64_t)f->info->domain_attr->mr_mode;
    if (mr_mode == FI_MR_BASIC) /* pre-1.5 style: basic = virt_addr + allocated + prov_key */
        mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    f->local_mr = (mr_mode & FI_MR_LOCAL) || (f->info->mode & FI_LOCAL_MR);
    f->mr_endpoint = (mr_mode & FI_MR_ENDPOINT) != 0;
    f->mr_prov_key = (mr_mode & FI_MR_PROV_KEY) != 0;
    f->serialize = f->info->domain_attr->threading != FI_THREAD_SAFE;
    f->addr_str = f->info->addr_format == FI_ADDR_STR;

    ret = fi_fabric(f->info->fabric_attr, &f->fabric, NULL);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: fi_fabric: %s", f->prov, fi_strerror(-ret));
        goto err_info;
    }
    ret = fi_domain(f->fabric, f->info, &f->domain, NULL);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: fi_domain: %s", f->prov, fi_strerror(-ret));
        goto err_fabric;
    }
    st = fabric_cq_open(f);
    if (st < 0)
        goto err_domain;

    memset(&av_attr, 0, sizeof(av_attr));
    av_attr.type = f->info->domain_attr->av_type;
    ret = fi_av_open(f->domain, &av_attr, &f->av, NULL);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: fi_av_open: %s", f->prov, fi_strerror(-ret));
        goto err_cq;
    }
    ret = fi_endpoint(f->domain, f->info, &f->ep, NULL);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: fi_endpoint: %s", f->prov, fi_strerror(-ret));
        goto err_av;
    }
    ret = fi_ep_bind(f->ep, &f->av->fid, 0);
    if (ret == 0)
        ret = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret == 0)
        ret = fi_enable(f->ep);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: binding/enabling the endpoint: %s", f->prov,
                         fi_strerror(-ret));
        goto err_ep;
    }
    f->name_len = sizeof(name);
    ret = fi_getname(&f->ep->fid, name, &f->name_len);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: fi_getname: %s", f->prov, fi_strerror(-ret));
        goto err_ep;
    }
    fab_local_init(f, name, f->name_len);

    LOG_DEBUG(&f->log,
              "fabric: opened %s (fabric %s, domain %s), mr_mode 0x%" PRIx64
              "%s, %s, cq wait %s, max_msg_size %zu",
              f->prov, f->info->fabric_attr->name, f->info->domain_attr->name, mr_mode,
              f->local_mr ? " (local registration)" : "",
              f->serialize ? "serialized (no FI_THREAD_SAFE)" : "FI_THREAD_SAFE",
              f->cq_wait ? "fd" : "none (fi_cq_read + sleeps)", f->info->ep_attr->max_msg_size);
    *out = f;
    return PSAGG_OK;

err_ep:
    fi_close(&f->ep->fid);
err_av:
    fi_close(&f->av->fid);
err_cq:
    fi_close(&f->cq->fid);
err_domain:
    fi_close(&f->domain->fid);
err_fabric:
    fi_close(&f->fabric->fid);
err_info:
    fi_freeinfo(f->info);
err_free:
    pthread_mutex_destroy(&f->fab_lock);
    pthread_mutex_destroy(&f->lock);
    free(f);
    return st;
}

static void close_fid(psagg__fabric *f, struct fid *fid, const char *what)
{
    int ret = fi_close(fid);
    if (ret != 0)
        LOG_WARN(&f->log, "%s: closing the %s: %s", f->prov, what, fi_strerror(-ret));
}

/*
 * Close everything. The endpoint goes first so that operations still in flight are cancelled
 * before the regions they may use are deregistered (libfabric's fabtests order); then the
 * regions, AV, CQ, domain and fabric. Completions not yet polled are dropped.
 */
void psagg__fabric_close(psagg__fabric *f)
{
    if (f == NULL)
        return;
    close_fid(f, &f->ep->fid, "endpoint");
    while (f->mrs) {
        struct fabric_mr *m = f->mrs;
        f->mrs = m->next;
        close_fid(f, &m->mr->fid, "memory region");
        free(m);
    }
    close_fid(f, &f->av->fid, "address vector");
    close_fid(f, &f->cq->fid, "completion queue");
    close_fid(f, &f->domain->fid, "domain");
    close_fid(f, &f->fabric->fid, "fabric");
    fi_freeinfo(f->info);
    while (f->slabs) {
        struct op_slab *s = f->slabs;
        f->slabs = s->next;
        free(s);
    }
    free(f->backlog);
    fab_local_close(f);
    pthread_mutex_destroy(&f->fab_lock);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

int psagg__fabric_source_reliable(const psagg__fabric *f)
{
    return f && (strstr(f->prov, "ofi_rxm") != NULL || strcmp(f->prov, "net") == 0);
}

const char *psagg__fabric_provider(const psagg__fabric *f)
{
    return f ? f->prov : "";
}

/* Copy the endpoint name into buf; *len is the room in, the name's length out. */
psagg_status psagg__fabric_name(psagg__fabric *f, void *buf, size_t *len)
{
    size_t room;
    int ret;

    if (f == NULL || buf == NULL || len == NULL)
        return psagg__fail(PSAGG_EINVAL, "fabric name: NULL argument");
    room = *len;
    ret = fi_getname(&f->ep->fid, buf, len);
    if (ret == -FI_ETOOSMALL)
        return psagg__fail(PSAGG_EINVAL, "%s: endpoint name needs %zu bytes, buffer has %zu",
                           f->prov, *len, room);
    if (ret != 0)
        return psagg__fail(PSAGG_EFABRIC, "%s: fi_getname: %s", f->prov, fi_strerror(-ret));
    return PSAGG_OK;
}

/*
 * Insert a peer's endpoint name into the AV. fi_av_insert reads as many bytes as the
 * provider's address format has and takes no length, so the name (which came off the wire)
 * is checked first: string addresses must be NUL-terminated within len, binary ones must be
 * exactly as long as our own name.
 */
psagg_status psagg__fabric_add_peer(psagg__fabric *f, const void *name, size_t len,
                                    psagg__peer *out)
{
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    int ret;

    if (f == NULL || name == NULL || out == NULL)
        return psagg__fail(PSAGG_EINVAL, "fabric add_peer: NULL argument");
    if (len == 0 || len > PSAGG_FABRIC_NAME_MAX)
        return psagg__fail(PSAGG_EINVAL, "%s: peer name of %zu bytes (1..%d)", f->prov, len,
                           PSAGG_FABRIC_NAME_MAX);
    if (f->addr_str ? memchr(name, '\0', len) == NULL : len != f->name_len)
        return psagg__fail(PSAGG_EINVAL, "%s: peer name of %zu bytes is not a %s address", f->prov,
                           len, f->addr_str ? "NUL-terminated string" : "same-format");
    fab_lock(f);
    ret = fi_av_insert(f->av, name, 1, &addr, 0, NULL);
    fab_unlock(f);
    if (ret != 1 || addr == FI_ADDR_NOTAVAIL)
        return psagg__fail(PSAGG_EFABRIC, "%s: fi_av_insert: %s", f->prov,
                           ret < 0 ? fi_strerror(-ret) : "address not accepted");
    *out = (psagg__peer)addr;
    return PSAGG_OK;
}

/*
 * Register buf for sends and receives when the provider's mr_mode has FI_MR_LOCAL (binding it
 * to the endpoint under FI_MR_ENDPOINT); otherwise nothing to do and *desc = NULL.
 */
psagg_status psagg__fabric_reg(psagg__fabric *f, void *buf, size_t len, void **desc)
{
    struct fabric_mr *m;
    uint64_t key;
    int ret, st;

    if (f == NULL || buf == NULL || len == 0 || desc == NULL)
        return psagg__fail(PSAGG_EINVAL, "fabric reg: NULL or empty region");
    if (!f->local_mr) {
        *desc = NULL;
        return PSAGG_OK;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return psagg__fail(PSAGG_ENOMEM, "fabric reg: out of memory");
    pthread_mutex_lock(&f->lock);
    key = f->next_key++; /* ignored under FI_MR_PROV_KEY */
    pthread_mutex_unlock(&f->lock);

    fab_lock(f);
    ret = fi_mr_reg(f->domain, buf, len, FI_SEND | FI_RECV, 0, key, 0, &m->mr, NULL);
    fab_unlock(f);
    if (ret != 0) {
        st = psagg__fail(PSAGG_EFABRIC, "%s: fi_mr_reg(%zu bytes): %s", f->prov, len,
                         fi_strerror(-ret));
        goto err_free;
    }
    if (f->mr_endpoint) {
        fab_lock(f);
        ret = fi_mr_bind(m->mr, &f->ep->fid, 0);
        if (ret == 0)
            ret = fi_mr_enable(m->mr);
        fab_unlock(f);
        if (ret != 0) {
            st = psagg__fail(PSAGG_EFABRIC, "%s: binding a memory region to the endpoint: %s",
                             f->prov, fi_strerror(-ret));
            goto err_close;
        }
    }
    *desc = fi_mr_desc(m->mr);
    pthread_mutex_lock(&f->lock);
    m->next = f->mrs;
    f->mrs = m;
    pthread_mutex_unlock(&f->lock);
    return PSAGG_OK;

err_close:
    fi_close(&m->mr->fid);
err_free:
    free(m);
    return st;
}

psagg_status psagg__fabric_post_recv(psagg__fabric *f, void *buf, size_t len, void *desc, void *ctx)
{
    struct fabric_op *op;
    int st;

    if (f == NULL || (buf == NULL && len > 0))
        return psagg__fail(PSAGG_EINVAL, "fabric post_recv: NULL buffer");
    op = fab_op_get(f, ctx, OP_RECV);
    if (op == NULL)
        return psagg__fail(PSAGG_ENOMEM, "%s: post_recv: out of memory", f->prov);
    op->rbuf = buf;
    op->rlen = len;
    op->rdesc = desc;
    st = fab_post_op(f, op, FI_ADDR_UNSPEC, NULL, buf, len, desc, 0);
    if (st < 0)
        fab_op_put(f, op);
    return st;
}

static psagg_status fabric_send(psagg__fabric *f, psagg__peer to, const void *buf, size_t len,
                                void *desc, void *ctx, int once)
{
    struct fabric_op *op;
    int st;

    if (f == NULL || (buf == NULL && len > 0))
        return psagg__fail(PSAGG_EINVAL, "fabric send: NULL buffer");
    if (len > f->max_msg)
        return psagg__fail(PSAGG_EINVAL, "%s: send of %zu bytes exceeds max_msg %zu", f->prov, len,
                           f->max_msg);
    if (fab_local_sends_to(f, to, len))
        return fab_local_send(f, to, buf, len, ctx, once);
    op = fab_op_get(f, ctx, OP_SEND);
    if (op == NULL)
        return psagg__fail(PSAGG_ENOMEM, "%s: send: out of memory", f->prov);
    st = fab_post_op(f, op, (fi_addr_t)to, buf, NULL, len, desc, once);
    if (st < 0)
        fab_op_put(f, op);
    return st;
}

psagg_status psagg__fabric_send(psagg__fabric *f, psagg__peer to, const void *buf, size_t len,
                                void *desc, void *ctx)
{
    return fabric_send(f, to, buf, len, desc, ctx, 0);
}

psagg_status psagg__fabric_try_send(psagg__fabric *f, psagg__peer to, const void *buf, size_t len,
                                    void *desc, void *ctx)
{
    return fabric_send(f, to, buf, len, desc, ctx, 1);
}

/*
 * Return parked completions first, then what the CQ has. With nothing and timeout_ms > 0,
 * wait: in fi_cq_sread slices of at most SREAD_SLICE_MS when the CQ has a wait object (a
 * sender that parks completions also signals the CQ), else fi_cq_read with yields and 50 us
 * sleeps, until the first completion or the deadline.
 */
void psagg__fabric_wake(psagg__fabric *f)
{
    atomic_store(&f->woken, 1);
    if (f->cq_wait)
        (void)fi_cq_signal(f->cq);
}

int psagg__fabric_poll(psagg__fabric *f, psagg__fabric_event *ev, int max, int timeout_ms)
{
    int64_t deadline = 0;
    unsigned idle = 0;
    int n, r;

    if (f == NULL || ev == NULL || max <= 0)
        return psagg__fail(PSAGG_EINVAL, "fabric poll: bad arguments");
    for (;;) {
        /* each turn, not only on entry: a reader that dies while this poll waits fails its
         * sends within LOCAL_REAP_MS, however long the caller's timeout */
        fab_local_reap(f);
        if (atomic_exchange(&f->woken, 0))
            timeout_ms = 0; /* psagg__fabric_wake: return what there is, even nothing */
        n = backlog_pop(f, ev, max);
        if (n < max) {
            r = cq_fetch(f, ev + n, max - n, 0);
            if (r < 0)
                return n > 0 ? n : r; /* a failed CQ fails again on the next call */
            n += r;
        }
        if (n > 0 || timeout_ms <= 0)
            return n;

        int64_t now = psagg__now_ms();
        if (deadline == 0)
            deadline = now + timeout_ms;
        if (now >= deadline)
            return 0;
        if (f->cq_wait) {
            int64_t left = deadline - now;
            /* parked ACKs or reposts go out on the next read: keep reading */
            int slice = atomic_load(&f->local_pending) ? 1 : SREAD_SLICE_MS;
            r = cq_fetch(f, ev, max, left < slice ? (int)left : slice);
            if (r != 0)
                return r;
        } else if (++idle < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}
