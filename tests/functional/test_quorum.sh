#!/usr/bin/env bash
# test_quorum.sh CASE BUILD_DIR [PORT] - straggler tolerance ([server] quorum, grace_ms), ctest
# label `elastic`.
#
# 2 servers, 4 fn_worker processes (tensors of 1 to 50,000 elements over several chunks on
# both servers), 80 rounds; worker 3 is a straggler: it sleeps 40 ms before each round's pushes
# but for the last 10 (fn_worker --straggler). Every worker must finish (exit 0) with
# bit-identical digests, and nothing may be lost: summed over the rounds, the updates equal
# every worker's every input (fn_worker checks it; a left-out push is carried into a later
# one). Both servers exit 0.
#
#   straggler  quorum = 3, grace_ms = 5, fp32: rounds close without worker 3 (its
#              psagg_stats.left_out > 0, and the servers' straggler reports add up to it)
#   ef         the same with maxmin4 and error feedback on the workers and the servers: the
#              left-out pushes go back into the residuals (sum within the codec's bound)
#   carry      straggler, but slow to the end (no calm rounds) by a little more than grace_ms
#              (20 ms): the job ends with left-out pushes still carried
#   elastic    [cluster] elastic = on, quorum = 2: worker 2 is killed before its round-30
#              pushes and the job goes on; rounds close without the straggler before and after
#              the death; the three left finish with bit-identical digests, and nothing is
#              lost: the updates are every input of the three and worker 2's up to its death,
#              less what it still carried when it died (fn_worker --dead-round)
#   failover   straggler with [cluster] server_replicas = 1: server 1 SIGKILLed once worker 0
#              starts round 40 (rounds closing without worker 3 meanwhile); server 0 takes its
#              chunks over, a round whose update some workers had is relayed to it by one of
#              them (bitmap and all), and the job ends as straggler does: every worker exits
#              0 with the same digest, every input summed once (server 0 exits 0)
#   elastic_stall  elastic, but worker 2 stays alive and stops pushing at round 30 (it sleeps
#              12 s; its library answers PINGs): round 30 closes without it, round 31 waits
#              for it (its push of round 30 never came), and at that round's deadline (1.5 x
#              op_timeout_ms) the servers give it up and the membership removes it (before,
#              the deadline failed the job); the job ends as elastic does, and worker 2 wakes
#              to the error that closed it (ETIMEDOUT)
#   elastic_failover  elastic and failover in one job ([cluster] elastic = on, server_replicas
#              = 1, quorum = 2): worker 2 killed before its round-30 pushes (a view removes it),
#              then server 1 SIGKILLed at round 40 (a view moves its chunks); the survivors end
#              as elastic does, every input of theirs and worker 2's summed once (less what it
#              carried when it died)
#   ef_replicas  ef with [cluster] server_replicas = 1 (every chunk has a copy: the servers keep
#              a residual), no death: each copy steps every round with the pushes its owner
#              summed (the bitmap the workers' next pushes carry), so the servers' state digests
#              (log level debug) of each chunk are the same on owner and copy after every round
#   ef_failover  ef_replicas, and server 1 SIGKILLed at round 40 as in failover: the copies
#              take the chunks over with their owner's residuals; the job ends as ef does
#   failover_back  the same, and server 1 started again once every worker took view 1: it is
#              admitted (view 2) and takes no chunk back (under a quorum its chunks stay with
#              server 0, docs/server-failover.md); the job ends as failover does
#   optim_replicas  fn_optim (parameter chunks: the servers' optimizer) with server_replicas = 1
#              and worker 3 a straggler: the copies step each round with their owner's
#              contributors (state digests as ef_replicas); every worker ends with the same
#              master weights
#   optim_failover  optim_replicas, and server 1 SIGKILLed at step 40: its chunks' copies take
#              them over with the owner's state; the job ends as optim_replicas does
#              17 ms after worker 0 printed it (PSAGG_TEST_KILL_DELAY_MS=MS, under 1000)
#   optim_back  optim_failover, and server 1 started again once every worker took view 1: it
#              receives the state of the chunks it copies and follows their owners again (its
#              copies' digests checked too); the job ends as optim_replicas does (240 steps:
#              in 80 the job could end before server 1's return under ASan)
#   all        quorum = 4 = workers: no round closes without anyone (every left_out 0)
#   bad        quorum = 5 with workers = 4, and quorum with [codec] adaptive: refused at
#              file:line by the server and by a worker, nothing starts
set -u -o pipefail

case=$1
build=$2
server_bin=$build/server/psagg-server
worker_bin=$build/tests/functional/fn_worker
optim_bin=$build/tests/functional/fn_optim
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${3:-}"

say() { echo "test_quorum $case: $*"; }

quorum=3 codec=fp32 extra=() server_ef="" calm=10 slow=40 rounds=80
case $case in
straggler) ;;
carry) calm=0 slow=20 ;;
elastic | elastic_stall | elastic_failover) quorum=2 ;;
failover) ;;
failover_back) rounds=240 ;; # (long enough for server 1's return under ASan too)
ef | ef_failover | ef_replicas) codec=maxmin4 extra=(--error-feedback) server_ef=on ;;
all) quorum=4 ;;
bad | optim_replicas | optim_failover) ;;
optim_back) rounds=240 ;; # (server 1's return, ASan's start-up seconds, before the job ends)
*) fail "unknown case '$case'" ;;
esac

write_ini() { # quorum [SECTION.KEY=VALUE...]
    job_ini "$tmp/job.ini" 2 4 cluster.job_id="quorum-$case-$port" cluster.connect_timeout_ms=20000 \
        cluster.op_timeout_ms=4000 server.threads=2 server.quorum="$1" server.grace_ms=5 \
        server.error_feedback=$server_ef worker.chunk_bytes=16384 log.level=info "${@:2}"
}

if [ "$case" = bad ]; then
    # (the errors name the quorum line of the file)
    write_ini 5
    line=$(grep -n '^quorum = ' "$tmp/job.ini" | cut -d: -f1)
    out=$("$server_bin" --config "$tmp/job.ini" --rank 0 2>&1) && fail "quorum 5 of 4 workers: the server started"
    grep -q "job.ini:$line: \[server\] quorum = 5 is more than workers = 4" <<<"$out" ||
        fail "quorum 5 of 4 workers: the server said: $out"
    out=$(PSAGG_CONFIG=$tmp/job.ini PSAGG_RANK=0 PSAGG_WORLD_SIZE=4 "$worker_bin" --rounds 1 2>&1) &&
        fail "quorum 5 of 4 workers: a worker started"
    grep -q "job.ini:$line: \[server\] quorum = 5 is more than workers = 4" <<<"$out" ||
        fail "quorum 5 of 4 workers: the worker said: $out"
    write_ini 3 codec.adaptive=on
    line=$(grep -n '^quorum = ' "$tmp/job.ini" | cut -d: -f1)
    out=$("$server_bin" --config "$tmp/job.ini" --rank 0 2>&1) && fail "quorum with adaptive: the server started"
    grep -q "job.ini:$line: \[server\] quorum does not work with \[codec\] adaptive" <<<"$out" ||
        fail "quorum with adaptive: the server said: $out"
    say "passed: $(head -n 1 <<<"$out")"
    exit 0
fi

if [[ $case == optim_* ]]; then
    # fn_optim: four parameter tensors (the servers' sgd with momentum) and a plain one, worker 3
    # a straggler (30 ms before each step's pushes): rounds close without it, each parameter
    # chunk's copy steps them with its owner's contributors; optim_failover: server 1 SIGKILLed
    # at step 40, the copies take over with their owner's state. Every worker ends with the
    # same master weights (pulled with sync).
    write_ini "$quorum" cluster.server_replicas=1 server.optimizer=sgd server.momentum=0.9 \
        log.level=debug
    export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=4
    start_servers "$tmp/job.ini" 2
    for r in 0 1 2 3; do
        start_worker $r "$tmp/worker$r.log" FN_OPTIM_CODEC=maxmin4/512 "$optim_bin" "$rounds" --straggler 3 \
            --straggler-ms 30 --step-sleep-ms 1
    done
    servers=(0 1)
    if [[ $case == optim_failover || $case == optim_back ]]; then
        wait_until 60 grep -q "^STEP 40\$" "$tmp/worker0.log" || fail "worker 0 never reached step 40"
        sleep "$(printf '0.%03d' "${PSAGG_TEST_KILL_DELAY_MS:-17}")" # (a later point of the step)
        kill -KILL -- "-${spid[1]}"
        servers=(0)
    fi
    if [ "$case" = optim_back ]; then # (started again once every worker took view 1)
        wait_until 30 eval "[ \$(grep -l 'server view 1:' $tmp/worker[0-3].log | wc -l) -eq 4 ]" ||
            fail "not every worker took view 1"
        spawn "$tmp/server1b.log" "$server_bin" --config "$tmp/job.ini" --rank 1
        spid[1]=$h_pid
        servers=(0 1)
    fi
    for r in 0 1 2 3; do
        wait_for "${wpid[$r]}" 90
        rc=$?
        ((rc == 0)) || fail "worker $r exited $rc: $(grep -h ERROR "$tmp/worker$r.log" | head -n 1)"
    done
    for s in "${servers[@]}"; do
        wait_for "${spid[$s]}" 20
        rc=$?
        ((rc == 0)) || fail "server $s exited $rc"
    done
    (($(grep -h '^DIGEST' "$tmp"/worker*.log | sort -u | wc -l) == 1)) ||
        fail "the workers' master weights differ: $(grep -h '^DIGEST' "$tmp"/worker*.log | tr '\n' ' ')"
    left=$(sed -n 's/^QUORUM worker 3 left_out \([0-9]*\)$/\1/p' "$tmp/worker3.log")
    ((left > 0)) || fail "worker 3 was never left out (left_out '${left}')"
    check_states "$([ "$case" = optim_back ] && echo 3 || echo 2)" "$tmp"/server*.log
    taken=
    if [ "$case" = optim_back ]; then
        for r in 0 1 2 3; do
            grep -q "server 1 is back in view 2" "$tmp/worker$r.log" || fail "worker $r did not take server 1 back"
        done
    fi
    if [[ $case == optim_failover || $case == optim_back ]]; then
        taken=$(grep -c "its copy here owns it from round" "$tmp/server0.log")
        ((taken > 0)) || fail "no copy on server 0 took a chunk over"
        followed=$(grep -c "stepped with the lost owner's contributors" "$tmp/server0.log")
        taken=" server 1 killed at step 40: $taken chunks taken over by their copies ($followed of them first stepping the lost owner's last round with its contributors)$([ "$case" = optim_back ] && echo "; server 1 back in view 2, standing by");"
    fi
    say "passed:$copies$taken worker 3 left out of $left chunk rounds; the same master weights on every worker ($(grep -h '^DIGEST' "$tmp/worker0.log"))"
    exit 0
fi

if [ "$case" = elastic ] || [ "$case" = elastic_stall ]; then
    write_ini "$quorum" cluster.elastic=on cluster.min_workers=2
elif [ "$case" = elastic_failover ]; then
    write_ini "$quorum" cluster.elastic=on cluster.min_workers=2 cluster.server_replicas=1
elif [[ $case == *failover* ]]; then # (ef_failover: the state digests, as ef_replicas)
    write_ini "$quorum" cluster.server_replicas=1 $([ "$case" = ef_failover ] && echo log.level=debug)
elif [ "$case" = ef_replicas ]; then # (debug: the servers log each chunk's state digest)
    write_ini "$quorum" cluster.server_replicas=1 log.level=debug
else
    write_ini "$quorum"
fi
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=4
start_servers "$tmp/job.ini" 2
t0=$(date +%s%N)
survivors=(0 1 2 3)
for r in 0 1 2 3; do
    dead=()
    if [[ $case == elastic* ]]; then
        survivors=(0 1 3)
        dead=(--elastic-dead 2 --dead-round 30)
        ((r == 2)) && dead=(--die-rank 2 --die-round 30 --die-mode kill)
        ((r == 2)) && [ "$case" = elastic_stall ] && dead=(--die-rank 2 --die-round 30
            --stall-seconds 12 --expect ETIMEDOUT --expect-text "no push for tensor")
    fi
    start_worker $r "$tmp/worker$r.log" "$worker_bin" --codec "$codec" "${extra[@]}" --sizes 1,1023,4096,50000 \
        --rounds $rounds --straggler 3 --straggler-ms $slow --calm-rounds $calm --progress "${dead[@]}"
done
servers=(0 1)
if [[ $case == *failover* ]]; then
    wait_until 60 grep -q "^ROUND 40\$" "$tmp/worker0.log" || fail "worker 0 never reached round 40"
    kill -KILL -- "-${spid[1]}"
    servers=(0)
fi
if [ "$case" = failover_back ]; then
    wait_until 30 eval "[ \$(grep -l 'server view 1:' $tmp/worker[0-3].log | wc -l) -eq 4 ]" ||
        fail "not every worker took view 1"
    spawn "$tmp/server1b.log" "$server_bin" --config "$tmp/job.ini" --rank 1
    spid[1]=$h_pid
    servers=(0 1)
fi
for r in "${survivors[@]}"; do
    wait_for "${wpid[$r]}" 90
    rc=$?
    ((rc == 0)) || fail "worker $r exited $rc"
done
ms=$((($(date +%s%N) - t0) / 1000000))
for s in "${servers[@]}"; do
    wait_for "${spid[$s]}" 20
    rc=$?
    ((rc == 0)) || fail "server $s exited $rc"
done
(($(for r in "${survivors[@]}"; do grep -h '^DIGEST' "$tmp/worker$r.log"; done | sort -u | wc -l) == 1)) ||
    fail "the workers' digests differ: $(grep -h '^DIGEST' "$tmp"/worker*.log | tr '\n' ' ')"
if [ "$case" = elastic ] || [ "$case" = elastic_stall ]; then
    for s in 0 1; do
        grep -q "membership epoch 1" "$tmp/server$s.log" || fail "server $s did not log membership epoch 1"
    done
fi
if [ "$case" = elastic_stall ]; then # (it wakes to the error that closed it)
    wait_for "${wpid[2]}" 30
    rc=$?
    ((rc == 0)) && grep -q EXPECTED-ERROR-OK "$tmp/worker2.log" ||
        fail "worker 2 (stalled) exited $rc without the error that closed it: $(tail -2 "$tmp/worker2.log")"
    say "worker 2: $(grep -m1 'failed as expected' "$tmp/worker2.log" | cut -c1-160)"
fi
if [ "$case" = elastic_failover ]; then # (a view removes worker 2, one moves server 1's chunks)
    for r in "${survivors[@]}"; do
        grep -q "membership in view [0-9]*: workers 2 left" "$tmp/worker$r.log" ||
            fail "worker $r never took a view without worker 2"
        grep -q "server view [0-9]*: [1-9][0-9]* chunk(s) moved" "$tmp/worker$r.log" ||
            fail "worker $r never took a view that moved server 1's chunks"
    done
fi
left=$(sed -n 's/^QUORUM worker 3 left_out \([0-9]*\);.*/\1/p' "$tmp/worker3.log")
[[ -n $left ]] || fail "worker 3 printed no QUORUM line"
report=$(grep -h "straggler report: worker 3: left out of" "$tmp"/server*.log |
    sed 's/.*left out of \([0-9]*\) .*/\1/' | awk '{s += $1} END {print s + 0}')
if [ "$case" = all ]; then
    for r in 0 1 2 3; do
        grep -q "^QUORUM worker $r left_out 0;" "$tmp/worker$r.log" ||
            fail "quorum = workers, yet worker $r was left out: $(grep '^QUORUM' "$tmp/worker$r.log")"
    done
    # 70 slow rounds of at least 40 ms each: the others waited for worker 3
    ((ms >= 2800)) || fail "quorum = workers took only $ms ms: the rounds did not wait for worker 3"
    say "passed: nobody left out, $ms ms (the rounds waited for worker 3)"
    exit 0
fi
((left > 0)) || fail "worker 3 was never left out (quorum $quorum, grace_ms 5)"
if [[ $case == *failover* ]]; then # (server 1's report died with it)
    for r in "${survivors[@]}"; do
        grep -q "server view 1:" "$tmp/worker$r.log" || fail "worker $r never took view 1"
        [[ $case != failover_back ]] || grep -q "server 1 is back in view 2" "$tmp/worker$r.log" ||
            fail "worker $r did not take server 1 back"
    done
    if [[ $case == failover_back ]]; then
        back=$(grep -h "server view 2:" "$tmp/server0.log" | head -n 1)
        [[ $back == *"server view 2: 0 chunk(s) moved"* ]] ||
            fail "view 2 (server 1 back) moved chunks back under a quorum: $back"
    fi
    ((report <= left)) || fail "worker 3 says it was left out of $left chunk rounds, server 0 $report"
    relayed=$(grep -c "the update a worker relayed goes out" "$tmp/server0.log")
else
    ((report == left)) || fail "worker 3 says it was left out of $left chunk rounds, the servers $report"
fi
grep -q "the updates over $rounds rounds are every input" "$tmp/worker0.log" || fail "no conservation line"
[ "$case" = ef_replicas ] && check_states 2 "$tmp"/server*.log
[ "$case" = ef_failover ] && check_states 3 "$tmp"/server*.log
carried=$(sed -n 's/^QUORUM worker 0: \([0-9]*\) elements still carried.*/\1/p' "$tmp/worker0.log")
tail_rounds=$(sed -n 's/^QUORUM worker 0: .*(up to \([0-9]*\) rounds).*/\1/p' "$tmp/worker0.log")
say "passed:${copies:-} worker 3 left out of $left chunk rounds (the servers agree), $ms ms for $rounds rounds; every input summed once (${carried:-0} elements still carried by workers left out of up to ${tail_rounds:-0} last rounds)${relayed:+; server 1 killed at round 40: server 0 took over, $relayed chunk round(s) relayed}${back:+; server 1 back, no chunk moved back: server view${back#*server view}}"
