#!/usr/bin/python3
"""bench_cluster.py — psagg vs Gloo vs OpenMPI on an emulated cluster with shaped links.

Usage (as root; builds nothing, reads binaries from --build-dir):
  tests/bench/bench_cluster.py --short         ResNet-50, 1 Gbit/s, S=2 + colocated, fp32 + maxmin4,
                                               gloo, mpi, few steps (a few minutes on 2 cores)
  tests/bench/bench_cluster.py                 full: ResNet-50, VGG-16, BERT-base; 1 and 10 Gbit/s;
                                               S=2, S=4 (own hosts) and colocated; fp32, fp16,
                                               maxmin8, maxmin4, maxmin2; gloo and mpi fp32
  tests/bench/bench_cluster.py --dry-run [...] print the plan and the commands, run nothing
  Options: --build-dir build/  --mpi-build-dir (default: --build-dir)  --out tests/bench/results/cluster.csv
           --plot (default: --out with .png)  --steps/--warmup  --models/--rates/--placements/
           --codecs/--systems (comma lists)  --workers 4  --mpi-alg ring_segmented|ring|default
           --delay 0.1ms (needs sch_netem)  --log-dir (default: <out dir>/cluster-logs/<run id>)
           --psagg-env NAME=VALUE,...  environment of every psagg process, over the one
           `psagg-server --fabric-env` gives for the job  --psagg-set SECTION.KEY=VALUE  extra INI keys
           --server-optimizer  declare parameters (the servers' optimizer steps: DiLoCo's outer step)

How it runs: one emulated cluster (deploy/netcluster.sh, prefix psg<run id>) per (link rate,
placement). Workers are hosts 0..N-1 (10.77.0.10..); with S servers on their own hosts those
are hosts N..N+S-1; "colocated" puts server i on worker host i. In each cluster, for each model:
  - gloo and mpi (fp32, on the worker hosts; run once per (model, rate), in the first cluster
    of that rate): tests/bench/baselines/gloo_allreduce.py (with /usr/bin/python3) and
    <mpi-build-dir>/tests/bench/baselines/psagg-bench-mpi-allreduce under mpirun. mpirun runs
    inside host 0's namespace and starts the other ranks through deploy/netns-rsh (the ssh
    stand-in: `ip netns exec` + a UTS namespace per host so each host has its own hostname),
    with --mca pml ob1 --mca btl tcp,self (no shared memory), btl/oob_tcp_if_include
    10.77.0.0/24, --bind-to none and mpi_yield_when_idle 1 (ranks share 2 cores here: a
    spinning rank would steal the CPU the emulated links need), and by default the segmented
    ring all-reduce (coll_tuned algorithm 5; --mpi-alg default keeps OpenMPI's own choice,
    which was about 2x slower than the wire at 1 Gbit/s on this machine).
  - psagg for each codec: a generated INI config, <build>/server/psagg-server --config CFG
    --rank I on each server host (stopped with SIGTERM afterwards), then
    <build>/tests/bench/psagg-bench-exchange on every worker host with PSAGG_CONFIG,
    PSAGG_RANK, PSAGG_WORLD_SIZE. Missing binaries give "not built" rows.
Results: the RESULT line of rank 0 (key=value pairs). Each row: median/p10/p90 time per step,
the wire-limit time (psagg: busiest_link_bytes x 8 / rate; gloo/mpi: ring all-reduce bytes
per rank 2(N-1)/N x 4 x elements x 8 / rate), and psagg's speedup over gloo and mpi
(their median / psagg's median, same model and rate), and CPU milliseconds per step of each
role, summed over its processes: workers (psagg-bench-exchange's "CPU rank=" lines; gloo's
workers_cpu_ms) and servers (each psagg-server's cpu_ms_per_round, logged as it exits after
the job; rounds after the first). A terminal table, a CSV and a PNG
(time per step vs link rate, one panel per model). Failures are recorded and the run goes
on; namespaces are always torn down (also on Ctrl-C / SIGTERM).
"""
import argparse
import csv
import datetime
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETCLUSTER = os.path.join(REPO, "deploy", "netcluster.sh")
NETNS_RSH = os.path.join(REPO, "deploy", "netns-rsh")
GLOO_PY = os.path.join(REPO, "tests", "bench", "baselines", "gloo_allreduce.py")
MODELS = {"resnet50": "resnet50", "vgg16": "vgg16", "bert_base": "bert_base"}
ALL_CODECS = ["fp32", "fp16", "maxmin8", "maxmin4", "maxmin2"]
SERVER_PORT = 19500
MPI_ALGS = {"default": None, "ring": 4, "ring_segmented": 5}
PYTHON_TORCH = "/usr/bin/python3"
# libfabric tcp;ofi_rxm sends messages above FI_OFI_RXM_SAR_LIMIT (128 KiB) by rendezvous: the
# receiver reads the data with an RMA read whose request travels on the same TCP connection
# as the bulk data going the other way. A server's read requests for pushes then queue behind
# its own updates (and a worker's behind its pushes), so the in and out directions of a link
# take turns instead of overlapping: ResNet-50 fp32 at 1 Gbit/s, S=2, measured 2.9-3.1 s a
# step (1.8-1.9x the wire limit; the server link alternated in/out at full rate). Sending the
# chunks eagerly (every message is <= chunk_bytes + 32 B + meta, 1 MiB by default) removes the
# read round trip: 2.0-2.2 s on the same set-up, maxmin4 440-500 -> 300-320 ms.
# rxm reads these limits from the environment only, and refuses connections between processes
# whose limits differ, so no psagg process sets them itself: like deploy/psagg-local, the
# runner gives every psagg process of a run the lines `psagg-server --config CFG --fabric-env`
# prints (limits derived from the config's largest message); --psagg-env entries win.
# tests/bench/results/cluster.csv run 25de was measured with RXM_EAGER_ENV given through
# --psagg-env (the default then).
RXM_EAGER_ENV = "FI_OFI_RXM_EAGER_LIMIT=4194304,FI_OFI_RXM_SAR_LIMIT=8388608"

CSV_FIELDS = ["model", "rate_gbit", "placement", "servers", "workers", "system", "codec", "status",
              "median_ms", "p10_ms", "p90_ms", "wire_limit_ms", "wire_efficiency", "busiest_link_bytes",
              "measured_link_bytes",
              "speedup_vs_gloo", "speedup_vs_mpi", "workers_cpu_ms", "servers_cpu_ms", "worker_model",
              "steps", "warmup", "note"]


class Interrupted(Exception):
    pass


def log(msg):
    print(f"[bench_cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def read_elements(path):
    total = 0
    with open(path) as f:
        for line in f:
            s = line.split("#", 1)[0].strip()
            if s:
                total += int(s)
    return total


def rate_bps(rate):
    m = re.fullmatch(r"([0-9.]+)(gbit|mbit)", rate.lower())
    if not m:
        raise ValueError(f"bad rate {rate!r} (e.g. 1gbit, 10gbit, 100mbit)")
    return float(m.group(1)) * (1e9 if m.group(2) == "gbit" else 1e6)


def parse_result(text, system):
    """key=value pairs of the last 'RESULT system=<system>' line, or None."""
    found = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("RESULT ") and f"system={system}" in line:
            found = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return found


def cpu_sum(paths, pattern):
    """Sum of the first number matching `pattern` in each log, or "" if any log lacks it."""
    total = 0.0
    for path in paths:
        try:
            m = re.search(pattern, open(path, errors="replace").read())
        except OSError:
            m = None
        if not m:
            return ""
        total += float(m.group(1))
    return f"{total:.1f}"


def tail(path, n=6):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Cluster:
    """One netcluster.sh cluster; processes started in it are tracked and always stopped."""

    def __init__(self, prefix, hosts, rate, delay, dry):
        self.prefix, self.hosts, self.rate, self.delay, self.dry = prefix, hosts, rate, delay, dry
        self.procs = []
        self.up_done = False

    def up(self):
        """Create the cluster (once): called by the first start(), so a configuration with
        nothing to run creates nothing."""
        if self.up_done or getattr(self, "dry_shown", False):
            return
        self.dry_shown = self.dry
        cmd = [NETCLUSTER, "up", "--hosts", str(self.hosts), "--rate", self.rate, "--prefix", self.prefix,
               "--owner-pid", str(os.getpid())]
        if self.delay:
            cmd += ["--delay", self.delay]
        log("$ " + " ".join(cmd))
        if self.dry:
            return
        self.up_done = True  # mark before running: a partial cluster is torn down too
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    def down(self):
        self.stop_all()
        if self.up_done and not self.dry:
            subprocess.run([NETCLUSTER, "down", "--prefix", self.prefix], check=False)
            self.up_done = False

    def exec_cmd(self, host, argv):
        return [NETCLUSTER, "exec", "--prefix", self.prefix, str(host), "--"] + argv

    def start(self, host, argv, logpath, env=None):
        self.up()
        cmd = self.exec_cmd(host, argv)
        if self.dry:
            envs = " ".join(f"{k}={v}" for k, v in (env or {}).items())
            print(f"    {envs + ' ' if envs else ''}{' '.join(cmd)}")
            return None
        e = dict(os.environ)
        e.update(env or {})
        out = open(logpath, "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        out.close()
        p.logpath = logpath
        self.procs.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM, grace=5.0):
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def stop_all(self):
        for p in self.procs:
            self.stop(p, grace=2.0)
        self.procs = []

    def counters(self):
        """Bytes sent so far by each shaped qdisc: {("up"|"down", host): bytes}."""
        out = {}
        if self.dry or not self.up_done:
            return out
        for h in range(self.hosts):
            for d, ns, dev in (("up", f"{self.prefix}-h{h}", f"{self.prefix}h{h}"),
                               ("down", f"{self.prefix}-br", f"{self.prefix}b{h}")):
                r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev],
                                   capture_output=True, text=True)
                m = re.search(r"qdisc tbf .*?Sent (\d+) bytes", r.stdout, re.S)
                if m:
                    out[(d, h)] = int(m.group(1))
        return out

    def listening(self, host, port):
        ns = f"{self.prefix}-h{host}"
        r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"],
                           capture_output=True, text=True)
        return bool(r.stdout.strip())


def wait_all(procs, timeout):
    """Wait for every process; on timeout kill the rest. Returns (all ok, timed out)."""
    deadline = time.monotonic() + timeout
    ok, timed_out = True, False
    for p in procs:
        left = deadline - time.monotonic()
        try:
            rc = p.wait(max(left, 0.1))
        except subprocess.TimeoutExpired:
            timed_out, ok = True, False
            for q in procs:
                if q.poll() is None:
                    try:
                        os.killpg(q.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    q.wait()
            break
        if rc != 0:
            ok = False
    return ok, timed_out


class Bench:
    def __init__(self, args):
        self.a = args
        self.run_id = secrets.token_hex(2)
        self.rows = []
        self.cluster = None
        b = os.path.abspath(args.build_dir)
        mb = os.path.abspath(args.mpi_build_dir or args.build_dir)
        self.server_bin = os.path.join(b, "server", "psagg-server")
        self.exchange_bin = os.path.join(b, "tests", "bench", "psagg-bench-exchange")
        self.mpi_bin = os.path.join(mb, "tests", "bench", "baselines", "psagg-bench-mpi-allreduce")
        self.logdir = args.log_dir or os.path.join(os.path.dirname(os.path.abspath(args.out)) or ".",
                                                   "cluster-logs", time.strftime("%Y%m%d-%H%M%S-") + self.run_id)

    # ---------- checks ----------
    def preflight(self):
        problems = []
        if os.geteuid() != 0:
            problems.append("needs root (network namespaces, veths, tc): run as root or with sudo")
        for t in ["ip", "tc", "unshare", "ss"]:
            if not shutil.which(t):
                problems.append(f"'{t}' not found (install iproute2 / util-linux)")
        for f in [NETCLUSTER, NETNS_RSH]:
            if not os.access(f, os.X_OK):
                problems.append(f"{f} missing or not executable")
        if problems:
            for p in problems:
                log("error: " + p)
            sys.exit(1)
        self.have = {}
        self.have["mpi"] = (None if shutil.which("mpirun") and os.access(self.mpi_bin, os.X_OK)
                            else f"not built ({self.mpi_bin})" if shutil.which("mpirun") else "mpirun not found")
        r = subprocess.run([PYTHON_TORCH, "-c", "import torch.distributed as d; assert d.is_available()"],
                           capture_output=True)
        self.have["gloo"] = None if r.returncode == 0 else f"torch.distributed not importable by {PYTHON_TORCH}"
        missing = [p for p in (self.server_bin, self.exchange_bin) if not os.access(p, os.X_OK)]
        self.have["psagg"] = None if not missing else "not built (" + ", ".join(missing) + ")"
        for k, v in self.have.items():
            if v:
                log(f"{k}: {v} -> its rows are recorded as such")

    # ---------- plan ----------
    def placements(self):
        out = []
        for p in self.a.placements:
            if p == "colocated":
                out.append(("colocated", self.a.workers, list(range(self.a.workers))))
            else:
                s = int(p.lstrip("Ss"))
                out.append((f"S{s}", s, list(range(self.a.workers, self.a.workers + s))))
        return out

    def timeout_for(self, elements, rate, servers):
        """Generous per-run time limit: every step at 6x the busiest wire time, plus start-up."""
        n = self.a.workers
        fp32_bytes = 4.0 * elements
        busiest = max(2.0 * (n - 1) / n * fp32_bytes, fp32_bytes * n / max(min(servers, n), 1))
        return 90 + (self.a.steps + self.a.warmup) * 6 * busiest * 8 / rate_bps(rate)

    # ---------- one run of each system ----------
    def run_gloo(self, c, model, rate, tag):
        n = self.a.workers
        path = self.model_path(model)
        self.port_seq = getattr(self, "port_seq", 0) + 1
        port = 29500 + (int(self.run_id, 16) + self.port_seq) % 1000
        procs = []
        for r in range(n):
            argv = [PYTHON_TORCH, GLOO_PY, "--model", path, "--rank", str(r), "--world-size", str(n),
                    "--master", f"10.77.0.10:{port}", "--steps", str(self.a.steps), "--warmup", str(self.a.warmup)]
            procs.append(c.start(r, argv, os.path.join(self.logdir, f"{tag}-gloo-rank{r}.log")))
        if c.dry:
            return None, "dry run"
        ok, to = wait_all(procs, self.timeout_for(read_elements(path), rate, n))
        res = parse_result(open(procs[0].logpath, errors="replace").read(), "gloo")
        if not ok or not res:
            return None, ("timed out" if to else "failed") + f" (logs {self.logdir}/{tag}-gloo-rank*.log)"
        return res, ""

    def run_mpi(self, c, model, rate, tag):
        n = self.a.workers
        path = self.model_path(model)
        hosts = ",".join(f"10.77.0.{10 + r}:1" for r in range(n))
        argv = ["mpirun", "--allow-run-as-root", "-np", str(n), "--host", hosts,
                "--mca", "plm_rsh_agent", NETNS_RSH, "--mca", "plm_rsh_no_tree_spawn", "1",
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "oob_tcp_if_include", "10.77.0.0/24",
                "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none",
                "-x", "NETCLUSTER_PREFIX"]
        alg = MPI_ALGS[self.a.mpi_alg]
        if alg is not None:
            argv += ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", str(alg)]
        argv += [self.mpi_bin, "--model", path, "--steps", str(self.a.steps), "--warmup", str(self.a.warmup)]
        p = c.start(0, argv, os.path.join(self.logdir, f"{tag}-mpi.log"), env={"NETCLUSTER_PREFIX": c.prefix})
        if c.dry:
            return None, "dry run"
        ok, to = wait_all([p], self.timeout_for(read_elements(path), rate, n))
        res = parse_result(open(p.logpath, errors="replace").read(), "mpi")
        if not ok or not res:
            return None, ("timed out" if to else "failed") + f" (log {p.logpath})"
        return res, ""

    def write_config(self, path, job, server_hosts, codec, port):
        servers = " ".join(f"10.77.0.{10 + h}:{port}" for h in server_hosts)
        text = (f"[cluster]\njob_id = {job}\nservers = {servers}\nworkers = {self.a.workers}\n"
                f"provider = tcp\nconnect_timeout_ms = 60000\nop_timeout_ms = 120000\n"
                # (a sparse codec is a tensor's, never [codec] default: the exchange declares it)
                f"[codec]\ndefault = {'maxmin4' if codec.startswith('topk') else codec}\n")
        for section, lines in self.ini_extra().items():
            text += f"[{section}]\n" + "".join(f"{l}\n" for l in lines)
        if path:
            with open(path, "w") as f:
                f.write(text)
        return text

    def ini_extra(self):
        """--psagg-set SECTION.KEY=VALUE entries, grouped by section."""
        out = {}
        for kv in self.a.psagg_set:
            key, value = kv.split("=", 1)
            section, k = key.split(".", 1)
            out.setdefault(section, []).append(f"{k} = {value}")
        return out

    def psagg_env(self, cfg=None):
        """The environment of every psagg process of a run: the job's libfabric limits
        (psagg-server --fabric-env, when a config is given and exists), then --psagg-env."""
        env = {}
        if cfg and os.path.exists(cfg):
            out = subprocess.run([self.server_bin, "--config", cfg, "--fabric-env"], check=True,
                                 capture_output=True, text=True, timeout=20).stdout
            env.update(line.split("=", 1) for line in out.split("\n") if "=" in line)
        env.update(kv.split("=", 1) for kv in self.a.psagg_env.split(",") if kv)
        return env

    def run_psagg(self, c, model, rate, placement, server_hosts, codec, tag):
        n = self.a.workers
        path = self.model_path(model)
        # (a job id of letters, digits, '.', '-' and '_': topk2:0.02 has a colon)
        cfg = os.path.join(self.logdir, f"{tag}-psagg-{codec}.ini")
        job = re.sub(r"[^A-Za-z0-9._-]", "_", f"bench-{self.run_id}-{tag}-{codec}")
        # a fresh port per run: a server's listening port may linger in TIME_WAIT
        self.psagg_seq = getattr(self, "psagg_seq", -1) + 1
        port = SERVER_PORT + self.psagg_seq % 100
        if c.dry:
            print(f"    # {cfg}:\n" + "".join(f"    #   {l}\n" for l in self.write_config(None, job, server_hosts, codec, port).splitlines()))
        else:
            self.write_config(cfg, job, server_hosts, codec, port)
        servers = []
        penv = self.psagg_env(None if c.dry else cfg)
        for i, h in enumerate(server_hosts):
            servers.append(c.start(h, [self.server_bin, "--config", cfg, "--rank", str(i)],
                                   os.path.join(self.logdir, f"{tag}-psagg-{codec}-server{i}.log"),
                                   penv))
        workers = []
        try:
            if not c.dry:
                deadline = time.monotonic() + 20
                pending = list(enumerate(server_hosts))
                while pending and time.monotonic() < deadline:
                    for s in servers:
                        if s.poll() is not None:
                            return None, f"server exited with {s.returncode} (log {s.logpath})"
                    pending = [(i, h) for i, h in pending if not c.listening(h, port)]
                    if pending:
                        time.sleep(0.1)
                if pending:
                    log(f"servers {[i for i, _ in pending]} not listening on :{port} after 20 s; starting workers anyway")
            for r in range(n):
                env = {"PSAGG_CONFIG": cfg, "PSAGG_RANK": str(r), "PSAGG_WORLD_SIZE": str(n), **penv}
                argv = [self.exchange_bin, "--model", path, "--codec", codec, "--steps", str(self.a.steps),
                        "--warmup", str(self.a.warmup), "--link-gbit", f"{rate_bps(rate) / 1e9:g}"]
                if placement == "colocated":
                    argv.append("--colocated")  # busiest-link bytes: local traffic stays on the host
                if self.a.model_gpu is not None:  # workers modelled as GPU workers (gpu_model.h)
                    argv += ["--model-gpu", f"{self.a.model_gpu:g}"]
                if self.a.server_optimizer:  # parameters: the optimizer step on the servers
                    argv.append("--server-optimizer")
                workers.append(c.start(r, argv, os.path.join(self.logdir, f"{tag}-psagg-{codec}-worker{r}.log"), env))
            if c.dry:
                return None, "dry run"
            ok, to = wait_all(workers, self.timeout_for(read_elements(path), rate, len(server_hosts)))
            res = parse_result(open(workers[0].logpath, errors="replace").read(), "psagg")
            if not ok or not res:
                bad = [w.logpath for w in workers if w.returncode != 0] or [workers[0].logpath]
                return None, ("timed out" if to else "failed") + f" (log {bad[0]}: {tail(bad[0], 2).strip()[-160:]})"
            # CPU per step of each role: the workers' own lines, and the servers' usage lines,
            # which they log as they exit after the last BYE (give them a moment to)
            wait_all(servers, 10)
            res["workers_cpu_ms"] = cpu_sum([w.logpath for w in workers], r"CPU rank=\d+ cpu_ms=([0-9.]+)")
            res["servers_cpu_ms"] = cpu_sum([p.logpath for p in servers], r"cpu_ms_per_round=([0-9.]+)")
            return res, ""
        finally:
            for s in servers:
                c.stop(s)

    # ---------- driver ----------
    def model_path(self, model):
        return os.path.join(REPO, "tests", "data", "models", f"{model}.sizes")

    def add_row(self, **kw):
        row = {k: "" for k in CSV_FIELDS}
        row.update(steps=self.a.steps, warmup=self.a.warmup, workers=self.a.workers)
        row.update(kw)
        self.rows.append(row)
        if not self.a.dry_run:
            med = row["median_ms"]
            log(f"  {row['model']} {row['rate_gbit']}G {row['placement'] or '-':9s} {row['system']:5s} "
                f"{row['codec']:8s} {row['status']}" + (f" median {med} ms (wire {row['wire_limit_ms']} ms)"
                                                         if med != "" else f" {row['note']}"))

    def measured(self, before, after):
        """Bytes per step on the busiest shaped link direction during a run, from the tbf
        counters (start-up, warm-up and barrier traffic included, hence a slight excess):
        evidence that the traffic crossed the emulated links."""
        deltas = [after[k] - before.get(k, 0) for k in after]
        if not deltas:
            return ""
        return f"{max(deltas) / (self.a.steps + self.a.warmup):.0f}"

    def result_row(self, model, rate, placement, servers, system, codec, res, err, wire_ms=None, measured=""):
        if res is None:
            status = "dry-run" if self.a.dry_run else "failed"
            return self.add_row(model=model, rate_gbit=f"{rate_bps(rate) / 1e9:g}", placement=placement,
                                servers=servers, system=system, codec=codec, status=status, note=err,
                                measured_link_bytes=measured)
        med = float(res["median_ms"])
        busiest = res.get("busiest_link_bytes", "")
        if wire_ms is None and busiest:
            wire_ms = float(busiest) * 8 / rate_bps(rate) * 1e3
        self.add_row(model=model, rate_gbit=f"{rate_bps(rate) / 1e9:g}", placement=placement, servers=servers,
                     system=system, codec=codec, status="ok", median_ms=f"{med:.1f}",
                     p10_ms=f"{float(res['p10_ms']):.1f}", p90_ms=f"{float(res['p90_ms']):.1f}",
                     wire_limit_ms=f"{wire_ms:.1f}" if wire_ms is not None else "",
                     wire_efficiency=f"{wire_ms / med:.2f}" if wire_ms else "",
                     busiest_link_bytes=busiest, measured_link_bytes=measured,
                     workers_cpu_ms=res.get("workers_cpu_ms", ""), servers_cpu_ms=res.get("servers_cpu_ms", ""),
                     worker_model=(f"gpu {res['gpu_gelem_s']} Gelem/s" if res.get("worker_model") == "gpu"
                                   else "cpu") if system == "psagg" else "",
                     note=err)

    def run(self):
        os.makedirs(self.logdir, exist_ok=True) if not self.a.dry_run else None
        n = self.a.workers
        places = self.placements()
        log(f"run {self.run_id}: models {self.a.models}, rates {self.a.rates}, placements "
            f"{[p[0] for p in places]}, codecs {self.a.codecs}, systems {self.a.systems}, "
            f"N={n}, {self.a.warmup} warm-up + {self.a.steps} timed steps; logs in {self.logdir}")
        log(f"psagg tuning: environment from psagg-server --fabric-env, plus {self.psagg_env() or 'nothing'}; extra INI keys {self.ini_extra() or 'none'}")
        for rate in self.a.rates:
            baselines_done = False
            for placement, s, server_hosts in places:
                hosts = max([n] + [h + 1 for h in server_hosts])
                prefix = f"psg{self.run_id}{'c' if placement == 'colocated' else placement[1:]}"[:11]
                c = Cluster(prefix, hosts, rate, self.a.delay, self.a.dry_run)
                self.cluster = c
                if self.a.dry_run:
                    print(f"\n== cluster {prefix}: {hosts} hosts at {rate}, placement {placement}: workers on hosts "
                          f"0..{n - 1}, servers on hosts {server_hosts}")
                try:
                    for model in self.a.models:
                        elements = read_elements(self.model_path(model))
                        ring_ms = 2.0 * (n - 1) / n * 4 * elements * 8 / rate_bps(rate) * 1e3
                        tag = f"{model}-{rate}-{placement}"
                        if not baselines_done:
                            for system, fn in (("gloo", self.run_gloo), ("mpi", self.run_mpi)):
                                if system not in self.a.systems:
                                    continue
                                if self.have.get(system):
                                    self.add_row(model=model, rate_gbit=f"{rate_bps(rate) / 1e9:g}", system=system,
                                                 codec="fp32", status=self.have[system].split(" (")[0],
                                                 note=self.have[system], wire_limit_ms=f"{ring_ms:.1f}")
                                    continue
                                if self.a.dry_run:
                                    print(f"  # {system} {model} fp32")
                                c.up()
                                before = c.counters()
                                res, err = fn(c, model, rate, tag)
                                self.result_row(model, rate, "", "", system, "fp32", res, err, wire_ms=ring_ms,
                                                measured=self.measured(before, c.counters()))
                        if "psagg" in self.a.systems:
                            for codec in self.a.codecs:
                                if self.have.get("psagg"):
                                    self.add_row(model=model, rate_gbit=f"{rate_bps(rate) / 1e9:g}",
                                                 placement=placement, servers=s, system="psagg", codec=codec,
                                                 status="not built", note=self.have["psagg"])
                                    continue
                                if self.a.dry_run:
                                    print(f"  # psagg {model} {codec} {placement}")
                                c.up()
                                before = c.counters()
                                res, err = self.run_psagg(c, model, rate, placement, server_hosts, codec, tag)
                                self.result_row(model, rate, placement, s, "psagg", codec, res, err,
                                                measured=self.measured(before, c.counters()))
                    baselines_done = True
                finally:
                    c.down()
                    self.cluster = None

    # ---------- output ----------
    def speedups(self):
        base = {}
        for r in self.rows:
            if r["system"] in ("gloo", "mpi") and r["status"] == "ok":
                base[(r["model"], r["rate_gbit"], r["system"])] = float(r["median_ms"])
        for r in self.rows:
            if r["system"] == "psagg" and r["status"] == "ok":
                for sysname in ("gloo", "mpi"):
                    b = base.get((r["model"], r["rate_gbit"], sysname))
                    if b:
                        r[f"speedup_vs_{sysname}"] = f"{b / float(r['median_ms']):.2f}"

    def table(self):
        cols = ["model", "rate_gbit", "placement", "system", "codec", "status", "median_ms", "p10_ms", "p90_ms",
                "wire_limit_ms", "wire_efficiency", "measured_link_bytes", "speedup_vs_gloo", "speedup_vs_mpi",
                "workers_cpu_ms", "servers_cpu_ms", "worker_model"]
        heads = ["model", "Gbit/s", "servers", "system", "codec", "status", "median ms", "p10", "p90",
                 "wire ms", "wire/med", "link B/step", "x gloo", "x mpi", "workers CPU ms", "servers CPU ms",
                 "workers"]
        data = [[str(r[c]) if c != "placement" else (r[c] or "-") for c in cols] for r in self.rows]
        w = [max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(heads)]
        lines = ["  ".join(h.ljust(w[i]) for i, h in enumerate(heads)), "  ".join("-" * x for x in w)]
        lines += ["  ".join(d[i].ljust(w[i]) for i in range(len(cols))) for d in data]
        return "\n".join(lines)

    def write_csv(self):
        os.makedirs(os.path.dirname(os.path.abspath(self.a.out)), exist_ok=True)
        with open(self.a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            w.writerows(self.rows)
        log(f"CSV: {self.a.out}")

    def plot(self):
        ok = [r for r in self.rows if r["status"] == "ok"]
        if not ok:
            log("plot: no successful rows, no PNG")
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        models = [m for m in self.a.models if any(r["model"] == m for r in ok)]
        fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 5), squeeze=False)
        markers = {"S2": "o", "S4": "s", "colocated": "^", "": "D"}
        colors = {"gloo": "black", "mpi": "tab:gray", "fp32": "tab:blue", "fp16": "tab:orange",
                  "maxmin8": "tab:green", "maxmin4": "tab:red", "maxmin2": "tab:purple"}
        for ax, model in zip(axes[0], models):
            series = {}
            for r in ok:
                if r["model"] != model:
                    continue
                key = (r["system"], r["codec"], r["placement"])
                series.setdefault(key, []).append((float(r["rate_gbit"]), float(r["median_ms"]),
                                                   float(r["p10_ms"]), float(r["p90_ms"])))
            for (system, codec, placement), pts in sorted(series.items()):
                pts.sort()
                x = [p[0] for p in pts]
                y = [p[1] for p in pts]
                yerr = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
                label = system if system != "psagg" else f"psagg {codec} {placement}"
                ax.errorbar(x, y, yerr=yerr, marker=markers.get(placement, "x"),
                            color=colors.get(system if system != "psagg" else codec, None),
                            linestyle="--" if system != "psagg" else "-", label=label, capsize=3)
            wire = sorted({(float(r["rate_gbit"]), float(r["wire_limit_ms"])) for r in self.rows
                           if r["model"] == model and r["system"] == "gloo" and r["wire_limit_ms"]})
            if wire:
                ax.plot([w[0] for w in wire], [w[1] for w in wire], ":", color="black", alpha=0.5,
                        label="ring all-reduce wire limit")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("link rate (Gbit/s)")
            ax.set_ylabel("time per step (ms, median; bars p10-p90)")
            ax.set_title(f"{model}, N={self.a.workers} workers")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        out = self.a.plot or os.path.splitext(self.a.out)[0] + ".png"
        fig.savefig(out, dpi=120)
        log(f"plot: {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="ResNet-50, 1gbit, S2 + colocated, fp32 + maxmin4, few steps")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and commands; run nothing")
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--mpi-build-dir", default=None, help="where psagg-bench-mpi-allreduce was built (default: --build-dir)")
    ap.add_argument("--out", default="tests/bench/results/cluster.csv")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--models", default=None)
    ap.add_argument("--rates", default=None)
    ap.add_argument("--placements", default=None, help="comma list of S2, S4, colocated")
    ap.add_argument("--codecs", default=None)
    ap.add_argument("--systems", default="psagg,gloo,mpi")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--delay", default="", help="one-way netem delay per link direction (needs sch_netem)")
    ap.add_argument("--mpi-alg", choices=sorted(MPI_ALGS), default="ring_segmented")
    ap.add_argument("--psagg-env", default="",
                    help="NAME=VALUE,... for every psagg process (default: none; the full run of "
                         f"tests/bench/results/cluster.md used {RXM_EAGER_ENV})")
    ap.add_argument("--model-gpu", type=float, default=None, metavar="GELEM_S",
                    help="psagg workers modelled as GPU workers: codecs not run on the CPU but waited for "
                         "at GELEM_S 1e9 elements/s (0: free), PCIe 25 GB/s (psagg-bench-exchange "
                         "--model-gpu; rows say so in worker_model)")
    ap.add_argument("--server-optimizer", action="store_true",
                    help="psagg declares the tensors as parameters (psagg-bench-exchange "
                         "--server-optimizer): the servers step their optimizer, as for "
                         "ServerOptimizer or DiLoCo's outer step; set it with --psagg-set "
                         "server.optimizer=sgd")
    ap.add_argument("--psagg-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="extra key for the generated psagg INI, e.g. worker.max_inflight=8 (repeatable)")
    a = ap.parse_args()
    short = a.short
    a.models = (a.models or ("resnet50" if short else "resnet50,vgg16,bert_base")).split(",")
    a.rates = (a.rates or ("1gbit" if short else "1gbit,10gbit")).split(",")
    a.placements = (a.placements or ("S2,colocated" if short else "S2,S4,colocated")).split(",")
    a.codecs = (a.codecs or ("fp32,maxmin4" if short else ",".join(ALL_CODECS))).split(",")
    a.systems = a.systems.split(",")
    a.steps = a.steps if a.steps is not None else (3 if short else 8)
    a.warmup = a.warmup if a.warmup is not None else (1 if short else 2)
    for m in a.models:
        if m not in MODELS:
            ap.error(f"unknown model {m} (choose from {', '.join(MODELS)})")
    for r in a.rates:
        rate_bps(r)
    for kv in a.psagg_set:
        if not re.fullmatch(r"[a-z]+\.[a-z_]+=\S+", kv):
            ap.error(f"bad --psagg-set {kv!r} (SECTION.KEY=VALUE, e.g. worker.max_inflight=8)")
    for p in a.placements:
        if not re.fullmatch(r"S[0-9]+|colocated", p):
            ap.error(f"bad placement {p} (S2, S4, colocated)")
    if a.workers < 2 or a.workers + max([int(p[1:]) for p in a.placements if p != "colocated"] or [0]) > 200:
        ap.error("--workers must be >= 2 (and workers + servers <= 200)")

    b = Bench(a)
    if a.dry_run:
        b.have = {"psagg": None, "gloo": None, "mpi": None}
        b.run()
        return 0
    b.preflight()

    def on_signal(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    rc = 0
    t0 = time.monotonic()
    try:
        b.run()
    except Interrupted as e:
        log(f"interrupted ({e}): tearing down, writing what was measured")
        rc = 130
    except subprocess.CalledProcessError as e:
        log(f"emulated cluster set-up failed ({' '.join(e.cmd[:2])}, exit {e.returncode}): stopping; "
            "writing what was measured")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if b.cluster is not None:
            b.cluster.down()
    b.speedups()
    print(f"\npsagg cluster benchmark {datetime.datetime.now():%Y-%m-%d %H:%M} (run {b.run_id}, "
          f"{time.monotonic() - t0:.0f} s): N={a.workers} workers, {a.warmup} warm-up + {a.steps} timed steps, "
          f"MPI all-reduce algorithm {a.mpi_alg}")
    print(b.table())
    b.write_csv()
    try:
        b.plot()
    except Exception as e:  # a plotting problem must not lose the CSV
        log(f"plot failed: {e}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
