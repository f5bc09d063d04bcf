/* runtime/auth.c - see runtime/auth.h. */
#include "runtime/auth.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <sodium.h>

#include "runtime/wire.h"

/* libsodium's own one-time initialisation (thread-safe, idempotent). */
static int sodium_ready(void)
{
    return sodium_init() >= 0;
}

psagg_status psagg__job_key_load(const psagg__config *cfg, psagg__job_key *out)
{
    crypto_generichash_state st;
    uint8_t buf[4096];
    size_t n, total = 0;
    FILE *f;

    memset(out, 0, sizeof *out);
    if (!cfg->secret_file[0])
        return PSAGG_OK;
    if (!sodium_ready())
        return psagg__fail(PSAGG_EIO, "libsodium failed to initialise");
    f = fopen(cfg->secret_file, "rb");
    if (!f)
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' cannot be read: %s",
                           cfg->path, cfg->secret_file, strerror(errno));
    crypto_generichash_init(&st, NULL, 0, sizeof out->key);
    while (total <= PSAGG_SECRET_MAX && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        crypto_generichash_update(&st, buf, n);
        total += n;
    }
    fclose(f);
    sodium_memzero(buf, sizeof buf);
    if (total > PSAGG_SECRET_MAX) /* config checked it; the file changed since */
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' has more than %d bytes",
                           cfg->path, cfg->secret_file, PSAGG_SECRET_MAX);
    if (total == 0)
        return psagg__fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' is empty", cfg->path,
                           cfg->secret_file);
    crypto_generichash_final(&st, out->key, sizeof out->key);
    out->secret = 1;
    return PSAGG_OK;
}

void psagg__nonce_make(uint8_t nonce[PSAGG_NONCE_BYTES])
{
    (void)sodium_ready(); /* randombytes_buf works either way (its own lazy set-up) */
    randombytes_buf(nonce, PSAGG_NONCE_BYTES);
}

static void le32(uint8_t out[4], uint32_t v)
{
    out[0] = (uint8_t)v, out[1] = (uint8_t)(v >> 8), out[2] = (uint8_t)(v >> 16),
    out[3] = (uint8_t)(v >> 24);
}

void psagg__challenge_make(uint8_t challenge[PSAGG_CHALLENGE_BYTES])
{
    randombytes_buf(challenge, PSAGG_CHALLENGE_BYTES);
}

void psagg__hello_token(const psagg__job_key *k, const psagg__ctl_hello *h, uint32_t server_rank,
                        const uint8_t challenge[PSAGG_CHALLENGE_BYTES],
                        uint8_t out[PSAGG_TOKEN_BYTES])
{
    crypto_generichash_state st;
    psagg__ctl_hello body = *h;
    uint8_t r[4];

    memset(out, 0, PSAGG_TOKEN_BYTES);
    if (!k->secret)
        return;
    memset(body.auth, 0, sizeof body.auth);
    le32(r, server_rank);
    crypto_generichash_init(&st, k->key, sizeof k->key, PSAGG_TOKEN_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-hello-v3", 14);
    crypto_generichash_update(&st, r, sizeof r);
    crypto_generichash_update(&st, challenge, PSAGG_CHALLENGE_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)&body, sizeof body); /* no padding: wire.h */
    crypto_generichash_final(&st, out, PSAGG_TOKEN_BYTES);
}

void psagg__welcome_token(const psagg__job_key *k, const psagg__ctl_welcome *w,
                          const uint8_t hello_auth[PSAGG_TOKEN_BYTES],
                          uint8_t out[PSAGG_TOKEN_BYTES])
{
    crypto_generichash_state st;
    psagg__ctl_welcome body = *w;

    memset(out, 0, PSAGG_TOKEN_BYTES);
    if (!k->secret)
        return;
    memset(body.auth, 0, sizeof body.auth);
    crypto_generichash_init(&st, k->key, sizeof k->key, PSAGG_TOKEN_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-welcome-v1", 16);
    crypto_generichash_update(&st, hello_auth, PSAGG_TOKEN_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)&body, sizeof body);
    crypto_generichash_final(&st, out, PSAGG_TOKEN_BYTES);
}

int psagg__token_equal(const uint8_t a[PSAGG_TOKEN_BYTES], const uint8_t b[PSAGG_TOKEN_BYTES])
{
    return sodium_memcmp(a, b, PSAGG_TOKEN_BYTES) == 0;
}

static void le64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

void psagg__push_key_make(const psagg__job_key *k, const char *job_id,
                          const uint8_t worker_nonce[PSAGG_NONCE_BYTES],
                          const uint8_t server_nonce[PSAGG_NONCE_BYTES], uint32_t server_rank,
                          psagg__data_key *out)
{
    crypto_generichash_state st;
    uint8_t r[4];
    le32(r, server_rank);
    crypto_generichash_init(&st, k->key, sizeof k->key, sizeof out->key);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-push-v2", 13);
    crypto_generichash_update(&st, (const uint8_t *)job_id, strnlen(job_id, PSAGG_JOB_ID_MAX));
    crypto_generichash_update(&st, worker_nonce, PSAGG_NONCE_BYTES);
    crypto_generichash_update(&st, server_nonce, PSAGG_NONCE_BYTES);
    crypto_generichash_update(&st, r, sizeof r);
    crypto_generichash_final(&st, out->key, sizeof out->key);
}

void psagg__update_key_make(const psagg__job_key *k, const char *job_id,
                            const uint8_t server_nonce[PSAGG_NONCE_BYTES], uint32_t server_rank,
                            psagg__data_key *out)
{
    crypto_generichash_state st;
    uint8_t r[4];
    le32(r, server_rank);
    crypto_generichash_init(&st, k->key, sizeof k->key, sizeof out->key);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-update-v2", 15);
    crypto_generichash_update(&st, (const uint8_t *)job_id, strnlen(job_id, PSAGG_JOB_ID_MAX));
    crypto_generichash_update(&st, server_nonce, PSAGG_NONCE_BYTES);
    crypto_generichash_update(&st, r, sizeof r);
    crypto_generichash_final(&st, out->key, sizeof out->key);
}

/* The one-time Poly1305 key of message number seq under k: BLAKE2b-256(k, ("psagg-otk-v2",
   seq)), so a key never repeats while numbers do not. */
static void onetime_key(const psagg__data_key *k, uint64_t seq,
                        uint8_t otk[crypto_onetimeauth_KEYBYTES])
{
    crypto_generichash_state st;
    uint8_t n[8];
    le64(n, seq);
    crypto_generichash_init(&st, k->key, sizeof k->key, crypto_onetimeauth_KEYBYTES);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-otk-v2", 12);
    crypto_generichash_update(&st, n, sizeof n);
    crypto_generichash_final(&st, otk, crypto_onetimeauth_KEYBYTES);
}

/*
 * Poly1305 of a message under its one-time key: libsodium's for short messages (no set-up
 * cost), OpenSSL's above POLY_OPENSSL_MIN bytes (its AVX2/AVX-512 code runs about 3x faster
 * on long buffers, close to the memory's bandwidth; the same algorithm, so the same tags).
 * OpenSSL's context is kept per thread.
 */
#define POLY_OPENSSL_MIN 4096

static pthread_key_t poly_key;
static pthread_once_t poly_once = PTHREAD_ONCE_INIT;
static EVP_MAC *poly_mac;

static void poly_ctx_free(void *ctx)
{
    EVP_MAC_CTX_free(ctx);
}

static void poly_init(void)
{
    poly_mac = EVP_MAC_fetch(NULL, "POLY1305", NULL);
    if (pthread_key_create(&poly_key, poly_ctx_free)) {
        EVP_MAC_free(poly_mac);
        poly_mac = NULL;
    }
}

static void poly1305(uint8_t tag[PSAGG_MSG_TAG_BYTES], const void *msg, size_t len,
                     const uint8_t otk[crypto_onetimeauth_KEYBYTES])
{
    EVP_MAC_CTX *c = NULL;
    size_t out = 0;
    if (len >= POLY_OPENSSL_MIN) {
        pthread_once(&poly_once, poly_init);
        if (poly_mac && !(c = pthread_getspecific(poly_key)) && (c = EVP_MAC_CTX_new(poly_mac)) &&
            pthread_setspecific(poly_key, c)) {
            EVP_MAC_CTX_free(c);
            c = NULL;
        }
    }
    if (c && EVP_MAC_init(c, otk, crypto_onetimeauth_KEYBYTES, NULL) &&
        EVP_MAC_update(c, msg, len) && EVP_MAC_final(c, tag, &out, PSAGG_MSG_TAG_BYTES) &&
        out == PSAGG_MSG_TAG_BYTES)
        return;
    crypto_onetimeauth(tag, msg, len, otk); /* short, or OpenSSL could not: the same tag */
}

void psagg__msg_seal(const psagg__data_key *k, uint64_t seq, uint8_t *msg, size_t len)
{
    uint8_t otk[crypto_onetimeauth_KEYBYTES];
    le64(msg + len, seq);
    onetime_key(k, seq, otk);
    poly1305(msg + len + PSAGG_MSG_SEQ_BYTES, msg, len + PSAGG_MSG_SEQ_BYTES, otk);
    sodium_memzero(otk, sizeof otk);
}

int psagg__msg_open(const psagg__data_key *k, const uint8_t *msg, size_t len, uint64_t *seq)
{
    uint8_t otk[crypto_onetimeauth_KEYBYTES], want[PSAGG_MSG_TAG_BYTES];
    uint64_t n = 0;
    int ok;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | msg[len + (size_t)i];
    onetime_key(k, n, otk);
    poly1305(want, msg, len + PSAGG_MSG_SEQ_BYTES, otk);
    ok = sodium_memcmp(want, msg + len + PSAGG_MSG_SEQ_BYTES, PSAGG_MSG_TAG_BYTES) == 0;
    sodium_memzero(otk, sizeof otk);
    *seq = n;
    return ok;
}

int psagg__replay_accept(psagg__replay *r, uint64_t seq)
{
    uint64_t *word, bit;
    if (seq == 0 || (r->top >= PSAGG_REPLAY_WINDOW && seq <= r->top - PSAGG_REPLAY_WINDOW))
        return 0;       /* never sent, or older than the window: cannot be told from a replay */
    if (seq > r->top) { /* forget the numbers that fall out of the window */
        uint64_t from =
            seq - r->top >= PSAGG_REPLAY_WINDOW ? seq - PSAGG_REPLAY_WINDOW + 1 : r->top + 1;
        for (uint64_t n = from; n <= seq && n - from < PSAGG_REPLAY_WINDOW; n++)
            r->seen[n % PSAGG_REPLAY_WINDOW / 64] &= ~(1ull << (n % 64));
        r->top = seq;
    }
    word = &r->seen[seq % PSAGG_REPLAY_WINDOW / 64];
    bit = 1ull << (seq % 64);
    if (*word & bit)
        return 0;
    *word |= bit;
    return 1;
}

void psagg__ctl_auth_make(const psagg__job_key *k, const uint8_t hello_auth[PSAGG_TOKEN_BYTES],
                          const uint8_t worker_nonce[PSAGG_NONCE_BYTES],
                          const uint8_t server_nonce[PSAGG_NONCE_BYTES], uint32_t server_rank,
                          int server, psagg__ctl_auth *out)
{
    memset(out, 0, sizeof *out);
    if (!k->secret)
        return;
    for (int dir = 0; dir < 2; dir++) { /* 0: worker to server, 1: server to worker */
        crypto_generichash_state st;
        uint8_t r[4], d = (uint8_t)dir;
        le32(r, server_rank);
        crypto_generichash_init(&st, k->key, sizeof k->key, 32);
        crypto_generichash_update(&st, (const uint8_t *)"psagg-control-v1", 16);
        crypto_generichash_update(&st, hello_auth, PSAGG_TOKEN_BYTES);
        crypto_generichash_update(&st, worker_nonce, PSAGG_NONCE_BYTES);
        crypto_generichash_update(&st, server_nonce, PSAGG_NONCE_BYTES);
        crypto_generichash_update(&st, r, sizeof r);
        crypto_generichash_update(&st, &d, 1);
        crypto_generichash_final(&st, dir == !!server ? out->tx_key : out->rx_key, 32);
    }
    out->on = 1;
}

void psagg__ctl_tag(const uint8_t key[32], uint64_t seq, const psagg__ctl_hdr *h, const void *body,
                    uint32_t body_len, uint8_t tag[PSAGG_CTL_TAG_BYTES])
{
    crypto_generichash_state st;
    uint8_t n[8];
    le64(n, seq);
    crypto_generichash_init(&st, key, 32, PSAGG_CTL_TAG_BYTES);
    crypto_generichash_update(&st, n, sizeof n);
    crypto_generichash_update(&st, (const uint8_t *)h, sizeof *h);
    if (body_len)
        crypto_generichash_update(&st, body, body_len);
    crypto_generichash_final(&st, tag, PSAGG_CTL_TAG_BYTES);
}

int psagg__ctl_tag_ok(const uint8_t key[32], uint64_t seq, const psagg__ctl_hdr *h,
                      const void *body, uint32_t body_len, const uint8_t tag[PSAGG_CTL_TAG_BYTES])
{
    uint8_t want[PSAGG_CTL_TAG_BYTES];
    psagg__ctl_tag(key, seq, h, body, body_len, want);
    return sodium_memcmp(want, tag, PSAGG_CTL_TAG_BYTES) == 0;
}
