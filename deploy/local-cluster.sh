#!/usr/bin/env bash
# Starts a local 3-member keel cluster on 127.0.0.1, with the ports of etcd's Procfile:
#   n1: client 2379,  peer 2380
#   n2: client 22379, peer 22380
#   n3: client 32379, peer 32380
# Data directories and logs go under DIR (default ./keel-local). Ctrl-C stops all three.
#
# usage: deploy/local-cluster.sh [DIR]
#   KEEL=path/to/keel   the binary (default: keel on PATH, else target/{release,debug}/keel)
#   KEEL_SHARDS=N       client-serving cores per member (default: keel's own split, below)
# The members see from --initial-cluster that they share this host and split its CPUs
# themselves (deploy/README.md): on 3 or more CPUs each takes a slice of its own, on fewer
# member i pins its raft core to CPU i % CPUs and takes one shard.
set -euo pipefail

dir="${1:-./keel-local}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

here="$(cd "$(dirname "$0")/.." && pwd)"
keel="${KEEL:-}"
if [[ -z "$keel" ]]; then
  for candidate in "$(command -v keel || true)" "$here/target/release/keel" "$here/target/debug/keel"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then keel="$candidate"; break; fi
  done
fi
if [[ -z "$keel" || ! -x "$keel" ]]; then
  echo "keel binary not found: build it (cargo build --release -p keel-core) or set KEEL=..." >&2
  exit 1
fi

cluster="n1=http://127.0.0.1:2380,n2=http://127.0.0.1:22380,n3=http://127.0.0.1:32380"
pids=()

stop() {
  trap - INT TERM EXIT
  echo "stopping ${pids[*]:-nothing}"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop INT TERM EXIT

start() {
  local name="$1" client="$2" peer="$3"
  "$keel" \
    --name "$name" \
    --data-dir "$dir/$name.keel" \
    --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" \
    --initial-cluster-token keel-local \
    --initial-cluster-state new \
    >"$dir/$name.log" 2>&1 &
  pids+=("$!")
  echo "$name: pid $! client http://127.0.0.1:$client peer http://127.0.0.1:$peer log $dir/$name.log"
}

start n1 2379 2380
start n2 22379 22380
start n3 32379 32380

echo "try: ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:2379,127.0.0.1:22379,127.0.0.1:32379 endpoint status -w table"
echo "Ctrl-C stops the cluster."
# Exit (and stop the rest) as soon as any member dies.
wait -n "${pids[@]}"
echo "a member exited; see the logs in $dir" >&2
exit 1
