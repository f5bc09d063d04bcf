/*
 * control.h - the TCP control channel's plumbing: listen/connect with deadlines and whole
 * frames in and out (wire.h). Frames are validated (magic, version, length) on receipt.
 */
#ifndef PSAGG_COMMON_CONTROL_H
#define PSAGG_COMMON_CONTROL_H

#include <stdint.h>

#include "config.h"
#include "psagg.h"
#include "wire.h"

/* Monotonic milliseconds. */
int64_t psagg_now_ms(void);

psagg_status psagg_tcp_listen(const psagg_hostport *hp, int *fd_out);
/* Connect, retrying refused connections until deadline_ms (psagg_now_ms clock). */
psagg_status psagg_tcp_connect(const psagg_hostport *hp, int64_t deadline_ms, int *fd_out);
/* The local IP address of a connected socket, as text. */
psagg_status psagg_tcp_local_addr(int fd, char *buf, size_t len);

psagg_status psagg_ctl_send(int fd, uint16_t type, const void *body, uint32_t len);
psagg_status psagg_ctl_send_error(int fd, uint16_t type, int status, const char *msg);

/*
 * Receive one frame before deadline_ms (-1: none). *body is malloc'd (NULL when len == 0) and
 * the caller frees it. `peer` names the other side in error messages. A closed connection is
 * PSAGG_EPEER, a bad header PSAGG_EPROTO (naming the field), a deadline PSAGG_ETIMEDOUT.
 */
psagg_status psagg_ctl_recv(int fd, psagg_ctl_hdr *hdr, void **body, int64_t deadline_ms,
                            const char *peer);

/*
 * The HELLO's authentication token: BLAKE2b-256 keyed with the BLAKE2b hash of the contents
 * of [cluster] secret_file, over ("psagg-hello-v1", job_id, rank). All zero when no secret is
 * configured. It keeps workers of other jobs and unconfigured clients out; it does not
 * protect against an eavesdropper on the control network (use a private network for that).
 */
psagg_status psagg_hello_token(const psagg_config *cfg, uint32_t rank, uint8_t out[32]);
/* Constant-time comparison of two tokens: 1 if equal. */
int psagg_token_equal(const uint8_t a[32], const uint8_t b[32]);

#endif
