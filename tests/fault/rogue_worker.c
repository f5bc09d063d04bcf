/*
 * rogue_worker.c - a process that speaks psagg's protocol itself (control channel + libfabric)
 * and misbehaves, for the fault tests (test_fault.sh, fault_matrix.sh).
 *
 *   --mode magic|len|key|round|nan|topk-index
 *                                authenticate as worker PSAGG_RANK, then send one bad push
 *                                (nan: a NaN in the payload, found as the server folds it,
 *                                from its receive buffer or its slot; topk-index: tensors in
 *                                topk2:13/256, a push whose first two indices are swapped,
 *                                beside fn_worker --codec topk2:13/256); the server must close
 *                                this worker with a reason naming the field (checked here)
 *                                and stay up
 *   --mode epoch-ahead           in an elastic job: authenticate, declare, send 200 copies of
 *                                a push stamped with epoch 1 while the job is at epoch 0 (the
 *                                server parks them for an epoch that never comes, holding its
 *                                receive buffers) and keep PINGing: the server must close this
 *                                worker naming the field epoch (1.5 x op_timeout_ms later), or
 *                                its missing push when a round's deadline comes first
 *   --mode dup                   authenticate, send every push of round 0 and the first one
 *                                twice; the server must drop the duplicate, finish the round
 *   --mode spoof --fabric-port P [--seconds S] [--claim W] [--rounds R]
 *                                never authenticate: open a fabric endpoint of its own, aim
 *                                at the server's fabric port P on 127.0.0.1 (an attacker
 *                                finds it among the server's listening ports), and for S
 *                                seconds push poisoned contributions (1e6 everywhere) of
 *                                rounds 0..R-1 claiming to be worker W; the job's sums must
 *                                stay exact
 *   --mode stale [--rounds R]    in a job with [codec] adaptive = on: authenticate, declare
 *                                what `fn_worker --codec maxmin4` declares there (its three
 *                                tensors and the statistics tensor), push rounds 0..R-1 of
 *                                them and round 0's statistics (zeros), always in the declared
 *                                codec and generation 0, as a worker that never applies an
 *                                assignment would; the server must close this worker at round
 *                                2 (generation 1) with a reason that says "stale assignment"
 *   --mode param-lr|param-kind|param-early
 *                                in a job with [server] optimizer: authenticate, declare the
 *                                three tensors as parameters, then send one push of a
 *                                parameter whose trailer is bad (lr NaN; kind 3) or a gradient
 *                                before its INIT; the server must close this worker naming the
 *                                field ("lr", "kind") or the cause ("before its INIT")
 *   --mode local-desc            offer same-host copies truly (its pid, its fabric name's
 *                                address); the server must take the offer (WELCOME says it
 *                                reads this worker), then gets a descriptor of 4096 bytes at
 *                                an address this process has not mapped: it must close this
 *                                worker with a reason that says "same-host copy"
 *   --mode local-pid             offer same-host copies as pid 1 (not this process): the
 *                                server must not take it, and the job goes on as with dup
 *   --mode local-third           offer same-host copies naming a third process (a helper
 *                                this one starts, which holds this process's fabric name at
 *                                the offered address, but not its secret): the server must
 *                                not take it, and the job goes on as with dup
 *   --mode relay --listen P --to-port Q --record FILE
 *                                a man in the middle of one worker's control connection:
 *                                accept one connection on 127.0.0.1:P, connect to
 *                                127.0.0.1:Q, forward both ways until either side closes,
 *                                and write the worker's HELLO frame (header and body) to FILE
 *   --mode mitm --listen P --to-port Q [--seconds S] [--claim V]
 *                                a man in the middle of one worker's control connection (as
 *                                relay), who has no key: S seconds (3) after the server's
 *                                READY it injects toward the server a MEMBERSHIP of epoch 1
 *                                removing worker V (1), a BYE, and a replay of the worker's
 *                                latest frame, and toward the worker an ABORT; with a secret
 *                                each must be refused by name (its tag does not check out)
 *                                and the job go on as if nothing had come
 *   --mode misdirect             in a job of 2 servers with data_auth: authenticate and declare
 *                                at both, send server 1 a push sealed for server 0 (as one
 *                                captured on its way there), then round 0's pushes, then one
 *                                of them again (a replay); each copy must be dropped by name,
 *                                nobody closed, the round's sums exact
 *   --mode replay --record FILE --server K
 *                                send the HELLO in FILE to server K on a connection of its own
 *                                (after reading its CHALLENGE); print the answer
 *                                (ROGUE-REFUSED: message) and exit 0 when it was refused, 1
 *                                when it was welcomed
 *   --mode membership-skip|membership-server0
 *                                in an elastic job with 2 servers: authenticate and declare at
 *                                both, then send a forged MEMBERSHIP frame (removing worker 0):
 *                                of epoch 5 to server 1, which must fail the job ("an epoch was
 *                                skipped"), or to server 0, which must close this worker ("decides
 *                                the membership itself") and go on without it
 *   --mode join-flood --count N [--seconds S]
 *                                in a running elastic job with a secret, as worker `rank` (a
 *                                rank that left): first a HELLO made with the job's secret for
 *                                one connection's CHALLENGE, sent on a second connection (a
 *                                replay of that joiner's HELLO), then N HELLOs whose token was
 *                                made with a wrong secret, each on a connection of its own, at
 *                                most S seconds in all; every one must be refused: prints
 *                                ROGUE-FLOOD: refused/sent and the first refusals, exits 0 when
 *                                all were refused, 1 when any was welcomed
 *   --mode hello-die [--server K]
 *                                authenticate as worker `rank` at server K only (default 0),
 *                                then exit: a worker that dies during an elastic job's
 *                                start-up between its HELLO to server 0 and its HELLO to the
 *                                others, which never hear of it
 *   --mode bomb --count N [--chunk-elems C]
 *                                authenticate, then declare one fp32 tensor of N elements in
 *                                chunks of C (default: the config's); print the server's
 *                                refusal (ROGUE-REFUSED: message) and exit 0 if it refused
 *
 * The authenticated modes declare what fn_worker declares by default (tensors of 1, 1023 and
 * 4096 elements, fp32) and contribute the same values (fn_input.h), so fn_worker's exact-sum
 * check covers them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "fn_input.h"
#include "kernels/codec.h"
#include "runtime/adaptive.h"
#include "runtime/auth.h"
#include "runtime/config.h"
#include "runtime/channel.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "rogue: " __VA_ARGS__);                                                    \
        fprintf(stderr, ": %s\n", psagg_last_error());                                             \
        exit(1);                                                                                   \
    } while (0)

static psagg__config cfg;
static const uint64_t sizes[] = {1, 1023, 4096};

/* Each connection's control-frame authentication (off until its WELCOME: hello_to). */
static psagg__ctl_auth fd_auth[1024];
#define AUTH(fd) (&fd_auth[(fd)&1023])

/* The next control frame that is not a PING (the server's "still here" while the job runs). */
static psagg_status recv_no_ping(int fd, psagg__ctl_hdr *h, void **body)
{
    psagg_status st;
    while (((st = psagg__ctl_recv(fd, AUTH(fd), h, body, psagg__now_ms() + 20000, "server 0")) ==
            PSAGG_EAGAIN) ||
           (!st && h->type == PSAGG_CTL_PING)) {
        free(*body);
        *body = NULL;
    }
    return st;
}

static void *recv_frame(int fd, uint16_t want, const char *what)
{
    psagg__ctl_hdr h;
    void *body = NULL;
    if (recv_no_ping(fd, &h, &body))
        DIE("waiting for %s", what);
    if (h.type != want) {
        fprintf(stderr, "rogue: expected %s, got frame type %u: %s\n", what, h.type,
                h.type == PSAGG_CTL_ERROR ? ((psagg__ctl_error *)body)->msg : "");
        exit(1);
    }
    return body;
}

static psagg__fabric *open_fabric(const char *node)
{
    psagg__fabric_opts fo = {.provider = cfg.provider, .node = node};
    psagg__fabric *fab;
    fo.max_msg = psagg__max_message(&cfg); /* as psagg itself: rxm peers must agree */
    if (psagg__fabric_open(&fo, &fab))
        DIE("fabric");
    return fab;
}

/* A DECLARE frame's body: the header and up to four tensors. */
typedef struct fn_declare {
    psagg__ctl_declare d;
    psagg__ctl_tensor t[4];
} fn_declare;

/*
 * What fn_worker declares with `codec` (its default three tensors t000..t002) and, in a job
 * with [codec] adaptive (`adaptive`), the statistics tensor libpsagg adds last; and the layout
 * every process derives from it.
 */
static uint32_t decl_flags; /* the param-* modes: PSAGG_DECL_PARAM on every tensor */

static void fn_tensors(const psagg_codec *codec, int adaptive, fn_declare *m, psagg__layout *layout)
{
    psagg_codec c = *codec, fp32 = {.id = PSAGG_CODEC_FP32};
    *m = (fn_declare){.d = {.count = 3, .chunk_elems = psagg__chunk_elems(&cfg)}};
    if (psagg__codec_check(&c))
        DIE("codec");
    for (int t = 0; t < 3; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%03d", t);
        if (psagg__tensor_to_wire(name, sizes[t], &c, &m->t[t]))
            DIE("tensor %d", t);
        m->t[t].flags = decl_flags;
    }
    if (adaptive) { /* as psagg_declare does it */
        m->d.count = 4;
        m->d.adapt_interval = (uint32_t)cfg.adaptive_interval;
        m->d.adapt_budget = cfg.adaptive_budget;
        m->d.adapt_flags = (cfg.adaptive_budget_bits ? PSAGG_ADAPT_BUDGET_BITS : 0) |
                           (cfg.error_feedback ? PSAGG_ADAPT_WORKER_EF : 0);
        if (psagg__tensor_to_wire(PSAGG_ADAPT_STATS_NAME, 3 * PSAGG_ADAPT_MAX_BUCKETS, &fp32,
                                  &m->t[3]))
            DIE("tensor 3");
    }
    if (psagg__layout_build(m->t, m->d.count, m->d.chunk_elems, (uint32_t)cfg.n_servers,
                            m->d.adapt_interval, layout))
        DIE("layout");
}

static int local_offer; /* 1: offer same-host copies truly, 2: as pid 1, 3: as a third process */
static pid_t helper_pid;
static uint64_t helper_probe;

/* local-third's helper: hold [32 bytes that are not the secret][name] and wait to be killed. */
static int hold(const char *hex)
{
    static uint8_t buf[32 + PSAGG_EPNAME_MAX];
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n && i < PSAGG_EPNAME_MAX; i++)
        sscanf(hex + 2 * i, "%2hhx", &buf[32 + i]);
    printf("%llu\n", (unsigned long long)(uintptr_t)buf);
    fflush(stdout);
    pause();
    return 0;
}

/* Start the helper holding this process's fabric name; its pid and probe. */
static void start_helper(psagg__fabric *fab)
{
    uint8_t name[PSAGG_EPNAME_MAX];
    char hex[2 * PSAGG_EPNAME_MAX + 1], line[64];
    size_t len = sizeof name;
    int pfd[2];
    FILE *in;
    if (psagg__fabric_name(fab, name, &len) || pipe(pfd))
        DIE("helper set-up");
    for (size_t i = 0; i < len; i++)
        snprintf(hex + 2 * i, 3, "%02x", name[i]);
    helper_pid = fork();
    if (helper_pid < 0)
        DIE("fork");
    if (helper_pid == 0) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        dup2(pfd[1], 1);
        if (n > 0) {
            self[n] = '\0';
            execl(self, self, "--mode", "hold", "--hex", hex, (char *)NULL);
        }
        _exit(127);
    }
    close(pfd[1]);
    in = fdopen(pfd[0], "r");
    if (!in || !fgets(line, sizeof line, in))
        DIE("the helper said nothing");
    helper_probe = strtoull(line, NULL, 10);
}
static uint32_t welcome_local;      /* the WELCOME's local_flags */
static psagg__data_key push_key[8]; /* per server: this worker's pushes' key (data_auth) */

/* Authenticate as worker `rank` with the job's secret (if any); the connection's fd. */
static int hello_to(psagg__fabric *fab, uint32_t rank, int k, psagg__peer *server);

static int hello(psagg__fabric *fab, uint32_t rank, psagg__peer *server)
{
    return hello_to(fab, rank, 0, server);
}

/* Authenticate as worker `rank` at server k (its WELCOME's endpoint in *server). */
static int hello_to(psagg__fabric *fab, uint32_t rank, int k, psagg__peer *server)
{
    psagg__ctl_hello h = {.rank = rank, .world_size = (uint32_t)cfg.n_workers};
    psagg__ctl_welcome *wel;
    psagg__job_key key;
    size_t len = sizeof h.epname;
    int fd;

    psagg__ctl_challenge *ch;
    if (psagg__tcp_connect(&cfg.servers[k], psagg__now_ms() + 20000, "server", NULL, &fd))
        DIE("connect");
    memset(AUTH(fd), 0, sizeof *AUTH(fd)); /* (a new connection: nothing tagged yet) */
    ch = recv_frame(fd, PSAGG_CTL_CHALLENGE, "CHALLENGE");
    if (psagg__fabric_name(fab, h.epname, &len))
        DIE("fabric name");
    snprintf(h.job_id, sizeof h.job_id, "%s", cfg.job_id);
    snprintf(h.provider, sizeof h.provider, "%s", psagg__fabric_provider(fab));
    h.epname_len = (uint32_t)len;
    h.flags = cfg.data_auth ? PSAGG_HELLO_DATA_AUTH : 0;
    if (local_offer) {
        uint32_t pid;
        psagg__fabric_local_self(fab, &pid, &h.local_probe, h.local_commit);
        h.local_pid = local_offer == 1 ? pid : 1;
        if (local_offer == 3) { /* the helper has the name where the offer says, not the secret */
            h.local_pid = (uint32_t)helper_pid;
            h.local_probe = helper_probe;
        }
    }
    if (psagg__job_key_load(&cfg, &key))
        DIE("secret");
    psagg__nonce_make(h.nonce);
    psagg__hello_token(&key, &h, (uint32_t)k, ch->challenge, h.auth);
    free(ch);
    if (psagg__ctl_send(fd, AUTH(fd), PSAGG_CTL_HELLO, &h, sizeof h))
        DIE("hello");
    wel = recv_frame(fd, PSAGG_CTL_WELCOME, "WELCOME");
    if (psagg__fabric_add_peer(fab, wel->epname, wel->epname_len, server))
        DIE("add server");
    /* as a worker: every frame from now on tagged with this connection's keys */
    psagg__ctl_auth_make(&key, h.auth, h.nonce, wel->nonce, (uint32_t)k, 0, AUTH(fd));
    if (k < 8)
        psagg__push_key_make(&key, cfg.job_id, h.nonce, wel->nonce, (uint32_t)k, &push_key[k]);
    welcome_local = wel->local_flags;
    free(wel);
    return fd;
}

#define N_RBUF     8
#define RBUF_BYTES (1u << 16)

/* Send the DECLARE, wait for READY, and post N_RBUF receive buffers for the updates. */
static void declare(psagg__fabric *fab, int fd, const fn_declare *m, uint8_t *rbuf[N_RBUF])
{
    if (psagg__ctl_send(fd, AUTH(fd), PSAGG_CTL_DECLARE, m,
                        sizeof m->d + m->d.count * sizeof m->t[0]))
        DIE("declare");
    free(recv_frame(fd, PSAGG_CTL_READY, "READY"));
    for (int i = 0; i < N_RBUF; i++) {
        rbuf[i] = malloc(RBUF_BYTES);
        if (!rbuf[i] || psagg__fabric_post_recv(fab, rbuf[i], RBUF_BYTES, NULL, rbuf[i]))
            DIE("post a receive");
    }
}

/*
 * membership-skip / membership-server0: authenticate as worker `rank` at every server of an
 * elastic job and declare, then send a MEMBERSHIP frame of every worker alive: of epoch 5 to
 * server 1 (skip: it is at epoch 0, so the job must fail saying an epoch was skipped), or of
 * epoch 1 to server 0 (server0: which decides the membership itself, so it must close this
 * worker). Prints the answer (ROGUE-REFUSED: message) and exits 0 when it names the cause.
 */
static int membership(uint32_t rank, int skip)
{
    psagg__fabric *fab = open_fabric("127.0.0.1");
    psagg_codec fp32 = {.id = PSAGG_CODEC_FP32};
    fn_declare decl;
    psagg__layout layout;
    psagg__peer server;
    int fd[PSAGG_MAX_SERVERS], to = skip ? 1 : 0;
    size_t len = sizeof(psagg__ctl_membership) + (size_t)cfg.n_workers;
    psagg__ctl_membership *m = calloc(1, len);
    const char *want = skip ? "an epoch was skipped" : "decides the membership itself";

    if (!m || cfg.n_servers < 2)
        DIE("membership modes need memory and 2 servers");
    fn_tensors(&fp32, 0, &decl, &layout);
    for (int k = 0; k < cfg.n_servers; k++) {
        fd[k] = hello_to(fab, rank, k, &server);
        if (psagg__ctl_send(fd[k], AUTH(fd[k]), PSAGG_CTL_DECLARE, &decl,
                            sizeof decl.d + decl.d.count * sizeof decl.t[0]))
            DIE("declare");
    }
    for (int k = 0; k < cfg.n_servers; k++)
        free(recv_frame(fd[k], PSAGG_CTL_READY, "READY"));
    m->epoch = skip ? 5 : 1;
    m->n_workers = (uint32_t)cfg.n_workers;
    m->n_live = (uint32_t)cfg.n_workers - 1;
    m->left = 0; /* a forged removal of worker 0 */
    snprintf(m->why, sizeof m->why, "rogue says so");
    memset(m + 1, 1, (size_t)cfg.n_workers);
    ((uint8_t *)(m + 1))[0] = 0;
    if (psagg__ctl_send(fd[to], AUTH(fd[to]), PSAGG_CTL_MEMBERSHIP, m, (uint32_t)len))
        DIE("send MEMBERSHIP");
    printf("ROGUE: sent membership epoch %u to server %d\n", m->epoch, to);
    free(m);
    for (;;) { /* the verdict: server `to`'s ERROR (closed) or ABORT (the job failed) */
        psagg__ctl_hdr h;
        void *body = NULL;
        const char *text = "";
        if (recv_no_ping(fd[to], &h, &body))
            DIE("waiting for the verdict on the MEMBERSHIP frame");
        if (h.type == PSAGG_CTL_ERROR || h.type == PSAGG_CTL_ABORT) {
            psagg__ctl_error *e = body;
            e->msg[sizeof e->msg - 1] = '\0';
            text = e->msg;
            printf("ROGUE-REFUSED: %s\n", text);
            int ok = strstr(text, want) != NULL;
            free(body);
            for (int k = 0; k < cfg.n_servers; k++)
                close(fd[k]);
            psagg__layout_free(&layout);
            psagg__fabric_close(fab);
            return ok ? 0 : 1;
        }
        free(body);
    }
}

/* spoof: push poisoned contributions of every chunk without ever saying HELLO. */
static int spoof(int port, double seconds, uint32_t claim, uint32_t rounds)
{
    psagg__fabric *fab = open_fabric("127.0.0.1");
    psagg_codec fp32 = {.id = PSAGG_CODEC_FP32};
    fn_declare decl;
    psagg__layout layout;
    uint8_t name[PSAGG_FABRIC_NAME_MAX];
    size_t len = sizeof name;
    struct sockaddr_in *sin = (struct sockaddr_in *)(void *)name;
    psagg__peer server;
    uint8_t *msg;
    uint64_t sent = 0, refused = 0;
    int64_t until = psagg__now_ms() + (int64_t)(seconds * 1000);

    /* tcp's endpoint names are sockaddr_in: ours, with the server's port */
    if (psagg__fabric_name(fab, name, &len) || len != sizeof *sin || sin->sin_family != AF_INET)
        DIE("expected a sockaddr_in endpoint name (tcp provider), got %zu bytes", len);
    sin->sin_port = htons((uint16_t)port);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (psagg__fabric_add_peer(fab, name, len, &server))
        DIE("add the server's address");
    fn_tensors(&fp32, 0, &decl, &layout);
    /* one buffer per message of a pass: a buffer is not touched again before the next pass */
    size_t stride = sizeof(psagg__msg_hdr) + layout.max_enc_bytes + PSAGG_MSG_MAC_BYTES;
    msg = calloc((size_t)rounds * layout.n_chunks, stride);
    if (!msg)
        DIE("memory");
    while (psagg__now_ms() < until) {
        for (uint32_t r = 0; r < rounds; r++)
            for (uint32_t c = 0; c < layout.n_chunks; c++) {
                const psagg__chunk_info *ci = &layout.chunks[c];
                uint8_t *m = msg + ((size_t)r * layout.n_chunks + c) * stride;
                float *x = (float *)(void *)(m + sizeof(psagg__msg_hdr));
                psagg__msg_init((psagg__msg_hdr *)m, PSAGG_MSG_PUSH, claim, r, ci,
                                &layout.tensors[ci->key].codec, 0);
                for (uint64_t i = 0; i < ci->count; i++)
                    x[i] = 1e6f;
                /* never wait: a server that does not drain us (not started, gone) is no hang */
                if (psagg__fabric_try_send(fab, server, m, sizeof(psagg__msg_hdr) + ci->enc_bytes,
                                           NULL, NULL))
                    refused++;
                else
                    sent++;
            }
        for (int i = 0; i < 20; i++) { /* drive progress, drop what completes */
            psagg__fabric_event ev[16];
            if (psagg__fabric_poll(fab, ev, 16, 5) < 0)
                break;
        }
    }
    printf("rogue: sent %llu spoofed pushes claiming worker %u (%llu not accepted by libfabric)\n",
           (unsigned long long)sent, claim, (unsigned long long)refused);
    printf("ROGUE-OK\n");
    free(msg);
    psagg__layout_free(&layout);
    psagg__fabric_close(fab);
    return 0;
}

/* Wait for n updates (or fail on an ERROR frame from the server: *closed gets its text). */
static int await_updates(psagg__fabric *fab, int fd, int n, char *closed, size_t len)
{
    while (n > 0) {
        psagg__fabric_event ev[8];
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int k = psagg__fabric_poll(fab, ev, 8, 20);
        for (int i = 0; i < k; i++)
            if (ev[i].kind == PSAGG_FABRIC_RECV_DONE) {
                n--;
                if (psagg__fabric_post_recv(fab, ev[i].ctx, RBUF_BYTES, NULL, ev[i].ctx))
                    DIE("post a receive");
            } else if (ev[i].kind != PSAGG_FABRIC_SEND_DONE) {
                DIE("fabric: %s", ev[i].msg);
            }
        if (poll(&p, 1, 0) > 0) {
            /* one frame, whatever it is: a PING must not make this wait for the next frame
               (recv_no_ping would), as the updates would then lie unread until the server
               gave this worker up */
            psagg__ctl_hdr ch;
            psagg__ctl_error *e = NULL;
            psagg_status st = psagg__ctl_recv(fd, AUTH(fd), &ch, (void **)&e,
                                              psagg__now_ms() + 20000, "server 0");
            if (st == PSAGG_EAGAIN || (!st && ch.type == PSAGG_CTL_PING)) {
                free(e);
                continue;
            }
            if (st || !e || (ch.type != PSAGG_CTL_ERROR && ch.type != PSAGG_CTL_ABORT))
                DIE("expected an ERROR frame");
            snprintf(closed, len, "%s", e->msg);
            free(e);
            return -1;
        }
    }
    return 0;
}

/* stale: an adaptive job's worker that never applies an assignment (see the top). */
static int stale(uint32_t rank, uint32_t rounds)
{
    psagg__fabric *fab = open_fabric("127.0.0.1");
    psagg__peer server;
    psagg_codec m4 = {PSAGG_CODEC_MAXMIN, 4, 0, PSAGG_ROUND_STOCHASTIC, 0};
    fn_declare m;
    psagg__layout layout;
    uint8_t *msg, *rbuf[N_RBUF];
    float *x;
    char closed[300] = "";
    int fd = hello(fab, rank, &server), ok = 0;

    fn_tensors(&m4, 1, &m, &layout);
    declare(fab, fd, &m, rbuf);
    msg = malloc(sizeof(psagg__msg_hdr) + layout.max_enc_bytes);
    x = calloc(4096, sizeof *x);
    if (!msg || !x)
        DIE("memory");
    for (uint32_t r = 0; r < rounds && !closed[0]; r++) {
        int sent = 0;
        for (uint32_t c = 0; c < layout.n_chunks; c++) {
            const psagg__chunk_info *ci = &layout.chunks[c];
            const psagg_codec *codec = &layout.tensors[ci->key].codec;
            psagg__msg_hdr *h = (psagg__msg_hdr *)msg;
            if (ci->key == 3 && r > 0)
                continue; /* the statistics go once, zeros, in round 0 */
            for (uint64_t i = 0; i < ci->count; i++)
                x[i] = ci->key == 3 ? 0.0f : input_value((int)rank, ci->key, r, ci->offset + i);
            psagg__msg_init(h, PSAGG_MSG_PUSH, rank, r, ci, codec, 0);
            if (psagg__encode(
                    codec, x, NULL, ci->count,
                    psagg__rng_chunk_key(cfg.seed, PSAGG_RNG_WORKER, rank, ci->key, ci->index, r),
                    h + 1, h->len, NULL) ||
                psagg__fabric_send(fab, server, msg, sizeof *h + h->len, NULL, NULL))
                DIE("push");
            sent++;
        }
        printf("rogue: pushed round %u in the declared codec, generation 0\n", r);
        await_updates(fab, fd, sent, closed, sizeof closed);
    }
    if (closed[0]) {
        printf("rogue: server closed this worker: %s\n", closed);
        ok = strstr(closed, "stale assignment") != NULL;
    } else {
        fprintf(stderr, "rogue: %u rounds on a stale assignment went through\n", rounds);
    }
    close(fd);
    psagg__fabric_close(fab);
    psagg__layout_free(&layout);
    for (int i = 0; i < N_RBUF; i++)
        free(rbuf[i]);
    free(msg), free(x);
    if (ok)
        printf("ROGUE-OK\n");
    return ok ? 0 : 1;
}

/* bomb: one huge tensor in one DECLARE; the server must refuse it, and say why. */
static int bomb(uint32_t rank, uint64_t count, uint64_t chunk_elems)
{
    psagg__fabric *fab = open_fabric("127.0.0.1");
    psagg__peer server;
    struct {
        psagg__ctl_declare d;
        psagg__ctl_tensor t;
    } m = {.d = {.count = 1, .chunk_elems = chunk_elems ? chunk_elems : psagg__chunk_elems(&cfg)}};
    psagg_codec fp32 = {.id = PSAGG_CODEC_FP32};
    psagg__ctl_hdr h;
    void *body = NULL;
    const char *why = NULL;
    int fd = hello(fab, rank, &server), refused = 0;

    if (psagg__tensor_to_wire("bomb", count, &fp32, &m.t))
        DIE("tensor");
    if (psagg__ctl_send(fd, AUTH(fd), PSAGG_CTL_DECLARE, &m, sizeof m))
        DIE("declare");
    if (psagg__ctl_recv(fd, AUTH(fd), &h, &body, psagg__now_ms() + 20000, "server 0") == PSAGG_OK &&
        psagg__ctl_error_parse(&h, body, &why) != PSAGG_OK) {
        printf("ROGUE-REFUSED: %s\n", why);
        refused = 1;
    } else {
        fprintf(stderr, "rogue: the server did not refuse the declaration (frame type %u)\n",
                h.type);
    }
    free(body);
    close(fd);
    psagg__fabric_close(fab);
    return refused ? 0 : 1;
}

static int tcp_listen_port(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4))
        DIE("listen on %d", port);
    return fd;
}

/* Connect to 127.0.0.1:port, retrying a refused connection for 20 s (a server still starting). */
static int tcp_connect_port(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int64_t until = psagg__now_ms() + 20000;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            DIE("socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        close(fd);
        if (errno != ECONNREFUSED || psagg__now_ms() > until)
            DIE("connect to %d: %s", port, strerror(errno));
        usleep(50000);
    }
}

/* relay: forward one worker's control connection, recording its HELLO. */
static int relay(int listen_port, int to_port, const char *record)
{
    int lfd = tcp_listen_port(listen_port), w, s;
    uint8_t hello[sizeof(psagg__ctl_hdr) + sizeof(psagg__ctl_hello)];
    size_t have = 0;
    printf("ROGUE-RELAY: listening on %d\n", listen_port);
    w = accept(lfd, NULL, NULL);
    if (w < 0)
        DIE("accept");
    s = tcp_connect_port(to_port);
    for (;;) {
        struct pollfd p[2] = {{.fd = w, .events = POLLIN}, {.fd = s, .events = POLLIN}};
        uint8_t buf[65536];
        if (poll(p, 2, -1) < 0)
            break;
        for (int i = 0; i < 2; i++) {
            ssize_t n;
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            n = read(p[i].fd, buf, sizeof buf);
            if (n <= 0)
                return 0;                        /* either side closed: done */
            if (i == 0 && have < sizeof hello) { /* the worker's first bytes: its HELLO */
                size_t take = (size_t)n < sizeof hello - have ? (size_t)n : sizeof hello - have;
                memcpy(hello + have, buf, take);
                have += take;
                if (have == sizeof hello) {
                    FILE *f = fopen(record, "wb");
                    if (!f || fwrite(hello, 1, have, f) != have || fclose(f))
                        DIE("writing %s", record);
                    printf("ROGUE-RECORDED: a HELLO of %zu bytes\n", have);
                }
            }
            for (ssize_t off = 0; off < n;) {
                ssize_t m = write(p[1 - i].fd, buf + off, (size_t)(n - off));
                if (m <= 0)
                    return 0;
                off += m;
            }
        }
    }
    return 0;
}

/*
 * misdirect: in a job of 2 servers with data_auth, as worker `rank` (fn_worker's tensors and
 * values, round 0): seal each push for its owner, and first send server 1 a copy of a push
 * sealed for server 0 (a push captured on its way to server 0 and replayed to server 1), then
 * the genuine pushes, then the push for server 0 a second time (a replay). Server 1 must drop
 * the misdirected copy (its MAC is server 0's) and server 0 the replay (its number came
 * before), naming them, and close nobody: this worker gets its 3 updates and says BYE.
 */
static int misdirect(uint32_t rank)
{
    psagg__fabric *fab = open_fabric("127.0.0.1");
    psagg_codec fp32 = {.id = PSAGG_CODEC_FP32};
    fn_declare decl;
    psagg__layout layout;
    psagg__peer srv[2];
    uint64_t seq[2] = {0};
    uint8_t *push[3], *rbuf[N_RBUF];
    size_t bytes[3];
    int fd[2], to0 = -1;

    if (cfg.n_servers != 2 || !cfg.data_auth)
        DIE("misdirect wants a job of 2 servers with data_auth");
    for (int k = 0; k < 2; k++)
        fd[k] = hello_to(fab, rank, k, &srv[k]);
    fn_tensors(&fp32, 0, &decl, &layout);
    for (int k = 0; k < 2; k++)
        if (psagg__ctl_send(fd[k], AUTH(fd[k]), PSAGG_CTL_DECLARE, &decl,
                            sizeof decl.d + decl.d.count * sizeof decl.t[0]))
            DIE("declare");
    for (int k = 0; k < 2; k++)
        free(recv_frame(fd[k], PSAGG_CTL_READY, "READY"));
    for (int i = 0; i < N_RBUF; i++)
        if (!(rbuf[i] = malloc(RBUF_BYTES)) ||
            psagg__fabric_post_recv(fab, rbuf[i], RBUF_BYTES, NULL, rbuf[i]))
            DIE("post a receive");
    if (layout.n_chunks != 3)
        DIE("layout (this test expects one chunk per tensor)");
    for (uint32_t c = 0; c < 3; c++) { /* round 0, sealed for the chunk's owner */
        const psagg__chunk_info *ci = &layout.chunks[c];
        psagg__msg_hdr *h;
        float *x;
        bytes[c] = sizeof *h + ci->enc_bytes;
        if (!(push[c] = calloc(1, bytes[c] + PSAGG_MSG_MAC_BYTES)))
            DIE("memory");
        h = (psagg__msg_hdr *)push[c];
        x = (float *)(h + 1);
        psagg__msg_init(h, PSAGG_MSG_PUSH, rank, 0, ci, &layout.tensors[ci->key].codec, 0);
        for (uint64_t i = 0; i < ci->count; i++)
            x[i] = input_value((int)rank, ci->key, 0, i);
        psagg__msg_seal(&push_key[ci->owner], ++seq[ci->owner], push[c], bytes[c]);
        bytes[c] += PSAGG_MSG_MAC_BYTES;
        if (ci->owner == 0)
            to0 = (int)c;
    }
    if (to0 < 0)
        DIE("no chunk is server 0's");
    if (psagg__fabric_send(fab, srv[1], push[to0], bytes[to0], NULL, NULL))
        DIE("send the misdirected push");
    printf("ROGUE: sent server 1 a push of chunk %d sealed for server 0\n", to0);
    for (uint32_t c = 0; c < 3; c++)
        if (psagg__fabric_send(fab, srv[layout.chunks[c].owner], push[c], bytes[c], NULL, NULL))
            DIE("send push %u", c);
    if (psagg__fabric_send(fab, srv[0], push[to0], bytes[to0], NULL, NULL))
        DIE("send the replay");
    printf("ROGUE: sent server 0 its push of chunk %d again\n", to0);
    for (int updates = 0; updates < 3;) {
        psagg__fabric_event ev[8];
        int n = psagg__fabric_poll(fab, ev, 8, 100);
        for (int i = 0; i < n; i++)
            if (ev[i].kind == PSAGG_FABRIC_RECV_DONE)
                updates++;
            else if (ev[i].kind == PSAGG_FABRIC_RECV_ERROR || ev[i].kind == PSAGG_FABRIC_SEND_ERROR)
                DIE("fabric: %s", ev[i].msg);
    }
    for (int k = 0; k < 2; k++)
        if (psagg__ctl_send(fd[k], AUTH(fd[k]), PSAGG_CTL_BYE, NULL, 0))
            DIE("bye");
    printf("rogue: 3 updates received; nobody closed this worker\n");
    for (int k = 0; k < 2; k++)
        close(fd[k]);
    psagg__fabric_close(fab);
    psagg__layout_free(&layout);
    for (int i = 0; i < N_RBUF; i++)
        free(rbuf[i]);
    for (int c = 0; c < 3; c++)
        free(push[c]);
    return 0;
}

/* Read one whole control frame (header and body, as they came) from fd into buf; its size,
   or 0 when the connection closed. */
static size_t read_frame(int fd, uint8_t *buf, size_t cap)
{
    psagg__ctl_hdr *h = (psagg__ctl_hdr *)(void *)buf;
    size_t got = 0, want = sizeof *h;
    while (got < want) {
        ssize_t n = read(fd, buf + got, want - got);
        if (n <= 0)
            return 0;
        got += (size_t)n;
        if (got == sizeof *h) {
            if (sizeof *h + (size_t)h->len > cap)
                DIE("a frame of %u bytes", h->len);
            want += h->len;
        }
    }
    return got;
}

static void write_frame(int fd, const void *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t m = write(fd, (const uint8_t *)buf + off, len - off);
        if (m <= 0)
            DIE("relay write");
        off += (size_t)m;
    }
}

/* A frame of `type` with body b (len bytes) and 16 made-up bytes where a tag would be: what
   someone without the session's keys can put on the connection. */
static void forge(int fd, uint16_t type, const void *b, uint32_t len)
{
    uint8_t frame[sizeof(psagg__ctl_hdr) + 4096];
    psagg__ctl_hdr h = {PSAGG_CTL_MAGIC, type, PSAGG_PROTO_VERSION, len + PSAGG_CTL_TAG_BYTES};
    memcpy(frame, &h, sizeof h);
    if (len)
        memcpy(frame + sizeof h, b, len);
    psagg__nonce_make(frame + sizeof h + len); /* 16 random bytes */
    write_frame(fd, frame, sizeof h + h.len);
}

/*
 * mitm: a man in the middle of one worker's control connection to server `to_port`: forward
 * whole frames both ways, and `after` seconds after the server's READY inject, each once,
 * toward the server a MEMBERSHIP frame of epoch 1 removing worker `victim`, a BYE, and a
 * replay of the last frame the worker sent it; toward the worker an ABORT. Each injected
 * frame carries 16 made-up bytes as its tag (the keys are the two ends' alone). Prints what it
 * injected; exits 0 when either side closes.
 */
static int mitm(int listen_port, int to_port, double after, uint32_t victim)
{
    static uint8_t buf[PSAGG_CTL_MAX_FRAME < (1u << 22) ? PSAGG_CTL_MAX_FRAME : (1u << 22)];
    static uint8_t last[sizeof buf];
    int lfd = tcp_listen_port(listen_port), w, s, injected = 0;
    size_t last_len = 0;
    int64_t inject_at = -1;
    int n_workers = cfg.elastic ? cfg.max_workers : cfg.n_workers;

    printf("ROGUE-MITM: listening on %d\n", listen_port);
    if ((w = accept(lfd, NULL, NULL)) < 0)
        DIE("accept");
    s = tcp_connect_port(to_port);
    for (;;) {
        struct pollfd p[2] = {{.fd = w, .events = POLLIN}, {.fd = s, .events = POLLIN}};
        if (poll(p, 2, 20) < 0)
            break;
        for (int i = 0; i < 2; i++) {
            size_t n;
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (!(n = read_frame(p[i].fd, buf, sizeof buf)))
                return 0; /* either side closed: done */
            write_frame(p[1 - i].fd, buf, n);
            if (i == 0) { /* the worker's: the latest, to replay */
                memcpy(last, buf, n);
                last_len = n;
            } else if (((psagg__ctl_hdr *)(void *)buf)->type == PSAGG_CTL_READY && inject_at < 0) {
                inject_at = psagg__now_ms() + (int64_t)(after * 1e3);
            }
        }
        if (!injected && inject_at >= 0 && psagg__now_ms() >= inject_at) {
            size_t len = sizeof(psagg__ctl_membership) + (size_t)n_workers;
            psagg__ctl_membership *m = calloc(1, len);
            psagg__ctl_error abort_msg = {.status = PSAGG_EPEER};
            uint8_t *live = (uint8_t *)(m + 1);
            if (!m)
                DIE("memory");
            m->epoch = 1;
            m->n_workers = (uint32_t)n_workers;
            m->left = (int32_t)victim;
            for (int k = 0; k < cfg.n_workers; k++)
                m->n_live += live[k] = k != (int)victim;
            snprintf(m->why, sizeof m->why, "injected by a man in the middle");
            forge(s, PSAGG_CTL_MEMBERSHIP, m, (uint32_t)len);
            printf("ROGUE-MITM: injected toward the server a MEMBERSHIP of epoch 1 removing worker "
                   "%u\n",
                   victim);
            free(m);
            write_frame(s, last, last_len);
            printf("ROGUE-MITM: replayed toward the server the worker's frame of type %u\n",
                   ((psagg__ctl_hdr *)(void *)last)->type);
            forge(s, PSAGG_CTL_BYE, NULL, 0);
            printf("ROGUE-MITM: injected toward the server a BYE\n");
            snprintf(abort_msg.msg, sizeof abort_msg.msg, "server 1: injected abort");
            forge(w, PSAGG_CTL_ABORT, &abort_msg, sizeof abort_msg);
            printf("ROGUE-MITM: injected toward the worker an ABORT\n");
            injected = 1;
        }
    }
    return 0;
}

/*
 * One HELLO as worker `rank` at server 0, its token from `key` for the CHALLENGE of connection
 * `made_for` (or of its own connection when made_for < 0). Returns 1 when refused (msg: why),
 * 0 when welcomed.
 */
static int join_try(psagg__fabric *fab, uint32_t rank, const psagg__job_key *key, int made_for,
                    char *msg, size_t len)
{
    psagg__ctl_hello h = {.rank = rank, .world_size = (uint32_t)cfg.n_workers};
    size_t elen = sizeof h.epname;
    psagg__ctl_challenge *ch;
    psagg__ctl_hdr hdr;
    void *body = NULL;
    int fd, refused = 1;

    if (psagg__tcp_connect(&cfg.servers[0], psagg__now_ms() + 20000, "server", NULL, &fd))
        DIE("connect");
    memset(AUTH(fd), 0, sizeof *AUTH(fd)); /* (a new connection: nothing tagged yet) */
    ch = recv_frame(fd, PSAGG_CTL_CHALLENGE, "CHALLENGE");
    if (psagg__fabric_name(fab, h.epname, &elen))
        DIE("fabric name");
    snprintf(h.job_id, sizeof h.job_id, "%s", cfg.job_id);
    snprintf(h.provider, sizeof h.provider, "%s", psagg__fabric_provider(fab));
    h.epname_len = (uint32_t)elen;
    h.flags = cfg.data_auth ? PSAGG_HELLO_DATA_AUTH : 0;
    psagg__nonce_make(h.nonce);
    if (made_for >= 0) { /* made for that connection's challenge: a replay here */
        psagg__ctl_challenge *other = recv_frame(made_for, PSAGG_CTL_CHALLENGE, "CHALLENGE");
        psagg__hello_token(key, &h, 0, other->challenge, h.auth);
        free(other);
    } else {
        psagg__hello_token(key, &h, 0, ch->challenge, h.auth);
    }
    free(ch);
    if (psagg__ctl_send(fd, AUTH(fd), PSAGG_CTL_HELLO, &h, sizeof h))
        DIE("hello");
    if (psagg__ctl_recv(fd, AUTH(fd), &hdr, &body, psagg__now_ms() + 20000, "server")) {
        snprintf(msg, len, "(the connection closed: %s)", psagg_last_error());
    } else if (hdr.type == PSAGG_CTL_ERROR && hdr.len == sizeof(psagg__ctl_error)) {
        psagg__ctl_error *e = body;
        e->msg[sizeof e->msg - 1] = '\0';
        snprintf(msg, len, "%s", e->msg);
    } else {
        snprintf(msg, len, "welcomed (frame type %u)", hdr.type);
        refused = 0;
    }
    free(body);
    close(fd);
    return refused;
}

/* join-flood: a replayed joiner's HELLO, then `count` HELLOs with a wrong secret. */
static int join_flood(uint32_t rank, uint64_t count, double seconds)
{
    psagg__fabric *fab = open_fabric("127.0.0.1");
    psagg__job_key key, wrong;
    char msg[300];
    uint64_t refused = 0, sent = 0;
    int64_t until = psagg__now_ms() + (int64_t)(seconds * 1000);
    int first;

    if (psagg__job_key_load(&cfg, &key) || !key.secret)
        DIE("join-flood needs the job's secret_file");
    wrong = key;
    for (size_t i = 0; i < sizeof wrong.key; i++)
        wrong.key[i] ^= 0x5a;
    /* the replay: made for connection `first`'s challenge, sent on another connection */
    if (psagg__tcp_connect(&cfg.servers[0], psagg__now_ms() + 20000, "server", NULL, &first))
        DIE("connect");
    if (join_try(fab, rank, &key, first, msg, sizeof msg) == 0) {
        printf("ROGUE-WELCOMED: a replayed HELLO of worker %u: %s\n", rank, msg);
        psagg__fabric_close(fab);
        return 1;
    }
    close(first);
    printf("ROGUE-REPLAY-REFUSED: %s\n", msg);
    for (; sent < count && psagg__now_ms() < until; sent++) {
        int r = join_try(fab, rank, &wrong, -1, msg, sizeof msg);
        if (!r) {
            printf("ROGUE-WELCOMED: a HELLO with a wrong secret: %s\n", msg);
            psagg__fabric_close(fab);
            return 1;
        }
        refused += (uint64_t)r;
        if (sent == 0)
            printf("ROGUE-FLOOD-FIRST: %s\n", msg);
    }
    printf("ROGUE-FLOOD: %llu/%llu refused\n", (unsigned long long)refused,
           (unsigned long long)sent);
    psagg__fabric_close(fab);
    return sent == count ? 0 : 1;
}

/* replay: a recorded HELLO on a connection of our own to server k. */
static int replay(const char *record, int k)
{
    uint8_t hello[sizeof(psagg__ctl_hdr) + sizeof(psagg__ctl_hello)];
    FILE *f = fopen(record, "rb");
    psagg__ctl_hdr h;
    void *body = NULL;
    int fd;
    if (!f || fread(hello, 1, sizeof hello, f) != sizeof hello)
        DIE("reading the recorded HELLO %s", record);
    fclose(f);
    if (k < 0 || k >= cfg.n_servers)
        DIE("no server %d", k);
    if (psagg__tcp_connect(&cfg.servers[k], psagg__now_ms() + 20000, "server", NULL, &fd))
        DIE("connect to server %d", k);
    free(recv_frame(fd, PSAGG_CTL_CHALLENGE, "CHALLENGE"));
    for (size_t off = 0; off < sizeof hello;) {
        ssize_t m = write(fd, hello + off, sizeof hello - off);
        if (m <= 0)
            DIE("sending the HELLO");
        off += (size_t)m;
    }
    if (psagg__ctl_recv(fd, AUTH(fd), &h, &body, psagg__now_ms() + 20000, "server")) {
        printf("ROGUE-REFUSED: (the connection closed: %s)\n", psagg_last_error());
        return 0;
    }
    if (h.type == PSAGG_CTL_ERROR && h.len == sizeof(psagg__ctl_error)) {
        psagg__ctl_error *e = body;
        e->msg[sizeof e->msg - 1] = '\0';
        printf("ROGUE-REFUSED: %s\n", e->msg);
        free(body);
        return 0;
    }
    printf("ROGUE-WELCOMED: server %d answered the replayed HELLO with frame type %u\n", k, h.type);
    free(body);
    return 1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"mode", required_argument, NULL, 'm'},
                                         {"fabric-port", required_argument, NULL, 'p'},
                                         {"seconds", required_argument, NULL, 's'},
                                         {"claim", required_argument, NULL, 'w'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"count", required_argument, NULL, 'n'},
                                         {"chunk-elems", required_argument, NULL, 'c'},
                                         {"listen", required_argument, NULL, 'L'},
                                         {"to-port", required_argument, NULL, 'T'},
                                         {"record", required_argument, NULL, 'R'},
                                         {"server", required_argument, NULL, 'K'},
                                         {"hex", required_argument, NULL, 'H'},
                                         {NULL, 0, NULL, 0}};
    const char *record = NULL, *hex = "";
    int listen_port = 0, to_port = 0, server_k = 0;
    const char *mode = "dup", *rank_env = getenv("PSAGG_RANK");
    uint32_t rank = rank_env ? (uint32_t)atoi(rank_env) : 1, claim = 1, rounds = 3;
    uint64_t count = 0, chunk_elems = 0;
    double seconds = 3;
    int port = 0, o;
    psagg_codec push_codec = {.id = PSAGG_CODEC_FP32}; /* (topk-index: a topk) */
    fn_declare declare_msg;
    psagg__fabric *fab;
    psagg__peer server;
    psagg__layout layout;
    uint8_t *push[3] = {0}, *rbuf[N_RBUF] = {0};
    int fd, ok = 0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* what we did reaches the log even if killed */

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm':
            mode = optarg;
            break;
        case 'p':
            port = atoi(optarg);
            break;
        case 's':
            seconds = atof(optarg);
            break;
        case 'w':
            claim = (uint32_t)atoi(optarg);
            break;
        case 'r':
            rounds = (uint32_t)atoi(optarg);
            break;
        case 'n':
            count = strtoull(optarg, NULL, 10);
            break;
        case 'c':
            chunk_elems = strtoull(optarg, NULL, 10);
            break;
        case 'L':
            listen_port = atoi(optarg);
            break;
        case 'T':
            to_port = atoi(optarg);
            break;
        case 'R':
            record = optarg;
            break;
        case 'K':
            server_k = atoi(optarg);
            break;
        case 'H':
            hex = optarg;
            break;
        default:
            return 2;
        }
    }
    if (!strcmp(mode, "hold"))
        return hold(hex);
    if (!strcmp(mode, "relay"))
        return relay(listen_port, to_port, record ? record : "hello.bin");
    if (psagg__config_load(getenv("PSAGG_CONFIG"), &cfg))
        DIE("config");
    if (!strcmp(mode, "mitm"))
        return mitm(listen_port, to_port, seconds, claim);
    if (!strcmp(mode, "misdirect"))
        return misdirect(rank);
    if (!strcmp(mode, "replay"))
        return replay(record ? record : "hello.bin", server_k);
    if (!strcmp(mode, "spoof"))
        return spoof(port, seconds, claim, rounds);
    if (!strcmp(mode, "join-flood"))
        return join_flood(rank, count, seconds);
    if (!strcmp(mode, "bomb"))
        return bomb(rank, count, chunk_elems);
    if (!strcmp(mode, "stale"))
        return stale(rank, rounds);
    if (!strcmp(mode, "membership-skip") || !strcmp(mode, "membership-server0"))
        return membership(rank, !strcmp(mode, "membership-skip"));
    if (!strcmp(mode, "hello-die")) {
        fab = open_fabric("127.0.0.1");
        fd = hello_to(fab, rank, server_k, &server);
        printf("ROGUE: worker %u said HELLO to server %d only; exits\n", rank, server_k);
        close(fd);
        psagg__fabric_close(fab);
        return 0;
    }

    if (!strncmp(mode, "param-", 6))
        decl_flags = PSAGG_DECL_PARAM;
    local_offer = !strcmp(mode, "local-desc")    ? 1
                  : !strcmp(mode, "local-pid")   ? 2
                  : !strcmp(mode, "local-third") ? 3
                                                 : 0;
    fab = open_fabric("127.0.0.1"); /* the fault tests run on this host */
    if (local_offer == 3)
        start_helper(fab);
    fd = hello(fab, rank, &server);
    if (local_offer == 3) {
        kill(helper_pid, SIGKILL);
        waitpid(helper_pid, NULL, 0);
        if (welcome_local)
            DIE("the server took a same-host offer naming a third process");
        printf("ROGUE: the server did not take the offer naming a third process\n");
    }
    if (local_offer == 1 && !(welcome_local & PSAGG_LOCAL_READS))
        DIE("the server did not take a true same-host offer");
    if (local_offer == 2 && welcome_local)
        DIE("the server took a same-host offer of pid 1");
    if (!strcmp(mode, "topk-index")) /* (fn_worker --codec topk2:13/256 beside it) */
        psagg_codec_parse("topk2:13/256", &push_codec);
    fn_tensors(&push_codec, 0, &declare_msg, &layout);
    if (layout.n_chunks != 3)
        DIE("layout (this test expects one chunk per tensor)");
    declare(fab, fd, &declare_msg, rbuf);

    /* this worker's round-0 contributions, exactly as fn_worker would send them */
    for (uint32_t c = 0; c < 3; c++) {
        const psagg__chunk_info *ci = &layout.chunks[c];
        psagg__msg_hdr *h;
        float *x;
        push[c] = calloc(1, sizeof *h + 4 * ci->count + sizeof(psagg__msg_param) + 64);
        if (!push[c])
            DIE("memory");
        h = (psagg__msg_hdr *)push[c];
        x = (float *)(h + 1);
        psagg__msg_init(h, PSAGG_MSG_PUSH, rank, 0, ci, &layout.tensors[ci->key].codec, 0);
        for (uint64_t i = 0; i < ci->count; i++)
            x[i] = input_value((int)rank, ci->key, 0, i);
        if (push_codec.id != PSAGG_CODEC_FP32) { /* encoded in place, from a copy */
            float *v = malloc(4 * ci->count);
            if (!v)
                DIE("memory");
            memcpy(v, x, 4 * ci->count);
            if (psagg__encode(&layout.tensors[ci->key].codec, v, NULL, ci->count,
                              psagg__rng_key_make(1, c), x, h->len, NULL))
                DIE("encode: %s", psagg_last_error());
            free(v);
        }
    }
    if (!strcmp(mode, "epoch-ahead")) { /* pushes of an epoch that never comes: parked, held */
        psagg__msg_hdr *h = (psagg__msg_hdr *)push[0];
        int64_t until = psagg__now_ms() + 30000, pinged = 0;
        h->epoch = 1;
        for (int i = 0; i < 200; i++)
            if (psagg__fabric_send(fab, server, push[0], sizeof *h + layout.chunks[0].enc_bytes,
                                   NULL, NULL))
                DIE("send push %d of epoch 1", i);
        printf("rogue: sent 200 pushes of epoch 1 (the job is at epoch 0)\n");
        fflush(stdout);
        for (;;) { /* alive (PINGs) until the server closes this worker */
            psagg__fabric_event ev[8];
            struct pollfd p = {.fd = fd, .events = POLLIN};
            psagg__ctl_hdr ch;
            psagg__ctl_error *e = NULL;
            if (psagg__now_ms() > until)
                DIE("the server did not close this worker within 30 s");
            (void)psagg__fabric_poll(fab, ev, 8, 0); /* (the sends' progress) */
            usleep(50 * 1000);
            if (psagg__now_ms() - pinged >= 500) {
                if (psagg__ctl_send(fd, AUTH(fd), PSAGG_CTL_PING, NULL, 0))
                    DIE("the control connection closed without an ERROR");
                pinged = psagg__now_ms();
            }
            if (poll(&p, 1, 0) <= 0)
                continue;
            if (psagg__ctl_recv(fd, AUTH(fd), &ch, (void **)&e, psagg__now_ms() + 1000,
                                "server 0") == PSAGG_EAGAIN ||
                ch.type == PSAGG_CTL_PING) { /* (one frame at a time: this one PINGs too) */
                free(e);
                continue;
            }
            if (ch.type != PSAGG_CTL_ERROR || !e)
                DIE("expected an ERROR frame closing this worker");
            printf("rogue: server closed this worker: %s\n", e->msg);
            /* (or, when a round's deadline came first, its missing push: the same closing) */
            ok = strstr(e->msg, "epoch") != NULL || strstr(e->msg, "no push for") != NULL;
            if (!ok)
                fprintf(stderr, "rogue: the reason names neither the field 'epoch' nor the "
                                "missing push\n");
            free(e);
            goto out;
        }
    }
    if (strcmp(mode, "dup") && strcmp(mode, "local-pid") && strcmp(mode, "local-third")) {
        psagg__msg_hdr *h = (psagg__msg_hdr *)push[1];
        size_t bytes = sizeof *h + layout.chunks[1].enc_bytes;
        const char *field = mode;
        psagg__ctl_hdr ch;
        psagg__ctl_error *e = NULL;
        if (!strcmp(mode, "magic"))
            h->magic ^= 1;
        else if (!strcmp(mode, "len"))
            bytes += 4, field = "len";
        else if (!strcmp(mode, "key"))
            h->key = 999;
        else if (!strcmp(mode, "round"))
            h->round = 7;
        else if (!strcmp(mode, "nan"))
            ((float *)(h + 1))[100] = NAN, field = "payload";
        else if (!strcmp(mode, "topk-index")) { /* 4 blocks: the indices after their meta */
            uint8_t *ix = (uint8_t *)(h + 1) + 8 * 4, t = ix[0];
            ix[0] = ix[1], ix[1] = t; /* (8 bits each: the first two swapped, unsorted) */
            field = "index";
        } else if (!strncmp(mode, "param-", 6)) { /* a GRAD push with its trailer */
            psagg__msg_param prm = {.lr = 0.01f, .flags = PSAGG_PARAM_GRAD, .weight = 1.0f};
            if (!strcmp(mode, "param-lr"))
                prm.lr = NAN, field = "lr";
            else if (!strcmp(mode, "param-kind"))
                prm.flags = 3, field = "kind";
            else
                field = "before its INIT";
            memcpy((uint8_t *)(h + 1) + h->len, &prm, sizeof prm);
            h->len += (uint32_t)sizeof prm;
            bytes += sizeof prm;
        }
        if (!strcmp(mode, "local-desc")) { /* a descriptor of memory this process lacks */
            static psagg__msg_local d = {.magic = PSAGG_LOCAL_MAGIC,
                                         .type = PSAGG_LOCAL_DESC,
                                         .cookie = 1,
                                         .addr = 16,
                                         .len = 4096};
            memcpy(push[1], &d, sizeof d);
            bytes = sizeof d;
            field = "same-host copy";
        }
        if (psagg__fabric_send(fab, server, push[1], bytes, NULL, NULL))
            DIE("send the bad push");
        /* the server must close us with a reason that names the field */
        if (recv_no_ping(fd, &ch, (void **)&e) || ch.type != PSAGG_CTL_ERROR || !e)
            DIE("expected an ERROR frame closing this worker");
        printf("rogue: server closed this worker: %s\n", e->msg);
        ok = strstr(e->msg, field) != NULL;
        if (!ok)
            fprintf(stderr, "rogue: the reason does not name the field '%s'\n", field);
        free(e);
        goto out;
    }

    /* dup: every push, the first one twice; then wait for the three updates */
    for (uint32_t i = 0; i < 4; i++) {
        uint32_t c = i ? i - 1 : 0;
        if (psagg__fabric_send(fab, server, push[c],
                               sizeof(psagg__msg_hdr) + layout.chunks[c].enc_bytes, NULL, NULL))
            DIE("send push %u", c);
    }
    for (int updates = 0; updates < 3;) {
        psagg__fabric_event ev[8];
        int n = psagg__fabric_poll(fab, ev, 8, 100);
        for (int i = 0; i < n; i++)
            if (ev[i].kind == PSAGG_FABRIC_RECV_DONE)
                updates++;
            else if (ev[i].kind == PSAGG_FABRIC_RECV_ERROR || ev[i].kind == PSAGG_FABRIC_SEND_ERROR)
                DIE("fabric: %s", ev[i].msg);
    }
    if (psagg__ctl_send(fd, AUTH(fd), PSAGG_CTL_BYE, NULL, 0))
        DIE("bye");
    printf("rogue: 3 updates received after a duplicate push\n");
    ok = 1;
out:
    close(fd);
    psagg__fabric_close(fab);
    psagg__layout_free(&layout);
    for (int i = 0; i < N_RBUF; i++)
        free(rbuf[i]);
    for (int c = 0; c < 3; c++)
        free(push[c]);
    if (ok)
        printf("ROGUE-OK\n");
    return ok ? 0 : 1;
}
