#!/usr/bin/env bash
# Samples one fresh server (Keel, or etcd for comparison) with `perf record` while keel-bench
# drives one named workload against it, and writes a flame graph (SVG) and its folded stacks.
# Only the server process is sampled (perf record -p PID, all its threads, user and kernel
# stacks); the preload a workload needs runs before sampling starts.
#
#   bench/scripts/flamegraph.sh WORKLOAD OUT_PREFIX
#   KIND=etcd SERVER=/usr/bin/etcd bench/scripts/flamegraph.sh put /tmp/flame-etcd-put
#
# writes OUT_PREFIX.svg, OUT_PREFIX.folded (inferno-collapse-perf output: one stack per line
# with its sample count) and OUT_PREFIX.txt (the keel-bench summary, the server's utime and
# stime over the sampled run, the perf sample count, and the server's syscalls counted by
# kind over the same run with `perf stat` on the syscall tracepoints, per request; per put in
# the watch workload). The folded counts are cpu-clock
# nanoseconds (each sample weighs its period), so their sum is the sampled server CPU time.
#
# WORKLOAD is one of
#   put          1000 clients / 100 conns, 256 B values, 20,000 keys written in sequence
#   txn-put      the same through Txn (one Put, no compares)
#   put1         one client / one conn, the same puts: each put alone on the path
#   put-large    1000 clients / 100 conns, each put to one of LARGE_KEYS keys (1,000,000)
#                drawn at random, 1 KiB values, after all of them were written (1 GiB of
#                values): a put on a store larger than the caches
#   range-l      linearizable Range of one key, 100 clients / 10 conns
#   range-s      serializable Range of one key, 100 clients / 10 conns
#   keepalive    LeaseKeepAlive, 100 clients (one lease and one stream each) / 10 conns
#   watch        100 streams x 100 watchers of one key over 100 conns; 32 B puts at
#                WATCH_RATE/s, each delivered to all 10,000 watchers
#
# SERVER (default target/release/keel), BENCH (target/release/keel-bench), KIND (keel or
# etcd: only the flags both take are passed), TOTAL (requests: put, txn-put and put-large 150000, put1
# 10000, watch 250 puts, the others 400000), WATCH_RATE (puts/s in the watch workload, 50), FREQ (perf
# samples per second per CPU, 499), CALL_GRAPH (perf's --call-graph: default dwarf,65528, the
# largest user stack copy, since Rust release code keeps no frame pointers and glommio's task
# stacks are deep: with 8 KiB most stacks stop at [unknown]; fp unwinds only kernel frames
# and C), MINWIDTH (inferno-flamegraph --minwidth, in pixels of 1200; narrower frames are
# dropped so the SVG stays small; 1), DATA_ROOT (a temp dir, removed at the end unless
# given), EXTRA_ARGS (more server flags, space separated).
#
# Needs: perf (run as root, or perf_event_paranoid <= 1 for kernel stacks), etcdctl (the
# readiness probe), and inferno's inferno-collapse-perf and inferno-flamegraph on PATH
# (`cargo install inferno`).
set -euo pipefail

workload=$1
out=$2
server=${SERVER:-target/release/keel}
bench=${BENCH:-target/release/keel-bench}
kind=${KIND:-keel}
freq=${FREQ:-499}
call_graph=${CALL_GRAPH:-dwarf,65528}
minwidth=${MINWIDTH:-1}
watch_rate=${WATCH_RATE:-50}
case "$workload" in
  put | txn-put | put-large) total=${TOTAL:-150000} ;;
  put1) total=${TOTAL:-10000} ;;
  watch) total=${TOTAL:-250} ;;
  *) total=${TOTAL:-400000} ;;
esac

for tool in perf etcdctl inferno-collapse-perf inferno-flamegraph; do
  command -v "$tool" >/dev/null || { echo "flamegraph.sh: $tool is not on PATH" >&2; exit 2; }
done

if [ -n "${DATA_ROOT:-}" ]; then
  root=$DATA_ROOT
  mkdir -p "$root"
  keep_root=1
else
  root=$(mktemp -d)
  keep_root=0
fi
data="$root/$kind.data"
log="$root/$kind.log"
perf_data="$root/perf.data"
rm -rf "$data"

# Two distinct free ports, chosen by the kernel.
read -r port peer < <(python3 -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
url="http://127.0.0.1:$port"
endpoint="127.0.0.1:$port"

args=(--name default --data-dir "$data"
  --listen-client-urls "$url" --advertise-client-urls "$url"
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer"
  --initial-cluster "default=http://127.0.0.1:$peer")
if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a extra <<<"$EXTRA_ARGS"; args+=("${extra[@]}"); fi

pid=
perf_pid=
stat_pid=
cleanup() {
  if [ -n "$stat_pid" ] && kill -0 "$stat_pid" 2>/dev/null; then kill -INT "$stat_pid" || true; wait "$stat_pid" || true; fi
  if [ -n "$perf_pid" ] && kill -0 "$perf_pid" 2>/dev/null; then kill -INT "$perf_pid" || true; wait "$perf_pid" || true; fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" || true; wait "$pid" 2>/dev/null || true; fi
  if [ "$keep_root" = 0 ]; then rm -rf "$root"; fi
}
trap cleanup EXIT

"$server" "${args[@]}" >>"$log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  if ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=1s get probe >/dev/null 2>&1; then break; fi
  kill -0 "$pid" 2>/dev/null || { echo "flamegraph.sh: server exited; log: $log" >&2; tail -20 "$log" >&2; exit 1; }
  sleep 0.1
done

b() { "$bench" --endpoints "$endpoint" "$@"; }
range_key=keel-bench-range
value=$(head -c 256 /dev/zero | tr '\0' v)

# Preload, not sampled.
case "$workload" in
  put | txn-put | put1)
    b --clients 100 --conns 10 put --key-size 8 --val-size 256 --total 20000 \
      --key-space-size 20000 --sequential-keys >/dev/null ;;
  put-large)
    b --clients 1000 --conns 100 put --key-size 8 --val-size 1024 --total "${LARGE_KEYS:-1000000}" \
      --key-space-size "${LARGE_KEYS:-1000000}" --sequential-keys >/dev/null ;;
  range-l | range-s)
    ETCDCTL_API=3 etcdctl --endpoints "$url" put "$range_key" "$value" >/dev/null ;;
  keepalive | watch) ;;
  *) echo "flamegraph.sh: unknown workload $workload" >&2; exit 2 ;;
esac

cmd=()
case "$workload" in
  put) cmd=(--clients 1000 --conns 100 put --key-size 8 --val-size 256 --total "$total"
    --key-space-size 20000 --sequential-keys) ;;
  put-large) cmd=(--clients 1000 --conns 100 put --key-size 8 --val-size 1024 --total "$total"
    --key-space-size "${LARGE_KEYS:-1000000}") ;;
  put1) cmd=(--clients 1 --conns 1 put --key-size 8 --val-size 256 --total "$total"
    --key-space-size 20000 --sequential-keys) ;;
  txn-put) cmd=(--clients 1000 --conns 100 txn-put --key-size 8 --val-size 256 --txn-ops 1
    --total "$total" --key-space-size 20000) ;;
  range-l) cmd=(--clients 100 --conns 10 range "$range_key" --consistency l --total "$total") ;;
  range-s) cmd=(--clients 100 --conns 10 range "$range_key" --consistency s --total "$total") ;;
  keepalive) cmd=(--clients 100 --conns 10 lease-keepalive --total "$total") ;;
  watch) cmd=(--clients 1 --conns 100 watch-latency --streams 100 --watchers-per-stream 100
    --put-total "$total" --put-rate "$watch_rate" --key-size 32 --val-size 32) ;;
esac

# utime + stime of all the server's threads, in clock ticks.
cpu_ticks() { awk '{print $14, $15}' "/proc/$pid/stat"; }

perf record -F "$freq" -e cpu-clock -g --call-graph "$call_graph" -p "$pid" -o "$perf_data" \
  2>"$root/perf-record.log" &
perf_pid=$!
# Beside the samples, the server's syscalls of the kinds its hot paths make, counted.
syscalls=(sendto recvfrom write writev read io_uring_enter futex epoll_wait)
events=()
for s in "${syscalls[@]}"; do events+=(-e "syscalls:sys_enter_$s"); done
perf stat -x, "${events[@]}" -p "$pid" -o "$root/perf-stat.csv" 2>"$root/perf-stat.log" &
stat_pid=$!
sleep 1 # perf attaches to every thread before the load starts
read -r u0 s0 < <(cpu_ticks)
t0=$(date +%s%N)
b "${cmd[@]}" >"$root/bench.txt" 2>&1 || { cat "$root/bench.txt" >&2; exit 1; }
t1=$(date +%s%N)
read -r u1 s1 < <(cpu_ticks)
kill -INT "$stat_pid" "$perf_pid"
wait "$stat_pid" || true
stat_pid=
wait "$perf_pid" || true
perf_pid=

hz=$(getconf CLK_TCK)
{
  echo "workload: $workload ($kind: $server), keel-bench ${cmd[*]}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), host: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  cat "$root/bench.txt"
  awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$hz" -v ns=$((t1 - t0)) 'BEGIN {
    printf "server CPU over the run: user %.2f s, system %.2f s (%.0f %% system), wall %.2f s\n",
      u / hz, s / hz, (u + s) ? 100 * s / (u + s) : 0, ns / 1e9 }'
  grep -h "Captured and wrote" "$root/perf-record.log" || true
  # perf stat -x, lines: count,unit,event,...
  awk -F, -v n="$total" -v unit="$([ "$workload" = watch ] && echo put || echo request)" '
    $3 ~ /^syscalls:sys_enter_/ && $1 ~ /^[0-9]+$/ && $1 > 0 {
      sub("syscalls:sys_enter_", "", $3)
      line = line sprintf("%s %d (%.2f/%s)  ", $3, $1, $1 / n, unit)
    }
    END { print "server syscalls: " line }' "$root/perf-stat.csv"
} >"$out.txt"

perf script -i "$perf_data" 2>/dev/null | inferno-collapse-perf --all >"$out.folded"
awk '{n += $NF} END {printf "sampled server CPU: %.2f s\n", n / 1e9}' "$out.folded" >>"$out.txt"
inferno-flamegraph --minwidth "$minwidth" --title "$kind $workload (server only, perf cpu-clock $freq Hz)" \
  <"$out.folded" >"$out.svg"
cat "$out.txt"
