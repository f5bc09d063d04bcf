/*
 * test_thc.c - kernels/thc.h's index and sum streams and the integer fold: sizes and the sum's
 * width against the spec's bound; the fold of random index streams against a reference that
 * reads every element's index and adds them (psagg__thc_index_at, psagg__thc_sum_at), for 2 and
 * 4 bits, sizes on and off a group, 1 to 86 inputs (both sides of each width's limit), on every
 * ISA this CPU has, each path the same bytes as the scalar fold; the bound at a job's largest
 * worker count (1,024 streams of the largest index: every sum exact in 16 bits); a golden
 * digest; and every bad argument refused by name. The workers' side: rotation, encode and
 * decode (error feedback, four workers' average, a golden encode). The wire format: push and
 * update sizes, the next round's scale (a peak near 0 gives none, not the largest), a push and
 * an update golden, the update's decode equal to the fold's sum decoded, every bad push and
 * update refused naming the block or element, and the codec's name, checks and refusals.
 */
#include "../testutil.h"
#include "kernels/codec.h"
#include "kernels/thc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint8_t next_byte(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(rng >> 56);
}

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* A random index stream of n elements: zero padding after element n - 1, as the spec says. */
static void fill(uint8_t *p, uint32_t bits, size_t n, size_t len)
{
    for (size_t i = 0; i < len; i++)
        p[i] = next_byte();
    for (size_t b = n * bits; b < 8 * len; b++)
        p[b / 8] &= (uint8_t) ~(1u << (b % 8));
}

/* Fold on every ISA; each must write the scalar path's bytes. Returns the scalar output. */
static uint8_t *fold_all(uint32_t bits, const uint8_t *const *in, size_t n_in, size_t n,
                         const char *what)
{
    size_t in_len = psagg__thc_index_bytes(bits, n), out_len = psagg__thc_sum_bytes(bits, n_in, n);
    uint8_t *ref = malloc(out_len), *got = malloc(out_len);
    psagg__isa was = psagg__codec_isa();
    CHECK(ref && got && out_len, "%s: memory (%zu bytes)", what, out_len);
    for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa))
            continue;
        CHECK(!psagg__codec_set_isa((psagg__isa)isa), "set isa %d", isa);
        memset(got, 0xA5, out_len);
        CHECK(!psagg__thc_fold(bits, in, n_in, in_len, n, isa ? got : ref, out_len), "%s: %s: %s",
              what, psagg__isa_name((psagg__isa)isa), psagg_last_error());
        CHECK(!isa || !memcmp(got, ref, out_len), "%s: %s writes other bytes than scalar", what,
              psagg__isa_name((psagg__isa)isa));
    }
    psagg__codec_set_isa(was);
    free(got);
    return ref;
}

/* The workers' side: rotation, encode, fold, decode (thc.h, "THE WORKERS' SIDE"). */
static double gauss(void)
{
    double u = ((double)(next_byte() << 16 | next_byte() << 8 | next_byte()) + 0.5) / 16777216.0;
    double v = ((double)(next_byte() << 16 | next_byte() << 8 | next_byte()) + 0.5) / 16777216.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void check_workers_side(void)
{
    const uint32_t block = 4096;
    const size_t n = 5000, nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block);
    const psagg__rng_key rot = psagg__rng_key_make(7, 77);
    float x[4][5000], scales[2], *dec = malloc(n * sizeof *dec), *acc = calloc(n, sizeof *acc),
                                 *res = calloc(np, sizeof *res);
    uint8_t *enc[4], *sum;
    size_t len = psagg__thc_index_bytes(4, np), at = 0;
    double mse = 0, ref = 0;
    CHECK(dec && acc && res, "memory");
    CHECK(psagg__thc_rotated_len(100, 4096) == 128 && psagg__thc_rotated_len(4096, 4096) == 4096 &&
              psagg__thc_rotated_len(4097, 4096) == 4096 + 64 && np == 4096 + 1024 &&
              psagg__thc_rotated_len(1, 64) == 64 && psagg__thc_rotated_len(10, 100) == 0 &&
              nb == 2,
          "rotated lengths");
    for (int w = 0; w < 4; w++)
        for (size_t i = 0; i < n; i++)
            x[w][i] = (float)gauss();
    for (size_t m = 0; m < nb; m++) { /* 4 sigma of the rotated coordinates: ||x|| / sqrt(P) */
        double q = 0;
        size_t len = n - m * block < block ? n - m * block : block, p = 64;
        while (p < len)
            p <<= 1;
        for (int w = 0; w < 4; w++) {
            double qw = 0;
            for (size_t i = m * block; i < m * block + len; i++)
                qw += (double)x[w][i] * x[w][i];
            q = qw > q ? qw : q;
        }
        scales[m] = (float)(4 * sqrt(q / (double)p));
    }
    /* one worker, error feedback over 64 rounds of the same x: the mean of the decodes is x
       (what is left out comes back), far closer than one round's */
    enc[0] = malloc(len);
    sum = malloc(psagg__thc_sum_bytes(4, 1, n > 0 ? np : 0));
    CHECK(enc[0] && sum, "memory");
    for (uint32_t t = 0; t < 64; t++) {
        const uint8_t *in[1] = {enc[0]};
        CHECK(!psagg__thc_encode(4, block, rot, scales, x[0], res, n, psagg__rng_key_make(1, t),
                                 enc[0], len, NULL, NULL),
              "encode: %s", psagg_last_error());
        CHECK(!psagg__thc_fold(4, in, 1, len, np, sum, psagg__thc_sum_bytes(4, 1, np)), "fold");
        CHECK(!psagg__thc_decode(4, block, rot, scales, sum, psagg__thc_sum_bytes(4, 1, np), 1,
                                 NULL, n, 1.0f, PSAGG_DECODE_SET, dec),
              "decode: %s", psagg_last_error());
        if (t == 0)
            for (size_t i = 0; i < n; i++)
                mse += ((double)dec[i] - x[0][i]) * ((double)dec[i] - x[0][i]) / (double)n;
        for (size_t i = 0; i < n; i++)
            acc[i] += dec[i];
    }
    for (size_t i = 0; i < n; i++) {
        double d = (double)acc[i] / 64 - x[0][i];
        ref += d * d / (double)n;
    }
    printf("test_thc: one worker, thc4: one round's mean squared error %.4f, the mean of 64 rounds "
           "with error feedback %.6f\n",
           mse, ref);
    CHECK(mse > 0 && mse < 0.1 && ref < mse / 100,
          "error feedback: one round %.4f, 64 rounds' mean %.6f", mse, ref);
    /* four workers: their index streams folded, decoded as the average, near the average of x */
    for (int w = 1; w < 4; w++)
        CHECK((enc[w] = malloc(len)), "memory");
    free(sum);
    sum = malloc(psagg__thc_sum_bytes(4, 4, np));
    CHECK(sum, "memory");
    for (int w = 0; w < 4; w++)
        CHECK(!psagg__thc_encode(4, block, rot, scales, x[w], NULL, n,
                                 psagg__rng_key_make(2, (uint64_t)w), enc[w], len, NULL, NULL),
              "encode worker %d: %s", w, psagg_last_error());
    CHECK(!psagg__thc_fold(4, (const uint8_t *const *)enc, 4, len, np, sum,
                           psagg__thc_sum_bytes(4, 4, np)),
          "fold of 4");
    CHECK(!psagg__thc_decode(4, block, rot, scales, sum, psagg__thc_sum_bytes(4, 4, np), 4, NULL, n,
                             0.25f, PSAGG_DECODE_SCALE, dec),
          "decode of 4: %s", psagg_last_error());
    mse = 0;
    for (size_t i = 0; i < n; i++) {
        double avg = ((double)x[0][i] + x[1][i] + x[2][i] + x[3][i]) / 4;
        mse += (dec[i] - avg) * (dec[i] - avg) / (double)n;
    }
    printf("test_thc: four workers, thc4, the decoded average's mean squared error %.4f\n", mse);
    CHECK(mse < 0.05, "four workers: mean squared error %.4f of the average", mse);
    { /* golden: one encode's bytes of numbers without libm, pinned (a change is a format change) */
        float g[5000], gs[2] = {4.0f, 3.0f};
        for (size_t i = 0; i < n; i++)
            g[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 256.0f;
        CHECK(!psagg__thc_encode(4, block, rot, gs, g, NULL, n, psagg__rng_key_make(42, 4242),
                                 enc[0], len, NULL, NULL),
              "golden encode: %s", psagg_last_error());
        printf("test_thc: golden encode (thc4, 5000 elements): %zu bytes, digest %016llx\n", len,
               (unsigned long long)fnv(enc[0], len));
        CHECK(fnv(enc[0], len) == 0x7adb7adc891165f3ull,
              "the golden encode's bytes changed: %016llx", (unsigned long long)fnv(enc[0], len));
    }
    /* refusals */
    {
        float bad_scales[2] = {scales[0], 1e-31f}, nan_scales[2] = {NAN, 1.0f};
        CHECK(psagg__thc_encode(3, block, rot, scales, x[0], NULL, n, rot, enc[0], len, NULL,
                                NULL) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "bits 3"),
              "bits 3: %s", psagg_last_error());
        CHECK(psagg__thc_encode(4, 100, rot, scales, x[0], NULL, n, rot, enc[0], len, NULL, NULL) ==
                      PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "block 100"),
              "block 100: %s", psagg_last_error());
        CHECK(psagg__thc_encode(4, block, rot, bad_scales, x[0], NULL, n, rot, enc[0], len, NULL,
                                NULL) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "block 1: scale 1e-31"),
              "scale 1e-31: %s", psagg_last_error());
        CHECK(psagg__thc_encode(4, block, rot, nan_scales, x[0], NULL, n, rot, enc[0], len, NULL,
                                NULL) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "block 0: scale nan"),
              "scale NaN: %s", psagg_last_error());
        CHECK(psagg__thc_encode(4, block, rot, scales, x[0], NULL, n, rot, enc[0], len - 64, NULL,
                                NULL) == PSAGG_EINVAL,
              "a short output was taken");
        x[0][4321] = INFINITY;
        CHECK(psagg__thc_encode(4, block, rot, scales, x[0], NULL, n, rot, enc[0], len, &at,
                                NULL) == PSAGG_ENONFINITE &&
                  at == 4321,
              "Inf at 4321: %s (at %zu)", psagg_last_error(), at);
        CHECK(psagg__thc_decode(4, block, rot, scales, sum, psagg__thc_sum_bytes(4, 4, np) - 1, 4,
                                NULL, n, 1.0f, PSAGG_DECODE_SET, dec) == PSAGG_EINVAL,
              "a short sum was taken");
    }
    for (int w = 0; w < 4; w++)
        free(enc[w]);
    free(sum), free(dec), free(acc), free(res);
}

/* A push's meta field (scale or peak of block m) overwritten. */
static void set_meta(uint8_t *push, size_t m, int peak, float v)
{
    memcpy(push + PSAGG_THC_PUSH_META * m + 4 * (peak != 0), &v, 4);
}

/*
 * The 4-bit sums against the 8-bit ones through the whole decode: thc2, 4 workers' pushes (a
 * 4-bit sum stream) decode to exactly what the same pushes plus a stream of index 0 and one of
 * index 3 (6 inputs: 8-bit sums) decode to, since each element's 2 S - n (L - 1) is the same
 * integer. A plane or nibble in the wrong place would move values between coordinates.
 */
static void check_widths_agree(void)
{
    const uint32_t D = 1024;
    const size_t n = 3000, nb = psagg__thc_blocks(n, D), np = psagg__thc_rotated_len(n, D);
    const size_t len = psagg__thc_index_bytes(2, np), l4 = psagg__thc_sum_bytes(2, 4, np),
                 l8 = psagg__thc_sum_bytes(2, 6, np);
    const psagg__rng_key rot = psagg__rng_key_make(5, 55);
    float *x = malloc(n * sizeof *x), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    float scales[3] = {3.0f, 2.5f, 2.0f};
    uint8_t *in[6], *s4 = malloc(l4), *s8 = malloc(l8);
    CHECK(x && a && b && s4 && s8 && nb == 3 && psagg__thc_sum_width(2, 4) == 4 &&
              psagg__thc_sum_width(2, 6) == 8,
          "memory, widths");
    for (int w = 0; w < 6; w++) {
        CHECK((in[w] = malloc(len)), "memory");
        if (w < 4) {
            for (size_t i = 0; i < n; i++)
                x[i] = (float)gauss();
            CHECK(!psagg__thc_encode(2, D, rot, scales, x, NULL, n,
                                     psagg__rng_key_make(6, (uint64_t)w), in[w], len, NULL, NULL),
                  "encode: %s", psagg_last_error());
        } else {
            memset(in[w], w == 4 ? 0x00 : 0xFF, len); /* every index 0, every index 3 */
        }
    }
    CHECK(!psagg__thc_fold(2, (const uint8_t *const *)in, 4, len, np, s4, l4) &&
              !psagg__thc_fold(2, (const uint8_t *const *)in, 6, len, np, s8, l8),
          "folds: %s", psagg_last_error());
    CHECK(
        !psagg__thc_decode(2, D, rot, scales, s4, l4, 4, NULL, n, 0.25f, PSAGG_DECODE_SCALE, a) &&
            !psagg__thc_decode(2, D, rot, scales, s8, l8, 6, NULL, n, 0.25f, PSAGG_DECODE_SCALE, b),
        "decodes: %s", psagg_last_error());
    CHECK(!memcmp(a, b, n * sizeof *a),
          "thc2: 4 pushes decode otherwise at 4-bit than at 8-bit sums");
    for (int w = 0; w < 6; w++)
        free(in[w]);
    free(x), free(a), free(b), free(s4), free(s8);
}

static void check_wire(void)
{
    const uint32_t D = 1024;
    const size_t n = 5000, W = 3, nb = 5, np = 4096 + 1024; /* the last block of 904 at 1024 */
    psagg__rng_key rot = psagg__rng_key_make(7, 8);
    size_t plen = psagg__thc_push_bytes(4, D, n), ulen = psagg__thc_update_bytes(4, D, n, W);
    float scales[5] = {0, 0.5f, 0.5f, 0.25f, 1.0f}, next[5], *x = malloc(n * sizeof *x);
    float *res[3], *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint8_t *push[3], *upd = malloc(psagg__thc_update_cap(4, D, n)), *sum;
    const uint8_t *idx[3];
    psagg_codec c;
    char name[32];

    CHECK(x && a && b && upd, "memory");
    /* sizes */
    CHECK(plen == 8 * nb + psagg__thc_index_bytes(4, np) && plen == 40 + 2560, "push bytes %zu",
          plen);
    CHECK(ulen == 12 * nb + np && psagg__thc_update_bytes(4, D, n, 17) == ulen &&
              psagg__thc_update_bytes(4, D, n, 18) == 12 * nb + 2 * np &&
              psagg__thc_update_cap(4, D, n) == 12 * nb + 2 * np &&
              psagg__thc_update_bytes(4, D, n, 0) == 0 && psagg__thc_update_bytes(3, D, n, 1) == 0,
          "update bytes %zu", ulen);
    /* the next scale: kappa x the peak; none for a peak near 0 (not the largest scale) */
    CHECK(psagg__thc_next_scale(4, 1.0f) == 0.625f && psagg__thc_next_scale(2, 1.0f) == 0.25f &&
              psagg__thc_next_scale(4, 0) == 0 && psagg__thc_next_scale(4, 3.5e-31f) == 0 &&
              psagg__thc_next_scale(4, 1e35f) == PSAGG_THC_MAX_SCALE,
          "next scales %g %g %g", (double)psagg__thc_next_scale(4, 3.5e-31f),
          (double)psagg__thc_next_scale(4, 1e35f), (double)psagg__thc_next_scale(2, 1.0f));
    /* three workers' pushes (block 0 at scale 0: sent as zeros, kept whole) */
    for (size_t w = 0; w < W; w++) {
        CHECK((push[w] = malloc(plen)) && (res[w] = calloc(np, sizeof(float))), "memory");
        for (size_t i = 0; i < n; i++) /* (no libm: the goldens below are pinned) */
            x[i] = (float)((int)((i + 7919 * w) * 2654435761u % 2001) - 1000) / 8192.0f *
                   (float)(1 + i / 1024);
        CHECK(!psagg__thc_push_encode(4, D, rot, scales, x, res[w], n, psagg__rng_key_make(9, w),
                                      push[w], plen, NULL),
              "push %zu: %s", w, psagg_last_error());
        CHECK(!psagg__thc_push_check(4, D, push[w], plen, n), "push %zu check: %s", w,
              psagg_last_error());
        for (size_t i = 0; i < 1024 * 4 / 8; i++)
            CHECK(push[w][40 + i] == 0, "block 0 (scale 0) sent index bytes");
        idx[w] = push[w] + 40;
    }
    printf("test_thc: golden push (thc4/1024, 5000 elements, worker 0): %zu bytes, digest "
           "%016llx\n",
           plen, (unsigned long long)fnv(push[0], plen));
    /* the update: the fold's sum decoded, its meta the round's scale, largest peak, count */
    CHECK(!psagg__thc_update_fold(4, D, (const uint8_t *const *)push, W, plen, n, upd, ulen),
          "update fold: %s", psagg_last_error());
    printf("test_thc: golden update (3 pushes): %zu bytes, digest %016llx\n", ulen,
           (unsigned long long)fnv(upd, ulen));
    CHECK(fnv(push[0], plen) == 0x4ccf47e7c7161ce0ull && fnv(upd, ulen) == 0xff6fd2c50e16a340ull,
          "the golden push's or update's bytes changed: %016llx %016llx",
          (unsigned long long)fnv(push[0], plen), (unsigned long long)fnv(upd, ulen));
    for (size_t m = 0; m < nb; m++) {
        float sc, pk, pmax = 0;
        uint32_t cnt;
        memcpy(&sc, upd + 12 * m, 4), memcpy(&pk, upd + 12 * m + 4, 4);
        memcpy(&cnt, upd + 12 * m + 8, 4);
        for (size_t w = 0; w < W; w++) {
            float p;
            memcpy(&p, push[w] + 8 * m + 4, 4);
            pmax = p > pmax ? p : pmax;
        }
        CHECK(sc == scales[m] && pk == pmax && pk > 0 && cnt == (m ? W : 0),
              "update block %zu: scale %g peak %g count %u", m, (double)sc, (double)pk, cnt);
    }
    sum = malloc(psagg__thc_sum_bytes(4, W, np));
    CHECK(sum && !psagg__thc_fold(4, idx, W, psagg__thc_index_bytes(4, np), np, sum,
                                  psagg__thc_sum_bytes(4, W, np)),
          "fold");
    {
        uint32_t counts[5] = {0, 3, 3, 3, 3};
        CHECK(!psagg__thc_decode(4, D, rot, scales, sum, psagg__thc_sum_bytes(4, W, np), W, counts,
                                 n, 1.0f / 3, PSAGG_DECODE_SCALE, a),
              "decode: %s", psagg_last_error());
    }
    CHECK(!psagg__thc_update_decode(4, D, rot, upd, ulen, n, 1.0f / 3, PSAGG_DECODE_SCALE, b, next),
          "update decode: %s", psagg_last_error());
    CHECK(!memcmp(a, b, n * sizeof *a), "the update's decode differs from its sum's");
    printf("test_thc: golden decode of the update: digest %016llx\n",
           (unsigned long long)fnv((const uint8_t *)b, n * sizeof *b));
    CHECK(fnv((const uint8_t *)b, n * sizeof *b) == 0x72d5b885ba8d7301ull,
          "the golden decode changed: %016llx",
          (unsigned long long)fnv((const uint8_t *)b, n * sizeof *b));
    for (size_t i = 0; i < 1024; i++)
        CHECK(b[i] == 0, "block 0 (scale 0) decoded %g at %zu", (double)b[i], i);
    for (size_t m = 0; m < nb; m++) {
        float pk;
        memcpy(&pk, upd + 12 * m + 4, 4);
        CHECK(next[m] == psagg__thc_next_scale(4, pk), "next scale of block %zu", m);
    }
    /* the residual holds what block 0 did not send: a push left out adds back its values */
    {
        float *acc = calloc(np, sizeof *acc);
        CHECK(acc && !psagg__thc_push_values(4, D, push[1], plen, n, acc), "push values: %s",
              psagg_last_error());
        for (size_t i = 0; i < 1024; i++)
            CHECK(acc[i] == 0, "block 0's values are not 0");
        CHECK(acc[1024] != 0 && fabsf(acc[1024]) <= 0.5f, "block 1's first value %g",
              (double)acc[1024]);
        free(acc);
    }
    /* bad pushes, each refused naming what is wrong */
    {
        uint8_t *bad = malloc(plen);
        static const struct {
            size_t m;
            int peak;
            float v;
            const char *text;
        } cases[] = {{1, 0, NAN, "block 1: scale nan"},      {2, 0, -0.5f, "block 2: scale -0.5"},
                     {3, 0, 1e-31f, "block 3: scale 1e-31"}, {4, 0, 1e31f, "block 4: scale 1e+31"},
                     {1, 1, -0.0f, "block 1: peak -0"},      {2, 1, INFINITY, "block 2: peak inf"},
                     {0, 1, NAN, "block 0: peak nan"}};
        CHECK(bad, "memory");
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            memcpy(bad, push[0], plen);
            set_meta(bad, cases[k].m, cases[k].peak, cases[k].v);
            CHECK(psagg__thc_push_check(4, D, bad, plen, n) == PSAGG_EBADMETA &&
                      strstr(psagg_last_error(), cases[k].text),
                  "bad push '%s': %s", cases[k].text, psagg_last_error());
        }
        memcpy(bad, push[0], plen);
        bad[40 + 17] = 0x10; /* in block 0, whose scale is 0 */
        CHECK(psagg__thc_push_check(4, D, bad, plen, n) == PSAGG_EBADMETA &&
                  strstr(psagg_last_error(), "block 0 has scale 0 but indices"),
              "indices in a block of scale 0: %s", psagg_last_error());
        CHECK(psagg__thc_push_check(4, D, push[0], plen - 1, n) == PSAGG_EBADMETA &&
                  strstr(psagg_last_error(), "bytes"),
              "a short push: %s", psagg_last_error());
        free(bad);
        /* padding: n = 100 rotates to 128 coordinates, 32 bytes at 2 bits of a group of 64 */
        bad = calloc(1, psagg__thc_push_bytes(2, D, 100));
        CHECK(bad && psagg__thc_push_bytes(2, D, 100) == 8 + 64, "push of 100");
        CHECK(!psagg__thc_push_check(2, D, bad, 72, 100), "a push of zeros: %s",
              psagg_last_error());
        bad[8 + 40] = 1;
        CHECK(psagg__thc_push_check(2, D, bad, 72, 100) == PSAGG_EBADMETA &&
                  strstr(psagg_last_error(), "padding byte 40"),
              "padding: %s", psagg_last_error());
        free(bad);
    }
    /* bad updates */
    {
        uint8_t *bad = malloc(ulen);
        uint32_t five = 5, zero = 0;
        float big = 2.0f;
        CHECK(bad, "memory");
        memcpy(bad, upd, ulen);
        memcpy(bad + 12 * 1 + 8, &zero, 4); /* count 0 with a scale */
        CHECK(psagg__thc_update_decode(4, D, rot, bad, ulen, n, 1, PSAGG_DECODE_SET, b, NULL) ==
                      PSAGG_EBADMETA &&
                  strstr(psagg_last_error(), "block 1: scale 0.5, peak"),
              "count 0: %s", psagg_last_error());
        memcpy(bad, upd, ulen);
        memcpy(bad + 12 * 0, &big, 4); /* a scale with count 0 */
        CHECK(psagg__thc_update_decode(4, D, rot, bad, ulen, n, 1, PSAGG_DECODE_SET, b, NULL) ==
                  PSAGG_EBADMETA,
              "scale without count");
        memcpy(bad, upd, ulen);
        memcpy(bad + 12 * 2 + 8, &five, 4); /* fewer pushes than its sums make? more: fine */
        CHECK(!psagg__thc_update_decode(4, D, rot, bad, ulen, n, 1, PSAGG_DECODE_SET, b, NULL),
              "count 5 of 17 at 8 bits was refused: %s", psagg_last_error());
        memcpy(bad, upd, ulen);
        bad[12 * nb + 1024 + 5] = 46; /* block 1: 3 pushes make at most 45 */
        CHECK(psagg__thc_update_decode(4, D, rot, bad, ulen, n, 1, PSAGG_DECODE_SET, b, NULL) ==
                      PSAGG_EBADMETA &&
                  strstr(psagg_last_error(), "sum 46 is more than 3 pushes make"),
              "sum 46: %s", psagg_last_error());
        CHECK(psagg__thc_update_decode(4, D, rot, upd, ulen + 1, n, 1, PSAGG_DECODE_SET, b, NULL) ==
                  PSAGG_EBADMETA,
              "an update one byte long was taken");
        free(bad);
    }
    /* the codec: names, checks, sizes through codec.h, the generic calls refusing it */
    CHECK(!psagg_codec_parse("thc4", &c) && c.id == PSAGG_CODEC_THC && c.bits == 4 &&
              !psagg__codec_check(&c) && c.bucket == PSAGG_THC_DEFAULT_BLOCK &&
              !strcmp(psagg_codec_name(&c, name, sizeof name), "thc4/1024") &&
              psagg__encoded_size(&c, n) == plen && psagg__update_size(&c, n, W) == ulen &&
              psagg__codec_chunk_elems(&c, 5000) == 4096,
          "thc4: %s", psagg_last_error());
    CHECK(psagg_codec_parse("thc3", &c) == PSAGG_EINVAL && strstr(psagg_last_error(), "thc2, thc4"),
          "thc3: %s", psagg_last_error());
    CHECK(!psagg_codec_parse("thc2/100", &c) && psagg__codec_check(&c) == PSAGG_EINVAL &&
              strstr(psagg_last_error(), "block 100"),
          "thc2/100: %s", psagg_last_error());
    CHECK(!psagg_codec_parse("thc2/nearest", &c) && psagg__codec_check(&c) == PSAGG_EINVAL &&
              strstr(psagg_last_error(), "stochastic"),
          "thc2/nearest: %s", psagg_last_error());
    c = (psagg_codec){.id = PSAGG_CODEC_THC, .bits = 4};
    CHECK(psagg__encode(&c, x, NULL, n, rot, push[0], plen, NULL) == PSAGG_EINVAL &&
              strstr(psagg_last_error(), "encode thc"),
          "generic encode of thc: %s", psagg_last_error());
    for (size_t w = 0; w < W; w++)
        free(push[w]), free(res[w]);
    free(x), free(a), free(b), free(upd), free(sum);
}

/* The fold of n_in random streams of 3000 b-bit indices (from seed): its length and digest. */
static void golden_fold(uint32_t bits, size_t n_in, uint64_t seed, size_t want_len, uint64_t want)
{
    size_t n = 3000, len = psagg__thc_index_bytes(bits, n);
    size_t out = psagg__thc_sum_bytes(bits, n_in, n);
    uint8_t *in[8], *sum;
    rng = seed;
    for (size_t k = 0; k < n_in; k++) {
        in[k] = malloc(len);
        CHECK(in[k], "memory");
        fill(in[k], bits, n, len);
    }
    sum = fold_all(bits, (const uint8_t *const *)in, n_in, n, "golden");
    printf("test_thc: golden fold of %zu x 3000 %u-bit indices: %zu bytes (%u-bit sums), digest "
           "%016llx\n",
           n_in, bits, out, psagg__thc_sum_width(bits, n_in), (unsigned long long)fnv(sum, out));
    CHECK(out == want_len && fnv(sum, out) == want,
          "the golden fold's bytes changed: %zu bytes, %016llx", out,
          (unsigned long long)fnv(sum, out));
    for (size_t k = 0; k < n_in; k++)
        free(in[k]);
    free(sum);
}

int main(void)
{
    static const size_t ns[] = {1, 100, 128, 129, 255, 256, 257, 1000, 70000};
    static const size_t n_ins[] = {1, 2, 4, 5, 6, 8, 17, 18, 85, 86};
    int cases = 0;

    /* sizes and widths: the spec's formulas and limits */
    CHECK(psagg__thc_index_bytes(4, 1) == 64 && psagg__thc_index_bytes(4, 128) == 64 &&
              psagg__thc_index_bytes(4, 129) == 128 && psagg__thc_index_bytes(2, 256) == 64 &&
              psagg__thc_index_bytes(2, 257) == 128 && psagg__thc_index_bytes(3, 10) == 0,
          "index stream sizes");
    CHECK(psagg__thc_sum_width(4, 1) == 4 && psagg__thc_sum_width(4, 2) == 8 &&
              psagg__thc_sum_width(2, 5) == 4 && psagg__thc_sum_width(2, 6) == 8 &&
              psagg__thc_sum_width(4, 17) == 8 && psagg__thc_sum_width(4, 18) == 16 &&
              psagg__thc_sum_width(4, 4369) == 16 && psagg__thc_sum_width(4, 4370) == 0 &&
              psagg__thc_sum_width(2, 85) == 8 && psagg__thc_sum_width(2, 86) == 16 &&
              psagg__thc_sum_width(2, 21845) == 16 && psagg__thc_sum_width(2, 21846) == 0 &&
              psagg__thc_sum_width(4, 0) == 0 && psagg__thc_sum_width(8, 2) == 0,
          "sum widths");
    CHECK(psagg__thc_sum_bytes(4, 4, 129) == 2 * 128 && psagg__thc_sum_bytes(4, 18, 129) == 512 &&
              psagg__thc_sum_bytes(2, 6, 1) == 256 && psagg__thc_sum_bytes(2, 5, 1) == 128 &&
              psagg__thc_sum_bytes(2, 5, 257) == 256 && psagg__thc_sum_bytes(4, 1, 129) == 128,
          "sum stream sizes");

    /* the fold against the per-element reference, every ISA equal */
    for (uint32_t bits = 2; bits <= 4; bits += 2)
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof n_ins / sizeof *n_ins; b++, cases++) {
                size_t n = ns[a], n_in = n_ins[b], len = psagg__thc_index_bytes(bits, n);
                uint32_t w = psagg__thc_sum_width(bits, n_in);
                uint8_t **in = malloc(n_in * sizeof *in), *sum;
                char what[64];
                snprintf(what, sizeof what, "%u bits, n %zu, %zu inputs", bits, n, n_in);
                CHECK(in, "memory");
                for (size_t k = 0; k < n_in; k++) {
                    in[k] = malloc(len);
                    CHECK(in[k], "memory");
                    fill(in[k], bits, n, len);
                }
                sum = fold_all(bits, (const uint8_t *const *)in, n_in, n, what);
                for (size_t e = 0; e < len * 8 / bits; e++) { /* padding elements sum to 0 */
                    uint32_t want = 0;
                    for (size_t k = 0; k < n_in; k++)
                        want += psagg__thc_index_at(bits, in[k], e);
                    CHECK(e < n || want == 0, "%s: padding element %zu has index bits", what, e);
                    CHECK(psagg__thc_sum_at(bits, w, sum, e) == want,
                          "%s: element %zu sums to %u, not %u", what, e,
                          psagg__thc_sum_at(bits, w, sum, e), want);
                }
                for (size_t k = 0; k < n_in; k++)
                    free(in[k]);
                free(in), free(sum);
            }

    /* the bound: a job's 1,024 workers, every index the largest, every sum exact */
    for (uint32_t bits = 2; bits <= 4; bits += 2) {
        size_t n = 1000, n_in = 1024, len = psagg__thc_index_bytes(bits, n);
        uint8_t *one = malloc(len), *sum;
        const uint8_t **in = malloc(n_in * sizeof *in);
        CHECK(one && in, "memory");
        memset(one, 0xFF, len);
        for (size_t b = n * bits; b < 8 * len; b++)
            one[b / 8] &= (uint8_t) ~(1u << (b % 8));
        for (size_t k = 0; k < n_in; k++)
            in[k] = one;
        CHECK(psagg__thc_sum_width(bits, n_in) == 16, "1,024 inputs at %u bits: 16-bit sums", bits);
        sum = fold_all(bits, in, n_in, n, "1,024 inputs of the largest index");
        for (size_t e = 0; e < n; e++)
            CHECK(psagg__thc_sum_at(bits, 16, sum, e) == 1024u * ((1u << bits) - 1),
                  "%u bits: element %zu of 1,024 largest indices sums to %u", bits, e,
                  psagg__thc_sum_at(bits, 16, sum, e));
        free(one), free(in), free(sum);
    }

    /* golden: folds' bytes, pinned (a change is a wire format change): 8-bit sums, and 4-bit
       ones (2-bit indices, 4 inputs: planes paired in nibbles) */
    golden_fold(4, 5, 0x9E3779B97F4A7C15ull, 3072, 0x442ab950e3a02b4aull);
    golden_fold(2, 4, 0x2545F4914F6CDD1Dull, 1536, 0x7d7a282a98b7d6c5ull);

    /* refusals, each naming what */
    {
        size_t n = 100, len = psagg__thc_index_bytes(4, n);
        uint8_t *one = calloc(len, 1), *out = malloc(4 * len + 64);
        const uint8_t *in[2] = {one, one}, *hole[2] = {one, NULL};
        CHECK(one && out, "memory");
        CHECK(psagg__thc_fold(3, in, 2, len, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "bits 3"),
              "bits 3: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, in, 0, len, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "no input"),
              "no input: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, in, 2, len - 1, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "an input is 63 bytes"),
              "short input: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, in, 2, len, n, out, 2 * len + 1) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "the output"),
              "long output: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, hole, 2, len, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "input 1 is NULL"),
              "NULL input: %s", psagg_last_error());
        {
            const uint8_t **many = malloc(4370 * sizeof *many);
            CHECK(many, "memory");
            for (int k = 0; k < 4370; k++)
                many[k] = one;
            CHECK(psagg__thc_fold(4, many, 4370, len, n, out, 2 * len) == PSAGG_EINVAL &&
                      strstr(psagg_last_error(), "does not fit 16 bits"),
                  "4,370 inputs: %s", psagg_last_error());
            free(many);
        }
        free(one), free(out);
    }
    /* the workers' side on every ISA: the same pinned bytes (cpu/thc_body.h per ISA) */
    for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa))
            continue;
        CHECK(!psagg__codec_set_isa((psagg__isa)isa), "set isa");
        printf("test_thc: the workers' side on %s\n", psagg__isa_name((psagg__isa)isa));
        check_workers_side();
        check_widths_agree();
        check_wire();
    }
    printf("test_thc: %d folds against the reference on every ISA, the 1,024-worker bound, "
           "refusals named\n",
           cases);
    return 0;
}
