/*
 * test_auth.c - runtime/auth.c: the job key from secret_file, HELLO tokens, data keys and the
 * per-message MAC of data_auth. Every input a token or tag covers must change it, and a
 * single flipped bit anywhere in a message or its tag must fail the check.
 */
#include "../testutil.h"
#include "runtime/auth.h"
#include "runtime/message.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

static char dir[] = "/tmp/psagg-test-auth-XXXXXX";

static void load_key(const char *secret, psagg__job_key *k)
{
    psagg__config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.path, sizeof cfg.path, "job.ini");
    if (secret) {
        FILE *f;
        snprintf(cfg.secret_file, sizeof cfg.secret_file, "%s/secret", dir);
        f = fopen(cfg.secret_file, "w");
        CHECK(f, "create %s", cfg.secret_file);
        fputs(secret, f);
        fclose(f);
    }
    CHECK(psagg__job_key_load(&cfg, k) == PSAGG_OK, "load: %s", psagg_last_error());
}

static void check_job_keys(void)
{
    psagg__job_key none, a, a2, b;
    static const uint8_t zero[32];
    psagg__config cfg;

    load_key(NULL, &none);
    CHECK(!none.secret && !memcmp(none.key, zero, 32), "no secret: no key");
    load_key("secret A\n", &a);
    load_key("secret A\n", &a2);
    load_key("secret B\n", &b);
    CHECK(a.secret && memcmp(a.key, zero, 32), "a secret gives a key");
    CHECK(!memcmp(a.key, a2.key, 32), "the same secret gives the same key");
    CHECK(memcmp(a.key, b.key, 32), "another secret gives another key");

    /* an empty or missing file is an error naming the file (the config checks it too) */
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.path, sizeof cfg.path, "job.ini");
    snprintf(cfg.secret_file, sizeof cfg.secret_file, "%s/secret", dir);
    fclose(fopen(cfg.secret_file, "w"));
    CHECK(psagg__job_key_load(&cfg, &b) == PSAGG_ECONFIG, "empty secret accepted");
    CHECK(strstr(psagg_last_error(), "is empty") && strstr(psagg_last_error(), cfg.secret_file),
          "message: %s", psagg_last_error());
    unlink(cfg.secret_file);
    CHECK(psagg__job_key_load(&cfg, &b) == PSAGG_ECONFIG, "missing secret accepted");
    CHECK(strstr(psagg_last_error(), "cannot be read"), "message: %s", psagg_last_error());
}

static void check_tokens(void)
{
    psagg__job_key k, other, none;
    uint8_t n1[PSAGG_NONCE_BYTES], n2[PSAGG_NONCE_BYTES];
    uint8_t t[PSAGG_TOKEN_BYTES], u[PSAGG_TOKEN_BYTES];
    static const uint8_t zero[PSAGG_TOKEN_BYTES];

    load_key("secret A\n", &k);
    load_key("secret B\n", &other);
    load_key(NULL, &none);
    psagg__nonce_make(n1);
    psagg__nonce_make(n2);
    CHECK(memcmp(n1, n2, sizeof n1), "two nonces are equal");

    {
        psagg__ctl_hello h = {.rank = 3, .world_size = 8}, h2;
        psagg__ctl_welcome w = {.server_rank = 1, .n_servers = 2}, w2;
        uint8_t c1[PSAGG_CHALLENGE_BYTES], c2[PSAGG_CHALLENGE_BYTES], wt[PSAGG_TOKEN_BYTES];
        snprintf(h.job_id, sizeof h.job_id, "job");
        memcpy(h.nonce, n1, sizeof h.nonce);
        h.epname_len = 16;
        psagg__challenge_make(c1);
        psagg__challenge_make(c2);
        CHECK(memcmp(c1, c2, sizeof c1), "two challenges are equal");
        psagg__hello_token(&k, &h, 1, c1, t);
        h2 = h;
        memset(h2.auth, 0xAB, sizeof h2.auth); /* the token field itself is not covered */
        psagg__hello_token(&k, &h2, 1, c1, u);
        CHECK(psagg__token_equal(t, u), "the same inputs give another token");
        psagg__hello_token(&other, &h, 1, c1, u);
        CHECK(!psagg__token_equal(t, u), "the key is not covered");
        psagg__hello_token(&k, &h, 0, c1, u);
        CHECK(!psagg__token_equal(t, u), "the server's rank is not covered (a relay to another)");
        psagg__hello_token(&k, &h, 1, c2, u);
        CHECK(!psagg__token_equal(t, u), "the challenge is not covered (a replay)");
        /* every field of the HELLO is covered: flip each byte in turn */
        for (size_t i = 0; i < sizeof h; i++) {
            if (i >= offsetof(psagg__ctl_hello, auth) &&
                i < offsetof(psagg__ctl_hello, auth) + sizeof h.auth)
                continue;
            h2 = h;
            ((uint8_t *)&h2)[i] ^= 1;
            psagg__hello_token(&k, &h2, 1, c1, u);
            CHECK(!psagg__token_equal(t, u), "byte %zu of the HELLO is not covered", i);
        }
        psagg__welcome_token(&k, &w, t, wt);
        for (size_t i = 0; i < sizeof w; i++) {
            if (i >= offsetof(psagg__ctl_welcome, auth))
                continue;
            w2 = w;
            ((uint8_t *)&w2)[i] ^= 1;
            psagg__welcome_token(&k, &w2, t, u);
            CHECK(!psagg__token_equal(wt, u), "byte %zu of the WELCOME is not covered", i);
        }
        {
            uint8_t t2[PSAGG_TOKEN_BYTES];
            memcpy(t2, t, sizeof t2);
            t2[5] ^= 1;
            psagg__welcome_token(&k, &w, t2, u);
            CHECK(!psagg__token_equal(wt, u), "the HELLO's token is not covered by the WELCOME's");
        }
        psagg__hello_token(&none, &h, 1, c1, u);
        CHECK(psagg__token_equal(u, zero), "without a secret the HELLO token is zero");
        psagg__welcome_token(&none, &w, t, u);
    }
    CHECK(psagg__token_equal(u, zero), "without a secret the token is zero");
}

/* The one-time key of message number seq under k, as runtime/auth.h defines it. */
static void otk_of(const psagg__data_key *k, uint64_t seq, uint8_t otk[crypto_onetimeauth_KEYBYTES])
{
    crypto_generichash_state st;
    uint8_t n[8];
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)(seq >> (8 * i));
    crypto_generichash_init(&st, k->key, sizeof k->key, crypto_onetimeauth_KEYBYTES);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-otk-v2", 12);
    crypto_generichash_update(&st, n, sizeof n);
    crypto_generichash_final(&st, otk, crypto_onetimeauth_KEYBYTES);
}

/*
 * The keys: a push key binds the worker's session, the server's session and the server's
 * rank (a push sealed for server A fails at server B), an update key the server's; the
 * trailer catches every single-bit change, and no two messages share a one-time key even
 * when their headers are equal (before protocol 13 the one-time key was the header's, and a
 * PULL's WEIGHTS and a sync_interval's WEIGHTS of one round shared it).
 */
static void check_seal(void)
{
    psagg__job_key k, other;
    psagg__data_key a, b, a2, ao, up;
    uint8_t wn[PSAGG_NONCE_BYTES], sn[PSAGG_NONCE_BYTES], sn2[PSAGG_NONCE_BYTES];
    uint8_t msg[sizeof(psagg__msg_hdr) + 100 + PSAGG_MSG_MAC_BYTES], twin[sizeof msg];
    uint8_t otk1[crypto_onetimeauth_KEYBYTES], otk2[crypto_onetimeauth_KEYBYTES];
    uint8_t want[PSAGG_MSG_TAG_BYTES];
    const size_t len = sizeof(psagg__msg_hdr) + 100;
    psagg__msg_hdr *h = (psagg__msg_hdr *)(void *)msg;
    uint64_t seed = 42, seq = 0;

    load_key("secret A\n", &k);
    load_key("secret B\n", &other);
    psagg__nonce_make(wn);
    psagg__nonce_make(sn);
    psagg__nonce_make(sn2);
    psagg__push_key_make(&k, "job", wn, sn, 0, &a);
    psagg__push_key_make(&k, "job", wn, sn2, 1, &b);
    psagg__push_key_make(&k, "job", wn, sn, 1, &a2);
    psagg__push_key_make(&other, "job", wn, sn, 0, &ao);
    psagg__update_key_make(&k, "job", sn, 0, &up);
    CHECK(memcmp(a.key, b.key, 32) && memcmp(a.key, a2.key, 32),
          "two servers (or ranks) share a push key");
    CHECK(memcmp(a.key, ao.key, 32), "two secrets share a push key");
    CHECK(memcmp(a.key, up.key, 32), "a push key is the server's update key");

    for (size_t i = 0; i < len; i++)
        msg[i] = (uint8_t)test_rand64(&seed);
    h->type = PSAGG_MSG_PUSH;
    psagg__msg_seal(&a, 7, msg, len);
    CHECK(psagg__msg_open(&a, msg, len, &seq) && seq == 7, "a message fails its own seal");
    CHECK(!psagg__msg_open(&b, msg, len, &seq), "a push sealed for server 0 opens at server 1");
    CHECK(!psagg__msg_open(&ao, msg, len, &seq), "another secret's key accepts it");
    CHECK(!psagg__msg_open(&a, msg, len - 1, &seq), "a truncated message passes");
    /* the definition: Poly1305 of header, payload and number under otk(number) */
    otk_of(&a, 7, otk1);
    crypto_onetimeauth(want, msg, len + PSAGG_MSG_SEQ_BYTES, otk1);
    CHECK(!memcmp(want, msg + len + PSAGG_MSG_SEQ_BYTES, sizeof want), "not the specified tag");

    /* every single-bit change of message, number or tag is caught */
    for (size_t i = 0; i < len + PSAGG_MSG_MAC_BYTES; i++)
        for (int bit = 0; bit < 8; bit++) {
            msg[i] ^= (uint8_t)(1u << bit);
            CHECK(!psagg__msg_open(&a, msg, len, &seq), "bit %d of byte %zu not covered", bit, i);
            msg[i] ^= (uint8_t)(1u << bit);
        }

    /* equal headers, two payloads: two numbers, so two one-time keys, whatever the header */
    memcpy(twin, msg, sizeof twin);
    twin[len - 1] ^= 0x5a;
    psagg__msg_seal(&a, 8, twin, len);
    otk_of(&a, 8, otk2);
    CHECK(memcmp(otk1, otk2, sizeof otk1), "two messages of one header share a one-time key");
    CHECK(psagg__msg_open(&a, twin, len, &seq) && seq == 8, "the second message fails");
    memcpy(twin + len, msg + len, PSAGG_MSG_MAC_BYTES); /* the first one's trailer on it */
    CHECK(!psagg__msg_open(&a, twin, len, &seq), "a trailer moved to another message passes");
}

/*
 * Long messages take OpenSSL's Poly1305, short ones libsodium's: every length gives the tag of
 * the one definition, so both ends agree whichever each used; a flipped byte anywhere in a
 * long message is caught.
 */
static void check_seal_lengths(void)
{
    static const size_t lens[] = {32, 33, 4095, 4096, 4097, 65536, 262144 + 17, 1u << 20};
    psagg__job_key k;
    psagg__data_key dk;
    uint8_t n[PSAGG_NONCE_BYTES], otk[crypto_onetimeauth_KEYBYTES];
    uint8_t want[PSAGG_MSG_TAG_BYTES];
    uint8_t *msg = malloc((1u << 20) + PSAGG_MSG_MAC_BYTES);
    uint64_t seq;
    CHECK(msg, "memory");
    load_key("secret A\n", &k);
    psagg__nonce_make(n);
    psagg__update_key_make(&k, "job", n, 3, &dk);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t len = lens[li];
        for (size_t i = 0; i < len; i++)
            msg[i] = (uint8_t)(i * 131 + 7);
        psagg__msg_seal(&dk, li + 1, msg, len);
        otk_of(&dk, li + 1, otk);
        crypto_onetimeauth(want, msg, len + PSAGG_MSG_SEQ_BYTES, otk);
        CHECK(!memcmp(msg + len + PSAGG_MSG_SEQ_BYTES, want, sizeof want),
              "length %zu: not Poly1305's tag", len);
        CHECK(psagg__msg_open(&dk, msg, len, &seq), "length %zu: fails its own seal", len);
        msg[len - 1] ^= 0x40;
        CHECK(!psagg__msg_open(&dk, msg, len, &seq), "length %zu: the last byte not covered", len);
        msg[len - 1] ^= 0x40;
        msg[len / 2] ^= 1;
        CHECK(!psagg__msg_open(&dk, msg, len, &seq), "length %zu: the middle not covered", len);
        msg[len / 2] ^= 1;
    }
    free(msg);
}

/* The receiver's numbers: each once, out of order within the window, never 0 or older. */
static void check_replay(void)
{
    static psagg__replay r;
    CHECK(!psagg__replay_accept(&r, 0), "number 0 accepted");
    for (uint64_t n = 1; n <= 100; n++)
        CHECK(psagg__replay_accept(&r, n), "number %llu refused", (unsigned long long)n);
    for (uint64_t n = 1; n <= 100; n++)
        CHECK(!psagg__replay_accept(&r, n), "number %llu accepted twice", (unsigned long long)n);
    CHECK(psagg__replay_accept(&r, 105) && psagg__replay_accept(&r, 102) &&
              psagg__replay_accept(&r, 101) && !psagg__replay_accept(&r, 102),
          "out of order within the window");
    CHECK(psagg__replay_accept(&r, 105 + PSAGG_REPLAY_WINDOW - 1), "a jump within the window");
    CHECK(!psagg__replay_accept(&r, 105), "a number seen before a jump accepted again");
    CHECK(psagg__replay_accept(&r, 106), "a number not seen, in the window");
    CHECK(!psagg__replay_accept(&r, 104), "a number not seen, just below the window");
    CHECK(psagg__replay_accept(&r, 1000000), "a far jump");
    CHECK(!psagg__replay_accept(&r, 1000000 - PSAGG_REPLAY_WINDOW),
          "a number older than the window accepted");
    CHECK(psagg__replay_accept(&r, 1000000 - PSAGG_REPLAY_WINDOW + 1) &&
              !psagg__replay_accept(&r, 1000000),
          "the window after a far jump");
}

/*
 * Control frames: the worker's end sends with the key the server's end receives with and the
 * other way round; another connection (another HELLO token) has other keys; a tag binds the
 * frame's number, header and body; no secret, no tags.
 */
static void check_control(void)
{
    psagg__job_key k, none = {0};
    psagg__ctl_auth w, s, other, off;
    uint8_t tok[PSAGG_TOKEN_BYTES] = {1}, tok2[PSAGG_TOKEN_BYTES] = {2};
    uint8_t wn[PSAGG_NONCE_BYTES] = {3}, sn[PSAGG_NONCE_BYTES] = {4};
    uint8_t body[40] = "a MEMBERSHIP frame, say", tag[PSAGG_CTL_TAG_BYTES];
    psagg__ctl_hdr h = {PSAGG_CTL_MAGIC, PSAGG_CTL_MEMBERSHIP, PSAGG_PROTO_VERSION,
                        (uint32_t)sizeof body + PSAGG_CTL_TAG_BYTES};

    load_key("secret A\n", &k);
    psagg__ctl_auth_make(&k, tok, wn, sn, 1, 0, &w);
    psagg__ctl_auth_make(&k, tok, wn, sn, 1, 1, &s);
    psagg__ctl_auth_make(&k, tok2, wn, sn, 1, 0, &other);
    psagg__ctl_auth_make(&none, tok, wn, sn, 1, 0, &off);
    CHECK(w.on && s.on && !off.on, "on with a secret only");
    CHECK(!memcmp(w.tx_key, s.rx_key, 32) && !memcmp(w.rx_key, s.tx_key, 32),
          "the two ends' keys do not pair up");
    CHECK(memcmp(w.tx_key, w.rx_key, 32), "both directions share a key");
    CHECK(memcmp(w.tx_key, other.tx_key, 32), "two connections share a key");
    psagg__ctl_tag(w.tx_key, 5, &h, body, sizeof body, tag);
    CHECK(psagg__ctl_tag_ok(s.rx_key, 5, &h, body, sizeof body, tag), "a frame fails its own tag");
    CHECK(!psagg__ctl_tag_ok(s.rx_key, 4, &h, body, sizeof body, tag) &&
              !psagg__ctl_tag_ok(s.rx_key, 6, &h, body, sizeof body, tag),
          "a frame checks out under another number (a replay, or reordered)");
    CHECK(!psagg__ctl_tag_ok(s.tx_key, 5, &h, body, sizeof body, tag),
          "a frame checks out in the other direction (reflected)");
    h.type = PSAGG_CTL_ABORT;
    CHECK(!psagg__ctl_tag_ok(s.rx_key, 5, &h, body, sizeof body, tag), "the type not covered");
    h.type = PSAGG_CTL_MEMBERSHIP;
    body[3] ^= 1;
    CHECK(!psagg__ctl_tag_ok(s.rx_key, 5, &h, body, sizeof body, tag), "the body not covered");
}

int main(void)
{
    CHECK(mkdtemp(dir), "mkdtemp");
    check_job_keys();
    check_tokens();
    check_seal();
    check_seal_lengths();
    check_replay();
    check_control();
    {
        char path[64];
        snprintf(path, sizeof path, "%s/secret", dir);
        unlink(path);
        rmdir(dir);
    }
    fprintf(stderr, "test_auth: all passed\n");
    return 0;
}
