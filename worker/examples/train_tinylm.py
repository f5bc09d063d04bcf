#!/usr/bin/python3
"""train_tinylm.py - data-parallel training of a tiny causal transformer (a byte-level
language model) with Adam, the setting where 2-bit gradients hurt.

Run it under deploy/psagg-local with Debian's /usr/bin/python3 (the one that has torch):

    deploy/psagg-local --config conf/local.ini -- /usr/bin/python3 \\
        worker/examples/train_tinylm.py --comm psagg
    deploy/psagg-local --config conf/local.ini --servers 0 -- /usr/bin/python3 \\
        worker/examples/train_tinylm.py --comm gloo

Data: the bytes of the Python standard library's top-level modules of this host
(/usr/lib/python3.11/*.py in name order, the first 2 MB; the last 10% held out), so every
worker and every run reads the same text without a download. Model: 2 transformer layers,
width 64, 4 heads, context 64 bytes, token and position embeddings, a linear head: about
0.1 M parameters in 26 tensors of very different sizes and gradient scales. Each worker
draws its own batches (seeded by rank); DDP averages the gradients (psagg's hook with the
config's codecs, or Gloo fp32). Rank 0 prints "RESULT ... val_loss=..." (mean cross-entropy
in nats per byte on 32 fixed held-out batches) and every rank "PARAMS rank=R sha256=...".

--diloco H: DiLoCo instead (psagg.torch.DiLoCo; no DDP): H local Adam steps, then the outer
step (SGD, Nesterov momentum 0.9, --outer-lr) on the servers; start them with
PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 PSAGG_SERVER_NESTEROV=on. --fragments,
--delay and --alpha: Streaming DiLoCo; --codec: the outer gradients' codec. The held-out loss
is the global weights' (every worker's after its last sync).
"""

import argparse
import glob
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CTX = 64


class TinyLM(nn.Module):
    def __init__(self, width=64, layers=2, heads=4):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(CTX, width)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        self.register_buffer("mask", torch.triu(torch.full((CTX, CTX), float("-inf")), 1))

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        h = self.body(h, mask=self.mask[:x.shape[1], :x.shape[1]])
        return self.head(self.norm(h))


def load_text(limit=2 << 20):
    data = bytearray()
    for path in sorted(glob.glob("/usr/lib/python3.11/*.py")):
        with open(path, "rb") as f:
            data += f.read()
        if len(data) >= limit:
            break
    if len(data) < 100000:
        raise SystemExit("train_tinylm: too little text under /usr/lib/python3.11")
    t = torch.tensor(list(data[:limit]), dtype=torch.long)
    n_val = len(t) // 10
    return t[:-n_val], t[-n_val:]


def batch(text, n, g):
    i = torch.randint(0, len(text) - CTX - 1, (n,), generator=g)
    x = torch.stack([text[j:j + CTX] for j in i])
    y = torch.stack([text[j + 1:j + CTX + 1] for j in i])
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--comm", choices=["psagg", "gloo", "psagg-server"], default="psagg",
                    help="psagg-server: Adam runs on the servers (psagg.torch.ServerOptimizer "
                         "through DDP's hook; start them with [server] optimizer = adam)")
    ap.add_argument("--codec", default=None, help="psagg codec text (default: the config's)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16, help="per worker")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--diloco", type=int, default=0, metavar="H")
    ap.add_argument("--fragments", type=int, default=1)
    ap.add_argument("--delay", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train, val = load_text()
    model = TinyLM()
    diloco = None
    if args.diloco:
        import psagg.torch as pt
        args.comm = "psagg-diloco"
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        diloco = pt.DiLoCo(model, opt, sync_every=args.diloco, outer_lr=args.outer_lr,
                           outer_momentum=args.outer_momentum,
                           nesterov=args.outer_momentum > 0,
                           codec=args.codec, fragments=args.fragments,
                           fragment_sync_delay=args.delay, fragment_update_alpha=args.alpha)
        net = model
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if diloco is not None:
        pass
    elif args.comm == "psagg-server":  # before DDP: it declares and hands out rank 0's weights
        import psagg.torch as pt
        opt = pt.ServerOptimizer(model.parameters(), lr=args.lr,
                                 named_parameters=model.named_parameters(), codec=args.codec)
    if diloco is None:
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    if diloco is not None:
        pass
    elif args.comm == "psagg":
        import psagg.torch as pt
        pt.register_ddp_hook(net, codec=args.codec)
        opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    elif args.comm == "psagg-server":
        pt.register_ddp_hook(net, optimizer=opt)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(train, args.batch, g)
        opt.zero_grad()
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        if diloco is not None:
            diloco.step()
        if step % 100 == 0 and rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    if diloco is not None:
        diloco.finish()
    ms = (time.perf_counter() - t0) * 1000.0 / args.steps
    gv = torch.Generator().manual_seed(99)
    with torch.no_grad():
        vl = sum(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                 for x, y in (batch(val, 32, gv) for _ in range(32))) / 32
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    print("PARAMS rank=%d sha256=%s" % (rank, h.hexdigest()), flush=True)
    extra = ""
    if args.comm != "gloo":
        st = pt.session().ctx.stats()
        extra = " psagg_bytes_sent=%d bytes_per_step=%.0f compression=%.2f" % (
            st["bytes_sent"], st["bytes_sent"] / max(1, args.steps),
            st["bytes_raw"] / max(1, st["bytes_sent"]))
        if diloco is not None:
            extra += " diloco=%d fragments=%d delay=%d outer_lr=%g" % (
                args.diloco, args.fragments, args.delay, args.outer_lr)
        if rank == 0 and diloco is None:
            for a in pt.assignment():
                print("ASSIGNMENT %s %s %d generation=%d" % (a["name"], a["codec"], a["bytes"],
                                                             a["generation"]), flush=True)
    if rank == 0:
        print("RESULT comm=%s workers=%d steps=%d ms_per_step=%.2f val_loss=%.4f%s"
              % (args.comm, world, args.steps, ms, vl, extra), flush=True)
    if diloco is None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:
        print("train_tinylm: rank %s failed at %.3f: %s" % (os.environ.get("RANK"), time.time(),
                                                             e), file=sys.stderr, flush=True)
        sys.exit(3)
