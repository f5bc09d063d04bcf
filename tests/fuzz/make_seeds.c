/*
 * make_seeds.c - writes the seed corpora of the fuzz targets: make_seeds DIR (normally
 * tests/fuzz/corpus) fills DIR/<target>/ with valid inputs built by psagg's own code, so the
 * fuzzers start from what real peers send. The files are kept in the tree; run this again
 * (and commit the result) when a wire format or the config keys change.
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "fuzz.h"
#include "msg_layout.h"
#include "kernels/codec.h"
#include "kernels/thc.h"
#include "kernels/topk.h"
#include "runtime/auth.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/wire.h"

static const char *root;

static void put(const char *target, const char *name, const void *a, size_t alen, const void *b,
                size_t blen)
{
    char path[1024];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", root, target);
    if (mkdir(path, 0755) && errno != EEXIST)
        CHECK(0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    f = fopen(path, "wb");
    CHECK(f && fwrite(a, 1, alen, f) == alen && (!blen || fwrite(b, 1, blen, f) == blen) &&
              fclose(f) == 0,
          "write %s", path);
}

static void seed_config(void)
{
    static const struct {
        const char *name, *text;
    } s[] = {
        {"minimal", "[cluster]\njob_id = j\nservers = 127.0.0.1:19500\nworkers = 2\n"},
        {"full", "; a job\n[cluster]\njob_id = resnet-1\nservers = 10.0.0.1:19500, "
                 "10.0.0.2:19500\n  10.0.0.3:19500\nworkers = 16\nprovider = tcp\n"
                 "connect_timeout_ms = 30000\nop_timeout_ms = 60000\n[server]\nthreads = 4\n"
                 "error_feedback = on\ngpu = off\ngpu_min_elems = 262144\n"
                 "memory_budget_mb = 4096\n[worker]\nchunk_bytes = 1048576\nseed = 7\n"
                 "max_inflight = 32\n[codec]\ndefault = maxmin4\nbucket = 512\n"
                 "rounding = nearest\nerror_feedback = off\nmin_compress_elems = 1024\n"
                 "[log]\nlevel = warn\n"},
        {"ipv6", "[cluster]\njob_id = v6\nservers = [::1]:19500 [fe80::1]:1\nworkers: 3\n"
                 "provider = shm\n[codec]\ndefault = bf16\n"},
        {"secret", "[cluster]\njob_id = s\nservers = a:1\nworkers = 1\n"
                   "secret_file = /etc/hostname\ndata_auth = on\n"},
        {"bad_key", "[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkerz = 2\n"},
        {"bad_value", "[cluster]\njob_id = j\nservers = 127.0.0.1:1\nworkers = 2x\n"},
        {"bad_section", "[clusterr]\n[cluster]\njob_id = j\n"},
    };
    static const char env[] = "\0CLUSTER_WORKERS=3\nWORKER_CHUNK_BYTES=8192\nCODEC_DEFAULT=fp16";
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        put("config", s[i].name, s[i].text, strlen(s[i].text), NULL, 0);
    put("config", "with_env", s[0].text, strlen(s[0].text), env, sizeof env - 1);
}

static void seed_declare(void)
{
    static const char *codecs[] = {"fp32",   "fp16", "bf16", "maxmin1/64", "maxmin4/512/nearest",
                                   "maxmin8"};
    static const uint64_t counts[] = {1, 1023, 70000, 5, 1u << 20, 4096};
    uint8_t
        f[1 + sizeof(psagg__ctl_hdr) + sizeof(psagg__ctl_declare) + 6 * sizeof(psagg__ctl_tensor)];
    uint8_t *body = f + 1 + sizeof(psagg__ctl_hdr);
    psagg__ctl_hdr h = {.magic = PSAGG_CTL_MAGIC, .version = PSAGG_PROTO_VERSION};
    psagg__ctl_error e = {.status = PSAGG_EPEER, .msg = "server 0: worker 1 failed"};

    for (uint32_t n = 1; n <= 6; n += 5) {
        psagg__ctl_declare d = {.count = n, .chunk_elems = 16384};
        memset(f, 0, sizeof f);
        f[0] = (uint8_t)(n + 1); /* servers */
        memcpy(body, &d, sizeof d);
        for (uint32_t t = 0; t < n; t++) {
            psagg_codec c;
            psagg__ctl_tensor wire;
            char name[16];
            snprintf(name, sizeof name, "t%u", t);
            CHECK(!psagg_codec_parse(codecs[t], &c), "codec");
            CHECK(!psagg__tensor_to_wire(name, counts[t], &c, &wire), "tensor");
            memcpy(body + sizeof d + t * sizeof wire, &wire, sizeof wire);
        }
        h.type = PSAGG_CTL_DECLARE;
        h.len = (uint32_t)(sizeof d + n * sizeof(psagg__ctl_tensor));
        memcpy(f + 1, &h, sizeof h);
        put("declare", n == 1 ? "declare_1" : "declare_6", f, 1 + sizeof h + h.len, NULL, 0);
    }
    /* regressions: an unknown codec id (refused with an empty message once), and a
     * chunk_elems near 2^64 (once wrapped a 100-element tensor into 0 chunks) */
    for (int k = 0; k < 2; k++) {
        psagg__ctl_declare d = {.count = 1, .chunk_elems = k ? UINT64_MAX - 63 : 16384};
        psagg__ctl_tensor wire;
        psagg_codec c = {.id = PSAGG_CODEC_FP32};
        CHECK(!psagg__tensor_to_wire("a", 100, &c, &wire), "tensor");
        if (!k)
            wire.codec = 9;
        memcpy(body, &d, sizeof d);
        memcpy(body + sizeof d, &wire, sizeof wire);
        h.type = PSAGG_CTL_DECLARE;
        h.len = (uint32_t)(sizeof d + sizeof wire);
        f[0] = 0;
        memcpy(f + 1, &h, sizeof h);
        put("declare", k ? "chunk_elems_wrap" : "codec_unknown", f, 1 + sizeof h + h.len, NULL, 0);
    }
    h.type = PSAGG_CTL_ABORT;
    h.len = sizeof e;
    memcpy(f + 1, &h, sizeof h);
    memcpy(body, &e, sizeof e);
    put("declare", "abort", f, 1 + sizeof h + sizeof e, NULL, 0);
    h.type = PSAGG_CTL_PING;
    h.len = 0;
    memcpy(f + 1, &h, sizeof h);
    put("declare", "ping", f, 1 + sizeof h, NULL, 0);
}

/* one message of each tensor of fuzz_msg's layout */
static void seed_msg(void)
{
    psagg__layout l;
    fuzz_msg_layout(&l);
    for (uint32_t k = 0; k < l.n_tensors; k++) {
        const psagg__chunk_info *ci = &l.chunks[l.tensors[k].first_chunk];
        size_t len = 1 + sizeof(psagg__msg_hdr) + ci->enc_bytes + PSAGG_MSG_MAC_BYTES;
        uint8_t *m = calloc(1, len);
        float *x = malloc(ci->count * sizeof *x);
        CHECK(m && x, "memory");
        for (uint64_t i = 0; i < ci->count; i++)
            x[i] = (float)((int)(i % 17) - 8) * 0.1f;
        psagg__msg_init((psagg__msg_hdr *)(m + 1), k % 2 ? PSAGG_MSG_UPDATE : PSAGG_MSG_PUSH, 1, 3,
                        ci, &l.tensors[k].codec, 0);
        CHECK(!psagg__encode(&l.tensors[k].codec, x, NULL, ci->count, psagg__rng_key_make(1, k),
                             m + 1 + sizeof(psagg__msg_hdr), ci->enc_bytes, NULL),
              "encode");
        m[0] = (uint8_t)((k % 2) << 1 | (k == 4)); /* type bit; tensor 4 with a MAC */
        if (l.tensors[k].param) {                  /* a GRAD push with its trailer, no MAC */
            psagg__msg_param prm = {
                .lr = 0.01f, .flags = PSAGG_PARAM_GRAD | PSAGG_PARAM_AVERAGE, .weight = 1.0f};
            psagg__msg_hdr *h = (psagg__msg_hdr *)(m + 1);
            psagg__msg_init(h, PSAGG_MSG_PUSH, 1, 3, ci, &l.tensors[k].codec, 0);
            m = realloc(m, len + sizeof prm);
            CHECK(m, "memory");
            h = (psagg__msg_hdr *)(m + 1);
            memcpy(m + 1 + sizeof *h + ci->enc_bytes, &prm, sizeof prm);
            h->len += (uint32_t)sizeof prm;
            m[0] = 0;
            put("msg", l.tensors[k].name, m, 1 + sizeof *h + h->len, NULL, 0);
        } else {
            put("msg", l.tensors[k].name, m, len - (k == 4 ? 0 : PSAGG_MSG_MAC_BYTES), NULL, 0);
        }
        free(m);
        free(x);
    }
    psagg__layout_free(&l);
}

static void seed_codec(void)
{
    /* decode seeds: a valid encoding of n elements for a few codecs; encode seeds: numbers */
    static const uint8_t picks[] = {0, 1, 2, 3, 6, 10, 6 + 11 * 2, 0x80 | 5};
    for (size_t p = 0; p < sizeof picks; p++) {
        psagg_codec c;
        static const uint32_t buckets[] = {64, 128, 512, 1024};
        int kind = picks[p] % 11;
        uint16_t n = (uint16_t)(100 + 700 * p);
        size_t enc;
        uint8_t head[4] = {picks[p], (uint8_t)(n - 1), (uint8_t)((n - 1) >> 8), 0};
        float *x = malloc(n * sizeof *x);
        uint8_t *buf;
        char name[32];
        memset(&c, 0, sizeof c);
        c.id = kind == 0   ? PSAGG_CODEC_FP32
               : kind == 1 ? PSAGG_CODEC_FP16
               : kind == 2 ? PSAGG_CODEC_BF16
                           : PSAGG_CODEC_MAXMIN;
        c.bits = kind >= 3 ? (uint32_t)kind - 2 : 0;
        c.bucket = buckets[(picks[p] / 11) % 4];
        c.rounding = picks[p] & 0x80 ? PSAGG_ROUND_NEAREST : PSAGG_ROUND_STOCHASTIC;
        CHECK(!psagg__codec_check(&c), "codec");
        enc = psagg__encoded_size(&c, n);
        buf = malloc(enc);
        CHECK(x && buf, "memory");
        for (uint16_t i = 0; i < n; i++)
            x[i] = (float)((int)(i * 37 % 101) - 50) * 0.01f;
        CHECK(!psagg__encode(&c, x, NULL, n, psagg__rng_key_make(5, p), buf, enc, NULL), "encode");
        snprintf(name, sizeof name, "decode_%zu", p);
        put("codec", name, head, 4, buf, enc);
        head[3] = 1;
        snprintf(name, sizeof name, "encode_%zu", p);
        put("codec", name, head, 4, x, n * sizeof *x);
        free(x);
        free(buf);
    }
}

/* thc: a worker's push of each format and the update of three (the fuzzer mutates from
   there), and numbers to encode, with scales and a residual */
static void seed_thc(void)
{
    static const uint8_t fmts[] = {0, 1 | 2 << 1, 1 | 2 << 1 | 0x80}; /* (fuzz_thc.c's byte 0) */
    for (size_t s = 0; s < sizeof fmts; s++) {
        uint32_t bits = fmts[s] & 1 ? 4 : 2;
        uint32_t D = (uint32_t[]){64, 256, 1024}[(fmts[s] >> 1 & 0x1F) % 3];
        uint32_t n = s == 2 ? 3000 : 700;
        size_t nb = psagg__thc_blocks(n, D), np = psagg__thc_rotated_len(n, D);
        size_t plen = psagg__thc_push_bytes(bits, D, n), ulen, big;
        float *x = malloc(n * sizeof *x), *sc = malloc(nb * sizeof *sc), *r = calloc(np, 4);
        uint8_t *push[3], *out;
        char name[32];
        ulen =
            psagg__thc_update_bytes(bits, D, n, (fmts[s] & 0x80 ? 65535 : 15) / ((1u << bits) - 1));
        big = 4 + 4 * (np + n + nb) + plen + ulen;
        out = calloc(big, 1);
        CHECK(x && sc && r && out, "memory");
        for (uint32_t i = 0; i < n; i++)
            x[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 64.0f;
        for (size_t m = 0; m < nb; m++)
            sc[m] = m ? 4.0f : 0.0f; /* (block 0: no scale yet) */
        for (int w = 0; w < 3; w++) {
            CHECK((push[w] = malloc(plen)), "memory");
            CHECK(!psagg__thc_push_encode(bits, D, psagg__rng_key_make(1, 2), sc, x, r, n,
                                          psagg__rng_key_make(3, (uint64_t)w), push[w], plen, NULL),
                  "thc seed: %s", psagg_last_error());
        }
        out[0] = fmts[s], out[1] = (uint8_t)n, out[2] = (uint8_t)(n >> 8), out[3] = 0;
        memcpy(out + 4, push[0], plen);
        snprintf(name, sizeof name, "push_%zu", s);
        put("thc", name, out, 4 + plen, NULL, 0);
        { /* the update of the three pushes (at the width of 3 inputs: 4 bits at thc2, 8 at thc4) */
            size_t l3 = psagg__thc_update_bytes(bits, D, n, 3);
            out[0] = (uint8_t)((fmts[s] & 0x3F) | (psagg__thc_sum_width(bits, 3) == 4 ? 0 : 0x40));
            out[3] = 1;
            CHECK(!psagg__thc_update_fold(bits, D, (const uint8_t *const *)push, 3, plen, n,
                                          out + 4, l3),
                  "thc seed fold: %s", psagg_last_error());
            snprintf(name, sizeof name, "update_%zu", s);
            put("thc", name, out, 4 + l3, NULL, 0);
            out[0] = fmts[s];
        }
        out[3] = 2 | (s & 1 ? 4 : 0);
        memcpy(out + 4, x, 4 * (size_t)n);
        memcpy(out + 4 + 4 * (size_t)n, sc, 4 * nb);
        memcpy(out + 4 + 4 * ((size_t)n + nb), r, 4 * np);
        snprintf(name, sizeof name, "encode_%zu", s);
        put("thc", name, out, 4 + 4 * (n + nb + np), NULL, 0);
        for (int w = 0; w < 3; w++)
            free(push[w]);
        free(x), free(sc), free(r), free(out);
    }
}

/* topk: a valid encode of each kind (the fuzzer mutates from there), a corrupted one, numbers */
static void seed_topk(void)
{
    static const uint8_t fmts[][2] = {{0, 5}, {7 + 2, 40}, {14 + 0x80, 255}, {6, 0}};
    for (size_t s = 0; s < sizeof fmts / sizeof *fmts; s++) {
        psagg__topk_format f = {2 + fmts[s][0] % 7,
                                (uint32_t[]){256, 512, 4096}[(fmts[s][0] / 7) % 3], 0,
                                fmts[s][0] & 0x80 ? PSAGG_ROUND_NEAREST : PSAGG_ROUND_STOCHASTIC};
        uint32_t n = s == 2 ? 5000 : 700;
        f.k = 1 + (uint32_t)((uint64_t)fmts[s][1] * (f.block - 1) / 255);
        size_t len = psagg__topk_encoded_size(&f, n);
        float *x = malloc(n * sizeof *x);
        uint8_t *out = malloc(5 + (len > 8 * n ? len : 8 * n));
        char name[32];
        CHECK(x && out, "memory");
        for (uint32_t i = 0; i < n; i++)
            x[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 64.0f;
        out[0] = fmts[s][0], out[1] = fmts[s][1], out[2] = (uint8_t)n, out[3] = (uint8_t)(n >> 8);
        out[4] = 0;
        CHECK(!psagg__topk_encode(&f, x, NULL, n, psagg__rng_key_make(1, 1), out + 5, len, NULL),
              "topk seed: %s", psagg_last_error());
        snprintf(name, sizeof name, "decode_%zu", s);
        put("topk", name, out, 5 + len, NULL, 0);
        if (s == 0) { /* the first block's first two indices swapped: refused */
            uint8_t t = out[5 + 8 * 3], *p = out + 5 + 8 * 3;
            p[0] = p[1], p[1] = t;
            put("topk", "decode_unsorted", out, 5 + len, NULL, 0);
        }
        out[4] = 1;
        memcpy(out + 5, x, 4 * (size_t)n);
        snprintf(name, sizeof name, "encode_%zu", s);
        put("topk", name, out, 5 + 4 * (size_t)n, NULL, 0);
        /* the same, from a residual of the next n floats (x reversed, a quarter of it) */
        out[4] = 3;
        for (uint32_t i = 0; i < n; i++) {
            float r = x[n - 1 - i] * 0.25f;
            memcpy(out + 5 + 4 * ((size_t)n + i), &r, 4);
        }
        snprintf(name, sizeof name, "encode_residual_%zu", s);
        put("topk", name, out, 5 + 8 * (size_t)n, NULL, 0);
        free(x), free(out);
    }
}

/* Append frame (type, body) to buf at *at, tagged as frame number seq (seq < 0: untagged). */
static void ctl_frame(uint8_t *buf, size_t *at, uint16_t type, const void *body, uint32_t len,
                      int seq)
{
    static const uint8_t key[32]; /* (fuzz_ctl's: zeros) */
    psagg__ctl_hdr h = {.magic = PSAGG_CTL_MAGIC,
                        .type = type,
                        .version = PSAGG_PROTO_VERSION,
                        .len = len + (seq >= 0 ? PSAGG_CTL_TAG_BYTES : 0)};
    memcpy(buf + *at, &h, sizeof h);
    if (len)
        memcpy(buf + *at + sizeof h, body, len);
    if (seq >= 0)
        psagg__ctl_tag(key, (uint64_t)seq, &h, body, len, buf + *at + sizeof h + len);
    *at += sizeof h + h.len;
}

/* fuzz_ctl: streams of frames as a server's control loop reads them */
static void seed_ctl(void)
{
    static uint8_t buf[4096];
    psagg__ctl_error e = {.status = PSAGG_ETIMEDOUT, .msg = "server 1: no push for tensor"};
    psagg__ctl_error bad = e;
    size_t at;
    for (int tagged = 0; tagged < 2; tagged++) {
        at = 2;
        buf[0] = (uint8_t)tagged, buf[1] = 6; /* (7-byte pieces) */
        ctl_frame(buf, &at, PSAGG_CTL_PING, NULL, 0, tagged ? 0 : -1);
        ctl_frame(buf, &at, PSAGG_CTL_ERROR, &e, sizeof e, tagged ? 1 : -1);
        if (tagged) /* a frame tagged with a number used before: dropped, the next read */
            ctl_frame(buf, &at, PSAGG_CTL_PING, NULL, 0, 1);
        ctl_frame(buf, &at, PSAGG_CTL_ABORT, &e, sizeof e, tagged ? 2 : -1);
        ctl_frame(buf, &at, PSAGG_CTL_PING, NULL, 0, tagged ? 3 : -1);
        put("ctl", tagged ? "tagged" : "plain", buf, at, NULL, 0);
    }
    /* the small bound (before authentication), whole frames at once; then a cut-off frame */
    at = 2;
    buf[0] = 2, buf[1] = 255;
    ctl_frame(buf, &at, PSAGG_CTL_PING, NULL, 0, -1);
    memset(bad.msg, 'x', sizeof bad.msg); /* (no NUL: the parse terminates it) */
    ctl_frame(buf, &at, PSAGG_CTL_ERROR, &bad, sizeof bad, -1);
    put("ctl", "small", buf, at - 100, NULL, 0);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) && errno != EEXIST) {
        fprintf(stderr, "make_seeds: cannot create %s: %s\n", root, strerror(errno));
        return 1;
    }
    seed_config();
    seed_declare();
    seed_topk();
    seed_thc();
    seed_msg();
    seed_codec();
    seed_ctl();
    printf("make_seeds: corpora written under %s\n", root);
    return 0;
}
