#!/usr/bin/env bash
# test_slurm.sh - deploy/psagg-slurm against a real Slurm: munged, slurmctld and four slurmd's
# (nodes n1..n4 on 127.0.0.1) started here with a private slurm.conf (SLURM_CONF; nothing in
# /etc/slurm is read or written), jobs submitted with sbatch.
#
# Usage: tests/functional/test_slurm.sh BUILD_DIR
#   1. deploy/psagg.sbatch on 4 nodes x 2 tasks, --placement own --servers 2: 2 servers (n1,
#      n2) and 4 workers (fn_worker, sums exact; n3, n4): the job COMPLETED, its output has
#      the prefixed lines and "all 4 worker(s) exited 0"
#   2. a failing job (worker 1 declares other tensors) colocated on 2 nodes: the job ends
#      FAILED, and its output names the failure in psagg-slurm's summary
#   3. [cluster] server_replicas = 1 and --restarts 1: server 1 SIGKILLed at round 50 is
#      started again by psagg-slurm (srun on its node) and rejoins; the job COMPLETED, every
#      worker's sums exact and every worker took server 1 back
# Every daemon started here is stopped, and no job, slurmstepd, psagg-server or fn_worker is
# left. Exit 0 passed, 1 failed, 77 skipped (not root, or Slurm/munge not installed).
set -u -o pipefail

build=$(cd -- "${1:?usage: test_slurm.sh BUILD_DIR}" && pwd) || exit 1
skip() { echo "test_slurm: SKIP: $*"; exit 77; }
((EUID == 0)) || skip "needs root (slurmd, munged)"
for t in slurmctld slurmd munged; do [[ -x /usr/sbin/$t ]] || skip "no /usr/sbin/$t (apt-get install slurmctld slurmd slurm-client munge)"; done
for t in sbatch squeue scancel scontrol srun munge; do command -v $t >/dev/null || skip "no '$t'"; done
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [[ -n $s && $s != Z* ]]; }

# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
repo=$h_repo
D=$tmp
chmod 755 "$D"
export SLURM_CONF=$D/slurm.conf
started_munge=""
teardown() {
    local pids="" p
    # jobs first: their slurmstepd's and tasks outlive the daemons
    if [[ -s $D/slurmctld.pid ]] && alive "$(cat "$D/slurmctld.pid")"; then
        scancel --full $(squeue -h -o %i 2>/dev/null) 2>/dev/null
        for _ in $(seq 100); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.1; done
    fi
    for f in "$D"/slurmd-*.pid "$D"/slurmctld.pid ${started_munge:+/run/munge/munged.pid}; do
        [[ -s $f ]] && pids+=" $(cat "$f")"
    done
    # shellcheck disable=SC2086
    [[ -n ${pids// /} ]] && kill -TERM $pids 2>/dev/null
    for p in $pids; do
        for _ in $(seq 50); do alive "$p" || break; sleep 0.1; done
        alive "$p" && kill -KILL "$p" 2>/dev/null
    done
}
at_exit teardown

# ---- munge (the system's key; started here unless one runs) ----
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
    started_munge=1
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n </dev/null | unmunge >/dev/null || fail "munge does not work"

# ---- slurm: controller + 4 nodes on 127.0.0.1, everything under $D ----
mkdir -p "$D/state" "$D/out"
cat >"$SLURM_CONF" <<CONF
ClusterName=psaggtest
SlurmctldHost=localhost
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmdSpoolDir=$D/spool-%n
StateSaveLocation=$D/state
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17101-17104] CPUs=4 RealMemory=2000 State=UNKNOWN
PartitionName=psagg Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
t0=$(date +%s.%N)
/usr/sbin/slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start: $(tail -5 "$D/slurmctld.log")"
for i in 1 2 3 4; do /usr/sbin/slurmd -f "$SLURM_CONF" -N n$i || fail "slurmd n$i did not start"; done
for _ in $(seq 150); do [[ $(sinfo -h -o %t 2>/dev/null | sort -u) == idle ]] && break; sleep 0.2; done
[[ $(sinfo -h -o %t | sort -u) == idle ]] || fail "nodes not idle: $(sinfo -N 2>&1)"
echo "test_slurm: slurm up (4 nodes) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"

cat >"$D/template.ini" <<INI
[cluster]
job_id = test-slurm
servers = 127.0.0.1:1
workers = 1
connect_timeout_ms = 20000
op_timeout_ms = 5000
[log]
level = warn
INI
# submit NAME SBATCH-ARGS... -- PSAGG-SLURM-ARGS...: wait for the job; prints its id. With
# $nowait set it prints the id at once (then: finish NAME ID); $template: another template
submit() {
    local name=$1 jid
    shift
    local sb=() ; while [[ $1 != -- ]]; do sb+=("$1"); shift; done; shift
    jid=$(cd "$D" && PSAGG_HOME=$repo sbatch --parsable -o "$D/out/$name.out" "${sb[@]}" \
        "$repo/deploy/psagg.sbatch" "${template:-$D/template.ini}" --job-config "$D/$name.ini" \
        --server-bin "$build/server/psagg-server" "$@") || fail "$name: sbatch failed"
    [[ -n ${nowait:-} ]] || finish "$name" "$jid"
    echo "$jid"
}
finish() { # finish NAME ID: wait (120 s at most) until job ID has ended
    for _ in $(seq 600); do [[ -z $(squeue -h -j "$2" 2>/dev/null) ]] && break; sleep 0.2; done
    [[ -z $(squeue -h -j "$2" 2>/dev/null) ]] || fail "$1: job $2 still queued/running after 120 s"
}
state() { scontrol show job "$1" | grep -o 'JobState=[A-Z]*' | cut -d= -f2; }
# ours PID: a process of this test's Slurm (started by its slurmd's, whose environment has our
# SLURM_CONF), not one of another test running beside this one (fn_worker, under ctest -j)
ours() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"; }
check_clean() { # case: no job and nothing of ours left
    local left
    [[ -z $(squeue -h 2>/dev/null) ]] || fail "$1: jobs left: $(squeue -h)"
    for _ in $(seq 50); do
        left=$(ps -eo pid=,stat=,args= | awk '$2 !~ /^Z/' | grep -E 'slurmstepd|fn_worker|psagg-server --config '"$D" |
            grep -v grep | while read -r pid rest; do ours "$pid" && echo "$pid $rest"; done)
        [[ -z $left ]] && break
        sleep 0.1
    done
    [[ -z $left ]] || fail "$1: processes left: $left"
    echo "test_slurm: $1: no job and no process left"
}

# 1. the job
t0=$(date +%s.%N)
jid=$(submit ok -N 4 --ntasks-per-node 2 -- --placement own --servers 2 -- \
    "$build/tests/functional/fn_worker" --codec fp32 --rounds 20 --random-tensors 20) || exit 1
out=$D/out/ok.out
[[ $(state "$jid") == COMPLETED ]] || { cat "$out" >&2; fail "ok: job $jid ended $(state "$jid")"; }
grep -q "all 4 worker(s) exited 0" "$out" || { cat "$out" >&2; fail "ok: no success message"; }
grep -q "2 server(s) on n1,n2, 4 worker(s) on n3:2 n4:2" "$out" || { cat "$out" >&2; fail "ok: placement"; }
echo "test_slurm: ok: job $jid COMPLETED in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: $(grep -o 'allocation .*' "$out" | head -n 1)"
check_clean ok

# 2. a failing job
jid=$(submit bad -N 2 --ntasks-per-node 2 -- --placement colocated -- \
    "$build/tests/functional/fn_worker" --codec fp32 --rounds 5 --mismatch-rank 1) || exit 1
out=$D/out/bad.out
st=$(state "$jid")
[[ $st == FAILED ]] || { cat "$out" >&2; fail "bad: job $jid ended $st, expected FAILED"; }
grep -q "summary: FAILED: n[12] worker [0-3] failed" "$out" || { cat "$out" >&2; fail "bad: no failure summary in the job's output"; }
echo "test_slurm: bad: job $jid FAILED: $(grep 'summary:' "$out")"
check_clean bad
# 3. a server killed mid-job, restarted by psagg-slurm (--restarts), rejoins
# ([cluster] server_replicas = 1): the job completes, every worker's sums exact (fn_worker checks
# each fp32 round against its own sum), every worker took server 1 back
sed -e 's/^op_timeout_ms = .*/op_timeout_ms = 3000\nserver_replicas = 1/' -e 's/^level = warn/level = info/' \
    -e 's/^servers = .*/servers = 127.0.0.1:1 127.0.0.1:2/' "$D/template.ini" >"$D/template-replicas.ini"
t0=$(date +%s.%N)
jid=$(template=$D/template-replicas.ini nowait=1 submit restart -N 4 --ntasks-per-node 2 -- \
    --placement own --servers 2 --restarts 1 -- "$build/tests/functional/fn_worker" --codec fp32 \
    --rounds 400 --random-tensors 10 --round-sleep-ms 10 --progress --hold "380:$D/restart-back") || exit 1
out=$D/out/restart.out
wait_until 60 grep -qs "ROUND 50$" "$out" || { cat "$out" >&2; fail "restart: the workers never reached round 50"; }
# the server itself: srun's command line and the watchdog's (bash -c ... COMMAND) hold its
# command line too, and which of them has the lowest pid changes once pids wrap around (killing
# the watchdog left the server running, holding its port against its restart)
victim=$(pgrep -f -- "^([^ ]*/)?psagg-server --config $D/restart.ini --rank 1\$")
[[ -n $victim ]] || { ps -eo pid,args | grep psagg-server >&2; fail "restart: no server 1 process"; }
kill -KILL "$victim"
# (the workers hold at round 380 until every one took server 1 back: its restart through srun,
# under ASan too, must not find the job ended)
all_back() { (($(grep -c "server 1 is back in view" "$out") == 4)); }
wait_until 60 all_back || { cat "$out" >&2; touch "$D/restart-back"; fail "restart: not every worker took server 1 back within 60 s"; }
touch "$D/restart-back"
finish restart "$jid"
[[ $(state "$jid") == COMPLETED ]] || { cat "$out" >&2; fail "restart: job $jid ended $(state "$jid")"; }
grep -q "all 4 worker(s) exited 0" "$out" || { cat "$out" >&2; fail "restart: no success message"; }
grep -q "server 1 (.*) died with status 137 (killed by SIGKILL): restarted (restart 1 of 1)" "$out" ||
    { cat "$out" >&2; fail "restart: psagg-slurm did not restart server 1"; }
n_back=$(grep -c "server 1 is back in view" "$out")
((n_back == 4)) || { cat "$out" >&2; fail "restart: $n_back of 4 workers took server 1 back"; }
echo "test_slurm: restart: job $jid COMPLETED in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s," \
    "server 1 SIGKILLed at round 50, restarted by psagg-slurm and back in every worker's view;" \
    "$(grep -o 'summary: .*' "$out" | head -n 1)"
check_clean restart
echo "test_slurm: passed"
