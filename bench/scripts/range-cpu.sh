#!/usr/bin/env bash
# Server CPU per serializable Range of one 256-byte key, from /proc/PID/stat over TOTAL ranges
# (100 clients over 10 connections), for A/B comparisons of two builds. With FILL=1, 200 values
# of 4 KiB are written after the key and the segment size is 64 KiB, so the key's value lies
# in a durable (mapped) value-log segment rather than in memory.
#
#   bench/scripts/range-cpu.sh path/to/keel path/to/keel-bench
#
# PORT (24100), TOTAL (100000), FILL, EXTRA_ARGS (more server flags).
set -euo pipefail
bin=$1
bench=$2
port=${PORT:-24100}
total=${TOTAL:-100000}
dir=$(mktemp -d)
extra=()
if [ -n "${FILL:-}" ]; then extra+=(--value-log-segment-bytes 65536); fi
if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a more <<<"$EXTRA_ARGS"; extra+=("${more[@]}"); fi
url="127.0.0.1:$port"
"$bin" "${extra[@]}" --data-dir "$dir/data" --listen-client-urls "http://$url" \
  --advertise-client-urls "http://$url" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
until ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=1s get probe >/dev/null 2>&1; do
  sleep 0.05
done
ETCDCTL_API=3 etcdctl --endpoints "$url" put k1 "$(head -c 256 /dev/zero | tr '\0' v)" >/dev/null
if [ -n "${FILL:-}" ]; then
  "$bench" --endpoints "$url" --conns 1 --clients 10 put --total 200 --val-size 4096 \
    --key-space-size 200 >/dev/null
  sleep 1
fi
range() { "$bench" --endpoints "$url" --conns 10 --clients 100 range k1 --consistency s --total "$1" >/dev/null; }
range 20000
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
t0=$(ticks)
range "$total"
t1=$(ticks)
hz=$(getconf CLK_TCK)
echo "$bin: $(((t1 - t0) * 1000000 / hz / total)) us of server CPU per range"
