/* base/log.c - see base/log.h. */
#include "base/log.h"

#include "base/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void psagg__logger_init(psagg__logger *lg, const char *role, int level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *env = getenv("PSAGG_LOG_LEVEL");

    snprintf(lg->role, sizeof lg->role, "%s", role && *role ? role : "psagg");
    lg->level = level >= PSAGG_LOG_ERROR && level <= PSAGG_LOG_DEBUG ? level : PSAGG_LOG_INFO;
    for (int i = 0; env && i < 4; i++)
        if (!strcasecmp(env, names[i]))
            lg->level = i;
}

void psagg__log(const psagg__logger *lg, int level, const char *fmt, ...)
{
    static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char msg[1024];
    struct timespec ts;
    va_list ap;

    if (level > lg->level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    /* one fprintf per record keeps lines whole when threads log at once */
    fprintf(stderr, "%ld.%03ld %s %s %s\n", (long)ts.tv_sec % 100000, ts.tv_nsec / 1000000,
            lg->role,
            names[level < 0   ? 0
                  : level > 3 ? 3
                              : level],
            msg);
}

static void lograte_report(psagg__lograte *lr, const psagg__logger *lg, int64_t now)
{
    if (lr->count == 1 && lr->total == 1)
        psagg__log(lg, PSAGG_LOG_WARN, "%s", lr->latest);
    else
        psagg__log(lg, PSAGG_LOG_WARN, "%s (%llu like it in the last %lld ms, %llu in all)",
                   lr->latest, (unsigned long long)lr->count, (long long)(now - lr->logged_at),
                   (unsigned long long)lr->total);
    lr->logged_at = now;
    lr->count = 0;
}

void psagg__lograte_note(psagg__lograte *lr, const psagg__logger *lg, int every_ms, const char *fmt,
                         ...)
{
    int64_t now = psagg__now_ms();
    va_list ap;
    lr->count++;
    lr->total++;
    va_start(ap, fmt);
    vsnprintf(lr->latest, sizeof lr->latest, fmt, ap);
    va_end(ap);
    if (now - lr->logged_at >= every_ms)
        lograte_report(lr, lg, now);
}

void psagg__lograte_flush(psagg__lograte *lr, const psagg__logger *lg)
{
    if (lr->count)
        lograte_report(lr, lg, psagg__now_ms());
}

size_t psagg__list_int(char *buf, size_t len, size_t used, int rank)
{
    char item[16];
    int n = snprintf(item, sizeof item, "%s%d", used ? "," : "", rank);

    if (used >= 3 && memcmp(buf + used - 3, "...", 3) == 0)
        return used;                  /* (the list ended) */
    if (used + (size_t)n + 3 < len) { /* (room for it and a later "...") */
        memcpy(buf + used, item, (size_t)n + 1);
        return used + (size_t)n;
    }
    if (used + 3 < len) {
        memcpy(buf + used, "...", 4);
        return used + 3;
    }
    return used;
}
