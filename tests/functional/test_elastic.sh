#!/usr/bin/env bash
# test_elastic.sh CASE BUILD_DIR [PORT] - elastic membership ([cluster] elastic = on), ctest
# label `elastic`: "no bad time to kill a worker".
#
# 2 servers, 4 fn_worker processes (tensors of 1 to 50,000 elements, so that tensors span
# both servers and several chunks), op_timeout_ms = OP (4000: a PING every second). Worker 2
# dies at round 15 of 60 as CASE says; the three others must finish all 60 rounds (exit 0),
# each element the exact sum (fp32) with or without worker 2 until they learn of the new
# epoch and without it from then on (fn_worker --elastic-dead), bit-identical digests on the
# three, membership epoch 1 of 3 workers, no round longer than the bound below; both servers
# exit 0 and log the epoch.
#
#   kill        SIGKILL before its round-15 pushes
#   midpush     SIGKILL with half of its round-15 tensors pushed
#   afterpush   SIGKILL with all of them pushed, before any update (servers folding it)
#   ahead       afterpush, while the three others sleep 500 ms before their round-15 pushes:
#               worker 2's pushes of round 15 reach the servers before its death is known,
#               and the others start round 15 after they learned of the epoch (the round
#               sums worker 2 wherever its push came first, and the update says so)
#   exit        _exit(0) at round 15 (no BYE: a crash of the process)
#   stop        SIGSTOP (hung): the servers stop hearing it and give it up after 3 PING
#               intervals (3 s here), long before op_timeout_ms' round deadline (6 s)
#   stall       alive but not pushing (it sleeps 12 s at round 15; its library answers PINGs):
#               at the round deadline (1.5 x op_timeout_ms, 6 s) each server closes it
#               ("no push for ..."), the membership removes it and the three others go on
#               (before, the deadline failed the job); worker 2 wakes to that error, ETIMEDOUT
#   declare     SIGKILL during the job's start-up (connected, before its declaration): the
#               three others start the job without it (epoch 1 leaves it out)
#   mitm        a job with a secret; worker 1's control connection to server 1 goes through a
#               man in the middle without the keys (tests/fault/rogue_worker --mode mitm) who
#               injects toward server 1 a MEMBERSHIP removing worker 0, a BYE and a replay of
#               worker 1's latest frame, and toward worker 1 an ABORT: each is refused by name
#               (its tag does not check out), nobody leaves, and all four finish 150 rounds
#               with exact, bit-identical sums (before control frames carried tags, server 1
#               applied the forged epoch and the job failed)
#   bye         psagg_close at round 15 (BYE to every server, exit 0): it leaves the job, which
#               goes on without it (before, the rounds waited for it until their deadline)
#   startup_gap worker 2 (tests/fault/rogue_worker --mode hello-die) says HELLO to server 0
#               and dies before its HELLO to server 1, which never hears of it: server 1 must
#               start without it as server 0 does (server 0's READY names the starting workers
#               and they relay it), not fail the start-up at connect_timeout_ms
#   average     kill, PSAGG_AVERAGE: the rounds without it divide by 3
#   maxmin4     kill, 4-bit codec with server error feedback: within the codec's bound
#   below_min   min_workers = 4: the death ends the job; the three others fail naming
#               min_workers, the servers exit 1
#   rogue_server0  3 workers, worker 2 a rogue (tests/fault/rogue_worker) that sends server 0
#               a forged MEMBERSHIP frame: server 0 closes it ("decides the membership
#               itself") and the two others finish without it
#   rogue_nan   the rogue's push has a NaN in its payload: the server checks it before it
#               folds it (elastic), closes the rogue naming the payload, and the two others
#               finish without it (before, the chunk broke and the job failed 6 s later)
#   rogue_epoch the rogue sends 200 pushes stamped with epoch 1 while the job is at epoch 0
#               (parked for an epoch that never comes, they held every receive buffer): the
#               server closes it 1.5 x op_timeout_ms later naming the field epoch (or, when a
#               round's deadline comes first, as in case stall, naming its missing push); the
#               others finish without it
#   rogue_skip  the rogue relays a MEMBERSHIP frame of epoch 5 to server 1 (at epoch 0): the
#               job fails naming the skipped epoch, on every worker
#   rejoin      every worker calls psagg_sync_membership after each of 100 rounds (30 ms
#               apart); worker 2 is killed at round 15 and started again: it joins at the
#               members' next barrier (epoch 2), and from then on every element is the exact
#               sum of all four; the last 10 rounds' digests are identical on all four. A
#               second joiner with the rank of a live worker, and one with another
#               declaration, are refused by name while the job goes on.
#   join_dies   "no bad time to kill", during joins: after worker 2's death a joiner with its
#               rank is admitted and SIGKILLs itself 3 rounds later, a second one is SIGKILLed
#               by the harness as soon as it says it joins (waiting for its admission, or just
#               admitted), and a third joins for good: the members go on through every epoch,
#               and the last 10 of 150 rounds are the exact sum of all four, bit-identical
#   grow        workers = 3, max_workers = 4: ranks 0..2 start the job (--sync, 100 rounds), and
#               rank 3, which never was in it, joins while it runs: from the barrier that
#               admitted it every element is the exact sum of all four (epoch 1), the last 10
#               rounds bit-identical on all four. A rank 3 that comes before the job runs
#               waits for it; rank 4 (beyond max_workers) is refused by name
#   join_attacks  rejoin, in a job with a secret: after worker 2's death a rogue sends server
#               0 a replay of a joiner's HELLO (made for another connection's challenge) and
#               1000 HELLOs made with a wrong secret, each refused, while the members go on
#               (no round of theirs longer than 2 s); then worker 2 rejoins as in rejoin

# Bounds: kill/exit/midpush/afterpush rounds complete within 2 s of the death (detection is
# the closed connection); stop within 3 PING intervals + 2 s.
set -u -o pipefail

case=$1
build=$2
OP=4000
server_bin=$build/server/psagg-server
worker_bin=$build/tests/functional/fn_worker
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 3 "${3:-}" # the servers', and mitm's man in the middle on the third

say() { echo "test_elastic $case: $*"; }

min=2 mode=kill codec=fp32 extra=() lag=() server_ef=""
case $case in
kill | midpush | afterpush | exit | stop | declare) mode=$case ;;
stall) mode=stall ;;
ahead) mode=afterpush lag=(--lag-round 15 --lag-ms 500) ;;
bye) mode=close ;;
average) extra=(--average) ;;
maxmin4) codec=maxmin4 server_ef=on ;;
below_min) min=4 ;;
rogue_server0 | rogue_skip | rogue_nan | rogue_epoch | rejoin | join_attacks | join_dies | grow | startup_gap | mitm) ;;
*) fail "unknown case '$case'" ;;
esac
bound_ms=2000
[ "$mode" = stop ] && bound_ms=5000
[ "$mode" = stall ] && bound_ms=8000 # (the round deadline, 6 s, + 2 s)

job_ini "$tmp/job.ini" 2 4 cluster.job_id="elastic-$case-$port" cluster.elastic=on cluster.min_workers=$min \
    cluster.connect_timeout_ms=20000 cluster.op_timeout_ms=$OP server.threads=2 server.error_feedback=$server_ef \
    worker.chunk_bytes=16384 log.level=warn
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=4
# (the gap must not cost the start-up's whole deadline: a short one shows it)
[ "$case" = startup_gap ] && sed -i 's/^connect_timeout_ms = 20000/connect_timeout_ms = 8000/' "$tmp/job.ini"
if [[ $case == rogue_* ]]; then
    sed -i 's/^workers = 4/workers = 3/' "$tmp/job.ini"
    export PSAGG_WORLD_SIZE=3
    n_s=2
    if [[ $case == rogue_nan || $case == rogue_epoch ]]; then # (its pushes: one server's)
        n_s=1
        sed -i "s/^servers = .*/servers = 127.0.0.1:$port/" "$tmp/job.ini"
    fi
    start_servers "$tmp/job.ini" $n_s
    if [ "$case" = rogue_server0 ]; then
        expect=(--elastic-dead 2) server_rc=0 mode=membership-server0
    elif [ "$case" = rogue_nan ] || [ "$case" = rogue_epoch ]; then
        expect=(--elastic-dead 2) server_rc=0 mode=nan
        [ "$case" = rogue_epoch ] && mode=epoch-ahead
    else
        expect=(--expect EPROTO --expect-text "an epoch was skipped") server_rc=1 mode=membership-skip
    fi
    for r in 0 1; do
        start_worker $r "$tmp/worker$r.log" "$worker_bin" --codec fp32 --rounds 200 "${expect[@]}"
    done
    start_worker 2 "$tmp/rogue.log" "$build/tests/fault/rogue_worker" --mode "$mode"
    rpid=$h_pid
    wait_for "$rpid" 30
    rc=$?
    sed "s/^/[rogue] /" "$tmp/rogue.log"
    ((rc == 0)) || fail "the rogue exited $rc: its frame was not refused as expected"
    for r in 0 1; do
        wait_for "${wpid[$r]}" 60
        rc=$?
        sed "s/^/[worker $r] /" "$tmp/worker$r.log"
        ((rc == 0)) || fail "worker $r exited $rc"
    done
    for ((s = 0; s < n_s; s++)); do
        wait_for "${spid[$s]}" 20
        rc=$?
        sed "s/^/[server $s] /" "$tmp/server$s.log"
        ((rc == server_rc)) || fail "server $s exited $rc, expected $server_rc"
    done
    say "passed: $(grep -m1 ROGUE-REFUSED "$tmp/rogue.log")"
    exit 0
fi

if [ "$case" = mitm ]; then
    head -c 32 /dev/urandom >"$tmp/secret" && chmod 600 "$tmp/secret"
    printf '[cluster]\nsecret_file = %s\n' "$tmp/secret" >>"$tmp/job.ini"
    start_servers "$tmp/job.ini" 2
    spawn "$tmp/rogue.log" "$build/tests/fault/rogue_worker" --mode mitm --listen $((port + 2)) \
        --to-port $((port + 1)) --seconds 0.5 --claim 0
    for r in 0 1 2 3; do
        via=()
        ((r == 1)) && via=("PSAGG_CLUSTER_SERVERS=127.0.0.1:$port 127.0.0.1:$((port + 2))")
        start_worker $r "$tmp/worker$r.log" "${via[@]}" "$worker_bin" --codec fp32 \
            --sizes 1,1023,4096,50000,7000 --rounds 20000 --round-sleep-ms 2 --progress \
            --end-file "$tmp/end"
    done
    # the job runs until the rogue has injected its four frames (0.5 s after its READY: a job
    # of a fixed 150 rounds could end first on a fast machine), then 50 rounds more
    injected() { (($(grep -c 'ROGUE-MITM: injected\|ROGUE-MITM: replayed' "$tmp/rogue.log") >= 4)); }
    wait_until 30 injected ||
        fail "the man in the middle did not inject all four frames within 30 s"
    end_after "$tmp/end" 50 "$tmp/worker0.log"
    wait_all 60 worker wpid
    for s in 0 1; do
        wait_for "${spid[$s]}" 20
        rc=$?
        ((rc == 0)) || fail "server $s exited $rc"
        # (each worker leaves as it finishes: epochs of workers done, and none other)
        grep "membership epoch" "$tmp/server$s.log" | grep -v "it left the job (psagg_close)" &&
            fail "server $s changed the membership but for workers that were done"
    done
    sed "s/^/[rogue] /" "$tmp/rogue.log"
    (($(grep -c 'ROGUE-MITM: injected\|ROGUE-MITM: replayed' "$tmp/rogue.log") == 4)) ||
        fail "the man in the middle did not inject all four frames"
    (($(grep -h '^DIGEST' "$tmp"/worker*.log | sort -u | wc -l) == 1)) || fail "the workers' digests differ"
    for t in 12 6; do
        grep -q "worker 1: a control frame of type $t .*whose tag does not check out.*dropped" "$tmp/server1.log" ||
            fail "server 1 did not refuse the injected frame of type $t by name"
    done
    (($(grep -c "worker 1: a control frame of type .*whose tag does not check out" "$tmp/server1.log") == 3)) ||
        fail "server 1 did not refuse the replayed frame"
    grep -q "server 1 (.*): a control frame of type 7 .*whose tag does not check out.*dropped" "$tmp/worker1.log" ||
        fail "worker 1 did not refuse the injected ABORT by name"
    say "passed: 4 injected frames refused by name: $(grep -h 'whose tag does not check out' "$tmp/server1.log" "$tmp/worker1.log" | sed 's/^[0-9.]* //' | cut -c1-140 | tr '\n' '|')"
    exit 0
fi
if [ "$case" = grow ]; then
    sed -i 's/^workers = 4/workers = 3\nmax_workers = 4/' "$tmp/job.ini"
    export PSAGG_WORLD_SIZE=3
    # beyond max_workers: refused by name, before any connection
    PSAGG_RANK=4 "$worker_bin" --rounds 1 --expect EINVAL --expect-text "max_workers = 4" \
        >"$tmp/beyond.log" 2>&1 || { cat "$tmp/beyond.log"; fail "rank 4 of max_workers 4 was not refused"; }
fi
[[ $case == rejoin || $case == join_attacks || $case == join_dies || $case == grow ]] ||
    start_servers "$tmp/job.ini" 2
if [ "$case" = join_attacks ]; then
    head -c 32 /dev/urandom >"$tmp/secret" && chmod 600 "$tmp/secret"
    printf '[cluster]\nsecret_file = %s\n' "$tmp/secret" >>"$tmp/job.ini"
fi
[[ $case == rejoin || $case == join_attacks || $case == join_dies || $case == grow ]] &&
    start_servers "$tmp/job.ini" 2
# joined_job [EPOCH]: the 4 workers and both servers exit 0, the servers logged membership
# epoch EPOCH (when given), and the workers' digests of the last rounds (TAIL) are identical
joined_job() {
    local r s rc tails n
    for r in 0 1 2 3; do
        wait_for "${wpid[$r]}" 60
        rc=$?
        sed "s/^/[worker $r] /" "$tmp/worker$r.log"
        ((rc == 0)) || fail "worker $r exited $rc"
    done
    for s in 0 1; do
        wait_for "${spid[$s]}" 20
        rc=$?
        sed "s/^/[server $s] /" "$tmp/server$s.log"
        ((rc == 0)) || fail "server $s exited $rc, expected 0"
        [[ -z ${1:-} ]] || grep -q "membership epoch $1" "$tmp/server$s.log" ||
            fail "server $s did not log membership epoch $1"
    done
    tails=$(grep -h '^TAIL' "$tmp"/worker[0-3].log | awk '{print $2}' | sort -u | wc -l)
    n=$(grep -h '^TAIL' "$tmp"/worker[0-3].log | wc -l)
    ((n == 4 && tails == 1)) || fail "the last rounds' digests of the 4 workers differ ($n lines, $tails distinct)"
}

if [ "$case" = join_dies ]; then
    # (the job ends 40 rounds after the last joiner's admission, which the harness writes into
    # $tmp/end: three joiners' start-ups, each 1.6 s under ASan, fit no fixed length; 3000 caps it)
    args=(--codec fp32 --sizes 1,1023,4096,50000,7000 --rounds 3000 --sync --round-sleep-ms 30
        --elastic-dead 2 --rejoin --loose --progress --end-file "$tmp/end")
    for r in 0 1 2 3; do
        if ((r == 2)); then
            start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --die-rank 2 --die-round 15 \
                --die-mode kill
        else
            start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}"
        fi
    done
    wait_for "${wpid[2]}" 30
    # a joiner that dies 3 rounds after its admission
    start_worker 2 "$tmp/joinerA.log" "$worker_bin" "${args[@]}" --joiner-die-after 3 --die-mode kill
    a=$h_pid
    wait_for "$a" 30
    grep -q "joined at round" "$tmp/joinerA.log" || { cat "$tmp/joinerA.log"; fail "the first joiner did not join"; }
    # a joiner killed as soon as it says it joins (waiting for the members' barrier, or admitted)
    start_worker 2 "$tmp/joinerB.log" "$worker_bin" "${args[@]}"
    b=$h_pid
    for ((k = 0; k < 200; k++)); do
        grep -q "joins it" "$tmp/joinerB.log" && break
        sleep 0.01
    done
    kill -KILL "$b" 2>/dev/null
    wait_for "$b" 10
    start_worker 2 "$tmp/worker2.log" "$worker_bin" "${args[@]}"
    wait_until 60 grep -q "joined at round" "$tmp/worker2.log" || fail "the last joiner did not join"
    end_after "$tmp/end" 40 "$tmp/worker0.log"
    joined_job
    say "passed: epochs $(grep -c 'membership epoch' "$tmp/server0.log") on server 0 ($(grep -o 'membership epoch [0-9]*: [^;]*' "$tmp/server0.log" | tr '\n' ' ')); all four bit-identical at the end"
    exit 0
fi

if [ "$case" = grow ]; then
    args=(--codec fp32 --sizes 1,1023,4096,50000,7000 --rounds 100 --sync --round-sleep-ms 30
        --elastic-dead 3 --rejoin --grow)
    # rank 3 first: the job is not running yet, so it waits (HELLO again) until it does
    start_worker 3 "$tmp/worker3.log" "$worker_bin" "${args[@]}"
    sleep 1
    for r in 0 1 2; do
        start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}"
    done
    joined_job 1
    grep -q "joined at round" "$tmp/worker3.log" || fail "rank 3 did not join"
    say "passed: rank 3 (beyond workers = 3) joined at round $(sed -n 's/.*joined at round \([0-9]*\).*/\1/p' "$tmp/worker3.log"); all four bit-identical after; rank 4 refused"
    exit 0
fi
if [[ $case == rejoin || $case == join_attacks ]]; then
    args=(--codec fp32 --sizes 1,1023,4096,50000,7000 --rounds 100 --sync --round-sleep-ms 30)
    for r in 0 1 2 3; do
        if ((r == 2)); then
            start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --die-rank 2 --die-round 15 \
                --die-mode kill
        else
            start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --elastic-dead 2 --rejoin
        fi
    done
    wait_for "${wpid[2]}" 30
    sed "s/^/[worker 2, first] /" "$tmp/worker2.log"
    if [ "$case" = join_attacks ]; then
        PSAGG_RANK=2 "$build/tests/fault/rogue_worker" --mode join-flood --count 1000 --seconds 60 \
            >"$tmp/rogue.log" 2>&1
        rc=$?
        sed "s/^/[rogue] /" "$tmp/rogue.log"
        ((rc == 0)) || fail "the rogue's joins were not all refused (exit $rc)"
        grep -q 'ROGUE-REPLAY-REFUSED: .*a replay' "$tmp/rogue.log" || fail "the replayed HELLO was not refused as a replay"
        grep -q 'ROGUE-FLOOD: 1000/1000 refused' "$tmp/rogue.log" || fail "not all 1000 wrong-secret joins were refused"
        n=$(grep -c 'refused a connection' "$tmp/server0.log")
        ((n <= 20)) || fail "server 0 logged $n refusals for the flood: more than one record a second"
    fi
    # a joiner may not take a live worker's rank
    PSAGG_RANK=1 "$worker_bin" "${args[@]}" --expect EPROTO --expect-text "is a live member" \
        >"$tmp/thief.log" 2>&1 || { cat "$tmp/thief.log"; fail "a joiner with live rank 1 was not refused"; }
    # nor join with another declaration (the same rank that left: refused by name, no harm)
    PSAGG_RANK=2 "$worker_bin" --codec fp32 --sizes 1,1023,4096,50001,7000 --rounds 100 --sync \
        --expect EMISMATCH --expect-text "tensor 3 is 't003' (50001 elements" >"$tmp/mismatch.log" 2>&1 ||
        { cat "$tmp/mismatch.log"; fail "a joiner with another declaration was not refused"; }
    start_worker 2 "$tmp/worker2.log" "$worker_bin" "${args[@]}" --elastic-dead 2 --rejoin
    joined_job 2
    for r in 0 1 3; do
        longest=$(sed -n 's/^ELASTIC.*longest-round-ms \([0-9]*\).*/\1/p' "$tmp/worker$r.log")
        ((longest <= 2000)) || fail "worker $r: a round took $longest ms, more than 2000 ms"
    done
    say "passed: worker 2 rejoined at round $(sed -n 's/.*joined at round \([0-9]*\).*/\1/p' "$tmp/worker2.log"); all four bit-identical after"
    exit 0
fi
args=(--codec "$codec" --sizes 1,1023,4096,50000,7000 --rounds 60 "${extra[@]}")
for r in 0 1 2 3; do
    if ((r == 2)) && [ "$case" = startup_gap ]; then
        start_worker $r "$tmp/worker$r.log" "$build/tests/fault/rogue_worker" --mode hello-die --server 0
    elif ((r == 2)) && [ "$case" = stall ]; then
        start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --die-rank 2 --die-round 15 \
            --stall-seconds 12 --expect ETIMEDOUT --expect-text "no push for tensor"
    elif ((r == 2)); then
        start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --die-rank 2 --die-round 15 \
            --die-mode "$mode"
    elif [ "$case" = below_min ]; then
        start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" --expect EPEER \
            --expect-text "min_workers=4"
    else
        start_worker $r "$tmp/worker$r.log" "$worker_bin" "${args[@]}" "${lag[@]}" --elastic-dead 2
    fi
done

for r in 0 1 3; do
    wait_for "${wpid[$r]}" 60
    rc=$?
    sed "s/^/[worker $r] /" "$tmp/worker$r.log"
    ((rc == 0)) || fail "worker $r exited $rc"
done
if [ "$case" = below_min ]; then
    for r in 0 1 3; do grep -q EXPECTED-ERROR-OK "$tmp/worker$r.log" || fail "worker $r did not fail naming min_workers"; done
    for s in 0 1; do
        wait_for "${spid[$s]}" 20
        rc=$?
        sed "s/^/[server $s] /" "$tmp/server$s.log"
        ((rc == 1)) || fail "server $s exited $rc, expected 1 (the job failed)"
    done
    say "passed: a death below min_workers ends the job, named"
    exit 0
fi
# worker 2 is gone (a stopped one is still there: it was given up, so kill it now)
[ "$mode" = stop ] && kill -KILL "${wpid[2]}" 2>/dev/null
if [ "$case" = stall ]; then # (it wakes to the error that closed it)
    wait_for "${wpid[2]}" 30
    rc=$?
    sed "s/^/[worker 2] /" "$tmp/worker2.log"
    ((rc == 0)) && grep -q EXPECTED-ERROR-OK "$tmp/worker2.log" ||
        fail "worker 2 (stalled) exited $rc without the error that closed it (ETIMEDOUT, 'no push for')"
fi
for s in 0 1; do
    wait_for "${spid[$s]}" 20
    rc=$?
    sed "s/^/[server $s] /" "$tmp/server$s.log"
    ((rc == 0)) || fail "server $s exited $rc, expected 0 (the job went on without worker 2)"
    # (a worker that is done leaves at info, below this job's log level; its ELASTIC lines
    # below say epoch 1 all the same)
    [ "$case" = bye ] || grep -q "membership epoch 1" "$tmp/server$s.log" ||
        fail "server $s did not log membership epoch 1"
done
if [ "$case" = startup_gap ]; then
    grep -q "worker 2: server 0 started the job without it" "$tmp/server1.log" ||
        fail "server 1 did not start without worker 2 on server 0's word"
fi
digests=$(grep -h '^DIGEST' "$tmp/worker0.log" "$tmp/worker1.log" "$tmp/worker3.log" | sort -u | wc -l)
((digests == 1)) || fail "the survivors' digests differ: their updates were not identical"
for r in 0 1 3; do
    line=$(grep '^ELASTIC' "$tmp/worker$r.log") || fail "worker $r printed no ELASTIC line"
    longest=$(sed -n 's/.*longest-round-ms \([0-9]*\).*/\1/p' <<<"$line")
    ((longest <= bound_ms)) || fail "worker $r: a round took $longest ms, more than $bound_ms ms"
    say "worker $r: $line"
done
say "passed: the job went on without worker 2; survivors bit-identical"
