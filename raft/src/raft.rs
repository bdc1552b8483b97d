//! The consensus core: roles, elections, replication, commit, read index, transfer, membership.
//! Pure: every input is a method call, every output lands in `msgs`, `msgs_after_persist`,
//! `read_states` or the log, and `RawNode` turns them into a `Ready`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

use crate::config::{CheckQuorum, Config, PreVote};
use crate::error::{Error, Result};
use crate::log::RaftLog;
use crate::storage::Storage;
use crate::tracker::{Progress, ProgressState};
use crate::types::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, MessageType,
};

/// The role a member plays in its current term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Follows a leader (or waits for one).
    Follower,
    /// Runs a pre-vote round; its term is unchanged.
    PreCandidate,
    /// Runs an election in a new term.
    Candidate,
    /// Leads the term.
    Leader,
}

/// Volatile state the server may want to observe (not persisted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftState {
    /// The known leader (0: none).
    pub leader_id: u64,
    /// This member's role.
    pub role: Role,
}

/// The answer to a read-index request: once the applied index reaches `index`, a read that
/// started before the request is linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadState {
    /// The read index.
    pub index: u64,
    /// The request's context, as passed to `read_index`.
    pub context: Bytes,
}

/// Whether the leader may keep snapshots coming after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotStatus {
    /// The follower received the snapshot.
    Finish,
    /// The transfer failed; the leader probes again.
    Failure,
}

/// The snapshot message a transfer report is about. A transfer can outlast the state it was
/// sent for: its report may come back after the leader stepped down and was elected again, or
/// after a newer snapshot went to the same follower. Naming the message lets raft drop such a
/// stale report instead of ending the newer transfer's wait early (which sends yet another
/// snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotSent {
    /// The follower it went to.
    pub to: u64,
    /// The leader's term when it went out.
    pub term: u64,
    /// The index of the snapshot it carries.
    pub index: u64,
}

impl SnapshotSent {
    /// The report key of a snapshot message; None for any other message.
    pub fn of(m: &Message) -> Option<Self> {
        if m.msg_type != MessageType::Snapshot {
            return None;
        }
        Some(Self {
            to: m.to,
            term: m.term,
            index: m.snapshot.as_ref().map_or(0, |s| s.metadata.index),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CampaignKind {
    PreElection,
    Election,
    Transfer,
}

/// Votes carrying this context come from a leadership transfer and bypass leases.
const CAMPAIGN_TRANSFER: &[u8] = b"transfer";

/// Ticks after which the preferred of split candidates campaigns again: more than one whole
/// tick (the next tick may come at once), so that a rival that wins this election meanwhile
/// has been heard from by then. Its first append makes the retrying candidate a follower,
/// and the others ignore a pre-vote while they hear from a leader; a retry sooner could reach
/// voters that had not heard yet, win their pre-votes, and depose the new leader.
const SPLIT_VOTE_RETRY_TICKS: usize = 2;

/// What a candidate knows of a split vote in its term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SplitVote {
    /// No rival candidate heard from (or the quick retry is spent).
    None,
    /// Rivals heard from, and this member is preferred to each: it retries first.
    RetryFirst,
    /// A rival is preferred: this member keeps its whole timeout.
    Yield,
}

#[derive(Debug, Clone)]
struct ReadRequest {
    from: u64,
    context: Bytes,
}

/// One heartbeat round shared by every read request queued before it started.
#[derive(Debug)]
struct ReadRound {
    id: u64,
    index: u64,
    requests: Vec<ReadRequest>,
    acks: BTreeSet<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VoteResult {
    Pending,
    Won,
    Lost,
}

/// splitmix64: a tiny, seedable PRNG; raft needs only election-timeout jitter.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One member's raft state machine.
pub struct Raft<S: Storage> {
    /// This member's id.
    pub id: u64,
    /// Current term.
    pub term: u64,
    /// Vote in the current term (0: none).
    pub vote: u64,
    /// The log.
    pub raft_log: RaftLog<S>,
    /// Current role.
    pub role: Role,
    /// Known leader (0: none).
    pub leader_id: u64,
    prs: BTreeMap<u64, Progress>,
    voters: BTreeSet<u64>,
    learners: BTreeSet<u64>,
    votes: BTreeMap<u64, bool>,
    /// Messages that may be sent at once.
    pub(crate) msgs: Vec<Message>,
    /// Messages that may only be sent (or, to self, stepped) after the Ready is durable.
    pub(crate) msgs_after_persist: Vec<Message>,
    pub(crate) read_states: Vec<ReadState>,
    election_elapsed: usize,
    heartbeat_elapsed: usize,
    election_timeout: usize,
    heartbeat_timeout: usize,
    randomized_election_timeout: usize,
    /// This term's split vote, as seen by this candidate (see `settle_split_vote`).
    split_vote: SplitVote,
    rng: u64,
    pre_vote: PreVote,
    check_quorum: CheckQuorum,
    max_msg_bytes: u64,
    max_inflight_msgs: usize,
    max_inflight_bytes: u64,
    max_uncommitted_bytes: u64,
    max_pending_reads: usize,
    uncommitted_bytes: u64,
    pending_conf_index: u64,
    lead_transferee: Option<u64>,
    read_queue: Vec<ReadRequest>,
    read_rounds: VecDeque<ReadRound>,
    reads_waiting_commit: Vec<ReadRequest>,
    next_read_round: u64,
}

impl<S: Storage> Raft<S> {
    /// Builds a member from its config and durable storage.
    pub fn new(config: &Config, storage: S) -> Result<Raft<S>> {
        config.validate()?;
        let rs = storage.initial_state();
        let raft_log = RaftLog::new(storage);
        let mut r = Raft {
            id: config.id,
            term: 0,
            vote: 0,
            raft_log,
            role: Role::Follower,
            leader_id: 0,
            prs: BTreeMap::new(),
            voters: BTreeSet::new(),
            learners: BTreeSet::new(),
            votes: BTreeMap::new(),
            msgs: Vec::new(),
            msgs_after_persist: Vec::new(),
            read_states: Vec::new(),
            election_elapsed: 0,
            heartbeat_elapsed: 0,
            election_timeout: config.election_tick,
            heartbeat_timeout: config.heartbeat_tick,
            randomized_election_timeout: config.election_tick,
            split_vote: SplitVote::None,
            rng: config.seed ^ config.id.wrapping_mul(0x2545_f491_4f6c_dd1d),
            pre_vote: config.pre_vote,
            check_quorum: config.check_quorum,
            max_msg_bytes: config.max_size_per_msg_bytes,
            max_inflight_msgs: config.max_inflight_msgs,
            max_inflight_bytes: config.max_inflight_bytes,
            max_uncommitted_bytes: config.max_uncommitted_entries_bytes,
            max_pending_reads: config.max_pending_read_index,
            uncommitted_bytes: 0,
            pending_conf_index: 0,
            lead_transferee: None,
            read_queue: Vec::new(),
            read_rounds: VecDeque::new(),
            reads_waiting_commit: Vec::new(),
            next_read_round: 1,
        };
        r.set_conf_state(&rs.conf_state);
        let hs = rs.hard_state;
        // The WAL writes entries before the hard state, so a durable commit is always covered.
        assert!(
            hs.commit <= r.raft_log.last_index(),
            "durable commit {} beyond the log",
            hs.commit
        );
        assert!(hs.vote == 0 || hs.term > 0, "a vote without a term");
        r.raft_log.commit_to(hs.commit);
        r.term = hs.term;
        r.vote = hs.vote;
        if config.applied > 0 {
            // Only committed, locally durable entries are ever applied, so an applied index
            // ahead of the durable commit (a commit-only hard state is written without sync)
            // is itself proof of commitment.
            assert!(
                config.applied <= r.raft_log.last_index(),
                "applied {} beyond the durable log {}",
                config.applied,
                r.raft_log.last_index()
            );
            r.raft_log.commit_to(config.applied);
            let applied = config.applied.max(r.raft_log.applied);
            r.raft_log.applied = applied;
            r.raft_log.applying = applied;
        }
        r.become_follower(r.term, 0);
        Ok(r)
    }

    /// Current soft state.
    pub fn soft_state(&self) -> SoftState {
        SoftState {
            leader_id: self.leader_id,
            role: self.role,
        }
    }

    /// Current hard state.
    pub fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            commit: self.raft_log.committed,
        }
    }

    /// Current membership.
    pub fn conf_state(&self) -> ConfState {
        ConfState {
            voters: self.voters.iter().copied().collect(),
            learners: self.learners.iter().copied().collect(),
        }
    }

    /// The leader's view of a member's replication (None on non-leaders for others).
    pub fn progress(&self, id: u64) -> Option<&Progress> {
        self.prs.get(&id)
    }

    /// Ticks without hearing from a leader before a follower may vote for another (the
    /// configured, not the randomized, election timeout).
    pub fn election_timeout_ticks(&self) -> usize {
        self.election_timeout
    }

    /// The target of an in-progress leadership transfer.
    pub fn lead_transferee(&self) -> Option<u64> {
        self.lead_transferee
    }

    /// Read requests waiting on this leader (queued, in a round, or waiting for a commit).
    pub fn pending_read_count(&self) -> usize {
        self.read_queue.len()
            + self.reads_waiting_commit.len()
            + self
                .read_rounds
                .iter()
                .map(|r| r.requests.len())
                .sum::<usize>()
    }

    /// Uncommitted entry bytes counted against the proposal limit.
    pub fn uncommitted_bytes(&self) -> u64 {
        self.uncommitted_bytes
    }

    fn quorum(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    fn promotable(&self) -> bool {
        self.voters.contains(&self.id)
    }

    fn set_conf_state(&mut self, cs: &ConfState) {
        self.voters = cs.voters.iter().copied().collect();
        self.learners = cs.learners.iter().copied().collect();
        assert!(
            self.voters.is_disjoint(&self.learners),
            "a member is both voter and learner"
        );
        let next = self.raft_log.last_index() + 1;
        self.prs.clear();
        for &id in self.voters.iter().chain(self.learners.iter()) {
            let mut pr = Progress::new(next, self.max_inflight_msgs, self.max_inflight_bytes);
            pr.is_learner = self.learners.contains(&id);
            self.prs.insert(id, pr);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Sending.

    fn send(&mut self, mut m: Message) {
        // A forwarded request keeps its origin (the proposer, the transfer target).
        if m.from == 0 {
            m.from = self.id;
        }
        match m.msg_type {
            MessageType::RequestVote
            | MessageType::RequestPreVote
            | MessageType::RequestVoteResponse
            | MessageType::RequestPreVoteResponse => {
                assert!(m.term != 0, "vote messages carry an explicit term");
            }
            // Forwarded proposals and reads are local requests to the leader: no term.
            MessageType::Propose | MessageType::ReadIndex => m.term = 0,
            _ => m.term = self.term,
        }
        // Responses that vouch for durable state (accepted entries, a vote) wait for the
        // persist; so does every message to self (the leader's own ack, its own vote).
        let after_persist = m.to == self.id
            || matches!(
                m.msg_type,
                MessageType::AppendResponse
                    | MessageType::RequestVoteResponse
                    | MessageType::RequestPreVoteResponse
            );
        if after_persist {
            self.msgs_after_persist.push(m);
        } else {
            self.msgs.push(m);
        }
    }

    /// Sends an append (or a snapshot) to `to` if flow control allows; true if sent.
    fn maybe_send_append(&mut self, to: u64, send_if_empty: bool) -> bool {
        assert!(to != self.id, "never append to self");
        let Some(pr) = self.prs.get(&to) else {
            return false;
        };
        if pr.is_paused() {
            return false;
        }
        let prev_index = pr.next_idx - 1;
        let prev_term = self.raft_log.term(prev_index);
        let ents = self.raft_log.entries(pr.next_idx, self.max_msg_bytes);
        if let (Ok(prev_term), Ok(entries)) = (prev_term, ents) {
            if entries.is_empty() && !send_if_empty {
                return false;
            }
            let bytes: u64 = entries.iter().map(Entry::size_bytes).sum();
            let n = entries.len() as u64;
            let commit = self.raft_log.committed;
            let pr = self.prs.get_mut(&to).expect("checked above");
            pr.sent_entries(prev_index, n, bytes);
            self.send(Message {
                msg_type: MessageType::Append,
                to,
                index: prev_index,
                log_term: prev_term,
                entries,
                commit,
                ..Message::default()
            });
            return true;
        }
        // The entries are compacted away: send the snapshot instead.
        if !pr.recent_active {
            return false;
        }
        let Ok(snapshot) = self.raft_log.snapshot() else {
            return false;
        };
        assert!(!snapshot.is_empty(), "storage handed out an empty snapshot");
        let pr = self.prs.get_mut(&to).expect("checked above");
        pr.become_snapshot(snapshot.metadata.index);
        self.send(Message {
            msg_type: MessageType::Snapshot,
            to,
            snapshot: Some(snapshot),
            ..Message::default()
        });
        true
    }

    fn others(&self) -> Vec<u64> {
        self.prs
            .keys()
            .copied()
            .filter(|&id| id != self.id)
            .collect()
    }

    fn bcast_append(&mut self) {
        for id in self.others() {
            self.maybe_send_append(id, true);
        }
    }

    fn bcast_heartbeat(&mut self, context: Bytes) {
        for id in self.others() {
            let pr = self.prs.get_mut(&id).expect("others are tracked");
            pr.heartbeat_unanswered = true;
            let matched = pr.matched;
            let commit = matched.min(self.raft_log.committed);
            self.send(Message {
                msg_type: MessageType::Heartbeat,
                to: id,
                commit,
                context: context.clone(),
                ..Message::default()
            });
        }
    }

    // -----------------------------------------------------------------------------------------
    // Role changes.

    fn reset(&mut self, term: u64) {
        if self.term != term {
            self.term = term;
            self.vote = 0;
        }
        self.leader_id = 0;
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        // Randomized in [n, 1.5n) rather than etcd's [n, 2n): a dead leader is noticed within
        // one and a half timeouts, so writes resume within two. The narrower window makes
        // split votes likelier; a split is settled within a tick (see `handle_vote_request`)
        // instead of costing another whole timeout.
        self.randomize_election_timeout();
        self.split_vote = SplitVote::None;
        self.lead_transferee = None;
        self.votes.clear();
        let next = self.raft_log.last_index() + 1;
        let persisted = self.raft_log.persisted_last_index();
        for (&id, pr) in self.prs.iter_mut() {
            let is_learner = pr.is_learner;
            *pr = Progress::new(next, self.max_inflight_msgs, self.max_inflight_bytes);
            pr.is_learner = is_learner;
            if id == self.id {
                pr.matched = persisted;
            }
        }
        self.uncommitted_bytes = 0;
        self.pending_conf_index = 0;
        // Reads in flight are dropped: the server times them out and retries.
        self.read_queue.clear();
        self.read_rounds.clear();
        self.reads_waiting_commit.clear();
    }

    fn become_follower(&mut self, term: u64, leader_id: u64) {
        assert!(
            term >= self.term,
            "terms never go backwards ({} -> {term})",
            self.term
        );
        assert!(leader_id != self.id, "a follower cannot follow itself");
        self.reset(term);
        self.leader_id = leader_id;
        self.role = Role::Follower;
    }

    fn become_pre_candidate(&mut self) {
        assert!(
            self.role != Role::Leader,
            "a leader cannot become pre-candidate"
        );
        self.votes.clear();
        self.leader_id = 0;
        self.role = Role::PreCandidate;
    }

    fn become_candidate(&mut self) {
        assert!(
            self.role != Role::Leader,
            "a leader cannot become candidate"
        );
        self.reset(self.term + 1);
        self.vote = self.id;
        self.role = Role::Candidate;
    }

    fn become_leader(&mut self) {
        assert!(
            self.role == Role::Candidate,
            "only a candidate becomes leader"
        );
        self.reset(self.term);
        self.leader_id = self.id;
        self.role = Role::Leader;
        let pr = self.prs.get_mut(&self.id).expect("a leader is a voter");
        pr.become_replicate();
        pr.recent_active = true;
        self.pending_conf_index = self.raft_log.last_index();
        // The empty entry lets the leader commit everything of earlier terms.
        self.append_entries(vec![Entry::default()])
            .expect("an empty entry is within every limit");
    }

    fn hup(&mut self, kind: CampaignKind) {
        if self.role == Role::Leader || !self.promotable() {
            return;
        }
        // Campaigning under a configuration that is committed but not yet applied could elect
        // a leader the new configuration does not accept.
        let lo = self.raft_log.applied + 1;
        let hi = self.raft_log.committed + 1;
        if lo < hi {
            if let Ok(ents) = self.raft_log.slice(lo, hi, u64::MAX) {
                if ents.iter().any(|e| e.entry_type == EntryType::ConfChange) {
                    return;
                }
            }
        }
        // A sole voter can disrupt nobody, so it skips the pre-vote round (one Ready less
        // before a single-member server can take writes).
        let kind = match (kind, self.pre_vote) {
            (CampaignKind::Election, PreVote::Enabled) if !self.single_voter() => {
                CampaignKind::PreElection
            }
            (k, _) => k,
        };
        self.campaign(kind);
    }

    fn campaign(&mut self, kind: CampaignKind) {
        let (msg_type, term) = if kind == CampaignKind::PreElection {
            self.become_pre_candidate();
            (MessageType::RequestPreVote, self.term + 1)
        } else {
            self.become_candidate();
            (MessageType::RequestVote, self.term)
        };
        let resp_type = vote_response_type(msg_type);
        // Our own vote counts once the vote is durable: it goes through the after-persist path.
        self.send(Message {
            msg_type: resp_type,
            to: self.id,
            term,
            ..Message::default()
        });
        let context = if kind == CampaignKind::Transfer {
            Bytes::from_static(CAMPAIGN_TRANSFER)
        } else {
            Bytes::new()
        };
        let (last_index, last_term) = (self.raft_log.last_index(), self.raft_log.last_term());
        let voters: Vec<u64> = self
            .voters
            .iter()
            .copied()
            .filter(|&v| v != self.id)
            .collect();
        for to in voters {
            self.send(Message {
                msg_type,
                to,
                term,
                index: last_index,
                log_term: last_term,
                context: context.clone(),
                ..Message::default()
            });
        }
    }

    fn poll(&mut self, from: u64, granted: bool) -> VoteResult {
        self.votes.entry(from).or_insert(granted);
        let yes = self
            .voters
            .iter()
            .filter(|v| self.votes.get(v) == Some(&true))
            .count();
        let no = self
            .voters
            .iter()
            .filter(|v| self.votes.get(v) == Some(&false))
            .count();
        if yes >= self.quorum() {
            VoteResult::Won
        } else if no > self.voters.len() - self.quorum() {
            VoteResult::Lost
        } else {
            VoteResult::Pending
        }
    }

    fn randomize_election_timeout(&mut self) {
        let spread_ticks = (self.election_timeout / 2).max(1) as u64;
        self.randomized_election_timeout =
            self.election_timeout + (splitmix64(&mut self.rng) % spread_ticks) as usize;
    }

    // -----------------------------------------------------------------------------------------
    // Inputs.

    /// Advances logical time by one tick.
    pub fn tick(&mut self) {
        if self.role == Role::Leader {
            self.tick_heartbeat();
        } else {
            self.tick_election();
        }
    }

    fn tick_election(&mut self) {
        self.election_elapsed += 1;
        if self.promotable() && self.election_elapsed >= self.randomized_election_timeout {
            self.election_elapsed = 0;
            if self.split_vote == SplitVote::RetryFirst {
                // The quick retry is spent: a pre-vote that stays pending now waits a whole
                // randomized timeout before the next, as any other.
                self.split_vote = SplitVote::None;
                self.randomize_election_timeout();
            }
            self.hup(CampaignKind::Election);
        }
    }

    fn tick_heartbeat(&mut self) {
        self.heartbeat_elapsed += 1;
        self.election_elapsed += 1;
        if self.election_elapsed >= self.election_timeout {
            self.election_elapsed = 0;
            if self.check_quorum == CheckQuorum::Enabled {
                if !self.quorum_active() {
                    self.become_follower(self.term, 0);
                    return;
                }
                let me = self.id;
                for (&id, pr) in self.prs.iter_mut() {
                    pr.recent_active = id == me;
                }
            }
            // A transfer that did not finish within an election timeout is abandoned.
            self.lead_transferee = None;
        }
        if self.heartbeat_elapsed >= self.heartbeat_timeout {
            self.heartbeat_elapsed = 0;
            self.bcast_heartbeat(Bytes::new());
        }
    }

    fn quorum_active(&self) -> bool {
        let active = self
            .voters
            .iter()
            .filter(|v| **v == self.id || self.prs.get(v).is_some_and(|p| p.recent_active))
            .count();
        active >= self.quorum()
    }

    /// Starts an election now (pre-vote first if enabled).
    pub fn campaign_now(&mut self) {
        self.hup(CampaignKind::Election);
    }

    /// Proposes entries (local call; followers forward to the leader).
    pub fn propose(&mut self, entries: Vec<Entry>) -> Result<()> {
        assert!(!entries.is_empty(), "empty proposal");
        self.step(Message {
            msg_type: MessageType::Propose,
            from: self.id,
            entries,
            ..Message::default()
        })
    }

    /// Requests a read index (local call; followers forward to the leader).
    pub fn read_index(&mut self, context: Bytes) -> Result<()> {
        self.step(Message {
            msg_type: MessageType::ReadIndex,
            from: self.id,
            context,
            ..Message::default()
        })
    }

    /// Asks the leader to hand leadership to `to`.
    pub fn transfer_leader(&mut self, to: u64) {
        let m = Message {
            msg_type: MessageType::TransferLeader,
            from: to,
            term: self.term,
            ..Message::default()
        };
        // Only local bookkeeping can fail here; a dropped transfer is simply not started.
        let _ = self.step_local_transfer(m);
    }

    fn step_local_transfer(&mut self, m: Message) -> Result<()> {
        match self.role {
            Role::Leader => {
                self.handle_transfer_leader(m.from);
                Ok(())
            }
            _ if self.leader_id != 0 => {
                self.send(Message {
                    msg_type: MessageType::TransferLeader,
                    to: self.leader_id,
                    ..m
                });
                Ok(())
            }
            _ => Err(Error::ProposalDropped("no leader to transfer from")),
        }
    }

    /// Reports the outcome of sending the snapshot message `sent`. A report for a message of
    /// an earlier term, or for another snapshot than the one the follower waits for, is stale
    /// and changes nothing.
    pub fn report_snapshot(&mut self, sent: SnapshotSent, status: SnapshotStatus) {
        if self.role != Role::Leader || sent.term != self.term {
            return;
        }
        let Some(pr) = self.prs.get_mut(&sent.to) else {
            return;
        };
        if pr.state != ProgressState::Snapshot || pr.pending_snapshot != sent.index {
            return;
        }
        if status == SnapshotStatus::Failure {
            pr.pending_snapshot = 0;
        }
        // Wait for the next heartbeat response before probing again.
        pr.become_probe();
        pr.probe_sent = true;
    }

    /// Reports that `to` could not be reached; replication falls back to probing.
    pub fn report_unreachable(&mut self, to: u64) {
        if self.role != Role::Leader {
            return;
        }
        if let Some(pr) = self.prs.get_mut(&to) {
            if pr.state == ProgressState::Replicate {
                pr.become_probe();
            }
        }
    }

    /// Steps a message (from a peer, or a local request).
    pub fn step(&mut self, m: Message) -> Result<()> {
        if m.term == 0 {
            // Local request or one forwarded to the leader: no term checks.
        } else if m.term > self.term {
            if matches!(
                m.msg_type,
                MessageType::RequestVote | MessageType::RequestPreVote
            ) {
                let force = m.context.as_ref() == CAMPAIGN_TRANSFER;
                let in_lease = self.check_quorum == CheckQuorum::Enabled
                    && self.leader_id != 0
                    && self.election_elapsed < self.election_timeout;
                // We voted for another candidate of our term less than an election timeout ago:
                // its election may be succeeding right now, and a pre-vote for the next term
                // would let a member that timed out just after it depose it as soon as it won
                // (its higher term reaches the new leader through an append response). Once
                // the candidate has won we are in its lease; if it failed, we grant after an
                // election timeout, as we would campaign ourselves. Our own vote, or a vote for
                // the asker, backs no rival (a split vote's retry needs those).
                let backing_a_candidate = self.pre_vote == PreVote::Enabled
                    && m.msg_type == MessageType::RequestPreVote
                    && self.role == Role::Follower
                    && self.vote != 0
                    && self.vote != self.id
                    && self.vote != m.from
                    && self.election_elapsed < self.election_timeout;
                if !force && (in_lease || backing_a_candidate) {
                    // We heard from a leader recently, or back a candidate that may have won:
                    // this candidate is disruptive.
                    return Ok(());
                }
            }
            match m.msg_type {
                MessageType::RequestPreVote => {}
                MessageType::RequestPreVoteResponse if !m.reject => {}
                MessageType::Append | MessageType::Heartbeat | MessageType::Snapshot => {
                    self.become_follower(m.term, m.from)
                }
                MessageType::RequestVote => {
                    // A higher-term candidate makes us a follower but restarts our election
                    // timer only if we grant it the vote (Raft section 5.2): otherwise an
                    // up-to-date member pre-empted again and again by stale candidates would
                    // never get to campaign itself.
                    let elapsed = self.election_elapsed;
                    self.become_follower(m.term, 0);
                    self.election_elapsed = elapsed;
                }
                _ => self.become_follower(m.term, 0),
            }
        } else if m.term < self.term {
            let stale_leader = matches!(m.msg_type, MessageType::Heartbeat | MessageType::Append);
            if stale_leader
                && (self.check_quorum == CheckQuorum::Enabled || self.pre_vote == PreVote::Enabled)
            {
                // A partitioned old leader learns the new term from this and steps down.
                self.send(Message {
                    msg_type: MessageType::AppendResponse,
                    to: m.from,
                    ..Message::default()
                });
            } else if m.msg_type == MessageType::RequestPreVote {
                let term = self.term;
                self.send(Message {
                    msg_type: MessageType::RequestPreVoteResponse,
                    to: m.from,
                    term,
                    reject: true,
                    ..Message::default()
                });
            }
            return Ok(());
        }

        match m.msg_type {
            MessageType::RequestVote | MessageType::RequestPreVote => {
                self.handle_vote_request(m);
                Ok(())
            }
            _ => match self.role {
                Role::Leader => self.step_leader(m),
                Role::Candidate | Role::PreCandidate => self.step_candidate(m),
                Role::Follower => self.step_follower(m),
            },
        }
    }

    fn handle_vote_request(&mut self, m: Message) {
        assert!(
            m.term >= self.term,
            "stale vote requests are filtered by step"
        );
        assert!(
            m.from != self.id,
            "own votes never go through the wire path"
        );
        let pre = m.msg_type == MessageType::RequestPreVote;
        let can_vote = self.vote == m.from
            || (self.vote == 0 && self.leader_id == 0)
            || (pre && m.term > self.term);
        let resp = vote_response_type(m.msg_type);
        if can_vote && self.raft_log.is_up_to_date(m.index, m.log_term) {
            self.send(Message {
                msg_type: resp,
                to: m.from,
                term: m.term,
                ..Message::default()
            });
            if !pre {
                self.election_elapsed = 0;
                self.vote = m.from;
            }
        } else {
            if !pre && self.role == Role::Candidate && m.term == self.term && self.vote == self.id {
                self.settle_split_vote(m.from, m.index, m.log_term);
            }
            let term = self.term;
            self.send(Message {
                msg_type: resp,
                to: m.from,
                term,
                reject: true,
                ..Message::default()
            });
        }
    }

    /// Another candidate asked for our vote in our own term: the vote is split between us.
    /// Standard Raft waits out a randomized timeout, which both may pick alike again. Instead
    /// exactly one of the candidates retries at once: the one with the most up-to-date log, or
    /// the lowest id on a tie, among all the rivals it heard from this term (a candidate's log
    /// is fixed for its term, so every candidate that heard from the same rivals agrees). The
    /// others keep their full timeouts, and grant the retry their pre-votes and votes (they
    /// have no leader, and their logs are no newer). The retry survives losing this election
    /// (`VoteResult::Lost`), which is how a split among three or more candidates ends. Only
    /// timing changes, so safety does not depend on this; a lost message falls back to the
    /// timeouts.
    fn settle_split_vote(&mut self, rival: u64, rival_last_index: u64, rival_last_term: u64) {
        let ours = (self.raft_log.last_term(), self.raft_log.last_index());
        let theirs = (rival_last_term, rival_last_index);
        let preferred = ours > theirs || (ours == theirs && self.id < rival);
        match (preferred, self.split_vote) {
            (true, SplitVote::None) => {
                // Campaign again soon, unless this election is won first.
                self.split_vote = SplitVote::RetryFirst;
                self.randomized_election_timeout = self
                    .randomized_election_timeout
                    .min(self.election_elapsed + SPLIT_VOTE_RETRY_TICKS);
            }
            (false, SplitVote::None) => self.split_vote = SplitVote::Yield,
            (false, SplitVote::RetryFirst) => {
                // A better rival after all: it retries, and we wait a whole timeout.
                self.split_vote = SplitVote::Yield;
                self.randomize_election_timeout();
            }
            (true, SplitVote::RetryFirst) | (_, SplitVote::Yield) => {}
        }
    }

    fn step_leader(&mut self, m: Message) -> Result<()> {
        assert!(
            self.role == Role::Leader && self.leader_id == self.id,
            "step_leader off a leader"
        );
        assert!(
            m.term == 0 || m.term == self.term,
            "step filtered other terms"
        );
        match m.msg_type {
            MessageType::Propose => self.leader_propose(m.entries),
            MessageType::ReadIndex => self.handle_read_index(ReadRequest {
                from: m.from,
                context: m.context,
            }),
            MessageType::TransferLeader => {
                self.handle_transfer_leader(m.from);
                Ok(())
            }
            MessageType::AppendResponse => {
                self.handle_append_response(m);
                Ok(())
            }
            MessageType::HeartbeatResponse => {
                self.handle_heartbeat_response(m);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn leader_propose(&mut self, mut entries: Vec<Entry>) -> Result<()> {
        assert!(!entries.is_empty(), "empty proposal");
        if !self.prs.contains_key(&self.id) {
            return Err(Error::ProposalDropped("this leader is no longer a member"));
        }
        if self.lead_transferee.is_some() {
            return Err(Error::ProposalDropped("leadership transfer in progress"));
        }
        let last = self.raft_log.last_index();
        let mut pending = self.pending_conf_index;
        for (i, e) in entries.iter_mut().enumerate() {
            if e.entry_type == EntryType::ConfChange {
                if pending > self.raft_log.applied {
                    return Err(Error::ConfChangePending);
                }
                self.validate_conf_change(&e.data)?;
                pending = last + 1 + i as u64;
            }
        }
        self.append_entries(entries)?;
        self.pending_conf_index = pending;
        self.bcast_append();
        Ok(())
    }

    fn validate_conf_change(&self, data: &[u8]) -> Result<()> {
        let cc = ConfChange::decode(data).map_err(|_| Error::InvalidConfChange("undecodable"))?;
        let id = cc.node_id;
        if id == 0 {
            return Err(Error::InvalidConfChange("node id 0"));
        }
        match cc.change_type {
            ConfChangeType::AddNode => {
                if self.voters.contains(&id) {
                    return Err(Error::InvalidConfChange("already a voter"));
                }
                if self.learners.contains(&id) {
                    let matched = self.prs.get(&id).map_or(0, |p| p.matched);
                    if matched < self.raft_log.committed {
                        return Err(Error::LearnerNotCaughtUp(id));
                    }
                }
            }
            ConfChangeType::AddLearnerNode => {
                if self.voters.contains(&id) {
                    return Err(Error::InvalidConfChange("cannot demote a voter"));
                }
                if self.learners.contains(&id) {
                    return Err(Error::InvalidConfChange("already a learner"));
                }
            }
            ConfChangeType::RemoveNode => {
                if !self.prs.contains_key(&id) {
                    return Err(Error::InvalidConfChange("not a member"));
                }
                if self.voters.len() == 1 && self.voters.contains(&id) {
                    return Err(Error::InvalidConfChange("cannot remove the last voter"));
                }
            }
        }
        Ok(())
    }

    /// Appends entries as leader, assigning term and index; refuses beyond the uncommitted limit.
    fn append_entries(&mut self, mut entries: Vec<Entry>) -> Result<()> {
        assert!(
            self.role == Role::Leader,
            "only the leader appends proposals"
        );
        let bytes: u64 = entries.iter().map(|e| e.data.len() as u64).sum();
        // An empty entry (no payload) is always admitted so a new leader can commit.
        if bytes > 0 && self.uncommitted_bytes + bytes > self.max_uncommitted_bytes {
            return Err(Error::ProposalDropped("too many uncommitted entry bytes"));
        }
        // One entry must fit in one append message: the size limit is soft for batching only.
        if entries
            .iter()
            .any(|e| e.data.len() as u64 > self.max_msg_bytes)
        {
            return Err(Error::ProposalDropped(
                "entry larger than the message size limit",
            ));
        }
        let last = self.raft_log.last_index();
        for (i, e) in entries.iter_mut().enumerate() {
            e.term = self.term;
            e.index = last + 1 + i as u64;
        }
        self.uncommitted_bytes += bytes;
        let last = self.raft_log.append(&entries);
        // The leader's own copy counts toward quorum only once durable.
        self.send(Message {
            msg_type: MessageType::AppendResponse,
            to: self.id,
            index: last,
            ..Message::default()
        });
        Ok(())
    }

    /// Lowers the uncommitted count once entries are handed out committed.
    pub(crate) fn reduce_uncommitted(&mut self, entries: &[Entry]) {
        if self.role != Role::Leader {
            return;
        }
        let bytes: u64 = entries.iter().map(|e| e.data.len() as u64).sum();
        self.uncommitted_bytes = self.uncommitted_bytes.saturating_sub(bytes);
    }

    fn handle_append_response(&mut self, m: Message) {
        let from = m.from;
        let Some(pr) = self.prs.get_mut(&from) else {
            return;
        };
        pr.recent_active = true;
        if m.reject {
            let mut next_probe = m.reject_hint;
            if m.log_term > 0 {
                next_probe = self
                    .raft_log
                    .find_conflict_by_term(m.reject_hint, m.log_term)
                    .0;
            }
            let pr = self.prs.get_mut(&from).expect("checked above");
            if pr.maybe_decr_to(m.index, next_probe) {
                if pr.state == ProgressState::Replicate {
                    pr.become_probe();
                }
                self.maybe_send_append(from, true);
            }
            return;
        }
        let old_paused = pr.is_paused();
        if !pr.maybe_update(m.index) {
            return;
        }
        match pr.state {
            ProgressState::Probe => pr.become_replicate(),
            ProgressState::Snapshot if pr.matched + 1 >= self.raft_log.first_index() => {
                pr.become_probe();
                pr.become_replicate();
            }
            ProgressState::Snapshot => {}
            ProgressState::Replicate => pr.inflights.free_le(m.index),
        }
        if self.maybe_commit() {
            self.bcast_append();
        } else if old_paused && from != self.id {
            self.maybe_send_append(from, true);
        }
        if from != self.id {
            while self.maybe_send_append(from, false) {}
            if self.lead_transferee == Some(from)
                && self.prs[&from].matched == self.raft_log.last_index()
            {
                self.send(Message {
                    msg_type: MessageType::TimeoutNow,
                    to: from,
                    ..Message::default()
                });
            }
        }
    }

    fn handle_heartbeat_response(&mut self, m: Message) {
        let from = m.from;
        let Some(pr) = self.prs.get_mut(&from) else {
            return;
        };
        pr.recent_active = true;
        // Only the first answer since the last heartbeat unblocks the flow. Answers to many
        // heartbeats can arrive at once: a connection across a partition that dropped packets
        // buffers what was sent meanwhile and delivers it all when the partition heals (and a
        // leader resumed after a stall sends a heartbeat per tick missed). Each answer sent a
        // full-size append; thousands of them in one step stalled a leader's loop for tens of
        // seconds, and it lost leadership while allocating gigabytes.
        if std::mem::take(&mut pr.heartbeat_unanswered) {
            pr.probe_sent = false;
            if pr.state == ProgressState::Replicate && pr.inflights.full() {
                // The follower is alive: let one more append through even if acks were lost.
                pr.inflights.free_first_one();
            }
            if pr.matched < self.raft_log.last_index() {
                self.maybe_send_append(from, true);
            }
        }
        if m.context.len() == 8 {
            let id = u64::from_be_bytes(m.context.as_ref().try_into().expect("length checked"));
            self.ack_read_round(id, from);
        }
    }

    fn handle_transfer_leader(&mut self, to: u64) {
        if to == self.id || !self.voters.contains(&to) {
            return;
        }
        if self.lead_transferee == Some(to) {
            return;
        }
        self.lead_transferee = Some(to);
        self.election_elapsed = 0;
        if self.prs[&to].matched == self.raft_log.last_index() {
            self.send(Message {
                msg_type: MessageType::TimeoutNow,
                to,
                ..Message::default()
            });
        } else {
            self.maybe_send_append(to, true);
        }
    }

    /// Commits the highest index replicated on a quorum of voters, if it is of this term.
    fn maybe_commit(&mut self) -> bool {
        let mut matched: Vec<u64> = self
            .voters
            .iter()
            .map(|v| self.prs.get(v).map_or(0, |p| p.matched))
            .collect();
        if matched.is_empty() {
            return false;
        }
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let mci = matched[self.quorum() - 1];
        let committed = self.raft_log.maybe_commit(mci, self.term);
        if committed {
            self.release_reads_waiting_commit();
        }
        committed
    }

    fn committed_entry_in_current_term(&self) -> bool {
        self.raft_log
            .term(self.raft_log.committed)
            .is_ok_and(|t| t == self.term)
    }

    fn single_voter(&self) -> bool {
        self.voters.len() == 1 && self.voters.contains(&self.id)
    }

    // -----------------------------------------------------------------------------------------
    // Read index (batched: all requests queued before a round starts share its heartbeats).

    fn handle_read_index(&mut self, req: ReadRequest) -> Result<()> {
        if self.pending_read_count() >= self.max_pending_reads {
            return Err(Error::ReadIndexDropped("too many pending read requests"));
        }
        if !self.committed_entry_in_current_term() {
            // The commit index may lag the true one until an entry of this term commits.
            self.reads_waiting_commit.push(req);
        } else if self.single_voter() {
            let index = self.raft_log.committed;
            self.respond_read(req, index);
        } else {
            self.read_queue.push(req);
        }
        Ok(())
    }

    fn release_reads_waiting_commit(&mut self) {
        if self.reads_waiting_commit.is_empty() || !self.committed_entry_in_current_term() {
            return;
        }
        let waiting = std::mem::take(&mut self.reads_waiting_commit);
        if self.single_voter() {
            let index = self.raft_log.committed;
            for req in waiting {
                self.respond_read(req, index);
            }
        } else {
            self.read_queue.extend(waiting);
        }
    }

    fn respond_read(&mut self, req: ReadRequest, index: u64) {
        if req.from == self.id || req.from == 0 {
            self.read_states.push(ReadState {
                index,
                context: req.context,
            });
        } else {
            self.send(Message {
                msg_type: MessageType::ReadIndexResponse,
                to: req.from,
                index,
                context: req.context,
                ..Message::default()
            });
        }
    }

    /// Starts one heartbeat round for every queued read request (called once per Ready).
    pub(crate) fn flush_read_queue(&mut self) {
        if self.read_queue.is_empty() || self.role != Role::Leader {
            return;
        }
        assert!(
            self.committed_entry_in_current_term(),
            "reads queue only once the term committed"
        );
        let id = self.next_read_round;
        self.next_read_round += 1;
        let requests = std::mem::take(&mut self.read_queue);
        let mut acks = BTreeSet::new();
        acks.insert(self.id);
        self.read_rounds.push_back(ReadRound {
            id,
            index: self.raft_log.committed,
            requests,
            acks,
        });
        self.bcast_heartbeat(Bytes::copy_from_slice(&id.to_be_bytes()));
    }

    pub(crate) fn has_read_queue(&self) -> bool {
        !self.read_queue.is_empty() && self.role == Role::Leader
    }

    fn ack_read_round(&mut self, id: u64, from: u64) {
        if !self.voters.contains(&from) {
            return;
        }
        let quorum = self.quorum();
        let Some(round) = self.read_rounds.iter_mut().find(|r| r.id == id) else {
            return;
        };
        round.acks.insert(from);
        let acked = round
            .acks
            .iter()
            .filter(|a| self.voters.contains(a))
            .count();
        if acked < quorum {
            return;
        }
        // A quorum confirmed leadership after this round started, so every earlier round
        // is confirmed too.
        while self.read_rounds.front().is_some_and(|r| r.id <= id) {
            let round = self.read_rounds.pop_front().expect("front checked");
            for req in round.requests {
                self.respond_read(req, round.index);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Candidate and follower.

    fn step_candidate(&mut self, m: Message) -> Result<()> {
        match m.msg_type {
            MessageType::Propose => Err(Error::ProposalDropped("no leader")),
            MessageType::ReadIndex => Err(Error::ReadIndexDropped("no leader")),
            MessageType::TransferLeader => Err(Error::ProposalDropped("no leader")),
            MessageType::Append => {
                self.become_follower(m.term, m.from);
                self.handle_append(m);
                Ok(())
            }
            MessageType::Heartbeat => {
                self.become_follower(m.term, m.from);
                self.handle_heartbeat(m);
                Ok(())
            }
            MessageType::Snapshot => {
                self.become_follower(m.term, m.from);
                self.handle_snapshot(m);
                Ok(())
            }
            MessageType::RequestPreVoteResponse | MessageType::RequestVoteResponse => {
                let expected = if self.role == Role::PreCandidate {
                    MessageType::RequestPreVoteResponse
                } else {
                    MessageType::RequestVoteResponse
                };
                if m.msg_type != expected {
                    return Ok(());
                }
                match self.poll(m.from, !m.reject) {
                    VoteResult::Won => {
                        if self.role == Role::PreCandidate {
                            self.campaign(CampaignKind::Election);
                        } else {
                            self.become_leader();
                            self.bcast_append();
                        }
                    }
                    VoteResult::Lost => {
                        let split_vote = self.split_vote;
                        self.become_follower(self.term, 0);
                        if split_vote == SplitVote::RetryFirst {
                            self.split_vote = split_vote;
                            self.randomized_election_timeout = SPLIT_VOTE_RETRY_TICKS;
                        }
                    }
                    VoteResult::Pending => {}
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn step_follower(&mut self, m: Message) -> Result<()> {
        match m.msg_type {
            MessageType::Propose => {
                if self.leader_id == 0 {
                    return Err(Error::ProposalDropped("no leader"));
                }
                let to = self.leader_id;
                self.send(Message { to, ..m });
                Ok(())
            }
            MessageType::ReadIndex => {
                if self.leader_id == 0 {
                    return Err(Error::ReadIndexDropped("no leader"));
                }
                let to = self.leader_id;
                self.send(Message { to, ..m });
                Ok(())
            }
            MessageType::TransferLeader => {
                if self.leader_id == 0 {
                    return Err(Error::ProposalDropped("no leader"));
                }
                let to = self.leader_id;
                self.send(Message { to, ..m });
                Ok(())
            }
            MessageType::Append => {
                self.election_elapsed = 0;
                self.leader_id = m.from;
                self.handle_append(m);
                Ok(())
            }
            MessageType::Heartbeat => {
                self.election_elapsed = 0;
                self.leader_id = m.from;
                self.handle_heartbeat(m);
                Ok(())
            }
            MessageType::Snapshot => {
                self.election_elapsed = 0;
                self.leader_id = m.from;
                self.handle_snapshot(m);
                Ok(())
            }
            MessageType::TimeoutNow => {
                self.hup(CampaignKind::Transfer);
                Ok(())
            }
            MessageType::ReadIndexResponse => {
                self.read_states.push(ReadState {
                    index: m.index,
                    context: m.context,
                });
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn handle_append(&mut self, m: Message) {
        if m.index < self.raft_log.committed {
            let index = self.raft_log.committed;
            self.send(Message {
                msg_type: MessageType::AppendResponse,
                to: m.from,
                index,
                ..Message::default()
            });
            return;
        }
        match self
            .raft_log
            .maybe_append(m.index, m.log_term, m.commit, &m.entries)
        {
            Some(last) => self.send(Message {
                msg_type: MessageType::AppendResponse,
                to: m.from,
                index: last,
                ..Message::default()
            }),
            None => {
                let hint = m.index.min(self.raft_log.last_index());
                let (hint_index, hint_term) = self.raft_log.find_conflict_by_term(hint, m.log_term);
                self.send(Message {
                    msg_type: MessageType::AppendResponse,
                    to: m.from,
                    index: m.index,
                    reject: true,
                    reject_hint: hint_index,
                    log_term: hint_term,
                    ..Message::default()
                });
            }
        }
    }

    fn handle_heartbeat(&mut self, m: Message) {
        self.raft_log.commit_to(m.commit);
        self.send(Message {
            msg_type: MessageType::HeartbeatResponse,
            to: m.from,
            context: m.context,
            ..Message::default()
        });
    }

    fn handle_snapshot(&mut self, m: Message) {
        assert!(
            self.role == Role::Follower,
            "only followers install snapshots"
        );
        let snapshot = m.snapshot.expect("a snapshot message carries a snapshot");
        let (index, term) = (snapshot.metadata.index, snapshot.metadata.term);
        let restored = if index <= self.raft_log.committed {
            false
        } else if self.raft_log.match_term(index, term) {
            // We already hold the snapshot's entries: just fast-forward the commit.
            self.raft_log.commit_to(index);
            false
        } else {
            let cs = snapshot.metadata.conf_state.clone();
            self.raft_log.restore(snapshot);
            self.set_conf_state(&cs);
            true
        };
        let index = if restored {
            self.raft_log.last_index()
        } else {
            self.raft_log.committed
        };
        self.send(Message {
            msg_type: MessageType::AppendResponse,
            to: m.from,
            index,
            ..Message::default()
        });
    }

    // -----------------------------------------------------------------------------------------
    // Membership.

    /// Applies a committed configuration change (called by the server when it applies the
    /// ConfChange entry) and returns the new membership.
    pub fn apply_conf_change(&mut self, cc: &ConfChange) -> ConfState {
        let id = cc.node_id;
        assert!(id != 0, "conf change for node 0");
        let next = self.raft_log.last_index() + 1;
        let added = !self.prs.contains_key(&id);
        match cc.change_type {
            ConfChangeType::AddNode => {
                self.learners.remove(&id);
                self.voters.insert(id);
            }
            ConfChangeType::AddLearnerNode => {
                // Demoting a voter is refused at proposal time; a replayed one is a no-op.
                if !self.voters.contains(&id) {
                    self.learners.insert(id);
                }
            }
            ConfChangeType::RemoveNode => {
                self.voters.remove(&id);
                self.learners.remove(&id);
                self.prs.remove(&id);
            }
        }
        if cc.change_type != ConfChangeType::RemoveNode {
            let (inflight_msgs, inflight_bytes) = (self.max_inflight_msgs, self.max_inflight_bytes);
            let pr = self.prs.entry(id).or_insert_with(|| {
                let mut pr = Progress::new(next, inflight_msgs, inflight_bytes);
                // A new member gets a grace period before check-quorum counts it silent.
                pr.recent_active = true;
                pr
            });
            pr.is_learner = self.learners.contains(&id);
        }
        assert!(
            self.voters.is_disjoint(&self.learners),
            "voter and learner sets overlap"
        );
        if self.role == Role::Leader {
            if !self.voters.contains(&self.id) {
                // A removed (or demoted) leader steps down; the rest elect a new one.
                self.become_follower(self.term, 0);
            } else {
                if self
                    .lead_transferee
                    .is_some_and(|t| !self.voters.contains(&t))
                {
                    self.lead_transferee = None;
                }
                if self.maybe_commit() {
                    self.bcast_append();
                }
                if added && id != self.id {
                    self.maybe_send_append(id, true);
                }
            }
        }
        assert!(
            self.prs
                .keys()
                .all(|id| self.voters.contains(id) || self.learners.contains(id)),
            "a tracked member is neither voter nor learner"
        );
        self.conf_state()
    }
}

fn vote_response_type(t: MessageType) -> MessageType {
    match t {
        MessageType::RequestVote => MessageType::RequestVoteResponse,
        MessageType::RequestPreVote => MessageType::RequestPreVoteResponse,
        _ => panic!("not a vote request: {t:?}"),
    }
}
