/*
 * optim.c - the server-side optimizer steps (kernels/optim.h holds their arithmetic). Each
 * kind is one branch-free loop that the compiler vectorizes; target_clones builds it for
 * AVX-512, AVX2 and the baseline and picks one at load time. Every operation is an IEEE one
 * with correct rounding at any width, so all clones give the same bits.
 */
#include "kernels/optim.h"

#include <math.h>

#include "base/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__) &&                  \
    !defined(__clang__)
#define PSAGG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PSAGG_CLONES
#endif

const char *psagg__optim_name(psagg__optim_kind kind)
{
    switch (kind) {
    case PSAGG_OPTIM_NONE:
        return "none";
    case PSAGG_OPTIM_SGD:
        return "sgd";
    case PSAGG_OPTIM_ADAM:
        return "adam";
    case PSAGG_OPTIM_ADAMW:
        return "adamw";
    }
    return "?";
}

int psagg__optim_state_arrays(const psagg__optim *opt)
{
    switch (opt->kind) {
    case PSAGG_OPTIM_SGD:
        return opt->momentum != 0.0f;
    case PSAGG_OPTIM_ADAM:
    case PSAGG_OPTIM_ADAMW:
        return 2;
    default:
        return 0;
    }
}

/* The loops test their loop-invariant flags per element; the compiler unswitches or blends. */
PSAGG_CLONES
static void sgd(float lr, float wd, float s, float mom, float damp1, int first, int nesterov,
                const float *restrict grad, float *restrict w, float *restrict m, size_t n)
{
    const int l2 = wd != 0.0f, has_m = m != NULL;
    for (size_t k = 0; k < n; k++) {
        float g = grad[k] * s;
        if (l2)
            g = g + wd * w[k];
        if (has_m) {
            float b = first ? g : mom * m[k] + damp1 * g;
            m[k] = b;
            g = nesterov ? g + mom * b : b;
        }
        w[k] = w[k] - lr * g;
    }
}

PSAGG_CLONES
static void adam(int decoupled, float lr_wd1, float wd, float s, float b1, float b1c, float b2,
                 float b2c, float step_size, float bc2_sqrt, float eps, const float *restrict grad,
                 float *restrict w, float *restrict m1, float *restrict m2, size_t n)
{
    const int l2 = !decoupled && wd != 0.0f;
    for (size_t k = 0; k < n; k++) {
        float g = grad[k] * s;
        float wk = decoupled ? w[k] * lr_wd1 : w[k];
        float a, v;
        if (l2)
            g = g + wd * wk;
        a = b1 * m1[k] + b1c * g;
        v = b2 * m2[k] + (b2c * g) * g;
        m1[k] = a;
        m2[k] = v;
        w[k] = wk - step_size * (a / (sqrtf(v) / bc2_sqrt + eps));
    }
}

psagg_status psagg__optim_step(const psagg__optim *opt, float lr, float wd, uint64_t step,
                               float scale, const float *grad, float *w, float *m1, float *m2,
                               size_t n)
{
    if (!step)
        return psagg__fail(PSAGG_EINVAL, "optimizer step 0 (steps count from 1)");
    switch (opt->kind) {
    case PSAGG_OPTIM_SGD:
        sgd(lr, wd, scale, opt->momentum, 1.0f - opt->dampening, step == 1, opt->nesterov, grad, w,
            psagg__optim_state_arrays(opt) ? m1 : NULL, n);
        return PSAGG_OK;
    case PSAGG_OPTIM_ADAM:
    case PSAGG_OPTIM_ADAMW: {
        double t = (double)step;
        float step_size = (float)((double)lr / (1.0 - pow((double)opt->beta1, t)));
        float bc2_sqrt = (float)sqrt(1.0 - pow((double)opt->beta2, t));
        int decoupled = opt->kind == PSAGG_OPTIM_ADAMW;
        adam(decoupled, 1.0f - lr * wd, wd, scale, opt->beta1, 1.0f - opt->beta1, opt->beta2,
             1.0f - opt->beta2, step_size, bc2_sqrt, opt->eps, grad, w, m1, m2, n);
        return PSAGG_OK;
    }
    default:
        return psagg__fail(PSAGG_EINVAL, "optimizer step: kind %d has no step", (int)opt->kind);
    }
}
