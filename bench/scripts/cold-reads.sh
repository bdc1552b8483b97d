#!/usr/bin/env bash
# Reads of values that are on disk, beside reads of a value in memory, on one shard: what a
# cold read costs the other clients of the shard that takes it. Loads KEYS keys of 8 bytes with
# VALUE_BYTES values into one fresh member (their value-log segments are written with O_DIRECT,
# so none is in the page cache), drops the page cache (root: /proc/sys/vm/drop_caches), then
# runs COLD_CLIENTS clients reading random loaded keys (each read a page the disk must give)
# while one client reads a hot key written last (in memory), and prints the hot reads'
# latency and, for Keel, the pager's counters (keel_pager_*).
#
#   bench/scripts/cold-reads.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/cold-reads.sh etcd etcd path/to/keel-bench
#
# KEYS (500000), VALUE_BYTES (1024), COLD_CLIENTS (8), COLD_TOTAL (50000), HOT_TOTAL (20000),
# and member.sh's PORT, DATA_ROOT and EXTRA_ARGS (e.g. "--shards 1" for Keel, so the hot and
# cold clients share a shard).
set -euo pipefail

kind=$1
server=$2
bench=$3
keys=${KEYS:-500000}
value_bytes=${VALUE_BYTES:-1024}
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"
start
trap 'kill $pid 2>/dev/null || true' EXIT
wait_ready_ms >/dev/null
load_then_drop_page_cache
hot() {
  "$bench" --endpoints "$url" --conns 1 --clients 1 range hot --consistency s \
    --total "${HOT_TOTAL:-20000}" --json
}
echo "-- hot reads alone"
hot | python3 -c 'import json,sys; c=json.load(sys.stdin)["classes"][0]; l=c["latency_us"]; print("hot alone: p50 %d us, p99 %d us, p99.9 %d us, max %d us" % (l["p50"], l["p99"], l["p999"], l["max"]))'
echo "-- hot reads beside cold ones"
"$bench" --endpoints "$url" --conns 1 --clients "${COLD_CLIENTS:-8}" range x --consistency s \
  --random-put-keys "$keys" --total "${COLD_TOTAL:-50000}" --json >"$root/cold.json" &
cold=$!
hot | python3 -c 'import json,sys; c=json.load(sys.stdin)["classes"][0]; l=c["latency_us"]; print("hot beside cold: p50 %d us, p99 %d us, p99.9 %d us, max %d us" % (l["p50"], l["p99"], l["p999"], l["max"]))'
wait $cold
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["classes"][0]; l=c["latency_us"]; print("cold: %d reads in %.1f s (%.0f/s), %d errors, p50 %d us, p99 %d us, max %d us" % (c["total"], d["elapsed_s"], c["total"] / d["elapsed_s"], c["errors"], l["p50"], l["p99"], l["max"]))' "$root/cold.json"
curl -s "$url/metrics" | grep -E '^keel_(pager|value_cache)' || true
echo "after: $(rss)"
