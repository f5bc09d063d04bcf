#!/usr/bin/env bash
# test_train.sh - functional test of a real training job: psagg-train-digits (an MLP on the
# digits data set) through deploy/psagg-local with 1 server x 2 workers over tcp, maxmin4.
#
# Usage: tests/functional/test_train.sh BUILD_DIR [PORT]   (one server on PORT, by default a free one)
#
# Runs the same short training (3 epochs) twice and checks: every worker exits 0; the test
# accuracy is above a floor (0.85); in each run both workers print the same MODEL-HASH (they
# applied bit-identical updates); and both runs end with the same model (same inputs, seed
# and config give the same bytes). Exit 0 = passed, 1 = failed, 77 = skipped (the data set,
# from python3-sklearn, is not installed).
set -u -o pipefail

build=${1:?usage: test_train.sh BUILD_DIR [PORT]}
bin=$build/worker/examples/psagg-train-digits
server_bin=$build/server/psagg-server
floor=0.85

data=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
[[ -r $data ]] || data=$(dpkg -L python3-sklearn 2>/dev/null | grep '/datasets/data/digits\.csv\.gz$' | head -n 1)
if [[ -z $data || ! -r $data ]]; then
    echo "test_train: SKIP: digits.csv.gz (python3-sklearn) not found"
    exit 77
fi
for f in "$bin" "$server_bin"; do
    [[ -x $f ]] || { echo "test_train: FAIL: $f is not built" >&2; exit 1; }
done

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 1 "${2:-}"
job_ini "$tmp/job.ini" 1 2 cluster.job_id="test-train-$port" cluster.provider=tcp cluster.connect_timeout_ms=20000 \
    cluster.op_timeout_ms=60000 server.threads=2 codec.default=maxmin4 codec.min_compress_elems=256 log.level=warn
# the job's codec comes from the file above, not from the caller's environment
unset PSAGG_CODEC_DEFAULT PSAGG_CODEC_MIN_COMPRESS_ELEMS PSAGG_CODEC_BUCKET PSAGG_CODEC_ROUNDING \
    PSAGG_CODEC_ERROR_FEEDBACK PSAGG_WORKER_SEED

first=""
for run in 1 2; do
    log=$tmp/run$run.log
    "$h_repo/deploy/psagg-local" --config "$tmp/job.ini" --server-bin "$server_bin" --timeout 120 \
        -- "$bin" --data "$data" --epochs 3 >"$log" 2>&1
    rc=$?
    cat "$log"
    ((rc == 0)) || fail "run $run: the launcher exited $rc"
    acc=$(sed -n 's/^\[worker 0\] RESULT .*\btest_acc=\([0-9.]*\).*/\1/p' "$log")
    [[ -n $acc ]] || fail "run $run: no RESULT line from worker 0"
    awk -v a="$acc" -v f="$floor" 'BEGIN { exit !(a > f) }' ||
        fail "run $run: test accuracy $acc is not above $floor"
    n=$(grep -c '^\[worker [01]\] MODEL-HASH [0-9a-f]\{16\}$' "$log")
    hashes=$(sed -n 's/^\[worker [01]\] MODEL-HASH //p' "$log" | sort -u)
    if ((n != 2)) || [[ $(wc -l <<<"$hashes") -ne 1 ]]; then
        fail "run $run: expected one MODEL-HASH shared by 2 workers, got $n lines: $hashes"
    fi
    echo "test_train: run $run: test accuracy $acc > $floor; both workers' models identical ($hashes)"
    if [[ -z $first ]]; then
        first=$hashes
    elif [[ $hashes != "$first" ]]; then
        fail "run $run ended with model $hashes, run 1 with $first: not reproducible"
    fi
done
# DiLoCo (--diloco 6: local steps, the outer step on the servers every 6): both workers end
# with the same global weights, above the same floor
log=$tmp/diloco.log
PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 PSAGG_SERVER_NESTEROV=on \
    "$h_repo/deploy/psagg-local" --config "$tmp/job.ini" --server-bin "$server_bin" --timeout 120 \
    -- "$bin" --data "$data" --epochs 5 --diloco 6 >"$log" 2>&1
rc=$?
cat "$log"
((rc == 0)) || fail "diloco: the launcher exited $rc"
acc=$(sed -n 's/^\[worker 0\] RESULT .*\btest_acc=\([0-9.]*\).*/\1/p' "$log")
awk -v a="${acc:-0}" -v f="$floor" 'BEGIN { exit !(a > f) }' || fail "diloco: test accuracy '$acc' is not above $floor"
hashes=$(sed -n 's/^\[worker [01]\] MODEL-HASH //p' "$log" | sort -u)
(($(grep -c 'MODEL-HASH' "$log") == 2)) && [[ $(wc -l <<<"$hashes") -eq 1 ]] ||
    fail "diloco: the workers' global weights differ: $hashes"
echo "test_train: diloco: test accuracy $acc > $floor; both workers' global weights identical"
echo "test_train: ok (2 runs, same model; DiLoCo)"
exit 0
