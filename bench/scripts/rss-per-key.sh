#!/usr/bin/env bash
# The RSS a fresh member grows by per key (what `keel-bench compare`'s memory row measures as
# BENCHMARKS.md runs it, with --mem-keys 10000), for one or more builds, alternated: RSS before
# and after N sequential puts of VAL-byte values, 8-byte keys, 100 clients over 10
# connections, read WAIT seconds after the load.
#
#   bench/scripts/rss-per-key.sh RUNS LABEL=BIN [LABEL=BIN ...]
#
# N (10000), VAL (256), WAIT (0), BENCH (target/release/keel-bench), EXTRA_ARGS (more server
# flags). Needs etcdctl (the readiness probe). Prints "LABEL RUN bytes/key anon/key file/key".
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,10p "$0"; exit 1; }
runs=$1
shift
bench=${BENCH:-target/release/keel-bench}
n=${N:-10000}
kind=keel
pid=
DATA_ROOT=
trap '[ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }; [ -n "$DATA_ROOT" ] && rm -rf "$DATA_ROOT"' EXIT
trap 'exit 130' INT TERM
for r in $(seq 1 "$runs"); do
  for spec in "$@"; do
    server=${spec#*=}
    DATA_ROOT=$(mktemp -d)
    # shellcheck source=member.sh
    source "$(dirname "$0")/member.sh"
    start
    timeout 30 bash -c "until ETCDCTL_API=3 etcdctl --endpoints $url --command-timeout=1s get probe >/dev/null 2>&1; do sleep 0.05; done" ||
      { echo "rss-per-key.sh: ${spec%%=*} did not answer in 30 s; log: $log" >&2; exit 1; }
    kill -0 "$pid" || { echo "rss-per-key.sh: ${spec%%=*} exited; log: $log" >&2; exit 1; }
    field() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$pid/status"; }
    read -r r0 a0 f0 < <(echo "$(field VmRSS) $(field RssAnon) $(field RssFile)")
    "$bench" --endpoints "$url" --clients 100 --conns 10 put --key-size 8 --val-size "${VAL:-256}" \
      --total "$n" --key-space-size "$n" --sequential-keys >/dev/null
    sleep "${WAIT:-0}"
    read -r r1 a1 f1 < <(echo "$(field VmRSS) $(field RssAnon) $(field RssFile)")
    [ -n "$r0" ] && [ -n "$r1" ] || { echo "rss-per-key.sh: no RSS read for ${spec%%=*}" >&2; exit 1; }
    echo "${spec%%=*} $r $(((r1 - r0) * 1024 / n)) $(((a1 - a0) * 1024 / n)) $(((f1 - f0) * 1024 / n))"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    rm -rf "$DATA_ROOT"
    DATA_ROOT=
  done
done
