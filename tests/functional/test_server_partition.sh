#!/usr/bin/env bash
# test_server_partition.sh BUILD_DIR - a server cut off by the network, not killed
# ([cluster] server_replicas = 1; docs/design.md, "Why a partition cannot make two owners sum
# one chunk"; docs/server-failover.md).
#
# Every process has a host of its own in an emulated cluster (deploy/netcluster.sh: one network
# namespace per host, 1 Gbit/s links): servers 0 and 1 on hosts 0 and 1, workers 0..2 on hosts
# 2..4. Each job is fn_worker (3 workers, fp32 checked bit for bit against its own sum in every
# round, DIGEST of every output) with op_timeout_ms = 3000. Once worker 0 starts round K, nftables
# rules in the victim server's namespace DROP every packet between it and some workers, both
# ways (nothing is closed: the peers only go silent); the root namespace is never touched, and
# the cluster is removed when the script exits, failed or not. Cases:
#   cut-all          server 1 cut off from every worker: every worker exits 0 with the DIGEST of
#                    the uninterrupted run and takes view 1, server 0 proposes it and takes every
#                    chunk over; the cut-off server never applies view 1, closes no round and
#                    queues no update from 1 s after the cut to its exit (its Prometheus
#                    counters, read inside its namespace until it is gone) and leaves the job
#                    failed (exit status 1), naming the workers it gave up
#   cut-coordinator  the same with server 0 (the coordinator): server 1 coordinates view 1
#   cut-startup      server 1 cut off from every worker before they start (connect_timeout_ms =
#                    4000): their connections to it time out (SYNs dropped, never minutes of the
#                    kernel's retries), every worker gives it up during the start-up and the job
#                    runs in view 1, bit-identical
#   end              server 1's frames to worker 2 dropped during the last round, SIGKILLed once
#                    workers 0 and 1 have every update: they wait in psagg_close (DONE) and
#                    push the last round again to server 0, which takes server 1's chunks
#                    over and sends the update worker 0 or 1 relays; every worker exits 0,
#                    bit-identical
#   relay            the same in the middle of the job (round 40): server 1 SIGKILLed once
#                    workers 0 and 1 started round 41, worker 2 still waiting for round 40's
#                    updates of server 1's chunks; the job goes on 80 rounds, bit-identical
#   relay-adaptive   the same with adaptive codecs (fn_adaptive, every output checked bit for
#                    bit): a relayed update of a tensor the assignment widened past the declared
#                    codec (7 or 8 bits against maxmin4)
#   relay-quorum     [server] quorum = 2: server 1's frames to worker 2 dropped from round 40,
#                    so workers 0 and 1 go one or two rounds past it (rounds closed without it);
#                    server 1 SIGKILLed: those rounds relayed (only the relay gives their bytes);
#                    every input summed once (fn_worker --straggler), the workers bit-identical
#   cut-one          server 1 cut off from worker 0 only: no view can be decided (workers 1 and
#                    2 still reach server 1), server 1's round cannot close without worker 0's
#                    push, and op_timeout_ms after the cut server 1 fails the job naming worker
#                    0: every worker fails (ETIMEDOUT) with that cause, and no worker prints a
#                    DIGEST (never two results)
#   stale-copy       an elastic job with a server residual (every chunk has a copy): worker 2's
#                    packets to server 1 dropped in its own namespace as it pushes round 40, then
#                    it is SIGKILLed (its host gone with the bytes): server 0 summed its pushes,
#                    server 1 never had them, so server 1's copies of server 0's chunks are stale;
#                    server 1 starts anew by itself (execs) and comes back with the state of every
#                    chunk it holds; server 0 is SIGKILLed then, and server 1 takes its chunks over:
#                    workers 0 and 1 end with one digest, the servers' state digests of each chunk
#                    equal on owner and copy after every round both stepped (log level debug)
# Exit 77 (skipped) when not root or without ip, tc, unshare, nft or curl, or when the kernel
# has no network namespaces or no nftables inside one.
set -u -o pipefail
build=$1

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (network namespaces, nftables)"; exit 77; }
for t in ip tc unshare nft curl setsid; do
    command -v "$t" >/dev/null 2>&1 || { echo "SKIP: '$t' not found (deploy/install-deps.sh)"; exit 77; }
done
ip netns list >/dev/null 2>&1 || { echo "SKIP: network namespaces unavailable"; exit 77; }

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
NC=$h_repo/deploy/netcluster.sh
# shellcheck source=deploy/netcluster.sh
. "$NC" # (its names only: nc_ns_host, nc_addr; the cluster itself through its CLI)
worker_bin=$build/tests/functional/fn_worker
adaptive_bin=$build/tests/functional/fn_adaptive adaptive=0
server_bin=$build/server/psagg-server
rounds=120 sleep_ms=20 sizes=1,1023,4096,50000,7000 wargs=()
# (clusters of an earlier run of this test that was killed, its owner gone, are removed first)
"$NC" cleanup --prefix psgp >/dev/null 2>&1
P="psgp$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"
at_exit "\"$NC\" down --prefix $P >/dev/null 2>&1"

"$NC" up --hosts 5 --rate 1gbit --prefix "$P" --owner-pid $$ >/dev/null 2>"$tmp/up.err" ||
    { cat "$tmp/up.err"; fail "netcluster up failed"; }
if ! ip netns exec "$(nc_ns_host "$P" 0)" nft add table inet psagg_probe 2>"$tmp/nft.err"; then
    echo "SKIP: nftables unavailable in a network namespace: $(cat "$tmp/nft.err")"
    exit 77
fi
ip netns exec "$(nc_ns_host "$P" 0)" nft delete table inet psagg_probe
addr() { nc_addr "$P" "$1"; }   # addr HOST
whost() { echo $((2 + $1)); }   # whost WORKER: its host
base=19500                      # each job its own control ports (base, base+1), metrics +2, +3

# sever SERVER WORKER...: drop every packet between SERVER's host and those workers' hosts, both
# ways, in SERVER's namespace (counted, so that the test can say the cut held)
sever() {
    local s=$1 w set=""
    shift
    for w in "$@"; do set+="${set:+, }$(addr "$(whost "$w")")"; done
    ip netns exec "$(nc_ns_host "$P" "$s")" nft -f - <<EOF || fail "nft: could not cut server $s off"
table inet psagg_cut {
    chain in { type filter hook input priority filter; policy accept; ip saddr { $set } counter drop; }
    chain out { type filter hook output priority filter; policy accept; ip daddr { $set } counter drop; }
}
EOF
}
# mute SERVER WORKER: drop only what SERVER sends to WORKER (what WORKER sends it still arrives)
mute() {
    ip netns exec "$(nc_ns_host "$P" "$1")" nft -f - <<EOF || fail "nft: could not mute server $1"
table inet psagg_cut {
    chain out { type filter hook output priority filter; policy accept; ip daddr $(addr "$(whost "$2")") counter drop; }
}
EOF
}
# dropped SERVER: packets the cut dropped in SERVER's namespace, both ways
dropped() {
    ip netns exec "$(nc_ns_host "$P" "$1")" nft list table inet psagg_cut 2>/dev/null |
        awk '/counter packets/ { for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) }
             END { print n + 0 }'
}
heal() { # heal SERVER: the cut undone (between cases)
    ip netns exec "$(nc_ns_host "$P" "$1")" nft delete table inet psagg_cut 2>/dev/null
}
# watch_metrics SERVER FILE: FILE holds SERVER's last /metrics for as long as it answers
watch_metrics() {
    # shellcheck disable=SC2016 # (the loop's $0 and $1 are sh's)
    spawn "$tmp/watch$1.out" ip netns exec "$(nc_ns_host "$P" "$1")" sh -c \
        'while curl -sf -m 1 "$0" >"$1.new"; do mv "$1.new" "$1"; sleep 0.1; done' \
        "http://$(addr "$1"):$((port + 2 + $1))/metrics" "$2"
}
# metric NAME FILE: a counter of a scrape (0 when absent)
metric() { awk -v n="$1" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }' "$2"; }
# scrape SERVER FILE: its /metrics, read from inside its own namespace (the cut leaves that)
scrape() {
    ip netns exec "$(nc_ns_host "$P" "$1")" curl -sf -m 2 \
        "http://$(addr "$1"):$((port + 2 + $1))/metrics" >"$2"
}

# run NAME VICTIM ROUND WORKER...: one job; once worker 0 starts round ROUND (start: before the
# workers start), server VICTIM is cut off from the WORKERs (VICTIM -1: no cut). Workers' rcs in
# rc[], the servers' pids in spid[]; $keys (an array): more SECTION.KEY=VALUE for the job
run() {
    local name=$1 victim=$2 round=$3 s w cmd
    shift 3
    port=$base
    base=$((base + 10))
    job_ini "$tmp/$name.ini" 2 3 cluster.job_id="partition-$name-$P" \
        cluster.servers="$(addr 0):$port $(addr 1):$((port + 1))" cluster.server_replicas=1 \
        cluster.op_timeout_ms=3000 cluster.local_copy=off server.metrics_port=$((port + 2)) \
        log.level=info ${keys[@]+"${keys[@]}"}
    for s in 0 1; do
        spawn "$tmp/$name-server$s.log" "$NC" exec --prefix "$P" "$s" -- \
            "$server_bin" --config "$tmp/$name.ini" --rank "$s"
        spid[s]=$h_pid
    done
    if ((victim >= 0)) && [[ $round == start ]]; then
        sever "$victim" "$@"
        t_cut=$(date +%s.%N)
    fi
    for w in 0 1 2; do
        if ((adaptive)); then # fn_adaptive (its own tensors); w2args: worker 2's own arguments
            cmd=("$adaptive_bin" $rounds --progress)
        else
            cmd=("$worker_bin" --codec fp32 --sizes $sizes --rounds $rounds --round-sleep-ms
                $sleep_ms --progress ${wargs[@]+"${wargs[@]}"})
        fi
        ((w == 2)) && cmd+=(${w2args[@]+"${w2args[@]}"})
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
            "$NC" exec --prefix "$P" "$(whost $w)" -- "${cmd[@]}"
    done
    if ((victim >= 0)) && [[ $round != start ]]; then
        wait_until 60 grep -qs "^ROUND $round\$" "$tmp/$name-worker0.log" ||
            fail "$name: worker 0 never reached round $round"
        sever "$victim" "$@"
        t_cut=$(date +%s.%N)
    fi
}

wait_workers() { # wait_workers SECONDS: every worker's rc in rc[]
    local w
    for w in 0 1 2; do
        wait_for "${wpid[$w]}" "$1"
        rc[w]=$?
    done
}

digests() { grep -h '^DIGEST' "$tmp/$1"-worker[012].log | sort -u; } # digests NAME

took() { awk -v a="$t_cut" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- the uninterrupted run ----
t0=$SECONDS
run ref -1 0
wait_workers 60
for w in 0 1 2; do ((rc[w] == 0)) || fail "ref: worker $w exited ${rc[w]} without a cut"; done
ref=$(digests ref)
if [ -z "$ref" ] || (($(wc -l <<<"$ref") != 1)); then
    fail "ref: the workers' digests differ or are missing: $ref"
fi
for s in 0 1; do
    wait_for "${spid[$s]}" 10 || fail "ref: server $s exited $? after the job"
done
stop_all
echo "ref: $rounds rounds on the emulated cluster, $((SECONDS - t0)) s: ${ref#DIGEST }"

# cut_all NAME VICTIM ROUND: the victim cut off from every worker; the job goes on without it
cut_all() {
    local name=$1 v=$2 round=$3 o=$((1 - $2)) w d before after n_drop view_at
    t0=$SECONDS
    run "$name" "$v" "$round" 0 1 2
    # the victim's counters 1 s after the cut (its last pushes are in; it gives its workers up
    # from 2.25 s on: op_timeout_ms after the last PING), then as long as it answers: it closes
    # no round and queues no update from then on, before view 1 or after
    watch_metrics "$v" "$tmp/$name-mlast"
    sleep 1
    scrape "$v" "$tmp/$name-m1" || fail "$name: server $v's metrics (inside its namespace) do not answer"
    wait_until 20 eval "[ \$(grep -l 'server view 1:' $tmp/$name-worker[012].log | wc -l) -eq 3 ]" ||
        fail "$name: not every worker took view 1 within 20 s of the cut"
    view_at=$(took)
    wait_workers 60
    for w in 0 1 2; do
        ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]} with server $v cut off"
        grep -q "lost server $v (.*): reporting it to server $o" \
            "$tmp/$name-worker$w.log" || fail "$name: worker $w did not report server $v lost to server $o"
    done
    d=$(digests "$name")
    [ "$d" = "$ref" ] || fail "$name: digests '$d', the uninterrupted run's '$ref' (two owners summed?)"
    # the survivor coordinated and took every chunk over; it ends as the job does
    grep -q "every member lost server $v: proposing view 1 without it" "$tmp/$name-server$o.log" ||
        fail "$name: server $o did not propose view 1"
    grep -Eq "server view 1: ([1-9][0-9]*) chunk\(s\) moved, \1 of them to this server" \
        "$tmp/$name-server$o.log" || fail "$name: server $o did not take every chunk of server $v over"
    wait_for "${spid[$o]}" 15 || fail "$name: server $o exited $? after the job"
    # the cut-off server: never in view 1, it fails the job by itself, naming the silent workers
    wait_for "${spid[$v]}" 15
    s_rc=$?
    ((s_rc != 0 && s_rc != 124)) || fail "$name: the cut-off server $v exited $s_rc (0: done? 124: still runs)"
    for m in psagg_server_chunk_rounds_total psagg_server_updates_total; do
        before=$(metric $m "$tmp/$name-m1") after=$(metric $m "$tmp/$name-mlast")
        [ "$before" = "$after" ] ||
            fail "$name: the cut-off server $v went on after the cut: $m $before -> $after"
    done
    ! grep -q "server view" "$tmp/$name-server$v.log" ||
        fail "$name: the cut-off server $v applied view 1: $(grep "server view 1" "$tmp/$name-server$v.log")"
    # (it gives up every worker that was silent for op_timeout_ms: all at once, or some, which
    # fails the job, and it leaves op_timeout_ms later)
    grep -Eq "closing worker ([012]): worker \1 sent nothing for .* more than op_timeout_ms=3000 \(stopped, hung or cut off\)" \
        "$tmp/$name-server$v.log" || fail "$name: the cut-off server $v does not say it lost its workers"
    grep -Eq "all workers gone, job failed|the job failed and workers .* are still connected op_timeout_ms=3000 later; leaving" \
        "$tmp/$name-server$v.log" || fail "$name: the cut-off server $v does not say it left the job failed"
    n_drop=$(dropped "$v")
    ((n_drop > 0)) || fail "$name: the cut dropped no packet"
    echo "$name: server $v cut off from every worker at round $round: every worker in view 1" \
        "${view_at} s after the cut ($(grep -o 'from round [0-9]*' "$tmp/$name-server$o.log"))," \
        "bit-identical to the uninterrupted run; server $v:" \
        "$(metric psagg_server_updates_total "$tmp/$name-mlast") updates, none after the cut;" \
        "exit $s_rc: $(grep -Eo 'all workers gone, job failed|leaving' "$tmp/$name-server$v.log" | head -1);" \
        "$n_drop packets dropped; $((SECONDS - t0)) s"
    stop_all
    heal "$v"
}

cut_all cut-all 1 40
cut_all cut-coordinator 0 60

# ---- cut-startup: server 1 cut off from every worker before they start ----
name=cut-startup t0=$SECONDS
keys=(cluster.connect_timeout_ms=4000)
run "$name" 1 start 0 1 2
keys=()
wait_workers 90
for w in 0 1 2; do
    ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]} with server 1 cut off from the start"
    grep -q "server 1 given up during the start-up" "$tmp/$name-worker$w.log" ||
        fail "$name: worker $w did not give server 1 up during the start-up"
    grep -q "server view 1:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view 1"
done
d=$(digests "$name")
[ "$d" = "$ref" ] || fail "$name: digests '$d', the uninterrupted run's '$ref'"
n_drop=$(dropped 1)
((n_drop > 0)) || fail "$name: the cut dropped no packet"
echo "$name: server 1 cut off from every worker before they start: every worker gave it up" \
    "($(grep -ho 'given up during the start-up: [^;]*' "$tmp/$name-worker0.log" | cut -c1-120)) and" \
    "ran in view 1, bit-identical to the uninterrupted run; $n_drop packets dropped; $((SECONDS - t0)) s"
stop_all
heal 1

# A takeover's relayed round (docs/server-failover.md): in job NAME, of round ROUND, a worker
# relayed an update to server 0, which sent it on.
relayed() {
    grep -q "round $2's update relayed to server 0" "$tmp/$1"-worker[01].log ||
        fail "$1: neither worker 0 nor 1 relayed round $2's update to server 0"
    grep -q "round $2: the update a worker relayed goes out" "$tmp/$1-server0.log" ||
        fail "$1: server 0 did not send round $2's relayed update"
}

# killed NAME ROUND: server 1 was SIGKILLed once workers 0 and 1 had round ROUND's updates of
# its chunks and worker 2 not: every worker must exit 0, in view 1, bit-identical (to the
# uninterrupted run; with $keys, which change the result, to each other), and that round's
# update must have been relayed (relayed).
killed() {
    local name=$1 round=$2 w
    t_cut=$(date +%s.%N)
    wait_workers 60
    for w in 0 1 2; do
        ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]} (server 1 killed in round $round)"
        grep -q "server view 1:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view 1"
    done
    end_at=$(took)
    d=$(digests "$name")
    if ((${#keys[@]})); then
        [ -n "$d" ] && (($(wc -l <<<"$d") == 1)) || fail "$name: the workers' digests differ: $d"
    else
        [ "$d" = "$ref" ] || fail "$name: digests '$d', the uninterrupted run's '$ref'"
    fi
    relayed "$name" "$round"
    wait_for "${spid[0]}" 15 || fail "$name: server 0 exited $? after the job"
}

# partial NAME ROUND MARK: worker 2 sleeps 2 s before round ROUND's pushes; meanwhile server 1's
# frames to it are dropped, so of that round's updates it gets server 0's only, while workers 0
# and 1 get all and go on until their logs show MARK (a line's start), which worker 2's must
# not. Then server 1 is SIGKILLed (killed). With $adaptive (fn_adaptive, which has no lag of its
# own) worker 2 instead holds before the round until the drop is in place.
partial() {
    local name=$1 round=$2 mark=$3
    if ((adaptive)); then # (fn_adaptive: worker 2 holds before the round until the drop is in)
        w2args=(--hold "$round:$tmp/$name.go")
        run "$name" -1 0
        w2args=()
        wait_until 60 grep -qs "^HOLD before round $round\$" "$tmp/$name-worker2.log" ||
            fail "$name: worker 2 never held before round $round"
        mute 1 2
        touch "$tmp/$name.go"
    else
        wargs=(--lag-round "$round" --lag-ms 2000 --lag-rank 2)
        run "$name" -1 0
        wargs=()
        wait_until 60 grep -qs "^ROUND $round\$" "$tmp/$name-worker2.log" ||
            fail "$name: worker 2 never reached round $round"
        mute 1 2
    fi
    wait_until 30 eval "grep -q '^$mark' $tmp/$name-worker0.log && grep -q '^$mark' $tmp/$name-worker1.log" ||
        fail "$name: workers 0 and 1 did not reach '$mark'"
    ! grep -q "^$mark" "$tmp/$name-worker2.log" ||
        fail "$name: worker 2 had round $round's updates before server 1 died (the mute did not hold)"
    kill -KILL -- "-${spid[1]}"
    killed "$name" "$round"
}

# ---- end: server 1 dies once workers 0 and 1 have their last updates, before worker 2 ----
# Of the last round's updates worker 2 gets server 0's only, while workers 0 and 1 get all and
# close. Server 0 takes server 1's chunks over from the round worker 2 still needs, sums it again
# from every worker's kept push (so workers 0 and 1 must not have left: psagg_close waits until
# every worker is done, DONE) and sends every worker the update that worker 0 or 1 relays.
name=end t0=$SECONDS last=$((rounds - 1))
partial "$name" $last DIGEST
for w in 0 1; do
    grep -q "psagg_close: every worker is done (waited [0-9]* ms)" "$tmp/$name-worker$w.log" ||
        fail "$name: worker $w did not wait in psagg_close for every worker to be done"
done
echo "$name: server 1 killed after workers 0 and 1 finished and before worker 2 had its last" \
    "updates: server 0 took its chunks over ($(grep -o 'from round [0-9]*' "$tmp/$name-server0.log"))," \
    "workers 0 and 1 (waiting in psagg_close) pushed round $last again, every worker done" \
    "${end_at} s after the kill, bit-identical; worker 0" \
    "$(grep -o 'waited [0-9]* ms' "$tmp/$name-worker0.log"); $((SECONDS - t0)) s"
stop_all
heal 1

# ---- relay: the same in the middle of the job ----
# Workers 0 and 1 have round 40's updates and start round 41 (whose rounds cannot close without
# worker 2), while worker 2 waits for server 1's chunks of round 40; server 0 owns them from round
# 40 and sends round 40 as worker 0 or 1 relays it.
name=relay t0=$SECONDS mid=40
partial "$name" $mid "ROUND $((mid + 1))\$"
echo "$name: server 1 killed once workers 0 and 1 had round $mid's updates and worker 2 not:" \
    "$(grep -h "round $mid's update relayed to server 0" "$tmp/$name"-worker[01].log | wc -l)" \
    "chunk update(s) relayed through server 0, the job done ${end_at} s after the kill," \
    "bit-identical; $((SECONDS - t0)) s"
stop_all
heal 1

# ---- relay-adaptive: the same with adaptive codecs, a relayed update wider than declared ----
# fn_adaptive (maxmin4/512 declared; every output checked bit for bit against its own reference)
# with a new codec assignment every 2 rounds: in rounds 6 to 61 tensors a3 and a4 are at 7 and 8
# bits, so server 1's chunks of them have updates longer than the declared codec's (the bound
# c699380 mended). Worker 2 holds before round 40's pushes until server 1's frames to it are
# dropped; then workers 0 and 1 get round 40's updates and start round 41, and server 1 is
# SIGKILLed. At least one relayed update must be of a tensor at more than 4 bits in round 40.
name=relay-adaptive t0=$SECONDS
keys=(server.threads=2 worker.chunk_bytes=262144 codec.adaptive=on codec.adaptive_interval=2
    codec.adaptive_budget=1.0)
adaptive=1
partial "$name" $mid "ROUND $((mid + 1))\$"
adaptive=0 keys=()
for w in 0 1 2; do
    grep -q '^ADAPTIVE-EXACT' "$tmp/$name-worker$w.log" || fail "$name: worker $w not exact"
done
# each relayed update's tensor and bytes, and that tensor's codec in round $mid (the last switch
# fn_adaptive printed at a round <= $mid: "round R tensor aT: OLD -> NEW (generation G)")
wide=0 relays=""
while read -r t b; do
    c=$(awk -v t="$t:" -v m="$mid" '$1 == "round" && $2 <= m && $4 == t { c = $7 } END { print c }' \
        "$tmp/$name-worker0.log")
    relays+=" $t=$c/${b}B"
    bits=$(sed -n 's/^maxmin\([0-9]*\)\/.*/\1/p' <<<"$c")
    ((${bits:-0} > 4)) && wide=$((wide + 1))
done < <(sed -n "s/.*tensor '\(a[0-9]*\)' chunk [0-9]*: round $mid's update relayed to server 0 (\([0-9]*\) bytes).*/\1 \2/p" \
    "$tmp/$name"-worker[01].log)
((wide > 0)) || fail "$name: no relayed update of round $mid was wider than maxmin4:$relays"
echo "$name: server 1 killed once workers 0 and 1 had round $mid's updates and worker 2 not:" \
    "relayed (tensor=codec/bytes):$relays; $wide wider than the declared maxmin4; every worker" \
    "exact against its own reference and bit-identical, done ${end_at} s after the kill;" \
    "$((SECONDS - t0)) s"
stop_all
heal 1

# ---- relay-quorum: the same with [server] quorum = 2 ----
# Server 1's frames to worker 2 are dropped from round 40 on: worker 2 waits for the first round
# r whose update from server 1 it misses; round r + 1 closes without it if its push of r came
# (all of it: with server 1's ACKs dropped too, worker 2's TCP may stall in the middle of that
# round's pushes, and then r + 1 cannot close on such a chunk, worker 2 two rounds behind), round
# r + 2 cannot (its push of r + 1 never comes), so workers 0 and 1 wait at r + 2, or at r + 1,
# with the updates of the rounds before (worker 2 left out of r + 1 at least). Server 1 SIGKILLed
# then: those rounds are relayed (a sum of the pushes again could not give round r + 1's bytes,
# which leave worker 2 out). fn_worker --straggler 2 checks that every input is summed once
# (worker 2 carries its left-out push into a later one); the workers end bit-identical to each
# other. (In CI the stall left workers 0 and 1 one round past worker 2: the test waited for two.)
name=relay-quorum t0=$SECONDS
keys=(server.quorum=2 server.grace_ms=5)
wargs=(--straggler 2 --straggler-ms 1)
run "$name" -1 0
wargs=()
wait_until 60 grep -qs "^ROUND $mid\$" "$tmp/$name-worker2.log" || fail "$name: worker 2 never reached round $mid"
mute 1 2
# (stuck: workers 0 and 1 past worker 2's last round, and none of the three moving for 0.5 s)
stuck() {
    local r0 r1 r2
    r2=$(latest_round "$tmp/$name-worker2.log") r0=$(latest_round "$tmp/$name-worker0.log")
    r1=$(latest_round "$tmp/$name-worker1.log")
    ((r0 > r2 && r1 > r2)) || return 1
    sleep 0.5
    [ "$(latest_round "$tmp/$name-worker2.log")" = "$r2" ] && [ "$(latest_round "$tmp/$name-worker0.log")" = "$r0" ] &&
        [ "$(latest_round "$tmp/$name-worker1.log")" = "$r1" ] && stuck_at=$r2 ahead=$r0
}
wait_until 20 stuck || fail "$name: worker 2 never fell behind workers 0 and 1 with server 1's frames dropped"
kill -KILL -- "-${spid[1]}"
killed "$name" "$stuck_at"
keys=()
grep -q "the updates over $rounds rounds are every input" "$tmp/$name-worker0.log" ||
    fail "$name: worker 0 has no conservation line"
left=$(sed -n 's/^QUORUM worker 2 left_out \([0-9]*\);.*/\1/p' "$tmp/$name-worker2.log")
((${left:-0} > 0)) || fail "$name: worker 2 was never left out"
n_relayed=$(grep -h "update relayed to server 0" "$tmp/$name"-worker[01].log | wc -l)
echo "$name: quorum 2 of 3, server 1's frames to worker 2 dropped from round $mid: worker 2" \
    "stuck at round $stuck_at, workers 0 and 1 at $ahead; server 1 killed: $n_relayed chunk" \
    "update(s) relayed (rounds $stuck_at to $((ahead - 1))), worker 2 left out of $left" \
    "chunk rounds in all, every input summed once, the workers bit-identical; $((SECONDS - t0)) s"
stop_all
heal 1

# ---- cut-one: server 1 from worker 0 only (a minority) ----
# The workers run with --expect: a failure is what they must see, and like a careful application
# they close the context after it (psagg_close), which sends this worker's ABORT, naming the
# cause, before its connections close. (A worker that exits at once may close them before its
# communication thread sent the ABORT: the other server then knows only "worker N closed the
# control connection", and the workers it tells get no cause.)
name=cut-one t0=$SECONDS
cause="server 1: worker 0 failed: worker 0 sent nothing for"
wargs=(--expect ETIMEDOUT --expect-text "$cause")
run "$name" 1 40 0
wargs=()
# while workers 1 and 2 still reach server 1: their pushes of the round arrive, worker 0's cannot,
# and from 1 s after the cut (before op_timeout_ms) to its exit server 1 closes no round
watch_metrics 1 "$tmp/$name-mlast"
sleep 1
scrape 1 "$tmp/$name-m1" || fail "$name: server 1's metrics do not answer"
wait_workers 30
for w in 0 1 2; do
    if ((rc[w] != 0)) || ! grep -q "^EXPECTED-ERROR-OK" "$tmp/$name-worker$w.log"; then
        fail "$name: worker $w exited ${rc[w]} without the failure naming server 1 and worker 0"
    fi
done
d=$(digests "$name")
[ -z "$d" ] || fail "$name: a worker printed a result with server 1 cut off from worker 0: $d"
for s in 0 1; do
    wait_for "${spid[$s]}" 15
    s_rc=$?
    ((s_rc != 0 && s_rc != 124)) || fail "$name: server $s exited $s_rc after the job failed"
done
r1=$(metric psagg_server_chunk_rounds_total "$tmp/$name-m1")
r2=$(metric psagg_server_chunk_rounds_total "$tmp/$name-mlast")
p0=$(metric 'psagg_server_pushes_total{worker="0"}' "$tmp/$name-mlast")
p1=$(metric 'psagg_server_pushes_total{worker="1"}' "$tmp/$name-mlast")
p2=$(metric 'psagg_server_pushes_total{worker="2"}' "$tmp/$name-mlast")
[ "$r1" = "$r2" ] || fail "$name: server 1 closed rounds while cut off from worker 0: $r1 -> $r2"
((p1 > p0 && p2 > p0)) ||
    fail "$name: workers 1, 2 pushed no more to server 1 than worker 0 ($p1, $p2, $p0)"
((r2 <= p0)) || fail "$name: server 1 closed $r2 chunk rounds with $p0 pushes of worker 0"
# server 1 gives worker 0 up (silent for op_timeout_ms) and fails the job naming it; workers 1
# and 2 hear it from server 1 or from server 0 (told by the other's ABORT), worker 0 from server 0
# (whether or not it had lost server 1 and reported it to server 0 by then: both sides of the cut
# count their silence from the other's last PING)
grep -q "job failed: $cause .* more than op_timeout_ms=3000 (stopped, hung or cut off)" \
    "$tmp/$name-server1.log" || fail "$name: server 1 does not name worker 0 as the cause"
grep -q "worker failed as expected? status .*: server 0 (.*): server 0: worker [12] failed: it gave up: server 1 (.*): $cause" \
    "$tmp/$name-worker0.log" || fail "$name: worker 0's failure does not come from server 0 naming the cause"
! grep -q "proposing view\|server view 1" "$tmp/$name"-*.log ||
    fail "$name: a view was proposed or taken with only worker 0 cut off: $(grep -h "proposing view\|server view 1" "$tmp/$name"-*.log)"
n_drop=$(dropped 1)
((n_drop > 0)) || fail "$name: the cut dropped no packet"
echo "$name: server 1 cut off from worker 0 at round 40: server 1 held pushes of workers 0/1/2" \
    "$p0/$p1/$p2 and closed $r2 chunk rounds (none from 1 s after the cut); no view; worker 0" \
    "$(grep -q 'lost server 1' "$tmp/$name-worker0.log" && echo "had" || echo "had not")" \
    "reported server 1 lost; every" \
    "worker failed naming the cause, worker 0: $(grep -o 'status .*' "$tmp/$name-worker0.log" | cut -c1-200)...;" \
    "$n_drop packets dropped; $((SECONDS - t0)) s"
stop_all
heal 1
# ---- stale-copy: a push lost with its worker's host on one server and summed on the other ----
name=stale-copy t0=$SECONDS
keys=(cluster.elastic=on cluster.min_workers=1 server.error_feedback=on log.level=debug)
wargs=(--codec maxmin4 --error-feedback --rounds 20000 --round-sleep-ms 10 --elastic-dead 2
    --left-epoch -1 --end-file "$tmp/$name.end")
w2args=(--hold "40:$tmp/$name.go")
run "$name" -1 0
keys=() wargs=() w2args=()
wait_until 60 grep -qs "^HOLD before round 40\$" "$tmp/$name-worker2.log" ||
    fail "$name: worker 2 never held before round 40"
ip netns exec "$(nc_ns_host "$P" "$(whost 2)")" nft -f - <<EOF || fail "nft: could not cut worker 2's sends to server 1"
table inet psagg_cut {
    chain out { type filter hook output priority filter; policy accept; ip daddr $(addr 1) counter drop; }
}
EOF
touch "$tmp/$name.go"
sleep 1 # (its pushes of round 40: to server 1 handed to the kernel and dropped, to server 0 summed)
kill -KILL -- "-${wpid[2]}"
wait "${wpid[2]}" 2>/dev/null
ip netns exec "$(nc_ns_host "$P" "$(whost 2)")" nft delete table inet psagg_cut
wait_until 30 grep -qs "this copy is stale" "$tmp/$name-server1.log" ||
    { show_log "$tmp/$name-server1.log"; fail "$name: server 1 found no stale copy (worker 2's round 40 came there?)"; }
wait_until 60 grep -qs "leaves the job and starts anew" "$tmp/$name-server1.log" ||
    { show_log "$tmp/$name-server1.log"; fail "$name: server 1 did not start anew to repair its stale copies"; }
back() { for w in 0 1; do grep -qs "server 1 is back in view" "$tmp/$name-worker$w.log" || return 1; done; }
wait_until 60 back || { show_log "$tmp/$name-worker0.log"; fail "$name: workers 0 and 1 did not take server 1 back"; }
r_back=$(latest_round "$tmp/$name-worker0.log")
on_after() { (($(latest_round "$tmp/$name-worker0.log") >= r_back + 20)); }
wait_until 30 on_after || fail "$name: the job did not go on after server 1 came back"
v_back=$(grep -o 'server 1 is back in view [0-9]*' "$tmp/$name-worker0.log" | tail -n 1 | awk '{ print $NF }')
kill -KILL -- "-${spid[0]}" # (the owner of the chunks whose copies were stale)
taken() { for w in 0 1; do grep -qs "server view $((v_back + 1)):" "$tmp/$name-worker$w.log" || return 1; done; }
wait_until 30 taken ||
    { show_log "$tmp/$name-worker0.log"; fail "$name: workers 0 and 1 did not take view $((v_back + 1)) without server 0"; }
end_after "$tmp/$name.end" 40 "$tmp/$name-worker0.log"
for w in 0 1; do
    wait_for "${wpid[$w]}" 60
    rc[w]=$?
    ((rc[w] == 0)) || { show_log "$tmp/$name-worker$w.log"; fail "$name: worker $w exited ${rc[w]}"; }
done
d=$(grep -h '^DIGEST' "$tmp/$name"-worker[01].log | sort -u)
(($(wc -l <<<"$d") == 1)) && [ -n "$d" ] || fail "$name: workers 0 and 1 end with different digests or none: $d"
n_stale=$(grep -c "this copy is stale" "$tmp/$name-server1.log")
after=$(sed -n '/leaves the job and starts anew/,$p' "$tmp/$name-server1.log" | grep -c "this copy is stale")
((after == 0)) || fail "$name: server 1's copies were stale again after it started anew"
! grep -q "no live server has the chunk's state" "$tmp/$name-server1.log" ||
    fail "$name: server 1 took a chunk over without its state"
check_states 4 "$tmp/$name"-server*.log
at() { grep -h -m 1 "$1" "$2" | awk '{ print $1 }'; } # at TEXT LOG: its first line's time
t_stale=$(at "this copy is stale" "$tmp/$name-server1.log")
t_anew=$(at "leaves the job and starts anew" "$tmp/$name-server1.log")
t_back=$(at "server 1 is back in view" "$tmp/$name-worker0.log")
echo "$name: worker 2's round-40 pushes summed by server 0, lost to server 1 with worker 2:" \
    "$n_stale copies stale on server 1; $(awk -v a="$t_stale" -v b="$t_anew" 'BEGIN { printf "%.2f", b - a }') s" \
    "later it started anew, $(awk -v a="$t_anew" -v b="$t_back" 'BEGIN { printf "%.2f", b - a }') s later" \
    "it was back in view $v_back with their state; server 0 SIGKILLed then, server 1 took every" \
    "chunk over; workers 0 and 1 ended at round $end_n with one digest;$copies $((SECONDS - t0)) s"
stop_all
echo "test_server_partition: ok"
