/*
 * optim_reference.h - kernels/optim.h's arithmetic written out element by element, as the
 * specification reads, for the tests to hold the library's vectorized loops against (the unit
 * test) and to replay the servers' steps (functional: fn_optim).
 */
#ifndef PSAGG_TESTS_OPTIM_REFERENCE_H
#define PSAGG_TESTS_OPTIM_REFERENCE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/optim.h"

static inline void ref_optim_step(const psagg__optim *o, float lr, float wd, uint64_t t, float s,
                                  const float *grad, float *w, float *m1, float *m2, size_t n)
{
    float ss = (float)((double)lr / (1.0 - pow((double)o->beta1, (double)t)));
    float bc2 = (float)sqrt(1.0 - pow((double)o->beta2, (double)t));
    for (size_t k = 0; k < n; k++) {
        float g = grad[k] * s;
        if (o->kind == PSAGG_OPTIM_SGD) {
            if (wd != 0.0f)
                g = g + wd * w[k];
            if (o->momentum != 0.0f) {
                m1[k] = t == 1 ? g : o->momentum * m1[k] + (1.0f - o->dampening) * g;
                g = o->nesterov ? g + o->momentum * m1[k] : m1[k];
            }
            w[k] = w[k] - lr * g;
        } else {
            if (o->kind == PSAGG_OPTIM_ADAMW)
                w[k] = w[k] * (1.0f - lr * wd);
            else if (wd != 0.0f)
                g = g + wd * w[k];
            m1[k] = o->beta1 * m1[k] + (1.0f - o->beta1) * g;
            m2[k] = o->beta2 * m2[k] + ((1.0f - o->beta2) * g) * g;
            w[k] = w[k] - ss * (m1[k] / (sqrtf(m2[k]) / bc2 + o->eps));
        }
    }
}

#endif
