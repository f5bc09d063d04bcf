/*
 * bench_codec.c - psagg-bench-codec: single-core throughput of the codec library.
 *
 * For each codec (fp32, fp16, bf16, maxmin 2/4/8 bits SR, B = 1024) and each ISA available:
 * encode, decode-accumulate, and the fused aggregate with N = 2, 4, 8 inputs. The process is
 * pinned to the CPU it starts on. Each figure is the best of several timed repetitions after
 * a warm-up. It prints figures only; it never passes or fails on time.
 *
 *   psagg-bench-codec [-n ELEMS] [--quick] [--isa scalar|avx2|avx512] [--codec NAME] [--reps R]
 *
 * Bytes touched = bytes read (inputs) + bytes written (outputs), once each:
 *   encode:      4n (fp32 in)            + E (encoded out)
 *   decode-add:  E + 4n (encoded + acc)  + 4n (acc out)
 *   aggregate:   N*E (encoded inputs)    + E (encoded out)        (no server residual)
 * link Gb/s = compressed bytes per second * 8 / 1e9 (encode: E out; decode: E in;
 * aggregate: N*E in), i.e. the line rate of compressed traffic one core keeps up with.
 * Then the server-side optimizers' step (kernels/optim.h, vectorized by the compiler for the
 * CPU it runs on): sgd with momentum touches 20n bytes (gradient in, weights and momentum
 * read and written), adam and adamw 28n.
 * Memory roofline: the better of a read-only kernel and an in-place read+write kernel over a
 * buffer far larger than the LLC (best of several each). Every bytes/s figure is also shown
 * as a fraction of it.
 *
 *   psagg-bench-codec --outer-step [-n ELEMS] [--reps R]
 * instead times a server's parameter-chunk step (server/param.c) for DiLoCo's outer step over
 * n elements (default 25,557,032: ResNet-50) in chunks of 262,144 (1 MiB of fp32): the N
 * workers' pushes folded in order (decode FIRST, then ADD), SGD with Nesterov momentum 0.9, the
 * delta to the workers' view encoded in the chunk's codec and added into the view; for fp32,
 * maxmin4 and topk2:0.02 (sparse) with N = 4 and 8, each worker's push its own pseudo-gradient.
 * It prints ms per outer step (one core) and the three parts.
 *
 *   psagg-bench-codec --thc [-n ELEMS] [--reps R]
 * instead times the integer fold of kernels/thc.h (the server's op of integer aggregation: N
 * index streams of b bits added into one sum stream, no decode) for b = 2 and 4 and N = 4 and 8
 * on each ISA, against the memory roofline measured in the same run; bytes touched = N index
 * streams read + the sum stream written. Then the workers' side of thc2 and thc4 (blocks of
 * 1024): a push (rotation, encode at the scales with the residual; Melem/s of the gradient) and
 * an update's decode (4 pushes summed; inverse rotation), on each ISA.
 *
 *   psagg-bench-codec --thc-scale
 * instead measures thc's choice of scale (kernels/thc.h, NEXT SCALE): W = 4 and 16 workers push
 * 65,536 elements (uniform in [-0.5, 0.5], or with --thc-scale's second table the blocks' scales
 * varying 1..8x and 1 % outliers 20x) for 30 rounds with error feedback, each round's scale
 * kappa x the last update's largest peak, and prints the relative error of the update against
 * the true sum (rounds 5..29: what one round's update is off by, the residual's carry included)
 * for kappa from 0.2 to 0.9 at 2 and 4 bits.
 */
#include <emmintrin.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "kernels/codec.h"
#include "kernels/optim.h"
#include "kernels/thc.h"

/*
 * The timer is this thread's CPU time: the machine is shared, and a pinned thread that is
 * descheduled would otherwise be charged for other processes' time slices. (Wall-clock and
 * CPU time agree on an idle machine; the header line prints the ratio seen in this run.)
 */
static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    memset(p, 0, bytes); /* fault the pages in before timing */
    return p;
}

static void cpu_model(char *buf, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(buf, len, "unknown");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ')
                    p++;
                p[strcspn(p, "\n")] = 0;
                snprintf(buf, len, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

static int pin_to_current_cpu(void)
{
    int cpu = sched_getcpu();
    cpu_set_t set;
    if (cpu < 0)
        return -1;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        return -1;
    return cpu;
}

/*
 * Streaming bandwidth in bytes/s, best of reps, over one buffer of `bytes`:
 *   kind 0: read only (XOR reduction), counted bytes = bytes;
 *   kind 1: in-place read-modify-write (a[i] += 1), counted bytes = 2 * bytes (each line is
 *           read once and written once; no write-allocate read is hidden in the count).
 */
static double stream_bw(size_t bytes, int reps, int kind)
{
    size_t n = bytes / 16;
    __m128i *a = xalloc(n * 16), acc = _mm_setzero_si128(), one = _mm_set1_epi32(1);
    double best = 0, counted = (double)(n * 16) * (kind ? 2.0 : 1.0);
    for (size_t i = 0; i < n; i++)
        a[i] = _mm_set1_epi32((int)i);
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now(), t;
        if (kind == 0) {
            __m128i a0 = acc, a1 = acc, a2 = acc, a3 = acc;
            for (size_t i = 0; i < n; i += 4) {
                a0 = _mm_xor_si128(a0, _mm_load_si128(a + i));
                a1 = _mm_xor_si128(a1, _mm_load_si128(a + i + 1));
                a2 = _mm_xor_si128(a2, _mm_load_si128(a + i + 2));
                a3 = _mm_xor_si128(a3, _mm_load_si128(a + i + 3));
            }
            acc = _mm_xor_si128(_mm_xor_si128(a0, a1), _mm_xor_si128(a2, a3));
        } else {
            for (size_t i = 0; i < n; i += 4) {
                _mm_store_si128(a + i, _mm_add_epi32(_mm_load_si128(a + i), one));
                _mm_store_si128(a + i + 1, _mm_add_epi32(_mm_load_si128(a + i + 1), one));
                _mm_store_si128(a + i + 2, _mm_add_epi32(_mm_load_si128(a + i + 2), one));
                _mm_store_si128(a + i + 3, _mm_add_epi32(_mm_load_si128(a + i + 3), one));
            }
        }
        t = now() - t0;
        __asm__ volatile("" ::"x"(acc), "r"(a) : "memory");
        if (r > 0 && counted / t > best)
            best = counted / t;
    }
    free(a);
    return best;
}

typedef struct result {
    char codec[48];
    psagg__isa isa;
    const char *op;
    int n_in;
    double sec;
} result;

static result results[512];
static int n_results;

static void check(psagg_status st, const char *what)
{
    if (st != PSAGG_OK) {
        fprintf(stderr, "%s failed: %s (%s)\n", what, psagg_strerror(st), psagg_last_error());
        exit(2);
    }
}

static double bw_mem;

static void report(const char *cname, psagg__isa isa, const char *op, int n_in, size_t n,
                   double sec, double bytes, double link_bytes)
{
    result *r = &results[n_results++];
    snprintf(r->codec, sizeof r->codec, "%s", cname);
    r->isa = isa;
    r->op = op;
    r->n_in = n_in;
    r->sec = sec;
    printf("%-18s %-7s %-10s %2s%-2d %9.1f %9.2f %9.2f %8.1f%%\n", cname, psagg__isa_name(isa), op,
           n_in ? "N=" : "  ", n_in, (double)n / sec / 1e6, bytes / sec / 1e9,
           link_bytes / sec * 8 / 1e9, 100.0 * bytes / sec / bw_mem);
    fflush(stdout);
}

/* --thc: the integer fold over n elements (see the top) */
static void thc_bench(size_t n, int reps)
{
    static const int n_ins[] = {4, 8};
    const psagg__isa was = psagg__codec_isa();
    printf("%-18s %-7s %-10s %4s %9s %9s %9s %9s\n", "integer fold", "isa", "op", "", "Melem/s",
           "GB/s", "link Gb/s", "of mem BW");
    for (uint32_t bits = 2; bits <= 4; bits += 2)
        for (size_t k = 0; k < sizeof n_ins / sizeof n_ins[0]; k++) {
            int N = n_ins[k];
            size_t len = psagg__thc_index_bytes(bits, n),
                   out_len = psagg__thc_sum_bytes(bits, N, n);
            uint8_t *in[8], *out = xalloc(out_len);
            char name[32];
            snprintf(name, sizeof name, "thc%u (%u-bit sums)", bits, psagg__thc_sum_width(bits, N));
            for (int i = 0; i < N; i++) {
                in[i] = xalloc(len);
                for (size_t b = 0; b < len; b++)
                    in[i][b] = (uint8_t)(b * 131 + (size_t)i * 17);
            }
            for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
                double best = 1e30;
                if (!psagg__isa_supported((psagg__isa)isa))
                    continue;
                check(psagg__codec_set_isa((psagg__isa)isa), "set isa");
                for (int r = 0; r <= reps; r++) {
                    double t0 = now(), t;
                    check(psagg__thc_fold(bits, (const uint8_t *const *)in, (size_t)N, len, n, out,
                                          out_len),
                          "thc fold");
                    t = now() - t0;
                    if (r > 0 && t < best)
                        best = t;
                }
                report(name, (psagg__isa)isa, "fold", N, n, best, (double)len * N + (double)out_len,
                       (double)len * N);
            }
            for (int i = 0; i < N; i++)
                free(in[i]);
            free(out);
        }
    for (uint32_t bits = 2; bits <= 4; bits += 2) { /* the workers' side */
        const uint32_t D = 1024;
        size_t nb = psagg__thc_blocks(n, D), np = psagg__thc_rotated_len(n, D);
        size_t plen = psagg__thc_push_bytes(bits, D, n),
               ulen = psagg__thc_update_bytes(bits, D, n, 4);
        float *x = xalloc(4 * n), *res = xalloc(4 * np), *sc = xalloc(4 * nb), *y = xalloc(4 * n);
        uint8_t *push[4], *upd = xalloc(ulen);
        double best_e = 1e30, best_d = 1e30;
        psagg__rng_key rot = psagg__rng_key_make(1, 2);
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 1024.0f;
        for (size_t m = 0; m < nb; m++)
            sc[m] = 1.0f;
        memset(res, 0, 4 * np);
        for (int w = 0; w < 4; w++) {
            push[w] = xalloc(plen);
            check(psagg__thc_push_encode(bits, D, rot, sc, x, res, n, psagg__rng_key_make(3, w),
                                         push[w], plen, NULL),
                  "thc push");
        }
        check(psagg__thc_update_fold(bits, D, (const uint8_t *const *)push, 4, plen, n, upd, ulen),
              "thc update");
        for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
            if (!psagg__isa_supported((psagg__isa)isa))
                continue;
            check(psagg__codec_set_isa((psagg__isa)isa), "set isa");
            best_e = best_d = 1e30;
            for (int r = 0; r <= reps; r++) {
                double t0 = now(), t;
                check(psagg__thc_push_encode(bits, D, rot, sc, x, res, n, psagg__rng_key_make(4, r),
                                             push[0], plen, NULL),
                      "thc push");
                t = now() - t0;
                if (r > 0 && t < best_e)
                    best_e = t;
                t0 = now();
                check(psagg__thc_update_decode(bits, D, rot, upd, ulen, n, 0.25f,
                                               PSAGG_DECODE_SCALE, y, NULL),
                      "thc decode");
                t = now() - t0;
                if (r > 0 && t < best_d)
                    best_d = t;
            }
            printf("thc%u/1024 workers' side (%s): push %.1f Melem/s (%.2f ms), update decode (4 "
                   "summed) %.1f Melem/s (%.2f ms)\n",
                   bits, psagg__isa_name((psagg__isa)isa), (double)n / best_e / 1e6, best_e * 1e3,
                   (double)n / best_d / 1e6, best_d * 1e3);
        }
        for (int w = 0; w < 4; w++)
            free(push[w]);
        free(x), free(res), free(sc), free(y), free(upd);
    }
    psagg__codec_set_isa(was);
}

/* --thc-scale: one run of the scale's choice (see the top); the relative error per round */
static double thc_scale_run(uint32_t bits, int W, float kappa, int varied)
{
    const uint32_t D = 1024;
    const size_t n = 65536, nb = n / D;
    size_t plen = psagg__thc_push_bytes(bits, D, n), ulen = psagg__thc_update_bytes(bits, D, n, W);
    float *sc = xalloc(4 * nb), *x = xalloc(4 * n), *out = xalloc(4 * n), *res[16];
    double *tru = xalloc(8 * n), e = 0, norm = 0;
    uint8_t *push[16], *upd = xalloc(ulen);
    psagg__rng_key rot = psagg__rng_key_make(1, 2);
    uint64_t z = 0x9E3779B97F4A7C15ull;
    memset(sc, 0, 4 * nb);
    for (int w = 0; w < W; w++) {
        res[w] = xalloc(4 * n);
        memset(res[w], 0, 4 * n);
        push[w] = xalloc(plen);
    }
    for (int r = 0; r < 30; r++) {
        memset(tru, 0, 8 * n);
        for (int w = 0; w < W; w++) {
            for (size_t i = 0; i < n; i++) {
                float u;
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                u = (float)(z >> 40) * 0x1p-24f - 0.5f;
                if (varied)
                    u *= (float)(1 + (i / 4096) % 8) * ((z >> 20) % 100 == 0 ? 20.0f : 1.0f);
                x[i] = u;
                tru[i] += u;
            }
            check(psagg__thc_push_encode(bits, D, rot, sc, x, res[w], n,
                                         psagg__rng_key_make((uint64_t)r, (uint64_t)w), push[w],
                                         plen, NULL),
                  "thc push");
        }
        check(psagg__thc_update_fold(bits, D, (const uint8_t *const *)push, (size_t)W, plen, n, upd,
                                     ulen),
              "thc fold");
        check(
            psagg__thc_update_decode(bits, D, rot, upd, ulen, n, 1.0f, PSAGG_DECODE_SET, out, NULL),
            "thc decode");
        for (size_t m = 0; m < nb; m++) {
            float pk;
            memcpy(&pk, upd + PSAGG_THC_UPDATE_META * m + 4, 4);
            sc[m] = kappa * pk >= PSAGG_THC_MIN_SCALE ? kappa * pk : 0;
        }
        if (r >= 5)
            for (size_t i = 0; i < n; i++) {
                e += (out[i] - tru[i]) * (out[i] - tru[i]);
                norm += tru[i] * tru[i];
            }
    }
    for (int w = 0; w < W; w++)
        free(res[w]), free(push[w]);
    free(sc), free(x), free(out), free(tru), free(upd);
    return sqrt(e / norm);
}

static void thc_scale(void)
{
    static const float kappas[] = {0.2f, 0.25f, 0.3f, 0.375f, 0.5f, 0.625f, 0.75f, 0.9f};
    printf("thc's scale: kappa x the last update's largest peak; relative error of one round's "
           "update (rounds 5..29, the residual's carry included)\n");
    printf("%-6s %-26s", "codec", "workers, inputs");
    for (size_t k = 0; k < sizeof kappas / sizeof *kappas; k++)
        printf(" %7.3f", (double)kappas[k]);
    printf("\n");
    for (uint32_t bits = 2; bits <= 4; bits += 2)
        for (int v = 0; v < 3; v++) {
            int W = v == 1 ? 16 : 4;
            printf("thc%-3u %-26s", bits,
                   v == 0   ? "4, uniform"
                   : v == 1 ? "16, uniform"
                            : "4, varied blocks, outliers");
            for (size_t k = 0; k < sizeof kappas / sizeof *kappas; k++)
                printf(" %7.4f", thc_scale_run(bits, W, kappas[k], v == 2));
            printf("\n");
        }
}

/* --outer-step: the server's parameter step over n elements (see the top) */
static void outer_step(size_t n, int reps)
{
    static const char *names[] = {"fp32", "maxmin4/1024/sr", "topk2:0.02"};
    static const int n_ins[] = {4, 8};
    const size_t chunk = 262144;
    const psagg__optim sgd = {.kind = PSAGG_OPTIM_SGD, .momentum = 0.9f, .nesterov = 1};
    float *w = xalloc(4 * n), *view = xalloc(4 * n), *m1 = xalloc(4 * n), *acc = xalloc(4 * chunk),
          *x = xalloc(4 * chunk);

    printf("outer step (server/param.c's path), n = %zu elements in chunks of %zu, one core; ms "
           "per outer step: total = fold + optimizer + update\n",
           n, chunk);
    printf("%-18s %3s %10s %10s %10s %10s %12s\n", "codec", "N", "total ms", "fold ms", "optim ms",
           "update ms", "push bytes");
    for (size_t ci = 0; ci < sizeof names / sizeof names[0]; ci++)
        for (size_t k = 0; k < sizeof n_ins / sizeof n_ins[0]; k++) {
            int N = n_ins[k];
            psagg_codec c;
            char cname[48];
            size_t n_chunks = (n + chunk - 1) / chunk, E;
            uint8_t **in, *out;
            double best[4] = {1e30, 1e30, 1e30, 1e30};
            uint64_t s = 777;

            check(psagg_codec_parse(names[ci], &c), "codec parse");
            psagg_codec_name(&c, cname, sizeof cname);
            E = psagg__encoded_size(&c, chunk);
            in = malloc(n_chunks * (size_t)N * sizeof *in);
            out = xalloc(E);
            if (!in)
                exit(2);
            for (size_t ch = 0; ch < n_chunks; ch++) /* each worker its own pseudo-gradient */
                for (int wk = 0; wk < N; wk++) {
                    size_t cnt = ch + 1 < n_chunks ? chunk : n - ch * chunk;
                    for (size_t i = 0; i < cnt; i++) {
                        s = s * 6364136223846793005ull + 1442695040888963407ull;
                        x[i] = (float)((int32_t)(s >> 32)) * 0x1p-40f;
                    }
                    in[ch * (size_t)N + (size_t)wk] = xalloc(E);
                    check(psagg__encode(
                              &c, x, NULL, cnt, psagg__rng_key_make(9, ch * 64 + (size_t)wk),
                              in[ch * (size_t)N + (size_t)wk], psagg__encoded_size(&c, cnt), NULL),
                          "encode push");
                }
            for (int r = 0; r <= reps; r++) {
                double part[3] = {0, 0, 0};
                for (size_t ch = 0; ch < n_chunks; ch++) {
                    size_t cnt = ch + 1 < n_chunks ? chunk : n - ch * chunk, off = ch * chunk;
                    size_t e = psagg__encoded_size(&c, cnt);
                    double t0 = now(), t1, t2;
                    for (int wk = 0; wk < N; wk++)
                        check(psagg__decode_into(&c, in[ch * (size_t)N + (size_t)wk], e, cnt, acc,
                                                 wk ? PSAGG_DECODE_ADD : PSAGG_DECODE_FIRST, 1.0f),
                              "fold");
                    t1 = now();
                    check(psagg__optim_step(&sgd, 0.7f, 0.0f, (uint64_t)r + 1, 1.0f / (float)N, acc,
                                            w + off, m1 + off, NULL, cnt),
                          "optimizer step");
                    t2 = now();
                    for (size_t i = 0; i < cnt; i++)
                        acc[i] = w[off + i] - view[off + i];
                    check(
                        psagg__encode(&c, acc, NULL, cnt, psagg__rng_key_make(5, ch), out, e, NULL),
                        "encode update");
                    check(psagg__decode_into(&c, out, e, cnt, view + off, PSAGG_DECODE_ADD, 1.0f),
                          "view");
                    part[0] += t1 - t0, part[1] += t2 - t1, part[2] += now() - t2;
                }
                if (r > 0 && part[0] + part[1] + part[2] < best[0])
                    best[0] = part[0] + part[1] + part[2], best[1] = part[0], best[2] = part[1],
                    best[3] = part[2];
            }
            printf("%-18s %3d %10.1f %10.1f %10.1f %10.1f %12zu\n", cname, N, 1e3 * best[0],
                   1e3 * best[1], 1e3 * best[2], 1e3 * best[3],
                   (n / chunk) * E + psagg__encoded_size(&c, n % chunk));
            fflush(stdout);
            for (size_t i = 0; i < n_chunks * (size_t)N; i++)
                free(in[i]);
            free(in), free(out);
        }
    free(w), free(view), free(m1), free(acc), free(x);
}

static const result *find(const char *cname, psagg__isa isa, const char *op, int n_in)
{
    for (int i = 0; i < n_results; i++)
        if (!strcmp(results[i].codec, cname) && results[i].isa == isa &&
            !strcmp(results[i].op, op) && results[i].n_in == n_in)
            return &results[i];
    return NULL;
}

int main(int argc, char **argv)
{
    size_t n = (size_t)16 << 20, stream_bytes = (size_t)1024 << 20;
    int reps = 5, quick = 0, isa_only = -1, outer = 0, thc = 0, n_set = 0;
    const char *codec_only = NULL;
    static const char *codec_names[] = {
        "fp32", "fp16", "bf16", "maxmin2/1024/sr", "maxmin4/1024/sr", "maxmin8/1024/sr"};
    static const int n_ins[] = {2, 4, 8};
    char model[256];
    int cpu;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            n = strtoull(argv[++i], NULL, 0);
            n_set = 1;
        } else if (!strcmp(argv[i], "--outer-step")) {
            outer = 1;
        } else if (!strcmp(argv[i], "--thc")) {
            thc = 1;
        } else if (!strcmp(argv[i], "--thc-scale")) {
            thc = 2;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            for (int k = 0; k < PSAGG_ISA_COUNT; k++)
                if (!strcmp(s, psagg__isa_name((psagg__isa)k)))
                    isa_only = k;
            if (isa_only < 0) {
                fprintf(stderr, "--isa: scalar, avx2 or avx512\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--codec") && i + 1 < argc) {
            codec_only = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [-n ELEMS] [--quick] [--reps R] [--isa scalar|avx2|avx512] "
                    "[--codec NAME (e.g. maxmin4/1024/sr)] [--outer-step] [--thc] [--thc-scale]\n",
                    argv[0]);
            return 2;
        }
    }
    if (quick) {
        n = (size_t)1 << 20;
        reps = 3;
        stream_bytes = (size_t)256 << 20;
    }
    if (reps < 1)
        reps = 1;
    if (outer) {
        char m[256];
        cpu_model(m, sizeof m);
        printf("psagg-bench-codec --outer-step: %s; pinned to cpu %d; default path %s; best of "
               "%d after a warm-up\n",
               m, pin_to_current_cpu(), psagg__isa_name(psagg__codec_isa()), reps);
        outer_step(n_set ? n : 25557032, reps);
        return 0;
    }
    double wall0 = wall(), cpu0 = now();
    cpu = pin_to_current_cpu();
    cpu_model(model, sizeof model);
    printf("psagg-bench-codec: %s; pinned to cpu %d%s; n = %zu elements; best of %d after a "
           "warm-up\n",
           model, cpu, cpu < 0 ? " (pinning FAILED)" : "", n, reps);
    printf("ISAs:");
    for (int k = 0; k < PSAGG_ISA_COUNT; k++)
        printf(" %s%s", psagg__isa_name((psagg__isa)k),
               psagg__isa_supported((psagg__isa)k) ? "" : "(unavailable)");
    printf("; default path %s\n", psagg__isa_name(psagg__codec_isa()));
    {
        double rd = stream_bw(stream_bytes, reps, 0), rmw = stream_bw(stream_bytes, reps, 1);
        bw_mem = rd > rmw ? rd : rmw;
        printf("memory roofline (one %zu MiB buffer): read %.2f GB/s, read+write in place %.2f "
               "GB/s; fractions below are of the larger, %.2f GB/s\n\n",
               stream_bytes >> 20, rd / 1e9, rmw / 1e9, bw_mem / 1e9);
    }
    if (thc == 2) {
        thc_scale();
        return 0;
    }
    if (thc) {
        thc_bench(n, reps);
        printf("timing: thread CPU time; this run got %.0f%% of its core (CPU time / wall time)\n",
               100.0 * (now() - cpu0) / (wall() - wall0));
        return 0;
    }
    printf("%-18s %-7s %-10s %4s %9s %9s %9s %9s\n", "codec", "isa", "op", "", "Melem/s", "GB/s",
           "link Gb/s", "of mem BW");

    for (size_t ci = 0; ci < sizeof codec_names / sizeof codec_names[0] + (codec_only ? 1 : 0);
         ci++) {
        psagg_codec c;
        char cname[48];
        size_t E;
        float *x, *acc;
        uint8_t *in[8], *out;
        const void *inp[8];
        const char *name;
        if (codec_only) {
            if (ci > 0)
                break;
            name = codec_only;
        } else {
            name = codec_names[ci];
        }
        check(psagg_codec_parse(name, &c), "codec parse");
        check(psagg__codec_check(&c), "codec check");
        psagg_codec_name(&c, cname, sizeof cname);
        E = psagg__encoded_size(&c, n);
        x = xalloc(4 * n);
        acc = xalloc(4 * n);
        out = xalloc(E);
        {
            uint64_t s = 12345;
            for (size_t i = 0; i < n; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (float)((int32_t)(s >> 32)) * 0x1p-31f;
            }
        }
        for (int i = 0; i < 8; i++) {
            in[i] = xalloc(E);
            check(
                psagg__encode(&c, x, NULL, n, psagg__rng_key_make(1, (uint64_t)i), in[i], E, NULL),
                "encode input");
            inp[i] = in[i];
        }
        for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
            double best;
            if (!psagg__isa_supported((psagg__isa)isa) || (isa_only >= 0 && isa != isa_only))
                continue;
            check(psagg__codec_set_isa((psagg__isa)isa), "set isa");
            /* encode */
            best = 1e30;
            for (int r = 0; r <= reps; r++) {
                double t0 = now(), t;
                check(psagg__encode(&c, x, NULL, n, psagg__rng_key_make(2, (uint64_t)r), out, E,
                                    NULL),
                      "encode");
                t = now() - t0;
                if (r > 0 && t < best)
                    best = t;
            }
            report(cname, (psagg__isa)isa, "encode", 0, n, best, 4.0 * n + E, (double)E);
            /* decode-accumulate */
            best = 1e30;
            for (int r = 0; r <= reps; r++) {
                double t0 = now(), t;
                check(psagg__decode_add(&c, in[0], E, n, acc), "decode_add");
                t = now() - t0;
                if (r > 0 && t < best)
                    best = t;
            }
            report(cname, (psagg__isa)isa, "decode-add", 0, n, best, (double)E + 8.0 * n,
                   (double)E);
            /* fused aggregate */
            for (size_t k = 0; k < 3; k++) {
                int N = n_ins[k];
                best = 1e30;
                for (int r = 0; r <= reps; r++) {
                    double t0 = now(), t;
                    check(psagg__aggregate(&c, inp, (size_t)N, E, n, NULL,
                                           psagg__rng_key_make(3, (uint64_t)r), out, E, NULL),
                          "aggregate");
                    t = now() - t0;
                    if (r > 0 && t < best)
                        best = t;
                }
                report(cname, (psagg__isa)isa, "aggregate", N, n, best, (double)E * (N + 1),
                       (double)E * N);
            }
        }
        for (int i = 0; i < 8; i++)
            free(in[i]);
        free(x);
        free(acc);
        free(out);
    }

    if (!codec_only) { /* the server-side optimizers' step, on n elements */
        static const psagg__optim kinds[] = {
            {.kind = PSAGG_OPTIM_SGD, .momentum = 0.9f},
            {.kind = PSAGG_OPTIM_ADAM, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
            {.kind = PSAGG_OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f}};
        float *g = xalloc(4 * n), *w = xalloc(4 * n), *m1 = xalloc(4 * n), *m2 = xalloc(4 * n);
        for (size_t i = 0; i < n; i++)
            g[i] = (float)(i % 1000) * 1e-3f - 0.5f, w[i] = 0.1f, m1[i] = m2[i] = 0.0f;
        printf("\n%-18s %-7s %-10s %4s %9s %9s %9s %9s\n", "optimizer", "code", "op", "", "Melem/s",
               "GB/s", "", "of mem BW");
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            double best = 1e30, bytes = (double)n * (kinds[k].kind == PSAGG_OPTIM_SGD ? 20 : 28);
            for (int r = 0; r <= reps; r++) {
                double t0 = now(), t;
                check(psagg__optim_step(&kinds[k], 1e-3f, 0.01f, (uint64_t)r + 1, 0.25f, g, w, m1,
                                        m2, n),
                      "optimizer step");
                t = now() - t0;
                if (r > 0 && t < best)
                    best = t;
            }
            printf("%-18s %-7s %-10s %4s %9.1f %9.2f %9s %8.1f%%\n",
                   psagg__optim_name(kinds[k].kind), "clones", "step", "", (double)n / best / 1e6,
                   bytes / best / 1e9, "", 100.0 * bytes / best / bw_mem);
        }
        free(g), free(w), free(m1), free(m2);
    }
    {
        const result *s = find("maxmin4/1024/sr", PSAGG_ISA_SCALAR, "aggregate", 8);
        const result *v = find("maxmin4/1024/sr", PSAGG_ISA_AVX512, "aggregate", 8);
        printf("\nTARGET fused aggregate maxmin4/1024/sr N=8: ");
        if (s && v) {
            psagg_codec c = {.id = PSAGG_CODEC_MAXMIN, .bits = 4, .bucket = 1024, .rounding = 0};
            double bytes = (double)psagg__encoded_size(&c, n) * 9;
            printf("avx512 %.1f Melem/s, %.1fx scalar (target >= 15x), %.1f%% of the memory "
                   "roofline (target >= 30%%)\n",
                   (double)n / v->sec / 1e6, s->sec / v->sec, 100.0 * bytes / v->sec / bw_mem);
        } else {
            printf("not measured (needs both scalar and avx512 runs of that codec)\n");
        }
    }
    printf("timing: thread CPU time; this run got %.0f%% of its core (CPU time / wall time)\n",
           100.0 * (now() - cpu0) / (wall() - wall0));
    return 0;
}
