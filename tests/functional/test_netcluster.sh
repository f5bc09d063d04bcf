#!/usr/bin/env bash
# Functional test of the emulated cluster (deploy/netcluster.sh):
#   a 2-host cluster at 100 Mbit/s comes up, host 1 reaches host 0 over TCP at
#   0.5 .. 1.1 x the rate in both directions (so shaping is in place both ways), `exec`
#   gives each host its own hostname, and after `down` nothing with the prefix remains
#   (namespaces, interfaces, state). Also checks that the EXIT trap of `run` tears down.
# Exit 77 (skipped) when not root or without ip/tc/unshare/python3.
# Usage: tests/functional/test_netcluster.sh [path/to/repo]   (default: this file's repo)
set -uo pipefail

ROOT=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
NC="$ROOT/deploy/netcluster.sh"
PERF="$ROOT/deploy/netcluster_tcpperf.py"

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
for t in ip tc unshare python3 timeout; do
    command -v "$t" >/dev/null 2>&1 || { echo "SKIP: '$t' not found"; exit 77; }
done
ip netns list >/dev/null 2>&1 || { echo "SKIP: network namespaces unavailable"; exit 77; }

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
P="psgt$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"
fail=0
cleanup() { "$NC" down --prefix "$P" >/dev/null 2>&1; }
at_exit cleanup

bad() { echo "FAIL: $*"; fail=1; }

leftovers() { # prints anything still named with the prefix $1
    ip netns list 2>/dev/null | awk '{print $1}' | grep "^$1-"
    ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep "^$1"
    ls -d "/run/psagg-netcluster/$1" 2>/dev/null
}

# throughput FROM TO: host FROM sends to host TO for 2 s; prints Gbit/s
throughput() {
    local from=$1 to=$2 port=$((5300 + RANDOM % 500)) out
    timeout 30 "$NC" exec --prefix "$P" "$to" -- python3 "$PERF" recv --bind "10.77.0.$((10 + to))" \
        --port "$port" --timeout 20 >"$tmp/recv.$from$to" 2>&1 &
    local rpid=$!
    for _ in $(seq 50); do grep -q listening "$tmp/recv.$from$to" 2>/dev/null && break; sleep 0.1; done
    timeout 30 "$NC" exec --prefix "$P" "$from" -- python3 "$PERF" send --to "10.77.0.$((10 + to))" \
        --port "$port" --seconds 2 || echo "send failed" >&2
    wait "$rpid"
    out=$(sed -n 's/.*gbit_per_s=\([0-9.]*\).*/\1/p' "$tmp/recv.$from$to")
    echo "${out:-0}"
}

echo "== up: 2 hosts at 100mbit, prefix $P"
"$NC" up --hosts 2 --rate 100mbit --prefix "$P" --owner-pid $$ >"$tmp/up.out" 2>"$tmp/up.err" \
    || { cat "$tmp/up.err"; bad "netcluster up failed"; exit 1; }
[ "$(cat "$tmp/up.out")" = "$P" ] || bad "up printed '$(cat "$tmp/up.out")', expected the prefix $P"

h0=$("$NC" exec --prefix "$P" 0 -- hostname)
h1=$("$NC" exec --prefix "$P" 1 -- hostname)
[ "$h0" = "$P-h0" ] && [ "$h1" = "$P-h1" ] || bad "hostnames '$h0' '$h1'"
a1=$("$NC" exec --prefix "$P" 1 -- ip -4 -o addr show dev "${P}h1" | awk '{print $4}')
[ "$a1" = "10.77.0.11/24" ] || bad "host 1 address '$a1'"

for i in 0 1; do
    ip netns exec "$P-h$i" tc qdisc show dev "${P}h$i" | grep -q 'tbf.*rate 100Mbit' || bad "host $i: no tbf on upload"
    ip netns exec "$P-br" tc qdisc show dev "${P}b$i" | grep -q 'tbf.*rate 100Mbit' || bad "host $i: no tbf on download"
done
for dir in "1 0" "0 1"; do
    set -- $dir
    g=$(throughput "$1" "$2")
    echo "   host $1 -> host $2: $g Gbit/s at 0.1 Gbit/s"
    awk -v g="$g" 'BEGIN{exit !(g >= 0.05 && g <= 0.11)}' || bad "throughput $g Gbit/s not in [0.05, 0.11]"
done

echo "== down"
"$NC" down --prefix "$P" || bad "down failed"
left=$(leftovers "$P")
[ -z "$left" ] || bad "leftovers after down: $left"

echo "== run mode tears down after its command (also on failure)"
P2="${P}r"
"$NC" run --hosts 2 --rate 100mbit --prefix "$P2" -- sh -c "ip netns list | grep -q '^$P2-h1' && exit 3" 2>/dev/null
rc=$?
[ "$rc" -eq 3 ] || bad "run: expected the command's exit status 3, got $rc"
left=$(leftovers "$P2")
[ -z "$left" ] || bad "leftovers after run: $left"

[ "$fail" -eq 0 ] && echo "PASS" || echo "FAILED"
exit "$fail"
