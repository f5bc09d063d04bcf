#!/usr/bin/env bash
# demo.sh - the README's first command: install the dependencies, build, and train a small
# MLP on the digits data set with psagg on this host (2 servers x 4 workers, conf/local.ini),
# once with the config's codec ([codec] default, e.g. maxmin4) and once with fp32, then print
# both side by side. Then the same for PyTorch (worker/examples/train_digits.py, a small CNN):
# DDP with psagg's hook next to DDP with Gloo's fp32 all-reduce, and DiLoCo (H = 50 local steps,
# the outer step on the servers, 4-bit outer gradients): accuracy, ms and bytes per step, so the
# 100x+ shows (skipped without torch).
#
# Usage: deploy/demo.sh [TRAINING OPTIONS...]
#   Options are passed to psagg-train-digits (e.g. --epochs 10 --lr 0.1 --batch 32);
#   see `build/worker/examples/psagg-train-digits --help`.
#   PSAGG_DEMO_SKIP_DEPS=1 skips deploy/install-deps.sh; PSAGG_DEMO_SKIP_BUILD=1 skips the
#   configure and build steps (build/ must already hold a build).
#
# Exit status: 0 when the build and both training runs succeeded and, in each run, every
# worker ended with the same model (equal MODEL-HASH lines); non-zero otherwise.
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
config=conf/local.ini
bin=build/worker/examples/psagg-train-digits
say() { printf '\n== demo: %s\n' "$*"; }

if [[ -z ${PSAGG_DEMO_SKIP_DEPS:-} ]]; then
    say "installing dependencies (deploy/install-deps.sh)"
    deploy/install-deps.sh
fi
if [[ -z ${PSAGG_DEMO_SKIP_BUILD:-} ]]; then
    say "configuring and building (cmake --preset default)"
    cmake --preset default
    cmake --build --preset default -j"$(nproc)"
fi
[[ -x $bin ]] || { echo "demo: $bin was not built" >&2; exit 1; }

# The codec the config gives ([codec] default; the environment override wins, as in psagg).
config_codec=${PSAGG_CODEC_DEFAULT:-$(awk '
    { sub(/\r$/, "") }
    /^[ \t]*[;#]/ { next }
    /^[ \t]*\[/ { sec = $0; gsub(/[][ \t]/, "", sec); next }
    sec == "codec" && match($0, /^[ \t]*default[ \t]*[=:]/) {
        v = substr($0, RLENGTH + 1); sub(/[ \t];.*$/, "", v); gsub(/^[ \t]+|[ \t]+$/, "", v); print v
    }' "$config")}
config_codec=${config_codec:-maxmin4}

logs=$(mktemp -d "${TMPDIR:-/tmp}/psagg-demo.XXXXXX")
trap 'rm -rf "$logs"' EXIT
labels=() failed=0
declare -A acc=() step=() bytes=() ratio=() hashes=() status=()

# run NAME CODEC: one training job through the launcher, with [codec] default = CODEC.
# Shows rank 0's progress and any warning or error; the full log is kept for the summary.
run() {
    local name=$1 codec=$2 log=$logs/$1.log rc result n distinct
    labels+=("$name")
    say "training with codec $codec: deploy/psagg-local --config $config -- $bin ${train_args[*]}"
    set +e
    PSAGG_CODEC_DEFAULT=$codec deploy/psagg-local --config "$config" --timeout 600 -- \
        "$bin" "${train_args[@]}" 2>&1 | tee "$log" |
        grep --line-buffered -E '^\[worker 0\] (train-digits|epoch|RESULT)|psagg-local|ERROR|WARN|FAIL|train-digits:'
    rc=${PIPESTATUS[0]}
    set -e
    result=$(sed -n 's/^\[worker 0\] RESULT //p' "$log" | tail -n 1)
    if ((rc != 0)) || [[ -z $result ]]; then
        echo "demo: the $codec run failed (launcher exit $rc); the last lines of its log:" >&2
        tail -n 30 "$log" >&2
        status[$name]="FAILED (exit $rc)"
        failed=1
        return 0
    fi
    field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$result"; }
    acc[$name]=$(field test_acc)
    step[$name]=$(field step_ms)
    bytes[$name]=$(field bytes_per_step)
    ratio[$name]=$(field compression)
    n=$(grep -c '^\[worker [0-9]*\] MODEL-HASH ' "$log" || true)
    distinct=$(sed -n 's/^\[worker [0-9]*\] MODEL-HASH //p' "$log" | sort -u)
    if [[ $n -eq $(field workers) && $(wc -l <<<"$distinct") -eq 1 ]]; then
        hashes[$name]="all $n equal ($distinct)"
        status[$name]=ok
    else
        hashes[$name]="MISMATCH: $(tr '\n' ' ' <<<"$distinct")($n lines)"
        status[$name]="FAILED (models differ)"
        failed=1
    fi
}

train_args=("$@")
run "$config_codec" "$config_codec"
if [[ $config_codec != fp32 ]]; then
    run fp32 fp32
fi

say "results ($config, training options: ${train_args[*]:-defaults})"
printf '%-10s %9s %9s %11s %12s  %-16s %s\n' codec test-acc "ms/step" "bytes/step" compression \
    status "model hashes of the workers"
for name in "${labels[@]}"; do
    printf '%-10s %9s %9s %11s %12s  %-16s %s\n' "$name" "${acc[$name]:--}" "${step[$name]:--}" \
        "${bytes[$name]:--}" "${ratio[$name]:+${ratio[$name]}x}" "${status[$name]}" \
        "${hashes[$name]:--}"
done
cat <<'EOF'

bytes/step: payload bytes one worker pushes per training step (message headers included);
compression: the fp32 bytes of the same gradients divided by that. ms/step: wall time of
one step (forward/backward, push_pull of W1 b1 W2 b2, SGD update), averaged over the run.
EOF

# ---- PyTorch: the same host, a small CNN (worker/examples/train_digits.py), psagg's DDP hook
# with the config's codec next to Gloo's fp32 all-reduce, and DiLoCo on psagg's servers ----
py=/usr/bin/python3
if "$py" -c "import torch, sklearn" 2>/dev/null; then
    declare -A tres=() targs=([psagg]="--comm psagg" [gloo]="--comm gloo" [diloco]="--diloco 50 --codec maxmin4")
    for comm in gloo psagg diloco; do
        envs=()
        # DiLoCo's outer optimizer runs on the servers: SGD with Nesterov momentum
        [[ $comm == diloco ]] && envs=(PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 PSAGG_SERVER_NESTEROV=on)
        say "PyTorch, ${targs[$comm]}: ${envs[*]:+${envs[*]} }deploy/psagg-local --config $config -- $py worker/examples/train_digits.py ${targs[$comm]}"
        set +e
        # shellcheck disable=SC2086
        out=$(env ${envs[@]+"${envs[@]}"} deploy/psagg-local --config "$config" --timeout 600 -- "$py" \
            worker/examples/train_digits.py ${targs[$comm]} 2>&1 | tee "$logs/torch-$comm.log" |
            grep --line-buffered -E '^\[worker 0\] (step|RESULT)|ERROR|rror')
        rc=$?
        set -e
        echo "$out"
        tres[$comm]=$(sed -n 's/^\[worker 0\] RESULT //p' "$logs/torch-$comm.log" | tail -n 1)
        if [[ -z ${tres[$comm]} ]] || (($(grep -o 'sha256=[0-9a-f]*' "$logs/torch-$comm.log" | sort -u | wc -l) != 1)); then
            echo "demo: the PyTorch $comm run failed (or its ranks' weights differ):" >&2
            tail -n 20 "$logs/torch-$comm.log" >&2
            failed=1
        fi
    done
    printf '\n%-34s %9s %10s %9s %11s %12s\n' "PyTorch, 4 workers" "test acc" "final loss" "ms/step" \
        "bytes/step" "vs DDP fp32"
    for comm in gloo psagg diloco; do
        r=${tres[$comm]:-}
        f() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$r"; }
        case $comm in
        gloo) label="DDP, Gloo fp32 all-reduce" b=$(f grad_bytes) ;;
        psagg) label="DDP + psagg hook, $config_codec" b=$(f bytes_per_step) ;;
        diloco) label="DiLoCo H=50, maxmin4 outer" b=$(f bytes_per_step) ;;
        esac
        x=$(awk -v g="$(f grad_bytes)" -v b="$b" 'BEGIN { if (b > 0 && g > 0) printf "%.0fx", g / b }')
        printf '%-34s %9s %10s %9s %11s %12s\n' "$label" "$(f test_acc)" "$(f final_loss)" "$(f ms_per_step)" \
            "${b:--}" "${x:--}"
    done
    cat <<'EOF'

bytes/step: what one worker sends per training step. Gloo: the step's gradients in fp32 (the
all-reduce's input; a ring all-reduce sends 2(N-1)/N times that, 1.5x at 4 workers); psagg: the
bytes it pushed (headers and the start's fp32 weights included) over the steps. vs DDP fp32: the
fp32 gradient bytes divided by that. DiLoCo takes 50 steps of each worker's own SGD, then the
servers apply the outer step (Nesterov momentum) to the 4-bit mean of the workers' deltas.
EOF
else
    say "PyTorch part skipped: $py cannot import torch and sklearn (apt-get install python3-torch python3-sklearn)"
fi

if ((failed)); then
    echo "demo: FAILED" >&2
    exit 1
fi
echo "demo: ok"
