/*
 * agree.h - server epochs: who decides (docs/design.md, "Servers that fail and join").
 *
 * A job's view (which servers are live, which server owns each chunk and from which round)
 * moves in epochs, and each epoch's view is decided once, whatever dies or is cut off: by
 * single-decree Paxos per epoch, the servers proposing and the member workers of the epoch
 * before accepting (the workers are the witnesses: a view counts once a majority of them
 * accepted it). Two servers that both think they lead (a partition) may both propose epoch
 * e+1; at most one view is decided for it, and the loser learns that one.
 *
 * Layer: runtime. This file is the agreement alone, with no I/O: the caller carries its messages
 * (the control connections, each with its frames' tags) and its timers, and gives each message that
 * arrives to the acceptor or proposer here, which says what to send back. A view is opaque
 * bytes here (its meaning: the caller's).
 *
 * Ballots order the attempts: (attempt << 16) | proposer rank, so that two proposers never
 * share one and a retry outbids what it saw. 0 is "none".
 *
 * Acceptor (a worker). Its state is the epoch being decided (the last one it learned + 1), the
 * highest ballot it promised and the ballot and view it accepted for that epoch.
 *   PREPARE(e, b): promise b if b is above every ballot promised for e (PROMISE with the
 *                  accepted ballot and view, if any), else NACK with the ballot promised
 *   ACCEPT(e, b, v): accept v if no higher ballot was promised (ACCEPTED), else NACK
 *   DECIDED(e, v): learn v (psagg__acceptor_on returns 2); the next epoch is e + 1
 * A message for an epoch it decided already is answered with that DECIDED (the last one) or a
 * NACK saying how far behind the sender is; one for an epoch it has not reached yet (it missed
 * a DECIDED) with a NACK asking for that epoch (ballot 0, `epoch` its own).
 *
 * Proposer (a server). psagg__proposer_start begins an attempt for epoch e with view v among n
 * acceptors (a majority is n / 2 + 1): the PREPARE to send to every acceptor, after the
 * DECIDED of epoch e - 1 (an acceptor that has it ignores it; one that missed it learns it,
 * and so never answers for an epoch it has not reached). Then each answer
 * goes to psagg__proposer_on, which says what happened:
 *   EV_SEND        out is the ACCEPT to send to every acceptor (a majority promised; the
 *                  view is the highest-ballot one the promises carried, else v)
 *   EV_DECIDED     a majority accepted: p->value is decided for e (maybe not the view this
 *                  proposer started with); send DECIDED(e, value) to everyone
 *   EV_LOST        a higher ballot was seen (p->seen): this attempt cannot win; start again
 *                  (after a random back-off) with an attempt above it, or learn the view
 *   EV_LEARNED     an acceptor has decided e already: p->value is that view
 *   EV_BEHIND      an acceptor is past e + 1 (p->behind_epoch is its epoch): this proposer
 *                  missed views, which it learns from the DECIDED frames of those epochs
 *   EV_NONE        nothing yet
 * A message that does not belong to the attempt (another epoch or ballot, an acceptor that
 * answered already) changes nothing.
 */
#ifndef PSAGG_RUNTIME_AGREE_H
#define PSAGG_RUNTIME_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "psagg/types.h"

typedef uint64_t psagg__ballot;

static inline psagg__ballot psagg__ballot_make(uint32_t attempt, uint32_t rank)
{
    return (uint64_t)attempt << 16 | (rank & 0xFFFFu);
}

static inline uint32_t psagg__ballot_attempt(psagg__ballot b)
{
    return (uint32_t)(b >> 16);
}

enum psagg__agree_kind {
    PSAGG_AGREE_PREPARE = 1,
    PSAGG_AGREE_PROMISE,
    PSAGG_AGREE_ACCEPT,
    PSAGG_AGREE_ACCEPTED,
    PSAGG_AGREE_NACK,
    PSAGG_AGREE_DECIDED,
};

/* One message of the agreement. `value` points into the sender's state: copy it to keep it. */
typedef struct psagg__agree_msg {
    uint32_t kind;
    uint32_t epoch;
    psagg__ballot ballot;   /* PREPARE, ACCEPT: the attempt's; PROMISE, ACCEPTED: the one
                               answered; NACK: the highest the acceptor promised (0: see epoch) */
    psagg__ballot accepted; /* PROMISE: the ballot of the view accepted for epoch (0: none) */
    const uint8_t *value;   /* PROMISE (when accepted), ACCEPT, DECIDED: the view */
    uint32_t value_len;
} psagg__agree_msg;

typedef struct psagg__acceptor {
    uint32_t epoch;         /* the epoch being decided: the last learned + 1 */
    psagg__ballot promised; /* for epoch */
    psagg__ballot accepted; /* for epoch, with value */
    uint8_t *value;
    uint32_t value_len;
    uint8_t *last; /* the view decided for epoch - 1 (NULL before the first) */
    uint32_t last_len;
} psagg__acceptor;

/* Start at epoch `epoch` (the first to decide; the job's start is epoch 0, decided by its
   configuration). */
void psagg__acceptor_init(psagg__acceptor *a, uint32_t epoch);
void psagg__acceptor_free(psagg__acceptor *a);
/*
 * One message to the acceptor: 0 (nothing to answer), 1 (*out is the answer to its sender), 2
 * (a view was learned: the epoch it decides is a->epoch - 1, its bytes a->last; nothing to
 * answer), or PSAGG_ENOMEM (nothing changed).
 */
int psagg__acceptor_on(psagg__acceptor *a, const psagg__agree_msg *in, psagg__agree_msg *out);

enum psagg__agree_event {
    PSAGG_AGREE_EV_NONE = 0,
    PSAGG_AGREE_EV_SEND,
    PSAGG_AGREE_EV_DECIDED,
    PSAGG_AGREE_EV_LOST,
    PSAGG_AGREE_EV_LEARNED,
    PSAGG_AGREE_EV_BEHIND,
};

typedef struct psagg__proposer {
    uint32_t rank;
    uint32_t epoch;
    psagg__ballot ballot; /* this attempt's */
    psagg__ballot seen;   /* the highest ballot any answer named */
    int phase;            /* 0 idle, 1 preparing, 2 accepting, 3 decided */
    uint32_t n, majority; /* acceptors, and how many make a majority */
    uint8_t *answered;    /* per acceptor, this phase (bit 0; bit 1: not a voter) */
    uint32_t votes;
    psagg__ballot best; /* the highest accepted ballot among the promises */
    uint8_t *value;     /* the view this attempt proposes (then: the one decided) */
    uint32_t value_len;
    uint32_t behind_epoch; /* EV_BEHIND: the epoch of an acceptor that is ahead */
} psagg__proposer;

void psagg__proposer_init(psagg__proposer *p, uint32_t rank);
void psagg__proposer_free(psagg__proposer *p);
/*
 * An attempt at epoch `epoch` with view v (len bytes) among acceptors 0..n-1 (those whose
 * member[] byte is set, when member is not NULL: the members of epoch - 1, a majority of which
 * decides; the others' answers count for nothing), its attempt number above every ballot seen
 * so far: *out is the PREPARE to send to each acceptor. PSAGG_EINVAL when there is no
 * acceptor, PSAGG_ENOMEM.
 */
psagg_status psagg__proposer_start(psagg__proposer *p, uint32_t epoch, uint32_t n,
                                   const uint8_t *member, const uint8_t *v, uint32_t len,
                                   psagg__agree_msg *out);
/* Acceptor `from` (0..n-1) answered: what happened (enum psagg__agree_event), *out set for
   EV_SEND and EV_DECIDED (the DECIDED to send to everyone); PSAGG_ENOMEM. */
int psagg__proposer_on(psagg__proposer *p, uint32_t from, const psagg__agree_msg *in,
                       psagg__agree_msg *out);

#endif
