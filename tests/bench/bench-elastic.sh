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
# The servers listen on PORT and PORT+1 when PORT is set, else on two free ports (tests/harness.sh).
set -u -o pipefail
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=${1:-$repo/build}
steps=${STEPS:-300} seeds=${SEEDS:-3}
out=${OUT:-$repo/tests/bench/results/elastic-train.csv}
py=/usr/bin/python3
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM PSAGG_SERVER_NESTEROV
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "bench-elastic: $py cannot import torch and sklearn" >&2
    exit 77
fi
reserve_ports 2 "${PORT:-}"
job_ini "$tmp/job.ini" 2 4 cluster.job_id="bench-elastic-$port" cluster.provider=tcp cluster.elastic=on \
    cluster.min_workers=2 codec.default=maxmin4 codec.min_compress_elems=256 server.optimizer=sgd \
    server.momentum=0.9 log.level=warn

echo "run,seed,test_acc,final_loss,median_step_ms,longest_step_ms,longest_at" >"$out"
for ((seed = 0; seed < seeds; seed++)); do
    for run in uninterrupted killed; do
        extra=()
        [ "$run" = killed ] && extra=(--die-at $((steps / 2)) --die-rank 2)
        "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 900 -- "$py" \
            "$repo/worker/examples/train_digits.py" --comm psagg-server --steps "$steps" \
            --seed "$seed" "${extra[@]}" >"$tmp/run.out" 2>&1 ||
            { echo "bench-elastic: $run seed $seed failed:"; tail -5 "$tmp/run.out"; exit 1; }
        r=$(result_line "$(<"$tmp/run.out")")
        acc=$(result_field test_acc "$r") loss=$(result_field final_loss "$r")
        # the survivors' (ranks 0, 1, 3) step times: the median of their medians, the longest
        # step after the first 5 (warm-up), and where it was
        st=$(grep -E '^\[worker [013]\] STEPTIME' "$tmp/run.out" | sed 's/.*median_ms=\([0-9.]*\) max_ms=\([0-9.]*\) max_at=\([0-9]*\).*/\1 \2 \3/')
        med=$(awk '{print $1}' <<<"$st" | sort -n | sed -n 2p)
        read -r longest at < <(awk '{print $2, $3}' <<<"$st" | sort -n -k1 | tail -1)
        echo "$run,$seed,$acc,$loss,$med,$longest,$at" | tee -a "$out"
    done
done
