/*
 * fn_device.c - the device path's lifetime and error rules, tested on the simulated device
 * (devsim.h) against a real psagg-server (test_device.sh starts it; world size 1).
 *
 * usage: fn_device --case NAME [--path host|device]
 *
 * Every case exits 0 when its rule held and the simulator saw no violation (a buffer freed
 * while work on it was queued, work enqueued on the wrong device), 1 otherwise. The lifetime
 * cases free the caller's buffers the moment the library says the operation is over, with
 * every piece of device work delayed, so work the library left queued finds them freed.
 *   ef         6 rounds of a 4-chunk maxmin4 tensor with error feedback; round 2's encode
 *              fails (host: a NaN in chunk 2; device: chunk 2's encode cannot be enqueued),
 *              round 4 has NaNs in chunks 1 and 2. Prints DIGEST of every output and error
 *              (status, element): the host and device paths must print the same
 *   thc        ef with grad in thc4/1024 (rotated residuals, the scales each update sets, the
 *              updates wider than the pushes) and PSAGG_AVERAGE: the same DIGEST on both paths
 *   close      psagg_close while the encode is queued; a waiter frees the buffers when the
 *              handle completes
 *   window     the job fails while psagg_push_pull_cuda is still enqueueing
 *   inflight_encode / inflight_decode
 *              the job fails (server connection lost) while the encode / the decode is queued
 *   enqueue_fail  chunk 2's encode cannot be enqueued: the buffers are freed on the error
 *   misaligned a misaligned d_out is refused before anything is enqueued
 *   invalid_update  an update that does not decode fails the job, as on the host path
 *   setup_fail an allocation of the tensor's set-up fails: nothing leaks, a retry works and
 *              allocates what a clean set-up does
 *   devices    buffers on device 1 while the caller's current device is 0: the work runs on
 *              device 1 and the caller's device is 0 after every call, psagg_close included
 *   stream_fail  the stream cannot be created: the error says why
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "devsim.h"
#include "psagg.h"
#include "worker.h"

#define N_GRAD  200000 /* 4 chunks of 65536 elements (chunk_bytes = 262144) */
#define N_SMALL 1000

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fn_device: FAILED %s:%d: ", __FILE__, __LINE__);                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static psagg_ctx *ctx;
static uint32_t keys[3];

static psagg_codec grad_codec = {PSAGG_CODEC_MAXMIN, 4, 512, PSAGG_ROUND_STOCHASTIC, 0};

static void start(int error_feedback)
{
    psagg_tensor_desc d[3] = {
        {.struct_size = sizeof d[0],
         .name = "grad",
         .count = N_GRAD,
         .codec = grad_codec,
         .error_feedback = error_feedback},
        {.struct_size = sizeof d[0],
         .name = "small",
         .count = N_SMALL,
         .codec = {.id = PSAGG_CODEC_FP32},
         .error_feedback = 0},
        {.struct_size = sizeof d[0],
         .name = "twin",
         .count = N_GRAD,
         .codec = {PSAGG_CODEC_MAXMIN, 4, 512, PSAGG_ROUND_STOCHASTIC, 0},
         .error_feedback = error_feedback},
    };
    if (psagg_init(NULL, -1, -1, &ctx) || psagg__device_use(ctx, devsim_exec()) ||
        psagg_declare(ctx, d, 3, keys)) {
        fprintf(stderr, "fn_device: start-up: %s\n", psagg_last_error());
        exit(1);
    }
}

static float value(int round, size_t i)
{
    return (float)((i * 2654435761u + (unsigned)round * 40503u) % 2001) / 1000.0f - 1.0f;
}

/* A device buffer of n floats holding round's values. */
static float *dev_input(int device, size_t n, int round)
{
    float *p = devsim_user_alloc(device, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = value(round, i);
    return p;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* "element N" in a message, or -1. */
static long long element_of(const char *msg)
{
    const char *e = strstr(msg, "element ");
    return e ? strtoll(e + 8, NULL, 10) : -1;
}

/* ---- ef, thc: the host and device paths give the same bytes, errors and residuals ---- */

/* thc: grad is thc4 (blocks of 1024: a short last block), averaged */
static int case_ef(int device, int thc)
{
    uint64_t digest = 0xcbf29ce484222325ull;
    float *host_in = malloc(N_GRAD * sizeof(float)), *host_out = malloc(N_GRAD * sizeof(float));
    const psagg_reduce op = thc ? PSAGG_AVERAGE : PSAGG_SUM;
    if (thc)
        grad_codec = (psagg_codec){PSAGG_CODEC_THC, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0};
    start(1);
    for (int round = 0; round < 6; round++) {
        psagg_handle *h = NULL;
        psagg_status st;
        float *in = device ? dev_input(0, N_GRAD, round) : host_in;
        float *out = device ? devsim_user_alloc(0, N_GRAD * sizeof(float)) : host_out;
        if (!device)
            for (size_t i = 0; i < N_GRAD; i++)
                in[i] = value(round, i);
        if (round == 2 && device) /* event, wait, error words, (thc: the scales,) chunks 0, 1,
                                     then 2 fails */
            devsim_fail_enqueue(thc ? 7 : 6);
        if (round == 2 && !device)
            in[2 * 65536 + 17] = 0.0f / 0.0f;
        if (round == 4) { /* the first bad element of the tensor wins: chunk 1's */
            in[65536 + 100] = 0.0f / 0.0f;
            in[2 * 65536 + 5] = 1.0f / 0.0f;
        }
        st = device ? psagg_push_pull_cuda(ctx, keys[0], in, out, op, 0, devsim_user_stream(0), &h)
                    : psagg_push_pull(ctx, keys[0], in, out, op, 0, &h);
        if (!st)
            st = psagg_wait(h, -1);
        psagg_release(h);
        if (round == 2) {
            CHECK(st != PSAGG_OK, "round 2 should have failed");
            printf("round 2: %s\n", psagg_last_error());
        } else if (round == 4) {
            long long el = element_of(psagg_last_error());
            printf("round 4: status %d element %lld: %s\n", st, el, psagg_last_error());
            CHECK(st == PSAGG_ENONFINITE && el == 65536 + 100,
                  "round 4: status %d element %lld, expected %d element %d", st, el,
                  PSAGG_ENONFINITE, 65536 + 100);
            digest = fnv(digest, &st, sizeof st);
            digest = fnv(digest, &el, sizeof el);
        } else {
            CHECK(st == PSAGG_OK, "round %d: %s", round, psagg_last_error());
            digest = fnv(digest, out, N_GRAD * sizeof(float));
        }
        if (device) {
            devsim_user_free(in);
            devsim_user_free(out);
        }
    }
    printf("DIGEST %016llx\n", (unsigned long long)digest);
    free(host_in);
    free(host_out);
    return 0;
}

/* ---- lifetime cases ---- */

typedef struct waiter {
    psagg_handle *h;
    float *in, *out;
} waiter;

/* Wait for the handle to complete the way psagg_wait's caller would learn it (its done flag,
 * read without the context: psagg_close frees the context), then free the buffers at once. */
static void *free_on_done(void *arg)
{
    waiter *w = arg;
    while (!__atomic_load_n(&w->h->done, __ATOMIC_ACQUIRE))
        usleep(200);
    devsim_user_free(w->in);
    devsim_user_free(w->out);
    return NULL;
}

static int case_close(void)
{
    waiter w;
    pthread_t t;
    psagg_status st;
    start(1);
    devsim_set_delay(40);
    w.in = dev_input(0, N_GRAD, 0);
    w.out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    st = psagg_push_pull_cuda(ctx, keys[0], w.in, w.out, PSAGG_SUM, 0, devsim_user_stream(0), &w.h);
    CHECK(st == PSAGG_OK, "push_pull_cuda: %s", psagg_last_error());
    if (st)
        return 1;
    pthread_create(&t, NULL, free_on_done, &w);
    psagg_close(ctx); /* while the encode is queued */
    pthread_join(t, NULL);
    free(w.h); /* its context is gone: psagg_release would wait on it */
    return 0;
}

/* Lose the control connection: the communication thread fails the job within 20 ms. */
static void cut(void *arg)
{
    (void)arg;
    shutdown(ctx->servers[0].fd, SHUT_RDWR);
}

static void cut_and_wait(void *arg)
{
    cut(arg);
    for (int i = 0; i < 2000 && !__atomic_load_n(&ctx->failed, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
}

/* push_pull_cuda of the big tensor, wait, free the buffers the moment the wait returns. */
static psagg_status push_wait_free(float *in, float *out)
{
    psagg_handle *h = NULL;
    psagg_status st =
        psagg_push_pull_cuda(ctx, keys[0], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
    if (!st)
        st = psagg_wait(h, 30000);
    devsim_user_free(in);
    devsim_user_free(out);
    psagg_release(h);
    return st;
}

static int case_job_fails(const char *which)
{
    float *in, *out;
    psagg_status st;
    start(1);
    devsim_set_delay(30);
    in = dev_input(0, N_GRAD, 0);
    out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    if (!strcmp(which, "window")) {
        devsim_on_enqueue(2, cut_and_wait, NULL); /* between the caller's event and the wait */
        st = push_wait_free(in, out);
    } else if (!strcmp(which, "inflight_encode")) {
        psagg_handle *h = NULL;
        st = psagg_push_pull_cuda(ctx, keys[0], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
        CHECK(st == PSAGG_OK, "push_pull_cuda: %s", psagg_last_error());
        cut(NULL);
        if (!st)
            st = psagg_wait(h, 30000);
        devsim_user_free(in);
        devsim_user_free(out);
        psagg_release(h);
    } else { /* inflight_decode: the cut comes with the decode's first enqueue */
        psagg_handle *h = NULL;
        st = psagg_push_pull_cuda(ctx, keys[0], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
        CHECK(st == PSAGG_OK, "push_pull_cuda: %s", psagg_last_error());
        devsim_on_enqueue(1, cut, NULL);
        if (!st)
            st = psagg_wait(h, 30000);
        devsim_user_free(in);
        devsim_user_free(out);
        psagg_release(h);
    }
    printf("%s: %s\n", which, psagg_last_error());
    CHECK(st != PSAGG_OK && st != PSAGG_ETIMEDOUT, "%s: the job should have failed: %d %s", which,
          st, psagg_last_error());
    devsim_quiesce();
    psagg_close(ctx);
    return 0;
}

static int case_enqueue_fail(void)
{
    float *in, *out;
    psagg_handle *h = NULL;
    psagg_status st;
    start(1);
    devsim_set_delay(30);
    in = dev_input(0, N_GRAD, 0);
    out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    devsim_fail_enqueue(7); /* event, wait, residual, error words, chunk 0, 1; chunk 2 fails */
    st = psagg_push_pull_cuda(ctx, keys[0], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
    printf("enqueue_fail: %s\n", psagg_last_error());
    CHECK(st == PSAGG_ECUDA && !h, "expected PSAGG_ECUDA and no handle: %d", st);
    devsim_user_free(in); /* the call failed: the buffers are the caller's again */
    devsim_user_free(out);
    devsim_quiesce();
    /* the tensor is usable: its residual starts afresh */
    in = dev_input(0, N_GRAD, 1);
    out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    st = push_wait_free(in, out);
    CHECK(st == PSAGG_OK, "the push_pull after the failed one: %s", psagg_last_error());
    psagg_close(ctx);
    return 0;
}

static int case_misaligned(void)
{
    float *in, *out;
    char *raw;
    psagg_handle *h = NULL;
    psagg_status st;
    long before;
    start(1);
    in = dev_input(0, N_SMALL, 0);
    raw = devsim_user_alloc(0, N_SMALL * sizeof(float) + 8);
    before = devsim_enqueues();
    st = psagg_push_pull_cuda(ctx, keys[1], in, (float *)(raw + 2), PSAGG_SUM, 0,
                              devsim_user_stream(0), &h);
    printf("misaligned: %s\n", psagg_last_error());
    CHECK(st == PSAGG_EINVAL && !h, "a misaligned d_out: %d, expected PSAGG_EINVAL", st);
    CHECK(devsim_enqueues() == before, "%ld pieces of work enqueued for a refused call",
          devsim_enqueues() - before);
    out = devsim_user_alloc(0, N_SMALL * sizeof(float));
    st = psagg_push_pull_cuda(ctx, keys[1], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
    if (!st)
        st = psagg_wait(h, 30000);
    psagg_release(h);
    CHECK(st == PSAGG_OK, "the next push_pull: %s", psagg_last_error());
    for (size_t i = 0; !st && i < N_SMALL; i++) /* fp32, one worker: the sum is the input */
        if (out[i] != in[i]) {
            CHECK(0, "element %zu: %g, expected %g", i, (double)out[i], (double)in[i]);
            break;
        }
    devsim_user_free(in);
    devsim_user_free(out);
    devsim_user_free(raw);
    psagg_close(ctx);
    return 0;
}

static int case_invalid_update(void)
{
    float *in, *out;
    psagg_handle *h = NULL;
    psagg_status st;
    start(0);
    in = dev_input(0, N_GRAD, 0);
    out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    devsim_corrupt_next_upload();
    st = push_wait_free(in, out);
    printf("invalid_update: %s\n", psagg_last_error());
    CHECK(st == PSAGG_EPROTO, "an invalid update: %d, expected PSAGG_EPROTO", st);
    in = dev_input(0, N_SMALL, 0);
    out = devsim_user_alloc(0, N_SMALL * sizeof(float));
    st = psagg_push_pull_cuda(ctx, keys[1], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
    CHECK(st != PSAGG_OK, "the job should have failed, as on the host path");
    psagg_release(h);
    devsim_user_free(in);
    devsim_user_free(out);
    psagg_close(ctx);
    return 0;
}

static int case_setup_fail(void)
{
    float *in, *out;
    long allocs;
    size_t bytes, grown, clean;
    psagg_status st;
    start(1);
    allocs = devsim_lib_allocs();
    bytes = devsim_lib_bytes();
    in = dev_input(0, N_GRAD, 0);
    out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    devsim_fail_alloc(4);
    {
        psagg_handle *h = NULL;
        st = psagg_push_pull_cuda(ctx, keys[0], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
        printf("setup_fail: %s\n", psagg_last_error());
        CHECK(st == PSAGG_ENOMEM && !h, "an allocation failure: %d, expected PSAGG_ENOMEM", st);
    }
    CHECK(devsim_lib_allocs() == allocs, "%ld allocations live after the failed set-up",
          devsim_lib_allocs() - allocs);
    bytes = devsim_lib_bytes();
    st = push_wait_free(in, out);
    CHECK(st == PSAGG_OK, "the retry: %s", psagg_last_error());
    grown = devsim_lib_bytes() - bytes;
    in = dev_input(0, N_GRAD, 0);
    out = devsim_user_alloc(0, N_GRAD * sizeof(float));
    bytes = devsim_lib_bytes();
    {
        psagg_handle *h = NULL;
        st = psagg_push_pull_cuda(ctx, keys[2], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
        if (!st)
            st = psagg_wait(h, 30000);
        psagg_release(h);
    }
    clean = devsim_lib_bytes() - bytes;
    CHECK(st == PSAGG_OK && grown == clean,
          "the retried set-up allocated %zu bytes, a clean one of the same tensor %zu", grown,
          clean);
    devsim_user_free(in);
    devsim_user_free(out);
    psagg_close(ctx);
    return 0;
}

static int case_devices(void)
{
    float *in, *out;
    psagg_handle *h = NULL;
    psagg_status st;
    int dev = -1;
    start(0);
    devsim_exec()->set_device(0);
    in = dev_input(1, N_SMALL, 0);
    out = devsim_user_alloc(1, N_SMALL * sizeof(float));
    st = psagg_push_pull_cuda(ctx, keys[1], in, out, PSAGG_SUM, 0, devsim_user_stream(1), &h);
    devsim_exec()->get_device(&dev);
    CHECK(dev == 0, "the caller's current device is %d after psagg_push_pull_cuda, not 0", dev);
    if (!st)
        st = psagg_wait(h, 30000);
    psagg_release(h);
    CHECK(st == PSAGG_OK, "push_pull_cuda on device 1: %s", psagg_last_error());
    for (size_t i = 0; !st && i < N_SMALL; i++)
        if (out[i] != in[i]) {
            CHECK(0, "element %zu: %g, expected %g", i, (double)out[i], (double)in[i]);
            break;
        }
    {
        float *other = devsim_user_alloc(0, N_SMALL * sizeof(float));
        st = psagg_push_pull_cuda(ctx, keys[1], other, other, PSAGG_SUM, 0, NULL, &h);
        printf("devices: %s\n", psagg_last_error());
        CHECK(st == PSAGG_EINVAL, "buffers on another device than the context's: %d", st);
        devsim_user_free(other);
    }
    devsim_user_free(in);
    devsim_user_free(out);
    psagg_close(ctx);
    devsim_exec()->get_device(&dev);
    CHECK(dev == 0, "the caller's current device is %d after psagg_close, not 0", dev);
    return 0;
}

static int case_stream_fail(void)
{
    float *in, *out;
    psagg_handle *h = NULL;
    psagg_status st;
    start(0);
    in = dev_input(0, N_SMALL, 0);
    out = devsim_user_alloc(0, N_SMALL * sizeof(float));
    devsim_fail_stream_create(1);
    st = psagg_push_pull_cuda(ctx, keys[1], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
    printf("stream_fail: %s\n", psagg_last_error());
    CHECK(st == PSAGG_ECUDA && strstr(psagg_last_error(), "injected failure to create a stream"),
          "the error should say the stream could not be created: %d %s", st, psagg_last_error());
    devsim_fail_stream_create(0);
    st = psagg_push_pull_cuda(ctx, keys[1], in, out, PSAGG_SUM, 0, devsim_user_stream(0), &h);
    if (!st)
        st = psagg_wait(h, 30000);
    psagg_release(h);
    CHECK(st == PSAGG_OK, "once streams can be created: %s", psagg_last_error());
    devsim_user_free(in);
    devsim_user_free(out);
    psagg_close(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"case", required_argument, NULL, 'c'}, {"path", required_argument, NULL, 'p'}, {0}};
    const char *name = NULL;
    int device = 1, o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'c')
            name = optarg;
        else if (o == 'p')
            device = strcmp(optarg, "host") != 0;
        else
            return 2;
    }
    if (!name) {
        fprintf(stderr, "usage: fn_device --case NAME [--path host|device]\n");
        return 2;
    }
    devsim_init(2, 0);
    devsim_user_stream(0); /* the caller's streams exist before the library's */
    devsim_user_stream(1);
    if (!strcmp(name, "ef") || !strcmp(name, "thc"))
        case_ef(device, !strcmp(name, "thc"));
    else if (!strcmp(name, "close"))
        case_close();
    else if (!strcmp(name, "window") || !strcmp(name, "inflight_encode") ||
             !strcmp(name, "inflight_decode"))
        case_job_fails(name);
    else if (!strcmp(name, "enqueue_fail"))
        case_enqueue_fail();
    else if (!strcmp(name, "misaligned"))
        case_misaligned();
    else if (!strcmp(name, "invalid_update"))
        case_invalid_update();
    else if (!strcmp(name, "setup_fail"))
        case_setup_fail();
    else if (!strcmp(name, "devices"))
        case_devices();
    else if (!strcmp(name, "stream_fail"))
        case_stream_fail();
    else {
        fprintf(stderr, "fn_device: unknown case %s\n", name);
        return 2;
    }
    devsim_quiesce();
    if (devsim_violations())
        fprintf(stderr, "fn_device: %d violations\n", devsim_violations());
    printf("fn_device %s: %s\n", name, failures || devsim_violations() ? "FAILED" : "ok");
    return failures || devsim_violations() ? 1 : 0;
}
