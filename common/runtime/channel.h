/*
 * runtime/channel.h - the TCP control channel's plumbing: listen/connect with deadlines, whole
 * frames in and out (runtime/wire.h). Frames are validated (magic, version, length) on
 * receipt; an ERROR/ABORT frame's body is read by one parser here. The HELLO token and the
 * data keys are runtime/auth.h's.
 *
 * Layer: runtime. Deadlines are on psagg__now_ms() (base/clock.h).
 */
#ifndef PSAGG_RUNTIME_CHANNEL_H
#define PSAGG_RUNTIME_CHANNEL_H

#include <stdint.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "psagg/types.h"
#include "runtime/auth.h"
#include "runtime/config.h"
#include "runtime/wire.h"

/* A non-blocking listening socket (accept until EAGAIN). */
PSAGG_NODISCARD psagg_status psagg__tcp_listen(const psagg__hostport *hp, int *fd_out);
/*
 * Connect to `what` ("server 0"), retrying refused connections until deadline_ms (psagg__now_ms
 * clock) and, with a logger, saying every few seconds what it is waiting for. Each attempt is
 * a _start and _done below, at most a second (a host that drops SYNs costs the deadline). The
 * failure names the address, the time waited and the last error.
 */
PSAGG_NODISCARD psagg_status psagg__tcp_connect(const psagg__hostport *hp, int64_t deadline_ms,
                                                const char *what, const psagg__logger *log,
                                                int *fd_out);
/*
 * A connection that must not block its caller (a worker's communication thread, connecting to
 * a server that may be down): _start begins it (*fd_out: the socket, connecting; hp is
 * resolved into *addr the first time only: a name server that hangs holds the caller once);
 * _done says
 * 1 once it is connected (the socket is blocking again, with TCP_NODELAY), 0 while it is not
 * yet, -1 when it failed (the error says why, and errno; the caller closes the socket).
 */
typedef struct psagg__tcp_addr { /* hp resolved once (a sockaddr_storage), len 0: not yet */
    uint8_t bytes[128];
    uint32_t len;
    int family;
} psagg__tcp_addr;
PSAGG_NODISCARD psagg_status psagg__tcp_connect_start(const psagg__hostport *hp,
                                                      psagg__tcp_addr *addr, int *fd_out);
int psagg__tcp_connect_done(int fd);
/* The local IP address of a connected socket, as text. */
PSAGG_NODISCARD psagg_status psagg__tcp_local_addr(int fd, char *buf, size_t len);

/*
 * Liveness and the job's deadlines, all from [cluster] op_timeout_ms (op), in this order:
 *
 *   silence   op      while the job runs, both ends of a control connection send a PING
 *                     every psagg__ping_interval_ms(op) and give the other up after op
 *                     with nothing from it: a stopped or hung process (SIGSTOP, a frozen
 *                     host) is named by the peers that stop hearing it;
 *   round     1.5 op  a server fails a round whose first push is older and that still
 *                     misses some, naming those workers (alive, but not pushing); an
 *                     elastic job closes them instead and goes on without them;
 *   push_pull 2 op    a worker fails an operation with no update by then, naming the
 *                     servers that owe it one.
 *
 * Each comes after the one before, so the peer that knows the culprit speaks first.
 */
static inline int psagg__ping_interval_ms(int op_timeout_ms)
{
    int ms = op_timeout_ms / 4;
    return ms < 20 ? 20 : ms > 1000 ? 1000 : ms;
}
/* [cluster] elastic: a worker silent this long (3 PING intervals) leaves the job. */
static inline int64_t psagg__member_timeout_ms(int op_timeout_ms)
{
    return 3 * (int64_t)psagg__ping_interval_ms(op_timeout_ms);
}
#define PSAGG_ROUND_DEADLINE_MS(op) ((int64_t)(op)*3 / 2)
#define PSAGG_OP_DEADLINE_MS(op)    ((int64_t)(op)*2)

/*
 * Frames after the WELCOME carry a tag when the connection's `auth` is on (runtime/auth.h):
 * the senders below add it (auth NULL or off: frames before the WELCOME, or a job without a
 * secret), and the receivers check and strip it. A frame whose tag does not check out is
 * dropped and logged (auth->log, naming the peer and the frame's type) and the next is
 * read, as if it had never come; after 16 in a row the connection is given up (PSAGG_EPROTO).
 */
PSAGG_NODISCARD psagg_status psagg__ctl_send(int fd, psagg__ctl_auth *auth, uint16_t type,
                                             const void *body, uint32_t len);
/* An ERROR or ABORT frame (psagg__ctl_error) with status and message. */
PSAGG_NODISCARD psagg_status psagg__ctl_send_error(int fd, psagg__ctl_auth *auth, uint16_t type,
                                                   psagg_status status, const char *msg);

/*
 * Receive one frame before deadline_ms (-1: none). *body is malloc'd (NULL when len == 0) and
 * the caller frees it. `peer` names the other side in error messages. A closed connection is
 * PSAGG_EPEER, a bad header PSAGG_EPROTO (naming the field), a deadline PSAGG_ETIMEDOUT;
 * PSAGG_EAGAIN when a frame was dropped (its tag) and nothing else has come yet: poll again
 * (an injected frame must not hold up its receiver until the next genuine one).
 */
PSAGG_NODISCARD psagg_status psagg__ctl_recv(int fd, psagg__ctl_auth *auth, psagg__ctl_hdr *hdr,
                                             void **body, int64_t deadline_ms, const char *peer);

/*
 * Check a frame header: magic, version, a known type, len <= max_len. PSAGG_EPROTO naming the
 * field and the peer.
 */
PSAGG_NODISCARD psagg_status psagg__ctl_hdr_check(const psagg__ctl_hdr *hdr, uint32_t max_len,
                                                  const char *peer);

/*
 * A frame read piece by piece from a non-blocking socket, so one slow or silent peer never
 * holds up a loop that serves others. max_len bounds the body (e.g. a HELLO's size for a
 * connection that has not authenticated): the header is checked before any body is taken.
 */
typedef struct psagg__ctl_reader {
    psagg__ctl_hdr hdr;
    size_t got;    /* bytes of header and body so far */
    uint8_t *body; /* hdr.len bytes, allocated once the header checked out */
    uint32_t max_len;
    psagg__ctl_auth *auth; /* the connection's (tags checked and stripped), or NULL */
    int untagged;          /* the whole frame's tag checked out (hdr.len: the body's now) */
} psagg__ctl_reader;

void psagg__ctl_reader_init(psagg__ctl_reader *r, uint32_t max_len, psagg__ctl_auth *auth);
/* Free a partial frame and start over. */
void psagg__ctl_reader_reset(psagg__ctl_reader *r);
/*
 * Read what the socket has: PSAGG_OK once a whole frame is in (take it), PSAGG_EAGAIN when
 * more is needed, PSAGG_EPEER when the peer closed, PSAGG_EPROTO for a bad header.
 */
psagg_status psagg__ctl_reader_feed(psagg__ctl_reader *r, int fd, const char *peer);
/* The complete frame: its header in *hdr, its body (caller frees; NULL when empty). */
void *psagg__ctl_reader_take(psagg__ctl_reader *r, psagg__ctl_hdr *hdr);

/*
 * Check a DECLARE frame whose header passed psagg__ctl_hdr_check: its length against its
 * count of tensors, and chunk_elems within what [worker] chunk_bytes allows. The tensors
 * themselves are checked by psagg__layout_build. PSAGG_EPROTO naming the field.
 */
PSAGG_NODISCARD psagg_status psagg__ctl_declare_check(const psagg__ctl_hdr *hdr, const void *body,
                                                      const char *peer);

/*
 * If a received frame is an ERROR or ABORT of the right length, terminate its message in
 * place and return the status it carries (a non-negative or unknown status counts as
 * PSAGG_EPEER) with *msg pointing into body; otherwise return PSAGG_OK and leave *msg NULL.
 */
psagg_status psagg__ctl_error_parse(const psagg__ctl_hdr *hdr, void *body, const char **msg);

#endif
