/*
 * runtime/adaptive.h - per-tensor codec choice under a byte budget (CGX's layer-wise
 * adaptive compression, as L-GreCo formalizes it). Layer: runtime.
 *
 * Given, for every tensor, its candidate codecs' encoded bytes and estimated quantization
 * error, choose one candidate per tensor so that the total error is smallest with the total
 * bytes within a budget: a multiple-choice knapsack, solved exactly by dynamic programming. Every
 * tensor's smallest option is taken as the base; the slack (budget minus the sum of those) is
 * cut into PSAGG_ADAPT_UNITS units and an option's bytes above its tensor's smallest are
 * rounded up to whole units: the choice never exceeds the budget, any budget that holds the
 * smallest choice has one, and it is optimal for the rounded sizes.
 *
 * Every worker must reach the same choice: the solver uses no floating-point reassociation
 * and breaks ties by the lowest candidate index, so equal inputs (summed through psagg itself,
 * identical bytes on every worker) give the same assignment in every process.
 *
 * The error model of maxmin (psagg__adapt_maxmin_error): a bucket of n elements and range r
 * quantized with b bits has unit u = r / (2^b - 1); stochastic rounding's error variance per
 * element is at most u^2/4, nearest rounding's about u^2/12. Summed over buckets:
 * S(B) / (k (2^b - 1)^2) with S(B) = sum over buckets of size B of n * r^2 and k = 4 or 12.
 */
#ifndef PSAGG_RUNTIME_ADAPTIVE_H
#define PSAGG_RUNTIME_ADAPTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "psagg/types.h"

#define PSAGG_ADAPT_UNITS 8192

/*
 * THE SCHEDULE of a job with [codec] adaptive (every worker and server derives the same):
 * every `interval` rounds (rounds 0, K, 2K, ...: a tensor's own round counter) each worker
 * measures each compressed tensor's range sums S(B) (psagg__adapt_range_sum) for each candidate
 * bucket B and, once it has them all, pushes them as the job's last tensor (fp32,
 * PSAGG_ADAPT_STATS_NAME, PSAGG_ADAPT_MAX_BUCKETS values per compressed tensor) through the
 * servers like any other: the sum comes back identical to every worker, and every worker
 * solves the same assignment from it. The assignment measured at round gK is generation
 * g + 1 and holds from round gK + PSAGG_ADAPT_LAG (psagg__adapt_generation); before the first,
 * generation 0 is the declared codec. interval >= PSAGG_ADAPT_LAG, so a tensor never needs an
 * assignment whose statistics wait for its own later rounds.
 *
 * THE CANDIDATES of a compressed tensor declared with maxmin, bucket B0
 * (psagg__adapt_candidates): maxmin with 2..8 bits, each bucket of B0/4, B0/2, B0, 2 B0, 4 B0
 * that is a multiple of 64 and divides the tensor's chunk (so chunks, their placement and
 * their owners never change), and stochastic rounding, plus nearest rounding when the
 * workers' error feedback is on (which corrects its bias; without it nearest's error piles
 * up). The servers requantize a round's sum in the round's codec, rounding included: with
 * stochastic updates where the pushes rounded to nearest, a tiny transformer trained worse
 * (docs/results.md, "Adaptive codecs"). Bytes are exact (meta included); errors as below.
 * Of a tensor declared with thc, block D: thc2 and thc4 at D (the block is the rotation, the
 * residual's basis, so it stays). Its statistic (bucket slot 0; the others 0) is the sum of
 * squares of the gradient plus that of its residual (rotated: the rotation keeps norms); the
 * workers take each push's scale from the peaks of the last update (thc.h's NEXT SCALE) with
 * the push's own bits, so a round may change the bits and every worker still agrees.
 */
#define PSAGG_ADAPT_LAG 2u
/*
 * The assignments a worker keeps, the newest and those before it (the rounds in flight span
 * at most 3 generations): generation g in slot g % PSAGG_ADAPT_RING, PSAGG_ADAPT_NO_GEN in a
 * slot not used yet. A SYNC carries them all (wire.h), and a joiner takes the members'.
 */
#define PSAGG_ADAPT_RING         4u
#define PSAGG_ADAPT_NO_GEN       UINT32_MAX
#define PSAGG_ADAPT_MAX_INTERVAL 1000000u
#define PSAGG_ADAPT_MAX_BUCKETS  5u
#define PSAGG_ADAPT_MIN_BITS     2u
#define PSAGG_ADAPT_MAX_BITS     8u
#define PSAGG_ADAPT_MAX_CANDIDATES                                                                 \
    (PSAGG_ADAPT_MAX_BUCKETS * (PSAGG_ADAPT_MAX_BITS - PSAGG_ADAPT_MIN_BITS + 1) * 2)
#define PSAGG_ADAPT_STATS_NAME "psagg.adaptive_stats"

/* Whether a tensor declared with codec c is adaptive when [codec] adaptive is on (maxmin, thc). */
static inline int psagg__adapt_declarable(const psagg_codec *c)
{
    return c->id == PSAGG_CODEC_MAXMIN || c->id == PSAGG_CODEC_THC;
}

/* The generation of the assignment that round `round` uses (0 when interval is 0). */
uint32_t psagg__adapt_generation(uint32_t round, uint32_t interval);

/*
 * The candidate buckets of a tensor declared with maxmin codec `declared` whose chunks hold
 * chunk_elems elements (psagg__tensor_info.chunk_elems), ascending; returns how many (1..5:
 * the declared bucket always is one).
 */
uint32_t psagg__adapt_buckets(const psagg_codec *declared, uint64_t chunk_elems,
                              uint32_t out[PSAGG_ADAPT_MAX_BUCKETS]);

/*
 * The candidate codecs (above), by bucket (ascending), then bits, then rounding (stochastic
 * first); nearest only with `nearest`. Returns how many. *bucket_of (if not NULL) gets, per
 * candidate, the index of its bucket in psagg__adapt_buckets.
 */
uint32_t psagg__adapt_candidates(const psagg_codec *declared, uint64_t chunk_elems, int nearest,
                                 psagg_codec out[PSAGG_ADAPT_MAX_CANDIDATES],
                                 uint8_t bucket_of[PSAGG_ADAPT_MAX_CANDIDATES]);

/*
 * The candidate with the largest encoding (8 bits at the finest bucket): what a buffer of an
 * adaptive tensor's chunk must hold.
 */
psagg_codec psagg__adapt_largest(const psagg_codec *declared, uint64_t chunk_elems);

/*
 * The largest update of a chunk of n elements of a tensor declared with `declared` that is
 * adaptive: of its candidates (and the declared codec) the largest psagg__update_cap. Not always
 * the largest candidate's: thc2's sum stream pads the rotated chunk to 256 coordinates where
 * thc4's pads it to 128, so at 16-bit sums thc2's update may be 256 bytes longer than thc4's.
 */
size_t psagg__adapt_update_cap(const psagg_codec *declared, uint64_t chunk_elems, size_t n);

/*
 * Whether c may be the codec of a round of a tensor declared with `declared`: the declared
 * codec itself (generation 0) or a candidate (nearest rounding allowed).
 */
int psagg__adapt_allowed(const psagg_codec *declared, uint64_t chunk_elems, const psagg_codec *c);

/* One candidate of one tensor: what it costs and what it loses. */
typedef struct psagg__adapt_option {
    uint64_t bytes; /* encoded bytes of the whole tensor (every chunk) */
    double error;   /* estimated squared error of the whole tensor */
} psagg__adapt_option;

/*
 * Choose, for each of n_tensors tensors, one of its n_options options (option i of tensor t
 * is opts[t * n_options + i]; an option with bytes == UINT64_MAX is not available) so that
 * the summed error is smallest with the summed bytes at most budget. choice[t] gets the index.
 * *bytes_out (if not NULL) the chosen total bytes, *error_out the chosen total error.
 * PSAGG_EINVAL (message with the smallest possible bytes) when the budget is below the
 * smallest choice; PSAGG_ENOMEM.
 */
PSAGG_NODISCARD psagg_status psagg__adapt_solve(const psagg__adapt_option *opts, size_t n_tensors,
                                                size_t n_options, uint64_t budget, uint32_t *choice,
                                                uint64_t *bytes_out, double *error_out);

/*
 * The unit psagg__adapt_solve rounds bytes up to, for a slack (budget minus the smallest total)
 * and a number of tensors: at least 1; fewer units than PSAGG_ADAPT_UNITS when the table would
 * pass 2^26 cells.
 */
uint64_t psagg__adapt_unit(uint64_t slack, size_t n_tensors);

/*
 * S(B) for bucket size B of x[0, n) restarted at every chunk of chunk_elems elements (as the
 * codec sees the data): the sum over buckets of (elements) * (max - min)^2, in double.
 * Non-finite values make it infinite.
 */
double psagg__adapt_range_sum(const float *x, uint64_t n, uint64_t chunk_elems, uint32_t bucket);

/*
 * S(B) of one chunk x[0, n) for each of nb bucket sizes at once (out[i] += S(buckets[i])),
 * each size a multiple of buckets[0]: one pass finds the finest buckets' ranges (lo, hi:
 * scratch of ceil(n / buckets[0]) floats each), the coarser ones merge them. The same sums
 * as psagg__adapt_range_sum with chunk_elems = n, bit for bit.
 */
void psagg__adapt_range_sums(const float *x, uint64_t n, const uint32_t *buckets, uint32_t nb,
                             double *out, float *lo, float *hi);

/* The estimated squared error of maxmin with `bits` and `rounding`, from S(B). */
double psagg__adapt_maxmin_error(double range_sum, uint32_t bits, psagg_rounding rounding);

/*
 * The estimated squared error of thc with `bits` (2 or 4) from the sum of squares of what it
 * quantizes: the rotation keeps a block's norm and makes its coordinates near-Gaussian, and a
 * unit Gaussian coordinate rounded stochastically in the uniform table at its best clip has
 * error 0.1769 (2 bits) or 0.0200 (4 bits) per coordinate (tests/bench/thc_table.py,
 * docs/results.md "The table").
 */
double psagg__adapt_thc_error(double sum_sq, uint32_t bits);

/* A candidate's estimated error from its statistic (S(B) of maxmin, the sum of squares of thc). */
double psagg__adapt_error(const psagg_codec *c, double stat);

#endif
