/*
 * test_layout.c - chunk placement (runtime/layout.h) for the models psagg's users run: what
 * one round costs each server (its encoded bytes) and the optimizer state it holds stay
 * within one chunk of an even share, and a rare tensor (psagg.torch's broadcast key, fp32,
 * as large as the model up to 2^20 elements) is not weighed as a round's load: before it was
 * left out of the balance, it took a server of its own next to a compressed model and every
 * per-round byte went to the others.
 *
 * Models: the digits CNN of worker/examples/train_digits.py (8 tensors, 71,754 parameters),
 * its MLP, and tests/data/models/{resnet50,bert_base}.sizes; maxmin4 as psagg.torch declares
 * them (tensors under [worker] min_compress_elems = 1024 in fp32), chunks of 1 MiB of fp32,
 * 2 and 4 servers, as gradients (the DDP hook) and as parameters (ServerOptimizer, DiLoCo),
 * each with the broadcast key last.
 *
 * Labels unit, regression.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/codec.h"
#include "runtime/layout.h"
#include "testutil.h"

#define MAX_TENSORS 1024
#define CHUNK_ELEMS (1048576 / 4)

typedef struct model {
    const char *name;
    uint64_t count[MAX_TENSORS];
    int n;
} model;

static void model_file(model *m, const char *name)
{
    char path[512], line[128];
    const char *dir = getenv("PSAGG_TEST_DATA");
    FILE *f;
    snprintf(path, sizeof path, "%s/models/%s.sizes", dir ? dir : "tests/data", name);
    f = fopen(path, "r");
    CHECK(f, "cannot open %s", path);
    m->name = name;
    m->n = 0;
    while (fgets(line, sizeof line, f))
        if (line[0] != '#' && line[0] != '\n') {
            CHECK(m->n < MAX_TENSORS, "%s: too many tensors", path);
            m->count[m->n++] = strtoull(line, NULL, 10);
        }
    fclose(f);
}

/*
 * Place m's tensors (params: as parameters) and the broadcast key on `servers` servers, and
 * check each server's per-round encoded bytes and optimizer state (elements of parameter
 * chunks) against an even share plus the largest chunk.
 */
static void check_model(const model *m, uint32_t servers, int params)
{
    psagg__ctl_tensor *decl = calloc((size_t)m->n + 1, sizeof *decl);
    psagg_codec c4 = {PSAGG_CODEC_MAXMIN, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0};
    psagg_codec f32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
    uint64_t total = 0, bytes[8] = {0}, state[8] = {0}, round_total = 0, state_total = 0;
    uint64_t big_bytes = 0, big_state = 0, rare_at[8] = {0};
    psagg__layout l;
    char name[32];

    CHECK(decl, "out of memory");
    for (int t = 0; t < m->n; t++) {
        snprintf(name, sizeof name, "t%d", t);
        CHECK(!psagg__tensor_to_wire(name, m->count[t], m->count[t] < 1024 ? &f32 : &c4, &decl[t]),
              "%s", psagg_last_error());
        decl[t].flags = params ? PSAGG_DECL_PARAM : 0;
        total += m->count[t];
    }
    total = total < 1024 ? 1024 : total > (1u << 20) ? (1u << 20) : total; /* psagg.torch's */
    CHECK(!psagg__tensor_to_wire("__psagg_broadcast__", total, &f32, &decl[m->n]), "%s",
          psagg_last_error());
    decl[m->n].flags = PSAGG_DECL_RARE;
    CHECK(!psagg__layout_build(decl, (uint32_t)m->n + 1, CHUNK_ELEMS, servers, 0, &l), "%s: %s",
          m->name, psagg_last_error());
    for (uint32_t i = 0; i < l.n_chunks; i++) {
        const psagg__chunk_info *ci = &l.chunks[i];
        if (ci->key == (uint32_t)m->n) {
            rare_at[ci->owner]++;
            continue;
        }
        bytes[ci->owner] += ci->enc_bytes;
        round_total += ci->enc_bytes;
        big_bytes = ci->enc_bytes > big_bytes ? ci->enc_bytes : big_bytes;
        if (params) {
            state[ci->owner] += ci->count;
            state_total += ci->count;
            big_state = ci->count > big_state ? ci->count : big_state;
        }
    }
    for (uint32_t s = 0; s < servers; s++) {
        CHECK(bytes[s] == l.owned_bytes[s], "%s: owned_bytes[%u] counts %llu, the chunks %llu",
              m->name, s, (unsigned long long)l.owned_bytes[s], (unsigned long long)bytes[s]);
        CHECK(bytes[s] <= round_total / servers + big_bytes,
              "%s on %u servers%s: server %u takes %llu of a round's %llu encoded bytes, more "
              "than an even share plus the largest chunk (%llu)",
              m->name, servers, params ? " (parameters)" : "", s, (unsigned long long)bytes[s],
              (unsigned long long)round_total, (unsigned long long)big_bytes);
        CHECK(state[s] <= state_total / servers + big_state,
              "%s on %u servers: server %u holds the optimizer state of %llu of %llu elements, "
              "more than an even share plus the largest chunk (%llu)",
              m->name, servers, s, (unsigned long long)state[s], (unsigned long long)state_total,
              (unsigned long long)big_state);
    }
    printf("%-9s %u servers %-10s per-round bytes", m->name, servers,
           params ? "parameters" : "gradients");
    for (uint32_t s = 0; s < servers; s++)
        printf(" %llu", (unsigned long long)bytes[s]);
    if (params) {
        printf("; state elements");
        for (uint32_t s = 0; s < servers; s++)
            printf(" %llu", (unsigned long long)state[s]);
    }
    printf("; broadcast-key chunks");
    for (uint32_t s = 0; s < servers; s++)
        printf(" %llu", (unsigned long long)rare_at[s]);
    printf("\n");
    psagg__layout_free(&l);
    free(decl);
}

int main(void)
{
    static model cnn = {"digits-cnn", {144, 16, 4608, 32, 65536, 128, 1280, 10}, 8};
    static model mlp = {"digits-mlp", {64 * 64, 64, 10 * 64, 10}, 4};
    static model resnet, bert;

    { /* a declaration of rare tensors alone: no per-round load to share (it divided by 0) */
        psagg__ctl_tensor d;
        psagg__layout l;
        psagg_codec f32 = {PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC, 0};
        CHECK(!psagg__tensor_to_wire("b", 100000, &f32, &d), "%s", psagg_last_error());
        d.flags = PSAGG_DECL_RARE;
        CHECK(!psagg__layout_build(&d, 1, CHUNK_ELEMS, 2, 0, &l), "%s", psagg_last_error());
        CHECK(l.tensors[0].chunk_elems == PSAGG_LAYOUT_MIN_CUT && l.n_chunks == 25,
              "rare only: chunks of %llu elements, %u chunks",
              (unsigned long long)l.tensors[0].chunk_elems, l.n_chunks);
        psagg__layout_free(&l);
    }
    model_file(&resnet, "resnet50");
    model_file(&bert, "bert_base");
    for (uint32_t servers = 2; servers <= 4; servers += 2)
        for (int params = 0; params < 2; params++) {
            check_model(&cnn, servers, params);
            check_model(&mlp, servers, params);
            check_model(&resnet, servers, params);
            check_model(&bert, servers, params);
        }
    return 0;
}
