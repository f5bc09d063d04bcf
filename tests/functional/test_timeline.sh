#!/usr/bin/env bash
# test_timeline.sh BUILD_DIR [PORT] - the timeline ([log] timeline / PSAGG_TIMELINE), the workers'
# stats line ([log] stats_interval_ms) and deploy/psagg-timeline, on a real job: 2 servers
# (ports PORT, PORT+1) and 2 workers of fn_worker, started by deploy/psagg-local.
#   - every process writes PREFIX.<role><rank>.json, which loads as JSON;
#   - each worker's trace has one push_pull span per tensor per round, its five phases'
#     durations filling it; the servers' traces have every chunk round of every round, with
#     collect and sum+encode; spans of one lane do not overlap;
#   - each worker logs stats lines with the phases' means; each process what its trace cost;
#   - psagg-timeline reads the traces (also one cut short), keeps the clocks of one host,
#     finds a worker clock moved by 50 ms and takes it back to within its bounds, writes a
#     merged trace (phases expanded into nested spans) and a PNG;
#   - a timeline path that cannot be written stops a server with a message naming it.
# PSAGG_KEEP_TIMELINE=DIR keeps the traces and the PNG there.
set -u -o pipefail

build=$1
server_bin=$build/server/psagg-server worker_bin=$build/tests/functional/fn_worker
py=/usr/bin/python3
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${2:-}"
tool=$h_repo/deploy/psagg-timeline
"$py" -c "import matplotlib" 2>/dev/null || fail "$py cannot import matplotlib (python3-matplotlib; deploy/install-deps.sh)"

rounds=60 tensors=13 # --sizes 1,1023,4096 (fn_worker's default) + 10 random
job_ini "$tmp/job.ini" 2 2 cluster.job_id="timeline-$port" server.threads=2 worker.chunk_bytes=16384 \
    log.level=info log.stats_interval_ms=50

PSAGG_TIMELINE=$tmp/t "$h_repo/deploy/psagg-local" --config "$tmp/job.ini" --server-bin "$server_bin" \
    --timeout 120 -- "$worker_bin" --codec maxmin4 --rounds $rounds --random-tensors 10 \
    --random-max 20000 >"$tmp/job.log" 2>&1 || { tail -n 30 "$tmp/job.log"; fail "the job failed"; }
for f in worker0 worker1 server0 server1; do
    [[ -s $tmp/t.$f.json ]] || fail "no trace $tmp/t.$f.json"
done
for w in 0 1; do
    grep -q "worker $w INFO stats: [0-9]* push_pulls, .* mean ms queued [0-9.]* encode [0-9.]* send [0-9.]* wait [0-9.]* decode [0-9.]* total [0-9.]*" "$tmp/job.log" ||
        { grep stats "$tmp/job.log"; fail "worker $w logged no stats line"; }
done
grep "worker 0 INFO stats" "$tmp/job.log" | head -n 1
for p in "worker 0" "worker 1" "server 0" "server 1"; do # each says what its trace cost
    grep -q "$p INFO timeline: [0-9]* spans, [0-9.]* MB written to $tmp/t.${p/ /}.json; recording them took [0-9.]* ms of CPU during the run, writing them [0-9.]* ms of CPU" "$tmp/job.log" ||
        { grep timeline "$tmp/job.log"; fail "$p did not log its trace's cost"; }
done

# the traces' contents
"$py" - "$tmp/t" $rounds $tensors <<'PY' || fail "the traces do not hold what the job did"
import json, sys
prefix, rounds, tensors = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
phases = ["queued", "encode", "send", "wait", "decode"]
chunks_per_round = None
for w in (0, 1):
    ev = json.load(open("%s.worker%d.json" % (prefix, w)))
    names = [e for e in ev if e.get("ph") == "M" and e["name"] == "process_name"]
    assert names and names[0]["args"]["name"] == "worker %d" % w, names
    ops = [e for e in ev if e.get("ph") == "X" and e["cat"] == "push_pull"]
    assert len(ops) == rounds * tensors, ("worker", w, len(ops), rounds * tensors)
    seen = {(e["args"]["key"], e["args"]["round"]) for e in ops}
    assert seen == {(k, r) for k in range(tensors) for r in range(rounds)}, "a push_pull is missing"
    for e in ops:  # the five phases, back to back, fill the span (ns printed as us.xxx)
        ph = e["args"]["phase_us"]
        assert len(ph) == len(phases) and min(ph) >= 0, e
        assert abs(sum(ph) - e["dur"]) < 0.01, ("the phases do not fill the span", e)
    by_lane = {}
    for e in ops:
        by_lane.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_lane.values():  # spans of one lane do not overlap (JSON doubles: ~0.25 us)
        spans.sort()
        assert all(a[1] <= b[0] + 1.0 for a, b in zip(spans, spans[1:])), "a lane's spans overlap"
    c = sum(e["args"]["chunks"] for e in ops if e["args"]["round"] == 0)
    assert chunks_per_round in (None, c), (chunks_per_round, c)
    chunks_per_round = c
rounds_seen = {}
for s in (0, 1):
    ev = json.load(open("%s.server%d.json" % (prefix, s)))
    rs = [e for e in ev if e.get("ph") == "X" and e["cat"] == "round"]
    for e in rs:
        a = e["args"]
        key = (a["key"], a["chunk"], a["round"])
        assert key not in rounds_seen, ("a chunk round twice", key)
        rounds_seen[key] = s
        assert a["first"] in (0, 1) and a["last"] in (0, 1), a
        ph = e["args"]["phase_us"]  # collect, sum+encode
        assert len(ph) == 2 and min(ph) >= 0 and abs(sum(ph) - e["dur"]) < 0.01, e
assert len(rounds_seen) == chunks_per_round * rounds, (len(rounds_seen), chunks_per_round, rounds)
print("test_timeline: %d push_pulls per worker, %d chunk rounds on the servers, phases nested"
      % (rounds * tensors, len(rounds_seen)))
PY

# the tool: one host's clocks are kept; a PNG and a merged trace
"$py" "$tool" "$tmp/t" --json --png "$tmp/t.png" --merged "$tmp/merged.json" >"$tmp/summary.json" \
    2>"$tmp/tool.log" || { cat "$tmp/tool.log"; fail "psagg-timeline failed"; }
cat "$tmp/tool.log"
[[ $(head -c 8 "$tmp/t.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "no PNG written"
"$py" - "$tmp/summary.json" "$tmp/merged.json" "$tmp/t" <<'PY' || fail "the summary or the merged trace is wrong"
import json, sys
s = json.load(open(sys.argv[1]))
assert all(v == 0.0 for v in s["shift_us"].values()), ("one host's clocks were moved", s["shift_us"])
for w in ("worker 0", "worker 1"):  # the step's time, split by phase, adds up to the step
    m = s["workers"][w]
    assert m["step_ms"] > 0 and m["phase_ms"]["wait"] > 0 and m["phase_ms"]["encode"] > 0, m
    assert abs(sum(m["phase_ms"].values()) - m["step_ms"]) < 0.01, m
for v in s["servers"].values():
    assert abs(sum(v["phase_ms"].values()) - v["step_ms"]) < 0.01 and v["phase_ms"]["collect"] > 0, v
# whose push came last: every chunk round after round 0 counted once, only the job's workers
steady = sum(1 for k in (0, 1) for e in json.load(open(sys.argv[3] + ".server%d.json" % k))
             if e.get("cat") == "round" and e["args"]["round"] >= 1)
assert set(s["last_push"]) <= {"worker 0", "worker 1"}, s["last_push"]
assert sum(s["last_push"].values()) == steady, (s["last_push"], steady)
m = json.load(open(sys.argv[2]))
assert {e["args"]["name"] for e in m if e.get("name") == "process_name"} == \
    {"worker 0", "worker 1", "server 0", "server 1"}, "the merged trace lacks a process"
spans = [e for e in m if e.get("ph") == "X"]
ph = [e for e in spans if e["cat"] == "phase"]  # expanded from phase_us
assert len(ph) == 5 * sum(e["cat"] == "push_pull" for e in spans) + \
    2 * sum(e["cat"] == "round" for e in spans), "the merged trace lacks phases"
assert {e["name"] for e in ph} == {"queued", "encode", "send", "wait", "decode", "collect",
                                   "sum+encode"}, {e["name"] for e in ph}
PY

# worker 1's clock 50 ms ahead: psagg-timeline takes it back within the messages' bounds
"$py" - "$tmp/t.worker1.json" "$tmp/skew.worker1.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
for e in ev:
    if "ts" in e:
        e["ts"] += 50000.0
json.dump(ev, open(sys.argv[2], "w"))
PY
cp "$tmp/t.worker0.json" "$tmp/skew.worker0.json"
cp "$tmp/t.server0.json" "$tmp/skew.server0.json"
cp "$tmp/t.server1.json" "$tmp/skew.server1.json"
"$py" "$tool" "$tmp/skew" --json >"$tmp/skew.json" 2>"$tmp/skew.log" || { cat "$tmp/skew.log"; fail "psagg-timeline failed on the moved clock"; }
grep "worker 1:" "$tmp/skew.log"
"$py" - "$tmp/skew.json" <<'PY' || { cat "$tmp/skew.log"; fail "the moved clock was not found"; }
import json, sys
shift = json.load(open(sys.argv[1]))["shift_us"]
assert abs(shift["worker 1"] + 50000.0) < 2000.0, shift
assert shift["worker 0"] == 0.0, shift
PY

# a trace cut short (a killed process) is read up to its last whole event
head -c $(($(stat -c %s "$tmp/t.worker0.json") * 2 / 3)) "$tmp/t.worker0.json" >"$tmp/cut.worker0.json"
cp "$tmp/t.server0.json" "$tmp/cut.server0.json"
"$py" "$tool" "$tmp/cut" >"$tmp/cut.log" 2>&1 || { cat "$tmp/cut.log"; fail "a cut trace cannot be read"; }
grep -q "^worker 0: step [0-9.]* ms (first span" "$tmp/cut.log" || { cat "$tmp/cut.log"; fail "no summary from a cut trace"; }

# a path that cannot be written: the server stops, naming it
PSAGG_TIMELINE=/nonexistent-dir/t timeout 20 "$server_bin" --config "$tmp/job.ini" --rank 0 \
    >"$tmp/bad.log" 2>&1
rc=$?
((rc != 0 && rc != 124)) || { cat "$tmp/bad.log"; fail "a server with an unwritable timeline exited $rc"; }
grep -q "timeline: cannot write /nonexistent-dir/t.server0.json: No such file or directory" "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "the refusal does not name the path"; }
echo "test_timeline: unwritable path: $(grep -o 'timeline: .*' "$tmp/bad.log")"

if [[ -n ${PSAGG_KEEP_TIMELINE:-} ]]; then
    mkdir -p "$PSAGG_KEEP_TIMELINE" && cp "$tmp"/t.*.json "$tmp/t.png" "$PSAGG_KEEP_TIMELINE/"
fi
echo "test_timeline: passed"
