/*
 * base/error.h - the thread-local "what and who" message behind psagg_last_error().
 *
 * Layer: base. Functions return a psagg_status; the function that decides an error records
 * its message once, with psagg__fail, and returns the status in the same expression.
 */
#ifndef PSAGG_BASE_ERROR_H
#define PSAGG_BASE_ERROR_H

#include "psagg/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Record a failure for psagg_last_error() and return `status`, so that the function that
 * decides an error can write `return psagg__fail(PSAGG_EPROTO, "peer %s: bad length %u", ..)`.
 */
psagg_status psagg__fail(psagg_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context ("tensor fc1: " + old message). */
psagg_status psagg__fail_context(psagg_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void psagg__clear_error(void);

/* 1 if status is one of psagg_status's failure codes (e.g. a status read from a peer). */
int psagg__status_is_failure(int status);

/* On functions whose status must not be dropped (control paths): the compiler warns if it is. */
#define PSAGG_NODISCARD __attribute__((warn_unused_result))

#ifdef __cplusplus
}
#endif
#endif
