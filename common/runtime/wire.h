/*
 * runtime/wire.h - psagg's wire protocol: the TCP control channel and the libfabric data
 * messages. Layer: runtime (runtime/channel.c reads and writes the frames, runtime/message.c
 * builds and checks the data headers).
 *
 * Every field is fixed-width little-endian (psagg only runs on little-endian hosts; codec.h
 * refuses to build elsewhere), structs have no implicit padding (checked below), and every
 * length, count and index read from a peer is checked before use by the reader.
 *
 * CONTROL CHANNEL (TCP, one connection from each worker to each server)
 *   frame = psagg__ctl_hdr { u32 magic 'PSGC', u16 type, u16 version, u32 len } + len bytes.
 *   0. server -> worker  CHALLENGE psagg__ctl_challenge, as soon as it accepts the connection:
 *                                 16 random bytes for this connection only
 *   1. worker -> server  HELLO    psagg__ctl_hello: the protocol version is checked first, then
 *                                 the token (runtime/auth.h), which binds the whole HELLO to
 *                                 this server's rank and this connection's challenge, so a
 *                                 recorded HELLO is worth nothing on another connection or at
 *                                 another server; before it checks out the server reveals
 *                                 nothing about the job, and a connection that does not send
 *                                 a whole HELLO within a few seconds is closed
 *   2. server -> worker  WELCOME  psagg__ctl_welcome (server rank, its session nonce, its
 *                                 libfabric provider and fabric name; whether it copies this
 *                                 worker's pushes on the host, below), with a token binding it
 *                                 to that HELLO: the worker knows the server has the secret
 *      or                ERROR    psagg__ctl_error, then close
 *   3. worker -> server  DECLARE  psagg__ctl_declare + count x psagg__ctl_tensor (all tensors,
 *                                 with an adaptive job's statistics tensor last; whether the
 *                                 worker copies this server's updates on the host)
 *   4. server -> worker  READY    once all workers declared identical lists (no body; in an
 *                                 elastic job server 0's carries psagg__ctl_membership of
 *                                 epoch 0: the starting workers, those that declared there),
 *      or                ERROR    naming the first differing tensor and the workers
 *      elastic jobs: worker -> server s > 0 START, server 0's READY body relayed unchanged
 *                                 before waiting for that server's READY: a server that has
 *                                 not heard of a starting worker that died after its HELLO
 *                                 to server 0 starts without it, as server 0 did
 *   5. data flows over libfabric (below) ...
 *   6. worker -> server  BYE      (no body): clean shutdown; the server exits when all are gone
 *      server -> worker  ABORT    psagg__ctl_error: another peer failed; pending work fails
 *   any time after READY, an elastic job ([cluster] elastic):
 *      server 0 -> worker MEMBERSHIP psagg__ctl_membership + live[]: a worker left or workers
 *                                 joined (below);
 *      worker -> server s > 0     the same frame, relayed unchanged
 *      worker -> server 0 SYNC    psagg__ctl_sync + n_tensors x psagg__ctl_tensor_state + the
 *                                 codec assignments (below): this worker is between steps (no
 *                                 operation in flight; in an adaptive job its statistics push
 *                                 and their solve are done too); barrier `seq`
 *                                 (psagg_sync_membership, psagg.h)
 *      server 0 -> worker SYNC_DONE psagg__ctl_sync_done + n_tensors x psagg__ctl_tensor_state +
 *                                 the codec assignments: barrier `seq` passed; when it
 *                                 admitted joiners (joined > 0) every member waited in it and
 *                                 got the new epoch's MEMBERSHIP first; the states and the
 *                                 assignments are the members' (a joiner starts each tensor
 *                                 at that round, with those assignments)
 *   joining a running elastic job (its WELCOMEs say PSAGG_WELCOME_JOINING; the rank must be
 *   one that left the job): HELLO, WELCOME and DECLARE to every server as above (READY once
 *   the declaration equals the job's), then
 *      worker -> server 0 JOIN    (no body); server 0 admits it at the members' next SYNC
 *                                 barrier: MEMBERSHIP (an epoch with it live), then SYNC_DONE
 *   any time after READY, a job with [server] optimizer:
 *      worker -> server  CHECKPOINT psagg__ctl_checkpoint, phase PREPARE: write this server's
 *                                 optimizer state now, as <file>.pending
 *      server -> worker  CHECKPOINT_DONE psagg__ctl_error: status 0 and the file written, or
 *                                 why not; the requester has no operation in flight, so every
 *                                 parameter chunk is between two rounds (server/param.c)
 *      worker -> server  CHECKPOINT phase COMMIT, the same sequence, once every server asked
 *                                 answered the PREPARE with status 0: the pending file becomes
 *                                 the current one (the current one <file>.prev)
 *      server -> worker  CHECKPOINT_DONE psagg__ctl_error: status 0 and the file, or why not
 *
 * DATA MESSAGES (libfabric FI_EP_RDM send/recv)
 *   psagg__msg_hdr + payload (the encoded chunk, codec.h format, exactly hdr.len bytes)
 *   [+ 16-byte MAC of header and payload when the job runs with data_auth: runtime/auth.h].
 *   A receiver accepts a message only from the fabric address of the peer that sent it on
 *   the control channel: pushes from the worker that `sender` names, updates from the chunk's
 *   owner; anything else is dropped and logged with its source.
 *   PUSH   worker -> owner server of (key, chunk): this worker's contribution for `round`
 *   UPDATE server -> every worker: the requantized sum of `round`, identical bytes for all
 *          (a parameter tensor's: the weight delta of that round's optimizer step)
 *   WEIGHTS server -> every worker: a parameter tensor's exact fp32 weights (below)
 *   Rounds count from 0 per tensor key; a push for an older round is stale (rejected), a
 *   second push of the same (round, worker) is a duplicate (dropped), a push for a newer round
 *   than the one being collected is a protocol error.
 *   Field codec names the payload's codec and the codec assignment's generation
 *   (psagg__msg_codec_word, runtime/message.h). A tensor with a fixed codec carries its
 *   declared codec and generation 0. In a job with [codec] adaptive, a compressed tensor's
 *   codec may change between rounds (runtime/adaptive.h): round r is of generation
 *   psagg__adapt_generation(r, interval) on every worker and server, so a push of another
 *   generation (a worker with a stale assignment) closes that worker, and pushes of one round
 *   that name different codecs fail the job; an update carries the round's codec too.
 *   Field summed of an update is the number of workers whose pushes the round summed (an
 *   AVERAGE divides by it); in a static job it is always the number of workers.
 *
 * STRAGGLER TOLERANCE ([server] quorum, grace_ms; server/aggregate.c)
 *   A round of a gradient (a sum chunk, or a parameter's GRAD) closes when every live worker
 *   pushed, or grace_ms after `quorum` of them had, without the rest. It leaves out only a
 *   worker whose push of the chunk's previous round reached the server (on time or late), so
 *   no worker is ever more than one round behind: a worker holds at most one early update
 *   per chunk. Every UPDATE and WEIGHTS then carries, after its payload (inside the MAC, not
 *   in len), a bitmap of ceil(workers / 8) bytes: bit w (byte w / 8, bit w % 8) set when
 *   worker w's push is in the sum; as many bits as `summed`. A worker left out adds its push
 *   back into its error-feedback residual (a carry buffer without one), so its next push holds
 *   it; its push, when it comes, is stale and dropped. An update that comes before the
 *   worker's own push of that round (or before it even started it) waits at the worker; the
 *   push is then encoded as always (so the residual moves), added back, and not sent.
 *   With server replicas too, every PUSH also ends with a bitmap of ceil(workers / 8) bytes
 *   (after its payload, inside the MAC, not in len): the bitmap of the update of the chunk's
 *   round before this push's, as this worker applied it, or zeros when it has none (round 0).
 *   A chunk's copy steps round r with exactly the pushes the first such bitmap of r names, in
 *   the fixed order (so its state stays its owner's, bit for bit), never closing a round on
 *   its own clock; a push it leaves out is late there too; two pushes whose bitmaps of one
 *   round differ close the second's sender (field trailer).
 *   Elastic workers with server replicas (no quorum) do the same (WELCOME flag FOLLOW): every
 *   UPDATE and WEIGHTS ends with the bitmap of the members whose pushes its owner summed, and
 *   every PUSH with the trailer. A worker sends a chunk with copies to each copy first and to
 *   its owner only once those sends are done, so a worker that dies between two sends leaves
 *   its push on a copy and not on the owner (which sums the round without it, and its copies
 *   let it go), not the other way round. A copy whose bitmap names the push of a worker that
 *   left and never reached it is stale: it steps no more, and its server fails the job
 *   naming the chunk should a view hand it the chunk.
 *
 * ELASTIC MEMBERSHIP ([cluster] elastic; server/membership.c)
 *   Server 0 alone decides who is a member: when it loses a worker (closed connection, its
 *   ABORT, silence for 3 PING intervals, a bad message) it starts the next epoch without it and
 *   sends MEMBERSHIP to the live workers, which relay it to the other servers. A server that
 *   loses a worker itself closes it and waits for server 0's epoch (the worker, having lost a
 *   server, gives up and so leaves server 0 too). When a server applies an epoch, each of its
 *   rounds stops waiting for the workers that left: a push of theirs already received still
 *   counts (even in a round the others started after they learned of the epoch: the leaver
 *   may have been a round ahead), and the update's `summed` says how many did. Pushes from
 *   non-members are dropped. A joiner relays only its admitting epoch and the later ones, so a
 *   server > 0 keeps a joiner's copy that comes before the epochs between until they come.
 *   Every server applies the same epochs in the same order; only when each applies them
 *   differs, which is why a round in flight at a death may sum the dead worker on one chunk
 *   and not on another (each update says which it did).
 *   With [cluster] server_replicas there are no MEMBERSHIP frames: the coordinator of the
 *   server view decides, and each membership change is the next view (its member bytes, AGREE
 *   frames below), accepted by a majority of the members of the view before it.
 *
 * PARAMETER TENSORS (declared with PSAGG_DECL_PARAM; the servers run [server] optimizer)
 *   Every push of a parameter tensor ends with a psagg__msg_param trailer (inside len, before
 *   any MAC). Its kind says what the push is; all workers' pushes of one round must carry the
 *   same trailer (else the job fails: the workers disagree):
 *   GRAD  body: the gradient in the tensor's codec. The server sums the round's pushes, steps
 *         the optimizer on its fp32 master weights and sends an UPDATE: the delta between them
 *         and the weights every worker holds, in the tensor's codec (the server keeps those
 *         weights too, so what the codec drops is sent in later rounds); or, every
 *         sync_interval steps, WEIGHTS. The round then counts up.
 *   INIT  body: the chunk's fp32 weights from worker 0, nothing from the others; `round` 0.
 *         The first push of a parameter tensor. When all are in, WEIGHTS of the weights
 *         every worker now holds (worker 0's, or a restored checkpoint's), whose `round`
 *         field is the chunk's round (0, or the checkpoint's): the workers go on from there.
 *   PULL  no body; `round` is the chunk's round. When all are in, WEIGHTS of the exact master
 *         weights; with PSAGG_PARAM_SYNC the workers hold them from then on.
 *   INIT and PULL do not count a round, unless the job has [cluster] server_replicas: then
 *   every operation counts one (the worker's psagg_get_tensor_round still counts steps).
 *   With server replicas a worker sends each push of a parameter chunk (and, when the servers
 *   keep a residual, PSAGG_WELCOME_RESIDUAL, of every chunk) to the chunk's owner and then,
 *   sealed again for each, to its copies: the servers live since the start among the R after
 *   its layout owner on the ring (a view's PSAGG_VIEW_LIVE), which run the same rounds and
 *   send nothing.
 *
 * SAME-HOST COPIES (runtime/transport.h; [cluster] local_copy)
 *   HELLO and WELCOME offer the sender's pid, the address in its memory of a random secret
 *   followed by its fabric name, and the secret's hash (local_pid, local_probe, local_commit;
 *   0 without). The receiver of an offer takes it when that pid lives in its own network
 *   namespace and holds, at that address, a secret with that hash and exactly the fabric name
 *   the peer gave (the secret never leaves the offering process, so no other process holds it,
 *   and the token authenticates the offer with the rest of the frame): it can then read the
 *   peer's memory, and says so (WELCOME: the server copies this
 *   worker's pushes; DECLARE: the worker copies this server's updates; PSAGG_LOCAL_READS).
 *   To such a reader a data message of at least PSAGG_LOCAL_MIN bytes travels as a
 *   psagg__msg_local DESC naming where it lies in the sender's memory; the reader copies it into
 *   its receive buffer (process_vm_readv), where it is an ordinary data message from then on,
 *   and answers ACK with the DESC's cookie, only then is the send complete. A DESC or ACK from
 *   a peer whose offer was not taken is an ordinary (bad) data message.
 */
#ifndef PSAGG_RUNTIME_WIRE_H
#define PSAGG_RUNTIME_WIRE_H

#include <stdint.h>
#include <string.h>

/*
 * 3: codec format version 2 (kernels/codec.h), whose stochastic rounding draws other bits;
 * 4: HELLO and WELCOME name the libfabric provider each side opened;
 * 5: DECLARE carries the adaptive settings, data headers the codec and its generation;
 * 6: tensors carry flags (parameters), WELCOME the optimizer, pushes of parameters a trailer;
 * 7: same-host copies (HELLO, WELCOME and DECLARE offer and take them; psagg__msg_local)
 * 8: the CHALLENGE; HELLO and WELCOME tokens over the whole frame; same-host offers commit
 *    to a secret
 * 9: parameter push trailers carry a tag (equal on all workers) and a weight (the AVERAGE's)
 * 10: elastic membership: MEMBERSHIP frames; data headers carry the epoch and, in updates, the
 *     workers summed
 * 11: joins (SYNC, SYNC_DONE, JOIN); 12: [server] quorum's contributor bitmaps
 * 13: tensors declared rare (PSAGG_DECL_RARE) are placed apart from the per-round load, so
 *     a layout differs from 12's; an elastic job's READY from server 0 names the starting
 *     workers, which the workers relay (START)
 * 14: SYNC and SYNC_DONE carry the codec assignments a worker keeps ([codec] adaptive:
 *     fields adapt_gens, adapt_tensors and the block after the tensor states), so that a
 *     joiner takes the members' (joins into an adaptive job)
 * 15: servers that fail ([cluster] server_replicas): SERVER_LOST, AGREE and VIEW; the push
 *     header's epoch is the view's in such a job
 * 16: servers that rejoin: HELLO's PSAGG_HELLO_REJOIN, SERVER_BACK; a view carries every
 *     chunk's owner (a server that rejoins takes the whole view from it)
 * 17: parameter chunks with server replicas: a worker pushes a parameter chunk to its owner,
 *     then to each of its copies (the other servers of the view that hold its state); every
 *     parameter operation (INIT, PULL too) counts a round; a view's live[] byte 2 (a server
 *     that came back without parameter state)
 * 18: CHECKPOINT carries a sequence and a phase (checkpoints in two phases)
 * 19: the thc codec (id 5, kernels/thc.h): an update's length depends on the workers it summed
 *     (psagg__update_size), so an update is as long as its `summed` says
 * 20: DONE: with server replicas, psagg_close waits until every worker has its last updates
 * 21: STATE: a server that comes back receives its chunks' state
 * 22: a view's move names the rounds whose update a worker already has (relay_end, relayer),
 *     and STATE RELAY carries them to the chunk's new owner, which sends those bytes
 * 23: a view carries the member workers (elastic jobs with replicas decide their membership
 *     epochs as views), and its header their count
 * 24: with [server] quorum and server replicas every PUSH ends with the contributor bitmap of
 *     the chunk's round before (a copy steps its rounds with its owner's contributors), and a
 *     view's move of a chunk with copies names the rounds its copy follows (relayer FOLLOW)
 * 25: elastic workers with server replicas too (WELCOME flag FOLLOW): their updates carry the
 *     contributor bitmap, their pushes the trailer, and a push goes to the copies first; a
 *     HELLO_REJOIN names the members (a server that comes back waits for them, not for the
 *     job's starting workers)
 * 26: a SYNC's tensor state carries the tensor's pulls (its parameter INIT and PULL rounds,
 *     which count a round with server replicas): a joiner takes them with the rounds
 * 27: thc's sums go down 4 bits wide when they fit (kernels/thc.h: W (2^b - 1) <= 15, thc2 up
 *     to 5 workers), so such an update is half as long as before
 */
#define PSAGG_PROTO_VERSION 27
#define PSAGG_CTL_MAGIC     0x43475350u /* "PSGC" */
#define PSAGG_MSG_MAGIC     0x4D475350u /* "PSGM" */
#define PSAGG_JOB_ID_MAX    64
#define PSAGG_NAME_MAX      64  /* tensor names, including the NUL */
#define PSAGG_EPNAME_MAX    256 /* libfabric endpoint names */
#define PSAGG_CTL_MAX_FRAME (64u << 20)
#define PSAGG_MAX_TENSORS   (1u << 20)
/* with data_auth, after a data message's payload: its number and its tag (runtime/auth.h) */
#define PSAGG_MSG_SEQ_BYTES 8
#define PSAGG_MSG_TAG_BYTES 16
#define PSAGG_MSG_MAC_BYTES (PSAGG_MSG_SEQ_BYTES + PSAGG_MSG_TAG_BYTES)

enum psagg__ctl_type {
    PSAGG_CTL_HELLO = 1,
    PSAGG_CTL_WELCOME = 2,
    PSAGG_CTL_DECLARE = 3,
    PSAGG_CTL_READY = 4,
    PSAGG_CTL_ERROR = 5,
    PSAGG_CTL_BYE = 6,
    PSAGG_CTL_ABORT = 7,
    PSAGG_CTL_PING = 8, /* no body: "still here", both ways while the job runs */
    PSAGG_CTL_CHECKPOINT = 9,
    PSAGG_CTL_CHECKPOINT_DONE = 10,
    PSAGG_CTL_CHALLENGE = 11,
    PSAGG_CTL_MEMBERSHIP = 12,
    PSAGG_CTL_SYNC = 13,      /* worker -> server 0: psagg__ctl_sync (elastic: the join barrier) */
    PSAGG_CTL_SYNC_DONE = 14, /* server 0 -> worker: psagg__ctl_sync_done + tensor states */
    PSAGG_CTL_JOIN = 15,      /* joiner -> server 0 (no body): declared everywhere, admit me */
    PSAGG_CTL_START = 16,     /* worker -> server s > 0 (elastic): server 0's READY, relayed */
    PSAGG_CTL_SERVER_LOST = 17, /* worker -> the coordinator: psagg__ctl_server_lost + rounds */
    PSAGG_CTL_AGREE = 18,       /* coordinator <-> worker: psagg__ctl_agree + a view */
    PSAGG_CTL_VIEW = 19,        /* worker -> the other servers: a decided view, relayed */
    PSAGG_CTL_SERVER_BACK = 20, /* worker <-> the coordinator: a server rejoins (below) */
    PSAGG_CTL_DONE = 21,        /* worker <-> server (no body): the end of a job (below) */
    PSAGG_CTL_STATE = 22,       /* server -> worker -> server: chunk state for a return (below) */
};

typedef struct psagg__ctl_hdr {
    uint32_t magic;
    uint16_t type;
    uint16_t version;
    uint32_t len; /* body bytes after this header, <= PSAGG_CTL_MAX_FRAME */
} psagg__ctl_hdr;
_Static_assert(sizeof(psagg__ctl_hdr) == 12, "psagg__ctl_hdr layout");

/*
 * A provider name as HELLO and WELCOME carry it: each side compares the other's with its own,
 * since "tcp" opens the best TCP provider each host's libfabric has (runtime/transport.c) and
 * two different ones cannot talk.
 */
#define PSAGG_PROVIDER_MAX 32

#define PSAGG_CHALLENGE_BYTES 16
typedef struct psagg__ctl_challenge {
    uint8_t challenge[PSAGG_CHALLENGE_BYTES]; /* random, for one connection */
} psagg__ctl_challenge;
_Static_assert(sizeof(psagg__ctl_challenge) == 16, "psagg__ctl_challenge layout");

/* psagg__ctl_hello.flags / psagg__ctl_welcome.flags */
#define PSAGG_HELLO_DATA_AUTH 1u /* data messages carry a MAC ([cluster] data_auth) */
/* HELLO only: the job runs and has lost this server, which was restarted: it rejoins
   ([cluster] server_replicas; SERVER_BACK below). Not compared with the server's flags. */
#define PSAGG_HELLO_REJOIN 2u
/* WELCOME only: the job is running (elastic): this worker joins it (DECLARE, JOIN, SYNC_DONE) */
#define PSAGG_WELCOME_JOINING 0x100u
/* WELCOME only: the servers run [server] quorum: every UPDATE and WEIGHTS ends with the
   contributor bitmap (DATA MESSAGES, below) */
#define PSAGG_WELCOME_QUORUM 0x200u
/* WELCOME only: the servers keep a residual ([server] error_feedback): with server replicas a
   worker pushes every chunk to its copies too (below) */
#define PSAGG_WELCOME_RESIDUAL 0x400u
/* WELCOME only: the servers' copies follow their owner (server replicas with [server] quorum or
   elastic workers): every UPDATE and WEIGHTS ends with the contributor bitmap, every PUSH with
   the bitmap of its chunk's round before, and a chunk with copies goes to them before its
   owner (DATA MESSAGES, below) */
#define PSAGG_WELCOME_FOLLOW 0x800u

typedef struct psagg__ctl_hello {
    char job_id[PSAGG_JOB_ID_MAX]; /* NUL-terminated */
    uint32_t rank;
    uint32_t world_size;
    uint8_t auth[32];  /* psagg__hello_token (runtime/auth.h) of the rest; zero without a secret */
    uint32_t flags;    /* PSAGG_HELLO_*: must match the server's */
    uint8_t nonce[16]; /* the worker's session nonce (its data key) */
    char provider[PSAGG_PROVIDER_MAX]; /* the libfabric provider opened; NUL-terminated */
    uint32_t epname_len;               /* <= PSAGG_EPNAME_MAX */
    uint8_t epname[PSAGG_EPNAME_MAX];
    uint64_t local_probe;     /* same-host copies (above): where the secret and epname lie */
    uint32_t local_pid;       /* the worker's pid, or 0 */
    uint32_t members;         /* HELLO_REJOIN in an elastic job: the members the worker knows (its
                                 membership's), which the server waits for before its READY; else 0 */
    uint8_t local_commit[32]; /* the hash of that secret */
} psagg__ctl_hello;
_Static_assert(sizeof(psagg__ctl_hello) == 64 + 4 + 4 + 32 + 4 + 16 + 32 + 4 + 256 + 16 + 32,
               "psagg__ctl_hello layout");

/* psagg__ctl_welcome.local_flags / psagg__ctl_declare.local_flags */
#define PSAGG_LOCAL_READS 1u /* I copy your data messages out of your memory (above) */

/*
 * A server's [server] optimizer settings, as WELCOME carries them: every server of a job must
 * run the same (the worker compares them field by field); lr and weight decay come with each
 * push instead.
 */
typedef struct psagg__ctl_optim {
    uint32_t kind; /* psagg__optim_kind (kernels/optim.h) */
    uint32_t nesterov;
    float momentum, dampening, beta1, beta2, eps;
    uint32_t sync_interval;
} psagg__ctl_optim;
_Static_assert(sizeof(psagg__ctl_optim) == 32, "psagg__ctl_optim layout");

typedef struct psagg__ctl_welcome {
    uint32_t server_rank;
    uint32_t n_servers;
    uint32_t flags;                    /* the server's PSAGG_HELLO_* */
    uint8_t nonce[16];                 /* the server's session nonce (its data key) */
    char provider[PSAGG_PROVIDER_MAX]; /* the libfabric provider opened; NUL-terminated */
    psagg__ctl_optim optim;
    uint32_t epname_len;
    uint8_t epname[PSAGG_EPNAME_MAX];
    uint64_t local_probe;     /* same-host copies: where the secret and epname lie, or 0 */
    uint32_t local_pid;       /* the server's pid, or 0 */
    uint32_t local_flags;     /* PSAGG_LOCAL_READS: it copies this worker's pushes */
    uint8_t local_commit[32]; /* the hash of that secret */
    uint8_t auth[32];         /* psagg__welcome_token (runtime/auth.h); zero without a secret */
} psagg__ctl_welcome;
_Static_assert(sizeof(psagg__ctl_welcome) == 12 + 16 + 32 + 32 + 4 + 256 + 16 + 32 + 32,
               "psagg__ctl_welcome layout");

/* chunk_elems of a DECLARE: [worker] chunk_bytes is 4096..2^30 bytes of fp32 */
#define PSAGG_MIN_CHUNK_ELEMS 1024u
#define PSAGG_MAX_CHUNK_ELEMS (1u << 28)

/* psagg__ctl_declare.adapt_flags */
#define PSAGG_ADAPT_BUDGET_BITS 1u /* adapt_budget is average bits per element, not a fraction */
#define PSAGG_ADAPT_WORKER_EF                                                                      \
    2u /* the workers' error feedback is on: nearest rounding is a                                 \
          candidate */

typedef struct psagg__ctl_declare {
    uint32_t count;          /* tensors that follow, 1..PSAGG_MAX_TENSORS */
    uint32_t adapt_interval; /* [codec] adaptive_interval, 0 when adaptive is off */
    uint64_t chunk_elems;    /* elements per chunk, a multiple of 64 in PSAGG_MIN/MAX_CHUNK_ELEMS:
                                all workers must agree */
    uint32_t adapt_budget;   /* [codec] adaptive_budget x 10^6 */
    uint32_t adapt_flags;    /* PSAGG_ADAPT_* */
    uint32_t local_flags;    /* PSAGG_LOCAL_READS: this worker copies the server's updates */
    uint32_t reserved;       /* 0 */
} psagg__ctl_declare;
_Static_assert(sizeof(psagg__ctl_declare) == 32, "psagg__ctl_declare layout");

/* psagg__ctl_tensor.flags */
#define PSAGG_DECL_PARAM 1u /* a parameter: the servers run the optimizer on it (above) */
#define PSAGG_DECL_RARE  2u /* used now and then, not every round (runtime/layout.h) */

typedef struct psagg__ctl_tensor {
    char name[PSAGG_NAME_MAX]; /* NUL-terminated */
    uint64_t count;            /* fp32 elements, >= 1 */
    uint32_t codec;            /* psagg_codec_id */
    uint32_t bits;
    uint32_t bucket;
    uint32_t rounding;
    uint32_t flags; /* PSAGG_DECL_* */
    uint32_t k;     /* topk: entries kept per block; 0 for the other codecs */
} psagg__ctl_tensor;
_Static_assert(sizeof(psagg__ctl_tensor) == 64 + 8 + 24, "psagg__ctl_tensor layout");

/* CHECKPOINT's body (a two-phase write: server/checkpoint.c). */
enum { PSAGG_CKPT_PREPARE = 1, PSAGG_CKPT_COMMIT = 2 };
typedef struct psagg__ctl_checkpoint {
    uint64_t sequence; /* the checkpoint's, nonzero: the asking worker's CLOCK_REALTIME in ns */
    uint32_t phase;    /* PSAGG_CKPT_PREPARE or PSAGG_CKPT_COMMIT */
    uint32_t reserved; /* 0 */
} psagg__ctl_checkpoint;
_Static_assert(sizeof(psagg__ctl_checkpoint) == 16, "psagg__ctl_checkpoint layout");

typedef struct psagg__ctl_error {
    int32_t status; /* psagg_status */
    char msg[252];  /* NUL-terminated */
} psagg__ctl_error;
_Static_assert(sizeof(psagg__ctl_error) == 256, "psagg__ctl_error layout");

/*
 * MEMBERSHIP (elastic jobs, server/membership.c): server 0 -> every live worker, which relays
 * the frame unchanged to every other server. Epochs count from 0 (the workers that started
 * the job) and rise by one per change; `live` has one byte per worker rank (n_workers), 1 for
 * the members of this epoch. A frame of an epoch already applied must equal the applied one
 * byte for byte (else two relays disagree: the job fails naming them).
 */
typedef struct psagg__ctl_membership {
    uint32_t epoch;
    uint32_t n_workers; /* entries of live[] after this struct: the job's worker ranks */
    uint32_t n_live;    /* members of this epoch */
    int32_t left;       /* the worker this epoch removed, or -1: the new live ones joined */
    uint32_t flags;     /* PSAGG_MEMBERSHIP_DONE: `left` is done (said BYE): no failure */
    char why[236];      /* why it left, or who joined (NUL-terminated) */
} psagg__ctl_membership;
#define PSAGG_MEMBERSHIP_DONE 1u
_Static_assert(sizeof(psagg__ctl_membership) == 256, "psagg__ctl_membership layout");

/*
 * Servers that fail ([cluster] server_replicas; docs/design.md, "Servers that fail and join").
 * A view says which servers are live and which server owns each chunk; views move in epochs
 * (the push header's epoch field, as membership epochs do in an elastic job, which replicas
 * do not work with yet), each decided by runtime/agree.h among the workers. Epoch 0 is the
 * layout's. The coordinator is the lowest live server of the view (for a loss: but the one
 * lost).
 *   worker -> the coordinator SERVER_LOST: this worker lost server `server` (its control
 *                         connection closed, a push to it failed, or it was silent).
 *                         `rounds` has one u32 per chunk of the layout: the round of the next
 *                         update of it this worker takes (those of other servers' chunks too)
 *   the coordinator <-> worker AGREE: a message of the agreement (psagg__ctl_agree, then
 *                         value_len bytes of the view when the kind carries one); each worker
 *                         is an acceptor, the coordinator the proposer; once decided, the
 *                         coordinator sends AGREE DECIDED to every worker
 *   worker -> every other live server VIEW: the AGREE DECIDED it learned, relayed unchanged
 * A server that was lost and out of the view comes back (restarted: the workers connect to
 * it again, HELLO with PSAGG_HELLO_REJOIN, DECLARE, READY), in three steps, each a
 * SERVER_BACK (psagg__ctl_server_lost, field phase):
 *   worker -> the coordinator phase 0 (no rounds): server `server` is back here (READY)
 *   the coordinator -> worker phase 1 (no rounds), once every worker said phase 0: hold your
 *                         pushes of the chunks whose layout owner it is from now on
 *   worker -> the coordinator phase 1 with `rounds`: held; then the coordinator proposes the
 *                         view with the server live and those chunks moved back to it, from the
 *                         lowest round reported. A new view (this one or another) ends the hold.
 * A view (the value): psagg__view_hdr, n_servers bytes live[] (0: out; PSAGG_VIEW_LIVE: live
 * since the job started; PSAGG_VIEW_LIVE_NEW: live, but it came back into the job, without
 * the state of the parameter chunks it held: it owns and copies none) padded to 4, n_chunks
 * u16 owner[] (every chunk's owner in this epoch) padded to 4, then n_moves x
 * psagg__view_move: the chunks whose owner changed in this epoch, each with the round its new
 * owner starts at (the lowest next-update round any worker reported), and the rounds from
 * there up to relay_end (the highest next-update round reported) whose update some worker
 * has already: the owner before sent it to some workers only. The new owner does not sum those
 * rounds again (under a quorum no sum of the pushes could give the owner's bytes): it sends
 * the update the worker `relayer` (one that reported relay_end) relays to it, byte for byte,
 * once every worker has pushed the chunk in this view (a push with its epoch: the sign that
 * the worker took the view, before which an update from this server would be a stranger's);
 * the pushes of those rounds are dropped. A chunk with copies has relay_end = start (its
 * copy's state is the owner's, sum and all), except when copies follow (FOLLOW): there its rounds
 * start .. relay_end - 1 are ones some worker has the update of, which its copy steps with the
 * bitmap the workers' pushes of the next round carry (above), and relayer is
 * PSAGG_VIEW_FOLLOW (nothing is relayed). Last, n_workers bytes member[]: 1 for the
 * workers that are members in this epoch (all of them in a static job). In an elastic job with
 * replicas every membership change is a view (MEMBERSHIP frames are not used): a member lost
 * or done leaves, and joiners are admitted, by a view without moves; its acceptors are the
 * members of the view before (a majority of them decides it).
 * A server that held state of a chunk with copies (a parameter's, or any with a server residual)
 * receives it before the view admits it, relayed by one worker (the lowest the coordinator
 * reaches), in STATE frames (psagg__ctl_state, field kind):
 *   the coordinator -> worker ASK, once every worker said phase 1 (the hold covers those chunks
 *                         too): relayed unchanged to every live server of the view
 *   server -> worker CHUNK: for each chunk it owns of which the returning server holds state (its
 *                         layout owner or one of the server_replicas after it), that state at
 *                         the chunk's round there, taken between two rounds: `arrays` binary32
 *                         arrays of the chunk's count (a parameter's w, view and optimizer state;
 *                         a server residual), then out_len bytes of the last round's update
 *                         (header, payload): relayed unchanged to the returning server
 *   server -> worker DONE, from the returning server once it holds every such chunk (field
 *                         chunk: how many): relayed to the coordinator, which proposes the view
 *                         with it PSAGG_VIEW_LIVE (its chunks moved back, state and all). Without
 *                         DONE within op_timeout_ms it is PSAGG_VIEW_LIVE_NEW instead.
 * A view's relayed rounds (psagg__view_move relay_end > start), in STATE frames too:
 *   worker -> server RELAY, from the move's relayer once it took the view, to the chunk's new
 *                         owner: one per round from start to relay_end - 1 (field round; epoch:
 *                         the view), out_len bytes of that round's update as it applied it
 *                         (header, payload, the quorum bitmap; no MAC), or out_len 0: it has it
 *                         no more (no memory kept it): nobody else has it, and the new owner
 *                         fails the job naming the chunk and round. ([worker] chunk_bytes is
 *                         bounded with server_replicas so that an update fits in a frame.)
 * The end of the job (psagg_close), since a worker's last pushes may be needed after it has
 * its last updates (a server that dies after sending some workers a round's update but not
 * others: the new owner sums that round again from every worker's kept push):
 *   worker -> every live server of its view DONE (no body): this worker is closing; it keeps
 *                         its pushes and answers views until ...
 *   server -> worker DONE (no body): every worker of the job said DONE (or BYE) here. Then it
 *                         says BYE. A server that joins the view meanwhile is sent DONE too.
 */
typedef struct psagg__ctl_server_lost {
    uint32_t server;   /* the server lost */
    uint32_t epoch;    /* the view this worker is in */
    uint32_t n_chunks; /* rounds[] that follow: the layout's chunks, or 0 (SERVER_BACK phase 0) */
    uint32_t phase;    /* SERVER_BACK's step (above); 0 in SERVER_LOST */
} psagg__ctl_server_lost;
_Static_assert(sizeof(psagg__ctl_server_lost) == 16, "psagg__ctl_server_lost layout");

enum { PSAGG_STATE_ASK = 1, PSAGG_STATE_CHUNK = 2, PSAGG_STATE_DONE = 3, PSAGG_STATE_RELAY = 4 };
#define PSAGG_STATE_AWAITING_INIT 1u /* a parameter chunk whose INIT round has not come */
#define PSAGG_STATE_RESTORED      2u /* its state came from a checkpoint (INIT keeps it) */
typedef struct psagg__ctl_state {
    uint32_t kind;    /* PSAGG_STATE_* */
    uint32_t server;  /* the server that comes back (RELAY: the chunk's new owner) */
    uint32_t epoch;   /* the view it comes back after (RELAY: the view that moved the chunk) */
    uint32_t chunk;   /* CHUNK, RELAY: index in the layout; DONE: chunks installed */
    uint32_t round;   /* CHUNK: the chunk's round; RELAY: the update's */
    uint32_t flags;   /* CHUNK: PSAGG_STATE_* flags */
    uint64_t step;    /* CHUNK: a parameter's optimizer steps */
    uint32_t arrays;  /* CHUNK: binary32 arrays of the chunk's count that follow */
    uint32_t out_len; /* CHUNK: bytes of the last round's update after them (0: none); RELAY:
                         bytes of the update (0: the worker has it no more) */
} psagg__ctl_state;
_Static_assert(sizeof(psagg__ctl_state) == 40, "psagg__ctl_state layout");

typedef struct psagg__ctl_agree {
    uint32_t kind;  /* runtime/agree.h: PSAGG_AGREE_PREPARE ... DECIDED */
    uint32_t epoch; /* the view's epoch being decided */
    uint64_t ballot;
    uint64_t accepted;
    uint32_t value_len; /* bytes of the view after this struct */
    uint32_t pad;
} psagg__ctl_agree;
_Static_assert(sizeof(psagg__ctl_agree) == 32, "psagg__ctl_agree layout");

enum { PSAGG_VIEW_LIVE = 1, PSAGG_VIEW_LIVE_NEW = 2 }; /* a view's live[] bytes (above) */

typedef struct psagg__view_hdr {
    uint32_t epoch;
    uint32_t n_servers;
    uint32_t n_moves;
    uint32_t n_chunks;
    uint32_t n_workers; /* member[] bytes at its end: the job's worker ranks */
    uint32_t n_members; /* of them 1 */
} psagg__view_hdr;
_Static_assert(sizeof(psagg__view_hdr) == 24, "psagg__view_hdr layout");

typedef struct psagg__view_move {
    uint32_t chunk;     /* index in the layout */
    uint32_t owner;     /* its server from this epoch on */
    uint32_t start;     /* the round it starts at there */
    uint32_t relay_end; /* rounds start .. relay_end - 1: their update comes relayed (above) */
    uint32_t relayer;   /* the worker that relays them (when relay_end > start) */
} psagg__view_move;
_Static_assert(sizeof(psagg__view_move) == 20, "psagg__view_move layout");

/* Where a view's owner[] and moves start, and its bytes (n_servers, n_chunks, n_moves). */
static inline uint64_t psagg__view_owners_at(uint32_t n_servers)
{
    return sizeof(psagg__view_hdr) + ((uint64_t)n_servers + 3) / 4 * 4;
}
static inline uint64_t psagg__view_moves_at(uint32_t n_servers, uint32_t n_chunks)
{
    return psagg__view_owners_at(n_servers) + ((uint64_t)n_chunks * 2 + 3) / 4 * 4;
}
static inline uint64_t psagg__view_members_at(uint32_t n_servers, uint32_t n_chunks,
                                              uint32_t n_moves)
{
    return psagg__view_moves_at(n_servers, n_chunks) + (uint64_t)n_moves * sizeof(psagg__view_move);
}
static inline uint64_t psagg__view_bytes(uint32_t n_servers, uint32_t n_chunks, uint32_t n_moves,
                                         uint32_t n_workers)
{
    return psagg__view_members_at(n_servers, n_chunks, n_moves) + n_workers;
}

/* The member[] bytes of view v (its length checked against psagg__view_bytes first): NULL if
   each is 0 or 1 (0 only in an elastic job) and n_members counts them, else what is wrong.
   (Checked alike by a server and a worker that take the view.) */
static inline const char *psagg__view_members_bad(const uint8_t *v, const psagg__view_hdr *vh,
                                                  int elastic)
{
    const uint8_t *member = v + psagg__view_members_at(vh->n_servers, vh->n_chunks, vh->n_moves);
    uint32_t n = 0;
    for (uint32_t w = 0; w < vh->n_workers; w++) {
        if (member[w] > 1 || (!member[w] && !elastic))
            return "a member[] byte is not 0 or 1 (or 0 in a job without elastic workers)";
        n += member[w];
    }
    return n == vh->n_members ? NULL : "field n_members is not the count of member[]";
}

/* Chunk g's owner and move i of view v (of n_servers servers and n_chunks chunks; its length
   checked against psagg__view_bytes first). */
static inline uint32_t psagg__view_owner(const uint8_t *v, uint32_t n_servers, uint32_t g)
{
    uint16_t o;
    memcpy(&o, v + psagg__view_owners_at(n_servers) + (size_t)g * sizeof o, sizeof o);
    return o;
}
static inline psagg__view_move psagg__view_move_at(const uint8_t *v, uint32_t n_servers,
                                                   uint32_t n_chunks, uint32_t i)
{
    psagg__view_move m;
    memcpy(&m, v + psagg__view_moves_at(n_servers, n_chunks) + (size_t)i * sizeof m, sizeof m);
    return m;
}

/* psagg__view_move.relayer of a chunk with copies under [server] quorum: nothing is relayed,
   its copy follows the rounds start .. relay_end - 1 (above) */
#define PSAGG_VIEW_FOLLOW UINT32_MAX

/* Whether move m's relayed rounds are not 0..2 rounds from its start by one of n_workers (a
   chunk with copies has none: follows says whether its copy may follow some instead, above):
   a view every process refuses. */
static inline int psagg__view_relay_bad(const psagg__view_move *m, uint32_t n_workers,
                                        int has_copies, int follows)
{
    return m->relay_end < m->start || m->relay_end - m->start > 2 ||
           (m->relay_end > m->start &&
            (has_copies ? !follows || m->relayer != PSAGG_VIEW_FOLLOW : m->relayer >= n_workers));
}

/* One tensor's state at a SYNC barrier: the round of its next operation, flags, and how many
   of its rounds were a parameter's INIT or PULL (with server replicas they count a round; the
   optimizer's step and the encode's RNG round are the round less them): never above round. */
#define PSAGG_TSTATE_INITED 1u /* a parameter whose psagg_param_init completed */
typedef struct psagg__ctl_tensor_state {
    uint32_t round;
    uint32_t flags; /* PSAGG_TSTATE_* */
    uint32_t pulls;
} psagg__ctl_tensor_state;
_Static_assert(sizeof(psagg__ctl_tensor_state) == 12, "psagg__ctl_tensor_state layout");

/*
 * The codec assignments after a SYNC's or SYNC_DONE's tensor states ([codec] adaptive;
 * runtime/adaptive.h): those the worker keeps, adapt_gens of them (PSAGG_ADAPT_RING in a job
 * with adaptive tensors, else 0), as
 *   adapt_gens x u32 generation: slot i holds generation g with g % adapt_gens == i, or
 *                PSAGG_ADAPT_NO_GEN (empty); the newest is the statistics rounds summed
 *                (the statistics tensor's round): a worker sends SYNC once their solve is done
 *   adapt_gens x adapt_tensors bytes: slot by slot, each adaptive tensor's (in key order)
 *                choice, its index among psagg__adapt_candidates (0 in an empty slot)
 * Every member keeps the same (the same sums, the same solver): server 0 compares them as it
 * compares the states, and a joiner takes them.
 */
static inline uint64_t psagg__ctl_sync_tail(uint32_t n_tensors, uint32_t adapt_gens,
                                            uint32_t adapt_tensors)
{
    return (uint64_t)n_tensors * sizeof(psagg__ctl_tensor_state) +
           (uint64_t)adapt_gens * (sizeof(uint32_t) + adapt_tensors);
}

typedef struct psagg__ctl_sync {
    uint32_t seq;           /* the worker's barrier count: 1 for its first psagg_sync_membership */
    uint32_t n_tensors;     /* states that follow: every declared tensor */
    uint32_t adapt_gens;    /* codec assignments after them (above) */
    uint32_t adapt_tensors; /* the adaptive tensors: each assignment's choices */
} psagg__ctl_sync;
_Static_assert(sizeof(psagg__ctl_sync) == 16, "psagg__ctl_sync layout");

typedef struct psagg__ctl_sync_done {
    uint32_t seq;           /* the barrier passed */
    uint32_t epoch;         /* the membership epoch after it */
    uint32_t joined;        /* workers it admitted */
    uint32_t n_tensors;     /* states that follow (the members'), 0 when joined is 0 */
    uint32_t adapt_gens;    /* the members' codec assignments after them, 0 when joined is 0 */
    uint32_t adapt_tensors; /* (as in psagg__ctl_sync) */
} psagg__ctl_sync_done;
_Static_assert(sizeof(psagg__ctl_sync_done) == 24, "psagg__ctl_sync_done layout");

/* Whether a contributor bitmap (an update's, or a push's trailer: above) names worker w. */
static inline int psagg__bitmap_has(const uint8_t *bits, uint32_t w)
{
    return bits[w / 8] >> (w % 8) & 1;
}

enum psagg__msg_type {
    PSAGG_MSG_PUSH = 1,
    PSAGG_MSG_UPDATE = 2,
    PSAGG_MSG_WEIGHTS = 3,
};

typedef struct psagg__msg_hdr {
    uint32_t magic;  /* PSAGG_MSG_MAGIC */
    uint8_t type;    /* psagg__msg_type */
    uint8_t version; /* PSAGG_PROTO_VERSION */
    uint16_t sender; /* worker rank (PUSH) or server rank (UPDATE) */
    uint16_t epoch;  /* the membership epoch (mod 2^16) the sender was in; 0 in a static job */
    uint16_t summed; /* UPDATE, WEIGHTS: the workers whose pushes the round summed; PUSH: 0 */
    uint32_t round;  /* per-key round */
    uint32_t key;    /* tensor index in the declaration */
    uint32_t chunk;  /* chunk index within the tensor */
    uint32_t len;    /* payload bytes: exactly the encoded size of the chunk in that codec (an
                        UPDATE: psagg__update_size of `summed`, wider for thc) */
    uint32_t codec;  /* the payload's codec and the assignment's generation (above) */
} psagg__msg_hdr;
_Static_assert(sizeof(psagg__msg_hdr) == 32, "psagg__msg_hdr layout");

/* psagg__msg_param.flags: the kind in bits 0-1, then flags */
enum psagg__param_kind { PSAGG_PARAM_GRAD = 0, PSAGG_PARAM_INIT = 1, PSAGG_PARAM_PULL = 2 };
#define PSAGG_PARAM_KIND_MASK 3u
#define PSAGG_PARAM_AVERAGE   4u /* GRAD: the step uses the sum / workers */
#define PSAGG_PARAM_SYNC      8u /* PULL: the workers hold the pulled weights from now on */

/* The trailer of a parameter tensor's push (the last bytes of its payload). Every field but
 * weight must be the same in every worker's push of a round. */
typedef struct psagg__msg_param {
    float lr;           /* GRAD: the learning rate of this step */
    float weight_decay; /* GRAD: and its weight decay */
    uint32_t flags;     /* psagg__param_kind | PSAGG_PARAM_* */
    uint32_t tag;       /* GRAD: the caller's label of the step (psagg_set_param_sync; DiLoCo:
                           fragment << 24 | inner step mod 2^24), else 0 */
    float weight;       /* this worker's weight in an AVERAGE: the step divides the sum by the
                           sum of the weights (1 each: the number of workers); > 0 */
    uint32_t reserved;  /* 0 */
} psagg__msg_param;
_Static_assert(sizeof(psagg__msg_param) == 24, "psagg__msg_param layout");

/* Same-host copies (above): the transport's own messages, never seen by its callers. */
#define PSAGG_LOCAL_MAGIC 0x4C475350u /* "PSGL" */
#define PSAGG_LOCAL_MIN   (32u << 10) /* smaller messages go as they are */
enum psagg__local_type { PSAGG_LOCAL_DESC = 1, PSAGG_LOCAL_ACK = 2 };

typedef struct psagg__msg_local {
    uint32_t magic;  /* PSAGG_LOCAL_MAGIC */
    uint32_t type;   /* psagg__local_type */
    uint64_t cookie; /* the sender's name for the send; the ACK echoes it */
    uint64_t addr;   /* DESC: where the message lies in the sender's memory */
    uint64_t len;    /* DESC: its bytes, 1..the reader's receive buffer */
    int32_t status;  /* ACK: 0 copied, else the reader's psagg_status (the send fails) */
    uint32_t reserved;
} psagg__msg_local;
_Static_assert(sizeof(psagg__msg_local) == 40, "psagg__msg_local layout");

#endif
