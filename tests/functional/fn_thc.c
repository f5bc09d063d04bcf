/*
 * fn_thc.c - the worker program of the thc codec's functional tests (run_case.sh --worker-bin
 * fn_thc): real servers add the workers' pushes as integers (server/integer.c), and each
 * worker checks every update bit for bit against its own reference of the whole job.
 *
 * usage: fn_thc ROUNDS CODEC [--average] [--drain K] [--straggler R MS] [--grow] [--progress]
 * [--round-sleep-ms MS] [--hold R:FILE] [--cuda] (--progress prints "ROUND r" before each round;
 * --hold: before round R's pushes print "HOLD before round R" and wait, up to 120 s, until FILE
 * exists: a harness that makes something happen while the job runs). Every worker
 * declares tensors of 1, 100, 1023, 4096, 70001 and 300000 elements in CODEC (thc2, thc4, thc4/256,
 * ...), pushes input_value(rank, t, r, i) each round and waits. The reference (kernels/thc.h) runs
 * every worker's push of every chunk, with that worker's residual and the scales the last update
 * set, folds them and decodes the fold; the output must be the same bits (SUM, or with --average
 * the mean). Round 0 must be all zeros (no scale is agreed yet: everything waits in the residuals)
 * and every later round close to the inputs' sum plus what the residuals carried. At the end
 * (host buffers) the workers sum their residuals through a rare fp32 tensor (its rounds wait for
 * every worker) and the sum of all updates plus what every residual still holds (rotated back)
 * must equal the sum of all inputs to 1e-4: nothing was lost or counted twice; what the residuals
 * hold has a bound (the last rounds' values). --drain K: the last K rounds push zeros, so the
 * residuals drain (bound 1 %). --straggler R MS ([server] quorum): worker R sleeps MS ms before
 * its pushes of every round but the first and the drain, so rounds close without it and its
 * pushes are carried into later ones (no reference then: which pushes a round summed is the
 * servers' choice; nor a bound on what the residuals hold: a worker late for the drain's rounds
 * too, which under load any may be, still carries its last pushes).
 * --grow ([cluster] elastic, workers = 3, max_workers = 4): worker 3 joins the running job;
 * every worker calls psagg_sync_membership after each round, and a round counts worker 3's
 * inputs from the barrier that admitted it (on the joiner from its first round). The joiner
 * starts with no scales: its first pushes send nothing and the servers leave its blocks out of
 * the sums (their counts say so) until its first update gives it the round's scales. With
 * --drain the members' sums must agree within 1 % (everything the joiner sent included), the
 * joiner's within 5 % (the members' residuals at its first round carry rounds it did not see).
 * Prints "THC ..." figures and "DIGEST <hex>" of the last 8 rounds (the same on every worker).
 * [codec] adaptive: the reference takes each round's codec from its handle (thc2 or thc4), the
 * scales from the last update's peaks at that round's bits; --expect-switch fails unless the
 * codecs changed and both were used.
 * --cuda: every push from device buffers (psagg_push_pull_cuda: the CUDA kernels of thc's
 * rotation, table and decode) against the same CPU reference; 77 without a GPU (gpu.e2e).
 * FN_THC_SKEW_RANK=R: worker R multiplies its scales by 1.5 before round 2's pushes, so its
 * pushes disagree with the update of round 1: the servers must refuse them, naming the scales,
 * whichever order the pushes come in (run with run_case.sh --expect-fail: every worker fails
 * with that message, the others' naming "worker R failed").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fn_input.h"
#include "kernels/codec.h"
#include "kernels/thc.h"
#include "psagg.h"
#include "runtime/config.h"
#include "runtime/layout.h"
#include "../../worker/worker.h"
#ifdef FN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "../gpu/gpu_skip.h"
#endif

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL: " __VA_ARGS__);                                                     \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define N_T 6
static const uint64_t sizes[N_T] = {1, 100, 1023, 4096, 70001, 300000};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* One tensor's reference: every worker's residual (rotated) and the scales they share. */
/* What worker w pushes: the functional tests' inputs, zeros in the drain. */
static float in_value(int w, uint32_t t, uint32_t r, uint64_t i, uint32_t rounds, int drain)
{
    return r + (uint32_t)drain >= rounds ? 0.0f : input_value(w, t, r, i);
}

/*
 * The inverse of thc.h's rotation, in double: n elements of a chunk from its rotated
 * coordinates r (per block of D: w = H r, x_i = s_e * w_i / sqrt(P) for its first len_m).
 * Written from thc.h's description, not from the kernels' code.
 */
static void unrotate(psagg__rng_key rk, uint32_t D, const float *r, size_t n, double *x)
{
    static double w[PSAGG_THC_MAX_BLOCK]; /* (a block of up to 512 KiB: not on the stack) */
    for (size_t base = 0, e0 = 0; base < n; base += D) {
        size_t len = n - base < D ? n - base : D, P = D;
        if (len < D)
            for (P = 64; P < len; P *= 2)
                ;
        for (size_t i = 0; i < P; i++)
            w[i] = r[e0 + i];
        for (size_t h = 1; h < P; h *= 2)
            for (size_t i = 0; i < P; i++)
                if (!(i & h)) {
                    double a = w[i], b = w[i + h];
                    w[i] = a + b, w[i + h] = a - b;
                }
        for (size_t i = 0; i < len; i++) {
            uint32_t e = (uint32_t)(e0 + i), h = psagg__rng_hash32(rk.k0, rk.k1, e >> 5);
            x[base + i] = ((h >> (e & 31)) & 1 ? -w[i] : w[i]) / sqrt((double)P);
        }
        e0 += P;
    }
}

typedef struct ref_tensor {
    float **res;  /* per worker */
    float *peak;  /* per block: the last update's peaks */
    float *scale; /* per block: the round's scales, from them at its bits */
    size_t rot;   /* rotated elements of the tensor */
} ref_tensor;

/* --cuda: each tensor's device input and output */
#ifdef FN_WITH_CUDA
static float *d_in[N_T], *d_out[N_T];

static psagg_status push_pull_cuda(psagg_ctx *ctx, uint32_t t, const float *in, size_t n,
                                   int average, psagg_handle **h)
{
    if ((!d_in[t] && (cudaMalloc((void **)&d_in[t], n * sizeof(float)) != cudaSuccess ||
                      cudaMalloc((void **)&d_out[t], n * sizeof(float)) != cudaSuccess)) ||
        cudaMemcpy(d_in[t], in, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        FAIL("cudaMalloc or cudaMemcpy of tensor %u's input", t);
    return psagg_push_pull_cuda(ctx, t, d_in[t], d_out[t], average ? PSAGG_AVERAGE : PSAGG_SUM, 0,
                                NULL, h);
}

static void cuda_result(uint32_t t, float *out, size_t n)
{
    if (cudaMemcpy(out, d_out[t], n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        FAIL("cudaMemcpy of tensor %u's result", t);
}
#else
static psagg_status push_pull_cuda(psagg_ctx *ctx, uint32_t t, const float *in, size_t n,
                                   int average, psagg_handle **h)
{
    (void)ctx, (void)t, (void)in, (void)n, (void)average, (void)h;
    return PSAGG_EUNSUPPORTED;
}

static void cuda_result(uint32_t t, float *out, size_t n)
{
    (void)t, (void)out, (void)n;
}
#endif

int main(int argc, char **argv)
{
    uint32_t rounds = argc > 1 ? (uint32_t)atoi(argv[1]) : 0;
    const char *codec_text = argc > 2 ? argv[2] : "";
    int average = 0, drain = 0, straggler = -1, straggler_ms = 0, grow = 0, full_from = -1;
    int progress = 0, round_sleep_ms = 0, expected = 0, cuda = 0, expect_switch = 0;
    uint32_t hold_round = UINT32_MAX;
    const char *hold_file = NULL;
    uint32_t first = 0;
    int skew = getenv("FN_THC_SKEW_RANK") ? atoi(getenv("FN_THC_SKEW_RANK")) : -1;
    psagg__config cfg;
    psagg_ctx *ctx = NULL;
    psagg_codec codec;
    psagg_tensor_desc desc[N_T + 1];
    const psagg__layout *l; /* the job's, as the library built it (every tensor's chunks) */
    ref_tensor ref[N_T];
    float *in[N_T], *out[N_T], *expect[N_T], *x;
    double *sum_in[N_T], *sum_out[N_T];
    uint8_t **push, *upd;
    uint64_t digest = 0xcbf29ce484222325ull;
    uint32_t last_bits[N_T] = {0}, switches = 0, rounds_at[2] = {0}; /* ([codec] adaptive) */
    int rank, world;

    for (int a = 3; a < argc; a++) {
        if (!strcmp(argv[a], "--average"))
            average = 1;
        else if (!strcmp(argv[a], "--drain") && a + 1 < argc)
            drain = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--grow"))
            grow = 1;
        else if (!strcmp(argv[a], "--expect-switch"))
            expect_switch = 1;
        else if (!strcmp(argv[a], "--cuda"))
            cuda = 1;
        else if (!strcmp(argv[a], "--progress"))
            progress = 1;
        else if (!strcmp(argv[a], "--round-sleep-ms") && a + 1 < argc)
            round_sleep_ms = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--hold") && a + 1 < argc && strchr(argv[a + 1], ':')) {
            hold_round = (uint32_t)atoi(argv[++a]);
            hold_file = strchr(argv[a], ':') + 1;
        } else if (!strcmp(argv[a], "--straggler") && a + 2 < argc)
            straggler = atoi(argv[a + 1]), straggler_ms = atoi(argv[a + 2]), a += 2;
        else
            FAIL("fn_thc: unknown argument '%s'", argv[a]);
    }
    if (grow && (straggler >= 0 || average))
        FAIL("--grow is a sum without a straggler");
    if (average && straggler >= 0) /* (the mean of a round is of the workers it summed) */
        FAIL("--average is without a straggler");
    if (rounds < 3 || drain < 0 || (uint32_t)drain >= rounds ||
        psagg_codec_parse(codec_text, &codec) || psagg__codec_check(&codec) ||
        codec.id != PSAGG_CODEC_THC)
        FAIL("usage: fn_thc ROUNDS(>= 3) thc<2|4>[/<block>] [--average] [--drain K < ROUNDS] "
             "[--straggler R MS]");
    if (cuda) {
#ifdef FN_WITH_CUDA
        int devices = 0;
        cudaError_t e = cudaGetDeviceCount(&devices);
        if (e != cudaSuccess || devices == 0)
            return gpu_absent_exit("fn_thc --cuda", cudaGetErrorString(e));
#else
        printf("SKIP: --cuda needs a build with CUDA\n");
        return 77;
#endif
    }
    if (psagg__config_load(getenv("PSAGG_CONFIG"), &cfg))
        FAIL("config: %s", psagg_last_error());
    if (psagg_init(NULL, -1, -1, &ctx))
        FAIL("psagg_init: %s", psagg_last_error());
    rank = psagg_rank(ctx);
    world = grow ? 4 : psagg_world_size(ctx); /* (--grow: the inputs of ranks 0..3) */
    for (uint32_t t = 0; t < N_T; t++) {
        static char names[N_T][8];
        snprintf(names[t], sizeof names[t], "g%u", t);
        desc[t] = (psagg_tensor_desc){.struct_size = sizeof(psagg_tensor_desc),
                                      .name = names[t],
                                      .count = sizes[t],
                                      .codec = codec,
                                      .error_feedback = -1};
        in[t] = malloc(sizes[t] * sizeof(float));
        out[t] = malloc(sizes[t] * sizeof(float));
        expect[t] = malloc(sizes[t] * sizeof(float));
        sum_in[t] = calloc(sizes[t], sizeof(double));
        sum_out[t] = calloc(sizes[t], sizeof(double));
        if (!in[t] || !out[t] || !expect[t] || !sum_in[t] || !sum_out[t])
            FAIL("memory");
    }
    /* the residuals at the end, summed (fp32, rare: its rounds wait for every worker) */
    desc[N_T] = (psagg_tensor_desc){.struct_size = sizeof(psagg_tensor_desc),
                                    .name = "residuals",
                                    .count = 0,
                                    .codec = {.id = PSAGG_CODEC_FP32},
                                    .error_feedback = 0,
                                    .flags = PSAGG_TENSOR_RARE};
    for (uint32_t t = 0; t < N_T; t++)
        desc[N_T].count += psagg__thc_rotated_len(sizes[t], codec.bucket); /* (its chunks') */
    if (psagg_declare(ctx, desc, N_T + 1, NULL))
        FAIL("psagg_declare: %s", psagg_last_error());
    if (grow) { /* a joiner starts at the members' round, with every worker in */
        psagg_membership m = {.struct_size = sizeof m};
        if (psagg_get_membership(ctx, &m) || psagg_get_tensor_round(ctx, 0, &first))
            FAIL("membership: %s", psagg_last_error());
        if (m.joiner) {
            full_from = (int)first;
            printf("THC worker %d joined at round %u, %d workers\n", rank, first, m.size);
        }
    }
    l = &ctx->layout;
    push = calloc((size_t)world, sizeof *push);
    upd = malloc(l->max_update_bytes);
    x = malloc(sizes[N_T - 1] * sizeof *x);
    if (!push || !upd || !x)
        FAIL("memory");
    for (int w = 0; w < world; w++)
        if (!(push[w] = malloc(l->max_enc_bytes)))
            FAIL("memory");
    for (uint32_t t = 0; t < N_T; t++) {
        const psagg__tensor_info *ti = &l->tensors[t];
        const psagg__chunk_info *last = &l->chunks[ti->first_chunk + ti->n_chunks - 1];
        ref[t].rot = last->offset + psagg__thc_rotated_len(last->count, codec.bucket);
        if (ref[t].rot != psagg__thc_rotated_len(sizes[t], codec.bucket))
            FAIL("tensor %u: its chunks rotate to %zu coordinates, not %zu", t, ref[t].rot,
                 psagg__thc_rotated_len(sizes[t], codec.bucket));
        ref[t].scale = calloc(ref[t].rot / codec.bucket + 1, sizeof(float));
        ref[t].peak = calloc(ref[t].rot / codec.bucket + 1, sizeof(float));
        ref[t].res = calloc((size_t)world, sizeof(float *));
        if (!ref[t].scale || !ref[t].peak || !ref[t].res)
            FAIL("memory");
        for (int w = 0; w < world; w++)
            if (!(ref[t].res[w] = calloc(ref[t].rot, sizeof(float))))
                FAIL("memory");
    }

    for (uint32_t r = first; r < rounds; r++) {
        psagg_codec round_codec[N_T];
        psagg_handle *h[N_T];
        psagg_status st[N_T];
        static char why[N_T][512];
        double err = 0, norm = 0;
        if ((int)r == 2 && rank == skew) /* (FN_THC_SKEW_RANK: scales the others do not have) */
            for (uint32_t t = 0; t < N_T; t++)
                for (size_t m = 0; m <= ref[t].rot / codec.bucket; m++)
                    ctx->tensors[t].thc_peak[m] *= 1.5f;
        if (rank == straggler && r > 0 && r + (uint32_t)drain < rounds)
            usleep((useconds_t)straggler_ms * 1000);
        if (round_sleep_ms)
            usleep((useconds_t)round_sleep_ms * 1000);
        if (r == hold_round && fn_hold("round", r, hold_file))
            return 1;
        if (progress) { /* (a harness that acts at a round: test_server_failover.sh) */
            printf("ROUND %u\n", r);
            fflush(stdout);
        }
        for (uint32_t t = 0; t < N_T; t++) {
            for (uint64_t i = 0; i < sizes[t]; i++)
                in[t][i] = in_value(rank, t, r, i, rounds, drain);
            st[t] = cuda ? push_pull_cuda(ctx, t, in[t], sizes[t], average, &h[t])
                         : psagg_push_pull(ctx, t, in[t], out[t],
                                           average ? PSAGG_AVERAGE : PSAGG_SUM, 0, &h[t]);
            if (st[t])
                snprintf(why[t], sizeof why[t], "%s", psagg_last_error());
        }
        for (uint32_t t = 0; t < N_T; t++) {
            if (!st[t]) {
                st[t] = psagg_wait(h[t], -1);
                if (!st[t] && (st[t] = psagg_handle_codec(h[t], &round_codec[t], NULL)) == 0 &&
                    r > 0 && round_codec[t].bits != last_bits[t])
                    switches++;
                if (!st[t])
                    last_bits[t] = round_codec[t].bits, rounds_at[round_codec[t].bits / 4]++;
                if (st[t])
                    snprintf(why[t], sizeof why[t], "%s", psagg_last_error());
                psagg_release(h[t]);
                if (!st[t] && cuda)
                    cuda_result(t, out[t], sizes[t]);
            }
            if (st[t] && !expected) {
                char who[32]; /* the others learn that the skewed worker failed */
                snprintf(who, sizeof who, "worker %d failed", skew);
                printf("round %u tensor %u: %s: %s\n", r, t, psagg_strerror(st[t]), why[t]);
                if (skew < 0 || !strstr(why[t], "the scales disagree") ||
                    (rank != skew && !strstr(why[t], who)))
                    FAIL("push_pull round %u tensor %u: %s", r, t, why[t]);
                printf("EXPECTED-ERROR-OK\n");
                expected = 1; /* (the others' handles released too, then out) */
            }
        }
        if (expected)
            goto done;
        if (skew >= 0 && r >= 2)
            FAIL("round %u: worker %d's pushes at other scales were summed", r, skew);
        /* the reference: every worker's pushes of every chunk, folded and decoded (not with a
           straggler: which pushes a round sums is then the servers' choice) */
        for (uint32_t t = 0; t < N_T; t++) {
            const psagg__tensor_info *ti = &l->tensors[t];
            for (uint32_t c = 0; straggler < 0 && !grow && c < ti->n_chunks; c++) {
                const psagg__chunk_info *ci = &l->chunks[ti->first_chunk + c];
                psagg__rng_key rot =
                    psagg__rng_chunk_key(cfg.seed, PSAGG_RNG_ROTATE, 0, t, ci->index, 0);
                const psagg_codec *k = &round_codec[t]; /* ([codec] adaptive: the round's) */
                size_t plen = psagg__thc_push_bytes(k->bits, k->bucket, ci->count);
                size_t ulen = psagg__update_size(k, ci->count, (size_t)world);
                float *sc = ref[t].scale + ci->offset / k->bucket,
                      *pk = ref[t].peak + ci->offset / k->bucket;
                for (size_t m = 0; m < psagg__thc_blocks(ci->count, k->bucket); m++)
                    sc[m] = psagg__thc_next_scale(k->bits, pk[m]);
                for (int w = 0; w < world; w++) {
                    for (uint64_t i = 0; i < ci->count; i++)
                        x[i] = in_value(w, t, r, ci->offset + i, rounds, drain);
                    if (psagg__thc_push_encode(k->bits, k->bucket, rot, sc, x,
                                               ref[t].res[w] + ci->offset, ci->count,
                                               psagg__rng_chunk_key(cfg.seed, PSAGG_RNG_WORKER,
                                                                    (uint32_t)w, t, ci->index, r),
                                               push[w], plen, NULL))
                        FAIL("reference encode: %s", psagg_last_error());
                }
                if (psagg__thc_update_fold(k->bits, k->bucket, (const uint8_t *const *)push,
                                           (size_t)world, plen, ci->count, upd, ulen))
                    FAIL("reference fold: %s", psagg_last_error());
                if (psagg__thc_update_decode(k->bits, k->bucket, rot, upd, ulen, ci->count,
                                             1.0f / (float)world,
                                             average ? PSAGG_DECODE_SCALE : PSAGG_DECODE_SET,
                                             expect[t] + ci->offset, NULL))
                    FAIL("reference decode: %s", psagg_last_error());
                psagg__thc_update_peaks(k->bucket, upd, ci->count, pk);
            }
            for (uint64_t i = 0; i < sizes[t]; i++) {
                uint32_t a, b;
                double s = 0;
                memcpy(&a, &out[t][i], 4);
                memcpy(&b, &expect[t][i], 4);
                if (a != b && straggler < 0 && !grow)
                    FAIL("worker %d round %u tensor %u element %llu: got %.9g, the reference "
                         "%.9g",
                         rank, r, t, (unsigned long long)i, (double)out[t][i],
                         (double)expect[t][i]);
                if (r == 0 && out[t][i] != 0)
                    FAIL("round 0 tensor %u element %llu is %.9g: no scale was agreed yet, so "
                         "nothing may be sent",
                         t, (unsigned long long)i, (double)out[t][i]);
                for (int w = 0; w < world; w++)
                    if (!grow || w < 3 || (full_from >= 0 && (int)r >= full_from))
                        s += in_value(w, t, r, i, rounds, drain);
                if (average)
                    s /= world;
                sum_in[t][i] += s;
                sum_out[t][i] += out[t][i];
                if (r > 0) {
                    err += (out[t][i] - s) * (out[t][i] - s);
                    norm += s * s;
                }
            }
            if (!grow || r + 8 >= rounds) /* (--grow: the last rounds, every worker has them) */
                digest = fnv(digest, out[t], sizes[t] * sizeof(float));
        }
        if (grow) {
            psagg_membership m = {.struct_size = sizeof m};
            usleep(20000);
            if (psagg_sync_membership(ctx, &m))
                FAIL("psagg_sync_membership: %s", psagg_last_error());
            if (m.joined && m.size == 4 && full_from < 0) {
                full_from = (int)r + 1;
                printf("THC worker %d: worker 3 admitted, in the sums from round %d\n", rank,
                       full_from);
            }
        }
        if (rank == 0 && r > 0)
            printf("THC round %u: relative error of the update %.4f\n", r, sqrt(err / norm));
    }
    { /* error feedback: what the updates summed is what was pushed, less what the residuals
         hold at the end. On the host every worker's residual is summed (a rare tensor: its
         round waits for every worker) so that this holds exactly, a worker left out of the
         last rounds ([server] quorum) included. How much the residuals still hold has a bound
         without a quorum (the last rounds' values; after a drain 1 %); with one, a worker left
         out of every round of the drain still carries its last pushes, so none. */
        double err = 0, norm = 0, gap = 0, held = 0, bound;
        for (uint32_t t = 0; t < N_T; t++)
            for (uint64_t i = 0; i < sizes[t]; i++) {
                err += (sum_out[t][i] - sum_in[t][i]) * (sum_out[t][i] - sum_in[t][i]);
                norm += sum_in[t][i] * sum_in[t][i];
            }
        printf("THC worker %d, %u rounds: relative error of the summed updates %.4f\n", rank,
               rounds, sqrt(err / norm));
        if (grow && full_from < 0)
            FAIL("worker 3 never joined");
        bound = grow ? (rank == 3 ? 0.05 : 0.01) /* (the members' residuals of before) */
                : drain && straggler < 0 ? 0.01
                                         : 2.0 / rounds + 0.05;
        if (!grow && !cuda) { /* (--cuda: the residuals are on the device) */
            size_t total = (size_t)desc[N_T].count, at = 0;
            float *mine = malloc(total * sizeof *mine), *all = malloc(total * sizeof *all);
            double *left = malloc(sizes[N_T - 1] * sizeof *left);
            psagg_handle *h;
            if (!mine || !all || !left)
                FAIL("memory");
            for (uint32_t t = 0; t < N_T; at += ref[t].rot, t++)
                memcpy(mine + at, ctx->tensors[t].residual, ref[t].rot * sizeof(float));
            if (psagg_push_pull(ctx, N_T, mine, all, PSAGG_SUM, 0, &h) || psagg_wait(h, -1))
                FAIL("the residuals' sum: %s", psagg_last_error());
            psagg_release(h);
            at = 0;
            for (uint32_t t = 0; t < N_T; at += ref[t].rot, t++) {
                const psagg__tensor_info *ti = &l->tensors[t];
                for (uint32_t c = 0; c < ti->n_chunks; c++) {
                    const psagg__chunk_info *ci = &l->chunks[ti->first_chunk + c];
                    unrotate(psagg__rng_chunk_key(cfg.seed, PSAGG_RNG_ROTATE, 0, t, ci->index, 0),
                             codec.bucket, all + at + ci->offset, ci->count, left);
                    for (uint64_t i = 0; i < ci->count; i++) {
                        double d = sum_in[t][ci->offset + i] - sum_out[t][ci->offset + i],
                               r = average ? left[i] / world : left[i];
                        gap += (d - r) * (d - r);
                        held += r * r;
                    }
                }
            }
            free(mine), free(all), free(left);
            printf("THC worker %d: the residuals hold %.4f of the summed inputs; the summed "
                   "updates and residuals differ from them by %.2g\n",
                   rank, sqrt(held / norm), sqrt(gap / norm));
            if (!(sqrt(gap / norm) < 1e-4))
                FAIL("the summed updates and what the residuals still hold are %.2g off the "
                     "summed inputs: a push was lost or counted twice",
                     sqrt(gap / norm));
            if (straggler < 0 && !(sqrt(held / norm) < bound))
                FAIL("the residuals still hold %.4f of the summed inputs (bound %.4f): error "
                     "feedback does not send them",
                     sqrt(held / norm), bound);
        } else if (!(sqrt(err / norm) < bound)) {
            FAIL("the summed updates are %.4f off the summed inputs%s: error feedback lost some",
                 sqrt(err / norm), drain ? " after the drain" : "");
        }
    }
    if (rank == straggler) { /* the rounds must have closed without it, or nothing was tested */
        psagg_stats st = {.struct_size = sizeof st};
        if (psagg_get_stats(ctx, &st))
            FAIL("psagg_get_stats: %s", psagg_last_error());
        printf("THC straggler %d: left out of %llu chunk rounds, carried into later ones\n", rank,
               (unsigned long long)st.left_out);
        if (!st.left_out)
            FAIL("worker %d slept %d ms before each round, but no round closed without it", rank,
                 straggler_ms);
    }
    if (cfg.adaptive) /* the codecs the assignments chose (tensor rounds in thc2, thc4) */
        printf("THC adaptive: %u switches, %u tensor rounds in thc2, %u in thc4\n", switches,
               rounds_at[0], rounds_at[1]);
    if (expect_switch && (!switches || !rounds_at[0] || !rounds_at[1]))
        FAIL("--expect-switch: the codecs changed %u times (%u tensor rounds in thc2, %u in thc4)",
             switches, rounds_at[0], rounds_at[1]);
    printf("DIGEST %016llx\n", (unsigned long long)digest);
done:
    if (psagg_close(ctx) && !expected)
        FAIL("psagg_close: %s", psagg_last_error());
    for (uint32_t t = 0; t < N_T; t++) {
        for (int w = 0; w < world; w++)
            free(ref[t].res[w]);
        free(ref[t].res), free(ref[t].scale), free(ref[t].peak);
        free(in[t]), free(out[t]), free(expect[t]), free(sum_in[t]), free(sum_out[t]);
    }
    for (int w = 0; w < world; w++)
        free(push[w]);
    free(push), free(upd), free(x);
    return 0;
}
