/*
 * test_codec_chunks.c - the codec knowledge the rest of psagg takes from kernels/: chunk sizes,
 * the largest encoded chunk (which sizes every message and receive buffer), the RNG stream of
 * a chunk, and the codec text round trip.
 *
 *  - psagg__codec_max_chunk_bytes(ce) is the maximum, over every valid codec (fp32, fp16, bf16,
 *    maxmin with every bits 1..8 and every bucket 64..2^20), of the encoded size of a chunk
 *    of psagg__codec_chunk_elems(codec, ce) elements: never below it, and reached;
 *  - psagg__codec_chunk_elems gives whole buckets, and chunk_elems itself otherwise;
 *  - psagg__rng_chunk_key matches codec.h's text (an independent implementation here) and
 *    the keys the worker and server derived before they shared this function (golden values
 *    computed with the code of commit f8487c8), so updates stay byte-identical.
 */
#include "test_codec_util.h"
#include "kernels/topk.h"

/* codec.h's "RNG streams of the protocol", written again from the text. */
static uint64_t spec_mix64(uint64_t a, uint64_t b)
{
    uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void test_max_chunk_bytes(void)
{
    static const uint64_t ces[] = {64, 128, 1024, 4096, 65536, 262144, 262208, 1u << 20, 3u << 20};
    for (size_t i = 0; i < sizeof ces / sizeof ces[0]; i++) {
        uint64_t ce = ces[i];
        size_t bound = psagg__codec_max_chunk_bytes(ce), best = 0;
        psagg_codec c = tc_codec(PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_STOCHASTIC);
        for (int id = PSAGG_CODEC_FP32; id <= PSAGG_CODEC_BF16; id++) {
            size_t sz;
            c.id = (psagg_codec_id)id;
            CHECK(psagg__codec_chunk_elems(&c, ce) == ce, "fp codec %d: chunk of %llu", id,
                  (unsigned long long)psagg__codec_chunk_elems(&c, ce));
            sz = psagg__encoded_size(&c, psagg__codec_chunk_elems(&c, ce));
            CHECK(sz <= bound, "codec %d: %zu > bound %zu", id, sz, bound);
            best = sz > best ? sz : best;
        }
        for (uint32_t b = 1; b <= 8; b++)
            for (uint32_t B = 64; B <= PSAGG_MAXMIN_MAX_BUCKET; B += 64) {
                psagg_codec m = tc_codec(PSAGG_CODEC_MAXMIN, b, B, PSAGG_ROUND_NEAREST);
                uint64_t n = psagg__codec_chunk_elems(&m, ce);
                size_t sz = psagg__encoded_size(&m, n);
                CHECK(n % B == 0 && n >= B && n <= (ce > B ? ce : B),
                      "maxmin%u/%u: chunk of %llu elements in a job of %llu", b, B,
                      (unsigned long long)n, (unsigned long long)ce);
                CHECK(sz <= bound, "maxmin%u/%u, chunk_elems %llu: %zu bytes > bound %zu", b, B,
                      (unsigned long long)ce, sz, bound);
                best = sz > best ? sz : best;
            }
        for (uint32_t b = 2; b <= 8; b += 6) /* topk: every block, k = block (the largest) */
            for (uint32_t C = PSAGG_TOPK_MIN_BLOCK; C <= PSAGG_TOPK_MAX_BLOCK; C *= 2) {
                psagg_codec t = {PSAGG_CODEC_TOPK, b, C, PSAGG_ROUND_NEAREST, C};
                uint64_t n;
                size_t sz;
                n = psagg__codec_chunk_elems(&t, ce);
                sz = psagg__encoded_size(&t, n);
                CHECK(n % C == 0 && n >= C && n <= (ce > C ? ce : C) && sz <= bound,
                      "topk%u:%u/%u, chunk_elems %llu: a chunk of %llu, %zu bytes, bound %zu", b, C,
                      C, (unsigned long long)ce, (unsigned long long)n, sz, bound);
            }
        CHECK(best == bound, "chunk_elems %llu: largest chunk %zu, bound %zu (not tight)",
              (unsigned long long)ce, best, bound);
        printf("chunk_elems %8llu: largest encoded chunk %zu bytes (bound reached)\n",
               (unsigned long long)ce, bound);
    }
}

static void test_chunk_keys(void)
{
    static const struct {
        uint64_t seed;
        psagg__rng_side side;
        uint32_t rank, key, chunk, round, k0, k1;
    } golden[] = {
        {1ull, PSAGG_RNG_WORKER, 0, 0, 0, 0u, 0x5CD20DCFu, 0xA057C975u},
        {1ull, PSAGG_RNG_WORKER, 3, 17, 2, 9u, 0x2710B3ADu, 0xB88C3904u},
        {42ull, PSAGG_RNG_SERVER, 1, 160, 5, 12345u, 0x5A5D0A42u, 0xE4AC51BFu},
        {18446744073709551615ull, PSAGG_RNG_SERVER, 255, 1048575, 4095, 4294967295u, 0x6B828058u,
         0x27ACEC02u},
        {7ull, PSAGG_RNG_WORKER, 1023, 1, 0, 1u, 0x16D9583Du, 0x2DCA8267u},
    };
    uint64_t s = 99;
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) {
        psagg__rng_key k = psagg__rng_chunk_key(golden[i].seed, golden[i].side, golden[i].rank,
                                                golden[i].key, golden[i].chunk, golden[i].round);
        CHECK(k.k0 == golden[i].k0 && k.k1 == golden[i].k1,
              "golden %zu: key %08x %08x, expected %08x %08x", i, k.k0, k.k1, golden[i].k0,
              golden[i].k1);
    }
    for (int i = 0; i < 10000; i++) {
        uint64_t seed = test_rand64(&s);
        uint32_t rank = (uint32_t)test_rand64(&s) % 1024, key = (uint32_t)test_rand64(&s);
        uint32_t chunk = (uint32_t)test_rand64(&s), round = (uint32_t)test_rand64(&s);
        psagg__rng_side side = i & 1 ? PSAGG_RNG_SERVER : PSAGG_RNG_WORKER;
        uint64_t stream =
            spec_mix64(spec_mix64((uint64_t)side << 32 | rank, (uint64_t)key << 32 | chunk), round);
        psagg__rng_key a = psagg__rng_chunk_key(seed, side, rank, key, chunk, round);
        psagg__rng_key b = psagg__rng_key_make(seed, stream);
        CHECK(a.k0 == b.k0 && a.k1 == b.k1, "key %d differs from codec.h's derivation", i);
    }
    /* the two sides never share a stream for the same (rank, tensor, chunk, round) */
    {
        psagg__rng_key w = psagg__rng_chunk_key(1, PSAGG_RNG_WORKER, 0, 5, 0, 3);
        psagg__rng_key v = psagg__rng_chunk_key(1, PSAGG_RNG_SERVER, 0, 5, 0, 3);
        CHECK(w.k0 != v.k0 || w.k1 != v.k1, "worker and server streams coincide");
    }
    printf("RNG chunk keys: 5 golden keys of the previous code, 10000 against codec.h's text\n");
}

static void test_codec_text(void)
{
    static const char *const names[] = {"fp32",
                                        "fp16",
                                        "bf16",
                                        "maxmin1",
                                        "maxmin:8",
                                        "maxmin4/512/nearest",
                                        "maxmin2/sr/64",
                                        "maxmin3/1048576",
                                        "topk2:0.02",
                                        "topk4:7/256",
                                        "topk8:4096/4096/nearest"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        psagg_codec c, d;
        char buf[64];
        CHECK(psagg_codec_parse(names[i], &c) == PSAGG_OK, "%s: %s", names[i], psagg_last_error());
        CHECK(psagg__codec_check(&c) == PSAGG_OK, "%s: %s", names[i], psagg_last_error());
        CHECK(psagg_codec_parse(psagg_codec_name(&c, buf, sizeof buf), &d) == PSAGG_OK &&
                  psagg__codec_check(&d) == PSAGG_OK && !memcmp(&c, &d, sizeof c),
              "%s -> %s does not parse back to the same codec", names[i], buf);
    }
    CHECK(psagg_codec_parse("maxmin9", &(psagg_codec){0}) == PSAGG_EINVAL, "maxmin9 accepted");
    CHECK(strstr(psagg_last_error(), "maxmin9"), "message: %s", psagg_last_error());
    {
        psagg_codec c;
        char buf[64];
        CHECK(!psagg_codec_parse("topk2:0.02", &c) && !psagg__codec_check(&c) && c.k == 82 &&
                  c.bucket == 4096 && c.bits == 2,
              "topk2:0.02 is not k 82 of 4096 at 2 bits: %s",
              psagg_codec_name(&c, buf, sizeof buf));
        CHECK(!psagg_codec_parse("topk2:0.01/256", &c) && c.k == 3, "topk2:0.01/256: k %u", c.k);
        static const struct {
            const char *text, *says;
        } bad[] = {{"topk1:0.02", "bits 2..8"},       {"topk2", "bits 2..8"},
                   {"topk2:0", "neither a fraction"}, {"topk2:1.5", "neither a fraction"},
                   {"topk2:x", "neither a fraction"}, {"topk9:0.1", "bits 2..8"}};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
            CHECK(psagg_codec_parse(bad[i].text, &c) == PSAGG_EINVAL &&
                      strstr(psagg_last_error(), bad[i].says),
                  "%s: %s", bad[i].text, psagg_last_error());
        /* a spelling the parser takes, a codec the check refuses (names the field) */
        CHECK(!psagg_codec_parse("topk2:5000", &c) && psagg__codec_check(&c) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "k 5000"),
              "topk2:5000 of 4096: %s", psagg_last_error());
        CHECK(!psagg_codec_parse("topk2:0.1/300", &c) && psagg__codec_check(&c) == PSAGG_EINVAL &&
                  strstr(psagg_last_error(), "block 300"),
              "topk2:0.1/300: %s", psagg_last_error());
    }
    printf("codec text: %zu names round-trip\n", sizeof names / sizeof names[0]);
}

int main(void)
{
    test_max_chunk_bytes();
    test_chunk_keys();
    test_codec_text();
    printf("test_codec_chunks: ok\n");
    return 0;
}
