# Sourced by the single-member benchmark scripts (load-rss.sh, range-rss.sh): one fresh member
# of `$server` (Keel or etcd, the same flags for both) on 127.0.0.1, with an 8 GiB quota
# (etcd's default 2 GiB would refuse a multi-GiB load).
#
# Reads: kind, server; PORT (24379), DATA_ROOT (a temp dir), EXTRA_ARGS (more server flags,
# space separated). Defines: url, data, log, pid, and start (launches it in the background),
# wait_ready_ms (prints the milliseconds until a linearizable get answers), rss (prints
# VmHWM, VmRSS, RssAnon and RssFile from /proc/PID/status, and LazyFree from smaps_rollup),
# and load_then_drop_page_cache (for the cold-read scripts, see below).
port=${PORT:-24379}
peer=$((port + 1))
root=${DATA_ROOT:-$(mktemp -d)}
data="$root/$kind.data"
log="$root/$kind.log"
rm -rf "$data"
url="http://127.0.0.1:$port"

args=(--name default --data-dir "$data"
  --listen-client-urls "$url" --advertise-client-urls "$url"
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer"
  --initial-cluster "default=http://127.0.0.1:$peer" --quota-backend-bytes 8589934592)
if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a extra <<<"$EXTRA_ARGS"; args+=("${extra[@]}"); fi

pid=
start() {
  "$server" "${args[@]}" >>"$log" 2>&1 &
  pid=$!
}
wait_ready_ms() {
  local t0 t1
  t0=$(date +%s%N)
  until ETCDCTL_API=3 etcdctl --endpoints "$url" --command-timeout=1s get probe >/dev/null 2>&1; do
    sleep 0.05
  done
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}
rss() {
  awk '/^(VmHWM|VmRSS|RssAnon|RssFile):/ {printf "%s %d MiB  ", $1, $2/1024}' "/proc/$pid/status"
  # Memory the allocator gave back with MADV_FREE: still counted in RSS until the kernel needs it.
  awk '/^LazyFree:/ {printf "%s %d MiB", $1, $2/1024}' "/proc/$pid/smaps_rollup" 2>/dev/null || true
  echo
}
# Loads $keys keys of 8 bytes with $value_bytes values through $bench (Keel writes their
# value-log segments with O_DIRECT), writes a 256-byte key "hot", then drops the page cache
# (root: /proc/sys/vm/drop_caches), so the loaded values' next reads go to the disk.
load_then_drop_page_cache() {
  echo "== $kind: loading $keys keys of $value_bytes bytes"
  "$bench" --endpoints "$url" --conns 10 --clients 100 \
    put --key-size 8 --val-size "$value_bytes" --key-space-size "$keys" --sequential-keys \
    --total "$keys" | grep -Ei "throughput" || true
  ETCDCTL_API=3 etcdctl --endpoints "$url" put hot "$(head -c 256 /dev/zero | tr '\0' h)" >/dev/null
  sleep 5
  sync
  echo 3 >/proc/sys/vm/drop_caches
  echo "page cache dropped; $(rss)"
}
