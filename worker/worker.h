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
    /*
     * Pushes handed to libfabric whose send has not completed (comm thread only). The window
     * is released by the send completion, not by the update: an update needs every worker's
     * push of its chunk, so a window released by updates lets workers that took operations in
     * different orders fill a server's window with different chunks and wait on each other.
     */
    int inflight;
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
    int gpu;          /* in/out are device buffers (cuda.c) */
    int gpu_decoding; /* all updates staged; the GPU is decoding them (comm thread) */
    int done;         /* guarded by ctx->mu */
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
    pthread_mutex_t mu;         /* queue, handle completion, failure state */
    pthread_cond_t cv;          /* a handle completed or the queue changed */
    struct psagg_handle *queue; /* submitted, not yet taken by the comm thread */
    uint64_t next_seq;
    int failed; /* the job failed: every later call returns failed_status */
    int failed_status;
    char failed_msg[256];

    atomic_uint_fast64_t bytes_sent, bytes_received, bytes_raw, push_pulls;
    void *gpu; /* cuda.c state, created by the first psagg_push_pull_cuda */
};

/* api.c: queue a handle whose tensor slot (tensors[key].op) the caller has claimed. */
struct psagg_handle *api_new_handle(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                                    psagg_reduce op, int priority, psagg_status *st);
void api_submit(psagg_ctx *ctx, struct psagg_handle *h);
void api_abandon(psagg_ctx *ctx, struct psagg_handle *h);

/* comm.c */
psagg_status comm_start(psagg_ctx *ctx);
void comm_stop(psagg_ctx *ctx);
/* Complete a handle with a status (under ctx->mu) and wake waiters. */
void comm_complete_locked(psagg_ctx *ctx, struct psagg_handle *h, int status, const char *msg);
/* Fail the whole context: every pending and later operation gets this status and message. */
void comm_fail_all(psagg_ctx *ctx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The RNG key of one chunk's push in one round (host and GPU paths alike). */
psagg_rng_key comm_push_key(const psagg_ctx *ctx, const psagg_chunk_info *ci, uint32_t round);

/*
 * cuda.c: the device-buffer path. The comm thread calls these for handles with h->gpu set.
 *   gpu_payloads_ready  0: the GPU is still encoding; 1: the encoded chunks are copied into
 *                       the push buffers; negative: failed (status, message in msg)
 *   gpu_stage_update    keep one chunk's update bytes for the device decode
 *   gpu_start_decode    all updates staged: copy them to the device and decode into h->out
 *   gpu_decode_done     0: still decoding; 1: done; negative: failed (message in msg)
 */
int gpu_payloads_ready(psagg_ctx *ctx, struct psagg_handle *h, char *msg, size_t len);
void gpu_stage_update(psagg_ctx *ctx, struct psagg_handle *h, const psagg_chunk_info *ci,
                      const void *payload);
int gpu_start_decode(psagg_ctx *ctx, struct psagg_handle *h, char *msg, size_t len);
int gpu_decode_done(psagg_ctx *ctx, struct psagg_handle *h, char *msg, size_t len);
void gpu_destroy(psagg_ctx *ctx);

#endif
