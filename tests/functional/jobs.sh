# jobs.sh - sourced by the tests that start psagg processes themselves (test_adaptive.sh,
# test_optim.sh, tests/fault/test_fault.sh, fault_matrix.sh): a scratch folder $tmp and the
# array pids of process groups started with setsid, all killed (stopped ones continued first)
# and $tmp removed when the test exits.
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -CONT -- "-$p" 2>/dev/null; kill -KILL -- "-$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# show_log FILE: its error and warning lines (up to 40, with line numbers), then the last 20
# lines it printed before any sanitizer report (a leak report at exit would fill a plain
# tail), and that report's summary
show_log() {
    local f=$1 cut
    echo "== $f"
    grep -n -m 40 -E 'ERROR|FAIL|WARN|ABORT|[Ee]rror|failed|refused|runtime error' "$f" | sed 's/^/  ! /'
    cut=$(grep -n -m 1 -E '^==[0-9]+==|^=================' "$f" | cut -d: -f1)
    if [ -n "$cut" ]; then
        echo "  -- the last lines before the sanitizer report at line $cut:"
        head -n $((cut - 1)) "$f" | tail -20
        grep -m 3 -E 'SUMMARY|^==[0-9]+==ERROR' "$f" | sed 's/^/  -- /'
    else
        echo "  -- its last lines:"
        tail -20 "$f"
    fi
}

# fail MESSAGE: say it, show every log in $tmp (show_log), exit 1
fail() { echo "FAIL: $*" >&2; for f in "$tmp"/*.log; do show_log "$f"; done >&2; exit 1; }

# wait_for PID SECONDS: exit status of PID, or 124 if it is still running then
wait_for() {
    local t
    for ((t = 0; t < $2 * 10; t++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$1" 2>/dev/null && return 124
    wait "$1"
}

# stop_all: every process group in pids killed, and gone
stop_all() {
    local p
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
    for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
    pids=()
}
