/*
 * test_cuda_codec.c - every CUDA codec kernel against the CPU scalar reference, byte for byte:
 * encoded bytes (padding included), residuals, decode, decode_add, the fused aggregate
 * (N = 1..8, device and host-memory entry points), and the status + index of non-finite,
 * out-of-range and bad-meta inputs. Same adversarial data as tests/unit/test_codec_simd.c
 * (tests/unit/test_codec_util.h), fixed seeds. Exits 77 (skipped) without a CUDA device.
 */
#include <cuda_runtime_api.h>

#include "../unit/test_codec_util.h"
#include "gpu_skip.h"
#include "kernels/cuda/codec_cuda.h"

#define MAXN 8192 /* largest n used below (plus slack for the misaligned views) */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                         \
    } while (0)

static cudaStream_t stream;
/* device arenas, each MAXN floats + 64 bytes so a view can start 4 or 8 bytes in */
static uint8_t *d_x, *d_r, *d_out, *d_dec, *d_acc, *d_in[8];
static long n_compared;

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CU(cudaMalloc(&p, bytes));
    return p;
}

static void h2d(void *d, const void *h, size_t len)
{
    if (len)
        CU(cudaMemcpy(d, h, len, cudaMemcpyHostToDevice));
}

static void d2h(void *h, const void *d, size_t len)
{
    if (len)
        CU(cudaMemcpy(h, d, len, cudaMemcpyDeviceToHost));
}

typedef struct result {
    psagg_status st;
    size_t bad;
    uint8_t *enc;
    float *res, *dec, *dadd;
} result;

static void result_alloc(result *o, size_t len, size_t n)
{
    o->enc = tc_xmalloc(len);
    o->res = tc_xmalloc(n * 4);
    o->dec = tc_xmalloc(n * 4);
    o->dadd = tc_xmalloc(n * 4);
    o->bad = (size_t)-1;
}

static void result_free(result *r)
{
    free(r->enc);
    free(r->res);
    free(r->dec);
    free(r->dadd);
}

/* CPU reference: encode (+EF), decode, decode_add. */
static void run_cpu(const psagg_codec *c, const float *x, const float *r0, size_t n,
                    psagg__rng_key key, const float *acc0, result *o)
{
    size_t len = psagg__encoded_size(c, n);
    result_alloc(o, len, n);
    memset(o->enc, 0xA5, len);
    if (r0)
        memcpy(o->res, r0, n * 4);
    memset(o->dec, 0x7F, n * 4);
    memcpy(o->dadd, acc0, n * 4);
    o->st = psagg__encode(c, x, r0 ? o->res : NULL, n, key, o->enc, len, &o->bad);
    if (o->st != PSAGG_OK)
        return;
    CHECK(psagg__decode(c, o->enc, len, n, o->dec) == PSAGG_OK, "cpu decode: %s",
          psagg_last_error());
    CHECK(psagg__decode_add(c, o->enc, len, n, o->dadd) == PSAGG_OK, "cpu decode_add: %s",
          psagg_last_error());
}

/* GPU: the same through the *_sync wrappers. mis = 1 puts every buffer off 16-byte alignment
 * (floats 4 bytes in, encoded buffers 8 bytes in) to cover the non-vector paths. */
static void run_gpu(const psagg_codec *c, const float *x, const float *r0, size_t n,
                    psagg__rng_key key, const float *acc0, int mis, result *o)
{
    size_t len = psagg__encoded_size(c, n), bad = (size_t)-1;
    float *x_ = (float *)(d_x + 4 * mis), *r_ = (float *)(d_r + 4 * mis);
    float *dec_ = (float *)(d_dec + 4 * mis), *acc_ = (float *)(d_acc + 4 * mis);
    uint8_t *out_ = d_out + 8 * mis;
    psagg_status st;

    CHECK(psagg__cuda_encoded_size(c, n) == len, "%s n=%zu: cuda size %zu vs cpu %zu", tc_name(c),
          n, psagg__cuda_encoded_size(c, n), len);
    result_alloc(o, len, n);
    h2d(x_, x, n * 4);
    if (r0)
        h2d(r_, r0, n * 4);
    CU(cudaMemset(out_, 0x5A, len ? len : 1));
    CU(cudaMemset(dec_, 0x7E, n ? n * 4 : 1));
    h2d(acc_, acc0, n * 4);
    o->st = psagg__cuda_encode_sync(c, x_, r0 ? r_ : NULL, n, key, out_, len, &o->bad, stream);
    CHECK(o->st != PSAGG_ECUDA && o->st != PSAGG_EUNSUPPORTED && o->st != PSAGG_EINVAL,
          "cuda encode: %s", psagg_last_error());
    if (o->st != PSAGG_OK)
        return;
    d2h(o->enc, out_, len);
    if (r0)
        d2h(o->res, r_, n * 4);
    st = psagg__cuda_decode_sync(c, out_, len, n, dec_, &bad, stream);
    CHECK(st == PSAGG_OK, "cuda decode: %d %s", st, psagg_last_error());
    st = psagg__cuda_decode_add_sync(c, out_, len, n, acc_, &bad, stream);
    CHECK(st == PSAGG_OK, "cuda decode_add: %d %s", st, psagg_last_error());
    d2h(o->dec, dec_, n * 4);
    d2h(o->dadd, acc_, n * 4);
}

static void compare(const char *ctx, const psagg_codec *c, size_t n, int with_res,
                    const result *ref, const result *got)
{
    size_t len = psagg__encoded_size(c, n), d;
    CHECK(ref->st == got->st, "%s: status cpu %d vs gpu %d", ctx, ref->st, got->st);
    if (ref->st != PSAGG_OK) {
        CHECK(ref->bad == got->bad, "%s: bad index cpu %zu vs gpu %zu", ctx, ref->bad, got->bad);
        return;
    }
    d = tc_first_diff(ref->enc, got->enc, len);
    CHECK(d == (size_t)-1, "%s: encoded byte %zu of %zu: cpu %02x vs gpu %02x", ctx, d, len,
          ref->enc[d], got->enc[d]);
    if (with_res)
        tc_same_floats(ctx, "residual", ref->res, got->res, n, "cpu ", "gpu ");
    tc_same_floats(ctx, "decoded", ref->dec, got->dec, n, "cpu ", "gpu ");
    tc_same_floats(ctx, "decode_add", ref->dadd, got->dadd, n, "cpu ", "gpu ");
}

/*
 * inject: 0 none; 1 NaN, 2 +Inf, 3 -Inf, 4 just out of range for the codec (2^126 for maxmin,
 * 65520 for fp16, FLT_MAX for bf16, Inf for fp32), 5 two bad values (range first, NaN later).
 */
static void check_encode(const psagg_codec *c, size_t n, int kind, int with_res, uint64_t seed,
                         int inject)
{
    float *x = tc_xmalloc(n * 4), *r0 = tc_xmalloc(n * 4), *acc0 = tc_xmalloc(n * 4);
    psagg__rng_key key = psagg__rng_key_make(seed, 7);
    result ref, got;
    char ctx[256];

    tc_fill_inputs(c, n, kind, seed, x, r0, acc0);
    if (inject && n > 0) {
        size_t at = (size_t)(seed % n), at2 = at + (n - at) / 2;
        float big = c->id == PSAGG_CODEC_MAXMIN ? 0x1p126f
                    : c->id == PSAGG_CODEC_FP16 ? 65520.0f
                    : c->id == PSAGG_CODEC_BF16 ? 0x1.fffffep127f
                                                : INFINITY;
        float v = inject == 1 ? NAN : inject == 2 ? INFINITY : inject == 3 ? -INFINITY : -big;
        x[at] = v;
        if (with_res)
            r0[at] = 0.0f;
        if (inject == 5 && at2 != at) {
            x[at2] = NAN;
            if (at2 > 0)
                x[at2 - 1] = big; /* maybe before at2, after at */
        }
    }
    run_cpu(c, x, with_res ? r0 : NULL, n, key, acc0, &ref);
    run_gpu(c, x, with_res ? r0 : NULL, n, key, acc0, (int)(seed & 1), &got);
    snprintf(ctx, sizeof ctx, "encode codec %s, n=%zu, data %s, residual %d, inject %d", tc_name(c),
             n, tc_kind_name(kind), with_res, inject);
    if (inject && n > 0)
        CHECK(ref.st != PSAGG_OK, "%s: cpu accepted the injected value", ctx);
    compare(ctx, c, n, with_res, &ref, &got);
    n_compared++;
    result_free(&ref);
    result_free(&got);
    free(x);
    free(r0);
    free(acc0);
}

/* corrupt: 0 none; 1 bad meta / NaN element in input `bad_at`. */
static void check_aggregate(const psagg_codec *c, size_t n, size_t n_in, int kind, int with_res,
                            uint64_t seed, int corrupt, psagg__cuda_ctx *ctx_host)
{
    size_t len = psagg__encoded_size(c, n), bad_at = (size_t)(seed % (n_in ? n_in : 1));
    uint8_t *bufs[8], *out_ref = tc_xmalloc(len), *out_got = tc_xmalloc(len),
                      *out_host = tc_xmalloc(len);
    const void *in[8], *din[8];
    float *x = tc_xmalloc(n * 4), *r_ref = tc_xmalloc(n * 4), *r_got = tc_xmalloc(n * 4),
          *r_host = tc_xmalloc(n * 4);
    psagg__rng_key key = psagg__rng_key_make(seed, 3);
    size_t bad_ref = (size_t)-1, bad_got = (size_t)-1, bad_host = (size_t)-1;
    psagg_status st_ref, st_got, st_host;
    int mis = (int)((seed >> 1) & 1);
    float *dres = (float *)(d_r + 4 * mis);
    uint8_t *dout = d_out + 8 * mis;
    char ctx[256];

    for (size_t i = 0; i < n_in; i++) {
        int k = (int)((kind + i) % TC_KIND_COUNT);
        int me = tc_max_exp(c) - 4; /* headroom for the sum */
        bufs[i] = tc_xmalloc(len);
        tc_fill(x, n, k, seed * 31 + i, me);
        CHECK(psagg__encode(c, x, NULL, n, psagg__rng_key_make(seed, i), bufs[i], len, NULL) ==
                  PSAGG_OK,
              "encode input: %s", psagg_last_error());
        in[i] = bufs[i];
    }
    if (corrupt && n > 0 && n_in > 0) {
        uint8_t *b = bufs[bad_at];
        if (c->id == PSAGG_CODEC_MAXMIN) {
            size_t nb = (n + c->bucket - 1) / c->bucket, m = (size_t)(seed / 7 % nb);
            float v;
            switch (seed % 5) {
            case 0:
                v = -1.0f;
                memcpy(b + 8 * m, &v, 4);
                break; /* negative scale */
            case 1:
                v = -0.0f;
                memcpy(b + 8 * m, &v, 4);
                break; /* -0 scale */
            case 2:
                v = NAN;
                memcpy(b + 8 * m, &v, 4);
                break; /* NaN scale */
            case 3:
                v = INFINITY;
                memcpy(b + 8 * m + 4, &v, 4);
                break; /* Inf lo */
            default:   /* lo + scale * L overflows */
                v = 0x1p127f;
                memcpy(b + 8 * m, &v, 4);
                v = 0x1.fffffep127f;
                memcpy(b + 8 * m + 4, &v, 4);
                break;
            }
        } else {
            size_t k = (size_t)(seed / 3 % n);
            if (c->id == PSAGG_CODEC_FP32) {
                float v = (seed & 1) ? NAN : -INFINITY;
                memcpy(b + 4 * k, &v, 4);
            } else {
                uint16_t h = c->id == PSAGG_CODEC_FP16 ? 0x7C00 : 0xFF81; /* +Inf / NaN */
                memcpy(b + 2 * k, &h, 2);
            }
        }
    }
    tc_fill(r_ref, n, TC_KIND_RANDOM, seed + 1, 0);
    memcpy(r_got, r_ref, n * 4);
    memcpy(r_host, r_ref, n * 4);
    memset(out_ref, 0xA5, len);
    st_ref =
        psagg__aggregate(c, in, n_in, len, n, with_res ? r_ref : NULL, key, out_ref, len, &bad_ref);

    for (size_t i = 0; i < n_in; i++) {
        din[i] = d_in[i] + 8 * mis;
        h2d((void *)din[i], bufs[i], len);
    }
    h2d(dres, r_got, n * 4);
    CU(cudaMemset(dout, 0x5A, len ? len : 1));
    st_got = psagg__cuda_aggregate_sync(c, din, n_in, len, n, with_res ? dres : NULL, key, dout,
                                        len, &bad_got, stream);
    CHECK(st_got != PSAGG_ECUDA && st_got != PSAGG_EINVAL, "cuda aggregate: %s",
          psagg_last_error());
    d2h(out_got, dout, len);
    d2h(r_got, dres, n * 4);

    snprintf(ctx, sizeof ctx, "aggregate codec %s, n=%zu, N=%zu, data %s, residual %d, corrupt %d",
             tc_name(c), n, n_in, tc_kind_name(kind), with_res, corrupt);
    if (corrupt && n > 0 && n_in > 0)
        CHECK(st_ref != PSAGG_OK, "%s: cpu accepted the corrupted input", ctx);
    CHECK(st_ref == st_got, "%s: status cpu %d vs gpu %d (%s)", ctx, st_ref, st_got,
          psagg_last_error());
    if (st_ref == PSAGG_OK) {
        size_t d = tc_first_diff(out_ref, out_got, len);
        CHECK(d == (size_t)-1, "%s: byte %zu of %zu: cpu %02x vs gpu %02x", ctx, d, len, out_ref[d],
              out_got[d]);
        d = tc_first_diff(r_ref, r_got, n * 4) / 4;
        CHECK(!with_res || d == (size_t)-1 / 4, "%s: residual[%zu] cpu %a vs gpu %a", ctx, d,
              r_ref[d], r_got[d]);
    } else {
        CHECK(bad_ref == bad_got, "%s: bad index cpu %zu vs gpu %zu", ctx, bad_ref, bad_got);
    }
    if (ctx_host) { /* the server's host-memory entry point */
        memset(out_host, 0x33, len);
        st_host = psagg__cuda_aggregate_host(
            ctx_host, c, in, n_in, len, n, with_res ? r_host : NULL, key, out_host, len, &bad_host);
        CHECK(st_ref == st_host, "%s (host ctx): status cpu %d vs gpu %d (%s)", ctx, st_ref,
              st_host, psagg_last_error());
        if (st_ref == PSAGG_OK) {
            size_t d = tc_first_diff(out_ref, out_host, len);
            CHECK(d == (size_t)-1, "%s (host ctx): byte %zu differs", ctx, d);
            d = tc_first_diff(r_ref, r_host, n * 4);
            CHECK(!with_res || d == (size_t)-1, "%s (host ctx): residual byte %zu differs", ctx, d);
        } else {
            CHECK(bad_ref == bad_host, "%s (host ctx): bad index cpu %zu vs gpu %zu", ctx, bad_ref,
                  bad_host);
        }
    }
    n_compared++;
    for (size_t i = 0; i < n_in; i++)
        free(bufs[i]);
    free(out_ref);
    free(out_got);
    free(out_host);
    free(x);
    free(r_ref);
    free(r_got);
    free(r_host);
}

/* decode / decode_add of a corrupted buffer: same status as the CPU (no index on the CPU). */
static void check_decode_invalid(const psagg_codec *c, size_t n, uint64_t seed)
{
    size_t len = psagg__encoded_size(c, n), bad = 0;
    uint8_t *b = tc_xmalloc(len);
    float *x = tc_xmalloc(n * 4), *y = tc_xmalloc(n * 4);
    psagg_status st_ref, st_got, st_got2;

    tc_fill(x, n, TC_KIND_RANDOM, seed, 0);
    CHECK(psagg__encode(c, x, NULL, n, psagg__rng_key_make(seed, 1), b, len, NULL) == PSAGG_OK,
          "encode: %s", psagg_last_error());
    if (c->id == PSAGG_CODEC_MAXMIN) {
        float v = (seed & 1) ? -0.0f : NAN;
        memcpy(b + 8 * ((n - 1) / c->bucket), &v, 4);
    } else if (c->id == PSAGG_CODEC_FP32) {
        float v = INFINITY;
        memcpy(b + 4 * (n - 1), &v, 4);
    } else {
        uint16_t h = c->id == PSAGG_CODEC_FP16 ? 0xFC00 : 0x7FC0;
        memcpy(b + 2 * (n - 1), &h, 2);
    }
    st_ref = psagg__decode(c, b, len, n, y);
    h2d(d_out, b, len);
    st_got = psagg__cuda_decode_sync(c, d_out, len, n, (float *)d_dec, &bad, stream);
    st_got2 = psagg__cuda_decode_add_sync(c, d_out, len, n, (float *)d_acc, &bad, stream);
    CHECK(st_ref != PSAGG_OK && st_ref == st_got && st_ref == st_got2,
          "decode invalid %s n=%zu: cpu %d, gpu decode %d, decode_add %d", tc_name(c), n, st_ref,
          st_got, st_got2);
    n_compared++;
    free(b);
    free(x);
    free(y);
}

int main(void)
{
    psagg_codec codecs[64], mc[64];
    const uint32_t b64[] = {64}, b1024[] = {1024}, b192[] = {192};
    static const size_t ns[] = {0,    1,    15,   16,   17,   63,   64,   65,   1000,
                                1023, 1024, 1025, 2047, 2048, 3000, 3079, 5000, 8191};
    size_t nc64, nmc;
    int ndev = psagg__cuda_device_count();
    psagg__cuda_ctx *hctx = NULL;
    struct cudaDeviceProp prop;

    if (ndev == 0)
        return gpu_absent_exit("gpu.codec", "psagg__cuda_device_count() == 0");
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    tc_set_isa(PSAGG_ISA_SCALAR); /* the reference */
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    d_x = dev_alloc(MAXN * 4 + 64);
    d_r = dev_alloc(MAXN * 4 + 64);
    d_out = dev_alloc(MAXN * 4 + 64);
    d_dec = dev_alloc(MAXN * 4 + 64);
    d_acc = dev_alloc(MAXN * 4 + 64);
    for (int i = 0; i < 8; i++)
        d_in[i] = dev_alloc(MAXN * 4 + 64);
    CHECK(psagg__cuda_ctx_create(0, &hctx) == PSAGG_OK, "ctx: %s", psagg_last_error());

    nc64 = tc_codecs(codecs, b64, 1);
    nmc = tc_codecs(mc, b1024, 1);
    nmc += tc_codecs(mc + nmc, b192, 1);

    /* B = 64 and the fp codecs: every size 0..3B+7, every data kind, +-residual */
    for (size_t ci = 0; ci < nc64; ci++)
        for (size_t n = 0; n <= 3 * 64 + 7; n++)
            for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                check_encode(&codecs[ci], n, kind, (int)((n + kind) & 1),
                             1000 * n + (uint64_t)kind + ci, 0);
    for (size_t ci = 0; ci < nc64; ci++)
        for (int kind = 0; kind < TC_KIND_COUNT; kind++)
            for (int wr = 0; wr < 2; wr++)
                for (size_t si = 0; si < 8; si++)
                    check_encode(&codecs[ci], ns[si], kind, wr, 77 + si + (uint64_t)wr, 0);
    printf("encode/decode/decode_add, B=64 + fp: %ld cases bit-identical\n", n_compared);

    /* B = 1024 and 192 (maxmin only): sampled sizes up to 8191 */
    for (size_t ci = 0; ci < nmc; ci++) {
        if (mc[ci].id != PSAGG_CODEC_MAXMIN)
            continue;
        for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++)
            for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                for (int wr = 0; wr < 2; wr++)
                    check_encode(&mc[ci], ns[si], kind, wr, ns[si] * 13 + (uint64_t)kind + wr, 0);
    }
    printf("encode/decode/decode_add, B=1024/192: %ld cases total\n", n_compared);

    /* non-finite and out-of-range inputs: status and first bad index */
    for (size_t ci = 0; ci < nc64; ci++)
        for (int inject = 1; inject <= 5; inject++)
            for (size_t si = 1; si < sizeof ns / sizeof ns[0]; si++)
                for (int wr = 0; wr < 2; wr++)
                    check_encode(&codecs[ci], ns[si], TC_KIND_RANDOM, wr,
                                 ns[si] * 3 + (uint64_t)inject * 11 + (uint64_t)wr, inject);
    for (size_t ci = 0; ci < nmc; ci += 5)
        for (int inject = 1; inject <= 5; inject++)
            check_encode(&mc[ci], 5000, TC_KIND_MIXED, inject & 1, 4242 + (uint64_t)inject, inject);
    for (size_t ci = 0; ci < nc64; ci++)
        for (size_t si = 1; si < sizeof ns / sizeof ns[0]; si += 3)
            check_decode_invalid(&codecs[ci], ns[si], ns[si] + ci);
    printf("error detection: %ld cases total\n", n_compared);

    /* aggregate, N = 0..8 (device pointers; every 4th case also through the host ctx) */
    for (size_t ci = 0; ci < nc64; ci++)
        for (size_t n_in = 0; n_in <= 8; n_in++)
            for (size_t n = 0; n <= 3 * 64 + 7; n += 1 + (n_in + n) % 13)
                check_aggregate(&codecs[ci], n, n_in, (int)((n + n_in) % TC_KIND_COUNT),
                                (int)(n & 1), n * 8 + n_in, 0, (n % 4 == 0) ? hctx : NULL);
    for (size_t ci = 0; ci < nmc; ci++) {
        if (mc[ci].id != PSAGG_CODEC_MAXMIN)
            continue;
        for (size_t n_in = 1; n_in <= 8; n_in++)
            for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si += 2)
                for (int wr = 0; wr < 2; wr++)
                    check_aggregate(&mc[ci], ns[si], n_in, (int)((si + n_in) % TC_KIND_COUNT), wr,
                                    ns[si] + n_in, 0, (si % 4 == 0) ? hctx : NULL);
    }
    /* invalid inputs: status and the input's position */
    for (size_t ci = 0; ci < nc64; ci++)
        for (size_t n_in = 1; n_in <= 8; n_in++)
            for (size_t si = 1; si < 10; si++)
                check_aggregate(&codecs[ci], ns[si], n_in, TC_KIND_RANDOM, (int)(si & 1),
                                ns[si] * 5 + n_in + ci, 1, (si % 3 == 0) ? hctx : NULL);
    printf("aggregate: %ld cases total\n", n_compared);

    psagg__cuda_ctx_destroy(hctx);
    CU(cudaStreamDestroy(stream));
    cudaFree(d_x);
    cudaFree(d_r);
    cudaFree(d_out);
    cudaFree(d_dec);
    cudaFree(d_acc);
    for (int i = 0; i < 8; i++)
        cudaFree(d_in[i]);
    printf("OK: %ld comparisons with the CPU scalar reference, all bit-identical\n", n_compared);
    return 0;
}
