/*
 * test_cuda_math.c - the CUDA kernels' per-element arithmetic (kernels/cuda/codec_cuda_math.h,
 * compiled here as plain C) against the CPU scalar reference. Needs no GPU, so it runs
 * everywhere: the GPU test (test_cuda_codec.c) then only has to catch indexing, packing and
 * reduction mistakes of the kernels themselves.
 *
 *  - fp32 -> fp16: every 3rd float with |x| < 65520, both signs (--full: every one), plus
 *    the error codes above it;
 *  - fp32 -> bf16: every 13th bit pattern of the finite range (--full: every one);
 *  - fp16 / bf16 -> fp32: every finite 16-bit pattern;
 *  - maxmin: a host emulation of the kernels' bucket algorithm built only from the pcm_*
 *    functions (range checks, -0 < +0 minimum, scale/inv, levels with the counter RNG,
 *    LSB-first groups of 8, residual) against psagg__encode / psagg__decode on the adversarial
 *    data of the CPU tests, B = 64/192/1024, b = 1..8, both roundings, +-residual;
 *  - thc: the kernels' phases (load, butterfly stages, rotated, pack; unplane, stages, store)
 *    built only from the pcm_thc_* functions, against psagg__thc_push_encode and
 *    psagg__thc_update_decode: 3 workers' pushes at scale 0 and at the scales their update set
 *    (block 1 at 0), residuals, every decode op, a bad input and a sum above its bound at the
 *    same element; b = 2, 4, D = 64..16384, n = 1..20000.
 */
#include "../unit/test_codec_util.h"
#include "kernels/cuda/codec_cuda_math.h"
#include "kernels/thc.h"

#define BATCH (1u << 20)

/* the residual is -0 so that v = x + r = x exactly (+0 would turn -0 into +0) */
static void check_fp16_encode(uint32_t step)
{
    float *x = tc_xmalloc(BATCH * 4), *r = tc_xmalloc(BATCH * 4);
    uint16_t *h = tc_xmalloc(BATCH * 2);
    psagg_codec c = tc_codec(PSAGG_CODEC_FP16, 0, 0, PSAGG_ROUND_NEAREST);
    uint64_t count = 0;
    const uint32_t limit = 0x477FF000u; /* 65520 */

    for (uint32_t sign = 0; sign < 2; sign++) {
        for (uint64_t a = 0; a < limit;) {
            uint32_t m = 0;
            for (; m < BATCH && a < limit; m++, a += step) {
                x[m] = tc_u2f((sign << 31) | (uint32_t)a);
                r[m] = -0.0f;
            }
            CHECK(psagg__encode(&c, x, r, m, psagg__rng_key_make(1, 1), h, 2 * (size_t)m, NULL) ==
                      PSAGG_OK,
                  "cpu fp16 encode: %s", psagg_last_error());
            for (uint32_t i = 0; i < m; i++) {
                uint32_t err, err2;
                uint16_t g = pcm_f32_to_f16(x[i], &err);
                float y = pcm_f16_to_f32(g, &err2);
                float rr = PCM_SUB(x[i], y);
                CHECK(err == 0 && err2 == 0 && g == h[i], "fp16(%a): cpu %04x vs cuda %04x err %u",
                      x[i], h[i], g, err);
                CHECK(tc_f2u(rr) == tc_f2u(r[i]), "fp16(%a) residual: cpu %a vs cuda %a", x[i],
                      r[i], rr);
            }
            count += m;
        }
    }
    /* above the limit: ERANGE up to Inf, then NaN/Inf */
    for (uint64_t a = limit; a <= 0x7FFFFFFFu; a += 997) {
        uint32_t err;
        size_t bad = 99;
        float v = tc_u2f((uint32_t)a);
        psagg_status st = psagg__encode(&c, &v, NULL, 1, psagg__rng_key_make(1, 1), h, 2, &bad);
        (void)pcm_f32_to_f16(v, &err);
        CHECK((st == PSAGG_ERANGE && err == PCM_ERR_RANGE) ||
                  (st == PSAGG_ENONFINITE && err == PCM_ERR_NONFINITE),
              "fp16(%a): cpu status %d, cuda err %u", v, st, err);
    }
    printf("fp16 encode: %llu values bit-identical (+ error codes)\n", (unsigned long long)count);
    free(x);
    free(r);
    free(h);
}

static void check_bf16_encode(uint32_t step)
{
    float *x = tc_xmalloc(BATCH * 4), *r = tc_xmalloc(BATCH * 4);
    uint16_t *h = tc_xmalloc(BATCH * 2);
    psagg_codec c = tc_codec(PSAGG_CODEC_BF16, 0, 0, PSAGG_ROUND_NEAREST);
    uint64_t count = 0, a = 0;
    const uint64_t limit = 0x7F7F8000u; /* from here on, rounds to Inf */

    while (a < 2 * limit) {
        uint32_t m = 0;
        for (; m < BATCH && a < 2 * limit; m++, a += step) {
            uint32_t bits = a < limit ? (uint32_t)a : (0x80000000u | (uint32_t)(a - limit));
            x[m] = tc_u2f(bits);
            r[m] = -0.0f;
        }
        CHECK(psagg__encode(&c, x, r, m, psagg__rng_key_make(1, 1), h, 2 * (size_t)m, NULL) ==
                  PSAGG_OK,
              "cpu bf16 encode: %s", psagg_last_error());
        for (uint32_t i = 0; i < m; i++) {
            uint32_t err, err2;
            uint16_t g = pcm_f32_to_bf16(x[i], &err);
            float rr = PCM_SUB(x[i], pcm_bf16_to_f32(g, &err2));
            CHECK(err == 0 && err2 == 0 && g == h[i], "bf16(%a): cpu %04x vs cuda %04x", x[i], h[i],
                  g);
            CHECK(tc_f2u(rr) == tc_f2u(r[i]), "bf16(%a) residual: cpu %a vs cuda %a", x[i], r[i],
                  rr);
        }
        count += m;
    }
    for (uint64_t b = limit; b <= 0x7FFFFFFFu; b += 101) {
        uint32_t err;
        float v = tc_u2f((uint32_t)b);
        size_t bad;
        psagg_status st = psagg__encode(&c, &v, NULL, 1, psagg__rng_key_make(1, 1), h, 2, &bad);
        (void)pcm_f32_to_bf16(v, &err);
        CHECK((st == PSAGG_ERANGE && err == PCM_ERR_RANGE) ||
                  (st == PSAGG_ENONFINITE && err == PCM_ERR_NONFINITE),
              "bf16(%a): cpu status %d, cuda err %u", v, st, err);
    }
    printf("bf16 encode: %llu values bit-identical (+ error codes)\n", (unsigned long long)count);
    free(x);
    free(r);
    free(h);
}

static void check_16_decode(psagg_codec_id id)
{
    psagg_codec c = tc_codec(id, 0, 0, PSAGG_ROUND_NEAREST);
    uint16_t one;
    float y;
    int n = 0;
    for (uint32_t v = 0; v < 65536; v++) {
        uint32_t err;
        float g;
        one = (uint16_t)v;
        g = id == PSAGG_CODEC_FP16 ? pcm_f16_to_f32(one, &err) : pcm_bf16_to_f32(one, &err);
        if (psagg__decode(&c, &one, 2, 1, &y) != PSAGG_OK) {
            CHECK(err == PCM_ERR_NONFINITE, "%s %04x: cpu rejects, cuda accepts", tc_name(&c), v);
            continue;
        }
        CHECK(err == 0 && tc_f2u(g) == tc_f2u(y), "%s decode %04x: cpu %a vs cuda %a", tc_name(&c),
              v, y, g);
        n++;
    }
    printf("%s decode: %d finite patterns bit-identical\n", tc_name(&c), n);
}

/* ---- maxmin: the kernels' algorithm, sequentially, from the pcm_* pieces ---- */

static psagg_status emul_mm_encode(const psagg_codec *c, const float *x, float *res, size_t n,
                                   psagg__rng_key key, uint8_t *out, size_t *bad)
{
    const uint32_t B = c->bucket, b = c->bits, L = (1u << b) - 1;
    const size_t nb = (n + B - 1) / B, payload_len = 8 * ((n * b + 63) / 64);
    uint8_t *payload = out + 8 * nb;
    float *v = tc_xmalloc(B * 4);
    size_t first_bad = (size_t)-1;
    uint32_t bad_code = 0;

    for (size_t m = 0; m < nb; m++) {
        size_t b0 = m * B, bend = b0 + B < n ? b0 + B : n;
        float lo = INFINITY, hi = -INFINITY, scale, inv;
        for (size_t k = b0; k < bend; k++) {
            v[k - b0] = res ? PCM_ADD(x[k], res[k]) : x[k];
            uint32_t code = pcm_maxmin_check(v[k - b0]);
            if (code && k < first_bad) {
                first_bad = k;
                bad_code = code;
            }
            lo = pcm_min(lo, v[k - b0]);
            hi = pcm_max(hi, v[k - b0]);
        }
        pcm_mm_params(lo, hi, L, &scale, &inv);
        memcpy(out + 8 * m, &scale, 4);
        memcpy(out + 8 * m + 4, &lo, 4);
        for (size_t e = b0; e < bend; e += 8) { /* groups of 8 -> b bytes */
            uint64_t w = 0;
            size_t cnt = bend - e < 8 ? bend - e : 8, nbytes = (cnt * b + 7) / 8;
            for (size_t j = 0; j < cnt; j++) {
                size_t k = e + j;
                float u = c->rounding == PSAGG_ROUND_STOCHASTIC
                              ? psagg__rng_u(psagg__rng_hash32(key.k0, key.k1, (uint32_t)k >> 1),
                                             (uint32_t)k)
                              : 0.5f;
                uint32_t q = pcm_mm_level(v[k - b0], lo, scale, inv, PCM_U2F(L), u) & L;
                w |= (uint64_t)q << (j * b);
                if (res)
                    res[k] = PCM_SUB(v[k - b0], pcm_mm_value(lo, scale, q));
            }
            for (size_t i = 0; i < nbytes; i++)
                payload[(e / 8) * b + i] = (uint8_t)(w >> (8 * i));
        }
    }
    for (size_t i = (n * b + 7) / 8; i < payload_len; i++)
        payload[i] = 0;
    free(v);
    if (first_bad != (size_t)-1) {
        *bad = first_bad;
        return bad_code == PCM_ERR_NONFINITE ? PSAGG_ENONFINITE : PSAGG_ERANGE;
    }
    return PSAGG_OK;
}

static void emul_mm_decode(const psagg_codec *c, const uint8_t *in, size_t n, float *y)
{
    const uint32_t B = c->bucket, b = c->bits, L = (1u << b) - 1;
    const size_t nb = (n + B - 1) / B;
    for (size_t k = 0; k < n; k++) {
        float scale, lo;
        size_t pos = k * b;
        uint32_t w = in[8 * nb + pos / 8] | ((pos % 8 + b > 8) ? in[8 * nb + pos / 8 + 1] << 8 : 0);
        memcpy(&scale, in + 8 * (k / B), 4);
        memcpy(&lo, in + 8 * (k / B) + 4, 4);
        CHECK(pcm_mm_meta_ok(scale, lo, L), "meta of bucket %zu rejected", k / B);
        y[k] = pcm_mm_value(lo, scale, (w >> (pos % 8)) & L);
    }
}

static long mm_cases;

static void check_mm(const psagg_codec *c, size_t n, int kind, int with_res, uint64_t seed,
                     int inject)
{
    size_t len = psagg__encoded_size(c, n), bad_ref = 1, bad_got = 2;
    float *x = tc_xmalloc(n * 4), *r_ref = tc_xmalloc(n * 4), *r_got = tc_xmalloc(n * 4);
    float *y_ref = tc_xmalloc(n * 4), *y_got = tc_xmalloc(n * 4);
    uint8_t *e_ref = tc_xmalloc(len), *e_got = tc_xmalloc(len);
    psagg__rng_key key = psagg__rng_key_make(seed, 7);
    psagg_status st_ref, st_got;

    tc_fill(x, n, kind, seed, tc_max_exp(c));
    tc_fill(r_ref, n, (kind + 1) % TC_KIND_COUNT, seed + 99, tc_max_exp(c) - 2);
    for (size_t i = 0; i < n; i++)
        r_ref[i] *= 0.25f;
    if (inject && n) {
        x[seed % n] = inject == 1 ? NAN : inject == 2 ? -INFINITY : 0x1p126f;
        r_ref[seed % n] = 0.0f;
    }
    memcpy(r_got, r_ref, n * 4);
    memset(e_ref, 0xA5, len);
    memset(e_got, 0x5A, len);
    st_ref = psagg__encode(c, x, with_res ? r_ref : NULL, n, key, e_ref, len, &bad_ref);
    st_got = emul_mm_encode(c, x, with_res ? r_got : NULL, n, key, e_got, &bad_got);
    CHECK(st_ref == st_got, "%s n=%zu %s res %d: status cpu %d vs emul %d", tc_name(c), n,
          tc_kind_name(kind), with_res, st_ref, st_got);
    if (st_ref != PSAGG_OK) {
        CHECK(bad_ref == bad_got, "%s n=%zu: bad index cpu %zu vs emul %zu", tc_name(c), n, bad_ref,
              bad_got);
    } else {
        for (size_t i = 0; i < len; i++)
            CHECK(e_ref[i] == e_got[i], "%s n=%zu %s res %d: byte %zu of %zu: cpu %02x vs %02x",
                  tc_name(c), n, tc_kind_name(kind), with_res, i, len, e_ref[i], e_got[i]);
        for (size_t i = 0; with_res && i < n; i++)
            CHECK(tc_f2u(r_ref[i]) == tc_f2u(r_got[i]), "%s n=%zu: residual[%zu] %a vs %a",
                  tc_name(c), n, i, r_ref[i], r_got[i]);
        CHECK(psagg__decode(c, e_ref, len, n, y_ref) == PSAGG_OK, "decode: %s", psagg_last_error());
        emul_mm_decode(c, e_got, n, y_got);
        for (size_t i = 0; i < n; i++)
            CHECK(tc_f2u(y_ref[i]) == tc_f2u(y_got[i]), "%s n=%zu: decoded[%zu] %a vs %a",
                  tc_name(c), n, i, y_ref[i], y_got[i]);
    }
    mm_cases++;
    free(x);
    free(r_ref);
    free(r_got);
    free(y_ref);
    free(y_got);
    free(e_ref);
    free(e_got);
}

/* ---- thc: the kernels' phases (codec_cuda_math.h), one block at a time ---- */

/* Block m of a chunk of n: its length in *len, the length it rotates at. */
static uint32_t thc_block(size_t n, uint32_t D, size_t m, uint32_t *len)
{
    *len = (uint32_t)(n - m * D < D ? n - m * D : D);
    return pcm_thc_pad(*len, D);
}

static psagg_status emul_thc_push(uint32_t bits, uint32_t D, psagg__rng_key rot,
                                  const float *scales, const float *x, float *res, size_t n,
                                  psagg__rng_key key, uint8_t *out, size_t out_len, size_t *bad)
{
    const size_t nb = (n + D - 1) / D;
    uint8_t *idx = out + 8 * nb;
    float *y = tc_xmalloc(D * 4);
    size_t first_bad = (size_t)-1, np = 0;
    uint32_t bad_code = 0;

    for (size_t m = 0; m < nb; m++) {
        uint32_t len, p = thc_block(n, D, m, &len), top = 0;
        const uint64_t e0 = m * D;
        const float f = pcm_thc_f(p), c = scales[m];
        float step = 0, a = 0;
        for (uint32_t i = 0; i < p; i++) {
            uint32_t code = pcm_thc_load(x + e0, len, rot.k0, rot.k1, e0, i, y);
            if (code && e0 + i < first_bad) {
                first_bad = e0 + i;
                bad_code = code;
            }
        }
        for (uint32_t h = 1; h < p; h <<= 1)
            for (uint32_t k = 0; k < p / 2; k++)
                pcm_thc_butterfly(y, k, h);
        for (uint32_t i = 0; i < p; i++) {
            uint32_t u = pcm_thc_rotated(y, res ? res + e0 : NULL, i, f);
            top = u > top ? u : top;
        }
        if (c > 0)
            pcm_thc_table(c, (1u << bits) - 1, &step, &a);
        memcpy(out + 8 * m, &c, 4);
        memcpy(out + 8 * m + 4, &top, 4);
        for (uint32_t o = 0; o < p * bits / 8; o++)
            idx[e0 * bits / 8 + o] = (uint8_t)pcm_thc_pack(y, res ? res + e0 : NULL, o, bits, c,
                                                           step, a, key.k0, key.k1, e0);
        np = e0 + p;
    }
    memset(idx + np * bits / 8, 0, out_len - 8 * nb - np * bits / 8);
    free(y);
    if (first_bad != (size_t)-1) {
        *bad = first_bad;
        return bad_code == PCM_ERR_NONFINITE ? PSAGG_ENONFINITE : PSAGG_ERANGE;
    }
    return PSAGG_OK;
}

/* The update's decode (meta as the CPU checked it), op a psagg__decode_op; the first coordinate
   whose sum is above its bound in *bad. */
static psagg_status emul_thc_update(uint32_t bits, uint32_t D, psagg__rng_key rot,
                                    const uint8_t *upd, size_t len, size_t n, float factor, int op,
                                    float *out, size_t *bad)
{
    const size_t nb = (n + D - 1) / D;
    const uint32_t L1 = (1u << bits) - 1;
    size_t inputs = 0;
    float *z = tc_xmalloc(D * 4);
    psagg_status st = psagg__thc_update_meta(bits, D, upd, len, n, &inputs, NULL, NULL);
    const uint32_t width = psagg__thc_sum_width(bits, inputs);

    for (size_t m = 0; !st && m < nb; m++) {
        uint32_t blen, p = thc_block(n, D, m, &blen), count;
        const uint64_t e0 = m * D;
        float c, peak, step = 0, a;
        memcpy(&c, upd + 12 * m, 4);
        memcpy(&peak, upd + 12 * m + 4, 4);
        memcpy(&count, upd + 12 * m + 8, 4);
        CHECK(pcm_thc_meta_ok(c, peak, count, (uint32_t)inputs), "block %zu's meta refused", m);
        if (c > 0)
            pcm_thc_table(c, L1, &step, &a);
        for (uint32_t i = 0; i < p; i++)
            if (pcm_thc_unplane(bits, width, upd + 12 * nb, e0, i, count * L1,
                                (int32_t)(count * L1), step, op == PSAGG_DECODE_SCALE ? factor : 1,
                                z) &&
                !st) {
                *bad = e0 + i;
                st = PSAGG_EBADMETA;
            }
        for (uint32_t h = 1; h < p; h <<= 1)
            for (uint32_t k = 0; k < p / 2; k++)
                pcm_thc_butterfly(z, k, h);
        for (uint32_t i = 0; i < blen; i++)
            pcm_thc_store(z, i, pcm_thc_f(p), rot.k0, rot.k1, e0, op, out + e0 + i);
    }
    free(z);
    return st;
}

static long thc_cases;

/* pcm_thc_meta_ok against the CPU's check of an update's meta, on every combination below. */
static void check_thc_meta(void)
{
    static const float sc[] = {0.0f,     -0.0f,    0x1p-101f, 0x1p-100f, 1.0f,
                               0x1p100f, 0x1p101f, INFINITY,  NAN,       -1.0f};
    static const float pk[] = {0.0f, -0.0f, 1.0f, INFINITY, NAN};
    const size_t len = psagg__thc_update_bytes(4, 64, 64, 3);
    uint8_t *u = tc_xmalloc(len);
    long n = 0;
    memset(u, 0, len);
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++)
        for (size_t j = 0; j < sizeof pk / sizeof pk[0]; j++)
            for (uint32_t count = 0; count <= 18; count += count == 1 ? 16 : 1, n++) {
                size_t inputs = 0;
                memcpy(u, &sc[i], 4);
                memcpy(u + 4, &pk[j], 4);
                memcpy(u + 8, &count, 4);
                int cpu =
                    psagg__thc_update_meta(4, 64, u, len, 64, &inputs, NULL, NULL) == PSAGG_OK;
                CHECK(inputs == 17 || !cpu, "thc meta: inputs %zu", inputs);
                CHECK(cpu == pcm_thc_meta_ok(sc[i], pk[j], count, 17),
                      "thc meta: scale %a peak %a count %u: cpu %d, pcm %d", sc[i], pk[j], count,
                      cpu, !cpu);
            }
    printf("thc meta: %ld combinations judged as the CPU does\n", n);
    free(u);
}

/* W workers' pushes of round 0 (no scale yet) and round 1 (the scales it set; block 1's forced
   to 0 when there is one), each against the CPU's bytes and residuals; the update of round 1
   decoded as every op; then a bad input (inject) or a corrupt sum. */
static void check_thc(uint32_t bits, uint32_t D, size_t n, int kind, uint64_t seed, int inject)
{
    enum { W = 3 };
    const size_t nb = (n + D - 1) / D, np = psagg__thc_rotated_len(n, D);
    const size_t plen = psagg__thc_push_bytes(bits, D, n),
                 ulen = psagg__thc_update_bytes(bits, D, n, W);
    psagg__rng_key rot = psagg__rng_key_make(seed, 3);
    float *x = tc_xmalloc(n * 4), *scales = tc_xmalloc(nb * 4), *y_ref = tc_xmalloc(n * 4),
          *y_got = tc_xmalloc(n * 4);
    float *r_ref[W], *r_got[W];
    uint8_t *p_ref[W], *p_got = tc_xmalloc(plen), *upd = tc_xmalloc(ulen);
    char ctx[96];

    snprintf(ctx, sizeof ctx, "thc%u/%u n=%zu %s", bits, D, n, tc_kind_name(kind));
    memset(scales, 0, nb * 4);
    for (int w = 0; w < W; w++) {
        r_ref[w] = tc_xmalloc(np * 4), r_got[w] = tc_xmalloc(np * 4), p_ref[w] = tc_xmalloc(plen);
        tc_fill(r_ref[w], np, TC_KIND_RANDOM, seed + 50 + (uint64_t)w, -3);
        memcpy(r_got[w], r_ref[w], np * 4);
    }
    for (int round = 0; round < 2; round++) {
        for (int w = 0; w < W; w++) {
            psagg__rng_key key = psagg__rng_key_make(seed + (uint64_t)w, (uint64_t)round);
            size_t b1 = 0, b2 = 0;
            psagg_status s1, s2;
            tc_fill(x, n, kind, seed + 10 * (uint64_t)round + (uint64_t)w, 20);
            s1 = psagg__thc_push_encode(bits, D, rot, scales, x, r_ref[w], n, key, p_ref[w], plen,
                                        &b1);
            s2 = emul_thc_push(bits, D, rot, scales, x, r_got[w], n, key, p_got, plen, &b2);
            CHECK(s1 == PSAGG_OK && s2 == PSAGG_OK, "%s round %d worker %d: %d / %d: %s", ctx,
                  round, w, s1, s2, psagg_last_error());
            CHECK(tc_first_diff(p_ref[w], p_got, plen) == (size_t)-1,
                  "%s round %d worker %d: push byte %zu of %zu differs", ctx, round, w,
                  tc_first_diff(p_ref[w], p_got, plen), plen);
            CHECK(tc_first_diff(r_ref[w], r_got[w], np * 4) == (size_t)-1,
                  "%s round %d worker %d: residual byte %zu differs", ctx, round, w,
                  tc_first_diff(r_ref[w], r_got[w], np * 4));
        }
        CHECK(psagg__thc_update_fold(bits, D, (const uint8_t *const *)p_ref, W, plen, n, upd,
                                     ulen) == PSAGG_OK,
              "%s: fold: %s", ctx, psagg_last_error());
        psagg__thc_update_next_scales(bits, D, upd, n, scales);
        if (nb > 1)
            scales[1] = 0;
    }
    for (int op = 0; op < 4; op++) {
        size_t bad = 0;
        float factor = op == PSAGG_DECODE_SCALE ? 1.0f / W : 1.0f;
        tc_fill(y_ref, n, TC_KIND_RANDOM, seed + 77, 2);
        memcpy(y_got, y_ref, n * 4);
        CHECK(psagg__thc_update_decode(bits, D, rot, upd, ulen, n, factor, (psagg__decode_op)op,
                                       y_ref, NULL) == PSAGG_OK,
              "%s: decode: %s", ctx, psagg_last_error());
        CHECK(emul_thc_update(bits, D, rot, upd, ulen, n, factor, op, y_got, &bad) == PSAGG_OK,
              "%s: emulated decode refused it at %zu", ctx, bad);
        tc_same_floats(ctx, op == 1 ? "decode ADD" : "decode", y_ref, y_got, n, "cpu ", "emul ");
    }
    if (inject) { /* a bad input: the same status and element; a sum above its bound */
        size_t b1 = 0, b2 = 1, at = (seed * 7919) % n, bad = 0;
        psagg__rng_key key = psagg__rng_key_make(seed, 9);
        psagg_status s1, s2;
        uint32_t width = psagg__thc_sum_width(bits, W);
        size_t e = (seed * 104729) % np;
        const char *msg;
        tc_fill(x, n, kind, seed, 20);
        x[at] = inject == 1 ? NAN : inject == 2 ? -INFINITY : 0x1.000002p100f;
        s1 = psagg__thc_push_encode(bits, D, rot, scales, x, r_ref[0], n, key, p_ref[0], plen, &b1);
        s2 = emul_thc_push(bits, D, rot, scales, x, r_got[0], n, key, p_got, plen, &b2);
        CHECK(s1 == s2 && s1 == (inject == 3 ? PSAGG_ERANGE : PSAGG_ENONFINITE) && b1 == b2 &&
                  b1 == at,
              "%s inject %d: cpu %d at %zu, emulation %d at %zu (element %zu)", ctx, inject, s1, b1,
              s2, b2, at);
        tc_thc_sum_max(bits, width, upd + 12 * nb, e); /* above any count * L1 of 3 pushes */
        s1 = psagg__thc_update_decode(bits, D, rot, upd, ulen, n, 1, PSAGG_DECODE_SET, y_ref, NULL);
        msg = strstr(psagg_last_error(), "element ");
        s2 = emul_thc_update(bits, D, rot, upd, ulen, n, 1, PSAGG_DECODE_SET, y_got, &bad);
        CHECK(s1 == PSAGG_EBADMETA && s2 == PSAGG_EBADMETA && msg &&
                  strtoull(msg + 8, NULL, 10) == bad && bad == e,
              "%s: a sum of %u at coordinate %zu: cpu %d (%s), emulation %d at %zu", ctx,
              (1u << width) - 1, e, s1, psagg_last_error(), s2, bad);
    }
    thc_cases++;
    for (int w = 0; w < W; w++)
        free(r_ref[w]), free(r_got[w]), free(p_ref[w]);
    free(x), free(scales), free(y_ref), free(y_got), free(p_got), free(upd);
}

int main(int argc, char **argv)
{
    psagg_codec cs[64];
    const uint32_t buckets[] = {64, 192, 1024};
    static const size_t ns[] = {1,   7,   8,    9,    63,   64,   65,   191, 192,
                                193, 200, 1000, 1023, 1024, 1025, 2049, 3079};
    size_t nc = tc_codecs(cs, buckets, 3);
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int full = argc > 1 && !strcmp(argv[1], "--full");

    tc_set_isa(PSAGG_ISA_SCALAR);
    check_16_decode(PSAGG_CODEC_FP16);
    check_16_decode(PSAGG_CODEC_BF16);
    for (size_t ci = 0; ci < nc; ci++) {
        if (cs[ci].id != PSAGG_CODEC_MAXMIN)
            continue;
        for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++)
            for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                for (int wr = 0; wr < 2; wr++)
                    check_mm(&cs[ci], ns[si], kind, wr, ns[si] * 7 + (uint64_t)kind + ci, 0);
        for (int inject = 1; inject <= 3; inject++)
            check_mm(&cs[ci], 1000, TC_KIND_RANDOM, inject & 1, 5 + (uint64_t)inject + ci, inject);
    }
    printf("maxmin emulation: %ld cases bit-identical with the scalar reference\n", mm_cases);
    check_thc_meta();
    for (uint32_t bits = 2; bits <= 4; bits += 2) {
        static const uint32_t Ds[] = {64, 256, 1024, 16384};
        static const size_t tn[] = {1, 63, 64, 65, 200, 1000, 1024, 1025, 3000, 20000};
        for (size_t di = 0; di < 4; di++)
            for (size_t si = 0; si < sizeof tn / sizeof tn[0]; si++)
                for (int kind = 0; kind < TC_KIND_COUNT; kind++)
                    check_thc(bits, Ds[di], tn[si], kind, tn[si] * 13 + (uint64_t)kind + di,
                              kind % 4);
    }
    printf("thc emulation: %ld cases bit-identical with the scalar reference\n", thc_cases);
    if (quick) {
        printf("--quick: exhaustive fp16/bf16 sweeps skipped\n");
        return 0;
    }
    check_fp16_encode(full ? 1 : 3);
    check_bf16_encode(full ? 1 : 13);
    printf("OK\n");
    return 0;
}
