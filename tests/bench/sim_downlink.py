#!/usr/bin/python3
"""sim_downlink.py - which downlink for sparse outer gradients: a single-process simulation.

How should the servers send DiLoCo's outer update back when the workers push sparse
pseudo-gradients (topk2:0.02)? The union of the W workers' top-k sets can hold up to W * k
entries. This script trains the digits CNN of worker/examples/train_digits.py as DiLoCo with W
workers in one process (each its own shard, batch and inner SGD as that example: momentum 0.9,
lr 0.05; the outer step plain SGD at lr 0.7, SparseLoCo's) and compares three downlinks of the
servers' weight delta, each against the workers' view of the global weights (what the servers
do: the delta is w - view, and what a downlink leaves out stays in it, the servers' error
feedback):

  resparsify  the delta re-sparsified in the push's codec: k per block (psagg's choice today)
  union       the delta on the union of the workers' kept indices (per block), 2-bit values as
              the codec's, a variable size
  dense4      the delta in maxmin4 (4 bits, buckets of 1024, stochastic rounding)

The codecs are written out here in torch after kernels/topk.h and kernels/codec.h (top k of
|v| per block of 4096, values sign + (b - 1) bits between the smallest and the largest kept
magnitude, stochastic rounding; maxmin: 2^b - 1 levels between a bucket's min and max); the
bytes are the formats' exact sizes. It is a model of the system, for a design choice: the
figures in docs/results.md that come from psagg itself are bench-diloco.sh's.

Usage: /usr/bin/python3 tests/bench/sim_downlink.py [--seeds 3] [--steps 300] [--h 15,50]
Prints one CSV line per run and a summary (mean and spread over the seeds).
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

BLOCK, KEEP, BITS = 4096, 0.02, 2
SMALL = 256  # [codec] min_compress_elems of bench-diloco.sh: smaller tensors go in fp32


def topk_blocks(v, gen, keep_idx=None):
    """v (flat) through topk<BITS>: returns (decoded, bytes). keep_idx: per block, the indices
    to keep instead of the top k (the union downlink), as a list of tensors."""
    out = torch.zeros_like(v)
    nbytes = 0
    levels = (1 << (BITS - 1)) - 1
    ib = int(math.log2(BLOCK))
    for m, base in enumerate(range(0, v.numel(), BLOCK)):
        blk = v[base:base + BLOCK]
        if keep_idx is None:
            k = min(max(1, round(KEEP * BLOCK)), blk.numel())
            idx = torch.topk(blk.abs(), k, sorted=False).indices
        else:
            idx = keep_idx[m]
            if idx.numel() == 0:
                nbytes += 8
                continue
        a = blk[idx].abs()
        lo, hi = a.min(), a.max()
        scale = (hi - lo) / levels if levels and hi - lo > 1e-30 else torch.tensor(0.0)
        if scale > 0:
            u = torch.rand(a.shape, generator=gen)
            q = torch.clamp(torch.floor((a - lo) / scale + u), max=levels)
        else:
            q = torch.zeros_like(a)
        y = (lo + scale * q) * torch.sign(blk[idx])
        out[base + idx] = y
        nbytes += 8 + math.ceil(idx.numel() * ib / 8) + math.ceil(idx.numel() * BITS / 8)
    return out, nbytes


def kept_sets(v):
    """Per block of v (flat), the indices a top-k push keeps."""
    sets = []
    for base in range(0, v.numel(), BLOCK):
        blk = v[base:base + BLOCK]
        k = min(max(1, round(KEEP * BLOCK)), blk.numel())
        sets.append(torch.topk(blk.abs(), k, sorted=False).indices)
    return sets


def maxmin4(v, gen, bucket=1024):
    out = torch.empty_like(v)
    for base in range(0, v.numel(), bucket):
        b = v[base:base + bucket]
        lo, hi = b.min(), b.max()
        scale = (hi - lo) / 15
        if scale > 0:
            q = torch.clamp(torch.floor((b - lo) / scale + torch.rand(b.shape, generator=gen)),
                            max=15)
            out[base:base + bucket] = lo + scale * q
        else:
            out[base:base + bucket] = b
    return out, math.ceil(v.numel() / 2) + 8 * math.ceil(v.numel() / bucket)


def run(downlink, h, seed, steps, workers, batch):
    xtr, ytr, xte, yte = load_digits()
    torch.manual_seed(seed)
    global_net = Net()
    nets = [Net() for _ in range(workers)]
    for n in nets:
        n.load_state_dict(global_net.state_dict())
    opts = [torch.optim.SGD(n.parameters(), lr=0.05, momentum=0.9) for n in nets]
    shards = [torch.arange(r, len(ytr), workers) for r in range(workers)]
    gens = [torch.Generator().manual_seed(seed * 1000 + r) for r in range(workers)]
    qgen = torch.Generator().manual_seed(seed + 99)
    w = [p.detach().clone() for p in global_net.parameters()]  # the servers' weights
    view = [p.clone() for p in w]  # what the workers hold (the anchors)
    res = [[torch.zeros_like(p).flatten() for p in w] for _ in range(workers)]
    up = down = 0
    outer = 0
    for t in range(1, steps + 1):
        for r in range(workers):
            idx = shards[r][torch.randint(0, len(shards[r]), (batch,), generator=gens[r])]
            opts[r].zero_grad()
            F.cross_entropy(nets[r](xtr[idx]), ytr[idx]).backward()
            opts[r].step()
        if t % h:
            continue
        outer += 1
        with torch.no_grad():
            for i, a in enumerate(view):
                n = a.numel()
                acc = torch.zeros(n)
                sets = []
                for r in range(workers):
                    pg = (a - list(nets[r].parameters())[i].detach()).flatten()
                    if n < SMALL:
                        acc += pg
                        up += 4 * n
                        continue
                    v = pg + res[r][i]
                    sets.append(kept_sets(v))
                    y, nb = topk_blocks(v, qgen, sets[-1])
                    res[r][i] = v - y
                    acc += y
                    up += nb
                # the outer step: plain SGD at 0.7 on the average pseudo-gradient
                w[i] -= 0.7 * (acc / workers).view_as(w[i])
                delta = (w[i] - view[i]).flatten()
                if n < SMALL:
                    dec, nb = delta, 4 * n
                elif downlink == "resparsify":
                    dec, nb = topk_blocks(delta, qgen)
                elif downlink == "union":
                    union = [torch.unique(torch.cat([s[m] for s in sets]))
                             for m in range(len(sets[0]))]
                    dec, nb = topk_blocks(delta, qgen, union)
                else:
                    dec, nb = maxmin4(delta, qgen)
                down += nb
                view[i] += dec.view_as(view[i])
            for net in nets:
                for p, a in zip(net.parameters(), view):
                    p.copy_(a)
    with torch.no_grad():
        for p, a in zip(global_net.parameters(), view):
            p.copy_(a)
        acc = (global_net(xte).argmax(1) == yte).float().mean().item()
    return acc, up / workers / steps, down / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--h", default="15,50")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("downlink,H,seed,test_acc,uplink_bytes_per_step_per_worker,downlink_bytes_per_step",
          flush=True)
    rows = {}
    for h in [int(x) for x in a.h.split(",")]:
        for d in ["resparsify", "union", "dense4"]:
            for s in range(a.seeds):
                acc, up, down = run(d, h, s, a.steps, a.workers, a.batch)
                print("%s,%d,%d,%.4f,%.0f,%.0f" % (d, h, s, acc, up, down), flush=True)
                rows.setdefault((d, h), []).append((acc, up, down))
    print("\ndownlink    H   test accuracy mean (min..max)   uplink B/step/worker   downlink B/step")
    for (d, h), v in rows.items():
        accs = [x[0] for x in v]
        print("%-10s %3d   %.4f (%.4f..%.4f)            %8.0f               %8.0f" %
              (d, h, sum(accs) / len(accs), min(accs), max(accs),
               sum(x[1] for x in v) / len(v), sum(x[2] for x in v) / len(v)))


if __name__ == "__main__":
    main()
