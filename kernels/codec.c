/*
 * codec.c - the codec library's front end: codec checks, sizes, chunking, RNG keys and
 * streams, argument and length checks, validation of encoded inputs, scratch memory, and the
 * dispatch to a CPU implementation: within the ISA's (kernels/isa.c chooses it once from the
 * CPU's features or PSAGG_CODEC_ISA), the function for the codec's format.
 *
 * Layer: kernels.
 */
#include "kernels/codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/impl.h"
#include "kernels/thc.h"
#include "kernels/topk.h"

/* ---- RNG key ---- */

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

psagg__rng_key psagg__rng_key_make(uint64_t seed, uint64_t stream)
{
    uint64_t k = splitmix64(seed ^ splitmix64(stream));
    psagg__rng_key key = {(uint32_t)k, (uint32_t)(k >> 32)};
    return key;
}

/* mix64 of codec.h's "RNG streams of the protocol". */
static uint64_t mix64(uint64_t a, uint64_t b)
{
    uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

psagg__rng_key psagg__rng_chunk_key(uint64_t seed, psagg__rng_side side, uint32_t rank,
                                    uint32_t key, uint32_t chunk, uint32_t round)
{
    uint64_t stream = mix64(mix64((uint64_t)side << 32 | rank, (uint64_t)key << 32 | chunk), round);
    return psagg__rng_key_make(seed, stream);
}

/* ---- codec description ---- */

psagg_status psagg__codec_check(psagg_codec *codec)
{
    if (!codec)
        return psagg__fail(PSAGG_EINVAL, "codec: NULL description");
    switch (codec->id) {
    case PSAGG_CODEC_FP32:
    case PSAGG_CODEC_FP16:
    case PSAGG_CODEC_BF16:
        break;
    case PSAGG_CODEC_MAXMIN:
        if (codec->bits < 1 || codec->bits > 8)
            return psagg__fail(PSAGG_EINVAL, "codec maxmin: bits %u out of range 1..8",
                               codec->bits);
        if (codec->bucket == 0)
            codec->bucket = PSAGG_MAXMIN_DEFAULT_BUCKET;
        if (codec->bucket < 64 || codec->bucket > PSAGG_MAXMIN_MAX_BUCKET ||
            codec->bucket % 64 != 0)
            return psagg__fail(PSAGG_EINVAL,
                               "codec maxmin: bucket %u must be a multiple of 64 in 64..%u",
                               codec->bucket, PSAGG_MAXMIN_MAX_BUCKET);
        if (codec->rounding != PSAGG_ROUND_STOCHASTIC && codec->rounding != PSAGG_ROUND_NEAREST)
            return psagg__fail(PSAGG_EINVAL, "codec maxmin: rounding %d unknown",
                               (int)codec->rounding);
        break;
    case PSAGG_CODEC_TOPK: {
        psagg__topk_format f;
        if (codec->bucket == 0)
            codec->bucket = PSAGG_TOPK_DEFAULT_BLOCK;
        f = (psagg__topk_format){codec->bits, codec->bucket, codec->k, codec->rounding};
        if (psagg__topk_check(&f)) /* ("topk: <field> ...", named) */
            return psagg__fail_context(PSAGG_EINVAL, "codec ");
        break;
    }
    case PSAGG_CODEC_THC:
        if (codec->bits != 2 && codec->bits != 4)
            return psagg__fail(PSAGG_EINVAL, "codec thc: bits %u (2 or 4)", codec->bits);
        if (codec->bucket == 0)
            codec->bucket = PSAGG_THC_DEFAULT_BLOCK;
        if (codec->bucket < PSAGG_THC_MIN_BLOCK || codec->bucket > PSAGG_THC_MAX_BLOCK ||
            (codec->bucket & (codec->bucket - 1)))
            return psagg__fail(PSAGG_EINVAL, "codec thc: block %u must be a power of two in %u..%u",
                               codec->bucket, PSAGG_THC_MIN_BLOCK, PSAGG_THC_MAX_BLOCK);
        if (codec->rounding != PSAGG_ROUND_STOCHASTIC)
            return psagg__fail(PSAGG_EINVAL,
                               "codec thc: rounding must be stochastic (sr): a sum of nearest "
                               "roundings is biased");
        break;
    default:
        return psagg__fail(PSAGG_EINVAL, "codec: id %d unknown", (int)codec->id);
    }
    return PSAGG_OK;
}

/* A checked topk codec's format (kernels/topk.h). */
static psagg__topk_format topk_of(const psagg_codec *c)
{
    return (psagg__topk_format){c->bits, c->bucket, c->k, c->rounding};
}

int psagg__codec_equal(const psagg_codec *a, const psagg_codec *b)
{
    return a->id == b->id &&
           ((a->id != PSAGG_CODEC_MAXMIN && a->id != PSAGG_CODEC_TOPK &&
             a->id != PSAGG_CODEC_THC) ||
            (a->bits == b->bits && a->bucket == b->bucket && a->rounding == b->rounding &&
             (a->id != PSAGG_CODEC_TOPK || a->k == b->k)));
}

/* Copy and check a caller's codec (so that bucket 0 means the default here too). */
static psagg_status prep(const psagg_codec *codec, psagg_codec *c, size_t n)
{
    psagg_status st;
    if (!codec)
        return psagg__fail(PSAGG_EINVAL, "codec: NULL description");
    *c = *codec;
    if ((st = psagg__codec_check(c)) != PSAGG_OK)
        return st;
    if ((unsigned long long)n > PSAGG_CODEC_MAX_ELEMS)
        return psagg__fail(PSAGG_EINVAL, "%zu elements: a buffer holds at most %llu", n,
                           PSAGG_CODEC_MAX_ELEMS);
    return PSAGG_OK;
}

static size_t encoded_size(const psagg_codec *c, size_t n)
{
    switch (c->id) {
    case PSAGG_CODEC_FP32:
        return 4 * n;
    case PSAGG_CODEC_FP16:
    case PSAGG_CODEC_BF16:
        return 2 * n;
    case PSAGG_CODEC_MAXMIN:
        return 8 * psagg__mm_nbuckets(n, c->bucket) + psagg__mm_payload_bytes(n, c->bits);
    case PSAGG_CODEC_TOPK: {
        psagg__topk_format f = topk_of(c);
        return psagg__topk_encoded_size(&f, n);
    }
    case PSAGG_CODEC_THC:
        return psagg__thc_push_bytes(c->bits, c->bucket, n);
    default:
        return 0;
    }
}

/* A caller's codec, checked (so that bucket 0 means the default): 1 when it is one. */
static int checked(const psagg_codec *codec, psagg_codec *c)
{
    if (!codec)
        return 0;
    *c = *codec;
    return psagg__codec_check(c) == PSAGG_OK;
}

size_t psagg__encoded_size(const psagg_codec *codec, size_t n)
{
    psagg_codec c;
    return checked(codec, &c) ? encoded_size(&c, n) : 0;
}

size_t psagg__update_size(const psagg_codec *codec, size_t n, size_t summed)
{
    psagg_codec c;
    if (!checked(codec, &c))
        return 0;
    return c.id == PSAGG_CODEC_THC ? psagg__thc_update_bytes(c.bits, c.bucket, n, summed)
                                   : encoded_size(&c, n);
}

size_t psagg__update_cap(const psagg_codec *codec, size_t n)
{
    psagg_codec c;
    if (!checked(codec, &c))
        return 0;
    return c.id == PSAGG_CODEC_THC ? psagg__thc_update_cap(c.bits, c.bucket, n)
                                   : encoded_size(&c, n);
}

/* ---- chunking ---- */

uint64_t psagg__codec_chunk_elems(const psagg_codec *codec, uint64_t chunk_elems)
{
    uint64_t b = codec->bucket                   ? codec->bucket
                 : codec->id == PSAGG_CODEC_TOPK ? PSAGG_TOPK_DEFAULT_BLOCK
                 : codec->id == PSAGG_CODEC_THC  ? PSAGG_THC_DEFAULT_BLOCK
                                                 : PSAGG_MAXMIN_DEFAULT_BUCKET;
    if (codec->id != PSAGG_CODEC_MAXMIN && codec->id != PSAGG_CODEC_TOPK &&
        codec->id != PSAGG_CODEC_THC)
        return chunk_elems;
    return chunk_elems < b ? b : chunk_elems - chunk_elems % b; /* whole buckets (blocks) */
}

/*
 * fp32 is 4 bytes an element, fp16/bf16 2. maxmin with bucket B <= chunk_elems has chunks of
 * n <= chunk_elems elements in at most 8 * n / 64 + 8 * n * 8 / 64 = 1.125 n bytes (B >= 64,
 * b <= 8); with B > chunk_elems a chunk is one bucket of B elements, 8 + B bytes at b = 8.
 * topk keeps at most every element, at 16 + 8 bits each plus 8 bytes a block of C >= 256 (at
 * most 3.04 n bytes, rounded to 8); with C > chunk_elems a chunk is one block of C <= 65536
 * elements: 8 + 3 * 65536 + 16 bytes, below 8 + PSAGG_MAXMIN_MAX_BUCKET. thc's largest message
 * is an update at 16 bits: 2 N' + 12 bytes a block of D >= 64 for N' <= n + 63 rotated
 * coordinates, within 4 * chunk_elems (>= 256); with D > chunk_elems one block of D <= 65536:
 * 2 * 65536 + 12 bytes.
 */
size_t psagg__codec_max_chunk_bytes(uint64_t chunk_elems)
{
    size_t fp32 = 4 * (size_t)chunk_elems, bucket = 8 + (size_t)PSAGG_MAXMIN_MAX_BUCKET;
    return fp32 > bucket ? fp32 : bucket;
}

static const char *cname(const psagg_codec *c, char *buf, size_t len)
{
    return psagg_codec_name(c, buf, len);
}

/* ---- helpers for the implementations ---- */

psagg_status psagg__codec_bad_value(const psagg_codec *c, size_t i, float v, size_t *bad)
{
    char nm[48];
    *bad = i;
    if (isnan(v))
        return psagg__fail(PSAGG_ENONFINITE, "encode %s: element %zu is NaN", cname(c, nm, 48), i);
    if (isinf(v))
        return psagg__fail(PSAGG_ENONFINITE, "encode %s: element %zu is %cInf", cname(c, nm, 48), i,
                           v < 0 ? '-' : '+');
    switch (c->id) {
    case PSAGG_CODEC_FP16:
        return psagg__fail(PSAGG_ERANGE,
                           "encode fp16: element %zu = %g overflows fp16 (|x| >= 65520)", i,
                           (double)v);
    case PSAGG_CODEC_BF16:
        return psagg__fail(PSAGG_ERANGE, "encode bf16: element %zu = %g rounds to Inf in bf16", i,
                           (double)v);
    default:
        return psagg__fail(PSAGG_ERANGE,
                           "encode %s: element %zu = %g is out of range (|x| >= 2^126)",
                           cname(c, nm, 48), i, (double)v);
    }
}

/*
 * Scratch for one call (see cpu/impl.h): small requests come from the caller's stack
 * buffers, larger ones from the heap. psagg_scratch_release frees what came from the heap.
 */
#define SCRATCH_INPUTS 64

typedef struct scratch_stack {
    float acc[PSAGG_SCRATCH_BLOCK] __attribute__((aligned(64)));
    uint8_t tab[SCRATCH_INPUTS * PSAGG_SCRATCH_TAB] __attribute__((aligned(64)));
    const uint8_t *pay[SCRATCH_INPUTS];
    float meta[2 * SCRATCH_INPUTS];
} scratch_stack;

static psagg_status scratch_get(scratch_stack *stk, size_t acc_elems, size_t n_in,
                                psagg__scratch *ws)
{
    *ws = (psagg__scratch){.acc = stk->acc,
                           .acc_elems = acc_elems,
                           .pay = stk->pay,
                           .meta = stk->meta,
                           .tab = stk->tab};
    if (acc_elems > PSAGG_SCRATCH_BLOCK)
        ws->acc = aligned_alloc(64, (acc_elems * sizeof(float) + 63) & ~(size_t)63);
    if (n_in > SCRATCH_INPUTS) {
        ws->pay = malloc(n_in * sizeof *ws->pay);
        ws->meta = malloc(2 * n_in * sizeof *ws->meta);
        ws->tab = aligned_alloc(64, n_in * PSAGG_SCRATCH_TAB);
    }
    if (!ws->acc || !ws->pay || !ws->meta || !ws->tab) {
        if (ws->acc != stk->acc)
            free(ws->acc);
        if (ws->pay != stk->pay)
            free(ws->pay), free(ws->meta), free(ws->tab);
        return psagg__fail(PSAGG_ENOMEM, "codec scratch of %zu elements and %zu inputs", acc_elems,
                           n_in);
    }
    return PSAGG_OK;
}

static void scratch_release(const scratch_stack *stk, psagg__scratch *ws)
{
    if (ws->acc != stk->acc)
        free(ws->acc);
    if (ws->pay != stk->pay) {
        free(ws->pay);
        free(ws->meta);
        free(ws->tab);
    }
}

/* ---- implementation choice (kernels/isa.c) ---- */

static const psagg__codec_impl *impl(void)
{
    return psagg__impl_current();
}

/* ---- validation of encoded buffers ---- */

/*
 * First element whose exponent field is all ones (NaN or Inf), or SIZE_MAX. Whole blocks are
 * reduced with a constant trip count, which gcc vectorises at -O2 (its default cost model
 * skips loops that would need a scalar epilogue); only the block with a hit and the tail are
 * scanned one element at a time. Without that, this pass ran as a scalar loop whose speed
 * moved by 10% with its code alignment alone.
 */
#define NF_BLOCK 1024

static size_t find_nonfinite32(const uint8_t *p, size_t n)
{
    size_t b = 0;
    for (; b + NF_BLOCK <= n; b += NF_BLOCK) {
        uint32_t hit = 0;
        for (size_t i = 0; i < NF_BLOCK; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * (b + i), 4);
            hit |= (uint32_t)((u & 0x7F800000u) == 0x7F800000u);
        }
        if (hit)
            break;
    }
    for (; b < n; b++) {
        uint32_t u;
        memcpy(&u, p + 4 * b, 4);
        if ((u & 0x7F800000u) == 0x7F800000u)
            return b;
    }
    return SIZE_MAX;
}

static size_t find_nonfinite16(const uint8_t *p, size_t n, uint16_t emask)
{
    size_t b = 0;
    for (; b + 2 * NF_BLOCK <= n; b += 2 * NF_BLOCK) {
        uint32_t hit = 0;
        for (size_t i = 0; i < 2 * NF_BLOCK; i++) {
            uint16_t u;
            memcpy(&u, p + 2 * (b + i), 2);
            hit |= (uint32_t)((u & emask) == emask);
        }
        if (hit)
            break;
    }
    for (; b < n; b++) {
        uint16_t u;
        memcpy(&u, p + 2 * b, 2);
        if ((u & emask) == emask)
            return b;
    }
    return SIZE_MAX;
}

static psagg_status validate(const psagg_codec *c, const void *in, size_t in_len, size_t n)
{
    char nm[48];
    size_t need = encoded_size(c, n), i;
    const uint8_t *p = in;

    if (in_len != need)
        return psagg__fail(PSAGG_EBADLEN, "%s buffer of %zu elements: %zu bytes, expected %zu",
                           cname(c, nm, 48), n, in_len, need);
    if (n == 0)
        return PSAGG_OK;
    if (!in)
        return psagg__fail(PSAGG_EINVAL, "%s buffer: NULL", cname(c, nm, 48));
    switch (c->id) {
    case PSAGG_CODEC_FP32:
        i = find_nonfinite32(p, n);
        break;
    case PSAGG_CODEC_FP16:
        i = find_nonfinite16(p, n, 0x7C00);
        break;
    case PSAGG_CODEC_BF16:
        i = find_nonfinite16(p, n, 0x7F80);
        break;
    case PSAGG_CODEC_TOPK: {
        psagg__topk_format f = topk_of(c);
        psagg_status st = psagg__topk_validate(&f, in, in_len, n);
        return st ? psagg__fail_context(st, "%s buffer: ", cname(c, nm, 48)) : PSAGG_OK;
    }
    case PSAGG_CODEC_THC: { /* a push */
        psagg_status st = psagg__thc_push_check(c->bits, c->bucket, in, in_len, n);
        return st ? psagg__fail_context(st, "%s buffer: ", cname(c, nm, 48)) : PSAGG_OK;
    }
    default: {
        size_t nb = psagg__mm_nbuckets(n, c->bucket);
        float L = (float)((1u << c->bits) - 1);
        for (size_t m = 0; m < nb; m++) {
            float scale, lo;
            uint32_t su;
            memcpy(&scale, p + 8 * m, 4);
            memcpy(&lo, p + 8 * m + 4, 4);
            memcpy(&su, &scale, 4);
            if (!isfinite(lo))
                return psagg__fail(PSAGG_EBADMETA, "%s buffer: bucket %zu has min %g",
                                   cname(c, nm, 48), m, (double)lo);
            if (!isfinite(scale) || (su >> 31))
                return psagg__fail(PSAGG_EBADMETA,
                                   "%s buffer: bucket %zu has scale %g (must be finite, >= +0)",
                                   cname(c, nm, 48), m, (double)scale);
            if (!isfinite(lo + scale * L))
                return psagg__fail(PSAGG_EBADMETA,
                                   "%s buffer: bucket %zu: min %g + scale %g * %g overflows",
                                   cname(c, nm, 48), m, (double)lo, (double)scale, (double)L);
        }
        return PSAGG_OK;
    }
    }
    if (i != SIZE_MAX)
        return psagg__fail(PSAGG_ENONFINITE, "%s buffer: element %zu is NaN or Inf",
                           cname(c, nm, 48), i);
    return PSAGG_OK;
}

psagg_status psagg__validate(const psagg_codec *codec, const void *in, size_t in_len, size_t n)
{
    psagg_codec c;
    psagg_status st = prep(codec, &c, n);
    if (st != PSAGG_OK)
        return st;
    return validate(&c, in, in_len, n);
}

/* ---- encode / decode / aggregate ---- */

/* thc's pushes need their chunk's scales and rotation, its updates are sums: kernels/thc.h's
   functions take them; these generic ones refuse it by name. */
static psagg_status not_thc(const psagg_codec *c, const char *what)
{
    if (c->id != PSAGG_CODEC_THC)
        return PSAGG_OK;
    return psagg__fail(PSAGG_EINVAL,
                       "%s thc: its pushes take their chunk's scales and rotation, and its "
                       "updates are integer sums (kernels/thc.h: psagg__thc_push_encode, "
                       "psagg__thc_update_fold, psagg__thc_update_decode)",
                       what);
}

psagg_status psagg__encode(const psagg_codec *codec, const float *x, float *residual, size_t n,
                           psagg__rng_key key, void *out, size_t out_len, size_t *bad_index)
{
    psagg_codec c;
    char nm[48];
    size_t need, bad = SIZE_MAX;
    psagg_status st = prep(codec, &c, n);

    if (st != PSAGG_OK || (st = not_thc(&c, "encode")))
        return st;
    need = encoded_size(&c, n);
    if (out_len != need)
        return psagg__fail(PSAGG_EBADLEN,
                           "encode %s of %zu elements: output is %zu bytes, expected %zu",
                           cname(&c, nm, 48), n, out_len, need);
    if (n == 0)
        return PSAGG_OK;
    if (!x || !out)
        return psagg__fail(PSAGG_EINVAL, "encode %s: NULL %s", cname(&c, nm, 48),
                           x ? "output" : "input");
    if (c.id == PSAGG_CODEC_TOPK) { /* kernels/topk.c, with this ISA's block passes */
        psagg__topk_format f = topk_of(&c);
        st = psagg__topk_encode_with(impl()->topk, &f, x, residual, n, key, out, out_len, &bad);
    } else if (c.id == PSAGG_CODEC_MAXMIN) {
        scratch_stack stk;
        psagg__scratch ws;
        if ((st = scratch_get(&stk, c.bucket, 0, &ws)) != PSAGG_OK)
            return st;
        st = impl()->mm_encode(&c, x, residual, n, key, out, &ws, &bad);
        scratch_release(&stk, &ws);
    } else {
        st = impl()->fp_encode(&c, x, residual, n, out, &bad);
    }
    if (st != PSAGG_OK && bad_index)
        *bad_index = bad;
    return st;
}

/*
 * Validation in the decode's own pass: for maxmin the meta of every bucket is checked first
 * (8 bytes a bucket), then the values decoded; the fp formats flag a NaN/Inf input as they
 * convert it, and only then is the first one looked for, for the message.
 */
psagg_status psagg__decode_into(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                                float *out, psagg__decode_op op, float factor)
{
    psagg_codec c;
    char nm[48];
    psagg_status st = prep(codec, &c, n);
    if (st != PSAGG_OK || (st = not_thc(&c, "decode")))
        return st;
    if ((unsigned)op > PSAGG_DECODE_SCALE)
        return psagg__fail(PSAGG_EINVAL, "decode: op %d unknown", (int)op);
    if (in_len != encoded_size(&c, n))
        return psagg__fail(PSAGG_EBADLEN, "%s buffer of %zu elements: %zu bytes, expected %zu",
                           cname(&c, nm, 48), n, in_len, encoded_size(&c, n));
    if (n == 0)
        return PSAGG_OK;
    if (!in || !out)
        return psagg__fail(PSAGG_EINVAL, "decode: NULL %s", in ? "output" : "input");
    if (c.id == PSAGG_CODEC_TOPK) {
        psagg__topk_format f = topk_of(&c);
        if ((st = psagg__topk_decode_into(&f, in, in_len, n, out, op, factor)))
            return psagg__fail_context(st, "%s buffer: ", cname(&c, nm, 48));
    } else if (c.id == PSAGG_CODEC_MAXMIN) {
        if ((st = validate(&c, in, in_len, n)) != PSAGG_OK) /* the meta only */
            return st;
        impl()->mm_decode(&c, in, n, out, op, factor);
    } else if (impl()->fp_decode(&c, in, n, out, op, factor)) {
        return validate(&c, in, in_len, n); /* names the first NaN/Inf */
    }
    return PSAGG_OK;
}

psagg_status psagg__decode(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                           float *out)
{
    return psagg__decode_into(codec, in, in_len, n, out, PSAGG_DECODE_SET, 1.0f);
}

psagg_status psagg__decode_add(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                               float *acc)
{
    return psagg__decode_into(codec, in, in_len, n, acc, PSAGG_DECODE_ADD, 1.0f);
}

psagg_status psagg__aggregate(const psagg_codec *codec, const void *const *in, size_t n_in,
                              size_t in_len, size_t n, float *residual, psagg__rng_key key,
                              void *out, size_t out_len, size_t *bad_index)
{
    psagg_codec c;
    char nm[48];
    size_t need, bad = SIZE_MAX;
    psagg_status st = prep(codec, &c, n);

    if (st != PSAGG_OK || (st = not_thc(&c, "aggregate")))
        return st;
    if (n_in > 0 && !in)
        return psagg__fail(PSAGG_EINVAL, "aggregate: NULL input list");
    need = encoded_size(&c, n);
    if (out_len != need)
        return psagg__fail(PSAGG_EBADLEN,
                           "aggregate %s of %zu elements: output is %zu bytes, expected %zu",
                           cname(&c, nm, 48), n, out_len, need);
    for (size_t i = 0; i < n_in; i++) {
        if ((st = validate(&c, in[i], in_len, n)) != PSAGG_OK) {
            if (bad_index)
                *bad_index = i;
            return psagg__fail_context(st, "aggregate input %zu of %zu: ", i, n_in);
        }
    }
    if (n == 0)
        return PSAGG_OK;
    if (!out)
        return psagg__fail(PSAGG_EINVAL, "aggregate: NULL output");
    if (c.id == PSAGG_CODEC_TOPK) { /* the spec's sum, then an encode (kernels/topk.c) */
        psagg__topk_format f = topk_of(&c);
        scratch_stack stk;
        psagg__scratch ws;
        if ((st = scratch_get(&stk, n, 0, &ws)) != PSAGG_OK)
            return st;
        if (!n_in) /* (N = 0: zeros) */
            memset(ws.acc, 0, n * sizeof *ws.acc);
        for (size_t i = 0; i < n_in && !st; i++)
            st = psagg__topk_decode_into(&f, in[i], in_len, n, ws.acc,
                                         i ? PSAGG_DECODE_ADD : PSAGG_DECODE_FIRST, 1.0f);
        if (!st)
            st = psagg__topk_encode_with(impl()->topk, &f, ws.acc, residual, n, key, out, out_len,
                                         &bad);
        scratch_release(&stk, &ws);
    } else {
        const uint8_t *const *inb = (const uint8_t *const *)in;
        int mm = c.id == PSAGG_CODEC_MAXMIN;
        scratch_stack stk;
        psagg__scratch ws;
        if ((st = scratch_get(&stk, mm ? c.bucket : PSAGG_SCRATCH_BLOCK, n_in, &ws)) != PSAGG_OK)
            return st;
        st = mm ? impl()->mm_aggregate(&c, inb, n_in, n, residual, key, out, &ws, &bad)
                : impl()->fp_aggregate(&c, inb, n_in, n, residual, out, &ws, &bad);
        scratch_release(&stk, &ws);
    }
    if (st != PSAGG_OK && bad_index)
        *bad_index = bad;
    return st;
}
