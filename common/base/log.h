/*
 * base/log.h - one-line log records on stderr: "<time> <role> <LEVEL> message".
 *
 * Layer: base. There is no process-wide logger: each owner (a worker context, a server, a
 * libfabric endpoint) keeps a psagg__logger with its own role and level and passes it to
 * every record, so a library never changes how its host process logs, and two contexts in
 * one process each say who they are.
 */
#ifndef PSAGG_BASE_LOG_H
#define PSAGG_BASE_LOG_H

#include <stddef.h>
#include <stdint.h>

enum psagg__log_level { PSAGG_LOG_ERROR = 0, PSAGG_LOG_WARN, PSAGG_LOG_INFO, PSAGG_LOG_DEBUG };

typedef struct psagg__logger {
    char role[32]; /* shown in every line: "server 1", "worker 3" */
    int level;     /* records above this level are dropped */
} psagg__logger;

/*
 * Set a logger's role and level. PSAGG_LOG_LEVEL (error|warn|info|debug) in the
 * environment, when set, wins over `level`; a level < 0 means info.
 */
void psagg__logger_init(psagg__logger *lg, const char *role, int level);

void psagg__log(const psagg__logger *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Warnings about something that may come in floods (messages dropped from strangers): each
 * note counts; one record at most every `every_ms` says how many came since the last and
 * what the latest was, and psagg__lograte_flush reports the rest (call it when the owner
 * stops). One owner thread per psagg__lograte; zero-initialise it.
 */
typedef struct psagg__lograte {
    int64_t logged_at; /* ms, psagg__now_ms's clock */
    uint64_t count;    /* notes since the last record */
    uint64_t total;
    char latest[256];
} psagg__lograte;

void psagg__lograte_note(psagg__lograte *lr, const psagg__logger *lg, int every_ms, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
void psagg__lograte_flush(psagg__lograte *lr, const psagg__logger *lg);

/*
 * Append rank (or any int) to the comma list in buf (len bytes, `used` of them in use, NUL-ended)
 * for a message ("workers 0,3,5"); returns the bytes in use after it. A rank that does not
 * fit ends the list with "..." once; buf stays NUL-ended.
 */
size_t psagg__list_int(char *buf, size_t len, size_t used, int rank);

#define LOG_ERROR(lg, ...) psagg__log((lg), PSAGG_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(lg, ...)  psagg__log((lg), PSAGG_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(lg, ...)  psagg__log((lg), PSAGG_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(lg, ...)                                                                         \
    do {                                                                                           \
        if ((lg)->level >= PSAGG_LOG_DEBUG)                                                        \
            psagg__log((lg), PSAGG_LOG_DEBUG, __VA_ARGS__);                                        \
    } while (0)

#endif
