#!/usr/bin/python3
"""topk_index_bits.py - how many bits the sparse codec's indices would take delta-coded.

kernels/topk.h packs each kept index in log2(C) bits (12 for blocks of 4096): a fixed size,
known before the encode, which every psagg buffer has. The alternative is to code the gaps
between consecutive kept indices, e.g. Golomb-Rice (quotient in unary, remainder in r bits; the
best r per block, named in 4 bits). This measures both on real pseudo-gradients: the digits CNN
of worker/examples/train_digits.py trained H inner steps from its initial weights (SGD, momentum
0.9, lr 0.05, batch 32), the pseudo-gradient (initial - trained) split into blocks of C, the top
k = round(fraction x C) of each block kept (as topk<b>:<fraction>), and iid Gaussian blocks for
comparison. Prints bits per kept index: fixed, Rice, and Rice's share of fixed.

Usage: /usr/bin/python3 tests/bench/topk_index_bits.py [--h 50] [--block 4096]
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "worker", "examples"))
from train_digits import Net, load_digits  # noqa: E402


SMALL = 256  # [codec] min_compress_elems of bench-diloco.sh: smaller tensors go in fp32


def rice_bits(sorted_idx, r):
    """Bits of the gaps (the first index from -1) coded Golomb-Rice with parameter r."""
    bits, last = 0, -1
    for i in sorted_idx:
        gap = i - last - 1
        bits += (gap >> r) + 1 + r
        last = i
    return bits


def measure(v, block, frac):
    fixed = rice = kept = 0
    ib = int(math.log2(block))
    if v.numel() < SMALL:
        return 0, 0, 0  # a small tensor goes in fp32
    for base in range(0, v.numel(), block):
        blk = v[base:base + block]
        k = min(max(1, round(frac * block)), blk.numel())
        idx = sorted(torch.topk(blk.abs(), k).indices.tolist())
        fixed += k * ib
        rice += 4 + min(rice_bits(idx, r) for r in range(ib))
        kept += k
    return fixed, rice, kept


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h", type=int, default=50)
    ap.add_argument("--block", type=int, default=4096)
    a = ap.parse_args()
    torch.manual_seed(0)
    xtr, ytr, _, _ = load_digits()
    net = Net()
    start = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(a.h):
        idx = torch.randint(0, len(ytr), (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
        opt.step()
    pg = [(s - p.detach()).flatten() for s, p in zip(start, net.parameters())]
    print("source, fraction kept, bits per kept index: fixed, Golomb-Rice (best r per block), "
          "Rice / fixed")
    for frac in (0.01, 0.02, 0.05, 0.1):
        for name, vs in (("digits CNN pseudo-gradient H=%d" % a.h, pg),
                         ("iid Gaussian", [torch.randn(1 << 20, generator=g)])):
            f = r = n = 0
            for v in vs:
                df, dr, dn = measure(v, a.block, frac)
                f, r, n = f + df, r + dr, n + dn
            print("%s, %.2f, %.2f, %.2f, %.2f" % (name, frac, f / n, r / n, r / f))


if __name__ == "__main__":
    main()
