/* thc.c - integer aggregation (kernels/thc.h): the index and sum streams, the scalar fold,
   element access, and the workers' rotation, encode and decode. Layer: kernels. */
#include "kernels/thc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

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
    return top <= 255 ? 8 : top <= 65535 ? 16 : 0;
}

size_t psagg__thc_sum_bytes(uint32_t bits, size_t inputs, size_t n)
{
    uint32_t w = psagg__thc_sum_width(bits, inputs);
    /* groups x G elements x w / 8 bytes; G * b = 512 bits */
    return w ? psagg__thc_index_bytes(bits, n) / PSAGG_THC_GROUP_BYTES * (512 / bits) * (w / 8) : 0;
}

uint32_t psagg__thc_index_at(uint32_t bits, const uint8_t *in, size_t e)
{
    return (in[e * bits / 8] >> (e * bits % 8)) & ((1u << bits) - 1);
}

uint32_t psagg__thc_sum_at(uint32_t bits, uint32_t width, const uint8_t *sum, size_t e)
{
    size_t G = 512 / bits, P = 8 / bits, g = e / G, r = e % G;
    size_t at = g * G + (r % P) * 64 + r / P; /* plane r % P, position r / P */
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
            if (width == 8) {
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

/* dst_i = s_(e0 + i) * src_i for i < len (thc.h's signs: one hash per 32 of them). */
static void apply_signs(psagg__rng_key rot, size_t e0, const float *src, float *dst, size_t len)
{
    uint32_t h = 0;
    for (size_t i = 0; i < len; i++) {
        size_t e = e0 + i;
        if (i == 0 || !(e & 31))
            h = psagg__rng_hash32(rot.k0, rot.k1, (uint32_t)(e >> 5));
        dst[i] = (h >> (e & 31)) & 1 ? -src[i] : src[i];
    }
}

/* y <- H y in place (thc.h's stages). */
static void hadamard(float *y, uint32_t p)
{
    for (uint32_t h = 1; h < p; h <<= 1)
        for (uint32_t i = 0; i < p; i++)
            if (!(i & h)) {
                float a = y[i], b = y[i + h];
                y[i] = a + b;
                y[i + h] = a - b;
            }
}

static psagg_status check_args(uint32_t bits, uint32_t block, const float *scales, size_t nb)
{
    if (!bits_ok(bits))
        return psagg__fail(PSAGG_EINVAL, "thc: bits %u (2 or 4)", bits);
    if (!block_ok(block))
        return psagg__fail(PSAGG_EINVAL, "thc: block %u is not a power of two in %u..%u", block,
                           PSAGG_THC_MIN_BLOCK, PSAGG_THC_MAX_BLOCK);
    for (size_t m = 0; m < nb; m++)
        if (!(scales[m] > 0) || !isfinite(scales[m]))
            return psagg__fail(PSAGG_EINVAL, "thc: block %zu: scale %g (finite and > 0)", m,
                               (double)scales[m]);
    return PSAGG_OK;
}

psagg_status psagg__thc_encode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                               const float *scales, const float *x, float *residual, size_t n,
                               psagg__rng_key key, uint8_t *out, size_t out_len, size_t *bad_index)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block), e0 = 0;
    const uint32_t L = 1u << bits;
    psagg_status st;
    float *y;

    if (!n || !x || !out || !scales)
        return psagg__fail(PSAGG_EINVAL, "thc encode: %s", n ? "a NULL buffer" : "no elements");
    if ((st = check_args(bits, block, scales, nb)))
        return st;
    if (out_len != psagg__thc_index_bytes(bits, np))
        return psagg__fail(PSAGG_EINVAL,
                           "thc encode: an output of %zu bytes; %zu elements take %zu", out_len, n,
                           psagg__thc_index_bytes(bits, np));
    if (!(y = malloc(block * sizeof *y)))
        return psagg__fail(PSAGG_ENOMEM, "thc: a block of %u", block);
    memset(out, 0, out_len);
    for (size_t m = 0; m < nb; m++) {
        size_t base, len;
        uint32_t p = block_of(n, block, m, &base, &len);
        const float f = 1.0f / sqrtf((float)p), c = scales[m], step = c / (float)(L - 1),
                    a = (float)(L - 1) / (2 * c);
        for (size_t i = 0; i < len; i++) /* (out and residual are unspecified after a refusal) */
            if (!isfinite(x[base + i])) {
                free(y);
                if (bad_index)
                    *bad_index = base + i;
                return psagg__fail(PSAGG_ENONFINITE, "thc: element %zu is %g", base + i,
                                   (double)x[base + i]);
            }
        apply_signs(rot, e0, x + base, y, len);
        memset(y + len, 0, (p - len) * sizeof *y);
        hadamard(y, p);
        for (uint32_t i = 0; i < p; i++) {
            size_t e = e0 + i;
            float v = y[i] * f, u, t;
            uint32_t q;
            if (residual)
                v = v + residual[e];
            u = (fminf(fmaxf(v, -c), c) + c) * a;
            q = (uint32_t)(u + psagg__rng_uniform(key, (uint32_t)e));
            if (q > L - 1)
                q = L - 1;
            t = (float)(2 * (int32_t)q - (int32_t)(L - 1)) * step;
            if (residual)
                residual[e] = v - t;
            out[e * bits / 8] |= (uint8_t)(q << (e * bits % 8));
        }
        e0 += p;
    }
    free(y);
    return PSAGG_OK;
}

psagg_status psagg__thc_decode(uint32_t bits, uint32_t block, psagg__rng_key rot,
                               const float *scales, const uint8_t *sum, size_t sum_len,
                               size_t inputs, size_t n, float factor, float *out)
{
    size_t nb = psagg__thc_blocks(n, block), np = psagg__thc_rotated_len(n, block), e0 = 0;
    const uint32_t L = 1u << bits, w = psagg__thc_sum_width(bits, inputs);
    psagg_status st;
    float *z;

    if (!n || !sum || !out || !scales)
        return psagg__fail(PSAGG_EINVAL, "thc decode: %s", n ? "a NULL buffer" : "no elements");
    if ((st = check_args(bits, block, scales, nb)))
        return st;
    if (!w || sum_len != psagg__thc_sum_bytes(bits, inputs, np))
        return psagg__fail(PSAGG_EINVAL,
                           "thc decode: a sum of %zu bytes for %zu inputs; %zu "
                           "elements take %zu",
                           sum_len, inputs, n, psagg__thc_sum_bytes(bits, inputs, np));
    if (!(z = malloc(block * sizeof *z)))
        return psagg__fail(PSAGG_ENOMEM, "thc: a block of %u", block);
    for (size_t m = 0; m < nb; m++) {
        size_t base, len;
        uint32_t p = block_of(n, block, m, &base, &len);
        const float f = 1.0f / sqrtf((float)p), step = scales[m] / (float)(L - 1);
        for (uint32_t i = 0; i < p; i++) {
            int64_t s2 =
                2 * (int64_t)psagg__thc_sum_at(bits, w, sum, e0 + i) - (int64_t)inputs * (L - 1);
            z[i] = ((float)s2 * step) * factor;
        }
        hadamard(z, p);
        for (uint32_t i = 0; i < len; i++)
            z[i] = z[i] * f;
        apply_signs(rot, e0, z, out + base, len);
        e0 += p;
    }
    free(z);
    return PSAGG_OK;
}
