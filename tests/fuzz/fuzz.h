/*
 * fuzz.h - what psagg's fuzz targets share. Each fuzz_<name>.c defines
 * LLVMFuzzerTestOneInput; built with -fsanitize=fuzzer (PSAGG_FUZZ=ON, clang) it is a
 * libFuzzer binary, otherwise replay.c gives it a main() that runs it over files and
 * folders (the seed corpora under tests/fuzz/corpus/, as regression tests).
 *
 * A property that fails calls FUZZ_CHECK, which prints file:line and aborts: libFuzzer then
 * saves the input that did it.
 */
#ifndef PSAGG_TESTS_FUZZ_H
#define PSAGG_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Little-endian reads from the input (the wire formats are little-endian). */
static inline uint32_t fuzz_u16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

#endif
