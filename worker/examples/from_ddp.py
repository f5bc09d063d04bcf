#!/usr/bin/env python3
"""from_ddp.py - a plain PyTorch DDP training loop, and the three ways into psagg from it.

The loop is what torchrun users already have: init_process_group, DistributedDataParallel,
torch.optim.SGD, zero_grad / backward / step. Each way in changes a few lines, marked
"# psagg (<way>)" below:

  --way ddp      the loop as it is: DDP over Gloo (fp32 all-reduce), the baseline
  --way hook     DDP stays; psagg's communication hook moves its gradients (2 lines)
  --way server   no DDP, no process group: psagg.torch.ServerOptimizer, the optimizer's step runs
                 on the servers (start them with [server] optimizer = sgd; 3 lines)
  --way diloco   no DDP: each worker steps its own optimizer and every --sync-every steps the
                 servers take the outer step (psagg.torch.DiLoCo; start them with [server]
                 optimizer = sgd, momentum = 0.9, nesterov = on; 3 lines)

Run it with the installed commands (pip install . puts them on PATH: docs/install.md):

    psagg-local --config conf/local.ini -- python worker/examples/from_ddp.py --way hook
    PSAGG_SERVER_OPTIMIZER=sgd psagg-local --config conf/local.ini -- \\
        python worker/examples/from_ddp.py --way server
    PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 PSAGG_SERVER_NESTEROV=on \\
        psagg-local --config conf/local.ini -- python worker/examples/from_ddp.py --way diloco
    psagg-local --config conf/local.ini --servers 0 -- python worker/examples/from_ddp.py --way ddp

psagg-local sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun does, and the psagg
variables. The data are synthetic (a fixed random teacher labels Gaussian inputs), so the script
needs torch alone. Rank 0 prints "RESULT way=... loss=... accuracy=..." (held-out data) and every
rank "PARAMS rank=R sha256=..." of its final weights: the same on every rank, in every way.
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def data(seed, n, dim=32, classes=4):
    """Gaussian inputs labelled by a fixed random two-layer teacher."""
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(dim, 64, generator=g), torch.randn(64, classes, generator=g)
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed + 1))
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--way", choices=("ddp", "hook", "server", "diloco"), default="hook")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--codec", default="maxmin4", help="psagg's codec (hook, server, diloco)")
    ap.add_argument("--sync-every", type=int, default=20, help="diloco: inner steps per sync")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)  # every rank starts from the same weights
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = data(7, 4096)
    x, y = x[rank::world], y[rank::world]  # this rank's shard
    xte, yte = data(7, 5000)
    xte, yte = xte[4096:], yte[4096:]

    diloco = None
    if args.way in ("ddp", "hook"):
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(model)
        if args.way == "hook":
            import psagg.torch as pt  # psagg (hook)
            pt.register_ddp_hook(net, codec=args.codec)  # psagg (hook)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    elif args.way == "server":
        import psagg.torch as pt  # psagg (server)
        pt.init()  # psagg (server): no process group
        net = model
        opt = pt.ServerOptimizer(model.parameters(), lr=args.lr,  # psagg (server)
                                 named_parameters=model.named_parameters(), codec=args.codec)
    else:
        import psagg.torch as pt  # psagg (diloco)
        pt.init()  # psagg (diloco): no process group
        net = model
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        diloco = pt.DiLoCo(model, opt, sync_every=args.sync_every,  # psagg (diloco)
                           outer_lr=0.7, codec=args.codec)

    g = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(args.steps):
        idx = torch.randint(0, len(y), (args.batch,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if diloco is not None:
            diloco.step()  # psagg (diloco): the outer step every sync_every steps
        losses.append(loss.item())
    if diloco is not None:
        diloco.finish()  # psagg (diloco): the last outer step

    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
        test_loss = F.cross_entropy(model(xte), yte).item()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    print("PARAMS rank=%d sha256=%s" % (rank, h.hexdigest()[:16]), flush=True)
    if rank == 0:
        print("RESULT way=%s steps=%d world=%d train_loss=%.4f loss=%.4f accuracy=%.4f" %
              (args.way, args.steps, world, sum(losses[-20:]) / 20, test_loss, acc), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
