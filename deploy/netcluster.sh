#!/usr/bin/env bash
# netcluster.sh — an emulated cluster of network namespaces with shaped links, on one machine.
#
# Topology (everything named with a per-run prefix P, default "psg" + 4 random hex digits):
#
#   netns P-br : bridge "Pbr"  (dedicated namespace: the root namespace is never touched)
#   netns P-hI : host I, address 10.77.0.(10+I)/24 on veth "PhI"; lo up; its bridge-side
#                peer "PbI" lives in P-br and is a port of the bridge.
#
#   Each host's link is shaped in BOTH directions with tbf (token bucket):
#     upload   = egress of PhI (host side)    download = egress of PbI (bridge side)
#   with burst = max(64 KiB + MTU, rate x 1 ms) and a queue of ~5 ms at the rate, so that a
#   single TCP stream reaches close to the rate at 100 Mbit .. 10 Gbit. --delay adds netem
#   one-way delay per direction when the kernel has sch_netem (it is refused otherwise).
#   Veths are created directly inside their namespaces: no interface ever sits in the root
#   namespace, and deleting the namespaces removes every veth and the bridge.
#   Traffic stays inside 10.77.0.0/24 in these namespaces (no route leaves them).
#
# CLI (needs root, ip and tc):
#   netcluster.sh up --hosts H --rate 1gbit [--delay 0.1ms] [--prefix P] [--owner-pid PID]
#        creates the cluster, prints the prefix on stdout (the only stdout line).
#        --owner-pid: the process that owns it (default: the caller); `cleanup` removes
#        clusters whose owner is gone.
#   netcluster.sh down [--prefix P]                 removes the cluster P (idempotent)
#   netcluster.sh exec [--prefix P] I -- cmd...     runs cmd in host I: its network namespace
#        plus a fresh UTS namespace with hostname "P-hI" (so MPI sees distinct nodes).
#        Exports NETCLUSTER_PREFIX, NETCLUSTER_HOST (I), NETCLUSTER_ADDR, NETCLUSTER_IFACE.
#   netcluster.sh run --hosts H --rate R [--delay D] [--prefix P] -- cmd...
#        up, run cmd in the root namespace with NETCLUSTER_PREFIX/NETCLUSTER_HOSTS exported
#        (cmd uses `netcluster.sh exec` to reach the hosts), then down — also on failure,
#        Ctrl-C or TERM. Exit status is cmd's.
#   netcluster.sh info [--prefix P]                 hosts, addresses, interfaces, qdiscs
#   netcluster.sh addr I | iface I [--prefix P]     address / interface name of host I
#   netcluster.sh list [--prefix STEM]              clusters (prefix, owner, alive?)
#   netcluster.sh cleanup [--prefix STEM] [--force] remove leftovers: every cluster whose
#        name starts with STEM (default "psg") and whose owner process is gone; --force also
#        removes live ones. Use `down --prefix P` for a single cluster.
#   --prefix defaults to $NETCLUSTER_PREFIX for down/exec/info/addr/iface.
#
# Sourceable: `source deploy/netcluster.sh` defines the nc_* functions without running the CLI.
# State: /run/psagg-netcluster/P/{hosts,rate,delay,owner}.

NC_SUBNET=10.77.0
NC_STATE_ROOT=/run/psagg-netcluster

nc_die() { echo "netcluster: $*" >&2; exit 1; }
nc_log() { echo "netcluster: $*" >&2; }

nc_require() {
    [ "$(id -u)" -eq 0 ] || nc_die "needs root (network namespaces, veths and tc); run as root or with sudo"
    command -v ip >/dev/null 2>&1 || nc_die "'ip' not found (install iproute2)"
    command -v tc >/dev/null 2>&1 || nc_die "'tc' not found (install iproute2)"
    command -v unshare >/dev/null 2>&1 || nc_die "'unshare' not found (install util-linux)"
}

# nc_check_prefix P: a prefix must be short (interface names are at most 15 characters)
# and plain, so that names derived from it are predictable and matchable.
nc_check_prefix() {
    [[ "$1" =~ ^[a-z][a-z0-9]{1,10}$ ]] || nc_die "bad prefix '$1': 2-11 chars [a-z0-9], starting with a letter"
}

nc_new_prefix() { printf 'psg%s' "$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"; }

# nc_rate_bps RATE: "1gbit", "10gbit", "100mbit", "500kbit", "1.5gbit" -> bits per second.
nc_rate_bps() {
    local r=${1,,}
    [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)(gbit|mbit|kbit|bit)$ ]] || nc_die "bad rate '$1' (e.g. 100mbit, 1gbit, 10gbit)"
    awk -v v="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN{
        m = (u=="gbit") ? 1e9 : (u=="mbit") ? 1e6 : (u=="kbit") ? 1e3 : 1;
        printf "%.0f\n", v*m }'
}

nc_ns_host() { echo "$1-h$2"; }
nc_ns_br()   { echo "$1-br"; }
nc_if_host() { echo "$1h$2"; }
nc_if_br()   { echo "$1b$2"; }
nc_addr()    { echo "$NC_SUBNET.$((10 + $2))"; }

nc_hosts_of() {
    local f="$NC_STATE_ROOT/$1/hosts"
    [ -r "$f" ] || nc_die "no cluster with prefix '$1' (no $f)"
    cat "$f"
}

# nc_shape NS DEV BPS DELAY: tbf at BPS on DEV's egress inside NS, netem delay below it.
# burst: at least one 64 KiB GSO segment plus an MTU (veths send GSO super-packets), and
# 1 ms at the rate so the bucket does not starve the link between timer ticks at 10 Gbit.
# limit: ~5 ms of queue at the rate (plus the burst) — enough to keep TCP at the rate
# without the bufferbloat of a deep queue.
nc_shape() {
    local ns=$1 dev=$2 bps=$3 delay=$4
    local bytes_per_s=$((bps / 8))
    local burst=$((bytes_per_s / 1000))
    [ "$burst" -lt 67000 ] && burst=67000
    local limit=$((bytes_per_s / 200 + burst))
    [ "$limit" -lt 200000 ] && limit=200000
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: tbf rate "${bps}bit" burst "$burst" limit "$limit" \
        || return 1
    if [ -n "$delay" ]; then
        ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay" limit 100000 \
            || { nc_log "netem unavailable (kernel without sch_netem?): --delay cannot be emulated"; return 1; }
    fi
}

# nc_up P H RATE DELAY OWNER: create the cluster; on any failure remove what was made.
nc_up() {
    local p=$1 h=$2 rate=$3 delay=$4 owner=$5
    nc_check_prefix "$p"
    [[ "$h" =~ ^[0-9]+$ ]] && [ "$h" -ge 1 ] && [ "$h" -le 200 ] || nc_die "--hosts must be 1..200"
    local bps; bps=$(nc_rate_bps "$rate") || exit 1
    local st="$NC_STATE_ROOT/$p"
    if [ -e "$st" ] || ip netns list | grep -q "^$p-"; then
        nc_die "a cluster with prefix '$p' already exists (netcluster.sh down --prefix $p)"
    fi
    mkdir -p "$st"
    echo "$h" >"$st/hosts"; echo "$rate" >"$st/rate"; echo "$delay" >"$st/delay"; echo "$owner" >"$st/owner"
    local br_ns; br_ns=$(nc_ns_br "$p")
    {
        ip netns add "$br_ns" &&
        ip -n "$br_ns" link set lo up &&
        ip -n "$br_ns" link add "${p}br" type bridge stp_state 0 forward_delay 0 &&
        ip -n "$br_ns" link set "${p}br" up
    } || { nc_down "$p"; nc_die "failed to create the bridge namespace"; }
    local i ns hif bif
    for ((i = 0; i < h; i++)); do
        ns=$(nc_ns_host "$p" "$i"); hif=$(nc_if_host "$p" "$i"); bif=$(nc_if_br "$p" "$i")
        {
            ip netns add "$ns" &&
            { ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
                  net.ipv6.conf.default.disable_ipv6=1 >/dev/null 2>&1 || true; } &&
            ip -n "$ns" link set lo up &&
            ip link add "$hif" netns "$ns" type veth peer name "$bif" netns "$br_ns" &&
            ip -n "$ns" addr add "$(nc_addr "$p" "$i")/24" dev "$hif" &&
            ip -n "$ns" link set "$hif" up &&
            ip -n "$br_ns" link set "$bif" master "${p}br" &&
            ip -n "$br_ns" link set "$bif" up &&
            nc_shape "$ns" "$hif" "$bps" "$delay" &&
            nc_shape "$br_ns" "$bif" "$bps" "$delay"
        } || { nc_down "$p"; nc_die "failed to create host $i"; }
    done
    # wait until every host-side link is up (veth carrier), so the first packets are not lost
    for ((i = 0; i < h; i++)); do
        local k
        for k in $(seq 50); do
            ip -n "$(nc_ns_host "$p" "$i")" link show "$(nc_if_host "$p" "$i")" | grep -q 'LOWER_UP' && break
            sleep 0.05
        done
    done
    nc_log "up: prefix=$p hosts=$h rate=$rate${delay:+ delay=$delay} addresses $NC_SUBNET.10..$NC_SUBNET.$((9 + h))"
}

# nc_down P: remove every namespace named P-*, any stray interface named P* in the root
# namespace (none is ever made there, but a crash mid-`ip link add` is cheap to cover),
# and the state directory. Idempotent, never fails.
nc_down() {
    local p=$1 ns
    nc_check_prefix "$p"
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$p-"); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -TERM 2>/dev/null
    done
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$p-"); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
        ip netns del "$ns" 2>/dev/null || nc_log "could not delete netns $ns"
    done
    local l
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^$p[hb]\(r\|[0-9]\+\)$"); do
        ip link del "$l" 2>/dev/null
    done
    rm -rf "${NC_STATE_ROOT:?}/$p"
    return 0
}

# nc_exec P I cmd...: cmd in host I's network namespace and a new UTS namespace.
nc_exec() {
    local p=$1 i=$2; shift 2
    local h; h=$(nc_hosts_of "$p") || exit 1
    [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -lt "$h" ] || nc_die "host index '$i' out of range 0..$((h - 1))"
    local ns; ns=$(nc_ns_host "$p" "$i")
    NETCLUSTER_PREFIX=$p NETCLUSTER_HOST=$i NETCLUSTER_ADDR=$(nc_addr "$p" "$i") \
    NETCLUSTER_IFACE=$(nc_if_host "$p" "$i") \
        exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

nc_info() {
    local p=$1 h i
    h=$(nc_hosts_of "$p") || exit 1
    echo "prefix=$p hosts=$h rate=$(cat "$NC_STATE_ROOT/$p/rate") delay=$(cat "$NC_STATE_ROOT/$p/delay") owner=$(cat "$NC_STATE_ROOT/$p/owner")"
    for ((i = 0; i < h; i++)); do
        echo "host $i netns=$(nc_ns_host "$p" "$i") iface=$(nc_if_host "$p" "$i") addr=$(nc_addr "$p" "$i")"
        ip netns exec "$(nc_ns_host "$p" "$i")" tc qdisc show dev "$(nc_if_host "$p" "$i")" | sed 's/^/    up:   /'
        ip netns exec "$(nc_ns_br "$p")" tc qdisc show dev "$(nc_if_br "$p" "$i")" | sed 's/^/    down: /'
    done
}

# nc_prefixes STEM: prefixes of clusters (state dirs or namespaces) starting with STEM.
nc_prefixes() {
    local stem=$1
    {
        ls "$NC_STATE_ROOT" 2>/dev/null
        ip netns list 2>/dev/null | awk '{print $1}' | grep -- '-\(br\|h[0-9]\+\)$' | sed 's/-\(br\|h[0-9]\+\)$//'
    } | grep "^$stem" | sort -u
}

nc_owner_alive() {
    local o; o=$(cat "$NC_STATE_ROOT/$1/owner" 2>/dev/null)
    [ -n "$o" ] && kill -0 "$o" 2>/dev/null
}

nc_list() {
    local p s
    for p in $(nc_prefixes "$1"); do
        if nc_owner_alive "$p"; then s=alive; else s=orphaned; fi
        echo "$p hosts=$(cat "$NC_STATE_ROOT/$p/hosts" 2>/dev/null || echo '?') owner=$(cat "$NC_STATE_ROOT/$p/owner" 2>/dev/null || echo '?') $s"
    done
}

nc_cleanup() {
    local stem=$1 force=$2 p n=0
    for p in $(nc_prefixes "$stem"); do
        [[ "$p" =~ ^[a-z][a-z0-9]{1,10}$ ]] || continue
        if [ "$force" != 1 ] && nc_owner_alive "$p"; then
            nc_log "cleanup: keeping $p (owner $(cat "$NC_STATE_ROOT/$p/owner") alive; --force to remove)"
            continue
        fi
        nc_down "$p"; n=$((n + 1)); nc_log "cleanup: removed $p"
    done
    nc_log "cleanup: $n cluster(s) removed"
}

nc_usage() { sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

nc_main() {
    set -uo pipefail
    [ $# -ge 1 ] || nc_usage
    local mode=$1; shift
    local hosts="" rate="" delay="" prefix="${NETCLUSTER_PREFIX:-}" owner=$PPID force=0 idx=""
    case "$mode" in -h|--help|help) nc_usage 0 ;; esac
    while [ $# -gt 0 ]; do
        case "$1" in
            --hosts) hosts=$2; shift 2 ;;
            --rate) rate=$2; shift 2 ;;
            --delay) delay=$2; shift 2 ;;
            --prefix) prefix=$2; shift 2 ;;
            --owner-pid) owner=$2; shift 2 ;;
            --force) force=1; shift ;;
            --) shift; break ;;
            -h|--help) nc_usage 0 ;;
            [0-9]*) idx=$1; shift ;;
            *) nc_die "unknown argument '$1' (try --help)" ;;
        esac
    done
    nc_require
    case "$mode" in
        up)
            [ -n "$hosts" ] && [ -n "$rate" ] || nc_die "up needs --hosts and --rate"
            [ -n "$prefix" ] || prefix=$(nc_new_prefix)
            nc_up "$prefix" "$hosts" "$rate" "$delay" "$owner"
            echo "$prefix" ;;
        down)
            [ -n "$prefix" ] || nc_die "down needs --prefix (or NETCLUSTER_PREFIX); leftovers: netcluster.sh cleanup"
            nc_down "$prefix" ;;
        exec)
            [ -n "$prefix" ] || nc_die "exec needs --prefix (or NETCLUSTER_PREFIX)"
            [ -n "$idx" ] && [ $# -ge 1 ] || nc_die "usage: exec [--prefix P] HOSTINDEX -- cmd..."
            nc_exec "$prefix" "$idx" "$@" ;;
        run)
            [ -n "$hosts" ] && [ -n "$rate" ] && [ $# -ge 1 ] || nc_die "usage: run --hosts H --rate R [--delay D] [--prefix P] -- cmd..."
            [ -n "$prefix" ] || prefix=$(nc_new_prefix)
            nc_check_prefix "$prefix"
            local child=""
            trap 'nc_down "$prefix"' EXIT
            # the command runs in the background so that INT/TERM reach this shell at once
            # (bash defers traps while a foreground child runs): stop it, then tear down.
            trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; exit 130' INT
            trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; exit 143' TERM
            nc_up "$prefix" "$hosts" "$rate" "$delay" "$$"
            NETCLUSTER_PREFIX=$prefix NETCLUSTER_HOSTS=$hosts NETCLUSTER_RATE=$rate "$@" <&0 &
            child=$!
            wait "$child"
            exit $? ;;
        info) [ -n "$prefix" ] || nc_die "info needs --prefix"; nc_info "$prefix" ;;
        addr) [ -n "$idx" ] || nc_die "usage: addr I"; nc_addr "$prefix" "$idx" ;;
        iface) [ -n "$prefix" ] && [ -n "$idx" ] || nc_die "usage: iface --prefix P I"; nc_if_host "$prefix" "$idx" ;;
        list) nc_list "${prefix:-psg}" ;;
        cleanup) nc_cleanup "${prefix:-psg}" "$force" ;;
        *) nc_die "unknown mode '$mode' (up, down, exec, run, info, addr, iface, list, cleanup)" ;;
    esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    nc_main "$@"
fi
