/*
 * fuzz.h - what psagg's fuzz targets share. Each fuzz_<name>.c defines
 * LLVMFuzzerTestOneInput; built with -fsanitize=fuzzer (PSAGG_FUZZ=ON, clang) it is a
 * libFuzzer binary, otherwise replay.c gives it a main() that runs it over files and
 * folders (the seed corpora under tests/fuzz/corpus/, as regression tests).
 *
 * A property that fails calls CHECK (tests/testutil.h), which prints file:line and exits:
 * libFuzzer takes an exit during a run as a failure and saves the input that did it.
 */
#ifndef PSAGG_TESTS_FUZZ_H
#define PSAGG_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "../testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Little-endian reads from the input (the wire formats are little-endian). */
static inline uint32_t fuzz_u16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

#endif
