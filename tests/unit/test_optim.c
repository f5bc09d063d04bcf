/*
 * test_optim.c - the server-side optimizers' step (kernels/optim.h): the library's vectorized
 * loops give the bits of the specification's scalar arithmetic (tests/optim_reference.h) for
 * every kind, with and without weight decay, momentum and nesterov, at the first step and
 * later ones, over lengths that leave every vector width a tail; and the refusals.
 */
#include <math.h>
#include <string.h>

#include "kernels/optim.h"
#include "optim_reference.h"
#include "testutil.h"

static void compare(const psagg__optim *o, float lr, float wd, size_t n, uint64_t *seed)
{
    float *g = malloc(n * sizeof *g), *w[2], *m1[2], *m2[2];
    for (int v = 0; v < 2; v++) {
        w[v] = malloc(n * sizeof(float));
        m1[v] = malloc(n * sizeof(float));
        m2[v] = malloc(n * sizeof(float));
        CHECK(g && w[v] && m1[v] && m2[v], "memory");
    }
    for (size_t k = 0; k < n; k++) {
        w[0][k] = w[1][k] = test_randf(seed) * 3.0f;
        m1[0][k] = m1[1][k] = 0.0f;
        m2[0][k] = m2[1][k] = 0.0f;
    }
    for (uint64_t t = 1; t <= 5; t++) {
        float s = t == 3 ? 0.25f : 1.0f;
        for (size_t k = 0; k < n; k++)
            g[k] = test_randf(seed) * (k % 17 == 0 ? 1e-6f : 1.0f) + (k % 29 == 0 ? -0.0f : 0.0f);
        if (n > 3) /* zeros of both signs, exactly */
            g[1] = 0.0f, g[2] = -0.0f;
        CHECK(!psagg__optim_step(o, lr, wd, t, s, g, w[0], m1[0], m2[0], n), "step: %s",
              psagg_last_error());
        ref_optim_step(o, lr, wd, t, s, g, w[1], m1[1], m2[1], n);
        for (size_t k = 0; k < n; k++)
            CHECK(!memcmp(&w[0][k], &w[1][k], sizeof(float)) &&
                      (!psagg__optim_state_arrays(o) ||
                       !memcmp(&m1[0][k], &m1[1][k], sizeof(float))) &&
                      (psagg__optim_state_arrays(o) < 2 ||
                       !memcmp(&m2[0][k], &m2[1][k], sizeof(float))),
                  "%s momentum %g nesterov %d wd %g n %zu step %llu element %zu: w %.9g vs %.9g",
                  psagg__optim_name(o->kind), (double)o->momentum, o->nesterov, (double)wd, n,
                  (unsigned long long)t, k, (double)w[0][k], (double)w[1][k]);
    }
    for (int v = 0; v < 2; v++)
        free(w[v]), free(m1[v]), free(m2[v]);
    free(g);
}

int main(void)
{
    static const size_t lengths[] = {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 1000, 4099};
    const psagg__optim kinds[] = {
        {.kind = PSAGG_OPTIM_SGD},
        {.kind = PSAGG_OPTIM_SGD, .momentum = 0.9f},
        {.kind = PSAGG_OPTIM_SGD, .momentum = 0.9f, .dampening = 0.1f},
        {.kind = PSAGG_OPTIM_SGD, .momentum = 0.8f, .nesterov = 1},
        {.kind = PSAGG_OPTIM_ADAM, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
        {.kind = PSAGG_OPTIM_ADAM, .beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-3f},
        {.kind = PSAGG_OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
    };
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int cases = 0;
    float w = 1.0f, g = 1.0f;
    psagg__optim none = {.kind = PSAGG_OPTIM_NONE}, adam = kinds[4];

    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++)
            for (int d = 0; d < 2; d++, cases++)
                compare(&kinds[k], 0.01f, d ? 0.05f : 0.0f, lengths[l], &seed);
    CHECK(psagg__optim_step(&none, 0.1f, 0, 1, 1, &g, &w, NULL, NULL, 1) == PSAGG_EINVAL,
          "a step of optimizer none");
    CHECK(psagg__optim_step(&adam, 0.1f, 0, 0, 1, &g, &w, &g, &g, 1) == PSAGG_EINVAL, "step 0");
    CHECK(psagg__optim_state_arrays(&kinds[0]) == 0 && psagg__optim_state_arrays(&kinds[1]) == 1 &&
              psagg__optim_state_arrays(&kinds[4]) == 2,
          "state arrays");
    CHECK(!strcmp(psagg__optim_name(PSAGG_OPTIM_ADAMW), "adamw"), "names");
    printf("optimizer steps bit-identical to the scalar specification in %d cases\n", cases);
    return 0;
}
