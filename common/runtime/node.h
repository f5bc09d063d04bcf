/*
 * runtime/node.h - what every psagg process (a server, a worker) sets up first, the same way:
 * its logger, the job key and this process's session nonce (runtime/auth.h: the keys of
 * its data messages and control frames derive from the nonces of both ends), the trailer
 * bytes a data message carries, the largest message, and the libfabric endpoint.
 *
 * psagg__node_open does all but the endpoint; psagg__node_open_fabric opens the endpoint on a
 * given fabric node (a server knows its own at once, a worker learns it from its control
 * connection to server 0); psagg__node_close closes it.
 *
 * A server and a worker's context embed a node with PSAGG_NODE_EMBED, which makes its members
 * theirs (srv->fab, ctx->log) and &x->node the psagg__node (as Linux's struct_group_tagged).
 *
 * Layer: runtime.
 */
#ifndef PSAGG_RUNTIME_NODE_H
#define PSAGG_RUNTIME_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "runtime/auth.h"
#include "runtime/config.h"
#include "runtime/transport.h"

/* The members of a psagg__node, in order (PSAGG_NODE_EMBED repeats them). */
#define PSAGG_NODE_MEMBERS                                                                         \
    psagg__logger log;                                                                             \
    psagg__job_key job_key; /* the secret's hash */                                                \
    uint8_t nonce[PSAGG_NONCE_BYTES];                                                              \
    size_t tag_bytes;    /* PSAGG_MSG_MAC_BYTES with data_auth, else 0 */                          \
    size_t max_msg;      /* the largest data message (psagg__max_message) */                       \
    psagg__fabric *fab;  /* NULL until psagg__node_open_fabric */                                  \
    int source_reliable; /* psagg__fabric_source_reliable: check every message's source */         \
    int mac_trace_fd;    /* [log] mac_trace (tests): the list of messages sealed, or -1 */

typedef struct psagg__node {
    PSAGG_NODE_MEMBERS
} psagg__node;

/* A psagg__node as a struct's member `node` whose members are also the struct's own. */
#define PSAGG_NODE_EMBED                                                                           \
    union {                                                                                        \
        psagg__node node;                                                                          \
        struct {                                                                                   \
            PSAGG_NODE_MEMBERS                                                                     \
        };                                                                                         \
    }

/*
 * Start a node of `role` ("server", "worker") `rank`: the logger (its role "server 1"; set
 * even when this fails, to log why), the job key ([cluster] secret_file), a fresh nonce,
 * tag_bytes and max_msg. Nothing needs closing when it fails.
 */
psagg_status psagg__node_open(const psagg__config *cfg, const char *role, int rank,
                              psagg__node *out);

/*
 * Open the node's endpoint ([cluster] provider; bound to fabric_node, the address of this
 * host's interface to use, except with shm), and learn whether it names a message's source.
 */
psagg_status psagg__node_open_fabric(psagg__node *n, const psagg__config *cfg,
                                     const char *fabric_node);

/* Close the endpoint, if it is open (and the mac_trace list). */
void psagg__node_close(psagg__node *n);

/*
 * Seal data message msg (len bytes and room for the trailer) under k with number seq
 * (runtime/auth.h), and with [log] mac_trace append "<key fingerprint> <seq> <bytes hash>"
 * (hex, BLAKE2b-64 of the key and of the sealed bytes) to the node's list, one write each.
 */
void psagg__node_seal(const psagg__node *n, const psagg__data_key *k, uint64_t seq, uint8_t *msg,
                      size_t len);

#endif
