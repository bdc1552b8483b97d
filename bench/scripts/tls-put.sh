#!/usr/bin/env bash
# Put throughput, latency and the server's own CPU per put, over plaintext and over TLS, for
# etcd 3.4 and Keel, with the same load generator (keel-bench) and the same certificate.
#
# Usage: bench/scripts/tls-put.sh [KEEL_BIN] [KEEL_BENCH_BIN]
#   (defaults: target/release/keel and target/release/keel-bench; etcd from PATH)
# Environment: REPEATS (2), TOTAL puts per run (20000), CLIENTS (100), CONNS (10), VAL (256).
# Runs alternate etcd and Keel, plaintext and TLS, so drift in the machine's load hits all four.
set -euo pipefail
KEEL=${1:-target/release/keel}
BENCH=${2:-target/release/keel-bench}
REPEATS=${REPEATS:-2}
TOTAL=${TOTAL:-20000}
CLIENTS=${CLIENTS:-100}
CONNS=${CONNS:-10}
VAL=${VAL:-256}
work=$(mktemp -d /tmp/keel-tls-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1)
openssl req -x509 -nodes -days 2 "${ec[@]}" -keyout ca.key -out ca.pem -subj /CN=bench-ca 2>/dev/null
openssl req -new -nodes "${ec[@]}" -keyout server.key -out server.csr -subj /CN=s 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" > san.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.ext -out server.pem 2>/dev/null
cd - >/dev/null
tick=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
port=23790
echo "server scheme repeat puts_per_s p50_us p99_us server_cpu_s server_cpu_us_per_put"
for r in $(seq 1 "$REPEATS"); do
  for server in etcd keel; do
    for scheme in http https; do
      port=$((port + 2))
      url="$scheme://127.0.0.1:$port"
      data="$work/data-$server-$scheme-$r"
      tls=()
      [ "$scheme" = https ] && tls=(--cert-file "$work/server.pem" --key-file "$work/server.key")
      bin=etcd
      [ "$server" = keel ] && bin=$KEEL
      "$bin" --name b --data-dir "$data" --listen-client-urls "$url" --advertise-client-urls "$url" \
        --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
        --initial-cluster "b=http://127.0.0.1:$((port + 1))" "${tls[@]}" >"$data.log" 2>&1 &
      pid=$!
      ca=(--cacert "$work/ca.pem")
      for _ in $(seq 1 100); do
        "$BENCH" "${ca[@]}" --endpoints "$url" put --total 1 >/dev/null 2>&1 && break
        sleep 0.2
      done
      before=$(cpu_ticks "$pid")
      out=$("$BENCH" "${ca[@]}" --endpoints "$url" --clients "$CLIENTS" --conns "$CONNS" --json \
        put --total "$TOTAL" --val-size "$VAL" --key-space-size 100000)
      after=$(cpu_ticks "$pid")
      kill "$pid"; wait "$pid" 2>/dev/null || true
      OUT="$out" python3 - "$server" "$scheme" "$r" "$before" "$after" "$tick" "$TOTAL" <<'PY'
import json, os, sys
s = json.loads(os.environ["OUT"])
c = [c for c in s["classes"] if c["name"] == "put"][0]
server, scheme, r, before, after, tick, total = sys.argv[1:]
cpu_s = (int(after) - int(before)) / int(tick)
print(server, scheme, r, round(c["throughput_per_s"]), c["latency_us"]["p50"], c["latency_us"]["p99"],
      round(cpu_s, 2), round(cpu_s * 1e6 / c["total"], 1))
PY
    done
  done
done
