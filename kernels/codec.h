/*
 * codec.h - psagg's gradient codecs: the interface and, below, every wire format byte by byte.
 *
 * Layer: kernels (above base, below the runtime). Everything psagg knows about codecs lives in
 * kernels/: formats, names, sizes, chunking, RNG streams; no other layer computes any of it.
 *
 * This header is the single specification that the scalar reference (kernels/cpu/scalar.c),
 * the AVX2 and AVX-512 paths (kernels/cpu/avx2.c, avx512*.c) and the CUDA kernels
 * (kernels/cuda/) implement. All of them produce bit-identical bytes for the same input, codec
 * and RNG key: every floating-point step below is one IEEE-754 binary32 operation with
 * round-to-nearest-even, in the order written (no fused multiply-add, no reassociation).
 *
 * ------------------------------------------------------------------------------------------
 * WIRE FORMATS (version PSAGG_CODEC_FORMAT_VERSION)
 *
 * Version 2 changed only the RNG of stochastic rounding (below); version 1 drew 24 bits per
 * element from fmix32(fmix32(k + k0) ^ k1). Processes of different versions never share a
 * job: the protocol version of runtime/wire.h changed with it.
 *
 * All multi-byte fields are little-endian. An encoded buffer has no header: the receiver
 * knows the codec and the element count n from the tensor declaration. Sizes are exact
 * (psagg__encoded_size); a buffer of any other length is rejected.
 *
 * fp32   n x binary32, 4n bytes. Encode copies; NaN/Inf are rejected (PSAGG_ENONFINITE).
 * fp16   n x binary16, 2n bytes, converted with round-to-nearest-even (subnormals kept).
 *        Finite values that round to +-Inf (|x| >= 65520) are PSAGG_ERANGE.
 * bf16   n x bfloat16 (the upper 16 bits of binary32), 2n bytes, round-to-nearest-even
 *        computed on the bit pattern: u + 0x7FFF + ((u >> 16) & 1), then >> 16 (subnormals
 *        kept). Finite values that round to +-Inf are PSAGG_ERANGE.
 *
 * maxmin (CGX-style), bits b in 1..8, bucket B (a multiple of 64, 64..1<<20), L = 2^b - 1:
 *   nb = ceil(n / B) buckets; bucket m covers elements [m*B, min(n, (m+1)*B)).
 *   [ meta:    nb x { binary32 scale; binary32 min; }     8*nb bytes, scale first  ]
 *   [ payload: levels as one LSB-first bitstream, 8*ceil(n*b/64) bytes            ]
 *   Element k's level q_k (0..L) occupies bits [k*b, k*b + b) of the payload, where bit j
 *   of the stream is bit (j % 8) of payload byte j / 8. The stream is continuous across
 *   buckets (B*b is a multiple of 8, so every bucket starts on a byte). Bits after n*b up to
 *   the end of the payload are zero.
 *
 *   Encode, per bucket, over its values v_k (v_k = x_k, or x_k + r_k with error feedback):
 *     lo = min_k v_k, hi = max_k v_k, range = hi - lo
 *         (lo under the IEEE 754-2019 minimum order, where -0 < +0: a bucket holding both
 *         zeros and nothing smaller has lo = -0; hi's sign never matters)
 *     if range < PSAGG_MAXMIN_MIN_RANGE (2^-100, constant bucket):
 *         scale = 0, every q_k = 0
 *     else:
 *         scale = range / (float)L;  inv = 1.0f / scale
 *         t_k = (v_k - lo) * inv
 *         q_k = (uint32)(min(t_k + u_k, (float)L))    (truncation; t_k + u_k >= 0)
 *     meta = { scale, lo }
 *   with u_k = 0.5f for nearest rounding and u_k = psagg__rng_uniform(key, k) for
 *   stochastic rounding (k = the element's index in the whole buffer, not in the bucket).
 *   Inputs must satisfy |v_k| < 2^126 (PSAGG_MAXMIN_MAX_ABS): NaN/Inf are PSAGG_ENONFINITE,
 *   larger finite values PSAGG_ERANGE, so range and every decoded value stay finite.
 *
 *   Decode:  y_k = lo + scale * (float)q_k             (multiply, then add)
 *   A buffer is valid iff every bucket has finite lo, finite scale >= 0 (not -0 or NaN), and
 *   lo + scale * (float)L finite; anything else is PSAGG_EBADMETA.
 *
 * topk (sparse: per block the k entries of largest magnitude, b bits each): specified in
 *   kernels/topk.h, beside its scalar reference; its block passes are vectorized.
 *
 * thc (integer aggregation: a seeded rotation, b-bit indices into a table every worker shares
 *   at the round's scale, summed by the servers as integers): specified in kernels/thc.h.
 *   Its update is not a push: a sum stream whose width depends on the pushes summed
 *   (psagg__update_size), and the generic encode, decode and aggregate below refuse it (as do
 *   the CUDA ones: psagg__cuda_thc_push_encode and psagg__cuda_thc_update_decode are its own).
 *
 * RNG (stochastic rounding): counter-based, keyed by (seed, stream), indexed by element.
 * One 32-bit hash serves a pair of elements (2m, 2m + 1), 16 bits each:
 *   splitmix64(z): z += 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 *                  z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)
 *   key64 = splitmix64(seed ^ splitmix64(stream)); k0 = low 32 bits, k1 = high 32 bits
 *   hash32(x): x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16
 *   h_m = hash32((m ^ k1) + k0)                 (m = k >> 1, uint32 arithmetic)
 *   d_k = (h_m >> (16 * (k & 1))) & 0xFFFF       (low half for even k, high half for odd)
 *   u_k = (float)(2 * d_k + 1) * 2^-17           (exact; in (0, 1), mean exactly 1/2)
 *   Element indices are 32-bit: a buffer holds at most PSAGG_CODEC_MAX_ELEMS elements.
 *   Why 16 bits: t_k + u_k is itself rounded to binary32, whose spacing at t_k >= 128 (8-bit
 *   levels) is 2^-16, so more bits of u_k reach no level; each u_k is unbiased to the 2^-17
 *   grid it lies on. hash32 is Wellons' "lowbias32" (two multiplies); sharing it between two
 *   elements makes one multiply per element of format version 1's four.
 *
 * RNG streams of the protocol (psagg__rng_chunk_key): the encode of chunk c of tensor key t in
 * round r (of a parameter tensor: its optimizer step, which its INIT and PULL rounds do not
 * count), by worker w (its push) or by server s (the update), uses the key of (seed, stream):
 *   mix64(a, b): z = a ^ (b + 0x9E3779B97F4A7C15 + (a << 6) + (a >> 2));
 *                z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) *
 * 0x94D049BB133111EB; return z ^ (z >> 31) stream = mix64(mix64(side << 32 | rank, t << 32 | c), r)
 *   side = PSAGG_RNG_WORKER (0x3030) with the worker's rank, PSAGG_RNG_SERVER (0x5E5E) with the
 *   rank of the chunk's owner in the job's layout (whichever server runs the round); seed =
 * [worker] seed of the job's config. Every worker and server, CPU or GPU, derives its keys here, so
 * a job's bytes depend only on its inputs and config.
 *
 * Chunks (psagg__codec_chunk_elems): a tensor is cut into chunks of the job's chunk_elems
 * elements (a multiple of 64), except maxmin, whose chunks hold whole buckets:
 * max(B, chunk_elems - chunk_elems % B). So every chunk encodes on its own, and the largest
 * encoded chunk of any codec is max(4 * chunk_elems, 8 + PSAGG_MAXMIN_MAX_BUCKET) bytes
 * (psagg__codec_max_chunk_bytes): fp32 at chunk_elems, or one 8-bit maxmin bucket of the
 * largest size when buckets are larger than chunk_elems.
 *
 * Error feedback (worker side, and optionally on the server for the requantized sum):
 *   v_k = x_k + r_k;  encode v;  r_k = v_k - decode(encoded)_k
 *   so that sum_t decode(sent_t) = sum_t x_t + r_0 - r_T up to fp32 rounding.
 *
 * Fused server operation (aggregate), for N inputs of one codec and n elements:
 *   s_k = ((((0.0f + y0_k) + y1_k) + ...) + y{N-1}_k)       (inputs in the order given)
 *   then s is encoded as above (with the server residual when one is given). N = 0 encodes
 *   zeros (plus the residual).
 * ------------------------------------------------------------------------------------------
 */
#ifndef PSAGG_KERNELS_CODEC_H
#define PSAGG_KERNELS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "psagg/types.h"
#include "kernels/codec_common.h"
#include "kernels/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PSAGG_CODEC_FORMAT_VERSION  2
#define PSAGG_MAXMIN_DEFAULT_BUCKET 1024u
#define PSAGG_MAXMIN_MAX_BUCKET     (1u << 20)
#define PSAGG_MAXMIN_MIN_RANGE      0x1p-100f
#define PSAGG_MAXMIN_MAX_ABS        0x1p126f

#ifdef __cplusplus
static_assert(sizeof(float) == 4, "binary32 floats required");
#else
_Static_assert(sizeof(float) == 4, "binary32 floats required");
#endif
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "psagg's wire formats are little-endian; this host is not"
#endif

/* ---- codec descriptions ---- */

/* Parse "fp32" | "fp16" | "bf16" | "maxmin<b>" | "maxmin:<b>" | "topk<b>:<kept>" | "thc<b>"
   [/<bucket>]
   [/sr | /nearest] (codec_name.c says what each field means). */
psagg_status psagg_codec_parse(const char *text, psagg_codec *out);
/* Format a codec as text ("maxmin4/1024/sr"); returns buf. */
const char *psagg_codec_name(const psagg_codec *codec, char *buf, size_t len);

/* Check a codec description; fills bucket 0 with the default. PSAGG_EINVAL names the field. */
psagg_status psagg__codec_check(psagg_codec *codec);

/* Whether two checked codecs are the same format (maxmin: bits, bucket and rounding too). */
int psagg__codec_equal(const psagg_codec *a, const psagg_codec *b);

/* Exact encoded size in bytes of n elements (a push); 0 for a codec psagg__codec_check refuses. */
size_t psagg__encoded_size(const psagg_codec *codec, size_t n);
/* Exact size of an update of n elements that summed `summed` pushes (thc: its sum's width
   depends on it; every other codec: psagg__encoded_size), and the largest any job gets. */
size_t psagg__update_size(const psagg_codec *codec, size_t n, size_t summed);
size_t psagg__update_cap(const psagg_codec *codec, size_t n);

/* Layout of a maxmin buffer of n elements: buckets (one {scale, min} each), payload bytes. */
static inline size_t psagg__mm_nbuckets(size_t n, uint32_t bucket)
{
    return n / bucket + (n % bucket != 0);
}

static inline size_t psagg__mm_payload_bytes(size_t n, uint32_t bits)
{
    return 8 * ((n * bits + 63) / 64);
}

/* ---- chunking (see "Chunks" above) ---- */

/* Elements per chunk of a tensor with this (checked) codec in a job of chunk_elems. */
uint64_t psagg__codec_chunk_elems(const psagg_codec *codec, uint64_t chunk_elems);

/* The largest encoded chunk of any codec in a job of chunk_elems (a multiple of 64). */
size_t psagg__codec_max_chunk_bytes(uint64_t chunk_elems);

/* ---- RNG ---- */

psagg__rng_key psagg__rng_key_make(uint64_t seed, uint64_t stream);

/* Who encodes: the side of a chunk's RNG stream (see "RNG streams of the protocol"). */
typedef enum psagg__rng_side {
    PSAGG_RNG_WORKER = 0x3030, /* a worker's push */
    PSAGG_RNG_SERVER = 0x5E5E, /* a server's update */
    PSAGG_RNG_ROTATE = 0x7070, /* thc's rotation of a chunk (rank 0, round 0: kernels/thc.h) */
} psagg__rng_side;

/* The key of chunk `chunk` of tensor `key` in `round`, encoded by `side` number `rank`. */
psagg__rng_key psagg__rng_chunk_key(uint64_t seed, psagg__rng_side side, uint32_t rank,
                                    uint32_t key, uint32_t chunk, uint32_t round);

/*
 * Encode n floats x into out (out_len must be psagg__encoded_size). With residual != NULL the
 * error-feedback step runs: x + residual is encoded and residual is updated in place.
 * On PSAGG_ENONFINITE / PSAGG_ERANGE, *bad_index (if given) receives the first bad element
 * (of x + residual when residual is given); out and residual are then unspecified.
 */
psagg_status psagg__encode(const psagg_codec *codec, const float *x, float *residual, size_t n,
                           psagg__rng_key key, void *out, size_t out_len, size_t *bad_index);

/* Validate an encoded buffer (length, meta, no NaN/Inf in fp formats) without decoding. */
psagg_status psagg__validate(const psagg_codec *codec, const void *in, size_t in_len, size_t n);

/*
 * Decode n elements into out as `op` says, validating the input in the same pass (what
 * psagg__validate checks; for maxmin the meta of each bucket before its values). On an
 * invalid input the status says what was wrong, as psagg__validate would, and out is
 * unspecified: a caller that must keep out intact on bad input validates first.
 */
psagg_status psagg__decode_into(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                                float *out, psagg__decode_op op, float factor);
/* psagg__decode_into with PSAGG_DECODE_SET and PSAGG_DECODE_ADD. */
psagg_status psagg__decode(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                           float *out);
psagg_status psagg__decode_add(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                               float *acc);

/*
 * The fused server operation: decode and sum n_in encoded inputs (each in_len bytes, in the
 * order given), add the server residual if residual != NULL (and update it), and encode the
 * sum into out. Inputs are validated first. Errors as psagg__encode / psagg__validate; on an
 * invalid input *bad_index receives the input's position.
 */
psagg_status psagg__aggregate(const psagg_codec *codec, const void *const *in, size_t n_in,
                              size_t in_len, size_t n, float *residual, psagg__rng_key key,
                              void *out, size_t out_len, size_t *bad_index);

/* ---- implementation selection (whole buffers; never a scalar tail that skips work) ---- */

typedef enum psagg__isa {
    PSAGG_ISA_SCALAR = 0,
    PSAGG_ISA_AVX2 = 1,
    PSAGG_ISA_AVX512 = 2,
    PSAGG_ISA_COUNT
} psagg__isa;

/* The path in use: the best this CPU supports, or PSAGG_CODEC_ISA=scalar|avx2|avx512. */
psagg__isa psagg__codec_isa(void);
const char *psagg__isa_name(psagg__isa isa);
/* 1 if this CPU (and build) can run `isa`. */
int psagg__isa_supported(psagg__isa isa);
/*
 * Force a path for this process (tests, benchmarks); PSAGG_EUNSUPPORTED if unavailable. The
 * choice is process-wide on purpose: it depends only on the CPU, and every path writes the
 * same bytes, so no caller can observe which one runs except by its speed.
 */
psagg_status psagg__codec_set_isa(psagg__isa isa);

#ifdef __cplusplus
}
#endif
#endif
