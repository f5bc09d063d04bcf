/* runtime/gate.c - see runtime/gate.h. */
#include "runtime/gate.h"

#include <stdio.h>

#include "runtime/wire.h"

/* Drop a message and say so, at most once a second; -1 (psagg__gate_sender's "nobody"). */
static int drop(psagg__gate *g, size_t len, const char *why)
{
    psagg__lograte_note(&g->dropped, g->log, 1000, "dropped a %zu-byte message %s", len, why);
    return -1;
}

int psagg__gate_sender(psagg__gate *g, const uint8_t *msg, size_t len, psagg__peer src)
{
    const psagg__msg_hdr *h = (const psagg__msg_hdr *)msg;
    char why[160];
    int from;

    /* who sent it comes first: a bad message is that sender's fault, and nobody else's */
    if (g->source_reliable) {
        from = g->peer_at(g->owner, src);
        if (from < 0) {
            if (src == PSAGG_PEER_UNKNOWN)
                snprintf(why, sizeof why,
                         "from fabric address unknown, which is none of this job's %ss",
                         g->peer_kind);
            else
                snprintf(why, sizeof why,
                         "from fabric address of no %s, which is none of this job's %ss",
                         g->peer_kind, g->peer_kind);
            return drop(g, len, why);
        }
    } else {
        if (len < sizeof *h || h->sender >= (uint32_t)g->n_peers) {
            snprintf(why, sizeof why, "whose field sender names no %s of this job", g->peer_kind);
            return drop(g, len, why);
        }
        from = h->sender; /* shm cannot tell (runtime/transport.h); data_auth checks it */
    }
    /*
     * With data_auth nothing is believed, and nobody blamed, before the trailer checks out
     * with the key of the peer it claims to come from, and its number is new.
     */
    if (g->tag_bytes) {
        psagg__data_rx *rx = g->rx_of(g->owner, from);
        uint64_t seq = 0;
        if (len < sizeof *h + g->tag_bytes ||
            !psagg__msg_open(&rx->key, msg, len - g->tag_bytes, &seq)) {
            snprintf(why, sizeof why,
                     "%s %s %d whose MAC does not check out (forged, altered, or sealed for "
                     "another receiver)",
                     g->source_reliable ? "from" : "claiming to come from", g->peer_kind, from);
            return drop(g, len, why);
        }
        if (!psagg__replay_accept(&rx->seen, seq)) {
            snprintf(why, sizeof why,
                     "%s %s %d: a replay (its message number %llu came before, or is older "
                     "than the last %d)",
                     g->source_reliable ? "from" : "claiming to come from", g->peer_kind, from,
                     (unsigned long long)seq, PSAGG_REPLAY_WINDOW);
            return drop(g, len, why);
        }
    }
    return from;
}

void psagg__gate_flush(psagg__gate *g)
{
    psagg__lograte_flush(&g->dropped, g->log);
}
