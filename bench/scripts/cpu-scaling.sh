#!/usr/bin/env bash
# Thread-per-core scaling: `keel-bench compare` (etcd 3.4 against Keel, alternately, server CPU
# per request) with the servers confined to the first N CPUs and the load generator to the
# others, for several N and `--shards` choices. It answers issue #15's placement questions
# (how many shards for 2, 4 and 16 cores, and whether a shard on the raft core's CPU helps)
# on a machine with enough cores to keep the client off the servers' CPUs.
#
#   bench/scripts/cpu-scaling.sh KEEL KEEL_BENCH ETCD WORK_DIR OUT_DIR CONFIG...
#
# Each CONFIG is `label:server_cpus:shards:repeats`:
#   - server_cpus: N confines both servers to CPUs 0..N-1 (etcd with GOMAXPROCS=N) and the
#     client to CPUs N.. ; `all` pins nothing (the machine's defaults, client beside servers);
#   - shards: Keel's `--shards` (0 = its default, one per CPU it may run on). Keel pins by CPU
#     number, so the servers' CPUs start at 0 and its default raft CPU (the last it may use)
#     is N-1.
# Totals are small enough that one config takes about a minute per repeat on 16 cores; set
# COMPARE_ARGS to change them. Writes OUT_DIR/LABEL.json (compare's JSON) and the human
# summaries to stdout.
set -euo pipefail
keel=$(realpath "$1")
bench=$(realpath "$2")
etcd=$(realpath "$3")
work=$4
out=$5
shift 5
mkdir -p "$work" "$out"
cpus=$(nproc --all)
default_args=(--put-total 100000 --range-total 100000 --txn-put-total 50000
  --keepalive-total 50000 --mem-keys 20000 --latency-total 500 --watch-puts 20
  --watch-put-rate 20 --floor-ops 200)
if [ -n "${COMPARE_ARGS:-}" ]; then read -r -a default_args <<<"$COMPARE_ARGS"; fi
for config in "$@"; do
  IFS=: read -r label server_cpus shards repeats <<<"$config"
  wrappers=$(mktemp -d)
  shard_flag=()
  if [ "$shards" != 0 ]; then shard_flag=(--shards "$shards"); fi
  if [ "$server_cpus" = all ]; then
    server_pin=()
    client_pin=()
    procs=$cpus
  else
    server_pin=(taskset -c "0-$((server_cpus - 1))")
    client_pin=(taskset -c "$server_cpus-$((cpus - 1))")
    procs=$server_cpus
  fi
  # `exec` all the way down, so the PID compare reads /proc/PID/stat of is the server's own.
  printf '#!/bin/sh\nexec %s %s "$@" %s\n' "${server_pin[*]}" "$keel" "${shard_flag[*]}" \
    >"$wrappers/keel"
  printf '#!/bin/sh\nGOMAXPROCS=%s exec %s %s "$@"\n' "$procs" "${server_pin[*]}" "$etcd" \
    >"$wrappers/etcd"
  chmod +x "$wrappers/keel" "$wrappers/etcd"
  echo "=== $label: server CPUs ${server_cpus}, keel shards ${shards}, repeats ${repeats}" \
    "($(date -u +%H:%M:%S))"
  mkdir -p "$work/$label"
  "${client_pin[@]}" "$bench" compare --etcd-bin "$wrappers/etcd" --keel-bin "$wrappers/keel" \
    --repeats "$repeats" "${default_args[@]}" --work-dir "$work/$label" \
    --out "$work/$label" 2>&1 | grep -v '^watch-latency:' || true
  cp "$work/$label/compare.json" "$out/$label.json" 2>/dev/null || echo "$label: no result"
  rm -rf "$wrappers" "${work:?}/$label"
done
