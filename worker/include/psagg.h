/*
 * psagg.h - the public API of libpsagg, the psagg worker library.
 *
 * A training process links libpsagg, creates one context from an INI file plus its rank and
 * the number of workers, declares every gradient tensor once (one batch), and then calls
 * psagg_push_pull() each step: the tensor is quantized, its chunks are pushed to the sharded
 * psagg-server processes, and the aggregated update (bit-identical on every worker) is
 * written back. All calls are thread-safe unless noted. Every function that can fail returns
 * a psagg_status; psagg_last_error() gives the message of the calling thread's last failure
 * (what went wrong and with whom).
 *
 * Names. Every public name starts with psagg_ (PSAGG_ for macros and constants); libpsagg's
 * internals are psagg__ (two underscores) and never exported. The calls follow one scheme:
 *   psagg_<verb>            an action on the context: psagg_init, psagg_declare, psagg_push_pull,
 *                           psagg_checkpoint, psagg_broadcast, psagg_sync_membership, psagg_close,
 *                           psagg_abort
 *   psagg_<verb>(handle)    an action on an operation's handle: psagg_test, psagg_wait,
 *                           psagg_release (MPI's MPI_Test, MPI_Wait)
 *   psagg_get_<noun>        a read of the context into an out-parameter (a struct of psagg.h's,
 *                           or a value), returning a psagg_status; it takes a const context
 *   psagg_set_<noun>        a setting of the context
 *   psagg_handle_<noun>     a read of a handle (psagg_handle_timing, psagg_handle_codec)
 *   psagg_rank, psagg_world_size, psagg_min_compress_elems: plain values, returned as such.
 * A name that leaves the scheme stays for one version as a deprecated alias (PSAGG_DEPRECATED:
 * the compiler says which name replaces it): psagg_tensor_round is psagg_get_tensor_round.
 *
 * Layer: worker (the top, beside server/). It includes only psagg/types.h (base).
 */
#ifndef PSAGG_H
#define PSAGG_H

#include <stddef.h>
#include <stdint.h>

/* Status codes, psagg_strerror, psagg_last_error and the codec description (psagg_codec):
 * the types every layer shares (base layer, installed beside this header). */
#include "psagg/types.h"

/*
 * PSAGG_API (defined in psagg/types.h, the first public header every file includes) marks the
 * functions libpsagg exports: these, and nothing else. The library is built with hidden
 * visibility and a version script (worker/libpsagg.map); lint.exports checks that the exported
 * set equals the PSAGG_API declarations of this header and psagg/types.h.
 */

#ifdef __cplusplus
extern "C" {
#endif

#define PSAGG_VERSION_MAJOR 0
#define PSAGG_VERSION_MINOR 1

/* A name kept for one version after the scheme (above) renamed it. */
#if defined(__GNUC__) || defined(__clang__)
#define PSAGG_DEPRECATED(use) __attribute__((deprecated("use " #use)))
#else
#define PSAGG_DEPRECATED(use)
#endif

/* ---- codec descriptions as text (wire formats: kernels/codec.h) ---- */

/*
 * Parse "fp32", "fp16", "bf16", "maxmin4" or "maxmin:4", optionally followed by "/<bucket>"
 * and "/sr" or "/nearest" in any order ("maxmin4/512/nearest"). Implemented in kernels/.
 */
PSAGG_API psagg_status psagg_codec_parse(const char *text, psagg_codec *out);
/* Format a codec as text ("maxmin4/1024/sr"); returns buf. */
PSAGG_API const char *psagg_codec_name(const psagg_codec *codec, char *buf, size_t len);

/*
 * Structs that grow. Every public struct a caller fills, or gives the library to fill
 * (psagg_tensor_desc, psagg_timing, psagg_stats, psagg_assignment, psagg_server_optim,
 * psagg_membership), starts with
 * `size_t struct_size`, which the caller sets to the struct's size as its psagg.h declares it:
 *
 *     psagg_stats s = {.struct_size = sizeof s};
 *     psagg_get_stats(ctx, &s);
 *
 * New fields are only ever appended, so a library reads or fills exactly the struct_size bytes
 * its caller has, and accepts every size an earlier psagg.h had (each struct's sizeof, and the
 * sizes before psagg_stats.left_out and psagg_tensor_desc.error_feedback_beta). A size it does not
 * know (0, too small, or one of a newer psagg.h) fails with PSAGG_EINVAL naming the struct. In an
 * array of psagg_tensor_desc every element says the same size, the array's stride. A struct inside
 * another belongs to the container's layout, which its struct_size covers: the library sets
 * psagg_stats.time.struct_size itself. psagg_codec, the small codec value every layer shares, keeps
 * its layout: a new codec parameter goes into the struct that carries the codec.
 */

/* ---- worker API ---- */

typedef struct psagg_ctx psagg_ctx;       /* one per worker process */
typedef struct psagg_handle psagg_handle; /* one outstanding push_pull */

typedef enum psagg_reduce {
    PSAGG_SUM = 0,
    PSAGG_AVERAGE = 1,
} psagg_reduce;

/* psagg_tensor_desc.flags */
#define PSAGG_TENSOR_PARAMETER 1u /* a parameter the servers optimize (below) */
/* used now and then (a broadcast, a state hand-over), not every step: the servers' per-step
   load is balanced without it, and such tensors are spread on their own */
#define PSAGG_TENSOR_RARE 2u

typedef struct psagg_tensor_desc {
    size_t struct_size; /* sizeof(psagg_tensor_desc) (above) */
    const char *name;   /* unique within the job, at most 63 bytes */
    uint64_t count;     /* number of fp32 elements, >= 1 */
    psagg_codec codec;  /* codec.id = PSAGG_CODEC_DEFAULT takes the config's */
    int error_feedback; /* -1: config default, 0: off, 1: keep a residual on this worker */
    uint32_t flags;     /* PSAGG_TENSOR_*; 0: a gradient the servers sum */
    /* (the struct of psagg 0.1's first releases ended here: struct_size 56, still accepted) */
    uint32_t reserved; /* 0 */
    /* error feedback's decay (SparseLoCo, arXiv 2508.15706): what the codec left out is kept
       as beta * (what it was asked to send - what it sent), so the next push sends x + beta *
       e; 1 is classic error feedback. 0: the config's ([codec] error_feedback_beta, default 1);
       else 1e-6..1. Host memory only (psagg_push_pull_cuda refuses a beta other than 1) */
    float error_feedback_beta;
} psagg_tensor_desc;

/*
 * Create a worker context. ini_path names the INI file (see conf/cluster.ini); rank and
 * world_size may be -1 to read PSAGG_RANK and PSAGG_WORLD_SIZE from the environment (the
 * launcher sets them). Connects to every server and waits until all workers have arrived or
 * [cluster] connect_timeout_ms passes.
 */
PSAGG_API psagg_status psagg_init(const char *ini_path, int rank, int world_size, psagg_ctx **out);

/*
 * Declare all tensors in one batch (once per context). Every worker must declare the same
 * list in the same order; a mismatch fails on every worker with PSAGG_EMISMATCH naming the
 * tensor and the workers. keys_out (optional, n entries) receives each tensor's key, which
 * is its index in the list.
 */
PSAGG_API psagg_status psagg_declare(psagg_ctx *ctx, const psagg_tensor_desc *tensors, size_t n,
                                     uint32_t *keys_out);

/*
 * Start one aggregation of tensor `key`: `in` (count floats) is this worker's contribution,
 * `out` (count floats, may equal `in`) receives the sum (or average) over all workers. Both
 * buffers must stay valid and untouched until the handle completes. Higher priority is sent
 * first. Each key may have one push_pull in flight at a time.
 */
PSAGG_API psagg_status psagg_push_pull(psagg_ctx *ctx, uint32_t key, const float *in, float *out,
                                       psagg_reduce op, int priority, psagg_handle **handle);

/*
 * push_pull on GPU buffers (libpsagg built with CUDA; PSAGG_EUNSUPPORTED otherwise). d_in and
 * d_out are device pointers (count floats) on the calling thread's current device; stream is
 * a cudaStream_t (NULL: the legacy default stream). The work is ordered after everything
 * already queued on `stream` (an event is recorded on it; the device is never synchronized as
 * a whole). Quantization, with the tensor's error-feedback residual kept on the device, runs
 * on the GPU and only the compressed bytes are copied to pinned host memory and sent; the
 * update's compressed bytes are copied back and dequantized on the GPU into d_out. The bytes
 * are identical to the host path's. d_out is written when the handle completes.
 */
PSAGG_API psagg_status psagg_push_pull_cuda(psagg_ctx *ctx, uint32_t key, const float *d_in,
                                            float *d_out, psagg_reduce op, int priority,
                                            void *stream, psagg_handle **handle);

/* 1 when the handle has completed (successfully or not), 0 otherwise. Never blocks. */
PSAGG_API int psagg_test(psagg_handle *handle);

/*
 * Wait until the handle completes or timeout_ms passes (-1: no limit). Returns the
 * operation's status, or PSAGG_ETIMEDOUT (the handle stays valid).
 */
PSAGG_API psagg_status psagg_wait(psagg_handle *handle, int timeout_ms);

/* Release a handle; waits for it first if it has not completed. */
PSAGG_API void psagg_release(psagg_handle *handle);

/*
 * Where one push_pull's time went, in nanoseconds. queued, encode, send, wait and the last
 * update's decode follow each other and add up to total; decode_ns also counts the decodes of
 * the earlier updates, done as each arrives (so inside wait: that part overlaps).
 */
typedef struct psagg_timing {
    size_t struct_size; /* sizeof(psagg_timing) (above) */
    uint64_t queued_ns; /* the call -> the communication thread took it */
    uint64_t encode_ns; /* -> every chunk encoded (waiting for its buffers or a device included) */
    uint64_t send_ns;   /* -> the last push handed to libfabric (waiting for window room too) */
    uint64_t wait_ns;   /* -> the last update arrived */
    uint64_t decode_ns; /* decoding every update into the output (a device's: until done) */
    uint64_t total_ns;  /* the call -> completed */
} psagg_timing;

/*
 * The timing of a push_pull that completed successfully (call before psagg_release).
 * PSAGG_EAGAIN while it runs; its own status (and *out zeroed) if it failed.
 */
PSAGG_API psagg_status psagg_handle_timing(psagg_handle *handle, psagg_timing *out);

/* Counters of this worker since psagg_init; differences between two calls give a step's.
 * PSAGG_EINVAL only for a NULL argument or a struct_size it does not know. */
typedef struct psagg_stats {
    size_t struct_size;      /* sizeof(psagg_stats) (above) */
    uint64_t bytes_sent;     /* payload bytes pushed to servers */
    uint64_t bytes_received; /* payload bytes of updates received */
    uint64_t bytes_raw;      /* fp32 bytes the same push_pulls would have sent uncompressed */
    uint64_t push_pulls;     /* completed operations */
    psagg_timing time;       /* sums over the completed operations */
    /* [server] quorum: chunk rounds that closed without this worker's push (a straggler's;
       each carried into its next push). Appended: a struct_size that ends before it is
       accepted, and it is then not filled. */
    uint64_t left_out;
} psagg_stats;
PSAGG_API psagg_status psagg_get_stats(const psagg_ctx *ctx, psagg_stats *out);

/*
 * Adaptive codecs ([codec] adaptive = on, conf/cluster.ini): every adaptive_interval rounds
 * the workers measure each maxmin tensor's bucket ranges, sum them through the servers and
 * all choose the same codec per tensor (bits 2..8, bucket, rounding) with the least
 * estimated error whose bytes fit adaptive_budget; it holds from 2 rounds later, on every
 * worker and server at once. Each new assignment is logged at info.
 *
 * psagg_get_assignment: tensor key's codec in the newest assignment (generation 0 is the
 * declared codec, before the first; tensors with a fixed codec always say generation 0).
 */
typedef struct psagg_assignment {
    size_t struct_size; /* sizeof(psagg_assignment) (above) */
    psagg_codec codec;
    uint64_t bytes;      /* encoded payload bytes of one push of the whole tensor */
    uint32_t generation; /* 0: the declared codec */
    uint32_t from_round; /* the tensor's first round in this codec */
} psagg_assignment;
PSAGG_API psagg_status psagg_get_assignment(const psagg_ctx *ctx, uint32_t key,
                                            psagg_assignment *out);
/*
 * The codec a push_pull that completed successfully went in (both ways) and its assignment's
 * generation (may be NULL); call before psagg_release. Errors as psagg_handle_timing.
 */
PSAGG_API psagg_status psagg_handle_codec(psagg_handle *handle, psagg_codec *codec,
                                          uint32_t *generation);

/*
 * Server-side optimizer ([server] optimizer = sgd | adam | adamw, conf/cluster.ini). A tensor
 * declared with PSAGG_TENSOR_PARAMETER is a model parameter whose fp32 master weights and
 * optimizer state live on the servers (each server its chunks); this worker keeps only the
 * weights it trains with. Every call below is collective: every worker makes it, for the same
 * tensor, in the same order (the servers fail the job, naming the workers, when they differ).
 *
 * psagg_param_init: the tensor's first operation (on a worker that joined a running job: a
 * PULL with sync of the servers' weights, matched by the members' psagg_pull_weights; see
 * psagg_sync_membership). Worker 0's `weights` (count floats) become
 * the servers' master weights, unless the servers resumed from a checkpoint ([server] resume),
 * whose weights win; on completion `weights` holds them on every worker (a broadcast, as DDP
 * does at construction), and psagg_get_tensor_round says which step the tensor is at.
 *
 * psagg_push_pull on a parameter: `in` is this worker's gradient and `out` the weights, which
 * must stay the buffer psagg_param_init filled and must not be written by anything else: the
 * servers sum the gradients (op AVERAGE divides by the workers), take one optimizer step with
 * the tensor's learning rate and weight decay, and `out` gets the weight delta in the
 * tensor's codec (out += delta), bit-identical on every worker; every [server] sync_interval
 * steps the exact weights instead. What a lossy codec drops from a delta is sent in later ones.
 *
 * DiLoCo (the outer step on the servers) is this path too: run the servers with [server]
 * optimizer = sgd, momentum = 0.9 and nesterov = on; psagg_param_init an `anchor` buffer (the
 * global weights; copy it into the model's weights), take H local optimizer steps without
 * psagg, then psagg_set_lr(outer lr) and psagg_push_pull(anchor - weights, anchor,
 * PSAGG_AVERAGE) for every tensor, wait, and copy the anchor into the weights
 * (worker/examples/train_digits.c --diloco H; psagg.torch.DiLoCo in Python).
 *
 * psagg_set_lr: the learning rate and weight decay of the following push_pulls of tensor key
 * (PSAGG_ALL_KEYS: every parameter); they start at [server] lr and weight_decay. Every worker
 * must set the same values (learning-rate schedules live in the training script).
 *
 * psagg_set_param_sync: the following push_pulls of parameter key (PSAGG_ALL_KEYS: every
 * parameter) carry `tag`, which must be the same on every worker (the job fails naming both
 * workers' tags otherwise; DiLoCo passes fragment << 24 | the inner step, so workers that
 * disagree on the schedule are caught), and count with `weight` (in (0, 1e9]; 1 at first) in
 * a PSAGG_AVERAGE: the servers divide the sum by the sum of the workers' weights instead of
 * their number. A worker that scales its gradient by its weight (e.g. the samples it took)
 * gets the weighted mean.
 *
 * psagg_pull_weights: `out` receives the servers' exact fp32 master weights. With sync = 1,
 * `out` must be the tensor's weights buffer: the workers hold the master weights from then on
 * (the deltas the codec dropped are no longer owed); with sync = 0 it is any buffer, e.g. to
 * measure how far the weights trained with are from the master weights.
 *
 * psagg_checkpoint: every server writes its parameters' master weights, the workers' weights
 * and the optimizer state to [server] checkpoint_dir (psagg-server-<rank>.ckpt, checksummed);
 * returns once all have, or with the first server's reason. Call it between steps, with no
 * operation of this worker in flight (PSAGG_EINVAL otherwise); any one worker may call it,
 * but with [server] quorum every worker calls it at the same step (rounds may close without a
 * worker, so only then are all chunks between the same two rounds): the servers write it once
 * all have, and fail the call (PSAGG_ETIMEDOUT, naming who did not) after op_timeout_ms.
 * Servers started with [server] resume = on load it; psagg_param_init then returns its weights.
 */
#define PSAGG_ALL_KEYS UINT32_MAX
PSAGG_API psagg_status psagg_param_init(psagg_ctx *ctx, uint32_t key, float *weights,
                                        psagg_handle **handle);
PSAGG_API psagg_status psagg_set_lr(psagg_ctx *ctx, uint32_t key, float lr, float weight_decay);
PSAGG_API psagg_status psagg_set_param_sync(psagg_ctx *ctx, uint32_t key, uint32_t tag,
                                            float weight);

/* The servers' [server] optimizer settings (every server runs the same; their WELCOME says). */
typedef struct psagg_server_optim {
    size_t struct_size; /* sizeof(psagg_server_optim) */
    const char *kind;   /* "none", "sgd", "adam" or "adamw" (static) */
    float momentum;     /* sgd */
    float dampening;    /* sgd */
    float beta1;        /* adam, adamw */
    float beta2;        /* adam, adamw */
    float eps;          /* adam, adamw */
    int nesterov;       /* sgd: 1 on */
    uint32_t sync_interval;
} psagg_server_optim;
PSAGG_API psagg_status psagg_get_server_optim(const psagg_ctx *ctx, psagg_server_optim *out);
PSAGG_API psagg_status psagg_pull_weights(psagg_ctx *ctx, uint32_t key, float *out, int sync,
                                          psagg_handle **handle);
PSAGG_API psagg_status psagg_checkpoint(psagg_ctx *ctx);
/* The round (for a parameter: the optimizer step) the tensor's next push_pull is. */
PSAGG_API psagg_status psagg_get_tensor_round(const psagg_ctx *ctx, uint32_t key, uint32_t *round);
PSAGG_API psagg_status psagg_tensor_round(psagg_ctx *ctx, uint32_t key, uint32_t *round)
    PSAGG_DEPRECATED(psagg_get_tensor_round);

PSAGG_API int psagg_rank(const psagg_ctx *ctx);
/* The job's worker ranks, whether they are all alive or not: [cluster] workers, or in an
   elastic job max_workers (ranks from `workers` on join it while it runs). */
PSAGG_API int psagg_world_size(const psagg_ctx *ctx);

/*
 * Elastic membership ([cluster] elastic = on, conf/cluster.ini): a worker that dies leaves the
 * job and the others go on. The membership as this worker knows it: it changes between two
 * calls when server 0 announces a new epoch (the comm thread takes it as it comes). A training
 * loop re-shards its data when `epoch` changes: this worker is `rank` of `size` live workers.
 * Updates of an AVERAGE are divided by the workers each one summed (the live ones). In a job
 * that is not elastic, epoch is 0, rank psagg_rank and size psagg_world_size, always.
 * PSAGG_EINVAL only for a NULL argument or a struct_size it does not know.
 */
typedef struct psagg_membership {
    size_t struct_size; /* sizeof(psagg_membership) (above) */
    uint32_t epoch;     /* 0 for the workers that started the job, +1 per change */
    int rank;           /* this worker's rank among the live workers, 0..size-1 */
    int size;           /* the live workers */
    int elastic;        /* 1 if the job is elastic */
    int joined;         /* workers the last barrier admitted (this one's admission included) */
    int joiner;         /* 1 if this worker joined the running job */
} psagg_membership;
PSAGG_API psagg_status psagg_get_membership(const psagg_ctx *ctx, psagg_membership *out);

/*
 * Joins ([cluster] elastic): a worker started with the rank of one that left (the launchers'
 * --restarts) joins the running job. Its psagg_init and psagg_declare are as at the start (the
 * same tensors, checked); psagg_declare returns once server 0 has admitted it, at the
 * members' next barrier, with every tensor at the members' round; its error-feedback
 * residuals start at zero.
 *
 * psagg_sync_membership: the barrier where joiners are admitted (torchft's per-step quorum).
 * Every member calls it at the same points, between steps, with no operation in flight
 * (PSAGG_EINVAL otherwise); when nobody waits to join it returns at once (one round trip to
 * server 0), else once every member is in it. With [codec] adaptive it first waits for this
 * worker's statistics pushes to be summed and solved (after a statistics round: one more round
 * trip and the solve), so that a joiner takes the same codec assignments from every member. `out`
 * (may be NULL) is the membership after it: out->joined > 0 says that workers were admitted, and
 * then every worker, the joiners included, takes the model state from where it lives: with the
 * optimizer on the servers, every member calls psagg_pull_weights(sync = 1) on every parameter and
 * each joiner psagg_param_init (which pulls them too: the weights are bit-identical everywhere
 * after). In a job that is not elastic it returns at once.
 */
PSAGG_API psagg_status psagg_sync_membership(psagg_ctx *ctx, psagg_membership *out);
/*
 * psagg_broadcast: root's `len` bytes at `buf` end up in every caller's `buf`. Collective and
 * blocking: every live worker calls it, with the same key, len and root, between its other
 * uses of the key (the key has nothing else in flight; other keys may). root is a worker rank,
 * 0..psagg_world_size()-1, as psagg_rank() says it (in an elastic job: a live one); root's
 * buf is only read. Every other caller's buf (len bytes) is written; buf may be NULL when len
 * is 0. len is at most PSAGG_BROADCAST_MAX; a caller that does not know it learns it first
 * with a broadcast of 8 bytes (the Python package's Context.broadcast does).
 *
 * key: a declared fp32 tensor that is not a parameter, typically one declared with
 * PSAGG_TENSOR_RARE for this use (psagg.torch declares one); any element count. The bytes go
 * through push_pulls (SUM) of that tensor: 3 bytes per element, as an integer below 2^24 that
 * root pushes and the others push as 0 (a sum that is exact in fp32), in as many rounds of
 * the key as they take; like every push and update they carry a MAC under [cluster]
 * data_auth. Ahead of the bytes go 26 elements of header: root's len and rank, and from every
 * caller its own len and root, so that callers that disagree are found by the first round(s)
 * (the same sums on every worker, so every caller fails alike and at the same round, and the
 * key stays usable): PSAGG_EMISMATCH naming this worker's and root's len and root, or
 * PSAGG_EPEER when no caller was root (root left the job, or is not calling).
 *
 * Errors: PSAGG_EINVAL for a bad argument, named (ctx, key, root, buf, len), before anything is
 * sent; PSAGG_EPEER when workers left an elastic job during the call (an update summed fewer
 * workers than the first round: root's bytes may be missing, so every caller fails, and may
 * call again); with [server] quorum, a round that closes without root's push fails the job on
 * every caller, and one that closes without another caller's fails it on that caller
 * (PSAGG_EPROTO naming whose: a broadcast cannot carry a push to a later round); otherwise as
 * psagg_push_pull's. On a failure the callers' buf holds nothing defined.
 */
#define PSAGG_BROADCAST_MAX ((uint64_t)1 << 40)
PSAGG_API psagg_status psagg_broadcast(psagg_ctx *ctx, uint32_t key, void *buf, size_t len,
                                       int root);
/* [codec] min_compress_elems: tensors declared with PSAGG_CODEC_DEFAULT and fewer elements go
 * fp32. Bindings that pick codecs per tensor apply the same rule. */
PSAGG_API uint64_t psagg_min_compress_elems(const psagg_ctx *ctx);

/* Tell the servers this worker is done and free everything. Pending handles fail. With
 * [cluster] server_replicas >= 1 it first waits until every worker of the job is done (or the
 * job fails): until then a server's death may need this worker's last pushes again. */
PSAGG_API psagg_status psagg_close(psagg_ctx *ctx);

/* Give up: the training loop failed. Every server hears `why` (the job fails at once, every
 * other worker naming this one and `why`), pending handles fail, and the context is freed as
 * psagg_close frees it, without waiting for the others. NULL why: "no reason given". */
PSAGG_API psagg_status psagg_abort(psagg_ctx *ctx, const char *why);

#ifdef __cplusplus
}
#endif
#endif /* PSAGG_H */
