#!/usr/bin/env bash
# A member added to a loaded 3-member cluster (Keel or etcd, the same flags for both) on
# 127.0.0.1: loads TOTAL keys of 16 bytes with 1 KiB values, adds a fourth member with
# `etcdctl member add`, starts it on an empty data directory and reports the seconds until it
# holds every key (a serializable range's count on it), its peak RSS while catching up, the leader's
# peak RSS before and after, and the data directories' sizes. The log behind the leader is
# compacted long before, so the new member can only catch up from a snapshot.
#
#   bench/scripts/add-member.sh keel path/to/keel path/to/keel-bench
#   bench/scripts/add-member.sh etcd etcd path/to/keel-bench
#
# TOTAL (default 1000000), CLIENTS (100), CONNS (10), PORT (25000), DATA_ROOT (a temp dir),
# EXTRA_ARGS (more server flags, space separated). Keel's members pin their raft cores to
# CPU i % CPUs (as deploy/local-cluster.sh does); etcd has no such flag.
set -euo pipefail

kind=$1
server=$2
bench=$3
total=${TOTAL:-1000000}
clients=${CLIENTS:-100}
conns=${CONNS:-10}
port=${PORT:-25000}
root=${DATA_ROOT:-$(mktemp -d)}
# The CPUs this shell may run on, by number: a taskset or cpuset need not start at CPU 0.
cpus=()
for range in $(awk '/^Cpus_allowed_list/ { gsub(",", " ", $2); print $2 }' /proc/self/status); do
  cpus+=($(seq "${range%-*}" "${range#*-}"))
done
extra=()
if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a extra <<<"$EXTRA_ARGS"; fi

client_url() { echo "http://127.0.0.1:$((port + 2 * $1))"; }
peer_url() { echo "http://127.0.0.1:$((port + 2 * $1 + 1))"; }
initial=""
for i in 0 1 2; do initial+="${initial:+,}n$i=$(peer_url "$i")"; done
eps="$(client_url 0),$(client_url 1),$(client_url 2)"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# start I STATE CLUSTER: member nI in the background, its pid appended to pids.
start() {
  local i=$1 state=$2 cluster=$3 placement=()
  [ "$kind" = keel ] && placement=(--raft-cpu "${cpus[i % ${#cpus[@]}]}")
  rm -rf "$root/$kind-n$i"
  "$server" --name "n$i" --data-dir "$root/$kind-n$i" \
    --listen-client-urls "$(client_url "$i")" --advertise-client-urls "$(client_url "$i")" \
    --listen-peer-urls "$(peer_url "$i")" --initial-advertise-peer-urls "$(peer_url "$i")" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" \
    --quota-backend-bytes 8589934592 "${placement[@]}" "${extra[@]}" \
    >>"$root/$kind-n$i.log" 2>&1 &
  pids+=("$!")
}
hwm_mib() { awk '/^VmHWM:/ {printf "%d", $2 / 1024}' "/proc/$1/status"; }
# VmHWM, VmRSS and its anonymous and file-backed parts, in MiB.
rss() { awk '/^(VmHWM|VmRSS|RssAnon|RssFile):/ {printf "%s %d MiB  ", $1, $2 / 1024}' "/proc/$1/status"; }
count_on() {
  ETCDCTL_API=3 etcdctl --endpoints "$(client_url "$1")" --command-timeout=30s \
    get "" --prefix --limit=1 --consistency=s -w json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("count", 0))' 2>/dev/null || echo 0
}

for i in 0 1 2; do start "$i" new "$initial"; done
# Each member must know the leader before the load: one that started late answers "no leader"
# until the leader's first heartbeat reaches it.
for i in 0 1 2; do
  until ETCDCTL_API=3 etcdctl --endpoints "$(client_url "$i")" --command-timeout=1s put probe 1 >/dev/null 2>&1; do
    sleep 0.2
  done
done
echo "== $kind: loading $total keys of 1 KiB into 3 members"
"$bench" --endpoints "$eps" --conns "$conns" --clients "$clients" \
  put --key-size 16 --val-size 1024 --key-space-size "$total" --sequential-keys --total "$total"
expected=$(count_on 0)
[ "$expected" -gt "$total" ] || { echo "cannot count the keys on n0 ($expected)"; exit 1; }
leader=$(ETCDCTL_API=3 etcdctl --endpoints "$eps" endpoint status -w json |
  python3 -c 'import json,sys; s=json.load(sys.stdin); print([i for i,e in enumerate(s) if e["Status"]["leader"]==e["Status"]["header"]["member_id"]][0])')
leader_pid=${pids[$leader]}
sleep 20
echo "keys: $expected; leader n$leader after the load: $(rss "$leader_pid")"
echo "data dir of n$leader: $(du -sh "$root/$kind-n$leader" | cut -f1)"

ETCDCTL_API=3 etcdctl --endpoints "$(client_url "$leader")" member add n3 --peer-urls "$(peer_url 3)" >/dev/null
t0=$(date +%s%N)
start 3 existing "$initial,n3=$(peer_url 3)"
new_pid=${pids[3]}
peak=0
while :; do
  now=$(count_on 3)
  hwm=$(hwm_mib "$new_pid" 2>/dev/null || echo 0)
  [ "$hwm" -gt "$peak" ] && peak=$hwm
  [ "$now" -ge "$expected" ] && break
  kill -0 "$new_pid" 2>/dev/null || { echo "the new member exited; see $root/$kind-n3.log"; exit 1; }
  sleep 1
done
t1=$(date +%s%N)
echo "new member holds all $expected keys after $(((t1 - t0) / 1000000)) ms"
echo "new member: $(rss "$new_pid"); data dir $(du -sh "$root/$kind-n3" | cut -f1)"
echo "leader n$leader after sending: $(rss "$leader_pid")"
sleep 20
echo "new member 20 s later: $(rss "$new_pid")"
