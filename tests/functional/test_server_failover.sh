#!/usr/bin/env bash
# test_server_failover.sh BUILD_DIR [PART [PORT]] - a server dies and the job goes on
# ([cluster] server_replicas; docs/design.md, "Servers that fail and join").
#
# Each case runs fn_worker (3 workers, 300 rounds of five tensors, fp32 checked bit for bit
# against its own sum in every round) and SIGKILLs or SIGSTOPs one server once worker 0 starts
# round K, plus a delay of 0..5 ms (so the death lands while pushes arrive, while the server
# folds or while its updates go out). Every worker must exit 0 and print the DIGEST of the same
# job run without a death (bit-identical), every worker must have taken server view 1, and the
# server that took the chunks over must say so. Cases:
#   kill1, kill1-late  2 servers, server 1 SIGKILLed (the coordinator is server 0)
#   kill0              2 servers, server 0 SIGKILLed (the coordinator is then server 1)
#   three-maxmin4      3 servers, 4-bit stochastic rounding, server 2 SIGKILLed: the new
#                      owner writes the dead owner's bits (the chunk's random key)
#   auth               a secret and data_auth: pushes sealed again for the new owner
#   stop               server 1 SIGSTOPped (hung, not dead): lost after op_timeout_ms of silence
#   two-1-2, two-0-1   3 servers, server_replicas = 2, maxmin4: two servers SIGKILLed at once;
#                      two views, one after the other, and the survivor owns every chunk
#   over               3 servers, server_replicas = 1, two SIGKILLed at once: a chunk has no
#                      live holder; every worker fails naming it and its servers
#   r0                 server_replicas = 0: the same death fails every worker naming the server
# Parameter chunks (fn_optim, [server] optimizer; optim-*) and a server residual
# ([server] error_feedback; residual-*): the chunks' copies take over (see below); ck-*:
# checkpoints written before and after a takeover, resumed bit-identical.
# Servers that come back (started again with the same command line once every worker took the
# view without them; the workers sleep 10 ms a round so that the job outlasts it):
#   back1              server 1 SIGKILLed and restarted: it rejoins in view 2 and owns its chunks
#                      again (bit-identical)
#   back0              the same for server 0, the coordinator (server 1 coordinates its return)
#   back1-kill0        server 1 back in view 2, then server 0 SIGKILLed: server 1 takes every
#                      chunk over in view 3 (its own, back, and server 0's)
#   back1-twice        server 1 killed, back, killed again and back again (views 1..4)
#   back1-impostor     with a secret, on server 1's port while it is out: a psagg-server with
#                      another secret (it refuses the workers' HELLOs), then a process without
#                      the secret that answers HELLO (fake_server.py: every worker refuses its
#                      WELCOME); then the real one is back
# Adaptive codecs ([codec] adaptive = on; fn_adaptive: the codecs change every 2 rounds, every
# output checked bit for bit against its own reference; adaptive-*): the statistics tensor is a
# sum tensor like any other, its rounds pushed again to the new owner.
# Integer aggregation (the thc codec; fn_thc: every update checked bit for bit against its own
# reference of the job; thc-*): the integer sums hold no state between rounds, so a new owner
# sums the rounds pushed again to it into the same bits.
# Servers that die during the start-up (su-*: 2 servers, connect_timeout_ms = 3000; "during
# the declaration": once worker 0 has said HELLO to both servers and declared, before workers
# 1 and 2 start):
#   su-absent1, su-absent0  server 1 (or 0, the coordinator) never starts: every worker gives it
#                      up at connect_timeout_ms and the job starts in view 1 without it
#   su-impostor1       with a secret: a process without it (fake_server.py) on server 1's port
#                      all along: every worker refuses its WELCOME and gives server 1 up
#   su-kill1           server 1 SIGKILLed during the declaration, never back: given up, view 1
#   su-kill1-now       the same, started again at once: the workers connect and declare to it
#                      again and the job starts with both servers (no view 1)
#   su-kill0-back      server 0 SIGKILLed during the declaration, started again once every worker
#                      took view 1: it rejoins (view 2)
#   su-stop0-first     server 0 SIGSTOPped before any worker starts (its kernel accepts, it says
#                      nothing): the workers' attempts on it do not use up server 1's, and they
#                      give server 0 up and start in view 1 with server 1 coordinating
#   su-stop1           server 1 SIGSTOPped during the declaration: given up at the deadline
#                      (view 1), then SIGKILLed and started again: it rejoins (view 2)
#   su-optim-kill0     fn_optim (parameter chunks): server 0 SIGKILLed during the declaration:
#                      its copies own its chunks from their INIT, exact
#   su-optim-grow1     fn_optim: server 1 not started with the job, started once it runs in
#                      view 1: the job grows to two servers, server 1 with its chunks' state
#   su-r0              server_replicas = 0: the same death fails every worker's start-up naming
#                      server 1, as it always did
# Each ends bit-identical to its uninterrupted run. A round a kill leaves with its update at some
# workers only is relayed to the new owner (counted at the end, over every case;
# test_server_partition.sh's end and relay cases make one for sure).
# PART: sum (the fn_worker cases but back*), sum_back (back*: servers that come back), optim
# (optim-* up to optim-two-*: parameter chunks' copies take over), optim_back (optim-back*: a
# server that comes back receives the state), state (ck-* and residual-*), adaptive, thc,
# startup, or all (the default). (One ctest entry each: the state cases in one took 489 s under
# ASan on the 2-core VM, over the 480 s limit, and sum with sum_back 315 s.) startup (su-ref
# to su-kill1-now) and startup_back (su-kill0-back on, su-optim-*, su-r0) the same way.
set -u -o pipefail
build=$1 part=${2:-all}
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 3 "${3:-}"
worker_bin=$build/tests/functional/fn_worker
optim_bin=$build/tests/functional/fn_optim
adaptive_bin=$build/tests/functional/fn_adaptive
thc_bin=$build/tests/functional/fn_thc
rounds=300
mark=ROUND # (what a worker prints as it starts round n: fn_worker ROUND n, fn_optim STEP n)
head -c 32 /dev/urandom | base64 >"$tmp/secret"
chmod 600 "$tmp/secret"

# run NAME SERVERS CODEC REPLICAS KILL_SERVER SIGNAL ROUND DELAY_MS [SECTION.KEY=VALUE...]: one
# job; KILL_SERVER -1 runs it without a death. Leaves the workers' rcs in rc[] and logs in $tmp.
# With $events set ("SERVER ROUND SERVER ROUND ..."), the job is run with those kills and
# returns instead (back, below) and the workers sleep $round_sleep ms a round (10); they hold
# 20 rounds before their end until the events are done (a return that takes long on a slow
# machine, ASan's start-ups: the job must not end first), which the file NAME-events-done says.
run() {
    local name=$1 n_s=$2 codec=$3 replicas=$4 victim=$5 sig=$6 round=$7 delay=$8 w
    local slow=() hold=()
    shift 8
    if [ -n "${events:-}" ]; then
        slow=(--round-sleep-ms "${round_sleep:-10}")
        local n=$rounds
        [ -n "${optim:-}" ] && n=$steps
        hold=(--hold "$((n - 20)):$tmp/$name-events-done")
    fi
    job_ini "$tmp/$name.ini" "$n_s" 3 cluster.job_id="failover-$name-$port" \
        cluster.server_replicas="$replicas" cluster.op_timeout_ms=3000 log.level=info "$@"
    start_servers "$tmp/$name.ini" "$n_s" "$name-"
    for w in 0 1 2; do
        if [ -n "${optim:-}" ]; then # parameter chunks: fn_optim (prints STEP n)
            start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
                FN_OPTIM_CODEC="$codec" "$optim_bin" "$steps" --step-sleep-ms "${round_sleep:-3}" \
                ${hold[@]+"${hold[@]}"}
        elif [ -n "${thc:-}" ]; then # integer aggregation: fn_thc (its own tensors)
            start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
                "$thc_bin" $rounds "$codec" --progress ${slow[@]+"${slow[@]}"}
        elif [ -n "${adaptive:-}" ]; then # adaptive codecs: fn_adaptive (its own tensors)
            start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
                "$adaptive_bin" $rounds --progress ${hold[@]+"${hold[@]}"}
        else
            start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
                "$worker_bin" --codec "$codec" --sizes "${sizes:-1,1023,4096,50000,7000}" --rounds $rounds \
                --progress ${slow[@]+"${slow[@]}"} ${hold[@]+"${hold[@]}"}
        fi
    done
    [ -n "${events:-}" ] && kill_and_return "$name" "$n_s" $events
    local pauser=
    if [ -n "${pause:-}" ]; then # worker 0 SIGSTOPped for 30 ms every 60 ms while it runs
        (while kill -STOP "${wpid[0]}" 2>/dev/null; do
            sleep 0.03
            kill -CONT "${wpid[0]}" 2>/dev/null || break # (it exited meanwhile)
            sleep 0.06
        done) &
        pauser=$!
    fi
    if [[ $victim != -1 ]]; then # (S, or S+T: two at once)
        wait_until 60 grep -qs "^$mark $round\$" "$tmp/$name-worker0.log" ||
            fail "$name: worker 0 never reached round $round"
        sleep "0.00$delay"
        for w in ${victim//+/ }; do kill -"$sig" "${spid[$w]}"; done
    fi
    for w in 0 1 2; do
        wait_for "${wpid[$w]}" 90
        rc[w]=$?
    done
    if [ -n "$pauser" ]; then
        kill "$pauser" 2>/dev/null
        wait "$pauser" 2>/dev/null
        kill -CONT "${wpid[0]}" 2>/dev/null
    fi
}

# kill_and_return NAME SERVERS SERVER ROUND ...: per pair, SIGKILL SERVER once worker 0 is at
# ROUND; a server killed before (in the job's last view) is started again first, with a log of
# its own (NAME-serverSb.log, -serverSc.log ...), once every worker took the view without it.
# Each kill or return is one view more: every worker must reach it. ROUND `ready` kills SERVER
# during the return just started (once worker 0 has its READY, before the view that admits it):
# two views follow, the loss and the return, in either order. ROUND `stop-now` SIGSTOPs SERVER
# at once, right after the event before (it stays stopped: its silence is noticed
# op_timeout_ms later); a return just started before it is then decided with it.
kill_and_return() {
    local name=$1 n_s=$2 view=0 s r w n back=-1 suffixes=(b c d e) sig
    local -A out=() starts=()
    shift 2
    while (($#)); do
        s=$1 r=$2 sig=KILL
        shift 2
        [[ $r == stop-now ]] && r=now sig=STOP
        if [[ $r == now ]]; then
            :
        elif [[ $r == ready ]]; then
            wait_until 60 grep -qs "server $back is back (READY)" "$tmp/$name-worker0.log" ||
                fail "$name: server $back's READY never reached worker 0"
        else
            wait_until 60 grep -qs "^$mark $r\$" "$tmp/$name-worker0.log" ||
                fail "$name: worker 0 never reached round $r"
        fi
        if [[ $s == x* || $s == f* ]]; then # on server ${s#?}'s port while it is out, x: a
            # psagg-server with another secret, f: a process without it (fake_server.py)
            local kind=${s:0:1} port_s
            s=${s#?}
            if [[ $kind == x ]]; then
                sed "s|$tmp/secret|$tmp/secret2|" "$tmp/$name.ini" >"$tmp/$name-impostor.ini"
                spawn "$tmp/$name-impostor$s.log" "${server_bin:-$build/server/psagg-server}" \
                    --config "$tmp/$name-impostor.ini" --rank "$s"
            else
                port_s=$((port + s))
                spawn "$tmp/$name-fake$s.log" python3 "$(dirname -- "${BASH_SOURCE[0]}")/fake_server.py" \
                    "$port_s" "$s" "$n_s"
            fi
            local why="refused worker .*authentication failed"
            [[ $kind == f ]] && why="WELCOME's token does not check out"
            for w in 0 1 2; do
                wait_until 30 grep -q "server $s answers, but not as a server that rejoins: .*$why" \
                    "$tmp/$name-worker$w.log" || fail "$name: worker $w never met the impostor ($kind)"
            done
            kill -KILL "$h_pid"
            wait "$h_pid" 2>/dev/null
            continue
        fi
        if [ -n "${out[$s]:-}" ]; then # it comes back
            n=${starts[$s]:-0}
            spawn "$tmp/$name-server$s${suffixes[n]}.log" "${server_bin:-$build/server/psagg-server}" \
                --config "$tmp/$name.ini" --rank "$s"
            spid[s]=$h_pid
            starts[$s]=$((n + 1))
            unset "out[$s]"
            back=$s
        else
            kill -"$sig" "${spid[$s]}"
            out[$s]=1
        fi
        view=$((view + 1))
        (($# >= 2)) && [[ $2 == ready || $2 == *now ]] && continue # (its view: with the next event's)
        (($# == 0)) && [ -n "${last_fails:-}" ] && break # (no view can follow the last kill)
        for w in 0 1 2; do
            wait_until 60 grep -q "server view $view:" "$tmp/$name-worker$w.log" ||
                fail "$name: worker $w never took view $view"
        done
    done
    touch "$tmp/$name-events-done" # (the workers' --hold)
}

digest_of() { # digest_of NAME: every worker's DIGEST, which must be one
    local d
    d=$(grep -h '^DIGEST' "$tmp/$1"-worker[012].log | sort -u)
    (($(wc -l <<<"$d") == 1)) && [ -n "$d" ] || fail "$1: the workers' digests differ or are missing: $d"
    echo "${d#DIGEST }"
}

# went_on NAME VIEW REF: every worker of job NAME exited 0 and took server view VIEW, and
# their one digest, left in $digest, is REF (the uninterrupted run's)
went_on() {
    local name=$1 view=$2 want=$3 w
    for w in 0 1 2; do
        ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]}"
        grep -q "server view $view:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view $view"
    done
    digest=$(digest_of "$name")
    [ "$digest" = "$want" ] || fail "$name: digest $digest, the uninterrupted run's $want"
}

declare -A ref
# in_part P...: this run's PART is all or one of P
in_part() {
    local p
    for p in all "$@"; do [[ $part == "$p" ]] && return 0; done
    return 1
}
if in_part sum sum_back; then
    # the uninterrupted runs each part compares with
    cfgs=("2 fp32")
    in_part sum && cfgs+=("3 maxmin4")
    in_part sum_back && cfgs+=("3 fp32")
    for cfg in "${cfgs[@]}"; do
        set -- $cfg
        run "ref-$1-$2" "$1" "$2" 1 -1 KILL 0 0
        for w in 0 1 2; do ((rc[w] == 0)) || fail "ref-$1-$2: worker $w exited ${rc[w]} without a death"; done
        ref[$1-$2]=$(digest_of "ref-$1-$2")
        stop_all
    done
    echo "uninterrupted: 2 servers fp32 ${ref[2-fp32]}, 3 servers ${ref[3-maxmin4]:-} ${ref[3-fp32]:-}"
fi

if in_part sum; then
    # survive NAME SERVERS CODEC VICTIM SIGNAL ROUND DELAY_MS [KEY=VALUE...]: the job goes on
    survive() {
        local name=$1 n_s=$2 codec=$3 victim=$4 w d took
        run "$1" "$2" "$3" 1 "${@:4}"
        for w in 0 1 2; do
            ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]} after server $victim's death"
            grep -q "server view 1:" "$tmp/$name-worker$w.log" ||
                fail "$name: worker $w never took view 1 (did the death land before the end?)"
        done
        d=$(digest_of "$name")
        [ "$d" = "${ref[$n_s-$codec]}" ] ||
            fail "$name: digest $d, the uninterrupted run's ${ref[$n_s-$codec]}"
        grep -h "server view 1: .* to this server" "$tmp/$name"-server*.log | grep -v " 0 of them" |
            head -1 | grep -q . || fail "$name: no server says it took the chunks over"
        # the first worker's report of the loss to the last worker in the new view (log times)
        took=$(grep -h "lost server\|server view 1:" "$tmp/$name"-worker[012].log |
            awk '/lost server/ {if (!l || $1 < l) l = $1} /server view 1:/ {if ($1 > v) v = $1}
                 END {printf "%.0f", (v - l) * 1000}')
        echo "$name: server $victim SIG$5 at round $6 + $7 ms: every worker bit-identical to the" \
            "uninterrupted run ($d); from the first report to every worker in view 1: $took ms;" \
            "$(grep -h "server view 1: .* to this server" "$tmp/$name"-server*.log |
                grep -v " 0 of them" | sed 's/^[0-9.]* //')"
        stop_all
    }

    survive kill1 2 fp32 1 KILL 40 0
    survive kill1-late 2 fp32 1 KILL 150 3
    survive kill0 2 fp32 0 KILL 60 1
    survive three-maxmin4 3 maxmin4 2 KILL 80 2
    survive auth 2 fp32 1 KILL 70 5 cluster.secret_file="$tmp/secret" cluster.data_auth=on
    survive stop 2 fp32 1 STOP 50 0
    # stopped with large pushes still on their way to it (12 MB chunks: a stopped process stops
    # reading, its socket's window fills, those sends never complete): the workers abandon them
    # and push the rounds again to the new owner from the same buffers
    sizes=3000000,3000000,1000 rounds=40
    run stop-big-ref 2 fp32 1 -1 KILL 0 0
    for w in 0 1 2; do ((rc[w] == 0)) || fail "stop-big-ref: worker $w exited ${rc[w]}"; done
    ref[big]=$(digest_of stop-big-ref)
    stop_all
    run stop-big 2 fp32 1 1 STOP 10 0
    went_on stop-big 1 "${ref[big]}"
    echo "stop-big: server 1 SIGSTOPped at round 10 with 12 MB pushes: every worker bit-identical ($digest);" \
        "$(grep -h "abandoned" "$tmp"/stop-big-worker*.log | sed 's/^[0-9.]* //' | head -2 | tr '\n' ' ')"
    stop_all
    unset sizes
    rounds=300

    # two servers SIGKILLed at once (3 servers, server_replicas = 2): two views, one after the
    # other (the second loss is decided after the first; a server reported lost takes nothing over)
    for pair in 1+2 0+1; do
        run "two-${pair/+/-}" 3 maxmin4 2 "$pair" KILL 60 1
        pair=${pair/+/-}
        went_on "two-$pair" 2 "${ref[3-maxmin4]}"
        echo "two-$pair: servers ${pair/-/ and } SIGKILLed at once at round 60: views 1 and 2, every" \
            "worker bit-identical ($digest); $(grep -h "server view 2: .* to this server" "$tmp/two-$pair"-server*.log |
                grep -v " 0 of them" | sed 's/^[0-9.]* //')"
        stop_all
    done
fi

if in_part sum_back; then
    # back NAME SERVERS EVENTS...: servers killed and started again (kill_and_return); every
    # worker bit-identical to the uninterrupted run, and every return owns its chunks again
    back() {
        local name=$1 n_s=$2 w d joined
        shift 2
        events="$*" run "$name" "$n_s" fp32 "${back_r:-1}" -1 KILL 0 0 ${back_keys[@]+"${back_keys[@]}"}
        for w in 0 1 2; do
            ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]}"
        done
        d=$(digest_of "$name")
        [ "$d" = "${ref[$n_s-fp32]}" ] || fail "$name: digest $d, the uninterrupted run's ${ref[$n_s-fp32]}"
        grep -q "server view [0-9]*: .* to this server" "$tmp/$name"-server[0-9][b-e].log ||
            fail "$name: the server that came back took none of its chunks"
        # from a worker's first READY of the return to the last worker in the view that admits it
        joined=$(grep -h "is back (READY)\|is back in view" "$tmp/$name"-worker[012].log |
            awk '/READY/ {if (!r) r = $1} /back in view/ {if (!f) f = $NF; if ($NF == f && $1 > v) v = $1}
                 END {printf "%.0f", (v - r) * 1000}')
        echo "$name: servers killed and back ($*): every worker bit-identical to the uninterrupted" \
            "run ($d); the first return: from the first READY to every worker in its view: $joined ms;" \
            "$(grep -h "server view [0-9]*: .* to this server" "$tmp/$name"-server[0-9][b-e].log |
                grep -v " 0 of them" | head -1 | sed 's/^[0-9.]* //')"
        stop_all
    }

    back back1 2 1 30 1 60
    back back0 2 0 30 0 60
    back back1-kill0 2 1 30 1 60 0 200
    back back1-twice 2 1 30 1 60 1 150 1 200
    # another server SIGKILLed during a return (3 servers, server_replicas = 2): server 1 comes
    # back while server 2 dies; the coordinator decides the loss and the return one after the
    # other; server 1 owns its chunks again, bit-identical
    back_r=2 back back-join-kill2 3 1 30 1 60 2 ready
    # with a secret: a process without it on server 1's port is never taken for server 1 (its
    # WELCOME's token fails at every worker), then the real one comes back
    head -c 32 /dev/urandom | base64 >"$tmp/secret2"
    chmod 600 "$tmp/secret2"
    back_keys=(cluster.secret_file="$tmp/secret" cluster.data_auth=on)
    round_sleep=30 back back1-impostor 2 1 20 x1 40 f1 90 1 150
    grep -q "authentication failed" "$tmp/back1-impostor-impostor1.log" ||
        fail "back1-impostor: the psagg-server with another secret did not refuse the workers' HELLOs"
    for w in 0 1 2; do
        grep -q "server 1 answers, but not as a server that rejoins: .*WELCOME's token does not check out" \
            "$tmp/back1-impostor-worker$w.log" ||
            fail "back1-impostor: worker $w did not refuse the fake server's WELCOME"
    done
    echo "back1-impostor: on server 1's port, a psagg-server with another secret (it refused the" \
        "workers' HELLOs) and a process without the secret (fake_server.py: every worker refused its" \
        "WELCOME: $(grep -ho "its WELCOME's token does not check out[^:]*" "$tmp/back1-impostor-worker0.log" |
            head -1)); then the real server came back"
    back_keys=()
fi

if in_part sum; then
    # more deaths than replicas: 3 servers, server_replicas = 1, servers 1 and 2 at once: server 1's
    # chunks have no live holder left; the job fails naming a chunk and its servers
    run over 3 maxmin4 1 1+2 KILL 60 1
    for w in 0 1 2; do
        ((rc[w] != 0)) || fail "over: worker $w exited 0 with servers 1 and 2 dead and 1 replica"
        # (which loss is decided first, and so which one finds a chunk without a holder, is the
        # order of the workers' reports: server 1's chunks may move to server 2 before it is
        # reported lost too)
        grep -q "server [12] was lost, and with it tensor '.*' chunk [0-9]*: its layout owner [12] and its 1 replica(s) are all gone" \
            "$tmp/over-worker$w.log" || fail "over: worker $w's failure does not name the chunk and its servers"
    done
    echo "over: every worker failed naming the chunk: $(grep -ho "server [12] was lost, and with it[^(]*" "$tmp/over-worker0.log" | head -1)"
    stop_all

    # server_replicas = 0: today's fail-fast, naming the server
    run r0 2 fp32 0 1 KILL 40 0
    for w in 0 1 2; do
        ((rc[w] != 0)) || fail "r0: worker $w exited 0 with server 1 dead and no replicas"
        grep -q "server 1" "$tmp/r0-worker$w.log" || fail "r0: worker $w's failure does not name server 1"
    done
    echo "r0: every worker failed naming server 1: $(grep -h '^FAIL' "$tmp/r0-worker0.log" | head -1)"
fi

if in_part optim optim_back state; then
    # Parameter chunks ([server] optimizer; fn_optim: four parameters and a plain tensor, checked
    # bit for bit against its own reference of the servers' arithmetic after every step, and the
    # master weights pulled at the end): a copy of each parameter chunk runs every round on the
    # next server, and takes the chunk over with the dead owner's weights and optimizer state.
    optim=1 mark=STEP steps=300
    optim_keys=(server.optimizer=sgd server.momentum=0.9 server.nesterov=on server.sync_interval=3
        server.threads=2 worker.chunk_bytes=16384)
    # the uninterrupted runs each part compares with (about 22 s each under ASan)
    cfgs=("2 1")
    in_part optim optim_back && cfgs+=("3 2")
    in_part optim && cfgs+=("2 0")
    for cfg in "${cfgs[@]}"; do
        set -- $cfg
        run "optim-ref-$1-r$2" "$1" maxmin4/512 "$2" -1 KILL 0 0 "${optim_keys[@]}"
        for w in 0 1 2; do
            ((rc[w] == 0)) || fail "optim-ref-$1-r$2: worker $w exited ${rc[w]} without a death"
            grep -q '^OPTIM-EXACT' "$tmp/optim-ref-$1-r$2-worker$w.log" || fail "optim-ref-$1-r$2: worker $w not exact"
        done
        ref[optim-$1-r$2]=$(digest_of "optim-ref-$1-r$2")
        stop_all
    done
fi
if in_part optim; then
    [ "${ref[optim-2-r1]}" = "${ref[optim-2-r0]}" ] ||
        fail "optim: server_replicas = 1 changes the weights (${ref[optim-2-r1]}, without: ${ref[optim-2-r0]})"
    echo "optim uninterrupted: 2 servers ${ref[optim-2-r1]} (the same with server_replicas = 0)," \
        "3 servers ${ref[optim-3-r2]}"

    # A worker that keeps stalling (SIGSTOP 30 ms every 60 ms), 3 servers with two copies of
    # every chunk, 4 KiB chunks: the copies lag behind the other workers' later rounds, whose
    # pushes wait for their turn; past half the receive buffers they wait as heap copies, so the
    # stalled worker's pushes still find a buffer (holding them all hung the job in 2 runs of 6
    # to 5 of 6: its push never read, "no push from workers 0")
    steps=150 pause=1 run optim-pause 3 maxmin4/512 2 -1 KILL 0 0 "${optim_keys[@]}" worker.chunk_bytes=4096
    for w in 0 1 2; do
        ((rc[w] == 0)) || fail "optim-pause: worker $w exited ${rc[w]}: $(grep -h 'ERROR' "$tmp"/optim-pause-*.log | head -1)"
        grep -q '^OPTIM-EXACT' "$tmp/optim-pause-worker$w.log" || fail "optim-pause: worker $w not exact"
    done
    echo "optim-pause: worker 0 stalled every 60 ms, exact;" \
        "$(grep -ho '[0-9]* pushes came rounds early' "$tmp"/optim-pause-server*.log | tr '\n' ' ')" \
        "(heap copies, per server)"
    stop_all

    # optim_survive NAME SERVERS REPLICAS VICTIM SIGNAL STEP DELAY_MS: the job goes on, exact, and
    # ends bit-identical to the uninterrupted run; the copies that took over say so
    optim_survive() {
        local name=$1 n_s=$2 r=$3 w d
        run "$name" "$n_s" maxmin4/512 "$r" "${@:4}" "${optim_keys[@]}"
        for w in 0 1 2; do
            ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]} after server $4's death"
            grep -q '^OPTIM-EXACT' "$tmp/$name-worker$w.log" || fail "$name: worker $w not exact"
            grep -q "server view 1:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view 1"
        done
        d=$(digest_of "$name")
        [ "$d" = "${ref[optim-$n_s-r$r]}" ] || fail "$name: digest $d, the uninterrupted run's ${ref[optim-$n_s-r$r]}"
        grep -q "its copy here owns it from round" "$tmp/$name"-server*.log ||
            fail "$name: no copy says it took a parameter chunk over"
        echo "$name: server $4 SIG$5 at step $6 + $7 ms: every worker exact and bit-identical ($d);" \
            "$(grep -h "its copy here owns it" "$tmp/$name"-server*.log | wc -l) parameter chunks taken" \
            "over by their copies; $(grep -h "sent once every worker took the view" "$tmp/$name"-server*.log |
                wc -l) of them had finished a round whose update the workers still waited for"
        stop_all
    }
    optim_survive optim-kill1 2 1 1 KILL 60 2
    optim_survive optim-kill0 2 1 0 KILL 110 1
    optim_survive optim-stop1 2 1 1 STOP 80 0
    optim_survive optim-two-0-1 3 2 0+1 KILL 70 3
fi

if in_part optim_back; then
    # a server that comes back receives the state of the chunks it holds (STATE, relayed by a
    # worker) and owns and copies them again: server 1 killed and back, bit-identical, its
    # parameter chunks moved back to it; then (back1-kill0) server 0 killed after the return:
    # server 1 takes every chunk over with the state it received, bit-identical
    events="1 30 1 60" round_sleep=8 run optim-back1 2 maxmin4/512 1 -1 KILL 0 0 "${optim_keys[@]}"
    for w in 0 1 2; do ((rc[w] == 0)) || fail "optim-back1: worker $w exited ${rc[w]}"; done
    d=$(digest_of optim-back1)
    [ "$d" = "${ref[optim-2-r1]}" ] || fail "optim-back1: digest $d, the uninterrupted run's ${ref[optim-2-r1]}"
    grep -q "the state of its [1-9][0-9]* chunk(s) with copies came" "$tmp/optim-back1-server1b.log" ||
        fail "optim-back1: the server that came back did not receive its chunks' state"
    grep -q "its copy here owns it" "$tmp/optim-back1-server1b.log" ||
        fail "optim-back1: the server that came back took none of its parameter chunks back"
    echo "optim-back1: server 1 killed and back: bit-identical ($d);" \
        "$(grep -h "the state of [0-9]* chunk(s) (.*) to server 1" "$tmp/optim-back1-server0.log" | sed 's/^[0-9.]* //' | head -1);" \
        "$(grep -h "server view 2:" "$tmp/optim-back1-server1b.log" | sed 's/^[0-9.]* //')"
    stop_all
    events="1 30 1 60 0 120" round_sleep=8 run optim-back1-kill0 2 maxmin4/512 1 -1 KILL 0 0 "${optim_keys[@]}"
    went_on optim-back1-kill0 3 "${ref[optim-2-r1]}"
    for w in 0 1 2; do
        grep -q '^OPTIM-EXACT' "$tmp/optim-back1-kill0-worker$w.log" || fail "optim-back1-kill0: worker $w not exact"
    done
    echo "optim-back1-kill0: server 1 back with its state, then server 0 SIGKILLed: server 1 owns every" \
        "chunk, bit-identical ($digest); $(grep -h "server view 3:" "$tmp/optim-back1-kill0-server1b.log" | sed 's/^[0-9.]* //')"
    stop_all
    # server 1 killed and back twice: the second time server 0's copies (given back at the first
    # return, then run as copies) take its chunks over again, and it receives their state again
    events="1 30 1 60 1 110 1 160" round_sleep=8 run optim-back1-twice 2 maxmin4/512 1 -1 KILL 0 0 \
        "${optim_keys[@]}"
    went_on optim-back1-twice 4 "${ref[optim-2-r1]}"
    echo "optim-back1-twice: server 1 killed and back twice: bit-identical ($digest)"
    stop_all
    # server 2, an owner of chunks whose state server 1 receives, SIGKILLed during server 1's
    # return (3 servers, server_replicas = 2): server 1 has the state first, or comes back without
    # it; either way the loss and the return are two views, and the job ends bit-identical
    events="1 30 1 60 2 ready" round_sleep=8 run optim-back1-kill2 3 maxmin4/512 2 -1 KILL 0 0 \
        "${optim_keys[@]}"
    went_on optim-back1-kill2 3 "${ref[optim-3-r2]}"
    echo "optim-back1-kill2: server 2 SIGKILLed during server 1's return: bit-identical ($digest);" \
        "$(grep -h "came: reporting it\|receives its chunks' state\|did not say within\|is decided first" \
            "$tmp"/optim-back1-kill2-server*.log | sed 's/^[0-9.]* //' | head -2 | tr '\n' ' ')"
    stop_all
    # server 2 SIGSTOPped as server 1 is started again: its part of server 1's state never comes,
    # and its loss is reported (op_timeout_ms = 6000 of silence, from before the stop) while the
    # coordinator waits for that state (from server 1's READY, 0.5 to 2 s after its start, for
    # op_timeout_ms): the loss is decided first (view 2), server 1's return after it, with the
    # state of every chunk from server 0 (view 3); then server 0 SIGKILLed: server 1 owns every
    # chunk with that state, bit-identical (before, server 1 came back without the state, and
    # server 0's death ended the job: its chunks had no holder left)
    events="1 30 1 60 2 stop-now 0 150" round_sleep=8 run optim-back1-stop2-kill0 3 maxmin4/512 2 \
        -1 KILL 0 0 "${optim_keys[@]}" cluster.op_timeout_ms=6000
    went_on optim-back1-stop2-kill0 4 "${ref[optim-3-r2]}"
    grep -q "server 2 was lost while server 1 comes back (.*): the loss is decided first" \
        "$tmp/optim-back1-stop2-kill0-server0.log" ||
        fail "optim-back1-stop2-kill0: server 0 did not decide server 2's loss before server 1's return"
    grep -q "the state of its [1-9][0-9]* chunk(s) with copies came" "$tmp/optim-back1-stop2-kill0-server1b.log" ||
        fail "optim-back1-stop2-kill0: server 1 came back without its chunks' state"
    for w in 0 1 2; do
        grep -q '^OPTIM-EXACT' "$tmp/optim-back1-stop2-kill0-worker$w.log" ||
            fail "optim-back1-stop2-kill0: worker $w not exact"
    done
    echo "optim-back1-stop2-kill0: server 2 SIGSTOPped as server 1 comes back: its loss first, then" \
        "the return with the state; server 0 SIGKILLed: bit-identical ($digest);" \
        "$(grep -h "is decided first" "$tmp/optim-back1-stop2-kill0-server0.log" | sed 's/^[0-9.]* //' | head -1)"
    stop_all
fi

if in_part state; then

    # Checkpoints with copies ([server] checkpoint_dir, one folder for both servers, as
    # psagg-local gives them): each server writes the parameter chunks it owns in its view, and a
    # resumed server takes each chunk it holds, owned or copied, from the file with its latest
    # step. ck-a: a checkpoint after step 40 (both servers write theirs), stopped after 50 and
    # every process killed; ck-b resumes from it, server 1 SIGKILLed at step 70, a checkpoint
    # after step 100 (server 0 alone, with server 1's chunks: server 1's file stays at step 40),
    # stopped after 120 and killed; ck-c resumes both servers from step 100 (server 1's chunks
    # from server 0's file) and ends bit-identical to the uninterrupted run.
    ck_dir=$tmp/ck-shared
    mkdir -p "$ck_dir"
    ck_run() { # ck_run NAME RESUME FN_OPTIM_ARGS...
        local name=$1 resume=$2 w
        shift 2
        job_ini "$tmp/$name.ini" 2 3 cluster.job_id="failover-ck-$port" cluster.server_replicas=1 \
            cluster.op_timeout_ms=3000 log.level=info "${optim_keys[@]}" \
            server.checkpoint_dir="$ck_dir" server.resume="$resume"
        start_servers "$tmp/$name.ini" 2 "$name-"
        for w in 0 1 2; do
            start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 \
                FN_OPTIM_CODEC=maxmin4/512 "$optim_bin" "$steps" --step-sleep-ms 3 "$@"
        done
    }
    ck_stopped() { # ck_stopped NAME: every worker printed STOPPED (it waits to be killed); then all killed
        wait_until 90 bash -c "(( \$(grep -l '^STOPPED' '$tmp/$1'-worker*.log 2>/dev/null | wc -l) == 3 ))" ||
            fail "$1: the workers did not all reach their stop"
        stop_all
    }
    ck_run ck-a off --checkpoint-at 40 --stop-after 50
    ck_stopped ck-a
    grep -q '^CHECKPOINT after step 39' "$tmp/ck-a-worker0.log" || fail "ck-a: no checkpoint"
    ls "$ck_dir"/psagg-server-{0,1}.ckpt >/dev/null || fail "ck-a: not both servers wrote their file"
    cp "$ck_dir/psagg-server-1.ckpt" "$tmp/ck-a-server1.ckpt"
    ck_run ck-b on --resume --checkpoint-at 100 --stop-after 120
    wait_until 60 grep -qs "^STEP 70\$" "$tmp/ck-b-worker0.log" || fail "ck-b: worker 0 never reached step 70"
    kill -KILL "${spid[1]}"
    ck_stopped ck-b
    grep -q 'INIT from step 40' "$tmp/ck-b-worker0.log" || fail "ck-b: the parameters did not start at step 40"
    grep -q '^CHECKPOINT after step 99' "$tmp/ck-b-worker0.log" || fail "ck-b: no checkpoint after the takeover"
    cmp -s "$ck_dir/psagg-server-1.ckpt" "$tmp/ck-a-server1.ckpt" ||
        fail "ck-b: server 1's file changed after its death"
    ck_run ck-c on --resume
    for w in 0 1 2; do
        wait_for "${wpid[$w]}" 90
        rc[w]=$?
        ((rc[w] == 0)) || fail "ck-c: worker $w exited ${rc[w]}"
        grep -q '^OPTIM-EXACT' "$tmp/ck-c-worker$w.log" || fail "ck-c: worker $w not exact"
    done
    grep -q 'INIT from step 100' "$tmp/ck-c-worker0.log" || fail "ck-c: the parameters did not start at step 100"
    d=$(digest_of ck-c)
    [ "$d" = "${ref[optim-2-r1]}" ] || fail "ck-c: digest $d, the uninterrupted run's ${ref[optim-2-r1]}"
    echo "ck: checkpoint after step 40, killed; resumed, server 1 SIGKILLed at step 70, checkpoint after" \
        "step 100 (server 0 wrote every chunk), killed; resumed from step 100 (server 1's chunks from" \
        "server 0's file, its own at step 40): bit-identical to the uninterrupted run ($d);" \
        "$(grep -h "checkpoint .* written" "$tmp/ck-b-server0.log" | tail -1 | sed 's/^[0-9.]* //')"
    stop_all

    # A server killed (or stopped) while worker 0 is about to ask for a checkpoint (it holds
    # before the call): the call waits for the view that moves the dead server's chunks (a
    # stopped server: it was asked, and its loss fails the call), then the copies that took them
    # over answer that they have not caught up (PSAGG_EAGAIN, fenced until every worker pushed
    # its next round); fn_optim asks again after the next step, and that checkpoint, written by
    # server 0 alone, resumes bit-identical.
    for sig in KILL STOP; do
        name=ck-$sig
        rm -f "$ck_dir"/*.ckpt* "$tmp/go-$sig"
        ck_run "$name" off --checkpoint-at 60 --checkpoint-hold "$tmp/go-$sig" --checkpoint-retry \
            --stop-after 90
        wait_until 60 grep -qs "^CHECKPOINT-HOLD" "$tmp/$name-worker0.log" || fail "$name: worker 0 never held"
        kill -"$sig" "${spid[1]}"
        sleep 0.2
        touch "$tmp/go-$sig"
        ck_stopped "$name"
        grep -q '^CHECKPOINT after step' "$tmp/$name-worker0.log" || fail "$name: no checkpoint after the loss"
        [ ! -e "$ck_dir/psagg-server-1.ckpt" ] || fail "$name: server 1 wrote a checkpoint file"
        ck_run "$name-resume" on --resume
        for w in 0 1 2; do
            wait_for "${wpid[$w]}" 90
            rc[w]=$?
            ((rc[w] == 0)) || fail "$name-resume: worker $w exited ${rc[w]}"
        done
        d=$(digest_of "$name-resume")
        [ "$d" = "${ref[optim-2-r1]}" ] || fail "$name-resume: digest $d, the uninterrupted run's ${ref[optim-2-r1]}"
        echo "$name: server 1 SIG$sig while worker 0 was about to ask for a checkpoint after step 60:" \
            "$(grep -h '^CHECKPOINT-RETRY' "$tmp/$name-worker0.log" | sed 's/^CHECKPOINT-RETRY after step [0-9]*: psagg_checkpoint: //' |
                cut -c1-170 | tr '\n' ';') $(grep -h '^CHECKPOINT after' "$tmp/$name-worker0.log");" \
            "resumed from it: bit-identical ($d)"
        stop_all
    done

    # A checkpoint cut short (two phases: a server's PREPARE writes psagg-server-N.ckpt.pending,
    # and only once every server asked prepared does the worker COMMIT, each server's pending
    # file then taking the current one's place, kept as .prev). ck-torn-a: a checkpoint after
    # step 40, stopped and killed. ck-torn-b resumes; server 1 SIGSTOPped while worker 0 holds
    # before a checkpoint after step 70: server 0 prepares, server 1 never answers and the call
    # fails; every current file is still step 40's. Then server 0's commit is made by hand as if
    # its COMMIT had come and server 1's had not (a commit cut short by a death): ck-torn-c
    # finds that newest checkpoint holding half the chunks and resumes from the whole one before
    # (server 0's .prev and server 1's file), bit-identical.
    rm -f "$ck_dir"/*.ckpt* "$tmp/go-torn"
    ck_run ck-torn-a off --checkpoint-at 40 --stop-after 50
    ck_stopped ck-torn-a
    cp "$ck_dir/psagg-server-0.ckpt" "$tmp/ck-torn-a-server0.ckpt"
    ck_run ck-torn-b on --resume --checkpoint-at 70 --checkpoint-hold "$tmp/go-torn" --stop-after 90
    wait_until 60 grep -qs "^CHECKPOINT-HOLD" "$tmp/ck-torn-b-worker0.log" || fail "ck-torn-b: worker 0 never held"
    kill -STOP "${spid[1]}"
    sleep 0.2
    touch "$tmp/go-torn"
    wait_for "${wpid[0]}" 60
    grep -q "^FAIL: psagg_checkpoint: .*server 1 was lost before it wrote its part" "$tmp/ck-torn-b-worker0.log" ||
        fail "ck-torn-b: worker 0's checkpoint did not fail naming server 1: $(grep -h '^FAIL' "$tmp/ck-torn-b-worker0.log")"
    stop_all
    [ -e "$ck_dir/psagg-server-0.ckpt.pending" ] || fail "ck-torn-b: server 0 prepared no pending file"
    cmp -s "$ck_dir/psagg-server-0.ckpt" "$tmp/ck-torn-a-server0.ckpt" ||
        fail "ck-torn-b: server 0's current file changed, though the checkpoint failed"
    mv "$ck_dir/psagg-server-0.ckpt" "$ck_dir/psagg-server-0.ckpt.prev"
    mv "$ck_dir/psagg-server-0.ckpt.pending" "$ck_dir/psagg-server-0.ckpt"
    ck_run ck-torn-c on --resume
    for w in 0 1 2; do
        wait_for "${wpid[$w]}" 90
        rc[w]=$?
        ((rc[w] == 0)) || fail "ck-torn-c: worker $w exited ${rc[w]}: $(grep -h '^FAIL' "$tmp/ck-torn-c-worker$w.log")"
    done
    grep -q 'INIT from step 40' "$tmp/ck-torn-c-worker0.log" || fail "ck-torn-c: the parameters did not start at step 40"
    grep -q "resume: checkpoint [0-9]* is not whole" "$tmp/ck-torn-c-server0.log" ||
        fail "ck-torn-c: server 0 did not say it fell back"
    d=$(digest_of ck-torn-c)
    [ "$d" = "${ref[optim-2-r1]}" ] || fail "ck-torn-c: digest $d, the uninterrupted run's ${ref[optim-2-r1]}"
    echo "ck-torn: a checkpoint after step 70 failed on server 1 (SIGSTOP): every current file still" \
        "step 40's; server 0's commit made alone: $(grep -ho 'resume: checkpoint [0-9]* is not whole.*' \
            "$tmp/ck-torn-c-server0.log" | head -1); bit-identical ($d)"
    stop_all
    unset optim
    mark=ROUND

    # A server residual ([server] error_feedback: each server keeps what its requantize of the sum
    # dropped, per element) is state too: every chunk then has copies, as a parameter chunk has
    # (fn_worker, 4-bit, 2 servers); the same run with server_replicas = 0 writes the same bits
    for r in 0 1; do
        run "residual-ref-r$r" 2 maxmin4 "$r" -1 KILL 0 0 server.error_feedback=on
        for w in 0 1 2; do ((rc[w] == 0)) || fail "residual-ref-r$r: worker $w exited ${rc[w]}"; done
        ref[residual-r$r]=$(digest_of "residual-ref-r$r")
        stop_all
    done
    [ "${ref[residual-r1]}" = "${ref[residual-r0]}" ] ||
        fail "residual: server_replicas = 1 changes the sums (${ref[residual-r1]}, without: ${ref[residual-r0]})"
    for v in "1 70 2" "0 120 1"; do
        set -- $v
        run "residual-kill$1" 2 maxmin4 1 "$1" KILL "$2" "$3" server.error_feedback=on
        went_on "residual-kill$1" 1 "${ref[residual-r1]}"
        echo "residual-kill$1: server $1 SIGKILLed at round $2 + $3 ms with [server] error_feedback: bit-identical" \
            "($digest, the same as with server_replicas = 0); $(grep -h "its copy here owns it" "$tmp/residual-kill$1"-server*.log |
                wc -l) chunks taken over by their copies with their residuals"
        stop_all
    done
    # server 1 killed and back with its residuals (STATE), then server 0 killed: server 1 owns
    # every chunk with the residuals it received
    events="1 40 1 80 0 160" round_sleep=8 run residual-back1-kill0 2 maxmin4 1 -1 KILL 0 0 \
        server.error_feedback=on
    went_on residual-back1-kill0 3 "${ref[residual-r1]}"
    echo "residual-back1-kill0: server 1 back with its residuals, then server 0 SIGKILLed:" \
        "bit-identical ($digest); $(grep -h "the state of [0-9]* chunk(s) (.*) to server 1" \
            "$tmp/residual-back1-kill0-server0.log" | sed 's/^[0-9.]* //' | head -1)"
    stop_all
fi

if [[ $part == all || $part == adaptive ]]; then
    # Adaptive codecs: a new assignment every 2 rounds (the statistics of even rounds pushed as the
    # job's last tensor, summed by its chunks' owners like any gradient, solved on every worker);
    # a server killed while statistics or gradients of either parity are on their way, stopped, or
    # killed and back: every worker exact in every round and bit-identical to the uninterrupted run
    adaptive=1 rounds=200
    adaptive_keys=(server.threads=2 worker.chunk_bytes=262144 codec.adaptive=on
        codec.adaptive_interval=2 codec.adaptive_budget=1.0)
    run adaptive-ref 2 fp32 1 -1 KILL 0 0 "${adaptive_keys[@]}"
    for w in 0 1 2; do
        ((rc[w] == 0)) || fail "adaptive-ref: worker $w exited ${rc[w]} without a death"
        grep -q '^ADAPTIVE-EXACT' "$tmp/adaptive-ref-worker$w.log" || fail "adaptive-ref: worker $w not exact"
    done
    ref[adaptive]=$(digest_of adaptive-ref)
    echo "adaptive uninterrupted: $(grep -h '^ADAPTIVE-EXACT' "$tmp/adaptive-ref-worker0.log") ${ref[adaptive]}"
    stop_all
    for v in "kill1 1 KILL 40 1" "kill0 0 KILL 61 2" "stop1 1 STOP 50 0"; do
        set -- $v
        run "adaptive-$1" 2 fp32 1 "$2" "$3" "$4" "$5" "${adaptive_keys[@]}"
        went_on "adaptive-$1" 1 "${ref[adaptive]}"
        for w in 0 1 2; do
            grep -q '^ADAPTIVE-EXACT' "$tmp/adaptive-$1-worker$w.log" || fail "adaptive-$1: worker $w not exact"
        done
        echo "adaptive-$1: server $2 SIG$3 at round $4 + $5 ms: every worker exact and bit-identical ($digest);" \
            "$(grep -h "server view 1: .* to this server" "$tmp/adaptive-$1"-server*.log | grep -v " 0 of them" |
                sed 's/^[0-9.]* //')"
        stop_all
    done
    events="1 30 1 60" run adaptive-back1 2 fp32 1 -1 KILL 0 0 "${adaptive_keys[@]}"
    went_on adaptive-back1 2 "${ref[adaptive]}"
    grep -q "server view 2: .* to this server" "$tmp/adaptive-back1-server1b.log" ||
        fail "adaptive-back1: server 1 came back and took none of its chunks"
    echo "adaptive-back1: server 1 killed and back: bit-identical ($digest);" \
        "$(grep -h "server view 2: .* to this server" "$tmp/adaptive-back1-server1b.log" | sed 's/^[0-9.]* //')"
    stop_all
    unset adaptive
fi
if [[ $part == all || $part == thc ]]; then
    # Integer aggregation: a server killed or stopped while pushes of thc4 arrive; every update
    # exact against fn_thc's reference and bit-identical to the uninterrupted run
    thc=1 rounds=150
    run thc-ref 2 thc4 1 -1 KILL 0 0 server.threads=2 worker.chunk_bytes=262144
    for w in 0 1 2; do ((rc[w] == 0)) || fail "thc-ref: worker $w exited ${rc[w]} without a death"; done
    ref[thc]=$(digest_of thc-ref)
    stop_all
    for v in "kill1 1 KILL 40 1" "kill0 0 KILL 61 2" "stop1 1 STOP 50 0"; do
        set -- $v
        run "thc-$1" 2 thc4 1 "$2" "$3" "$4" "$5" server.threads=2 worker.chunk_bytes=262144
        went_on "thc-$1" 1 "${ref[thc]}"
        echo "thc-$1: server $2 SIG$3 at round $4 + $5 ms: every update exact and bit-identical ($digest);" \
            "$(grep -h "server view 1: .* to this server" "$tmp/thc-$1"-server*.log | grep -v " 0 of them" |
                sed 's/^[0-9.]* //')"
        stop_all
    done
    unset thc
fi

if in_part startup startup_back; then
    # su NAME VICTIM SIGNAL WHEN BACK [KEY=VALUE...]: one job of 2 servers whose server VICTIM
    # dies during the start-up. WHEN: absent (never started) or declare (SIGNAL once worker 0 is
    # connected to both and has declared, before workers 1 and 2 start). BACK: now (started again
    # at once), view (once every worker took view 1; a stopped victim is SIGKILLed first; an
    # absent one starts then) or -.
    su() {
        local name=$1 victim=$2 sig=$3 when=$4 back=$5 w s
        local bin=("$worker_bin" --codec maxmin4 --sizes 1,1023,4096,50000,7000 --rounds 300
            --progress --round-sleep-ms 5)
        shift 5
        [ -n "${optim:-}" ] && bin=(env FN_OPTIM_CODEC=maxmin4/512 "$optim_bin" 300 --step-sleep-ms 5)
        job_ini "$tmp/$name.ini" 2 3 cluster.job_id="failover-$name-$port" cluster.server_replicas=1 \
            cluster.op_timeout_ms=3000 cluster.connect_timeout_ms=3000 log.level=info "$@"
        for s in 0 1; do
            if [[ $when == absent && $s == "$victim" ]]; then
                # (fake: a process without the secret answers on its port all along)
                [ -n "${fake:-}" ] && spawn "$tmp/$name-fake$s.log" python3 \
                    "$(dirname -- "${BASH_SOURCE[0]}")/fake_server.py" $((port + s)) "$s" 2
                continue
            fi
            spawn "$tmp/$name-server$s.log" "$build/server/psagg-server" --config "$tmp/$name.ini" --rank $s
            spid[s]=$h_pid
        done
        # every server started listens before worker 0 starts: a case's "during the declaration"
        # needs worker 0 connected to both (a server slow to start, under load, made worker 0
        # start with one: the case waited for "connected to 2 of 2 servers" in vain)
        for s in 0 1; do
            [[ $when == absent && $s == "$victim" ]] && continue
            wait_until 20 grep -qs "serving job" "$tmp/$name-server$s.log" ||
                fail "$name: server $s never started"
        done
        if [[ $when == first ]]; then # (listening, then stopped: its kernel still accepts)
            kill -"$sig" "${spid[$victim]}"
        fi
        start_worker 0 "$tmp/$name-worker0.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 "${bin[@]}"
        if [[ $when == declare ]]; then
            wait_until 20 grep -qs "connected to 2 of 2 servers" "$tmp/$name-worker0.log" ||
                fail "$name: worker 0 never connected to both servers"
            sleep 0.1 # (its DECLARE follows at once)
            kill -"$sig" "${spid[$victim]}"
        fi
        for w in 1 2; do
            start_worker $w "$tmp/$name-worker$w.log" PSAGG_CONFIG="$tmp/$name.ini" PSAGG_WORLD_SIZE=3 "${bin[@]}"
        done
        if [[ $back == now ]]; then
            spawn "$tmp/$name-server${victim}b.log" "$build/server/psagg-server" --config "$tmp/$name.ini" --rank "$victim"
        elif [[ $back == view ]]; then
            for w in 0 1 2; do
                wait_until 30 grep -qs "server view 1:" "$tmp/$name-worker$w.log" ||
                    fail "$name: worker $w never took view 1"
            done
            kill -KILL "${spid[$victim]}" 2>/dev/null
            spawn "$tmp/$name-server${victim}b.log" "$build/server/psagg-server" --config "$tmp/$name.ini" --rank "$victim"
        fi
        for w in 0 1 2; do
            wait_for "${wpid[$w]}" 90
            rc[w]=$?
        done
    }
    # su_ok NAME VIEW REF: every worker exited 0, took server view VIEW (0: none), and ended with REF
    su_ok() {
        local name=$1 view=$2 want=$3 w d took
        for w in 0 1 2; do
            ((rc[w] == 0)) || fail "$name: worker $w exited ${rc[w]}: $(grep -h 'FAIL' "$tmp/$name-worker$w.log" | head -1)"
            [ -z "${optim:-}" ] || grep -q '^OPTIM-EXACT' "$tmp/$name-worker$w.log" || fail "$name: worker $w not exact"
            if ((view)); then
                grep -q "server view $view:" "$tmp/$name-worker$w.log" || fail "$name: worker $w never took view $view"
            else
                ! grep -q "server view" "$tmp/$name-worker$w.log" || fail "$name: worker $w took a server view"
            fi
        done
        d=$(digest_of "$name")
        [ "$d" = "$want" ] || fail "$name: digest $d, the uninterrupted run's $want"
        # from the first worker's start to the first give-up, and to the last worker in view 1
        took=$(grep -h -m1 "^[0-9.]* worker" "$tmp/$name"-worker[012].log | sed 's/$/ FIRST/'
            grep -h "given up during the start-up\|server view 1:" "$tmp/$name"-worker[012].log)
        took=$(awk '/ FIRST$/ {if (!s || $1 < s) s = $1}
                /given up/ {if (!g || $1 < g) g = $1} /server view 1:/ {if ($1 > v) v = $1}
                END {if (g) printf "; first give-up %.2f s after the first worker started, every worker in view 1 %.0f ms later", g - s, (v - g) * 1000}' <<<"$took")
        echo "$name: every worker bit-identical to the uninterrupted run ($d), server view $view$took;" \
            "$(grep -h "given up during the start-up\|answers again during" "$tmp/$name-worker0.log" |
                head -1 | sed 's/^[0-9.]* //' | cut -c1-150)"
        stop_all
    }
    su su-ref 1 0 declare -
    for w in 0 1 2; do ((rc[w] == 0)) || fail "su-ref: worker $w exited ${rc[w]} without a death"; done
    ref[su]=$(digest_of su-ref)
    stop_all
    if in_part startup; then
        su su-ref-auth 1 0 declare - cluster.secret_file="$tmp/secret" cluster.data_auth=on
        for w in 0 1 2; do ((rc[w] == 0)) || fail "su-ref-auth: worker $w exited ${rc[w]} without a death"; done
        stop_all
        su su-absent1 1 KILL absent -
        su_ok su-absent1 1 "${ref[su]}"
        su su-absent0 0 KILL absent -
        grep -q "reporting it to server 1" "$tmp/su-absent0-worker0.log" || fail "su-absent0: server 1 did not coordinate"
        su_ok su-absent0 1 "${ref[su]}"
        # with a secret, a process without it on server 1's port during the whole start-up: every
        # worker refuses its WELCOME, gives server 1 up at the deadline, and the job runs without it
        fake=1 su su-impostor1 1 KILL absent - cluster.secret_file="$tmp/secret" cluster.data_auth=on
        grep -q "server 1 given up during the start-up: .*WELCOME's token does not check out" \
            "$tmp/su-impostor1-worker2.log" || fail "su-impostor1: worker 2 did not give the impostor up"
        grep -q "HELLO from worker" "$tmp/su-impostor1-fake1.log" || fail "su-impostor1: nobody met the impostor"
        su_ok su-impostor1 1 "$(digest_of su-ref-auth)"
        su su-kill1 1 KILL declare -
        su_ok su-kill1 1 "${ref[su]}"
        su su-kill1-now 1 KILL declare now
        grep -q "answers again during the start-up" "$tmp/su-kill1-now-worker0.log" ||
            fail "su-kill1-now: worker 0 did not declare to the restarted server"
        su_ok su-kill1-now 0 "${ref[su]}"
    fi
    if in_part startup_back; then
        su su-kill0-back 0 KILL declare view
        grep -q "server 0 is back in view 2" "$tmp/su-kill0-back-worker1.log" || fail "su-kill0-back: server 0 did not rejoin"
        su_ok su-kill0-back 2 "${ref[su]}"
        su su-stop0-first 0 STOP first -
        grep -q "reporting it to server 1" "$tmp/su-stop0-first-worker0.log" ||
            fail "su-stop0-first: server 1 did not coordinate"
        su_ok su-stop0-first 1 "${ref[su]}"
        su su-stop1 1 STOP declare view
        grep -q "no READY within connect_timeout_ms" "$tmp/su-stop1-worker0.log" ||
            fail "su-stop1: worker 0 did not give the stopped server up at its deadline"
        su_ok su-stop1 2 "${ref[su]}"

        optim=1
        optim_keys=(server.optimizer=sgd server.momentum=0.9 server.nesterov=on server.sync_interval=3
            server.threads=2 worker.chunk_bytes=16384)
        su su-optim-ref 0 0 declare - "${optim_keys[@]}"
        for w in 0 1 2; do ((rc[w] == 0)) || fail "su-optim-ref: worker $w exited ${rc[w]} without a death"; done
        ref[su-optim]=$(digest_of su-optim-ref)
        stop_all
        su su-optim-kill0 0 KILL declare - "${optim_keys[@]}"
        su_ok su-optim-kill0 1 "${ref[su-optim]}"
        # a job that grows: server 1 is not started with the job (given up during the start-up: the
        # job runs on server 0 alone), then started once every worker took view 1; it joins with the
        # state of the parameter chunks it holds, and owns its own from then on
        su su-optim-grow1 1 KILL absent view "${optim_keys[@]}"
        grep -q "the state of its [1-9][0-9]* chunk(s) with copies came" "$tmp/su-optim-grow1-server1b.log" ||
            fail "su-optim-grow1: server 1 joined without its chunks' state"
        su_ok su-optim-grow1 2 "${ref[su-optim]}"
        unset optim

        su su-r0 1 KILL declare - cluster.server_replicas=0
        for w in 0 1 2; do
            ((rc[w] != 0)) || fail "su-r0: worker $w exited 0 with server 1 dead at start-up and no replicas"
        done
        # (worker 0, declared to both, reports server 0's verdict, which names the workers that never
        # declared to it: a server's ERROR frame wins over a lost connection, as it always did)
        for w in 1 2; do
            grep -q "^FAIL.*server 1" "$tmp/su-r0-worker$w.log" || fail "su-r0: worker $w's failure does not name server 1"
        done
        echo "su-r0: every worker's start-up failed; workers 1 and 2 name server 1: $(grep -h '^FAIL' "$tmp/su-r0-worker1.log" | head -1)"
        stop_all
    fi
fi
# (a round whose update the dead owner sent to some workers only: a kill that lands while its
# updates go out)
echo "test_server_failover: $(cat "$tmp"/*server*.log 2>/dev/null | grep -c "the update a worker relayed goes out") chunk round(s) relayed at a takeover"
echo "test_server_failover: ok"
