/*
 * test_adaptive.c - runtime/adaptive.c: the budgeted codec choice is optimal (checked against
 * brute force on small random cases, with the same rounding of sizes to units), never over
 * the budget, the same in another process, refused with the smallest size when the budget is
 * too small; and the maxmin error model's inputs (range sums restarted at chunks).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/adaptive.h"
#include "testutil.h"

#define MAX_T 6
#define MAX_C 5

/* The least error over every choice whose rounded units above each tensor's smallest option
 * fit in cap (adaptive.h's rounding), or INFINITY. */
static double brute(const psagg_adapt_option *o, size_t T, size_t C, uint64_t unit, uint64_t cap)
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
            const psagg_adapt_option *x = &o[t * C + idx[t]];
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

static void random_case(uint64_t *rng, psagg_adapt_option *o, size_t T, size_t C, uint64_t *least,
                        uint64_t *most)
{
    *least = *most = 0;
    for (size_t t = 0; t < T; t++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (size_t i = 0; i < C; i++) {
            psagg_adapt_option *x = &o[t * C + i];
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
        psagg_adapt_option o[MAX_T * MAX_C];
        uint32_t choice[MAX_T];
        uint64_t least, most, budget, bytes, unit;
        double err, want;
        psagg_status st;

        random_case(&rng, o, T, C, &least, &most);
        budget = least - 1 + test_rand64(&rng) % (most - least + 3);
        st = psagg_adapt_solve(o, T, C, budget, choice, &bytes, &err);
        if (budget < least) {
            CHECK(st == PSAGG_EINVAL, "case %d: below the smallest choice, status %d", k, st);
            continue;
        }
        unit = psagg_adapt_unit(budget - least, T);
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
    psagg_adapt_option o[3 * 3] = {{100, 5.0}, {200, 1.0}, {400, 0.5}, {50, 9.0}, {80, 2.0},
                                   {160, 0.0}, {10, 1.0},  {10, 1.0},  {20, 0.9}};
    uint32_t c[3];
    uint64_t bytes;
    double err;
    CHECK(psagg_adapt_solve(o, 3, 3, 10000, c, &bytes, &err) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(c[0] == 2 && c[1] == 2 && c[2] == 2 && bytes == 580 && fabs(err - 1.4) < 1e-12,
          "generous: %u %u %u", c[0], c[1], c[2]);
    /* a tie: options 0 and 1 of tensor 2 are equal; the lower index wins */
    CHECK(psagg_adapt_solve(o, 3, 3, 160, c, &bytes, &err) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && bytes == 160, "least: %u %u %u, %llu bytes", c[0],
          c[1], c[2], (unsigned long long)bytes);
    CHECK(psagg_adapt_solve(o, 3, 3, 159, c, &bytes, &err) == PSAGG_EINVAL &&
              strstr(psagg_last_error(), "smallest choice, 160 bytes"),
          "too small: %s", psagg_last_error());
}

/* The same inputs give the same choice in another process (what every worker relies on). */
static void test_other_process(void)
{
    enum { T = 150, C = 21 };
    static psagg_adapt_option o[T * C];
    uint32_t mine[T], theirs[T];
    uint64_t rng = 99, least, most;
    int fd[2], status;
    pid_t pid;
    random_case(&rng, o, T, C, &least, &most);
    CHECK(psagg_adapt_solve(o, T, C, least + (most - least) / 3, mine, NULL, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    CHECK(pipe(fd) == 0, "pipe");
    pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        uint32_t c[T];
        close(fd[0]);
        if (psagg_adapt_solve(o, T, C, least + (most - least) / 3, c, NULL, NULL) ||
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
    double s = psagg_adapt_range_sum(x, 10, 3, 2);
    double want = 2 * 1.0 + 1 * 0.0 + 2 * 49.0 + 1 * 0.0 + 2 * 25.0 + 1 * 0.0 + 1 * 0.0;
    CHECK(s == want, "range sum %g, expected %g", s, want);
    CHECK(psagg_adapt_range_sum(x, 10, 0, 64) == 10 * 11.0 * 11.0, "one bucket: %g",
          psagg_adapt_range_sum(x, 10, 0, 64));
    x[5] = NAN;
    CHECK(isinf(psagg_adapt_range_sum(x, 10, 3, 2)), "a NaN must make it infinite");
    CHECK(psagg_adapt_maxmin_error(900.0, 2, PSAGG_ROUND_STOCHASTIC) == 25.0, "SR 2 bits");
    CHECK(psagg_adapt_maxmin_error(900.0, 2, PSAGG_ROUND_NEAREST) == 900.0 / 108.0, "RN 2 bits");
    CHECK(psagg_adapt_maxmin_error(255.0 * 255.0 * 4, 8, PSAGG_ROUND_STOCHASTIC) == 1.0,
          "SR 8 bits");
}

int main(void)
{
    test_error_model();
    test_generous_and_tight();
    test_optimal();
    test_other_process();
    printf("test_adaptive: passed\n");
    return 0;
}
