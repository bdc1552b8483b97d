#!/usr/bin/env bash
# Space given back by compaction and defragment, and what a defragment costs the writes beside
# it, on one fresh member (Keel or etcd, the same flags for both):
#   1. load TOTAL keys of 16 bytes with 1 KiB values;
#   2. delete about half of them (keel-bench's keys are Go varints, so the range
#      [0x80, 0xc0) holds every key i >= 64 with i mod 64 < 32), compact physically;
#   3. puts at a fixed rate (RATE/s for PUT_S seconds) alone: the "normal" latency;
#   4. the same puts while `etcdctl defrag` runs: the latency beside a defragment;
#   5. small writes until Keel's checkpoints let the dead segment files go, then the sizes.
# Reports the data directory's size (du) and Status's dbSize after each step.
#
#   bench/scripts/defrag.sh keel target/release/keel target/release/keel-bench
#   bench/scripts/defrag.sh etcd etcd target/release/keel-bench
#
# TOTAL (1000000), RATE (1000), PUT_S (30), PORT (24379), DATA_ROOT (a temp dir), EXTRA_ARGS
# (more server flags; both servers get --snapshot-count 20000 first, so that Keel takes
# checkpoints during the run).
set -euo pipefail

kind=$1
server=$2
bench=$3
total=${TOTAL:-1000000}
rate=${RATE:-1000}
put_s=${PUT_S:-30}
EXTRA_ARGS="--snapshot-count 20000 ${EXTRA_ARGS:-}"
# shellcheck source=member.sh
source "$(dirname "$0")/member.sh"
ctl() { ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=600s "$@"; }
sizes() {
  local db
  db=$(ctl endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["dbSize"])')
  echo "data dir $(du -sm "$data" | cut -f1) MiB, dbSize $((db / 1048576)) MiB"
}
# wal_fsyncs: the server's WAL fdatasync histogram (etcd_disk_wal_fsync_duration_seconds, which
# both servers export on the client URL), one "le count" line per bucket.
wal_fsyncs() {
  curl -s "$url/metrics" | awk '/^etcd_disk_wal_fsync_duration_seconds_bucket/ {
    match($0, /le="[^"]*"/); print substr($0, RSTART + 4, RLENGTH - 5), $NF }'
}
# wal_fsync_delta LABEL BEFORE AFTER: fdatasyncs between two wal_fsyncs readings and their p99
# (the upper bound of the bucket that holds it).
wal_fsync_delta() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys
label, before, after = sys.argv[1:]
parse = lambda t: [(float(l.split()[0]), float(l.split()[1])) for l in t.splitlines() if l.strip()]
b, a = dict(parse(before)), parse(after)
delta = [(le, n - b.get(le, 0)) for le, n in a]
total = delta[-1][1] if delta else 0
p99 = next((le for le, n in delta if n >= 0.99 * total), float("nan")) if total else float("nan")
print("%s: %d WAL fdatasyncs, p99 <= %.1f ms" % (label, total, p99 * 1e3))
PY
}
# fixed_rate_puts LABEL: RATE puts/s for PUT_S s over the first keys; prints p50/p99/max.
fixed_rate_puts() {
  "$bench" --endpoints "$url" --conns 5 --clients 50 --json \
    put --key-size 16 --val-size 1024 --key-space-size "$total" --sequential-keys \
    --rate "$rate" --total $((rate * put_s)) |
    python3 -c '
import json, sys
s = json.load(sys.stdin)
c = [c for c in s["classes"] if c["name"] == "put"][0]
l = c["latency_us"]
print("%s: %d puts, %d errors, p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms" % (
    sys.argv[1], c["total"], c["errors"], l["p50"] / 1e3, l["p99"] / 1e3, l["p999"] / 1e3, l["max"] / 1e3))' "$1"
}

start
wait_ready_ms >/dev/null
echo "== $kind: loading $total keys of 1 KiB"
"$bench" --endpoints "$url" --conns 10 --clients 100 \
  put --key-size 16 --val-size 1024 --key-space-size "$total" --sequential-keys --total "$total" >/dev/null
echo "after the load: $(sizes)"
deleted=$(ctl del $'\x80' $'\xc0' | tail -n 1)
rev=$(ctl endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
ctl compact "$rev" --physical >/dev/null
echo "deleted $deleted keys, compacted at $rev: $(sizes)"
fsyncs0=$(wal_fsyncs)
fixed_rate_puts "puts alone"
fsyncs1=$(wal_fsyncs)
wal_fsync_delta "puts alone" "$fsyncs0" "$fsyncs1"
(
  t0=$(date +%s%N)
  ctl defrag >/dev/null
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000)) >"$root/$kind.defrag-ms"
) &
defrag=$!
fixed_rate_puts "puts beside the defragment"
wal_fsync_delta "puts beside the defragment" "$fsyncs1" "$(wal_fsyncs)"
wait "$defrag"
echo "defragment returned after $(cat "$root/$kind.defrag-ms") ms: $(sizes)"
# Keel deletes a dead segment file once the oldest checkpoint it keeps was taken after the
# segment died: two checkpoints later (--snapshot-count 20000 entries each).
"$bench" --endpoints "$url" --conns 5 --clients 50 \
  put --key-size 8 --val-size 8 --key-space-size 1 --total 50000 >/dev/null
sleep 10
echo "after 50000 more small puts: $(sizes)"
kill "$pid"
wait "$pid" 2>/dev/null || true
