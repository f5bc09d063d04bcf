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
 *   data key    of a sender: BLAKE2b-256 keyed with the job key over ("psagg-data-v1",
 *               job_id, the sender's session nonce), so two runs of a job never share keys.
 *   message MAC with data_auth: Poly1305 over header and payload, keyed with a one-time key
 *               BLAKE2b-256(data key of the sender, the 32-byte header). Within a session a
 *               header names one message (sender, type, tensor, chunk, round), so no one-time
 *               key authenticates two different messages. The 16-byte tag follows the payload.
 *
 * It keeps workers of other jobs and unconfigured clients out and, with data_auth, keeps
 * anyone without the secret from injecting or altering data. It does not encrypt anything:
 * use a private network against eavesdroppers.
 *
 * Layer: runtime.
 */
#ifndef PSAGG_RUNTIME_AUTH_H
#define PSAGG_RUNTIME_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "runtime/config.h"
#include "runtime/wire.h"

#define PSAGG_NONCE_BYTES 16
#define PSAGG_TOKEN_BYTES 32

typedef struct psagg_job_key {
    int secret;      /* a secret_file is configured */
    uint8_t key[32]; /* its BLAKE2b-256 (zero without one) */
} psagg_job_key;

typedef struct psagg_data_key {
    uint8_t key[32];
} psagg_data_key;

/* Read [cluster] secret_file (if any) and hash it; PSAGG_ECONFIG naming the file on failure. */
PSAGG_NODISCARD psagg_status psagg_job_key_load(const psagg_config *cfg, psagg_job_key *out);

/* A fresh random session nonce. */
void psagg_nonce_make(uint8_t nonce[PSAGG_NONCE_BYTES]);

/* A connection's random challenge. */
void psagg_challenge_make(uint8_t challenge[PSAGG_CHALLENGE_BYTES]);

/* The HELLO token of h (its auth field is not read) for server `server_rank` on the
 * connection whose challenge is `challenge` (all zero without a secret). */
void psagg_hello_token(const psagg_job_key *k, const psagg_ctl_hello *h, uint32_t server_rank,
                       const uint8_t challenge[PSAGG_CHALLENGE_BYTES],
                       uint8_t out[PSAGG_TOKEN_BYTES]);

/* The WELCOME token of w (its auth field is not read) answering a HELLO whose token was
 * hello_auth (all zero without a secret). */
void psagg_welcome_token(const psagg_job_key *k, const psagg_ctl_welcome *w,
                         const uint8_t hello_auth[PSAGG_TOKEN_BYTES],
                         uint8_t out[PSAGG_TOKEN_BYTES]);

/* Constant-time comparison of two tokens: 1 if equal. */
int psagg_token_equal(const uint8_t a[PSAGG_TOKEN_BYTES], const uint8_t b[PSAGG_TOKEN_BYTES]);

/* The data key of the sender whose session nonce is `nonce`. */
void psagg_data_key_make(const psagg_job_key *k, const char *job_id,
                         const uint8_t nonce[PSAGG_NONCE_BYTES], psagg_data_key *out);

/*
 * The MAC of a data message: msg is its header (psagg_msg_hdr, 32 bytes) followed by the
 * payload, len bytes in all; the tag is written to tag (usually msg + len).
 */
void psagg_msg_mac(const psagg_data_key *k, const void *msg, size_t len,
                   uint8_t tag[PSAGG_MSG_MAC_BYTES]);
/* 1 when tag is msg's MAC under k (constant time). */
int psagg_msg_mac_ok(const psagg_data_key *k, const void *msg, size_t len,
                     const uint8_t tag[PSAGG_MSG_MAC_BYTES]);

#endif
