/* runtime/node.c - see runtime/node.h. */
#include "runtime/node.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "base/log.h"
#include "runtime/layout.h"
#include "runtime/wire.h"

psagg_status psagg__node_open(const psagg__config *cfg, const char *role, int rank,
                              psagg__node *out)
{
    char name[32];
    psagg_status st;

    memset(out, 0, sizeof *out);
    out->mac_trace_fd = -1;
    snprintf(name, sizeof name, "%s %d", role, rank);
    psagg__logger_init(&out->log, name, cfg->log_level);
    if ((st = psagg__job_key_load(cfg, &out->job_key)))
        return st;
    psagg__nonce_make(out->nonce);
    out->tag_bytes = cfg->data_auth ? PSAGG_MSG_MAC_BYTES : 0;
    out->max_msg = psagg__max_message(cfg);
    if (cfg->mac_trace[0]) {
        char path[320];
        snprintf(path, sizeof path, "%s.%s%d.%ld", cfg->mac_trace, role, rank, (long)getpid());
        out->mac_trace_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (out->mac_trace_fd < 0)
            return psagg__fail(PSAGG_ECONFIG, "%s: [log] mac_trace: cannot open %s", cfg->path,
                               path);
    }
    if (out->job_key.secret && !cfg->data_auth)
        LOG_WARN(&out->log,
                 "[cluster] data_auth = off: the job has a secret_file, but its data messages "
                 "carry no MAC; they are checked only by the fabric address they come from, so "
                 "a process that can forge one can alter gradients (data_auth = auto, the "
                 "default, authenticates them whenever there is a secret)");
    else if (!out->job_key.secret)
        LOG_INFO(&out->log, "no [cluster] secret_file: any process that can reach this job's "
                            "ports can join it; set one to authenticate peers and data");
    return PSAGG_OK;
}

psagg_status psagg__node_open_fabric(psagg__node *n, const psagg__config *cfg,
                                     const char *fabric_node)
{
    psagg__fabric_opts fo = {.provider = cfg->provider,
                             .node = strcmp(cfg->provider, "shm") ? fabric_node : NULL,
                             .max_msg = n->max_msg,
                             .log = &n->log,
                             .post_timeout_ms = cfg->op_timeout_ms};
    psagg_status st = psagg__fabric_open(&fo, &n->fab);
    if (st)
        return st;
    n->source_reliable = psagg__fabric_source_reliable(n->fab);
    return PSAGG_OK;
}

void psagg__node_close(psagg__node *n)
{
    psagg__fabric_close(n->fab);
    n->fab = NULL;
    if (n->mac_trace_fd >= 0)
        close(n->mac_trace_fd);
    n->mac_trace_fd = -1;
}

void psagg__node_seal(const psagg__node *n, const psagg__data_key *k, uint64_t seq, uint8_t *msg,
                      size_t len)
{
    uint8_t fk[8], fm[8];
    char line[64];
    int m;
    psagg__msg_seal(k, seq, msg, len);
    if (n->mac_trace_fd < 0)
        return;
    crypto_generichash(fk, sizeof fk, k->key, sizeof k->key, NULL, 0);
    crypto_generichash(fm, sizeof fm, msg, len + PSAGG_MSG_MAC_BYTES, NULL, 0);
    m = snprintf(line, sizeof line, "%016llx %llu %016llx\n",
                 (unsigned long long)*(uint64_t *)(void *)fk, (unsigned long long)seq,
                 (unsigned long long)*(uint64_t *)(void *)fm);
    if (write(n->mac_trace_fd, line, (size_t)m) != m) /* (a test's list: nothing else to do) */
        return;
}
