/*
 * fn_broadcast.c - the worker program of psagg_broadcast's functional tests (run_case.sh
 * --worker-bin fn_broadcast).
 *
 * Every worker declares the same tensors: "bcast" (fp32, PSAGG_TENSOR_RARE, --key-elems
 * elements: with the harness's 256 KiB chunks, more than one chunk), "small" (fp32, 5
 * elements: fewer than the 26 of the header, so even an empty broadcast takes rounds) and
 * "lossy" (maxmin4). Then:
 *   arguments  each bad argument refused by name, before anything is sent (PSAGG_EINVAL and
 *              psagg_last_error naming it): before psagg_declare; ctx NULL; key undeclared;
 *              key compressed; root -1 and world_size; buf NULL with len > 0; len over
 *              PSAGG_BROADCAST_MAX;
 *   bytes      random bytes of lengths 0, 1, 2, 3 (one element's worth), 4, 1000, a round of
 *              "bcast" exactly, one byte more, and several rounds; 0, 1, 3, 20 bytes
 *              through "small"; each from root case % world: every worker's buffer must hold
 *              root's bytes exactly and nothing past len (a guard), and root's buffer must be
 *              unchanged;
 *   mismatch   a worker that passes another len, or another root, fails every caller with
 *              PSAGG_EMISMATCH naming it, before any byte is written (the buffers keep their
 *              fill), and the key is still in step: a broadcast after it works.
 * Prints "DIGEST <hex>" of every byte received, which the harness compares across workers.
 * --quorum-root-ms MS: instead, root (worker 0) sleeps MS ms before one broadcast of 64 bytes
 * under [server] quorum. Through "bcast" (rare: its rounds wait for every member) it must
 * arrive exact, as above. With --quorum-plain through "small", whose round closes without
 * root: run with --expect EPROTO --expect-text, every worker must fail with that
 * ("EXPECTED-ERROR-OK"), but for root, which may learn it from the servers (the job failed
 * while it slept): PSAGG_EPEER with the same message in it.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "psagg.h"

#define GUARD 16

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* Root's bytes of broadcast number `c`: the same on every worker. */
static void fill_random(uint8_t *buf, size_t len, uint64_t c)
{
    uint64_t z = 0x9E3779B97F4A7C15ull * (c + 1);
    for (size_t i = 0; i < len; i++) {
        z += 0x9E3779B97F4A7C15ull;
        uint64_t x = z;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        buf[i] = (uint8_t)((x ^ (x >> 31)) >> 24);
    }
}

static int status_from_name(const char *s)
{
    if (!strcmp(s, "EPROTO"))
        return PSAGG_EPROTO;
    if (!strcmp(s, "EPEER"))
        return PSAGG_EPEER;
    if (!strcmp(s, "EMISMATCH"))
        return PSAGG_EMISMATCH;
    return 1;
}

/* A call that must fail with `want` and a message naming `text`. */
static int refused(const char *what, psagg_status st, psagg_status want, const char *text)
{
    const char *msg = psagg_last_error();
    if (st != want || !strstr(msg, text)) {
        fprintf(stderr, "FAIL %s: status %d (%s), message '%s'; expected %s naming '%s'\n", what,
                st, psagg_strerror(st), msg, psagg_strerror(want), text);
        return 1;
    }
    printf("refused %s: %s\n", what, msg);
    return 0;
}

static int check_args(psagg_ctx *ctx, uint32_t key, uint32_t lossy, int world)
{
    uint8_t b[4];
    int bad = 0;
    bad |= refused("NULL ctx", psagg_broadcast(NULL, key, b, 4, 0), PSAGG_EINVAL, "ctx");
    bad |= refused("undeclared key", psagg_broadcast(ctx, 1000, b, 4, 0), PSAGG_EINVAL, "key 1000");
    bad |= refused("compressed key", psagg_broadcast(ctx, lossy, b, 4, 0), PSAGG_EINVAL,
                   "must be a declared fp32 tensor");
    bad |= refused("root -1", psagg_broadcast(ctx, key, b, 4, -1), PSAGG_EINVAL, "root -1");
    bad |= refused("root world", psagg_broadcast(ctx, key, b, 4, world), PSAGG_EINVAL, "root");
    bad |= refused("NULL buf", psagg_broadcast(ctx, key, NULL, 4, 0), PSAGG_EINVAL, "buf is NULL");
    bad |=
        refused("len too large", psagg_broadcast(ctx, key, b, (size_t)PSAGG_BROADCAST_MAX + 1, 0),
                PSAGG_EINVAL, "len");
    return bad;
}

/*
 * Broadcast number c: `len` bytes from `root` through key. This worker passes my_len and
 * my_root (a mismatch when they differ from len and root) and expects `want`.
 */
static int one(psagg_ctx *ctx, uint32_t key, const char *name, uint64_t c, size_t len, int root,
               size_t my_len, int my_root, psagg_status want, const char *text, uint64_t *digest)
{
    int rank = psagg_rank(ctx), bad = 0;
    size_t cap = (len > my_len ? len : my_len) + GUARD;
    uint8_t *buf = malloc(cap), *expect = malloc(cap);
    psagg_status st;

    if (!buf || !expect) {
        fprintf(stderr, "FAIL: out of memory\n");
        free(buf), free(expect);
        return 1;
    }
    memset(expect, 0xA5, cap);
    if (rank == root)
        fill_random(expect, len, c);
    memcpy(buf, expect, cap);
    st = psagg_broadcast(ctx, key, buf, my_len, my_root);
    if (want) {
        bad = refused(text, st, want, text);
        if (!bad && memcmp(buf, expect, cap)) {
            fprintf(stderr, "FAIL broadcast %llu: refused, but the buffer was written\n",
                    (unsigned long long)c);
            bad = 1;
        }
        goto out;
    }
    if (st) {
        fprintf(stderr, "FAIL broadcast %llu (%s, %zu bytes from %d): %s: %s\n",
                (unsigned long long)c, name, len, root, psagg_strerror(st), psagg_last_error());
        bad = 1;
        goto out;
    }
    fill_random(expect, len, c);
    for (size_t i = 0; i < cap; i++)
        if (buf[i] != expect[i]) {
            fprintf(stderr,
                    "FAIL broadcast %llu (%s, %zu bytes from %d): byte %zu is 0x%02x, root's "
                    "0x%02x%s\n",
                    (unsigned long long)c, name, len, root, i, buf[i], expect[i],
                    i >= len ? " (past len: the guard)" : "");
            bad = 1;
            goto out;
        }
    *digest = fnv(*digest, buf, len);
    printf("broadcast %llu: %s, %zu bytes from root %d: exact\n", (unsigned long long)c, name, len,
           root);
out:
    free(buf), free(expect);
    return bad;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"key-elems", required_argument, NULL, 'k'},
                                         {"quorum-root-ms", required_argument, NULL, 'q'},
                                         {"quorum-plain", no_argument, NULL, 'p'},
                                         {"expect", required_argument, NULL, 'e'},
                                         {"expect-text", required_argument, NULL, 't'},
                                         {NULL, 0, NULL, 0}};
    uint64_t key_elems = 100003, digest = 0xCBF29CE484222325ull, c = 0;
    int quorum_ms = -1, quorum_plain = 0, expect = 0, bad = 0, o, world, rank;
    const char *expect_text = NULL;
    psagg_ctx *ctx = NULL;
    psagg_tensor_desc d[3];
    uint32_t keys[3];
    psagg_status st;
    uint8_t b[4] = {0};

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'k':
            key_elems = strtoull(optarg, NULL, 10);
            break;
        case 'q':
            quorum_ms = atoi(optarg);
            break;
        case 'p':
            quorum_plain = 1;
            break;
        case 'e':
            expect = status_from_name(optarg);
            break;
        case 't':
            expect_text = optarg;
            break;
        default:
            return 2;
        }
    }
    if ((st = psagg_init(NULL, -1, -1, &ctx))) {
        fprintf(stderr, "FAIL psagg_init: %s\n", psagg_last_error());
        return 1;
    }
    world = psagg_world_size(ctx);
    rank = psagg_rank(ctx);
    bad |= refused("before psagg_declare", psagg_broadcast(ctx, 0, b, 4, 0), PSAGG_EINVAL,
                   "psagg_declare first");
    d[0] = (psagg_tensor_desc){.struct_size = sizeof d[0],
                               .name = "bcast",
                               .count = key_elems,
                               .codec = {.id = PSAGG_CODEC_FP32},
                               .error_feedback = 0,
                               .flags = PSAGG_TENSOR_RARE};
    d[1] = d[0];
    d[1].name = "small";
    d[1].count = 5;
    d[1].flags = 0;
    d[2] = d[1];
    d[2].name = "lossy";
    d[2].count = 4096;
    if ((st = psagg_codec_parse("maxmin4", &d[2].codec)) || (st = psagg_declare(ctx, d, 3, keys))) {
        fprintf(stderr, "FAIL psagg_declare: %s\n", psagg_last_error());
        psagg_close(ctx);
        return 1;
    }
    bad |= check_args(ctx, keys[0], keys[2], world);

    if (quorum_ms >= 0 && !quorum_plain) { /* a rare key's round waits for the late root */
        if (rank == 0)
            usleep((useconds_t)quorum_ms * 1000);
        bad |= one(ctx, keys[0], "bcast", c, 64, 0, 64, 0, PSAGG_OK, NULL, &digest);
    } else if (quorum_ms >= 0) { /* another key's round closes without root: all fail */
        uint8_t buf[64];
        if (rank == 0)
            usleep((useconds_t)quorum_ms * 1000);
        fill_random(buf, sizeof buf, 0);
        st = psagg_broadcast(ctx, keys[1], buf, sizeof buf, 0);
        if (!expect || (st != expect && !(rank == 0 && st == PSAGG_EPEER)) ||
            (expect_text && !strstr(psagg_last_error(), expect_text))) {
            fprintf(stderr, "FAIL: the broadcast returned %s: %s; expected %d naming '%s'\n",
                    psagg_strerror(st), psagg_last_error(), expect, expect_text ? expect_text : "");
            bad = 1;
        } else {
            printf("failed as expected: %s\n", psagg_last_error());
        }
        psagg_close(ctx);
        if (!bad)
            printf("EXPECTED-ERROR-OK\n");
        return bad;
    } else {
        size_t round = 3 * (size_t)(key_elems - 26); /* the bytes after the header in round 1 */
        const size_t lens[] = {
            0, 1, 2, 3, 4, 1000, round, round + 1, 2 * round + 3 * key_elems + 5};
        const size_t small[] = {0, 1, 3, 20};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++, c++)
            bad |= one(ctx, keys[0], "bcast", c, lens[i], (int)(c % (uint64_t)world), lens[i],
                       (int)(c % (uint64_t)world), PSAGG_OK, NULL, &digest);
        for (size_t i = 0; i < sizeof small / sizeof small[0]; i++, c++)
            bad |= one(ctx, keys[1], "small", c, small[i], (int)(c % (uint64_t)world), small[i],
                       (int)(c % (uint64_t)world), PSAGG_OK, NULL, &digest);
    }
    if (world >= 3 && quorum_ms < 0) {
        /* the last worker passes one byte more; then another root; then two roots: every
           caller refuses, and the key stays in step for the next one */
        int last = world - 1;
        bad |= one(ctx, keys[0], "bcast", c++, 100, 0, rank == last ? 101 : 100, 0, PSAGG_EMISMATCH,
                   "disagree on len or root", &digest);
        bad |= one(ctx, keys[1], "small", c++, 100, 0, 100, rank == last ? 1 : 0, PSAGG_EMISMATCH,
                   "disagree on len or root", &digest);
        bad |= one(ctx, keys[0], "bcast", c++, 10, 0, 10, rank == 1 ? 1 : 0, PSAGG_EMISMATCH,
                   "disagree on root", &digest);
        bad |= one(ctx, keys[0], "bcast", c, 5000, 1, 5000, 1, PSAGG_OK, NULL, &digest);
        bad |= one(ctx, keys[1], "small", c + 1, 50, last, 50, last, PSAGG_OK, NULL, &digest);
    }
    if (!bad)
        printf("DIGEST %016llx\n", (unsigned long long)digest);
    fflush(stdout);
    if (psagg_close(ctx))
        bad = 1;
    return bad;
}
