/*
 * fn_adaptive.c - a functional-test worker of an adaptive job ([codec] adaptive = on), run
 * by test_adaptive.sh: the codec assignment must change mid-job and every sum stay exact.
 *
 * Every worker declares the tensors below (maxmin4/512 with error feedback, and one fp32),
 * contributes input_value(rank, key, round, i) x scale(key, round), whose per-tensor scales
 * swap between the first and second half of the job (so the assignment that fits the first
 * half does not fit the second), and each round checks every output bit for bit against a
 * reference it computes itself: every worker's push in the codec the round used
 * (psagg_handle_codec), with that worker's own error-feedback residual carried over from the
 * rounds before (in whatever codecs they used), the pushes summed in worker order as the
 * server does, and the sum requantized in the same codec with the chunk owner's RNG stream.
 * It also checks that
 * the round's generation is the schedule's (psagg__adapt_generation) and that
 * psagg_get_assignment agrees with the handles. It prints "ADAPTIVE-EXACT ..." with the
 * number of codec switches seen, and "DIGEST <hex>" of every output.
 *
 * Joins (an elastic job, test_adaptive_join.sh): `fn_adaptive ROUNDS --sync --joiner R ...`
 * calls psagg_sync_membership after every round; the ranks --joiner names (in the order they
 * will be admitted) start out of the job, and the k-th worker a barrier admits is the k-th
 * named, summed from the round after that barrier, its residual starting at zero there. A
 * worker started with such a rank joins the running job at the members' round (psagg_declare
 * returns once it is admitted); it cannot rebuild the members' past (their residuals hold
 * rounds in codecs of generations it never saw), so it checks no reference, only the
 * schedule. --hold R:FILE (any number of them): before round R's pushes, wait until FILE
 * exists (saying "HOLD before round R"), so that the harness lets a joiner ask to join
 * before the barrier after round R. Every worker prints, per round, "ROUND r <digest of its
 * outputs> <each tensor's codec@generation>" (psagg_handle_codec), and before each round
 * (after the barrier before it, or its admission) "ASSIGN r <each tensor's
 * psagg_get_assignment>": the harness checks that a joiner's lines are the members'.
 * --progress: print "ROUND r" as it starts round r (test_server_failover.sh kills a server
 * at a round).
 *
 * It links libpsagg statically: the reference uses the library's own codecs and layout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fn_input.h"
#include "kernels/codec.h"
#include "psagg.h"
#include "testutil.h"
#include "runtime/adaptive.h"
#include "runtime/config.h"
#include "runtime/layout.h"

#define N_T 6
static const uint64_t sizes[N_T] = {5000, 70000, 150000, 2048, 100000, 300};

/* Per-tensor gradient scales, 1e-3..1e1, swapped halfway through the job. */
static float scale(uint32_t t, uint32_t r, uint32_t rounds)
{
    static const float s[N_T] = {1e-3f, 1e-2f, 1e-1f, 1.0f, 10.0f, 1.0f};
    return r < rounds / 2 ? s[t] : s[N_T - 2 - (t < N_T - 1 ? t : 0)];
}

#define MAX_JOINERS 8
#define MAX_HOLDS   8

/* "ASSIGN r ...": every tensor's psagg_get_assignment before round r. */
static void print_assign(psagg_ctx *ctx, uint32_t r)
{
    printf("ASSIGN %u", r);
    for (uint32_t t = 0; t < N_T; t++) {
        psagg_assignment as = {.struct_size = sizeof as};
        char n[40];
        if (psagg_get_assignment(ctx, t, &as))
            FAIL("psagg_get_assignment: %s", psagg_last_error());
        printf(" a%u=%s@%u/%u", t, psagg_codec_name(&as.codec, n, sizeof n), as.generation,
               as.from_round);
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    uint32_t rounds = argc > 1 ? (uint32_t)atoi(argv[1]) : 16, switches = 0, max_gen = 0;
    uint32_t first_round = 0, join_round[MAX_JOINERS], hold_round[MAX_HOLDS];
    int sync = 0, progress = 0, joiner[MAX_JOINERS], n_joiners = 0, n_joined = 0, n_holds = 0,
        self_joined = 0;
    const char *hold_file[MAX_HOLDS];
    psagg__config cfg;
    psagg_ctx *ctx = NULL;
    psagg_tensor_desc desc[N_T];
    psagg__ctl_tensor wire[N_T + 1];
    psagg__layout l;
    psagg_codec m4, fp32 = {.id = PSAGG_CODEC_FP32}, last[N_T];
    float *in[N_T], *out[N_T], *ref[N_T], *x, *acc, **res[N_T];
    uint8_t *enc;
    uint64_t digest = TEST_FNV_START, max_count = 0;
    uint32_t n_ad = 0;
    int rank, world;

    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--sync")) {
            sync = 1;
        } else if (!strcmp(argv[i], "--progress")) {
            progress = 1;
        } else if (!strcmp(argv[i], "--joiner") && i + 1 < argc && n_joiners < MAX_JOINERS) {
            join_round[n_joiners] = UINT32_MAX; /* not yet */
            joiner[n_joiners++] = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--hold") && i + 1 < argc && n_holds < MAX_HOLDS &&
                   strchr(argv[i + 1], ':')) {
            hold_round[n_holds] = (uint32_t)atoi(argv[++i]);
            hold_file[n_holds++] = strchr(argv[i], ':') + 1;
        } else {
            FAIL("usage: fn_adaptive ROUNDS [--sync] [--progress] [--joiner RANK]... "
                 "[--hold ROUND:FILE]...");
        }
    }
    if (psagg_codec_parse("maxmin4/512", &m4) || psagg__codec_check(&m4))
        FAIL("codec");
    if (psagg__config_load(getenv("PSAGG_CONFIG"), &cfg))
        FAIL("config: %s", psagg_last_error());
    if (!cfg.adaptive)
        FAIL("this test needs [codec] adaptive = on");
    if (psagg_init(NULL, -1, -1, &ctx))
        FAIL("psagg_init: %s", psagg_last_error());
    rank = psagg_rank(ctx);
    world = psagg_world_size(ctx);
    for (uint32_t t = 0; t < N_T; t++) {
        char *name = malloc(16);
        snprintf(name, 16, "a%u", t);
        desc[t] = (psagg_tensor_desc){.struct_size = sizeof(psagg_tensor_desc),
                                      .name = name,
                                      .count = sizes[t],
                                      .codec = t == N_T - 1 ? fp32 : m4,
                                      .error_feedback = t == N_T - 1 ? 0 : 1};
        if (psagg__tensor_to_wire(name, sizes[t], &desc[t].codec, &wire[t]))
            FAIL("wire");
        n_ad += desc[t].codec.id == PSAGG_CODEC_MAXMIN;
        max_count = sizes[t] > max_count ? sizes[t] : max_count;
        last[t] = desc[t].codec;
    }
    if (psagg_declare(ctx, desc, N_T, NULL))
        FAIL("psagg_declare: %s", psagg_last_error());
    {
        psagg_membership m = {.struct_size = sizeof m};
        if (psagg_get_membership(ctx, &m))
            FAIL("psagg_get_membership: %s", psagg_last_error());
        if (m.joiner) { /* it joined the running job: at the members' round */
            if (psagg_get_tensor_round(ctx, 0, &first_round))
                FAIL("psagg_get_tensor_round: %s", psagg_last_error());
            self_joined = 1;
            for (int k = 0; k < n_joiners && !n_joined; k++) /* those named before it are in */
                if (joiner[k] == rank)
                    n_joined = k + 1;
            printf("fn_adaptive %d: joined at round %u, membership epoch %u, %d workers\n", rank,
                   first_round, m.epoch, m.size);
        }
    }
    if (sync)
        print_assign(ctx, first_round);
    /* the same layout as every process of the job: ours, with the statistics tensor */
    if (psagg__tensor_to_wire(PSAGG_ADAPT_STATS_NAME, (uint64_t)n_ad * PSAGG_ADAPT_MAX_BUCKETS,
                              &fp32, &wire[N_T]) ||
        psagg__layout_build(wire, N_T + 1, psagg__chunk_elems(&cfg), (uint32_t)cfg.n_servers,
                            (uint32_t)cfg.adaptive_interval, &l))
        FAIL("layout: %s", psagg_last_error());
    x = malloc(max_count * sizeof *x);
    acc = malloc(max_count * sizeof *acc);
    enc = malloc(l.max_enc_bytes);
    if (!x || !acc || !enc)
        FAIL("memory");
    for (uint32_t t = 0; t < N_T; t++) {
        in[t] = malloc(sizes[t] * sizeof(float));
        out[t] = malloc(sizes[t] * sizeof(float));
        ref[t] = malloc(sizes[t] * sizeof(float));
        res[t] = calloc((size_t)world, sizeof *res[t]);
        if (!in[t] || !out[t] || !ref[t] || !res[t])
            FAIL("memory");
        for (int w = 0; w < world && desc[t].error_feedback; w++)
            if (!(res[t][w] = calloc(sizes[t], sizeof(float))))
                FAIL("memory");
    }

    for (uint32_t r = first_round; r < rounds; r++) {
        psagg_handle *h[N_T];
        uint64_t round_digest = TEST_FNV_START;
        char codecs[N_T * 48] = "";
        size_t used = 0;
        for (int k = 0; k < n_holds; k++)
            if (hold_round[k] == r)
                if (fn_hold("round", r, hold_file[k]))
                    return 1;
        if (progress) {
            printf("ROUND %u\n", r);
            fflush(stdout);
        }
        for (uint32_t t = 0; t < N_T; t++) {
            for (uint64_t i = 0; i < sizes[t]; i++)
                in[t][i] = input_value(rank, t, r, i) * scale(t, r, rounds);
            if (psagg_push_pull(ctx, t, in[t], out[t], PSAGG_SUM, 0, &h[t]))
                FAIL("push_pull: %s", psagg_last_error());
        }
        for (uint32_t t = 0; t < N_T; t++) {
            const psagg__tensor_info *ti = &l.tensors[t];
            psagg_codec codec;
            uint32_t gen;
            if (psagg_wait(h[t], -1))
                FAIL("round %u tensor %u: %s", r, t, psagg_last_error());
            if (psagg_handle_codec(h[t], &codec, &gen))
                FAIL("psagg_handle_codec: %s", psagg_last_error());
            psagg_release(h[t]);
            if (gen != (ti->adaptive ? psagg__adapt_generation(r, l.adapt_interval) : 0))
                FAIL("round %u tensor %u: generation %u, the schedule says %u", r, t, gen,
                     psagg__adapt_generation(r, l.adapt_interval));
            if (!ti->adaptive && !psagg__codec_equal(&codec, &ti->codec))
                FAIL("tensor %u has a fixed codec, but round %u went in another", t, r);
            if (!psagg__adapt_allowed(&ti->codec, ti->chunk_elems, &codec))
                FAIL("round %u tensor %u: codec is not one of the candidates", r, t);
            if (!psagg__codec_equal(&codec, &last[t])) {
                char a[40], b[40];
                switches++;
                if (rank == 0)
                    printf("round %u tensor a%u: %s -> %s (generation %u)\n", r, t,
                           psagg_codec_name(&last[t], a, sizeof a),
                           psagg_codec_name(&codec, b, sizeof b), gen);
                last[t] = codec;
            }
            max_gen = gen > max_gen ? gen : max_gen;
            {
                char n[40];
                used += (size_t)snprintf(codecs + used, sizeof codecs - used, " a%u=%s@%u", t,
                                         psagg_codec_name(&codec, n, sizeof n), gen);
            }
            round_digest = test_fnv(round_digest, out[t], sizes[t] * sizeof(float));
            digest = test_fnv(digest, out[t], sizes[t] * sizeof(float));
            if (self_joined) /* (the members' past is not this worker's to rebuild) */
                continue;
            /* the reference: every worker's push, summed in worker order, requantized */
            for (uint32_t c = 0; c < ti->n_chunks; c++) {
                const psagg__chunk_info *ci = &l.chunks[ti->first_chunk + c];
                size_t len = psagg__encoded_size(&codec, ci->count);
                int first = 1;
                for (int w = 0; w < world; w++) {
                    int in_round = w < cfg.n_workers;
                    for (int k = 0; k < n_joiners; k++)
                        if (joiner[k] == w)
                            in_round = r >= join_round[k];
                    if (!in_round)
                        continue;
                    for (uint64_t i = 0; i < ci->count; i++)
                        x[i] = input_value(w, t, r, ci->offset + i) * scale(t, r, rounds);
                    if (psagg__encode(&codec, x, res[t][w] ? res[t][w] + ci->offset : NULL,
                                      ci->count,
                                      psagg__rng_chunk_key(cfg.seed, PSAGG_RNG_WORKER, (uint32_t)w,
                                                           t, ci->index, r),
                                      enc, len, NULL) ||
                        psagg__decode_into(&codec, enc, len, ci->count, acc,
                                           first ? PSAGG_DECODE_FIRST : PSAGG_DECODE_ADD, 1.0f))
                        FAIL("reference: %s", psagg_last_error());
                    first = 0;
                }
                if (psagg__encode(&codec, acc, NULL, ci->count,
                                  psagg__rng_chunk_key(cfg.seed, PSAGG_RNG_SERVER, ci->owner, t,
                                                       ci->index, r),
                                  enc, len, NULL) ||
                    psagg__decode(&codec, enc, len, ci->count, ref[t] + ci->offset))
                    FAIL("reference update: %s", psagg_last_error());
            }
            if (memcmp(ref[t], out[t], sizes[t] * sizeof(float))) {
                uint64_t i = 0;
                while (!memcmp(&ref[t][i], &out[t][i], sizeof(float)))
                    i++;
                FAIL("round %u tensor %u: element %llu is %.9g, the reference %.9g", r, t,
                     (unsigned long long)i, (double)out[t][i], (double)ref[t][i]);
            }
        }
        if (!sync)
            continue;
        printf("ROUND %u %016llx%s\n", r, (unsigned long long)round_digest, codecs);
        {
            psagg_membership m = {.struct_size = sizeof m};
            if (psagg_sync_membership(ctx, &m))
                FAIL("psagg_sync_membership after round %u: %s", r, psagg_last_error());
            for (int k = 0; k < m.joined; k++) { /* the next joiners named: from round r + 1 */
                if (n_joined == n_joiners)
                    FAIL("the barrier after round %u admitted %d workers; only %d named", r,
                         m.joined, n_joiners);
                join_round[n_joined++] = r + 1;
                printf("barrier after round %u admitted worker %d (epoch %u, %d workers)\n", r,
                       joiner[n_joined - 1], m.epoch, m.size);
            }
        }
        print_assign(ctx, r + 1);
    }
    for (uint32_t t = 0; t < N_T; t++) {
        psagg_assignment as = {.struct_size = sizeof as};
        if (psagg_get_assignment(ctx, t, &as))
            FAIL("psagg_get_assignment: %s", psagg_last_error());
        if (as.generation == max_gen && !psagg__codec_equal(&as.codec, &last[t]))
            FAIL("tensor %u: psagg_get_assignment disagrees with the last round's codec", t);
    }
    printf("ADAPTIVE-EXACT rounds=%u tensors=%u generations=%u switches=%u\n", rounds, N_T, max_gen,
           switches);
    printf("DIGEST %016llx\n", (unsigned long long)digest);
    if (psagg_close(ctx))
        FAIL("psagg_close");
    for (uint32_t t = 0; t < N_T; t++) {
        for (int w = 0; w < world; w++)
            free(res[t][w]);
        free(res[t]), free(in[t]), free(out[t]), free(ref[t]);
        free((void *)desc[t].name);
    }
    free(x), free(acc), free(enc);
    psagg__layout_free(&l);
    return 0;
}
