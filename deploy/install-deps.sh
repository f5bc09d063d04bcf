#!/usr/bin/env bash
# Install every Debian package psagg needs to build, test and benchmark. Idempotent: packages
# already present are not fetched again, and apt's lists are refreshed only when something
# is missing. Needs root (or sudo).
set -euo pipefail

PKGS=(
    build-essential cmake pkg-config git python3 clang libclang-rt-14-dev
    libfabric-dev libfabric-bin libjemalloc-dev libinih-dev zlib1g-dev libsodium-dev
    openmpi-bin libopenmpi-dev
    python3-torch python3-sklearn python3-matplotlib python3-numpy
    iproute2 procps time
    openssh-server openssh-client slurmctld slurmd slurm-client munge
    libmicrohttpd-dev prometheus curl
)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#PKGS[@]} packages present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
