"""psagg.launch - the one launcher of psagg jobs. deploy/psagg-local (this host), deploy/psagg-ssh
(hosts over OpenSSH) and deploy/psagg-slurm (a Slurm allocation, srun) are entry points of a few
lines into main() here; each keeps its own command line and help text (its docstring).

What they share, tested once by tests/functional/test_launcher.sh (local), test_ssh.sh and
test_slurm.sh:
  - the job's plan from its config, read by psagg's own parser (`psagg-server --config FILE
    --check-config --fabric-env`): server i and worker i with PSAGG_*, torchrun's variables,
    PYTHONPATH with the server build's python package and the job's libfabric environment;
  - the supervisor (Job): every process in a session of its own, every line it writes out at
    once as "[label] line"; the first failure, --timeout (124), a signal (128 + N) or our output
    gone (141) stops everything; an elastic job goes on when a worker fails and starts it again
    (--restarts); a job with [cluster] server_replicas >= 1 goes on when a server dies and
    starts it again (--restarts, one count with the workers'); a summary names the failure,
    how every process ended and what was restarted;
  - two ways to start and stop a process (the backends): Local (a child in its own session on
    this host; stopping sends SIGTERM, then SIGKILL after --grace, to every process group) and
    Remote (a shell command on a host over ssh or srun, under a watchdog that stops its group
    when the connection closes).
Only the standard library: the launcher runs under any python3, with torch or without.
"""
import errno
import os
import queue
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

ME = "psagg-launch"  # our messages' prefix: the command's name (main sets it)

# Runs on each host as: bash -c WRAPPER psagg-job GRACE CMD ARGS... (inside `setsid -w`, so
# the group is the wrapper's; GRACE in tenths of a second). The program gets /dev/null as stdin;
# the wrapper reads the ssh channel, and EOF on it (we closed it, died, or the connection
# dropped) stops the group: TERM to every member but the wrapper, KILL after GRACE. The wrapper
# polls (read -t) rather than `wait -n` on the program and a reader job: bash 5.2's `wait -n`
# never returns for a job that ended before the call (a connection closed before the program
# started), and the program would outlive the job.
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
    group CONT
    for ((i = 0; i < g; i++)); do kill -0 "$c" 2>/dev/null || break; sleep 0.1; done
    group KILL
fi
wait "$c"
'''

# Every signal that can be caught stops the job and everything we started, then we exit
# 128 + its number; SIGPIPE too (`psagg-local ... | head`: our reader went away). One that was
# ignored when we started (nohup's SIGHUP) stays ignored, as a shell leaves it, but for SIGINT
# and SIGQUIT (a script's background jobs start with them ignored) and SIGPIPE (python's).
SIGNALS = ("INT", "TERM", "HUP", "QUIT", "PIPE", "USR1", "USR2", "ALRM")
ALWAYS_CAUGHT = ("INT", "QUIT", "PIPE")


def log(msg):
    """A line on stderr; a reader that went away is no error (`... 2>&1 | head`)."""
    data = ("%s: %s\n" % (ME, msg)).encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass


def die(msg, code=2):
    log(msg)
    sys.exit(code)


def describe(rc, remote=False):
    """An exit status in words (128 + N: killed by signal N)."""
    if rc is None:
        return "still running"
    if rc == 255 and remote:
        return "exit code 255 (ssh could not run it, or the program exited 255)"
    if 128 < rc < 128 + 65:
        try:
            name = signal.Signals(rc - 128).name
        except ValueError:
            name = "SIG%d" % (rc - 128)
        return "status %d (killed by %s)" % (rc, name)
    return "exit code %d" % rc


# ---- the command line ----

def bundled(name):
    """The program `name` a pip-installed psagg carries (psagg/_bin/NAME), or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", name)
    return path if os.path.isfile(path) else None


class CommandLine:
    """Options before --, PROGRAM [ARGS...] after it; -h or --help before -- prints the doc.
    Errors exit 2 with the usage line (the doc's "Usage:" paragraph)."""

    def __init__(self, doc, spec):
        """spec: {"--name": default}; False makes a flag, a list a repeatable option, anything
        else an option with a value (its text; the caller checks it)."""
        self.doc = doc
        m = re.search(r"^Usage: (.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
        self.usage = "usage: " + " ".join(m.group(1).split()) if m else None
        argv = sys.argv[1:]
        cut = argv.index("--") if "--" in argv else len(argv)
        if "-h" in argv[:cut] or "--help" in argv[:cut]:
            print(doc)
            sys.exit(0)
        self.opts = {}
        for name, default in spec.items():
            self.opts[name] = list(default) if isinstance(default, list) else default
        i = 0
        while i < cut:
            name, eq, value = argv[i].partition("=")
            if name not in spec or (eq and spec[name] is False):
                self.error("unknown argument '%s' (PROGRAM goes after --)" % argv[i])
            i += 1
            if spec[name] is False:
                self.opts[name] = True
                continue
            if not eq:
                if i >= cut:
                    self.error("%s needs a value" % name)
                value = argv[i]
                i += 1
            if isinstance(spec[name], list):
                self.opts[name].append(value)
            else:
                self.opts[name] = value
        self.program = argv[cut + 1:]
        if not self.program:
            self.error("no PROGRAM given after --")

    def __getitem__(self, name):
        return self.opts[name]

    def error(self, msg):
        log(msg)
        if self.usage:
            log(self.usage)
        sys.exit(2)

    def number(self, name, what="a number", minimum=0):
        """An option's non-negative integer (None when not given)."""
        text = self.opts[name]
        if text is None:
            return None
        if not re.fullmatch(r"[0-9]+", text) or int(text) < minimum:
            self.error("%s needs %s, not '%s'" % (name, what, text))
        return int(text)

    def seconds(self, name, positive=False):
        """An option's number of seconds, "1" or "0.5" (None when not given)."""
        text = self.opts[name]
        if text is None:
            return None
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) or (positive and float(text) == 0):
            self.error("%s needs a %snumber of seconds, not '%s'"
                       % (name, "positive " if positive else "", text))
        return float(text)

    def recovery(self, cfg, restarts):
        """(elastic: [cluster] elastic = on, replicas: [cluster] server_replicas); --restarts N
        needs one of them: a restarted worker joins an elastic job, a restarted server rejoins
        a job with replicas."""
        elastic = cfg.get("cluster.elastic") == "on"
        replicas = int(cfg.get("cluster.server_replicas") or 0)
        if restarts and not elastic and replicas < 1:
            self.error("--restarts %d needs [cluster] elastic = on (a restarted worker joins the "
                       "running job) or [cluster] server_replicas >= 1 (a restarted server "
                       "rejoins it); with neither the first failure stops the job" % restarts)
        return elastic, replicas

    def config(self, resolve):
        """--config FILE, made absolute (resolve: symlinks resolved too)."""
        path = self.opts["--config"]
        if not path:
            self.error("--config is required")
        if not (os.path.isfile(path) and os.access(path, os.R_OK)):
            self.error("cannot read config file '%s'" % path)
        return os.path.realpath(path) if resolve else os.path.abspath(path)

    def server_bin(self, script_dir):
        """--server-bin (default $PSAGG_SERVER_BIN, else <repo>/build/server/psagg-server, else
        psagg-server beside the command (an install's own; a pip install's runs the one its
        package carries), else the one this package carries (psagg/_bin), else on PATH), made
        absolute."""
        path = self.opts["--server-bin"] or os.environ.get("PSAGG_SERVER_BIN")
        if not path:
            for c in (os.path.join(os.path.dirname(script_dir), "build", "server", "psagg-server"),
                      os.path.join(script_dir, "psagg-server"), bundled("psagg-server"),
                      shutil.which("psagg-server")):
                if c and os.path.isfile(c) and os.access(c, os.X_OK):
                    path = c
                    break
            else:
                self.error("no psagg-server found (build it, or use --server-bin / "
                           "PSAGG_SERVER_BIN)")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            self.error("server binary '%s' is not an executable file" % path)
        return os.path.abspath(path)


# ---- the config and the plan ----

def read_config(server_bin, config):
    """({"section.key": value} for every key, resolved; the job's libfabric environment
    {NAME: value}) from `psagg-server --config FILE --check-config --fabric-env`. psagg's own
    parser checks the file and the PSAGG_* overrides (a bad key stops us with its file:line),
    resolves every server address and computes the libfabric limits (rxm's message sizes)
    every process of the job must share: nothing here parses INI."""
    try:
        r = subprocess.run([server_bin, "--config", config, "--check-config", "--fabric-env"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        die("%s --check-config did not answer within 60 s" % server_bin)
    except OSError as e:
        die("cannot run %s: %s" % (server_bin, e.strerror))
    out, err = (r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace"))
    if r.returncode != 0:
        die((err + out).strip() or "%s --check-config failed" % server_bin)
    for line in err.split("\n"):
        if line:
            log(line)
    cfg, fabric = {}, {}
    # lines end at '\n' only: str.splitlines() also splits at NEL, U+2028 and others, which
    # a value could hold (psagg-server refuses them; parsing by '\n' is the second guard)
    for line in out.split("\n"):
        m = re.fullmatch(r"([a-z_]+\.[a-z0-9_]+) = ?(.*)", line)
        if m:
            cfg[m.group(1)] = m.group(2).strip()
        elif re.fullmatch(r"FI_[A-Z0-9_]+=[0-9]+", line):
            name, _, value = line.partition("=")
            fabric[name] = value
        elif line:
            die("unexpected line from %s --check-config: '%s'" % (server_bin, line))
    return cfg, fabric


def host_of(hostport):
    if hostport.startswith("["):
        return hostport[1:hostport.index("]")]
    return hostport.rsplit(":", 1)[0]


class Proc:
    """Server i or worker i: its argv, the variables it gets (env) and, on this host, the
    caller's variables it must not inherit (unset). host None: this host."""

    def __init__(self, host, role, rank, argv, env, unset=()):
        self.host, self.role, self.rank = host, role, rank
        self.argv, self.env, self.unset = argv, env, unset
        self.label = "%s %d" % (role, rank) if host is None else "%s %s %d" % (host, role, rank)
        self.name = self.label  # in messages: a server's label with its address (plan sets it)
        self.run = None  # the current Run (a restarted process gets a new one)
        self.rc = None  # its exit status once the supervisor has seen it end
        self.running = False  # started and its end not yet seen by the supervisor
        self.restarted = False  # the current run is a restart (--restarts)
        self.deaths = []  # the exit statuses after which it was started again

    def remote_command(self, grace, chdir):
        """The shell command that runs it on its host under the watchdog (WRAPPER)."""
        envs = ["%s=%s" % kv for kv in sorted(self.env.items())]
        inner = ["env"] + envs + self.argv
        return "cd %s && exec setsid -w bash -c %s psagg-job %d %s" % (
            shlex.quote(chdir), shlex.quote(WRAPPER), round(grace * 10),
            " ".join(shlex.quote(a) for a in inner))


def plan(config, server_bin, fabric, program, server_hosts, slots, n_workers, master,
         extra_env=None, server_addrs=()):
    """The processes of the job: server i on server_hosts[i], then the workers, whose ranks
    fill slots [(host, n), ...] in order (host None: this host). master: torchrun's
    (MASTER_ADDR, MASTER_PORT) unless the caller set them. server_addrs: [cluster] servers
    (server i's host:port, named in the supervisor's messages)."""
    common = {"PSAGG_CONFIG": config}
    common.update(extra_env or {})
    # the job's libfabric limits; the caller's own values win (they must then be every process's)
    common.update({k: os.environ.get(k, v) for k, v in fabric.items()})
    # the psagg Python package of the build the server binary comes from (<build>/python)
    py = os.path.join(os.path.dirname(os.path.dirname(server_bin)), "python")
    pypath = os.environ.get("PYTHONPATH", "")
    if os.path.isfile(os.path.join(py, "psagg", "__init__.py")):
        pypath = py + (":" + pypath if pypath else "")
    procs = []
    for i, host in enumerate(server_hosts):
        procs.append(Proc(host, "server", i, [server_bin, "--config", config, "--rank", str(i)],
                          dict(common, PSAGG_SERVER_RANK=str(i)),
                          unset=("PSAGG_RANK", "PSAGG_WORLD_SIZE")))
        if i < len(server_addrs):
            procs[-1].name = "%s (%s)" % (procs[-1].label, server_addrs[i])
    rank = 0
    for host, n in slots:
        for local in range(n):
            env = dict(common, PSAGG_RANK=str(rank), PSAGG_WORLD_SIZE=str(n_workers),
                       RANK=str(rank), WORLD_SIZE=str(n_workers), LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE=str(n), PSAGG_RESTART="0",
                       MASTER_ADDR=os.environ.get("MASTER_ADDR") or master[0],
                       MASTER_PORT=os.environ.get("MASTER_PORT") or str(master[1]))
            if pypath:
                env["PYTHONPATH"] = pypath
            procs.append(Proc(host, "worker", rank, list(program), env,
                              unset=("PSAGG_SERVER_RANK",)))
            rank += 1
    return procs


def print_plan(procs, how):
    print("%-24s %-7s %5s  command" % ("host", "role", "rank"))
    for pr in procs:
        envs = " ".join("%s=%s" % kv for kv in sorted(pr.env.items())
                        if not kv[0].startswith("FI_"))
        print("%-24s %-7s %5d  %s %s" % (pr.host, pr.role, pr.rank, envs,
                                        " ".join(shlex.quote(x) for x in pr.argv)))
    print("each started as: %s" % how)


# ---- the backends: how a process starts and how the job's processes are stopped ----

def live_groups(groups):
    """The process groups of `groups` that still have a live member. Zombies do not count: a
    member orphaned to an init that is slow to reap (as in some containers) is already dead."""
    if not os.path.isdir("/proc/self"):
        left = []
        for g in groups:
            try:
                os.killpg(g, 0)
                left.append(g)
            except OSError:
                pass
        return left
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # state ppid pgrp ... after "(comm)"
        if fields[0] not in (b"Z", b"X"):
            found.add(int(fields[2]))
    return [g for g in groups if g in found]


def signal_group(g, sig):
    try:
        os.killpg(g, sig)
    except OSError:
        pass


class Local:
    """This host: each process is a child in a session (and process group) of its own, with
    the caller's environment less `unset` plus its variables, stdin /dev/null. Stopping sends
    SIGTERM (and SIGCONT, for stopped ones) to every process group we started, then SIGKILL
    to what is left after --grace (at once on a second signal)."""
    how = ""
    remote = False
    settle = 0

    def __init__(self, grace):
        self.grace = grace

    def popen(self, proc):
        env = {k: v for k, v in os.environ.items() if k not in proc.unset}
        env.update(proc.env)
        return subprocess.Popen(proc.argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def stop(self, job):
        groups = [r.p.pid for r in job.runs]  # each run's pgid is its pid
        label = {r.p.pid: r.proc.label for r in job.runs}
        for g in groups:
            signal_group(g, signal.SIGTERM)
            signal_group(g, signal.SIGCONT)
        deadline = time.monotonic() + self.grace
        left = live_groups(groups)
        while left and not job.force and time.monotonic() < deadline:
            time.sleep(0.05)
            left = live_groups(left)
        if left:
            for g in left:
                log("%s did not stop after SIGTERM; sending SIGKILL"
                    % label.get(g, "process group %d" % g))
                signal_group(g, signal.SIGKILL)
            for _ in range(100):
                left = live_groups(left)
                if not left:
                    break
                time.sleep(0.05)


class Remote:
    """Another host: the process is a shell command run by rsh(proc, command) (ssh HOST
    COMMAND, or srun ... -w NODE bash -c COMMAND), a local child in its own session, under the
    remote watchdog (WRAPPER) that stops the remote group when the connection's stdin closes.
    Stopping closes every connection's stdin and waits for all to return."""
    remote = True
    # the first exit to reach us is often the echo of a death a moment earlier (a server's,
    # or another worker's that the servers' ABORT stopped, over a faster connection): the
    # supervisor lets exits that come this many seconds later name the failure instead
    settle = 0.5

    def __init__(self, how, rsh, grace, chdir):
        self.how, self.rsh, self.grace, self.chdir = " with " + how, rsh, grace, chdir
        self.tool = how

    def popen(self, proc):
        return subprocess.Popen(self.rsh(proc, proc.remote_command(self.grace, self.chdir)),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, job):
        for r in job.runs:
            if not r.exited.is_set():
                try:
                    r.p.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + self.grace + 15
        for r in job.runs:
            if not r.exited.wait(max(0.1, deadline - time.monotonic())):
                log("%s: %s did not return after the remote stop; killing it (the remote "
                    "watchdog still stops the group when the connection drops)"
                    % (r.proc.label, self.tool))
                signal_group(r.p.pid, signal.SIGKILL)


# ---- the supervisor ----

class Run:
    """One start of a process: its Popen, the thread that prints its output, its exit status
    once it ended (seen without reaping it: its pid, which is its group's id, stays taken
    until the job is over)."""

    def __init__(self, proc, p):
        self.proc, self.p = proc, p
        self.rc = None
        self.exited = threading.Event()
        self.pump = None


class Failure:
    def __init__(self, code, why, proc=None):
        self.code, self.why, self.proc = code, why, proc


class Job:
    """Starts the processes with a backend, prints their lines, and supervises them.

    elastic ([cluster] elastic = on): a worker that fails leaves the job, which goes on (the
    servers start a membership epoch without it); with restarts N it is started again (it joins
    the running job) while the servers and another worker still run.
    replicas ([cluster] server_replicas): with R >= 1 a server that dies (exits non-zero or by a
    signal) while the job runs does not end it (the job's other servers take its chunks over);
    with restarts N it is started again, with its command line on its host (its rank and
    port): it rejoins the running job. Not once the job is ending (a server exited 0: every
    worker said BYE) or stopping. Workers' and servers' restarts count together: N in all.
    keep_going: a failure lets the other workers run to their own end (exit status 1).
    status_of_failure: a failed process's exit status -> ours (None: the process's own)."""

    def __init__(self, config, procs, backend, timeout=None, elastic=False, restarts=0,
                 keep_going=False, status_of_failure=None, replicas=0):
        self.config, self.procs, self.backend = config, procs, backend
        self.timeout, self.elastic, self.restarts = timeout, elastic, restarts or 0
        self.replicas = replicas
        self.keep_going, self.status_of_failure = keep_going, status_of_failure
        self.n_workers = sum(1 for p in procs if p.role == "worker")
        self.n_servers = len(procs) - self.n_workers
        self.runs = []  # every Run, restarts included
        self.events = queue.Queue()  # ("exit", run) | ("signal", name, code) | ("output", proc)
        self.out_lock = threading.Lock()
        self.out_gone = False
        self.stopping = False  # set once the verdict is in: a signal then only hurries the stop
        self.force = False  # a signal came while stopping: no more grace
        self.restarted = 0  # workers and servers started again (--restarts)
        self.left = 0  # elastic: workers that failed and left the job
        self.lost = []  # replicas: servers that died and were not started again
        self.ending = False  # a server exited 0 (every worker said BYE): no server restarts
        self.failures = 0  # --keep-going: failures let pass
        self.ignored = ()  # the signals to leave ignored (main: those ignored when we started)

    # -- processes and their output --

    def start(self, proc):
        try:
            p = self.backend.popen(proc)
        except OSError as e:  # no such program, not executable: as a shell would report it
            log("%s: cannot run %s: %s" % (proc.label, proc.argv[0], e.strerror))
            run = Run(proc, None)
            run.rc = 126 if e.errno in (errno.EACCES, errno.ENOEXEC) else 127
            run.exited.set()
            proc.run, proc.running = run, True
            self.events.put(("exit", run))
            return
        run = Run(proc, p)
        self.runs.append(run)
        proc.run, proc.running = run, True
        run.pump = threading.Thread(target=self.pump, args=(proc, p.stdout), daemon=True)
        run.pump.start()
        threading.Thread(target=self.wait, args=(run,), daemon=True).start()

    def pump(self, proc, stream):
        """Every line as soon as it is written, prefixed; the last one too if it has no '\\n'."""
        prefix = ("[%s] " % proc.label).encode()
        for line in iter(stream.readline, b""):
            self.write(prefix + line + (b"" if line.endswith(b"\n") else b"\n"), proc)
        stream.close()

    def write(self, data, proc):
        with self.out_lock:
            if self.out_gone:
                return
            try:
                while data:
                    data = data[os.write(1, data):]
            except OSError:
                # our reader went away: from now on the lines go nowhere (the processes must
                # not block on a full pipe while they are stopped), and the job stops
                self.out_gone = True
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.close(null)
                self.events.put(("output", proc))

    def wait(self, run):
        """Waits for the run's process to end without reaping it, then reports it (after its
        last lines, unless something it left behind still holds its output)."""
        try:
            st = os.waitid(os.P_PID, run.p.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped at the end of the job already
            return
        run.rc = st.si_status if st.si_code == os.CLD_EXITED else 128 + st.si_status
        run.pump.join(0.2)
        run.exited.set()
        self.events.put(("exit", run))

    def on_signal(self, signum, frame):
        if self.stopping:
            if signum != signal.SIGPIPE:  # (our own writes to a reader that went away)
                self.force = True
            return
        self.events.put(("signal", signal.Signals(signum).name[3:], 128 + signum))

    # -- the rules --

    def status(self, rc):
        return self.status_of_failure if self.status_of_failure is not None else rc

    def describe(self, rc):
        return describe(rc, self.backend.remote)

    def fail(self, failure):
        """A failure: the verdict, or with --keep-going one more failure counted."""
        if not self.keep_going:
            return failure
        log("%s; the other workers go on (--keep-going)" % failure.why)
        self.failures += 1
        return None

    def running(self, role):
        return [p for p in self.procs if p.role == role and p.running]

    def on_exit(self, run, workers_left):
        """A process ended: (workers left, a failure or None, the job ended)."""
        proc = run.proc
        if proc.run is not run:
            return workers_left, None, False
        proc.rc, proc.running = run.rc, False
        what = self.describe(run.rc)
        if proc.role == "server":
            # a server exits 0 by itself once every worker of its job has said BYE
            if run.rc != 0:
                return self.server_died(proc, what, workers_left)
            self.ending = True
            if self.elastic and self.restarted and workers_left > 0 and \
                    not self.running("server") and all(p.restarted for p in self.running("worker")):
                # every member finished: a restarted worker that had not joined yet comes too late
                log("the servers ended the job (every member finished) before the %d restarted "
                    "worker(s) still running joined it; stopping them" % workers_left)
                return workers_left, None, True
            return workers_left, None, False
        workers_left -= 1
        if run.rc == 0:
            return workers_left, None, False
        if self.elastic and not self.stopping and self.restarted < self.restarts and \
                workers_left > 0 and len(self.running("server")) == self.n_servers:
            # started again (on its host) with its rank: it joins the running job
            self.restarted += 1
            log("%s failed with %s; starting it again (restart %d of %d): it joins the running "
                "job" % (proc.label, what, self.restarted, self.restarts))
            proc.env = dict(proc.env, PSAGG_RESTART=str(self.restarted))
            proc.deaths.append(run.rc)
            proc.restarted = True
            self.start(proc)
            return workers_left + 1, None, False
        if self.elastic:
            log("%s failed with %s; the elastic job goes on without it" % (proc.label, what))
            self.left += 1
            return workers_left, None, False
        return workers_left, self.fail(Failure(self.status(run.rc), "%s failed with %s"
                                               % (proc.label, what), proc)), False

    def server_died(self, proc, what, workers_left):
        """A server exited non-zero or by a signal: (workers left, a failure or None, False).
        Without replicas (or once the job ends or stops) that is a failure, as it always was;
        with them the job goes on, and the server starts again while --restarts allows."""
        if not self.replicas or self.ending or self.stopping:
            return workers_left, self.fail(Failure(
                self.status(proc.rc), "%s exited with %s before the workers finished"
                % (proc.label, what), proc)), False
        if self.restarted < self.restarts:
            # the same command line on the same host (its rank, so its port): it rejoins
            self.restarted += 1
            proc.deaths.append(proc.rc)
            log("%s died with %s: restarted (restart %d of %d); it rejoins the running job"
                % (proc.name, what, self.restarted, self.restarts))
            proc.restarted = True
            self.start(proc)
            return workers_left, None, False
        self.lost.append(proc)
        log("%s died with %s; %s: the job goes on without it ([cluster] server_replicas = %d: "
            "the other servers take its chunks over)"
            % (proc.name, what, "no restart left (--restarts %d)" % self.restarts
               if self.restarts else "not restarted (no --restarts)", self.replicas))
        return workers_left, None, False

    def ended(self, proc, failed):
        """How proc ended, for the summary; None when there is nothing to say. failed: the
        job failed (every exit status but 0 is said; else only a failed worker's, a lost
        server's and the restarts)."""
        parts = []
        rc = proc.run.rc if proc.run else None
        if rc not in (0, None) and (failed or proc.role == "worker" or proc in self.lost):
            parts.append(self.describe(rc))
        if proc in self.lost:
            parts.append("not restarted: the job went on without it")
        if proc.deaths:
            parts.append("restarted %d time(s) (--restarts), after %s"
                         % (len(proc.deaths), ", ".join(self.describe(r) for r in proc.deaths)))
        return "%s: %s" % (proc.name, "; ".join(parts)) if parts else None

    def handle(self, ev, workers_left):
        """An event: (workers left, a failure or None, the job ended)."""
        if ev[0] == "signal":
            return workers_left, Failure(ev[2], "got SIG%s" % ev[1]), False
        if ev[0] == "output":
            return workers_left, Failure(141, "the output of %s could not be written"
                                         % ev[1].label), False
        return self.on_exit(ev[1], workers_left)

    def settle(self, failure, workers_left):
        """Lets the exits that come within backend.settle seconds name the failure instead:
        a worker killed by a signal, else a worker rather than a server."""
        def rank(f):
            if f.proc is None:
                return 0
            killed = f.proc.rc is not None and f.proc.rc >= 128
            return 0 if f.proc.role == "worker" and killed else 1 if f.proc.role == "worker" else 2
        end = time.monotonic() + self.backend.settle
        while time.monotonic() < end and rank(failure) > 0:
            try:
                ev = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if ev[0] == "exit":
                workers_left, other, _ = self.on_exit(ev[1], workers_left)
                if other and other.proc is not None and rank(other) < rank(failure):
                    failure = other
        return failure

    # -- the job --

    def run(self):
        for name in SIGNALS:
            if name not in self.ignored:
                signal.signal(getattr(signal, "SIG" + name), self.on_signal)
        log("config %s: starting %d server(s) and %d worker(s)%s"
            % (self.config, self.n_servers, self.n_workers, self.backend.how))
        for proc in self.procs:
            self.start(proc)
        deadline = time.monotonic() + self.timeout if self.timeout else None
        workers_left, failure, ended = self.n_workers, None, False
        while workers_left > 0 and failure is None and not ended:
            if deadline is not None and time.monotonic() >= deadline:
                failure = Failure(124, "timed out after %gs" % self.timeout)
                break
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            try:
                ev = self.events.get(timeout=wait)
            except queue.Empty:
                continue
            workers_left, failure, ended = self.handle(ev, workers_left)
            if failure and failure.proc is not None and self.backend.settle:
                self.stopping = True
                failure = self.settle(failure, workers_left)
        self.stopping = True
        rs = " (%d restart(s))" % self.restarted if self.restarted else ""
        if self.lost:
            rs += ", without %s (server_replicas)" % ", ".join(p.name for p in self.lost)
        if failure:
            log(failure.why + "; stopping everything")
        elif self.failures:
            failure = Failure(1, "%d failure(s) (see above)" % self.failures)
            log(failure.why + "; stopping everything")
        elif self.left == self.n_workers:
            failure = Failure(1, "every worker of the elastic job failed")
            log(failure.why + "; stopping the servers")
        elif self.left:
            log("the elastic job ended without the %d worker(s) that failed%s; stopping the "
                "servers" % (self.left, rs))
        else:
            log("all %d worker(s) exited 0%s; stopping the servers" % (self.n_workers, rs))
        self.backend.stop(self)
        self.reap()
        if failure:
            log("summary: FAILED: " + failure.why)
        elif self.restarted or self.lost or self.left:
            log("summary: ok, %d restart(s) of --restarts %d%s" % (
                self.restarted, self.restarts, ", %d server(s) lost" % len(self.lost)
                if self.lost else ""))
        # what every process ended with (stopped ones: SIGTERM/KILL), and who was restarted
        for p in self.procs:
            line = self.ended(p, failure is not None)
            if line:
                log("  " + line)
        return failure.code if failure else 0

    def reap(self):
        """Every process we started, reaped; its output printed (at most 2 s for what is left
        behind holding an output pipe)."""
        for r in self.runs:
            try:
                rc = r.p.wait(5)
            except subprocess.TimeoutExpired:
                continue
            if r.rc is None:
                r.rc = 128 - rc if rc < 0 else rc
        end = time.monotonic() + 2
        for r in self.runs:
            r.pump.join(max(0.0, end - time.monotonic()))


def finish(code):
    """Exits at once with everything written: the output threads may still be blocked on
    pipes that something left behind holds, which an interpreter's shutdown would wait on."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# ---- the three commands ----

def free_port():
    """A port for MASTER_PORT below Linux's ephemeral range (32768-60999), where no outgoing
    connection takes it, with no socket on it in any state (TIME_WAIT too; without ss: no
    listener)."""
    port = 0
    for _ in range(50):
        port = 20000 + random.randrange(12000)
        if shutil.which("ss"):
            r = subprocess.run(["ss", "-Htan", "( sport = :%d or dport = :%d )" % (port, port)],
                               capture_output=True, text=True)
            if not r.stdout.strip():
                break
        else:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) != 0:
                    break
    return port


def main_local(cl, script_dir):
    config = cl.config(resolve=True)
    timeout = cl.seconds("--timeout", positive=True)
    grace = cl.seconds("--grace")
    restarts = cl.number("--restarts")
    server_bin = cl.server_bin(script_dir)
    cfg, fabric = read_config(server_bin, config)
    elastic, replicas = cl.recovery(cfg, restarts)
    addrs = cfg.get("cluster.servers", "").split()
    extra = {}
    n_servers = cl.number("--servers")
    if n_servers is None:
        n_servers = len(addrs)
    elif n_servers > len(addrs):
        cl.error("--servers %d: %s lists only %d server addresses"
                 % (n_servers, config, len(addrs)))
    elif n_servers > 0:
        extra["PSAGG_CLUSTER_SERVERS"] = " ".join(addrs[:n_servers])
    n_workers = cl.number("--workers", "a number >= 1", minimum=1)
    if n_workers is None:
        n_workers = int(cfg["cluster.workers"])
    else:
        extra["PSAGG_CLUSTER_WORKERS"] = str(n_workers)
    # torchrun's variables, so that dist.init_process_group("gloo") works unchanged: one host,
    # MASTER_ADDR 127.0.0.1 and a free port (unless the caller set them)
    master = ("127.0.0.1", os.environ.get("MASTER_PORT") or free_port())
    procs = plan(config, server_bin, fabric, cl.program, [None] * n_servers, [(None, n_workers)],
                 n_workers, master, extra, server_addrs=addrs)
    return Job(config, procs, Local(grace), timeout=timeout, elastic=elastic, restarts=restarts,
               keep_going=cl["--keep-going"], status_of_failure=1, replicas=replicas)


REMOTE_OPTIONS = {"--config": None, "--server-bin": None, "--chdir": None, "--grace": "5",
                  "--timeout": None, "--dry-run": False, "--restarts": "0"}


def worker_slots(cfg, config):
    slots = []
    for entry in cfg.get("cluster.worker_hosts", "").split():
        host, _, n = entry.rpartition(":")
        slots.append((host, int(n)))
    if not slots:
        die("%s: [cluster] worker_hosts is not set: say where the %s workers run "
            "(\"host:slots ...\", see conf/cluster.ini)" % (config, cfg.get("cluster.workers")))
    return slots


def main_ssh(cl, script_dir):
    config = cl.config(resolve=False)
    timeout, grace = cl.seconds("--timeout", positive=True), cl.seconds("--grace")
    restarts = cl.number("--restarts")
    server_bin = cl.server_bin(script_dir)
    cfg, fabric = read_config(server_bin, config)
    elastic, replicas = cl.recovery(cfg, restarts)
    slots = worker_slots(cfg, config)
    addrs = cfg["cluster.servers"].split()
    servers = [] if cl["--no-servers"] else [host_of(s) for s in addrs]
    procs = plan(config, server_bin, fabric, cl.program, servers, slots,
                 int(cfg["cluster.workers"]), (slots[0][0], 29500), server_addrs=addrs)
    ssh = shlex.split(cl["--ssh"]) + ["-o", "BatchMode=yes"]
    for o in cl["--ssh-option"]:
        ssh += ["-o", o]
    if cl["--dry-run"]:
        print_plan(procs, " ".join(shlex.quote(x) for x in ssh) + " HOST '<watchdog> COMMAND'")
        return None
    backend = Remote("ssh", lambda proc, command: ssh + [proc.host, command], grace,
                     cl["--chdir"] or os.getcwd())
    return Job(config, procs, backend, timeout=timeout, elastic=elastic, restarts=restarts,
               replicas=replicas)


def scontrol(*args):
    r = subprocess.run(["scontrol"] + list(args), capture_output=True, text=True)
    if r.returncode:
        die("scontrol %s failed: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def tasks_per_node(text, n):
    """SLURM_TASKS_PER_NODE ("2(x3),1") -> [2, 2, 2, 1]."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            die("cannot read SLURM_TASKS_PER_NODE='%s'" % text)
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out if len(out) == n else [out[0]] * n


def write_ini(resolved, path):
    sections = {}
    for key, value in resolved.items():
        sec, _, name = key.partition(".")
        sections.setdefault(sec, []).append((name, value))
    with open(path, "w") as f:
        f.write("; written by psagg-slurm for Slurm job %s\n" % os.environ.get("SLURM_JOB_ID"))
        for sec, items in sections.items():
            f.write("[%s]\n" % sec)
            for name, value in items:
                if value != "":
                    f.write("%s = %s\n" % (name, value))


def main_slurm(cl, script_dir):
    placement = cl["--placement"]
    if placement not in ("colocated", "own"):
        cl.error("--placement needs colocated or own, not '%s'" % placement)
    n_servers = cl.number("--servers") or 0
    per_node = cl.number("--workers-per-node") or 0
    port = cl.number("--port") or 0
    template = cl.config(resolve=False)
    timeout, grace = cl.seconds("--timeout", positive=True), cl.seconds("--grace")
    restarts = cl.number("--restarts")
    server_bin = cl.server_bin(script_dir)
    jobid = os.environ.get("SLURM_JOB_ID")
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not jobid or not nodelist:
        die("not inside a Slurm allocation (no SLURM_JOB_ID / SLURM_JOB_NODELIST): run it "
            "from sbatch or salloc")
    nodes = scontrol("show", "hostnames", nodelist).split()
    slots = tasks_per_node(os.environ.get("SLURM_TASKS_PER_NODE", "1"), len(nodes))
    if per_node:
        slots = [per_node] * len(nodes)
    if placement == "own":
        n_servers = n_servers or 1
        if n_servers >= len(nodes):
            die("--placement own: %d server node(s) leave no node for workers in %s (%d "
                "nodes)" % (n_servers, nodelist, len(nodes)))
        worker_nodes = list(zip(nodes[n_servers:], slots[n_servers:]))
    else:
        n_servers = n_servers or len(nodes)
        if n_servers > len(nodes):
            die("--servers %d: the allocation has %d nodes" % (n_servers, len(nodes)))
        worker_nodes = list(zip(nodes, slots))
    server_nodes = nodes[:n_servers]
    addr = {}
    for n in server_nodes:
        m = re.search(r"\bNodeAddr=(\S+)", scontrol("show", "node", "-o", n))
        addr[n] = m.group(1) if m else n
    port = port or 20000 + (int(jobid) % 400) * 30
    # the template, resolved by psagg's parser, with this allocation's cluster keys
    resolved, _ = read_config(server_bin, template)
    resolved["cluster.servers"] = " ".join("%s:%d" % (addr[n], port + i)
                                           for i, n in enumerate(server_nodes))
    resolved["cluster.workers"] = str(sum(k for _, k in worker_nodes))
    resolved["cluster.worker_hosts"] = " ".join("%s:%d" % nk for nk in worker_nodes)
    config = os.path.abspath(cl["--job-config"] or "psagg-slurm-%s.ini" % jobid)
    write_ini(resolved, config)
    log("allocation %s (%s): %d server(s) on %s, %s worker(s) on %s; job config %s" % (
        jobid, nodelist, n_servers, ",".join(server_nodes), resolved["cluster.workers"],
        resolved["cluster.worker_hosts"], config))
    cfg, fabric = read_config(server_bin, config)  # checked again: addresses resolve
    elastic, replicas = cl.recovery(cfg, restarts)
    slots = worker_slots(cfg, config)
    procs = plan(config, server_bin, fabric, cl.program, server_nodes, slots,
                 int(cfg["cluster.workers"]), (slots[0][0], 29500),
                 server_addrs=cfg["cluster.servers"].split())
    if cl["--dry-run"]:
        print_plan(procs, "srun --overlap -N1 -n1 -w NODE bash -c '<watchdog> COMMAND'")
        return None

    def rsh(proc, command):
        return ["srun", "--overlap", "-N1", "-n1", "-w", proc.host, "--quiet",
                "--job-name", "psagg-%s%d" % (proc.role, proc.rank), "bash", "-c", command]
    backend = Remote("srun", rsh, grace, cl["--chdir"] or os.getcwd())
    return Job(config, procs, backend, timeout=timeout, elastic=elastic, restarts=restarts,
               replicas=replicas)


COMMANDS = {
    "local": (main_local, {"--config": None, "--servers": None, "--workers": None,
                           "--server-bin": None, "--timeout": None, "--grace": "5",
                           "--keep-going": False, "--restarts": "0"}),
    "ssh": (main_ssh, dict(REMOTE_OPTIONS, **{"--ssh-option": [], "--ssh": "ssh",
                                              "--no-servers": False})),
    "slurm": (main_slurm, dict(REMOTE_OPTIONS, **{"--placement": "colocated", "--servers": None,
                                                  "--workers-per-node": None, "--port": None,
                                                  "--job-config": None})),
}



# ---- the commands' help (psagg-local --help prints it) ----

LOCAL_DOC = r"""psagg-local - run a psagg job on this host: S psagg-server processes and N workers.

Usage: psagg-local --config FILE [--servers S] [--workers N] [--server-bin PATH]
                   [--timeout SEC] [--grace SEC] [--keep-going] [--restarts N]
                   -- PROGRAM [ARGS...]

  --config FILE      the job's INI file (e.g. conf/local.ini); passed to every process
  --servers S        servers to start (default: the entries of [cluster] servers); when
                     given, every process gets PSAGG_CLUSTER_SERVERS = the first S entries
  --workers N        workers to start (default: [cluster] workers); when given, every
                     process gets PSAGG_CLUSTER_WORKERS=N so that all of them agree
  --server-bin PATH  psagg-server to run (default: $PSAGG_SERVER_BIN, else
                     <repo>/build/server/psagg-server, else psagg-server beside this
                     script or on PATH)
  --timeout SEC      stop everything and fail (exit 124) after SEC seconds
  --grace SEC        seconds between SIGTERM and SIGKILL when stopping (default 5)
  --keep-going       when a worker fails or a server exits, let the other workers run to
                     their own end (they fail by themselves within op_timeout_ms when the
                     job is broken) instead of stopping them; the exit status is still 1
  --restarts N       up to N restarts in all, workers' and servers' together (torchrun's
                     --max-restarts); needs [cluster] elastic = on or server_replicas >= 1.
                     Elastic: a worker that fails is started again with its rank (it joins
                     the running job; PSAGG_RESTART says the how-manyth start it is).
                     server_replicas >= 1: a server that dies is started again with its
                     command line (its rank and port; it rejoins the running job)

The config is read by psagg's own parser, never by this script: `psagg-server --config FILE
--check-config --fabric-env` checks it (a bad key stops us with its file:line), prints it
resolved and prints the libfabric environment every process of the job must share (rxm's
message limits; variables already set are kept). So a server binary is needed even with
--servers 0.

Server i runs as `psagg-server --config FILE --rank i` with PSAGG_SERVER_RANK=i and
PSAGG_CONFIG=FILE; worker i runs PROGRAM with PSAGG_RANK=i, PSAGG_WORLD_SIZE=N and
PSAGG_CONFIG=FILE (FILE made absolute), both with that libfabric environment. Workers also
get torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
(a free port unless set), so torch.distributed works unchanged, and PYTHONPATH starts with
the psagg Python package of the server binary's build (<build>/python) when there is one.
Every line a process writes (stdout or stderr) appears on our stdout as "[server i] ..." or
"[worker i] ..." as soon as it is written.

An elastic job ([cluster] elastic = on) goes on when a worker fails: the others keep running
(the servers start a membership epoch without it) and the exit status is 0 if every server
was still there when the last worker ended and at least one worker finished. With
--restarts the failed worker is started again while the servers and another worker still
run; it joins the job at the members' next barrier.

A job with [cluster] server_replicas >= 1 (docs/server-failover.md) goes on when a server
dies (exits non-zero or by a signal) before the workers are done: the other servers take its
chunks over. With --restarts it is started again, the same command line on this host (same
rank, same port), and rejoins the running job: "server 1 (127.0.0.1:19501) died with status
137 (killed by SIGKILL): restarted (restart 1 of 2)"; once the restarts are spent it is left
dead and the job goes on without it. A server that exits 0 (the workers said BYE: the job
is ending) or dies while the job is stopped is not restarted, and a worker that fails still
ends a job that is not elastic. The summary names every restart and every server left dead.

Exit status: 0 when every worker exits 0 (the servers are then stopped); 1 when a worker
fails (not in an elastic job) or a server exits before the workers are done (without
server_replicas; the message names it and its status); 124 on --timeout; 2 for usage or
config errors; 128 + N on signal N (INT 130, TERM 143, HUP 129, QUIT 131, PIPE 141, USR1,
USR2, ALRM): every one stops the job first. 141 also when our output can no longer be written
(`psagg-local ... | head`). Each process runs in its own session (setsid), and stopping sends
SIGTERM, then SIGKILL after the grace period, to each whole process group, so nothing is left
behind: not the processes, not our own timer and output filters. (Not even this script can
clean up after a SIGKILL of itself.)"""

SSH_DOC = r"""psagg-ssh - run a psagg job on a cluster over OpenSSH, from the job's INI file.

Usage: psagg-ssh --config FILE [--ssh-option OPT]... [--ssh CMD] [--server-bin PATH]
                 [--chdir DIR] [--grace SEC] [--timeout SEC] [--dry-run] [--restarts N] -- PROGRAM [ARGS...]

The config says where everything runs: server i on the host of [cluster] servers entry i,
the workers on [cluster] worker_hosts ("host:slots ..."; ranks fill the hosts in order). It
is checked first by psagg's own parser (`psagg-server --config FILE --check-config`: file:line
for a bad key, every server address must resolve); nothing starts if it is wrong.

  --ssh-option OPT   passed to ssh as -o OPT (repeatable), e.g. --ssh-option Port=2222
  --ssh CMD          the ssh command, split on spaces (default "ssh"; e.g. "ssh -F cfg");
                     ssh runs non-interactively (BatchMode=yes) and honours the user's config
  --server-bin PATH  psagg-server on the hosts (default: the one beside this script's build,
                     <repo>/build/server/psagg-server, else psagg-server on PATH)
  --chdir DIR        working directory on every host (default: the current one)
  --grace SEC        seconds between SIGTERM and SIGKILL when stopping (default 5)
  --timeout SEC      stop everything and fail (exit 124) after SEC seconds
  --dry-run          print the plan (host, role, rank, command) and start nothing
  --restarts N       up to N restarts in all, workers' and servers' together (torchrun's
                     --max-restarts); needs [cluster] elastic = on or server_replicas >= 1.
                     Elastic: a worker that fails is started again on its host with its
                     rank and joins the running job (PSAGG_RESTART=k). server_replicas >= 1:
                     a server that dies (non-zero exit, signal) while the job runs is started
                     again on its host with its command line (same rank and port) and
                     rejoins the job; once the restarts are spent the job goes on without it
  --no-servers       start only the workers: the servers already run (e.g. under systemd,
                     deploy/systemd/psagg-server@.service)

Paths (the config, the binaries, the program, --chdir) must be the same on every host, as
with mpirun: a shared file system or identical installs. Every process gets PSAGG_CONFIG,
PSAGG_RANK / PSAGG_SERVER_RANK, PSAGG_WORLD_SIZE, torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR (the first worker host) and MASTER_PORT (29500 unless set),
PYTHONPATH with the build's python package, and the job's libfabric environment
(`psagg-server --fabric-env`). Every line a process writes comes out as
"[host role rank] line" as soon as it is written.

Stopping: on the first failure (a worker exits non-zero, a server exits before the workers
are done without [cluster] server_replicas, ssh cannot reach a host), on Ctrl-C or on
--timeout, every remote process group is stopped: each remote process runs in its own session
under a small watchdog that reads the ssh connection; when we close it (or die, or the
connection drops) the watchdog sends SIGTERM to the group and SIGKILL after --grace. We wait
for every ssh to return, so when we exit nothing of the job runs anywhere. Exit status: the
first failure's (a worker's exit code; 255 when ssh failed), 124 on --timeout, 128+N on
signal N, 2 for usage and config errors, 0 when every worker exited 0. A summary names who
failed and why, and every process that was restarted.
"""

SLURM_DOC = r"""psagg-slurm - run a psagg job inside a Slurm allocation (from sbatch or salloc).

Usage: psagg-slurm --config TEMPLATE [--placement colocated|own] [--servers S]
                   [--workers-per-node K] [--port P] [--job-config FILE]
                   [--server-bin PATH] [--chdir DIR] [--grace SEC] [--timeout SEC]
                   [--dry-run] [--restarts N] -- PROGRAM [ARGS...]

e.g.  sbatch -N 3 --ntasks-per-node 2 deploy/psagg.sbatch conf/cluster.ini -- python3 train.py
      sbatch -N 3 --ntasks-per-node 2 --wrap "deploy/psagg-slurm --config conf/cluster.ini -- ./train"

Placement comes from the allocation (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE):
  --placement colocated (default)  servers on the first S nodes (default S: every node), and
                                   workers on every node, one per task slot
  --placement own                  servers on the first S nodes (default S = 1), one each,
                                   and workers on the other nodes only
  --workers-per-node K             workers per worker node instead of the task slots
  --port P                         server i listens on P + i (default 20000 + a number from
                                   the job id, so that jobs sharing a node differ)
The job's config is the template with [cluster] servers (each server node's NodeAddr from
`scontrol show node`, port), workers and worker_hosts set for this allocation; every other key
is the template's. It is written to --job-config (default ./psagg-slurm-JOBID.ini: a file
system every node sees) and checked with psagg's own parser before anything starts (file:line,
addresses resolve). Each process is started with `srun --overlap -N1 -n1 -w NODE`, under the
same watchdog and with the same environment as deploy/psagg-ssh, and every line comes out as
"[node role rank] line". --restarts N (up to N restarts in all, workers' and servers'
together; needs [cluster] elastic = on or server_replicas >= 1): in an elastic job a worker
that fails is started again on its node and joins the running job; with server_replicas >= 1
a server that dies while the job runs is started again on its node with its command line (same
rank and port) and rejoins the job, and once the restarts are spent the job goes on without
it. The first failure stops everything (the reason is the summary's last lines, which also
name every restart) and is our exit status, so the batch job ends FAILED with it.
"""

DOCS = {"local": LOCAL_DOC, "ssh": SSH_DOC, "slurm": SLURM_DOC}


def main(command, doc=None):
    """psagg-<command> (local, ssh or slurm) with its help (DOCS): its exit status (see it)."""
    doc = doc or DOCS[command]
    global ME
    ME = "psagg-" + command
    ignored = [n for n in SIGNALS if n not in ALWAYS_CAUGHT
               and signal.getsignal(getattr(signal, "SIG" + n)) == signal.SIG_IGN]
    # until the job runs, Ctrl-C ends us as it would any command (no traceback)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    setup, spec = COMMANDS[command]
    cl = CommandLine(doc, spec)
    job = setup(cl, os.path.dirname(os.path.realpath(sys.argv[0])))
    if job is None:  # --dry-run
        return 0
    job.ignored = ignored
    finish(job.run())
