//! The raft core: one pinned executor that drives the member (`crate::member::Member`, the
//! sans-I/O state machine that owns raft, the MVCC writer, lease clocks, membership, alarms
//! and every waiting call) through real I/O: the WAL, checkpoint files and the peer transport.
//!
//! One loop iteration: step what peers sent, tick, drain the query, proposal and read
//! mailboxes into the member (everything that arrived while the previous WAL write was in
//! flight forms this batch: group commit), then carry out the member's Ready: send the messages
//! that may go out at once, write a received snapshot as a checkpoint, append the WAL records
//! as ONE WAL append (one O_DIRECT write plus one fdatasync), send the messages that vouch for
//! durable state, and report the write done (the member then applies and answers). Between
//! batches it runs bounded compaction steps, hands due checkpoints to the checkpoint writer
//! (`checkpoint_writer.rs`, a thread off this CPU) and takes the writer's outcomes: it never
//! waits for a checkpoint while running, only for the last one at stop.
//!
//! This file does I/O and publishing only: every decision is the member's, so a simulator can
//! drive the same member with simulated disks, network and clocks.
//!
//! Architecture invariant: only this executor mutates raft, the WAL and the MVCC store. A reply
//! is sent only after the entry it answers is durable and applied.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_grpc::EtcdError;
use keel_io::{DmaStore, Wal};
use keel_kv as kv;
use keel_raft::{MemStorage, RawNode};

use crate::alarms::Alarms;
use crate::checkpoint;
use crate::checkpoint_writer::{CheckpointWriter, Written};
use crate::compactor::{AutoCompactor, Leadership};
use crate::config::{ClusterState, Config};
use crate::error::CoreError;
use crate::ids::{write_durably, Identity, Member as MemberInfo};
use crate::limits::Limits;
use crate::member::{
    recovery, CheckpointCompletion, Effect, Member, MemberConfig, ProposalKind, ReadyIo, Refusal,
};
use crate::peer::{Control, Transport};
use crate::peer_snapshot;
use crate::rt;
use crate::shared::{Shared, OVERFLOW_LOST, OVERFLOW_UNWATCHED};
use crate::stats::RaftStats;
use crate::vlog_writer::{self, VlogWriter};
use crate::watch::WatchBatch;
use crate::watchdog::LoopPhase;

/// Test-only: the key whose stored value a member damages at start (see `open`).
pub const TEST_FLIP_VALUE_ENV: &str = "KEEL_TEST_FLIP_VALUE_OF";

/// Most proposals taken into one raft batch, so one WAL write stays bounded.
const PROPOSALS_PER_BATCH_MAX: usize = 4096;
/// Most bytes of proposals per batch (the WAL's own batch limit is 1 MiB of framed records).
const PROPOSAL_BYTES_PER_BATCH_MAX: usize = 768 * 1024;

/// The member and the I/O around it, on the raft core's executor (the WAL is `!Send`).
pub struct RaftCore {
    shared: Arc<Shared>,
    member: Member,
    wal: Rc<Wal<DmaStore>>,
    /// Releases WAL segments behind durable checkpoints, beside this loop.
    wal_release: WalRelease,
    snap_dir: PathBuf,
    /// Serializes and writes checkpoints on its own thread; see `start_checkpoint`.
    checkpoints: CheckpointWriter,
    /// Writes sealed value-log segments beside the loop; see `vlog_writer`.
    vlog: VlogWriter,
    /// Dead value-log segments whose files wait for the checkpoints that refer to them to go.
    dead_segments: Vec<kv::DeadSegment>,
    /// A pager thread bringing in the segment file the next compaction step reads, and
    /// which file (its address) was last handed to one (see `compaction_waits_for_pages`).
    compaction_paging: Option<crate::pager::PagerWait>,
    /// The pager bringing in the values the entry next to apply reads (its raft index):
    /// the loop applies nothing until it is done, and goes on serving meanwhile.
    apply_paging: Option<(u64, crate::pager::PagerWait)>,
    compaction_paged_file: usize,
    vlog_dir: PathBuf,
    /// The store's count of damaged records reclaim met, as far as this loop has logged it.
    unreadable_records_reported: u64,
    transport: Rc<Transport>,
    /// Where the member's millisecond clock (`now_ms`) starts.
    clock_origin: Instant,
    /// etcd's auto-compaction; proposes only while this member leads.
    auto_compactor: AutoCompactor,
    /// The mapping of a leader's snapshot placed and not installed yet: once its store
    /// replaces the member's, the pages its restore read leave this process's memory.
    placed_mapping: Option<keel_io::vlog::MappedFile>,
}

/// The opened pieces, before the shared state exists.
pub struct RaftCoreParts {
    node: RawNode<MemStorage>,
    wal: Wal<DmaStore>,
    writer: kv::Writer,
    snap_dir: PathBuf,
    vlog_dir: PathBuf,
    members: Vec<MemberInfo>,
    alarms: Alarms,
    auth: crate::auth::AuthImage,
    removed: Vec<u64>,
    last_checkpoint_index: u64,
    /// The oldest checkpoint file the newest one needs (a delta's base, or itself).
    checkpoint_root: u64,
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
    // Each phase is timed: a restart's length is what operators wait for.
    let started = Instant::now();
    let (wal, records) = Wal::open(DmaStore::new(&config.wal_dir), limits.wal.clone())
        .await
        .map_err(|e| CoreError::Wal(e.to_string()))?;
    let wal_ms = started.elapsed().as_millis() as u64;
    checkpoint::remove_unfinished(&snap_dir);
    peer_snapshot::remove_all_staged(&snap_dir.join(peer_snapshot::STAGING_DIR))?;
    let newest = checkpoint::load_newest(&snap_dir)?;
    let checkpoint_ms = started.elapsed().as_millis() as u64 - wal_ms;
    // Value-log segments: keep those a kept checkpoint points into, delete the rest, and map
    // the kept ones for the restore (values are read from the files, never copied in).
    let vlog_dir = config.data_dir.join("vlog");
    let kept = segments_of_checkpoints(&snap_dir, newest.as_ref().map(|l| &l.checkpoint));
    if kept.is_none() {
        tracing::warn!(
            dir = %snap_dir.display(),
            "a checkpoint file cannot be read, so which value-log segments it points into is \
             not known: every segment file is kept until it is gone"
        );
    }
    let first_segment_id = vlog_writer::remove_unreferenced(&vlog_dir, kept.as_deref())?;
    let segments_ms = started.elapsed().as_millis() as u64 - wal_ms - checkpoint_ms;
    let value_log = kv::ValueLogOptions {
        segment_bytes: config.value_log_segment_bytes,
        first_segment_id,
        on_disk: true,
    };
    let mut segment_files = |id: u32| vlog_writer::map_segment(&vlog_dir, id);

    let start = match config.initial_cluster_state {
        ClusterState::Existing => recovery::Start::Joining,
        ClusterState::New => recovery::Start::Founding,
    };
    let rc = recovery::raft_config(
        identity.member_id,
        (config.election_timeout_ms / config.heartbeat_interval_ms).max(2) as usize,
        limits.raft_msg_bytes_max,
        limits.raft_uncommitted_bytes_max,
    );
    let records_count = records.len();
    let checkpoint_base = newest
        .as_ref()
        .and_then(|l| l.base.as_ref())
        .map_or(0, |(base, _)| base.meta.index);
    let (checkpoint, mapped) = match newest {
        Some(checkpoint::Loaded {
            checkpoint: cp,
            file,
            base,
        }) => {
            let (base, base_file) = base.unzip();
            (
                Some((cp, file.bytes().clone(), base)),
                Some((file, base_file)),
            )
        }
        None => (None, None),
    };
    // The restore of a large index is most of a start: parts of it are built on threads
    // beside the raft core's CPU, which nothing else uses yet.
    let move_beside = rt::mover_beside_caller();
    let restore_helpers = kv::RestoreHelpers {
        threads: rt::restore_helper_threads(),
        on_start: &move_beside,
    };
    let recovered = recovery::recover(
        rc,
        start,
        identity.members.clone(),
        checkpoint,
        records,
        recovery::StoreSource {
            value_log,
            segment_files: &mut segment_files,
            restore_helpers,
        },
    )?;
    // The restore read the whole mapped checkpoint: those pages leave this process's memory
    // (raft keeps the mapping, to send a follower), and the allocator gives back what the
    // restore freed.
    if let Some((file, base_file)) = mapped {
        file.forget_resident_pages();
        // A delta's base is needed only for the restore: its mapping goes now.
        if let Some(base_file) = base_file {
            base_file.forget_resident_pages();
        }
    }
    rt::release_freed_memory();
    tracing::info!(
        wal_ms,
        checkpoint_ms,
        segments_ms,
        restore_and_replay_ms =
            started.elapsed().as_millis() as u64 - wal_ms - checkpoint_ms - segments_ms,
        wal_records = records_count,
        checkpoint_base,
        "opened the data directory"
    );
    let recovery::Recovered {
        node,
        mut writer,
        reader,
        members,
        alarms,
        auth,
        removed,
        checkpoint_index,
        checkpoint_root,
    } = recovered;
    if let Ok(key) = std::env::var(TEST_FLIP_VALUE_ENV) {
        // Test-only: damage this member's copy of one value, as a disk or memory fault would,
        // so tests can watch the corruption checks find it.
        let flipped = writer.test_only_flip_value(key.as_bytes());
        tracing::warn!(key, flipped, "TEST ONLY: flipped a stored value");
    }
    Ok((
        RaftCoreParts {
            node,
            wal,
            writer,
            snap_dir,
            vlog_dir,
            members,
            alarms,
            auth,
            removed,
            last_checkpoint_index: checkpoint_index,
            checkpoint_root,
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
            vlog_dir,
            members,
            alarms,
            auth,
            removed,
            last_checkpoint_index,
            checkpoint_root,
        } = parts;
        let transport = Transport::new(
            shared.member_id(),
            shared.config.initial_advertise_peer_urls.clone(),
            shared.cluster_id(),
            shared.limits.peer_frame_bytes_max,
            snap_dir.join(peer_snapshot::STAGING_DIR),
            shared.peer_stats.clone(),
            shared.raft_stats.clone(),
            crate::peer_tls::load(&shared.config)?,
        );
        for l in &shared.config.listen_peer {
            crate::lifecycle::log_listening_for_peers(&l.addr);
            transport
                .listen(l.addr, l.scheme)
                .map_err(|source| CoreError::Listen {
                    addr: l.addr,
                    source,
                })?;
        }
        let auto_compactor = AutoCompactor::new(
            shared.config.auto_compaction,
            shared.config.heartbeat_interval_ms,
            Instant::now(),
            writer.current_revision(),
        );
        let config = MemberConfig {
            id: shared.member_id(),
            name: shared.config.name.clone(),
            advertise_client_urls: shared.config.advertise_client_urls.clone(),
            request_timeout_ms: shared.request_timeout().as_millis() as u64,
            tick_ms: shared.config.heartbeat_interval_ms,
            snapshot_count: shared.config.snapshot_count,
            stats: shared.raft_stats.clone(),
            auth_token_ttl_ms: shared.config.auth_token_ttl_ms,
            sealed_backlog_bytes_max: crate::limits::SEALED_BACKLOG_BYTES_MAX,
            watch_events_per_apply_max: crate::limits::WATCH_EVENTS_PER_APPLY_MAX,
            apply_keys_per_step: crate::limits::APPLY_KEYS_PER_STEP,
            // Unique across restarts: from the clock-based generator of proposal ids.
            ids_first: shared.next_proposal_id(),
            values_resident: crate::pager::values_resident,
            install_helpers: crate::member::InstallHelpers {
                threads: rt::restore_helper_threads(),
                on_start: rt::move_beside_own_cpus,
            },
            strict_reconfig_check: shared.config.strict_reconfig_check,
            published_auth: shared.published_auth(),
        };
        let mut member = Member::new(config, node, writer, members, alarms, last_checkpoint_index);
        member.set_checkpoint_root(checkpoint_root);
        member.restore_auth(&auth);
        member.restore_removed(&removed);
        let clock_origin = shared.started_at;
        // Keep-alives on the leader are renewed on the shard that took them, on this clock.
        shared.set_lease_deadlines(member.lease_deadlines());
        // Started from this executor's thread, so it runs beside the raft CPU.
        let checkpoints = CheckpointWriter::start(snap_dir.clone())?;
        let vlog = VlogWriter::start(vlog_dir.clone());
        let mut core = RaftCore {
            vlog,
            vlog_dir,
            unreadable_records_reported: 0,
            dead_segments: Vec::new(),
            compaction_paging: None,
            apply_paging: None,
            compaction_paged_file: 0,
            shared,
            member,
            wal: Rc::new(wal),
            wal_release: WalRelease::default(),
            snap_dir,
            checkpoints,
            transport,
            // The member's clock is the shards' `uptime_ms`: token deadlines are shared.
            clock_origin,
            auto_compactor,
            placed_mapping: None,
        };
        core.publish();
        Ok(core)
    }

    /// The peer transport (for tasks beside the raft loop on this executor).
    pub fn transport(&self) -> Rc<Transport> {
        self.transport.clone()
    }

    /// Milliseconds on the member's monotonic clock: the only time the member sees.
    fn now_ms(&self) -> u64 {
        self.clock_origin.elapsed().as_millis() as u64
    }

    /// Runs until the node is asked to stop; then writes a checkpoint so the next start is fast.
    pub async fn run(mut self) -> Result<(), CoreError> {
        let now_ms = self.now_ms();
        self.member.start(now_ms);
        self.publish();
        loop {
            self.shared
                .raft_loop_at_ms
                .store(self.shared.uptime_ms(), Ordering::Release);
            self.shared.enter_raft_phase(LoopPhase::Working);
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
            self.wal_release.check()?;
            // Values waiting for the disk past their bound: no new writes until it catches up
            // (proposals wait in their bounded mailbox, then clients hear "too many requests").
            // So do they while an entry is applied in steps: raft hands out nothing behind
            // it meanwhile, so new writes would only queue up in raft's log.
            let proposals_held = self.member.values_backlogged() || self.member.applying_in_steps();
            let compaction_waits = self.compaction_waits_for_pages();
            self.page_in_for_apply();
            let idle = !self.member.has_ready()
                && !self.member.apply_runnable()
                && (!self.member.compaction_runnable() || compaction_waits)
                && (proposals_held || self.shared.proposals.is_empty())
                && self.shared.reads.is_empty()
                && self.shared.queries.is_empty()
                && !self.transport.has_inbox()
                && !self.checkpoints.has_outcome()
                && !self.vlog.has_outcome();
            if idle {
                let wait_ms = self.member.next_tick_ms().saturating_sub(self.now_ms());
                let proposals = self.shared.proposals.clone();
                let reads = self.shared.reads.clone();
                let queries = self.shared.queries.clone();
                let transport = self.transport.clone();
                let checkpoints = self.checkpoints.outcomes();
                let segments = self.vlog.outcomes();
                let proposals_ready = async {
                    if proposals_held {
                        futures_lite::future::pending::<()>().await
                    } else {
                        proposals.ready().await
                    }
                };
                let mut paging = self.compaction_paging.take();
                let mut apply_paging = self.apply_paging.take();
                let paged = async {
                    match (paging.as_mut(), apply_paging.as_mut()) {
                        (Some(wait), Some((_, apply_wait))) => {
                            futures_lite::future::or(wait, apply_wait).await
                        }
                        (Some(wait), None) | (None, Some((_, wait))) => wait.await,
                        (None, None) => futures_lite::future::pending::<()>().await,
                    }
                };
                self.shared
                    .enter_raft_idle(self.shared.uptime_ms() + wait_ms);
                futures_lite::future::or(
                    futures_lite::future::or(proposals_ready, reads.ready()),
                    futures_lite::future::or(
                        futures_lite::future::or(queries.ready(), transport.inbox_ready()),
                        futures_lite::future::or(
                            futures_lite::future::or(checkpoints.ready(), segments.ready()),
                            futures_lite::future::or(
                                paged,
                                rt::sleep(Duration::from_millis(wait_ms)),
                            ),
                        ),
                    ),
                )
                .await;
                self.compaction_paging = paging;
                self.apply_paging = apply_paging;
                self.shared.enter_raft_phase(LoopPhase::Working);
                self.page_in_for_apply();
            }
            // Between Readies, as the member asks: a written checkpoint lets the WAL go.
            if let Some(outcome) = self.checkpoints.try_take() {
                self.shared.enter_raft_phase(LoopPhase::FinishCheckpoint);
                self.finish_checkpoint(outcome).await?;
                self.shared.enter_raft_phase(LoopPhase::Working);
            }
            while let Some(outcome) = self.vlog.try_take() {
                let durable = outcome?;
                self.member
                    .segment_durable(durable.id, durable.bytes, durable.file);
            }
            self.step_peers();
            let now_ms = self.now_ms();
            self.member.tick(now_ms);
            // Events are built only while someone watches; a watcher added after this look
            // finds what applied meanwhile in history (see `Effect::EventsCut` below).
            self.member
                .set_events_wanted(self.shared.watchers_total.load(Ordering::SeqCst) > 0);
            // Queries read the store (Snapshot, Hash, TimeToLive's keys) or change it
            // (Defragment): they wait in their bounded mailbox while an entry is half applied.
            if !self.member.applying_in_steps() {
                self.take_queries();
            }
            let (rev, role) = (
                self.member.writer().current_revision(),
                Leadership::of(self.member.is_leader()),
            );
            self.auto_compactor
                .tick(Instant::now(), rev, role, &self.shared);
            if !proposals_held {
                self.take_proposals();
            }
            self.take_reads();
            self.publish();
            if self.member.has_ready() {
                self.handle_ready().await?;
            } else if self.member.apply_runnable() {
                // A step of an entry applied in steps (each Ready takes one too); the loop
                // turns between steps, so peers keep hearing from this member.
                let (before, started) = (self.apply_mark(), Instant::now());
                self.member.apply_step(self.now_ms());
                self.observe_apply(before, started);
                self.publish();
                futures_lite::future::yield_now().await;
            } else if self.member.compaction_runnable() && !compaction_waits {
                // Compaction runs in bounded steps between batches, never as one long pause,
                // and waits while its rewrites are queued for the disk (the loop then idles
                // until the value-log writer reports).
                self.member.compact_step();
                self.report_unreadable_records();
                self.publish();
                futures_lite::future::yield_now().await;
            }
            // Applies and compaction steps seal segments (and reclaim kills them).
            self.vlog.submit(self.member.take_sealed_segments());
            self.dead_segments.extend(self.member.take_dead_segments());
            self.member.answer_compaction_waiters();
            if self.member.checkpoint_due() {
                self.start_checkpoint()?;
            }
        }
        self.member.fail_all_waiting(EtcdError::Stopped);
        while let Some(p) = self.shared.proposals.try_recv() {
            let _ = p.reply.send(Err(EtcdError::Stopped));
        }
        while let Some(r) = self.shared.reads.try_recv() {
            let _ = r.reply.send(Err(EtcdError::Stopped));
        }
        // The loop is stopping, so waiting is fine now: the checkpoint in flight (the writer
        // takes one at a time), then one at the last applied index, so the next start is fast.
        // When one was in flight, what applied since is replayed quickly at the next start
        // unless another checkpoint is due: writing a second, as large, would double the stop.
        let final_due = if self.member.checkpoint_in_flight().is_some() {
            let outcome = self.checkpoints.wait().await;
            self.finish_checkpoint(outcome).await?;
            self.member.checkpoint_due()
        } else {
            self.member.applied_past_checkpoint()
        };
        // A half-applied entry (a DeleteRange or revoke in steps) leaves no store to image:
        // the next start replays it from the WAL instead.
        if final_due && !self.member.applying_in_steps() && self.start_checkpoint()? {
            let outcome = self.checkpoints.wait().await;
            self.finish_checkpoint(outcome).await?;
        }
        self.wal_release.settle().await
    }

    /// Hands the values the entry next to apply reads to the pager (the member asks, see
    /// `MemberConfig::values_resident`), and tells the member once they are in: the raft core
    /// does not wait for the disk to apply, and serves peers and clients meanwhile. A full
    /// queue leaves the faults to the apply, as before.
    fn page_in_for_apply(&mut self) {
        if let Some((index, wait)) = self.apply_paging.as_mut() {
            if !wait.is_done() {
                return;
            }
            let index = *index;
            self.apply_paging = None;
            let (before, started) = (self.apply_mark(), Instant::now());
            self.member.pages_brought_in(index, self.now_ms());
            self.observe_apply(before, started);
        }
        let Some(wanted) = self.member.take_pages_wanted() else {
            return;
        };
        let index = wanted.index;
        let waiting = match wanted.rest {
            Some(rest) => self.shared.pager.bring_in_listed(wanted.records, rest),
            None => self.shared.pager.bring_in_records(wanted.records.iter()),
        };
        match waiting {
            Some(wait) => self.apply_paging = Some((index, wait)),
            None => {
                let (before, started) = (self.apply_mark(), Instant::now());
                self.member.pages_left_out(index, self.now_ms());
                self.observe_apply(before, started);
            }
        }
    }

    /// Whether the next compaction step must wait for a pager thread to bring in the segment
    /// file it reads (a reclaim of a durable segment, whose pages may be on disk): the raft
    /// core does not wait for the disk to compact, and goes on serving meanwhile. Each file
    /// gets one pager round: pages evicted again meanwhile (memory pressure, the value cache)
    /// are faulted by the steps rather than waited for forever, and mincore is asked once per
    /// file, not per step. A full queue leaves the faults to the steps, as before.
    fn compaction_waits_for_pages(&mut self) -> bool {
        if let Some(wait) = self.compaction_paging.as_mut() {
            if !wait.is_done() {
                return true;
            }
            self.compaction_paging = None;
        }
        if !self.member.compaction_runnable() {
            return false;
        }
        let Some(file) = self.member.writer().reclaim_file() else {
            return false;
        };
        let file_at = file.as_ptr() as usize;
        if file_at == self.compaction_paged_file {
            return false;
        }
        self.compaction_paged_file = file_at;
        // Asked whatever the segment's size (the pager's own look is bounded): a step comes
        // only between batches, and mincore of a segment costs far less than a fault.
        if keel_io::pages::pages_missing([&file[..]]) == 0 {
            return false;
        }
        match self.shared.pager.bring_in_records(std::iter::once(&file)) {
            None => false,
            Some(wait) => {
                self.compaction_paging = Some(wait);
                true
            }
        }
    }

    fn step_peers(&mut self) {
        for m in self.transport.take_inbox() {
            let now_ms = self.now_ms();
            self.member.step(m, now_ms);
        }
        for c in self.transport.take_control() {
            match c {
                Control::KeepAlive {
                    from,
                    request_id,
                    lease,
                } => {
                    let now_ms = self.now_ms();
                    self.member
                        .keepalive_from_peer(from, request_id, lease, now_ms);
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
                    self.member.keepalive_reply(request_id, ttl);
                }
                Control::ProposalRefused {
                    refusal_code,
                    kind_code,
                    id,
                } => match (
                    Refusal::from_code(refusal_code),
                    ProposalKind::from_code(kind_code),
                ) {
                    (Some(refusal), Some(kind)) => self.member.forwarded_refused(refusal, kind, id),
                    // A newer peer's code: its client times out, as before this frame existed.
                    _ => tracing::debug!(refusal_code, kind_code, "unknown proposal refusal"),
                },
            }
        }
        if let Some(by) = self.transport.told_removed() {
            self.member.told_removed(by);
        }
        let (unreachable, snapshots) = self.transport.take_reports();
        for id in unreachable {
            self.member.report_unreachable(id);
        }
        for (sent, status) in snapshots {
            self.member.report_snapshot(sent, status);
        }
        self.publish();
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

    fn take_queries(&mut self) {
        while let Some(q) = self.shared.queries.try_recv() {
            let now_ms = self.now_ms();
            self.member.query(q, now_ms);
        }
    }

    fn take_proposals(&mut self) {
        let mut count = 0;
        let mut bytes = 0;
        let now_ms = self.now_ms();
        let mut batch = Vec::new();
        while count < PROPOSALS_PER_BATCH_MAX && bytes < PROPOSAL_BYTES_PER_BATCH_MAX {
            let Some(p) = self.shared.proposals.try_recv() else {
                break;
            };
            count += 1;
            bytes += p.data.len();
            batch.push(p);
        }
        assert!(
            batch.len() <= PROPOSALS_PER_BATCH_MAX,
            "the batch stays bounded"
        );
        // One raft proposal for the whole batch: one append per follower, not one per write.
        self.member.propose_batch(batch, now_ms);
    }

    fn take_reads(&mut self) {
        let mut batch = Vec::new();
        while let Some(r) = self.shared.reads.try_recv() {
            batch.push(r);
        }
        let now_ms = self.now_ms();
        self.member.read(batch, now_ms);
    }

    async fn handle_ready(&mut self) -> Result<(), CoreError> {
        let now_ms = self.now_ms();
        let (before, started) = (self.apply_mark(), Instant::now());
        // The answers of the entries this step applies go to each shard at once.
        let held = crate::answers::hold_answers();
        let ready = self.member.ready(now_ms);
        drop(held);
        let Some(io) = ready else {
            return Ok(());
        };
        self.observe_apply(before, started);
        // Publish what the member decided (leader, term, applied writes) before waiting on I/O.
        self.publish();
        let ReadyIo {
            messages,
            checkpoint_to_persist,
            wal_records,
            persisted_messages,
        } = io;
        for m in messages {
            self.send(m);
        }
        let installs_snapshot = checkpoint_to_persist.is_some();
        if let Some((index, data)) = checkpoint_to_persist {
            self.shared.enter_raft_phase(LoopPhase::PersistSnapshot);
            self.persist_snapshot(index, data).await?;
            self.shared.enter_raft_phase(LoopPhase::Working);
        }
        let stats = self.shared.raft_stats.clone();
        if !wal_records.is_empty() {
            stats.wal_batch_entries.observe(wal_records.len() as u64);
            let started = Instant::now();
            // Returns only after the batch is durable: its O_DSYNC write completed (keel-io's
            // DmaStore; write then fdatasync where a store's writes are not durable). A failed
            // sync aborts the process inside keel-io, so an error here is an I/O error before
            // any write could be synced.
            self.shared.enter_raft_phase(LoopPhase::WalAppend);
            self.wal
                .append(wal_records)
                .await
                .map_err(|e| CoreError::Wal(e.to_string()))?;
            self.shared.enter_raft_phase(LoopPhase::Working);
            stats.wal_fsync.observe_duration(started.elapsed());
        }
        for m in persisted_messages {
            self.send(m);
        }
        let now_ms = self.now_ms();
        let (before, started) = (self.apply_mark(), Instant::now());
        if installs_snapshot {
            // The restore of the leader's store runs within `persisted` (seconds at millions
            // of keys, more than the watchdog grants one step of work): a phase of its own,
            // which the watchdog only warns about, as about storing the snapshot. It also
            // covers the entries that committed in the same Ready, which the batch limits
            // bound.
            self.shared.enter_raft_phase(LoopPhase::RestoreSnapshot);
        }
        let held = crate::answers::hold_answers();
        let persisted = self.member.persisted(now_ms);
        drop(held);
        persisted?;
        if installs_snapshot {
            self.shared.enter_raft_phase(LoopPhase::Working);
            // Said beside the store step's line, so a pause of the loop has its cause in the
            // log. The time is the whole step: the restore, then the entries that committed in
            // the same Ready (bounded by the batch limits).
            tracing::info!(
                applied_index = self.member.writer().applied_index(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "the leader's snapshot replaced the store"
            );
        }
        self.observe_apply(before, started);
        self.publish();
        Ok(())
    }

    /// Sends a raft message. A snapshot is our checkpoint file, whose store image points into
    /// this member's value-log segments: it is streamed with those segments' files on a
    /// connection of its own (`peer_snapshot.rs`) while the loop goes on. Only the bootstrap
    /// snapshot, which has no data, goes as an ordinary message.
    fn send(&self, m: keel_raft::Message) {
        let streamed = m.msg_type == keel_raft::MessageType::Snapshot
            && m.snapshot.as_ref().is_some_and(|s| !s.data.is_empty());
        if streamed {
            self.transport
                .send_snapshot(m, self.vlog.dir().to_path_buf(), self.snap_dir.clone());
        } else {
            self.transport.send(m);
        }
    }

    /// Where apply stands before a step of the member: its applied index, and how many steps
    /// of entries applied in steps it has taken.
    fn apply_mark(&self) -> (u64, u64) {
        (self.member.applied_index(), self.member.apply_steps_taken())
    }

    /// Times a step of the member that may have applied entries (see
    /// `RaftStats::backend_commit`): one that moved the applied index, or took a step of an
    /// entry applied in steps (each step is one pause of the loop). Steps that applied
    /// nothing are not counted, as etcd's backend commits only when there is work.
    fn observe_apply(&self, (applied_before, steps_before): (u64, u64), started: Instant) {
        let stepped = self.member.apply_steps_taken() > steps_before;
        if self.member.applied_index() <= applied_before && !stepped {
            return;
        }
        let stats = &self.shared.raft_stats;
        let elapsed = started.elapsed();
        stats.backend_commit.observe_duration(elapsed);
        if elapsed > crate::stats::SLOW_APPLY {
            RaftStats::count(&stats.slow_apply, 1);
            tracing::warn!(
                elapsed_ms = elapsed.as_millis() as u64,
                expected_ms = crate::stats::SLOW_APPLY.as_millis() as u64,
                "apply request took too long"
            );
        }
    }

    /// Writes a leader's snapshot as our newest checkpoint (durably), with the segment files
    /// the transport staged beside it stored under this member's ids. Raft waits for it (the
    /// snapshot is installed only once durable, before the WAL records it), so this loop does
    /// too; the work itself runs on a thread beside the raft CPU, not on glommio's blocking
    /// pool, which is pinned to it.
    async fn persist_snapshot(&mut self, index: u64, data: Bytes) -> Result<(), CoreError> {
        let dir = self.snap_dir.clone();
        let Some(staged) = self.transport.take_staged(&data) else {
            // Not streamed (a leader of a build before streaming sent it whole, every value
            // inline): the file as it came.
            let path = dir.join(checkpoint::file_name(index));
            return rt::on_thread("keel-snapshot", move || write_durably(&dir, &path, &data)).await;
        };
        assert_eq!(
            staged.index, index,
            "a staged snapshot is found by its own data"
        );
        // The leader's segment ids go from the member's base up: above every id its stores
        // used, or as they are where it never had a segment file.
        let base = self.member.segment_id_base();
        let shift = staged
            .segments
            .first()
            .map_or(0, |lowest| base.saturating_sub(*lowest));
        let vlog_dir = self.vlog.dir().to_path_buf();
        let (started, segments) = (Instant::now(), staged.segments.len());
        let placed = rt::on_thread("keel-snapshot", move || {
            peer_snapshot::place(staged, shift, &dir, &vlog_dir)
        })
        .await?;
        // The loop waited for this: an operator looking at a pause sees what it was.
        tracing::info!(
            index,
            segments,
            segment_id_shift = shift,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "stored the leader's snapshot as this member's newest checkpoint"
        );
        let (placed, mapped) = placed;
        self.placed_mapping = Some(mapped);
        self.member.snapshot_placed(placed);
        Ok(())
    }

    /// Carries out the member's effects and publishes its state to the shards: the member owns
    /// it, shards read these published copies.
    /// Logs the damaged value-log records reclaim met since the last look. Nothing was lost
    /// to them (reclaim moved every live value by walking the index instead), but a record
    /// that fails its crc means a damaged disk or file, which the operator must hear of.
    fn report_unreadable_records(&mut self) {
        let (count, last) = self.member.writer().unreadable_records();
        if count < self.unreadable_records_reported {
            // A leader's snapshot replaced the store, and its count starts afresh.
            self.unreadable_records_reported = 0;
        }
        if count == self.unreadable_records_reported {
            return;
        }
        let last = last.expect("a count above zero comes with the last record");
        tracing::error!(
            file = %keel_io::vlog::segment_path(&self.vlog_dir, last.segment).display(),
            offset = last.offset,
            records = count - self.unreadable_records_reported,
            "a value-log segment holds a damaged dead record; reclaim moved every live value \
             around it by walking the index, but the disk or the file is damaged"
        );
        self.unreadable_records_reported = count;
    }

    fn publish(&mut self) {
        for effect in self.member.take_effects() {
            match effect {
                Effect::MembersChanged => self.publish_members(),
                Effect::AlarmsChanged => self.shared.publish_alarms(self.member.alarms()),
                Effect::Leader { leader_id } => {
                    self.shared.leader_id.store(leader_id, Ordering::Release)
                }
                Effect::HardState { term, commit } => {
                    self.shared.raft_term.store(term, Ordering::Release);
                    self.shared.commit_index.store(commit, Ordering::Release);
                }
                Effect::Events { revision, events } => self.publish_events(revision, events),
                Effect::EventsCut { revision } => {
                    // Pairs with the fence in Hub::add_watcher_count, as in `publish_events`:
                    // either this sees a watcher added since the events were left out, or
                    // that watcher's first history read sees `revision`.
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if self.shared.watchers_total.load(Ordering::SeqCst) > 0 {
                        tracing::debug!(revision, "watch events left for history reads");
                        // Events left out because nobody watched are routine; past the
                        // bound, they are worth a line in the shards' logs.
                        let why = if self.member.events_wanted() {
                            OVERFLOW_LOST
                        } else {
                            OVERFLOW_UNWATCHED
                        };
                        self.resync_watchers(why);
                    }
                }
                Effect::StoreReplaced { reader } => {
                    if let Some(mapped) = self.placed_mapping.take() {
                        mapped.forget_resident_pages();
                    }
                    self.shared.replace_reader(reader);
                    self.shared
                        .applied_index
                        .store(self.member.applied_index(), Ordering::Release);
                    self.resync_watchers(OVERFLOW_LOST);
                }
                Effect::RemoveCheckpointsBefore { index } => {
                    self.release_beside(Removal::OlderThan(index), None, Vec::new())
                }
                Effect::ForwardKeepAlive {
                    to,
                    request_id,
                    lease,
                } => self.transport.send_keepalive(to, request_id, lease),
                Effect::KeepAliveReply {
                    to,
                    request_id,
                    ttl_s,
                } => self.transport.send_keepalive_reply(to, request_id, ttl_s),
                Effect::RefuseForwarded {
                    to,
                    refusal,
                    kind,
                    id,
                } => self
                    .transport
                    .send_proposal_refused(to, refusal.code(), kind.code(), id),
                Effect::Removed => {
                    self.shared.removed.store(true, Ordering::Release);
                    self.shared.stopping.store(true, Ordering::Release);
                }
            }
        }
        self.shared
            .applied_index
            .store(self.member.applied_index(), Ordering::Release);
        self.shared
            .raft_stats
            .proposals_pending
            .store(self.member.proposals_pending() as u64, Ordering::Relaxed);
        publish_store_size(&self.shared, self.member.writer());
        // Leadership or the quorum's last word may have moved: so may the shards' window for
        // renewing leases themselves.
        let now_ms = self.now_ms();
        self.member.publish_lease_window(now_ms);
    }

    fn publish_members(&self) {
        let members = self.member.members();
        let peers: Vec<(u64, Vec<String>)> = members
            .iter()
            .map(|m| (m.id, m.peer_urls.clone()))
            .collect();
        // The members this one learned of when it joined (or was founded with) that its
        // applied membership does not list, unless removed since. A leader's snapshot older
        // than this member's own joining leaves out the members added before it, and the
        // leader that sent it may be one of them: without their addresses this member's
        // answers to that leader were dropped, and it never caught up (seen when a leader
        // that had itself joined late took over a snapshot's sending). etcd keeps such
        // "remotes" for the same reason.
        let removed = self.member.removed_members();
        let remotes: Vec<(u64, Vec<String>)> = self
            .shared
            .identity
            .members
            .iter()
            .filter(|m| !removed.contains(&m.id) && !peers.iter().any(|(id, _)| *id == m.id))
            .map(|m| (m.id, m.peer_urls.clone()))
            .collect();
        self.transport.set_peers(&peers, &remotes);
        self.transport.set_removed(self.member.removed_members());
        let me = self.member.id();
        self.shared.is_learner.store(
            members.iter().any(|m| m.id == me && m.is_learner),
            Ordering::Release,
        );
        *self
            .shared
            .members
            .lock()
            .expect("members lock is never poisoned") = members.to_vec();
    }

    /// Tells every shard's watch hub that its watchers must catch up from history: revisions
    /// were published whose events no batch carries.
    /// `why` is an `OVERFLOW_*` bit.
    fn resync_watchers(&self, why: u8) {
        for (shard, flag) in self.shared.watch_overflow.iter().enumerate() {
            flag.fetch_or(why, Ordering::AcqRel);
            self.shared.watch_batches[shard].nudge();
        }
    }

    /// Hands the batch's events to every shard's watch hub, encoded once. A shard whose queue
    /// is full loses the batch and is told to catch up from history: apply never waits.
    fn publish_events(&self, revision: i64, events: Vec<kv::Event>) {
        if events.is_empty() {
            return;
        }
        // Pairs with the fence in Hub::add_watcher_count (see there).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.shared.watchers_total.load(Ordering::SeqCst) == 0 {
            return;
        }
        let batch = Arc::new(WatchBatch::encode(revision, events));
        for (shard, mailbox) in self.shared.watch_batches.iter().enumerate() {
            if mailbox.try_send(batch.clone()).is_err() {
                self.shared.watch_overflow[shard].fetch_or(OVERFLOW_LOST, Ordering::AcqRel);
                mailbox.nudge();
            }
        }
    }

    /// Removes checkpoint files, and drops an old in-memory image and the log entries compacted
    /// behind a checkpoint, on a thread beside the raft CPU: unlinking a file as large as the
    /// store frees every block it held (0.4-0.5 s for 1.1 GB on dev-vm's ext4), freeing the
    /// image about 80 ms per GB, and freeing a checkpoint's entries (each then held its own
    /// request; now they share a buffer per Ready, see `RawNode::share_in_flight_entry_data`)
    /// 12-45 ms in a 4 GiB load, which this loop must not wait for. Only files the member no
    /// longer needs are named, and no newer checkpoint can reuse their names, so the removal
    /// may finish whenever it does; one cut short by a crash leaves an old file that the next
    /// removal takes.
    fn release_beside(
        &self,
        removal: Removal,
        image: Option<Bytes>,
        entries: Vec<keel_raft::Entry>,
    ) {
        let dir = self.snap_dir.clone();
        let release = move || {
            match removal {
                Removal::OlderThan(index) => checkpoint::remove_older(&dir, index),
                Removal::Stale(index) => checkpoint::remove(&dir, index),
            }
            drop(image);
            drop(entries);
        };
        // Dropping the handle detaches the thread. Without a thread the files stay until the
        // next removal, which takes every older file, not just the newest one.
        if let Err(e) = rt::spawn_beside("keel-ckpt-rm", release) {
            tracing::warn!(error = %e, "no thread to remove old checkpoints; left for later");
        }
    }

    /// Hands the member's due checkpoint to the writer thread and returns at once: the image
    /// is serialized and written there while this loop goes on. False when the last checkpoint
    /// already covers the applied index.
    fn start_checkpoint(&mut self) -> Result<bool, CoreError> {
        let Some(req) = self.member.checkpoint_request()? else {
            return Ok(false);
        };
        tracing::debug!(index = req.index, "checkpoint started");
        self.checkpoints.submit(req)?;
        Ok(true)
    }

    /// Takes the writer's outcome: a durable checkpoint releases the WAL and older files; one
    /// that a leader's snapshot overtook meanwhile is removed; an image a compaction raced is
    /// retried when next due. A failed write stops the raft core, as a failed fsync must.
    async fn finish_checkpoint(
        &mut self,
        outcome: Result<Written, CoreError>,
    ) -> Result<(), CoreError> {
        let (index, conf_state, file, delta_of) = match outcome? {
            Written::Raced { index } => {
                tracing::info!(index, "checkpoint skipped: a compaction raced it");
                self.member.checkpoint_abandoned(index);
                return Ok(());
            }
            Written::Durable {
                index,
                conf_state,
                file,
                delta_of,
                serialize_elapsed,
                elapsed,
            } => {
                self.shared.raft_stats.checkpoint.observe_duration(elapsed);
                tracing::info!(
                    index,
                    bytes = file.len(),
                    delta_of,
                    serialize_ms = serialize_elapsed.as_millis() as u64,
                    elapsed_ms = elapsed.as_millis() as u64,
                    "checkpoint written"
                );
                (index, conf_state, file, delta_of)
            }
        };
        match self
            .member
            .checkpoint_written(index, conf_state, file, delta_of)?
        {
            CheckpointCompletion::Taken {
                done,
                previous_image,
                compacted_entries,
            } => {
                self.wal_release.start(self.wal.clone(), done.wal_keep_from);
                self.release_beside(
                    Removal::OlderThan(done.remove_before),
                    previous_image,
                    compacted_entries,
                );
                // Checkpoints older than `remove_before` are going, and with them the need
                // for the segments that died before the oldest kept one was captured.
                let gone = vlog_writer::released_by_checkpoint(
                    &mut self.dead_segments,
                    index,
                    done.remove_before,
                );
                vlog_writer::remove_dead(self.vlog.dir().to_path_buf(), gone);
            }
            CheckpointCompletion::Overtaken { stale_file_index } => {
                if let Some(stale) = stale_file_index {
                    self.release_beside(Removal::Stale(stale), None, Vec::new());
                }
            }
        }
        Ok(())
    }
}

/// Releases WAL segments behind a durable checkpoint in a task beside the raft loop, on its
/// executor: each released segment is unlinked (64 MiB of blocks to free) and the directory
/// synced, a checkpoint can release several, and the loop must not wait for that. One release
/// runs at a time, so segments go oldest first and a crash midway leaves a contiguous log, as
/// `Wal::release_before` requires; a newer bound asked for meanwhile is taken when it ends.
#[derive(Default)]
struct WalRelease {
    state: Rc<RefCell<WalReleaseState>>,
}

#[derive(Default)]
struct WalReleaseState {
    running: bool,
    /// The highest bound asked for: segments wholly before it may go.
    keep_from: u64,
    /// Why a release failed; the raft loop stops on it, as it did when it waited.
    failed: Option<String>,
}

impl WalRelease {
    fn start(&self, wal: Rc<Wal<DmaStore>>, keep_from: u64) {
        let mut state = self.state.borrow_mut();
        state.keep_from = state.keep_from.max(keep_from);
        if state.running {
            return;
        }
        state.running = true;
        // Let go before spawning: the executor may poll the new task at once.
        drop(state);
        let shared = self.state.clone();
        rt::spawn_local(async move {
            loop {
                let target = shared.borrow().keep_from;
                let released = wal.release_before(target).await;
                let mut state = shared.borrow_mut();
                match released {
                    Err(e) => state.failed = Some(e.to_string()),
                    Ok(_) if state.keep_from > target => continue,
                    Ok(_) => {}
                }
                state.running = false;
                return;
            }
        });
    }

    /// Fails when a release failed.
    fn check(&self) -> Result<(), CoreError> {
        match self.state.borrow_mut().failed.take() {
            Some(why) => Err(CoreError::Wal(why)),
            None => Ok(()),
        }
    }

    /// Waits for the release in progress (at stop).
    async fn settle(&self) -> Result<(), CoreError> {
        while self.state.borrow().running {
            rt::sleep(Duration::from_millis(1)).await;
        }
        self.check()
    }
}

/// Checkpoint files the member no longer needs.
#[derive(Debug, Clone, Copy)]
enum Removal {
    /// Every checkpoint older than this index (a newer one is durable).
    OlderThan(u64),
    /// The checkpoint at this index, which a leader's snapshot overtook while it was written.
    Stale(u64),
}

/// Publishes the store's size (Status's dbSize and dbSizeInUse; what the quota counts) after
/// work between applies changed it (each apply publishes dbSize itself). etcd's is never 0
/// (an empty bbolt file has pages), and clients check that, so neither is ours.
fn publish_store_size(shared: &Shared, writer: &kv::Writer) {
    // An entry applied in steps publishes its size with its writes, at its last step.
    if writer.stepping().is_some() {
        return;
    }
    writer.publish_size();
    shared
        .db_size_in_use_bytes
        .store(writer.size_bytes_in_use().max(4096), Ordering::Release);
}

/// The segments the checkpoint files in `snap_dir` point into: what a start must keep. None
/// when a file cannot be read (it does not decode, or names segments in a form this build
/// cannot list): it may point into any segment (see `vlog_writer::remove_unreferenced`).
fn segments_of_checkpoints(
    snap_dir: &std::path::Path,
    newest: Option<&checkpoint::Checkpoint>,
) -> Option<Vec<u32>> {
    let mut kept = Vec::new();
    let mut add = |cp: &checkpoint::Checkpoint| -> Option<()> {
        kept.extend(kv::checkpoint_segments(&cp.kv_image).ok()?);
        Some(())
    };
    if let Some(cp) = newest {
        add(cp)?;
    }
    for (index, path) in checkpoint::files(snap_dir) {
        if newest.is_some_and(|cp| cp.meta.index == index) {
            continue;
        }
        // Mapped and read in place, then unmapped: no copy of the file is made.
        let file = keel_io::vlog::map_file_to_read(&path).ok()?;
        let cp = checkpoint::decode_shared(file.bytes()).ok()?;
        add(&cp)?;
    }
    kept.sort_unstable();
    kept.dedup();
    Some(kept)
}
