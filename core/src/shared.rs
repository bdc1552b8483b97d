//! What the shards and the raft core share: the MVCC reader, the bounded queues into the raft
//! core, and the raft facts every response header and Status call needs, as atomics.
//!
//! Architecture invariant: shards never take a lock on the request path. They read the MVCC
//! index through its lock-free `Reader`, publish work through bounded mailboxes, and wait on
//! one-shot replies.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures_channel::oneshot;
use keel_grpc::EtcdError;
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use prost::Message;

use crate::alarms::{AlarmMember, Alarms};
use crate::auth::{AuthImage, AuthInfo, AuthReply, AuthState, TokenTable};
use crate::config::Config;
use crate::ids::{Identity, Member};
use crate::limits::Limits;
use crate::member::lease_clock::LeaseDeadlines;
use crate::pager::Pager;
use crate::rt::Mailbox;
use crate::stats::{PeerTable, RaftStats};
use crate::watch::WatchBatch;
use crate::watchdog::LoopPhase;

/// Proposals waiting for the raft core. Beyond this the server answers "too many requests",
/// as etcd does when its proposals outrun apply.
pub const PROPOSAL_QUEUE_MAX: usize = 16 * 1024;
/// Linearizable reads waiting for a ReadIndex round.
pub const READ_QUEUE_MAX: usize = 16 * 1024;

/// What applying one entry answered: as the raft core made it (`Op` an unread
/// `kv::Unchecked<kv::OpResponse>`, see `Unserved`), or as a shard serves it.
#[derive(Debug)]
pub enum Answer<Op = kv::OpResponse> {
    /// A keel-kv operation's response.
    Op(Op),
    /// An alarm request's listed alarms.
    Alarms(Vec<AlarmMember>),
    /// An auth request's answer, at the store's revision when it applied.
    Auth { reply: AuthReply, revision: i64 },
}

/// What a committed, applied proposal answers.
#[derive(Debug)]
pub struct Outcome<Op = kv::OpResponse> {
    pub response: Answer<Op>,
    /// The raft term the entry was applied in, for the response header.
    pub raft_term: u64,
}

/// What the raft core answers a proposal: the values of a keel-kv answer that lie in mapped
/// segment files (previous key-values, a txn's ranges) are not read yet, so the raft core
/// never waits for the disk to answer (see `kv::Unchecked`); `served` reads them.
pub type Unserved = Outcome<kv::Unchecked<kv::OpResponse>>;

/// Where a proposal's answer goes: in batches to the proposing shard (see `answers`).
pub use crate::answers::Reply;

impl Unserved {
    /// The answer as a shard serves it: the pages of its unread values are brought into
    /// memory by a pager thread where some are not (the shard serves others meanwhile), and
    /// the values are checked.
    ///
    /// Not an `async fn`, which would hold the answer twice in every write's task.
    pub fn served(self, pager: &Pager) -> impl Future<Output = Outcome> {
        let raft_term = self.raft_term;
        let response = match self.response {
            Answer::Op(unchecked) => Ok(pager.serve(unchecked)),
            Answer::Alarms(alarms) => Err(Answer::Alarms(alarms)),
            Answer::Auth { reply, revision } => Err(Answer::Auth { reply, revision }),
        };
        async move {
            let response = match response {
                Ok(serving) => Answer::Op(serving.await),
                Err(answer) => answer,
            };
            Outcome {
                response,
                raft_term,
            }
        }
    }
}

/// One client write on its way into the log.
pub struct Proposal {
    /// The encoded `InternalRaftRequest`, exactly the log entry's payload.
    pub data: Bytes,
    pub id: u64,
    pub reply: Reply,
}

/// Questions only the raft core can answer: lease state lives with the leader's clock.
pub enum Query {
    /// Renews a lease; answers its TTL in seconds, or 0 when the lease is unknown. A leader's
    /// shards renew on their own while they may (`Shared::renew_lease_here`); this is the rest.
    KeepAlive {
        id: i64,
        reply: oneshot::Sender<Result<i64, EtcdError>>,
    },
    /// Remaining and granted TTL and attached keys; None when the lease is unknown.
    TimeToLive {
        id: i64,
        reply: oneshot::Sender<Result<Option<LeaseStatus>, EtcdError>>,
    },
    /// Every lease id.
    Leases {
        reply: oneshot::Sender<Result<Vec<i64>, EtcdError>>,
    },
    /// A membership change; answers the member it concerned and the membership after it.
    Member {
        change: MemberChange,
        reply: oneshot::Sender<Result<(u64, Vec<Member>), EtcdError>>,
    },
    /// Captures the store for Maintenance.Snapshot: a consistent image source plus the raft
    /// position and membership it belongs to.
    Snapshot {
        reply: oneshot::Sender<Result<SnapshotSource, EtcdError>>,
    },
    /// Rewrites every value-log segment holding dead bytes, in bounded steps between batches;
    /// answers the bytes the store shrank by once done.
    Defragment {
        reply: oneshot::Sender<Result<u64, EtcdError>>,
    },
    /// Hands leadership to another voter; answers once it leads.
    TransferLeader {
        to: u64,
        reply: oneshot::Sender<Result<(), EtcdError>>,
    },
}

/// What Maintenance.Snapshot serializes off the raft core: the checkpoint file of this moment.
pub struct SnapshotSource {
    pub source: kv::CheckpointSource,
    pub index: u64,
    pub term: u64,
    pub conf_state: keel_raft::ConfState,
    pub members: Vec<Member>,
    /// Ids of members removed from the cluster (etcd's `members_removed` bucket).
    pub removed: Vec<u64>,
    pub alarms: Vec<AlarmMember>,
    pub auth: AuthImage,
}

#[derive(Debug, Clone)]
pub enum MemberChange {
    Add {
        peer_urls: Vec<String>,
        learner: bool,
        /// The Unix second the MemberAdd call arrived, mixed into the new member's id as etcd
        /// does: read where the call is received, because the member state machine reads no
        /// clock.
        added_at_unix_s: u64,
    },
    Remove {
        id: u64,
    },
    Update {
        id: u64,
        peer_urls: Vec<String>,
    },
    Promote {
        id: u64,
    },
}

#[derive(Debug, Clone)]
pub struct LeaseStatus {
    pub remaining_ttl_s: i64,
    pub granted_ttl_s: i64,
    pub keys: Vec<Bytes>,
}

/// Lease queries waiting for the raft core.
pub const QUERY_QUEUE_MAX: usize = 16 * 1024;
/// Applied event batches waiting for one shard's watch hub. When a shard falls this far
/// behind, the raft core drops batches for it and the shard's watchers catch up from MVCC
/// history instead: a slow shard never slows apply.
pub const WATCH_BATCH_QUEUE_MAX: usize = 1024;

/// `Shared::watch_overflow`: a batch was dropped for a slow shard, an entry's events passed
/// the bound, or a snapshot replaced the store.
pub const OVERFLOW_LOST: u8 = 1;
/// `Shared::watch_overflow`: entries applied while no shard had a watcher, without events,
/// and a watcher appeared meanwhile (routine; see `Member::set_events_wanted`).
pub const OVERFLOW_UNWATCHED: u8 = 2;

/// One linearizable read waiting for the applied index to catch up with a ReadIndex.
pub struct ReadWait {
    pub reply: oneshot::Sender<Result<(), EtcdError>>,
}

/// The auth store and this member's live tokens as last applied: what shards resolve tokens
/// and check permissions against. The member publishes them itself as an auth entry applies,
/// before its caller is answered. A client told that its revoke is done must find its next
/// request checked against it, as etcd changes its auth store within the apply; published
/// after the answer, the next request could be checked against the store before it and
/// refused at apply with "revision of auth store is old" instead of "permission denied".
///
/// The store and the tokens are one value, swapped whole: a reader that took them apart
/// could pair a token with the store from after its user was deleted, or before.
#[derive(Debug, Default)]
pub struct PublishedAuth {
    current: ArcSwap<AuthView>,
}

/// One published version of the auth store and the live tokens.
#[derive(Debug, Default)]
pub struct AuthView {
    pub state: Arc<AuthState>,
    pub tokens: Arc<TokenTable>,
}

impl PublishedAuth {
    pub fn publish(&self, state: Arc<AuthState>, tokens: Arc<TokenTable>) {
        self.current.store(Arc::new(AuthView { state, tokens }));
    }

    /// The auth store and tokens as published (lock-free).
    pub fn load(&self) -> arc_swap::Guard<Arc<AuthView>> {
        self.current.load()
    }
}

pub struct Shared {
    pub config: Config,
    /// Every size limit, derived from the configuration in one place.
    pub limits: Limits,
    pub identity: Identity,
    /// The MVCC reader. Swapped whole when a follower installs a leader's snapshot.
    reader: ArcSwap<kv::Reader>,
    pub proposals: Arc<Mailbox<Proposal>>,
    pub reads: Arc<Mailbox<ReadWait>>,
    pub queries: Arc<Mailbox<Query>>,
    /// Applied events, one queue per shard (see `watch`).
    pub watch_batches: Vec<Arc<Mailbox<Arc<WatchBatch>>>>,
    /// Set by the raft core when revisions were published that no batch brings that shard:
    /// `OVERFLOW_*` bits, saying why (cleared by the shard's hub as it resyncs).
    pub watch_overflow: Vec<AtomicU8>,
    /// Watchers on all shards; the raft core encodes events only when some exist.
    pub watchers_total: AtomicUsize,
    /// The cluster's id; 0 only on a joining member that has not heard from a peer yet.
    cluster_id: AtomicU64,
    /// The membership as last applied (MemberList reads it; it changes rarely).
    pub members: Mutex<Vec<Member>>,
    pub is_learner: AtomicBool,
    pub leader_id: AtomicU64,
    pub raft_term: AtomicU64,
    pub commit_index: AtomicU64,
    pub applied_index: AtomicU64,
    /// Status's dbSizeInUse (see `db_size_bytes` for dbSize).
    pub db_size_in_use_bytes: AtomicU64,
    /// The raised alarms as last applied (replicated through raft; see `alarms`).
    alarms: ArcSwap<Vec<AlarmMember>>,
    /// Some NOSPACE alarm is raised: writes that grow the store fail until it is disarmed.
    pub nospace: AtomicBool,
    /// Some CORRUPT alarm is raised: every write fails.
    pub corrupt: AtomicBool,
    /// The auth store as last applied (replicated through raft; see `auth`) and this member's
    /// live simple tokens, each replaced whole; the member publishes them itself.
    auth: Arc<PublishedAuth>,
    /// Milliseconds since `started_at` when the raft core last went round its loop: health
    /// reports a raft core that stopped turning.
    pub raft_loop_at_ms: AtomicU64,
    /// What the raft loop is doing (a `watchdog::LoopPhase`), since when (uptime ms), and,
    /// while idle, by when its own timer wakes it: the watchdog judges a stall by these.
    raft_loop_phase: AtomicU8,
    raft_loop_phase_at_ms: AtomicU64,
    raft_loop_wake_by_ms: AtomicU64,
    /// Set once SIGINT or SIGTERM asked the member to stop (as opposed to the raft core
    /// stopping on its own, which ends the process with an error).
    pub signalled: AtomicBool,
    pub stopping: AtomicBool,
    /// Set when the raft core stops because this member was removed from the cluster: the
    /// process then exits 0, as etcd's does (see `node::stop_process`).
    pub removed: AtomicBool,
    pub started_at: Instant,
    /// The raft facts and disk timings /metrics reports, counted where they happen.
    pub raft_stats: Arc<RaftStats>,
    /// Per-peer traffic, counted by the peer transport.
    pub peer_stats: Arc<PeerTable>,
    /// The leader's lease countdowns, set once the raft core opens: shards renew leases in
    /// them while the member keeps the window open (see `renew_lease_here`).
    lease_deadlines: OnceLock<Arc<LeaseDeadlines>>,
    next_id: AtomicU64,
    /// Takes cold reads' page faults off the shards (started by `node::run`).
    pub pager: Arc<Pager>,
    /// What the value cache (`value_cache`) measured and paged out.
    pub value_cache: crate::value_cache::ValueCacheStats,
}

impl Shared {
    pub fn new(config: Config, identity: Identity, reader: kv::Reader) -> Shared {
        let cluster_id = identity.cluster_id;
        let members = identity.members.clone();
        // etcd's id generator: the member id's low 16 bits, then milliseconds since the epoch,
        // then a counter, so ids from different members and from restarts do not collide.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let prefix = (identity.member_id & 0xffff) << 48;
        let next_id = prefix | ((now_ms & 0xff_ffff_ffff) << 8);
        let shards = config.shard_cpus.len();
        Shared {
            limits: Limits::new(&config),
            config,
            identity,
            reader: ArcSwap::from_pointee(reader),
            proposals: Mailbox::new(PROPOSAL_QUEUE_MAX),
            reads: Mailbox::new(READ_QUEUE_MAX),
            queries: Mailbox::new(QUERY_QUEUE_MAX),
            watch_batches: (0..shards)
                .map(|_| Mailbox::new(WATCH_BATCH_QUEUE_MAX))
                .collect(),
            watch_overflow: (0..shards).map(|_| AtomicU8::new(0)).collect(),
            watchers_total: AtomicUsize::new(0),
            cluster_id: AtomicU64::new(cluster_id),
            members: Mutex::new(members),
            is_learner: AtomicBool::new(false),
            leader_id: AtomicU64::new(0),
            raft_term: AtomicU64::new(0),
            commit_index: AtomicU64::new(0),
            applied_index: AtomicU64::new(0),
            db_size_in_use_bytes: AtomicU64::new(0),
            alarms: ArcSwap::from_pointee(Vec::new()),
            nospace: AtomicBool::new(false),
            corrupt: AtomicBool::new(false),
            auth: Arc::default(),
            raft_loop_at_ms: AtomicU64::new(0),
            raft_loop_phase: AtomicU8::new(LoopPhase::Starting as u8),
            raft_loop_phase_at_ms: AtomicU64::new(0),
            raft_loop_wake_by_ms: AtomicU64::new(0),
            signalled: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            started_at: Instant::now(),
            raft_stats: Arc::default(),
            peer_stats: Arc::default(),
            lease_deadlines: OnceLock::new(),
            next_id: AtomicU64::new(next_id),
            pager: Arc::default(),
            value_cache: Default::default(),
        }
    }

    /// The current MVCC reader (lock-free; valid for the whole request that loaded it).
    pub fn reader(&self) -> arc_swap::Guard<Arc<kv::Reader>> {
        self.reader.load()
    }

    /// Replaces the store shards read from (snapshot install on a follower).
    pub fn replace_reader(&self, reader: kv::Reader) {
        self.reader.store(Arc::new(reader));
    }

    /// Bytes the store occupies (value log plus index estimate), as it last published them:
    /// Status's dbSize. etcd's is never 0 (an empty bbolt file has pages), and clients check
    /// that, so neither is ours.
    pub fn db_size_bytes(&self) -> u64 {
        self.reader().size_bytes_published().max(4096)
    }

    /// The raised alarms (lock-free; replaced whole when an alarm entry is applied).
    pub fn alarms(&self) -> arc_swap::Guard<Arc<Vec<AlarmMember>>> {
        self.alarms.load()
    }

    /// Publishes the alarms the raft core applied.
    pub fn publish_alarms(&self, alarms: &Alarms) {
        self.nospace.store(alarms.nospace(), Ordering::Release);
        self.corrupt.store(alarms.corrupt(), Ordering::Release);
        self.alarms.store(Arc::new(alarms.list()));
    }

    /// The auth store and the live simple tokens, as one version (lock-free; replaced whole
    /// when an auth entry changes either).
    pub fn auth(&self) -> arc_swap::Guard<Arc<AuthView>> {
        self.auth.load()
    }

    /// Where the member publishes the auth store as it applies (`MemberConfig::published_auth`).
    pub fn published_auth(&self) -> Arc<PublishedAuth> {
        self.auth.clone()
    }

    /// Milliseconds since this member started (the raft loop's heartbeat clock, and the
    /// member's own clock: token deadlines are on it).
    pub fn uptime_ms(&self) -> u64 {
        self.started_at.elapsed().as_millis() as u64
    }

    /// The raft loop says what it does next (see `watchdog`).
    pub fn enter_raft_phase(&self, phase: LoopPhase) {
        self.raft_loop_phase_at_ms
            .store(self.uptime_ms(), Ordering::Release);
        self.raft_loop_phase.store(phase as u8, Ordering::Release);
    }

    /// The raft loop waits for work, or at the latest until `wake_by_ms` (uptime).
    pub fn enter_raft_idle(&self, wake_by_ms: u64) {
        self.raft_loop_wake_by_ms
            .store(wake_by_ms, Ordering::Release);
        self.enter_raft_phase(LoopPhase::Idle);
    }

    /// The loop's phase, how long it has been in it, and how far past its wake-up time an
    /// idle loop is (0 when not idle or not yet due), all at `now_ms` (uptime).
    pub fn raft_loop_phase(&self, now_ms: u64) -> (LoopPhase, u64, u64) {
        let phase = LoopPhase::from_u8(self.raft_loop_phase.load(Ordering::Acquire));
        let since_ms = self.raft_loop_phase_at_ms.load(Ordering::Acquire);
        let overdue_ms = if phase == LoopPhase::Idle {
            now_ms.saturating_sub(self.raft_loop_wake_by_ms.load(Ordering::Acquire))
        } else {
            0
        };
        (phase, now_ms.saturating_sub(since_ms), overdue_ms)
    }

    /// How long ago the raft core last went round its loop.
    pub fn raft_loop_idle_ms(&self) -> u64 {
        self.uptime_ms()
            .saturating_sub(self.raft_loop_at_ms.load(Ordering::Acquire))
    }

    pub fn member_id(&self) -> u64 {
        self.identity.member_id
    }

    pub fn cluster_id(&self) -> u64 {
        self.cluster_id.load(Ordering::Acquire)
    }

    pub fn set_cluster_id(&self, id: u64) {
        self.cluster_id.store(id, Ordering::Release);
    }

    pub fn members(&self) -> Vec<Member> {
        self.members
            .lock()
            .expect("members lock is never poisoned: no panics while held")
            .clone()
    }

    pub fn has_leader(&self) -> bool {
        self.leader_id.load(Ordering::Acquire) != 0
    }

    pub fn header(&self, revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id(),
            member_id: self.member_id(),
            revision,
            raft_term: self.raft_term.load(Ordering::Acquire),
        })
    }

    /// A lease id for a LeaseGrant that asked the server to pick one: positive, and from the
    /// same generator as proposal ids so members do not collide.
    pub fn new_lease_id(&self) -> i64 {
        (self.next_id.fetch_add(1, Ordering::Relaxed) & (i64::MAX as u64)) as i64
    }

    /// A proposal id for a request the raft core itself proposes (auto-compaction), from the
    /// same generator as the shards' ids so the two never collide. The member's own counters
    /// (`MemberConfig::ids_first`) start from one too; they number read rounds, keep-alives
    /// and membership requests, which are matched apart from client proposals, so their values
    /// may meet these without harm.
    pub fn next_proposal_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts a request into the log and waits until it is committed on a quorum, durable and
    /// applied; returns what applying it answered.
    pub fn propose(
        &self,
        request: pb::InternalRaftRequest,
    ) -> impl Future<Output = Result<Outcome, EtcdError>> + '_ {
        self.propose_as(request, &AuthInfo::default())
    }

    /// `propose` on behalf of `who`: the entry's header carries the user and auth revision its
    /// permissions are checked with at apply (etcd's RequestHeader username and auth_revision).
    ///
    /// The request is encoded and handed to the raft core when this is called, not when the
    /// future is first polled: the future then holds only the reply channel. An
    /// `InternalRaftRequest` is 1.2 KB, and as an `async fn` argument it made every write's
    /// call future (copied into its task per request) several KB larger.
    ///
    /// The answer is served (see `Unserved::served`) on the calling thread.
    pub fn propose_as(
        &self,
        request: pb::InternalRaftRequest,
        who: &AuthInfo,
    ) -> impl Future<Output = Result<Outcome, EtcdError>> + '_ {
        let submitted = self.submit(request, who);
        async move {
            let applied = submitted?.await?;
            Ok(applied.served(&self.pager).await)
        }
    }

    /// Encodes `request` with its header and queues it for the raft core.
    fn submit(
        &self,
        mut request: pb::InternalRaftRequest,
        who: &AuthInfo,
    ) -> Result<crate::answers::AnswerWait, EtcdError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(EtcdError::Stopped);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        assert!(id != 0, "id 0 marks the member's own entries");
        request.header = Some(pb::RequestHeader {
            id,
            username: who.user.clone(),
            auth_revision: who.revision,
        });
        // An owner-backed Bytes, not `Bytes::from(Vec)`: the raft core clones an entry's data
        // (the proposal kept for a refused batch, the log, followers' appends), and the first
        // clone of a Vec-backed Bytes allocates its shared header there, on the core every
        // write goes through; this allocation is made here, on the shard.
        let data = Bytes::from_owner(request.encode_to_vec());
        // etcd measures the marshalled internal request against max-request-bytes.
        if data.len() > self.limits.request_bytes_max {
            return Err(EtcdError::RequestTooLarge);
        }
        let (reply, answer) = crate::answers::reply_here();
        if let Err(refused) = self.proposals.try_send(Proposal { data, id, reply }) {
            refused.reply.forget();
            return Err(if self.stopping.load(Ordering::Acquire) {
                EtcdError::Stopped
            } else {
                EtcdError::TooManyRequests
            });
        }
        Ok(answer)
    }

    /// etcd's quota check before proposing a write that costs `cost_bytes` (see
    /// `alarms::op_cost_bytes`): when the store plus the write would reach the quota, this
    /// member raises NOSPACE through raft and the write is refused. While NOSPACE is raised,
    /// costly writes are refused here without a raft round (apply would refuse them anyway).
    pub async fn check_quota(&self, cost_bytes: u64) -> Result<(), EtcdError> {
        if cost_bytes == 0 {
            return Ok(());
        }
        if self.nospace.load(Ordering::Acquire) {
            return Err(EtcdError::NoSpace);
        }
        // The store publishes its size before an applied write's answer goes out, so a
        // client's next write counts its last one.
        let size_bytes = self.reader().size_bytes_published();
        if size_bytes + cost_bytes < self.config.quota_backend_bytes {
            return Ok(());
        }
        tracing::warn!(
            size_bytes,
            cost_bytes,
            quota_bytes = self.config.quota_backend_bytes,
            "a write would pass the quota: raising NOSPACE"
        );
        // Boxed: every write's task holds this future, and a raft round inlined here, taken
        // once per NOSPACE, made it 650 bytes larger.
        Box::pin(self.raise_nospace()).await;
        Err(EtcdError::NoSpace)
    }

    /// Proposes the NOSPACE alarm for this member (`check_quota` found the quota reached).
    async fn raise_nospace(&self) {
        let raise = pb::InternalRaftRequest {
            alarm: Some(pb::AlarmRequest {
                action: pb::alarm_request::AlarmAction::Activate as i32,
                member_id: self.member_id(),
                alarm: pb::AlarmType::Nospace as i32,
            }),
            ..Default::default()
        };
        if let Err(e) = self.propose(raise).await {
            tracing::warn!(error = %e, "cannot raise the NOSPACE alarm");
        }
    }

    /// Gives the shards the member's lease countdowns (once, when the raft core opens).
    pub fn set_lease_deadlines(&self, deadlines: Arc<LeaseDeadlines>) {
        assert!(
            self.lease_deadlines.set(deadlines).is_ok(),
            "one raft core per process sets the lease countdowns"
        );
    }

    /// Renews a lease on this shard, without the raft core, when this member leads and may
    /// (see `LeaseDeadlines::renew_here`): its TTL, 0 when it expired, None to ask the raft core.
    pub fn renew_lease_here(&self, id: i64) -> Option<i64> {
        // The member's clock is `uptime_ms` (the raft core's `clock_origin` is `started_at`).
        self.lease_deadlines
            .get()?
            .renew_here(id, || self.uptime_ms())
    }

    /// Asks the raft core a lease question.
    pub async fn query<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, EtcdError>>) -> Query,
    ) -> Result<T, EtcdError> {
        let (reply, rx) = oneshot::channel();
        if self.queries.try_send(make(reply)).is_err() {
            return Err(if self.stopping.load(Ordering::Acquire) {
                EtcdError::Stopped
            } else {
                EtcdError::TooManyRequests
            });
        }
        rx.await.unwrap_or(Err(EtcdError::Stopped))
    }

    /// etcd's request timeout: 5 s plus twice the election timeout.
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(5)
            + 2 * std::time::Duration::from_millis(self.config.election_timeout_ms)
    }

    /// The smallest lease TTL etcd grants: leases must outlive a leader election.
    pub fn lease_ttl_min_s(&self) -> i64 {
        let ms = 3 * self.config.election_timeout_ms / 2;
        ms.div_ceil(1000) as i64
    }

    /// Waits until a read started now may be served locally and still be linearizable.
    pub async fn read_barrier(&self) -> Result<(), EtcdError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(EtcdError::Stopped);
        }
        let (reply, rx) = oneshot::channel();
        if self.reads.try_send(ReadWait { reply }).is_err() {
            return Err(EtcdError::TooManyRequests);
        }
        rx.await.unwrap_or(Err(EtcdError::Stopped))
    }
}

/// keel-kv's errors as etcd errors (the codes and strings live in keel-grpc's one mapping).
pub fn kv_error(e: kv::KvError) -> EtcdError {
    match e {
        kv::KvError::KeyNotProvided => EtcdError::EmptyKey,
        kv::KvError::ValueProvided => EtcdError::ValueProvided,
        kv::KvError::LeaseProvided => EtcdError::LeaseProvided,
        kv::KvError::KeyNotFound => EtcdError::KeyNotFound,
        kv::KvError::TooManyOps => EtcdError::TooManyOps,
        kv::KvError::DuplicateKey => EtcdError::DuplicateKey,
        kv::KvError::Compacted => EtcdError::Compacted,
        kv::KvError::FutureRevision => EtcdError::FutureRev,
        kv::KvError::LeaseNotFound => EtcdError::LeaseNotFound,
        kv::KvError::LeaseExists => EtcdError::LeaseExist,
        kv::KvError::LeaseTtlTooLarge => EtcdError::LeaseTtlTooLarge,
        // A damaged checkpoint stops the node at start; it never reaches a client.
        kv::KvError::CheckpointDamaged(_) | kv::KvError::SegmentUnusable { .. } => {
            EtcdError::Corrupt
        }
        // bbolt files are read and written only by snapshot tools, never for a client's request.
        kv::KvError::Bolt(_) => EtcdError::Corrupt,
    }
}
