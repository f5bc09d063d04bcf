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
 *   epoch_ahead       (elastic, server 1) an epoch a joiner relays before the one before it
 *                     waits for it; a member relaying one ahead fails the job
 *   parked_ahead      a joiner's push of an epoch two ahead waits through the epoch between
 *   quorum_joiner     ([server] quorum in an elastic job) a joiner's first round waits for
 *                     its push, however long the grace, and closes without a straggler then
 *   takeover_ahead    ([cluster] server_replicas) a chunk taken over from round r: a worker
 *                     that had round r's update pushes r+1 before the others push r again;
 *                     it waits instead of closing that worker
 *   takeover_quorum   (server_replicas, quorum) a copy that owns its chunk now and owes the
 *                     update of the round before: the next round, closed by the quorum before
 *                     every worker took the view, waits for the fence (the job failed)
 *   quorum_drop_all   (elastic, [server] quorum = 1) the one push a round held is bad (a NaN):
 *                     checked before the fold, it is dropped with its worker when the grace
 *                     closes the round, which then sums nothing: it opens again and sums the
 *                     live workers' pushes (it hung, every later push dropped as late)
 *   checkpoint_decl   ([server] optimizer, checkpoint_dir) a checkpoint is written from the
 *                     job's declaration, whoever of the workers is gone (worker 0's was read:
 *                     a job started without it, or a checkpoint while it rejoins, crashed)
 *
 * Label `regression` as well as `unit` (tests/unit/CMakeLists.txt).
 */
#include <pthread.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "kernels/codec.h"
#include "runtime/agree.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "server.h"
#include "testutil.h"

#define COUNT 1024 /* elements of the one tensor: one chunk */

typedef struct harness {
    server *srv;
    char ini[64];
    char dir[64];                /* checkpoint_dir (optimizer) */
    const psagg__chunk_info *ci; /* the chunk owned here */
    recv_buf **bufs;             /* every push made, freed at the end */
    int n_bufs, cap_bufs;
} harness;

/* What a case's server runs: [cluster] workers, servers, elastic (max_workers), [server]
 * quorum and grace_ms; rank: this server's. */
typedef struct harness_opts {
    int workers, max_workers, servers, rank, quorum, grace_ms;
    int optimizer; /* sgd, parameters, a checkpoint_dir under the harness's folder */
    int replicas;  /* [cluster] server_replicas */
    int server_ef; /* [server] error_feedback: a chunk's copy follows its owner (with a quorum) */
} harness_opts;

static volatile sig_atomic_t never_stop;

/*
 * A server core of rank o->rank with one aggregation thread, for a declaration of one fp32
 * tensor of COUNT elements per server (one chunk each; the one of this rank is hz->ci).
 */
static void harness_start(harness *hz, const harness_opts *o)
{
    psagg__config cfg;
    psagg__ctl_tensor decl[4];
    psagg_codec fp32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
    FILE *f;
    int fd;

    memset(hz, 0, sizeof *hz);
    snprintf(hz->ini, sizeof hz->ini, "/tmp/psagg-test-aggregate-XXXXXX");
    fd = mkstemp(hz->ini);
    CHECK(fd >= 0, "mkstemp");
    f = fdopen(fd, "w");
    fprintf(f, "[cluster]\njob_id = unit-aggregate\nservers =");
    for (int k = 0; k < o->servers; k++)
        fprintf(f, " 127.0.0.1:%d", 1 + k);
    fprintf(f, "\nworkers = %d\nop_timeout_ms = 60000\n", o->workers);
    if (o->max_workers)
        fprintf(f, "elastic = on\nmax_workers = %d\n", o->max_workers);
    if (o->replicas)
        fprintf(f, "server_replicas = %d\n", o->replicas);
    fprintf(f, "[server]\nthreads = 1\n");
    if (o->server_ef)
        fprintf(f, "error_feedback = on\n");
    if (o->quorum)
        fprintf(f, "quorum = %d\ngrace_ms = %d\n", o->quorum, o->grace_ms);
    if (o->optimizer) {
        snprintf(hz->dir, sizeof hz->dir, "/tmp/psagg-test-aggregate-ck-XXXXXX");
        CHECK(mkdtemp(hz->dir), "mkdtemp");
        fprintf(f, "optimizer = sgd\ncheckpoint_dir = %s\n", hz->dir);
    }
    fprintf(f, "[log]\nlevel = %s\n", getenv("TEST_LOG") ? getenv("TEST_LOG") : "warn");
    fclose(f);
    CHECK(!psagg__config_load(hz->ini, &cfg), "config: %s", psagg_last_error());
    hz->srv = server_open(&cfg, o->rank, &never_stop);
    CHECK(hz->srv, "server_open failed (its log says why)");
    for (int w = 0; w < hz->srv->n_workers; w++) { /* fabric address w (progress_route) */
        hz->srv->workers[w].state = w < o->workers ? W_DECLARED : W_NONE;
        hz->srv->workers[w].addr = (psagg__peer)w;
        hz->srv->rank_at[w] = w;
    }
    for (int k = 0; k < o->servers; k++) {
        char name[8] = {'t', (char)('0' + k), 0};
        CHECK(!psagg__tensor_to_wire(name, COUNT, &fp32, &decl[k]), "%s", psagg_last_error());
        decl[k].flags = o->optimizer ? PSAGG_DECL_PARAM : 0;
    }
    /* the job's declaration, as start_or_refuse keeps it (control.c) */
    hz->srv->job_decl_hdr =
        (psagg__ctl_declare){.count = (uint32_t)o->servers, .chunk_elems = COUNT};
    CHECK((hz->srv->job_decl = malloc((size_t)o->servers * sizeof *decl)), "out of memory");
    memcpy(hz->srv->job_decl, decl, (size_t)o->servers * sizeof *decl);
    CHECK(!psagg__layout_build(decl, (uint32_t)o->servers, COUNT, (uint32_t)o->servers, 0,
                               &hz->srv->layout),
          "%s", psagg_last_error());
    for (uint32_t i = 0; i < hz->srv->layout.n_chunks; i++)
        if (hz->srv->layout.chunks[i].owner == (uint32_t)o->rank)
            hz->ci = &hz->srv->layout.chunks[i];
    CHECK(hz->ci, "no chunk owned by server %d", o->rank);
    CHECK(!agg_setup(hz->srv) && !agg_start(hz->srv), "%s", psagg_last_error());
    progress_init(hz->srv);
    hz->srv->ctl.job_running = 1;
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
    if (hz->dir[0])
        rmdir(hz->dir);
}

/* Worker w's push of chunk ci's `round` in epoch `epoch`, every element `value`. */
static recv_buf *make_push_of(harness *hz, const psagg__chunk_info *ci, int w, uint32_t round,
                              uint16_t epoch, float value)
{
    server *srv = hz->srv;
    size_t len = sizeof(psagg__msg_hdr) + ci->enc_bytes + srv->pool.follow_bytes; /* (a trailer
                                                 where copies follow: no update of the round) */
    recv_buf *rb = calloc(1, sizeof *rb);
    float *payload;

    CHECK(rb && (rb->rx.buf = calloc(1, len)), "out of memory");
    psagg__msg_init((psagg__msg_hdr *)rb->rx.buf, PSAGG_MSG_PUSH, (uint32_t)w, round, ci,
                    &srv->layout.tensors[ci->key].codec, 0);
    ((psagg__msg_hdr *)rb->rx.buf)->epoch = epoch;
    payload = (float *)(rb->rx.buf + sizeof(psagg__msg_hdr));
    for (uint64_t i = 0; i < ci->count; i++)
        payload[i] = value;
    rb->rx.size = rb->rx.len = len;
    if (hz->n_bufs == hz->cap_bufs) {
        hz->cap_bufs = hz->cap_bufs ? 2 * hz->cap_bufs : 64;
        hz->bufs = realloc(hz->bufs, (size_t)hz->cap_bufs * sizeof *hz->bufs);
        CHECK(hz->bufs, "out of memory");
    }
    hz->bufs[hz->n_bufs++] = rb;
    return rb;
}

/* Worker w's push of the chunk this server owns. */
static recv_buf *make_push(harness *hz, int w, uint32_t round, uint16_t epoch, float value)
{
    return make_push_of(hz, hz->ci, w, round, epoch, value);
}

/* Worker w's push of chunk ci's `round` in epoch `epoch`, checked as the progress thread checks
 * one, handed to the thread of the chunk's state in slot `slot`. */
static void push_to(harness *hz, int slot, const psagg__chunk_info *ci, int w, uint32_t round,
                    uint16_t epoch, float value)
{
    recv_buf *rb = make_push_of(hz, ci, w, round, epoch, value);
    const psagg__chunk_info *got;
    const char *bad = psagg__msg_check(rb->rx.buf, rb->rx.len, hz->srv->pool.follow_bytes,
                                       PSAGG_MSG_PUSH, &hz->srv->layout, &got, &rb->mc);
    CHECK(!bad && got == ci, "the test's push is bad: field %s", bad);
    rb->from = w;
    agg_enqueue(hz->srv, &hz->srv->chunks[slot], rb);
}

/* Worker w's push of `round`, handed to the chunk's thread as the progress thread hands a
 * checked push. */
static void push(harness *hz, int w, uint32_t round, float value)
{
    recv_buf *rb = make_push(hz, w, round, 0, value);
    const psagg__chunk_info *ci;
    const char *bad =
        psagg__msg_check(rb->rx.buf, rb->rx.len, 0, PSAGG_MSG_PUSH, &hz->srv->layout, &ci, &rb->mc);
    CHECK(!bad, "the test's push is bad: field %s", bad);
    rb->from = w;
    agg_enqueue(hz->srv, &hz->srv->chunks[ci->slot], rb);
}

/* The next update the aggregation threads queued, within ms (NULL if none came). */
static send_ctx *take_update(harness *hz, int ms)
{
    server *srv = hz->srv;
    int64_t until = psagg__now_ms() + ms;
    do {
        send_ctx *sc = NULL;
        pthread_mutex_lock(&srv->dp.sendq_mu);
        if ((sc = srv->dp.sendq_head)) {
            srv->dp.sendq_head = sc->next;
            if (!srv->dp.sendq_head)
                srv->dp.sendq_tail = NULL;
            atomic_fetch_sub(&srv->dp.sendq_len, 1);
        }
        pthread_mutex_unlock(&srv->dp.sendq_mu);
        if (sc)
            return sc;
        usleep(1000);
    } while (psagg__now_ms() < until);
    return NULL;
}

static const psagg__msg_hdr *update_hdr(const send_ctx *sc)
{
    return (const psagg__msg_hdr *)sc->chunk->out[sc->parity];
}

/* Whether worker w's push is in the update (its contributor bitmap). */
static int update_has(const harness *hz, const send_ctx *sc, int w)
{
    const psagg__msg_hdr *h = update_hdr(sc);
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
    CHECK(!pthread_getcpuclockid(hz->srv->pool.threads[0].tid, &cid), "pthread_getcpuclockid");
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

    harness_start(&hz, &(harness_opts){.workers = 4, .servers = 1, .quorum = 3, .grace_ms = 300});
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

    harness_start(&hz, &(harness_opts){.workers = 5, .servers = 1, .quorum = 3, .grace_ms = 50});
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

/* Worker `from` relays server 0's MEMBERSHIP frame of `epoch` to this server. */
static void relay(harness *hz, int from, uint32_t epoch, int left, const char *live_text)
{
    server *srv = hz->srv;
    size_t len = sizeof(psagg__ctl_membership) + (size_t)srv->n_workers;
    psagg__ctl_membership *m = calloc(1, len);
    uint8_t *live = (uint8_t *)(m + 1);
    psagg__ctl_hdr h = {.magic = PSAGG_CTL_MAGIC,
                        .type = PSAGG_CTL_MEMBERSHIP,
                        .version = PSAGG_PROTO_VERSION,
                        .len = (uint32_t)len};

    CHECK(m, "out of memory");
    m->epoch = epoch;
    m->n_workers = (uint32_t)srv->n_workers;
    m->left = left;
    for (int k = 0; k < srv->n_workers; k++)
        m->n_live += live[k] = live_text[k] == '1';
    snprintf(m->why, sizeof m->why, left >= 0 ? "worker %d died" : "worker 3 joined", left);
    membership_relayed(srv, from, &h, m);
    free(m);
}

static const char *job_error(harness *hz)
{
    return atomic_load(&hz->srv->job.failed) ? hz->srv->job.error : "";
}

/* The elastic cases' server: rank 1 of 2, workers 0-2 start the job (max_workers 4), and
 * worker 3 has joined here (declared) and waits for server 0 to admit it. */
static void joiner_start(harness *hz)
{
    harness_start(hz, &(harness_opts){.workers = 3, .max_workers = 4, .servers = 2, .rank = 1});
    hz->srv->workers[3].state = W_DECLARED;
    hz->srv->workers[3].joining = 1;
}

/*
 * Server 0 announced epoch 1 (worker 2 left) and at once epoch 2 (worker 3 admitted). The
 * joiner relays only epoch 2, the members both, in order; the joiner's copy comes first here.
 * It must wait for epoch 1 (before the fix: "an epoch was skipped", the job failed), then
 * both apply in order. A member that relays an epoch ahead still fails the job at once.
 */
static void epoch_ahead(void)
{
    harness hz;

    joiner_start(&hz);
    relay(&hz, 3, 2, -1, "1101");
    CHECK(!atomic_load(&hz.srv->job.failed), "the joiner's epoch 2 before epoch 1: %s",
          job_error(&hz));
    CHECK(atomic_load(&hz.srv->mb.epoch) == 0, "epoch 2 applied before epoch 1");
    relay(&hz, 0, 1, 2, "1100");
    CHECK(atomic_load(&hz.srv->mb.epoch) == 2, "at epoch %u after epoch 1 came, not 2",
          atomic_load(&hz.srv->mb.epoch));
    relay(&hz, 0, 2, -1, "1101"); /* the members' copies, equal */
    relay(&hz, 1, 1, 2, "1100");
    relay(&hz, 1, 2, -1, "1101");
    CHECK(!atomic_load(&hz.srv->job.failed), "%s", job_error(&hz));
    CHECK(server_member(hz.srv, 0) && server_member(hz.srv, 1) && !server_member(hz.srv, 2) &&
              server_member(hz.srv, 3),
          "members after epoch 2");
    harness_stop(&hz);

    joiner_start(&hz);
    relay(&hz, 1, 5, 0, "0110");
    CHECK(strstr(job_error(&hz), "an epoch was skipped"),
          "a member relayed epoch 5 at epoch 0: the job says '%s'", job_error(&hz));
    harness_stop(&hz);
    printf("epoch_ahead: the joiner's epoch 2 waited for epoch 1, then both applied in order; a "
           "member's epoch 5 at epoch 0 failed the job\n");
}

/*
 * The joiner's push of epoch 2 comes before this server applied any epoch: it waits (parked).
 * Epoch 1 applies: the push is still ahead and must wait again (before the fix it was routed
 * then, dropped as a non-member's, and its round never had it: it waited for the joiner for
 * ever). Epoch 2 applies: the round sums the joiner and the two members left.
 */
static void parked_ahead(void)
{
    harness hz;
    send_ctx *u;

    joiner_start(&hz);
    progress_route(hz.srv, make_push(&hz, 3, 0, 2, 1.0f), 3);
    relay(&hz, 0, 1, 2, "1100");
    progress_route_parked(hz.srv);
    relay(&hz, 0, 2, -1, "1101");
    progress_route_parked(hz.srv);
    progress_route(hz.srv, make_push(&hz, 0, 0, 2, 1.0f), 0);
    progress_route(hz.srv, make_push(&hz, 1, 0, 2, 1.0f), 1);
    u = take_update(&hz, 1000);
    CHECK(u,
          "round 0 never closed: the joiner's push, parked while epoch 1 applied, was lost "
          "(%s)",
          job_error(&hz));
    expect_update(u, 0, 3, "round 0 of epoch 2");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 3.0f, "round 0 sums %g, not 3",
          ((const float *)(update_hdr(u) + 1))[0]);
    harness_stop(&hz);
    printf("parked_ahead: the joiner's push of epoch 2 waited through epoch 1 and counted in "
           "round 0 of epoch 2 (sum 3)\n");
}

/*
 * Server 0 of a job with parameters and a checkpoint_dir, started without worker 0 (an elastic
 * start-up where it died, or it is rejoining: its declaration is gone): worker 1 asks for a
 * checkpoint. It must be written from the job's declaration (before, worker 0's was read:
 * NULL, and the server crashed).
 */
static void checkpoint_decl(void)
{
    harness hz;
    char path[4096];
    struct stat sb;

    harness_start(&hz, &(harness_opts){.workers = 2, .servers = 1, .optimizer = 1});
    CHECK(hz.srv->workers[0].decl == NULL && hz.srv->workers[1].decl == NULL,
          "no worker's declaration is kept here");
    /* worker 1's CHECKPOINT, both phases (its connection is the harness's: no answer goes out) */
    psagg__ctl_checkpoint ck = {.sequence = 7, .phase = PSAGG_CKPT_PREPARE};
    psagg__ctl_hdr h = {.type = PSAGG_CTL_CHECKPOINT, .len = sizeof ck};
    checkpoint_asked(hz.srv, 1, &h, &ck);
    CHECK(!atomic_load(&hz.srv->job.failed), "checkpoint: %s", hz.srv->job.error);
    snprintf(path, sizeof path, "%s/psagg-server-0.ckpt.pending", hz.dir);
    CHECK(!stat(path, &sb) && sb.st_size > (off_t)(120 + 96 + 32), "checkpoint %s", path);
    ck.phase = PSAGG_CKPT_COMMIT;
    checkpoint_asked(hz.srv, 1, &h, &ck);
    CHECK(stat(path, &sb) != 0, "%s is still there after the COMMIT", path);
    snprintf(path, sizeof path, "%s/psagg-server-0.ckpt", hz.dir);
    CHECK(!stat(path, &sb) && sb.st_size > (off_t)(120 + 96 + 32), "checkpoint %s", path);
    unlink(path);
    harness_stop(&hz);
    printf("checkpoint_decl: %s written (%lld bytes) from the job's declaration, no worker's\n",
           path, (long long)sb.st_size);
}

/*
 * Server 0 of an elastic job with [server] quorum 2, grace 30 ms: workers 0-2 start it, rank 3
 * joins in epoch 1. Rounds 0 and 1 go by with workers 0-2 (round 1 without worker 2, whose
 * push of it comes late). Then rank 3 is admitted; in round 2 workers 0 and 1 push: the grace
 * passes, and the round must wait for the joiner, which never pushed (it may be left out only once
 * its push of a round before came). Its push closes the round, without worker 2.
 */
static void quorum_joiner(void)
{
    harness hz;
    send_ctx *u;
    server *srv;

    harness_start(
        &hz,
        &(harness_opts){.workers = 3, .max_workers = 4, .servers = 1, .quorum = 2, .grace_ms = 30});
    srv = hz.srv;
    for (int w = 0; w < 3; w++)
        push(&hz, w, 0, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 0, 3, "round 0, workers 0-2");
    sends_done(&hz, u);
    push(&hz, 0, 1, 1.0f);
    push(&hz, 1, 1, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 1, 2, "round 1 without worker 2 (grace passed)");
    sends_done(&hz, u);
    push(&hz, 2, 1, 1.0f); /* late: dropped, but seen (one round behind, no more) */
    /* rank 3 joins: server 0 starts epoch 1 with it live (membership.c's admission, as the
       barrier does it) */
    atomic_store(&srv->mb.member[3], 1);
    srv->mb.n++;
    atomic_store(&srv->mb.epoch, 1);
    push(&hz, 0, 2, 1.0f);
    push(&hz, 1, 2, 1.0f);
    CHECK(!(u = take_update(&hz, 300)),
          "round 2 closed without the joiner, which never pushed (summed %u)",
          update_hdr(u)->summed);
    push(&hz, 3, 2, 1.0f);
    u = take_update(&hz, 1000);
    expect_update(u, 2, 3, "round 2 once the joiner pushed (worker 2 left out)");
    CHECK(update_has(&hz, u, 3) && !update_has(&hz, u, 2), "round 2's bitmap");
    sends_done(&hz, u);
    harness_stop(&hz);
    printf("quorum_joiner: round 2 waited for the joiner's first push past its grace, then "
           "closed without the straggler\n");
}

/*
 * ([cluster] server_replicas = 1, 3 workers, 2 servers) View 1, decided and relayed by a worker
 * (failover.c applies it), moves server 1's chunk to server 0 from round 5, its rounds before
 * relay_end relayed by worker 0; more: [server] quorum and grace_ms; before: what a case does
 * to server 0's copy of the chunk before the view. Returns the chunk's slot here; *moved is
 * the chunk.
 */
static int take_over_at(harness *hz, const psagg__chunk_info **moved, uint32_t relay_end,
                        const harness_opts *more, void (*before)(harness *, chunk_state *))
{
    server *srv;
    uint8_t frame[sizeof(psagg__ctl_agree) + 256];
    psagg__ctl_agree a;
    psagg__view_hdr vh = {.epoch = 1, .n_servers = 2, .n_moves = 1};
    psagg__view_move m;
    uint32_t len;
    int slot;

    harness_start(hz, &(harness_opts){.workers = 3,
                                      .servers = 2,
                                      .replicas = 1,
                                      .quorum = more->quorum,
                                      .grace_ms = more->grace_ms,
                                      .server_ef = more->server_ef});
    srv = hz->srv;
    *moved = NULL;
    for (uint32_t i = 0; i < srv->layout.n_chunks; i++)
        if (srv->layout.chunks[i].owner == 1)
            *moved = &srv->layout.chunks[i];
    CHECK(*moved && srv->n_held == srv->n_owned + 1, "server 0 holds server 1's chunk on standby");
    CHECK(atomic_load(&srv->route[*moved - srv->layout.chunks]) < 0 || more->server_ef,
          "not routed before the view (a copy that follows its owner is)");
    for (uint32_t i = 0; i < srv->n_held && before; i++)
        if (srv->chunks[i].info == *moved)
            before(hz, &srv->chunks[i]); /* (its aggregation thread has nothing to do yet) */
    vh.n_chunks = srv->layout.n_chunks;
    vh.n_workers = vh.n_members = 3;
    len = (uint32_t)psagg__view_bytes(2, vh.n_chunks, 1, 3);
    CHECK(sizeof(psagg__ctl_agree) + len <= sizeof frame, "a view of %u chunks fits", vh.n_chunks);
    m = (psagg__view_move){.chunk = (uint32_t)(*moved - srv->layout.chunks),
                           .owner = 0,
                           .start = 5,
                           .relay_end = relay_end,
                           .relayer = 0};
    a = (psagg__ctl_agree){.kind = PSAGG_AGREE_DECIDED, .epoch = 1, .value_len = len};
    memset(frame, 0, sizeof frame); /* every chunk's owner: server 0 (0) */
    memcpy(frame, &a, sizeof a);
    memcpy(frame + sizeof a, &vh, sizeof vh);
    frame[sizeof a + sizeof vh] = 1; /* live: server 0 */
    memcpy(frame + sizeof a + psagg__view_moves_at(2, vh.n_chunks), &m, sizeof m);
    memset(frame + sizeof a + psagg__view_members_at(2, vh.n_chunks, 1), 1, 3); /* members */
    failover_view(srv, 0, &(psagg__ctl_hdr){.type = PSAGG_CTL_VIEW, .len = sizeof a + len}, frame);
    CHECK(!atomic_load(&srv->job.failed), "view 1: %s", srv->job.error);
    slot = atomic_load(&srv->route[m.chunk]);
    CHECK(slot >= 0, "the chunk is routed here (from round 5: its aggregation thread's move)");
    return slot;
}

static int take_over(harness *hz, const psagg__chunk_info **moved, uint32_t relay_end)
{
    return take_over_at(hz, moved, relay_end, &(harness_opts){0}, NULL);
}

/* The copy followed its owner through round 5 with every worker (so at round 6, each seen at
   round 5): its update of round 5 (7 per element) is the one it owes once it owns the chunk. */
static void copy_at_round_6(harness *hz, chunk_state *c)
{
    psagg__msg_hdr *h = (psagg__msg_hdr *)c->out[1];
    CHECK(c->shadow, "server 0 holds a copy of server 1's chunk (it follows its owner)");
    c->round = 6;
    for (int w = 0; w < 3; w++)
        c->seen[w] = 6;
    psagg__msg_init(h, PSAGG_MSG_UPDATE, 1, 5, c->info,
                    &hz->srv->layout.tensors[c->info->key].codec, 0);
    h->summed = 3;
    for (uint64_t i = 0; i < c->info->count; i++)
        ((float *)(h + 1))[i] = 7.0f;
}

/*
 * ([server] quorum 2, grace 20 ms, error_feedback: a stateful chunk) Server 0's copy of server 1's
 * chunk had summed round 5 when server 1 died, before worker 0 had round 5's update: server 0 owns
 * the chunk from round 5 and owes that update, sent once every worker pushed in view 1. Workers 1
 * and 2 push round 6 there; the quorum closes it without worker 0, whose push of round 5 again is
 * not in yet. Round 6 must wait (before the fix the job failed: "round 6 finished while round 5's
 * update waits for the workers to take the view", as a loaded CI machine met); then worker 0's push
 * sends round 5's update, and round 6's after it, without worker 0.
 */
static void takeover_quorum(void)
{
    harness hz;
    const psagg__chunk_info *moved;
    int slot =
        take_over_at(&hz, &moved, 5, &(harness_opts){.quorum = 2, .grace_ms = 20, .server_ef = 1},
                     copy_at_round_6);
    send_ctx *u;

    for (int w = 1; w < 3; w++)
        push_to(&hz, slot, moved, w, 6, 1, 10.0f);
    CHECK(!(u = take_update(&hz, 300)),
          "an update of round %u went out before worker 0 took view 1",
          u ? update_hdr(u)->round : 0);
    CHECK(!atomic_load(&hz.srv->job.failed), "round 6 closed before the fence: %s", job_error(&hz));
    push_to(&hz, slot, moved, 0, 5, 1, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 5, 3, "round 5's update, owed by the copy");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 7.0f, "round 5's update is the copy's");
    sends_done(&hz, u);
    u = take_update(&hz, 2000);
    expect_update(u, 6, 2, "round 6 without worker 0");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 20.0f && !update_has(&hz, u, 0),
          "round 6's sum and bitmap");
    sends_done(&hz, u);
    CHECK(!atomic_load(&hz.srv->job.failed), "%s", job_error(&hz));
    harness_stop(&hz);
    printf("takeover_quorum: round 6, closed by the quorum before worker 0 took the view, waited "
           "for it; round 5's owed update went out, then round 6's without worker 0\n");
}

/*
 * Server 0 takes server 1's chunk over from round 5 (take_over). Worker 0 had round 5's update
 * from server 1 before it died, so it pushes round 6 while the others push round 5 again: that
 * push waits for its turn instead of closing worker 0 ("push field round is 6 but ... is at
 * round 5", the failure a kill while updates go out met), and both rounds sum every worker.
 */
static void takeover_ahead(void)
{
    harness hz;
    const psagg__chunk_info *moved;
    int slot = take_over(&hz, &moved, 5);
    server *srv = hz.srv;
    send_ctx *u;

    push_to(&hz, slot, moved, 0, 6, 1, 10.0f);
    for (int w = 0; w < 3; w++)
        push_to(&hz, slot, moved, w, 5, 1, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 5, 3, "round 5 summed again");
    CHECK(!srv->workers[0].bad_reason[0], "worker 0 closed: %s", srv->workers[0].bad_reason);
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 3.0f, "round 5's sum");
    sends_done(&hz, u);
    for (int w = 1; w < 3; w++)
        push_to(&hz, slot, moved, w, 6, 1, 10.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 6, 3, "round 6 with worker 0's early push");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 30.0f, "round 6's sum");
    sends_done(&hz, u);
    harness_stop(&hz);
    printf("takeover_ahead: a push of the round after the one summed again waited for it; both "
           "rounds sum all 3 workers\n");
}

/* Worker w's STATE RELAY of chunk ci's update of `round` (each element `value`, summing 3) to
   server 0 in view 1; out_round: the round its update's header says. */
static void relay_from(harness *hz, int w, const psagg__chunk_info *ci, uint32_t round,
                       uint32_t out_round, float value)
{
    size_t len = sizeof(psagg__msg_hdr) + ci->enc_bytes;
    psagg__ctl_state sh = {.kind = PSAGG_STATE_RELAY,
                           .server = 0,
                           .epoch = 1,
                           .chunk = (uint32_t)(ci - hz->srv->layout.chunks),
                           .round = round,
                           .out_len = (uint32_t)len};
    uint8_t *frame = calloc(1, sizeof sh + len);
    psagg__msg_hdr *mh = (psagg__msg_hdr *)(frame + sizeof sh);
    CHECK(frame, "out of memory");
    memcpy(frame, &sh, sizeof sh);
    psagg__msg_init(mh, PSAGG_MSG_UPDATE, 1, out_round, ci, &hz->srv->layout.tensors[ci->key].codec,
                    0);
    mh->summed = 3;
    for (uint64_t i = 0; i < ci->count; i++)
        ((float *)(mh + 1))[i] = value;
    failover_state(hz->srv, w,
                   &(psagg__ctl_hdr){.type = PSAGG_CTL_STATE, .len = (uint32_t)(sizeof sh + len)},
                   frame);
    free(frame);
}

/*
 * Server 0 takes server 1's chunk over from round 5 with round 5 relayed (take_over): workers
 * 0 and 1 had round 5's update from server 1 before it died, worker 2 not. Round 5 is not summed
 * here: its update is the one worker 0 relays (7 per element, where the pushes would sum to 3),
 * which goes out, from server 0, once it came and every worker pushed in view 1 (the sign that
 * it took the view), not before either. A relay of a round not relayed is dropped; one whose
 * update is of another round closes its worker. Round 6 is summed as any.
 */
static void takeover_relay(void)
{
    harness hz;
    const psagg__chunk_info *moved;
    int slot = take_over(&hz, &moved, 6);
    server *srv = hz.srv;
    send_ctx *u;

    for (int w = 0; w < 2; w++)
        push_to(&hz, slot, moved, w, 5, 1, 1.0f);
    relay_from(&hz, 0, moved, 7, 7, 9.0f); /* (not a relayed round: dropped) */
    relay_from(&hz, 0, moved, 5, 5, 7.0f);
    CHECK(!take_update(&hz, 300) && !srv->workers[0].bad_reason[0],
          "round 5's update went out before worker 2 pushed in view 1, or worker 0 was closed: %s",
          srv->workers[0].bad_reason);
    push_to(&hz, slot, moved, 2, 5, 1, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 5, 3, "round 5 relayed");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 7.0f && update_hdr(u)->sender == 0,
          "round 5's update is the relayed one (%g), from server 0 (%u)",
          (double)((const float *)(update_hdr(u) + 1))[0], update_hdr(u)->sender);
    sends_done(&hz, u);
    for (int w = 0; w < 3; w++)
        push_to(&hz, slot, moved, w, 6, 1, 10.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 6, 3, "round 6, not relayed");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 30.0f, "round 6's sum");
    sends_done(&hz, u);
    relay_from(&hz, 1, moved, 6, 5, 7.0f); /* (its header says round 5: a bad frame) */
    CHECK(strstr(srv->workers[1].bad_reason, "STATE RELAY"), "worker 1 not closed: '%s'",
          srv->workers[1].bad_reason);
    harness_stop(&hz);
    printf("takeover_relay: round 5's relayed update (7, not the pushes' 3) went out once it came "
           "and every worker pushed in the view; round 6 summed as any; a relay of another "
           "round dropped, a bad one closed its worker\n");
}

static void quorum_drop_all(void)
{
    harness hz;
    send_ctx *u;
    server *srv;

    harness_start(
        &hz,
        &(harness_opts){.workers = 3, .max_workers = 3, .servers = 1, .quorum = 1, .grace_ms = 20});
    srv = hz.srv;
    for (int w = 0; w < 3; w++)
        push(&hz, w, 0, 1.0f);
    u = take_update(&hz, 2000);
    expect_update(u, 0, 3, "round 0");
    sends_done(&hz, u);
    srv->pool.rx_hold_max = 8;           /* (the pool's half: the harness has no pool) */
    push(&hz, 1, 1, __builtin_nanf("")); /* held (worker 0 is next); checked as the grace ends */
    CHECK(!take_update(&hz, 300), "round 1 went out with only a bad push");
    CHECK(strstr(srv->workers[1].bad_reason, "payload"),
          "worker 1 not closed naming the payload: '%s'", srv->workers[1].bad_reason);
    atomic_store(&srv->mb.member[1], 0); /* (what the control loop does with the closing) */
    srv->mb.n--;
    atomic_store(&srv->mb.epoch, 1);
    agg_settle_routed(srv);
    push(&hz, 0, 1, 1.0f);
    push(&hz, 2, 1, 2.0f);
    u = take_update(&hz, 2000);
    CHECK(u, "round 1 never closed after its dropped push (%s)", job_error(&hz));
    expect_update(u, 1, 2, "round 1 without the dropped push");
    CHECK(((const float *)(update_hdr(u) + 1))[0] == 3.0f && update_has(&hz, u, 0) &&
              !update_has(&hz, u, 1) && update_has(&hz, u, 2),
          "round 1 sums %g (not 3) or names the wrong workers",
          (double)((const float *)(update_hdr(u) + 1))[0]);
    sends_done(&hz, u);
    harness_stop(&hz);
    printf("quorum_drop_all: a round whose only push was bad (dropped at the close) opened again "
           "and summed the two live workers\n");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"quorum_deferred", quorum_deferred}, {"quorum_rearm", quorum_rearm},
                 {"epoch_ahead", epoch_ahead},         {"parked_ahead", parked_ahead},
                 {"quorum_joiner", quorum_joiner},     {"checkpoint_decl", checkpoint_decl},
                 {"takeover_ahead", takeover_ahead},   {"takeover_relay", takeover_relay},
                 {"takeover_quorum", takeover_quorum}, {"quorum_drop_all", quorum_drop_all}};
    int ran = 0;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || !strcmp(argv[1], cases[i].name)) {
            cases[i].fn();
            ran++;
        }
    CHECK(ran, "no case named '%s'", argc > 1 ? argv[1] : "");
    return 0;
}
