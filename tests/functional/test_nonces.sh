#!/usr/bin/env bash
# test_nonces.sh BUILD_DIR PORT - no two data messages of a job share a one-time key (ctest
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
port=$2
here=$(dirname -- "${BASH_SOURCE[0]}")
. "$here/jobs.sh"
fn=$build/tests/functional/fn_optim
macs=$tmp/macs
mkdir -p "$macs"
head -c 32 /dev/urandom >"$tmp/secret" && chmod 600 "$tmp/secret"

ini() { # ini NAME: a job file of 2 servers and 3 workers, sgd with momentum, sync_interval 3
    {
        printf '[cluster]\njob_id = nonces-%s-%s\nservers = 127.0.0.1:%d 127.0.0.1:%d\n' "$1" "$port" "$port" $((port + 1))
        printf 'workers = 3\nconnect_timeout_ms = 20000\nop_timeout_ms = 20000\nsecret_file = %s\n' "$tmp/secret"
        printf 'data_auth = on\n[server]\nthreads = 2\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\n'
        printf 'sync_interval = 3\ncheckpoint_dir = %s/ck\n[worker]\nchunk_bytes = 16384\n' "$tmp"
        printf '[log]\nlevel = info\nmac_trace = %s/%s\n' "$macs" "$1"
    } >"$tmp/$1.ini"
    mkdir -p "$tmp/ck"
}
servers() { # servers NAME [ENV...]
    local name=$1 i
    shift
    stop_all
    for i in 0 1; do
        env "$@" setsid "$build/server/psagg-server" --config "$tmp/$name.ini" --rank $i >"$tmp/$name-server$i.log" 2>&1 &
        pids+=($!)
    done
}
wpids=()
workers() { # workers NAME STEPS [ARGS...]
    local name=$1 steps=$2 w
    shift 2
    wpids=()
    for w in 0 1 2; do
        PSAGG_CONFIG=$tmp/$name.ini PSAGG_RANK=$w PSAGG_WORLD_SIZE=3 FN_OPTIM_CODEC=maxmin4/512 \
            setsid "$fn" "$steps" "$@" >"$tmp/$name-worker$w.log" 2>&1 &
        wpids+=($!)
        pids+=($!)
    done
}

# optim, then a checkpoint, a kill and a resume of the same job
ini optim
servers optim
workers optim 10
for w in 0 1 2; do wait_for "${wpids[$w]}" 120 || fail "optim: worker $w exited $?"; done
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
for w in 0 1 2; do wait_for "${wpids[$w]}" 120 || fail "resume: worker $w exited $?"; done
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
