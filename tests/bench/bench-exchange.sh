#!/usr/bin/env bash
# bench-exchange.sh - psagg-bench-exchange for every codec on this host (loopback), one table.
#
# Usage: tests/bench/bench-exchange.sh [--build-dir DIR] [--config FILE] [--model PATH.sizes]
#                                      [--codecs LIST] [--steps S] [--warmup W] [--link-gbit R]
#                                      [--model-gpu GELEM_S] [--log-dir DIR]
#                                      [--server-optimizer KIND] [--port P]
#   --build-dir DIR  where psagg-server and psagg-bench-exchange were built (default: build);
#                    this script builds nothing
#   --config FILE    job config (default conf/local.ini: 2 servers, 4 workers, tcp on loopback;
#                    its servers on two free ports, or on P and P+1 with --port P, through
#                    PSAGG_CLUSTER_SERVERS unless that is set)
#   --model PATH     .sizes table (default tests/data/models/resnet50.sizes)
#   --codecs LIST    comma list (default fp32,fp16,maxmin8,maxmin4,maxmin2)
#   --steps/--warmup timed and warm-up steps (default 5 and 1)
#   --model-gpu G    workers modelled as GPU workers (psagg-bench-exchange --model-gpu: codecs not
#                    run on the CPU, waited for at G 1e9 elements/s, 0 = free; the title says so)
#   --log-dir DIR    keep each codec's whole output (every process's log) in DIR/<codec>.log
#   --server-optimizer KIND  the servers run [server] optimizer = KIND (sgd, adam, adamw) and
#                    the tensors are parameters (psagg-bench-exchange --server-optimizer): the
#                    servers' CPU includes the optimizer's step and the weight deltas' encode
#   --link-gbit R    link rate for the wire-limit column (default 1). Loopback itself has no
#                    rate: the column says how long the busiest link's bytes would take at R.
# Each codec runs once through deploy/psagg-local; the RESULT lines are printed as they come
# and then as a markdown table, with CPU: the workers' CPU ms per timed step (summed over the
# workers' "CPU rank=" lines), the servers' CPU ms and minor page faults per round after the
# first (summed over servers; from each server's usage line, so the config must log at info,
# the default) and their total: every process of the job. Exit status 1 if any run failed
# (its rows say "failed").
set -u -o pipefail

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=$repo/build config="" model=$repo/tests/data/models/resnet50.sizes
codecs=fp32,fp16,maxmin8,maxmin4,maxmin2 steps=5 warmup=1 gbit=1 gpu=() logdir="" sopt=() port=""
while (($#)); do
    case $1 in
    --build-dir) build=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --codecs) codecs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --link-gbit) gbit=$2; shift 2 ;;
    --model-gpu) gpu=(--model-gpu "$2"); shift 2 ;;
    --log-dir) logdir=$2; shift 2 ;;
    --server-optimizer) sopt=(--server-optimizer); export PSAGG_SERVER_OPTIMIZER=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bench-exchange.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
done
server=$build/server/psagg-server
bench=$build/tests/bench/psagg-bench-exchange
for b in "$server" "$bench"; do
    [[ -x $b ]] || { echo "bench-exchange.sh: $b not built (this script builds nothing)" >&2; exit 2; }
done
if [[ -z $config ]]; then # the example job, on free ports
    config=$repo/conf/local.ini
    if [[ -z ${PSAGG_CLUSTER_SERVERS:-} ]]; then
        reserve_ports 2 "$port"
        export PSAGG_CLUSTER_SERVERS="127.0.0.1:$port 127.0.0.1:$((port + 1))"
    fi
fi

rows=() fail=0
for codec in ${codecs//,/ }; do
    out=$("$repo/deploy/psagg-local" --config "$config" --server-bin "$server" --timeout 600 -- \
        "$bench" --model "$model" --codec "$codec" --steps "$steps" --warmup "$warmup" \
        --link-gbit "$gbit" ${gpu[@]+"${gpu[@]}"} ${sopt[@]+"${sopt[@]}"} 2>&1)
    rc=$?
    if [[ -n $logdir ]]; then mkdir -p "$logdir" && printf '%s\n' "$out" >"$logdir/$codec.log"; fi
    line=$(result_line "$out" system=psagg)
    if ((rc != 0)) || [[ -z $line ]]; then
        echo "bench-exchange.sh: $codec failed (launcher exit $rc):" >&2
        tail -n 15 <<<"$out" >&2
        rows+=("$(md_row "$codec" failed "" "" "" "" "" "" "" "" "" "" "" "")")
        fail=1
        continue
    fi
    echo "$line"
    # CPU per step: every worker's ("CPU rank=..." lines, timed steps), every server's (its
    # "usage after the first round" line, logged at INFO: per round), each summed
    wrk_cpu=$(grep -o 'CPU rank=[0-9]* cpu_ms=[0-9.]*' <<<"$out" | awk -F'cpu_ms=' '
        { c += $2; n++ } END { if (n) printf "%.1f", c; else printf "-" }')
    srv=$(grep -o 'usage after the first round: .*' <<<"$out" | awk '
        { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "cpu_ms_per_round") c += kv[2];
                                       if (kv[1] == "minflt_per_round") f += kv[2] }; n++ }
        END { if (n) printf "%.1f %.0f", c, f; else printf "- -" }')
    read -r srv_cpu srv_flt <<<"$srv"
    all_cpu=$(awk -v w="$wrk_cpu" -v s="$srv_cpu" 'BEGIN { if (w == "-" || s == "-") print "-"; else printf "%.1f", w + s }')
    med=$(result_field median_ms "$line") busiest=$(result_field busiest_link_bytes "$line")
    rate=$(awk -v b="$busiest" -v m="$med" 'BEGIN { printf "%.3f", b * 8 / (m * 1e-3) / 1e9 }')
    rows+=("$(md_row "$codec" "$(result_field workers "$line")" "$(result_field servers "$line")" "$med" \
        "$(result_field p10_ms "$line")" "$(result_field p90_ms "$line")" \
        "$(awk -v b="$busiest" 'BEGIN { printf "%.2f", b / 1e6 }')" "$rate" "$(result_field wire_limit_ms "$line")" \
        "$(result_field compression "$line")" "$wrk_cpu" "$srv_cpu" "$all_cpu" "$srv_flt")")
done

echo
echo "psagg-bench-exchange on loopback: $(basename "$model" .sizes), $steps timed steps after $warmup warm-up, config $(basename "$config"), $(nproc) cores${gpu[1]:+; workers MODELLED AS GPU WORKERS (codecs not run, waited for at ${gpu[1]} Gelem/s; 0: no GPU time)}${sopt[0]:+; the servers run [server] optimizer = $PSAGG_SERVER_OPTIMIZER on every tensor (parameters)}"
echo
md_table codec N S "median ms" "p10 ms" "p90 ms" "busiest link MB/step" "achieved Gbit/s" \
    "wire limit ms @ ${gbit} Gbit/s" compression "workers CPU ms/step" "servers CPU ms/step" "all CPU ms/step" \
    "servers faults/step"
printf '%s\n' "${rows[@]}"
exit $fail
