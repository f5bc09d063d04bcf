/*
 * host.c - the buffer operations of psagg_push_pull (psagg__bufops): the input and output are
 * host memory. The communication thread encodes each chunk with the CPU codecs (error
 * feedback with the tensor's host residual) straight into its push buffer, and decodes each
 * update into the output as it arrives (scaled by 1/N for PSAGG_AVERAGE), so the output is
 * complete when the last update is in.
 */
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/codec.h"
#include "worker.h"

static psagg_status host_encode(psagg_ctx *ctx, struct psagg_handle *h)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    tensor_state *ts = &ctx->tensors[h->key];

    /* a carry (pushes left out of their rounds, without error feedback) is added as a
       residual would be, and then cleared: what it leaves is the codec's error, not kept */
    float *res = ts->residual ? ts->residual : ts->carry_live ? ts->carry : NULL;

    if (h->codec.id == PSAGG_CODEC_THC)
        thc_scales(&ctx->layout, ti, ts, h->codec.bits);

    for (uint32_t c = 0; c < ti->n_chunks; c++) {
        const psagg__chunk_info *ci = &ctx->layout.chunks[ti->first_chunk + c];
        uint8_t *payload =
            chunk_push(ctx, ti->first_chunk + c, h->round)->buf + sizeof(psagg__msg_hdr);
        psagg__rng_key key = psagg__rng_chunk_key(ctx->cfg.seed, PSAGG_RNG_WORKER,
                                                  (uint32_t)ctx->rank, ci->key, ci->index, h->step);
        size_t bad = 0;
        psagg_status st =
            h->codec.id == PSAGG_CODEC_THC /* (at the scales the last update set) */
                ? psagg__thc_push_encode(h->codec.bits, h->codec.bucket, thc_rotation(ctx, ci),
                                         ts->thc_scale + ci->offset / h->codec.bucket,
                                         h->in + ci->offset, res + ci->offset, ci->count, key,
                                         payload, psagg__encoded_size(&h->codec, ci->count), &bad)
                : psagg__encode(&h->codec, h->in + ci->offset, res ? res + ci->offset : NULL,
                                ci->count, key, payload, psagg__encoded_size(&h->codec, ci->count),
                                &bad);
        if (st) {
            if (res) /* part of it was updated: start error feedback afresh */
                memset(res, 0, tensor_residual_elems(&ctx->layout, ti) * sizeof(float));
            ts->carry_live = 0;
            return psagg__fail_context(st, "tensor '%.63s': element %llu: ", ti->name,
                                       (unsigned long long)(ci->offset + bad));
        }
        /* SparseLoCo's decay: what was left out is kept as beta * (v - y), so the next push
           sends x + beta * e; a push carried back later ([server] quorum) adds in whole */
        if (ts->residual && ts->ef_beta != 1.0f)
            for (size_t i = 0, n = chunk_residual_elems(ti, ci); i < n; i++)
                ts->residual[ci->offset + i] *= ts->ef_beta;
    }
    if (res && res == ts->carry) {
        memset(ts->carry, 0, ti->count * sizeof(float));
        ts->carry_live = 0;
    }
    return PSAGG_OK;
}

/*
 * carry ([server] quorum): chunk ci's round closed without this worker's push. Its encoded
 * bytes are still in the push buffer (the next encode writes them): add them back into the
 * residual, which then holds the whole input again (x + r - Q(x + r) + Q(x + r)), or into
 * the carry without error feedback. Either way the next push sends them.
 */
static psagg_status host_carry(psagg_ctx *ctx, struct psagg_handle *h, const psagg__chunk_info *ci)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    tensor_state *ts = &ctx->tensors[h->key];
    const uint8_t *payload =
        chunk_push(ctx, ti->first_chunk + ci->index, h->round)->buf + sizeof(psagg__msg_hdr);
    float *to = ts->residual;
    psagg_status st;

    if (!to) {
        if (!ts->carry && !(ts->carry = psagg__alloc(ti->count * sizeof(float), 1)))
            return psagg__fail(PSAGG_ENOMEM, "tensor '%.63s': its carry of left-out pushes",
                               ti->name);
        to = ts->carry;
        ts->carry_live = 1;
    }
    st = h->codec.id == PSAGG_CODEC_THC /* (its table values, in rotated coordinates) */
             ? psagg__thc_push_values(h->codec.bits, h->codec.bucket, payload,
                                      psagg__encoded_size(&h->codec, ci->count), ci->count,
                                      to + ci->offset)
             : psagg__decode_into(&h->codec, payload, psagg__encoded_size(&h->codec, ci->count),
                                  ci->count, to + ci->offset, PSAGG_DECODE_ADD, 1.0f);
    if (st)
        return psagg__fail_context(
            st, "tensor '%.63s' chunk %u: its own push, left out: ", ti->name, ci->index);
    return PSAGG_OK;
}

static psagg_status host_update(psagg_ctx *ctx, struct psagg_handle *h, const psagg__chunk_info *ci,
                                const psagg_codec *codec, int mode, const uint8_t *payload,
                                size_t payload_len)
{
    const psagg__tensor_info *ti = &ctx->layout.tensors[h->key];
    tensor_state *ts = &ctx->tensors[h->key];
    /* one pass: decode, validate and (SCALE: AVERAGE) scale by 1 / the workers summed, or
       (ADD) apply a delta; thc's peaks give the scales of the chunk's next push */
    psagg_status st =
        codec->id == PSAGG_CODEC_THC
            ? psagg__thc_update_decode(codec->bits, codec->bucket, thc_rotation(ctx, ci), payload,
                                       payload_len, ci->count, h->chunk_scale[ci->index],
                                       (psagg__decode_op)mode, h->out + ci->offset, NULL)
            : psagg__decode_into(codec, payload, payload_len, ci->count, h->out + ci->offset,
                                 (psagg__decode_op)mode, h->chunk_scale[ci->index]);

    if (!st && codec->id == PSAGG_CODEC_THC)
        psagg__thc_update_peaks(codec->bucket, payload, ci->count,
                                ts->thc_peak + ci->offset / codec->bucket);

    if (st)
        return psagg__fail_context(st,
                                   "update of tensor '%.63s' chunk %u from server %u: ", ti->name,
                                   ci->index, chunk_owner(ctx, ti->first_chunk + ci->index));
    return PSAGG_OK;
}

static psagg_status host_complete(psagg_ctx *ctx, struct psagg_handle *h)
{
    (void)ctx, (void)h;
    return PSAGG_OK; /* every update was decoded into the output as it arrived */
}

const psagg__bufops psagg__host_ops = {
    .kind = "host",
    .encode = host_encode,
    .update = host_update,
    .complete = host_complete,
    .carry = host_carry,
};
