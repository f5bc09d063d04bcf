/* test_codec_util.h - helpers shared by the tests/unit/test_codec*.c tests. */
#ifndef PSAGG_TEST_CODEC_UTIL_H
#define PSAGG_TEST_CODEC_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../testutil.h"
#include "base/error.h"
#include "kernels/codec.h"

static inline float tc_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t tc_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline psagg_codec tc_codec(psagg_codec_id id, uint32_t bits, uint32_t bucket,
                                   psagg_rounding rnd)
{
    psagg_codec c = {.id = id, .bits = bits, .bucket = bucket, .rounding = rnd};
    CHECK(psagg__codec_check(&c) == PSAGG_OK, "codec check: %s", psagg_last_error());
    return c;
}

static inline const char *tc_name(const psagg_codec *c)
{
    static char buf[64];
    return psagg_codec_name(c, buf, sizeof buf);
}

/* FNV-1a 64 over bytes. */
static inline uint64_t tc_hash(const void *p, size_t len)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static inline void *tc_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL, "out of memory (%zu bytes)", n);
    return p;
}

/* Random float with a random exponent in [emin, emax] (2^e scale) and random sign. */
static inline float tc_rand_mag(uint64_t *s, int emin, int emax)
{
    uint64_t r = test_rand64(s);
    int e = emin + (int)(r % (uint64_t)(emax - emin + 1));
    float m = 1.0f + (float)((r >> 20) & 0x7FFFFF) * 0x1p-23f;
    float v = ldexpf(m, e);
    return (r >> 63) ? -v : v;
}

enum {
    TC_KIND_RANDOM,
    TC_KIND_CONST,
    TC_KIND_MIXED,
    TC_KIND_DENORM,
    TC_KIND_ZEROS,
    TC_KIND_GRID,
    TC_KIND_EXTREME,
    TC_KIND_COUNT
};

static inline const char *tc_kind_name(int kind)
{
    static const char *names[] = {"random", "const", "mixed", "denorm", "zeros", "grid", "extreme"};
    return names[kind];
}

/*
 * Deterministic adversarial data. max_exp bounds |x| < 2^(max_exp+1) (e.g. 14 for fp16,
 * 124 for maxmin with a residual added).
 */
static inline void tc_fill(float *x, size_t n, int kind, uint64_t seed, int max_exp)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
    float cst = test_randf(&s) * 3.0f;
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case TC_KIND_RANDOM:
            x[i] = test_randf(&s) * 2.5f;
            break;
        case TC_KIND_CONST:
            x[i] = cst;
            break; /* every bucket constant */
        case TC_KIND_MIXED:
            x[i] = tc_rand_mag(&s, -149, max_exp);
            break;
        case TC_KIND_DENORM: {
            uint32_t u = (uint32_t)(test_rand64(&s) & 0x807FFFFFu);
            if (!(u & 0x7FFFFF))
                u |= 1;
            x[i] = tc_u2f(u);
            break;
        }
        case TC_KIND_ZEROS: {
            uint64_t r = test_rand64(&s) % 8;
            x[i] = r < 3 ? 0.0f : r < 6 ? -0.0f : (r == 6 ? 0x1p-140f : -0x1p-130f);
            break;
        }
        case TC_KIND_GRID: /* integers and half-integers: exact ties for nearest rounding */
            x[i] = (float)(int)(test_rand64(&s) % 31) * 0.5f;
            break;
        default: { /* extreme: alternating near +-2^(max_exp+1) and tiny */
            uint64_t r = test_rand64(&s) % 4;
            float big = ldexpf(0x1.fffffep0f, max_exp);
            x[i] = r == 0 ? big : r == 1 ? -big : tc_rand_mag(&s, -149, max_exp);
            break;
        }
        }
    }
}

static inline int tc_max_exp(const psagg_codec *c)
{
    switch (c->id) {
    case PSAGG_CODEC_FP16:
        return 14;
    case PSAGG_CODEC_BF16:
    case PSAGG_CODEC_FP32:
        return 126;
    default:
        return 124;
    }
}

/* All codecs to test: fp32, fp16, bf16, maxmin b=1..8 x {sr, nearest} x buckets[]. */
static inline size_t tc_codecs(psagg_codec *out, const uint32_t *buckets, size_t nbuckets)
{
    size_t k = 0;
    out[k++] = tc_codec(PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_NEAREST);
    out[k++] = tc_codec(PSAGG_CODEC_FP16, 0, 0, PSAGG_ROUND_NEAREST);
    out[k++] = tc_codec(PSAGG_CODEC_BF16, 0, 0, PSAGG_ROUND_NEAREST);
    for (size_t bi = 0; bi < nbuckets; bi++)
        for (uint32_t b = 1; b <= 8; b++)
            for (int rnd = 0; rnd < 2; rnd++)
                out[k++] = tc_codec(PSAGG_CODEC_MAXMIN, b, buckets[bi], (psagg_rounding)rnd);
    return k;
}

static inline void tc_set_isa(psagg__isa isa)
{
    CHECK(psagg__codec_set_isa(isa) == PSAGG_OK, "set isa %s: %s", psagg__isa_name(isa),
          psagg_last_error());
}

/* Index of the first byte where a and b differ, or (size_t)-1 if they are equal. */
static inline size_t tc_first_diff(const void *a, const void *b, size_t len)
{
    const uint8_t *p = a, *q = b;
    for (size_t i = 0; i < len; i++)
        if (p[i] != q[i])
            return i;
    return (size_t)-1;
}

/*
 * CHECK that n floats are the same bits, naming the first that is not:
 * "<ctx>: <what>[i] <ref_name><ref> vs <got_name><got>" (names: "" or "cpu ", "gpu ").
 */
static inline void tc_same_floats(const char *ctx, const char *what, const float *ref,
                                  const float *got, size_t n, const char *ref_name,
                                  const char *got_name)
{
    size_t d = tc_first_diff(ref, got, n * 4) / 4;
    CHECK(d == (size_t)-1 / 4, "%s: %s[%zu] %s%a vs %s%a", ctx, what, d, ref_name, ref[d], got_name,
          got[d]);
}

/*
 * Raise coordinate e's sum in a thc sum stream of `width` bits (kernels/thc.h's layout: planes of
 * 64, paired in nibbles at width 4) to its width's largest value: for the tests of a refused
 * update, above what the pushes make unless the width is full at b bits (4-bit sums of one
 * thc4 push: 15 is a valid sum; the callers use 3 or 18 pushes).
 */
static inline void tc_thc_sum_max(uint32_t bits, uint32_t width, uint8_t *sum, size_t e)
{
    const size_t G = 512 / bits, P = 8 / bits, j = e % G % P, i = e % G / P;
    const size_t at = (e / G) * G + j * 64 + i;
    if (width == 4)
        sum[(e / G) * G / 2 + j % (P / 2) * 64 + i] |= (uint8_t)(15u << (j / (P / 2) * 4));
    else if (width == 8)
        sum[at] = 0xFF;
    else
        sum[2 * at] = sum[2 * at + 1] = 0xFF;
}

/*
 * The inputs every implementation is compared on: x of the given kind, a residual of the next
 * kind scaled down (so x + r stays in range), and an accumulator for decode_add (with a -0 in
 * the zeros case; acc0 NULL: none).
 */
static inline void tc_fill_inputs(const psagg_codec *c, size_t n, int kind, uint64_t seed, float *x,
                                  float *r0, float *acc0)
{
    tc_fill(x, n, kind, seed, tc_max_exp(c));
    tc_fill(r0, n, (kind + 1) % TC_KIND_COUNT, seed + 99, tc_max_exp(c) - 2);
    for (size_t i = 0; i < n; i++)
        r0[i] *= 0.25f;
    if (!acc0)
        return;
    tc_fill(acc0, n, TC_KIND_RANDOM, seed + 5, 0);
    if (n > 3 && kind == TC_KIND_ZEROS)
        acc0[n / 2] = -0.0f;
}

#endif
