#!/usr/bin/env bash
# A flame graph of one member of a three-member cluster on 127.0.0.1 (the leader, or a
# follower) while keel-bench puts through all three members' client endpoints, as
# `keel-bench compare`'s three-member row does. Only that member's process is sampled
# (perf record -p PID, all its threads, user and kernel stacks).
#
#   bench/scripts/flame-cluster.sh leader|follower OUT_PREFIX
#   KIND=etcd SERVER=/usr/bin/etcd bench/scripts/flame-cluster.sh leader /tmp/flame-etcd-c3
#
# writes OUT_PREFIX.svg, OUT_PREFIX.folded (inferno-collapse-perf output; counts are
# cpu-clock nanoseconds, so their sum is the sampled CPU time) and OUT_PREFIX.txt (the
# keel-bench summary, and for every member its CPU per put by thread name, from each
# thread's schedstat run time: exact, where /proc/PID/stat counts 10 ms ticks). Members that
# share a host run their shard inside the raft core's thread (--host-shards-on-raft-cpu), so
# their keel-raft line holds the shard's work too.
#
# SERVER (default target/release/keel), BENCH (target/release/keel-bench), KIND (keel or etcd;
# etcd threads are not named, so its per-thread lines say only "etcd"), TOTAL (puts, 150000),
# KEYS (key space, 10000: compare's default --mem-keys is larger, but its runs in BENCHMARKS.md
# use 10000), FREQ (perf samples per second, 999; 0: no sampling, only the OUT_PREFIX.txt
# summary, for comparing builds by CPU per put without perf's cost), CALL_GRAPH (dwarf,32768), PORT (first of
# six ports, 25400).
#
# Needs: etcdctl (the leader probe) and python3; unless FREQ=0, also perf,
# inferno-collapse-perf and inferno-flamegraph on PATH (`cargo install inferno`).
set -euo pipefail

role=$1
out=$2
case "$role" in leader | follower) ;; *) echo "role must be leader or follower" >&2; exit 2 ;; esac
server=${SERVER:-target/release/keel}
bench=${BENCH:-target/release/keel-bench}
total=${TOTAL:-150000}
keys=${KEYS:-10000}
freq=${FREQ:-999}
call_graph=${CALL_GRAPH:-dwarf,32768}
port=${PORT:-25400}
tools=(etcdctl python3)
[ "$freq" = 0 ] || tools+=(perf inferno-collapse-perf inferno-flamegraph)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "flame-cluster.sh: $tool is not on PATH" >&2; exit 2; }
done

work=$(mktemp -d /tmp/flame-cluster.XXXXXX)
pids=()
stop_members() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap 'stop_members; rm -rf "$work"' EXIT

cluster=""
eps=""
for i in 0 1 2; do
  cluster+="${cluster:+,}n$i=http://127.0.0.1:$((port + 2 * i + 1))"
  eps+="${eps:+,}http://127.0.0.1:$((port + 2 * i))"
done
for i in 0 1 2; do
  client="http://127.0.0.1:$((port + 2 * i))"
  peer="http://127.0.0.1:$((port + 2 * i + 1))"
  "$server" --name "n$i" --data-dir "$work/n$i" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new >"$work/n$i.log" 2>&1 &
  pids+=("$!")
done
ready=false
for _ in $(seq 1 150); do
  "$bench" --endpoints "$eps" put --total 3 >/dev/null 2>&1 && { ready=true; break; }
  sleep 0.2
done
$ready || { echo "flame-cluster.sh: the cluster took no write in 30 s; logs in $work" >&2; trap - EXIT; stop_members; exit 1; }
# `endpoint status` prints "URL, ID, version, db size, is leader, ...".
leader_url=$(ETCDCTL_API=3 etcdctl --endpoints "$eps" endpoint status | awk -F', ' '$5 == "true" { print $1 }')
[ -n "$leader_url" ] || { echo "flame-cluster.sh: no leader" >&2; exit 1; }
want_leader=false
[ "$role" = leader ] && want_leader=true
sampled=""
for i in 0 1 2; do
  is_leader=false
  [ "$leader_url" = "http://127.0.0.1:$((port + 2 * i))" ] && is_leader=true
  if [ -z "$sampled" ] && [ "$is_leader" = "$want_leader" ]; then
    sampled=$i
  fi
done
snapshot() {
  for i in 0 1 2; do
    for task in /proc/"${pids[i]}"/task/*; do
      echo "n$i $(cat "$task/comm" | tr ' ' _) $(awk '{ print $1 }' "$task/schedstat")"
    done
  done
}
snapshot >"$work/before"
sample=(perf record -F "$freq" --call-graph "$call_graph" -o "$work/perf.data" -p "${pids[sampled]}" --)
[ "$freq" = 0 ] && sample=()
"${sample[@]}" "$bench" --endpoints "$eps" --clients 1000 --conns 100 put --total "$total" --key-size 8 \
  --val-size 256 --sequential-keys --key-space-size "$keys" >"$work/bench.txt" 2>&1
snapshot >"$work/after"
{
  echo "three members ($server), leader $leader_url; sampled n$sampled, the $role"
  echo "keel-bench --endpoints $eps --clients 1000 --conns 100 put --total $total --key-size 8 --val-size 256 --sequential-keys --key-space-size $keys"
  echo "date: $(date -u +%FT%TZ), host: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E 'throughput|latency' "$work/bench.txt" || true
  echo "CPU per put by member and thread name (schedstat run time; the leader is marked):"
  python3 - "$work/before" "$work/after" "$total" "$leader_url" "$port" <<'PY'
import collections, re, sys
before, after, total, leader_url, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
def load(path):
    ns = collections.Counter()
    for line in open(path):
        member, comm, run_ns = line.split()
        # Thread names carry their number (keel-shard-0-2, iou-wrk-1234): group by kind.
        ns[(member, re.sub(r'(-\d+)+$', '', comm))] += int(run_ns)
    return ns
b, a = load(before), load(after)
for member in ('n0', 'n1', 'n2'):
    mark = ' (leader)' if leader_url.endswith(':%d' % (port + 2 * int(member[1]))) else ''
    rows = sorted(((a[k] - b.get(k, 0)) / 1e3 / total, k[1]) for k in a if k[0] == member)
    print('  %s%s: %.2f us/put: %s' % (member, mark, sum(r[0] for r in rows),
          ', '.join('%s %.2f' % (name, us) for us, name in reversed(rows) if us >= 0.05)))
PY
} >"$out.txt"
if [ "$freq" = 0 ]; then cat "$out.txt"; exit 0; fi
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf --all >"$out.folded"
inferno-flamegraph --minwidth 1 --title "n$sampled, the $role of three members: put, 1000 clients" \
  <"$out.folded" >"$out.svg"
cat "$out.txt"
