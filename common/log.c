/* log.c - see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static char log_role[64] = "psagg";
static int log_level = -1;

static int level_from_env(void)
{
    const char *v = getenv("PSAGG_LOG_LEVEL");
    if (!v)
        return PSAGG_LOG_INFO;
    if (!strcasecmp(v, "error"))
        return PSAGG_LOG_ERROR;
    if (!strcasecmp(v, "warn"))
        return PSAGG_LOG_WARN;
    if (!strcasecmp(v, "debug"))
        return PSAGG_LOG_DEBUG;
    return PSAGG_LOG_INFO;
}

void psagg_log_init(const char *role, int level)
{
    if (role)
        snprintf(log_role, sizeof log_role, "%s", role);
    /* PSAGG_LOG_LEVEL, when set, wins over the configured level */
    log_level = level >= 0 && !getenv("PSAGG_LOG_LEVEL") ? level : level_from_env();
}

int psagg_log_enabled(int level)
{
    if (log_level < 0)
        log_level = level_from_env();
    return level <= log_level;
}

void psagg_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char msg[1024];
    struct timespec ts;
    va_list ap;

    if (!psagg_log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    /* one fprintf per record keeps lines whole when threads log at once */
    fprintf(stderr, "%ld.%03ld %s %s %s\n", (long)ts.tv_sec % 100000, ts.tv_nsec / 1000000,
            log_role,
            names[level < 0   ? 0
                  : level > 3 ? 3
                              : level],
            msg);
}
