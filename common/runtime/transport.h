/*
 * runtime/transport.h - psagg's libfabric data path: one FI_EP_RDM endpoint, one completion
 * queue and one address vector per process, messages into pre-posted registered receive
 * buffers. Layer: runtime.
 *
 * Threading: psagg__fabric_send() and psagg__fabric_post_recv() may be called from any thread;
 * exactly one thread at a time calls psagg__fabric_poll(), which drives progress and returns
 * completions. Sends that meet -FI_EAGAIN drive progress and retry; they never spin without
 * reading the completion queue (completions read while retrying are queued for the next
 * poll, never lost).
 */
#ifndef PSAGG_RUNTIME_TRANSPORT_H
#define PSAGG_RUNTIME_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/log.h"
#include "psagg/types.h"

typedef struct psagg__fabric psagg__fabric;
typedef uint64_t psagg__peer;         /* an fi_addr_t in this process's address vector */
#define PSAGG_PEER_UNKNOWN UINT64_MAX /* a sender that is not in the address vector */

#define PSAGG_FABRIC_NAME_MAX 256

typedef struct psagg__fabric_opts {
    const char *provider;    /* "tcp" (native TCP RDM, else tcp;ofi_rxm), "shm", any name */
    const char *node;        /* local address to bind (tcp); NULL = provider's choice */
    size_t max_msg;          /* largest message that will be sent, bytes */
    const psagg__logger *log; /* the owner's logger (copied); NULL: role "psagg" */
    int post_timeout_ms;     /* how long send/post_recv may meet -FI_EAGAIN; 0: 30000 */
} psagg__fabric_opts;

/*
 * The environment a process using `provider` for messages up to max_msg bytes should start
 * with (libfabric reads it once, process-wide, when it initialises; see transport.c): for tcp,
 * rxm's eager and segmentation limits, so every message is sent eagerly. psagg never sets it
 * itself; the executables and launchers do. Fills up to max NAME=VALUE pairs and returns how
 * many (0: nothing needed). psagg__fabric_open logs a warning when a tcp endpoint opens
 * without it.
 */
typedef struct psagg__fabric_env {
    char name[40];
    char value[24];
} psagg__fabric_env;
int psagg__fabric_env_hint(const char *provider, size_t max_msg, psagg__fabric_env *out, int max);

/*
 * PSAGG_EFABRIC (provider named, libfabric's text) when the provider cannot be opened;
 * PSAGG_EINVAL for max_msg 0 or above SSIZE_MAX; PSAGG_EUNSUPPORTED above the provider's
 * max_msg_size.
 */
PSAGG_NODISCARD psagg_status psagg__fabric_open(const psagg__fabric_opts *opts,
                                                psagg__fabric **out);
void psagg__fabric_close(psagg__fabric *f);

/* The provider name actually opened, e.g. "tcp;ofi_rxm". */
const char *psagg__fabric_provider(const psagg__fabric *f);

/* Local endpoint name, to be given to peers through the control channel. *len: room in, the
 * name's length out (PSAGG_EINVAL, with the length needed, if it does not fit). */
PSAGG_NODISCARD psagg_status psagg__fabric_name(psagg__fabric *f, void *buf, size_t *len);
/* name/len as received: checked against this provider's address format (PSAGG_EINVAL). */
PSAGG_NODISCARD psagg_status psagg__fabric_add_peer(psagg__fabric *f, const void *name, size_t len,
                                                    psagg__peer *out);

/*
 * Register memory used as a send source or receive target. *desc is what send/post_recv
 * need (NULL when the provider's mr_mode does not require local registration). Regions stay
 * registered until psagg__fabric_close.
 */
PSAGG_NODISCARD psagg_status psagg__fabric_reg(psagg__fabric *f, void *buf, size_t len,
                                               void **desc);

/* Post one receive buffer; its completion carries `ctx`. Repost after consuming it. */
PSAGG_NODISCARD psagg_status psagg__fabric_post_recv(psagg__fabric *f, void *buf, size_t len,
                                                     void *desc, void *ctx);

/*
 * Send len bytes (<= max_msg, else PSAGG_EINVAL) to peer; the buffer must stay untouched until
 * the SEND completion (ctx). send and post_recv give up with PSAGG_ETIMEDOUT after
 * opts.post_timeout_ms of nothing but -FI_EAGAIN, and return PSAGG_EAGAIN when 65536
 * completions are already queued for poll (poll first). A dead peer: tcp;ofi_rxm completes sends
 * with SEND_ERROR (PSAGG_EPEER); libfabric 1.17's native tcp ("net") keeps reconnecting and answers
 * -FI_EAGAIN (send: PSAGG_ETIMEDOUT after post_timeout_ms; try_send: PSAGG_EAGAIN); shm never
 * completes large sends (receiver-pulled). The control channel is what notices a death.
 */
PSAGG_NODISCARD psagg_status psagg__fabric_send(psagg__fabric *f, psagg__peer to, const void *buf,
                                                size_t len, void *desc, void *ctx);

/*
 * psagg__fabric_send that never waits: when the provider's queue is full it drives progress
 * once and returns PSAGG_EAGAIN (nothing sent; try again later), so a thread that has other
 * things to watch (control connections, deadlines) is never held in a send.
 */
PSAGG_NODISCARD psagg_status psagg__fabric_try_send(psagg__fabric *f, psagg__peer to,
                                                    const void *buf, size_t len, void *desc,
                                                    void *ctx);

/*
 * 1 when the provider names a message's sender reliably (psagg__fabric_event.src), so that a
 * receiver can accept data only from the peers it registered: tcp (ofi_rxm) identifies the
 * connection. libfabric 1.17's shm does not: for a sender missing from the address vector it
 * reported another peer's address (seen here), so on shm only data_auth authenticates data.
 */
int psagg__fabric_source_reliable(const psagg__fabric *f);

/*
 * Same-host copies (wire.h "SAME-HOST COPIES"). A large message between two processes on one
 * host need not cross the kernel's TCP stack (a copy in, a copy out, and the stack between):
 * the sender sends a 40-byte descriptor of where the message lies, the receiver copies it
 * straight out of the sender's memory into its receive buffer with process_vm_readv (one
 * copy) and acknowledges, and only then does the send complete. Callers see the usual
 * completions: a RECV_DONE of the whole message, a SEND_DONE when the peer has copied it.
 *
 * psagg__fabric_local_self: what to offer a peer on the control channel: this process's pid,
 * the address in its memory of this endpoint's random secret (32 bytes, never sent anywhere)
 * followed by its name, and the secret's BLAKE2b-256, the commitment (all 0 when this provider
 * cannot take part: shm, or no inject).
 * psagg__fabric_local_accept: take a peer's offer (its pid, probe and commitment, and the
 * endpoint name it gave): PSAGG_OK when that pid lives in this network namespace and holds,
 * at probe, a secret whose hash is the commitment and exactly that name, as read through
 * process_vm_readv (so the same user, and ptrace allowed): from then on this process copies
 * that peer's descriptors. The secret binds the offer to the process that made it: no third
 * process can be named. PSAGG_EUNSUPPORTED says why not.
 * psagg__fabric_local_send: the peer took this process's offer: sends to it of at least
 * PSAGG_LOCAL_MIN bytes go by descriptor.
 * A descriptor this process cannot copy (too long, unreadable) is a RECV_ERROR with the
 * peer in src and a SEND_ERROR at the sender; a DESC or ACK from a peer that was not accepted
 * is delivered as an ordinary message (bad for the caller's protocol). A send whose reader's
 * process is gone fails (SEND_ERROR, PSAGG_EPEER) within a fraction of a second of polling
 * (psagg__fabric_poll looks every 0.2 s, while it waits too); the reader is watched through a
 * pidfd, so a reader that exited but was not yet waited for (a zombie) counts as gone, and
 * another process given the same pid later is not taken for it (kernels without pidfds,
 * before 5.3: kill(pid, 0), which sees neither).
 */
#define PSAGG_LOCAL_COMMIT_BYTES 32
void psagg__fabric_local_self(psagg__fabric *f, uint32_t *pid, uint64_t *probe,
                              uint8_t commit[PSAGG_LOCAL_COMMIT_BYTES]);
PSAGG_NODISCARD psagg_status psagg__fabric_local_accept(
    psagg__fabric *f, psagg__peer peer, uint32_t pid, uint64_t probe,
    const uint8_t commit[PSAGG_LOCAL_COMMIT_BYTES], const void *name, size_t len);
PSAGG_NODISCARD psagg_status psagg__fabric_local_send(psagg__fabric *f, psagg__peer peer);
/* Messages this process has received by same-host copy so far. */
uint64_t psagg__fabric_local_copied(psagg__fabric *f);

typedef enum psagg__fabric_event_kind {
    PSAGG_FABRIC_SEND_DONE = 1,
    PSAGG_FABRIC_RECV_DONE = 2,
    PSAGG_FABRIC_SEND_ERROR = 3, /* status and message in the event */
    PSAGG_FABRIC_RECV_ERROR = 4,
} psagg__fabric_event_kind;

typedef struct psagg__fabric_event {
    psagg__fabric_event_kind kind;
    void *ctx;      /* the ctx given to send / post_recv (NULL: error not tied to one op) */
    size_t len;     /* bytes received (RECV_DONE) */
    psagg__peer src; /* RECV_DONE: the sender, or PSAGG_PEER_UNKNOWN (not in the address vector);
                       RECV_ERROR of a same-host copy: the peer, else PSAGG_PEER_UNKNOWN */
    int status;     /* PSAGG_OK or a negative psagg_status (errors) */
    char msg[160];  /* provider's error text for errors */
} psagg__fabric_event;

/*
 * Drive progress and return up to max completions (0 if none). timeout_ms > 0 waits up to
 * that long for the first completion (fi_cq_sread / wait set where the provider supports
 * it, else short sleeps between reads); 0 returns at once. Negative on a fatal CQ failure.
 */
int psagg__fabric_poll(psagg__fabric *f, psagg__fabric_event *ev, int max, int timeout_ms);

/*
 * Make the thread in psagg__fabric_poll (or the next one to call it) return at once, with
 * what completions there are or none: how another thread hands work to the endpoint's owner
 * (one fi_cq_signal, a write to the CQ's wait fd; call it only when the owner may sleep).
 */
void psagg__fabric_wake(psagg__fabric *f);

#endif
