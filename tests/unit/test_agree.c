/*
 * test_agree.c - runtime/agree.c: server epochs decided by Paxos among the workers.
 *
 * 1. The partition of docs/design.md: server A reaches workers 0 and 1 of 5, server B reaches
 *    workers 1..4. Both propose epoch 1; B's view is decided, A never decides its own and
 *    learns B's from worker 1.
 * 2. A split: two servers each reach 2 of 4 workers. Nothing is decided, whatever they retry.
 * 3. Randomized: 1..7 workers, 1..3 proposers, messages delivered in random order, some lost,
 *    each proposer cut off from a random set of workers, proposers retrying after random
 *    back-offs, several epochs in a row. Safety: one view per epoch, whoever learns it (a
 *    proposer's EV_DECIDED or EV_LEARNED, an acceptor's DECIDED). Liveness: once the others
 *    are quiet, a proposer that reaches a majority decides each epoch.
 */
#include "../testutil.h"
#include "runtime/agree.h"

#include <string.h>

#define MAX_W    7
#define MAX_P    3
#define MAX_MSGS 4096
#define EPOCHS   4

typedef struct {
    int to_acceptor; /* 1: proposer `p` -> acceptor `w`; 0: acceptor `w` -> proposer `p` */
    int p, w;
    psagg__agree_msg m;
    uint8_t value[32];
} wire_msg;

typedef struct {
    int n_w, n_p;
    int reach[MAX_P][MAX_W];
    double loss;
    psagg__acceptor acc[MAX_W];
    psagg__proposer prop[MAX_P];
    int epoch[MAX_P];      /* the epoch each proposer works on */
    int quiet_from[MAX_P]; /* the step from which it no longer starts attempts (-1: never) */
    int wait[MAX_P];       /* steps until its next attempt (-1: an attempt runs) */
    int idle[MAX_P];       /* steps its attempt has gone without an answer */
    char decided[EPOCHS + 2][32];
    wire_msg q[MAX_MSGS];
    int n_q;
    uint64_t rng;
} sim;

static uint32_t rnd(sim *s, uint32_t n)
{
    s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(s->rng >> 33) % n;
}

static void post(sim *s, int to_acceptor, int p, int w, const psagg__agree_msg *m)
{
    wire_msg *x;
    if (!s->reach[p][w] || s->n_q == MAX_MSGS)
        return; /* cut off, or the network is full: lost */
    x = &s->q[s->n_q++];
    *x = (wire_msg){.to_acceptor = to_acceptor, .p = p, .w = w, .m = *m};
    CHECK(m->value_len <= sizeof x->value, "view of %u bytes", m->value_len);
    if (m->value_len)
        memcpy(x->value, m->value, m->value_len);
    x->m.value = m->value_len ? x->value : NULL;
}

/* What epoch e decided, learned by `who`: the same view for everyone. */
static void learned(sim *s, uint32_t e, const uint8_t *v, uint32_t len, const char *who)
{
    char view[32] = {0};
    CHECK(e >= 1 && e <= EPOCHS + 1 && len < sizeof view, "%s learned epoch %u", who, e);
    memcpy(view, v, len);
    if (!s->decided[e][0])
        snprintf(s->decided[e], sizeof s->decided[e], "%s", view);
    CHECK(!strcmp(s->decided[e], view), "epoch %u: %s learned '%s', another '%s'", e, who, view,
          s->decided[e]);
}

static void start(sim *s, int p)
{
    char view[32];
    psagg__agree_msg out;
    int e = s->epoch[p];
    if (e > EPOCHS)
        return;
    snprintf(view, sizeof view, "S%d@%d.%u", p, e, rnd(s, 1000));
    if (e > 1) { /* the epoch before, for acceptors that missed it */
        psagg__agree_msg d = {.kind = PSAGG_AGREE_DECIDED,
                              .epoch = (uint32_t)e - 1,
                              .value = (const uint8_t *)s->decided[e - 1],
                              .value_len = (uint32_t)strlen(s->decided[e - 1])};
        for (int w = 0; w < s->n_w; w++)
            post(s, 1, p, w, &d);
    }
    CHECK(psagg__proposer_start(&s->prop[p], (uint32_t)e, (uint32_t)s->n_w, NULL,
                                (const uint8_t *)view, (uint32_t)strlen(view), &out) == PSAGG_OK,
          "start");
    for (int w = 0; w < s->n_w; w++)
        post(s, 1, p, w, &out);
    s->wait[p] = -1;
    s->idle[p] = 0;
}

/* Proposer p learned epoch e's view: on to the next. */
static void next_epoch(sim *s, int p, uint32_t e)
{
    s->epoch[p] = (int)e + 1;
    s->wait[p] = (int)rnd(s, 20);
}

static void deliver(sim *s, const wire_msg *x)
{
    psagg__agree_msg out;
    if (x->to_acceptor) {
        int r = psagg__acceptor_on(&s->acc[x->w], &x->m, &out);
        CHECK(r >= 0, "acceptor %d: %d", x->w, r);
        if (r == 1)
            post(s, 0, x->p, x->w, &out);
        if (r == 2)
            learned(s, s->acc[x->w].epoch - 1, s->acc[x->w].last, s->acc[x->w].last_len,
                    "an acceptor");
        return;
    }
    psagg__proposer *pp = &s->prop[x->p];
    int ev = psagg__proposer_on(pp, (uint32_t)x->w, &x->m, &out);
    CHECK(ev >= 0, "proposer %d: %d", x->p, ev);
    if (ev != PSAGG_AGREE_EV_NONE)
        s->idle[x->p] = 0;
    switch (ev) {
    case PSAGG_AGREE_EV_SEND:
        for (int w = 0; w < s->n_w; w++)
            post(s, 1, x->p, w, &out);
        break;
    case PSAGG_AGREE_EV_DECIDED:
        learned(s, pp->epoch, pp->value, pp->value_len, "a proposer (decided)");
        for (int w = 0; w < s->n_w; w++)
            post(s, 1, x->p, w, &out);
        next_epoch(s, x->p, pp->epoch);
        break;
    case PSAGG_AGREE_EV_LOST:
        s->wait[x->p] = 1 + (int)rnd(s, 30); /* back off, then outbid */
        break;
    case PSAGG_AGREE_EV_LEARNED: /* an acceptor said what this epoch decided */
        learned(s, pp->epoch, pp->value, pp->value_len, "a proposer (told)");
        next_epoch(s, x->p, pp->epoch);
        break;
    case PSAGG_AGREE_EV_BEHIND: /* the DECIDED frames it missed: here, what was learned */
        CHECK(pp->behind_epoch > pp->epoch, "behind at %u, the acceptor at %u", pp->epoch,
              pp->behind_epoch);
        if (s->decided[pp->epoch][0])
            next_epoch(s, x->p, pp->epoch);
        else
            s->wait[x->p] = 1 + (int)rnd(s, 30);
        break;
    }
}

/* Run up to `steps`; the number of epochs decided. */
static int run(sim *s, int steps)
{
    for (int t = 0; t < steps; t++) {
        for (int p = 0; p < s->n_p; p++) {
            int quiet = s->quiet_from[p] >= 0 && t >= s->quiet_from[p];
            if (s->wait[p] > 0)
                s->wait[p]--;
            else if (s->wait[p] == 0 && !quiet)
                start(s, p);
            else if (s->wait[p] < 0 && ++s->idle[p] > 200 && !quiet)
                start(s, p); /* its messages were lost: try again */
        }
        if (s->n_q) {
            int i = (int)rnd(s, (uint32_t)s->n_q);
            wire_msg x = s->q[i];
            x.m.value = x.m.value_len ? x.value : NULL; /* (it pointed into the queue) */
            s->q[i] = s->q[--s->n_q];
            if (rnd(s, 1000) >= (uint32_t)(s->loss * 1000))
                deliver(s, &x);
        }
    }
    int n = 0;
    while (n < EPOCHS && s->decided[n + 1][0])
        n++;
    return n;
}

static void sim_init(sim *s, int n_w, int n_p, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->n_w = n_w;
    s->n_p = n_p;
    s->rng = seed;
    for (int w = 0; w < n_w; w++)
        psagg__acceptor_init(&s->acc[w], 1);
    for (int p = 0; p < n_p; p++) {
        psagg__proposer_init(&s->prop[p], (uint32_t)p);
        s->epoch[p] = 1;
        s->quiet_from[p] = -1;
        for (int w = 0; w < n_w; w++)
            s->reach[p][w] = 1;
    }
}

static void sim_free(sim *s)
{
    for (int w = 0; w < s->n_w; w++)
        psagg__acceptor_free(&s->acc[w]);
    for (int p = 0; p < s->n_p; p++)
        psagg__proposer_free(&s->prop[p]);
}

static sim S;

int main(void)
{
    /* 1. the partition: A (0) reaches workers 0, 1; B (1) reaches 1..4 */
    sim_init(&S, 5, 2, 1);
    for (int w = 2; w < 5; w++)
        S.reach[0][w] = 0;
    S.reach[1][0] = 0;
    for (int p = 0; p < 2; p++)
        S.wait[p] = 0;
    CHECK(run(&S, 20000) == EPOCHS, "partition: %d epochs decided", run(&S, 0));
    for (int e = 1; e <= EPOCHS; e++)
        CHECK(!strncmp(S.decided[e], "S1@", 3), "partition: epoch %d decided '%s', not B's", e,
              S.decided[e]);
    CHECK(S.epoch[0] > 1, "partition: A never learned B's views (at epoch %d)", S.epoch[0]);
    printf("partition: B decided epochs 1..%d (%s ...), A learned them and decided none\n", EPOCHS,
           S.decided[1]);
    sim_free(&S);

    /* 2. a split: 2 + 2 of 4 workers */
    sim_init(&S, 4, 2, 2);
    S.reach[0][2] = S.reach[0][3] = S.reach[1][0] = S.reach[1][1] = 0;
    S.wait[0] = S.wait[1] = 0;
    CHECK(run(&S, 20000) == 0, "split: '%s' decided without a majority", S.decided[1]);
    CHECK(S.prop[0].phase != 3 && S.prop[1].phase != 3, "split: a proposer says it decided");
    printf("split: nothing decided in 20000 steps of retries\n");
    sim_free(&S);

    /* 3. the acceptors are the members of the epoch before: of 5 worker ranks, 0..2; the
       answers of 3 and 4 (left, or joiners not admitted) count for nothing, 2 of 3 decide */
    {
        static const uint8_t member[5] = {1, 1, 1, 0, 0};
        psagg__acceptor acc[5];
        psagg__proposer pr;
        psagg__agree_msg out, ans, fin;
        const uint8_t v[] = "members 0,1,2";
        int ev = 0;
        psagg__proposer_init(&pr, 0);
        CHECK(psagg__proposer_start(&pr, 1, 5, member, v, sizeof v, &out) == PSAGG_OK, "start");
        for (int w = 0; w < 5; w++)
            psagg__acceptor_init(&acc[w], 1);
        for (int w = 4; w >= 1 && ev != PSAGG_AGREE_EV_SEND; w--) { /* PREPARE: 4, 3, 2, 1 */
            CHECK(psagg__acceptor_on(&acc[w], &out, &ans) == 1, "promise %d", w);
            ev = psagg__proposer_on(&pr, (uint32_t)w, &ans, &fin);
            CHECK(ev == (w == 1 ? PSAGG_AGREE_EV_SEND : PSAGG_AGREE_EV_NONE),
                  "members: promise of %d gave event %d", w, ev);
        }
        out = fin;
        ev = 0;
        for (int w = 4; w >= 0 && ev != PSAGG_AGREE_EV_DECIDED; w--) { /* ACCEPT: 4, 3, 2, 1 */
            CHECK(psagg__acceptor_on(&acc[w], &out, &ans) == 1, "accepted %d", w);
            ev = psagg__proposer_on(&pr, (uint32_t)w, &ans, &fin);
            CHECK(ev == (w == 1 ? PSAGG_AGREE_EV_DECIDED : PSAGG_AGREE_EV_NONE),
                  "members: acceptance of %d gave event %d", w, ev);
        }
        CHECK(ev == PSAGG_AGREE_EV_DECIDED && !memcmp(fin.value, v, sizeof v), "members: decided");
        CHECK(psagg__proposer_start(&pr, 2, 5, (const uint8_t[5]){0}, v, sizeof v, &out) ==
                  PSAGG_EINVAL,
              "members: an attempt without a member");
        for (int w = 0; w < 5; w++)
            psagg__acceptor_free(&acc[w]);
        psagg__proposer_free(&pr);
        printf("members: of 5 ranks, members 0..2 decide (2 of 3); 3 and 4 count for nothing\n");
    }

    /* 4. randomized */
    int cases = 0, live = 0;
    for (uint64_t seed = 1; seed <= 3000; seed++) {
        int n_w = 1 + (int)(seed % MAX_W), n_p = 1 + (int)(seed / MAX_W % MAX_P), reaches;
        sim_init(&S, n_w, n_p, seed * 0x9E3779B97F4A7C15ull);
        S.loss = (double)rnd(&S, 30) / 100.0;
        for (int p = 0; p < n_p; p++) {
            S.wait[p] = (int)rnd(&S, 50);
            if (p > 0)
                for (int w = 0; w < n_w; w++)
                    S.reach[p][w] = rnd(&S, 3) != 0;
            if (p > 0)
                S.quiet_from[p] = (int)rnd(&S, 4000); /* the others stop in time */
        }
        reaches = 0;
        for (int w = 0; w < n_w; w++)
            reaches += S.reach[0][w];
        int decided = run(&S, 40000); /* safety is checked on every learning */
        cases++;
        /* liveness: proposer 0 reaches everyone, the others went quiet */
        CHECK(reaches == n_w, "setup");
        CHECK(decided == EPOCHS,
              "seed %llu (%d workers, %d proposers, loss %.2f): %d of %d "
              "epochs decided",
              (unsigned long long)seed, n_w, n_p, S.loss, decided, EPOCHS);
        live++;
        sim_free(&S);
    }
    printf("randomized: %d runs (1..%d workers, 1..%d proposers, up to 29%% loss, partial "
           "reach): one view per epoch everywhere; %d decided all %d epochs\n",
           cases, MAX_W, MAX_P, live, EPOCHS);
    return 0;
}
