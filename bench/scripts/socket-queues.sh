#!/usr/bin/env bash
# Where the requests of a put load at 1000 clients wait: samples the client port's TCP queues
# on both sides while keel-bench runs (1000 clients over 100 connections, 256-byte values).
# Server side Recv-Q: requests the server has not read yet; client side Recv-Q: answers the
# load generator has not read yet. BIN is a keel binary or etcd itself (both take these
# flags).
#
#   bench/scripts/socket-queues.sh BIN
#
# Environment: TOTAL puts (300000), SAMPLES (6, 0.4 s apart, from 1 s into the run), BENCH
# (target/release/keel-bench). Needs etcdctl (the readiness probe) and ss (iproute2).
set -euo pipefail
bin=${1:?usage: socket-queues.sh BIN}
total=${TOTAL:-300000}
bench=${BENCH:-target/release/keel-bench}
work=$(mktemp -d /tmp/keel-socket-queues.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
read -r port peer < <(python3 -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
"$bin" --name default --data-dir "$work/data" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "default=http://127.0.0.1:$peer" >"$work/log" 2>&1 &
pid=$!
until ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$port" --command-timeout=1s endpoint health >/dev/null 2>&1; do
  kill -0 "$pid" 2>/dev/null || { echo "socket-queues.sh: the server exited; its log:" >&2; tail -5 "$work/log" >&2; exit 1; }
  sleep 0.1
done
"$bench" --endpoints "http://127.0.0.1:$port" --clients 1000 --conns 100 put --key-size 8 --val-size 256 \
  --total "$total" --key-space-size 20000 --sequential-keys >"$work/bench.out" &
bench_pid=$!
sleep 1
# A sample taken after the load ended reports 0 connections: raise TOTAL for a faster server.
for _ in $(seq "${SAMPLES:-6}"); do
  ss -tnH state established "( sport = :$port )" | awk '{r+=$1; s+=$2; n++; if ($1>0) nz++} END{printf "server side: conns %d  recvq bytes %d (nonzero %d)  sendq %d\n", n, r, nz, s}'
  ss -tnH state established "( dport = :$port )" | awk '{r+=$1; s+=$2; n++; if ($1>0) nz++} END{printf "client side: conns %d  recvq bytes %d (nonzero %d)  sendq %d\n", n, r, nz, s}'
  sleep 0.4
done
wait "$bench_pid"
grep -E "throughput|p50" "$work/bench.out"
