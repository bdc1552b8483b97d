//! The raft core: one pinned executor that owns the raft state machine, the WAL, the MVCC
//! writer and the peer transport, and turns proposals from every shard into durable, applied
//! writes.
//!
//! One loop iteration: step what peers sent, drain the proposal, read and query mailboxes
//! (everything that arrived while the previous WAL write was in flight forms this batch: group
//! commit), then handle raft's Ready: send the messages that may go out at once, write the hard
//! state, entries and any received snapshot as ONE WAL append (one O_DIRECT write plus one
//! fdatasync), send the messages that vouch for durable state, advance, apply the committed
//! entries to keel-kv and complete each waiting call on its shard.
//!
//! Architecture invariant: only this executor mutates raft, the WAL and the MVCC store. A reply
//! is sent only after the entry it answers is durable and applied.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use keel_grpc::EtcdError;
use keel_io::{DmaStore, Record, Wal};
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use keel_raft::{
    ConfChange, ConfChangeType, Durability, Entry, EntryType, HardState, MemStorage, RawNode, Role,
    Snapshot, SnapshotMetadata, Storage,
};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::alarms::{AlarmAction, Alarms};
use crate::checkpoint;
use crate::compactor::{AutoCompactor, Leadership};
use crate::config::{ClusterState, Config};
use crate::convert;
use crate::error::CoreError;
use crate::ids::{write_durably, Identity, Member};
use crate::limits::Limits;
use crate::peer::{Control, Transport};
use crate::rt;
use crate::shared::{
    kv_error, Answer, LeaseStatus, MemberChange, Outcome, Query, ReadWait, Reply, Shared,
    SnapshotSource,
};
use crate::watch::WatchBatch;

/// Test-only: the key whose stored value a member damages at start (see `open`).
pub const TEST_FLIP_VALUE_ENV: &str = "KEEL_TEST_FLIP_VALUE_OF";

/// WAL record kinds. The WAL frames and checksums them; these say what the payload is.
const WAL_KIND_ENTRY: u8 = 1;
const WAL_KIND_HARD_STATE: u8 = 2;
const WAL_KIND_SNAPSHOT: u8 = 3;

/// Most proposals taken into one raft batch, so one WAL write stays bounded.
const PROPOSALS_PER_BATCH_MAX: usize = 4096;
/// Most bytes of proposals per batch (the WAL's own batch limit is 1 MiB of framed records).
const PROPOSAL_BYTES_PER_BATCH_MAX: usize = 768 * 1024;
/// Keys the compactor visits per step, so a step stays well under a millisecond.
const COMPACT_KEYS_PER_STEP: usize = 256;
/// The TTL a member that is not the leader answers to a forwarded keep-alive.
const KEEPALIVE_NOT_LEADER: i64 = -1;
/// Log entries kept behind a checkpoint for followers that are only slightly behind.
const LOG_TAIL_KEPT_ENTRIES: u64 = 5000;

/// Where the answer to a membership change goes: the member concerned and the new membership.
type MemberReply = oneshot::Sender<Result<(u64, Vec<Member>), EtcdError>>;
/// Where the answer to a leadership transfer goes.
type TransferReply = oneshot::Sender<Result<(), EtcdError>>;

/// The membership change a ConfChange entry carries, as its context.
#[derive(Debug, Serialize, Deserialize)]
struct ConfChangeContext {
    /// Matches the waiting MemberAdd/Remove/Promote call on the member that proposed it.
    request_id: u64,
    member: Option<Member>,
}

/// Everything the raft core owns, opened on its own executor (the WAL is `!Send`).
pub struct RaftCore {
    shared: Arc<Shared>,
    node: RawNode<MemStorage>,
    wal: Wal<DmaStore>,
    writer: kv::Writer,
    snap_dir: PathBuf,
    transport: Rc<Transport>,
    members: Vec<Member>,
    /// The raised alarms, changed only by applied alarm entries (replicated, checkpointed).
    alarms: Alarms,
    /// Defragment calls waiting for the value-log rewrite to finish, with the store's size
    /// when each asked.
    defrag_waiting: Vec<(oneshot::Sender<Result<u64, EtcdError>>, u64)>,
    /// Proposals of this member waiting to be applied, by proposal id, with their deadline.
    waiting: HashMap<u64, (Reply, Instant)>,
    /// Membership changes waiting to be applied, by request id.
    member_waiting: HashMap<u64, (MemberReply, u64, Instant)>,
    /// Physical compactions applied, answered once the compaction has finished.
    physical_waiting: Vec<(Reply, Result<Outcome, EtcdError>)>,
    /// Keep-alives forwarded to the leader, by request id.
    keepalive_waiting: HashMap<u64, (oneshot::Sender<Result<i64, EtcdError>>, Instant)>,
    /// A leadership transfer waiting for the new leader.
    transfer_waiting: Option<(u64, TransferReply, Instant)>,
    /// Reads waiting for their ReadIndex answer, by context.
    reads_in_round: HashMap<u64, (Vec<ReadWait>, Instant)>,
    /// Reads whose ReadIndex is known, waiting for apply to reach it (ascending index).
    reads_to_apply: VecDeque<(u64, Vec<ReadWait>)>,
    next_read_ctx: u64,
    next_request_id: u64,
    applied_since_checkpoint: u64,
    last_checkpoint_index: u64,
    /// When each lease expires, by the leader's clock. Only a leader expires leases.
    lease_deadlines: HashMap<i64, Instant>,
    /// Leases whose revoke was proposed and when, so expiry proposes each once per second.
    lease_revoking: HashMap<i64, Instant>,
    is_leader: bool,
    /// This member's name and client URLs are in the applied membership.
    attributes_published: bool,
    request_timeout: Duration,
    /// etcd's auto-compaction; proposes only while this member leads.
    auto_compactor: AutoCompactor,
}

/// The opened pieces, before the shared state exists.
pub struct RaftCoreParts {
    node: RawNode<MemStorage>,
    wal: Wal<DmaStore>,
    writer: kv::Writer,
    snap_dir: PathBuf,
    members: Vec<Member>,
    alarms: Alarms,
    last_checkpoint_index: u64,
}

/// Opens the data directory: the newest valid checkpoint, then the WAL after it. Returns the
/// core ready to run and the MVCC reader for the shards.
pub async fn open(
    config: &Config,
    identity: &Identity,
) -> Result<(RaftCoreParts, kv::Reader), CoreError> {
    let snap_dir = config.data_dir.join("snap");
    std::fs::create_dir_all(&snap_dir).map_err(|source| CoreError::DataDir {
        path: snap_dir.clone(),
        source,
    })?;
    std::fs::create_dir_all(&config.wal_dir).map_err(|source| CoreError::DataDir {
        path: config.wal_dir.clone(),
        source,
    })?;

    let limits = Limits::new(config);
    let (wal, records) = Wal::open(DmaStore::new(&config.wal_dir), limits.wal.clone())
        .await
        .map_err(|e| CoreError::Wal(e.to_string()))?;
    let checkpoint = checkpoint::load_newest(&snap_dir)?;

    // A founding member starts from a bootstrap snapshot at index 1 holding the initial voters.
    // A member joining an existing cluster starts empty and learns everything from the leader.
    let joining = config.initial_cluster_state == ClusterState::Existing;
    let mut storage = if joining {
        MemStorage::new()
    } else {
        let voters: Vec<u64> = identity.members.iter().map(|m| m.id).collect();
        MemStorage::new_with_voters(&voters)
    };
    let mut members = identity.members.clone();
    let mut alarms = Alarms::default();
    let (writer, reader) = match checkpoint {
        Some(cp) => {
            let (w, r) =
                kv::Store::restore(&cp.kv_image).map_err(|e| CoreError::Store(e.to_string()))?;
            assert_eq!(
                w.applied_index(),
                cp.meta.index,
                "checkpoint header and store disagree on the applied index"
            );
            members = cp.members.clone();
            alarms = Alarms::from_list(&cp.alarms);
            storage.set_conf_state(cp.meta.conf_state.clone());
            // The checkpoint file is also what a far-behind follower receives as a snapshot.
            let data = Bytes::from(checkpoint::encode(
                cp.meta.index,
                cp.meta.term,
                &cp.meta.conf_state,
                &cp.members,
                &cp.alarms,
                &cp.kv_image,
            ));
            storage.apply_snapshot(Snapshot {
                metadata: cp.meta,
                data,
            });
            (w, r)
        }
        None => kv::Store::new(),
    };
    let mut writer = writer;
    if let Ok(key) = std::env::var(TEST_FLIP_VALUE_ENV) {
        // Test-only: damage this member's copy of one value, as a disk or memory fault would,
        // so tests can watch the corruption checks find it.
        let flipped = writer.test_only_flip_value(key.as_bytes());
        tracing::warn!(key, flipped, "TEST ONLY: flipped a stored value");
    }
    let applied = storage.first_index() - 1;

    // Replay: entries as raft last wrote them (a later entry at an index overwrites the tail
    // from there); a snapshot record discards everything before it.
    let mut entries: Vec<Entry> = Vec::new();
    let mut hard_state: Option<HardState> = None;
    for rec in records {
        match rec.kind {
            WAL_KIND_ENTRY => {
                let e = Entry::decode(&rec.payload)
                    .map_err(|e| CoreError::Wal(format!("bad entry record: {e}")))?;
                while entries.last().is_some_and(|last| last.index >= e.index) {
                    entries.pop();
                }
                entries.push(e);
            }
            WAL_KIND_HARD_STATE => {
                hard_state = Some(
                    HardState::decode(&rec.payload)
                        .map_err(|e| CoreError::Wal(format!("bad hard state record: {e}")))?,
                );
            }
            WAL_KIND_SNAPSHOT => {
                let meta = SnapshotMetadata::decode(&rec.payload)
                    .map_err(|e| CoreError::Wal(format!("bad snapshot record: {e}")))?;
                entries.clear();
                if meta.index > applied {
                    // Snapshots with state are checkpointed before their WAL record is written;
                    // only the empty bootstrap snapshot (index 1) has no checkpoint.
                    if meta.index > 1 {
                        return Err(CoreError::Wal(format!(
                            "WAL names snapshot {} past the newest checkpoint {applied}",
                            meta.index
                        )));
                    }
                    storage.set_conf_state(meta.conf_state.clone());
                    storage.apply_snapshot(Snapshot {
                        metadata: meta,
                        data: Bytes::new(),
                    });
                }
            }
            other => return Err(CoreError::Wal(format!("unknown WAL record kind {other}"))),
        }
    }
    let applied = storage.first_index() - 1;
    let tail: Vec<Entry> = entries.into_iter().filter(|e| e.index > applied).collect();
    if let Some(first) = tail.first() {
        if first.index != applied + 1 {
            return Err(CoreError::Wal(format!(
                "WAL entries start at {} but the checkpoint ends at {applied}: a gap",
                first.index
            )));
        }
        storage.append(&tail);
    }
    // The commit index may trail what the log holds (it is persisted lazily); it never points
    // past the last entry we have, and never below what the checkpoint applied.
    let mut hard_state = hard_state.unwrap_or_else(|| storage.hard_state());
    hard_state.term = hard_state.term.max(storage.hard_state().term);
    hard_state.commit = hard_state
        .commit
        .clamp(applied, storage.last_index().max(applied));
    storage.set_hard_state(hard_state);

    let mut rc = keel_raft::Config::new(identity.member_id);
    rc.heartbeat_tick = 1;
    rc.election_tick = (config.election_timeout_ms / config.heartbeat_interval_ms).max(2) as usize;
    rc.applied = applied;
    rc.seed = identity.member_id;
    rc.max_size_per_msg_bytes = limits.raft_msg_bytes_max;
    rc.max_uncommitted_entries_bytes = limits.raft_uncommitted_bytes_max;
    let node = RawNode::new(&rc, storage).map_err(|e| CoreError::Raft(e.to_string()))?;
    tracing::info!(
        applied_index = applied,
        last_index = node.store().last_index(),
        term = hard_state.term,
        commit = hard_state.commit,
        "recovered raft log"
    );
    Ok((
        RaftCoreParts {
            node,
            wal,
            writer,
            snap_dir,
            members,
            alarms,
            last_checkpoint_index: applied,
        },
        reader,
    ))
}

impl RaftCore {
    /// Builds the core on its executor; binds the peer listeners.
    pub fn new(parts: RaftCoreParts, shared: Arc<Shared>) -> Result<RaftCore, CoreError> {
        let RaftCoreParts {
            node,
            wal,
            writer,
            snap_dir,
            members,
            alarms,
            last_checkpoint_index,
        } = parts;
        publish_store_size(&shared, &writer);
        shared.publish_alarms(&alarms);
        shared
            .applied_index
            .store(writer.applied_index(), Ordering::Release);
        let transport = Transport::new(
            shared.member_id(),
            shared.cluster_id(),
            shared.limits.peer_frame_bytes_max,
        );
        for addr in &shared.config.listen_peer_addrs {
            transport
                .listen(*addr)
                .map_err(|source| CoreError::Listen {
                    addr: *addr,
                    source,
                })?;
        }
        let request_timeout = shared.request_timeout();
        let auto_compactor = AutoCompactor::new(
            shared.config.auto_compaction,
            shared.config.heartbeat_interval_ms,
            Instant::now(),
            writer.current_revision(),
        );
        let mut core = RaftCore {
            shared,
            node,
            wal,
            writer,
            snap_dir,
            transport,
            members: Vec::new(),
            alarms,
            defrag_waiting: Vec::new(),
            waiting: HashMap::new(),
            member_waiting: HashMap::new(),
            keepalive_waiting: HashMap::new(),
            physical_waiting: Vec::new(),
            transfer_waiting: None,
            reads_in_round: HashMap::new(),
            reads_to_apply: VecDeque::new(),
            next_read_ctx: 1,
            next_request_id: 1,
            applied_since_checkpoint: 0,
            last_checkpoint_index,
            lease_deadlines: HashMap::new(),
            lease_revoking: HashMap::new(),
            is_leader: false,
            attributes_published: false,
            request_timeout,
            auto_compactor,
        };
        core.set_members(members);
        Ok(core)
    }

    /// The peer transport (for tasks beside the raft loop on this executor).
    pub fn transport(&self) -> Rc<Transport> {
        self.transport.clone()
    }

    fn set_members(&mut self, members: Vec<Member>) {
        let peers: Vec<(u64, Vec<String>)> = members
            .iter()
            .map(|m| (m.id, m.peer_urls.clone()))
            .collect();
        self.transport.set_peers(&peers);
        let me = self.shared.member_id();
        let mine = members.iter().find(|m| m.id == me);
        self.shared
            .is_learner
            .store(mine.is_some_and(|m| m.is_learner), Ordering::Release);
        self.attributes_published = mine.is_some_and(|m| {
            m.name == self.shared.config.name
                && m.client_urls == self.shared.config.advertise_client_urls
        });
        *self
            .shared
            .members
            .lock()
            .expect("members lock is never poisoned") = members.clone();
        self.members = members;
    }

    /// Runs until the node is asked to stop; then writes a checkpoint so the next start is fast.
    pub async fn run(mut self) -> Result<(), CoreError> {
        let tick = Duration::from_millis(self.shared.config.heartbeat_interval_ms);
        let mut next_tick = Instant::now() + tick;
        // A lone voter need not wait an election timeout to lead its own cluster.
        if self.node.raft().conf_state().voters == [self.shared.member_id()] {
            self.node.campaign();
        }
        self.restart_lease_clocks();
        loop {
            self.shared
                .raft_loop_at_ms
                .store(self.shared.uptime_ms(), Ordering::Release);
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
            let idle = !self.node.has_ready()
                && self.shared.proposals.is_empty()
                && self.shared.reads.is_empty()
                && self.shared.queries.is_empty()
                && !self.transport.has_inbox()
                && !self.writer.compaction_pending();
            if idle {
                let wait = next_tick.saturating_duration_since(Instant::now());
                let proposals = self.shared.proposals.clone();
                let reads = self.shared.reads.clone();
                let queries = self.shared.queries.clone();
                let transport = self.transport.clone();
                futures_lite::future::or(
                    futures_lite::future::or(proposals.ready(), reads.ready()),
                    futures_lite::future::or(
                        futures_lite::future::or(queries.ready(), transport.inbox_ready()),
                        rt::sleep(wait),
                    ),
                )
                .await;
            }
            self.step_peers();
            let now = Instant::now();
            if now >= next_tick {
                while now >= next_tick {
                    self.node.tick();
                    next_tick += tick;
                }
                self.expire_leases();
                let (rev, role) = (
                    self.writer.current_revision(),
                    Leadership::of(self.is_leader),
                );
                self.auto_compactor.tick(now, rev, role, &self.shared);
                self.expire_waiting(now);
                self.publish_attributes();
            }
            self.answer_queries();
            self.take_proposals();
            self.take_reads();
            if self.node.has_ready() {
                self.handle_ready().await?;
            } else if self.writer.compaction_pending() {
                // Compaction runs in bounded steps between batches, never as one long pause.
                self.writer.compact_step(COMPACT_KEYS_PER_STEP);
                publish_store_size(&self.shared, &self.writer);
                futures_lite::future::yield_now().await;
            }
            if !self.writer.compaction_pending() {
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
        }
        self.fail_all_waiting(EtcdError::Stopped);
        if self.writer.applied_index() > self.last_checkpoint_index {
            self.checkpoint().await?;
        }
        Ok(())
    }

    fn step_peers(&mut self) {
        for m in self.transport.take_inbox() {
            if let Err(e) = self.node.step(m) {
                tracing::debug!(error = %e, "peer message refused");
            }
        }
        for c in self.transport.take_control() {
            match c {
                Control::KeepAlive {
                    from,
                    request_id,
                    lease,
                } => {
                    let ttl = if self.is_leader {
                        self.renew_lease(lease)
                    } else {
                        KEEPALIVE_NOT_LEADER
                    };
                    self.transport.send_keepalive_reply(from, request_id, ttl);
                }
                Control::HashKv {
                    from,
                    request_id,
                    revision,
                } => crate::corrupt::answer_peer(
                    self.shared.clone(),
                    self.transport.clone(),
                    from,
                    request_id,
                    revision,
                ),
                Control::KeepAliveReply { request_id, ttl } => {
                    if let Some((reply, _)) = self.keepalive_waiting.remove(&request_id) {
                        let _ = reply.send(if ttl == KEEPALIVE_NOT_LEADER {
                            Err(EtcdError::NotLeader)
                        } else {
                            Ok(ttl)
                        });
                    }
                }
            }
        }
        let (unreachable, snapshots) = self.transport.take_reports();
        for id in unreachable {
            self.node.report_unreachable(id);
        }
        for (id, status) in snapshots {
            self.node.report_snapshot(id, status);
        }
        if let Some(cid) = self.transport.learned_cluster_id() {
            if self.shared.cluster_id() == 0 {
                tracing::info!(cluster_id = format!("{cid:x}"), "joined the cluster");
                self.shared.set_cluster_id(cid);
                let mut identity = self.shared.identity.clone();
                identity.cluster_id = cid;
                if let Err(e) = identity.save(&self.shared.config.data_dir) {
                    tracing::error!(error = %e, "cannot record the cluster id");
                }
            }
        }
    }

    /// Calls that waited longer than etcd's request timeout get "request timed out".
    fn expire_waiting(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, (_, d))| *d <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some((reply, _)) = self.waiting.remove(&id) {
                let _ = reply.send(Err(EtcdError::Timeout));
            }
        }
        let expired: Vec<u64> = self
            .member_waiting
            .iter()
            .filter(|(_, (_, _, d))| *d <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some((reply, _, _)) = self.member_waiting.remove(&id) {
                let _ = reply.send(Err(EtcdError::Timeout));
            }
        }
        let expired: Vec<u64> = self
            .keepalive_waiting
            .iter()
            .filter(|(_, (_, d))| *d <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some((reply, _)) = self.keepalive_waiting.remove(&id) {
                let _ = reply.send(Err(EtcdError::Timeout));
            }
        }
        if self
            .transfer_waiting
            .as_ref()
            .is_some_and(|(_, _, d)| *d <= now)
        {
            if let Some((_, reply, _)) = self.transfer_waiting.take() {
                let _ = reply.send(Err(EtcdError::Timeout));
            }
        }
        let expired: Vec<u64> = self
            .reads_in_round
            .iter()
            .filter(|(_, (_, d))| *d <= now)
            .map(|(c, _)| *c)
            .collect();
        for ctx in expired {
            if let Some((waits, _)) = self.reads_in_round.remove(&ctx) {
                for w in waits {
                    let _ = w.reply.send(Err(EtcdError::Timeout));
                }
            }
        }
    }

    /// Once a leader is known, a member makes sure the cluster knows its name and client URLs
    /// (MemberList reports them; etcdctl dials them), as etcd publishes its attributes.
    fn publish_attributes(&mut self) {
        if self.attributes_published
            || !self.shared.has_leader()
            || self.node.raft().soft_state().leader_id == 0
        {
            return;
        }
        let me = self.shared.member_id();
        if !self.members.iter().any(|m| m.id == me) {
            return;
        }
        let req = pb::InternalRaftRequest {
            header: Some(pb::RequestHeader::default()),
            keel_member_attributes: Some(pb::MemberAttributes {
                id: me,
                name: self.shared.config.name.clone(),
                client_urls: self.shared.config.advertise_client_urls.clone(),
            }),
            ..Default::default()
        };
        if self.node.propose(Bytes::from(req.encode_to_vec())).is_ok() {
            // Assume it lands; the membership apply re-arms this if it did not.
            self.attributes_published = true;
        }
    }

    /// Every lease's countdown restarts from its full TTL: on start and when this member becomes
    /// leader, as etcd does, since the old leader's clock is gone.
    fn restart_lease_clocks(&mut self) {
        let now = Instant::now();
        self.lease_deadlines = self
            .writer
            .leases()
            .into_iter()
            .map(|l| (l.id, now + Duration::from_secs(l.ttl_s.max(0) as u64)))
            .collect();
        self.lease_revoking.clear();
    }

    /// Restarts a lease's countdown (leader only); its TTL, or 0 when the lease is unknown.
    fn renew_lease(&mut self, id: i64) -> i64 {
        match self.writer.lease(id) {
            Some(l) => {
                self.lease_deadlines.insert(
                    id,
                    Instant::now() + Duration::from_secs(l.ttl_s.max(0) as u64),
                );
                l.ttl_s
            }
            None => 0,
        }
    }

    /// Proposes a revoke for every lease past its deadline (leader only).
    fn expire_leases(&mut self) {
        if !self.is_leader {
            return;
        }
        let now = Instant::now();
        let expired: Vec<i64> = self
            .lease_deadlines
            .iter()
            .filter(|(id, deadline)| {
                **deadline <= now
                    && self
                        .lease_revoking
                        .get(id)
                        .is_none_or(|at| now.duration_since(*at) > Duration::from_secs(1))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let req = pb::InternalRaftRequest {
                header: Some(pb::RequestHeader::default()),
                lease_revoke: Some(pb::LeaseRevokeRequest { id }),
                ..Default::default()
            };
            match self.node.propose(Bytes::from(req.encode_to_vec())) {
                Ok(()) => {
                    tracing::debug!(lease = id, "lease expired; revoke proposed");
                    self.lease_revoking.insert(id, now);
                }
                Err(e) => {
                    tracing::warn!(lease = id, error = %e, "cannot propose the revoke of an expired lease")
                }
            }
        }
    }

    fn answer_queries(&mut self) {
        while let Some(q) = self.shared.queries.try_recv() {
            let not_leader = if self.shared.has_leader() {
                EtcdError::NotLeader
            } else {
                EtcdError::NoLeader
            };
            match q {
                Query::KeepAlive { id, reply } => {
                    if self.is_leader {
                        let _ = reply.send(Ok(self.renew_lease(id)));
                        continue;
                    }
                    // Only the leader's clock renews leases: forward, as etcd does.
                    let leader = self.shared.leader_id.load(Ordering::Acquire);
                    if leader == 0 {
                        let _ = reply.send(Err(not_leader));
                        continue;
                    }
                    let request_id = self.next_request_id;
                    self.next_request_id += 1;
                    self.transport.send_keepalive(leader, request_id, id);
                    self.keepalive_waiting
                        .insert(request_id, (reply, Instant::now() + self.request_timeout));
                }
                Query::TimeToLive { id, reply } => {
                    let status = self.writer.lease(id).map(|l| {
                        let remaining = self.lease_deadlines.get(&id).map_or(l.ttl_s, |d| {
                            d.saturating_duration_since(Instant::now()).as_secs() as i64
                        });
                        LeaseStatus {
                            remaining_ttl_s: remaining,
                            granted_ttl_s: l.ttl_s,
                            keys: l.keys,
                        }
                    });
                    let _ = reply.send(Ok(status));
                }
                Query::Leases { reply } => {
                    let _ =
                        reply.send(Ok(self.writer.leases().into_iter().map(|l| l.id).collect()));
                }
                Query::Member { change, reply } => self.propose_member_change(change, reply),
                Query::Snapshot { reply } => {
                    let index = self.writer.applied_index();
                    let snapshot = self.node.store().term(index).map(|term| SnapshotSource {
                        source: self.writer.checkpoint_source(),
                        index,
                        term,
                        conf_state: self.node.raft().conf_state(),
                        members: self.members.clone(),
                        alarms: self.alarms.list(),
                    });
                    let _ = reply.send(snapshot.map_err(|_| EtcdError::Unhealthy));
                }
                Query::Defragment { reply } => {
                    tracing::info!(size_bytes = self.writer.size_bytes(), "defragment started");
                    self.writer.defragment();
                    self.defrag_waiting.push((reply, self.writer.size_bytes()));
                }
                Query::TransferLeader { to, reply } => {
                    if !self.is_leader {
                        let _ = reply.send(Err(not_leader));
                    } else if to == self.shared.member_id() {
                        let _ = reply.send(Ok(()));
                    } else if !self.node.raft().conf_state().voters.contains(&to) {
                        let _ = reply.send(Err(EtcdError::BadLeaderTransferee));
                    } else {
                        self.node.transfer_leader(to);
                        self.transfer_waiting =
                            Some((to, reply, Instant::now() + self.request_timeout));
                    }
                }
            }
        }
    }

    fn propose_member_change(&mut self, change: MemberChange, reply: MemberReply) {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let find = |id: u64| self.members.iter().find(|m| m.id == id).cloned();
        let result = match &change {
            MemberChange::Add { peer_urls, learner } => {
                if self
                    .members
                    .iter()
                    .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
                {
                    Err(EtcdError::PeerUrlExist)
                } else {
                    let probe = crate::config::InitialMember {
                        name: String::new(),
                        peer_urls: peer_urls.clone(),
                    };
                    let id = crate::ids::member_id(&probe, &self.shared.identity.cluster_token);
                    if find(id).is_some() {
                        Err(EtcdError::MemberExist)
                    } else {
                        let member = Member {
                            id,
                            name: String::new(),
                            peer_urls: peer_urls.clone(),
                            client_urls: Vec::new(),
                            is_learner: *learner,
                        };
                        let change_type = if *learner {
                            ConfChangeType::AddLearnerNode
                        } else {
                            ConfChangeType::AddNode
                        };
                        Ok((change_type, id, Some(member)))
                    }
                }
            }
            MemberChange::Remove { id } => match find(*id) {
                None => Err(EtcdError::MemberNotFound),
                Some(m) => Ok((ConfChangeType::RemoveNode, *id, Some(m))),
            },
            MemberChange::Promote { id } => match find(*id) {
                None => Err(EtcdError::MemberNotFound),
                Some(m) if !m.is_learner => Err(EtcdError::MemberNotLearner),
                Some(m) => Ok((
                    ConfChangeType::AddNode,
                    *id,
                    Some(Member {
                        is_learner: false,
                        ..m
                    }),
                )),
            },
            MemberChange::Update { id, peer_urls } => match find(*id) {
                None => Err(EtcdError::MemberNotFound),
                Some(_) => {
                    // A URL change is not a raft membership change: it travels as a normal
                    // entry, applied in order with everything else.
                    let req = pb::InternalRaftRequest {
                        header: Some(pb::RequestHeader {
                            id: request_id,
                            ..Default::default()
                        }),
                        keel_member_update: Some(pb::MemberUpdateRequest {
                            id: *id,
                            peer_ur_ls: peer_urls.clone(),
                        }),
                        ..Default::default()
                    };
                    match self.node.propose(Bytes::from(req.encode_to_vec())) {
                        Ok(()) => {
                            self.member_waiting.insert(
                                request_id,
                                (reply, *id, Instant::now() + self.request_timeout),
                            );
                        }
                        Err(_) => {
                            let _ = reply.send(Err(EtcdError::NoLeader));
                        }
                    }
                    return;
                }
            },
        };
        let (change_type, node_id, member) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let context = serde_json::to_vec(&ConfChangeContext { request_id, member })
            .expect("context serializes");
        let cc = ConfChange {
            change_type,
            node_id,
            context: context.into(),
        };
        match self.node.propose_conf_change(&cc) {
            Ok(()) => {
                self.member_waiting.insert(
                    request_id,
                    (reply, node_id, Instant::now() + self.request_timeout),
                );
            }
            Err(keel_raft::Error::LearnerNotCaughtUp(_)) => {
                let _ = reply.send(Err(EtcdError::LearnerNotReady));
            }
            Err(keel_raft::Error::ConfChangePending) => {
                let _ = reply.send(Err(EtcdError::TooManyRequests));
            }
            Err(e) => {
                tracing::warn!(error = %e, "membership change refused");
                let _ = reply.send(Err(if self.shared.has_leader() {
                    EtcdError::NotLeader
                } else {
                    EtcdError::NoLeader
                }));
            }
        }
    }

    fn take_proposals(&mut self) {
        let mut count = 0;
        let mut bytes = 0;
        let deadline = Instant::now() + self.request_timeout;
        while count < PROPOSALS_PER_BATCH_MAX && bytes < PROPOSAL_BYTES_PER_BATCH_MAX {
            let Some(p) = self.shared.proposals.try_recv() else {
                break;
            };
            count += 1;
            bytes += p.data.len();
            match self.node.propose(p.data) {
                Ok(()) => {
                    let previous = self.waiting.insert(p.id, (p.reply, deadline));
                    assert!(previous.is_none(), "proposal id {} used twice", p.id);
                }
                Err(keel_raft::Error::ProposalDropped(why)) => {
                    tracing::debug!(why, "proposal dropped");
                    let err = if self.shared.has_leader() {
                        EtcdError::TooManyRequests
                    } else {
                        EtcdError::NoLeader
                    };
                    let _ = p.reply.send(Err(err));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "proposal refused");
                    let _ = p.reply.send(Err(EtcdError::Stopped));
                }
            }
        }
    }

    fn take_reads(&mut self) {
        let mut batch = Vec::new();
        while let Some(r) = self.shared.reads.try_recv() {
            batch.push(r);
        }
        if batch.is_empty() {
            return;
        }
        // One ReadIndex round serves every read that arrived since the last one.
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        match self
            .node
            .read_index(Bytes::copy_from_slice(&ctx.to_be_bytes()))
        {
            Ok(()) => {
                self.reads_in_round
                    .insert(ctx, (batch, Instant::now() + self.request_timeout));
            }
            Err(_) => {
                let err = if self.shared.has_leader() {
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

    async fn handle_ready(&mut self) -> Result<(), CoreError> {
        let rd = self.node.ready();
        if let Some(ss) = rd.soft_state {
            self.shared.leader_id.store(ss.leader_id, Ordering::Release);
            let was_leader = self.is_leader;
            self.is_leader = ss.role == Role::Leader;
            if self.is_leader && !was_leader {
                self.restart_lease_clocks();
            }
            // Publish our name and client URLs as soon as there is a leader to take them.
            if ss.leader_id != 0 {
                self.publish_attributes();
            }
            if let Some((to, _, _)) = &self.transfer_waiting {
                if ss.leader_id == *to {
                    if let Some((_, reply, _)) = self.transfer_waiting.take() {
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            tracing::info!(leader = format!("{:x}", ss.leader_id), role = ?ss.role, "raft role changed");
        }
        // Appends and heartbeats go out while our own write is in flight: the leader's own
        // log counts toward the quorum only after advance().
        for m in rd.messages {
            self.transport.send(m);
        }

        // Entries committed earlier are already durable here: apply them (and answer their
        // callers) now, before this Ready's own write, so a batch's replies never wait for the
        // next batch's fdatasync. A snapshot must be installed first, so then they wait.
        let mut committed = Some(rd.committed_entries);
        let mut read_states = Some(rd.read_states);
        if rd.snapshot.is_none() {
            self.apply(committed.take().unwrap_or_default());
            self.note_read_states(read_states.take().unwrap_or_default());
        }

        let mut records = Vec::with_capacity(rd.entries.len() + 2);
        if let Some(snap) = &rd.snapshot {
            // The snapshot's state is made durable as a checkpoint BEFORE its WAL record, so
            // a restart that finds the record always finds the state.
            self.persist_snapshot(snap).await?;
            let mut buf = Vec::new();
            snap.metadata.encode(&mut buf);
            records.push(Record {
                kind: WAL_KIND_SNAPSHOT,
                index: snap.metadata.index,
                payload: buf.into(),
            });
        }
        for e in &rd.entries {
            let mut buf = Vec::with_capacity(e.data.len() + 32);
            e.encode(&mut buf);
            records.push(Record {
                kind: WAL_KIND_ENTRY,
                index: e.index,
                payload: buf.into(),
            });
        }
        if let Some(hs) = rd.hard_state {
            self.shared.raft_term.store(hs.term, Ordering::Release);
            self.shared.commit_index.store(hs.commit, Ordering::Release);
            // A commit-only change is recoverable from the log and peers: it rides along with
            // the next synced batch instead of costing an fdatasync of its own.
            if rd.durability == Durability::Sync {
                let mut buf = Vec::new();
                hs.encode(&mut buf);
                let index = rd
                    .entries
                    .last()
                    .map_or(self.node.store().last_index(), |e| e.index);
                records.push(Record {
                    kind: WAL_KIND_HARD_STATE,
                    index,
                    payload: buf.into(),
                });
            }
        }
        if rd.durability == Durability::Sync && !records.is_empty() {
            // Returns only after the write and its fdatasync completed; a failed fsync aborts
            // the process inside keel-io, so an error here is an I/O error before the sync.
            self.wal
                .append(records)
                .await
                .map_err(|e| CoreError::Wal(e.to_string()))?;
        }
        // Votes and append responses vouch for durable state: only now may they go out.
        for m in rd.persisted_messages {
            self.transport.send(m);
        }
        self.node.advance();
        if let Some(snap) = rd.snapshot {
            self.install_snapshot(snap)?;
        }
        if let Some(entries) = committed {
            self.apply(entries);
        }
        if let Some(rs) = read_states {
            self.note_read_states(rs);
        }
        if self.applied_since_checkpoint >= self.shared.config.snapshot_count {
            self.checkpoint().await?;
        }
        Ok(())
    }

    fn note_read_states(&mut self, read_states: Vec<keel_raft::ReadState>) {
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

    /// Writes a leader's snapshot as our newest checkpoint (durably).
    async fn persist_snapshot(&mut self, snap: &Snapshot) -> Result<(), CoreError> {
        if snap.data.is_empty() {
            return Ok(());
        }
        let index = snap.metadata.index;
        let dir = self.snap_dir.clone();
        let path = dir.join(checkpoint::file_name(index));
        let data = snap.data.clone();
        glommio::executor()
            .spawn_blocking(move || write_durably(&dir, &path, &data))
            .await?;
        Ok(())
    }

    /// Replaces the store with a leader's snapshot. Shards switch readers; their watchers
    /// resynchronize from the new store's history.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<(), CoreError> {
        let index = snap.metadata.index;
        if snap.data.is_empty() {
            // The bootstrap snapshot: an empty store whose membership is in the metadata.
            let ids = snap
                .metadata
                .conf_state
                .voters
                .iter()
                .chain(snap.metadata.conf_state.learners.iter());
            let known = self.members.clone();
            let members = ids
                .map(|id| {
                    known
                        .iter()
                        .find(|m| m.id == *id)
                        .cloned()
                        .unwrap_or(Member {
                            id: *id,
                            name: String::new(),
                            peer_urls: Vec::new(),
                            client_urls: Vec::new(),
                            is_learner: snap.metadata.conf_state.learners.contains(id),
                        })
                })
                .collect();
            self.set_members(members);
            return Ok(());
        }
        let cp = checkpoint::decode(&snap.data)
            .map_err(|why| CoreError::Raft(format!("leader sent a bad snapshot: {why}")))?;
        let (writer, reader) =
            kv::Store::restore(&cp.kv_image).map_err(|e| CoreError::Store(e.to_string()))?;
        self.writer = writer;
        self.shared.replace_reader(reader);
        self.set_members(cp.members);
        self.alarms = Alarms::from_list(&cp.alarms);
        self.shared.publish_alarms(&self.alarms);
        self.last_checkpoint_index = index;
        self.applied_since_checkpoint = 0;
        self.shared.applied_index.store(index, Ordering::Release);
        publish_store_size(&self.shared, &self.writer);
        for (shard, flag) in self.shared.watch_overflow.iter().enumerate() {
            flag.store(true, Ordering::Release);
            self.shared.watch_batches[shard].nudge();
        }
        self.restart_lease_clocks();
        checkpoint::remove_older(&self.snap_dir, index);
        tracing::info!(index, "installed the leader's snapshot");
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        let term = self.shared.raft_term.load(Ordering::Acquire);
        let mut events = Vec::new();
        for e in entries {
            if e.index <= self.writer.applied_index() {
                // Already in the store (a snapshot covered it).
                continue;
            }
            self.applied_since_checkpoint += 1;
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
                        continue;
                    }
                    if let Some(alarm) = req.alarm {
                        let result = match AlarmAction::from_pb(alarm.action) {
                            Some(action) => {
                                let listed =
                                    self.alarms.apply(action, alarm.member_id, alarm.alarm);
                                self.shared.publish_alarms(&self.alarms);
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
                        continue;
                    }
                    let op = request_op(req);
                    let physical = matches!(&op, Some(kv::Op::Compact(c)) if c.physical);
                    // Under a raised alarm some writes are refused at apply, from the
                    // replicated alarm set, so every member refuses the same entries.
                    let refusal = op.as_ref().and_then(|op| self.alarms.refusal(op));
                    let result = match op {
                        Some(_) if refusal.is_some() => {
                            self.writer.apply_empty(e.index);
                            Err(refusal.expect("checked by the guard"))
                        }
                        Some(op) => {
                            let r = self.writer.apply(e.index, &op).map_err(kv_error);
                            if r.is_ok() {
                                self.lease_applied(&op);
                            }
                            r
                        }
                        None => {
                            self.writer.apply_empty(e.index);
                            Err(EtcdError::NotCapable)
                        }
                    };
                    let result = result.map(|applied| {
                        events.extend(applied.events);
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
            }
        }
        let applied = self.writer.applied_index();
        self.shared.applied_index.store(applied, Ordering::Release);
        publish_store_size(&self.shared, &self.writer);
        self.publish_events(events);
    }

    fn apply_conf_change(&mut self, e: &Entry) {
        let cc = match ConfChange::decode(&e.data) {
            Ok(cc) => cc,
            Err(err) => {
                tracing::error!(index = e.index, error = %err, "undecodable configuration change skipped");
                return;
            }
        };
        let cs = self.node.apply_conf_change(&cc);
        let ctx: Option<ConfChangeContext> = serde_json::from_slice(&cc.context).ok();
        let mut members = self.members.clone();
        match cc.change_type {
            ConfChangeType::RemoveNode => members.retain(|m| m.id != cc.node_id),
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                let learner = cc.change_type == ConfChangeType::AddLearnerNode;
                match members.iter_mut().find(|m| m.id == cc.node_id) {
                    Some(m) => m.is_learner = learner,
                    None => {
                        let mut m = ctx
                            .as_ref()
                            .and_then(|c| c.member.clone())
                            .unwrap_or(Member {
                                id: cc.node_id,
                                name: String::new(),
                                peer_urls: Vec::new(),
                                client_urls: Vec::new(),
                                is_learner: learner,
                            });
                        m.is_learner = learner;
                        members.push(m);
                    }
                }
            }
        }
        // Raft's view decides who is in: drop anyone it no longer lists.
        members.retain(|m| cs.voters.contains(&m.id) || cs.learners.contains(&m.id));
        tracing::info!(change = ?cc.change_type, node = format!("{:x}", cc.node_id), voters = cs.voters.len(), learners = cs.learners.len(), "membership changed");
        self.set_members(members);
        if let Some(ctx) = ctx {
            if let Some((reply, node, _)) = self.member_waiting.remove(&ctx.request_id) {
                let _ = reply.send(Ok((node, self.members.clone())));
            }
        }
        if cc.change_type == ConfChangeType::RemoveNode && cc.node_id == self.shared.member_id() {
            tracing::warn!("this member was removed from the cluster; stopping");
            self.shared.stopping.store(true, Ordering::Release);
        }
    }

    fn apply_member_request(&mut self, req: pb::InternalRaftRequest, request_id: u64) {
        let mut members = self.members.clone();
        if let Some(a) = req.keel_member_attributes {
            if let Some(m) = members.iter_mut().find(|m| m.id == a.id) {
                m.name = a.name;
                m.client_urls = a.client_urls;
            }
        }
        let mut updated = None;
        if let Some(u) = req.keel_member_update {
            if let Some(m) = members.iter_mut().find(|m| m.id == u.id) {
                m.peer_urls = u.peer_ur_ls;
                updated = Some(u.id);
            }
        }
        self.set_members(members);
        if let Some((reply, node, _)) = self.member_waiting.remove(&request_id) {
            let _ = reply.send(match updated {
                Some(_) => Ok((node, self.members.clone())),
                None => Err(EtcdError::MemberNotFound),
            });
        }
    }

    fn lease_applied(&mut self, op: &kv::Op) {
        match op {
            kv::Op::LeaseGrant(g) => {
                self.lease_deadlines.insert(
                    g.id,
                    Instant::now() + Duration::from_secs(g.ttl_s.max(0) as u64),
                );
            }
            kv::Op::LeaseRevoke(r) => {
                self.lease_deadlines.remove(&r.id);
                self.lease_revoking.remove(&r.id);
            }
            _ => {}
        }
    }

    /// Hands the batch's events to every shard's watch hub, encoded once. A shard whose queue
    /// is full loses the batch and is told to catch up from history: apply never waits.
    fn publish_events(&self, events: Vec<kv::Event>) {
        if events.is_empty() {
            return;
        }
        // Pairs with the fence in Hub::add_watcher_count (see there).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.shared.watchers_total.load(Ordering::SeqCst) == 0 {
            return;
        }
        let batch = Arc::new(WatchBatch::encode(self.writer.current_revision(), events));
        for (shard, mailbox) in self.shared.watch_batches.iter().enumerate() {
            if mailbox.try_send(batch.clone()).is_err() {
                self.shared.watch_overflow[shard].store(true, Ordering::Release);
                mailbox.nudge();
            }
        }
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

    fn fail_all_waiting(&mut self, err: EtcdError) {
        for (reply, _) in self.physical_waiting.drain(..) {
            let _ = reply.send(Err(err));
        }
        for (reply, _) in self.defrag_waiting.drain(..) {
            let _ = reply.send(Err(err));
        }
        for (_, (reply, _)) in self.waiting.drain() {
            let _ = reply.send(Err(err));
        }
        for (_, (reply, _, _)) in self.member_waiting.drain() {
            let _ = reply.send(Err(err));
        }
        if let Some((_, reply, _)) = self.transfer_waiting.take() {
            let _ = reply.send(Err(err));
        }
        for (_, (waits, _)) in self.reads_in_round.drain() {
            for w in waits {
                let _ = w.reply.send(Err(err));
            }
        }
        for (_, waits) in self.reads_to_apply.drain(..) {
            for w in waits {
                let _ = w.reply.send(Err(err));
            }
        }
        while let Some(p) = self.shared.proposals.try_recv() {
            let _ = p.reply.send(Err(err));
        }
        while let Some(r) = self.shared.reads.try_recv() {
            let _ = r.reply.send(Err(err));
        }
    }

    /// Writes the MVCC image at the applied index, then lets the WAL and the raft log drop
    /// what it covers. The same bytes become the snapshot a far-behind follower receives.
    async fn checkpoint(&mut self) -> Result<(), CoreError> {
        let index = self.writer.applied_index();
        if index == 0 || index <= self.last_checkpoint_index {
            return Ok(());
        }
        let term = self
            .node
            .store()
            .term(index)
            .map_err(|e| CoreError::Raft(e.to_string()))?;
        let conf_state = self.node.raft().conf_state();
        // Capturing the image takes microseconds; serializing and writing it run on the
        // executor's blocking thread while this loop keeps applying (no stop-the-world pause).
        let source = self.writer.checkpoint_source();
        let dir = self.snap_dir.clone();
        let path = dir.join(checkpoint::file_name(index));
        let started = Instant::now();
        let conf = conf_state.clone();
        let members = self.members.clone();
        let alarms = self.alarms.list();
        let written = glommio::executor()
            .spawn_blocking(move || -> Result<Option<Vec<u8>>, CoreError> {
                let kv_image = match source.serialize() {
                    Ok(b) => b,
                    // A compaction began meanwhile and trimmed what the image needed: the
                    // next checkpoint tries again.
                    Err(_) => return Ok(None),
                };
                let file = checkpoint::encode(index, term, &conf, &members, &alarms, &kv_image);
                write_durably(&dir, &path, &file)?;
                Ok(Some(file))
            })
            .await?;
        let Some(file) = written else {
            tracing::info!(index, "checkpoint skipped: a compaction raced it");
            return Ok(());
        };
        tracing::info!(
            index,
            bytes = file.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        // The previous checkpoint stays, with the WAL after it, so a damaged newest file can
        // still be recovered from (restart falls back to the older one and replays more).
        let previous = self.last_checkpoint_index;
        self.last_checkpoint_index = index;
        self.applied_since_checkpoint = 0;
        let storage = self.node.store_mut();
        storage
            .create_snapshot(index, conf_state, Bytes::from(file))
            .map_err(|e| CoreError::Raft(e.to_string()))?;
        if index > LOG_TAIL_KEPT_ENTRIES {
            let _ = storage.compact(index - LOG_TAIL_KEPT_ENTRIES);
        }
        let wal_keep_from = previous.min(index.saturating_sub(LOG_TAIL_KEPT_ENTRIES)) + 1;
        self.wal
            .release_before(wal_keep_from)
            .await
            .map_err(|e| CoreError::Wal(e.to_string()))?;
        checkpoint::remove_older(&self.snap_dir, previous);
        Ok(())
    }
}

/// Publishes the store's size (Status's dbSize and dbSizeInUse; what the quota counts). etcd's
/// is never 0 (an empty bbolt file has pages), and clients check that, so neither is ours.
fn publish_store_size(shared: &Shared, writer: &kv::Writer) {
    shared
        .db_size_bytes
        .store(writer.size_bytes().max(4096), Ordering::Release);
    shared
        .db_size_in_use_bytes
        .store(writer.size_bytes_in_use().max(4096), Ordering::Release);
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
