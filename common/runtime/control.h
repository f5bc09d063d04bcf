/*
 * runtime/control.h - the TCP control channel's plumbing: listen/connect with deadlines, whole
 * frames in and out (runtime/wire.h), and the HELLO token. Frames are validated (magic,
 * version, length) on receipt; an ERROR/ABORT frame's body is read by one parser here.
 *
 * Layer: runtime. Deadlines are on psagg_now_ms() (base/clock.h).
 */
#ifndef PSAGG_RUNTIME_CONTROL_H
#define PSAGG_RUNTIME_CONTROL_H

#include <stdint.h>

#include "base/clock.h"
#include "base/error.h"
#include "psagg/types.h"
#include "runtime/config.h"
#include "runtime/wire.h"

PSAGG_NODISCARD psagg_status psagg_tcp_listen(const psagg_hostport *hp, int *fd_out);
/* Connect, retrying refused connections until deadline_ms (psagg_now_ms clock). */
PSAGG_NODISCARD psagg_status psagg_tcp_connect(const psagg_hostport *hp, int64_t deadline_ms,
                                               int *fd_out);
/* The local IP address of a connected socket, as text. */
PSAGG_NODISCARD psagg_status psagg_tcp_local_addr(int fd, char *buf, size_t len);

PSAGG_NODISCARD psagg_status psagg_ctl_send(int fd, uint16_t type, const void *body, uint32_t len);
/* An ERROR or ABORT frame (psagg_ctl_error) with status and message. */
PSAGG_NODISCARD psagg_status psagg_ctl_send_error(int fd, uint16_t type, psagg_status status,
                                                  const char *msg);

/*
 * Receive one frame before deadline_ms (-1: none). *body is malloc'd (NULL when len == 0) and
 * the caller frees it. `peer` names the other side in error messages. A closed connection is
 * PSAGG_EPEER, a bad header PSAGG_EPROTO (naming the field), a deadline PSAGG_ETIMEDOUT.
 */
PSAGG_NODISCARD psagg_status psagg_ctl_recv(int fd, psagg_ctl_hdr *hdr, void **body,
                                            int64_t deadline_ms, const char *peer);

/*
 * If a received frame is an ERROR or ABORT of the right length, terminate its message in
 * place and return the status it carries (a non-negative or unknown status counts as
 * PSAGG_EPEER) with *msg pointing into body; otherwise return PSAGG_OK and leave *msg NULL.
 */
psagg_status psagg_ctl_error_parse(const psagg_ctl_hdr *hdr, void *body, const char **msg);

/*
 * The HELLO's authentication token: BLAKE2b-256 keyed with the BLAKE2b hash of the contents
 * of [cluster] secret_file, over ("psagg-hello-v1", job_id, rank). All zero when no secret is
 * configured. It keeps workers of other jobs and unconfigured clients out; it does not
 * protect against an eavesdropper on the control network (use a private network for that).
 */
PSAGG_NODISCARD psagg_status psagg_hello_token(const psagg_config *cfg, uint32_t rank,
                                               uint8_t out[32]);
/* Constant-time comparison of two tokens: 1 if equal. */
int psagg_token_equal(const uint8_t a[32], const uint8_t b[32]);

#endif
