#!/usr/bin/env bash
# bench-adaptive-train.sh - the evidence for: adaptive per-tensor codecs against uniform
# codecs at the same bytes and against fp32, on the two training examples, over several seeds.
#
#   C     build/worker/examples/psagg-train-digits (an MLP on sklearn's digits), 4 workers x
#         2 servers on loopback, EPOCHS epochs (default 30), seeds 1..SEEDS (default 3; the
#         seed sets the weights, the data split and psagg's rounding streams)
#   torch worker/examples/train_digits.py (a small CNN) under DDP with psagg's hook, STEPS
#         steps (default 300), same workers, seeds 0..SEEDS-1 (skipped without torch)
#   lm    worker/examples/train_tinylm.py (a tiny causal transformer, Adam: where 2-bit
#         gradients hurt) under DDP with psagg's hook, LM_STEPS steps (default 500), seeds
#         0..SEEDS-1; its "final loss" column is the held-out loss (skipped without torch)
# EXAMPLES (default "c torch lm") picks which run; ONLY=TEXT only the configs labelled with it.
# Rows: fp32; uniform maxminB for B in BITS (default "2 3"); adaptive with the budget of
# uniform maxminB (adaptive_budget = 1.0 with default maxminB), adaptive_interval = INTERVAL
# (default 10); uniform maxminB with nearest rounding for B in NEAREST_BITS (default none).
# Every compressed tensor has error feedback (the default).
#
# Output: one CSV row per run (example, config, seed, test accuracy, final loss, bytes sent
# per step) to tests/bench/results/adaptive-train.csv (or $OUT), then mean and spread per
# (example, config). Usage: tests/bench/bench-adaptive-train.sh [BUILD_DIR]
set -u -o pipefail
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$repo/build}
epochs=${EPOCHS:-30} steps=${STEPS:-300} seeds=${SEEDS:-3} interval=${INTERVAL:-10}
bits=${BITS:-"2 3"} port=${PORT:-19960} lm_steps=${LM_STEPS:-500} examples=${EXAMPLES:-"c torch lm"}
out=${OUT:-$repo/tests/bench/results/adaptive-train.csv}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_CODEC_ADAPTIVE PSAGG_CODEC_ADAPTIVE_BUDGET

ini() { # ini CODEC ADAPTIVE [ROUNDING]
    cat <<INI
[cluster]
job_id = bench-adaptive-$port
servers = 127.0.0.1:$port 127.0.0.1:$((port + 1))
workers = 4
provider = tcp
connect_timeout_ms = 30000
[codec]
default = $1
rounding = ${3:-stochastic}
min_compress_elems = 256
adaptive = $2
adaptive_budget = 1.0
adaptive_interval = $interval
[log]
level = warn
INI
}

configs=("fp32 off fp32")
for b in $bits; do configs+=("maxmin$b off maxmin$b" "maxmin$b on adaptive@maxmin$b"); done
for b in ${NEAREST_BITS:-}; do configs+=("maxmin$b off maxmin$b/nearest nearest"); done
if [[ -n ${ONLY:-} ]]; then # ONLY=adaptive: just the rows whose label contains it
    kept=()
    for c in "${configs[@]}"; do [[ $c == *"$ONLY"* ]] && kept+=("$c"); done
    configs=("${kept[@]}")
fi

# field KEY: KEY=value from the RESULT line in $r
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$r"; }

# run_all EXAMPLE FIRST_SEED COMMAND...: every config x SEEDS seeds (@SEED@ in COMMAND), a row each
run_all() {
    local ex=$1 seed0=$2 c codec adaptive label rounding i s acc loss bps
    shift 2
    for c in "${configs[@]}"; do
        read -r codec adaptive label rounding <<<"$c"
        ini "$codec" "$adaptive" "$rounding" >"$tmp/job.ini"
        for ((i = 0; i < seeds; i++)); do
            s=$((seed0 + i))
            PSAGG_WORKER_SEED=$((i + 1)) "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 1800 -- \
                "${@//@SEED@/$s}" >"$tmp/run.out" 2>&1 || { echo "$ex $label seed $s failed:"; tail -5 "$tmp/run.out"; exit 1; }
            r=$(grep 'RESULT' "$tmp/run.out" | head -1)
            case $ex in
            c-*) acc=$(field test_acc) loss=$(field train_loss) bps=$(field bytes_per_step) ;;
            torch-*) acc=$(field test_acc) loss=$(field final_loss) bps=$(($(field psagg_bytes_sent) / steps)) ;;
            *) acc="" loss=$(field val_loss) bps=$(($(field psagg_bytes_sent) / lm_steps)) ;;
            esac
            echo "$ex,$label,$s,$acc,$loss,$bps" | tee -a "$out"
            if [[ $ex == tinylm-* && $adaptive == on && $i == 0 ]]; then # the choice at the end
                { echo "== $label, seed $s, after $lm_steps steps: tensor codec bytes generation"
                  grep 'ASSIGNMENT' "$tmp/run.out" | sed 's/^\[worker 0\] ASSIGNMENT //'; } >>"${out%.csv}-assignment.txt"
            fi
        done
    done
}

echo "example,config,seed,test_acc,final_loss,bytes_per_step" >"$out"
rm -f "${out%.csv}-assignment.txt"
[[ " $examples " == *" c "* ]] &&
    run_all c-digits-mlp 1 "$build/worker/examples/psagg-train-digits" --epochs "$epochs" --seed @SEED@
if /usr/bin/python3 -c "import torch, sklearn" 2>/dev/null; then
    [[ " $examples " == *" torch "* ]] &&
        run_all torch-digits-cnn 0 /usr/bin/python3 "$repo/worker/examples/train_digits.py" --steps "$steps" --seed @SEED@
    [[ " $examples " == *" lm "* ]] &&
        run_all tinylm-transformer-adam 0 /usr/bin/python3 "$repo/worker/examples/train_tinylm.py" --steps "$lm_steps" --seed @SEED@
fi
echo
echo "mean (min..max) over seeds; bytes: what rank 0 sent per step"
awk -F, -v width=42 -f "$repo/tests/bench/bench_summary.awk" "$out"
