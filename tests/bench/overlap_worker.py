#!/usr/bin/python3
"""overlap_worker.py - how much of the gradient exchange hides behind backprop (one worker).

Run one per worker, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and (for psagg) PSAGG_CONFIG
set: tests/bench/bench_overlap.py does it on loopback (through deploy/psagg-local) and on the
emulated cluster. Debian's /usr/bin/python3 (torch).

    --comm psagg-ddp   DDP with psagg's hook (psagg.torch.register_ddp_hook)
    --comm psagg-opt   psagg.torch.DistributedOptimizer, no DDP
    --comm gloo-ddp    DDP with Gloo's all-reduce (fp32)

The model is an MLP of --depth Linear(--width, --width) layers; each step is forward +
backward + SGD step on a batch of --batch random rows. Three phases, every worker at once,
--steps timed steps each after --warmup: compute only (the plain model, no communication),
exchange only (the gradients of one backward pass aggregated the way the real step does it:
psagg push_pulls of every parameter at once, or Gloo all-reduces of DDP's 25 MB buckets), and
the real step. Rank 0 prints
    RESULT comm=... compute_ms=... exchange_ms=... step_ms=... overlap=...
(medians), overlap = (compute + exchange - step) / min(compute, exchange): 1 when the shorter
of the two hides completely behind the longer, 0 when they run one after the other.
--batch 0 picks the batch so that compute takes about as long as the exchange (rank 0 measures
and broadcasts it).
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def mlp(width, depth):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def timed(fn, steps, warmup, barrier):
    out = []
    for i in range(warmup + steps):
        barrier()
        t = time.perf_counter()
        fn()
        if i >= warmup:
            out.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--comm", choices=["psagg-ddp", "psagg-opt", "gloo-ddp"], required=True)
    ap.add_argument("--codec", default=None, help="psagg codec (default: the config's)")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=0, help="0: calibrate to the exchange time")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    a = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = mlp(a.width, a.depth)
    params = list(model.parameters())
    psagg_used = a.comm.startswith("psagg")
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.environ.get("NETCLUSTER_IFACE"):
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NETCLUSTER_IFACE"]  # emulated host's link
    if a.comm != "psagg-opt":
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if psagg_used:
        import psagg
        import psagg.torch as pt
        sess = pt.init()
        sess.declare(model.named_parameters(), a.codec)

    # a barrier between timed steps, through what the run uses anyway
    if a.comm == "psagg-opt":
        token = torch.zeros(1)

        def barrier():
            pt.broadcast_parameters([token], root=0)
    else:
        def barrier():
            dist.barrier()

    def share_from_rank0(value):
        t = torch.tensor([float(value)])
        if a.comm == "psagg-opt":
            pt.broadcast_parameters([t], root=0)
        else:
            dist.broadcast(t, 0)
        return int(t.item())

    loss_fn = nn.MSELoss()

    def compute_step(net, opt, batch):
        x = torch.randn(batch, a.width)
        opt.zero_grad()
        loss_fn(net(x), x).backward()
        opt.step()

    # one backward pass's gradients, for the exchange-only phase
    plain_opt = torch.optim.SGD(params, lr=1e-4)
    compute_step(model, plain_opt, 8)
    grads = [p.grad.detach().clone() for p in params]

    if psagg_used:
        from psagg.torch import _Op  # the push_pull the hook and the optimizer start

        def exchange():
            ops = [_Op(sess, sess.key_of(p), g, psagg.AVERAGE, 0)
                   for p, g in zip(reversed(params), reversed(grads))]
            for op in ops:
                op.finish()
    else:
        cap = 25 * 1024 * 1024 // 4  # DDP's default bucket_cap_mb = 25, in reverse order
        buckets, cur, n = [], [], 0
        for g in reversed(grads):
            cur.append(g)
            n += g.numel()
            if n >= cap:
                buckets.append(cur)
                cur, n = [], 0
        if cur:
            buckets.append(cur)
        flats = [torch.cat([g.reshape(-1) for g in b]) for b in buckets]

        def exchange():
            works = [dist.all_reduce(f, async_op=True) for f in flats]
            for w in works:
                w.wait()

    exchange_ms = timed(exchange, a.steps, a.warmup, barrier)
    batch = a.batch
    if batch <= 0:  # compute time is about linear in the batch: match the exchange
        probe = 16
        c = timed(lambda: compute_step(model, plain_opt, probe), 3, 1, barrier)
        batch = share_from_rank0(max(1, round(probe * exchange_ms / max(c, 1e-3))))
    compute_ms = timed(lambda: compute_step(model, plain_opt, batch), a.steps, a.warmup, barrier)

    if a.comm == "psagg-opt":
        opt = pt.DistributedOptimizer(torch.optim.SGD(params, lr=1e-4), model.named_parameters(),
                                      codec=a.codec)
        net = model
    else:
        net = nn.parallel.DistributedDataParallel(model)
        if a.comm == "psagg-ddp":
            net.register_comm_hook(sess, pt.ddp_comm_hook)  # declared above
        opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    step_ms = timed(lambda: compute_step(net, opt, batch), a.steps, a.warmup, barrier)

    overlap = (compute_ms + exchange_ms - step_ms) / min(compute_ms, exchange_ms)
    if rank == 0:
        elems = sum(p.numel() for p in params)
        print("RESULT comm=%s codec=%s workers=%d params=%d batch=%d compute_ms=%.1f "
              "exchange_ms=%.1f step_ms=%.1f overlap=%.2f"
              % (a.comm, (a.codec or "config") if psagg_used else "fp32", world, elems, batch,
                 compute_ms, exchange_ms, step_ms, overlap), flush=True)
    if a.comm != "psagg-opt":
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
