/*
 * topk.h - the k entries of largest magnitude of a block, in linear time: the selection that
 * the planned sparse codec (docs/design.md, "Sparse outer gradients") is to be built on.
 *
 * Layer: kernels. The order is total and the same on every path: by |v| (compared as the
 * binary32 bit patterns of |v|, which for non-negative floats order as the values do; -0 and +0
 * are one magnitude), ties by the lower index. So which entries a block keeps depends on its
 * values alone, and every implementation (scalar here; SIMD and CUDA to come) must keep the
 * same ones.
 *
 * The threshold is found by a radix select over those bit patterns, most significant byte
 * first: a pass counts the candidates' next byte in 256 bins, keeps the bin where the k-th
 * largest lies, and the next pass looks only at that bin's entries (gathered into scratch), so
 * the work is at most 4 passes over n entries, never a sort.
 */
#ifndef PSAGG_KERNELS_TOPK_H
#define PSAGG_KERNELS_TOPK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Write to idx, in ascending order, the indices of the k entries of v[0..n) of largest
 * magnitude (ties: the lower index first), 1 <= k <= n. scratch: n uint32_t of working space.
 * Returns the k-th largest magnitude's bit pattern (|v| as uint32: the threshold; every kept
 * entry's is >= it, every other's <= it). NaN has no place in the order: the caller refuses
 * non-finite inputs first (the codec does, by name).
 */
uint32_t psagg__topk_select(const float *v, uint32_t n, uint32_t k, uint32_t *idx,
                            uint32_t *scratch);

#ifdef __cplusplus
}
#endif
#endif /* PSAGG_KERNELS_TOPK_H */
