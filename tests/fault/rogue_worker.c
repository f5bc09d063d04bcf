/*
 * rogue_worker.c - a worker that speaks psagg's protocol itself (control channel + libfabric)
 * and then misbehaves on the data path, for the fault tests (test_fault.sh).
 *
 *   --mode magic|len|key|round   send one bad push; the server must close this worker with
 *                                a reason naming the field (checked here) and stay up
 *   --mode dup                   send every push of round 0 and the first one twice; the
 *                                server must drop the duplicate and complete the round
 *
 * It declares what fn_worker declares by default (tensors of 1, 1023 and 4096 elements, fp32)
 * and contributes the same values (fn_input.h), so fn_worker's exact-sum check covers it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "fn_input.h"
#include "kernels/codec.h"
#include "runtime/config.h"
#include "runtime/control.h"
#include "runtime/layout.h"
#include "runtime/message.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "rogue: " __VA_ARGS__);                                                    \
        fprintf(stderr, ": %s\n", psagg_last_error());                                             \
        exit(1);                                                                                   \
    } while (0)

static psagg_config cfg;

static void *recv_frame(int fd, uint16_t want, const char *what)
{
    psagg_ctl_hdr h;
    void *body = NULL;
    if (psagg_ctl_recv(fd, &h, &body, psagg_now_ms() + 20000, "server 0"))
        DIE("waiting for %s", what);
    if (h.type != want) {
        fprintf(stderr, "rogue: expected %s, got frame type %u: %s\n", what, h.type,
                h.type == PSAGG_CTL_ERROR ? ((psagg_ctl_error *)body)->msg : "");
        exit(1);
    }
    return body;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 2 && !strcmp(argv[1], "--mode") ? argv[2] : "dup";
    const char *rank_env = getenv("PSAGG_RANK");
    uint32_t rank = rank_env ? (uint32_t)atoi(rank_env) : 1;
    static const uint64_t sizes[] = {1, 1023, 4096};
    psagg_ctl_tensor decl[3];
    struct {
        psagg_ctl_declare d;
        psagg_ctl_tensor t[3];
    } declare_msg;
    psagg_ctl_hello hello = {.rank = rank};
    psagg_ctl_welcome *wel;
    psagg_fabric_opts fo = {.provider = "tcp"};
    psagg_fabric *fab;
    psagg_peer server;
    psagg_layout layout;
    psagg_codec fp32 = {.id = PSAGG_CODEC_FP32};
    char local[64];
    size_t len = sizeof hello.epname;
    uint8_t *push[3], *rbuf[8];
    int fd, ok = 0;

    if (psagg_config_load(getenv("PSAGG_CONFIG"), &cfg))
        DIE("config");
    if (psagg_tcp_connect(&cfg.servers[0], psagg_now_ms() + 20000, &fd) ||
        psagg_tcp_local_addr(fd, local, sizeof local))
        DIE("connect");
    fo.node = local;
    fo.max_msg = psagg_max_message(&cfg); /* as psagg itself: rxm peers must agree */
    if (psagg_fabric_open(&fo, &fab) || psagg_fabric_name(fab, hello.epname, &len))
        DIE("fabric");
    snprintf(hello.job_id, sizeof hello.job_id, "%s", cfg.job_id);
    hello.world_size = (uint32_t)cfg.n_workers;
    hello.epname_len = (uint32_t)len;
    if (psagg_hello_token(&cfg, rank, hello.auth) ||
        psagg_ctl_send(fd, PSAGG_CTL_HELLO, &hello, sizeof hello))
        DIE("hello");
    wel = recv_frame(fd, PSAGG_CTL_WELCOME, "WELCOME");
    if (psagg_fabric_add_peer(fab, wel->epname, wel->epname_len, &server))
        DIE("add server");
    free(wel);

    declare_msg.d = (psagg_ctl_declare){.count = 3};
    declare_msg.d.chunk_elems = psagg_chunk_elems(&cfg);
    for (int t = 0; t < 3; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%03d", t);
        if (psagg_tensor_to_wire(name, sizes[t], &fp32, &decl[t]))
            DIE("tensor %d", t);
        declare_msg.t[t] = decl[t];
    }
    if (psagg_ctl_send(fd, PSAGG_CTL_DECLARE, &declare_msg, sizeof declare_msg))
        DIE("declare");
    free(recv_frame(fd, PSAGG_CTL_READY, "READY"));
    if (psagg_layout_build(decl, 3, declare_msg.d.chunk_elems, 1, &layout) || layout.n_chunks != 3)
        DIE("layout (this test expects one chunk per tensor)");
    for (int i = 0; i < 8; i++) {
        rbuf[i] = malloc(1u << 16);
        if (!rbuf[i] || psagg_fabric_post_recv(fab, rbuf[i], 1u << 16, NULL, rbuf[i]))
            DIE("post a receive");
    }

    /* this worker's round-0 contributions, exactly as fn_worker would send them */
    for (uint32_t c = 0; c < 3; c++) {
        const psagg_chunk_info *ci = &layout.chunks[c];
        psagg_msg_hdr *h;
        float *x;
        push[c] = calloc(1, sizeof *h + ci->enc_bytes + 64);
        h = (psagg_msg_hdr *)push[c];
        x = (float *)(h + 1);
        psagg_msg_init(h, PSAGG_MSG_PUSH, rank, 0, ci);
        for (uint64_t i = 0; i < ci->count; i++)
            x[i] = input_value((int)rank, ci->key, 0, i);
    }
    if (strcmp(mode, "dup")) {
        psagg_msg_hdr *h = (psagg_msg_hdr *)push[1];
        size_t bytes = sizeof *h + layout.chunks[1].enc_bytes;
        const char *field = mode;
        psagg_ctl_hdr ch;
        psagg_ctl_error *e = NULL;
        if (!strcmp(mode, "magic"))
            h->magic ^= 1;
        else if (!strcmp(mode, "len"))
            bytes += 4, field = "len";
        else if (!strcmp(mode, "key"))
            h->key = 999;
        else if (!strcmp(mode, "round"))
            h->round = 7;
        if (psagg_fabric_send(fab, server, push[1], bytes, NULL, NULL))
            DIE("send the bad push");
        /* the server must close us with a reason that names the field */
        if (psagg_ctl_recv(fd, &ch, (void **)&e, psagg_now_ms() + 20000, "server 0") ||
            ch.type != PSAGG_CTL_ERROR || !e)
            DIE("expected an ERROR frame closing this worker");
        printf("rogue: server closed this worker: %s\n", e->msg);
        ok = strstr(e->msg, field) != NULL;
        if (!ok)
            fprintf(stderr, "rogue: the reason does not name the field '%s'\n", field);
        free(e);
        goto out;
    }

    /* dup: every push, the first one twice; then wait for the three updates */
    for (uint32_t i = 0; i < 4; i++) {
        uint32_t c = i ? i - 1 : 0;
        if (psagg_fabric_send(fab, server, push[c],
                              sizeof(psagg_msg_hdr) + layout.chunks[c].enc_bytes, NULL, NULL))
            DIE("send push %u", c);
    }
    for (int updates = 0; updates < 3;) {
        psagg_fabric_event ev[8];
        int n = psagg_fabric_poll(fab, ev, 8, 100);
        for (int i = 0; i < n; i++)
            if (ev[i].kind == PSAGG_FABRIC_RECV_DONE)
                updates++;
            else if (ev[i].kind == PSAGG_FABRIC_RECV_ERROR || ev[i].kind == PSAGG_FABRIC_SEND_ERROR)
                DIE("fabric: %s", ev[i].msg);
    }
    if (psagg_ctl_send(fd, PSAGG_CTL_BYE, NULL, 0))
        DIE("bye");
    printf("rogue: 3 updates received after a duplicate push\n");
    ok = 1;
out:
    close(fd);
    psagg_fabric_close(fab);
    psagg_layout_free(&layout);
    for (int i = 0; i < 8; i++)
        free(rbuf[i]);
    for (int c = 0; c < 3; c++)
        free(push[c]);
    if (ok)
        printf("ROGUE-OK\n");
    return ok ? 0 : 1;
}
