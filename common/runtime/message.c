/* runtime/message.c - see runtime/message.h. */
#include "runtime/message.h"

#include "kernels/codec.h"
#include "runtime/adaptive.h"
#include "runtime/config.h"

#include <math.h>
#include <string.h>

uint32_t psagg__msg_codec_word(const psagg_codec *codec, uint32_t generation)
{
    uint32_t w = (uint32_t)codec->id & 7u;
    if (codec->id == PSAGG_CODEC_MAXMIN || codec->id == PSAGG_CODEC_TOPK ||
        codec->id == PSAGG_CODEC_THC)
        w |= (codec->bits & 15u) << 3 | ((uint32_t)codec->rounding & 1u) << 7;
    if (codec->id == PSAGG_CODEC_MAXMIN)
        w |= ((codec->bucket / 64 - 1) & 0x3FFFu) << 8;
    else if (codec->id == PSAGG_CODEC_THC)
        w |= ((uint32_t)__builtin_ctz(codec->bucket ? codec->bucket : 1) - 6) << 8;
    else if (codec->id == PSAGG_CODEC_TOPK)
        w |= ((uint32_t)__builtin_ctz(codec->bucket ? codec->bucket : 1) - 8) << 8 |
             ((codec->k - 1) & 0x3FFu) << 12;
    return w | (generation & PSAGG_MSG_GEN_MASK) << 22;
}

/* The codec a word names (its fields, unchecked; of maxmin all of them: adaptive's check). */
static psagg_codec word_codec(uint32_t w)
{
    psagg_codec c = {(psagg_codec_id)(w & 7u), 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
    if (c.id == PSAGG_CODEC_MAXMIN) {
        c.bits = (w >> 3) & 15u;
        c.rounding = (psagg_rounding)((w >> 7) & 1u);
        c.bucket = (((w >> 8) & 0x3FFFu) + 1) * 64;
    } else if (c.id == PSAGG_CODEC_THC) {
        c.bits = (w >> 3) & 15u;
        c.rounding = (psagg_rounding)((w >> 7) & 1u);
        c.bucket = 64u << ((w >> 8) & 15u);
    }
    return c;
}

void psagg__msg_init(psagg__msg_hdr *h, enum psagg__msg_type type, uint32_t sender, uint32_t round,
                     const psagg__chunk_info *ci, const psagg_codec *codec, uint32_t generation)
{
    *h = (psagg__msg_hdr){.magic = PSAGG_MSG_MAGIC,
                          .type = (uint8_t)type,
                          .version = PSAGG_PROTO_VERSION,
                          .sender = (uint16_t)sender,
                          .round = round,
                          .key = ci->key,
                          .chunk = ci->index,
                          .len = (uint32_t)psagg__encoded_size(codec, ci->count),
                          .codec = psagg__msg_codec_word(codec, generation)};
}

const char *psagg__msg_check(const void *msg, size_t msg_len, size_t tag_bytes,
                             enum psagg__msg_type type, const psagg__layout *l,
                             const psagg__chunk_info **ci, psagg__msg_codec *mc)
{
    const psagg__msg_hdr *h = msg;
    const psagg__tensor_info *ti;
    const psagg__chunk_info *c;
    psagg_codec codec;
    size_t len;

    *ci = NULL;
    if (msg_len < sizeof *h + tag_bytes)
        return "len";
    if (h->magic != PSAGG_MSG_MAGIC)
        return "magic";
    if (h->version != PSAGG_PROTO_VERSION)
        return "version";
    if (h->type != type)
        return "type";
    if (type == PSAGG_MSG_PUSH ? h->summed != 0 : h->summed == 0)
        return "summed";
    if (h->key >= l->n_tensors)
        return "key";
    if (h->chunk >= l->tensors[h->key].n_chunks)
        return "chunk";
    ti = &l->tensors[h->key];
    c = &l->chunks[ti->first_chunk + h->chunk];
    if (type == PSAGG_MSG_WEIGHTS) {
        static const psagg_codec fp32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
        if (!ti->param)
            return "type";
        if (h->codec != psagg__msg_codec_word(&fp32, 0))
            return "codec";
        if (h->len != 4 * c->count || msg_len - sizeof *h - tag_bytes != h->len)
            return "len";
        *ci = c;
        if (mc)
            *mc = (psagg__msg_codec){.codec = fp32, .len = h->len};
        return NULL;
    }
    codec = word_codec(h->codec);
    if (ti->adaptive ? !psagg__adapt_allowed(&ti->codec, ti->chunk_elems, &codec) ||
                           /* (the word as its codec writes it: no bit word_codec skips) */
                           (h->codec & ((1u << 22) - 1)) != psagg__msg_codec_word(&codec, 0)
                     : h->codec != psagg__msg_codec_word(&ti->codec, 0)) /* generation 0 too */
        return "codec";
    if (!ti->adaptive)
        codec = ti->codec;
    len = type == PSAGG_MSG_UPDATE ? psagg__update_size(&codec, c->count, h->summed)
                                   : psagg__encoded_size(&codec, c->count);
    if (!len ||
        len > (type == PSAGG_MSG_UPDATE ? psagg__update_cap(&codec, c->count) : c->cap_bytes))
        return "len";
    if (ti->param && type == PSAGG_MSG_PUSH) {
        psagg__msg_param prm;
        size_t body = msg_len - sizeof *h - tag_bytes;
        if (body != h->len || body < sizeof prm)
            return "len";
        body -= sizeof prm;
        memcpy(&prm, (const uint8_t *)msg + sizeof *h + body, sizeof prm);
        if (prm.reserved ||
            (prm.flags & ~(PSAGG_PARAM_KIND_MASK | PSAGG_PARAM_AVERAGE | PSAGG_PARAM_SYNC)))
            return "trailer";
        switch (prm.flags & PSAGG_PARAM_KIND_MASK) {
        case PSAGG_PARAM_GRAD:
            break;
        case PSAGG_PARAM_INIT:
            len = h->sender == 0 ? 4 * c->count : 0;
            if (h->round != 0)
                return "round";
            break;
        case PSAGG_PARAM_PULL:
            len = 0;
            break;
        default:
            return "kind";
        }
        if (!isfinite(prm.lr) || prm.lr < 0 || prm.lr > PSAGG_LR_MAX)
            return "lr";
        if (!isfinite(prm.weight_decay) || prm.weight_decay < 0 || prm.weight_decay > PSAGG_LR_MAX)
            return "weight_decay";
        if (!isfinite(prm.weight) || !(prm.weight > 0) || prm.weight > PSAGG_PARAM_WEIGHT_MAX)
            return "weight";
        if (body != len)
            return "len";
        *ci = c;
        if (mc)
            *mc = (psagg__msg_codec){codec, h->codec >> 22, len, 1, prm};
        return NULL;
    }
    if (h->len != len || msg_len - sizeof *h - tag_bytes != h->len)
        return "len";
    *ci = c;
    if (mc)
        *mc = (psagg__msg_codec){.codec = codec, .generation = h->codec >> 22, .len = len};
    return NULL;
}
