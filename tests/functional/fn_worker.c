/*
 * fn_worker.c - the worker program of the functional tests (run by run_case.sh).
 *
 * Every worker declares the same tensors (--sizes, plus --random-tensors of 1..--random-max
 * elements), fills them each round with values that depend only on (rank, key, round,
 * element), starts push_pull on all of them before waiting on any (so every tensor's
 * operation is in flight at once), and checks the result:
 *   fp32    bit-exact against the sum it computes itself in the same fixed order;
 *   lossy   within the codec's error bound (uplink + one requantize on the server);
 * and prints "DIGEST <hex>" of every output of every round, so the harness can check that
 * every worker got bit-identical updates and that two runs are bit-identical.
 * With --expect STATUS it instead expects a call to fail with that status (and, with
 * --expect-text, a message containing the text) within --max-seconds. Faults: rank
 * --die-rank exits at round --die-round, or with --stall-seconds S sleeps S seconds there
 * (alive, but not pushing) and goes on; --die-mode says how it dies: exit (_exit, the
 * default), kill (SIGKILL before the round's pushes), midpush (SIGKILL once half the round's
 * tensors are pushed), afterpush (SIGKILL once all are pushed, before any update), stop
 * (SIGSTOP: hung; the harness kills it later), declare (SIGKILL after psagg_init, before its
 * declaration: during the job's start-up), close (psagg_close, then exit 0: it leaves early),
 * abort (psagg_abort naming the rank and round, then exit 0: a training loop that failed).
 * Elastic jobs: with --elastic-dead R the others expect worker R to leave the job at some
 * point and go on: up to the first round they start knowing of the new epoch every element
 * is the sum with R or without it (each chunk summed one or the other: R's push of a round
 * counts where it reached the server before the epoch; an AVERAGE divides by the number it
 * summed); every later round must be the sum without R (R was dead before it could push). They
 * print "ELASTIC ..." with the epoch seen, the first round started after it and the longest round.
 * Joins: with --sync every worker calls psagg_sync_membership after each round (and sleeps
 * --round-sleep-ms), and with --rejoin the dead rank comes back: a worker started with that
 * rank while the job runs joins it (psagg_declare returns once it is admitted) and starts at
 * the tensors' round; from the round after a barrier that readmitted it (and on the joiner
 * from its first round) every element must be the exact sum of all the workers. The end
 * expects membership epoch 2 of all the workers, and every worker prints "TAIL <hex>", the
 * digest of the last 10 rounds, which the harness compares across all of them. With --loose
 * (joins that die again) only the last 10 rounds are checked, each element the exact sum of
 * all the workers, and the end expects them all members in some epoch >= 2;
 * --joiner-die-after N makes a joiner die (--die-mode) N rounds after it joined. --grow: the
 * --elastic-dead rank is one beyond [cluster] workers (up to max_workers), absent at the start:
 * it joins the running job, in epoch 1.
 * --lag-round R --lag-ms N: sleep N ms before round R's pushes (the others, while a dying
 * worker pushes that round first); with --lag-rank W only worker W sleeps.
 * --left-epoch E (jobs with server replicas, whose server views are epochs too): the leave is
 * the first epoch with fewer members, and it is epoch E (-1: any).
 * --progress prints "ROUND r" before each round's pushes (a harness that acts at a round),
 * and --round-sleep-ms without --sync sleeps that long before each round.
 * --end-file PATH: the harness ends the job while it runs (a job whose length is set by what
 * happens to it, not by a guess of the machine's speed): it writes a round number N into PATH
 * (written elsewhere, then renamed), every worker reads PATH before each round, and from then on
 * the job ends as if started with --rounds N (--rounds is the cap until then). N below a worker's
 * round (the harness wrote it too late) or above the cap fails that worker, naming both.
 * --hold R:FILE: before round R's pushes, print "HOLD before round R" and wait (up to 120 s)
 * until FILE exists: a harness whose events (kills, returns) must all come before the job ends
 * holds it there until they are done (no hold at all when they were done before round R).
 * Stragglers in an elastic job: --straggler with --elastic-dead R --dead-round D: worker R was
 * killed before its pushes of round D; the check of stragglers below counts its inputs up to
 * round D - 1, less a tail it may have carried when it died (lost with it).
 * Stragglers ([server] quorum): with --straggler R worker R sleeps --straggler-ms before
 * each round's pushes, but for the last --calm-rounds; rounds then close without it, so a
 * round is the sum of some of the workers, and what is checked is that nothing is lost:
 * summed over all rounds, the updates equal the sum of every worker's every input (fp32,
 * SUM; within float rounding; a lossy codec with --error-feedback within the residuals'
 * bound). Each worker prints "QUORUM worker W left_out N" (its chunk
 * rounds that closed without it, psagg_stats.left_out). --lenient (benchmarks, where the
 * straggler stays slow to the end) only reports the difference: what it still carries.
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fn_input.h"
#include "psagg.h"

#ifdef FN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "../gpu/gpu_skip.h"
#endif

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* Everything main allocates, freed at exit on every path (clean under LeakSanitizer). */
static struct {
    psagg_tensor_desc *desc;
    uint64_t *count;
    float **in, **out, **expect;
    psagg_handle **h;
    uint64_t *round_digest;
    unsigned char *round_full;
    int n;
} mem;

static void free_all(void)
{
    for (int t = 0; t < mem.n; t++) {
        if (mem.desc)
            free((void *)mem.desc[t].name);
        if (mem.in)
            free(mem.in[t]), free(mem.out[t]), free(mem.expect[t]);
    }
    free(mem.desc);
    free(mem.count);
    free(mem.in);
    free(mem.out);
    free(mem.expect);
    free(mem.h);
    free(mem.round_digest);
    free(mem.round_full);
    memset(&mem, 0, sizeof mem); /* (called again at exit: atexit) */
}

/* --end-file: the round number in PATH, -1 while there is none yet */
static int read_end_file(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%d", &n) != 1)
        n = -1;
    fclose(f);
    return n;
}

/*
 * The round a job ends at (exclusive) for --rounds N: N; with --rejoin at least 20 rounds past
 * the latest admission (full_from: the first round with every rank back), and `waiting` while
 * the rank has not come back yet.
 */
static int job_end(int rounds, int rejoin, int full_from, int waiting)
{
    if (!rejoin)
        return rounds;
    if (full_from < 0)
        return waiting;
    return full_from + 20 > rounds ? full_from + 20 : rounds;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * A completed push_pull's psagg_timing must hold together: the phases in order add up to no
 * more than total, decode covers what is left after wait (the last update's decode), and total
 * lies within what this thread saw from before the call to after the wait. Sums go to sum[].
 */
static int check_timing(int rank, int t, const psagg_timing *tm, double called, double waited,
                        uint64_t sum[6])
{
    uint64_t phases = tm->queued_ns + tm->encode_ns + tm->send_ns + tm->wait_ns;
    double seen_ns = (waited - called) * 1e9;
    if (phases > tm->total_ns || tm->decode_ns < tm->total_ns - phases || tm->total_ns == 0 ||
        (double)tm->total_ns > seen_ns + 1e3) {
        fprintf(stderr,
                "FAIL worker %d tensor %d: timing queued %llu encode %llu send %llu wait %llu "
                "decode %llu total %llu ns does not hold together (seen %.0f ns)\n",
                rank, t, (unsigned long long)tm->queued_ns, (unsigned long long)tm->encode_ns,
                (unsigned long long)tm->send_ns, (unsigned long long)tm->wait_ns,
                (unsigned long long)tm->decode_ns, (unsigned long long)tm->total_ns, seen_ns);
        return 1;
    }
    sum[0] += tm->queued_ns, sum[1] += tm->encode_ns, sum[2] += tm->send_ns;
    sum[3] += tm->wait_ns, sum[4] += tm->decode_ns, sum[5] += tm->total_ns;
    return 0;
}

static int status_from_name(const char *s)
{
    static const struct {
        const char *name;
        int status;
    } t[] = {{"EMISMATCH", PSAGG_EMISMATCH}, {"ETIMEDOUT", PSAGG_ETIMEDOUT},
             {"EPEER", PSAGG_EPEER},         {"ECONFIG", PSAGG_ECONFIG},
             {"EPROTO", PSAGG_EPROTO},       {"ENONFINITE", PSAGG_ENONFINITE},
             {"EINVAL", PSAGG_EINVAL}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].name))
            return t[i].status;
    return 1;
}

/*
 * --straggler: what a worker left out of its last rounds still carries (no later push took
 * it): a worker late by more than grace_ms in each of the last k rounds of a chunk carries k
 * of them. The elements of one chunk share one k per worker (its rounds closed alike), so
 * each chunk's k[] is found once and must explain a run of its elements, not each element
 * on its own (before, each element could take any of 4^workers k[] of tails up to 3 rounds,
 * and one of them matched a wrong sum by chance now and then).
 *
 * tail_sum: the inputs of worker w's last k rounds at element i of tensor t.
 * tails_fit: whether k[] (per worker) explains elements i.. of d (the updates summed over the
 * rounds minus every input), within bound, at `want` elements (fewer at the tensor's end).
 * find_tails: the shortest k[] (each 0..end) that explains element i and the TAIL_CHECK after
 * it. The k[] with tails up to 1, then 2, ... are tried, meeting in the middle: the sums of
 * the first half of the workers' tails against the sorted sums of the other half's, so any
 * tail length is found. One element alone is matched by chance by some of the sums, a run of
 * them is not, so a difference that is no carry (a lost or doubled push) is still caught. A
 * run shorter than that (a tensor of a few elements) takes tails of up to TAIL_SHORT rounds
 * only, or too many k[] would explain anything.
 */
#define TAIL_CHECK   8
#define TAIL_SHORT   3
#define TAIL_WORKERS 6 /* the most workers the search takes ((end + 1)^3 sums a side) */
/* --straggler with --elastic-dead: the worker that left, and the round it died before (its
   inputs end there, and its tail counts back from there; a carried tail is lost with it) */
static int left_rank = -1, left_round;

static double tail_sum(int w, int t, uint64_t i, int end, int k)
{
    double s = 0;
    if (w == left_rank)
        end = left_round;
    for (int j = 1; j <= k && end - j >= 0; j++)
        s += input_value(w, (uint32_t)t, (uint32_t)(end - j), i);
    return s;
}

static int tails_fit(double *const *cum, int t, uint64_t i, uint64_t count, const int *k, int world,
                     int end, double bound, int want)
{
    for (uint64_t e = i; e < count && e < i + (uint64_t)want; e++) {
        double d = cum[t][e];
        for (int w = 0; w < world; w++)
            d += tail_sum(w, t, e, end, k[w]);
        if (!(fabs(d) <= bound))
            return 0;
    }
    return 1;
}

typedef struct half_sum {
    double sum;
    uint64_t code; /* the tails, in base end + 1 */
} half_sum;

static int by_sum(const void *a, const void *b)
{
    double x = ((const half_sum *)a)->sum, y = ((const half_sum *)b)->sum;
    return x < y ? -1 : x > y;
}

/* Every combination of tails 0..kmax of workers [from, to) at element i (at: their tail sums
   at i, end + 1 per worker): n sums, each with its tails in base kmax + 1. */
static half_sum *half_sums(const double *at, int from, int to, int end, int kmax, size_t *n)
{
    size_t count = 1, base = (size_t)kmax + 1;
    half_sum *h;
    for (int w = from; w < to; w++)
        count *= base;
    if (!(h = malloc(count * sizeof *h)))
        return NULL;
    for (size_t c = 0; c < count; c++) {
        size_t code = c;
        h[c] = (half_sum){0, c};
        for (int w = from; w < to; w++, code /= base)
            h[c].sum += at[(size_t)w * ((size_t)end + 1) + code % base];
    }
    *n = count;
    return h;
}

/* find_tails with every tail at most kmax (at: as half_sums'). */
static int find_tails_upto(double *const *cum, int t, uint64_t i, uint64_t count, int *k, int world,
                           int end, double bound, const double *at, int kmax)
{
    int mid = world / 2, found = 0;
    size_t na = 0, nb = 0;
    uint64_t base = (uint64_t)kmax + 1;
    half_sum *a = half_sums(at, 0, mid, end, kmax, &na), *b = NULL;

    if (!a || !(b = half_sums(at, mid, world, end, kmax, &nb)))
        goto out;
    qsort(b, nb, sizeof *b, by_sum);
    for (size_t x = 0; x < na && !found; x++) {
        double want = -(cum[t][i] + a[x].sum); /* b's sum that explains element i */
        size_t lo = 0, hi = nb;
        while (lo < hi) { /* the first of b not below want - bound */
            size_t m = lo + (hi - lo) / 2;
            if (b[m].sum < want - bound)
                lo = m + 1;
            else
                hi = m;
        }
        for (size_t y = lo; y < nb && b[y].sum <= want + bound && !found; y++) {
            uint64_t ca = a[x].code, cb = b[y].code;
            for (int w = 0; w < mid; w++, ca /= base)
                k[w] = (int)(ca % base);
            for (int w = mid; w < world; w++, cb /= base)
                k[w] = (int)(cb % base);
            found = tails_fit(cum, t, i, count, k, world, end, bound, 1 + TAIL_CHECK);
        }
    }
out:
    free(a);
    free(b);
    return found;
}

/* The shortest tails (the least longest one) that explain element i and those after it. */
static int find_tails(double *const *cum, int t, uint64_t i, uint64_t count, int *k, int world,
                      int end, double bound)
{
    int found = 0;
    double *at = malloc((size_t)world * ((size_t)end + 1) * sizeof *at);
    if (!at || world > TAIL_WORKERS) {
        free(at);
        return 0;
    }
    for (int w = 0; w < world; w++)
        for (int j = 0; j <= end; j++)
            at[(size_t)w * ((size_t)end + 1) + (size_t)j] = tail_sum(w, t, i, end, j);
    for (int kmax = 1; kmax <= end && !found; kmax++) {
        if (kmax > TAIL_SHORT && count - i < 1 + TAIL_CHECK)
            break;
        found = find_tails_upto(cum, t, i, count, k, world, end, bound, at, kmax);
    }
    free(at);
    return found;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"sizes", required_argument, NULL, 's'},
                                         {"random-tensors", required_argument, NULL, 'n'},
                                         {"random-max", required_argument, NULL, 'M'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"codec", required_argument, NULL, 'c'},
                                         {"expect", required_argument, NULL, 'e'},
                                         {"expect-text", required_argument, NULL, 't'},
                                         {"max-seconds", required_argument, NULL, 'm'},
                                         {"mismatch-rank", required_argument, NULL, 'x'},
                                         {"die-rank", required_argument, NULL, 'd'},
                                         {"die-round", required_argument, NULL, 'D'},
                                         {"stall-seconds", required_argument, NULL, 'S'},
                                         {"die-mode", required_argument, NULL, 'K'},
                                         {"elastic-dead", required_argument, NULL, 'E'},
                                         {"average", no_argument, NULL, 'a'},
                                         {"cuda", no_argument, NULL, 'g'},
                                         {"sync", no_argument, NULL, 'y'},
                                         {"round-sleep-ms", required_argument, NULL, 'Z'},
                                         {"rejoin", no_argument, NULL, 'J'},
                                         {"loose", no_argument, NULL, 'l'},
                                         {"joiner-die-after", required_argument, NULL, 'j'},
                                         {"straggler", required_argument, NULL, 'q'},
                                         {"straggler-ms", required_argument, NULL, 'Q'},
                                         {"calm-rounds", required_argument, NULL, 'C'},
                                         {"error-feedback", no_argument, NULL, 'F'},
                                         {"lenient", no_argument, NULL, 'L'},
                                         {"grow", no_argument, NULL, 'G'},
                                         {"lag-round", required_argument, NULL, 'R'},
                                         {"lag-ms", required_argument, NULL, 'A'},
                                         {"lag-rank", required_argument, NULL, 'k'},
                                         {"dead-round", required_argument, NULL, 'X'},
                                         {"progress", no_argument, NULL, 'P'},
                                         {"left-epoch", required_argument, NULL, 'V'},
                                         {"end-file", required_argument, NULL, 'f'},
                                         {"hold", required_argument, NULL, 'H'},
                                         {NULL, 0, NULL, 0}};
    char sizes_text[512] = "1,1023,4096";
    const char *codec_text = "fp32", *expect_text = NULL;
    const char *end_file = NULL;  /* --end-file: where the harness writes the last round + 1 */
    const char *hold_file = NULL; /* --hold R:FILE: before round R, wait until FILE exists */
    int hold_round = -1;
    int rounds = 10, n_random = 0, expect = 0, mismatch_rank = -1, die_rank = -1, die_round = -1;
    uint64_t random_max = 5000;
    int average = 0, cuda = 0, elastic_dead = -1, after_round = -1;
    int sync = 0, round_sleep_ms = 0, rejoin = 0, full_from = -1, first_round = 0, loose = 0;
    int joiner_die_after = -1;
    int straggler = -1, straggler_ms = 50, calm_rounds = 5, error_feedback = 0, lenient = 0;
    int grow = 0; /* --grow: the --elastic-dead rank is beyond `workers`: it only joins */
    int lag_round = -1, lag_ms = 0; /* --lag-round, --lag-ms: sleep before that round */
    int lag_rank = -1;              /* --lag-rank: only that worker sleeps (-1: every one) */
    int progress = 0;               /* --progress: "ROUND r" before each round's pushes */
    /* --left-epoch E: the leave is the first epoch with fewer members, epoch E (with server
       replicas a server's loss or return is an epoch too) */
    int left_epoch = 0;
    /* the membership when the leaving was first seen, and at the (latest) admission: later
       epochs are of workers that finished (a worker that is done leaves too) */
    psagg_membership left_m = {.struct_size = sizeof left_m}, adm_m = {.struct_size = sizeof adm_m};
    double **cum = NULL; /* --straggler: per tensor, the updates summed over the rounds, minus
                            every worker's inputs */
    uint64_t tail = 0xCBF29CE484222325ull, *round_digest = NULL;
    unsigned char *round_full = NULL;
    int end = 0;
    const char *die_mode = "exit";
    double longest_round = 0;
    float **d_in = NULL, **d_out = NULL;
    double max_seconds = 0, stall_seconds = 0, t0 = now_s();
    psagg_ctx *ctx = NULL;
    psagg_codec codec;
    psagg_tensor_desc *desc;
    uint64_t *count, digest = 0xCBF29CE484222325ull;
    float **in, **out, **expect_buf;
    int n = 0, c, rank, world, st;
    uint64_t rng = 12345, time_sum[6] = {0};
    double called = 0;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            snprintf(sizes_text, sizeof sizes_text, "%s", optarg);
            break;
        case 'n':
            n_random = atoi(optarg);
            break;
        case 'M':
            random_max = strtoull(optarg, NULL, 10);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'c':
            codec_text = optarg;
            break;
        case 'e':
            expect = status_from_name(optarg);
            break;
        case 't':
            expect_text = optarg;
            break;
        case 'm':
            max_seconds = atof(optarg);
            break;
        case 'x':
            mismatch_rank = atoi(optarg);
            break;
        case 'd':
            die_rank = atoi(optarg);
            break;
        case 'D':
            die_round = atoi(optarg);
            break;
        case 'S':
            stall_seconds = atof(optarg);
            break;
        case 'K':
            die_mode = optarg;
            break;
        case 'E':
            elastic_dead = atoi(optarg);
            break;
        case 'a':
            average = 1;
            break;
        case 'g':
            cuda = 1;
            break;
        case 'y':
            sync = 1;
            break;
        case 'Z':
            round_sleep_ms = atoi(optarg);
            break;
        case 'J':
            rejoin = 1;
            break;
        case 'l':
            loose = 1;
            break;
        case 'j':
            joiner_die_after = atoi(optarg);
            break;
        case 'q':
            straggler = atoi(optarg);
            break;
        case 'Q':
            straggler_ms = atoi(optarg);
            break;
        case 'C':
            calm_rounds = atoi(optarg);
            break;
        case 'F':
            error_feedback = 1;
            break;
        case 'R':
            lag_round = atoi(optarg);
            break;
        case 'X':
            left_round = atoi(optarg);
            break;
        case 'P':
            progress = 1;
            break;
        case 'A':
            lag_ms = atoi(optarg);
            break;
        case 'k':
            lag_rank = atoi(optarg);
            break;
        case 'L':
            lenient = 1;
            break;
        case 'G':
            grow = 1;
            break;
        case 'V':
            left_epoch = atoi(optarg);
            break;
        case 'f':
            end_file = optarg;
            break;
        case 'H':
            if (!strchr(optarg, ':')) {
                fprintf(stderr, "FAIL: --hold takes ROUND:FILE, not '%s'\n", optarg);
                return 2;
            }
            hold_round = atoi(optarg);
            hold_file = strchr(optarg, ':') + 1;
            break;
        default:
            return 2;
        }
    }
    if (cuda) {
#ifdef FN_WITH_CUDA
        int devices = 0;
        cudaError_t e = cudaGetDeviceCount(&devices);
        if (e != cudaSuccess || devices == 0)
            return gpu_absent_exit("fn_worker --cuda", cudaGetErrorString(e));
#else
        printf("SKIP: --cuda needs a build with CUDA\n");
        return 77;
#endif
    }
    if (psagg_codec_parse(codec_text, &codec)) {
        fprintf(stderr, "fn_worker: %s\n", psagg_last_error());
        return 2;
    }
    desc = mem.desc = calloc(1024 + (size_t)n_random, sizeof *desc);
    count = mem.count = calloc(1024 + (size_t)n_random, sizeof *count);
    atexit(free_all);
    for (char *save = NULL, *tok = strtok_r(sizes_text, ",", &save); tok && n < 1024;
         tok = strtok_r(NULL, ",", &save))
        count[n++] = strtoull(tok, NULL, 10);
    for (int i = 0; i < n_random; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        count[n++] = 1 + (rng >> 33) % (random_max ? random_max : 1);
    }

    mem.n = n;
    st = psagg_init(NULL, -1, -1, &ctx);
    if (st)
        goto failed;
    rank = psagg_rank(ctx);
    world = psagg_world_size(ctx);
    for (int t = 0; t < n; t++) {
        char *name = malloc(32);
        snprintf(name, 32, "t%03d", t);
        desc[t] = (psagg_tensor_desc){.struct_size = sizeof(psagg_tensor_desc),
                                      .name = name,
                                      .count = count[t],
                                      .codec = codec,
                                      .error_feedback = error_feedback};
        if (rank == mismatch_rank && t == n / 2)
            desc[t].count = count[t] + 1;
    }
    /* psagg.h's struct_size rule: a size the library does not know fails naming the struct */
    if (n > 0) {
        psagg_stats bad = {.struct_size = sizeof bad - 4};
        desc[n - 1].struct_size = 0;
        if (psagg_declare(ctx, desc, (size_t)n, NULL) != PSAGG_EINVAL ||
            !strstr(psagg_last_error(), "psagg_tensor_desc") ||
            psagg_get_stats(ctx, &bad) != PSAGG_EINVAL ||
            !strstr(psagg_last_error(), "psagg_stats")) {
            fprintf(stderr, "FAIL: a struct_size the library does not know: %s\n",
                    psagg_last_error());
            return 1;
        }
        desc[n - 1].struct_size = sizeof(psagg_tensor_desc);
    }
    if (rank == die_rank && !strcmp(die_mode, "declare")) { /* before its DECLARE is sent */
        printf("fn_worker %d: SIGKILL to itself before declaring\n", rank);
        fflush(stdout);
        raise(SIGKILL);
    }
    st = psagg_declare(ctx, desc, (size_t)n, NULL);
    if (st)
        goto failed;
    if (elastic_dead >= 0) { /* every worker is in (READY): the harness may kill one now */
        psagg_membership m = {.struct_size = sizeof m};
        if ((st = psagg_get_membership(ctx, &m)))
            goto failed;
        if (m.joiner) { /* it joined the running job: at the tensors' round, every worker in */
            uint32_t r0;
            if ((st = psagg_get_tensor_round(ctx, 0, &r0)))
                goto failed;
            first_round = (int)r0;
            full_from = first_round;
            after_round = first_round;
            adm_m = m;
            die_rank = joiner_die_after >= 0 ? rank : -1;
            die_round = first_round + joiner_die_after;
            printf("fn_worker %d: joined at round %d, membership epoch %u, %d workers\n", rank,
                   first_round, m.epoch, m.size);
        }
        printf("fn_worker %d: the job runs\n", rank);
        fflush(stdout);
    }

    in = mem.in = calloc((size_t)n, sizeof *in);
    out = mem.out = calloc((size_t)n, sizeof *out);
    expect_buf = mem.expect = calloc((size_t)n, sizeof *expect_buf);
    mem.h = calloc((size_t)n, sizeof *mem.h);
    for (int t = 0; t < n; t++) {
        in[t] = malloc(count[t] * sizeof(float));
        out[t] = malloc(count[t] * sizeof(float));
        expect_buf[t] = malloc(count[t] * sizeof(float));
    }
#ifdef FN_WITH_CUDA
    if (cuda) {
        d_in = calloc((size_t)n, sizeof *d_in);
        d_out = calloc((size_t)n, sizeof *d_out);
        for (int t = 0; t < n; t++)
            if (cudaMalloc((void **)&d_in[t], count[t] * sizeof(float)) != cudaSuccess ||
                cudaMalloc((void **)&d_out[t], count[t] * sizeof(float)) != cudaSuccess) {
                fprintf(stderr, "FAIL: cudaMalloc\n");
                return 1;
            }
    }
#endif
    /*
     * Joins: the job runs --rounds rounds, and at least 20 after the latest admission (the
     * members and the joiner know its round alike), at most 10 x --rounds while the rank has
     * not come back; every round's digest and whether it was the exact sum of all workers
     * are kept for the last 10.
     */
    end = job_end(rounds, rejoin, full_from, 10 * rounds);
    if (rejoin) {
        round_digest = mem.round_digest = calloc((size_t)(10 * rounds + 20), sizeof *round_digest);
        round_full = mem.round_full = calloc((size_t)(10 * rounds + 20), 1);
        if (!round_digest || !round_full) {
            fprintf(stderr, "FAIL: no memory\n");
            return 1;
        }
    }
    if (straggler >= 0 && elastic_dead >= 0)
        left_rank = elastic_dead; /* (left_round: --dead-round) */
    if (straggler >= 0) {
        if (average || (codec.id != PSAGG_CODEC_FP32 && !error_feedback)) {
            fprintf(stderr, "FAIL: --straggler checks SUM, fp32 or with --error-feedback\n");
            return 2;
        }
        cum = calloc((size_t)n, sizeof *cum);
        for (int t = 0; cum && t < n; t++)
            if (!(cum[t] = calloc(count[t], sizeof **cum)))
                cum = NULL;
        if (!cum) {
            fprintf(stderr, "FAIL: no memory\n");
            return 1;
        }
    }
    for (int r = first_round; r < end; r++) {
        uint64_t rd = 0xCBF29CE484222325ull;
        int all_full = 1;
        psagg_handle **h = mem.h;
        double worst = 0;
        if (end_file) {
            int n_end = read_end_file(end_file);
            if (n_end >= 0) {
                if (n_end < r || n_end > rounds) {
                    fprintf(stderr,
                            "FAIL worker %d: --end-file %s names round %d: this worker is at "
                            "round %d, its cap (--rounds) %d\n",
                            rank, end_file, n_end, r, rounds);
                    return 1;
                }
                end_file = NULL;
                rounds = n_end; /* as if started with --rounds N (a rejoin's rule stays) */
                end = job_end(rounds, rejoin, full_from, end);
                if (r >= end)
                    break;
            }
        }
        if (r == hold_round && fn_hold("round", (uint32_t)r, hold_file))
            return 1;
        if (progress) {
            printf("ROUND %d\n", r);
            fflush(stdout);
        }
        if (round_sleep_ms && !sync)
            usleep((useconds_t)round_sleep_ms * 1000);
        if (rank == die_rank && r == die_round && stall_seconds > 0) {
            /* alive (the library's thread keeps answering) but not pushing */
            printf("fn_worker %d: stalling %.1f s on purpose at round %d\n", rank, stall_seconds,
                   r);
            fflush(stdout);
            usleep((useconds_t)(stall_seconds * 1e6));
        } else if (rank == die_rank && r == die_round && !strcmp(die_mode, "exit")) {
            printf("fn_worker %d: dying on purpose at round %d\nEXPECTED-ERROR-OK\n", rank, r);
            fflush(stdout);
            _exit(0);
        } else if (rank == die_rank && r == die_round && !strcmp(die_mode, "abort")) {
            char why[64];
            snprintf(why, sizeof why, "fn_worker %d aborts at round %d", rank, r);
            printf("fn_worker %d: psagg_abort at round %d\nEXPECTED-ERROR-OK\n", rank, r);
            fflush(stdout);
            st = psagg_abort(ctx, why); /* (a training loop that failed) */
            free_all();
            return st ? 1 : 0;
        } else if (rank == die_rank && r == die_round && !strcmp(die_mode, "close")) {
            st = psagg_close(ctx); /* leaves the job early, as a finished worker would */
            printf("fn_worker %d: psagg_close at round %d: %d\n", rank, r, st);
            free_all();
            return st ? 1 : 0;
        } else if (rank == die_rank && r == die_round &&
                   (!strcmp(die_mode, "kill") || !strcmp(die_mode, "stop"))) {
            printf("fn_worker %d: SIG%s to itself at round %d\n", rank,
                   die_mode[0] == 'k' ? "KILL" : "STOP", r);
            fflush(stdout);
            raise(die_mode[0] == 'k' ? SIGKILL : SIGSTOP);
        }
        if (rank == straggler && r < end - calm_rounds)
            usleep((useconds_t)straggler_ms * 1000); /* a slow worker: rounds go on without it */
        if (r == lag_round && (lag_rank < 0 || rank == lag_rank))
            usleep((useconds_t)lag_ms * 1000); /* (behind a worker that pushes it and dies) */
        if (elastic_dead >= 0 && after_round < 0) {
            psagg_membership m = {.struct_size = sizeof m};
            if ((st = psagg_get_membership(ctx, &m)))
                goto failed;
            if (m.epoch > 0 && (!left_epoch || m.size < world)) {
                after_round = r; /* this round starts after the worker left */
                left_m = m;
            }
        }
        for (int t = 0; t < n; t++)
            for (uint64_t i = 0; i < count[t]; i++)
                in[t][i] = input_value(rank, (uint32_t)t, (uint32_t)r, i);
        called = now_s();
        for (int t = 0; t < n; t++) {
            if (cuda) {
#ifdef FN_WITH_CUDA
                /* host data -> device; push_pull orders itself after this on the stream */
                cudaMemcpyAsync(d_in[t], in[t], count[t] * sizeof(float), cudaMemcpyHostToDevice,
                                0);
                st = psagg_push_pull_cuda(ctx, (uint32_t)t, d_in[t], d_out[t],
                                          average ? PSAGG_AVERAGE : PSAGG_SUM, t % 3, NULL, &h[t]);
#endif
            } else {
                st = psagg_push_pull(ctx, (uint32_t)t, in[t], out[t],
                                     average ? PSAGG_AVERAGE : PSAGG_SUM, t % 3, &h[t]);
            }
            if (st) { /* the job failed while we submitted: release what was started */
                for (int u = 0; u < t; u++)
                    psagg_release(h[u]);
                goto failed;
            }
            if (rank == die_rank && r == die_round &&
                ((!strcmp(die_mode, "midpush") && t == n / 2) ||
                 (!strcmp(die_mode, "afterpush") && t == n - 1))) {
                usleep(100000); /* the comm thread sends them meanwhile */
                printf("fn_worker %d: SIGKILL to itself at round %d after pushing %d tensors\n",
                       rank, r, t + 1);
                fflush(stdout);
                raise(SIGKILL);
            }
        }
        for (int t = 0; t < n; t++) {
            int wst = psagg_wait(h[t], -1);
            psagg_timing tm = {.struct_size = sizeof tm};
            int tst = psagg_handle_timing(h[t], &tm);
            if (tst != wst) {
                fprintf(stderr, "FAIL: psagg_handle_timing says %d, psagg_wait %d\n", tst, wst);
                return 1;
            }
            if (!wst && check_timing(rank, t, &tm, called, now_s(), time_sum))
                return 1;
            psagg_release(h[t]);
            h[t] = NULL;
            if (wst) { /* release the others too, then report the first failure */
                for (int u = t + 1; u < n; u++)
                    psagg_release(h[u]);
                st = wst; /* psagg_last_error() holds the job's failure message */
                goto failed;
            }
#ifdef FN_WITH_CUDA
            if (cuda && cudaMemcpy(out[t], d_out[t], count[t] * sizeof(float),
                                   cudaMemcpyDeviceToHost) != cudaSuccess) {
                fprintf(stderr, "FAIL: cudaMemcpy of the result\n");
                return 1;
            }
#endif
        }
        if (now_s() - called > longest_round)
            longest_round = now_s() - called;
        /* an elastic job's round: every element the sum with or without the worker that
           leaves; only without it from the round after the first one this worker started
           knowing of its leaving: the leaver, dead by then, pushed at most that round (its
           push of it may have reached a server before the epoch did, and counts there; the
           update says so); fp32 exactly, a lossy codec within the bound below */
        if (elastic_dead >= 0 && straggler < 0) {
            for (int t = 0; t < n; t++) {
                for (uint64_t i = 0; i < count[t]; i++) {
                    float with = 0.0f, without = 0.0f;
                    for (int w = 0; w < world; w++) {
                        float v = input_value(w, (uint32_t)t, (uint32_t)r, i);
                        with = with + v;
                        if (w != elastic_dead)
                            without = without + v;
                    }
                    if (average) {
                        with = with * (1.0f / (float)world);
                        without = without * (1.0f / (float)(world - 1));
                    }
                    double L =
                        codec.id == PSAGG_CODEC_MAXMIN ? (double)((1u << codec.bits) - 1) : 0;
                    double level = L > 0 ? 0.07 / L : 0.07 * 0x1p-8;
                    double bound = codec.id == PSAGG_CODEC_FP32 ? 0
                                                                : (2.0 * world + 2.0) * level *
                                                                      (average ? 1.0 / world : 1.0);
                    double e_without = fabs((double)out[t][i] - without);
                    double e_with = fabs((double)out[t][i] - with);
                    if (!(e_with <= bound))
                        all_full = 0;
                    if (loose) {
                        /* joins that died again: the last rounds are checked at the end */
                    } else if (full_from >= 0 && r >= full_from) { /* all of them */
                        if (!(e_with <= bound)) {
                            fprintf(stderr,
                                    "FAIL worker %d round %d tensor %d element %llu: got %.9g, "
                                    "expected %.9g, the sum of every worker (worker %d had "
                                    "rejoined)\n",
                                    rank, r, t, (unsigned long long)i, out[t][i], with,
                                    elastic_dead);
                            return 1;
                        }
                    } else if (!(e_without <= bound) &&
                               ((after_round >= 0 && r > after_round) || !(e_with <= bound))) {
                        int gone = after_round >= 0 && r > after_round;
                        fprintf(stderr,
                                "FAIL worker %d round %d tensor %d element %llu: got %.9g, "
                                "expected %.9g without worker %d%s%.9g with it\n",
                                rank, r, t, (unsigned long long)i, out[t][i], without, elastic_dead,
                                gone ? " (dead before it could push this round) and not " : " or ",
                                with);
                        return 1;
                    }
                }
                digest = fnv(digest, out[t], count[t] * sizeof(float));
                rd = fnv(rd, out[t], count[t] * sizeof(float));
            }
            if (rejoin) {
                round_digest[r] = rd;
                round_full[r] = (unsigned char)all_full;
            }
            if (sync) {
                psagg_membership m = {.struct_size = sizeof m};
                if (round_sleep_ms)
                    usleep((useconds_t)round_sleep_ms * 1000);
                if ((st = psagg_sync_membership(ctx, &m)))
                    goto failed;
                if (m.joined && m.size == world && (full_from < 0 || loose)) {
                    full_from = r + 1; /* (loose: the latest admission) */
                    adm_m = m;
                }
                end = job_end(rounds, rejoin, full_from, end);
            }
            continue;
        }
        if (straggler >= 0) { /* some workers' sum: what is left out comes in later rounds */
            for (int t = 0; t < n; t++) {
                for (uint64_t i = 0; i < count[t]; i++) {
                    cum[t][i] += out[t][i];
                    for (int w = 0; w < world; w++)
                        if (w != left_rank || r < left_round) /* (a leaver: until its death) */
                            cum[t][i] -= input_value(w, (uint32_t)t, (uint32_t)r, i);
                }
                digest = fnv(digest, out[t], count[t] * sizeof(float));
            }
            continue;
        }
        /* check every tensor against the independently computed sum */
        for (int t = 0; t < n; t++) {
            for (uint64_t i = 0; i < count[t]; i++) {
                float s = 0.0f;
                for (int w = 0; w < world; w++)
                    s = s + input_value(w, (uint32_t)t, (uint32_t)r, i);
                if (average)
                    s = s * (1.0f / (float)world);
                expect_buf[t][i] = s;
            }
            if (codec.id == PSAGG_CODEC_FP32) {
                if (memcmp(out[t], expect_buf[t], count[t] * sizeof(float))) {
                    for (uint64_t i = 0; i < count[t]; i++)
                        if (memcmp(&out[t][i], &expect_buf[t][i], sizeof(float))) {
                            fprintf(stderr,
                                    "FAIL worker %d round %d tensor %d element %llu: got %.9g, "
                                    "expected %.9g\n",
                                    rank, r, t, (unsigned long long)i, out[t][i], expect_buf[t][i]);
                            return 1;
                        }
                }
            } else {
                /*
                 * Bound per element: each worker's uplink error is below one level of its
                 * bucket (SR) and the server's requantize adds below one level of the sum's
                 * bucket. Input magnitudes are <= 0.5*0.07, so a level is <= range/L with
                 * range <= 0.07 per worker; bound generously but meaningfully: (2W+2)
                 * levels of the largest possible range.
                 */
                double L = codec.id == PSAGG_CODEC_MAXMIN ? (double)((1u << codec.bits) - 1) : 0;
                double level = L > 0 ? 0.07 / L : 0.07 * 0x1p-8;
                double bound = (2.0 * world + 2.0) * level * (average ? 1.0 / world : 1.0);
                for (uint64_t i = 0; i < count[t]; i++) {
                    double e = fabs((double)out[t][i] - (double)expect_buf[t][i]);
                    if (e > worst)
                        worst = e;
                    if (!(e <= bound)) {
                        fprintf(stderr,
                                "FAIL worker %d round %d tensor %d element %llu: got %.9g, "
                                "exact %.9g, error %.3g above bound %.3g\n",
                                rank, r, t, (unsigned long long)i, out[t][i], expect_buf[t][i], e,
                                bound);
                        return 1;
                    }
                }
            }
            digest = fnv(digest, out[t], count[t] * sizeof(float));
        }
        if (r == rounds - 1 && codec.id != PSAGG_CODEC_FP32)
            printf("worker %d: largest error in the last round %.3g\n", rank, worst);
    }
    if (expect) {
        fprintf(stderr, "FAIL: expected status %d but every call succeeded\n", expect);
        return 1;
    }
    {
        psagg_stats s = {.struct_size = sizeof s};
        if ((st = psagg_get_stats(ctx, &s)))
            goto failed;
        /* the context's sums are the sums of the handles' timings, to the nanosecond */
        if (s.time.queued_ns != time_sum[0] || s.time.encode_ns != time_sum[1] ||
            s.time.send_ns != time_sum[2] || s.time.wait_ns != time_sum[3] ||
            s.time.decode_ns != time_sum[4] || s.time.total_ns != time_sum[5] ||
            s.push_pulls != (uint64_t)(end - first_round) * (uint64_t)n) {
            fprintf(stderr,
                    "FAIL worker %d: psagg_get_stats: %llu push_pulls, total %llu ns; the "
                    "handles: %llu, %llu ns\n",
                    rank, (unsigned long long)s.push_pulls, (unsigned long long)s.time.total_ns,
                    (unsigned long long)(end - first_round) * (unsigned long long)n,
                    (unsigned long long)time_sum[5]);
            return 1;
        }
        printf("worker %d: mean ms per push_pull: queued %.3f encode %.3f send %.3f wait %.3f "
               "decode %.3f total %.3f\n",
               rank, (double)s.time.queued_ns / 1e6 / (double)s.push_pulls,
               (double)s.time.encode_ns / 1e6 / (double)s.push_pulls,
               (double)s.time.send_ns / 1e6 / (double)s.push_pulls,
               (double)s.time.wait_ns / 1e6 / (double)s.push_pulls,
               (double)s.time.decode_ns / 1e6 / (double)s.push_pulls,
               (double)s.time.total_ns / 1e6 / (double)s.push_pulls);
        printf("worker %d: %d rounds of %d tensors ok; sent %llu bytes (%.2fx smaller than fp32)\n",
               rank, rounds, n, (unsigned long long)s.bytes_sent,
               s.bytes_sent ? (double)s.bytes_raw / (double)s.bytes_sent : 0.0);
    }
    if (elastic_dead >= 0) {
        psagg_membership m = {.struct_size = sizeof m};
        if ((st = psagg_get_membership(ctx, &m)))
            goto failed;
        const psagg_membership *e = rejoin ? &adm_m : &left_m; /* (later: workers done) */
        printf("ELASTIC worker %d epoch %u rank %d size %d first-round-after %d longest-round-ms "
               "%.0f final-epoch %u\n",
               rank, e->epoch, e->rank, e->size, after_round, longest_round * 1e3, m.epoch);
        if (!rejoin &&
            ((left_epoch >= 0 && left_m.epoch != (left_epoch ? (uint32_t)left_epoch : 1u)) ||
             left_m.size != world - 1 || after_round < 0)) {
            fprintf(stderr,
                    "FAIL worker %d: worker %d did not leave the job as expected (first epoch "
                    "seen %u, of %d workers)\n",
                    rank, elastic_dead, left_m.epoch, left_m.size);
            return 1;
        }
        if (rejoin &&
            (loose ? adm_m.epoch < 2 || adm_m.size != world
                   : adm_m.epoch != (grow ? 1u : 2u) || adm_m.size != world || full_from < 0)) {
            fprintf(stderr,
                    "FAIL worker %d: worker %d did not leave and rejoin the job as expected "
                    "(admitted in epoch %u, %d workers, all summed from round %d)\n",
                    rank, elastic_dead, adm_m.epoch, adm_m.size, full_from);
            return 1;
        }
        if (rejoin) {
            for (int r = end - 10; r < end; r++) {
                if (r < first_round || !round_full[r]) {
                    fprintf(stderr,
                            "FAIL worker %d: round %d of the last 10 (of %d) was not the exact sum "
                            "of all %d workers\n",
                            rank, r, end, world);
                    return 1;
                }
                tail = fnv(tail, &round_digest[r], sizeof round_digest[r]);
            }
            printf("TAIL %016llx rejoined-from-round %d rounds %d\n", (unsigned long long)tail,
                   full_from, end);
        }
    }
    if (straggler >= 0) {
        /* every input summed once: float sums in other orders differ in the last bits; a
           lossy codec's error feedback leaves each worker's last residual (below a level of
           its bucket) and the server's requantize error (below the bound fn_worker's rounds
           use) out */
        psagg_stats s = {.struct_size = sizeof s};
        double L = codec.id == PSAGG_CODEC_MAXMIN ? (double)((1u << codec.bits) - 1) : 0;
        double level = L > 0 ? 0.07 / L : 0.07 * 0x1p-8;
        double bound = codec.id == PSAGG_CODEC_FP32 ? 1e-6 * (double)world * (double)end
                                                    : (2.0 * world + 2.0) * level;
        double worst = 0;
        uint64_t carried = 0;
        int last_k[64] = {0}, longest_tail = 0;
        for (int t = 0; t < n; t++)
            for (uint64_t i = 0; i < count[t]; i++) {
                /* a worker left out of the last rounds still carries them (as no later push
                   took them): a difference of such tails is no loss */
                int explained = fabs(cum[t][i]) <= bound, k[64];
                if (!explained && world <= 64) {
                    /* the tails of the element before (its chunk's), else a new chunk's */
                    explained = tails_fit(cum, t, i, count[t], last_k, world, end, bound, 1);
                    if (!explained &&
                        (explained = find_tails(cum, t, i, count[t], k, world, end, bound)))
                        memcpy(last_k, k, (size_t)world * sizeof *k);
                    for (int w = 0; explained && w < world; w++)
                        longest_tail = last_k[w] > longest_tail ? last_k[w] : longest_tail;
                    carried += (uint64_t)explained;
                }
                if (!explained && fabs(cum[t][i]) > worst)
                    worst = fabs(cum[t][i]);
                if (!explained && !lenient) {
                    fprintf(stderr,
                            "FAIL worker %d tensor %d element %llu: the updates over %d rounds "
                            "differ from every worker's inputs by %.9g (bound %.3g), which no "
                            "worker's last rounds left out explain: a left-out push was lost or "
                            "counted twice\n",
                            rank, t, (unsigned long long)i, end, cum[t][i], bound);
                    return 1;
                }
            }
        if (carried)
            printf("QUORUM worker %d: %llu elements still carried by workers left out of the "
                   "last rounds (up to %d rounds)\n",
                   rank, (unsigned long long)carried, longest_tail);
        if ((st = psagg_get_stats(ctx, &s)))
            goto failed;
        printf("QUORUM worker %d left_out %llu; the updates over %d rounds %s every input "
               "(largest difference %.3g)\n",
               rank, (unsigned long long)s.left_out, end, worst <= bound ? "are" : "are not",
               worst);
        for (int t = 0; t < n; t++)
            free(cum[t]);
        free(cum);
    }
    printf("DIGEST %016llx\n", (unsigned long long)digest);
    (void)d_in, (void)d_out;
    fflush(stdout);
    return psagg_close(ctx) ? 1 : 0;

failed : {
    double took = now_s() - t0;
    const char *msg = psagg_last_error();
    for (int t = 0; cum && t < n; t++) /* (--straggler's sums: a stalled worker fails) */
        free(cum[t]);
    free(cum);
    if (!expect) {
        fprintf(stderr, "FAIL: %s: %s\n", psagg_strerror(st), msg);
        return 1;
    }
    printf("worker failed as expected? status %d (%s) after %.2f s: %s\n", st, psagg_strerror(st),
           took, msg);
    if (st != expect) {
        fprintf(stderr, "FAIL: expected status %d (%s), got %d\n", expect, psagg_strerror(expect),
                st);
        return 1;
    }
    if (expect_text && !strstr(msg, expect_text)) {
        fprintf(stderr, "FAIL: the message does not mention '%s'\n", expect_text);
        return 1;
    }
    if (max_seconds > 0 && took > max_seconds) {
        fprintf(stderr, "FAIL: the error took %.2f s, limit %.2f s\n", took, max_seconds);
        return 1;
    }
    psagg_close(ctx);
    printf("EXPECTED-ERROR-OK\n");
    return 0;
}
}
