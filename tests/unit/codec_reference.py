#!/usr/bin/python3
"""codec_reference.py - an independent implementation of kernels/codec.h's maxmin format
and RNG, written from the header's text alone, that computes the golden values of
test_codec_golden.c: the RNG's u_k for a fixed key and the FNV-1a hashes of the large case
(GN elements, key (42, 7), with and without error feedback, and the residual).

binary32 arithmetic is numpy float32 (one IEEE operation, round-to-nearest-even, each);
integers are Python's. It prints C initialisers; it never reads the library.

    /usr/bin/python3 tests/unit/codec_reference.py     (numpy, from Debian's python3-numpy)
"""
import struct

import numpy as np

F = np.float32
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
GN = 5000


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def key_make(seed, stream):
    k = splitmix64(seed ^ splitmix64(stream))
    return k & M32, k >> 32


def hash32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def uniform(key, k):
    k0, k1 = key
    h = hash32((((k >> 1) ^ k1) + k0) & M32)
    d = (h >> (16 * (k & 1))) & 0xFFFF
    return F(2 * d + 1) * F(2.0**-17)


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def gx(i):
    h = ((i * 2654435761) & M32) >> 8
    e = (i // 1024) % 7 - 3
    return F(np.ldexp(F(h) * F(2.0**-22) - F(2.0), e))


def gr(i):
    return F(((i * 7919) % 201) - 100) * F(2.0**-12)


def is_neg_zero(v):
    return v == 0 and struct.pack("<f", v)[3] & 0x80


def maxmin_encode(x, r, bits, bucket, sr, key):
    """Returns (encoded bytes, residual or None)."""
    n = len(x)
    L = F((1 << bits) - 1)
    nb = (n + bucket - 1) // bucket
    meta = bytearray()
    levels = []
    res = None if r is None else list(r)
    for m in range(nb):
        lo_i, hi_i = m * bucket, min(n, (m + 1) * bucket)
        v = [x[k] if r is None else F(x[k] + r[k]) for k in range(lo_i, hi_i)]
        lo = min(v)
        if lo == 0 and any(is_neg_zero(t) for t in v):
            lo = F(-0.0)
        hi = max(v)
        rng = F(hi - lo)
        scale, inv = F(0.0), F(0.0)
        const = rng < F(2.0**-100)
        if not const:
            scale = F(rng / L)
            inv = F(F(1.0) / scale)
        meta += struct.pack("<ff", scale, lo)
        for j, vk in enumerate(v):
            k = lo_i + j
            q = 0
            if not const:
                t = F(F(vk - lo) * inv)
                u = uniform(key, k) if sr else F(0.5)
                mm = F(t + u)
                if mm > L:
                    mm = L
                q = int(mm)
            levels.append(q)
            if res is not None:
                res[k] = F(vk - F(lo + F(scale * F(q))))
    acc = 0
    for k, q in enumerate(levels):
        acc |= q << (k * bits)
    plen = 8 * ((n * bits + 63) // 64)
    return bytes(meta) + acc.to_bytes(plen, "little"), res


def main():
    key = key_make(1, 2)
    print("/* key(1, 2) = %08x %08x */" % key)
    for k in (0, 1, 2, 3, 1000, 0xFFFFFFFF):
        print("u(%d) = %s" % (k, float(uniform(key, k)).hex()))
    x = [gx(i) for i in range(GN)]
    r0 = [gr(i) for i in range(GN)]
    key = key_make(42, 7)
    for bucket in (64, 1024):
        for bits in range(1, 9):
            for sr in (True, False):
                plain, _ = maxmin_encode(x, None, bits, bucket, sr, key)
                ef, res = maxmin_encode(x, r0, bits, bucket, sr, key)
                rb = struct.pack("<%df" % GN, *res)
                print("    {{PSAGG_CODEC_MAXMIN, %d, %d, PSAGG_ROUND_%s},\n     0x%016xull,\n"
                      "     0x%016xull,\n     0x%016xull}," %
                      (bits, bucket, "STOCHASTIC" if sr else "NEAREST", fnv1a(plain), fnv1a(ef),
                       fnv1a(rb)))


if __name__ == "__main__":
    main()
