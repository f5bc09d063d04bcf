#!/usr/bin/env bash
# bench-server-optim.sh - the accuracy evidence: the optimizer on the servers
# (psagg.torch.ServerOptimizer, [server] optimizer) against the same optimizer on the workers,
# on the two PyTorch examples, 4 workers x 2 servers on loopback, seeds 0..SEEDS-1 (default 3).
#
#   torch  worker/examples/train_digits.py (a small CNN on sklearn's digits; SGD, momentum
#          0.9, lr 0.05), STEPS steps (default 300); test accuracy and final training loss
#   lm     worker/examples/train_tinylm.py (a tiny causal transformer; Adam, lr 3e-3, through
#          DDP's hook), LM_STEPS steps (default 300); held-out loss
# Rows: workers' optimizer with Gloo's fp32 all-reduce (gloo), with psagg's 4-bit gradients
# (grad-maxmin4: DDP hook, worker error feedback); the servers' optimizer with fp32 transport
# (server-fp32) and with 4-bit gradients and 4-bit weight deltas (server-maxmin4).
# EXAMPLES (default "torch lm") picks which run.
#
# Output: one CSV row per run to tests/bench/results/server-optim-train.csv (or $OUT), then mean
# and spread per (example, config). Usage: tests/bench/bench-server-optim.sh [BUILD_DIR]
# The servers listen on PORT and PORT+1 when PORT is set, else on two free ports (tests/harness.sh).
set -u -o pipefail
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=${1:-$repo/build}
steps=${STEPS:-300} lm_steps=${LM_STEPS:-300} seeds=${SEEDS:-3}
examples=${EXAMPLES:-"torch lm"}
out=${OUT:-$repo/tests/bench/results/server-optim-train.csv}
py=/usr/bin/python3
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "bench-server-optim: $py cannot import torch and sklearn" >&2
    exit 77
fi

reserve_ports 2 "${PORT:-}"
job_ini "$tmp/job.ini" 2 4 cluster.job_id="bench-server-optim-$port" cluster.provider=tcp \
    cluster.connect_timeout_ms=30000 codec.default=maxmin4 codec.min_compress_elems=256 log.level=warn

echo "example,config,seed,test_acc,final_loss,bytes_per_step" >"$out"
digits=$repo/worker/examples/train_digits.py
lm=$repo/worker/examples/train_tinylm.py
sgd="PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9"
# torch LABEL SERVER_ENV ARGS..., lm LABEL SERVER_ENV ARGS...: one row of each example
torch() { train_seeds torch-digits-cnn-sgd "$1" "$2" "$py" "$digits" "${@:3}" --steps "$steps" --seed @SEED@; }
lm() { train_seeds tinylm-adam "$1" "$2" "$py" "$lm" "${@:3}" --steps "$lm_steps" --seed @SEED@; }
if [[ " $examples " == *" torch "* ]]; then
    torch gloo "" --comm gloo
    torch grad-maxmin4 "" --comm psagg --codec maxmin4
    torch server-fp32 "$sgd" --comm psagg-server --codec fp32
    torch server-maxmin4 "$sgd" --comm psagg-server --codec maxmin4
fi
if [[ " $examples " == *" lm "* ]]; then
    lm gloo "" --comm gloo
    lm grad-maxmin4 "" --comm psagg --codec maxmin4
    lm server-fp32 PSAGG_SERVER_OPTIMIZER=adam --comm psagg-server --codec fp32
    lm server-maxmin4 PSAGG_SERVER_OPTIMIZER=adam --comm psagg-server --codec maxmin4
fi
echo
echo "mean (min..max) over seeds; bytes: what rank 0 sent per step (gloo: none through psagg)"
train_summary "$out" 36
