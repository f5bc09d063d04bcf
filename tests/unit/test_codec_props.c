/*
 * test_codec_props.c - numerical properties of the codecs, on every available ISA:
 *  - stochastic rounding is unbiased (z-test, 5 sigma, fixed seeds, one RNG stream per trial)
 *    and always lands on one of the two levels around x; nearest is within half a level;
 *  - error feedback telescopes: sum_t decode(sent_t) = sum_t x_t + r_0 - r_T;
 *  - the fused aggregate gives the same bytes as decode_add of every input, then encode;
 *  - the RNG of stochastic rounding passes statistical tests (test_rng_statistics), once.
 */
#include <float.h>

#include "test_codec_util.h"

/*
 * Tolerance for the level error checks. Exact arithmetic would give |Q - x| <= delta/2
 * (nearest) and < delta (SR). In binary32, t = (v - lo) * inv carries at most ~3 roundings of
 * relative 2^-24 each (the subtraction, inv = 1/scale, the product), so t is off by at most
 * 3 * 2^-24 * (L + 1) levels, i.e. delta * (L + 1) * 2^-22; the decoded lo + scale*q has two
 * roundings of at most ulp(max(|lo|, |hi|)) / 2 each. We allow 4x that.
 */
static double level_tol(double delta, double L, double maxabs)
{
    return 4.0 * (delta * (L + 1) * 0x1p-22 + maxabs * FLT_EPSILON);
}

static void test_sr_unbiased(void)
{
    enum { B = 64, T = 4000 };
    const uint32_t bits_list[] = {1, 2, 4, 8};
    float x[B], dec[B];
    double sum[B];
    uint8_t out[8 + 8 * 8];

    for (size_t bi = 0; bi < 4; bi++) {
        uint32_t b = bits_list[bi];
        psagg_codec c = tc_codec(PSAGG_CODEC_MAXMIN, b, B, PSAGG_ROUND_STOCHASTIC);
        size_t len = psagg__encoded_size(&c, B);
        double L = (double)((1u << b) - 1), delta, lo = -1.0, hi = 1.0;
        uint64_t s = 1234 + b;
        CHECK(len <= sizeof out, "len");
        x[0] = -1.0f; /* pins lo and hi so that every trial quantizes on the same grid */
        x[1] = 1.0f;
        for (int i = 2; i < B; i++)
            x[i] = test_randf(&s) * 0.999f;
        x[2] = 0.0f;
        x[3] = 0.5f;
        memset(sum, 0, sizeof sum);
        delta = (hi - lo) / L;
        for (int t = 0; t < T; t++) {
            psagg__rng_key key = psagg__rng_key_make(99, (uint64_t)t);
            CHECK(psagg__encode(&c, x, NULL, B, key, out, len, NULL) == PSAGG_OK, "%s",
                  psagg_last_error());
            CHECK(psagg__decode(&c, out, len, B, dec) == PSAGG_OK, "%s", psagg_last_error());
            for (int i = 0; i < B; i++) {
                double err = fabs((double)dec[i] - x[i]);
                CHECK(err < delta + level_tol(delta, L, 1.0),
                      "SR b=%u: element %d = %a decoded to %a, more than one level away", b, i,
                      x[i], dec[i]);
                sum[i] += dec[i];
            }
        }
        for (int i = 0; i < B; i++) {
            double l = lo + floor((x[i] - lo) / delta) * delta;
            double var = (x[i] - l) * (l + delta - x[i]); /* Bernoulli between l and l+delta */
            double mean = sum[i] / T;
            double tol = 5.0 * sqrt(var / T) + level_tol(delta, L, 1.0);
            CHECK(fabs(mean - x[i]) <= tol,
                  "SR b=%u biased: element %d x=%.9g mean=%.9g (|diff| %.3g > %.3g)", b, i, x[i],
                  mean, fabs(mean - x[i]), tol);
        }
    }
}

/* The 16 bits d_k of u_k = (2 d_k + 1) 2^-17 (codec.h), recovered exactly. */
static uint32_t rng_d(psagg__rng_key key, uint32_t k)
{
    return (uint32_t)(psagg__rng_uniform(key, k) * 0x1p17f - 1.0f) / 2;
}

/*
 * Chi-square of `bins` cells against the uniform expectation, as a z-score (chi2 with
 * bins - 1 degrees of freedom has mean bins - 1 and variance 2 (bins - 1)).
 */
static double chi2_z(const uint32_t *count, size_t bins, double total)
{
    double e = total / (double)bins, chi = 0.0;
    for (size_t i = 0; i < bins; i++)
        chi += ((double)count[i] - e) * ((double)count[i] - e) / e;
    return (chi - (double)(bins - 1)) / sqrt(2.0 * (double)(bins - 1));
}

/*
 * Statistical tests of the generator itself (codec.h "RNG"), on fixed keys so they cannot
 * flake; each bound is 6 sigma. Uniformity of the high and low bytes of d_k; independence of
 * the two halves of one hash (k, k+1), of neighbouring hashes (k, k+2), at the SIMD strides
 * (k, k+16), (k, k+32) and of the same element in the streams of neighbouring rounds and
 * workers (psagg__rng_chunk_key), as 2-D chi-square tables of their top 4 bits; and the
 * serial correlation of u at those lags.
 */
static void test_rng_statistics(void)
{
    enum { N = 1 << 20, LAGS = 4 };
    static uint32_t hi[256], lo[256], pair[LAGS + 2][256];
    const uint32_t lag[LAGS] = {1, 2, 16, 32};
    double sxy[LAGS] = {0}, sx = 0, sxx = 0, z;
    psagg__rng_key key = psagg__rng_chunk_key(7, PSAGG_RNG_WORKER, 3, 11, 5, 100);
    psagg__rng_key next_round = psagg__rng_chunk_key(7, PSAGG_RNG_WORKER, 3, 11, 5, 101);
    psagg__rng_key next_worker = psagg__rng_chunk_key(7, PSAGG_RNG_WORKER, 4, 11, 5, 100);

    memset(hi, 0, sizeof hi);
    memset(lo, 0, sizeof lo);
    memset(pair, 0, sizeof pair);
    for (uint32_t k = 0; k < N; k++) {
        uint32_t d = rng_d(key, k);
        double u = psagg__rng_uniform(key, k) - 0.5;
        CHECK(psagg__rng_uniform(key, k) == (float)(2 * d + 1) * 0x1p-17f, "u_k off its grid");
        hi[d >> 8]++;
        lo[d & 0xFF]++;
        sx += u;
        sxx += u * u;
        for (int l = 0; l < LAGS; l++) {
            pair[l][(d >> 12) << 4 | rng_d(key, k + lag[l]) >> 12]++;
            sxy[l] += u * (psagg__rng_uniform(key, k + lag[l]) - 0.5);
        }
        pair[LAGS][(d >> 12) << 4 | rng_d(next_round, k) >> 12]++;
        pair[LAGS + 1][(d >> 12) << 4 | rng_d(next_worker, k) >> 12]++;
    }
    z = chi2_z(hi, 256, N);
    CHECK(fabs(z) < 6.0, "RNG: high byte of d not uniform (chi2 z = %.2f)", z);
    z = chi2_z(lo, 256, N);
    CHECK(fabs(z) < 6.0, "RNG: low byte of d not uniform (chi2 z = %.2f)", z);
    for (int l = 0; l < LAGS + 2; l++) {
        z = chi2_z(pair[l], 256, N);
        CHECK(fabs(z) < 6.0, "RNG: pairs %s not independent (chi2 z = %.2f)",
              l == LAGS       ? "of neighbouring rounds"
              : l == LAGS + 1 ? "of neighbouring workers"
                              : "at a lag",
              z);
    }
    CHECK(fabs(sx / N) < 6.0 * sqrt(1.0 / 12.0 / N), "RNG: mean of u off 1/2 by %g", sx / N);
    CHECK(fabs(sxx / N - 1.0 / 12.0) < 0.002, "RNG: variance of u %g, not 1/12", sxx / N);
    for (int l = 0; l < LAGS; l++) {
        double r = sxy[l] / N / (1.0 / 12.0);
        CHECK(fabs(r) < 6.0 / sqrt((double)N), "RNG: serial correlation at lag %u is %g", lag[l],
              r);
    }
    printf("RNG: %d draws: uniform bytes, independent at lags 1 2 16 32 and across streams\n", N);
}

static void test_level_error(void)
{
    const uint32_t buckets[] = {64, 1024};
    const size_t n = 3000;
    float *x = tc_xmalloc(n * 4), *dec = tc_xmalloc(n * 4);
    uint8_t *out = tc_xmalloc(4 * n);
    for (size_t bi = 0; bi < 2; bi++)
        for (uint32_t b = 1; b <= 8; b++)
            for (int rnd = 0; rnd < 2; rnd++)
                for (int kind = 0; kind < TC_KIND_COUNT; kind++) {
                    psagg_codec c =
                        tc_codec(PSAGG_CODEC_MAXMIN, b, buckets[bi], (psagg_rounding)rnd);
                    size_t len = psagg__encoded_size(&c, n);
                    double L = (double)((1u << b) - 1);
                    tc_fill(x, n, kind, b * 10 + (uint64_t)kind, 120);
                    CHECK(psagg__encode(&c, x, NULL, n, psagg__rng_key_make(5, b), out, len,
                                        NULL) == PSAGG_OK,
                          "%s", psagg_last_error());
                    CHECK(psagg__decode(&c, out, len, n, dec) == PSAGG_OK, "%s",
                          psagg_last_error());
                    for (size_t m = 0; m * buckets[bi] < n; m++) {
                        size_t e = (m + 1) * buckets[bi] < n ? (m + 1) * buckets[bi] : n;
                        double lo = INFINITY, hi = -INFINITY, delta, tol;
                        for (size_t i = m * buckets[bi]; i < e; i++) {
                            lo = fmin(lo, x[i]);
                            hi = fmax(hi, x[i]);
                        }
                        delta = (hi - lo) / L;
                        tol = level_tol(delta, L, fmax(fabs(lo), fabs(hi)));
                        for (size_t i = m * buckets[bi]; i < e; i++) {
                            double err = fabs((double)dec[i] - (double)x[i]);
                            double lim = rnd == PSAGG_ROUND_NEAREST ? delta / 2 : delta;
                            if (hi - lo < (double)PSAGG_MAXMIN_MIN_RANGE)
                                lim = hi - lo; /* constant bucket: decodes to lo */
                            CHECK(err <= lim + tol && dec[i] >= lo - tol && dec[i] <= hi + tol,
                                  "%s data %s: element %zu = %a decoded %a (err %.3g, level "
                                  "%.3g)",
                                  tc_name(&c), tc_kind_name(kind), i, x[i], dec[i], err, delta);
                        }
                    }
                }
    free(x);
    free(dec);
    free(out);
}

static void test_error_feedback(void)
{
    enum { T = 60 };
    const size_t n = 2500;
    psagg_codec codecs[8];
    size_t nc = 0;
    float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4), *dec = tc_xmalloc(n * 4);
    double *sum_x = tc_xmalloc(n * 8), *sum_d = tc_xmalloc(n * 8), *r0 = tc_xmalloc(n * 8),
           *maxv = tc_xmalloc(n * 8);
    uint8_t *out = tc_xmalloc(4 * n);
    codecs[nc++] = tc_codec(PSAGG_CODEC_FP32, 0, 0, 0);
    codecs[nc++] = tc_codec(PSAGG_CODEC_FP16, 0, 0, 0);
    codecs[nc++] = tc_codec(PSAGG_CODEC_BF16, 0, 0, 0);
    codecs[nc++] = tc_codec(PSAGG_CODEC_MAXMIN, 2, 1024, PSAGG_ROUND_STOCHASTIC);
    codecs[nc++] = tc_codec(PSAGG_CODEC_MAXMIN, 4, 64, PSAGG_ROUND_NEAREST);
    codecs[nc++] = tc_codec(PSAGG_CODEC_MAXMIN, 8, 1024, PSAGG_ROUND_STOCHASTIC);
    codecs[nc++] = tc_codec(PSAGG_CODEC_MAXMIN, 1, 64, PSAGG_ROUND_STOCHASTIC);
    for (size_t ci = 0; ci < nc; ci++) {
        const psagg_codec *c = &codecs[ci];
        size_t len = psagg__encoded_size(c, n);
        uint64_t s = 77 + ci;
        for (size_t i = 0; i < n; i++) {
            r[i] = test_randf(&s) * 0.01f;
            r0[i] = r[i];
            sum_x[i] = sum_d[i] = 0;
            maxv[i] = 1.0;
        }
        for (int t = 0; t < T; t++) {
            for (size_t i = 0; i < n; i++) {
                x[i] = test_randf(&s) * (1.0f + (float)(i % 7));
                sum_x[i] += x[i];
                maxv[i] = fmax(maxv[i], fabs((double)x[i] + r[i]));
            }
            CHECK(psagg__encode(c, x, r, n, psagg__rng_key_make(3, (uint64_t)t), out, len, NULL) ==
                      PSAGG_OK,
                  "%s", psagg_last_error());
            CHECK(psagg__decode(c, out, len, n, dec) == PSAGG_OK, "%s", psagg_last_error());
            for (size_t i = 0; i < n; i++)
                sum_d[i] += dec[i];
        }
        for (size_t i = 0; i < n; i++) {
            /* per step: v = x + r and r' = v - y round once each: <= ulp(|v|) in total */
            double want = sum_x[i] + r0[i] - r[i];
            double tol = 2.0 * T * maxv[i] * FLT_EPSILON;
            CHECK(fabs(sum_d[i] - want) <= tol,
                  "EF %s (isa %s): element %zu: sum decoded %.9g, sum x + r0 - rT %.9g (tol %.3g)",
                  tc_name(c), psagg__isa_name(psagg__codec_isa()), i, sum_d[i], want, tol);
        }
    }
    free(x);
    free(r);
    free(dec);
    free(sum_x);
    free(sum_d);
    free(r0);
    free(maxv);
    free(out);
}

static void test_fused_equals_stepwise(void)
{
    psagg_codec codecs[64];
    const uint32_t bl[] = {64, 1024};
    size_t nc = tc_codecs(codecs, bl, 2);
    static const size_t sizes[] = {1, 37, 64, 1000, 2100};
    for (size_t ci = 0; ci < nc; ci++)
        for (size_t si = 0; si < 5; si++)
            for (size_t n_in = 1; n_in <= 8; n_in += (n_in < 4 ? 1 : 4))
                for (int wr = 0; wr < 2; wr++) {
                    const psagg_codec *c = &codecs[ci];
                    size_t n = sizes[si], len = psagg__encoded_size(c, n), bad = 0;
                    uint8_t *bufs[8], *o1 = tc_xmalloc(len), *o2 = tc_xmalloc(len);
                    const void *in[8];
                    float *x = tc_xmalloc(n * 4), *acc = tc_xmalloc(n * 4);
                    float *r1 = tc_xmalloc(n * 4), *r2 = tc_xmalloc(n * 4);
                    psagg__rng_key key = psagg__rng_key_make(11, ci * 100 + si);
                    for (size_t i = 0; i < n_in; i++) {
                        bufs[i] = tc_xmalloc(len);
                        tc_fill(x, n, (int)((i + si) % TC_KIND_COUNT), i + 3 * si,
                                tc_max_exp(c) - 4);
                        CHECK(psagg__encode(c, x, NULL, n, psagg__rng_key_make(1, i), bufs[i], len,
                                            NULL) == PSAGG_OK,
                              "%s", psagg_last_error());
                        in[i] = bufs[i];
                    }
                    tc_fill(r1, n, TC_KIND_RANDOM, si, 0);
                    memcpy(r2, r1, n * 4);
                    for (size_t i = 0; i < n; i++)
                        acc[i] = 0.0f;
                    for (size_t i = 0; i < n_in; i++)
                        CHECK(psagg__decode_add(c, in[i], len, n, acc) == PSAGG_OK, "%s",
                              psagg_last_error());
                    CHECK(psagg__encode(c, acc, wr ? r1 : NULL, n, key, o1, len, NULL) == PSAGG_OK,
                          "%s", psagg_last_error());
                    CHECK(psagg__aggregate(c, in, n_in, len, n, wr ? r2 : NULL, key, o2, len,
                                           &bad) == PSAGG_OK,
                          "%s", psagg_last_error());
                    CHECK(!memcmp(o1, o2, len), "fused %s n=%zu N=%zu res=%d (isa %s) differs",
                          tc_name(c), n, n_in, wr, psagg__isa_name(psagg__codec_isa()));
                    CHECK(!memcmp(r1, r2, n * 4), "fused residual %s n=%zu N=%zu differs",
                          tc_name(c), n, n_in);
                    for (size_t i = 0; i < n_in; i++)
                        free(bufs[i]);
                    free(o1);
                    free(o2);
                    free(x);
                    free(acc);
                    free(r1);
                    free(r2);
                }
}

int main(void)
{
    test_rng_statistics();
    for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa)) {
            printf("SKIP isa %s: not supported here\n", psagg__isa_name((psagg__isa)isa));
            continue;
        }
        tc_set_isa((psagg__isa)isa);
        test_sr_unbiased();
        test_level_error();
        test_error_feedback();
        test_fused_equals_stepwise();
        printf("isa %s: properties hold\n", psagg__isa_name((psagg__isa)isa));
    }
    return 0;
}
