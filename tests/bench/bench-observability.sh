#!/usr/bin/env bash
# bench-observability.sh - what metrics and the timeline cost: tests/bench/bench-exchange.sh run
# alternately without and with them, side by side in one run.
#
# Usage: tests/bench/bench-observability.sh [--build-dir DIR] [--codecs LIST] [--steps S]
#                                           [--reps R] [--port P] [--keep DIR]
#   off  the job as configured (conf/local.ini: no metrics endpoint, no timeline, no stats line)
#   on   the same with PSAGG_TIMELINE (every process writes its trace), the servers' Prometheus
#        endpoint (PSAGG_SERVER_METRICS_PORT=P: server 0 on P, server 1 on P+1; without --port
#        two free ports; scraped every second by curl while the job runs) and the workers'
#        stats line every second (PSAGG_LOG_STATS_INTERVAL_MS=1000)
# For each codec (default maxmin4,fp32) the two alternate R times (default 6), off first; each
# run is bench-exchange.sh --steps S (default 20). Prints every run's median step, all-CPU ms
# per step and (on) the ms per step the processes spent recording their traces during the run
# and writing them at the end (each logs both), then per codec the means, their standard
# errors and on/off - 1.
# --keep DIR keeps the last "on" run's traces there.
set -u -o pipefail

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=$repo/build codecs=maxmin4,fp32 steps=20 reps=6 port="" keep=""
while (($#)); do
    case $1 in
    --build-dir) build=$2; shift 2 ;;
    --codecs) codecs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bench-observability.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
done
command -v curl >/dev/null || { echo "bench-observability.sh: needs curl" >&2; exit 2; }
reserve_ports 2 "$port"
scraper=""
at_exit '[[ -n $scraper ]] && kill "$scraper" 2>/dev/null'

# one bench-exchange.sh run; prints "median_ms all_cpu_ms"
run() { # codec on|off
    local out
    rm -rf "$tmp/logs"
    if [[ $2 == on ]]; then
        rm -f "$tmp"/t.*.json
        (while sleep 1; do curl -sf "http://127.0.0.1:$port/metrics" >/dev/null; done) &
        scraper=$!
        out=$(PSAGG_TIMELINE=$tmp/t PSAGG_SERVER_METRICS_PORT=$port PSAGG_LOG_STATS_INTERVAL_MS=1000 \
            "$repo/tests/bench/bench-exchange.sh" --build-dir "$build" --codecs "$1" --steps "$steps" \
            --log-dir "$tmp/logs" 2>&1)
        kill "$scraper" 2>/dev/null
        wait "$scraper" 2>/dev/null
        scraper=""
        ls "$tmp"/t.worker0.json >/dev/null 2>&1 || { echo "no trace written" >&2; return 1; }
    else
        out=$("$repo/tests/bench/bench-exchange.sh" --build-dir "$build" --codecs "$1" --steps "$steps" 2>&1)
    fi
    # the table row: | codec | N | S | median | ... | all CPU ms/step (13th) | ...; then what
    # every process says its trace cost ("timeline: ... recording them took X ms during the
    # run, writing them Y ms of CPU"), summed, per round
    local row tl
    row=$(awk -F'|' -v c="$1" '$2 ~ "^ "c" $" && $5 ~ /[0-9]/ { gsub(/ /, "", $5); gsub(/ /, "", $14); print $5, $14 }' <<<"$out" | tail -1)
    tl=$(cat "$tmp/logs/$1.log" 2>/dev/null | grep -o 'timeline: .* ms of CPU$' |
        awk -v s="$((steps + 1))" '{ r += $(NF - 12); w += $(NF - 3) } END { printf "%.3f %.3f", r / s, w / s }')
    echo "$row $tl"
}

echo "bench-observability: $(nproc) cores, $steps timed steps per run, $reps runs each way, alternating"
for codec in ${codecs//,/ }; do
    for ((i = 1; i <= reps; i++)); do
        for mode in off on; do
            r=$(run "$codec" $mode) || { echo "bench-observability: $codec $mode failed" >&2; exit 1; }
            [[ -n $r ]] || { echo "bench-observability: $codec $mode: no result" >&2; exit 1; }
            echo "$codec $mode $i $r" | tee -a "$tmp/runs"
        done
    done
    if [[ -n $keep ]]; then mkdir -p "$keep" && cp "$tmp"/t.*.json "$keep/"; fi
done
echo
echo "| codec | step ms off | step ms on | on/off - 1 | all CPU ms off | all CPU ms on | on/off - 1 | trace recording ms/step | trace writing at the end, CPU ms/step |"
echo "|---|---|---|---|---|---|---|---|---|"
awk '
function se(s, q, n) { return n > 1 ? sqrt((q - s * s / n) / (n - 1) / n) : 0 }
{ k = $1 SUBSEP $2; n[k]++; s[k] += $4; q[k] += $4 * $4; c[k] += $5; cq[k] += $5 * $5; t[k] += $6; wr[k] += $7; codecs[$1] = 1 }
END {
    for (x in codecs) {
        f = x SUBSEP "off"; o = x SUBSEP "on"
        printf "| %s | %.1f ± %.1f | %.1f ± %.1f | %+.1f%% | %.1f ± %.1f | %.1f ± %.1f | %+.1f%% | %.3f | %.2f |\n", x,
            s[f] / n[f], se(s[f], q[f], n[f]), s[o] / n[o], se(s[o], q[o], n[o]),
            100 * ((s[o] / n[o]) / (s[f] / n[f]) - 1),
            c[f] / n[f], se(c[f], cq[f], n[f]), c[o] / n[o], se(c[o], cq[o], n[o]),
            100 * ((c[o] / n[o]) / (c[f] / n[f]) - 1), t[o] / n[o], wr[o] / n[o]
    }
}' "$tmp/runs"
echo "(means ± standard error of the mean over the runs; trace recording: the ms every process spent"
echo " in its trace calls during the run; trace writing: the CPU ms it spent writing the JSON at its"
echo " end; both summed over the processes, per round of the run's $((steps + 1)) (warm-up included))"
