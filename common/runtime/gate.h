/*
 * runtime/gate.h - who sent a received data message: the one check a server makes of every
 * push and a worker of every update before believing anything in it.
 *
 * With a provider that names each message's source (psagg__fabric_source_reliable), the sender
 * is the peer whose fabric address that is (the address the peer gave on the authenticated
 * control channel); with one that cannot (shm, runtime/transport.h), it is the peer the
 * header's field sender names. With data_auth the message's trailer must then check out under
 * the key of that peer's messages to this receiver, and its number must be new (runtime/
 * auth.h: a replay, or a push sealed for another server, fails here). A message that fails
 * either is nobody's: it is dropped, blames no peer (anybody could have sent it), and is
 * logged at most once a second (a flood must not flood the log).
 * Whether the message is otherwise valid (psagg__msg_check) and whether that peer may send it
 * are the caller's to check, after the gate: a bad message from a known peer is its fault.
 *
 * Layer: runtime.
 */
#ifndef PSAGG_RUNTIME_GATE_H
#define PSAGG_RUNTIME_GATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "runtime/auth.h"
#include "runtime/transport.h"

typedef struct psagg__gate {
    const char *peer_kind; /* what the log calls a peer: "worker", "server" */
    int n_peers;           /* peers 0 .. n_peers - 1 */
    int source_reliable;   /* psagg__fabric_source_reliable of the endpoint */
    size_t tag_bytes;      /* PSAGG_MSG_MAC_BYTES with data_auth, else 0 */
    const psagg__logger *log;
    /* the peer whose fabric address is addr (PSAGG_PEER_UNKNOWN: none), or -1; what this
       receiver keeps of peer p's messages (their key and the numbers accepted). Both are
       called with `owner` (the server, the worker's context). */
    int (*peer_at)(const void *owner, psagg__peer addr);
    psagg__data_rx *(*rx_of)(void *owner, int peer);
    void *owner;
    psagg__lograte dropped; /* zero-initialised; the receiving thread's */
} psagg__gate;

/*
 * The peer that sent msg (len bytes, received from fabric address src), or -1: the message
 * was dropped and logged ("dropped a N-byte message ..."). Called by one thread only (the
 * receiving one: it owns g->dropped).
 */
int psagg__gate_sender(psagg__gate *g, const uint8_t *msg, size_t len, psagg__peer src);

/* Log the drops not reported yet (the receiving thread, when it stops). */
void psagg__gate_flush(psagg__gate *g);

#endif
