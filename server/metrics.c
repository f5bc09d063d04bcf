/*
 * metrics.c - the server's live counters, its straggler report, and its Prometheus text
 * endpoint ([server] metrics_port; libmicrohttpd serves GET /metrics from a thread of its own).
 *
 * The counters are relaxed atomics written where things happen: pushes, drops and bytes in by
 * the progress thread, each push's lateness, each finished round and the aggregation threads'
 * busy time by the aggregation threads; the codec mix once, when the job starts. Lateness: how
 * long after the first push of its chunk's round a push arrived (the first is 0); the worker
 * that is always late is the straggler. A round's time is split in two: collect (first push
 * to last push) and finish (last push to the update's hand-over: the last fold and the
 * encode). Durations go into histograms of two resolutions: a fine log-scale one (ratio
 * 2^(1/4), from 1 us) for quantiles, and a coarse one with Prometheus's buckets.
 * At the job's end, the process's resource usage (CPU, page faults) per round after the first.
 */
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <microhttpd.h>

#include "base/error.h"
#include "base/log.h"
#include "server.h"

#define FINE_BUCKETS 112 /* 2^(k/4) us, k = 0..111: up to 2^28 us, about 268 s */
static const double coarse_le[] = {0.0001, 0.001, 0.01, 0.1, 1, 10}; /* seconds; then +Inf */
#define COARSE_BUCKETS (sizeof coarse_le / sizeof coarse_le[0] + 1)

/* A histogram of durations (any thread adds; relaxed atomics). */
typedef struct histo {
    atomic_uint_fast64_t count, ns_sum, ns_max;
    atomic_uint_fast64_t fine[FINE_BUCKETS], coarse[COARSE_BUCKETS];
} histo;

typedef struct worker_metrics {
    atomic_uint_fast64_t pushes, push_bytes;
    atomic_uint_fast64_t left_out, late_pushes; /* [server] quorum: rounds closed without its push;
                                            its pushes that came after their round closed */
    histo late;
} worker_metrics;

#define MAX_CODECS 16 /* entries of the codec mix; the last one may be "other" */

typedef struct codec_mix {
    char name[48];
    uint64_t chunks, elements;
} codec_mix;

struct server_metrics {
    atomic_uint_fast64_t dropped, chunk_rounds, updates, update_bytes;
    histo collect, finish;         /* a round: first -> last push -> update handed over */
    atomic_uint_fast64_t *busy_ns; /* per aggregation thread: time spent on items */
    int n_busy;
    codec_mix mix[MAX_CODECS]; /* of the chunks owned here; filled at the job's start */
    atomic_int n_mix;          /* entries of mix published (release) */
    worker_metrics *w;
    /* the server-side optimizer (param.c) */
    atomic_uint_fast64_t optim_steps, optim_ns, weight_syncs, checkpoints, checkpoint_failures;
    atomic_uint_fast64_t checkpoint_ns; /* the last one's */
    atomic_int members;                 /* the membership applied here (membership.c) */
    atomic_uint epoch;
    struct MHD_Daemon *mhd;
};

psagg_status metrics_init(server *srv)
{
    srv->metrics = calloc(1, sizeof *srv->metrics);
    if (srv->metrics)
        srv->metrics->w = calloc((size_t)srv->n_workers, sizeof *srv->metrics->w);
    if (!srv->metrics || !srv->metrics->w)
        return psagg__fail(PSAGG_ENOMEM, "metrics: out of memory");
    atomic_init(&srv->metrics->members, srv->start_workers);
    return PSAGG_OK;
}

void metrics_job_started(server *srv)
{
    struct server_metrics *m = srv->metrics;
    int n = 0;
    m->busy_ns = calloc((size_t)srv->pool.n_threads, sizeof *m->busy_ns);
    m->n_busy = m->busy_ns ? srv->pool.n_threads : 0;
    for (uint32_t i = 0; i < srv->n_owned; i++) {
        const chunk_state *c = &srv->chunks[i];
        char name[48];
        int k = 0;
        psagg_codec_name(&c->codec, name, sizeof name);
        if (n == MAX_CODECS - 1)
            snprintf(name, sizeof name, "other"); /* the last entry takes every other codec */
        while (k < n && strcmp(m->mix[k].name, name))
            k++;
        if (k == n)
            snprintf(m->mix[n++].name, sizeof m->mix[k].name, "%s", name);
        m->mix[k].chunks++;
        m->mix[k].elements += c->info->count;
    }
    atomic_store_explicit(&m->n_mix, n, memory_order_release);
}

void metrics_busy(server *srv, uint32_t thread, int64_t ns)
{
    struct server_metrics *m = srv->metrics;
    if ((int)thread < m->n_busy && ns > 0)
        atomic_fetch_add_explicit(&m->busy_ns[thread], (uint64_t)ns, memory_order_relaxed);
}

void metrics_push(server *srv, int w, size_t bytes)
{
    atomic_fetch_add_explicit(&srv->metrics->w[w].pushes, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&srv->metrics->w[w].push_bytes, bytes, memory_order_relaxed);
}

void metrics_left_out(server *srv, int w)
{
    atomic_fetch_add_explicit(&srv->metrics->w[w].left_out, 1, memory_order_relaxed);
}

void metrics_late(server *srv, int w)
{
    atomic_fetch_add_explicit(&srv->metrics->w[w].late_pushes, 1, memory_order_relaxed);
}

void metrics_drop(server *srv)
{
    atomic_fetch_add_explicit(&srv->metrics->dropped, 1, memory_order_relaxed);
}

static void histo_add(histo *m, int64_t ns)
{
    uint64_t v = ns > 0 ? (uint64_t)ns : 0, max;
    int k = v >= 1000 ? (int)floor(4 * log2((double)v / 1000.0)) : 0;
    size_t c = 0;

    k = k < 0 ? 0 : (k >= FINE_BUCKETS ? FINE_BUCKETS - 1 : k);
    while (c < COARSE_BUCKETS - 1 && (double)v > coarse_le[c] * 1e9)
        c++;
    atomic_fetch_add_explicit(&m->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->ns_sum, v, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->fine[k], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->coarse[c], 1, memory_order_relaxed);
    max = atomic_load_explicit(&m->ns_max, memory_order_relaxed);
    while (v > max && !atomic_compare_exchange_weak_explicit(
                          &m->ns_max, &max, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

void metrics_lateness(server *srv, int w, int64_t ns)
{
    histo_add(&srv->metrics->w[w].late, ns);
}

void metrics_round(server *srv, size_t update_bytes, int64_t collect_ns, int64_t finish_ns)
{
    struct server_metrics *m = srv->metrics;
    histo_add(&m->collect, collect_ns);
    histo_add(&m->finish, finish_ns);
    atomic_fetch_add_explicit(&m->chunk_rounds, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->updates, (uint64_t)srv->n_workers, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->update_bytes, (uint64_t)srv->n_workers * update_bytes,
                              memory_order_relaxed);
}

/* Quantile q (0..1) in seconds, from the fine histogram (upper bound of the bucket that holds
 * it, at most the largest seen); 0 when empty. */
static double histo_quantile(const histo *m, double q)
{
    uint64_t n = atomic_load(&m->count), seen = 0, rank;
    double max_s = (double)atomic_load(&m->ns_max) / 1e9;
    if (n == 0)
        return 0;
    rank = (uint64_t)ceil(q * (double)n);
    for (int k = 0; k < FINE_BUCKETS; k++) {
        seen += atomic_load(&m->fine[k]);
        if (seen >= rank && seen > 0) {
            double upper = 1e-6 * exp2((k + 1) / 4.0);
            return upper < max_s ? upper : max_s;
        }
    }
    return max_s;
}

void metrics_optim_step(server *srv, int64_t ns, int sync)
{
    atomic_fetch_add_explicit(&srv->metrics->optim_steps, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&srv->metrics->optim_ns, (uint64_t)ns, memory_order_relaxed);
    if (sync)
        atomic_fetch_add_explicit(&srv->metrics->weight_syncs, 1, memory_order_relaxed);
}

void metrics_checkpoint(server *srv, int64_t ns, int ok)
{
    atomic_fetch_add(ok ? &srv->metrics->checkpoints : &srv->metrics->checkpoint_failures, 1);
    if (ok)
        atomic_store(&srv->metrics->checkpoint_ns, (uint64_t)ns);
}

void metrics_membership(server *srv, uint32_t epoch, int n)
{
    atomic_store(&srv->metrics->members, n);
    atomic_store(&srv->metrics->epoch, epoch);
}

void metrics_report(server *srv)
{
    int slowest = -1;
    double slowest_mean = 0;
    if (!srv->metrics)
        return;
    if ((psagg__optim_kind)srv->cfg.optimizer != PSAGG_OPTIM_NONE)
        LOG_INFO(&srv->log,
                 "optimizer %s: %llu chunk steps in %.3f s (%.3f ms each), %llu weight syncs, %llu "
                 "checkpoints written (the last in %.3f s), %llu refused",
                 psagg__optim_name((psagg__optim_kind)srv->cfg.optimizer),
                 (unsigned long long)atomic_load(&srv->metrics->optim_steps),
                 (double)atomic_load(&srv->metrics->optim_ns) / 1e9,
                 atomic_load(&srv->metrics->optim_steps)
                     ? (double)atomic_load(&srv->metrics->optim_ns) / 1e6 /
                           (double)atomic_load(&srv->metrics->optim_steps)
                     : 0.0,
                 (unsigned long long)atomic_load(&srv->metrics->weight_syncs),
                 (unsigned long long)atomic_load(&srv->metrics->checkpoints),
                 (double)atomic_load(&srv->metrics->checkpoint_ns) / 1e9,
                 (unsigned long long)atomic_load(&srv->metrics->checkpoint_failures));
    for (int w = 0; w < srv->n_workers; w++) {
        const histo *m = &srv->metrics->w[w].late;
        uint64_t n = atomic_load(&m->count);
        double mean = n ? (double)atomic_load(&m->ns_sum) / (double)n / 1e6 : 0;
        if (n == 0)
            continue;
        LOG_INFO(&srv->log,
                 "straggler report: worker %d: %llu pushes, lateness mean %.3f ms, p99 %.3f ms, "
                 "max %.3f ms (after the first push of the same chunk and round)",
                 w, (unsigned long long)n, mean, histo_quantile(m, 0.99) * 1e3,
                 (double)atomic_load(&m->ns_max) / 1e6);
        if (srv->cfg.quorum)
            LOG_INFO(&srv->log,
                     "straggler report: worker %d: left out of %llu chunk rounds ([server] "
                     "quorum = %d, grace_ms = %d); %llu of its pushes came after their round "
                     "closed (carried by it into its next push)",
                     w, (unsigned long long)atomic_load(&srv->metrics->w[w].left_out),
                     srv->cfg.quorum, srv->cfg.grace_ms,
                     (unsigned long long)atomic_load(&srv->metrics->w[w].late_pushes));
        if (slowest < 0 || mean > slowest_mean) {
            slowest = w;
            slowest_mean = mean;
        }
    }
    if (slowest >= 0 && srv->n_workers > 1)
        LOG_INFO(&srv->log,
                 "straggler report: the latest worker on average was worker %d (%.3f ms)", slowest,
                 slowest_mean);
}

/* --- the Prometheus text endpoint ---------------------------------------------------- */

static void help(FILE *f, const char *name, const char *type, const char *text)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

/* The samples of histogram `name` with labels (e.g. worker="1", or "" for none). */
static void write_histo(FILE *f, const char *name, const char *labels, const histo *h)
{
    uint64_t cum = 0;
    const char *sep = *labels ? "," : "";
    for (size_t c = 0; c < COARSE_BUCKETS; c++) {
        cum += atomic_load(&h->coarse[c]);
        if (c < COARSE_BUCKETS - 1)
            fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, coarse_le[c],
                    (unsigned long long)cum);
        else
            fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                    (unsigned long long)cum);
    }
    fprintf(f, *labels ? "%s_sum{%s} %.9f\n" : "%s_sum%s %.9f\n", name, labels,
            (double)atomic_load(&h->ns_sum) / 1e9);
    fprintf(f, *labels ? "%s_count{%s} %llu\n" : "%s_count%s %llu\n", name, labels,
            (unsigned long long)atomic_load(&h->count));
}

/* The exposition (text format 0.0.4), malloc'd; *len its length. NULL when out of memory. */
static char *render(server *srv, size_t *len)
{
    struct server_metrics *m = srv->metrics;
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    struct rusage ru;
    int n_mix;

    if (!f)
        return NULL;
    getrusage(RUSAGE_SELF, &ru);
    help(f, "psagg_server_info", "gauge", "This server: job, rank and libfabric provider.");
    fprintf(f, "psagg_server_info{job=\"%s\",rank=\"%d\",provider=\"%s\"} 1\n", srv->cfg.job_id,
            srv->rank, psagg__fabric_provider(srv->fab));
    help(f, "psagg_server_workers", "gauge", "Workers of the job.");
    fprintf(f, "psagg_server_workers %d\n", srv->n_workers);
    help(f, "psagg_server_members", "gauge",
         "Workers in the job's current membership epoch (all of them unless elastic).");
    fprintf(f, "psagg_server_members %d\n", atomic_load(&srv->metrics->members));
    help(f, "psagg_server_membership_epoch", "gauge",
         "The membership epoch this server applied (0: the workers that started the job).");
    fprintf(f, "psagg_server_membership_epoch %u\n", atomic_load(&srv->metrics->epoch));
    help(f, "psagg_server_chunks_owned", "gauge", "Chunks this server aggregates.");
    fprintf(f, "psagg_server_chunks_owned %u\n", srv->n_owned);
    help(f, "psagg_server_rounds", "gauge", "Rounds finished by this server's first chunk.");
    fprintf(f, "psagg_server_rounds %u\n", atomic_load(&srv->pool.rounds_done));
    help(f, "psagg_server_chunk_rounds_total", "counter", "Chunk rounds aggregated and sent.");
    fprintf(f, "psagg_server_chunk_rounds_total %llu\n",
            (unsigned long long)atomic_load(&m->chunk_rounds));
    help(f, "psagg_server_updates_total", "counter", "Update messages queued to workers.");
    fprintf(f, "psagg_server_updates_total %llu\n", (unsigned long long)atomic_load(&m->updates));
    help(f, "psagg_server_update_bytes_total", "counter",
         "Bytes of update messages queued to workers (header, payload, MAC).");
    fprintf(f, "psagg_server_update_bytes_total %llu\n",
            (unsigned long long)atomic_load(&m->update_bytes));
    help(f, "psagg_server_dropped_messages_total", "counter",
         "Messages dropped before they counted: unknown sender, bad MAC.");
    fprintf(f, "psagg_server_dropped_messages_total %llu\n",
            (unsigned long long)atomic_load(&m->dropped));
    help(f, "psagg_server_local_copies_total", "counter",
         "Pushes copied out of a worker on this host (same-host copies), not received.");
    fprintf(f, "psagg_server_local_copies_total %llu\n",
            (unsigned long long)(srv->fab ? psagg__fabric_local_copied(srv->fab) : 0));
    help(f, "psagg_server_rx_held", "gauge",
         "Receive buffers held by pushes that wait for their turn.");
    fprintf(f, "psagg_server_rx_held %d\n", atomic_load(&srv->pool.rx_held));
    help(f, "psagg_server_pushes_spilled_total", "counter",
         "Pushes that came rounds early while half the receive buffers were held: copied out.");
    fprintf(f, "psagg_server_pushes_spilled_total %llu\n",
            (unsigned long long)atomic_load(&srv->pool.n_spilled));
    help(f, "psagg_server_send_queue", "gauge", "Updates waiting for the progress thread.");
    fprintf(f, "psagg_server_send_queue %d\n", atomic_load(&srv->dp.sendq_len));
    help(f, "psagg_server_cpu_seconds_total", "counter", "CPU time of the server process.");
    fprintf(f, "psagg_server_cpu_seconds_total %.6f\n",
            (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
    help(f, "psagg_server_pushes_total", "counter", "Pushes accepted, by worker.");
    for (int w = 0; w < srv->n_workers; w++)
        fprintf(f, "psagg_server_pushes_total{worker=\"%d\"} %llu\n", w,
                (unsigned long long)atomic_load(&m->w[w].pushes));
    help(f, "psagg_server_push_bytes_total", "counter",
         "Bytes of pushes accepted, by worker (header, payload, MAC).");
    for (int w = 0; w < srv->n_workers; w++)
        fprintf(f, "psagg_server_push_bytes_total{worker=\"%d\"} %llu\n", w,
                (unsigned long long)atomic_load(&m->w[w].push_bytes));
    help(f, "psagg_server_left_out_total", "counter",
         "Chunk rounds closed without this worker's push ([server] quorum), by worker.");
    for (int w = 0; w < srv->n_workers; w++)
        fprintf(f, "psagg_server_left_out_total{worker=\"%d\"} %llu\n", w,
                (unsigned long long)atomic_load(&m->w[w].left_out));
    help(f, "psagg_server_late_pushes_total", "counter",
         "Pushes that came after their round closed ([server] quorum; dropped, carried by the "
         "worker), by worker.");
    for (int w = 0; w < srv->n_workers; w++)
        fprintf(f, "psagg_server_late_pushes_total{worker=\"%d\"} %llu\n", w,
                (unsigned long long)atomic_load(&m->w[w].late_pushes));
    help(f, "psagg_server_push_lateness_seconds", "histogram",
         "How long after the first push of its chunk and round a worker's push arrived.");
    for (int w = 0; w < srv->n_workers; w++) {
        char labels[32];
        snprintf(labels, sizeof labels, "worker=\"%d\"", w);
        write_histo(f, "psagg_server_push_lateness_seconds", labels, &m->w[w].late);
    }
    help(f, "psagg_server_push_lateness_p99_seconds", "gauge",
         "99th percentile of each worker's lateness so far (log-scale estimate, within 19%).");
    for (int w = 0; w < srv->n_workers; w++)
        fprintf(f, "psagg_server_push_lateness_p99_seconds{worker=\"%d\"} %.9f\n", w,
                histo_quantile(&m->w[w].late, 0.99));
    help(f, "psagg_server_round_collect_seconds", "histogram",
         "A chunk round's time from its first push to its last.");
    write_histo(f, "psagg_server_round_collect_seconds", "", &m->collect);
    help(f, "psagg_server_round_finish_seconds", "histogram",
         "A chunk round's time from its last push to its update's hand-over (fold, encode).");
    write_histo(f, "psagg_server_round_finish_seconds", "", &m->finish);
    help(f, "psagg_server_aggregation_busy_seconds_total", "counter",
         "Time each aggregation thread spent on pushes and rounds (not waiting).");
    for (int t = 0; t < m->n_busy; t++)
        fprintf(f, "psagg_server_aggregation_busy_seconds_total{thread=\"%d\"} %.6f\n", t,
                (double)atomic_load(&m->busy_ns[t]) / 1e9);
    help(f, "psagg_server_optimizer_info", "gauge",
         "The server-side optimizer ([server] optimizer).");
    fprintf(f, "psagg_server_optimizer_info{optimizer=\"%s\"} 1\n",
            psagg__optim_name((psagg__optim_kind)srv->cfg.optimizer));
    help(f, "psagg_server_optimizer_steps_total", "counter",
         "Optimizer steps taken, one per parameter chunk and round.");
    fprintf(f, "psagg_server_optimizer_steps_total %llu\n",
            (unsigned long long)atomic_load(&m->optim_steps));
    help(f, "psagg_server_optimizer_seconds_total", "counter",
         "Time in optimizer steps and their weight deltas (step, delta, encode, the workers' "
         "view).");
    fprintf(f, "psagg_server_optimizer_seconds_total %.6f\n",
            (double)atomic_load(&m->optim_ns) / 1e9);
    help(f, "psagg_server_weight_syncs_total", "counter",
         "Updates that sent the exact weights ([server] sync_interval).");
    fprintf(f, "psagg_server_weight_syncs_total %llu\n",
            (unsigned long long)atomic_load(&m->weight_syncs));
    help(f, "psagg_server_checkpoints_total", "counter", "Checkpoints written, or refused.");
    fprintf(f, "psagg_server_checkpoints_total{result=\"written\"} %llu\n",
            (unsigned long long)atomic_load(&m->checkpoints));
    fprintf(f, "psagg_server_checkpoints_total{result=\"failed\"} %llu\n",
            (unsigned long long)atomic_load(&m->checkpoint_failures));
    help(f, "psagg_server_checkpoint_last_seconds", "gauge", "How long the last checkpoint took.");
    fprintf(f, "psagg_server_checkpoint_last_seconds %.6f\n",
            (double)atomic_load(&m->checkpoint_ns) / 1e9);
    n_mix = atomic_load_explicit(&m->n_mix, memory_order_acquire);
    help(f, "psagg_server_codec_chunks", "gauge", "Chunks owned here, by codec.");
    for (int k = 0; k < n_mix; k++)
        fprintf(f, "psagg_server_codec_chunks{codec=\"%s\"} %llu\n", m->mix[k].name,
                (unsigned long long)m->mix[k].chunks);
    help(f, "psagg_server_codec_elements", "gauge", "Elements of the chunks owned here, by codec.");
    for (int k = 0; k < n_mix; k++)
        fprintf(f, "psagg_server_codec_elements{codec=\"%s\"} %llu\n", m->mix[k].name,
                (unsigned long long)m->mix[k].elements);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state)
{
    server *srv = cls;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    unsigned code = MHD_HTTP_OK;
    char *body = NULL;
    size_t len = 0;
    static const char not_found[] = "psagg-server: only GET /metrics here\n";

    (void)version, (void)upload, (void)upload_size, (void)state;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
    else if (strcmp(url, "/metrics") != 0)
        code = MHD_HTTP_NOT_FOUND;
    else if (!(body = render(srv, &len)))
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
    if (body)
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    else
        resp = MHD_create_response_from_buffer(sizeof not_found - 1, (void *)not_found,
                                               MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            body ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
    ret = MHD_queue_response(conn, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

psagg_status metrics_start(server *srv)
{
    const psagg__hostport *h = &srv->cfg.servers[srv->rank];
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    char port[16];
    int port_n = srv->cfg.server_metrics_port + srv->rank, rc;

    if (srv->cfg.server_metrics_port == 0)
        return PSAGG_OK;
    if (port_n > 65535)
        return psagg__fail(PSAGG_ECONFIG,
                           "[server] metrics_port %d + rank %d is past 65535 (server rank r serves "
                           "on metrics_port + r)",
                           srv->cfg.server_metrics_port, srv->rank);
    snprintf(port, sizeof port, "%d", port_n);
    if ((rc = getaddrinfo(h->host, port, &hints, &ai)) != 0)
        return psagg__fail(PSAGG_ECONFIG, "metrics endpoint: address %s:%s: %s", h->host, port,
                           gai_strerror(rc));
    srv->metrics->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0),
        (uint16_t)port_n, NULL, NULL, answer, srv, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)16, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!srv->metrics->mhd)
        return psagg__fail(PSAGG_EIO,
                           "metrics endpoint: cannot serve on %s:%d (port in use?) ([server] "
                           "metrics_port)",
                           h->host, port_n);
    LOG_INFO(&srv->log, "metrics: http://%s:%d/metrics", h->host, port_n);
    return PSAGG_OK;
}

void metrics_stop(server *srv)
{
    if (!srv->metrics)
        return;
    if (srv->metrics->mhd)
        MHD_stop_daemon(srv->metrics->mhd);
    free(srv->metrics->w);
    free(srv->metrics->busy_ns);
    free(srv->metrics);
    srv->metrics = NULL;
}

static double tv_ms(struct timeval a, struct timeval b)
{
    return (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_usec - a.tv_usec) / 1e3;
}

/* CPU and minor page faults per round after the first (the benchmarks read this line). */
void metrics_usage(server *srv)
{
    struct rusage now;
    unsigned rounds = atomic_load(&srv->pool.rounds_done);
    unsigned long long spilled = atomic_load(&srv->pool.n_spilled);
    double n;
    if (spilled)
        LOG_INFO(&srv->log,
                 "%llu pushes came rounds early while half the receive buffers were held: "
                 "copied out to wait",
                 spilled);
    if (!atomic_load(&srv->pool.usage_marked) || rounds < 2 || getrusage(RUSAGE_SELF, &now))
        return;
    n = (double)(rounds - 1);
    LOG_INFO(&srv->log,
             "usage after the first round: rounds=%u cpu_ms_per_round=%.1f user_ms=%.1f "
             "sys_ms=%.1f minflt_per_round=%.1f",
             rounds - 1,
             (tv_ms(srv->pool.usage_first.ru_utime, now.ru_utime) +
              tv_ms(srv->pool.usage_first.ru_stime, now.ru_stime)) /
                 n,
             tv_ms(srv->pool.usage_first.ru_utime, now.ru_utime) / n,
             tv_ms(srv->pool.usage_first.ru_stime, now.ru_stime) / n,
             (double)(now.ru_minflt - srv->pool.usage_first.ru_minflt) / n);
}
