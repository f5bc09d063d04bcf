"""psagg-timeline: merge a job's Chrome traces, align the hosts' clocks, and draw where a step's
time goes.

Usage:
  psagg-timeline PREFIX [--png OUT.png] [--merged OUT.json] [--step ROUND] [--rows N] [--json]
  psagg-timeline FILE.json FILE.json ... [same options]

PREFIX is what [log] timeline (or PSAGG_TIMELINE) was set to: the job wrote
PREFIX.worker<rank>.json and PREFIX.server<rank>.json. The script:
  - reads them (a trace cut short by a killed process is read up to its last whole event);
  - aligns every process's clock to server 0's from the messages' order: a server receives a
    worker's push after the worker encoded it, a worker receives an update after the server
    handed it over. Each worker's correction must lie in the interval those bounds leave; the
    hosts' own clocks (NTP) are kept when they lie inside it, otherwise the interval's middle
    is taken. Corrections and intervals are printed;
  - --merged writes one trace of all processes with the corrections applied (load it in
    https://ui.perfetto.dev or chrome://tracing);
  - --png draws one step (the push_pulls of round --step, default the middle round) across
    every process, and each process's step time by phase, averaged over the rounds
    (matplotlib);
  - prints a summary per process: its mean step (first span's start to last span's end) and
    that time by phase, exclusive: at each instant, the first phase some span is in (workers:
    encode > decode > send > wait > queued; servers: sum+encode > collect), or idle; and how
    often each worker's push was the last of its chunk round (the straggler).
A push_pull's phases (psagg_timing in worker/include/psagg.h; their durations are the span's
args.phase_us): queued, encode, send, wait, decode. A server's chunk round: collect (first push
to last push), sum+encode (last push to the update's hand-over). A "step" here is one round of every tensor: the push_pulls with the same
round number.
"""

import argparse
import glob
import json
import os
import statistics
import sys

PHASES = ["queued", "encode", "send", "wait", "decode"]
SERVER_PHASES = ["collect", "sum+encode"]
COLORS = {"queued": "#bbbbbb", "encode": "#1f77b4", "send": "#ff7f0e", "wait": "#d62728",
          "decode": "#2ca02c", "collect": "#9467bd", "sum+encode": "#8c564b"}


def read_trace(path):
    """The events of one trace file; tolerates a missing closing bracket or a cut last line."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines = text.rstrip().split("\n")
    while lines:  # drop the cut line(s), close the array
        body = "\n".join(lines).rstrip().rstrip(",")
        try:
            return json.loads(body + "]")
        except json.JSONDecodeError:
            lines.pop()
    raise ValueError("%s: not a trace (no event could be read)" % path)


PHASE_NAMES = {"push_pull": PHASES, "round": SERVER_PHASES}


def phases_of(e):
    """{phase: (start, end)} of a span whose args hold "phase_us" (durations, back to back)."""
    names = PHASE_NAMES.get(e.get("cat"), [])
    out, at = {}, e["ts"]
    for name, d in zip(names, e.get("args", {}).get("phase_us", [])):
        out[name] = (at, at + d)
        at += d
    return out


class Process:
    def __init__(self, path, events):
        self.path = path
        self.name = None
        self.pid = None
        self.ops = []  # worker: dicts of a push_pull with its phases; server: chunk rounds
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                self.name = e["args"]["name"]
                self.pid = e["pid"]
            elif e.get("ph") == "X" and e.get("cat") in PHASE_NAMES:
                self.ops.append({"name": e["name"], "ts": e["ts"], "end": e["ts"] + e["dur"],
                                 "args": e["args"], "tid": e["tid"], "phases": phases_of(e)})
        if self.name is None:
            raise ValueError("%s: no process_name event: not a psagg trace" % path)
        self.role, rank = self.name.split()
        self.rank = int(rank)
        self.shift = 0.0  # microseconds added to this process's times (clock alignment)

    def label(self):
        return self.name


def load(inputs):
    paths = []
    for p in inputs:
        if os.path.isfile(p):
            paths.append(p)
        else:
            found = sorted(glob.glob(glob.escape(p) + ".worker*.json") +
                           glob.glob(glob.escape(p) + ".server*.json"))
            if not found:
                sys.exit("psagg-timeline: no %s.worker*.json or %s.server*.json (is [log] "
                         "timeline / PSAGG_TIMELINE set to %s?)" % (p, p, p))
            paths += found
    procs = [Process(p, read_trace(p)) for p in paths]
    workers = sorted([p for p in procs if p.role == "worker"], key=lambda p: p.rank)
    servers = sorted([p for p in procs if p.role == "server"], key=lambda p: p.rank)
    return workers, servers


def bounds(worker, server):
    """The interval of corrections c (worker time + c = server time) the messages allow."""
    rounds = {}
    for r in server.ops:
        rounds.setdefault((r["args"]["key"], r["args"]["round"]), []).append(r)
    lo, hi, n = float("-inf"), float("inf"), 0
    for op in worker.ops:
        ph = op["phases"]
        if "encode" not in ph or "decode" not in ph:
            continue
        encoded, last_update = ph["encode"][1], ph["decode"][0]
        for r in rounds.get((op["args"]["key"], op["args"]["round"]), []):
            last_push = r["phases"]["collect"][1] if "collect" in r["phases"] else r["end"]
            handed = r["end"]
            hi = min(hi, last_push - encoded)  # our push arrived by the round's last push
            lo = max(lo, handed - last_update)  # its update reached us by our last update
            n += 1
    return lo, hi, n


def align(workers, servers, out):
    """Shift every process onto server 0's clock; print what was done."""
    if not servers:
        return
    ref = servers[0]
    for w in workers:
        lo, hi, n = bounds(w, ref)
        if n == 0:
            print("%s: no round shared with %s: clock kept" % (w.label(), ref.label()), file=out)
            continue
        w.shift = 0.0 if lo <= 0.0 <= hi else (lo + hi) / 2
        note = "kept" if w.shift == 0.0 else "shifted %+.1f us" % w.shift
        if lo > hi:
            note += " (the bounds cross: the clock drifted during the trace)"
        print("%s: correction to %s's clock in [%.1f, %.1f] us from %d chunk rounds: %s"
              % (w.label(), ref.label(), lo, hi, n, note), file=out)
    for s in servers[1:]:
        lo, hi, n = float("-inf"), float("inf"), 0
        for w in workers:  # w + c_ws = s; w + w.shift = ref  =>  s - ref = c_ws - w.shift
            a, b, k = bounds(w, s)
            if k:
                lo, hi, n = max(lo, w.shift - b), min(hi, w.shift - a), n + k
        if n == 0:
            continue
        s.shift = 0.0 if lo <= 0.0 <= hi else (lo + hi) / 2
        print("%s: correction to %s's clock in [%.1f, %.1f] us: %s"
              % (s.label(), ref.label(), lo, hi,
                 "kept" if s.shift == 0.0 else "shifted %+.1f us" % s.shift), file=out)


def step_rounds(workers):
    rounds = sorted({op["args"]["round"] for w in workers for op in w.ops})
    return rounds


# The step's wall time, attributed: at each instant, the first of these phases that some
# push_pull (chunk round) is in. Workers: the communication thread's work first (encode,
# decode, send), then waiting for updates, then queued; servers: sum+encode, then collect.
PRECEDENCE = {"worker": ["encode", "decode", "send", "wait", "queued"],
              "server": ["sum+encode", "collect"]}


def attribute(ops, order, start, end):
    """ms of [start, end] (us) in each phase of `order` (exclusive, by precedence) and "idle"
    (nothing in flight)."""
    points = {start, end}
    for op in ops:
        for a, b in op["phases"].values():
            points.update((min(max(a, start), end), min(max(b, start), end)))
    points = sorted(points)
    out = {p: 0.0 for p in order}
    out["idle"] = 0.0
    # per elementary interval, the phases active (an interval is active in a phase if some
    # op's phase covers its middle); a sweep over the sorted phase boundaries
    events = []
    for op in ops:
        for name, (a, b) in op["phases"].items():
            if name in out and b > a:
                events.append((a, 1, name))
                events.append((b, -1, name))
    events.sort()
    active = {p: 0 for p in order}
    k = 0
    for x0, x1 in zip(points, points[1:]):
        mid = (x0 + x1) / 2
        while k < len(events) and events[k][0] <= mid:
            active[events[k][2]] += events[k][1]
            k += 1
        for p in order:
            if active[p] > 0:
                out[p] += (x1 - x0) / 1e3
                break
        else:
            out["idle"] += (x1 - x0) / 1e3
    return out


def step_of(proc, rnd, ref=None):
    """(start, end, ms by phase) of proc's spans of round rnd, over [start, end] of ref (the
    workers' step) when given, else its own; None without spans."""
    ops = [op for op in proc.ops if op["args"]["round"] == rnd]
    if not ops:
        return None
    shifted = [{"phases": {n: (a + proc.shift, b + proc.shift) for n, (a, b) in
                           op["phases"].items()}} for op in ops]
    start = min(op["ts"] for op in ops) + proc.shift
    end = max(op["end"] for op in ops) + proc.shift
    if ref:
        start, end = ref
    return start, end, attribute(shifted, PRECEDENCE[proc.role], start, end)


def step_table(procs, steady):
    """Per process: mean step span (ms) and mean ms by phase over the steady rounds."""
    out = {}
    for p in procs:
        spans, parts = [], []
        for r in steady:
            s = step_of(p, r)
            if s:
                spans.append((s[1] - s[0]) / 1e3)
                parts.append(s[2])
        if spans:
            keys = PRECEDENCE[p.role] + ["idle"]
            out[p.label()] = {"step_ms": statistics.mean(spans),
                              "phase_ms": {k: statistics.mean(x[k] for x in parts) for k in keys}}
    return out


def summary(workers, servers, rounds, out):
    steady = rounds[1:] if len(rounds) > 1 else rounds  # round 0 pays the warm-up
    print("steps (rounds) %d..%d, %d in all; means over rounds %d..%d; each step's time by "
          "phase, exclusive (at each instant the first phase some span is in: workers %s; "
          "servers %s)" % (rounds[0], rounds[-1], len(rounds), steady[0], steady[-1],
                           " > ".join(PRECEDENCE["worker"]), " > ".join(PRECEDENCE["server"])),
          file=out)
    result = {"workers": step_table(workers, steady), "servers": step_table(servers, steady)}
    for kind in ("workers", "servers"):
        for name, v in result[kind].items():
            print("%s: step %.2f ms (first span's start to last span's end): %s" % (
                name, v["step_ms"], ", ".join("%s %.2f" % kv for kv in v["phase_ms"].items())),
                file=out)
    # the straggler, as the servers saw it: whose push came last in each chunk round
    last = {}
    for srv in servers:
        for r in srv.ops:
            if r["args"]["round"] in steady:
                w = r["args"]["last"]
                last[w] = last.get(w, 0) + 1
    total = sum(last.values())
    if total:
        result["last_push"] = {"worker %d" % w: n for w, n in sorted(last.items())}
        print("last push of a chunk round (the straggler): %s" % ", ".join(
            "worker %d %.0f%%" % (w, 100.0 * n / total) for w, n in sorted(last.items())),
            file=out)
    return result


def write_merged(workers, servers, path):
    """One trace: every process's events, shifted onto server 0's clock, each span's phases
    expanded into spans nested inside it (category "phase")."""
    events = []
    for p in servers + workers:
        for e in read_trace(p.path):
            if "ts" in e:
                e = dict(e, ts=e["ts"] + p.shift)
            events.append(e)
            if e.get("ph") == "X":
                for name, (a, b) in phases_of(e).items():
                    events.append({"ph": "X", "pid": e["pid"], "tid": e["tid"], "name": name,
                                   "cat": "phase", "ts": a, "dur": b - a})
    with open(path, "w") as f:
        json.dump(events, f)


def lane_rows(ops, max_rows):
    """The rows a process's spans are drawn on: its lanes, those past max_rows folded into the
    last row. Returns [(label suffix, [ops])]."""
    lanes = sorted({op["tid"] for op in ops})
    rows = []
    for i, tid in enumerate(lanes):
        if i < max_rows - 1 or len(lanes) <= max_rows:
            rows.append(("lane %d" % (tid - 1), [op for op in ops if op["tid"] == tid]))
        else:
            rest = set(lanes[i:])
            rows.append(("lanes %d+" % (tid - 1), [op for op in ops if op["tid"] in rest]))
            break
    return rows


def draw(workers, servers, rnd, png, max_rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = []  # (label, [(start, end, color)])
    t0 = None
    for proc, phases in [(w, PHASES) for w in workers] + [(s, SERVER_PHASES) for s in servers]:
        ops = [op for op in proc.ops if op["args"]["round"] == rnd]
        for suffix, row_ops in lane_rows(ops, max_rows):
            bars = []
            for op in row_ops:
                for p in phases:
                    if p in op["phases"]:
                        a, b = op["phases"][p]
                        bars.append((a + proc.shift, b + proc.shift, COLORS[p]))
            rows.append(("%s %s" % (proc.label(), suffix), bars))
    starts = [b[0] for _, bars in rows for b in bars]
    if not starts:
        sys.exit("psagg-timeline: round %d has no events" % rnd)
    t0 = min(starts)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 3 + 0.18 * len(rows) + 0.4 * len(workers)),
                                 gridspec_kw={"height_ratios": [max(len(rows), 4),
                                                                max(len(workers) + len(servers), 2)]})
    for i, (label, bars) in enumerate(rows):
        ax.broken_barh([((a - t0) / 1e3, max((b - a) / 1e3, 1e-3)) for a, b, _ in bars],
                       (i - 0.4, 0.8), facecolors=[c for _, _, c in bars], linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first call (clocks aligned to server 0)")
    ax.set_title("step (round %d): every push_pull's phases on the workers, every chunk round on "
                 "the servers" % rnd, fontsize=9)
    ax.legend(handles=[Patch(color=COLORS[p], label=p) for p in PHASES + SERVER_PHASES],
              fontsize=7, ncol=7, loc="lower right")

    rounds = step_rounds(workers)
    steady = rounds[1:] if len(rounds) > 1 else rounds
    table = {**step_table(workers, steady), **step_table(servers, steady)}
    labels = []
    for y, p in enumerate(workers + servers):
        v = table.get(p.label())
        left = 0.0
        for k in (PRECEDENCE[p.role] + ["idle"]) if v else []:
            bx.barh(y, v["phase_ms"][k], left=left, color=COLORS.get(k, "#ffffff"),
                    edgecolor="#888888" if k == "idle" else None, linewidth=0.5)
            left += v["phase_ms"][k]
        labels.append(p.label())
    bx.set_yticks(range(len(labels)))
    bx.set_yticklabels(labels, fontsize=7)
    bx.invert_yaxis()
    bx.set_xlabel("ms per step (first span's start to last span's end), by phase: at each instant "
                  "the first phase some span is in (workers: %s; servers: %s; white: idle); "
                  "mean of rounds %d..%d" % (" > ".join(PRECEDENCE["worker"]),
                                             " > ".join(PRECEDENCE["server"]), steady[0],
                                             steady[-1]), fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="psagg-timeline",
                                 description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    ap.add_argument("inputs", nargs="+", help="the timeline PREFIX, or trace files")
    ap.add_argument("--png", help="draw the step and the per-phase summary here")
    ap.add_argument("--merged", help="write one trace of every process, clocks aligned")
    ap.add_argument("--step", type=int, help="the round drawn (default: the middle one)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--rows", type=int, default=8,
                    help="rows per process in the picture: lanes past them share the last one "
                         "(default 8)")
    a = ap.parse_args(argv)
    workers, servers = load(a.inputs)
    if not workers:
        sys.exit("psagg-timeline: no worker trace among the inputs")
    log = sys.stderr if a.json else sys.stdout
    align(workers, servers, log)
    rounds = step_rounds(workers)
    if not rounds:
        sys.exit("psagg-timeline: the workers' traces hold no completed push_pull")
    result = summary(workers, servers, rounds, log)
    result["shift_us"] = {p.label(): p.shift for p in workers + servers}
    if a.merged:
        write_merged(workers, servers, a.merged)
        print("wrote %s" % a.merged, file=log)
    if a.png:
        rnd = a.step if a.step is not None else rounds[len(rounds) // 2]
        draw(workers, servers, rnd, a.png, max(a.rows, 1))
        print("wrote %s (round %d)" % (a.png, rnd), file=log)
    if a.json:
        json.dump(result, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
