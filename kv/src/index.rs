//! The in-memory ordered index: key -> immutable version list, readable without locks.
//!
//! The map is a crossbeam `SkipMap` keyed by key. Each entry holds an epoch-managed atomic pointer to
//! a [`KeyHistory`] chunk: a buffer of versions sorted by revision and the count of them that are
//! published. The single writer appends a new version in place (it writes the slot past the
//! published ones, then publishes the count), so a put costs the same however long the key's
//! history is; when the buffer is full it moves the list to one twice as large. Any other change
//! (compaction dropping old versions, a segment's records moving to their file) replaces the whole
//! list copy-on-write (new chunk, `swap`, `defer_destroy` the old one). Either way a reader sees a
//! whole list, never a half-written version. Readers filter versions by revision, which is what
//! hides a txn that is still being applied.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use crossbeam_skiplist::SkipMap;

use crate::segments::SegmentTable;
use crate::types::{KeyValue, PrevKv, Revision};
use crate::vlog::SEGMENT_NONE;

/// Whether a version is a value or the tombstone that ends a key's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionKind {
    Put,
    Tombstone,
}

/// One version of one key: 48 bytes, the largest part of the index's budget (see
/// `kv/tests/memory.rs`), so the revision's sub part and the kind share one word.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    /// The revision's main part.
    main: i64,
    pub(crate) create_revision: i64,
    /// 1 for the first put of a generation; 0 for a tombstone.
    pub(crate) version: i64,
    pub(crate) lease: i64,
    /// The revision's sub part (below `SUB_LIMIT`), and `TOMBSTONE_BIT` for a tombstone.
    sub_and_kind: u32,
    /// The value's length (0 for tombstones and empty values, which take no log space).
    pub(crate) value_len: u32,
    /// The value's segment, or `SEGMENT_NONE`: where its record is, through the segment table.
    pub(crate) segment: u32,
    /// The offset of the value's record in its segment (0 for `SEGMENT_NONE`).
    pub(crate) offset: u32,
}

const _: () = assert!(std::mem::size_of::<Version>() == 48);

/// Marks a tombstone in `Version::sub_and_kind`.
const TOMBSTONE_BIT: u32 = 1 << 31;

/// Sub revisions a version can hold: one txn writing more than 2^31 keys cannot be built in
/// memory, let alone pass the request size limit, but the check stays on in release builds.
pub(crate) const SUB_LIMIT: i64 = TOMBSTONE_BIT as i64;

impl Version {
    /// A put of a value placed at `offset` of `segment` (`SEGMENT_NONE` for an empty value).
    pub(crate) fn put(
        rev: Revision,
        create_revision: i64,
        version: i64,
        lease: i64,
        value_len: u32,
        segment: u32,
        offset: u32,
    ) -> Version {
        Version {
            main: rev.main,
            create_revision,
            version,
            lease,
            sub_and_kind: Self::sub_bits(rev.sub),
            value_len,
            segment,
            offset,
        }
    }

    pub(crate) fn tombstone(rev: Revision) -> Version {
        Version {
            main: rev.main,
            create_revision: 0,
            version: 0,
            lease: 0,
            sub_and_kind: Self::sub_bits(rev.sub) | TOMBSTONE_BIT,
            value_len: 0,
            segment: SEGMENT_NONE,
            offset: 0,
        }
    }

    fn sub_bits(sub: i64) -> u32 {
        assert!(
            (0..SUB_LIMIT).contains(&sub),
            "a sub revision of {sub} is outside what a version holds"
        );
        sub as u32
    }

    pub(crate) fn rev(&self) -> Revision {
        Revision {
            main: self.main,
            sub: i64::from(self.sub_and_kind & !TOMBSTONE_BIT),
        }
    }

    /// The revision's main part (what most comparisons need).
    pub(crate) fn main(&self) -> i64 {
        self.main
    }

    pub(crate) fn kind(&self) -> VersionKind {
        if self.sub_and_kind & TOMBSTONE_BIT != 0 {
            VersionKind::Tombstone
        } else {
            VersionKind::Put
        }
    }

    /// Places this put's value (restore: an inline value goes into the value log).
    pub(crate) fn place(&mut self, value_len: u32, segment: u32, offset: u32) {
        self.value_len = value_len;
        self.segment = segment;
        self.offset = offset;
    }

    pub(crate) fn value_len(&self) -> usize {
        self.value_len as usize
    }

    /// The bytes the value's record takes in its segment (0 when it has none).
    pub(crate) fn record_len(&self, key: &[u8]) -> usize {
        if self.segment == SEGMENT_NONE {
            return 0;
        }
        crate::vlog::record_bytes(key.len(), self.value_len())
    }

    /// The value's whole record (header, key, value), a slice of its segment as `segments`
    /// holds it; empty for tombstones and empty values. Load `segments` after the list this
    /// version is in (see `segments.rs`).
    pub(crate) fn record(&self, key: &[u8], segments: &SegmentTable) -> Bytes {
        if self.segment == SEGMENT_NONE {
            return Bytes::new();
        }
        segments.record(self.segment, self.offset, self.record_len(key))
    }

    /// The value's whole record (as `record`) and whether it lies in a durable segment's
    /// mapped file, whose pages may be on disk; `read` marks that segment as read for the
    /// value cache (a read of the value, not a write's look at what it replaces).
    fn record_placed(&self, key: &[u8], segments: &SegmentTable, read: bool) -> (Bytes, bool) {
        if self.segment == SEGMENT_NONE {
            return (Bytes::new(), false);
        }
        segments.record_placed(self.segment, self.offset, self.record_len(key), read)
    }

    /// This version's record when it lies in a durable segment's mapped file (whose pages
    /// may be on disk), unread: a value about to be read.
    pub(crate) fn record_on_disk(&self, key: &[u8], segments: &SegmentTable) -> Option<Bytes> {
        let (record, on_disk) = self.record_placed(key, segments, true);
        on_disk.then_some(record)
    }

    /// The value in `record` (this version's, from `record`), unchecked.
    fn value_in(&self, record: &Bytes) -> Bytes {
        if record.is_empty() {
            return Bytes::new();
        }
        record.slice(record.len() - self.value_len()..)
    }

    /// Checks that `record` is this version's and intact. A record that fails (a damaged disk
    /// under a mapped segment, or memory gone bad) stops the process, naming the segment file
    /// and the record's offset: a member never serves a value it cannot vouch for.
    pub(crate) fn check_record(&self, record: &[u8]) {
        if record.is_empty() {
            return;
        }
        // The crc vouches for the bytes; the header must also be this version's record (its
        // revision, and lengths that add up), not another intact one a bad pointer lands on.
        let intact = crate::vlog::record_at(record, 0).is_some_and(|r| {
            r.record_bytes == record.len() && r.value_len == self.value_len && r.rev == self.rev()
        });
        assert!(
            intact,
            "value-log segment {:08x}.seg: the record at offset {} fails its crc check (or is not \
             this version's); refusing to serve a damaged value",
            self.segment, self.offset
        );
    }

    /// The value, unchecked: for the writer's own record it just wrote, and for copies whose
    /// reader checks them later.
    pub(crate) fn value_unchecked(&self, key: &[u8], segments: &SegmentTable) -> Bytes {
        self.value_in(&self.record(key, segments))
    }

    /// The value, after checking its record's crc (see `check_record`), its segment marked
    /// read for the value cache, as a range's read of it marks it: for a compare of values.
    pub(crate) fn value_read(&self, key: &[u8], segments: &SegmentTable) -> Bytes {
        let (record, _) = self.record_placed(key, segments, true);
        self.check_record(&record);
        self.value_in(&record)
    }

    /// The value, after checking its record's crc (see `check_record`).
    pub(crate) fn value(&self, key: &[u8], segments: &SegmentTable) -> Bytes {
        let record = self.record(key, segments);
        self.check_record(&record);
        self.value_in(&record)
    }

    /// This version as a key-value, without reading a value whose record lies in a durable
    /// segment's mapped file (whose pages may be on disk): it is a slice of its record, and the
    /// record's check comes back to be made later (see `Unchecked`). A record in memory is
    /// checked here. `with_value` false (a keys-only answer) leaves the value empty and its
    /// record unread. `key` is copied: a clone of the index's own key would give it a shared
    /// header for as long as it lives (see `Writer::write_put`); keys are small, values are
    /// the ones shared.
    pub(crate) fn to_key_value_unchecked(
        &self,
        key: &[u8],
        segments: &SegmentTable,
        with_value: bool,
    ) -> (KeyValue, Option<RecordCheck>) {
        let mut check = None;
        let value = if with_value && self.segment != SEGMENT_NONE {
            let (record, on_disk) = self.record_placed(key, segments, true);
            let value = self.value_in(&record);
            if on_disk {
                check = Some(RecordCheck {
                    version: self.clone(),
                    record,
                    on_disk,
                });
            } else {
                self.check_record(&record);
            }
            value
        } else {
            Bytes::new()
        };
        (
            self.key_value_with(Bytes::copy_from_slice(key), value),
            check,
        )
    }

    /// This version as a key's previous state, its value not read (see `PrevKv`).
    pub(crate) fn to_prev_kv(&self, key: &[u8], segments: &SegmentTable) -> PrevKv {
        let (record, on_disk) = self.record_placed(key, segments, false);
        PrevKv::unchecked(
            self.key_value_with(Bytes::copy_from_slice(key), self.value_in(&record)),
            RecordCheck {
                version: self.clone(),
                record,
                on_disk,
            },
        )
    }

    /// `to_key_value_unchecked` for a version the writer has just written (its record is in
    /// memory and was made a moment ago: checking it again would only cost time).
    pub(crate) fn fresh_key_value(&self, key: Bytes, segments: &SegmentTable) -> KeyValue {
        let value = self.value_unchecked(&key, segments);
        self.key_value_with(key, value)
    }

    fn key_value_with(&self, key: Bytes, value: Bytes) -> KeyValue {
        assert!(
            self.kind() == VersionKind::Put,
            "a tombstone has no key-value"
        );
        KeyValue {
            key,
            create_revision: self.create_revision,
            mod_revision: self.main,
            version: self.version,
            value,
            lease: self.lease,
        }
    }
}

/// One buffer of a key's versions: `cap` slots at `ptr` (a `Vec`'s allocation), of which the
/// first `len` are written and visible to readers.
struct Chunk {
    ptr: *mut Version,
    cap: usize,
    /// Slots below this are written and never change again while this chunk is published;
    /// the writer alone raises it (Release), after writing the slot.
    len: AtomicUsize,
}

// SAFETY: a chunk owns its versions (as a Vec would). Readers on other threads only read the
// published prefix, which no one writes; the single writer only writes the slot past it.
unsafe impl Send for Chunk {}
// SAFETY: as above; `&Chunk` gives readers the published prefix only.
unsafe impl Sync for Chunk {}

impl Chunk {
    fn new(versions: Vec<Version>) -> Chunk {
        let mut versions = ManuallyDrop::new(versions);
        Chunk {
            ptr: versions.as_mut_ptr(),
            cap: versions.capacity(),
            len: AtomicUsize::new(versions.len()),
        }
    }

    fn published(&self) -> &[Version] {
        let len = self.len.load(Ordering::Acquire);
        // SAFETY: the first `len` slots were written before `len` was published (Release,
        // paired with the Acquire above) and are never written again while the chunk lives.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let len = *self.len.get_mut();
        // SAFETY: `ptr`, `len` and `cap` describe the Vec this chunk was made from, grown only
        // by in-place writes within its capacity.
        drop(unsafe { Vec::from_raw_parts(self.ptr, len, self.cap) });
    }
}

/// Asks the CPU to start loading the cache line at `at` (a hint: nothing is read, and any
/// address may be given).
pub(crate) fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The published history of one key.
pub(crate) struct KeyHistory {
    chunk: Atomic<Chunk>,
}

impl KeyHistory {
    pub(crate) fn new(versions: Vec<Version>) -> Self {
        KeyHistory {
            chunk: Atomic::new(Chunk::new(versions)),
        }
    }

    /// The current list; valid while `guard` is pinned.
    pub(crate) fn load<'g>(&self, guard: &'g Guard) -> &'g [Version] {
        let shared = self.chunk.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (set at construction, only ever swapped for another
        // non-null chunk) and the chunk it points to is destroyed only through `defer_destroy`,
        // which waits for every guard pinned before the swap, including `guard`.
        unsafe { shared.deref() }.published()
    }

    /// Starts loading this history's chunk into the CPU's cache, for a walk that reads it a
    /// few keys from now (see `checkpoint::WalkAhead`).
    pub(crate) fn prefetch_chunk(&self, guard: &Guard) {
        prefetch(self.chunk.load(Ordering::Acquire, guard).as_raw());
    }

    /// Starts loading the first of this history's versions; its chunk should be in the cache
    /// by now (`prefetch_chunk`), or this waits for it.
    pub(crate) fn prefetch_versions(&self, guard: &Guard) {
        let shared = self.chunk.load(Ordering::Acquire, guard);
        // SAFETY: the caller holds this history's index entry, so the history is alive and its
        // pointer is the non-null one `load` relies on (only `drop` nulls it); the chunk is
        // destroyed only through `defer_destroy`, which waits for `guard`.
        prefetch(unsafe { shared.deref() }.ptr);
    }

    /// Starts loading the newest of this history's versions and the slot a push writes
    /// next, which a put reads and writes; its chunk should be in the cache by now
    /// (`prefetch_chunk`), or this waits for it.
    pub(crate) fn prefetch_newest(&self, guard: &Guard) {
        let shared = self.chunk.load(Ordering::Acquire, guard);
        // SAFETY: as in `prefetch_versions`.
        let chunk = unsafe { shared.deref() };
        let len = chunk.len.load(Ordering::Relaxed);
        // From the newest version's first byte to the last byte of the slot after it: a
        // version is 48 bytes, so the two span two or three cache lines. Addresses to
        // prefetch, never dereferenced (hence wrapping_add): the slot after a full buffer lies
        // past it, which is harmless, as a prefetch cannot fault.
        let first = chunk.ptr.wrapping_add(len.saturating_sub(1)).cast::<u8>();
        let end = chunk.ptr.wrapping_add(len + 1).cast::<u8>();
        let mut at = first;
        while at < end {
            prefetch(at);
            at = at.wrapping_add(64);
        }
        prefetch(end.wrapping_sub(1));
    }

    /// Appends `version`, newer than every version in the list. Only the single writer calls
    /// this. In place while the buffer has room; otherwise the list moves to a buffer twice as
    /// large, so appends cost O(1) amortized whatever the history's length.
    pub(crate) fn push(&self, version: Version, guard: &Guard) {
        let shared = self.chunk.load(Ordering::Acquire, guard);
        // SAFETY: as in `load`.
        let chunk = unsafe { shared.deref() };
        // Relaxed: this thread is the only one that changes `len`.
        let len = chunk.len.load(Ordering::Relaxed);
        assert!(
            chunk
                .published()
                .last()
                .is_none_or(|v| v.rev() < version.rev()),
            "revisions ascend"
        );
        if len < chunk.cap {
            // SAFETY: slot `len` is within the allocation, unwritten (above the published
            // prefix), and no reader looks at it until the store below publishes it.
            unsafe { chunk.ptr.add(len).write(version) };
            chunk.len.store(len + 1, Ordering::Release);
            return;
        }
        let mut grown = Vec::with_capacity((len * 2).max(2));
        grown.extend_from_slice(chunk.published());
        grown.push(version);
        self.replace(grown, guard);
    }

    /// Publishes a new list. Only the single writer calls this.
    pub(crate) fn replace(&self, versions: Vec<Version>, guard: &Guard) {
        let old = self
            .chunk
            .swap(Owned::new(Chunk::new(versions)), Ordering::AcqRel, guard);
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
            .chunk
            .swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: the entry is being dropped, so no new reader can reach `old`; deferring keeps it
            // alive for readers pinned earlier.
            unsafe { guard.defer_destroy(old) };
        }
    }
}

/// A key as the index holds it: 16 bytes in the skip-list node and the key's own bytes, where
/// a `Bytes` would take 32 in the node (and a shared header once cloned).
pub(crate) type IndexKey = Box<[u8]>;

pub(crate) type Index = SkipMap<IndexKey, KeyHistory>;

/// The newest version with `rev.main <= at_rev`, if any.
pub(crate) fn version_at(versions: &[Version], at_rev: i64) -> Option<&Version> {
    // Every put and most reads ask for the newest version (at or past the current revision):
    // one look at the list's tail, where a binary search over a long history would touch a
    // cold cache line at each probe (about 5 % of a follower's raft core at 15 versions a key).
    match versions.last() {
        Some(newest) if newest.main <= at_rev => Some(newest),
        _ => {
            let n = versions.partition_point(|v| v.main <= at_rev);
            n.checked_sub(1).map(|i| &versions[i])
        }
    }
}

/// The key's live value at `at_rev` (None when absent or deleted).
pub(crate) fn live_at(versions: &[Version], at_rev: i64) -> Option<&Version> {
    version_at(versions, at_rev).filter(|v| v.kind() == VersionKind::Put)
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
    F: FnMut(&[u8], &KeyHistory) -> bool,
{
    for_each_entry_in_range(index, key, end, |entry| f(entry.key(), entry.value()));
}

/// An index entry: it keeps its node alive (a reference count), so a writer that walked a
/// range can write to each key it found without looking it up again.
pub(crate) type IndexEntry<'a> = crossbeam_skiplist::map::Entry<'a, IndexKey, KeyHistory>;

/// As `for_each_in_range`, handing out the entries themselves.
pub(crate) fn for_each_entry_in_range<'a, F>(index: &'a Index, key: &[u8], end: &[u8], mut f: F)
where
    F: FnMut(IndexEntry<'a>) -> bool,
{
    use std::ops::Bound;
    match range_end(end) {
        RangeEnd::Single => {
            if let Some(entry) = index.get(key) {
                f(entry);
            }
        }
        RangeEnd::Unbounded => {
            for entry in index.range::<[u8], _>((Bound::Included(key), Bound::Unbounded)) {
                if !f(entry) {
                    break;
                }
            }
        }
        RangeEnd::Before(end) => {
            if end <= key {
                return;
            }
            for entry in index.range::<[u8], _>((Bound::Included(key), Bound::Excluded(end))) {
                if !f(entry) {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A put whose value would be `value_len` bytes at `offset` of segment 0.
    fn put(main: i64, value_len: u32, offset: u32) -> Version {
        Version::put(Revision { main, sub: 0 }, 1, main, 0, value_len, 0, offset)
    }

    /// The version at a revision is the newest at or below it, whether the revision is past
    /// the newest (the tail's fast path), inside the history, or before the oldest.
    #[test]
    fn version_at_is_the_newest_at_or_below_the_revision() {
        let mains = [3, 4, 9, 10, 11, 20];
        let versions: Vec<Version> = mains.iter().map(|m| put(*m, 0, 0)).collect();
        for at_rev in 0..=25 {
            let expected = mains.iter().rev().find(|m| **m <= at_rev).copied();
            assert_eq!(
                version_at(&versions, at_rev).map(|v| v.main()),
                expected,
                "at {at_rev}"
            );
        }
        assert!(version_at(&[], 5).is_none());
    }

    /// Appends land in place while the buffer has room, move to a larger buffer when it is
    /// full, and the list reads back whole and in order either way.
    #[test]
    fn appends_in_place_and_grow() {
        let history = KeyHistory::new(vec![put(1, 0, 0)]);
        let guard = epoch::pin();
        for main in 2..=1000 {
            let before = history.load(&guard).as_ptr();
            let had_room = {
                let shared = history.chunk.load(Ordering::Acquire, &guard);
                // SAFETY: non-null, pinned.
                let chunk = unsafe { shared.deref() };
                chunk.len.load(Ordering::Relaxed) < chunk.cap
            };
            history.push(put(main, 0, 0), &guard);
            let list = history.load(&guard);
            assert_eq!(
                had_room,
                list.as_ptr() == before,
                "in place exactly when it fits"
            );
            assert_eq!(list.len(), main as usize);
            assert!(list
                .iter()
                .enumerate()
                .all(|(i, v)| v.main() == i as i64 + 1));
        }
    }

    /// A reader on another thread, while the writer appends, always sees a whole prefix of the
    /// list: ascending revisions, each version fully written, never shrinking.
    #[test]
    fn a_concurrent_reader_sees_whole_prefixes() {
        let history = std::sync::Arc::new(KeyHistory::new(vec![put(1, 1, 1)]));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (history, done) = (history.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                while !done.load(Ordering::Acquire) {
                    let guard = epoch::pin();
                    let list = history.load(&guard);
                    assert!(list.len() >= seen, "the list shrank");
                    seen = list.len();
                    for (i, v) in list.iter().enumerate() {
                        assert_eq!(v.main(), i as i64 + 1);
                        assert_eq!((v.value_len, v.offset), (i as u32 + 1, i as u32 + 1));
                    }
                }
                seen
            })
        };
        for main in 2..=3000i64 {
            let guard = epoch::pin();
            history.push(put(main, main as u32, main as u32), &guard);
        }
        done.store(true, Ordering::Release);
        let seen = reader.join().expect("the reader saw only whole lists");
        assert!(seen <= 3000);
    }
}

/// One record in a durable segment's mapped file that a read handed out a value from
/// without reading it yet: the version that names it, and its bytes (a slice of the
/// segment's mapping, which it keeps alive).
#[derive(Clone, Debug)]
pub(crate) struct RecordCheck {
    version: Version,
    record: Bytes,
    /// Whether `record` lies in a durable segment's mapped file, whose pages may be on disk.
    on_disk: bool,
}

impl RecordCheck {
    /// Checks the record now (see `Version::check_record`).
    pub(crate) fn check(&self) {
        self.version.check_record(&self.record);
    }

    /// The record, when it lies in a durable segment's mapped file.
    pub(crate) fn record_on_disk(&self) -> Option<&Bytes> {
        self.on_disk.then_some(&self.record)
    }

    /// Leaves a record on disk to be checked with its answer (`checks` becomes an
    /// `Unchecked`'s), and checks one in memory now: it cannot wait for the disk.
    pub(crate) fn defer_or_check(self, checks: &mut Vec<RecordCheck>) {
        if self.on_disk {
            checks.push(self);
        } else {
            self.check();
        }
    }
}

/// An answer whose values in durable segments' mapped files were not read yet: each is a
/// slice of its value-log record, and `check` reads and checks every such record (its crc,
/// and that it is the version's, stopping the process on a damaged one, naming file and
/// offset, as any read does) before handing the answer out. Until then `records_on_disk`
/// shows the bytes it will read, so a caller can bring their pages into memory on another
/// thread first, and the thread that serves the answer does not wait for the disk. (Values
/// in memory were checked as they were read: they cannot wait for the disk.)
#[must_use = "the answer's values are served only after `check`"]
#[derive(Debug, Clone)]
pub struct Unchecked<T> {
    answer: T,
    checks: Vec<RecordCheck>,
}

impl<T> Unchecked<T> {
    pub(crate) fn new(answer: T, checks: Vec<RecordCheck>) -> Unchecked<T> {
        Unchecked { answer, checks }
    }

    /// The answer before its values are checked: for what a read needs besides them (how
    /// many key-values a batch holds), never to serve.
    pub(crate) fn unserved(&self) -> &T {
        &self.answer
    }

    /// The records `check` will read (header, key and value), all in durable segments'
    /// mapped files, whose pages may be on disk; each `Bytes` keeps its segment's mapping
    /// alive, so another thread may read them.
    pub fn records_on_disk(&self) -> impl Iterator<Item = &Bytes> + Clone + '_ {
        self.checks.iter().map(|c| &c.record)
    }

    /// Checks every record, then hands out the answer.
    pub fn check(self) -> T {
        for c in &self.checks {
            c.check();
        }
        self.answer
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Unchecked<U> {
        Unchecked {
            answer: f(self.answer),
            checks: self.checks,
        }
    }

    /// The answer, its checks joining `checks` (for an answer made of several reads).
    pub(crate) fn into_parts(self, checks: &mut Vec<RecordCheck>) -> T {
        checks.extend(self.checks);
        self.answer
    }
}

/// Equal when the answers are, whether or not either was checked yet (as `PrevKv`).
impl<T: PartialEq> PartialEq for Unchecked<T> {
    fn eq(&self, other: &Unchecked<T>) -> bool {
        self.answer == other.answer
    }
}

impl<T: Eq> Eq for Unchecked<T> {}
