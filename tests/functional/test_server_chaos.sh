#!/usr/bin/env bash
# test_server_chaos.sh BUILD_DIR [PART [PORT]] - chaos: servers killed and stopped at random
# times, again and again, and restarted by the launcher ([cluster] server_replicas = 1;
# docs/server-failover.md, "Chaos"). PART: servers (1 to 3 below), elastic (4), or all (the
# default); one ctest entry each.
#
# Each job is fn_worker (3 workers, 3 servers, five tensors checked every round: fp32 bit for bit
# against its own sum, maxmin4 within its bound; --round-sleep-ms 10) under a launcher with
# --restarts K, so that the LAUNCHER starts every killed server again (same command line: same
# rank and port) and it rejoins the running job. A chaos loop then, K times: waits a random
# 0..999 ms, picks a random server, and SIGKILLs it, or SIGSTOPs it (hung, not dead: the workers
# give it up after op_timeout_ms of silence) and SIGKILLs it once every worker took the view
# without it; then it waits until every worker says `server V is back in view E` before the next
# kill: never two servers out at once (R = 1). Each job must end with every worker exiting 0,
# every worker's DIGEST that of the uninterrupted run (bit-identical), every worker K returns,
# and the launcher's summary naming the K restarts. Per kill it prints: the victim, the signal,
# worker 0's round, the time from the kill (the stop) to every worker in the view without it, and
# from the launcher's restart (the restarted server's first log line) to every worker in the view
# with it back.
#   1. loopback, psagg-local --restarts 6: fp32, then maxmin4 (4-bit stochastic rounding: the
#      new owner of a chunk must draw the dead owner's bits, the chunk's own random key), then
#      maxmin4 with [server] error_feedback (a residual per element: every chunk has copies, and
#      each restarted server receives the state of the chunks it holds, relayed by a worker)
#   2. two deaths at once with R = 1 (server 1 killed and left dead, then server 2, which holds
#      server 1's chunks): the job must fail, every worker naming the chunk that is lost (EPEER)
#   3. the emulated cluster (deploy/netcluster.sh: one network namespace per process, 1 Gbit/s
#      links, no same-host copies), psagg-ssh reaching the hosts through deploy/netns-rsh,
#      --restarts 4, fp32: the same checks (root only; skipped with a message otherwise)
#   4. elastic workers too ([cluster] elastic = on, 4 workers, fn_worker --sync --rejoin --loose),
#      psagg-local --restarts 6: each kill SIGKILLs a random server or worker (at least one of
#      each), and waits until every worker took a killed server back, or the killed worker's
#      restart joined the running job; the job must end with every worker exiting 0 and the last
#      10 rounds of all four, each the exact sum of all four, bit-identical (TAIL)
# The chaos is drawn from one seed, printed first; PSAGG_CHAOS_SEED=N replays its choices (the
# victims, signals and delays; the rounds they land at depend on the machine). PSAGG_KEEP_TMP=1
# keeps the logs (one file per job, JOB.log: the launcher's output, every line prefixed by its
# process; a failure shows each one's errors, warnings and last lines).
set -u -o pipefail
build=$(cd -- "${1:?usage: test_server_chaos.sh BUILD_DIR [PART [PORT]]}" && pwd) || exit 2
part=${2:-all}
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
case $part in all | servers | elastic) ;; *) fail "PART is all, servers or elastic, not '$part'" ;; esac
reserve_ports 3 "${3:-}"
server_bin=$build/server/psagg-server
worker_bin=$build/tests/functional/fn_worker
kills=${PSAGG_CHAOS_KILLS:-6}       # loopback: kills per job (and the launcher's --restarts)
nc_kills=${PSAGG_CHAOS_NC_KILLS:-4} # the emulated cluster's
# A chaos job's length is not guessed from the machine's speed (the kills' delays and returns are
# in seconds, a round takes 10 ms to 25 ms): the job runs up to a cap, and once its last victim is
# back the harness ends it `margin` rounds later (fn_worker --end-file, every worker at the same
# round). An uninterrupted run of that many rounds is the reference the job's digest must equal.
cap=${PSAGG_CHAOS_ROUNDS:-20000} # a chaos job's cap in rounds (the end comes long before it)
margin=150                       # rounds after the last kill's victim is back (at least 10: TAIL)
op_ms=2000                          # a stopped server is given up after this
sizes=1,1023,4096,50000,7000
t_begin=$SECONDS

seed=${PSAGG_CHAOS_SEED:-$(((RANDOM << 15) | RANDOM))}
[[ $seed =~ ^[0-9]+$ ]] || { echo "$h_name: PSAGG_CHAOS_SEED=$seed is not a number" >&2; exit 2; }
RANDOM=$seed # (every draw below is in this shell, before anything else uses RANDOM)
echo "$h_name: seed $seed (replay: PSAGG_CHAOS_SEED=$seed ctest -R server_chaos -V)"

# draw_plan NAME K: K kills, in plan_v/plan_sig/plan_ms[NAME,i]: victim, signal, delay before it.
# One kill in four is a SIGSTOP (at least one, at most two: each costs op_timeout_ms).
declare -A plan_v plan_sig plan_ms
draw_plan() {
    local name=$1 k=$2 i stops=0 text=""
    for ((i = 1; i <= k; i++)); do
        plan_v[$name,$i]=$((RANDOM % 3))
        plan_ms[$name,$i]=$((RANDOM % 1000))
        plan_sig[$name,$i]=KILL
        if ((RANDOM % 4 == 0 && stops < 2)); then
            plan_sig[$name,$i]=STOP
            stops=$((stops + 1))
        fi
    done
    ((stops)) || plan_sig[$name,$((RANDOM % k + 1))]=STOP
    for ((i = 1; i <= k; i++)); do
        text+=" SIG${plan_sig[$name,$i]}:server${plan_v[$name,$i]}+${plan_ms[$name,$i]}ms"
    done
    echo "$h_name: plan $name:$text"
}
draw_plan fp32 "$kills"
draw_plan maxmin4 "$kills"
draw_plan netcluster "$nc_kills"
draw_plan maxmin4-ef "$kills" # (after the others: a seed replays them as before)
# the elastic job's: victim 0..2 a server, 3..6 worker victim - 3; all SIGKILL, one of each at least
declare -A el_v el_ms
el_text=""
for ((i = 1; i <= kills; i++)); do
    el_v[$i]=$((RANDOM % 7)) el_ms[$i]=$((RANDOM % 1000))
done
el_v[$((RANDOM % kills + 1))]=$((RANDOM % 3))
i=$((RANDOM % kills + 1))
((el_v[$i] >= 3)) || el_v[$((i % kills + 1))]=$((3 + RANDOM % 4))
for ((i = 1; i <= kills; i++)); do
    if ((el_v[$i] < 3)); then el_text+=" server${el_v[$i]}"; else el_text+=" worker$((el_v[$i] - 3))"; fi
    el_text+="+${el_ms[$i]}ms"
done
echo "$h_name: plan elastic:$el_text"

# every server of this script's jobs gets SIGCONT when it exits (a stopped one would ignore the
# launcher's SIGTERM until its SIGKILL)
cont_servers() {
    local p
    for p in $(pgrep -f -- "^([^ ]*/)?psagg-server --config $tmp/"); do kill -CONT "$p" 2>/dev/null; done
}
at_exit cont_servers

# ---- reading a launcher's output ("[worker 0] 90794.798 worker 0 WARN ...", psagg-ssh: "[HOST
# worker 0] ..."; the log's times are CLOCK_REALTIME seconds modulo 100000, in ms) ----

now() { date +%s.%N | awk '{ printf "%.6f", $1 - int($1 / 100000) * 100000 }'; }

# the awk functions: who(line) the worker's rank of a worker's line (-1: not one), ts(line) its
# log time, dt(a, b) a - b in seconds across the modulo
awk_lib='
function who(line, p, n, a) {
    if (line !~ /^\[[^]]*worker [0-9]+\] /) return -1
    p = substr(line, 2, index(line, "]") - 2); n = split(p, a, " "); return a[n] + 0
}
function is_server(line, s) { return line ~ ("^\\[[^]]*server " s "\\] [0-9]+\\.[0-9]+ ") }
function ts(line, a) { sub(/^\[[^]]*\] /, "", line); split(line, a, " "); return a[1] + 0 }
function dt(a, b, d) { d = a - b; if (d < -50000) d += 100000; if (d > 50000) d -= 100000; return d }
'

# views_after OUT OFF EPOCH: every worker took a view after EPOCH in OUT's lines after OFF
views_after() {
    tail -n +"$(($2 + 1))" "$1" | awk -v pe="$3" "$awk_lib"'
        { w = who($0) } w >= 0 && match($0, / server view [0-9]+:/) &&
            substr($0, RSTART + 13, RLENGTH - 14) + 0 > pe { got[w] = 1 }
        END { exit !(got[0] && got[1] && got[2]) }'
}

# all_back OUT OFF SERVER EPOCH: every worker says "server SERVER is back in view E", E > EPOCH
all_back() {
    tail -n +"$(($2 + 1))" "$1" | awk -v s="$3" -v pe="$4" "$awk_lib"'
        { w = who($0) } w >= 0 && $0 ~ (" server " s " is back in view [0-9]+$") && $NF + 0 > pe { got[w] = 1 }
        END { exit !(got[0] && got[1] && got[2]) }'
}

# figures OUT OFF SERVER EPOCH T_SIG T_KILL: "E_OUT MS_OUT E_BACK MS_BACK MS_KILL_BACK" of one
# kill: the view without it and the time from T_SIG (the kill or the stop) to the last worker in
# it; the view with it back and the time from its restart (its first log line after T_KILL, the
# SIGKILL) to the last worker in it, and from T_KILL
figures() {
    tail -n +"$(($2 + 1))" "$1" | awk -v s="$3" -v pe="$4" -v t0="$5" -v t1="$6" "$awk_lib"'
        { w = who($0) }
        w >= 0 && !(w in out) && match($0, / server view [0-9]+:/) {
            e = substr($0, RSTART + 13, RLENGTH - 14) + 0
            if (e > pe) { out[w] = ts($0); if (e > e_out) e_out = e }
        }
        w >= 0 && !(w in back) && $0 ~ (" server " s " is back in view [0-9]+$") && $NF + 0 > pe {
            back[w] = ts($0); if ($NF + 0 > e_back) e_back = $NF + 0
        }
        !start && is_server($0, s) && dt(ts($0), t1) >= -0.001 { start = ts($0) }
        END {
            for (w = 0; w < 3; w++) {
                if (!(w in out) || !(w in back)) { print "- - - - -"; exit }
                if (w == 0 || dt(out[w], lo) > 0) lo = out[w]
                if (w == 0 || dt(back[w], lb) > 0) lb = back[w]
            }
            printf "%d %.0f %d %s %.0f\n", e_out, dt(lo, t0) * 1000, e_back,
                start ? sprintf("%.0f", dt(lb, start) * 1000) : "-", dt(lb, t1) * 1000
        }'
}

# ---- the chaos ----

# chaos PLAN OUT K PIDFN: the plan's K kills against the running job that writes OUT; PIDFN
# SERVER prints that server's pid. Figures per kill in fig_out/fig_back[PLAN,i].
declare -A fig_out fig_back fig_sig
chaos() {
    local plan=$1 out=$2 k=$3 pidfn=$4 i v sig ms pid r off t0 t1 pe=0 f
    local -a x
    wait_until 60 grep -q 'worker 0\] ROUND 20$' "$out" || fail "$plan: worker 0 never reached round 20"
    for ((i = 1; i <= k; i++)); do
        v=${plan_v[$plan,$i]} sig=${plan_sig[$plan,$i]} ms=${plan_ms[$plan,$i]}
        sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
        r=$(latest_round "$out" 0)
        ((r <= cap - margin)) || fail "$plan: worker 0 is at round $r of the cap $cap before" \
            "kill $i of $k: the chaos outlasts the cap (PSAGG_CHAOS_ROUNDS)"
        pid=$($pidfn "$v")
        [[ $pid =~ ^[0-9]+$ ]] || fail "$plan: kill $i: no single psagg-server of rank $v: '$pid'"
        off=$(wc -l <"$out")
        t0=$(now)
        kill -"$sig" "$pid" || fail "$plan: kill $i: kill -$sig server $v ($pid) failed"
        t1=$t0
        if [[ $sig == STOP ]]; then # given up after op_timeout_ms; then killed, to be restarted
            wait_until $((op_ms / 1000 + 30)) views_after "$out" "$off" "$pe" ||
                fail "$plan: kill $i: server $v stopped at round $r, and not every worker took a" \
                    "view without it within $((op_ms / 1000 + 30)) s"
            t1=$(now)
            kill -KILL "$pid"
        fi
        wait_until 60 all_back "$out" "$off" "$v" "$pe" ||
            fail "$plan: kill $i: server $v SIG$sig at round $r (seed $seed): not every worker" \
                "took it back within 60 s"
        f=$(figures "$out" "$off" "$v" "$pe" "$t0" "$t1")
        read -ra x <<<"$f"
        [[ ${x[0]} != - ]] || fail "$plan: kill $i: the figures of server $v's kill are missing: $f"
        fig_out[$plan,$i]=${x[1]} fig_back[$plan,$i]=${x[3]} fig_sig[$plan,$i]=$sig
        printf '%s: kill %d of %d: server %d SIG%s at round %d: every worker in view %d without it' \
            "$plan" "$i" "$k" "$v" "$sig" "$r" "${x[0]}"
        printf ' %s ms after the %s; restarted, every worker in view %d with it back %s ms after' \
            "${x[1]}" "$([[ $sig == STOP ]] && echo stop || echo kill)" "${x[2]}" "${x[3]}"
        printf ' its restart (%s ms after the SIGKILL)\n' "${x[4]}"
        pe=${x[2]}
    done
}

# check_job PLAN OUT LPID K L REF LABELFN: the launcher L (pid LPID, ended) ran the job to its
# end: every worker's DIGEST REF, K returns at every worker, K restarts in its summary; LABELFN
# SERVER is how L names a server
check_job() {
    local plan=$1 out=$2 lpid=$3 k=$4 l=$5 ref=$6 labelfn=$7 w s n d line deaths
    local -A per=()
    d=$(grep -h '^\[[^]]*worker [0-2]\] DIGEST' "$out" | sed 's/.*DIGEST //' | sort -u)
    (($(grep -c '^\[[^]]*worker [0-2]\] DIGEST' "$out") == 3 && $(wc -l <<<"$d") == 1)) ||
        fail "$plan: the workers' digests differ or are missing: $d"
    [[ $d == "$ref" ]] || fail "$plan: digest $d, the uninterrupted run's $ref (seed $seed)"
    for w in 0 1 2; do
        n=$(grep -c "^\[[^]]*worker $w\] .* server [0-2] is back in view [0-9]*$" "$out")
        ((n == k)) || fail "$plan: worker $w took $n server(s) back, not $k"
    done
    n=$(grep -c "^$l: .* died with status 137 (killed by SIGKILL): restarted (restart [0-9]* of $k); it rejoins the running job$" "$out")
    ((n == k)) || fail "$plan: $l restarted $n server(s), not $k"
    grep -qxF "$l: summary: ok, $k restart(s) of --restarts $k" "$out" ||
        fail "$plan: no summary line '$l: summary: ok, $k restart(s) of --restarts $k'"
    for ((w = 1; w <= k; w++)); do per[${plan_v[$plan,$w]}]=$((${per[${plan_v[$plan,$w]}]:-0} + 1)); done
    for s in "${!per[@]}"; do
        deaths=""
        for ((w = 0; w < per[$s]; w++)); do deaths+="${deaths:+, }status 137 (killed by SIGKILL)"; done
        line="$l:   $($labelfn "$s"): restarted ${per[$s]} time(s) (--restarts), after $deaths"
        grep -qxF -- "$line" "$out" || fail "$plan: no summary line '$line'"
    done
}

# stats PLAN K: the kills' figures, min / median / max
stats() {
    local plan=$1 k=$2 i kill_out="" stop_out="" back=""
    for ((i = 1; i <= k; i++)); do
        back+="${fig_back[$plan,$i]} "
        if [[ ${fig_sig[$plan,$i]} == STOP ]]; then stop_out+="${fig_out[$plan,$i]} "; else kill_out+="${fig_out[$plan,$i]} "; fi
    done
    mmm() { tr ' ' '\n' <<<"$1" | grep -v '^-\?$' | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) printf "%d / %d / %d ms (%d)", v[1], v[int((NR + 1) / 2)], v[NR], NR; else printf "none" }'; }
    echo "$plan: min / median / max: SIGKILL to every worker in the view without it $(mmm "$kill_out");" \
        "SIGSTOP to it $(mmm "$stop_out") (op_timeout_ms=$op_ms); restart to every worker in the view" \
        "with it back $(mmm "$back")"
}

# (argv[0] first: not a wrapper whose command line holds the server's, as psagg-ssh's does)
local_pid() { pgrep -f -- "^([^ ]*/)?psagg-server --config $ini --rank $1\$"; }

if [[ $part != elastic ]]; then
# ---- 1. loopback, psagg-local ----

job_ini "$tmp/job.ini" 3 3 cluster.server_replicas=1 cluster.op_timeout_ms=$op_ms log.level=info
job_ini "$tmp/job-ef.ini" 3 3 cluster.server_replicas=1 cluster.op_timeout_ms=$op_ms log.level=info \
    server.error_feedback=on
ini=$tmp/job.ini # (the loopback jobs' configuration: job-ef.ini for maxmin4-ef)
local_label() { echo "server $1 (127.0.0.1:$((port + $1)))"; }
local_job() { # LOG CODEC [LAUNCHER ARGS...] -- [WORKER ARGS...]: spawned (h_pid)
    local log=$1 codec=$2 a=()
    shift 2
    while (($#)) && [[ $1 != -- ]]; do a+=("$1"); shift; done
    shift
    spawn "$log" "$repo/deploy/psagg-local" --config "$ini" --server-bin "$server_bin" \
        --timeout 150 --grace 1 ${a[@]+"${a[@]}"} -- "$worker_bin" --codec "$codec" --sizes $sizes \
        --rounds "$cap" "$@"
}
# job_done PLAN LPID L: the launcher L of the job (pid LPID) exits 0
job_done() {
    wait_for "$2" 150
    local rc=$?
    ((rc == 0)) || fail "$1: $3 exited $rc (seed $seed)"
}
# ref_run PLAN CODEC N: the job (configuration $ini) without a death for N rounds: its digest in
# ref[PLAN] (no sleep: the digest does not depend on it)
declare -A ref
ref_run() {
    local plan=$1 t0=$SECONDS
    local_job "$tmp/ref-$plan.log" "$2" -- --rounds "$3"
    wait_for "$h_pid" 150 || fail "ref-$plan: psagg-local exited $?"
    ref[$plan]=$(grep -h '^\[worker [0-2]\] DIGEST' "$tmp/ref-$plan.log" | sed 's/.*DIGEST //' | sort -u)
    (($(grep -c '^\[worker [0-2]\] DIGEST' "$tmp/ref-$plan.log") == 3 && $(wc -l <<<"${ref[$plan]}") == 1)) ||
        fail "ref-$plan: the workers' digests differ or are missing: ${ref[$plan]}"
    echo "ref-$plan: $3 rounds without a death, $((SECONDS - t0)) s: ${ref[$plan]}"
}

for plan in fp32 maxmin4 maxmin4-ef; do
    codec=${plan%-ef} ini=$tmp/job.ini
    [[ $plan == *-ef ]] && ini=$tmp/job-ef.ini
    t0=$SECONDS
    local_job "$tmp/chaos-$plan.log" "$codec" --restarts "$kills" -- --round-sleep-ms 10 --progress \
        --end-file "$tmp/end-$plan"
    lp=$h_pid
    chaos "$plan" "$tmp/chaos-$plan.log" "$kills" local_pid
    end_after "$tmp/end-$plan" "$margin" "$tmp/chaos-$plan.log" 0
    job_done "$plan" "$lp" psagg-local
    ref_run "$plan" "$codec" "$end_n"
    check_job "$plan" "$tmp/chaos-$plan.log" "$lp" "$kills" psagg-local "${ref[$plan]}" local_label
    stats "$plan" "$kills"
    if [[ $plan == *-ef ]]; then # every return with the state of its chunks (none without it)
        n=$(grep -c "the state of its [0-9]* chunk(s) with copies came" "$tmp/chaos-$plan.log")
        ((n == kills)) || fail "$plan: $n of $kills returns received their chunks' state (seed $seed)"
        ! grep -q "comes back without it" "$tmp/chaos-$plan.log" ||
            fail "$plan: a return without its chunks' state: $(grep -m1 "comes back without it" "$tmp/chaos-$plan.log")"
    fi
    echo "$plan: $kills kills, every worker bit-identical to the uninterrupted run (${ref[$plan]})," \
        "$kills restarts in psagg-local's summary; $((SECONDS - t0)) s"
done
ini=$tmp/job.ini

# ---- 2. two servers out at once with R = 1: the job fails naming the chunk ----
t0=$SECONDS
cause="its layout owner 1 and its 1 replica(s) are all gone"
local_job "$tmp/two-lost.log" fp32 --keep-going -- --round-sleep-ms 10 --progress \
    --expect EPEER --expect-text "$cause"
lp=$h_pid
wait_until 60 grep -q 'worker 0\] ROUND 30$' "$tmp/two-lost.log" || fail "two-lost: worker 0 never reached round 30"
kill -KILL "$(local_pid 1)"
wait_until 30 views_after "$tmp/two-lost.log" 0 0 || fail "two-lost: not every worker took view 1 without server 1"
kill -KILL "$(local_pid 2)"
wait_for "$lp" 60
rc=$?
((rc == 0 || rc == 1)) || fail "two-lost: psagg-local exited $rc"
for w in 0 1 2; do
    grep -q "^\[worker $w\] EXPECTED-ERROR-OK" "$tmp/two-lost.log" ||
        fail "two-lost: worker $w did not fail naming the lost chunk ('$cause')"
done
! grep -q '^\[worker [0-2]\] DIGEST' "$tmp/two-lost.log" || fail "two-lost: a worker printed a result"
echo "two-lost: servers 1 then 2 SIGKILLed (R = 1), no restart: every worker failed:" \
    "$(grep '^\[worker 0\] ' "$tmp/two-lost.log" | grep -m 1 -o 'server 2 was lost, and with it .*'); $((SECONDS - t0)) s"

# ---- 3. the emulated cluster, psagg-ssh through netns-rsh ----
nc_skip() { echo "$h_name: SKIP the emulated cluster: $*"; }
nc_ok=1
if [[ $(id -u) != 0 ]]; then
    nc_skip "needs root (network namespaces)"
    nc_ok=0
else
    for t in ip tc unshare setsid; do
        command -v "$t" >/dev/null 2>&1 || { nc_skip "'$t' not found (deploy/install-deps.sh)"; nc_ok=0; break; }
    done
    ((nc_ok)) && ! ip netns list >/dev/null 2>&1 && { nc_skip "network namespaces unavailable"; nc_ok=0; }
fi
if ((nc_ok)); then
    t0=$SECONDS
    NC=$repo/deploy/netcluster.sh
    "$NC" cleanup --prefix psgc >/dev/null 2>&1 # (clusters of a killed earlier run of this test)
    P="psgc$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"
    at_exit "\"$NC\" down --prefix $P >/dev/null 2>&1"
    "$NC" up --hosts 6 --rate 1gbit --prefix "$P" --owner-pid $$ >/dev/null 2>"$tmp/up.err" ||
        fail "netcluster up failed: $(cat "$tmp/up.err")"
    # servers 0..2 on hosts 0..2 (10.77.0.10-12), workers 0..2 on hosts 3..5
    job_ini "$tmp/nc.ini" 3 3 cluster.job_id="chaos-$P" cluster.servers="10.77.0.10:19500 10.77.0.11:19500 10.77.0.12:19500" \
        cluster.worker_hosts="10.77.0.13:1 10.77.0.14:1 10.77.0.15:1" cluster.server_replicas=1 \
        cluster.op_timeout_ms=$op_ms cluster.local_copy=off log.level=info
    nc_pid() { pgrep -f -- "^([^ ]*/)?psagg-server --config $tmp/nc.ini --rank $1\$"; }
    nc_label() { echo "10.77.0.1$1 server $1 (10.77.0.1$1:19500)"; }
    spawn "$tmp/chaos-netcluster.log" NETCLUSTER_PREFIX="$P" "$repo/deploy/psagg-ssh" --config "$tmp/nc.ini" \
        --ssh "$repo/deploy/netns-rsh" --server-bin "$server_bin" --timeout 150 --grace 1 \
        --restarts "$nc_kills" -- "$worker_bin" --codec fp32 --sizes $sizes --rounds "$cap" \
        --round-sleep-ms 10 --progress --end-file "$tmp/end-netcluster"
    lp=$h_pid
    chaos netcluster "$tmp/chaos-netcluster.log" "$nc_kills" nc_pid
    end_after "$tmp/end-netcluster" "$margin" "$tmp/chaos-netcluster.log" 0
    job_done netcluster "$lp" psagg-ssh
    # (the digest of the same job on loopback: a sum does not depend on the transport)
    ref_run netcluster fp32 "$end_n"
    check_job netcluster "$tmp/chaos-netcluster.log" "$lp" "$nc_kills" psagg-ssh "${ref[netcluster]}" nc_label
    stats netcluster "$nc_kills"
    echo "netcluster: $nc_kills kills, every worker bit-identical to the uninterrupted run" \
        "(${ref[netcluster]}), $nc_kills restarts in psagg-ssh's summary; $((SECONDS - t0)) s"
fi
fi

# ---- 4. elastic workers with replicas: servers and workers killed, psagg-local restarts them ----
# says_all OUT OFF ERE: every worker 0..3 has a line matching ERE after OFF
says_all() {
    tail -n +"$(($2 + 1))" "$1" | awk -v re="$3" "$awk_lib"'
        { w = who($0) } w >= 0 && $0 ~ re { got[w] = 1 }
        END { exit !(got[0] && got[1] && got[2] && got[3]) }'
}
# says OUT OFF W ERE: worker W has a line matching ERE after OFF
says() { tail -n +"$(($2 + 1))" "$1" | grep -qE "^\[worker $3\] .*$4"; }
# the fn_worker of rank W of this job (its environment names it)
worker_pid() {
    local p
    for p in $(pgrep -f -- "^([^ ]*/)?fn_worker .*--rejoin"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "PSAGG_CONFIG=$ini" &&
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "PSAGG_RANK=$1" && echo "$p"
    done
}
if [[ $part != servers ]]; then
    t0=$SECONDS
    ini=$tmp/job-elastic.ini
    job_ini "$ini" 3 4 cluster.job_id="chaos-el-$port" cluster.elastic=on cluster.min_workers=1 \
        cluster.server_replicas=1 cluster.op_timeout_ms=$op_ms cluster.connect_timeout_ms=4000 \
        log.level=info
    out=$tmp/chaos-elastic.log
    spawn "$out" "$repo/deploy/psagg-local" --config "$ini" --server-bin "$server_bin" --timeout 240 \
        --grace 1 --restarts "$kills" -- "$worker_bin" --codec fp32 --sizes $sizes --rounds "$cap" \
        --sync --round-sleep-ms 10 --progress --elastic-dead 3 --rejoin --loose --left-epoch -1 \
        --end-file "$tmp/end-elastic"
    lp=$h_pid
    wait_until 60 grep -q 'worker 0\] ROUND 20$' "$out" || fail "elastic: worker 0 never reached round 20"
    for ((i = 1; i <= kills; i++)); do
        v=${el_v[$i]} ms=${el_ms[$i]}
        sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
        r=$(latest_round "$out" 0)
        ((r <= cap - margin)) || fail "elastic: worker 0 is at round $r of the cap $cap before" \
            "kill $i of $kills: the chaos outlasts the cap (PSAGG_CHAOS_ROUNDS)"
        off=$(wc -l <"$out")
        t1=$(now)
        if ((v < 3)); then
            pid=$(local_pid "$v")
            [[ $pid =~ ^[0-9]+$ ]] || fail "elastic: kill $i: no single psagg-server of rank $v: '$pid'"
            kill -KILL "$pid"
            wait_until 60 says_all "$out" "$off" " server $v is back in view [0-9]+$" ||
                fail "elastic: kill $i: server $v SIGKILLed at round $r (seed $seed): not every" \
                    "worker took it back within 60 s"
            what="server $v"
        else
            w=$((v - 3))
            pid=$(worker_pid $w)
            [[ $pid =~ ^[0-9]+$ ]] || fail "elastic: kill $i: no single fn_worker of rank $w: '$pid'"
            kill -KILL "$pid"
            wait_until 60 says "$out" "$off" $w "joined the running job" ||
                fail "elastic: kill $i: worker $w SIGKILLed at round $r (seed $seed): its restart" \
                    "did not join within 60 s"
            what="worker $w"
        fi
        printf 'elastic: kill %d of %d: %s SIGKILLed at round %d: back in the job %.1f s later\n' \
            "$i" "$kills" "$what" "$r" "$(awk -v a="$(now)" -v b="$t1" 'BEGIN { print a - b }')"
    done
    end_after "$tmp/end-elastic" "$margin" "$out" 0
    wait_for "$lp" 240
    rc=$?
    ((rc == 0)) || fail "elastic: psagg-local exited $rc (seed $seed)"
    d=$(grep -h '^\[worker [0-3]\] TAIL' "$out" | awk '{ print $4 }' | sort -u)
    (($(grep -c '^\[worker [0-3]\] TAIL' "$out") == 4 && $(wc -l <<<"$d") == 1)) ||
        fail "elastic: the last rounds' digests of the 4 workers differ or are missing: $d"
    grep -qxF "psagg-local: summary: ok, $kills restart(s) of --restarts $kills" "$out" ||
        fail "elastic: no summary line 'psagg-local: summary: ok, $kills restart(s) of --restarts $kills'"
    echo "elastic: $kills kills ($el_text ), ended at round $end_n; every worker's last 10 rounds the" \
        "exact sum of all four, bit-identical (TAIL $d); $kills restarts in psagg-local's summary; $((SECONDS - t0)) s"
fi
echo "$h_name: ok (seed $seed, $((SECONDS - t_begin)) s)"
