/*
 * worker.h - libpsagg's private state.
 *
 * The calling threads (api.c) queue operations; one communication thread per context
 * (comm.c) takes them in priority order, encodes every chunk of a tensor (with its
 * error-feedback residual), pushes each chunk to its owning server within a per-server
 * in-flight window, decodes the updates as they arrive into the caller's output buffer, and
 * watches the control connections and deadlines so that a dead server or a lost message fails
 * the operation with a message instead of hanging.
 */
#ifndef PSAGG_WORKER_H
#define PSAGG_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "codec.h"
#include "config.h"
#include "layout.h"
#include "psagg.h"
#include "transport.h"
#include "wire.h"

typedef struct server_conn {
    int fd;
    psagg_peer addr;
    int inflight; /* pushes whose update has not arrived (comm thread only) */
} server_conn;

/* Per chunk: the push buffer (header + encoded payload), registered once. */
typedef struct chunk_buf {
    uint8_t *buf;
    void *desc;
    int send_pending; /* comm thread only */
} chunk_buf;

typedef struct tensor_state {
    float *residual;         /* worker error feedback, or NULL */
    uint32_t round;          /* round of the next push_pull */
    struct psagg_handle *op; /* the push_pull in flight, or NULL */
} tensor_state;

struct psagg_handle {
    psagg_ctx *ctx;
    struct psagg_handle *next; /* in the submit queue */
    uint32_t key;
    const float *in;
    float *out;
    psagg_reduce op;
    int priority;
    uint64_t seq;
    uint32_t round;
    int encoded;        /* all chunks encoded (comm thread) */
    uint32_t next_send; /* next chunk to push (comm thread) */
    uint32_t done_chunks;
    uint8_t *chunk_done;
    int64_t deadline_ms;
    int done;           /* guarded by ctx->mu */
    int status;
    char msg[256];
};

typedef struct recv_slot {
    uint8_t *buf;
    void *desc;
    size_t size;
} recv_slot;

struct psagg_ctx {
    psagg_config cfg;
    int rank, world;
    psagg_fabric *fab;
    size_t max_msg;
    server_conn *servers;
    int declared;
    psagg_layout layout;
    tensor_state *tensors;
    chunk_buf *chunks;
    recv_slot *rslots;
    int n_rslots;

    pthread_t comm_tid;
    atomic_int running;
    pthread_mutex_t mu; /* queue, handle completion, failure state */
    pthread_cond_t cv;  /* a handle completed or the queue changed */
    struct psagg_handle *queue; /* submitted, not yet taken by the comm thread */
    uint64_t next_seq;
    int failed;          /* the job failed: every later call returns failed_status */
    int failed_status;
    char failed_msg[256];

    atomic_uint_fast64_t bytes_sent, bytes_received, bytes_raw, push_pulls;
};

/* comm.c */
psagg_status comm_start(psagg_ctx *ctx);
void comm_stop(psagg_ctx *ctx);
/* Complete a handle with a status (under ctx->mu) and wake waiters. */
void comm_complete_locked(psagg_ctx *ctx, struct psagg_handle *h, int status, const char *msg);
/* Fail the whole context: every pending and later operation gets this status and message. */
void comm_fail_all(psagg_ctx *ctx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
