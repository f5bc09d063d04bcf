/*
 * bench_adaptive.c - the estimated quantization error of a per-tensor codec choice under a
 * byte budget (runtime/adaptive.h) against one codec for every tensor, at equal bytes, on a
 * model's gradient sizes with synthetic gradients.
 *
 *   psagg-bench-adaptive --model tests/data/models/resnet50.sizes [--seed S]
 *                        [--chunk-bytes B] [--min-compress N] [--spread D] [--sr-only]
 *
 * Synthetic gradients: tensor t is Gaussian with a scale 10^u, u uniform in [-1 - D, -1]
 * (--spread D decades, default 3: layers' gradient scales differ by orders of magnitude in
 * real networks); one tensor in five is
 * heavy-tailed (a Gaussian divided by sqrt of a uniform in (0, 1]: rare large values widen
 * some buckets' ranges). Tensors under --min-compress elements stay fp32 (as psagg sends
 * them). Candidates for the others: those psagg's adaptive mode chooses from for a tensor
 * declared maxmin/1024 (psagg__adapt_candidates: 2..8 bits x buckets 256..4096 x rounding
 * stochastic or nearest, 70; --sr-only: stochastic only, 35), sizes summed over the tensor's
 * chunks as the codec lays them out.
 * The error of a candidate is the model of adaptive.h (its bucket ranges give it).
 *
 * For each uniform codec (maxmin2, 3, 4, 8 with bucket 1024, stochastic): its bytes and
 * estimated error; the adaptive choice's error within the same bytes (and the ratio), the
 * bytes the adaptive choice needs to match the uniform error (L-GreCo's form of the problem,
 * by bisection on the budget), and the solver's time.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kernels/codec.h"
#include "runtime/adaptive.h"

#define N_OPT PSAGG_ADAPT_MAX_CANDIDATES

static uint64_t rng_state;
static double uniform01(void) /* (0, 1] */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) + 1.0) * 0x1p-53;
}

static double gauss(void)
{
    return sqrt(-2.0 * log(uniform01())) * cos(2 * M_PI * uniform01());
}

/* Encoded bytes of n elements in chunks of chunk_elems. */
static uint64_t tensor_bytes(const psagg_codec *c, uint64_t n, uint64_t chunk_elems)
{
    uint64_t b = 0;
    for (uint64_t at = 0; at < n; at += chunk_elems)
        b += psagg__encoded_size(c, n - at < chunk_elems ? n - at : chunk_elems);
    return b;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"chunk-bytes", required_argument, NULL, 'c'},
                                         {"min-compress", required_argument, NULL, 'n'},
                                         {"spread", required_argument, NULL, 'd'},
                                         {"sr-only", no_argument, NULL, 'r'},
                                         {NULL, 0, NULL, 0}};
    const char *model = NULL;
    uint64_t seed = 1, chunk_elems = 1048576 / 4, min_compress = 1024, *count;
    double spread = 3;
    int sr_only = 0;
    long T;
    int ch;
    psagg__adapt_option *o;
    uint32_t *choice, buckets[PSAGG_ADAPT_MAX_BUCKETS], n_buckets, n_cand;
    psagg_codec declared = {PSAGG_CODEC_MAXMIN, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0},
                cand[PSAGG_ADAPT_MAX_CANDIDATES];
    uint8_t bucket_of[PSAGG_ADAPT_MAX_CANDIDATES];
    static const uint32_t uniform_bits[] = {2, 3, 4, 8};

    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'm':
            model = optarg;
            break;
        case 's':
            seed = strtoull(optarg, NULL, 10);
            break;
        case 'c':
            chunk_elems = strtoull(optarg, NULL, 10) / 4;
            break;
        case 'n':
            min_compress = strtoull(optarg, NULL, 10);
            break;
        case 'd':
            spread = atof(optarg);
            break;
        case 'r':
            sr_only = 1;
            break;
        default:
            fprintf(stderr, "usage: psagg-bench-adaptive --model PATH.sizes [--seed S] "
                            "[--chunk-bytes B] [--min-compress N] [--spread D] [--sr-only]\n");
            return 2;
        }
    }
    if (!model || (T = bench_read_sizes("psagg-bench-adaptive", model, &count)) < 0)
        return 2;
    o = calloc((size_t)T * N_OPT, sizeof *o);
    choice = calloc((size_t)T, sizeof *choice);
    if (!o || !choice)
        return 1;
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    {
        uint64_t ce = psagg__codec_chunk_elems(&declared, chunk_elems);
        n_buckets = psagg__adapt_buckets(&declared, ce, buckets);
        n_cand = psagg__adapt_candidates(&declared, ce, !sr_only, cand, bucket_of);
    }

    /* each tensor's options: sizes, and errors from its synthetic gradient's bucket ranges */
    for (long t = 0; t < T; t++) {
        uint64_t n = count[t];
        psagg__adapt_option *row = &o[(size_t)t * N_OPT];
        if (n < min_compress) { /* fp32, no error; every option the same */
            psagg_codec fp32 = {.id = PSAGG_CODEC_FP32};
            for (uint32_t k = 0; k < N_OPT; k++)
                row[k] = (psagg__adapt_option){k ? UINT64_MAX : tensor_bytes(&fp32, n, chunk_elems),
                                               0.0};
            continue;
        }
        float *g = malloc(n * sizeof *g);
        double scale = pow(10.0, -1.0 - spread + spread * uniform01());
        int heavy = uniform01() <= 0.2;
        double s[PSAGG_ADAPT_MAX_BUCKETS];
        if (!g)
            return 1;
        for (uint64_t i = 0; i < n; i++)
            g[i] = (float)(scale * gauss() / (heavy ? sqrt(uniform01()) : 1.0));
        for (uint32_t b = 0; b < n_buckets; b++)
            s[b] = psagg__adapt_range_sum(g, n, chunk_elems, buckets[b]);
        free(g);
        for (uint32_t k = 0; k < N_OPT; k++)
            row[k] =
                k < n_cand
                    ? (psagg__adapt_option){tensor_bytes(&cand[k], n, chunk_elems),
                                            psagg__adapt_maxmin_error(s[bucket_of[k]], cand[k].bits,
                                                                      cand[k].rounding)}
                    : (psagg__adapt_option){UINT64_MAX, 0.0};
    }

    printf("%s: %ld tensors, chunk %llu elements, tensors under %llu elements fp32; %u candidates "
           "(maxmin 2..8 bits x buckets %u..%u x %s), seed %llu, scales over %g decades\n",
           model, T, (unsigned long long)chunk_elems, (unsigned long long)min_compress, n_cand,
           buckets[0], buckets[n_buckets - 1], sr_only ? "stochastic" : "stochastic/nearest",
           (unsigned long long)seed, spread);
    printf(
        "| uniform codec | bytes | est. error | adaptive error, same bytes | ratio | adaptive "
        "bytes for the uniform error | ratio | solver ms |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t u = 0; u < sizeof uniform_bits / sizeof uniform_bits[0]; u++) {
        int k_uni = 0; /* the candidate maxmin<bits>/1024/sr */
        while (cand[k_uni].bits != uniform_bits[u] || cand[k_uni].bucket != 1024 ||
               cand[k_uni].rounding != PSAGG_ROUND_STOCHASTIC)
            k_uni++;
        uint64_t ub = 0, ab = 0, lo, hi;
        double ue = 0, ae = 0, t0, ms;
        for (long t = 0; t < T; t++) {
            const psagg__adapt_option *x = &o[(size_t)t * N_OPT];
            const psagg__adapt_option *pick = x[k_uni].bytes == UINT64_MAX ? &x[0] : &x[k_uni];
            ub += pick->bytes;
            ue += pick->error;
        }
        t0 = now_s();
        if (psagg__adapt_solve(o, (size_t)T, N_OPT, ub, choice, &ab, &ae)) {
            fprintf(stderr, "psagg-bench-adaptive: %s\n", psagg_last_error());
            return 1;
        }
        ms = (now_s() - t0) * 1e3;
        /* the least budget whose adaptive error is at most the uniform one */
        lo = 1, hi = ub;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2, b;
            double e;
            if (!psagg__adapt_solve(o, (size_t)T, N_OPT, mid, choice, &b, &e) && e <= ue)
                hi = mid;
            else
                lo = mid + 1;
        }
        printf("| maxmin%u/1024/sr | %llu | %.4g | %.4g | %.3f | %llu | %.3f | %.1f |\n",
               uniform_bits[u], (unsigned long long)ub, ue, ae, ae / ue, (unsigned long long)lo,
               (double)lo / (double)ub, ms);
    }
    free(o);
    free(choice);
    free(count);
    return 0;
}
