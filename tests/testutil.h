/* testutil.h - assertion and data helpers shared by psagg's C tests. */
#ifndef PSAGG_TESTUTIL_H
#define PSAGG_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TEST_SKIP 77

/* Fail the test with file:line, the condition and a printf-style explanation. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Fail the test with a printf-style explanation (where no condition says it better). */
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL: " __VA_ARGS__);                                                     \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

/* FNV-1a of n bytes, going on from h (TEST_FNV_START for the first): digests of outputs. */
#define TEST_FNV_START 0xCBF29CE484222325ull
static inline uint64_t test_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* Deterministic test data: xorshift64* seeded by the caller. */
static inline uint64_t test_rand64(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [-1, 1). */
static inline float test_randf(uint64_t *s)
{
    return (float)(test_rand64(s) >> 40) * 0x1p-23f - 1.0f;
}

#endif
