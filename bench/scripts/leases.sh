#!/usr/bin/env bash
# Many live leases on one fresh member (Keel or etcd): grants LEASES leases of TTL seconds,
# then leaves the server idle for IDLE seconds. Reports, from the server's side:
#   - its CPU time over the idle period (utime + stime from /proc/PID/stat), as a share of
#     one core: the cost of keeping the leases' countdowns (the expiry check runs every
#     100 ms in Keel, every 500 ms in etcd 3.4),
#   - its RSS with the leases,
#   - the p50/p99 of keep-alives of one more lease meanwhile (KEEPALIVES of them, one client).
#
#   bench/scripts/leases.sh LABEL path/to/server path/to/keel-bench
#
# LEASES (100000), TTL (3600), IDLE (20), KEEPALIVES (2000), CLIENTS (100), CONNS (10), PORT,
# DATA_ROOT, EXTRA_ARGS as for member.sh.
set -euo pipefail

kind=$1
server=$2
bench=$3
leases=${LEASES:-100000}
ttl=${TTL:-3600}
idle=${IDLE:-20}
keepalives=${KEEPALIVES:-2000}
clients=${CLIENTS:-100}
conns=${CONNS:-10}
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)

start
wait_ready_ms >/dev/null
echo "== $kind: $leases leases of ${ttl}s, then ${idle}s idle"
ticks0=$(cpu_ticks)
"$bench" --endpoints "$url" --conns "$conns" --clients "$clients" lease-grant \
  --total "$leases" --ttl "$ttl" | grep -E "total|latency|error" || true
ticks_granted=$(cpu_ticks)
echo "server CPU granting: $(((ticks_granted - ticks0) * 1000 / hz)) ms ($(((ticks_granted - ticks0) * 1000000000 / hz / leases)) ns a grant)"
echo "RSS with the leases: $(rss)"
t0=$(date +%s%N)
ticks_idle0=$(cpu_ticks)
sleep "$idle"
ticks_idle1=$(cpu_ticks)
t1=$(date +%s%N)
wall_ms=$(((t1 - t0) / 1000000))
cpu_ms=$(((ticks_idle1 - ticks_idle0) * 1000 / hz))
echo "server CPU while idle: $cpu_ms ms over $wall_ms ms ($((cpu_ms * 1000 / wall_ms))/1000 of a core)"
"$bench" --endpoints "$url" lease-keepalive --total "$keepalives" | grep -E "total|latency|error" || true
kill "$pid"
wait "$pid" 2>/dev/null || true
