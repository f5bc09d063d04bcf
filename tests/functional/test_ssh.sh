#!/usr/bin/env bash
# test_ssh.sh - deploy/psagg-ssh against real OpenSSH servers: 3 hosts in network namespaces
# on a bridge (10.214.0.1-3), each running its own sshd with keys made here (nothing of the
# system's ssh configuration is read or written).
#
# Usage: tests/functional/test_ssh.sh BUILD_DIR
# From host 0, psagg-ssh runs 2 servers (hosts 1 and 2) and 4 workers (fn_worker: sums checked
# exactly; hosts 0:2 1:1 2:1) from one INI file:
#   1. the job succeeds (exit 0), every line carries its "[host role rank]" prefix
#   2. a remote worker SIGKILLed mid-job: psagg-ssh stops everything, exits non-zero, and
#      its summary names that worker
#   3. SIGINT to psagg-ssh mid-job: exit 130
#   4. the same job elastic ([cluster] elastic = on): the remote worker SIGKILLed mid-job, the
#      three others finish every round with exact sums without it (fn_worker --elastic-dead)
#      and identical digests, and psagg-ssh exits 0 saying the job ended without it
#   5. elastic with --restarts 1: the remote worker SIGKILLed mid-job is started again on its
#      host by psagg-ssh and joins the running job (fn_worker --sync --rejoin): from the
#      barrier that admitted it every element is the exact sum of all four, the last rounds
#      are bit-identical on all four, and psagg-ssh exits 0
#   6. a remote command whose ssh stdin is at EOF before the program starts (psagg-ssh closed
#      it early): the program is stopped (SIGTERM) and ssh returns
#   7. [cluster] server_replicas = 1 with --restarts 1: the remote server 1 SIGKILLed mid-job is
#      started again on its host by psagg-ssh (same command line, same port) and rejoins the
#      job; every worker takes it back, ends with exact sums and the same digest, exit 0
# After each, no process of the job may be left in any namespace (only the sshd listeners)
# 15 s after the launcher returned.
# Exit 0 passed, 1 failed, 77 skipped (not root, or no sshd / ip / setsid).
set -u -o pipefail

build=${1:?usage: test_ssh.sh BUILD_DIR}
skip() { echo "test_ssh: SKIP: $*"; exit 77; }
((EUID == 0)) || skip "needs root (network namespaces)"
[[ -x /usr/sbin/sshd ]] || skip "no /usr/sbin/sshd (apt-get install openssh-server)"
for t in ip ssh ssh-keygen setsid ss; do command -v $t >/dev/null || skip "no '$t'"; done
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo

N=3 NET=10.214.0
id=$(printf '%04x' $((RANDOM)))
br=psb$id
D=$tmp
chmod 700 "$D"
ns() { echo "pss$id-$1"; }

alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [[ -n $s && $s != Z* ]]; }
teardown() {
    local pids="" p i
    for f in "$D"/sshd*.pid; do [[ -s $f ]] && pids+=" $(cat "$f")"; done
    for ((i = 0; i < N; i++)); do pids+=" $(ip netns pids "$(ns $i)" 2>/dev/null | tr '\n' ' ')"; done
    # shellcheck disable=SC2086
    [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
    for ((i = 0; i < N; i++)); do ip netns del "$(ns $i)" 2>/dev/null; done
    ip link del "$br" 2>/dev/null
}
at_exit teardown

# ---- hosts: keys, known_hosts, ssh config, namespaces, one sshd each ----
ssh-keygen -q -t ed25519 -N '' -C psagg-test -f "$D/id_ed25519"
cp "$D/id_ed25519.pub" "$D/authorized_keys"
chmod 600 "$D/authorized_keys"
: >"$D/known_hosts"
for ((i = 0; i < N; i++)); do
    ssh-keygen -q -t ed25519 -N '' -C "host$i" -f "$D/host$i"
    echo "$NET.$((i + 1)) $(cut -d' ' -f1,2 "$D/host$i.pub")" >>"$D/known_hosts"
done
cat >"$D/ssh_config" <<CONF
Host $NET.*
  User root
  IdentityFile $D/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking yes
  UserKnownHostsFile $D/known_hosts
  GlobalKnownHostsFile /dev/null
  ConnectTimeout 5
  LogLevel ERROR
CONF
ip link add "$br" type bridge || fail "cannot create bridge $br"
ip link set "$br" up
for ((i = 0; i < N; i++)); do
    ip netns add "$(ns $i)"
    ip link add "psv$id$i" type veth peer name eth0 netns "$(ns $i)"
    ip link set "psv$id$i" master "$br" up
    ip -n "$(ns $i)" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$(ns $i)" link set eth0 up
    ip -n "$(ns $i)" link set lo up
done
install -d -m 0755 /run/sshd
for ((i = 0; i < N; i++)); do
    cat >"$D/sshd$i.conf" <<CONF
ListenAddress $NET.$((i + 1)):22
HostKey $D/host$i
PidFile $D/sshd$i.pid
AuthorizedKeysFile $D/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
CONF
    ip netns exec "$(ns $i)" /usr/sbin/sshd -f "$D/sshd$i.conf" -E "$D/sshd$i.log" ||
        fail "sshd $i did not start: $(cat "$D/sshd$i.log")"
done
for ((i = 0; i < N; i++)); do
    for ((k = 0; k < 50; k++)); do
        ip netns exec "$(ns $i)" ss -Hltn "sport = :22" | grep -q . && break
        sleep 0.1
    done
done
ip netns exec "$(ns 0)" ssh -n -F "$D/ssh_config" "$NET.3" true ||
    fail "ssh from host 0 to host 2 does not work"

# ---- the job ----
cat >"$D/job.ini" <<INI
[cluster]
job_id = test-ssh-$id
servers = $NET.2:19870 $NET.3:19870
workers = 4
worker_hosts = $NET.1:2 $NET.2 $NET.3
connect_timeout_ms = 20000
op_timeout_ms = 5000
[log]
level = warn
INI
{
    cat "$D/job.ini"
    printf '[cluster]\nelastic = on\nmin_workers = 2\n'
} >"$D/elastic.ini"
{
    cat "$D/job.ini"
    printf '[cluster]\nserver_replicas = 1\n'
} >"$D/replicas.ini"
launch() { # args for fn_worker; call it in a subshell: it becomes psagg-ssh (signals reach it)
    exec ip netns exec "$(ns 0)" "$repo/deploy/psagg-ssh" --config "$D/${INI:-job.ini}" --ssh "ssh -F $D/ssh_config" \
        --server-bin "$build/server/psagg-server" --grace 2 --restarts "${RESTARTS:-0}" -- \
        "$build/tests/functional/fn_worker" --codec fp32 --random-tensors 20 "$@"
}
# Only the sshd listeners may be left in the namespaces (their pids are in sshd*.pid).
check_clean() { # case
    local i k left listeners
    listeners=" $(cat "$D"/sshd*.pid | tr '\n' ' ') "
    for ((k = 0; k < 150; k++)); do # 15 s: teardown under ASan on 2 busy cores is slow
        left=""
        for ((i = 0; i < N; i++)); do
            for p in $(ip netns pids "$(ns $i)"); do
                [[ $listeners == *" $p "* ]] && continue
                alive "$p" && left+=" host$i:$p($(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | cut -c1-60))"
            done
        done
        [[ -z $left ]] && break
        sleep 0.1
    done
    [[ -z $left ]] || fail "$1: processes left behind:$left"
    echo "test_ssh: $1: nothing left in any namespace"
}
pid_in_ns() { # ns-index program: the process whose argv[0] is that program
    local p a0
    for p in $(ip netns pids "$(ns $1)"); do
        a0=$(tr '\0' '\n' 2>/dev/null </proc/"$p"/cmdline | head -n 1)
        [[ ${a0##*/} == "$2" ]] && { echo "$p"; return; }
    done
}

# 1. success
t0=$(date +%s.%N)
(launch --rounds 20) >"$D/ok.out" 2>&1
rc=$?
((rc == 0)) || { cat "$D/ok.out" >&2; fail "success: psagg-ssh exited $rc"; }
grep -q "all 4 worker(s) exited 0" "$D/ok.out" || fail "success: no final message"
grep -v '^\[10\.214\.0\.[1-3] \(server [01]\|worker [0-3]\)\] \|^psagg-ssh: ' "$D/ok.out" | grep -q . &&
    fail "success: lines without a host/role/rank prefix: $(grep -v '^\[10\.214\|^psagg-ssh: ' "$D/ok.out" | head -3)"
echo "test_ssh: success: 2 servers + 4 workers over ssh, sums exact, in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s"
check_clean success

# 2. a remote worker killed
(launch --rounds 1000000) >"$D/kill.out" 2>&1 &
lp=$!
for ((k = 0; k < 100; k++)); do
    victim=$(pid_in_ns 2 fn_worker)
    [[ -n $victim ]] && grep -q "worker" "$D/kill.out" && break
    sleep 0.1
done
[[ -n $victim ]] || { kill -INT $lp; wait $lp; cat "$D/kill.out" >&2; fail "kill: no worker on host 2"; }
sleep 1
kill -KILL "$victim"
wait $lp
rc=$?
((rc != 0)) || fail "kill: psagg-ssh exited 0"
grep -q "summary: FAILED: $NET.3 worker 3 failed with status 137 (killed by SIGKILL)" "$D/kill.out" ||
    { cat "$D/kill.out" >&2; fail "kill: the summary does not name $NET.3 worker 3"; }
echo "test_ssh: kill: psagg-ssh exited $rc: $(grep 'summary:' "$D/kill.out")"
check_clean kill

# 3. SIGINT to the launcher
(launch --rounds 1000000) >"$D/int.out" 2>&1 &
lp=$!
for ((k = 0; k < 100; k++)); do
    [[ -n $(pid_in_ns 1 fn_worker) && -n $(pid_in_ns 2 psagg-server) ]] && break
    sleep 0.1
done
sleep 1
kill -INT $lp
wait $lp
rc=$?
((rc == 130)) || { cat "$D/int.out" >&2; fail "sigint: psagg-ssh exited $rc, expected 130"; }
grep -q "got SIGINT; stopping everything" "$D/int.out" || fail "sigint: no message"
check_clean sigint

# 4. elastic: a remote worker killed, the job goes on
# (killed at its round 20, once the start-up, which is not elastic, is over: not a fixed time
# after it, which a fast machine could spend finishing the 400 rounds; 5 ms a round: 2 s at least)
(INI=elastic.ini launch --rounds 400 --elastic-dead 3 --progress --round-sleep-ms 5) >"$D/el.out" 2>&1 &
lp=$!
for ((k = 0; k < 300; k++)); do
    victim=$(pid_in_ns 2 fn_worker)
    [[ -n $victim ]] && grep -q "worker 3\] ROUND 20$" "$D/el.out" && break
    sleep 0.1
done
[[ -n $victim ]] || { kill -INT $lp; wait $lp; cat "$D/el.out" >&2; fail "elastic: no worker on host 2"; }
kill -KILL "$victim"
wait $lp
rc=$?
((rc == 0)) || { cat "$D/el.out" >&2; fail "elastic: psagg-ssh exited $rc"; }
grep -q "the elastic job ended without the 1 worker(s) that failed" "$D/el.out" ||
    { cat "$D/el.out" >&2; fail "elastic: no final message"; }
(($(grep -c '\] ELASTIC worker [0-2] epoch 1 rank [0-2] size 3' "$D/el.out") == 3)) ||
    { cat "$D/el.out" >&2; fail "elastic: not every survivor ended in epoch 1 of 3 workers"; }
(($(grep '\] DIGEST' "$D/el.out" | sed 's/.*DIGEST //' | sort -u | wc -l) == 1)) ||
    { grep DIGEST "$D/el.out" >&2; fail "elastic: the survivors' digests differ"; }
echo "test_ssh: elastic: worker 3 killed over ssh, the 3 others finished: $(grep -m1 '\] ELASTIC' "$D/el.out")"
check_clean elastic

# 5. elastic with --restarts: the killed remote worker comes back and joins
(INI=elastic.ini RESTARTS=1 launch --rounds 300 --sync --round-sleep-ms 30 --elastic-dead 3 --rejoin) >"$D/rj.out" 2>&1 &
lp=$!
for ((k = 0; k < 300; k++)); do
    victim=$(pid_in_ns 2 fn_worker)
    [[ -n $victim ]] && grep -q "worker 3\] fn_worker 3: the job runs" "$D/rj.out" && break
    sleep 0.1
done
[[ -n $victim ]] || { kill -INT $lp; wait $lp; cat "$D/rj.out" >&2; fail "restarts: no worker on host 2"; }
sleep 1
kill -KILL "$victim"
wait $lp
rc=$?
((rc == 0)) || { cat "$D/rj.out" >&2; fail "restarts: psagg-ssh exited $rc"; }
grep -q "worker 3 failed with status 137 (killed by SIGKILL); starting it again (restart 1 of 1)" "$D/rj.out" ||
    { cat "$D/rj.out" >&2; fail "restarts: psagg-ssh did not start worker 3 again"; }
grep -q "fn_worker 3: joined at round" "$D/rj.out" || { cat "$D/rj.out" >&2; fail "restarts: worker 3 did not join"; }
(($(grep '\] TAIL' "$D/rj.out" | wc -l) == 4 && $(grep '\] TAIL' "$D/rj.out" | sed 's/.*TAIL //' | awk '{print $1}' | sort -u | wc -l) == 1)) ||
    { grep 'TAIL\|ELASTIC' "$D/rj.out" >&2; fail "restarts: the four workers' last rounds differ"; }
echo "test_ssh: restarts: worker 3 killed over ssh, started again, $(grep -o 'joined at round [0-9]*' "$D/rj.out"); 4 workers bit-identical"
check_clean restarts
# 6. a connection that closes before its program starts: the watchdog stops the program all
# the same (the EOF comes before the program exists; a wrapper on `wait -n` waited forever)
cmd=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import psagg.launch as l
print(l.Proc("h", "worker", 0, ["sleep", "300"], {}).remote_command(1, "/"))' "$repo/worker/python") ||
    fail "early eof: cannot make the remote command"
t0=$(date +%s%N)
timeout 30 ip netns exec "$(ns 0)" ssh -F "$D/ssh_config" "$NET.2" "$cmd" </dev/null
rc=$?
t=$((($(date +%s%N) - t0) / 1000000))
((rc == 143)) || fail "early eof: ssh returned $rc after ${t} ms (124: the remote program outlived its connection), expected 143 (the program stopped by SIGTERM)"
echo "test_ssh: early eof: the remote program was stopped with its connection, ssh returned in ${t} ms"
check_clean early_eof

# 7. server_replicas with --restarts: the killed remote server comes back and rejoins
# (the workers hold at round 380 until every one took server 1 back: its restart over ssh, under
# ASan too, must not find the job ended)
(INI=replicas.ini RESTARTS=1 launch --rounds 400 --round-sleep-ms 10 --progress --hold "380:$D/sr-back") \
    >"$D/sr.out" 2>&1 &
lp=$!
for ((k = 0; k < 300; k++)); do
    victim=$(pid_in_ns 2 psagg-server)
    [[ -n $victim ]] && grep -q "worker 0\] ROUND 30$" "$D/sr.out" && break
    sleep 0.1
done
[[ -n $victim ]] || { kill -INT $lp; wait $lp; cat "$D/sr.out" >&2; fail "server restart: no server on host 2"; }
kill -KILL "$victim"
all_back() { (($(grep -c "server 1 is back in view" "$D/sr.out") == 4)); }
wait_until 60 all_back || { kill -INT $lp; wait $lp; cat "$D/sr.out" >&2; fail "server restart: not every worker took server 1 back within 60 s"; }
touch "$D/sr-back"
wait $lp
rc=$?
((rc == 0)) || { cat "$D/sr.out" >&2; fail "server restart: psagg-ssh exited $rc"; }
grep -qF "psagg-ssh: $NET.3 server 1 ($NET.3:19870) died with status 137 (killed by SIGKILL): restarted (restart 1 of 1)" "$D/sr.out" ||
    { cat "$D/sr.out" >&2; fail "server restart: psagg-ssh did not start server 1 again"; }
(($(grep -c "server 1 is back in view" "$D/sr.out") == 4)) ||
    { cat "$D/sr.out" >&2; fail "server restart: not every worker took server 1 back"; }
(($(grep '\] DIGEST' "$D/sr.out" | wc -l) == 4 && $(grep '\] DIGEST' "$D/sr.out" | sed 's/.*DIGEST //' | sort -u | wc -l) == 1)) ||
    { grep DIGEST "$D/sr.out" >&2; fail "server restart: the four workers' digests differ"; }
echo "test_ssh: server restart: server 1 killed over ssh, started again, $(grep -m1 -o 'server 1 is back in view [0-9]*' "$D/sr.out"); 4 workers bit-identical"
check_clean server_restart
echo "test_ssh: passed"
