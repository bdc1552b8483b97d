//! The counters and histograms behind /metrics that are not per gRPC call: the raft facts the
//! member counts, the disk timings the raft core measures, and the peer transport's traffic.
//!
//! Everything is an atomic, updated with one relaxed add: the member and the raft core count
//! on their own core, and /metrics (on any shard) reads. Nothing here takes a lock except the
//! peer table, and that only when a peer first appears and when /metrics renders.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A Prometheus histogram over fixed bounds, in integer base units (nanoseconds for durations,
/// plain counts otherwise); rendered in the unit the metric's name says.
pub struct Histogram {
    /// Upper bounds, ascending, in base units.
    bounds: &'static [u64],
    /// `buckets[i]` counts observations <= `bounds[i]` and > `bounds[i - 1]` (not cumulative;
    /// rendering accumulates). The last one counts observations above every bound.
    buckets: Vec<AtomicU64>,
    sum: AtomicU64,
    /// Base units per rendered unit (1e9 for seconds from nanoseconds, 1 for counts).
    units_per_rendered: u64,
}

/// etcd's disk histograms (`etcd_disk_wal_fsync_duration_seconds`,
/// `etcd_disk_backend_commit_duration_seconds`): 1 ms doubling to 8.192 s, in nanoseconds.
pub const DISK_BUCKETS_NS: [u64; 14] = exponential::<14>(1_000_000);
/// etcd's `etcd_network_peer_round_trip_time_seconds`: 0.1 ms doubling to 3.2768 s.
pub const PEER_RTT_BUCKETS_NS: [u64; 16] = exponential::<16>(100_000);
/// go-grpc-prometheus's default `grpc_server_handling_seconds` buckets.
pub const GRPC_HANDLING_BUCKETS_NS: [u64; 11] = [
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];
/// Entries per WAL append (group commit), 1 doubling to 4096 (the raft core's batch limit).
pub const BATCH_ENTRIES_BUCKETS: [u64; 13] = exponential::<13>(1);

const NS_PER_S: u64 = 1_000_000_000;

const fn exponential<const N: usize>(start: u64) -> [u64; N] {
    let mut out = [0; N];
    let mut i = 0;
    let mut v = start;
    while i < N {
        out[i] = v;
        v *= 2;
        i += 1;
    }
    out
}

const _: () = assert!(
    DISK_BUCKETS_NS[13] == 8_192_000_000,
    "etcd's last disk bucket"
);
const _: () = assert!(
    PEER_RTT_BUCKETS_NS[15] == 3_276_800_000,
    "etcd's last RTT bucket"
);

impl Histogram {
    /// A histogram of durations, rendered in seconds.
    pub fn seconds(bounds_ns: &'static [u64]) -> Histogram {
        Histogram::new(bounds_ns, NS_PER_S)
    }

    /// A histogram of counts.
    pub fn counts(bounds: &'static [u64]) -> Histogram {
        Histogram::new(bounds, 1)
    }

    fn new(bounds: &'static [u64], units_per_rendered: u64) -> Histogram {
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "bounds ascend strictly"
        );
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            units_per_rendered,
        }
    }

    pub fn observe_duration(&self, elapsed: Duration) {
        assert_eq!(self.units_per_rendered, NS_PER_S, "a duration histogram");
        self.observe(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records one observation in base units.
    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines; `labels` (e.g. `To="a1"`) go before `le`.
    pub fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let scale = self.units_per_rendered as f64;
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            // Dividing by an exact power of ten rounds to the nearest double, so 0.001 prints
            // as "0.001" and 3.2768 as "3.2768", the way Go's client prints etcd's bounds.
            let le = match self.bounds.get(i) {
                Some(b) => format!("{}", *b as f64 / scale),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sum = self.sum.load(Ordering::Relaxed) as f64 / scale;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }

    /// Writes the whole metric: HELP, TYPE and the series.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }
}

/// What the member, the raft core and the peer transport count, published to the shards.
pub struct RaftStats {
    /// Times a new, different leader became known (etcd counts the same way).
    pub leader_changes_seen: AtomicU64,
    /// Client proposals that did not apply: refused by raft, timed out, cut off by a leader
    /// change or a stop.
    pub proposals_failed: AtomicU64,
    /// Client proposals taken into raft and not yet answered (a gauge).
    pub proposals_pending: AtomicU64,
    /// Batches of committed entries whose apply took longer than `SLOW_APPLY` (etcd warns
    /// and counts at 100 ms).
    pub slow_apply: AtomicU64,
    /// Heartbeats the leader could not hand to a peer's connection (queue full or peer down).
    pub heartbeat_send_failures: AtomicU64,
    /// Appends with entries a follower left unheard while its values waited for the disk
    /// (`Member::values_backlogged`); the leader sends them again.
    pub appends_deferred: AtomicU64,
    /// Linearizable reads whose ReadIndex round failed (timed out or refused).
    pub read_indexes_failed: AtomicU64,
    /// Keys put by applied writes (each Put, in a Txn or not).
    pub puts: AtomicU64,
    /// Keys deleted by applied writes (DeleteRange, lease revocation).
    pub deletes: AtomicU64,
    /// Live keys in the store (a gauge; counted at start, and taken from the restore's count
    /// when a snapshot replaces the store).
    pub keys: AtomicI64,
    /// The WAL append: Keel's one O_DIRECT write plus fdatasync per batch. etcd's series times
    /// the fsync alone; Keel's write goes straight to the device, so the two are one wait.
    pub wal_fsync: Histogram,
    /// What Keel measures under etcd's `etcd_disk_backend_commit_duration_seconds`: applying a
    /// batch of committed entries to the MVCC store. etcd's backend commit is the bbolt
    /// transaction commit that makes applied entries durable in its database; Keel's applied
    /// state is made durable by the WAL before apply and by checkpoints after, so the apply
    /// itself is the step that plays that role (and that a slow store would stretch).
    /// Checkpoint writes are timed separately, in `checkpoint`.
    pub backend_commit: Histogram,
    /// `keel_wal_batch_entries`: raft entries per WAL append (group commit).
    pub wal_batch_entries: Histogram,
    /// `keel_checkpoint_duration_seconds`: serializing and durably writing one checkpoint.
    pub checkpoint: Histogram,
}

impl std::fmt::Debug for RaftStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftStats").finish_non_exhaustive()
    }
}

/// etcd's threshold for a slow apply (`warnApplyDuration`).
pub const SLOW_APPLY: Duration = Duration::from_millis(100);

impl Default for RaftStats {
    fn default() -> Self {
        RaftStats {
            leader_changes_seen: AtomicU64::new(0),
            proposals_failed: AtomicU64::new(0),
            proposals_pending: AtomicU64::new(0),
            slow_apply: AtomicU64::new(0),
            heartbeat_send_failures: AtomicU64::new(0),
            appends_deferred: AtomicU64::new(0),
            read_indexes_failed: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            keys: AtomicI64::new(0),
            wal_fsync: Histogram::seconds(&DISK_BUCKETS_NS),
            backend_commit: Histogram::seconds(&DISK_BUCKETS_NS),
            wal_batch_entries: Histogram::counts(&BATCH_ENTRIES_BUCKETS),
            checkpoint: Histogram::seconds(&DISK_BUCKETS_NS),
        }
    }
}

impl RaftStats {
    pub fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// One peer's traffic as the transport saw it.
pub struct PeerStats {
    /// The peer's member id, in hex as etcd's `To`/`From` labels spell it.
    pub id: u64,
    pub sent_bytes: AtomicU64,
    pub received_bytes: AtomicU64,
    /// Frames that could not be handed to the peer's connection.
    pub sent_failures: AtomicU64,
    /// From a heartbeat sent to this peer to its response arriving (see `peer.rs`).
    pub round_trip: Histogram,
}

/// Every peer this member has talked to, in the order they appeared.
#[derive(Default)]
pub struct PeerTable {
    peers: Mutex<Vec<Arc<PeerStats>>>,
}

impl PeerTable {
    /// The peer's counters, made on first use (the only time this locks off a scrape).
    pub fn peer(&self, id: u64) -> Arc<PeerStats> {
        let mut peers = self
            .peers
            .lock()
            .expect("never poisoned: no panics while held");
        if let Some(p) = peers.iter().find(|p| p.id == id) {
            return p.clone();
        }
        let p = Arc::new(PeerStats {
            id,
            sent_bytes: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            sent_failures: AtomicU64::new(0),
            round_trip: Histogram::seconds(&PEER_RTT_BUCKETS_NS),
        });
        peers.push(p.clone());
        p
    }

    /// A copy of the table, for rendering.
    pub fn all(&self) -> Vec<Arc<PeerStats>> {
        self.peers
            .lock()
            .expect("never poisoned: no panics while held")
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_render_cumulatively_with_etcds_bounds() {
        let h = Histogram::seconds(&DISK_BUCKETS_NS);
        h.observe_duration(Duration::from_micros(500));
        h.observe_duration(Duration::from_millis(3));
        h.observe_duration(Duration::from_secs(10));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "help");
        assert!(out.contains("x_seconds_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.002\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.004\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"8.192\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_count 3\n"), "{out}");
        assert!(out.contains("x_seconds_sum 10.0035\n"), "{out}");
    }

    #[test]
    fn rtt_bounds_print_as_etcd_prints_them() {
        let h = Histogram::seconds(&PEER_RTT_BUCKETS_NS);
        let mut out = String::new();
        h.render_series(&mut out, "rtt", "To=\"a\"");
        assert!(
            out.contains("rtt_bucket{To=\"a\",le=\"0.0001\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("rtt_bucket{To=\"a\",le=\"3.2768\"} 0\n"),
            "{out}"
        );
        assert!(out.contains("rtt_count{To=\"a\"} 0\n"), "{out}");
    }

    #[test]
    fn a_value_on_a_bound_falls_in_that_bucket() {
        let h = Histogram::counts(&BATCH_ENTRIES_BUCKETS);
        h.observe(4);
        h.observe(5);
        let mut out = String::new();
        h.render_series(&mut out, "b", "");
        assert!(out.contains("b_bucket{le=\"4\"} 1\n"), "{out}");
        assert!(out.contains("b_bucket{le=\"8\"} 2\n"), "{out}");
    }
}
