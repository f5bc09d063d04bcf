#!/usr/bin/env bash
# fuzz.sh - run psagg's fuzz targets (tests/fuzz) longer than CI does.
#
#   deploy/fuzz.sh [SECONDS] [TARGET...]   (default: 600 s each; every target)
#
# Builds the `fuzz` preset (clang, libFuzzer, ASan + UBSan) into build-fuzz/ and runs each
# target for SECONDS from its seed corpus (tests/fuzz/corpus/<target>), adding what it finds
# to build-fuzz/tests/fuzz/found-<target>/. A failure leaves its input as
# build-fuzz/tests/fuzz/crash-<target>-*: reproduce it with
# `build-fuzz/tests/fuzz/fuzz_<target> FILE`, and once fixed, keep it as a regression test by
# copying it into tests/fuzz/corpus/<target>/. Exit status: non-zero if any target failed.
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
seconds=${1:-600}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(config declare msg codec topk thc ctl)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc 2>/dev/null || echo 2)"
dir=build-fuzz/tests/fuzz
failed=()
for t in "${targets[@]}"; do
    mkdir -p "$dir/found-$t"
    echo "== fuzz_$t for ${seconds}s"
    if ! "$dir/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$dir/crash-$t-" \
        "$dir/found-$t" "tests/fuzz/corpus/$t" 2>&1 |
        grep -E 'DONE|stat::number_of_executed_units|FUZZ_CHECK|ERROR|SUMMARY|Test unit written'; then
        :
    fi
    if compgen -G "$dir/crash-$t-*" >/dev/null; then
        failed+=("$t")
    fi
done
if ((${#failed[@]})); then
    echo "fuzz.sh: inputs that fail: $(ls "$dir"/crash-*)" >&2
    exit 1
fi
echo "fuzz.sh: ${targets[*]}: no failures in ${seconds}s each"
