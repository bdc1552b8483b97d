#!/usr/bin/env bash
# Loads TOTAL keys of 16 bytes with 1 KiB values into one fresh member (Keel or etcd), then
# runs UPDATES puts of 1 KiB to a working set of the first HOT of those keys, in random order,
# and reports for that update phase: throughput and latency, the server's CPU time per put
# (utime + stime from /proc/PID/stat, so the load generator's share of the cores is left
# out), and, for Keel, the checkpoints it wrote meanwhile (how many, how many were deltas,
# their bytes and serialize time, from its log). Then kill -9 and the time until a
# linearizable get answers again, with the RSS after that restart.
#
#   bench/scripts/hot-updates.sh LABEL path/to/server path/to/keel-bench
#
# LABEL names the data dir and log (keel, etcd, or another build's name). TOTAL (1000000),
# HOT (10000), UPDATES (1000000), CLIENTS (100), CONNS (10), SETTLE_S (20: seconds between
# the load and the update phase, for the load's last checkpoint), PORT, DATA_ROOT, EXTRA_ARGS
# as for member.sh.
set -euo pipefail

kind=$1
server=$2
bench=$3
total=${TOTAL:-1000000}
hot=${HOT:-10000}
updates=${UPDATES:-1000000}
clients=${CLIENTS:-100}
conns=${CONNS:-10}
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"

# utime + stime of the server, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }

start
wait_ready_ms >/dev/null
echo "== $kind: loading $total keys of 1 KiB"
"$bench" --endpoints "$url" --conns "$conns" --clients "$clients" \
  put --key-size 16 --val-size 1024 --key-space-size "$total" --sequential-keys --total "$total"
sleep "${SETTLE_S:-20}"
log_lines=$(wc -l <"$log")
ticks0=$(cpu_ticks)
echo "== $kind: $updates puts of 1 KiB to $hot hot keys"
"$bench" --endpoints "$url" --conns "$conns" --clients "$clients" \
  put --key-size 16 --val-size 1024 --key-space-size "$hot" --total "$updates"
ticks1=$(cpu_ticks)
hz=$(getconf CLK_TCK)
echo "server CPU during the updates: $(((ticks1 - ticks0) * 1000000 / hz / updates)) us per put"
tail -n +"$((log_lines + 1))" "$log" | python3 -c '
import json, sys
n = deltas = size = ms = 0
for line in sys.stdin:
    if "checkpoint written" not in line:
        continue
    f = json.loads(line)["fields"]
    n += 1
    deltas += f.get("delta_of") is not None
    size += f["bytes"]
    ms += f["serialize_ms"]
if n:
    print(f"checkpoints during the updates: {n}, {deltas} deltas, {size / 2**20:.0f} MiB written, serialize {ms} ms in all")
'
echo "data dir: $(du -sh "$data" | cut -f1)"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
start
echo "restart after kill -9: linearizable get after $(wait_ready_ms) ms"
echo "RSS after restart: $(rss)"
kill "$pid"
wait "$pid" 2>/dev/null || true
