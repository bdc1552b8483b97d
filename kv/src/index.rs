//! The in-memory ordered index: key -> immutable version list, readable without locks.
//!
//! The map is a crossbeam `SkipMap` keyed by key. Each entry holds an epoch-managed atomic pointer to
//! an immutable `Vec<Version>` sorted by revision. The single writer replaces the whole list
//! copy-on-write (new list, `swap`, `defer_destroy` the old one), so a reader sees either the old or
//! the new list, never a half-written one. Readers filter versions by revision, which is what hides
//! a txn that is still being applied.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use crossbeam_skiplist::SkipMap;

use crate::types::{KeyValue, PrevKv, Revision};
use crate::vlog::SEGMENT_NONE;

/// Whether a version is a value or the tombstone that ends a key's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionKind {
    Put,
    Tombstone,
}

/// One version of one key.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    pub(crate) rev: Revision,
    pub(crate) kind: VersionKind,
    pub(crate) create_revision: i64,
    /// 1 for the first put of a generation; 0 for a tombstone.
    pub(crate) version: i64,
    pub(crate) lease: i64,
    /// The value's whole value-log record (header, key, value), a slice of its segment in
    /// memory or of the segment file's mapping; empty for tombstones and empty values.
    pub(crate) record: Bytes,
    /// The value's length, kept here so bookkeeping (compaction's release) never reads a
    /// mapped record on the raft core.
    pub(crate) value_len: u32,
    /// The value's segment, or `SEGMENT_NONE`.
    pub(crate) segment: u32,
    /// The offset of the value's record in its segment (0 for `SEGMENT_NONE`).
    pub(crate) offset: u32,
}

impl Version {
    /// A put's version whose value is in `record` (see `ValueLog::append`).
    pub(crate) fn value_len(&self) -> usize {
        self.value_len as usize
    }

    /// The value, unchecked: for the writer's own record it just wrote, and for copies whose
    /// reader checks them later.
    pub(crate) fn value_unchecked(&self) -> Bytes {
        if self.record.is_empty() {
            return Bytes::new();
        }
        let start = self.record.len() - self.value_len();
        self.record.slice(start..)
    }

    /// The value, after checking its record's crc. A record that fails it (a damaged disk
    /// under a mapped segment, or memory gone bad) stops the process, naming the segment file
    /// and the record's offset: a member never serves a value it cannot vouch for.
    pub(crate) fn value(&self) -> Bytes {
        if self.record.is_empty() {
            return Bytes::new();
        }
        let r = &self.record;
        let le32 = |at: usize| u32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"));
        let le64 = |at: usize| i64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"));
        // The crc vouches for the bytes; the header must also be this version's record (its
        // revision, and lengths that add up), not another intact one a bad pointer lands on.
        let intact = crc32fast::hash(&r[4..]) == le32(0)
            && le32(8) == self.value_len
            && r.len() == crate::vlog::record_bytes(le32(4) as usize, self.value_len())
            && le64(12) == self.rev.main
            && le64(20) == self.rev.sub;
        assert!(
            intact,
            "value-log segment {:08x}.seg: the record at offset {} fails its crc check (or is not \
             this version's); refusing to serve a damaged value",
            self.segment, self.offset
        );
        self.value_unchecked()
    }

    pub(crate) fn to_key_value(&self, key: &Bytes) -> KeyValue {
        self.key_value_with(key, self.value())
    }

    /// This version as a key's previous state, its value not read (see `PrevKv`).
    pub(crate) fn to_prev_kv(&self, key: &Bytes) -> PrevKv {
        PrevKv::unchecked(
            self.key_value_with(key, self.value_unchecked()),
            self.clone(),
        )
    }

    /// `to_key_value` for a version the writer has just written (its record is in memory and
    /// was made a moment ago: checking it again would only cost time).
    pub(crate) fn fresh_key_value(&self, key: &Bytes) -> KeyValue {
        self.key_value_with(key, self.value_unchecked())
    }

    fn key_value_with(&self, key: &Bytes, value: Bytes) -> KeyValue {
        assert!(
            self.kind == VersionKind::Put,
            "a tombstone has no key-value"
        );
        KeyValue {
            key: key.clone(),
            create_revision: self.create_revision,
            mod_revision: self.rev.main,
            version: self.version,
            value,
            lease: self.lease,
        }
    }

    pub(crate) fn tombstone(rev: Revision) -> Version {
        Version {
            rev,
            kind: VersionKind::Tombstone,
            create_revision: 0,
            version: 0,
            lease: 0,
            record: Bytes::new(),
            value_len: 0,
            segment: SEGMENT_NONE,
            offset: 0,
        }
    }
}

/// The published history of one key.
pub(crate) struct KeyHistory {
    versions: Atomic<Vec<Version>>,
}

impl KeyHistory {
    pub(crate) fn new(versions: Vec<Version>) -> Self {
        KeyHistory {
            versions: Atomic::new(versions),
        }
    }

    /// The current list; valid while `guard` is pinned.
    pub(crate) fn load<'g>(&self, guard: &'g Guard) -> &'g [Version] {
        let shared = self.versions.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (set at construction, only ever swapped for another
        // non-null list) and the list it points to is destroyed only through `defer_destroy`, which
        // waits for every guard pinned before the swap, including `guard`.
        unsafe { shared.deref() }
    }

    /// Publishes a new list. Only the single writer calls this.
    pub(crate) fn replace(&self, versions: Vec<Version>, guard: &Guard) {
        let old = self
            .versions
            .swap(Owned::new(versions), Ordering::AcqRel, guard);
        assert!(!old.is_null(), "a key history always holds a list");
        // SAFETY: `old` is unreachable from the map now; readers that loaded it are pinned and the
        // epoch scheme frees it only after they unpin.
        unsafe { guard.defer_destroy(old) };
    }
}

impl Drop for KeyHistory {
    fn drop(&mut self) {
        let guard = epoch::pin();
        let old = self
            .versions
            .swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: the entry is being dropped, so no new reader can reach `old`; deferring keeps it
            // alive for readers pinned earlier.
            unsafe { guard.defer_destroy(old) };
        }
    }
}

pub(crate) type Index = SkipMap<Bytes, KeyHistory>;

/// The newest version with `rev.main <= at_rev`, if any.
pub(crate) fn version_at(versions: &[Version], at_rev: i64) -> Option<&Version> {
    let n = versions.partition_point(|v| v.rev.main <= at_rev);
    n.checked_sub(1).map(|i| &versions[i])
}

/// The key's live value at `at_rev` (None when absent or deleted).
pub(crate) fn live_at(versions: &[Version], at_rev: i64) -> Option<&Version> {
    version_at(versions, at_rev).filter(|v| v.kind == VersionKind::Put)
}

/// The end bound of a range request, decoded from etcd's `range_end` forms.
pub(crate) enum RangeEnd<'a> {
    Single,
    Unbounded,
    Before(&'a [u8]),
}

pub(crate) fn range_end(range_end: &[u8]) -> RangeEnd<'_> {
    match range_end {
        [] => RangeEnd::Single,
        [0] => RangeEnd::Unbounded,
        end => RangeEnd::Before(end),
    }
}

/// Visits every index entry in the range in ascending key order until `f` returns false.
pub(crate) fn for_each_in_range<F>(index: &Index, key: &[u8], end: &[u8], mut f: F)
where
    F: FnMut(&Bytes, &KeyHistory) -> bool,
{
    use std::ops::Bound;
    match range_end(end) {
        RangeEnd::Single => {
            if let Some(entry) = index.get(key) {
                f(entry.key(), entry.value());
            }
        }
        RangeEnd::Unbounded => {
            for entry in index.range::<[u8], _>((Bound::Included(key), Bound::Unbounded)) {
                if !f(entry.key(), entry.value()) {
                    break;
                }
            }
        }
        RangeEnd::Before(end) => {
            if end <= key {
                return;
            }
            for entry in index.range::<[u8], _>((Bound::Included(key), Bound::Excluded(end))) {
                if !f(entry.key(), entry.value()) {
                    break;
                }
            }
        }
    }
}
