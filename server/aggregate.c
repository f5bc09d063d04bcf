/*
 * aggregate.c - the server's aggregation: per-chunk round state and the thread pool.
 *
 * Each owned chunk is pinned to one aggregation thread (slot % threads), so its state needs
 * no lock and a server uses every core it is given. A push is folded into the chunk's fp32
 * accumulator as soon as the fixed order allows (worker 0, 1, ..., N-1): the contribution
 * of the next worker in that order is decoded-and-added straight from the receive buffer;
 * one that arrives early is kept compressed (small) in its slot until its turn. The sum is
 * therefore the same bits whatever order messages arrive in. The last contribution triggers
 * one requantize (with the server residual when enabled) and the identical update bytes go
 * to every worker.
 *
 * That is the sum kind on the CPU (sum_chunk_ops, cpu_sum_ops). What differs by chunk kind
 * (a parameter's optimizer step in param.c, the GPU assist's sum in gpu.c) is behind each
 * chunk's operations tables (server.h: chunk_ops, chunk_sum_ops), chosen once per chunk by
 * chunk_kind and chunk_sum; the rest of this file is the same for every kind.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/adaptive.h"
#include "runtime/message.h"
#include "arena.h"
#include "server.h"

/* The key of a round's update: the chunk's owner in the job's layout, not the rank of the
   server running it, so that another server finishing the same round writes the same bits;
   a parameter's round is its optimizer step (its INIT and PULL rounds not counted). */
static psagg__rng_key round_key(const server *srv, const chunk_state *c)
{
    return psagg__rng_chunk_key(srv->cfg.seed, PSAGG_RNG_SERVER, c->info->owner, c->info->key,
                                c->info->index, c->param ? (uint32_t)c->param->step : c->round);
}

/*
 * [log] timeline: the round as a span from its first push to its update's hand-over, split
 * into collecting the pushes and the sum's encode after the last one. The workers named
 * first and last (and the times) let deploy/psagg-timeline align the hosts' clocks.
 */
static void trace_round(server *srv, const chunk_state *c, int64_t done)
{
    static const char *const keys[] = {"round", "key", "chunk", "first", "last", "thread", "gpu"};
    psagg__span sp = {.name = srv->layout.tensors[c->info->key].name,
                      .cat = "round",
                      .start_ns = c->first_push_ns,
                      .ends = {c->last_push_ns, done}, /* collect, sum+encode */
                      .n_phases = 2,
                      .keys = keys,
                      .n_args = 7,
                      .args = {c->round, c->info->key, c->info->index, c->first_worker,
                               c->last_worker, c->thread, c->sum->device}};
    psagg__timeline_span(srv->pool.timeline, &sp);
}

/*
 * The codec of worker w's push for c's round: of the round's generation (else w runs on a
 * stale assignment: closed), and the same as the round's other pushes (else the workers'
 * assignments differ, which no worker alone is to blame for: the job fails); and what the
 * chunk's kind checks (a parameter's trailer: the same on every push of the round, or the job
 * fails). Returns 0 if the push may count.
 */
static int check_codec(server *srv, chunk_state *c, int w, const psagg__msg_codec *mc)
{
    const char *name = srv->layout.tensors[c->info->key].name;
    uint32_t gen = psagg__layout_generation(&srv->layout, c->info->key, c->round);
    char a[40], b[40];

    if (mc->generation != (gen & PSAGG_MSG_GEN_MASK)) {
        server_close_worker(srv, w,
                            "push of tensor '%s' chunk %u round %u carries codec assignment "
                            "generation %u, but that round is of generation %u ([codec] "
                            "adaptive_interval=%u): a stale assignment",
                            name, c->info->index, c->round, mc->generation,
                            gen & PSAGG_MSG_GEN_MASK, srv->layout.adapt_interval);
        return -1;
    }
    if (!c->codec_set) {
        c->codec = mc->codec;
        c->enc = mc->len;
        c->codec_set = 1;
        c->codec_by = (uint32_t)w;
        c->ops->open(c, mc);
        return 0;
    }
    if (psagg__codec_equal(&c->codec, &mc->codec))
        return c->ops->agree(srv, c, w, mc);
    server_fail_job(srv, PSAGG_EPROTO,
                    "tensor '%s' chunk %u round %u (generation %u): worker %u pushed it in %s, "
                    "worker %d in %s: the workers' codec assignments differ",
                    name, c->info->index, c->round, gen, c->codec_by,
                    psagg_codec_name(&c->codec, a, sizeof a), w,
                    psagg_codec_name(&mc->codec, b, sizeof b));
    return -1;
}

/* The next push that waits ahead of c's round (wait_ahead), or NULL. */
static recv_buf *ahead_pop(server *srv, chunk_state *c)
{
    recv_buf *rb = c->ahead;
    if (!rb)
        return NULL;
    c->ahead = rb->item.next
                   ? (recv_buf *)(void *)((char *)rb->item.next - offsetof(recv_buf, item))
                   : NULL;
    c->n_ahead--;
    if (!rb->spilled) /* (a copy holds no receive buffer) */
        atomic_fetch_sub(&srv->pool.rx_held, 1);
    return rb;
}

/* A round over (finished, or dropped by a move): nothing of it is left in c. */
static void round_reset(server *srv, chunk_state *c)
{
    c->round_deadline = 0;
    c->evicted = 0;
    c->close_at_ms = 0;
    c->closing = 0;
    c->codec_set = 0;
    c->n_arrived = 0;
    c->next = 0;
    c->folded = 0;
    c->follow_has = 0;
    memset(c->arrived, 0, (size_t)srv->n_workers);
}

/* Seal out[p] (its first len bytes) and queue it to every member. */
static void send_update(server *srv, chunk_state *c, int p, size_t len)
{
    /* the members now get it (a leaver's push may be in it all the same) */
    int to = 0;
    if (srv->tag_bytes) /* one seal: every worker gets the same bytes (runtime/auth.h) */
        psagg__node_seal(&srv->node, &srv->pool.update_key,
                         atomic_fetch_add(&srv->pool.update_seq, 1) + 1, c->out[p], len);
    for (int w = 0; w < srv->n_workers; w++)
        to += c->sctx[p].to[w] = (uint8_t)server_member(srv, w);
    atomic_store(&c->sends_pending[p], to);
    server_queue_update(srv, &c->sctx[p]);
}

/* c has no relayed rounds (any more): what came of them is freed. */
static void relay_clear(chunk_state *c)
{
    for (int p = 0; p < 2; p++) {
        free(c->relayed[p]);
        c->relayed[p] = NULL;
        c->relay_came[p] = 0;
    }
    c->relay_from = c->relay_end = 0;
}

/* Whether c's round is one whose update comes relayed. */
static int relayed_round(const chunk_state *c)
{
    return c->round >= c->relay_from && c->round < c->relay_end;
}

/* Whether c's relayed round may go out: its update came and every member took the view. */
static int relay_ready(const chunk_state *c)
{
    return c->relay_came[c->round & 1] && !c->fenced;
}

/* c's round is a relayed one: its own deadline (check_rounds), and out now if it may be. */
static void relay_round_start(server *srv, chunk_state *c)
{
    c->round_deadline = psagg__now_ms() + PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms);
    agg_finish_round(srv, c);
}

/*
 * The relayed update of c's round into out[p], as this server's (its rank the sender, the
 * epoch the view's): its bytes after the header, or 0 when the relayer had it no more (the job
 * failed: nobody else has it to send).
 */
static size_t relay_out(server *srv, chunk_state *c, int p)
{
    psagg__msg_hdr *h = (psagg__msg_hdr *)c->out[p];
    size_t len = c->relayed_len[p];
    if (c->relay_came[p] != 1) {
        server_fail_job(srv, PSAGG_EPEER,
                        "tensor '%s' chunk %u round %u: taken over from a lost server, whose "
                        "update of the round some workers applied, but the worker that relays it "
                        "has it no more",
                        srv->layout.tensors[c->info->key].name, c->info->index, c->round);
        return 0;
    }
    memcpy(c->out[p], c->relayed[p], len);
    h->sender = (uint16_t)srv->rank;
    h->epoch = (uint16_t)atomic_load(&srv->mb.epoch);
    free(c->relayed[p]);
    c->relayed[p] = NULL;
    c->relay_came[p] = 0;
    LOG_INFO(&srv->log, "tensor %u chunk %u round %u: the update a worker relayed goes out",
             c->info->key, c->info->index, c->round);
    return len - sizeof *h;
}

/*
 * (log level debug, [server] quorum with replicas) A digest (FNV-1a) of chunk c's state after
 * its round: an owner's and its copies' are the same round by round, as test_quorum.sh's
 * ef_replicas checks.
 */
static void log_state(server *srv, chunk_state *c)
{
    float *arrays[4];
    uint64_t step, h = 14695981039346656037ull;
    uint32_t flags, n = c->ops->state(srv, c, arrays, &step, &flags);
    for (uint32_t a = 0; a < n; a++)
        for (size_t i = 0; i < c->info->count * sizeof(float); i++)
            h = (h ^ ((const uint8_t *)arrays[a])[i]) * 1099511628211ull;
    if (n)
        LOG_DEBUG(&srv->log, "tensor %u chunk %u round %u: state %016llx (%s)", c->info->key,
                  c->info->index, c->round, (unsigned long long)h, c->shadow ? "copy" : "owner");
}

/* Whether every member pushed chunk c in the view that fenced it (fence_begin). */
static int fence_whole(server *srv, const chunk_state *c)
{
    for (int k = 0; k < srv->n_workers; k++)
        if (!c->repushed[k] && server_member(srv, k))
            return 0;
    return 1;
}

/*
 * The fence is lifted: the update c owes (of the round before its own), if any, goes to every
 * worker. Returns whether one did.
 */
static int send_owed(server *srv, chunk_state *c)
{
    int p = (int)((c->round - 1) & 1);
    psagg__msg_hdr *h = (psagg__msg_hdr *)c->out[p];
    c->fenced = 0;
    if (!c->owes_update)
        return 0;
    c->owes_update = 0;
    h->epoch = (uint16_t)atomic_load(&srv->mb.epoch);
    send_update(srv, c, p, sizeof *h + h->len + srv->pool.bitmap_bytes);
    LOG_INFO(&srv->log,
             "tensor %u chunk %u: round %u's update (summed here as the copy) sent once every "
             "worker took the view",
             c->info->key, c->info->index, c->round - 1);
    return 1;
}

/* Requantize the completed round and send the update to every worker. */
void agg_finish_round(server *srv, chunk_state *c)
{
    int p = c->round & 1;
    size_t enc;
    psagg__msg_hdr *h = (psagg__msg_hdr *)c->out[p];
    long r;
    int64_t now;

    if (relayed_round(c) && !relay_ready(c))
        return; /* (relay_take or fence_pass finishes it) */
    if (c->fenced && c->owes_update) {
        /* the round after the one whose update this copy owes is whole before every member
           took the view ([server] quorum closed it without one, or one left): it waits for
           the fence (fence_pass settles it), as only one update of a round fits in out[] */
        if (!fence_whole(srv, c)) {
            LOG_INFO(&srv->log,
                     "tensor %u chunk %u round %u: whole before every worker took the view that "
                     "moved it here: it waits for them",
                     c->info->key, c->info->index, c->round);
            return;
        }
        send_owed(srv, c);
    }
    /*
     * The update of round-2 may still be in flight from out[p]. Announce the wait before
     * looking: the progress thread decrements sends_pending and then reads deferred, so one
     * of the two sees the other and the round is never left waiting (seq_cst atomics).
     */
    atomic_store(&c->deferred, 1);
    if (atomic_load(&c->sends_pending[p]) > 0) {
        /* the round is whole: no grace timer or deadline of its own may fire while it waits
           (agg_send_done queues c->retry when the last send is done) */
        c->close_at_ms = 0;
        c->round_deadline = 0;
        return;
    }
    atomic_store(&c->deferred, 0);
    if (relayed_round(c)) { /* (the lost owner's bytes: nothing of the round was collected) */
        if (!(enc = relay_out(srv, c, p)))
            return;
    } else {
        if ((r = c->ops->finish(srv, c, c->out[p], round_key(srv, c))) < 0)
            return; /* the job failed */
        enc = (size_t)r;
        h->epoch = (uint16_t)atomic_load(&srv->mb.epoch);
        h->summed = (uint16_t)c->n_arrived;
        enc += srv->pool.policy->trailer(srv, c, c->out[p] + sizeof *h + enc); /* (bitmap) */
        if (srv->pool.follow_bytes && srv->log.level >= PSAGG_LOG_DEBUG)
            log_state(srv, c);
    }
    now = psagg__now_ns();
    if (c->fenced && c->round < c->fence_from) {
        /* a lagging copy catching up on a round every worker has already (the view starts
           the chunk after it): nothing is owed */
    } else if (c->fenced) { /* (taken over from a copy: sent once every worker took the view) */
        c->owes_update = 1;
    } else if (!c->shadow) { /* (a copy's update stays here) */
        send_update(srv, c, p, sizeof *h + enc);
        metrics_round(srv, sizeof *h + enc + srv->tag_bytes, c->last_push_ns - c->first_push_ns,
                      now - c->last_push_ns);
    }
    if (srv->pool.timeline)
        trace_round(srv, c, now);
    round_reset(srv, c);
    if (!c->ops->advances(c))
        return; /* (a parameter's INIT and PULL do not count a round) */
    c->round++;
    /* the pushes of this round that came early (to a copy, or after a takeover): their turn */
    for (recv_buf *rb; (rb = ahead_pop(srv, c));)
        agg_enqueue(srv, c, rb);
    if (c == srv->chunks) { /* slot 0 counts the job's rounds for the usage report */
        if (c->round == 1) {
            getrusage(RUSAGE_SELF, &srv->pool.usage_first);
            atomic_store(&srv->pool.usage_marked, 1);
        }
        atomic_store(&srv->pool.rounds_done, c->round);
    }
    if (relayed_round(c))
        relay_round_start(srv, c);
}

/*
 * Fold worker w's payload into the accumulator (it is next in the fixed order): 0, or 1 when
 * the push was dropped (elastic, below), -1 when the chunk broke. The decode validates the
 * payload in the same pass; the round's first fold writes the accumulator (0 + y, codec.h's
 * first term), so there is no memset before it. A bad payload leaves the accumulator
 * half-written (an fp32 NaN is added in): the chunk is then broken for the rest of the job,
 * which the closing of that worker fails (no later push may complete a round from it). In an
 * elastic job a worker's closing does not end the job, so the payload is checked first (one
 * more read of it) and a bad one is dropped with its worker: the round goes on without it, as
 * when a worker leaves before pushing.
 */
static int fold(server *srv, chunk_state *c, int w, const void *payload)
{
    int bad = 0;
    if (srv->mb.elastic && psagg__validate(&c->codec, payload, c->enc, c->info->count))
        bad = 1;
    else if (psagg__decode_into(&c->codec, payload, c->enc, c->info->count, c->acc,
                                c->folded++ == 0 ? PSAGG_DECODE_FIRST : PSAGG_DECODE_ADD, 1.0f))
        bad = -1, c->broken = 1;
    if (bad)
        server_close_worker(srv, w, "push of tensor %u chunk %u round %u: payload: %s",
                            c->info->key, c->info->index, c->round, psagg_last_error());
    return bad;
}

/*
 * Take one of the receive buffers chunks may hold for pushes that wait for their turn: 1, or 0
 * when half the pool is held so already (rx_hold_max: the other half keeps the receive window
 * open, as a round that waits needs a push that needs a buffer to arrive).
 */
static int rx_hold(server *srv)
{
    if (atomic_fetch_add(&srv->pool.rx_held, 1) < srv->pool.rx_hold_max)
        return 1;
    atomic_fetch_sub(&srv->pool.rx_held, 1);
    return 0;
}

/* Let go of worker w's held receive buffer (it was folded, or the chunk broke). */
static void release_held(server *srv, chunk_state *c, int w)
{
    server_queue_repost(srv, c->held[w]);
    c->held[w] = NULL;
    atomic_fetch_sub(&srv->pool.rx_held, 1);
}

/*
 * cpu_sum_ops' settle: fold the early pushes the fixed order now reaches, passing over the
 * workers that are no members (elastic: they left; a push of theirs that came is folded), and
 * over every missing one when the round closes without them ([server] quorum); a round that
 * follows its owner's bitmap folds nothing before it came (job.c's server_passes).
 */
static int cpu_settle(server *srv, chunk_state *c)
{
    size_t cap = c->info->cap_bytes;
    while ((int)c->next < srv->n_workers && server_passes(srv, c, (int)c->next)) {
        int nx = (int)c->next, bad = 0;
        if (c->held[nx]) {
            bad = fold(srv, c, nx, c->held[nx]->rx.buf + sizeof(psagg__msg_hdr));
            release_held(srv, c, nx);
        } else if (c->arrived[nx]) {
            bad = fold(srv, c, nx, c->slots + (size_t)nx * cap);
        }
        if (bad > 0) { /* dropped: the round waits for nx to be no member, as if it never came */
            c->arrived[nx] = 0;
            c->n_arrived--;
            continue;
        }
        if (bad)
            return 0;
        c->next++;
    }
    if ((int)c->next == srv->n_workers && !c->n_arrived && c->closing) {
        /* a quorum round closed with pushes that were all dropped (elastic, above): it sums
           nothing, so it opens again for the live workers' pushes (acc unwritten: folded 0) */
        c->closing = 0;
        c->close_at_ms = 0;
        c->next = 0;
    }
    return (int)c->next == srv->n_workers && c->n_arrived ? CHUNK_COMPLETE : 0;
}

/*
 * cpu_sum_ops' collect: a push that is next in the fixed order is folded into acc straight
 * from its receive buffer, and so are the early ones it unblocks. A push that comes before its
 * turn waits in its receive buffer while fewer than half of the pool's buffers are held so
 * (rx_hold_max), so that the receive window never closes; beyond that it is validated and
 * copied into its slot.
 */
static int cpu_collect(server *srv, chunk_state *c, int w, recv_buf *rb)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    const uint8_t *payload = rb->rx.buf + sizeof *h;
    size_t cap = c->info->cap_bytes;

    if (w != (int)c->next || (server_follows(srv, c) && !c->follow_has)) {
        int kept = 0;
        if (rx_hold(srv)) {
            c->held[w] = rb;
            kept = CHUNK_KEPT;
        } else {
            if (psagg__validate(&c->codec, payload, c->enc, c->info->count)) {
                server_close_worker(srv, w, "push of tensor %u chunk %u round %u: payload: %s",
                                    h->key, h->chunk, h->round, psagg_last_error());
                return 0;
            }
            memcpy(c->slots + (size_t)w * cap, payload, c->enc);
        }
        c->arrived[w] = 1;
        c->n_arrived++;
        return kept | cpu_settle(srv, c); /* the workers before it may be no members */
    }
    if (fold(srv, c, w, payload)) /* (broken, or dropped: the round goes on without it) */
        return 0;
    c->arrived[w] = 1;
    c->n_arrived++;
    c->next++;
    return cpu_settle(srv, c);
}

/* cpu_sum_ops' encode: requantize acc (with the server residual). */
static psagg_status cpu_encode(server *srv, chunk_state *c, psagg__rng_key key, uint8_t *payload,
                               size_t *bad)
{
    (void)srv;
    return psagg__encode(&c->codec, c->acc, c->residual, c->info->count, key, payload, c->enc, bad);
}

static psagg_status cpu_alloc(server *srv, chunk_state *c)
{
    (void)srv;
    if (!(c->acc = arena_alloc(c->info->count * sizeof(float))))
        return psagg__fail(PSAGG_ENOMEM, "buffers of tensor %u chunk %u", c->info->key,
                           c->info->index);
    return PSAGG_OK;
}

static void cpu_free(chunk_state *c)
{
    arena_free(c->acc);
    c->acc = NULL;
}

const chunk_sum_ops cpu_sum_ops = {
    .name = "cpu",
    .device = 0,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .collect = cpu_collect,
    .settle = cpu_settle,
    .encode = cpu_encode,
};

/*
 * A heap copy of rb, a push that waits ahead while half the receive pool is held already (the
 * other half keeps the receive window open: a copy's lagging round waits for a push that needs
 * a receive buffer to arrive). Linked in the pool's list, so that agg_teardown frees what is
 * left; NULL without memory.
 */
static recv_buf *spill_copy(server *srv, const recv_buf *rb)
{
    recv_buf *cp = malloc(sizeof *cp + rb->rx.len);
    if (!cp)
        return NULL;
    *cp = *rb;
    cp->rx.buf = (uint8_t *)(cp + 1);
    cp->rx.desc = NULL;
    cp->rx.size = rb->rx.len;
    memcpy(cp->rx.buf, rb->rx.buf, rb->rx.len);
    cp->spilled = 1;
    cp->spill_prev = NULL;
    atomic_fetch_add(&srv->pool.n_spilled, 1);
    pthread_mutex_lock(&srv->pool.spill_mu);
    cp->spill_next = srv->pool.spills;
    if (cp->spill_next)
        cp->spill_next->spill_prev = cp;
    srv->pool.spills = cp;
    pthread_mutex_unlock(&srv->pool.spill_mu);
    return cp;
}

void agg_spill_free(server *srv, recv_buf *rb)
{
    pthread_mutex_lock(&srv->pool.spill_mu);
    if (rb->spill_prev)
        rb->spill_prev->spill_next = rb->spill_next;
    else
        srv->pool.spills = rb->spill_next;
    if (rb->spill_next)
        rb->spill_next->spill_prev = rb->spill_prev;
    pthread_mutex_unlock(&srv->pool.spill_mu);
    free(rb);
}

/* How far a push may come before its round and wait (a copy lags, a takeover sums a round
   again): rounds ahead, and pushes per worker of the job. */
#define AHEAD_ROUNDS     4
#define AHEAD_PER_WORKER 4

/*
 * A push of a later round than chunk c's, to a copy (shadow) or to a chunk taken over: it
 * waits in c->ahead until the round moves on (agg_finish_round queues them all again), in its
 * receive buffer while fewer than half of the pool's are held (rx_hold_max, as cpu_collect's
 * early pushes), else as a heap copy. Returns 1 if it waits in rb, 2 if a copy of it waits
 * or the copy found no memory (the job failed; either way the caller posts rb again), 0 if it
 * is further ahead than that (handle_push closes its sender).
 */
static int wait_ahead(server *srv, chunk_state *c, recv_buf *rb)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    recv_buf *waits = rb;
    if (h->round - c->round > AHEAD_ROUNDS ||
        c->n_ahead >= (uint32_t)srv->n_workers * AHEAD_PER_WORKER)
        return 0;
    if (!c->ahead && !c->shadow)
        LOG_INFO(&srv->log,
                 "tensor %u chunk %u: worker %u pushed round %u while round %u is summed again "
                 "after the takeover: it waits for its turn",
                 h->key, h->chunk, h->sender, h->round, c->round);
    if (!rb->spilled && !rx_hold(srv) && !(waits = spill_copy(srv, rb))) {
        server_fail_job(srv, PSAGG_ENOMEM,
                        "tensor %u chunk %u: no memory for worker %u's push of round %u, which "
                        "came before round %u",
                        h->key, h->chunk, h->sender, h->round, c->round);
        return 2; /* (dropped: the job failed) */
    }
    waits->item.next = c->ahead ? &c->ahead->item : NULL; /* (taken again after the round) */
    c->ahead = waits;
    c->n_ahead++;
    return waits == rb ? 1 : 2;
}

/*
 * No update of chunk c goes out before every member took the view `epoch` that moved it here
 * (a worker still in the view before would take one from this server for a stranger's): a copy
 * that took it over (take_over_copy), or a new owner of relayed rounds. fence_pass lifts it.
 */
static void fence_begin(server *srv, chunk_state *c, uint32_t epoch, uint32_t from)
{
    c->fenced = 1;
    c->fence_epoch = (uint16_t)epoch;
    c->fence_from = from;
    memset(c->repushed, 0, (size_t)srv->n_workers);
}

/*
 * Worker w pushed chunk c in the view that fenced it (fence_begin): once every member has, the
 * fence is lifted and the update owed, if any, goes to them all (a relayed round: as it came),
 * and then the round after it, which may be whole and waiting for that (agg_finish_round).
 */
static void fence_pass(server *srv, chunk_state *c, int w)
{
    c->repushed[w] = 1;
    if (!fence_whole(srv, c))
        return;
    if (relayed_round(c)) {
        c->fenced = 0;
        LOG_INFO(&srv->log,
                 "tensor %u chunk %u: every worker pushed it in the view that moved it here: its "
                 "relayed rounds %u..%u go out as their updates come",
                 c->info->key, c->info->index, c->relay_from, c->relay_end - 1);
        agg_finish_round(srv, c); /* (if its update came) */
        return;
    }
    if (send_owed(srv, c) && c->n_arrived && !atomic_load(&c->deferred))
        agg_settle(srv, c); /* (its round may be whole, waiting for the fence) */
}

/*
 * Chunk c follows its owner (job.c's server_follows) and waits for the bitmap of its round:
 * the trailer of a push of the next round carries it (wire.h), here worker w's rb. The pushes
 * it names are folded in the fixed order; one the owner left out (a straggler's) is let go,
 * late here too. A bitmap that names other workers than one that came before (or workers the
 * job has not) closes w. Returns -1 when w was closed.
 */
static int follow_learn(server *srv, chunk_state *c, int w, const recv_buf *rb)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    const uint8_t *bits = rb->rx.buf + sizeof *h + h->len;
    size_t nb = srv->pool.follow_bytes;
    uint32_t named = 0, beyond = 0;
    if (!server_follows(srv, c) || h->round != c->round + 1)
        return 0;
    for (uint32_t k = 0; k < 8 * nb; k++)
        if (psagg__bitmap_has(bits, k))
            *(k < (uint32_t)srv->n_workers ? &named : &beyond) += 1;
    if (!named && !beyond)
        return 0; /* (its worker has no update of the round: another's push brings it) */
    if (beyond || (c->follow_has && memcmp(bits, c->follow_bits, nb))) {
        server_close_worker(srv, w,
                            "push of tensor %u chunk %u round %u: field trailer names other "
                            "contributors of round %u than %s",
                            h->key, h->chunk, h->round, c->round,
                            beyond ? "the job's workers" : "another worker's push did");
        return -1;
    }
    if (c->follow_has)
        return 0;
    memcpy(c->follow_bits, bits, nb);
    c->follow_has = 1;
    for (int k = 0; k < srv->n_workers; k++)
        if (c->arrived[k] && !psagg__bitmap_has(bits, (uint32_t)k)) {
            if (c->held[k])
                release_held(srv, c, k);
            c->arrived[k] = 0;
            c->n_arrived--;
            LOG_DEBUG(&srv->log,
                      "tensor %u chunk %u round %u: worker %d's push is not in its owner's sum "
                      "(worker %d's push of the next round says): let go",
                      c->info->key, c->info->index, c->round, k, w);
        }
    if (!atomic_load(&c->deferred))
        agg_settle(srv, c);
    return 0;
}

/*
 * One push for chunk c, already checked by the progress thread: its source (and MAC with
 * data_auth), then its fields against the layout. So a forged push never reaches this point
 * to count as its sender's (and make the real one a "duplicate"). What every kind of chunk
 * checks is here; the kind admits the push, checks its own fields and collects it
 * (chunk_ops). Returns 1 when the receive buffer is kept (an early arrival, folded from there
 * at its turn), 0 when the caller may repost it.
 */
static int handle_push(server *srv, chunk_state *c, recv_buf *rb)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    int w = h->sender, r;
    uint32_t round = h->round;

    if (c->broken || c->stale)
        return 0;
    if (c->standby && !c->shadow) { /* routed before a view gave it up: its owner sums it */
        LOG_DEBUG(&srv->log, "push from worker %d: tensor %u chunk %u round %u, given up here", w,
                  h->key, h->chunk, h->round);
        return 0;
    }
    if (!server_follows(srv, c) && !server_member(srv, w)) { /* (progress.c's, where copies
                                                                follow: its owner decides) */
        LOG_DEBUG(&srv->log, "a push from worker %d, which is no member, dropped", w);
        metrics_drop(srv);
        return 0;
    }
    if (c->fenced && (uint16_t)(h->epoch - c->fence_epoch) < 0x8000) /* (that view or later) */
        fence_pass(srv, c, w);
    if (round >= c->relay_from && round < c->relay_end) {
        /* a relayed round's push (pushed again: the sign above): its update is the lost
           owner's; the worker is seen at it (the round policy's record: quorum.c) */
        if (c->seen[w] < round + 1)
            c->seen[w] = round + 1;
        /* (the round collected now may have waited for it, as for a membership change;
           not one whole and waiting for its send: agg_main's retry) */
        if (!relayed_round(c) && !atomic_load(&c->deferred))
            agg_settle(srv, c);
        return 0;
    }
    if (srv->pool.follow_bytes && follow_learn(srv, c, w, rb))
        return 0;
    if (round > c->round && (c->shadow || c->taken_over) && (r = wait_ahead(srv, c, rb)))
        return r == 1;
    if (c->ops->admit(srv, c, rb, &round))
        return 0;
    if (round == c->round && server_follows(srv, c) && c->follow_has &&
        !psagg__bitmap_has(c->follow_bits, (uint32_t)w)) {
        srv->pool.policy->late(srv, c, w, round); /* (its owner closed the round without it) */
        return 0;
    }
    if (round < c->round || (round == c->round && c->closing)) {
        if (srv->pool.policy->late(srv, c, w, round))
            return 0; /* (the policy's: a straggler's, quorum.c) */
        if (c->shadow) {
            /* (a copy that came back: a kept push of a round its state has) */
            LOG_DEBUG(&srv->log,
                      "push from worker %d: tensor %u chunk %u round %u, before this "
                      "copy's round %u",
                      w, h->key, h->chunk, h->round, c->round);
            return 0;
        }
        LOG_WARN(&srv->log,
                 "stale push from worker %d: tensor %u chunk %u round %u (collecting %u), dropped",
                 w, h->key, h->chunk, h->round, c->round);
        return 0;
    }
    if (round > c->round) {
        server_close_worker(srv, w, "push field round is %u but tensor %u chunk %u is at round %u",
                            h->round, h->key, h->chunk, c->round);
        return 0;
    }
    if (c->arrived[w]) {
        LOG_WARN(&srv->log, "duplicate push from worker %d: tensor %u chunk %u round %u, dropped",
                 w, h->key, h->chunk, h->round);
        return 0;
    }
    if (check_codec(srv, c, w, &rb->mc))
        return 0;
    {
        int64_t now = psagg__now_ns();
        if (!c->round_deadline) { /* the round's first push starts its clock */
            c->round_deadline = now / 1000000 + PSAGG_ROUND_DEADLINE_MS(srv->cfg.op_timeout_ms);
            c->first_push_ns = now;
            c->first_worker = (uint32_t)w;
        }
        c->last_push_ns = now;
        c->last_worker = (uint32_t)w;
        metrics_lateness(srv, w, now - c->first_push_ns);
    }
    r = c->ops->collect(srv, c, w, rb);
    srv->pool.policy->pushed(srv, c, w, round, (r & CHUNK_COMPLETE) != 0);
    if (r & CHUNK_COMPLETE)
        agg_finish_round(srv, c);
    return r & CHUNK_KEPT;
}

/* sum_chunk_ops: the round's update is its sum, requantized (error feedback: c->residual). */
static uint64_t sum_out_bytes(const psagg_codec *codec, uint64_t count, uint64_t enc)
{
    (void)codec, (void)count;
    return enc;
}

static uint64_t sum_state_bytes(const server *srv, uint64_t count)
{
    return srv->cfg.server_error_feedback ? 4 * count : 0;
}

static psagg_status sum_alloc(server *srv, chunk_state *c)
{
    if (srv->cfg.server_error_feedback &&
        !(c->residual = arena_alloc(c->info->count * sizeof(float))))
        return psagg__fail(PSAGG_ENOMEM, "buffers of tensor %u chunk %u", c->info->key,
                           c->info->index);
    return PSAGG_OK;
}

static void sum_free(chunk_state *c)
{
    arena_free(c->residual);
    c->residual = NULL;
}

static int sum_admit(server *srv, chunk_state *c, const recv_buf *rb, uint32_t *round)
{
    (void)srv, (void)c, (void)rb, (void)round;
    return 0;
}

static void sum_open(chunk_state *c, const psagg__msg_codec *mc)
{
    (void)c, (void)mc;
}

static int sum_agree(server *srv, chunk_state *c, int w, const psagg__msg_codec *mc)
{
    (void)srv, (void)c, (void)w, (void)mc;
    return 0;
}

static int sum_collect(server *srv, chunk_state *c, int w, recv_buf *rb)
{
    return c->sum->collect(srv, c, w, rb);
}

static int sum_settle(server *srv, chunk_state *c)
{
    return c->sum->settle(srv, c);
}

static long sum_finish(server *srv, chunk_state *c, uint8_t *out, psagg__rng_key key)
{
    size_t bad = 0;
    psagg_status st = c->sum->encode(srv, c, key, out + sizeof(psagg__msg_hdr), &bad);
    if (st) {
        server_fail_job(srv, st, "tensor '%s' chunk %u round %u: the sum cannot be encoded: %s",
                        srv->layout.tensors[c->info->key].name, c->info->index, c->round,
                        psagg_last_error());
        return -1;
    }
    psagg__msg_init((psagg__msg_hdr *)out, PSAGG_MSG_UPDATE, (uint32_t)srv->rank, c->round, c->info,
                    &c->codec, psagg__layout_generation(&srv->layout, c->info->key, c->round));
    return (long)c->enc;
}

static int sum_advances(const chunk_state *c)
{
    (void)c;
    return 1;
}

/* sum_chunk_ops' state: the server residual, if any. */
static uint32_t sum_state(const server *srv, chunk_state *c, float **arrays, uint64_t *step,
                          uint32_t *flags)
{
    (void)srv;
    *step = 0;
    *flags = 0;
    arrays[0] = c->residual;
    return c->residual != NULL;
}

const chunk_ops sum_chunk_ops = {
    .name = "sum",
    .host_sum = 0,
    .sum = NULL,
    .out_bytes = sum_out_bytes,
    .state_bytes = sum_state_bytes,
    .alloc = sum_alloc,
    .free = sum_free,
    .admit = sum_admit,
    .open = sum_open,
    .agree = sum_agree,
    .collect = sum_collect,
    .settle = sum_settle,
    .finish = sum_finish,
    .advances = sum_advances,
    .partial = sum_advances, /* (always 1 too) */
    .state = sum_state,
    .set_state = NULL,
};

/*
 * The per-round deadline (runtime/channel.h): a round whose first push arrived more than
 * 1.5 x op_timeout_ms ago and still misses some fails the job, naming the workers whose
 * pushes are missing (alive, as their PINGs say, but not pushing; the workers' own deadline
 * is longer, so this verdict reaches them first). An elastic job closes them instead and goes
 * on without them, as without a worker that died; the round fails the job only if they are
 * still members op_timeout_ms / 4 later (still before the workers' deadline). Each thread
 * checks its own chunks, the only thread that touches them.
 */
static void check_rounds(server *srv, agg_thread *t, int64_t now)
{
    int self = (int)(t - srv->pool.threads);
    for (uint32_t i = 0; i < srv->n_held; i++) {
        chunk_state *c = &srv->chunks[i];
        char missing[128] = "";
        size_t used = 0;
        if ((int)c->thread != self || !c->round_deadline || now < c->round_deadline ||
            c->shadow) /* (a copy's owner has the deadline) */
            continue;
        if (relayed_round(c)) {
            for (int w = 0; w < srv->n_workers; w++)
                if (c->fenced && !c->repushed[w] && server_member(srv, w))
                    used = psagg__list_int(missing, sizeof missing, used, w);
            server_fail_job(srv, PSAGG_ETIMEDOUT,
                            "tensor '%s' chunk %u round %u: taken over from a lost server, its "
                            "update (which a worker relays) %s within 1.5 x op_timeout_ms=%d%s%s",
                            srv->layout.tensors[c->info->key].name, c->info->index, c->round,
                            c->relay_came[c->round & 1] ? "came, but not every worker's push "
                                                          "in the view that moved it"
                                                        : "did not come",
                            srv->cfg.op_timeout_ms, used ? ": no push from workers " : "", missing);
            return;
        }
        for (int w = 0; w < srv->n_workers; w++)
            if (!c->arrived[w] && server_member(srv, w))
                used = psagg__list_int(missing, sizeof missing, used, w);
        if (!used && srv->mb.elastic && !c->fenced && !c->broken && server_members_in(srv, c)) {
            /* a membership epoch removed the last one missing since, and its settle is queued
               behind this check: the round is whole (failed below if it did not move on) */
            uint32_t round = c->round;
            agg_settle(srv, c);
            if (c->round != round || !c->round_deadline || atomic_load(&c->deferred))
                continue;
        }
        if (used && srv->mb.elastic && !c->evicted && !server_follows(srv, c)) {
            /* an elastic job goes on without those it waits for (with [server] quorum: those
               whose push of the round before did not come either; it leaves out the others):
               each is closed here, and its membership removes it (elsewhere, cut off from this
               server, it gives up). The round has op_timeout_ms / 4 more for that, so that
               this verdict still comes before the workers' own (2 x op_timeout_ms) */
            int quorum = srv->cfg.quorum > 0, evicted = 0;
            for (int w = 0; w < srv->n_workers; w++)
                if (!server_passes(srv, c, w) && (!quorum || c->seen[w] < c->round)) {
                    server_evict_worker(srv, w,
                                        "no push for tensor '%s' chunk %u round %u within 1.5 x "
                                        "op_timeout_ms=%d of the first",
                                        srv->layout.tensors[c->info->key].name, c->info->index,
                                        c->round, srv->cfg.op_timeout_ms);
                    evicted++;
                }
            if (evicted) {
                c->evicted = 1;
                c->round_deadline = now + srv->cfg.op_timeout_ms / 4;
                continue;
            }
        }
        server_fail_job(srv, PSAGG_ETIMEDOUT,
                        "tensor '%s' chunk %u round %u: no push from workers %s within 1.5 x "
                        "op_timeout_ms=%d%s",
                        srv->layout.tensors[c->info->key].name, c->info->index, c->round, missing,
                        srv->cfg.op_timeout_ms,
                        c->evicted ? " (given up here then; no membership epoch removed them "
                                     "within op_timeout_ms / 4 more)"
                                   : "");
        return;
    }
}

static void queue_item(agg_thread *t, agg_item *it)
{
    pthread_mutex_lock(&t->mu);
    if (t->tail)
        t->tail->next = it;
    else
        t->head = it;
    t->tail = it;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

psagg_status agg_move(server *srv, chunk_state *c, int move, const psagg__view_move *m,
                      uint32_t epoch)
{
    agg_item *it = malloc(sizeof *it); /* (freed by the thread: views are rare) */
    uint32_t start = m ? m->start : 0, end = m ? m->relay_end : 0;
    /* relayer FOLLOW: its copy follows the rounds to end, nothing is relayed; a lagging copy
       follows the rounds before the view's start in any case */
    int follow = m && m->relayer == PSAGG_VIEW_FOLLOW;
    if (!it)
        return psagg__fail(PSAGG_ENOMEM, "moving a chunk");
    *it = (agg_item){.chunk = c,
                     .move = move,
                     .round = start,
                     .relay_end = follow ? start : end,
                     .follow_end = follow ? end : start,
                     .epoch = epoch};
    queue_item(&srv->pool.threads[c->thread], it);
    return PSAGG_OK;
}

psagg_status agg_relay(server *srv, chunk_state *c, uint32_t round, uint8_t *bytes, uint32_t len)
{
    agg_item *it = malloc(sizeof *it); /* (freed by the thread) */
    if (!it) {
        free(bytes);
        return psagg__fail(PSAGG_ENOMEM, "a relayed update");
    }
    *it = (agg_item){.chunk = c, .move = AGG_RELAY, .round = round, .bytes = bytes, .len = len};
    queue_item(&srv->pool.threads[c->thread], it);
    return PSAGG_OK;
}

/*
 * A relayed round's update came (agg_relay): kept until its round goes out (now, if every
 * member took the view). One of a round that is not c's to relay (a later view moved c, or it
 * came twice) is dropped.
 */
static void relay_take(server *srv, chunk_state *c, agg_item *it)
{
    int p = (int)(it->round & 1);
    if (c->standby || it->round < c->round || it->round < c->relay_from ||
        it->round >= c->relay_end || c->relay_came[p]) {
        LOG_INFO(&srv->log,
                 "tensor %u chunk %u: a relayed update of round %u, which is not one this server "
                 "waits for (at round %u, relayed rounds %u..%u): dropped",
                 c->info->key, c->info->index, it->round, c->round, c->relay_from, c->relay_end);
        free(it->bytes);
        return;
    }
    c->relayed[p] = it->bytes;
    c->relayed_len[p] = it->len;
    c->relay_came[p] = it->len ? 1 : 2;
    if (it->round == c->round)
        agg_finish_round(srv, c); /* (if every member took the view) */
}

/* The last finished round's update in c->out (header and payload), or NULL. */
static const psagg__msg_hdr *last_update(const chunk_state *c)
{
    const psagg__msg_hdr *h = c->round ? (const psagg__msg_hdr *)c->out[(c->round - 1) & 1] : NULL;
    return h && h->magic == PSAGG_MSG_MAGIC && h->round == c->round - 1 ? h : NULL;
}

psagg_status agg_state_save(server *srv, chunk_state *c, psagg__ctl_state *sh, uint8_t **frame,
                            size_t *len)
{
    float *arrays[4];
    size_t bytes = c->info->count * sizeof(float);
    const psagg__msg_hdr *h = last_update(c);
    uint8_t *f;
    sh->kind = PSAGG_STATE_CHUNK;
    sh->round = c->round;
    sh->arrays = c->ops->state(srv, c, arrays, &sh->step, &sh->flags);
    sh->out_len = h ? (uint32_t)(sizeof *h + h->len) : 0;
    *len = sizeof *sh + sh->arrays * bytes + sh->out_len;
    if (*len > PSAGG_CTL_MAX_FRAME)
        return psagg__fail(PSAGG_EINVAL,
                           "tensor '%s' chunk %u: its state (%zu bytes) is larger than a control "
                           "frame may be",
                           srv->layout.tensors[c->info->key].name, c->info->index, *len);
    if (!(f = *frame = malloc(*len)))
        return psagg__fail(PSAGG_ENOMEM, "no memory for the state of tensor '%s' chunk %u",
                           srv->layout.tensors[c->info->key].name, c->info->index);
    memcpy(f, sh, sizeof *sh);
    for (uint32_t i = 0; i < sh->arrays; i++)
        memcpy(f + sizeof *sh + i * bytes, arrays[i], bytes);
    if (h)
        memcpy(f + sizeof *sh + sh->arrays * bytes, h, sh->out_len);
    return PSAGG_OK;
}

psagg_status agg_state_load(server *srv, chunk_state *c, const psagg__ctl_state *sh,
                            const uint8_t *data, size_t len)
{
    float *arrays[4];
    uint64_t step;
    uint32_t flags, n = c->ops->state(srv, c, arrays, &step, &flags);
    size_t bytes = c->info->count * sizeof(float);
    psagg__msg_hdr h;
    if (sh->arrays != n || len != (size_t)n * bytes + sh->out_len ||
        (sh->out_len &&
         (sh->out_len < sizeof h || sh->out_len > sizeof h + c->out_cap + srv->pool.bitmap_bytes)))
        return psagg__fail(PSAGG_EPROTO,
                           "STATE of tensor '%s' chunk %u: fields arrays, out_len: %u, %u in %zu "
                           "bytes (this server keeps %u arrays of %llu elements)",
                           srv->layout.tensors[c->info->key].name, c->info->index, sh->arrays,
                           sh->out_len, len, n, (unsigned long long)c->info->count);
    if (sh->out_len) {
        memcpy(&h, data + (size_t)n * bytes, sizeof h);
        if (h.magic != PSAGG_MSG_MAGIC || h.key != c->info->key || h.chunk != c->info->index ||
            h.round + 1 != sh->round || sizeof h + h.len != sh->out_len)
            return psagg__fail(PSAGG_EPROTO,
                               "STATE of tensor '%s' chunk %u: its last update's header is not "
                               "this chunk's round %u",
                               srv->layout.tensors[c->info->key].name, c->info->index,
                               sh->round ? sh->round - 1 : 0);
    }
    for (uint32_t i = 0; i < n; i++)
        memcpy(arrays[i], data + i * bytes, bytes);
    if (c->ops->set_state)
        c->ops->set_state(c, sh->step, sh->flags);
    if (sh->out_len) { /* (sent as this server's own, should it owe it: take_over_copy) */
        uint8_t *out = c->out[(sh->round - 1) & 1];
        memcpy(out, data + (size_t)n * bytes, sh->out_len);
        ((psagg__msg_hdr *)out)->sender = (uint16_t)srv->rank;
    }
    c->round = sh->round;
    return PSAGG_OK;
}

/*
 * A copy (shadow) becomes the owner of its chunk from round `start` (the lowest round whose
 * update some worker still waits for) in view `epoch`, with the state it has: the same as the
 * dead owner's after the same rounds. The workers push the rounds from `start` on again to it.
 * A copy that finished round `start` already owes its update; one that lags goes on with the
 * pushes on their way to it. Either way no update goes out before every member took the view
 * (fence_pass): a worker still in the view before would take it for a stranger's.
 */
static void take_over_copy(server *srv, chunk_state *c, uint32_t start, uint32_t follow_end,
                           uint32_t epoch)
{
    if (c->stale) {
        server_fail_job(srv, PSAGG_EPEER,
                        "tensor '%s' chunk %u: taken over from round %u, but this server's copy "
                        "is stale from round %u (a push its owner summed, of a worker that left, "
                        "never came here): no live server has the chunk's state",
                        srv->layout.tensors[c->info->key].name, c->info->index, start,
                        c->stale - 1);
        c->broken = 1;
        return;
    }
    if (c->round > start + 1) {
        server_fail_job(srv, PSAGG_EPROTO,
                        "tensor '%s' chunk %u: taken over from round %u, but this server's copy "
                        "is at round %u already",
                        srv->layout.tensors[c->info->key].name, c->info->index, start, c->round);
        c->broken = 1;
        return;
    }
    c->shadow = 0;
    c->standby = 0;
    c->taken_over = 1;
    c->follow_until = follow_end;
    fence_begin(srv, c, epoch, start);
    c->owes_update = c->round == start + 1;
    LOG_INFO(&srv->log,
             "tensor %u chunk %u: its copy here owns it from round %u (the copy is at round %u%s), "
             "deciding rounds from %u",
             c->info->key, c->info->index, start, c->round,
             server_follows(srv, c) ? ", stepped with the lost owner's contributors" : "",
             follow_end > start ? follow_end : start);
    if (srv->pool.follow_bytes && !server_follows(srv, c) && !atomic_load(&c->deferred))
        agg_settle(srv, c); /* (it decides its round now: the pushes held for the bitmap) */
}

/* A copy that was stale is no more (its state came again, or it was reset). */
static void stale_clear(server *srv, chunk_state *c)
{
    if (c->stale)
        atomic_fetch_sub(&srv->pool.n_stale, 1);
    c->stale = 0;
}

/*
 * A move, in c's aggregation thread: forget the round being collected (its pushes go to the
 * owner of the view, which sums the round again), then own c from the item's round or hold it
 * on standby.
 */
static void do_move(server *srv, agg_item *it)
{
    chunk_state *c = it->chunk;
    if (it->move == AGG_RELAY) {
        relay_take(srv, c, it);
        free(it);
        return;
    }
    relay_clear(c);
    if (it->move == AGG_COPY) { /* (its state came with a return, or it was owned here) */
        c->shadow = 1;
        c->standby = 1;
        c->taken_over = 0;
        c->follow_until = 0; /* (a copy follows every round) */
        stale_clear(srv, c); /* (its state came now) */
        c->fenced = 0;
        c->owes_update = 0;
        LOG_DEBUG(&srv->log, "tensor %u chunk %u: a copy here from round %u", c->info->key,
                  c->info->index, c->round);
        free(it);
        return;
    }
    if (c->shadow && it->move == AGG_OWN) {
        take_over_copy(srv, c, it->round, it->follow_end, it->epoch);
        free(it);
        return;
    }
    for (int w = 0; w < srv->n_workers; w++)
        if (c->held && c->held[w])
            release_held(srv, c, w);
    for (recv_buf *rb; (rb = ahead_pop(srv, c));)
        server_queue_repost(srv, rb);
    atomic_store(&c->deferred, 0); /* (a whole round waiting for a send: summed again there) */
    round_reset(srv, c);
    c->broken = 0;
    stale_clear(srv, c);
    c->fenced = 0; /* (a fence of a move before: a relayed takeover below fences it again) */
    c->owes_update = 0;
    c->standby = it->move != AGG_OWN;
    c->shadow = 0; /* (a chunk given up keeps no copy: its state was reset) */
    c->taken_over = it->move == AGG_OWN;
    c->follow_until = it->follow_end;
    if (it->move == AGG_OWN) {
        c->round = it->round;
        c->relay_from = it->round;
        c->relay_end = it->relay_end;
        if (relayed_round(c)) {
            fence_begin(srv, c, it->epoch, it->round);
            relay_round_start(srv, c);
        }
    }
    LOG_DEBUG(&srv->log, "tensor %u chunk %u: %s", c->info->key, c->info->index,
              it->move == AGG_OWN ? "owned from the view's round" : "given up (held on standby)");
    free(it);
}

/* How often an idle aggregation thread looks at its rounds' deadlines. */
#define DEADLINE_CHECK_MS 100

static void *agg_main(void *arg)
{
    agg_thread *t = arg;
    server *srv = t->srv;
    int64_t next_check = psagg__now_ms() + DEADLINE_CHECK_MS;

    for (;;) {
        agg_item *it;
        int64_t now, busy_from;
        pthread_mutex_lock(&t->mu);
        while (!t->head && !t->stop) {
            struct timespec until;
            int64_t ms = DEADLINE_CHECK_MS;
            if (t->wake_ms) { /* its round policy's timer (a quorum's grace) may be sooner */
                int64_t left = t->wake_ms - psagg__now_ms();
                ms = left < 1 ? 1 : left < ms ? left : ms;
            }
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += ms * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            if (pthread_cond_timedwait(&t->cv, &t->mu, &until) == ETIMEDOUT)
                break;
        }
        if (t->stop && !t->head) {
            pthread_mutex_unlock(&t->mu);
            break;
        }
        now = psagg__now_ms();
        if (t->wake_ms && now >= t->wake_ms && !atomic_load(&srv->job.failed)) {
            pthread_mutex_unlock(&t->mu);
            t->wake_ms = srv->pool.policy->timer(srv, t, now);
            continue;
        }
        if (now >= next_check) {
            pthread_mutex_unlock(&t->mu);
            if (!atomic_load(&srv->job.failed))
                check_rounds(srv, t, now);
            next_check = now + DEADLINE_CHECK_MS;
            continue;
        }
        if (!t->head) {
            pthread_mutex_unlock(&t->mu);
            continue;
        }
        it = t->head;
        t->head = it->next;
        if (!t->head)
            t->tail = NULL;
        pthread_mutex_unlock(&t->mu);

        if (it == &t->barrier) { /* agg_barrier: everything before it is done; it waits here
                                       until agg_release, so the caller reads still state */
            pthread_mutex_lock(&srv->pool.barrier_mu);
            uint64_t gen = srv->pool.barrier_gen;
            if (--srv->pool.barrier_left == 0)
                pthread_cond_broadcast(&srv->pool.barrier_cv);
            /* (this barrier's release, even if the next barrier is held before this thread
               wakes: it must go on to that one's marker) */
            while (srv->pool.barrier_held && srv->pool.barrier_gen == gen)
                pthread_cond_wait(&srv->pool.barrier_cv, &srv->pool.barrier_mu);
            pthread_mutex_unlock(&srv->pool.barrier_mu);
            continue;
        }
        busy_from = psagg__now_ns();
        if (it->move) { /* (a server view's: failover.c) */
            do_move(srv, it);
            continue;
        }
        if (!it->rb)
            atomic_store(&it->chunk->retry_queued, 0);
        if (it->rb) {
            if (atomic_load(&srv->job.failed) || !handle_push(srv, it->chunk, it->rb))
                server_queue_repost(srv, it->rb);
        } else if (!atomic_load(&srv->job.failed) && atomic_load(&it->chunk->deferred)) {
            agg_finish_round(srv, it->chunk);
        } else if (!atomic_load(&srv->job.failed)) {
            agg_settle(srv, it->chunk); /* the membership changed (membership.c) */
        }
        metrics_busy(srv, (uint32_t)(t - srv->pool.threads), psagg__now_ns() - busy_from);
    }
    return NULL;
}

/*
 * A copy that follows its owner, whose bitmap of its round names the push of a worker that left
 * (elastic) and never came here, is stale (wire.h): it lets every push go from now on, and its
 * server fails the job should a view hand it the chunk (take_over_copy). Returns 1 when c is.
 */
static int follow_stale(server *srv, chunk_state *c)
{
    int w = 0;
    if (c->stale || !server_follows(srv, c) || !c->follow_has)
        return c->stale != 0;
    while (
        w < srv->n_workers &&
        (c->arrived[w] || !psagg__bitmap_has(c->follow_bits, (uint32_t)w) || server_member(srv, w)))
        w++;
    if (w == srv->n_workers)
        return 0;
    c->stale = c->round + 1;
    atomic_fetch_add(&srv->pool.n_stale, 1);
    LOG_WARN(&srv->log,
             "tensor %u chunk %u: this copy is stale from round %u: its owner summed the push of "
             "worker %d, which left before that push came here; the copy steps no more (a view "
             "that hands it the chunk fails the job)",
             c->info->key, c->info->index, c->round, w);
    for (int k = 0; k < srv->n_workers; k++)
        if (c->held && c->held[k])
            release_held(srv, c, k);
    for (recv_buf *rb; (rb = ahead_pop(srv, c));)
        server_queue_repost(srv, rb);
    round_reset(srv, c);
    return 1;
}

void agg_settle(server *srv, chunk_state *c)
{
    if (follow_stale(srv, c))
        return;
    if (!c->broken && c->n_arrived && (c->ops->settle(srv, c) & CHUNK_COMPLETE))
        agg_finish_round(srv, c);
    else if (!c->broken && c->n_arrived)
        srv->pool.policy->changed(srv, c);
}

void agg_send_done(server *srv, send_ctx *sc)
{
    chunk_state *c = sc->chunk;
    if (atomic_fetch_sub(&c->sends_pending[sc->parity], 1) == 1 && atomic_load(&c->deferred))
        agg_enqueue(srv, c, NULL);
}

void agg_enqueue(server *srv, chunk_state *c, recv_buf *rb)
{
    agg_thread *t = &srv->pool.threads[c->thread];
    agg_item *it = rb ? &rb->item : &c->retry;
    if (!rb && atomic_exchange(&c->retry_queued, 1))
        return; /* already queued: one retry serves both parities */
    *it = (agg_item){.rb = rb, .chunk = c};
    queue_item(t, it);
}

void agg_barrier(server *srv)
{
    pthread_mutex_lock(&srv->pool.barrier_mu);
    srv->pool.barrier_left = srv->pool.n_threads;
    srv->pool.barrier_held = 1;
    pthread_mutex_unlock(&srv->pool.barrier_mu);
    for (int i = 0; i < srv->pool.n_threads; i++) {
        agg_thread *t = &srv->pool.threads[i];
        pthread_mutex_lock(&t->mu);
        t->barrier = (agg_item){0};
        if (t->tail)
            t->tail->next = &t->barrier;
        else
            t->head = &t->barrier;
        t->tail = &t->barrier;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_lock(&srv->pool.barrier_mu);
    while (srv->pool.barrier_left > 0)
        pthread_cond_wait(&srv->pool.barrier_cv, &srv->pool.barrier_mu);
    pthread_mutex_unlock(&srv->pool.barrier_mu);
}

void agg_release(server *srv)
{
    pthread_mutex_lock(&srv->pool.barrier_mu);
    srv->pool.barrier_held = 0;
    srv->pool.barrier_gen++;
    pthread_cond_broadcast(&srv->pool.barrier_cv);
    pthread_mutex_unlock(&srv->pool.barrier_mu);
}

/*
 * The kind of a chunk of a tensor declared a parameter or not, in `codec`. With chunk_sum, the
 * only places that choose by kind: everything else asks the chunk's tables.
 */
static const chunk_ops *chunk_kind(int param, psagg_codec_id codec)
{
    return param                      ? &param_chunk_ops
           : codec == PSAGG_CODEC_THC ? &thc_chunk_ops /* (integers: no fp32 sum) */
                                      : &sum_chunk_ops;
}

/*
 * How chunk c is summed, chosen once in its thread: on the thread's GPU assist when it has
 * one, the chunk is large enough and the GPU takes that many inputs, unless its kind reads
 * the sum on the host or its codec has no CUDA kernels (topk); else on the CPU.
 */
static const chunk_sum_ops *chunk_sum(const server *srv, const agg_thread *t, const chunk_state *c)
{
    if (c->ops->sum) /* (the kind's own: thc's integers) */
        return c->ops->sum;
    return t->cuda && !c->ops->host_sum && c->info->count >= srv->cfg.gpu_min_elems &&
                   srv->n_workers <= gpu_max_inputs() &&
                   srv->layout.tensors[c->info->key].codec.id != PSAGG_CODEC_TOPK /* (host) */
               ? &gpu_sum_ops
               : &cpu_sum_ops;
}

/*
 * Allocate and register the buffers of one chunk, from the calling thread's arena: those
 * every kind has, then its sum's and its kind's.
 */
static psagg_status chunk_alloc(server *srv, chunk_state *c)
{
    const psagg__chunk_info *ci = c->info;
    size_t enc = ci->cap_bytes, n = (size_t)srv->n_workers;
    size_t out = c->out_cap =
        (size_t)c->ops->out_bytes(&srv->layout.tensors[ci->key].codec, ci->count, enc);
    psagg_status st;

    c->arrived = arena_alloc(n);
    c->seen = arena_alloc(n * sizeof *c->seen);
    c->held = arena_alloc(n * sizeof *c->held);
    if ((srv->cfg.server_replicas && !(c->repushed = arena_alloc(n))) ||
        (srv->pool.follow_bytes && !(c->follow_bits = arena_alloc(srv->pool.follow_bytes))))
        return psagg__fail(PSAGG_ENOMEM, "buffers of tensor %u chunk %u", ci->key, ci->index);
    c->slots = arena_alloc(n * enc);
    c->sctx[0].to = arena_alloc(2 * n);
    for (int p = 0; p < 2; p++) {
        uint8_t *to = c->sctx[0].to ? c->sctx[0].to + (size_t)p * n : NULL;
        c->sctx[p] = (send_ctx){.chunk = c, .parity = p, .to = to};
        size_t bytes = sizeof(psagg__msg_hdr) + out + srv->pool.bitmap_bytes + srv->tag_bytes;
        c->out[p] = arena_alloc(bytes);
        if (!c->out[p])
            break;
        if (psagg__fabric_reg(srv->fab, c->out[p], bytes, &c->out_desc[p]))
            return psagg__fail_context(PSAGG_EFABRIC, "registering update buffers: ");
    }
    if (!c->arrived || !c->seen || !c->held || !c->slots || !c->sctx[0].to || !c->out[0] ||
        !c->out[1])
        return psagg__fail(PSAGG_ENOMEM, "buffers of tensor %u chunk %u", ci->key, ci->index);
    if ((st = c->sum->alloc(srv, c)))
        return st;
    return c->ops->alloc(srv, c);
}

/*
 * What one owned chunk of kind `ops`, `count` elements, `enc` bytes encoded, costs
 * (chunk_alloc; the accumulator counted whichever way it is summed).
 */
static uint64_t chunk_bytes(const server *srv, const psagg_codec *codec, uint64_t count, size_t enc,
                            const chunk_ops *ops)
{
    uint64_t n = (uint64_t)srv->n_workers, out = ops->out_bytes(codec, count, enc);
    return sizeof(chunk_state) + 3 * n + 4 * n + n * sizeof(void *) + n * enc + 4 * count +
           ops->state_bytes(srv, count) + srv->pool.follow_bytes +
           2 * (sizeof(psagg__msg_hdr) + out + srv->pool.bitmap_bytes + srv->tag_bytes);
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a + b < a ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/*
 * The layout balances encoded bytes over the servers within one chunk, so a server's share
 * of the job's chunk memory is at most total / servers + the largest chunk; the layout
 * itself costs every server its tables. Both are counted, in saturating arithmetic, from the
 * declaration alone.
 */
psagg_status agg_check_budget(const server *srv, const psagg__ctl_tensor *decl, uint32_t n,
                              uint64_t chunk_elems, uint32_t adapt_interval)
{
    uint64_t total = 0, chunks = 0, worst = 0, biggest_chunk = 0, need;
    uint32_t worst_t = 0;
    char name[48];

    chunk_elems = psagg__layout_chunk_elems(decl, n, chunk_elems, (uint32_t)srv->cfg.n_servers);
    for (uint32_t t = 0; t < n; t++) {
        psagg_codec c = psagg__tensor_codec(&decl[t]);
        uint64_t count = decl[t].count, ce, full, rem, bytes;
        const chunk_ops *ops = chunk_kind((decl[t].flags & PSAGG_DECL_PARAM) != 0, c.id);
        if (decl[t].codec > PSAGG_CODEC_THC || psagg__codec_check(&c) || !count)
            continue; /* psagg__layout_build refuses it, with its own message */
        ce = psagg__codec_chunk_elems(&c, chunk_elems);
        if (adapt_interval && psagg__adapt_declarable(&c)) /* buffers hold the largest */
            c = psagg__adapt_largest(&c, ce);
        full = count / ce;
        rem = count % ce;
        bytes = sat_add(sat_mul(full, chunk_bytes(srv, &c, ce, psagg__encoded_size(&c, ce), ops)),
                        rem ? chunk_bytes(srv, &c, rem, psagg__encoded_size(&c, rem), ops) : 0);
        chunks = sat_add(chunks, full + (rem != 0));
        total = sat_add(total, bytes);
        if (chunk_bytes(srv, &c, ce, psagg__encoded_size(&c, ce), ops) > biggest_chunk)
            biggest_chunk = chunk_bytes(srv, &c, ce, psagg__encoded_size(&c, ce), ops);
        if (bytes > worst) {
            worst = bytes;
            worst_t = t;
        }
    }
    need = sat_add(sat_add(total / (uint64_t)srv->cfg.n_servers, biggest_chunk),
                   sat_add(sat_mul(chunks, sizeof(psagg__chunk_info) + sizeof(uint32_t)),
                           sat_mul(n, sizeof(psagg__tensor_info))));
    if (chunks <= PSAGG_MAX_CHUNKS && need <= srv->pool.budget)
        return PSAGG_OK;
    snprintf(name, sizeof name, "%.40s", decl[worst_t].name);
    if (chunks > PSAGG_MAX_CHUNKS)
        return psagg__fail(PSAGG_ENOMEM,
                           "the declaration makes %llu chunks, more than %u; tensor %u '%s' (%llu "
                           "elements) alone needs %llu MiB",
                           (unsigned long long)chunks, PSAGG_MAX_CHUNKS, worst_t, name,
                           (unsigned long long)decl[worst_t].count,
                           (unsigned long long)(worst >> 20));
    return psagg__fail(PSAGG_ENOMEM,
                       "the declaration needs %llu MiB here, over the budget of %llu MiB ([server] "
                       "memory_budget_mb); "
                       "tensor %u '%s' (%llu elements) alone needs %llu MiB across %d server(s)",
                       (unsigned long long)(need >> 20),
                       (unsigned long long)(srv->pool.budget >> 20), worst_t, name,
                       (unsigned long long)decl[worst_t].count, (unsigned long long)(worst >> 20),
                       srv->cfg.n_servers);
}

/* Whether this server holds chunk ci's state for a takeover: its owner is one of the
   [cluster] server_replicas servers before this one on the ring. */
static int standby_here(const server *srv, const psagg__chunk_info *ci)
{
    uint32_t n = (uint32_t)srv->cfg.n_servers;
    uint32_t behind = ((uint32_t)srv->rank + n - ci->owner) % n;
    return behind >= 1 && behind <= (uint32_t)srv->cfg.server_replicas;
}

/*
 * Build the table of held chunks (the owned ones, then the standby ones) and pin each to a
 * thread (slot % threads); route the owned ones here.
 */
psagg_status agg_setup(server *srv)
{
    const psagg__layout *l = &srv->layout;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t next_standby;

    srv->pool.n_threads =
        srv->cfg.server_threads > 0 ? srv->cfg.server_threads : (int)(cores > 0 ? cores : 1);
    srv->n_owned = l->owned_count[srv->rank];
    srv->n_held = srv->n_owned;
    for (uint32_t i = 0; i < l->n_chunks; i++)
        srv->n_held += standby_here(srv, &l->chunks[i]);
    srv->chunks = calloc(srv->n_held ? srv->n_held : 1, sizeof *srv->chunks);
    srv->route = calloc(l->n_chunks ? l->n_chunks : 1, sizeof *srv->route);
    if (!srv->chunks || !srv->route)
        return psagg__fail(PSAGG_ENOMEM, "chunk table of %u chunks", srv->n_held);
    next_standby = srv->n_owned;
    for (uint32_t i = 0; i < l->n_chunks; i++) {
        const psagg__chunk_info *ci = &l->chunks[i];
        uint32_t slot;
        chunk_state *c;
        atomic_init(&srv->route[i], -1);
        if (ci->owner == (uint32_t)srv->rank) {
            slot = ci->slot;
            /* (a server that rejoins owns its chunks once a view gives them back) */
            atomic_init(&srv->route[i], srv->ctl.rejoin ? -1 : (int)slot);
        } else if (standby_here(srv, ci)) {
            slot = next_standby++;
        } else {
            continue;
        }
        c = &srv->chunks[slot];
        c->standby = slot >= srv->n_owned || srv->ctl.rejoin;
        /* a stateful chunk's standby state (a parameter's, or any with a server residual) is
           a copy that runs every round, unless this server rejoins (it has no state to start
           from: no view moves such a chunk to it) */
        c->shadow = c->standby && (l->tensors[ci->key].param || srv->cfg.server_error_feedback) &&
                    !srv->ctl.rejoin;
        if (c->shadow)
            atomic_init(&srv->route[i], (int)slot);
        c->info = ci;
        c->codec = l->tensors[ci->key].codec;
        c->enc = ci->enc_bytes;
        c->thread = slot % (uint32_t)srv->pool.n_threads;
        c->ops = chunk_kind(l->tensors[ci->key].param, l->tensors[ci->key].codec.id);
    }
    return PSAGG_OK;
}

/*
 * Start the pool. Each thread first allocates the buffers of the chunks pinned to it from
 * an arena of its own and reports to srv->pool.startup; agg_start returns once all have, with the
 * first failure if any.
 */
static void *agg_thread_start(void *arg)
{
    agg_thread *t = arg;
    server *srv = t->srv;
    agg_startup *su = &srv->pool.startup;
    psagg_status st = PSAGG_OK;
    int self = (int)(t - srv->pool.threads);

    if (arena_thread_init())
        LOG_DEBUG(&srv->log, "aggregation thread %d: no arena of its own", self);
    st = gpu_thread_init(srv, t);
    for (uint32_t i = 0; i < srv->n_held && !st; i++) {
        chunk_state *c = &srv->chunks[i];
        if ((int)c->thread != self)
            continue;
        c->sum = chunk_sum(srv, t, c);
        st = chunk_alloc(srv, c);
    }
    pthread_mutex_lock(&su->mu);
    if (st && !su->status) {
        su->status = st;
        snprintf(su->error, sizeof su->error, "%s", psagg_last_error());
    }
    su->left--;
    pthread_cond_broadcast(&su->cv);
    pthread_mutex_unlock(&su->mu);
    return agg_main(arg);
}

psagg_status agg_start(server *srv)
{
    agg_startup *su = &srv->pool.startup;
    psagg_status st = PSAGG_OK;

    srv->pool.threads = calloc((size_t)srv->pool.n_threads, sizeof *srv->pool.threads);
    if (!srv->pool.threads)
        return psagg__fail(PSAGG_ENOMEM, "aggregation threads");
    for (int i = 0; i < srv->pool.n_threads; i++) {
        agg_thread *t = &srv->pool.threads[i];
        t->srv = srv;
        pthread_mutex_init(&t->mu, NULL);
        {
            pthread_condattr_t ca; /* agg_main's timed waits are on CLOCK_MONOTONIC */
            pthread_condattr_init(&ca);
            pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
            pthread_cond_init(&t->cv, &ca);
            pthread_condattr_destroy(&ca);
        }
    }
    su->left = srv->pool.n_threads;
    su->status = PSAGG_OK;
    for (int i = 0; i < srv->pool.n_threads; i++) {
        if (pthread_create(&srv->pool.threads[i].tid, NULL, agg_thread_start,
                           &srv->pool.threads[i])) {
            pthread_mutex_lock(&su->mu);
            su->left -= srv->pool.n_threads - i;
            pthread_mutex_unlock(&su->mu);
            st = psagg__fail(PSAGG_EIO, "cannot start aggregation thread %d", i);
            srv->pool.n_threads = i; /* agg_stop joins the ones that run */
            break;
        }
    }
    srv->pool.started = 1;
    pthread_mutex_lock(&su->mu);
    while (su->left > 0)
        pthread_cond_wait(&su->cv, &su->mu);
    pthread_mutex_unlock(&su->mu);
    if (!st && su->status)
        st = psagg__fail(su->status, "%s", su->error);
    return st;
}

void agg_stop(server *srv)
{
    if (!srv->pool.started)
        return;
    for (int i = 0; i < srv->pool.n_threads; i++) {
        agg_thread *t = &srv->pool.threads[i];
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
    }
    for (int i = 0; i < srv->pool.n_threads; i++) {
        pthread_join(srv->pool.threads[i].tid, NULL);
        gpu_thread_fini(&srv->pool.threads[i]);
    }
    srv->pool.started = 0;
}

void agg_teardown(server *srv)
{
    for (uint32_t i = 0; srv->chunks && i < srv->n_held; i++) {
        chunk_state *c = &srv->chunks[i];
        if (c->ops) /* chunk_alloc's order, reversed; each frees what it allocated, if any */
            c->ops->free(c);
        if (c->sum)
            c->sum->free(c);
        arena_free(c->arrived);
        arena_free(c->seen);
        arena_free(c->held);
        arena_free(c->repushed);
        arena_free(c->follow_bits);
        relay_clear(c);
        arena_free(c->slots);
        arena_free(c->out[0]);
        arena_free(c->out[1]);
    }
    free(srv->chunks);
    srv->chunks = NULL;
    while (srv->pool.spills) /* (left in a queue when the threads stopped) */
        agg_spill_free(srv, srv->pool.spills);
    free(srv->route);
    srv->route = NULL;
    for (int i = 0; srv->pool.threads && i < srv->pool.n_threads; i++) {
        agg_thread *t = &srv->pool.threads[i];
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
    }
    free(srv->pool.threads);
    srv->pool.threads = NULL;
}

void agg_settle_routed(server *srv)
{
    if (!srv->pool.started)
        return;
    psagg__fabric_wake(srv->fab);
    for (uint32_t i = 0; i < srv->n_held; i++) /* (the chunks routed here: a takeover's too) */
        if (atomic_load(&srv->route[srv->chunks[i].info - srv->layout.chunks]) == (int)i)
            agg_enqueue(srv, &srv->chunks[i], NULL);
}
