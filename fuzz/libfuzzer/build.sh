#!/bin/sh
# Builds every libFuzzer binary with the instrumentation cargo-fuzz would use (without ASan:
# the targets are safe Rust; a panic is the failure they look for). Needs the nightly toolchain.
set -e
cd "$(dirname "$0")"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
exec cargo +nightly build --release --target x86_64-unknown-linux-gnu --bins "$@"
