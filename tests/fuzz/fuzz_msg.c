/*
 * fuzz_msg.c - a data message as a server or worker takes it from the fabric: the header
 * check against the job's layout (psagg_msg_check), then the payload (psagg_validate,
 * psagg_decode, psagg_decode_add).
 *
 * Input: one flags byte (bit 0: the job has data_auth, so a 16-byte MAC follows the payload;
 * bit 1: the message should be an UPDATE, else a PUSH), then the message.
 * The layout is fixed: five tensors in every codec family, some of several chunks, over two
 * servers. Properties: no crash or out-of-bounds read; a message that passes the check has
 * exactly header + encoded chunk + MAC bytes; a payload that validates decodes to finite
 * numbers, and decode_add onto zeros gives the same numbers.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "fuzz.h"
#include "kernels/codec.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/wire.h"

static psagg_layout layout;

static void make_layout(void)
{
    static const struct {
        const char *name, *codec;
        uint64_t count;
    } t[] = {{"one", "fp32", 1},
             {"mm4", "maxmin4/512", 5000},
             {"half", "fp16", 3000},
             {"brain", "bf16", 70000},
             {"mm1", "maxmin1/64/nearest", 100000}};
    psagg_ctl_tensor decl[5];
    for (int i = 0; i < 5; i++) {
        psagg_codec c;
        FUZZ_CHECK(psagg_codec_parse(t[i].codec, &c) == PSAGG_OK, "codec %s", t[i].codec);
        FUZZ_CHECK(psagg_tensor_to_wire(t[i].name, t[i].count, &c, &decl[i]) == PSAGG_OK, "decl");
    }
    FUZZ_CHECK(psagg_layout_build(decl, 5, 16384, 2, &layout) == PSAGG_OK, "layout: %s",
               psagg_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const psagg_chunk_info *ci = NULL;
    size_t tag, len;
    enum psagg_msg_type type;
    uint8_t *msg;
    const char *bad;

    if (!layout.n_tensors)
        make_layout();
    if (size < 1)
        return 0;
    tag = data[0] & 1 ? PSAGG_MSG_MAC_BYTES : 0;
    type = data[0] & 2 ? PSAGG_MSG_UPDATE : PSAGG_MSG_PUSH;
    len = size - 1;
    msg = malloc(len ? len : 1); /* exactly the message: ASan sees any read past it */
    FUZZ_CHECK(msg, "memory");
    memcpy(msg, data + 1, len);
    bad = psagg_msg_check(msg, len, tag, type, &layout, &ci);
    if (!bad) {
        const psagg_msg_hdr *h = (const psagg_msg_hdr *)msg;
        const psagg_codec *codec;
        const uint8_t *payload = msg + sizeof *h;
        FUZZ_CHECK(ci >= layout.chunks && ci < layout.chunks + layout.n_chunks, "chunk");
        FUZZ_CHECK(ci->key == h->key && ci->index == h->chunk && h->type == type, "fields");
        FUZZ_CHECK(len == sizeof *h + ci->enc_bytes + tag && h->len == ci->enc_bytes, "len");
        codec = &layout.tensors[ci->key].codec;
        if (psagg_validate(codec, payload, ci->enc_bytes, ci->count) == PSAGG_OK) {
            float *out = malloc(ci->count * sizeof *out), *acc = calloc(ci->count, sizeof *acc);
            FUZZ_CHECK(out && acc, "memory");
            FUZZ_CHECK(psagg_decode(codec, payload, ci->enc_bytes, ci->count, out) == PSAGG_OK,
                       "decode after validate: %s", psagg_last_error());
            FUZZ_CHECK(psagg_decode_add(codec, payload, ci->enc_bytes, ci->count, acc) == PSAGG_OK,
                       "decode_add after validate");
            for (uint64_t i = 0; i < ci->count; i++) {
                FUZZ_CHECK(isfinite(out[i]), "element %llu decodes to %g", (unsigned long long)i,
                           (double)out[i]);
                FUZZ_CHECK(acc[i] == out[i], "decode_add differs at %llu", (unsigned long long)i);
            }
            free(out);
            free(acc);
        }
    } else {
        FUZZ_CHECK(bad[0], "an empty field name");
    }
    free(msg);
    return 0;
}
