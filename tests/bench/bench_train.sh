# bench_train.sh - sourced by the training benchmarks (bench-server-optim.sh, bench-diloco.sh):
# run one configuration of a PyTorch example for every seed and append its CSV rows.
# The caller sets repo, py, tmp (with job.ini), out, seeds, steps, lm_steps and, optionally,
# configs (labels to run; empty: all).

field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$r"; }

# run EXAMPLE LABEL SERVER_ENV SCRIPT ARGS... (@SEED@ in ARGS): SEEDS rows of
# "example,config,seed,test_acc,final_loss,bytes_per_step" (torch-*: test accuracy and final
# training loss; the LM: held-out loss in final_loss), bytes per step from psagg's counter
run() {
    local ex=$1 label=$2 senv=$3 i acc loss bps n
    shift 3
    [[ -z ${configs:-} || " $configs " == *" $label "* ]] || return 0
    for ((i = 0; i < seeds; i++)); do
        env $senv PSAGG_WORKER_SEED=$((i + 1)) "$repo/deploy/psagg-local" --config "$tmp/job.ini" --timeout 1800 -- \
            "$py" "${@//@SEED@/$i}" >"$tmp/run.out" 2>&1 || { echo "$ex $label seed $i failed:"; tail -5 "$tmp/run.out"; exit 1; }
        r=$(grep 'RESULT' "$tmp/run.out" | head -1)
        [[ $ex == torch-* ]] && n=$steps || n=$lm_steps
        if [[ $ex == torch-* ]]; then acc=$(field test_acc) loss=$(field final_loss); else acc="" loss=$(field val_loss); fi
        bps=$(field psagg_bytes_sent)
        bps=$((${bps:-0} / n))
        echo "$ex,$label,$i,$acc,$loss,$bps" | tee -a "$out"
    done
}
