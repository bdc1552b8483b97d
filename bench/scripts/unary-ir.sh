#!/usr/bin/env bash
# Instructions per unary gRPC call, counted by valgrind's callgrind: the in-process benchmark
# of grpc/benches/unary.rs (`cargo bench -p keel-grpc --bench unary`) run twice per build,
# for CALLS and 2 x CALLS calls, and the difference divided by CALLS (so start-up and the
# executor's setup drop out). Unlike the benchmark's CPU time, which spreads by ±15 % on a
# shared VM from run to run, the count is the same from run to run within a few
# instructions, so two builds can be told apart by a change of under 1 %. It counts
# instructions, not time: cache misses and the cost of each instruction are not in it, and a
# `rep movsb` copy (glibc's memcpy for large copies) counts about one instruction a byte.
#
#   bench/scripts/unary-ir.sh LABEL=BIN [LABEL=BIN ...]
#
# BIN is a built bench executable: `cargo bench -p keel-grpc --bench unary --no-run` prints
# its path (target/release/deps/unary-HASH); copy it aside before building the other tree.
# Environment: CALLS (20000), CONNS (1). Needs valgrind (Debian's `valgrind`).
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 1; }
command -v valgrind >/dev/null || { echo "unary-ir.sh: valgrind is not on PATH" >&2; exit 2; }
calls=${CALLS:-20000}
conns=${CONNS:-1}
count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2" 1 "$conns" 2>&1 |
    sed -nE 's/.*Collected : ([0-9]+).*/\1/p'
}
for pair in "$@"; do
  label=${pair%%=*}
  bin=${pair#*=}
  one=$(count "$bin" "$calls")
  two=$(count "$bin" $((2 * calls)))
  echo "$label $(( (two - one) / calls )) instructions per call ($calls and $((2 * calls)) calls, $conns connection(s))"
done
