//! The simulated world: N members, each the production `Member` over a `Wal<SimStore>` and a
//! map of durable checkpoint files, a network that drops, duplicates, delays, reorders and
//! partitions, and one clock per member (skewed in rate, and stopped while the member is
//! paused). Everything random comes from one seeded generator, so a seed replays exactly.
//!
//! The driver here does for each member what `raftcore.rs` does in production: feed inputs,
//! take a Ready, send its messages, make its checkpoint and WAL records durable (the WAL
//! append is a future polled across simulated steps, so a crash can land between its write
//! and its fdatasync), send the messages that vouch for durable state, call `persisted`,
//! carry out effects, and hand due checkpoints to a writer that finishes after a seeded delay
//! (production's writer thread), so a crash, a power loss or a leader's snapshot can land while
//! one is being written.
//!
//! Values live on disk as in the server: each member's store seals small value-log segments,
//! which a simulated writer makes durable one at a time after a seeded delay (a crash may
//! leave the one being written torn; a failed write stops the process). Checkpoints point
//! into them; a start keeps only the segments a checkpoint names (`vlog_writer::unreferenced`);
//! dead ones are deleted once no kept checkpoint names them (`released_by_checkpoint`); and a
//! leader's snapshot carries the segment files it points into, stored under the receiver's
//! ids (`peer_snapshot::IdShift`), or under the leader's own where the receiver never had a
//! segment file (`Member::segment_id_base` is 0). Entries that read values whose pages are out (a seeded
//! share of asks) wait for a simulated pager, as `RaftCore::page_in_for_apply` makes them.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_channel::oneshot;
use futures_lite::future::block_on;
use keel_core::checkpoint;
use keel_core::ids::Member as MemberInfo;
use keel_core::member::recovery::{self, Start};
use keel_core::member::{
    CheckpointCompletion, CheckpointRequest, Effect, Member, MemberConfig, PlacedSnapshot, ReadyIo,
};
use keel_core::shared::{MemberChange, Proposal, Query, ReadWait};
use keel_core::{peer_snapshot, vlog_writer};
use keel_grpc::EtcdError;
use keel_io::{SimFaults, SimStore, Wal, WalConfig, WalError};
use keel_kv as kv;
use keel_raft::{Message, MessageType, SnapshotSent, SnapshotStatus, Storage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One raft tick (etcd's heartbeat interval), on a member's clock.
pub const TICK_MS: u64 = 10;
/// Ticks to an election.
pub const ELECTION_TICKS: usize = 10;
/// etcd's request timeout, scaled to the simulated tick.
pub const REQUEST_TIMEOUT_MS: u64 = 1_000;
/// Proposals a member's mailbox holds; one more is refused as "too many requests".
pub const MAILBOX_PROPOSALS_MAX: usize = 64;
/// Keys per step of an entry applied in steps (production's is `limits::APPLY_KEYS_PER_STEP`).
const APPLY_KEYS_PER_STEP: usize = 2;
/// Value-log segments this small seal every few writes, so values live in segment files,
/// checkpoints point into them, snapshots carry them and reclaim rewrites them in short runs.
const SEGMENT_BYTES: usize = 256;
/// Values sealed and not yet durable above which a member takes no new writes: a few
/// segments, so a slow value-log writer holds proposals in short runs.
const SEALED_BACKLOG_BYTES_MAX: u64 = 4 * SEGMENT_BYTES as u64;
/// How long the value-log writer takes to write and sync one segment file.
const SEGMENT_WRITE_MS: std::ops::RangeInclusive<u64> = 1..=15;
const SEGMENT_SLOW_WRITE_MS: std::ops::RangeInclusive<u64> = 50..=300;
const SEGMENT_SLOW_ONE_IN: u32 = 20;
/// The longest a pager round takes to bring an entry's values in.
const PAGER_MS_MAX: u64 = 60;
/// One in this many asks whether an entry's values are in memory is answered no. (The
/// server's third answer, too many pages to ask about, is left to the member's unit test:
/// drawn here too, it reshuffled which entries wait, and one seed of the availability
/// test's 200 then took 246 ms to serve again after a pause, against its 200 ms bound.)
const VALUES_OUT_ONE_IN: u64 = 4;

thread_local! {
    /// The state of `sim_values_resident`'s answers, seeded by each `World::new`: a plain
    /// function is what `MemberConfig` takes, and a seed runs on one thread.
    static VALUES_OUT_STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `MemberConfig::values_resident` for the simulation, whose segment files are always in
/// memory: a seeded, replayable share of the asks are told the pages are out, so those
/// entries wait for the driver's pager (`World::page_in_for_apply`).
fn sim_values_resident(records: &[Bytes]) -> Option<bool> {
    assert!(!records.is_empty(), "the member asks about some value");
    VALUES_OUT_STATE.with(|state| {
        // splitmix64: each ask draws the next number of the seed's sequence.
        let x = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        match (z ^ (z >> 31)) % VALUES_OUT_ONE_IN {
            0 => Some(false),
            _ => Some(true),
        }
    })
}

/// A segment's file as the server writes it: its records, zero-padded to a 4 KiB block.
fn segment_file(sealed: &kv::SealedSegment) -> Bytes {
    let mut file: Vec<u8> = sealed.records.to_vec();
    assert_eq!(file.len() as u64, sealed.bytes);
    file.resize(file.len().next_multiple_of(4096), 0);
    Bytes::from(file)
}

/// The value-log segments a checkpoint file's store image points into; None for a file that
/// does not decode (as `raftcore::segments_of_checkpoints` reads it).
fn segments_of(file: &Bytes) -> Option<Vec<u32>> {
    let cp = checkpoint::decode_shared(file).ok()?;
    kv::checkpoint_segments(&cp.kv_image).ok()
}

/// Messages in flight on the network; more are dropped (a full socket buffer).
const NETWORK_IN_FLIGHT_MAX: usize = 20_000;
/// The events kept for a failure's trace.
const TRACE_EVENTS_KEPT: usize = 400;
/// How long a checkpoint's writer usually takes, in simulated ms (below an election timeout).
const CHECKPOINT_WRITE_MS: std::ops::RangeInclusive<u64> = 1..=40;
/// How long it takes now and then: long enough for elections, snapshots and crashes to overtake.
const CHECKPOINT_SLOW_WRITE_MS: std::ops::RangeInclusive<u64> = 100..=800;
/// One in this many checkpoint writes is slow.
const CHECKPOINT_SLOW_ONE_IN: u32 = 8;

/// A deliberate bug in the driver, to prove that the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    None,
    /// Calls `persisted` (so applies and acknowledges) before the WAL append is durable.
    AckBeforePersist,
    /// Sends the messages that vouch for durable state (votes, append responses) before the
    /// WAL append is durable.
    SendBeforePersist,
    /// Answers linearizable reads from the local store, without a ReadIndex round.
    LocalLinearizableReads,
    /// Never tells a removed member that dials in that it was removed (the peer transport of
    /// builds before the removed notice): such a member lingers.
    NoRemovedNotice,
    /// A shard renews leases whether or not the member's window is open (see
    /// `LeaseDeadlines::renew_here`): on followers and on a leader cut off from its quorum.
    ShardRenewsAnywhere,
}

/// The knobs one seed draws.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    pub members: usize,
    pub snapshot_count: u64,
    pub wal: WalConfig,
    pub bug: Bug,
}

/// A network message between members.
#[derive(Clone)]
pub enum NetMsg {
    /// A raft message, encoded as the peer transport frames it, and its type.
    Raft(Bytes, MessageType),
    KeepAlive {
        request_id: u64,
        lease: i64,
    },
    KeepAliveReply {
        request_id: u64,
        ttl_s: i64,
    },
    Refused {
        refusal: keel_core::member::Refusal,
        kind: keel_core::member::ProposalKind,
        id: u64,
    },
    /// The peer transport's removed notice: the receiver was removed from the cluster (sent by
    /// a member that applied the removal, to a removed member that reached it, or on the
    /// connection it had when the removal applied).
    Removed,
    /// A connection's handshake, as a process dials each peer it knows when it starts.
    Hello,
}

impl NetMsg {
    /// Whether this travels as TCP carries a handshake or the removed notice: never lost or
    /// doubled by a degraded network, and held (retransmitted) while a partition lasts, but
    /// gone with either process.
    fn is_reliable(&self) -> bool {
        matches!(self, NetMsg::Removed | NetMsg::Hello)
    }
}

struct InFlight {
    deliver_at_ms: u64,
    from: usize,
    to: usize,
    /// The receiving process the message was sent to: a connection ends with its process, so
    /// a message to a process that has since restarted is lost (the new process has new
    /// connections, and request ids that start over).
    to_incarnation: u64,
    msg: NetMsg,
    /// A holding partition kept it for a while (`World::holding`).
    held: bool,
}

type WalFuture = Pin<Box<dyn Future<Output = Result<(), WalError>>>>;

/// A Ready whose WAL append is in progress.
struct PendingIo {
    append: Option<WalFuture>,
    persisted_messages: Vec<Message>,
}

/// A checkpoint handed to the member's writer (production's `keel-checkpoint` thread).
struct CheckpointInFlight {
    req: CheckpointRequest,
    /// When the writer has serialized and durably written it, on the simulated clock; it
    /// serializes then, as the thread does, so a compaction begun meanwhile can race it.
    lands_at_ms: u64,
    /// What the writer made of it, once it landed: the durable file, or None when a compaction
    /// raced the image. The raft loop takes it on a later turn.
    landed: Option<Option<(Bytes, Option<u64>)>>,
}

/// A member process that is up.
pub struct Running {
    pub member: Member,
    wal: Rc<Wal<SimStore>>,
    pub reader: kv::Reader,
    io: Option<PendingIo>,
    /// The checkpoint being written, if any; it dies with the process, leaving no file unless
    /// it had landed.
    checkpoint: Option<CheckpointInFlight>,
    /// The value-log writer: sealed segments in the order it writes them, each with when its
    /// file is written and synced (as `vlog_writer`, one at a time, oldest first).
    vlog: VecDeque<(kv::SealedSegment, u64)>,
    /// Dead segments whose files wait for the checkpoints that refer to them to go.
    dead_segments: Vec<kv::DeadSegment>,
    /// The entry whose values the pager is bringing in, and when it is done (member clock).
    paging: Option<(u64, u64)>,
}

/// One member: its disks survive crashes, its process does not.
pub struct Node {
    pub id: u64,
    /// How the process starts without a checkpoint: founding, or joining an existing cluster.
    start_mode: Start,
    /// The membership it is started with (etcd's --initial-cluster).
    initial_members: Vec<MemberInfo>,
    /// Removed from the cluster: its process is stopped for good.
    pub removed: bool,
    pub disk: SimStore,
    /// Durable checkpoint files by index (written whole and atomically, as `write_durably`).
    pub checkpoints: BTreeMap<u64, Bytes>,
    /// Value-log segment files by id: durable ones, and torn ones a crash left mid-write,
    /// which the next start deletes (no checkpoint names them).
    pub segments: BTreeMap<u32, Bytes>,
    /// The faults armed on its disk: the WAL's and the value-log writer's alike.
    disk_faults: SimFaults,
    pub run: Option<Running>,
    /// Until when the process is stopped (SIGSTOP): it runs nothing, its clock runs on.
    pub paused_until_ms: u64,
    /// The member's clock runs at (1_000_000 + skew_ppm) / 1_000_000 of simulated time.
    pub skew_ppm: i64,
    /// The member's mailboxes, as the shards fill them.
    pub proposals: VecDeque<Proposal>,
    pub reads: Vec<ReadWait>,
    pub queries: Vec<Query>,
    /// Why the process exited on its own (an error, or removal), while it is down.
    pub why_down: Option<String>,
}

/// Counts for the run's report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub crashes: u64,
    pub restarts: u64,
    pub pauses: u64,
    pub partitions: u64,
    pub eio_stops: u64,
    pub corrupt_refusals: u64,
    pub elections: u64,
    pub checkpoints: u64,
    /// Checkpoints written as deltas (incremental, against a full one).
    pub deltas: u64,
    /// Snapshots that were deltas, placed with their base by a follower.
    pub delta_snapshots_placed: u64,
    /// Snapshots with segments placed under the leader's own segment ids (a member that never
    /// had a segment file: its files taken as they came, not renamed).
    pub snapshots_placed_as_sent: u64,
    /// Snapshots with segment files placed under ids above the receiver's own: the checkpoint
    /// files given a store-image header that shifts every id (`peer_snapshot::IdShift`).
    pub snapshots_placed_shifted: u64,
    /// Starts that restored a delta over its base.
    pub delta_restarts: u64,
    /// Checkpoints a leader's snapshot overtook while they were being written.
    pub checkpoints_overtaken: u64,
    /// Checkpoints lost to a crash or exit while they were being written.
    pub checkpoints_cut_short: u64,
    pub snapshots_sent: u64,
    pub messages: u64,
    pub dropped: u64,
    pub members_added: u64,
    pub members_removed: u64,
    /// Removed members that stopped because a peer told them so (they missed their removal).
    pub removed_told_by_peer: u64,
    /// Removed members that stopped on applying their own removal.
    pub removed_applied_own: u64,
    pub promotions: u64,
    /// Loop turns that found an entry being applied in steps, and crashes in the middle of one.
    pub apply_step_turns: u64,
    pub crashes_mid_apply: u64,
    /// Value-log segments written durable, torn by a crash mid-write, and deleted once dead.
    pub segments_durable: u64,
    pub segments_torn: u64,
    /// Processes stopped by a failed segment write.
    pub segment_eio_stops: u64,
    pub segments_deleted: u64,
    /// Starts that restored values from segment files, and snapshots sent with segments.
    pub restores_from_segments: u64,
    pub snapshots_with_segments: u64,
    /// Entries that waited for their values' pages, and crashes during such a wait.
    pub pages_waits: u64,
    pub crashes_mid_pages_wait: u64,
    /// Raft messages a holding partition kept and delivered when it healed.
    pub raft_held_then_delivered: u64,
    /// Snapshot transfer reports the transport held back, and those of them that reached
    /// their member after the term they were sent in (raft must ignore those).
    pub snapshot_reports_held: u64,
    pub snapshot_reports_after_their_term: u64,
}

/// A snapshot transfer report the peer transport holds back: a failed stream's report waits
/// out its retry pause, and a slow stream reports only when it ends.
struct HeldReport {
    due_ms: u64,
    from: usize,
    /// The sender's process: a crash takes its transport's pending reports with it.
    incarnation: u64,
    sent: SnapshotSent,
    status: SnapshotStatus,
}

pub struct World {
    pub config: WorldConfig,
    pub rng: StdRng,
    pub now_ms: u64,
    pub nodes: Vec<Node>,
    network: Vec<InFlight>,
    /// `blocked[from][to]`: messages from `from` to `to` are lost (partitions, one-way too).
    pub blocked: Vec<Vec<bool>>,
    /// `holding[from][to]`: a blocked link whose raft messages are held, not lost, until it
    /// unblocks, as a TCP connection across a partition that drops packets (without breaking
    /// the connection) delivers what was sent meanwhile all at once when it heals. A partition
    /// lasts two seconds at most, which bounds what a link holds.
    pub holding: Vec<Vec<bool>>,
    pub drop_per_million: u32,
    pub dup_per_million: u32,
    pub delay_ms_max: u64,
    /// The leader of each term any member ever saw itself lead: at most one (election safety).
    leaders_by_term: BTreeMap<u64, u64>,
    /// The store revision after each applied raft index, as the first member to apply it saw
    /// it: every member must agree (state machine safety).
    revision_at_index: BTreeMap<u64, i64>,
    pub counts: Counts,
    /// Membership changes asked of the leader, waiting for their answer.
    pending_changes: Vec<PendingChange>,
    /// How many times each member's process started (a restart is a new incarnation).
    incarnations: Vec<u64>,
    held_reports: Vec<HeldReport>,
    /// Per member: the removed member ids its current process has sent the removed notice to
    /// (on the connection each had to it when the removal applied).
    notified_removed: Vec<BTreeSet<u64>>,
    /// The base of each delta checkpoint sent as a snapshot, by the delta's file, as the peer
    /// stream carries it beside the delta (taken when the receiver places the snapshot).
    snapshot_bases: BTreeMap<Bytes, Bytes>,
    /// The value-log segment files each snapshot sent points into (its base's too), by the
    /// snapshot's file, as the peer stream carries them beside it.
    snapshot_segments: BTreeMap<Bytes, BTreeMap<u32, Bytes>>,
    /// How many events the trace keeps (`SIM_TRACE_EVENTS`, or `TRACE_EVENTS_KEPT`).
    trace_events_kept: usize,
    /// The watch events of every revision, as the first member to publish it did: every
    /// member must publish the same (history agreement).
    events_at_revision: BTreeMap<i64, Vec<kv::Event>>,
    /// Per member: the last revision its current process published, when it has published
    /// every revision since its start or since its last snapshot install (contiguity).
    last_published: Vec<Option<i64>>,
    /// The model the events are checked against: every key's latest version after the
    /// revisions checked so far (prev_kv must be exactly that).
    model: BTreeMap<Bytes, kv::KeyValue>,
    model_revision: i64,
    pub events_checked: u64,
    trace: RefCell<VecDeque<String>>,
}

fn wal_config() -> WalConfig {
    WalConfig {
        // Small segments, so rotation, release and sealed-segment damage happen in short runs.
        segment_bytes: 4 * 4096,
        batch_bytes_max: 2 * 4096,
        batch_records_max: 256,
        queue_records_max: 1024,
        queue_bytes_max: 64 * 4096,
    }
}

impl WorldConfig {
    pub fn new(members: usize, snapshot_count: u64, bug: Bug) -> WorldConfig {
        WorldConfig {
            members,
            snapshot_count,
            wal: wal_config(),
            bug,
        }
    }
}

/// What a driver step of a member may end in.
enum Stop {
    /// The member returned an error or was removed: the process exits.
    Exit(String),
}

impl World {
    pub fn new(config: WorldConfig, seed: u64) -> World {
        assert!(config.members >= 1 && config.members <= 7);
        VALUES_OUT_STATE.with(|state| state.set(seed ^ 0x7061_6765_735f_6f75));
        let mut rng = StdRng::seed_from_u64(seed);
        let n = config.members;
        let initial_members: Vec<MemberInfo> = (0..n)
            .map(|i| MemberInfo {
                id: member_id(i),
                name: format!("m{i}"),
                peer_urls: vec![format!("http://sim-{i}:2380")],
                client_urls: vec![format!("http://sim-{i}:2379")],
                is_learner: false,
            })
            .collect();
        let nodes = (0..n)
            .map(|i| Node {
                id: member_id(i),
                start_mode: Start::Founding,
                initial_members: initial_members.clone(),
                removed: false,
                disk: SimStore::new(rng.gen()),
                checkpoints: BTreeMap::new(),
                segments: BTreeMap::new(),
                disk_faults: SimFaults::default(),
                run: None,
                paused_until_ms: 0,
                skew_ppm: rng.gen_range(-50_000..=50_000),
                proposals: VecDeque::new(),
                reads: Vec::new(),
                queries: Vec::new(),
                why_down: None,
            })
            .collect();
        let mut world = World {
            config,
            rng,
            now_ms: 0,
            nodes,
            network: Vec::new(),
            blocked: vec![vec![false; n]; n],
            holding: vec![vec![false; n]; n],
            drop_per_million: 0,
            dup_per_million: 0,
            delay_ms_max: 2,
            leaders_by_term: BTreeMap::new(),
            revision_at_index: BTreeMap::new(),
            counts: Counts::default(),
            pending_changes: Vec::new(),
            incarnations: vec![0; n],
            held_reports: Vec::new(),
            notified_removed: vec![BTreeSet::new(); n],
            snapshot_bases: BTreeMap::new(),
            snapshot_segments: BTreeMap::new(),
            trace_events_kept: std::env::var("SIM_TRACE_EVENTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(TRACE_EVENTS_KEPT),
            events_at_revision: BTreeMap::new(),
            last_published: vec![None; n],
            model: BTreeMap::new(),
            model_revision: 1,
            events_checked: 0,
            trace: RefCell::new(VecDeque::new()),
        };
        for i in 0..n {
            world.start(i).expect("a fresh member starts");
        }
        world
    }

    pub fn note(&self, text: impl FnOnce() -> String) {
        let mut trace = self.trace.borrow_mut();
        if trace.len() >= self.trace_events_kept {
            trace.pop_front();
        }
        trace.push_back(format!("{:>7} ms  {}", self.now_ms, text()));
    }

    pub fn trace(&self) -> String {
        self.trace
            .borrow()
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Member `i`'s clock: simulated time at its own rate.
    pub fn clock_ms(&self, i: usize) -> u64 {
        let t = self.now_ms as i128;
        (t + t * self.nodes[i].skew_ppm as i128 / 1_000_000) as u64
    }

    pub fn incarnation(&self, i: usize) -> u64 {
        self.incarnations[i]
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].run.is_some()
    }

    pub fn is_serving(&self, i: usize) -> bool {
        self.is_up(i) && self.nodes[i].paused_until_ms <= self.now_ms
    }

    /// Starts member `i`'s process from its disks, as `raftcore::open` does.
    pub fn start(&mut self, i: usize) -> Result<(), String> {
        assert!(self.nodes[i].run.is_none(), "member {i} is already up");
        let node = &mut self.nodes[i];
        let (wal, records) = block_on(Wal::open(node.disk.clone(), self.config.wal.clone()))
            .map_err(|e| e.to_string())?;
        // The newest checkpoint that validates, exactly as `checkpoint::load_newest` chooses.
        let files = &node.checkpoints;
        let cp = files.iter().rev().find_map(|(index, bytes)| {
            checkpoint::accept(*index, &checkpoint::file_name(*index), bytes, &mut |base| {
                files.get(&base).cloned()
            })
            .map(|(cp, base)| (cp, bytes.clone(), base))
        });
        let records_len = records.len();
        if cp.as_ref().is_some_and(|(_, _, base)| base.is_some()) {
            self.counts.delta_restarts += 1;
        }
        let node = &mut self.nodes[i];
        // As `raftcore::open`: keep the segments a checkpoint file points into, delete the
        // rest (torn files, dead ones), number new ones above every kept id. A file that
        // does not decode may name any: then every file stays.
        let kept: Option<Vec<u32>> =
            node.checkpoints
                .values()
                .map(segments_of)
                .try_fold(Vec::new(), |mut kept, ids| {
                    kept.extend(ids?);
                    Some(kept)
                });
        let present: Vec<u32> = node.segments.keys().copied().collect();
        let (gone, first_segment_id) = vlog_writer::unreferenced(&present, kept.as_deref());
        for id in gone {
            node.segments.remove(&id);
        }
        if cp
            .as_ref()
            .is_some_and(|(_, bytes, _)| segments_of(bytes).is_some_and(|ids| !ids.is_empty()))
        {
            self.counts.restores_from_segments += 1;
        }
        let rc = recovery::raft_config(node.id, ELECTION_TICKS, 1 << 20, 1 << 30);
        let segments = &node.segments;
        let recovered = recovery::recover(
            rc,
            node.start_mode,
            node.initial_members.clone(),
            cp,
            records,
            recovery::StoreSource {
                value_log: keel_kv::ValueLogOptions {
                    segment_bytes: SEGMENT_BYTES,
                    first_segment_id,
                    on_disk: true,
                },
                segment_files: &mut |id| {
                    segments.get(&id).cloned().ok_or(format!(
                        "segment {id} is named by a checkpoint but not on disk"
                    ))
                },
                restore_helpers: keel_kv::RestoreHelpers::NONE,
            },
        )
        .map_err(|e| e.to_string())?;
        let config = MemberConfig {
            id: node.id,
            name: format!("m{i}"),
            advertise_client_urls: vec![format!("http://sim-{i}:2379")],
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            tick_ms: TICK_MS,
            snapshot_count: self.config.snapshot_count,
            stats: std::sync::Arc::new(keel_core::stats::RaftStats::default()),
            auth_token_ttl_ms: 300_000,
            sealed_backlog_bytes_max: SEALED_BACKLOG_BYTES_MAX,
            watch_events_per_apply_max: keel_core::limits::WATCH_EVENTS_PER_APPLY_MAX,
            // Range deletes span a key and its filler keys (see `clients.rs`): two keys per
            // step makes most of them take several steps, with crashes, elections, snapshots
            // and checkpoints falling between.
            apply_keys_per_step: APPLY_KEYS_PER_STEP,
            // Each incarnation of each member uses ids no other one used.
            ids_first: (node.id << 48) | ((self.incarnations[i] + 1) << 32),
            values_resident: sim_values_resident,
            install_helpers: keel_core::member::InstallHelpers::NONE,
            strict_reconfig_check: true,
            published_auth: std::sync::Arc::default(),
        };
        let (last_index, commit) = (
            recovered.node.store().last_index(),
            recovered.node.store().hard_state().commit,
        );
        let records_read = records_len;
        self.note(|| {
            format!(
                "m{i} read {records_read} WAL records: last index {last_index}, commit {commit}"
            )
        });
        let mut member = Member::new(
            config,
            recovered.node,
            recovered.writer,
            recovered.members,
            recovered.alarms,
            recovered.checkpoint_index,
        );
        member.set_checkpoint_root(recovered.checkpoint_root);
        member.restore_auth(&recovered.auth);
        member.restore_removed(&recovered.removed);
        let now = self.clock_ms(i);
        member.start(now);
        let (applied, term) = (member.applied_index(), member.raft_term());
        self.note(|| format!("m{i} recovered: applied {applied}, term {term}"));
        let node = &mut self.nodes[i];
        node.run = Some(Running {
            member,
            wal: Rc::new(wal),
            reader: recovered.reader,
            io: None,
            checkpoint: None,
            vlog: VecDeque::new(),
            dead_segments: Vec::new(),
            paging: None,
        });
        node.why_down = None;
        self.incarnations[i] += 1;
        self.notified_removed[i].clear();
        // The peer transport dials every peer it knows at start: a handshake each.
        let peers: Vec<u64> = self.nodes[i]
            .run
            .as_ref()
            .expect("started")
            .member
            .members()
            .iter()
            .map(|m| m.id)
            .collect();
        for id in peers {
            if let Some(j) = self.index_of(id).filter(|&j| j != i) {
                self.send_reliable(i, j, NetMsg::Hello);
            }
        }
        self.last_published[i] = Some(
            self.nodes[i]
                .run
                .as_ref()
                .expect("started")
                .reader
                .current_revision(),
        );
        if self.drain_effects(i) {
            self.check_applied(i);
        }
        Ok(())
    }

    /// The process dies (kill -9 or power loss): unsynced data may be lost or torn, waiting
    /// callers see their connection drop.
    pub fn crash(&mut self, i: usize) {
        if std::env::var("SIM_DEBUG_WAL").is_ok() {
            let d = durable_records(&self.nodes[i].disk, &self.config.wal);
            let st = self.nodes[i].disk.stats();
            self.note(|| format!("m{i} before crash: {d} records durable; {st:?}"));
        }
        let node = &mut self.nodes[i];
        if let Some(run) = node.run.take() {
            self.counts.crashes += 1;
            self.counts.crashes_mid_apply += u64::from(run.member.applying_in_steps());
            self.counts.crashes_mid_pages_wait += u64::from(run.paging.is_some());
            if run.checkpoint.is_some_and(|c| c.landed.is_none()) {
                self.counts.checkpoints_cut_short += 1;
            }
            self.cut_segment_writes(i, run.vlog);
        }
        let node = &mut self.nodes[i];
        node.disk.crash();
        node.proposals.clear();
        node.reads.clear();
        node.queries.clear();
        node.paused_until_ms = 0;
        self.note(|| format!("m{i} crashed"));
    }

    /// A process that exits on its own (an error, or removal): what it wrote stays, unsynced
    /// writes included, as the kernel's page cache would keep them, except after a failed
    /// fdatasync, when the kernel may have dropped them (modelled as a crash of the disk).
    fn exit(&mut self, i: usize, why: String) {
        self.note(|| format!("m{i} exited: {why}"));
        if why.contains("fdatasync") {
            self.nodes[i].disk.crash();
        }
        let node = &mut self.nodes[i];
        if let Some(run) = node.run.take() {
            if run.checkpoint.is_some_and(|c| c.landed.is_none()) {
                self.counts.checkpoints_cut_short += 1;
            }
            self.cut_segment_writes(i, run.vlog);
        }
        let node = &mut self.nodes[i];
        node.proposals.clear();
        node.reads.clear();
        node.queries.clear();
        node.why_down = Some(why);
    }

    pub fn set_disk_faults(&mut self, i: usize, faults: SimFaults) {
        self.nodes[i].disk_faults = faults;
        self.nodes[i].disk.set_faults(faults);
    }

    // ---- The network ----

    /// Puts a message on the wire; false when it is lost at once.
    fn send(&mut self, from: usize, to: usize, msg: NetMsg) -> bool {
        if to >= self.nodes.len() {
            return false;
        }
        self.counts.messages += 1;
        if self.network.len() >= NETWORK_IN_FLIGHT_MAX
            || self.rng.gen_range(0..1_000_000) < self.drop_per_million
        {
            self.counts.dropped += 1;
            return false;
        }
        // Raft tolerates duplicates, but a forwarded proposal is not idempotent and TCP never
        // duplicates it (etcd's transport neither), so only other raft messages are doubled.
        let duplicable = matches!(&msg, NetMsg::Raft(_, t) if *t != MessageType::Propose);
        let copies = if duplicable && self.rng.gen_range(0..1_000_000) < self.dup_per_million {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self.rng.gen_range(0..=self.delay_ms_max);
            self.network.push(InFlight {
                deliver_at_ms: self.now_ms + delay,
                from,
                to,
                to_incarnation: self.incarnations[to],
                msg: msg.clone(),
                held: false,
            });
        }
        true
    }

    /// Puts a handshake or removed notice on the wire (see `NetMsg::is_reliable`).
    fn send_reliable(&mut self, from: usize, to: usize, msg: NetMsg) {
        assert!(
            msg.is_reliable(),
            "only handshakes and notices travel reliably"
        );
        self.counts.messages += 1;
        if self.network.len() >= NETWORK_IN_FLIGHT_MAX {
            self.counts.dropped += 1;
            return;
        }
        self.network.push(InFlight {
            deliver_at_ms: self.now_ms + 1,
            from,
            to,
            to_incarnation: self.incarnations[to],
            msg,
            held: false,
        });
    }

    /// Sends the removed notice to each member that member `i` newly knows was removed, on
    /// the connection that member had to `i` (as the peer transport checks its connections
    /// every `REMOVED_CHECK_INTERVAL`): lost when that member is down.
    fn notify_removed(&mut self, i: usize) {
        if self.config.bug == Bug::NoRemovedNotice {
            return;
        }
        let Some(run) = self.nodes[i].run.as_ref() else {
            return;
        };
        let fresh: Vec<u64> = run
            .member
            .removed_members()
            .iter()
            .copied()
            .filter(|id| !self.notified_removed[i].contains(id))
            .collect();
        for id in fresh {
            self.notified_removed[i].insert(id);
            if let Some(j) = self.index_of(id).filter(|&j| j != i && self.is_up(j)) {
                self.note(|| format!("m{i} tells m{j}, on its connection, it was removed"));
                self.send_reliable(i, j, NetMsg::Removed);
            }
        }
    }

    fn send_raft(&mut self, from: usize, m: Message) {
        let Some(to) = self.index_of(m.to) else {
            return;
        };
        if m.msg_type == MessageType::Snapshot {
            self.counts.snapshots_sent += 1;
            // A delta goes with its base, read from the sender's files (as the stream does).
            let data = m
                .snapshot
                .as_ref()
                .map(|s| s.data.clone())
                .unwrap_or_default();
            let base_index = checkpoint::decode_shared(&data)
                .ok()
                .and_then(|cp| checkpoint::base_index(&cp));
            let mut named = segments_of(&data).unwrap_or_default();
            if let Some(base_index) = base_index {
                let base = self.nodes[from].checkpoints.get(&base_index).cloned();
                let base = base.expect("a member keeps the base of its newest checkpoint");
                named.extend(segments_of(&base).unwrap_or_default());
                // Bounded: a handful of snapshots are in the air at once.
                if self.snapshot_bases.len() >= 64 {
                    self.snapshot_bases.pop_first();
                }
                self.snapshot_bases.insert(data.clone(), base);
            }
            // The segment files stream beside the checkpoint, read from the sender's disk.
            if !named.is_empty() {
                let disk = &self.nodes[from].segments;
                let files: BTreeMap<u32, Bytes> = named
                    .into_iter()
                    .map(|id| {
                        let file = disk.get(&id).cloned().unwrap_or_else(|| {
                            panic!("m{from}'s snapshot points into segment {id}, not on its disk")
                        });
                        (id, file)
                    })
                    .collect();
                self.counts.snapshots_with_segments += 1;
                if self.snapshot_segments.len() >= 64 {
                    self.snapshot_segments.pop_first();
                }
                self.snapshot_segments.insert(data, files);
            }
        }
        let mut buf = Vec::new();
        m.encode(&mut buf);
        let (sent, msg_type) = (SnapshotSent::of(&m), m.msg_type);
        if !self.send(from, to, NetMsg::Raft(Bytes::from(buf), msg_type)) {
            // As the peer transport does when a snapshot cannot go out: raft retries later.
            if let Some(sent) = sent {
                self.report_snapshot(from, sent, SnapshotStatus::Failure);
            }
        }
    }

    /// The peer transport's report on a snapshot `from` sent: at once, or (half of them) held
    /// back up to 3 s, so that some come back after their term ended.
    fn report_snapshot(&mut self, from: usize, sent: SnapshotSent, status: SnapshotStatus) {
        if !self.is_up(from) {
            return;
        }
        if self.rng.gen_bool(0.5) {
            let due_ms = self.now_ms + self.rng.gen_range(1..=3_000);
            self.counts.snapshot_reports_held += 1;
            self.held_reports.push(HeldReport {
                due_ms,
                from,
                incarnation: self.incarnations[from],
                sent,
                status,
            });
        } else if let Some(run) = self.nodes[from].run.as_mut() {
            run.member.report_snapshot(sent, status);
        }
    }

    /// Hands each held report that is due to its member, unless the member restarted since
    /// (the report went with the old process); a paused member gets it once it runs again.
    fn hand_held_reports(&mut self) {
        let mut i = 0;
        while i < self.held_reports.len() {
            let r = &self.held_reports[i];
            let waits = self.is_up(r.from) && !self.is_serving(r.from);
            if r.due_ms > self.now_ms || waits {
                i += 1;
                continue;
            }
            let r = self.held_reports.remove(i);
            if r.incarnation != self.incarnations[r.from] {
                continue;
            }
            if let Some(run) = self.nodes[r.from].run.as_mut() {
                if run.member.raft_term() != r.sent.term {
                    self.counts.snapshot_reports_after_their_term += 1;
                }
                run.member.report_snapshot(r.sent, r.status);
            }
        }
    }

    /// Delivers every message due by now, in a random order (reordering what arrived together).
    fn deliver(&mut self) {
        self.hand_held_reports();
        let now = self.now_ms;
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.network.len() {
            let m = &self.network[i];
            // A paused member's socket buffers hold its messages until it runs again.
            let held = self.is_up(m.to) && !self.is_serving(m.to);
            if m.deliver_at_ms <= now && !held {
                due.push(self.network.swap_remove(i));
            } else {
                i += 1;
            }
        }
        // swap_remove scrambled the order; make it a seeded shuffle.
        for k in (1..due.len()).rev() {
            let j = self.rng.gen_range(0..=k);
            due.swap(k, j);
        }
        for m in due {
            self.deliver_one(m);
        }
    }

    fn deliver_one(&mut self, mut m: InFlight) {
        let (from, to) = (m.from, m.to);
        let held = m.msg.is_reliable() || self.holding[from][to];
        if held
            && self.blocked[from][to]
            && self.is_up(to)
            && m.to_incarnation == self.incarnations[to]
        {
            // TCP retransmits until the partition heals.
            m.deliver_at_ms = self.now_ms + 10;
            m.held = true;
            self.network.push(m);
            return;
        }
        let lost =
            self.blocked[from][to] || !self.is_up(to) || m.to_incarnation != self.incarnations[to];
        let from_id = self.nodes[from].id;
        let from_removed = !lost
            && self.nodes[to]
                .run
                .as_ref()
                .is_some_and(|r| r.member.is_removed(from_id));
        if from_removed && self.config.bug != Bug::NoRemovedNotice {
            // As the peer transport: a connection from a removed member is answered with the
            // removed notice and closed; nothing it sent is taken.
            self.counts.dropped += 1;
            self.note(|| format!("m{to} tells m{from} it was removed"));
            self.send_reliable(to, from, NetMsg::Removed);
            return;
        }
        if let NetMsg::Raft(bytes, _) = &m.msg {
            let msg = Message::decode(bytes).expect("a message we encoded decodes");
            if lost {
                self.counts.dropped += 1;
                // The transport notices a dead connection; raft then probes instead of
                // streaming appends, and a lost snapshot is retried.
                if let Some(run) = self.nodes[from].run.as_mut() {
                    run.member.report_unreachable(msg.to);
                }
                if let Some(sent) = SnapshotSent::of(&msg) {
                    self.report_snapshot(from, sent, SnapshotStatus::Failure);
                }
                return;
            }
            if m.held {
                self.counts.raft_held_then_delivered += 1;
            }
            let snapshot = SnapshotSent::of(&msg);
            let now = self.clock_ms(to);
            self.nodes[to]
                .run
                .as_mut()
                .expect("checked up")
                .member
                .step(msg, now);
            if let Some(sent) = snapshot {
                self.report_snapshot(from, sent, SnapshotStatus::Finish);
            }
            return;
        }
        if lost {
            self.counts.dropped += 1;
            return;
        }
        if matches!(m.msg, NetMsg::Hello) {
            return;
        }
        let now = self.clock_ms(to);
        if matches!(m.msg, NetMsg::Removed) {
            self.note(|| format!("m{to} was told by m{from} that it was removed"));
        }
        let member = &mut self.nodes[to].run.as_mut().expect("checked up").member;
        match m.msg {
            NetMsg::Raft(..) => unreachable!("handled above"),
            NetMsg::KeepAlive { request_id, lease } => {
                member.keepalive_from_peer(from_id, request_id, lease, now)
            }
            NetMsg::KeepAliveReply { request_id, ttl_s } => {
                member.keepalive_reply(request_id, ttl_s)
            }
            NetMsg::Refused { refusal, kind, id } => member.forwarded_refused(refusal, kind, id),
            NetMsg::Removed => member.told_removed(from_id),
            NetMsg::Hello => unreachable!("handled above"),
        }
    }

    // ---- One simulated millisecond ----

    pub fn step_ms(&mut self) {
        self.now_ms += 1;
        self.poll_changes();
        self.deliver();
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        for k in (1..order.len()).rev() {
            let j = self.rng.gen_range(0..=k);
            order.swap(k, j);
        }
        for i in order {
            self.drain_effects(i);
            if !self.is_serving(i) {
                continue;
            }
            self.land_checkpoint(i);
            if let Err(Stop::Exit(why)) = self.drive(i) {
                self.exit(i, why);
            }
        }
    }

    /// One turn of member `i`'s raft loop.
    fn drive(&mut self, i: usize) -> Result<(), Stop> {
        if self.nodes[i].run.as_ref().expect("up").io.is_some() {
            return self.progress_io(i);
        }
        // Between Readies, as production's loop takes the writers' outcomes at its top.
        self.finish_checkpoint(i)?;
        self.finish_segment_writes(i)?;
        if !self.drain_effects(i) {
            return Ok(());
        }
        let now = self.clock_ms(i);
        let bug = self.config.bug;
        let node = &mut self.nodes[i];
        let run = node.run.as_mut().expect("up");
        self.counts.apply_step_turns += u64::from(run.member.applying_in_steps());
        run.member.tick(now);
        // As production's loop reads whether any shard watches: here whole seconds of each
        // member's clock without watchers now and then (from the clock, so the seeds' random
        // streams stay as they were), so that applies without events, the cuts they hand
        // out and the return to events all pass the event checks.
        run.member
            .set_events_wanted(!(now / 1000 + i as u64).is_multiple_of(3));
        // As production's loop: queries wait while an entry is half applied.
        if !run.member.applying_in_steps() {
            for q in node.queries.drain(..) {
                run.member.query(q, now);
            }
        }
        // As production's raft loop: what arrived since the last turn is one raft batch,
        // held while an entry is applied in steps or values wait for the disk past their
        // bound.
        if !run.member.applying_in_steps() && !run.member.values_backlogged() {
            run.member
                .propose_batch(node.proposals.drain(..).collect(), now);
        }
        let reads = std::mem::take(&mut node.reads);
        if bug == Bug::LocalLinearizableReads {
            for r in reads {
                let _ = r.reply.send(Ok(()));
            }
        } else {
            run.member.read(reads, now);
        }
        if !self.drain_effects(i) {
            return Ok(());
        }
        self.page_in_for_apply(i, now);
        let run = self.nodes[i].run.as_mut().expect("up");
        if run.member.has_ready() {
            let io = run.member.ready(now).expect("has_ready");
            self.carry_out(i, io)?;
        } else if run.member.apply_runnable() {
            run.member.apply_step(now);
        } else if run.member.compaction_runnable() {
            run.member.compact_step();
        }
        // Applies and compaction steps seal segments (and reclaim kills them).
        self.submit_segments(i);
        let Some(run) = self.nodes[i].run.as_mut() else {
            return Ok(()); // Removed from the cluster by what it just applied.
        };
        run.member.answer_compaction_waiters();
        if self.drain_effects(i) {
            self.check_applied(i);
            self.start_checkpoint(i)?;
        }
        Ok(())
    }

    /// The value-log writer dies with its process: segments not yet durable are lost, and
    /// the one being written may leave a torn file behind, which no checkpoint names.
    fn cut_segment_writes(&mut self, i: usize, vlog: VecDeque<(kv::SealedSegment, u64)>) {
        if let Some((sealed, _)) = vlog.front() {
            if self.rng.gen_bool(0.5) {
                let file = segment_file(sealed);
                let torn = file.slice(..self.rng.gen_range(0..file.len()));
                self.nodes[i].segments.insert(sealed.id, torn);
                self.counts.segments_torn += 1;
            }
        }
    }

    /// As production's loop takes the value-log writer's outcomes at its top: each segment
    /// whose file is written and synced by now is durable, oldest first. A write that fails
    /// (EIO) stops the process, as the server's loop returns the writer's error.
    fn finish_segment_writes(&mut self, i: usize) -> Result<(), Stop> {
        let now_ms = self.now_ms;
        while self.nodes[i]
            .run
            .as_ref()
            .expect("up")
            .vlog
            .front()
            .is_some_and(|(_, done_ms)| *done_ms <= now_ms)
        {
            let faults = self.nodes[i].disk_faults;
            let eio_per_million = faults.write_eio_per_million + faults.fsync_eio_per_million;
            if eio_per_million > 0
                && self
                    .rng
                    .gen_ratio(eio_per_million.min(1_000_000), 1_000_000)
            {
                self.counts.segment_eio_stops += 1;
                let id = self.nodes[i].run.as_ref().expect("up").vlog[0].0.id;
                // The segment stays at the front: `exit` may leave its file torn.
                return Err(Stop::Exit(format!(
                    "the value-log writer failed: segment {id}: EIO"
                )));
            }
            let node = &mut self.nodes[i];
            let run = node.run.as_mut().expect("up");
            let (sealed, _) = run.vlog.pop_front().expect("checked");
            let file = segment_file(&sealed);
            node.segments.insert(sealed.id, file.clone());
            run.member.segment_durable(sealed.id, sealed.bytes, file);
            self.counts.segments_durable += 1;
        }
        Ok(())
    }

    /// Hands what the member sealed to the value-log writer, which writes one segment at a
    /// time, and keeps the segments that died for the checkpoints to let go.
    fn submit_segments(&mut self, i: usize) {
        let Some(run) = self.nodes[i].run.as_mut() else {
            return;
        };
        let sealed = run.member.take_sealed_segments();
        let dead = run.member.take_dead_segments();
        run.dead_segments.extend(dead);
        for segment in sealed {
            let write_ms = if self.rng.gen_ratio(1, SEGMENT_SLOW_ONE_IN) {
                self.rng.gen_range(SEGMENT_SLOW_WRITE_MS)
            } else {
                self.rng.gen_range(SEGMENT_WRITE_MS)
            };
            let run = self.nodes[i].run.as_mut().expect("up");
            let after_ms = run.vlog.back().map_or(self.now_ms, |(_, done)| *done);
            run.vlog
                .push_back((segment, after_ms.max(self.now_ms) + write_ms));
        }
    }

    /// As production's `RaftCore::page_in_for_apply`: the entry next to apply that reads
    /// values whose pages are out goes to the pager, which is done some milliseconds later
    /// (or at once, as when its queue is full); the member applies nothing meanwhile.
    fn page_in_for_apply(&mut self, i: usize, now: u64) {
        let run = self.nodes[i].run.as_mut().expect("up");
        if let Some((index, done_ms)) = run.paging {
            if now < done_ms {
                return;
            }
            run.paging = None;
            run.member.pages_brought_in(index, now);
        }
        let Some(wanted) = run.member.take_pages_wanted() else {
            return;
        };
        let index = wanted.index;
        assert!(
            !wanted.records.is_empty() || wanted.rest.is_some(),
            "an entry waits for some value's pages"
        );
        self.counts.pages_waits += 1;
        let run = self.nodes[i].run.as_mut().expect("up");
        if self.rng.gen_ratio(1, 8) {
            run.member.pages_left_out(index, now);
        } else {
            run.paging = Some((index, now + self.rng.gen_range(1..=PAGER_MS_MAX)));
        }
    }

    fn carry_out(&mut self, i: usize, io: ReadyIo) -> Result<(), Stop> {
        if !self.drain_effects(i) {
            return Ok(());
        }
        let ReadyIo {
            messages,
            checkpoint_to_persist,
            wal_records,
            persisted_messages,
        } = io;
        for m in messages {
            self.send_raft(i, m);
        }
        if let Some((index, data)) = checkpoint_to_persist {
            self.note(|| format!("m{i} wrote the leader's snapshot at {index}"));
            let base = checkpoint::decode_shared(&data)
                .ok()
                .and_then(|cp| checkpoint::base_index(&cp))
                .map(|base_index| {
                    let base = self
                        .snapshot_bases
                        .get(&data)
                        .cloned()
                        .expect("a delta snapshot arrives with its base");
                    (base_index, base)
                });
            // As `peer_snapshot::place`: the leader's segment files go above every id this
            // member's stores used (or keep their ids where it never had a segment file), and
            // the checkpoint files get a store-image header that names them so.
            let leaders = self
                .snapshot_segments
                .get(&data)
                .cloned()
                .unwrap_or_default();
            let id_base = self.nodes[i]
                .run
                .as_ref()
                .expect("up")
                .member
                .segment_id_base();
            let shift = leaders
                .keys()
                .next()
                .map_or(0, |lowest| id_base.saturating_sub(*lowest));
            let highest = leaders.keys().last().copied().unwrap_or(0);
            let renamed = |file: &Bytes| {
                if shift == 0 {
                    return file.clone();
                }
                let cp = checkpoint::decode_shared(file).expect("a leader's snapshot decodes");
                peer_snapshot::IdShift::of(file, &cp, shift, highest)
                    .expect("a leader's snapshot takes this member's ids")
                    .applied_to(file)
            };
            let mut files = BTreeMap::new();
            for (id, file) in leaders {
                let local = id + shift;
                let replaced = self.nodes[i].segments.insert(local, file.clone());
                assert!(
                    replaced.is_none(),
                    "m{i}: the leader's segment {id} would replace this member's file {local}"
                );
                files.insert(local, file);
            }
            let base = base.map(|(base_index, base)| (base_index, renamed(&base)));
            if let Some((base_index, base)) = &base {
                // The base first, as `peer_snapshot::place` writes it.
                self.note(|| format!("m{i} wrote the snapshot's base at {base_index}"));
                self.nodes[i].checkpoints.insert(*base_index, base.clone());
            }
            let data = renamed(&data);
            self.nodes[i].checkpoints.insert(index, data.clone());
            if base.is_some() || !files.is_empty() {
                self.counts.delta_snapshots_placed += u64::from(base.is_some());
                self.counts.snapshots_placed_as_sent +=
                    u64::from(id_base == 0 && !files.is_empty());
                self.counts.snapshots_placed_shifted += u64::from(shift != 0 && !files.is_empty());
                let run = self.nodes[i].run.as_mut().expect("up");
                run.member.snapshot_placed(PlacedSnapshot {
                    index,
                    data,
                    files,
                    base: base.map(|(_, base)| base),
                });
            }
        }
        if let (Some(first), Some(last)) = (wal_records.first(), wal_records.last()) {
            let (first, last, n) = (first.index, last.index, wal_records.len());
            self.note(|| format!("m{i} appends {n} records, indexes {first}..={last}"));
        }
        let run = self.nodes[i].run.as_mut().expect("up");
        let append: Option<WalFuture> = if wal_records.is_empty() {
            None
        } else {
            let wal = run.wal.clone();
            Some(Box::pin(async move { wal.append(wal_records).await }))
        };
        run.io = Some(PendingIo {
            append,
            persisted_messages,
        });
        match self.config.bug {
            Bug::AckBeforePersist => {
                let now = self.clock_ms(i);
                let run = self.nodes[i].run.as_mut().expect("up");
                run.member
                    .persisted(now)
                    .map_err(|e| Stop::Exit(e.to_string()))?;
                let pending = run.io.as_mut().expect("just set");
                let msgs = std::mem::take(&mut pending.persisted_messages);
                for m in msgs {
                    self.send_raft(i, m);
                }
                if !self.drain_effects(i) {
                    return Ok(());
                }
            }
            Bug::SendBeforePersist => {
                let run = self.nodes[i].run.as_mut().expect("up");
                let pending = run.io.as_mut().expect("just set");
                let msgs = std::mem::take(&mut pending.persisted_messages);
                for m in msgs {
                    self.send_raft(i, m);
                }
            }
            Bug::None
            | Bug::LocalLinearizableReads
            | Bug::NoRemovedNotice
            | Bug::ShardRenewsAnywhere => {}
        }
        self.progress_io(i)
    }

    /// Polls the WAL append once (the disk makes progress a little at a time); once durable,
    /// sends what vouches for it and lets the member apply.
    fn progress_io(&mut self, i: usize) -> Result<(), Stop> {
        let run = self.nodes[i].run.as_mut().expect("up");
        let pending = run.io.as_mut().expect("I/O in flight");
        if let Some(append) = pending.append.as_mut() {
            let mut cx = Context::from_waker(Waker::noop());
            match append.as_mut().poll(&mut cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Err(e)) => {
                    self.counts.eio_stops += 1;
                    return Err(Stop::Exit(format!("the raft core failed: {e}")));
                }
                Poll::Ready(Ok(())) => {}
            }
        }
        let pending = run.io.take().expect("I/O in flight");
        if pending.append.is_some() {
            if std::env::var("SIM_DEBUG_WAL").is_ok() {
                let durable = durable_records(&self.nodes[i].disk, &self.config.wal);
                self.note(|| format!("m{i} append durable ({durable} records durable)"));
            } else {
                self.note(|| format!("m{i} append durable"));
            }
        }
        for m in pending.persisted_messages {
            self.send_raft(i, m);
        }
        if self.config.bug != Bug::AckBeforePersist {
            let now = self.clock_ms(i);
            let run = self.nodes[i].run.as_mut().expect("up");
            run.member
                .persisted(now)
                .map_err(|e| Stop::Exit(e.to_string()))?;
        }
        if !self.drain_effects(i) {
            return Ok(());
        }
        self.check_applied(i);
        self.start_checkpoint(i)
    }

    /// Hands a due checkpoint to member `i`'s writer, which lands it after a seeded delay;
    /// only between Readies, as production's loop does.
    fn start_checkpoint(&mut self, i: usize) -> Result<(), Stop> {
        let run = self.nodes[i].run.as_mut().expect("up");
        if run.io.is_some() || !run.member.checkpoint_due() {
            return Ok(());
        }
        let Some(req) = run
            .member
            .checkpoint_request()
            .map_err(|e| Stop::Exit(e.to_string()))?
        else {
            return Ok(());
        };
        assert!(run.checkpoint.is_none(), "one checkpoint in flight at most");
        let delay_ms = if self.rng.gen_ratio(1, CHECKPOINT_SLOW_ONE_IN) {
            self.rng.gen_range(CHECKPOINT_SLOW_WRITE_MS)
        } else {
            self.rng.gen_range(CHECKPOINT_WRITE_MS)
        };
        let index = req.index;
        let run = self.nodes[i].run.as_mut().expect("up");
        run.checkpoint = Some(CheckpointInFlight {
            req,
            lands_at_ms: self.now_ms + delay_ms,
            landed: None,
        });
        self.note(|| format!("m{i} checkpoint at {index} started ({delay_ms} ms to write)"));
        Ok(())
    }

    /// Member `i`'s writer finishes the checkpoint in flight when its time has come: it
    /// serializes the image then (a compaction begun since the capture races it) and the file
    /// is durable at once, whole, as `write_durably`'s rename makes it.
    fn land_checkpoint(&mut self, i: usize) {
        let now_ms = self.now_ms;
        let node = &mut self.nodes[i];
        let Some(run) = node.run.as_mut() else {
            return;
        };
        let Some(cp) = run.checkpoint.as_mut() else {
            return;
        };
        if cp.landed.is_some() || cp.lands_at_ms > now_ms {
            return;
        }
        let req = &cp.req;
        // Against the request's base, a delta when few keys changed since (as the server's
        // writer does); the simulation's few keys change between most checkpoints, so half
        // of those that may be deltas are made deltas whatever their size.
        let image = match &req.base {
            Some(base) if self.rng.gen_bool(0.5) => req.source.serialize_delta_parts(base),
            base => req.source.serialize_parts_against(base.as_ref()),
        };
        let file = image.ok().map(|image| {
            (
                Bytes::from(req.encode_file(&image.to_vec())),
                image.delta_of(),
            )
        });
        if let Some((file, delta_of)) = &file {
            node.checkpoints.insert(req.index, file.clone());
            if delta_of.is_some() {
                self.counts.deltas += 1;
            }
        }
        let index = req.index;
        let written = file.as_ref().map(|(_, delta_of)| *delta_of);
        cp.landed = Some(file);
        self.note(|| {
            format!("m{i} checkpoint at {index} landed (written, a delta of: {written:?})")
        });
    }

    /// Member `i`'s raft loop takes its writer's outcome, a turn after it landed (so a crash
    /// can fall between): releases the WAL and old checkpoints as the member says, removes an
    /// overtaken one, or lets a raced one be retried.
    fn finish_checkpoint(&mut self, i: usize) -> Result<(), Stop> {
        let now_ms = self.now_ms;
        let node = &mut self.nodes[i];
        let run = node.run.as_mut().expect("up");
        if !run
            .checkpoint
            .as_ref()
            .is_some_and(|cp| cp.landed.is_some() && cp.lands_at_ms < now_ms)
        {
            return Ok(());
        }
        let cp = run.checkpoint.take().expect("checked");
        let index = cp.req.index;
        let Some((file, delta_of)) = cp.landed.expect("checked") else {
            run.member.checkpoint_abandoned(index);
            self.note(|| format!("m{i} checkpoint at {index} raced by a compaction"));
            return Ok(());
        };
        let completion = run
            .member
            .checkpoint_written(index, cp.req.conf_state.clone(), file, delta_of)
            .map_err(|e| Stop::Exit(e.to_string()))?;
        match completion {
            CheckpointCompletion::Taken { done, .. } => {
                block_on(run.wal.release_before(done.wal_keep_from))
                    .map_err(|e| Stop::Exit(e.to_string()))?;
                node.checkpoints
                    .retain(|index, _| *index >= done.remove_before);
                // As `RaftCore::finish_checkpoint`: the files of segments no kept
                // checkpoint points into go.
                let gone = vlog_writer::released_by_checkpoint(
                    &mut run.dead_segments,
                    index,
                    done.remove_before,
                );
                for id in gone {
                    if node.segments.remove(&id).is_some() {
                        self.counts.segments_deleted += 1;
                    }
                }
                self.counts.checkpoints += 1;
                self.note(|| format!("m{i} checkpoint at {index} taken"));
            }
            CheckpointCompletion::Overtaken { stale_file_index } => {
                if let Some(stale) = stale_file_index {
                    node.checkpoints.remove(&stale);
                }
                self.counts.checkpoints_overtaken += 1;
                self.note(|| format!("m{i} checkpoint at {index} overtaken by a snapshot"));
            }
        }
        Ok(())
    }

    /// Carries out member `i`'s effects: messages to peers, published state, checks. False
    /// when the process is gone after them (it was removed from the cluster).
    fn drain_effects(&mut self, i: usize) -> bool {
        self.carry_out_effects(i);
        self.nodes[i].run.is_some()
    }

    fn carry_out_effects(&mut self, i: usize) {
        let now_ms = self.clock_ms(i);
        let Some(run) = self.nodes[i].run.as_mut() else {
            return;
        };
        let effects = run.member.take_effects();
        // As production's `publish`: the shards' lease window follows every turn.
        run.member.publish_lease_window(now_ms);
        let (is_leader, term) = (run.member.is_leader(), run.member.raft_term());
        let mut members_changed = false;
        for effect in effects {
            match effect {
                Effect::Leader { leader_id } => {
                    self.note(|| format!("m{i} sees leader {leader_id:x} at term {term}"));
                    if is_leader {
                        self.counts.elections += 1;
                        let me = self.nodes[i].id;
                        let previous = *self.leaders_by_term.entry(term).or_insert(me);
                        assert_eq!(
                            previous,
                            me,
                            "election safety: two leaders in term {term}\n{}",
                            self.trace()
                        );
                    }
                }
                Effect::StoreReplaced { reader } => {
                    self.last_published[i] = Some(reader.current_revision());
                    self.nodes[i].run.as_mut().expect("up").reader = reader;
                }
                Effect::Events { revision, events } => self.check_events(i, revision, events),
                // Revisions up to here are left to history reads: the next batch follows them.
                Effect::EventsCut { revision } => self.last_published[i] = Some(revision),
                Effect::RemoveCheckpointsBefore { index } => {
                    self.nodes[i].checkpoints.retain(|k, _| *k >= index);
                }
                Effect::ForwardKeepAlive {
                    to,
                    request_id,
                    lease,
                } => {
                    if let Some(to) = self.index_of(to) {
                        let _ = self.send(i, to, NetMsg::KeepAlive { request_id, lease });
                    }
                }
                Effect::KeepAliveReply {
                    to,
                    request_id,
                    ttl_s,
                } => {
                    if let Some(to) = self.index_of(to) {
                        let _ = self.send(i, to, NetMsg::KeepAliveReply { request_id, ttl_s });
                    }
                }
                Effect::RefuseForwarded {
                    to,
                    refusal,
                    kind,
                    id,
                } => {
                    if let Some(to) = self.index_of(to) {
                        let _ = self.send(i, to, NetMsg::Refused { refusal, kind, id });
                    }
                }
                Effect::Removed => {
                    // Exit 0, as production's process: systemd's Restart=on-failure leaves it
                    // down, so the simulation never restarts it either.
                    let listed = self.nodes[i].run.as_ref().is_some_and(|r| {
                        r.member.members().iter().any(|m| m.id == self.nodes[i].id)
                    });
                    if listed {
                        self.counts.removed_told_by_peer += 1;
                    } else {
                        self.counts.removed_applied_own += 1;
                    }
                    self.exit(i, "removed from the cluster".to_string());
                    self.nodes[i].removed = true;
                    return;
                }
                Effect::MembersChanged => members_changed = true,
                Effect::AlarmsChanged | Effect::HardState { .. } => {}
            }
        }
        if members_changed {
            self.notify_removed(i);
        }
    }

    /// State machine safety: every member's store is at the same revision after the same
    /// raft index.
    fn check_applied(&mut self, i: usize) {
        let Some(run) = self.nodes[i].run.as_ref() else {
            return;
        };
        let index = run.member.applied_index();
        let revision = run.member.writer().current_revision();
        let first = *self.revision_at_index.entry(index).or_insert(revision);
        if first != revision {
            panic!(
                "state machine safety: m{i} is at revision {revision} after index {index}, \
                 another member was at {first}\n{}",
                self.trace()
            );
        }
    }

    /// The watch guarantees, on what member `i` published after applying up to `revision`:
    /// events come in revision order, each revision whole in one batch, none skipped since
    /// the process started (or installed a snapshot); every member publishes the same events
    /// for a revision; and each event's prev_kv is the key's previous version.
    fn check_events(&mut self, i: usize, revision: i64, events: Vec<kv::Event>) {
        let mut by_revision: BTreeMap<i64, Vec<kv::Event>> = BTreeMap::new();
        let mut previous = None;
        for e in &events {
            let rev = e.kv.mod_revision;
            assert!(
                previous.is_none_or(|p| p <= rev),
                "m{i} published events out of revision order: {previous:?} then {rev}\n{}",
                self.trace()
            );
            previous = Some(rev);
            by_revision.entry(rev).or_default().push(e.clone());
        }
        let first = *by_revision.keys().next().expect("a batch has events");
        let last = *by_revision.keys().next_back().expect("a batch has events");
        assert!(
            last <= revision,
            "m{i} published revision {last} past its store's {revision}"
        );
        if let Some(published) = self.last_published[i] {
            assert_eq!(
                first,
                published + 1,
                "m{i} published revision {first} after {published}: a revision skipped or repeated\n{}",
                self.trace()
            );
        }
        self.last_published[i] = Some(last);
        for (rev, same_revision) in by_revision {
            match self.events_at_revision.get(&rev) {
                Some(first_seen) => assert_eq!(
                    first_seen,
                    &same_revision,
                    "m{i} published other events at revision {rev} than another member\n{}",
                    self.trace()
                ),
                None => {
                    self.events_at_revision.insert(rev, same_revision);
                }
            }
        }
        self.advance_model();
    }

    /// Checks prev_kv against the model for the revisions now known in order.
    fn advance_model(&mut self) {
        while let Some(events) = self.events_at_revision.get(&(self.model_revision + 1)) {
            let rev = self.model_revision + 1;
            for e in events {
                let before = self.model.get(&e.kv.key);
                assert_eq!(
                    e.prev_kv.clone().map(kv::PrevKv::checked).as_ref(),
                    before,
                    "prev_kv of {:?} at revision {rev} is not the key's previous version\n{}",
                    e.kv.key,
                    self.trace()
                );
                match e.kind {
                    kv::EventKind::Put => {
                        self.model.insert(e.kv.key.clone(), e.kv.clone());
                    }
                    kv::EventKind::Delete => {
                        self.model.remove(&e.kv.key);
                    }
                }
                self.events_checked += 1;
            }
            self.model_revision = rev;
        }
    }

    pub fn index_of(&self, id: u64) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The members the leader's applied membership lists (voters and learners).
    pub fn membership(&self) -> Option<Vec<MemberInfo>> {
        let leader = self.leader()?;
        Some(self.nodes[leader].run.as_ref()?.member.members().to_vec())
    }

    /// Asks the leader to add a learner, remove a voter, or promote a learner, as
    /// `etcdctl member add --learner / remove / promote` would.
    pub fn change_membership(&mut self) {
        if !self.pending_changes.is_empty() {
            return;
        }
        let (Some(leader), Some(members)) = (self.leader(), self.membership()) else {
            return;
        };
        let voters: Vec<u64> = members
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect();
        let learners: Vec<u64> = members
            .iter()
            .filter(|m| m.is_learner)
            .map(|m| m.id)
            .collect();
        // A learner waiting for promotion is promoted first (retried until caught up).
        let pick = if learners.is_empty() {
            self.rng.gen_range(0..2)
        } else {
            2
        };
        let (change, kind) = match pick {
            0 if self.nodes.len() < self.config.members + 3 && learners.is_empty() => {
                let index = self.nodes.len();
                let change = MemberChange::Add {
                    peer_urls: vec![format!("http://sim-{index}:2380")],
                    learner: true,
                    // Simulated wall-clock seconds, so a seed replays the same ids.
                    added_at_unix_s: 1_700_000_000 + self.now_ms / 1_000,
                };
                (change, ChangeKind::Add { index })
            }
            1 if voters.len() > 3 => {
                let id = voters[self.rng.gen_range(0..voters.len())];
                let Some(index) = self.index_of(id) else {
                    return;
                };
                (MemberChange::Remove { id }, ChangeKind::Remove { index })
            }
            2 if !learners.is_empty() => {
                let id = learners[self.rng.gen_range(0..learners.len())];
                (MemberChange::Promote { id }, ChangeKind::Promote)
            }
            _ => return,
        };
        self.note(|| format!("membership change asked of m{leader}: {kind:?}"));
        let (tx, rx) = oneshot::channel();
        self.nodes[leader]
            .queries
            .push(Query::Member { change, reply: tx });
        self.pending_changes.push(PendingChange { rx, kind });
    }

    /// Members that run although the cluster (its leader's applied membership) no longer lists
    /// them: removed while they could not hear of it, and not yet told by a peer.
    pub fn lingering_removed(&self) -> Vec<usize> {
        let Some(members) = self.membership() else {
            return Vec::new();
        };
        (0..self.nodes.len())
            .filter(|&i| self.is_up(i) && !members.iter().any(|m| m.id == self.nodes[i].id))
            .collect()
    }

    /// Carries out what an operator does after a membership change is applied.
    fn poll_changes(&mut self) {
        let mut still = Vec::new();
        for mut change in std::mem::take(&mut self.pending_changes) {
            match change.rx.try_recv() {
                Ok(None) => still.push(change),
                Ok(Some(Ok((id, members)))) => self.changed(change.kind, id, members),
                Ok(Some(Err(e))) => {
                    self.note(|| format!("membership change {:?} refused: {e:?}", change.kind))
                }
                Err(_) => self.note(|| format!("membership change {:?}: no answer", change.kind)),
            }
        }
        self.pending_changes = still;
    }

    fn changed(&mut self, kind: ChangeKind, id: u64, members: Vec<MemberInfo>) {
        self.note(|| format!("membership change {kind:?} applied: {id:x}"));
        match kind {
            ChangeKind::Add { index } => {
                assert_eq!(index, self.nodes.len(), "one addition at a time");
                let disk_seed = self.rng.gen();
                self.nodes.push(Node {
                    id,
                    start_mode: Start::Joining,
                    initial_members: members,
                    removed: false,
                    disk: SimStore::new(disk_seed),
                    checkpoints: BTreeMap::new(),
                    segments: BTreeMap::new(),
                    disk_faults: SimFaults::default(),
                    run: None,
                    paused_until_ms: 0,
                    skew_ppm: self.rng.gen_range(-50_000..=50_000),
                    proposals: VecDeque::new(),
                    reads: Vec::new(),
                    queries: Vec::new(),
                    why_down: None,
                });
                for row in self.blocked.iter_mut().chain(&mut self.holding) {
                    row.push(false);
                }
                self.blocked.push(vec![false; index + 1]);
                self.holding.push(vec![false; index + 1]);
                self.incarnations.push(0);
                self.notified_removed.push(BTreeSet::new());
                self.last_published.push(None);
                self.start(index).expect("a new member starts");
                self.counts.members_added += 1;
            }
            ChangeKind::Remove { index } => {
                // No operator stops it: the member stops by itself, on applying its removal,
                // or, when it missed that (partitioned away, down), when a peer tells it.
                self.note(|| format!("m{index} was removed; it must stop by itself"));
                self.counts.members_removed += 1;
            }
            ChangeKind::Promote => self.counts.promotions += 1,
        }
    }

    /// Whether every member is up, applied the same index, and one leads.
    pub fn converged(&self) -> bool {
        // The members are those the leader's applied membership lists: a removal whose
        // answer was lost still removed its member.
        let Some(members) = self.membership() else {
            return false;
        };
        let current = self
            .nodes
            .iter()
            .filter(|n| !n.removed && members.iter().any(|m| m.id == n.id));
        let applied: Vec<u64> = current
            .clone()
            .filter_map(|n| n.run.as_ref().map(|r| r.member.applied_index()))
            .collect();
        applied.len() == current.count()
            && applied.windows(2).all(|w| w[0] == w[1])
            && self.nodes.iter().any(|n| {
                n.run
                    .as_ref()
                    .is_some_and(|r| r.member.is_leader() && r.io.is_none())
            })
    }

    /// HashKV at the lowest current revision agrees on every member.
    pub fn check_hashes(&self) {
        let revision = self
            .nodes
            .iter()
            .filter_map(|n| n.run.as_ref().map(|r| r.reader.current_revision()))
            .min()
            .expect("some member is up");
        let hashes: Vec<(usize, u32)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let run = n.run.as_ref()?;
                let (hash, _) = run.reader.hash_kv(revision).ok()?;
                Some((i, hash))
            })
            .collect();
        assert!(
            hashes.windows(2).all(|w| w[0].1 == w[1].1),
            "HashKV at revision {revision} differs between members: {hashes:?}\n{}",
            self.trace()
        );
    }

    /// The leader member's index, if one is up and knows it leads.
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| {
            self.nodes[i]
                .run
                .as_ref()
                .is_some_and(|r| r.member.is_leader())
        })
    }

    pub fn heal_network(&mut self) {
        for row in self.blocked.iter_mut().chain(&mut self.holding) {
            row.iter_mut().for_each(|b| *b = false);
        }
        self.drop_per_million = 0;
        self.dup_per_million = 0;
        self.delay_ms_max = 2;
    }
}

/// The id of founding member `i`, and the prefix of the proposal ids its shards make.
pub fn member_id(i: usize) -> u64 {
    0x1000 + i as u64
}

/// A membership change asked of the leader, and what the operator does once it is applied.
struct PendingChange {
    rx: oneshot::Receiver<Result<(u64, Vec<MemberInfo>), EtcdError>>,
    kind: ChangeKind,
}

#[derive(Debug, Clone, Copy)]
enum ChangeKind {
    /// Start a new member with this node index once its addition is applied.
    Add {
        index: usize,
    },
    /// The removed member, which must stop by itself.
    Remove {
        index: usize,
    },
    Promote,
}

/// Debugging aid (`SIM_DEBUG_WAL=1`): how many records a restart would recover from what is
/// durable on `disk` now, read from a copy so the disk itself is untouched.
fn durable_records(disk: &SimStore, config: &WalConfig) -> usize {
    let copy = SimStore::new(0);
    for seq in disk.segment_seqs() {
        let bytes = disk.durable_bytes(seq);
        block_on(keel_io::SegmentStore::create(
            &copy,
            seq,
            bytes.len() as u64,
        ))
        .expect("a sim segment is created");
        copy.write_durable(seq, 0, &bytes);
    }
    block_on(Wal::open(copy, config.clone())).map_or(0, |(_, records)| records.len())
}
