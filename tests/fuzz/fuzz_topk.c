/*
 * fuzz_topk.c - the sparse format (kernels/topk.h): buffers from anyone (validate and decode)
 * and numbers from anyone (encode with error feedback).
 *
 * Input: byte 0 picks the format (bits 2..8; block 256, 512 or 4096; rounding), byte 1 its k
 * (a fraction of the block, at least 1), bytes 2-3 the element count n (1..65535), byte 4 the
 * operation (bit 0: encode, else decode; with bit 1 an encode starts from a residual of the n
 * floats after x, else from zero), then the buffer: an encoded buffer of n elements
 * (zero-padded or cut to its exact size), or the floats to encode (n of them, zero-padded).
 * Properties: no crash or out-of-bounds access; validate and every decode op agree on the
 * status; a valid buffer decodes with every entry not kept at -0 and at most k_m kept per
 * block; an encode that succeeds validates, and its residual is v - y bit for bit; every SIMD
 * path this CPU has (codec.h's dispatch) gives the scalar encode's status, bad index, bytes and
 * residual.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "fuzz.h"
#include "kernels/codec.h"
#include "kernels/topk.h"

static void pick(const uint8_t *d, psagg__topk_format *f)
{
    static const uint32_t blocks[] = {256, 512, 4096};
    f->bits = 2 + d[0] % 7;
    f->block = blocks[(d[0] / 7) % 3];
    f->rounding = d[0] & 0x80 ? PSAGG_ROUND_NEAREST : PSAGG_ROUND_STOCHASTIC;
    f->k = 1 + (uint32_t)((uint64_t)d[1] * (f->block - 1) / 255);
    CHECK(psagg__topk_check(f) == PSAGG_OK, "format: %s", psagg_last_error());
}

static uint32_t u32_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    psagg__topk_format f;
    size_t n, len;
    uint8_t *buf;
    float *a, *b;
    if (size < 5)
        return 0;
    pick(data, &f);
    n = fuzz_u16(data + 2);
    if (!n)
        return 0;
    len = psagg__topk_encoded_size(&f, n);
    buf = calloc(len > 8 * n ? len : 8 * n, 1);
    a = malloc(n * sizeof *a);
    b = malloc(n * sizeof *b);
    CHECK(buf && a && b, "memory");
    memcpy(buf, data + 5,
           size - 5 < (len > 8 * n ? len : 8 * n) ? size - 5 : (len > 8 * n ? len : 8 * n));
    if (data[4] & 1) { /* encode the floats, with error feedback (from zero, or from r0) */
        float *x = malloc(n * sizeof *x), *r = calloc(n, sizeof *r), *r2 = malloc(n * sizeof *r2),
              *r0 = calloc(n, sizeof *r0);
        uint8_t *out = malloc(len), *out2 = malloc(len);
        size_t bad = 0;
        psagg_status st;
        psagg_codec c = {.id = PSAGG_CODEC_TOPK,
                         .bits = f.bits,
                         .bucket = f.block,
                         .k = f.k,
                         .rounding = f.rounding};
        psagg__isa was = psagg__codec_isa();
        CHECK(x && r && r2 && r0 && out && out2, "memory");
        memcpy(x, buf, n * sizeof *x);
        if (data[4] & 2)
            memcpy(r0, buf + 4 * n, n * sizeof *r0);
        memcpy(r, r0, n * sizeof *r);
        st = psagg__topk_encode(&f, x, r, n, psagg__rng_key_make(5, 6), out, len, &bad);
        for (int isa = PSAGG_ISA_SCALAR + 1; isa < PSAGG_ISA_COUNT; isa++) {
            size_t bad2 = (size_t)-1;
            psagg_status st2;
            if (!psagg__isa_supported((psagg__isa)isa))
                continue;
            memcpy(r2, r0, n * sizeof *r2);
            psagg__codec_set_isa((psagg__isa)isa);
            st2 = psagg__encode(&c, x, r2, n, psagg__rng_key_make(5, 6), out2, len, &bad2);
            psagg__codec_set_isa(was);
            CHECK(st2 == st &&
                      (st ? bad2 == bad : !memcmp(out, out2, len) && !memcmp(r, r2, n * sizeof *r)),
                  "%s: status %d (element %zu), the scalar encode's %d (element %zu)%s",
                  psagg__isa_name((psagg__isa)isa), (int)st2, bad2, (int)st, bad,
                  st == st2 && !st ? ": other bytes or residual" : "");
        }
        free(out2), free(r2);
        if (!st) {
            CHECK(!psagg__topk_validate(&f, out, len, n), "an encode does not validate: %s",
                  psagg_last_error());
            CHECK(!psagg__topk_decode_into(&f, out, len, n, a, PSAGG_DECODE_SET, 1.0f), "decode");
            for (size_t i = 0; i < n; i++) {
                float v = x[i] + r0[i]; /* what was encoded */
                CHECK(u32_of(r[i]) == u32_of(v - a[i]) ||
                          (u32_of(a[i]) == 0x80000000u && u32_of(r[i]) == u32_of(v)),
                      "element %zu: residual %g of v %g and y %g", i, (double)r[i], (double)v,
                      (double)a[i]);
            }
        } else {
            CHECK(bad < n, "a refused encode names element %zu of %zu", bad, n);
        }
        free(x), free(r), free(r0), free(out);
    } else { /* a buffer from anyone */
        psagg_status v = psagg__topk_validate(&f, buf, len, n);
        static const psagg__decode_op ops[] = {PSAGG_DECODE_SET, PSAGG_DECODE_ADD,
                                               PSAGG_DECODE_FIRST, PSAGG_DECODE_SCALE};
        for (size_t o = 0; o < 4; o++) {
            for (size_t i = 0; i < n; i++)
                b[i] = (float)((int)(i % 5) - 2);
            CHECK(psagg__topk_decode_into(&f, buf, len, n, b, ops[o], 2.0f) == v,
                  "decode op %d and validate disagree", (int)ops[o]);
        }
        if (v == PSAGG_OK) {
            CHECK(!psagg__topk_decode_into(&f, buf, len, n, a, PSAGG_DECODE_SET, 1.0f), "decode");
            for (size_t base = 0; base < n; base += f.block) {
                size_t end = base + f.block < n ? base + f.block : n, kept = 0;
                for (size_t i = base; i < end; i++)
                    kept += u32_of(a[i]) != 0x80000000u;
                CHECK(kept <= f.k, "block at %zu decodes %zu entries, more than k %u", base, kept,
                      f.k);
            }
        }
    }
    free(buf), free(a), free(b);
    return 0;
}
