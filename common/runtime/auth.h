/*
 * runtime/auth.h - the job's secret and what derives from it (libsodium):
 *
 *   job key     BLAKE2b-256 of the contents of [cluster] secret_file, read once at start-up.
 *   HELLO token BLAKE2b-256 keyed with the job key over ("psagg-hello-v3", the rank of the
 *               server it is for, that connection's CHALLENGE, and the whole HELLO with its
 *               token zeroed: job id, rank, flags, session nonce, provider, fabric name,
 *               same-host offer): the server learns nothing of the job, and says nothing
 *               about it, before a HELLO's token checks out; a HELLO recorded on one
 *               connection fails on any other (a restarted server, another server, a relay).
 *               All zero without a secret (then only the job id is compared, and anyone who
 *               can reach the servers can join).
 *   WELCOME     BLAKE2b-256 keyed with the job key over ("psagg-welcome-v1", the HELLO's
 *   token       token, the whole WELCOME with its token zeroed): the worker knows the server
 *               has the secret, and that its fabric name and nonce are its own.
 *   session     every process draws a random 16-byte nonce when it starts; a worker sends its
 *   nonce       own in the HELLO (under the token), a server its own in the WELCOME.
 *   push key    of worker w's pushes to server s: BLAKE2b-256 keyed with the job key over
 *               ("psagg-push-v2", job_id, w's session nonce, s's session nonce, s's rank): it
 *               binds the receiving server, so a push captured on its way to server A fails
 *               at server B, and both sessions, so nothing of another run (or of a worker
 *               before it rejoined) checks out.
 *   update key  of server s's updates (one set of bytes to every worker): BLAKE2b-256 keyed
 *               with the job key over ("psagg-update-v2", job_id, s's nonce, s's rank).
 *   message     with data_auth every data message ends with its number (8 bytes, little
 *   trailer     endian: 1, 2, ... per key, never reused while the sending session lives) and
 *               a 16-byte Poly1305 tag over header, payload and number, keyed with the
 *               one-time key BLAKE2b-256(the message's key, ("psagg-otk-v2", number)): no two
 *               messages ever share a one-time key, whatever their headers (a PULL's WEIGHTS
 *               and a GRAD's sync_interval WEIGHTS of one round have equal headers). The
 *               receiver keeps the numbers it accepted under each key (psagg__replay: the
 *               highest and a window below it) and drops a number seen before or older than
 *               the window: a replay is refused by name and costs nothing else.
 *   control     after the WELCOME, with a secret, every control frame in either direction ends
 *   frames      with a 16-byte tag: BLAKE2b-128 keyed with that direction's session key over
 *               (the frame's number on the connection, counted from 0 by both ends; its
 *               header; its body). The session keys: BLAKE2b-256 keyed with the job key over
 *               ("psagg-control-v1", the HELLO's token, the worker's nonce, the server's
 *               nonce, the server's rank, the direction). The HELLO's token is bound to that
 *               connection's challenge, so the keys are the connection's alone. A frame whose
 *               tag does not check out (injected, altered, replayed, reordered) is dropped,
 *               named, and the count goes on as if it had never come (runtime/channel.h).
 *
 * It keeps workers of other jobs and unconfigured clients out and, with a secret, keeps
 * anyone without it from injecting or altering control frames and (data_auth) data. It does
 * not encrypt anything: use a private network against eavesdroppers.
 *
 * Layer: runtime.
 */
#ifndef PSAGG_RUNTIME_AUTH_H
#define PSAGG_RUNTIME_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/config.h"
#include "runtime/wire.h"

#define PSAGG_NONCE_BYTES 16
#define PSAGG_TOKEN_BYTES 32

typedef struct psagg__job_key {
    int secret;      /* a secret_file is configured */
    uint8_t key[32]; /* its BLAKE2b-256 (zero without one) */
} psagg__job_key;

typedef struct psagg__data_key {
    uint8_t key[32];
} psagg__data_key;

/* Read [cluster] secret_file (if any) and hash it; PSAGG_ECONFIG naming the file on failure. */
PSAGG_NODISCARD psagg_status psagg__job_key_load(const psagg__config *cfg, psagg__job_key *out);

/* A fresh random session nonce. */
void psagg__nonce_make(uint8_t nonce[PSAGG_NONCE_BYTES]);

/* A connection's random challenge. */
void psagg__challenge_make(uint8_t challenge[PSAGG_CHALLENGE_BYTES]);

/* The HELLO token of h (its auth field is not read) for server `server_rank` on the
 * connection whose challenge is `challenge` (all zero without a secret). */
void psagg__hello_token(const psagg__job_key *k, const psagg__ctl_hello *h, uint32_t server_rank,
                        const uint8_t challenge[PSAGG_CHALLENGE_BYTES],
                        uint8_t out[PSAGG_TOKEN_BYTES]);

/* The WELCOME token of w (its auth field is not read) answering a HELLO whose token was
 * hello_auth (all zero without a secret). */
void psagg__welcome_token(const psagg__job_key *k, const psagg__ctl_welcome *w,
                          const uint8_t hello_auth[PSAGG_TOKEN_BYTES],
                          uint8_t out[PSAGG_TOKEN_BYTES]);

/* Constant-time comparison of two tokens: 1 if equal. */
int psagg__token_equal(const uint8_t a[PSAGG_TOKEN_BYTES], const uint8_t b[PSAGG_TOKEN_BYTES]);

/* The key of worker pushes (nonce: the worker's) to server `server_rank` (its nonce). */
void psagg__push_key_make(const psagg__job_key *k, const char *job_id,
                          const uint8_t worker_nonce[PSAGG_NONCE_BYTES],
                          const uint8_t server_nonce[PSAGG_NONCE_BYTES], uint32_t server_rank,
                          psagg__data_key *out);
/* The key of server `server_rank`'s updates (its session nonce). */
void psagg__update_key_make(const psagg__job_key *k, const char *job_id,
                            const uint8_t server_nonce[PSAGG_NONCE_BYTES], uint32_t server_rank,
                            psagg__data_key *out);

/*
 * Seal a data message: msg holds its header (psagg__msg_hdr) and payload, len bytes, and room
 * for PSAGG_MSG_MAC_BYTES more, where its number (seq, never 0 or reused under k) and tag go.
 */
void psagg__msg_seal(const psagg__data_key *k, uint64_t seq, uint8_t *msg, size_t len);
/* 1 when the trailer after msg[0, len) checks out under k (constant time); its number in *seq. */
int psagg__msg_open(const psagg__data_key *k, const uint8_t *msg, size_t len, uint64_t *seq);

/*
 * A receiver's record of the message numbers accepted under one key: the highest, and which
 * of the PSAGG_REPLAY_WINDOW below it (messages in flight may come out of order). Zero it
 * when the key changes.
 */
#define PSAGG_REPLAY_WINDOW 4096
typedef struct psagg__replay {
    uint64_t top;
    uint64_t seen[PSAGG_REPLAY_WINDOW / 64]; /* bit (n % WINDOW): number n was accepted */
} psagg__replay;
/* Accept number seq once: 1 (recorded), or 0 when it came before, is 0, or is older than
   the window. */
int psagg__replay_accept(psagg__replay *r, uint64_t seq);

/* What a receiver keeps of one sender: the key its messages are sealed with, their numbers. */
typedef struct psagg__data_rx {
    psagg__data_key key;
    psagg__replay seen;
} psagg__data_rx;

/*
 * A control connection's authentication (frames after the WELCOME; runtime/channel.h uses
 * it): on with a secret; each direction's key and the number of its next frame.
 */
#define PSAGG_CTL_TAG_BYTES 16
typedef struct psagg__ctl_auth {
    int on;
    uint8_t tx_key[32], rx_key[32];
    uint64_t tx_seq, rx_seq;
    uint32_t rejected;       /* frames whose tag did not check out, since the last good one */
    const psagg__logger *log; /* where such frames are reported (the owner sets it), or NULL */
} psagg__ctl_auth;
/*
 * The session keys of the connection whose HELLO carried token `hello_auth` from the worker
 * of nonce `worker_nonce` to server `server_rank` (nonce `server_nonce`), for the server's end
 * (server = 1) or the worker's: off without a secret.
 */
void psagg__ctl_auth_make(const psagg__job_key *k, const uint8_t hello_auth[PSAGG_TOKEN_BYTES],
                          const uint8_t worker_nonce[PSAGG_NONCE_BYTES],
                          const uint8_t server_nonce[PSAGG_NONCE_BYTES], uint32_t server_rank,
                          int server, psagg__ctl_auth *out);
/* The tag of frame number seq (its header, with len counting the tag, and body); whether
   `tag` is it (constant time). */
void psagg__ctl_tag(const uint8_t key[32], uint64_t seq, const psagg__ctl_hdr *h, const void *body,
                    uint32_t body_len, uint8_t tag[PSAGG_CTL_TAG_BYTES]);
int psagg__ctl_tag_ok(const uint8_t key[32], uint64_t seq, const psagg__ctl_hdr *h,
                      const void *body, uint32_t body_len, const uint8_t tag[PSAGG_CTL_TAG_BYTES]);

#endif
