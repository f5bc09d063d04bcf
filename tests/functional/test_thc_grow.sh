#!/usr/bin/env bash
# test_thc_grow.sh BUILD_DIR [PORT] - the thc codec in an elastic job that gains a worker
# (fn_thc --grow): 2 servers, workers = 3, max_workers = 4; ranks 0..2 start the job and rank 3
# joins it while it runs. The joiner has no scales yet, so its first pushes send nothing and
# the servers leave its blocks out of the sums (the update's counts say so) until it has the
# round's scales from its first update. Every worker must exit 0 with its sums of the updates
# equal to the sums of what was pushed after the drain (nothing lost, nothing counted twice),
# and the last 8 rounds bit-identical on all four.
set -u -o pipefail

build=$1
server_bin=$build/server/psagg-server
worker_bin=$build/tests/functional/fn_thc
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${2:-}"

say() { echo "test_thc_grow: $*"; }

job_ini "$tmp/job.ini" 2 3 cluster.job_id="thc-grow-$port" cluster.elastic=on cluster.min_workers=2 \
    cluster.max_workers=4 cluster.connect_timeout_ms=20000 cluster.op_timeout_ms=4000 \
    server.threads=2 worker.chunk_bytes=65536 log.level=warn
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=3
start_servers "$tmp/job.ini" 2
# Rank 3 joins once the members are at round 10 (a join at round 1 finds round 0's inputs all in
# the members' residuals, which its bound does not allow for); they hold at round 30 until it
# says it joins (started a fixed time after them, a slow start-up could find the job ended)
args=(60 thc4 --drain 10 --grow)
for r in 0 1 2; do
    start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --progress --hold "30:$tmp/go"
done
wait_until 60 grep -q "^ROUND 10$" "$tmp/worker0.log" || fail "worker 0 never reached round 10"
start_worker 3 "$tmp/worker3.log" "$worker_bin" "${args[@]}"
wait_until 60 grep -q "joins it" "$tmp/worker3.log" || fail "rank 3 never reached the running job"
touch "$tmp/go"
for r in 0 1 2 3; do
    wait_for "${wpid[$r]}" 120
    rc=$?
    sed "s/^/[worker $r] /" "$tmp/worker$r.log"
    ((rc == 0)) || fail "worker $r exited $rc"
done
for s in 0 1; do
    wait_for "${spid[$s]}" 20
    rc=$?
    ((rc == 0)) || fail "server $s exited $rc"
done
grep -q "THC worker 3 joined at round" "$tmp/worker3.log" || fail "rank 3 did not join the running job"
(($(grep -h '^DIGEST' "$tmp"/worker*.log | sort -u | wc -l) == 1)) || fail "the workers' last rounds differ"
say "passed: $(grep -h 'joined at round' "$tmp/worker3.log"); summed updates against pushes: $(grep -h 'rounds: relative' "$tmp"/worker*.log | sed 's/.*updates //' | tr '\n' ' ')"
