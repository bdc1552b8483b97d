//! The member as a sans-I/O state machine: raft (`RawNode`), keel-kv's `Writer`, the lease
//! clock, membership, alarms, every waiting call and checkpoint scheduling. It takes inputs
//! (proposals, reads, queries, peer messages, ticks with `now_ms`, I/O completions) and returns
//! outputs (a `ReadyIo` of messages and WAL records, `Effect`s for the driver to carry out, a
//! `CheckpointRequest`). Replies go straight into the oneshot senders the inputs carried: that
//! is memory, not I/O, and works the same under a simulator.
//!
//! The driver's loop (see `raftcore.rs`; a simulator does the same with simulated disks):
//! 1. feed inputs: `step`, `propose`, `read`, `query`, `tick(now_ms)`;
//! 2. `ready(now_ms)` -> send `messages`; write `checkpoint_to_persist` durably (with the
//!    segments a leader streamed beside it, then `snapshot_placed`); append and fdatasync
//!    `wal_records`; send `persisted_messages`; then `persisted(now_ms)`;
//! 3. `checkpoint_due()` -> `checkpoint_request()` (the checkpoint is now in flight), hand it to
//!    a writer that does not hold up this loop, and keep going; when the writer reports back,
//!    between Readies, `checkpoint_written(..)` (then release the WAL before the index it
//!    returns, or remove the file of a checkpoint that was overtaken) or `checkpoint_abandoned`;
//! 4. carry out `take_effects()` after each call.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use keel_grpc::EtcdError;
use keel_io::Record;
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use keel_raft::{
    ConfState, Entry, EntryType, MemStorage, Message, MessageType, ProgressState, RawNode,
    ReadState, Role, Snapshot, SnapshotSent, SnapshotStatus, Storage,
};
use prost::Message as _;

use crate::alarms::{AlarmAction, AlarmMember, Alarms};
use crate::auth::{self, AuthImage, AuthState, TokenTable};
use crate::checkpoint;
use crate::convert;
use crate::error::CoreError;
use crate::ids::Member as MemberInfo;
use crate::member::membership::{self, Plan};
use crate::member::{recovery, LeaseClock, Waiters};
use crate::shared::{
    kv_error, Answer, LeaseStatus, MemberChange, Outcome, Proposal, Query, ReadWait, Reply,
    SnapshotSource, Unserved,
};
use crate::stats::RaftStats;

/// Keys the compactor visits per step, so a step stays well under a millisecond.
pub const COMPACT_KEYS_PER_STEP: usize = 256;
/// The TTL a member that is not the leader answers to a forwarded keep-alive.
pub const KEEPALIVE_NOT_LEADER: i64 = -1;
/// The share of an election timeout within which a leader must have heard from a quorum to
/// renew leases: the rest is margin for members' clocks running at different rates (the
/// simulation skews them by up to 5 % each way).
const LEASE_GUARD_PERCENT: u64 = 80;
/// How often expired auth tokens are swept, on the member's clock.
const TOKEN_SWEEP_INTERVAL_MS: u64 = 1_000;
/// Log entries kept behind a checkpoint for followers that are only slightly behind.
const LOG_TAIL_KEPT_ENTRIES: u64 = 5000;
/// Where the raft log is compacted to after a checkpoint at `index`, while the oldest snapshot
/// being sent to a follower (if any) is at `sending_from`: see `Member::log_compaction_index`.
fn log_compaction_index(index: u64, sending_from: Option<u64>) -> u64 {
    let tail_from = index.saturating_sub(LOG_TAIL_KEPT_ENTRIES);
    match sending_from {
        // The snapshot's own entry stays too: the first append after it names that entry's
        // term, and a log compacted past it cannot (it would send the next snapshot instead).
        Some(snapshot) => tail_from
            .min(snapshot.saturating_sub(1))
            .max(index.saturating_sub(SNAPSHOT_CATCH_UP_ENTRIES_MAX)),
        None => tail_from,
    }
}

/// A full checkpoint after this many deltas: a delta is restored over its base, and the base
/// keeps every segment file it names, dead or not, until a newer full one replaces it.
const DELTAS_PER_FULL: u32 = 7;
/// The most entries the raft log keeps for a follower that is being sent a snapshot (see
/// `Member::log_compaction_index`): about 25 s of a loaded member's writes, or ~275 MB of
/// 1 KiB puts, held only while a snapshot is in flight.
const SNAPSHOT_CATCH_UP_ENTRIES_MAX: u64 = 250_000;
/// A member that applied nothing for this long takes a checkpoint early (see
/// `checkpoint_due`), so a restart after a quiet spell replays almost nothing.
const IDLE_CHECKPOINT_AFTER_MS: u64 = 5_000;
/// ... when at least this share (1/n) of `snapshot_count` entries were applied since the last
/// one: a trickle of writes on a large store does not make a checkpoint of it every few seconds.
const IDLE_CHECKPOINT_SHARE: u64 = 10;
/// Why a removed member stops: etcd's `errMemberRemoved`, word for word, which operators and
/// tools grep for.
pub const MEMBER_REMOVED: &str = "the member has been permanently removed from the cluster";

type MemberReply = futures_channel::oneshot::Sender<Result<(u64, Vec<MemberInfo>), EtcdError>>;
type TransferReply = futures_channel::oneshot::Sender<Result<(), EtcdError>>;
type KeepAliveReply = futures_channel::oneshot::Sender<Result<i64, EtcdError>>;
type DefragReply = futures_channel::oneshot::Sender<Result<u64, EtcdError>>;

/// Why a leader refused a proposal a follower forwarded: the follower answers its client with
/// the matching etcd error at once instead of letting the call time out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Dropped (a leadership transfer in progress, a membership change pending, too much
    /// uncommitted): "too many requests", as a proposal dropped locally.
    Dropped = 1,
    /// The refusing member knows no leader any more.
    NoLeader = 2,
    /// A learner's promotion before it caught up.
    LearnerNotReady = 3,
    /// A membership change the leader's strict reconfiguration check refused: too few
    /// voters it can reach would be left for a quorum.
    Unhealthy = 4,
}

impl Refusal {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Refusal> {
        [
            Refusal::Dropped,
            Refusal::NoLeader,
            Refusal::LearnerNotReady,
            Refusal::Unhealthy,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }

    fn error(self) -> EtcdError {
        match self {
            Refusal::Dropped => EtcdError::TooManyRequests,
            Refusal::NoLeader => EtcdError::NoLeader,
            Refusal::LearnerNotReady => EtcdError::LearnerNotReady,
            Refusal::Unhealthy => EtcdError::Unhealthy,
        }
    }
}

/// Which of the proposing member's waiters a refused proposal answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposalKind {
    /// A client's write, by proposal id.
    Client = 1,
    /// A membership change, by request id.
    Membership = 2,
}

impl ProposalKind {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<ProposalKind> {
        [ProposalKind::Client, ProposalKind::Membership]
            .into_iter()
            .find(|k| k.code() == code)
    }
}

/// What the member needs to know about itself, fixed for its life.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub id: u64,
    /// This member's name and client URLs, published into the membership once a leader is known.
    pub name: String,
    pub advertise_client_urls: Vec<String>,
    /// etcd's request timeout: a call not answered by then gets "request timed out".
    pub request_timeout_ms: u64,
    /// One raft tick (etcd's heartbeat interval).
    pub tick_ms: u64,
    /// Applied entries between checkpoints (etcd's --snapshot-count).
    pub snapshot_count: u64,
    /// Where the member counts its raft and MVCC facts for /metrics (atomics; no I/O).
    pub stats: Arc<RaftStats>,
    /// How long a simple auth token lives after its last use (`--auth-token-ttl`).
    pub auth_token_ttl_ms: u64,
    /// Value-log bytes sealed and not yet durable above which the member takes no new
    /// entries: as leader no new proposals, as follower no new appends (see `values_backlogged`).
    pub sealed_backlog_bytes_max: u64,
    /// Watch events the entries applied from one Ready may hand the hubs
    /// (`limits::WATCH_EVENTS_PER_APPLY_MAX`); past it `Effect::EventsCut` instead.
    pub watch_events_per_apply_max: usize,
    /// Keys one step of an entry applied in steps visits (`limits::APPLY_KEYS_PER_STEP`):
    /// between steps the driver's loop turns (heartbeats, votes, appends).
    pub apply_keys_per_step: usize,
    /// The first id this incarnation gives its ReadIndex rounds, forwarded keep-alives and
    /// membership requests. An answer meant for an earlier incarnation can arrive after a
    /// restart (a leader answering a read or a keep-alive sent just before the crash, over
    /// the new connection; a membership change proposed before it, applied after); were ids
    /// to start over, it would answer a new request: an old read index would serve a stale
    /// read. So each incarnation starts where no earlier one could have reached: the server
    /// takes it from the clock-based id generator, as etcd's request ids; the simulation
    /// from its incarnation count.
    pub ids_first: u64,
    /// Whether the pages of these records (values an entry will read as it is applied: a
    /// txn's value compares, an `ignore_value` put's old value) are in memory: `Some(true)`,
    /// `Some(false)`, or `None` when they lie on more pages than are asked about. The server
    /// asks mincore (`pager::values_resident`); when they are not, the entry waits for the
    /// driver's pager (`take_pages_wanted`), so the raft core never waits for the disk; it
    /// is asked again after each pager round, up to `limits::APPLY_PAGER_ROUNDS_MAX`, unless
    /// the answer is `None`: then one round, as asking again would only say the same. (A
    /// txn whose values the raft core did not list whole, past a step's keys, is not asked:
    /// the pager lists and brings them in, in one round.) A follower needs this most: nothing
    /// brought its copies in, and it wrote them with O_DIRECT. A plain function, so the
    /// member stays free of I/O and clocks.
    pub values_resident: fn(&[Bytes]) -> Option<bool>,
    /// Threads a leader's snapshot's restore may use beside the raft core's, as a restart's
    /// does (`kv::RestoreHelpers`): at 4M keys the restore is over a second of the loop's
    /// time, and it is all skip-list inserts that parts of the key list can share.
    pub install_helpers: InstallHelpers,
    /// etcd's `--strict-reconfig-check` (on by default): membership changes that would leave
    /// the cluster without a quorum of started, reachable voters are refused before they are
    /// proposed (see `reconfig_refusal`).
    pub strict_reconfig_check: bool,
    /// Where the member publishes its auth store and tokens as soon as an entry changes them,
    /// before answering that entry (see `PublishedAuth`): memory the shards read, as `stats`.
    pub published_auth: Arc<crate::shared::PublishedAuth>,
}

/// Helper threads for installing a leader's snapshot (see `MemberConfig::install_helpers`).
#[derive(Debug, Clone, Copy)]
pub struct InstallHelpers {
    /// How many (0: the raft core restores alone, as the simulation does).
    pub threads: usize,
    /// What each runs first: the server moves it off the raft core's CPU, which it would
    /// otherwise share (a thread inherits its creator's affinity). A plain function, so the
    /// member holds no closures and stays `Clone`.
    pub on_start: fn(),
}

impl InstallHelpers {
    pub const NONE: InstallHelpers = InstallHelpers {
        threads: 0,
        on_start: || {},
    };
}

/// What the member asks its driver to do besides the Ready's I/O, in the order it happened.
pub enum Effect {
    /// The applied membership changed: publish `Member::members()` and point the peer
    /// transport at its peer URLs.
    MembersChanged,
    /// The replicated alarms changed: publish `Member::alarms()`.
    AlarmsChanged,
    /// The leader changed (0: none known).
    Leader { leader_id: u64 },
    /// The hard state changed: publish the term and commit index.
    HardState { term: u64, commit: u64 },
    /// Applied writes' events, for the shards' watch hubs, at the store's revision after them.
    Events {
        revision: i64,
        events: Vec<kv::Event>,
    },
    /// Writes applied up to `revision` made more events than one entry may hand the hubs
    /// (`watch_events_per_apply_max`), or were applied with no events wanted
    /// (`set_events_wanted`): none of them is handed out, and every hub's watchers read them
    /// from history.
    EventsCut { revision: i64 },
    /// A leader's snapshot replaced the store: shards read through this reader from now on and
    /// their watchers resynchronize from history.
    StoreReplaced { reader: kv::Reader },
    /// Checkpoint files older than this index may be removed (a newer one is durable).
    RemoveCheckpointsBefore { index: u64 },
    /// Forward a client's keep-alive to the leader; the answer comes back through
    /// `keepalive_reply`.
    ForwardKeepAlive {
        to: u64,
        request_id: u64,
        lease: i64,
    },
    /// Answer a keep-alive a follower forwarded (`KEEPALIVE_NOT_LEADER` when we do not lead).
    KeepAliveReply {
        to: u64,
        request_id: u64,
        ttl_s: i64,
    },
    /// Tell member `to` that we refused a proposal it forwarded (answer through
    /// `forwarded_refused` there).
    RefuseForwarded {
        to: u64,
        refusal: Refusal,
        kind: ProposalKind,
        id: u64,
    },
    /// This member was removed from the cluster (it applied its own removal, or a peer told
    /// it): stop. The process exits 0, as etcd's does (see `node.rs`).
    Removed,
}

/// One Ready's I/O, in the order the driver must carry it out.
#[derive(Default)]
pub struct ReadyIo {
    /// Send at once: appends and heartbeats may go out while our own write is in flight (the
    /// leader's own log counts toward the quorum only after `persisted`).
    pub messages: Vec<Message>,
    /// A leader's snapshot to make durable as a checkpoint file, `(index, file bytes)`, BEFORE
    /// `wal_records` are written: a restart that finds the snapshot record finds its state.
    /// When the file points into value-log segments (the leader's, streamed beside it), the
    /// driver stores them under ids from `Member::segment_id_base` up, gives the file a store
    /// image header that names where the ids moved (`peer_snapshot::IdShift`; kept as it came
    /// where none did), and hands both over with `snapshot_placed`.
    pub checkpoint_to_persist: Option<(u64, Bytes)>,
    /// Append as one batch and fdatasync; empty when nothing needs a sync.
    pub wal_records: Vec<Record>,
    /// Send only after `wal_records` are durable: votes and append responses vouch for them.
    pub persisted_messages: Vec<Message>,
}

/// A checkpoint to write: the MVCC image source and the raft position and membership it
/// belongs to. The file is also the snapshot a far-behind follower receives.
pub struct CheckpointRequest {
    pub index: u64,
    pub term: u64,
    pub conf_state: ConfState,
    pub members: Vec<MemberInfo>,
    /// Ids of members removed from the cluster, ascending.
    pub removed: Vec<u64>,
    pub alarms: Vec<AlarmMember>,
    pub auth: AuthImage,
    pub source: kv::CheckpointSource,
    /// The full checkpoint a delta may be taken against (None: write it full). The writer
    /// says which it wrote (`checkpoint_written`'s `delta_of`).
    pub base: Option<kv::DeltaBase>,
}

impl CheckpointRequest {
    /// The checkpoint file for this request around `kv_image` (its source, serialized): what
    /// every driver's writer puts on disk.
    pub fn encode_file(&self, kv_image: &[u8]) -> Vec<u8> {
        checkpoint::encode(
            self.index,
            self.term,
            &self.conf_state,
            self.cluster(),
            kv_image,
        )
    }

    /// The same file as `encode_file`, as what goes around the image's parts (see
    /// `checkpoint::Framing`): the production writer's form, which copies no image.
    pub fn encode_around(&self, image_parts: &[&[u8]]) -> checkpoint::Framing {
        checkpoint::encode_around(
            self.index,
            self.term,
            &self.conf_state,
            self.cluster(),
            image_parts,
        )
    }

    fn cluster(&self) -> checkpoint::ClusterState<'_> {
        checkpoint::ClusterState {
            members: &self.members,
            alarms: &self.alarms,
            auth: &self.auth,
            removed: &self.removed,
        }
    }
}

/// What a durable checkpoint lets the driver free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointDone {
    /// WAL records before this index may be released.
    pub wal_keep_from: u64,
    /// Checkpoint files older than this index may be removed.
    pub remove_before: u64,
}

/// What the member made of a checkpoint the driver reports durable (`checkpoint_written`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointCompletion {
    /// It is the member's newest checkpoint now: raft's log was compacted behind it; free
    /// what `done` says. `previous_image` is the file raft held as its snapshot before, for
    /// the driver to drop off the raft core: freeing a buffer as large as the store takes tens
    /// of milliseconds (about 80 ms per GB on dev-vm). `compacted_entries` are the log entries
    /// the compaction took out, for the same: a checkpoint's worth of them took 12-45 ms to
    /// free in a 4 GiB load.
    Taken {
        done: CheckpointDone,
        previous_image: Option<Bytes>,
        compacted_entries: Vec<keel_raft::Entry>,
    },
    /// A newer checkpoint (a leader's snapshot, installed while this one was being written)
    /// overtook it: nothing is released, and the driver removes the file of `stale_file_index`
    /// when there is one, as the overtaking install already removed every file before it.
    Overtaken { stale_file_index: Option<u64> },
}

/// A leader's snapshot as the driver made it durable (see `ReadyIo::checkpoint_to_persist`).
pub struct PlacedSnapshot {
    pub index: u64,
    /// The checkpoint file as written: its store image names the segments by their ids here.
    pub data: Bytes,
    /// Each segment the image points into, durable and mapped, by its id here.
    pub files: BTreeMap<u32, Bytes>,
    /// For a delta, the file of the full checkpoint it names, as written here beside it.
    pub base: Option<Bytes>,
}

/// An entry applied over several loop turns (`kv::Writer::apply_in_steps`), with what its
/// completion answers.
struct Stepping {
    steps: kv::ApplyInSteps,
    /// The proposal to answer once it is applied.
    id: u64,
    op: kv::Op,
    /// When its first step ran: the lease countdowns are postponed by how long it took.
    since_ms: u64,
}

/// What the entry next to apply waits for (`Member::take_pages_wanted`): the pages of
/// `records`, and when the raft core's look at its keys stopped short (a txn that compares
/// the values of more keys than a step visits), those of every value `rest` lists, which a
/// pager thread lists, off the raft core.
#[derive(Debug)]
pub struct PagesWanted {
    pub index: u64,
    pub records: Vec<Bytes>,
    pub rest: Option<kv::TxnReads>,
}

/// The entry next to apply, waiting for the pages of the values it reads.
struct PagesWait {
    /// Its raft index.
    index: u64,
    /// What it waits for, until the driver takes it.
    wanted: Option<PagesWanted>,
    /// When it began to wait: the lease countdowns are postponed by how long it took.
    since_ms: u64,
}

/// The watch events of the entries one `apply` call applied (at most
/// `watch_events_per_apply_max`, else `cut` and none).
#[derive(Default)]
struct EventBatch {
    events: Vec<kv::Event>,
    cut: bool,
}

/// The part of a Ready that waits for its I/O (`ready` -> `persisted`).
struct PendingReady {
    snapshot: Option<Snapshot>,
    committed: Option<Vec<Entry>>,
    read_states: Option<Vec<ReadState>>,
}

/// The member's state. See the module comment for how a driver runs it.
pub struct Member {
    config: MemberConfig,
    node: RawNode<MemStorage>,
    writer: kv::Writer,
    /// Value-log segments of replaced stores, and of this one, whose files may go once no kept
    /// checkpoint refers to them (the driver decides when).
    dead_segments: Vec<kv::DeadSegment>,
    /// The lowest segment id of the current store: a completion below it is for a store a
    /// leader's snapshot replaced.
    segments_from: u32,
    members: Vec<MemberInfo>,
    /// Ids of members removed from the cluster (etcd's `members_removed`), changed only by
    /// applied configuration changes and checkpoints (replicated, checkpointed). Their raft
    /// messages are dropped, and the driver's transport tells them they were removed. It grows
    /// by one id per removal, as etcd's does: an id is a few bytes, and removals are an
    /// operator's.
    removed: BTreeSet<u64>,
    /// Set once this member learned it was removed and asked its driver to stop.
    stopping_removed: bool,
    /// The raised alarms, changed only by applied alarm entries (replicated, checkpointed).
    alarms: Alarms,
    /// The auth store, changed only by applied auth entries (replicated, checkpointed); shared
    /// with the shards' published copy, so a change copies it first (`Arc::make_mut`).
    auth: Arc<AuthState>,
    /// This member's live simple tokens (assigned at apply; not checkpointed: a restart
    /// forgets them, as etcd's do).
    auth_tokens: Arc<TokenTable>,
    /// When expired tokens are next swept.
    next_token_sweep_ms: u64,
    /// The current term, as the last hard state said (answers carry it).
    raft_term: u64,
    leader_id: u64,
    is_leader: bool,
    /// This member's name and client URLs are in the applied membership.
    attributes_published: bool,
    /// When the next raft tick is due, on the member's clock.
    next_tick_ms: u64,
    /// Proposals of this member waiting to be applied, by proposal id, with the leader they
    /// went to (this member's own id when it led).
    waiting: Waiters<u64, (Reply, u64)>,
    /// Membership changes waiting to be applied, by request id, with the member concerned.
    member_waiting: Waiters<u64, (MemberReply, u64)>,
    /// Keep-alives forwarded to the leader, by request id.
    keepalive_waiting: Waiters<u64, KeepAliveReply>,
    /// A leadership transfer waiting for the new leader, by that leader's id (at most one).
    transfer_waiting: Waiters<u64, TransferReply>,
    /// Reads waiting for their ReadIndex answer, by context, with the leader the round went to.
    reads_in_round: Waiters<u64, (Vec<ReadWait>, u64)>,
    /// Reads whose ReadIndex is known, waiting for apply to reach it (ascending index).
    reads_to_apply: VecDeque<(u64, Vec<ReadWait>)>,
    /// Physical compactions applied, answered once the compaction has finished.
    physical_waiting: Vec<(Reply, Result<Unserved, EtcdError>)>,
    /// Defragment calls waiting for the value-log rewrite, with the store's size when each asked.
    defrag_waiting: Vec<(DefragReply, u64)>,
    /// When each peer last answered this member's appends or heartbeats in the current term
    /// (the leader's evidence that no other leader can exist, see `quorum_heard_until_ms`,
    /// and of which voters it can reach, see `reach_refusal`).
    heard_from_ms: BTreeMap<u64, u64>,
    /// When the last Ready handed out its messages: an answer stepped now answers a message
    /// sent no later than that. Answers that queued while the raft core stood still are
    /// stamped with it, not with the moment they are stepped, or they would look fresh.
    last_ready_ms: u64,
    /// When each lease expires, by the leader's clock. Only a leader expires leases.
    lease_clock: LeaseClock,
    /// The term in which this member, as leader, had committed an entry of its own and applied
    /// everything committed: from then on its shards may renew leases (see
    /// `publish_lease_window`). 0 when not leading.
    leases_settled_term: u64,
    /// The commit index the messages of the last Ready could carry (raft's, when `ready`
    /// handed them out). While apply trails it, a follower may have applied (and answered)
    /// entries this member has not: the shards' renewal window stays closed.
    commit_handed_out: u64,
    /// No lease is renewed before this (member clock): a leadership transfer began, and its
    /// TimeoutNow lets the target win votes the lease guard counted on, even after raft gave
    /// the transfer up (it may still be on its way). Held an election timeout past the last
    /// moment a transfer was under way.
    renewals_held_until_ms: u64,
    next_read_ctx: u64,
    next_request_id: u64,
    /// The raft index of the newest durable checkpoint (ours or a leader's snapshot).
    last_checkpoint_index: u64,
    /// The oldest checkpoint file the newest one needs: its own index, or a delta's base's.
    last_checkpoint_root: u64,
    /// The newest full checkpoint this member wrote, which its deltas are taken against, and
    /// how many deltas it wrote since. None after a start or a snapshot install (the next
    /// checkpoint is full), and once `full_wanted` is acted on.
    delta_base: Option<kv::DeltaBase>,
    deltas_since_full: u32,
    /// A defragment ran or segments died: a full checkpoint lets the base's dead segment
    /// files go. It is taken once compaction is done, not while reclaim still kills segments:
    /// at 4M keys each full checkpoint during a defragment archived 420 MB (9 s of a CPU),
    /// every `--snapshot-count` entries, beside the rewrites, while a delta holds only the
    /// keys written since its base.
    full_wanted: bool,
    /// For the checkpoint in flight: what it would be as a base, were it written full, and
    /// the base its request named.
    in_flight_bases: Option<(kv::DeltaBase, Option<kv::DeltaBase>)>,
    /// The applied index the last tick saw, and when it last moved, and that tick's time: how
    /// long the member has been quiet (for the idle checkpoint).
    applied_at_tick: u64,
    applied_moved_at_ms: u64,
    last_tick_ms: u64,
    /// The raft index of the checkpoint handed to the driver's writer and not reported back
    /// yet: at most one is in flight, and none is due meanwhile.
    checkpoint_in_flight: Option<u64>,
    pending: Option<PendingReady>,
    /// Committed entries raft handed out and this member has not applied, oldest first: the
    /// rest of a Ready's entries behind one applied in steps. Raft hands out no more until
    /// these are applied (`RawNode::advance_append`), so this holds at most one Ready's.
    to_apply: VecDeque<Entry>,
    /// The entry being applied in steps (a DeleteRange of a range, a lease revoke, a txn that
    /// compares, reads or deletes a range), between loop turns.
    stepping: Option<Stepping>,
    /// The front of `to_apply`, waiting for the pages of values it reads.
    pages_wait: Option<PagesWait>,
    /// The entry whose pages were last brought in, and how many pager rounds it waited for:
    /// residency is asked again after each (pages can be evicted again meanwhile), up to
    /// `limits::APPLY_PAGER_ROUNDS_MAX`, after which the raft core faults them in; a txn the
    /// raft core did not list whole gets one round.
    pages_brought_for: (u64, u32),
    /// The highest index raft handed out that this member has applied (or skipped, as a
    /// snapshot covered it): what it tells raft through `advance_apply_to`.
    applied_through: u64,
    /// Steps taken of entries applied in steps (the driver times each as an apply).
    apply_steps_taken: u64,
    /// Some watcher may want this member's events (the driver says, see `set_events_wanted`).
    events_wanted: bool,
    /// The pending snapshot as the driver placed it, until `persisted` installs it.
    placed: Option<PlacedSnapshot>,
    effects: Vec<Effect>,
    /// The leader last logged (see `log_lifecycle`).
    leader_id_logged: u64,
    role_logged: Option<Role>,
    cluster_version_logged: bool,
}

impl Member {
    /// A member over a recovered raft node and store (see `recovery`), at `last_checkpoint_index`.
    pub fn new(
        config: MemberConfig,
        node: RawNode<MemStorage>,
        writer: kv::Writer,
        members: Vec<MemberInfo>,
        alarms: Alarms,
        last_checkpoint_index: u64,
    ) -> Member {
        assert!(config.tick_ms > 0, "a raft tick takes time");
        assert!(config.id != 0, "member id 0 means none in raft");
        let raft_term = node.store().hard_state().term;
        let ids_first = config.ids_first;
        let mut member = Member {
            config,
            node,
            writer,
            members: Vec::new(),
            removed: BTreeSet::new(),
            stopping_removed: false,
            alarms,
            auth: Arc::new(AuthState::default()),
            auth_tokens: Arc::new(TokenTable::default()),
            next_token_sweep_ms: 0,
            raft_term,
            leader_id: 0,
            is_leader: false,
            attributes_published: false,
            next_tick_ms: 0,
            waiting: Waiters::new(),
            member_waiting: Waiters::new(),
            keepalive_waiting: Waiters::new(),
            transfer_waiting: Waiters::new(),
            reads_in_round: Waiters::new(),
            reads_to_apply: VecDeque::new(),
            physical_waiting: Vec::new(),
            defrag_waiting: Vec::new(),
            heard_from_ms: BTreeMap::new(),
            last_ready_ms: 0,
            lease_clock: LeaseClock::new(),
            leases_settled_term: 0,
            commit_handed_out: 0,
            renewals_held_until_ms: 0,
            next_read_ctx: ids_first,
            next_request_id: ids_first,
            last_checkpoint_index,
            last_checkpoint_root: last_checkpoint_index,
            delta_base: None,
            deltas_since_full: 0,
            full_wanted: false,
            in_flight_bases: None,
            applied_at_tick: 0,
            applied_moved_at_ms: 0,
            last_tick_ms: 0,
            checkpoint_in_flight: None,
            dead_segments: Vec::new(),
            segments_from: 0,
            pending: None,
            to_apply: VecDeque::new(),
            stepping: None,
            pages_wait: None,
            pages_brought_for: (0, 0),
            applied_through: 0,
            apply_steps_taken: 0,
            events_wanted: true,
            placed: None,
            effects: Vec::new(),
            leader_id_logged: 0,
            role_logged: None,
            cluster_version_logged: false,
        };
        member.set_members(members);
        member.effects.push(Effect::AlarmsChanged);
        member.recount_keys();
        member.restore_auth(&AuthImage::default());
        member
    }

    /// Replaces the auth store with a checkpoint's (start, snapshot install). Tokens stay:
    /// a leader's snapshot does not log anyone out, as in etcd.
    pub fn restore_auth(&mut self, image: &AuthImage) {
        self.auth = Arc::new(AuthState::from_image(image));
        self.auth_changed();
    }

    /// Replaces the removed members' ids with a checkpoint's (start). The WAL replayed after it
    /// adds the removals applied since.
    pub fn restore_removed(&mut self, removed: &[u64]) {
        assert!(
            !removed.contains(&0),
            "member id 0 means none in raft, never a removed member"
        );
        self.removed = removed.iter().copied().collect();
        self.effects.push(Effect::MembersChanged);
    }

    /// Starts the clocks at `now_ms`: the first tick is one interval away, every lease gets its
    /// full TTL, and a lone voter campaigns at once (it need not wait an election timeout).
    pub fn start(&mut self, now_ms: u64) {
        self.next_tick_ms = now_ms + self.config.tick_ms;
        if self.node.raft().conf_state().voters == [self.config.id] {
            self.node.campaign();
        }
        self.restart_lease_clocks(now_ms);
    }

    // ---- What the driver reads (published state; the member is its one owner) ----

    pub fn id(&self) -> u64 {
        self.config.id
    }
    pub fn members(&self) -> &[MemberInfo] {
        &self.members
    }
    /// Ids of members removed from the cluster: the transport tells one that dials in (or
    /// sends) that it was removed. Changes come with `Effect::MembersChanged`.
    pub fn removed_members(&self) -> &BTreeSet<u64> {
        &self.removed
    }
    pub fn is_removed(&self, id: u64) -> bool {
        self.removed.contains(&id)
    }
    pub fn alarms(&self) -> &Alarms {
        &self.alarms
    }
    /// The auth store and live tokens, to publish (cheap: two `Arc`s).
    pub fn auth(&self) -> (Arc<AuthState>, Arc<TokenTable>) {
        (self.auth.clone(), self.auth_tokens.clone())
    }
    pub fn leader_id(&self) -> u64 {
        self.leader_id
    }
    pub fn is_leader(&self) -> bool {
        self.is_leader
    }
    pub fn raft_term(&self) -> u64 {
        self.raft_term
    }
    pub fn applied_index(&self) -> u64 {
        self.writer.applied_index()
    }
    pub fn writer(&self) -> &kv::Writer {
        &self.writer
    }

    /// Sealed value-log segments for the driver to write, map and report with
    /// `segment_durable` (only when the store keeps values on disk).
    pub fn take_sealed_segments(&mut self) -> Vec<kv::SealedSegment> {
        self.writer.take_sealed_segments()
    }

    /// Record bytes sealed and not yet durable.
    pub fn sealed_backlog_bytes(&self) -> u64 {
        self.writer.sealed_backlog_bytes()
    }

    /// More values wait for the disk than `sealed_backlog_bytes_max`: until it catches up,
    /// the driver takes no new proposals, and `step` refuses forwarded ones (as leader) and
    /// takes no new entries from a leader (as follower), so the memory they hold stays
    /// bounded whichever member's disk is the slow one. The price: a follower held back does
    /// not acknowledge entries either, so in a three-member cluster one member down and one
    /// with a lagging disk stop writes until the disk catches up.
    pub fn values_backlogged(&self) -> bool {
        self.writer.sealed_backlog_bytes() > self.config.sealed_backlog_bytes_max
    }

    /// A sealed segment is durable and mapped as `file`.
    pub fn segment_durable(&mut self, id: u32, sealed_bytes: u64, file: Bytes) {
        if id < self.segments_from {
            // Sealed by a store a leader's snapshot replaced: it died with that store.
            return;
        }
        self.writer.segment_durable(id, sealed_bytes, file);
    }

    /// Segments whose files may be deleted once the oldest kept checkpoint is past
    /// `died_at_index`.
    pub fn take_dead_segments(&mut self) -> Vec<kv::DeadSegment> {
        let mut dead = std::mem::take(&mut self.dead_segments);
        dead.extend(self.writer.take_dead_segments());
        if !dead.is_empty() {
            // A delta keeps its base, and the base every file it names: the space these
            // free comes back only after a full checkpoint.
            self.full_wanted = true;
        }
        dead
    }
    /// When the next tick is due: the driver may sleep until then when there is no work.
    pub fn next_tick_ms(&self) -> u64 {
        self.next_tick_ms
    }
    /// Whether a Ready or a compaction step is waiting (the driver must not sleep).
    pub fn has_work(&self) -> bool {
        self.node.has_ready() || self.compaction_runnable() || self.apply_runnable()
    }

    /// Whether committed entries wait to be applied in steps (`apply_step`): the driver must
    /// not sleep, and takes no new proposals meanwhile (they wait in its bounded mailbox, as
    /// the entries behind this one wait in raft's log).
    pub fn applying_in_steps(&self) -> bool {
        self.stepping.is_some() || !self.to_apply.is_empty()
    }

    /// Whether `apply_step` has work now: entries wait to be applied, and not for pages.
    pub fn apply_runnable(&self) -> bool {
        self.applying_in_steps() && self.pages_wait.is_none()
    }

    /// Whether the entry next to apply waits for the pages of values it reads (see
    /// `MemberConfig::values_resident`): until `pages_brought_in`, nothing is applied, and
    /// the driver may sleep. (The driver needs only `apply_runnable`.)
    #[cfg(test)]
    pub fn waiting_for_pages(&self) -> bool {
        self.pages_wait.is_some()
    }

    /// The entry that waits for pages (its raft index) and the records whose pages it
    /// reads, once: the driver hands them to its pager, and calls `pages_brought_in` when
    /// the pager is done, or `pages_left_out` at once when it has no room for them.
    pub fn take_pages_wanted(&mut self) -> Option<PagesWanted> {
        self.pages_wait.as_mut()?.wanted.take()
    }

    /// The pages of the entry at `index` are in: it is applied, and the entries behind it,
    /// unless residency, asked again, says they went out meanwhile (another round, up to
    /// `limits::APPLY_PAGER_ROUNDS_MAX`; none for a txn the pager listed itself). A late call, for an entry a snapshot covered
    /// meanwhile, does nothing.
    pub fn pages_brought_in(&mut self, index: u64, now_ms: u64) {
        let rounds = match self.pages_brought_for {
            (brought, rounds) if brought == index => rounds + 1,
            _ => 1,
        };
        self.end_pages_wait(index, rounds, now_ms);
    }

    /// The driver's pager had no room for the pages of the entry at `index`: it is applied
    /// now, faulting them in on the raft core, and the entries behind it.
    pub fn pages_left_out(&mut self, index: u64, now_ms: u64) {
        self.end_pages_wait(index, crate::limits::APPLY_PAGER_ROUNDS_MAX, now_ms);
    }

    fn end_pages_wait(&mut self, index: u64, rounds: u32, now_ms: u64) {
        let Some(wait) = self.pages_wait.take_if(|w| w.index == index) else {
            return;
        };
        // No lease expired meanwhile, as none could be renewed (apply trailed the commit
        // index): their countdowns resume where they stood.
        self.lease_clock
            .postpone(now_ms.saturating_sub(wait.since_ms));
        self.pages_brought_for = (index, rounds.min(crate::limits::APPLY_PAGER_ROUNDS_MAX));
        self.apply(Vec::new(), now_ms);
    }

    /// Whether anyone watches this member's shards, as the driver last saw. Without watchers
    /// entries apply without building their events (a tenth of a put's apply), and the
    /// member answers `Effect::EventsCut` as for events past the bound: a watcher that
    /// arrived meanwhile reads them from history. True until told otherwise.
    pub fn set_events_wanted(&mut self, wanted: bool) {
        self.events_wanted = wanted;
    }

    /// As last set by `set_events_wanted`.
    pub fn events_wanted(&self) -> bool {
        self.events_wanted
    }

    /// Steps taken so far of entries applied in steps.
    pub fn apply_steps_taken(&self) -> u64 {
        self.apply_steps_taken
    }

    /// The next step of the entry being applied in steps, and the entries behind it once it
    /// completes (the driver calls it between Readies while `applying_in_steps`).
    pub fn apply_step(&mut self, now_ms: u64) {
        self.apply(Vec::new(), now_ms);
    }
    pub fn has_ready(&self) -> bool {
        self.node.has_ready()
    }
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    fn not_leader(&self) -> EtcdError {
        if self.leader_id != 0 {
            EtcdError::NotLeader
        } else {
            EtcdError::NoLeader
        }
    }

    fn set_members(&mut self, members: Vec<MemberInfo>) {
        self.attributes_published = membership::attributes_published(
            &members,
            self.config.id,
            &self.config.name,
            &self.config.advertise_client_urls,
        );
        self.members = members;
        self.effects.push(Effect::MembersChanged);
    }

    // ---- Inputs ----

    /// A raft message from a peer, received at `now_ms`. A proposal a follower forwarded that
    /// raft refuses is reported back to that follower, so its client hears at once (see
    /// `Refusal`).
    pub fn step(&mut self, mut m: Message, now_ms: u64) {
        if self.removed.contains(&m.from) {
            // etcd's EtcdServer.Process refuses these too: a removed member's votes or terms
            // must not disturb the cluster it left. The transport tells it it was removed.
            tracing::debug!(
                local_member_id = format!("{:x}", self.config.id),
                removed_member_id = format!("{:x}", m.from),
                "rejected Raft message from removed member"
            );
            return;
        }
        if m.msg_type == MessageType::Append && !m.entries.is_empty() && self.values_backlogged() {
            // Entries applied now would seal more segments for a disk already behind. Unheard,
            // the leader probes again after a heartbeat, which this member still answers, so
            // it stays a follower and catches up once its disk has.
            self.config
                .stats
                .appends_deferred
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if matches!(
            m.msg_type,
            MessageType::AppendResponse | MessageType::HeartbeatResponse
        ) && m.term == self.node.raft().hard_state().term
        {
            // The follower answered this leader's append or heartbeat: it reset its election
            // timer when that arrived, so it votes for no one else for an election timeout
            // from then. That message left no later than the last Ready.
            self.heard_from_ms
                .insert(m.from, now_ms.min(self.last_ready_ms));
        }
        let forwarded =
            m.msg_type == MessageType::Propose && m.from != 0 && m.from != self.config.id;
        if forwarded && self.is_leader && self.values_backlogged() {
            // The driver holds this member's own proposals back while its values wait for the
            // disk; proposals forwarded by followers are held back too, refused at once, so
            // their clients hear "too many requests" and retry, as a client here would.
            for (kind, id) in m.entries.iter().filter_map(proposal_key) {
                self.effects.push(Effect::RefuseForwarded {
                    to: m.from,
                    refusal: Refusal::Dropped,
                    kind,
                    id,
                });
            }
            return;
        }
        if forwarded && self.is_leader && self.config.strict_reconfig_check {
            // A follower checked what it could (the started voters); whether the voters can
            // still be reached is known here, where their answers arrive.
            let before = m.entries.len();
            let from = m.from;
            let mut refused = Vec::new();
            m.entries.retain(|e| {
                let refuse = e.entry_type == EntryType::ConfChange
                    && keel_raft::ConfChange::decode(&e.data)
                        .ok()
                        .and_then(|cc| {
                            self.reach_refusal(&reach_change(&self.members, &cc), now_ms)
                        })
                        .is_some();
                if refuse {
                    refused.extend(proposal_key(e));
                }
                !refuse
            });
            for (kind, id) in refused {
                tracing::warn!(
                    from = format!("{from:x}"),
                    "forwarded membership change refused by the strict reconfiguration check"
                );
                self.effects.push(Effect::RefuseForwarded {
                    to: from,
                    refusal: Refusal::Unhealthy,
                    kind,
                    id,
                });
            }
            if before > 0 && m.entries.is_empty() {
                return;
            }
        }
        // Kept for raft's refusal below, after the filter: a refused change is answered once.
        let forwarded = forwarded.then(|| (m.from, m.entries.clone()));
        let (to, term) = (m.to, m.term);
        let Err(e) = self.node.step(m) else {
            return;
        };
        tracing::debug!(error = %e, "peer message refused");
        let Some((from, entries)) = forwarded else {
            return;
        };
        if entries.len() > 1 {
            // A follower forwards its drained batch in one message, which raft refuses whole
            // and without change. Step its entries one at a time, as if the follower had
            // forwarded each alone, so only those refused alone are reported refused.
            for entry in entries {
                let single = Message {
                    msg_type: MessageType::Propose,
                    from,
                    to,
                    term,
                    entries: vec![entry],
                    ..Message::default()
                };
                self.step(single, now_ms);
            }
            return;
        }
        let refusal = match e {
            keel_raft::Error::LearnerNotCaughtUp(_) => Refusal::LearnerNotReady,
            _ if self.leader_id == 0 => Refusal::NoLeader,
            _ => Refusal::Dropped,
        };
        for (kind, id) in entries.iter().filter_map(proposal_key) {
            self.effects.push(Effect::RefuseForwarded {
                to: from,
                refusal,
                kind,
                id,
            });
        }
    }

    /// The leader refused a proposal of ours that raft forwarded: answer its caller now.
    pub fn forwarded_refused(&mut self, refusal: Refusal, kind: ProposalKind, id: u64) {
        let err = refusal.error();
        match kind {
            ProposalKind::Client => {
                if let Some((reply, _)) = self.waiting.remove(&id) {
                    self.proposal_failed();
                    let _ = reply.send(Err(err));
                }
            }
            ProposalKind::Membership => {
                if let Some((reply, _)) = self.member_waiting.remove(&id) {
                    let _ = reply.send(Err(err));
                }
            }
        }
    }

    /// Peer `by` refused this member's connection or messages because this member was removed
    /// from the cluster while it could not hear of it (partitioned away, or stopped): stop, as
    /// etcd's member does when a peer answers 410 Gone. The member trusts the peer, as etcd
    /// does: the peer passed the cluster-id handshake, and only a member that applied this
    /// member's removal says so.
    pub fn told_removed(&mut self, by: u64) {
        assert_ne!(by, self.config.id, "a member never dials itself");
        if self.stopping_removed {
            return;
        }
        tracing::warn!(
            local_member_id = format!("{:x}", self.config.id),
            remote_peer_id = format!("{by:x}"),
            "peer reported this member removed from the cluster"
        );
        self.stop_removed();
    }

    /// Logs etcd's words for a removed member (etcdserver's "server error" with
    /// `errMemberRemoved`, then the data-dir advice) and asks the driver to stop.
    fn stop_removed(&mut self) {
        assert!(!self.stopping_removed, "a member stops once");
        self.stopping_removed = true;
        tracing::warn!(error = MEMBER_REMOVED, "server error");
        tracing::warn!("data-dir used by this member must be removed");
        self.effects.push(Effect::Removed);
    }

    pub fn report_unreachable(&mut self, id: u64) {
        self.node.report_unreachable(id);
    }

    pub fn report_snapshot(&mut self, sent: SnapshotSent, status: SnapshotStatus) {
        self.node.report_snapshot(sent, status);
    }

    /// Raft ticks due by `now_ms`, then what runs on the tick: lease expiry (leader), call
    /// deadlines, and publishing this member's attributes.
    pub fn tick(&mut self, now_ms: u64) {
        // Every call, due or not: how long the member has been quiet.
        let applied = self.writer.applied_index();
        if applied != self.applied_at_tick {
            self.applied_at_tick = applied;
            self.applied_moved_at_ms = now_ms;
        }
        self.last_tick_ms = now_ms;
        if now_ms < self.next_tick_ms {
            return;
        }
        while now_ms >= self.next_tick_ms {
            self.node.tick();
            self.next_tick_ms += self.config.tick_ms;
        }
        // Once a tick: what the writer deferred is freed within a few ticks of its last use,
        // however idle the member is (see `Writer::release_deferred`).
        self.writer.release_deferred();
        // Not while an entry is applied in steps: no lease can be renewed meanwhile (apply
        // trails the commit index), so none expires either; see `apply`.
        if self.stepping.is_none() && self.pages_wait.is_none() {
            self.expire_leases(now_ms);
        }
        self.expire_waiting(now_ms);
        if now_ms >= self.next_token_sweep_ms {
            self.next_token_sweep_ms = now_ms + TOKEN_SWEEP_INTERVAL_MS;
            // Looked at before copied: the table is shared with the shards, so a change
            // copies it whole, and most sweeps find nothing due. A token seen due may still be
            // kept: a shard that read the clock before this sweep may renew it in between.
            if self.auth_tokens.any_expired(now_ms)
                && Arc::make_mut(&mut self.auth_tokens).expire(now_ms)
            {
                self.auth_changed();
            }
        }
        self.publish_attributes();
    }

    /// A client write. Answered once applied (or at once when raft refuses it).
    pub fn propose(&mut self, p: Proposal, now_ms: u64) {
        match self.node.propose(p.data) {
            Ok(()) => {
                let deadline_ms = now_ms + self.config.request_timeout_ms;
                self.waiting
                    .insert(p.id, (p.reply, self.leader_id), deadline_ms);
            }
            Err(keel_raft::Error::ProposalDropped(why)) => {
                tracing::debug!(why, "proposal dropped");
                let err = if self.leader_id != 0 {
                    EtcdError::TooManyRequests
                } else {
                    EtcdError::NoLeader
                };
                self.proposal_failed();
                let _ = p.reply.send(Err(err));
            }
            Err(e) => {
                tracing::warn!(error = %e, "proposal refused");
                self.proposal_failed();
                let _ = p.reply.send(Err(EtcdError::Stopped));
            }
        }
    }

    /// Client writes drained together, proposed to raft in one call: the leader appends them
    /// with one append message per follower (and one WAL write), and a follower forwards them
    /// in one message, instead of one of each per write. Each write is answered as `propose`
    /// would answer it alone.
    pub fn propose_batch(&mut self, batch: Vec<Proposal>, now_ms: u64) {
        if batch.len() <= 1 {
            for p in batch {
                self.propose(p, now_ms);
            }
            return;
        }
        let last_index_before = self.node.raft().raft_log.last_index();
        let data: Vec<Bytes> = batch.iter().map(|p| p.data.clone()).collect();
        match self.node.propose_batch(data) {
            Ok(()) => {
                let deadline_ms = now_ms + self.config.request_timeout_ms;
                for p in batch {
                    self.waiting
                        .insert(p.id, (p.reply, self.leader_id), deadline_ms);
                }
            }
            Err(e) => {
                // Raft refuses a batch whole (one entry over the message size, the batch over
                // the uncommitted limit, no leader) and changes nothing when it does. Offer
                // the writes one at a time, so those that fit still go and each refused one
                // hears the error it would have heard alone.
                assert_eq!(
                    self.node.raft().raft_log.last_index(),
                    last_index_before,
                    "a refused batch appended nothing"
                );
                tracing::debug!(
                    error = %e,
                    writes = batch.len(),
                    "batch refused; proposing one by one"
                );
                for p in batch {
                    self.propose(p, now_ms);
                }
            }
        }
    }

    /// Linearizable reads that arrived together: one ReadIndex round serves them all.
    pub fn read(&mut self, batch: Vec<ReadWait>, now_ms: u64) {
        if batch.is_empty() {
            return;
        }
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        match self
            .node
            .read_index(Bytes::copy_from_slice(&ctx.to_be_bytes()))
        {
            Ok(()) => {
                let deadline_ms = now_ms + self.config.request_timeout_ms;
                self.reads_in_round
                    .insert(ctx, (batch, self.leader_id), deadline_ms);
            }
            Err(_) => {
                let err = if self.leader_id != 0 {
                    EtcdError::TooManyRequests
                } else {
                    EtcdError::NoLeader
                };
                for r in batch {
                    let _ = r.reply.send(Err(err));
                }
            }
        }
    }

    /// Whether this member's raft core may renew leases now: inside the shards' window (see
    /// `lease_window_until_ms`), after the ticks due by `now_ms` (a leader resumed after a long
    /// pause steps down on them through check-quorum before answering anything), and with
    /// everything committed applied (a committed revoke must not be answered as alive). A
    /// leader that renewed a lease the cluster revokes would tell its client the lease lives
    /// when it is gone.
    fn may_renew_leases(&mut self, now_ms: u64) -> bool {
        self.tick(now_ms);
        now_ms < self.lease_window_until_ms(now_ms)
            && self.writer.applied_index() >= self.node.raft().hard_state().commit
    }

    /// Whether renewals wait for a leadership transfer (under way, or given up less than an
    /// election timeout ago; see `renewals_held_until_ms`).
    fn renewals_held_for_transfer(&mut self, now_ms: u64) -> bool {
        if self.node.raft().lead_transferee().is_some() {
            self.renewals_held_until_ms = self
                .renewals_held_until_ms
                .max(now_ms.saturating_add(self.election_timeout_ms()));
        }
        now_ms < self.renewals_held_until_ms
    }

    fn election_timeout_ms(&self) -> u64 {
        self.node.raft().election_timeout_ticks() as u64 * self.config.tick_ms
    }

    /// Until when this member's shards may renew leases themselves (see
    /// `LeaseDeadlines::renew_here`), or 0 (or a time already past) when they may not. It
    /// must lead, with no transfer under way or just given up; it must have committed an entry
    /// of its own term and applied everything committed before (until then it does not know
    /// what is committed: a previous leader's revoke may sit uncommitted in its log, and
    /// commit right after a renewal, as ReadIndex waits for the same). Once its term is
    /// settled, an entry committed in it is seen by no one until this member sends its commit
    /// index on, in a Ready's messages; so the window closes only while apply trails the
    /// commit index the last Ready's messages could carry (a Ready applies at most
    /// `max_apply_bytes` of what committed). A commit learnt from a peer's answer and not yet
    /// applied, the usual state between two Readys under writes, closes nothing. The window
    /// ends when the quorum's last word is older than the lease guard, so a raft core that
    /// stops turning stops its shards' renewals on time.
    fn lease_window_until_ms(&mut self, now_ms: u64) -> u64 {
        let held = self.renewals_held_for_transfer(now_ms);
        let raft = self.node.raft();
        let hs = raft.hard_state();
        if !self.is_leader || raft.soft_state().role != Role::Leader || held {
            self.leases_settled_term = 0;
            return 0;
        }
        if self.leases_settled_term != hs.term {
            let committed_in_term = self
                .node
                .store()
                .term(hs.commit)
                .is_ok_and(|term| term == hs.term);
            if !committed_in_term || self.writer.applied_index() < hs.commit {
                return 0;
            }
            self.leases_settled_term = hs.term;
        }
        if self.writer.applied_index() < self.commit_handed_out {
            return 0;
        }
        self.quorum_heard_until_ms()
    }

    /// Until when (exclusive) a quorum of voters, this member included, has answered this
    /// leader within the lease guard, if no voter answers again (`u64::MAX` for a lone voter;
    /// 0 or a past time when none has). The guard is an election timeout shrunk by
    /// `LEASE_GUARD_PERCENT`, for clocks that run at different rates. Every member of such a
    /// quorum votes for no one else until its own election timeout passes, and any new leader
    /// needs one of their votes, so no other leader exists before then, and one elected later
    /// restarts every lease countdown at its full TTL. A leader cut off from its quorum (its
    /// check-quorum has not fired yet, or its clock runs slow) stops renewing before a new
    /// leader can exist.
    fn quorum_heard_until_ms(&self) -> u64 {
        let guard_ms = self.election_timeout_ms() * LEASE_GUARD_PERCENT / 100;
        let voters = self.node.raft().conf_state().voters;
        let mut heard_until_ms: Vec<u64> = voters
            .iter()
            .map(|v| {
                if *v == self.config.id {
                    u64::MAX
                } else {
                    self.heard_from_ms
                        .get(v)
                        .map_or(0, |at| at.saturating_add(guard_ms))
                }
            })
            .collect();
        heard_until_ms.sort_unstable_by(|a, b| b.cmp(a));
        // A majority's last word plus the guard is at or after now, until then.
        let quorum = voters.len() / 2 + 1;
        heard_until_ms
            .get(quorum - 1)
            .map_or(0, |until| until.saturating_add(1))
    }

    /// Opens, moves or closes the shards' lease renewal window. The driver calls this after
    /// each turn of its loop (leadership and the quorum's last word move as it steps
    /// messages), and `ready` calls it before handing out messages (a leadership transfer's
    /// among them, and the commit index).
    pub fn publish_lease_window(&mut self, now_ms: u64) {
        let until_ms = self.lease_window_until_ms(now_ms);
        self.lease_clock.set_window(until_ms);
    }

    /// The lease countdowns, shared with the shards' keep-alive path.
    pub fn lease_deadlines(&self) -> Arc<crate::member::lease_clock::LeaseDeadlines> {
        self.lease_clock.deadlines()
    }

    /// A keep-alive a follower forwarded to us.
    pub fn keepalive_from_peer(&mut self, from: u64, request_id: u64, lease: i64, now_ms: u64) {
        let ttl_s = if self.may_renew_leases(now_ms) {
            self.renew_lease(lease, now_ms)
        } else {
            KEEPALIVE_NOT_LEADER
        };
        self.effects.push(Effect::KeepAliveReply {
            to: from,
            request_id,
            ttl_s,
        });
    }

    /// The leader's answer to a keep-alive we forwarded.
    pub fn keepalive_reply(&mut self, request_id: u64, ttl_s: i64) {
        if let Some(reply) = self.keepalive_waiting.remove(&request_id) {
            let _ = reply.send(if ttl_s == KEEPALIVE_NOT_LEADER {
                Err(EtcdError::NotLeader)
            } else {
                Ok(ttl_s)
            });
        }
    }

    /// A shard's query (leases, membership, snapshots, defragment, leadership transfer).
    pub fn query(&mut self, q: Query, now_ms: u64) {
        // Snapshot and Hash capture the store, TimeToLive reads leases' key sets, Defragment
        // starts a compaction: none of them may see an entry half applied.
        assert!(
            !self.applying_in_steps(),
            "queries wait in their mailbox while an entry is applied in steps"
        );
        let not_leader = self.not_leader();
        match q {
            Query::KeepAlive { id, reply } => {
                if self.may_renew_leases(now_ms) {
                    let _ = reply.send(Ok(self.renew_lease(id, now_ms)));
                    return;
                }
                // Only the leader's clock renews leases: forward, as etcd does. A leader that
                // may not renew now (it just lost leadership, or is applying) answers as a
                // member without a leader would; the client's keep-alive loop retries.
                if self.leader_id == 0 || self.leader_id == self.config.id {
                    let _ = reply.send(Err(not_leader));
                    return;
                }
                let request_id = self.next_request_id;
                self.next_request_id += 1;
                self.effects.push(Effect::ForwardKeepAlive {
                    to: self.leader_id,
                    request_id,
                    lease: id,
                });
                let deadline_ms = now_ms + self.config.request_timeout_ms;
                self.keepalive_waiting
                    .insert(request_id, reply, deadline_ms);
            }
            Query::TimeToLive { id, reply } => {
                let status = self.writer.lease(id).map(|l| LeaseStatus {
                    remaining_ttl_s: self.lease_clock.remaining_s(id, now_ms).unwrap_or(l.ttl_s),
                    granted_ttl_s: l.ttl_s,
                    keys: l.keys,
                });
                let _ = reply.send(Ok(status));
            }
            Query::Leases { reply } => {
                let _ = reply.send(Ok(self.leases_by_expiry()));
            }
            Query::Member { change, reply } => self.propose_member_change(change, reply, now_ms),
            Query::Snapshot { reply } => {
                let index = self.writer.applied_index();
                let snapshot = self.node.store().term(index).map(|term| SnapshotSource {
                    source: self.writer.checkpoint_source(),
                    index,
                    term,
                    conf_state: self.node.raft().conf_state(),
                    members: self.members.clone(),
                    removed: self.removed.iter().copied().collect(),
                    alarms: self.alarms.list(),
                    auth: self.auth.image(),
                });
                let _ = reply.send(snapshot.map_err(|_| EtcdError::Unhealthy));
            }
            Query::Defragment { reply } => {
                tracing::info!(size_bytes = self.writer.size_bytes(), "defragment started");
                self.writer.defragment();
                // A full checkpoint once it is done: deltas keep their base, and with it
                // every segment file the base names, however dead.
                self.full_wanted = true;
                self.defrag_waiting.push((reply, self.writer.size_bytes()));
            }
            Query::TransferLeader { to, reply } => {
                if !self.is_leader {
                    let _ = reply.send(Err(not_leader));
                } else if to == self.config.id {
                    let _ = reply.send(Ok(()));
                } else if !self.node.raft().conf_state().voters.contains(&to) {
                    let _ = reply.send(Err(EtcdError::BadLeaderTransferee));
                } else {
                    self.node.transfer_leader(to);
                    // A newer transfer replaces an older one, whose caller sees it dropped.
                    drop(self.transfer_waiting.drain());
                    let deadline_ms = now_ms + self.config.request_timeout_ms;
                    self.transfer_waiting.insert(to, reply, deadline_ms);
                }
            }
        }
    }

    /// Why etcd's strict reconfiguration check refuses `change` now, if it does
    /// (`--strict-reconfig-check`; etcd's `mayAddMember`, `mayRemoveMember`,
    /// `mayPromoteMember`). Two parts:
    /// - the started voters (those that published their names) must keep a quorum, checked
    ///   on the member that takes the call, from its member list;
    /// - the voters that can be reached must keep one (`reach_refusal`). etcd asks each
    ///   member's peer transport, which links every pair of members; Keel's evidence is the
    ///   leader's, so the leader checks its own calls here and the changes followers forward
    ///   in `step`.
    fn reconfig_refusal(&self, change: &MemberChange, now_ms: u64) -> Option<EtcdError> {
        if !self.config.strict_reconfig_check {
            return None;
        }
        let started = match change {
            MemberChange::Add { learner: false, .. } => {
                membership::ready_for_one_more_voter(&self.members, false)
            }
            MemberChange::Remove { id } => {
                !self.members.iter().any(|m| m.id == *id && !m.is_learner)
                    || membership::ready_to_remove_voter(&self.members, *id)
            }
            MemberChange::Promote { .. } => {
                membership::ready_for_one_more_voter(&self.members, true)
            }
            MemberChange::Add { learner: true, .. } | MemberChange::Update { .. } => true,
        };
        if !started {
            return Some(EtcdError::MemberNotEnoughStarted);
        }
        if !self.is_leader {
            return None;
        }
        let reach = match change {
            MemberChange::Add { .. } => ReachChange::Add,
            MemberChange::Remove { id } => ReachChange::Remove(*id),
            MemberChange::Promote { .. } | MemberChange::Update { .. } => ReachChange::Other,
        };
        self.reach_refusal(&reach, now_ms)
    }

    /// The leader's part of the strict reconfiguration check: the voters it heard from within
    /// the last election timeout (answers to its appends or heartbeats) stand for etcd's
    /// connected peers (etcd also asks that each link be 5 s old). An add needs every voter
    /// reachable, or the new voter could raise the quorum with no one to meet it; a removal
    /// of a reachable voter needs those reached, less it, to be a quorum of the voters left.
    /// A voter that cannot be reached is no part of the working quorum and may go.
    fn reach_refusal(&self, change: &ReachChange, now_ms: u64) -> Option<EtcdError> {
        let voters: Vec<u64> = self
            .members
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect();
        let reachable = |id: u64| {
            id == self.config.id
                || self
                    .heard_from_ms
                    .get(&id)
                    .is_some_and(|at| now_ms.saturating_sub(*at) <= self.election_timeout_ms())
        };
        match change {
            ReachChange::Add => {
                (!voters.iter().all(|&v| reachable(v))).then_some(EtcdError::Unhealthy)
            }
            ReachChange::Remove(id) => {
                if !voters.contains(id) || (*id != self.config.id && !reachable(*id)) {
                    return None;
                }
                let reached = voters.iter().filter(|&&v| reachable(v)).count();
                (reached.saturating_sub(1) < 1 + (voters.len() - 1) / 2)
                    .then_some(EtcdError::Unhealthy)
            }
            ReachChange::Other => None,
        }
    }

    fn propose_member_change(&mut self, change: MemberChange, reply: MemberReply, now_ms: u64) {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let deadline_ms = now_ms + self.config.request_timeout_ms;
        // etcd runs its strict check on an add or a removal before it looks at the change
        // itself (which it validates as the change applies), and on a promotion after.
        let refusal = self.reconfig_refusal(&change, now_ms);
        let plan = match refusal {
            Some(refused) if !matches!(change, MemberChange::Promote { .. }) => Err(refused),
            _ => membership::plan(&self.members, &self.removed, &change)
                .and_then(|plan| refusal.map_or(Ok(plan), Err)),
        };
        if let (Some(refused), Err(answered)) = (&refusal, &plan) {
            if refused == answered {
                tracing::warn!(
                    ?change,
                    error = %refused,
                    "membership change refused by the strict reconfiguration check"
                );
            }
        }
        let (change_type, node_id, member) = match plan {
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
            Ok(Plan::Update { id, peer_urls }) => {
                let req = pb::InternalRaftRequest {
                    header: Some(pb::RequestHeader {
                        id: request_id,
                        ..Default::default()
                    }),
                    keel_member_update: Some(pb::MemberUpdateRequest {
                        id,
                        peer_ur_ls: peer_urls,
                    }),
                    ..Default::default()
                };
                match self.node.propose(Bytes::from(req.encode_to_vec())) {
                    Ok(()) => self
                        .member_waiting
                        .insert(request_id, (reply, id), deadline_ms),
                    Err(_) => {
                        let _ = reply.send(Err(EtcdError::NoLeader));
                    }
                }
                return;
            }
            Ok(Plan::ConfChange {
                change_type,
                node_id,
                member,
            }) => (change_type, node_id, member),
        };
        let cc = membership::conf_change(change_type, node_id, member, request_id);
        match self.node.propose_conf_change(&cc) {
            Ok(()) => self
                .member_waiting
                .insert(request_id, (reply, node_id), deadline_ms),
            Err(keel_raft::Error::LearnerNotCaughtUp(_)) => {
                let _ = reply.send(Err(EtcdError::LearnerNotReady));
            }
            Err(keel_raft::Error::ConfChangePending) => {
                let _ = reply.send(Err(EtcdError::TooManyRequests));
            }
            Err(e) => {
                tracing::warn!(error = %e, "membership change refused");
                let _ = reply.send(Err(self.not_leader()));
            }
        }
    }

    /// Calls that waited longer than etcd's request timeout get "request timed out".
    fn expire_waiting(&mut self, now_ms: u64) {
        for (reply, _) in self.waiting.expire(now_ms) {
            self.proposal_failed();
            let _ = reply.send(Err(EtcdError::Timeout));
        }
        for (reply, _) in self.member_waiting.expire(now_ms) {
            let _ = reply.send(Err(EtcdError::Timeout));
        }
        for reply in self.keepalive_waiting.expire(now_ms) {
            let _ = reply.send(Err(EtcdError::Timeout));
        }
        for reply in self.transfer_waiting.expire(now_ms) {
            let _ = reply.send(Err(EtcdError::Timeout));
        }
        for (waits, _) in self.reads_in_round.expire(now_ms) {
            RaftStats::count(&self.config.stats.read_indexes_failed, 1);
            for w in waits {
                let _ = w.reply.send(Err(EtcdError::Timeout));
            }
        }
    }

    /// A new leader is known: the calls that went to another leader are answered now instead
    /// of at their deadline, so their clients retry at once (a dead leader never answers, and
    /// a write that waits out the request timeout keeps its client from making the next one).
    /// A write's outcome is then unknown, exactly as after a timeout: the old leader may have
    /// replicated it and the new one may commit it, so the answer is etcd's "request timed
    /// out, possibly due to previous leader failure". A read round is answered as etcd
    /// answers it, "leader changed"; nothing about it is uncertain.
    fn fail_calls_sent_to_another_leader(&mut self, leader_id: u64) {
        for (reply, _) in self.waiting.take_where(|(_, to)| *to != leader_id) {
            self.proposal_failed();
            let _ = reply.send(Err(EtcdError::TimeoutDueToLeaderFail));
        }
        for waits in self.reads_in_round.take_where(|(_, to)| *to != leader_id) {
            RaftStats::count(&self.config.stats.read_indexes_failed, 1);
            for w in waits.0 {
                let _ = w.reply.send(Err(EtcdError::LeaderChanged));
            }
        }
    }

    /// Once a leader is known, a member makes sure the cluster knows its name and client URLs
    /// (MemberList reports them; etcdctl dials them), as etcd publishes its attributes.
    fn publish_attributes(&mut self) {
        if self.attributes_published
            || self.leader_id == 0
            || self.node.raft().soft_state().leader_id == 0
        {
            return;
        }
        let me = self.config.id;
        if !self.members.iter().any(|m| m.id == me) {
            return;
        }
        let req = pb::InternalRaftRequest {
            header: Some(pb::RequestHeader::default()),
            keel_member_attributes: Some(pb::MemberAttributes {
                id: me,
                name: self.config.name.clone(),
                client_urls: self.config.advertise_client_urls.clone(),
            }),
            ..Default::default()
        };
        if self.node.propose(Bytes::from(req.encode_to_vec())).is_ok() {
            // Assume it lands; the membership apply re-arms this if it did not.
            self.attributes_published = true;
        }
    }

    /// Logs role and leader changes in etcd's raft words ("became leader at term", "elected
    /// leader"), and, when a leader first becomes known, the cluster version lines etcd logs at
    /// that point: Keel's cluster version is fixed, so it is set and its capabilities enabled
    /// as soon as the cluster can take writes.
    fn log_lifecycle(&mut self, role: Role, leader_id: u64, previous_leader: u64) {
        let id = self.config.id;
        let term = self.node.status().hard_state.term;
        let role_changed = self.role_logged != Some(role);
        self.role_logged = Some(role);
        match role {
            _ if !role_changed => {}
            Role::Leader => tracing::info!("{id:x} became leader at term {term}"),
            Role::Follower => tracing::info!("{id:x} became follower at term {term}"),
            Role::Candidate => tracing::info!("{id:x} became candidate at term {term}"),
            Role::PreCandidate => tracing::info!("{id:x} became pre-candidate at term {term}"),
        }
        if leader_id != previous_leader {
            match (previous_leader, leader_id) {
                (_, 0) => tracing::info!(
                    "raft.node: {id:x} lost leader {previous_leader:x} at term {term}"
                ),
                (0, _) => tracing::info!(
                    "raft.node: {id:x} elected leader {leader_id:x} at term {term}"
                ),
                _ => tracing::info!(
                    "raft.node: {id:x} changed leader from {previous_leader:x} to {leader_id:x} at term {term}"
                ),
            }
        }
        if leader_id != 0 && !self.cluster_version_logged {
            self.cluster_version_logged = true;
            let version = crate::service::ETCD_CLUSTER_VERSION
                .rsplit_once('.')
                .map_or(crate::service::ETCD_CLUSTER_VERSION, |(v, _)| v);
            tracing::info!(
                cluster_version = version,
                "set the initial cluster version to {version}"
            );
            tracing::info!(
                cluster_version = version,
                "enabled capabilities for version {version}"
            );
        }
    }

    /// Every lease's countdown restarts from its full TTL: on start and when this member becomes
    /// leader, as etcd does, since the old leader's clock is gone.
    fn restart_lease_clocks(&mut self, now_ms: u64) {
        let leases = self.writer.leases().into_iter().map(|l| (l.id, l.ttl_s));
        self.lease_clock.restart(leases, now_ms);
    }

    /// Every lease's id, the soonest to expire on this member's clock first, as etcd's
    /// `LeaseLeases` lists them (its lessor sorts by expiry). A lease without a countdown
    /// would come last; ties go by id, so the order is the same on every call.
    fn leases_by_expiry(&self) -> Vec<i64> {
        let mut leases: Vec<(u64, i64)> = self
            .writer
            .lease_ids()
            .map(|id| (self.lease_clock.deadline_ms(id).unwrap_or(u64::MAX), id))
            .collect();
        leases.sort_unstable();
        leases.into_iter().map(|(_, id)| id).collect()
    }

    /// Restarts a lease's countdown (leader only); its TTL, or 0 when the lease is unknown or
    /// already expired (its revoke is due or on its way through the log: renewing it would
    /// tell the client it lives just before it is revoked).
    fn renew_lease(&mut self, id: i64, now_ms: u64) -> i64 {
        if self.lease_clock.has_expired(id, now_ms) {
            return 0;
        }
        match self.writer.lease(id) {
            Some(l) => {
                self.lease_clock.renew(id, l.ttl_s, now_ms);
                l.ttl_s
            }
            None => 0,
        }
    }

    /// Proposes a revoke for every lease past its deadline (leader only).
    fn expire_leases(&mut self, now_ms: u64) {
        // Both raft's own role and `is_leader`: `is_leader` changes at the next Ready, so a
        // leader deposed by a message it just stepped, or by the ticks of a long pause, would
        // otherwise propose revokes from its stale lease clock and, as a follower, forward
        // them to the new leader, which commits them; and a member raft just made leader has
        // not yet restarted its lease clocks (that happens at the Ready that reports it), so
        // its old deadlines must not revoke anything either (both found by the simulation).
        if !self.is_leader || self.node.raft().soft_state().role != Role::Leader {
            return;
        }
        for id in self.lease_clock.expired(now_ms) {
            let req = pb::InternalRaftRequest {
                header: Some(pb::RequestHeader::default()),
                lease_revoke: Some(pb::LeaseRevokeRequest { id }),
                ..Default::default()
            };
            match self.node.propose(Bytes::from(req.encode_to_vec())) {
                Ok(()) => {
                    tracing::debug!(lease = id, "lease expired; revoke proposed");
                    self.lease_clock.revoke_proposed(id, now_ms);
                }
                Err(e) => {
                    tracing::warn!(lease = id, error = %e, "cannot propose the revoke of an expired lease")
                }
            }
        }
    }

    // ---- The Ready protocol ----

    /// Takes raft's Ready: applies what was already durable, and returns the I/O this Ready
    /// needs. The driver carries it out in `ReadyIo`'s field order, then calls `persisted`.
    /// None when raft has nothing ready.
    pub fn ready(&mut self, now_ms: u64) -> Option<ReadyIo> {
        assert!(self.pending.is_none(), "ready() again before persisted()");
        if !self.node.has_ready() {
            return None;
        }
        let rd = self.node.ready();
        if let Some(ss) = rd.soft_state {
            // etcd counts a change each time a leader other than the last one becomes known.
            if ss.leader_id != 0 && ss.leader_id != self.leader_id {
                RaftStats::count(&self.config.stats.leader_changes_seen, 1);
            }
            self.leader_id = ss.leader_id;

            self.effects.push(Effect::Leader {
                leader_id: ss.leader_id,
            });
            let was_leader = self.is_leader;
            let had_leader = self.leader_id_logged;
            self.is_leader = ss.role == Role::Leader;
            self.log_lifecycle(ss.role, ss.leader_id, had_leader);
            self.leader_id_logged = ss.leader_id;
            if self.is_leader && !was_leader {
                // Answers to an earlier leadership prove nothing about this one.
                self.heard_from_ms.clear();
                self.restart_lease_clocks(now_ms);
            }
            // Publish our name and client URLs as soon as there is a leader to take them.
            if ss.leader_id != 0 {
                self.publish_attributes();
            }
            if let Some(reply) = self.transfer_waiting.remove(&ss.leader_id) {
                let _ = reply.send(Ok(()));
            }
            if ss.leader_id != 0 {
                self.fail_calls_sent_to_another_leader(ss.leader_id);
            }
            tracing::info!(leader = format!("{:x}", ss.leader_id), role = ?ss.role, "raft role changed");
        }

        // Entries committed earlier are already durable here: apply them (and answer their
        // callers) now, before this Ready's own write, so a batch's replies never wait for the
        // next batch's fdatasync. A snapshot must be installed first, so then they wait.
        let mut committed = Some(rd.committed_entries);
        let mut read_states = Some(rd.read_states);
        if rd.snapshot.is_none() {
            self.apply(committed.take().unwrap_or_default(), now_ms);
            self.note_read_states(read_states.take().unwrap_or_default());
        }
        let records = recovery::ready_records(
            rd.snapshot.as_ref().map(|s| &s.metadata),
            &rd.entries,
            rd.hard_state.as_ref(),
            rd.durability,
            self.node.store().last_index(),
        );
        if !rd.entries.is_empty() {
            // The log keeps each entry's data as a slice of its WAL record (an entry's data
            // ends its record), all of a Ready's in one buffer: the proposals' own buffers,
            // each allocated on the shard that proposed it, are freed when this Ready is
            // done, while still cached, instead of one by one on another thread after the
            // next checkpoint (1.1-1.4 % of a put load's server CPU), and the shards reuse
            // their memory instead of faulting in fresh pages for it.
            // What it keeps alive: each Ready's buffer until the compaction that takes its last
            // entry; a Ready is bounded by the raft limits on uncommitted bytes, and its
            // other records (hard state, a snapshot's metadata) are a few bytes.
            let data = records
                .iter()
                .filter(|r| r.kind == recovery::WAL_KIND_ENTRY)
                .map(|record| {
                    let entry = keel_raft::Entry::decode_shared(&record.payload)
                        .expect("a record this member just encoded decodes");
                    (entry.index, entry.data)
                });
            self.node.share_in_flight_entry_data(data);
        }
        if let Some(hs) = &rd.hard_state {
            self.raft_term = hs.term;
            self.effects.push(Effect::HardState {
                term: hs.term,
                commit: hs.commit,
            });
        }
        let checkpoint_to_persist = rd
            .snapshot
            .as_ref()
            .filter(|s| !s.data.is_empty())
            .map(|s| (s.metadata.index, s.data.clone()));
        self.pending = Some(PendingReady {
            snapshot: rd.snapshot,
            committed,
            read_states,
        });
        // Before any of this Ready's messages leave: a transfer's TimeoutNow among them ends
        // the lease guard, and a commit index past what this member applied lets followers
        // apply (and answer) entries it has not, so the shards stop renewing first.
        self.commit_handed_out = self.node.raft().hard_state().commit;
        self.last_ready_ms = now_ms;
        self.publish_lease_window(now_ms);
        Some(ReadyIo {
            messages: rd.messages,
            checkpoint_to_persist,
            wal_records: records,
            persisted_messages: rd.persisted_messages,
        })
    }

    /// The lowest value-log segment id a leader's snapshot's segments may be stored under
    /// (see `ReadyIo::checkpoint_to_persist`): above every id this member's stores used, so
    /// that no file of theirs is ever replaced. Or 0 while the store has only ever had its
    /// first open segment, id 0: the member started with no segment file on disk (a start
    /// begins above every file it finds) and sealed none since, so no id of this member's has
    /// a file or will get one. The leader's segments then keep their ids and its checkpoint
    /// files are kept as they came, with no shift in their headers (see
    /// `peer_snapshot::IdShift`). This is a new member's first snapshot.
    pub fn segment_id_base(&self) -> u32 {
        if self.writer.segment_ids() == [0] {
            return 0;
        }
        self.writer.successor_value_log().first_segment_id
    }

    /// The pending Ready's snapshot is durable as `placed` says (its segments stored under
    /// this member's ids, its file naming them so): `persisted` installs that form, and raft
    /// keeps it as the snapshot this member sends on.
    pub fn snapshot_placed(&mut self, placed: PlacedSnapshot) {
        let pending_index = self
            .pending
            .as_ref()
            .and_then(|p| p.snapshot.as_ref())
            .map(|s| s.metadata.index);
        assert_eq!(
            pending_index,
            Some(placed.index),
            "a snapshot is placed between the ready() that returned it and persisted()"
        );
        assert!(
            placed.files.keys().all(|id| *id >= self.segment_id_base()),
            "a leader's segments are stored from this member's segment id base up"
        );
        self.placed = Some(placed);
    }

    /// The last Ready's checkpoint and WAL records are durable and its persisted messages sent:
    /// advance raft, install the snapshot, apply what committed.
    pub fn persisted(&mut self, now_ms: u64) -> Result<(), CoreError> {
        let pending = self
            .pending
            .take()
            .expect("persisted() follows a ready() that returned I/O");
        // Raft learns what was applied from `apply` (`advance_apply_to`): an entry applied in
        // steps is not, until its last step.
        self.node.advance_append();
        if let Some(mut snap) = pending.snapshot {
            let mut files = BTreeMap::new();
            let mut base = None;
            if let Some(placed) = self.placed.take() {
                // Raft keeps the placed form: the file as this member stored it, naming the ids
                // its segments have here.
                self.node
                    .store_mut()
                    .replace_snapshot_data(placed.index, placed.data.clone());
                snap.data = placed.data;
                files = placed.files;
                base = placed.base;
            }
            self.install_snapshot(snap, files, base, now_ms)?;
        }
        if let Some(entries) = pending.committed {
            self.apply(entries, now_ms);
        }
        if let Some(rs) = pending.read_states {
            self.note_read_states(rs);
        }
        Ok(())
    }

    /// The records of values `op` reads as it is applied (a txn's value compares, an
    /// `ignore_value` put's old value), when their pages are not in memory and the entry has
    /// not waited for its last pager round already. A txn's keys are looked at up to a
    /// step's worth (`apply_keys_per_step`): a value compare of a million keys is not walked
    /// here in one go. Past that the pager lists the rest itself, in one round, and does not
    /// ask whether they are in memory first: on a member whose shard did not propose the
    /// txn, nothing brought them in.
    fn values_to_bring_in(&self, index: u64, op: Option<&kv::Op>) -> Option<PagesWanted> {
        if self.pages_brought_for == (index, crate::limits::APPLY_PAGER_ROUNDS_MAX) {
            return None;
        }
        let (records, rest) = match op? {
            kv::Op::Txn(t) => {
                let reader = self.writer.reader();
                let (records, whole) =
                    reader.records_txn_reads_within(t, self.config.apply_keys_per_step);
                if whole {
                    (records, None)
                } else if self.pages_brought_for.0 == index {
                    // The pager listed and brought in the rest once: apply.
                    return None;
                } else {
                    (records, Some(reader.txn_reads_of(t.clone())))
                }
            }
            kv::Op::Put(p) if p.ignore_value => (self.writer.reader().records_put_reads(p), None),
            _ => return None,
        };
        if rest.is_none() {
            if records.is_empty() {
                return None;
            }
            match (self.config.values_resident)(&records) {
                Some(true) => return None,
                // Too many pages to ask about: the pager brought them in once.
                None if self.pages_brought_for.0 == index => return None,
                Some(false) | None => {}
            }
        }
        Some(PagesWanted {
            index,
            records,
            rest,
        })
    }

    fn note_read_states(&mut self, read_states: Vec<ReadState>) {
        for rs in read_states {
            let ctx = u64::from_be_bytes(
                rs.context
                    .as_ref()
                    .try_into()
                    .expect("read contexts are 8 bytes we made"),
            );
            if let Some((waits, _)) = self.reads_in_round.remove(&ctx) {
                self.reads_to_apply.push_back((rs.index, waits));
            }
        }
        self.answer_reads();
    }

    fn answer_reads(&mut self) {
        let applied = self.writer.applied_index();
        while let Some((index, _)) = self.reads_to_apply.front() {
            if *index > applied {
                break;
            }
            let (_, waits) = self.reads_to_apply.pop_front().expect("front exists");
            for w in waits {
                let _ = w.reply.send(Ok(()));
            }
        }
    }

    /// Replaces the store with a leader's snapshot (already durable as a checkpoint), whose
    /// image points into `files` (the leader's segments, stored here) or holds its values.
    fn install_snapshot(
        &mut self,
        snap: Snapshot,
        files: BTreeMap<u32, Bytes>,
        base: Option<Bytes>,
        now_ms: u64,
    ) -> Result<(), CoreError> {
        let index = snap.metadata.index;
        // An entry being applied in steps, and those behind it, are covered by the snapshot
        // (raft installs one only past its commit): the half-applied store is dropped whole.
        // Its caller, as any whose entry a snapshot covered, hears at its deadline.
        assert!(
            self.to_apply.back().is_none_or(|e| e.index <= index)
                && self
                    .stepping
                    .as_ref()
                    .is_none_or(|s| s.steps.raft_index() <= index),
            "a snapshot covers every entry handed out before it"
        );
        self.to_apply.clear();
        self.stepping = None;
        self.pages_wait = None;
        self.applied_through = self.applied_through.max(index);
        if snap.data.is_empty() {
            // The bootstrap snapshot: an empty store whose membership is in the metadata.
            let members = membership::from_conf_state(&self.members, &snap.metadata.conf_state);
            self.set_members(members);
            return Ok(());
        }
        let cp = checkpoint::decode_shared(&snap.data)
            .map_err(|why| CoreError::Raft(format!("leader sent a bad snapshot: {why}")))?;
        // A delta comes with its base, which the driver wrote beside it.
        let base_cp = base
            .map(|file| checkpoint::decode_shared(&file))
            .transpose()
            .map_err(|why| CoreError::Raft(format!("leader sent a bad snapshot base: {why}")))?;
        let root = base_cp.as_ref().map_or(index, |b| b.meta.index);
        // The image points into the leader's segments, which the driver stored from
        // `segment_id_base` up (no file of the old store's has one of those ids); the new
        // store's own segments start above them.
        let (writer, reader) = kv::Store::restore_on_base(
            &cp.kv_image,
            base_cp.as_ref().map(|b| &b.kv_image[..]),
            self.writer.successor_value_log(),
            &mut |id| {
                files.get(&id).cloned().ok_or_else(|| {
                    format!(
                        "a leader's snapshot refers to segment {id}, which did not come with it"
                    )
                })
            },
            kv::RestoreHelpers {
                threads: self.config.install_helpers.threads,
                on_start: &self.config.install_helpers.on_start,
            },
        )
        .map_err(|e| CoreError::Store(e.to_string()))?;
        drop(base_cp);
        assert_eq!(
            writer.applied_index(),
            index,
            "a snapshot's store is at the snapshot's index"
        );
        // Every segment of the replaced store dies now; its files go once no kept checkpoint
        // refers to them. Not an id the leader's segments kept (`segment_id_base` was 0):
        // the replaced store never had a file under it, and the file there now is the new
        // store's.
        let mut old = std::mem::replace(&mut self.writer, writer);
        let died = old
            .take_dead_segments()
            .into_iter()
            .chain(old.segment_ids().into_iter().map(|id| kv::DeadSegment {
                id,
                died_at_index: index,
            }));
        self.dead_segments
            .extend(died.filter(|dead| !files.contains_key(&dead.id)));
        // Sealed segments not handed out yet are never written; ones being written are ignored
        // when they complete (they are below `segments_from`).
        drop(old.take_sealed_segments());
        self.segments_from = self.writer.segment_ids()[0];
        // Counted by the restore: a count here walked every key on the raft core.
        self.config.stats.keys.store(
            i64::try_from(self.writer.live_keys_restored()).expect("keys fit in i64"),
            Ordering::Relaxed,
        );
        self.effects.push(Effect::StoreReplaced { reader });
        self.removed = cp.removed.iter().copied().collect();
        self.set_members(cp.members);
        self.alarms = Alarms::from_list(&cp.alarms);
        self.effects.push(Effect::AlarmsChanged);
        self.restore_auth(&cp.auth);
        // A checkpoint still in flight is older than this snapshot (raft installs only a
        // snapshot past its commit, and ours are at most at the applied index): when it
        // completes, `checkpoint_written` discards it.
        self.last_checkpoint_index = index;
        self.last_checkpoint_root = root;
        self.delta_base = None;
        self.deltas_since_full = 0;
        self.restart_lease_clocks(now_ms);
        self.effects
            .push(Effect::RemoveCheckpointsBefore { index: root });
        tracing::info!(index, "installed the leader's snapshot");
        Ok(())
    }

    /// Applies committed entries in index order, answering their callers, and tells raft how
    /// far it got. An entry whose op may write without limit (a DeleteRange of a range, a lease
    /// revoke, a txn that compares, reads or deletes a range) is applied in steps of
    /// `apply_keys_per_step` keys,
    /// one per call: it and the
    /// entries behind it wait in `to_apply` while the driver's loop turns, and `apply_step`
    /// goes on.
    fn apply(&mut self, entries: Vec<Entry>, now_ms: u64) {
        self.to_apply.extend(entries);
        let mut batch = EventBatch::default();
        if let Some(Stepping {
            steps,
            id,
            op,
            since_ms,
        }) = self.stepping.take()
        {
            let index = steps.raft_index();
            self.apply_steps_taken += 1;
            match self
                .writer
                .apply_step(steps, self.config.apply_keys_per_step)
            {
                kv::Progress::More(steps) => {
                    self.stepping = Some(Stepping {
                        steps,
                        id,
                        op,
                        since_ms,
                    })
                }
                kv::Progress::Done(result) => {
                    // No lease expired meanwhile, and none could be renewed (apply trailed
                    // the commit index): their countdowns resume where they stood.
                    self.lease_clock.postpone(now_ms.saturating_sub(since_ms));
                    let result = result.map_err(kv_error);
                    if result.is_ok() {
                        self.lease_applied(&op, now_ms);
                    }
                    self.answer_applied(result, id, false, &mut batch);
                    self.applied_through = index;
                }
            }
        }
        // Entries at the front of `to_apply` whose keys were hinted to the writer.
        let mut hinted = 0usize;
        while self.stepping.is_none() && self.pages_wait.is_none() {
            if hinted == 0 {
                hinted = self.hint_keys();
            }
            let Some(e) = self.to_apply.pop_front() else {
                break;
            };
            hinted = hinted.saturating_sub(1);
            let index = e.index;
            if self.apply_entry(e, &mut batch, now_ms) {
                self.applied_through = index;
            }
        }
        if batch.cut {
            self.effects.push(Effect::EventsCut {
                revision: self.writer.current_revision(),
            });
        } else if !batch.events.is_empty() {
            self.effects.push(Effect::Events {
                revision: self.writer.current_revision(),
                events: batch.events,
            });
        }
        self.node.advance_apply_to(self.applied_through);
        self.answer_reads();
    }

    /// Hints to the writer the keys the next `HINT_ENTRIES` entries will look up, so that
    /// their index nodes load into the cache together rather than one miss after another
    /// within each apply; answers how many entries it covered.
    fn hint_keys(&self) -> usize {
        /// Entries hinted at once: enough for their misses to overlap, few enough that the
        /// first entry's lines are still cached when it is applied.
        const HINT_ENTRIES: usize = 32;
        if self.to_apply.len() < 2 {
            // One entry's misses have nothing to overlap with: the hint would only add its
            // own cost (a light load's every apply).
            return self.to_apply.len();
        }
        // Keys, not entries: most entries are single puts, each one key.
        let mut keys = Vec::with_capacity(HINT_ENTRIES);
        let mut covered = 0;
        for e in self.to_apply.iter().take(HINT_ENTRIES) {
            covered += 1;
            if e.entry_type == EntryType::Normal {
                super::hint::entry_keys(&e.data, &mut keys);
            }
        }
        if !keys.is_empty() {
            self.writer.prefetch_keys(&keys);
        }
        covered
    }

    /// Applies one committed entry, or begins applying it in steps (then false: it is not
    /// applied yet, and `stepping` holds it), or puts it back at the front of `to_apply` to
    /// wait for the pages of values it reads (then false, and `pages_wait` says so).
    fn apply_entry(&mut self, e: Entry, batch: &mut EventBatch, now_ms: u64) -> bool {
        let term = self.raft_term;
        if e.index <= self.writer.applied_index() {
            // Already in the store (a snapshot covered it).
            return true;
        }
        match e.entry_type {
            EntryType::ConfChange => {
                self.apply_conf_change(&e);
                self.writer.apply_empty(e.index);
            }
            EntryType::Normal if e.data.is_empty() => self.writer.apply_empty(e.index),
            EntryType::Normal => {
                let req = pb::InternalRaftRequest::decode(e.data.clone()).expect(
                    "log entries are InternalRaftRequests a member encoded and checksummed",
                );
                let id = req.header.as_ref().map_or(req.id, |h| h.id);
                if req.keel_member_attributes.is_some() || req.keel_member_update.is_some() {
                    self.apply_member_request(req, id);
                    self.writer.apply_empty(e.index);
                    return true;
                }
                if let Some(alarm) = req.alarm {
                    let result = match AlarmAction::from_pb(alarm.action) {
                        Some(action) => {
                            let listed = self.alarms.apply(action, alarm.member_id, alarm.alarm);
                            self.effects.push(Effect::AlarmsChanged);
                            Ok(Outcome {
                                response: Answer::Alarms(listed),
                                raft_term: term,
                            })
                        }
                        None => Err(EtcdError::NotCapable),
                    };
                    self.writer.apply_empty(e.index);
                    if let Some((reply, _)) = self.waiting.remove(&id) {
                        let _ = reply.send(result);
                    }
                    return true;
                }
                if auth::apply::is_auth_request(&req) {
                    let result = self.apply_auth(&req, e.index, now_ms);
                    self.writer.apply_empty(e.index);
                    if let Some((reply, _)) = self.waiting.remove(&id) {
                        let _ = reply.send(result.map(|reply| Outcome {
                            response: Answer::Auth {
                                reply,
                                revision: self.writer.current_revision(),
                            },
                            raft_term: term,
                        }));
                    }
                    return true;
                }
                let who = auth::apply::header_info(&req);
                let op = request_op(req);
                if let Some(wanted) = self.values_to_bring_in(e.index, op.as_ref()) {
                    self.pages_wait = Some(PagesWait {
                        index: e.index,
                        wanted: Some(wanted),
                        since_ms: now_ms,
                    });
                    self.to_apply.push_front(e);
                    return false;
                }
                let physical = matches!(&op, Some(kv::Op::Compact(c)) if c.physical);
                // Under a raised alarm some writes are refused at apply, from the replicated
                // alarm set, so every member refuses the same entries. Then a client's write
                // needs its user's permissions as the auth store is at this index (the
                // member's own entries, id 0, act as root).
                let refusal = op.as_ref().and_then(|op| {
                    self.alarms.refusal(op).or_else(|| {
                        if id == 0 {
                            return None;
                        }
                        let writer = &self.writer;
                        let lease_keys =
                            |lease: i64| writer.lease(lease).map(|l| l.keys).unwrap_or_default();
                        auth::apply::check_op(&self.auth, &who, op, &lease_keys).err()
                    })
                });
                let result = match op {
                    Some(_) if refusal.is_some() => {
                        self.writer.apply_empty(e.index);
                        Err(refusal.expect("checked by the guard"))
                    }
                    Some(op) => {
                        // The bound holds for the whole call's events: what earlier entries
                        // gathered counts, and once cut nothing more is gathered.
                        let events_left = if batch.cut || !self.events_wanted {
                            0
                        } else {
                            self.config
                                .watch_events_per_apply_max
                                .saturating_sub(batch.events.len())
                        };
                        match self.writer.apply_in_steps(
                            e.index,
                            &op,
                            events_left,
                            self.config.apply_keys_per_step,
                        ) {
                            kv::Progress::More(steps) => {
                                self.apply_steps_taken += 1;
                                self.stepping = Some(Stepping {
                                    steps,
                                    id,
                                    op,
                                    since_ms: now_ms,
                                });
                                return false;
                            }
                            kv::Progress::Done(r) => {
                                let r = r.map_err(kv_error);
                                if r.is_ok() {
                                    self.lease_applied(&op, now_ms);
                                }
                                r
                            }
                        }
                    }
                    None => {
                        self.writer.apply_empty(e.index);
                        Err(EtcdError::NotCapable)
                    }
                };
                self.answer_applied(result, id, physical, batch);
            }
        }
        true
    }

    /// Counts an applied kv op's writes, gathers its events and answers its caller.
    fn answer_applied(
        &mut self,
        result: Result<kv::Applied, EtcdError>,
        id: u64,
        physical: bool,
        batch: &mut EventBatch,
    ) {
        let term = self.raft_term;
        let result = result.map(|applied| {
            self.count_writes(applied.counts);
            if applied.events_cut && !batch.cut {
                batch.cut = true;
                batch.events = Vec::new();
            }
            if !batch.cut {
                batch.events.extend(applied.events);
            }
            Outcome {
                response: Answer::Op(applied.response),
                raft_term: term,
            }
        });
        if let Some((reply, _)) = self.waiting.remove(&id) {
            if physical && result.is_ok() && self.writer.compaction_pending() {
                // etcd answers a physical compaction once it has finished.
                self.physical_waiting.push((reply, result));
            } else {
                let _ = reply.send(result);
            }
        }
    }

    fn apply_conf_change(&mut self, e: &Entry) {
        let cc = match keel_raft::ConfChange::decode(&e.data) {
            Ok(cc) => cc,
            Err(err) => {
                tracing::error!(index = e.index, error = %err, "undecodable configuration change skipped");
                return;
            }
        };
        let cs = self.node.apply_conf_change(&cc);
        let (members, ctx) = membership::after_conf_change(&self.members, &cc, &cs);
        self.removed = membership::removed_after_conf_change(&self.removed, &cc);
        tracing::info!(change = ?cc.change_type, node = format!("{:x}", cc.node_id), voters = cs.voters.len(), learners = cs.learners.len(), "membership changed");
        self.set_members(members);
        if let Some(ctx) = ctx {
            if let Some((reply, node)) = self.member_waiting.remove(&ctx.request_id) {
                let _ = reply.send(Ok((node, self.members.clone())));
            }
        }
        if cc.change_type == keel_raft::ConfChangeType::RemoveNode
            && cc.node_id == self.config.id
            && !self.stopping_removed
        {
            tracing::warn!("this member applied its own removal from the cluster");
            self.stop_removed();
        }
    }

    /// Applies an auth entry to the store and this member's tokens.
    fn apply_auth(
        &mut self,
        req: &pb::InternalRaftRequest,
        index: u64,
        now_ms: u64,
    ) -> Result<auth::AuthReply, EtcdError> {
        // Change copies of the published Arcs, and only when something changes: most auth
        // entries (Get, List, refusals) change nothing.
        let mut state = (*self.auth).clone();
        let mut tokens = (*self.auth_tokens).clone();
        let ttl_ms = self.config.auth_token_ttl_ms;
        let (result, changed) =
            auth::apply::apply(&mut state, &mut tokens, req, index, now_ms, ttl_ms);
        if changed.state {
            self.auth = Arc::new(state);
        }
        if changed.tokens {
            self.auth_tokens = Arc::new(tokens);
        }
        if changed.state || changed.tokens {
            self.auth_changed();
        }
        result
    }

    /// The auth store or the tokens changed: published at once, before the entry that changed
    /// them is answered (see `PublishedAuth`). The shards read it there; no effect goes to
    /// the driver.
    fn auth_changed(&mut self) {
        self.config
            .published_auth
            .publish(self.auth.clone(), self.auth_tokens.clone());
    }

    fn apply_member_request(&mut self, req: pb::InternalRaftRequest, request_id: u64) {
        let attributes = req
            .keel_member_attributes
            .map(|a| (a.id, a.name, a.client_urls));
        let update = req.keel_member_update.map(|u| (u.id, u.peer_ur_ls));
        let own = attributes
            .as_ref()
            .is_some_and(|(id, _, _)| *id == self.config.id);
        let (members, updated) =
            membership::after_member_request(&self.members, attributes, update);
        if own {
            // etcd's words (etcdserver.publish), which operators and tools grep for.
            tracing::info!(
                local_member_id = format!("{:x}", self.config.id),
                name = %self.config.name,
                client_urls = ?self.config.advertise_client_urls,
                "published local member to cluster through raft"
            );
        }
        self.set_members(members);
        if let Some((reply, node)) = self.member_waiting.remove(&request_id) {
            let _ = reply.send(match updated {
                Some(Ok(())) => Ok((node, self.members.clone())),
                Some(Err(e)) => Err(e),
                None => Err(EtcdError::MemberNotFound),
            });
        }
    }

    fn lease_applied(&mut self, op: &kv::Op, now_ms: u64) {
        match op {
            kv::Op::LeaseGrant(g) => self.lease_clock.start(g.id, g.ttl_s, now_ms),
            kv::Op::LeaseRevoke(r) => self.lease_clock.forget(r.id),
            _ => {}
        }
    }

    // ---- Compaction, between batches ----

    /// Whether a compaction step may run now: work is pending, and the values its reclaim
    /// rewrites are not piling up for the disk. Past half of `sealed_backlog_bytes_max` it
    /// waits for the value-log writer, so background rewrites never push the backlog to the
    /// bound that holds client writes: after a compaction that freed half of 1 GiB, unpaced
    /// rewrites held puts for up to a second at a time (p99 750 ms at 1,000 puts/s).
    pub fn compaction_runnable(&self) -> bool {
        self.stepping.is_none()
            && self.writer.compaction_pending()
            && self.writer.sealed_backlog_bytes() <= self.config.sealed_backlog_bytes_max / 2
    }

    /// One bounded compaction step, when one may run (`compaction_runnable`; between batches,
    /// so compaction never pauses the member for long); `answer_compaction_waiters` answers
    /// its callers once done.
    pub fn compact_step(&mut self) {
        if self.compaction_runnable() {
            self.writer.compact_step(COMPACT_KEYS_PER_STEP);
        }
    }

    /// Answers the calls that waited for compaction to finish, once it has.
    pub fn answer_compaction_waiters(&mut self) {
        if self.writer.compaction_pending() {
            return;
        }
        for (reply, result) in self.physical_waiting.drain(..) {
            let _ = reply.send(result);
        }
        for (reply, size_before) in self.defrag_waiting.drain(..) {
            let size_after = self.writer.size_bytes();
            let freed_bytes = size_before.saturating_sub(size_after);
            tracing::info!(freed_bytes, size_bytes = size_after, "defragment finished");
            let _ = reply.send(Ok(freed_bytes));
        }
    }

    // ---- Checkpoints ----

    /// Enough entries applied since the newest checkpoint that the next one is due (etcd's
    /// `appliedi - snapi > snapshot-count`), and none is in flight. Also due early once the
    /// member has been quiet for `IDLE_CHECKPOINT_AFTER_MS` with a tenth of that applied since
    /// the last: a restart after a quiet spell then replays almost nothing, where it would
    /// replay up to `snapshot-count` entries, each applied again and its value appended to the
    /// value log again.
    pub fn checkpoint_due(&self) -> bool {
        let since = self
            .writer
            .applied_index()
            .saturating_sub(self.last_checkpoint_index);
        let quiet = self.applied_at_tick == self.writer.applied_index()
            && self.last_tick_ms.saturating_sub(self.applied_moved_at_ms)
                >= IDLE_CHECKPOINT_AFTER_MS;
        // Not while an entry is half applied: its store has changed lease tables that an
        // image would copy.
        self.checkpoint_in_flight.is_none()
            && self.stepping.is_none()
            && (since >= self.config.snapshot_count
                || (quiet
                    && since > 0
                    && since >= self.config.snapshot_count / IDLE_CHECKPOINT_SHARE))
    }

    /// Whether anything was applied since the last checkpoint (worth one at shutdown).
    pub fn applied_past_checkpoint(&self) -> bool {
        self.writer.applied_index() > self.last_checkpoint_index
    }

    /// The raft index of the checkpoint in flight (requested, not reported back yet).
    pub fn checkpoint_in_flight(&self) -> Option<u64> {
        self.checkpoint_in_flight
    }

    /// The checkpoint to write at the applied index, or None when the last one covers it; a
    /// returned request is in flight until `checkpoint_written` or `checkpoint_abandoned`.
    /// Capturing the image source takes microseconds; serializing and writing it is the
    /// driver's writer's (off the raft core, so the member keeps applying meanwhile: no
    /// stop-the-world pause). The image is of the store at exactly this index: versions
    /// applied later are past its revision and left out.
    pub fn checkpoint_request(&mut self) -> Result<Option<CheckpointRequest>, CoreError> {
        assert!(
            self.checkpoint_in_flight.is_none(),
            "checkpoint {:?} is still in flight: one at a time",
            self.checkpoint_in_flight
        );
        let index = self.writer.applied_index();
        if index == 0 || index <= self.last_checkpoint_index {
            return Ok(None);
        }
        let term = self
            .node
            .store()
            .term(index)
            .map_err(|e| CoreError::Raft(e.to_string()))?;
        if self.full_wanted && !self.writer.compaction_pending() {
            // Until a full checkpoint is written (this one, or a later one if this one is
            // abandoned), every checkpoint is full.
            self.delta_base = None;
            self.full_wanted = false;
        }
        let base = self
            .delta_base
            .filter(|_| self.deltas_since_full < DELTAS_PER_FULL);
        // Names the keys written since `base`, so a delta reads only theirs; and whatever
        // it is written as, this checkpoint may become the next base.
        let source = self.writer.checkpoint_source_against(base.as_ref());
        assert_eq!(source.applied_index(), index, "the image is at the index");
        self.checkpoint_in_flight = Some(index);
        self.in_flight_bases = Some((source.delta_base(), base));
        Ok(Some(CheckpointRequest {
            index,
            term,
            conf_state: self.node.raft().conf_state(),
            members: self.members.clone(),
            removed: self.removed.iter().copied().collect(),
            alarms: self.alarms.list(),
            auth: self.auth.image(),
            source,
            base,
        }))
    }

    /// The newest checkpoint at start is at `root` or needs the file there (a delta's base):
    /// files from `root` on stay until a newer checkpoint no longer needs them.
    pub fn set_checkpoint_root(&mut self, root: u64) {
        assert!(
            root <= self.last_checkpoint_index,
            "a checkpoint's base is older than it"
        );
        self.last_checkpoint_root = root;
    }

    /// The checkpoint in flight, file `file` for `index` (with `conf_state`), is durable. When
    /// it is still newer than the newest checkpoint, raft's log may drop what it covers and the
    /// returned bounds say what the driver may free; the previous checkpoint stays, with the
    /// WAL after it, so a damaged newest file can still be recovered from (restart falls back
    /// to the older one and replays more). When a leader's snapshot overtook it meanwhile, it
    /// is discarded. Call it between Readies (not between `ready` and `persisted`).
    /// `delta_of` is the base's index when the writer wrote a delta.
    pub fn checkpoint_written(
        &mut self,
        index: u64,
        conf_state: ConfState,
        file: Bytes,
        delta_of: Option<u64>,
    ) -> Result<CheckpointCompletion, CoreError> {
        assert_eq!(
            self.checkpoint_in_flight,
            Some(index),
            "only the checkpoint in flight completes"
        );
        assert!(
            self.pending.is_none(),
            "a checkpoint completes between Readies"
        );
        self.checkpoint_in_flight = None;
        let (as_base, named_base) = self
            .in_flight_bases
            .take()
            .expect("captured with the request");
        if index <= self.last_checkpoint_index {
            tracing::info!(
                index,
                newest = self.last_checkpoint_index,
                "checkpoint overtaken by a leader's snapshot; discarded"
            );
            // The same index would be the same state under the same file name: keep it then.
            let stale_file_index = (index < self.last_checkpoint_index).then_some(index);
            return Ok(CheckpointCompletion::Overtaken { stale_file_index });
        }
        let previous = self.last_checkpoint_index;
        let previous_root = self.last_checkpoint_root;
        self.last_checkpoint_index = index;
        match delta_of {
            None => {
                // Compaction may now remove keys deleted at or before this one's revision:
                // no later delta is taken against an older base.
                self.writer.set_delta_base_revision(as_base.revision());
                self.delta_base = Some(as_base);
                self.deltas_since_full = 0;
                self.last_checkpoint_root = index;
            }
            Some(base_index) => {
                assert_eq!(
                    named_base.map(|b| b.applied_index()),
                    Some(base_index),
                    "a delta is taken against the base its request named"
                );
                self.deltas_since_full += 1;
                self.last_checkpoint_root = base_index;
            }
        }
        let compact_to = self.log_compaction_index(index);
        let storage = self.node.store_mut();
        let previous_image = storage
            .snapshot()
            .ok()
            .map(|s| s.data)
            .filter(|data| !data.is_empty());
        storage
            .create_snapshot(index, conf_state, file)
            .map_err(|e| CoreError::Raft(e.to_string()))?;
        // Already compacted that far (a snapshot installed meanwhile): nothing to take out.
        let compacted_entries = if compact_to > 0 {
            storage.compact(compact_to).unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(CheckpointCompletion::Taken {
            done: CheckpointDone {
                wal_keep_from: previous.min(index.saturating_sub(LOG_TAIL_KEPT_ENTRIES)) + 1,
                // The previous checkpoint stays (a restart falls back to it), with its base,
                // and so does the new one's base.
                remove_before: previous_root.min(self.last_checkpoint_root),
            },
            previous_image,
            compacted_entries,
        })
    }

    /// Where the raft log is compacted to once the checkpoint at `index` is durable: the last
    /// `LOG_TAIL_KEPT_ENTRIES` entries stay for followers a little behind, and while a follower
    /// is being sent a snapshot, so do the entries after that snapshot, up to
    /// `SNAPSHOT_CATCH_UP_ENTRIES_MAX`. Without them the follower, once it installed the
    /// snapshot, would need the next whole one: at 4M keys a second 4.7 GB snapshot, sent
    /// because the leader took a checkpoint during the 25 s the first one took.
    fn log_compaction_index(&self, index: u64) -> u64 {
        let raft = self.node.raft();
        let conf = raft.conf_state();
        let sending_from = conf
            .voters
            .iter()
            .chain(conf.learners.iter())
            .filter_map(|id| raft.progress(*id))
            .filter(|pr| pr.state == ProgressState::Snapshot && pr.pending_snapshot > 0)
            .map(|pr| pr.pending_snapshot)
            .min();
        log_compaction_index(index, sending_from)
    }

    /// The checkpoint in flight at `index` was not written: its image could not be taken (a
    /// compaction started after the capture and trimmed what it read). Nothing changes but
    /// that none is in flight; the next one is due at once and captures afresh.
    pub fn checkpoint_abandoned(&mut self, index: u64) {
        self.in_flight_bases = None;
        assert_eq!(
            self.checkpoint_in_flight,
            Some(index),
            "only the checkpoint in flight is abandoned"
        );
        self.checkpoint_in_flight = None;
    }

    // ---- Stopping ----

    /// Answers every waiting call with `err` (the member is stopping).
    /// Client proposals taken into raft and not answered yet (`etcd_server_proposals_pending`).
    pub fn proposals_pending(&self) -> usize {
        self.waiting.len()
    }

    fn proposal_failed(&self) {
        RaftStats::count(&self.config.stats.proposals_failed, 1);
    }

    /// Counts what applied writes did, as etcd's mvcc counters do: each key put, each key
    /// deleted, and the live keys (a new key is one at version 1; a delete removes one).
    fn count_writes(&self, counts: kv::WriteCounts) {
        let stats = &self.config.stats;
        RaftStats::count(&stats.puts, counts.puts);
        RaftStats::count(&stats.deletes, counts.deletes);
        stats.keys.fetch_add(
            counts.created as i64 - counts.deletes as i64,
            Ordering::Relaxed,
        );
    }

    /// Sets the live-key gauge from the store itself, at start (the WAL replayed after the
    /// restore changed it; a leader's snapshot installed takes the restore's own count).
    fn recount_keys(&self) {
        let all = kv::RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            count_only: true,
            ..Default::default()
        };
        let count = self.writer.reader().range(&all).map_or(0, |r| r.count);
        self.config.stats.keys.store(count, Ordering::Relaxed);
    }

    pub fn fail_all_waiting(&mut self, err: EtcdError) {
        for (reply, _) in self.physical_waiting.drain(..) {
            let _ = reply.send(Err(err));
        }
        for (reply, _) in self.defrag_waiting.drain(..) {
            let _ = reply.send(Err(err));
        }
        for (reply, _) in self.waiting.drain() {
            self.proposal_failed();
            let _ = reply.send(Err(err));
        }
        for (reply, _) in self.member_waiting.drain() {
            let _ = reply.send(Err(err));
        }
        for reply in self.transfer_waiting.drain() {
            let _ = reply.send(Err(err));
        }
        for (waits, _) in self.reads_in_round.drain() {
            for w in waits {
                let _ = w.reply.send(Err(err));
            }
        }
        for (_, waits) in self.reads_to_apply.drain(..) {
            for w in waits {
                let _ = w.reply.send(Err(err));
            }
        }
    }
}

/// A membership change as the leader's reachability check sees it (`Member::reach_refusal`).
enum ReachChange {
    /// A voter or a learner: etcd checks both the same way.
    Add,
    Remove(u64),
    /// A promotion or a peer-URL change: etcd checks no reachability for them.
    Other,
}

/// What a proposed ConfChange does, against the members it would change: an AddNode of a
/// listed learner is its promotion.
fn reach_change(members: &[crate::ids::Member], cc: &keel_raft::ConfChange) -> ReachChange {
    match cc.change_type {
        keel_raft::ConfChangeType::AddNode
            if members.iter().any(|m| m.id == cc.node_id && m.is_learner) =>
        {
            ReachChange::Other
        }
        keel_raft::ConfChangeType::AddNode | keel_raft::ConfChangeType::AddLearnerNode => {
            ReachChange::Add
        }
        keel_raft::ConfChangeType::RemoveNode => ReachChange::Remove(cc.node_id),
    }
}

/// Which waiter on the proposing member an entry answers, and its id; None for entries no
/// call waits on (lease revokes, attributes: id 0) or that do not decode.
fn proposal_key(e: &Entry) -> Option<(ProposalKind, u64)> {
    match e.entry_type {
        EntryType::ConfChange => {
            let cc = keel_raft::ConfChange::decode(&e.data).ok()?;
            let ctx: membership::ConfChangeContext = serde_json::from_slice(&cc.context).ok()?;
            Some((ProposalKind::Membership, ctx.request_id))
        }
        EntryType::Normal => {
            let req = pb::InternalRaftRequest::decode(e.data.clone()).ok()?;
            let id = req.header.as_ref().map_or(req.id, |h| h.id);
            if id == 0 {
                return None;
            }
            let kind = if req.keel_member_update.is_some() || req.keel_member_attributes.is_some() {
                ProposalKind::Membership
            } else {
                ProposalKind::Client
            };
            Some((kind, id))
        }
    }
}

/// The MVCC operation an entry carries (None for requests this member cannot apply).
fn request_op(req: pb::InternalRaftRequest) -> Option<kv::Op> {
    if let Some(r) = req.put {
        return Some(kv::Op::Put(convert::put_request(r)));
    }
    if let Some(r) = req.delete_range {
        return Some(kv::Op::DeleteRange(convert::delete_request(r)));
    }
    if let Some(r) = req.txn {
        return Some(kv::Op::Txn(convert::txn_request(r)));
    }
    if let Some(r) = req.compaction {
        return Some(kv::Op::Compact(kv::CompactionRequest {
            revision: r.revision,
            physical: r.physical,
        }));
    }
    if let Some(r) = req.lease_grant {
        return Some(kv::Op::LeaseGrant(kv::LeaseGrantRequest {
            id: r.id,
            ttl_s: r.ttl,
        }));
    }
    if let Some(r) = req.lease_revoke {
        return Some(kv::Op::LeaseRevoke(kv::LeaseRevokeRequest { id: r.id }));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::APPLY_KEYS_PER_STEP;
    use crate::member::recovery::WAL_KIND_ENTRY;
    use futures_channel::oneshot;
    use keel_raft::MemStorage;

    const TICK_MS: u64 = 100;
    const REQUEST_TIMEOUT_MS: u64 = 7_000;

    /// A founding single-voter member, as `raftcore::open` builds one on an empty data dir.
    fn single() -> Member {
        single_with(kv::Store::new().0)
    }

    /// `single`, over this store.
    fn single_with(writer: kv::Writer) -> Member {
        let storage = MemStorage::new_with_voters(&[1]);
        let mut rc = keel_raft::Config::new(1);
        rc.heartbeat_tick = 1;
        rc.applied = 1;
        rc.seed = 1;
        let node = RawNode::new(&rc, storage).expect("a valid raft configuration");
        let members = vec![MemberInfo {
            id: 1,
            name: "one".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec!["http://127.0.0.1:2379".into()],
            is_learner: false,
        }];
        let config = MemberConfig {
            id: 1,
            name: "one".into(),
            advertise_client_urls: vec!["http://127.0.0.1:2379".into()],
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            tick_ms: TICK_MS,
            snapshot_count: 10_000,
            stats: Arc::default(),
            auth_token_ttl_ms: 300_000,
            sealed_backlog_bytes_max: crate::limits::SEALED_BACKLOG_BYTES_MAX,
            watch_events_per_apply_max: crate::limits::WATCH_EVENTS_PER_APPLY_MAX,
            apply_keys_per_step: crate::limits::APPLY_KEYS_PER_STEP,
            ids_first: 1,
            values_resident: |_| Some(true),
            install_helpers: InstallHelpers::NONE,
            strict_reconfig_check: true,
            published_auth: Arc::default(),
        };
        Member::new(config, node, writer, members, Alarms::default(), 1)
    }

    /// Carries out every Ready at `now_ms` with a WAL that syncs at once; returns the records.
    fn settle(m: &mut Member, now_ms: u64) -> Vec<Record> {
        let mut written = Vec::new();
        while let Some(io) = m.ready(now_ms) {
            assert!(io.checkpoint_to_persist.is_none(), "no snapshots here");
            written.extend(io.wal_records);
            m.persisted(now_ms).expect("nothing to install");
        }
        written
    }

    fn started_leader() -> Member {
        started(single())
    }

    fn started(mut m: Member) -> Member {
        m.start(0);
        settle(&mut m, 0);
        assert!(m.is_leader(), "a lone voter leads at once");
        assert_eq!(m.leader_id(), 1);
        m
    }

    /// The revisions of the `EventsCut` effects among `effects`.
    fn cut_revisions(effects: &[Effect]) -> Vec<i64> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::EventsCut { revision } => Some(*revision),
                _ => None,
            })
            .collect()
    }

    fn proposal(
        id: u64,
        req: pb::InternalRaftRequest,
    ) -> (Proposal, oneshot::Receiver<Result<Unserved, EtcdError>>) {
        let (reply, rx) = oneshot::channel();
        let mut req = req;
        req.header = Some(pb::RequestHeader {
            id,
            ..Default::default()
        });
        let p = Proposal {
            data: Bytes::from(req.encode_to_vec()),
            id,
            reply: reply.into(),
        };
        (p, rx)
    }

    /// A put of `value_bytes` to key `k<id>`, as proposal `id`.
    fn sized_put(
        id: u64,
        value_bytes: usize,
    ) -> (Proposal, oneshot::Receiver<Result<Unserved, EtcdError>>) {
        proposal(
            id,
            pb::InternalRaftRequest {
                put: Some(pb::PutRequest {
                    key: Bytes::from(format!("k{id:05}")),
                    value: Bytes::from(vec![b'v'; value_bytes]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    }

    /// A logical compaction at `revision`, as proposal `id`.
    fn compaction(
        id: u64,
        revision: i64,
    ) -> (Proposal, oneshot::Receiver<Result<Unserved, EtcdError>>) {
        proposal(
            id,
            pb::InternalRaftRequest {
                compaction: Some(pb::CompactionRequest {
                    revision,
                    physical: false,
                }),
                ..Default::default()
            },
        )
    }

    fn put(key: &str) -> pb::InternalRaftRequest {
        pb::InternalRaftRequest {
            put: Some(pb::PutRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// An entry that writes more events than the hubs may be handed (a DeleteRange of many
    /// keys) hands out none: the driver is told to send every watcher to history instead, and
    /// the write metrics still count every key.
    #[test]
    fn an_entry_with_more_events_than_the_bound_sends_watchers_to_history() {
        let mut m = started_leader();
        m.config.watch_events_per_apply_max = 3;
        let keys = ["a", "b", "c", "d", "e"];
        for (i, key) in keys.iter().enumerate() {
            let (p, _rx) = proposal(10 + i as u64, put(key));
            m.propose(p, 10);
            settle(&mut m, 10);
        }
        let effects = m.take_effects();
        let published: Vec<usize> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Events { events, .. } => Some(events.len()),
                _ => None,
            })
            .collect();
        assert_eq!(
            published.iter().sum::<usize>(),
            keys.len(),
            "puts under the bound"
        );
        assert!(!effects
            .iter()
            .any(|e| matches!(e, Effect::EventsCut { .. })));
        let delete_all = pb::InternalRaftRequest {
            delete_range: Some(pb::DeleteRangeRequest {
                key: Bytes::from_static(b"a"),
                range_end: Bytes::from_static(b"z"),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (p, mut rx) = proposal(20, delete_all);
        m.propose(p, 20);
        settle(&mut m, 20);
        assert!(
            matches!(rx.try_recv(), Ok(Some(Ok(_)))),
            "the delete applied"
        );
        let effects = m.take_effects();
        assert!(!effects.iter().any(|e| matches!(e, Effect::Events { .. })));
        let cut = cut_revisions(&effects);
        assert_eq!(cut, vec![m.writer().current_revision()]);
        let stats = &m.config.stats;
        assert_eq!(stats.deletes.load(Ordering::Relaxed), keys.len() as u64);
        assert_eq!(
            stats.keys.load(Ordering::Relaxed),
            0,
            "the live-key gauge follows"
        );
        // A write under the bound hands its event out again.
        let (p, _rx) = proposal(21, put("f"));
        m.propose(p, 30);
        settle(&mut m, 30);
        let effects = m.take_effects();
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::Events { events, .. } if events.len() == 1)));
    }

    /// With no watchers (the driver says so), writes apply without building events: the
    /// member hands out `EventsCut` at the revision they reached instead, and answers the
    /// writes as before. Wanted again, events come back.
    #[test]
    fn without_watchers_writes_hand_out_a_cut_and_no_events() {
        let mut m = started_leader();
        m.take_effects();
        m.set_events_wanted(false);
        let (p, mut rx) = proposal(10, put("a"));
        m.propose(p, 10);
        settle(&mut m, 10);
        let Ok(Some(Ok(outcome))) = rx.try_recv() else {
            panic!("the put is answered");
        };
        let Answer::Op(response) = outcome.response else {
            panic!("a kv answer");
        };
        assert!(matches!(
            response.check(),
            kv::OpResponse::Put(kv::PutResponse { revision: 2, .. })
        ));
        let effects = m.take_effects();
        assert!(!effects.iter().any(|e| matches!(e, Effect::Events { .. })));
        let cut = cut_revisions(&effects);
        assert_eq!(cut, vec![2], "the cut names the revision the put made");
        assert_eq!(
            m.config.stats.puts.load(Ordering::Relaxed),
            1,
            "counted all the same"
        );

        m.set_events_wanted(true);
        let (p, _rx) = proposal(11, put("b"));
        m.propose(p, 20);
        settle(&mut m, 20);
        let effects = m.take_effects();
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::Events { events, revision: 3 } if events.len() == 1)));
        assert!(!effects
            .iter()
            .any(|e| matches!(e, Effect::EventsCut { .. })));
    }

    /// The bound holds for all the entries one Ready applies: two deletes, each under it, whose
    /// events together pass it hand out none.
    #[test]
    fn the_event_bound_holds_for_the_entries_of_one_ready() {
        let mut m = started_leader();
        m.config.watch_events_per_apply_max = 4;
        for (i, key) in ["a1", "a2", "a3", "b1", "b2", "b3"].iter().enumerate() {
            let (p, _rx) = proposal(10 + i as u64, put(key));
            m.propose(p, 10);
            settle(&mut m, 10);
        }
        m.take_effects();
        let delete = |from: &'static [u8], to: &'static [u8]| pb::InternalRaftRequest {
            delete_range: Some(pb::DeleteRangeRequest {
                key: Bytes::from_static(from),
                range_end: Bytes::from_static(to),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (p1, mut rx1) = proposal(20, delete(b"a", b"b"));
        let (p2, mut rx2) = proposal(21, delete(b"b", b"c"));
        m.propose_batch(vec![p1, p2], 20);
        settle(&mut m, 20);
        assert!(matches!(rx1.try_recv(), Ok(Some(Ok(_)))));
        assert!(matches!(rx2.try_recv(), Ok(Some(Ok(_)))));
        let effects = m.take_effects();
        let events: usize = effects
            .iter()
            .map(|e| match e {
                Effect::Events { events, .. } => events.len(),
                _ => 0,
            })
            .sum();
        let cut = effects
            .iter()
            .any(|e| matches!(e, Effect::EventsCut { .. }));
        // One batch, one entry each, applied in one Ready: six events against a bound of four.
        assert!(cut, "the Ready's events passed the bound");
        assert_eq!(events, 0, "none of them is handed out");
    }

    #[test]
    fn a_write_is_answered_only_after_its_wal_records_are_synced() {
        let mut m = started_leader();
        let (p, mut rx) = proposal(7, put("k"));
        m.propose(p, 10);
        let io = m.ready(10).expect("a proposal makes a Ready");
        let entries: Vec<&Record> = io
            .wal_records
            .iter()
            .filter(|r| r.kind == WAL_KIND_ENTRY)
            .collect();
        assert_eq!(entries.len(), 1, "the proposal's entry is written");
        let index = entries[0].index;
        let record = entries[0].payload.clone();
        // The WAL write is in flight: nothing may be answered yet.
        assert!(matches!(rx.try_recv(), Ok(None)));
        m.persisted(10).expect("no snapshot");
        // The log keeps the entry's data as a slice of its WAL record, not a copy.
        let stored = m
            .node
            .store()
            .entries(index, index + 1, u64::MAX)
            .expect("in the log");
        let data = &stored[0].data;
        let within = record.as_ptr_range();
        assert!(
            within.contains(&data.as_ptr()) && data.as_ptr_range().end == within.end,
            "the entry's data ends its record"
        );
        assert_eq!(keel_raft::Entry::decode(&record).unwrap().data, *data);
        settle(&mut m, 10);
        let outcome = rx
            .try_recv()
            .expect("the reply is sent")
            .expect("the reply arrived")
            .expect("the put applied");
        assert_eq!(outcome.raft_term, m.raft_term());
        assert_eq!(m.applied_index(), index);
        let events = m
            .take_effects()
            .into_iter()
            .filter(|e| matches!(e, Effect::Events { .. }))
            .count();
        assert_eq!(events, 1, "the put's event goes to the watch hubs");
    }

    fn auth_entry(
        req: pb::InternalRaftRequest,
        user: &str,
        revision: u64,
    ) -> pb::InternalRaftRequest {
        pb::InternalRaftRequest {
            header: Some(pb::RequestHeader {
                id: 0,
                username: user.into(),
                auth_revision: revision,
            }),
            ..req
        }
    }

    /// Proposes `req` as `user` at `revision` and applies it; the outcome.
    fn propose_as(
        m: &mut Member,
        id: u64,
        req: pb::InternalRaftRequest,
        user: &str,
        revision: u64,
    ) -> Result<Unserved, EtcdError> {
        let (reply, mut rx) = oneshot::channel();
        let mut req = auth_entry(req, user, revision);
        req.header.as_mut().expect("set above").id = id;
        m.propose(
            Proposal {
                data: Bytes::from(req.encode_to_vec()),
                id,
                reply: reply.into(),
            },
            10,
        );
        settle(m, 10);
        rx.try_recv()
            .expect("the reply is sent")
            .expect("the reply arrived")
    }

    #[test]
    fn writes_are_checked_at_apply_against_the_auth_store_at_that_index() {
        let mut m = started_leader();
        let add = |name: &str| pb::InternalRaftRequest {
            auth_user_add: Some(pb::AuthUserAddRequest {
                name: name.into(),
                hashed_password: "$2a$04$hash".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let grant = |user: &str, role: &str| pb::InternalRaftRequest {
            auth_user_grant_role: Some(pb::AuthUserGrantRoleRequest {
                user: user.into(),
                role: role.into(),
            }),
            ..Default::default()
        };
        propose_as(&mut m, 1, add("root"), "", 0).expect("auth is off: anyone administers");
        propose_as(&mut m, 2, grant("root", "root"), "", 0).expect("grant");
        propose_as(&mut m, 3, add("u"), "", 0).expect("add");
        let enable = pb::InternalRaftRequest {
            auth_enable: Some(pb::AuthEnableRequest {}),
            ..Default::default()
        };
        propose_as(&mut m, 4, enable, "", 0).expect("enable");
        let (state, _) = m.auth();
        assert!(state.enabled());
        let rev = state.revision();
        assert!(matches!(
            propose_as(&mut m, 5, put("k"), "", 0),
            Err(EtcdError::UserEmpty)
        ));
        assert!(matches!(
            propose_as(&mut m, 6, put("k"), "u", rev),
            Err(EtcdError::PermissionDenied)
        ));
        propose_as(&mut m, 7, put("k"), "root", rev).expect("root writes anywhere");
        // Management needs root; a change makes earlier credentials old.
        assert!(matches!(
            propose_as(&mut m, 8, add("v"), "u", rev),
            Err(EtcdError::PermissionDenied)
        ));
        propose_as(&mut m, 9, add("v"), "root", rev).expect("root administers");
        // Published before the answer, with no driver between: a client told its change is
        // done finds its next request checked against it.
        let new_rev = m.auth().0.revision();
        assert!(new_rev > rev);
        assert_eq!(m.config.published_auth.load().state.revision(), new_rev);
        assert!(matches!(
            propose_as(&mut m, 10, put("k"), "root", rev),
            Err(EtcdError::AuthOldRevision)
        ));
        // The member's own entries (id 0, e.g. lease expiry) are not checked.
        let revoke = pb::InternalRaftRequest {
            lease_revoke: Some(pb::LeaseRevokeRequest { id: 99 }),
            ..Default::default()
        };
        let data = Bytes::from(auth_entry(revoke, "", 0).encode_to_vec());
        m.node.propose(data).expect("the leader takes it");
        settle(&mut m, 20);
        // The auth store is in the checkpoint request.
        let req = m
            .checkpoint_request()
            .expect("term known")
            .expect("entries applied");
        assert_eq!(req.auth.users.len(), 3);
        assert!(req.auth.enabled);
    }

    #[test]
    fn a_write_whose_sync_never_completes_times_out_at_its_deadline() {
        let mut m = started_leader();
        let (p, mut rx) = proposal(9, put("stuck"));
        m.propose(p, 1_000);
        let _io = m.ready(1_000).expect("a proposal makes a Ready");
        // The disk never answers; time passes.
        m.tick(1_000 + REQUEST_TIMEOUT_MS - 1);
        assert!(matches!(rx.try_recv(), Ok(None)));
        m.tick(1_000 + REQUEST_TIMEOUT_MS + TICK_MS);
        assert!(matches!(rx.try_recv(), Ok(Some(Err(EtcdError::Timeout)))));
    }

    #[test]
    fn an_expired_lease_is_revoked_at_its_ttl_by_the_given_clock() {
        let mut m = started_leader();
        let grant = pb::InternalRaftRequest {
            lease_grant: Some(pb::LeaseGrantRequest { ttl: 5, id: 42 }),
            ..Default::default()
        };
        let (p, mut rx) = proposal(1, grant);
        m.propose(p, 100);
        settle(&mut m, 100);
        assert!(matches!(rx.try_recv(), Ok(Some(Ok(_)))));
        assert!(m.writer().lease(42).is_some());
        // Granted at 100 ms with a 5 s TTL: alive until 5,100 ms.
        m.tick(5_000);
        settle(&mut m, 5_000);
        assert!(m.writer().lease(42).is_some(), "not expired yet");
        m.tick(5_100);
        settle(&mut m, 5_100);
        assert!(m.writer().lease(42).is_none(), "revoked at its deadline");
    }

    #[test]
    fn a_read_is_answered_once_apply_reaches_its_read_index() {
        let mut m = started_leader();
        let (reply, mut rx) = oneshot::channel();
        m.read(vec![ReadWait { reply }], 10);
        settle(&mut m, 10);
        assert_eq!(rx.try_recv(), Ok(Some(Ok(()))));
    }

    #[test]
    fn the_log_keeps_what_a_follower_being_sent_a_snapshot_will_need_within_a_bound() {
        // No snapshot in flight: the tail only.
        assert_eq!(
            log_compaction_index(100_000, None),
            100_000 - LOG_TAIL_KEPT_ENTRIES
        );
        assert_eq!(log_compaction_index(10, None), 0);
        // A follower being sent the snapshot at 60,000 needs 60,001 on once it installs it,
        // and the leader the term of 60,000 to append them.
        assert_eq!(log_compaction_index(100_000, Some(60_000)), 59_999);
        // A snapshot within the tail changes nothing.
        assert_eq!(
            log_compaction_index(100_000, Some(99_000)),
            100_000 - LOG_TAIL_KEPT_ENTRIES
        );
        // One so far behind that holding for it would exceed the bound: the bound wins.
        let index = 10 * SNAPSHOT_CATCH_UP_ENTRIES_MAX;
        assert_eq!(
            log_compaction_index(index, Some(1)),
            index - SNAPSHOT_CATCH_UP_ENTRIES_MAX
        );
    }

    #[test]
    fn a_checkpoint_lets_the_wal_go_behind_the_previous_one() {
        let mut m = started_leader();
        for id in 1..=3 {
            let (p, _rx) = proposal(id, put(&format!("k{id}")));
            m.propose(p, 10);
        }
        settle(&mut m, 10);
        assert!(m.applied_past_checkpoint());
        let req = m
            .checkpoint_request()
            .expect("the applied index has a term")
            .expect("entries were applied since the last checkpoint");
        assert_eq!(req.index, m.applied_index());
        assert_eq!(m.checkpoint_in_flight(), Some(req.index));
        let done = m
            .checkpoint_written(
                req.index,
                req.conf_state.clone(),
                Bytes::from_static(b"cp"),
                None,
            )
            .expect("the snapshot is newer than the log's start");
        // The checkpoint the member started from (index 1) stays; the log is shorter than
        // the tail kept for slightly-behind followers, so the whole WAL stays too.
        assert_eq!(
            done,
            CheckpointCompletion::Taken {
                done: CheckpointDone {
                    wal_keep_from: 1,
                    remove_before: 1
                },
                previous_image: None,
                compacted_entries: Vec::new(),
            }
        );
        assert_eq!(m.checkpoint_in_flight(), None);
        assert!(!m.applied_past_checkpoint());
        assert!(m.checkpoint_request().expect("term known").is_none());
    }

    #[test]
    fn a_quiet_member_takes_a_checkpoint_early_once_enough_was_applied() {
        let mut m = started_leader();
        let tick_ms = m.config.tick_ms;
        let apply_puts = |m: &mut Member, ids: std::ops::RangeInclusive<u64>, now_ms: u64| {
            for id in ids {
                let (p, _rx) = proposal(id, put(&format!("k{id}")));
                m.propose(p, now_ms);
            }
            settle(m, now_ms);
        };
        // A few entries against a tenth of 1000: quiet, but not worth a checkpoint.
        m.config.snapshot_count = 1000;
        apply_puts(&mut m, 1..=3, 10);
        m.tick(10 + tick_ms);
        m.tick(10 + tick_ms + IDLE_CHECKPOINT_AFTER_MS);
        assert!(
            !m.checkpoint_due(),
            "too few entries for an early checkpoint"
        );
        // Against a tenth of 40 they are enough, once the member has been quiet long enough.
        m.config.snapshot_count = 40;
        let moved_ms = 10 + 2 * tick_ms + IDLE_CHECKPOINT_AFTER_MS;
        apply_puts(&mut m, 4..=6, moved_ms);
        m.tick(moved_ms);
        assert!(!m.checkpoint_due(), "writes just applied: not quiet yet");
        m.tick(moved_ms + IDLE_CHECKPOINT_AFTER_MS - 1);
        assert!(!m.checkpoint_due(), "quiet for less than the idle time");
        m.tick(moved_ms + IDLE_CHECKPOINT_AFTER_MS);
        assert!(
            m.checkpoint_due(),
            "quiet long enough, with a tenth applied"
        );
        let req = m.checkpoint_request().expect("term known").expect("due");
        assert!(!m.checkpoint_due(), "one in flight");
        m.checkpoint_written(req.index, req.conf_state.clone(), Bytes::new(), None)
            .expect("taken");
        m.tick(moved_ms + 3 * IDLE_CHECKPOINT_AFTER_MS);
        assert!(!m.checkpoint_due(), "nothing applied since");
    }

    #[test]
    fn a_checkpoint_is_in_flight_until_its_writer_reports_and_the_member_applies_meanwhile() {
        let mut m = started_leader();
        m.config.snapshot_count = 2;
        for id in 1..=2 {
            let (p, _rx) = proposal(id, put(&format!("k{id}")));
            m.propose(p, 10);
        }
        settle(&mut m, 10);
        assert!(m.checkpoint_due());
        let req = m
            .checkpoint_request()
            .expect("term known")
            .expect("entries were applied since the last checkpoint");
        let index = req.index;
        assert!(!m.checkpoint_due(), "one checkpoint in flight at a time");
        // The member keeps applying while the writer works; the image stays at its index.
        for id in 3..=6 {
            let (p, _rx) = proposal(id, put(&format!("k{id}")));
            m.propose(p, 20);
        }
        settle(&mut m, 20);
        assert!(m.applied_index() >= index + 4);
        assert!(!m.checkpoint_due(), "still in flight");
        // The image could not be taken (a compaction raced it): retried at once, afresh.
        m.checkpoint_abandoned(index);
        assert!(m.checkpoint_due());
        let again = m
            .checkpoint_request()
            .expect("term known")
            .expect("still past the last checkpoint");
        assert_eq!(again.index, m.applied_index());
        let file = written_file(&again);
        let done = m
            .checkpoint_written(again.index, again.conf_state.clone(), file, None)
            .expect("newer than the log's start");
        assert!(matches!(done, CheckpointCompletion::Taken { .. }));
        assert!(!m.checkpoint_due(), "nothing applied since");
    }

    /// The checkpoint file a driver's writer makes of `req`.
    fn written_file(req: &CheckpointRequest) -> Bytes {
        let image = req.source.serialize().expect("no compaction raced it");
        Bytes::from(req.encode_file(&image))
    }

    #[test]
    fn a_checkpoint_overtaken_by_a_leaders_snapshot_is_discarded_not_taken() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        for id in 1..=3 {
            let (p, _rx) = proposal(id, put(&format!("k{id}")));
            let now_ms = trio.now_ms;
            trio.members[leader].propose(p, now_ms);
        }
        for _ in 0..5 {
            trio.round();
        }
        // The follower starts a checkpoint; its writer is slow.
        let req = trio.members[follower]
            .checkpoint_request()
            .expect("term known")
            .expect("the writes were applied");
        let stale_file = written_file(&req);
        // Cut off, it falls so far behind that the leader compacts the entries it lacks.
        trio.cut = Some(follower as u64 + 1);
        for batch in 0..60u64 {
            for k in 0..100u64 {
                let data = Bytes::from(put(&format!("b{batch}-{k}")).encode_to_vec());
                trio.members[leader]
                    .node
                    .propose(data)
                    .expect("the leader takes it");
            }
            trio.round();
        }
        let lead = &mut trio.members[leader];
        let leader_req = lead
            .checkpoint_request()
            .expect("term known")
            .expect("far past the last checkpoint");
        assert!(leader_req.index > req.index + LOG_TAIL_KEPT_ENTRIES);
        let file = written_file(&leader_req);
        let first_before = lead.node.store().first_index();
        let done = lead
            .checkpoint_written(leader_req.index, leader_req.conf_state.clone(), file, None)
            .expect("newer than the log's start");
        let CheckpointCompletion::Taken {
            compacted_entries, ..
        } = done
        else {
            panic!("the leader's own checkpoint is taken");
        };
        // Every entry compacted away comes back, for the driver to free off the raft core.
        let first_after = lead.node.store().first_index();
        assert!(first_after > first_before, "the log was compacted");
        let indexes: Vec<u64> = compacted_entries.iter().map(|e| e.index).collect();
        assert_eq!(indexes, (first_before..first_after).collect::<Vec<u64>>());
        // Healed, the follower installs the leader's snapshot while its checkpoint is in flight.
        trio.cut = None;
        for _ in 0..20 {
            trio.round();
        }
        let f = &mut trio.members[follower];
        assert!(
            f.last_checkpoint_index >= leader_req.index,
            "the leader's snapshot was installed"
        );
        // The live-key gauge starts from the restore's count (no pass over the index), and
        // the writes applied after the snapshot moved it on: it is what a count finds.
        let live = f
            .writer
            .reader()
            .range(&kv::RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                count_only: true,
                ..Default::default()
            })
            .expect("a count")
            .count;
        assert!(f.writer.live_keys_restored() > 3, "counted by the restore");
        assert_eq!(f.config.stats.keys.load(Ordering::Relaxed), live);
        assert_eq!(f.checkpoint_in_flight(), Some(req.index));
        assert!(!f.checkpoint_due(), "none is due while one is in flight");
        let outcome = f
            .checkpoint_written(req.index, req.conf_state.clone(), stale_file, None)
            .expect("a stale completion is no error");
        assert_eq!(
            outcome,
            CheckpointCompletion::Overtaken {
                stale_file_index: Some(req.index)
            }
        );
        assert_eq!(f.checkpoint_in_flight(), None);
        assert!(
            f.last_checkpoint_index >= leader_req.index,
            "kept the newer one"
        );
        // Checkpoints go on from the installed snapshot.
        let (p, _rx) = proposal(9_999, put("after"));
        let now_ms = trio.now_ms;
        trio.members[leader].propose(p, now_ms);
        for _ in 0..5 {
            trio.round();
        }
        let f = &mut trio.members[follower];
        let next = f
            .checkpoint_request()
            .expect("term known")
            .expect("a write applied since the snapshot");
        let file = written_file(&next);
        let done = f
            .checkpoint_written(next.index, next.conf_state.clone(), file, None)
            .expect("newer than the snapshot");
        assert!(matches!(done, CheckpointCompletion::Taken { .. }));
    }

    /// Three members wired by an in-memory network whose disks sync at once: the smallest
    /// simulation, stepping every member each round of `TICK_MS`.
    struct Trio {
        members: Vec<Member>,
        now_ms: u64,
        /// A member cut off from the others: messages to and from it are lost.
        cut: Option<u64>,
        /// A member whose value-log disk writes nothing until this is cleared.
        disk_stalled: Option<u64>,
        /// Messages of this type to this member are kept in `held` instead of delivered.
        hold: Option<(u64, MessageType)>,
        held: Vec<Message>,
        /// Every member's WAL records, as written (a restart recovers from them).
        wal: Vec<Vec<Record>>,
    }

    impl Trio {
        fn new() -> Trio {
            Trio::with_value_log(kv::ValueLogOptions::default(), 64 << 20)
        }

        /// Members whose values go to disk in segments of `segment_bytes`, and that take no
        /// new writes above `sealed_backlog_bytes_max` of values waiting for the disk.
        fn with_values_on_disk(segment_bytes: usize, sealed_backlog_bytes_max: u64) -> Trio {
            let value_log = kv::ValueLogOptions {
                segment_bytes,
                first_segment_id: 1,
                on_disk: true,
            };
            Trio::with_value_log(value_log, sealed_backlog_bytes_max)
        }

        /// Members whose stores use `value_log`, and take no new writes above
        /// `sealed_backlog_bytes_max` of values waiting for the disk.
        fn with_value_log(value_log: kv::ValueLogOptions, sealed_backlog_bytes_max: u64) -> Trio {
            Trio::build(
                value_log,
                sealed_backlog_bytes_max,
                64 << 20,
                APPLY_KEYS_PER_STEP,
            )
        }

        /// Members whose Readys apply at most `max_apply_bytes` of committed entries each (at
        /// least one entry).
        fn applying_at_most(max_apply_bytes: u64) -> Trio {
            Trio::build(
                kv::ValueLogOptions::default(),
                64 << 20,
                max_apply_bytes,
                APPLY_KEYS_PER_STEP,
            )
        }

        /// Members that apply a range delete `keys_per_step` keys per step.
        fn stepping(keys_per_step: usize) -> Trio {
            Trio::build(
                kv::ValueLogOptions::default(),
                64 << 20,
                64 << 20,
                keys_per_step,
            )
        }

        /// `stepping`, with a leader elected (returned) and keys k00..k59 put through it.
        fn stepping_with_keys(keys_per_step: usize) -> (Trio, usize) {
            let mut trio = Trio::stepping(keys_per_step);
            let leader = trio.elect();
            let keys: Vec<String> = (0..60).map(|i| format!("k{i:02}")).collect();
            let (batch, _answers) = batch_of(&keys, 1_000);
            let now_ms = trio.now_ms;
            trio.members[leader].propose_batch(batch, now_ms);
            for _ in 0..5 {
                trio.round();
            }
            (trio, leader)
        }

        fn build(
            value_log: kv::ValueLogOptions,
            sealed_backlog_bytes_max: u64,
            max_apply_bytes: u64,
            apply_keys_per_step: usize,
        ) -> Trio {
            let infos: Vec<MemberInfo> = (1..=3)
                .map(|id| MemberInfo {
                    id,
                    name: format!("m{id}"),
                    peer_urls: vec![format!("http://127.0.0.{id}:2380")],
                    client_urls: vec![format!("http://127.0.0.{id}:2379")],
                    is_learner: false,
                })
                .collect();
            let members = (1..=3)
                .map(|id| {
                    let mut rc = keel_raft::Config::new(id);
                    rc.heartbeat_tick = 1;
                    rc.applied = 1;
                    rc.seed = id;
                    rc.max_apply_bytes_per_ready = max_apply_bytes;
                    let storage = MemStorage::new_with_voters(&[1, 2, 3]);
                    let node = RawNode::new(&rc, storage).expect("a valid raft configuration");
                    let (writer, _reader) = kv::Store::with_value_log(value_log);
                    let config = MemberConfig {
                        id,
                        name: format!("m{id}"),
                        advertise_client_urls: vec![format!("http://127.0.0.{id}:2379")],
                        request_timeout_ms: REQUEST_TIMEOUT_MS,
                        tick_ms: TICK_MS,
                        snapshot_count: 10_000,
                        stats: Arc::default(),
                        auth_token_ttl_ms: 300_000,
                        sealed_backlog_bytes_max,
                        watch_events_per_apply_max: crate::limits::WATCH_EVENTS_PER_APPLY_MAX,
                        apply_keys_per_step,
                        ids_first: 1,
                        values_resident: |_| Some(true),
                        install_helpers: InstallHelpers::NONE,
                        strict_reconfig_check: true,
                        published_auth: Arc::default(),
                    };
                    let mut m =
                        Member::new(config, node, writer, infos.clone(), Alarms::default(), 1);
                    m.start(0);
                    m
                })
                .collect();
            Trio {
                members,
                now_ms: 0,
                cut: None,
                disk_stalled: None,
                hold: None,
                held: Vec::new(),
                wal: vec![Vec::new(); 3],
            }
        }

        /// One round: every member ticks and carries out its Readys; messages are delivered
        /// after the round, in the order they were sent.
        fn round(&mut self) {
            self.now_ms += TICK_MS;
            let now_ms = self.now_ms;
            let mut wire = Vec::new();
            // Keep-alives forwarded (from, to, request id, lease) and their answers (to,
            // request id, ttl), delivered after the round as the peer transport would.
            let mut keepalives = Vec::new();
            let mut keepalive_replies = Vec::new();
            let mut refusals = Vec::new();
            for (i, m) in self.members.iter_mut().enumerate() {
                m.tick(now_ms);
                while let Some(io) = m.ready(now_ms) {
                    wire.extend(io.messages);
                    wire.extend(io.persisted_messages);
                    self.wal[i].extend(io.wal_records);
                    m.persisted(now_ms).expect("no snapshots here");
                }
                if m.applying_in_steps() {
                    // As the driver's loop does between Readies.
                    m.apply_step(now_ms);
                }
                if self.disk_stalled != Some(m.id()) {
                    // The value-log driver: every sealed segment written, synced and mapped.
                    for sealed in m.take_sealed_segments() {
                        let file: Vec<u8> = sealed.records.to_vec();
                        m.segment_durable(sealed.id, sealed.bytes, Bytes::from(file));
                    }
                }
                for effect in m.take_effects() {
                    match effect {
                        Effect::ForwardKeepAlive {
                            to,
                            request_id,
                            lease,
                        } => keepalives.push((m.id(), to, request_id, lease)),
                        Effect::KeepAliveReply {
                            to,
                            request_id,
                            ttl_s,
                        } => keepalive_replies.push((to, request_id, ttl_s)),
                        Effect::RefuseForwarded {
                            to,
                            refusal,
                            kind,
                            id,
                        } => refusals.push((to, refusal, kind, id)),
                        _ => {}
                    }
                }
            }
            for msg in wire {
                if self.cut.is_some_and(|c| c == msg.to || c == msg.from) {
                    continue;
                }
                if self.hold == Some((msg.to, msg.msg_type)) {
                    self.held.push(msg);
                    continue;
                }
                let to = msg.to as usize;
                self.members[to - 1].step(msg, now_ms);
            }
            for (to, refusal, kind, id) in refusals {
                self.members[to as usize - 1].forwarded_refused(refusal, kind, id);
            }
            for (from, to, request_id, lease) in keepalives {
                self.members[to as usize - 1].keepalive_from_peer(from, request_id, lease, now_ms);
            }
            for (to, request_id, ttl_s) in keepalive_replies {
                self.members[to as usize - 1].keepalive_reply(request_id, ttl_s);
            }
            // As the driver publishes after every turn of its loop.
            for m in &mut self.members {
                m.publish_lease_window(now_ms);
            }
        }

        /// Grants lease `id` through the leader and rounds until every member applied it.
        fn grant_lease(&mut self, leader: usize, id: i64, ttl_s: i64) {
            let grant = pb::InternalRaftRequest {
                lease_grant: Some(pb::LeaseGrantRequest { ttl: ttl_s, id }),
                ..Default::default()
            };
            let (p, _rx) = proposal(1, grant);
            let now_ms = self.now_ms;
            self.members[leader].propose(p, now_ms);
            for _ in 0..5 {
                self.round();
            }
            assert!(self.members.iter().all(|m| m.writer().lease(id).is_some()));
        }

        fn leader(&self) -> Option<usize> {
            self.members.iter().position(|m| m.is_leader())
        }

        /// Rounds until a leader is elected and every member knows it; its index.
        fn elect(&mut self) -> usize {
            for _ in 0..100 {
                self.round();
                if self.leader().is_some() {
                    break;
                }
            }
            let leader = self.leader().expect("a leader within 100 ticks");
            for _ in 0..5 {
                self.round();
            }
            leader
        }
    }

    /// A leader whose disk lags takes no proposals forwarded by followers either: their
    /// clients hear "too many requests" at once, as the leader's own would.
    #[test]
    fn a_leader_whose_disk_lags_refuses_proposals_forwarded_to_it() {
        let mut trio = Trio::with_values_on_disk(4 * 1024, 16 * 1024);
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        trio.disk_stalled = Some(trio.members[leader].id());
        let big_put = |id: u64| sized_put(id, 4096);
        for id in 1..=8 {
            let (p, _rx) = big_put(id);
            trio.members[leader].propose(p, trio.now_ms);
        }
        for _ in 0..5 {
            trio.round();
        }
        assert!(trio.members[leader].values_backlogged());
        let (p, mut rx) = big_put(100);
        trio.members[follower].propose(p, trio.now_ms);
        for _ in 0..3 {
            trio.round();
        }
        assert!(matches!(
            rx.try_recv(),
            Ok(Some(Err(EtcdError::TooManyRequests)))
        ));
        // Once the leader's disk catches up, the follower's writes go through again.
        trio.disk_stalled = None;
        trio.round();
        assert!(!trio.members[leader].values_backlogged());
        let (p, mut rx) = big_put(101);
        trio.members[follower].propose(p, trio.now_ms);
        for _ in 0..5 {
            trio.round();
        }
        assert!(matches!(rx.try_recv(), Ok(Some(Ok(_)))));
    }

    /// Found by the soak (seed 8027565): a follower's read sent just before it crashed was
    /// answered by the leader after the restart, and the answer's context matched the first
    /// read of the new incarnation, whose ids had started over at 1: that read was served at
    /// the old read index and missed a delete acknowledged in between. Ids now start where
    /// the driver says (`ids_first`), which differs for every incarnation.
    #[test]
    fn a_read_answer_meant_for_an_earlier_incarnation_answers_no_read_of_a_later_one() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let f = (leader + 1) % 3;
        let f_id = trio.members[f].id();
        // A read of the first incarnation; the leader's answer is held back, as if it were
        // sent just as the follower crashed.
        trio.hold = Some((f_id, MessageType::ReadIndexResponse));
        let (reply, _first_rx) = oneshot::channel();
        let now_ms = trio.now_ms;
        trio.members[f].read(vec![ReadWait { reply }], now_ms);
        for _ in 0..10 {
            trio.round();
        }
        trio.hold = None;
        let stale = trio.held.pop().expect("the leader answered the read");
        assert!(trio.held.is_empty());
        // Writes commit past that read index.
        let (p, _rx) = proposal(99, put("k"));
        trio.members[leader].propose(p, trio.now_ms);
        for _ in 0..3 {
            trio.round();
        }
        assert!(trio.members[leader].applied_index() > stale.index);
        // The follower restarts from its WAL, catches up, and is cut off, so that its next
        // read can only be answered by the old answer, which then arrives.
        let restart = |ids_first: u64, old: &Member, wal: Vec<Record>| {
            let mut rc = keel_raft::Config::new(f_id);
            rc.heartbeat_tick = 1;
            rc.seed = f_id;
            let r = recovery::recover(
                rc,
                recovery::Start::Founding,
                old.members().to_vec(),
                None,
                wal,
                recovery::StoreSource {
                    value_log: kv::ValueLogOptions::default(),
                    segment_files: &mut |id| Err(format!("no segment {id}")),
                    restore_helpers: kv::RestoreHelpers::NONE,
                },
            )
            .expect("a well-formed WAL recovers");
            let config = MemberConfig {
                ids_first,
                ..old.config.clone()
            };
            let mut m = Member::new(config, r.node, r.writer, r.members, r.alarms, 1);
            m.start(0);
            m
        };
        let answered_by_the_old_answer = |trio: &mut Trio, ids_first: u64| {
            let again = restart(ids_first, &trio.members[f], trio.wal[f].clone());
            trio.members[f] = again;
            trio.cut = None;
            for _ in 0..10 {
                trio.round();
            }
            assert_eq!(
                trio.members[f].applied_index(),
                trio.members[leader].applied_index(),
                "the restarted follower caught up"
            );
            trio.cut = Some(f_id);
            let (reply, mut rx) = oneshot::channel();
            let now_ms = trio.now_ms;
            let m = &mut trio.members[f];
            m.read(vec![ReadWait { reply }], now_ms);
            m.step(stale.clone(), now_ms);
            while let Some(_io) = m.ready(now_ms) {
                m.persisted(now_ms).expect("no snapshots here");
            }
            rx.try_recv().expect("not dropped").is_some()
        };
        // Were the new incarnation's ids to start where the old one's did, the old answer
        // would answer its read: the hazard the soak found.
        assert!(answered_by_the_old_answer(&mut trio, 1));
        // With ids of its own, the old answer answers nothing; the read waits for its round.
        assert!(!answered_by_the_old_answer(&mut trio, 1 << 32));
    }

    /// A follower whose disk falls behind takes no new entries while more values wait for it
    /// than its bound, so their memory stays bounded; it stays the leader's follower, the
    /// other two commit meanwhile, and it catches up once its disk does.
    #[test]
    fn a_follower_whose_disk_lags_takes_no_new_entries_until_it_catches_up() {
        const BACKLOG_MAX_BYTES: u64 = 64 * 1024;
        let mut trio = Trio::with_values_on_disk(8 * 1024, BACKLOG_MAX_BYTES);
        let leader = trio.elect();
        let slow = (leader + 1) % 3;
        trio.disk_stalled = Some(trio.members[slow].id());
        let term = trio.members[leader].raft_term();
        let mut answers = Vec::new();
        let mut backlog_peak_bytes = 0;
        for round in 0..200u64 {
            // Ten 1 KiB puts a round: 2 MB in all, thirty times the bound.
            for i in 0..10 {
                let id = round * 10 + i + 1;
                let (p, rx) = sized_put(id, 1024);
                trio.members[leader].propose(p, trio.now_ms);
                answers.push(rx);
            }
            trio.round();
            backlog_peak_bytes = backlog_peak_bytes.max(trio.members[slow].sealed_backlog_bytes());
        }
        // The last writes commit.
        for _ in 0..5 {
            trio.round();
        }
        // The bound, plus what the follower had already accepted when it crossed it: the
        // entries of the appends in flight (raft's window), far below what was written.
        assert!(
            backlog_peak_bytes <= BACKLOG_MAX_BYTES + 512 * 1024,
            "the stalled follower's backlog reached {backlog_peak_bytes} bytes"
        );
        let stats = trio.members[slow].config.stats.clone();
        assert!(stats.appends_deferred.load(Ordering::Relaxed) > 0);
        let (leader_applied, slow_applied) = (
            trio.members[leader].applied_index(),
            trio.members[slow].applied_index(),
        );
        assert!(
            slow_applied < leader_applied,
            "the stalled follower fell behind"
        );
        for rx in &mut answers {
            let outcome = rx.try_recv().expect("answered").expect("an answer");
            assert!(outcome.is_ok(), "the other two committed every write");
        }
        // Its disk catches up; so does it, under the same leader.
        trio.disk_stalled = None;
        for _ in 0..100 {
            trio.round();
        }
        assert_eq!(trio.members[slow].applied_index(), leader_applied);
        assert_eq!(trio.leader(), Some(leader));
        assert_eq!(
            trio.members[leader].raft_term(),
            term,
            "leadership never moved"
        );
        assert_eq!(trio.members[slow].sealed_backlog_bytes(), 0);
    }

    /// Segments that die while a compaction goes on make a checkpoint full only once the
    /// compaction is done: until then checkpoints stay deltas against the base that names
    /// the dead files. At 4M keys a full checkpoint every `--snapshot-count` entries during a
    /// defragment archived 420 MB each, beside the rewrites.
    #[test]
    fn segments_dying_during_a_compaction_make_the_checkpoint_after_it_full() {
        let mut trio = Trio::with_values_on_disk(4096, 1 << 20);
        let leader = trio.elect();
        let mut next_id = 0u64;
        let mut write_round = |trio: &mut Trio| {
            for batch in 0..30u64 {
                for k in 0..10u64 {
                    next_id += 1;
                    let (mut p, _rx) = sized_put(batch * 10 + k + 1, 100);
                    p.id = next_id;
                    let now_ms = trio.now_ms;
                    trio.members[leader].propose(p, now_ms);
                }
                trio.round();
            }
            for _ in 0..5 {
                trio.round();
            }
        };
        write_round(&mut trio);
        let m = &mut trio.members[leader];
        let req = m.checkpoint_request().expect("term known").expect("due");
        assert!(req.base.is_none(), "the first checkpoint is full");
        let file = written_file(&req);
        m.checkpoint_written(req.index, req.conf_state.clone(), file, None)
            .expect("taken");
        // Every key written again, then compacted: the first round's segments die.
        write_round(&mut trio);
        let rev = trio.members[leader].writer().current_revision();
        let (p, _rx) = compaction(10_000, rev);
        let now_ms = trio.now_ms;
        trio.members[leader].propose(p, now_ms);
        for _ in 0..5 {
            trio.round();
        }
        let mut dead = 0;
        while dead == 0 {
            let m = &mut trio.members[leader];
            assert!(m.writer().compaction_pending(), "no segment died");
            m.compact_step();
            dead = m.take_dead_segments().len();
            trio.round();
        }
        let m = &mut trio.members[leader];
        assert!(m.writer().compaction_pending(), "reclaim goes on");
        let req = m.checkpoint_request().expect("term known").expect("due");
        assert!(req.base.is_some(), "a delta while segments still die");
        m.checkpoint_abandoned(req.index);
        for _ in 0..10_000 {
            let m = &mut trio.members[leader];
            if !m.writer().compaction_pending() {
                break;
            }
            m.compact_step();
            m.take_dead_segments();
            trio.round();
        }
        let m = &mut trio.members[leader];
        assert!(!m.writer().compaction_pending(), "compaction ends");
        let req = m.checkpoint_request().expect("term known").expect("due");
        assert!(req.base.is_none(), "full once the compaction is done");
        // Abandoned, the next one is full as well.
        m.checkpoint_abandoned(req.index);
        let req = m.checkpoint_request().expect("term known").expect("due");
        assert!(req.base.is_none(), "full until a full one is written");
    }

    #[test]
    fn compaction_waits_while_its_rewrites_queue_for_the_disk() {
        const BACKLOG_MAX_BYTES: u64 = 64 * 1024;
        let mut trio = Trio::with_values_on_disk(4096, BACKLOG_MAX_BYTES);
        let leader = trio.elect();
        // 3,000 keys of 100 bytes, then two of every three written again, every segment
        // durable: after a compaction at the end, the first round's segments are two thirds
        // dead, and reclaim rewrites their live third (1,000 records, about 150 KB).
        let keys: Vec<u64> = (1..=3000u64)
            .chain((1..=3000).filter(|k| k % 3 != 0))
            .collect();
        for (batch, chunk) in keys.chunks(10).enumerate() {
            for (i, key_id) in chunk.iter().enumerate() {
                let (mut p, _rx) = sized_put(*key_id, 100);
                p.id = (batch * 10 + i) as u64 + 1;
                trio.members[leader].propose(p, trio.now_ms);
            }
            trio.round();
        }
        for _ in 0..5 {
            trio.round();
        }
        let rev = trio.members[leader].writer().current_revision();
        let (p, rx) = compaction(10_000, rev);
        // The leader's disk stops: what reclaim rewrites stays queued for it.
        trio.disk_stalled = Some(trio.members[leader].id());
        trio.members[leader].propose(p, trio.now_ms);
        for _ in 0..5 {
            trio.round();
        }
        drop(rx);
        let m = &mut trio.members[leader];
        assert!(m.writer().compaction_pending(), "the compaction has work");
        let mut steps = 0;
        while m.compaction_runnable() {
            m.compact_step();
            steps += 1;
            assert!(steps < 100_000, "compaction steps never end");
        }
        // It stopped with work left, the backlog past half the bound by at most one step's
        // rewrites (256 records of about 150 bytes), so client writes are still taken.
        assert!(
            m.writer().compaction_pending(),
            "reclaim had more to rewrite"
        );
        let backlog = m.sealed_backlog_bytes();
        assert!(
            backlog > BACKLOG_MAX_BYTES / 2,
            "stopped at {backlog} bytes"
        );
        assert!(
            backlog <= BACKLOG_MAX_BYTES / 2 + 64 * 1024,
            "ran on to {backlog} bytes"
        );
        assert!(!m.values_backlogged(), "client writes are not held");
        assert!(
            !m.has_work(),
            "nothing runnable: the loop sleeps until the disk reports"
        );
        // The disk catches up; compaction goes on to the end.
        trio.disk_stalled = None;
        for _ in 0..10_000 {
            let m = &mut trio.members[leader];
            if !m.writer().compaction_pending() {
                break;
            }
            m.compact_step();
            trio.round();
        }
        let m = &trio.members[leader];
        assert!(!m.writer().compaction_pending(), "compaction finished");
        assert_eq!(m.sealed_backlog_bytes(), 0);
    }

    #[test]
    fn a_follower_forwards_keep_alives_to_the_leader_whose_clock_renews_the_lease() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        trio.grant_lease(leader, 5, 3);
        // Keep the lease alive from the follower past its TTL: each renewal is the leader's.
        for _ in 0..4 {
            let (reply, mut rx) = oneshot::channel();
            let now_ms = trio.now_ms;
            trio.members[follower].query(Query::KeepAlive { id: 5, reply }, now_ms);
            for _ in 0..10 {
                trio.round();
            }
            assert_eq!(
                rx.try_recv(),
                Ok(Some(Ok(3))),
                "the leader's TTL comes back"
            );
        }
        assert!(
            trio.now_ms > 3_000,
            "the lease outlived its TTL through keep-alives"
        );
        assert!(trio.members[leader].writer().lease(5).is_some());
        // Without keep-alives the leader's clock revokes it.
        for _ in 0..40 {
            trio.round();
        }
        assert!(trio.members.iter().all(|m| m.writer().lease(5).is_none()));
    }

    #[test]
    fn the_leaders_shards_renew_leases_while_a_quorum_vouches_for_it_and_not_during_a_transfer() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        trio.grant_lease(leader, 5, 3);
        let now_ms = trio.now_ms;
        let on_leader = trio.members[leader].lease_deadlines();
        let on_follower = trio.members[follower].lease_deadlines();
        assert_eq!(
            on_follower.renew_here(5, || now_ms),
            None,
            "a follower asks"
        );
        // Kept alive past its TTL by the leader's shards alone.
        for _ in 0..4 {
            for _ in 0..10 {
                trio.round();
            }
            let now_ms = trio.now_ms;
            assert_eq!(on_leader.renew_here(5, || now_ms), Some(3));
        }
        assert!(trio.now_ms > 3_000);
        assert!(trio.members.iter().all(|m| m.writer().lease(5).is_some()));
        assert_eq!(
            on_leader.renew_here(6, || trio.now_ms),
            None,
            "unknown here: ask"
        );
        // Cut off, the leader's window ends with the lease guard on the clock alone, though
        // nothing closes it: a raft core that stopped turning cannot hold it open.
        trio.cut = Some(leader as u64 + 1);
        trio.round();
        let until_ms = on_leader.window_until_ms();
        let guard_ms = 10 * TICK_MS * LEASE_GUARD_PERCENT / 100;
        assert!(until_ms > trio.now_ms && until_ms <= trio.now_ms + guard_ms);
        assert_eq!(on_leader.renew_here(5, || until_ms - 1), Some(3));
        assert_eq!(on_leader.renew_here(5, || until_ms), None);
        trio.cut = None;
        for _ in 0..3 {
            trio.round();
        }
        assert!(
            on_leader.window_until_ms() > until_ms,
            "heard again: open again"
        );
        // A transfer closes it before its TimeoutNow leaves (at the next Ready).
        let (reply, _transferred) = oneshot::channel();
        let now_ms = trio.now_ms;
        trio.members[leader].query(
            Query::TransferLeader {
                to: follower as u64 + 1,
                reply,
            },
            now_ms,
        );
        let io = trio.members[leader]
            .ready(now_ms)
            .expect("a TimeoutNow to send");
        assert!(io
            .messages
            .iter()
            .any(|m| m.msg_type == keel_raft::MessageType::TimeoutNow));
        assert_eq!(on_leader.window_until_ms(), 0);
        assert_eq!(on_leader.renew_here(5, || now_ms), None);
        trio.members[leader].persisted(now_ms).expect("no snapshot");
        for m in io.messages {
            let to = m.to as usize;
            trio.members[to - 1].step(m, now_ms);
        }
        for _ in 0..20 {
            trio.round();
        }
        assert_eq!(trio.leader(), Some(follower));
        assert_eq!(on_leader.window_until_ms(), 0);
        let now_ms = trio.now_ms;
        assert_eq!(
            on_follower.renew_here(5, || now_ms),
            Some(3),
            "the new leader's shards"
        );
    }

    #[test]
    fn the_shards_stop_renewing_while_the_leader_hands_out_a_commit_it_has_not_applied() {
        // A Ready applies a bounded share of what committed, but its messages carry the whole
        // commit index: followers may then apply (and answer) a revoke the leader has not.
        let mut trio = Trio::applying_at_most(1);
        let leader = trio.elect();
        trio.grant_lease(leader, 5, 30);
        let now_ms = trio.now_ms;
        let on_leader = trio.members[leader].lease_deadlines();
        assert_eq!(on_leader.renew_here(5, || trio.now_ms), Some(30));
        let batch: Vec<Proposal> = (0..5)
            .map(|i| proposal(10 + i, put(&format!("k{i}"))).0)
            .collect();
        trio.members[leader].propose_batch(batch, now_ms);
        // Appended, then acknowledged: the leader learns the commit from the answers, which
        // by itself closes nothing (no one else knows it yet).
        trio.round();
        trio.round();
        let m = &mut trio.members[leader];
        let (applied, committed) = (m.applied_index(), m.node.raft().hard_state().commit);
        assert!(
            committed >= applied + 5,
            "five entries committed, not applied"
        );
        let now_ms = trio.now_ms;
        assert_eq!(on_leader.renew_here(5, || now_ms), Some(30));
        // Its next Ready applies one and hands out the commit of all five.
        let io = m.ready(now_ms).expect("committed entries to apply");
        assert!(m.applied_index() < committed);
        assert_eq!(on_leader.window_until_ms(), 0);
        assert_eq!(
            on_leader.renew_here(5, || now_ms),
            None,
            "the raft core answers"
        );
        m.persisted(now_ms).expect("no snapshot");
        drop(io);
        while let Some(_io) = m.ready(now_ms) {
            m.persisted(now_ms).expect("no snapshot");
        }
        assert!(m.applied_index() >= committed);
        assert_eq!(
            on_leader.renew_here(5, || now_ms),
            Some(30),
            "caught up: open again"
        );
    }

    #[test]
    fn answers_stepped_after_the_raft_core_stood_still_do_not_look_fresh() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        trio.grant_lease(leader, 5, 30);
        let on_leader = trio.members[leader].lease_deadlines();
        let last_round_ms = trio.now_ms;
        assert_eq!(on_leader.renew_here(5, || last_round_ms), Some(30));
        // The leader's loop stood still for 5 s; its followers' answers to its last heartbeats
        // waited in its inbox and are stepped now, before it sends anything.
        let late_ms = last_round_ms + 5_000;
        let term = trio.members[leader].raft_term();
        let me = leader as u64 + 1;
        for follower in (1..=3u64).filter(|id| *id != me) {
            let answer = keel_raft::Message {
                msg_type: keel_raft::MessageType::HeartbeatResponse,
                to: me,
                from: follower,
                term,
                ..Default::default()
            };
            trio.members[leader].step(answer, late_ms);
        }
        trio.members[leader].publish_lease_window(late_ms);
        assert_eq!(
            on_leader.renew_here(5, || late_ms),
            None,
            "no fresh word from a quorum"
        );
        let (reply, mut rx) = oneshot::channel();
        trio.members[leader].query(Query::KeepAlive { id: 5, reply }, late_ms);
        assert!(matches!(rx.try_recv(), Ok(Some(Err(_)))));
    }

    #[test]
    fn renewals_wait_an_election_timeout_after_a_transfer_is_given_up() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let transferee = (leader + 1) % 3;
        trio.grant_lease(leader, 5, 30);
        let on_leader = trio.members[leader].lease_deadlines();
        assert_eq!(on_leader.renew_here(5, || trio.now_ms), Some(30));
        // A transferee that hears nothing: raft gives the transfer up after an election
        // timeout, but a TimeoutNow could still reach it after that.
        trio.cut = Some(transferee as u64 + 1);
        let (reply, _transferred) = oneshot::channel();
        let now_ms = trio.now_ms;
        trio.members[leader].query(
            Query::TransferLeader {
                to: transferee as u64 + 1,
                reply,
            },
            now_ms,
        );
        trio.round();
        assert_eq!(on_leader.window_until_ms(), 0);
        let mut rounds = 0;
        while trio.members[leader].node.raft().lead_transferee().is_some() {
            trio.round();
            rounds += 1;
            assert!(rounds < 50, "raft gives a transfer up");
        }
        let given_up_ms = trio.now_ms;
        assert!(trio.members[leader].is_leader());
        let election_ms = 10 * TICK_MS;
        while trio.now_ms < given_up_ms + election_ms - TICK_MS {
            assert_eq!(
                on_leader.window_until_ms(),
                0,
                "held after the transfer was given up"
            );
            let (reply, mut rx) = oneshot::channel();
            let now_ms = trio.now_ms;
            trio.members[leader].query(Query::KeepAlive { id: 5, reply }, now_ms);
            assert!(
                matches!(rx.try_recv(), Ok(Some(Err(_)))),
                "the raft core holds renewals too"
            );
            trio.round();
        }
        for _ in 0..3 {
            trio.round();
        }
        let now_ms = trio.now_ms;
        assert_eq!(on_leader.renew_here(5, || now_ms), Some(30), "open again");
    }

    #[test]
    fn a_forwarded_write_the_leader_refuses_is_answered_at_once_on_the_follower() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let transferee = (leader + 1) % 3;
        let follower = (leader + 2) % 3;
        // A transfer to a member that cannot hear it stays in progress; meanwhile the leader
        // drops proposals.
        trio.cut = Some(transferee as u64 + 1);
        let (reply, _transfer) = oneshot::channel();
        let now_ms = trio.now_ms;
        trio.members[leader].query(
            Query::TransferLeader {
                to: transferee as u64 + 1,
                reply,
            },
            now_ms,
        );
        let (p, mut rx) = proposal(88, put("refused"));
        trio.members[follower].propose(p, now_ms);
        for _ in 0..3 {
            trio.round();
        }
        assert!(
            matches!(rx.try_recv(), Ok(Some(Err(EtcdError::TooManyRequests)))),
            "the follower's client hears the leader's refusal long before its deadline"
        );
        assert_eq!(
            Refusal::from_code(Refusal::LearnerNotReady.code()),
            Some(Refusal::LearnerNotReady)
        );
        assert_eq!(ProposalKind::from_code(0), None);
    }

    /// A put whose value is over raft's default message size limit (1 MiB), which the
    /// leader refuses alone.
    fn oversized_put(key: &str) -> pb::InternalRaftRequest {
        let mut req = put(key);
        req.put.as_mut().expect("a put").value = Bytes::from(vec![b'v'; (1 << 20) + 1]);
        req
    }

    type WriteAnswer = oneshot::Receiver<Result<Unserved, EtcdError>>;

    /// Proposals of puts to `keys`, ids from `first_id` up, and their answers.
    fn batch_of(keys: &[String], first_id: u64) -> (Vec<Proposal>, Vec<WriteAnswer>) {
        keys.iter()
            .enumerate()
            .map(|(i, key)| proposal(first_id + i as u64, put(key)))
            .unzip()
    }

    /// A delete of every key under "k", as proposal 2,000.
    fn delete_all_k() -> (Proposal, WriteAnswer) {
        proposal(
            2_000,
            pb::InternalRaftRequest {
                delete_range: Some(all_k()),
                ..Default::default()
            },
        )
    }

    fn all_k() -> pb::DeleteRangeRequest {
        pb::DeleteRangeRequest {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
            ..Default::default()
        }
    }

    /// A compare of every key in ["k", "l").
    fn compare_every_k(
        result: pb::compare::CompareResult,
        target: pb::compare::CompareTarget,
        union: pb::compare::TargetUnion,
    ) -> pb::Compare {
        pb::Compare {
            result: result as i32,
            target: target as i32,
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
            target_union: Some(union),
        }
    }

    /// The answer of a txn proposed with `proposal`, which must have come.
    fn txn_answered(answered: &mut WriteAnswer) -> kv::TxnResponse {
        let Ok(Some(Ok(answer))) = answered.try_recv() else {
            panic!("the txn was answered");
        };
        let Answer::Op(op) = answer.response else {
            panic!("a kv answer");
        };
        let kv::OpResponse::Txn(t) = op.check() else {
            panic!("a txn's answer");
        };
        t
    }

    /// The same delete in a txn (no compares), which is applied in steps as well.
    fn delete_all_k_in_a_txn() -> (Proposal, WriteAnswer) {
        proposal(
            2_000,
            pb::InternalRaftRequest {
                txn: Some(pb::TxnRequest {
                    success: vec![pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestDeleteRange(all_k())),
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    }

    /// An entry that reads values whose pages are not in memory (a txn comparing a value in
    /// a durable segment, on a member whose shard never read it) waits for the driver's pager
    /// instead of faulting on the raft core: nothing is applied behind it meanwhile, the
    /// driver may sleep, and once the pages are in it is applied (asked once: no second
    /// wait).
    #[test]
    fn an_entry_reading_values_not_in_memory_waits_for_the_pager() {
        // Values on disk, as the server keeps them.
        let (writer, _) = kv::Store::with_value_log(kv::ValueLogOptions {
            on_disk: true,
            ..Default::default()
        });
        let mut m = started(single_with(writer));
        m.config.values_resident = |_| Some(false);
        // Three values of 400 KB fill a 1 MiB segment: the first is sealed, then durable.
        for id in 1..=3 {
            let (put, _rx) = sized_put(id, 400_000);
            m.propose_batch(vec![put], 0);
            settle(&mut m, 0);
        }
        let sealed = m.take_sealed_segments();
        assert!(!sealed.is_empty(), "a segment was sealed");
        for s in sealed {
            let mut file = s.records.to_vec();
            file.resize(file.len().next_multiple_of(4096), 0);
            m.segment_durable(s.id, s.bytes, Bytes::from(file));
        }
        let applied_before = m.applied_index();
        let txn = |id: u64, key: &str| {
            proposal(
                id,
                pb::InternalRaftRequest {
                    txn: Some(pb::TxnRequest {
                        compare: vec![pb::Compare {
                            result: pb::compare::CompareResult::Equal as i32,
                            target: pb::compare::CompareTarget::Value as i32,
                            key: Bytes::from(key.to_string()),
                            target_union: Some(pb::compare::TargetUnion::Value(Bytes::from(
                                vec![b'v'; 400_000],
                            ))),
                            ..Default::default()
                        }],
                        success: vec![pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                                key: Bytes::from_static(b"compared"),
                                value: Bytes::from_static(b"yes"),
                                ..Default::default()
                            })),
                        }],
                        failure: Vec::new(),
                    }),
                    ..Default::default()
                },
            )
        };
        let (compare, mut answered) = txn(10, "k00001");
        let (behind, mut behind_answered) = sized_put(11, 8);
        m.propose_batch(vec![compare, behind], 0);
        settle(&mut m, 0);
        assert!(m.waiting_for_pages());
        assert!(!m.apply_runnable() && !m.has_work(), "the driver may sleep");
        assert_eq!(
            m.applied_index(),
            applied_before,
            "nothing applied behind it"
        );
        assert!(matches!(answered.try_recv(), Ok(None)));
        assert!(matches!(behind_answered.try_recv(), Ok(None)));
        let PagesWanted { index, records, .. } = m.take_pages_wanted().expect("the pages it reads");
        assert_eq!(index, applied_before + 1);
        assert_eq!(records.len(), 1, "the compared value's record");
        assert!(m.take_pages_wanted().is_none(), "handed out once");
        // A late answer for another entry changes nothing.
        m.pages_brought_in(index + 5, 0);
        assert!(m.waiting_for_pages());
        m.pages_brought_in(index, 0);
        settle(&mut m, 0);
        // The pages are still out (evicted again, as `values_resident` says here): another
        // round, up to the limit, after which the apply faults them in itself.
        for round in 2..=crate::limits::APPLY_PAGER_ROUNDS_MAX {
            assert!(m.waiting_for_pages(), "round {round} asked for");
            assert_eq!(m.applied_index(), applied_before);
            let wanted = m.take_pages_wanted().expect("the pages it reads");
            assert_eq!((wanted.index, wanted.records.len()), (index, 1));
            assert!(wanted.rest.is_none(), "one key: looked at whole");
            m.pages_brought_in(index, 0);
            settle(&mut m, 0);
        }
        assert!(!m.waiting_for_pages());
        assert_eq!(m.applied_index(), applied_before + 2);
        let t = txn_answered(&mut answered);
        assert!(t.succeeded, "it compared the value it waited for");
        assert!(matches!(behind_answered.try_recv(), Ok(Some(Ok(_)))));

        // A pager with no room: the entry is applied at once, its pages faulted in, with no
        // further round.
        let (again, mut again_answered) = txn(12, "k00001");
        m.propose_batch(vec![again], 0);
        settle(&mut m, 0);
        let index = m.take_pages_wanted().expect("the pages it reads").index;
        m.pages_left_out(index, 0);
        settle(&mut m, 0);
        assert!(!m.waiting_for_pages());
        assert_eq!(m.applied_index(), index);
        assert!(matches!(again_answered.try_recv(), Ok(Some(Ok(_)))));

        // Values on more pages than residency is asked about: one pager round, then applied
        // (asking again would only say the same).
        m.config.values_resident = |_| None;
        let (unknown, mut unknown_answered) = txn(13, "k00001");
        m.propose_batch(vec![unknown], 0);
        settle(&mut m, 0);
        let index = m.take_pages_wanted().expect("the pages it reads").index;
        assert_eq!(m.applied_index(), index - 1);
        m.pages_brought_in(index, 0);
        settle(&mut m, 0);
        assert!(!m.waiting_for_pages(), "one round");
        assert_eq!(m.applied_index(), index);
        assert!(txn_answered(&mut unknown_answered).succeeded);
        m.config.values_resident = |_| Some(false);

        // A compare of the values of more keys than a step visits: the raft core looks at a
        // step's keys only, and the pager lists the rest itself, in one round, whatever
        // `values_resident` says afterwards.
        m.config.apply_keys_per_step = 1;
        let (every, mut every_answered) = proposal(
            14,
            pb::InternalRaftRequest {
                txn: Some(pb::TxnRequest {
                    compare: vec![compare_every_k(
                        pb::compare::CompareResult::NotEqual,
                        pb::compare::CompareTarget::Value,
                        pb::compare::TargetUnion::Value(Bytes::from_static(b"x")),
                    )],
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        m.propose_batch(vec![every], 0);
        settle(&mut m, 0);
        let wanted = m.take_pages_wanted().expect("the pages it reads");
        assert_eq!(wanted.records.len(), 1, "one key looked at");
        let rest = wanted.rest.expect("the rest, for the pager to list");
        assert!(rest.records().len() >= 2, "every compared value on disk");
        m.pages_brought_in(wanted.index, 0);
        settle(&mut m, 0);
        assert!(!m.waiting_for_pages(), "one round");
        // Then applied a key per step, as the driver's loop turns.
        let mut steps = 0;
        while m.applying_in_steps() {
            m.apply_step(0);
            settle(&mut m, 0);
            steps += 1;
        }
        assert!(steps >= 2, "{steps} steps");
        assert_eq!(m.applied_index(), wanted.index);
        assert!(txn_answered(&mut every_answered).succeeded);
    }

    /// A delete of many keys, alone or in a txn, is applied a few keys per loop turn on every
    /// member, so the loop goes on between steps (this harness's clock does not run during a
    /// step, so whether the leader survives a long apply is the cluster test's to show). No
    /// read sees part of it, raft hands out nothing behind it until it completes, and a write
    /// proposed meanwhile is applied after it.
    #[test]
    fn a_delete_of_many_keys_is_applied_over_loop_turns() {
        a_delete_is_applied_over_loop_turns(delete_all_k);
        a_delete_is_applied_over_loop_turns(delete_all_k_in_a_txn);
    }

    fn a_delete_is_applied_over_loop_turns(delete: fn() -> (Proposal, WriteAnswer)) {
        let (mut trio, leader) = Trio::stepping_with_keys(4);
        let term = trio.members[leader].raft_term();
        let before = trio.members[leader].writer().current_revision();
        assert_eq!(before, 61, "every put applied");
        let (delete, mut deleted) = delete();
        trio.members[leader].propose(delete, trio.now_ms);
        let mut rounds_stepping = 0;
        let mut put_proposed = None;
        for _ in 0..40 {
            trio.round();
            let stepping = trio.members.iter().any(|m| m.applying_in_steps());
            if !stepping {
                continue;
            }
            rounds_stepping += 1;
            for m in &trio.members {
                if m.applying_in_steps() {
                    assert_eq!(
                        m.writer().reader().current_revision(),
                        before,
                        "no reader sees part of the delete"
                    );
                }
            }
            if put_proposed.is_none() {
                // Proposed while the delete is being applied: it commits behind it.
                let (put, rx) = sized_put(3_000, 8);
                trio.members[leader].propose(put, trio.now_ms);
                put_proposed = Some(rx);
            }
        }
        // 60 keys at 4 per step, one step per Ready and one per loop turn besides.
        assert!(
            rounds_stepping >= 5,
            "the delete took {rounds_stepping} rounds in steps"
        );
        assert_eq!(trio.leader(), Some(leader), "the leader kept its place");
        assert_eq!(trio.members[leader].raft_term(), term, "no election");
        let Ok(Some(Ok(answer))) = deleted.try_recv() else {
            panic!("the delete was answered");
        };
        let Answer::Op(op) = answer.response else {
            panic!("a kv answer");
        };
        let r = match op.check() {
            kv::OpResponse::DeleteRange(r) => r,
            kv::OpResponse::Txn(mut t) => {
                assert!(t.succeeded && t.revision == before + 1, "{t:?}");
                match (t.responses.pop(), t.responses.is_empty()) {
                    (Some(kv::ResponseOp::DeleteRange(r)), true) => r,
                    other => panic!("{other:?} answers no delete alone"),
                }
            }
            other => panic!("{other:?} answers no delete"),
        };
        assert_eq!((r.deleted, r.revision), (60, before + 1));
        let Some(Ok(Some(Ok(put)))) = put_proposed.map(|mut rx| rx.try_recv()) else {
            panic!("the put proposed during the delete was answered");
        };
        let Answer::Op(op) = put.response else {
            panic!("a kv answer");
        };
        let kv::OpResponse::Put(p) = op.check() else {
            panic!("a put's answer");
        };
        assert_eq!(p.revision, before + 2, "applied after the delete");
        for m in &trio.members {
            assert_eq!(m.writer().current_revision(), before + 2);
            assert!(!m.applying_in_steps());
        }
    }

    /// A txn that compares every key of a range and reads them all is applied a few keys per
    /// loop turn too (a compare or read of a million keys held the raft core for 0.3-0.5 s),
    /// on every member, and answers as the txn applied whole would.
    #[test]
    fn a_txn_comparing_and_reading_many_keys_is_applied_over_loop_turns() {
        let (mut trio, leader) = Trio::stepping_with_keys(4);
        let before = trio.members[leader].writer().current_revision();
        let (txn, mut answered) = proposal(
            2_000,
            pb::InternalRaftRequest {
                txn: Some(pb::TxnRequest {
                    compare: vec![compare_every_k(
                        pb::compare::CompareResult::Greater,
                        pb::compare::CompareTarget::Version,
                        pb::compare::TargetUnion::Version(0),
                    )],
                    success: vec![
                        pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                                key: Bytes::from_static(b"x"),
                                value: Bytes::from_static(b"y"),
                                ..Default::default()
                            })),
                        },
                        pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestRange(
                                pb::RangeRequest {
                                    key: Bytes::from_static(b"k"),
                                    range_end: Bytes::from_static(b"l"),
                                    ..Default::default()
                                },
                            )),
                        },
                    ],
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        trio.members[leader].propose(txn, trio.now_ms);
        let mut rounds_stepping = 0;
        for _ in 0..60 {
            trio.round();
            if trio.members.iter().any(|m| m.applying_in_steps()) {
                rounds_stepping += 1;
                for m in trio.members.iter().filter(|m| m.applying_in_steps()) {
                    assert_eq!(m.writer().reader().current_revision(), before);
                }
            }
        }
        // 60 keys compared and 60 read, at 4 per step.
        assert!(
            rounds_stepping >= 15,
            "the txn took {rounds_stepping} rounds in steps"
        );
        let t = txn_answered(&mut answered);
        assert!(t.succeeded && t.revision == before + 1, "{t:?}");
        let Some(kv::ResponseOp::Range(r)) = t.responses.get(1) else {
            panic!("the range's answer");
        };
        assert_eq!((r.count, r.kvs.len()), (60, 60));
        for m in &trio.members {
            assert_eq!(m.writer().current_revision(), before + 1);
            assert!(!m.applying_in_steps());
        }
    }

    /// While an entry is applied in steps no lease can be renewed (apply trails the commit
    /// index), so none expires either: a lease with less time left than the delete takes
    /// survives it, with the time it had left, and expires after that if nobody renews it.
    #[test]
    fn lease_countdowns_stand_still_while_an_entry_is_applied_in_steps() {
        let (mut trio, leader) = Trio::stepping_with_keys(1);
        trio.grant_lease(leader, 7, 2);
        let (delete, _rx) = delete_all_k();
        trio.members[leader].propose(delete, trio.now_ms);
        let started_ms = trio.now_ms;
        let mut rounds = 0;
        while rounds < 100 {
            trio.round();
            rounds += 1;
            if rounds > 2 && !trio.members.iter().any(|m| m.applying_in_steps()) {
                break;
            }
        }
        assert!(
            trio.now_ms - started_ms > 2_500,
            "the delete outlasted the lease's TTL: {} ms",
            trio.now_ms - started_ms
        );
        assert!(
            trio.members[leader].writer().lease(7).is_some(),
            "no lease expires while none can be renewed"
        );
        for _ in 0..30 {
            trio.round();
        }
        assert!(
            trio.members.iter().all(|m| m.writer().lease(7).is_none()),
            "unrenewed, it expires once its countdown resumes"
        );
    }

    #[test]
    fn a_batch_of_writes_reaches_each_follower_in_one_append() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
        let (batch, mut answers) = batch_of(&keys, 1_000);
        let now_ms = trio.now_ms;
        trio.members[leader].propose_batch(batch, now_ms);
        let io = trio.members[leader]
            .ready(now_ms)
            .expect("a batch makes a Ready");
        let appends: Vec<&Message> = io
            .messages
            .iter()
            .filter(|m| m.msg_type == MessageType::Append)
            .collect();
        let mut to: Vec<u64> = appends.iter().map(|m| m.to).collect();
        to.sort_unstable();
        let followers: Vec<u64> = (1..=3).filter(|&id| id != leader as u64 + 1).collect();
        assert_eq!(to, followers, "one append per follower, not one per write");
        assert!(
            appends.iter().all(|m| m.entries.len() == 100),
            "each append carries the whole batch"
        );
        trio.members[leader]
            .persisted(now_ms)
            .expect("no snapshots here");
        // The leader's Ready is taken here, not in the round: deliver its messages by hand.
        for m in io.messages.into_iter().chain(io.persisted_messages) {
            let to = m.to as usize;
            trio.members[to - 1].step(m, now_ms);
        }
        for _ in 0..5 {
            trio.round();
        }
        for rx in &mut answers {
            assert!(
                matches!(rx.try_recv(), Ok(Some(Ok(_)))),
                "every write applied"
            );
        }
        let revisions: Vec<i64> = trio
            .members
            .iter()
            .map(|m| m.writer().current_revision())
            .collect();
        assert_eq!(
            revisions,
            vec![101, 101, 101],
            "every member applied the batch"
        );
    }

    #[test]
    fn a_follower_forwards_its_batch_to_the_leader_in_one_message() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        let keys: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
        let (batch, mut answers) = batch_of(&keys, 2_000);
        let now_ms = trio.now_ms;
        trio.members[follower].propose_batch(batch, now_ms);
        let io = trio.members[follower]
            .ready(now_ms)
            .expect("a forwarded batch makes a Ready");
        let forwarded: Vec<&Message> = io
            .messages
            .iter()
            .filter(|m| m.msg_type == MessageType::Propose)
            .collect();
        assert_eq!(forwarded.len(), 1, "one message for the whole batch");
        assert_eq!(forwarded[0].to, leader as u64 + 1);
        assert_eq!(forwarded[0].entries.len(), 50);
        trio.members[follower]
            .persisted(now_ms)
            .expect("no snapshots here");
        for m in io.messages.into_iter().chain(io.persisted_messages) {
            let to = m.to as usize;
            trio.members[to - 1].step(m, now_ms);
        }
        for _ in 0..10 {
            trio.round();
        }
        for rx in &mut answers {
            assert!(
                matches!(rx.try_recv(), Ok(Some(Ok(_)))),
                "the follower answers each write once applied there"
            );
        }
        assert_eq!(trio.members[follower].writer().current_revision(), 51);
    }

    #[test]
    fn a_batch_raft_refuses_whole_answers_each_write_as_if_proposed_alone() {
        // On the leader: the oversized write is refused, the others go.
        let mut m = started_leader();
        let (a, mut rx_a) = proposal(1, put("a"));
        let (big, mut rx_big) = proposal(2, oversized_put("big"));
        let (b, mut rx_b) = proposal(3, put("b"));
        m.propose_batch(vec![a, big, b], 10);
        assert!(
            matches!(rx_big.try_recv(), Ok(Some(Err(EtcdError::TooManyRequests)))),
            "refused alone, with the leader known: too many requests, as before batching"
        );
        settle(&mut m, 10);
        assert!(matches!(rx_a.try_recv(), Ok(Some(Ok(_)))));
        assert!(matches!(rx_b.try_recv(), Ok(Some(Ok(_)))));
        assert_eq!(m.writer().current_revision(), 3, "both small puts applied");

        // With no leader known yet, every write hears NoLeader.
        let mut trio = Trio::new();
        assert_eq!(trio.members[0].leader_id(), 0);
        let keys: Vec<String> = (0..3).map(|i| format!("n{i}")).collect();
        let (batch, answers) = batch_of(&keys, 10);
        trio.members[0].propose_batch(batch, 0);
        for mut rx in answers {
            assert!(matches!(rx.try_recv(), Ok(Some(Err(EtcdError::NoLeader)))));
        }
    }

    #[test]
    fn a_forwarded_batch_the_leader_refuses_whole_is_stepped_one_write_at_a_time() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        let (a, mut rx_a) = proposal(1, put("a"));
        let (big, mut rx_big) = proposal(2, oversized_put("big"));
        let (b, mut rx_b) = proposal(3, put("b"));
        let now_ms = trio.now_ms;
        trio.members[follower].propose_batch(vec![a, big, b], now_ms);
        for _ in 0..10 {
            trio.round();
        }
        assert!(
            matches!(rx_big.try_recv(), Ok(Some(Err(EtcdError::TooManyRequests)))),
            "only the write the leader refuses alone is refused"
        );
        assert!(matches!(rx_a.try_recv(), Ok(Some(Ok(_)))));
        assert!(matches!(rx_b.try_recv(), Ok(Some(Ok(_)))));
        let revisions: Vec<i64> = trio
            .members
            .iter()
            .map(|m| m.writer().current_revision())
            .collect();
        assert_eq!(
            revisions,
            vec![3, 3, 3],
            "every member applied both small puts"
        );
    }

    #[test]
    fn three_members_elect_a_leader_and_a_follower_write_is_answered_where_it_was_made() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let follower = (leader + 1) % 3;
        assert_eq!(trio.members[follower].leader_id(), leader as u64 + 1);
        let (p, mut rx) = proposal(77, put("from-follower"));
        let now_ms = trio.now_ms;
        trio.members[follower].propose(p, now_ms);
        for _ in 0..10 {
            trio.round();
        }
        assert!(
            matches!(rx.try_recv(), Ok(Some(Ok(_)))),
            "the follower answers its own client once the write applied there"
        );
        let revisions: Vec<i64> = trio
            .members
            .iter()
            .map(|m| m.writer().current_revision())
            .collect();
        assert_eq!(revisions, vec![2, 2, 2], "every member applied the put");
    }

    /// etcd's strict reconfiguration check on a change a follower forwards: with the other
    /// follower unheard for longer than an election timeout, the leader refuses the removal
    /// of the one asking (it would leave one reachable voter of two) and says so, and the
    /// follower answers its caller "unhealthy cluster" once; a write beside it still commits.
    #[test]
    fn a_removal_forwarded_while_a_voter_is_unheard_is_refused_back_as_unhealthy() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let (down, kept) = ((leader + 1) % 3, (leader + 2) % 3);
        trio.cut = Some(down as u64 + 1);
        for _ in 0..25 {
            trio.round();
        }
        assert_eq!(
            trio.leader(),
            Some(leader),
            "the two left keep their leader"
        );
        // `kept` asks for its own removal.
        let ask_removal = |trio: &mut Trio| {
            let (reply, rx) = oneshot::channel();
            let now_ms = trio.now_ms;
            trio.members[kept].query(
                Query::Member {
                    change: MemberChange::Remove {
                        id: kept as u64 + 1,
                    },
                    reply,
                },
                now_ms,
            );
            rx
        };
        let mut rx = ask_removal(&mut trio);
        let now_ms = trio.now_ms;
        let (p, mut written) = proposal(78, put("beside-the-removal"));
        trio.members[kept].propose(p, now_ms);
        for _ in 0..10 {
            trio.round();
        }
        assert!(
            matches!(rx.try_recv(), Ok(Some(Err(EtcdError::Unhealthy)))),
            "the follower hears the leader's refusal"
        );
        assert_eq!(
            trio.members[leader].members().len(),
            3,
            "no one was removed"
        );
        assert!(matches!(written.try_recv(), Ok(Some(Ok(_)))));
        // The same removal with every voter heard again goes through.
        trio.cut = None;
        for _ in 0..10 {
            trio.round();
        }
        let mut rx = ask_removal(&mut trio);
        for _ in 0..10 {
            trio.round();
        }
        assert!(
            matches!(rx.try_recv(), Ok(Some(Ok(_)))),
            "with every voter heard, the removal applies"
        );
    }

    #[test]
    fn a_member_removed_while_cut_off_is_ignored_and_stops_when_told() {
        let mut trio = Trio::new();
        let leader = trio.elect();
        let victim = (leader + 1) % 3;
        let (leader_id, victim_id) = (leader as u64 + 1, victim as u64 + 1);
        trio.cut = Some(victim_id);
        let (reply, mut rx) = oneshot::channel();
        let now_ms = trio.now_ms;
        trio.members[leader].query(
            Query::Member {
                change: MemberChange::Remove { id: victim_id },
                reply,
            },
            now_ms,
        );
        for _ in 0..10 {
            trio.round();
        }
        assert!(
            matches!(rx.try_recv(), Ok(Some(Ok(_)))),
            "the removal applied"
        );
        for (i, m) in trio.members.iter().enumerate() {
            assert_eq!(m.is_removed(victim_id), i != victim, "only the others know");
        }
        let req = trio.members[leader]
            .checkpoint_request()
            .expect("a term for the applied index")
            .expect("a checkpoint is due");
        assert_eq!(
            req.removed,
            vec![victim_id],
            "the checkpoint carries the removal"
        );

        // Its campaign at a higher term, heard again, disturbs no one.
        let term = trio.members[leader].raft_term();
        trio.members[leader].step(
            Message {
                msg_type: MessageType::RequestVote,
                from: victim_id,
                to: leader_id,
                term: term + 5,
                ..Default::default()
            },
            now_ms,
        );
        assert!(trio.members[leader].is_leader());
        assert_eq!(trio.members[leader].raft_term(), term);

        // Told by a peer, it stops once, in etcd's words.
        let stops = |m: &mut Member| {
            m.take_effects()
                .iter()
                .filter(|e| matches!(e, Effect::Removed))
                .count()
        };
        let told = &mut trio.members[victim];
        stops(told);
        told.told_removed(leader_id);
        told.told_removed(leader_id);
        assert_eq!(stops(told), 1, "one stop, however many peers tell it");
    }

    #[test]
    fn a_member_recovered_from_its_wal_records_reapplies_what_it_had() {
        let mut m = single();
        m.start(0);
        let mut wal = settle(&mut m, 0);
        for id in 1..=3 {
            let (p, _rx) = proposal(id, put(&format!("k{id}")));
            m.propose(p, 10);
        }
        wal.extend(settle(&mut m, 10));
        let revision = m.writer().current_revision();
        assert_eq!(revision, 4, "three puts after the empty store's revision 1");

        // Restart from the WAL alone (no checkpoint was written).
        let mut rc = keel_raft::Config::new(1);
        rc.heartbeat_tick = 1;
        rc.seed = 1;
        let infos = m.members().to_vec();
        let r = recovery::recover(
            rc,
            recovery::Start::Founding,
            infos,
            None,
            wal,
            recovery::StoreSource {
                value_log: kv::ValueLogOptions::default(),
                segment_files: &mut |id| Err(format!("no segment {id}")),
                restore_helpers: kv::RestoreHelpers::NONE,
            },
        )
        .expect("a well-formed WAL recovers");
        assert_eq!(r.checkpoint_index, 1, "the bootstrap snapshot");
        let config = m.config.clone();
        let mut again = Member::new(config, r.node, r.writer, r.members, r.alarms, 1);
        again.start(20);
        settle(&mut again, 20);
        assert_eq!(again.writer().current_revision(), revision);
        assert!(again.is_leader());
    }
}
