#!/bin/sh
# Runs one libFuzzer target for SECONDS, starting from the committed seed corpus (copied into
# corpus-run/, where libFuzzer adds what it finds). Crashes land in artifacts/<target>/.
# Usage: ./run.sh <target> <seconds>   (after ./build.sh)
set -e
cd "$(dirname "$0")"
target=$1
seconds=$2
mkdir -p "corpus-run/$target" "artifacts/$target"
cp -n ../corpus/"$target"/* "corpus-run/$target/" 2>/dev/null || true
exec "target/x86_64-unknown-linux-gnu/release/$target" "corpus-run/$target" \
  -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="artifacts/$target/"
