#!/usr/bin/env bash
# bench-diloco.sh - the accuracy evidence of DiLoCo: DiLoCo and Streaming DiLoCo (psagg.torch.DiLoCo,
# the outer step on the servers) against DDP at equal inner steps, on the two PyTorch examples,
# 4 workers x 2 servers on loopback, seeds 0..SEEDS-1 (default 3).
#
#   torch  worker/examples/train_digits.py (a small CNN on sklearn's digits; inner SGD, momentum
#          0.9, lr 0.05), STEPS inner steps (default 300); test accuracy and final training loss
#   lm     worker/examples/train_tinylm.py (a tiny causal transformer on 2 MB of Python sources;
#          inner Adam, lr 3e-3), LM_STEPS inner steps (default 500); held-out loss
# Rows: Gloo's fp32 all-reduce every step (gloo); psagg's DDP hook with 4-bit gradients every
# step (grad-maxmin4); DiLoCo with H inner steps per outer step (outer SGD, Nesterov momentum
# 0.9, outer lr 0.7 unless the label says olr) and fp32, maxmin4 or sparse topk2 (2 % of each
# block, 2 bits; -nomom: plain outer SGD, SparseLoCo's; -b95: SparseLoCo's error feedback that
# decays by beta = 0.95) outer gradients (dH-CODEC; d50-maxmin4-nomom: dense with plain outer SGD);
# Streaming DiLoCo with 4 fragments and a sync delay of 1 or 2 steps (sH-p4-dTAU).
# EXAMPLES (default "torch lm") picks which run; CONFIGS (default: all) which rows, e.g.
# CONFIGS="gloo d50-maxmin4"; APPEND=1 adds to the CSV instead of starting it anew.
#
# Output: one CSV row per run to tests/bench/results/diloco-train.csv (or $OUT), then mean and
# spread per (example, config). Usage: tests/bench/bench-diloco.sh [BUILD_DIR]
# The servers listen on PORT and PORT+1 when PORT is set, else on two free ports (tests/harness.sh).
set -u -o pipefail
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=${1:-$repo/build}
steps=${STEPS:-300} lm_steps=${LM_STEPS:-500} seeds=${SEEDS:-3}
examples=${EXAMPLES:-"torch lm"} configs=${CONFIGS:-}
out=${OUT:-$repo/tests/bench/results/diloco-train.csv}
py=/usr/bin/python3
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM PSAGG_SERVER_NESTEROV
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "bench-diloco: $py cannot import torch and sklearn" >&2
    exit 77
fi

reserve_ports 2 "${PORT:-}"
job_ini "$tmp/job.ini" 2 4 cluster.job_id="bench-diloco-$port" cluster.provider=tcp cluster.connect_timeout_ms=30000 \
    codec.default=maxmin4 codec.min_compress_elems=256 log.level=warn

[[ ${APPEND:-0} == 1 && -s $out ]] || echo "example,config,seed,test_acc,final_loss,bytes_per_step" >"$out"
outer="PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 PSAGG_SERVER_NESTEROV=on"
# matrix EXAMPLE SCRIPT STEPS: the rows above
matrix() {
    local ex=$1 script=$2 n=$3
    train_seeds "$ex" gloo "" "$py" "$script" --comm gloo --steps "$n" --seed @SEED@
    train_seeds "$ex" grad-maxmin4 "" "$py" "$script" --comm psagg --codec maxmin4 --steps "$n" --seed @SEED@
    train_seeds "$ex" d10-maxmin4 "$outer" "$py" "$script" --diloco 10 --codec maxmin4 --steps "$n" --seed @SEED@
    train_seeds "$ex" d10-maxmin4-olr0.3 "$outer" "$py" "$script" --diloco 10 --outer-lr 0.3 --codec maxmin4 \
        --steps "$n" --seed @SEED@
    train_seeds "$ex" d50-fp32 "$outer" "$py" "$script" --diloco 50 --codec fp32 --steps "$n" --seed @SEED@
    train_seeds "$ex" d50-maxmin4 "$outer" "$py" "$script" --diloco 50 --codec maxmin4 --steps "$n" --seed @SEED@
    # the same with plain outer SGD: the sparse rows' outer step, so that the two differ in the codec alone
    train_seeds "$ex" d50-maxmin4-nomom "PSAGG_SERVER_OPTIMIZER=sgd" "$py" "$script" --diloco 50 --outer-momentum 0 \
        --codec maxmin4 --steps "$n" --seed @SEED@
    # sparse outer gradients (SparseLoCo's shape): the top 2 % of each block of 4096 in 2 bits,
    # with DiLoCo's outer momentum and without (nomom: plain outer SGD, as SparseLoCo)
    for h in 15 50; do
        train_seeds "$ex" "d$h-topk2" "$outer" "$py" "$script" --diloco "$h" --codec topk2:0.02 --steps "$n" \
            --seed @SEED@
        train_seeds "$ex" "d$h-topk2-nomom" "PSAGG_SERVER_OPTIMIZER=sgd" "$py" "$script" --diloco "$h" \
            --outer-momentum 0 --codec topk2:0.02 --steps "$n" --seed @SEED@
        # and SparseLoCo's decaying error feedback (beta 0.95)
        train_seeds "$ex" "d$h-topk2-nomom-b95" "PSAGG_SERVER_OPTIMIZER=sgd PSAGG_CODEC_ERROR_FEEDBACK_BETA=0.95" \
            "$py" "$script" --diloco "$h" --outer-momentum 0 --codec topk2:0.02 --steps "$n" --seed @SEED@
    done
    # the trade-off curve at H=50 (plain outer SGD): denser and wider sparse outer gradients
    for kb in 2:0.05 2:0.1 4:0.02 4:0.05 4:0.1 4:0.2; do
        train_seeds "$ex" "d50-topk${kb%%:*}-${kb#*:}-nomom" "PSAGG_SERVER_OPTIMIZER=sgd" "$py" "$script" \
            --diloco 50 --outer-momentum 0 --codec "topk${kb%%:*}:${kb#*:}" --steps "$n" --seed @SEED@
    done
    train_seeds "$ex" s50-p4-d1 "$outer" "$py" "$script" --diloco 50 --fragments 4 --delay 1 --codec maxmin4 \
        --steps "$n" --seed @SEED@
    train_seeds "$ex" s50-p4-d2 "$outer" "$py" "$script" --diloco 50 --fragments 4 --delay 2 --codec maxmin4 \
        --steps "$n" --seed @SEED@
}
[[ " $examples " == *" torch "* ]] && matrix torch-digits-cnn-sgd "$repo/worker/examples/train_digits.py" "$steps"
[[ " $examples " == *" lm "* ]] && matrix tinylm-adam "$repo/worker/examples/train_tinylm.py" "$lm_steps"
echo
echo "mean (min..max) over seeds; bytes: what rank 0 sent per inner step (gloo: none through psagg)"
train_summary "$out" 36
