#!/usr/bin/env bash
# check-gpu.sh OUTDIR - prove psagg's GPU path on one machine in one run (under 9 minutes on an
# H100), writing every step's log and a one-page OUTDIR/summary.md.
#
# For a machine with an NVIDIA GPU, CUDA (nvcc, compute-sanitizer) and PyTorch 2.x, which may
# lack psagg's libraries and the network: make a bundle on a Debian 12 host first,
#     deploy/install-deps.sh --bundle shared/psagg-bundle
# and copy the checkout with it. Steps, in order (each with a timeout; "skipped" says why):
#   env        the GPU, driver, nvcc, compute-sanitizer, the python that has torch
#   bundle     deploy/install-deps.sh --from BUNDLE --prefix WORK/deps (prefix mode always: the
#              machine's system is never changed) and . WORK/deps/env.sh for everything after.
#              BUNDLE: $PSAGG_BUNDLE, else <checkout>/shared/psagg-bundle; without one the
#              system's libraries are used (skipped)
#   build      cmake -DCMAKE_BUILD_TYPE=Release -DPSAGG_CUDA=ON, for this GPU only
#              (CMAKE_CUDA_ARCHITECTURES=$PSAGG_CUDA_ARCH, default native; 90 without a GPU),
#              cmake --build -j$(nproc), in WORK/build
#   ctest-gpu  ctest -L gpu: with a GPU every test must pass (a skip is a failure)
#   memcheck   compute-sanitizer --tool memcheck over every gpu-labelled test's command, with
#              PSAGG_GPU_SANITIZER=1 (a case that provokes a CUDA API error on purpose is left out)
#   racecheck  the same with --tool racecheck (each capped with timeout: a cap reached with no
#              error so far is reported as partial, not as a failure)
#   bench      psagg-bench-gpu: every kernel against the copy bandwidth, ResNet-50 worker step
#   torch-api  tests/unit/check_torch_api.py with this python: psagg.torch against its torch 2.x
#              (every module imports, every torch name used is public and present, the
#              entry points' argument checks)
#   torch      worker/examples/train_digits.py --device cuda, 4 processes on the one GPU through
#              deploy/psagg-local (2 servers): Gloo DDP (fp32), then DDP with psagg's hook, fp32
#              and maxmin4, and (torch >= 2.7) FSDP2 with psagg as its replica all-reduce
#              (register_fsdp_hook, fp32: the DDP hook's fp32 weights bit for bit); each run: 4
#              equal weight hashes, psagg's loss within 0.1 of Gloo's, accuracy within 0.03.
#              Without a GPU the same runs go on the CPU (--device cpu) so the harness itself
#              is checked here.
# WORK: $PSAGG_CHECK_WORK, else <checkout>/build-check-gpu. Python: $PSAGG_PYTHON, else the
# first of python3, /usr/bin/python3 that imports torch. $PSAGG_CHECK_BUDGET (seconds, default
# 540 with a GPU) caps the whole run: a step that would start past it is skipped. The torch
# job's servers listen on $PSAGG_CHECK_PORT and the next port (default: free ones,
# tests/harness.sh reserve_ports).
# Exit status: 0 when every step that could run passed, 1 otherwise, 2 for usage.
set -u -o pipefail

[ $# -eq 1 ] && [ "$1" != -h ] && [ "$1" != --help ] ||
    { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; [ $# -eq 1 ] && exit 0 || exit 2; }
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh" # reserve_ports, job_ini
repo=$h_repo
work=${PSAGG_CHECK_WORK:-$repo/build-check-gpu}
bundle=${PSAGG_BUNDLE:-$repo/shared/psagg-bundle}
build=$work/build
mkdir -p "$work"
export PATH=$PATH:/usr/local/cuda/bin
t_start=$SECONDS
rows=()
failed=0

log() { echo "check-gpu: $*"; }
# record STEP STATUS SECONDS FIGURES: one summary row; a status "failed..." fails the run
record() {
    rows+=("| $1 | $2 | $3 | $4 |")
    log "$1: $2 ($3 s) $4"
    case $2 in failed*) failed=1 ;; esac
}
# cap SECONDS: the step's timeout, shortened to what the budget leaves (0: none left)
cap() {
    local left=$((deadline - SECONDS))
    ((left < 10)) && { echo 0; return; }
    echo $(($1 < left ? $1 : left))
}
# timed LOG SECONDS CMD...: run CMD with a timeout, output to LOG; sets rc and dt
timed() {
    local logf=$1 limit=$2 t0=$SECONDS
    shift 2
    if [ "$limit" -le 0 ]; then # the budget is spent: never run without a limit
        echo "check-gpu: not run: the time budget is spent" >"$logf"
        rc=124 dt=0
        return
    fi
    timeout -k 10 "$limit" "$@" >"$logf" 2>&1
    rc=$?
    dt=$((SECONDS - t0))
}

# ---- env ----
gpu="" gpu_name=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    gpu_name=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
    gpu=1
elif ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    gpu=1 # a device node without a working driver: the GPU steps run and must fail, not skip
    gpu_name="device node present, nvidia-smi fails"
fi
deadline=$((t_start + ${PSAGG_CHECK_BUDGET:-$([ -n "$gpu" ] && echo 540 || echo 100000)}))
nvcc_v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
sanitizer=$(command -v compute-sanitizer || true)
py=${PSAGG_PYTHON:-}
if [ -z "$py" ]; then
    for c in python3 /usr/bin/python3; do
        if "$c" -c "import torch" 2>/dev/null; then py=$c; break; fi
    done
fi
torch_v="" torch_cuda=""
if [ -n "$py" ]; then
    read -r torch_v torch_cuda < <("$py" -c "import torch; print(torch.__version__, torch.cuda.is_available())" 2>/dev/null)
fi
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -n) $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(nproc) CPUs"
    echo "gpu: ${gpu_name:-none}"
    nvidia-smi 2>&1 | head -15
    echo "nvcc: ${nvcc_v:-none}; compute-sanitizer: ${sanitizer:-none}; cmake: $(cmake --version | head -1)"
    echo "python: ${py:-none with torch}; torch ${torch_v:-none}, cuda available: ${torch_cuda:-n/a}"
    echo "bundle: $bundle; work: $work"
} >"$out/env.log" 2>&1
record env ran 0 "GPU: ${gpu_name:-none}; nvcc ${nvcc_v:-none}; torch ${torch_v:-none} (cuda ${torch_cuda:-n/a}) in ${py:-none}"

# ---- bundle ----
if [ -f "$bundle/manifest.tsv" ]; then
    timed "$out/bundle.log" "$(cap 120)" "$repo/deploy/install-deps.sh" --from "$bundle" --prefix "$work/deps"
    if [ $rc -eq 0 ] && [ -f "$work/deps/env.sh" ]; then
        . "$work/deps/env.sh"
        [ -f "$bundle/data/digits.csv.gz" ] && export PSAGG_DIGITS=$bundle/data/digits.csv.gz
        record bundle passed $dt "$(grep -vc '^#' "$bundle/manifest.tsv") packages into $work/deps; libfabric from $(pkg-config --variable=libdir libfabric)"
    else
        record bundle "failed (exit $rc)" $dt "see bundle.log"
    fi
else
    echo "no bundle at $bundle (make one with deploy/install-deps.sh --bundle DIR; set PSAGG_BUNDLE)" >"$out/bundle.log"
    record bundle "skipped (no bundle at $bundle)" 0 "system libraries: libfabric from $(pkg-config --variable=libdir libfabric 2>/dev/null || echo MISSING)"
fi

# ---- build ----
cuda=OFF arch=""
if [ -n "$nvcc_v" ]; then
    cuda=ON
    if [ -n "$gpu" ]; then arch=${PSAGG_CUDA_ARCH:-native}; else arch=${PSAGG_CUDA_ARCH:-90}; fi
fi
t0=$SECONDS
cfg=(-S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release "-DPSAGG_CUDA=$cuda")
[ -n "$arch" ] && cfg+=("-DCMAKE_CUDA_ARCHITECTURES=$arch")
timed "$out/configure.log" "$(cap 120)" cmake "${cfg[@]}"
if [ $rc -eq 0 ]; then
    timed "$out/build.log" "$(cap "$([ -n "$gpu" ] && echo 420 || echo 3000)")" \
        cmake --build "$build" -j"$(nproc)"
fi
dt=$((SECONDS - t0))
fabric=$(sed -n 's/^pkgcfg_lib_FABRIC_fabric:FILEPATH=//p' "$build/CMakeCache.txt" 2>/dev/null)
if [ $rc -eq 0 ]; then
    note=""
    [ -n "$gpu" ] && ((dt > 180)) && note=" (over the 3-minute target)"
    record build passed $dt "Release, CUDA $cuda${arch:+ arch $arch}, -j$(nproc)$note; libfabric: ${fabric:-?}"
else
    record build "failed (exit $rc)" $dt "see configure.log / build.log"
fi
built=$([ $rc -eq 0 ] && echo 1)
have_cuda=$([ -n "$built" ] && [ -x "$build/tests/gpu/test_cuda_codec" ] && echo 1)

# ---- ctest -L gpu ----
if [ -z "$built" ]; then
    record ctest-gpu "skipped (no build)" 0 ""
elif [ -z "$have_cuda" ]; then
    record ctest-gpu "skipped (built without CUDA: no nvcc)" 0 ""
elif [ "$(cap 180)" = 0 ]; then
    record ctest-gpu "skipped (budget spent)" 0 ""
else
    timed "$out/ctest-gpu.log" "$(cap 180)" ctest --test-dir "$build" -L gpu --output-on-failure -j1
    n_pass=$(grep -c 'Test *#[0-9]*: .* Passed' "$out/ctest-gpu.log")
    n_skip=$(grep -c 'Test *#[0-9]*: .*\*\*\*Skipped\|Test *#[0-9]*: .*Not Run' "$out/ctest-gpu.log")
    n_fail=$(grep -c 'Test *#[0-9]*: .*\*\*\*\(Failed\|Timeout\|Exception\)' "$out/ctest-gpu.log")
    figs="$n_pass passed, $n_skip skipped, $n_fail failed: $(grep -o 'Test *#[0-9]*: [^ ]* [. ]*[*A-Za-z ]*[0-9.]* sec' "$out/ctest-gpu.log" | sed 's/Test *#[0-9]*: //; s/ \.\.*/ /; s/  */ /g' | paste -sd ';')"
    if [ -n "$gpu" ]; then
        if [ $rc -eq 0 ] && ((n_skip == 0 && n_fail == 0 && n_pass > 0)); then
            record ctest-gpu passed $dt "$figs"
        else
            record ctest-gpu "failed (on a GPU machine every test must pass; exit $rc)" $dt "$figs"
        fi
    elif ((n_fail > 0)); then
        record ctest-gpu "failed (exit $rc)" $dt "$figs"
    else
        record ctest-gpu "skipped (no GPU: the tests exit 77)" $dt "$figs"
    fi
fi

# ---- compute-sanitizer memcheck, racecheck ----
# the gpu tests' commands, one a line, tab-separated arguments
gpu_cmds() {
    ctest --test-dir "$build" -L gpu --show-only=json-v1 2>/dev/null | "${py:-python3}" -c '
import json, sys
for t in json.load(sys.stdin).get("tests", []):
    if t.get("command"):
        print(t["name"] + "\t" + "\t".join(t["command"]))'
}
for tool in memcheck racecheck; do
    if [ -z "$have_cuda" ]; then
        record $tool "skipped (no CUDA build)" 0 ""
        continue
    elif [ -z "$gpu" ]; then
        record $tool "skipped (no GPU)" 0 ""
        continue
    elif [ -z "$sanitizer" ]; then
        record $tool "failed (compute-sanitizer not found on a GPU machine)" 0 ""
        continue
    fi
    mapfile -t cmds < <(gpu_cmds)
    total=$(cap 90)
    if [ "$total" = 0 ] || [ ${#cmds[@]} -eq 0 ]; then
        record $tool "skipped (budget spent or no gpu tests)" 0 ""
        continue
    fi
    each=$((total / ${#cmds[@]})) st=passed figs="" t0=$SECONDS
    : >"$out/$tool.log"
    for line in "${cmds[@]}"; do
        IFS=$'\t' read -r -a argv <<<"$line"
        name=${argv[0]}
        timed "$out/$tool-$name.log" "$each" env PSAGG_GPU_SANITIZER=1 "$sanitizer" --tool $tool --target-processes all \
            --error-exitcode 99 "${argv[@]:1}"
        cat "$out/$tool-$name.log" >>"$out/$tool.log"
        errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$out/$tool-$name.log" | awk '{ s += $1 } END { print s + 0 }')
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            figs+="$name: capped at ${each} s, $errs errors so far; "
            ((errs > 0)) && st="failed (errors)"
            [ "$st" = passed ] && st="passed (partial: capped)"
        elif [ $rc -ne 0 ]; then
            figs+="$name: exit $rc, $errs errors; "
            st="failed (exit $rc)"
        else
            figs+="$name: $errs errors; "
        fi
    done
    record $tool "$st" $((SECONDS - t0)) "${figs%; }"
done

# ---- psagg-bench-gpu ----
bench=$build/tests/gpu/psagg-bench-gpu
if [ ! -x "$bench" ]; then
    record bench "skipped (no CUDA build)" 0 ""
elif [ "$(cap 90)" = 0 ]; then
    record bench "skipped (budget spent)" 0 ""
else
    timed "$out/bench.log" "$(cap 90)" "$bench"
    if [ $rc -eq 77 ] && [ -n "$gpu" ]; then
        record bench "failed (exit 77 on a GPU machine: $(head -1 "$out/bench.log"))" $dt ""
    elif [ $rc -eq 77 ]; then
        record bench "skipped (no GPU: $(head -1 "$out/bench.log"))" $dt ""
    elif [ $rc -ne 0 ]; then
        record bench "failed (exit $rc)" $dt "see bench.log"
    else
        figs=$(awk '
            /device-to-device copy/ { match($0, /[0-9.]+ GB\/s/); copy = substr($0, RSTART, RLENGTH) }
            /% of copy$/ && / maxmin4 / {
                n = split($0, w, " "); what = ($1 == "aggregate") ? $1 " " $2 : $1
                if (what ~ /^(encode\+EF|decode|aggregate N=8)$/) k = k " " what " " w[n - 2] ";"
            }
            /^  [^ ]+ +[0-9]+ tensors/ { codec = $1 }
            /step total:/ { s = s " " codec " " $3 "/" $8 " ms;" }
            END { printf "copy %s; maxmin4 of copy:%s ResNet-50 worker step, plain/graph:%s", copy, k, s }
        ' "$out/bench.log")
        record bench passed $dt "$figs"
    fi
fi

# ---- psagg.torch against this torch (2.x here): tests/unit/check_torch_api.py ----
if [ -z "$built" ] || [ -z "$py" ]; then
    record torch-api "skipped (${py:+no build}${py:-no python with torch})" 0 ""
else
    timed "$out/torch-api.log" "$(cap 60)" "$py" "$repo/tests/unit/check_torch_api.py" "$build/python"
    if [ $rc -eq 0 ]; then
        record torch-api passed $dt "$(grep -o '[0-9]* torch names psagg.torch uses' "$out/torch-api.log"), torch $torch_v"
    else
        record torch-api "failed (exit $rc)" $dt "$(grep -m3 '^FAIL' "$out/torch-api.log" | tr '\n' ' ')"
    fi
fi

# ---- PyTorch: DDP on the GPU, Gloo against psagg fp32 and maxmin4 ----
torch_step() {
    local device=$1 why=$2 job=$work/torch-job.ini name rc_all=0 figs="" t0=$SECONDS
    local -A loss=() acc=()
    reserve_ports 2 "${PSAGG_CHECK_PORT:-}"
    job_ini "$job" 2 4 cluster.job_id=check-gpu-torch cluster.provider=tcp cluster.connect_timeout_ms=30000 \
        cluster.op_timeout_ms=10000 codec.default=fp32 codec.min_compress_elems=256 log.level=warn
    local runs=("gloo gloo" "fp32 psagg fp32" "maxmin4 psagg maxmin4") fsdp_hash="" fp32_hash=""
    # FSDP2 where this torch has its public all-reduce hook (torch >= 2.7): psagg as the
    # replica all-reduce, fp32, must give the DDP hook's fp32 weights bit for bit (both runs
    # with deterministic kernels: cuDNN's convolution backward is not, by default)
    if PYTHONPATH="$build/python" "$py" -c 'import sys, psagg.torch.fsdp as f; sys.exit(f._fsdp_module_class() is None)' 2>/dev/null; then
        runs+=("fsdp2 psagg-fsdp fp32")
    else
        figs+="fsdp2: skipped (no public FSDP2 all-reduce hook in torch $torch_v); "
    fi
    for run in "${runs[@]}"; do
        read -r name comm codec <<<"$run"
        if [ "$name" = fsdp2 ] && [ "$(cap 120)" -lt 100 ]; then
            figs+="fsdp2: skipped (budget spent); "
            continue
        fi
        local args=(--comm "$comm" --steps 200 --device "$device" --unused)
        [ -n "${codec:-}" ] && args+=(--codec "$codec")
        [ "$codec" = fp32 ] && args+=(--deterministic)
        local servers=()
        [ "$comm" = gloo ] && servers=(--servers 0)
        timed "$out/torch-$name.log" "$(cap 120)" env PSAGG_SERVER_BIN="$build/server/psagg-server" CUBLAS_WORKSPACE_CONFIG=:4096:8 \
            "$repo/deploy/psagg-local" --config "$job" "${servers[@]}" --timeout 110 -- \
            "$py" "$repo/worker/examples/train_digits.py" "${args[@]}"
        local hashes res
        hashes=$(grep -o 'PARAMS rank=[0-9] sha256=[0-9a-f]*' "$out/torch-$name.log" | awk '{ print $3 }' | sort | uniq -c)
        res=$(grep -o 'final_loss=[0-9.]* test_acc=[0-9.]*' "$out/torch-$name.log" | tail -1)
        loss[$name]=$(sed -n 's/final_loss=\([0-9.]*\).*/\1/p' <<<"$res")
        acc[$name]=$(sed -n 's/.*test_acc=\([0-9.]*\).*/\1/p' <<<"$res")
        if [ $rc -ne 0 ] || [ -z "$res" ]; then
            figs+="$name: exit $rc; "
            rc_all=1
        elif [ "$(wc -l <<<"$hashes")" != 1 ] || [ "$(awk '{ print $1 }' <<<"$hashes")" != 4 ]; then
            figs+="$name: weights differ across ranks; "
            rc_all=1
        else
            figs+="$name: loss ${loss[$name]} acc ${acc[$name]} $(grep -o 'ms_per_step=[0-9.]*' "$out/torch-$name.log" | tail -1 | sed 's/ms_per_step=//') ms/step"
            [ "$name" = fp32 ] && fp32_hash=$(awk '{ print $2 }' <<<"$hashes")
            if [ "$name" = fsdp2 ]; then
                fsdp_hash=$(awk '{ print $2 }' <<<"$hashes")
                if [ -n "$fp32_hash" ] && [ "$fsdp_hash" = "$fp32_hash" ]; then
                    figs+=" (weights bit-identical to the DDP hook's fp32 run)"
                else
                    figs+=" (weights NOT those of the DDP hook's fp32 run)"
                    rc_all=1
                fi
            fi
            if [ "$comm" = psagg ] || [ "$comm" = psagg-fsdp ]; then
                if [ -n "${loss[gloo]:-}" ] && awk -v l="${loss[$name]}" -v a="${acc[$name]}" \
                    -v rl="${loss[gloo]}" -v ra="${acc[gloo]}" \
                    'BEGIN { d = l - rl; if (d < 0) d = -d; exit !(d <= 0.1 && a >= ra - 0.03) }'; then
                    figs+=" (within Gloo's noise)"
                else
                    figs+=" (NOT within 0.1 loss / 0.03 acc of Gloo's)"
                    rc_all=1
                fi
                grep -q "device=$device" "$out/torch-$name.log" || { figs+=" (not on $device)"; rc_all=1; }
            fi
            figs+="; "
        fi
    done
    dt=$((SECONDS - t0))
    if [ $rc_all -eq 0 ]; then
        record torch "${why:-passed}" $dt "${figs%; }"
    else
        record torch "failed${why:+ (the CPU runs, no GPU)}" $dt "${figs%; }"
    fi
}
if [ -z "$built" ]; then
    record torch "skipped (no build)" 0 ""
elif [ -z "$py" ]; then
    record torch "skipped (no python with torch)" 0 ""
elif [ "$(cap 120)" = 0 ]; then
    record torch "skipped (budget spent)" 0 ""
elif [ -n "$gpu" ]; then
    if [ "$torch_cuda" != True ]; then
        record torch "failed (torch.cuda.is_available() is False on a GPU machine)" 0 ""
    elif [ -z "$have_cuda" ]; then
        record torch "failed (libpsagg built without CUDA on a GPU machine)" 0 ""
    else
        torch_step cuda ""
    fi
elif ! "$py" -c "import sklearn" 2>/dev/null && [ -z "${PSAGG_DIGITS:-}" ]; then
    record torch "skipped (no GPU; and no sklearn or PSAGG_DIGITS for the CPU run)" 0 ""
else
    torch_step cpu "skipped (no GPU; the same runs on the CPU passed)"
fi

# ---- summary ----
total=$((SECONDS - t_start))
{
    echo "# check-gpu.sh summary"
    echo
    echo "$(date -u +%FT%TZ), $(uname -n), GPU: ${gpu_name:-none}, nvcc ${nvcc_v:-none}, torch ${torch_v:-none}" \
        "(cuda ${torch_cuda:-n/a}), checkout $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo ?)"
    echo
    echo "| step | status | wall s | key figures |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Total $total s$([ -n "$gpu" ] && { ((total <= 540)) && echo " (within 9 minutes)" || echo " (OVER 9 minutes)"; })." \
        "Result: $([ $failed -eq 0 ] && echo "every step that could run passed" || echo FAILED)." \
        "Logs: $out/*.log."
} >"$out/summary.md"
cat "$out/summary.md"
exit $failed
