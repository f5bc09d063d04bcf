#!/usr/bin/env bash
# test_nonces.sh BUILD_DIR [PORT] - no two data messages of a job share a one-time key (ctest
# labels functional, regression). Every job here runs with a secret and data_auth, and every
# process lists each data message it seals ([log] mac_trace: a fingerprint of the key, the
# message's number, a hash of its bytes; runtime/auth.h, node.h). The one-time key of a
# message is derived from its key and its number, so the check is that no (key, number) pair
# is sealed twice in any of them, across:
#
#   optim    2 servers, 3 fn_optim workers, sgd with momentum and sync_interval 3, maxmin4:
#            parameter INIT, GRAD rounds, the sync_interval WEIGHTS, PULL and a sync PULL
#            (before protocol 13 a PULL's WEIGHTS and a sync_interval's WEIGHTS of one round
#            had equal headers, and so one one-time key)
#   resume   the same job asked for a checkpoint after step 4, killed after step 6 and
#            restarted with [server] resume = on (new sessions, the same rounds)
#   quorum   tests/functional/test_quorum.sh straggler (rounds closed without a straggler)
#   rejoin   tests/functional/test_elastic.sh rejoin (a worker killed and started again with
#            its rank: it joins the running job)
#
# It also checks that the lists are what they claim: every job's lists are non-empty, and
# each process's messages are numbered 1, 2, ... under each of its keys.
set -u -o pipefail
build=$1
here=$(dirname -- "${BASH_SOURCE[0]}")
# shellcheck source=tests/harness.sh
. "$here/../harness.sh"
reserve_ports 3 "${2:-}" # (and test_quorum.sh and test_elastic.sh below run on these)
fn=$build/tests/functional/fn_optim
macs=$tmp/macs
mkdir -p "$macs"
head -c 32 /dev/urandom >"$tmp/secret" && chmod 600 "$tmp/secret"

ini() { # ini NAME: a job file of 2 servers and 3 workers, sgd with momentum, sync_interval 3
    job_ini "$tmp/$1.ini" 2 3 cluster.job_id="nonces-$1-$port" cluster.connect_timeout_ms=20000 \
        cluster.op_timeout_ms=20000 cluster.secret_file="$tmp/secret" cluster.data_auth=on server.threads=2 \
        server.optimizer=sgd server.momentum=0.9 server.nesterov=on server.sync_interval=3 \
        server.checkpoint_dir="$tmp/ck" worker.chunk_bytes=16384 log.level=info log.mac_trace="$macs/$1"
    mkdir -p "$tmp/ck"
}
servers() { # servers NAME [ENV...]
    local name=$1
    shift
    stop_all
    start_servers "$tmp/$name.ini" 2 "$name-" "$@"
}
workers() { # workers NAME STEPS [ARGS...]
    local name=$1 steps=$2 w
    shift 2
    for w in 0 1 2; do
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
            FN_OPTIM_CODEC=maxmin4/512 "$fn" "$steps" "$@"
    done
}

# optim, then a checkpoint, a kill and a resume of the same job
ini optim
servers optim
workers optim 10
for w in 0 1 2; do wait_for "${wpid[$w]}" 120 || fail "optim: worker $w exited $?"; done
grep -q '^OPTIM-EXACT' "$tmp/optim-worker0.log" || fail "optim: not exact"
ini resume
servers resume
workers resume 10 --checkpoint-at 4 --stop-after 6
for ((t = 0; t < 600; t++)); do
    [ "$(grep -l '^STOPPED' "$tmp"/resume-worker*.log 2>/dev/null | wc -l)" = 3 ] && break
    sleep 0.1
done
grep -q '^CHECKPOINT after step 3' "$tmp/resume-worker0.log" || fail "resume: no checkpoint"
stop_all
servers resume PSAGG_SERVER_RESUME=on
workers resume 10 --resume
for w in 0 1 2; do wait_for "${wpid[$w]}" 120 || fail "resume: worker $w exited $?"; done
grep -q 'INIT from step 4' "$tmp/resume-worker0.log" || fail "resume: did not start at step 4"
stop_all

# the quorum and join cases of their own tests, with a secret, data_auth and the lists
PSAGG_CLUSTER_SECRET_FILE=$tmp/secret PSAGG_CLUSTER_DATA_AUTH=on PSAGG_LOG_MAC_TRACE=$macs/quorum \
    "$here/test_quorum.sh" straggler "$build" "$port" >"$tmp/quorum.out" 2>&1 ||
    { cat "$tmp/quorum.out"; fail "test_quorum.sh straggler failed with data_auth"; }
PSAGG_CLUSTER_SECRET_FILE=$tmp/secret PSAGG_CLUSTER_DATA_AUTH=on PSAGG_LOG_MAC_TRACE=$macs/rejoin \
    "$here/test_elastic.sh" rejoin "$build" "$port" >"$tmp/rejoin.out" 2>&1 ||
    { cat "$tmp/rejoin.out"; fail "test_elastic.sh rejoin failed with data_auth"; }

# the check: no (key, number) sealed twice; every process numbers 1, 2, ... under each key
for job in optim resume quorum rejoin; do
    n=$(cat "$macs/$job".* 2>/dev/null | wc -l)
    ((n > 100)) || fail "$job: only $n messages listed"
done
report=$(python3 - "$macs" <<'PY'
import collections, glob, os, sys
seen = collections.defaultdict(list)   # (key, number) -> [(file, bytes hash)]
keys, total, bad = set(), 0, []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*"))):
    numbers = collections.defaultdict(list)
    for line in open(path):
        key, seq, h = line.split()
        seen[(key, int(seq))].append((os.path.basename(path), h))
        numbers[key].append(int(seq))
        keys.add(key)
        total += 1
    for key, ns in numbers.items():
        if sorted(ns) != list(range(1, len(ns) + 1)):
            bad.append("%s: key %s numbered %s..., not 1, 2, ..." % (os.path.basename(path), key, sorted(ns)[:5]))
for (key, seq), uses in seen.items():
    if len(uses) > 1:
        bad.append("key %s number %d sealed %d times: %s" % (key, seq, len(uses), uses[:3]))
print("%d messages under %d keys in %d lists; %d problems" % (total, len(keys), len(glob.glob(os.path.join(sys.argv[1], "*"))), len(bad)))
for b in bad[:10]:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
) || fail "one-time keys reused: $report"
echo "test_nonces: passed: $report (INIT, GRAD, sync_interval WEIGHTS, PULL, resume, quorum, joins)"
