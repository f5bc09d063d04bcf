/* log.h - one-line log records on stderr: "<time> <role> <LEVEL> message". */
#ifndef PSAGG_COMMON_LOG_H
#define PSAGG_COMMON_LOG_H

enum psagg_log_level { PSAGG_LOG_ERROR = 0, PSAGG_LOG_WARN, PSAGG_LOG_INFO, PSAGG_LOG_DEBUG };

/* Role shown in every line ("server 1", "worker 3"); level from PSAGG_LOG_LEVEL if unset. */
void psagg_log_init(const char *role, int level);
void psagg_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int psagg_log_enabled(int level);

#define LOG_ERROR(...) psagg_log(PSAGG_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...)  psagg_log(PSAGG_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...)  psagg_log(PSAGG_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...)                                                                             \
    do {                                                                                           \
        if (psagg_log_enabled(PSAGG_LOG_DEBUG))                                                    \
            psagg_log(PSAGG_LOG_DEBUG, __VA_ARGS__);                                               \
    } while (0)

#endif
