"""psagg_launch.py - what deploy/psagg-ssh and deploy/psagg-slurm share: the job's plan from
its config (psagg's own parser), one supervised process per server and worker started
through a remote shell (ssh HOST, or srun -w NODE), each under a watchdog that stops its
process group when the connection's stdin closes, live "[host role rank]" lines, and the
first failure's exit status with a summary.
"""
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time

ME = os.path.basename(sys.argv[0]) or "psagg-launch"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs on each host as: bash -c WRAPPER psagg-job GRACE CMD ARGS... (inside `setsid -w`, so
# the group is the wrapper's). The program gets /dev/null as stdin; the wrapper reads the ssh
# channel, and EOF on it (we closed it, died, or the connection dropped) stops the group: TERM
# to every member but the wrapper, KILL after GRACE seconds. The wrapper polls (read -t) rather
# than `wait -n` on the program and a reader job: bash 5.2's `wait -n` never returns for a job
# that ended before the call (a connection closed before the program started), and the
# program would outlive the job.
WRAPPER = r'''
g=$1; shift
"$@" </dev/null &
c=$!
while kill -0 "$c" 2>/dev/null; do
    read -r -t 0.1 _ && continue
    (($? > 128)) || break # EOF (a timeout is > 128)
done
group() { for p in $(pgrep -g $$); do [[ $p == $$ ]] || kill -"$1" "$p" 2>/dev/null; done; }
if kill -0 "$c" 2>/dev/null; then
    group TERM
    for ((i = 0; i < g * 10; i++)); do kill -0 "$c" 2>/dev/null || break; sleep 0.1; done
    group KILL
fi
wait "$c"
'''


def log(msg):
    print("%s: %s" % (ME, msg), file=sys.stderr, flush=True)


def die(msg, code=2):
    log(msg)
    sys.exit(code)


class Proc:
    def __init__(self, host, role, rank, argv, env):
        self.host, self.role, self.rank = host, role, rank
        self.argv, self.env = argv, env
        self.label = "%s %s %d" % (host, role, rank)
        self.p = None
        self.rc = None

    def remote_command(self, grace, chdir):
        envs = ["%s=%s" % kv for kv in sorted(self.env.items())]
        inner = ["env"] + envs + self.argv
        cmd = "cd %s && exec setsid -w bash -c %s psagg-job %d %s" % (
            shlex.quote(chdir), shlex.quote(WRAPPER), grace,
            " ".join(shlex.quote(a) for a in inner))
        return cmd


def read_config(server_bin, config):
    def run(args):
        r = subprocess.run([server_bin, "--config", config] + args, capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:
            die((r.stderr or r.stdout).strip() or "%s %s failed" % (server_bin, args[0]))
        return r.stdout
    # lines end at '\n' only: str.splitlines() also splits at NEL, U+2028 and others, which
    # a value could hold (psagg-server refuses them; parsing by '\n' is the second guard)
    cfg = {}
    for line in run(["--check-config"]).split("\n"):
        if line:
            key, _, value = line.partition(" = ")
            cfg[key] = value.strip()
    fabric = dict(l.split("=", 1) for l in run(["--fabric-env"]).split("\n") if "=" in l)
    return cfg, fabric


def host_of(hostport):
    if hostport.startswith("["):
        return hostport[1:hostport.index("]")]
    return hostport.rsplit(":", 1)[0]


def plan(cfg, fabric, a, program, server_host=None):
    """The processes of the job: server i on server_host(i, address) (default: the address's
    host), then the workers on worker_hosts in rank order."""
    servers = cfg["cluster.servers"].split()
    n_workers = int(cfg["cluster.workers"])
    slots = []
    for entry in cfg.get("cluster.worker_hosts", "").split():
        host, _, n = entry.rpartition(":")
        slots.append((host, int(n)))
    if not slots:
        die("%s: [cluster] worker_hosts is not set: say where the %d workers run "
            "(\"host:slots ...\", see conf/cluster.ini)" % (a.config, n_workers))
    common = {"PSAGG_CONFIG": a.config}
    # the job's libfabric limits; the caller's own values win, as in psagg-local
    common.update({k: os.environ.get(k, v) for k, v in fabric.items()})
    py = os.path.join(os.path.dirname(os.path.dirname(a.server_bin)), "python")
    pypath = os.environ.get("PYTHONPATH", "")
    if os.path.isfile(os.path.join(py, "psagg", "__init__.py")):
        pypath = py + (":" + pypath if pypath else "")
    procs = []
    for i, sp in enumerate([] if getattr(a, "no_servers", False) else servers):
        env = dict(common, PSAGG_SERVER_RANK=str(i))
        host = server_host(i, sp) if server_host else host_of(sp)
        procs.append(Proc(host, "server", i,
                          [a.server_bin, "--config", a.config, "--rank", str(i)], env))
    rank = 0
    master = slots[0][0]
    for host, n in slots:
        for local in range(n):
            env = dict(common, PSAGG_RANK=str(rank), PSAGG_WORLD_SIZE=str(n_workers),
                       RANK=str(rank), WORLD_SIZE=str(n_workers), LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE=str(n), MASTER_ADDR=os.environ.get("MASTER_ADDR", master),
                       MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
            if pypath:
                env["PYTHONPATH"] = pypath
            procs.append(Proc(host, "worker", rank, list(program), env))
            rank += 1
    return procs


class Job:
    """rsh(proc, command) -> the local argv that runs the shell command `command` on proc.host
    (ssh HOST COMMAND, or srun ... -w NODE bash -c COMMAND)."""

    def __init__(self, a, procs, rsh, how, elastic=False):
        """elastic: [cluster] elastic = on: a worker that fails leaves the job, which goes
        on (the servers drop it); only a server's failure stops everything."""
        self.a, self.procs, self.rsh, self.how = a, procs, rsh, how
        self.elastic, self.left = elastic, 0
        self.restarted = 0  # workers started again (--restarts)
        if getattr(a, "restarts", 0) and not elastic:
            die("--restarts %d: a restarted worker joins the running job, which needs "
                "[cluster] elastic = on (without it the first failure stops the job)" % a.restarts)
        self.events = queue.Queue()  # ("exit", proc) | ("signal", name, code) | ("timeout",)
        self.out_lock = threading.Lock()

    def start(self, proc):
        argv = self.rsh(proc, proc.remote_command(self.a.grace, self.a.chdir))
        proc.p = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        threading.Thread(target=self.pump, args=(proc,), daemon=True).start()

    def pump(self, proc):
        for raw in iter(proc.p.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.out_lock:
                try:
                    print("[%s] %s" % (proc.label, line), flush=True)
                except BrokenPipeError:
                    self.events.put(("signal", "PIPE", 141))
                    break
        proc.rc = proc.p.wait()
        self.events.put(("exit", proc))

    def stop(self):
        """Close every ssh's stdin (the remote watchdogs stop their groups), wait for all."""
        for pr in self.procs:
            if pr.p and pr.p.poll() is None:
                try:
                    pr.p.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + self.a.grace + 15
        for pr in self.procs:
            if not pr.p:
                continue
            try:
                pr.p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log("%s: %s did not return after the remote stop; killing it (the remote "
                    "watchdog still stops the group when the connection drops)" % (pr.label, self.how))
                os.killpg(pr.p.pid, signal.SIGKILL)
                pr.p.wait()

    def on_exit(self, pr, workers_left):
        """A process ended: (workers left, failure or None); failure = (code, why, proc)."""
        if pr.role == "worker":
            workers_left -= 1
            servers_up = all(p.p and p.p.poll() is None for p in self.procs if p.role == "server")
            if pr.rc != 0 and self.elastic and self.restarted < getattr(self.a, "restarts", 0) \
                    and workers_left > 0 and servers_up:
                # started again on its host with its rank: it joins the running job
                self.restarted += 1
                log("%s failed: %s; starting it again (restart %d of %d): it joins the running "
                    "job" % (pr.label, describe(pr.rc), self.restarted, self.a.restarts))
                pr.env = dict(pr.env, PSAGG_RESTART=str(self.restarted))
                pr.rc = None
                self.start(pr)
                return workers_left + 1, None
            if pr.rc != 0 and self.elastic:
                log("%s failed: %s; the elastic job goes on without it" % (pr.label,
                                                                           describe(pr.rc)))
                self.left += 1
            elif pr.rc != 0:
                return workers_left, (pr.rc, "%s failed: %s" % (pr.label, describe(pr.rc)), pr)
        elif pr.rc != 0:  # a server exits 0 by itself once every worker has said BYE
            return workers_left, (pr.rc, "%s exited with %s before the workers finished"
                                  % (pr.label, describe(pr.rc)), pr)
        return workers_left, None

    def run(self):
        a = self.a
        for sig, code in (("INT", 130), ("TERM", 143), ("HUP", 129)):
            signal.signal(getattr(signal, "SIG" + sig),
                          lambda s, f, n=sig, c=code: self.events.put(("signal", n, c)))
        n_servers = sum(1 for p in self.procs if p.role == "server")
        log("config %s: starting %d server(s) and %d worker(s) with %s" % (
            a.config, n_servers, len(self.procs) - n_servers, self.how))
        t0 = time.monotonic()
        for pr in self.procs:
            self.start(pr)
        workers_left = len(self.procs) - n_servers
        failure = None  # (exit code, message)
        while workers_left > 0 and failure is None:
            try:
                ev = self.events.get(timeout=0.2)
            except queue.Empty:
                if a.timeout and time.monotonic() - t0 > a.timeout:
                    failure = (124, "timed out after %gs" % a.timeout, None)
                continue
            if ev[0] == "signal":
                failure = (ev[2], "got SIG%s" % ev[1], None)
            elif ev[0] == "exit":
                workers_left, failure = self.on_exit(ev[1], workers_left)
            if failure and failure[2] is not None:
                # the first exit to reach us is often the echo of a death a moment earlier (a
                # server's, or another worker's that the servers' ABORT stopped, over a faster
                # ssh session): let the sessions that end at the same time report, and name
                # the worker a signal killed, else a worker rather than a server
                def rank(f):
                    pr = f[2]
                    killed = pr.rc is not None and (pr.rc < 0 or pr.rc >= 128)
                    return 0 if pr.role == "worker" and killed else 1 if pr.role == "worker" else 2
                settle = time.monotonic() + 0.5
                while time.monotonic() < settle and rank(failure) > 0:
                    try:
                        ev = self.events.get(timeout=max(0.01, settle - time.monotonic()))
                    except queue.Empty:
                        break
                    if ev[0] == "exit":
                        workers_left, other = self.on_exit(ev[1], workers_left)
                        if other and other[2] is not None and rank(other) < rank(failure):
                            failure = other
        if failure:
            log(failure[1] + "; stopping everything")
        elif self.left == len(self.procs) - n_servers:
            failure = (1, "every worker of the elastic job failed", None)
            log(failure[1] + "; stopping everything")
        elif self.left:
            log("the elastic job ended without the %d worker(s) that failed; stopping the "
                "servers" % self.left)
        else:
            log("all %d worker(s) exited 0; stopping the servers" % (len(self.procs) - n_servers))
        self.stop()
        for sig in ("INT", "TERM", "HUP"):
            signal.signal(getattr(signal, "SIG" + sig), signal.SIG_IGN)
        if failure:
            log("summary: FAILED: " + failure[1])
            for p in self.procs:  # what every process ended with (stopped ones: SIGTERM/KILL)
                if p.rc not in (0, None):
                    log("  %s: %s" % (p.label, describe(p.rc)))
            return failure[0]
        return 0


def describe(rc):
    if rc is None:
        return "still running"
    if rc == 255:
        return "exit code 255 (ssh could not run it, or the program exited 255)"
    if rc < 0:
        return "killed by %s" % signal.Signals(-rc).name
    if 128 < rc < 128 + 65:
        try:
            return "status %d (killed by %s)" % (rc, signal.Signals(rc - 128).name)
        except ValueError:
            pass
    return "exit code %d" % rc


def add_common_args(ap):
    ap.add_argument("--server-bin", default=os.environ.get("PSAGG_SERVER_BIN"))
    ap.add_argument("--chdir", default=os.getcwd())
    ap.add_argument("--grace", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--restarts", type=int, default=0,
                    help="elastic jobs: start a failed worker again on its host (it joins the "
                    "running job), up to N restarts in all (torchrun's --max-restarts)")


def parse_args(ap, doc):
    """Options before --, the program after it."""
    argv = sys.argv[1:]
    if "-h" in argv[:argv.index("--") if "--" in argv else len(argv)] or \
            "--help" in argv[:argv.index("--") if "--" in argv else len(argv)]:
        print(doc)
        sys.exit(0)
    if "--" not in argv:
        die("no PROGRAM given after -- (--help)")
    cut = argv.index("--")
    a = ap.parse_args(argv[:cut])
    program = argv[cut + 1:]
    if not program:
        die("no PROGRAM given after --")
    if not a.server_bin:
        for c in (os.path.join(REPO, "build", "server", "psagg-server"),
                  os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "psagg-server")):
            if os.access(c, os.X_OK):
                a.server_bin = c
                break
        else:
            import shutil
            a.server_bin = shutil.which("psagg-server") or die(
                "no psagg-server found (build it, or use --server-bin / PSAGG_SERVER_BIN)")
    a.server_bin = os.path.abspath(a.server_bin)
    return a, program


def print_plan(procs, rsh_text):
    print("%-24s %-7s %5s  command" % ("host", "role", "rank"))
    for pr in procs:
        envs = " ".join("%s=%s" % kv for kv in sorted(pr.env.items()) if not kv[0].startswith("FI_"))
        print("%-24s %-7s %5d  %s %s" % (pr.host, pr.role, pr.rank, envs,
                                        " ".join(shlex.quote(x) for x in pr.argv)))
    print("each started as: %s" % rsh_text)
