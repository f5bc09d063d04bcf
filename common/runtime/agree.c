/*
 * agree.c - server epochs decided by single-decree Paxos per epoch (agree.h).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/agree.h"

/* Keep a copy of len bytes of v in *dst (*dst_len); 0, or -1 with nothing changed. */
static int keep(uint8_t **dst, uint32_t *dst_len, const uint8_t *v, uint32_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -1;
    if (len)
        memcpy(copy, v, len);
    free(*dst);
    *dst = copy;
    *dst_len = len;
    return 0;
}

void psagg__acceptor_init(psagg__acceptor *a, uint32_t epoch)
{
    *a = (psagg__acceptor){.epoch = epoch};
}

void psagg__acceptor_free(psagg__acceptor *a)
{
    free(a->value);
    free(a->last);
    *a = (psagg__acceptor){0};
}

static int nack(const psagg__acceptor *a, const psagg__agree_msg *in, psagg__agree_msg *out)
{
    /* a ballot above what was asked, or (the sender is off by epochs) 0 and our epoch */
    *out = (psagg__agree_msg){.kind = PSAGG_AGREE_NACK,
                              .epoch = in->epoch == a->epoch ? in->epoch : a->epoch,
                              .ballot = in->epoch == a->epoch ? a->promised : 0};
    return 1;
}

int psagg__acceptor_on(psagg__acceptor *a, const psagg__agree_msg *in, psagg__agree_msg *out)
{
    if (in->kind == PSAGG_AGREE_DECIDED) {
        /* authoritative: whoever sends it learned it from a majority; an acceptor that missed
           earlier epochs jumps (their views are superseded by this one) */
        if (in->epoch < a->epoch)
            return 0;
        if (keep(&a->last, &a->last_len, in->value, in->value_len))
            return PSAGG_ENOMEM;
        a->epoch = in->epoch + 1;
        a->promised = a->accepted = 0;
        free(a->value);
        a->value = NULL;
        a->value_len = 0;
        return 2;
    }
    if (in->kind != PSAGG_AGREE_PREPARE && in->kind != PSAGG_AGREE_ACCEPT)
        return 0;
    if (in->epoch + 1 == a->epoch && a->last) { /* decided: say what */
        *out = (psagg__agree_msg){.kind = PSAGG_AGREE_DECIDED,
                                  .epoch = in->epoch,
                                  .value = a->last,
                                  .value_len = a->last_len};
        return 1;
    }
    if (in->epoch != a->epoch)
        return nack(a, in, out);
    if (in->kind == PSAGG_AGREE_PREPARE) {
        if (in->ballot <= a->promised)
            return nack(a, in, out);
        a->promised = in->ballot;
        *out = (psagg__agree_msg){.kind = PSAGG_AGREE_PROMISE,
                                  .epoch = a->epoch,
                                  .ballot = in->ballot,
                                  .accepted = a->accepted,
                                  .value = a->accepted ? a->value : NULL,
                                  .value_len = a->accepted ? a->value_len : 0};
        return 1;
    }
    if (in->ballot < a->promised || in->ballot == 0)
        return nack(a, in, out);
    if (keep(&a->value, &a->value_len, in->value, in->value_len))
        return PSAGG_ENOMEM;
    a->promised = a->accepted = in->ballot;
    *out =
        (psagg__agree_msg){.kind = PSAGG_AGREE_ACCEPTED, .epoch = a->epoch, .ballot = in->ballot};
    return 1;
}

void psagg__proposer_init(psagg__proposer *p, uint32_t rank)
{
    *p = (psagg__proposer){.rank = rank};
}

void psagg__proposer_free(psagg__proposer *p)
{
    free(p->answered);
    free(p->value);
    *p = (psagg__proposer){0};
}

/* The next phase: nobody has answered it yet. */
static void phase(psagg__proposer *p, int ph)
{
    p->phase = ph;
    p->votes = 0;
    for (uint32_t i = 0; i < p->n; i++)
        p->answered[i] &= 2; /* (bit 1: no voter in this attempt) */
}

psagg_status psagg__proposer_start(psagg__proposer *p, uint32_t epoch, uint32_t n,
                                   const uint8_t *member, const uint8_t *v, uint32_t len,
                                   psagg__agree_msg *out)
{
    uint8_t *answered;
    uint32_t attempt, voters = 0;

    for (uint32_t i = 0; i < n; i++)
        voters += !member || member[i];
    if (voters == 0)
        return PSAGG_EINVAL;
    if (!(answered = realloc(p->answered, n)))
        return PSAGG_ENOMEM;
    p->answered = answered;
    if (keep(&p->value, &p->value_len, v, len))
        return PSAGG_ENOMEM;
    if (epoch != p->epoch) /* ballots are per epoch */
        p->seen = p->ballot = 0;
    attempt = psagg__ballot_attempt(p->seen > p->ballot ? p->seen : p->ballot);
    p->epoch = epoch;
    p->ballot = psagg__ballot_make(attempt + 1, p->rank);
    p->n = n;
    p->majority = voters / 2 + 1;
    p->best = 0;
    for (uint32_t i = 0; i < n; i++) /* (the others' answers count for nothing) */
        p->answered[i] = member && !member[i] ? 2 : 0;
    phase(p, 1);
    *out = (psagg__agree_msg){.kind = PSAGG_AGREE_PREPARE, .epoch = epoch, .ballot = p->ballot};
    return PSAGG_OK;
}

int psagg__proposer_on(psagg__proposer *p, uint32_t from, const psagg__agree_msg *in,
                       psagg__agree_msg *out)
{
    if (p->phase == 0 || from >= p->n)
        return PSAGG_AGREE_EV_NONE;
    if (in->kind == PSAGG_AGREE_DECIDED) {
        if (in->epoch != p->epoch)
            return PSAGG_AGREE_EV_NONE;
        if (keep(&p->value, &p->value_len, in->value, in->value_len))
            return PSAGG_ENOMEM;
        p->phase = 0;
        return PSAGG_AGREE_EV_LEARNED;
    }
    if (in->kind == PSAGG_AGREE_NACK) {
        if (in->epoch != p->epoch) {
            if (in->epoch > p->epoch) { /* the acceptor is past this epoch */
                p->phase = 0;
                p->behind_epoch = in->epoch;
                return PSAGG_AGREE_EV_BEHIND;
            }
            return PSAGG_AGREE_EV_NONE; /* it is behind: the caller sends it what it missed */
        }
        if (in->ballot > p->seen)
            p->seen = in->ballot;
        if (p->phase == 3 || in->ballot <= p->ballot)
            return PSAGG_AGREE_EV_NONE;
        p->phase = 0;
        return PSAGG_AGREE_EV_LOST;
    }
    if (in->epoch != p->epoch || in->ballot != p->ballot || p->answered[from])
        return PSAGG_AGREE_EV_NONE;
    if (p->phase == 1 && in->kind == PSAGG_AGREE_PROMISE) {
        p->answered[from] = 1;
        if (in->accepted > p->best) { /* a view some majority may have accepted: carry it on */
            if (keep(&p->value, &p->value_len, in->value, in->value_len))
                return PSAGG_ENOMEM;
            p->best = in->accepted;
        }
        if (++p->votes < p->majority)
            return PSAGG_AGREE_EV_NONE;
        phase(p, 2);
        *out = (psagg__agree_msg){.kind = PSAGG_AGREE_ACCEPT,
                                  .epoch = p->epoch,
                                  .ballot = p->ballot,
                                  .value = p->value,
                                  .value_len = p->value_len};
        return PSAGG_AGREE_EV_SEND;
    }
    if (p->phase == 2 && in->kind == PSAGG_AGREE_ACCEPTED) {
        p->answered[from] = 1;
        if (++p->votes < p->majority)
            return PSAGG_AGREE_EV_NONE;
        p->phase = 3;
        *out = (psagg__agree_msg){.kind = PSAGG_AGREE_DECIDED,
                                  .epoch = p->epoch,
                                  .value = p->value,
                                  .value_len = p->value_len};
        return PSAGG_AGREE_EV_DECIDED;
    }
    return PSAGG_AGREE_EV_NONE;
}
