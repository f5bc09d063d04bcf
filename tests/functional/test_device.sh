#!/usr/bin/env bash
# test_device.sh - one case of fn_device (the device path on the simulated device) against a
# real psagg-server on this host; world size 1.
#
# usage: test_device.sh BUILD_DIR CASE [PORT]
# Cases "ef" and "thc" run twice, on the host path and on the device path, and checks that both print
# the same DIGEST (every output and error of 6 rounds with error feedback).
set -u -o pipefail
build=$1 case=$2
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 1 "${3:-}"
job_ini "$tmp/job.ini" 1 1 cluster.job_id="device-$port" cluster.provider=tcp cluster.connect_timeout_ms=20000 \
    cluster.op_timeout_ms=20000 worker.chunk_bytes=262144 log.level=warn
export PSAGG_CONFIG=$tmp/job.ini PSAGG_RANK=0 PSAGG_WORLD_SIZE=1

# run PATH: one job (a fresh server) with fn_device on that path; its output in $tmp/PATH.out
run() {
    start_servers "$tmp/job.ini" 1 "$1-"
    timeout 120 "$build/tests/functional/fn_device" --case "$case" --path "$1" >"$tmp/$1.out" 2>&1
    local rc=$?
    sed "s/^/[$1] /" "$tmp/$1.out"
    kill -TERM "${spid[0]}" 2>/dev/null
    wait "${spid[0]}" 2>/dev/null
    if ((rc != 0)); then
        sed "s/^/[server] /" "$tmp/$1-server0.log"
        echo "test_device: $case on the $1 path exited $rc" >&2
        exit 1
    fi
}

if [ "$case" = ef ] || [ "$case" = thc ]; then
    run host
    run device
    a=$(grep '^DIGEST ' "$tmp/host.out")
    b=$(grep '^DIGEST ' "$tmp/device.out")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        echo "test_device: host path '$a', device path '$b': they differ" >&2
        exit 1
    fi
    echo "test_device: host and device paths bit-identical ($a)"
else
    run device
fi
