/*
 * test_topk.c - kernels/topk.c: the k entries of largest magnitude, ties by the lower index,
 * against a reference that sorts (qsort by magnitude descending, then index), on blocks with
 * random values, many ties, zeros of both signs, subnormals, one distinct value, and every k
 * from 1 to n on small blocks; and the returned threshold.
 */
#include "../testutil.h"
#include "kernels/topk.h"

#include <stdlib.h>
#include <string.h>

static const float *ref_v;

static uint32_t magnitude(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7FFFFFFFu;
}

static int by_magnitude(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    uint32_t mi = magnitude(ref_v[i]), mj = magnitude(ref_v[j]);
    if (mi != mj)
        return mi > mj ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int ascending(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    return i < j ? -1 : i > j;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* One block of n values of `kind`, checked for k against the reference. */
static void check(const float *v, uint32_t n, uint32_t k, const char *what)
{
    uint32_t *idx = malloc(n * sizeof *idx), *want = malloc(n * sizeof *want),
             *scratch = malloc(n * sizeof *scratch), t;
    CHECK(idx && want && scratch, "memory");
    for (uint32_t i = 0; i < n; i++)
        want[i] = i;
    ref_v = v;
    qsort(want, n, sizeof *want, by_magnitude);
    uint32_t kth = magnitude(v[want[k - 1]]);
    qsort(want, k, sizeof *want, ascending);
    memset(idx, 0xFF, n * sizeof *idx);
    t = psagg__topk_select(v, n, k, idx, scratch);
    CHECK(t == kth, "%s n=%u k=%u: threshold 0x%08x, the k-th largest 0x%08x", what, n, k, t, kth);
    for (uint32_t j = 0; j < k; j++)
        CHECK(idx[j] == want[j], "%s n=%u k=%u: kept index %u is %u, the reference's %u", what, n,
              k, j, idx[j], want[j]);
    CHECK(k == n || idx[k] == UINT32_MAX, "%s n=%u k=%u: more than k indices written", what, n, k);
    free(idx), free(want), free(scratch);
}

static void fill(float *v, uint32_t n, int kind)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = next32();
        switch (kind) {
        case 0: /* spread: Gaussian-ish sums of uniforms, both signs */
            v[i] = ((float)(r & 0xFFFF) - 32768.0f) / 4096.0f * ((float)(next32() & 0xFF) / 64.0f);
            break;
        case 1: /* few distinct magnitudes: many ties */
            v[i] = (float)((int)(r % 7) - 3) * 0.25f;
            break;
        case 2: /* zeros of both signs and a few values */
            v[i] = r % 5 == 0 ? (float)(r % 11) : (r & 1 ? -0.0f : 0.0f);
            break;
        case 3: /* subnormals and tiny normals */
        {
            uint32_t u = (r % 0x01000000u) | (r & 0x80000000u);
            memcpy(&v[i], &u, sizeof u);
        } break;
        case 4: /* one value, both signs */
            v[i] = r & 1 ? 1.5f : -1.5f;
            break;
        default: /* magnitudes differing only in the low byte, then the next, ... */
        {
            uint32_t u = 0x3F800000u | (r & 0xFFFFu);
            memcpy(&v[i], &u, sizeof u);
            if (r & 0x10000u)
                v[i] = -v[i];
        }
        }
    }
}

int main(void)
{
    static const char *kinds[] = {"spread", "ties", "zeros", "subnormal", "constant", "low-bits"};
    uint32_t sizes[] = {1, 2, 3, 17, 64, 257, 4096, 65536};
    float *v = malloc(65536 * sizeof *v);
    int cases = 0;
    CHECK(v, "memory");
    for (int kind = 0; kind < 6; kind++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            uint32_t n = sizes[s];
            fill(v, n, kind);
            if (n <= 64) { /* every k */
                for (uint32_t k = 1; k <= n; k++, cases++)
                    check(v, n, k, kinds[kind]);
            } else { /* 1, 1 %, 2 %, 3 %, half, n - 1, n */
                uint32_t ks[] = {1, n / 100 + 1, n / 50 + 1, n * 3 / 100 + 1, n / 2, n - 1, n};
                for (size_t j = 0; j < sizeof ks / sizeof *ks; j++, cases++)
                    check(v, n, ks[j], kinds[kind]);
            }
        }
    free(v);
    printf("test_topk: %d cases ok (the kept indices and the threshold equal the sorting "
           "reference's)\n",
           cases);
    return 0;
}
