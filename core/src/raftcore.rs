//! The raft core: one pinned executor that owns the raft state machine, the WAL and the MVCC
//! writer, and turns proposals from every shard into durable, applied writes.
//!
//! One loop iteration: drain the proposal and read mailboxes (everything that arrived while the
//! previous WAL write was in flight forms this batch: group commit), step raft, write the Ready's
//! hard state and entries as ONE WAL append (one O_DIRECT write plus one fdatasync), advance,
//! apply the committed entries to keel-kv and complete each waiting call on its shard.
//!
//! Architecture invariant: only this executor mutates raft, the WAL and the MVCC store. A reply
//! is sent only after the entry it answers is durable and applied.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_grpc::EtcdError;
use keel_io::{DmaStore, Record, Wal, WalConfig};
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use keel_raft::{
    ConfState, Durability, Entry, EntryType, HardState, MemStorage, RawNode, Role, Snapshot, SnapshotMetadata,
    Storage,
};
use prost::Message;

use crate::config::Config;
use crate::convert;
use crate::error::CoreError;
use crate::ids::{write_durably, Bootstrap, Identity};
use crate::rt;
use crate::shared::{kv_error, LeaseStatus, Outcome, Query, ReadWait, Reply, Shared};
use crate::watch::WatchBatch;

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

const CHECKPOINT_MAGIC: &[u8; 8] = b"KEELCKPT";
const CHECKPOINT_VERSION: u32 = 1;

/// Everything the raft core owns, opened on its own executor (the WAL is `!Send`).
pub struct RaftCore {
    shared: Arc<Shared>,
    node: RawNode<MemStorage>,
    wal: Wal<DmaStore>,
    writer: kv::Writer,
    snap_dir: PathBuf,
    /// Proposals of this member waiting to be applied, by proposal id.
    waiting: HashMap<u64, Reply>,
    /// Reads waiting for their ReadIndex answer, by context.
    reads_in_round: HashMap<u64, Vec<ReadWait>>,
    /// Reads whose ReadIndex is known, waiting for apply to reach it (ascending index).
    reads_to_apply: VecDeque<(u64, Vec<ReadWait>)>,
    next_read_ctx: u64,
    applied_since_checkpoint: u64,
    last_checkpoint_index: u64,
    /// When each lease expires, by the leader's clock. Only a leader expires leases.
    lease_deadlines: HashMap<i64, Instant>,
    /// Leases whose revoke was proposed and when, so expiry proposes each once per second.
    lease_revoking: HashMap<i64, Instant>,
    is_leader: bool,
}

/// Opens the data directory: the newest valid checkpoint, then the WAL after it. Returns the
/// core ready to run and the MVCC reader for the shards.
pub async fn open(config: &Config, identity: &Identity, bootstrap: Bootstrap) -> Result<(RaftCoreParts, kv::Reader), CoreError> {
    let snap_dir = config.data_dir.join("snap");
    std::fs::create_dir_all(&snap_dir).map_err(|source| CoreError::DataDir { path: snap_dir.clone(), source })?;
    std::fs::create_dir_all(&config.wal_dir)
        .map_err(|source| CoreError::DataDir { path: config.wal_dir.clone(), source })?;

    let checkpoint = load_newest_checkpoint(&snap_dir)?;
    let (writer, reader, snap_meta) = match checkpoint {
        Some((meta, kv_bytes)) => {
            let (w, r) = kv::Store::restore(&kv_bytes).map_err(|e| CoreError::Store(e.to_string()))?;
            assert_eq!(w.applied_index(), meta.index, "checkpoint header and store disagree on the applied index");
            (w, r, Some(meta))
        }
        None => {
            let (w, r) = kv::Store::new();
            (w, r, None)
        }
    };

    let (wal, records) = Wal::open(DmaStore::new(&config.wal_dir), WalConfig::default())
        .await
        .map_err(|e| CoreError::Wal(e.to_string()))?;

    let voters: Vec<u64> = identity.members.iter().map(|m| m.id).collect();
    let mut storage = MemStorage::new_with_voters(&voters);
    if bootstrap == Bootstrap::Restart && records.is_empty() && snap_meta.is_none() {
        tracing::warn!("data directory has an identity but an empty log: starting from an empty store");
    }
    // A new cluster's storage starts from a bootstrap snapshot holding the membership (the
    // log starts after it), so that snapshot counts as applied too.
    let applied = snap_meta.as_ref().map_or(storage.first_index() - 1, |m| m.index);
    if let Some(meta) = &snap_meta {
        storage.set_conf_state(meta.conf_state.clone());
        storage.apply_snapshot(Snapshot { metadata: meta.clone(), data: Bytes::new() });
    }
    let mut hard_state: Option<HardState> = None;
    for rec in records {
        match rec.kind {
            WAL_KIND_ENTRY => {
                let e = Entry::decode(&rec.payload).map_err(|e| CoreError::Wal(format!("bad entry record: {e}")))?;
                if e.index > applied {
                    storage.append(std::slice::from_ref(&e));
                }
            }
            WAL_KIND_HARD_STATE => {
                hard_state = Some(
                    HardState::decode(&rec.payload).map_err(|e| CoreError::Wal(format!("bad hard state record: {e}")))?,
                );
            }
            WAL_KIND_SNAPSHOT => {
                let meta = SnapshotMetadata::decode(&rec.payload)
                    .map_err(|e| CoreError::Wal(format!("bad snapshot record: {e}")))?;
                if meta.index > applied {
                    // A snapshot received from a leader whose state was not checkpointed
                    // yet cannot be rebuilt from the log alone.
                    return Err(CoreError::Wal(format!(
                        "WAL names snapshot {} past the newest checkpoint {applied}",
                        meta.index
                    )));
                }
            }
            other => return Err(CoreError::Wal(format!("unknown WAL record kind {other}"))),
        }
    }
    // The commit index may trail what the log holds (it is persisted lazily); it never
    // points past the last entry we have, and never below what the checkpoint applied.
    let mut hard_state = hard_state.unwrap_or_else(|| storage.hard_state());
    hard_state.commit = hard_state.commit.clamp(applied, storage.last_index().max(applied));
    storage.set_hard_state(hard_state);

    let mut rc = keel_raft::Config::new(identity.member_id);
    rc.heartbeat_tick = 1;
    rc.election_tick = (config.election_timeout_ms / config.heartbeat_interval_ms).max(2) as usize;
    rc.applied = applied;
    rc.seed = identity.member_id ^ identity.cluster_id;
    let node = RawNode::new(&rc, storage).map_err(|e| CoreError::Raft(e.to_string()))?;
    tracing::info!(
        applied_index = applied,
        last_index = node.store().last_index(),
        term = hard_state.term,
        commit = hard_state.commit,
        "recovered raft log"
    );
    Ok((RaftCoreParts { node, wal, writer, snap_dir, last_checkpoint_index: applied }, reader))
}

/// The opened pieces, before the shared state exists.
pub struct RaftCoreParts {
    node: RawNode<MemStorage>,
    wal: Wal<DmaStore>,
    writer: kv::Writer,
    snap_dir: PathBuf,
    last_checkpoint_index: u64,
}

impl RaftCore {
    pub fn new(parts: RaftCoreParts, shared: Arc<Shared>) -> RaftCore {
        let RaftCoreParts { node, wal, writer, snap_dir, last_checkpoint_index } = parts;
        publish_store_size(&shared, &writer);
        shared.applied_index.store(writer.applied_index(), Ordering::Release);
        RaftCore {
            shared,
            node,
            wal,
            writer,
            snap_dir,
            waiting: HashMap::new(),
            reads_in_round: HashMap::new(),
            reads_to_apply: VecDeque::new(),
            next_read_ctx: 1,
            applied_since_checkpoint: 0,
            last_checkpoint_index,
            lease_deadlines: HashMap::new(),
            lease_revoking: HashMap::new(),
            is_leader: false,
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
                    && self.lease_revoking.get(id).is_none_or(|at| now.duration_since(*at) > Duration::from_secs(1))
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
                Err(e) => tracing::warn!(lease = id, error = %e, "cannot propose the revoke of an expired lease"),
            }
        }
    }

    fn answer_queries(&mut self) {
        while let Some(q) = self.shared.queries.try_recv() {
            let not_leader = if self.shared.has_leader() { EtcdError::NotLeader } else { EtcdError::NoLeader };
            match q {
                Query::KeepAlive { id, reply } => {
                    if !self.is_leader {
                        let _ = reply.send(Err(not_leader));
                        continue;
                    }
                    let ttl = match self.writer.lease(id) {
                        Some(l) => {
                            self.lease_deadlines.insert(id, Instant::now() + Duration::from_secs(l.ttl_s.max(0) as u64));
                            l.ttl_s
                        }
                        None => 0,
                    };
                    let _ = reply.send(Ok(ttl));
                }
                Query::TimeToLive { id, reply } => {
                    let status = self.writer.lease(id).map(|l| {
                        let remaining = self
                            .lease_deadlines
                            .get(&id)
                            .map_or(l.ttl_s, |d| d.saturating_duration_since(Instant::now()).as_secs() as i64);
                        LeaseStatus { remaining_ttl_s: remaining, granted_ttl_s: l.ttl_s, keys: l.keys }
                    });
                    let _ = reply.send(Ok(status));
                }
                Query::Leases { reply } => {
                    let _ = reply.send(Ok(self.writer.leases().into_iter().map(|l| l.id).collect()));
                }
            }
        }
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
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
            let idle = !self.node.has_ready()
                && self.shared.proposals.is_empty()
                && self.shared.reads.is_empty()
                && self.shared.queries.is_empty()
                && !self.writer.compaction_pending();
            if idle {
                let wait = next_tick.saturating_duration_since(Instant::now());
                let proposals = self.shared.proposals.clone();
                let reads = self.shared.reads.clone();
                let queries = self.shared.queries.clone();
                futures_lite::future::or(
                    futures_lite::future::or(proposals.ready(), reads.ready()),
                    futures_lite::future::or(queries.ready(), rt::sleep(wait)),
                )
                .await;
            }
            let now = Instant::now();
            if now >= next_tick {
                while now >= next_tick {
                    self.node.tick();
                    next_tick += tick;
                }
                self.expire_leases();
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
        }
        self.fail_all_waiting(EtcdError::Stopped);
        if self.writer.applied_index() > self.last_checkpoint_index {
            self.checkpoint().await?;
        }
        Ok(())
    }

    fn take_proposals(&mut self) {
        let mut count = 0;
        let mut bytes = 0;
        while count < PROPOSALS_PER_BATCH_MAX && bytes < PROPOSAL_BYTES_PER_BATCH_MAX {
            let Some(p) = self.shared.proposals.try_recv() else { break };
            count += 1;
            bytes += p.data.len();
            match self.node.propose(p.data) {
                Ok(()) => {
                    let previous = self.waiting.insert(p.id, p.reply);
                    assert!(previous.is_none(), "proposal id {} used twice", p.id);
                }
                Err(keel_raft::Error::ProposalDropped(why)) => {
                    tracing::debug!(why, "proposal dropped");
                    let err = if self.shared.has_leader() { EtcdError::TooManyRequests } else { EtcdError::NoLeader };
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
        match self.node.read_index(Bytes::copy_from_slice(&ctx.to_be_bytes())) {
            Ok(()) => {
                self.reads_in_round.insert(ctx, batch);
            }
            Err(_) => {
                let err = if self.shared.has_leader() { EtcdError::TooManyRequests } else { EtcdError::NoLeader };
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
            if ss.role != Role::Leader {
                // Reads this member promised as leader can no longer be confirmed.
                for (_, waits) in self.reads_in_round.drain() {
                    for w in waits {
                        let _ = w.reply.send(Err(EtcdError::LeaderChanged));
                    }
                }
            }
            tracing::info!(leader = ss.leader_id, role = ?ss.role, "raft role changed");
        }
        // Peer messages (clusters) would go out here; a single member has none.
        debug_assert!(rd.messages.is_empty() || self.node.raft().conf_state().voters.len() > 1);

        let mut records = Vec::with_capacity(rd.entries.len() + 2);
        if let Some(snap) = &rd.snapshot {
            let mut buf = Vec::new();
            snap.metadata.encode(&mut buf);
            records.push(Record { kind: WAL_KIND_SNAPSHOT, index: snap.metadata.index, payload: buf.into() });
        }
        for e in &rd.entries {
            let mut buf = Vec::with_capacity(e.data.len() + 32);
            e.encode(&mut buf);
            records.push(Record { kind: WAL_KIND_ENTRY, index: e.index, payload: buf.into() });
        }
        if let Some(hs) = rd.hard_state {
            self.shared.raft_term.store(hs.term, Ordering::Release);
            self.shared.commit_index.store(hs.commit, Ordering::Release);
            // A commit-only change is recoverable from the log and peers: it rides along with
            // the next synced batch instead of costing an fdatasync of its own.
            if rd.durability == Durability::Sync {
                let mut buf = Vec::new();
                hs.encode(&mut buf);
                let index = rd.entries.last().map_or(self.node.store().last_index(), |e| e.index);
                records.push(Record { kind: WAL_KIND_HARD_STATE, index, payload: buf.into() });
            }
        }
        if rd.durability == Durability::Sync && !records.is_empty() {
            // Returns only after the write and its fdatasync completed; a failed fsync aborts
            // the process inside keel-io, so an error here is an I/O error before the sync.
            self.wal.append(records).await.map_err(|e| CoreError::Wal(e.to_string()))?;
        }
        self.node.advance();
        if let Some(snap) = rd.snapshot {
            // Installing a leader's snapshot needs the peer transport's MVCC image (cluster issue).
            return Err(CoreError::Raft(format!("snapshot install at {} is not supported yet", snap.metadata.index)));
        }
        self.apply(rd.committed_entries);
        for rs in rd.read_states {
            let ctx = u64::from_be_bytes(rs.context.as_ref().try_into().expect("read contexts are 8 bytes we made"));
            if let Some(waits) = self.reads_in_round.remove(&ctx) {
                self.reads_to_apply.push_back((rs.index, waits));
            }
        }
        self.answer_reads();
        if self.applied_since_checkpoint >= self.shared.config.snapshot_count {
            self.checkpoint().await?;
        }
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        let term = self.shared.raft_term.load(Ordering::Acquire);
        let mut events = Vec::new();
        for e in entries {
            self.applied_since_checkpoint += 1;
            match e.entry_type {
                EntryType::ConfChange => {
                    // Membership changes come with the cluster issue; the entry still occupies
                    // its index in the store so applied indexes stay contiguous.
                    self.writer.apply_empty(e.index);
                }
                EntryType::Normal if e.data.is_empty() => self.writer.apply_empty(e.index),
                EntryType::Normal => {
                    let req = pb::InternalRaftRequest::decode(e.data.clone())
                        .expect("log entries are InternalRaftRequests this node or a peer encoded and checksummed");
                    let id = req.header.as_ref().map_or(req.id, |h| h.id);
                    let result = match request_op(req) {
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
                        Outcome { response: applied.response, raft_term: term }
                    });
                    if let Some(reply) = self.waiting.remove(&id) {
                        let _ = reply.send(result);
                    }
                }
            }
        }
        let applied = self.writer.applied_index();
        self.shared.applied_index.store(applied, Ordering::Release);
        publish_store_size(&self.shared, &self.writer);
        self.publish_events(events);
        let quota = self.shared.config.quota_backend_bytes;
        if self.shared.db_size_bytes.load(Ordering::Relaxed) > quota && !self.shared.nospace.swap(true, Ordering::AcqRel) {
            tracing::warn!(quota_bytes = quota, "store exceeds its quota: NOSPACE alarm raised");
        }
    }

    fn lease_applied(&mut self, op: &kv::Op) {
        match op {
            kv::Op::LeaseGrant(g) => {
                self.lease_deadlines.insert(g.id, Instant::now() + Duration::from_secs(g.ttl_s.max(0) as u64));
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
        for (_, reply) in self.waiting.drain() {
            let _ = reply.send(Err(err));
        }
        for (_, waits) in self.reads_in_round.drain() {
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
    /// what it covers.
    async fn checkpoint(&mut self) -> Result<(), CoreError> {
        let index = self.writer.applied_index();
        if index == 0 || index <= self.last_checkpoint_index {
            return Ok(());
        }
        let term = self.node.store().term(index).map_err(|e| CoreError::Raft(e.to_string()))?;
        let conf_state = self.node.raft().conf_state();
        let kv_bytes = self.writer.checkpoint();
        let file = encode_checkpoint(index, term, &conf_state, &kv_bytes);
        let dir = self.snap_dir.clone();
        let path = dir.join(format!("checkpoint-{index:016x}.keel"));
        let started = Instant::now();
        // The write and its fsync run on the executor's blocking thread, off the event loop.
        let write_path = path.clone();
        glommio::executor()
            .spawn_blocking(move || write_durably(&dir, &write_path, &file))
            .await?;
        tracing::info!(index, bytes = kv_bytes.len(), elapsed_ms = started.elapsed().as_millis() as u64, "checkpoint written");
        self.last_checkpoint_index = index;
        self.applied_since_checkpoint = 0;
        let storage = self.node.store_mut();
        storage.create_snapshot(index, conf_state, Bytes::new()).map_err(|e| CoreError::Raft(e.to_string()))?;
        // Keep a tail of entries for followers that are slightly behind.
        let keep = 1000;
        if index > keep {
            let _ = storage.compact(index - keep);
        }
        self.wal.release_before(index.saturating_sub(keep)).await.map_err(|e| CoreError::Wal(e.to_string()))?;
        remove_older_checkpoints(&self.snap_dir, index);
        Ok(())
    }
}

fn publish_store_size(shared: &Shared, writer: &kv::Writer) {
    shared.db_size_bytes.store(writer.value_log_bytes().max(4096), Ordering::Release);
    shared.db_size_in_use_bytes.store(writer.value_log_bytes_live().max(4096), Ordering::Release);
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
        return Some(kv::Op::Compact(kv::CompactionRequest { revision: r.revision, physical: r.physical }));
    }
    if let Some(r) = req.lease_grant {
        return Some(kv::Op::LeaseGrant(kv::LeaseGrantRequest { id: r.id, ttl_s: r.ttl }));
    }
    if let Some(r) = req.lease_revoke {
        return Some(kv::Op::LeaseRevoke(kv::LeaseRevokeRequest { id: r.id }));
    }
    None
}

fn encode_checkpoint(index: u64, term: u64, conf_state: &ConfState, kv_bytes: &[u8]) -> Vec<u8> {
    let mut conf = Vec::new();
    conf_state.encode(&mut conf);
    let mut out = Vec::with_capacity(kv_bytes.len() + conf.len() + 64);
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&term.to_le_bytes());
    out.extend_from_slice(&(conf.len() as u32).to_le_bytes());
    out.extend_from_slice(&conf);
    out.extend_from_slice(&(kv_bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(kv_bytes);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Parses a checkpoint file; any damage (length, crc, version) is an error, never a guess.
fn decode_checkpoint(bytes: &[u8]) -> Result<(SnapshotMetadata, Vec<u8>), String> {
    const FIXED: usize = 8 + 4 + 8 + 8 + 4;
    if bytes.len() < FIXED + 8 + 4 {
        return Err("too short".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err("crc mismatch".into());
    }
    if &body[..8] != CHECKPOINT_MAGIC {
        return Err("bad magic".into());
    }
    let u32_at = |o: usize| u32::from_le_bytes(body[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(8) != CHECKPOINT_VERSION {
        return Err(format!("unknown version {}", u32_at(8)));
    }
    let index = u64_at(12);
    let term = u64_at(20);
    let conf_len = u32_at(28) as usize;
    let conf_end = FIXED + conf_len;
    if body.len() < conf_end + 8 {
        return Err("conf state overruns the file".into());
    }
    let conf_state = ConfState::decode(&body[FIXED..conf_end]).map_err(|e| e.to_string())?;
    let kv_len = u64_at(conf_end) as usize;
    if body.len() != conf_end + 8 + kv_len {
        return Err("store image length does not match the file".into());
    }
    Ok((SnapshotMetadata { conf_state, index, term }, body[conf_end + 8..].to_vec()))
}

fn checkpoint_files(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let hex = name.strip_prefix("checkpoint-")?.strip_suffix(".keel")?;
            Some((u64::from_str_radix(hex, 16).ok()?, e.path()))
        })
        .collect();
    files.sort_by(|a, b| b.0.cmp(&a.0));
    files
}

/// The newest checkpoint that validates. A damaged newer one is skipped (it was being written
/// when the process died) in favour of an older valid one; the WAL still covers the gap
/// because segments are released only after a checkpoint is durable.
fn load_newest_checkpoint(dir: &Path) -> Result<Option<(SnapshotMetadata, Vec<u8>)>, CoreError> {
    for (index, path) in checkpoint_files(dir) {
        let bytes = std::fs::read(&path).map_err(|source| CoreError::DataDir { path: path.clone(), source })?;
        match decode_checkpoint(&bytes) {
            Ok((meta, kv)) if meta.index == index => return Ok(Some((meta, kv))),
            Ok(_) => tracing::warn!(path = %path.display(), "checkpoint name and contents disagree; skipped"),
            Err(why) => tracing::warn!(path = %path.display(), why, "damaged checkpoint skipped"),
        }
    }
    Ok(None)
}

fn remove_older_checkpoints(dir: &Path, newest: u64) {
    for (index, path) in checkpoint_files(dir) {
        if index < newest {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an old checkpoint");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_file_round_trips_and_rejects_damage() {
        let conf = ConfState { voters: vec![7], learners: vec![] };
        let file = encode_checkpoint(42, 3, &conf, b"store image");
        let (meta, kv) = decode_checkpoint(&file).expect("valid");
        assert_eq!((meta.index, meta.term, meta.conf_state), (42, 3, conf));
        assert_eq!(kv, b"store image");
        let mut flipped = file.clone();
        flipped[30] ^= 1;
        assert!(decode_checkpoint(&flipped).is_err());
        assert!(decode_checkpoint(&file[..file.len() - 1]).is_err());
        let mut padded = file.clone();
        padded.extend_from_slice(&[0; 16]);
        assert!(decode_checkpoint(&padded).is_err());
    }
}
