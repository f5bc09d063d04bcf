#!/usr/bin/env bash
# test_launcher.sh - functional test of deploy/psagg-local with fake servers and workers.
# psagg-local is the local backend of psagg.launch (worker/python/psagg/launch.py), the
# supervisor psagg-ssh and psagg-slurm share: its rules are tested here, once.
#
# Usage: tests/functional/test_launcher.sh LAUNCHER PSAGG_SERVER
#   PSAGG_SERVER: a real psagg-server; its --check-config reads the config for the launcher
#
# Checks: the success path (exit 0, prefixed stdout and stderr lines from every rank, rank
# environment, config path, arguments), --workers/--servers overrides, a failing worker
# (non-zero exit naming it; every other process, grandchildren included, gone), a server
# dying early, a server that ignores SIGTERM (SIGKILL after --grace), SIGINT and SIGTERM to
# the launcher (130/143, nothing left), --timeout (124), usage errors, and --restarts: an
# elastic job's failed worker started again, and with [cluster] server_replicas a dead server
# started again with its command line (once the restarts are spent the job goes on without
# it; not one that exited 0 or died while the job stopped; a worker's failure still ends the
# job; --restarts with neither key refused naming both, psagg-ssh --dry-run too). Every
# launcher run has its own time limit; the whole test takes about half a minute. Exit 0 = all
# passed.
set -u

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
launcher=${1:-$repo/deploy/psagg-local}
REAL_SERVER=${2:-$repo/build/server/psagg-server}
export REAL_SERVER
conf=$(realpath -- "$repo/conf/local.ini")
T=$tmp
export T
failures=0
started=$SECONDS

# Fake processes record their pids (and their background children's) under $T/pids.
kill_recorded() {
    local f
    for f in "$T"/pids/*; do
        [[ -e $f ]] && kill -KILL "${f##*.}" 2>/dev/null
    done
}
at_exit kill_recorded

# (this test counts its failures and goes on: its own fail, not the harness's)
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
pass() { echo "ok: $*"; }

[[ -x $launcher ]] || {
    echo "FAIL: launcher $launcher is not executable" >&2
    exit 1
}
command -v ps >/dev/null || {
    echo "SKIP: ps (procps) is needed to look for leftover processes" >&2
    exit 77
}

mkdir -p "$T/pids"
cat >"$T/fakeserver" <<'EOF'
#!/bin/sh
# Fake psagg-server: --check-config is the real psagg-server's (the launcher reads the config
# through it), plus one libfabric variable for the launcher to pass on; otherwise it records
# its pid, prints its environment, sleeps until SIGTERM.
if [ "$3" = --check-config ]; then
    "$REAL_SERVER" --config "$2" --check-config || exit
    echo FI_FAKE_LIMIT=4096
    exit 0
fi
if [ "$3" = --fabric-env ]; then # launchers before --check-config asked for this alone
    echo FI_FAKE_LIMIT=4096
    exit 0
fi
# (its TERM trap first: its pid file says it is set, which FAKE_WAIT_SERVERS waits for)
if [ -n "${FAKE_SERVER_IGNORE_TERM:-}" ]; then
    trap '' TERM
else
    trap 'echo "server $PSAGG_SERVER_RANK got TERM"; exit 0' TERM
fi
if [ -n "${FAKE_SERVER_TERM_RC:-}" ]; then # dies (non-zero) when stopped
    trap 'echo "server $PSAGG_SERVER_RANK got TERM"; exit $FAKE_SERVER_TERM_RC' TERM
fi
echo "server up rank=$PSAGG_SERVER_RANK cfg=$PSAGG_CONFIG wrank=${PSAGG_RANK-unset} fi=${FI_FAKE_LIMIT-unset} args=$*"
echo "server stderr rank=$PSAGG_SERVER_RANK" >&2
echo $$ >"$T/pids/server.$PSAGG_SERVER_RANK.$$"
# FAKE_SERVER_DIE_RANK dies 0.3 s (FAKE_SERVER_DIE_AFTER) after its start (exit 5, or
# FAKE_SERVER_DIE_SIG), every time or with FAKE_SERVER_DIE_ONCE only the first time;
# FAKE_SERVER_EXIT0_RANK exits 0 after 0.3 s
if [ "${FAKE_SERVER_DIE_RANK:-none}" = "$PSAGG_SERVER_RANK" ] &&
    { [ -z "${FAKE_SERVER_DIE_ONCE:-}" ] || mkdir "$T/died.$PSAGG_SERVER_RANK" 2>/dev/null; }; then
    sleep "${FAKE_SERVER_DIE_AFTER:-0.3}"
    echo "server $PSAGG_SERVER_RANK dying"
    [ -n "${FAKE_SERVER_DIE_SIG:-}" ] && kill -"$FAKE_SERVER_DIE_SIG" $$
    exit 5
fi
if [ "${FAKE_SERVER_EXIT0_RANK:-none}" = "$PSAGG_SERVER_RANK" ]; then
    sleep 0.3
    echo "server $PSAGG_SERVER_RANK done"
    exit 0
fi
while :; do
    sleep 1 &
    echo $! >"$T/pids/server-sleep.$PSAGG_SERVER_RANK.$!"
    wait $!
done
EOF
cat >"$T/fakeworker" <<'EOF'
#!/bin/sh
# Fake worker. FAKE_MODE: ok (print and exit 0), fail (rank 2 exits 3, the others hang),
# hang (all hang). Hanging workers leave a background grandchild in their process group.
# FAKE_WAIT_SERVERS=N: first wait (up to 10 s) until N fake servers are up, their TERM traps
# set (a job that ends at once stopped a server still starting, before its trap: killed
# without a word, 1 run in many under load)
echo $$ >"$T/pids/worker.$PSAGG_RANK.$$"
n=0
while [ "$(ls "$T"/pids/server.* 2>/dev/null | wc -l)" -lt "${FAKE_WAIT_SERVERS:-0}" ] && [ $n -lt 200 ]; do
    sleep 0.05
    n=$((n + 1))
done
echo "worker rank=$PSAGG_RANK size=$PSAGG_WORLD_SIZE cfg=$PSAGG_CONFIG srank=${PSAGG_SERVER_RANK-unset} cw=${PSAGG_CLUSTER_WORKERS-unset} cs=${PSAGG_CLUSTER_SERVERS-unset} fi=${FI_FAKE_LIMIT-unset} args=$*"
echo "worker stderr rank=$PSAGG_RANK" >&2
case $FAKE_MODE in
ok) exit 0 ;;
stream) # one line, then a pause: the line must be out before the worker ends
    echo "stream first rank=$PSAGG_RANK"
    touch "$T/ready.$PSAGG_RANK"
    sleep 3
    exit 0
    ;;
sleep) # runs 1.5 s, then exits 0
    sleep 1.5
    exit 0
    ;;
failonce) # rank 2 exits 3 in its first start (PSAGG_RESTART=0), 0 in the next; the other
    # ranks run on meanwhile (a job whose other workers all finished first restarts nobody)
    sleep 0.3
    [ "$PSAGG_RANK" = 2 ] && [ "$PSAGG_RESTART" = 0 ] && exit 3
    [ "$PSAGG_RANK" != 2 ] && sleep 2
    echo "worker $PSAGG_RANK start $PSAGG_RESTART done"
    exit 0
    ;;
chatty) # a line every 0.1 s until stopped
    touch "$T/ready.$PSAGG_RANK"
    while :; do echo "chatty rank=$PSAGG_RANK"; sleep 0.1; done
    ;;
fail | hang)
    sleep 300 &
    echo $! >"$T/pids/grandchild.$PSAGG_RANK.$!"
    touch "$T/ready.$PSAGG_RANK"
    if [ "$FAKE_MODE" = fail ] && [ "$PSAGG_RANK" = 2 ]; then
        sleep 0.3
        exit 3
    fi
    wait
    ;;
esac
EOF
chmod +x "$T/fakeserver" "$T/fakeworker"

# Run the launcher with a hard limit; stdout -> $T/out, stderr -> $T/err, status -> $rc.
run() {
    timeout -k 5 30 "$launcher" "$@" >"$T/out" 2>"$T/err"
    rc=$?
}

# No process from this test may survive a launcher run (zombies awaiting a slow init are
# already dead and do not count).
check_no_leftovers() { # case name
    local f pid st left="" listing
    for f in "$T"/pids/*; do
        [[ -e $f ]] || continue
        pid=${f##*.}
        st=$(ps -o stat= -p "$pid" 2>/dev/null)
        if [[ -n $st && $st != Z* ]]; then
            left+=" $(basename -- "$f")"
        fi
    done
    listing=$(ps -eo stat=,args=)
    if grep -v '^Z' <<<"$listing" | grep -qF -- "$T/"; then
        left+=" [$(grep -v '^Z' <<<"$listing" | grep -F -- "$T/" | tr '\n' ';')]"
    fi
    if [[ -n $left ]]; then
        fail "$1: processes left behind:$left"
        kill_recorded
    else
        pass "$1: no processes left"
    fi
    rm -f "$T"/pids/* "$T"/ready.*
}

expect_line() { # case file line
    grep -qxF -- "$3" "$2" || fail "$1: no line '$3' in $(basename -- "$2"):$(sed 's/^/    /' "$2")"
}

count() { # glob: number of existing matches
    local n=0 f
    for f in "$@"; do [[ -e $f ]] && n=$((n + 1)); done
    echo "$n"
}

# Wait until every worker has reported ready and the servers have started (at most 10 s).
wait_ready() { # n_workers n_servers
    local i
    for ((i = 0; i < 200; i++)); do
        if (($(count "$T"/ready.*) >= $1 && $(count "$T"/pids/server.*) >= $2)); then
            return 0
        fi
        sleep 0.05
    done
    return 1
}

# ---- 1. success: every rank prints, ranks and config are right, servers are stopped ----
FAKE_MODE=ok FAKE_WAIT_SERVERS=2 run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" -- "$T/fakeworker" a 'b c'
if ((rc == 0)); then pass "success: exit 0"; else fail "success: exit $rc; stderr: $(cat "$T/err")"; fi
for i in 0 1 2 3; do
    expect_line success "$T/out" "[worker $i] worker rank=$i size=4 cfg=$conf srank=unset cw=unset cs=unset fi=4096 args=a b c"
    expect_line success "$T/out" "[worker $i] worker stderr rank=$i"
done
for i in 0 1; do
    expect_line success "$T/out" "[server $i] server up rank=$i cfg=$conf wrank=unset fi=4096 args=--config $conf --rank $i"
    expect_line success "$T/out" "[server $i] server stderr rank=$i"
    expect_line success "$T/out" "[server $i] server $i got TERM"
done
n=$(grep -c '^\[worker' "$T/out")
((n == 8)) || fail "success: expected 8 worker lines, got $n"
grep -v '^\[\(worker [0-3]\|server [01]\)\] ' "$T/out" | grep -q . &&
    fail "success: unprefixed or unexpected lines: $(grep -v '^\[\(worker [0-3]\|server [01]\)\] ' "$T/out")"
check_no_leftovers success

# A plain `sh -c` program, and PSAGG_SERVER_BIN instead of --server-bin.
# shellcheck disable=SC2016 # expanded by the worker's sh
PSAGG_SERVER_BIN=$T/fakeserver timeout -k 5 30 "$launcher" --config "$repo/conf/local.ini" -- \
    sh -c 'while [ "$(ls "$T"/pids/server.* 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.05; done
        echo "sh rank $PSAGG_RANK of $PSAGG_WORLD_SIZE"' >"$T/out" 2>"$T/err"
rc=$?
((rc == 0)) || fail "sh -c: exit $rc; stderr: $(cat "$T/err")"
for i in 0 1 2 3; do expect_line "sh -c" "$T/out" "[worker $i] sh rank $i of 4"; done
expect_line "sh -c" "$T/out" "[server 1] server 1 got TERM"
check_no_leftovers "sh -c"

# torchrun's variables; --keep-going lets the other workers finish after one fails (exit 1)
# shellcheck disable=SC2016 # expanded by the worker's sh
PSAGG_SERVER_BIN=$T/fakeserver timeout -k 5 30 "$launcher" --config "$repo/conf/local.ini" --keep-going -- \
    sh -c '[ "$RANK" = 0 ] && exit 3; sleep 0.5; echo "rank $RANK/$WORLD_SIZE local $LOCAL_RANK at $MASTER_ADDR:$MASTER_PORT done"' \
    >"$T/out" 2>"$T/err"
rc=$?
((rc == 1)) || fail "keep-going: exit $rc, expected 1; stderr: $(cat "$T/err")"
port=$(sed -n 's/.*at 127\.0\.0\.1:\([0-9]*\) done$/\1/p' "$T/out" | sort -u)
[[ $port =~ ^[0-9]+$ ]] && ((port >= 20000 && port < 32768)) || fail "keep-going: MASTER_PORT '$port'"
for i in 1 2 3; do expect_line keep-going "$T/out" "[worker $i] rank $i/4 local $i at 127.0.0.1:$port done"; done
grep -q "worker 0 failed with exit code 3; the other workers go on" "$T/err" ||
    fail "keep-going: no message for worker 0: $(cat "$T/err")"
check_no_leftovers keep-going

# ---- 2. --workers / --servers override the config and are passed on ----
FAKE_MODE=ok FAKE_WAIT_SERVERS=1 run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" --workers 2 --servers 1 -- "$T/fakeworker"
((rc == 0)) || fail "overrides: exit $rc; stderr: $(cat "$T/err")"
for i in 0 1; do
    expect_line overrides "$T/out" "[worker $i] worker rank=$i size=2 cfg=$conf srank=unset cw=2 cs=127.0.0.1:19500 fi=4096 args="
done
grep -q '^\[worker 2\]' "$T/out" && fail "overrides: a third worker ran"
grep -q '^\[server 1\]' "$T/out" && fail "overrides: a second server ran"
expect_line overrides "$T/out" "[server 0] server 0 got TERM"
check_no_leftovers overrides

# ---- 3. a failing worker stops everything ----
t0=$SECONDS
FAKE_MODE=fail run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" -- "$T/fakeworker"
((rc != 0)) || fail "worker fails: launcher exited 0"
((rc != 124 && rc != 137)) || fail "worker fails: launcher hit the test's time limit (rc $rc)"
grep -q 'worker 2 failed with exit code 3' "$T/err" ||
    fail "worker fails: stderr does not name worker 2 and code 3: $(cat "$T/err")"
((SECONDS - t0 < 10)) || fail "worker fails: took $((SECONDS - t0)) s"
(($(count "$T"/pids/grandchild.*) == 4)) || fail "worker fails: not every worker started"
[[ $rc != 0 ]] && pass "worker fails: exit $rc"
check_no_leftovers "worker fails"

# A worker killed by a signal is named with the signal, without bash's job notices.
# shellcheck disable=SC2016 # expanded by the worker's sh
run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" -- \
    sh -c 'echo $$ >"$T/pids/worker.$PSAGG_RANK.$$"; [ "$PSAGG_RANK" = 1 ] && kill -KILL $$; sleep 300'
((rc == 1)) || fail "worker killed: exit $rc, expected 1"
grep -q 'worker 1 failed with status 137 (killed by SIGKILL)' "$T/err" ||
    fail "worker killed: stderr does not name worker 1 and SIGKILL: $(cat "$T/err")"
grep -q 'setsid' "$T/err" && fail "worker killed: bash job notices leaked: $(cat "$T/err")"
((rc == 1)) && pass "worker killed: exit 1"
check_no_leftovers "worker killed"

# ---- 4. a server that dies before the workers finish ----
FAKE_MODE=hang FAKE_SERVER_DIE_RANK=1 run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" -- "$T/fakeworker"
((rc == 1)) || fail "server dies: exit $rc, expected 1"
grep -q 'server 1 exited with exit code 5 before the workers finished' "$T/err" ||
    fail "server dies: stderr does not name server 1 and code 5: $(cat "$T/err")"
((rc == 1)) && pass "server dies: exit 1"
check_no_leftovers "server dies"

# ---- 5. a server that ignores SIGTERM is killed after --grace ----
t0=$SECONDS
FAKE_MODE=ok FAKE_WAIT_SERVERS=2 FAKE_SERVER_IGNORE_TERM=1 run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" --grace 1 -- "$T/fakeworker"
((rc == 0)) || fail "SIGKILL escalation: exit $rc; stderr: $(cat "$T/err")"
grep -q 'did not stop after SIGTERM; sending SIGKILL' "$T/err" ||
    fail "SIGKILL escalation: no SIGKILL message: $(cat "$T/err")"
((SECONDS - t0 < 8)) || fail "SIGKILL escalation: took $((SECONDS - t0)) s"
grep -q 'setsid' "$T/err" && fail "SIGKILL escalation: bash job notices leaked: $(cat "$T/err")"
((rc == 0)) && pass "SIGKILL escalation: exit 0"
check_no_leftovers "SIGKILL escalation"

# ---- 6. SIGINT and SIGTERM to the launcher ----
# Job control gives the background launcher default SIGINT handling (a script's background
# jobs otherwise start with SIGINT ignored, which no trap can undo).
for sig in INT TERM; do
    [[ $sig == INT ]] && want=130 || want=143
    set -m
    FAKE_MODE=hang timeout -k 5 30 "$launcher" --config "$repo/conf/local.ini" \
        --server-bin "$T/fakeserver" -- "$T/fakeworker" >"$T/out" 2>"$T/err" &
    lpid=$!
    set +m
    if wait_ready 4 2; then
        # signal the launcher itself (timeout(1) runs it as its child)
        kill "-$sig" "$(pgrep -P "$lpid" -f psagg-local || echo "$lpid")"
        wait "$lpid"
        rc=$?
        if ((rc == want)); then
            pass "SIG$sig: exit $rc"
        else
            fail "SIG$sig: exit $rc, expected $want; stderr: $(cat "$T/err")"
        fi
        grep -q "got SIG$sig" "$T/err" || fail "SIG$sig: no message: $(cat "$T/err")"
    else
        fail "SIG$sig: workers never became ready: $(cat "$T/err")"
        kill -TERM "$lpid" 2>/dev/null
        wait "$lpid"
    fi
    check_no_leftovers "SIG$sig"
done

# ---- 7. --timeout ----
t0=$SECONDS
FAKE_MODE=hang run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" --timeout 1 -- "$T/fakeworker"
if ((rc == 124)); then
    pass "timeout: exit 124"
else
    fail "timeout: exit $rc, expected 124; stderr: $(cat "$T/err")"
fi
grep -q 'timed out after 1s' "$T/err" || fail "timeout: no message: $(cat "$T/err")"
((SECONDS - t0 < 8)) || fail "timeout: took $((SECONDS - t0)) s"
check_no_leftovers timeout

# ---- 8. usage errors start nothing ----
run --server-bin "$T/fakeserver" -- true
((rc == 2)) || fail "usage: no --config gave $rc"
run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver"
((rc == 2)) || fail "usage: no program gave $rc"
run --config "$T/nonexistent.ini" --server-bin "$T/fakeserver" -- true
((rc == 2)) || fail "usage: missing config gave $rc"
run --config "$repo/conf/local.ini" --server-bin "$T/fakeserver" --servers 3 -- true
((rc == 2)) || fail "usage: --servers 3 with 2 addresses gave $rc"
run --config "$repo/conf/local.ini" --server-bin "$T/nonexistent" -- true
((rc == 2)) || fail "usage: missing server binary gave $rc"
[[ -z $(ls "$T/pids") ]] || fail "usage: processes were started"
pass "usage errors"

# ---- 9. every line is out as soon as it is written (no buffering in the prefixers) ----
FAKE_MODE=stream timeout -k 5 30 "$launcher" --config "$repo/conf/local.ini" \
    --server-bin "$T/fakeserver" -- "$T/fakeworker" >"$T/out" 2>"$T/err" &
lpid=$!
if wait_ready 4 2; then
    for ((i = 0; i < 20; i++)); do # 1 s, well before the workers end (3 s)
        (($(grep -c '^\[worker [0-3]\] stream first' "$T/out") == 4)) &&
            grep -q '^\[server 1\] server up' "$T/out" && break
        sleep 0.05
    done
    if ((i < 20)) && kill -0 "$lpid" 2>/dev/null; then
        pass "streaming: every process's first line out while it runs"
    else
        fail "streaming: lines held back; after 1 s the output was:$(sed 's/^/    /' "$T/out")"
    fi
else
    fail "streaming: workers never became ready: $(cat "$T/err")"
fi
wait "$lpid"
rc=$?
((rc == 0)) || fail "streaming: exit $rc; stderr: $(cat "$T/err")"
check_no_leftovers streaming

# ---- 10. SIGPIPE: the reader goes away (| head), or SIGPIPE itself: nothing is left behind,
# the launcher's own timer and filters included (they stay in its process group) ----
group_left() { # pgid: its live members, if any
    ps -eo pgid=,stat=,args= | awk -v g="$1" '$1 == g && $2 !~ /^Z/'
}
for how in head signal; do
    rm -f "$T/fifo"
    mkfifo "$T/fifo"
    FAKE_MODE=chatty setsid "$launcher" --config "$repo/conf/local.ini" --timeout 60 \
        --server-bin "$T/fakeserver" -- "$T/fakeworker" >"$T/fifo" 2>"$T/err" &
    lpid=$!
    if [[ $how == head ]]; then
        head -n 1 <"$T/fifo" >"$T/out"
    else
        cat <"$T/fifo" >"$T/out" &
        wait_ready 4 2 || fail "SIGPIPE ($how): workers never became ready"
        kill -PIPE "$lpid"
    fi
    for ((i = 0; i < 200; i++)); do kill -0 "$lpid" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$lpid" 2>/dev/null; then
        fail "SIGPIPE ($how): the launcher still runs 10 s later"
        kill -TERM "$lpid"
    fi
    wait "$lpid"
    rc=$?
    ((rc == 141)) && pass "SIGPIPE ($how): exit 141" || fail "SIGPIPE ($how): exit $rc, expected 141; stderr: $(cat "$T/err")"
    sleep 0.2
    left=$(group_left "$lpid")
    [[ -z $left ]] || fail "SIGPIPE ($how): the launcher's own helpers were left: $left"
    check_no_leftovers "SIGPIPE ($how)"
    wait 2>/dev/null
done

# ---- 11. the config is read by psagg's parser: a misspelt key is named with its file:line ----
printf '[cluster]\njob_id = x\nservers = 127.0.0.1:1\nworkerz = 4\n' >"$T/bad.ini"
run --config "$T/bad.ini" --server-bin "$T/fakeserver" -- true
((rc == 2)) || fail "misspelt key: exit $rc, expected 2"
grep -qF "bad.ini:4: unknown key 'workerz' in [cluster]" "$T/err" &&
    pass "misspelt key: file:line error" ||
    fail "misspelt key: stderr does not name bad.ini:4 and the key: $(cat "$T/err")"
[[ -z $(ls "$T/pids") ]] || fail "misspelt key: processes were started"

# ---- 12. --restarts: an elastic job's worker ----
el_conf=$T/elastic.ini
{ cat "$conf"; printf '[cluster]\nelastic = on\n'; } >"$el_conf"
FAKE_MODE=failonce run --config "$el_conf" --server-bin "$T/fakeserver" --restarts 1 -- "$T/fakeworker"
((rc == 0)) || fail "elastic restart: exit $rc; stderr: $(cat "$T/err")"
expect_line "elastic restart" "$T/err" "psagg-local: worker 2 failed with exit code 3; starting it again (restart 1 of 1): it joins the running job"
expect_line "elastic restart" "$T/out" "[worker 2] worker 2 start 1 done"
expect_line "elastic restart" "$T/err" "psagg-local: summary: ok, 1 restart(s) of --restarts 1"
expect_line "elastic restart" "$T/err" "psagg-local:   worker 2: restarted 1 time(s) (--restarts), after exit code 3"
((rc == 0)) && pass "elastic restart: worker 2 started again, exit 0"
check_no_leftovers "elastic restart"

# ---- 13. --restarts with [cluster] server_replicas: a dead server is started again ----
rep_conf=$T/replicas.ini
{ cat "$conf"; printf '[cluster]\nserver_replicas = 1\n'; } >"$rep_conf"
server_ups() { # rank: how many times server RANK started, each with the same command line
    grep -cxF -- "[server $1] server up rank=$1 cfg=$rep_conf wrank=unset fi=4096 args=--config $rep_conf --rank $1" "$T/out"
}
# killed once by a signal: restarted with the same command line (its rank, so its port)
FAKE_MODE=sleep FAKE_SERVER_DIE_RANK=1 FAKE_SERVER_DIE_ONCE=1 FAKE_SERVER_DIE_SIG=KILL \
    run --config "$rep_conf" --server-bin "$T/fakeserver" --restarts 2 -- "$T/fakeworker"
((rc == 0)) || fail "server restart: exit $rc; stderr: $(cat "$T/err")"
expect_line "server restart" "$T/err" "psagg-local: server 1 (127.0.0.1:19501) died with status 137 (killed by SIGKILL): restarted (restart 1 of 2); it rejoins the running job"
expect_line "server restart" "$T/err" "psagg-local: all 4 worker(s) exited 0 (1 restart(s)); stopping the servers"
expect_line "server restart" "$T/err" "psagg-local: summary: ok, 1 restart(s) of --restarts 2"
expect_line "server restart" "$T/err" "psagg-local:   server 1 (127.0.0.1:19501): restarted 1 time(s) (--restarts), after status 137 (killed by SIGKILL)"
n=$(server_ups 1)
((n == 2)) || fail "server restart: server 1 started $n time(s), expected 2:$(sed 's/^/    /' "$T/out")"
n=$(server_ups 0)
((n == 1)) || fail "server restart: server 0 started $n time(s), expected 1"
expect_line "server restart" "$T/out" "[server 1] server 1 got TERM" # the restarted one, stopped
((rc == 0)) && pass "server restart: server 1 killed, started again, exit 0"
check_no_leftovers "server restart"
rm -rf "$T"/died.*

# dies every time: restarted while --restarts allows, then the job goes on without it
FAKE_MODE=sleep FAKE_SERVER_DIE_RANK=1 \
    run --config "$rep_conf" --server-bin "$T/fakeserver" --restarts 1 -- "$T/fakeworker"
((rc == 0)) || fail "restarts spent: exit $rc; stderr: $(cat "$T/err")"
expect_line "restarts spent" "$T/err" "psagg-local: server 1 (127.0.0.1:19501) died with exit code 5: restarted (restart 1 of 1); it rejoins the running job"
expect_line "restarts spent" "$T/err" "psagg-local: server 1 (127.0.0.1:19501) died with exit code 5; no restart left (--restarts 1): the job goes on without it ([cluster] server_replicas = 1: the other servers take its chunks over)"
expect_line "restarts spent" "$T/err" "psagg-local: summary: ok, 1 restart(s) of --restarts 1, 1 server(s) lost"
expect_line "restarts spent" "$T/err" "psagg-local:   server 1 (127.0.0.1:19501): exit code 5; not restarted: the job went on without it; restarted 1 time(s) (--restarts), after exit code 5"
n=$(server_ups 1)
((n == 2)) || fail "restarts spent: server 1 started $n time(s), expected 2"
((rc == 0)) && pass "restarts spent: server 1 restarted once, then the job went on without it"
check_no_leftovers "restarts spent"

# without --restarts a job with replicas goes on without the dead server
FAKE_MODE=sleep FAKE_SERVER_DIE_RANK=0 \
    run --config "$rep_conf" --server-bin "$T/fakeserver" -- "$T/fakeworker"
((rc == 0)) || fail "replicas, no restarts: exit $rc; stderr: $(cat "$T/err")"
expect_line "replicas, no restarts" "$T/err" "psagg-local: server 0 (127.0.0.1:19500) died with exit code 5; not restarted (no --restarts): the job goes on without it ([cluster] server_replicas = 1: the other servers take its chunks over)"
expect_line "replicas, no restarts" "$T/err" "psagg-local: all 4 worker(s) exited 0, without server 0 (127.0.0.1:19500) (server_replicas); stopping the servers"
((rc == 0)) && pass "replicas, no restarts: the job went on without server 0"
check_no_leftovers "replicas, no restarts"

# a server that exits 0 (its workers said BYE: the job is ending) is not restarted, nor is one
# that dies after that: as without replicas, that ends the job
FAKE_MODE=sleep FAKE_SERVER_EXIT0_RANK=0 FAKE_SERVER_DIE_RANK=1 FAKE_SERVER_DIE_AFTER=0.8 \
    run --config "$rep_conf" --server-bin "$T/fakeserver" --restarts 2 -- "$T/fakeworker"
((rc == 1)) || fail "job ending: exit $rc, expected 1; stderr: $(cat "$T/err")"
expect_line "job ending" "$T/err" "psagg-local: summary: FAILED: server 1 exited with exit code 5 before the workers finished"
grep -q 'restart' "$T/err" && fail "job ending: restarted: $(cat "$T/err")"
for i in 0 1; do
    n=$(server_ups $i)
    ((n == 1)) || fail "job ending: server $i started $n time(s), expected 1"
done
((rc == 1)) && pass "job ending: neither the server that exited 0 nor the one that died then restarted"
check_no_leftovers "job ending"

# nor one that dies while the job is stopped (its workers are done)
FAKE_MODE=ok FAKE_WAIT_SERVERS=2 FAKE_SERVER_TERM_RC=9 \
    run --config "$rep_conf" --server-bin "$T/fakeserver" --restarts 2 -- "$T/fakeworker"
((rc == 0)) || fail "server dies when stopped: exit $rc; stderr: $(cat "$T/err")"
grep -q 'restart' "$T/err" && fail "server dies when stopped: restarted: $(cat "$T/err")"
for i in 0 1; do
    n=$(server_ups $i)
    ((n == 1)) || fail "server dies when stopped: server $i started $n time(s), expected 1"
done
((rc == 0)) && pass "server dies when stopped: not restarted"
check_no_leftovers "server dies when stopped"

# a worker that fails still ends a job that is not elastic (it could not join again)
FAKE_MODE=fail run --config "$rep_conf" --server-bin "$T/fakeserver" --restarts 2 -- "$T/fakeworker"
((rc == 1)) || fail "worker fails with replicas: exit $rc, expected 1; stderr: $(cat "$T/err")"
expect_line "worker fails with replicas" "$T/err" "psagg-local: summary: FAILED: worker 2 failed with exit code 3"
grep -q 'starting it again' "$T/err" && fail "worker fails with replicas: restarted: $(cat "$T/err")"
((rc == 1)) && pass "worker fails with replicas: exit 1, not restarted"
check_no_leftovers "worker fails with replicas"

# the remote backend (psagg-ssh, here with an "ssh" that runs the command on this host): the
# server is started again through its connection, under the same watchdog
cat >"$T/fakessh" <<'EOF'
#!/bin/sh
# fake ssh: [-o OPT]... HOST COMMAND: runs COMMAND here
for a; do :; done
exec bash -c "$a"
EOF
chmod +x "$T/fakessh"
ssh_cmd=$(dirname -- "$launcher")/psagg-ssh
printf '[cluster]\nworker_hosts = 127.0.0.1:4\n' | cat "$rep_conf" - >"$T/rep-hosts.ini"
if [[ -x $ssh_cmd ]]; then
    FAKE_MODE=sleep FAKE_SERVER_DIE_RANK=1 FAKE_SERVER_DIE_ONCE=1 FAKE_SERVER_DIE_SIG=KILL \
        timeout -k 5 30 "$ssh_cmd" --config "$T/rep-hosts.ini" --ssh "$T/fakessh" --grace 1 \
        --server-bin "$T/fakeserver" --restarts 1 -- "$T/fakeworker" >"$T/out" 2>&1
    rc=$?
    ((rc == 0)) || fail "ssh server restart: exit $rc: $(cat "$T/out")"
    expect_line "ssh server restart" "$T/out" "psagg-ssh: 127.0.0.1 server 1 (127.0.0.1:19501) died with status 137 (killed by SIGKILL): restarted (restart 1 of 1); it rejoins the running job"
    expect_line "ssh server restart" "$T/out" "psagg-ssh:   127.0.0.1 server 1 (127.0.0.1:19501): restarted 1 time(s) (--restarts), after status 137 (killed by SIGKILL)"
    n=$(grep -c '^\[127.0.0.1 server 1\] server up rank=1 ' "$T/out")
    ((n == 2)) || fail "ssh server restart: server 1 started $n time(s), expected 2"
    ((rc == 0)) && pass "ssh server restart: started again through the remote backend, exit 0"
    check_no_leftovers "ssh server restart"
    rm -rf "$T"/died.*
fi

# --restarts with neither elastic nor server_replicas: refused, naming both keys (psagg-ssh
# --dry-run too: it starts nothing, and is refused all the same)
printf '[cluster]\nworker_hosts = 127.0.0.1:4\n' | cat "$conf" - >"$T/plain.ini"
for name in psagg-local psagg-ssh; do
    if [[ $name == psagg-local ]]; then cmd=("$launcher"); else cmd=("$ssh_cmd" --dry-run); fi
    [[ -x ${cmd[0]} ]] || continue
    timeout -k 5 30 "${cmd[@]}" --config "$T/plain.ini" --server-bin "$T/fakeserver" --restarts 1 -- true \
        >"$T/out" 2>"$T/err"
    rc=$?
    ((rc == 2)) || fail "$name --restarts refused: exit $rc, expected 2"
    if ! grep -qF "[cluster] elastic = on" "$T/err" || ! grep -qF "[cluster] server_replicas >= 1" "$T/err"; then
        fail "$name --restarts refused: stderr does not name both keys: $(cat "$T/err")"
    fi
    [[ -z $(ls "$T/pids") ]] || fail "$name --restarts refused: processes were started"
    ((rc == 2)) && pass "$name --restarts without elastic or server_replicas: refused, naming both"
done
if [[ -x $ssh_cmd ]]; then # with replicas: accepted (the plan)
    timeout -k 5 30 "$ssh_cmd" --dry-run --config "$T/rep-hosts.ini" --server-bin "$T/fakeserver" --restarts 1 -- true \
        >"$T/out" 2>"$T/err"
    rc=$?
    if ((rc == 0)) && grep -q '^127.0.0.1 .*server .* 1 ' "$T/out"; then
        pass "psagg-ssh --dry-run --restarts with server_replicas: the plan"
    else
        fail "psagg-ssh --dry-run --restarts with server_replicas: exit $rc: $(cat "$T/out" "$T/err")"
    fi
fi
for cmd in "$launcher" "$(dirname -- "$launcher")"/psagg-ssh "$(dirname -- "$launcher")"/psagg-slurm; do
    [[ -x $cmd ]] || continue
    help=$("$cmd" --help)
    grep -q 'server_replicas >= 1' <<<"$help" || fail "$(basename -- "$cmd") --help: --restarts does not mention server_replicas"
done

echo "test_launcher: $failures failure(s) in $((SECONDS - started)) s"
((failures == 0))
