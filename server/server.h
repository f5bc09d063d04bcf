/*
 * server.h - psagg-server's state. One process serves one job: it accepts the job's workers
 * on its control port, agrees on the tensor declarations, aggregates the chunks it owns
 * (runtime/layout.h) round after round, and exits when every worker has said BYE.
 *
 * Layer: server (the top, beside worker/). Files, from the top down:
 *   main.c       the command line; sets libfabric's environment before anything starts
 *   server.c     server_run: start the node (runtime/node.h: keys, endpoint; server_open),
 *                open the port, run the control loop, tear down (server_close)
 *   control.c    the control loop (main thread), a dispatcher: polls every socket, hands
 *                each worker frame to its component (its table of routes), runs the phases
 *                (start-up, running, aborted) and decides what a lost worker means
 *   startup.c    a job's start: DECLAREs compared, the layout, the pool and the data path
 *                started, READY; a joiner's declaration checked (control thread)
 *   checkpoint.c checkpoints as workers ask for them (every member at once, with a round
 *                policy that asks so), written after a barrier of the pool (control thread)
 *   membership.c elastic jobs: who is a member, epochs decided by one server, the owner
 *                (control thread)
 *   failover.c   servers that fail ([cluster] server_replicas): a lost server's chunks taken
 *                over in a view the workers decide (control thread)
 *   admission.c  connections that have not authenticated: HELLO checks, WELCOME, idle and
 *                slow-connection limits (the control thread, during start-up)
 *   progress.c   the data path's progress thread, the endpoint's one user: receive pushes,
 *                check them, route each to its chunk's aggregation thread; send the updates
 *                and repost the buffers the aggregation threads queue to it; completions
 *   quorum.c     round policies: when a round closes and whose pushes it sums (every
 *                member; [server] quorum and grace_ms)
 *   aggregate.c  per-chunk rounds and the aggregation thread pool
 *   integer.c    chunks in the thc codec: their pushes added as integers (kernels/thc.h)
 *   param.c      parameter chunks ([server] optimizer): the optimizer's rounds, their state
 *   ckpt_file.c  the checkpoint file: its format, written from param.c's state, read back
 *   gpu.c        the optional GPU assist of the aggregation threads
 *   job.c        what all of them share: the job's outcome, requests to close a peer, who is
 *                at which address; the control thread's closing of a worker and verdicts
 *   arena.c      the aggregation threads' jemalloc arenas
 *   metrics.c    counters of all of them, the straggler report, the Prometheus endpoint, the
 *                resource usage per round
 * No file calls one above it in this list, except through the queue of aggregate.c, a chunk's
 * operations tables (param.c sums through aggregate.c's cpu_sum_ops) and the round policy
 * (aggregate.c asks quorum.c's tables).
 */
#ifndef PSAGG_SERVER_H
#define PSAGG_SERVER_H

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/resource.h>

#include "base/log.h"
#include "base/timeline.h"
#include "kernels/codec.h"
#include "kernels/optim.h"
#include "runtime/auth.h"
#include "runtime/config.h"
#include "runtime/channel.h"
#include "runtime/gate.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/node.h"
#include "runtime/rxpool.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

enum worker_state { W_NONE = 0, W_HELLO, W_DECLARED, W_BYE, W_DEAD };

typedef struct worker_conn {
    int fd; /* non-blocking, once authenticated */
    enum worker_state state;
    psagg__ctl_reader rd; /* the frame being read */
    psagg__peer addr;     /* its fabric address: pushes are accepted only from here */
    psagg__data_rx rx;    /* its pushes' key and the numbers accepted (data_auth; runtime/auth.h) */
    psagg__ctl_auth auth; /* its control frames' tags, both ways (with a secret) */
    psagg__ctl_declare decl_hdr;
    psagg__ctl_tensor *decl;
    char bad_reason[200];    /* set by data-path threads: close this peer (guarded by job.mu) */
    psagg_status bad_status; /* what it is told then: EPROTO, or ETIMEDOUT (server_evict_worker) */
    /* closed (server_drop_worker): why, and whether the control loop has yet to settle what
       the loss means for the job (control.c) */
    char why_lost[256];
    int lost;
    psagg_status lost_status;
    int64_t heard_at; /* when its last bytes came (liveness, runtime/channel.h) */
    /* elastic joins (membership.c; the control thread's): */
    int joining;       /* connected to a running job, not yet a member (its JOIN admits it) */
    int join_asked;    /* the membership's owner: its JOIN came (declared on every server) */
    uint32_t sync_seq; /* the owner: the last barrier it sent SYNC for */
    int in_barrier;    /* the owner: waiting in the admitting barrier */
    int view_admit;    /* the owner, with server replicas: a view is to admit it at that barrier */
} worker_conn;

#define PENDING_MAX 64 /* unauthenticated connections kept at a time (admission.c) */

struct chunk_state;
struct recv_buf;
struct server;
struct chunk_ops;
struct chunk_sum_ops;

/*
 * An entry of an aggregation thread's queue. It is embedded where it belongs (a receive
 * buffer is queued at most once at a time; a chunk has one retry entry), so queueing a
 * message allocates nothing.
 */
typedef struct agg_item {
    struct agg_item *next;
    struct recv_buf *rb; /* a push to fold in, or NULL: retry a deferred chunk ... */
    struct chunk_state *chunk;
    int move;       /* ... or (failover.c: a server view) AGG_OWN or AGG_GIVE_UP the chunk */
    uint32_t round; /* AGG_OWN: the round it starts at here; AGG_RELAY: the update's */
    uint32_t epoch; /* the view's */
    /* AGG_OWN: its rounds before relay_end come relayed (the view's move), or, a chunk with
       copies under a quorum, its copy follows those before follow_end; AGG_RELAY: len bytes of
       the update in `bytes` (malloc'd), 0: none */
    uint32_t relay_end, follow_end, len;
    uint8_t *bytes;
} agg_item;
/* AGG_COPY: run its rounds as a copy; AGG_RELAY: a relayed round's update (STATE RELAY) */
enum { AGG_OWN = 1, AGG_GIVE_UP = 2, AGG_COPY = 3, AGG_RELAY = 4 };

/* A posted receive buffer (an element of srv->rxpool): header + largest chunk payload. */
typedef struct recv_buf {
    psagg__rxbuf rx; /* first: the completion's context */
    agg_item item;
    psagg__msg_codec mc; /* the push's codec, as the progress thread checked it */
    int from;            /* its sender, while it waits for its epoch (progress.c) */
    int64_t parked_at;   /* parked (progress.c): when it began to wait for its epoch */
    int spilled;         /* 1: a heap copy of a push that waits ahead (wait_ahead), not one of
                            the pool's: freed, not posted again */
    struct recv_buf *spill_prev, *spill_next; /* (spilled: the pool's list of them) */
} recv_buf;

/*
 * An update to send: the context of its sends' completions, and its place in the progress
 * thread's send queue (progress.c), where the aggregation thread that finished the round
 * puts it: only the progress thread calls into the endpoint.
 */
typedef struct send_ctx {
    struct chunk_state *chunk;
    int parity;
    int next_worker; /* the next worker to send it to (a full provider queue stops midway) */
    uint8_t *to;     /* per worker: 1 if it gets this update (the members when it was made) */
    struct send_ctx *next;
} send_ctx;

/*
 * A parameter chunk's optimizer state (param.c). The arrays come from the aggregation
 * thread's arena; w is the master weights, view the weights every worker holds (they apply
 * the same updates), m1 and m2 the optimizer's state (psagg__optim_state_arrays of them).
 */
typedef struct param_state {
    float *w, *view, *m1, *m2;
    uint64_t step;        /* optimizer steps taken (Adam's t of the last one) */
    int awaiting_init;    /* no INIT round yet: GRAD and PULL pushes are refused */
    int every_op_counts;  /* [cluster] server_replicas: INIT and PULL count a round too */
    int restored;         /* w, view, m1, m2 and step came from a checkpoint */
    psagg__msg_param prm; /* the trailer of this round's pushes (the first's: check_codec) */
    float *weight;        /* per worker: the weight of its GRAD push this round */
} param_state;

/*
 * One owned chunk. Only its aggregation thread touches it, except sends_pending. What kind of
 * chunk it is lives in its two operations tables (below), chosen once: `ops` what a round does,
 * `sum` how the round's pushes are summed.
 */
typedef struct chunk_state {
    const psagg__chunk_info *info;
    psagg_codec codec; /* this round's: the declared one, or (adaptive) its first push's */
    size_t enc;        /* this round's payload bytes in it */
    int codec_set;     /* a push of this round set codec */
    uint32_t codec_by; /* the worker whose push did */
    uint32_t thread;
    uint32_t round;         /* the round being collected */
    int64_t round_deadline; /* 0, or when its first push arrived + op_timeout_ms */
    int evicted;            /* its deadline passed once: the missing given up (elastic) */
    uint32_t n_arrived;     /* contributions received this round */
    uint32_t next;          /* next worker to fold into acc (fixed order 0..N-1) */
    uint32_t folded;        /* pushes folded into acc this round (the first writes it) */
    uint8_t *arrived;       /* per worker */
    uint8_t *slots;         /* per worker (cap_bytes each): payload copied here to wait ... */
    struct recv_buf **held; /* ... or its receive buffer held until then (handle_push) */
    int broken;             /* a bad payload was half folded in: the job is failing */
    float *acc;
    float *residual; /* server error feedback, or NULL */
    uint8_t *out[2]; /* header + encoded update, alternating by round parity */
    void *out_desc[2];
    atomic_int sends_pending[2];
    atomic_int deferred;     /* round complete, waiting for out[parity] to be free */
    atomic_int retry_queued; /* `retry` is in the thread's queue */
    agg_item retry;
    const struct chunk_ops *ops;     /* its round's kind: sum_chunk_ops, param_chunk_ops,
                                        thc_chunk_ops */
    const struct chunk_sum_ops *sum; /* how it sums: cpu_sum_ops, gpu_sum_ops, thc_sum_ops */
    send_ctx sctx[2];
    param_state *param;    /* param_chunk_ops' state (param.c), else NULL */
    struct thc_state *thc; /* thc_chunk_ops' state (integer.c), else NULL */
    size_t out_cap;        /* payload bytes out[] holds: cap_bytes, or a parameter's fp32 */
    /* the round policy's (quorum.c; [server] quorum, straggler tolerance): */
    int64_t close_at_ms;   /* 0, or when the round closes without the workers still missing */
    int closing;           /* it closes now: the missing members are passed over */
    uint32_t *seen;        /* per worker: 1 + the newest round of its that came (on time or late) */
    int64_t first_push_ns; /* when this round's first push came (lateness, metrics.c) */
    int64_t last_push_ns;  /* and its last (the timeline) */
    uint32_t first_worker, last_worker;
    int standby; /* held for a takeover ([cluster] server_replicas); owned once route says so */
    /* a parameter chunk's copy (standby, [cluster] server_replicas): the workers send it their
       pushes too, after its owner's; it runs the same rounds (the same fixed-order sum, the
       same optimizer step: the same state, bit for bit) and sends no update. A push that
       comes before its round (a copy lags its owner) waits in `ahead` */
    int shadow;
    /* a copy that took its chunk over, or a new owner of relayed rounds, sends no update
       before every member took the view that moved it here (pushed it with that view's
       epoch: `repushed`, per worker), since the workers' pushes to the copy came whatever
       their view; the update of a copy's round that finished meanwhile is owed until then */
    int fenced;
    uint16_t fence_epoch;
    uint32_t
        fence_from; /* the view's start: a lagging copy's rounds before it are owed to no one */
    int owes_update;
    uint8_t *repushed; /* per worker ([cluster] server_replicas), else NULL */
    /* taken over (failover.c): a worker that had the last round's update from the dead owner
       may push the next round before the others pushed this one again; such pushes wait in
       `ahead` (linked by item.next) until the round moves on */
    int taken_over;
    struct recv_buf *ahead;
    uint32_t n_ahead;
    /* taken over by a move with relayed rounds (relay_from .. relay_end - 1): their update is
       the one the lost owner sent some workers, which a worker relays (STATE RELAY) into
       relayed[parity] (relay_came: 1, or 2 when the worker had it no more); nothing of those
       rounds is summed here (their pushes, sent again, are dropped), and each goes out once it
       came and every member pushed c in that view (`fenced` until then, as a copy's takeover) */
    uint32_t relay_from, relay_end;
    uint8_t *relayed[2];
    uint32_t relayed_len[2];
    uint8_t relay_came[2];
    /* Copies that follow ([server] quorum or elastic workers, with server replicas): a copy
       (and, up to follow_until, a copy that took its chunk over) steps a round with its
       owner's contributors, not its own (job.c's server_follows): the bitmap of the round
       that the workers' next pushes carry (wire.h), follow_bits once one came (follow_has).
       stale: 1 + the round whose bitmap named a push that never came here from a worker that
       left (elastic), or 0: the copy steps no more and cannot take the chunk over */
    uint32_t follow_until;
    int follow_has;
    uint8_t *follow_bits;
    uint32_t stale;
} chunk_state;

/* What a chunk's collect did with a push (flags; 0: nothing more to do, repost its buffer). */
enum {
    CHUNK_KEPT = 1,     /* the receive buffer is held by the chunk (an early push) */
    CHUNK_COMPLETE = 2, /* the round has all its pushes: aggregate.c finishes it now */
};

/*
 * How a chunk's pushes are summed into one fp32 sum, in the fixed worker order (aggregate.c's
 * comment): cpu_sum_ops (aggregate.c) folds each push into acc as soon as the order allows;
 * gpu_sum_ops (gpu.c) keeps every push in its slot and sums them all on the GPU assist at the
 * round's end. Called by the chunk's round kind (chunk_ops) in its aggregation thread.
 *   alloc    the sum's buffers (from the thread's arena), after the common ones; free them
 *   collect  one push of the round, checked up to its payload (handle_push): take it, mark
 *            worker w arrived and count it; a bad payload closes w (server_close_worker) and
 *            is not counted. Returns CHUNK_* flags (CHUNK_COMPLETE: the sum is whole)
 *   settle   the membership changed (elastic): CHUNK_COMPLETE if the sum is now whole, the
 *            workers that left no longer awaited
 *   encode   the whole sum requantized in c->codec into payload (c->enc bytes), with the
 *            server residual when there is one; bad: the element a failure is about
 */
typedef struct chunk_sum_ops {
    const char *name; /* "cpu", "gpu" */
    int device;       /* 1: summed on the GPU assist (the timeline's "gpu" argument) */
    psagg_status (*alloc)(struct server *srv, chunk_state *c);
    void (*free)(chunk_state *c);
    int (*collect)(struct server *srv, chunk_state *c, int w, recv_buf *rb);
    int (*settle)(struct server *srv, chunk_state *c);
    psagg_status (*encode)(struct server *srv, chunk_state *c, psagg__rng_key key, uint8_t *payload,
                           size_t *bad);
} chunk_sum_ops;

/*
 * A chunk's kind: what its rounds do. aggregate.c's handle_push and agg_finish_round do what
 * every kind shares (round, duplicate and codec checks, deadlines, the update's MAC, send and
 * accounting) and call these for the rest, so a new kind (an outer optimizer step, a quorum
 * round) is a new table, not a branch there. sum_chunk_ops (aggregate.c): the sum is the
 * update. param_chunk_ops (param.c): an optimizer step on the sum, the weights' delta is the
 * update ([server] optimizer).
 *   host_sum    1: finish reads the fp32 sum in acc, so the chunk is summed by cpu_sum_ops
 *   sum         the kind's own sum (thc_sum_ops: integers, no fp32 sum), or NULL: the CPU's
 *               or the GPU assist's (aggregate.c's chunk_sum chooses)
 *   out_bytes   the most payload bytes an update of a chunk of `count` elements in `codec`
 *               (`enc` encoded) takes
 *   state_bytes what the kind's own state costs a chunk of `count` elements (with out_bytes:
 *               agg_check_budget's count, before anything is allocated)
 *   alloc       the kind's state, after the common buffers and the sum's (c->param...); free
 *               it (also after a failed or partial alloc)
 *   admit       refuse a push the chunk's state does not allow (closing its sender: nonzero);
 *               *round is the round it counts for (h->round, unless the kind says otherwise)
 *   open        the round's first push (its codec taken): keep what the kind checks later
 *   agree       a later push of the round in the same codec: 0 if it agrees with the first,
 *               else -1 with the job failed
 *   collect     one admitted push of the round, as chunk_sum_ops' collect; what is summed
 *               goes to c->sum->collect (so param.c reaches aggregate.c's cpu_sum_ops through
 *               the table: the file map's one call upward besides the queue)
 *   settle      the membership changed and the round has pushes: as chunk_sum_ops' settle
 *   finish      every push is in: write the update into out (header included); returns its
 *               payload bytes, or -1 with the job failed
 *   advances    after finish: 1 if the round counts (the chunk moves to its next round)
 *   partial     whether the round being collected may close without every member ([server]
 *               quorum): a sum of gradients may, a parameter's INIT or PULL may not
 *   state       what a copy of the chunk must hold besides its round ([cluster] server_replicas:
 *               a server that comes back receives it, failover.c): up to 4 binary32 arrays of
 *               its count into arrays (a parameter's w, view and optimizer state; a server
 *               residual), their number; *step and *flags (PSAGG_STATE_*: a parameter's)
 *   set_state   the step and flags of a state whose arrays were just written, or NULL
 */
typedef struct chunk_ops {
    const char *name; /* "sum", "parameter" */
    int host_sum;
    const struct chunk_sum_ops *sum;
    uint64_t (*out_bytes)(const psagg_codec *codec, uint64_t count, uint64_t enc);
    uint64_t (*state_bytes)(const struct server *srv, uint64_t count);
    psagg_status (*alloc)(struct server *srv, chunk_state *c);
    void (*free)(chunk_state *c);
    int (*admit)(struct server *srv, chunk_state *c, const recv_buf *rb, uint32_t *round);
    void (*open)(chunk_state *c, const psagg__msg_codec *mc);
    int (*agree)(struct server *srv, chunk_state *c, int w, const psagg__msg_codec *mc);
    int (*collect)(struct server *srv, chunk_state *c, int w, recv_buf *rb);
    int (*settle)(struct server *srv, chunk_state *c);
    long (*finish)(struct server *srv, chunk_state *c, uint8_t *out, psagg__rng_key key);
    int (*advances)(const chunk_state *c);
    int (*partial)(const chunk_state *c);
    uint32_t (*state)(const struct server *srv, chunk_state *c, float **arrays, uint64_t *step,
                      uint32_t *flags);
    void (*set_state)(chunk_state *c, uint64_t step, uint32_t flags);
} chunk_ops;

/*
 * A round policy (quorum.c): when a chunk's round closes and whose pushes it sums. aggregate.c
 * calls the server's one (srv->policy) in the chunk's aggregation thread:
 *   late     a push of a round that is over (an older round, or this one closing) from
 *            member w: 1 when the policy takes it (its own business, dropped quietly), 0 when
 *            it is stale (dropped with a warning)
 *   pushed   a push of the round was collected (complete: the round is whole, and finishes)
 *   changed  the membership changed and the round is not whole
 *   timer    the thread's wake time (wake_ms) came: close what is due; the next wake time
 *            (strictly ahead), or 0
 *   trailer  the finished round's update: write what follows its payload (inside the MAC) at
 *            out; its bytes
 * and collective_checkpoint: whether a checkpoint waits for every member to ask for it (rounds
 * that may close without a worker leave the chunks between the same two rounds only then).
 */
struct agg_thread;
typedef struct round_policy {
    const char *name;
    int collective_checkpoint; /* a checkpoint waits for every member to ask (control.c) */
    int (*late)(struct server *srv, chunk_state *c, int w, uint32_t round);
    void (*pushed)(struct server *srv, chunk_state *c, int w, uint32_t round, int complete);
    void (*changed)(struct server *srv, chunk_state *c);
    int64_t (*timer)(struct server *srv, struct agg_thread *t, int64_t now);
    size_t (*trailer)(struct server *srv, chunk_state *c, uint8_t *out);
} round_policy;

typedef struct agg_thread {
    struct server *srv;
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    agg_item *head, *tail;
    agg_item barrier; /* agg_barrier's marker in the queue */
    int stop;
    void *cuda;          /* psagg__cuda_ctx of the GPU assist, or NULL (gpu.c) */
    int64_t wake_ms;     /* when its round policy's timer is due (its chunks'), or 0 */
    uint64_t gpu_failed; /* sums the GPU could not make, made on the CPU instead (gpu.c) */
} agg_thread;

/* The pool's start-up: each thread reports once its chunks' buffers are allocated. */
typedef struct agg_startup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left;            /* threads still allocating */
    psagg_status status; /* the first failure */
    char error[256];
} agg_startup;

/*
 * The server is made of components, each the state of one concern with the file that owns it
 * and the threads that may touch it named. Those that one file alone uses are opaque there
 * (struct admission, struct membership, struct param_store); the rest are embedded below.
 */

/* The job's outcome (job.c): the first failure wins. Any thread records one (server_fail_job);
   the control thread acts on it. mu also guards workers[].bad_reason. */
typedef struct job_outcome {
    pthread_mutex_t mu;
    atomic_int failed;
    psagg_status status; /* what the workers get (EPEER, ETIMEDOUT, ...) */
    char error[256];
} job_outcome;

/* The control loop's own (control.c, startup.c; the control thread only). */
typedef struct control_state {
    int listen_fd;
    int job_running;    /* READY was sent */
    int rejoin;         /* the job ran before this server (re)started: it rejoins (failover.c) */
    int rejoin_members; /* an elastic job's: the members the last HELLO named (wire.h), or 0 */
    int decl_ref;       /* the first starting worker that declared: the job's declaration */
    int64_t next_ping;  /* when the workers get their next PING */
} control_state;

/* Who belongs to the job (membership.c writes it, on the control thread; any thread reads
   member and epoch). All workers, always, unless [cluster] elastic. */
typedef struct members {
    int elastic;
    atomic_uchar *member;   /* per worker rank: 1 while it belongs to the job */
    atomic_uint epoch;      /* the membership epoch applied here */
    int n;                  /* members now (the control thread's) */
    struct membership *own; /* epochs' frames, joins' barriers: membership.c's alone */
} members;

/* The data path (progress.c): the progress thread's, but for the queues the aggregation
   threads hand it updates and receive buffers through (job.c: server_queue_update,
   server_queue_repost). */
typedef struct data_path {
    psagg__gate gate;     /* who sent a push (runtime/gate.h) */
    psagg__rxpool rxpool; /* of recv_buf: posted receive buffers */
    pthread_t tid;
    atomic_int running;
    pthread_mutex_t sendq_mu; /* the queue of updates to send: */
    send_ctx *sendq_head, *sendq_tail;
    atomic_int sendq_len;
    atomic_int idle;                    /* it may be asleep in psagg__fabric_poll: wake it */
    _Atomic(struct recv_buf *) repostq; /* receive buffers to post again (a stack) */
    struct recv_buf *parked;            /* pushes of an epoch not applied yet */
    uint32_t parked_epoch;              /* the epoch when they were last looked at */
} data_path;

/* The aggregation pool (aggregate.c, with quorum.c's round policy and gpu.c's assist): its
   threads own the chunks; the control thread sets it up before they start and tears it down
   after they stop. */
typedef struct agg_pool {
    agg_thread *threads;
    int n_threads;
    int started;
    agg_startup startup;
    const round_policy *policy; /* when a round closes (quorum.c), chosen at start-up */
    size_t bitmap_bytes; /* [server] quorum, or follow_bytes: an update's contributor bitmap */
    size_t follow_bytes; /* replicas with a quorum or elastic workers: a push's bitmap of the
                            round before (copies follow their owner), else 0 */
    psagg__data_key update_key;  /* of this server's updates (data_auth; runtime/auth.h) */
    _Atomic uint64_t update_seq; /* the number of the last update sealed */
    uint64_t budget;             /* bytes a job's chunks may take ([server] memory_budget_mb) */
    atomic_int rx_held;          /* receive buffers held by chunks (early pushes), at most: */
    int rx_hold_max;             /* half the pool */
    pthread_mutex_t spill_mu;    /* the heap copies of pushes that wait ahead (spilled), */
    struct recv_buf *spills;     /* freed when done with, or by agg_teardown */
    atomic_ullong n_spilled;     /* how many there were (metrics.c) */
    /* copies found stale (aggregate.c, follow_stale), less those whose state came again: the
       control thread has the server start anew to take their state (failover_restart_due) */
    atomic_int n_stale;
    pthread_mutex_t barrier_mu; /* agg_barrier: threads that passed the marker */
    pthread_cond_t barrier_cv;
    int barrier_left;
    int barrier_held;          /* they wait at it until agg_release */
    uint64_t barrier_gen;      /* agg_release's count: a barrier's waiters leave at its own */
    psagg__timeline *timeline; /* [log] timeline, or NULL */
    /* resource usage: a snapshot when chunk slot 0 finishes its first round, and the rounds
       that chunk has finished; the job's end reports CPU and page faults per round after the
       first (metrics.c) */
    struct rusage usage_first;
    atomic_int usage_marked;
    atomic_uint rounds_done;
} agg_pool;

typedef struct server {
    psagg__config cfg;
    int rank;
    /* log, job_key, nonce, tag_bytes, max_msg, fab, source_reliable (runtime/node.h: server.c
       opens it) */
    PSAGG_NODE_EMBED;
    const volatile sig_atomic_t *stop; /* set by main's signal handler */

    /* the job: its workers (the control thread's connections), its declaration and layout,
       fixed once it starts, and the chunks this server owns (each its aggregation thread's) */
    int n_workers;     /* the job's ranks: `workers`, or an elastic job's max_workers */
    int start_workers; /* the ranks that start it (`workers`); the others may join it later */
    worker_conn *workers;
    int *rank_at; /* n_workers entries: the worker whose fabric address is this index, or -1 */
    psagg__ctl_declare job_decl_hdr; /* the job's declaration (the first starting worker's): */
    psagg__ctl_tensor *job_decl;     /* a joiner's must equal it */
    psagg__layout layout;
    uint32_t n_owned;
    /* chunk states held: the owned ones (slots 0..n_owned-1), then, with [cluster]
       server_replicas = R, the standby ones: the chunks of the R servers before this one on
       the ring, which it takes over when their owner dies (docs/design.md) */
    uint32_t n_held;
    chunk_state *chunks; /* by slot */
    /* per chunk of the layout: the slot of its state while this server owns it, else -1. The
       control thread changes it (a takeover) after the chunk's state is ready; the progress
       thread routes pushes by it */
    atomic_int *route;

    job_outcome job;
    control_state ctl;
    struct admission *adm; /* admission.c: connections that have not authenticated */
    members mb;
    data_path dp;
    agg_pool pool;
    struct param_store *params;     /* param.c: the optimizer and a checkpoint to resume */
    struct checkpoints *ckpt;       /* checkpoint.c: the workers' requests */
    struct server_metrics *metrics; /* metrics.c */
    struct failover *failover;      /* failover.c: server views ([cluster] server_replicas) */
} server;

/*
 * metrics.c: counters (any thread; relaxed atomics), the straggler report (at the job's end)
 * and the Prometheus endpoint ([server] metrics_port, off when 0). init before the job,
 * start after the control port is open, stop last (it frees the counters).
 */
psagg_status metrics_init(server *srv);
psagg_status metrics_start(server *srv);
void metrics_stop(server *srv);
void metrics_push(server *srv, int worker, size_t bytes);
void metrics_drop(server *srv);
void metrics_left_out(server *srv, int worker); /* [server] quorum */
void metrics_late(server *srv, int worker);
void metrics_lateness(server *srv, int worker, int64_t ns);
void metrics_round(server *srv, size_t update_bytes, int64_t collect_ns, int64_t finish_ns);
/* The job started (chunks set up, threads running): the codec mix, the busy counters. */
void metrics_job_started(server *srv);
/* Aggregation thread `thread` spent ns on an item. */
void metrics_busy(server *srv, uint32_t thread, int64_t ns);
void metrics_report(server *srv);
/* The job's end (control thread): log CPU and minor page faults per round after the first
 * (the benchmarks read this line), when chunk slot 0 finished two rounds or more. */
void metrics_usage(server *srv);
/* param.c: one optimizer step of a chunk took ns (sync: its update was the exact weights); a
 * checkpoint was written (ok) or refused. */
void metrics_optim_step(server *srv, int64_t ns, int sync);
void metrics_checkpoint(server *srv, int64_t ns, int ok);
/* membership.c: epoch applied, with n workers in it. */
void metrics_membership(server *srv, uint32_t epoch, int n);

/* server_run's exit code when the server is to start anew (failover_restart_due): main.c
   executes it again with the same command line */
#define SERVER_RESTART 75
/* server.c: the whole life of a server; returns the process exit code. */
int server_run(const psagg__config *cfg, int rank, const volatile sig_atomic_t *stop);
/*
 * server.c: a server without its control port and job (server_run's first half, and what the
 * server's unit tests start): NULL when it cannot (why is logged). server_close stops its
 * threads and frees all of it.
 */
server *server_open(const psagg__config *cfg, int rank, const volatile sig_atomic_t *stop);
void server_close(server *srv);

/* control.c: the control loop (main thread); returns the process exit code. */
int control_serve(server *srv);

/*
 * startup.c (the control thread): declare keeps worker w's DECLARE (a joiner's must be the
 * job's: it waits to be admitted then, or is refused by name); start, once every starting
 * worker declared: compare them, keep the job's, start the pool and the data path, send READY
 * (a worker it cannot reach is dropped). Nonzero: the job cannot start, why in msg.
 */
void startup_declare(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
psagg_status startup_start(server *srv, char *msg, size_t len);

/*
 * checkpoint.c (the control thread): worker w's CHECKPOINT; with a round policy that closes
 * rounds without a worker, every member's, collected first. tick: whether all have asked, or
 * the deadline passed. init (every worker's slot) and fini: server_open's and server_close's.
 */
psagg_status checkpoint_init(server *srv);
void checkpoint_fini(server *srv);
void checkpoint_asked(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void checkpoint_tick(server *srv, int64_t now);

/*
 * admission.c: connections that have not authenticated (the control thread). init makes the
 * pending table (and no start-up deadline yet); while the job starts, the control loop polls
 * what poll_add adds (who: -1 the listening socket, -2 - i pending slot i) and hands each
 * ready entry to serve (accept, read, check a HELLO: a worker's connection and its WELCOME,
 * or a refusal), and calls expire now and then (HELLOs that did not come in time);
 * close_all closes every pending connection and reports the refusals (the job started or
 * the loop ended).
 */
psagg_status admission_init(server *srv);
void admission_expire(server *srv, int64_t now);
int admission_poll_add(server *srv, struct pollfd *pfd, int *who, int n);
void admission_serve(server *srv, int who, int fd);
void admission_close_all(server *srv);
/* When the start-up deadline passes (it runs from the first authenticated HELLO), or -1. */
int64_t admission_deadline(const server *srv);
void admission_fini(server *srv);

/*
 * membership.c ([cluster] elastic): init before the job (every worker a member), fini at the
 * end. lost: the control thread closed worker w of a running elastic job (why): the owner
 * (membership_owner) starts the next epoch without it and tells the live workers; other
 * servers wait for that. relayed: a worker relayed the owner's MEMBERSHIP frame to this server
 * (checked, applied in order, duplicates compared).
 */
/*
 * failover.c ([cluster] server_replicas; control thread): a worker's SERVER_LOST, AGREE,
 * VIEW, SERVER_BACK and DONE frames; tick (retries, the reports' deadline) while the job runs; fini
 * at the end.
 */
void failover_lost(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void failover_agree(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void failover_view(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void failover_back(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void failover_done(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void failover_state(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void failover_done_check(server *srv); /* (a worker said BYE) */
/* (membership.c, the owner of an elastic job's membership: the next view removes worker w) */
void failover_member_left(server *srv, int w, const char *why, int bye);
/* (the same: the next view admits joiner w) */
void failover_admit(server *srv, int w);
void failover_tick(server *srv, int64_t now);
/* Whether this server is to leave the job and start again now (its stale copies; control.c
 * then ends its loop with SERVER_RESTART, main.c executes the server anew). */
int failover_restart_due(server *srv, int64_t now);
void failover_fini(server *srv);
/* Whether the server view applied here names this server chunk g's owner (the layout's before
 * any view; none while a server that rejoins waits for the view that admits it). */
int failover_owns(const server *srv, uint32_t g);
/* The lowest live server of the view applied here (0 before any view; -1 while a server that
 * rejoins waits for the view that admits it): who decides the membership (membership.c). */
int failover_coordinator(const server *srv);

psagg_status membership_init(server *srv);
void membership_fini(server *srv);
/*
 * Start-up: server 0's READY body (malloc'd, *len bytes; NULL without memory): the starting
 * workers. start_relayed: a server > 0 gets it from a declared worker (START) and starts
 * without the starting workers it names dead, as server 0 did (those it never heard of too).
 */
void *membership_start_frame(const server *srv, uint32_t *len);
void membership_start_relayed(server *srv, int from, const psagg__ctl_hdr *h, const void *body);
void membership_lost(server *srv, int w, const char *why);
/* A member of a running elastic job said BYE (psagg_close): it leaves as a lost one does, but
   no failure (fewer than min_workers go on). */
void membership_bye(server *srv, int w);
void membership_relayed(server *srv, int from, const psagg__ctl_hdr *h, const void *body);
/* Who decides the membership: the coordinator of the server view applied here (server 0 as
   long as it lives; -1: not known yet). Joins (its): a member's SYNC, a joiner's JOIN. */
int membership_owner(const server *srv);
void membership_sync(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
void membership_join(server *srv, int w, const psagg__ctl_hdr *h, const void *body);
/* The control loop, now and then: the deadlines of the admitting barrier (the owner) and of
   epochs relayed ahead (the other servers). */
void membership_tick(server *srv, int64_t now);
/* Refuse worker w's join (a joiner, not a member): tell it why, close it. */
void membership_refuse(server *srv, int w, psagg_status status, const char *why);

/*
 * progress.c: start (progress_init first) and stop the progress thread. What it does with one
 * received push (route: source, epoch, fields, then the chunk's aggregation thread) and when
 * the epoch moved (route_parked: the pushes that waited for it) are the progress thread's
 * only; the server's unit tests call them in its place, with init and no thread.
 */
void progress_init(server *srv);
psagg_status progress_start(server *srv);
void progress_stop(server *srv);
void progress_route(server *srv, recv_buf *rb, psagg__peer src);
void progress_route_parked(server *srv);
/* Post a receive buffer again: the progress thread (others use server_queue_repost). */
void progress_repost(server *srv, recv_buf *rb);

/* aggregate.c */
/*
 * Refuse (PSAGG_ENOMEM, naming the largest tensor and the bytes) a declaration whose layout
 * and share of chunks would not fit srv->budget, before anything is allocated for it.
 */
psagg_status agg_check_budget(const server *srv, const psagg__ctl_tensor *decl, uint32_t n,
                              uint64_t chunk_elems, uint32_t adapt_interval);
psagg_status agg_setup(server *srv);
psagg_status agg_start(server *srv);
void agg_stop(server *srv);
void agg_teardown(server *srv);
void agg_enqueue(server *srv, chunk_state *c, recv_buf *rb);
/* Every chunk routed here (owned, or taken over) looks at its round again (a membership
   change: a round may now have every member's push), and the progress thread routes the pushes
   that waited for the epoch (the control thread's). */
void agg_settle_routed(server *srv);
/* Free rb, a heap copy of a push that waited ahead (rb->spilled; progress_repost). */
void agg_spill_free(server *srv, recv_buf *rb);
/*
 * Server view `epoch` moves chunk c (failover.c, the control thread): AGG_OWN it from move m's
 * round on (with its relayed rounds), or AGG_GIVE_UP, or AGG_COPY (m NULL). Its aggregation
 * thread does it in queue order, before any push routed after this call; what c held of an
 * unfinished round is dropped either way, but by a copy of a parameter chunk that takes it
 * over (its state is the owner's). PSAGG_ENOMEM, or 0.
 */
psagg_status agg_move(server *srv, chunk_state *c, int move, const psagg__view_move *m,
                      uint32_t epoch);
/*
 * The update of round `round` of chunk c that a worker relays (failover.c, STATE RELAY: its
 * header checked against the chunk there), len bytes (0: the worker had it no more), for the
 * chunk's aggregation thread: bytes (malloc'd) are its from now on, also on failure.
 * PSAGG_ENOMEM, or 0.
 */
psagg_status agg_relay(server *srv, chunk_state *c, uint32_t round, uint8_t *bytes, uint32_t len);
/*
 * A chunk's state for a server that comes back (failover.c, the control thread, between
 * agg_barrier and agg_release): save writes what a copy of c holds (its round, the kind's
 * state, the last round's update) as a STATE CHUNK frame, *sh's server, epoch and chunk the
 * caller's, into *frame (malloc'd, *len bytes); load checks such a frame's body against c and
 * takes it (c stays on standby: AGG_COPY makes it a copy). PSAGG_OK, or what is wrong.
 */
psagg_status agg_state_save(server *srv, chunk_state *c, psagg__ctl_state *sh, uint8_t **frame,
                            size_t *len);
psagg_status agg_state_load(server *srv, chunk_state *c, const psagg__ctl_state *sh,
                            const uint8_t *data, size_t len);
/*
 * Wait until every aggregation thread has handled everything queued before this call (the
 * control thread, for a checkpoint): what they wrote before is then visible to the caller, and
 * they wait there, writing nothing more (pushes queue up), until agg_release.
 */
void agg_barrier(server *srv);
void agg_release(server *srv);
/*
 * One send of sc's update is done (completed, failed, or passed over: the progress thread):
 * the last one frees its buffer, and a round deferred on it is queued to go on.
 */
void agg_send_done(server *srv, send_ctx *sc);
/* Requantize c's completed round and send the update (or defer until out[] is free). */
void agg_finish_round(server *srv, chunk_state *c);
/* c's aggregation thread, after a membership change: finish its round if it is now complete. */
void agg_settle(server *srv, chunk_state *c);

/* The sum kind (its update is the sum) and the sum on the CPU. */
extern const chunk_ops sum_chunk_ops;
extern const chunk_sum_ops cpu_sum_ops;

/* integer.c: the integer sum kind (the thc codec) and its sum */
extern const chunk_ops thc_chunk_ops;
extern const chunk_sum_ops thc_sum_ops;

/* quorum.c: a round closes when every member pushed; or also, [server] quorum, without
   stragglers */
extern const round_policy every_member_policy;
extern const round_policy quorum_policy;

/* param.c: parameter chunks and checkpoints ([server] optimizer, checkpoint_dir, resume) */
/* Start-up: the optimizer's settings; with resume, read and check the checkpoint file. */
psagg_status optim_init(server *srv);
void optim_fini(server *srv);
/* The declaration is known (layout built): refuse parameters without an optimizer, and a
 * checkpoint written for another declaration (naming the difference); nothing is loaded yet. */
psagg_status optim_check_job(server *srv);
/* The aggregation threads have their chunks (and a checkpoint's state): let the file go, and
 * say what the optimizer runs on. */
void optim_loaded(server *srv);
/* The optimizer's settings as WELCOME carries them. */
void optim_welcome(const server *srv, psagg__ctl_optim *out);
/*
 * The parameter kind: its state allocated in c's aggregation thread (and loaded from the
 * checkpoint), its pushes' trailers checked, INIT and PULL collected, GRAD summed by c->sum,
 * and the optimizer's step and update at the round's end.
 */
extern const chunk_ops param_chunk_ops;
/* The control thread, for a worker's CHECKPOINT, after agg_barrier: write the state of every
 * parameter chunk this server owns (owned: per chunk of the layout, failover_owns). */
psagg_status optim_checkpoint(server *srv, const uint8_t *owned, uint64_t seq, char *path,
                              size_t len);

/*
 * ckpt_file.c: the file (<checkpoint_dir>/psagg-server-<rank>.ckpt). open: read and check all
 * of it (resume; why not, with its path, on failure), with server replicas every server's
 * file found; close; path: its name (or the folder's). match: the job (its declaration, chunk
 * size, optimizer kind and `arrays` per chunk) must be the file's, chunk by chunk, before
 * anything is loaded. state: held slot `slot`'s arrays (`arrays` of its count each),
 * optimizer step and round, or NULL (f NULL, or no parameter chunk there). write: the state
 * of every parameter chunk with owned[chunk] (w, view, then the optimizer's: `arrays` in
 * all) as checkpoint `seq`, written to a temporary name, synced and renamed to <file>.pending
 * (PREPARE); *path gets its name.
 */
struct ckpt_file;
/* Server rank's file in the checkpoint_dir: the current one (suffix ""), ".prev" or ".pending". */
void ckpt_path(const server *srv, int rank, const char *suffix, char *buf, size_t len);
psagg_status ckpt_open(const server *srv, struct ckpt_file **out);
void ckpt_close(struct ckpt_file *f);
const char *ckpt_file_path(const struct ckpt_file *f);
psagg_status ckpt_match(const server *srv, struct ckpt_file *f, psagg__optim_kind kind, int arrays);
const float *ckpt_state(const struct ckpt_file *f, uint32_t slot, uint32_t *arrays, uint64_t *step,
                        uint32_t *round);
psagg_status ckpt_write(const server *srv, int arrays, const uint8_t *owned, uint64_t seq,
                        char *path, size_t len);
/* COMMIT: the current file becomes <file>.prev and <file>.pending the current one (*path). */
psagg_status ckpt_commit(const server *srv, char *path, size_t len);

/* gpu.c */
psagg_status gpu_thread_init(server *srv, agg_thread *t);
void gpu_thread_fini(agg_thread *t);
/* The sum on the GPU assist: the inputs kept in their slots, summed in worker order. */
extern const chunk_sum_ops gpu_sum_ops;
int gpu_max_inputs(void);

/* job.c: data-path threads report a misbehaving worker or a failed job through these */
void server_close_worker(server *srv, int w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An elastic job's member that is alive but sends no push in a round's time: closed as above,
   told PSAGG_ETIMEDOUT (the job goes on without it: its membership) */
void server_evict_worker(server *srv, int w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The first failure wins; status is what the workers get (EPEER, ETIMEDOUT, ...). */
void server_fail_job(server *srv, psagg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Whether worker w belongs to the job now (any thread; membership.c changes it). */
int server_member(const server *srv, int w);
/* Whether worker w is closed or asked to be (server_close_worker): its pushes count for nothing. */
int server_closing(server *srv, int w);
/* Whether c's round has a push from every member (and at least one), or, closing ([server]
   quorum), from any worker: aggregation threads. */
int server_members_in(const server *srv, const chunk_state *c);
int server_passes(const server *srv, const chunk_state *c, int w);
int server_follows(const server *srv, const chunk_state *c);
/* The start-up (startup.c, control.c): the ranks that may declare (0..start_ranks - 1: the
   starting workers, or every rank when this server rejoins an elastic job) and how many of them
   it waits for (the starting workers, or the members the rejoining workers name: wire.h). */
int server_start_ranks(const server *srv);
int server_start_count(const server *srv);
/* The worker whose fabric address is addr, or -1. */
int server_worker_at(const server *srv, psagg__peer addr);
/*
 * The aggregation threads' way to the endpoint, which only the progress thread calls: hand
 * it a finished round's update (out[parity] of its chunk) to send, or a receive buffer to
 * post again; it is woken only when it may be asleep.
 */
void server_queue_update(server *srv, send_ctx *sc);
void server_queue_repost(server *srv, recv_buf *rb);
/*
 * job.c, the control thread's: verdict tells a peer why it is refused or why the job ends
 * (ERROR, ABORT; a failed send is logged); tell_workers sends one to every connected worker
 * but `except`; drop_worker closes worker w's connection (its ERROR first) and marks it lost,
 * for the control loop to settle what that means for the job.
 */
void server_verdict(server *srv, int fd, psagg__ctl_auth *auth, uint16_t type, psagg_status status,
                    const char *msg);
void server_tell_workers(server *srv, int except, uint16_t type, psagg_status status,
                         const char *msg);
void server_drop_worker(server *srv, int w, psagg_status status, const char *why);
/*
 * job.c, the control thread's, for the membership epochs (membership.c) and the views that
 * carry them (failover.c): worker w leaves (it is no member from now on; its connection, if
 * any, is closed with an ERROR saying it was removed in `epoch`, and why), or is admitted
 * (then aggregate.c's agg_settle_routed).
 */
void server_member_leave(server *srv, int w, uint32_t epoch, const char *why);
void server_member_admit(server *srv, int w);

#endif
