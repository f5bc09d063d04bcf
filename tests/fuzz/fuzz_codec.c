/*
 * fuzz_codec.c - every codec on every CPU path this machine has (scalar, AVX2, AVX-512),
 * against each other: encoded buffers from anyone (validate, decode, decode_add, aggregate)
 * and numbers from anyone (encode with error feedback).
 *
 * Input: byte 0 picks the codec (fp32, fp16, bf16, maxmin1..8; bucket; rounding), bytes 1-2
 * the element count n (1..4096), byte 3 the operation (bit 0: encode, else decode), then the
 * buffer: an encoded chunk of n elements, or the floats to encode (n of them, zero-padded).
 * Properties: no crash or out-of-bounds access on any path, and every path returns the same
 * status and the same bytes as the scalar reference: a SIMD path that accepts what scalar
 * refuses, or reads a bucket differently, is a bug the server would turn into a wrong sum.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "fuzz.h"
#include "kernels/codec.h"

struct result {
    psagg_status st;
    size_t bad;
    uint8_t *bytes; /* outputs of the operation, compared bytewise */
    size_t len;
};

static void pick_codec(uint8_t b, psagg_codec *c)
{
    static const uint32_t buckets[] = {64, 128, 512, 1024};
    int kind = b % 11;
    memset(c, 0, sizeof *c);
    c->id = kind == 0   ? PSAGG_CODEC_FP32
            : kind == 1 ? PSAGG_CODEC_FP16
            : kind == 2 ? PSAGG_CODEC_BF16
                        : PSAGG_CODEC_MAXMIN;
    c->bits = kind >= 3 ? (uint32_t)kind - 2 : 0;
    c->bucket = buckets[(b / 11) % 4];
    c->rounding = b & 0x80 ? PSAGG_ROUND_NEAREST : PSAGG_ROUND_STOCHASTIC;
    CHECK(psagg__codec_check(c) == PSAGG_OK, "codec: %s", psagg_last_error());
}

/* decode side: validate, decode, decode_add onto a pattern, aggregate three copies */
static void run_decode(const psagg_codec *c, const uint8_t *in, size_t in_len, size_t n,
                       struct result *r)
{
    size_t enc = psagg__encoded_size(c, n);
    float *out = malloc(n * sizeof *out), *acc = malloc(n * sizeof *acc);
    uint8_t *agg = malloc(enc);
    const void *ins[3] = {in, in, in};
    CHECK(out && acc && agg, "memory");
    r->st = psagg__validate(c, in, in_len, n);
    r->bad = 0;
    r->len = 0;
    r->bytes = malloc(2 * n * sizeof(float) + enc);
    CHECK(r->bytes, "memory");
    if (r->st == PSAGG_OK) {
        for (size_t i = 0; i < n; i++)
            acc[i] = (float)((int)(i % 7) - 3) * 0.25f;
        CHECK(psagg__decode(c, in, in_len, n, out) == PSAGG_OK, "decode after validate");
        CHECK(psagg__decode_add(c, in, in_len, n, acc) == PSAGG_OK, "decode_add");
        r->st = psagg__aggregate(c, ins, 3, in_len, n, NULL, psagg__rng_key_make(7, 9), agg, enc,
                                 &r->bad);
        memcpy(r->bytes, out, n * sizeof *out);
        memcpy(r->bytes + n * sizeof *out, acc, n * sizeof *acc);
        r->len = 2 * n * sizeof(float);
        if (r->st == PSAGG_OK) {
            memcpy(r->bytes + r->len, agg, enc);
            r->len += enc;
        }
    }
    free(out);
    free(acc);
    free(agg);
}

/* encode side: x (+ residual) -> bytes and the new residual */
static void run_encode(const psagg_codec *c, const float *x, size_t n, struct result *r)
{
    size_t enc = psagg__encoded_size(c, n);
    float *res = malloc(n * sizeof *res);
    CHECK(res, "memory");
    for (size_t i = 0; i < n; i++)
        res[i] = (float)((int)(i % 5) - 2) * 0.125f;
    r->bytes = calloc(1, enc + n * sizeof *res);
    CHECK(r->bytes, "memory");
    r->bad = (size_t)-1;
    r->st = psagg__encode(c, x, res, n, psagg__rng_key_make(3, 4), r->bytes, enc, &r->bad);
    r->len = 0;
    if (r->st == PSAGG_OK) {
        memcpy(r->bytes + enc, res, n * sizeof *res);
        r->len = enc + n * sizeof *res;
    }
    free(res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    psagg_codec c;
    size_t n, len;
    int encode;
    uint8_t *buf;
    struct result ref = {0};

    if (size < 4)
        return 0;
    pick_codec(data[0], &c);
    n = 1 + fuzz_u16(data + 1) % 4096;
    encode = data[3] & 1;
    len = size - 4;
    if (encode) { /* n floats, zero-padded: their own buffer */
        buf = calloc(n, sizeof(float));
        CHECK(buf, "memory");
        memcpy(buf, data + 4, len < n * sizeof(float) ? len : n * sizeof(float));
    } else {
        buf = malloc(len ? len : 1); /* exactly the buffer: ASan sees any read past it */
        CHECK(buf, "memory");
        memcpy(buf, data + 4, len);
    }
    for (int isa = PSAGG_ISA_SCALAR; isa < PSAGG_ISA_COUNT; isa++) {
        struct result r = {0};
        if (!psagg__isa_supported((psagg__isa)isa))
            continue;
        CHECK(psagg__codec_set_isa((psagg__isa)isa) == PSAGG_OK, "set isa");
        if (encode)
            run_encode(&c, (const float *)buf, n, &r);
        else
            run_decode(&c, buf, len, n, &r);
        if (isa == PSAGG_ISA_SCALAR) {
            ref = r;
            continue;
        }
        CHECK(r.st == ref.st, "%s: status %d, scalar %d", psagg__isa_name((psagg__isa)isa), r.st,
              ref.st);
        CHECK(r.st == PSAGG_OK || r.bad == ref.bad, "%s: bad index %zu, scalar %zu",
              psagg__isa_name((psagg__isa)isa), r.bad, ref.bad);
        CHECK(r.len == ref.len && !memcmp(r.bytes, ref.bytes, r.len),
              "%s: output differs from scalar", psagg__isa_name((psagg__isa)isa));
        free(r.bytes);
    }
    free(ref.bytes);
    free(buf);
    return 0;
}
