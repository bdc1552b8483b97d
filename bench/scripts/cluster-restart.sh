#!/usr/bin/env bash
# A follower of a loaded 3-member cluster killed with `kill -9` and restarted: milliseconds
# until it answers a linearizable get again. Starts three members of Keel or etcd on
# 127.0.0.1 (the same flags for both; Keel's raft cores spread over the CPUs), loads TOTAL
# keys of 16 bytes with 1 KiB values through all three, waits SETTLE_S, kills a member that
# does not lead, restarts it on its data directory and times it, then prints what the
# restarted member's log says it replayed (Keel).
#
# With LAG_TOTAL set, that many more keys are written through the two members left while the
# follower is down: more than a checkpoint's 100,000 entries, and its leader no longer holds
# the entries it missed, so it comes back through a snapshot, which it stores under segment
# ids above its own. The log lines of that install are printed too.
#
#   bench/scripts/cluster-restart.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/cluster-restart.sh etcd etcd path/to/keel-bench
#
# TOTAL (1000000), LAG_TOTAL (0), SETTLE_S (10), BACK_TIMEOUT_S (600: how long the restarted
# follower may take to answer before the script fails), PORT (25000), DATA_ROOT (a temp dir).
set -euo pipefail
kind=$1
bin=$2
bench=$3
total=${TOTAL:-1000000}
port=${PORT:-25000}
root=${DATA_ROOT:-$(mktemp -d)}
mkdir -p "$root"
# The CPUs this shell may run on, by number: a taskset or cpuset need not start at CPU 0.
cpus=()
for range in $(awk '/^Cpus_allowed_list/ { gsub(",", " ", $2); print $2 }' /proc/self/status); do
  cpus+=($(seq "${range%-*}" "${range#*-}"))
done
cluster=""
eps=""
for i in 0 1 2; do
  cluster+="${cluster:+,}n$i=http://127.0.0.1:$((port + 2 * i + 1))"
  eps+="${eps:+,}127.0.0.1:$((port + 2 * i))"
done
pids=(0 0 0)
start_member() {
  local i=$1 client="http://127.0.0.1:$((port + 2 * $1))" peer="http://127.0.0.1:$((port + 2 * $1 + 1))"
  local extra=()
  [ "$kind" = keel ] && extra+=(--raft-cpu "${cpus[i % ${#cpus[@]}]}")
  "$bin" --name "n$i" --data-dir "$root/$kind-n$i" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    --quota-backend-bytes 8589934592 "${extra[@]}" >>"$root/$kind-n$i.log" 2>&1 &
  pids[$i]=$!
}
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root/$kind-n0" "$root/$kind-n1" "$root/$kind-n2"
}
trap cleanup EXIT
rm -rf "$root/$kind-n0" "$root/$kind-n1" "$root/$kind-n2" "$root"/"$kind"-n?.log
for i in 0 1 2; do start_member "$i"; done
until ETCDCTL_API=3 etcdctl --endpoints "$eps" --command-timeout=1s get probe >/dev/null 2>&1; do
  sleep 0.1
done
echo "== $kind: loading $total keys of 1 KiB into three members"
"$bench" --endpoints "$eps" --conns 30 --clients 300 put --key-size 16 --val-size 1024 \
  --key-space-size "$total" --sequential-keys --total "$total" | grep -E '^  put|latency' || true
sleep "${SETTLE_S:-10}"
victim=
for i in 0 1 2; do
  ep="127.0.0.1:$((port + 2 * i))"
  is_leader=$(ETCDCTL_API=3 etcdctl --endpoints "$ep" endpoint status -w json |
    python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; print(int(s["leader"] == s["header"]["member_id"]))')
  if [ "$is_leader" = 0 ]; then victim=$i; break; fi
done
echo "kill -9 of follower n$victim"
kill -9 "${pids[$victim]}"
wait "${pids[$victim]}" 2>/dev/null || true
lag=${LAG_TOTAL:-0}
if [ "$lag" -gt 0 ]; then
  left=""
  for i in 0 1 2; do
    [ "$i" = "$victim" ] || left+="${left:+,}127.0.0.1:$((port + 2 * i))"
  done
  echo "== writing $lag more keys while n$victim is down"
  "$bench" --endpoints "$left" --conns 20 --clients 200 put --key-size 16 --val-size 1024 \
    --key-space-size "$total" --sequential-keys --total "$lag" | grep -E '^  put|latency' || true
  sleep "${SETTLE_S:-10}"
fi
# The victim's log goes on from its first run: only what comes after this offset is the
# restarted member's.
log="$root/$kind-n$victim.log"
log_from=$(($(wc -c <"$log") + 1))
since_restart() { tail -c "+$log_from" "$log"; }
t0=$(date +%s%N)
start_member "$victim"
ep="127.0.0.1:$((port + 2 * victim))"
deadline=$((SECONDS + ${BACK_TIMEOUT_S:-600}))
until ETCDCTL_API=3 etcdctl --endpoints "$ep" --command-timeout=1s get probe >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "$kind: n$victim did not answer within ${BACK_TIMEOUT_S:-600} s of its restart; its log:" >&2
    since_restart | grep -E 'WARN|ERROR' | tail -5 | cut -c1-300 >&2 || true
    exit 1
  fi
  sleep 0.05
done
t1=$(date +%s%N)
echo "$kind: follower back (linearizable get) $(((t1 - t0) / 1000000)) ms after its restart"
since_restart | grep -E 'recovered raft log|restored|opened the data directory|ready to serve' | tail -4 | cut -c1-300 || true
if [ "$lag" -gt 0 ]; then
  # The install may finish after the first answer: wait for it, then show its lines.
  installed=
  for _ in $(seq 1 600); do
    if since_restart | grep -q "installed the leader's snapshot"; then installed=1; break; fi
    sleep 0.1
  done
  t2=$(date +%s%N)
  if [ -z "$installed" ]; then
    echo "$kind: no snapshot installed within 60 s of the answer" >&2
    exit 1
  fi
  echo "$kind: snapshot installed by $(((t2 - t0) / 1000000)) ms after the restart (polled)"
  # The watchdog logs a stall at its first look past the election timeout (it looks every
  # 250 ms), so its stalled_ms is a lower bound of the loop's wait, not the whole of it.
  since_restart | grep -E "stored the leader's snapshot|installed the leader's snapshot|replaced the store|stall" |
    tail -7 | cut -c1-400 || true
  # Page faults since its restart (major: read from disk) and its peak memory.
  stat="/proc/${pids[$victim]}/stat"
  if [ -r "$stat" ] && grep -q VmHWM "/proc/${pids[$victim]}/status" 2>/dev/null; then
    awk '{print "faults since the restart: minor " $10 ", major " $12}' "$stat"
    grep VmHWM "/proc/${pids[$victim]}/status"
  else
    echo "n$victim is gone"
  fi
fi
