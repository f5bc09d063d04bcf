#!/usr/bin/python3
"""gloo_allreduce.py — the Gloo (torch.distributed) all-reduce baseline for
tests/bench/bench_cluster.py.

  /usr/bin/python3 gloo_allreduce.py --model M.sizes --rank R --world-size N \\
        --master ADDR:PORT [--steps 10] [--warmup 3] [--bucket-mb 25] [--first-bucket-mb 1]

Groups the model's gradient tensors (a .sizes file: one element count per line, '#'
comments) into fp32 buckets the way DDP does — reverse registration order, a bucket is
closed once it reaches its cap, the first cap --first-bucket-mb (DDP's 1 MiB), the rest
--bucket-mb (bucket_cap_mb=25), tensors never split; the same rule as mpi_allreduce.c —
and per step launches dist.all_reduce(SUM, async_op=True) on every bucket, then waits for
all of them, as DDP's reducer does. A step's time is the maximum over ranks of the time
from a barrier to the last completion. After --warmup untimed steps, --steps timed steps;
rank 0 prints
  RESULT system=gloo model=<name> ranks=<n> median_ms=<x> p10_ms=<y> p90_ms=<z> ...
         worker_cpu_ms=<rank 0's CPU ms per timed step> workers_cpu_ms=<summed over ranks>
GLOO_SOCKET_IFNAME is taken from the environment, or from NETCLUSTER_IFACE (set by
deploy/netcluster.sh exec) when unset. Needs PyTorch (run with /usr/bin/python3).
"""
import argparse
import datetime
import os
import sys
import time


def read_sizes(path):
    sizes = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            s = line.split("#", 1)[0].strip()
            if not s:
                continue
            n = int(s)
            if n <= 0:
                raise ValueError(f"{path}:{lineno}: bad element count")
            sizes.append(n)
    if not sizes:
        raise ValueError(f"{path}: no tensors")
    return sizes


def ddp_buckets(sizes, bucket_mb, first_mb, elem_bytes=4):
    """Element counts of DDP-style buckets over the reversed tensor list."""
    buckets, cur, limit = [], 0, first_mb * 1048576.0
    for n in reversed(sizes):
        cur += n
        if cur * elem_bytes >= limit:
            buckets.append(cur)
            cur, limit = 0, bucket_mb * 1048576.0
    if cur:
        buckets.append(cur)
    return buckets


def quantile(sorted_vals, q):
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--master", required=True, help="ADDR:PORT of rank 0's rendezvous store")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps >= 1 and --warmup >= 0")

    if "GLOO_SOCKET_IFNAME" not in os.environ and os.environ.get("NETCLUSTER_IFACE"):
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NETCLUSTER_IFACE"]

    import torch
    import torch.distributed as dist

    # 4 ranks may share 2 cores here: keep intra-op threads from oversubscribing them.
    torch.set_num_threads(1)
    sizes = read_sizes(args.model)
    buckets = [torch.zeros(n, dtype=torch.float32) for n in ddp_buckets(sizes, args.bucket_mb, args.first_bucket_mb)]

    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world_size, timeout=datetime.timedelta(seconds=args.timeout_s))
    times = []
    mx = torch.zeros(1, dtype=torch.float64)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            cpu0 = time.process_time()  # this process, all its threads (gloo's included)
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, op=dist.ReduceOp.SUM, async_op=True) for b in buckets]
        for w in works:
            w.wait()
        mx[0] = time.perf_counter() - t0
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(mx.item() * 1e3)
    # CPU per timed step: this rank's, and summed over the ranks (a SUM of one value each)
    cpu = torch.tensor([(time.process_time() - cpu0) * 1e3 / args.steps], dtype=torch.float64)
    own_cpu = cpu.item()
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    dist.destroy_process_group()

    if args.rank == 0:
        name = os.path.basename(args.model)
        if name.endswith(".sizes"):
            name = name[: -len(".sizes")]
        t = sorted(times)
        total = sum(sizes)
        n = args.world_size
        print(f"RESULT system=gloo model={name} ranks={n} median_ms={quantile(t, 0.5):.3f} "
              f"p10_ms={quantile(t, 0.1):.3f} p90_ms={quantile(t, 0.9):.3f} min_ms={t[0]:.3f} "
              f"steps={args.steps} warmup={args.warmup} buckets={len(buckets)} elements={total} "
              f"ring_bytes_per_rank={2.0 * (n - 1) / n * total * 4:.0f} "
              f"worker_cpu_ms={own_cpu:.1f} workers_cpu_ms={cpu.item():.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
