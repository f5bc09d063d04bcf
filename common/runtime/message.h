/*
 * runtime/message.h - data messages (runtime/wire.h, psagg__msg_hdr): building a header, and
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

/*
 * Field codec of a data header (runtime/wire.h): bits 0-2 the codec id; for maxmin, topk and
 * thc 3-6 the bits and 7 the rounding, then maxmin's bucket / 64 - 1 in 8-21, or topk's
 * log2(block) - 8 in 8-11 and (k - 1) modulo 1024 in 12-21 (the payload's exact length names k
 * exactly), or thc's log2(block) - 6 in 8-11; 0 for the other codecs; 22-31 the assignment's
 * generation modulo 1024.
 */
uint32_t psagg__msg_codec_word(const psagg_codec *codec, uint32_t generation);
#define PSAGG_MSG_GEN_MASK 1023u /* the generation a header carries: modulo 1024 */

/*
 * A header for chunk ci of `round`, sent by `sender` (worker rank or server rank), whose
 * payload is in `codec` (len: its encoded size) of assignment `generation`.
 */
void psagg__msg_init(psagg__msg_hdr *h, enum psagg__msg_type type, uint32_t sender, uint32_t round,
                     const psagg__chunk_info *ci, const psagg_codec *codec, uint32_t generation);

/* What a checked header says of its payload. */
typedef struct psagg__msg_codec {
    psagg_codec codec;
    uint32_t generation; /* & PSAGG_MSG_GEN_MASK */
    size_t len;          /* payload bytes; of a parameter's push: its body's (the trailer's not) */
    int param;           /* a push of a parameter tensor: prm is its trailer (runtime/wire.h) */
    psagg__msg_param prm;
} psagg__msg_codec;

/*
 * Check a received message of msg_len bytes: it holds a header, and the header's magic,
 * version, type (must be `type`), epoch, key and chunk (against the layout), codec (the
 * tensor's declared codec, or for an adaptive tensor one of its candidates) and len (the
 * chunk's encoded size in that codec, and exactly the bytes after the header, less
 * tag_bytes: the MAC's PSAGG_MSG_MAC_BYTES with data_auth, else 0) are valid. Returns NULL
 * and sets *ci to the message's chunk and *mc (if not NULL) to its codec, or returns the name
 * of the first invalid field ("len" for a message shorter than a header). The sender field
 * and the generation are the caller's to check: who may send what differs between pushes
 * and updates, and the generation depends on the round.
 * A parameter tensor's push ends with its psagg__msg_param trailer, whose fields are checked
 * ("trailer", "kind", "lr", "weight_decay") and whose kind sets the body's length (GRAD: the
 * codec's; INIT: fp32 from worker 0 (field sender), none from the others; PULL: none). A
 * WEIGHTS message is a parameter tensor's, in fp32.
 */
const char *psagg__msg_check(const void *msg, size_t msg_len, size_t tag_bytes,
                             enum psagg__msg_type type, const psagg__layout *l,
                             const psagg__chunk_info **ci, psagg__msg_codec *mc);

#endif
