/* runtime/adaptive.c - per-tensor codec choice under a byte budget (adaptive.h). */
#include <math.h>
#include <stdlib.h>

#include "runtime/adaptive.h"

#include "kernels/codec.h"

/* The table is n_tensors x (units + 1) choices: keep it under 2^26 entries (128 MiB). */
#define MAX_CELLS (1ull << 26)

static uint64_t units_for(size_t n_tensors)
{
    uint64_t u = PSAGG_ADAPT_UNITS;
    if (n_tensors && (u + 1) * n_tensors > MAX_CELLS)
        u = MAX_CELLS / n_tensors - 1;
    return u < 64 ? 64 : u;
}

uint64_t psagg__adapt_unit(uint64_t slack, size_t n_tensors)
{
    uint64_t u = units_for(n_tensors), unit = slack / u + (slack % u != 0);
    return unit ? unit : 1;
}

/* The least bytes of tensor t's options (UINT64_MAX: none available). */
static uint64_t least_of(const psagg__adapt_option *o, size_t n_options)
{
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < n_options; i++)
        if (o[i].bytes < m)
            m = o[i].bytes;
    return m;
}

psagg_status psagg__adapt_solve(const psagg__adapt_option *opts, size_t n_tensors, size_t n_options,
                                uint64_t budget, uint32_t *choice, uint64_t *bytes_out,
                                double *error_out)
{
    uint64_t unit, cap, least = 0;
    size_t w;
    double *dp, *next;
    uint16_t *ch;

    if (n_options == 0 || n_options > UINT16_MAX)
        return psagg__fail(PSAGG_EINVAL, "adaptive: %zu options per tensor (1..65535)", n_options);
    /* the smallest total there is: the budget must hold it; the DP shares out the rest */
    for (size_t t = 0; t < n_tensors; t++) {
        uint64_t m = least_of(&opts[t * n_options], n_options);
        if (m == UINT64_MAX)
            return psagg__fail(PSAGG_EINVAL, "adaptive: tensor %zu has no available option", t);
        least += m;
    }
    if (least > budget)
        return psagg__fail(PSAGG_EINVAL,
                           "adaptive: a budget of %llu bytes is below the smallest choice, %llu "
                           "bytes",
                           (unsigned long long)budget, (unsigned long long)least);
    unit = psagg__adapt_unit(budget - least, n_tensors);
    cap = (budget - least) / unit;
    w = (size_t)cap + 1;
    dp = malloc(w * sizeof *dp);
    next = malloc(w * sizeof *next);
    ch = malloc(w * (n_tensors ? n_tensors : 1) * sizeof *ch);
    if (!dp || !next || !ch) {
        free(dp), free(next), free(ch);
        return psagg__fail(PSAGG_ENOMEM, "adaptive: a %zu x %zu table", n_tensors, w);
    }
    /* dp[j]: the least error of the tensors so far within j units */
    for (size_t j = 0; j < w; j++)
        dp[j] = 0.0;
    for (size_t t = 0; t < n_tensors; t++) {
        const psagg__adapt_option *o = &opts[t * n_options];
        uint64_t m = least_of(o, n_options);
        uint16_t *row = &ch[t * w];
        for (size_t j = 0; j < w; j++) {
            double best = INFINITY;
            uint16_t at = 0;
            for (size_t i = 0; i < n_options; i++) {
                uint64_t c;
                double e;
                if (o[i].bytes == UINT64_MAX)
                    continue;
                c = (o[i].bytes - m) / unit + ((o[i].bytes - m) % unit != 0);
                if (c > j)
                    continue;
                e = dp[j - c] + o[i].error;
                if (e < best) { /* strict: the lowest index wins a tie */
                    best = e;
                    at = (uint16_t)i;
                }
            }
            next[j] = best;
            row[j] = at;
        }
        double *tmp = dp;
        dp = next;
        next = tmp;
    }
    {
        uint64_t j = cap, bytes = 0;
        double err = 0.0;
        for (size_t t = n_tensors; t-- > 0;) {
            const psagg__adapt_option *o = &opts[t * n_options + ch[t * w + j]];
            uint64_t m = least_of(&opts[t * n_options], n_options);
            choice[t] = ch[t * w + j];
            j -= (o->bytes - m) / unit + ((o->bytes - m) % unit != 0);
            bytes += o->bytes;
        }
        for (size_t t = 0; t < n_tensors; t++) /* in tensor order, as the solver added them */
            err += opts[t * n_options + choice[t]].error;
        if (bytes_out)
            *bytes_out = bytes;
        if (error_out)
            *error_out = err;
    }
    free(dp), free(next), free(ch);
    return PSAGG_OK;
}

double psagg__adapt_range_sum(const float *x, uint64_t n, uint64_t chunk_elems, uint32_t bucket)
{
    double s = 0.0;
    if (!chunk_elems)
        chunk_elems = n;
    for (uint64_t c0 = 0; c0 < n; c0 += chunk_elems) {
        uint64_t c1 = c0 + chunk_elems < n ? c0 + chunk_elems : n;
        for (uint64_t b0 = c0; b0 < c1; b0 += bucket) {
            uint64_t b1 = b0 + bucket < c1 ? b0 + bucket : c1;
            float lo = x[b0], hi = x[b0];
            for (uint64_t i = b0; i < b1; i++) {
                if (!isfinite(x[i]))
                    return INFINITY;
                lo = x[i] < lo ? x[i] : lo;
                hi = x[i] > hi ? x[i] : hi;
            }
            s += (double)(b1 - b0) * ((double)hi - (double)lo) * ((double)hi - (double)lo);
        }
    }
    return s;
}

void psagg__adapt_range_sums(const float *x, uint64_t n, const uint32_t *buckets, uint32_t nb,
                             double *out, float *lo, float *hi)
{
    uint64_t b0 = buckets[0], m = (n + b0 - 1) / b0;
    for (uint64_t k = 0; k < m; k++) {
        uint64_t i0 = k * b0, i1 = i0 + b0 < n ? i0 + b0 : n;
        float l = x[i0], h = x[i0];
        for (uint64_t i = i0; i < i1; i++) {
            if (!isfinite(x[i])) {
                for (uint32_t b = 0; b < nb; b++)
                    out[b] = INFINITY;
                return;
            }
            l = x[i] < l ? x[i] : l;
            h = x[i] > h ? x[i] : h;
        }
        lo[k] = l;
        hi[k] = h;
    }
    for (uint32_t b = 0; b < nb; b++) {
        uint64_t f = buckets[b] / b0;
        for (uint64_t k = 0; k < m; k += f) {
            uint64_t k1 = k + f < m ? k + f : m, elems = (k1 * b0 < n ? k1 * b0 : n) - k * b0;
            float l = lo[k], h = hi[k];
            for (uint64_t j = k; j < k1; j++) {
                l = lo[j] < l ? lo[j] : l;
                h = hi[j] > h ? hi[j] : h;
            }
            out[b] += (double)elems * ((double)h - (double)l) * ((double)h - (double)l);
        }
    }
}

double psagg__adapt_maxmin_error(double range_sum, uint32_t bits, psagg_rounding rounding)
{
    double levels = (double)((1u << bits) - 1);
    return range_sum / ((rounding == PSAGG_ROUND_NEAREST ? 12.0 : 4.0) * levels * levels);
}

double psagg__adapt_thc_error(double sum_sq, uint32_t bits)
{
    return sum_sq * (bits == 2 ? 0.1769 : 0.0200);
}

double psagg__adapt_error(const psagg_codec *c, double stat)
{
    return c->id == PSAGG_CODEC_THC ? psagg__adapt_thc_error(stat, c->bits)
                                    : psagg__adapt_maxmin_error(stat, c->bits, c->rounding);
}

uint32_t psagg__adapt_generation(uint32_t round, uint32_t interval)
{
    if (!interval || round < PSAGG_ADAPT_LAG)
        return 0;
    return (round - PSAGG_ADAPT_LAG) / interval + 1;
}

uint32_t psagg__adapt_buckets(const psagg_codec *declared, uint64_t chunk_elems,
                              uint32_t out[PSAGG_ADAPT_MAX_BUCKETS])
{
    uint32_t n = 0, b0 = declared->bucket ? declared->bucket : PSAGG_MAXMIN_DEFAULT_BUCKET;
    if (declared->id == PSAGG_CODEC_THC) { /* (its block is its rotation: the residual's basis) */
        out[0] = declared->bucket;
        return 1;
    }
    for (int s = -2; s <= 2; s++) {
        uint64_t b = s < 0 ? b0 >> -s : (uint64_t)b0 << s;
        if (s < 0 && (b << -s) != b0)
            continue; /* not a whole fraction of the declared bucket */
        if (b == b0 || (b >= 64 && b % 64 == 0 && b <= PSAGG_MAXMIN_MAX_BUCKET && chunk_elems &&
                        chunk_elems % b == 0))
            out[n++] = (uint32_t)b;
    }
    return n;
}

uint32_t psagg__adapt_candidates(const psagg_codec *declared, uint64_t chunk_elems, int nearest,
                                 psagg_codec out[PSAGG_ADAPT_MAX_CANDIDATES],
                                 uint8_t bucket_of[PSAGG_ADAPT_MAX_CANDIDATES])
{
    uint32_t buckets[PSAGG_ADAPT_MAX_BUCKETS],
        nb = psagg__adapt_buckets(declared, chunk_elems, buckets), n = 0;
    if (declared->id == PSAGG_CODEC_THC) {
        for (uint32_t bits = 2; bits <= 4; bits += 2) {
            out[n] =
                (psagg_codec){PSAGG_CODEC_THC, bits, declared->bucket, PSAGG_ROUND_STOCHASTIC, 0};
            if (bucket_of)
                bucket_of[n] = 0;
            n++;
        }
        return n;
    }
    for (uint32_t i = 0; i < nb; i++)
        for (uint32_t bits = PSAGG_ADAPT_MIN_BITS; bits <= PSAGG_ADAPT_MAX_BITS; bits++)
            for (int r = 0; r <= (nearest ? 1 : 0); r++) {
                out[n] = (psagg_codec){PSAGG_CODEC_MAXMIN, bits, buckets[i],
                                       r ? PSAGG_ROUND_NEAREST : PSAGG_ROUND_STOCHASTIC, 0};
                if (bucket_of)
                    bucket_of[n] = (uint8_t)i;
                n++;
            }
    return n;
}

psagg_codec psagg__adapt_largest(const psagg_codec *declared, uint64_t chunk_elems)
{
    uint32_t buckets[PSAGG_ADAPT_MAX_BUCKETS];
    if (declared->id == PSAGG_CODEC_THC)
        return (psagg_codec){PSAGG_CODEC_THC, 4, declared->bucket, PSAGG_ROUND_STOCHASTIC, 0};
    psagg__adapt_buckets(declared, chunk_elems, buckets);
    return (psagg_codec){PSAGG_CODEC_MAXMIN, PSAGG_ADAPT_MAX_BITS, buckets[0],
                         PSAGG_ROUND_STOCHASTIC, 0};
}

size_t psagg__adapt_update_cap(const psagg_codec *declared, uint64_t chunk_elems, size_t n)
{
    psagg_codec c[PSAGG_ADAPT_MAX_CANDIDATES];
    size_t cap = psagg__update_cap(declared, n);
    /* (maxmin's updates are as long as their pushes: its largest candidate's) */
    uint32_t k = declared->id == PSAGG_CODEC_THC
                     ? psagg__adapt_candidates(declared, chunk_elems, 0, c, NULL)
                     : 0;
    if (declared->id == PSAGG_CODEC_MAXMIN)
        c[k++] = psagg__adapt_largest(declared, chunk_elems);
    for (uint32_t i = 0; i < k; i++)
        if (psagg__update_cap(&c[i], n) > cap)
            cap = psagg__update_cap(&c[i], n);
    return cap;
}

int psagg__adapt_allowed(const psagg_codec *declared, uint64_t chunk_elems, const psagg_codec *c)
{
    uint32_t buckets[PSAGG_ADAPT_MAX_BUCKETS],
        nb = psagg__adapt_buckets(declared, chunk_elems, buckets);
    if (psagg__codec_equal(c, declared))
        return 1; /* generation 0 */
    if (declared->id == PSAGG_CODEC_THC)
        return c->id == PSAGG_CODEC_THC && (c->bits == 2 || c->bits == 4) &&
               c->bucket == declared->bucket && c->rounding == PSAGG_ROUND_STOCHASTIC;
    if (c->id != PSAGG_CODEC_MAXMIN || c->bits < PSAGG_ADAPT_MIN_BITS ||
        c->bits > PSAGG_ADAPT_MAX_BITS ||
        (c->rounding != PSAGG_ROUND_STOCHASTIC && c->rounding != PSAGG_ROUND_NEAREST))
        return 0;
    for (uint32_t i = 0; i < nb; i++)
        if (buckets[i] == c->bucket)
            return 1;
    return 0;
}
