/* runtime/control.c - see runtime/control.h. */
#include "runtime/control.h"

#include <arpa/inet.h>
#include <errno.h>
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

#include <sodium.h>

#include "base/error.h"

static psagg_status resolve(const psagg_hostport *hp, int passive, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char port[8];
    int rc;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    snprintf(port, sizeof port, "%u", hp->port);
    rc = getaddrinfo(hp->host[0] ? hp->host : NULL, port, &hints, res);
    if (rc)
        return psagg_fail(PSAGG_EIO, "cannot resolve %s:%u: %s", hp->host, hp->port,
                          gai_strerror(rc));
    return PSAGG_OK;
}

psagg_status psagg_tcp_listen(const psagg_hostport *hp, int *fd_out)
{
    struct addrinfo *res;
    int fd, one = 1, st = resolve(hp, 1, &res);
    if (st)
        return st;
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
    return psagg_fail(PSAGG_EIO, "cannot listen on %s:%u: %s", hp->host, hp->port, strerror(errno));
}

psagg_status psagg_tcp_connect(const psagg_hostport *hp, int64_t deadline_ms, int *fd_out)
{
    struct addrinfo *res;
    int one = 1, last_err = 0, st = resolve(hp, 0, &res);
    if (st)
        return st;
    for (;;) {
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last_err = errno;
            break;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            /* small frames, each answered: never wait for Nagle */
            if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) {
                last_err = errno;
                close(fd);
                break;
            }
            freeaddrinfo(res);
            *fd_out = fd;
            return PSAGG_OK;
        }
        last_err = errno;
        close(fd);
        /* the server may not be up yet: retry refused/unreachable until the deadline */
        if (psagg_now_ms() >= deadline_ms)
            break;
        usleep(50 * 1000);
    }
    freeaddrinfo(res);
    if (last_err == ECONNREFUSED || last_err == EHOSTUNREACH || last_err == ENETUNREACH ||
        last_err == ETIMEDOUT)
        return psagg_fail(PSAGG_ETIMEDOUT, "server %s:%u unreachable until the deadline: %s",
                          hp->host, hp->port, strerror(last_err));
    return psagg_fail(PSAGG_EIO, "connect to %s:%u: %s", hp->host, hp->port, strerror(last_err));
}

psagg_status psagg_tcp_local_addr(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) ||
        getnameinfo((struct sockaddr *)&ss, sl, buf, (socklen_t)len, NULL, 0, NI_NUMERICHOST))
        return psagg_fail(PSAGG_EIO, "getsockname: %s", strerror(errno));
    return PSAGG_OK;
}

static psagg_status write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return psagg_fail(PSAGG_EPEER, "control send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return PSAGG_OK;
}

psagg_status psagg_ctl_send(int fd, uint16_t type, const void *body, uint32_t len)
{
    psagg_ctl_hdr h = {PSAGG_CTL_MAGIC, type, PSAGG_PROTO_VERSION, len};
    psagg_status st = write_all(fd, &h, sizeof h);
    if (!st && len)
        st = write_all(fd, body, len);
    return st;
}

psagg_status psagg_ctl_send_error(int fd, uint16_t type, psagg_status status, const char *msg)
{
    psagg_ctl_error e = {.status = status};
    snprintf(e.msg, sizeof e.msg, "%s", msg);
    return psagg_ctl_send(fd, type, &e, sizeof e);
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
            int64_t left = deadline_ms - psagg_now_ms();
            if (left <= 0)
                return psagg_fail(PSAGG_ETIMEDOUT, "%s: no complete control frame in time", peer);
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
            return psagg_fail(PSAGG_EPEER, "%s closed the control connection", peer);
        if (n < 0)
            return psagg_fail(PSAGG_EPEER, "%s: control receive: %s", peer, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return PSAGG_OK;
}

psagg_status psagg_ctl_recv(int fd, psagg_ctl_hdr *hdr, void **body, int64_t deadline_ms,
                            const char *peer)
{
    psagg_status st = read_all(fd, hdr, sizeof *hdr, deadline_ms, peer);
    *body = NULL;
    if (st)
        return st;
    if (hdr->magic != PSAGG_CTL_MAGIC)
        return psagg_fail(PSAGG_EPROTO, "%s: control frame field magic is 0x%08x, not a psagg peer",
                          peer, hdr->magic);
    if (hdr->version != PSAGG_PROTO_VERSION)
        return psagg_fail(PSAGG_EPROTO, "%s: protocol version %u, this build speaks %u", peer,
                          hdr->version, PSAGG_PROTO_VERSION);
    if (hdr->type < PSAGG_CTL_HELLO || hdr->type > PSAGG_CTL_ABORT)
        return psagg_fail(PSAGG_EPROTO, "%s: control frame field type %u unknown", peer, hdr->type);
    if (hdr->len > PSAGG_CTL_MAX_FRAME)
        return psagg_fail(PSAGG_EPROTO, "%s: control frame field len %u exceeds %u", peer, hdr->len,
                          PSAGG_CTL_MAX_FRAME);
    if (!hdr->len)
        return PSAGG_OK;
    *body = malloc(hdr->len);
    if (!*body)
        return psagg_fail(PSAGG_ENOMEM, "%s: control frame of %u bytes", peer, hdr->len);
    st = read_all(fd, *body, hdr->len, deadline_ms, peer);
    if (st) {
        free(*body);
        *body = NULL;
    }
    return st;
}

psagg_status psagg_ctl_error_parse(const psagg_ctl_hdr *hdr, void *body, const char **msg)
{
    psagg_ctl_error *e = body;
    *msg = NULL;
    if ((hdr->type != PSAGG_CTL_ERROR && hdr->type != PSAGG_CTL_ABORT) || hdr->len != sizeof *e ||
        !e)
        return PSAGG_OK;
    e->msg[sizeof e->msg - 1] = '\0';
    *msg = e->msg;
    /* a peer's status is only trusted to be one of ours if it is a failure */
    if (!psagg_status_is_failure(e->status))
        return PSAGG_EPEER;
    return (psagg_status)e->status;
}

psagg_status psagg_hello_token(const psagg_config *cfg, uint32_t rank, uint8_t out[32])
{
    uint8_t key[crypto_generichash_KEYBYTES], secret[4096], le[4];
    crypto_generichash_state st;
    size_t len;
    FILE *f;

    memset(out, 0, 32);
    if (!cfg->secret_file[0])
        return PSAGG_OK;
    if (sodium_init() < 0)
        return psagg_fail(PSAGG_EIO, "libsodium failed to initialise");
    f = fopen(cfg->secret_file, "rb");
    if (!f)
        return psagg_fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s': %s", cfg->path,
                          cfg->secret_file, strerror(errno));
    len = fread(secret, 1, sizeof secret, f);
    fclose(f);
    if (len == 0)
        return psagg_fail(PSAGG_ECONFIG, "%s: [cluster] secret_file '%s' is empty", cfg->path,
                          cfg->secret_file);
    crypto_generichash(key, sizeof key, secret, len, NULL, 0);
    sodium_memzero(secret, sizeof secret);
    le[0] = (uint8_t)rank, le[1] = (uint8_t)(rank >> 8), le[2] = (uint8_t)(rank >> 16),
    le[3] = (uint8_t)(rank >> 24);
    crypto_generichash_init(&st, key, sizeof key, 32);
    crypto_generichash_update(&st, (const uint8_t *)"psagg-hello-v1", 14);
    crypto_generichash_update(&st, (const uint8_t *)cfg->job_id, strlen(cfg->job_id));
    crypto_generichash_update(&st, le, sizeof le);
    crypto_generichash_final(&st, out, 32);
    sodium_memzero(key, sizeof key);
    return PSAGG_OK;
}

int psagg_token_equal(const uint8_t a[32], const uint8_t b[32])
{
    return sodium_memcmp(a, b, 32) == 0;
}
