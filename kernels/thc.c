/* thc.c - integer aggregation (kernels/thc.h): the index and sum streams, the scalar fold,
   element access, and the workers' rotation, encode and decode. Layer: kernels. */
#include "kernels/thc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/impl.h"

static int bits_ok(uint32_t bits)
{
    return bits == 2 || bits == 4;
}

size_t psagg__thc_index_bytes(uint32_t bits, size_t n)
{
    if (!bits_ok(bits))
        return 0;
    return PSAGG_THC_GROUP_BYTES *
           ((n * bits + 8 * PSAGG_THC_GROUP_BYTES - 1) / (8 * PSAGG_THC_GROUP_BYTES));
}

uint32_t psagg__thc_sum_width(uint32_t bits, size_t inputs)
{
    uint64_t top;
    if (!bits_ok(bits) || inputs == 0 || inputs > 65535)
        return 0;
    top = (uint64_t)inputs * ((1u << bits) - 1);
    return top <= 15 ? 4 : top <= 255 ? 8 : top <= 65535 ? 16 : 0;
}

size_t psagg__thc_sum_bytes(uint32_t bits, size_t inputs, size_t n)
{
    uint32_t w = psagg__thc_sum_width(bits, inputs);
    /* groups x G elements x w / 8 bytes; G * b = 512 bits */
    return w ? psagg__thc_index_bytes(bits, n) / PSAGG_THC_GROUP_BYTES * (512 / bits) * w / 8 : 0;
}

uint32_t psagg__thc_index_at(uint32_t bits, const uint8_t *in, size_t e)
{
    return (in[e * bits / 8] >> (e * bits % 8)) & ((1u << bits) - 1);
}

uint32_t psagg__thc_sum_at(uint32_t bits, uint32_t width, const uint8_t *sum, size_t e)
{
    size_t G = 512 / bits, P = 8 / bits, g = e / G, r = e % G, j = r % P, i = r / P;
    size_t at = g * G + j * 64 + i; /* plane j, position i */
    if (width == 4)                 /* (planes j and j + P/2 share a run: low and high nibbles) */
        return (uint32_t)(sum[g * G / 2 + (j % (P / 2)) * 64 + i] >> (j / (P / 2) * 4)) & 15;
    return width == 8 ? sum[at] : (uint32_t)sum[2 * at] | (uint32_t)sum[2 * at + 1] << 8;
}

void psagg__thc_fold_scalar(uint32_t bits, uint32_t width, const uint8_t *const *in, size_t n_in,
                            size_t groups, uint8_t *out)
{
    const uint32_t P = 8 / bits, mask = (1u << bits) - 1;
    for (size_t g = 0; g < groups; g++) {
        uint32_t s[256];
        memset(s, 0, sizeof s);
        for (size_t k = 0; k < n_in; k++) {
            const uint8_t *p = in[k] + g * PSAGG_THC_GROUP_BYTES;
            for (uint32_t i = 0; i < PSAGG_THC_GROUP_BYTES; i++)
                for (uint32_t j = 0; j < P; j++)
                    s[j * 64 + i] += (uint32_t)(p[i] >> (j * bits)) & mask;
        }
        for (uint32_t x = 0; x < 64 * P; x++) {
            if (width == 4) {
                if (x < 32 * P)
                    out[g * 32 * P + x] = (uint8_t)(s[x] | s[x + 32 * P] << 4);
            } else if (width == 8) {
                out[g * 64 * P + x] = (uint8_t)s[x];
            } else {
                out[2 * (g * 64 * P + x)] = (uint8_t)s[x];
                out[2 * (g * 64 * P + x) + 1] = (uint8_t)(s[x] >> 8);
            }
        }
    }
}

/* ---- the workers' side (thc.h, "THE WORKERS' SIDE") ---- */

static uint32_t block_pad(size_t len, uint32_t block)
{
    uint32_t p = PSAGG_THC_MIN_BLOCK;
    if (len >= block)
        return block;
    while (p < len)
        p <<= 1;
    return p;
}

static int block_ok(uint32_t block)
{
    return block >= PSAGG_THC_MIN_BLOCK && block <= PSAGG_THC_MAX_BLOCK && !(block & (block - 1));
}

size_t psagg__thc_blocks(size_t n, uint32_t block)
{
    return block_ok(block) ? (n + block - 1) / block : 0;
}

size_t psagg__thc_rotated_len(size_t n, uint32_t block)
{
    size_t nb = psagg__thc_blocks(n, block);
    if (!nb)
        return 0;
    return (nb - 1) * (size_t)block + block_pad(n - (nb - 1) * (size_t)block, block);
}

/* Block m of a chunk of n elements: its first element and length; returns the length it is
   rotated at. */
static uint32_t block_of(size_t n, uint32_t block, size_t m, size_t *base, size_t *len)
{
    *base = m * (size_t)block;
    *len = n - *base < block ? n - *base : block;
    return block_pad(*len, block);
}

/* A scale of the table: +0 (none yet), or in [PSAGG_THC_MIN_SCALE, PSAGG_THC_MAX_SCALE]. */
static int scale_ok(float c)
{
    uint32_t u;
    memcpy(&u, &c, 4);
    return u == 0 || (c >= PSAGG_THC_MIN_SCALE && c <= PSAGG_THC_MAX_SCALE);
}

static psagg_status check_args(uint32_t bits, uint32_t block, const float *scales, size_t nb)
{
    if (!bits_ok(bits))
        return psagg__fail(PSAGG_EINVAL, "thc: bits %u (2 or 4)", bits);
    if (!block_ok(block))
        return psagg__fail(PSAGG_EINVAL, "thc: block %u is not a power of two in %u..%u", block,
                           PSAGG_THC_MIN_BLOCK, PSAGG_THC_MAX_BLOCK);
    for (size_t m = 0; m < nb; m++)
        if (!scale_ok(scales[m]))
            return psagg__fail(PSAGG_EINVAL, "thc: block %zu: scale %g (0, or %g..%g)", m,
                               (double)scales[m], (double)PSAGG_THC_MIN_SCALE,
                               (double)PSAGG_THC_MAX_SCALE);
    return PSAGG_OK;
}

psagg_status psagg__thc_encode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                               const float *scales, const float *x, float *residual, size_t n,
                               psagg__rng_key key, uint8_t *out, size_t out_len, size_t *bad_index,
                               float *peaks)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block), e0 = 0;
    const psagg__thc_worker *wk = psagg__impl_current()->thc_worker;
    const float max_abs = PSAGG_THC_MAX_ABS;
    uint32_t lim; /* (|x| beyond it, or a NaN: bits above its bits) */
    psagg_status st;
    float *y;
    uint8_t *q;

    if (!n || !x || !out || !scales)
        return psagg__fail(PSAGG_EINVAL, "thc encode: %s", n ? "a NULL buffer" : "no elements");
    if ((st = check_args(bits, block, scales, nb)))
        return st;
    if (out_len != psagg__thc_index_bytes(bits, np))
        return psagg__fail(PSAGG_EINVAL,
                           "thc encode: an output of %zu bytes; %zu elements take %zu", out_len, n,
                           psagg__thc_index_bytes(bits, np));
    y = malloc(block * sizeof *y);
    q = malloc(block);
    if (!y || !q) {
        free(y), free(q);
        return psagg__fail(PSAGG_ENOMEM, "thc: a block of %u", block);
    }
    memcpy(&lim, &max_abs, 4);
    memset(out + np * bits / 8, 0, out_len - np * bits / 8); /* (the padding) */
    for (size_t m = 0; m < nb; m++) {
        size_t base, len;
        uint32_t p = block_of(n, block, m, &base, &len);
        float peak;
        uint32_t over = wk->abs_max_bits(x + base, len) > lim;
        for (size_t i = 0; over && i < len; i++) /* (out, residual unspecified after a refusal) */
            if (!(fabsf(x[base + i]) <= PSAGG_THC_MAX_ABS)) {
                free(y), free(q);
                if (bad_index)
                    *bad_index = base + i;
                return psagg__fail(isfinite(x[base + i]) ? PSAGG_ERANGE : PSAGG_ENONFINITE,
                                   "thc: element %zu is %g%s", base + i, (double)x[base + i],
                                   isfinite(x[base + i]) ? ", beyond 2^100" : "");
            }
        wk->encode_block(bits, p, (uint32_t)len, scales[m], rot, key, e0, x + base,
                         residual ? residual + e0 : NULL, y, q, out + e0 * bits / 8, &peak);
        if (peaks)
            peaks[m] = peak;
        e0 += p;
    }
    free(y), free(q);
    return PSAGG_OK;
}

/* The sums of a sum stream's groups in element order (thc.h's planes undone): S[e]; the
   process's ISA (cpu/thc_body.h). */
static void unplane(uint32_t bits, uint32_t width, const uint8_t *sum, size_t groups, uint16_t *S)
{
    psagg__impl_current()->thc_worker->unplane(bits, width, sum, groups, S);
}

/* psagg__thc_decode from the sums S (unplane's), checked. */
static psagg_status decode_sums(uint32_t bits, uint32_t block, psagg__rng_key rot,
                                const float *scales, const uint16_t *S, size_t inputs,
                                const uint32_t *counts, size_t n, float factor, psagg__decode_op op,
                                float *out)
{
    size_t nb = psagg__thc_blocks(n, block), e0 = 0;
    const uint32_t L = 1u << bits;
    const psagg__thc_worker *wk = psagg__impl_current()->thc_worker;
    float *z = malloc(block * sizeof *z);

    if (!z)
        return psagg__fail(PSAGG_ENOMEM, "thc: a block of %u", block);
    for (size_t m = 0; m < nb; m++) {
        size_t base, len;
        uint32_t p = block_of(n, block, m, &base, &len);
        wk->decode_block(
            p, (uint32_t)len, scales[m] / (float)(L - 1), op == PSAGG_DECODE_SCALE ? factor : 1.0f,
            (int32_t)((counts ? counts[m] : inputs) * (L - 1)), rot, e0, S + e0, z, op, out + base);
        e0 += p;
    }
    free(z);
    return PSAGG_OK;
}

psagg_status psagg__thc_decode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                               const float *scales, const uint8_t *sum, size_t sum_len,
                               size_t inputs, const uint32_t *counts, size_t n, float factor,
                               psagg__decode_op op, float *out)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block);
    const uint32_t w = psagg__thc_sum_width(bits, inputs);
    psagg_status st;
    uint16_t *S;

    if (!n || !sum || !out || !scales)
        return psagg__fail(PSAGG_EINVAL, "thc decode: %s", n ? "a NULL buffer" : "no elements");
    if ((st = check_args(bits, block, scales, nb)))
        return st;
    if (!w || sum_len != psagg__thc_sum_bytes(bits, inputs, np))
        return psagg__fail(PSAGG_EINVAL,
                           "thc decode: a sum of %zu bytes for %zu inputs; %zu "
                           "elements take %zu",
                           sum_len, inputs, n, psagg__thc_sum_bytes(bits, inputs, np));
    if (!(S = malloc(psagg__thc_index_bytes(bits, np) * 8 / bits * sizeof *S)))
        return psagg__fail(PSAGG_ENOMEM, "thc: the sums of %zu elements", np);
    unplane(bits, w, sum, psagg__thc_index_bytes(bits, np) / PSAGG_THC_GROUP_BYTES, S);
    st = decode_sums(bits, block, rot, scales, S, inputs, counts, n, factor, op, out);
    free(S);
    return st;
}

psagg_status psagg__thc_fold(uint32_t bits, const uint8_t *const *in, size_t n_in, size_t in_len,
                             size_t n, uint8_t *out, size_t out_len)
{
    uint32_t w = psagg__thc_sum_width(bits, n_in);
    size_t need = psagg__thc_index_bytes(bits, n);

    if (bits != 2 && bits != 4)
        return psagg__fail(PSAGG_EINVAL, "thc fold: bits %u (2 or 4)", bits);
    if (!in || !out || n_in == 0)
        return psagg__fail(PSAGG_EINVAL, "thc fold: %s", !out ? "NULL output" : "no input");
    if (!w)
        return psagg__fail(PSAGG_EINVAL,
                           "thc fold: %zu inputs of %u bits: their sum does not fit 16 bits", n_in,
                           bits);
    if (in_len != need || out_len != psagg__thc_sum_bytes(bits, n_in, n))
        return psagg__fail(PSAGG_EINVAL, "thc fold of %zu elements: %s is %zu bytes, expected %zu",
                           n, in_len != need ? "an input" : "the output",
                           in_len != need ? in_len : out_len,
                           in_len != need ? need : psagg__thc_sum_bytes(bits, n_in, n));
    for (size_t k = 0; k < n_in; k++)
        if (!in[k])
            return psagg__fail(PSAGG_EINVAL, "thc fold: input %zu is NULL", k);
    (psagg__impl_current()->thc_fold ? psagg__impl_current()->thc_fold : psagg__thc_fold_scalar)(
        bits, w, in, n_in, need / PSAGG_THC_GROUP_BYTES, out);
    return PSAGG_OK;
}

/* ---- the wire format (thc.h, "THE WIRE FORMAT") ---- */

size_t psagg__thc_push_bytes(uint32_t bits, uint32_t block, size_t n)
{
    size_t nb = psagg__thc_blocks(n, block);
    if (!nb || !bits_ok(bits))
        return 0;
    return PSAGG_THC_PUSH_META * nb +
           psagg__thc_index_bytes(bits, psagg__thc_rotated_len(n, block));
}

size_t psagg__thc_update_bytes(uint32_t bits, uint32_t block, size_t n, size_t summed)
{
    size_t nb = psagg__thc_blocks(n, block), sum;
    if (!nb || !bits_ok(bits))
        return 0;
    sum = psagg__thc_sum_bytes(bits, summed, psagg__thc_rotated_len(n, block));
    return sum ? PSAGG_THC_UPDATE_META * nb + sum : 0;
}

size_t psagg__thc_update_cap(uint32_t bits, uint32_t block, size_t n)
{
    /* the widest sum: 16 bits, which 256 inputs at b = 4 (and 86 at b = 2) already take */
    return psagg__thc_update_bytes(bits, block, n, 65535 / ((1u << bits) - 1));
}

float psagg__thc_next_scale(uint32_t bits, float peak)
{
    float c = (bits == 2 ? 0.25f : 0.625f) * peak;
    /* (a peak near 0: no scale, the block's values wait in the residuals until they grow) */
    return c > PSAGG_THC_MAX_SCALE ? PSAGG_THC_MAX_SCALE : c >= PSAGG_THC_MIN_SCALE ? c : 0;
}

static float get_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

float psagg__thc_push_scale(const uint8_t *push, size_t m)
{
    return get_f32(push + PSAGG_THC_PUSH_META * m);
}

psagg_status psagg__thc_push_encode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                                    const float *scales, const float *x, float *residual, size_t n,
                                    psagg__rng_key key, uint8_t *out, size_t out_len,
                                    size_t *bad_index)
{
    size_t nb = psagg__thc_blocks(n, block), meta = PSAGG_THC_PUSH_META * nb;
    float *peaks;
    psagg_status st;

    if (!nb || !bits_ok(bits) || out_len != psagg__thc_push_bytes(bits, block, n))
        return psagg__fail(PSAGG_EINVAL,
                           "thc push: %zu bytes for %zu elements (thc%u/%u takes %zu)", out_len, n,
                           bits, block, psagg__thc_push_bytes(bits, block, n));
    if (!(peaks = malloc(nb * sizeof *peaks)))
        return psagg__fail(PSAGG_ENOMEM, "thc: the peaks of %zu blocks", nb);
    st = psagg__thc_encode(bits, block, rot, scales, x, residual, n, key, out + meta,
                           out_len - meta, bad_index, peaks);
    for (size_t m = 0; !st && m < nb; m++) {
        memcpy(out + PSAGG_THC_PUSH_META * m, &scales[m], 4);
        memcpy(out + PSAGG_THC_PUSH_META * m + 4, &peaks[m], 4);
    }
    free(peaks);
    return st;
}

/* A peak: finite and >= +0 (its bit pattern below +Inf's: -0 and NaN are not). */
static int peak_ok(float p)
{
    return get_u32((const uint8_t *)&p) < 0x7F800000u;
}

psagg_status psagg__thc_push_check(uint32_t bits, uint32_t block, const uint8_t *push, size_t len,
                                   size_t n)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block), e0 = 0;
    size_t meta = PSAGG_THC_PUSH_META * nb, used;
    const uint8_t *idx = push + meta;

    if (!nb || !bits_ok(bits) || len != psagg__thc_push_bytes(bits, block, n))
        return psagg__fail(PSAGG_EBADMETA, "thc push: %zu bytes; %zu elements take %zu", len, n,
                           psagg__thc_push_bytes(bits, block, n));
    for (size_t m = 0; m < nb; m++) {
        size_t base, bl;
        uint32_t p = block_of(n, block, m, &base, &bl);
        float c = psagg__thc_push_scale(push, m), pk = get_f32(push + PSAGG_THC_PUSH_META * m + 4);
        if (!scale_ok(c))
            return psagg__fail(PSAGG_EBADMETA, "thc push: block %zu: scale %g (0, or %g..%g)", m,
                               (double)c, (double)PSAGG_THC_MIN_SCALE, (double)PSAGG_THC_MAX_SCALE);
        if (!peak_ok(pk))
            return psagg__fail(PSAGG_EBADMETA, "thc push: block %zu: peak %g (finite, >= +0)", m,
                               (double)pk);
        if (c == 0) /* blocks start on bytes: P * b is a multiple of 8 */
            for (size_t i = e0 * bits / 8; i < (e0 + p) * bits / 8; i++)
                if (idx[i])
                    return psagg__fail(PSAGG_EBADMETA,
                                       "thc push: block %zu has scale 0 but indices other than 0",
                                       m);
        e0 += p;
    }
    used = np * bits / 8; /* (N' is a multiple of 64: whole bytes) */
    for (size_t i = used; i < len - meta; i++)
        if (idx[i])
            return psagg__fail(PSAGG_EBADMETA, "thc push: padding byte %zu is not 0", i);
    return PSAGG_OK;
}

psagg_status psagg__thc_push_values(uint32_t bits, uint32_t block, const uint8_t *push, size_t len,
                                    size_t n, float *acc)
{
    size_t nb = psagg__thc_blocks(n, block), e0 = 0;
    const uint32_t L = 1u << bits;
    psagg_status st = psagg__thc_push_check(bits, block, push, len, n);
    if (st)
        return st;
    for (size_t m = 0; m < nb; m++) {
        size_t base, bl;
        uint32_t p = block_of(n, block, m, &base, &bl);
        float c = psagg__thc_push_scale(push, m), step = c / (float)(L - 1);
        if (c > 0)
            for (uint32_t i = 0; i < p; i++) {
                uint32_t q = psagg__thc_index_at(bits, push + PSAGG_THC_PUSH_META * nb, e0 + i);
                acc[e0 + i] = acc[e0 + i] + (float)(2 * (int32_t)q - (int32_t)(L - 1)) * step;
            }
        e0 += p;
    }
    return PSAGG_OK;
}

psagg_status psagg__thc_update_fold(uint32_t bits, uint32_t block, const uint8_t *const *pushes,
                                    size_t n_in, size_t push_len, size_t n, uint8_t *out,
                                    size_t out_len)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block);
    size_t pmeta = PSAGG_THC_PUSH_META * nb, umeta = PSAGG_THC_UPDATE_META * nb;
    const uint8_t *idx[64];
    const uint8_t **in = n_in <= 64 ? idx : malloc(n_in * sizeof *in);
    psagg_status st;

    if (!in)
        return psagg__fail(PSAGG_ENOMEM, "thc: %zu inputs", n_in);
    if (!n_in || push_len != psagg__thc_push_bytes(bits, block, n) ||
        out_len != psagg__thc_update_bytes(bits, block, n, n_in)) {
        st = psagg__fail(PSAGG_EINVAL, "thc fold: %zu pushes of %zu bytes into %zu", n_in, push_len,
                         out_len);
        goto out;
    }
    for (size_t m = 0; m < nb; m++) {
        uint32_t scale = 0, peak = 0, count = 0;
        for (size_t k = 0; k < n_in; k++) {
            uint32_t c = get_u32(pushes[k] + PSAGG_THC_PUSH_META * m),
                     pk = get_u32(pushes[k] + PSAGG_THC_PUSH_META * m + 4);
            if (c) {
                scale = c;
                count++;
            }
            peak = pk > peak ? pk : peak; /* (finite, >= +0: the bit patterns order them) */
        }
        memcpy(out + PSAGG_THC_UPDATE_META * m, &scale, 4);
        memcpy(out + PSAGG_THC_UPDATE_META * m + 4, &peak, 4);
        memcpy(out + PSAGG_THC_UPDATE_META * m + 8, &count, 4);
    }
    for (size_t k = 0; k < n_in; k++)
        in[k] = pushes[k] + pmeta;
    st = psagg__thc_fold(bits, in, n_in, push_len - pmeta, np, out + umeta, out_len - umeta);
out:
    if (in != idx)
        free(in);
    return st;
}

psagg_status psagg__thc_update_meta(uint32_t bits, uint32_t block, const uint8_t *update,
                                    size_t len, size_t n, size_t *inputs, float *scales,
                                    uint32_t *counts)
{
    size_t nb = psagg__thc_blocks(n, block);
    const uint32_t L = 1u << bits;

    if (!nb || !bits_ok(bits))
        return psagg__fail(PSAGG_EINVAL, "thc update: thc%u/%u", bits, block);
    /* the width from the length: the widest inputs of each */
    if (len == psagg__thc_update_bytes(bits, block, n, 15 / (L - 1)))
        *inputs = 15 / (L - 1);
    else if (len == psagg__thc_update_bytes(bits, block, n, 255 / (L - 1)))
        *inputs = 255 / (L - 1);
    else if (len == psagg__thc_update_bytes(bits, block, n, 65535 / (L - 1)))
        *inputs = 65535 / (L - 1);
    else
        return psagg__fail(PSAGG_EBADMETA,
                           "thc update: %zu bytes; %zu elements take %zu, %zu or %zu (4-, 8- or "
                           "16-bit sums)",
                           len, n, psagg__thc_update_bytes(bits, block, n, 15 / (L - 1)),
                           psagg__thc_update_bytes(bits, block, n, 255 / (L - 1)),
                           psagg__thc_update_bytes(bits, block, n, 65535 / (L - 1)));
    for (size_t m = 0; m < nb; m++) {
        const uint8_t *mt = update + PSAGG_THC_UPDATE_META * m;
        float c = get_f32(mt), pk = get_f32(mt + 4);
        uint32_t k = get_u32(mt + 8);
        if (!scale_ok(c) || !peak_ok(pk) || k > *inputs || (k == 0) != (c == 0))
            return psagg__fail(PSAGG_EBADMETA,
                               "thc update: block %zu: scale %g, peak %g, count %u (a count up to "
                               "%zu, 0 exactly when the scale is)",
                               m, (double)c, (double)pk, k, *inputs);
        if (scales)
            scales[m] = c;
        if (counts)
            counts[m] = k;
    }
    return PSAGG_OK;
}

void psagg__thc_update_next_scales(uint32_t bits, uint32_t block, const uint8_t *update, size_t n,
                                   float *next_scales)
{
    for (size_t m = 0, nb = psagg__thc_blocks(n, block); m < nb; m++)
        next_scales[m] =
            psagg__thc_next_scale(bits, get_f32(update + PSAGG_THC_UPDATE_META * m + 4));
}

void psagg__thc_update_peaks(uint32_t block, const uint8_t *update, size_t n, float *peaks)
{
    for (size_t m = 0, nb = psagg__thc_blocks(n, block); m < nb; m++)
        peaks[m] = get_f32(update + PSAGG_THC_UPDATE_META * m + 4);
}

psagg_status psagg__thc_update_decode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                                      const uint8_t *update, size_t len, size_t n, float factor,
                                      psagg__decode_op op, float *out, float *next_scales)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block), e0 = 0;
    size_t umeta = PSAGG_THC_UPDATE_META * nb, inputs = 0;
    const uint32_t L = 1u << bits;
    const psagg__thc_worker *wk = psagg__impl_current()->thc_worker;
    uint32_t *counts = NULL;
    float *scales = NULL;
    uint16_t *S = NULL;
    psagg_status st;

    if (!nb || !bits_ok(bits))
        return psagg__fail(PSAGG_EINVAL, "thc update: thc%u/%u", bits, block);
    scales = malloc(nb * sizeof *scales);
    counts = malloc(nb * sizeof *counts);
    S = malloc(psagg__thc_index_bytes(bits, np) * 8 / bits * sizeof *S);
    if (!scales || !counts || !S) {
        st = psagg__fail(PSAGG_ENOMEM, "thc: the update of %zu elements", n);
        goto out;
    }
    if ((st = psagg__thc_update_meta(bits, block, update, len, n, &inputs, scales, counts)))
        goto out;
    unplane(bits, psagg__thc_sum_width(bits, inputs), update + umeta,
            psagg__thc_index_bytes(bits, np) / PSAGG_THC_GROUP_BYTES, S);
    for (size_t m = 0; m < nb; m++) { /* no sum above what the block's pushes can make */
        size_t base, bl;
        uint32_t p = block_of(n, block, m, &base, &bl), top = counts[m] * (L - 1);
        for (uint32_t i = 0, over = wk->sums_max(S + e0, p) > top; over && i < p; i++)
            if (S[e0 + i] > top) { /* (the first that is: named) */
                st = psagg__fail(PSAGG_EBADMETA,
                                 "thc update: element %zu's sum %u is more than %u pushes make",
                                 e0 + i, S[e0 + i], counts[m]);
                goto out;
            }
        e0 += p;
    }
    if (!(st = decode_sums(bits, block, rot, scales, S, inputs, counts, n, factor, op, out)) &&
        next_scales)
        psagg__thc_update_next_scales(bits, block, update, n, next_scales);
out:
    free(scales);
    free(counts);
    free(S);
    return st;
}
