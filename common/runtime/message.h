/*
 * runtime/message.h - data messages (runtime/wire.h, psagg_msg_hdr): building a header, and
 * the one check of a received header against the job's layout, used by the server for pushes
 * and by the worker for updates.
 *
 * Layer: runtime.
 */
#ifndef PSAGG_RUNTIME_MESSAGE_H
#define PSAGG_RUNTIME_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/layout.h"
#include "runtime/wire.h"

/* A header for chunk ci of `round`, sent by `sender` (worker rank or server rank). */
void psagg_msg_init(psagg_msg_hdr *h, enum psagg_msg_type type, uint32_t sender, uint32_t round,
                    const psagg_chunk_info *ci);

/*
 * Check a received message of msg_len bytes: it holds a header, and the header's magic,
 * version, type (must be `type`), epoch, key and chunk (against the layout) and len (the
 * chunk's encoded size, and exactly the bytes after the header, less tag_bytes: the MAC's
 * PSAGG_MSG_MAC_BYTES with data_auth, else 0) are valid. Returns NULL and
 * sets *ci to the message's chunk, or returns the name of the first invalid field ("len" for
 * a message shorter than a header). The sender field is the caller's to check: who may send
 * what differs between pushes and updates.
 */
const char *psagg_msg_check(const void *msg, size_t msg_len, size_t tag_bytes,
                            enum psagg_msg_type type, const psagg_layout *l,
                            const psagg_chunk_info **ci);

#endif
