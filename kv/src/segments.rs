//! Where each value-log segment's bytes are, for the writer and for readers on any thread.
//!
//! A version names its value by segment, offset and length, not by a `Bytes` of its own: that
//! is 32 bytes less per version, and a segment whose bytes move (from memory to its mapped
//! file once durable) is one table update here, where it used to be a copy of every version
//! list with a value in that segment.
//!
//! The table is published copy-on-write through an epoch-managed pointer: the writer keeps
//! its own copy, changes it and publishes a clone. A reader loads the table *after* the
//! version list it reads (both under one pinned guard), so every segment a published version
//! names is in it: a segment enters the table before any version that names it is published.
//! A segment leaves the table only one epoch after the last list naming it was replaced
//! (`retire` defers it), so a reader still holding such a list also still finds the segment.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use crossbeam_epoch::{Atomic, Guard, Owned};

use crate::vlog::DurableSegment;

/// The open segment's buffer: the single writer appends records past the published ones,
/// and readers read only records already published (a version naming a record is published
/// after the record is written, with Release, and read with Acquire).
pub(crate) struct OpenSegment {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: the buffer is a plain heap allocation owned by this value. Readers on other threads
// only read published records, which no one writes again; the writer only writes bytes past
// them (see `write_at`).
unsafe impl Send for OpenSegment {}
// SAFETY: as above.
unsafe impl Sync for OpenSegment {}

impl OpenSegment {
    pub(crate) fn with_capacity(capacity: usize) -> Arc<OpenSegment> {
        assert!(capacity > 0, "a segment holds something");
        let mut buffer = std::mem::ManuallyDrop::new(Vec::<u8>::with_capacity(capacity));
        Arc::new(OpenSegment {
            ptr: NonNull::new(buffer.as_mut_ptr()).expect("a Vec's pointer is never null"),
            capacity: buffer.capacity(),
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Copies `bytes` to `at`.
    ///
    /// # Safety
    /// Only the writer calls this, and only for bytes past every record a reader can reach
    /// (none published yet), within the capacity.
    pub(crate) unsafe fn write_at(&self, at: usize, bytes: &[u8]) {
        assert!(
            at.checked_add(bytes.len())
                .is_some_and(|end| end <= self.capacity),
            "a record fits its segment"
        );
        // SAFETY: in bounds (checked above); no reader looks at these bytes yet and the
        // source is another allocation.
        unsafe {
            self.ptr
                .as_ptr()
                .add(at)
                .copy_from_nonoverlapping(bytes.as_ptr(), bytes.len())
        };
    }

    /// The bytes `start..end`, as the writer wrote them.
    ///
    /// # Safety
    /// The range was written and is not written again (a published record, or one the
    /// writer itself has just finished).
    pub(crate) unsafe fn written(&self, start: usize, end: usize) -> &[u8] {
        assert!(start <= end && end <= self.capacity, "within the segment");
        // SAFETY: in bounds; the caller vouches the bytes are written and no longer change.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), end - start) }
    }
}

impl std::fmt::Debug for OpenSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSegment")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Drop for OpenSegment {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `capacity` describe the Vec this buffer was made from; its bytes
        // need no drop.
        drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), 0, self.capacity) });
    }
}

/// Written bytes of an open (or once open) segment, as a `Bytes` owner: its range holds
/// records that are written and never change again.
struct WrittenRange {
    segment: Arc<OpenSegment>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for WrittenRange {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: made only for published records, or for a sealed segment's written prefix.
        unsafe { self.segment.written(self.start, self.end) }
    }
}

/// The written bytes `start..end` of `segment` as `Bytes`, sharing the buffer.
///
/// # Safety
/// As for [`OpenSegment::written`].
pub(crate) unsafe fn written_bytes(segment: &Arc<OpenSegment>, start: usize, end: usize) -> Bytes {
    assert!(
        start <= end && end <= segment.capacity,
        "within the segment"
    );
    Bytes::from_owner(WrittenRange {
        segment: segment.clone(),
        start,
        end,
    })
}

/// Where one segment's bytes are.
#[derive(Clone, Debug)]
pub(crate) enum SegmentBytes {
    /// The open segment: readers take one record at a time.
    Open(Arc<OpenSegment>),
    /// A sealed segment's records in memory.
    Frozen(Bytes),
    /// A durable segment's file, mapped: a read of a page not in memory waits for the disk.
    /// The mark says a value was read from it since the value cache last looked (see
    /// `MappedSegment`); the sizes, fixed since it was sealed, are what a checkpoint that
    /// points into it lists.
    Durable(Bytes, ReadMark, DurableSegment),
}

/// Set by every read of a value in a durable segment: the value cache's clock (in core)
/// clears it, and pages out first the segments nobody read since. A read loads it and stores
/// only when it was clear, so the shared line is written once per segment per look.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReadMark(Arc<AtomicBool>);

impl ReadMark {
    fn mark(&self) {
        if !self.0.load(Ordering::Relaxed) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// A durable segment's mapped file, as the value cache sees it (`Reader::mapped_segments`).
#[derive(Debug)]
pub struct MappedSegment {
    pub id: u32,
    /// The whole mapping; it stays mapped while this is held.
    pub file: Bytes,
    read: ReadMark,
}

impl MappedSegment {
    /// Whether a value was read from this segment since the last call (or since it became
    /// durable), clearing the mark.
    pub fn take_read(&self) -> bool {
        self.read.0.swap(false, Ordering::Relaxed)
    }
}

impl SegmentBytes {
    /// The record `offset..offset + len`, which a published version names; `read` marks a
    /// durable segment as read (for the value cache), as a read of its value does and a
    /// write's look at the version it replaces does not.
    fn record(&self, offset: usize, len: usize, read: bool) -> Bytes {
        let end = offset.checked_add(len).expect("a record's end fits");
        match self {
            SegmentBytes::Open(segment) => {
                // SAFETY: a published version's record is written and never changes.
                unsafe { written_bytes(segment, offset, end) }
            }
            SegmentBytes::Frozen(bytes) => {
                assert!(end <= bytes.len(), "a record ends within its segment");
                bytes.slice(offset..end)
            }
            SegmentBytes::Durable(file, mark, _) => {
                assert!(end <= file.len(), "a record ends within its segment");
                if read {
                    mark.mark();
                }
                file.slice(offset..end)
            }
        }
    }

    /// Whether a read of these bytes may wait for the disk (see `Unchecked`).
    fn on_disk(&self) -> bool {
        matches!(self, SegmentBytes::Durable(..))
    }
}

/// The segments by id, ascending.
#[derive(Clone, Default, Debug)]
pub(crate) struct SegmentTable {
    slots: Vec<(u32, SegmentBytes)>,
}

impl SegmentTable {
    fn position(&self, id: u32) -> Result<usize, usize> {
        self.slots.binary_search_by_key(&id, |(slot, _)| *slot)
    }

    pub(crate) fn get(&self, id: u32) -> Option<&SegmentBytes> {
        self.position(id).ok().map(|at| &self.slots[at].1)
    }

    /// Segment `id` as a checkpoint lists it, if its file is durable: a checkpoint may then
    /// point into it, whether or not it was durable when the checkpoint was captured.
    pub(crate) fn durable(&self, id: u32) -> Option<DurableSegment> {
        match self.get(id) {
            Some(SegmentBytes::Durable(_, _, sizes)) => Some(*sizes),
            _ => None,
        }
    }

    /// The durable segments' mapped files, ascending.
    pub(crate) fn mapped(&self) -> Vec<MappedSegment> {
        self.slots
            .iter()
            .filter_map(|(id, bytes)| match bytes {
                SegmentBytes::Durable(file, read, _) => Some(MappedSegment {
                    id: *id,
                    file: file.clone(),
                    read: read.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// The record of `len` bytes at `offset` in segment `id`; every published version's
    /// segment is here (see the module's description), so a miss is a broken invariant.
    pub(crate) fn record(&self, id: u32, offset: u32, len: usize) -> Bytes {
        self.record_placed(id, offset, len, false).0
    }

    /// `record`, and whether it lies in a durable segment's mapped file, whose pages may be
    /// on disk rather than in memory; `read` marks the segment as read (see `ReadMark`).
    pub(crate) fn record_placed(
        &self,
        id: u32,
        offset: u32,
        len: usize,
        read: bool,
    ) -> (Bytes, bool) {
        let segment = self.get(id).unwrap_or_else(|| {
            panic!("value-log segment {id:08x}.seg is named by a version but not in the table")
        });
        (
            segment.record(offset as usize, len, read),
            segment.on_disk(),
        )
    }
}

/// The published table and the segments waiting to leave it.
#[derive(Debug)]
pub(crate) struct SharedSegments {
    table: Atomic<SegmentTable>,
    /// Segments whose last version list was replaced an epoch ago (filled by deferred
    /// functions, drained by the writer). Bounded by the number of segments: each id enters
    /// once.
    retired: Arc<Mutex<Vec<u32>>>,
}

impl SharedSegments {
    pub(crate) fn new() -> Self {
        SharedSegments {
            table: Atomic::new(SegmentTable::default()),
            retired: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The current table; valid while `guard` is pinned. Load it after the version lists
    /// whose values it resolves.
    pub(crate) fn load<'g>(&self, guard: &'g Guard) -> &'g SegmentTable {
        let shared = self.table.load(Ordering::Acquire, guard);
        // SAFETY: never null (set at construction, only swapped for another non-null table),
        // and an old table is destroyed only through `defer_destroy`, after every guard
        // pinned before the swap (this one included) is gone.
        unsafe { shared.deref() }
    }

    fn publish(&self, table: SegmentTable, guard: &Guard) {
        let old = self.table.swap(Owned::new(table), Ordering::AcqRel, guard);
        assert!(!old.is_null(), "the table is always there");
        // SAFETY: unreachable from here on; readers that loaded it are pinned, and the
        // epoch scheme frees it only after they unpin.
        unsafe { guard.defer_destroy(old) };
    }
}

impl Drop for SharedSegments {
    fn drop(&mut self) {
        let guard = crossbeam_epoch::pin();
        let old = self
            .table
            .swap(crossbeam_epoch::Shared::null(), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: nothing new can reach it; readers pinned earlier keep it alive.
            unsafe { guard.defer_destroy(old) };
        }
    }
}

/// The writer's side: its own copy of the table, published by `publish` after changes.
#[derive(Debug)]
pub(crate) struct SegmentsWriter {
    shared: Arc<SharedSegments>,
    own: SegmentTable,
}

impl SegmentsWriter {
    pub(crate) fn new(shared: Arc<SharedSegments>) -> Self {
        SegmentsWriter {
            shared,
            own: SegmentTable::default(),
        }
    }

    /// The writer's copy: what readers see after the next `publish`.
    pub(crate) fn table(&self) -> &SegmentTable {
        &self.own
    }

    /// Adds segment `id`, or replaces its bytes (sealed, or durable in its mapped file). Takes
    /// effect for readers at the next `publish`.
    pub(crate) fn set(&mut self, id: u32, bytes: SegmentBytes) {
        match self.own.position(id) {
            Ok(at) => self.own.slots[at].1 = bytes,
            Err(at) => self.own.slots.insert(at, (id, bytes)),
        }
    }

    /// Publishes the writer's copy. Call it before publishing any version that names a
    /// segment `set` added since the last call.
    pub(crate) fn publish(&self) {
        self.shared
            .publish(self.own.clone(), &crossbeam_epoch::pin());
    }

    /// Segment `id` leaves the table one epoch from now: no version list published after
    /// this call names it, and readers pinned now may still hold one that does.
    pub(crate) fn retire(&mut self, id: u32) {
        let retired = self.shared.retired.clone();
        let guard = crossbeam_epoch::pin();
        guard.defer(move || {
            retired
                .lock()
                .expect("the retired list's lock is never poisoned")
                .push(id)
        });
        guard.flush();
    }

    /// Drops the segments retired an epoch ago from the writer's copy (readers see it at the
    /// next `publish`); cheap when there are none.
    pub(crate) fn drain_retired(&mut self) {
        let ids = std::mem::take(
            &mut *self
                .shared
                .retired
                .lock()
                .expect("the retired list's lock is never poisoned"),
        );
        if ids.is_empty() {
            return;
        }
        self.own.slots.retain(|(id, _)| !ids.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment retired while a reader is pinned stays in every table that reader loads,
    /// however often the writer drains and publishes meanwhile; once the reader unpins, it
    /// leaves.
    #[test]
    fn a_retired_segment_stays_until_the_readers_pinned_before_are_gone() {
        let shared = Arc::new(SharedSegments::new());
        let mut writer = SegmentsWriter::new(shared.clone());
        writer.set(7, SegmentBytes::Frozen(Bytes::from_static(b"seven")));
        writer.set(8, SegmentBytes::Frozen(Bytes::from_static(b"eight")));
        writer.publish();
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (check_tx, check_rx) = std::sync::mpsc::channel::<()>();
        let reader = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let guard = crossbeam_epoch::pin();
                pinned_tx.send(()).unwrap();
                check_rx.recv().unwrap();
                let table = shared.load(&guard);
                table.record(7, 1, 3)
            })
        };
        pinned_rx.recv().unwrap();
        writer.retire(7);
        for _ in 0..1000 {
            crossbeam_epoch::pin().flush();
            writer.drain_retired();
            writer.publish();
        }
        assert!(writer.table().get(7).is_some(), "retired too early");
        check_tx.send(()).unwrap();
        assert_eq!(reader.join().unwrap(), Bytes::from_static(b"eve"));
        let mut gone = false;
        for _ in 0..100_000 {
            crossbeam_epoch::pin().flush();
            writer.drain_retired();
            if writer.table().get(7).is_none() {
                gone = true;
                break;
            }
        }
        assert!(gone, "the retired segment never left");
        assert!(writer.table().get(8).is_some(), "only the retired one left");
    }

    /// A record taken from the open segment keeps its bytes after the segment is sealed,
    /// replaced in the table and its buffer dropped by the writer.
    #[test]
    fn a_record_read_from_the_open_segment_outlives_it() {
        let open = OpenSegment::with_capacity(64);
        // SAFETY: nothing reads the buffer yet.
        unsafe { open.write_at(0, b"hello world") };
        let segment = SegmentBytes::Open(open.clone());
        let record = segment.record(6, 5, true);
        // SAFETY: past the record handed out.
        unsafe { open.write_at(11, b"!!!") };
        drop(segment);
        drop(open);
        assert_eq!(record, Bytes::from_static(b"world"));
    }
}
