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
 * the round's generation is the schedule's (psagg_adapt_generation) and that
 * psagg_get_assignment agrees with the handles. It prints "ADAPTIVE-EXACT ..." with the
 * number of codec switches seen, and "DIGEST <hex>" of every output.
 *
 * It links libpsagg statically: the reference uses the library's own codecs and layout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
    uint32_t rounds = argc > 1 ? (uint32_t)atoi(argv[1]) : 16, switches = 0, max_gen = 0;
    psagg_config cfg;
    psagg_ctx *ctx = NULL;
    psagg_tensor_desc desc[N_T];
    psagg_ctl_tensor wire[N_T + 1];
    psagg_layout l;
    psagg_codec m4, fp32 = {.id = PSAGG_CODEC_FP32}, last[N_T];
    float *in[N_T], *out[N_T], *ref[N_T], *x, *acc, **res[N_T];
    uint8_t *enc;
    uint64_t digest = TEST_FNV_START, max_count = 0;
    uint32_t n_ad = 0;
    int rank, world;

    if (psagg_codec_parse("maxmin4/512", &m4) || psagg_codec_check(&m4))
        FAIL("codec");
    if (psagg_config_load(getenv("PSAGG_CONFIG"), &cfg))
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
        if (psagg_tensor_to_wire(name, sizes[t], &desc[t].codec, &wire[t]))
            FAIL("wire");
        n_ad += desc[t].codec.id == PSAGG_CODEC_MAXMIN;
        max_count = sizes[t] > max_count ? sizes[t] : max_count;
        last[t] = desc[t].codec;
    }
    if (psagg_declare(ctx, desc, N_T, NULL))
        FAIL("psagg_declare: %s", psagg_last_error());
    /* the same layout as every process of the job: ours, with the statistics tensor */
    if (psagg_tensor_to_wire(PSAGG_ADAPT_STATS_NAME, (uint64_t)n_ad * PSAGG_ADAPT_MAX_BUCKETS,
                             &fp32, &wire[N_T]) ||
        psagg_layout_build(wire, N_T + 1, psagg_chunk_elems(&cfg), (uint32_t)cfg.n_servers,
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

    for (uint32_t r = 0; r < rounds; r++) {
        psagg_handle *h[N_T];
        for (uint32_t t = 0; t < N_T; t++) {
            for (uint64_t i = 0; i < sizes[t]; i++)
                in[t][i] = input_value(rank, t, r, i) * scale(t, r, rounds);
            if (psagg_push_pull(ctx, t, in[t], out[t], PSAGG_SUM, 0, &h[t]))
                FAIL("push_pull: %s", psagg_last_error());
        }
        for (uint32_t t = 0; t < N_T; t++) {
            const psagg_tensor_info *ti = &l.tensors[t];
            psagg_codec codec;
            uint32_t gen;
            if (psagg_wait(h[t], -1))
                FAIL("round %u tensor %u: %s", r, t, psagg_last_error());
            if (psagg_handle_codec(h[t], &codec, &gen))
                FAIL("psagg_handle_codec: %s", psagg_last_error());
            psagg_release(h[t]);
            if (gen != (ti->adaptive ? psagg_adapt_generation(r, l.adapt_interval) : 0))
                FAIL("round %u tensor %u: generation %u, the schedule says %u", r, t, gen,
                     psagg_adapt_generation(r, l.adapt_interval));
            if (!ti->adaptive && !psagg_codec_equal(&codec, &ti->codec))
                FAIL("tensor %u has a fixed codec, but round %u went in another", t, r);
            if (!psagg_adapt_allowed(&ti->codec, ti->chunk_elems, &codec))
                FAIL("round %u tensor %u: codec is not one of the candidates", r, t);
            if (!psagg_codec_equal(&codec, &last[t])) {
                char a[40], b[40];
                switches++;
                if (rank == 0)
                    printf("round %u tensor a%u: %s -> %s (generation %u)\n", r, t,
                           psagg_codec_name(&last[t], a, sizeof a),
                           psagg_codec_name(&codec, b, sizeof b), gen);
                last[t] = codec;
            }
            max_gen = gen > max_gen ? gen : max_gen;
            /* the reference: every worker's push, summed in worker order, requantized */
            for (uint32_t c = 0; c < ti->n_chunks; c++) {
                const psagg_chunk_info *ci = &l.chunks[ti->first_chunk + c];
                size_t len = psagg_encoded_size(&codec, ci->count);
                for (int w = 0; w < world; w++) {
                    for (uint64_t i = 0; i < ci->count; i++)
                        x[i] = input_value(w, t, r, ci->offset + i) * scale(t, r, rounds);
                    if (psagg_encode(&codec, x, res[t][w] ? res[t][w] + ci->offset : NULL,
                                     ci->count,
                                     psagg_rng_chunk_key(cfg.seed, PSAGG_RNG_WORKER, (uint32_t)w, t,
                                                         ci->index, r),
                                     enc, len, NULL) ||
                        psagg_decode_into(&codec, enc, len, ci->count, acc,
                                          w ? PSAGG_DECODE_ADD : PSAGG_DECODE_FIRST, 1.0f))
                        FAIL("reference: %s", psagg_last_error());
                }
                if (psagg_encode(
                        &codec, acc, NULL, ci->count,
                        psagg_rng_chunk_key(cfg.seed, PSAGG_RNG_SERVER, ci->owner, t, ci->index, r),
                        enc, len, NULL) ||
                    psagg_decode(&codec, enc, len, ci->count, ref[t] + ci->offset))
                    FAIL("reference update: %s", psagg_last_error());
            }
            if (memcmp(ref[t], out[t], sizes[t] * sizeof(float))) {
                uint64_t i = 0;
                while (!memcmp(&ref[t][i], &out[t][i], sizeof(float)))
                    i++;
                FAIL("round %u tensor %u: element %llu is %.9g, the reference %.9g", r, t,
                     (unsigned long long)i, (double)out[t][i], (double)ref[t][i]);
            }
            digest = test_fnv(digest, out[t], sizes[t] * sizeof(float));
        }
    }
    for (uint32_t t = 0; t < N_T; t++) {
        psagg_assignment as = {.struct_size = sizeof as};
        if (psagg_get_assignment(ctx, t, &as))
            FAIL("psagg_get_assignment: %s", psagg_last_error());
        if (as.generation == max_gen && !psagg_codec_equal(&as.codec, &last[t]))
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
    psagg_layout_free(&l);
    return 0;
}
