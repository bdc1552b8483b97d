#!/usr/bin/env bash
# Loads TOTAL keys of 16 bytes with 1 KiB values into one fresh member (Keel or etcd), then
# reports the load's throughput and latency, the server's own count of slow puts, its RSS
# (anonymous and file-backed), the data directory's size, and the time from a kill -9 and
# restart until a linearizable get answers, with the RSS after that restart.
#
#   bench/scripts/load-rss.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/load-rss.sh etcd etcd path/to/keel-bench
#
# TOTAL (default 1000000), CLIENTS (100), CONNS (10), PORT (24379), DATA_ROOT (a temp dir),
# SETTLE_S (20: seconds between the load and the second RSS reading), LATE_S (40: seconds
# from that reading to a third, after which the member is killed; the last checkpoint of a
# load takes seconds to write, and what it frees goes back only after it),
# EXTRA_ARGS (more server flags, space separated).
set -euo pipefail

kind=$1
server=$2
bench=$3
total=${TOTAL:-1000000}
clients=${CLIENTS:-100}
conns=${CONNS:-10}
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"

start
wait_ready_ms >/dev/null
echo "== $kind: loading $total keys of 1 KiB"
"$bench" --endpoints "$url" --conns "$conns" --clients "$clients" \
  put --key-size 16 --val-size 1024 --key-space-size "$total" --sequential-keys --total "$total"
echo "RSS after load: $(rss)"
# The server's own handling time of the load's puts (grpc_server_handling_seconds; etcd
# exports it with --metrics extensive): how many took longer than 25, 50 and 100 ms inside
# the server, against the slowest the load generator saw.
curl -s "$url/metrics" | awk '
  /^grpc_server_handling_seconds_bucket.*grpc_method="Put"/ {
    match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5); n[le] = $2 }
  /^grpc_server_handling_seconds_count.*grpc_method="Put"/ { total = $2 }
  END { if (total) printf "puts handled in over 25 / 50 / 100 ms: %d / %d / %d of %d\n",
    total - n["0.025"], total - n["0.05"], total - n["0.1"], total }'
# Background work (a checkpoint in flight, compaction) settles; then the steady state.
sleep "${SETTLE_S:-20}"
echo "RSS ${SETTLE_S:-20} s later: $(rss)"
sleep "${LATE_S:-40}"
echo "RSS $((${SETTLE_S:-20} + ${LATE_S:-40})) s later: $(rss)"
echo "data dir: $(du -sh "$data" | cut -f1)"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
start
echo "restart after kill -9: linearizable get after $(wait_ready_ms) ms"
echo "RSS after restart: $(rss)"
kill "$pid"
wait "$pid" 2>/dev/null || true
