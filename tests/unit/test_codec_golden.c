/*
 * test_codec_golden.c - golden vectors that pin the wire formats of kernels/codec.h:
 * hand-derived small cases (derivations in the comments), the RNG's values for a fixed key,
 * and FNV-1a hashes of a larger deterministic case for every codec (with and without error
 * feedback). The hashes were computed by an independent Python implementation of codec.h
 * (float32 operations as double + one rounding to binary32, which is exact for + - * /
 * because 53 >= 2*24 + 2; fp16 via struct 'e' (round-to-nearest-even); bf16 and the RNG with
 * Python integers), not by this library. Every available ISA must reproduce them. The maxmin
 * and RNG values of format version 2 come from tests/unit/codec_reference.py (numpy float32),
 * which also reproduces every nearest-rounding hash of version 1.
 */
#include "test_codec_util.h"

static void expect_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t len)
{
    for (size_t i = 0; i < len; i++)
        CHECK(got[i] == want[i], "%s (isa %s): byte %zu is %02x, expected %02x", what,
              psagg__isa_name(psagg__codec_isa()), i, got[i], want[i]);
}

static void test_rng(void)
{
    /* key64 = splitmix64(1 ^ splitmix64(2)) = 0xe06dd043328bd285 */
    psagg__rng_key k = psagg__rng_key_make(1, 2);
    CHECK(k.k0 == 0x328bd285u && k.k1 == 0xe06dd043u, "key(1,2) = %08x %08x", k.k0, k.k1);
    /* u_k of format version 2 (tests/unit/codec_reference.py) */
    CHECK(psagg__rng_uniform(k, 0) == 0x1.a45p-5f, "u0 %a", psagg__rng_uniform(k, 0));
    CHECK(psagg__rng_uniform(k, 1) == 0x1.234fp-1f, "u1 %a", psagg__rng_uniform(k, 1));
    CHECK(psagg__rng_uniform(k, 2) == 0x1.40d6p-2f, "u2 %a", psagg__rng_uniform(k, 2));
    CHECK(psagg__rng_uniform(k, 3) == 0x1.c448p-4f, "u3 %a", psagg__rng_uniform(k, 3));
    CHECK(psagg__rng_uniform(k, 1000) == 0x1.e1aep-2f, "u1000 %a", psagg__rng_uniform(k, 1000));
    CHECK(psagg__rng_uniform(k, 0xFFFFFFFFu) == 0x1.2c7cp-3f, "u(2^32-1) %a",
          psagg__rng_uniform(k, 0xFFFFFFFFu));
}

/*
 * maxmin, b = 3, B = 64, nearest, n = 10, x = {0,1,2,3,4,5,6,7,3.5,0.2}:
 *   lo = 0, hi = 7, range = 7, L = 7, scale = 7/7 = 1, inv = 1, t_k = x_k
 *   q = trunc(min(t + 0.5, 7)) = {0,1,2,3,4,5,6,7,4,0}
 *   meta: scale 1.0f = 0x3F800000 -> 00 00 80 3f, min 0.0f -> 00 00 00 00
 *   payload: sum q_k << 3k = 8 + 2<<6 + 3<<9 + 4<<12 + 5<<15 + 6<<18 + 7<<21 + 4<<24
 *          = 0x04FAC688 -> 88 c6 fa 04, zero-padded to 8*ceil(30/64) = 8 bytes.
 *   decode: lo + scale*q = q exactly.
 */
static void test_maxmin_hand(void)
{
    static const float x[10] = {0, 1, 2, 3, 4, 5, 6, 7, 3.5f, 0.2f};
    static const uint8_t want[16] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x00,
                                     0x88, 0xc6, 0xfa, 0x04, 0x00, 0x00, 0x00, 0x00};
    static const float want_dec[10] = {0, 1, 2, 3, 4, 5, 6, 7, 4, 0};
    psagg_codec c = tc_codec(PSAGG_CODEC_MAXMIN, 3, 64, PSAGG_ROUND_NEAREST);
    uint8_t out[16];
    float dec[10];
    CHECK(psagg__encoded_size(&c, 10) == 16, "size %zu", psagg__encoded_size(&c, 10));
    memset(out, 0xEE, sizeof out);
    CHECK(psagg__encode(&c, x, NULL, 10, psagg__rng_key_make(0, 0), out, 16, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    expect_bytes("maxmin3 hand case", out, want, 16);
    CHECK(psagg__decode(&c, out, 16, 10, dec) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(!memcmp(dec, want_dec, sizeof dec), "maxmin3 hand case decode");
}

/*
 * maxmin, b = 2, B = 64, nearest, n = 3, x = {-1, -1, -1} (a constant bucket):
 *   range = 0 < 2^-100 -> scale = 0, q = 0; meta = {0x00000000, -1.0f = 0xBF800000};
 *   payload 8 zero bytes. Then x = {-0, +0, 0.5}: lo = -0 (-0 < +0), hi = 0.5, range = 0.5,
 *   L = 3, scale = 0.5/3 = 0x3E2AAAAB, inv = 1/scale = 0x40C00000 (6.0f, rounded);
 *   t = {0, 0, 0.5*6 = 3}, q = trunc(min(t + 0.5, 3)) = {0, 0, 3} -> payload byte 0x30.
 */
static void test_maxmin_hand2(void)
{
    static const float x1[3] = {-1, -1, -1}, x2[3] = {-0.0f, 0.0f, 0.5f};
    static const uint8_t want1[16] = {0, 0, 0, 0, 0x00, 0x00, 0x80, 0xbf, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t want2[16] = {0xab, 0xaa, 0x2a, 0x3e, 0x00, 0x00, 0x00, 0x80,
                                      0x30, 0,    0,    0,    0,    0,    0,    0};
    psagg_codec c = tc_codec(PSAGG_CODEC_MAXMIN, 2, 64, PSAGG_ROUND_NEAREST);
    uint8_t out[16];
    float dec[3];
    CHECK(psagg__encode(&c, x1, NULL, 3, psagg__rng_key_make(0, 0), out, 16, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    expect_bytes("maxmin2 constant bucket", out, want1, 16);
    CHECK(psagg__decode(&c, out, 16, 3, dec) == PSAGG_OK && dec[0] == -1 && dec[2] == -1,
          "constant decode");
    CHECK(psagg__encode(&c, x2, NULL, 3, psagg__rng_key_make(0, 0), out, 16, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    expect_bytes("maxmin2 signed zeros", out, want2, 16);
}

/*
 * fp16 (round to nearest even, subnormals kept):
 *   1.0 -> 0x3C00; -2.5 -> 0xC100; 65504 (max) -> 0x7BFF; 65519 -> 0x7BFF (below the tie);
 *   2^-24 -> 0x0001; 0.75*2^-24 -> 0x0001; 2^-25 (tie with 0) -> 0x0000 (even);
 *   1 + 2^-11 (tie) -> 0x3C00 (even); 1 + 3*2^-11 (tie) -> 0x3C02 (even); -0 -> 0x8000;
 *   2^-14 (smallest normal) -> 0x0400; 2^-14 - 2^-25 (tie between 0x03FF and 0x0400) ->
 *   0x0400 (even); 1.5*2^-24 (tie between 1 and 2 units) -> 0x0002.
 * bf16 (u + 0x7FFF + ((u >> 16) & 1)) >> 16:
 *   1.0 -> 0x3F80; 1 + 2^-8 (tie) -> 0x3F80; 1 + 3*2^-8 (tie) -> 0x3F82;
 *   bits 0x00018000 (subnormal, tie) -> 0x0002; bits 0x00008000 (tie) -> 0x0000;
 *   -1.5 -> 0xBFC0; 0x7F7F7FFF (just below the rounding point) -> 0x7F7F.
 */
static void test_fp_hand(void)
{
    const float xh[13] = {
        1.0f,      -2.5f,           65504.0f,        65519.0f, 0x1p-24f, 0.75f * 0x1p-24f,
        0x1p-25f,  1.0f + 0x1p-11f, 1.0f + 0x3p-11f, -0.0f,    0x1p-14f, 0x1p-14f - 0x1p-25f,
        0x1.8p-24f};
    const uint16_t wh[13] = {0x3C00, 0xC100, 0x7BFF, 0x7BFF, 0x0001, 0x0001, 0x0000,
                             0x3C00, 0x3C02, 0x8000, 0x0400, 0x0400, 0x0002};
    const float xb[7] = {
        1.0f,  1.0f + 0x1p-8f,     1.0f + 0x3p-8f, tc_u2f(0x00018000u), tc_u2f(0x00008000u),
        -1.5f, tc_u2f(0x7F7F7FFFu)};
    const uint16_t wb[7] = {0x3F80, 0x3F80, 0x3F82, 0x0002, 0x0000, 0xBFC0, 0x7F7F};
    psagg_codec h = tc_codec(PSAGG_CODEC_FP16, 0, 0, PSAGG_ROUND_NEAREST);
    psagg_codec b = tc_codec(PSAGG_CODEC_BF16, 0, 0, PSAGG_ROUND_NEAREST);
    psagg_codec f = tc_codec(PSAGG_CODEC_FP32, 0, 0, PSAGG_ROUND_NEAREST);
    uint16_t out[13];
    float dec[13], res[13];
    for (int i = 0; i < 13; i++)
        res[i] = 0.0f;
    CHECK(psagg__encode(&h, xh, NULL, 13, psagg__rng_key_make(0, 0), out, 26, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    expect_bytes("fp16 hand cases", (const uint8_t *)out, (const uint8_t *)wh, 26);
    CHECK(psagg__decode(&h, out, 26, 13, dec) == PSAGG_OK, "%s", psagg_last_error());
    /* with a zero residual: v = x + 0 (so -0 becomes +0) and r = v - decode(v) */
    CHECK(psagg__encode(&h, xh, res, 13, psagg__rng_key_make(0, 0), out, 26, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    for (int i = 0; i < 13; i++)
        CHECK(res[i] == xh[i] - dec[i], "fp16 residual %d: %a vs %a", i, res[i], xh[i] - dec[i]);
    CHECK(out[9] == 0x0000, "fp16 of -0 + 0 is +0");
    CHECK(dec[4] == 0x1p-24f && dec[2] == 65504.0f && dec[12] == 0x1p-23f, "fp16 decode");
    CHECK(psagg__encode(&b, xb, NULL, 7, psagg__rng_key_make(0, 0), out, 14, NULL) == PSAGG_OK,
          "%s", psagg_last_error());
    expect_bytes("bf16 hand cases", (const uint8_t *)out, (const uint8_t *)wb, 14);
    CHECK(psagg__decode(&b, out, 14, 7, dec) == PSAGG_OK, "%s", psagg_last_error());
    CHECK(dec[2] == 1.0f + 0x1p-6f && tc_f2u(dec[3]) == 0x00020000u, "bf16 decode");
    {
        /* fp32 copies, little-endian: 1.0f -> 00 00 80 3f; with a residual r = 0 after */
        const float xf[2] = {1.0f, -0.0f};
        const uint8_t wf[8] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x80};
        uint8_t of[8];
        CHECK(psagg__encode(&f, xf, NULL, 2, psagg__rng_key_make(0, 0), of, 8, NULL) == PSAGG_OK,
              "%s", psagg_last_error());
        expect_bytes("fp32 copy", of, wf, 8);
    }
}

/* The larger deterministic case (same generator as the Python reference). */
#define GN 5000
static float gx(size_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) >> 8;
    int e = (int)((i / 1024) % 7) - 3;
    return ldexpf((float)h * 0x1p-22f - 2.0f, e);
}

static float gr(size_t i)
{
    return (float)((int)((i * 7919) % 201) - 100) * 0x1p-12f;
}

static const struct golden {
    psagg_codec c;
    uint64_t h_plain, h_ef, h_res;
} goldens[] = {
    {{PSAGG_CODEC_FP32, 0, 0, 0, 0},
     0x4069e70482d254d1ull,
     0x9f8d89e233efa479ull,
     0x0ed9e7ee21f20da5ull},
    {{PSAGG_CODEC_FP16, 0, 0, 0, 0},
     0x281e8a7d1ca7a4faull,
     0x4e552274b662ac5full,
     0x59b259183bd60270ull},
    {{PSAGG_CODEC_BF16, 0, 0, 0, 0},
     0xa5e6e90c5443746eull,
     0x2131b2776a6b84d4ull,
     0x35986591bde63b13ull},
    {{PSAGG_CODEC_MAXMIN, 1, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0xd3221fd2206c30ccull,
     0xbaba87f3d93a7a17ull,
     0xfa7ba9bb55080202ull},
    {{PSAGG_CODEC_MAXMIN, 1, 64, PSAGG_ROUND_NEAREST, 0},
     0xa3166165f321b239ull,
     0x9ffc0029eda5c7b0ull,
     0x94ca8dd14cebefbeull},
    {{PSAGG_CODEC_MAXMIN, 2, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0xda78385d7ebc3702ull,
     0x0a18fb45e71524fbull,
     0x63203ff279f280e9ull},
    {{PSAGG_CODEC_MAXMIN, 2, 64, PSAGG_ROUND_NEAREST, 0},
     0x11bb1995450890c5ull,
     0x8eb026b61d4877b4ull,
     0x5787598b8a965db3ull},
    {{PSAGG_CODEC_MAXMIN, 3, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0x3dcd83979de2a670ull,
     0x78f294dcd9a501e1ull,
     0x374ab45b0db16e6cull},
    {{PSAGG_CODEC_MAXMIN, 3, 64, PSAGG_ROUND_NEAREST, 0},
     0x37609bc3f45268baull,
     0x1cb2a7e37369a283ull,
     0x809bf390f7f92069ull},
    {{PSAGG_CODEC_MAXMIN, 4, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0x9bb695808836b855ull,
     0xc45896a01a0338f3ull,
     0xbda3b1a5ded4bb2bull},
    {{PSAGG_CODEC_MAXMIN, 4, 64, PSAGG_ROUND_NEAREST, 0},
     0xbd16317e0f920702ull,
     0xa437a97c3a9713e1ull,
     0xe2cb47f50cfa0ff7ull},
    {{PSAGG_CODEC_MAXMIN, 5, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0x9969e6f126af4e7cull,
     0xc674be9bd8e86d9dull,
     0x9254e1a7676fdae6ull},
    {{PSAGG_CODEC_MAXMIN, 5, 64, PSAGG_ROUND_NEAREST, 0},
     0xd2f995586f24184full,
     0xa203bb29c31ea7fbull,
     0xa6d38a5cdb5a24b9ull},
    {{PSAGG_CODEC_MAXMIN, 6, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0x41544b594f8c37f1ull,
     0x0e30a32dd69c9d49ull,
     0xefac02d2e13ede8aull},
    {{PSAGG_CODEC_MAXMIN, 6, 64, PSAGG_ROUND_NEAREST, 0},
     0xfdc0984cae68f422ull,
     0xb90fd9c180db984full,
     0x4d210c43b7e6db3cull},
    {{PSAGG_CODEC_MAXMIN, 7, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0x53148cbd520f67c6ull,
     0x6c42bb7b72ef4c63ull,
     0xd5329aaf42269af6ull},
    {{PSAGG_CODEC_MAXMIN, 7, 64, PSAGG_ROUND_NEAREST, 0},
     0xd9d418d9add85195ull,
     0x56e9a14f448c8db0ull,
     0xa09fff090b0e9056ull},
    {{PSAGG_CODEC_MAXMIN, 8, 64, PSAGG_ROUND_STOCHASTIC, 0},
     0x2455eb3cf0c26e04ull,
     0x6f22427d9fcf5562ull,
     0x9cd61d75de43dd19ull},
    {{PSAGG_CODEC_MAXMIN, 8, 64, PSAGG_ROUND_NEAREST, 0},
     0x88525f17bc1d2c89ull,
     0xea0da519b8fae7b9ull,
     0x2fcb94837895d816ull},
    {{PSAGG_CODEC_MAXMIN, 1, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0xcc09d9588f906a79ull,
     0x9ee2edab2f366aebull,
     0xe3b3a0dbf6258d9dull},
    {{PSAGG_CODEC_MAXMIN, 1, 1024, PSAGG_ROUND_NEAREST, 0},
     0x4637498abdfc9f3cull,
     0x78ba21223e2c11ddull,
     0xa903898a4fb23360ull},
    {{PSAGG_CODEC_MAXMIN, 2, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0xb7b12490f6f3c8dcull,
     0x53d10890cc7614b2ull,
     0x44c4ef7d7f557c3dull},
    {{PSAGG_CODEC_MAXMIN, 2, 1024, PSAGG_ROUND_NEAREST, 0},
     0xc47fcdf7eace4993ull,
     0x3775f8a00f71c12cull,
     0xdb8e085ed7573d80ull},
    {{PSAGG_CODEC_MAXMIN, 3, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0xe6c8038257ec5978ull,
     0x6072b250e495a7d9ull,
     0xba389cddc7a940c5ull},
    {{PSAGG_CODEC_MAXMIN, 3, 1024, PSAGG_ROUND_NEAREST, 0},
     0x15278674dbf796a2ull,
     0xa57ae6bf2ad29493ull,
     0x4d272fe98cac4166ull},
    {{PSAGG_CODEC_MAXMIN, 4, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0x620862a8a319c459ull,
     0x0b2cd2b2799e0f22ull,
     0x5b35cc050e4cb61cull},
    {{PSAGG_CODEC_MAXMIN, 4, 1024, PSAGG_ROUND_NEAREST, 0},
     0x6e2f213f2bed846full,
     0x0ce36cca9ab738efull,
     0x2c843d4a0e34113aull},
    {{PSAGG_CODEC_MAXMIN, 5, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0x1354a63e13ec4213ull,
     0x6823f1652b08bdefull,
     0x5e2a1d0f0d0b65f8ull},
    {{PSAGG_CODEC_MAXMIN, 5, 1024, PSAGG_ROUND_NEAREST, 0},
     0x6a8237dc5954a285ull,
     0x2a65c3e120d96602ull,
     0xa3f5dd5512cceab3ull},
    {{PSAGG_CODEC_MAXMIN, 6, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0xb0ef16945af40b0cull,
     0xbcfd4659df323007ull,
     0x43dd3473e1d1be9aull},
    {{PSAGG_CODEC_MAXMIN, 6, 1024, PSAGG_ROUND_NEAREST, 0},
     0xa531b62d2323ae59ull,
     0xca2f4e81fe4e4556ull,
     0x307de92890964430ull},
    {{PSAGG_CODEC_MAXMIN, 7, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0x17457c2b91296797ull,
     0x1cce04aa20553048ull,
     0x9349914c469ed526ull},
    {{PSAGG_CODEC_MAXMIN, 7, 1024, PSAGG_ROUND_NEAREST, 0},
     0x8971cf099bc80115ull,
     0x703c1392ae0cd8eeull,
     0xf37bf228d32b3228ull},
    {{PSAGG_CODEC_MAXMIN, 8, 1024, PSAGG_ROUND_STOCHASTIC, 0},
     0x8cabddf121f74853ull,
     0x42110ff29de2be77ull,
     0x82aaf73b52db9a38ull},
    {{PSAGG_CODEC_MAXMIN, 8, 1024, PSAGG_ROUND_NEAREST, 0},
     0xbb084f52d04e4eacull,
     0x6c9d1efd1e24356aull,
     0x0c8a646529f108d0ull},
};

static void test_large(void)
{
    float *x = tc_xmalloc(GN * 4), *r = tc_xmalloc(GN * 4);
    uint8_t *out = tc_xmalloc(4 * GN);
    psagg__rng_key key = psagg__rng_key_make(42, 7);
    for (size_t i = 0; i < GN; i++)
        x[i] = gx(i);
    for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
        psagg_codec c = goldens[g].c;
        size_t len;
        uint64_t h;
        CHECK(psagg__codec_check(&c) == PSAGG_OK, "%s", psagg_last_error());
        len = psagg__encoded_size(&c, GN);
        CHECK(psagg__encode(&c, x, NULL, GN, key, out, len, NULL) == PSAGG_OK, "%s",
              psagg_last_error());
        h = tc_hash(out, len);
        CHECK(h == goldens[g].h_plain, "golden %s (isa %s): hash %016llx, expected %016llx",
              tc_name(&c), psagg__isa_name(psagg__codec_isa()), (unsigned long long)h,
              (unsigned long long)goldens[g].h_plain);
        for (size_t i = 0; i < GN; i++)
            r[i] = gr(i);
        CHECK(psagg__encode(&c, x, r, GN, key, out, len, NULL) == PSAGG_OK, "%s",
              psagg_last_error());
        h = tc_hash(out, len);
        CHECK(h == goldens[g].h_ef, "golden EF %s (isa %s): hash %016llx, expected %016llx",
              tc_name(&c), psagg__isa_name(psagg__codec_isa()), (unsigned long long)h,
              (unsigned long long)goldens[g].h_ef);
        h = tc_hash(r, GN * 4);
        CHECK(h == goldens[g].h_res, "golden residual %s (isa %s): hash %016llx, expected %016llx",
              tc_name(&c), psagg__isa_name(psagg__codec_isa()), (unsigned long long)h,
              (unsigned long long)goldens[g].h_res);
    }
    free(x);
    free(r);
    free(out);
}

int main(void)
{
    test_rng();
    for (int isa = 0; isa < PSAGG_ISA_COUNT; isa++) {
        if (!psagg__isa_supported((psagg__isa)isa)) {
            printf("SKIP isa %s: not supported here\n", psagg__isa_name((psagg__isa)isa));
            continue;
        }
        tc_set_isa((psagg__isa)isa);
        test_maxmin_hand();
        test_maxmin_hand2();
        test_fp_hand();
        test_large();
        printf("isa %s: golden vectors match\n", psagg__isa_name((psagg__isa)isa));
    }
    return 0;
}
