/*
 * test_cuda_more.c - the CUDA codecs where gpu.codec does not reach, each against the CPU
 * library byte for byte (test gpu.more, label gpu; 77 without a device, a failure when the
 * host has a device node but CUDA finds none: gpu_skip.h):
 *   - maxmin buckets 64, 128, 192, 256, 320, 384, 1024, 2048 and 2^20 (teams of 8, 16 and 32
 *     lanes; buckets whose values stay in registers and those recomputed), 1-8 bits, +-residual;
 *   - the fused aggregate with 9 to 64 inputs (PSAGG_CUDA_MAX_INPUTS);
 *   - psagg__cuda_scale against one IEEE multiply per element;
 *   - n of 300 million elements (encode with residual, decode), when the device has the memory;
 *   - four threads, each with its own stream, encoding at once;
 *   - topk (the sparse codec): encode with and without residual, decode, decode_add and
 *     corrupted buffers' verdicts, bad inputs' status and index;
 *   - thc (integer aggregation): W workers' pushes (the rotation, the table, residuals, blocks of
 *     scale 0) and the decode of their CPU fold with every op, 4-, 8- and 16-bit sums, blocks of 64
 *     to 65536 (shared memory and scratch), bad inputs, a corrupt sum and a corrupt meta;
 *   - an error the caller left pending in the CUDA runtime is still there after psagg's calls.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../testutil.h"
#include "../unit/test_codec_util.h"
#include "gpu_skip.h"
#include "kernels/cuda/codec_cuda.h"
#include "kernels/thc.h"
#include "kernels/topk.h"

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *dmalloc(size_t n)
{
    void *p = NULL;
    CU(cudaMalloc(&p, n ? n : 1));
    return p;
}

/* Encode x (+ residual r0) on the CPU and on the GPU (stream s), then decode both ways:
 * bytes, residuals and decodes must be identical. */
static void encode_case(const psagg_codec *c, size_t n, const float *x, const float *r0,
                        uint64_t seed, cudaStream_t s, const char *what)
{
    size_t len = psagg__encoded_size(c, n), bad = 0;
    psagg__rng_key key = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x5a5a};
    uint8_t *cpu = tc_xmalloc(len + 1), *gpu = tc_xmalloc(len + 1);
    float *rc = r0 ? tc_xmalloc(n * 4 + 4) : NULL, *rg = r0 ? tc_xmalloc(n * 4 + 4) : NULL;
    float *dc = tc_xmalloc(n * 4 + 4), *dg = tc_xmalloc(n * 4 + 4);
    float *d_x = dmalloc(n * 4), *d_r = r0 ? dmalloc(n * 4) : NULL, *d_dec = dmalloc(n * 4);
    uint8_t *d_out = dmalloc(len);
    psagg_status a, b;

    if (r0)
        memcpy(rc, r0, n * 4);
    a = psagg__encode(c, x, rc, n, key, cpu, len, &bad);
    CU(cudaMemcpy(d_x, x, n * 4, cudaMemcpyHostToDevice));
    if (r0)
        CU(cudaMemcpy(d_r, r0, n * 4, cudaMemcpyHostToDevice));
    b = psagg__cuda_encode_sync(c, d_x, d_r, n, key, d_out, len, &bad, s);
    CHECK(a == b, "%s: %s n=%zu: CPU status %d, GPU %d (%s)", what, tc_name(c), n, a, b,
          psagg_last_error());
    if (a == PSAGG_OK && b == PSAGG_OK) {
        CU(cudaMemcpy(gpu, d_out, len, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(cpu, gpu, len), "%s: %s n=%zu: encoded bytes differ at %zu", what, tc_name(c),
              n, tc_first_diff(cpu, gpu, len));
        if (r0) {
            CU(cudaMemcpy(rg, d_r, n * 4, cudaMemcpyDeviceToHost));
            CHECK(!memcmp(rc, rg, n * 4), "%s: %s n=%zu: residuals differ at byte %zu", what,
                  tc_name(c), n, tc_first_diff(rc, rg, n * 4));
        }
        a = psagg__decode(c, cpu, len, n, dc);
        b = psagg__cuda_decode_sync(c, d_out, len, n, d_dec, &bad, s);
        CHECK(a == PSAGG_OK && b == PSAGG_OK, "%s: %s n=%zu: decode %d / %d", what, tc_name(c), n,
              a, b);
        CU(cudaMemcpy(dg, d_dec, n * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(dc, dg, n * 4), "%s: %s n=%zu: decodes differ at byte %zu", what, tc_name(c),
              n, tc_first_diff(dc, dg, n * 4));
    }
    cudaFree(d_x);
    cudaFree(d_r);
    cudaFree(d_dec);
    cudaFree(d_out);
    free(cpu), free(gpu), free(rc), free(rg), free(dc), free(dg);
}

static void buckets(void)
{
    static const uint32_t bs[] = {64, 128, 192, 256, 320, 384, 1024, 2048, 1u << 20};
    int cases = 0;
    for (size_t bi = 0; bi < sizeof bs / sizeof bs[0]; bi++)
        for (uint32_t bits = 1; bits <= 8; bits++) {
            psagg_codec c = {.id = PSAGG_CODEC_MAXMIN,
                             .bits = bits,
                             .bucket = bs[bi],
                             .rounding = PSAGG_ROUND_STOCHASTIC};
            size_t n = bs[bi] < 4096 ? 3 * (size_t)bs[bi] + 37 : (size_t)bs[bi] + 4099;
            float *x, *r;
            if (psagg__codec_check(&c)) /* bits that do not fit the bucket's groups */
                continue;
            x = tc_xmalloc(n * 4);
            r = tc_xmalloc(n * 4);
            tc_fill_inputs(&c, n, (int)(bits % TC_KIND_COUNT), bs[bi] * 31 + bits, x, r, NULL);
            encode_case(&c, n, x, NULL, bits, 0, "bucket");
            encode_case(&c, n, x, r, bits + 100, 0, "bucket+residual");
            c.rounding = PSAGG_ROUND_NEAREST;
            encode_case(&c, n, x, r, bits + 200, 0, "bucket nearest");
            cases += 3;
            free(x), free(r);
        }
    printf("buckets 64..2^20, 1-8 bits: %d cases\n", cases);
}

/* topk's decode_add and a corrupted buffer's verdict, CPU against GPU (`enc` valid, len bytes). */
static void topk_decodes(const psagg_codec *c, size_t n, const uint8_t *enc, size_t len,
                         uint64_t seed)
{
    float *acc = tc_xmalloc(n * 4 + 4), *got = tc_xmalloc(n * 4 + 4), *d_acc = dmalloc(n * 4);
    uint8_t *bad = tc_xmalloc(len), *d_in = dmalloc(len);
    const psagg__topk_format f = {c->bits, c->bucket, c->k, c->rounding};
    const psagg__topk_layout l = psagg__topk_layout_of(&f, n);
    size_t ix = 0;
    psagg_status a, b;
    tc_fill(acc, n, TC_KIND_MIXED, seed, 0);
    CU(cudaMemcpy(d_acc, acc, n * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_in, enc, len, cudaMemcpyHostToDevice));
    a = psagg__decode_add(c, enc, len, n, acc);
    b = psagg__cuda_decode_add_sync(c, d_in, len, n, d_acc, &ix, 0);
    CHECK(a == PSAGG_OK && b == PSAGG_OK, "topk decode_add %s n=%zu: %d / %d", tc_name(c), n, a, b);
    CU(cudaMemcpy(got, d_acc, n * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(acc, got, n * 4), "topk decode_add %s n=%zu: differs at byte %zu", tc_name(c), n,
          tc_first_diff(acc, got, n * 4));
    /* corrupted: a negative scale, two indices out of order, a padding bit (when there is one) */
    for (int kind = 0; kind < 3; kind++) {
        memcpy(bad, enc, len);
        if (kind == 0) {
            bad[8 * (l.nb - 1) + 3] |= 0x80; /* the last block's scale */
        } else if (kind == 1) {
            if (l.kept < 2 || c->k < 2)
                continue;
            bad[l.idx_off] ^= 0xFF, bad[l.idx_off + 1] ^= 0xFF; /* the first indices */
        } else {
            if ((l.kept * c->bits) % 64 == 0)
                continue;
            bad[len - 1] |= 0x80; /* past the last value */
        }
        CU(cudaMemcpy(d_in, bad, len, cudaMemcpyHostToDevice));
        a = psagg__decode(c, bad, len, n, got);
        b = psagg__cuda_decode_sync(c, d_in, len, n, d_acc, &ix, 0);
        CHECK(a == b, "topk %s n=%zu corrupted (%d): CPU %d, GPU %d (%s)", tc_name(c), n, kind, a,
              b, psagg_last_error());
    }
    cudaFree(d_acc), cudaFree(d_in);
    free(acc), free(got), free(bad);
}

/* The sparse codec (kernels/topk.h) on the GPU against the CPU's scalar reference: blocks of 256
 * to 65536, k from 1 to the whole block (and above the last block's length), 2 to 8 bits, both
 * roundings, with and without a residual, on data with many equal magnitudes (ties), constant
 * and zero blocks (scale 0) and wide ranges; then NaN, Inf and 2^126 at a chosen element. */
static void topk(void)
{
    static const uint32_t blocks[] = {256, 1024, 4096, 65536};
    static const uint32_t bits[] = {2, 3, 4, 8};
    int cases = 0;
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        const uint32_t C = blocks[bi];
        const uint32_t ks[] = {1, C / 50 ? C / 50 : 1, C / 3, C - 1, C};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (int kind = 0; kind < TC_KIND_COUNT; kind++) {
                psagg_codec c = {.id = PSAGG_CODEC_TOPK,
                                 .bits = bits[(ki + (size_t)kind) % 4],
                                 .bucket = C,
                                 .k = ks[ki],
                                 .rounding =
                                     kind & 1 ? PSAGG_ROUND_NEAREST : PSAGG_ROUND_STOCHASTIC};
                size_t n = C >= 65536 ? (size_t)C + 4099 : 3 * (size_t)C + 37 + (size_t)kind;
                float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4);
                size_t len = psagg__encoded_size(&c, n), bad = 0;
                uint8_t *enc = tc_xmalloc(len);
                float *rc = tc_xmalloc(n * 4);
                CHECK(psagg__codec_check(&c) == PSAGG_OK, "topk codec: %s", psagg_last_error());
                tc_fill_inputs(&c, n, kind, C * 131 + ks[ki] * 7 + (uint64_t)kind, x, r, NULL);
                encode_case(&c, n, x, NULL, C + ki, 0, "topk");
                encode_case(&c, n, x, r, C + ki + 100, 0, "topk+residual");
                memcpy(rc, r, n * 4);
                CHECK(psagg__encode(&c, x, rc, n, (psagg__rng_key){3, 4}, enc, len, &bad) ==
                          PSAGG_OK,
                      "topk cpu encode: %s", psagg_last_error());
                topk_decodes(&c, n, enc, len, C + ki);
                cases += 3;
                free(x), free(r), free(enc), free(rc);
            }
    }
    /* bad inputs: the first bad element of the buffer, by status and index */
    for (int what = 0; what < 3; what++) {
        psagg_codec c = {.id = PSAGG_CODEC_TOPK,
                         .bits = 2,
                         .bucket = 1024,
                         .k = 20,
                         .rounding = PSAGG_ROUND_STOCHASTIC};
        const size_t n = 5000, at = 1024 * 2 + 17 + (size_t)what * 300;
        float *x = tc_xmalloc(n * 4), *d_x = dmalloc(n * 4);
        size_t len = psagg__encoded_size(&c, n), bad_c = 0, bad_g = 0;
        uint8_t *cpu = tc_xmalloc(len), *d_out = dmalloc(len);
        psagg_status a, b;
        tc_fill(x, n, TC_KIND_RANDOM, 5 + (uint64_t)what, 0);
        x[at] = what == 0 ? NAN : what == 1 ? -INFINITY : 0x1p126f;
        x[at + 900] = NAN; /* a later one: not the one named */
        CU(cudaMemcpy(d_x, x, n * 4, cudaMemcpyHostToDevice));
        a = psagg__encode(&c, x, NULL, n, (psagg__rng_key){1, 2}, cpu, len, &bad_c);
        b = psagg__cuda_encode_sync(&c, d_x, NULL, n, (psagg__rng_key){1, 2}, d_out, len, &bad_g,
                                    0);
        CHECK(a != PSAGG_OK && a == b && bad_c == at && bad_g == at,
              "topk bad input %d: CPU %d at %zu, GPU %d at %zu (want %zu)", what, a, bad_c, b,
              bad_g, at);
        cudaFree(d_x), cudaFree(d_out);
        free(x), free(cpu);
        cases++;
    }
    printf("topk, blocks 256..65536, k 1..C, 2-8 bits, ties, bad inputs: %d cases bit-identical\n",
           cases);
}

/* The GPU's error word after a thc call, as a status and index. */
static psagg_status thc_word(uint64_t *d_err, size_t *bad)
{
    uint64_t w = 0;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&w, d_err, 8, cudaMemcpyDeviceToHost));
    return psagg__cuda_err_status(w, bad);
}

/* One job of W workers on n elements in thc<bits>/<D>: two rounds of pushes, CPU against GPU
   (bytes and residuals), then the decode of round 1's fold as every op; returns the cases. */
static int thc_job(uint32_t bits, uint32_t D, size_t n, size_t W, int kind, uint64_t seed)
{
    psagg_codec c = {
        .id = PSAGG_CODEC_THC, .bits = bits, .bucket = D, .rounding = PSAGG_ROUND_STOCHASTIC};
    const size_t nb = psagg__thc_blocks(n, D), np = psagg__thc_rotated_len(n, D);
    const size_t plen = psagg__thc_push_bytes(bits, D, n),
                 ulen = psagg__thc_update_bytes(bits, D, n, W);
    const psagg__rng_key rot = {(uint32_t)seed * 77u, 12345u};
    float *x = tc_xmalloc(n * 4), *scales = tc_xmalloc(nb * 4), *r = tc_xmalloc(W * np * 4);
    float *rg = tc_xmalloc(np * 4), *yc = tc_xmalloc(n * 4), *yg = tc_xmalloc(n * 4);
    uint8_t *push = tc_xmalloc(W * plen), *got = tc_xmalloc(plen), *upd = tc_xmalloc(ulen);
    const uint8_t **ins = tc_xmalloc(W * sizeof *ins);
    float *d_x = dmalloc(n * 4), *d_r = dmalloc(np * 4), *d_s = dmalloc(nb * 4),
          *d_y = dmalloc(n * 4);
    uint8_t *d_p = dmalloc(plen), *d_u = dmalloc(ulen);
    uint64_t *d_err = dmalloc(8);
    int cases = 0;

    CHECK(psagg__codec_check(&c) == PSAGG_OK, "thc codec: %s", psagg_last_error());
    memset(scales, 0, nb * 4);
    tc_fill(r, W * np, TC_KIND_RANDOM, seed + 1, 0);
    for (int round = 0; round < 2; round++) {
        CU(cudaMemcpy(d_s, scales, nb * 4, cudaMemcpyHostToDevice));
        for (size_t w = 0; w < W; w++) {
            psagg__rng_key key = {(uint32_t)(seed + w), (uint32_t)round};
            size_t bad = 0;
            uint8_t *p = push + w * plen;
            tc_fill(x, n, kind, seed + 10 * w + (uint64_t)round, 20);
            CU(cudaMemcpy(d_x, x, n * 4, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(d_r, r + w * np, np * 4, cudaMemcpyHostToDevice));
            CHECK(psagg__thc_push_encode(bits, D, rot, scales, x, r + w * np, n, key, p, plen,
                                         &bad) == PSAGG_OK,
                  "thc cpu push: %s", psagg_last_error());
            CHECK(psagg__cuda_err_reset(d_err, 0) == PSAGG_OK &&
                      psagg__cuda_thc_push_encode(&c, rot, d_s, d_x, d_r, n, key, d_p, plen, d_err,
                                                  0) == PSAGG_OK &&
                      thc_word(d_err, &bad) == PSAGG_OK,
                  "thc%u/%u n=%zu: gpu push: %s", bits, D, n, psagg_last_error());
            CU(cudaMemcpy(got, d_p, plen, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(rg, d_r, np * 4, cudaMemcpyDeviceToHost));
            CHECK(tc_first_diff(p, got, plen) == (size_t)-1,
                  "thc%u/%u n=%zu %s round %d worker %zu: push byte %zu of %zu differs", bits, D, n,
                  tc_kind_name(kind), round, w, tc_first_diff(p, got, plen), plen);
            CHECK(tc_first_diff(r + w * np, rg, np * 4) == (size_t)-1,
                  "thc%u/%u n=%zu: residual byte %zu differs", bits, D, n,
                  tc_first_diff(r + w * np, rg, np * 4));
            ins[w] = p;
            cases++;
        }
        CHECK(psagg__thc_update_fold(bits, D, ins, W, plen, n, upd, ulen) == PSAGG_OK,
              "thc fold: %s", psagg_last_error());
        psagg__thc_update_next_scales(bits, D, upd, n, scales);
        if (nb > 2)
            scales[2] = 0; /* a block without a scale in round 1 */
    }
    CU(cudaMemcpy(d_u, upd, ulen, cudaMemcpyHostToDevice));
    for (int op = 0; op < 4; op++) {
        size_t bad = 0;
        float factor = op == PSAGG_DECODE_SCALE ? 1.0f / (float)W : 1.0f;
        tc_fill(yc, n, TC_KIND_RANDOM, seed + 3, 0);
        CU(cudaMemcpy(d_y, yc, n * 4, cudaMemcpyHostToDevice));
        CHECK(psagg__thc_update_decode(bits, D, rot, upd, ulen, n, factor, (psagg__decode_op)op, yc,
                                       NULL) == PSAGG_OK,
              "thc cpu decode: %s", psagg_last_error());
        CHECK(psagg__cuda_err_reset(d_err, 0) == PSAGG_OK &&
                  psagg__cuda_thc_update_decode(&c, rot, d_u, ulen, n, factor, (psagg__decode_op)op,
                                                d_y, d_err, 0) == PSAGG_OK &&
                  thc_word(d_err, &bad) == PSAGG_OK,
              "thc%u/%u n=%zu: gpu decode op %d: %s", bits, D, n, op, psagg_last_error());
        CU(cudaMemcpy(yg, d_y, n * 4, cudaMemcpyDeviceToHost));
        tc_same_floats("thc decode", op == 1 ? "ADD" : "out", yc, yg, n, "cpu ", "gpu ");
        cases++;
    }
    if (kind == TC_KIND_RANDOM) { /* a sum above its bound, then a block's meta */
        const uint32_t width = psagg__thc_sum_width(bits, W);
        const size_t e = (seed * 104729) % np;
        const size_t m = (seed * 31) % nb;
        size_t bad = 0;
        uint8_t *u2 = tc_xmalloc(ulen);
        memcpy(u2, upd, ulen);
        tc_thc_sum_max(bits, width, u2 + 12 * nb, e);
        CU(cudaMemcpy(d_u, u2, ulen, cudaMemcpyHostToDevice));
        CHECK(psagg__cuda_err_reset(d_err, 0) == PSAGG_OK &&
                  psagg__cuda_thc_update_decode(&c, rot, d_u, ulen, n, 1, PSAGG_DECODE_SET, d_y,
                                                d_err, 0) == PSAGG_OK &&
                  thc_word(d_err, &bad) == PSAGG_EBADMETA && bad == e,
              "thc: a sum above its bound at %zu: gpu %s at %zu", e, psagg_last_error(), bad);
        memcpy(u2 + 12 * m + 8, &(uint32_t){(uint32_t)W + 100000u}, 4); /* a count beyond W */
        CU(cudaMemcpy(d_u, u2, ulen, cudaMemcpyHostToDevice));
        CHECK(psagg__cuda_err_reset(d_err, 0) == PSAGG_OK &&
                  psagg__cuda_thc_update_decode(&c, rot, d_u, ulen, n, 1, PSAGG_DECODE_SET, d_y,
                                                d_err, 0) == PSAGG_OK &&
                  thc_word(d_err, &bad) == PSAGG_EBADMETA && bad == m,
              "thc: block %zu's count: gpu %s at %zu", m, psagg_last_error(), bad);
        free(u2);
        cases += 2;
    }
    cudaFree(d_x), cudaFree(d_r), cudaFree(d_s), cudaFree(d_y), cudaFree(d_p), cudaFree(d_u);
    cudaFree(d_err);
    free(x), free(scales), free(r), free(rg), free(yc), free(yg), free(push), free(got), free(upd);
    free(ins);
    return cases;
}

/* thc (kernels/thc.h) on the GPU against the CPU's scalar reference; bad inputs by status and
   index; the generic functions refuse it. */
static void thc(void)
{
    static const uint32_t Ds[] = {64, 1024, 8192, 16384, 65536};
    int cases = 0;
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (int kind = 0; kind < TC_KIND_COUNT; kind++) {
            const uint32_t D = Ds[di], bits = kind & 1 ? 2 : 4;
            const size_t n = D >= 16384 ? 2 * (size_t)D + 999 : 5 * (size_t)D + 37 + (size_t)kind;
            /* 3 workers: 4-bit sums (thc2), 8-bit (thc4); kind 2 (thc4, 18 workers) 16-bit ones */
            cases += thc_job(bits, D, n, kind == 2 ? 18 : 3, kind, D * 7 + (uint64_t)kind);
        }
    for (int what = 0; what < 3; what++) {
        psagg_codec c = {
            .id = PSAGG_CODEC_THC, .bits = 4, .bucket = 1024, .rounding = PSAGG_ROUND_STOCHASTIC};
        const size_t n = 5000, at = 2 * 1024 + 17 + (size_t)what * 300;
        const size_t nb = psagg__thc_blocks(n, 1024), np = psagg__thc_rotated_len(n, 1024);
        const size_t plen = psagg__thc_push_bytes(4, 1024, n);
        float *x = tc_xmalloc(n * 4), *sc = tc_xmalloc(nb * 4), *d_x = dmalloc(n * 4);
        float *d_s = dmalloc(nb * 4), *d_r = dmalloc(np * 4);
        uint8_t *cpu = tc_xmalloc(plen), *d_p = dmalloc(plen);
        uint64_t *d_err = dmalloc(8);
        size_t bad_c = 0, bad_g = 0;
        psagg_status a, b;
        tc_fill(x, n, TC_KIND_RANDOM, 5 + (uint64_t)what, 0);
        x[at] = what == 0 ? NAN : what == 1 ? -INFINITY : 0x1.000002p100f;
        x[at + 900] = NAN; /* a later one: not the one named */
        for (size_t m = 0; m < nb; m++)
            sc[m] = 0.5f;
        CU(cudaMemcpy(d_x, x, n * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d_s, sc, nb * 4, cudaMemcpyHostToDevice));
        CU(cudaMemset(d_r, 0, np * 4));
        a = psagg__thc_push_encode(4, 1024, (psagg__rng_key){1, 2}, sc, x, NULL, n,
                                   (psagg__rng_key){3, 4}, cpu, plen, &bad_c);
        CHECK(psagg__cuda_err_reset(d_err, 0) == PSAGG_OK &&
                  psagg__cuda_thc_push_encode(&c, (psagg__rng_key){1, 2}, d_s, d_x, d_r, n,
                                              (psagg__rng_key){3, 4}, d_p, plen, d_err,
                                              0) == PSAGG_OK,
              "thc bad input: launch: %s", psagg_last_error());
        b = thc_word(d_err, &bad_g);
        CHECK(a != PSAGG_OK && a == b && bad_c == at && bad_g == at,
              "thc bad input %d: CPU %d at %zu, GPU %d at %zu (want %zu)", what, a, bad_c, b, bad_g,
              at);
        if (what == 0) /* the generic encode is not thc's */
            CHECK(psagg__cuda_encode(&c, d_x, NULL, n, (psagg__rng_key){1, 2}, d_p, plen, d_err,
                                     0) == PSAGG_EINVAL,
                  "psagg__cuda_encode took thc");
        cudaFree(d_x), cudaFree(d_s), cudaFree(d_r), cudaFree(d_p), cudaFree(d_err);
        free(x), free(sc), free(cpu);
        cases++;
    }
    printf("thc, blocks 64..65536, 3 and 18 workers (4-, 8- and 16-bit sums), every decode op, bad "
           "inputs, corrupt sums and meta: %d cases bit-identical\n",
           cases);
}

static void aggregate_inputs(void)
{
    psagg_codec codecs[] = {tc_codec(PSAGG_CODEC_MAXMIN, 4, 512, PSAGG_ROUND_STOCHASTIC),
                            tc_codec(PSAGG_CODEC_FP16, 0, 0, PSAGG_ROUND_STOCHASTIC),
                            tc_codec(PSAGG_CODEC_MAXMIN, 2, 2048, PSAGG_ROUND_STOCHASTIC)};
    const size_t n = 5000;
    int cases = 0;
    for (size_t ci = 0; ci < sizeof codecs / sizeof codecs[0]; ci++) {
        psagg_codec *c = &codecs[ci];
        size_t len = psagg__encoded_size(c, n), bad = 0;
        for (size_t n_in = 9; n_in <= PSAGG_CUDA_MAX_INPUTS; n_in += n_in < 16 ? 1 : 8) {
            const void *hin[PSAGG_CUDA_MAX_INPUTS], *din[PSAGG_CUDA_MAX_INPUTS];
            uint8_t *cpu = tc_xmalloc(len), *gpu = tc_xmalloc(len), *d_out = dmalloc(len);
            float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4), *rg = tc_xmalloc(n * 4);
            float *d_r = dmalloc(n * 4);
            psagg__rng_key key = {(uint32_t)n_in, 7};
            psagg_status a, b;
            for (size_t i = 0; i < n_in; i++) {
                uint8_t *e = tc_xmalloc(len);
                tc_fill(x, n, TC_KIND_RANDOM, 1000 * ci + i, 0);
                psagg__encode(c, x, NULL, n, key, e, len, &bad);
                hin[i] = e;
                din[i] = dmalloc(len);
                CU(cudaMemcpy((void *)din[i], e, len, cudaMemcpyHostToDevice));
            }
            tc_fill(r, n, TC_KIND_RANDOM, 77 + n_in, -2);
            CU(cudaMemcpy(d_r, r, n * 4, cudaMemcpyHostToDevice));
            a = psagg__aggregate(c, hin, n_in, len, n, r, key, cpu, len, &bad);
            b = psagg__cuda_aggregate_sync(c, din, n_in, len, n, d_r, key, d_out, len, &bad, 0);
            CHECK(a == PSAGG_OK && b == PSAGG_OK, "aggregate %s N=%zu: %d / %d (%s)", tc_name(c),
                  n_in, a, b, psagg_last_error());
            CU(cudaMemcpy(gpu, d_out, len, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(rg, d_r, n * 4, cudaMemcpyDeviceToHost));
            CHECK(!memcmp(cpu, gpu, len) && !memcmp(r, rg, n * 4),
                  "aggregate %s N=%zu: bytes or residual differ", tc_name(c), n_in);
            for (size_t i = 0; i < n_in; i++) {
                free((void *)hin[i]);
                cudaFree((void *)din[i]);
            }
            free(cpu), free(gpu), free(x), free(r), free(rg);
            cudaFree(d_out);
            cudaFree(d_r);
            cases++;
        }
    }
    printf("aggregate with 9..64 inputs: %d cases\n", cases);
}

static void scale(void)
{
    const size_t n = 1000003;
    float *x = tc_xmalloc(n * 4), *want = tc_xmalloc(n * 4), *got = tc_xmalloc(n * 4);
    float *d = dmalloc(n * 4);
    const float f = 1.0f / 3.0f;
    tc_fill(x, n, TC_KIND_MIXED, 5, 0);
    for (size_t i = 0; i < n; i++)
        want[i] = x[i] * f;
    CU(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice));
    CHECK(psagg__cuda_scale(d, n, f, 0) == PSAGG_OK, "scale: %s", psagg_last_error());
    CU(cudaMemcpy(got, d, n * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(want, got, n * 4), "scale: differs at byte %zu", tc_first_diff(want, got, n * 4));
    printf("psagg__cuda_scale: %zu elements bit-identical\n", n);
    cudaFree(d);
    free(x), free(want), free(got);
}

static void huge(void)
{
    const size_t n = 300000000;
    size_t free_b = 0, total = 0;
    psagg_codec c = tc_codec(PSAGG_CODEC_MAXMIN, 4, 512, PSAGG_ROUND_STOCHASTIC);
    float *x, *r;
    CU(cudaMemGetInfo(&free_b, &total));
    if (free_b < 4 * n * 4) {
        printf("n = %zu: skipped, the device has %zu MB free (needs %zu)\n", n, free_b >> 20,
               (4 * n * 4) >> 20);
        return;
    }
    x = tc_xmalloc(n * 4);
    r = tc_xmalloc(n * 4);
    tc_fill(x, n, TC_KIND_RANDOM, 9, 0);
    tc_fill(r, n, TC_KIND_RANDOM, 10, -3);
    encode_case(&c, n, x, r, 12345, 0, "huge");
    printf("n = %zu: encode with residual and decode bit-identical\n", n);
    free(x), free(r);
}

typedef struct worker_arg {
    int id;
} worker_arg;

static void *thread_main(void *arg)
{
    worker_arg *w = arg;
    cudaStream_t s;
    psagg_codec c = tc_codec(PSAGG_CODEC_MAXMIN, 2 + w->id % 3, 256, PSAGG_ROUND_STOCHASTIC);
    const size_t n = 2000000;
    float *x = tc_xmalloc(n * 4), *r = tc_xmalloc(n * 4);
    CU(cudaSetDevice(0));
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    tc_fill(x, n, TC_KIND_RANDOM, 40 + (uint64_t)w->id, 0);
    tc_fill(r, n, TC_KIND_RANDOM, 80 + (uint64_t)w->id, -3);
    for (int rep = 0; rep < 3; rep++)
        encode_case(&c, n, x, r, 500 + (uint64_t)(w->id * 10 + rep), s, "threads");
    CU(cudaStreamDestroy(s));
    free(x), free(r);
    return NULL;
}

static void threads(void)
{
    pthread_t t[4];
    worker_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].id = i;
        pthread_create(&t[i], NULL, thread_main, &a[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    printf("4 threads on 4 streams: bit-identical\n");
}

/* A failed allocation leaves cudaErrorMemoryAllocation as the runtime's last error; psagg's
 * calls (launches included) must neither report it as theirs nor clear it. */
static void pending_error(void)
{
    psagg_codec c = tc_codec(PSAGG_CODEC_MAXMIN, 4, 512, PSAGG_ROUND_STOCHASTIC);
    const size_t n = 4096;
    size_t len = psagg__encoded_size(&c, n), bad = 0;
    float *d_x = dmalloc(n * 4);
    uint8_t *d_out = dmalloc(len);
    void *huge_p = NULL;
    psagg_status st;
    CU(cudaMemset(d_x, 0, n * 4));
    CHECK(cudaMalloc(&huge_p, (size_t)1 << 62) != cudaSuccess, "a 4 EiB allocation succeeded");
    st = psagg__cuda_encode_sync(&c, d_x, NULL, n, (psagg__rng_key){1, 2}, d_out, len, &bad, 0);
    CHECK(st == PSAGG_OK, "encode with the caller's error pending: %s", psagg_last_error());
    st = psagg__cuda_scale(d_x, n, 2.0f, 0);
    CHECK(st == PSAGG_OK, "scale with the caller's error pending: %s", psagg_last_error());
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation,
          "the caller's pending error was taken by psagg's calls");
    cudaFree(d_x);
    cudaFree(d_out);
    printf("an error the caller left pending stays the caller's\n");
}

int main(void)
{
    int ndev = psagg__cuda_device_count();
    if (ndev == 0)
        return gpu_absent_exit("gpu.more", "psagg__cuda_device_count() == 0");
    setvbuf(stdout, NULL, _IOLBF, 0); /* what passed stays in the log if a case crashes */
    tc_set_isa(PSAGG_ISA_SCALAR);
    /* the case provokes a failed cudaMalloc, which compute-sanitizer counts as an error */
    if (getenv("PSAGG_GPU_SANITIZER"))
        printf("pending error: not run under compute-sanitizer (it provokes an API error)\n");
    else
        pending_error();
    buckets();
    topk();
    thc();
    aggregate_inputs();
    scale();
    threads();
    huge();
    printf("OK\n");
    return 0;
}
