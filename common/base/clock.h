/* base/clock.h - the one monotonic clock of psagg's deadlines. Layer: base. */
#ifndef PSAGG_BASE_CLOCK_H
#define PSAGG_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic milliseconds (CLOCK_MONOTONIC): every deadline in psagg is on this clock. */
static inline int64_t psagg__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Monotonic nanoseconds, the same clock: psagg__now_ns() / 1000000 == psagg__now_ms(). */
static inline int64_t psagg__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
