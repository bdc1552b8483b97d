#!/usr/bin/env bash
# One txn that compares every key of a large store, then puts one key: what it costs, with
# its values cold (on disk) and warm, and what the member's other clients see meanwhile.
# Loads KEYS keys of 8 bytes with VALUE_BYTES values into one fresh member, drops the page
# cache (root: /proc/sys/vm/drop_caches), then runs `keel-bench txn-compare` (a compare of
# every key's value, which holds for each) while one client reads a hot key serializably;
# then WARM more such txns, one at a time, and one txn comparing every key's lease (no value
# read). Prints when each txn was answered and when it was applied (its put seen by a
# serializable get, each taking about 0.1 s: a txn that outlasts the request timeout is
# answered "request timed out" and may be applied all the same), the hot reads' latency
# beside the cold txn,
# the server's CPU, its peak memory while the cold txn ran, and Keel's pager counters.
#
#   bench/scripts/big-txn.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/big-txn.sh etcd etcd path/to/keel-bench
#
# KEYS (1000000), VALUE_BYTES (1024), WARM (3), HOT_TOTAL (20000), APPLY_WAIT_S (300), and
# member.sh's PORT,
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
trap 'kill $pid 2>/dev/null && wait $pid 2>/dev/null; true' EXIT
wait_ready_ms >/dev/null
load_then_drop_page_cache

cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
latency() {
  python3 -c 'import json,sys; d=json.load(sys.stdin); c=d["classes"][0]; l=c["latency_us"]; print("%s: %d done, %d errors, p50 %.1f ms, max %.1f ms" % (sys.argv[1], c["total"] - c["errors"], c["errors"], l["p50"] / 1000, l["max"] / 1000))' "$1"
}
# The mod revision of the key each txn puts (0 before the first), read serializably.
marker_rev() {
  ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=2s get keel-bench/txn-compare \
    --consistency=s -w json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("kvs", [{}])[0].get("mod_revision", 0))' 2>/dev/null ||
    echo -1
}
# One txn comparing every key's $1; prints what its client was told, and when it was
# applied: a txn longer than the server's request timeout (etcd's 7 s with its default
# flags) is answered "request timed out" and applied all the same.
one_txn() {
  local before t0 out now
  before=$(marker_rev)
  until [ "$before" -ge 0 ]; do
    sleep 0.1
    before=$(marker_rev)
  done
  t0=$(date +%s%N)
  out=$("$bench" --endpoints "$url" txn-compare --target "$1" --total 1 --json 2>&1 || true)
  now=$(date +%s%N)
  local answered_ms=$(((now - t0) / 1000000)) said applied
  said=$(echo "$out" | python3 -c 'import json,sys; c=json.load(sys.stdin)["classes"][0]; print(c.get("first_error") or "succeeded")' 2>/dev/null || echo "$out" | tail -1)
  # A txn answered "request timed out" may never be applied (Keel does not propose one whose
  # values were still coming in from disk): wait up to APPLY_WAIT_S (300) for it.
  applied="not applied within ${APPLY_WAIT_S:-300} s"
  while [ $(($(date +%s%N) - now)) -lt $((${APPLY_WAIT_S:-300} * 1000000000)) ]; do
    if [ "$(marker_rev)" -gt "$before" ]; then
      applied="applied after $((($(date +%s%N) - t0) / 1000000)) ms"
      break
    fi
    sleep 0.05
  done
  echo "$2: answered after $answered_ms ms ($said), $applied"
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
one_txn value "cold txn" >"$root/cold.txt" &
cold=$!
peak_rss $cold >"$root/peak.txt" &
watcher=$!
"$bench" --endpoints "$url" --conns 1 --clients 1 range hot --consistency s \
  --total "${HOT_TOTAL:-20000}" --json | latency "hot reads beside it"
wait $cold
wait $watcher
cat "$root/cold.txt" "$root/peak.txt"
echo "-- ${WARM:-3} more, warm"
for i in $(seq "${WARM:-3}"); do one_txn value "warm txn $i"; done
echo "-- one comparing every lease (no value read)"
one_txn lease "lease txn"
t1=$(cpu_ticks)
echo "server CPU from the cold txn on (the hot reads too): $(((t1 - t0) * 10)) ms; $(rss)"
curl -s "$url/metrics" | grep -E '^keel_pager' || true
