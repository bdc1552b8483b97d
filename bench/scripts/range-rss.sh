#!/usr/bin/env bash
# One large range against one fresh member (Keel or etcd): loads KEYS keys of 16 bytes with
# 1 KiB values, then reads them all in one linearizable range with etcdctl (grpc-go takes
# answers up to 2 GiB) and reports the range's time and the server's memory before and after
# it (VmHWM is the peak; RssAnon is the heap, RssFile the mapped files).
#
#   bench/scripts/range-rss.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/range-rss.sh etcd etcd path/to/keel-bench
#
# KEYS (default 200000), REPEATS (3: ranges in a row), and member.sh's PORT, DATA_ROOT and
# EXTRA_ARGS.
set -euo pipefail

kind=$1
server=$2
bench=$3
keys=${KEYS:-200000}
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"
start
trap 'kill $pid 2>/dev/null || true' EXIT
wait_ready_ms >/dev/null
echo "== $kind: loading $keys keys of 1 KiB"
"$bench" --endpoints "$url" --conns 10 --clients 100 \
  put --key-size 16 --val-size 1024 --key-space-size "$keys" --sequential-keys --total "$keys" \
  | grep -Ei "requests/sec|throughput|total" | head -3 || true
sleep 5
echo "before the range: $(rss)"
for i in $(seq 1 "${REPEATS:-3}"); do
  t0=$(date +%s%N)
  bytes=$(ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=120s \
    get "" --from-key -w protobuf | wc -c)
  t1=$(date +%s%N)
  echo "range $i: $bytes bytes in $(((t1 - t0) / 1000000)) ms; after: $(rss)"
done
