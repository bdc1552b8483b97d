//! The log storage trait and `MemStorage`, the in-memory image of what is durable.
//!
//! The storage holds only what the server has reported persisted: `RawNode::advance` writes
//! into it after the server's WAL write of that Ready completed. Raft reads from it; the unstable
//! tail lives in `RaftLog` until then.

use crate::error::{Error, Result};
use crate::types::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use bytes::Bytes;

/// What a node restarts from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RaftState {
    /// Durable term, vote and commit.
    pub hard_state: HardState,
    /// Membership as of the last applied configuration change the server persisted.
    pub conf_state: ConfState,
}

/// Durable log storage. Read side used by raft at any time; write side called only by
/// `RawNode::advance`, after the server has made the corresponding Ready durable.
pub trait Storage {
    /// Hard state and membership to restart from.
    fn initial_state(&self) -> RaftState;
    /// Entries in `[lo, hi)`, at most `max_bytes` in total but always at least one entry if
    /// the range is non-empty. `Err(Compacted)` if `lo` is behind the first index,
    /// `Err(Unavailable)` if `hi` is past the last index plus one.
    fn entries(&self, lo: u64, hi: u64, max_bytes: u64) -> Result<Vec<Entry>>;
    /// Term of the entry at `index`; valid for `first_index() - 1 ..= last_index()`.
    fn term(&self, index: u64) -> Result<u64>;
    /// Index of the first entry still held (the snapshot's index plus one).
    fn first_index(&self) -> u64;
    /// Index of the last entry held (the snapshot's index when the log is empty).
    fn last_index(&self) -> u64;
    /// The latest snapshot, to send to a follower too far behind.
    fn snapshot(&self) -> Result<Snapshot>;
    /// Appends entries that are now durable; an entry at an index already held replaces it
    /// and everything after it (a follower's log repair).
    fn append(&mut self, entries: &[Entry]);
    /// Records the durable hard state.
    fn set_hard_state(&mut self, hard_state: HardState);
    /// Replaces the whole log with a durable snapshot received from the leader.
    fn apply_snapshot(&mut self, snapshot: Snapshot);
}

/// In-memory storage for tests, the simulator and the server (which restores it from its WAL).
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    /// Entries after `snapshot.metadata.index`, contiguous.
    entries: Vec<Entry>,
}

impl MemStorage {
    /// Empty storage with no members (a node that joins an existing cluster).
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// Storage for a brand-new cluster whose initial voters are `voters`: the membership is a
    /// snapshot at index 1, term 1, so a member that joins later learns it from that snapshot
    /// (it is not in the log, which starts at index 2).
    pub fn new_with_voters(voters: &[u64]) -> MemStorage {
        assert!(!voters.is_empty(), "a new cluster needs at least one voter");
        let mut v = voters.to_vec();
        v.sort_unstable();
        v.dedup();
        let conf_state = ConfState {
            voters: v,
            learners: Vec::new(),
        };
        MemStorage {
            hard_state: HardState {
                term: 1,
                vote: 0,
                commit: 1,
            },
            conf_state: conf_state.clone(),
            snapshot: Snapshot {
                metadata: SnapshotMetadata {
                    conf_state,
                    index: 1,
                    term: 1,
                },
                data: Bytes::new(),
            },
            entries: Vec::new(),
        }
    }

    /// Records the membership the server applied (persisted by the server beside its state).
    pub fn set_conf_state(&mut self, conf_state: ConfState) {
        self.conf_state = conf_state;
    }

    /// The durable hard state.
    pub fn hard_state(&self) -> HardState {
        self.hard_state
    }

    /// Makes a snapshot at `index` (already applied by the server, hence committed; the durable
    /// commit may lag it, since commit-only hard states are written without sync) with the
    /// given state, so it can be handed to followers. Does not drop entries: see `compact`.
    pub fn create_snapshot(
        &mut self,
        index: u64,
        conf_state: ConfState,
        data: Bytes,
    ) -> Result<()> {
        if index <= self.snapshot.metadata.index {
            return Err(Error::Compacted);
        }
        assert!(index <= self.last_index(), "snapshot beyond the last index");
        let term = self.term(index)?;
        self.snapshot = Snapshot {
            metadata: SnapshotMetadata {
                conf_state,
                index,
                term,
            },
            data,
        };
        Ok(())
    }

    /// Replaces the data of the snapshot at `index` with another encoding of the same state
    /// (a follower renames the files a leader's snapshot points into and keeps the data that
    /// names them so). The metadata stays.
    pub fn replace_snapshot_data(&mut self, index: u64, data: Bytes) {
        assert_eq!(
            self.snapshot.metadata.index, index,
            "only the snapshot storage holds can be re-encoded"
        );
        self.snapshot.data = data;
    }

    /// Takes every entry up to and including `index`, which must be covered by the snapshot,
    /// out of the log and hands them back, for the caller to free where it likes: a server
    /// compacts behind each checkpoint, 100,000s of entries each holding a request, and
    /// freeing them in place took its raft loop 12-45 ms per checkpoint in a 4 GiB load
    /// (since, a server's entries share a buffer per Ready, which makes it fewer frees).
    pub fn compact(&mut self, index: u64) -> Result<Vec<Entry>> {
        let snap_index = self.snapshot.metadata.index;
        assert!(
            index <= snap_index,
            "compact({index}) beyond the snapshot at {snap_index}"
        );
        let offset = self.offset();
        if index < offset {
            return Err(Error::Compacted);
        }
        let drop = ((index + 1 - offset) as usize).min(self.entries.len());
        // The entries kept (a short tail) move to a vector as large as the old one, so the
        // log does not grow again from small; the compacted ones keep the old allocation.
        let mut kept = Vec::with_capacity(self.entries.capacity());
        kept.extend(self.entries.drain(drop..));
        let compacted = std::mem::replace(&mut self.entries, kept);
        assert!(self.entries.first().is_none_or(|e| e.index == index + 1));
        assert!(compacted.last().is_none_or(|e| e.index == index));
        Ok(compacted)
    }

    /// Index of `entries[0]` (when present).
    fn offset(&self) -> u64 {
        self.entries
            .first()
            .map_or(self.snapshot.metadata.index + 1, |e| e.index)
    }
}

impl Storage for MemStorage {
    fn initial_state(&self) -> RaftState {
        RaftState {
            hard_state: self.hard_state,
            conf_state: self.conf_state.clone(),
        }
    }

    fn entries(&self, lo: u64, hi: u64, max_bytes: u64) -> Result<Vec<Entry>> {
        assert!(lo <= hi, "entries({lo}, {hi}): inverted range");
        if lo < self.first_index() {
            return Err(Error::Compacted);
        }
        if hi > self.last_index() + 1 {
            return Err(Error::Unavailable);
        }
        let offset = self.offset();
        let slice = &self.entries[(lo - offset) as usize..(hi - offset) as usize];
        Ok(limit_size(slice, max_bytes))
    }

    fn term(&self, index: u64) -> Result<u64> {
        let snap = &self.snapshot.metadata;
        if index == snap.index {
            return Ok(snap.term);
        }
        if index < self.first_index() {
            return Err(Error::Compacted);
        }
        if index > self.last_index() {
            return Err(Error::Unavailable);
        }
        Ok(self.entries[(index - self.offset()) as usize].term)
    }

    fn first_index(&self) -> u64 {
        self.offset()
    }

    fn last_index(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot.metadata.index, |e| e.index)
    }

    fn snapshot(&self) -> Result<Snapshot> {
        if self.snapshot.is_empty() {
            return Err(Error::SnapshotTemporarilyUnavailable);
        }
        Ok(self.snapshot.clone())
    }

    fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        assert!(
            first.index <= self.last_index() + 1,
            "append at {} leaves a gap after {}",
            first.index,
            self.last_index()
        );
        // Entries already covered by the snapshot are durable by definition; skip them.
        let skip = entries
            .iter()
            .take_while(|e| e.index < self.first_index())
            .count();
        let entries = &entries[skip..];
        let Some(first) = entries.first() else { return };
        let keep = (first.index - self.offset()) as usize;
        self.entries.truncate(keep);
        // Contiguity is checked where it can break: across the join and inside the new
        // entries. Checking the whole log made every append O(log length).
        let from = keep.saturating_sub(1);
        self.entries.extend_from_slice(entries);
        assert!(self.entries[from..]
            .windows(2)
            .all(|w| w[0].index + 1 == w[1].index));
    }

    fn set_hard_state(&mut self, hard_state: HardState) {
        assert!(
            hard_state.term >= self.hard_state.term,
            "durable term went backwards"
        );
        self.hard_state = hard_state;
    }

    fn apply_snapshot(&mut self, snapshot: Snapshot) {
        assert!(
            snapshot.metadata.index >= self.snapshot.metadata.index,
            "applying an older snapshot"
        );
        self.conf_state = snapshot.metadata.conf_state.clone();
        self.hard_state.commit = self.hard_state.commit.max(snapshot.metadata.index);
        self.hard_state.term = self.hard_state.term.max(snapshot.metadata.term);
        self.entries.clear();
        self.snapshot = snapshot;
    }
}

/// The longest prefix of `entries` within `max_bytes`, but never fewer than one entry.
pub(crate) fn limit_size(entries: &[Entry], max_bytes: u64) -> Vec<Entry> {
    let mut total = 0u64;
    let mut n = 0;
    for e in entries {
        total += e.size_bytes();
        if n > 0 && total > max_bytes {
            break;
        }
        n += 1;
    }
    entries[..n].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    #[test]
    fn append_truncates_conflicts_and_compact_keeps_terms() {
        let mut s = MemStorage::new();
        s.append(&[ent(1, 1), ent(2, 1), ent(3, 1)]);
        s.append(&[ent(3, 2), ent(4, 2)]);
        assert_eq!(s.last_index(), 4);
        assert_eq!(s.term(3), Ok(2));
        s.set_hard_state(HardState {
            term: 2,
            vote: 1,
            commit: 3,
        });
        s.create_snapshot(2, ConfState::default(), Bytes::new())
            .expect("index 2 is committed");
        let compacted = s.compact(2).expect("covered by the snapshot");
        assert_eq!(
            compacted,
            vec![ent(1, 1), ent(2, 1)],
            "the entries taken out"
        );
        assert_eq!(s.first_index(), 3);
        assert_eq!(s.term(2), Ok(1));
        assert_eq!(s.term(1), Err(Error::Compacted));
        assert_eq!(s.entries(2, 4, u64::MAX), Err(Error::Compacted));
        assert_eq!(s.entries(3, 6, u64::MAX), Err(Error::Unavailable));
        assert_eq!(
            s.entries(3, 5, 0).expect("in range").len(),
            1,
            "at least one entry"
        );
        assert_eq!(s.compact(1), Err(Error::Compacted));
    }
}
