/*
 * test_topk.c - kernels/topk.c: the k entries of largest magnitude, ties by the lower index,
 * against a reference that sorts (qsort by magnitude descending, then index), on blocks with
 * random values, many ties, zeros of both signs, subnormals, one distinct value, and every k
 * from 1 to n on small blocks; and the returned threshold.
 *
 * Then the sparse format (topk.h) against the spec written out here: each block's kept entries
 * are the sorting reference's, each decoded value is lo + scale * q with q the spec's rounding
 * of its magnitude (nearest: exactly; stochastic: within one level), the other entries decode
 * to -0, the residual is v - y bit for bit, SET/ADD/FIRST/SCALE agree with their definitions,
 * the size is exact, a golden digest pins the bytes, and every bad input is refused by name.
 */
#include "../testutil.h"
#include "kernels/codec.h"
#include "kernels/topk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float *ref_v;

static uint32_t magnitude(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7FFFFFFFu;
}

static int by_magnitude(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    uint32_t mi = magnitude(ref_v[i]), mj = magnitude(ref_v[j]);
    if (mi != mj)
        return mi > mj ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int ascending(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    return i < j ? -1 : i > j;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* One block of n values of `kind`, checked for k against the reference. */
static void check(const float *v, uint32_t n, uint32_t k, const char *what)
{
    uint32_t *idx = malloc(n * sizeof *idx), *want = malloc(n * sizeof *want),
             *scratch = malloc(n * sizeof *scratch), t;
    CHECK(idx && want && scratch, "memory");
    for (uint32_t i = 0; i < n; i++)
        want[i] = i;
    ref_v = v;
    qsort(want, n, sizeof *want, by_magnitude);
    uint32_t kth = magnitude(v[want[k - 1]]);
    qsort(want, k, sizeof *want, ascending);
    memset(idx, 0xFF, n * sizeof *idx);
    t = psagg__topk_select(v, n, k, idx, scratch);
    CHECK(t == kth, "%s n=%u k=%u: threshold 0x%08x, the k-th largest 0x%08x", what, n, k, t, kth);
    for (uint32_t j = 0; j < k; j++)
        CHECK(idx[j] == want[j], "%s n=%u k=%u: kept index %u is %u, the reference's %u", what, n,
              k, j, idx[j], want[j]);
    CHECK(k == n || idx[k] == UINT32_MAX, "%s n=%u k=%u: more than k indices written", what, n, k);
    free(idx), free(want), free(scratch);
}

static void fill(float *v, uint32_t n, int kind)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = next32();
        switch (kind) {
        case 0: /* spread: Gaussian-ish sums of uniforms, both signs */
            v[i] = ((float)(r & 0xFFFF) - 32768.0f) / 4096.0f * ((float)(next32() & 0xFF) / 64.0f);
            break;
        case 1: /* few distinct magnitudes: many ties */
            v[i] = (float)((int)(r % 7) - 3) * 0.25f;
            break;
        case 2: /* zeros of both signs and a few values */
            v[i] = r % 5 == 0 ? (float)(r % 11) : (r & 1 ? -0.0f : 0.0f);
            break;
        case 3: /* subnormals and tiny normals */
        {
            uint32_t u = (r % 0x01000000u) | (r & 0x80000000u);
            memcpy(&v[i], &u, sizeof u);
        } break;
        case 4: /* one value, both signs */
            v[i] = r & 1 ? 1.5f : -1.5f;
            break;
        default: /* magnitudes differing only in the low byte, then the next, ... */
        {
            uint32_t u = 0x3F800000u | (r & 0xFFFFu);
            memcpy(&v[i], &u, sizeof u);
            if (r & 0x10000u)
                v[i] = -v[i];
        }
        }
    }
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Each SIMD path this CPU has encodes x (+ a residual r0, may be NULL) in f through codec.h:
   the same status, bad index, bytes and residual as the scalar reference (want_* from it). */
static void check_isas(const psagg__topk_format *f, const float *x, const float *r0, size_t n,
                       psagg_status want_st, size_t want_at, const uint8_t *want,
                       const float *want_r, const char *what)
{
    psagg_codec c = {.id = PSAGG_CODEC_TOPK,
                     .bits = f->bits,
                     .bucket = f->block,
                     .k = f->k,
                     .rounding = f->rounding};
    size_t len = psagg__topk_encoded_size(f, n);
    psagg__isa was = psagg__codec_isa();
    uint8_t *b = malloc(len ? len : 1);
    float *r = r0 ? malloc(n * sizeof *r) : NULL;
    CHECK(b && (!r0 || r), "memory");
    for (int isa = PSAGG_ISA_SCALAR + 1; isa < PSAGG_ISA_COUNT; isa++) {
        size_t at = (size_t)-1;
        psagg_status st;
        if (!psagg__isa_supported((psagg__isa)isa))
            continue;
        if (r)
            memcpy(r, r0, n * sizeof *r);
        CHECK(!psagg__codec_set_isa((psagg__isa)isa), "set isa %d", isa);
        st = psagg__encode(&c, x, r, n, psagg__rng_key_make(99, 7), b, len, &at);
        psagg__codec_set_isa(was);
        CHECK(st == want_st && (!st || at == want_at), "%s: %s: status %d at %zu, scalar %d at %zu",
              what, psagg__isa_name((psagg__isa)isa), (int)st, at, (int)want_st, want_at);
        CHECK(st || !memcmp(b, want, len), "%s: %s: the bytes differ from the scalar encode's",
              what, psagg__isa_name((psagg__isa)isa));
        CHECK(st || !r || !memcmp(r, want_r, n * sizeof *r),
              "%s: %s: the residual differs from the scalar encode's", what,
              psagg__isa_name((psagg__isa)isa));
    }
    free(b), free(r);
}

/* One encode of n values in format f, checked against the spec (see the head of this file). */
static void check_format(const psagg__topk_format *f, const float *x, size_t n, const char *what)
{
    size_t len = psagg__topk_encoded_size(f, n), nb = (n + f->block - 1) / f->block;
    uint8_t *buf = malloc(len ? len : 1);
    float *r = calloc(n, sizeof *r), *y = malloc(n * sizeof *y), *acc = malloc(n * sizeof *acc);
    uint32_t *want = malloc(f->block * sizeof *want), L = (1u << (f->bits - 1)) - 1;
    float *xv = malloc(f->block * sizeof *xv);
    psagg__rng_key key = psagg__rng_key_make(99, 7);
    psagg_status st;
    CHECK(buf && r && y && acc && want && xv, "memory");
    st = psagg__topk_encode(f, x, r, n, key, buf, len, NULL);
    CHECK(!st, "%s: encode: %s", what, psagg_last_error());
    { /* every SIMD path: the same bytes and residual, from a zero residual, then from this
         encode's (nonzero) residual: the scalar encode again against each path's */
        float *r0 = calloc(n, sizeof *r0), *r1 = malloc(n * sizeof *r1);
        uint8_t *b1 = malloc(len ? len : 1);
        CHECK(r0 && r1 && b1, "memory");
        check_isas(f, x, r0, n, PSAGG_OK, 0, buf, r, what);
        memcpy(r0, r, n * sizeof *r0);
        memcpy(r1, r, n * sizeof *r1);
        CHECK(!psagg__topk_encode(f, x, r1, n, key, b1, len, NULL), "%s: again: %s", what,
              psagg_last_error());
        check_isas(f, x, r0, n, PSAGG_OK, 0, b1, r1, what);
        free(r0), free(r1), free(b1);
    }
    CHECK(!psagg__topk_validate(f, buf, len, n), "%s: validate: %s", what, psagg_last_error());
    CHECK(!psagg__topk_decode_into(f, buf, len, n, y, PSAGG_DECODE_SET, 1.0f), "%s: decode: %s",
          what, psagg_last_error());
    for (size_t m = 0; m < nb; m++) {
        size_t base = m * f->block, len_m = n - base < f->block ? n - base : f->block;
        uint32_t km = len_m < f->k ? (uint32_t)len_m : f->k, j = 0;
        float scale, lo;
        memcpy(&scale, buf + 8 * m, 4);
        memcpy(&lo, buf + 8 * m + 4, 4);
        for (uint32_t i = 0; i < len_m; i++)
            want[i] = i;
        for (uint32_t i = 0; i < len_m; i++) /* what was encoded: x + 0 (-0 became +0) */
            xv[i] = x[base + i] + 0.0f;
        ref_v = xv;
        qsort(want, len_m, sizeof *want, by_magnitude);
        qsort(want, km, sizeof *want, ascending);
        for (uint32_t i = 0; i < len_m; i++) {
            size_t e = base + i;
            float v = x[e] + 0.0f, a = fabsf(v); /* (x + the residual, zero at first) */
            int kept = j < km && want[j] == i;
            if (!kept) {
                CHECK(bits_of(y[e]) == 0x80000000u, "%s: element %zu not kept decodes to %g", what,
                      e, (double)y[e]);
                CHECK(bits_of(r[e]) == bits_of(v), "%s: element %zu not kept: residual %g, not %g",
                      what, e, (double)r[e], (double)v);
                continue;
            }
            j++;
            float t = scale != 0 ? (a - lo) * (1.0f / scale) : 0;
            int level = -1; /* the level |y| is: floor(t) or the one above (rounding) */
            for (uint32_t qq = t >= 1 ? (uint32_t)t - 1 : 0; qq <= (uint32_t)t + 1 && qq <= L; qq++)
                if (fabsf(y[e]) == lo + scale * (float)qq)
                    level = (int)qq;
            CHECK(signbit(y[e]) == signbit(v), "%s: element %zu: the sign of %g is lost", what, e,
                  (double)v);
            CHECK(level >= 0,
                  "%s: element %zu: %g decodes to %g, no level of its t %g (lo %g "
                  "scale %g, L %u)",
                  what, e, (double)v, (double)y[e], (double)t, (double)lo, (double)scale, L);
            if (f->rounding == PSAGG_ROUND_NEAREST && scale != 0) {
                float tq = t + 0.5f;
                uint32_t qq = (uint32_t)(tq < (float)L ? tq : (float)L);
                CHECK(fabsf(y[e]) == lo + scale * (float)qq,
                      "%s: element %zu: level %d, the spec's %u", what, e, level, qq);
            }
            CHECK(bits_of(r[e]) == bits_of(v - y[e]), "%s: element %zu: residual %g, not v - y %g",
                  what, e, (double)r[e], (double)(v - y[e]));
        }
    }
    /* the other ops, by their definitions */
    for (size_t i = 0; i < n; i++)
        acc[i] = (float)(i % 7) - 3.0f;
    CHECK(!psagg__topk_decode_into(f, buf, len, n, acc, PSAGG_DECODE_ADD, 1.0f), "%s: add", what);
    for (size_t i = 0; i < n; i++)
        CHECK(bits_of(acc[i]) == bits_of(((float)(i % 7) - 3.0f) + y[i]), "%s: ADD at %zu", what,
              i);
    CHECK(!psagg__topk_decode_into(f, buf, len, n, acc, PSAGG_DECODE_FIRST, 1.0f), "%s: first",
          what);
    for (size_t i = 0; i < n; i++)
        CHECK(bits_of(acc[i]) == bits_of(0.0f + y[i]), "%s: FIRST at %zu", what, i);
    CHECK(!psagg__topk_decode_into(f, buf, len, n, acc, PSAGG_DECODE_SCALE, -0.5f), "%s: scale",
          what);
    for (size_t i = 0; i < n; i++)
        CHECK(bits_of(acc[i]) == bits_of(y[i] * -0.5f), "%s: SCALE at %zu", what, i);
    free(buf), free(r), free(y), free(acc), free(want), free(xv);
}

#define GOLDEN_TOPK 0x0e3bb30a5a6d674eull /* topk2:82/4096, the encode in main */

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* Bad formats, inputs and buffers: each refused, naming what. */
static void check_refusals(void)
{
    psagg__topk_format f = {2, 256, 8, PSAGG_ROUND_NEAREST}, bad;
    float x[600];
    size_t n = 600, len = psagg__topk_encoded_size(&f, n), at = 0;
    uint8_t *buf = malloc(len), *b2 = malloc(len);
    psagg__rng_key key = psagg__rng_key_make(1, 2);
    CHECK(buf && b2, "memory");
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(i * 37 % 101) - 50);
    struct {
        psagg__topk_format f;
        const char *says;
    } formats[] = {
        {{1, 256, 8, 0}, "bits 1"},    {{9, 256, 8, 0}, "bits 9"}, {{2, 384, 8, 0}, "block 384"},
        {{2, 128, 8, 0}, "block 128"}, {{2, 256, 0, 0}, "k 0"},    {{2, 256, 257, 0}, "k 257"},
    };
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        bad = formats[i].f;
        CHECK(psagg__topk_check(&bad) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), formats[i].says),
              "format %s: %s", formats[i].says, psagg_last_error());
        CHECK(psagg__topk_encoded_size(&bad, n) == 0, "format %s has a size", formats[i].says);
    }
    CHECK(psagg__topk_encode(&f, x, NULL, n, key, buf, len - 8, NULL) == PSAGG_EINVAL,
          "a short output was taken");
    x[300] = NAN;
    CHECK(psagg__topk_encode(&f, x, NULL, n, key, buf, len, &at) == PSAGG_ENONFINITE && at == 300,
          "NaN at 300: %s (at %zu)", psagg_last_error(), at);
    check_isas(&f, x, NULL, n, PSAGG_ENONFINITE, 300, NULL, NULL, "NaN at 300");
    x[300] = 0x1p127f;
    CHECK(psagg__topk_encode(&f, x, NULL, n, key, buf, len, &at) == PSAGG_ERANGE && at == 300,
          "2^127 at 300: %s", psagg_last_error());
    check_isas(&f, x, NULL, n, PSAGG_ERANGE, 300, NULL, NULL, "2^127 at 300");
    x[300] = -INFINITY;
    check_isas(&f, x, NULL, n, PSAGG_ENONFINITE, 300, NULL, NULL, "-Inf at 300");
    { /* x finite, x + r at 2^126: in a vector (300) and in the tail (596 of 600) */
        float r0[600], r1[600];
        x[300] = 1.0f;
        for (size_t e = 300; e <= 596; e += 296) {
            for (size_t i = 0; i < n; i++)
                r0[i] = (float)((int)(i % 9) - 4) * 0.25f;
            x[e] = 0x1p125f, r0[e] = 0x1p125f;
            memcpy(r1, r0, sizeof r1);
            CHECK(psagg__topk_encode(&f, x, r1, n, key, buf, len, &at) == PSAGG_ERANGE && at == e,
                  "x + r at 2^126 at %zu: %s (at %zu)", e, psagg_last_error(), at);
            check_isas(&f, x, r0, n, PSAGG_ERANGE, e, NULL, NULL, "x + r = 2^126");
            x[e] = 1.0f;
        }
    }
    x[300] = 1.0f;
    CHECK(!psagg__topk_encode(&f, x, NULL, n, key, buf, len, NULL), "encode: %s",
          psagg_last_error());
    CHECK(psagg__topk_validate(&f, buf, len - 1, n) == PSAGG_EINVAL, "a short buffer was taken");
    /* the index stream: 8 bits per index (C = 256); block 0's entries 0 and 1 swapped */
    size_t idx_off = 8 * 3;
    memcpy(b2, buf, len);
    uint8_t t = b2[idx_off];
    b2[idx_off] = b2[idx_off + 1], b2[idx_off + 1] = t;
    CHECK(psagg__topk_validate(&f, b2, len, n) == PSAGG_EBADMETA &&
              strstr(psagg_last_error(), "not above the one before"),
          "unsorted indices: %s", psagg_last_error());
    memcpy(b2, buf, len);
    b2[idx_off + 1] = b2[idx_off];
    CHECK(psagg__topk_validate(&f, b2, len, n) == PSAGG_EBADMETA, "a repeated index: %s",
          psagg_last_error());
    memcpy(b2, buf, len); /* block 2 holds 88 elements: its last index set to 200 */
    b2[idx_off + 2 * 8 + 7] = 200;
    CHECK(psagg__topk_validate(&f, b2, len, n) == PSAGG_EBADMETA &&
              strstr(psagg_last_error(), "out of the block's range"),
          "an index beyond a partial block: %s", psagg_last_error());
    float neg = -1.0f, nan = NAN;
    memcpy(b2, buf, len);
    memcpy(b2 + 8, &neg, 4);
    CHECK(psagg__topk_validate(&f, b2, len, n) == PSAGG_EBADMETA &&
              strstr(psagg_last_error(), "block 1: field scale"),
          "a negative scale: %s", psagg_last_error());
    memcpy(b2, buf, len);
    memcpy(b2 + 4, &nan, 4);
    CHECK(psagg__topk_validate(&f, b2, len, n) == PSAGG_EBADMETA &&
              strstr(psagg_last_error(), "block 0: field lo"),
          "a NaN lo: %s", psagg_last_error());
    memcpy(b2, buf, len); /* 24 values of 2 bits: 48 bits, then padding */
    b2[len - 1] |= 0x80;
    CHECK(psagg__topk_validate(&f, b2, len, n) == PSAGG_EBADMETA &&
              strstr(psagg_last_error(), "padding"),
          "a padding bit: %s", psagg_last_error());
    free(buf), free(b2);
}

int main(void)
{
    static const char *kinds[] = {"spread", "ties", "zeros", "subnormal", "constant", "low-bits"};
    uint32_t sizes[] = {1, 2, 3, 17, 64, 257, 4096, 65536};
    float *v = malloc(65536 * sizeof *v);
    int cases = 0;
    CHECK(v, "memory");
    for (int kind = 0; kind < 6; kind++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            uint32_t n = sizes[s];
            fill(v, n, kind);
            if (n <= 64) { /* every k */
                for (uint32_t k = 1; k <= n; k++, cases++)
                    check(v, n, k, kinds[kind]);
            } else { /* 1, 1 %, 2 %, 3 %, half, n - 1, n */
                uint32_t ks[] = {1, n / 100 + 1, n / 50 + 1, n * 3 / 100 + 1, n / 2, n - 1, n};
                for (size_t j = 0; j < sizeof ks / sizeof *ks; j++, cases++)
                    check(v, n, ks[j], kinds[kind]);
            }
        }
    free(v);
    printf("test_topk: %d cases ok (the kept indices and the threshold equal the sorting "
           "reference's)\n",
           cases);

    /* the sparse format: blocks whole and partial, k above a partial block, every kind */
    {
        static const psagg__topk_format fs[] = {
            {2, 256, 8, PSAGG_ROUND_NEAREST},     {2, 4096, 82, PSAGG_ROUND_STOCHASTIC},
            {4, 4096, 123, PSAGG_ROUND_NEAREST},  {8, 1024, 1024, PSAGG_ROUND_STOCHASTIC},
            {3, 65536, 655, PSAGG_ROUND_NEAREST}, {2, 256, 1, PSAGG_ROUND_STOCHASTIC},
        };
        static const size_t ns[] = {1, 5, 255, 256, 257, 1000, 4096, 10000, 70000};
        float *x = malloc(70000 * sizeof *x);
        int fcases = 0;
        CHECK(x, "memory");
        for (size_t a = 0; a < sizeof fs / sizeof *fs; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (int kind = 0; kind < 6; kind++, fcases++) {
                    char what[96];
                    for (size_t off = 0; off < ns[b]; off += 65536)
                        fill(x + off, (uint32_t)(ns[b] - off < 65536 ? ns[b] - off : 65536), kind);
                    snprintf(what, sizeof what, "topk%u:%u/%u %s n=%zu", fs[a].bits, fs[a].k,
                             fs[a].block, kinds[kind], ns[b]);
                    check_format(&fs[a], x, ns[b], what);
                }
        /* golden: the bytes of one encode, pinned (a change is a wire format change) */
        {
            psagg__topk_format g = {2, 4096, 82, PSAGG_ROUND_STOCHASTIC};
            size_t n = 10000, len = psagg__topk_encoded_size(&g, n);
            uint8_t *buf = malloc(len);
            CHECK(buf, "memory");
            rng = 0x9E3779B97F4A7C15ull;
            fill(x, (uint32_t)n, 0);
            CHECK(len == 24 + 8 * ((246 * 12 + 63) / 64) + 8 * ((246 * 2 + 63) / 64),
                  "topk2:82/4096 of 10000 elements: %zu bytes", len);
            CHECK(
                !psagg__topk_encode(&g, x, NULL, n, psagg__rng_key_make(42, 4242), buf, len, NULL),
                "golden encode: %s", psagg_last_error());
            printf("test_topk: golden topk2:82/4096, 10000 elements: %zu bytes (fp32: 40000), "
                   "digest %016llx\n",
                   len, (unsigned long long)fnv(buf, len));
            CHECK(fnv(buf, len) == GOLDEN_TOPK, "the golden encode's bytes changed: %016llx",
                  (unsigned long long)fnv(buf, len));
            /* the same bytes through codec.h on every ISA this CPU has (each dispatches topk to
               its own path; a SIMD one must match the reference bit for bit), and the same
               decode and fused aggregate */
            {
                psagg_codec c = {.id = PSAGG_CODEC_TOPK,
                                 .bits = 2,
                                 .bucket = 4096,
                                 .k = 82,
                                 .rounding = PSAGG_ROUND_STOCHASTIC};
                uint8_t *b2 = malloc(len), *agg = malloc(len), *agg0 = malloc(len);
                float *d = malloc(n * sizeof *d), *d0 = malloc(n * sizeof *d0);
                const void *ins[3] = {buf, buf, buf};
                int isas = 0;
                psagg__isa was = psagg__codec_isa();
                CHECK(b2 && agg && agg0 && d && d0, "memory");
                for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
                    if (!psagg__isa_supported((psagg__isa)isa))
                        continue;
                    CHECK(!psagg__codec_set_isa((psagg__isa)isa), "set isa %d", isa);
                    CHECK(!psagg__encode(&c, x, NULL, n, psagg__rng_key_make(42, 4242), b2, len,
                                         NULL),
                          "%s: encode: %s", psagg__isa_name((psagg__isa)isa), psagg_last_error());
                    CHECK(fnv(b2, len) == GOLDEN_TOPK, "%s: the golden encode is %016llx",
                          psagg__isa_name((psagg__isa)isa), (unsigned long long)fnv(b2, len));
                    CHECK(!psagg__decode_into(&c, b2, len, n, isas ? d : d0, PSAGG_DECODE_SET,
                                              1.0f) &&
                              !psagg__aggregate(&c, ins, 3, len, n, NULL, psagg__rng_key_make(7, 7),
                                                isas ? agg : agg0, len, NULL),
                          "%s: decode/aggregate: %s", psagg__isa_name((psagg__isa)isa),
                          psagg_last_error());
                    CHECK(!isas || (!memcmp(d, d0, n * sizeof *d) && !memcmp(agg, agg0, len)),
                          "%s: decode or aggregate differs from %s's",
                          psagg__isa_name((psagg__isa)isa), psagg__isa_name((psagg__isa)0));
                    isas++;
                }
                psagg__codec_set_isa(was);
                printf("test_topk: the golden bytes, decode and aggregate the same on %d ISAs\n",
                       isas);
                free(b2), free(agg), free(agg0), free(d), free(d0);
            }
            free(buf);
        }
        free(x);
        check_refusals();
        printf("test_topk: sparse format: %d encodes checked against the spec, refusals named\n",
               fcases);
    }
    return 0;
}
