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
BIN=${1:?usage: socket-queues.sh BIN}; TOTAL=${TOTAL:-300000}
d=$(mktemp -d /tmp/keel-socket-queues.XXXXXX)
read -r port peer < <(python3 -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
$BIN --name default --data-dir $d/data --listen-client-urls http://127.0.0.1:$port --advertise-client-urls http://127.0.0.1:$port --listen-peer-urls http://127.0.0.1:$peer --initial-advertise-peer-urls http://127.0.0.1:$peer --initial-cluster default=http://127.0.0.1:$peer > $d/log 2>&1 &
pid=$!
for i in $(seq 50); do etcdctl --endpoints 127.0.0.1:$port endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
B=${BENCH:-target/release/keel-bench}
$B --endpoints http://127.0.0.1:$port --clients 1000 --conns 100 put --key-size 8 --val-size 256 --total $TOTAL --key-space-size 20000 --sequential-keys | grep -E "throughput|p50" &
bp=$!
sleep 1
for i in $(seq ${SAMPLES:-6}); do
  ss -tnH state established "( sport = :$port )" | awk '{r+=$1; s+=$2; n++; if ($1>0) nz++} END{printf "server side: conns %d  recvq bytes %d (nonzero %d)  sendq %d\n", n, r, nz, s}'
  ss -tnH state established "( dport = :$port )" | awk '{r+=$1; s+=$2; n++; if ($1>0) nz++} END{printf "client side: conns %d  recvq bytes %d (nonzero %d)  sendq %d\n", n, r, nz, s}'
  sleep 0.4
done
wait $bp
kill $pid; wait $pid 2>/dev/null || true; rm -rf $d
