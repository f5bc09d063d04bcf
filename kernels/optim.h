/*
 * optim.h - the server-side optimizers ([server] optimizer): one step over a chunk of fp32
 * master weights, given the round's summed gradient. Layer: kernels.
 *
 * The arithmetic below is the specification: every step is one IEEE-754 binary32 operation
 * with round-to-nearest-even, in the order written (no fused multiply-add: the tree builds
 * with -ffp-contract=off; no reassociation), so any build of it, scalar or vectorized by the
 * compiler at any width, gives the same bits, and tests/ hold a separate scalar reference.
 * Per element k, with s = the gradient's scale (1/N for AVERAGE, else 1), lr and wd as the
 * workers sent them for the round, t = the step (1 for the first), all variables binary32:
 *
 *   g = grad_k * s
 *   SGD:   if wd != 0:        g = g + wd * w_k
 *          if momentum != 0:  m_k = (t == 1) ? g : momentum * m_k + (1 - dampening) * g
 *                             g = nesterov ? g + momentum * m_k : m_k
 *          w_k = w_k - lr * g
 *   ADAM:  if wd != 0:        g = g + wd * w_k                      (L2, as torch.optim.Adam)
 *   ADAMW: w_k = w_k * (1 - lr * wd)                                (decoupled, torch.optim.AdamW)
 *   both:  m_k = beta1 * m_k + (1 - beta1) * g
 *          v_k = beta2 * v_k + ((1 - beta2) * g) * g
 *          w_k = w_k - step_size * (m_k / (sqrt(v_k) / bc2_sqrt + eps))
 *   where the per-step constants are computed in binary64 and rounded once to binary32, as
 *   torch.optim computes them in Python floats: step_size = lr / (1 - beta1^t),
 *   bc2_sqrt = sqrt(1 - beta2^t). (1 - dampening), (1 - beta1), (1 - beta2) and
 *   (1 - lr * wd) are binary32 operations on the binary32 hyperparameters.
 * torch.optim's CPU kernels may fuse some of these (addcmul, add with alpha), so they agree
 * with this within binary32 rounding, not bit for bit.
 */
#ifndef PSAGG_KERNELS_OPTIM_H
#define PSAGG_KERNELS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "psagg/types.h"

typedef enum psagg__optim_kind {
    PSAGG_OPTIM_NONE = 0, /* sum-only: the server returns the summed gradient */
    PSAGG_OPTIM_SGD = 1,
    PSAGG_OPTIM_ADAM = 2,
    PSAGG_OPTIM_ADAMW = 3,
} psagg__optim_kind;

/* The job-wide hyperparameters ([server] keys); lr and weight decay come with each round. */
typedef struct psagg__optim {
    psagg__optim_kind kind;
    float momentum, dampening; /* SGD */
    int nesterov;              /* SGD */
    float beta1, beta2, eps;   /* Adam, AdamW */
} psagg__optim;

/* The name of a kind ("none", "sgd", "adam", "adamw"). */
const char *psagg__optim_name(psagg__optim_kind kind);

/* Optimizer state arrays per element besides the weights: 0 (plain SGD), 1 or 2. */
int psagg__optim_state_arrays(const psagg__optim *opt);

/*
 * One step over n elements: w (weights), m1 (SGD momentum buffer / Adam's first moment) and
 * m2 (Adam's second moment) are updated in place from grad (the round's sum) times scale.
 * step is t above (>= 1). m1 and m2 may be NULL where psagg__optim_state_arrays says they are
 * not used. Returns PSAGG_EINVAL for a kind of NONE or an unknown one, or step 0.
 */
psagg_status psagg__optim_step(const psagg__optim *opt, float lr, float wd, uint64_t step,
                               float scale, const float *grad, float *w, float *m1, float *m2,
                               size_t n);

#endif
