#!/usr/bin/env bash
# test_torch.sh - PyTorch through psagg: worker/examples/train_digits.py (a small CNN on
# sklearn's digits) under deploy/psagg-local, 4 workers x 2 servers over tcp loopback.
#
# Usage: tests/functional/test_torch.sh BUILD_DIR CASE [PORT]   (2 servers on PORT, PORT+1; by default free ones)
#   ddp        DDP + psagg's hook (maxmin4) with an unused layer (find_unused_parameters=True,
#              several buckets, rebuilt after the first step) and the same run with Gloo fp32:
#              every rank ends with bit-identical weights; psagg's final loss is within 0.1 of
#              Gloo's and its test accuracy within 0.03
#   optimizer  psagg.torch.DistributedOptimizer, no DDP and no process group: identical
#              weights on every rank, loss and accuracy against the same Gloo DDP run
#   thc        ddp with codec thc2 (integer aggregation): the same checks against Gloo
#   server_down  server 0 SIGKILLed mid-training under the DDP hook, then server 1 SIGSTOPped
#              under the optimizer wrapper: every rank raises (exit 3 with psagg's message
#              naming the server) within op_timeout_ms (2000) of the fault
#   dtypes     tests/functional/torch_dtypes.py: a per-parameter codec dict, fp16 and bf16
#              gradients, float64 and wrong sizes refused, broadcast_parameters exact
#   server_optim  tests/functional/torch_server_optim.py: psagg.torch.ServerOptimizer with
#              [server] optimizer = sgd (momentum, nesterov), adam and adamw over fp32, with
#              its gradient hooks and through DDP's hook, 3 workers: every step's weights
#              within fp32 rounding of torch.optim's on the same gradients; then
#              tests/functional/torch_resume.py: a checkpoint after step 4 (ServerOptimizer.
#              checkpoint), the job stopped after step 6, the servers restarted with resume:
#              start_step 4 and the same final weights as an uninterrupted run
#   diloco     tests/functional/torch_diloco.py: psagg.torch.DiLoCo (outer SGD with Nesterov
#              momentum on the servers), fp32 outer gradients within fp32 rounding of a
#              single-process reference (plain, and streaming with 2 fragments, delay 1,
#              alpha 0.5; and weighted by samples), maxmin4 ones; anchors bit-identical on
#              every rank after every sync; a worker with other fragments refused on every rank;
#              then tests/functional/torch_diloco_resume.py: a checkpoint after an outer step,
#              the job stopped, the servers resumed: the uninterrupted run's weights bit for bit
#   diloco_resume_frag  torch_diloco_resume.py with 2 fragments (H=4) and the
#              checkpoint right after fragment 1 synced at step 6, each rank's own weights saved
#              beside it: the resumed job's start_step is 6 on every rank (not fragment 0's
#              round x H = 4) and it ends with the uninterrupted run's global weights bit for bit
#   diloco_schedule  Streaming DiLoCo's schedule (arXiv 2501.18512): fragment p
#              syncs at the steps t >= 1 with (t - p*H/P) mod H == 0, first at p*H/P when that is
#              > 0 (not p*H/P + H): torch_diloco.py with fp32 outer gradients, H=8, 4 fragments
#              (syncs applied at steps 2, 4, ..., 16) and 2 fragments with a delay of 1 (5, 9,
#              13): within rounding of the reference on that schedule, the weights moved by
#              DiLoCo.step() exactly at those steps; then MIX=1 (2 workers): a step() without
#              samples after steps with them, and one with samples after steps without, raise
#              ValueError naming samples on every rank (before: weight 0 pushed, EINVAL)
#   diloco_topk  the three above with sparse outer gradients (topk2:0.05/1024): torch_diloco.py
#              with 2 fragments, delay 1 and error_feedback_beta 0.95 (anchors bit-identical on
#              4 ranks after every sync), the resume with fragments and the admitted joiner
#   diloco_admit  tests/functional/torch_diloco_admit.py, an elastic
#              Streaming DiLoCo job (2 fragments, H=8, maxmin4; workers = 2, max_workers = 3)
#              checkpointed right after fragment 1's sync at step 12 and resumed; a rank 2
#              started by hand joins it: the members resume at step 12, and across the
#              admitting barrier each member's weights on the fragment that did not sync there
#              move only by its anchors' change (they keep its local progress); the joiner's
#              weights are the global weights, its start_step is the members' step and its
#              anchors theirs; all three end with the same anchors
#   elastic    [cluster] elastic = on: worker 2 SIGKILLs itself at step 20 of 500 (DiLoCo 1000) of
#              train_digits.py under ServerOptimizer (checkpoints every 5 steps: the death
#              comes as one is asked for), DistributedOptimizer and DiLoCo, and
#              psagg-local --restarts 1 starts it again: the three others re-shard to 3, the
#              restarted worker joins at a later step (JOINED), all four re-shard to 4 and end
#              with bit-identical weights (psagg-local exits 0); the DDP hook refuses an
#              elastic job on every rank. The survivors hold 40 steps (DiLoCo 80) before the
#              end until the restarted rank reached the running job (train_digits.py --hold):
#              its restart, torch's import included, never races the job's length
#              (server_failover also runs ServerOptimizer with elastic workers and replicas: a
#              rank killed, whose join is refused by name, a server killed and back; the
#              survivors' weights the same)
# Exit 0 passed, 1 failed, 77 skipped (Debian's /usr/bin/python3 lacks torch or sklearn).
set -u -o pipefail

build=${1:?usage: test_torch.sh BUILD_DIR CASE [PORT]} case=${2:?case}
py=/usr/bin/python3
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "test_torch: SKIP: $py cannot import torch and sklearn (python3-torch, python3-sklearn)"
    exit 77
fi
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
script=$repo/worker/examples/train_digits.py
reserve_ports 2 "${3:-}"
job_ini "$tmp/job.ini" 2 4 cluster.job_id="test-torch-$port" cluster.provider=tcp cluster.connect_timeout_ms=30000 \
    cluster.op_timeout_ms=2000 codec.default=maxmin4 codec.min_compress_elems=256 log.level=warn
unset PSAGG_CODEC_DEFAULT PSAGG_CODEC_MIN_COMPRESS_ELEMS PSAGG_CLUSTER_OP_TIMEOUT_MS MASTER_PORT
export PSAGG_SERVER_BIN=$build/server/psagg-server

# run NAME ARGS...: train; output in $tmp/NAME.out, exit status in $tmp/NAME.rc
# release_on OUT TEXT GO: in the background, GO is touched once OUT shows TEXT (the release of
# train_digits.py --hold STEP:GO); release_stop ends that watcher once the job is over
release_on() { (wait_until 120 grep -qs "$2" "$1" && touch "$3") & go_pid=$!; }
release_stop() { kill "$go_pid" 2>/dev/null; wait "$go_pid" 2>/dev/null; }

run() {
    local name=$1
    shift
    "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 240 -- \
        "$py" "$script" "$@" >"$tmp/$name.out" 2>&1
    echo $? >"$tmp/$name.rc"
}
# check_ok NAME: exit 0, four equal PARAMS lines; prints "loss acc"
check_ok() {
    local name=$1 rc hashes
    rc=$(cat "$tmp/$name.rc")
    [[ $rc == 0 ]] || { tail -n 30 "$tmp/$name.out" >&2; fail "$name: psagg-local exited $rc"; }
    hashes=$(grep -o 'PARAMS rank=[0-9] sha256=[0-9a-f]*' "$tmp/$name.out" | awk '{print $3}' | sort | uniq -c)
    [[ $(wc -l <<<"$hashes") == 1 && $(awk '{print $1}' <<<"$hashes") == 4 ]] ||
        fail "$name: the ranks' weights differ: $hashes"
    grep -o 'final_loss=[0-9.]* test_acc=[0-9.]*' "$tmp/$name.out" | sed 's/[a-z_]*=//g'
}
# compare NAME LOSS ACC REF_LOSS REF_ACC
compare() {
    awk -v n="$1" -v l="$2" -v a="$3" -v rl="$4" -v ra="$5" 'BEGIN {
        d = l - rl; if (d < 0) d = -d
        printf "test_torch: %s final loss %.4f acc %.4f; gloo %.4f acc %.4f\n", n, l, a, rl, ra
        exit !(d <= 0.1 && a >= ra - 0.03)
    }' || fail "$1: loss or accuracy outside the tolerance of Gloo's"
}

steps=200
# resume_check NAME SCRIPT SERVER_KEYS HASH_TAG AT: run SCRIPT (tests/functional) in PHASE full,
# first (a checkpoint after AT steps, then stopped) and resume ([server] resume = on), 3 workers
# with [server] SERVER_KEYS (printf text) and a checkpoint_dir; every rank of the resumed run
# must print the uninterrupted run's "HASH_TAG phase=... sha256=..."
resume_check() {
    local name=$1 script=$2 keys=$3 tag=$4 at=$5 phase full resumed
    mkdir -p "$tmp/ck-$name"
    {
        sed -e "s/^job_id = .*/job_id = test-$name-$port/" "$tmp/job.ini"
        printf "[server]\n$keys\ncheckpoint_dir = %s\n" "$tmp/ck-$name"
    } >"$tmp/$name.ini"
    for phase in full first resume; do
        env_resume=()
        [[ $phase == resume ]] && env_resume=(PSAGG_SERVER_RESUME=on)
        env ${env_resume[@]+"${env_resume[@]}"} PHASE=$phase "$repo/deploy/psagg-local" --config "$tmp/$name.ini" \
            --workers 3 --timeout 120 -- "$py" "$repo/tests/functional/$script" >"$tmp/$name-$phase.out" 2>&1 ||
            { tail -n 30 "$tmp/$name-$phase.out" >&2; fail "$name: phase $phase: psagg-local exited $?"; }
    done
    grep -q "CHECKPOINT after $at steps" "$tmp/$name-first.out" || fail "$name: no checkpoint"
    full=$(grep -o "$tag phase=full rank=[0-9] start=0 sha256=[0-9a-f]*" "$tmp/$name-full.out" | awk '{print $5}' | sort | uniq -c)
    resumed=$(grep -o "$tag phase=resume rank=[0-9] start=$at sha256=[0-9a-f]*" "$tmp/$name-resume.out" | awk '{print $5}' | sort | uniq -c)
    [[ $(wc -l <<<"$full") == 1 && $(awk '{print $1}' <<<"$full") == 3 ]] || { cat "$tmp/$name-full.out" >&2; fail "$name: the full run's ranks differ: $full"; }
    [[ $(awk '{print $2}' <<<"$resumed") == $(awk '{print $2}' <<<"$full") && $(awk '{print $1}' <<<"$resumed") == 3 ]] ||
        { cat "$tmp/$name-resume.out" >&2; fail "$name: $resumed, the uninterrupted run $full"; }
    echo "test_torch: $name: resumed at step $at: $(awk '{print $2}' <<<"$resumed") = uninterrupted, on 3 ranks"
}

same_anchors() { # same_anchors WHAT OUT: torch_diloco.py passed on 4 ranks, with the same anchors
    local what=$1 out=$2 n distinct
    (($(grep -c 'DILOCO ok' "$out") == 4)) || { cat "$out" >&2; fail "$what: not every rank passed"; }
    n=$(grep -c 'DILOCO-DIGEST' "$out")
    distinct=$(sed -n 's/.*DILOCO-DIGEST \(step=[0-9]* [0-9a-f]*\).*/\1/p' "$out" | sort -u | wc -l)
    ((n > 0 && n == 4 * distinct)) || { grep DILOCO-DIGEST "$out" >&2; fail "$what: the ranks' anchors differ"; }
    echo "$what: $distinct syncs, anchors bit-identical on 4 ranks; $(grep -m1 -o 'DILOCO ok rank=0.*' "$out")"
}

admit_check() { # admit_check NAME: torch_diloco_admit.py's checkpoint, resume and join
    local name=$1 members joiner ends pj rc rcj
    mkdir -p "$tmp/ck-$name"
    {
        sed -e "s/^job_id = .*/job_id = test-$name-$port/" -e "s/^workers = .*/workers = 2/" "$tmp/job.ini"
        printf '[cluster]\nelastic = on\nmin_workers = 2\nmax_workers = 3\n'
        printf '[server]\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\ncheckpoint_dir = %s\n' "$tmp/ck-$name"
    } >"$tmp/$name.ini"
    PHASE=first "$repo/deploy/psagg-local" --config "$tmp/$name.ini" --timeout 120 -- \
        "$py" "$repo/tests/functional/torch_diloco_admit.py" >"$tmp/$name-first.out" 2>&1 ||
        { tail -n 30 "$tmp/$name-first.out" >&2; fail "$name: the first run failed"; }
    grep -q "CHECKPOINT after 12 steps" "$tmp/$name-first.out" || { cat "$tmp/$name-first.out" >&2; fail "$name: no checkpoint"; }
    # rank 2 first: until the job runs, the servers answer it "try again" (it says HELLO again)
    spawn "$tmp/$name-joiner.out" PSAGG_CLUSTER_CONNECT_TIMEOUT_MS=120000 PHASE=resume \
        PSAGG_CONFIG="$tmp/$name.ini" PSAGG_RANK=2 PSAGG_WORLD_SIZE=2 RANK=2 WORLD_SIZE=2 \
        PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$py" "$repo/tests/functional/torch_diloco_admit.py"
    pj=$h_pid
    PSAGG_SERVER_RESUME=on PHASE=resume "$repo/deploy/psagg-local" --config "$tmp/$name.ini" --timeout 180 -- \
        "$py" "$repo/tests/functional/torch_diloco_admit.py" >"$tmp/$name.out" 2>&1
    rc=$?
    wait $pj
    rcj=$?
    ((rc == 0 && rcj == 0)) || { tail -n 30 "$tmp/$name.out" "$tmp/$name-joiner.out" >&2; fail "$name: psagg-local exited $rc, the joiner $rcj"; }
    members=$(grep -o 'ADMIT member rank=[01] step=[0-9]* anchors=[0-9a-f]*' "$tmp/$name.out" | sed 's/rank=[01] //' | sort | uniq -c)
    joiner=$(grep -o 'ADMIT joiner step=[0-9]* anchors=[0-9a-f]*' "$tmp/$name-joiner.out" | sed 's/ADMIT joiner //')
    [[ $(wc -l <<<"$members") == 1 && $(awk '{print $1}' <<<"$members") == 2 ]] || { cat "$tmp/$name.out" >&2; fail "$name: the members' admission differs: $members"; }
    [[ -n $joiner && $(awk '{print $4, $5}' <<<"$members") == "$joiner" ]] ||
        fail "$name: the members admitted at '$(awk '{print $4, $5}' <<<"$members")', the joiner started at '$joiner'"
    ends=$( (grep -o 'ADMIT end rank=[01] anchors=[0-9a-f]*' "$tmp/$name.out"; grep -o 'ADMIT end rank=2 anchors=[0-9a-f]*' "$tmp/$name-joiner.out") | sed 's/.*anchors=//' | sort | uniq -c)
    [[ $(wc -l <<<"$ends") == 1 && $(awk '{print $1}' <<<"$ends") == 3 ]] || fail "$name: the three workers' final anchors differ: $ends"
    echo "$name: $(grep -m1 -o 'ADMIT member rank=0.*' "$tmp/$name.out"); joiner at $joiner; 3 equal final anchors"
}

case $case in
ddp | optimizer | thc)
    run gloo --comm gloo --unused --steps $steps
    read -r gl ga < <(check_ok gloo) || exit 1
    if [[ $case == ddp ]]; then
        run psagg --comm psagg --unused --steps $steps
    elif [[ $case == thc ]]; then # integer aggregation through the DDP hook (kernels/thc.h)
        run psagg --comm psagg --codec thc2 --unused --steps $steps
    else
        run psagg --comm psagg-opt --unused --steps $steps
    fi
    read -r pl pa < <(check_ok psagg) || exit 1
    compare "$case" "$pl" "$pa" "$gl" "$ga"
    # psagg really carried the gradients: bytes went through it, and 4-bit updates give other
    # weights than Gloo's fp32 all-reduce
    sent=$(grep -o 'psagg_bytes_sent=[0-9]*' "$tmp/psagg.out" | cut -d= -f2)
    ((${sent:-0} > 0)) || fail "$case: psagg sent no bytes"
    h() { grep -o 'PARAMS rank=0 sha256=[0-9a-f]*' "$tmp/$1.out" | cut -d= -f3; }
    [[ $(h psagg) != $(h gloo) ]] || fail "$case: psagg's weights equal Gloo's: the gradients did not go through psagg"
    ;;
server_down)
    for mode in "psagg KILL 0" "psagg-opt STOP 1"; do
        read -r comm sig srv <<<"$mode"
        out=$tmp/down-$comm.out
        # --keep-going: every rank must raise by itself, not be stopped by the launcher
        spawn "$out" "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 120 --keep-going -- \
            "$py" "$script" --comm "$comm" --steps 1000000
        launcher=$h_pid
        # until training runs (rank 0 prints step 50)
        wait_until 60 grep -q "step 50 loss" "$out" || { kill $launcher; cat "$out" >&2; fail "$comm: training never started"; }
        pid=$(pgrep -f -- "psagg-server --config $tmp/job.ini --rank $srv\$" | head -n 1)
        [[ -n $pid ]] || { kill $launcher; fail "$comm: server $srv not found"; }
        t_fault=$(date +%s.%N)
        kill -"$sig" "$pid"
        wait $launcher
        rc=$?
        [[ $rc == 1 ]] || { tail -n 20 "$out" >&2; fail "$comm: psagg-local exited $rc, expected 1"; }
        n=0
        while read -r r t msg; do
            awk -v t="$t" -v f="$t_fault" 'BEGIN { exit !(t - f <= 2.0 + 0.5) }' ||
                fail "$comm: rank $r raised $(awk -v t="$t" -v f="$t_fault" 'BEGIN{print t-f}') s after the fault"
            [[ $msg == *"server $srv"* ]] || fail "$comm: rank $r's error does not name server $srv: $msg"
            printf 'test_torch: %s, SIG%s server %s: rank %s raised after %.3f s: %s\n' "$comm" "$sig" \
                "$srv" "$r" "$(awk -v t="$t" -v f="$t_fault" 'BEGIN{print t-f}')" "${msg:0:160}"
            n=$((n + 1))
        done < <(sed -n 's/^\[worker [0-9]*\] train_digits: rank \([0-9]*\) failed at \([0-9.]*\): \(.*\)$/\1 \2 \3/p' "$out")
        ((n == 4)) || { tail -n 30 "$out" >&2; fail "$comm: $n of 4 ranks raised"; }
    done
    ;;
dtypes)
    "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 120 -- \
        "$py" "$repo/tests/functional/torch_dtypes.py" >"$tmp/dtypes.out" 2>&1 ||
        { tail -n 30 "$tmp/dtypes.out" >&2; fail "dtypes: psagg-local exited $?"; }
    (($(grep -c 'DTYPES ok' "$tmp/dtypes.out") == 4)) || { cat "$tmp/dtypes.out" >&2; fail "dtypes: not every rank passed"; }
    ;;
server_optim)
    for opt in "sgd:momentum = 0.9:nesterov = on" "adam" "adamw"; do
        IFS=: read -r name k1 k2 <<<"$opt"
        for ddp in 0 1; do
            {
                sed -e 's/^default = maxmin4/default = fp32/' -e "s/^job_id = .*/job_id = test-so-$name-$ddp-$port/" "$tmp/job.ini"
                printf '[server]\noptimizer = %s\n%s\n%s\n' "$name" "$k1" "$k2"
            } >"$tmp/so.ini"
            TORCH_OPT=$name DDP=$ddp "$repo/deploy/psagg-local" --config "$tmp/so.ini" --workers 3 --timeout 120 -- \
                "$py" "$repo/tests/functional/torch_server_optim.py" >"$tmp/so.out" 2>&1 ||
                { tail -n 30 "$tmp/so.out" >&2; fail "server_optim $name ddp=$ddp: psagg-local exited $?"; }
            (($(grep -c 'SERVER-OPTIM ok' "$tmp/so.out") == 3)) || { cat "$tmp/so.out" >&2; fail "server_optim $name ddp=$ddp: not every rank passed"; }
            grep -m1 -o 'SERVER-OPTIM ok rank=0.*' "$tmp/so.out"
        done
    done
    # checkpoint, stop, resume: the same weights as without the interruption
    resume_check resume torch_resume.py "optimizer = adam" RESUME-HASH 4
    ;;
diloco)
    # psagg.torch.DiLoCo, 4 workers: fp32 outer gradients against the reference (plain, then
    # streaming: 2 fragments, a delay of 1 step, alpha 0.5), maxmin4 ones (with error feedback);
    # every rank's anchors bit-identical after every applied sync
    for v in "fp32:1:0:0.0:0" "fp32:2:1:0.5:0" "fp32:1:0:0.0:1" "maxmin4:1:0:0.0:0" "maxmin4:4:1:0.0:0"; do
        IFS=: read -r codec frags delay alpha weighted <<<"$v"
        {
            sed -e "s/^default = maxmin4/default = $codec/" -e "s/^job_id = .*/job_id = test-diloco-$frags-$delay-$port/" "$tmp/job.ini"
            printf '[server]\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\n'
        } >"$tmp/dl.ini"
        CODEC=$codec FRAGMENTS=$frags DELAY=$delay ALPHA=$alpha WEIGHTED=$weighted H=8 STEPS=40 \
            "$repo/deploy/psagg-local" --config "$tmp/dl.ini" --timeout 180 -- \
            "$py" "$repo/tests/functional/torch_diloco.py" >"$tmp/dl.out" 2>&1 ||
            { tail -n 30 "$tmp/dl.out" >&2; fail "diloco $v: psagg-local exited $?"; }
        same_anchors "diloco $v" "$tmp/dl.out"
    done
    # a worker whose fragments differ from the others': every rank fails, naming them
    {
        sed -e "s/^default = maxmin4/default = fp32/" -e "s/^job_id = .*/job_id = test-diloco-disagree-$port/" "$tmp/job.ini"
        printf '[server]\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\n'
    } >"$tmp/dl.ini"
    DISAGREE=1 H=8 STEPS=24 "$repo/deploy/psagg-local" --config "$tmp/dl.ini" --keep-going --timeout 120 -- \
        "$py" "$repo/tests/functional/torch_diloco.py" >"$tmp/dd.out" 2>&1
    (($(grep -c 'DILOCO disagreement caught' "$tmp/dd.out") == 4)) || { cat "$tmp/dd.out" >&2; fail "diloco: a disagreeing worker was not refused on every rank"; }
    echo "diloco disagreement: $(grep -m1 -o 'DILOCO disagreement caught rank=0.*' "$tmp/dd.out" | cut -c1-300)"
    # a worker killed while its fragment 0 push is in flight (2 fragments, delay 1: pushed at
    # step 8, applied at step 9): every other rank fails naming it, within 10 s (--keep-going:
    # psagg, not the launcher, must stop them)
    {
        sed -e "s/^job_id = .*/job_id = test-diloco-die-$port/" "$tmp/job.ini"
        printf '[server]\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\n'
    } >"$tmp/dl.ini"
    if DIE=9 FRAGMENTS=2 DELAY=1 H=8 STEPS=24 "$repo/deploy/psagg-local" --config "$tmp/dl.ini" --keep-going --timeout 120 -- \
        "$py" "$repo/tests/functional/torch_diloco.py" >"$tmp/ddie.out" 2>&1; then
        cat "$tmp/ddie.out" >&2
        fail "diloco: psagg-local exited 0 although a worker was killed"
    fi
    (($(grep -c 'DILOCO peer death caught' "$tmp/ddie.out") == 3)) || { cat "$tmp/ddie.out" >&2; fail "diloco: the survivors of a killed worker did not all fail naming it"; }
    echo "diloco worker killed: $(grep -m1 -o 'DILOCO peer death caught rank=0.*' "$tmp/ddie.out" | cut -c1-300)"
    # checkpoint after an outer step, stop, resume: the weights of the uninterrupted run
    resume_check diloco-resume torch_diloco_resume.py \
        "optimizer = sgd\nmomentum = 0.9\nnesterov = on" DILOCO-RESUME-HASH 8
    ;;
server_failover)
    kill_at() { # kill_at STEP SERVER OUT WHAT: SIGKILL the server (of ${ini:-fo}.ini) once OUT says step STEP
        wait_until 120 grep -q "step $1 loss" "$3" ||
            { kill $launcher; cat "$3" >&2; fail "$4: training never reached step $1"; }
        pid=$(pgrep -f -- "psagg-server --config $tmp/${ini:-fo}.ini --rank $2\$" | head -n 1)
        [[ -n $pid ]] || { kill $launcher; fail "$4: server $2 not found"; }
        kill -KILL "$pid"
    }
    ended_as() { # ended_as OUT REF WHAT: psagg-local exits 0, every rank's weights REF
        wait_for $launcher 240
        rc=$?
        [[ $rc == 0 ]] || { tail -n 30 "$1" >&2; fail "$3: psagg-local exited $rc after the death"; }
        got=$(grep -o 'PARAMS rank=[0-9] sha256=[0-9a-f]*' "$1" | sort)
        [[ $got == "$2" ]] || { tail -n 30 "$1" >&2; fail "$3: after the death the weights are $got; without it $2"; }
    }
    # [cluster] server_replicas = 1 (2 servers): server 1 (then server 0) SIGKILLed while
    # train_digits.py trains with the DDP hook (sum chunks: summed again by the other server),
    # ServerOptimizer and Streaming DiLoCo (parameter chunks: their copies take over with the
    # weights and the optimizer state); psagg-local goes on without it, every rank ends with
    # the weights of the same run without the death, bit for bit
    job_ini "$tmp/fo.ini" 2 4 cluster.job_id="test-failover-$port" cluster.provider=tcp \
        cluster.connect_timeout_ms=30000 cluster.op_timeout_ms=2000 cluster.server_replicas=1 \
        codec.default=maxmin4 codec.min_compress_elems=256 server.optimizer=sgd server.momentum=0.9 \
        server.nesterov=on log.level=warn
    for v in "psagg 1 --steps 400" "psagg-server 0 --steps 400" "psagg-server 1 --steps 400 --diloco 20 --fragments 2 --delay 1"; do
        read -r comm srv args <<<"$v"
        # shellcheck disable=SC2086 # (args: words)
        "$repo/deploy/psagg-local" --config "$tmp/fo.ini" --timeout 240 -- "$py" "$script" --comm "$comm" $args \
            >"$tmp/fo-ref.out" 2>&1 || { tail -n 30 "$tmp/fo-ref.out" >&2; fail "$v: the run without a death failed"; }
        # each rank's weights (DiLoCo's differ by rank: each keeps its local progress)
        ref=$(grep -o 'PARAMS rank=[0-9] sha256=[0-9a-f]*' "$tmp/fo-ref.out" | sort)
        [[ $(wc -l <<<"$ref") == 4 ]] || fail "$v: $(wc -l <<<"$ref") ranks of 4 printed their weights without a death"
        # shellcheck disable=SC2086
        spawn "$tmp/fo.out" "$repo/deploy/psagg-local" --config "$tmp/fo.ini" --timeout 240 -- "$py" "$script" \
            --comm "$comm" $args
        launcher=$h_pid
        kill_at 150 "$srv" "$tmp/fo.out" "$v"
        ended_as "$tmp/fo.out" "$ref" "$v"
        grep -q "server view 1:" "$tmp/fo.out" || fail "$v: no worker took server view 1"
        echo "test_torch: $v: server $srv SIGKILLed at step 150: every rank's weights bit-identical to its" \
            "own in the run without the death ($(head -c 40 <<<"$ref")...); $(grep -m1 -o 'server view 1: .*' "$tmp/fo.out")"
        [[ $comm == psagg-server && $args == "--steps 400" ]] && opt_ref=$ref
    done
    # ServerOptimizer under psagg-local --restarts 2: server 1 SIGKILLed at step 150 and started
    # again (it comes back with the state of its parameter chunks, STATE frames relayed by a
    # worker), then server 0 SIGKILLed at step 250: server 1 takes every chunk over with the state
    # it received, and server 0 comes back in turn; every rank bit-identical to the run without
    spawn "$tmp/fo-back.out" "$repo/deploy/psagg-local" --config "$tmp/fo.ini" --timeout 240 --restarts 2 -- \
        "$py" "$script" --comm psagg-server --steps 400
    launcher=$h_pid
    for step_srv in "150 1" "250 0"; do
        read -r step srv <<<"$step_srv"
        kill_at "$step" "$srv" "$tmp/fo-back.out" back
        [[ $srv == 1 ]] && { wait_until 60 grep -q "server 1 is back in view" "$tmp/fo-back.out" ||
            { kill $launcher; tail -n 30 "$tmp/fo-back.out" >&2; fail "back: server 1 never came back"; }; }
    done
    ended_as "$tmp/fo-back.out" "$opt_ref" back
    echo "test_torch: ServerOptimizer, server 1 SIGKILLed at step 150 and restarted (back with its" \
        "chunks' state), server 0 SIGKILLed at step 250: every rank's weights bit-identical;" \
        "$(grep -o 'summary: .*' "$tmp/fo-back.out" | head -1)"
    # elastic workers too (elastic = on): ServerOptimizer under psagg-local --restarts 2, server
    # 1 SIGKILLed at step 150 and started again (back with its chunks' state, which the copies
    # kept in step with the owners' contributors), then rank 2 SIGKILLs itself at step 250 and
    # its restart joins the running job: admitted by a view at the members' barrier, it takes
    # their tensors' rounds and pulls (the INIT and PULL rounds: the same optimizer step) and
    # must start at the step the members re-shard at; all four end with the same weights. 1000
    # steps: the restart's HELLO (a Python start and torch's import, seconds) must come while
    # the job runs, 750 steps after the death
    { cat "$tmp/fo.ini"; printf '[cluster]\nelastic = on\nmin_workers = 2\n'; } >"$tmp/fe.ini"
    spawn "$tmp/fe.out" "$repo/deploy/psagg-local" --config "$tmp/fe.ini" --timeout 240 --restarts 2 -- \
        "$py" "$script" --comm psagg-server --steps 1000 --die-at 250 --die-rank 2
    launcher=$h_pid
    ini=fe kill_at 150 1 "$tmp/fe.out" elastic
    wait_until 60 grep -q "server 1 is back in view" "$tmp/fe.out" ||
        { kill $launcher; tail -n 30 "$tmp/fe.out" >&2; fail "elastic: server 1 never came back"; }
    wait_for $launcher 240
    rc=$?
    [[ $rc == 0 ]] || { tail -n 30 "$tmp/fe.out" >&2; fail "elastic: psagg-local exited $rc"; }
    joined=$(grep -o 'JOINED rank 2 at step [0-9]*' "$tmp/fe.out") ||
        { tail -n 30 "$tmp/fe.out" >&2; fail "elastic: the restarted rank 2 did not join"; }
    # the members re-shard at the step the joiner starts at (rank 0's last membership change)
    at=$(grep -o 'rank 0: membership epoch [0-9]* at step [0-9]*' "$tmp/fe.out" | tail -n 1 | awk '{ print $NF }')
    [[ ${joined##* } == "$at" ]] ||
        { grep -E 'JOINED|membership epoch' "$tmp/fe.out" >&2; fail "elastic: $joined, rank 0's last membership change at step $at"; }
    n=$(grep -c '^\[worker [0-3]\] PARAMS' "$tmp/fe.out")
    distinct=$(grep '^\[worker [0-3]\] PARAMS' "$tmp/fe.out" | sed 's/.*sha256=//' | sort -u | wc -l)
    ((n == 4 && distinct == 1)) || { grep PARAMS "$tmp/fe.out" >&2; fail "elastic: the four ranks' weights differ"; }
    echo "test_torch: elastic ServerOptimizer, server 1 SIGKILLed at step 150 and back, rank 2 killed at" \
        "step 250, $joined (rank 0 re-shards at step $at): 4 identical weights;" \
        "$(grep -o 'RESULT.*test_acc=[0-9.]*' "$tmp/fe.out" | head -1)"
    ;;
diloco_resume_frag)
    mkdir -p "$tmp/local"
    export FRAGMENTS=2 CKPT_AT=6 LOCAL_DIR=$tmp/local
    resume_check diloco-resume-frag torch_diloco_resume.py \
        "optimizer = sgd\nmomentum = 0.9\nnesterov = on" DILOCO-RESUME-HASH 6
    unset FRAGMENTS CKPT_AT LOCAL_DIR
    ;;
diloco_schedule)
    for v in "4:0:2 4 6 8 10 12 14 16" "2:1:5 9 13"; do
        IFS=: read -r frags delay want <<<"$v"
        {
            sed -e "s/^default = maxmin4/default = fp32/" -e "s/^job_id = .*/job_id = test-dls-$frags-$port/" "$tmp/job.ini"
            printf '[server]\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\n'
        } >"$tmp/dl.ini"
        CODEC=fp32 FRAGMENTS=$frags DELAY=$delay H=8 STEPS=16 \
            "$repo/deploy/psagg-local" --config "$tmp/dl.ini" --timeout 120 -- \
            "$py" "$repo/tests/functional/torch_diloco.py" >"$tmp/dl.out" 2>&1 ||
            { tail -n 30 "$tmp/dl.out" >&2; fail "diloco_schedule $frags fragments, delay $delay: psagg-local failed"; }
        (($(grep -c 'DILOCO ok' "$tmp/dl.out") == 4)) || { cat "$tmp/dl.out" >&2; fail "diloco_schedule $frags fragments: not every rank passed"; }
        got=$(sed -n 's/^\[worker 0\] DILOCO-DIGEST step=\([0-9]*\) .*/\1/p' "$tmp/dl.out" | tr '\n' ' ' | sed 's/ $//')
        [[ $got == "$want" ]] || fail "diloco_schedule $frags fragments, delay $delay: syncs applied at steps '$got', Streaming DiLoCo's schedule applies them at '$want'"
        n=$(grep -c 'DILOCO-DIGEST' "$tmp/dl.out")
        distinct=$(sed -n 's/.*DILOCO-DIGEST \(step=[0-9]* [0-9a-f]*\).*/\1/p' "$tmp/dl.out" | sort -u | wc -l)
        ((n == 4 * distinct)) || { grep DILOCO-DIGEST "$tmp/dl.out" >&2; fail "diloco_schedule: the ranks' anchors differ"; }
        echo "diloco_schedule: $frags fragments, H=8, delay $delay: syncs applied at steps $got on 4 ranks, fp32 within rounding of the reference"
    done
    # a worker that mixes step(samples=...) and step(): refused at the call, on every rank
    MIX=1 H=4 STEPS=12 "$repo/deploy/psagg-local" --config "$tmp/dl.ini" --workers 2 --timeout 120 -- \
        "$py" "$repo/tests/functional/torch_diloco.py" >"$tmp/mix.out" 2>&1 ||
        { tail -n 30 "$tmp/mix.out" >&2; fail "diloco_schedule: mixed samples: psagg-local failed"; }
    (($(grep -c 'DILOCO mix refused' "$tmp/mix.out") == 2)) || { cat "$tmp/mix.out" >&2; fail "diloco_schedule: mixed samples were not refused on both ranks"; }
    grep -o 'DILOCO mix refused rank=[01].*' "$tmp/mix.out" | cut -c1-200
    ;;
diloco_admit)
    admit_check diloco_admit
    ;;
diloco_topk)
    # sparse outer gradients (topk2:0.05/1024, kernels/topk.h) through Streaming DiLoCo: 2
    # fragments, a delay of 1, SparseLoCo's decaying error feedback (beta 0.95), 4 ranks with
    # bit-identical anchors after every sync; a resume with fragments; an admitted joiner
    export CODEC=topk2:0.05/1024
    {
        sed -e "s/^job_id = .*/job_id = test-dltk-$port/" "$tmp/job.ini"
        printf '[server]\noptimizer = sgd\nmomentum = 0.9\nnesterov = on\n'
    } >"$tmp/dl.ini"
    EF_BETA=0.95 FRAGMENTS=2 DELAY=1 ALPHA=0 H=8 STEPS=40 "$repo/deploy/psagg-local" --config "$tmp/dl.ini" \
        --timeout 180 -- "$py" "$repo/tests/functional/torch_diloco.py" >"$tmp/dl.out" 2>&1 ||
        { tail -n 30 "$tmp/dl.out" >&2; fail "diloco_topk: psagg-local exited $?"; }
    same_anchors diloco_topk "$tmp/dl.out"
    mkdir -p "$tmp/local-topk"
    export FRAGMENTS=2 CKPT_AT=6 LOCAL_DIR=$tmp/local-topk
    resume_check diloco-topk-resume torch_diloco_resume.py \
        "optimizer = sgd\nmomentum = 0.9\nnesterov = on" DILOCO-RESUME-HASH 6
    unset FRAGMENTS CKPT_AT LOCAL_DIR
    admit_check diloco_topk_admit
    unset CODEC
    ;;
elastic)
    {
        sed -e "s/^job_id = .*/job_id = test-elastic-$port/" "$tmp/job.ini"
        printf '[cluster]\nelastic = on\nmin_workers = 2\n'
    } >"$tmp/el.ini"
    # (a second [cluster] section adds to the first: inih calls back per key)
    for comm in "psagg-server" "psagg-opt" "diloco"; do
        # (the survivors hold 40 steps before the end until the restarted rank 2 reached the
        # running job: its restart, torch's import included, must not race the job's length;
        # DiLoCo admits joiners at its outer steps only: 80 steps before its end, every 20)
        rm -f "$tmp/el-go"
        : >"$tmp/el.out" # (the watcher below must not read the last job's output)
        args=(--comm "$comm" --steps 500 --hold "460:$tmp/el-go")
        [ "$comm" = diloco ] && args=(--diloco 20 --outer-lr 0.5 --steps 1000 --hold "920:$tmp/el-go")
        release_on "$tmp/el.out" "worker 2 joins it" "$tmp/el-go"
        # (the servers checkpoint every 5 steps: the death comes while one is asked for)
        [ "$comm" = psagg-server ] && args+=(--checkpoint-every 5)
        mkdir -p "$tmp/ckpt"
        PSAGG_SERVER_CHECKPOINT_DIR=$tmp/ckpt \
            PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 PSAGG_SERVER_NESTEROV=on \
            "$repo/deploy/psagg-local" --config "$tmp/el.ini" --timeout 300 --restarts 1 -- \
            "$py" "$script" "${args[@]}" --die-at 20 --die-rank 2 >"$tmp/el.out" 2>&1 ||
            { tail -n 30 "$tmp/el.out" >&2; fail "elastic $comm: psagg-local exited $?"; }
        release_stop
        (($(grep -c 'membership epoch 1 at step' "$tmp/el.out") == 3)) || { cat "$tmp/el.out" >&2; fail "elastic $comm: not every survivor re-sharded"; }
        joined=$(grep -o 'JOINED rank 2 at step [0-9]*' "$tmp/el.out") || { cat "$tmp/el.out" >&2; fail "elastic $comm: the restarted worker 2 did not join"; }
        (($(grep -c 'membership epoch 2 at step' "$tmp/el.out") == 4)) || { cat "$tmp/el.out" >&2; fail "elastic $comm: not every worker re-sharded after the join"; }
        n=$(grep -c '^\[worker [0-3]\] PARAMS' "$tmp/el.out")
        distinct=$(grep '^\[worker [0-3]\] PARAMS' "$tmp/el.out" | sed 's/.*sha256=//' | sort -u | wc -l)
        ((n == 4 && distinct == 1)) || { grep PARAMS "$tmp/el.out" >&2; fail "elastic $comm: the four workers' weights differ"; }
        if [ "$comm" = psagg-server ]; then
            ls "$tmp"/ckpt/psagg-server-[01].ckpt >/dev/null 2>&1 || fail "elastic $comm: no checkpoint was written"
        fi
        echo "elastic $comm: worker 2 killed at step 20, $joined; 4 identical weights; $(grep -o 'RESULT.*test_acc=[0-9.]*' "$tmp/el.out")"
    done
    # the DDP hook: refused, on every rank, naming the reason
    "$repo/deploy/psagg-local" --config "$tmp/el.ini" --timeout 120 -- \
        "$py" "$script" --comm psagg --steps 5 >"$tmp/el.out" 2>&1 && fail "elastic: the DDP hook was accepted"
    (($(grep -c "the job is elastic" "$tmp/el.out") == 4)) || { cat "$tmp/el.out" >&2; fail "elastic: the DDP hook was not refused on every rank"; }
    echo "elastic: the DDP hook refused: $(grep -m1 -o 'register_ddp_hook: the job is elastic.\{0,80\}' "$tmp/el.out")"
    ;;
quorum)
    # [server] quorum: worker 3 sleeps 30 ms in every step; rounds close without it (grace
    # 5 ms) and it sends what was left out with its next push. The optimizer on the servers
    # (a parameter's GRAD rounds) and on the workers (sums): the four end with identical
    # weights, worker 3 was left out, and the model still learns.
    sed -e "s/^job_id = .*/job_id = test-quorum-$port/" "$tmp/job.ini" >"$tmp/q.ini"
    for comm in "psagg-server" "psagg-opt"; do
        PSAGG_SERVER_QUORUM=3 PSAGG_SERVER_GRACE_MS=5 \
            PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9 \
            "$repo/deploy/psagg-local" --config "$tmp/q.ini" --timeout 300 -- \
            "$py" "$script" --comm "$comm" --steps 300 --slow-rank 3 --slow-ms 30 >"$tmp/q.out" 2>&1 ||
            { tail -n 30 "$tmp/q.out" >&2; fail "quorum $comm: psagg-local exited $?"; }
        n=$(grep -c '^\[worker [0-3]\] PARAMS' "$tmp/q.out")
        distinct=$(grep '^\[worker [0-3]\] PARAMS' "$tmp/q.out" | sed 's/.*sha256=//' | sort -u | wc -l)
        ((n == 4 && distinct == 1)) || { grep PARAMS "$tmp/q.out" >&2; fail "quorum $comm: the four workers' weights differ"; }
        left=$(grep -o 'LEFTOUT rank=3 left_out=[0-9]*' "$tmp/q.out" | sed 's/.*=//')
        ((${left:-0} > 0)) || { grep -a 'LEFTOUT\|RESULT' "$tmp/q.out" >&2; fail "quorum $comm: worker 3 was never left out"; }
        acc=$(grep -o 'RESULT.*test_acc=[0-9.]*' "$tmp/q.out" | sed 's/.*test_acc=//')
        awk -v a="$acc" 'BEGIN{exit !(a >= 0.9)}' || fail "quorum $comm: test accuracy $acc"
        echo "quorum $comm: worker 3 left out of $left chunk rounds; 4 identical weights; test_acc=$acc"
    done
    ;;
grow)
    # workers = 3, max_workers = 4: psagg-local runs ranks 0..2 (ServerOptimizer), and a rank 3
    # the job never had, started by hand, joins it while it runs: the four re-shard to 4 and
    # finish with identical weights
    {
        sed -e "s/^job_id = .*/job_id = test-grow-$port/" -e "s/^workers = .*/workers = 3/" "$tmp/job.ini"
        printf '[cluster]\nelastic = on\nmin_workers = 2\nmax_workers = 4\n'
    } >"$tmp/grow.ini"
    export PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9
    # rank 3 first: until the job runs, the servers answer it "try again" (it says HELLO again,
    # for up to its connect_timeout_ms: the others' start-up may take long on busy cores)
    spawn "$tmp/grow3.out" PSAGG_CLUSTER_CONNECT_TIMEOUT_MS=120000 \
        PSAGG_CONFIG="$tmp/grow.ini" PSAGG_RANK=3 PSAGG_WORLD_SIZE=3 RANK=3 WORLD_SIZE=3 \
        PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$py" "$script" --comm psagg-server --steps 400
    p3=$h_pid
    # (ranks 0..2 hold 40 steps before the end until rank 3 reached the running job)
    release_on "$tmp/grow3.out" "worker 3 joins it" "$tmp/grow-go"
    "$repo/deploy/psagg-local" --config "$tmp/grow.ini" --timeout 300 -- \
        "$py" "$script" --comm psagg-server --steps 400 --hold "360:$tmp/grow-go" >"$tmp/grow.out" 2>&1
    rc=$?
    release_stop
    wait $p3
    rc3=$?
    unset PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM
    ((rc == 0 && rc3 == 0)) || { tail -n 20 "$tmp/grow.out" "$tmp/grow3.out" >&2; fail "grow: psagg-local exited $rc, rank 3 $rc3"; }
    joined=$(grep -o 'JOINED rank 3 at step [0-9]*' "$tmp/grow3.out") || { cat "$tmp/grow3.out" >&2; fail "grow: rank 3 did not join"; }
    (($(grep -c 'membership epoch 1 at step' "$tmp/grow.out") == 3)) || { cat "$tmp/grow.out" >&2; fail "grow: not every member re-sharded to 4"; }
    n=$( (grep '^\[worker [0-2]\] PARAMS' "$tmp/grow.out" | sed 's/.*sha256=//'; grep '^PARAMS' "$tmp/grow3.out" | sed 's/.*sha256=//') | sort | uniq -c)
    [[ $(wc -l <<<"$n") == 1 && $(awk '{print $1}' <<<"$n") == 4 ]] || { echo "$n" >&2; fail "grow: the four workers' weights differ"; }
    echo "grow: $joined (a rank beyond workers = 3); 4 identical weights; $(grep -o 'RESULT.*test_acc=[0-9.]*' "$tmp/grow.out")"
    ;;
*) fail "unknown case '$case'" ;;
esac
echo "test_torch: $case passed"
