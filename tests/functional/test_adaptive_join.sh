#!/usr/bin/env bash
# test_adaptive_join.sh BUILD_DIR [PORT] - joins into an elastic job with [codec] adaptive = on.
#
# Two servers; workers = 2, max_workers = 4, a new codec assignment every 2 rounds. Ranks 0 and
# 1 run fn_adaptive for 30 rounds with a barrier (psagg_sync_membership) after each; ranks 2
# and 3 join while it runs:
#   rank 2 at the barrier after round 6, a statistics round: the members reach it with that
#          round's statistics pushed, often not yet summed or solved, and their SYNCs wait for
#          both, so the joiner takes generations 1..4 (none of which it saw), the newest
#          solved from the statistics of round 6;
#   rank 3 at the barrier after round 11, within an interval (generations 3..6).
# The members hold before round 6 (and 11) until server 0 has the joiner's JOIN
# (fn_adaptive --hold), so each is admitted at that barrier. Checks: every worker exits 0; the
# members' outputs equal fn_adaptive's reference bit for bit in every round (each joiner summed
# from the round after its barrier, its residuals starting at zero); each joiner starts at that
# round with that newest generation; every ROUND line of a joiner (the digest of its outputs,
# each tensor's codec and generation) and every ASSIGN line (each tensor's
# psagg_get_assignment before a round) is the members' line of that round, and the members'
# lines are identical; the codecs change after the joins (the joiners take part in the later
# statistics and solves: pushes of a round in different codecs would fail the job); both
# servers exit 0.
set -u -o pipefail
build=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 2 "${2:-}"

job_ini "$tmp/job.ini" 2 2 cluster.max_workers=4 cluster.elastic=on cluster.connect_timeout_ms=20000 \
    cluster.op_timeout_ms=20000 server.threads=2 worker.chunk_bytes=262144 codec.adaptive=on \
    codec.adaptive_interval=2 codec.adaptive_budget=1.0 log.level=info
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=2
start_servers "$tmp/job.ini" 2
args=(30 --sync --joiner 2 --joiner 3 --hold "6:$tmp/go6" --hold "11:$tmp/go11")
start() { # start RANK
    start_worker "$1" "$tmp/worker$1.log" "$build/tests/functional/fn_adaptive" "${args[@]}"
}
# until FILE has a line matching PATTERN (up to 60 s)
await() {
    local k
    for ((k = 0; k < 600; k++)); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "no line '$2' in $(basename "$1") within 60 s"
}
start 0
start 1
# join_at RANK ROUND: start RANK once the members hold before ROUND, let them go on once
# server 0 has its JOIN: the barrier after ROUND admits it
join_at() {
    await "$tmp/worker0.log" "^HOLD before round $2\$"
    start "$1"
    await "$tmp/server0.log" "worker $1 asks to join"
    touch "$tmp/go$2"
}
join_at 2 6
join_at 3 11
wait_all 120 worker wpid
wait_all 30 server spid

for w in 0 1 2 3; do grep -q '^ADAPTIVE-EXACT' "$tmp/worker$w.log" || fail "worker $w printed no result"; done
check_join() { # check_join RANK ROUND NEWEST: joined at ROUND with generation NEWEST the newest
    local first newest
    first=$(sed -n 's/^fn_adaptive .*: joined at round \([0-9]*\),.*/\1/p' "$tmp/worker$1.log")
    [ "$first" = "$2" ] || fail "worker $1 joined at round '$first', expected $2 (the barrier after round $(($2 - 1)))"
    newest=$(sed -n "s/.*adaptive codecs: joined with the members' codec assignments, generation \([0-9]*\) the newest.*/\1/p" "$tmp/worker$1.log")
    [ "$newest" = "$3" ] || fail "worker $1 joined with generation '$newest' the newest, expected $3"
    for m in 0 1; do
        grep -q "^barrier after round $(($2 - 1)) admitted worker $1 " "$tmp/worker$m.log" ||
            fail "worker $m does not say that the barrier after round $(($2 - 1)) admitted worker $1"
    done
}
check_join 2 7 4
check_join 3 12 6

lines() { grep -E '^(ROUND|ASSIGN) ' "$tmp/worker$1.log" | sort; }
lines 0 >"$tmp/lines0"
lines 1 >"$tmp/lines1"
(($(grep -c '^ROUND ' "$tmp/lines0") == 30)) || fail "worker 0 printed $(grep -c '^ROUND ' "$tmp/lines0") ROUND lines, expected 30"
diff "$tmp/lines0" "$tmp/lines1" >/dev/null || fail "the members' ROUND/ASSIGN lines differ"
for j in 2 3; do
    lines $j >"$tmp/lines$j"
    n=$(grep -c '^ROUND ' "$tmp/lines$j")
    first=$(sed -n 's/^fn_adaptive .*: joined at round \([0-9]*\),.*/\1/p' "$tmp/worker$j.log")
    ((n == 30 - first)) || fail "worker $j printed $n ROUND lines, expected $((30 - first))"
    extra=$(comm -23 "$tmp/lines$j" "$tmp/lines0")
    [ -z "$extra" ] || fail "worker $j's lines that are not the members': $(head -3 <<<"$extra")"
    # the codecs it used changed after it joined: it solved later generations as the members did
    n=$(grep '^ROUND ' "$tmp/lines$j" | cut -d' ' -f4- | sed 's/@[0-9]*//g' | sort -u | wc -l)
    ((n >= 2)) || fail "worker $j's codecs never changed after it joined"
    echo "worker $j: joined at round $first; $(grep -c . "$tmp/lines$j") ROUND/ASSIGN lines, each the members'; $n codec sets"
done
grep -h "joined with the members' codec assignments" "$tmp"/worker[23].log
grep '^ROUND 12 \|^ASSIGN 12 ' "$tmp/worker3.log"
grep '^ADAPTIVE-EXACT' "$tmp/worker0.log"
echo "test_adaptive_join: ok"
