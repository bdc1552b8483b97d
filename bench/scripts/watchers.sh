#!/usr/bin/env bash
# Many watchers on one fresh member (Keel or etcd): STREAMS x PER_STREAM watchers on one key,
# or on its prefix (PREFIX=1, as Kubernetes watches ranges), or each from its own start key to
# the end (PREFIX=from: ranges that overlap without sharing a boundary), then PUTS puts of 32 B at RATE/s,
# each delivered to every watcher. Reports, from the server's side:
#   - the server's CPU time to create the watchers (utime + stime from /proc/PID/stat, between
#     the start of keel-bench and the first put; keel-bench prints when creation ended),
#   - its CPU per delivered event over the puts,
#   - its RSS with every watcher in place,
#   - what it costs to drop them all when the client goes away: the server CPU from the
#     client's exit until the server is idle again, and how long a get then waits.
#
#   bench/scripts/watchers.sh LABEL path/to/server path/to/keel-bench
#
# STREAMS (100), PER_STREAM (1000), PREFIX (1), PUTS (20), RATE (10), CONNS (STREAMS, at most
# 100), PORT, DATA_ROOT, EXTRA_ARGS as for member.sh.
set -euo pipefail

kind=$1
server=$2
bench=$3
streams=${STREAMS:-100}
per_stream=${PER_STREAM:-1000}
puts=${PUTS:-20}
rate=${RATE:-10}
conns=${CONNS:-$((streams < 100 ? streams : 100))}
prefix_flag=()
if [ "${PREFIX:-1}" = 1 ]; then prefix_flag=(--prefix); fi
if [ "${PREFIX:-1}" = from ]; then prefix_flag=(--from-distinct-keys); fi
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
ms_of_ticks() { echo $(($1 * 1000 / hz)); }

start
wait_ready_ms >/dev/null
echo "== $kind: $((streams * per_stream)) watchers (${PREFIX:-1}: prefix), $puts puts at $rate/s"
out=$(mktemp)
ticks0=$(cpu_ticks)
"$bench" --endpoints "$url" --conns "$conns" watch-latency --streams "$streams" \
  --watchers-per-stream "$per_stream" --put-total "$puts" --put-rate "$rate" "${prefix_flag[@]}" \
  >"$out" 2>&1 &
bench_pid=$!
# The watchers are in place once keel-bench says so; read the CPU and memory right then.
until grep -q "watchers created" "$out" || ! kill -0 "$bench_pid" 2>/dev/null; do sleep 0.01; done
ticks_created=$(cpu_ticks)
rss_with_watchers=$(rss)
wait "$bench_pid"
ticks_exit=$(cpu_ticks)
cat "$out"
rm -f "$out"
# The client is gone: the server drops every watcher. Wait for its CPU to stop moving.
t_exit=$(date +%s%N)
get_ms=$(wait_ready_ms)
last=$(cpu_ticks)
while sleep 0.5; do
  now=$(cpu_ticks)
  [ "$now" -le "$((last + 1))" ] && break
  last=$now
done
ticks_idle=$(cpu_ticks)
t_idle=$(date +%s%N)
watchers=$((streams * per_stream))
events=$((watchers * puts))
echo "server CPU creating the watchers: $(ms_of_ticks $((ticks_created - ticks0))) ms"
echo "server CPU per delivered event: $(((ticks_exit - ticks_created) * 1000000000 / hz / events)) ns ($events events)"
echo "RSS with the watchers: $rss_with_watchers"
echo "after the client left: server CPU $(ms_of_ticks $((ticks_idle - ticks_exit))) ms until idle (within $(((t_idle - t_exit) / 1000000)) ms); a get answered after $get_ms ms"
kill "$pid"
wait "$pid" 2>/dev/null || true
