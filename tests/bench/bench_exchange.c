/*
 * bench_exchange.c - psagg-bench-exchange: time one training step's gradient exchange.
 *
 *   psagg-bench-exchange --model PATH.sizes --codec CODEC --steps S --warmup W
 *                        [--link-gbit R] [--colocated] [--seed X]
 *                        [--model-gpu GELEM_S [--model-pcie GBYTE_S]] [--server-optimizer]
 *
 * A worker program (one process per worker, started by deploy/psagg-local or
 * tests/bench/bench_cluster.py): rank, world size and config come from PSAGG_RANK,
 * PSAGG_WORLD_SIZE and PSAGG_CONFIG.
 *
 * What it does, like a data-parallel training step without the compute:
 *   - declares one tensor per line of the .sizes file (one element count per line, '#'
 *     comments), all with CODEC and worker error feedback on (as in training). The config's
 *     [codec] min_compress_elems only applies to PSAGG_CODEC_DEFAULT, so the same rule is
 *     applied here: tensors with fewer elements than min_compress_elems (default 1024: biases,
 *     norms) are declared fp32, as CGX and BytePS do. A maxmin codec given without a bucket
 *     takes [codec] bucket. Two small fp32 helper tensors follow the model's: a 1-element
 *     barrier and a timing tensor (world x steps elements); they are never in a timed step.
 *   - fills every gradient once with deterministic pseudo-random values that depend on
 *     (seed, rank, tensor, element), so runs are repeatable;
 *   - each step: a barrier (push_pull of the 1-element tensor), then push_pull of every
 *     model tensor in REVERSE registration order (the order backprop produces gradients),
 *     all with the same priority, so the library serves them first-come first-served, as
 *     PyTorch DDP's reducer launches its buckets. (BytePS-style priorities, early layers
 *     first, would only reorder transfers inside a step whose gradients are all ready at
 *     once; they matter when compute overlaps, which this benchmark does not model.) Then
 *     it waits for all of them. A rank's step time is barrier-exit to last completion; the
 *     step time is the maximum over ranks (exchanged through the timing tensor at the end:
 *     each rank fills its own slots, zeros elsewhere, an fp32 SUM is exact), as
 *     tests/bench/baselines do.
 *   - after W warm-up steps, S timed steps; rank 0 prints a summary and exactly one line
 *       RESULT system=psagg model=<name> codec=<codec> workers=<N> servers=<S>
 *              median_ms=<x> p10_ms=<y> p90_ms=<z> busiest_link_bytes=<b>
 *              wire_limit_ms=<w> bytes_sent_per_worker=<s> compression=<raw/sent>
 *              worker_cpu_ms=<c> worker_minflt=<f> worker_model=<cpu|gpu> ... params=<0|1>
 *     (worker_*: rank 0's own CPU milliseconds and minor page faults per timed step, from
 *     getrusage; every rank also prints "CPU rank=<r> cpu_ms=<c> minflt=<f>", its own per
 *     timed step, for sums over workers; each server logs its own per round at the end of the
 *     job, at INFO:
 *     "usage after the first round: ... cpu_ms_per_round=... minflt_per_round=...");
 *     (quantiles interpolate linearly, numpy's default, like the baselines).
 *
 * busiest_link_bytes: bytes per step, per direction, on the most loaded host link, computed
 * from the same layout the workers use (psagg__layout_build over the same declarations with
 * chunk_elems = psagg__chunk_elems(cfg) ([worker] chunk_bytes / 4 rounded down to a multiple of
 * 64), as psagg_declare does). A chunk's message is 32 header bytes + its payload: a push its
 * encoded size, an update psagg__update_size of the N workers' sum (the same but for thc, whose
 * integer sums are wider than a push). With P = one worker's pushes per step (sum over all
 * chunks), U = the updates it receives, and P_s, U_s the parts of them that server s owns:
 *   servers on their own hosts: worker link up = P, down = U; server s link in = N x P_s,
 *   out = N x U_s
 *   --colocated (server i on worker i's host, S <= N): traffic between a worker and the
 *   server on its own host stays on that host, so host i (i < S) carries
 *       up   = worker i's pushes to other servers (P - P_i) + server i's updates to the
 *              other workers ((N-1) x U_i)
 *       down = updates from other servers (U - U_i) + pushes from the other workers
 *              ((N-1) x P_i)
 *       (with U = P: up = down = P + (N-2) x P_i); a host without a server carries P up, U down.
 *   busiest_link_bytes is the maximum over links and directions. wire_limit_ms = busiest x 8 / (R x
 * 1e9) x 1000 with --link-gbit R (0 without it). The achieved rate is busiest bytes / median.
 * bytes_sent_per_worker and compression come from rank 0's psagg_get_stats counters around
 * the model's push_pulls of the timed steps (payload + headers sent per step, barrier
 * excluded; fp32 bytes / bytes sent).
 *
 * --model-gpu GELEM_S: the workers are modelled as GPU workers (gpu_model.h): the model's
 * push_pulls go through the library as psagg_push_pull_cuda's do, with the CPU doing only the
 * CUDA path's host copies, and the GPU's encode and decode waited for at GELEM_S 1e9
 * elements/s plus the encoded bytes over PCIe at --model-pcie GBYTE_S (default 25). 0 models
 * a GPU that takes no time: what remains is the servers, the network and the workers' host
 * side. The workers' CPU figures then exclude the codecs; the RESULT line says
 * worker_model=gpu with both rates (worker_model=cpu otherwise).
 * --server-optimizer: the model's tensors are declared as parameters (PSAGG_TENSOR_PARAMETER;
 * the servers must run [server] optimizer): psagg_param_init once with pseudo-random weights,
 * then every push_pull pushes the gradient and applies the servers' weight delta to them, so
 * the servers' CPU figures include the optimizer's step. The RESULT line says params=1.
 * Benchmarks print figures; they never pass or fail on a time.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_util.h"
#include "gpu_model.h"
#include "kernels/codec.h"
#include "psagg.h"
#include "runtime/config.h"
#include "runtime/layout.h"

#define MAX_MODEL_TENSORS 100000

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* 64-bit mixing of the test data's seeds */
static uint64_t mix64(uint64_t a, uint64_t b)
{
    uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill(float *x, uint64_t n, uint64_t seed, int rank, uint32_t key)
{
    uint64_t s = mix64(mix64(seed, (uint64_t)rank), key);
    float scale = 0.1f / (float)(1 + key % 5);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t z = s + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = ((float)(z >> 40) * 0x1p-24f - 0.5f) * scale;
    }
}

typedef struct link_model {
    uint64_t push_total;  /* P: one worker's push bytes per step (headers included) */
    uint64_t *per_server; /* P_s */
    uint64_t upd_total;   /* U: the update bytes it receives */
    uint64_t *upd_server; /* U_s */
    uint64_t busiest;
    char busiest_name[48];
} link_model;

/*
 * Bytes per step on the busiest link (formula in the header comment). decl holds every
 * declared tensor (helpers included, so the placement is the workers'); only the first
 * n_model keys count as step traffic.
 */
static psagg_status model_links(const psagg__ctl_tensor *decl, uint32_t n_decl, uint32_t n_model,
                                const psagg__config *cfg, int colocated, link_model *lm,
                                uint32_t *n_chunks_out)
{
    psagg__layout l;
    int n = cfg->n_workers, S = cfg->n_servers;
    psagg_status st;

    if ((st = psagg__layout_build(decl, n_decl, psagg__chunk_elems(cfg), (uint32_t)S, 0, &l)))
        return st;
    lm->per_server = calloc((size_t)S, sizeof *lm->per_server);
    lm->upd_server = calloc((size_t)S, sizeof *lm->upd_server);
    if (!lm->per_server || !lm->upd_server) {
        psagg__layout_free(&l);
        return PSAGG_ENOMEM;
    }
    *n_chunks_out = 0;
    for (uint32_t c = 0; c < l.n_chunks; c++) {
        const psagg__chunk_info *ci = &l.chunks[c];
        uint64_t msg = sizeof(psagg__msg_hdr) + ci->enc_bytes;
        uint64_t upd = sizeof(psagg__msg_hdr) +
                       psagg__update_size(&l.tensors[ci->key].codec, ci->count, (size_t)n);
        if (ci->key >= n_model)
            continue;
        lm->push_total += msg;
        lm->per_server[ci->owner] += msg;
        lm->upd_total += upd;
        lm->upd_server[ci->owner] += upd;
        (*n_chunks_out)++;
    }
    lm->busiest = 0;
    if (!colocated) {
        uint64_t w = lm->push_total > lm->upd_total ? lm->push_total : lm->upd_total;
        lm->busiest = w;
        snprintf(lm->busiest_name, sizeof lm->busiest_name, "worker link");
        for (int s = 0; s < S; s++) {
            uint64_t b = (uint64_t)n * (lm->per_server[s] > lm->upd_server[s] ? lm->per_server[s]
                                                                              : lm->upd_server[s]);
            if (b > lm->busiest) {
                lm->busiest = b;
                snprintf(lm->busiest_name, sizeof lm->busiest_name, "server %d link", s);
            }
        }
    } else {
        for (int h = 0; h < n; h++) {
            uint64_t b = lm->push_total > lm->upd_total ? lm->push_total : lm->upd_total;
            if (h < S) {
                uint64_t up = lm->push_total - lm->per_server[h] +
                              (uint64_t)(n - 1) * lm->upd_server[h],
                         down = lm->upd_total - lm->upd_server[h] +
                                (uint64_t)(n - 1) * lm->per_server[h];
                b = up > down ? up : down;
            }
            if (n == 1 && h < S) /* alone: everything stays on the host */
                b = 0;
            if (b > lm->busiest || h == 0) {
                lm->busiest = b;
                snprintf(lm->busiest_name, sizeof lm->busiest_name, "host %d link%s", h,
                         h < S ? " (worker + server)" : " (worker)");
            }
        }
    }
    psagg__layout_free(&l);
    return PSAGG_OK;
}

static void usage(const char *me)
{
    fprintf(stderr,
            "usage: %s --model PATH.sizes --codec CODEC --steps S --warmup W [--link-gbit R]\n"
            "          [--colocated] [--seed X] [--model-gpu GELEM_S [--model-pcie GBYTE_S]]\n"
            "  (a psagg worker: PSAGG_RANK, PSAGG_WORLD_SIZE, PSAGG_CONFIG from the launcher)\n",
            me);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"codec", required_argument, NULL, 'c'},
                                         {"steps", required_argument, NULL, 's'},
                                         {"warmup", required_argument, NULL, 'w'},
                                         {"link-gbit", required_argument, NULL, 'r'},
                                         {"colocated", no_argument, NULL, 'C'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"model-gpu", required_argument, NULL, 'g'},
                                         {"model-pcie", required_argument, NULL, 'p'},
                                         {"server-optimizer", no_argument, NULL, 'O'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *model = NULL, *codec_text = NULL, *cfg_path = getenv("PSAGG_CONFIG");
    int steps = -1, warmup = -1, colocated = 0, params = 0, rank, world, o, rc = 1;
    double link_gbit = 0, gpu_gelem_s = -1, pcie_gbyte_s = 25;
    uint64_t seed = 42, *sizes = NULL;
    long nt;
    psagg_codec codec;
    psagg__config *cfg = calloc(1, sizeof *cfg);
    psagg_ctx *ctx = NULL;
    psagg_tensor_desc *desc = NULL;
    psagg__ctl_tensor *decl = NULL;
    psagg_handle **h = NULL;
    float **in = NULL, **out = NULL, *timing = NULL, *timing_out = NULL, bar_in = 1, bar_out;
    double *t_rank = NULL, *t_step = NULL;
    char name[128], cname[48];
    link_model lm = {0};
    uint32_t n_chunks = 0, key_bar, key_time, n_fp32 = 0;
    psagg_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    uint64_t sent_sum = 0, raw_sum = 0, recv_sum = 0; /* model push_pulls of timed steps */
    struct rusage ru0 = {0}, ru1 = {0};               /* this process over the timed steps */
    double cpu_ms, minflt;
    psagg_status st;

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm':
            model = optarg;
            break;
        case 'c':
            codec_text = optarg;
            break;
        case 's':
            steps = atoi(optarg);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        case 'r':
            link_gbit = atof(optarg);
            break;
        case 'C':
            colocated = 1;
            break;
        case 'S':
            seed = strtoull(optarg, NULL, 0);
            break;
        case 'g':
            gpu_gelem_s = atof(optarg);
            if (gpu_gelem_s < 0) {
                usage(argv[0]);
                return 2;
            }
            break;
        case 'p':
            pcie_gbyte_s = atof(optarg);
            break;
        case 'O':
            params = 1;
            break;
        case 'h':
            usage(argv[0]);
            return 0;
        default:
            usage(argv[0]);
            return 2;
        }
    }
    if (!model || !codec_text || steps < 1 || warmup < 0 || link_gbit < 0 || pcie_gbyte_s < 0 ||
        optind != argc || !cfg || (params && gpu_gelem_s >= 0)) {
        usage(argv[0]);
        return 2;
    }
    if (psagg_codec_parse(codec_text, &codec)) {
        fprintf(stderr, "bench-exchange: %s\n", psagg_last_error());
        return 2;
    }
    if (!cfg_path) {
        fprintf(stderr, "bench-exchange: PSAGG_CONFIG is not set (start it with a launcher)\n");
        return 2;
    }
    /* the same configuration the library reads (environment overrides included) */
    if (psagg__config_load(cfg_path, cfg)) {
        fprintf(stderr, "bench-exchange: %s\n", psagg_last_error());
        return 2;
    }
    if (codec.id == PSAGG_CODEC_MAXMIN && codec.bucket == 0)
        codec.bucket = cfg->codec.bucket;
    if (psagg__codec_check(&codec)) {
        fprintf(stderr, "bench-exchange: %s\n", psagg_last_error());
        return 2;
    }
    psagg_codec_name(&codec, cname, sizeof cname);
    if (colocated && cfg->n_servers > cfg->n_workers) {
        fprintf(stderr, "bench-exchange: --colocated needs servers (%d) <= workers (%d)\n",
                cfg->n_servers, cfg->n_workers);
        return 2;
    }
    bench_model_name(model, name, sizeof name);
    if ((nt = bench_read_sizes("bench-exchange", model, &sizes)) < 0)
        return 2;

    if ((st = psagg_init(NULL, -1, -1, &ctx)))
        goto fail;
    rank = psagg_rank(ctx);
    world = psagg_world_size(ctx);
    key_bar = (uint32_t)nt;
    key_time = (uint32_t)nt + 1;

    desc = calloc((size_t)nt + 2, sizeof *desc);
    decl = calloc((size_t)nt + 2, sizeof *decl);
    in = calloc((size_t)nt, sizeof *in);
    out = calloc((size_t)nt, sizeof *out);
    h = calloc((size_t)nt, sizeof *h);
    t_rank = calloc((size_t)steps, sizeof *t_rank);
    t_step = calloc((size_t)steps, sizeof *t_step);
    timing = calloc((size_t)world * (size_t)steps, sizeof *timing);
    timing_out = calloc((size_t)world * (size_t)steps, sizeof *timing_out);
    if (!desc || !decl || !in || !out || !h || !t_rank || !t_step || !timing || !timing_out) {
        fprintf(stderr, "bench-exchange: out of memory\n");
        goto out;
    }
    for (long t = 0; t < nt + 2; t++) {
        char *nm = malloc(32);
        psagg_codec c = codec;
        if (!nm) {
            fprintf(stderr, "bench-exchange: out of memory\n");
            goto out;
        }
        if (t < nt) {
            snprintf(nm, 32, "g%04ld", t);
            if (sizes[t] < cfg->min_compress_elems) {
                c = (psagg_codec){.id = PSAGG_CODEC_FP32};
                if (codec.id != PSAGG_CODEC_FP32)
                    n_fp32++;
            }
        } else {
            snprintf(nm, 32, t == nt ? "bench.barrier" : "bench.timing");
            c = (psagg_codec){.id = PSAGG_CODEC_FP32};
        }
        desc[t] = (psagg_tensor_desc){
            .struct_size = sizeof(psagg_tensor_desc),
            .name = nm,
            .count = t < nt ? sizes[t] : (t == nt ? 1 : (uint64_t)world * (uint64_t)steps),
            .codec = c,
            .error_feedback = t < nt ? 1 : 0,
            .flags = t < nt && params ? PSAGG_TENSOR_PARAMETER : 0};
        if ((st = psagg__tensor_to_wire(nm, desc[t].count, &c, &decl[t])))
            goto fail;
        decl[t].flags = desc[t].flags ? PSAGG_DECL_PARAM : 0;
    }
    if ((st = model_links(decl, (uint32_t)nt + 2, (uint32_t)nt, cfg, colocated, &lm, &n_chunks)))
        goto fail;
    if ((st = psagg_declare(ctx, desc, (size_t)nt + 2, NULL)))
        goto fail;
    if (gpu_gelem_s >= 0 && (st = gpu_model_init(ctx, gpu_gelem_s, pcie_gbyte_s)))
        goto fail;
    for (long t = 0; t < nt; t++) {
        in[t] = malloc(sizes[t] * sizeof(float));
        out[t] = malloc(sizes[t] * sizeof(float));
        if (!in[t] || !out[t]) {
            fprintf(stderr, "bench-exchange: out of memory for tensor %ld\n", t);
            goto out;
        }
        fill(in[t], sizes[t], seed, rank, (uint32_t)t);
        memset(out[t], 0, sizes[t] * sizeof(float));
        if (params) { /* the weights: worker 0's, as every worker gets them */
            psagg_handle *ih;
            fill(out[t], sizes[t], seed + 1, rank, (uint32_t)t);
            if ((st = psagg_param_init(ctx, (uint32_t)t, out[t], &ih)) ||
                (st = psagg_wait(ih, -1))) {
                psagg_release(ih);
                goto fail;
            }
            psagg_release(ih);
        }
    }

    for (int step = 0; step < warmup + steps; step++) {
        psagg_handle *bh;
        double t0, t1;
        if (step == warmup)
            getrusage(RUSAGE_SELF, &ru0);
        if ((st = psagg_push_pull(ctx, key_bar, &bar_in, &bar_out, PSAGG_SUM, 0, &bh)) ||
            (st = psagg_wait(bh, -1))) {
            psagg_release(bh);
            goto fail;
        }
        psagg_release(bh);
        psagg_get_stats(ctx, &s0);
        t0 = now_ms();
        for (long t = nt - 1; t >= 0; t--)
            if ((st =
                     gpu_gelem_s >= 0
                         ? gpu_model_push_pull(ctx, (uint32_t)t, in[t], out[t], PSAGG_SUM, 0, &h[t])
                         : psagg_push_pull(ctx, (uint32_t)t, in[t], out[t], PSAGG_SUM, 0, &h[t])))
                goto fail;
        for (long t = nt - 1; t >= 0; t--) {
            st = psagg_wait(h[t], -1);
            psagg_release(h[t]);
            h[t] = NULL;
            if (st)
                goto fail;
        }
        t1 = now_ms();
        psagg_get_stats(ctx, &s1);
        if (step >= warmup) {
            t_rank[step - warmup] = t1 - t0;
            sent_sum += s1.bytes_sent - s0.bytes_sent;
            raw_sum += s1.bytes_raw - s0.bytes_raw;
            recv_sum += s1.bytes_received - s0.bytes_received;
        }
    }

    getrusage(RUSAGE_SELF, &ru1);
    /* every rank's own CPU, for the sums over workers (bench-exchange.sh, bench_cluster.py) */
    cpu_ms = ((double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) * 1e3 +
              (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e3 +
              (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) * 1e3 +
              (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e3) /
             steps;
    minflt = (double)(ru1.ru_minflt - ru0.ru_minflt) / steps;
    printf("CPU rank=%d cpu_ms=%.1f minflt=%.1f\n", rank, cpu_ms, minflt);
    fflush(stdout);
    /* step time = max over ranks: gather every rank's times through one fp32 SUM */
    for (int i = 0; i < steps; i++)
        timing[(size_t)rank * (size_t)steps + (size_t)i] = (float)t_rank[i];
    {
        psagg_handle *th;
        if ((st = psagg_push_pull(ctx, key_time, timing, timing_out, PSAGG_SUM, 0, &th)) ||
            (st = psagg_wait(th, -1))) {
            psagg_release(th);
            goto fail;
        }
        psagg_release(th);
    }
    for (int i = 0; i < steps; i++) {
        t_step[i] = 0;
        for (int w = 0; w < world; w++) {
            double v = timing_out[(size_t)w * (size_t)steps + (size_t)i];
            if (v > t_step[i])
                t_step[i] = v;
        }
    }

    if (rank == 0) {
        uint64_t sent = sent_sum / (uint64_t)steps, raw = raw_sum / (uint64_t)steps;
        uint64_t total_elems = 0;
        double med, p10, p90, wire_ms, rate;
        qsort(t_step, (size_t)steps, sizeof *t_step, bench_cmp_double);
        med = bench_quantile(t_step, steps, 0.5);
        p10 = bench_quantile(t_step, steps, 0.1);
        p90 = bench_quantile(t_step, steps, 0.9);
        wire_ms = link_gbit > 0 ? (double)lm.busiest * 8 / (link_gbit * 1e9) * 1e3 : 0;
        rate = med > 0 ? (double)lm.busiest * 8 / (med * 1e-3) / 1e9 : 0;
        for (long t = 0; t < nt; t++)
            total_elems += sizes[t];
        printf("psagg exchange benchmark: model %s (%ld tensors, %llu elements, %.1f MB fp32), "
               "codec %s (%u small tensors fp32: min_compress_elems=%llu)\n",
               name, nt, (unsigned long long)total_elems, total_elems * 4.0 / 1e6, cname, n_fp32,
               (unsigned long long)cfg->min_compress_elems);
        printf("  %d workers, %d servers%s, chunk_bytes=%llu (%u chunks), max_inflight=%d, "
               "provider %s\n",
               world, cfg->n_servers, colocated ? " (colocated with workers 0..S-1)" : "",
               (unsigned long long)cfg->chunk_bytes, n_chunks, cfg->max_inflight, cfg->provider);
        printf("  per step: each worker pushes %.3f MB (layout) / %.3f MB (counted), receives "
               "%.3f MB; compression %.2fx\n",
               lm.push_total / 1e6, sent / 1e6, recv_sum / (double)steps / 1e6,
               sent ? (double)raw / (double)sent : 0.0);
        printf("  server shares of one worker's pushes:");
        for (int s = 0; s < cfg->n_servers; s++)
            printf(" s%d %.3f MB", s, lm.per_server[s] / 1e6);
        printf("\n  busiest link: %s, %.3f MB per step per direction\n", lm.busiest_name,
               lm.busiest / 1e6);
        printf("  %d warm-up + %d timed steps: median %.2f ms (p10 %.2f, p90 %.2f, min %.2f, "
               "max %.2f)\n",
               warmup, steps, med, p10, p90, t_step[0], t_step[steps - 1]);
        if (link_gbit > 0)
            printf("  wire limit at %g Gbit/s: %.2f ms -> median is %.2fx the wire limit\n",
                   link_gbit, wire_ms, med / wire_ms);
        printf("  achieved rate on the busiest link: %.3f Gbit/s\n", rate);
        if (gpu_gelem_s >= 0)
            printf("  workers MODELLED AS GPU WORKERS: codecs at %g Gelem/s, PCIe %g GB/s, not "
                   "run (gpu_model.h); worker CPU excludes them\n",
                   gpu_gelem_s, pcie_gbyte_s);
        printf("  worker 0: %.1f CPU ms and %.1f minor page faults per timed step\n", cpu_ms,
               minflt);
        printf("RESULT system=psagg model=%s codec=%s workers=%d servers=%d median_ms=%.3f "
               "p10_ms=%.3f p90_ms=%.3f busiest_link_bytes=%llu wire_limit_ms=%.3f "
               "bytes_sent_per_worker=%llu compression=%.3f worker_cpu_ms=%.1f "
               "worker_minflt=%.1f worker_model=%s gpu_gelem_s=%g pcie_gbyte_s=%g params=%d\n",
               name, codec_text, world, cfg->n_servers, med, p10, p90,
               (unsigned long long)lm.busiest, wire_ms, (unsigned long long)sent,
               sent ? (double)raw / (double)sent : 0.0, cpu_ms, minflt,
               gpu_gelem_s >= 0 ? "gpu" : "cpu", gpu_gelem_s >= 0 ? gpu_gelem_s : 0,
               gpu_gelem_s >= 0 ? pcie_gbyte_s : 0, params);
        fflush(stdout);
    }
    rc = 0;
    goto out;

fail:
    fprintf(stderr, "bench-exchange: %s: %s\n", psagg_strerror(st), psagg_last_error());
    rc = 1;
out:
    if (h)
        for (long t = 0; t < nt; t++)
            if (h[t])
                psagg_release(h[t]);
    if (ctx && psagg_close(ctx) && !rc)
        rc = 1;
    gpu_model_free();
    for (long t = 0; desc && t < nt + 2; t++)
        free((char *)desc[t].name);
    for (long t = 0; in && t < nt; t++) {
        free(in[t]);
        free(out[t]);
    }
    free(in);
    free(out);
    free(h);
    free(desc);
    free(decl);
    free(sizes);
    free(t_rank);
    free(t_step);
    free(timing);
    free(timing_out);
    free(lm.per_server);
    free(lm.upd_server);
    free(cfg);
    return rc;
}
