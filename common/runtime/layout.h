/*
 * runtime/layout.h - how declared tensors become chunks and which server owns each chunk.
 *
 * Layer: runtime. Every worker and server computes the same layout from the same declaration
 * list, so no placement is ever sent over the wire. Chunks: tensor t is cut into pieces of
 * psagg__codec_chunk_elems(codec, chunk_elems) elements (kernels/codec.h: whole maxmin
 * buckets; the last piece is shorter; a small model is cut finer: psagg__layout_chunk_elems).
 * Placement: longest-processing-time greedy on what a chunk
 * costs a round (its encoded bytes; a parameter's also its fp32 weights, layout.c's
 * chunk_cost): chunks sorted by cost (descending, ties by key then chunk index) each go to
 * the server with the least cost so far (ties: lowest rank). That keeps the busiest server
 * within one chunk of the mean. What a round costs is what is balanced: the chunks of
 * tensors declared rare (PSAGG_DECL_RARE: a broadcast key, used now and then) are left out
 * of it and spread afterwards, the same way, on a count of their own; otherwise one large
 * fp32 broadcast key next to a compressed model would take a server of its own and leave
 * every per-round byte to the others. A parameter chunk's optimizer state is proportional
 * to its elements, as its encoded bytes are for one codec, so it is balanced with them.
 */
#ifndef PSAGG_RUNTIME_LAYOUT_H
#define PSAGG_RUNTIME_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "psagg/types.h"
#include "runtime/config.h"
#include "runtime/wire.h"

/* The most chunks a job may have (layout tables of about 200 MB on every process). */
#define PSAGG_MAX_CHUNKS (1u << 22)

typedef struct psagg__chunk_info {
    uint32_t key, index; /* tensor and chunk within it */
    uint32_t owner;      /* server rank */
    uint32_t slot;       /* position among the owner's chunks */
    uint64_t offset;     /* first element within the tensor */
    uint64_t count;      /* elements */
    size_t enc_bytes;    /* encoded payload bytes in the declared codec (placement) */
    size_t cap_bytes;    /* the most payload bytes any round may carry: enc_bytes, or for an
                            adaptive tensor its largest candidate's (buffers are this big) */
} psagg__chunk_info;

typedef struct psagg__tensor_info {
    char name[PSAGG_NAME_MAX];
    uint64_t count;
    psagg_codec codec;
    uint64_t chunk_elems; /* elements per chunk (the last one may be shorter) */
    uint32_t first_chunk; /* index into layout.chunks */
    uint32_t n_chunks;
    int adaptive; /* its codec may change between rounds (runtime/adaptive.h) */
    int param;    /* a parameter: the servers run the optimizer on it (runtime/wire.h) */
    int rare;     /* used now and then, not every round: placed apart (above) */
} psagg__tensor_info;

typedef struct psagg__layout {
    uint32_t n_tensors;
    psagg__tensor_info *tensors;
    uint32_t n_chunks;
    psagg__chunk_info *chunks; /* tensor-major: tensor t's chunks are contiguous */
    uint32_t n_servers;
    uint32_t *owned_count;   /* per server: number of chunks it owns */
    uint64_t *owned_bytes;   /* per server: encoded bytes of one round's inputs from one worker
                                (of the tensors that are not rare) */
    size_t max_enc_bytes;    /* largest chunk payload (cap_bytes) */
    size_t max_update_bytes; /* largest update payload (psagg__update_cap: thc's are wider) */
    size_t max_param_bytes;  /* largest fp32 chunk of a parameter tensor (INIT, WEIGHTS), or 0 */
    uint32_t adapt_interval; /* [codec] adaptive_interval; 0: every codec is fixed */
} psagg__layout;

/*
 * The elements per chunk a layout cuts tensors into (before whole maxmin buckets): the job's
 * chunk_elems, or for a model too small for that to give every server PSAGG_LAYOUT_SHARES
 * chunks' worth of its elements (the tensors that are not rare), that share, rounded up to a
 * multiple of PSAGG_LAYOUT_MIN_CUT (16 KiB of fp32: smaller messages would cost more in
 * latency than they balance; and every adaptive candidate's bucket, up to 4 x 1024, divides
 * it). So a model of a few hundred kB is spread over the servers as a large one is, in
 * smaller messages; one of ResNet-50's size keeps chunk_elems.
 */
#define PSAGG_LAYOUT_SHARES  8
#define PSAGG_LAYOUT_MIN_CUT 4096u
uint64_t psagg__layout_chunk_elems(const psagg__ctl_tensor *decl, uint32_t n, uint64_t chunk_elems,
                                   uint32_t n_servers);

/*
 * Build from declarations (validated: counts >= 1, codecs valid, names unique). With
 * adapt_interval > 0 (an adaptive job) every maxmin tensor is adaptive: its chunks and their
 * owners are those of its declared codec, its buffers hold its largest candidate.
 */
PSAGG_NODISCARD psagg_status psagg__layout_build(const psagg__ctl_tensor *decl, uint32_t n,
                                                 uint64_t chunk_elems, uint32_t n_servers,
                                                 uint32_t adapt_interval, psagg__layout *out);
void psagg__layout_free(psagg__layout *l);
/* The codec assignment's generation of round `round` of tensor `key` (runtime/adaptive.h; 0
   if it is not adaptive): its pushes' and update's headers name it. */
uint32_t psagg__layout_generation(const psagg__layout *l, uint32_t key, uint32_t round);

/* The declaration record for one tensor description (name truncated check included). */
PSAGG_NODISCARD psagg_status psagg__tensor_to_wire(const char *name, uint64_t count,
                                                   const psagg_codec *codec,
                                                   psagg__ctl_tensor *out);
/* The codec a declaration record names (its fields as they are: psagg__codec_check them). */
psagg_codec psagg__tensor_codec(const psagg__ctl_tensor *t);

/* Elements per chunk that a worker with this config declares: chunk_bytes of fp32, rounded
 * down to a multiple of 64, at least 64. Every worker of a job must agree. */
uint64_t psagg__chunk_elems(const psagg__config *cfg);

/*
 * The largest data message a job with this config can send: the header, the largest
 * encoded chunk of any codec (psagg__codec_max_chunk_bytes), a parameter's trailer and, with
 * data_auth, the MAC.
 * Every peer derives the same.
 */
size_t psagg__max_message(const psagg__config *cfg);

#endif
