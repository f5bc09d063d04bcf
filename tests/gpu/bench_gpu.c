/*
 * bench_gpu.c - psagg-bench-gpu: throughput of the CUDA codec kernels and the worker-side
 * cost per training step of ResNet-50's gradients. Prints figures; never passes or fails on a
 * time (exit 77 without a device, 1 on a CUDA or codec error).
 *
 *   psagg-bench-gpu [--elems N] [--reps R] [--sizes FILE]
 *
 * 1. Copy bandwidth, measured in the same run: cudaMemcpy device-to-device of a large buffer,
 *    (bytes read + bytes written) / s. Every kernel's figure is its bytes touched per second
 *    (what it must read and write at least) and that as a fraction of the copy bandwidth.
 * 2. Kernels on N elements (default 2^26): encode with error feedback (x and residual read,
 *    residual and the encoded buffer written), decode, decode-accumulate, and the fused
 *    aggregate for N = 2, 4, 8 inputs (no server residual), for maxmin 2/4/8 bits (B = 1024,
 *    stochastic rounding), fp16 and bf16, and topk2:0.02 and topk4:0.05 (blocks of 4096; no
 *    aggregate: the server sums topk on the CPU; its encode reads x and r four times, so its
 *    share of the copy is a floor), and thc2 and thc4 (blocks of 1024: a push with its rotated
 *    residual, and the decode of 4 workers' sums (4-bit at thc2, 8-bit at thc4; the server's
 *    fold is the CPU's).
 *    Timed with CUDA events over R repetitions.
 * 3. ResNet-50 worker step (tests/data/models/resnet50.sizes): per tensor encode + EF on the
 *    device into one packed arena, one D2H copy of all compressed bytes into pinned memory,
 *    one H2D copy of the update (same size), per tensor decode into the gradients. Reported
 *    with plain launches and replayed as a CUDA graph (same work, less launch overhead).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/bench_util.h"
#include "base/error.h"
#include "kernels/cuda/codec_cuda.h"
#include "kernels/thc.h"

#ifndef PSAGG_TEST_DATA_DIR
#define PSAGG_TEST_DATA_DIR "tests/data"
#endif

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define PS(call)                                                                                   \
    do {                                                                                           \
        psagg_status s_ = (call);                                                                  \
        if (s_ != PSAGG_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, psagg_strerror(s_), \
                    psagg_last_error());                                                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static cudaStream_t stream;
static cudaEvent_t ev0, ev1;
static double copy_bw; /* bytes read + written per second */

static void *dmalloc(size_t bytes)
{
    void *p;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

/* Fill n floats on the device with deterministic data in [-1, 1) (host-generated once). */
static void fill_device(float *d, size_t n, uint64_t seed)
{
    size_t chunk = 1 << 22;
    float *h = malloc(chunk * 4);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    if (!h)
        exit(1);
    for (size_t done = 0; done < n; done += chunk) {
        size_t m = n - done < chunk ? n - done : chunk;
        for (size_t i = 0; i < m; i++) {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            h[i] = (float)((s * 0x2545F4914F6CDD1Dull) >> 40) * 0x1p-23f - 1.0f;
        }
        CU(cudaMemcpy(d + done, h, m * 4, cudaMemcpyHostToDevice));
    }
    free(h);
}

static void timer_start(void)
{
    CU(cudaEventRecord(ev0, stream));
}

/* milliseconds since timer_start, divided by reps */
static double timer_stop(int reps)
{
    float ms;
    CU(cudaEventRecord(ev1, stream));
    CU(cudaEventSynchronize(ev1));
    CU(cudaEventElapsedTime(&ms, ev0, ev1));
    return (double)ms / reps;
}

static void report(const char *what, const char *codec, double ms, double bytes, size_t n)
{
    double bw = bytes / (ms * 1e-3);
    printf("  %-22s %-10s %9.3f ms  %8.1f Gelem/s  %8.1f GB/s touched  %5.1f%% of copy\n", what,
           codec, ms, (double)n / (ms * 1e-3) / 1e9, bw / 1e9, 100.0 * bw / copy_bw);
}

static void measure_copy(size_t bytes, int reps)
{
    void *a = dmalloc(bytes), *b = dmalloc(bytes);
    CU(cudaMemsetAsync(a, 1, bytes, stream));
    CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream)); /* warm-up */
    timer_start();
    for (int i = 0; i < reps; i++)
        CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    double ms = timer_stop(reps);
    copy_bw = 2.0 * (double)bytes / (ms * 1e-3);
    printf("device-to-device copy of %.0f MiB: %.3f ms, %.1f GB/s (read + write)\n",
           (double)bytes / (1 << 20), ms, copy_bw / 1e9);
    CU(cudaFree(a));
    CU(cudaFree(b));
}

/* Exit if the kernels of codec `name` found an error in the benchmark's data (error word err). */
static void no_data_error(uint64_t *err, const char *name)
{
    uint64_t w;
    CU(cudaMemcpy(&w, err, 8, cudaMemcpyDeviceToHost));
    if (w != PSAGG_CUDA_ERR_NONE) {
        size_t bad;
        psagg_status st = psagg__cuda_err_status(w, &bad);
        fprintf(stderr, "%s: unexpected data error %s at %zu\n", name, psagg_strerror(st), bad);
        exit(1);
    }
}

/* thc (kernels/thc.h): a worker's push (x and r read, r and the push written) and the decode
   of the update 4 workers' pushes make (4- or 8-bit sums; the CPU folds them), at the scales one
   round sets. */
static void bench_thc(uint32_t bits, const char *name, size_t n, int reps)
{
    const psagg_codec c = {PSAGG_CODEC_THC, bits, 1024, PSAGG_ROUND_STOCHASTIC, 0};
    const size_t nb = psagg__thc_blocks(n, 1024), np = psagg__thc_rotated_len(n, 1024);
    const size_t plen = psagg__thc_push_bytes(bits, 1024, n);
    const size_t ulen = psagg__thc_update_bytes(bits, 1024, n, 4);
    float *x = dmalloc(n * 4), *r = dmalloc(np * 4), *y = dmalloc(n * 4), *sc = dmalloc(nb * 4);
    uint8_t *push = dmalloc(plen), *upd = dmalloc(ulen), *h_p = malloc(4 * plen);
    uint8_t *h_u = malloc(ulen);
    const uint8_t *ins[4];
    float *h_sc = calloc(nb, 4);
    uint64_t *err = dmalloc(8);
    psagg__rng_key rot = psagg__rng_key_make(42, 2), key = psagg__rng_key_make(42, 1);
    double ms;

    if (!h_p || !h_u || !h_sc) {
        fprintf(stderr, "bench thc: out of memory\n");
        exit(1);
    }
    fill_device(x, n, 1);
    CU(cudaMemsetAsync(r, 0, np * 4, stream));
    PS(psagg__cuda_err_reset(err, stream));
    for (int round = 0; round < 2; round++) { /* round 0 sets the scales of round 1 */
        CU(cudaMemcpyAsync(sc, h_sc, nb * 4, cudaMemcpyHostToDevice, stream));
        for (int w = 0; w < 4; w++) {
            PS(psagg__cuda_thc_push_encode(&c, rot, sc, x, r, n,
                                           psagg__rng_key_make(7, (uint64_t)w), push, plen, err,
                                           stream));
            CU(cudaMemcpyAsync(h_p + w * plen, push, plen, cudaMemcpyDeviceToHost, stream));
            ins[w] = h_p + w * plen;
        }
        CU(cudaStreamSynchronize(stream));
        PS(psagg__thc_update_fold(bits, 1024, ins, 4, plen, n, h_u, ulen));
        psagg__thc_update_next_scales(bits, 1024, h_u, n, h_sc);
    }
    CU(cudaMemcpy(upd, h_u, ulen, cudaMemcpyHostToDevice));
    timer_start();
    for (int i = 0; i < reps; i++)
        PS(psagg__cuda_thc_push_encode(&c, rot, sc, x, r, n, key, push, plen, err, stream));
    ms = timer_stop(reps);
    report("push+EF", name, ms, 4.0 * n + 8.0 * np + plen, n);
    timer_start();
    for (int i = 0; i < reps; i++)
        PS(psagg__cuda_thc_update_decode(&c, rot, upd, ulen, n, 0.25f, PSAGG_DECODE_SCALE, y, err,
                                         stream));
    ms = timer_stop(reps);
    report("update decode (4)", name, ms, 4.0 * n + ulen, n);
    no_data_error(err, name);
    CU(cudaFree(x));
    CU(cudaFree(r));
    CU(cudaFree(y));
    CU(cudaFree(sc));
    CU(cudaFree(push));
    CU(cudaFree(upd));
    CU(cudaFree(err));
    free(h_p), free(h_u), free(h_sc);
}

static void bench_codec(const psagg_codec *c, const char *name, size_t n, int reps)
{
    size_t len = psagg__cuda_encoded_size(c, n);
    float *x = dmalloc(n * 4), *r = dmalloc(n * 4), *acc = dmalloc(n * 4);
    uint8_t *out = dmalloc(len), *ins[8];
    const void *in[8];
    uint64_t *err = dmalloc(8);
    psagg__rng_key key = psagg__rng_key_make(42, 1);
    double ms;

    fill_device(x, n, 1);
    fill_device(acc, n, 3);
    CU(cudaMemsetAsync(r, 0, n * 4, stream));
    PS(psagg__cuda_err_reset(err, stream));
    for (int i = 0; i < 8; i++) { /* 8 distinct encoded inputs for aggregate */
        ins[i] = dmalloc(len);
        in[i] = ins[i];
        PS(psagg__cuda_encode(c, x, r, n, psagg__rng_key_make(7, (uint64_t)i), ins[i], len, err,
                              stream));
    }

    PS(psagg__cuda_encode(c, x, r, n, key, out, len, err, stream)); /* warm-up */
    timer_start();
    for (int i = 0; i < reps; i++)
        PS(psagg__cuda_encode(c, x, r, n, key, out, len, err, stream));
    ms = timer_stop(reps);
    report("encode+EF", name, ms, 12.0 * n + len, n);

    timer_start();
    for (int i = 0; i < reps; i++)
        PS(psagg__cuda_decode(c, out, len, n, acc, err, stream));
    ms = timer_stop(reps);
    report("decode", name, ms, 4.0 * n + len, n);

    timer_start();
    for (int i = 0; i < reps; i++)
        PS(psagg__cuda_decode_add(c, out, len, n, acc, err, stream));
    ms = timer_stop(reps);
    report("decode-accumulate", name, ms, 8.0 * n + len, n);

    for (int ni = 2; ni <= 8 && c->id != PSAGG_CODEC_TOPK; ni *= 2) { /* (no CUDA topk sum) */
        char what[32];
        PS(psagg__cuda_aggregate(c, in, (size_t)ni, len, n, NULL, key, out, len, err, stream));
        timer_start();
        for (int i = 0; i < reps; i++)
            PS(psagg__cuda_aggregate(c, in, (size_t)ni, len, n, NULL, key, out, len, err, stream));
        ms = timer_stop(reps);
        snprintf(what, sizeof what, "aggregate N=%d", ni);
        report(what, name, ms, (double)len * (ni + 1), n);
    }
    no_data_error(err, name);
    for (int i = 0; i < 8; i++)
        CU(cudaFree(ins[i]));
    CU(cudaFree(x));
    CU(cudaFree(r));
    CU(cudaFree(acc));
    CU(cudaFree(out));
    CU(cudaFree(err));
}

/* ---- ResNet-50 worker step ---- */

static size_t round256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

static void enqueue_step(const psagg_codec *c, size_t nt, const uint64_t *sizes, float **grad,
                         float **res, const size_t *eoff, size_t ebytes, uint8_t *d_enc,
                         uint8_t *d_upd, uint8_t *h_enc, uint8_t *h_upd, uint64_t *err, int step)
{
    for (size_t t = 0; t < nt; t++)
        PS(psagg__cuda_encode(c, grad[t], res[t], sizes[t], psagg__rng_key_make(step, t),
                              d_enc + eoff[t], psagg__cuda_encoded_size(c, sizes[t]), err, stream));
    CU(cudaMemcpyAsync(h_enc, d_enc, ebytes, cudaMemcpyDeviceToHost, stream));
    CU(cudaMemcpyAsync(d_upd, h_upd, ebytes, cudaMemcpyHostToDevice, stream));
    for (size_t t = 0; t < nt; t++)
        PS(psagg__cuda_decode(c, d_upd + eoff[t], psagg__cuda_encoded_size(c, sizes[t]), sizes[t],
                              grad[t], err, stream));
}

static void bench_worker(const psagg_codec *c, const char *name, const char *sizes_path, int reps)
{
    uint64_t *sizes;
    long n_read = bench_read_sizes("psagg-bench-gpu", sizes_path, &sizes);
    size_t nt = n_read > 0 ? (size_t)n_read : 0, total = 0, ebytes = 0;
    if (n_read <= 0)
        exit(1);
    size_t *goff = malloc(nt * sizeof *goff), *eoff = malloc(nt * sizeof *eoff);
    float **grad = malloc(nt * sizeof *grad), **res = malloc(nt * sizeof *res), *d_grad, *d_res;
    uint8_t *d_enc, *d_upd, *h_enc, *h_upd;
    uint64_t *err = dmalloc(8);
    double ms_plain, ms_graph, ms_enc, ms_d2h, ms_h2d, ms_dec;
    cudaGraph_t graph;
    cudaGraphExec_t exec;

    for (size_t t = 0; t < nt; t++) {
        goff[t] = total;
        total += (sizes[t] + 63) & ~(size_t)63; /* 256-byte aligned tensors */
        eoff[t] = ebytes;
        ebytes += round256(psagg__cuda_encoded_size(c, sizes[t]));
    }
    d_grad = dmalloc(total * 4);
    d_res = dmalloc(total * 4);
    d_enc = dmalloc(ebytes);
    d_upd = dmalloc(ebytes);
    CU(cudaMallocHost((void **)&h_enc, ebytes));
    CU(cudaMallocHost((void **)&h_upd, ebytes));
    fill_device(d_grad, total, 11);
    CU(cudaMemsetAsync(d_res, 0, total * 4, stream));
    for (size_t t = 0; t < nt; t++) {
        grad[t] = d_grad + goff[t];
        res[t] = d_res + goff[t];
    }
    PS(psagg__cuda_err_reset(err, stream));
    /* a valid update: this worker's own encoding */
    enqueue_step(c, nt, sizes, grad, res, eoff, ebytes, d_enc, d_upd, h_enc, h_upd, err, 0);
    CU(cudaStreamSynchronize(stream));
    memcpy(h_upd, h_enc, ebytes);
    fill_device(d_grad, total, 11);

    /* the parts, separately */
    timer_start();
    for (int i = 0; i < reps; i++)
        for (size_t t = 0; t < nt; t++)
            PS(psagg__cuda_encode(c, grad[t], res[t], sizes[t], psagg__rng_key_make(i, t),
                                  d_enc + eoff[t], psagg__cuda_encoded_size(c, sizes[t]), err,
                                  stream));
    ms_enc = timer_stop(reps);
    timer_start();
    for (int i = 0; i < reps; i++)
        CU(cudaMemcpyAsync(h_enc, d_enc, ebytes, cudaMemcpyDeviceToHost, stream));
    ms_d2h = timer_stop(reps);
    timer_start();
    for (int i = 0; i < reps; i++)
        CU(cudaMemcpyAsync(d_upd, h_upd, ebytes, cudaMemcpyHostToDevice, stream));
    ms_h2d = timer_stop(reps);
    timer_start();
    for (int i = 0; i < reps; i++)
        for (size_t t = 0; t < nt; t++)
            PS(psagg__cuda_decode(c, d_upd + eoff[t], psagg__cuda_encoded_size(c, sizes[t]),
                                  sizes[t], grad[t], err, stream));
    ms_dec = timer_stop(reps);

    /* whole step, plain launches (host time included: the step ends when the stream does) */
    timer_start();
    for (int i = 0; i < reps; i++)
        enqueue_step(c, nt, sizes, grad, res, eoff, ebytes, d_enc, d_upd, h_enc, h_upd, err, i + 1);
    ms_plain = timer_stop(reps);

    /* the same step captured once as a CUDA graph and replayed */
    CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue_step(c, nt, sizes, grad, res, eoff, ebytes, d_enc, d_upd, h_enc, h_upd, err, 1);
    CU(cudaStreamEndCapture(stream, &graph));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, stream));
    timer_start();
    for (int i = 0; i < reps; i++)
        CU(cudaGraphLaunch(exec, stream));
    ms_graph = timer_stop(reps);

    {
        uint64_t herr;
        CU(cudaMemcpy(&herr, err, 8, cudaMemcpyDeviceToHost));
        if (herr != PSAGG_CUDA_ERR_NONE) {
            size_t bad;
            psagg_status st = psagg__cuda_err_status(herr, &bad);
            fprintf(stderr, "unexpected data error %s at %zu\n", psagg_strerror(st), bad);
            exit(1);
        }
    }
    printf("  %-10s %zu tensors, %zu elements, %.2f MB compressed each way:\n", name, nt, total,
           (double)ebytes / 1e6);
    printf("    encode+EF %.3f ms | D2H %.3f ms (%.1f GB/s) | H2D %.3f ms (%.1f GB/s) | "
           "decode %.3f ms\n",
           ms_enc, ms_d2h, (double)ebytes / (ms_d2h * 1e6), ms_h2d, (double)ebytes / (ms_h2d * 1e6),
           ms_dec);
    printf("    step total: %.3f ms/step with plain launches, %.3f ms/step as a CUDA graph\n",
           ms_plain, ms_graph);

    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    CU(cudaFree(d_grad));
    CU(cudaFree(d_res));
    CU(cudaFree(d_enc));
    CU(cudaFree(d_upd));
    CU(cudaFreeHost(h_enc));
    CU(cudaFreeHost(h_upd));
    CU(cudaFree(err));
    free(sizes);
    free(goff);
    free(eoff);
    free(grad);
    free(res);
}

int main(int argc, char **argv)
{
    size_t n = (size_t)1 << 26;
    int reps = 20;
    const char *sizes_path = PSAGG_TEST_DATA_DIR "/models/resnet50.sizes";
    struct cudaDeviceProp prop;
    int dev = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--elems") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes_path = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--elems N] [--reps R] [--sizes FILE]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    if (psagg__cuda_device_count() == 0) {
        printf("SKIP: no CUDA device or driver (psagg__cuda_device_count() == 0)\n");
        return 77;
    }
    CU(cudaSetDevice(dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30));
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));

    measure_copy((size_t)1 << 30, reps);
    printf("kernels on %zu elements (%.0f MiB of fp32), %d reps each; bytes touched: encode+EF "
           "12n + enc, decode 4n + enc, decode-acc 8n + enc, aggregate (N+1) enc\n",
           n, (double)n * 4 / (1 << 20), reps);
    {
        const struct {
            const char *name;
            psagg_codec c;
        } cs[] = {
            {"maxmin2", {PSAGG_CODEC_MAXMIN, 2, 1024, PSAGG_ROUND_STOCHASTIC, 0}},
            {"maxmin4", {PSAGG_CODEC_MAXMIN, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0}},
            {"maxmin8", {PSAGG_CODEC_MAXMIN, 8, 1024, PSAGG_ROUND_STOCHASTIC, 0}},
            {"fp16", {PSAGG_CODEC_FP16, 0, 0, PSAGG_ROUND_NEAREST, 0}},
            {"bf16", {PSAGG_CODEC_BF16, 0, 0, PSAGG_ROUND_NEAREST, 0}},
            /* sparse: 2 % of each block of 4096 in 2 bits, 5 % in 4 (k = ceil(share * 4096)) */
            {"topk2:0.02", {PSAGG_CODEC_TOPK, 2, 4096, PSAGG_ROUND_STOCHASTIC, 82}},
            {"topk4:0.05", {PSAGG_CODEC_TOPK, 4, 4096, PSAGG_ROUND_STOCHASTIC, 205}},
        };
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            bench_codec(&cs[i].c, cs[i].name, n, reps);
        bench_thc(2, "thc2", n, reps);
        bench_thc(4, "thc4", n, reps);
        printf("ResNet-50 worker step (%s): encode+EF, D2H compressed to pinned, H2D update, "
               "decode\n",
               sizes_path);
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            bench_worker(&cs[i].c, cs[i].name, sizes_path, reps);
    }
    CU(cudaEventDestroy(ev0));
    CU(cudaEventDestroy(ev1));
    CU(cudaStreamDestroy(stream));
    return 0;
}
