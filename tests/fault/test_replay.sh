#!/usr/bin/env bash
# test_replay.sh BUILD_DIR [PORT] - a recorded HELLO is worth nothing (runtime/auth.h).
#
# A job with a secret: two servers, two fn_workers; worker 0 reaches server 0 through
# rogue_worker --mode relay, a man in the middle of its control connection that records its
# HELLO. While the servers wait for worker 1, the recorded HELLO is replayed to server 0 on a new
# connection and to server 1: both must refuse it, naming a replay, and the job (worker 1 comes
# next) must finish with exact sums on both workers (nobody disturbed). Then server 0 is started
# again with the same job id and secret (a restarted job) and the HELLO replayed to it: refused.
set -u -o pipefail
build=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 4 "${2:-}" # the servers', and the relay's on the fourth
relay_port=$((port + 3))
head -c 64 /dev/urandom >"$tmp/secret"
chmod 600 "$tmp/secret"
ini() { # FILE SERVERS-LINE
    job_ini "$1" 2 2 cluster.job_id="replay-$port" cluster.servers="$2" cluster.secret_file="$tmp/secret" \
        cluster.connect_timeout_ms=20000 cluster.op_timeout_ms=60000 log.level=warn
}
ini "$tmp/job.ini" "127.0.0.1:$port 127.0.0.1:$((port + 1))"
ini "$tmp/via-relay.ini" "127.0.0.1:$relay_port 127.0.0.1:$((port + 1))"
export PSAGG_WORLD_SIZE=2
server_bin=$build/server/psagg-server
rogue=$build/tests/fault/rogue_worker
fail=0

start_servers "$tmp/job.ini" 2 "" PSAGG_CONFIG="$tmp/job.ini"
spawn "$tmp/relay.log" "$rogue" --mode relay --listen "$relay_port" --to-port "$port" --record "$tmp/hello.bin"
wait_until 10 grep -q "ROGUE-RELAY" "$tmp/relay.log"
args=(--rounds 6 --sizes 1,1023,4096)
start_worker 0 "$tmp/w0.log" PSAGG_CONFIG="$tmp/via-relay.ini" "$build/tests/functional/fn_worker" "${args[@]}"
w0=$h_pid
wait_until 10 test -s "$tmp/hello.bin"
[ -s "$tmp/hello.bin" ] || fail "the relay recorded no HELLO"
sleep 0.5 # worker 0 is in (welcomed by both servers); the servers wait for worker 1

replay() { # server rank, what
    local out
    out=$(PSAGG_CONFIG=$tmp/job.ini PSAGG_RANK=0 timeout 30 "$rogue" --mode replay --record "$tmp/hello.bin" --server "$1" 2>&1)
    local rc=$?
    echo "[$2] $out"
    if ((rc != 0)) || ! grep -q "ROGUE-REFUSED: .*authentication failed.*replay" <<<"$out"; then
        echo "test_replay: $2: the recorded HELLO was not refused as a replay (rogue exited $rc)" >&2
        fail=1
    fi
}
replay 0 "replayed to server 0, live"
replay 1 "relayed to server 1, live"
start_worker 1 "$tmp/w1.log" PSAGG_CONFIG="$tmp/job.ini" "$build/tests/functional/fn_worker" "${args[@]}"
w1=$h_pid

wait_for "$w0" 60
rc0=$?
wait_for "$w1" 60
rc1=$?
sed "s/^/[worker 0] /" "$tmp/w0.log"
sed "s/^/[worker 1] /" "$tmp/w1.log"
if ((rc0 != 0 || rc1 != 0)); then
    echo "test_replay: the job was disturbed: workers exited $rc0 and $rc1" >&2
    fail=1
fi
d0=$(sed -n 's/^DIGEST //p' "$tmp/w0.log")
d1=$(sed -n 's/^DIGEST //p' "$tmp/w1.log")
if [ -z "$d0" ] || [ "$d0" != "$d1" ]; then
    echo "test_replay: the workers' results differ ('$d0' vs '$d1')" >&2
    fail=1
fi
stop_all

# a restarted server 0 of the same job (same id, same secret)
spawn "$tmp/server0-again.log" "$server_bin" --config "$tmp/job.ini" --rank 0
replay 0 "replayed to server 0 restarted"
stop_all
for s in 0 1; do sed "s/^/[server $s] /" "$tmp/server$s.log"; done
((fail == 0)) && echo "test_replay: every replay refused, the job undisturbed"
exit $fail
