/*
 * cpu/scalar.c - the reference implementation: codec.h followed literally, one element at a
 * time. The SIMD paths are tested to produce exactly these bytes. Layer: kernels.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "impl.h"

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary32 -> binary16, round to nearest even, subnormals kept; |f| < 65520 (checked). */
static uint16_t f32_to_f16(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;

    if (a >= 0x38800000u) { /* >= 2^-14: normal half. Rebias 127 -> 15, round at bit 13. */
        uint32_t r = a - (112u << 23);
        r = r + 0xFFFu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) /* < 2^-25: rounds to (signed) zero */
        return (uint16_t)sign;
    /* subnormal half: value = mant * 2^(e - 150) = (mant >> (126 - e)) units of 2^-24 */
    {
        uint32_t e = a >> 23, mant = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t sh = 126 - e; /* 14..24 */
        uint32_t q = mant >> sh, rem = mant & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7FFFu;
    if (a >= 0x0400u) /* normal (Inf/NaN never reach here: validated) */
        return u2f(sign | ((a << 13) + (112u << 23)));
    /* subnormal or zero: a * 2^-24, exact */
    {
        float f = (float)a * 0x1p-24f;
        return sign ? -f : f;
    }
}

static inline void put16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, 2);
}

static inline uint16_t get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* ---- fp formats: element base..base+len-1 of the buffer, values v_j = x_j (+ r_j) ---- */

static psagg_status enc_fp(const psagg_codec *c, const float *x, float *r, size_t len, size_t base,
                           uint8_t *out, size_t *bad)
{
    /* one loop per format (the format is the same for every element) */
    switch (c->id) {
    case PSAGG_CODEC_FP32:
        for (size_t j = 0; j < len; j++) {
            float v = r ? x[j] + r[j] : x[j];
            if (!isfinite(v))
                return psagg__codec_bad_value(c, base + j, v, bad);
            memcpy(out + 4 * (base + j), &v, 4);
            if (r)
                r[j] = v - v;
        }
        break;
    case PSAGG_CODEC_FP16:
        for (size_t j = 0; j < len; j++) {
            float v = r ? x[j] + r[j] : x[j];
            uint16_t h;
            if (!(fabsf(v) < 65520.0f))
                return psagg__codec_bad_value(c, base + j, v, bad);
            h = f32_to_f16(v);
            put16(out + 2 * (base + j), h);
            if (r)
                r[j] = v - f16_to_f32(h);
        }
        break;
    default: /* bf16 */
        for (size_t j = 0; j < len; j++) {
            float v = r ? x[j] + r[j] : x[j];
            uint32_t u = f2u(v), w;
            if (!isfinite(v))
                return psagg__codec_bad_value(c, base + j, v, bad);
            w = u + 0x7FFFu + ((u >> 16) & 1u);
            if ((w & 0x7F800000u) == 0x7F800000u)
                return psagg__codec_bad_value(c, base + j, v, bad);
            put16(out + 2 * (base + j), (uint16_t)(w >> 16));
            if (r)
                r[j] = v - u2f(w & 0xFFFF0000u);
        }
        break;
    }
    return PSAGG_OK;
}

/* Whether element k of an fp buffer is NaN or Inf (its exponent field all ones). */
static int fp_nonfinite(const psagg_codec *c, const uint8_t *in, size_t k)
{
    uint32_t u;
    if (c->id == PSAGG_CODEC_FP32) {
        memcpy(&u, in + 4 * k, 4);
        return (u & 0x7F800000u) == 0x7F800000u;
    }
    u = get16(in + 2 * k);
    return c->id == PSAGG_CODEC_FP16 ? (u & 0x7C00u) == 0x7C00u : (u & 0x7F80u) == 0x7F80u;
}

static float dec_fp_one(const psagg_codec *c, const uint8_t *in, size_t k)
{
    switch (c->id) {
    case PSAGG_CODEC_FP32: {
        float f;
        memcpy(&f, in + 4 * k, 4);
        return f;
    }
    case PSAGG_CODEC_FP16:
        return f16_to_f32(get16(in + 2 * k));
    default:
        return u2f((uint32_t)get16(in + 2 * k) << 16);
    }
}

/* ---- maxmin ---- */

static inline void put_bits(uint8_t *payload, size_t k, uint32_t b, uint32_t q)
{
    size_t pos = k * b, byte = pos >> 3;
    uint32_t sh = (uint32_t)(pos & 7);
    payload[byte] |= (uint8_t)(q << sh);
    if (sh + b > 8)
        payload[byte + 1] |= (uint8_t)(q >> (8 - sh));
}

static inline uint32_t get_bits(const uint8_t *payload, size_t k, uint32_t b)
{
    size_t pos = k * b, byte = pos >> 3;
    uint32_t sh = (uint32_t)(pos & 7);
    uint32_t w = payload[byte];
    if (sh + b > 8)
        w |= (uint32_t)payload[byte + 1] << 8;
    return (w >> sh) & ((1u << b) - 1);
}

/* One bucket: elements base..base+len-1, v_j = x_j (+ r_j). payload must be zeroed. */
static psagg_status enc_mm_bucket(const psagg_codec *c, const float *x, float *r, size_t len,
                                  size_t base, psagg__rng_key key, uint8_t *meta, uint8_t *payload,
                                  size_t *bad)
{
    const uint32_t b = c->bits;
    const float L = (float)((1u << b) - 1);
    float lo = 0, hi = 0, range, scale = 0.0f, inv = 0.0f;
    int constant;

    for (size_t j = 0; j < len; j++) {
        float v = r ? x[j] + r[j] : x[j];
        if (!(fabsf(v) < PSAGG_MAXMIN_MAX_ABS))
            return psagg__codec_bad_value(c, base + j, v, bad);
        if (j == 0) {
            lo = hi = v;
        } else {
            if (v < lo || (v == lo && signbit(v))) /* -0 < +0 (see impl.h) */
                lo = v;
            if (v > hi)
                hi = v;
        }
    }
    range = hi - lo;
    constant = range < PSAGG_MAXMIN_MIN_RANGE;
    if (!constant) {
        scale = range / L;
        inv = 1.0f / scale;
    }
    memcpy(meta, &scale, 4);
    memcpy(meta + 4, &lo, 4);
    for (size_t j = 0; j < len; j++) {
        float v = r ? x[j] + r[j] : x[j];
        uint32_t q = 0;
        if (!constant) {
            float t = (v - lo) * inv;
            float u = c->rounding == PSAGG_ROUND_NEAREST
                          ? 0.5f
                          : psagg__rng_uniform(key, (uint32_t)(base + j));
            float m = t + u;
            if (m > L)
                m = L;
            q = (uint32_t)m;
        }
        put_bits(payload, base + j, b, q);
        if (r)
            r[j] = v - (lo + scale * (float)q);
    }
    return PSAGG_OK;
}

static psagg_status scalar_fp_encode(const psagg_codec *c, const float *x, float *residual,
                                     size_t n, uint8_t *out, size_t *bad)
{
    return enc_fp(c, x, residual, n, 0, out, bad);
}

static psagg_status scalar_mm_encode(const psagg_codec *c, const float *x, float *residual,
                                     size_t n, psagg__rng_key key, uint8_t *out, psagg__scratch *ws,
                                     size_t *bad)
{
    size_t B = c->bucket, nb = psagg__mm_nbuckets(n, c->bucket);
    uint8_t *payload = out + 8 * nb;
    (void)ws;
    memset(payload, 0, psagg__mm_payload_bytes(n, c->bits));
    for (size_t m = 0; m < nb; m++) {
        size_t base = m * B, len = n - base < B ? n - base : B;
        psagg_status st = enc_mm_bucket(c, x + base, residual ? residual + base : NULL, len, base,
                                        key, out + 8 * m, payload, bad);
        if (st != PSAGG_OK)
            return st;
    }
    return PSAGG_OK;
}

/* out[j] = y_{base+j} applied as op says (codec.h psagg__decode_op) */
static inline __attribute__((always_inline)) float dec_apply(psagg__decode_op op, float o, float y,
                                                             float f)
{
    switch (op) {
    case PSAGG_DECODE_ADD:
        return o + y;
    case PSAGG_DECODE_FIRST:
        return 0.0f + y;
    case PSAGG_DECODE_SCALE:
        return y * f;
    default:
        return y;
    }
}

/* Decode elements base..base+len-1 into out[0..len); nonzero if an fp input is NaN/Inf. */
static inline __attribute__((always_inline)) int dec_range_as(const psagg_codec *c,
                                                              const uint8_t *in, size_t n,
                                                              size_t base, size_t len, float *out,
                                                              psagg__decode_op op, float f)
{
    int bad = 0;
    if (c->id != PSAGG_CODEC_MAXMIN) {
        for (size_t j = 0; j < len; j++) {
            float y = dec_fp_one(c, in, base + j); /* f16_to_f32 is for finite halves */
            bad |= fp_nonfinite(c, in, base + j);
            out[j] = dec_apply(op, out[j], y, f);
        }
        return bad;
    }
    {
        const uint32_t b = c->bits;
        size_t nb = psagg__mm_nbuckets(n, c->bucket);
        const uint8_t *payload = in + 8 * nb;
        size_t j = 0;
        while (j < len) { /* bucket by bucket: y = lo + scale * q */
            size_t k = base + j, m = k / c->bucket;
            size_t end = (m + 1) * c->bucket - base; /* first j of the next bucket */
            float scale, lo;
            memcpy(&scale, in + 8 * m, 4);
            memcpy(&lo, in + 8 * m + 4, 4);
            if (end > len)
                end = len;
            for (; j < end; j++)
                out[j] =
                    dec_apply(op, out[j], lo + scale * (float)get_bits(payload, base + j, b), f);
        }
    }
    return 0;
}

/* dec_range_as with op a constant in each loop (no switch per element) */
static int dec_range(const psagg_codec *c, const uint8_t *in, size_t n, size_t base, size_t len,
                     float *out, psagg__decode_op op, float f)
{
    switch (op) {
    case PSAGG_DECODE_ADD:
        return dec_range_as(c, in, n, base, len, out, PSAGG_DECODE_ADD, f);
    case PSAGG_DECODE_FIRST:
        return dec_range_as(c, in, n, base, len, out, PSAGG_DECODE_FIRST, f);
    case PSAGG_DECODE_SCALE:
        return dec_range_as(c, in, n, base, len, out, PSAGG_DECODE_SCALE, f);
    default:
        return dec_range_as(c, in, n, base, len, out, PSAGG_DECODE_SET, f);
    }
}

static int scalar_fp_decode(const psagg_codec *c, const uint8_t *in, size_t n, float *out,
                            psagg__decode_op op, float f)
{
    return dec_range(c, in, n, 0, n, out, op, f);
}

static void scalar_mm_decode(const psagg_codec *c, const uint8_t *in, size_t n, float *out,
                             psagg__decode_op op, float f)
{
    dec_range(c, in, n, 0, n, out, op, f);
}

/*
 * Block by block (a maxmin block is one bucket; an fp block any ws->acc_elems elements): sum
 * the inputs into ws->acc, then encode the block.
 */
static psagg_status aggregate(const psagg_codec *c, const uint8_t *const *in, size_t n_in, size_t n,
                              float *residual, psagg__rng_key key, uint8_t *out, psagg__scratch *ws,
                              size_t *bad)
{
    int mm = c->id == PSAGG_CODEC_MAXMIN;
    size_t block = mm ? c->bucket : ws->acc_elems, nb = mm ? psagg__mm_nbuckets(n, c->bucket) : 0;
    float *s = ws->acc;
    psagg_status st = PSAGG_OK;

    if (mm)
        memset(out + 8 * nb, 0, psagg__mm_payload_bytes(n, c->bits));
    for (size_t base = 0; base < n && st == PSAGG_OK; base += block) {
        size_t len = n - base < block ? n - base : block;
        float *r = residual ? residual + base : NULL;
        for (size_t j = 0; j < len; j++)
            s[j] = 0.0f;
        for (size_t i = 0; i < n_in; i++)
            dec_range(c, in[i], n, base, len, s, PSAGG_DECODE_ADD, 1.0f);
        if (mm)
            st =
                enc_mm_bucket(c, s, r, len, base, key, out + 8 * (base / block), out + 8 * nb, bad);
        else
            st = enc_fp(c, s, r, len, base, out, bad);
    }
    return st;
}

static psagg_status scalar_fp_aggregate(const psagg_codec *c, const uint8_t *const *in, size_t n_in,
                                        size_t n, float *residual, uint8_t *out, psagg__scratch *ws,
                                        size_t *bad)
{
    psagg__rng_key unused = {0, 0};
    return aggregate(c, in, n_in, n, residual, unused, out, ws, bad);
}

const psagg__codec_impl psagg__impl_scalar = {
    .name = "scalar",
    .fp_encode = scalar_fp_encode,
    .fp_decode = scalar_fp_decode,
    .fp_aggregate = scalar_fp_aggregate,
    .mm_encode = scalar_mm_encode,
    .mm_decode = scalar_mm_decode,
    .mm_aggregate = aggregate,
    .topk = &psagg__topk_scalar_passes,
    .thc_fold = psagg__thc_fold_scalar,
    .thc_worker = &psagg__thc_worker_scalar,
};
