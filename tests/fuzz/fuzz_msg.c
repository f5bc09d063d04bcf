/*
 * fuzz_msg.c - a data message as a server or worker takes it from the fabric: the header
 * check against the job's layout (psagg__msg_check), then the payload (psagg__validate,
 * psagg__decode, psagg__decode_add).
 *
 * Input: one flags byte (bit 0: the job has data_auth, so a 16-byte MAC follows the payload;
 * bit 1: the message should be an UPDATE, bit 2: WEIGHTS, else a PUSH), then the message.
 * The layout is fixed (msg_layout.h): five tensors in every codec family, some of several
 * chunks, over two servers. Properties: no crash or out-of-bounds read; a message that passes the
 * check has exactly header + encoded chunk + MAC bytes; a payload that validates decodes to finite
 * numbers, and decode_add onto zeros gives the same numbers. A parameter's push that passes has
 * a trailer whose kind sets the body's length and whose lr and weight decay are finite.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "fuzz.h"
#include "msg_layout.h"
#include "kernels/codec.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/wire.h"

static psagg__layout layout;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const psagg__chunk_info *ci = NULL;
    psagg__msg_codec mc;
    size_t tag, len;
    enum psagg__msg_type type;
    uint8_t *msg;
    const char *bad;

    if (!layout.n_tensors)
        fuzz_msg_layout(&layout);
    if (size < 1)
        return 0;
    tag = data[0] & 1 ? PSAGG_MSG_MAC_BYTES : 0;
    type = data[0] & 4 ? PSAGG_MSG_WEIGHTS : data[0] & 2 ? PSAGG_MSG_UPDATE : PSAGG_MSG_PUSH;
    len = size - 1;
    msg = malloc(len ? len : 1); /* exactly the message: ASan sees any read past it */
    CHECK(msg, "memory");
    memcpy(msg, data + 1, len);
    bad = psagg__msg_check(msg, len, tag, type, &layout, &ci, &mc);
    if (!bad) {
        const psagg__msg_hdr *h = (const psagg__msg_hdr *)msg;
        const psagg_codec *codec = &mc.codec;
        const uint8_t *payload = msg + sizeof *h;
        size_t trailer = mc.param ? sizeof(psagg__msg_param) : 0;
        uint32_t kind = mc.prm.flags & PSAGG_PARAM_KIND_MASK;
        CHECK(ci >= layout.chunks && ci < layout.chunks + layout.n_chunks, "chunk");
        CHECK(ci->key == h->key && ci->index == h->chunk && h->type == type, "fields");
        CHECK(len == sizeof *h + mc.len + trailer + tag && h->len == mc.len + trailer, "len");
        CHECK(!mc.param || (type == PSAGG_MSG_PUSH && layout.tensors[ci->key].param), "param");
        CHECK(type != PSAGG_MSG_WEIGHTS ||
                  (layout.tensors[ci->key].param && codec->id == PSAGG_CODEC_FP32 &&
                   mc.len == 4 * ci->count),
              "weights");
        if (mc.param) {
            CHECK(isfinite(mc.prm.lr) && mc.prm.lr >= 0 && isfinite(mc.prm.weight_decay) &&
                      mc.prm.weight_decay >= 0 && !mc.prm.reserved && kind <= PSAGG_PARAM_PULL,
                  "trailer");
            CHECK(kind == PSAGG_PARAM_GRAD
                      ? mc.len == psagg__encoded_size(codec, ci->count)
                      : mc.len == (kind == PSAGG_PARAM_INIT && h->sender == 0 ? 4 * ci->count : 0),
                  "body of kind %u", kind);
        } else if (type != PSAGG_MSG_WEIGHTS) {
            CHECK(mc.len <= ci->cap_bytes && mc.len == psagg__encoded_size(codec, ci->count),
                  "len");
            if (!layout.tensors[ci->key].adaptive)
                CHECK(!memcmp(codec, &layout.tensors[ci->key].codec, sizeof *codec), "codec");
        }
        if (mc.len == psagg__encoded_size(codec, ci->count) &&
            psagg__validate(codec, payload, mc.len, ci->count) == PSAGG_OK) {
            float *out = malloc(ci->count * sizeof *out), *acc = calloc(ci->count, sizeof *acc);
            CHECK(out && acc, "memory");
            CHECK(psagg__decode(codec, payload, mc.len, ci->count, out) == PSAGG_OK,
                  "decode after validate: %s", psagg_last_error());
            CHECK(psagg__decode_add(codec, payload, mc.len, ci->count, acc) == PSAGG_OK,
                  "decode_add after validate");
            for (uint64_t i = 0; i < ci->count; i++) {
                CHECK(isfinite(out[i]), "element %llu decodes to %g", (unsigned long long)i,
                      (double)out[i]);
                CHECK(acc[i] == out[i], "decode_add differs at %llu", (unsigned long long)i);
            }
            free(out);
            free(acc);
        }
    } else {
        CHECK(bad[0], "an empty field name");
    }
    free(msg);
    return 0;
}
