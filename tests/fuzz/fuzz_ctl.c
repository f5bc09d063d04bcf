/*
 * fuzz_ctl.c - a control connection's byte stream as a server's loop reads it, piece by piece
 * from a non-blocking socket (psagg__ctl_reader_feed: the header check before any body is
 * taken, then, with a secret, each frame's tag checked and stripped).
 *
 * Input: one flags byte (bit 0: the connection is authenticated, keys of zeros; bit 1: the
 * small bound of a connection not yet authenticated, else 64 KiB), one byte of piece size
 * (1 + b), then the stream, written into a socketpair that many bytes at a time, the reader fed
 * after each piece, and at the end the writing side closed.
 * Properties: nothing crashes, leaks or reads out of bounds; each frame taken has a header that
 * checks out and a body within the bound, and together they are no more bytes than were
 * written; with a secret each frame taken was tagged with the next number (its tag is gone); an
 * ERROR taken parses to a terminated message and a failure status; a stream that stops
 * mid-frame ends in an error, never a frame.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "fuzz.h"
#include "runtime/auth.h"
#include "runtime/channel.h"
#include "runtime/wire.h"

#define SMALL_BOUND 512u
#define LARGE_BOUND 65536u

/* Take every whole frame the socket holds; returns the status that stopped it. */
static psagg_status drain(psagg__ctl_reader *r, int fd, const psagg__ctl_auth *auth, size_t *taken,
                          uint32_t *frames)
{
    for (;;) {
        psagg__ctl_hdr h;
        void *body;
        psagg_status st = psagg__ctl_reader_feed(r, fd, "fuzz peer");
        if (st)
            return st;
        body = psagg__ctl_reader_take(r, &h);
        CHECK(!psagg__ctl_hdr_check(&h, r->max_len, "fuzz peer"), "a frame taken fails its check");
        CHECK(!h.len || body, "a body of %u bytes taken as NULL", h.len);
        *taken += sizeof h + h.len + (auth->on ? PSAGG_CTL_TAG_BYTES : 0);
        ++*frames;
        CHECK(!auth->on || auth->rx_seq == *frames, "frame %u taken with rx_seq %llu", *frames,
              (unsigned long long)auth->rx_seq);
        if (h.type == PSAGG_CTL_ERROR || h.type == PSAGG_CTL_ABORT) {
            const char *msg;
            psagg_status status = psagg__ctl_error_parse(&h, body, &msg);
            CHECK(!msg || (status < 0 && strlen(msg) < sizeof((psagg__ctl_error *)0)->msg),
                  "error frame parse");
        }
        free(body);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    psagg__ctl_auth auth = {0};
    psagg__ctl_reader r;
    psagg_status st = PSAGG_EAGAIN;
    size_t piece, taken = 0, written = 0;
    uint32_t frames = 0;
    int sv[2];

    if (size < 2)
        return 0;
    auth.on = data[0] & 1; /* (keys of zeros, frame numbers from 0: the seeds' tags) */
    psagg__ctl_reader_init(&r, data[0] & 2 ? SMALL_BOUND : LARGE_BOUND, &auth);
    piece = 1 + (size_t)data[1];
    data += 2, size -= 2;
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), "socketpair: %s",
          strerror(errno));
    while (written < size && st == PSAGG_EAGAIN) {
        size_t n = size - written < piece ? size - written : piece;
        ssize_t w = write(sv[0], data + written, n);
        CHECK(w > 0, "write: %s", strerror(errno));
        written += (size_t)w;
        st = drain(&r, sv[1], &auth, &taken, &frames);
    }
    if (st == PSAGG_EAGAIN) { /* all of it written: the peer closes */
        close(sv[0]);
        sv[0] = -1;
        st = drain(&r, sv[1], &auth, &taken, &frames);
        CHECK(st == PSAGG_EPEER || st == PSAGG_EPROTO, "a closed stream ended in %d", st);
    }
    CHECK(st != PSAGG_OK && st != PSAGG_EAGAIN ? psagg_last_error()[0] != '\0' : 1,
          "a refusal without a message");
    CHECK(taken <= written, "%zu bytes of frames taken from %zu written", taken, written);
    psagg__ctl_reader_reset(&r);
    if (sv[0] >= 0)
        close(sv[0]);
    close(sv[1]);
    return 0;
}
