#!/usr/bin/env bash
# Instructions per unary gRPC call, counted by valgrind's callgrind: the in-process benchmark
# of grpc/benches/unary.rs (`cargo bench -p keel-grpc --bench unary`) run twice per build on
# the same input, for one timed round and for two (each run also serves one untimed warm-up
# round first), and the difference divided by the calls of one round, so start-up, the input's
# encoding and the warm-up drop out. Unlike the benchmark's CPU time, which spreads by ±15 %
# on a shared VM from run to run, the count is the same from run to run within a few
# instructions, so two builds can be told apart by a change of under 1 %. It counts
# instructions, not time: cache misses and the cost of each instruction are not in it, and a
# `rep movsb` copy (glibc's memcpy for large copies) counts about one instruction a byte.
#
#   bench/scripts/unary-ir.sh LABEL=BIN [LABEL=BIN ...]
#
# BIN is a built bench executable: `cargo bench -p keel-grpc --bench unary --no-run` prints
# its path (target/release/deps/unary-HASH); copy it aside before building the other tree.
# Environment: CALLS (per round, 20000), CONNS (1). Needs valgrind (Debian's `valgrind`).
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 1; }
command -v valgrind >/dev/null || { echo "unary-ir.sh: valgrind is not on PATH" >&2; exit 2; }
calls=${CALLS:-20000}
conns=${CONNS:-1}
# The benchmark serves whole calls per connection.
served=$((calls / conns * conns))
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Instructions of one run of BIN with ROUNDS timed rounds.
count() {
  local n
  if ! valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$calls" "$2" "$conns" >"$out" 2>&1; then
    echo "unary-ir.sh: $1 failed:" >&2
    cat "$out" >&2
    exit 1
  fi
  n=$(sed -nE 's/.*Collected : ([0-9]+).*/\1/p' "$out")
  [[ $n =~ ^[0-9]+$ ]] || { echo "unary-ir.sh: no instruction count from $1:" >&2; cat "$out" >&2; exit 1; }
  echo "$n"
}
for pair in "$@"; do
  label=${pair%%=*}
  bin=${pair#*=}
  one=$(count "$bin" 1)
  two=$(count "$bin" 2)
  echo "$label $(((two - one) / served)) instructions per call ($served calls a round, $conns connection(s))"
done
