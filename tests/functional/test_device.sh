#!/usr/bin/env bash
# test_device.sh - one case of fn_device (the device path on the simulated device) against a
# real psagg-server on this host; world size 1.
#
# usage: test_device.sh BUILD_DIR PORT CASE
# Case "ef" runs twice, on the host path and on the device path, and checks that both print
# the same DIGEST (every output and error of 6 rounds with error feedback).
set -u -o pipefail
build=$1 port=$2 case=$3
tmp=$(mktemp -d)
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill -KILL "$server_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
cat >"$tmp/job.ini" <<INI
[cluster]
job_id = device-$port
servers = 127.0.0.1:$port
workers = 1
provider = tcp
connect_timeout_ms = 20000
op_timeout_ms = 20000
[worker]
chunk_bytes = 262144
[log]
level = warn
INI
export PSAGG_CONFIG=$tmp/job.ini PSAGG_RANK=0 PSAGG_WORLD_SIZE=1

# run PATH: one job (a fresh server) with fn_device on that path; its output in $tmp/PATH.out
run() {
    "$build/server/psagg-server" --config "$tmp/job.ini" --rank 0 >"$tmp/server-$1.log" 2>&1 &
    server_pid=$!
    timeout 120 "$build/tests/functional/fn_device" --case "$case" --path "$1" >"$tmp/$1.out" 2>&1
    local rc=$?
    sed "s/^/[$1] /" "$tmp/$1.out"
    kill -TERM "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=""
    if ((rc != 0)); then
        sed "s/^/[server] /" "$tmp/server-$1.log"
        echo "test_device: $case on the $1 path exited $rc" >&2
        exit 1
    fi
}

if [ "$case" = ef ]; then
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
