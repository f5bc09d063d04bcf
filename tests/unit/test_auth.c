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

static void load_key(const char *secret, psagg_job_key *k)
{
    psagg_config cfg;
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
    CHECK(psagg_job_key_load(&cfg, k) == PSAGG_OK, "load: %s", psagg_last_error());
}

static void check_job_keys(void)
{
    psagg_job_key none, a, a2, b;
    static const uint8_t zero[32];
    psagg_config cfg;

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
    CHECK(psagg_job_key_load(&cfg, &b) == PSAGG_ECONFIG, "empty secret accepted");
    CHECK(strstr(psagg_last_error(), "is empty") && strstr(psagg_last_error(), cfg.secret_file),
          "message: %s", psagg_last_error());
    unlink(cfg.secret_file);
    CHECK(psagg_job_key_load(&cfg, &b) == PSAGG_ECONFIG, "missing secret accepted");
    CHECK(strstr(psagg_last_error(), "cannot be read"), "message: %s", psagg_last_error());
}

static void check_tokens(void)
{
    psagg_job_key k, other, none;
    uint8_t n1[PSAGG_NONCE_BYTES], n2[PSAGG_NONCE_BYTES];
    uint8_t t[PSAGG_TOKEN_BYTES], u[PSAGG_TOKEN_BYTES];
    static const uint8_t zero[PSAGG_TOKEN_BYTES];

    load_key("secret A\n", &k);
    load_key("secret B\n", &other);
    load_key(NULL, &none);
    psagg_nonce_make(n1);
    psagg_nonce_make(n2);
    CHECK(memcmp(n1, n2, sizeof n1), "two nonces are equal");

    {
        psagg_ctl_hello h = {.rank = 3, .world_size = 8}, h2;
        psagg_ctl_welcome w = {.server_rank = 1, .n_servers = 2}, w2;
        uint8_t c1[PSAGG_CHALLENGE_BYTES], c2[PSAGG_CHALLENGE_BYTES], wt[PSAGG_TOKEN_BYTES];
        snprintf(h.job_id, sizeof h.job_id, "job");
        memcpy(h.nonce, n1, sizeof h.nonce);
        h.epname_len = 16;
        psagg_challenge_make(c1);
        psagg_challenge_make(c2);
        CHECK(memcmp(c1, c2, sizeof c1), "two challenges are equal");
        psagg_hello_token(&k, &h, 1, c1, t);
        h2 = h;
        memset(h2.auth, 0xAB, sizeof h2.auth); /* the token field itself is not covered */
        psagg_hello_token(&k, &h2, 1, c1, u);
        CHECK(psagg_token_equal(t, u), "the same inputs give another token");
        psagg_hello_token(&other, &h, 1, c1, u);
        CHECK(!psagg_token_equal(t, u), "the key is not covered");
        psagg_hello_token(&k, &h, 0, c1, u);
        CHECK(!psagg_token_equal(t, u), "the server's rank is not covered (a relay to another)");
        psagg_hello_token(&k, &h, 1, c2, u);
        CHECK(!psagg_token_equal(t, u), "the challenge is not covered (a replay)");
        /* every field of the HELLO is covered: flip each byte in turn */
        for (size_t i = 0; i < sizeof h; i++) {
            if (i >= offsetof(psagg_ctl_hello, auth) &&
                i < offsetof(psagg_ctl_hello, auth) + sizeof h.auth)
                continue;
            h2 = h;
            ((uint8_t *)&h2)[i] ^= 1;
            psagg_hello_token(&k, &h2, 1, c1, u);
            CHECK(!psagg_token_equal(t, u), "byte %zu of the HELLO is not covered", i);
        }
        psagg_welcome_token(&k, &w, t, wt);
        for (size_t i = 0; i < sizeof w; i++) {
            if (i >= offsetof(psagg_ctl_welcome, auth))
                continue;
            w2 = w;
            ((uint8_t *)&w2)[i] ^= 1;
            psagg_welcome_token(&k, &w2, t, u);
            CHECK(!psagg_token_equal(wt, u), "byte %zu of the WELCOME is not covered", i);
        }
        {
            uint8_t t2[PSAGG_TOKEN_BYTES];
            memcpy(t2, t, sizeof t2);
            t2[5] ^= 1;
            psagg_welcome_token(&k, &w, t2, u);
            CHECK(!psagg_token_equal(wt, u), "the HELLO's token is not covered by the WELCOME's");
        }
        psagg_hello_token(&none, &h, 1, c1, u);
        CHECK(psagg_token_equal(u, zero), "without a secret the HELLO token is zero");
        psagg_welcome_token(&none, &w, t, u);
    }
    CHECK(psagg_token_equal(u, zero), "without a secret the token is zero");
}

static void check_mac(void)
{
    psagg_job_key k, other;
    psagg_data_key dk, dk2, dko;
    uint8_t n1[PSAGG_NONCE_BYTES], n2[PSAGG_NONCE_BYTES];
    uint8_t msg[sizeof(psagg_msg_hdr) + 100 + PSAGG_MSG_MAC_BYTES];
    const size_t len = sizeof(psagg_msg_hdr) + 100;
    uint8_t *tag = msg + len, saved[PSAGG_MSG_MAC_BYTES];
    psagg_msg_hdr *h = (psagg_msg_hdr *)(void *)msg;
    uint64_t seed = 42;

    load_key("secret A\n", &k);
    load_key("secret B\n", &other);
    psagg_nonce_make(n1);
    psagg_nonce_make(n2);
    psagg_data_key_make(&k, "job", n1, &dk);
    psagg_data_key_make(&k, "job", n2, &dk2);
    psagg_data_key_make(&other, "job", n1, &dko);
    CHECK(memcmp(dk.key, dk2.key, 32), "two sessions share a data key");
    CHECK(memcmp(dk.key, dko.key, 32), "two secrets share a data key");

    for (size_t i = 0; i < len; i++)
        msg[i] = (uint8_t)test_rand64(&seed);
    h->type = PSAGG_MSG_PUSH;
    psagg_msg_mac(&dk, msg, len, tag);
    CHECK(psagg_msg_mac_ok(&dk, msg, len, tag), "a message fails its own MAC");
    CHECK(!psagg_msg_mac_ok(&dk2, msg, len, tag), "another session's key accepts it");
    CHECK(!psagg_msg_mac_ok(&dko, msg, len, tag), "another secret's key accepts it");
    CHECK(!psagg_msg_mac_ok(&dk, msg, len - 1, tag), "a truncated message passes");

    /* every single-bit change of message or tag is caught */
    for (size_t i = 0; i < len + PSAGG_MSG_MAC_BYTES; i++)
        for (int b = 0; b < 8; b++) {
            msg[i] ^= (uint8_t)(1u << b);
            CHECK(!psagg_msg_mac_ok(&dk, msg, len, tag), "bit %d of byte %zu not covered", b, i);
            msg[i] ^= (uint8_t)(1u << b);
        }

    /* the same payload under another header (round) gets another tag: no replay across rounds */
    memcpy(saved, tag, sizeof saved);
    h->round++;
    psagg_msg_mac(&dk, msg, len, tag);
    CHECK(memcmp(saved, tag, sizeof saved), "two headers, one tag");
}

/*
 * Long messages take OpenSSL's Poly1305, short ones libsodium's: every length gives the tag of
 * the one definition (Poly1305 under BLAKE2b-256(data key, header)), so both ends agree
 * whichever each used; a flipped byte anywhere in a long message is caught.
 */
static void check_mac_lengths(void)
{
    static const size_t lens[] = {32, 33, 4095, 4096, 4097, 65536, 262144 + 17, 1u << 20};
    psagg_job_key k;
    psagg_data_key dk;
    uint8_t n[PSAGG_NONCE_BYTES], otk[crypto_onetimeauth_KEYBYTES];
    uint8_t tag[PSAGG_MSG_MAC_BYTES], want[PSAGG_MSG_MAC_BYTES];
    uint8_t *msg = malloc(1u << 20);
    CHECK(msg, "memory");
    load_key("secret A\n", &k);
    psagg_nonce_make(n);
    psagg_data_key_make(&k, "job", n, &dk);
    for (size_t i = 0; i < (1u << 20); i++)
        msg[i] = (uint8_t)(i * 131 + 7);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t len = lens[li];
        crypto_generichash(otk, sizeof otk, msg, sizeof(psagg_msg_hdr), dk.key, sizeof dk.key);
        crypto_onetimeauth(want, msg, len, otk);
        psagg_msg_mac(&dk, msg, len, tag);
        CHECK(!memcmp(tag, want, sizeof tag), "length %zu: not Poly1305's tag", len);
        CHECK(psagg_msg_mac_ok(&dk, msg, len, tag), "length %zu: fails its own MAC", len);
        msg[len - 1] ^= 0x40;
        CHECK(!psagg_msg_mac_ok(&dk, msg, len, tag), "length %zu: the last byte not covered", len);
        msg[len - 1] ^= 0x40;
        msg[len / 2] ^= 1;
        CHECK(!psagg_msg_mac_ok(&dk, msg, len, tag), "length %zu: the middle not covered", len);
        msg[len / 2] ^= 1;
    }
    free(msg);
}

int main(void)
{
    CHECK(mkdtemp(dir), "mkdtemp");
    check_job_keys();
    check_tokens();
    check_mac();
    check_mac_lengths();
    {
        char path[64];
        snprintf(path, sizeof path, "%s/secret", dir);
        unlink(path);
        rmdir(dir);
    }
    fprintf(stderr, "test_auth: all passed\n");
    return 0;
}
