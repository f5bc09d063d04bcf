/* error.c - psagg_strerror and the thread-local failure message. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

const char *psagg_strerror(int status)
{
    switch (status) {
    case PSAGG_OK:
        return "success";
    case PSAGG_EINVAL:
        return "invalid argument";
    case PSAGG_ENONFINITE:
        return "non-finite value (NaN or Inf)";
    case PSAGG_ERANGE:
        return "value out of the codec's range";
    case PSAGG_EBADLEN:
        return "buffer length does not match codec and count";
    case PSAGG_EBADMETA:
        return "invalid meta in encoded buffer";
    case PSAGG_ENOMEM:
        return "out of memory";
    case PSAGG_EAGAIN:
        return "not done yet";
    case PSAGG_ETIMEDOUT:
        return "timed out";
    case PSAGG_EUNSUPPORTED:
        return "not supported in this build or on this machine";
    case PSAGG_ECONFIG:
        return "configuration error";
    case PSAGG_EPROTO:
        return "protocol error from peer";
    case PSAGG_EPEER:
        return "peer closed or unreachable";
    case PSAGG_EMISMATCH:
        return "workers declared different tensors";
    case PSAGG_EFABRIC:
        return "libfabric error";
    case PSAGG_EIO:
        return "I/O error";
    case PSAGG_ECLOSED:
        return "context closed or job aborted";
    case PSAGG_ECUDA:
        return "CUDA error";
    default:
        return "unknown status";
    }
}

const char *psagg_last_error(void)
{
    return last_error;
}

void psagg_clear_error(void)
{
    last_error[0] = '\0';
}

int psagg_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

int psagg_fail_context(int status, const char *fmt, ...)
{
    char prefix[256], old[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    {
        size_t pl = strnlen(prefix, sizeof last_error - 1);
        size_t ol = strnlen(old, sizeof last_error - 1 - pl);
        memcpy(last_error, prefix, pl);
        memcpy(last_error + pl, old, ol);
        last_error[pl + ol] = '\0';
    }
    return status;
}
