#!/usr/bin/env bash
# test_launcher_restart.sh BUILD_DIR [PORT] - deploy/psagg-local --restarts with
# [cluster] server_replicas = 1 and real processes: psagg-server and fn_worker (3 workers, 2
# servers, fp32 sums checked bit for bit every round).
#
#   1. the job without a death: its DIGEST (the reference)
#   2. the same job under `psagg-local --restarts 1`, server 1 SIGKILLed once worker 0 is at
#      round 30: the launcher says it restarted it (same command line, so the same rank and
#      port), every worker takes it back ("server 1 is back in view N"), every worker exits 0
#      with the reference DIGEST, and the summary names the restart
#   3. server 1 SIGKILLed as soon as it runs, during the start-up: the launcher starts it again;
#      the workers declare to it again (or give it up and it rejoins): every worker exits 0 with
#      the reference DIGEST
# The launcher's rules themselves (what is restarted, what is not) are test_launcher.sh's, with
# fake servers; this is the launcher and psagg-server's rejoin together.
set -u -o pipefail
build=${1:?usage: test_launcher_restart.sh BUILD_DIR [PORT]}
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
reserve_ports 2 "${2:-}"
rounds=400
job_ini "$tmp/job.ini" 2 3 cluster.server_replicas=1 cluster.op_timeout_ms=3000 log.level=info
launch() { # LOG [LAUNCHER ARGS...]: the job under psagg-local, in the background ($h_pid)
    local log=$1
    shift
    spawn "$log" "$repo/deploy/psagg-local" --config "$tmp/job.ini" \
        --server-bin "$build/server/psagg-server" --timeout 150 "$@" -- \
        "$build/tests/functional/fn_worker" --codec fp32 --sizes 1,1023,4096,50000,7000 \
        --rounds $rounds --progress --round-sleep-ms 10
}
digest_of() { # LOG: every worker's DIGEST, which must be one
    local d
    d=$(grep -h '^\[worker [0-2]\] DIGEST' "$1" | sed 's/.*DIGEST //' | sort -u)
    (($(grep -c '^\[worker [0-2]\] DIGEST' "$1") == 3 && $(wc -l <<<"$d") == 1)) ||
        fail "$(basename -- "$1"): the workers' digests differ or are missing: $d"
    echo "$d"
}

# 1. the reference
launch "$tmp/ref.out"
wait_for "$h_pid" 150
rc=$?
((rc == 0)) || { cat "$tmp/ref.out" >&2; fail "reference: psagg-local exited $rc"; }
ref=$(digest_of "$tmp/ref.out")

# 2. server 1 killed, restarted by the launcher, back in the job
launch "$tmp/restart.out" --restarts 1
lp=$h_pid
wait_until 60 grep -q '^\[worker 0\] ROUND 30$' "$tmp/restart.out" ||
    { cat "$tmp/restart.out" >&2; fail "restart: worker 0 never reached round 30"; }
victim=$(pgrep -f -- "psagg-server --config $tmp/job.ini --rank 1$") ||
    fail "restart: no psagg-server of rank 1"
kill -KILL "$victim"
wait_for "$lp" 150
rc=$?
((rc == 0)) || { cat "$tmp/restart.out" >&2; fail "restart: psagg-local exited $rc"; }
addr=127.0.0.1:$((port + 1))
for line in "psagg-local: server 1 ($addr) died with status 137 (killed by SIGKILL): restarted (restart 1 of 1); it rejoins the running job" \
    "psagg-local: summary: ok, 1 restart(s) of --restarts 1" \
    "psagg-local:   server 1 ($addr): restarted 1 time(s) (--restarts), after status 137 (killed by SIGKILL)"; do
    grep -qxF -- "$line" "$tmp/restart.out" || { cat "$tmp/restart.out" >&2; fail "restart: no line '$line'"; }
done
(($(grep -c '^\[server 1\] .* serving job ' "$tmp/restart.out") == 2)) ||
    { cat "$tmp/restart.out" >&2; fail "restart: server 1 did not serve the job twice"; }
for w in 0 1 2; do
    grep -q "^\[worker $w\] .* server 1 is back in view [0-9]*$" "$tmp/restart.out" ||
        { cat "$tmp/restart.out" >&2; fail "restart: worker $w never took server 1 back"; }
done
d=$(digest_of "$tmp/restart.out")
[[ $d == "$ref" ]] || fail "restart: digest $d, the uninterrupted run's $ref"
# worker 0's clock: from its loss of server 1 to its READY again, and to the view that admits it
back=$(awk '/^\[worker 0\] .* lost server 1 / {l = $3} /^\[worker 0\] .* server 1 is back \(READY\)/ {r = $3}
    /^\[worker 0\] .* server 1 is back in view/ {v = $3}
    END {printf "READY %.0f ms, in the view %.0f ms", (r - l) * 1000, (v - l) * 1000}' "$tmp/restart.out")
echo "$h_name: server 1 SIGKILLed at round 30, restarted by psagg-local," \
    "$(grep -m1 -o 'server 1 is back in view [0-9]*' "$tmp/restart.out") (from worker 0's loss:" \
    "$back); every worker bit-identical to the uninterrupted run ($d)"

# 3. server 1 killed during the start-up, restarted by the launcher
launch "$tmp/startup.out" --restarts 1
lp=$h_pid
victim=
for ((i = 0; i < 400; i++)); do
    victim=$(pgrep -f -- "psagg-server --config $tmp/job.ini --rank 1$") && break
    sleep 0.01
done
[ -n "$victim" ] || fail "startup: no psagg-server of rank 1"
kill -KILL "$victim"
wait_for "$lp" 150
rc=$?
((rc == 0)) || { cat "$tmp/startup.out" >&2; fail "startup: psagg-local exited $rc"; }
grep -qxF -- "psagg-local: summary: ok, 1 restart(s) of --restarts 1" "$tmp/startup.out" ||
    { cat "$tmp/startup.out" >&2; fail "startup: the summary does not name the restart"; }
d=$(digest_of "$tmp/startup.out")
[[ $d == "$ref" ]] || fail "startup: digest $d, the uninterrupted run's $ref"
how="every worker declared to it again during the start-up"
grep -q "server 1 given up during the start-up" "$tmp/startup.out" &&
    how="the workers gave it up and it $(grep -m1 -o 'server 1 is back in view [0-9]*' "$tmp/startup.out")"
echo "$h_name: server 1 SIGKILLed during the start-up, restarted by psagg-local: $how; every worker" \
    "bit-identical to the uninterrupted run ($d)"
