/* topk.c - see topk.h. */
#include "kernels/topk.h"

#include <string.h>

static inline uint32_t mag(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7FFFFFFFu;
}

uint32_t psagg__topk_select(const float *v, uint32_t n, uint32_t k, uint32_t *idx,
                            uint32_t *scratch)
{
    uint32_t count[256], prefix = 0, mask = 0, above = 0, cand = n, taken = 0, ties, want;
    const uint32_t *from = NULL; /* NULL: every index 0..n-1 is a candidate */

    /* from the most significant byte down: which byte value the k-th largest has */
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint32_t need = k - above, acc = 0, bin = 0;
        memset(count, 0, sizeof count);
        for (uint32_t j = 0; j < cand; j++)
            count[(mag(v[from ? from[j] : j]) >> shift) & 0xFF]++;
        for (int b = 255; b >= 0; b--) { /* the bin where the count from the top reaches need */
            if (acc + count[b] >= need) {
                bin = (uint32_t)b;
                break;
            }
            acc += count[b];
        }
        above += acc; /* entries in the bins above: larger than any in this bin */
        prefix |= bin << shift;
        mask |= 0xFFu << shift;
        if (shift == 0)
            break;
        /* the next pass looks at this bin's entries only */
        uint32_t m = 0;
        for (uint32_t j = 0; j < cand; j++) {
            uint32_t i = from ? from[j] : j;
            if ((mag(v[i]) & mask) == prefix)
                scratch[m++] = i;
        }
        from = scratch;
        cand = m;
    }
    /* prefix is the k-th largest magnitude: keep every larger one and, of those equal to it,
       the first k - (larger) by index */
    ties = k - above;
    want = prefix;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = mag(v[i]);
        if (u > want || (u == want && ties > 0)) {
            ties -= u == want;
            idx[taken++] = i;
        }
    }
    return want;
}
