/*
 * cpu/avx512.c - AVX-512 (F, BW, VL, DQ) codec paths, 16 elements per vector. Bit-identical
 * to scalar.c: the same binary32 operations in the same order, no FMA. Tails are handled by
 * masked loads and stores through the same vector code.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) &&                        \
    defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>

#define W 16

static inline __mmask16 lane_mask(size_t rem)
{
    return rem >= W ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1);
}

static inline __m512 abs16(__m512 v)
{
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

/* Report the first bad lane (bits set in bad) of v, element index k0 + lane. */
static psagg_status report_bad(const psagg_codec *c, size_t k0, __m512 v, __mmask16 bad,
                               size_t *badi)
{
    float tmp[W];
    unsigned lane = (unsigned)__builtin_ctz((unsigned)bad);
    _mm512_storeu_ps(tmp, v);
    return psagg_codec_bad_value(c, k0 + lane, tmp[lane], badi);
}

/* ---------------- fp formats ---------------- */

static inline __m512 load_fp(psagg_codec_id id, const uint8_t *in, size_t k, __mmask16 m)
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
static inline __mmask16 store_fp(psagg_codec_id id, __m512 v, __mmask16 m, uint8_t *out, size_t k,
                                 float *r)
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

static psagg_status enc_fp(const psagg_codec *c, const float *x, float *r, size_t n, uint8_t *out,
                           size_t *badi)
{
    for (size_t k = 0; k < n; k += W) {
        __mmask16 m = lane_mask(n - k), bad;
        __m512 v = _mm512_maskz_loadu_ps(m, x + k);
        if (r)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r + k));
        bad = store_fp(c->id, v, m, out, k, r ? r + k : NULL);
        if (bad)
            return report_bad(c, k, v, bad, badi);
    }
    return PSAGG_OK;
}

static void dec_fp(const psagg_codec *c, const uint8_t *in, size_t n, float *out, int acc)
{
    for (size_t k = 0; k < n; k += W) {
        __mmask16 m = lane_mask(n - k);
        __m512 y = load_fp(c->id, in, k, m);
        if (acc)
            y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + k), y);
        _mm512_mask_storeu_ps(out + k, m, y);
    }
}

static psagg_status agg_fp(const psagg_codec *c, const uint8_t *const *in, size_t n_in, size_t n,
                           float *r, uint8_t *out, size_t *badi)
{
    for (size_t k = 0; k < n; k += W) {
        __mmask16 m = lane_mask(n - k), bad;
        __m512 s = _mm512_setzero_ps();
        for (size_t i = 0; i < n_in; i++)
            s = _mm512_add_ps(s, load_fp(c->id, in[i], k, m));
        if (r)
            s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, r + k));
        bad = store_fp(c->id, s, m, out, k, r ? r + k : NULL);
        if (bad)
            return report_bad(c, k, s, bad, badi);
    }
    return PSAGG_OK;
}

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
    t->nb = psagg_mm_nbuckets(n, c->bucket);
    t->plen = psagg_mm_payload_bytes(n, b);
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

static inline __m512i fmix16(__m512i h)
{
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85EBCA6Bu));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xC2B2AE35u));
    return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

static inline __m512 rng16(__m512i idx, __m512i k0, __m512i k1)
{
    __m512i h = fmix16(_mm512_xor_si512(fmix16(_mm512_add_epi32(idx, k0)), k1));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(0x1p-24f));
}

typedef struct mm_bucket_stats {
    __m512 vmin, vmax;
    __mmask16 bad_any;
} mm_bucket_stats;

/* Called after pass 1 filled acc[0..len): bad check, lo/hi, meta, then pass 2. */
static psagg_status mm_finish_bucket(const mm_ctx *t, const psagg_codec *c, float *acc, size_t len,
                                     size_t base, __m512 vmin, __m512 vmax, __mmask16 bad_any,
                                     float *r, psagg_rng_key key, uint8_t *out, size_t *badi)
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
        __m512 u =
            sr ? rng16(_mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)k), iota), k0, k1) : vhalf;
        __m512i q = _mm512_maskz_cvttps_epi32(m, _mm512_min_ps(_mm512_add_ps(tt, u), Lf));
        mm_pack(b, pext_mask, q, payload + off, plen - off);
        if (r) {
            __m512 y = _mm512_add_ps(vlo, _mm512_mul_ps(vscale, _mm512_cvtepi32_ps(q)));
            _mm512_mask_storeu_ps(r + j, m, _mm512_sub_ps(v, y));
        }
    }
    return PSAGG_OK;
}

/* ---------------- maxmin, b in {1, 2, 4, 8}: whole bytes per group ----------------
 *
 * Every 16 payload bytes hold one group of G = 128 / b elements. A group is kept in P = 8 / b
 * vectors in an interleaved layout: vector s, lane j holds element P*j + s of the group, so
 * that one vpmovzxbd of the 16 bytes, shifted right by s*b, puts vector s's levels in the low
 * bits of each lane, and packing is q_0 | q_1 << b | ... then vpmovdb. The sum, min/max and
 * every per-element operation are layout-independent; the RNG index of each lane follows the
 * layout; x and residuals (natural order) are (de)interleaved with vpermt2ps. A bucket is a
 * whole number of groups (B % G == 0, checked by fa_ok).
 */

#define FA static inline __attribute__((always_inline))

/* payload bits per dword lane (group = 2*D bytes, P = D/b vectors), 0: not this path */
static int fa_ok(const psagg_codec *c)
{
    uint32_t b = c->bits;
    if (b != 1 && b != 2 && b != 4 && b != 8)
        return 0;
    if (b == 4 && c->bucket % 128 == 0)
        return 32; /* 64-byte groups: the dwords are the indices, no vpmovzxbd */
    return c->bucket % (128 / b) == 0 ? 8 : 0;
}

static inline __m512 even16(__m512 a, __m512 b)
{
    return _mm512_permutex2var_ps(
        a, _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0), b);
}

static inline __m512 odd16(__m512 a, __m512 b)
{
    return _mm512_permutex2var_ps(
        a, _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1), b);
}

static inline __m512 lo16(__m512 a, __m512 b)
{
    return _mm512_permutex2var_ps(
        a, _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0), b);
}

static inline __m512 hi16(__m512 a, __m512 b)
{
    return _mm512_permutex2var_ps(
        a, _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8), b);
}

/* natural order (v[t] lane l = element 16t + l) -> layout (v[s] lane j = element P*j + s) */
FA void fa_deint(__m512 *v, const int P)
{
    for (int P2 = P; P2 > 1; P2 >>= 1) {
        __m512 w[16];
#pragma GCC unroll 16
        for (int k = 0; k < P / 2; k++) {
            w[k] = even16(v[2 * k], v[2 * k + 1]);
            w[P / 2 + k] = odd16(v[2 * k], v[2 * k + 1]);
        }
#pragma GCC unroll 16
        for (int k = 0; k < P; k++)
            v[k] = w[k];
    }
}

/* inverse of fa_deint */
FA void fa_int(__m512 *v, const int P)
{
    for (int P2 = P; P2 > 1; P2 >>= 1) {
        __m512 w[16];
#pragma GCC unroll 16
        for (int k = 0; k < P / 2; k++) {
            w[2 * k] = lo16(v[k], v[P / 2 + k]);
            w[2 * k + 1] = hi16(v[k], v[P / 2 + k]);
        }
#pragma GCC unroll 16
        for (int k = 0; k < P; k++)
            v[k] = w[k];
    }
}

/* lanes of layout vector s that hold one of the first rem elements of the group */
FA __mmask16 fa_lmask(const int P, int s, size_t rem)
{
    __m512i e = _mm512_add_epi32(
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(P)),
        _mm512_set1_epi32(s));
    return _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32((int)rem));
}

/* the payload bytes of a group as dwords (D = 8: 16 bytes zero-extended; D = 32: 64 bytes),
 * only avail bytes readable */
FA __m512i fa_load(const int D, const uint8_t *p, int tail, size_t avail)
{
    if (D == 32) {
        if (tail && avail < 64)
            return _mm512_maskz_loadu_epi8(((__mmask64)1 << avail) - 1, p);
        return _mm512_loadu_si512(p);
    }
    if (tail && avail < 16)
        return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << avail) - 1), p));
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* One RNG vector: ctr = k + k0 per lane. */
static inline __m512 rng16c(__m512i ctr, __m512i k1)
{
    __m512i h = ctr;
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85EBCA6Bu));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xC2B2AE35u));
    h = _mm512_ternarylogic_epi32(h, _mm512_srli_epi32(h, 16), k1, 0x96); /* h ^ h>>16 ^ k1 */
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85EBCA6Bu));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xC2B2AE35u));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(0x1p-24f));
}

typedef struct fa_q {
    __m512 vlo, vinv, vscale, Lf;
    __m512i k1;
} fa_q;

/*
 * Pass 2 for one group: quantize the layout vectors at a (first rem elements valid), pack
 * into p (room bytes writable), residual (natural order, group start r) if r. ctr = k0 + the
 * RNG index of lane 0 of vector 0, plus P*j per lane.
 */
FA void fa_quant(const int b, const int D, const int sr, const int tail, const fa_q *z,
                 const float *a, size_t rem, __m512i ctr, uint8_t *p, size_t room, float *r)
{
    const int P = D / b;
    __m512i packed = _mm512_setzero_si512();
    __m512 rv[16];
#pragma GCC unroll 16
    for (int s = 0; s < P; s++) {
        __m512 v = _mm512_load_ps(a + 16 * s);
        __m512 t = _mm512_mul_ps(_mm512_sub_ps(v, z->vlo), z->vinv);
        __m512 u =
            sr ? rng16c(_mm512_add_epi32(ctr, _mm512_set1_epi32(s)), z->k1) : _mm512_set1_ps(0.5f);
        __m512i q = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_add_ps(t, u), z->Lf));
        if (tail)
            q = _mm512_maskz_mov_epi32(fa_lmask(P, s, rem), q);
        packed = s ? _mm512_or_si512(packed, _mm512_slli_epi32(q, s * b)) : q;
        if (r)
            rv[s] = _mm512_sub_ps(
                v, _mm512_add_ps(z->vlo, _mm512_mul_ps(z->vscale, _mm512_cvtepi32_ps(q))));
    }
    if (D == 32) {
        if (tail && room < 64)
            _mm512_mask_storeu_epi8(p, ((__mmask64)1 << room) - 1, packed);
        else
            _mm512_storeu_si512(p, packed);
    } else if (tail && room < 16) {
        _mm_mask_storeu_epi8(p, (__mmask16)((1u << room) - 1), _mm512_cvtepi32_epi8(packed));
    } else {
        _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(packed));
    }
    if (r) {
        fa_int(rv, P);
#pragma GCC unroll 16
        for (int t = 0; t < P; t++) {
            if (tail)
                _mm512_mask_storeu_ps(r + 16 * t, lane_mask(rem > 16u * t ? rem - 16u * t : 0),
                                      rv[t]);
            else
                _mm512_storeu_ps(r + 16 * t, rv[t]);
        }
    }
}

/* layout position of element e of a bucket */
static inline size_t fa_pos(uint32_t b, uint32_t D, size_t e)
{
    size_t P = D / b, G = 16 * P, g = e / G, i = e % G;
    return g * G + (i % P) * 16 + i / P;
}

/*
 * Finish a bucket whose sums (layout order) are in acc: range check (bad_any: some value may
 * be out of range; found and reported in element order), lo/hi, meta, then pass 2.
 */
FA psagg_status fa_finish(const int b, const int D, const int sr, const psagg_codec *c, size_t n,
                          size_t nb, size_t plen, float *acc, size_t len, size_t base, __m512 vmin,
                          __m512 vmax, int bad_any, float *r, psagg_rng_key key, uint8_t *out,
                          size_t *badi)
{
    const int P = D / b, G = 16 * P, GB = 2 * D;
    float lo, hi, range, scale = 0.0f, inv = 0.0f;
    uint8_t *meta = out + 8 * (base / c->bucket), *payload = out + 8 * nb;
    fa_q z;
    __m512i ctr;
    size_t j;

    (void)n;
    lo = _mm512_reduce_min_ps(vmin);
    hi = _mm512_reduce_max_ps(vmax);
    if (bad_any || !(hi < PSAGG_MAXMIN_MAX_ABS) || !(lo > -PSAGG_MAXMIN_MAX_ABS)) {
        for (size_t e = 0; e < len; e++) {
            float v = acc[fa_pos((uint32_t)b, (uint32_t)D, e)];
            if (!(fabsf(v) < PSAGG_MAXMIN_MAX_ABS))
                return psagg_codec_bad_value(c, base + e, v, badi);
        }
    }
    if (lo == 0.0f) { /* -0 < +0: lo is -0 iff some value is -0 (tail lanes beyond len: 0) */
        __mmask16 neg = 0;
        size_t span = (len + G - 1) / G * G;
        for (j = 0; j < span; j += W)
            neg |= _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(acc + j),
                                           _mm512_set1_epi32((int)0x80000000u));
        lo = neg ? -0.0f : 0.0f;
    }
    range = hi - lo;
    if (!(range < PSAGG_MAXMIN_MIN_RANGE)) {
        scale = range / (float)((1u << b) - 1);
        inv = 1.0f / scale;
    }
    memcpy(meta, &scale, 4);
    memcpy(meta + 4, &lo, 4);
    z.vlo = _mm512_set1_ps(lo);
    z.vscale = _mm512_set1_ps(scale);
    z.vinv = _mm512_set1_ps(inv);
    z.Lf = _mm512_set1_ps((float)((1u << b) - 1));
    z.k1 = _mm512_set1_epi32((int)key.k1);
    ctr = _mm512_add_epi32(
        _mm512_set1_epi32((int)(key.k0 + (uint32_t)base)),
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(P)));
    {
        size_t full = len / G * G, off = base / G * GB;
        for (j = 0; j < full; j += G, off += GB) {
            fa_quant(b, D, sr, 0, &z, acc + j, G, ctr, payload + off, GB, r ? r + j : NULL);
            ctr = _mm512_add_epi32(ctr, _mm512_set1_epi32(G));
        }
        if (j < len)
            fa_quant(b, D, sr, 1, &z, acc + j, len - j, ctr, payload + off, plen - off,
                     r ? r + j : NULL);
    }
    return PSAGG_OK;
}

/* Pass 1 of encode for one group: v = x (+ r), range flags, min/max, layout into a. */
FA void fa_enc_load(const int b, const int D, const int tail, const float *x, const float *r,
                    size_t rem, float *a, __m512 *vmin, __m512 *vmax, __mmask16 *bad)
{
    const int P = D / b;
    __m512 v[16];
    __m512 lim = _mm512_set1_ps(PSAGG_MAXMIN_MAX_ABS);
#pragma GCC unroll 16
    for (int t = 0; t < P; t++) {
        __mmask16 m = tail ? lane_mask(rem > 16u * t ? rem - 16u * t : 0) : (__mmask16)0xFFFF;
        v[t] = tail ? _mm512_maskz_loadu_ps(m, x + 16 * t) : _mm512_loadu_ps(x + 16 * t);
        if (r)
            v[t] = _mm512_add_ps(v[t], tail ? _mm512_maskz_loadu_ps(m, r + 16 * t)
                                            : _mm512_loadu_ps(r + 16 * t));
        *bad |= _mm512_mask_cmp_ps_mask(m, abs16(v[t]), lim, _CMP_NLT_UQ);
        *vmin = _mm512_mask_min_ps(*vmin, m, *vmin, v[t]);
        *vmax = _mm512_mask_max_ps(*vmax, m, *vmax, v[t]);
    }
    fa_deint(v, P);
#pragma GCC unroll 16
    for (int s = 0; s < P; s++)
        _mm512_store_ps(a + 16 * s, v[s]);
}

FA psagg_status fa_encode(const int b, const int D, const int sr, const psagg_codec *c,
                          const float *x, float *residual, size_t n, psagg_rng_key key,
                          uint8_t *out, float *acc, size_t *badi)
{
    const size_t G = 16 * (D / b), B = c->bucket;
    size_t nb = psagg_mm_nbuckets(n, c->bucket), plen = psagg_mm_payload_bytes(n, (uint32_t)b);
    for (size_t base = 0; base < n; base += B) {
        size_t len = n - base < B ? n - base : B, j, full = len / G * G;
        const float *xb = x + base;
        float *rb = residual ? residual + base : NULL;
        __m512 vmin = _mm512_set1_ps(INFINITY), vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 bad = 0;
        psagg_status st;
        for (j = 0; j < full; j += G)
            fa_enc_load(b, D, 0, xb + j, rb ? rb + j : NULL, G, acc + j, &vmin, &vmax, &bad);
        if (j < len)
            fa_enc_load(b, D, 1, xb + j, rb ? rb + j : NULL, len - j, acc + j, &vmin, &vmax, &bad);
        st = fa_finish(b, D, sr, c, n, nb, plen, acc, len, base, vmin, vmax, bad != 0, rb, key, out,
                       badi);
        if (st != PSAGG_OK)
            return st;
    }
    return PSAGG_OK;
}

/*
 * Pass 1 of aggregate for one group: S = sum over inputs (table lookups for b <= 4), plus the
 * residual (natural order at r), into a in layout order; min/max; range flags when r (without
 * a residual the sum of finite values cannot be NaN, so fa_finish's lo/hi test suffices).
 */
FA void fa_agg_sum(const int b, const int D, const int tail, const uint8_t *const *pay, size_t n_in,
                   size_t off, size_t avail, const __m512 *tab, const float *mt, const float *r,
                   size_t rem, float *a, __m512 *vmin, __m512 *vmax, __mmask16 *bad)
{
    const int P = D / b;
    __m512 S[16];
    __m512i w = fa_load(D, pay[0] + off, tail, avail);
    if (b <= 4) {
#pragma GCC unroll 16
        for (int s = 0; s < P; s++) /* 0 + y == y: y = lo + scale*q is never -0 */
            S[s] = _mm512_permutexvar_ps(_mm512_srli_epi32(w, s * b), tab[0]);
        for (size_t i = 1; i < n_in; i++) {
            w = fa_load(D, pay[i] + off, tail, avail);
#pragma GCC unroll 16
            for (int s = 0; s < P; s++)
                S[s] =
                    _mm512_add_ps(S[s], _mm512_permutexvar_ps(_mm512_srli_epi32(w, s * b), tab[i]));
        }
    } else {
        S[0] = _mm512_add_ps(_mm512_set1_ps(mt[1]),
                             _mm512_mul_ps(_mm512_set1_ps(mt[0]), _mm512_cvtepi32_ps(w)));
        for (size_t i = 1; i < n_in; i++) {
            w = fa_load(D, pay[i] + off, tail, avail);
            S[0] = _mm512_add_ps(S[0], _mm512_add_ps(_mm512_set1_ps(mt[2 * i + 1]),
                                                     _mm512_mul_ps(_mm512_set1_ps(mt[2 * i]),
                                                                   _mm512_cvtepi32_ps(w))));
        }
    }
    if (r) {
        __m512 R[16];
        __m512 lim = _mm512_set1_ps(PSAGG_MAXMIN_MAX_ABS);
#pragma GCC unroll 16
        for (int t = 0; t < P; t++)
            R[t] = tail ? _mm512_maskz_loadu_ps(lane_mask(rem > 16u * t ? rem - 16u * t : 0),
                                                r + 16 * t)
                        : _mm512_loadu_ps(r + 16 * t);
        fa_deint(R, P);
#pragma GCC unroll 16
        for (int s = 0; s < P; s++) {
            __mmask16 m = tail ? fa_lmask(P, s, rem) : (__mmask16)0xFFFF;
            S[s] = _mm512_add_ps(S[s], R[s]);
            *bad |= _mm512_mask_cmp_ps_mask(m, abs16(S[s]), lim, _CMP_NLT_UQ);
        }
    }
#pragma GCC unroll 16
    for (int s = 0; s < P; s++) {
        _mm512_store_ps(a + 16 * s, S[s]);
        if (tail) {
            __mmask16 m = fa_lmask(P, s, rem);
            *vmin = _mm512_mask_min_ps(*vmin, m, *vmin, S[s]);
            *vmax = _mm512_mask_max_ps(*vmax, m, *vmax, S[s]);
        } else {
            *vmin = _mm512_min_ps(*vmin, S[s]);
            *vmax = _mm512_max_ps(*vmax, S[s]);
        }
    }
}

FA psagg_status fa_aggregate(const int b, const int D, const int sr, const psagg_codec *c,
                             const uint8_t *const *in, const uint8_t *const *pay, size_t n_in,
                             size_t n, float *residual, psagg_rng_key key, uint8_t *out, float *acc,
                             __m512 *tab, float *mt, size_t *badi)
{
    const size_t G = 16 * (D / b), GB = 2 * D, B = c->bucket;
    size_t nb = psagg_mm_nbuckets(n, c->bucket), plen = psagg_mm_payload_bytes(n, (uint32_t)b);
    const __m512 e = _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32((1 << b) - 1)));
    for (size_t base = 0; base < n; base += B) {
        size_t len = n - base < B ? n - base : B, mi = base / B, j, full = len / G * G;
        size_t off = base / G * GB;
        float *rb = residual ? residual + base : NULL;
        __m512 vmin = _mm512_set1_ps(INFINITY), vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 bad = 0;
        psagg_status st;
        for (size_t i = 0; i < n_in; i++)
            memcpy(mt + 2 * i, in[i] + 8 * mi, 8); /* scale, lo */
        if (b <= 4)
            for (size_t i = 0; i < n_in; i++) /* entry q: lo + scale * (float)(q mod 2^b) */
                tab[i] = _mm512_add_ps(_mm512_set1_ps(mt[2 * i + 1]),
                                       _mm512_mul_ps(_mm512_set1_ps(mt[2 * i]), e));
        for (j = 0; j < full; j += G, off += GB)
            fa_agg_sum(b, D, 0, pay, n_in, off, GB, tab, mt, rb ? rb + j : NULL, G, acc + j, &vmin,
                       &vmax, &bad);
        if (j < len)
            fa_agg_sum(b, D, 1, pay, n_in, off, plen - off, tab, mt, rb ? rb + j : NULL, len - j,
                       acc + j, &vmin, &vmax, &bad);
        st = fa_finish(b, D, sr, c, n, nb, plen, acc, len, base, vmin, vmax, bad != 0, rb, key, out,
                       badi);
        if (st != PSAGG_OK)
            return st;
    }
    return PSAGG_OK;
}

#define FA_DISPATCH(CALL)                                                                          \
    do {                                                                                           \
        int sr_ = c->rounding == PSAGG_ROUND_STOCHASTIC;                                           \
        switch (c->bits * 2 + sr_ + (fa_ok(c) == 32 ? 100 : 0)) {                                  \
        case 2: {                                                                                  \
            const int b = 1, D = 8, sr = 0;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        case 3: {                                                                                  \
            const int b = 1, D = 8, sr = 1;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        case 4: {                                                                                  \
            const int b = 2, D = 8, sr = 0;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        case 5: {                                                                                  \
            const int b = 2, D = 8, sr = 1;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        case 8: {                                                                                  \
            const int b = 4, D = 8, sr = 0;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        case 9: {                                                                                  \
            const int b = 4, D = 8, sr = 1;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        case 108: {                                                                                \
            const int b = 4, D = 32, sr = 0;                                                       \
            return CALL;                                                                           \
        }                                                                                          \
        case 109: {                                                                                \
            const int b = 4, D = 32, sr = 1;                                                       \
            return CALL;                                                                           \
        }                                                                                          \
        case 16: {                                                                                 \
            const int b = 8, D = 8, sr = 0;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        default: {                                                                                 \
            const int b = 8, D = 8, sr = 1;                                                        \
            return CALL;                                                                           \
        }                                                                                          \
        }                                                                                          \
    } while (0)

static psagg_status fa_encode_any(const psagg_codec *c, const float *x, float *residual, size_t n,
                                  psagg_rng_key key, uint8_t *out, float *acc, size_t *badi)
{
    FA_DISPATCH(fa_encode(b, D, sr, c, x, residual, n, key, out, acc, badi));
}

static psagg_status fa_aggregate_any(const psagg_codec *c, const uint8_t *const *in,
                                     const uint8_t *const *pay, size_t n_in, size_t n,
                                     float *residual, psagg_rng_key key, uint8_t *out, float *acc,
                                     __m512 *tab, float *mt, size_t *badi)
{
    FA_DISPATCH(
        fa_aggregate(b, D, sr, c, in, pay, n_in, n, residual, key, out, acc, tab, mt, badi));
}

static void mm_zero_padding(const mm_ctx *t, uint8_t *out)
{
    size_t covered = ((t->n + W - 1) / W) * t->gbytes;
    if (covered < t->plen)
        memset(out + 8 * t->nb + covered, 0, t->plen - covered);
}

static psagg_status enc_mm(const psagg_codec *c, const float *x, float *residual, size_t n,
                           psagg_rng_key key, uint8_t *out, size_t *badi)
{
    float stack_buf[PSAGG_SCRATCH_STACK] __attribute__((aligned(64)));
    size_t B = c->bucket;
    float *acc = psagg_scratch_get(stack_buf, B);
    psagg_status st = PSAGG_OK;
    mm_ctx t;

    if (!acc)
        return psagg_fail(PSAGG_ENOMEM, "encode: no memory for a %zu-element bucket", B);
    if (fa_ok(c)) {
        st = fa_encode_any(c, x, residual, n, key, out, acc, badi);
        psagg_scratch_put(stack_buf, acc);
        return st;
    }
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
    psagg_scratch_put(stack_buf, acc);
    return st;
}

static void dec_mm(const psagg_codec *c, const uint8_t *in, size_t n, float *out, int accum)
{
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
            if (accum)
                y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + k), y);
            _mm512_mask_storeu_ps(out + k, m, y);
        }
    }
}

#define AGG_MAX_STACK_INPUTS 64

static psagg_status agg_mm(const psagg_codec *c, const uint8_t *const *in, size_t n_in, size_t n,
                           float *residual, psagg_rng_key key, uint8_t *out, size_t *badi)
{
    float stack_buf[PSAGG_SCRATCH_STACK] __attribute__((aligned(64)));
    const uint8_t *pay_stack[AGG_MAX_STACK_INPUTS];
    float meta_stack[2 * AGG_MAX_STACK_INPUTS];
    size_t B = c->bucket;
    float *acc = psagg_scratch_get(stack_buf, B);
    const uint8_t **pay = n_in <= AGG_MAX_STACK_INPUTS ? pay_stack : malloc(n_in * sizeof *pay);
    float *mt = n_in <= AGG_MAX_STACK_INPUTS ? meta_stack : malloc(2 * n_in * sizeof *mt);
    __m512 tab_stack[2 * AGG_MAX_STACK_INPUTS];
    __m512 *tab =
        n_in <= AGG_MAX_STACK_INPUTS ? tab_stack : aligned_alloc(64, 2 * n_in * sizeof(__m512));
    __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    psagg_status st = PSAGG_OK;
    mm_ctx t;

    mm_init(&t, c, n);
    if (!acc || !pay || !mt || !tab) {
        st = psagg_fail(PSAGG_ENOMEM, "aggregate: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_in; i++)
        pay[i] = in[i] + 8 * t.nb;
    if (n_in > 0 && fa_ok(c)) {
        st = fa_aggregate_any(c, in, pay, n_in, n, residual, key, out, acc, tab, mt, badi);
        goto done;
    }
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
done:
    if (acc)
        psagg_scratch_put(stack_buf, acc);
    if (pay && pay != pay_stack)
        free(pay);
    if (mt && mt != meta_stack)
        free(mt);
    if (tab && tab != tab_stack)
        free(tab);
    return st;
}

/* ---------------- entry points ---------------- */

static psagg_status avx512_encode(const psagg_codec *c, const float *x, float *residual, size_t n,
                                  psagg_rng_key key, uint8_t *out, size_t *bad)
{
    if (c->id == PSAGG_CODEC_MAXMIN)
        return enc_mm(c, x, residual, n, key, out, bad);
    return enc_fp(c, x, residual, n, out, bad);
}

static void avx512_decode(const psagg_codec *c, const uint8_t *in, size_t n, float *out,
                          int accumulate)
{
    if (c->id == PSAGG_CODEC_MAXMIN)
        dec_mm(c, in, n, out, accumulate);
    else
        dec_fp(c, in, n, out, accumulate);
}

static psagg_status avx512_aggregate(const psagg_codec *c, const uint8_t *const *in, size_t n_in,
                                     size_t n, float *residual, psagg_rng_key key, uint8_t *out,
                                     size_t *bad)
{
    if (c->id == PSAGG_CODEC_MAXMIN)
        return agg_mm(c, in, n_in, n, residual, key, out, bad);
    return agg_fp(c, in, n_in, n, residual, out, bad);
}

const psagg_codec_impl psagg_impl_avx512 = {"avx512", avx512_encode, avx512_decode,
                                            avx512_aggregate};

#else /* not built for AVX-512 */
const psagg_codec_impl psagg_impl_avx512 = {"avx512", NULL, NULL, NULL};
#endif
