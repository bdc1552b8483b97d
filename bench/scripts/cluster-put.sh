#!/usr/bin/env bash
# Put throughput and the servers' own CPU per put on a 3-member Keel cluster on 127.0.0.1,
# for several builds and raft-core placements, alternated so drift in the machine's load hits
# them all alike.
#
# Usage: bench/scripts/cluster-put.sh LABEL=BIN:PLACEMENT [...]
#   PLACEMENT: `last` (no --raft-cpu: keel's default, which for three members on 127.0.0.1
#   is now their own split of the CPUs, config::default_placement; before 2026-12-06 it was
#   every member's raft core on the last CPU) or `spread` (member i gets --raft-cpu i % CPUs,
#   as deploy/local-cluster.sh does)
#   for a keel binary; `etcd` for an etcd binary, started with the same flags less Keel's own
#   (`--shards`, `--raft-cpu`), so the two can be compared in one run.
# Environment: BENCH (target/release/keel-bench), REPEATS (2), TOTAL puts per run (200000),
#   CLIENTS (1000), CONNS (100), VAL (256), SHARDS (--shards per member; unset = keel's default).
# Load goes to all three client endpoints (keel-bench spreads connections round-robin), so
# followers forward two thirds of the writes to the leader.
set -euo pipefail
BENCH=${BENCH:-target/release/keel-bench}
REPEATS=${REPEATS:-2}
TOTAL=${TOTAL:-200000}
CLIENTS=${CLIENTS:-1000}
CONNS=${CONNS:-100}
VAL=${VAL:-256}
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 1; }
work=$(mktemp -d /tmp/keel-cluster-bench.XXXXXX)
pids=()
stop_members() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap 'stop_members; rm -rf "$work"' EXIT
tick=$(getconf CLK_TCK)
# The CPUs this shell may run on, by number: a taskset or cpuset need not start at CPU 0.
cpus=()
for range in $(awk '/^Cpus_allowed_list/ { gsub(",", " ", $2); print $2 }' /proc/self/status); do
  cpus+=($(seq "${range%-*}" "${range#*-}"))
done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
port=24000
echo "label placement repeat elapsed_s puts_per_s p50_ms p99_ms errors server_cpu_s server_cpu_us_per_put client_cpu_pct_all member_cpu_us_per_put"
for r in $(seq 1 "$REPEATS"); do
  for spec in "$@"; do
    label=${spec%%=*}
    rest=${spec#*=}
    bin=${rest%:*}
    placement=${rest##*:}
    case "$placement" in last | spread | etcd) ;; *) echo "placement must be last, spread or etcd: $spec" >&2; exit 1 ;; esac
    port=$((port + 10))
    cluster=""
    eps=""
    for i in 0 1 2; do
      cluster+="${cluster:+,}n$i=http://127.0.0.1:$((port + 2 * i + 1))"
      eps+="${eps:+,}http://127.0.0.1:$((port + 2 * i))"
    done
    for i in 0 1 2; do
      client="http://127.0.0.1:$((port + 2 * i))"
      peer="http://127.0.0.1:$((port + 2 * i + 1))"
      extra=()
      [ "$placement" = spread ] && extra+=(--raft-cpu "${cpus[i % ${#cpus[@]}]}")
      [ -n "${SHARDS:-}" ] && [ "$placement" != etcd ] && extra+=(--shards "$SHARDS")
      "$bin" --name "n$i" --data-dir "$work/$label-$r-n$i" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "$cluster" --initial-cluster-state new "${extra[@]}" \
        >"$work/$label-$r-n$i.log" 2>&1 &
      pids+=("$!")
    done
    for _ in $(seq 1 150); do
      "$BENCH" --endpoints "$eps" put --total 3 >/dev/null 2>&1 && break
      sleep 0.2
    done
    before=()
    for pid in "${pids[@]}"; do before+=("$(cpu_ticks "$pid")"); done
    out=$("$BENCH" --endpoints "$eps" --clients "$CLIENTS" --conns "$CONNS" --json \
      put --total "$TOTAL" --key-size 8 --val-size "$VAL" --sequential-keys --key-space-size 100000) || true
    after=()
    for pid in "${pids[@]}"; do after+=("$(cpu_ticks "$pid")"); done
    stop_members
    rm -rf "$work/$label-$r-"n?
    OUT="$out" python3 - "$label" "$placement" "$r" "${before[*]}" "${after[*]}" "$tick" <<'PY'
import json, os, sys
s = json.loads(os.environ["OUT"])
c = [c for c in s["classes"] if c["name"] == "put"][0]
label, placement, r, before, after, tick = sys.argv[1:]
member_s = [(int(a) - int(b)) / int(tick) for a, b in zip(after.split(), before.split())]
cpu_s = sum(member_s)
puts = c["total"] - c["errors"]
# Each member's own CPU per put, highest first (the leader's, as a rule, then the followers').
members = "/".join(str(round(m * 1e6 / puts, 1)) for m in sorted(member_s, reverse=True))
print(label, placement, r, round(s["elapsed_s"], 1), round(c["throughput_per_s"]), round(c["latency_us"]["p50"] / 1000, 1),
      round(c["latency_us"]["p99"] / 1000, 1), c["errors"], round(cpu_s, 2),
      round(cpu_s * 1e6 / puts, 1), round(s["client_cpu"]["pct_of_all_cores"]), members, flush=True)
PY
  done
done
