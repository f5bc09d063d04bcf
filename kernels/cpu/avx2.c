/*
 * cpu/avx2.c - AVX2 + F16C codec paths, 8 elements per vector. Bit-identical to scalar.c:
 * the same binary32 operations in the same order, no FMA. Tails go through the same vector
 * code with masked loads/stores (fp32) or a zero-padded staging buffer (16-bit formats and
 * maxmin payload bytes). Layer: kernels.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "impl.h"
#include "kernels/rng.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#define W 8

static inline __m256i lane_mask(size_t rem)
{
    int r = rem >= W ? W : (int)rem;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline unsigned lane_bits(size_t rem)
{
    return rem >= W ? 0xFFu : (1u << rem) - 1;
}

static inline __m256 abs8(__m256 v)
{
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
}

/* Whole vectors are the rule and a tail happens once per buffer: FULL(rem) keeps the whole-
 * vector code on the fall-through path (gcc laid it out of line, at 5 taken branches a vector). */
#define FULL(rem) __builtin_expect((rem) >= W, 1)

static inline __m256 load_f32(const float *p, size_t rem)
{
    if (FULL(rem))
        return _mm256_loadu_ps(p);
    return _mm256_maskload_ps(p, lane_mask(rem));
}

static inline void store_f32(float *p, __m256 v, size_t rem)
{
    if (FULL(rem))
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, lane_mask(rem), v);
}

/* 8 x 16-bit from p (only rem lanes readable). */
static inline __m128i load_16(const uint8_t *p, size_t rem)
{
    uint8_t stage[16] = {0};
    if (FULL(rem))
        return _mm_loadu_si128((const __m128i *)p);
    memcpy(stage, p, 2 * rem);
    return _mm_loadu_si128((const __m128i *)stage);
}

static inline void store_16(uint8_t *p, __m128i h, size_t rem)
{
    uint8_t stage[16];
    if (FULL(rem)) {
        _mm_storeu_si128((__m128i *)p, h);
        return;
    }
    _mm_storeu_si128((__m128i *)stage, h);
    memcpy(p, stage, 2 * rem);
}

static psagg_status report_bad(const psagg_codec *c, size_t k0, __m256 v, unsigned bad,
                               size_t *badi)
{
    float tmp[W];
    unsigned lane = (unsigned)__builtin_ctz(bad);
    _mm256_storeu_ps(tmp, v);
    return psagg__codec_bad_value(c, k0 + lane, tmp[lane], badi);
}

/* ---------------- fp formats ---------------- */

/* always inlined: the per-vector format switch must fold away in each loop */
static inline __attribute__((always_inline)) __m256 load_fp(psagg_codec_id id, const uint8_t *in,
                                                            size_t k, size_t rem)
{
    switch (id) {
    case PSAGG_CODEC_FP32:
        return load_f32((const float *)(const void *)(in + 4 * k), rem);
    case PSAGG_CODEC_FP16:
        return _mm256_cvtph_ps(load_16(in + 2 * k, rem));
    default:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(load_16(in + 2 * k, rem)), 16));
    }
}

/* Encode v (rem lanes valid) at element k; returns the bad lanes (nothing stored then). */
static inline __attribute__((always_inline)) unsigned
store_fp(psagg_codec_id id, __m256 v, size_t rem, uint8_t *out, size_t k, float *r)
{
    unsigned bad, lb = lane_bits(rem);
    switch (id) {
    case PSAGG_CODEC_FP32:
        bad = (unsigned)_mm256_movemask_ps(
                  _mm256_cmp_ps(abs8(v), _mm256_set1_ps(0x1.fffffep127f), _CMP_NLE_UQ)) &
              lb;
        if (bad)
            return bad;
        store_f32((float *)(void *)(out + 4 * k), v, rem);
        if (r)
            store_f32(r, _mm256_sub_ps(v, v), rem);
        return 0;
    case PSAGG_CODEC_FP16: {
        __m128i h;
        bad = (unsigned)_mm256_movemask_ps(
                  _mm256_cmp_ps(abs8(v), _mm256_set1_ps(65520.0f), _CMP_NLT_UQ)) &
              lb;
        if (bad)
            return bad;
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        store_16(out + 2 * k, h, rem);
        if (r)
            store_f32(r, _mm256_sub_ps(v, _mm256_cvtph_ps(h)), rem);
        return 0;
    }
    default: {
        __m256i u = _mm256_castps_si256(v);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i rnd = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb);
        __m256i a = _mm256_add_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), rnd);
        __m256i lim = _mm256_set1_epi32(0x7F800000), w, hs;
        /* unsigned a >= 0x7F800000: NaN, Inf and finite values that round to Inf */
        bad = (unsigned)_mm256_movemask_ps(
                  _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(a, lim), a))) &
              lb;
        if (bad)
            return bad;
        w = _mm256_add_epi32(u, rnd);
        hs = _mm256_srli_epi32(w, 16);
        store_16(out + 2 * k,
                 _mm_packus_epi32(_mm256_castsi256_si128(hs), _mm256_extracti128_si256(hs, 1)),
                 rem);
        if (r) {
            __m256 y =
                _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
            store_f32(r, _mm256_sub_ps(v, y), rem);
        }
        return 0;
    }
    }
}

/* The fp paths take the format as a constant (see fp_as below): one loop per format. */
static inline __attribute__((always_inline)) psagg_status
enc_fp_as(const psagg_codec_id id, const psagg_codec *c, const float *x, float *r, size_t n,
          uint8_t *out, size_t *badi)
{
    for (size_t k = 0; k < n; k += W) {
        size_t rem = n - k;
        unsigned bad;
        __m256 v = load_f32(x + k, rem);
        if (r)
            v = _mm256_add_ps(v, load_f32(r + k, rem));
        bad = store_fp(id, v, rem, out, k, r ? r + k : NULL);
        if (bad)
            return report_bad(c, k, v, bad, badi);
    }
    return PSAGG_OK;
}

/* y applied to out + k (rem lanes in range) as op says (codec.h psagg__decode_op) */
static inline __m256 dec_apply(psagg__decode_op op, const float *o, size_t rem, __m256 y, __m256 f)
{
    switch (op) {
    case PSAGG_DECODE_ADD:
        return _mm256_add_ps(load_f32(o, rem), y);
    case PSAGG_DECODE_FIRST:
        return _mm256_add_ps(_mm256_setzero_ps(), y);
    case PSAGG_DECODE_SCALE:
        return _mm256_mul_ps(y, f);
    default:
        return y;
    }
}

/*
 * Decode and apply; the NaN/Inf check of the inputs rides along (lanes past n load as 0, so
 * they never flag).
 */
static inline __attribute__((always_inline)) int dec_fp_as(const psagg_codec_id id,
                                                           const uint8_t *in, size_t n, float *out,
                                                           psagg__decode_op op, float factor)
{
    const __m256 f = _mm256_set1_ps(factor), inf = _mm256_set1_ps(INFINITY);
    __m256 bad = _mm256_setzero_ps();
    for (size_t k = 0; k < n; k += W) {
        size_t rem = n - k;
        __m256 y = load_fp(id, in, k, rem);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(abs8(y), inf, _CMP_NLT_UQ));
        store_f32(out + k, dec_apply(op, out + k, rem, y, f), rem);
    }
    return _mm256_movemask_ps(bad) != 0;
}

static inline __attribute__((always_inline)) psagg_status
agg_fp_as(const psagg_codec_id id, const psagg_codec *c, const uint8_t *const *in, size_t n_in,
          size_t n, float *r, uint8_t *out, size_t *badi)
{
    for (size_t k = 0; k < n; k += W) {
        size_t rem = n - k;
        unsigned bad;
        __m256 s = _mm256_setzero_ps();
        for (size_t i = 0; i < n_in; i++)
            s = _mm256_add_ps(s, load_fp(id, in[i], k, rem));
        if (r)
            s = _mm256_add_ps(s, load_f32(r + k, rem));
        bad = store_fp(id, s, rem, out, k, r ? r + k : NULL);
        if (bad)
            return report_bad(c, k, s, bad, badi);
    }
    return PSAGG_OK;
}

PSAGG_FP_ENTRY_POINTS

/* ---------------- maxmin ---------------- */

typedef struct mm_ctx {
    uint32_t b; /* bits = payload bytes per 8 elements */
    size_t n, nb, plen;
    __m256i ctrl, shifts, lmask;
    __m128i cnt_a, cnt_b, cnt_c; /* 32-b, 2b, 4b */
    __m256 Lf;
} mm_ctx;

static void mm_init(mm_ctx *t, const psagg_codec *c, size_t n)
{
    uint32_t b = c->bits;
    uint8_t ctrl[32];
    uint32_t sh[8];
    t->b = b;
    t->n = n;
    t->nb = psagg__mm_nbuckets(n, c->bucket);
    t->plen = psagg__mm_payload_bytes(n, b);
    for (unsigned j = 0; j < 8; j++) {
        unsigned bit = j * b, off = bit >> 3, s = bit & 7;
        ctrl[4 * j] = (uint8_t)off;
        ctrl[4 * j + 1] = (uint8_t)(s + b > 8 ? off + 1 : 0x80);
        ctrl[4 * j + 2] = 0x80;
        ctrl[4 * j + 3] = 0x80;
        sh[j] = s;
    }
    t->ctrl = _mm256_loadu_si256((const __m256i *)ctrl);
    t->shifts = _mm256_loadu_si256((const __m256i *)sh);
    t->lmask = _mm256_set1_epi32((int)((1u << b) - 1));
    t->cnt_a = _mm_cvtsi32_si128((int)(32 - b));
    t->cnt_b = _mm_cvtsi32_si128((int)(2 * b));
    t->cnt_c = _mm_cvtsi32_si128((int)(4 * b));
    t->Lf = _mm256_set1_ps((float)((1u << b) - 1));
}

/* Levels of the 8 elements whose b payload bytes start at p (avail bytes readable). */
static inline __m256i mm_unpack(const mm_ctx *t, const uint8_t *p, size_t avail)
{
    __m256i w;
    if (avail >= 8) {
        w = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p));
    } else {
        uint8_t stage[8] = {0};
        memcpy(stage, p, avail);
        w = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)stage));
    }
    w = _mm256_shuffle_epi8(w, t->ctrl);
    w = _mm256_srlv_epi32(w, t->shifts);
    return _mm256_and_si256(w, t->lmask);
}

/* Pack 8 levels (lanes beyond n already 0) into b bytes at p; room = bytes writable. */
static inline void mm_pack(const mm_ctx *t, __m256i q, uint8_t *p, size_t room)
{
    __m256i s1 = _mm256_or_si256(_mm256_srl_epi64(q, t->cnt_a),
                                 _mm256_and_si256(q, _mm256_set1_epi64x(0xFFFFFFFF)));
    __m256i s2 = _mm256_or_si256(s1, _mm256_sll_epi64(_mm256_unpackhi_epi64(s1, s1), t->cnt_b));
    __m128i s3 = _mm_or_si128(_mm256_castsi256_si128(s2),
                              _mm_sll_epi64(_mm256_extracti128_si256(s2, 1), t->cnt_c));
    uint64_t g = (uint64_t)_mm_cvtsi128_si64(s3);
    if (room >= 8)
        memcpy(p, &g, 8); /* bytes past b are zero; rewritten by the next group */
    else
        memcpy(p, &g, room < t->b ? room : t->b);
}

/*
 * u_k of codec.h for the 8 elements idx (consecutive, idx even): each lane hashes its pair
 * m = k >> 1 (lanes 2i and 2i + 1 hash the same m) and takes its half of the hash.
 */
static inline __m256 rng8(__m256i idx, __m256i k0, __m256i k1)
{
    /* psagg__rng_hash32 of kernels/rng.h, 8 lanes at once */
    __m256i h = _mm256_add_epi32(_mm256_xor_si256(_mm256_srli_epi32(idx, 1), k1), k0);
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, PSAGG_RNG_S1));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)PSAGG_RNG_M1));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, PSAGG_RNG_S2));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)PSAGG_RNG_M2));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, PSAGG_RNG_S3));
    /* 2 * d + 1: the lane's half moved to bits 1..16 (even lanes << 1, odd >> 15), | 1 */
    const int hi = PSAGG_RNG_D_BITS - 1;
    h = _mm256_srlv_epi32(_mm256_sllv_epi32(h, _mm256_setr_epi32(1, 0, 1, 0, 1, 0, 1, 0)),
                          _mm256_setr_epi32(0, hi, 0, hi, 0, hi, 0, hi));
    h = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi32((int)PSAGG_RNG_D2_MASK)),
                        _mm256_set1_epi32(1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(h), _mm256_set1_ps(PSAGG_RNG_U_SCALE));
}

static inline float hmin8(__m256 v)
{
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* pass-1 bookkeeping for one vector v with rem valid lanes */
static inline void mm_track(__m256 v, size_t rem, __m256 *vmin, __m256 *vmax, unsigned *bad)
{
    __m256 lim = _mm256_set1_ps(PSAGG_MAXMIN_MAX_ABS);
    unsigned lb = lane_bits(rem);
    *bad |= (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(abs8(v), lim, _CMP_NLT_UQ)) & lb;
    if (rem < W) {
        __m256 m = _mm256_castsi256_ps(lane_mask(rem));
        *vmin = _mm256_min_ps(*vmin, _mm256_blendv_ps(_mm256_set1_ps(INFINITY), v, m));
        *vmax = _mm256_max_ps(*vmax, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, m));
    } else {
        *vmin = _mm256_min_ps(*vmin, v);
        *vmax = _mm256_max_ps(*vmax, v);
    }
}

static psagg_status mm_finish_bucket(const mm_ctx *t, const psagg_codec *c, float *acc, size_t len,
                                     size_t base, __m256 vmin, __m256 vmax, unsigned bad_any,
                                     float *r, psagg__rng_key key, uint8_t *out, size_t *badi)
{
    float lo, hi, range, scale = 0.0f, inv = 0.0f;
    uint8_t *meta = out + 8 * (base / c->bucket), *payload = out + 8 * t->nb;
    __m256 vlo, vscale, vinv, vhalf = _mm256_set1_ps(0.5f);
    __m256i k0 = _mm256_set1_epi32((int)key.k0), k1 = _mm256_set1_epi32((int)key.k1);
    __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int sr = c->rounding == PSAGG_ROUND_STOCHASTIC;

    if (bad_any) {
        __m256 lim = _mm256_set1_ps(PSAGG_MAXMIN_MAX_ABS);
        for (size_t j = 0; j < len; j += W) {
            __m256 v = _mm256_load_ps(acc + j);
            unsigned bad = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(abs8(v), lim, _CMP_NLT_UQ)) &
                           lane_bits(len - j);
            if (bad)
                return report_bad(c, base + j, v, bad, badi);
        }
    }
    lo = hmin8(vmin);
    hi = hmax8(vmax);
    if (lo == 0.0f) { /* -0 < +0: lo is -0 iff some value is -0 */
        unsigned neg = 0;
        for (size_t j = 0; j < len; j += W)
            neg |= (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(
                       _mm256_cmpeq_epi32(_mm256_load_si256((const __m256i *)(acc + j)),
                                          _mm256_set1_epi32((int)0x80000000u)))) &
                   lane_bits(len - j);
        lo = neg ? -0.0f : 0.0f;
    }
    range = hi - lo;
    if (!(range < PSAGG_MAXMIN_MIN_RANGE)) {
        scale = range / (float)((1u << c->bits) - 1);
        inv = 1.0f / scale;
    }
    memcpy(meta, &scale, 4);
    memcpy(meta + 4, &lo, 4);
    vlo = _mm256_set1_ps(lo);
    vscale = _mm256_set1_ps(scale);
    vinv = _mm256_set1_ps(inv);
    for (size_t j = 0; j < len; j += W) {
        size_t k = base + j, off = (k / W) * t->b, rem = len - j;
        __m256 v = _mm256_load_ps(acc + j);
        __m256 tt = _mm256_mul_ps(_mm256_sub_ps(v, vlo), vinv);
        __m256 u =
            sr ? rng8(_mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)k), iota), k0, k1) : vhalf;
        __m256i q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_add_ps(tt, u), t->Lf));
        if (rem < W)
            q = _mm256_and_si256(q, lane_mask(rem));
        mm_pack(t, q, payload + off, t->plen - off);
        if (r) {
            __m256 y = _mm256_add_ps(vlo, _mm256_mul_ps(vscale, _mm256_cvtepi32_ps(q)));
            store_f32(r + j, _mm256_sub_ps(v, y), rem);
        }
    }
    return PSAGG_OK;
}

static void mm_zero_padding(const mm_ctx *t, uint8_t *out)
{
    size_t covered = ((t->n + W - 1) / W) * t->b;
    if (covered < t->plen)
        memset(out + 8 * t->nb + covered, 0, t->plen - covered);
}

static psagg_status enc_mm(const psagg_codec *c, const float *x, float *residual, size_t n,
                           psagg__rng_key key, uint8_t *out, psagg__scratch *ws, size_t *badi)
{
    size_t B = c->bucket;
    float *acc = ws->acc;
    psagg_status st = PSAGG_OK;
    mm_ctx t;

    mm_init(&t, c, n);
    for (size_t base = 0; base < n && st == PSAGG_OK; base += B) {
        size_t len = n - base < B ? n - base : B;
        const float *xb = x + base;
        float *rb = residual ? residual + base : NULL;
        __m256 vmin = _mm256_set1_ps(INFINITY), vmax = _mm256_set1_ps(-INFINITY);
        unsigned bad_any = 0;
        for (size_t j = 0; j < len; j += W) {
            size_t rem = len - j;
            __m256 v = load_f32(xb + j, rem);
            if (rb)
                v = _mm256_add_ps(v, load_f32(rb + j, rem));
            _mm256_store_ps(acc + j, v);
            mm_track(v, rem, &vmin, &vmax, &bad_any);
        }
        st = mm_finish_bucket(&t, c, acc, len, base, vmin, vmax, bad_any, rb, key, out, badi);
    }
    if (st == PSAGG_OK)
        mm_zero_padding(&t, out);
    return st;
}

static void dec_mm(const psagg_codec *c, const uint8_t *in, size_t n, float *out,
                   psagg__decode_op op, float factor)
{
    const __m256 f = _mm256_set1_ps(factor);
    mm_ctx t;
    const uint8_t *payload;
    mm_init(&t, c, n);
    payload = in + 8 * t.nb;
    for (size_t base = 0; base < n; base += c->bucket) {
        size_t len = n - base < c->bucket ? n - base : c->bucket;
        const uint8_t *meta = in + 8 * (base / c->bucket);
        float scale, lo;
        __m256 vs, vl;
        memcpy(&scale, meta, 4);
        memcpy(&lo, meta + 4, 4);
        vs = _mm256_set1_ps(scale);
        vl = _mm256_set1_ps(lo);
        for (size_t j = 0; j < len; j += W) {
            size_t k = base + j, off = (k / W) * t.b, rem = len - j;
            __m256i q = mm_unpack(&t, payload + off, t.plen - off);
            __m256 y = _mm256_add_ps(vl, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(q)));
            store_f32(out + k, dec_apply(op, out + k, rem, y, f), rem);
        }
    }
}

static psagg_status agg_mm(const psagg_codec *c, const uint8_t *const *in, size_t n_in, size_t n,
                           float *residual, psagg__rng_key key, uint8_t *out, psagg__scratch *ws,
                           size_t *badi)
{
    size_t B = c->bucket;
    float *acc = ws->acc, *mt = ws->meta;
    const uint8_t **pay = ws->pay;
    psagg_status st = PSAGG_OK;
    mm_ctx t;

    mm_init(&t, c, n);
    for (size_t i = 0; i < n_in; i++)
        pay[i] = in[i] + 8 * t.nb;
    for (size_t base = 0; base < n && st == PSAGG_OK; base += B) {
        size_t len = n - base < B ? n - base : B, mi = base / B;
        float *rb = residual ? residual + base : NULL;
        __m256 vmin = _mm256_set1_ps(INFINITY), vmax = _mm256_set1_ps(-INFINITY);
        unsigned bad_any = 0;
        for (size_t i = 0; i < n_in; i++)
            memcpy(mt + 2 * i, in[i] + 8 * mi, 8); /* scale, lo */
        for (size_t j = 0; j < len; j += W) {
            size_t k = base + j, off = (k / W) * t.b, avail = t.plen - off, rem = len - j;
            __m256 s = _mm256_setzero_ps();
            for (size_t i = 0; i < n_in; i++) {
                __m256i q = mm_unpack(&t, pay[i] + off, avail);
                __m256 y =
                    _mm256_add_ps(_mm256_set1_ps(mt[2 * i + 1]),
                                  _mm256_mul_ps(_mm256_set1_ps(mt[2 * i]), _mm256_cvtepi32_ps(q)));
                s = _mm256_add_ps(s, y);
            }
            if (rb)
                s = _mm256_add_ps(s, load_f32(rb + j, rem));
            _mm256_store_ps(acc + j, s);
            mm_track(s, rem, &vmin, &vmax, &bad_any);
        }
        st = mm_finish_bucket(&t, c, acc, len, base, vmin, vmax, bad_any, rb, key, out, badi);
    }
    if (st == PSAGG_OK)
        mm_zero_padding(&t, out);
    return st;
}

/* ---------------- topk's block passes (kernels/topk.h: the same results as the scalar ones) */

static uint32_t topk_load(const float *x, const float *r, uint32_t first, uint32_t n, float *v)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)),
                 big = _mm256_set1_ps(0x1p126f);
    uint32_t j = first;
    for (; j + W <= n; j += W) {
        __m256 a = _mm256_loadu_ps(x + j);
        if (r)
            a = _mm256_add_ps(a, _mm256_loadu_ps(r + j));
        /* |v| < 2^126, false for NaN: every lane fine */
        if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(a, absm), big, _CMP_LT_OQ)) != 0xFF)
            break;
        _mm256_storeu_ps(v + j, a);
    }
    /* the tail, or the vector with a bad lane: the scalar pass finds it */
    return psagg__topk_scalar_passes.load(x, r, j, n, v);
}

static uint32_t topk_filter(const float *v, uint32_t first, uint32_t n, uint32_t mask,
                            uint32_t prefix, uint32_t *out)
{
    const __m256i vm = _mm256_set1_epi32((int)(mask & 0x7FFFFFFFu)),
                  vp = _mm256_set1_epi32((int)prefix);
    uint32_t j = first, m = 0;
    for (; j + W <= n; j += W) {
        __m256i u = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + j)), vm);
        unsigned b = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(u, vp)));
        for (; b; b &= b - 1)
            out[m++] = j + (uint32_t)__builtin_ctz(b);
    }
    return m + psagg__topk_scalar_passes.filter(v, j, n, mask, prefix, out + m);
}

static uint32_t topk_keep(const float *v, uint32_t first, uint32_t n, uint32_t want, uint32_t ties,
                          uint32_t *idx)
{
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), vw = _mm256_set1_epi32((int)want);
    uint32_t j = first, t = 0;
    for (; j + W <= n; j += W) { /* (magnitudes are below 2^31: a signed compare orders them) */
        __m256i u = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + j)), absm);
        unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(u, vw)));
        unsigned eq = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(u, vw)));
        for (; eq && ties; eq &= eq - 1, ties--) /* the first `ties` equal ones, by index */
            gt |= eq & -eq;
        for (; gt; gt &= gt - 1)
            idx[t++] = j + (uint32_t)__builtin_ctz(gt);
    }
    return t + psagg__topk_scalar_passes.keep(v, j, n, want, ties, idx + t);
}

static const psagg__topk_passes topk_passes = {
    .load = topk_load, .filter = topk_filter, .keep = topk_keep};

/* ---------------- thc's integer fold (kernels/thc.h: the same bytes as the scalar one) ---- */

static inline __attribute__((always_inline)) void thc_fold_as(const uint32_t bits,
                                                              const uint32_t width,
                                                              const uint8_t *const *in, size_t n_in,
                                                              size_t groups, uint8_t *out)
{
    const uint32_t P = 8 / bits;
    const __m256i m = _mm256_set1_epi8((char)((1u << bits) - 1));
    const __m256i m4 = _mm256_set1_epi8((char)(((1u << bits) - 1) * 17)); /* w = 4: two planes */
    if (width == 4) { /* planes j and j + P/2 in one run: each byte's two nibbles, added whole */
        for (size_t g = 0; g < groups; g++)
            for (uint32_t h = 0; h < 2; h++) {
                __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                for (size_t k = 0; k < n_in; k++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(in[k] + g * 64 + 32 * h));
                    for (uint32_t j = 0; j < P / 2; j++)
                        acc[j] = _mm256_add_epi8(
                            acc[j],
                            _mm256_and_si256(
                                _mm256_srl_epi16(x, _mm_cvtsi32_si128((int)(j * bits))), m4));
                }
                for (uint32_t j = 0; j < P / 2; j++)
                    _mm256_storeu_si256((__m256i *)(out + g * 32 * P + j * 64 + 32 * h), acc[j]);
            }
        return;
    }
    for (size_t g = 0; g < groups; g++)
        for (uint32_t h = 0; h < 2; h++) { /* each half of the group: 32 input bytes */
            __m256i acc[8];
            for (uint32_t a = 0; a < 8; a++)
                acc[a] = _mm256_setzero_si256();
            for (size_t k = 0; k < n_in; k++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(in[k] + g * 64 + 32 * h));
                for (uint32_t j = 0; j < P; j++) {
                    __m256i p = _mm256_and_si256(
                        _mm256_srl_epi16(x, _mm_cvtsi32_si128((int)(j * bits))), m);
                    if (width == 8) {
                        acc[j] = _mm256_add_epi8(acc[j], p);
                    } else {
                        acc[2 * j] = _mm256_add_epi16(
                            acc[2 * j], _mm256_cvtepu8_epi16(_mm256_castsi256_si128(p)));
                        acc[2 * j + 1] = _mm256_add_epi16(
                            acc[2 * j + 1], _mm256_cvtepu8_epi16(_mm256_extracti128_si256(p, 1)));
                    }
                }
            }
            for (uint32_t j = 0; j < P; j++) {
                size_t at = g * 64 * P + j * 64 + 32 * h; /* plane j, positions 32h .. 32h + 31 */
                if (width == 8) {
                    _mm256_storeu_si256((__m256i *)(out + at), acc[j]);
                } else {
                    _mm256_storeu_si256((__m256i *)(out + 2 * at), acc[2 * j]);
                    _mm256_storeu_si256((__m256i *)(out + 2 * at + 32), acc[2 * j + 1]);
                }
            }
        }
}

PSAGG_THC_FOLD_ENTRY_POINT

const psagg__codec_impl psagg__impl_avx2 = {
    .name = "avx2",
    .fp_encode = enc_fp,
    .fp_decode = dec_fp,
    .fp_aggregate = agg_fp,
    .mm_encode = enc_mm,
    .mm_decode = dec_mm,
    .mm_aggregate = agg_mm,
    .topk = &topk_passes,
    .thc_fold = thc_fold,
    .thc_worker = &psagg__thc_worker_avx2,
};

#else /* not built for AVX2 */
const psagg__codec_impl psagg__impl_avx2 = {.name = "avx2"};
#endif
