/*
 * adapt.c - adaptive codecs on the worker ([codec] adaptive): statistics, the statistics
 * push, the solve, and which codec each round of each tensor uses.
 *
 * runtime/adaptive.h has the schedule (statistics at rounds 0, K, 2K, ...; generation g + 1
 * from round gK + 2), the candidates and the error model; this file applies them. It runs on
 * the communication thread, except the solve, which has a thread of its own (it takes up to a
 * few hundred ms on large models, during which the communication thread goes on pushing), and
 * psagg_get_assignment. The solver writes an assignment under ctx->mu and then publishes its
 * generation (newest); the communication thread only reads assignments up to newest.
 *
 * The statistics are S(B) for each candidate bucket B of each adaptive tensor (of a thc
 * tensor the sum of squares), measured on what the codec quantizes (the gradient plus the
 * tensor's error-feedback residual), as fp32 (saturated at FLT_MAX). They travel as the
 * job's last tensor (PSAGG_ADAPT_STATS_NAME, fp32), so the servers sum them like any gradient
 * and every worker gets identical bytes back; every worker then runs the same deterministic
 * solver on them.
 *
 * Joins (elastic): a member sends its barrier's SYNC only once it is settled (adapt_settled:
 * its statistics pushes summed and solved), with the assignments it keeps (adapt_sync_write);
 * every member keeps the same then, server 0 compares them and hands them to the joiners in
 * SYNC_DONE, and a joiner takes them (adapt_join) with the schedule's place: the statistics
 * round the members are in. From then on it measures, pushes and solves as they do.
 */
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/adaptive.h"
#include "worker.h"

#define RING                                                                                       \
    PSAGG_ADAPT_RING /* assignments kept: the rounds in flight span at most 3 generations */

typedef struct assignment {
    uint32_t gen;    /* PSAGG_ADAPT_NO_GEN: empty */
    uint8_t *choice; /* per adaptive tensor: its candidate */
    uint64_t bytes;
    double error;
} assignment;

typedef struct psagg__adapt {
    uint32_t interval;
    uint32_t n_ad;      /* adaptive tensors */
    uint32_t stats_key; /* the statistics tensor's key */
    uint32_t *ad_of;    /* per key: its adaptive index, or UINT32_MAX */
    uint32_t *key_of;   /* per adaptive index: its key */
    /* candidates: MAX_CANDIDATES per adaptive tensor */
    uint32_t *n_cand;
    psagg_codec *cand;
    uint8_t *cand_bucket; /* its bucket's index among the tensor's statistics */
    uint64_t *cand_bytes; /* encoded bytes of the whole tensor */
    uint64_t budget, uniform_bytes;
    /* assignments (comm thread writes under ctx->mu; readers take ctx->mu or are the thread) */
    assignment ring[RING];
    atomic_uint newest; /* the newest generation solved (0: none yet); the solver publishes */
    /* statistics being gathered: of rounds stats_gen * interval */
    uint32_t stats_gen, n_measured;
    uint8_t *measured;
    float *stats_in, *stats_out;
    struct psagg_handle *stats_op; /* their push, in flight */
    float *scratch;                /* one chunk: gradient + residual */
    float *lo, *hi;                /* its finest buckets' ranges */
    psagg__adapt_option *opts;     /* the solver's table, n_ad x MAX_CANDIDATES ... */
    uint8_t *opt_cand;             /* ... and each option's candidate */
    uint32_t *solver_choice;
    /* the solver thread: the communication thread hands it the summed statistics */
    pthread_t solver;
    int solver_started, solve_pending, solver_stop; /* guarded by smu */
    pthread_mutex_t smu;
    pthread_cond_t scv;
} psagg__adapt;

/* Bytes for the log: "812 B", "14.2 kB", "96.1 MB". */
static const char *human(uint64_t b, char *buf, size_t len)
{
    if (b < 10000)
        snprintf(buf, len, "%llu B", (unsigned long long)b);
    else if (b < 10000000)
        snprintf(buf, len, "%.1f kB", (double)b / 1e3);
    else
        snprintf(buf, len, "%.1f MB", (double)b / 1e6);
    return buf;
}

static size_t stats_count(uint32_t n_ad)
{
    return (size_t)n_ad * PSAGG_ADAPT_MAX_BUCKETS;
}

static void solve(psagg_ctx *ctx);

/* The solver thread: one solve per statistics push, until adapt_free. */
static void *solver_main(void *arg)
{
    psagg_ctx *ctx = arg;
    psagg__adapt *a = ctx->adapt;
    for (;;) {
        pthread_mutex_lock(&a->smu);
        while (!a->solve_pending && !a->solver_stop)
            pthread_cond_wait(&a->scv, &a->smu);
        if (a->solver_stop) {
            pthread_mutex_unlock(&a->smu);
            return NULL;
        }
        a->solve_pending = 0;
        pthread_mutex_unlock(&a->smu);
        solve(ctx);
    }
}

psagg_status adapt_setup(psagg_ctx *ctx)
{
    const psagg__layout *l = &ctx->layout;
    psagg__adapt *a;
    uint64_t least = 0, elems = 0, max_chunk = 0;

    if (!l->adapt_interval)
        return PSAGG_OK;
    a = calloc(1, sizeof *a);
    if (!a)
        return psagg__fail(PSAGG_ENOMEM, "adaptive codecs");
    ctx->adapt = a;
    a->interval = l->adapt_interval;
    a->stats_key = l->n_tensors - 1;
    a->ad_of = malloc(l->n_tensors * sizeof *a->ad_of);
    a->key_of = malloc(l->n_tensors * sizeof *a->key_of);
    if (!a->ad_of || !a->key_of)
        return psagg__fail(PSAGG_ENOMEM, "adaptive codecs");
    for (uint32_t t = 0; t < l->n_tensors; t++) {
        a->ad_of[t] = UINT32_MAX;
        if (l->tensors[t].adaptive) {
            a->ad_of[t] = a->n_ad;
            a->key_of[a->n_ad++] = t;
        }
    }
    a->n_cand = calloc(a->n_ad, sizeof *a->n_cand);
    a->cand = calloc((size_t)a->n_ad * PSAGG_ADAPT_MAX_CANDIDATES, sizeof *a->cand);
    a->cand_bucket = calloc((size_t)a->n_ad * PSAGG_ADAPT_MAX_CANDIDATES, 1);
    a->cand_bytes = calloc((size_t)a->n_ad * PSAGG_ADAPT_MAX_CANDIDATES, sizeof *a->cand_bytes);
    a->measured = calloc(a->n_ad, 1);
    a->stats_in = calloc(stats_count(a->n_ad), sizeof(float));
    a->stats_out = calloc(stats_count(a->n_ad), sizeof(float));
    a->opts = calloc((size_t)a->n_ad * PSAGG_ADAPT_MAX_CANDIDATES, sizeof *a->opts);
    a->opt_cand = calloc((size_t)a->n_ad * PSAGG_ADAPT_MAX_CANDIDATES, 1);
    a->solver_choice = calloc(a->n_ad, sizeof *a->solver_choice);
    if (!a->n_cand || !a->cand || !a->cand_bucket || !a->cand_bytes || !a->measured ||
        !a->stats_in || !a->stats_out || !a->opts || !a->opt_cand || !a->solver_choice)
        return psagg__fail(PSAGG_ENOMEM, "adaptive codecs of %u tensors", a->n_ad);
    for (uint32_t r = 0; r < RING; r++) {
        a->ring[r].gen = PSAGG_ADAPT_NO_GEN;
        if (!(a->ring[r].choice = calloc(a->n_ad, 1)))
            return psagg__fail(PSAGG_ENOMEM, "adaptive codecs of %u tensors", a->n_ad);
    }
    for (uint32_t i = 0; i < a->n_ad; i++) {
        const psagg__tensor_info *ti = &l->tensors[a->key_of[i]];
        psagg_codec *cand = &a->cand[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES];
        uint64_t *bytes = &a->cand_bytes[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES], min = UINT64_MAX;
        /* nearest rounding only where error feedback corrects its bias */
        int nearest = ctx->tensors[a->key_of[i]].residual != NULL;
        a->n_cand[i] =
            psagg__adapt_candidates(&ti->codec, ti->chunk_elems, nearest, cand,
                                    &a->cand_bucket[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES]);
        for (uint32_t k = 0; k < a->n_cand[i]; k++) {
            bytes[k] = 0;
            for (uint32_t c = 0; c < ti->n_chunks; c++)
                bytes[k] += psagg__encoded_size(&cand[k], l->chunks[ti->first_chunk + c].count);
            if (bytes[k] < min)
                min = bytes[k];
        }
        for (uint32_t c = 0; c < ti->n_chunks; c++) {
            a->uniform_bytes += l->chunks[ti->first_chunk + c].enc_bytes;
            if (l->chunks[ti->first_chunk + c].count > max_chunk)
                max_chunk = l->chunks[ti->first_chunk + c].count;
        }
        least += min;
        elems += ti->count;
    }
    a->budget = ctx->cfg.adaptive_budget_bits
                    ? (uint64_t)((double)elems * ctx->cfg.adaptive_budget / 8e6)
                    : (uint64_t)((double)a->uniform_bytes * ctx->cfg.adaptive_budget / 1e6);
    if (a->budget < least)
        return psagg__fail(PSAGG_ECONFIG,
                           "[codec] adaptive_budget = %g%s allows %.6f MB per push of the %u "
                           "compressed tensors, less than their smallest choice (2 bits, largest "
                           "buckets) of %.6f MB",
                           ctx->cfg.adaptive_budget / 1e6,
                           ctx->cfg.adaptive_budget_bits ? "bits" : "", (double)a->budget / 1e6,
                           a->n_ad, (double)least / 1e6);
    a->scratch = malloc((max_chunk ? max_chunk : 1) * sizeof(float));
    a->lo = malloc((max_chunk / 64 + 1) * sizeof(float)); /* buckets of 64 and more */
    a->hi = malloc((max_chunk / 64 + 1) * sizeof(float));
    if (!a->scratch || !a->lo || !a->hi)
        return psagg__fail(PSAGG_ENOMEM, "adaptive codecs");
    pthread_mutex_init(&a->smu, NULL);
    pthread_cond_init(&a->scv, NULL);
    if (pthread_create(&a->solver, NULL, solver_main, ctx))
        return psagg__fail(PSAGG_EIO, "adaptive codecs: cannot start the solver thread");
    a->solver_started = 1;
    {
        char h1[24], h2[24];
        LOG_INFO(&ctx->log,
                 "adaptive codecs: %u tensors, a new choice every %u rounds within %s per push "
                 "(the declared codecs take %s); candidates: maxmin 2..8 bits, buckets /4..x4, "
                 "stochastic rounding (and nearest with error feedback); thc 2 and 4 bits",
                 a->n_ad, a->interval, human(a->budget, h1, sizeof h1),
                 human(a->uniform_bytes, h2, sizeof h2));
    }
    return PSAGG_OK;
}

void adapt_free(psagg_ctx *ctx)
{
    psagg__adapt *a = ctx->adapt;
    if (!a)
        return;
    if (a->solver_started) { /* a solve under way finishes first */
        pthread_mutex_lock(&a->smu);
        a->solver_stop = 1;
        pthread_cond_signal(&a->scv);
        pthread_mutex_unlock(&a->smu);
        pthread_join(a->solver, NULL);
        pthread_mutex_destroy(&a->smu);
        pthread_cond_destroy(&a->scv);
    }
    free(a->stats_op);
    for (uint32_t r = 0; r < RING; r++)
        free(a->ring[r].choice);
    free(a->ad_of), free(a->key_of), free(a->n_cand), free(a->cand), free(a->cand_bucket);
    free(a->cand_bytes), free(a->measured), free(a->stats_in);
    free(a->stats_out), free(a->scratch), free(a->lo), free(a->hi), free(a->opts),
        free(a->opt_cand), free(a->solver_choice);
    free(a);
    ctx->adapt = NULL;
}

/* The assignment of generation gen (> 0) if solved and still kept, else NULL. */
static const assignment *find(const psagg__adapt *a, uint32_t gen)
{
    const assignment *s = &a->ring[gen % RING];
    return s->gen == gen ? s : NULL;
}

int adapt_codec(psagg_ctx *ctx, struct psagg_handle *h, char *msg, size_t len)
{
    psagg__adapt *a = ctx->adapt;
    uint32_t i, gen;
    const assignment *s;

    h->codec = ctx->layout.tensors[h->key].codec;
    h->gen = 0;
    if (!a || (i = a->ad_of[h->key]) == UINT32_MAX ||
        !(gen = psagg__adapt_generation(h->round, a->interval)))
        return 1;
    if (gen > atomic_load(&a->newest))
        return 0;
    if (!(s = find(a, gen))) {
        snprintf(msg, len,
                 "tensor '%.63s' round %u: its codec assignment (generation %u) is no "
                 "longer kept (the newest is %u)",
                 ctx->layout.tensors[h->key].name, h->round, gen, atomic_load(&a->newest));
        return PSAGG_EINVAL;
    }
    h->codec = a->cand[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES + s->choice[i]];
    h->gen = gen;
    return 1;
}

int adapt_is_stats(const psagg_ctx *ctx, const struct psagg_handle *h)
{
    return ctx->adapt && ctx->adapt->stats_op == h;
}

/* Every tensor's statistics are in: queue their push (the comm thread takes it next). */
static void push_stats(psagg_ctx *ctx)
{
    psagg__adapt *a = ctx->adapt;
    psagg_status st;
    struct psagg_handle *h = handle_new(ctx, a->stats_key, a->stats_in, a->stats_out, PSAGG_SUM,
                                        INT_MAX, &psagg__host_ops, &st);
    if (!h) {
        worker_fail_all(ctx, st, "adaptive codecs: pushing the statistics of rounds %u: %s",
                        a->stats_gen * a->interval, psagg_last_error());
        return;
    }
    a->stats_op = h;
    handle_submit(ctx, h);
}

void adapt_measure(psagg_ctx *ctx, const struct psagg_handle *h)
{
    psagg__adapt *a = ctx->adapt;
    const psagg__tensor_info *ti;
    const float *res;
    uint32_t i, nb, sizes[PSAGG_ADAPT_MAX_BUCKETS];
    double s[PSAGG_ADAPT_MAX_BUCKETS] = {0};

    if (!a || (i = a->ad_of[h->key]) == UINT32_MAX || h->round % a->interval ||
        h->round / a->interval != a->stats_gen)
        return;
    ti = &ctx->layout.tensors[h->key];
    res = ctx->tensors[h->key].residual;
    nb = psagg__adapt_buckets(&ti->codec, ti->chunk_elems, sizes);
    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        const float *v = h->in + ci->offset;
        if (ti->codec.id == PSAGG_CODEC_THC) { /* the sum of squares of the gradient and of the
                                                  residual (rotated: the rotation keeps norms) */
            for (uint64_t k = 0; k < ci->count; k++)
                s[0] += (double)v[k] * v[k];
            for (size_t k = 0, n = chunk_residual_elems(ti, ci); k < n; k++)
                s[0] += (double)res[ci->offset + k] * res[ci->offset + k];
            continue;
        }
        if (res) { /* what the codec quantizes: the gradient plus the (decayed) residual */
            for (uint64_t k = 0; k < ci->count; k++)
                a->scratch[k] = v[k] + res[ci->offset + k];
            v = a->scratch;
        }
        psagg__adapt_range_sums(v, ci->count, sizes, nb, s, a->lo, a->hi);
    }
    for (uint32_t b = 0; b < PSAGG_ADAPT_MAX_BUCKETS; b++)
        a->stats_in[(size_t)i * PSAGG_ADAPT_MAX_BUCKETS + b] =
            b < nb ? (float)(s[b] < FLT_MAX ? s[b] : FLT_MAX) : 0.0f;
    if (!a->measured[i]) {
        a->measured[i] = 1;
        a->n_measured++;
    }
    if (a->n_measured < a->n_ad)
        return;
    push_stats(ctx);
    memset(a->measured, 0, a->n_ad);
    a->n_measured = 0;
    a->stats_gen++;
}

/*
 * The options of adaptive tensor i for the solver, from the summed statistics: its
 * candidates' bytes and errors, those another candidate beats on both (dominated) left out,
 * since the solver's time grows with the options. Returns how many, into o; map[k] is the
 * candidate of option k.
 */
static uint32_t options_of(const psagg__adapt *a, uint32_t i, psagg__adapt_option *o, uint8_t *map)
{
    size_t base = (size_t)i * PSAGG_ADAPT_MAX_CANDIDATES;
    psagg__adapt_option all[PSAGG_ADAPT_MAX_CANDIDATES];
    uint32_t n = 0;
    for (uint32_t k = 0; k < a->n_cand[i]; k++) {
        const psagg_codec *c = &a->cand[base + k];
        double s = a->stats_out[(size_t)i * PSAGG_ADAPT_MAX_BUCKETS + a->cand_bucket[base + k]];
        all[k] = (psagg__adapt_option){a->cand_bytes[base + k], psagg__adapt_error(c, s)};
    }
    for (uint32_t k = 0; k < a->n_cand[i]; k++) {
        int dominated = 0;
        for (uint32_t j = 0; j < a->n_cand[i] && !dominated; j++)
            dominated = j != k && all[j].bytes <= all[k].bytes && all[j].error <= all[k].error &&
                        (all[j].bytes < all[k].bytes || all[j].error < all[k].error || j < k);
        if (!dominated) {
            o[n] = all[k];
            map[n++] = (uint8_t)k;
        }
    }
    return n;
}

/* The estimated error of adaptive tensor i in its declared codec (for the log). */
static double declared_error(const psagg_ctx *ctx, const psagg__adapt *a, uint32_t i)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[a->key_of[i]];
    const psagg_codec *d = &ti->codec;
    uint32_t sizes[PSAGG_ADAPT_MAX_BUCKETS], nb = psagg__adapt_buckets(d, ti->chunk_elems, sizes);
    for (uint32_t b = 0; b < nb; b++)
        if (sizes[b] == d->bucket)
            return psagg__adapt_error(d, a->stats_out[(size_t)i * PSAGG_ADAPT_MAX_BUCKETS + b]);
    return 0.0;
}

static double busiest(const psagg_ctx *ctx, const assignment *s);

void adapt_stats_done(psagg_ctx *ctx, struct psagg_handle *h, psagg_status status, const char *msg)
{
    psagg__adapt *a = ctx->adapt;

    a->stats_op = NULL;
    free(h);
    if (status) {
        worker_fail_all(ctx, status, "adaptive codecs: the statistics of rounds %u: %s",
                        atomic_load(&a->newest) * a->interval, msg ? msg : "");
        return;
    }
    /* the solve takes up to a few hundred ms on large models: not on this thread, whose
       pushes would wait; operations that need its generation wait for it (adapt_codec) */
    pthread_mutex_lock(&a->smu);
    a->solve_pending = 1;
    pthread_cond_signal(&a->scv);
    pthread_mutex_unlock(&a->smu);
}

/* The next generation from the summed statistics in stats_out (the solver thread). */
static void solve(psagg_ctx *ctx)
{
    psagg__adapt *a = ctx->adapt;
    uint32_t gen = atomic_load(&a->newest) + 1, width = 0, changed = 0;
    const assignment *prev = gen > 1 ? find(a, gen - 1) : NULL;
    assignment *s = &a->ring[gen % RING];
    uint8_t *map = a->opt_cand;
    psagg_status st;
    uint64_t bytes;
    double err, uniform_error = 0.0;
    int64_t t0 = psagg__now_ns();
    char h1[24], h2[24], h3[24];

    /* compact every tensor's undominated options into a table of one width */
    for (uint32_t i = 0; i < a->n_ad; i++) {
        psagg__adapt_option o[PSAGG_ADAPT_MAX_CANDIDATES];
        uint32_t n = options_of(a, i, o, &map[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES]);
        memcpy(&a->opts[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES], o, n * sizeof *o);
        for (uint32_t k = n; k < PSAGG_ADAPT_MAX_CANDIDATES; k++)
            a->opts[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES + k] =
                (psagg__adapt_option){UINT64_MAX, 0.0};
        width = n > width ? n : width;
        uniform_error += declared_error(ctx, a, i);
    }
    for (uint32_t i = 0; i < a->n_ad && width < PSAGG_ADAPT_MAX_CANDIDATES; i++)
        memmove(&a->opts[(size_t)i * width], &a->opts[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES],
                width * sizeof *a->opts);
    st = psagg__adapt_solve(a->opts, a->n_ad, width, a->budget, a->solver_choice, &bytes, &err);
    if (st) {
        worker_fail_all(ctx, st, "adaptive codecs: solving generation %u: %s", gen,
                        psagg_last_error());
        return;
    }
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t i = 0; i < a->n_ad; i++) {
        uint8_t c = map[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES + a->solver_choice[i]];
        changed += !prev || prev->choice[i] != c;
        s->choice[i] = c;
    }
    s->gen = gen;
    s->bytes = bytes;
    s->error = err;
    atomic_store(&a->newest, gen); /* after the slot: readers find it complete */
    pthread_mutex_unlock(&ctx->mu);
    if (atomic_load(&ctx->comm_idle)) /* operations may wait for it */
        psagg__fabric_wake(ctx->fab);

    LOG_INFO(&ctx->log,
             "adaptive codecs: generation %u (from the statistics of round %u) holds from "
             "round %u: %s per push (budget %s, declared codecs %s), estimated error %.3g "
             "(declared codecs %.3g), %u tensors changed, busiest server %+.0f%% against "
             "the mean (declared codecs %+.0f%%); solved in %.1f ms",
             gen, (gen - 1) * a->interval, (gen - 1) * a->interval + PSAGG_ADAPT_LAG,
             human(s->bytes, h1, sizeof h1), human(a->budget, h2, sizeof h2),
             human(a->uniform_bytes, h3, sizeof h3), s->error, uniform_error, changed,
             busiest(ctx, s), busiest(ctx, NULL), (double)(psagg__now_ns() - t0) / 1e6);
    for (uint32_t i = 0; i < a->n_ad; i++) {
        size_t base = (size_t)i * PSAGG_ADAPT_MAX_CANDIDATES;
        const psagg_codec *was =
            prev ? &a->cand[base + prev->choice[i]] : &ctx->layout.tensors[a->key_of[i]].codec;
        char n1[40], n2[40];
        if (prev && prev->choice[i] == s->choice[i])
            continue;
        LOG_INFO(&ctx->log, "adaptive codecs: generation %u: tensor '%s' %s -> %s (%s)", gen,
                 ctx->layout.tensors[a->key_of[i]].name, psagg_codec_name(was, n1, sizeof n1),
                 psagg_codec_name(&a->cand[base + s->choice[i]], n2, sizeof n2),
                 human(a->cand_bytes[base + s->choice[i]], h1, sizeof h1));
    }
}

/*
 * How far the busiest server's bytes per push (every tensor, with assignment s, or the
 * declared codecs when NULL) lie above the mean, in percent: the placement balances the
 * declared codecs' bytes, which an assignment may shift between servers.
 */
static double busiest(const psagg_ctx *ctx, const assignment *s)
{
    const psagg__layout *l = &ctx->layout;
    const psagg__adapt *a = ctx->adapt;
    uint64_t per[PSAGG_MAX_SERVERS] = {0}, total = 0, most = 0;
    for (uint32_t c = 0; c < l->n_chunks; c++) {
        const psagg__chunk_info *ci = &l->chunks[c];
        uint32_t i = a->ad_of[ci->key];
        uint64_t b =
            s && i != UINT32_MAX
                ? psagg__encoded_size(
                      &a->cand[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES + s->choice[i]], ci->count)
                : ci->enc_bytes;
        per[ci->owner] += b;
        total += b;
    }
    for (uint32_t k = 0; k < l->n_servers; k++)
        most = per[k] > most ? per[k] : most;
    return total ? 100.0 * ((double)most * l->n_servers / (double)total - 1.0) : 0.0;
}

int adapt_waiting(psagg_ctx *ctx, const struct psagg_handle *h, char *msg, size_t len)
{
    psagg__adapt *a = ctx->adapt;
    uint32_t gen, missing = 0;
    size_t used;

    if (!a || h->encoded || a->ad_of[h->key] == UINT32_MAX ||
        (gen = psagg__adapt_generation(h->round, a->interval)) <= atomic_load(&a->newest))
        return 0;
    used = (size_t)snprintf(msg, len,
                            "push_pull of tensor '%.63s' round %u waits for codec assignment "
                            "generation %u, ",
                            ctx->layout.tensors[h->key].name, h->round, gen);
    if (a->stats_op || gen - 1 < a->stats_gen) {
        snprintf(msg + used, len - used,
                 "whose statistics the servers have not summed (or the solver not solved) "
                 "within 2 x op_timeout_ms=%d",
                 ctx->cfg.op_timeout_ms);
        return 1;
    }
    used += (size_t)snprintf(msg + used, len - used,
                             "whose statistics (round %u of every compressed tensor) miss ",
                             (gen - 1) * a->interval);
    for (uint32_t i = 0; i < a->n_ad && used + 70 < len; i++)
        if (!a->measured[i])
            used += (size_t)snprintf(msg + used, len - used, "%s'%.40s'", missing++ ? ", " : "",
                                     ctx->layout.tensors[a->key_of[i]].name);
    snprintf(msg + used, len - used,
             ": [codec] adaptive needs every compressed tensor pushed once per step");
    return 1;
}

int adapt_settled(const psagg_ctx *ctx)
{
    const psagg__adapt *a = ctx->adapt;
    /* every statistics push completes before its solve starts: solved all means pushed all */
    return !a || (!a->stats_op && atomic_load(&a->newest) == a->stats_gen);
}

size_t adapt_sync_size(const psagg_ctx *ctx, uint32_t *gens, uint32_t *tensors)
{
    *gens = ctx->adapt ? RING : 0;
    *tensors = ctx->adapt ? ctx->adapt->n_ad : 0;
    return (size_t)psagg__ctl_sync_tail(0, *gens, *tensors);
}

void adapt_sync_write(const psagg_ctx *ctx, uint8_t *out)
{
    const psagg__adapt *a = ctx->adapt;
    if (!a)
        return;
    for (uint32_t r = 0; r < RING; r++) {
        uint8_t *choice = out + RING * sizeof(uint32_t) + (size_t)r * a->n_ad;
        memcpy(out + r * sizeof(uint32_t), &a->ring[r].gen, sizeof(uint32_t));
        if (a->ring[r].gen == PSAGG_ADAPT_NO_GEN)
            memset(choice, 0, a->n_ad);
        else
            memcpy(choice, a->ring[r].choice, a->n_ad);
    }
}

/*
 * Whether the assignments in[] (adapt_sync_write's) are what settled members keep: the
 * generations newest - RING + 1 .. newest (those above 0) each in its slot, the others empty,
 * every choice one of its tensor's candidates. NULL when they are, else what is wrong.
 */
static const char *sync_check(const psagg__adapt *a, const uint8_t *in, uint32_t newest)
{
    for (uint32_t r = 0; r < RING; r++) {
        uint32_t gen, want = newest - (newest - r) % RING; /* the newest generation of slot r */
        memcpy(&gen, in + r * sizeof(uint32_t), sizeof gen);
        if (want > newest || want == 0)
            want = PSAGG_ADAPT_NO_GEN;
        if (gen != want)
            return "a slot holds another generation than the newest's ring";
        for (uint32_t i = 0; i < a->n_ad && gen != PSAGG_ADAPT_NO_GEN; i++)
            if (in[RING * sizeof(uint32_t) + (size_t)r * a->n_ad + i] >= a->n_cand[i])
                return "a choice is no candidate of its tensor";
    }
    return NULL;
}

psagg_status adapt_join(psagg_ctx *ctx, const uint8_t *in, uint32_t gens, uint32_t tensors)
{
    psagg__adapt *a = ctx->adapt;
    uint32_t newest = 0, stats_round;
    uint64_t first;
    const char *bad;

    if (!a)
        return gens || tensors ? psagg__fail(PSAGG_EPROTO,
                                             "server 0 admitted this worker with %u codec "
                                             "assignments, in a job without [codec] adaptive",
                                             gens)
                               : PSAGG_OK;
    if (gens != RING || tensors != a->n_ad)
        return psagg__fail(PSAGG_EPROTO,
                           "server 0 admitted this worker with %u codec assignments of %u tensors "
                           "(fields adapt_gens, adapt_tensors); it keeps %u of %u adaptive tensors",
                           gens, tensors, RING, a->n_ad);
    for (uint32_t r = 0; r < RING; r++) {
        uint32_t gen;
        memcpy(&gen, in + r * sizeof(uint32_t), sizeof gen);
        if (gen != PSAGG_ADAPT_NO_GEN && gen > newest)
            newest = gen;
    }
    /* the members sent SYNC with every statistics round they pushed solved (adapt_settled) */
    stats_round = ctx->tensors[a->stats_key].round;
    if (newest != stats_round || (bad = sync_check(a, in, newest)))
        return psagg__fail(PSAGG_EPROTO,
                           "server 0 admitted this worker with the members' codec assignments up "
                           "to generation %u, their statistics at round %u: %s",
                           newest, stats_round,
                           newest != stats_round ? "the newest must be the statistics rounds summed"
                                                 : bad);
    pthread_mutex_lock(&ctx->mu);
    for (uint32_t r = 0; r < RING; r++) {
        assignment *s = &a->ring[r];
        memcpy(&s->gen, in + r * sizeof(uint32_t), sizeof s->gen);
        memcpy(s->choice, in + RING * sizeof(uint32_t) + (size_t)r * a->n_ad, a->n_ad);
        s->bytes = 0;
        s->error = 0.0; /* (the solve's estimate: only its log line says it) */
        for (uint32_t i = 0; i < a->n_ad && s->gen != PSAGG_ADAPT_NO_GEN; i++)
            s->bytes += a->cand_bytes[(size_t)i * PSAGG_ADAPT_MAX_CANDIDATES + s->choice[i]];
    }
    atomic_store(&a->newest, newest);
    pthread_mutex_unlock(&ctx->mu);
    /*
     * The next statistics round is the members' next: round newest x interval. A tensor the
     * members pushed that round already (the barrier lies within it) counts as measured here,
     * with nothing: this worker pushed nothing of it, and its push of the statistics sums with
     * theirs when its other tensors reach that round.
     */
    a->stats_gen = newest;
    a->n_measured = 0;
    first = (uint64_t)newest * a->interval;
    for (uint32_t i = 0; i < a->n_ad; i++) {
        a->measured[i] = ctx->tensors[a->key_of[i]].round > first;
        a->n_measured += a->measured[i];
        memset(&a->stats_in[(size_t)i * PSAGG_ADAPT_MAX_BUCKETS], 0,
               PSAGG_ADAPT_MAX_BUCKETS * sizeof(float));
    }
    if (a->n_measured == a->n_ad) /* (the members would have pushed them: not settled) */
        return psagg__fail(PSAGG_EPROTO,
                           "server 0 admitted this worker past statistics round %llu of every "
                           "adaptive tensor, which the members have not summed",
                           (unsigned long long)first);
    LOG_INFO(&ctx->log,
             "adaptive codecs: joined with the members' codec assignments, generation %u "
             "the newest (from round %llu); the next statistics are of round %llu (%u of %u "
             "tensors past it)",
             newest,
             newest ? (unsigned long long)(newest - 1) * a->interval + PSAGG_ADAPT_LAG : 0ull,
             (unsigned long long)first, a->n_measured, a->n_ad);
    return PSAGG_OK;
}

psagg_status psagg_get_assignment(const psagg_ctx *ctx, uint32_t key, psagg_assignment *out)
{
    psagg_ctx *c = (psagg_ctx *)ctx; /* (its lock only) */
    const psagg__tensor_info *ti;
    const psagg__adapt *a;
    uint32_t i;

    psagg__clear_error();
    if (!ctx || !out)
        return psagg__fail(PSAGG_EINVAL, "psagg_get_assignment: NULL argument");
    if (worker_struct_size("psagg_assignment", out->struct_size, sizeof *out))
        return psagg__fail_context(PSAGG_EINVAL, "psagg_get_assignment: ");
    if (!ctx->declared || key >= ctx->n_user)
        return psagg__fail(PSAGG_EINVAL, "psagg_get_assignment: key %u, %u tensors declared", key,
                           ctx->declared ? ctx->n_user : 0);
    ti = &ctx->layout.tensors[key];
    a = ctx->adapt;
    *out = (psagg_assignment){.struct_size = sizeof *out, .codec = ti->codec};
    for (uint32_t c = 0; c < ti->n_chunks; c++)
        out->bytes += ctx->layout.chunks[ti->first_chunk + c].enc_bytes;
    if (!a || (i = a->ad_of[key]) == UINT32_MAX)
        return PSAGG_OK;
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&a->newest)) {
        uint32_t g = atomic_load(&a->newest);
        const assignment *s = find(a, g);
        size_t k = (size_t)i * PSAGG_ADAPT_MAX_CANDIDATES + s->choice[i];
        out->codec = a->cand[k];
        out->bytes = a->cand_bytes[k];
        out->generation = g;
        out->from_round = (g - 1) * a->interval + PSAGG_ADAPT_LAG;
    }
    pthread_mutex_unlock(&c->mu);
    return PSAGG_OK;
}
