#!/usr/bin/env bash
# run_case.sh - one functional scenario: real psagg-server processes and fn_worker processes
# talking over libfabric (tcp or shm) on this host.
#
# usage: run_case.sh BUILD_DIR --servers S --workers N --provider P [--port BASE]
#                    [--runs R] [--set SECTION_KEY=VALUE]... [--expect-fail]
#                    [--start-servers K] [--start-workers M] [--worker-set S_K=V]...
#                    [--log-has TEXT]... [--log-lacks TEXT]... [--worker-bin NAME]
#                    -- FN_WORKER_ARGS...
#
# Normal mode runs the job R times through deploy/psagg-local and checks that every worker
# exited 0 and printed the same DIGEST, and that every run printed the same DIGEST.
# --expect-fail starts K servers and M workers directly (defaults S and N), and checks that
# each worker reported the expected error (fn_worker --expect ...), that each worker's log
# has a line with every --log-has TEXT and none with a --log-lacks TEXT, and that nothing
# hangs. --worker-bin runs another program of tests/functional (default fn_worker) with the
# same contract: DIGEST lines, or EXPECTED-ERROR-OK. Provider "rxm" (--provider, --worker-set
# CLUSTER_PROVIDER=) stands for "tcp;ofi_rxm", which a CMake list cannot carry. Without --port,
# the servers' ports are reserved free ones (tests/harness.sh, reserve_ports); @PORT@ in a
# --log-has or --log-lacks TEXT is server 0's.
set -u -o pipefail

build=$1
shift
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
servers=1 workers=2 provider=tcp port="" runs=1 expect_fail=0 start_servers="" start_workers=""
worker_name=fn_worker
sets=()
worker_sets=()
log_has=()
log_lacks=()
while (($#)); do
    case $1 in
    --servers) servers=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --provider) provider=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    --worker-set) worker_sets+=("PSAGG_${2/#CLUSTER_PROVIDER=rxm/CLUSTER_PROVIDER=tcp;ofi_rxm}"); shift 2 ;;
    --expect-fail) expect_fail=1; shift ;;
    --log-has) log_has+=("$2"); shift 2 ;;
    --log-lacks) log_lacks+=("$2"); shift 2 ;;
    --start-servers) start_servers=$2; shift 2 ;;
    --start-workers) start_workers=$2; shift 2 ;;
    --worker-bin) worker_name=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run_case: unknown argument $1" >&2; exit 2 ;;
    esac
done

[[ $provider == rxm ]] && provider='tcp;ofi_rxm'
reserve_ports "$servers" "$port"
job_ini "$tmp/job.ini" "$servers" "$workers" cluster.job_id="fn-$port" cluster.provider="$provider" \
    cluster.connect_timeout_ms=20000 cluster.op_timeout_ms=60000 server.threads=2 \
    worker.chunk_bytes=262144 log.level=warn
log_has=("${log_has[@]//@PORT@/$port}") log_lacks=("${log_lacks[@]//@PORT@/$port}")
for kv in "${sets[@]}"; do export "PSAGG_${kv%%=*}=${kv#*=}"; done

server_bin=$build/server/psagg-server
worker_bin=$build/tests/functional/$worker_name

if ((expect_fail == 0)); then
    first=""
    for ((run = 1; run <= runs; run++)); do
        "$h_repo/deploy/psagg-local" --config "$tmp/job.ini" --server-bin "$server_bin" --timeout 240 \
            -- "$worker_bin" "$@" >"$tmp/run$run.log" 2>&1
        rc=$?
        cat "$tmp/run$run.log"
        if ((rc != 0)); then
            echo "run_case: run $run: launcher exited $rc" >&2
            exit 1
        fi
        n=$(grep -c '^\[worker [0-9]*\] DIGEST ' "$tmp/run$run.log")
        distinct=$(grep '^\[worker [0-9]*\] DIGEST ' "$tmp/run$run.log" | awk '{print $4}' | sort -u)
        if ((n != workers)) || [ "$(echo "$distinct" | wc -l)" -ne 1 ]; then
            echo "run_case: run $run: expected one DIGEST shared by $workers workers, got $n lines: $distinct" >&2
            exit 1
        fi
        echo "run_case: run $run: all $workers workers bit-identical (digest $distinct)"
        if [ -z "$first" ]; then
            first=$distinct
        elif [ "$first" != "$distinct" ]; then
            echo "run_case: run $run digest $distinct differs from run 1's $first" >&2
            exit 1
        fi
    done
    ((runs > 1)) && echo "run_case: $runs runs bit-identical"
    exit 0
fi

# --expect-fail: start processes directly, each in its own process group
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=$workers
start_servers "$tmp/job.ini" "${start_servers:-$servers}"
for ((i = 0; i < ${start_workers:-$workers}; i++)); do
    start_worker "$i" "$tmp/worker$i.log" ${worker_sets[@]+"${worker_sets[@]}"} "$worker_bin" "$@"
done
fail=0
for ((i = 0; i < ${start_workers:-$workers}; i++)); do
    # bounded: each worker carries its own --max-seconds check; this is the hang guard
    wait_for "${wpid[$i]}" 60
    rc=$?
    if ((rc == 124)) && kill -0 "${wpid[$i]}" 2>/dev/null; then
        echo "run_case: worker $i still running after 60 s: a hang" >&2
        fail=1
        continue
    fi
    sed "s/^/[worker $i] /" "$tmp/worker$i.log"
    if ((rc != 0)) || ! grep -q EXPECTED-ERROR-OK "$tmp/worker$i.log"; then
        echo "run_case: worker $i exited $rc without the expected error" >&2
        fail=1
    fi
    for text in ${log_has[@]+"${log_has[@]}"}; do
        if ! grep -qF -- "$text" "$tmp/worker$i.log"; then
            echo "run_case: worker $i's log has no line with '$text'" >&2
            fail=1
        fi
    done
    for text in ${log_lacks[@]+"${log_lacks[@]}"}; do
        if grep -qF -- "$text" "$tmp/worker$i.log"; then
            echo "run_case: worker $i's log mentions '$text'" >&2
            fail=1
        fi
    done
done
for ((i = 0; i < ${start_servers:-$servers}; i++)); do sed "s/^/[server $i] /" "$tmp/server$i.log"; done
exit $fail
