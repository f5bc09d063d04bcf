/* error.h - status codes (psagg.h) plus the thread-local "what and who" message. */
#ifndef PSAGG_COMMON_ERROR_H
#define PSAGG_COMMON_ERROR_H

#include "psagg.h"

/*
 * Record a failure for psagg_last_error() and return `status`, so that the function that
 * decides an error can write `return psagg_fail(PSAGG_EPROTO, "peer %s: bad length %u", ..)`.
 */
int psagg_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context ("tensor fc1: " + old message). */
int psagg_fail_context(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void psagg_clear_error(void);

#endif
