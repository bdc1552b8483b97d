#!/usr/bin/env bash
# Two or more server builds (or etcd) side by side on one workload, alternated run by run so
# drift in the machine's load hits them alike. Each run starts a fresh single member on free
# ports with a fresh data directory, writes KEYS keys, 20,000 unless set (not measured; 1000 clients over 100
# connections since 2026-12-06 evening, 100 over 10 before), then measures:
# the server's CPU (utime + stime of all its threads from /proc/PID/stat) per request, the
# load generator's throughput, p50 and p99, and the server's syscalls per request counted by
# `perf stat` on the syscall tracepoints (all, and io_uring_enter alone).
#
#   bench/scripts/server-ab.sh WORKLOAD RUNS LABEL=BIN [LABEL=BIN ...]
#
# WORKLOAD: put (1000 clients over 100 connections, 256 B values, 20,000 keys in sequence),
#   put-random (the same, each put to a key drawn at random from the preloaded ones),
#   put1 (one client, one connection, 256 B, 1,000 keys), txn-put (as put, through Txn),
#   range-s and range-l (serializable and linearizable Range of one 256-byte key, 100 clients
#   over 10 connections), range-random-s and range-random-l (the same, each request one of the
#   KEYS keys written before, spread over them: a large store's reads), keepalive (100 clients, one lease and stream each, over 10
#   connections).
# Environment: BENCH (target/release/keel-bench), TOTAL requests per run (put and txn-put
#   100000, put1 3000, the ranges and keepalive 200000), KEYS (keys written before the
#   measured run, and the key space of put, put-random and txn-put: 20000), VAL_SIZE (bytes
#   of each value those keys are written with, and of put, put-random, put1 and txn-put's
#   values: 256), PASSES (times
#   those keys are written before the measured run, in sequence: 1), EXTRA_ARGS (more server flags,
#   space separated), BENCH_ARGS (more keel-bench flags for the measured run, e.g.
#   "--warmup 1"; a warm-up's requests count in the server's CPU but not in TOTAL),
#   THREADS=1 (also print each server thread's CPU per request, from its schedstat run time,
#   as lines "thread LABEL RUN NAME US_PER_REQ").
# Needs perf (root, or perf_event_paranoid <= 1) and etcdctl (the readiness probe).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,16p "$0"; exit 1; }
workload=$1
runs=$2
shift 2
bench=${BENCH:-target/release/keel-bench}
keys=${KEYS:-20000}
val=${VAL_SIZE:-256}
case "$workload" in
  put) total=${TOTAL:-100000}
    cmd=(--clients 1000 --conns 100 put --key-size 8 --val-size "$val" --total "$total"
      --key-space-size "$keys" --sequential-keys) ;;
  put-random) total=${TOTAL:-100000}
    cmd=(--clients 1000 --conns 100 put --key-size 8 --val-size "$val" --total "$total"
      --key-space-size "$keys") ;;
  txn-put) total=${TOTAL:-100000}
    cmd=(--clients 1000 --conns 100 txn-put --key-size 8 --val-size "$val" --txn-ops 1 --total "$total"
      --key-space-size "$keys") ;;
  range-s | range-l) total=${TOTAL:-200000}
    cmd=(--clients 100 --conns 10 range server-ab-range --consistency "${workload#range-}" --total "$total") ;;
  range-random-s | range-random-l) total=${TOTAL:-200000}
    cmd=(--clients 100 --conns 10 range server-ab-range --random-put-keys "$keys"
      --consistency "${workload#range-random-}" --total "$total") ;;
  put1) total=${TOTAL:-3000}
    cmd=(--clients 1 --conns 1 put --key-size 8 --val-size "$val" --total "$total" --key-space-size 1000) ;;
  keepalive) total=${TOTAL:-200000}
    cmd=(--clients 100 --conns 10 lease-keepalive --total "$total") ;;
  *) echo "server-ab.sh: unknown workload $workload" >&2; exit 2 ;;
esac
work=$(mktemp -d /tmp/keel-server-ab.XXXXXX)
pid=
stat_pid=
cleanup() {
  if [ -n "$stat_pid" ] && kill -0 "$stat_pid" 2>/dev/null; then kill -INT "$stat_pid" || true; wait "$stat_pid" || true; fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
extra=()
if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a extra <<<"$EXTRA_ARGS"; fi
bench_args=()
if [ -n "${BENCH_ARGS:-}" ]; then read -r -a bench_args <<<"$BENCH_ARGS"; fi
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Each thread's run time in ns (schedstat's first field: exact, where stat counts ticks).
thread_ns() { for t in /proc/"$1"/task/*; do echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(cut -d' ' -f1 "$t/schedstat")"; done 2>/dev/null | sort; }
tick=$(getconf CLK_TCK)
echo "workload label run server_cpu_us_per_req req_per_s p50_ms p99_ms syscalls_per_req io_uring_enter_per_req"
for r in $(seq 1 "$runs"); do
  for spec in "$@"; do
    label=${spec%%=*}
    bin=${spec#*=}
    read -r port peer < <(python3 -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
    data="$work/$label-$r"
    "$bin" --name default --data-dir "$data" \
      --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
      --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "default=http://127.0.0.1:$peer" "${extra[@]}" >"$data.log" 2>&1 &
    pid=$!
    until ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$port" --command-timeout=1s get probe >/dev/null 2>&1; do
      kill -0 "$pid" 2>/dev/null || { echo "server-ab.sh: $label exited; log: $data.log" >&2; tail -5 "$data.log" >&2; exit 1; }
      sleep 0.05
    done
    b() { "$bench" --endpoints "127.0.0.1:$port" "$@"; }
    for _ in $(seq 1 "${PASSES:-1}"); do
      b --clients 1000 --conns 100 put --key-size 8 --val-size "$val" --total "$keys" \
        --key-space-size "$keys" --sequential-keys >/dev/null
    done
    ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$port" put server-ab-range "$(head -c 256 /dev/zero | tr '\0' v)" >/dev/null
    perf stat -x, -e 'raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter' -p "$pid" \
      -o "$work/stat" &
    stat_pid=$!
    sleep 0.2
    before=$(cpu_ticks "$pid")
    thread_ns "$pid" >"$work/threads.before"
    b "${bench_args[@]}" "${cmd[@]}" >"$work/out"
    after=$(cpu_ticks "$pid")
    thread_ns "$pid" >"$work/threads.after"
    kill -INT "$stat_pid"; wait "$stat_pid" || true
    stat_pid=
    kill "$pid"; wait "$pid" 2>/dev/null || true
    pid=
    syscalls=$(awk -F, '/raw_syscalls:sys_enter/ {print $1}' "$work/stat")
    enters=$(awk -F, '/sys_enter_io_uring_enter/ {print $1}' "$work/stat")
    rate=$(awk '/throughput/ {print $(NF-1)}' "$work/out")
    p50=$(awk '/latency ms:/ {for (i = 1; i <= NF; i++) if ($i == "p50") print $(i + 1)}' "$work/out")
    p99=$(awk '/latency ms:/ {for (i = 1; i <= NF; i++) if ($i == "p99") print $(i + 1)}' "$work/out")
    awk -v w="$workload" -v l="$label" -v r="$r" -v t="$total" -v tick="$tick" -v c=$((after - before)) \
      -v rate="$rate" -v p50="$p50" -v p99="$p99" -v s="$syscalls" -v e="$enters" \
      'BEGIN { printf "%s %s %d %.1f %s %s %s %.3f %.3f\n", w, l, r, c * 1e6 / tick / t, rate, p50, p99, s / t, e / t }'
    if [ -n "${THREADS:-}" ]; then
      # Threads that ran at least 0.1 µs per request, summed by name.
      join "$work/threads.before" "$work/threads.after" | awk -v l="$label" -v r="$r" -v t="$total" \
        '{ d[$2] += ($5 - $3) / 1000 / t } END { for (n in d) if (d[n] >= 0.1) printf "thread %s %d %s %.1f\n", l, r, n, d[n] }' | sort -k4
    fi
  done
done
