#!/usr/bin/env bash
# bench-quorum.sh - what straggler tolerance ([server] quorum, grace_ms) buys on an emulated
# cluster (deploy/netcluster.sh: network namespaces, tbf-shaped links): 2 servers (hosts 0, 1)
# and 4 workers (hosts 2..5), every link RATE (default 1gbit) in both directions, worker 3's
# link (host 5) at a tenth of it in the runs marked slow. The workers are fn_worker: SUM of
# tensors of SIZES elements (default 1,000,000 and 250,000) in CODEC (default maxmin4, worker
# and server error feedback), ROUNDS rounds (default 100); fn_worker --straggler 3 --lenient
# sums the updates over the rounds against every worker's inputs (what is still carried at the
# end is the difference).
#
# Runs, each REPS times (default 2), alternating:
#   even      every link at RATE, quorum off: the machine's own round time
#   slow      worker 3 at RATE/10, quorum off: every round waits for it
#   quorum    worker 3 at RATE/10, quorum = 3, grace_ms = GRACE (default 5)
# Per run: wall time of workers 0 and 3, ms per round (worker 0), worker 3's left-out chunk
# rounds (psagg_stats.left_out), and the largest |sum of updates - sum of inputs|.
# Output: tests/bench/results/quorum.csv (or $OUT), then the table. Needs root.
# Then a training part (below; PART=cluster skips it, PART=train runs only it).
# Usage: tests/bench/bench-quorum.sh [BUILD_DIR]. The training part's servers listen on PORT and
# PORT+1 when PORT is set, else on two free ports (tests/harness.sh).
set -u -o pipefail
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=${1:-$repo/build}
rate=${RATE:-1gbit} rounds=${ROUNDS:-100} reps=${REPS:-2} grace=${GRACE:-5}
sizes=${SIZES:-1000000,250000} codec=${CODEC:-maxmin4}
out=${OUT:-$repo/tests/bench/results/quorum.csv}
nc=$repo/deploy/netcluster.sh
[ "$(id -u)" -eq 0 ] || { echo "bench-quorum: needs root (network namespaces, tc)" >&2; exit 77; }
. "$nc" # nc_* functions
prefix=""
at_exit '[ -n "$prefix" ] && "$nc" down --prefix "$prefix" >/dev/null 2>&1'
slow_bps=$(($(nc_rate_bps "$rate") / 10))

shape_host5() { # BPS: worker 3's link, both directions
    local ns dev
    for end in host br; do
        if [ $end = host ]; then ns=$(nc_ns_host "$prefix" 5) dev=$(nc_if_host "$prefix" 5)
        else ns=$(nc_ns_br "$prefix") dev=$(nc_if_br "$prefix" 5); fi
        ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null
        nc_shape "$ns" "$dev" "$1" "" || { echo "bench-quorum: cannot shape $dev" >&2; exit 1; }
    done
}

run() { # name quorum
    # (the servers' hosts are network namespaces of their own: any port; a fresh one each run, so
    # that no socket of the last run lingers on it)
    local name=$1 q=$2 port=$((20100 + RANDOM % 800)) s r t0 pids=() wpid=() ms0 ms3
    job_ini "$tmp/job.ini" 2 4 cluster.job_id="bench-quorum-$name-$port" \
        cluster.servers="$NC_SUBNET.10:$port $NC_SUBNET.11:$port" cluster.connect_timeout_ms=20000 \
        cluster.op_timeout_ms=20000 server.threads=1 server.quorum="$q" server.grace_ms="$grace" \
        server.error_feedback=on log.level=warn
    for s in 0 1; do
        "$nc" exec --prefix "$prefix" "$s" -- "$build/server/psagg-server" --config "$tmp/job.ini" \
            --rank "$s" >"$tmp/server$s.log" 2>&1 &
        pids+=($!)
    done
    t0=$(date +%s%N)
    for r in 0 1 2 3; do
        ( "$nc" exec --prefix "$prefix" $((r + 2)) -- env PSAGG_CONFIG="$tmp/job.ini" \
            PSAGG_RANK=$r PSAGG_WORLD_SIZE=4 "$build/tests/functional/fn_worker" --codec "$codec" \
            --error-feedback --sizes "$sizes" --rounds "$rounds" --straggler 3 --straggler-ms 0 \
            --calm-rounds 0 --lenient >"$tmp/worker$r.log" 2>&1
          echo $? >"$tmp/worker$r.rc"; echo $((($(date +%s%N) - t0) / 1000000)) >"$tmp/worker$r.ms" ) &
        wpid+=($!)
    done
    wait "${wpid[@]}"
    wait "${pids[@]}"
    for r in 0 1 2 3; do
        [ "$(cat "$tmp/worker$r.rc")" = 0 ] || { echo "bench-quorum: $name: worker $r failed:" >&2; tail -5 "$tmp/worker$r.log" >&2; exit 1; }
    done
    ms0=$(cat "$tmp/worker0.ms") ms3=$(cat "$tmp/worker3.ms")
    left=$(sed -n 's/^QUORUM worker 3 left_out \([0-9]*\);.*/\1/p' "$tmp/worker3.log")
    diff=$(sed -n 's/^QUORUM worker 0 .*largest difference \(.*\))/\1/p' "$tmp/worker0.log")
    local w3=$rate
    [ "$name" = even ] || w3="$((slow_bps / 1000000))mbit"
    echo "$name,$q,$rate,$w3,$rounds,$ms0,$ms3,$(awk -v m="$ms0" -v n="$rounds" 'BEGIN{printf "%.1f", m/n}'),$left,$diff" >>"$out"
}

if [ "${PART:-all}" != train ]; then
    prefix=$("$nc" up --hosts 6 --rate "$rate" --owner-pid $$) || exit 1
    echo "run,quorum,rate,worker3_rate,rounds,worker0_ms,worker3_ms,ms_per_round,worker3_left_out,largest_difference" >"$out"
    for ((rep = 0; rep < reps; rep++)); do
        shape_host5 "$(nc_rate_bps "$rate")"
        run even 0
        shape_host5 "$slow_bps"
        run slow 0
        run quorum 3
    done
    column -s, -t "$out"
fi
[ "${PART:-all}" = cluster ] && exit 0

# What it does to training: worker/examples/train_digits.py (the digits CNN, ServerOptimizer:
# SGD with momentum 0.9 on the servers, maxmin4) on loopback, 4 workers x 2 servers, STEPS
# steps (default 600), seeds 0..SEEDS-1 (default 2); worker 3 sleeps SLOW_MS (default 30) in
# every step. quorum 0 and 3 (grace_ms GRACE). A straggler slow in its own compute still sets
# the pace (the others are at most one round ahead): this part measures what leaving its
# gradients out a round costs the model. Output: tests/bench/results/quorum-train.csv.
steps=${STEPS:-600} seeds=${SEEDS:-2} slow_ms=${SLOW_MS:-30}
tout=${TRAIN_OUT:-$repo/tests/bench/results/quorum-train.csv}
py=/usr/bin/python3
"$py" -c "import torch, sklearn" 2>/dev/null || { echo "bench-quorum: $py cannot import torch and sklearn" >&2; exit 77; }
export PSAGG_SERVER_BIN=$build/server/psagg-server
reserve_ports 2 "${PORT:-}"
job_ini "$tmp/train.ini" 2 4 cluster.job_id="bench-quorum-train-$port" cluster.provider=tcp codec.default=maxmin4 \
    codec.min_compress_elems=256 server.optimizer=sgd server.momentum=0.9 server.grace_ms="$grace" log.level=warn
echo "quorum,seed,steps,slow_ms,test_acc,test_loss,final_loss,wall_s,worker3_left_out" >"$tout"
for ((seed = 0; seed < seeds; seed++)); do
    for q in 0 3; do
        PSAGG_SERVER_QUORUM=$q "$repo/deploy/psagg-local" --config "$tmp/train.ini" --timeout 900 -- \
            "$py" "$repo/worker/examples/train_digits.py" --comm psagg-server --steps "$steps" \
            --seed "$seed" --slow-rank 3 --slow-ms "$slow_ms" >"$tmp/train.out" 2>&1 ||
            { echo "bench-quorum: quorum $q seed $seed failed:" >&2; tail -5 "$tmp/train.out" >&2; exit 1; }
        r=$(result_line "$(<"$tmp/train.out")")
        wall=$(grep -E '^\[worker 0\] STEPTIME' "$tmp/train.out" | sed 's/.*wall_s=\([0-9.]*\).*/\1/')
        left=$(grep -o 'LEFTOUT rank=3 left_out=[0-9]*' "$tmp/train.out" | sed 's/.*=//')
        echo "$q,$seed,$steps,$slow_ms,$(result_field test_acc "$r"),$(result_field test_loss "$r"),$(result_field final_loss "$r"),$wall,${left:-0}" >>"$tout"
    done
done
column -s, -t "$tout"
