/* codec_name.c - codec descriptions to and from text ("maxmin4", "fp16", ...). Layer: kernels. */
#include "kernels/codec.h"
#include "kernels/thc.h"
#include "kernels/topk.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/*
 * Accepts fp32 | fp16 | bf16 | maxmin<b> | maxmin:<b> | topk<b>:<kept> | thc<b>, optionally
 * followed by "/<bucket>" (topk, thc: the block) and "/sr" or "/nearest" (any order), e.g.
 * "maxmin4/512/nearest", "topk2:0.02" (2 % of each block of 4096: k = 82), "topk2:82/4096",
 * "thc2/4096" (thc rounds stochastically: psagg__codec_check refuses /nearest).
 * <kept> is a fraction in (0, 1) of the block (k = max(1, round(fraction x block)), computed
 * once the block is known) or a whole k. Fields not given keep the defaults (bucket 0 = the
 * codec's default, stochastic rounding).
 */
psagg_status psagg_codec_parse(const char *text, psagg_codec *out)
{
    char buf[64], *save = NULL, *tok;
    psagg_codec c = {
        .id = PSAGG_CODEC_FP32, .bits = 0, .bucket = 0, .rounding = PSAGG_ROUND_STOCHASTIC};
    double fraction = 0; /* topk's kept share, when given as one */

    if (!text || strlen(text) >= sizeof buf)
        return psagg__fail(PSAGG_EINVAL, "codec name missing or too long");
    snprintf(buf, sizeof buf, "%s", text);
    tok = strtok_r(buf, "/", &save);
    if (!tok)
        return psagg__fail(PSAGG_EINVAL, "empty codec name");
    if (!strcasecmp(tok, "fp32") || !strcasecmp(tok, "none")) {
        c.id = PSAGG_CODEC_FP32;
    } else if (!strcasecmp(tok, "fp16")) {
        c.id = PSAGG_CODEC_FP16;
    } else if (!strcasecmp(tok, "bf16")) {
        c.id = PSAGG_CODEC_BF16;
    } else if (!strncasecmp(tok, "maxmin", 6)) {
        const char *b = tok + 6;
        char *end;
        long bits;
        if (*b == ':')
            b++;
        bits = strtol(b, &end, 10);
        if (end == b || *end || bits < 1 || bits > 8)
            return psagg__fail(PSAGG_EINVAL, "codec '%s': maxmin needs bits 1..8 (e.g. maxmin4)",
                               text);
        c.id = PSAGG_CODEC_MAXMIN;
        c.bits = (uint32_t)bits;
    } else if (!strncasecmp(tok, "topk", 4)) {
        const char *b = tok + 4;
        char *end;
        long bits = strtol(b, &end, 10);
        double kept;
        if (end == b || *end != ':' || bits < 2 || bits > 8)
            return psagg__fail(PSAGG_EINVAL,
                               "codec '%s': topk needs bits 2..8 and the share kept (e.g. "
                               "topk2:0.02, or topk2:82 for k = 82 per block)",
                               text);
        b = end + 1;
        kept = strtod(b, &end);
        if (end == b || *end || !(kept > 0) || (kept >= 1 && kept != (double)(uint32_t)kept) ||
            kept > 65536)
            return psagg__fail(PSAGG_EINVAL,
                               "codec '%s': topk's share kept '%s' is neither a fraction in (0, 1) "
                               "nor a whole k in 1..65536",
                               text, b);
        c.id = PSAGG_CODEC_TOPK;
        c.bits = (uint32_t)bits;
        if (kept < 1)
            fraction = kept;
        else
            c.k = (uint32_t)kept;
    } else if (!strncasecmp(tok, "thc", 3)) {
        const char *b = tok + 3;
        char *end;
        long bits = strtol(b, &end, 10);
        if (end == b || *end || (bits != 2 && bits != 4))
            return psagg__fail(PSAGG_EINVAL, "codec '%s': thc needs bits 2 or 4 (thc2, thc4)",
                               text);
        c.id = PSAGG_CODEC_THC;
        c.bits = (uint32_t)bits;
    } else {
        return psagg__fail(PSAGG_EINVAL,
                           "unknown codec '%s' (expected fp32, fp16, bf16, maxmin<bits>, "
                           "topk<bits>:<kept> or thc<bits>)",
                           text);
    }
    while ((tok = strtok_r(NULL, "/", &save))) {
        char *end;
        unsigned long v;
        if (!strcasecmp(tok, "sr") || !strcasecmp(tok, "stochastic")) {
            c.rounding = PSAGG_ROUND_STOCHASTIC;
            continue;
        }
        if (!strcasecmp(tok, "nearest") || !strcasecmp(tok, "rn")) {
            c.rounding = PSAGG_ROUND_NEAREST;
            continue;
        }
        v = strtoul(tok, &end, 10);
        if (end == tok || *end || v == 0 || v > (1ul << 20))
            return psagg__fail(PSAGG_EINVAL, "codec '%s': bad field '%s' (bucket or sr|nearest)",
                               text, tok);
        c.bucket = (uint32_t)v;
    }
    if (fraction > 0) { /* of the block given, or the default one */
        double k = fraction * (c.bucket ? c.bucket : PSAGG_TOPK_DEFAULT_BLOCK) + 0.5;
        c.k = k < 1 ? 1 : (uint32_t)k;
    }
    *out = c;
    return PSAGG_OK;
}

const char *psagg_codec_name(const psagg_codec *c, char *buf, size_t len)
{
    switch (c->id) {
    case PSAGG_CODEC_FP32:
        snprintf(buf, len, "fp32");
        break;
    case PSAGG_CODEC_FP16:
        snprintf(buf, len, "fp16");
        break;
    case PSAGG_CODEC_BF16:
        snprintf(buf, len, "bf16");
        break;
    case PSAGG_CODEC_MAXMIN:
        snprintf(buf, len, "maxmin%u/%u/%s", c->bits,
                 c->bucket ? c->bucket : PSAGG_MAXMIN_DEFAULT_BUCKET,
                 c->rounding == PSAGG_ROUND_NEAREST ? "nearest" : "sr");
        break;
    case PSAGG_CODEC_TOPK:
        snprintf(buf, len, "topk%u:%u/%u/%s", c->bits, c->k,
                 c->bucket ? c->bucket : PSAGG_TOPK_DEFAULT_BLOCK,
                 c->rounding == PSAGG_ROUND_NEAREST ? "nearest" : "sr");
        break;
    case PSAGG_CODEC_THC:
        snprintf(buf, len, "thc%u/%u", c->bits, c->bucket ? c->bucket : PSAGG_THC_DEFAULT_BLOCK);
        break;
    default:
        snprintf(buf, len, "codec%d", (int)c->id);
        break;
    }
    return buf;
}
