/* base/timeline.c - a Chrome trace of one process's work (timeline.h). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/timeline.h"

#define MAX_LANES 64
/* A trace file stops growing here (a long job's full trace is of no use; trace a short run) */
#define MAX_BYTES (1ll << 30)
/* Spans per block of the buffer: blocks are allocated as spans come */
#define BLOCK 65536
/*
 * One span call in SAMPLE reads its thread's CPU clock (a system call, dearer than recording a
 * span; what reading it costs, measured right before, is taken off)
 */
#define SAMPLE 16

typedef struct record {
    psagg__span span;
    int lane;
} record;

typedef struct block {
    struct block *next;
    uint32_t n;
    record r[BLOCK];
} block;

struct psagg__timeline {
    pthread_mutex_t mu;
    FILE *f;
    int pid;                       /* the trace's process id: this process's pid */
    int64_t real_minus_mono;       /* CLOCK_REALTIME - CLOCK_MONOTONIC at open, ns */
    int64_t lane_end[MAX_LANES];   /* the latest end of a span on each lane */
    uint8_t lane_named[MAX_LANES]; /* its thread_name metadata is written */
    block *head, *tail;            /* the buffered spans, oldest first */
    long long buffered;            /* spans in the blocks */
    long long spans, bytes;        /* written to the file so far */
    atomic_llong calls;            /* of psagg__timeline_span: every SAMPLE-th one is timed */
    int64_t record_ns;             /* CPU time in psagg__timeline_span: SAMPLE x the sampled */
    int64_t write_ns;              /* CPU time writing the JSON (flush) */
    int full;                      /* MAX_BYTES reached: nothing more is written */
    char label[48];                /* "worker 3", for the lanes' names */
    char path[512];
};

psagg_status psagg__timeline_open(const char *prefix, const char *role, int rank,
                                  psagg__timeline **out)
{
    psagg__timeline *tl;
    struct timespec rt, mt;
    char path[512];

    *out = NULL;
    if (!prefix || !*prefix)
        return PSAGG_OK;
    if ((size_t)snprintf(path, sizeof path, "%s.%s%d.json", prefix, role, rank) >= sizeof path)
        return psagg__fail(PSAGG_ECONFIG, "timeline: the path '%s.%s%d.json' is too long", prefix,
                           role, rank);
    tl = calloc(1, sizeof *tl);
    if (!tl)
        return psagg__fail(PSAGG_ENOMEM, "timeline");
    tl->f = fopen(path, "w");
    if (!tl->f) {
        int e = errno;
        free(tl);
        return psagg__fail(PSAGG_EIO, "timeline: cannot write %s: %s", path, strerror(e));
    }
    setvbuf(tl->f, NULL, _IOFBF, 1 << 20);
    pthread_mutex_init(&tl->mu, NULL);
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    tl->real_minus_mono = ((int64_t)rt.tv_sec - mt.tv_sec) * 1000000000 + (rt.tv_nsec - mt.tv_nsec);
    tl->pid = (int)getpid();
    snprintf(tl->label, sizeof tl->label, "%s %d", role, rank);
    snprintf(tl->path, sizeof tl->path, "%s", path);
    fprintf(tl->f,
            "[{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"%s\"}},\n"
            "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}",
            tl->pid, tl->label, tl->pid, (strcmp(role, "server") ? 1000 : 0) + rank);
    fflush(tl->f);
    *out = tl;
    return PSAGG_OK;
}

/* ---- writing: an event composed by hand (printf cost more than everything else) ---- */

typedef struct line {
    char buf[1024];
    size_t n;
} line;

/* appends that never overflow (the event is cut instead) */
static void put(line *l, const char *s)
{
    while (*s && l->n < sizeof l->buf - 1)
        l->buf[l->n++] = *s++;
}

/* s, JSON-escaped (tensor names are the users': keep them legal JSON) */
static void put_json(line *l, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    for (; *s && l->n < sizeof l->buf - 8; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            l->buf[l->n++] = '\\';
            l->buf[l->n++] = (char)ch;
        } else if (ch < 0x20) {
            put(l, "\\u00");
            l->buf[l->n++] = hex[ch >> 4];
            l->buf[l->n++] = hex[ch & 15];
        } else {
            l->buf[l->n++] = (char)ch;
        }
    }
}

/* v in decimal; with frac3, v / 1000 "." v % 1000 (nanoseconds as microseconds); v >= 0 */
static void put_num(line *l, int64_t v, int frac3)
{
    char d[24];
    int k = 0;
    if (v < 0) {
        put(l, "-");
        v = -v;
    }
    if (frac3) {
        for (int i = 0; i < 3; i++, v /= 10)
            d[k++] = (char)('0' + v % 10);
        d[k++] = '.';
    }
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k && l->n < sizeof l->buf - 1)
        l->buf[l->n++] = d[--k];
}

/* The start of an event of type ph on a lane: its process and its row (tid = lane + 1). */
static void put_head(line *l, const psagg__timeline *tl, const char *ph, int lane)
{
    put(l, ",\n{\"ph\":\"");
    put(l, ph);
    put(l, "\",\"pid\":");
    put_num(l, tl->pid, 0);
    put(l, ",\"tid\":");
    put_num(l, lane + 1, 0);
}

static void write_record(psagg__timeline *tl, const record *r)
{
    const psagg__span *s = &r->span;
    int64_t end = s->ends[s->n_phases - 1] < s->start_ns ? s->start_ns : s->ends[s->n_phases - 1];
    line l = {.n = 0};

    if (!tl->lane_named[r->lane]) {
        tl->lane_named[r->lane] = 1;
        put_head(&l, tl, "M", r->lane);
        put(&l, ",\"name\":\"thread_name\",\"args\":{\"name\":\"");
        put(&l, tl->label);
        put(&l, " lane ");
        put_num(&l, r->lane, 0);
        put(&l, "\"}}");
    }
    put_head(&l, tl, "X", r->lane);
    put(&l, ",\"name\":\"");
    put_json(&l, s->name);
    put(&l, "\",\"cat\":\"");
    put(&l, s->cat);
    put(&l, "\",\"ts\":");
    put_num(&l, s->start_ns + tl->real_minus_mono, 1);
    put(&l, ",\"dur\":");
    put_num(&l, end - s->start_ns, 1);
    put(&l, ",\"args\":{");
    for (int i = 0; i < s->n_args; i++) {
        put(&l, i ? ",\"" : "\"");
        put(&l, s->keys[i]);
        put(&l, "\":");
        put_num(&l, s->args[i], 0);
    }
    if (s->str_key) {
        put(&l, s->n_args ? ",\"" : "\"");
        put(&l, s->str_key);
        put(&l, "\":\"");
        put_json(&l, s->str_val);
        put(&l, "\"");
    }
    if (s->n_phases > 1) {
        int64_t at = s->start_ns;
        put(&l, s->n_args || s->str_key ? ",\"phase_us\":[" : "\"phase_us\":[");
        for (int i = 0; i < s->n_phases; i++) {
            int64_t e = s->ends[i] < at ? at : s->ends[i];
            put(&l, i ? "," : "");
            put_num(&l, e - at, 1);
            at = e;
        }
        put(&l, "]");
    }
    put(&l, "}}");
    fwrite(l.buf, 1, l.n, tl->f);
    tl->bytes += (long long)l.n;
    tl->spans++;
    if (tl->bytes >= MAX_BYTES) {
        tl->full = 1;
        fprintf(tl->f,
                ",\n{\"ph\":\"i\",\"s\":\"g\",\"pid\":%d,\"tid\":0,\"ts\":%lld,"
                "\"name\":\"psagg: the trace stops here (1 GiB)\"}",
                tl->pid, (long long)((end + tl->real_minus_mono) / 1000));
    }
}

static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Write the buffered spans and empty the buffer but for its first block (under tl->mu). */
static void flush_locked(psagg__timeline *tl)
{
    int64_t c0 = thread_cpu_ns();
    for (block *b = tl->head; b; b = b->next)
        for (uint32_t i = 0; i < b->n && !tl->full; i++)
            write_record(tl, &b->r[i]);
    fflush(tl->f);
    if (tl->head) {
        block *b = tl->head->next;
        while (b) {
            block *next = b->next;
            free(b);
            b = next;
        }
        tl->head->next = NULL;
        tl->head->n = 0;
        tl->tail = tl->head;
    }
    tl->buffered = 0;
    tl->write_ns += thread_cpu_ns() - c0;
}

void psagg__timeline_span(psagg__timeline *tl, const psagg__span *span)
{
    int64_t c0 = 0, c1 = 0, start, end;
    int lane = MAX_LANES - 1; /* all taken: the last one's spans overlap */
    int sample;
    if (!tl)
        return;
    sample = atomic_fetch_add_explicit(&tl->calls, 1, memory_order_relaxed) % SAMPLE == 0;
    if (sample) { /* c1 - c0: what reading the clock costs, taken off below */
        c0 = thread_cpu_ns();
        c1 = thread_cpu_ns();
    }
    start = span->start_ns;
    end = span->ends[span->n_phases - 1];
    pthread_mutex_lock(&tl->mu);
    if (tl->full)
        goto out;
    for (int i = 0; i < MAX_LANES; i++)
        if (tl->lane_end[i] <= start) {
            lane = i;
            break;
        }
    if (tl->lane_end[lane] < end)
        tl->lane_end[lane] = end;
    if (tl->buffered >= PSAGG_TIMELINE_BUFFERED)
        flush_locked(tl);
    if (!tl->tail || tl->tail->n == BLOCK) {
        block *b = malloc(sizeof *b);
        if (!b)
            goto out; /* the span is lost, nothing else */
        b->next = NULL;
        b->n = 0;
        if (tl->tail)
            tl->tail->next = b;
        else
            tl->head = b;
        tl->tail = b;
    }
    tl->tail->r[tl->tail->n++] = (record){.span = *span, .lane = lane};
    tl->buffered++;
out:
    if (sample) {
        int64_t took = thread_cpu_ns() - c1 - (c1 - c0);
        tl->record_ns += SAMPLE * (took > 0 ? took : 0);
    }
    pthread_mutex_unlock(&tl->mu);
}

void psagg__timeline_close(psagg__timeline *tl, const psagg__logger *log)
{
    if (!tl)
        return;
    pthread_mutex_lock(&tl->mu);
    flush_locked(tl);
    pthread_mutex_unlock(&tl->mu);
    if (log)
        LOG_INFO(log,
                 "timeline: %lld spans, %.1f MB written to %s; recording them took %.1f ms of CPU "
                 "during the run, writing them %.1f ms of CPU",
                 tl->spans, (double)tl->bytes / 1e6, tl->path, (double)tl->record_ns / 1e6,
                 (double)tl->write_ns / 1e6);
    fprintf(tl->f, "\n]\n");
    fclose(tl->f);
    free(tl->head);
    pthread_mutex_destroy(&tl->mu);
    free(tl);
}
