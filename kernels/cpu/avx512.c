/*
 * cpu/avx512.c - AVX-512 (F, BW, VL, DQ) codec paths, 16 elements per vector. Bit-identical
 * to scalar.c: the same binary32 operations in the same order, no FMA. Tails are handled by
 * masked loads and stores through the same vector code. maxmin with whole-byte levels
 * (b = 1, 2, 4, 8) goes to avx512_bytes.c. Layer: kernels.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) &&                        \
    defined(__AVX512VL__) && defined(__AVX512DQ__)
#include "avx512_bytes.h"
#include "avx512_lanes.h"

/* Report the first bad lane (bits set in bad) of v, element index k0 + lane. */
static psagg_status report_bad(const psagg_codec *c, size_t k0, __m512 v, __mmask16 bad,
                               size_t *badi)
{
    float tmp[W];
    unsigned lane = (unsigned)__builtin_ctz((unsigned)bad);
    _mm512_storeu_ps(tmp, v);
    return psagg__codec_bad_value(c, k0 + lane, tmp[lane], badi);
}

/* ---------------- fp formats ---------------- */

/* always inlined: the per-vector format switch must fold away in each loop */
static inline __attribute__((always_inline)) __m512 load_fp(psagg_codec_id id, const uint8_t *in,
                                                            size_t k, __mmask16 m)
{
    switch (id) {
    case PSAGG_CODEC_FP32:
        return _mm512_maskz_loadu_ps(m, in + 4 * k);
    case PSAGG_CODEC_FP16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, in + 2 * k));
    default:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, in + 2 * k)), 16));
    }
}

/* Encode v (lanes m) at element k; returns the mask of bad lanes (nothing stored then). */
static inline __attribute__((always_inline)) __mmask16
store_fp(psagg_codec_id id, __m512 v, __mmask16 m, uint8_t *out, size_t k, float *r)
{
    __mmask16 bad;
    switch (id) {
    case PSAGG_CODEC_FP32:
        bad = _mm512_mask_cmp_ps_mask(m, abs16(v), _mm512_set1_ps(0x1.fffffep127f), _CMP_NLE_UQ);
        if (bad)
            return bad;
        _mm512_mask_storeu_ps(out + 4 * k, m, v);
        if (r)
            _mm512_mask_storeu_ps(r, m, _mm512_sub_ps(v, v));
        return 0;
    case PSAGG_CODEC_FP16: {
        __m256i h;
        bad = _mm512_mask_cmp_ps_mask(m, abs16(v), _mm512_set1_ps(65520.0f), _CMP_NLT_UQ);
        if (bad)
            return bad;
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(out + 2 * k, m, h);
        if (r)
            _mm512_mask_storeu_ps(r, m, _mm512_sub_ps(v, _mm512_cvtph_ps(h)));
        return 0;
    }
    default: {
        __m512i u = _mm512_castps_si512(v);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i rnd = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb);
        __m512i a = _mm512_add_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), rnd);
        __m512i w;
        /* NaN, Inf and finite values that round to Inf: |u| + rounding >= 0x7F800000 */
        bad = _mm512_mask_cmpge_epu32_mask(m, a, _mm512_set1_epi32(0x7F800000));
        if (bad)
            return bad;
        w = _mm512_add_epi32(u, rnd);
        _mm256_mask_storeu_epi16(out + 2 * k, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
        if (r) {
            __m512 y =
                _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
            _mm512_mask_storeu_ps(r, m, _mm512_sub_ps(v, y));
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
        __mmask16 m = lane_mask(n - k), bad;
        __m512 v = _mm512_maskz_loadu_ps(m, x + k);
        if (r)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r + k));
        bad = store_fp(id, v, m, out, k, r ? r + k : NULL);
        if (bad)
            return report_bad(c, k, v, bad, badi);
    }
    return PSAGG_OK;
}

/* y applied to out + k (m: the lanes in range) as op says (codec.h psagg__decode_op) */
static inline __m512 dec_apply(psagg__decode_op op, const float *o, __mmask16 m, __m512 y, __m512 f)
{
    switch (op) {
    case PSAGG_DECODE_ADD:
        return _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), y);
    case PSAGG_DECODE_FIRST:
        return _mm512_add_ps(_mm512_setzero_ps(), y);
    case PSAGG_DECODE_SCALE:
        return _mm512_mul_ps(y, f);
    default:
        return y;
    }
}

/* Decode and apply; the NaN/Inf check of the inputs rides along (a mask per vector). */
static inline __attribute__((always_inline)) int dec_fp_as(const psagg_codec_id id,
                                                           const uint8_t *in, size_t n, float *out,
                                                           psagg__decode_op op, float factor)
{
    const __m512 f = _mm512_set1_ps(factor), inf = _mm512_set1_ps(INFINITY);
    __mmask16 bad = 0;
    for (size_t k = 0; k < n; k += W) {
        __mmask16 m = lane_mask(n - k);
        __m512 y = load_fp(id, in, k, m);
        bad |= _mm512_mask_cmp_ps_mask(m, abs16(y), inf, _CMP_NLT_UQ);
        _mm512_mask_storeu_ps(out + k, m, dec_apply(op, out + k, m, y, f));
    }
    return bad != 0;
}

static inline __attribute__((always_inline)) psagg_status
agg_fp_as(const psagg_codec_id id, const psagg_codec *c, const uint8_t *const *in, size_t n_in,
          size_t n, float *r, uint8_t *out, size_t *badi)
{
    for (size_t k = 0; k < n; k += W) {
        __mmask16 m = lane_mask(n - k), bad;
        __m512 s = _mm512_setzero_ps();
        for (size_t i = 0; i < n_in; i++)
            s = _mm512_add_ps(s, load_fp(id, in[i], k, m));
        if (r)
            s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, r + k));
        bad = store_fp(id, s, m, out, k, r ? r + k : NULL);
        if (bad)
            return report_bad(c, k, s, bad, badi);
    }
    return PSAGG_OK;
}

PSAGG_FP_ENTRY_POINTS

/* ---------------- maxmin ---------------- */

typedef struct mm_ctx {
    uint32_t b, gbytes; /* bits; payload bytes per 16 elements (2b) */
    size_t n, nb, plen;
    __m512i ctrl, shifts, lmask; /* unpack */
    __m512 Lf;
    uint64_t pext_mask; /* b low bits of every byte */
} mm_ctx;

static void mm_init(mm_ctx *t, const psagg_codec *c, size_t n)
{
    uint32_t b = c->bits;
    uint8_t ctrl[64];
    uint32_t sh[16];
    t->b = b;
    t->gbytes = 2 * b;
    t->n = n;
    t->nb = psagg__mm_nbuckets(n, c->bucket);
    t->plen = psagg__mm_payload_bytes(n, b);
    for (unsigned j = 0; j < 16; j++) {
        unsigned bit = j * b, off = bit >> 3, s = bit & 7;
        ctrl[4 * j] = (uint8_t)off;
        ctrl[4 * j + 1] = (uint8_t)(s + b > 8 ? off + 1 : 0x80);
        ctrl[4 * j + 2] = 0x80;
        ctrl[4 * j + 3] = 0x80;
        sh[j] = s;
    }
    t->ctrl = _mm512_loadu_si512(ctrl);
    t->shifts = _mm512_loadu_si512(sh);
    t->lmask = _mm512_set1_epi32((int)((1u << b) - 1));
    t->Lf = _mm512_set1_ps((float)((1u << b) - 1));
    t->pext_mask = 0x0101010101010101ull * ((1u << b) - 1);
}

/* Pack 16 levels (lanes beyond n already 0) into 2b bytes at p; room = bytes writable.
 * One byte per level (vpmovdb), then BMI2 pext keeps the b low bits of each byte. */
static inline void mm_pack(uint32_t b, uint64_t pext_mask, __m512i q, uint8_t *p, size_t room)
{
    __m128i bytes = _mm512_cvtepi32_epi8(q);
    uint64_t a = _pext_u64((uint64_t)_mm_cvtsi128_si64(bytes), pext_mask);
    uint64_t c = _pext_u64((uint64_t)_mm_extract_epi64(bytes, 1), pext_mask);
    uint8_t stage[16];
    if (b <= 4) {
        uint64_t g = a | (c << (8 * b));
        if (room >= 8) {
            memcpy(p, &g, 8); /* bytes past 2b are zero; rewritten by the next group */
            return;
        }
        memcpy(stage, &g, 8);
    } else {
        if (room >= b + 8) {
            memcpy(p, &a, 8);
            memcpy(p + b, &c, 8);
            return;
        }
        memcpy(stage, &a, 8);
        memcpy(stage + b, &c, 8);
    }
    memcpy(p, stage, room < 2 * b ? room : 2 * b);
}

/* The 16 (or avail < 16) payload bytes at p, in every 128-bit lane. */
static inline __m512i mm_bytes(const uint8_t *p, size_t avail)
{
    if (avail >= 16)
        return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    return _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8((__mmask16)((1u << avail) - 1), p));
}

/* Level of each lane in its low b bits, garbage above (no mask): an index for vpermps. */
static inline __m512i mm_spread(const mm_ctx *t, __m512i w)
{
    return _mm512_srlv_epi32(_mm512_shuffle_epi8(w, t->ctrl), t->shifts);
}

/* Called after pass 1 filled acc[0..len): bad check, lo/hi, meta, then pass 2. */
static psagg_status mm_finish_bucket(const mm_ctx *t, const psagg_codec *c, float *acc, size_t len,
                                     size_t base, __m512 vmin, __m512 vmax, __mmask16 bad_any,
                                     float *r, psagg__rng_key key, uint8_t *out, size_t *badi)
{
    float lo, hi, range, scale = 0.0f, inv = 0.0f;
    uint8_t *meta = out + 8 * (base / c->bucket), *payload = out + 8 * t->nb;
    __m512 vlo, vscale, vinv, vhalf = _mm512_set1_ps(0.5f);
    __m512i k0 = _mm512_set1_epi32((int)key.k0), k1 = _mm512_set1_epi32((int)key.k1);
    __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    int sr = c->rounding == PSAGG_ROUND_STOCHASTIC;

    if (bad_any) {
        for (size_t j = 0; j < len; j += W) {
            __m512 v = _mm512_loadu_ps(acc + j);
            __mmask16 bad = _mm512_mask_cmp_ps_mask(
                lane_mask(len - j), abs16(v), _mm512_set1_ps(PSAGG_MAXMIN_MAX_ABS), _CMP_NLT_UQ);
            if (bad)
                return report_bad(c, base + j, v, bad, badi);
        }
    }
    lo = _mm512_reduce_min_ps(vmin);
    hi = _mm512_reduce_max_ps(vmax);
    if (lo == 0.0f) { /* -0 < +0: lo is -0 iff some value is -0 */
        __mmask16 neg = 0;
        for (size_t j = 0; j < len; j += W)
            neg |= _mm512_mask_cmpeq_epi32_mask(lane_mask(len - j), _mm512_loadu_si512(acc + j),
                                                _mm512_set1_epi32((int)0x80000000u));
        lo = neg ? -0.0f : 0.0f;
    }
    range = hi - lo;
    if (!(range < PSAGG_MAXMIN_MIN_RANGE)) {
        scale = range / (float)((1u << c->bits) - 1);
        inv = 1.0f / scale;
    }
    memcpy(meta, &scale, 4);
    memcpy(meta + 4, &lo, 4);
    vlo = _mm512_set1_ps(lo);
    vscale = _mm512_set1_ps(scale);
    vinv = _mm512_set1_ps(inv);
    const uint32_t b = t->b, gbytes = t->gbytes;
    const uint64_t pext_mask = t->pext_mask;
    const size_t plen = t->plen;
    const __m512 Lf = t->Lf;
    for (size_t j = 0; j < len; j += W) {
        size_t k = base + j, off = (k / W) * gbytes;
        __mmask16 m = lane_mask(len - j);
        __m512 v = _mm512_loadu_ps(acc + j);
        __m512 tt = _mm512_mul_ps(_mm512_sub_ps(v, vlo), vinv);
        __m512 u = sr ? psagg__avx512_rng16(
                            _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)k), iota), k0, k1)
                      : vhalf;
        __m512i q = _mm512_maskz_cvttps_epi32(m, _mm512_min_ps(_mm512_add_ps(tt, u), Lf));
        mm_pack(b, pext_mask, q, payload + off, plen - off);
        if (r) {
            __m512 y = _mm512_add_ps(vlo, _mm512_mul_ps(vscale, _mm512_cvtepi32_ps(q)));
            _mm512_mask_storeu_ps(r + j, m, _mm512_sub_ps(v, y));
        }
    }
    return PSAGG_OK;
}

static void mm_zero_padding(const mm_ctx *t, uint8_t *out)
{
    size_t covered = ((t->n + W - 1) / W) * t->gbytes;
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

    if (psagg__avx512_bytes_ok(c))
        return psagg__avx512_bytes_encode(c, x, residual, n, key, out, ws, badi);
    mm_init(&t, c, n);
    for (size_t base = 0; base < n && st == PSAGG_OK; base += B) {
        size_t len = n - base < B ? n - base : B;
        const float *xb = x + base;
        float *rb = residual ? residual + base : NULL;
        __m512 vmin = _mm512_set1_ps(INFINITY), vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 bad_any = 0;
        __m512 lim = _mm512_set1_ps(PSAGG_MAXMIN_MAX_ABS);
        for (size_t j = 0; j < len; j += W) {
            __mmask16 m = lane_mask(len - j);
            __m512 v = _mm512_maskz_loadu_ps(m, xb + j);
            if (rb)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rb + j));
            _mm512_store_ps(acc + j, v);
            bad_any |= _mm512_mask_cmp_ps_mask(m, abs16(v), lim, _CMP_NLT_UQ);
            vmin = _mm512_mask_min_ps(vmin, m, vmin, v);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
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
    const __m512 f = _mm512_set1_ps(factor);
    mm_ctx t;
    const uint8_t *payload;
    mm_init(&t, c, n);
    payload = in + 8 * t.nb;
    for (size_t base = 0; base < n; base += c->bucket) {
        size_t len = n - base < c->bucket ? n - base : c->bucket;
        const uint8_t *meta = in + 8 * (base / c->bucket);
        float scale, lo;
        __m512 vs, vl;
        memcpy(&scale, meta, 4);
        memcpy(&lo, meta + 4, 4);
        vs = _mm512_set1_ps(scale);
        vl = _mm512_set1_ps(lo);
        for (size_t j = 0; j < len; j += W) {
            size_t k = base + j, off = (k / W) * t.gbytes, avail = t.plen - off;
            __mmask16 m = lane_mask(len - j);
            __m512i q = _mm512_and_si512(mm_spread(&t, mm_bytes(payload + off, avail)), t.lmask);
            __m512 y = _mm512_add_ps(vl, _mm512_mul_ps(vs, _mm512_cvtepi32_ps(q)));
            _mm512_mask_storeu_ps(out + k, m, dec_apply(op, out + k, m, y, f));
        }
    }
}

_Static_assert(2 * sizeof(__m512) == PSAGG_SCRATCH_TAB, "two decode tables per input");

static psagg_status agg_mm(const psagg_codec *c, const uint8_t *const *in, size_t n_in, size_t n,
                           float *residual, psagg__rng_key key, uint8_t *out, psagg__scratch *ws,
                           size_t *badi)
{
    size_t B = c->bucket;
    float *acc = ws->acc, *mt = ws->meta;
    const uint8_t **pay = ws->pay;
    __m512 *tab = ws->tab; /* two tables per input */
    __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    psagg_status st = PSAGG_OK;
    mm_ctx t;

    if (n_in > 0 && psagg__avx512_bytes_ok(c))
        return psagg__avx512_bytes_aggregate(c, in, n_in, n, residual, key, out, ws, badi);
    mm_init(&t, c, n);
    for (size_t i = 0; i < n_in; i++)
        pay[i] = in[i] + 8 * t.nb;
    for (size_t base = 0; base < n && st == PSAGG_OK; base += B) {
        size_t len = n - base < B ? n - base : B, mi = base / B;
        float *rb = residual ? residual + base : NULL;
        __m512 vmin = _mm512_set1_ps(INFINITY), vmax = _mm512_set1_ps(-INFINITY);
        __m512 lim = _mm512_set1_ps(PSAGG_MAXMIN_MAX_ABS);
        __mmask16 bad_any = 0;
        for (size_t i = 0; i < n_in; i++)
            memcpy(mt + 2 * i, in[i] + 8 * mi, 8); /* scale, lo */
        if (t.b <= 5) {
            /* decode tables: entry e = lo + scale * (float)(e mod 2^b), e = 0..31 */
            __m512i lm = _mm512_set1_epi32((int)((1u << t.b) - 1));
            __m512 e0 = _mm512_cvtepi32_ps(_mm512_and_si512(iota, lm));
            __m512 e1 = _mm512_cvtepi32_ps(
                _mm512_and_si512(_mm512_add_epi32(iota, _mm512_set1_epi32(16)), lm));
            for (size_t i = 0; i < n_in; i++) {
                __m512 sc = _mm512_set1_ps(mt[2 * i]), lo = _mm512_set1_ps(mt[2 * i + 1]);
                tab[2 * i] = _mm512_add_ps(lo, _mm512_mul_ps(sc, e0));
                tab[2 * i + 1] = _mm512_add_ps(lo, _mm512_mul_ps(sc, e1));
            }
        }
        for (size_t j = 0; j < len; j += W) {
            size_t k = base + j, off = (k / W) * t.gbytes, avail = t.plen - off;
            __mmask16 m = lane_mask(len - j);
            __m512 s = _mm512_setzero_ps();
            if (t.b <= 4) { /* y = table[q]: the index's bits >= b are ignored (periodic) */
                for (size_t i = 0; i < n_in; i++) {
                    __m512i q = mm_spread(&t, mm_bytes(pay[i] + off, avail));
                    s = _mm512_add_ps(s, _mm512_permutexvar_ps(q, tab[2 * i]));
                }
            } else if (t.b == 5) {
                for (size_t i = 0; i < n_in; i++) {
                    __m512i q = mm_spread(&t, mm_bytes(pay[i] + off, avail));
                    s = _mm512_add_ps(s, _mm512_permutex2var_ps(tab[2 * i], q, tab[2 * i + 1]));
                }
            } else {
                for (size_t i = 0; i < n_in; i++) {
                    __m512i q =
                        _mm512_and_si512(mm_spread(&t, mm_bytes(pay[i] + off, avail)), t.lmask);
                    __m512 y = _mm512_add_ps(
                        _mm512_set1_ps(mt[2 * i + 1]),
                        _mm512_mul_ps(_mm512_set1_ps(mt[2 * i]), _mm512_cvtepi32_ps(q)));
                    s = _mm512_add_ps(s, y);
                }
            }
            if (rb)
                s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, rb + j));
            _mm512_store_ps(acc + j, s);
            bad_any |= _mm512_mask_cmp_ps_mask(m, abs16(s), lim, _CMP_NLT_UQ);
            vmin = _mm512_mask_min_ps(vmin, m, vmin, s);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, s);
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
    const __m512 big = _mm512_set1_ps(0x1p126f);
    uint32_t j = first;
    for (; j + 16 <= n; j += 16) {
        __m512 a = _mm512_loadu_ps(x + j);
        if (r)
            a = _mm512_add_ps(a, _mm512_loadu_ps(r + j));
        /* |v| < 2^126, false for NaN: every lane fine */
        if (_mm512_cmp_ps_mask(_mm512_abs_ps(a), big, _CMP_LT_OQ) != 0xFFFF)
            break;
        _mm512_storeu_ps(v + j, a);
    }
    /* the tail, or the vector with a bad lane: the scalar pass finds it */
    return psagg__topk_scalar_passes.load(x, r, j, n, v);
}

static uint32_t topk_filter(const float *v, uint32_t first, uint32_t n, uint32_t mask,
                            uint32_t prefix, uint32_t *out)
{
    const __m512i vm = _mm512_set1_epi32((int)(mask & 0x7FFFFFFFu)),
                  vp = _mm512_set1_epi32((int)prefix);
    uint32_t j = first, m = 0;
    for (; j + 16 <= n; j += 16) {
        unsigned b = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(v + j), vm), vp);
        for (; b; b &= b - 1)
            out[m++] = j + (uint32_t)__builtin_ctz(b);
    }
    return m + psagg__topk_scalar_passes.filter(v, j, n, mask, prefix, out + m);
}

static uint32_t topk_keep(const float *v, uint32_t first, uint32_t n, uint32_t want, uint32_t ties,
                          uint32_t *idx)
{
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), vw = _mm512_set1_epi32((int)want);
    uint32_t j = first, t = 0;
    for (; j + 16 <= n; j += 16) { /* (magnitudes are below 2^31: a signed compare orders them) */
        __m512i u = _mm512_and_si512(_mm512_loadu_si512(v + j), absm);
        unsigned gt = _mm512_cmpgt_epi32_mask(u, vw), eq = _mm512_cmpeq_epi32_mask(u, vw);
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
    const __m512i m = _mm512_set1_epi8((char)((1u << bits) - 1));
    const __m512i m4 = _mm512_set1_epi8((char)(((1u << bits) - 1) * 17)); /* w = 4: two planes */
    if (width == 4) { /* planes j and j + P/2 in one run: each byte's two nibbles, added whole */
        for (size_t g = 0; g < groups; g++) {
            __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
            for (size_t k = 0; k < n_in; k++) {
                __m512i x = _mm512_loadu_si512(in[k] + g * 64);
                for (uint32_t j = 0; j < P / 2; j++)
                    acc[j] = _mm512_add_epi8(
                        acc[j], _mm512_and_si512(
                                    _mm512_srl_epi16(x, _mm_cvtsi32_si128((int)(j * bits))), m4));
            }
            for (uint32_t j = 0; j < P / 2; j++)
                _mm512_storeu_si512(out + g * 32 * P + j * 64, acc[j]);
        }
        return;
    }
    for (size_t g = 0; g < groups; g++) {
        __m512i acc[8];
        for (uint32_t a = 0; a < 8; a++)
            acc[a] = _mm512_setzero_si512();
        for (size_t k = 0; k < n_in; k++) {
            __m512i x = _mm512_loadu_si512(in[k] + g * 64);
            for (uint32_t j = 0; j < P; j++) {
                __m512i p =
                    _mm512_and_si512(_mm512_srl_epi16(x, _mm_cvtsi32_si128((int)(j * bits))), m);
                if (width == 8) {
                    acc[j] = _mm512_add_epi8(acc[j], p);
                } else {
                    acc[2 * j] = _mm512_add_epi16(acc[2 * j],
                                                  _mm512_cvtepu8_epi16(_mm512_castsi512_si256(p)));
                    acc[2 * j + 1] = _mm512_add_epi16(
                        acc[2 * j + 1], _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(p, 1)));
                }
            }
        }
        for (uint32_t j = 0; j < P; j++) {
            if (width == 8) {
                _mm512_storeu_si512(out + g * 64 * P + j * 64, acc[j]);
            } else {
                _mm512_storeu_si512(out + 2 * (g * 64 * P + j * 64), acc[2 * j]);
                _mm512_storeu_si512(out + 2 * (g * 64 * P + j * 64) + 64, acc[2 * j + 1]);
            }
        }
    }
}

PSAGG_THC_FOLD_ENTRY_POINT

const psagg__codec_impl psagg__impl_avx512 = {
    .name = "avx512",
    .fp_encode = enc_fp,
    .fp_decode = dec_fp,
    .fp_aggregate = agg_fp,
    .mm_encode = enc_mm,
    .mm_decode = dec_mm,
    .mm_aggregate = agg_mm,
    .topk = &topk_passes,
    .thc_fold = thc_fold,
    .thc_worker = &psagg__thc_worker_avx512,
};

#else /* not built for AVX-512 */
const psagg__codec_impl psagg__impl_avx512 = {.name = "avx512"};
#endif
