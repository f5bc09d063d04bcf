# bench_summary.awk - the summary table of the training benchmarks (bench-adaptive-train.sh,
# bench-server-optim.sh): from their CSV (example,config,seed,test_acc,final_loss,bytes_per_step,
# header first), per (example, config) in first-seen order, the mean and (min..max) of the test
# accuracy ("-" where none) and of the loss, and the mean bytes per step.
# Usage: awk -F, -v width=42 -f bench_summary.awk RESULTS.csv
NR > 1 {
    k = $1 " " $2; n[k]++; a[k] += $4; l[k] += $5; b[k] += $6
    if (!(k in amin) || $4 < amin[k]) amin[k] = $4; if (!(k in amax) || $4 > amax[k]) amax[k] = $4
    if (!(k in lmin) || $5 < lmin[k]) lmin[k] = $5; if (!(k in lmax) || $5 > lmax[k]) lmax[k] = $5
    if (!(k in order)) { order[k] = ++m; keys[m] = k }
}
END {
    w = width ? width : 42
    printf "%-*s %-24s %-24s %s\n", w, "example config", "test accuracy", "loss", "bytes/step"
    for (i = 1; i <= m; i++) { k = keys[i]
        acc = amax[k] == "" ? "-" : sprintf("%.4f (%.4f..%.4f)", a[k] / n[k], amin[k], amax[k])
        printf "%-*s %-24s %-24s %.0f\n", w, k, acc, sprintf("%.4f (%.4f..%.4f)", l[k] / n[k], lmin[k], lmax[k]), b[k] / n[k] }
}
