/*
 * integer.c - the integer sum kind (thc_chunk_ops, its sum thc_sum_ops; kernels/thc.h): the
 * pushes of a chunk in the thc codec are b-bit indices into a table every worker shares at
 * the round's scale, so the round's update is their sum as integers. Nothing is decoded or
 * requantized here and there is no float math: each push is checked (its meta, and that its
 * scales are the round's) and kept in its slot; at the round's end the kept pushes are folded
 * into the sum stream (psagg__thc_update_fold: the process's SIMD path), whose width (4, 8 or 16
 * bits) and length follow the pushes summed, which the update's header says (quorum rounds
 * and elastic epochs sum fewer). The scales live in the workers, which take the next ones from
 * the update; the kind keeps only what they must be (the peaks of the update it sent: a push's
 * scales are their NEXT SCALE at the bits of its round's codec, which [codec] adaptive may
 * change), so that a push at another scale is refused whichever order the pushes come in. A
 * chunk whose last update this server did not send (taken over, or back after a restart) has no
 * such record for that round: its pushes must then agree with the round's first that has a
 * scale.
 */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "base/error.h"
#include "kernels/thc.h"
#include "runtime/adaptive.h"
#include "runtime/message.h"
#include "server.h"

static uint64_t thc_out_bytes(const psagg_codec *codec, uint64_t count, uint64_t enc)
{
    (void)enc; /* (its sums at 16 bits; with [codec] adaptive in either candidate's width) */
    return psagg__adapt_update_cap(codec, 0, (size_t)count);
}

/* thc_chunk_ops' state: the peaks of the update this server sent last (each block's), whose
   NEXT SCALE at the bits of the next round's codec its pushes must have, and that round. */
typedef struct thc_state {
    uint32_t round; /* the round `peak` is for (0 at first: a chunk's first round, no scales) */
    float peak[];   /* per block */
} thc_state;

static uint64_t thc_state_bytes(const server *srv, uint64_t count)
{
    (void)srv;
    return sizeof(thc_state) + 4 * (count / PSAGG_THC_MIN_BLOCK + 1);
}

/* A chunk's first round has no scale yet: every push's are 0. */
static psagg_status thc_alloc(server *srv, chunk_state *c)
{
    size_t nb = psagg__thc_blocks(c->info->count, srv->layout.tensors[c->info->key].codec.bucket);
    if (!(c->thc = arena_alloc(sizeof *c->thc + nb * sizeof(float))))
        return psagg__fail(PSAGG_ENOMEM, "buffers of tensor %u chunk %u", c->info->key,
                           c->info->index);
    memset(c->thc, 0, sizeof *c->thc + nb * sizeof(float));
    return PSAGG_OK;
}

static void thc_free(chunk_state *c)
{
    arena_free(c->thc);
    c->thc = NULL;
}

static psagg_status no_alloc(server *srv, chunk_state *c)
{
    (void)srv, (void)c;
    return PSAGG_OK;
}

static void no_free(chunk_state *c)
{
    (void)c;
}

static int thc_admit(server *srv, chunk_state *c, const recv_buf *rb, uint32_t *round)
{
    (void)srv, (void)c, (void)rb, (void)round;
    return 0;
}

static void thc_open(chunk_state *c, const psagg__msg_codec *mc)
{
    (void)c, (void)mc;
}

static int thc_agree(server *srv, chunk_state *c, int w, const psagg__msg_codec *mc)
{
    (void)srv, (void)c, (void)w, (void)mc;
    return 0;
}

/* thc_sum_ops' settle: the round is whole when every member's push is in (or it closes
   without the missing ones: [server] quorum). */
static int thc_settle(server *srv, chunk_state *c)
{
    return server_members_in(srv, c) ? CHUNK_COMPLETE : 0;
}

/*
 * Block m's scale in the round's pushes so far that have one (all the same: each was checked
 * against them as it came), and the worker whose push it is; 0 when none has.
 */
static uint32_t round_scale(const server *srv, const chunk_state *c, size_t m, int *by)
{
    size_t cap = c->info->cap_bytes;
    for (int w = 0; w < srv->n_workers; w++)
        if (c->arrived[w]) {
            float s = psagg__thc_push_scale(c->slots + (size_t)w * cap, m);
            uint32_t u;
            memcpy(&u, &s, 4);
            if (u) {
                *by = w;
                return u;
            }
        }
    return 0;
}

/*
 * thc_sum_ops' collect: check worker w's push (its meta, and that each block's scale is the
 * round's: a push at another scale cannot be added to the others, and is refused naming the
 * block and both scales) and keep it in its slot until the round's end.
 */
static int thc_collect(server *srv, chunk_state *c, int w, recv_buf *rb)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)rb->rx.buf;
    const uint8_t *payload = rb->rx.buf + sizeof *h;
    const psagg_codec *k = &c->codec;
    size_t nb = psagg__thc_blocks(c->info->count, k->bucket);
    const char *name = srv->layout.tensors[c->info->key].name;
    int known = c->thc->round == c->round; /* (else taken over, or back: not sent here) */

    if (psagg__thc_push_check(k->bits, k->bucket, payload, c->enc, c->info->count)) {
        server_close_worker(srv, w, "push of tensor '%s' chunk %u round %u: payload: %s", name,
                            h->chunk, h->round, psagg_last_error());
        return 0;
    }
    for (size_t m = 0; m < nb; m++) {
        float s = psagg__thc_push_scale(payload, m), r;
        uint32_t u, ru;
        int by = -1;
        memcpy(&u, &s, 4);
        if (!u) /* (no scale: a joiner, or a chunk's first round; nothing of it summed) */
            continue;
        if (known) { /* what the update this server sent says, at this round's bits */
            r = psagg__thc_next_scale(k->bits, c->thc->peak[m]);
            memcpy(&ru, &r, 4);
        } else if (!(ru = round_scale(srv, c, m, &by))) {
            continue;
        } else {
            memcpy(&r, &ru, 4);
        }
        if (ru == u)
            continue;
        if (known && c->round == 0)
            server_close_worker(srv, w,
                                "push of tensor '%s' chunk %u round 0: the scales disagree: "
                                "block %zu's is %.9g, but a chunk's first round has none",
                                name, h->chunk, m, (double)s);
        else if (known)
            server_close_worker(srv, w,
                                "push of tensor '%s' chunk %u round %u: the scales disagree: "
                                "block %zu's is %.9g, but round %u's update set %.9g",
                                name, h->chunk, h->round, m, (double)s, c->round - 1, (double)r);
        else
            server_close_worker(srv, w,
                                "push of tensor '%s' chunk %u round %u: the scales disagree: "
                                "block %zu's is %.9g, but the round's is %.9g (worker %d's push)",
                                name, h->chunk, h->round, m, (double)s, (double)r, by);
        return 0;
    }
    memcpy(c->slots + (size_t)w * c->info->cap_bytes, payload, c->enc);
    c->arrived[w] = 1;
    c->n_arrived++;
    return thc_settle(srv, c);
}

/* thc_sum_ops' encode: the kept pushes, in the workers' order, folded into the update. */
static psagg_status thc_encode(server *srv, chunk_state *c, psagg__rng_key key, uint8_t *payload,
                               size_t *bad)
{
    const uint8_t *in[64], **pushes = in;
    size_t n = 0, cap = c->info->cap_bytes, len;
    psagg_status st;

    (void)key, (void)bad;
    if (c->n_arrived > 64 && !(pushes = malloc(c->n_arrived * sizeof *pushes)))
        return psagg__fail(PSAGG_ENOMEM, "the fold of %u pushes", c->n_arrived);
    for (int w = 0; w < srv->n_workers; w++)
        if (c->arrived[w])
            pushes[n++] = c->slots + (size_t)w * cap;
    len = psagg__update_size(&c->codec, c->info->count, n);
    st = psagg__thc_update_fold(c->codec.bits, c->codec.bucket, pushes, n, c->enc, c->info->count,
                                payload, len);
    if (pushes != in)
        free(pushes);
    return st;
}

/* thc_chunk_ops' collect and settle: its sum's (thc_sum_ops) */
static int thc_kind_collect(server *srv, chunk_state *c, int w, recv_buf *rb)
{
    return c->sum->collect(srv, c, w, rb);
}

static int thc_kind_settle(server *srv, chunk_state *c)
{
    return c->sum->settle(srv, c);
}

/* thc_chunk_ops' finish: the update is the sum stream, as long as the pushes summed make it. */
static long thc_finish(server *srv, chunk_state *c, uint8_t *out, psagg__rng_key key)
{
    psagg__msg_hdr *h = (psagg__msg_hdr *)out;
    size_t bad = 0, len = psagg__update_size(&c->codec, c->info->count, c->n_arrived);
    psagg_status st = c->sum->encode(srv, c, key, out + sizeof *h, &bad);
    if (st) {
        server_fail_job(srv, st, "tensor '%s' chunk %u round %u: the integer sum failed: %s",
                        srv->layout.tensors[c->info->key].name, c->info->index, c->round,
                        psagg_last_error());
        return -1;
    }
    psagg__msg_init(h, PSAGG_MSG_UPDATE, (uint32_t)srv->rank, c->round, c->info, &c->codec,
                    psagg__layout_generation(&srv->layout, c->info->key, c->round));
    h->len = (uint32_t)len;
    /* what the next round's pushes must have (thc.h's NEXT SCALE of this update's peaks) */
    psagg__thc_update_peaks(c->codec.bucket, out + sizeof *h, c->info->count, c->thc->peak);
    c->thc->round = c->round + 1;
    return (long)len;
}

static int thc_advances(const chunk_state *c)
{
    (void)c;
    return 1;
}

const chunk_sum_ops thc_sum_ops = {
    .name = "integer",
    .device = 0,
    .alloc = no_alloc, /* (the pushes wait in the chunk's slots) */
    .free = no_free,
    .collect = thc_collect,
    .settle = thc_settle,
    .encode = thc_encode,
};

/* thc_chunk_ops' state: none besides the round (the scales live in the workers; a server that
   did not send the last update takes the round's from its first push with one: above). */
static uint32_t thc_kind_state(const server *srv, chunk_state *c, float **arrays, uint64_t *step,
                               uint32_t *flags)
{
    (void)srv, (void)c, (void)arrays;
    *step = 0;
    *flags = 0;
    return 0;
}

const chunk_ops thc_chunk_ops = {
    .name = "integer sum",
    .host_sum = 0,
    .sum = &thc_sum_ops,
    .out_bytes = thc_out_bytes,
    .state_bytes = thc_state_bytes,
    .alloc = thc_alloc,
    .free = thc_free,
    .admit = thc_admit,
    .open = thc_open,
    .agree = thc_agree,
    .collect = thc_kind_collect,
    .settle = thc_kind_settle,
    .finish = thc_finish,
    .advances = thc_advances,
    .partial = thc_advances, /* (a round of gradients: always 1) */
    .state = thc_kind_state,
    .set_state = NULL,
};
