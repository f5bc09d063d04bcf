/* topk.c - see topk.h. */
#include "kernels/topk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static inline uint32_t mag(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7FFFFFFFu;
}

#define TOPK_MAX_ABS 0x1p126f

static uint32_t load_scalar(const float *x, const float *r, uint32_t first, uint32_t n, float *v)
{
    for (uint32_t i = first; i < n; i++) {
        float vi = r ? x[i] + r[i] : x[i];
        if (!isfinite(vi) || fabsf(vi) >= TOPK_MAX_ABS)
            return i;
        v[i] = vi;
    }
    return n;
}

static uint32_t filter_scalar(const float *v, uint32_t first, uint32_t n, uint32_t mask,
                              uint32_t prefix, uint32_t *out)
{
    uint32_t m = 0;
    for (uint32_t j = first; j < n; j++)
        if ((mag(v[j]) & mask) == prefix)
            out[m++] = j;
    return m;
}

static uint32_t keep_scalar(const float *v, uint32_t first, uint32_t n, uint32_t want,
                            uint32_t ties, uint32_t *idx)
{
    uint32_t taken = 0;
    for (uint32_t i = first; i < n; i++) {
        uint32_t u = mag(v[i]);
        if (u > want || (u == want && ties > 0)) {
            ties -= u == want;
            idx[taken++] = i;
        }
    }
    return taken;
}

const psagg__topk_passes psagg__topk_scalar_passes = {
    .load = load_scalar, .filter = filter_scalar, .keep = keep_scalar};

static uint32_t select_with(const psagg__topk_passes *p, const float *v, uint32_t n, uint32_t k,
                            uint32_t *idx, uint32_t *scratch)
{
    /* the digits of |v|'s 31 bits, most significant first: 11 bits (the exponent and 3 bits of
       mantissa, which spread a gradient's magnitudes over many bins), 11, then 9 */
    static const int shift[3] = {20, 9, 0}, width[3] = {11, 11, 9};
    uint32_t count[2048], prefix = 0, mask = 0, above = 0, cand = n;

    for (int d = 0; d < 3; d++) {
        uint32_t need = k - above, acc = 0, bin = 0, bins = 1u << width[d], m = 0;
        const int sh = shift[d];
        memset(count, 0, bins * sizeof *count);
        if (d == 0) /* every index 0..n-1 is a candidate */
            for (uint32_t j = 0; j < n; j++)
                count[mag(v[j]) >> sh]++;
        else
            for (uint32_t j = 0; j < cand; j++)
                count[(mag(v[scratch[j]]) >> sh) & (bins - 1)]++;
        for (uint32_t b = bins; b-- > 0;) { /* the bin where the count from the top reaches need */
            if (acc + count[b] >= need) {
                bin = b;
                break;
            }
            acc += count[b];
        }
        above += acc; /* entries in the bins above: larger than any in this bin */
        prefix |= bin << sh;
        mask |= (bins - 1) << sh;
        if (d == 2)
            break;
        /* the next pass looks at this bin's entries only (in place: m <= j) */
        if (d == 0) {
            m = p->filter(v, 0, n, mask, prefix, scratch);
        } else {
            for (uint32_t j = 0; j < cand; j++)
                if ((mag(v[scratch[j]]) & mask) == prefix)
                    scratch[m++] = scratch[j];
        }
        cand = m;
    }
    /* prefix is the k-th largest magnitude: keep every larger one and, of those equal to it,
       the first k - (larger) by index */
    p->keep(v, 0, n, prefix, k - above, idx);
    return prefix;
}

uint32_t psagg__topk_select(const float *v, uint32_t n, uint32_t k, uint32_t *idx,
                            uint32_t *scratch)
{
    return select_with(&psagg__topk_scalar_passes, v, n, k, idx, scratch);
}

/* ---- the sparse format (topk.h) ---- */

#define TOPK_MIN_RANGE 0x1p-100f /* as maxmin's PSAGG_MAXMIN_MIN_RANGE */

static int format_ok(const psagg__topk_format *f)
{
    return f && f->bits >= 2 && f->bits <= 8 && f->block >= PSAGG_TOPK_MIN_BLOCK &&
           f->block <= PSAGG_TOPK_MAX_BLOCK && !(f->block & (f->block - 1)) && f->k >= 1 &&
           f->k <= f->block &&
           (f->rounding == PSAGG_ROUND_STOCHASTIC || f->rounding == PSAGG_ROUND_NEAREST);
}

psagg_status psagg__topk_check(const psagg__topk_format *f)
{
    if (!f)
        return psagg__fail(PSAGG_EINVAL, "topk: NULL format");
    if (f->bits < 2 || f->bits > 8)
        return psagg__fail(PSAGG_EINVAL, "topk: bits %u out of range 2..8", f->bits);
    if (f->block < PSAGG_TOPK_MIN_BLOCK || f->block > PSAGG_TOPK_MAX_BLOCK ||
        (f->block & (f->block - 1)))
        return psagg__fail(PSAGG_EINVAL, "topk: block %u is not a power of two in %u..%u", f->block,
                           PSAGG_TOPK_MIN_BLOCK, PSAGG_TOPK_MAX_BLOCK);
    if (f->k < 1 || f->k > f->block)
        return psagg__fail(PSAGG_EINVAL, "topk: k %u out of range 1..%u (the block)", f->k,
                           f->block);
    if (f->rounding != PSAGG_ROUND_STOCHASTIC && f->rounding != PSAGG_ROUND_NEAREST)
        return psagg__fail(PSAGG_EINVAL, "topk: rounding %d is neither stochastic nor nearest",
                           (int)f->rounding);
    return PSAGG_OK;
}

static size_t stream_bytes(size_t count, uint32_t bits)
{
    return 8 * ((count * bits + 63) / 64);
}

psagg__topk_layout psagg__topk_layout_of(const psagg__topk_format *f, size_t n)
{
    psagg__topk_layout l;
    size_t rest = n % f->block;
    l.nb = n / f->block + (rest != 0);
    l.kept = n / f->block * f->k + (rest < f->k ? rest : f->k);
    l.ib = (uint32_t)__builtin_ctz(f->block);
    l.levels = (1u << (f->bits - 1)) - 1;
    l.idx_off = 8 * l.nb;
    l.idx_bytes = stream_bytes(l.kept, l.ib);
    l.val_off = l.idx_off + l.idx_bytes;
    l.val_bytes = stream_bytes(l.kept, f->bits);
    return l;
}

size_t psagg__topk_encoded_size(const psagg__topk_format *f, size_t n)
{
    if (!format_ok(f))
        return 0;
    psagg__topk_layout l = psagg__topk_layout_of(f, n);
    return l.val_off + l.val_bytes;
}

/* w <= 16 bits at bit pos of an LSB-first stream (zeroed before: or-ed in). */
static inline void put_bits(uint8_t *p, size_t pos, uint32_t w, uint32_t v)
{
    uint32_t x = v << (pos & 7), bytes = ((uint32_t)(pos & 7) + w + 7) / 8;
    for (uint32_t i = 0; i < bytes; i++)
        p[(pos >> 3) + i] |= (uint8_t)(x >> (8 * i));
}

static inline uint32_t get_bits(const uint8_t *p, size_t pos, uint32_t w)
{
    uint32_t x = 0, bytes = ((uint32_t)(pos & 7) + w + 7) / 8;
    for (uint32_t i = 0; i < bytes; i++)
        x |= (uint32_t)p[(pos >> 3) + i] << (8 * i);
    return (x >> (pos & 7)) & ((1u << w) - 1);
}

/* 1 if the bits of stream p (bytes long) from bit pos on are all zero. */
static int tail_zero(const uint8_t *p, size_t bytes, size_t pos)
{
    if (pos & 7 && (p[pos >> 3] >> (pos & 7)))
        return 0;
    for (size_t b = (pos + 7) >> 3; b < bytes; b++)
        if (p[b])
            return 0;
    return 1;
}

psagg_status psagg__topk_encode(const psagg__topk_format *f, const float *x, float *residual,
                                size_t n, psagg__rng_key key, void *out, size_t out_len,
                                size_t *bad_index)
{
    return psagg__topk_encode_with(NULL, f, x, residual, n, key, out, out_len, bad_index);
}

psagg_status psagg__topk_encode_with(const psagg__topk_passes *p, const psagg__topk_format *f,
                                     const float *x, float *residual, size_t n, psagg__rng_key key,
                                     void *out, size_t out_len, size_t *bad_index)
{
    psagg_status st = psagg__topk_check(f);
    uint8_t *o = out;
    uint32_t *idx, *scratch;
    float *v;
    size_t pos = 0;
    psagg__topk_layout l;

    if (st)
        return st;
    if (n > PSAGG_CODEC_MAX_ELEMS)
        return psagg__fail(PSAGG_EINVAL, "topk: %zu elements, more than a buffer holds", n);
    l = psagg__topk_layout_of(f, n);
    if (out_len != l.val_off + l.val_bytes)
        return psagg__fail(PSAGG_EINVAL, "topk: an output of %zu bytes; %zu elements take %zu",
                           out_len, n, l.val_off + l.val_bytes);
    if (!n)
        return PSAGG_OK;
    if (!p)
        p = &psagg__topk_scalar_passes;
    idx = malloc(2 * (size_t)f->block * sizeof *idx);
    v = malloc((size_t)f->block * sizeof *v);
    if (!idx || !v) {
        free(idx), free(v);
        return psagg__fail(PSAGG_ENOMEM, "topk: no memory for a block of %u", f->block);
    }
    scratch = idx + f->block;
    memset(o, 0, out_len);
    for (size_t m = 0; m < l.nb && !st; m++) {
        size_t base = m * f->block;
        uint32_t len = (uint32_t)(n - base < f->block ? n - base : f->block);
        uint32_t km = len < f->k ? len : f->k;
        float lo = 0, hi = 0, scale = 0, inv = 0;
        uint32_t i = p->load(x + base, residual ? residual + base : NULL, 0, len, v);
        if (i < len) {
            float vi = residual ? x[base + i] + residual[base + i] : x[base + i];
            if (bad_index)
                *bad_index = base + i;
            st = psagg__fail(isfinite(vi) ? PSAGG_ERANGE : PSAGG_ENONFINITE,
                             "topk: element %zu is %g%s", base + i, (double)vi,
                             isfinite(vi) ? ", beyond 2^126" : "");
            break;
        }
        select_with(p, v, len, km, idx, scratch);
        for (uint32_t j = 0; j < km; j++) {
            float a = fabsf(v[idx[j]]);
            if (j == 0 || a < lo)
                lo = a;
            if (j == 0 || a > hi)
                hi = a;
        }
        if (hi - lo >= TOPK_MIN_RANGE) {
            scale = (hi - lo) / (float)l.levels;
            inv = 1.0f / scale;
        }
        memcpy(o + 8 * m, &scale, 4);
        memcpy(o + 8 * m + 4, &lo, 4);
        if (residual) /* an entry not kept keeps all of v_i; the kept ones below */
            memcpy(residual + base, v, len * sizeof *v);
        for (uint32_t j = 0; j < km; j++) {
            uint32_t i = idx[j], q = 0, sign = signbit(v[i]) != 0;
            if (scale != 0) {
                float u = f->rounding == PSAGG_ROUND_NEAREST
                              ? 0.5f
                              : psagg__rng_uniform(key, (uint32_t)(base + i));
                float t = (fabsf(v[i]) - lo) * inv + u;
                q = (uint32_t)(t < (float)l.levels ? t : (float)l.levels);
            }
            put_bits(o + l.idx_off, (pos + j) * l.ib, l.ib, i);
            put_bits(o + l.val_off, (pos + j) * f->bits, f->bits, sign | q << 1);
            if (residual) {
                float y = lo + scale * (float)q;
                residual[base + i] = v[i] - (sign ? -y : y);
            }
        }
        pos += km;
    }
    free(idx), free(v);
    return st;
}

/* Validate `in` and, with out, decode it into out as op says (topk.h; codec.h's ops). */
static psagg_status topk_walk(const psagg__topk_format *f, const uint8_t *in, size_t in_len,
                              size_t n, float *out, psagg__decode_op op, float factor)
{
    psagg_status st = psagg__topk_check(f);
    psagg__topk_layout l;
    size_t pos = 0;

    if (st)
        return st;
    l = psagg__topk_layout_of(f, n);
    if (in_len != l.val_off + l.val_bytes)
        return psagg__fail(PSAGG_EINVAL, "topk: a buffer of %zu bytes; %zu elements take %zu",
                           in_len, n, l.val_off + l.val_bytes);
    if (out) { /* every entry not kept decodes to -0 (topk.h) */
        if (op == PSAGG_DECODE_SET || op == PSAGG_DECODE_SCALE) {
            float z = op == PSAGG_DECODE_SET ? -0.0f : -0.0f * factor;
            for (size_t i = 0; i < n; i++)
                out[i] = z;
        } else if (op == PSAGG_DECODE_FIRST) {
            memset(out, 0, n * sizeof *out); /* 0.0f + -0.0f */
        }
    }
    for (size_t m = 0; m < l.nb; m++) {
        size_t base = m * f->block;
        uint32_t len = (uint32_t)(n - base < f->block ? n - base : f->block);
        uint32_t km = len < f->k ? len : f->k, last = 0;
        float scale, lo;
        uint32_t su, lu;
        memcpy(&scale, in + 8 * m, 4);
        memcpy(&lo, in + 8 * m + 4, 4);
        memcpy(&su, &scale, 4);
        memcpy(&lu, &lo, 4);
        if (!isfinite(scale) || !isfinite(lo) || (su >> 31) || (lu >> 31) ||
            !isfinite(lo + scale * (float)l.levels))
            return psagg__fail(PSAGG_EBADMETA,
                               "topk: block %zu: field %s is %g (lo %g, scale %g: both must be "
                               "finite and non-negative, lo + scale * %u finite)",
                               m, !isfinite(scale) || (su >> 31) ? "scale" : "lo",
                               (double)(!isfinite(scale) || (su >> 31) ? scale : lo), (double)lo,
                               (double)scale, l.levels);
        for (uint32_t j = 0; j < km; j++) {
            uint32_t i = get_bits(in + l.idx_off, (pos + j) * l.ib, l.ib);
            uint32_t w = get_bits(in + l.val_off, (pos + j) * f->bits, f->bits);
            float y;
            if (i >= len || (j && i <= last))
                return psagg__fail(
                    PSAGG_EBADMETA, "topk: block %zu: field index %u of entry %u is %s", m, i, j,
                    i >= len ? "out of the block's range" : "not above the one before");
            last = i;
            if (!out)
                continue;
            y = lo + scale * (float)(w >> 1);
            if (w & 1)
                y = -y;
            switch (op) {
            case PSAGG_DECODE_SET:
                out[base + i] = y;
                break;
            case PSAGG_DECODE_ADD:
                out[base + i] = out[base + i] + y;
                break;
            case PSAGG_DECODE_FIRST:
                out[base + i] = 0.0f + y;
                break;
            case PSAGG_DECODE_SCALE:
                out[base + i] = y * factor;
                break;
            }
        }
        pos += km;
    }
    if (!tail_zero(in + l.idx_off, l.idx_bytes, l.kept * l.ib))
        return psagg__fail(PSAGG_EBADMETA,
                           "topk: field padding: bits after the last index are set");
    if (!tail_zero(in + l.val_off, l.val_bytes, l.kept * f->bits))
        return psagg__fail(PSAGG_EBADMETA,
                           "topk: field padding: bits after the last value are set");
    return PSAGG_OK;
}

psagg_status psagg__topk_validate(const psagg__topk_format *f, const void *in, size_t in_len,
                                  size_t n)
{
    return topk_walk(f, in, in_len, n, NULL, PSAGG_DECODE_SET, 1.0f);
}

psagg_status psagg__topk_decode_into(const psagg__topk_format *f, const void *in, size_t in_len,
                                     size_t n, float *out, psagg__decode_op op, float factor)
{
    return topk_walk(f, in, in_len, n, out, op, factor);
}
