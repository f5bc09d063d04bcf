/*
 * worker.h - libpsagg's private state.
 *
 * Layer: worker (the top, beside server/). The calling threads (api.c) queue operations; one
 * communication thread per context (comm.c) takes them in priority order, has every chunk
 * of a tensor encoded (with its error-feedback residual), pushes each chunk to its owning
 * server within a per-server in-flight window, has the updates decoded as they arrive into
 * the caller's output buffer, and watches the control connections and deadlines so that a
 * dead server or a lost message fails the operation with a message instead of hanging.
 *
 * Files, from the top down (none calls one above it):
 *   broadcast.c  psagg_broadcast: bytes packed into push_pulls of an fp32 tensor
 *   api.c        the public functions of psagg.h: start-up, declaration, push_pull, handles
 *   handshake.c  the control channel's start-up: connect, HELLO/WELCOME, DECLARE/READY
 *   device.c     psagg_push_pull_cuda and the device-buffer operations (owns the device side),
 *                as ordering logic over an executor (devexec.h)
 *   cuda.c       the CUDA runtime as that executor
 *   comm.c       the communication thread: scheduling, encodes, pushes, completion, deadlines
 *   updates.c    an update's arrival: source, MAC, fields, quorum bitmap, decode (comm thread)
 *   control.c    the control connections while the job runs (comm thread): PINGs, the
 *                membership's epochs relayed (its owner's), ABORTs; and requests a caller waits for
 *                (psagg_checkpoint, psagg_sync_membership), one mechanism for both
 *   adapt.c      [codec] adaptive: statistics, their push, the choice of codecs (comm thread)
 *   failover.c   [cluster] server_replicas: a lost server reported, the server views decided
 *                (this worker an acceptor), pushes sent again to a chunk's new owner, servers
 *                out of the view connected again (their return)
 *   hello.c      one HELLO and its WELCOME, checked: at start-up and for a server that rejoins
 *   handle.c     an operation's life: creation, queueing, a push's send to a server,
 *                completion, failing the context (and telling the servers why)
 *   host.c       the host-buffer operations
 * Where a push_pull's buffers live (host or device) is behind psagg__bufops, chosen when
 * push_pull is called, so comm.c never asks.
 */
#ifndef PSAGG_WORKER_H
#define PSAGG_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "base/timeline.h"
#include "kernels/codec.h"
#include "kernels/thc.h"
#include "psagg.h"
#include "runtime/auth.h"
#include "runtime/config.h"
#include "runtime/gate.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/node.h"
#include "runtime/rxpool.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

struct psagg_handle;

/* What a buffer operation returns for "not yet: ask again later" (neither done nor failed). */
#define PSAGG_BUF_PENDING ((psagg_status)1)

/*
 * The buffer operations of one push_pull: how its input is encoded into the push buffers and
 * how the updates reach its output. The communication thread calls them in this order, for
 * one handle at a time; each returns PSAGG_OK (done), PSAGG_BUF_PENDING (not yet: ask again
 * later) or a negative psagg_status with its message set (psagg__fail: psagg_last_error()),
 * which the caller gives the operation or the job.
 *   encode    fill the payload (after the header) of every chunk's push buffer
 *             (ctx->chunks[...].buf) with the encoded input, error feedback included; on a
 *             failure, reset the tensor's residual (part of it was updated)
 *   update    chunk ci's update arrived (header checked; payload_len bytes of payload, in
 *             codec): decode it into the output with `mode` (psagg__decode_op: SET, SCALE
 *             for AVERAGE, ADD for a parameter's weight delta).
 *             Never pending. A failure means the server sent an invalid update: the job fails
 *   complete  every update is in: PSAGG_OK when the output is written, PSAGG_BUF_PENDING
 *             while it is being written. A failure (an invalid update, a failed device) fails
 *             the job, as update's does
 *   drain     (NULL when nothing runs asynchronously) h is about to complete with a failure:
 *             return once none of its work is queued, so that its owner may free the buffers
 *             as soon as it sees the failure. The worker calls it on every path that fails a
 *             submitted handle (handle.c, comm.c); an operation's own enqueue functions drain
 *             before they return a failure
 */
typedef struct psagg__bufops {
    const char *kind; /* "host", "cuda" */
    psagg_status (*encode)(psagg_ctx *ctx, struct psagg_handle *h);
    psagg_status (*update)(psagg_ctx *ctx, struct psagg_handle *h, const psagg__chunk_info *ci,
                           const psagg_codec *codec, int mode, const uint8_t *payload,
                           size_t payload_len);
    psagg_status (*complete)(psagg_ctx *ctx, struct psagg_handle *h);
    void (*drain)(psagg_ctx *ctx, struct psagg_handle *h);
    /* [server] quorum: chunk ci's round closed without this worker's push: add the push back
       into what the next encode adds (the residual, else a carry); NULL: not supported */
    psagg_status (*carry)(psagg_ctx *ctx, struct psagg_handle *h, const psagg__chunk_info *ci);
} psagg__bufops;

extern const psagg__bufops psagg__host_ops; /* host.c */

/*
 * A request a calling thread makes of the servers and waits for (control.c: psagg_checkpoint,
 * psagg_sync_membership's barrier). Guarded by ctx->mu.
 */
typedef struct ctl_request {
    int state;                       /* 1 asked (the comm thread sends it), 2 sent; 0 idle */
    int left;                        /* answers yet to come */
    uint8_t from[PSAGG_MAX_SERVERS]; /* per server: its answer is awaited (comm thread only) */
    uint8_t skip[PSAGG_MAX_SERVERS]; /* per server: answers still to come to requests that timed
                                        out, which come first (comm thread only) */
    psagg_status status;             /* the first failure among them */
    char msg[300];
    uint8_t body[16]; /* what the request carries, if anything (psagg_checkpoint's phase) */
    uint32_t body_len;
} ctl_request;

/* [server] quorum: an update that came before this worker's push of its round (wire.h),
   kept in ctx->early until that push is encoded (updates.c, comm.c). */
struct early_update {
    psagg__msg_codec mc; /* as psagg__msg_check read it */
    uint8_t msg[];       /* the checked message: header, payload, bitmap (and MAC) */
};

typedef struct server_conn {
    int fd;
    psagg__peer addr;         /* its fabric address: updates are accepted only from here */
    psagg__data_rx rx;        /* its updates' key and the numbers accepted (data_auth) */
    psagg__data_key push_key; /* of this worker's pushes to it (data_auth; runtime/auth.h) */
    uint64_t push_seq;        /* the number of the last push sealed for it (comm thread) */
    psagg__ctl_auth auth;     /* its control connection's frames, both ways (with a secret) */
    int local_reads;          /* this worker copies its updates out of its memory (wire.h) */
    /*
     * Pushes handed to libfabric whose send has not completed (comm thread only). The window
     * is released by the send completion, not by the update: an update needs every worker's
     * push of its chunk, so a window released by updates lets workers that took operations in
     * different orders fill a server's window with different chunks and wait on each other.
     */
    int inflight;
    int64_t heard_at; /* when its control connection last had something (comm thread) */
    /* [cluster] server_replicas: why it was given up during the start-up (handshake.c), until
       that loss is reported once the job runs; "" when it was not */
    char lost_at_start[320];
} server_conn;

/* A push buffer (header + encoded payload), registered once. */
typedef struct push_buf {
    uint8_t *buf;
    void *desc;
    int send_pending; /* comm thread only: 1 a send in flight, 2 one waiting for a copy's window */
    uint32_t to;      /* the server its pending send goes to (its window) */
    /* a parameter chunk's push with server replicas: the servers it went to, as bits of their
       offset on the ring from the chunk's layout owner (failover.c: its owner, then its
       copies, one after the other) */
    uint64_t sent_to;
    uint8_t gen; /* its send generation (push_ctx): one more each time a send is abandoned */
} push_buf;
_Static_assert(_Alignof(push_buf) >= 8, "push_buf: three low bits free in its address");

/*
 * A push's send context: its buffer's address with the buffer's send generation in the three
 * low bits. A send to a server lost meanwhile is abandoned (failover.c: the buffer is no longer
 * held for it, since a stopped or cut-off peer may never take it); its completion, if it ever
 * comes, has an old generation and is dropped (push_of: *stale), not taken for a later send's.
 */
static inline void *push_ctx(push_buf *pb)
{
    return (void *)((uintptr_t)pb | (pb->gen & 7u));
}
static inline push_buf *push_of(void *c, int *stale)
{
    push_buf *pb = (push_buf *)((uintptr_t)c & ~(uintptr_t)7);
    *stale = pb && ((uintptr_t)c & 7u) != (pb->gen & 7u);
    return pb;
}

/*
 * Per chunk: its push buffers. One, unless the job keeps pushes ([cluster] server_replicas):
 * then two, by the round's parity, so that a push of round r stays whole while round r + 1 is
 * encoded, until round r + 1's update proves that every worker has round r's (a server that
 * takes the chunk over sums them again; docs/design.md). chunk_push gives a round's.
 */
typedef struct chunk_buf {
    push_buf p[2];
} chunk_buf;
_Static_assert(sizeof(chunk_buf) == 2 * sizeof(push_buf), "chunk_buf: push buffers, no padding");

static inline push_buf *chunk_push(psagg_ctx *ctx, uint32_t chunk, uint32_t round);

typedef struct tensor_state {
    float *residual;  /* worker error feedback (host buffers), or NULL; thc: always, in rotated
                         coordinates (chunk c's at its offset, psagg__thc_rotated_len long) */
    float ef_beta;    /* the residual's decay before each encode (1: classic error feedback) */
    float *thc_peak;  /* thc: each block's peak P_m in the update applied last (chunk c's from
                         its offset / the block), whose NEXT SCALE the next push takes at its
                         own bits (thc_scales); else NULL */
    float *thc_scale; /* thc: the scales of the push being encoded, from thc_peak */
    float *carry;     /* [server] quorum, no residual: pushes left out of their round, or NULL */
    int carry_live;   /* carry holds some: the next encode adds it, then clears it */
    uint32_t round;   /* round of the next push_pull */
    uint32_t pulls;   /* a parameter's INIT and PULL, which count a round with server replicas
                         (psagg_get_tensor_round says round - pulls: the optimizer's step) */
    struct psagg_handle *op; /* the push_pull in flight, or NULL */
    int inited;              /* a parameter's psagg_param_init completed */
    float lr, weight_decay;  /* psagg_set_lr (guarded by ctx->mu) */
    uint32_t tag;            /* psagg_set_param_sync (guarded by ctx->mu) */
    float weight;
} tensor_state;

struct psagg_handle {
    psagg_ctx *ctx;
    struct psagg_handle *next; /* in the submit queue */
    const psagg__bufops *ops;  /* where in and out live */
    uint32_t key;
    const float *in;
    float *out;
    psagg_reduce op;
    int priority;
    uint64_t seq;
    uint32_t round;
    uint32_t step;        /* round less the tensor's pulls (tensor_state): the encode's RNG round */
    psagg_codec codec;    /* this round's codec: the declared one, or its assignment's */
    psagg__msg_param prm; /* a parameter's push trailer: kind, lr, weight decay, flags */
    uint32_t reply_round; /* INIT: the chunks' round the WEIGHTS said (reply_set: one came) */
    int reply_set;
    uint32_t gen; /* that assignment's generation (0: declared) */
    /* psagg_broadcast's root, whose push every round must hold ([server] quorum: an update
       whose bitmap lacks it fails the job); -1 for any other operation */
    int need_rank;
    int encoded;        /* all chunks encoded (comm thread) */
    int completing;     /* all updates in; ops->complete is writing out (comm thread) */
    uint32_t next_send; /* next chunk to push (comm thread) */
    uint32_t done_chunks;
    uint8_t *chunk_done;
    float *chunk_scale; /* AVERAGE: per chunk, 1 / the workers its update summed */
    int64_t deadline_ms;
    /* psagg__now_ns() at each phase's end (psagg_timing): the call, taken by the comm thread,
       encoded, last push handed over, last update in, completed (comm thread, then read-only) */
    int64_t t_submit, t_taken, t_encoded, t_sent, t_updates, t_done;
    uint64_t update_ns; /* in the buffer operations' update for all but the last update */
    int submitted; /* handle_submit queued it (guarded by ctx->mu): before, its creator owns it */
    int done;      /* guarded by ctx->mu */
    int status;
    char msg[256];
};

struct psagg_ctx {
    psagg__config cfg;
    int rank, world;
    /* log, job_key, nonce, tag_bytes, max_msg, fab, source_reliable (runtime/node.h:
       psagg_init opens it) */
    PSAGG_NODE_EMBED;
    server_conn *servers;
    int declared;
    psagg__layout layout;
    tensor_state *tensors;
    chunk_buf *chunks;
    psagg__rxpool rx; /* posted receive buffers for updates */

    pthread_t comm_tid;
    atomic_int running;
    atomic_int comm_idle;       /* the comm thread may sleep in its poll: wake it (comm.c) */
    atomic_int told_servers;    /* the servers heard why this worker failed (ABORT, once) */
    pthread_mutex_t mu;         /* queue, handle completion, failure state */
    pthread_cond_t cv;          /* a handle completed or the queue changed */
    struct psagg_handle *queue; /* submitted, not yet taken by the comm thread */
    uint64_t next_seq;
    int failed;  /* the job failed: every later call returns failed_status */
    int aborted; /* psagg_abort: failed_status PSAGG_ECLOSED, and the servers are told why */
    psagg_status failed_status;
    char failed_msg[256];

    atomic_uint_fast64_t bytes_sent, bytes_received, bytes_raw, push_pulls;
    /* sums of the completed operations' psagg_timing, in its order (queued_ns ... total_ns) */
    atomic_uint_fast64_t time_ns[6];
    psagg__timeline *timeline; /* [log] timeline, or NULL */

    uint32_t n_user;     /* tensors the user declared (keys below; then internal ones) */
    int keep_pushes;     /* two push buffers per chunk (chunk_buf): server_replicas */
    int server_residual; /* the servers keep a residual (WELCOME): with replicas, every chunk
                            has copies (failover.c) */
    uint32_t *owner;     /* per chunk: the server it is pushed to (chunk_owner; the
                            layout's, until a server view moves it; comm thread) */
    struct psagg__failover *failover; /* [cluster] server_replicas (failover.c), or NULL */
    psagg__ctl_optim optim;           /* the servers' [server] optimizer settings (WELCOME) */
    ctl_request ckpt;                 /* psagg_checkpoint's (control.c) */
    struct psagg__adapt *adapt;       /* [codec] adaptive (adapt.c), or NULL */
    /* the membership (guarded by mu; changed by the comm thread on the owner's MEMBERSHIP):
       every worker rank lives unless [cluster] elastic */
    uint32_t epoch;
    int n_live;
    uint8_t *live; /* world entries */
    /* joins (elastic): this worker joined the running job (its WELCOMEs said so; its
       psagg_param_init pulls the servers' weights); psagg_sync_membership's barrier
       (control.c), the barriers passed and the workers the last one admitted (guarded by mu) */
    int joiner;
    int welcomed; /* the server whose WELCOME said what the job runs, + 1 (0: none yet; hello.c) */
    ctl_request barrier;
    int barrier_to; /* the server its SYNC went to (with replicas a later owner is sent it again) */
    uint32_t sync_seq;
    uint32_t sync_joined;

    /* [server] quorum (the servers' WELCOMEs say so): an update that comes before this
       worker's push of its round waits in early[chunk] (comm thread; wire.h). With a quorum
       or copies that follow (below) each update ends with its contributor bitmap of
       bitmap_bytes, else 0 */
    int quorum;
    size_t bitmap_bytes;
    /* copies that follow their owner (server replicas with a quorum or elastic workers:
       WELCOME flag FOLLOW): each push ends with the bitmap of its chunk's round before, as
       this worker applied it (handle.c's push_send; wire.h), else 0, and goes to the chunk's
       copies before its owner. Per chunk with copies x round parity: the round of the update
       whose bitmap (follow_bytes each) is kept for it, or UINT32_MAX (failover.c keeps them) */
    size_t follow_bytes;
    uint32_t *follow_round;
    uint8_t *follow_bits;
    struct early_update **early;
    atomic_uint_fast64_t left_out; /* chunk rounds that closed without this worker's push */

    /* the device side (device.c), created by the first psagg_push_pull_cuda, on devexec
       (devexec.h; NULL: CUDA's) */
    const struct psagg__devexec *devexec;
    void *device;
    void (*device_destroy)(psagg_ctx *ctx);
};

/* The residual elements of chunk ci of tensor ti, from ci->offset on: its count, or thc's
   rotated coordinates; and of the whole tensor (the last chunk's end). */
static inline size_t chunk_residual_elems(const psagg__tensor_info *ti, const psagg__chunk_info *ci)
{
    return ti->codec.id == PSAGG_CODEC_THC ? psagg__thc_rotated_len(ci->count, ti->codec.bucket)
                                           : ci->count;
}

static inline size_t tensor_residual_elems(const psagg__layout *l, const psagg__tensor_info *ti)
{
    const psagg__chunk_info *last = &l->chunks[ti->first_chunk + ti->n_chunks - 1];
    return last->offset + chunk_residual_elems(ti, last);
}

/* thc's rotation of chunk ci: the same on every worker and round (kernels/thc.h) */
static inline psagg__rng_key thc_rotation(const psagg_ctx *ctx, const psagg__chunk_info *ci)
{
    return psagg__rng_chunk_key(ctx->cfg.seed, PSAGG_RNG_ROTATE, 0, ci->key, ci->index, 0);
}

/* thc: the scales of tensor ti's next push, of `bits` (the push's codec: with [codec]
   adaptive it may differ from the last update's), from the peaks that update set: thc.h's
   NEXT SCALE, every worker alike. */
static inline void thc_scales(const psagg__layout *l, const psagg__tensor_info *ti,
                              tensor_state *ts, uint32_t bits)
{
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &l->chunks[ti->first_chunk + c];
        size_t m0 = ci->offset / ti->codec.bucket;
        for (size_t m = 0, nb = psagg__thc_blocks(ci->count, ti->codec.bucket); m < nb; m++)
            ts->thc_scale[m0 + m] = psagg__thc_next_scale(bits, ts->thc_peak[m0 + m]);
    }
}

/* The server that owns chunk g now: its pushes go there, its updates come from there. */
static inline uint32_t chunk_owner(const psagg_ctx *ctx, uint32_t g)
{
    return ctx->owner[g];
}

static inline push_buf *chunk_push(psagg_ctx *ctx, uint32_t chunk, uint32_t round)
{
    return &ctx->chunks[chunk].p[ctx->keep_pushes ? round & 1 : 0];
}

/*
 * handle.c: send push pb to server s (its window checked by the caller): sealed for s alone,
 * with the view's epoch. PSAGG_OK: the send is pending (pb->send_pending 1, counted in s's
 * window and bytes_sent); PSAGG_EAGAIN: the provider's queue is full, nothing sent; else the
 * send failed. pb->to is s either way.
 */
psagg_status push_send(psagg_ctx *ctx, push_buf *pb, uint32_t s);

/*
 * handle.c. handle_new checks a push_pull's arguments and claims the tensor's in-flight slot;
 * handle_submit queues it for the communication thread (or, when the job has failed
 * meanwhile, drains and completes it); handle_abandon gives the slot back (never queued, none
 * of its work queued). Until handle_submit the creating thread owns the handle: a failure of
 * the job leaves it alone.
 */
struct psagg_handle *handle_new(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                                psagg_reduce op, int priority, const psagg__bufops *ops,
                                psagg_status *st);
/* handle_new for a parameter's INIT or PULL (kind, flags of the trailer). */
struct psagg_handle *handle_new_param(psagg_ctx *ctx, uint32_t key, float *out, uint32_t kind,
                                      uint32_t flags, psagg_status *st);
void handle_submit(psagg_ctx *ctx, struct psagg_handle *h);
void handle_abandon(psagg_ctx *ctx, struct psagg_handle *h);
/* Complete a handle with a status (under ctx->mu) and wake waiters; a failure drains it
 * first (psagg__bufops.drain). */
void handle_complete_locked(psagg_ctx *ctx, struct psagg_handle *h, psagg_status status,
                            const char *msg);
/* Fail the whole context: every pending and later operation gets this status and message
 * (on the communication thread the servers are told why first: worker_tell_servers). */
void worker_fail_all(psagg_ctx *ctx, psagg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int worker_failed(psagg_ctx *ctx);
/* This worker failed: an ABORT with the cause to every server it is connected to, once (the
 * communication thread). */
void worker_tell_servers(psagg_ctx *ctx);
/* The phases of a completed operation (its t_* times). */
void handle_timing(const struct psagg_handle *h, psagg_timing *out);
/* The context's counters of completed operations (psagg_get_stats; comm.c's stats line). */
void worker_stats(const psagg_ctx *ctx, psagg_stats *out);
/* handle.c: psagg.h's struct_size rule: `got` must be the size of struct `type` this library
 * knows (`known`); PSAGG_EINVAL naming the struct otherwise (the caller adds its name). */
psagg_status worker_struct_size(const char *type, size_t got, size_t known);

/*
 * handshake.c, on the caller's thread before the communication thread starts (api.c):
 * handshake_connect opens the control connection to every server by `deadline` (first the
 * server handshake_first names, whose connection tells the local address); handshake_hello
 * says HELLO to each in turn and checks its WELCOME (its rank, data_auth, provider and
 * optimizer; its fabric address, data key and same-host copies go into ctx->servers),
 * connecting again to a server that closed the connection unanswered; handshake_declare sends
 * the declaration `d` (`bytes` long) to every server and waits for each READY (a server's ERROR
 * frame wins over a lost connection as the reason). With [cluster] server_replicas >= 1 a
 * server that cannot be reached or fails before its READY is tried again until the deadline
 * and then given up (servers[s].lost_at_start) instead of failing the start-up;
 * handshake_report_lost reports those losses once the job runs (-1: that failed the job).
 */
psagg_status handshake_connect(psagg_ctx *ctx, int64_t deadline);
int handshake_first(const psagg_ctx *ctx);
psagg_status handshake_hello(psagg_ctx *ctx, int64_t deadline);
psagg_status handshake_declare(psagg_ctx *ctx, psagg__ctl_declare *d, size_t bytes);
int handshake_report_lost(psagg_ctx *ctx);

/*
 * hello.c: hello_exchange reads server s's CHALLENGE, says HELLO and checks its WELCOME against
 * the first one taken (`kind`: HELLO_START a server's first at start-up; HELLO_AGAIN a server
 * lost during the start-up that answers again, no same-host copies; HELLO_REJOIN the job runs
 * and server s comes back into it, no same-host copies); hello_declare does it on a new
 * connection and sends the server the declaration (handshake.c: a server greeted late during
 * the start-up; failover.c, on the communication thread: a lost server that rejoins); its
 * READY comes on the control connection. hello_transient says whether a failure of either may
 * go away (try again later: the server is not up or not answering yet, or the process on its
 * port is not the server); any other (a refusal, another configuration) is final. hello_peer
 * names server s as every message about it does: "server 1 (host:port)".
 */
enum hello_kind { HELLO_START, HELLO_AGAIN, HELLO_REJOIN };
int hello_transient(psagg_status st);
void hello_peer(const psagg_ctx *ctx, int s, char *buf, size_t len);
psagg_status hello_exchange(psagg_ctx *ctx, int s, int64_t deadline, const char *peer,
                            enum hello_kind kind);
psagg_status hello_declare(psagg_ctx *ctx, int s, psagg__ctl_declare *d, size_t bytes,
                           int64_t deadline, enum hello_kind kind);

/*
 * device.c: use executor ex (devexec.h) for ctx's device path instead of CUDA's; before the
 * first psagg_push_pull_cuda. For the tests (psagg_static: the simulated device); not in psagg.h.
 */
psagg_status psagg__device_use(psagg_ctx *ctx, const struct psagg__devexec *ex);

/* comm.c */
psagg_status comm_start(psagg_ctx *ctx);
void comm_stop(psagg_ctx *ctx);

/*
 * updates.c (the communication thread): gate fills the gate that checks who sent an update
 * (runtime/gate.h); arrived checks one received update and applies it (or keeps it early):
 * the operation whose last update it was, to complete, or NULL (also when the job failed);
 * apply hands a checked update to operation h's buffer operations: 1 when it was h's last;
 * server_at is the server whose fabric address is addr (owner: the context), or -1.
 */
void updates_gate(psagg_ctx *ctx, psagg__gate *gate);
int updates_server_at(const void *owner, psagg__peer addr);
struct psagg_handle *update_arrived(psagg_ctx *ctx, psagg__gate *gate, const psagg__rxbuf *rb,
                                    psagg__peer src);
int update_apply(psagg_ctx *ctx, struct psagg_handle *h, const uint8_t *msg,
                 const psagg__msg_codec *mc);

/*
 * control.c. request (a calling thread): with no operation in flight, have the communication
 * thread send rq (carrying `body`, if any) and wait for its `answers` (within 2 x op_timeout_ms:
 * PSAGG_ETIMEDOUT), the first failure among them naming its server; requests_send (the
 * communication thread) sends what was asked. check (every 20 ms): PING the servers, read their
 * frames (answers, epochs, ABORTs), fail on silence. tell_servers: this worker failed, an ABORT
 * saying why to each.
 */
psagg_status control_request(psagg_ctx *ctx, ctl_request *rq, const char *fn, int answers,
                             const void *body, uint32_t body_len);
void control_requests_send(psagg_ctx *ctx);
void control_check(psagg_ctx *ctx, int64_t now, int64_t *next_ping);
/* Server 0's MEMBERSHIP frame: check it, take its epoch and relay it unchanged to the other
 * servers (a joiner: the epoch that admits it, whatever its number). */
psagg_status membership_take(psagg_ctx *ctx, int from, const psagg__ctl_hdr *h, const void *body,
                             int joining);

/*
 * failover.c ([cluster] server_replicas; the communication thread but setup and free):
 * setup keeps the declaration (for a server that rejoins); server_lost says server s is lost
 * (1: handled, the job goes on; 0: not such a job, the caller fails it); agree takes an AGREE
 * frame from server s, back a SERVER_BACK (the coordinator's hold), state a STATE frame (relayed:
 * chunk state for a server that comes back), ready a server's READY (1: one that rejoins,
 * taken); tick connects again to the servers out of the view (control_check's
 * turn); resend pushes again what a moved chunk's new owner needs (1 while some wait);
 * stale_update says whether an update is one to drop (a round this worker applied already
 * after a view moved its chunk, or the old owner's); held whether chunk g's pushes wait for
 * the next view; lost whether server s is lost or out of the view; waits_ready whether this
 * worker waits for server s's READY (its silence is then no loss).
 * A parameter chunk's push goes to its owner, then to its copies, one send after the other
 * (each sealed for its server); where copies follow their owner (wire.h), to its copies first
 * and its owner last: first says where its first send goes, pushed records that pb (of chunk
 * g) went to g's owner, copy sends pb on once its send before is done (push_sent),
 * send_copies sends those that waited for room (1 while some wait).
 * keep_update keeps the update (msg, len bytes: header, payload, quorum bitmap) of a round of
 * chunk g this worker applied, a sum chunk's (its last two, by round parity): should its owner
 * be lost after sending it to some workers only, the view names a worker that has it to relay
 * it to the chunk's new owner (STATE RELAY), which sends every worker those bytes.
 * The end: finish (psagg_close, before the communication thread stops) has tick send DONE to
 * every server of the view and waits until one answers DONE (done takes it: 1) or the job
 * fails; meanwhile this worker keeps its last pushes and takes part in views.
 */
psagg_status failover_setup(psagg_ctx *ctx, const psagg__ctl_declare *d, size_t bytes);
void failover_free(psagg_ctx *ctx);
int failover_server_lost(psagg_ctx *ctx, int s, const char *why);
void failover_agree(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body);
void failover_back(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body);
void failover_state(psagg_ctx *ctx, int s, const psagg__ctl_hdr *h, const void *body);
int failover_ready(psagg_ctx *ctx, int s);
void failover_tick(psagg_ctx *ctx, int64_t now);
int failover_resend(psagg_ctx *ctx);
void failover_pushed(psagg_ctx *ctx, push_buf *pb, uint32_t g);
/* The server pb's push of chunk g goes to first (its first copy where copies follow, else its
   owner), recorded as pushed: the other sends follow its completion (failover_copy). */
uint32_t failover_first(psagg_ctx *ctx, push_buf *pb, uint32_t g);
void failover_copy(psagg_ctx *ctx, push_buf *pb);
int failover_send_copies(psagg_ctx *ctx);
int failover_stale_update(psagg_ctx *ctx, const psagg__msg_hdr *mh, int from);
void failover_keep_update(psagg_ctx *ctx, uint32_t g, const uint8_t *msg, size_t len);
int failover_held(const psagg_ctx *ctx, uint32_t g);
int failover_lost(const psagg_ctx *ctx, int s);
/* Whether a server lost here is still in the view: the next view is being decided. */
int failover_deciding(const psagg_ctx *ctx);
int failover_waits_ready(const psagg_ctx *ctx, int s);
/* The lowest server of the view this worker applied (0 before any view): the coordinator,
   which also decides the membership of an elastic job (server/membership.c). */
int failover_coordinator(const psagg_ctx *ctx);
void failover_finish(psagg_ctx *ctx);
int failover_done(psagg_ctx *ctx, int s);

/*
 * adapt.c: adaptive codecs (runtime/adaptive.h has the schedule and the model). adapt_setup
 * at declaration (after the layout: tensors' candidates and bytes; the budget checked);
 * the communication thread calls adapt_codec before encoding a round (1: h->codec and h->gen
 * are set; 0: its assignment is not there yet; < 0 failed, msg says why), adapt_measure
 * after (a statistics round: take its ranges; once every tensor's are in, queue their push)
 * and adapt_stats_done when that push completes (it hands the sum to adapt.c's solver
 * thread, which publishes the next generation).
 * adapt_waiting explains an operation that waits for its assignment (for the deadline).
 * Joins (wire.h, SYNC): adapt_settled (the communication thread) says whether every statistics
 * push is summed and solved, as a barrier's SYNC must wait for; adapt_sync_size the bytes of
 * the assignments a SYNC carries (and its fields adapt_gens, adapt_tensors); adapt_sync_write
 * writes them (under ctx->mu); adapt_join takes the members' on a joiner, once its tensors
 * have the members' rounds (PSAGG_EPROTO when they do not check out).
 */
psagg_status adapt_setup(psagg_ctx *ctx);
void adapt_free(psagg_ctx *ctx);
int adapt_codec(psagg_ctx *ctx, struct psagg_handle *h, char *msg, size_t len);
void adapt_measure(psagg_ctx *ctx, const struct psagg_handle *h);
int adapt_is_stats(const psagg_ctx *ctx, const struct psagg_handle *h);
void adapt_stats_done(psagg_ctx *ctx, struct psagg_handle *h, psagg_status status, const char *msg);
int adapt_waiting(psagg_ctx *ctx, const struct psagg_handle *h, char *msg, size_t len);
int adapt_settled(const psagg_ctx *ctx);
size_t adapt_sync_size(const psagg_ctx *ctx, uint32_t *gens, uint32_t *tensors);
void adapt_sync_write(const psagg_ctx *ctx, uint8_t *out);
psagg_status adapt_join(psagg_ctx *ctx, const uint8_t *in, uint32_t gens, uint32_t tensors);

#endif
