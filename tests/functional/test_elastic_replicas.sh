#!/usr/bin/env bash
# test_elastic_replicas.sh BUILD_DIR [PART [PORT]] - elastic workers with server replicas ([cluster]
# elastic = on, server_replicas = 1; ctest labels `elastic` and `server_failover`): workers and
# servers die in one job, and every membership change is a server view.
#
# 3 servers, 4 fn_worker processes (fp32, tensors of 1 to 50,000 elements), 200 rounds 3 ms
# apart, op_timeout_ms = 3000. Worker 3 dies before its round-15 pushes, after its round 14 was
# whole everywhere, so that every survivor's outputs are the same in every run: each round up
# to 14 sums all four, each later round the three others (fn_worker --elastic-dead checks
# that); the survivors' DIGEST must then equal the reference run's, where only the worker dies:
#   ref        worker 3 SIGKILLed at round 15 (view 1 removes it)
#   then-s1    ... and server 1 SIGKILLed once worker 0 is at round 40 (view 2 moves its chunks)
#   then-s0    ... and server 0, the coordinator, at round 40 (server 1 decides view 2)
#   s0-first   server 0 SIGKILLed at round 8, worker 3 at 15: server 1 decides both views
#   together   worker 3 and server 1 at round 15 (one view, or two in a row)
#   stop       worker 3 SIGSTOPped at round 15 (given up after op_timeout_ms of silence)
# and, with no reference:
#   two        2 workers: worker 1 SIGKILLed; the view that removes it needs a majority of its
#              2 members, so worker 0 fails naming that, and so do the servers
#   join       (--sync) worker 3 killed at round 15 and started again: a view admits it
#   join-s1    ... server 1 SIGKILLed as the joiner starts; join-s0 the same of server 0
#   wait-s1    ... the members hold before round 60 while the joiner waits for its admission, and
#              server 1 is SIGKILLed then: the joiner gives it up and joins (no restart); wait-s0
#              the same of server 0, the coordinator (server 1, which has its JOIN too, admits it)
#   stop-s1    ... as wait-s1, SIGSTOPped instead (given up after op_timeout_ms of silence, by the
#              members and by the joiner); stop-s0 the same of server 0
#   join-back1 ... server 1 SIGKILLed, then restarted with the joiner, whose HELLO it has first
# and, with a server optimizer (fn_optim: four parameter tensors, sgd with momentum, maxmin4; every
# parameter chunk has a copy, which steps each round with the pushes its owner summed):
#   optim-still   no death: every worker's weights are the reference's (OPTIM-EXACT)
#   optim-die-D   worker 3 SIGKILLs itself D us into its step-20 push_pulls (D = 0, 400, 3000:
#                 before, among and after its sends to the copies and the owners), a view removes it
#   optim-s1-D    ... and server 1 SIGKILLed at step 40: its chunks' copies take them over
#   ef-s1         a server residual instead ([server] error_feedback, fn_worker with maxmin4 and
#                 error feedback: every chunk has a copy), worker 3 SIGKILLed once half of its
#                 round-15 tensors are pushed (midpush), server 1 SIGKILLed at round 40
# each with the servers' state digests of every chunk (log level debug) equal on owner and copy
# after every round (check_states), no copy stale, and the survivors' master weights the same.
# PART: leaves (ref up to two), joins (join*), optim, or all (the default); one ctest entry each.
set -u -o pipefail
build=$1 part=${2:-all}
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 3 "${3:-}"
case $part in all | leaves | joins | optim) ;; *) fail "PART is all, leaves, joins or optim, not '$part'" ;; esac
worker_bin=$build/tests/functional/fn_worker optim_bin=$build/tests/functional/fn_optim

# job NAME WORKERS [KILL_SERVER ROUND] [WORKER3_MODE] : one job; leaves rc[] and logs in $tmp
job() {
    local name=$1 n_w=$2 victim=${3:--1} round=${4:-0} mode=${5:-kill} w dead=$(($2 - 1))
    job_ini "$tmp/$name.ini" 3 "$n_w" cluster.job_id="er-$name-$port" cluster.elastic=on \
        cluster.min_workers=1 cluster.server_replicas=1 cluster.op_timeout_ms=3000 \
        worker.chunk_bytes=16384 log.level=info
    start_servers "$tmp/$name.ini" 3 "$name-"
    for ((w = 0; w < n_w; w++)); do
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE="$n_w" \
            "$worker_bin" --codec fp32 --sizes 1,1023,4096,50000,7000 --rounds 200 --round-sleep-ms 3 \
            --progress --elastic-dead $dead --die-rank $dead --die-round 15 --die-mode "$mode" \
            --left-epoch "${left_epoch:-1}" ${expect[@]+"${expect[@]}"}
    done
    if ((victim >= 0)); then
        wait_until 60 grep -qs "^ROUND $round\$" "$tmp/$name-worker0.log" ||
            fail "$name: worker 0 never reached round $round"
        kill -KILL "${spid[$victim]}"
    fi
    for ((w = 0; w < n_w; w++)); do
        if ((w == dead)); then
            [ "$mode" = stop ] && { sleep 5; kill -KILL "${wpid[$w]}" 2>/dev/null; }
            wait "${wpid[$w]}" 2>/dev/null
            continue
        fi
        wait_for "${wpid[$w]}" 90
        rc[w]=$?
    done
}

# wait_workers NAME RANK...: each of those workers exits 0 within 90 s, else fail showing its log
wait_workers() {
    local name=$1 w
    shift
    for w in "$@"; do
        wait_for "${wpid[$w]}" 90
        rc[w]=$?
        ((rc[w] == 0)) || { show_log "$tmp/$name-worker$w.log"; fail "$name: worker $w exited ${rc[w]}"; }
    done
}

# all_back_1: workers 0..2 of job $name took server 1 back
all_back_1() {
    local w
    for w in 0 1 2; do grep -qs "server 1 is back in view" "$tmp/$name-worker$w.log" || return 1; done
}

# survivors NAME VIEW: workers 0..2 exited 0 and took view VIEW; their one digest, in $digest
survivors() {
    local name=$1 view=$2 w d
    for w in 0 1 2; do
        ((rc[w] == 0)) || { show_log "$tmp/$name-worker$w.log"; fail "$name: worker $w exited ${rc[w]}"; }
        grep -q "server view $view:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view $view"
    done
    d=$(grep -h '^DIGEST' "$tmp/$name"-worker[012].log | sort -u)
    (($(wc -l <<<"$d") == 1)) && [ -n "$d" ] || fail "$name: the survivors' digests differ or are missing: $d"
    digest=${d#DIGEST }
}

if [ "$part" = all ] || [ "$part" = leaves ]; then
job ref 4
survivors ref 1
grep -q "membership in view 1: workers 3 left" "$tmp/ref-server0.log" ||
    fail "ref: server 0 did not remove worker 3 in view 1"
ref=$digest
stop_all
echo "ref: worker 3 left in view 1; digest $ref"

for c in "then-s1 1 40" "then-s0 0 40" "s0-first 0 8" "together 1 15"; do
    set -- $c
    left_epoch=1 view=2
    [ "$1" = s0-first ] && left_epoch=2
    [ "$1" = together ] && left_epoch=-1 view=1 # (one view for both, or one after the other)
    job "$1" 4 "$2" "$3"
    survivors "$1" $view
    [ "$digest" = "$ref" ] || fail "$1: digest $digest, the reference's $ref"
    echo "$1: server $2 SIGKILLed at round $3, worker 3 at 15: $(grep -h 'membership in view' "$tmp/$1"-worker0.log | head -1 | sed 's/^.*membership/membership/'); bit-identical"
    stop_all
done

job stop 4 -1 0 stop
survivors stop 1
[ "$digest" = "$ref" ] || fail "stop: digest $digest, the reference's $ref"
echo "stop: worker 3 SIGSTOPped at round 15, removed in view 1; bit-identical"
stop_all

expect=(--expect ETIMEDOUT --expect-text 'fewer than a majority')
job two 2
unset expect
grep -q "fewer than a majority" "$tmp/two-worker0.log" "$tmp/two-server0.log" ||
    { show_log "$tmp/two-worker0.log"; fail "two: nothing names the lost majority"; }
echo "two: $(grep -h 'fewer than a majority' "$tmp/two-server0.log" | head -1 | cut -c1-200)"
stop_all
fi
# joins: every worker passes a barrier (psagg_sync_membership) after each of 150 rounds, 20 ms
# apart; worker 3 is SIGKILLed at round 15 and started again: the view that admits it (and, for
# join-s1, server 1 SIGKILLed as the joiner starts; join-s0 the coordinator) - from then on
# every element is the exact sum of all four, the last 10 rounds bit-identical on all four
# join_job NAME OP_TIMEOUT_MS: the job of a join case (3 servers, 4 workers, fn_worker $args),
# once worker 3 died at round 15 and view 1 removed it; joiner NAME: worker 3 started again;
# same_tails NAME: every worker exited 0 with the same last 10 rounds
join_job() {
    local name=$1 w
    job_ini "$tmp/$name.ini" 3 4 cluster.job_id="er-$name-$port" cluster.elastic=on \
        cluster.min_workers=1 cluster.server_replicas=1 cluster.op_timeout_ms="$2" \
        cluster.connect_timeout_ms=4000 worker.chunk_bytes=16384 log.level=info
    start_servers "$tmp/$name.ini" 3 "$name-"
    for w in 0 1 2 3; do
        if ((w == 3)); then
            start_worker $w "$tmp/$name-first3.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=4 \
                "$worker_bin" "${args[@]}" --die-rank 3 --die-round 15 --die-mode kill
        else
            joiner "$name" $w
        fi
    done
    wait "${wpid[3]}" 2>/dev/null
    wait_until 30 grep -qs "membership in view 1" "$tmp/$name-worker0.log" || fail "$name: worker 3 never left"
}
joiner() { # (a member, W given, holds as $held says)
    local extra=()
    [ -n "${2:-}" ] && extra=("${held[@]}")
    start_worker "${2:-3}" "$tmp/$1-worker${2:-3}.log" PSAGG_CONFIG="$tmp/$1.ini" PSAGG_WORLD_SIZE=4 \
        "$worker_bin" "${args[@]}" "${extra[@]}" --elastic-dead 3 --rejoin --loose --left-epoch -1
}
same_tails() {
    local d
    wait_workers "$1" 0 1 2 3
    d=$(grep -h '^TAIL' "$tmp/$1"-worker[0123].log | sort -u)
    (($(wc -l <<<"$d") == 1)) && [ -n "$d" ] || fail "$1: the last rounds' digests differ: $d"
}
# wait-s1 and wait-s0: the members hold before round 60 (after barrier 59), so the joiner waits
# for its admission; server 1 (wait-s0: server 0, the coordinator) is SIGKILLed then (stop-*:
# SIGSTOPped), and the members go on: the joiner gives that server up and is admitted by the
# view after the one that removes it, with no restart (a joiner whose join a server's death cut
# short before its JOIN fails it, and a launcher starts it again)
held=()
[ "$part" = all ] || [ "$part" = joins ] && for c in "join -1" "join-s1 1" "join-s0 0" "wait-s1 1" \
    "wait-s0 0" "stop-s1 1" "stop-s0 0"; do
    set -- $c
    name=$1
    args=(--codec fp32 --sizes 1,1023,4096,50000,7000 --rounds 150 --sync --round-sleep-ms 20)
    case $name in wait-*) sig=KILL ;; stop-*) sig=STOP ;; *) sig="" ;; esac
    held=()
    [ -n "$sig" ] && held=(--hold "60:$tmp/$name-go")
    join_job "$name" 3000
    # (the joiner starts once every member holds: no barrier admits it before the signal)
    for w in ${sig:+0 1 2}; do
        wait_until 30 grep -qs "^HOLD before round 60" "$tmp/$name-worker$w.log" ||
            fail "$name: worker $w never held before round 60"
    done
    joiner "$name"
    if [ -n "$sig" ]; then
        wait_until 30 grep -qs "worker 3 asks to join" "$tmp/$name-server0.log" ||
            fail "$name: worker 3 did not ask server 0 to join"
        kill "-$sig" "${spid[$2]}"
        # (the view that moves its chunks away: the members take it while they hold)
        wait_until 30 grep -Eqs "server view [0-9]+: [1-9][0-9]* chunk" "$tmp/$name-worker0.log" ||
            fail "$name: no view removed server $2"
        touch "$tmp/$name-go"
        wait_for "${wpid[3]}" 90 || fail "$name: the joiner exited $? (its join must outlive server $2's loss)"
        r=$(grep -o 'joined at round [0-9]*' "$tmp/$name-worker3.log" | awk '{print $4}')
        ((${r:-0} >= 60)) || fail "$name: the joiner joined at round '$r', not after the members' hold"
    elif (($2 >= 0)); then
        sleep 0.3
        kill -KILL "${spid[$2]}"
    fi
    if ! wait_for "${wpid[3]}" 90; then
        grep -h "FAIL" "$tmp/$name-worker3.log" | head -2
        mv "$tmp/$name-worker3.log" "$tmp/$name-joiner-first.log"
        joiner "$name"
    fi
    same_tails "$name"
    echo "$name: $(grep -h 'joined the running job' "$tmp/$name-worker3.log" | sed 's/^.*INFO //;s/^.*WARN //')"
    stop_all
done

# join-back1: worker 3 killed at round 15 (view 1), server 1 killed (view 2); then, with the
# members SIGSTOPped (their HELLO_REJOIN to a restarted server comes every 500 ms), worker 3 is
# started again and server 1 too, so that the joiner's HELLO reaches the restarted server 1
# first (a joiner's HELLO says that the job starts); the members go on once server 1 has it.
# Server 1 must take the members' HELLO_REJOIN (the job runs) over the joiner's, forget the
# joiner and come back to the job; the joiner, told to try again, joins once server 1 runs it.
# Before, server 1 took the job for starting and refused the members until connect_timeout_ms;
# and the coordinator asked the joiner too to hold server 1's chunks (SERVER_BACK), which failed
# it (a joiner holds nothing: only members are asked now).
# op_timeout_ms = 6000: the members' silence while stopped (up to 2 s under ASan) stays below
# what an elastic job gives a worker (3 PING intervals, 3 s).
if [ "$part" = all ] || [ "$part" = joins ]; then
    name=join-back1
    args=(--codec fp32 --sizes 1,1023,4096,50000,7000 --rounds 3000 --sync --round-sleep-ms 20
        --progress --end-file "$tmp/$name.end")
    join_job "$name" 6000
    kill -KILL "${spid[1]}"
    for w in 0 1 2; do
        wait_until 30 grep -qs "server view 2:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view 2"
    done
    members=("${wpid[0]}" "${wpid[1]}" "${wpid[2]}")
    kill -STOP "${members[@]}"
    joiner "$name"
    spawn "$tmp/$name-server1b.log" "$build/server/psagg-server" --config "$tmp/$name.ini" --rank 1
    spid[1]=$h_pid
    wait_until 5 grep -qs "worker 3 connected" "$tmp/$name-server1b.log"
    first=$?
    kill -CONT "${members[@]}"
    ((first == 0)) || fail "$name: the joiner's HELLO did not reach the restarted server 1 first"
    wait_until 30 all_back_1 || fail "$name: not every member took server 1 back"
    wait_until 60 grep -qs "joined the running job" "$tmp/$name-worker3.log" ||
        { show_log "$tmp/$name-worker3.log"; fail "$name: worker 3 never joined"; }
    end_after "$tmp/$name.end" 40 "$tmp/$name-worker0.log"
    same_tails "$name"
    grep -q "worker 3 joins it once it runs here" "$tmp/$name-server1b.log" ||
        fail "$name: server 1 did not forget the joiner that came first"
    echo "$name: $(grep -h 'joins it once it runs here' "$tmp/$name-server1b.log" | head -1 | sed 's/^.*WARN //');" \
        "every member took server 1 back; $(grep -h 'joined the running job' "$tmp/$name-worker3.log" | sed 's/^.*WARN //')"
    stop_all
fi

# optim NAME [DIE_US [KILL_SERVER [back]]]: fn_optim, 80 steps (back: 200, and the server
# started again once the survivors took the view without it), worker 3 dying DIE_US into step 20
optim() {
    local name=$1 die=${2:-} victim=${3:-} back=${4:-} w n=0 d stale steps=80
    job_ini "$tmp/$name.ini" 3 4 cluster.job_id="er-$name-$port" cluster.elastic=on \
        cluster.min_workers=1 cluster.server_replicas=1 cluster.op_timeout_ms=3000 \
        server.optimizer=sgd server.momentum=0.9 worker.chunk_bytes=16384 log.level=debug
    start_servers "$tmp/$name.ini" 3 "$name-"
    for w in 0 1 2 3; do
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=4 \
            FN_OPTIM_CODEC=maxmin4/512 "$optim_bin" $([ -n "$back" ] && echo 600 || echo 80) \
            --step-sleep-ms 2 ${die:+--die 3 20 "$die"}
    done
    if [ -n "$victim" ]; then
        wait_until 60 grep -qs "^STEP 40\$" "$tmp/$name-worker0.log" || fail "$name: worker 0 never reached step 40"
        kill -KILL -- "-${spid[$victim]}"
    fi
    if [ -n "$back" ]; then
        wait_until 30 eval "[ \$(grep -l 'server view 2:' $tmp/$name-worker[0-2].log | wc -l) -eq 3 ]" ||
            fail "$name: not every survivor took view 2"
        spawn "$tmp/$name-server${victim}b.log" "$build/server/psagg-server" --config "$tmp/$name.ini" --rank "$victim"
    fi
    for w in 0 1 2 3; do
        if [ -n "$die" ] && ((w == 3)); then
            wait "${wpid[3]}" 2>/dev/null
            grep -q "^DYING at step 20" "$tmp/$name-worker3.log" || fail "$name: worker 3 did not die at step 20"
            continue
        fi
        wait_workers "$name" "$w"
        n=$((n + 1))
    done
    d=$(grep -h '^DIGEST' "$tmp/$name"-worker[0-3].log | sort -u)
    (($(wc -l <<<"$d") == 1)) && [ -n "$d" ] || fail "$name: the workers' master weights differ: $d"
    [ -n "$die" ] || (($(grep -l '^OPTIM-EXACT' "$tmp/$name"-worker[0-3].log | wc -l) == 4)) ||
        fail "$name: not every worker had the reference's weights"
    stale=$(grep -h "this copy is stale" "$tmp/$name"-server*.log | head -n 1)
    [ -z "$stale" ] || fail "$name: $stale"
    for w in 0 1 2; do
        [ -z "$back" ] || grep -q "server $victim is back in view" "$tmp/$name-worker$w.log" ||
            fail "$name: worker $w did not take server $victim back"
    done
    check_states "$([ -n "$victim" ] && echo 3 || echo 2)" "$tmp/$name"-server*.log
    echo "$name: $n workers ended with the same master weights;$copies$([ -n "$victim" ] && echo " server $victim killed at step 40: $(grep -c 'its copy here owns it from round' "$tmp/$name-server$(((victim + 1) % 3)).log") chunks taken over by their copies")$([ -n "$back" ] && echo "; server $victim back with their state: $(grep -c 'its copy here owns it from round' "$tmp/$name-server${victim}b.log") given back to it")"
    stop_all
}
# ef NAME: fn_worker with server error feedback, worker 3 dying midpush at 15, server 1 at 40
ef() {
    local name=$1 w d stale
    job_ini "$tmp/$name.ini" 3 4 cluster.job_id="er-$name-$port" cluster.elastic=on \
        cluster.min_workers=1 cluster.server_replicas=1 cluster.op_timeout_ms=3000 \
        server.error_feedback=on worker.chunk_bytes=16384 log.level=debug
    start_servers "$tmp/$name.ini" 3 "$name-"
    for w in 0 1 2 3; do
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=4 \
            "$worker_bin" --codec maxmin4 --error-feedback --sizes 1,1023,4096,50000,7000 \
            --rounds 120 --round-sleep-ms 3 --progress --elastic-dead 3 --die-rank 3 \
            --die-round 15 --die-mode midpush --left-epoch -1
    done
    wait_until 60 grep -qs "^ROUND 40\$" "$tmp/$name-worker0.log" || fail "$name: worker 0 never reached round 40"
    kill -KILL -- "-${spid[1]}"
    wait "${wpid[3]}" 2>/dev/null
    wait_workers "$name" 0 1 2
    survivors "$name" 2
    stale=$(grep -h "this copy is stale" "$tmp/$name"-server*.log | head -n 1)
    [ -z "$stale" ] || fail "$name: $stale"
    check_states 3 "$tmp/$name"-server*.log
    echo "$name: 3 workers ended with the same outputs;$copies server 1 killed at round 40"
    stop_all
}
if [ "$part" = all ] || [ "$part" = optim ]; then
    ef ef-s1
    optim optim-still
    for d in 0 400 3000; do
        optim "optim-die-$d" "$d"
        optim "optim-s1-$d" "$d" 1
    done
    optim optim-back 400 1 back
fi
echo "PASS"
