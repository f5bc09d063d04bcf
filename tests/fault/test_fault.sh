#!/usr/bin/env bash
# test_fault.sh BUILD_DIR [PORT] - bad frames and duplicates on the data path.
#
# For each bad push (magic, len, key, round, nan: a NaN in the payload) one server serves fn_worker (rank 0) and
# rogue_worker (rank 1): the server must close the rogue with a reason naming the field, fail
# fn_worker's pending push_pull with EPEER naming the rogue and the field (no hang), and exit
# on its own with status 1 (job failed) instead of crashing. With a duplicate push the round
# must complete with the exact sum and the server exit 0. The same for a forged same-host
# descriptor (closes the rogue) and a same-host offer of another pid or of a third process (not
# taken, job goes on). With data_auth, a push captured on its way to one server and sent to
# another, or sent twice, is dropped by name and nobody is closed (misdirect).
set -u -o pipefail
build=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${2:-}"
job_ini "$tmp/job.ini" 1 2 cluster.job_id="fault-$port" cluster.connect_timeout_ms=20000 \
    cluster.op_timeout_ms=30000 server.threads=2 log.level=warn
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=2

fail=0
run() { # mode, fn_worker args...
    local mode=$1
    shift
    spawn "$tmp/server.log" "$build/server/psagg-server" --config "$tmp/job.ini" --rank 0
    local s=$h_pid
    start_worker 0 "$tmp/w0.log" "$build/tests/functional/fn_worker" "$@"
    local w0=$h_pid
    start_worker 1 "$tmp/w1.log" "$build/tests/fault/rogue_worker" --mode "$mode"
    local w1=$h_pid
    wait_for "$w0" 40
    local rc0=$?
    wait_for "$w1" 40
    local rc1=$?
    wait_for "$s" 20
    local rcs=$?
    sed "s/^/[$mode worker 0] /" "$tmp/w0.log"
    sed "s/^/[$mode rogue] /" "$tmp/w1.log"
    sed "s/^/[$mode server] /" "$tmp/server.log"
    local want_server=1
    case $mode in dup | local-pid | local-third) want_server=0 ;; esac
    if ((rc0 != 0 || rc1 != 0 || rcs != want_server)); then
        echo "test_fault: $mode: fn_worker exited $rc0, rogue $rc1, server $rcs (want 0, 0, $want_server)" >&2
        fail=1
    else
        echo "test_fault: $mode: ok"
    fi
}
for mode in magic len key round nan; do
    field=$mode
    [ "$mode" = nan ] && field=payload
    run "$mode" --rounds 1 --expect EPEER --expect-text "$field" --max-seconds 30
done
# a topk push whose indices are not ascending (a hostile worker's sparse payload)
run topk-index --codec topk2:13/256 --rounds 1 --expect EPEER --expect-text index --max-seconds 30
run dup --rounds 1
# same-host copies: a descriptor of memory the worker does not have closes it by name; an offer
# of another process's pid is not taken, nor one naming a third process that holds the worker's
# fabric name at the offered address but not its secret; the job goes on
run local-desc --rounds 1 --expect EPEER --expect-text "same-host copy" --max-seconds 30
run local-pid --rounds 1
run local-third --rounds 1

# data_auth: a push sealed for server 0 sent to server 1 (captured and misdirected) and one
# sent twice (replayed) are dropped by name; nobody is closed and the sums stay exact
head -c 32 /dev/urandom >"$tmp/secret" && chmod 600 "$tmp/secret"
sed -e "s|^servers = .*|servers = 127.0.0.1:$port 127.0.0.1:$((port + 1))|" \
    -e "s|^workers = 2|workers = 2\nsecret_file = $tmp/secret\ndata_auth = on|" "$tmp/job.ini" >"$tmp/auth.ini"
start_servers "$tmp/auth.ini" 2
s0=${spid[0]} s1=${spid[1]}
start_worker 0 "$tmp/w0.log" PSAGG_CONFIG="$tmp/auth.ini" "$build/tests/functional/fn_worker" --rounds 1
w0=$h_pid
start_worker 1 "$tmp/w1.log" PSAGG_CONFIG="$tmp/auth.ini" "$build/tests/fault/rogue_worker" --mode misdirect
w1=$h_pid
wait_for "$w0" 40
rc0=$?
wait_for "$w1" 40
rc1=$?
wait_for "$s0" 20
rcs0=$?
wait_for "$s1" 20
rcs1=$?
for f in w0 w1 server0 server1; do sed "s/^/[misdirect $f] /" "$tmp/$f.log"; done
if ((rc0 || rc1 || rcs0 || rcs1)); then
    echo "test_fault: misdirect: fn_worker exited $rc0, rogue $rc1, servers $rcs0 $rcs1 (want 0)" >&2
    fail=1
elif ! grep -q "dropped a .* message from worker 1 whose MAC does not check out (forged, altered, or sealed for another receiver)" "$tmp/server1.log" ||
    ! grep -q "dropped a .* message from worker 1: a replay (its message number 1 came before" "$tmp/server0.log"; then
    echo "test_fault: misdirect: the misdirected push or the replay was not dropped by name" >&2
    fail=1
else
    echo "test_fault: misdirect: ok (a push sealed for server 0 dropped at server 1, a replay at server 0; nobody closed)"
fi
exit $fail
