/*
 * runtime/transport_local.c - same-host copies (transport.h, wire.h "SAME-HOST COPIES"): a large
 * message between two processes of one host moves by descriptor + process_vm_readv instead of
 * through the provider. Part of the data path of transport.c, whose state it shares through
 * transport_impl.h.
 *
 * A send to a peer that copies ours is a fi_inject of a psagg__msg_local DESC, its operation
 * waiting in a slot table (the cookie names the slot and its generation, so an ACK for anything
 * else is recognised) until the ACK comes. A received DESC from a peer we accepted is copied
 * into the receive buffer it arrived in, which then completes as the message; the ACK goes back
 * by fi_inject (parked when the provider's queue is full, and sent by the next read of the CQ).
 * A received ACK completes its send and its receive buffer is posted again here, unseen by the
 * caller.
 *
 * Whoever polls also reaps: a send whose reader's process is gone fails (fab_local_reap).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sodium.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/transport.h"
#include "runtime/transport_impl.h"
#include "runtime/wire.h"

/*
 * Whether this endpoint can take part (it can inject a psagg__msg_local, and its addresses are
 * binary: not shm), and the copy of its name that psagg__fabric_local_self's probe points at.
 */
void fab_local_init(psagg__fabric *f, const void *name, size_t len)
{
    f->slot_free = UINT32_MAX;
    randombytes_buf(f->self.secret, sizeof f->self.secret);
    memcpy(f->self.name, name, len);
    f->local_ok = !f->addr_str && strcmp(f->prov, "shm") != 0 &&
                  f->info->tx_attr->inject_size >= sizeof(psagg__msg_local);
}

/* Free the peers, the slots and the ACKs still parked (the endpoint is closed already). */
void fab_local_close(psagg__fabric *f)
{
    for (size_t i = 0; i < f->n_lpeers; i++)
        if (f->lpeers[i].pidfd >= 0)
            close(f->lpeers[i].pidfd);
    free(f->lpeers);
    free(f->slots);
    while (f->acks) {
        struct local_ack *a = f->acks;
        f->acks = a->next;
        free(a);
    }
}

static struct local_peer *local_find_locked(psagg__fabric *f, psagg__peer peer)
{
    for (size_t i = 0; i < f->n_lpeers; i++)
        if (f->lpeers[i].peer == peer)
            return &f->lpeers[i];
    return NULL;
}

static struct local_peer *local_add_locked(psagg__fabric *f, psagg__peer peer)
{
    struct local_peer *lp = local_find_locked(f, peer);
    if (lp)
        return lp;
    if (f->n_lpeers == f->lpeers_cap) {
        size_t cap = f->lpeers_cap ? 2 * f->lpeers_cap : 8;
        struct local_peer *n = realloc(f->lpeers, cap * sizeof(*n));
        if (n == NULL)
            return NULL;
        f->lpeers = n;
        f->lpeers_cap = cap;
    }
    lp = &f->lpeers[f->n_lpeers++];
    memset(lp, 0, sizeof(*lp));
    lp->peer = peer;
    lp->pidfd = -1;
    return lp;
}

static void slot_free_locked(psagg__fabric *f, uint32_t idx)
{
    f->slots_used--;
    f->slots[idx].op = NULL;
    f->slots[idx].next_free = f->slot_free;
    f->slot_free = idx;
}

/* A free slot for a same-host send (growing the table); UINT32_MAX without memory. */
static uint32_t slot_alloc_locked(psagg__fabric *f)
{
    uint32_t idx;
    if (f->slot_free == UINT32_MAX) {
        uint32_t cap = f->slots_cap ? 2 * f->slots_cap : 64;
        struct local_slot *n = realloc(f->slots, cap * sizeof(*n));
        if (n == NULL)
            return UINT32_MAX;
        f->slots = n;
        for (uint32_t i = cap; i-- > f->slots_cap;) {
            n[i].op = NULL;
            n[i].gen = 0;
            n[i].next_free = f->slot_free;
            f->slot_free = i;
        }
        f->slots_cap = cap;
    }
    idx = f->slot_free;
    f->slot_free = f->slots[idx].next_free;
    f->slots_used++;
    return idx;
}

/* Park an ACK (a node of its own) for the next flush: the provider's queue was full. */
static void ack_park(psagg__fabric *f, struct local_ack *a, int front)
{
    pthread_mutex_lock(&f->lock);
    if (front) {
        a->next = f->acks;
        f->acks = a;
        if (f->acks_tail == NULL)
            f->acks_tail = a;
    } else {
        a->next = NULL;
        if (f->acks_tail)
            f->acks_tail->next = a;
        else
            f->acks = a;
        f->acks_tail = a;
    }
    atomic_store(&f->local_pending, 1);
    pthread_mutex_unlock(&f->lock);
}

/* An ACK no peer took for this long is for a peer that is gone (its process, or its host). */
#define LOCAL_ACK_GIVE_UP_MS 30000

/* Inject one ACK; 1 if sent (or failed for good, logged), 0 if the provider's queue is full. */
static int ack_inject(psagg__fabric *f, const struct local_ack *a)
{
    ssize_t r;
    fab_lock(f);
    r = fi_inject(f->ep, &a->m, sizeof(a->m), (fi_addr_t)a->to);
    fab_unlock(f);
    if (r == -FI_EAGAIN)
        return 0;
    if (r != 0)
        LOG_WARN(&f->log, "%s: acknowledging a same-host copy to peer %" PRIu64 ": %s", f->prov,
                 (uint64_t)a->to, fi_strerror((int)-r));
    return 1;
}

static void local_ack(psagg__fabric *f, psagg__peer to, uint64_t cookie, int status)
{
    struct local_ack a = {.to = to}, *node;
    int parked;

    a.m.magic = PSAGG_LOCAL_MAGIC;
    a.m.type = PSAGG_LOCAL_ACK;
    a.m.cookie = cookie;
    a.m.status = status;
    /* ACKs to one peer go in order: after those to it that wait (a peer whose provider queue
       is full, or a dead one that a provider keeps reconnecting to: never one peer's behind
       another's, which would hang every copy of a live peer behind a dead one) */
    pthread_mutex_lock(&f->lock);
    parked = 0;
    for (const struct local_ack *p = f->acks; p && !parked; p = p->next)
        parked = p->to == to;
    pthread_mutex_unlock(&f->lock);
    if (!parked && ack_inject(f, &a))
        return;
    node = malloc(sizeof(*node));
    if (node == NULL) {
        LOG_WARN(&f->log, "%s: no memory to park an ACK to peer %" PRIu64 "; its send hangs",
                 f->prov, (uint64_t)to);
        return;
    }
    *node = a;
    node->since = psagg__now_ms();
    ack_park(f, node, 0);
}

/* Post again the receive buffers that held ACKs, and send the parked ACKs, as room allows. */
void fab_local_flush(psagg__fabric *f)
{
    struct fabric_op *op;
    struct local_ack *a;

    if (!atomic_load(&f->local_pending))
        return;
    pthread_mutex_lock(&f->lock);
    op = f->reposts;
    f->reposts = NULL;
    pthread_mutex_unlock(&f->lock);
    while (op) {
        struct fabric_op *next = op->next;
        ssize_t r;
        memset(&op->fictx, 0, sizeof(op->fictx));
        fab_lock(f);
        r = fi_recv(f->ep, op->rbuf, op->rlen, op->rdesc, FI_ADDR_UNSPEC, &op->fictx);
        fab_unlock(f);
        if (r == -FI_EAGAIN) {
            pthread_mutex_lock(&f->lock);
            struct fabric_op *last = op;
            while (last->next)
                last = last->next;
            last->next = f->reposts;
            f->reposts = op;
            pthread_mutex_unlock(&f->lock);
            break;
        }
        if (r != 0) {
            LOG_WARN(&f->log, "%s: posting a receive buffer again: %s; one buffer fewer", f->prov,
                     fi_strerror((int)-r));
            fab_op_put(f, op);
        }
        op = next;
    }
    /* every parked ACK gets its try (those of a peer that cannot take one wait, in order,
       without holding back the others': local_ack) */
    pthread_mutex_lock(&f->lock);
    a = f->acks;
    f->acks = f->acks_tail = NULL;
    pthread_mutex_unlock(&f->lock);
    {
        struct local_ack *kept = NULL, *kept_tail = NULL;
        while (a) {
            struct local_ack *next = a->next;
            int blocked = 0;
            for (const struct local_ack *k = kept; k && !blocked; k = k->next)
                blocked = k->to == a->to;
            if (!blocked && ack_inject(f, a)) {
                free(a);
            } else if (psagg__now_ms() - a->since > LOCAL_ACK_GIVE_UP_MS) {
                LOG_WARN(&f->log,
                         "%s: an ACK of a same-host copy to peer %" PRIu64 " waited %d s: given "
                         "up (the peer is gone)",
                         f->prov, (uint64_t)a->to, LOCAL_ACK_GIVE_UP_MS / 1000);
                free(a);
            } else {
                a->next = NULL;
                if (kept_tail)
                    kept_tail->next = a;
                else
                    kept = a;
                kept_tail = a;
            }
            a = next;
        }
        if (kept) { /* before any parked meanwhile */
            pthread_mutex_lock(&f->lock);
            kept_tail->next = f->acks;
            f->acks = kept;
            if (f->acks_tail == NULL)
                f->acks_tail = kept_tail;
            pthread_mutex_unlock(&f->lock);
        }
    }
    pthread_mutex_lock(&f->lock);
    atomic_store(&f->local_pending, f->reposts != NULL || f->acks != NULL);
    pthread_mutex_unlock(&f->lock);
}

/*
 * A receive of sizeof(psagg__msg_local) bytes completed into op's buffer. A DESC from a peer we
 * copy from: copy the message into that buffer (event: RECV_DONE of it, or RECV_ERROR) and
 * ACK. An ACK from a peer that copies ours: complete its send (SEND_DONE or SEND_ERROR) and
 * post the buffer again; an ACK for no send of ours is a RECV_ERROR. Returns 1 with *e
 * filled, or -1 when it is not a same-host message of such a peer (deliver it as it is).
 */
int fab_local_recv(psagg__fabric *f, struct fabric_op *op, fi_addr_t from, psagg__fabric_event *e)
{
    psagg__msg_local m;
    struct local_peer *lp;
    struct fabric_op *sop = NULL;
    pid_t pid = 0;
    int sends = 0, st = PSAGG_OK;

    memcpy(&m, op->rbuf, sizeof(m));
    if (m.magic != PSAGG_LOCAL_MAGIC || from == FI_ADDR_NOTAVAIL)
        return -1;
    pthread_mutex_lock(&f->lock);
    lp = local_find_locked(f, (psagg__peer)from);
    if (lp) {
        pid = lp->pid;
        sends = lp->sends_to;
    }
    pthread_mutex_unlock(&f->lock);
    e->src = (psagg__peer)from;
    e->len = 0;
    e->msg[0] = '\0';

    if (m.type == PSAGG_LOCAL_DESC && pid != 0) {
        if (m.len == 0 || m.len > op->rlen) {
            st = PSAGG_EPROTO;
            snprintf(e->msg, sizeof(e->msg),
                     "same-host message field len is %" PRIu64 ", the receive buffer holds %zu",
                     m.len, op->rlen);
        } else {
            struct iovec li = {op->rbuf, (size_t)m.len};
            struct iovec ri = {(void *)(uintptr_t)m.addr, (size_t)m.len};
            ssize_t n = process_vm_readv(pid, &li, 1, &ri, 1, 0);
            if (n != (ssize_t)m.len) {
                int err = n < 0 ? errno : EIO;
                st = err == ESRCH ? PSAGG_EPEER : PSAGG_EPROTO;
                snprintf(e->msg, sizeof(e->msg),
                         "same-host copy of %" PRIu64 " bytes at 0x%" PRIx64
                         " out of pid %d: %.60s",
                         m.len, m.addr, (int)pid, n < 0 ? strerror(err) : "short copy");
            }
        }
        if (st != PSAGG_EPEER) /* (a peer whose process is gone is told nothing) */
            local_ack(f, (psagg__peer)from, m.cookie, st);
        if (st == PSAGG_OK)
            atomic_fetch_add(&f->local_copied, 1);
        e->kind = st ? PSAGG_FABRIC_RECV_ERROR : PSAGG_FABRIC_RECV_DONE;
        e->ctx = op->ctx;
        e->len = st ? 0 : (size_t)m.len;
        e->status = st;
        fab_op_put(f, op);
        return 1;
    }
    if (m.type != PSAGG_LOCAL_ACK || !sends)
        return -1;

    uint32_t idx = (uint32_t)m.cookie, gen = (uint32_t)(m.cookie >> 32);
    pthread_mutex_lock(&f->lock);
    if (idx < f->slots_cap && f->slots[idx].op != NULL && f->slots[idx].gen == gen &&
        f->slots[idx].op->peer == (psagg__peer)from) {
        sop = f->slots[idx].op;
        slot_free_locked(f, idx);
        op->next = f->reposts;
        f->reposts = op;
        atomic_store(&f->local_pending, 1);
    }
    pthread_mutex_unlock(&f->lock);
    if (sop == NULL) {
        e->kind = PSAGG_FABRIC_RECV_ERROR;
        e->ctx = op->ctx;
        e->status = PSAGG_EPROTO;
        snprintf(e->msg, sizeof(e->msg),
                 "a same-host ACK for no send of ours (field cookie 0x%" PRIx64 ")", m.cookie);
        fab_op_put(f, op);
        return 1;
    }
    e->ctx = sop->ctx;
    if (m.status == 0) {
        e->kind = PSAGG_FABRIC_SEND_DONE;
        e->status = PSAGG_OK;
    } else {
        e->kind = PSAGG_FABRIC_SEND_ERROR;
        e->status = PSAGG_EPEER;
        snprintf(e->msg, sizeof(e->msg),
                 "the peer could not copy a same-host message (its status %d)", (int)m.status);
    }
    fab_op_put(f, sop);
    return 1;
}

void psagg__fabric_local_self(psagg__fabric *f, uint32_t *pid, uint64_t *probe,
                              uint8_t commit[PSAGG_LOCAL_COMMIT_BYTES])
{
    int ok = f != NULL && f->local_ok;
    *pid = ok ? (uint32_t)getpid() : 0;
    *probe = ok ? (uint64_t)(uintptr_t)&f->self : 0;
    memset(commit, 0, PSAGG_LOCAL_COMMIT_BYTES);
    if (ok)
        crypto_generichash(commit, PSAGG_LOCAL_COMMIT_BYTES, f->self.secret, sizeof f->self.secret,
                           NULL, 0);
}

psagg_status psagg__fabric_local_accept(psagg__fabric *f, psagg__peer peer, uint32_t pid,
                                        uint64_t probe,
                                        const uint8_t commit[PSAGG_LOCAL_COMMIT_BYTES],
                                        const void *name, size_t len)
{
    uint8_t got[32 + PSAGG_FABRIC_NAME_MAX], hash[PSAGG_LOCAL_COMMIT_BYTES];
    int pidfd;
    char path[64];
    struct stat self_ns, peer_ns;
    struct local_peer *lp;
    ssize_t n;

    if (f == NULL || name == NULL)
        return psagg__fail(PSAGG_EINVAL, "fabric local_accept: NULL argument");
    if (!f->local_ok)
        return psagg__fail(PSAGG_EUNSUPPORTED, "%s: no same-host copies over this provider",
                           f->prov);
    if (pid == 0 || probe == 0 || len == 0 || len > PSAGG_FABRIC_NAME_MAX || commit == NULL)
        return psagg__fail(PSAGG_EUNSUPPORTED, "the peer offers no same-host copies");
    snprintf(path, sizeof(path), "/proc/%u/ns/net", pid);
    if (stat("/proc/self/ns/net", &self_ns) != 0 || stat(path, &peer_ns) != 0)
        return psagg__fail(PSAGG_EUNSUPPORTED, "process %u: %s: %s", pid, path, strerror(errno));
    if (self_ns.st_ino != peer_ns.st_ino || self_ns.st_dev != peer_ns.st_dev)
        return psagg__fail(PSAGG_EUNSUPPORTED,
                           "process %u is in another network namespace (another host)", pid);
    /* the process, held from now on: a pidfd names this one even if its pid is reused (a
       kernel before 5.3 has none: then the pid alone, as kill(2) sees it) */
    pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    /* the secret, then the name: only the process that made the secret holds both */
    struct iovec li = {got, 32 + len}, ri = {(void *)(uintptr_t)probe, 32 + len};
    n = process_vm_readv((pid_t)pid, &li, 1, &ri, 1, 0);
    if (n != (ssize_t)(32 + len)) {
        if (pidfd >= 0)
            close(pidfd);
        return psagg__fail(PSAGG_EUNSUPPORTED, "cannot read process %u: %s", pid,
                           n < 0 ? strerror(errno) : "short copy");
    }
    crypto_generichash(hash, sizeof hash, got, 32, NULL, 0);
    if (sodium_memcmp(hash, commit, sizeof hash) != 0 || memcmp(got + 32, name, len) != 0) {
        sodium_memzero(got, sizeof got);
        if (pidfd >= 0)
            close(pidfd);
        return psagg__fail(PSAGG_EUNSUPPORTED,
                           "process %u does not hold the peer's secret and endpoint name at "
                           "0x%" PRIx64 ": it is not that peer",
                           pid, probe);
    }
    sodium_memzero(got, sizeof got);
    pthread_mutex_lock(&f->lock);
    lp = local_add_locked(f, peer);
    if (lp) {
        if (lp->pidfd >= 0)
            close(lp->pidfd);
        lp->pid = (pid_t)pid;
        lp->pidfd = pidfd;
    } else if (pidfd >= 0) {
        close(pidfd);
    }
    pthread_mutex_unlock(&f->lock);
    return lp ? PSAGG_OK : psagg__fail(PSAGG_ENOMEM, "fabric local_accept: out of memory");
}

uint64_t psagg__fabric_local_copied(psagg__fabric *f)
{
    return atomic_load(&f->local_copied);
}

psagg_status psagg__fabric_local_send(psagg__fabric *f, psagg__peer peer)
{
    struct local_peer *lp;

    if (f == NULL)
        return psagg__fail(PSAGG_EINVAL, "fabric fab_local_send: NULL argument");
    if (!f->local_ok)
        return psagg__fail(PSAGG_EUNSUPPORTED, "%s: no same-host copies over this provider",
                           f->prov);
    pthread_mutex_lock(&f->lock);
    lp = local_add_locked(f, peer);
    if (lp)
        lp->sends_to = 1;
    pthread_mutex_unlock(&f->lock);
    return lp ? PSAGG_OK : psagg__fail(PSAGG_ENOMEM, "fabric fab_local_send: out of memory");
}

/* 1 when sends of len bytes to peer go by same-host copy. */
int fab_local_sends_to(psagg__fabric *f, psagg__peer to, size_t len)
{
    struct local_peer *lp;
    int yes = 0;
    if (len < PSAGG_LOCAL_MIN || !f->local_ok)
        return 0;
    pthread_mutex_lock(&f->lock);
    lp = local_find_locked(f, to);
    yes = lp && lp->sends_to;
    pthread_mutex_unlock(&f->lock);
    return yes;
}

/* Send a DESC of buf to a peer that copies ours; the op waits in a slot for the ACK. */
psagg_status fab_local_send(psagg__fabric *f, psagg__peer to, const void *buf, size_t len,
                            void *ctx, int once)
{
    psagg__msg_local m = {.magic = PSAGG_LOCAL_MAGIC, .type = PSAGG_LOCAL_DESC};
    struct fabric_op *op = fab_op_get(f, ctx, OP_LSEND);
    uint32_t idx;
    int st;

    if (op == NULL)
        return psagg__fail(PSAGG_ENOMEM, "%s: send: out of memory", f->prov);
    op->peer = to;
    pthread_mutex_lock(&f->lock);
    idx = slot_alloc_locked(f);
    if (idx != UINT32_MAX) {
        f->slots[idx].op = op;
        m.cookie = (uint64_t)++f->slots[idx].gen << 32 | idx;
    }
    pthread_mutex_unlock(&f->lock);
    if (idx == UINT32_MAX) {
        fab_op_put(f, op);
        return psagg__fail(PSAGG_ENOMEM, "%s: send: out of memory", f->prov);
    }
    m.addr = (uint64_t)(uintptr_t)buf;
    m.len = len;
    st = fab_post_op(f, op, (fi_addr_t)to, &m, NULL, sizeof(m), NULL, once);
    if (st < 0) { /* nothing went out: no ACK will come */
        pthread_mutex_lock(&f->lock);
        slot_free_locked(f, idx);
        pthread_mutex_unlock(&f->lock);
        fab_op_put(f, op);
    }
    return st;
}

/*
 * A same-host send waits for its reader's ACK, which a dead reader never sends: every
 * LOCAL_REAP_MS while sends wait, fail those whose reader's process is gone (SEND_ERROR,
 * parked for this poll), as a dead TCP peer's sends fail. psagg__fabric_poll calls it on every
 * turn of its loop, waits included; it returns at once on a provider without same-host copies
 * (local_ok never changes after open) and, under the lock, when no send waits or the last look
 * was less than LOCAL_REAP_MS ago.
 */
#define LOCAL_REAP_MS 200

/* Whether a reader's process has exited: its pidfd is readable then (a zombie included). */
static int local_peer_gone(const struct local_peer *lp)
{
    if (lp->pidfd >= 0) {
        struct pollfd p = {.fd = lp->pidfd, .events = POLLIN};
        return poll(&p, 1, 0) > 0;
    }
    return kill(lp->pid, 0) != 0 && errno == ESRCH;
}

void fab_local_reap(psagg__fabric *f)
{
    int64_t now = psagg__now_ms();
    psagg__fabric_event e;

    if (!f->local_ok)
        return;
    pthread_mutex_lock(&f->lock);
    if (f->slots_used == 0 || now < f->next_reap_ms) {
        pthread_mutex_unlock(&f->lock);
        return;
    }
    f->next_reap_ms = now + LOCAL_REAP_MS;
    for (uint32_t i = 0; i < f->slots_cap; i++) {
        struct fabric_op *op = f->slots[i].op;
        struct local_peer *lp = op ? local_find_locked(f, op->peer) : NULL;
        if (lp == NULL || lp->pid == 0 || !local_peer_gone(lp))
            continue;
        slot_free_locked(f, i);
        memset(&e, 0, sizeof(e));
        e.kind = PSAGG_FABRIC_SEND_ERROR;
        e.ctx = op->ctx;
        e.src = op->peer;
        e.status = PSAGG_EPEER;
        snprintf(e.msg, sizeof(e.msg), "%s: same-host peer %" PRIu64 " (pid %d) is gone", f->prov,
                 (uint64_t)op->peer, (int)lp->pid);
        fab_op_put_locked(f, op);
        pthread_mutex_unlock(&f->lock);
        if (fab_backlog_push(f, &e, 1) < 0) /* no memory: report it the next time round */
            LOG_WARN(&f->log, "%s", psagg_last_error());
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
}
