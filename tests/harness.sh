# harness.sh - what psagg's test and benchmark scripts share, written once: sourced by the
# scripts of tests/functional, tests/fault, tests/gpu and tests/bench (". tests/harness.sh"), which
# run bash with `set -u -o pipefail`. Sourcing it gives
#
#   $tmp        a scratch folder of this script (in $TMPDIR or /tmp), removed when the script
#               exits; PSAGG_KEEP_TMP=1 keeps it and says where
#   pids        the process groups started here (each by setsid: spawn, start_servers and
#               start_worker add to it); when the script exits each gets SIGCONT (a stopped one
#               too) and SIGTERM (a launcher stops its own children), and SIGKILL if it is still
#               there 3 s later
#   $h_name     the script's name without .sh, $h_repo the repository
#   SIGINT and SIGTERM end the script (130, 143) through the same cleanup
#
# Run as a program, `tests/harness.sh --reserve-ports N -- COMMAND ARGS...` runs COMMAND (exec)
# with PSAGG_TEST_PORT set to the first of N reserved ports, held for as long as it runs: for
# the scripts in other languages (tests/bench/bench_overlap.py).
#
# Processes and logs
#   at_exit CMD...        run CMD when the script exits, before the process groups are killed
#                         (the last one registered first)
#   spawn LOG [VAR=VALUE...] CMD ARGS...
#                         start CMD with those variables in a process group of its own (setsid),
#                         stdout and stderr to LOG; its pid (= its group) in $h_pid and in pids
#   start_servers INI N [PREFIX] [VAR=VALUE...]
#                         psagg-server ranks 0..N-1 of INI ($server_bin, else
#                         $build/server/psagg-server), logs $tmp/PREFIXserverR.log, pids spid[R]
#   start_worker RANK LOG [VAR=VALUE...] CMD ARGS...
#                         spawn with PSAGG_RANK=RANK; the pid in wpid[RANK]
#   wait_for PID SECONDS  PID's exit status, or 124 if it still runs after SECONDS
#   wait_all SECONDS WHAT ARRAY
#                         every process of the array ARRAY (wpid, spid: by rank) exits 0 within
#                         SECONDS of the first wait, else fail "WHAT RANK exited RC" (124: runs)
#   wait_until SECONDS CMD ARGS...
#                         run CMD every 50 ms until it succeeds (0), for at most SECONDS (124)
#   stop_all              every process group in pids killed (SIGKILL), and gone; pids emptied
#   show_log FILE         its error and warning lines, then its last lines (before a sanitizer
#                         report, and that report's summary)
#   fail MESSAGE          say "NAME: FAIL: MESSAGE", show_log every $tmp/*.log, exit 1
#   check_states SLACK LOG...
#                         every chunk's copy had its owner's state after each round both stepped
#                         (the servers' debug lines "tensor T chunk C round R: state H
#                         (owner|copy)" in the server logs LOG), but a lost owner's rounds from
#                         the one its copy decides on (none of their updates reached a worker:
#                         the copy's "deciding rounds from R"); at most SLACK rounds of a chunk's
#                         copy lack a pair (a copy lags its owner by one bitmap; a death cuts one
#                         more); else fail. Sets $copies to a sentence that says so
#
# Ports and job files
#   reserve_ports N [FIXED]
#                         sets $port: FIXED when given (a manual run's port, not reserved), else
#                         the first of N (1..8) consecutive free ports, reserved for as long as
#                         this script (or a process it started) lives: see "Free ports" below
#   job_ini FILE SERVERS WORKERS [SECTION.KEY=VALUE...]
#                         write a job file: [cluster] job_id = $h_name-$port, servers =
#                         127.0.0.1:$port .. :$port+SERVERS-1, workers = WORKERS, then each
#                         SECTION.KEY=VALUE as "key = value" in [SECTION] (sections in the order
#                         given, [cluster] first). A key given again replaces the earlier value,
#                         the defaults too (cluster.servers=..., cluster.job_id=...); an empty
#                         VALUE leaves the key out
#
# Figures
#   result_line TEXT [WORDS]
#                         the last "RESULT WORDS..." of TEXT (the lines of a run), from RESULT on
#   result_field KEY LINE the value of KEY=VALUE in LINE (a RESULT line)
#   md_table HEADER...    a markdown table's header and rule; md_row CELL... one of its rows
#   train_seeds EXAMPLE LABEL SERVER_ENV CMD ARGS...
#                         the training benchmarks' runs: for i in 0..$seeds-1, CMD under
#                         deploy/psagg-local --config $train_ini (default $tmp/job.ini), with
#                         PSAGG_WORKER_SEED=i+1, the VAR=VALUE words of SERVER_ENV, and
#                         @SEED@ in ARGS replaced by $seed0 + i (default 0); its output kept in
#                         $tmp/LABEL-SEED.out ("/" in LABEL as "_"), its train_row appended to
#                         $out and printed.
#                         Nothing when $configs is set and does not name LABEL
#   train_row EXAMPLE LABEL SEED FILE
#                         "example,config,seed,test_acc,final_loss,bytes_per_step" of one run
#                         from the RESULT line in FILE: c-* (the C example) its test_acc,
#                         train_loss and bytes_per_step; torch-* test_acc, final_loss and
#                         psagg_bytes_sent / $steps; others (the LM) no accuracy, val_loss and
#                         psagg_bytes_sent / $lm_steps
#   train_summary CSV WIDTH
#                         mean and (min..max) over the seeds per (example, config) of such a CSV
#                         (tests/bench/bench_summary.awk)
#
# Free ports. A server's control port must be known before it starts (the workers read it from
# the job file), so it cannot be the kernel's pick. Ports come in blocks of 8 in
# $PSAGG_TEST_PORTS (default 18000-18999: under Linux's ephemeral range 32768-60999, where no
# outgoing connection takes one; under psagg-local's MASTER_PORT range 20000-31999; away from the
# Slurm test's 16817 and 17101-17104). A block is taken by an flock(1) on
# $PSAGG_TEST_PORT_DIR/BASE.lock (default /tmp/psagg-test-ports, one folder for every build and
# checkout on the host, so tests of concurrent ctest runs never share a block) held on a file
# descriptor of this shell: the processes it starts inherit it, so the block stays reserved while
# any of them lives, and is free again when the last is gone. A locked block is used only when no
# socket has any of its ports (`ss`, TIME_WAIT included), else the next is tried; all taken: wait,
# for up to 2 minutes. What a server binds: its control port (the `servers` entry), and with
# [server] metrics_port its metrics port (metrics_port + rank); its libfabric endpoint (tcp, rxm)
# binds a port the kernel picks, in the ephemeral range. A test that needs ports next to its
# servers' ones (a metrics endpoint, a man in the middle) takes them from the same block.

# shellcheck shell=bash disable=SC2034 # (spid, wpid, port: for the scripts that source this)
h_repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
h_name=$(basename -- "$0" .sh)
pids=()
h_exit_cmds=()
declare -a spid wpid

h_cleanup() {
    local i p t alive
    for ((i = ${#h_exit_cmds[@]} - 1; i >= 0; i--)); do eval "${h_exit_cmds[$i]}"; done
    if ((${#pids[@]})); then
        for p in "${pids[@]}"; do kill -CONT -- "-$p" 2>/dev/null; kill -TERM -- "-$p" 2>/dev/null; done
        for ((t = 0; t < 60; t++)); do
            alive=0
            for p in "${pids[@]}"; do kill -0 -- "-$p" 2>/dev/null && alive=1 && break; done
            ((alive)) || break
            sleep 0.05
        done
        for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
    fi
    if [[ ${PSAGG_KEEP_TMP:-0} == 1 ]]; then
        echo "$h_name: scratch folder kept: $tmp" >&2
    else
        rm -rf -- "$tmp"
    fi
}
at_exit() { h_exit_cmds+=("$*"); }

# the VAR=VALUE words at the front of "$@" in h_env, the rest in h_cmd
h_split_env() {
    h_env=() h_cmd=()
    while (($#)) && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do h_env+=("$1"); shift; done
    h_cmd=("$@")
}

spawn() {
    local log=$1
    shift
    h_split_env "$@"
    env ${h_env[@]+"${h_env[@]}"} setsid "${h_cmd[@]}" >"$log" 2>&1 &
    h_pid=$!
    pids+=("$h_pid")
}

start_servers() {
    local ini=$1 n=$2 prefix=${3:-} r
    shift 2
    (($#)) && shift
    for ((r = 0; r < n; r++)); do
        spawn "$tmp/${prefix}server$r.log" "$@" "${server_bin:-$build/server/psagg-server}" --config "$ini" --rank "$r"
        spid[r]=$h_pid
    done
}

start_worker() {
    local rank=$1 log=$2
    shift 2
    spawn "$log" PSAGG_RANK="$rank" "$@"
    wpid[rank]=$h_pid
}

wait_for() {
    local t
    for ((t = 0; t < $2 * 10; t++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$1" 2>/dev/null && return 124
    wait "$1"
}

wait_all() {
    local secs=$1 what=$2 i rc
    local -n h_wait_pids=$3
    for i in "${!h_wait_pids[@]}"; do
        wait_for "${h_wait_pids[$i]}" "$secs"
        rc=$?
        ((rc == 0)) || fail "$what $i exited $rc"
    done
}

wait_until() {
    local secs=$1 t
    shift
    for ((t = 0; t < secs * 20; t++)); do
        "$@" && return 0
        sleep 0.05
    done
    "$@" && return 0
    return 124
}

# latest_round LOG [RANK]: the latest "ROUND r" of a worker started with --progress, in its own
# log, or with RANK in a launcher's output ("[worker RANK] ROUND r"); nothing when there is none
latest_round() {
    if [ $# -gt 1 ]; then
        grep -o "worker $2\] ROUND [0-9]*\$" "$1" | tail -n 1 | awk '{ print $NF + 0 }'
    else
        grep -o '^ROUND [0-9]*' "$1" | tail -n 1 | awk '{ print $2 + 0 }'
    fi
}

# end_after ENDF MARGIN LOG [RANK]: ends a job of fn_worker --end-file ENDF (every worker reads
# ENDF before each round) MARGIN rounds after latest_round LOG [RANK]: it writes that round number
# (the last round + 1, also left in end_n) elsewhere and renames it, so no worker reads half a file
end_after() {
    local endf=$1 margin=$2 r
    shift 2
    r=$(latest_round "$@")
    [[ $r =~ ^[0-9]+$ ]] || fail "end_after: no ROUND line${2:+ of worker $2} in $1"
    end_n=$((r + margin))
    echo "$end_n" >"$endf.tmp" && mv -f "$endf.tmp" "$endf" || fail "end_after: cannot write $endf"
}

stop_all() {
    local p
    for p in ${pids[@]+"${pids[@]}"}; do kill -CONT -- "-$p" 2>/dev/null; kill -KILL -- "-$p" 2>/dev/null; done
    for p in ${pids[@]+"${pids[@]}"}; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
    pids=()
}

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

fail() {
    local f
    echo "$h_name: FAIL: $*" >&2
    for f in "$tmp"/*.log; do [[ -e $f ]] && show_log "$f"; done >&2
    exit 1
}

check_states() {
    local slack=$1 pairs copy_lines chunks
    shift
    sed -n 's/.* server \([0-9]*\) INFO tensor \([0-9]*\) chunk \([0-9]*\): its copy here owns it .*deciding rounds from \([0-9]*\)$/\2.\3 \1 \4/p' \
        "$@" >"$tmp/decided"
    sed -n 's/.* server \([0-9]*\) DEBUG tensor \([0-9]*\) chunk \([0-9]*\) round \([0-9]*\): state \([0-9a-f]*\) (\(owner\|copy\))$/\2.\3 \4 \6 \5 \1/p' \
        "$@" | sort >"$tmp/states"
    # (a chunk's owner at round R: the taker whose "deciding rounds from" is the highest <= R;
    # another server's owner lines of R are a lost owner's, or one's before it was given back)
    read -r pairs copy_lines chunks < <(awk 'FILENAME == ARGV[1] {i = ++ne[$1]; et[$1, i] = $2; ef[$1, i] = $3 + 0; next}
        $3 == "owner" && ($1 in ne) {
            best = -1; who = ""
            for (i = 1; i <= ne[$1]; i++) if (ef[$1, i] <= $2 + 0 && ef[$1, i] >= best) {best = ef[$1, i]; who = et[$1, i]}
            if (best >= 0 && $5 != who) next
        }
        {k = $1 "." $2; n[k]++; if (!(k in h)) h[k] = $4; else if (h[k] != $4) {print "DIFF", k; bad = 1; exit}
         if ($3 == "copy") {c++; ch[$1] = 1}}
        END {if (bad) exit; for (k in n) if (n[k] >= 2) p++; for (k in ch) nc++; print p + 0, c + 0, nc + 0}' \
        "$tmp/decided" "$tmp/states")
    [[ $pairs != DIFF ]] || fail "a copy's state differs from its owner's: tensor.chunk.round $copy_lines"
    ((chunks > 0 && pairs > 0 && pairs >= copy_lines - slack * chunks)) ||
        fail "only $pairs chunk rounds of $copy_lines stepped by both the owner and the copy ($chunks chunks)"
    copies=" each chunk's copy had its owner's state after each of $pairs chunk rounds ($chunks chunks);"
}

# ---- ports ----

# h_ports_unused BASE: no socket (any state) has a port of BASE..BASE+7
h_ports_unused() {
    local p
    if command -v ss >/dev/null; then
        [[ -z $(ss -Htan "( sport >= :$1 and sport <= :$(($1 + 7)) )" 2>/dev/null) ]]
        return
    fi
    for ((p = $1; p < $1 + 8; p++)); do # without ss: no listener
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && return 1
    done
    return 0
}

reserve_ports() {
    local n=${1:-4} range=${PSAGG_TEST_PORTS:-18000-18999} dir=${PSAGG_TEST_PORT_DIR:-/tmp/psagg-test-ports}
    local lo hi blocks first k base fd deadline=$((SECONDS + 120))
    if [[ -n ${2:-} ]]; then
        port=$2
        return 0
    fi
    ((n >= 1 && n <= 8)) || { echo "reserve_ports: $n ports: a block has 8" >&2; exit 2; }
    lo=${range%-*} hi=${range#*-}
    blocks=$(((hi - lo + 1) / 8))
    ((blocks > 0)) || { echo "reserve_ports: PSAGG_TEST_PORTS=$range holds no block of 8" >&2; exit 2; }
    command -v flock >/dev/null || { echo "reserve_ports: flock (util-linux) is missing" >&2; exit 2; }
    mkdir -p "$dir" && chmod 1777 "$dir" 2>/dev/null
    first=$((RANDOM % blocks)) # concurrent tests start at different blocks
    while :; do
        for ((k = 0; k < blocks; k++)); do
            base=$((lo + 8 * ((first + k) % blocks)))
            exec {fd}>>"$dir/$base.lock" || continue
            if flock -n "$fd" && h_ports_unused "$base"; then
                port=$base h_port_fd=$fd
                return 0
            fi
            exec {fd}>&-
        done
        ((SECONDS < deadline)) || { echo "reserve_ports: no free block of 8 ports in $range for 2 minutes" >&2; exit 1; }
        sleep 0.5
    done
}

# ---- job files ----

job_ini() {
    local file=$1 servers=$2 workers=$3 kv sec key i addrs=""
    local -a order=() keys=()
    local -A value=()
    shift 3
    [[ -n ${port:-} ]] || { echo "job_ini: no \$port (reserve_ports first)" >&2; exit 2; }
    for ((i = 0; i < servers; i++)); do addrs+="${addrs:+ }127.0.0.1:$((port + i))"; done
    for kv in "cluster.job_id=$h_name-$port" "cluster.servers=$addrs" "cluster.workers=$workers" "$@"; do
        [[ $kv =~ ^([a-z_]+)\.([a-z_0-9]+)=(.*)$ ]] || { echo "job_ini: '$kv' is not SECTION.KEY=VALUE" >&2; exit 2; }
        sec=${BASH_REMATCH[1]} key=${BASH_REMATCH[2]}
        [[ " ${order[*]} " == *" $sec "* ]] || order+=("$sec")
        [[ -v "value[$sec.$key]" ]] || keys+=("$sec.$key")
        value[$sec.$key]=${BASH_REMATCH[3]}
    done
    {
        for sec in "${order[@]}"; do
            echo "[$sec]"
            for kv in "${keys[@]}"; do
                [[ ${kv%%.*} == "$sec" && -n ${value[$kv]} ]] && echo "${kv#*.} = ${value[$kv]}"
            done
        done
    } >"$file"
}

# ---- figures ----

result_line() {
    local words=${2:-}
    grep -o "RESULT ${words}.*" <<<"$1" | tail -n 1
}

result_field() {
    tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -n 1
}

md_table() {
    local h rule=""
    printf '|'
    for h in "$@"; do printf ' %s |' "$h"; rule+="---|"; done
    printf '\n|%s\n' "$rule"
}

md_row() {
    local c
    printf '|'
    for c in "$@"; do printf ' %s |' "$c"; done
    printf '\n'
}

# shellcheck disable=SC2154 # steps, lm_steps, seeds, out: the benchmark's
train_row() {
    local ex=$1 label=$2 seed=$3 r acc loss bps
    r=$(result_line "$(cat "$4")")
    case $ex in
    c-*) acc=$(result_field test_acc "$r") loss=$(result_field train_loss "$r") bps=$(result_field bytes_per_step "$r") ;;
    torch-*)
        acc=$(result_field test_acc "$r") loss=$(result_field final_loss "$r") bps=$(result_field psagg_bytes_sent "$r")
        bps=$((${bps:-0} / steps))
        ;;
    *)
        acc="" loss=$(result_field val_loss "$r") bps=$(result_field psagg_bytes_sent "$r")
        bps=$((${bps:-0} / lm_steps))
        ;;
    esac
    echo "$ex,$label,$seed,$acc,$loss,$bps"
}

# shellcheck disable=SC2154
train_seeds() {
    local ex=$1 label=$2 senv=$3 i s f
    shift 3
    [[ -z ${configs:-} || " $configs " == *" $label "* ]] || return 0
    for ((i = 0; i < seeds; i++)); do
        s=$((${seed0:-0} + i)) f=$tmp/${label//\//_}-$((${seed0:-0} + i)).out
        # shellcheck disable=SC2086 # SERVER_ENV is VAR=VALUE words
        env $senv PSAGG_WORKER_SEED=$((i + 1)) "$h_repo/deploy/psagg-local" --config "${train_ini:-$tmp/job.ini}" \
            --timeout 1800 -- "${@//@SEED@/$s}" >"$f" 2>&1 || { echo "$ex $label seed $s failed:"; tail -5 "$f"; exit 1; }
        train_row "$ex" "$label" "$s" "$f" | tee -a "$out"
    done
}

train_summary() {
    awk -F, -v width="$2" -f "$h_repo/tests/bench/bench_summary.awk" "$1"
}

# ---- the script's scratch folder and exit; or, run as a program, a command on reserved ports ----

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    [[ ${1:-} == --reserve-ports && ${3:-} == -- && $# -gt 3 ]] ||
        { echo "usage: tests/harness.sh --reserve-ports N -- COMMAND ARGS..." >&2; exit 2; }
    reserve_ports "$2"
    shift 3
    PSAGG_TEST_PORT=$port exec "$@"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psagg-$h_name.XXXXXX") || exit 1
trap h_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
