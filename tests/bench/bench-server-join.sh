#!/usr/bin/env bash
# bench-server-join.sh - how long a server's loss and its return take in a ResNet-50-sized job
# ([cluster] server_replicas = 1; docs/server-failover.md).
#
# Usage: tests/bench/bench-server-join.sh [--build-dir DIR] [--model PATH.sizes] [--codec C]
#                                         [--workers N] [--steps S] [--runs K] [--port P]
#                                         [--server-optimizer KIND]
#   --build-dir DIR  where psagg-server and psagg-bench-exchange were built (default: build)
#   --model PATH     .sizes table (default tests/data/models/resnet50.sizes)
#   --codec C        the tensors' codec (default maxmin4)
#   --workers N      psagg-bench-exchange processes (default 4), 2 servers, loopback tcp
#   --steps S        their timed steps (default 80: the job must outlast the loss and the return)
#   --runs K         jobs (default 3), one row each
#   --server-optimizer KIND  the tensors are parameters (psagg-bench-exchange --server-optimizer)
#                    and the servers run [server] optimizer = KIND with momentum 0.9: each
#                    chunk's state (weights, view, the optimizer's) goes to the returning server
# Each job: once every worker declared and 3 s passed, server 1 is SIGKILLed; once every worker
# took the view without it, it is started again (the same command line) and rejoins. Per job:
#   loss ms    the first worker's report of the loss to the last worker in view 1
#   restart to READY ms   the restarted server's first log line to the first worker's READY
#                         from it (process start, the workers' next connection attempt: every
#                         500 ms, the HELLOs and the declaration of every tensor)
#   READY to view 2 ms    to the last worker in the view that gives its chunks back (the
#                         reports, the hold, the agreement)
#   chunks back  how many chunks the view gave back to server 1
#   state MB, state ms  chunks with copies (PSAGG_JOIN_EXTRA=server.error_feedback=on: every
#                chunk's server residual; a parameter's with [server] optimizer): the bytes of
#                their state relayed to server 1 (STATE), and from the coordinator's ask to its
#                word that server 1 holds it all ("-": no such chunk)
# and whether every worker finished (exit 0; rank 0's RESULT line). Times from the processes' logs
# (CLOCK_MONOTONIC, one clock on one host).
set -u -o pipefail

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=$repo/build model=$repo/tests/data/models/resnet50.sizes codec=maxmin4 n_w=4 steps=80 runs=3
portarg="" sopt=() okeys=()
while (($#)); do
    case $1 in
    --build-dir) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --codec) codec=$2; shift 2 ;;
    --workers) n_w=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --port) portarg=$2; shift 2 ;;
    --server-optimizer) sopt=(--server-optimizer) okeys=(server.optimizer="$2" server.momentum=0.9); shift 2 ;;
    -h | --help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bench-server-join.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
done
server_bin=$build/server/psagg-server
bench=$build/tests/bench/psagg-bench-exchange
for b in "$server_bin" "$bench"; do
    [[ -x $b ]] || { echo "bench-server-join.sh: $b not built (this script builds nothing)" >&2; exit 2; }
done
reserve_ports 2 "$portarg"

all_in() { # all_in PATTERN NAME: every worker's log has PATTERN
    local w
    for ((w = 0; w < n_w; w++)); do grep -q "$1" "$tmp/$2-worker$w.log" || return 1; done
}
first_t() { grep -h "$1" "${@:2}" 2>/dev/null | awk 'NR == 1 || $1 < t {t = $1} END {print t}'; }
last_t() { grep -h "$1" "${@:2}" 2>/dev/null | awk '$1 > t {t = $1} END {print t}'; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "-"; else printf "%.0f", (b - a) * 1000 }'; }

rows=() fail=0
for ((run = 1; run <= runs; run++)); do
    name=join$run
    job_ini "$tmp/$name.ini" 2 "$n_w" cluster.job_id="server-join-$run-$port" cluster.provider=tcp \
        cluster.server_replicas=1 cluster.op_timeout_ms=5000 log.level=info ${okeys[@]+"${okeys[@]}"} \
        ${PSAGG_JOIN_EXTRA:-}
    start_servers "$tmp/$name.ini" 2 "$name-"
    for ((w = 0; w < n_w; w++)); do
        start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE="$n_w" \
            "$bench" --model "$model" --codec "$codec" --steps "$steps" --warmup 1 ${sopt[@]+"${sopt[@]}"}
    done
    ok=1
    wait_until 120 grep -q "chunks, .* owned here" "$tmp/$name-server1.log" || ok=0
    sleep 3
    kill -KILL "${spid[1]}"
    wait_until 60 all_in "server view 1:" "$name" || ok=0
    spawn "$tmp/$name-server1b.log" "$server_bin" --config "$tmp/$name.ini" --rank 1
    wait_until 60 all_in "is back in view 2" "$name" || ok=0
    for ((w = 0; w < n_w; w++)); do
        wait_for "${wpid[$w]}" 600 || ok=0
    done
    grep -q "^RESULT" "$tmp/$name-worker0.log" || ok=0 # (rank 0 prints the job's)
    wl=("$tmp/$name"-worker*.log)
    loss=$(ms "$(first_t "lost server 1" "${wl[@]}")" "$(last_t "server view 1:" "${wl[@]}")")
    t_start=$(head -n 1 "$tmp/$name-server1b.log" | awk '{print $1}')
    t_ready=$(first_t "server 1 is back (READY)" "${wl[@]}")
    t_view=$(last_t "server 1 is back in view 2" "${wl[@]}")
    back=$(grep -ho "view 2: [0-9]* chunk(s) moved, [0-9]* of them to this server" \
        "$tmp/$name-server1b.log" | awk '{print $6}')
    sl=("$tmp/$name"-server0.log "$tmp/$name"-server1b.log)
    mb=$(grep -ho "the state of [0-9]* chunk(s) ([0-9.]* MB) to server 1" "${sl[@]}" |
        awk '{gsub(/\(/, "", $6); s += $6; n++} END {if (n) printf "%.1f", s; else print "-"}')
    st=$(ms "$(first_t "comes back holding state of" "${sl[@]}")" "$(first_t "server 1 holds the state of" "${sl[@]}")")
    rows+=("$(md_row "$run" "$loss" "$(ms "$t_start" "$t_ready")" "$(ms "$t_ready" "$t_view")" \
        "$(ms "$t_start" "$t_view")" "${back:--}" "$mb" "$st" \
        "$( ((ok)) && echo "every worker finished" || echo FAILED)")")
    ((ok)) || { fail=1; tail -n 5 "$tmp/$name"-*.log >&2; }
    stop_all
done

echo
echo "server 1 of 2 killed and started again: $(basename "$model" .sizes), $codec, $n_w workers" \
    "(psagg-bench-exchange, $steps steps), loopback tcp, $(nproc) cores${PSAGG_JOIN_EXTRA:+, $PSAGG_JOIN_EXTRA}${okeys[*]:+, ${okeys[*]}}"
echo
md_table run "loss ms" "restart to READY ms" "READY to view 2 ms" "restart to view 2 ms" \
    "chunks back" "state MB" "state ms" result
printf '%s\n' "${rows[@]}"
exit $fail
