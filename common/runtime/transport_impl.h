/*
 * runtime/transport_impl.h - what transport.c (the libfabric data path) and transport_local.c
 * (same-host copies) share: the fabric's state and the few functions each calls in the other.
 * Layer: runtime. INTERNAL: included by runtime/transport*.c only, never by another file (the
 * public API is runtime/transport.h).
 *
 * Locking: f->lock guards the backlog, the free operations, slabs, regions, next_key and
 * every same-host table; fab_lock (only when the provider grants no FI_THREAD_SAFE) wraps each
 * libfabric call. Neither is held across a call into the other file, except where a function
 * says "_locked" (the caller holds f->lock).
 */
#ifndef PSAGG_RUNTIME_TRANSPORT_IMPL_H
#define PSAGG_RUNTIME_TRANSPORT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <rdma/fabric.h>

#include "base/log.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

/* Operation contexts allocated at a time. */
#define OP_SLAB 256

/* OP_LSEND: a same-host send, a DESC injected and waiting for its ACK in a slot */
enum op_kind { OP_SEND = 1, OP_RECV = 2, OP_LSEND = 3 };

/* Internal per-operation context; fictx first so &op->fictx == op is the op_context. */
struct fabric_op {
    struct fi_context2 fictx;
    void *ctx; /* the caller's ctx */
    int kind;  /* enum op_kind */
    struct fabric_op *next;
    void *rbuf;  /* OP_RECV: the buffer, its room and descriptor (a same-host copy goes there, */
    size_t rlen; /* and a buffer that held an ACK is posted again with them) */
    void *rdesc;
    psagg__peer peer; /* OP_LSEND: the peer whose ACK completes it */
};

/* A same-host peer (psagg__fabric_local_accept / local_send). */
struct local_peer {
    psagg__peer peer;
    pid_t pid;    /* we copy its descriptors out of this process (0: we do not) */
    int pidfd;    /* that process (a pidfd: it cannot be another with the same pid), or -1 */
    int sends_to; /* it copies ours */
};

/* A slot of a same-host send waiting for its ACK; cookie = gen << 32 | index. */
struct local_slot {
    struct fabric_op *op; /* NULL: free */
    uint32_t gen;
    uint32_t next_free;
};

/* An ACK the provider's queue had no room for. */
struct local_ack {
    struct local_ack *next;
    psagg__peer to;
    int64_t since; /* when it was parked (psagg__now_ms): given up after LOCAL_ACK_GIVE_UP_MS */
    psagg__msg_local m;
};

struct op_slab {
    struct op_slab *next;
    struct fabric_op ops[OP_SLAB];
};

struct fabric_mr {
    struct fabric_mr *next;
    struct fid_mr *mr;
};

struct psagg__fabric {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;

    size_t max_msg;      /* opts->max_msg */
    int post_timeout_ms; /* opts->post_timeout_ms, or POST_RETRY_MS */
    size_t name_len;     /* length of this endpoint's name */
    int addr_str;        /* addresses are strings (FI_ADDR_STR, shm) */
    int local_mr;        /* mr_mode has FI_MR_LOCAL: psagg__fabric_reg registers */
    int mr_endpoint;     /* FI_MR_ENDPOINT: bind regions to the endpoint */
    int mr_prov_key;     /* FI_MR_PROV_KEY: provider picks keys */
    int cq_wait;         /* the CQ has a wait object: poll may block in fi_cq_sread */
    int serialize;       /* no FI_THREAD_SAFE granted: fab_lock around libfabric calls */
    atomic_int woken;    /* psagg__fabric_wake was called: the next poll returns */
    char prov[64];       /* provider name opened */
    psagg__logger log;   /* the owner's (opts->log) */

    pthread_mutex_t fab_lock; /* only used when serialize */
    pthread_mutex_t lock;     /* backlog, free ops, slabs, regions, next_key */

    psagg__fabric_event *backlog; /* ring: completions read by send/post_recv */
    size_t bl_head, bl_count, bl_cap;

    struct fabric_op *free_ops;
    struct op_slab *slabs;
    struct fabric_mr *mrs;
    uint64_t next_key;

    /* same-host copies, all under lock */
    int local_ok; /* the provider can inject a psagg__msg_local; not shm */
    struct {
        uint8_t secret[32]; /* random; its hash is the offer's commitment */
        uint8_t name[PSAGG_FABRIC_NAME_MAX];
    } self; /* what local_self's probe points at */
    struct local_peer *lpeers;
    size_t n_lpeers, lpeers_cap;
    struct local_slot *slots;
    uint32_t slots_cap, slot_free;      /* free list head, UINT32_MAX: none */
    struct local_ack *acks, *acks_tail; /* ACKs waiting for room in the provider's queue */
    struct fabric_op *reposts;          /* receive buffers that held an ACK, to post again */
    atomic_int local_pending;           /* acks or reposts are waiting: poll must not sleep long */
    uint32_t slots_used;                /* same-host sends waiting for their ACK */
    int64_t next_reap_ms;               /* when poll next looks for dead same-host peers */
    atomic_uint_fast64_t local_copied;  /* messages received by same-host copy */
};

static inline void fab_lock(psagg__fabric *f)
{
    if (f->serialize)
        pthread_mutex_lock(&f->fab_lock);
}

static inline void fab_unlock(psagg__fabric *f)
{
    if (f->serialize)
        pthread_mutex_unlock(&f->fab_lock);
}

/* ---- transport.c, for transport_local.c ---- */

/* Take an operation context from the free list (growing it by a slab); NULL if out of memory. */
struct fabric_op *fab_op_get(psagg__fabric *f, void *ctx, int kind);
/* Return an operation context to the free list (_locked: the caller holds f->lock). */
void fab_op_put(psagg__fabric *f, struct fabric_op *op);
void fab_op_put_locked(psagg__fabric *f, struct fabric_op *op);
/* Park n completions for the next poll (PSAGG_ENOMEM, through psagg__fail, without memory). */
int fab_backlog_push(psagg__fabric *f, const psagg__fabric_event *ev, int n);
/*
 * Post one send (OP_SEND), inject (OP_LSEND: sbuf/len are the message, copied at once) or
 * receive, driving progress while the provider answers -FI_EAGAIN; once: give up with
 * PSAGG_EAGAIN at the first -FI_EAGAIN instead of retrying.
 */
int fab_post_op(psagg__fabric *f, struct fabric_op *op, fi_addr_t to, const void *sbuf, void *rbuf,
                size_t len, void *desc, int once);

/* ---- transport_local.c, for transport.c ---- */

/* At open, with this endpoint's name (len bytes): whether this provider can take part, and
 * the name local_self's probe points at. */
void fab_local_init(psagg__fabric *f, const void *name, size_t len);
/* At close: free the same-host tables and parked ACKs. */
void fab_local_close(psagg__fabric *f);
/* Before each read of the CQ: post again the buffers that held ACKs, send parked ACKs. */
void fab_local_flush(psagg__fabric *f);
/* A receive of sizeof(psagg__msg_local) bytes: 1 with *e filled, -1 to deliver it as it is. */
int fab_local_recv(psagg__fabric *f, struct fabric_op *op, fi_addr_t from, psagg__fabric_event *e);
/* Fail the waiting same-host sends whose reader's process is gone (parked for the poll). */
void fab_local_reap(psagg__fabric *f);
/* 1 when sends of len bytes to peer go by same-host copy. */
int fab_local_sends_to(psagg__fabric *f, psagg__peer to, size_t len);
/* Send a DESC of buf to a peer that copies ours; the op waits in a slot for the ACK. */
psagg_status fab_local_send(psagg__fabric *f, psagg__peer to, const void *buf, size_t len,
                            void *ctx, int once);

#endif
