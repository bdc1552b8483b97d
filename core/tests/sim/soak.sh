#!/usr/bin/env bash
# Soak the whole-cluster simulation: chunks of seeds, alternating 3 and 5 members, each chunk's
# summary (or first failure and its replay command) appended to the log. Not run by CI.
# Built with the `soak` profile (optimised, debug assertions and overflow checks on), which
# runs seeds several times faster than a test build; a failing seed replays the same way in
# either (`SEED=n cargo test -p keel-core --test sim three_members`).
#   core/tests/sim/soak.sh [first-seed] [chunks] [log]
set -uo pipefail
cd "$(dirname "$0")/../.."
base=${1:-1000000}
chunks=${2:-100}
log=${3:-soak.log}
cargo test --profile soak -p keel-core --test sim --no-run 2>/dev/null
bin=$(ls -t ../target/soak/deps/sim-* | grep -v '\.d$' | head -1)
for _ in $(seq 1 "$chunks"); do
  for t in three_members five_members; do
    n=5000; [ "$t" = five_members ] && n=2500
    start=$(date +%s)
    SEEDS=$n SEED_BASE=$base nice -n 10 "$bin" "$t" --nocapture > "$log.chunk" 2>&1
    rc=$?
    echo "$(date +%T) $t base=$base n=$n rc=$rc secs=$(( $(date +%s) - start ))" >> "$log"
    grep -E "members:|^seed|panicked at" -A1 "$log.chunk" | head -4 >> "$log"
    base=$((base + n))
  done
done
