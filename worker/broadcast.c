/*
 * broadcast.c - psagg_broadcast (psagg.h): root's bytes to every caller, through push_pulls
 * (SUM) of an fp32 tensor.
 *
 * The element stream. Each caller builds the same stream of elements, HDR_ELEMS of header and
 * then ceil(len / 3) of bytes, and pushes it `count` (the key's elements) at a time, one
 * push_pull per round, the tail of the last round zero. Every element is an integer below
 * 2^24, so a sum of them is exact in fp32 as long as it stays below 2^24 too:
 *   bytes   root pushes b0 | b1 << 8 | b2 << 16 for each 3 bytes (the last ones padded with
 *           0), every other caller 0: the sum is root's element;
 *   header  every caller pushes 1 (H_CALLERS: the callers' number C) and, when it is root,
 *           1 (H_ROOTS) and its word in 7-bit pieces (H_REF); every caller pushes its own
 *           word's pieces x (H_SUM) and their squares x^2 (H_SQUARE). A word is len | root <<
 *           42 (len <= 2^40, root < 1024): 8 pieces. Then sum x = C r and sum x^2 = C r^2 for
 *           root's piece r hold only if every x equals r (sum (x - r)^2 = 0), so every
 *           caller learns whether all passed root's len and root. Sums stay exact: at most
 *           1024 workers x 127^2 < 2^24.
 * Every caller sees the same sums, so every one decides alike once the header is in (the
 * same rounds on all: the header's length is fixed), before any byte is written, and after a
 * refusal the key's rounds are still in step. Each round's updates also say how many workers
 * they summed: fewer than the first round's means a worker left an elastic job during the
 * call, maybe root, so all stop there and refuse alike. With [server] quorum a round may
 * close without a straggler: the comm thread fails the job (h->need_rank) when that is root
 * (the others would take zeros for its bytes) or this worker (its push, carried, would land
 * in the next round).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "worker.h"

#define PIECES     8 /* of 7 bits: a 56-bit word */
#define PIECE_BITS 7
#define PIECE_MAX  ((1u << PIECE_BITS) - 1)
#define LEN_BITS   42 /* the word: len in bits 0..41, root above */

enum {
    H_CALLERS = 0,
    H_ROOTS = 1,
    H_REF = 2,
    H_SUM = H_REF + PIECES,
    H_SQUARE = H_SUM + PIECES,
    HDR_ELEMS = H_SQUARE + PIECES, /* 26 */
};

_Static_assert((PIECE_MAX * PIECE_MAX * PSAGG_MAX_WORKERS) < 1u << 24,
               "the header's sums of squares must stay exact in fp32");
_Static_assert(PSAGG_BROADCAST_MAX < (1ull << LEN_BITS) && PSAGG_MAX_WORKERS <= 1 << 14,
               "len and root must fit the header's word");

static unsigned piece(uint64_t word, int p)
{
    return (unsigned)(word >> (PIECE_BITS * p)) & PIECE_MAX;
}

/* Header element j (0..HDR_ELEMS-1) as this caller pushes it. */
static float header_elem(uint64_t word, int is_root, int j)
{
    if (j == H_CALLERS)
        return 1.0f;
    if (j == H_ROOTS)
        return is_root ? 1.0f : 0.0f;
    if (j < H_SUM)
        return is_root ? (float)piece(word, j - H_REF) : 0.0f;
    if (j < H_SQUARE)
        return (float)piece(word, j - H_SUM);
    return (float)(piece(word, j - H_SQUARE) * piece(word, j - H_SQUARE));
}

/* An element of the sums as the integer it must be (below 2^24), or -1 when it is not one. */
static long elem_value(float v)
{
    if (!(v >= 0.0f && v < 16777216.0f) || v != floorf(v))
        return -1;
    return (long)v;
}

static uint64_t word_len(uint64_t word)
{
    return word & ((1ull << LEN_BITS) - 1);
}

static int word_root(uint64_t word)
{
    return (int)(word >> LEN_BITS);
}

/*
 * The header's verdict, the same on every caller (it reads only the sums and, where they say
 * that every caller passed the same, this caller's word): PSAGG_OK when every caller passed
 * root's len and root, else the failure with this caller's message.
 */
static psagg_status header_check(const long *hdr, uint64_t word, int rank)
{
    long callers = hdr[H_CALLERS], roots = hdr[H_ROOTS];
    uint64_t ref = 0;
    int agree_ref = 1, agree_mine = 1;

    for (int p = 0; p < PIECES; p++) {
        long r = hdr[H_REF + p], x = piece(word, p);
        ref |= (uint64_t)r << (PIECE_BITS * p);
        agree_ref &= r <= (long)PIECE_MAX && hdr[H_SUM + p] == callers * r &&
                     hdr[H_SQUARE + p] == callers * r * r;
        agree_mine &= hdr[H_SUM + p] == callers * x && hdr[H_SQUARE + p] == callers * x * x;
    }
    if (callers < 1)
        return psagg__fail(PSAGG_EPROTO, "psagg_broadcast: the header's sums count %ld callers",
                           callers);
    if (roots == 1 && agree_ref)
        return PSAGG_OK;
    if (roots == 0 && agree_mine)
        return psagg__fail(PSAGG_EPEER,
                           "psagg_broadcast: root %d did not take part (%ld workers called with "
                           "root %d and len %llu): it left the job, or is not calling",
                           word_root(word), callers, word_root(word),
                           (unsigned long long)word_len(word));
    if (roots != 1)
        return psagg__fail(PSAGG_EMISMATCH,
                           "psagg_broadcast: the %ld callers disagree on root (%ld of them are the "
                           "root they name); this worker (rank %d) passed root %d and len %llu",
                           callers, roots, rank, word_root(word),
                           (unsigned long long)word_len(word));
    return psagg__fail(PSAGG_EMISMATCH,
                       "psagg_broadcast: the %ld callers disagree on len or root: root %d passed "
                       "len %llu; this worker (rank %d) passed root %d and len %llu (every caller "
                       "passes the same key, len and root)",
                       callers, word_root(ref), (unsigned long long)word_len(ref), rank,
                       word_root(word), (unsigned long long)word_len(word));
}

/* The arguments, named; PSAGG_OK when psagg_broadcast may start. */
static psagg_status check_args(psagg_ctx *ctx, uint32_t key, const void *buf, size_t len, int root)
{
    const psagg__tensor_info *ti;

    if (!ctx)
        return psagg__fail(PSAGG_EINVAL, "psagg_broadcast: ctx is NULL");
    if (!ctx->declared)
        return psagg__fail(PSAGG_EINVAL, "psagg_broadcast: call psagg_declare first");
    if (key >= ctx->n_user)
        return psagg__fail(PSAGG_EINVAL, "psagg_broadcast: key %u is not declared (%u tensors)",
                           key, ctx->n_user);
    ti = &ctx->layout.tensors[key];
    if (ti->codec.id != PSAGG_CODEC_FP32 || ti->adaptive || ti->param)
        return psagg__fail(PSAGG_EINVAL,
                           "psagg_broadcast: key %u ('%s') must be a declared fp32 tensor that is "
                           "not a parameter; it is %s",
                           key, ti->name, ti->param ? "a parameter" : "compressed");
    if (root < 0 || root >= ctx->world)
        return psagg__fail(PSAGG_EINVAL, "psagg_broadcast: root %d is not a worker rank (0..%d)",
                           root, ctx->world - 1);
    if ((uint64_t)len > PSAGG_BROADCAST_MAX)
        return psagg__fail(PSAGG_EINVAL,
                           "psagg_broadcast: len %zu is more than PSAGG_BROADCAST_MAX (%llu bytes)",
                           len, (unsigned long long)PSAGG_BROADCAST_MAX);
    if (!buf && len > 0)
        return psagg__fail(PSAGG_EINVAL, "psagg_broadcast: buf is NULL, with len %zu", len);
    return PSAGG_OK;
}

/*
 * One round: push_pull (SUM) of `vals` in place, with root's push required (need_rank); the
 * fewest and the most workers its chunks' updates summed.
 */
static psagg_status bcast_round(psagg_ctx *ctx, uint32_t key, float *vals, int root, uint32_t *lo,
                                uint32_t *hi)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[key];
    struct psagg_handle *h;
    psagg_status st;

    if (!(h = handle_new(ctx, key, vals, vals, PSAGG_SUM, 0, &psagg__host_ops, &st)))
        return psagg__fail_context(st, "psagg_broadcast: ");
    h->need_rank = root; /* (before handle_submit: its creator's still) */
    handle_submit(ctx, h);
    st = psagg_wait(h, -1);
    *lo = UINT32_MAX, *hi = 0;
    for (uint32_t c = 0; !st && c < ti->n_chunks; c++) {
        /* chunk_scale is 1 / the workers the update summed: exact enough to round back */
        uint32_t n = (uint32_t)lroundf(1.0f / h->chunk_scale[c]);
        *lo = n < *lo ? n : *lo;
        *hi = n > *hi ? n : *hi;
    }
    psagg_release(h);
    return st;
}

/* Root's element i of the bytes: 3 of them, the last ones padded with 0. */
static float pack(const uint8_t *bytes, size_t len, uint64_t i)
{
    uint64_t b = 3 * i;
    uint32_t v = bytes[b];
    if (b + 1 < len)
        v |= (uint32_t)bytes[b + 1] << 8;
    if (b + 2 < len)
        v |= (uint32_t)bytes[b + 2] << 16;
    return (float)v;
}

static void unpack(uint8_t *bytes, size_t len, uint64_t i, long v)
{
    uint64_t b = 3 * i;
    bytes[b] = (uint8_t)v;
    if (b + 1 < len)
        bytes[b + 1] = (uint8_t)(v >> 8);
    if (b + 2 < len)
        bytes[b + 2] = (uint8_t)(v >> 16);
}

psagg_status psagg_broadcast(psagg_ctx *ctx, uint32_t key, void *buf, size_t len, int root)
{
    uint8_t *bytes = buf;
    uint64_t count, total, word = (uint64_t)len | (uint64_t)root << LEN_BITS;
    uint32_t first = 0;
    long hdr[HDR_ELEMS];
    int is_root;
    float *vals;
    psagg_status st = PSAGG_OK;

    psagg__clear_error();
    if ((st = check_args(ctx, key, buf, len, root)))
        return st;
    is_root = ctx->rank == root;
    count = ctx->layout.tensors[key].count;
    total = HDR_ELEMS + ((uint64_t)len + 2) / 3;
    if (!(vals = malloc(count * sizeof *vals)))
        return psagg__fail(PSAGG_ENOMEM, "psagg_broadcast: a round of key %u (%llu elements)", key,
                           (unsigned long long)count);
    for (uint64_t at = 0; at < total; at += count) {
        uint64_t n = total - at < count ? total - at : count;
        uint32_t lo = 0, hi = 0;

        memset(vals, 0, count * sizeof *vals);
        for (uint64_t j = at; j < at + n; j++)
            if (j < HDR_ELEMS)
                vals[j - at] = header_elem(word, is_root, (int)j);
            else if (is_root)
                vals[j - at] = pack(bytes, len, j - HDR_ELEMS);
        if ((st = bcast_round(ctx, key, vals, root, &lo, &hi)))
            goto out;
        /* A worker left an elastic job during the call: an update summed fewer workers than
           the first round's (or its chunks differ); root's push may be the one missing. Every
           caller sees the same counts, so all stop at this round and refuse alike. With
           [server] quorum the counts vary with stragglers: the bitmaps say who is in (the
           comm thread fails the job when root is not). */
        if (!ctx->quorum) {
            first = at ? first : lo;
            if (lo != hi || lo != first) {
                st = psagg__fail(PSAGG_EPEER,
                                 "psagg_broadcast: a worker left the job during the call (an "
                                 "update summed %u workers, the first round's %u): root %d's "
                                 "bytes may be missing; call it again",
                                 lo, first, root);
                goto out;
            }
        }
        for (uint64_t j = at; j < at + n; j++) {
            long v = elem_value(vals[j - at]);
            if (v < 0) {
                st = psagg__fail(PSAGG_EPROTO,
                                 "psagg_broadcast: element %llu of key %u summed to %g, which is "
                                 "no packed integer (did a caller push something else?)",
                                 (unsigned long long)j, key, (double)vals[j - at]);
                goto out;
            }
            if (j < HDR_ELEMS) {
                hdr[j] = v;
                /* the header is in: its verdict before any byte is written */
                if (j + 1 == HDR_ELEMS && (st = header_check(hdr, word, ctx->rank)))
                    goto out;
            } else if (!is_root) {
                unpack(bytes, len, j - HDR_ELEMS, v);
            }
        }
    }
out:
    free(vals);
    return st;
}
