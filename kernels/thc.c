/* thc.c - the index and sum streams of integer aggregation (kernels/thc.h): sizes, the scalar
   fold, element access. Layer: kernels. */
#include "kernels/thc.h"

#include <string.h>

size_t psagg__thc_index_bytes(uint32_t bits, size_t n)
{
    if (bits != 2 && bits != 4)
        return 0;
    return PSAGG_THC_GROUP_BYTES *
           ((n * bits + 8 * PSAGG_THC_GROUP_BYTES - 1) / (8 * PSAGG_THC_GROUP_BYTES));
}

uint32_t psagg__thc_sum_width(uint32_t bits, size_t inputs)
{
    uint64_t top;
    if ((bits != 2 && bits != 4) || inputs == 0 || inputs > 65535)
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
