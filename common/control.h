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

#endif
