/*
 * test_aggregate.c - the server's rounds driven directly: a real psagg-server core
 * (server_open: its node and libfabric endpoint, membership, metrics) with its aggregation
 * pool started on a one-tensor layout, and no progress thread. This test plays the progress
 * thread: it hands checked pushes to the aggregation threads (agg_enqueue), takes the updates
 * they queue, and completes their sends (agg_send_done) when it chooses, so the timings that a
 * job on slow links meets by chance (a round that completes while an older update is still
 * being sent, a worker two rounds behind) happen here every time.
 *
 *   quorum_deferred   [server] quorum: a round that completes within its grace period while the
 *                     update of two rounds before still has sends pending must wait without
 *                     spinning (its aggregation thread stays idle) and go out as soon as
 *                     those sends are done
 *   quorum_rearm      a round whose grace passed while it waited for a worker two rounds
 *                     behind closes as soon as that worker's push comes, without the workers
 *                     still missing that may be left out
 *
 * Label `regression` as well as `unit` (tests/unit/CMakeLists.txt).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "kernels/codec.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "server.h"
#include "testutil.h"

#define COUNT 1024 /* elements of the one tensor: one chunk */

typedef struct harness {
    server *srv;
    char ini[64];
    recv_buf **bufs; /* every push made, freed at the end */
    int n_bufs, cap_bufs;
} harness;

static volatile sig_atomic_t never_stop;

/* A server core for `workers` workers with [server] quorum q, grace_ms g, one aggregation
 * thread, and one fp32 tensor of COUNT elements (one chunk, owned here). */
static void harness_start(harness *hz, int workers, int q, int g)
{
    psagg_config cfg;
    psagg_ctl_tensor decl;
    psagg_codec fp32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC};
    FILE *f;
    int fd;

    memset(hz, 0, sizeof *hz);
    snprintf(hz->ini, sizeof hz->ini, "/tmp/psagg-test-aggregate-XXXXXX");
    fd = mkstemp(hz->ini);
    CHECK(fd >= 0, "mkstemp");
    f = fdopen(fd, "w");
    fprintf(f,
            "[cluster]\njob_id = unit-aggregate\nservers = 127.0.0.1:1\nworkers = %d\n"
            "op_timeout_ms = 60000\n[server]\nthreads = 1\nquorum = %d\ngrace_ms = %d\n"
            "[log]\nlevel = warn\n",
            workers, q, g);
    fclose(f);
    CHECK(!psagg_config_load(hz->ini, &cfg), "config: %s", psagg_last_error());
    hz->srv = server_open(&cfg, 0, &never_stop);
    CHECK(hz->srv, "server_open failed (its log says why)");
    for (int w = 0; w < workers; w++)
        hz->srv->workers[w].state = W_DECLARED;
    CHECK(!psagg_tensor_to_wire("t", COUNT, &fp32, &decl), "%s", psagg_last_error());
    CHECK(!psagg_layout_build(&decl, 1, COUNT, 1, 0, &hz->srv->layout), "%s", psagg_last_error());
    CHECK(!agg_setup(hz->srv) && !agg_start(hz->srv), "%s", psagg_last_error());
}

static void harness_stop(harness *hz)
{
    server_close(hz->srv);
    for (int i = 0; i < hz->n_bufs; i++) {
        free(hz->bufs[i]->rx.buf);
        free(hz->bufs[i]);
    }
    free(hz->bufs);
    unlink(hz->ini);
}

/* Worker w's push of `round`, every element `value`, handed to the chunk's thread as the
 * progress thread hands a checked push. */
static void push(harness *hz, int w, uint32_t round, float value)
{
    server *srv = hz->srv;
    const psagg_chunk_info *ci = &srv->layout.chunks[0];
    size_t len = sizeof(psagg_msg_hdr) + ci->enc_bytes;
    recv_buf *rb = calloc(1, sizeof *rb);
    float *payload;
    const char *bad;

    CHECK(rb && (rb->rx.buf = calloc(1, len)), "out of memory");
    psagg_msg_init((psagg_msg_hdr *)rb->rx.buf, PSAGG_MSG_PUSH, (uint32_t)w, round, ci,
                   &srv->layout.tensors[0].codec, 0);
    payload = (float *)(rb->rx.buf + sizeof(psagg_msg_hdr));
    for (int i = 0; i < COUNT; i++)
        payload[i] = value;
    rb->rx.size = rb->rx.len = len;
    bad = psagg_msg_check(rb->rx.buf, len, 0, PSAGG_MSG_PUSH, &srv->layout, &ci, &rb->mc);
    CHECK(!bad, "the test's push is bad: field %s", bad);
    rb->from = w;
    if (hz->n_bufs == hz->cap_bufs) {
        hz->cap_bufs = hz->cap_bufs ? 2 * hz->cap_bufs : 64;
        hz->bufs = realloc(hz->bufs, (size_t)hz->cap_bufs * sizeof *hz->bufs);
        CHECK(hz->bufs, "out of memory");
    }
    hz->bufs[hz->n_bufs++] = rb;
    agg_enqueue(srv, &srv->chunks[ci->slot], rb);
}

/* The next update the aggregation threads queued, within ms (NULL if none came). */
static send_ctx *take_update(harness *hz, int ms)
{
    server *srv = hz->srv;
    int64_t until = psagg_now_ms() + ms;
    do {
        send_ctx *sc = NULL;
        pthread_mutex_lock(&srv->sendq_mu);
        if ((sc = srv->sendq_head)) {
            srv->sendq_head = sc->next;
            if (!srv->sendq_head)
                srv->sendq_tail = NULL;
            atomic_fetch_sub(&srv->sendq_len, 1);
        }
        pthread_mutex_unlock(&srv->sendq_mu);
        if (sc)
            return sc;
        usleep(1000);
    } while (psagg_now_ms() < until);
    return NULL;
}

static const psagg_msg_hdr *update_hdr(const send_ctx *sc)
{
    return (const psagg_msg_hdr *)sc->chunk->out[sc->parity];
}

/* Whether worker w's push is in the update (its contributor bitmap). */
static int update_has(const harness *hz, const send_ctx *sc, int w)
{
    const psagg_msg_hdr *h = update_hdr(sc);
    const uint8_t *bits = (const uint8_t *)h + sizeof *h + h->len;
    (void)hz;
    return bits[w / 8] >> (w % 8) & 1;
}

/* Every send of the update is done, as the progress thread's completions would say. */
static void sends_done(harness *hz, send_ctx *sc)
{
    int n = atomic_load(&sc->chunk->sends_pending[sc->parity]);
    for (int i = 0; i < n; i++)
        agg_send_done(hz->srv, sc);
}

/* CPU time the aggregation thread has used, in ms. */
static double agg_cpu_ms(const harness *hz)
{
    clockid_t cid;
    struct timespec ts;
    CHECK(!pthread_getcpuclockid(hz->srv->threads[0].tid, &cid), "pthread_getcpuclockid");
    CHECK(!clock_gettime(cid, &ts), "clock_gettime");
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void expect_update(send_ctx *sc, uint32_t round, int summed, const char *what)
{
    CHECK(sc, "%s: the update of round %u never came", what, round);
    CHECK(update_hdr(sc)->round == round && update_hdr(sc)->summed == summed,
          "%s: got the update of round %u summing %u, expected round %u summing %d", what,
          update_hdr(sc)->round, update_hdr(sc)->summed, round, summed);
}

/*
 * 4 workers, quorum 3, grace 300 ms. Round 0's update is left with its sends pending (a slow
 * receiver); round 1 goes out and its sends complete; round 2, of round 0's parity, reaches
 * its quorum (the grace timer is armed) and then completes with the fourth push inside the
 * grace period: it must wait for round 0's buffer. Once the grace period has passed, its
 * aggregation thread must be idle (before the fix it spun on the timer, never reading the
 * retry from its queue), and when round 0's sends complete, round 2's update must go out.
 */
static void quorum_deferred(void)
{
    harness hz;
    send_ctx *u0, *u1, *u2;
    double cpu0, cpu1, cpu2;

    harness_start(&hz, 4, 3, 300);
    for (int w = 0; w < 4; w++)
        push(&hz, w, 0, 1.0f);
    u0 = take_update(&hz, 2000);
    expect_update(u0, 0, 4, "round 0");
    for (int w = 0; w < 4; w++)
        push(&hz, w, 1, 1.0f);
    u1 = take_update(&hz, 2000);
    expect_update(u1, 1, 4, "round 1");
    sends_done(&hz, u1);
    for (int w = 0; w < 3; w++)
        push(&hz, w, 2, 1.0f);
    usleep(20 * 1000); /* the quorum is in: the grace timer runs */
    push(&hz, 3, 2, 1.0f);
    CHECK(!take_update(&hz, 100), "round 2 went out while round 0's update was being sent");
    usleep(400 * 1000); /* the grace period is over */
    cpu0 = agg_cpu_ms(&hz);
    usleep(300 * 1000);
    cpu1 = agg_cpu_ms(&hz);
    CHECK(cpu1 - cpu0 < 150,
          "the aggregation thread used %.0f ms of CPU in 300 ms while its only round waited for "
          "an update's sends (it spins on a grace timer already due)",
          cpu1 - cpu0);
    sends_done(&hz, u0);
    u2 = take_update(&hz, 1000);
    cpu2 = agg_cpu_ms(&hz);
    CHECK(u2,
          "round 2's update never came after round 0's sends completed; its aggregation "
          "thread used %.0f ms of CPU in the second it was waited for (it spins on a grace "
          "timer already due, ahead of the retry in its queue)",
          cpu2 - cpu1);
    expect_update(u2, 2, 4, "round 2 after round 0's sends completed");
    printf("quorum_deferred: round 2 waited for round 0's sends with its thread idle (%.1f ms "
           "CPU in 300 ms) and went out once they completed\n",
           cpu1 - cpu0);
    harness_stop(&hz);
}

/*
 * 5 workers, quorum 3, grace 50 ms. Round 0 closes without workers 3 and 4; worker 4's push
 * of round 0 comes late (so it may be left out again), worker 3's never does (its update came
 * first, so it never sent that push). Round 1 gets workers 0-2: when the grace passes it
 * must wait for worker 3, which is two rounds behind. When worker 3's push of round 1
 * comes, the round must close at once without worker 4 (before the fix it waited for every
 * member: worker 4 too, until the round's deadline).
 */
static void quorum_rearm(void)
{
    harness hz;
    send_ctx *u;

    harness_start(&hz, 5, 3, 50);
    for (int w = 0; w < 3; w++)
        push(&hz, w, 0, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 0, 3, "round 0 closed without workers 3 and 4");
    sends_done(&hz, u);
    push(&hz, 4, 0, 1.0f); /* late: dropped, but it counts as seen */
    for (int w = 0; w < 3; w++)
        push(&hz, w, 1, 1.0f);
    CHECK(!(u = take_update(&hz, 300)),
          "round 1 closed without worker 3, whose last push was two rounds before");
    push(&hz, 3, 1, 1.0f);
    u = take_update(&hz, 1000);
    expect_update(u, 1, 4, "round 1 once worker 3's push came (worker 4 left out)");
    CHECK(update_has(&hz, u, 3) && !update_has(&hz, u, 4), "round 1's bitmap");
    sends_done(&hz, u);
    printf("quorum_rearm: round 1 waited for worker 3 (two rounds behind) and closed without "
           "worker 4 as soon as worker 3's push came\n");
    harness_stop(&hz);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"quorum_deferred", quorum_deferred}, {"quorum_rearm", quorum_rearm}};
    int ran = 0;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || !strcmp(argv[1], cases[i].name)) {
            cases[i].fn();
            ran++;
        }
    CHECK(ran, "no case named '%s'", argc > 1 ? argv[1] : "");
    return 0;
}
