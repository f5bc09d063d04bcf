#!/usr/bin/env bash
# bench-cluster.sh - psagg against Gloo and OpenMPI on an emulated bandwidth-starved cluster,
# from a fresh machine in one command: installs the Debian dependencies, builds (preset
# `default`, into build/), then runs tests/bench/bench_cluster.py with Debian's own Python (the
# one with torch and matplotlib). Needs root (network namespaces, tc).
#
#   tests/bench/bench-cluster.sh       short mode: ResNet-50, 1 Gbit/s, S=2 and colocated,
#                                      fp32 and maxmin4, Gloo, MPI (a few minutes)
#   tests/bench/bench-cluster.sh --full every model, 1 and 10 Gbit/s, S=2, S=4, colocated, all
#                                      codecs (about 40 minutes on 2 cores)
# Results: tests/bench/results/cluster-short.{csv,png} (short) or tests/bench/results/cluster.{csv,png} (full).
# Other arguments go to bench_cluster.py (e.g. --steps 10; a later --out wins).
set -euo pipefail
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
[ "$(id -u)" -eq 0 ] || { echo "bench-cluster: needs root (network namespaces and tc)" >&2; exit 1; }
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
mode=(--short --out tests/bench/results/cluster-short.csv)
args=()
for a in "$@"; do
    if [ "$a" = --full ]; then mode=(--out tests/bench/results/cluster.csv); else args+=("$a"); fi
done
deploy/install-deps.sh
cmake --preset default
cmake --build --preset default -j "$(nproc)" --target psagg-server psagg-bench-exchange \
    psagg-bench-mpi-allreduce
exec /usr/bin/python3 tests/bench/bench_cluster.py "${mode[@]}" --build-dir build "${args[@]}"
