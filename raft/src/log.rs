//! The raft log: durable entries in `Storage` plus the unstable tail not yet persisted.

use crate::error::{Error, Result};
use crate::storage::{limit_size, Storage};
use crate::types::{Entry, Snapshot};

/// Entries (and possibly an incoming snapshot) not yet durable. Entries below `offset` are in
/// storage; those in `[offset, offset_in_progress)` were handed out in a Ready whose persist
/// has not been acknowledged yet.
#[derive(Debug, Default)]
pub(crate) struct Unstable {
    pub(crate) snapshot: Option<Snapshot>,
    pub(crate) snapshot_in_progress: bool,
    pub(crate) entries: Vec<Entry>,
    pub(crate) offset: u64,
    pub(crate) offset_in_progress: u64,
}

impl Unstable {
    fn maybe_last_index(&self) -> Option<u64> {
        match self.entries.last() {
            Some(e) => Some(e.index),
            None => self.snapshot.as_ref().map(|s| s.metadata.index),
        }
    }

    fn maybe_first_index(&self) -> Option<u64> {
        self.snapshot.as_ref().map(|s| s.metadata.index + 1)
    }

    fn maybe_term(&self, index: u64) -> Option<u64> {
        if index < self.offset {
            let s = self.snapshot.as_ref()?;
            return (s.metadata.index == index).then_some(s.metadata.term);
        }
        self.entries
            .get((index - self.offset) as usize)
            .map(|e| e.term)
    }

    /// Entries not yet handed out for persistence.
    pub(crate) fn next_entries(&self) -> &[Entry] {
        let start = (self.offset_in_progress - self.offset) as usize;
        &self.entries[start.min(self.entries.len())..]
    }

    /// The snapshot, if it was not yet handed out for persistence.
    pub(crate) fn next_snapshot(&self) -> Option<&Snapshot> {
        if self.snapshot_in_progress {
            return None;
        }
        self.snapshot.as_ref()
    }

    /// Marks everything currently unstable as handed out.
    pub(crate) fn accept_in_progress(&mut self) {
        if let Some(e) = self.entries.last() {
            self.offset_in_progress = e.index + 1;
        }
        self.snapshot_in_progress = self.snapshot.is_some();
    }

    /// Entries up to `index` are durable, if the entry there still has `term` (a truncation
    /// while the persist was in flight leaves the newer entries unstable).
    pub(crate) fn stable_to(&mut self, index: u64, term: u64) {
        if index < self.offset || self.maybe_term(index) != Some(term) {
            return;
        }
        let n = (index + 1 - self.offset) as usize;
        self.entries.drain(..n);
        self.offset = index + 1;
        self.offset_in_progress = self.offset_in_progress.max(self.offset);
    }

    pub(crate) fn stable_snap_to(&mut self, index: u64) {
        if self
            .snapshot
            .as_ref()
            .is_some_and(|s| s.metadata.index == index)
        {
            self.snapshot = None;
            self.snapshot_in_progress = false;
        }
    }

    fn restore(&mut self, snapshot: Snapshot) {
        self.offset = snapshot.metadata.index + 1;
        self.offset_in_progress = self.offset;
        self.entries.clear();
        self.snapshot = Some(snapshot);
        self.snapshot_in_progress = false;
    }

    fn truncate_and_append(&mut self, ents: &[Entry]) {
        let from = ents[0].index;
        let end = self.offset + self.entries.len() as u64;
        if from == end {
            // Plain append.
        } else if from <= self.offset {
            // The whole unstable tail is replaced.
            self.offset = from;
            self.entries.clear();
        } else {
            self.entries.truncate((from - self.offset) as usize);
        }
        self.offset_in_progress = self.offset_in_progress.min(from).max(self.offset);
        self.entries.extend_from_slice(ents);
    }
}

/// The node's view of the log.
pub struct RaftLog<S: Storage> {
    pub(crate) storage: S,
    pub(crate) unstable: Unstable,
    /// Highest index known committed on a quorum.
    pub committed: u64,
    /// Highest index handed to the application in a Ready.
    pub applying: u64,
    /// Highest index the application has applied (acknowledged through `advance`).
    pub applied: u64,
}

impl<S: Storage> RaftLog<S> {
    pub(crate) fn new(storage: S) -> RaftLog<S> {
        let first = storage.first_index();
        let last = storage.last_index();
        let unstable = Unstable {
            offset: last + 1,
            offset_in_progress: last + 1,
            ..Unstable::default()
        };
        RaftLog {
            storage,
            unstable,
            committed: first - 1,
            applying: first - 1,
            applied: first - 1,
        }
    }

    /// Index of the first entry held.
    pub fn first_index(&self) -> u64 {
        self.unstable
            .maybe_first_index()
            .unwrap_or_else(|| self.storage.first_index())
    }

    /// Index of the last entry held.
    pub fn last_index(&self) -> u64 {
        self.unstable
            .maybe_last_index()
            .unwrap_or_else(|| self.storage.last_index())
    }

    /// Term of the entry at `index` (valid for `first_index() - 1 ..= last_index()`).
    pub fn term(&self, index: u64) -> Result<u64> {
        let dummy = self.first_index() - 1;
        if index < dummy {
            return Err(Error::Compacted);
        }
        if index > self.last_index() {
            return Err(Error::Unavailable);
        }
        match self.unstable.maybe_term(index) {
            Some(t) => Ok(t),
            None => self.storage.term(index),
        }
    }

    /// Term of the last entry.
    pub fn last_term(&self) -> u64 {
        self.term(self.last_index())
            .expect("the last index always has a term")
    }

    pub(crate) fn match_term(&self, index: u64, term: u64) -> bool {
        self.term(index).is_ok_and(|t| t == term)
    }

    /// Highest index whose entry is durable (no entry can be applied before it is).
    pub(crate) fn persisted_last_index(&self) -> u64 {
        self.unstable.offset - 1
    }

    /// Follower append: `Some(last new index)` if the entry at `index` has `log_term`.
    pub(crate) fn maybe_append(
        &mut self,
        index: u64,
        log_term: u64,
        committed: u64,
        ents: &[Entry],
    ) -> Option<u64> {
        if !self.match_term(index, log_term) {
            return None;
        }
        let last_new = index + ents.len() as u64;
        let conflict = self.find_conflict(ents);
        if conflict != 0 {
            assert!(
                conflict > self.committed,
                "entry {conflict} conflicts with committed {}",
                self.committed
            );
            let start = (conflict - (index + 1)) as usize;
            if start == 0 {
                self.append(ents);
            } else {
                // A resent or overlapping append: only its tail is new. A received message's
                // payloads may be slices of the frame it came in (`Message::decode_shared`),
                // and the whole frame would live as long as the few entries kept; copies
                // let it go. Rare (resends), so the copy costs little. (A server's storage
                // then holds slices of its own WAL records instead, at `advance`, but an
                // application that does not share its records keeps what this hands it.)
                let tail: Vec<Entry> = ents[start..]
                    .iter()
                    .map(|e| Entry {
                        data: bytes::Bytes::copy_from_slice(&e.data),
                        ..e.clone()
                    })
                    .collect();
                self.append(&tail);
            }
        }
        self.commit_to(committed.min(last_new));
        Some(last_new)
    }

    /// Appends entries (possibly truncating a conflicting uncommitted tail); returns the last index.
    pub(crate) fn append(&mut self, ents: &[Entry]) -> u64 {
        if ents.is_empty() {
            return self.last_index();
        }
        let after = ents[0].index - 1;
        assert!(
            after >= self.committed,
            "append after {after} would overwrite committed {}",
            self.committed
        );
        self.unstable.truncate_and_append(ents);
        self.last_index()
    }

    /// Index of the first entry in `ents` that is new or conflicts with the log (0: none).
    fn find_conflict(&self, ents: &[Entry]) -> u64 {
        ents.iter()
            .find(|e| !self.match_term(e.index, e.term))
            .map_or(0, |e| e.index)
    }

    /// The largest index <= `index` whose term is <= `term`, and that term (the reject hint).
    pub(crate) fn find_conflict_by_term(&self, mut index: u64, term: u64) -> (u64, u64) {
        loop {
            match self.term(index) {
                Ok(t) if t > term => index -= 1,
                Ok(t) => return (index, t),
                Err(_) => return (index, 0),
            }
        }
    }

    /// Entries in `[lo, hi)` within `max_bytes` (at least one).
    pub(crate) fn slice(&self, lo: u64, hi: u64, max_bytes: u64) -> Result<Vec<Entry>> {
        if lo == hi {
            return Ok(Vec::new());
        }
        assert!(lo < hi, "slice({lo}, {hi}): inverted range");
        if lo < self.first_index() {
            return Err(Error::Compacted);
        }
        assert!(
            hi <= self.last_index() + 1,
            "slice({lo}, {hi}) beyond last index {}",
            self.last_index()
        );
        let mut out = Vec::new();
        let uoff = self.unstable.offset;
        if lo < uoff {
            out = self.storage.entries(lo, hi.min(uoff), max_bytes)?;
            if (out.len() as u64) < hi.min(uoff) - lo {
                return Ok(out); // the size limit cut the storage part short
            }
        }
        if hi > uoff {
            let from = lo.max(uoff);
            let u = &self.unstable.entries[(from - uoff) as usize..(hi - uoff) as usize];
            out.extend_from_slice(u);
        }
        let used: u64 = out.iter().map(Entry::size_bytes).sum();
        if used > max_bytes {
            out = limit_size(&out, max_bytes);
        }
        Ok(out)
    }

    /// Entries from `lo` to the end within `max_bytes`.
    pub(crate) fn entries(&self, lo: u64, max_bytes: u64) -> Result<Vec<Entry>> {
        if lo > self.last_index() {
            return Ok(Vec::new());
        }
        self.slice(lo, self.last_index() + 1, max_bytes)
    }

    pub(crate) fn commit_to(&mut self, commit: u64) {
        if commit > self.committed {
            assert!(
                commit <= self.last_index(),
                "commit {commit} beyond last index {}",
                self.last_index()
            );
            self.committed = commit;
        }
    }

    /// Commits `max_index` if its entry is of `term` (raft only counts current-term entries).
    pub(crate) fn maybe_commit(&mut self, max_index: u64, term: u64) -> bool {
        if max_index > self.committed && self.term(max_index).is_ok_and(|t| t == term) {
            self.commit_to(max_index);
            return true;
        }
        false
    }

    /// Is a candidate with this last entry at least as up to date as us?
    pub(crate) fn is_up_to_date(&self, last_index: u64, term: u64) -> bool {
        term > self.last_term() || (term == self.last_term() && last_index >= self.last_index())
    }

    pub(crate) fn restore(&mut self, snapshot: Snapshot) {
        assert!(
            snapshot.metadata.index > self.committed,
            "restoring a snapshot behind commit"
        );
        self.committed = snapshot.metadata.index;
        self.unstable.restore(snapshot);
    }

    /// The snapshot to send: an unstable one, else storage's.
    pub(crate) fn snapshot(&self) -> Result<Snapshot> {
        match &self.unstable.snapshot {
            Some(s) => Ok(s.clone()),
            None => self.storage.snapshot(),
        }
    }

    /// Committed, durable entries not yet handed to the application, once it has applied
    /// what it was handed before (see `RawNode::advance_append`).
    pub(crate) fn next_committed_entries(&self, max_bytes: u64) -> Vec<Entry> {
        if self.unstable.snapshot.is_some() {
            return Vec::new(); // the snapshot must be installed before anything after it
        }
        if self.applying > self.applied {
            return Vec::new();
        }
        let lo = (self.applying + 1).max(self.first_index());
        let hi = self.committed.min(self.persisted_last_index()) + 1;
        if lo >= hi {
            return Vec::new();
        }
        self.slice(lo, hi, max_bytes)
            .expect("committed durable entries are held")
    }

    pub(crate) fn has_next_committed_entries(&self) -> bool {
        self.unstable.snapshot.is_none()
            && self.applying == self.applied
            && (self.applying + 1).max(self.first_index())
                <= self.committed.min(self.persisted_last_index())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    fn ent(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    fn log_with(terms: &[u64]) -> RaftLog<MemStorage> {
        let mut s = MemStorage::new();
        let ents: Vec<Entry> = terms
            .iter()
            .enumerate()
            .map(|(i, t)| ent(i as u64 + 1, *t))
            .collect();
        s.append(&ents);
        RaftLog::new(s)
    }

    /// An append whose head the log already holds keeps copies of its new tail, so that a
    /// received frame is not kept alive by a few of its entries; a wholly new append keeps
    /// the payloads as they came (slices of their frame). Fails if either is reversed.
    #[test]
    fn an_overlapping_append_keeps_copies_of_its_new_entries() {
        let frame = bytes::Bytes::from(vec![7u8; 64 * 1024]);
        let inside = frame.as_ptr_range();
        let from_frame = |index: u64, at: usize| Entry {
            data: frame.slice(at..at + 10),
            ..ent(index, 1)
        };
        let points_into_frame = |e: &Entry| {
            let r = e.data.as_ptr_range();
            inside.start <= r.start && r.end <= inside.end
        };
        let mut log = log_with(&[1, 1]);
        // Entry 2 is held already: 3 and 4 are new.
        let overlapping = [from_frame(2, 0), from_frame(3, 10), from_frame(4, 20)];
        assert_eq!(log.maybe_append(1, 1, 0, &overlapping), Some(4));
        let kept = &log.unstable.entries;
        assert_eq!(kept.iter().map(|e| e.index).collect::<Vec<_>>(), [3, 4]);
        assert!(kept
            .iter()
            .all(|e| !points_into_frame(e) && e.data == [7u8; 10][..]));
        // Wholly new: no copy.
        assert_eq!(log.maybe_append(4, 1, 0, &[from_frame(5, 30)]), Some(5));
        let last = log.unstable.entries.last().expect("entry 5");
        assert!(last.index == 5 && points_into_frame(last));
    }

    #[test]
    fn conflict_by_term_skips_whole_terms() {
        let log = log_with(&[1, 1, 2, 2, 2, 4, 4]);
        assert_eq!(log.find_conflict_by_term(7, 3), (5, 2));
        assert_eq!(log.find_conflict_by_term(7, 4), (7, 4));
        assert_eq!(log.find_conflict_by_term(5, 1), (2, 1));
        assert_eq!(log.find_conflict_by_term(3, 0), (0, 0));
    }

    #[test]
    fn maybe_append_truncates_only_conflicts_and_bounds_commit() {
        let mut log = log_with(&[1, 1, 1]);
        // A stale duplicate (no conflict) must not truncate anything.
        assert_eq!(log.maybe_append(1, 1, 0, &[ent(2, 1)]), Some(2));
        assert_eq!(log.last_index(), 3);
        // A conflicting tail is replaced and the commit never passes the new entries.
        assert_eq!(log.maybe_append(1, 1, 10, &[ent(2, 2)]), Some(2));
        assert_eq!(log.last_index(), 2);
        assert_eq!(log.committed, 2);
        assert_eq!(
            log.maybe_append(2, 1, 2, &[ent(3, 2)]),
            None,
            "prev term mismatch"
        );
    }

    #[test]
    fn unstable_handout_and_stable_with_truncation_in_flight() {
        let mut log = log_with(&[1]);
        log.append(&[ent(2, 1), ent(3, 1)]);
        assert_eq!(log.unstable.next_entries().len(), 2);
        log.unstable.accept_in_progress();
        assert!(log.unstable.next_entries().is_empty(), "handed out once");
        // A new leader replaces index 3 while the persist of [2, 3] is in flight.
        log.append(&[ent(3, 2)]);
        assert_eq!(log.unstable.next_entries(), &[ent(3, 2)]);
        log.unstable.stable_to(3, 1);
        assert_eq!(
            log.persisted_last_index(),
            1,
            "stale ack for a replaced entry is ignored"
        );
        log.unstable.stable_to(2, 1);
        assert_eq!(log.persisted_last_index(), 2);
        assert_eq!(log.term(3), Ok(2));
    }
}
