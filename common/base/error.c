/* base/error.c - psagg_strerror and the thread-local failure message (base/error.h). */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

static const struct {
    psagg_status status;
    const char *text;
} statuses[] = {
    {PSAGG_OK, "success"},
    {PSAGG_EINVAL, "invalid argument"},
    {PSAGG_ENONFINITE, "non-finite value (NaN or Inf)"},
    {PSAGG_ERANGE, "value out of the codec's range"},
    {PSAGG_EBADLEN, "buffer length does not match codec and count"},
    {PSAGG_EBADMETA, "invalid meta in encoded buffer"},
    {PSAGG_ENOMEM, "out of memory"},
    {PSAGG_EAGAIN, "not done yet"},
    {PSAGG_ETIMEDOUT, "timed out"},
    {PSAGG_EUNSUPPORTED, "not supported in this build or on this machine"},
    {PSAGG_ECONFIG, "configuration error"},
    {PSAGG_EPROTO, "protocol error from peer"},
    {PSAGG_EPEER, "peer closed or unreachable"},
    {PSAGG_EMISMATCH, "workers declared different tensors"},
    {PSAGG_EFABRIC, "libfabric error"},
    {PSAGG_EIO, "I/O error"},
    {PSAGG_ECLOSED, "context closed or job aborted"},
    {PSAGG_ECUDA, "CUDA error"},
};

const char *psagg_strerror(int status)
{
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if ((int)statuses[i].status == status)
            return statuses[i].text;
    return "unknown status";
}

int psagg__status_is_failure(int status)
{
    for (size_t i = 1; i < sizeof statuses / sizeof statuses[0]; i++)
        if ((int)statuses[i].status == status)
            return 1;
    return 0;
}

const char *psagg_last_error(void)
{
    return last_error;
}

void psagg__clear_error(void)
{
    last_error[0] = '\0';
}

psagg_status psagg__fail(psagg_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

psagg_status psagg__fail_context(psagg_status status, const char *fmt, ...)
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
