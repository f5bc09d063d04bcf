/*
 * base/timeline.h - a Chrome trace of one process's work ([log] timeline, PSAGG_TIMELINE).
 * Layer: base.
 *
 * Each process writes PREFIX.<role><rank>.json ("/tmp/t.worker0.json", "/tmp/t.server1.json"):
 * a JSON array of trace events (the Trace Event Format that Perfetto and chrome://tracing
 * load; the format lets the closing bracket miss, so a cut trace still loads). Spans are "X"
 * events in microseconds of the wall clock (CLOCK_REALTIME, taken once at open and advanced
 * by CLOCK_MONOTONIC, so a clock step during the job does not tear the trace); processes on
 * one host share it, hosts as well as their NTP agrees, and deploy/psagg-timeline refines the
 * alignment from the messages' order (a push arrives after it was sent).
 *
 * A trace must not disturb what it shows: psagg__timeline_span only copies the span into
 * memory (a few tens of ns); the JSON is written at psagg__timeline_close, or when
 * PSAGG_TIMELINE_BUFFERED spans wait (about 190 MB; one pause to write them, then on). A
 * process killed before its close leaves what was written by then. Overlapping spans go to
 * different rows ("lanes", the trace's tids): the first lane free over the span's time.
 * Thread-safe.
 */
#ifndef PSAGG_BASE_TIMELINE_H
#define PSAGG_BASE_TIMELINE_H

#include <stdint.h>

#include "base/error.h"
#include "base/log.h"

#define PSAGG_SPAN_PHASES       5
#define PSAGG_SPAN_ARGS         8
#define PSAGG_TIMELINE_BUFFERED (1 << 20)

typedef struct psagg__timeline psagg__timeline;

/*
 * One span: from start_ns to ends[n_phases - 1] (psagg__now_ns() times), in phases that follow
 * each other (phase i ends at ends[i]; with more than one, args gets "phase_us", their
 * durations in microseconds: one event per span, not per phase, and deploy/psagg-timeline
 * expands them into nested spans). args: n_args integers named by keys, and one string
 * (str_key: str_val) when str_key is set. name must stay valid until psagg__timeline_close;
 * cat, keys, str_key and str_val must be static.
 */
typedef struct psagg__span {
    const char *name;
    const char *cat;
    int64_t start_ns;
    int64_t ends[PSAGG_SPAN_PHASES];
    int n_phases; /* 1..PSAGG_SPAN_PHASES */
    const char *const *keys;
    int n_args; /* 0..PSAGG_SPAN_ARGS */
    int64_t args[PSAGG_SPAN_ARGS];
    const char *str_key, *str_val;
} psagg__span;

/*
 * Open PREFIX.<role><rank>.json and write the process's name ("worker 3") into it. A NULL or
 * empty prefix is no timeline: *out = NULL and PSAGG_OK. The calls below accept NULL.
 */
PSAGG_NODISCARD psagg_status psagg__timeline_open(const char *prefix, const char *role, int rank,
                                                  psagg__timeline **out);

/* Record a span (a copy into memory; see above). */
void psagg__timeline_span(psagg__timeline *tl, const psagg__span *span);

/*
 * Write what is buffered, close the array and the file; with a logger, say (at info) what the
 * trace cost: the CPU of recording during the run (sampled) and of writing.
 */
void psagg__timeline_close(psagg__timeline *tl, const psagg__logger *log);

#endif
