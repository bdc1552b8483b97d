//! The leader's per-follower replication state and flow control.

use std::collections::VecDeque;

/// How the leader replicates to one follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressState {
    /// Unknown match: send one append per heartbeat interval and wait for the answer.
    Probe,
    /// Known match: stream appends optimistically, limited by the in-flight window.
    Replicate,
    /// A snapshot is on its way; send nothing until it is reported or acknowledged.
    Snapshot,
}

/// Appends sent but not acknowledged: a bounded window in messages and bytes.
#[derive(Debug, Clone)]
pub struct Inflights {
    /// (last index in the message, bytes of its entries), oldest first.
    window: VecDeque<(u64, u64)>,
    bytes: u64,
    count_max: usize,
    bytes_max: u64,
}

impl Inflights {
    pub(crate) fn new(count_max: usize, bytes_max: u64) -> Inflights {
        assert!(
            count_max > 0,
            "the in-flight window must hold at least one message"
        );
        Inflights {
            window: VecDeque::new(),
            bytes: 0,
            count_max,
            bytes_max,
        }
    }

    /// The window is full: no more appends until some are acknowledged.
    pub fn full(&self) -> bool {
        self.window.len() >= self.count_max || self.bytes >= self.bytes_max
    }

    /// Messages in flight.
    pub fn count(&self) -> usize {
        self.window.len()
    }

    fn add(&mut self, last_index: u64, bytes: u64) {
        assert!(!self.full(), "adding to a full in-flight window");
        assert!(
            self.window.back().is_none_or(|(i, _)| *i < last_index),
            "in-flight indexes must grow"
        );
        self.window.push_back((last_index, bytes));
        self.bytes += bytes;
    }

    /// Frees every message whose last index is <= `index`.
    pub(crate) fn free_le(&mut self, index: u64) {
        while let Some(&(i, b)) = self.window.front() {
            if i > index {
                break;
            }
            self.window.pop_front();
            self.bytes -= b;
        }
    }

    /// Frees the oldest message: its ack was probably lost, and the follower is alive.
    pub(crate) fn free_first_one(&mut self) {
        if let Some((_, b)) = self.window.pop_front() {
            self.bytes -= b;
        }
    }

    fn reset(&mut self) {
        self.window.clear();
        self.bytes = 0;
    }
}

/// What the leader knows about one member.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Highest index known replicated on the member.
    pub matched: u64,
    /// Next index to send.
    pub next_idx: u64,
    /// Replication mode.
    pub state: ProgressState,
    /// Index of the snapshot in flight (state Snapshot).
    pub pending_snapshot: u64,
    /// Heard from since the last check-quorum round.
    pub recent_active: bool,
    /// Probe state: an append is outstanding, wait for its answer or the next heartbeat.
    pub probe_sent: bool,
    /// A heartbeat went to the member since the last answer that could unblock the flow to
    /// it: only the first answer to a heartbeat does (see `handle_heartbeat_response`).
    pub heartbeat_unanswered: bool,
    /// Appends in flight (state Replicate).
    pub inflights: Inflights,
    /// The member is a learner (receives the log, does not vote or count toward quorum).
    pub is_learner: bool,
}

impl Progress {
    pub(crate) fn new(
        next_idx: u64,
        inflight_count_max: usize,
        inflight_bytes_max: u64,
    ) -> Progress {
        Progress {
            matched: 0,
            next_idx,
            state: ProgressState::Probe,
            pending_snapshot: 0,
            recent_active: false,
            probe_sent: false,
            heartbeat_unanswered: false,
            inflights: Inflights::new(inflight_count_max, inflight_bytes_max),
            is_learner: false,
        }
    }

    fn reset_state(&mut self, state: ProgressState) {
        self.probe_sent = false;
        self.pending_snapshot = 0;
        self.state = state;
        self.inflights.reset();
    }

    pub(crate) fn become_probe(&mut self) {
        // After a snapshot the follower holds at least the snapshot's index.
        if self.state == ProgressState::Snapshot {
            let pending = self.pending_snapshot;
            self.reset_state(ProgressState::Probe);
            self.next_idx = (self.matched + 1).max(pending + 1);
        } else {
            self.reset_state(ProgressState::Probe);
            self.next_idx = self.matched + 1;
        }
    }

    pub(crate) fn become_replicate(&mut self) {
        self.reset_state(ProgressState::Replicate);
        self.next_idx = self.matched + 1;
    }

    pub(crate) fn become_snapshot(&mut self, snapshot_index: u64) {
        self.reset_state(ProgressState::Snapshot);
        self.pending_snapshot = snapshot_index;
    }

    /// Records an acknowledgement up to `n`; false if it was stale.
    pub(crate) fn maybe_update(&mut self, n: u64) -> bool {
        let updated = self.matched < n;
        if updated {
            self.matched = n;
            self.probe_sent = false;
        }
        self.next_idx = self.next_idx.max(n + 1);
        updated
    }

    /// Records an append of `entries` entries (`bytes` in total) after `prev_index`.
    pub(crate) fn sent_entries(&mut self, prev_index: u64, entries: u64, bytes: u64) {
        match self.state {
            ProgressState::Replicate => {
                if entries > 0 {
                    let last = prev_index + entries;
                    self.next_idx = last + 1;
                    self.inflights.add(last, bytes);
                }
            }
            ProgressState::Probe => self.probe_sent = true,
            ProgressState::Snapshot => panic!("sending entries to a follower in snapshot state"),
        }
    }

    /// Handles a rejection of the append after `rejected`; false if the rejection is stale.
    pub(crate) fn maybe_decr_to(&mut self, rejected: u64, match_hint: u64) -> bool {
        if self.state == ProgressState::Replicate {
            if rejected <= self.matched {
                return false;
            }
            self.next_idx = self.matched + 1;
            return true;
        }
        if self.next_idx == 0 || self.next_idx - 1 != rejected {
            return false;
        }
        self.next_idx = rejected.min(match_hint + 1).max(self.matched + 1);
        self.probe_sent = false;
        true
    }

    /// Nothing may be sent to this member right now.
    pub fn is_paused(&self) -> bool {
        match self.state {
            ProgressState::Probe => self.probe_sent,
            ProgressState::Replicate => self.inflights.full(),
            ProgressState::Snapshot => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflights_limit_count_and_bytes() {
        let mut inf = Inflights::new(3, 100);
        inf.add(1, 10);
        inf.add(2, 10);
        assert!(!inf.full());
        inf.add(3, 10);
        assert!(inf.full(), "count limit");
        inf.free_le(2);
        assert_eq!(inf.count(), 1);
        inf.add(4, 95);
        assert!(inf.full(), "byte limit");
        inf.free_le(4);
        assert_eq!(inf.count(), 0);
        assert!(!inf.full());
    }

    #[test]
    fn probe_rejection_uses_hint_and_ignores_stale() {
        let mut pr = Progress::new(11, 4, 1 << 20);
        pr.matched = 2;
        assert!(!pr.maybe_decr_to(5, 3), "stale: next-1 != rejected");
        assert!(pr.maybe_decr_to(10, 4));
        assert_eq!(pr.next_idx, 5);
        pr.become_replicate();
        assert!(!pr.maybe_decr_to(2, 0), "stale in replicate");
    }
}
