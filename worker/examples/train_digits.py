#!/usr/bin/python3
"""train_digits.py - data-parallel PyTorch training of a small CNN on sklearn's digits.

Run it under deploy/psagg-local (which sets RANK, WORLD_SIZE, MASTER_ADDR/PORT and the psagg
variables), with Debian's /usr/bin/python3 (the one that has torch):

    deploy/psagg-local --config conf/local.ini -- /usr/bin/python3 \\
        worker/examples/train_digits.py --comm psagg --codec maxmin4
    deploy/psagg-local --config conf/local.ini --servers 0 -- /usr/bin/python3 \\
        worker/examples/train_digits.py --comm gloo

--comm gloo       DDP with Gloo's all-reduce (fp32): the baseline
--comm psagg      DDP with psagg's communication hook (the two-line change)
--comm psagg-opt  no DDP and no process group: psagg.torch.DistributedOptimizer
--comm psagg-fsdp FSDP2 (fully_shard, torch >= 2.7) over shard groups of one rank, psagg as
                  the replica all-reduce (psagg.torch.register_fsdp_hook): with --codec fp32
                  the averages of --comm psagg, so (with --deterministic) the same weights, bit
                  for bit (other codecs differ: psagg compresses each FSDP module's flat shard,
                  its biases included, where DDP's hook sends small tensors in fp32)
--deterministic   deterministic kernels only (cuDNN, torch.use_deterministic_algorithms; on a
                  GPU set CUBLAS_WORKSPACE_CONFIG=:4096:8): two runs give the same bits
--comm psagg-server  the optimizer runs on the servers: psagg.torch.ServerOptimizer (no DDP;
                  start the servers with [server] optimizer = sgd, momentum = 0.9, e.g.
                  PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 in the environment)

--diloco H        DiLoCo: H local SGD steps per worker, then the outer step on the servers
                  (psagg.torch.DiLoCo; no DDP, no process group); --fragments P, --delay T and
                  --alpha A make it Streaming DiLoCo, --outer-lr the outer learning rate. Start
                  the servers with PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9
                  PSAGG_SERVER_NESTEROV=on (the outer optimizer); --codec is the outer
                  gradients' codec

--device cuda     the model, the data and the gradients on the GPU (cuda:LOCAL_RANK modulo the
                  devices: psagg-local's 4 workers share one GPU); psagg's hook then pushes
                  CUDA tensors (libpsagg built with CUDA). Gloo all-reduces CUDA tensors too.

Elastic jobs ([cluster] elastic = on; not with DDP, whose process group cannot shrink): with
--comm psagg-opt, psagg-server or --diloco, a worker that dies leaves the job and the others go
on; each re-shards the training images by its rank among the live workers when the membership
changes (psagg.torch.membership_changes). --die-at T --die-rank R: chaos, rank R SIGKILLs
itself before step T; --chaos K kills K times, at steps and ranks drawn from --seed; --hold
S:FILE waits before step S until FILE exists (a harness's events done first). Under
`psagg-local --restarts N` a killed worker is started again and joins the running job: the
optimizer wrappers admit it at the end of a step (psagg_sync_membership), it starts from the
state the job has (ServerOptimizer, DiLoCo: the servers' weights; DistributedOptimizer: the
lowest old member's weights and optimizer state, through psagg) at the members' step, and
every worker re-shards. Every rank prints "STEPTIME median_ms=... max_ms=... max_at=..." of
its steps after its first 5 (the longest is the one a death interrupted) and "JOINED" lines.

Without sklearn (e.g. a GPU image's PyTorch), $PSAGG_DIGITS names sklearn's digits.csv.gz
(deploy/install-deps.sh --bundle puts a copy in the bundle).

Each worker trains on its own shard (1/N of the 1437 training images) with the same seed and
a global batch of N x --batch. Rank 0 prints a RESULT line (ms per step, final loss = mean of
rank 0's last 20 training losses, test accuracy on the 360 held-out images); every rank
prints "PARAMS rank=R sha256=..." of its final weights (they must be equal).
"""

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)
        # a layer forward() never uses: DDP then needs find_unused_parameters=True
        self.unused = nn.Linear(10, 10) if unused else None

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_digits():
    path = os.environ.get("PSAGG_DIGITS")
    if path:  # sklearn's digits.csv.gz: 64 pixel values and the label per line
        import gzip
        with gzip.open(path, "rt") as f:
            rows = [[float(v) for v in line.split(",")] for line in f if line.strip()]
        data = torch.tensor(rows, dtype=torch.float32)
        x = data[:, :64].reshape(-1, 1, 8, 8) / 16.0
        y = data[:, 64].long()
    else:
        from sklearn.datasets import load_digits as sk_digits
        d = sk_digits()
        x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
        y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(1234)
    perm = torch.randperm(len(y), generator=g)
    x, y = x[perm], y[perm]
    n_test = 360
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def params_sha256(model):
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):  # FSDP2's sharded parameter (a DTensor)
            t = t.full_tensor()
        t = t.cpu().contiguous()
        try:
            h.update(t.numpy().tobytes())
        except RuntimeError:  # a PyTorch 2.x without numpy: the values' exact text instead
            h.update(repr(t.reshape(-1).tolist()).encode())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--comm", choices=["psagg", "gloo", "psagg-opt", "psagg-server",
                                       "psagg-fsdp"],
                    default="psagg")
    ap.add_argument("--codec", default=None, help="psagg codec text (default: the config's)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--unused", action="store_true",
                    help="add a parameter forward() never uses (find_unused_parameters=True)")
    ap.add_argument("--bucket-cap-mb", type=float, default=0.05,
                    help="DDP bucket size (small: several buckets, as in a large model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--diloco", type=int, default=0, metavar="H",
                    help="DiLoCo with H inner steps per outer step (0: off)")
    ap.add_argument("--fragments", type=int, default=1, help="Streaming DiLoCo's fragments")
    ap.add_argument("--delay", type=int, default=0, help="Streaming DiLoCo's sync delay")
    ap.add_argument("--alpha", type=float, default=0.0, help="Streaming DiLoCo's merge alpha")
    ap.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo's outer learning rate")
    ap.add_argument("--outer-momentum", type=float, default=0.9,
                    help="DiLoCo's outer momentum (Nesterov; 0: plain outer SGD, SparseLoCo's)")
    ap.add_argument("--die-at", type=int, default=-1, metavar="STEP",
                    help="chaos: rank --die-rank SIGKILLs itself before this step")
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--hold", default="", metavar="STEP:FILE",
                    help="chaos: before STEP, wait (up to 120 s) until FILE exists; a harness "
                    "holds the job there until its events (a restart, a join) are done")
    ap.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                    help="--comm psagg-server: the live rank 0 has the servers checkpoint after "
                    "every N-th step ([server] checkpoint_dir)")
    ap.add_argument("--chaos", type=int, default=0, metavar="K",
                    help="chaos: K SIGKILLs at steps and ranks drawn from --seed (between 10%% "
                    "and 90%% of --steps; run under psagg-local --restarts K)")
    ap.add_argument("--slow-rank", type=int, default=-1,
                    help="a straggler: this rank sleeps --slow-ms before each step's backward")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic kernels only: runs comparable bit for bit")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the model and the gradients live (cuda: cuda:LOCAL_RANK modulo "
                    "the number of GPUs)")
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    started = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    if args.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)  # (an op without: a warning)
    xtr, ytr, xte, yte = load_digits()
    xs, ys = xtr[rank::world], ytr[rank::world]
    device = torch.device("cpu")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        xs, ys, xte, yte = xs.to(device), ys.to(device), xte.to(device), yte.to(device)
    model = Net(args.unused).to(device)

    diloco = None
    if args.diloco:
        import psagg.torch as pt
        pt.init()
        args.comm = "psagg-diloco"
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        diloco = pt.DiLoCo(model, opt, sync_every=args.diloco, outer_lr=args.outer_lr,
                           outer_momentum=args.outer_momentum,
                           nesterov=args.outer_momentum > 0,
                           codec=args.codec, fragments=args.fragments,
                           fragment_sync_delay=args.delay, fragment_update_alpha=args.alpha)
        net = model
    elif args.comm == "psagg-opt":
        import psagg.torch as pt
        pt.init()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        opt = pt.DistributedOptimizer(opt, model.named_parameters(), codec=args.codec,
                                      model=model)
        pt.broadcast_parameters(model, root=0)  # (a joiner's returns: it has their state)
        net = model
    elif args.comm == "psagg-fsdp":
        import importlib
        import psagg.torch as pt
        # (FSDP's collectives on CUDA tensors are NCCL's; its shard groups of one rank never
        # need a second GPU)
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                rank=rank, world_size=world)
        try:
            fsdp = importlib.import_module("torch.distributed.fsdp")
            fsdp.fully_shard
        except Exception:  # noqa: BLE001 (torch 1.13 on Python 3.11 cannot import it at all)
            raise RuntimeError("--comm psagg-fsdp needs FSDP2 (torch >= 2.7); this is torch %s"
                               % torch.__version__) from None
        mesh = importlib.import_module("torch.distributed.device_mesh").init_device_mesh(
            device.type, (world, 1), mesh_dim_names=("replicate", "shard"))["shard"]
        for layer in model.children():  # each layer an FSDP module, then the root
            if any(True for _ in layer.parameters()):
                fsdp.fully_shard(layer, mesh=mesh)
        fsdp.fully_shard(model, mesh=mesh)
        pt.register_fsdp_hook(model, codec=args.codec)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        net = model
    elif args.comm == "psagg-server":
        import psagg.torch as pt
        pt.init()  # momentum etc. are the servers' config; the learning rate is ours
        opt = pt.ServerOptimizer(model.parameters(), lr=args.lr,
                                 named_parameters=model.named_parameters(), codec=args.codec)
        net = model
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None,
            bucket_cap_mb=args.bucket_cap_mb, find_unused_parameters=args.unused)
        if args.comm == "psagg":
            import psagg.torch as pt
            pt.register_ddp_hook(net, codec=args.codec)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)

    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    losses, step_ms = [], []
    t0 = None
    changes = pt.membership_changes() if args.comm not in ("gloo", "psagg", "psagg-fsdp") \
        else None
    start = 0  # a worker that joined the running job starts at the members' step
    if changes is not None and pt.membership()["joiner"]:
        start = diloco.start_step if diloco is not None else opt.start_step
        g.manual_seed(args.seed * 1000 + rank + 7919 * int(os.environ.get("PSAGG_RESTART", 0)))
        sess = pt.session()
        print("JOINED rank %d at step %d (restart %s): started %.2f s ago, admitted in %.3f s, "
              "state in %.3f s, t=%.3f" %
              (rank, start, os.environ.get("PSAGG_RESTART", "?"), time.time() - started,
               sess.declare_seconds, sess.state_seconds, time.time() % 100000), flush=True)
    kills = set()
    if args.chaos:  # (step, rank) pairs, the same on every worker: one per slice of
        # 10%..90% of the steps at a random point of it, never the rank of the kill before
        cg = torch.Generator().manual_seed(args.seed + 4242)
        lo, hi, victim = args.steps // 10, args.steps * 9 // 10, -1
        width = (hi - lo) // args.chaos
        for i in range(args.chaos):
            at = lo + i * width + int(torch.randint(0, max(1, width // 2), (1,), generator=cg))
            victim = (victim + 1 + int(torch.randint(0, world - 1, (1,), generator=cg))) % world
            kills.add((at, victim))
    hold_at, _, hold_file = args.hold.partition(":")
    hold_at = int(hold_at) if hold_file else -1
    for step in range(start, args.steps):
        if step == hold_at and not os.path.exists(hold_file):
            print("rank %d: HOLD before step %d" % (rank, step), flush=True)
            until = time.time() + 120
            while not os.path.exists(hold_file) and time.time() < until:
                time.sleep(0.01)
        if len(step_ms) == 5:
            t0 = time.perf_counter()  # after warm-up (DDP rebuilds its buckets after step 1)
        if (step == args.die_at and rank == args.die_rank) or \
                (step > start and (step, rank) in kills):
            # t: the wall clock mod 10^5 s, as psagg's log lines stamp theirs
            print("rank %d: SIGKILL to itself before step %d, t=%.3f" %
                  (rank, step, time.time() % 100000), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        m = next(changes) if changes is not None else None
        if m and m["epoch"] > 0:  # a worker left: shard the images over the live ones
            xs, ys = xtr[m["rank"]::m["size"]].to(device), ytr[m["rank"]::m["size"]].to(device)
            print("rank %d: membership epoch %d at step %d: live rank %d of %d" %
                  (rank, m["epoch"], step, m["rank"], m["size"]), flush=True)
        ts = time.perf_counter()
        idx = torch.randint(0, len(ys), (args.batch,), generator=g).to(device)
        opt.zero_grad()
        loss = F.cross_entropy(net(xs[idx]), ys[idx])
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000.0)
        loss.backward()
        opt.step()
        if diloco is not None:
            diloco.step()
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and \
                pt.membership()["rank"] == 0:
            opt.checkpoint()
        losses.append(loss.item())
        step_ms.append((time.perf_counter() - ts) * 1000.0)
        if step % 50 == 0 and rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    if diloco is not None:
        diloco.finish()
    ms = (time.perf_counter() - t0) * 1000.0 / max(1, len(step_ms) - 5) if t0 else 0.0

    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
        test_loss = F.cross_entropy(model(xte), yte).item()
    # rank 0's: its shard, the shared weights (none: a joiner admitted after the last step)
    tail = sum(losses[-20:]) / len(losses[-20:]) if losses else float("nan")
    print("PARAMS rank=%d sha256=%s" % (rank, params_sha256(model)), flush=True)
    after = step_ms[5:] or step_ms or [0.0]  # after warm-up
    med = sorted(after)[len(after) // 2]
    print("STEPTIME rank=%d median_ms=%.2f max_ms=%.2f max_at=%d excess_ms=%.0f wall_s=%.2f" %
          (rank, med, max(after), len(step_ms) - len(after) + after.index(max(after)),
           sum(t - med for t in after if t > med), time.time() - started), flush=True)
    extra = ""
    if args.comm != "gloo":
        st = pt.session().ctx.stats()
        extra = " psagg_bytes_sent=%d bytes_per_step=%.0f compression=%.2f" % (
            st["bytes_sent"], st["bytes_sent"] / max(1, args.steps),
            st["bytes_raw"] / max(1, st["bytes_sent"]))
        if st["left_out"]:  # [server] quorum closed rounds without this worker's push
            print("LEFTOUT rank=%d left_out=%d" % (rank, st["left_out"]), flush=True)
        if diloco is not None:
            extra += " diloco=%d fragments=%d delay=%d" % (args.diloco, args.fragments,
                                                          args.delay)
    if rank == 0:
        # grad_bytes: one step's gradients in fp32, what DDP's all-reduce takes in per worker
        grad_bytes = 4 * sum(p.numel() for p in model.parameters())
        print("RESULT comm=%s codec=%s workers=%d steps=%d ms_per_step=%.2f final_loss=%.4f "
              "test_acc=%.4f test_loss=%.4f grad_bytes=%d%s device=%s" %
              (args.comm, args.codec or "config", world, args.steps, ms, tail, acc, test_loss,
               grad_bytes, extra, device), flush=True)
    if args.comm in ("gloo", "psagg", "psagg-fsdp"):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # psagg.Error (a RuntimeError) or one raised through DDP
        print("train_digits: rank %s failed at %.3f: %s" % (os.environ.get("RANK"), time.time(),
                                                             e), file=sys.stderr, flush=True)
        sys.exit(3)
