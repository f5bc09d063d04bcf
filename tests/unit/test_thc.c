/*
 * test_thc.c - kernels/thc.h's index and sum streams and the integer fold: sizes and the sum's
 * width against the spec's bound; the fold of random index streams against a reference that
 * reads every element's index and adds them (psagg__thc_index_at, psagg__thc_sum_at), for 2 and
 * 4 bits, sizes on and off a group, 1 to 86 inputs (both sides of each width's limit), on every
 * ISA this CPU has, each path the same bytes as the scalar fold; the bound at a job's largest
 * worker count (1,024 streams of the largest index: every sum exact in 16 bits); a golden
 * digest; and every bad argument refused by name.
 */
#include "../testutil.h"
#include "kernels/codec.h"
#include "kernels/thc.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint8_t next_byte(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(rng >> 56);
}

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* A random index stream of n elements: zero padding after element n - 1, as the spec says. */
static void fill(uint8_t *p, uint32_t bits, size_t n, size_t len)
{
    for (size_t i = 0; i < len; i++)
        p[i] = next_byte();
    for (size_t b = n * bits; b < 8 * len; b++)
        p[b / 8] &= (uint8_t) ~(1u << (b % 8));
}

/* Fold on every ISA; each must write the scalar path's bytes. Returns the scalar output. */
static uint8_t *fold_all(uint32_t bits, const uint8_t *const *in, size_t n_in, size_t n,
                         const char *what)
{
    size_t in_len = psagg__thc_index_bytes(bits, n), out_len = psagg__thc_sum_bytes(bits, n_in, n);
    uint8_t *ref = malloc(out_len), *got = malloc(out_len);
    psagg__isa was = psagg__codec_isa();
    CHECK(ref && got && out_len, "%s: memory (%zu bytes)", what, out_len);
    for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa))
            continue;
        CHECK(!psagg__codec_set_isa((psagg__isa)isa), "set isa %d", isa);
        memset(got, 0xA5, out_len);
        CHECK(!psagg__thc_fold(bits, in, n_in, in_len, n, isa ? got : ref, out_len), "%s: %s: %s",
              what, psagg__isa_name((psagg__isa)isa), psagg_last_error());
        CHECK(!isa || !memcmp(got, ref, out_len), "%s: %s writes other bytes than scalar", what,
              psagg__isa_name((psagg__isa)isa));
    }
    psagg__codec_set_isa(was);
    free(got);
    return ref;
}

int main(void)
{
    static const size_t ns[] = {1, 100, 128, 129, 255, 256, 257, 1000, 70000};
    static const size_t n_ins[] = {1, 2, 4, 8, 17, 18, 85, 86};
    int cases = 0;

    /* sizes and widths: the spec's formulas and limits */
    CHECK(psagg__thc_index_bytes(4, 1) == 64 && psagg__thc_index_bytes(4, 128) == 64 &&
              psagg__thc_index_bytes(4, 129) == 128 && psagg__thc_index_bytes(2, 256) == 64 &&
              psagg__thc_index_bytes(2, 257) == 128 && psagg__thc_index_bytes(3, 10) == 0,
          "index stream sizes");
    CHECK(psagg__thc_sum_width(4, 17) == 8 && psagg__thc_sum_width(4, 18) == 16 &&
              psagg__thc_sum_width(4, 4369) == 16 && psagg__thc_sum_width(4, 4370) == 0 &&
              psagg__thc_sum_width(2, 85) == 8 && psagg__thc_sum_width(2, 86) == 16 &&
              psagg__thc_sum_width(2, 21845) == 16 && psagg__thc_sum_width(2, 21846) == 0 &&
              psagg__thc_sum_width(4, 0) == 0 && psagg__thc_sum_width(8, 2) == 0,
          "sum widths");
    CHECK(psagg__thc_sum_bytes(4, 4, 129) == 2 * 128 && psagg__thc_sum_bytes(4, 18, 129) == 512 &&
              psagg__thc_sum_bytes(2, 4, 1) == 256,
          "sum stream sizes");

    /* the fold against the per-element reference, every ISA equal */
    for (uint32_t bits = 2; bits <= 4; bits += 2)
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof n_ins / sizeof *n_ins; b++, cases++) {
                size_t n = ns[a], n_in = n_ins[b], len = psagg__thc_index_bytes(bits, n);
                uint32_t w = psagg__thc_sum_width(bits, n_in);
                uint8_t **in = malloc(n_in * sizeof *in), *sum;
                char what[64];
                snprintf(what, sizeof what, "%u bits, n %zu, %zu inputs", bits, n, n_in);
                CHECK(in, "memory");
                for (size_t k = 0; k < n_in; k++) {
                    in[k] = malloc(len);
                    CHECK(in[k], "memory");
                    fill(in[k], bits, n, len);
                }
                sum = fold_all(bits, (const uint8_t *const *)in, n_in, n, what);
                for (size_t e = 0; e < len * 8 / bits; e++) { /* padding elements sum to 0 */
                    uint32_t want = 0;
                    for (size_t k = 0; k < n_in; k++)
                        want += psagg__thc_index_at(bits, in[k], e);
                    CHECK(e < n || want == 0, "%s: padding element %zu has index bits", what, e);
                    CHECK(psagg__thc_sum_at(bits, w, sum, e) == want,
                          "%s: element %zu sums to %u, not %u", what, e,
                          psagg__thc_sum_at(bits, w, sum, e), want);
                }
                for (size_t k = 0; k < n_in; k++)
                    free(in[k]);
                free(in), free(sum);
            }

    /* the bound: a job's 1,024 workers, every index the largest, every sum exact */
    for (uint32_t bits = 2; bits <= 4; bits += 2) {
        size_t n = 1000, n_in = 1024, len = psagg__thc_index_bytes(bits, n);
        uint8_t *one = malloc(len), *sum;
        const uint8_t **in = malloc(n_in * sizeof *in);
        CHECK(one && in, "memory");
        memset(one, 0xFF, len);
        for (size_t b = n * bits; b < 8 * len; b++)
            one[b / 8] &= (uint8_t) ~(1u << (b % 8));
        for (size_t k = 0; k < n_in; k++)
            in[k] = one;
        CHECK(psagg__thc_sum_width(bits, n_in) == 16, "1,024 inputs at %u bits: 16-bit sums", bits);
        sum = fold_all(bits, in, n_in, n, "1,024 inputs of the largest index");
        for (size_t e = 0; e < n; e++)
            CHECK(psagg__thc_sum_at(bits, 16, sum, e) == 1024u * ((1u << bits) - 1),
                  "%u bits: element %zu of 1,024 largest indices sums to %u", bits, e,
                  psagg__thc_sum_at(bits, 16, sum, e));
        free(one), free(in), free(sum);
    }

    /* golden: one fold's bytes, pinned (a change is a wire format change) */
    {
        size_t n = 3000, len = psagg__thc_index_bytes(4, n);
        uint8_t *in[5], *sum;
        rng = 0x9E3779B97F4A7C15ull;
        for (int k = 0; k < 5; k++) {
            in[k] = malloc(len);
            CHECK(in[k], "memory");
            fill(in[k], 4, n, len);
        }
        sum = fold_all(4, (const uint8_t *const *)in, 5, n, "golden");
        printf("test_thc: golden fold of 5 x 3000 4-bit indices: %zu bytes, digest %016llx\n",
               psagg__thc_sum_bytes(4, 5, n),
               (unsigned long long)fnv(sum, psagg__thc_sum_bytes(4, 5, n)));
        CHECK(fnv(sum, psagg__thc_sum_bytes(4, 5, n)) == 0x442ab950e3a02b4aull,
              "the golden fold's bytes changed: %016llx",
              (unsigned long long)fnv(sum, psagg__thc_sum_bytes(4, 5, n)));
        for (int k = 0; k < 5; k++)
            free(in[k]);
        free(sum);
    }

    /* refusals, each naming what */
    {
        size_t n = 100, len = psagg__thc_index_bytes(4, n);
        uint8_t *one = calloc(len, 1), *out = malloc(4 * len + 64);
        const uint8_t *in[2] = {one, one}, *hole[2] = {one, NULL};
        CHECK(one && out, "memory");
        CHECK(psagg__thc_fold(3, in, 2, len, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "bits 3"),
              "bits 3: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, in, 0, len, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "no input"),
              "no input: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, in, 2, len - 1, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "an input is 63 bytes"),
              "short input: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, in, 2, len, n, out, 2 * len + 1) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "the output"),
              "long output: %s", psagg_last_error());
        CHECK(psagg__thc_fold(4, hole, 2, len, n, out, 2 * len) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "input 1 is NULL"),
              "NULL input: %s", psagg_last_error());
        {
            const uint8_t **many = malloc(4370 * sizeof *many);
            CHECK(many, "memory");
            for (int k = 0; k < 4370; k++)
                many[k] = one;
            CHECK(psagg__thc_fold(4, many, 4370, len, n, out, 2 * len) == PSAGG_EINVAL &&
                      strstr(psagg_last_error(), "does not fit 16 bits"),
                  "4,370 inputs: %s", psagg_last_error());
            free(many);
        }
        free(one), free(out);
    }
    printf("test_thc: %d folds against the reference on every ISA, the 1,024-worker bound, "
           "refusals named\n",
           cases);
    return 0;
}
