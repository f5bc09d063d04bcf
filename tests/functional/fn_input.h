/* fn_input.h - the gradients every functional-test worker contributes, by (worker, key, round). */
#ifndef PSAGG_FN_INPUT_H
#define PSAGG_FN_INPUT_H

#include <stdint.h>

/* Input value of element i of tensor key in round r on worker w: varied signs and scales. */
static inline float input_value(int w, uint32_t key, uint32_t r, uint64_t i)
{
    uint64_t z = ((uint64_t)w << 48) ^ ((uint64_t)key << 32) ^ ((uint64_t)r << 20) ^ i;
    z = (z ^ (z >> 31)) * 0x7FB5D329728EA185ull;
    z = (z ^ (z >> 27)) * 0x81DADEF4BC2DD44Dull;
    z ^= z >> 33;
    return ((float)(z >> 40) * 0x1p-24f - 0.5f) * (float)(1 + (key % 7)) * 0.01f;
}

#endif
