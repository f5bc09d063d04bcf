/*
 * fuzz_declare.c - a worker's control frame as the server takes it: header check
 * (psagg__ctl_hdr_check), DECLARE check (psagg__ctl_declare_check), layout
 * (psagg__layout_build); ERROR/ABORT frames through psagg__ctl_error_parse.
 *
 * Input: one byte of server count (1 + b % 16), then the frame (12-byte header, body).
 * Properties: nothing crashes, leaks, reads out of bounds or allocates without bound (libFuzzer
 * -rss_limit_mb); a refusal says what is wrong; a layout that is built is consistent: each tensor's
 * chunks cover it exactly, in order, each with the encoded size of its codec, owners and slots form
 * a numbering per server, and a header built for each chunk passes psagg__msg_check.
 */
#include <string.h>

#include "base/error.h"
#include "fuzz.h"
#include "kernels/codec.h"
#include "runtime/channel.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/wire.h"

static void check_layout(const psagg__layout *l, uint32_t n_servers)
{
    uint64_t *owned = calloc(n_servers, sizeof *owned);
    uint8_t *seen;
    size_t max_enc = 0, max_param = 0;
    CHECK(owned && l->n_servers == n_servers, "servers");
    for (uint32_t t = 0; t < l->n_tensors; t++) {
        const psagg__tensor_info *ti = &l->tensors[t];
        uint64_t offset = 0;
        CHECK(ti->n_chunks >= 1 && ti->first_chunk + ti->n_chunks <= l->n_chunks,
              "tensor %u chunks", t);
        for (uint32_t c = 0; c < ti->n_chunks; c++) {
            const psagg__chunk_info *ci = &l->chunks[ti->first_chunk + c];
            CHECK(ci->key == t && ci->index == c && ci->offset == offset, "chunk order");
            CHECK(ci->count >= 1 && ci->count <= ti->chunk_elems, "chunk size");
            CHECK(ci->enc_bytes == psagg__encoded_size(&ti->codec, ci->count), "enc_bytes");
            CHECK(ci->cap_bytes >= ci->enc_bytes, "cap_bytes");
            CHECK(ci->owner < n_servers, "owner");
            owned[ci->owner]++;
            offset += ci->count;
            if (ci->cap_bytes > max_enc) /* an adaptive tensor's buffers hold its largest */
                max_enc = ci->cap_bytes;
            if (ti->param && 4 * ci->count > max_param)
                max_param = 4 * ci->count;
        }
        CHECK(offset == ti->count, "tensor %u: chunks cover %llu of %llu elements", t,
              (unsigned long long)offset, (unsigned long long)ti->count);
    }
    CHECK(max_enc == l->max_enc_bytes, "max_enc_bytes");
    CHECK(max_param == l->max_param_bytes, "max_param_bytes");
    /* slots: 0..owned_count-1 on each server, each once */
    for (uint32_t s = 0; s < n_servers; s++) {
        CHECK(owned[s] == l->owned_count[s], "owned_count of server %u", s);
        seen = calloc(owned[s] + 1, 1);
        CHECK(seen, "memory");
        for (uint32_t c = 0; c < l->n_chunks; c++)
            if (l->chunks[c].owner == s) {
                CHECK(l->chunks[c].slot < owned[s] && !seen[l->chunks[c].slot], "slot");
                seen[l->chunks[c].slot] = 1;
            }
        free(seen);
    }
    /* a header for a few chunks passes the message check */
    for (uint32_t c = 0; c < l->n_chunks; c += 1 + l->n_chunks / 8) {
        const psagg__chunk_info *ci = &l->chunks[c], *got = NULL;
        int param = l->tensors[ci->key].param;
        size_t len =
            sizeof(psagg__msg_hdr) + ci->enc_bytes + (param ? sizeof(psagg__msg_param) : 0);
        uint8_t *msg = calloc(1, len);
        const char *bad;
        CHECK(msg, "memory");
        psagg__msg_init((psagg__msg_hdr *)msg, PSAGG_MSG_PUSH, 0, 0, ci, &l->tensors[ci->key].codec,
                        0);
        if (param) { /* a gradient's push carries its trailer (GRAD, lr 0, weight 1) */
            psagg__msg_param prm = {.flags = PSAGG_PARAM_GRAD, .weight = 1.0f};
            memcpy(msg + sizeof(psagg__msg_hdr) + ci->enc_bytes, &prm, sizeof prm);
            ((psagg__msg_hdr *)msg)->len += (uint32_t)sizeof(psagg__msg_param);
        }
        bad = psagg__msg_check(msg, len, 0, PSAGG_MSG_PUSH, l, &got, NULL);
        CHECK(!bad && got == ci, "chunk %u: field %s", c, bad ? bad : "(ci)");
        free(msg);
    }
    free(owned);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    psagg__ctl_hdr h;
    uint8_t *body;
    uint32_t n_servers;
    psagg__layout l;

    if (size < 1 + sizeof h)
        return 0;
    n_servers = 1 + data[0] % 16;
    memcpy(&h, data + 1, sizeof h);
    if (psagg__ctl_hdr_check(&h, PSAGG_CTL_MAX_FRAME, "fuzz") != PSAGG_OK)
        return 0;
    if (h.len != size - 1 - sizeof h) /* the reader hands over exactly len bytes */
        return 0;
    body = malloc(h.len ? h.len : 1);
    CHECK(body, "memory");
    memcpy(body, data + 1 + sizeof h, h.len);
    if (h.type == PSAGG_CTL_ERROR || h.type == PSAGG_CTL_ABORT) {
        const char *msg = NULL;
        if (psagg__ctl_error_parse(&h, body, &msg) != PSAGG_OK)
            CHECK(msg && strlen(msg) < sizeof(((psagg__ctl_error *)0)->msg), "error text");
    } else if (h.type == PSAGG_CTL_DECLARE &&
               psagg__ctl_declare_check(&h, body, "fuzz") == PSAGG_OK) {
        const psagg__ctl_declare *d = (const psagg__ctl_declare *)body;
        if (psagg__layout_build((const psagg__ctl_tensor *)(d + 1), d->count, d->chunk_elems,
                                n_servers, d->adapt_interval, &l) == PSAGG_OK) {
            CHECK(l.n_tensors == d->count && l.n_chunks <= PSAGG_MAX_CHUNKS, "counts");
            check_layout(&l, n_servers);
            psagg__layout_free(&l);
        } else {
            const char *msg = psagg_last_error();
            size_t n = strlen(msg);
            /* "tensor 0 'a': " with nothing after it was once all an unknown codec got */
            CHECK(n && !(n >= 2 && !strcmp(msg + n - 2, ": ")), "a refusal that says nothing: '%s'",
                  msg);
        }
    }
    free(body);
    return 0;
}
