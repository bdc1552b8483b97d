#!/usr/bin/env bash
# Server CPU per read-only Txn (one range of one 256-byte key, as etcd's `benchmark txn-mixed`
# sends it), from /proc/PID/stat over TOTAL txns (100 clients over 10 connections), with the
# load generator's own summary (throughput, latency). The server is Keel or etcd: both take
# the same flags, so the same run compares them, or two builds of Keel.
#
#   bench/scripts/txn-read-cpu.sh path/to/keel-or-etcd path/to/keel-bench
#
# PORT (24200), TOTAL (50000), CONSISTENCY (l: linearizable, s: serializable).
set -euo pipefail
bin=$1
bench=$2
port=${PORT:-24200}
total=${TOTAL:-50000}
consistency=${CONSISTENCY:-l}
dir=$(mktemp -d)
url="127.0.0.1:$port"
"$bin" --name bench --data-dir "$dir/data" --listen-client-urls "http://$url" \
  --advertise-client-urls "http://$url" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-cluster "bench=http://127.0.0.1:$((port + 1))" >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
until ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=1s get probe >/dev/null 2>&1; do
  sleep 0.05
done
ETCDCTL_API=3 etcdctl --endpoints "$url" put k1 "$(head -c 256 /dev/zero | tr '\0' v)" >/dev/null
txns() {
  "$bench" --endpoints "$url" --conns 10 --clients 100 txn-mixed --rw-ratio 1e12 --limit 1 \
    --consistency "$consistency" --total "$1"
}
txns 10000 >/dev/null
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
t0=$(ticks)
summary=$(txns "$total")
t1=$(ticks)
hz=$(getconf CLK_TCK)
echo "$summary" | grep -A1 "^ *read "
echo "$bin: $(((t1 - t0) * 1000000 / hz / total)) us of server CPU per read-only txn ($consistency)"
