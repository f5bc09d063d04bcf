/*
 * test_codec_errors.c - the error rules of kernels/codec.h on every available ISA: invalid
 * codecs, NaN/Inf and out-of-range inputs (with the first bad index, wherever it falls in a
 * SIMD vector or the tail), wrong lengths, invalid meta, and the sizes 0 and 1.
 */
#include <float.h>

#include "test_codec_util.h"

static void test_codec_check(void)
{
    psagg_codec c = {.id = PSAGG_CODEC_MAXMIN, .bits = 4, .bucket = 0, .rounding = 0};
    CHECK(psagg__codec_check(&c) == PSAGG_OK && c.bucket == 1024, "bucket 0 -> 1024");
    c.bits = 0;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "bits 0");
    CHECK(strstr(psagg_last_error(), "bits") != NULL, "message names bits: %s", psagg_last_error());
    c.bits = 9;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "bits 9");
    c.bits = 4;
    c.bucket = 100;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "bucket 100");
    CHECK(strstr(psagg_last_error(), "bucket") != NULL, "message names bucket");
    c.bucket = 32;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "bucket 32");
    c.bucket = (1u << 20) + 64;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "bucket > 2^20");
    c.bucket = 1u << 20;
    CHECK(psagg__codec_check(&c) == PSAGG_OK, "bucket 2^20");
    c.rounding = (psagg_rounding)5;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "rounding 5");
    c.rounding = 0;
    c.id = (psagg_codec_id)7;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "id 7");
    c.id = PSAGG_CODEC_DEFAULT;
    CHECK(psagg__codec_check(&c) == PSAGG_EINVAL, "id default");
    CHECK(psagg__encoded_size(&c, 10) == 0, "size of an invalid codec");
    {
        psagg_codec bad = {.id = PSAGG_CODEC_MAXMIN, .bits = 9, .bucket = 64, .rounding = 0};
        float x[4] = {0};
        uint8_t out[64];
        float acc[4];
        const void *in[1] = {out};
        CHECK(psagg__encode(&bad, x, NULL, 4, psagg__rng_key_make(0, 0), out, 16, NULL) ==
                  PSAGG_EINVAL,
              "encode with bits 9");
        CHECK(psagg__decode(&bad, out, 16, 4, acc) == PSAGG_EINVAL, "decode with bits 9");
        CHECK(psagg__aggregate(&bad, in, 1, 16, 4, NULL, psagg__rng_key_make(0, 0), out, 16,
                               NULL) == PSAGG_EINVAL,
              "aggregate with bits 9");
        bad.bits = 4;
        bad.bucket = 100;
        CHECK(psagg__encode(&bad, x, NULL, 4, psagg__rng_key_make(0, 0), out, 16, NULL) ==
                  PSAGG_EINVAL,
              "encode with bucket 100");
    }
    CHECK(psagg__codec_set_isa((psagg__isa)9) == PSAGG_EINVAL, "set_isa 9");
}

/* Encode n values where x[pos] = bad_val (and later positions hold other bad values). */
static void expect_bad(const psagg_codec *c, size_t n, size_t pos, float bad_val, psagg_status want,
                       int with_res)
{
    size_t len = psagg__encoded_size(c, n), bad = 12345;
    float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4);
    uint8_t *out = tc_xmalloc(len);
    psagg_status st;
    tc_fill(x, n, TC_KIND_RANDOM, n + pos, 0);
    for (size_t i = 0; i < n; i++)
        r[i] = 0.0f;
    if (with_res) { /* the bad value appears only in x + r */
        x[pos] = bad_val == bad_val ? bad_val * 0.5f : bad_val;
        r[pos] = bad_val == bad_val ? bad_val * 0.5f : 0.0f;
        if (isinf(bad_val))
            x[pos] = r[pos] = bad_val > 0 ? FLT_MAX : -FLT_MAX;
    } else {
        x[pos] = bad_val;
    }
    for (size_t i = pos + 1; i < n; i += 3) /* later bad elements must not win */
        x[i] = (i & 1) ? NAN : INFINITY;
    st = psagg__encode(c, x, with_res ? r : NULL, n, psagg__rng_key_make(0, 0), out, len, &bad);
    CHECK(st == want && bad == pos,
          "%s (isa %s) n=%zu x[%zu]=%a residual %d: status %d index %zu, expected %d index %zu "
          "(%s)",
          tc_name(c), psagg__isa_name(psagg__codec_isa()), n, pos, bad_val, with_res, st, bad, want,
          pos, psagg_last_error());
    CHECK(strlen(psagg_last_error()) > 0, "message");
    free(x);
    free(r);
    free(out);
}

static void test_bad_inputs(void)
{
    psagg_codec codecs[64];
    const uint32_t bl[] = {64};
    size_t nc = tc_codecs(codecs, bl, 1);
    static const size_t pos_n[][2] = {{0, 1},     {0, 40},    {5, 40},  {13, 16},
                                      {21, 40},   {35, 37},   {39, 40}, {70, 150},
                                      {140, 150}, {149, 150}, {7, 9},   {200, 203}};
    for (size_t ci = 0; ci < nc; ci++) {
        const psagg_codec *c = &codecs[ci];
        for (size_t p = 0; p < sizeof pos_n / sizeof pos_n[0]; p++) {
            size_t pos = pos_n[p][0], n = pos_n[p][1];
            for (int wr = 0; wr < 2; wr++) {
                expect_bad(c, n, pos, NAN, PSAGG_ENONFINITE, wr);
                expect_bad(c, n, pos, INFINITY, PSAGG_ENONFINITE, wr);
                expect_bad(c, n, pos, -INFINITY, PSAGG_ENONFINITE, wr);
                if (c->id == PSAGG_CODEC_FP16) {
                    expect_bad(c, n, pos, 65520.0f, PSAGG_ERANGE, wr);
                    expect_bad(c, n, pos, -70000.0f, PSAGG_ERANGE, wr);
                } else if (c->id == PSAGG_CODEC_BF16) {
                    expect_bad(c, n, pos, FLT_MAX, PSAGG_ERANGE, wr);
                    expect_bad(c, n, pos, -tc_u2f(0x7F7F8000u), PSAGG_ERANGE, wr);
                } else if (c->id == PSAGG_CODEC_MAXMIN) {
                    expect_bad(c, n, pos, 0x1p126f, PSAGG_ERANGE, wr);
                    expect_bad(c, n, pos, -FLT_MAX, PSAGG_ERANGE, wr);
                }
            }
        }
    }
    /* just inside the limits */
    {
        psagg_codec h = tc_codec(PSAGG_CODEC_FP16, 0, 0, 0);
        psagg_codec b = tc_codec(PSAGG_CODEC_BF16, 0, 0, 0);
        psagg_codec m = tc_codec(PSAGG_CODEC_MAXMIN, 4, 64, 0);
        float xh[3] = {65519.996f, -65519.0f, 65504.0f};
        float xb[2] = {tc_u2f(0x7F7F7FFFu), -tc_u2f(0x7F7F7FFFu)};
        float xm[3] = {0x1.fffffep125f, -0x1.fffffep125f, 0.0f};
        uint8_t out[64];
        CHECK(psagg__encode(&h, xh, NULL, 3, psagg__rng_key_make(0, 0), out, 6, NULL) == PSAGG_OK,
              "fp16 limit: %s", psagg_last_error());
        CHECK(psagg__encode(&b, xb, NULL, 2, psagg__rng_key_make(0, 0), out, 4, NULL) == PSAGG_OK,
              "bf16 limit: %s", psagg_last_error());
        CHECK(psagg__encode(&m, xm, NULL, 3, psagg__rng_key_make(0, 0), out, 16, NULL) == PSAGG_OK,
              "maxmin limit: %s", psagg_last_error());
    }
    /* a finite sum that overflows in the aggregate */
    {
        psagg_codec f = tc_codec(PSAGG_CODEC_FP32, 0, 0, 0);
        float x[20];
        uint8_t a[80], out[80];
        const void *in[2] = {a, a};
        size_t bad = 0;
        for (int i = 0; i < 20; i++)
            x[i] = i == 17 ? FLT_MAX : 1.0f;
        CHECK(psagg__encode(&f, x, NULL, 20, psagg__rng_key_make(0, 0), a, 80, NULL) == PSAGG_OK,
              "%s", psagg_last_error());
        CHECK(psagg__aggregate(&f, in, 2, 80, 20, NULL, psagg__rng_key_make(0, 0), out, 80, &bad) ==
                      PSAGG_ENONFINITE &&
                  bad == 17,
              "aggregate overflow: index %zu", bad);
    }
}

static void put_meta(uint8_t *p, size_t m, float scale, float lo)
{
    memcpy(p + 8 * m, &scale, 4);
    memcpy(p + 8 * m + 4, &lo, 4);
}

static void test_bad_buffers(void)
{
    psagg_codec m = tc_codec(PSAGG_CODEC_MAXMIN, 4, 64, PSAGG_ROUND_STOCHASTIC);
    const size_t n = 150;
    size_t len = psagg__encoded_size(&m, n), bad;
    uint8_t *good = tc_xmalloc(len), *buf = tc_xmalloc(len), *out = tc_xmalloc(len);
    float x[150], acc[150];
    const struct {
        float scale, lo;
        const char *what;
    } metas[] = {{NAN, 0.0f, "NaN scale"},
                 {-1.0f, 0.0f, "negative scale"},
                 {-0.0f, 0.0f, "-0 scale"},
                 {INFINITY, 0.0f, "Inf scale"},
                 {1.0f, NAN, "NaN min"},
                 {1.0f, -INFINITY, "-Inf min"},
                 {1e37f, 3e38f, "min+scale*L overflow"}};
    CHECK(len == 8 * 3 + 8 * ((150 * 4 + 63) / 64), "maxmin size %zu", len);
    tc_fill(x, n, TC_KIND_RANDOM, 1, 0);
    CHECK(psagg__encode(&m, x, NULL, n, psagg__rng_key_make(1, 1), good, len, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    /* lengths */
    CHECK(psagg__encode(&m, x, NULL, n, psagg__rng_key_make(1, 1), out, len - 1, NULL) ==
              PSAGG_EBADLEN,
          "encode short output");
    CHECK(strstr(psagg_last_error(), "expected") != NULL, "EBADLEN message: %s",
          psagg_last_error());
    CHECK(psagg__decode(&m, good, len + 1, n, acc) == PSAGG_EBADLEN, "decode long input");
    CHECK(psagg__decode(&m, good, len - 8, n, acc) == PSAGG_EBADLEN, "decode short input");
    CHECK(psagg__decode(&m, good, 0, n, acc) == PSAGG_EBADLEN, "decode empty input");
    CHECK(psagg__validate(&m, good, len, n + 64) == PSAGG_EBADLEN, "n + 64 elements");
    {
        const void *in[2] = {good, good};
        CHECK(psagg__aggregate(&m, in, 2, len - 1, n, NULL, psagg__rng_key_make(0, 0), out, len,
                               NULL) == PSAGG_EBADLEN,
              "aggregate input length");
        CHECK(psagg__aggregate(&m, in, 2, len, n, NULL, psagg__rng_key_make(0, 0), out, len + 8,
                               NULL) == PSAGG_EBADLEN,
              "aggregate output length");
    }
    /* meta */
    for (size_t k = 0; k < sizeof metas / sizeof metas[0]; k++)
        for (size_t bucket = 0; bucket < 3; bucket++) {
            const void *in[3] = {good, good, buf};
            memcpy(buf, good, len);
            put_meta(buf, bucket, metas[k].scale, metas[k].lo);
            CHECK(psagg__validate(&m, buf, len, n) == PSAGG_EBADMETA, "validate %s", metas[k].what);
            CHECK(psagg__decode(&m, buf, len, n, acc) == PSAGG_EBADMETA, "decode %s",
                  metas[k].what);
            CHECK(psagg__decode_add(&m, buf, len, n, acc) == PSAGG_EBADMETA, "decode_add %s",
                  metas[k].what);
            bad = 99;
            CHECK(psagg__aggregate(&m, in, 3, len, n, NULL, psagg__rng_key_make(0, 0), out, len,
                                   &bad) == PSAGG_EBADMETA &&
                      bad == 2,
                  "aggregate %s: bad input %zu", metas[k].what, bad);
            CHECK(strstr(psagg_last_error(), "input 2") != NULL, "message names input: %s",
                  psagg_last_error());
        }
    /* valid edge meta: scale +0, and min + scale*L just finite */
    memcpy(buf, good, len);
    put_meta(buf, 1, 0.0f, -3.0f);
    put_meta(buf, 2, 1e37f, 1.8e38f); /* 1.8e38 + 15e37 = 3.3e38 < FLT_MAX */
    CHECK(psagg__validate(&m, buf, len, n) == PSAGG_OK, "edge meta: %s", psagg_last_error());
    CHECK(psagg__decode(&m, buf, len, n, acc) == PSAGG_OK && acc[64] == -3.0f, "edge decode");
    /* NaN / Inf inside fp buffers */
    {
        psagg_codec f32 = tc_codec(PSAGG_CODEC_FP32, 0, 0, 0);
        psagg_codec f16 = tc_codec(PSAGG_CODEC_FP16, 0, 0, 0);
        psagg_codec b16 = tc_codec(PSAGG_CODEC_BF16, 0, 0, 0);
        uint8_t fb[4 * 40];
        const void *in[2] = {fb, fb};
        memset(fb, 0, sizeof fb);
        fb[4 * 33 + 3] = 0x7F;
        fb[4 * 33 + 2] = 0x80; /* +Inf */
        CHECK(psagg__decode(&f32, fb, 160, 40, acc) == PSAGG_ENONFINITE, "fp32 Inf");
        CHECK(strstr(psagg_last_error(), "33") != NULL, "index in message: %s", psagg_last_error());
        bad = 5;
        CHECK(psagg__aggregate(&f32, in, 2, 160, 40, NULL, psagg__rng_key_make(0, 0), out, 160,
                               &bad) == PSAGG_ENONFINITE &&
                  bad == 0,
              "aggregate fp32 Inf input");
        memset(fb, 0, sizeof fb);
        fb[2 * 21 + 1] = 0x7E; /* fp16 NaN */
        CHECK(psagg__decode(&f16, fb, 80, 40, acc) == PSAGG_ENONFINITE, "fp16 NaN");
        memset(fb, 0, sizeof fb);
        fb[2 * 39 + 1] = 0xFF;
        fb[2 * 39] = 0x80; /* bf16 -Inf */
        CHECK(psagg__decode(&b16, fb, 80, 40, acc) == PSAGG_ENONFINITE, "bf16 -Inf");
        CHECK(psagg__decode(&b16, fb, 79, 40, acc) == PSAGG_EBADLEN, "bf16 odd length");
    }
    free(good);
    free(buf);
    free(out);
}

static void test_small_sizes(void)
{
    psagg_codec codecs[64];
    const uint32_t bl[] = {64, 1024};
    size_t nc = tc_codecs(codecs, bl, 2);
    for (size_t ci = 0; ci < nc; ci++) {
        const psagg_codec *c = &codecs[ci];
        float x = -0.75f, r = 0.125f, y = 0, acc = 1.0f;
        uint8_t out[16], agg[16];
        const void *in[2] = {out, out};
        size_t len1 = psagg__encoded_size(c, 1);
        CHECK(psagg__encoded_size(c, 0) == 0, "%s size 0", tc_name(c));
        CHECK(psagg__encode(c, NULL, NULL, 0, psagg__rng_key_make(0, 0), NULL, 0, NULL) == PSAGG_OK,
              "%s encode 0: %s", tc_name(c), psagg_last_error());
        CHECK(psagg__decode(c, NULL, 0, 0, NULL) == PSAGG_OK, "%s decode 0", tc_name(c));
        CHECK(psagg__aggregate(c, in, 2, 0, 0, NULL, psagg__rng_key_make(0, 0), NULL, 0, NULL) ==
                  PSAGG_OK,
              "%s aggregate 0", tc_name(c));
        CHECK(len1 <= sizeof out, "len1");
        CHECK(psagg__encode(c, &x, &r, 1, psagg__rng_key_make(0, 0), out, len1, NULL) == PSAGG_OK,
              "%s encode 1: %s", tc_name(c), psagg_last_error());
        CHECK(psagg__decode(c, out, len1, 1, &y) == PSAGG_OK, "%s decode 1", tc_name(c));
        /* one element is a constant bucket for maxmin: exact */
        CHECK(y + r == -0.625f, "%s n=1: decoded %a + residual %a", tc_name(c), y, r);
        CHECK(psagg__decode_add(c, out, len1, 1, &acc) == PSAGG_OK && acc == 1.0f + y,
              "%s decode_add 1", tc_name(c));
        CHECK(psagg__aggregate(c, in, 2, len1, 1, NULL, psagg__rng_key_make(0, 0), agg, len1,
                               NULL) == PSAGG_OK,
              "%s aggregate 1: %s", tc_name(c), psagg_last_error());
        CHECK(psagg__decode(c, agg, len1, 1, &y) == PSAGG_OK && y == -1.25f,
              "%s aggregate 1 value %a", tc_name(c), y);
    }
}

int main(void)
{
    test_codec_check();
    for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa)) {
            printf("SKIP isa %s: not supported here\n", psagg__isa_name((psagg__isa)isa));
            continue;
        }
        tc_set_isa((psagg__isa)isa);
        test_bad_inputs();
        test_bad_buffers();
        test_small_sizes();
        printf("isa %s: error rules hold\n", psagg__isa_name((psagg__isa)isa));
    }
    return 0;
}
