/*
 * test_gate.c - runtime/gate.c: who sent a data message. With a reliable source the peer is
 * the one at the message's fabric address, else the one its field sender names; with
 * data_auth its trailer must check out under that peer's key and its number be new (a
 * replay is refused). Anything else is dropped (-1), counted and described, and blames no
 * peer.
 */
#include "../testutil.h"
#include "runtime/auth.h"
#include "runtime/gate.h"
#include "runtime/wire.h"

#include <string.h>

#define N_PEERS 2
static const psagg__peer addr_of[N_PEERS] = {10, 20};
static psagg__data_rx rx[N_PEERS];
static uint64_t next_seq[N_PEERS];

static int peer_at(const void *owner, psagg__peer addr)
{
    CHECK(owner == rx, "owner passed through");
    for (int p = 0; p < N_PEERS; p++)
        if (addr == addr_of[p])
            return p;
    return -1;
}

static psagg__data_rx *rx_of(void *owner, int p)
{
    CHECK(owner == rx && p >= 0 && p < N_PEERS, "key of peer %d", p);
    return &rx[p];
}

/* A message from `sender` (its field), sealed under peer k's key (its next number) when k >=
 * 0. */
static size_t make(uint8_t *msg, uint32_t sender, int k)
{
    psagg__msg_hdr *h = (psagg__msg_hdr *)(void *)msg;
    size_t len = sizeof *h + 64;
    memset(msg, 0x5a, len);
    memset(h, 0, sizeof *h);
    h->magic = PSAGG_MSG_MAGIC;
    h->sender = (uint16_t)sender;
    h->len = 64;
    if (k < 0)
        return len;
    psagg__msg_seal(&rx[k].key, ++next_seq[k], msg, len);
    return len + PSAGG_MSG_MAC_BYTES;
}

/* The last drop's description contains `want`, and drops went up by one. */
static void dropped(psagg__gate *g, uint64_t *total, const char *want)
{
    CHECK(g->dropped.total == *total + 1, "one more drop (%llu)",
          (unsigned long long)g->dropped.total);
    *total = g->dropped.total;
    CHECK(strstr(g->dropped.latest, "dropped a ") && strstr(g->dropped.latest, want),
          "drop said '%s', not '%s'", g->dropped.latest, want);
}

int main(void)
{
    psagg__logger lg;
    psagg__config cfg;
    psagg__job_key jk;
    uint8_t msg[sizeof(psagg__msg_hdr) + 64 + PSAGG_MSG_MAC_BYTES];
    uint64_t total = 0;
    size_t len;

    psagg__logger_init(&lg, "test", PSAGG_LOG_ERROR);
    memset(&cfg, 0, sizeof cfg);
    CHECK(psagg__job_key_load(&cfg, &jk) == PSAGG_OK, "job key: %s", psagg_last_error());
    for (int p = 0; p < N_PEERS; p++) {
        uint8_t nonce[PSAGG_NONCE_BYTES];
        psagg__nonce_make(nonce);
        psagg__update_key_make(&jk, "job", nonce, (uint32_t)p, &rx[p].key);
    }

    /* a reliable source: the address decides, whatever the field says */
    psagg__gate g = {.peer_kind = "server",
                     .n_peers = N_PEERS,
                     .source_reliable = 1,
                     .log = &lg,
                     .peer_at = peer_at,
                     .rx_of = rx_of,
                     .owner = rx};
    len = make(msg, 0, -1);
    CHECK(psagg__gate_sender(&g, msg, len, 20) == 1, "peer at address 20");
    CHECK(psagg__gate_sender(&g, msg, 3, 10) == 0, "a short message's sender is its address's");
    CHECK(psagg__gate_sender(&g, msg, len, 99) == -1, "a stranger's address");
    dropped(&g, &total, "from fabric address of no server, which is none of this job's servers");
    CHECK(psagg__gate_sender(&g, msg, len, PSAGG_PEER_UNKNOWN) == -1, "an unknown address");
    dropped(&g, &total, "from fabric address unknown, which is none of this job's servers");

    /* no reliable source (shm): the field sender decides */
    g.source_reliable = 0;
    len = make(msg, 1, -1);
    CHECK(psagg__gate_sender(&g, msg, len, 99) == 1, "field sender 1");
    len = make(msg, N_PEERS, -1);
    CHECK(psagg__gate_sender(&g, msg, len, 10) == -1, "field sender names no peer");
    dropped(&g, &total, "whose field sender names no server of this job");
    CHECK(psagg__gate_sender(&g, msg, sizeof(psagg__msg_hdr) - 1, 10) == -1,
          "shorter than a header");
    dropped(&g, &total, "names no server");

    /* data_auth: the MAC under the sender's key, whichever way the sender was found */
    g.tag_bytes = PSAGG_MSG_MAC_BYTES;
    g.source_reliable = 1;
    len = make(msg, 1, 1);
    CHECK(psagg__gate_sender(&g, msg, len, 20) == 1, "a good MAC");
    CHECK(psagg__gate_sender(&g, msg, len, 20) == -1, "the same message again");
    dropped(&g, &total, "from server 1: a replay (its message number 1 came before");
    msg[sizeof(psagg__msg_hdr) + 7] ^= 1;
    CHECK(psagg__gate_sender(&g, msg, len, 20) == -1, "an altered payload");
    dropped(&g, &total,
            "from server 1 whose MAC does not check out (forged, altered, or sealed "
            "for another receiver)");
    len = make(msg, 1, 0);
    CHECK(psagg__gate_sender(&g, msg, len, 20) == -1, "another peer's key");
    dropped(&g, &total, "from server 1 whose MAC does not check out");
    CHECK(psagg__gate_sender(&g, msg, sizeof(psagg__msg_hdr) + 3, 20) == -1, "no room for a tag");
    dropped(&g, &total, "whose MAC does not check out");
    g.source_reliable = 0;
    len = make(msg, 1, 1);
    CHECK(psagg__gate_sender(&g, msg, len, 99) == 1, "a good MAC, field sender 1");
    len = make(msg, 1, 0);
    CHECK(psagg__gate_sender(&g, msg, len, 99) == -1, "a forged field sender");
    dropped(&g, &total, "claiming to come from server 1 whose MAC does not check out");

    psagg__gate_flush(&g);
    fprintf(stderr, "test_gate: all passed\n");
    return 0;
}
