#!/usr/bin/env bash
# test_metrics.sh BUILD_DIR [PORT] - the servers' Prometheus endpoint ([server] metrics_port) and
# straggler report, on a real job: 2 servers (control ports PORT, PORT+1; metrics PORT+2,
# PORT+3; a reserved block without PORT) and 2 workers of fn_worker, started by
# deploy/psagg-local.
#   - while the job runs, each server's /metrics is scraped twice: every push, byte and round
#     counter, the rounds' collect and finish histograms and the aggregation threads' busy
#     time are there, and the second scrape's pushes, chunk rounds, round count and busy time
#     are higher; the codec mix counts every owned chunk and has the job's codec;
#   - promtool (Debian's prometheus package) accepts the exposition (`promtool check metrics`);
#   - another path answers 404, another method 405;
#   - a port already taken stops the server with a message naming it;
#   - at the end each server logs its straggler report (lateness per worker).
# PSAGG_KEEP_SCRAPE=FILE keeps server 0's second scrape and the straggler report there.
set -u -o pipefail

build=$1
server_bin=$build/server/psagg-server worker_bin=$build/tests/functional/fn_worker
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
reserve_ports 5 "${2:-}" # control ports, metrics ports, and a third server's control port
command -v curl >/dev/null || fail "curl is missing (deploy/install-deps.sh installs it)"
command -v promtool >/dev/null || fail "promtool is missing (Debian package prometheus; deploy/install-deps.sh)"

m0=$((port + 2)) m1=$((port + 3))
job_ini "$tmp/job.ini" 2 2 cluster.job_id="metrics-$port" server.threads=2 server.metrics_port=$m0 \
    worker.chunk_bytes=262144 log.level=info

spawn "$tmp/job.log" "$h_repo/deploy/psagg-local" --config "$tmp/job.ini" --server-bin "$server_bin" --timeout 200 -- \
    "$worker_bin" --codec maxmin4 --rounds 4000 --random-tensors 20
launcher=$h_pid

# the value of a sample (name with its labels, as printed) in a scrape
value() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }

# first scrape: as soon as server 0 counted a push
for ((i = 0; i < 300; i++)); do
    if curl -sf "http://127.0.0.1:$m0/metrics" >"$tmp/s0a" 2>/dev/null &&
        [[ $(value "$tmp/s0a" 'psagg_server_pushes_total{worker="1"}') -gt 0 ]]; then
        break
    fi
    kill -0 "$launcher" 2>/dev/null || { cat "$tmp/job.log"; fail "the job ended before a push was counted"; }
    sleep 0.1
done
[[ $(value "$tmp/s0a" 'psagg_server_pushes_total{worker="1"}') -gt 0 ]] || fail "no push counted after 30 s"
curl -sf "http://127.0.0.1:$m1/metrics" >"$tmp/s1a" || fail "server 1's endpoint (port $m1) does not answer"
sleep 0.5
curl -sf "http://127.0.0.1:$m0/metrics" >"$tmp/s0b" || fail "second scrape of server 0 failed"
kill -0 "$launcher" 2>/dev/null || fail "the job ended before the second scrape: make it longer"

for name in psagg_server_chunk_rounds_total psagg_server_updates_total \
    psagg_server_update_bytes_total psagg_server_dropped_messages_total psagg_server_cpu_seconds_total \
    psagg_server_rx_held psagg_server_pushes_spilled_total psagg_server_send_queue 'psagg_server_push_bytes_total{worker="0"}' \
    psagg_server_local_copies_total \
    'psagg_server_push_lateness_seconds_count{worker="1"}' \
    'psagg_server_push_lateness_seconds_bucket{worker="0",le="+Inf"}' \
    'psagg_server_push_lateness_p99_seconds{worker="0"}' 'psagg_server_round_collect_seconds_count' \
    'psagg_server_round_finish_seconds_bucket{le="+Inf"}' 'psagg_server_round_finish_seconds_sum' \
    'psagg_server_aggregation_busy_seconds_total{thread="1"}'; do
    [[ -n $(value "$tmp/s0a" "$name") ]] || fail "server 0's scrape has no sample $name"
done
grep -q '^psagg_server_info{job="metrics-'"$port"'",rank="1",' "$tmp/s1a" || fail "server 1's info names another job or rank"
# the busy time moves; the codec mix has the job's codec (the tensors under min_compress_elems go fp32)
a=$(value "$tmp/s0a" 'psagg_server_aggregation_busy_seconds_total{thread="0"}')
b=$(value "$tmp/s0b" 'psagg_server_aggregation_busy_seconds_total{thread="0"}')
awk -v a="$a" -v b="$b" 'BEGIN { exit !(b > a) }' || fail "aggregation busy time did not move ($a, then $b)"
for f in s0a s1a; do
    [[ $(value "$tmp/$f" 'psagg_server_codec_chunks{codec="maxmin4/1024/sr"}') -gt 0 ]] ||
        { grep codec "$tmp/$f"; fail "$f: no maxmin4 chunks in the codec mix"; }
done
owned=$(value "$tmp/s0a" psagg_server_chunks_owned)
mix=$(awk '$1 ~ /^psagg_server_codec_chunks\{/ { n += $2 } END { print n + 0 }' "$tmp/s0a")
((mix == owned)) || fail "the codec mix counts $mix chunks, the server owns $owned"
echo "test_metrics: codec mix of server 0: $(grep '^psagg_server_codec_chunks' "$tmp/s0a" | tr '\n' ' ')"
for name in 'psagg_server_pushes_total{worker="0"}' psagg_server_chunk_rounds_total \
    psagg_server_round_collect_seconds_count; do
    a=$(value "$tmp/s0a" "$name") b=$(value "$tmp/s0b" "$name")
    ((b > a)) || fail "$name did not move while the job ran ($a, then $b)"
    echo "test_metrics: $name $a -> $b"
done
for f in s0a s0b s1a; do
    promtool check metrics <"$tmp/$f" >"$tmp/promtool.log" 2>&1 || { cat "$tmp/promtool.log"; fail "promtool rejects $f"; }
done
echo "test_metrics: promtool check metrics accepts all three scrapes"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$m0/other")
[[ $code == 404 ]] || fail "GET /other answered $code, not 404"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$m0/metrics")
[[ $code == 405 ]] || fail "POST /metrics answered $code, not 405"

# a third server on a taken metrics port: refused by name (its control port is free)
PSAGG_CLUSTER_SERVERS="127.0.0.1:$port 127.0.0.1:$((port + 4))" PSAGG_SERVER_METRICS_PORT=$((m1 - 1)) \
    timeout 20 "$server_bin" --config "$tmp/job.ini" --rank 1 >"$tmp/taken.log" 2>&1
rc=$?
((rc != 0 && rc != 124)) || { cat "$tmp/taken.log"; fail "a server on a taken metrics port exited $rc"; }
grep -q "metrics endpoint: cannot serve on 127.0.0.1:$m1" "$tmp/taken.log" ||
    { cat "$tmp/taken.log"; fail "the refusal does not name the address"; }
echo "test_metrics: a taken port: $(grep -o 'metrics endpoint: .*' "$tmp/taken.log")"

wait "$launcher"
rc=$?
((rc == 0)) || { tail -n 30 "$tmp/job.log"; fail "the job failed (launcher exit $rc)"; }
for s in 0 1; do
    grep -q "server $s INFO straggler report: worker 1: [0-9]* pushes, lateness mean" "$tmp/job.log" ||
        { tail -n 30 "$tmp/job.log"; fail "server $s logged no straggler report"; }
done
grep "straggler report" "$tmp/job.log" | head -3
if [[ -n ${PSAGG_KEEP_SCRAPE:-} ]]; then
    { cat "$tmp/s0b"; grep "server 0 INFO straggler report" "$tmp/job.log"; } >"$PSAGG_KEEP_SCRAPE"
fi
echo "test_metrics: passed"
