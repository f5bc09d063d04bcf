/*
 * quorum.c - round policies: when a round of a chunk closes, and whose pushes it sums
 * (server.h's round_policy; aggregate.c asks the server's policy, chosen once at start-up).
 *
 *   every_member   a round closes when every member has pushed (membership.c says who is one:
 *                  all the workers, unless [cluster] elastic); a push of a round that is over
 *                  is stale.
 *   quorum         [server] quorum, grace_ms (straggler tolerance, runtime/wire.h): a round of
 *                  gradients (chunk_ops.partial; not of a tensor declared rare: a broadcast
 *                  key, whose root's push is the data) also closes grace_ms after `quorum` of the
 *                  live workers have pushed, without the workers still missing, provided each
 *                  of them is at most one round behind; every update then ends with its
 *                  contributor bitmap, and a late push of the round before counts as seen.
 *                  A chunk's copy ([cluster] server_replicas) closes no round itself: it
 *                  steps each with its owner's contributors (aggregate.c's follow_learn).
 *
 * A policy's calls run in the chunk's aggregation thread; its state is the chunk's (its
 * close_at_ms, closing and seen) and the thread's wake time (agg_thread.wake_ms).
 */
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "server.h"

/* every_member: nothing closes early, nothing is late, no bitmap. */
static int every_late(server *srv, chunk_state *c, int w, uint32_t round)
{
    (void)srv, (void)c, (void)w, (void)round;
    return 0;
}

static void every_pushed(server *srv, chunk_state *c, int w, uint32_t round, int complete)
{
    (void)srv, (void)c, (void)w, (void)round, (void)complete;
}

static void every_changed(server *srv, chunk_state *c)
{
    (void)srv, (void)c;
}

static int64_t every_timer(server *srv, agg_thread *t, int64_t now)
{
    (void)srv, (void)t, (void)now;
    return 0;
}

/* The update's contributor bitmap (wire.h), after its payload: the workers whose pushes the
   round summed; nothing where the job has no bitmap (srv->pool.bitmap_bytes = 0). */
static size_t contributors(const server *srv, const chunk_state *c, uint8_t *bits)
{
    memset(bits, 0, srv->pool.bitmap_bytes);
    for (int w = 0; w < srv->n_workers && srv->pool.bitmap_bytes; w++)
        if (c->arrived[w])
            bits[w / 8] |= (uint8_t)(1u << (w % 8));
    return srv->pool.bitmap_bytes;
}

/* (a bitmap only for copies that follow their owner: srv->pool.bitmap_bytes without a quorum) */
static size_t every_trailer(server *srv, chunk_state *c, uint8_t *bits)
{
    return contributors(srv, c, bits);
}

const round_policy every_member_policy = {
    .name = "every member",
    .late = every_late,
    .pushed = every_pushed,
    .changed = every_changed,
    .timer = every_timer,
    .trailer = every_trailer,
};

static void quorum_close(server *srv, chunk_state *c, int64_t now);

/*
 * c's round has `quorum` pushes (of the live workers: all of them when fewer are alive): it
 * closes grace_ms from now without the workers still missing (quorum_close). Only a round of
 * gradients may (chunk_ops.partial). The aggregation thread wakes at the earliest such time
 * of its chunks (agg_main, quorum_timer).
 */
static void quorum_arm(server *srv, chunk_state *c)
{
    int live = 0;
    agg_thread *t = &srv->pool.threads[c->thread];
    if (server_follows(srv, c))
        return; /* (a copy: its owner's bitmap closes the round, job.c's server_passes) */
    if (c->close_at_ms < 0) { /* its grace passed: this push may be the one it waited for */
        quorum_close(srv, c, psagg__now_ms());
        return;
    }
    /* a rare tensor's round (a broadcast: the root's push is the data) waits for every member */
    if (c->close_at_ms || !c->n_arrived || !c->ops->partial(c) ||
        srv->layout.tensors[c->info->key].rare)
        return;
    /* the live workers, counted up to the quorum (beyond it the quorum is the bar) */
    for (int w = 0; w < srv->n_workers && live < srv->cfg.quorum; w++)
        live += server_member(srv, w);
    if ((int)c->n_arrived < live)
        return;
    c->close_at_ms = psagg__now_ms() + srv->cfg.grace_ms;
    if (!t->wake_ms || c->close_at_ms < t->wake_ms)
        t->wake_ms = c->close_at_ms;
    if (!srv->cfg.grace_ms)
        quorum_close(srv, c, c->close_at_ms);
}

/*
 * Close c's round without its missing workers if its grace has passed (close_at_ms -1: it
 * passed, and the round waits for a worker too far behind). A worker is left out only if its
 * push of the previous round came (wire.h): so none is ever more than one round behind, and
 * a worker holds at most one early update per chunk. Otherwise the round waits for it (its
 * late push, or its push of this round) and the op deadline still applies.
 */
static void quorum_close(server *srv, chunk_state *c, int64_t now)
{
    if (!c->close_at_ms || (c->close_at_ms > 0 && now < c->close_at_ms) || c->closing ||
        c->broken || atomic_load(&c->deferred) || server_follows(srv, c))
        return;
    for (int w = 0; w < srv->n_workers; w++)
        if (!c->arrived[w] && server_member(srv, w) && c->seen[w] < c->round) {
            c->close_at_ms = -1;
            return;
        }
    c->closing = 1;
    if (c->ops->settle(srv, c) & CHUNK_COMPLETE)
        agg_finish_round(srv, c);
}

/* A push of a round that is over: the one before this, from a worker it closed without. */
static int quorum_late(server *srv, chunk_state *c, int w, uint32_t round)
{
    if (round + 1 < c->round)
        return 0; /* older: stale */
    /* its round closed without it (a straggler): it carries the push itself */
    if (c->seen[w] < round + 1)
        c->seen[w] = round + 1;
    metrics_late(srv, w);
    LOG_DEBUG(&srv->log,
              "late push from worker %d: tensor %u chunk %u round %u (collecting %u), dropped: "
              "the round closed without it",
              w, c->info->key, c->info->index, round, c->round);
    quorum_close(srv, c, psagg__now_ms()); /* it may have been waiting for this one */
    return 1;
}

/* A push of the round was collected: its worker is seen at it; arm the grace if not whole. */
static void quorum_pushed(server *srv, chunk_state *c, int w, uint32_t round, int complete)
{
    if (c->ops->partial(c)) /* (a parameter's INIT or PULL is no round of gradients) */
        c->seen[w] = round + 1;
    if (!complete && !c->broken)
        quorum_arm(srv, c);
}

/* The membership changed and the round is not whole: fewer live, maybe a quorum now. */
static void quorum_changed(server *srv, chunk_state *c)
{
    quorum_arm(srv, c);
    quorum_close(srv, c, psagg__now_ms());
}

/*
 * The aggregation thread's chunks whose grace has passed close; the next one's time. Only a
 * time still ahead is kept: a round that could not close when its time came (it waits for a
 * worker too far behind, or for its update's buffer) is looked at again by what it waits for
 * (that push, the retry, a membership change), never by a timer already due, which would
 * wake this thread again at once, for ever, ahead of its queue.
 */
static int64_t quorum_timer(server *srv, agg_thread *t, int64_t now)
{
    int self = (int)(t - srv->pool.threads);
    int64_t next = 0;
    for (uint32_t i = 0; i < srv->n_held; i++) { /* (a chunk taken over in a view too) */
        chunk_state *c = &srv->chunks[i];
        if ((int)c->thread != self || c->close_at_ms <= 0)
            continue;
        quorum_close(srv, c, now);
        if (c->close_at_ms > now && !c->closing && (!next || c->close_at_ms < next))
            next = c->close_at_ms;
    }
    return next;
}

/* The contributor bitmap; the members a closing round left out counted. */
static size_t quorum_trailer(server *srv, chunk_state *c, uint8_t *bits)
{
    for (int w = 0; w < srv->n_workers && c->closing; w++)
        if (!c->arrived[w] && server_member(srv, w))
            metrics_left_out(srv, w);
    return contributors(srv, c, bits);
}

const round_policy quorum_policy = {
    .name = "quorum",
    .collective_checkpoint = 1,
    .late = quorum_late,
    .pushed = quorum_pushed,
    .changed = quorum_changed,
    .timer = quorum_timer,
    .trailer = quorum_trailer,
};
