/*
 * cpu/avx512_bytes.c - the AVX-512 maxmin paths for b in {1, 2, 4, 8}, where every 16 payload
 * bytes hold a whole group of elements (see below). Bit-identical to scalar.c, like
 * avx512.c, which falls back to its general paths for every other codec. Layer: kernels.
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

/* ---------------- maxmin, b in {1, 2, 4, 8}: whole bytes per group ----------------
 *
 * Every 16 payload bytes hold one group of G = 128 / b elements. A group is kept in P = 8 / b
 * vectors in an interleaved layout: vector s, lane j holds element P*j + s of the group, so
 * that one vpmovzxbd of the 16 bytes, shifted right by s*b, puts vector s's levels in the low
 * bits of each lane, and packing is q_0 | q_1 << b | ... then vpmovdb. The sum, min/max and
 * every per-element operation are layout-independent; the RNG index of each lane follows the
 * layout; x and residuals (natural order) are (de)interleaved with vpermt2ps. A bucket is a
 * whole number of groups (B % G == 0, checked by psagg__avx512_bytes_ok).
 */

#define FA static inline __attribute__((always_inline))

/* payload bits per dword lane (group = 2*D bytes, P = D/b vectors), 0: not this path */
int psagg__avx512_bytes_ok(const psagg_codec *c)
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

typedef struct fa_q {
    __m512 vlo, vinv, vscale, Lf;
    __m512i k0, k1;
} fa_q;

/*
 * Pass 2 for one group: quantize the layout vectors at a (first rem elements valid), pack
 * into p (room bytes writable), residual (natural order, group start r) if r. idx: the element
 * index of each lane of vector 0 (the group's first, plus P*j in lane j). With P even, lane j
 * of vectors s and s + 1 (s even) holds the RNG pair (2m, 2m + 1) of codec.h, m = idx/2 + s/2:
 * one hash serves both; with P = 1 the pairs are neighbouring lanes.
 */
FA void fa_quant(const int b, const int D, const int sr, const int tail, const fa_q *z,
                 const float *a, size_t rem, __m512i idx, uint8_t *p, size_t room, float *r)
{
    const int P = D / b;
    __m512i packed = _mm512_setzero_si512(), h = _mm512_setzero_si512();
    __m512 rv[16];
#pragma GCC unroll 16
    for (int s = 0; s < P; s++) {
        __m512 v = _mm512_load_ps(a + 16 * s);
        __m512 t = _mm512_mul_ps(_mm512_sub_ps(v, z->vlo), z->vinv);
        __m512 u = _mm512_set1_ps(0.5f);
        if (sr && P == 1) {
            u = psagg__avx512_rng16(idx, z->k0, z->k1);
        } else if (sr && s % 2 == 0) {
            h = psagg__avx512_rng_hash(
                _mm512_add_epi32(_mm512_srli_epi32(idx, 1), _mm512_set1_epi32(s / 2)), z->k0,
                z->k1);
            u = psagg__avx512_rng_u_lo(h);
        } else if (sr) {
            u = psagg__avx512_rng_u_hi(h);
        }
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
                          __m512 vmax, int bad_any, float *r, psagg__rng_key key, uint8_t *out,
                          size_t *badi)
{
    const int P = D / b, G = 16 * P, GB = 2 * D;
    float lo, hi, range, scale = 0.0f, inv = 0.0f;
    uint8_t *meta = out + 8 * (base / c->bucket), *payload = out + 8 * nb;
    fa_q z;
    __m512i idx;
    size_t j;

    (void)n;
    lo = _mm512_reduce_min_ps(vmin);
    hi = _mm512_reduce_max_ps(vmax);
    if (bad_any || !(hi < PSAGG_MAXMIN_MAX_ABS) || !(lo > -PSAGG_MAXMIN_MAX_ABS)) {
        for (size_t e = 0; e < len; e++) {
            float v = acc[fa_pos((uint32_t)b, (uint32_t)D, e)];
            if (!(fabsf(v) < PSAGG_MAXMIN_MAX_ABS))
                return psagg__codec_bad_value(c, base + e, v, badi);
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
    z.k0 = _mm512_set1_epi32((int)key.k0);
    z.k1 = _mm512_set1_epi32((int)key.k1);
    idx = _mm512_add_epi32(
        _mm512_set1_epi32((int)(uint32_t)base),
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(P)));
    {
        size_t full = len / G * G, off = base / G * GB;
        for (j = 0; j < full; j += G, off += GB) {
            fa_quant(b, D, sr, 0, &z, acc + j, G, idx, payload + off, GB, r ? r + j : NULL);
            idx = _mm512_add_epi32(idx, _mm512_set1_epi32(G));
        }
        if (j < len)
            fa_quant(b, D, sr, 1, &z, acc + j, len - j, idx, payload + off, plen - off,
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
                          const float *x, float *residual, size_t n, psagg__rng_key key,
                          uint8_t *out, float *acc, size_t *badi)
{
    const size_t G = 16 * (D / b), B = c->bucket;
    size_t nb = psagg__mm_nbuckets(n, c->bucket), plen = psagg__mm_payload_bytes(n, (uint32_t)b);
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
                             size_t n, float *residual, psagg__rng_key key, uint8_t *out,
                             float *acc, __m512 *tab, float *mt, size_t *badi)
{
    const size_t G = 16 * (D / b), GB = 2 * D, B = c->bucket;
    size_t nb = psagg__mm_nbuckets(n, c->bucket), plen = psagg__mm_payload_bytes(n, (uint32_t)b);
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
        switch (c->bits * 2 + sr_ + (psagg__avx512_bytes_ok(c) == 32 ? 100 : 0)) {                 \
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

psagg_status psagg__avx512_bytes_encode(const psagg_codec *c, const float *x, float *residual,
                                        size_t n, psagg__rng_key key, uint8_t *out,
                                        psagg__scratch *ws, size_t *badi)
{
    float *acc = ws->acc;
    FA_DISPATCH(fa_encode(b, D, sr, c, x, residual, n, key, out, acc, badi));
}

psagg_status psagg__avx512_bytes_aggregate(const psagg_codec *c, const uint8_t *const *in,
                                           size_t n_in, size_t n, float *residual,
                                           psagg__rng_key key, uint8_t *out, psagg__scratch *ws,
                                           size_t *badi)
{
    const uint8_t **pay = ws->pay;
    float *acc = ws->acc, *mt = ws->meta;
    __m512 *tab = ws->tab;
    size_t nb = psagg__mm_nbuckets(n, c->bucket);
    for (size_t i = 0; i < n_in; i++)
        pay[i] = in[i] + 8 * nb;
    FA_DISPATCH(
        fa_aggregate(b, D, sr, c, in, pay, n_in, n, residual, key, out, acc, tab, mt, badi));
}

#endif
