#!/usr/bin/env bash
# LeaseLeases (`etcdctl lease list`) on a member holding many leases, Keel then etcd, three
# calls each, timed end to end (the call and etcdctl printing every id). keel-bench's
# lease-grant is asked for 200,000 leases; etcdctl's first line says how many there are.
set -euo pipefail
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
cd "$(dirname "$0")/../.."
for sys in keel etcd; do
  d=$(mktemp -d /tmp/ll.XXXX)
  bin=target/release/keel; [ $sys = etcd ] && bin=/usr/bin/etcd
  $bin --name n --data-dir $d/data --listen-client-urls http://127.0.0.1:23990 --advertise-client-urls http://127.0.0.1:23990 --listen-peer-urls http://127.0.0.1:23991 --initial-advertise-peer-urls http://127.0.0.1:23991 --initial-cluster n=http://127.0.0.1:23991 >$d/log 2>&1 & pid=$!
  until ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:23990 get x >/dev/null 2>&1; do sleep 0.1; done
  target/release/keel-bench --endpoints 127.0.0.1:23990 --clients 100 --conns 10 lease-grant --total 200000 --ttl 3600 >/dev/null
  for i in 1 2 3; do
    s=$(date +%s%N)
    ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:23990 --command-timeout 30s lease list >$d/list
    e=$(date +%s%N)
    n=$(head -1 $d/list)
    echo "$sys lease list: $n in $(( (e-s)/1000000 )) ms"
  done
  kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf $d
done
