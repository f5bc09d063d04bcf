#!/usr/bin/env bash
# test_gpu_e2e.sh BUILD_DIR - end to end on a GPU host: workers that push_pull device buffers
# (psagg_push_pull_cuda) and a server with [server] gpu = on must produce exactly the bytes
# of the host path. Exit 77 (skipped) without a usable CUDA device.
set -u -o pipefail
build=$1
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
run_case=$here/../functional/run_case.sh
args=(--codec maxmin4 --rounds 5 --sizes 1,1023,300007 --random-tensors 10)

probe=$(PSAGG_RANK=0 PSAGG_WORLD_SIZE=1 "$build/tests/functional/fn_worker" --cuda 2>&1)
if [ $? -eq 77 ]; then
    echo "$probe"
    exit 77
fi

digest() { # run_case arguments...
    "$run_case" "$build" "$@" | tee /dev/stderr | sed -n 's/.*bit-identical (digest \([0-9a-f]*\)).*/\1/p' | head -1
}
host=$(digest --servers 2 --workers 2 --port 19720 -- "${args[@]}")
device=$(digest --servers 2 --workers 2 --port 19724 -- "${args[@]}" --cuda)
assist=$(digest --servers 2 --workers 2 --port 19728 --set SERVER_GPU=on --set SERVER_GPU_MIN_ELEMS=1 -- "${args[@]}")
echo "host path $host, device buffers $device, server GPU assist $assist"
[ -n "$host" ] && [ "$host" = "$device" ] && [ "$host" = "$assist" ]
