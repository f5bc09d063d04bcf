/*
 * fn_optim.c - a functional-test worker of a job with a server-side optimizer ([server]
 * optimizer), run by test_optim.sh. Usage:
 *   fn_optim STEPS [--checkpoint-at C] [--stop-after S] [--resume] [--lr-scale X]
 * with PSAGG_CONFIG, PSAGG_RANK, PSAGG_WORLD_SIZE set, and FN_OPTIM_CODEC (default fp32).
 * FN_OPTIM_EF_BETA=B: the parameters' pushes keep worker error feedback that decays by B
 * (psagg_tensor_desc.error_feedback_beta: the library keeps B * (v - y) after each encode; the
 * reference keeps every worker's v - y and multiplies it by B before the next, the same
 * floats); without it, no error feedback. FN_OPTIM_DESC_V1=1: declare with the psagg_tensor_desc
 * of psagg.h before error_feedback_beta (struct_size 56, the array's stride), which the library
 * must still take.
 *
 * Every worker declares four parameter tensors and one plain (summed) fp32 tensor, starts
 * its parameters from weights of its own rank (psagg_param_init must hand every worker
 * worker 0's), and trains them on a quadratic loss: worker w's gradient is
 * (weights - target) x (0.5 + 0.25 w) + noise(w, tensor, step), pushed with AVERAGE, with a
 * learning rate that decays per step and a weight decay on tensor 0 only (psagg_set_lr).
 * After every step it checks its weights bit for bit against a reference it computes
 * itself from the same arithmetic: every worker's push in the tensor's codec (the worker's
 * RNG stream), summed in worker order, the optimizer's step written out in scalar C from
 * kernels/optim.h's specification (tests/optim_reference.h, not the library's loop), the delta to
 * the weights every worker holds requantized with the chunk owner's RNG stream (or, every [server]
 * sync_interval steps, the master weights themselves). At the end it pulls the master
 * weights (psagg_pull_weights), checks them against the reference's, prints the drift
 * between them and the weights trained with, and pulls again with sync.
 *
 * --checkpoint-at C: worker 0 asks for a checkpoint after step C (with --checkpoint-all every
 * worker does: a job with [server] quorum). --step-sleep-ms MS: print STEP n after each step and
 * sleep MS (a job slow enough to kill a server in). --stop-after S: after step
 * S print STOPPED and wait to be killed. --hold S:FILE: before step S's pushes, print "HOLD
 * before step S" and wait (up to 120 s) until FILE exists (a harness whose kills and returns must
 * all come before the job ends). --checkpoint-hold FILE: before its checkpoint call,
 * print CHECKPOINT-HOLD and wait (up to 120 s) until FILE exists (the harness kills a server
 * meanwhile). --checkpoint-retry: a checkpoint call that fails with PSAGG_EAGAIN or PSAGG_EPEER
 * (a server lost, or a chunk taken over that has not caught up) prints CHECKPOINT-RETRY and is
 * made again after the next step (up to 20 times). --resume: the servers resumed from a checkpoint;
 * the reference replays the steps before the round psagg_param_init reports. --lr-scale: this
 * worker's learning rate times X (a worker that disagrees: the job must fail).
 * --straggler RANK --straggler-ms MS: worker RANK sleeps MS before each step's pushes; in a job
 * with [server] quorum its pushes may then be left out of rounds (carried into later ones), which
 * the reference cannot know: the job's weights are then checked only in being the same on every
 * worker (the master weights pulled with sync at the end: DIGEST; no OPTIM-EXACT), and each
 * worker prints "QUORUM worker W left_out N" (psagg_stats.left_out). --die RANK STEP US: worker
 * RANK SIGKILLs itself US microseconds after it started step STEP's push_pulls (among its sends:
 * an elastic job goes on without it), checked as --straggler's are.
 * Prints "OPTIM-EXACT ...", "DRIFT ..." and "DIGEST <hex>" of the final weights.
 */
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fn_input.h"
#include "kernels/codec.h"
#include "optim_reference.h"
#include "kernels/optim.h"
#include "psagg.h"
#include "testutil.h"
#include "runtime/config.h"
#include "runtime/layout.h"

#define N_P 4 /* parameters; then one plain tensor */
static const uint64_t sizes[N_P + 1] = {5000, 70000, 300, 12345, 2000};

static float init_value(int w, uint32_t t, uint64_t i)
{
    return input_value(w, 100 + t, 0, i) * 10.0f;
}

static float target(uint32_t t, uint64_t i)
{
    return input_value(99, 200 + t, 0, i) * 10.0f;
}

/* Worker w's gradient of element i at step s, given the weights everyone holds. */
static float grad_value(int w, uint32_t t, uint32_t s, uint64_t i, float weight)
{
    return (weight - target(t, i)) * (0.5f + 0.25f * (float)w) + input_value(w, t, s, i);
}

static float step_lr(uint32_t s)
{
    return 0.05f / (1.0f + 0.1f * (float)s);
}

static float step_wd(uint32_t t)
{
    return t == 0 ? 0.01f : 0.0f;
}

typedef struct ref_tensor {
    float *w, *view, *m1, *m2;
    float *res; /* FN_OPTIM_EF_BETA: every worker's residual (world x count), or NULL */
} ref_tensor;

static float ef_beta; /* FN_OPTIM_EF_BETA, 0: no error feedback */

/* One step of the servers, for every parameter tensor, on the reference. */
static void ref_round(const psagg__config *cfg, const psagg__layout *l, const psagg_codec *codec,
                      ref_tensor *ref, uint32_t s, int world, float *x, float *acc, uint8_t *enc)
{
    const psagg__optim o = {.kind = (psagg__optim_kind)cfg->optimizer,
                            .momentum = cfg->momentum,
                            .dampening = cfg->dampening,
                            .nesterov = cfg->nesterov,
                            .beta1 = cfg->beta1,
                            .beta2 = cfg->beta2,
                            .eps = cfg->eps},
                       *opt = &o;
    for (uint32_t t = 0; t < N_P; t++) {
        const psagg__tensor_info *ti = &l->tensors[t];
        for (uint32_t c = 0; c < ti->n_chunks; c++) {
            const psagg__chunk_info *ci = &l->chunks[ti->first_chunk + c];
            size_t len = psagg__encoded_size(codec, ci->count);
            float *vw = ref[t].view + ci->offset, *mw = ref[t].w + ci->offset;
            for (int w = 0; w < world; w++) {
                float *res = ref[t].res ? ref[t].res + (size_t)w * ti->count + ci->offset : NULL;
                for (uint64_t i = 0; i < ci->count; i++)
                    x[i] = grad_value(w, t, s, ci->offset + i, vw[i]);
                for (uint64_t i = 0; res && i < ci->count; i++) /* e <- beta * e, then x + e */
                    res[i] *= ef_beta;
                if (psagg__encode(codec, x, res, ci->count,
                                  psagg__rng_chunk_key(cfg->seed, PSAGG_RNG_WORKER, (uint32_t)w, t,
                                                       ci->index, s),
                                  enc, len, NULL) ||
                    psagg__decode_into(codec, enc, len, ci->count, acc,
                                       w ? PSAGG_DECODE_ADD : PSAGG_DECODE_FIRST, 1.0f))
                    FAIL("reference: %s", psagg_last_error());
            }
            ref_optim_step(opt, step_lr(s), step_wd(t), (uint64_t)s + 1, 1.0f / (float)world, acc,
                           mw, ref[t].m1 + ci->offset, ref[t].m2 + ci->offset, ci->count);
            if (cfg->sync_interval && (s + 1) % cfg->sync_interval == 0) {
                memcpy(vw, mw, ci->count * sizeof(float));
                continue;
            }
            for (uint64_t i = 0; i < ci->count; i++)
                x[i] = mw[i] - vw[i];
            if (psagg__encode(
                    codec, x, NULL, ci->count,
                    psagg__rng_chunk_key(cfg->seed, PSAGG_RNG_SERVER, ci->owner, t, ci->index, s),
                    enc, len, NULL) ||
                psagg__decode_into(codec, enc, len, ci->count, vw, PSAGG_DECODE_ADD, 1.0f))
                FAIL("reference delta: %s", psagg_last_error());
        }
    }
}

static void same(const float *got, const float *want, uint64_t n, const char *what, uint32_t t,
                 uint32_t s)
{
    if (memcmp(got, want, n * sizeof(float))) {
        uint64_t i = 0;
        while (!memcmp(&got[i], &want[i], sizeof(float)))
            i++;
        FAIL("%s of tensor %u after step %u: element %llu is %.9g, the reference %.9g", what, t, s,
             (unsigned long long)i, (double)got[i], (double)want[i]);
    }
}

int main(int argc, char **argv)
{
    uint32_t steps = argc > 1 ? (uint32_t)atoi(argv[1]) : 10, ckpt_at = 0, stop_after = 0, start;
    int ckpt_all = 0, step_sleep_ms = 0, ckpt_retry = 0, straggler = -1, straggler_ms = 0, exact;
    int die_rank = -1, die_step = 0, die_us = 0;
    const char *ckpt_hold = NULL, *hold_file = NULL;
    uint32_t hold_step = UINT32_MAX;
    int resume = 0, rank, world;
    float lr_scale = 1.0f;
    const char *codec_text = getenv("FN_OPTIM_CODEC") ? getenv("FN_OPTIM_CODEC") : "fp32";
    psagg__config cfg;
    psagg_ctx *ctx = NULL;
    psagg_tensor_desc desc[N_P + 1];
    psagg__ctl_tensor wire[N_P + 1];
    psagg__layout l;
    psagg_codec codec, fp32 = {.id = PSAGG_CODEC_FP32};
    ref_tensor ref[N_P];
    float *wt[N_P + 1], *g[N_P + 1], *x, *acc, *pulled;
    uint8_t *enc;
    double drift = 0;

    for (int a = 2; a < argc; a++) {
        if (!strcmp(argv[a], "--checkpoint-at") && a + 1 < argc)
            ckpt_at = (uint32_t)atoi(argv[++a]);
        else if (!strcmp(argv[a], "--stop-after") && a + 1 < argc)
            stop_after = (uint32_t)atoi(argv[++a]);
        else if (!strcmp(argv[a], "--resume"))
            resume = 1;
        else if (!strcmp(argv[a], "--checkpoint-all"))
            ckpt_all = 1;
        else if (!strcmp(argv[a], "--lr-scale") && a + 1 < argc)
            lr_scale = strtof(argv[++a], NULL);
        else if (!strcmp(argv[a], "--step-sleep-ms") && a + 1 < argc)
            step_sleep_ms = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--checkpoint-hold") && a + 1 < argc)
            ckpt_hold = argv[++a];
        else if (!strcmp(argv[a], "--hold") && a + 1 < argc && strchr(argv[a + 1], ':')) {
            hold_step = (uint32_t)atoi(argv[++a]);
            hold_file = strchr(argv[a], ':') + 1;
        } else if (!strcmp(argv[a], "--checkpoint-retry"))
            ckpt_retry = 1;
        else if (!strcmp(argv[a], "--straggler") && a + 1 < argc)
            straggler = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--straggler-ms") && a + 1 < argc)
            straggler_ms = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--die") && a + 3 < argc) {
            die_rank = atoi(argv[++a]);
            die_step = atoi(argv[++a]);
            die_us = atoi(argv[++a]);
        } else
            FAIL("usage: fn_optim STEPS [--checkpoint-at C] [--checkpoint-all] [--stop-after S] "
                 "[--resume] [--lr-scale X] [--step-sleep-ms MS] [--hold S:FILE] "
                 "[--checkpoint-hold FILE] "
                 "[--checkpoint-retry] [--straggler RANK --straggler-ms MS] [--die RANK STEP US]");
    }
    if (psagg_codec_parse(codec_text, &codec) || psagg__codec_check(&codec))
        FAIL("FN_OPTIM_CODEC '%s'", codec_text);
    if (getenv("FN_OPTIM_EF_BETA")) {
        ef_beta = strtof(getenv("FN_OPTIM_EF_BETA"), NULL);
        /* (its range is psagg_declare's to check: test_optim.sh gives it a bad one) */
        if (ef_beta == 0 || codec.id == PSAGG_CODEC_FP32 || resume)
            FAIL("FN_OPTIM_EF_BETA '%s': a number other than 0, with a codec other than fp32 and "
                 "without --resume (the workers' residuals are not in a checkpoint)",
                 getenv("FN_OPTIM_EF_BETA"));
    }
    if (psagg__config_load(getenv("PSAGG_CONFIG"), &cfg))
        FAIL("config: %s", psagg_last_error());
    /* (a round may close without the straggler, or without a worker that died) */
    exact = !(straggler >= 0 && cfg.quorum) && die_rank < 0;
    if (psagg_init(NULL, -1, -1, &ctx))
        FAIL("psagg_init: %s", psagg_last_error());
    rank = psagg_rank(ctx);
    world = psagg_world_size(ctx);
    for (uint32_t t = 0; t <= N_P; t++) {
        char *name = malloc(16);
        snprintf(name, 16, t < N_P ? "p%u" : "plain", t);
        desc[t] = (psagg_tensor_desc){.struct_size = sizeof(psagg_tensor_desc),
                                      .name = name,
                                      .count = sizes[t],
                                      .codec = t < N_P ? codec : fp32,
                                      .error_feedback = t < N_P && ef_beta != 0,
                                      .flags = t < N_P ? PSAGG_TENSOR_PARAMETER : 0,
                                      .error_feedback_beta = ef_beta};
        if (psagg__tensor_to_wire(name, sizes[t], &desc[t].codec, &wire[t]))
            FAIL("wire");
        wire[t].flags = t < N_P ? PSAGG_DECL_PARAM : 0;
        wt[t] = malloc(sizes[t] * sizeof(float));
        g[t] = malloc(sizes[t] * sizeof(float));
        if (!wt[t] || !g[t])
            FAIL("memory");
    }
    if (getenv("FN_OPTIM_DESC_V1")) { /* the older, shorter struct: a 56-byte stride */
        const size_t v1 = offsetof(psagg_tensor_desc, error_feedback_beta);
        char *old = calloc(N_P + 1, v1);
        if (!old || ef_beta != 0)
            FAIL("FN_OPTIM_DESC_V1: %s", old ? "has no error_feedback_beta" : "memory");
        for (uint32_t t = 0; t <= N_P; t++) {
            desc[t].struct_size = v1;
            memcpy(old + t * v1, &desc[t], v1);
        }
        if (psagg_declare(ctx, (const psagg_tensor_desc *)(const void *)old, N_P + 1, NULL))
            FAIL("psagg_declare (struct_size %zu): %s", v1, psagg_last_error());
        free(old);
    } else if (psagg_declare(ctx, desc, N_P + 1, NULL)) {
        FAIL("psagg_declare: %s", psagg_last_error());
    }
    if (psagg__layout_build(wire, N_P + 1, psagg__chunk_elems(&cfg), (uint32_t)cfg.n_servers, 0,
                            &l))
        FAIL("layout: %s", psagg_last_error());
    x = malloc(sizes[1] * sizeof *x);
    acc = malloc(sizes[1] * sizeof *acc);
    pulled = malloc(sizes[1] * sizeof *pulled);
    enc = malloc(l.max_enc_bytes > 4 * sizes[1] ? l.max_enc_bytes : 4 * sizes[1]);
    if (!x || !acc || !enc || !pulled)
        FAIL("memory");

    /* every worker starts from its own weights; the servers keep worker 0's */
    for (uint32_t t = 0; t < N_P; t++) {
        psagg_handle *h;
        ref[t].w = malloc(sizes[t] * sizeof(float));
        ref[t].view = malloc(sizes[t] * sizeof(float));
        ref[t].m1 = calloc(sizes[t], sizeof(float));
        ref[t].m2 = calloc(sizes[t], sizeof(float));
        ref[t].res = ef_beta != 0 ? calloc((size_t)world * sizes[t], sizeof(float)) : NULL;
        if (!ref[t].w || !ref[t].view || !ref[t].m1 || !ref[t].m2 || (ef_beta != 0 && !ref[t].res))
            FAIL("memory");
        for (uint64_t i = 0; i < sizes[t]; i++) {
            wt[t][i] = init_value(rank, t, i);
            ref[t].w[i] = ref[t].view[i] = init_value(0, t, i);
        }
        if (psagg_param_init(ctx, t, wt[t], &h) || psagg_wait(h, -1))
            FAIL("psagg_param_init of tensor %u: %s", t, psagg_last_error());
        psagg_release(h);
    }
    if (psagg_get_tensor_round(ctx, 0, &start))
        FAIL("psagg_get_tensor_round: %s", psagg_last_error());
    for (uint32_t t = 1; t < N_P; t++) {
        uint32_t r;
        if (psagg_get_tensor_round(ctx, t, &r) || r != start)
            FAIL("tensor %u is at round %u, tensor 0 at %u", t, r, start);
    }
    if (start && !resume)
        FAIL("the parameters start at step %u without a checkpoint", start);
    for (uint32_t s = 0; s < start; s++) /* what the job did before its checkpoint */
        ref_round(&cfg, &l, &codec, ref, s, world, x, acc, enc);
    for (uint32_t t = 0; t < N_P; t++)
        same(wt[t], ref[t].view, sizes[t], "the initial weights", t, start);
    if (rank == 0)
        printf("INIT from step %u: every worker holds %s weights\n", start,
               start ? "the checkpoint's" : "worker 0's");

    /* the config's range applies to the API too: 0..1e6, finite */
    {
        static const float bad[][2] = {{1e30f, 0}, {2e6f, 0}, {0.1f, 1e7f}, {-1, 0}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
            if (psagg_set_lr(ctx, PSAGG_ALL_KEYS, bad[i][0], bad[i][1]) != PSAGG_EINVAL ||
                !strstr(psagg_last_error(), "0..1e+06"))
                FAIL("psagg_set_lr(%g, %g) was not refused: %s", (double)bad[i][0],
                     (double)bad[i][1], psagg_last_error());
    }

    for (uint32_t s = start; s < steps; s++) {
        psagg_handle *h[N_P + 1];
        if (s == hold_step && fn_hold("step", s, hold_file))
            return 1;
        if (rank == straggler)
            usleep((useconds_t)straggler_ms * 1000);
        for (uint32_t t = 0; t < N_P; t++) {
            if (psagg_set_lr(ctx, t, step_lr(s) * lr_scale, step_wd(t)))
                FAIL("psagg_set_lr: %s", psagg_last_error());
            for (uint64_t i = 0; i < sizes[t]; i++)
                g[t][i] = grad_value(rank, t, s, i, wt[t][i]);
            if (psagg_push_pull(ctx, t, g[t], wt[t], PSAGG_AVERAGE, 0, &h[t]))
                FAIL("push_pull: %s", psagg_last_error());
        }
        for (uint64_t i = 0; i < sizes[N_P]; i++) /* a plain sum beside the parameters */
            g[N_P][i] = input_value(rank, N_P, s - start, i);
        if (psagg_push_pull(ctx, N_P, g[N_P], wt[N_P], PSAGG_SUM, 0, &h[N_P]))
            FAIL("push_pull: %s", psagg_last_error());
        if (rank == die_rank && s == (uint32_t)die_step) { /* (among its step's sends) */
            printf("DYING at step %u after %d us\n", s, die_us);
            fflush(stdout);
            usleep((useconds_t)die_us);
            raise(SIGKILL);
        }
        for (uint32_t t = 0; t <= N_P; t++) {
            if (psagg_wait(h[t], -1))
                FAIL("step %u tensor %u: %s", s, t, psagg_last_error());
            psagg_release(h[t]);
        }
        if (!exact)
            goto checked;
        ref_round(&cfg, &l, &codec, ref, s, world, x, acc, enc);
        for (uint32_t t = 0; t < N_P; t++)
            same(wt[t], ref[t].view, sizes[t], "the weights", t, s);
        for (uint64_t i = 0; i < sizes[N_P]; i++) {
            float sum = 0.0f;
            for (int w = 0; w < world; w++)
                sum = sum + input_value(w, N_P, s - start, i);
            if (memcmp(&sum, &wt[N_P][i], sizeof sum))
                FAIL("step %u: the plain tensor's element %llu is %.9g, not %.9g", s,
                     (unsigned long long)i, (double)wt[N_P][i], (double)sum);
        }
    checked:
        if ((rank == 0 || ckpt_all) && ckpt_at == s + 1) {
            psagg_status st;
            for (int i = 0; ckpt_hold && access(ckpt_hold, F_OK) != 0; i++) {
                if (i == 0) {
                    printf("CHECKPOINT-HOLD after step %u\n", s);
                    fflush(stdout);
                }
                if (i > 12000)
                    FAIL("--checkpoint-hold: %s did not appear within 120 s", ckpt_hold);
                usleep(10000);
            }
            ckpt_hold = NULL;
            st = psagg_checkpoint(ctx);
            if (st && ckpt_retry && (st == PSAGG_EAGAIN || st == PSAGG_EPEER) && ckpt_at < steps &&
                ckpt_retry++ <= 20) {
                printf("CHECKPOINT-RETRY after step %u: %s\n", s, psagg_last_error());
                fflush(stdout);
                ckpt_at++; /* again after the next step */
            } else if (st) {
                FAIL("psagg_checkpoint: %s", psagg_last_error());
            } else {
                printf("CHECKPOINT after step %u\n", s);
                fflush(stdout);
            }
        }
        if (step_sleep_ms) { /* (a job slow enough to kill a server in: test_server_failover) */
            printf("STEP %u\n", s + 1);
            fflush(stdout);
            usleep((useconds_t)step_sleep_ms * 1000);
        }
        if (stop_after == s + 1) {
            printf("STOPPED after step %u\n", s);
            fflush(stdout);
            for (;;)
                pause();
        }
    }
    /* the master weights, exactly; then the drift of the weights trained with */
    for (uint32_t t = 0; t < N_P; t++) {
        psagg_handle *h;
        if (psagg_pull_weights(ctx, t, pulled, 0, &h) || psagg_wait(h, -1))
            FAIL("psagg_pull_weights: %s", psagg_last_error());
        psagg_release(h);
        if (exact)
            same(pulled, ref[t].w, sizes[t], "the master weights", t, steps);
        for (uint64_t i = 0; i < sizes[t]; i++)
            drift = fmax(drift, fabs((double)pulled[i] - (double)wt[t][i]));
        if (psagg_pull_weights(ctx, t, wt[t], 1, &h) || psagg_wait(h, -1))
            FAIL("psagg_pull_weights (sync): %s", psagg_last_error());
        psagg_release(h);
        if (exact)
            same(wt[t], ref[t].w, sizes[t], "the synced weights", t, steps);
    }
    if (exact) {
        printf("OPTIM-EXACT optimizer=%s codec=%s workers=%d steps=%u..%u tensors=%u\n",
               psagg__optim_name((psagg__optim_kind)cfg.optimizer), codec_text, world, start, steps,
               N_P);
    } else {
        psagg_stats st = {.struct_size = sizeof st};
        if (psagg_get_stats(ctx, &st))
            FAIL("psagg_get_stats: %s", psagg_last_error());
        printf("QUORUM worker %d left_out %llu\n", rank, (unsigned long long)st.left_out);
    }
    printf("DRIFT max |master - trained| = %.3g\n", drift);
    {
        uint64_t final = TEST_FNV_START;
        for (uint32_t t = 0; t < N_P; t++)
            final = test_fnv(final, wt[t], sizes[t] * sizeof(float));
        printf("DIGEST %016llx\n", (unsigned long long) final);
    }
    if (psagg_close(ctx))
        FAIL("psagg_close");
    for (uint32_t t = 0; t <= N_P; t++) {
        free(wt[t]), free(g[t]), free((void *)desc[t].name);
        if (t < N_P)
            free(ref[t].w), free(ref[t].view), free(ref[t].m1), free(ref[t].m2), free(ref[t].res);
    }
    free(x), free(acc), free(enc), free(pulled);
    psagg__layout_free(&l);
    return 0;
}
