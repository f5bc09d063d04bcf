/* runtime/layout.c - see runtime/layout.h. */
#include "runtime/layout.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/codec.h"
#include "runtime/adaptive.h"

size_t psagg__max_message(const psagg__config *cfg)
{
    return sizeof(psagg__msg_hdr) + psagg__codec_max_chunk_bytes(psagg__chunk_elems(cfg)) +
           sizeof(psagg__msg_param) + (cfg->data_auth ? PSAGG_MSG_MAC_BYTES : 0);
}

psagg_status psagg__tensor_to_wire(const char *name, uint64_t count, const psagg_codec *codec,
                                   psagg__ctl_tensor *out)
{
    memset(out, 0, sizeof *out);
    if (!name || !name[0] || strlen(name) >= PSAGG_NAME_MAX)
        return psagg__fail(PSAGG_EINVAL, "tensor name '%s' empty or longer than %d bytes",
                           name ? name : "(null)", PSAGG_NAME_MAX - 1);
    strcpy(out->name, name);
    out->count = count;
    out->codec = (uint32_t)codec->id;
    out->bits = codec->bits;
    out->bucket = codec->bucket;
    out->rounding = (uint32_t)codec->rounding;
    out->k = codec->id == PSAGG_CODEC_TOPK ? codec->k : 0;
    return PSAGG_OK;
}

psagg_codec psagg__tensor_codec(const psagg__ctl_tensor *t)
{
    return (psagg_codec){(psagg_codec_id)t->codec, t->bits, t->bucket, (psagg_rounding)t->rounding,
                         t->k};
}

/*
 * What a chunk costs its server per round, as placement weighs it: its encoded bytes (each
 * worker's push, and the update to each); a parameter's chunk also holds and steps the fp32
 * weights of its elements (with the optimizer's state) every round and sends them as WEIGHTS
 * now and then, counted as their fp32 bytes. (For one codec this is proportional to the
 * elements either way; with codecs mixed it keeps the optimizer's state from piling up
 * where the compressed chunks went.)
 */
static uint64_t chunk_cost(const psagg__layout *l, const psagg__chunk_info *ci)
{
    return ci->enc_bytes + (l->tensors[ci->key].param ? 4 * ci->count : 0);
}

/* qsort_r order: chunks by cost, descending, then (key, index). */
static int by_cost_desc(const void *a, const void *b, void *arg)
{
    const psagg__layout *l = arg;
    const psagg__chunk_info *x = &l->chunks[*(const uint32_t *)a];
    const psagg__chunk_info *y = &l->chunks[*(const uint32_t *)b];
    uint64_t cx = chunk_cost(l, x), cy = chunk_cost(l, y);
    if (cx != cy)
        return cx > cy ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* qsort_r order: tensor indices by name. */
static int by_name(const void *a, const void *b, void *base)
{
    const psagg__tensor_info *t = base;
    return strcmp(t[*(const uint32_t *)a].name, t[*(const uint32_t *)b].name);
}

/* Every name once: sort the indices by name and compare neighbours. */
static psagg_status check_unique_names(psagg__tensor_info *t, uint32_t n)
{
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    psagg_status st = PSAGG_OK;
    if (!idx)
        return psagg__fail(PSAGG_ENOMEM, "layout of %u tensors", n);
    for (uint32_t i = 0; i < n; i++)
        idx[i] = i;
    qsort_r(idx, n, sizeof *idx, by_name, t);
    for (uint32_t i = 1; i < n && !st; i++)
        if (!strcmp(t[idx[i - 1]].name, t[idx[i]].name)) {
            uint32_t a = idx[i - 1] < idx[i] ? idx[i - 1] : idx[i];
            uint32_t b = idx[i - 1] < idx[i] ? idx[i] : idx[i - 1];
            st =
                psagg__fail(PSAGG_EINVAL, "tensors %u and %u are both named '%s'", a, b, t[a].name);
        }
    free(idx);
    return st;
}

uint64_t psagg__chunk_elems(const psagg__config *cfg)
{
    uint64_t ce = cfg->chunk_bytes / sizeof(float);
    ce -= ce % 64;
    return ce < 64 ? 64 : ce;
}

uint64_t psagg__layout_chunk_elems(const psagg__ctl_tensor *decl, uint32_t n, uint64_t chunk_elems,
                                   uint32_t n_servers)
{
    uint64_t total = 0, share;
    for (uint32_t t = 0; t < n; t++)
        if (!(decl[t].flags & PSAGG_DECL_RARE) && decl[t].count <= PSAGG_CODEC_MAX_ELEMS)
            total += decl[t].count; /* (at most 2^20 tensors of 2^32 elements: no overflow) */
    share = total / ((uint64_t)(n_servers ? n_servers : 1) * PSAGG_LAYOUT_SHARES);
    share = (share + PSAGG_LAYOUT_MIN_CUT - 1) / PSAGG_LAYOUT_MIN_CUT * PSAGG_LAYOUT_MIN_CUT;
    if (share < PSAGG_LAYOUT_MIN_CUT) /* (no per-round tensor at all: every one rare) */
        share = PSAGG_LAYOUT_MIN_CUT;
    return share < chunk_elems ? share : chunk_elems;
}

psagg_status psagg__layout_build(const psagg__ctl_tensor *decl, uint32_t n, uint64_t chunk_elems,
                                 uint32_t n_servers, uint32_t adapt_interval, psagg__layout *out)
{
    psagg__layout l = {.n_tensors = n, .n_servers = n_servers, .adapt_interval = adapt_interval};
    uint64_t total_chunks = 0, *load = NULL, cut;
    uint32_t *order = NULL, c = 0;
    psagg_status st;

    memset(out, 0, sizeof *out);
    if (!n || n > PSAGG_MAX_TENSORS || !n_servers || chunk_elems < 64 || chunk_elems % 64)
        return psagg__fail(PSAGG_EINVAL, "layout: %u tensors, %u servers, chunk of %llu elements",
                           n, n_servers, (unsigned long long)chunk_elems);
    cut = psagg__layout_chunk_elems(decl, n, chunk_elems, n_servers);
    l.tensors = calloc(n, sizeof *l.tensors);
    if (!l.tensors)
        return psagg__fail(PSAGG_ENOMEM, "layout of %u tensors", n);
    for (uint32_t t = 0; t < n; t++) {
        psagg__tensor_info *ti = &l.tensors[t];
        if (memchr(decl[t].name, 0, PSAGG_NAME_MAX) == NULL || !decl[t].name[0]) {
            st = psagg__fail(PSAGG_EINVAL, "tensor %u: name empty or not terminated", t);
            goto err;
        }
        memcpy(ti->name, decl[t].name, PSAGG_NAME_MAX);
        if (decl[t].count < 1 || decl[t].count > PSAGG_CODEC_MAX_ELEMS) {
            st = psagg__fail(PSAGG_EINVAL, "tensor %u '%s': count %llu out of range", t, ti->name,
                             (unsigned long long)decl[t].count);
            goto err;
        }
        ti->count = decl[t].count;
        ti->codec = psagg__tensor_codec(&decl[t]);
        if (decl[t].codec > PSAGG_CODEC_THC)
            st = psagg__fail(PSAGG_EINVAL, "codec id %u unknown", decl[t].codec);
        else if (decl[t].rounding > PSAGG_ROUND_NEAREST)
            st = psagg__fail(PSAGG_EINVAL, "rounding %u unknown", decl[t].rounding);
        else
            st = psagg__codec_check(&ti->codec);
        if (st) {
            psagg__fail_context(st, "tensor %u '%s': ", t, ti->name);
            goto err;
        }
        ti->chunk_elems = psagg__codec_chunk_elems(&ti->codec, cut);
        ti->adaptive = adapt_interval && psagg__adapt_declarable(&ti->codec);
        ti->param = (decl[t].flags & PSAGG_DECL_PARAM) != 0;
        ti->rare = (decl[t].flags & PSAGG_DECL_RARE) != 0;
        if (decl[t].flags & ~(PSAGG_DECL_PARAM | PSAGG_DECL_RARE)) {
            st = psagg__fail(PSAGG_EINVAL, "tensor %u '%s': unknown flags 0x%x", t, ti->name,
                             decl[t].flags & ~(PSAGG_DECL_PARAM | PSAGG_DECL_RARE));
            goto err;
        }
        if (ti->param && ti->codec.id == PSAGG_CODEC_THC) {
            st = psagg__fail(PSAGG_EINVAL,
                             "tensor %u '%s': a parameter ([server] optimizer) cannot be thc yet: "
                             "the servers step on an fp32 sum, and thc's is integers the workers "
                             "decode (declare it maxmin, or push its gradient without the "
                             "server optimizer)",
                             t, ti->name);
            goto err;
        }
        if (decl[t].k && decl[t].codec != PSAGG_CODEC_TOPK) {
            st = psagg__fail(PSAGG_EINVAL,
                             "tensor %u '%s': field k is %u, but its codec is not topk", t,
                             ti->name, decl[t].k);
            goto err;
        }
        if (ti->param && ti->chunk_elems > chunk_elems) { /* its fp32 weights fit no message */
            st = psagg__fail(PSAGG_EINVAL,
                             "tensor %u '%s': a parameter whose bucket (%u) is larger than a chunk "
                             "(%llu elements, [worker] chunk_bytes)",
                             t, ti->name, ti->codec.bucket, (unsigned long long)chunk_elems);
            goto err;
        }
        if (ti->param && ti->adaptive) {
            st = psagg__fail(PSAGG_EINVAL, "tensor %u '%s': a parameter cannot be adaptive", t,
                             ti->name);
            goto err;
        }
        ti->first_chunk = (uint32_t)total_chunks;
        /* count <= 2^32 - 1 and chunk_elems >= 64: no overflow */
        ti->n_chunks = (uint32_t)(ti->count / ti->chunk_elems + (ti->count % ti->chunk_elems != 0));
        total_chunks += ti->n_chunks;
        if (total_chunks > PSAGG_MAX_CHUNKS) {
            st = psagg__fail(PSAGG_EINVAL,
                             "layout: tensor %u '%s' brings the job to %llu chunks, more than %u",
                             t, ti->name, (unsigned long long)total_chunks, PSAGG_MAX_CHUNKS);
            goto err;
        }
    }
    if ((st = check_unique_names(l.tensors, n)))
        goto err;
    l.n_chunks = (uint32_t)total_chunks;
    l.chunks = calloc(total_chunks, sizeof *l.chunks);
    order = malloc(total_chunks * sizeof *order);
    l.owned_count = calloc(n_servers, sizeof *l.owned_count);
    l.owned_bytes = calloc(n_servers, sizeof *l.owned_bytes);
    if (!l.chunks || !order || !l.owned_count || !l.owned_bytes) {
        st = psagg__fail(PSAGG_ENOMEM, "layout of %llu chunks", (unsigned long long)total_chunks);
        goto err;
    }
    for (uint32_t t = 0; t < n; t++) {
        psagg__tensor_info *ti = &l.tensors[t];
        uint64_t ce = ti->chunk_elems;
        for (uint32_t k = 0; k < ti->n_chunks; k++, c++) {
            psagg__chunk_info *ci = &l.chunks[c];
            ci->key = t;
            ci->index = k;
            ci->offset = k * ce;
            ci->count = (ti->count - ci->offset) < ce ? ti->count - ci->offset : ce;
            ci->enc_bytes = psagg__encoded_size(&ti->codec, ci->count);
            if (ti->adaptive) {
                psagg_codec big = psagg__adapt_largest(&ti->codec, ti->chunk_elems);
                ci->cap_bytes = psagg__encoded_size(&big, ci->count);
            } else {
                ci->cap_bytes = ci->enc_bytes;
            }
            if (ci->cap_bytes < ci->enc_bytes) /* cannot be: 8 bits at the finest bucket */
                ci->cap_bytes = ci->enc_bytes;
            if (ci->cap_bytes > l.max_enc_bytes)
                l.max_enc_bytes = ci->cap_bytes;
            {
                size_t up = ti->adaptive
                                ? psagg__adapt_update_cap(&ti->codec, ti->chunk_elems, ci->count)
                                : psagg__update_cap(&ti->codec, ci->count);
                if (up > l.max_update_bytes)
                    l.max_update_bytes = up;
            }
            if (ti->param && 4 * ci->count > l.max_param_bytes)
                l.max_param_bytes = 4 * ci->count;
            order[c] = c;
        }
    }
    qsort_r(order, total_chunks, sizeof *order, by_cost_desc, &l);
    /* the per-round chunks first, then the rare ones on a count of their own */
    if (!(load = calloc(2 * (size_t)n_servers, sizeof *load))) {
        st = psagg__fail(PSAGG_ENOMEM, "layout of %u servers", n_servers);
        goto err;
    }
    for (int pass = 0; pass < 2; pass++) {
        uint64_t *cost = load + (size_t)pass * n_servers;
        for (uint64_t i = 0; i < total_chunks; i++) {
            psagg__chunk_info *ci = &l.chunks[order[i]];
            uint32_t best = 0;
            if (l.tensors[ci->key].rare != pass)
                continue;
            for (uint32_t s = 1; s < n_servers; s++)
                if (cost[s] < cost[best])
                    best = s;
            ci->owner = best;
            cost[best] += chunk_cost(&l, ci);
            if (!pass)
                l.owned_bytes[best] += ci->enc_bytes;
        }
    }
    free(load);
    load = NULL;
    /* slots in chunk order, so each server's table is ordered by (key, chunk) */
    for (uint32_t i = 0; i < l.n_chunks; i++)
        l.chunks[i].slot = l.owned_count[l.chunks[i].owner]++;
    free(order);
    *out = l;
    return PSAGG_OK;
err:
    free(order);
    free(load);
    psagg__layout_free(&l);
    return st;
}

uint32_t psagg__layout_generation(const psagg__layout *l, uint32_t key, uint32_t round)
{
    return l->tensors[key].adaptive ? psagg__adapt_generation(round, l->adapt_interval) : 0;
}

void psagg__layout_free(psagg__layout *l)
{
    free(l->tensors);
    free(l->chunks);
    free(l->owned_count);
    free(l->owned_bytes);
    memset(l, 0, sizeof *l);
}
