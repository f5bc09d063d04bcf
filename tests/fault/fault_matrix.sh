#!/usr/bin/env bash
# fault_matrix.sh ROW BUILD_DIR [PORT] - one row of psagg's fault matrix
# (docs/failures-and-security.md, "The fault matrix").
#
# Every row runs real psagg-server and worker processes on this host with op_timeout_ms = OP
# (2000), injects one fault, and checks: each surviving process reports a clear error that
# names the culprit within 2 x OP of the fault (workers: fn_worker --expect), nothing hangs,
# and the servers meet their documented fate. Rows:
#
#   worker_sigkill   SIGKILL a worker mid-job: the others fail naming it (EPEER); servers exit 1
#   worker_stalled   a worker stays alive (PINGs answered) but stops pushing: the servers' round
#                    deadline (1.5 x OP) fails the job naming it; servers exit 1
#   worker_sigstop   SIGSTOP a worker mid-job: the servers stop hearing its PINGs and close it
#                    after op_timeout_ms; the others fail naming it (ETIMEDOUT); servers exit 1
#   server_sigkill   SIGKILL a server: every worker fails naming it (EPEER); the other server
#                    exits 1 once the workers are gone
#   server_sigstop   SIGSTOP a server: the workers stop hearing its PINGs and fail naming it
#                    (ETIMEDOUT) after op_timeout_ms; the other server exits 1
#   spoofed_push     a process that never authenticated pushes poisoned data claiming to be
#                    worker 1, from before worker 1 starts: dropped and logged, sums exact,
#                    all exit 0
#   idle_500         500 idle connections to the server before and while the workers start,
#                    and longer than connect_timeout_ms: the job still starts and succeeds
#   declaration_bomb an authenticated worker declares a tensor beyond the server's memory
#                    budget, then one in 64-element chunks: both refused with a message naming
#                    the tensor and the bytes (or the field), and the server's peak RSS grows
#                    by less than 16 MiB over what it held before the declaration
#
# Exit status 0 when the row passed.
set -u -o pipefail

row=$1
build=$2
OP=2000
server_bin=$build/server/psagg-server
worker_bin=$build/tests/functional/fn_worker
rogue_bin=$build/tests/fault/rogue_worker
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${3:-}"

failed=0
say() { echo "fault_matrix $row: $*"; }
bad() {
    echo "fault_matrix $row: FAIL: $*" >&2
    failed=1
}
now_ms() { date +%s%3N; }

# config: servers workers [SECTION.KEY=VALUE...]
config() {
    job_ini "$tmp/job.ini" "$1" "$2" cluster.job_id="fault-$row-$port" \
        cluster.connect_timeout_ms="${CONNECT_MS:-20000}" cluster.op_timeout_ms=$OP server.threads=2 "${@:3}" \
        worker.chunk_bytes=4096 log.level=warn
    export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=$2
}

start_server() { # rank
    spawn "$tmp/server$1.log" "$server_bin" --config "$tmp/job.ini" --rank "$1"
    spid[$1]=$h_pid
}

start_fn_worker() { # rank, fn_worker args...
    start_worker "$1" "$tmp/worker$1.log" "$worker_bin" "${@:2}"
}

# expect_worker RANK FAULT_MS: it exited 0 after reporting the expected error within 2 x OP
# (3 x OP in a sanitizer build, whose processes run several times slower: the ASan preset sets
# ASAN_OPTIONS; the message is the same, only its timing is not the product's)
limit=$((2 * OP))
[[ -n ${ASAN_OPTIONS:-} ]] && limit=$((3 * OP))
expect_worker() {
    local r=$1 t0=$2 rc took
    wait_for "${wpid[$r]}" 30
    rc=$?
    took=$(($(now_ms) - t0))
    sed "s/^/[worker $r] /" "$tmp/worker$r.log"
    if ((rc == 124)); then
        bad "worker $r still runs 30 s after the fault: a hang"
    elif ((rc != 0)) || ! grep -q EXPECTED-ERROR-OK "$tmp/worker$r.log"; then
        bad "worker $r exited $rc without the expected error"
    elif ((took > limit)); then
        bad "worker $r reported the fault $took ms after it, more than $limit ms (2 x op_timeout_ms${ASAN_OPTIONS:+, + 50% under ASan})"
    else
        say "worker $r: clear error $took ms after the fault"
    fi
}

# expect_success RANK WHY: the worker finished its job (exit 0); else WHY went wrong
expect_success() {
    local rc
    wait_for "${wpid[$1]}" 30
    rc=$?
    sed "s/^/[worker $1] /" "$tmp/worker$1.log"
    ((rc == 0)) || bad "worker $1 exited $rc: $2"
}

# expect_server RANK STATUS SECONDS
expect_server() {
    local rc
    wait_for "${spid[$1]}" "$3"
    rc=$?
    sed "s/^/[server $1] /" "$tmp/server$1.log"
    if ((rc == 124)); then
        bad "server $1 still runs $3 s later: a hang"
    elif ((rc != $2)); then
        bad "server $1 exited $rc, expected $2"
    else
        say "server $1 exited $rc as documented"
    fi
}

# wait until server 0 accepts control connections
wait_listening() {
    local t
    for ((t = 0; t < 100; t++)); do
        ss -ltnH "sport = :$port" 2>/dev/null | grep -q . && return 0
        sleep 0.05
    done
    bad "server 0 does not listen on port $port after 5 s"
}

# a job that keeps running push_pulls until the fault stops it
LONG=(--codec fp32 --sizes 1,1023,4096 --rounds 1000000 --max-seconds 60)

case $row in
worker_sigkill | worker_sigstop)
    config 2 3
    start_server 0
    start_server 1
    # killed: its connections drop at once (EPEER); stopped: the round deadline (ETIMEDOUT)
    sig=KILL status=EPEER text="worker 2"
    [ "$row" = worker_sigstop ] && sig=STOP status=ETIMEDOUT text="worker 2 sent nothing"
    for r in 0 1; do start_fn_worker $r "${LONG[@]}" --expect $status --expect-text "$text"; done
    start_fn_worker 2 "${LONG[@]}"
    sleep 2
    t0=$(now_ms)
    kill -$sig "${wpid[2]}"
    say "SIG$sig to worker 2"
    expect_worker 0 "$t0"
    expect_worker 1 "$t0"
    expect_server 0 1 10
    expect_server 1 1 10
    ;;
worker_stalled)
    # worker 2 stays alive (its library answers PINGs) but stops pushing for 10 s
    config 2 3
    start_server 0
    start_server 1
    text="no push from workers 2 within 1.5 x op_timeout_ms"
    for r in 0 1; do start_fn_worker $r "${LONG[@]}" --expect ETIMEDOUT --expect-text "$text"; done
    start_fn_worker 2 "${LONG[@]}" --die-rank 2 --die-round 300 --stall-seconds 10 \
        --expect ETIMEDOUT --expect-text "$text"
    for ((t = 0; t < 200; t++)); do
        grep -q "stalling" "$tmp/worker2.log" && break
        sleep 0.05
    done
    t0=$(now_ms)
    say "worker 2 stalls (alive, not pushing)"
    # its verdict is due 1.5 x OP after the round's first push
    expect_worker 0 "$t0"
    expect_worker 1 "$t0"
    expect_server 0 1 15
    expect_server 1 1 15
    ;;
server_sigkill | server_sigstop)
    config 2 2
    start_server 0
    start_server 1
    status=EPEER
    [ "$row" = server_sigstop ] && status=ETIMEDOUT
    for r in 0 1; do start_fn_worker $r "${LONG[@]}" --expect $status --expect-text "server 1"; done
    sleep 2
    sig=KILL
    [ "$row" = server_sigstop ] && sig=STOP
    t0=$(now_ms)
    kill -$sig "${spid[1]}"
    say "SIG$sig to server 1"
    expect_worker 0 "$t0"
    expect_worker 1 "$t0"
    expect_server 0 1 10
    ;;
spoofed_push)
    config 1 2
    start_server 0
    fport=""
    for ((t = 0; t < 100; t++)); do # the server's other listening port
        fport=$(ss -ltnpH 2>/dev/null | grep "pid=${spid[0]}," | awk '{print $4}' |
            sed 's/.*://' | grep -vx "$port" | head -1)
        [ -n "$fport" ] && break
        sleep 0.05
    done
    [ -n "$fport" ] || bad "could not find the server's fabric port"
    say "server 0's fabric endpoint listens on port $fport"
    start_fn_worker 0 --codec fp32 --rounds 300
    start_worker 9 "$tmp/spoof.log" "$rogue_bin" --mode spoof --fabric-port "$fport" --claim 1 --rounds 3 \
        --seconds 4
    rpid=$h_pid
    sleep 1.5
    start_fn_worker 1 --codec fp32 --rounds 300
    for r in 0 1; do expect_success "$r" "a spoofed push got into the sums"; done
    wait_for "$rpid" 30
    sed "s/^/[spoofer] /" "$tmp/spoof.log"
    grep -q "sent [1-9]" "$tmp/spoof.log" || bad "the spoofer sent nothing"
    d0=$(grep -o 'DIGEST [0-9a-f]*' "$tmp/worker0.log")
    d1=$(grep -o 'DIGEST [0-9a-f]*' "$tmp/worker1.log")
    [ -n "$d0" ] && [ "$d0" = "$d1" ] || bad "workers' digests differ: '$d0' '$d1'"
    expect_server 0 0 10
    dropped=$(grep "dropped .*none of this job's workers" "$tmp/server0.log" |
        sed -n 's/.* \([0-9]*\) in all)$/\1/p' | tail -1)
    say "the server dropped ${dropped:-no} spoofed pushes"
    ((${dropped:-0} >= 10)) || bad "the server did not log dropping the spoofed pushes"
    ;;
idle_500)
    CONNECT_MS=3000 config 1 2
    start_server 0
    wait_listening
    fds=()
    for ((i = 0; i < 500; i++)); do
        exec {fd}<>"/dev/tcp/127.0.0.1/$port" || { bad "connection $i failed"; break; }
        fds+=("$fd")
    done
    say "${#fds[@]} idle connections open; waiting past connect_timeout_ms=3000"
    sleep 4
    for ((i = 0; i < 100; i++)); do # more of them while the workers connect
        exec {fd}<>"/dev/tcp/127.0.0.1/$port" && fds+=("$fd")
    done &
    start_fn_worker 0 --codec maxmin4 --rounds 5
    start_fn_worker 1 --codec maxmin4 --rounds 5
    for r in 0 1; do expect_success "$r" "the idle connections kept the job from starting"; done
    for fd in "${fds[@]}"; do exec {fd}>&-; done
    expect_server 0 0 10
    grep -q "closed [0-9]* connection" "$tmp/server0.log" ||
        bad "the server did not say it closed the idle connections"
    ;;
declaration_bomb)
    config 1 1 server.memory_budget_mb=256
    # 1: 2^28 fp32 elements, about 4 GiB of server memory, over a budget of 256 MiB
    # (under ASan, LeakSanitizer's scan as the process exits would count in its peak RSS: off
    # for this one process, whose memory is what is measured here)
    spawn "$tmp/server0.log" ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        /usr/bin/time -f "peak RSS %M KiB" -o "$tmp/rss" "$server_bin" --config "$tmp/job.ini" --rank 0
    spid[0]=$h_pid
    wait_listening
    # what the server holds before any worker came (libfabric's own buffers are most of it)
    base=$(awk '/^VmHWM:/ {print $2}' "/proc/$(pgrep -P "${spid[0]}" | head -1)/status")
    PSAGG_RANK=0 timeout 30 "$rogue_bin" --mode bomb --count 268435456 >"$tmp/bomb.log" 2>&1
    rc=$?
    cat "$tmp/bomb.log"
    ((rc == 0)) || bad "the first bomb was not refused (rogue exited $rc)"
    grep -q "ROGUE-REFUSED:.*tensor 0 'bomb'.*MiB" "$tmp/bomb.log" ||
        bad "the refusal does not name the tensor and the bytes"
    expect_server 0 1 10
    rss=$(sed -n 's/^peak RSS \([0-9]*\) KiB$/\1/p' "$tmp/rss")
    say "server peak RSS ${rss:-?} KiB, ${base:-?} KiB before the declaration came"
    ((${rss:-999999} < ${base:-0} + 16384)) ||
        bad "the declaration grew the server by more than 16 MiB"
    # 2: 2^26 elements in 64-element chunks (a million chunks)
    start_server 0
    PSAGG_RANK=0 timeout 30 "$rogue_bin" --mode bomb --count 67108864 --chunk-elems 64 \
        >"$tmp/bomb.log" 2>&1
    rc=$?
    cat "$tmp/bomb.log"
    ((rc == 0)) && grep -q "ROGUE-REFUSED:.*chunk_elems" "$tmp/bomb.log" ||
        bad "64-element chunks were not refused naming chunk_elems"
    expect_server 0 1 10
    ;;
*)
    echo "fault_matrix: unknown row '$row'" >&2
    exit 2
    ;;
esac
if ((failed == 0)); then say "passed"; fi
exit $failed
