#!/usr/bin/env bash
# soak.sh - a long job on this host, sampling every process's memory: does anything grow?
#
#   tests/bench/soak.sh [--rounds N] [--servers S] [--workers W] [--codec C] [--build-dir DIR]
#                       [--warmup-frac F] [--csv FILE] [--port P]
#
# Builds nothing: give it a Release build (cmake --preset release; the default build dir is
# build-release/). Runs S psagg-server processes and W fn_worker processes (defaults 2 and
# 2) for N rounds (default 20000) of 40 tensors (1 .. 300007 elements, codec C, default
# maxmin4; every round's result checked), sampling VmRSS of every process each second into
# a CSV. Prints, per process, the RSS after warm-up (the first F of the run, default 0.25: rxm and the allocator fill their pools over the first minutes),
# at the end, the growth between the two and the peak; the server's growth is the figure
# docs/results.md ("Soak") reports (target: under 1 MB). The servers listen on free ports (S at
# most 8), or on P, P+1, ... with --port P. Exit status: non-zero if the job failed.
set -u -o pipefail

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=$repo/build-release rounds=20000 servers=2 workers=2 codec=maxmin4 warm=0.25 csv="" port=""
while (($#)); do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --codec) codec=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --warmup-frac) warm=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "soak.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
done
server_bin=$build/server/psagg-server worker_bin=$build/tests/functional/fn_worker
for b in "$server_bin" "$worker_bin"; do
    [[ -x $b ]] || { echo "soak.sh: $b not built (cmake --preset release && cmake --build --preset release)" >&2; exit 2; }
done
csv=${csv:-$tmp/rss.csv}
reserve_ports "$servers" "$port"
job_ini "$tmp/job.ini" "$servers" "$workers" cluster.job_id="soak-$port" worker.chunk_bytes=262144 log.level=warn
export PSAGG_CONFIG=$tmp/job.ini PSAGG_WORLD_SIZE=$workers
while IFS= read -r kv; do [[ -n $kv ]] && export "$kv"; done < <("$server_bin" --config "$tmp/job.ini" --fabric-env)

labels=()
start_servers "$tmp/job.ini" "$servers"
for ((i = 0; i < servers; i++)); do labels+=("server$i"); done
for ((i = 0; i < workers; i++)); do
    start_worker "$i" "$tmp/worker$i.log" "$worker_bin" --codec "$codec" --rounds "$rounds" \
        --sizes 1,1023,300007 --random-tensors 37 --random-max 65536
    labels+=("worker$i")
done
echo "soak.sh: $servers server(s), $workers worker(s), $rounds rounds of 40 tensors ($codec); sampling RSS every second into $csv"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
(IFS=,; echo "seconds,${labels[*]}") >"$csv"
t0=$SECONDS
while kill -0 "${pids[$servers]}" 2>/dev/null; do # while worker 0 runs
    row="$((SECONDS - t0))"
    for p in "${pids[@]}"; do row+=",$(rss_kib "$p")"; done
    echo "$row" >>"$csv"
    sleep 1
done
fail=0
for ((i = 0; i < workers; i++)); do
    wait "${pids[$((servers + i))]}" || { echo "soak.sh: worker $i failed:" >&2; tail -n 5 "$tmp/worker$i.log" >&2; fail=1; }
done
for ((i = 0; i < servers; i++)); do
    wait "${pids[$i]}" || { echo "soak.sh: server $i exited non-zero:" >&2; tail -n 5 "$tmp/server$i.log" >&2; fail=1; }
done
secs=$((SECONDS - t0))
echo "soak.sh: $rounds rounds in ${secs}s ($(awk -v r="$rounds" -v s="$secs" 'BEGIN { printf "%.1f", r / (s ? s : 1) }') rounds/s)"
# per process: RSS at the warm-up mark, at the last sample, growth, peak
awk -F, -v warm="$warm" '
    NR == 1 { for (i = 2; i <= NF; i++) name[i] = $i; n = NF; next }
    { rows++; for (i = 2; i <= n; i++) { v[rows, i] = $i; if ($i > peak[i]) peak[i] = $i } }
    END {
        w = int(rows * warm); if (w < 1) w = 1
        printf "%-8s %12s %12s %12s %12s\n", "process", "warm KiB", "end KiB", "growth KiB", "peak KiB"
        for (i = 2; i <= n; i++) {
            last = rows; while (last > w && v[last, i] == 0) last--   # exited: its last sample
            printf "%-8s %12d %12d %12d %12d\n", name[i], v[w, i], v[last, i], v[last, i] - v[w, i], peak[i]
        }
        printf "(warm-up mark: sample %d of %d, %.0f%% of the run)\n", w, rows, warm * 100
    }' "$csv"
exit $fail
