#!/usr/bin/env bash
# bench-chaos.sh - an elastic job under chaos: 4 workers of worker/examples/train_digits.py
# (the digits CNN; --comm psagg-server: the optimizer on the servers, SGD momentum 0.9; or
# COMM=psagg-opt: DistributedOptimizer) x 2 servers on loopback, STEPS steps (default 4000),
# seeds 0..SEEDS-1 (default 2), each run twice: uninterrupted, and with KILLS (default 10)
# SIGKILLs of a worker at random steps between 10% and 90% of the run (train_digits.py
# --chaos), under `psagg-local --restarts KILLS`: each killed worker is started again and
# joins the running job. min_workers = 1: a kill may come while an earlier victim is still
# starting again (a restart takes seconds here: Python and torch imports on 2 busy cores).
# LOGDIR: keep each run's output there.
#
# Per run: test accuracy and held-out loss (rank 0), the job's wall time, rank 0's median
# step. Per
# failure (from the timestamps the workers and servers print, all on this host's clock):
#   detect    the kill -> server 0 starts the epoch without the worker
#   back      the kill -> the restarted worker is a member again (process start, Python and
#             torch import, connect, admission at the members' next barrier, state)
#   admit     the restarted worker's psagg_declare: connected to admitted
#   state     its weights from the servers (psagg_param_init's pull)
# and what the job lost: (chaos wall - uninterrupted wall) / kills.
#
# Output: one CSV row per run to tests/bench/results/elastic-chaos.csv (or $OUT), one per
# failure to elastic-chaos-failures.csv, then a summary. Usage: tests/bench/bench-chaos.sh [BUILD]
# The servers listen on PORT and PORT+1 when PORT is set, else on two free ports (tests/harness.sh).
set -u -o pipefail
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
build=${1:-$repo/build}
steps=${STEPS:-4000} seeds=${SEEDS:-2} kills=${KILLS:-10} comm=${COMM:-psagg-server}
out=${OUT:-$repo/tests/bench/results/elastic-chaos.csv}
fout=${out%.csv}-failures.csv
py=/usr/bin/python3
export PSAGG_SERVER_BIN=$build/server/psagg-server
unset PSAGG_CODEC_DEFAULT PSAGG_SERVER_OPTIMIZER PSAGG_SERVER_MOMENTUM PSAGG_SERVER_NESTEROV
if ! "$py" -c "import torch, sklearn" 2>/dev/null; then
    echo "bench-chaos: $py cannot import torch and sklearn" >&2
    exit 77
fi
reserve_ports 2 "${PORT:-}"
job_ini "$tmp/job.ini" 2 4 cluster.job_id="bench-chaos-$port" cluster.provider=tcp cluster.elastic=on \
    cluster.min_workers=1 cluster.op_timeout_ms=4000 codec.default=maxmin4 codec.min_compress_elems=256 \
    server.optimizer=sgd server.momentum=0.9 log.level=warn

echo "run,seed,kills,restarts,test_acc,test_loss,wall_s,median_step_ms" >"$out"
echo "seed,victim,step,detect_ms,back_ms,admit_ms,state_ms" >"$fout"
for ((seed = 0; seed < seeds; seed++)); do
    for run in uninterrupted chaos; do
        extra=() launch=()
        [ "$run" = chaos ] && extra=(--chaos "$kills") launch=(--restarts "$kills")
        t0=$(date +%s.%N)
        "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 1800 "${launch[@]}" -- "$py" \
            "$repo/worker/examples/train_digits.py" --comm "$comm" --steps "$steps" \
            --seed "$seed" "${extra[@]}" >"$tmp/run.out" 2>&1 ||
            { echo "bench-chaos: $run seed $seed failed:"; tail -20 "$tmp/run.out"; exit 1; }
        [ -z "${LOGDIR:-}" ] || cp "$tmp/run.out" "$LOGDIR/chaos-$comm-$run-$seed.log"
        r=$(result_line "$(<"$tmp/run.out")")
        acc=$(result_field test_acc "$r") tloss=$(result_field test_loss "$r")
        wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
        med=$(sed -n 's/^\[worker 0\] STEPTIME .*median_ms=\([0-9.]*\).*/\1/p' "$tmp/run.out" | tail -1)
        n_kill=$(grep -c 'SIGKILL to itself' "$tmp/run.out")
        n_restart=$(grep -c 'starting it again' "$tmp/run.out")
        n_params=$(grep '^\[worker [0-3]\] PARAMS' "$tmp/run.out" | sed 's/.*sha256=//' | sort -u | wc -l)
        ((n_params == 1)) || { echo "bench-chaos: $run seed $seed: the workers' final weights differ"; exit 1; }
        echo "$run,$seed,$n_kill,$n_restart,$acc,$tloss,$wall,$med" | tee -a "$out"
        [ "$run" = chaos ] || continue
        # per failure: the kill, server 0's epoch without the victim, the victim's JOINED
        awk -v seed="$seed" '
            /SIGKILL to itself before step/ {
                match($0, /^\[worker [0-9]+\]/); v = substr($0, 9, RLENGTH - 9)
                match($0, /step [0-9]+/); st = substr($0, RSTART + 5, RLENGTH - 5)
                match($0, /t=[0-9.]+/); kt = substr($0, RSTART + 2, RLENGTH - 2)
                n++; victim[n] = v; step[n] = st; kill[n] = kt; pending[v] = n
            }
            /^\[server 0\] .* membership epoch [0-9]+: worker [0-9]+ left/ {
                match($0, /worker [0-9]+ left/); v = substr($0, RSTART + 7, RLENGTH - 12)
                if (v in pending && !(pending[v] in det)) det[pending[v]] = $3
            }
            /JOINED rank/ {
                match($0, /JOINED rank [0-9]+/); v = substr($0, RSTART + 12, RLENGTH - 12)
                match($0, /admitted in [0-9.]+/); ad = substr($0, RSTART + 12, RLENGTH - 12)
                match($0, /state in [0-9.]+/); sd = substr($0, RSTART + 9, RLENGTH - 9)
                match($0, /t=[0-9.]+/); jt = substr($0, RSTART + 2, RLENGTH - 2)
                if (v in pending) { k = pending[v]; back[k] = jt; adm[k] = ad; sta[k] = sd; delete pending[v] }
            }
            END {
                for (k = 1; k <= n; k++)
                    printf "%s,%s,%s,%.0f,%s,%s,%s\n", seed, victim[k], step[k],
                        k in det ? (det[k] - kill[k]) * 1000 : -1,
                        k in back ? sprintf("%.0f", (back[k] - kill[k]) * 1000) : "",
                        k in adm ? sprintf("%.0f", adm[k] * 1000) : "",
                        k in sta ? sprintf("%.1f", sta[k] * 1000) : ""
            }' "$tmp/run.out" | tee -a "$fout"
    done
done
echo "--- summary (means) ---"
awk -F, 'NR > 1 { n[$1]++; acc[$1] += $5; loss[$1] += $6; wall[$1] += $7; med[$1] += $8; k[$1] += $3 }
    END { for (r in n) printf "%s: %d runs, kills %.1f, test_acc %.4f, test_loss %.4f, wall %.1f s, median step %.1f ms\n",
              r, n[r], k[r] / n[r], acc[r] / n[r], loss[r] / n[r], wall[r] / n[r], med[r] / n[r]
          if (n["chaos"] && k["chaos"]) printf "time the job lost per failure: %.0f ms\n",
              (wall["chaos"] - wall["uninterrupted"]) / k["chaos"] * 1000 }' "$out"
awk -F, 'NR > 1 && $4 >= 0 { n++; d += $4; if ($5 != "") { b += $5; nb++ } if ($6 != "") { a += $6; s += $7; na++ } }
    END { if (n) printf "per failure: detection %.0f ms, back in the job %.0f ms after the kill (admission %.0f ms, state %.1f ms), %d failures\n",
              d / n, nb ? b / nb : -1, na ? a / na : -1, na ? s / na : -1, n }' "$fout"
