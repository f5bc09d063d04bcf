#!/usr/bin/env bash
# bench-elastic.sh - what a worker's death costs an elastic job ([cluster] elastic = on):
# worker/examples/train_digits.py (the digits CNN, optimizer on the servers: ServerOptimizer,
# SGD with momentum 0.9; 4 workers x 2 servers on loopback), STEPS steps (default 300), seeds
# 0..SEEDS-1 (default 3), each run twice: uninterrupted, and with worker 2 SIGKILLed before
# step STEPS/2 (the three others re-shard and go on). Per run: test accuracy and final
# training loss (rank 0), and the survivors' median and longest step: the longest is the step
# the death interrupted, so longest - median is the time the death cost.
#
# Output: one CSV row per run to tests/bench/results/elastic-train.csv (or $OUT), then the
# table. Usage: tests/bench/bench-elastic.sh [BUILD_DIR]
set -u -o pipefail
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$repo/build}
steps=${STEPS:-300} seeds=${SEEDS:-3} port=${PORT:-19984}
out=${OUT:-$repo/tests/bench/results/elastic-train.csv}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM PSAGG_SERVER_NESTEROV
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "bench-elastic: $py cannot import torch and sklearn" >&2
    exit 77
fi
cat >"$tmp/job.ini" <<INI
[cluster]
job_id = bench-elastic-$port
servers = 127.0.0.1:$port 127.0.0.1:$((port + 1))
workers = 4
provider = tcp
elastic = on
min_workers = 2
[codec]
default = maxmin4
min_compress_elems = 256
[server]
optimizer = sgd
momentum = 0.9
[log]
level = warn
INI

echo "run,seed,test_acc,final_loss,median_step_ms,longest_step_ms,longest_at" >"$out"
for ((seed = 0; seed < seeds; seed++)); do
    for run in uninterrupted killed; do
        extra=()
        [ "$run" = killed ] && extra=(--die-at $((steps / 2)) --die-rank 2)
        "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 900 -- "$py" \
            "$repo/worker/examples/train_digits.py" --comm psagg-server --steps "$steps" \
            --seed "$seed" "${extra[@]}" >"$tmp/run.out" 2>&1 ||
            { echo "bench-elastic: $run seed $seed failed:"; tail -5 "$tmp/run.out"; exit 1; }
        r=$(grep -m1 'RESULT' "$tmp/run.out")
        acc=$(sed -n 's/.* test_acc=\([0-9.]*\).*/\1/p' <<<"$r")
        loss=$(sed -n 's/.* final_loss=\([0-9.]*\).*/\1/p' <<<"$r")
        # the survivors' (ranks 0, 1, 3) step times: the median of their medians, the longest
        # step after the first 5 (warm-up), and where it was
        st=$(grep -E '^\[worker [013]\] STEPTIME' "$tmp/run.out" | sed 's/.*median_ms=\([0-9.]*\) max_ms=\([0-9.]*\) max_at=\([0-9]*\).*/\1 \2 \3/')
        med=$(awk '{print $1}' <<<"$st" | sort -n | sed -n 2p)
        read -r longest at < <(awk '{print $2, $3}' <<<"$st" | sort -n -k1 | tail -1)
        echo "$run,$seed,$acc,$loss,$med,$longest,$at" | tee -a "$out"
    done
done
