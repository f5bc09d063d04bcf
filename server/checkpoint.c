/*
 * checkpoint.c - checkpoints as the workers ask for them (the control thread). A worker asks
 * (CHECKPOINT) with no operation in flight. When every round waits for every member, its
 * chunks are then all between the same two rounds: the checkpoint is written at once. When
 * the round policy lets rounds close without a worker ([server] quorum), others may be a
 * round ahead of the one asking: only when every member is between steps are all chunks
 * between the same rounds, so every member asks at the same step (a collective,
 * round_policy.collective_checkpoint) and the file is written once the last has, within
 * op_timeout_ms of the first (checkpoint_tick), or each gets why not, naming who did not ask.
 * The file holds every parameter chunk's state (param.c's optim_checkpoint; its format:
 * ckpt_file.c).
 *
 * Two phases, so that a checkpoint is whole on every server or on none: the request above is a
 * PREPARE, written as <file>.pending stamped with the checkpoint's sequence (the asking
 * worker's clock; a collective one's: the largest of the members'); the worker sends COMMIT
 * with the same sequence only once every server it asked answered OK, and the pending file
 * then takes the current one's place (which is kept as <file>.prev). A call that fails on one
 * server leaves every server's current file as it was; a commit cut short by a death leaves
 * the servers that committed the checkpoint before as <file>.prev, which a resume with server
 * replicas falls back to (ckpt_file.c).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/channel.h"
#include "server.h"

/* The checkpoint requests (srv->ckpt): who asked and has no answer yet, since when. */
struct checkpoints {
    uint8_t *asked;      /* per worker */
    int64_t asked_since; /* a collective checkpoint's first request, or 0 */
    uint64_t seq;        /* the PREPARE's sequence (collective: the largest asked so far) */
    uint64_t pending;    /* the sequence of <file>.pending, or 0 */
    uint64_t committed;  /* the sequence committed last here, or 0 */
};

psagg_status checkpoint_init(server *srv)
{
    if (!(srv->ckpt = calloc(1, sizeof *srv->ckpt)) ||
        !(srv->ckpt->asked = calloc((size_t)srv->n_workers, 1)))
        return psagg__fail(PSAGG_ENOMEM, "no memory for checkpoint requests");
    return PSAGG_OK;
}

void checkpoint_fini(server *srv)
{
    if (srv->ckpt)
        free(srv->ckpt->asked);
    free(srv->ckpt);
    srv->ckpt = NULL;
}

static void checkpoint_answer(server *srv, int w, psagg_status st, const char *m)
{
    worker_conn *wc = &srv->workers[w];
    srv->ckpt->asked[w] = 0;
    if (wc->fd >= 0 && psagg__ctl_send_error(wc->fd, &wc->auth, PSAGG_CTL_CHECKPOINT_DONE, st, m))
        server_drop_worker(srv, w, PSAGG_EPEER, psagg_last_error());
}

/*
 * A parameter chunk this server took over in a server view is fenced until every member pushed
 * it in that view; until then its state may still lack rounds the pushes on their way to it
 * carry (a copy lags its owner), so it is in no consistent checkpoint yet: PSAGG_EAGAIN naming
 * it (the worker asks again after its next step), or PSAGG_OK. After agg_barrier.
 */
static psagg_status checkpoint_caught_up(const server *srv, const uint8_t *owned)
{
    for (uint32_t i = 0; i < srv->n_held; i++) {
        const chunk_state *c = &srv->chunks[i];
        if (c->param && c->fenced && owned[c->info - srv->layout.chunks])
            return psagg__fail(PSAGG_EAGAIN,
                               "no checkpoint yet: tensor '%s' chunk %u, taken over in server "
                               "view %u, has not caught up (every worker pushes its next round "
                               "first): call psagg_checkpoint again after the next step",
                               srv->layout.tensors[c->info->key].name, c->info->index,
                               (unsigned)c->fence_epoch);
    }
    return PSAGG_OK;
}

/* Write the checkpoint now and answer every worker that asked for it. */
static void checkpoint_write(server *srv)
{
    char path[PATH_MAX + 16], m[300];
    int64_t t0 = psagg__now_ns();
    uint8_t *owned = calloc(srv->layout.n_chunks ? srv->layout.n_chunks : 1, 1);
    psagg_status st;
    /* the aggregation threads' writes of finished rounds, visible; and no more until the file
       is written (a round that finishes meanwhile, a fence lifted: a torn state) */
    agg_barrier(srv);
    /* the chunks this server owns in the view it applied: with server replicas each chunk's
       state is written by its owner alone (a copy may lag it by the pushes on their way) */
    for (uint32_t g = 0; owned && g < srv->layout.n_chunks; g++)
        owned[g] = (uint8_t)failover_owns(srv, g);
    if (!owned)
        st = psagg__fail(PSAGG_ENOMEM, "no memory for a checkpoint");
    else if (!(st = checkpoint_caught_up(srv, owned)))
        st = optim_checkpoint(srv, owned, srv->ckpt->seq, path, sizeof path);
    agg_release(srv);
    srv->ckpt->pending = st ? 0 : srv->ckpt->seq;
    srv->ckpt->seq = 0;
    free(owned);
    metrics_checkpoint(srv, psagg__now_ns() - t0, !st);
    snprintf(m, sizeof m, "%.290s", st ? psagg_last_error() : path);
    if (st == PSAGG_EAGAIN)
        LOG_WARN(&srv->log, "a checkpoint was asked for: %s", m);
    else if (st)
        LOG_ERROR(&srv->log, "a checkpoint was asked for: %s", m);
    srv->ckpt->asked_since = 0;
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->ckpt->asked[w])
            checkpoint_answer(srv, w, st, m);
}

/*
 * A COMMIT of checkpoint seq: the pending file of that checkpoint takes the current one's
 * place. A collective checkpoint was prepared under the largest of the members' sequences, and
 * every member commits it: the first one does, the others find it done.
 */
static void checkpoint_commit(server *srv, int w, uint64_t seq)
{
    struct checkpoints *k = srv->ckpt;
    int collective = srv->pool.policy->collective_checkpoint;
    char path[PATH_MAX + 16], m[300];
    psagg_status st = PSAGG_OK;

    if (k->pending && (seq == k->pending || (collective && seq < k->pending))) {
        if (!(st = ckpt_commit(srv, path, sizeof path))) {
            k->committed = k->pending;
            LOG_INFO(&srv->log, "checkpoint %llu committed: %s", (unsigned long long)k->pending,
                     path);
        }
        k->pending = 0;
    } else if (k->committed && (seq == k->committed || (collective && seq < k->committed))) {
        ckpt_path(srv, srv->rank, "", path, sizeof path); /* (another member's COMMIT did it) */
    } else {
        st = psagg__fail(PSAGG_EINVAL,
                         "server %d: no checkpoint %llu was prepared here to commit (%s)",
                         srv->rank, (unsigned long long)seq,
                         k->pending ? "another one was prepared since: without [server] quorum "
                                      "one worker asks for checkpoints, e.g. rank 0"
                                    : "none waits");
    }
    snprintf(m, sizeof m, "%.290s", st ? psagg_last_error() : path);
    if (st)
        LOG_ERROR(&srv->log, "worker %d asked to commit a checkpoint: %s", w, m);
    checkpoint_answer(srv, w, st, m);
}

void checkpoint_asked(server *srv, int w, const psagg__ctl_hdr *h, const void *body)
{
    psagg__ctl_checkpoint ck;
    char why[120];
    memset(&ck, 0, sizeof ck);
    if (h->len == sizeof ck)
        memcpy(&ck, body, sizeof ck);
    if (h->len != sizeof ck)
        snprintf(why, sizeof why, "a CHECKPOINT frame of %u bytes, not %zu", h->len, sizeof ck);
    else if (!ck.sequence || ck.reserved) /* (the field named holds ck.reserved: 0 or not) */
        snprintf(why, sizeof why,
                 "CHECKPOINT field %s is %u (sequence must be nonzero, reserved 0)",
                 ck.reserved ? "reserved" : "sequence", ck.reserved);
    else if (ck.phase != PSAGG_CKPT_PREPARE && ck.phase != PSAGG_CKPT_COMMIT)
        snprintf(why, sizeof why, "CHECKPOINT field phase is %u (PREPARE %d, COMMIT %d)", ck.phase,
                 PSAGG_CKPT_PREPARE, PSAGG_CKPT_COMMIT);
    else
        why[0] = '\0';
    if (why[0]) {
        server_drop_worker(srv, w, PSAGG_EPROTO, why);
        return;
    }
    if (!server_member(srv, w)) { /* (a joiner, or one admitted by an epoch not applied here) */
        checkpoint_answer(srv, w, PSAGG_EAGAIN,
                          "a checkpoint asked by a worker that is no member here (yet): ask "
                          "again after a step");
        return;
    }
    if (ck.phase == PSAGG_CKPT_COMMIT) {
        checkpoint_commit(srv, w, ck.sequence);
        return;
    }
    if (ck.sequence > srv->ckpt->seq)
        srv->ckpt->seq = ck.sequence;
    srv->ckpt->asked[w] = 1;
    if (!srv->pool.policy->collective_checkpoint) {
        checkpoint_write(srv);
        return;
    }
    if (!srv->ckpt->asked_since)
        srv->ckpt->asked_since = psagg__now_ms();
    checkpoint_tick(srv, psagg__now_ms());
}

void checkpoint_tick(server *srv, int64_t now)
{
    char missing[128] = "", m[400]; /* (the answer keeps what its frame holds) */
    size_t used = 0;
    int all = 1;
    if (!srv->ckpt->asked_since)
        return;
    for (int w = 0; w < srv->n_workers; w++)
        if (server_member(srv, w) && !srv->ckpt->asked[w]) {
            all = 0;
            used = psagg__list_int(missing, sizeof missing, used, w);
        }
    if (all) {
        checkpoint_write(srv);
        return;
    }
    /* (op_timeout_ms: before the rounds the others went on with give up on the lone one, at
       1.5 x op_timeout_ms, so it hears why and goes on) */
    if (now - srv->ckpt->asked_since <= srv->cfg.op_timeout_ms)
        return;
    snprintf(m, sizeof m,
             "server %d: no checkpoint: with [server] quorum every worker calls psagg_checkpoint "
             "at the same step (rounds may close without one), and workers %s did not within "
             "op_timeout_ms=%d",
             srv->rank, missing, srv->cfg.op_timeout_ms);
    LOG_WARN(&srv->log, "%s", m);
    srv->ckpt->asked_since = 0;
    for (int w = 0; w < srv->n_workers; w++)
        if (srv->ckpt->asked[w])
            checkpoint_answer(srv, w, PSAGG_ETIMEDOUT, m);
}
