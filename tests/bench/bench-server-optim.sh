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
set -u -o pipefail
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$repo/build}
steps=${STEPS:-300} lm_steps=${LM_STEPS:-300} seeds=${SEEDS:-3} port=${PORT:-19964}
examples=${EXAMPLES:-"torch lm"}
out=${OUT:-$repo/tests/bench/results/server-optim-train.csv}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "bench-server-optim: $py cannot import torch and sklearn" >&2
    exit 77
fi

cat >"$tmp/job.ini" <<INI
[cluster]
job_id = bench-server-optim-$port
servers = 127.0.0.1:$port 127.0.0.1:$((port + 1))
workers = 4
provider = tcp
connect_timeout_ms = 30000
[codec]
default = maxmin4
min_compress_elems = 256
[log]
level = warn
INI

. "$repo/tests/bench/bench_train.sh" # field, run

echo "example,config,seed,test_acc,final_loss,bytes_per_step" >"$out"
digits=$repo/worker/examples/train_digits.py
lm=$repo/worker/examples/train_tinylm.py
sgd="PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9"
if [[ " $examples " == *" torch "* ]]; then
    run torch-digits-cnn-sgd gloo "" "$digits" --comm gloo --steps "$steps" --seed @SEED@
    run torch-digits-cnn-sgd grad-maxmin4 "" "$digits" --comm psagg --codec maxmin4 --steps "$steps" --seed @SEED@
    run torch-digits-cnn-sgd server-fp32 "$sgd" "$digits" --comm psagg-server --codec fp32 --steps "$steps" --seed @SEED@
    run torch-digits-cnn-sgd server-maxmin4 "$sgd" "$digits" --comm psagg-server --codec maxmin4 --steps "$steps" --seed @SEED@
fi
if [[ " $examples " == *" lm "* ]]; then
    run tinylm-adam gloo "" "$lm" --comm gloo --steps "$lm_steps" --seed @SEED@
    run tinylm-adam grad-maxmin4 "" "$lm" --comm psagg --codec maxmin4 --steps "$lm_steps" --seed @SEED@
    run tinylm-adam server-fp32 PSAGG_SERVER_OPTIMIZER=adam "$lm" --comm psagg-server --codec fp32 --steps "$lm_steps" --seed @SEED@
    run tinylm-adam server-maxmin4 PSAGG_SERVER_OPTIMIZER=adam "$lm" --comm psagg-server --codec maxmin4 --steps "$lm_steps" --seed @SEED@
fi
echo
echo "mean (min..max) over seeds; bytes: what rank 0 sent per step (gloo: none through psagg)"
awk -F, -v width=36 -f "$repo/tests/bench/bench_summary.awk" "$out"
