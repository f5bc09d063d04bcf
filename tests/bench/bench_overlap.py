#!/usr/bin/python3
"""bench_overlap.py - overlap of communication with backprop, psagg against Gloo DDP.

Usage: tests/bench/bench_overlap.py [--where loopback,cluster] [--build-dir build] [--steps 10]
                                    [--warmup 3] [--width 1024] [--depth 8] [--batch 0]
                                    [--codec maxmin4] [--rate 1gbit] [--out FILE.csv] [--port P]

Runs tests/bench/overlap_worker.py (one per worker, 4 workers) for psagg-ddp and psagg-opt
(codec --codec) and gloo-ddp (fp32):
  loopback  through deploy/psagg-local with 2 servers, all on this host over tcp loopback, on
            ports P and P+1 (default: two free ones, reserved by tests/harness.sh)
  cluster   on an emulated cluster (deploy/netcluster.sh, --rate links; as root): 4 worker
            hosts, servers on 2 hosts of their own (S2) and on the worker hosts (colocated)
Each row: compute-only, exchange-only and real step time (medians, rank 0) and overlap =
(compute + exchange - step) / min(compute, exchange). --batch 0 (default) sizes the batch so
that compute takes about as long as the exchange of the run being measured; Gloo's rows use
the batch psagg-ddp picked in the same place, so "step" compares the same work. Prints a
markdown table and writes a CSV (default tests/bench/results/overlap.csv).
"""
import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_cluster as bc  # noqa: E402  (the emulated cluster and its process handling)

PY = "/usr/bin/python3"
WORKER = os.path.join(REPO, "tests", "bench", "overlap_worker.py")
FIELDS = ["where", "placement", "comm", "codec", "workers", "params", "batch", "compute_ms",
          "exchange_ms", "step_ms", "overlap", "status"]


def parse(text):
    m = re.findall(r"^(?:\[worker 0\] )?RESULT (.*)$", text, re.M)
    return dict(kv.split("=", 1) for kv in m[-1].split()) if m else None


def worker_args(a, comm, batch):
    argv = [PY, WORKER, "--comm", comm, "--width", str(a.width), "--depth", str(a.depth),
            "--batch", str(batch), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    if comm != "gloo-ddp":
        argv += ["--codec", a.codec]
    return argv


def ini(job, servers, workers, codec):
    return (f"[cluster]\njob_id = {job}\nservers = {' '.join(servers)}\nworkers = {workers}\n"
            f"provider = tcp\nconnect_timeout_ms = 60000\nop_timeout_ms = 120000\n"
            f"[codec]\ndefault = {codec}\n[log]\nlevel = warn\n")


def run_loopback(a, comm, batch, tmp):
    cfg = os.path.join(tmp, "loopback.ini")
    port = a.port
    with open(cfg, "w") as f:
        f.write(ini(f"overlap-{os.getpid()}", [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"],
                    a.workers, a.codec))
    env = dict(os.environ, PSAGG_SERVER_BIN=os.path.join(a.build_dir, "server", "psagg-server"))
    cmd = [os.path.join(REPO, "deploy", "psagg-local"), "--config", cfg, "--timeout", "900"]
    if comm == "gloo-ddp":
        cmd += ["--servers", "0"]
    r = subprocess.run(cmd + ["--"] + worker_args(a, comm, batch), capture_output=True,
                       text=True, env=env)
    res = parse(r.stdout)
    if r.returncode or not res:
        return None, "failed: " + (r.stdout + r.stderr)[-600:].replace("\n", " | ")
    return res, ""


def run_cluster(a, c, placement, server_hosts, comm, batch, tmp, seq):
    n = a.workers
    port = 19500 + seq % 100
    cfg = os.path.join(tmp, f"cluster-{placement}-{comm}.ini")
    with open(cfg, "w") as f:
        f.write(ini(f"overlap-{os.getpid()}-{seq}", [f"10.77.0.{10 + h}:{port}" for h in server_hosts],
                    n, a.codec))
    penv = {}
    out = subprocess.run([os.path.join(a.build_dir, "server", "psagg-server"), "--config", cfg,
                          "--fabric-env"], capture_output=True, text=True, check=True).stdout
    penv.update(line.split("=", 1) for line in out.split("\n") if "=" in line)
    servers = []
    if comm != "gloo-ddp":
        for i, h in enumerate(server_hosts):
            servers.append(c.start(h, [os.path.join(a.build_dir, "server", "psagg-server"),
                                       "--config", cfg, "--rank", str(i)],
                                   os.path.join(tmp, f"{placement}-{comm}-server{i}.log"), penv))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(c.listening(h, port) for h in server_hosts):
            time.sleep(0.1)
    workers = []
    for r in range(n):
        env = {"PSAGG_CONFIG": cfg, "PSAGG_RANK": str(r), "PSAGG_WORLD_SIZE": str(n),
               "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
               "MASTER_ADDR": "10.77.0.10", "MASTER_PORT": str(29500 + seq % 500),
               "PYTHONPATH": os.path.join(a.build_dir, "python"), **penv}
        workers.append(c.start(r, worker_args(a, comm, batch),
                               os.path.join(tmp, f"{placement}-{comm}-worker{r}.log"), env))
    ok, timed_out = bc.wait_all(workers, 1800)
    for s in servers:
        c.stop(s)
    res = parse(open(workers[0].logpath, errors="replace").read())
    if not ok or not res:
        return None, ("timed out" if timed_out else "failed") + f" (logs {tmp}/{placement}-{comm}-*)"
    return res, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--where", default="loopback,cluster")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--codec", default="maxmin4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--comms", default="psagg-ddp,psagg-opt,gloo-ddp")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "bench", "results", "overlap.csv"))
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if "loopback" in a.where.split(",") and not a.port:
        if "PSAGG_TEST_PORT" not in os.environ:  # run again on two reserved ports
            os.execvp("bash", ["bash", os.path.join(REPO, "tests", "harness.sh"), "--reserve-ports", "2",
                               "--", sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
        a.port = int(os.environ["PSAGG_TEST_PORT"])
    a.build_dir = os.path.abspath(a.build_dir)
    tmp = os.path.join(os.path.dirname(os.path.abspath(a.out)), "overlap-logs",
                       time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(tmp, exist_ok=True)
    comms = a.comms.split(",")
    rows = []

    def record(where, placement, comm, res, why):
        row = {"where": where, "placement": placement, "comm": comm, "status": why or "ok"}
        if res:
            row.update({k: res.get(k, "") for k in FIELDS if k in res})
            row["codec"] = res.get("codec", "")
        rows.append(row)
        bc.log(f"{where} {placement} {comm}: " + (" ".join(f"{k}={row.get(k, '')}" for k in
               ("batch", "compute_ms", "exchange_ms", "step_ms", "overlap")) if res else why))
        return int(res["batch"]) if res else 0

    def on_signal(signum, frame):
        raise bc.Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)  # the finally below tears the cluster down
    wheres = a.where.split(",")
    if "loopback" in wheres:
        batch = a.batch
        for comm in comms:
            res, why = run_loopback(a, comm, batch, tmp)
            b = record("loopback", "S2", comm, res, why)
            if comm == "psagg-ddp" and a.batch == 0 and b:
                batch = b  # the others run the batch psagg-ddp picked
    if "cluster" in wheres:
        seq = 0
        for placement, server_hosts in (("S2", [a.workers, a.workers + 1]),
                                        ("colocated", list(range(a.workers)))):
            hosts = a.workers + (2 if placement == "S2" else 0)
            c = bc.Cluster(f"pov{os.getpid() % 1000}", hosts, a.rate, "", False)
            try:
                batch = a.batch
                for comm in comms:
                    seq += 1
                    res, why = run_cluster(a, c, placement, server_hosts, comm, batch, tmp, seq)
                    b = record(f"cluster {a.rate}", placement, comm, res, why)
                    if comm == "psagg-ddp" and a.batch == 0 and b:
                        batch = b
            finally:
                c.down()
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in FIELDS})
    print("| where | servers | comm | codec | batch | compute ms | exchange ms | step ms | overlap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["where"], r["placement"], r["comm"], r.get("codec", ""), r.get("batch", ""),
            r.get("compute_ms", ""), r.get("exchange_ms", ""), r.get("step_ms", ""),
            r.get("overlap", r["status"])))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
