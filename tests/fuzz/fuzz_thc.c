/*
 * fuzz_thc.c - integer aggregation's wire format (kernels/thc.h): pushes a server checks and
 * updates a worker decodes from anyone, and numbers from anyone (a worker's push).
 *
 * Input: byte 0 picks the format (bit 0: bits 2 or 4; bits 1-5: block 64, 256 or 1024, their
 * value mod 3; bits 6-7: an update's width, below), bytes 1-2 the element count n (1..65535),
 * byte 3 the operation (0: a push from anyone, folded 1 + (byte 3 >> 3) % 32 times; 1: an
 * update from anyone; 2: encode a push of the floats that follow, at scales taken from them
 * too, from a residual of the floats after those with byte 3's bit 2), then the buffer
 * (zero-padded or cut to its size: a push, or an update of the width byte 0's top bits pick: 4
 * bits at 00, 8 at 01, else 16).
 * Properties: no crash or out-of-bounds access; a push that passes psagg__thc_push_check folds
 * into a valid update, whose decode succeeds, and its values add into a residual; an update the
 * decode takes gives finite values and next scales of 0 or in the table's range, on every ISA
 * the same bits; an encode succeeds or names its bad element, and every ISA gives the scalar
 * one's status, bytes, residual; its push passes the check.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "fuzz.h"
#include "kernels/codec.h"
#include "kernels/thc.h"

static uint32_t u32_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Decode update (len bytes) on every ISA: the same status and bits as the scalar path's. */
static psagg_status decode_all(uint32_t bits, uint32_t D, const uint8_t *upd, size_t len, size_t n,
                               float *out, float *next)
{
    psagg__rng_key rot = psagg__rng_key_make(3, 4);
    psagg__isa was = psagg__codec_isa();
    float *o2 = malloc(n * sizeof *o2), *n2 = malloc((n / 64 + 1) * sizeof *n2);
    psagg_status st;
    CHECK(o2 && n2, "memory");
    psagg__codec_set_isa(PSAGG_ISA_SCALAR);
    st = psagg__thc_update_decode(bits, D, rot, upd, len, n, 0.5f, PSAGG_DECODE_SCALE, out, next);
    for (int isa = PSAGG_ISA_SCALAR + 1; isa < PSAGG_ISA_COUNT; isa++) {
        psagg_status st2;
        if (!psagg__isa_supported((psagg__isa)isa))
            continue;
        psagg__codec_set_isa((psagg__isa)isa);
        st2 = psagg__thc_update_decode(bits, D, rot, upd, len, n, 0.5f, PSAGG_DECODE_SCALE, o2, n2);
        CHECK(st2 == st && (st || !memcmp(out, o2, n * sizeof *o2)),
              "%s: update decode status %d, the scalar one's %d%s",
              psagg__isa_name((psagg__isa)isa), (int)st2, (int)st,
              st == st2 ? ": other values" : "");
    }
    psagg__codec_set_isa(was);
    free(o2), free(n2);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t blocks[] = {64, 256, 1024};
    static const uint32_t tops[] = {15, 255, 65535, 65535}; /* a sum's widest: 4, 8, 16 bits */
    uint32_t bits, D;
    size_t n, nb, np, plen, ulen, cap;
    uint8_t *buf;
    float *a, *next;

    if (size < 4)
        return 0;
    bits = data[0] & 1 ? 4 : 2;
    D = blocks[(data[0] >> 1 & 0x1F) % 3];
    n = fuzz_u16(data + 1);
    if (!n)
        return 0;
    nb = psagg__thc_blocks(n, D);
    np = psagg__thc_rotated_len(n, D);
    plen = psagg__thc_push_bytes(bits, D, n);
    ulen = psagg__thc_update_bytes(bits, D, n, tops[data[0] >> 6] / ((1u << bits) - 1));
    cap = 8 * np + 8 * nb + plen + ulen;
    buf = calloc(cap, 1);
    a = malloc(n * sizeof *a);
    next = malloc(nb * sizeof *next);
    CHECK(buf && a && next, "memory");
    memcpy(buf, data + 4, size - 4 < cap ? size - 4 : cap);
    if (data[3] % 3 == 0) { /* a push from anyone, folded k times (4-, 8- and 16-bit sums) */
        if (psagg__thc_push_check(bits, D, buf, plen, n) == PSAGG_OK) {
            const size_t k = 1 + (size_t)(data[3] >> 3) % 32;
            const size_t ul = psagg__thc_update_bytes(bits, D, n, k);
            const uint8_t *in[32];
            uint8_t *upd = malloc(ul);
            float *acc = calloc(np, sizeof *acc);
            CHECK(upd && acc, "memory");
            for (size_t i = 0; i < k; i++)
                in[i] = buf;
            CHECK(!psagg__thc_update_fold(bits, D, in, k, plen, n, upd, ul),
                  "a checked push does not fold %zu times: %s", k, psagg_last_error());
            CHECK(!decode_all(bits, D, upd, ul, n, a, next),
                  "the update of a checked push does not decode: %s", psagg_last_error());
            CHECK(!psagg__thc_push_values(bits, D, buf, plen, n, acc), "push values: %s",
                  psagg_last_error());
            for (size_t i = 0; i < np; i++)
                CHECK(isfinite(acc[i]), "push value %zu is %g", i, (double)acc[i]);
            free(upd), free(acc);
        }
    } else if (data[3] % 3 == 1) { /* an update from anyone */
        if (decode_all(bits, D, buf, ulen, n, a, next) == PSAGG_OK) {
            for (size_t i = 0; i < n; i++)
                CHECK(isfinite(a[i]), "decoded element %zu is %g", i, (double)a[i]);
            for (size_t m = 0; m < nb; m++)
                CHECK(next[m] == 0 ||
                          (next[m] >= PSAGG_THC_MIN_SCALE && next[m] <= PSAGG_THC_MAX_SCALE),
                      "next scale %g of block %zu", (double)next[m], m);
        }
    } else { /* a worker's push of the floats that follow */
        float *x = malloc(n * sizeof *x), *sc = malloc(nb * sizeof *sc);
        float *r0 = calloc(np, sizeof *r0), *r = malloc(np * sizeof *r),
              *r2 = malloc(np * sizeof *r2);
        uint8_t *out = malloc(plen), *out2 = malloc(plen);
        psagg__rng_key rot = psagg__rng_key_make(7, 8), key = psagg__rng_key_make(9, 10);
        psagg__isa was = psagg__codec_isa();
        size_t bad = 0;
        psagg_status st;
        CHECK(x && sc && r0 && r && r2 && out && out2, "memory");
        memcpy(x, buf, n * sizeof *x);
        for (size_t m = 0; m < nb; m++) { /* a scale of 0 or in range, from the bytes */
            float s;
            memcpy(&s, buf + 4 * n + 4 * m, 4);
            s = fabsf(s);
            sc[m] = !isfinite(s) || s < PSAGG_THC_MIN_SCALE ? 0
                    : s > PSAGG_THC_MAX_SCALE               ? PSAGG_THC_MAX_SCALE
                                                            : s;
        }
        if (data[3] & 4)
            for (size_t i = 0; i < np; i++) { /* (finite, bounded: a residual a push left) */
                float v;
                memcpy(&v, buf + 4 * n + 4 * nb + 4 * i, 4);
                r0[i] = isfinite(v) && fabsf(v) < 0x1p90f ? v : 0;
            }
        psagg__codec_set_isa(PSAGG_ISA_SCALAR);
        memcpy(r, r0, np * sizeof *r);
        st = psagg__thc_push_encode(bits, D, rot, sc, x, r, n, key, out, plen, &bad);
        for (int isa = PSAGG_ISA_SCALAR + 1; isa < PSAGG_ISA_COUNT; isa++) {
            size_t bad2 = (size_t)-1;
            psagg_status st2;
            if (!psagg__isa_supported((psagg__isa)isa))
                continue;
            memcpy(r2, r0, np * sizeof *r2);
            psagg__codec_set_isa((psagg__isa)isa);
            st2 = psagg__thc_push_encode(bits, D, rot, sc, x, r2, n, key, out2, plen, &bad2);
            CHECK(st2 == st && (st ? bad2 == bad
                                   : !memcmp(out, out2, plen) && !memcmp(r, r2, np * sizeof *r)),
                  "%s: encode status %d (element %zu), the scalar one's %d (element %zu)%s",
                  psagg__isa_name((psagg__isa)isa), (int)st2, bad2, (int)st, bad,
                  st == st2 && !st ? ": other bytes or residual" : "");
        }
        psagg__codec_set_isa(was);
        if (!st) {
            CHECK(!psagg__thc_push_check(bits, D, out, plen, n), "an encode does not check: %s",
                  psagg_last_error());
            for (size_t i = 0; i < np; i++)
                CHECK(!isnan(r[i]), "residual %zu is NaN", i);
        } else {
            CHECK(bad < n && (st == PSAGG_ENONFINITE || st == PSAGG_ERANGE),
                  "a refused encode (status %d) names element %zu of %zu", (int)st, bad, n);
            CHECK(!(fabsf(x[bad]) <= PSAGG_THC_MAX_ABS), "element %zu (%g) was refused", bad,
                  (double)x[bad]);
        }
        (void)u32_of;
        free(x), free(sc), free(r0), free(r), free(r2), free(out), free(out2);
    }
    free(buf), free(a), free(next);
    return 0;
}
