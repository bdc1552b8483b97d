#!/usr/bin/env bash
# One txn that compares every key of a large store, then puts one key: what it costs, with
# its values cold (on disk) and warm, and what the member's other clients see meanwhile.
# Loads KEYS keys of 8 bytes with VALUE_BYTES values into one fresh member, drops the page
# cache (root: /proc/sys/vm/drop_caches), then runs `keel-bench txn-compare` (a compare of
# every key's value, which holds for each) while one client reads a hot key serializably;
# then WARM more such txns, and one txn comparing every key's lease (no value read). Prints
# each txn's latency, the hot reads' latency beside the cold txn, the server's CPU over the
# txns, its peak memory while the cold txn ran, and for Keel the pager's counters.
#
#   bench/scripts/big-txn.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/big-txn.sh etcd etcd path/to/keel-bench
#
# KEYS (1000000), VALUE_BYTES (1024), WARM (3), HOT_TOTAL (20000), and member.sh's PORT,
# DATA_ROOT and EXTRA_ARGS (e.g. "--value-cache-bytes 536870912" for Keel).
set -euo pipefail

kind=$1
server=$2
bench=$3
keys=${KEYS:-1000000}
value_bytes=${VALUE_BYTES:-1024}
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"
start
trap 'kill $pid 2>/dev/null || true' EXIT
wait_ready_ms >/dev/null
echo "== $kind: loading $keys keys of $value_bytes bytes"
"$bench" --endpoints "$url" --conns 10 --clients 100 \
  put --key-size 8 --val-size "$value_bytes" --key-space-size "$keys" --sequential-keys \
  --total "$keys" | grep -Ei "throughput" || true
ETCDCTL_API=3 etcdctl --endpoints "$url" put hot "$(head -c 256 /dev/zero | tr '\0' h)" >/dev/null
sleep 5
sync
echo 3 >/proc/sys/vm/drop_caches
echo "page cache dropped; $(rss)"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
latency() {
  python3 -c 'import json,sys; d=json.load(sys.stdin); c=d["classes"][0]; l=c["latency_us"]; print("%s: %d done, %d errors, p50 %.1f ms, max %.1f ms" % (sys.argv[1], c["total"] - c["errors"], c["errors"], l["p50"] / 1000, l["max"] / 1000))' "$1"
}
# The peak of RssAnon and RssFile while a command runs (sampled every 100 ms).
peak_rss() {
  local anon=0 file=0 a f
  while kill -0 "$1" 2>/dev/null; do
    a=$(awk '/^RssAnon:/ {print int($2/1024)}' "/proc/$pid/status")
    f=$(awk '/^RssFile:/ {print int($2/1024)}' "/proc/$pid/status")
    [ "$a" -gt "$anon" ] && anon=$a
    [ "$f" -gt "$file" ] && file=$f
    sleep 0.1
  done
  echo "peak while it ran: RssAnon $anon MiB, RssFile $file MiB"
}

echo "-- one txn comparing every value, cold, beside serializable reads of a hot key"
t0=$(cpu_ticks)
"$bench" --endpoints "$url" txn-compare --target value --total 1 --json >"$root/cold.json" &
cold=$!
peak_rss $cold >"$root/peak.txt" &
watcher=$!
"$bench" --endpoints "$url" --conns 1 --clients 1 range hot --consistency s \
  --total "${HOT_TOTAL:-20000}" --json | latency "hot reads beside it"
wait $cold
wait $watcher
latency "cold txn" <"$root/cold.json"
cat "$root/peak.txt"
echo "-- ${WARM:-3} more, warm"
"$bench" --endpoints "$url" txn-compare --target value --total "${WARM:-3}" --json | latency "warm txns"
echo "-- one comparing every lease (no value read)"
"$bench" --endpoints "$url" txn-compare --target lease --total 1 --json | latency "lease txn"
t1=$(cpu_ticks)
echo "server CPU from the cold txn on (the hot reads too): $(((t1 - t0) * 10)) ms; $(rss)"
curl -s "$url/metrics" | grep -E '^keel_pager' || true
