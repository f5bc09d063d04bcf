/* runtime/channel.c - see runtime/channel.h. */
#include "runtime/channel.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "runtime/adaptive.h"

static psagg_status resolve(const psagg__hostport *hp, int passive, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char port[8];
    int rc;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    snprintf(port, sizeof port, "%u", hp->port);
    rc = getaddrinfo(hp->host[0] ? hp->host : NULL, port, &hints, res);
    if (rc)
        return psagg__fail(PSAGG_EIO, "cannot resolve %s:%u: %s", hp->host, hp->port,
                           gai_strerror(rc));
    return PSAGG_OK;
}

psagg_status psagg__tcp_listen(const psagg__hostport *hp, int *fd_out)
{
    struct addrinfo *res;
    int fd, one = 1, st = resolve(hp, 1, &res);
    if (st)
        return st;
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        goto err_socket;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 1024))
        goto err_bind;
    freeaddrinfo(res);
    *fd_out = fd;
    return PSAGG_OK;
err_bind:
    st = errno;
    close(fd);
    errno = st;
err_socket:
    freeaddrinfo(res);
    return psagg__fail(PSAGG_EIO, "cannot listen on %s:%u: %s", hp->host, hp->port,
                       strerror(errno));
}

psagg_status psagg__tcp_connect(const psagg__hostport *hp, int64_t deadline_ms, const char *what,
                                const psagg__logger *log, int *fd_out)
{
    psagg__tcp_addr addr = {0};
    int last_err = 0;
    int64_t start = psagg__now_ms(), next_note = start + 3000;
    for (;;) {
        int fd, r = -1;
        int64_t now;
        /* non-blocking (connect_start, connect_done), each attempt bounded, so that a host
           that drops our SYNs (cut off) costs the deadline, not the kernel's minutes of SYN
           retries */
        psagg_status st = psagg__tcp_connect_start(hp, &addr, &fd);
        if (st && !addr.len)
            return st; /* (cannot resolve) */
        if (st) {
            last_err = errno;
        } else {
            int64_t left = deadline_ms - psagg__now_ms();
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1,
                     (int)(left < 100    ? 100
                           : left > 1000 ? 1000
                                         : left)) == 1 &&
                (r = psagg__tcp_connect_done(fd)) == 1) {
                *fd_out = fd;
                return PSAGG_OK;
            }
            last_err = r < 0 ? errno : ETIMEDOUT;
            close(fd);
        }
        /* the server may not be up yet: retry refused/unreachable until the deadline */
        now = psagg__now_ms();
        if (now >= deadline_ms)
            break;
        if (log && now >= next_note) { /* say what we wait for, every few seconds */
            LOG_WARN(log, "still waiting for %s (%s:%u): %s; %.1f s of %.1f s", what, hp->host,
                     hp->port, strerror(last_err), (double)(now - start) / 1e3,
                     (double)(deadline_ms - start) / 1e3);
            next_note = now + 3000;
        }
        usleep(50 * 1000);
    }
    if (last_err == ECONNREFUSED || last_err == EHOSTUNREACH || last_err == ENETUNREACH ||
        last_err == ETIMEDOUT)
        return psagg__fail(PSAGG_ETIMEDOUT,
                           "%s (%s:%u) did not accept a connection within connect_timeout_ms "
                           "(waited %.1f s): %s",
                           what, hp->host, hp->port, (double)(psagg__now_ms() - start) / 1e3,
                           strerror(last_err));
    return psagg__fail(PSAGG_EIO, "connect to %s (%s:%u): %s", what, hp->host, hp->port,
                       strerror(last_err));
}

psagg_status psagg__tcp_connect_start(const psagg__hostport *hp, psagg__tcp_addr *addr, int *fd_out)
{
    int fd;
    if (!addr->len) {
        struct addrinfo *res;
        psagg_status st = resolve(hp, 0, &res);
        if (st)
            return st;
        if (res->ai_addrlen > sizeof addr->bytes) {
            freeaddrinfo(res);
            return psagg__fail(PSAGG_EIO, "%s:%u: an address of %u bytes", hp->host, hp->port,
                               (unsigned)res->ai_addrlen);
        }
        memcpy(addr->bytes, res->ai_addr, res->ai_addrlen);
        addr->len = (uint32_t)res->ai_addrlen;
        addr->family = res->ai_family;
        freeaddrinfo(res);
    }
    fd = socket(addr->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 ||
        (connect(fd, (const struct sockaddr *)(const void *)addr->bytes, (socklen_t)addr->len) &&
         errno != EINPROGRESS)) {
        int e = errno;
        psagg_status st;
        if (fd >= 0)
            close(fd);
        st = psagg__fail(PSAGG_EIO, "connect to %s:%u: %s", hp->host, hp->port, strerror(e));
        errno = e; /* (for a caller that retries on some) */
        return st;
    }
    *fd_out = fd;
    return PSAGG_OK;
}

int psagg__tcp_connect_done(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int err = 0, one = 1, flags;
    socklen_t len = sizeof err;
    if (poll(&p, 1, 0) == 0)
        return 0;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
        err = err ? err : errno;
        psagg__fail(PSAGG_EIO, "connect: %s", strerror(err));
        errno = err; /* (for a caller that retries on some) */
        return -1;
    }
    /* blocking again; small frames, each answered: never wait for Nagle */
    if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) {
        err = errno;
        psagg__fail(PSAGG_EIO, "a connected socket: %s", strerror(err));
        errno = err;
        return -1;
    }
    return 1;
}

psagg_status psagg__tcp_local_addr(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) ||
        getnameinfo((struct sockaddr *)&ss, sl, buf, (socklen_t)len, NULL, 0, NI_NUMERICHOST))
        return psagg__fail(PSAGG_EIO, "getsockname: %s", strerror(errno));
    return PSAGG_OK;
}

/*
 * Send all of buf. On a non-blocking socket whose buffer is full, wait up to a second for
 * room: control frames are small and rare, so a peer that does not read them for that long
 * is not reading at all.
 */
static psagg_status write_all(int fd, const void *buf, size_t len, int more)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            if (poll(&pfd, 1, 1000) > 0)
                continue;
            return psagg__fail(PSAGG_EPEER, "control send: the peer does not read");
        }
        if (n <= 0)
            return psagg__fail(PSAGG_EPEER, "control send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return PSAGG_OK;
}

psagg_status psagg__ctl_send(int fd, psagg__ctl_auth *auth, uint16_t type, const void *body,
                             uint32_t len)
{
    int tagged = auth && auth->on;
    psagg__ctl_hdr h = {PSAGG_CTL_MAGIC, type, PSAGG_PROTO_VERSION,
                        len + (tagged ? PSAGG_CTL_TAG_BYTES : 0)};
    uint8_t tag[PSAGG_CTL_TAG_BYTES];
    psagg_status st;

    if (tagged) /* (its number counts every frame sent, whether the send succeeds or not) */
        psagg__ctl_tag(auth->tx_key, auth->tx_seq++, &h, body, len, tag);
    /* one segment: the header waits for its body (MSG_MORE), so that Nagle's algorithm and
       the peer's delayed ACK never hold a frame's second half back (40 ms) */
    st = write_all(fd, &h, sizeof h, h.len > 0);
    if (!st && len)
        st = write_all(fd, body, len, tagged);
    if (!st && tagged)
        st = write_all(fd, tag, sizeof tag, 0);
    return st;
}

psagg_status psagg__ctl_send_error(int fd, psagg__ctl_auth *auth, uint16_t type,
                                   psagg_status status, const char *msg)
{
    psagg__ctl_error e = {.status = status};
    snprintf(e.msg, sizeof e.msg, "%s", msg);
    return psagg__ctl_send(fd, auth, type, &e, sizeof e);
}

/* How many frames in a row may fail their tag before the connection is given up. */
#define CTL_REJECT_MAX 16

/*
 * A whole frame came on a connection with `auth` on: check its tag (its number is the next
 * one expected) and strip it (hdr->len becomes the body's). PSAGG_OK: it is the peer's;
 * PSAGG_EAGAIN: it is not (dropped, logged: injected, altered, replayed or out of order; the
 * count goes on as if it had never come); PSAGG_EPROTO after CTL_REJECT_MAX such in a row.
 */
static psagg_status untag(psagg__ctl_auth *auth, psagg__ctl_hdr *hdr, const uint8_t *body,
                          const char *peer)
{
    uint32_t blen = hdr->len - PSAGG_CTL_TAG_BYTES;
    if (hdr->len >= PSAGG_CTL_TAG_BYTES &&
        psagg__ctl_tag_ok(auth->rx_key, auth->rx_seq, hdr, body, blen, body + blen)) {
        auth->rx_seq++;
        auth->rejected = 0;
        hdr->len = blen;
        return PSAGG_OK;
    }
    if (++auth->rejected >= CTL_REJECT_MAX)
        return psagg__fail(PSAGG_EPROTO,
                           "%s: %u control frames in a row whose tags do not check out: the "
                           "connection is not the peer's alone",
                           peer, auth->rejected);
    if (auth->log)
        LOG_WARN(auth->log,
                 "%s: a control frame of type %u (%u bytes) whose tag does not check out "
                 "(injected, altered, replayed or out of order): dropped",
                 peer, hdr->type, hdr->len);
    return PSAGG_EAGAIN;
}

/* Read exactly len bytes before the deadline. */
static psagg_status read_all(int fd, void *buf, size_t len, int64_t deadline_ms, const char *peer)
{
    char *p = buf;
    while (len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int wait = -1, rc;
        ssize_t n;
        if (deadline_ms >= 0) {
            int64_t left = deadline_ms - psagg__now_ms();
            if (left <= 0)
                return psagg__fail(PSAGG_ETIMEDOUT, "%s: no complete control frame in time", peer);
            wait = left > 1000000 ? 1000000 : (int)left;
        }
        rc = poll(&pfd, 1, wait);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc == 0)
            continue;
        n = recv(fd, p, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n == 0)
            return psagg__fail(PSAGG_EPEER, "%s closed the control connection", peer);
        if (n < 0)
            return psagg__fail(PSAGG_EPEER, "%s: control receive: %s", peer, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return PSAGG_OK;
}

psagg_status psagg__ctl_hdr_check(const psagg__ctl_hdr *hdr, uint32_t max_len, const char *peer)
{
    if (hdr->magic != PSAGG_CTL_MAGIC)
        return psagg__fail(PSAGG_EPROTO,
                           "%s: control frame field magic is 0x%08x, not a psagg peer", peer,
                           hdr->magic);
    if (hdr->version != PSAGG_PROTO_VERSION)
        return psagg__fail(PSAGG_EPROTO, "%s: protocol version %u, this build speaks %u", peer,
                           hdr->version, PSAGG_PROTO_VERSION);
    if (hdr->type < PSAGG_CTL_HELLO || hdr->type > PSAGG_CTL_STATE)
        return psagg__fail(PSAGG_EPROTO, "%s: control frame field type %u unknown", peer,
                           hdr->type);
    if (hdr->len > max_len)
        return psagg__fail(PSAGG_EPROTO, "%s: control frame field len %u exceeds %u", peer,
                           hdr->len, max_len);
    return PSAGG_OK;
}

psagg_status psagg__ctl_recv(int fd, psagg__ctl_auth *auth, psagg__ctl_hdr *hdr, void **body,
                             int64_t deadline_ms, const char *peer)
{
    for (;;) {
        psagg_status st = read_all(fd, hdr, sizeof *hdr, deadline_ms, peer);
        *body = NULL;
        if (st)
            return st;
        if ((st = psagg__ctl_hdr_check(hdr, PSAGG_CTL_MAX_FRAME, peer)))
            return st;
        if (hdr->len && !(*body = malloc(hdr->len)))
            return psagg__fail(PSAGG_ENOMEM, "%s: control frame of %u bytes", peer, hdr->len);
        if (hdr->len && (st = read_all(fd, *body, hdr->len, deadline_ms, peer))) {
            free(*body);
            *body = NULL;
            return st;
        }
        if (!auth || !auth->on || (st = untag(auth, hdr, *body, peer)) == PSAGG_OK) {
            if (hdr->len == 0) { /* (a tagged empty frame: no body) */
                free(*body);
                *body = NULL;
            }
            return PSAGG_OK;
        }
        free(*body);
        *body = NULL;
        if (st != PSAGG_EAGAIN)
            return st;
        {
            /* dropped: read on only if more has come (the caller polls, and goes on) */
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 0) <= 0)
                return psagg__fail(PSAGG_EAGAIN, "%s: a frame was dropped (its tag)", peer);
        }
    }
}

void psagg__ctl_reader_init(psagg__ctl_reader *r, uint32_t max_len, psagg__ctl_auth *auth)
{
    memset(r, 0, sizeof *r);
    r->max_len = max_len;
    r->auth = auth;
}

void psagg__ctl_reader_reset(psagg__ctl_reader *r)
{
    free(r->body);
    psagg__ctl_reader_init(r, r->max_len, r->auth);
}

psagg_status psagg__ctl_reader_feed(psagg__ctl_reader *r, int fd, const char *peer)
{
    for (;;) {
        size_t need, got;
        uint8_t *dst;
        ssize_t n;
        psagg_status st;
        if (r->got < sizeof r->hdr) {
            dst = (uint8_t *)&r->hdr + r->got;
            need = sizeof r->hdr - r->got;
        } else {
            got = r->got - sizeof r->hdr;
            if (got == r->hdr.len && r->auth && r->auth->on && !r->untagged) {
                if ((st = untag(r->auth, &r->hdr, r->body, peer)) == PSAGG_EAGAIN) {
                    psagg__ctl_reader_reset(r); /* dropped: on to the next frame */
                    continue;
                }
                if (st)
                    return st;
                r->untagged = 1; /* (hdr.len is the body's now) */
                return PSAGG_OK;
            }
            if (got == r->hdr.len || r->untagged)
                return PSAGG_OK; /* a whole frame */
            dst = r->body + got;
            need = r->hdr.len - got;
        }
        n = recv(fd, dst, need, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return PSAGG_EAGAIN;
        if (n == 0)
            return psagg__fail(PSAGG_EPEER, "%s closed the control connection", peer);
        if (n < 0)
            return psagg__fail(PSAGG_EPEER, "%s: control receive: %s", peer, strerror(errno));
        r->got += (size_t)n;
        if (r->got == sizeof r->hdr) { /* the header is in: check it before taking the body */
            if ((st = psagg__ctl_hdr_check(&r->hdr, r->max_len, peer)))
                return st;
            if (r->hdr.len && !(r->body = malloc(r->hdr.len)))
                return psagg__fail(PSAGG_ENOMEM, "%s: control frame of %u bytes", peer, r->hdr.len);
        }
    }
}

void *psagg__ctl_reader_take(psagg__ctl_reader *r, psagg__ctl_hdr *hdr)
{
    void *body = r->body;
    *hdr = r->hdr;
    r->body = NULL;
    psagg__ctl_reader_reset(r);
    return body;
}

psagg_status psagg__ctl_declare_check(const psagg__ctl_hdr *hdr, const void *body, const char *peer)
{
    const psagg__ctl_declare *d = body;
    if (hdr->type != PSAGG_CTL_DECLARE)
        return psagg__fail(PSAGG_EPROTO, "%s: expected DECLARE, got frame type %u", peer,
                           hdr->type);
    if (hdr->len < sizeof *d || !d)
        return psagg__fail(PSAGG_EPROTO, "%s: DECLARE of %u bytes is shorter than its header", peer,
                           hdr->len);
    if (d->count == 0 || d->count > PSAGG_MAX_TENSORS ||
        hdr->len != sizeof *d + (uint64_t)d->count * sizeof(psagg__ctl_tensor))
        return psagg__fail(PSAGG_EPROTO,
                           "%s: DECLARE field count is %u but the frame has %u bytes (1..%u "
                           "tensors of %zu bytes)",
                           peer, d->count, hdr->len, PSAGG_MAX_TENSORS, sizeof(psagg__ctl_tensor));
    if (d->chunk_elems < PSAGG_MIN_CHUNK_ELEMS || d->chunk_elems > PSAGG_MAX_CHUNK_ELEMS ||
        d->chunk_elems % 64)
        return psagg__fail(PSAGG_EPROTO,
                           "%s: DECLARE field chunk_elems is %llu (a multiple of 64 in %u..%u, "
                           "from [worker] chunk_bytes)",
                           peer, (unsigned long long)d->chunk_elems, PSAGG_MIN_CHUNK_ELEMS,
                           PSAGG_MAX_CHUNK_ELEMS);
    if (d->adapt_interval &&
        (d->adapt_interval < PSAGG_ADAPT_LAG || d->adapt_interval > PSAGG_ADAPT_MAX_INTERVAL))
        return psagg__fail(PSAGG_EPROTO,
                           "%s: DECLARE field adapt_interval is %u (0, or %u..%u rounds, from "
                           "[codec] adaptive_interval)",
                           peer, d->adapt_interval, PSAGG_ADAPT_LAG, PSAGG_ADAPT_MAX_INTERVAL);
    if ((d->local_flags & ~PSAGG_LOCAL_READS) || d->reserved)
        return psagg__fail(PSAGG_EPROTO,
                           "%s: DECLARE field %s is 0x%x (local_flags: only PSAGG_LOCAL_READS; "
                           "reserved: 0)",
                           peer, d->reserved ? "reserved" : "local_flags",
                           d->reserved ? d->reserved : d->local_flags);
    return PSAGG_OK;
}

psagg_status psagg__ctl_error_parse(const psagg__ctl_hdr *hdr, void *body, const char **msg)
{
    psagg__ctl_error *e = body;
    *msg = NULL;
    if ((hdr->type != PSAGG_CTL_ERROR && hdr->type != PSAGG_CTL_ABORT) || hdr->len != sizeof *e ||
        !e)
        return PSAGG_OK;
    e->msg[sizeof e->msg - 1] = '\0';
    *msg = e->msg;
    /* a peer's status is only trusted to be one of ours if it is a failure */
    if (!psagg__status_is_failure(e->status))
        return PSAGG_EPEER;
    return (psagg_status)e->status;
}
