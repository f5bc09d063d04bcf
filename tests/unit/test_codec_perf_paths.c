/*
 * test_codec_perf_paths.c - the SIMD fast paths' edge cases against the scalar reference:
 * whole-byte maxmin widths (b = 1, 2, 4, 8) whose groups of 128/b elements straddle bucket
 * and buffer tails (buckets 64..1024, including ones that are not a multiple of a group),
 * encode and the fused aggregate with and without residuals, out-of-range sums and bad
 * values at every position of a group (the reported index must be the first in element
 * order), -0 minima, and fp aggregates/decodes. Outputs, residuals, statuses and bad
 * indices must be identical.
 */
#include "test_codec_util.h"

static long n_compared;

static size_t first_diff(const void *a, const void *b, size_t len)
{
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < len; i++)
        if (x[i] != y[i])
            return i;
    return (size_t)-1;
}

typedef struct run {
    psagg_status st;
    size_t bad;
    uint8_t *enc;
    float *res;
} run;

static void enc_run(psagg__isa isa, const psagg_codec *c, const float *x, const float *r0, size_t n,
                    psagg__rng_key key, run *o)
{
    size_t len = psagg__encoded_size(c, n);
    tc_set_isa(isa);
    o->enc = tc_xmalloc(len);
    memset(o->enc, 0xC3, len);
    o->res = NULL;
    if (r0) {
        o->res = tc_xmalloc(n * 4);
        memcpy(o->res, r0, n * 4);
    }
    o->bad = (size_t)-7;
    o->st = psagg__encode(c, x, o->res, n, key, o->enc, len, &o->bad);
}

static void compare_runs(const char *ctx, const psagg_codec *c, size_t n, run *a, run *b)
{
    size_t len = psagg__encoded_size(c, n), d;
    CHECK(a->st == b->st, "%s: status %d vs %d", ctx, a->st, b->st);
    if (a->st == PSAGG_OK) {
        d = first_diff(a->enc, b->enc, len);
        CHECK(d == (size_t)-1, "%s: byte %zu of %zu: %02x vs %02x", ctx, d, len, a->enc[d],
              b->enc[d]);
        if (a->res) {
            d = first_diff(a->res, b->res, n * 4);
            CHECK(d == (size_t)-1, "%s: residual[%zu] %a vs %a", ctx, d / 4, a->res[d / 4],
                  b->res[d / 4]);
        }
    } else {
        CHECK(a->bad == b->bad, "%s: bad index %zu vs %zu", ctx, a->bad, b->bad);
    }
    free(a->enc);
    free(b->enc);
    free(a->res);
    free(b->res);
    n_compared++;
}

static void check_encode(psagg__isa isa, const psagg_codec *c, size_t n, int kind, int wr,
                         long poison, float pv, uint64_t seed)
{
    float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4);
    psagg__rng_key key = psagg__rng_key_make(seed, 11);
    run a, b;
    char ctx[200];
    tc_fill(x, n, kind, seed, 124);
    tc_fill(r, n, TC_KIND_RANDOM, seed + 5, 0);
    if (kind == TC_KIND_ZEROS && (seed & 1)) /* minimum exactly -0 or +0 */
        for (size_t k = 0; k < n; k++)
            if (x[k] < 0.0f)
                x[k] = (seed & 2) ? 1.0f : 0.0f;
    if (poison >= 0 && (size_t)poison < n)
        x[poison] = pv;
    enc_run(PSAGG_ISA_SCALAR, c, x, wr ? r : NULL, n, key, &a);
    enc_run(isa, c, x, wr ? r : NULL, n, key, &b);
    snprintf(ctx, sizeof ctx, "encode %s %s n=%zu data %s residual %d poison %ld=%g",
             psagg__isa_name(isa), tc_name(c), n, tc_kind_name(kind), wr, poison, (double)pv);
    compare_runs(ctx, c, n, &a, &b);
    free(x);
    free(r);
}

/* N inputs; big != 0 makes the inputs large enough that the sum leaves |s| < 2^126. */
static void check_aggregate(psagg__isa isa, const psagg_codec *c, size_t n, size_t n_in, int kind,
                            int wr, int big, long poison, float pv, uint64_t seed)
{
    size_t len = psagg__encoded_size(c, n);
    uint8_t *bufs[8];
    const void *in[8];
    float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4);
    psagg__rng_key key = psagg__rng_key_make(seed, 3);
    run o[2];
    char ctx[240];

    tc_set_isa(PSAGG_ISA_SCALAR);
    for (size_t i = 0; i < n_in; i++) {
        bufs[i] = tc_xmalloc(len);
        tc_fill(x, n, (int)((kind + i) % TC_KIND_COUNT), seed * 31 + i, big ? 125 : 120);
        if (big)
            for (size_t k = 0; k < n; k++)
                x[k] = (k * 7 + i) % 5 == 0 ? 0x1.8p125f : x[k];
        CHECK(psagg__encode(c, x, NULL, n, psagg__rng_key_make(seed, i), bufs[i], len, NULL) ==
                  PSAGG_OK,
              "encode input: %s", psagg_last_error());
        in[i] = bufs[i];
    }
    tc_fill(r, n, TC_KIND_RANDOM, seed + 1, 0);
    if (poison >= 0 && (size_t)poison < n)
        r[poison] = pv;
    for (int k = 0; k < 2; k++) {
        tc_set_isa(k ? isa : PSAGG_ISA_SCALAR);
        o[k].enc = tc_xmalloc(len);
        memset(o[k].enc, k ? 0x5A : 0xA5, len);
        o[k].res = NULL;
        if (wr) {
            o[k].res = tc_xmalloc(n * 4);
            memcpy(o[k].res, r, n * 4);
        }
        o[k].bad = (size_t)-7;
        o[k].st = psagg__aggregate(c, in, n_in, len, n, o[k].res, key, o[k].enc, len, &o[k].bad);
    }
    snprintf(
        ctx, sizeof ctx, "aggregate %s %s n=%zu N=%zu data %s residual %d big %d poison %ld=%g",
        psagg__isa_name(isa), tc_name(c), n, n_in, tc_kind_name(kind), wr, big, poison, (double)pv);
    compare_runs(ctx, c, n, &o[0], &o[1]);
    for (size_t i = 0; i < n_in; i++)
        free(bufs[i]);
    free(x);
    free(r);
}

static void check_fp(psagg__isa isa, const psagg_codec *c, size_t n, size_t n_in, int wr,
                     uint64_t seed)
{
    size_t len = psagg__encoded_size(c, n);
    uint8_t *bufs[8];
    const void *in[8];
    float *x = tc_xmalloc(n * 4), *d[2];
    run o[2];
    char ctx[200];
    tc_set_isa(PSAGG_ISA_SCALAR);
    for (size_t i = 0; i < n_in; i++) {
        bufs[i] = tc_xmalloc(len);
        tc_fill(x, n, (int)((seed + i) % TC_KIND_COUNT), seed + i, tc_max_exp(c) - 4);
        CHECK(psagg__encode(c, x, NULL, n, psagg__rng_key_make(0, 0), bufs[i], len, NULL) ==
                  PSAGG_OK,
              "encode fp input: %s", psagg_last_error());
        in[i] = bufs[i];
    }
    tc_fill(x, n, TC_KIND_RANDOM, seed + 9, 0);
    for (int k = 0; k < 2; k++) {
        tc_set_isa(k ? isa : PSAGG_ISA_SCALAR);
        o[k].enc = tc_xmalloc(len);
        o[k].res = NULL;
        if (wr) {
            o[k].res = tc_xmalloc(n * 4);
            memcpy(o[k].res, x, n * 4);
        }
        o[k].bad = (size_t)-7;
        o[k].st = psagg__aggregate(c, in, n_in, len, n, o[k].res, psagg__rng_key_make(0, 0),
                                   o[k].enc, len, &o[k].bad);
        d[k] = tc_xmalloc(n * 4);
        memcpy(d[k], x, n * 4);
        CHECK(psagg__decode_add(c, in[0], len, n, d[k]) == PSAGG_OK, "decode_add: %s",
              psagg_last_error());
    }
    snprintf(ctx, sizeof ctx, "fp %s %s n=%zu N=%zu residual %d", psagg__isa_name(isa), tc_name(c),
             n, n_in, wr);
    CHECK(first_diff(d[0], d[1], n * 4) == (size_t)-1, "%s: decode_add differs", ctx);
    compare_runs(ctx, c, n, &o[0], &o[1]);
    for (size_t i = 0; i < n_in; i++)
        free(bufs[i]);
    free(x);
    free(d[0]);
    free(d[1]);
}

int main(void)
{
    static const uint32_t buckets[] = {64, 128, 192, 256, 1024};
    static const uint32_t widths[] = {1, 2, 4, 8, 3, 5};
    static const size_t sizes[] = {1,   15,  16,  17,   31,   33,   63,   64,   65,   100,
                                   127, 128, 129, 191,  193,  255,  257,  300,  383,  385,
                                   511, 513, 700, 1023, 1024, 1025, 1040, 2047, 2100, 3333};
    static const float poisons[] = {NAN, INFINITY, -INFINITY, 0x1p126f, -0x1.8p126f};
    int tested = 0;

    for (int isa = PSAGG_ISA_AVX2; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa)) {
            printf("SKIP: %s not supported on this CPU/build\n", psagg__isa_name(isa));
            continue;
        }
        tested++;
        n_compared = 0;
        for (size_t bi = 0; bi < sizeof buckets / sizeof buckets[0]; bi++)
            for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
                for (int rnd = 0; rnd < 2; rnd++) {
                    psagg_codec c =
                        tc_codec(PSAGG_CODEC_MAXMIN, widths[wi], buckets[bi], (psagg_rounding)rnd);
                    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                        size_t n = sizes[si];
                        uint64_t seed = n * 131 + bi * 7 + wi * 3 + (uint64_t)rnd;
                        int kind = (int)(seed % TC_KIND_COUNT);
                        check_encode((psagg__isa)isa, &c, n, kind, (int)(si & 1), -1, 0, seed);
                        for (uint64_t z = 0; z < 4; z++)
                            check_encode((psagg__isa)isa, &c, n, TC_KIND_ZEROS,
                                         (int)((si + z) & 1) && z != 1, -1, 0, seed * 4 + z);
                        /* a bad value at a position that moves through groups and tails */
                        check_encode((psagg__isa)isa, &c, n, kind, (int)(si & 1),
                                     (long)((seed * 37) % (n + 1)), poisons[si % 5], seed);
                        check_aggregate((psagg__isa)isa, &c, n, 1 + si % 8, kind, (int)(si & 1), 0,
                                        -1, 0, seed);
                        check_aggregate((psagg__isa)isa, &c, n, 8, kind, (int)(~si & 1), 1, -1, 0,
                                        seed + 2);
                        check_aggregate((psagg__isa)isa, &c, n, 3, TC_KIND_ZEROS, 1, 0,
                                        (long)((seed * 53) % (n + 1)), poisons[(si + 2) % 5],
                                        seed + 3);
                    }
                }
        {
            psagg_codec fc[3] = {tc_codec(PSAGG_CODEC_FP32, 0, 0, 0),
                                 tc_codec(PSAGG_CODEC_FP16, 0, 0, 0),
                                 tc_codec(PSAGG_CODEC_BF16, 0, 0, 0)};
            for (int k = 0; k < 3; k++)
                for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
                    check_fp((psagg__isa)isa, &fc[k], sizes[si], 1 + si % 8, (int)(si & 1),
                             sizes[si] + (uint64_t)k);
        }
        printf("%s: %ld comparisons with scalar, all identical\n", psagg__isa_name((psagg__isa)isa),
               n_compared);
    }
    if (!tested) {
        printf("SKIP: no SIMD path to compare\n");
        return TEST_SKIP;
    }
    return 0;
}
