//! Every size limit a request meets on its way to disk, derived from one place:
//! `--max-request-bytes`.
//!
//! A client request is one gRPC message (at most `grpc_recv_bytes_max`; through the JSON
//! gateway, an HTTP body of at most `http_body_bytes_max` decoded to one), which the shard turns
//! into one marshalled `InternalRaftRequest` (at most `request_bytes_max`, measured as etcd
//! measures it). That becomes one raft entry (at most `entry_bytes_max` encoded), which is one
//! WAL record (the WAL takes records up to `wal_record_bytes_max`) and rides in raft append
//! messages (at least one entry each, otherwise at most `raft_msg_bytes_max` of entries) inside
//! one peer frame (at most `peer_frame_bytes_max`). `Limits::assert_nested` checks at startup
//! that each fits in the next, so nothing a shard accepted can be refused further down: a
//! refusal there would stop the raft core with a write half done. A raft snapshot, whatever
//! its size, goes as chunks of `SNAPSHOT_CHUNK_BYTES`, each in one peer frame.

use keel_io::WalConfig;

use crate::config::{Config, GRPC_RECV_SLACK_BYTES};

/// Bytes the raft entry encoding adds around its data (type, term, index, length: 25 bytes in
/// keel-raft's codec), rounded up generously; a unit test checks the real encoding fits.
pub const ENTRY_ENVELOPE_BYTES: usize = 64;
/// Bytes a peer frame adds around one raft message's entries (frame length, message header,
/// per-entry lengths), rounded up generously: a raft message holds at most
/// `RAFT_MSG_ENTRIES_ENVELOPE_MAX` entries' worth of headers beyond this.
pub const PEER_MSG_ENVELOPE_BYTES: usize = 64 * 1024;
/// The soft size of one raft append message (entries beyond the first stop here). Raft always
/// sends at least one entry, so the largest message is the larger of this and one entry.
pub const RAFT_MSG_BYTES_TARGET: u64 = 1 << 20;
/// The WAL batch size when no request needs more: one aligned write of up to 1 MiB.
pub const WAL_BATCH_BYTES_DEFAULT: usize = 1 << 20;
/// The bytes of one chunk of a raft snapshot (`peer_snapshot.rs`): a snapshot of any size
/// travels as frames of at most this plus its header, so a peer frame's limit is a message's,
/// never a snapshot's.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Uncommitted entry bytes a leader holds before it drops proposals ("too many requests").
pub const RAFT_UNCOMMITTED_BYTES_MAX: u64 = 128 << 20;
/// Watch events the entries applied from one Ready hand the shards' watch hubs
/// (`Writer::apply_bounded`). Only a DeleteRange or a lease revoke of many keys writes more
/// (a txn holds at most `--max-txn-ops` ops, 128 by default). Past it the entries' events are
/// not gathered and every hub's watchers read them from history on their own shards:
/// gathering 2M events of a mass delete took the raft core as long as the delete itself and
/// 600 MB. The cost moves to the watchers whose range covers the delete: each reads and
/// encodes the revision's events on its shard (one revision is never split, as etcd does not
/// split one without `fragment`), where the raft core had encoded them once for all.
pub const WATCH_EVENTS_PER_APPLY_MAX: usize = 65_536;
/// Keys one step of a DeleteRange, a lease revoke or a txn that walks a range (compares,
/// reads or deletes one), applied in steps, visits (`Writer::apply_in_steps`; a txn's other
/// ops count one each); the raft core's loop turns between steps, so heartbeats and votes go
/// on. One apply of a million deletes took 1.2-1.5 s, past an election timeout, and cost a
/// 3-member cluster its leader (a txn's read of a million keys 0.4-0.5 s, its compare of
/// them 0.3 s); a step of this many keys takes 10-30 ms.
pub const APPLY_KEYS_PER_STEP: usize = 16_384;
/// Index entries a shard's range walks in one step before it lets others run
/// (`kv::Reader::range_steps`, `rt::let_others_run`). A count of a million keys took 0.2-0.3
/// s walked in one go, and every other call on the shard (on a shard hosted by the raft core,
/// every write) waited for all of it (BENCHMARKS.md, "A long walk beside one client's
/// puts"). A step of this many keys takes about 60 µs of CPU (a count of a million keys,
/// 3,906 steps, took 220-240 ms); each link of a put's chain of
/// wake-ups that lands behind the walk waits for one, so one client's puts beside such counts
/// kept a p99 of 2.5-4.7 ms (1,024 keys a step: 8-19 ms). The steps cost a count of a million
/// keys 5-18 % more of the server's CPU than one walk, counted in 10 ms ticks
/// (BENCHMARKS.md, "Long walks in steps").
pub const READ_KEYS_PER_STEP: usize = 256;
/// Key-values a range's filters and sort handle in the shard's executor once its walk ended
/// (`service::range_walked_finish`); more go to the shard's blocking pool, or a hosted shard's
/// helper thread, as etcd sorts in memory on a goroutine the Go scheduler preempts. Measured
/// in-process (`cargo bench -p keel-kv --bench mvcc -- count`, BENCHMARKS.md "Long walks in
/// steps"): a range of this many keys sorted by modification revision took 3.2 ms in all
/// (a count of them, which copies no key-value, 0.5 ms), one of a million 290 ms (their count
/// 42 ms). On a hosted shard those sorts queue, one at a time, on the one helper thread that
/// also signs tokens and captures snapshots (`rt::blocking`); on a shard thread, on its
/// executor's pool, which shares its CPU.
pub const READ_SORT_ON_SHARD_KVS_MAX: usize = 16_384;
/// Pager rounds an entry that reads values whose pages are out waits for before it is
/// applied (`MemberConfig::values_resident`). Pages brought in can be evicted again before the
/// apply reads them (memory pressure, the value cache): residency is asked again after each
/// round, and past this many the apply faults them in on the raft core rather than wait on.
pub const APPLY_PAGER_ROUNDS_MAX: u32 = 3;
/// Value-log bytes sealed and not yet durable above which a member takes no new writes (a
/// leader no proposals, a follower no appended entries): bounds the memory that values
/// waiting for the disk hold.
pub const SEALED_BACKLOG_BYTES_MAX: u64 = 64 << 20;

/// Test-only: shrinks the WAL's record limit below the entry limit, so a test can make the raft
/// core fail on an accepted request and watch the member stop loudly. Never set in production:
/// startup then skips the nesting assertion and logs a warning.
pub const TEST_WAL_RECORD_BYTES_ENV: &str = "KEEL_TEST_WAL_RECORD_BYTES_MAX";

/// The derived limits. Built once from the configuration; every user reads them from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The largest marshalled `InternalRaftRequest` a client may propose (etcd's
    /// `--max-request-bytes`); beyond it, "etcdserver: request is too large".
    pub request_bytes_max: usize,
    /// The largest gRPC message a shard receives (etcd: max-request-bytes plus 512 KiB).
    pub grpc_recv_bytes_max: usize,
    /// The largest HTTP request body the client port reads: a JSON gateway call holding a
    /// message up to `grpc_recv_bytes_max` (its bytes fields base64, 4/3 of their size, plus
    /// JSON's names and quotes; twice the message is ample). The gateway then measures the
    /// decoded message against `grpc_recv_bytes_max`, as etcd's gRPC server does.
    pub http_body_bytes_max: usize,
    /// The largest encoded raft entry holding one request.
    pub entry_bytes_max: usize,
    /// Raft's limit on the entry bytes of one append message: soft for batching (at least one
    /// entry goes), hard for one entry (keel-raft drops a proposal larger than it).
    pub raft_msg_bytes_max: u64,
    /// Raft's limit on uncommitted entry bytes on the leader.
    pub raft_uncommitted_bytes_max: u64,
    /// The WAL's configuration: its batch limit bounds the largest record.
    pub wal: WalConfig,
    /// The largest frame a peer accepts.
    pub peer_frame_bytes_max: usize,
    /// Set only by the test knob: the nesting is deliberately broken.
    pub forced_disagreement: bool,
}

impl Limits {
    /// Derives every limit from the configuration (and the test-only knob, when set).
    pub fn new(config: &Config) -> Limits {
        let request_bytes_max = config.max_request_bytes as usize;
        let entry_bytes_max = request_bytes_max + ENTRY_ENVELOPE_BYTES;
        // A batch must hold one whole record of the largest entry; records are framed and the
        // batch is written block-aligned, so round up to whole 4 KiB blocks.
        let batch_bytes_for_entry =
            (entry_bytes_max + keel_io::frame::FRAME_HEADER_BYTES).next_multiple_of(4096);
        let batch_bytes_max = WAL_BATCH_BYTES_DEFAULT.max(batch_bytes_for_entry);
        let defaults = WalConfig::default();
        let mut wal = WalConfig {
            batch_bytes_max,
            // A segment holds at least one whole batch (plus its header), or rotation could not
            // make progress; very large requests make segments larger.
            segment_bytes: defaults
                .segment_bytes
                .max((batch_bytes_max as u64 + 64 * 1024).next_multiple_of(1 << 20)),
            ..defaults
        };
        let mut forced_disagreement = false;
        if let Some(record_max) = std::env::var(TEST_WAL_RECORD_BYTES_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            wal.batch_bytes_max = (record_max + keel_io::frame::FRAME_HEADER_BYTES).max(4096);
            forced_disagreement = true;
        }
        // keel-raft refuses an entry larger than one message: the message limit is at least one
        // largest entry.
        let raft_msg_bytes_max = RAFT_MSG_BYTES_TARGET.max(entry_bytes_max as u64);
        let largest_msg_bytes = raft_msg_bytes_max as usize;
        Limits {
            request_bytes_max,
            grpc_recv_bytes_max: request_bytes_max + GRPC_RECV_SLACK_BYTES as usize,
            http_body_bytes_max: 2 * (request_bytes_max + GRPC_RECV_SLACK_BYTES as usize),
            entry_bytes_max,
            raft_msg_bytes_max,
            raft_uncommitted_bytes_max: RAFT_UNCOMMITTED_BYTES_MAX.max(4 * entry_bytes_max as u64),
            wal,
            peer_frame_bytes_max: largest_msg_bytes + PEER_MSG_ENVELOPE_BYTES,
            forced_disagreement,
        }
    }

    /// Panics unless every limit holds the one before it (a configuration bug, caught at start
    /// rather than as a raft core that stops on the first large write).
    pub fn assert_nested(&self) {
        if self.forced_disagreement {
            tracing::warn!(
                knob = TEST_WAL_RECORD_BYTES_ENV,
                wal_record_bytes_max = self.wal.record_payload_bytes_max(),
                entry_bytes_max = self.entry_bytes_max,
                "TEST ONLY: the WAL record limit is forced below the entry limit"
            );
            return;
        }
        assert!(
            self.grpc_recv_bytes_max >= self.request_bytes_max,
            "a gRPC message must hold the largest request"
        );
        assert!(
            self.http_body_bytes_max >= self.grpc_recv_bytes_max,
            "a gateway call's JSON body must hold the largest gRPC message"
        );
        assert!(
            self.entry_bytes_max >= self.request_bytes_max + ENTRY_ENVELOPE_BYTES,
            "a raft entry must hold the largest request plus its envelope"
        );
        assert!(
            self.wal.record_payload_bytes_max() >= self.entry_bytes_max,
            "a WAL record ({} bytes) must hold the largest raft entry ({} bytes)",
            self.wal.record_payload_bytes_max(),
            self.entry_bytes_max
        );
        assert!(
            self.raft_msg_bytes_max >= self.entry_bytes_max as u64,
            "a raft message must hold the largest entry"
        );
        assert!(
            self.raft_uncommitted_bytes_max >= self.entry_bytes_max as u64,
            "raft must accept at least one largest entry uncommitted"
        );
        let largest_msg_bytes = self.raft_msg_bytes_max as usize;
        assert!(
            self.peer_frame_bytes_max >= largest_msg_bytes + PEER_MSG_ENVELOPE_BYTES,
            "a peer frame must hold the largest raft append message"
        );
        assert!(
            self.peer_frame_bytes_max
                >= SNAPSHOT_CHUNK_BYTES + 1 + crate::peer_snapshot::CHUNK_HEADER_BYTES,
            "a peer frame must hold one snapshot chunk"
        );
        assert!(
            self.peer_frame_bytes_max < u32::MAX as usize,
            "peer frames carry a u32 length"
        );
        self.wal.assert_valid();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Flags};
    use clap::Parser;

    fn config(args: &[&str]) -> Config {
        let mut all = vec!["keel"];
        all.extend_from_slice(args);
        Config::from_flags(Flags::try_parse_from(all).expect("flags parse")).expect("valid")
    }

    #[test]
    fn defaults_nest() {
        let limits = Limits::new(&config(&[]));
        limits.assert_nested();
        assert_eq!(limits.request_bytes_max, 1_572_864);
        assert_eq!(limits.grpc_recv_bytes_max, 1_572_864 + 512 * 1024);
        assert_eq!(limits.http_body_bytes_max, 2 * (1_572_864 + 512 * 1024));
        assert!(limits.wal.record_payload_bytes_max() >= limits.entry_bytes_max);
    }

    #[test]
    fn large_requests_still_nest() {
        for bytes in ["1", "4096", "10485760", "104857600"] {
            let limits = Limits::new(&config(&["--max-request-bytes", bytes]));
            limits.assert_nested();
        }
    }

    #[test]
    fn the_entry_envelope_covers_the_real_encoding() {
        let data = vec![7u8; 1000];
        let entry = keel_raft::Entry {
            term: u64::MAX,
            index: u64::MAX,
            entry_type: keel_raft::EntryType::ConfChange,
            data: data.clone().into(),
        };
        let mut buf = Vec::new();
        entry.encode(&mut buf);
        assert!(buf.len() - data.len() <= ENTRY_ENVELOPE_BYTES);
    }
}
