#!/usr/bin/env bash
# One DeleteRange of about a million keys, on a 3-member cluster on this machine (deploy/
# local-cluster.sh for Keel, the same ports and flags for etcd 3.4), or on one member:
#   1. load TOTAL keys (16-byte keys, VAL_SIZE-byte values) through the leader with keel-bench;
#   2. `etcdctl del` of all of them (cluster) or of about half (single: keel-bench's keys are
#      Go varints, so [0x80, 0xc0) holds every key i >= 64 with i mod 64 < 32), timed around
#      etcdctl;
#   3. leader changes seen by each member before and after (etcd_server_leader_changes_seen_total),
#      the longest apply each member timed (etcd_disk_backend_commit_duration_seconds: applies
#      over 0.512 s), and the server's slow-apply and stalled-loop warnings.
#
#   bench/scripts/mass-delete.sh cluster keel target/release/keel target/release/keel-bench
#   bench/scripts/mass-delete.sh cluster etcd etcd target/release/keel-bench
#   bench/scripts/mass-delete.sh single keel target/release/keel target/release/keel-bench
#   IN_TXN=1 bench/scripts/mass-delete.sh cluster keel target/release/keel target/release/keel-bench
#   REVOKE=1 bench/scripts/mass-delete.sh cluster keel target/release/keel target/release/keel-bench
#
# TOTAL (1000000 for a cluster, 2000000 single), VAL_SIZE (16 cluster, 256 single), DATA_ROOT
# (a temp dir under /work), IN_TXN=1 (the same delete as the one op of an `etcdctl txn`
# without compares), REVOKE=1 (every key loaded is attached to one lease, and step 2 is
# `etcdctl lease revoke` of it instead). The cluster uses client ports 2379, 22379 and 32379.
set -euo pipefail

mode=$1
kind=$2
server=$3
bench=$4
if [[ $mode == cluster ]]; then total=${TOTAL:-1000000}; val=${VAL_SIZE:-16}; else total=${TOTAL:-2000000}; val=${VAL_SIZE:-256}; fi
root=${DATA_ROOT:-$(mktemp -d /work/mass-delete.XXXX)}
mkdir -p "$root"
here="$(cd "$(dirname "$0")/../.." && pwd)"
pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT

ports=(2379 22379 32379)
if [[ $mode == cluster ]]; then
  if [[ $kind == keel ]]; then
    KEEL="$server" setsid "$here/deploy/local-cluster.sh" "$root/c" >"$root/cluster.log" 2>&1 &
    pids+=("$!")
    logs=("$root/c/n1.log" "$root/c/n2.log" "$root/c/n3.log")
  else
    cl="n1=http://127.0.0.1:2380,n2=http://127.0.0.1:22380,n3=http://127.0.0.1:32380"
    logs=()
    for i in 1 2 3; do
      c=${ports[i-1]}; p=$((c + 1))
      "$server" --name "n$i" --data-dir "$root/n$i" --listen-client-urls "http://127.0.0.1:$c" \
        --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p" \
        --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "$cl" \
        --initial-cluster-token mass-delete --initial-cluster-state new \
        --quota-backend-bytes 8589934592 >"$root/n$i.log" 2>&1 &
      pids+=("$!"); logs+=("$root/n$i.log")
    done
  fi
else
  ports=(24600)
  "$server" --data-dir "$root/data" --listen-client-urls http://127.0.0.1:24600 \
    --advertise-client-urls http://127.0.0.1:24600 --listen-peer-urls http://127.0.0.1:24601 \
    --quota-backend-bytes 8589934592 >"$root/server.log" 2>&1 &
  pids+=("$!"); logs=("$root/server.log")
fi

endpoints=$(printf '127.0.0.1:%s,' "${ports[@]}"); endpoints=${endpoints%,}
leader=""
until [[ -n $leader ]]; do
  sleep 0.5
  leader=$(ETCDCTL_API=3 etcdctl --endpoints "$endpoints" endpoint status 2>/dev/null \
    | awk -F', ' '$5 == "true" { print $1 }' | head -1)
done
echo "leader: $leader"
changes() {
  for p in "${ports[@]}"; do
    curl -s "127.0.0.1:$p/metrics" | awk -v p="$p" '
      /^etcd_server_leader_changes_seen_total / { c = $2 }
      /^etcd_disk_backend_commit_duration_seconds_bucket\{le="0.512"\} / { w = $2 }
      /^etcd_disk_backend_commit_duration_seconds_count / { n = $2 }
      END { printf "  %s: leader changes %s, applies over 0.512 s %d\n", p, c, n - w }'
  done
}
lease_args=()
if [[ ${REVOKE:-0} == 1 ]]; then
  lease=$(ETCDCTL_API=3 etcdctl --endpoints "$leader" lease grant 86400 | awk '{ print $2 }')
  lease_args=(--lease "0x$lease")
  echo "lease: $lease"
fi
"$bench" --endpoints "$leader" --conns 10 --clients 200 put --key-size 16 --val-size "$val" \
  --key-space-size "$total" --sequential-keys --total "$total" "${lease_args[@]}" | tail -3
sleep 2
echo "before the delete:"; changes
if [[ $mode == cluster ]]; then range=("" --from-key); else range=($'\x80' $'\xc0'); fi
# etcdctl txn reads its ops as lines, unquoting Go-quoted arguments: every key is >= "\x00".
if [[ $mode == cluster ]]; then txn_op='del "\x00" --from-key'; else txn_op='del "\x80" "\xc0"'; fi
t0=$(date +%s%N)
if [[ ${REVOKE:-0} == 1 ]]; then
  out=$(ETCDCTL_API=3 etcdctl --endpoints "$leader" --command-timeout=120s lease revoke "$lease" 2>&1 || true)
elif [[ ${IN_TXN:-0} == 1 ]]; then
  out=$(printf '\n%s\n\n\n' "$txn_op" | ETCDCTL_API=3 etcdctl --endpoints "$leader" \
    --command-timeout=120s txn -w json 2>&1 | grep -o '"deleted":[0-9]*\|Error.*' || true)
else
  out=$(ETCDCTL_API=3 etcdctl --endpoints "$leader" --command-timeout=120s del "${range[@]}" 2>&1 || true)
fi
t1=$(date +%s%N)
what=del; [[ ${IN_TXN:-0} == 1 ]] && what=txn; [[ ${REVOKE:-0} == 1 ]] && what=revoke
echo "$what answered in $(( (t1 - t0) / 1000000 )) ms: $out"
sleep 3
echo "after the delete:"; changes
# etcdctl 3.4 has no --count-only: a limit of 1 still answers the range's count (its JSON
# leaves a count of 0 out).
json=$(ETCDCTL_API=3 etcdctl --endpoints "$leader" get "" --from-key --limit 1 -w json 2>&1 || true)
if [[ $json == *'"header"'* ]]; then
  left=$(grep -o '"count":[0-9]*' <<<"$json" | cut -d: -f2 || true)
  echo "  keys left: ${left:-0}"
else
  echo "  keys left: unknown ($json)"
fi
for log in "${logs[@]}"; do
  grep -h -o -E 'apply request took too long[^}]*|the raft loop has not turned[^}]*|took too long \([^)]*\) to execute|became (pre-)?candidate[^"]*' "$log" \
    | sed "s|^|  $(basename "$log"): |" | head -5 || true
done
