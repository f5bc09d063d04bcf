#!/usr/bin/env bash
# test_server_signals.sh BUILD_DIR - psagg-server dies by the signal that kills it.
#
# Debian's libfabric links libinfinipath (the psm provider), whose constructor installs handlers
# for SIGSEGV, SIGBUS, SIGABRT and more that call exit(): a crashed server exited 1, as if it
# had failed a job, with no core, and a launcher said "exit code 1". psagg puts those handlers
# back to the default when the fabric opens (runtime/transport.c). A server waiting for its
# workers is sent SIGSEGV, then another SIGABRT: each must end killed by that signal (status
# 128 + N), and SIGTERM still stops one in order (its own handler: "stopping on signal").
set -u -o pipefail
build=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 1
job_ini "$tmp/job.ini" 1 2 log.level=info

for sig in SEGV ABRT TERM; do
    spawn "$tmp/server-$sig.log" "$build/server/psagg-server" --config "$tmp/job.ini" --rank 0
    p=$h_pid
    wait_until 20 grep -qs "serving job" "$tmp/server-$sig.log" || fail "the server never started"
    kill -"$sig" "$p"
    wait_for "$p" 10
    rc=$?
    want=$((128 + $(kill -l "$sig")))
    if [[ $sig == TERM ]]; then # (it exits 143 itself: stopped before its job ended)
        grep -q "stopping on signal" "$tmp/server-$sig.log" && ((rc != 124)) ||
            fail "SIGTERM: the server exited $rc without stopping in order (its handler lost?)"
    else
        ((rc == want)) || fail "SIG$sig: the server exited $rc, not $want (killed by the signal)"
    fi
    echo "SIG$sig: psagg-server exited $rc"
done
echo "test_server_signals: ok"
