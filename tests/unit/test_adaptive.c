/*
 * test_adaptive.c - runtime/adaptive.c: the budgeted codec choice is optimal (checked against
 * brute force on small random cases, with the same rounding of sizes to units), never over
 * the budget, the same in another process, refused with the smallest size when the budget is
 * too small; the maxmin error model's inputs (range sums restarted at chunks); the schedule,
 * the candidates and the data header's codec word: a message's codec is checked against the
 * tensor (declared, or a candidate of an adaptive one) and its length against that codec.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/codec.h"
#include "runtime/adaptive.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "testutil.h"

#define MAX_T 6
#define MAX_C 5

/* The least error over every choice whose rounded units above each tensor's smallest option
 * fit in cap (adaptive.h's rounding), or INFINITY. */
static double brute(const psagg__adapt_option *o, size_t T, size_t C, uint64_t unit, uint64_t cap)
{
    uint64_t least[MAX_T];
    for (size_t t = 0; t < T; t++) {
        least[t] = UINT64_MAX;
        for (size_t i = 0; i < C; i++)
            least[t] = o[t * C + i].bytes < least[t] ? o[t * C + i].bytes : least[t];
    }
    size_t idx[MAX_T] = {0};
    double best = INFINITY;
    for (;;) {
        uint64_t units = 0;
        double e = 0;
        int ok = 1;
        for (size_t t = 0; t < T && ok; t++) {
            const psagg__adapt_option *x = &o[t * C + idx[t]];
            ok = x->bytes != UINT64_MAX;
            if (ok) {
                units += (x->bytes - least[t]) / unit + ((x->bytes - least[t]) % unit != 0);
                e += x->error;
            }
        }
        if (ok && units <= cap && e < best)
            best = e;
        size_t t = 0;
        while (t < T && ++idx[t] == C)
            idx[t++] = 0;
        if (t == T)
            return best;
    }
}

static void random_case(uint64_t *rng, psagg__adapt_option *o, size_t T, size_t C, uint64_t *least,
                        uint64_t *most)
{
    *least = *most = 0;
    for (size_t t = 0; t < T; t++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (size_t i = 0; i < C; i++) {
            psagg__adapt_option *x = &o[t * C + i];
            x->bytes = 1 + test_rand64(rng) % 20000;
            x->error = (double)(test_rand64(rng) % 1000000) / 1000.0;
            if (i > 0 && test_rand64(rng) % 5 == 0)
                x->bytes = UINT64_MAX; /* not available */
            if (x->bytes != UINT64_MAX) {
                lo = x->bytes < lo ? x->bytes : lo;
                hi = x->bytes > hi ? x->bytes : hi;
            }
        }
        *least += lo;
        *most += hi;
    }
}

static void test_optimal(void)
{
    uint64_t rng = 0x1234567;
    int cases = 0;
    for (int k = 0; k < 3000; k++) {
        size_t T = 1 + test_rand64(&rng) % MAX_T, C = 1 + test_rand64(&rng) % MAX_C;
        psagg__adapt_option o[MAX_T * MAX_C];
        uint32_t choice[MAX_T];
        uint64_t least, most, budget, bytes, unit;
        double err, want;
        psagg_status st;

        random_case(&rng, o, T, C, &least, &most);
        budget = least - 1 + test_rand64(&rng) % (most - least + 3);
        st = psagg__adapt_solve(o, T, C, budget, choice, &bytes, &err);
        if (budget < least) {
            CHECK(st == PSAGG_EINVAL, "case %d: below the smallest choice, status %d", k, st);
            continue;
        }
        unit = psagg__adapt_unit(budget - least, T);
        want = brute(o, T, C, unit, (budget - least) / unit);
        CHECK(st == PSAGG_OK, "case %d: %s", k, psagg_last_error());
        CHECK(bytes <= budget, "case %d: %llu bytes over the budget %llu", k,
              (unsigned long long)bytes, (unsigned long long)budget);
        CHECK(fabs(err - want) <= 1e-9 * (1 + want), "case %d: error %.17g, optimum %.17g", k, err,
              want);
        for (size_t t = 0; t < T; t++)
            CHECK(choice[t] < C && o[t * C + choice[t]].bytes != UINT64_MAX,
                  "case %d: tensor %zu got option %u", k, t, choice[t]);
        cases++;
    }
    CHECK(cases > 2500, "only %d cases had a budget above the least", cases);
    printf("test_adaptive: optimal in %d random cases (brute force, same units)\n", cases);
}

/* A budget that holds every largest option: the least error everywhere. */
static void test_generous_and_tight(void)
{
    psagg__adapt_option o[3 * 3] = {{100, 5.0}, {200, 1.0}, {400, 0.5}, {50, 9.0}, {80, 2.0},
                                    {160, 0.0}, {10, 1.0},  {10, 1.0},  {20, 0.9}};
    uint32_t c[3];
    uint64_t bytes;
    double err;
    CHECK(psagg__adapt_solve(o, 3, 3, 10000, c, &bytes, &err) == PSAGG_OK, "%s",
          psagg_last_error());
    CHECK(c[0] == 2 && c[1] == 2 && c[2] == 2 && bytes == 580 && fabs(err - 1.4) < 1e-12,
          "generous: %u %u %u", c[0], c[1], c[2]);
    /* a tie: options 0 and 1 of tensor 2 are equal; the lower index wins */
    CHECK(psagg__adapt_solve(o, 3, 3, 160, c, &bytes, &err) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && bytes == 160, "least: %u %u %u, %llu bytes", c[0],
          c[1], c[2], (unsigned long long)bytes);
    CHECK(psagg__adapt_solve(o, 3, 3, 159, c, &bytes, &err) == PSAGG_EINVAL &&
              strstr(psagg_last_error(), "smallest choice, 160 bytes"),
          "too small: %s", psagg_last_error());
}

/* The same inputs give the same choice in another process (what every worker relies on). */
static void test_other_process(void)
{
    enum { T = 150, C = 21 };
    static psagg__adapt_option o[T * C];
    uint32_t mine[T], theirs[T];
    uint64_t rng = 99, least, most;
    int fd[2], status;
    pid_t pid;
    random_case(&rng, o, T, C, &least, &most);
    CHECK(psagg__adapt_solve(o, T, C, least + (most - least) / 3, mine, NULL, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    CHECK(pipe(fd) == 0, "pipe");
    pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        uint32_t c[T];
        close(fd[0]);
        if (psagg__adapt_solve(o, T, C, least + (most - least) / 3, c, NULL, NULL) ||
            write(fd[1], c, sizeof c) != (ssize_t)sizeof c)
            _exit(1);
        _exit(0);
    }
    close(fd[1]);
    CHECK(read(fd[0], theirs, sizeof theirs) == (ssize_t)sizeof theirs, "read the child's choice");
    close(fd[0]);
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the child failed");
    CHECK(!memcmp(mine, theirs, sizeof mine), "another process chose differently");
}

static void test_error_model(void)
{
    float x[10] = {0, 1, 2, 3, 10, 10, 4, -1, 1, 0};
    /* chunks of 3, buckets of 2: [0,1] [2] | [3,10] [10] | [4,-1] [1] | [0] */
    double s = psagg__adapt_range_sum(x, 10, 3, 2);
    double want = 2 * 1.0 + 1 * 0.0 + 2 * 49.0 + 1 * 0.0 + 2 * 25.0 + 1 * 0.0 + 1 * 0.0;
    CHECK(s == want, "range sum %g, expected %g", s, want);
    CHECK(psagg__adapt_range_sum(x, 10, 0, 64) == 10 * 11.0 * 11.0, "one bucket: %g",
          psagg__adapt_range_sum(x, 10, 0, 64));
    x[5] = NAN;
    CHECK(isinf(psagg__adapt_range_sum(x, 10, 3, 2)), "a NaN must make it infinite");
    {
        /* all bucket sizes at once: the same sums as one at a time, bit for bit */
        static const uint32_t b[] = {64, 128, 256, 512, 1024};
        static float v[5000], lo[100], hi[100];
        uint64_t rng = 7;
        for (int i = 0; i < 5000; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (float)((double)(rng >> 11) * 0x1p-53 - 0.5) * (i % 700 == 3 ? 100.0f : 1.0f);
        }
        for (uint64_t n = 1; n <= 5000; n += n < 200 ? 37 : 611) {
            double got[5] = {0};
            psagg__adapt_range_sums(v, n, b, 5, got, lo, hi);
            for (int k = 0; k < 5; k++)
                CHECK(got[k] == psagg__adapt_range_sum(v, n, n, b[k]), "n %llu bucket %u: %.17g",
                      (unsigned long long)n, b[k], got[k]);
        }
        v[4000] = NAN;
        {
            double got[5] = {0};
            psagg__adapt_range_sums(v, 5000, b, 5, got, lo, hi);
            CHECK(isinf(got[0]) && isinf(got[4]), "a NaN must make them infinite");
        }
    }
    CHECK(psagg__adapt_maxmin_error(900.0, 2, PSAGG_ROUND_STOCHASTIC) == 25.0, "SR 2 bits");
    CHECK(psagg__adapt_maxmin_error(900.0, 2, PSAGG_ROUND_NEAREST) == 900.0 / 108.0, "RN 2 bits");
    CHECK(psagg__adapt_maxmin_error(255.0 * 255.0 * 4, 8, PSAGG_ROUND_STOCHASTIC) == 1.0,
          "SR 8 bits");
}

static void test_schedule_and_candidates(void)
{
    psagg_codec d = {PSAGG_CODEC_MAXMIN, 4, 512, PSAGG_ROUND_STOCHASTIC, 0},
                c[PSAGG_ADAPT_MAX_CANDIDATES];
    uint32_t b[PSAGG_ADAPT_MAX_BUCKETS], n;
    uint8_t of[PSAGG_ADAPT_MAX_CANDIDATES];

    /* generation g + 1 from round g K + 2; 0 before, and always without adaptive */
    CHECK(psagg__adapt_generation(0, 5) == 0 && psagg__adapt_generation(1, 5) == 0 &&
              psagg__adapt_generation(2, 5) == 1 && psagg__adapt_generation(6, 5) == 1 &&
              psagg__adapt_generation(7, 5) == 2 && psagg__adapt_generation(12, 5) == 3 &&
              psagg__adapt_generation(1000, 0) == 0 && psagg__adapt_generation(3, 2) == 1 &&
              psagg__adapt_generation(4, 2) == 2,
          "schedule");
    /* buckets /4..x4 that divide the chunk (multiples of 64) */
    n = psagg__adapt_buckets(&d, 65536, b);
    CHECK(n == 5 && b[0] == 128 && b[1] == 256 && b[2] == 512 && b[3] == 1024 && b[4] == 2048,
          "buckets of 512 in chunks of 65536: %u", n);
    d.bucket = 128;
    n = psagg__adapt_buckets(&d, 1408, b); /* 32: no multiple of 64; 256, 512 do not divide 1408 */
    CHECK(n == 2 && b[0] == 64 && b[1] == 128, "buckets of 128 in 1408: %u", n);
    d.bucket = 512;
    n = psagg__adapt_candidates(&d, 65536, 1, c, of);
    CHECK(n == PSAGG_ADAPT_MAX_CANDIDATES, "with nearest: %u candidates", n);
    CHECK(c[0].bits == 2 && c[0].bucket == 128 && c[0].rounding == PSAGG_ROUND_STOCHASTIC &&
              c[1].rounding == PSAGG_ROUND_NEAREST && c[n - 1].bits == 8 &&
              c[n - 1].bucket == 2048 && of[n - 1] == 4,
          "candidate order");
    n = psagg__adapt_candidates(&d, 65536, 0, c, NULL);
    CHECK(n == PSAGG_ADAPT_MAX_CANDIDATES / 2, "stochastic only: %u candidates", n);
    for (uint32_t i = 0; i < n; i++)
        CHECK(psagg__adapt_allowed(&d, 65536, &c[i]) && !psagg__codec_check(&c[i]), "candidate %u",
              i);
    {
        psagg_codec one = {PSAGG_CODEC_MAXMIN, 1, 512, PSAGG_ROUND_STOCHASTIC, 0},
                    odd = {PSAGG_CODEC_MAXMIN, 4, 192, PSAGG_ROUND_STOCHASTIC, 0},
                    half = {.id = PSAGG_CODEC_FP16};
        CHECK(!psagg__adapt_allowed(&d, 65536, &one) && !psagg__adapt_allowed(&d, 65536, &odd) &&
                  !psagg__adapt_allowed(&d, 65536, &half),
              "non-candidates allowed");
        CHECK(psagg__adapt_allowed(&one, 65536, &one), "the declared codec is always allowed");
    }
    { /* thc: 2 and 4 bits at the declared block (the rotation), its error from the sum of squares
       */
        psagg_codec t4 = {PSAGG_CODEC_THC, 4, 256, PSAGG_ROUND_STOCHASTIC, 0}, big, t2 = t4,
                    other = t4, mm = {PSAGG_CODEC_MAXMIN, 2, 256, PSAGG_ROUND_STOCHASTIC, 0};
        t2.bits = 2;
        other.bucket = 512;
        CHECK(psagg__adapt_declarable(&t4) && psagg__adapt_declarable(&mm) &&
                  !psagg__adapt_declarable(&(psagg_codec){.id = PSAGG_CODEC_FP16}),
              "declarable");
        n = psagg__adapt_buckets(&t4, 65536, b);
        CHECK(n == 1 && b[0] == 256, "thc buckets: %u", n);
        n = psagg__adapt_candidates(&t4, 65536, 1, c, of);
        CHECK(n == 2 && psagg__codec_equal(&c[0], &t2) && psagg__codec_equal(&c[1], &t4) &&
                  of[0] == 0 && of[1] == 0,
              "thc candidates: %u", n);
        big = psagg__adapt_largest(&t2, 65536);
        CHECK(psagg__codec_equal(&big, &t4), "thc's largest is thc4 at the block");
        CHECK(psagg__adapt_allowed(&t4, 65536, &t2) && psagg__adapt_allowed(&t2, 65536, &t4) &&
                  !psagg__adapt_allowed(&t4, 65536, &other) &&
                  !psagg__adapt_allowed(&t4, 65536, &mm) && !psagg__adapt_allowed(&mm, 65536, &t2),
              "thc allowed");
        CHECK(psagg__adapt_error(&t2, 100.0) == psagg__adapt_thc_error(100.0, 2) &&
                  psagg__adapt_thc_error(100.0, 2) > 8 * psagg__adapt_thc_error(100.0, 4) &&
                  psagg__adapt_error(&mm, 7.0) ==
                      psagg__adapt_maxmin_error(7.0, 2, PSAGG_ROUND_STOCHASTIC),
              "errors");
    }
}

/* A push of chunk 0 of tensor `key` in `codec`: NULL if psagg__msg_check takes it. */
static const char *check_push(const psagg__layout *l, uint32_t key, const psagg_codec *codec,
                              uint32_t gen, psagg__msg_codec *mc)
{
    const psagg__chunk_info *ci = &l->chunks[l->tensors[key].first_chunk];
    size_t len = sizeof(psagg__msg_hdr) + psagg__encoded_size(codec, ci->count);
    static uint8_t msg[1 << 20];
    const psagg__chunk_info *got;
    psagg__msg_init((psagg__msg_hdr *)msg, PSAGG_MSG_PUSH, 0, 5, ci, codec, gen);
    return psagg__msg_check(msg, len, 0, PSAGG_MSG_PUSH, l, &got, mc);
}

static void test_codec_word(void)
{
    psagg_codec m4 = {PSAGG_CODEC_MAXMIN, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0},
                fp = {.id = PSAGG_CODEC_FP32},
                m2 = {PSAGG_CODEC_MAXMIN, 2, 256, PSAGG_ROUND_NEAREST, 0},
                m8 = {PSAGG_CODEC_MAXMIN, 8, 4096, PSAGG_ROUND_STOCHASTIC, 0};
    psagg__ctl_tensor decl[2];
    psagg__layout fixed, adaptive;
    psagg__msg_codec mc;
    const char *bad;

    CHECK(!psagg__tensor_to_wire("w", 100000, &m4, &decl[0]) &&
              !psagg__tensor_to_wire("s", 10, &fp, &decl[1]),
          "declaration");
    CHECK(!psagg__layout_build(decl, 2, 65536, 2, 0, &fixed) &&
              !psagg__layout_build(decl, 2, 65536, 2, 4, &adaptive),
          "layouts: %s", psagg_last_error());
    /* adaptive: same chunks and owners, buffers for the largest candidate */
    CHECK(adaptive.n_chunks == fixed.n_chunks && adaptive.tensors[0].adaptive &&
              !adaptive.tensors[1].adaptive && !fixed.tensors[0].adaptive,
          "adaptive flags");
    for (uint32_t c = 0; c < fixed.n_chunks; c++)
        CHECK(adaptive.chunks[c].owner == fixed.chunks[c].owner &&
                  adaptive.chunks[c].enc_bytes == fixed.chunks[c].enc_bytes &&
                  adaptive.chunks[c].cap_bytes ==
                      (adaptive.chunks[c].key
                           ? adaptive.chunks[c].enc_bytes
                           : psagg__encoded_size(&(psagg_codec){PSAGG_CODEC_MAXMIN, 8, 256, 0, 0},
                                                 adaptive.chunks[c].count)),
              "chunk %u", c);
    /* the word carries the codec and the generation modulo 1024 */
    CHECK(!check_push(&adaptive, 0, &m2, 1027, &mc) && mc.codec.bits == 2 &&
              mc.codec.bucket == 256 && mc.codec.rounding == PSAGG_ROUND_NEAREST &&
              mc.generation == 3 && mc.len == psagg__encoded_size(&m2, adaptive.chunks[0].count),
          "a candidate of an adaptive tensor");
    CHECK(!check_push(&adaptive, 0, &m4, 0, &mc) && mc.generation == 0, "its declared codec");
    bad = check_push(&adaptive, 0, &m8, 2, &mc); /* bucket 4096 = x4: a candidate */
    CHECK(!bad, "x4 bucket: %s", bad ? bad : "");
    m8.bucket = 8192; /* x8: not */
    bad = check_push(&adaptive, 0, &m8, 2, &mc);
    CHECK(bad && !strcmp(bad, "codec"), "x8 bucket taken");
    /* a fixed tensor takes only its codec, at generation 0 */
    bad = check_push(&fixed, 0, &m2, 0, &mc);
    CHECK(bad && !strcmp(bad, "codec"), "another codec for a fixed tensor");
    bad = check_push(&fixed, 0, &m4, 1, &mc);
    CHECK(bad && !strcmp(bad, "codec"), "generation 1 for a fixed tensor");
    bad = check_push(&adaptive, 1, &m2, 0, &mc);
    CHECK(bad && !strcmp(bad, "codec"), "maxmin for the fp32 tensor of an adaptive job");
    { /* thc: 2 or 4 bits at its block; the update buffers hold either's (thc2's sums pad the
         rotated chunk to 256, thc4's to 128: at 16-bit sums thc2's update of 100 elements is
         longer) and a word no codec writes is refused */
        psagg_codec t4 = {PSAGG_CODEC_THC, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0}, t2 = t4;
        psagg__ctl_tensor td;
        psagg__layout tl;
        t2.bits = 2;
        CHECK(psagg__update_cap(&t2, 100) > psagg__update_cap(&t4, 100) &&
                  psagg__adapt_update_cap(&t4, 65536, 100) == psagg__update_cap(&t2, 100) &&
                  psagg__adapt_update_cap(&t2, 65536, 100) == psagg__update_cap(&t2, 100) &&
                  psagg__adapt_update_cap(&m4, 65536, 1024) ==
                      psagg__update_cap(&(psagg_codec){PSAGG_CODEC_MAXMIN, 8, 256, 0, 0}, 1024),
              "update caps");
        CHECK(!psagg__tensor_to_wire("b", 100, &t4, &td) &&
                  !psagg__layout_build(&td, 1, 65536, 1, 4, &tl) && tl.tensors[0].adaptive &&
                  tl.max_update_bytes >= psagg__update_cap(&t2, 100),
              "a thc layout: %s", psagg_last_error());
        CHECK(!check_push(&tl, 0, &t2, 1, &mc) && mc.codec.bits == 2 && mc.generation == 1 &&
                  !check_push(&tl, 0, &t4, 0, &mc),
              "thc2 and thc4 pushes");
        {
            const psagg__chunk_info *got;
            static uint8_t msg[4096];
            psagg__msg_init((psagg__msg_hdr *)msg, PSAGG_MSG_PUSH, 0, 5, &tl.chunks[0], &t2, 1);
            ((psagg__msg_hdr *)msg)->codec |= 1u << 15; /* (a bit thc's word leaves 0) */
            bad = psagg__msg_check(msg, sizeof(psagg__msg_hdr) + tl.chunks[0].cap_bytes, 0,
                                   PSAGG_MSG_PUSH, &tl, &got, &mc);
            CHECK(bad && !strcmp(bad, "codec"), "a thc word with a stray bit taken");
        }
        psagg__layout_free(&tl);
    }
    CHECK(!check_push(&fixed, 0, &m4, 0, &mc) && !check_push(&adaptive, 1, &fp, 0, &mc),
          "the declared codecs");
    {
        /* a length that fits the declared codec but not the one the header names */
        const psagg__chunk_info *ci = &adaptive.chunks[0], *got;
        static uint8_t msg[1 << 20];
        size_t len = sizeof(psagg__msg_hdr) + ci->enc_bytes;
        psagg__msg_init((psagg__msg_hdr *)msg, PSAGG_MSG_PUSH, 0, 5, ci, &m2, 1);
        ((psagg__msg_hdr *)msg)->len = (uint32_t)ci->enc_bytes;
        bad = psagg__msg_check(msg, len, 0, PSAGG_MSG_PUSH, &adaptive, &got, &mc);
        CHECK(bad && !strcmp(bad, "len"), "a length of another codec");
    }
    psagg__layout_free(&fixed);
    psagg__layout_free(&adaptive);
}

int main(void)
{
    test_schedule_and_candidates();
    test_codec_word();
    test_error_model();
    test_generous_and_tight();
    test_optimal();
    test_other_process();
    printf("test_adaptive: passed\n");
    return 0;
}
