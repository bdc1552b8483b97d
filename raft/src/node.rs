//! `RawNode` and `Ready`: the protocol between the pure state machine and the server's loop.
//!
//! The server's loop, for one member or many:
//! 1. `if node.has_ready() { let rd = node.ready(); ... }`
//! 2. write `rd.snapshot`, `rd.entries` and `rd.hard_state` in ONE WAL batch (group commit);
//!    meanwhile send `rd.messages`;
//! 3. after the batch is durable (fdatasync, when `rd.durability` says so) send
//!    `rd.persisted_messages` and call `node.advance()` (or `advance_append()`, then
//!    `advance_apply_to(i)` as step 4 applies);
//! 4. apply `rd.committed_entries` (and install `rd.snapshot`) to the state machine, calling
//!    `node.apply_conf_change` for each ConfChange entry; answer `rd.read_states` once the
//!    applied index reaches their index.
//!
//! Between `ready()` and `advance()` the server may keep calling `propose`, `step`, `tick` and
//! `read_index`: what they produce goes into the next Ready (that is the group-commit batch).
//! `ready()` may not be called again until `advance()`.

use bytes::Bytes;

use crate::config::Config;
use crate::error::Result;
use crate::raft::{Raft, ReadState, SnapshotSent, SnapshotStatus, SoftState};
use crate::storage::Storage;
use crate::types::{ConfChange, ConfState, Entry, EntryType, HardState, Message, Snapshot};

/// Whether the Ready's WAL batch must be fdatasync'ed before `advance()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Entries, a snapshot, the term or the vote changed: sync before the after-persist
    /// messages go out.
    Sync,
    /// Only the commit index changed (or nothing): it is recoverable from peers, so the batch
    /// may be written without waiting for the sync.
    NoSync,
}

/// Everything the server must do for one round, with the ordering rule on each field.
#[derive(Debug, Clone)]
pub struct Ready {
    /// Changed leader or role, if any. Informational; no ordering rule.
    pub soft_state: Option<SoftState>,
    /// Changed term/vote/commit. Persist in the same WAL batch as `entries`, written after
    /// them, BEFORE sending `persisted_messages` or calling `advance()`.
    pub hard_state: Option<HardState>,
    /// A snapshot received from the leader. Persist (WAL) before `advance()`; install into
    /// the state machine before applying any later committed entry. Replaces the whole log.
    pub snapshot: Option<Snapshot>,
    /// Entries to append to the WAL. An entry at an index already written replaces it and
    /// everything after it (log repair). Durable BEFORE `advance()`.
    pub entries: Vec<Entry>,
    /// Messages that may be sent right away, in parallel with the WAL write (the leader's
    /// appends and heartbeats: the leader's own log counts toward quorum only after advance).
    pub messages: Vec<Message>,
    /// Messages that may only be sent AFTER this Ready's batch is durable (append and vote
    /// responses vouch for durable state).
    pub persisted_messages: Vec<Message>,
    /// Committed entries to apply, in order. All are already durable locally, so they may be
    /// applied as soon as they are received (after `snapshot` is installed, if any).
    pub committed_entries: Vec<Entry>,
    /// ReadIndex answers: serve a read with `context` once applied >= `index`.
    pub read_states: Vec<ReadState>,
    /// Whether the batch must be fdatasync'ed before `advance()`.
    pub durability: Durability,
}

/// What `advance()` needs to record what the server made durable.
#[derive(Debug)]
struct InFlight {
    entries: Vec<Entry>,
    hard_state: Option<HardState>,
    snapshot: Option<Snapshot>,
    self_messages: Vec<Message>,
    applying: u64,
}

/// Progress and membership summary for tests, metrics and the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Member id.
    pub id: u64,
    /// Term, vote, commit.
    pub hard_state: HardState,
    /// Leader and role.
    pub soft_state: SoftState,
    /// Applied index (acknowledged by `advance`).
    pub applied: u64,
    /// Last log index.
    pub last_index: u64,
    /// Membership.
    pub conf_state: ConfState,
}

/// A raft member driven by the server: inputs are method calls, outputs come out as `Ready`.
pub struct RawNode<S: Storage> {
    raft: Raft<S>,
    prev_soft_state: SoftState,
    prev_hard_state: HardState,
    in_flight: Option<InFlight>,
    max_apply_bytes: u64,
}

impl<S: Storage> RawNode<S> {
    /// Builds a member on top of durable storage (empty for a brand-new or joining member).
    pub fn new(config: &Config, storage: S) -> Result<RawNode<S>> {
        // Compare against what is durable, so a commit raised on restart (applied ahead of a
        // lost commit-only hard state) is written out again by the first Ready.
        let prev_hard_state = storage.initial_state().hard_state;
        let raft = Raft::new(config, storage)?;
        let prev_soft_state = raft.soft_state();
        Ok(RawNode {
            raft,
            prev_soft_state,
            prev_hard_state,
            in_flight: None,
            max_apply_bytes: config.max_apply_bytes_per_ready,
        })
    }

    /// Read access to the state machine (for status, tests, invariants).
    pub fn raft(&self) -> &Raft<S> {
        &self.raft
    }

    /// The durable storage.
    pub fn store(&self) -> &S {
        &self.raft.raft_log.storage
    }

    /// The durable storage, for compaction and snapshots the server creates.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.raft.raft_log.storage
    }

    /// Advances logical time by one tick.
    pub fn tick(&mut self) {
        self.raft.tick();
    }

    /// Starts an election now (pre-vote first when enabled).
    pub fn campaign(&mut self) {
        self.raft.campaign_now();
    }

    /// Proposes application data. Errors: `ProposalDropped` (no leader, transfer, limits).
    pub fn propose(&mut self, data: Bytes) -> Result<()> {
        self.raft.propose(vec![Entry {
            entry_type: EntryType::Normal,
            data,
            ..Entry::default()
        }])
    }

    /// Proposes several data items as one batch (one append, one WAL write).
    pub fn propose_batch(&mut self, data: Vec<Bytes>) -> Result<()> {
        let entries = data
            .into_iter()
            .map(|data| Entry {
                data,
                ..Entry::default()
            })
            .collect();
        self.raft.propose(entries)
    }

    /// Proposes a membership change. Errors: `ConfChangePending`, `InvalidConfChange`,
    /// `LearnerNotCaughtUp`, `ProposalDropped`.
    pub fn propose_conf_change(&mut self, cc: &ConfChange) -> Result<()> {
        let mut data = Vec::new();
        cc.encode(&mut data);
        self.raft.propose(vec![Entry {
            entry_type: EntryType::ConfChange,
            data: Bytes::from(data),
            ..Entry::default()
        }])
    }

    /// Applies a committed membership change; returns the new membership (persist it with the
    /// state machine).
    pub fn apply_conf_change(&mut self, cc: &ConfChange) -> ConfState {
        self.raft.apply_conf_change(cc)
    }

    /// Requests a linearizable read point; the answer arrives in `Ready::read_states` with the
    /// same context. Errors: `ReadIndexDropped`.
    pub fn read_index(&mut self, context: Bytes) -> Result<()> {
        self.raft.read_index(context)
    }

    /// Asks the leader to hand leadership to `to`.
    pub fn transfer_leader(&mut self, to: u64) {
        self.raft.transfer_leader(to);
    }

    /// Steps a message received from a peer.
    pub fn step(&mut self, m: Message) -> Result<()> {
        self.raft.step(m)
    }

    /// Reports the outcome of sending the snapshot message `sent` (see `SnapshotSent`).
    pub fn report_snapshot(&mut self, sent: SnapshotSent, status: SnapshotStatus) {
        self.raft.report_snapshot(sent, status);
    }

    /// Reports that `to` could not be reached.
    pub fn report_unreachable(&mut self, to: u64) {
        self.raft.report_unreachable(to);
    }

    /// A summary of this member's state.
    pub fn status(&self) -> Status {
        Status {
            id: self.raft.id,
            hard_state: self.raft.hard_state(),
            soft_state: self.raft.soft_state(),
            applied: self.raft.raft_log.applied,
            last_index: self.raft.raft_log.last_index(),
            conf_state: self.raft.conf_state(),
        }
    }

    /// True if `ready()` has something (and no Ready is in flight).
    pub fn has_ready(&self) -> bool {
        if self.in_flight.is_some() {
            return false;
        }
        let r = &self.raft;
        r.soft_state() != self.prev_soft_state
            || r.hard_state() != self.prev_hard_state
            || !r.raft_log.unstable.next_entries().is_empty()
            || r.raft_log.unstable.next_snapshot().is_some()
            || !r.msgs.is_empty()
            || !r.msgs_after_persist.is_empty()
            || !r.read_states.is_empty()
            || r.has_read_queue()
            || r.raft_log.has_next_committed_entries()
    }

    /// Takes the next round of work. Panics if the previous Ready was not advanced.
    pub fn ready(&mut self) -> Ready {
        assert!(
            self.in_flight.is_none(),
            "ready() called again before advance()"
        );
        self.raft.flush_read_queue();
        let r = &mut self.raft;
        let soft = r.soft_state();
        let soft_state = (soft != self.prev_soft_state).then_some(soft);
        self.prev_soft_state = soft;
        let hard = r.hard_state();
        let hard_state = (hard != self.prev_hard_state).then_some(hard);
        let entries = r.raft_log.unstable.next_entries().to_vec();
        let snapshot = r.raft_log.unstable.next_snapshot().cloned();
        r.raft_log.unstable.accept_in_progress();
        let committed_entries = r.raft_log.next_committed_entries(self.max_apply_bytes);
        let mut applying = r.raft_log.applying;
        if let Some(last) = committed_entries.last() {
            assert!(last.index > applying, "committed entries handed out twice");
            applying = last.index;
            r.raft_log.applying = applying;
        }
        r.reduce_uncommitted(&committed_entries);
        let messages = std::mem::take(&mut r.msgs);
        let id = r.id;
        let (self_messages, persisted_messages): (Vec<Message>, Vec<Message>) =
            std::mem::take(&mut r.msgs_after_persist)
                .into_iter()
                .partition(|m| m.to == id);
        let read_states = std::mem::take(&mut r.read_states);
        let term_or_vote_changed = hard_state.is_some_and(|h| {
            h.term != self.prev_hard_state.term || h.vote != self.prev_hard_state.vote
        });
        self.prev_hard_state = hard;
        let durability = if !entries.is_empty() || snapshot.is_some() || term_or_vote_changed {
            Durability::Sync
        } else {
            Durability::NoSync
        };
        self.in_flight = Some(InFlight {
            entries: entries.clone(),
            hard_state,
            snapshot: snapshot.clone(),
            self_messages,
            applying,
        });
        Ready {
            soft_state,
            hard_state,
            snapshot,
            entries,
            messages,
            persisted_messages,
            committed_entries,
            read_states,
            durability,
        }
    }

    /// The bytes of the in-flight Ready's entries, in order, as held elsewhere (the
    /// application's encoding of them for its log, one buffer per Ready): storage keeps these
    /// instead of each entry's own allocation. The server's entries then cost storage a share
    /// of a few buffers each, freed together when compacted, rather than an allocation each
    /// made on the thread that proposed it and freed one by one on another.
    /// `data` names each entry by its index.
    pub fn share_in_flight_entry_data(&mut self, data: impl IntoIterator<Item = (u64, Bytes)>) {
        let f = self
            .in_flight
            .as_mut()
            .expect("share_in_flight_entry_data() without an outstanding ready()");
        let mut data = data.into_iter();
        for entry in f.entries.iter_mut() {
            let (index, bytes) = data.next().expect("one buffer slice per in-flight entry");
            assert_eq!(entry.index, index, "the entries in order");
            assert_eq!(
                entry.data.len(),
                bytes.len(),
                "the same bytes, held elsewhere"
            );
            // The bytes themselves are compared in debug builds only: a comparison of every
            // entry's data would cost a release build a tenth of what sharing saves.
            debug_assert_eq!(entry.data, bytes);
            entry.data = bytes;
        }
        assert!(
            data.next().is_none(),
            "one buffer slice per in-flight entry"
        );
    }

    /// The last Ready is durable and its committed entries are applied: record it in storage
    /// and let the member count its own durable state (own vote, own log).
    pub fn advance(&mut self) {
        self.advance_with(true);
    }

    /// `advance`, for an application that applies committed entries later, or over several
    /// loop turns (a delete of millions of keys): it says how far it got with
    /// `advance_apply_to`. Until everything handed out is applied, no Ready hands out more
    /// committed entries, so the application holds at most one Ready's worth at a time, and
    /// a configuration change not applied yet still stops this node from campaigning.
    pub fn advance_append(&mut self) {
        self.advance_with(false);
    }

    /// The application has applied every committed entry up to `index`.
    pub fn advance_apply_to(&mut self, index: u64) {
        let log = &mut self.raft.raft_log;
        assert!(
            index <= log.applying,
            "applied {index} beyond what was handed out ({})",
            log.applying
        );
        log.applied = log.applied.max(index);
    }

    fn advance_with(&mut self, applied_all: bool) {
        let f = self
            .in_flight
            .take()
            .expect("advance() without an outstanding ready()");
        let log = &mut self.raft.raft_log;
        if let Some(s) = f.snapshot {
            let index = s.metadata.index;
            log.storage.apply_snapshot(s);
            log.unstable.stable_snap_to(index);
            log.applied = log.applied.max(index);
            log.applying = log.applying.max(index);
        }
        if let Some(last) = f.entries.last() {
            let (index, term) = (last.index, last.term);
            log.storage.append(&f.entries);
            log.unstable.stable_to(index, term);
        }
        if let Some(hs) = f.hard_state {
            log.storage.set_hard_state(hs);
        }
        if applied_all {
            log.applied = log.applied.max(f.applying);
        }
        assert!(
            log.applied <= log.committed,
            "applied {} beyond commit {}",
            log.applied,
            log.committed
        );
        for m in f.self_messages {
            // Own acks and votes: stale ones (older term) are ignored by step itself.
            self.raft
                .step(m)
                .expect("stepping our own response cannot fail");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::raft::Role;
    use crate::storage::MemStorage;

    fn single() -> RawNode<MemStorage> {
        RawNode::new(&Config::new(1), MemStorage::new_with_voters(&[1])).expect("valid config")
    }

    /// A lone member that campaigned and holds `data` proposed, its Ready taken.
    fn leader_with_ready_of(data: &'static [u8]) -> (RawNode<MemStorage>, Ready) {
        let mut node = single();
        node.campaign();
        drain(&mut node);
        node.propose(Bytes::from_static(data))
            .expect("leader accepts");
        let rd = node.ready();
        (node, rd)
    }

    /// Runs Ready rounds (persisting everything at once) until nothing is left.
    fn drain(node: &mut RawNode<MemStorage>) -> Vec<Entry> {
        let mut applied = Vec::new();
        for _ in 0..16 {
            if !node.has_ready() {
                return applied;
            }
            let rd = node.ready();
            assert!(
                rd.messages.is_empty() && rd.persisted_messages.is_empty(),
                "no peers"
            );
            node.advance();
            applied.extend(rd.committed_entries);
        }
        panic!("ready rounds did not converge");
    }

    /// Storage keeps the very bytes the application handed over for the in-flight entries;
    /// a slice for another entry, or a count that does not match, is refused.
    #[test]
    fn storage_keeps_the_entry_data_the_application_shares() {
        let (mut node, rd) = leader_with_ready_of(b"x");
        let entry = rd.entries[0].clone();
        // The application's own copy of the bytes, in a buffer of its own.
        let held = Bytes::from(b"..x".to_vec()).slice(2..);
        node.share_in_flight_entry_data(vec![(entry.index, held.clone())]);
        node.advance();
        let stored = node
            .store()
            .entries(entry.index, entry.index + 1, u64::MAX)
            .expect("in the log");
        assert_eq!(stored[0].data, held);
        assert_eq!(stored[0].data.as_ptr(), held.as_ptr(), "the same buffer");

        for bad in [vec![], vec![(entry.index + 1, Bytes::from_static(b"y"))]] {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let (mut node, _) = leader_with_ready_of(b"y");
                node.share_in_flight_entry_data(bad.clone());
            }));
            assert!(result.is_err(), "{bad:?} refused");
        }
    }

    #[test]
    fn refusals_are_typed_errors() {
        let mut node = single();
        assert_eq!(
            node.propose(Bytes::from_static(b"x")),
            Err(Error::ProposalDropped("no leader"))
        );
        assert_eq!(
            node.read_index(Bytes::new()),
            Err(Error::ReadIndexDropped("no leader"))
        );
        let mut bad = Config::new(1);
        bad.election_tick = bad.heartbeat_tick;
        assert!(matches!(
            RawNode::new(&bad, MemStorage::new()),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            RawNode::new(&Config::new(0), MemStorage::new()),
            Err(Error::InvalidConfig(_))
        ));
    }

    #[test]
    fn single_member_commits_after_own_persist_and_reads_at_once() {
        let mut node = single();
        node.campaign();
        drain(&mut node);
        assert_eq!(node.raft().role, Role::Leader);
        node.propose(Bytes::from_static(b"x"))
            .expect("leader accepts");
        let rd = node.ready();
        assert_eq!(rd.entries.len(), 1);
        assert_eq!(rd.durability, Durability::Sync);
        assert!(
            rd.committed_entries.is_empty(),
            "not durable yet, so not committed"
        );
        // Proposals made while the write is in flight form the next batch.
        node.propose(Bytes::from_static(b"y"))
            .expect("leader accepts");
        assert!(!node.has_ready(), "no second Ready before advance");
        node.advance();
        let rd = node.ready();
        assert_eq!(
            rd.committed_entries.len(),
            1,
            "x commits once its persist is acknowledged"
        );
        assert_eq!(rd.entries.len(), 1, "y is the next batch");
        node.advance();
        let applied = drain(&mut node);
        assert_eq!(
            applied.last().map(|e| e.data.clone()),
            Some(Bytes::from_static(b"y"))
        );
        node.read_index(Bytes::from_static(b"r"))
            .expect("leader reads");
        let rd = node.ready();
        assert_eq!(rd.read_states.len(), 1);
        assert_eq!(rd.read_states[0].index, node.raft().raft_log.committed);
        node.advance();
    }

    #[test]
    fn committed_entries_wait_until_the_application_applied_those_handed_out() {
        let mut node = single();
        node.campaign();
        drain(&mut node);
        node.propose(Bytes::from_static(b"x"))
            .expect("leader accepts");
        let _ = node.ready();
        node.advance();
        let rd = node.ready();
        assert_eq!(rd.committed_entries.len(), 1, "x commits");
        let x = rd.committed_entries[0].index;
        node.advance_append();
        assert_eq!(node.status().applied, x - 1, "not applied yet");
        // y commits meanwhile, but is not handed out while x is being applied.
        node.propose(Bytes::from_static(b"y"))
            .expect("leader accepts");
        for _ in 0..3 {
            if !node.has_ready() {
                break;
            }
            let rd = node.ready();
            assert!(rd.committed_entries.is_empty(), "x is still being applied");
            node.advance_append();
        }
        assert_eq!(node.raft().raft_log.committed, x + 1, "y is committed");
        node.advance_apply_to(x);
        assert!(node.has_ready());
        let rd = node.ready();
        assert_eq!(
            rd.committed_entries
                .iter()
                .map(|e| e.data.clone())
                .collect::<Vec<_>>(),
            vec![Bytes::from_static(b"y")]
        );
        node.advance_append();
        node.advance_apply_to(x + 1);
        assert_eq!(node.status().applied, x + 1);
    }

    #[test]
    fn limits_refuse_proposals() {
        let mut cfg = Config::new(1);
        cfg.max_uncommitted_entries_bytes = 8;
        cfg.max_size_per_msg_bytes = 6;
        cfg.max_pending_read_index = 1;
        let mut node = RawNode::new(&cfg, MemStorage::new_with_voters(&[1])).expect("valid config");
        node.campaign();
        let _ = node.ready();
        node.advance();
        assert_eq!(node.raft().role, Role::Leader);
        // Until the new leader's empty entry commits, reads wait; the wait list is bounded.
        node.read_index(Bytes::from_static(b"a"))
            .expect("first read waits");
        assert!(matches!(
            node.read_index(Bytes::from_static(b"b")),
            Err(Error::ReadIndexDropped(_))
        ));
        drain(&mut node);
        assert_eq!(
            node.raft().pending_read_count(),
            0,
            "the waiting read was answered"
        );
        let too_big = Bytes::from_static(b"1234567");
        assert!(matches!(
            node.propose(too_big),
            Err(Error::ProposalDropped(_))
        ));
        node.propose(Bytes::from_static(b"12345"))
            .expect("within limits");
        assert!(matches!(
            node.propose(Bytes::from_static(b"1234")),
            Err(Error::ProposalDropped(_))
        ));
        drain(&mut node);
        node.propose(Bytes::from_static(b"1234"))
            .expect("the committed bytes were released");
    }

    #[test]
    #[should_panic(expected = "ready() called again before advance()")]
    fn ready_twice_without_advance_panics() {
        let mut node = single();
        node.campaign();
        let _ = node.ready();
        let _ = node.ready();
    }
}
