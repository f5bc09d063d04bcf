/* fn_input.h - what every functional-test worker shares: the gradients it contributes, by
   (worker, key, round), and the harness's hold (--hold). */
#ifndef PSAGG_FN_INPUT_H
#define PSAGG_FN_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* Input value of element i of tensor key in round r on worker w: varied signs and scales. */
static inline float input_value(int w, uint32_t key, uint32_t r, uint64_t i)
{
    uint64_t z = ((uint64_t)w << 48) ^ ((uint64_t)key << 32) ^ ((uint64_t)r << 20) ^ i;
    z = (z ^ (z >> 31)) * 0x7FB5D329728EA185ull;
    z = (z ^ (z >> 27)) * 0x81DADEF4BC2DD44Dull;
    z ^= z >> 33;
    return ((float)(z >> 40) * 0x1p-24f - 0.5f) * (float)(1 + (key % 7)) * 0.01f;
}

/* --hold AT:FILE: before round (or step) AT, print "HOLD before WHAT AT" and wait until FILE
   exists (the harness makes something happen meanwhile); -1 after 120 s without it, said. */
static inline int fn_hold(const char *what, uint32_t at, const char *path)
{
    printf("HOLD before %s %u\n", what, at);
    fflush(stdout);
    for (int i = 0; access(path, F_OK) != 0; i++) {
        if (i > 12000) {
            fprintf(stderr, "FAIL: --hold %u: %s did not appear within 120 s\n", at, path);
            return -1;
        }
        usleep(10000);
    }
    return 0;
}

#endif
