#!/usr/bin/env bash
# test_optim.sh BUILD_DIR [PORT] - the server-side optimizer ([server] optimizer) end to end.
#
# 1. Exact: two servers, three fn_optim workers, for sgd (momentum, nesterov, sync_interval 3)
#    with maxmin4 deltas, adam with fp32, adamw with maxmin2, and sgd with and without momentum
#    with sparse topk2 deltas (and with worker error feedback that decays, SparseLoCo's beta):
#    every worker's weights equal
#    fn_optim's own reference of the servers' arithmetic bit for bit after every step, the
#    pulled master weights too, and all workers print the same DIGEST.
# 2. Checkpoint: an uninterrupted run's DIGEST; then a run whose worker 0 asks for a
#    checkpoint after step 4, killed (SIGKILL, every process) after step 6, restarted with
#    [server] resume = on: it goes on from step 4 and ends with the same DIGEST. The same with
#    [server] quorum, where every worker asks (a collective); one that asks alone is refused
#    after op_timeout_ms, naming the others.
# 3. Refusals: a truncated and a corrupted checkpoint stop the server at start-up, naming the
#    file; a checkpoint of another declaration fails the job ("nothing loaded"); workers that
#    send different learning rates fail the job ("the workers disagree"); a parameter declared
#    to servers without an optimizer is refused at psagg_declare, and so are an error-feedback
#    decay of 1.5 and maxmin1 with error feedback (it diverges); rogue_worker's malformed
#    parameter pushes (lr NaN, kind 3, a gradient before INIT) close it, naming the field.
set -u -o pipefail
build=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${2:-}"
fn=$build/tests/functional/fn_optim

ini() { # ini NAME KEY=VALUE...: a job file of 2 servers and 3 workers
    local name=$1
    shift
    job_ini "$tmp/$name.ini" 2 3 cluster.job_id="optim-$name-$port" cluster.connect_timeout_ms=20000 \
        cluster.op_timeout_ms=20000 server.threads=2 "${@/#/server.}" server.checkpoint_dir="$tmp/ck-$name" \
        worker.chunk_bytes=16384 log.level=info
    mkdir -p "$tmp/ck-$name"
}

servers() { # servers NAME [ENV...]: start both servers of job NAME (the last job's are gone)
    local name=$1
    shift
    stop_all
    start_servers "$tmp/$name.ini" 2 "$name-" "$@"
}

workers() { # workers NAME CODEC STEPS [ARGS...]: start three fn_optim workers (EF_BETA=B:
    # with worker error feedback decaying by B; DESC_V1=1: declared with the older desc)
    local name=$1 codec=$2 steps=$3 w
    shift 3
    for w in 0 1 2; do
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
            FN_OPTIM_CODEC="$codec" ${EF_BETA:+FN_OPTIM_EF_BETA=$EF_BETA} ${DESC_V1:+FN_OPTIM_DESC_V1=1} \
            "$fn" "$steps" "$@"
    done
}

digest=
finish() { # finish NAME: all workers succeed and agree; sets digest (not in a subshell: it waits)
    local name=$1 w
    for w in 0 1 2; do wait_for "${wpid[$w]}" 120 || fail "$name: worker $w exited $?"; done
    for w in 0 1 2; do grep -q '^OPTIM-EXACT' "$tmp/$name-worker$w.log" || fail "$name: worker $w printed no result"; done
    [ "$(grep -h '^DIGEST' "$tmp/$name"-worker*.log | sort -u | wc -l)" = 1 ] || fail "$name: the workers' weights differ"
    grep -h '^OPTIM-EXACT\|^DRIFT' "$tmp/$name-worker0.log"
    digest=$(grep -h '^DIGEST' "$tmp/$name-worker0.log")
}

# 1. exact, three optimizers
ini sgd optimizer=sgd momentum=0.9 nesterov=on sync_interval=3
servers sgd
workers sgd maxmin4/512 10
finish sgd
for i in 0 1; do wait_for "${spid[$i]}" 20 || fail "sgd: server $i exited $?"; done
grep -h 'optimizer sgd: ' "$tmp"/sgd-server*.log
grep -q 'optimizer sgd: [1-9][0-9]* chunk steps .* [1-9][0-9]* weight syncs' "$tmp/sgd-server0.log" ||
    fail "sgd: server 0's report counts no steps or no weight syncs"
ini adam optimizer=adam
servers adam
workers adam fp32 8
finish adam
grep -q 'DRIFT max |master - trained| = 0$' "$tmp/adam-worker0.log" || fail "adam: fp32 deltas left the weights off the master weights"
ini adamw optimizer=adamw weight_decay=0.05 beta2=0.99
servers adamw
workers adamw maxmin2/256 8
finish adamw

# 1b. sparse deltas (kernels/topk.h): SparseLoCo's outer step (sgd, no momentum) and DiLoCo's
# (nesterov momentum), the updates the top 5 % of each block of 1024 in 2 bits: exact as well
ini topk optimizer=sgd sync_interval=4
servers topk
# (declared with psagg.h's older psagg_tensor_desc, struct_size 56: the library still takes it)
DESC_V1=1 workers topk topk2:0.05/1024 10
finish topk
ini topkn optimizer=sgd momentum=0.9 nesterov=on
servers topkn
workers topkn topk2:0.05/1024 10
finish topkn
# SparseLoCo's worker error feedback: the residual decays by beta = 0.9 before each push
ini topkb optimizer=sgd
servers topkb
EF_BETA=0.9 workers topkb topk2:0.05/1024 10
finish topkb

# 2. kill after a checkpoint, resume, and end where the uninterrupted run ends
ini ref optimizer=adam
servers ref
workers ref maxmin4/512 10
finish ref
want=$digest
ini ck optimizer=adam
servers ck
workers ck maxmin4/512 10 --checkpoint-at 4 --stop-after 6
for ((t = 0; t < 600; t++)); do
    [ "$(grep -l '^STOPPED' "$tmp"/ck-worker*.log 2>/dev/null | wc -l)" = 3 ] && break
    for w in 0 1 2; do kill -0 "${wpid[$w]}" 2>/dev/null || fail "ck: worker $w exited before step 6"; done
    sleep 0.1
done
grep -q '^CHECKPOINT after step 3' "$tmp/ck-worker0.log" || fail "ck: no checkpoint"
for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
sleep 0.5
ls "$tmp/ck-ck"/psagg-server-{0,1}.ckpt >/dev/null || fail "ck: no checkpoint files"
cp -r "$tmp/ck-ck" "$tmp/ck-saved"
servers ck PSAGG_SERVER_RESUME=on
workers ck maxmin4/512 10 --resume
finish ck
got=$digest
grep -q 'INIT from step 4' "$tmp/ck-worker0.log" || fail "resume: the parameters did not start at step 4"
[ "$got" = "$want" ] || fail "resume: $got, the uninterrupted run $want"
echo "checkpoint after step 4, killed after step 6, resumed: $got = uninterrupted $want"

# 2b. the same with [server] quorum (its grace too long to leave anyone out, so the runs are
# comparable): the checkpoint is a collective, every worker asks at step 4, the servers write
# it once all have; the resumed run ends where the uninterrupted one does
ini qref optimizer=adam quorum=2 grace_ms=600000
servers qref
workers qref maxmin4/512 10
finish qref
want=$digest
ini qck optimizer=adam quorum=2 grace_ms=600000
servers qck
workers qck maxmin4/512 10 --checkpoint-at 4 --checkpoint-all --stop-after 6
for ((t = 0; t < 600; t++)); do
    [ "$(grep -l '^STOPPED' "$tmp"/qck-worker*.log 2>/dev/null | wc -l)" = 3 ] && break
    for w in 0 1 2; do kill -0 "${wpid[$w]}" 2>/dev/null || fail "qck: worker $w exited before step 6"; done
    sleep 0.1
done
(($(grep -l '^CHECKPOINT after step 3' "$tmp"/qck-worker*.log | wc -l) == 3)) || fail "qck: not every worker's checkpoint call returned"
stop_all
servers qck PSAGG_SERVER_RESUME=on
workers qck maxmin4/512 10 --resume
finish qck
[ "$digest" = "$want" ] || fail "quorum resume: $digest, the uninterrupted run $want"
echo "quorum: a collective checkpoint after step 4, killed after step 6, resumed: $digest = uninterrupted"
# and only worker 0 asks: the servers wait op_timeout_ms for the others (the rounds they go on with, 1.5 x), then say who
ini qone optimizer=adam quorum=2 grace_ms=600000
sed -i 's/^op_timeout_ms = .*/op_timeout_ms = 2000/' "$tmp/qone.ini"
servers qone
workers qone maxmin4/512 10 --checkpoint-at 2
wait_for "${wpid[0]}" 60
grep -q "psagg_checkpoint: .*every worker calls psagg_checkpoint at the same step.*workers 1,2 did not" "$tmp/qone-worker0.log" ||
    fail "qone: worker 0's lone checkpoint in a quorum job was not refused naming workers 1,2"
echo "quorum: a lone checkpoint refused: $(grep -o 'no checkpoint: .*did not' "$tmp/qone-worker0.log" | head -1)"
stop_all

# 3a. a torn and a corrupted checkpoint: the server refuses to start
refuse_start() { # refuse_start WHAT PATTERN
    spawn "$tmp/refuse.log" "$build/server/psagg-server" --config "$tmp/ck.ini" --rank 0
    wait_for $h_pid 20
    [ $? = 1 ] || fail "$1: the server did not exit 1"
    grep -q "$2" "$tmp/refuse.log" || fail "$1: the server's log does not say '$2'"
    grep -h 'ERROR' "$tmp/refuse.log" >&2
}
f0=$tmp/ck-ck/psagg-server-0.ckpt
cp "$tmp/ck-saved/psagg-server-0.ckpt" "$f0"
truncate -s -100 "$f0"
PSAGG_SERVER_RESUME=on refuse_start torn "checksum does not match.*nothing loaded"
cp "$tmp/ck-saved/psagg-server-0.ckpt" "$f0"
printf '\x55' | dd of="$f0" bs=1 seek=5000 conv=notrunc status=none
PSAGG_SERVER_RESUME=on refuse_start corrupted "checksum does not match"
truncate -s 50 "$f0"
PSAGG_SERVER_RESUME=on refuse_start short "less than a header"
rm -f "$f0"
PSAGG_SERVER_RESUME=on refuse_start missing "cannot be opened"

# 3b. a checkpoint of another declaration (maxmin4 then, maxmin2 now): the job fails
cp "$tmp/ck-saved"/* "$tmp/ck-ck/"
servers ck PSAGG_SERVER_RESUME=on
workers ck maxmin2/512 10 --resume
for w in 0 1 2; do wait_for "${wpid[$w]}" 60 && fail "mismatch: worker $w succeeded"; done
grep -q "nothing loaded" "$tmp/ck-worker0.log" || fail "mismatch: worker 0 was not told why"
grep -h 'FAIL' "$tmp/ck-worker0.log" >&2

# 3c. workers that disagree on the learning rate
ini lr optimizer=sgd
servers lr
for w in 0 1 2; do
    scale=1
    [ $w = 2 ] && scale=2
    start_worker $w "$tmp/lr-worker$w.log" PSAGG_CONFIG="$tmp/lr.ini" PSAGG_WORLD_SIZE=3 "$fn" 4 --lr-scale $scale
done
for w in 0 1 2; do wait_for "${wpid[$w]}" 60 && fail "lr: worker $w succeeded"; done
grep -q "the workers disagree" "$tmp/lr-worker0.log" || fail "lr: worker 0 was not told why"
grep -h 'FAIL' "$tmp/lr-worker0.log" >&2

# 3d. parameters, but the servers run no optimizer
ini none optimizer=none
servers none
workers none fp32 2
for w in 0 1 2; do wait_for "${wpid[$w]}" 60 && fail "none: worker $w succeeded"; done
# the first worker to declare says why; the others may find the servers gone already
grep -h "no optimizer" "$tmp"/none-worker*.log | head -1 | grep . >&2 || fail "none: no worker was told why"
# refused NAME CODEC EF_BETA TEXT: every worker's psagg_declare fails; one says TEXT (the first
# to declare says why; the others may find the servers gone already)
refused() {
    local name=$1 codec=$2 beta=$3 text=$4 w
    ini "$name" optimizer=sgd
    servers "$name"
    EF_BETA=$beta workers "$name" "$codec" 2
    for w in 0 1 2; do wait_for "${wpid[$w]}" 60 && fail "$name: worker $w succeeded"; done
    grep -h "$text" "$tmp/$name"-worker*.log | head -1 | grep . >&2 || fail "$name: no worker was told why"
}
# 3d'. an error-feedback decay outside 1e-6..1, and maxmin1 with error feedback (its residual
# grows every round): refused at psagg_declare, naming it
refused badbeta maxmin4 1.5 "error_feedback_beta 1.5 is not"
refused mm1 maxmin1 1 "maxmin1 with error feedback diverges"
# and maxmin1 sums with the servers' residual ([server] error_feedback, fn_worker's gradients;
# as in refused, the others may find the servers gone)
ini mm1s error_feedback=on
servers mm1s
for w in 0 1 2; do
    start_worker $w "$tmp/mm1s-worker$w.log" PSAGG_CONFIG="$tmp/mm1s.ini" PSAGG_WORLD_SIZE=3 \
        "$build/tests/functional/fn_worker" --codec maxmin1 --rounds 5
done
for w in 0 1 2; do wait_for "${wpid[$w]}" 60 && fail "mm1s: worker $w succeeded"; done
grep -h "maxmin1 with the servers' error feedback .*diverges" "$tmp"/mm1s-worker*.log | head -1 | grep . >&2 ||
    fail "mm1s: no worker was told why"
# 3e. a worker whose parameter pushes are malformed: closed, naming the field
job_ini "$tmp/rogue.ini" 1 1 cluster.job_id="optim-rogue-$port" cluster.connect_timeout_ms=20000 \
    cluster.op_timeout_ms=20000 server.optimizer=sgd worker.chunk_bytes=16384
for mode in param-lr param-kind param-early; do
    stop_all
    spawn "$tmp/rogue-server.log" "$build/server/psagg-server" --config "$tmp/rogue.ini" --rank 0
    PSAGG_CONFIG=$tmp/rogue.ini PSAGG_RANK=0 PSAGG_WORLD_SIZE=1 timeout 60 "$build/tests/fault/rogue_worker" --mode $mode \
        >"$tmp/rogue-$mode.log" 2>&1 || fail "$mode: the server did not close the rogue naming the field"
    grep -h 'server closed this worker' "$tmp/rogue-$mode.log" >&2
done
echo "PASS"
