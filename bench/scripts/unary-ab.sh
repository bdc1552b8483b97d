#!/usr/bin/env bash
# Two or more builds of the in-process gRPC call benchmark (`cargo bench -p keel-grpc --bench
# unary`, grpc/benches/unary.rs) alternated run by run, so drift in the machine hits them
# alike. Each run prints the median and min of its rounds (the thread's CPU ns per call); this
# prints, per build, the median of the runs' medians, the smallest min, and every run's median.
#
#   bench/scripts/unary-ab.sh RUNS CONNS LABEL=BIN [LABEL=BIN ...]
#
# BIN is a built bench executable: `cargo bench -p keel-grpc --bench unary --no-run` prints
# its path (target/release/deps/unary-HASH); copy it aside before building the other tree.
# Environment: CALLS (per run, 100000), ROUNDS (per run, 3).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,11p "$0"; exit 1; }
runs=$1
conns=$2
shift 2
calls=${CALLS:-100000}
rounds=${ROUNDS:-3}
for _ in $(seq "$runs"); do
  for pair in "$@"; do
    label=${pair%%=*}
    bin=${pair#*=}
    line=$("$bin" "$calls" "$rounds" "$conns")
    echo "$line" >&2
    # "... ns per call median M (min N, max X) ..."
    echo "$label $(sed -E 's/.*median ([0-9]+) \(min ([0-9]+).*/\1 \2/' <<<"$line")"
  done
done | python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    label, median, least = line.split()
    runs[label].append((int(median), int(least)))
for label, values in runs.items():
    medians = [m for m, _ in values]
    print(f"{label}: median of medians {statistics.median(medians):.0f} ns, "
          f"min {min(n for _, n in values)} ns, medians {medians}")
'
