#!/usr/bin/env bash
# run-tests.sh - README command 2: set up a fresh Debian machine and run psagg's whole test
# suite through ctest.
#
#   1. installs the Debian packages psagg needs (deploy/install-deps.sh; idempotent)
#   2. builds with the `default` preset into build/ (CUDA kernels too when nvcc is found;
#      GPU tests skip with exit 77 when there is no GPU) and runs every test: unit,
#      functional, gpu
#   3. builds with the `asan` preset (AddressSanitizer + UndefinedBehaviorSanitizer) into
#      build-asan/ and runs the unit and functional tests again
#   4. builds the fuzz targets with the `fuzz` preset (clang, libFuzzer, ASan + UBSan) into
#      build-fuzz/ and fuzzes each for 30 s from its seed corpus (deploy/fuzz.sh: longer)
#
# Set PSAGG_TEST_SKIP_ASAN=1 to skip step 3, PSAGG_TEST_SKIP_FUZZ=1 to skip step 4.
# Exit status: non-zero if any step fails.
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
jobs=$(nproc 2>/dev/null || echo 2)
# CUDA 13's nvcc lives outside the default PATH on Debian images with the toolkit installed
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

"$repo/deploy/install-deps.sh"

echo "== build (default preset) =="
cmake --preset default
cmake --build --preset default -j "$jobs"
echo "== ctest (default preset) =="
ctest --preset default -j "$jobs"

if [ "${PSAGG_TEST_SKIP_ASAN:-0}" != 1 ]; then
    echo "== build (asan preset: ASan + UBSan) =="
    cmake --preset asan
    cmake --build --preset asan -j "$jobs"
    echo "== ctest (asan preset) =="
    # sanitizer options come with the preset (and tests/sanitizer_defaults.c)
    ctest --preset asan -j "$jobs" -L "unit|functional"
fi
if [ "${PSAGG_TEST_SKIP_FUZZ:-0}" != 1 ]; then
    echo "== build (fuzz preset: clang, libFuzzer, ASan + UBSan) =="
    cmake --preset fuzz
    cmake --build --preset fuzz -j "$jobs"
    echo "== ctest (fuzz preset: each target 30 s) =="
    ctest --preset fuzz
fi
echo "run-tests: all tests passed"
