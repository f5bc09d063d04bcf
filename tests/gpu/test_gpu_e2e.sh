#!/usr/bin/env bash
# test_gpu_e2e.sh BUILD_DIR - end to end on a GPU host: workers that push_pull device buffers
# (psagg_push_pull_cuda) and a server with [server] gpu = on must produce exactly the bytes
# of the host path (and thc's, fn_thc --cuda: its CPU reference). Exit 77 (skipped) without a
# usable CUDA device.
set -u -o pipefail
build=$1
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
run_case=$here/../functional/run_case.sh
args=(--codec maxmin4 --rounds 5 --sizes 1,1023,300007 --random-tensors 10)

probe=$(PSAGG_RANK=0 PSAGG_WORLD_SIZE=1 "$build/tests/functional/fn_worker" --cuda 2>&1)
rc=$?
if [ $rc -eq 77 ] || { [ $rc -eq 1 ] && grep -q "CUDA finds no" <<<"$probe"; }; then
    echo "$probe"
    exit $rc # 77: no GPU here; 1: a device node, but CUDA is broken
fi

digest() { # run_case arguments... (run_case.sh reserves the servers' ports)
    "$run_case" "$build" "$@" | tee /dev/stderr | sed -n 's/.*bit-identical (digest \([0-9a-f]*\)).*/\1/p' | head -1
}
host=$(digest --servers 2 --workers 2 -- "${args[@]}")
device=$(digest --servers 2 --workers 2 -- "${args[@]}" --cuda)
assist=$(digest --servers 2 --workers 2 --set SERVER_GPU=on --set SERVER_GPU_MIN_ELEMS=1 -- "${args[@]}")
echo "maxmin4: host path $host, device buffers $device, server GPU assist $assist"
ok=0
[ -n "$host" ] && [ "$host" = "$device" ] && [ "$host" = "$assist" ] || ok=1
# the other formats and PSAGG_AVERAGE (the 1/N scale on the device): device = host bytes
for extra in "--codec fp16" "--codec bf16" "--codec maxmin4 --average"; do
    # shellcheck disable=SC2086 # extra holds several arguments
    h=$(digest --servers 1 --workers 2 -- --rounds 4 --sizes 1,1023,300007 $extra)
    # shellcheck disable=SC2086
    d=$(digest --servers 1 --workers 2 -- --rounds 4 --sizes 1,1023,300007 $extra --cuda)
    echo "$extra: host path $h, device buffers $d"
    [ -n "$h" ] && [ "$h" = "$d" ] || ok=1
done
# thc on device buffers (the CUDA rotation, table and decode): fn_thc checks every update bit for
# bit against its CPU reference of the job (blocks of 16384: the kernels' scratch in global memory)
for extra in "--workers 3 -- 6 thc4 --average" "--workers 3 -- 6 thc2/256" "--workers 2 -- 5 thc4/16384"; do
    # shellcheck disable=SC2086
    if "$run_case" "$build" --servers 2 --worker-bin fn_thc $extra --cuda >"${TMPDIR:-/tmp}/gpu-e2e-thc.log" 2>&1; then
        echo "thc ($extra --cuda): every update bit-identical to the CPU reference"
    else
        tail -20 "${TMPDIR:-/tmp}/gpu-e2e-thc.log"
        echo "thc ($extra --cuda): FAILED"
        ok=1
    fi
done
exit $ok
