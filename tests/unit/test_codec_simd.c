/*
 * test_codec_simd.c - every SIMD path (AVX2, AVX-512) against the scalar reference: encoded
 * bytes, residuals, decoded floats, decode_add, the other decode ops (0 + y, y * factor,
 * each also checked against decode's y) and the fused aggregate must be bit-identical
 * for every codec, on random and adversarial inputs, at every size 0..3B+7 (B = 64) and a
 * sample of sizes for B = 1024. An ISA the CPU lacks is skipped (and said so).
 */
#include "test_codec_util.h"

typedef struct result {
    psagg_status st;
    size_t bad;
    uint8_t *enc;
    float *res, *dec, *dadd, *dfirst, *dscale;
} result;

#define SCALE_FACTOR (1.0f / 3.0f)

static void result_free(result *r)
{
    free(r->enc);
    free(r->res);
    free(r->dec);
    free(r->dadd);
    free(r->dfirst);
    free(r->dscale);
}

static void run_one(psagg__isa isa, const psagg_codec *c, const float *x, const float *r0, size_t n,
                    psagg__rng_key key, const float *acc0, result *o)
{
    size_t len = psagg__encoded_size(c, n);
    tc_set_isa(isa);
    o->enc = tc_xmalloc(len);
    memset(o->enc, 0xA5, len); /* every byte (padding too) must be written */
    o->res = NULL;
    if (r0) {
        o->res = tc_xmalloc(n * sizeof(float));
        memcpy(o->res, r0, n * sizeof(float));
    }
    o->dec = tc_xmalloc(n * sizeof(float));
    o->dadd = tc_xmalloc(n * sizeof(float));
    o->dfirst = tc_xmalloc(n * sizeof(float));
    o->dscale = tc_xmalloc(n * sizeof(float));
    memset(o->dec, 0x7F, n * sizeof(float));
    memset(o->dfirst, 0xFF, n * sizeof(float)); /* NaN: FIRST must not read it */
    memset(o->dscale, 0x7F, n * sizeof(float));
    memcpy(o->dadd, acc0, n * sizeof(float));
    o->bad = (size_t)-1;
    o->st = psagg__encode(c, x, o->res, n, key, o->enc, len, &o->bad);
    if (o->st != PSAGG_OK)
        return;
    CHECK(psagg__decode(c, o->enc, len, n, o->dec) == PSAGG_OK, "%s decode: %s", tc_name(c),
          psagg_last_error());
    CHECK(psagg__decode_add(c, o->enc, len, n, o->dadd) == PSAGG_OK, "%s decode_add: %s",
          tc_name(c), psagg_last_error());
    CHECK(psagg__decode_into(c, o->enc, len, n, o->dfirst, PSAGG_DECODE_FIRST, 0.0f) == PSAGG_OK,
          "%s decode first: %s", tc_name(c), psagg_last_error());
    CHECK(psagg__decode_into(c, o->enc, len, n, o->dscale, PSAGG_DECODE_SCALE, SCALE_FACTOR) ==
              PSAGG_OK,
          "%s decode scale: %s", tc_name(c), psagg_last_error());
    for (size_t k = 0; k < n; k++) {
        CHECK(tc_f2u(o->dfirst[k]) == tc_f2u(0.0f + o->dec[k]), "%s first[%zu] %a, y %a",
              tc_name(c), k, o->dfirst[k], o->dec[k]);
        CHECK(tc_f2u(o->dscale[k]) == tc_f2u(o->dec[k] * SCALE_FACTOR), "%s scale[%zu] %a, y %a",
              tc_name(c), k, o->dscale[k], o->dec[k]);
    }
}

static void compare(const char *what, psagg__isa isa, const psagg_codec *c, size_t n, int kind,
                    int with_res, const result *ref, const result *got)
{
    size_t len = psagg__encoded_size(c, n), d;
    char ctx[200];
    snprintf(ctx, sizeof ctx, "%s %s vs scalar, codec %s, n=%zu, data %s, residual %d", what,
             psagg__isa_name(isa), tc_name(c), n, tc_kind_name(kind), with_res);
    CHECK(ref->st == got->st, "%s: status %d vs %d", ctx, ref->st, got->st);
    if (ref->st != PSAGG_OK) {
        CHECK(ref->bad == got->bad, "%s: bad index %zu vs %zu", ctx, ref->bad, got->bad);
        return;
    }
    d = tc_first_diff(ref->enc, got->enc, len);
    CHECK(d == (size_t)-1, "%s: encoded byte %zu of %zu: %02x vs %02x", ctx, d, len, ref->enc[d],
          got->enc[d]);
    if (with_res)
        tc_same_floats(ctx, "residual", ref->res, got->res, n, "", "");
    if (ref->dec) {
        tc_same_floats(ctx, "decoded", ref->dec, got->dec, n, "", "");
        tc_same_floats(ctx, "decode_add", ref->dadd, got->dadd, n, "", "");
        tc_same_floats(ctx, "decode first", ref->dfirst, got->dfirst, n, "", "");
        tc_same_floats(ctx, "decode scale", ref->dscale, got->dscale, n, "", "");
    }
}

static long n_compared;

static void check_encode(psagg__isa isa, const psagg_codec *c, size_t n, int kind, int with_res,
                         uint64_t seed)
{
    float *x = tc_xmalloc(n * 4), *r0 = tc_xmalloc(n * 4), *acc0 = tc_xmalloc(n * 4);
    psagg__rng_key key = psagg__rng_key_make(seed, 7);
    result ref, got;
    tc_fill_inputs(c, n, kind, seed, x, r0, acc0);
    run_one(PSAGG_ISA_SCALAR, c, x, with_res ? r0 : NULL, n, key, acc0, &ref);
    run_one(isa, c, x, with_res ? r0 : NULL, n, key, acc0, &got);
    compare("encode", isa, c, n, kind, with_res, &ref, &got);
    n_compared++;
    result_free(&ref);
    result_free(&got);
    free(x);
    free(r0);
    free(acc0);
}

/* n_in inputs encoded (by scalar) from different data kinds, then aggregated on both. */
static void check_aggregate(psagg__isa isa, const psagg_codec *c, size_t n, size_t n_in, int kind,
                            int with_res, uint64_t seed)
{
    size_t len = psagg__encoded_size(c, n);
    uint8_t *bufs[8], *out_ref = tc_xmalloc(len), *out_got = tc_xmalloc(len);
    const void *in[8];
    float *x = tc_xmalloc(n * 4), *r_ref = tc_xmalloc(n * 4), *r_got = tc_xmalloc(n * 4);
    psagg__rng_key key = psagg__rng_key_make(seed, 3);
    size_t bad_ref = (size_t)-1, bad_got = (size_t)-1;
    psagg_status st_ref, st_got;

    tc_set_isa(PSAGG_ISA_SCALAR);
    for (size_t i = 0; i < n_in; i++) {
        int k = (int)((kind + i) % TC_KIND_COUNT);
        int me = tc_max_exp(c) - 4; /* leave headroom for the sum */
        bufs[i] = tc_xmalloc(len);
        tc_fill(x, n, k, seed * 31 + i, me);
        CHECK(psagg__encode(c, x, NULL, n, psagg__rng_key_make(seed, i), bufs[i], len, NULL) ==
                  PSAGG_OK,
              "encode input: %s", psagg_last_error());
        in[i] = bufs[i];
    }
    tc_fill(r_ref, n, TC_KIND_RANDOM, seed + 1, 0);
    memcpy(r_got, r_ref, n * 4);
    memset(out_ref, 0xA5, len);
    memset(out_got, 0x5A, len);
    st_ref =
        psagg__aggregate(c, in, n_in, len, n, with_res ? r_ref : NULL, key, out_ref, len, &bad_ref);
    tc_set_isa(isa);
    st_got =
        psagg__aggregate(c, in, n_in, len, n, with_res ? r_got : NULL, key, out_got, len, &bad_got);
    char ctx[200];
    snprintf(ctx, sizeof ctx,
             "aggregate %s vs scalar, codec %s, n=%zu, N=%zu, data %s, residual %d",
             psagg__isa_name(isa), tc_name(c), n, n_in, tc_kind_name(kind), with_res);
    CHECK(st_ref == st_got, "%s: status %d vs %d (%s)", ctx, st_ref, st_got, psagg_last_error());
    if (st_ref == PSAGG_OK) {
        size_t d = tc_first_diff(out_ref, out_got, len);
        CHECK(d == (size_t)-1, "%s: byte %zu of %zu: %02x vs %02x", ctx, d, len, out_ref[d],
              out_got[d]);
        tc_same_floats(ctx, "residual", r_ref, r_got, n, "", "");
    } else {
        CHECK(bad_ref == bad_got, "%s: bad index %zu vs %zu", ctx, bad_ref, bad_got);
    }
    n_compared++;
    for (size_t i = 0; i < n_in; i++)
        free(bufs[i]);
    free(out_ref);
    free(out_got);
    free(x);
    free(r_ref);
    free(r_got);
}

int main(void)
{
    psagg_codec codecs[64];
    const uint32_t b64[] = {64}, b1024[] = {1024}, b192[] = {192};
    size_t nc64 = tc_codecs(codecs, b64, 1);
    int tested = 0;

    for (int isa = PSAGG_ISA_AVX2; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa)) {
            printf("SKIP: %s not supported on this CPU/build\n", psagg__isa_name(isa));
            continue;
        }
        tested++;
        n_compared = 0;
        /* B = 64 (and the fp codecs): every size 0..3B+7, every data kind, +-residual */
        for (size_t ci = 0; ci < nc64; ci++)
            for (size_t n = 0; n <= 3 * 64 + 7; n++)
                for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                    check_encode((psagg__isa)isa, &codecs[ci], n, kind, (int)((n + kind) & 1),
                                 1000 * n + (uint64_t)kind + ci);
        /* both residual settings on a few sizes */
        for (size_t ci = 0; ci < nc64; ci++)
            for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                for (int wr = 0; wr < 2; wr++) {
                    static const size_t ns[] = {1, 17, 64, 100, 199};
                    for (size_t si = 0; si < 5; si++)
                        check_encode((psagg__isa)isa, &codecs[ci], ns[si], kind, wr, 77 + si);
                }
        /* B = 1024 and 192: a sample of sizes */
        {
            psagg_codec mc[64];
            size_t nmc = tc_codecs(mc, b1024, 1);
            size_t nmc2 = tc_codecs(mc + nmc, b192, 1);
            static const size_t ns[] = {0,    1,    15,   16,   17,   63,   64,   65,  1000,
                                        1023, 1024, 1025, 2047, 2048, 3000, 3079, 5000};
            for (size_t ci = 3; ci < nmc + nmc2; ci++) {
                if (ci == nmc || ci == nmc + 1 || ci == nmc + 2)
                    continue; /* the fp codecs again */
                for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++)
                    for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                        check_encode((psagg__isa)isa, &mc[ci], ns[si], kind, (int)(si & 1),
                                     ns[si] * 13 + (uint64_t)kind);
            }
            /* aggregate, N = 1..8 */
            for (size_t ci = 0; ci < nc64; ci++)
                for (size_t n_in = 1; n_in <= 8; n_in++)
                    for (size_t n = 0; n <= 3 * 64 + 7; n += 1 + (n_in + n) % 13)
                        check_aggregate((psagg__isa)isa, &codecs[ci], n, n_in,
                                        (int)((n + n_in) % TC_KIND_COUNT), (int)(n & 1),
                                        n * 8 + n_in);
            for (size_t ci = 3; ci < nmc; ci++)
                for (size_t n_in = 1; n_in <= 8; n_in += 1)
                    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si += 2)
                        for (int wr = 0; wr < 2; wr++)
                            check_aggregate((psagg__isa)isa, &mc[ci], ns[si], n_in,
                                            (int)((si + n_in) % TC_KIND_COUNT), wr, ns[si] + n_in);
        }
        printf("%s: %ld comparisons with scalar, all bit-identical\n",
               psagg__isa_name((psagg__isa)isa), n_compared);
    }
    if (!tested) {
        printf("SKIP: no SIMD path to compare\n");
        return TEST_SKIP;
    }
    return 0;
}
