#!/usr/bin/env bash
# test_adaptive.sh BUILD_DIR [PORT] - adaptive codecs ([codec] adaptive = on) end to end.
#
# 1. Two servers, three fn_adaptive workers, a new assignment every 2 rounds: the codecs must
#    change mid-job (fn_adaptive counts the switches), every output must equal fn_adaptive's
#    own reference bit for bit, every worker must print the same DIGEST, and the workers must
#    log each new generation at info.
# 2. One server, fn_worker (rank 0) and rogue_worker --mode stale (rank 1), which pushes in
#    the declared codec forever: the server must close the rogue at round 2 saying "stale
#    assignment", fn_worker's push_pull must fail naming it, and the server must exit 1.
set -u -o pipefail
build=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${2:-}"

job() { # job NAME SERVERS WORKERS
    job_ini "$tmp/$1.ini" "$2" "$3" cluster.job_id="adaptive-$1-$port" cluster.connect_timeout_ms=20000 \
        cluster.op_timeout_ms=20000 server.threads=2 worker.chunk_bytes=262144 codec.adaptive=on \
        codec.adaptive_interval=2 codec.adaptive_budget=1.0 log.level=info
    start_servers "$tmp/$1.ini" "$2" "$1-"
}

# 1. exact sums across switches
job exact 2 3
for w in 0 1 2; do
    start_worker $w "$tmp/exact-worker$w.log" PSAGG_CONFIG="$tmp/exact.ini" PSAGG_WORLD_SIZE=3 \
        "$build/tests/functional/fn_adaptive" 16
done
for w in 0 1 2; do
    wait_for "${wpid[$w]}" 120 || fail "exact: worker $w exited $?"
done
for w in 0 1 2; do grep -q '^ADAPTIVE-EXACT' "$tmp/exact-worker$w.log" || fail "exact: worker $w printed no result"; done
line=$(grep '^ADAPTIVE-EXACT' "$tmp/exact-worker0.log")
echo "$line"
switches=$(sed -n 's/.*switches=\([0-9]*\).*/\1/p' <<<"$line")
gens=$(sed -n 's/.*generations=\([0-9]*\).*/\1/p' <<<"$line")
((gens >= 5)) || fail "exact: only $gens generations in 16 rounds with adaptive_interval = 2"
((switches >= 2)) || fail "exact: the codecs changed only $switches times"
grep '^round' "$tmp/exact-worker0.log" | head -20
digests=$(cat "$tmp"/exact-worker*.log | grep '^DIGEST' | sort -u | wc -l)
[ "$digests" = 1 ] || fail "exact: the workers' DIGESTs differ"
grep -q 'adaptive codecs: generation 2 ' "$tmp/exact-worker1.log" || fail "exact: no info line for generation 2"
grep -q "tensor 'a[0-9]' maxmin" "$tmp/exact-worker1.log" || fail "exact: no info line naming a changed tensor"
grep 'adaptive codecs: generation' "$tmp/exact-worker0.log" | head -3
for s in 0 1; do wait_for "${spid[$s]}" 30 || fail "exact: server $s exited $?"; done
pids=()

# 2. a stale assignment is refused. Worker 0 holds before round 0 for 2.5 s (more than two PING
#    intervals of 1 s) once the rogue pushed it: the rogue's wait for round 0's updates sees the
#    server's PINGs, as a slow machine's does
job stale 1 2
start_worker 0 "$tmp/stale-worker0.log" PSAGG_CONFIG="$tmp/stale.ini" PSAGG_WORLD_SIZE=2 \
    "$build/tests/functional/fn_worker" --codec maxmin4 --rounds 6 --expect EPEER \
    --expect-text "stale assignment" --max-seconds 40 --hold "0:$tmp/stale-go"
w0=$h_pid
start_worker 1 "$tmp/stale-rogue.log" PSAGG_CONFIG="$tmp/stale.ini" "$build/tests/fault/rogue_worker" \
    --mode stale --rounds 6
rogue=$h_pid
wait_until 60 grep -qs "pushed round 0" "$tmp/stale-rogue.log" || fail "stale: the rogue did not push round 0"
sleep 2.5
touch "$tmp/stale-go"
wait_for $rogue 60 || fail "stale: the rogue exited $?"
grep -q ROGUE-OK "$tmp/stale-rogue.log" || fail "stale: the rogue was not closed for its stale assignment"
grep 'server closed' "$tmp/stale-rogue.log"
wait_for $w0 60 || fail "stale: fn_worker exited $? (expected EPEER naming the stale assignment)"
cat "$tmp/stale-worker0.log" | grep -i "failed as expected"
wait_for "${spid[0]}" 30
rc=$?
[ $rc = 1 ] || fail "stale: the server exited $rc, expected 1 (job failed)"
echo "test_adaptive: ok"
