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
# (default 10); uniform maxminB with nearest rounding for B in NEAREST_BITS (default none);
# uniform maxminB without its adaptive row for B in PLAIN_BITS, and thcB (integer aggregation,
# kernels/thc.h) for B in THC_BITS (both default none); adaptive thc (declared thc4, each tensor
# thc2 or thc4) at a budget of B bits an element for B in THC_ADAPTIVE_BITS (default none).
# Every compressed tensor has error feedback (the default).
#
# Output: one CSV row per run (example, config, seed, test accuracy, final loss, bytes sent
# per step) to tests/bench/results/adaptive-train.csv (or $OUT), then mean and spread per
# (example, config). Usage: tests/bench/bench-adaptive-train.sh [BUILD_DIR]
# The servers listen on PORT and PORT+1 when PORT is set, else on two free ports (tests/harness.sh).
set -u -o pipefail
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=${1:-$repo/build}
epochs=${EPOCHS:-30} steps=${STEPS:-300} seeds=${SEEDS:-3} interval=${INTERVAL:-10}
bits=${BITS:-"2 3"} lm_steps=${LM_STEPS:-500} examples=${EXAMPLES:-"c torch lm"}
out=${OUT:-$repo/tests/bench/results/adaptive-train.csv}
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_CODEC_ADAPTIVE PSAGG_CODEC_ADAPTIVE_BUDGET
reserve_ports 2 "${PORT:-}"

ini() { # ini CODEC ADAPTIVE [ROUNDING [BUDGET]]: $tmp/job.ini
    job_ini "$tmp/job.ini" 2 4 cluster.job_id="bench-adaptive-$port" cluster.provider=tcp \
        cluster.connect_timeout_ms=30000 codec.default="$1" codec.rounding="${3:-stochastic}" \
        codec.min_compress_elems=256 codec.adaptive="$2" codec.adaptive_budget="${4:-1.0}" \
        codec.adaptive_interval="$interval" log.level=warn
}

variants=("fp32 off fp32")
for b in $bits; do variants+=("maxmin$b off maxmin$b" "maxmin$b on adaptive@maxmin$b"); done
for b in ${NEAREST_BITS:-}; do variants+=("maxmin$b off maxmin$b/nearest nearest"); done
for b in ${PLAIN_BITS:-}; do variants+=("maxmin$b off maxmin$b"); done
for b in ${THC_BITS:-}; do variants+=("thc$b off thc$b"); done
for b in ${THC_ADAPTIVE_BITS:-}; do variants+=("thc4 on adaptive-thc@${b}bits stochastic ${b}bits"); done
if [[ -n ${ONLY:-} ]]; then # ONLY=adaptive: just the rows whose label contains it
    kept=()
    for c in "${variants[@]}"; do [[ $c == *"$ONLY"* ]] && kept+=("$c"); done
    variants=("${kept[@]}")
fi

# run_all EXAMPLE FIRST_SEED COMMAND...: every variant x SEEDS seeds (@SEED@ in COMMAND), a row each
run_all() {
    local ex=$1 c codec adaptive label rounding budget
    seed0=$2
    shift 2
    for c in "${variants[@]}"; do
        read -r codec adaptive label rounding budget <<<"$c"
        ini "$codec" "$adaptive" "$rounding" "$budget"
        train_seeds "$ex" "$label" "" "$@"
        if [[ $ex == tinylm-* && $adaptive == on ]]; then # the choice at the end, first seed
            { echo "== $label, seed $seed0, after $lm_steps steps: tensor codec bytes generation"
              grep 'ASSIGNMENT' "$tmp/${label//\//_}-$seed0.out" | sed 's/^\[worker 0\] ASSIGNMENT //'; } >>"${out%.csv}-assignment.txt"
        fi
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
train_summary "$out" 42
