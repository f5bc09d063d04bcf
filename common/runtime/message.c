/* runtime/message.c - see runtime/message.h. */
#include "runtime/message.h"

#include <string.h>

void psagg_msg_init(psagg_msg_hdr *h, enum psagg_msg_type type, uint32_t sender, uint32_t round,
                    const psagg_chunk_info *ci)
{
    *h = (psagg_msg_hdr){.magic = PSAGG_MSG_MAGIC,
                         .type = (uint8_t)type,
                         .version = PSAGG_PROTO_VERSION,
                         .sender = (uint16_t)sender,
                         .round = round,
                         .key = ci->key,
                         .chunk = ci->index,
                         .len = (uint32_t)ci->enc_bytes};
}

const char *psagg_msg_check(const void *msg, size_t msg_len, size_t tag_bytes,
                            enum psagg_msg_type type, const psagg_layout *l,
                            const psagg_chunk_info **ci)
{
    const psagg_msg_hdr *h = msg;
    const psagg_chunk_info *c;

    *ci = NULL;
    if (msg_len < sizeof *h + tag_bytes)
        return "len";
    if (h->magic != PSAGG_MSG_MAGIC)
        return "magic";
    if (h->version != PSAGG_PROTO_VERSION)
        return "version";
    if (h->type != type)
        return "type";
    if (h->epoch != 0)
        return "epoch";
    if (h->key >= l->n_tensors)
        return "key";
    if (h->chunk >= l->tensors[h->key].n_chunks)
        return "chunk";
    c = &l->chunks[l->tensors[h->key].first_chunk + h->chunk];
    if (h->len != c->enc_bytes || msg_len - sizeof *h - tag_bytes != h->len)
        return "len";
    *ci = c;
    return NULL;
}
