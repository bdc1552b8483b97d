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
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_epoch::{Atomic, Guard, Owned};

use crate::vlog::DurableSegment;

/// The open segment's buffer: the single writer appends records past the published ones,
/// and readers read only records already published (a version naming a record is published
/// after the record is written, with Release, and read with Acquire).
pub(crate) struct OpenSegment {
    ptr: NonNull<u8>,
    capacity: usize,
    /// Of the store's configured size: its buffer serves a later segment once this one is
    /// dropped (a segment made larger for one large record does not).
    reusable: bool,
}

// SAFETY: the buffer is a plain heap allocation owned by this value. Readers on other threads
// only read published records, which no one writes again; the writer only writes bytes past
// them (see `write_at`).
unsafe impl Send for OpenSegment {}
// SAFETY: as above.
unsafe impl Sync for OpenSegment {}

/// Buffers of dropped segments of the store's configured size, kept for the next segments.
/// Measured under a put load, before: a third of the raft core's page faults came from
/// filling fresh segment buffers (BENCHMARKS.md). Why the allocator hands out fresh pages for
/// each 1 MiB segment is not established; a buffer's last reference often drops on another
/// thread (a reader's epoch collection), which may be part of it.
struct SpareBuffers {
    /// How many buffers wait, at most.
    buffers_max: usize,
    /// The largest buffer kept: a store configured with larger segments keeps none.
    buffer_bytes_max: usize,
    /// Each with when it was given: `release_spare_segment_buffers` frees those that waited
    /// long, so an idle member gives the memory back.
    buffers: Mutex<Vec<(Vec<u8>, Instant)>>,
}

impl SpareBuffers {
    const fn new(buffers_max: usize, buffer_bytes_max: usize) -> Self {
        SpareBuffers {
            buffers_max,
            buffer_bytes_max,
            buffers: Mutex::new(Vec::new()),
        }
    }

    /// A spare buffer of exactly `capacity` bytes, if one waits (the newest such).
    fn take(&self, capacity: usize) -> Option<Vec<u8>> {
        if capacity > self.buffer_bytes_max {
            return None;
        }
        let mut buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let at = buffers
            .iter()
            .rposition(|(b, _)| b.capacity() == capacity)?;
        Some(buffers.remove(at).0)
    }

    /// Keeps `buffer` (empty, its capacity intact) for a later segment, in place of the
    /// longest-kept one when enough wait (the newest is likeliest still in the caches), or
    /// frees it when it is large.
    fn give(&self, buffer: Vec<u8>) {
        assert!(buffer.is_empty(), "a spare buffer holds nothing");
        if buffer.capacity() > self.buffer_bytes_max || self.buffers_max == 0 {
            return;
        }
        let mut buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = (buffers.len() == self.buffers_max).then(|| buffers.remove(0));
        buffers.push((buffer, Instant::now()));
        // The one pushed out is freed after the lock is released.
        drop(buffers);
        drop(oldest);
    }

    /// Frees the buffers that have waited at least `age`; returns their bytes.
    fn release_older_than(&self, age: Duration) -> usize {
        let mut buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *buffers)
            .into_iter()
            .partition(|(_, given)| now.duration_since(*given) >= age);
        *buffers = kept;
        drop(buffers);
        old.iter().map(|(b, _)| b.capacity()).sum()
    }
}

/// Process-wide: a segment's last reference may drop on any thread (a reader's epoch collects
/// it), and a buffer is plain memory, whichever store it served. At most 4 buffers of at most
/// 4 MiB each wait (4 MiB at the default 1 MiB segments), and a member's periodic purge frees
/// those that waited a purge period (`release_spare_segment_buffers`), so an idle member holds
/// none.
static SPARE_SEGMENTS: SpareBuffers = SpareBuffers::new(4, 4 << 20);

/// Frees the spare segment buffers that have waited at least `age` and returns their bytes.
/// Under a write load they are reused within milliseconds; a member calls this with its
/// purge period each time it gives freed memory back, and a test that measures the heap calls
/// it with zero first.
pub fn release_spare_segment_buffers(age: Duration) -> usize {
    SPARE_SEGMENTS.release_older_than(age)
}

impl OpenSegment {
    /// A segment of `capacity` bytes; `reusable` when that is the store's configured segment
    /// size, whose buffers are kept for later segments.
    pub(crate) fn with_capacity(capacity: usize, reusable: bool) -> Arc<OpenSegment> {
        assert!(capacity > 0, "a segment holds something");
        let spare = if reusable {
            SPARE_SEGMENTS.take(capacity)
        } else {
            None
        };
        let buffer = spare.unwrap_or_else(|| Vec::<u8>::with_capacity(capacity));
        let mut buffer = std::mem::ManuallyDrop::new(buffer);
        Arc::new(OpenSegment {
            ptr: NonNull::new(buffer.as_mut_ptr()).expect("a Vec's pointer is never null"),
            capacity: buffer.capacity(),
            reusable,
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
        // need no drop. This is the last reference, so no reader still sees the bytes, and a
        // segment that reuses the buffer only publishes what it writes anew.
        let buffer = unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), 0, self.capacity) };
        if self.reusable {
            SPARE_SEGMENTS.give(buffer);
        }
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

/// Segments per chunk of the table, as a chunk is split (it holds up to twice this).
const TABLE_CHUNK_SLOTS: usize = 64;

/// The segments by id, ascending, in chunks shared between the tables published one after
/// another: the writer publishes a copy after every seal, durable segment and reclaim, and a
/// copy is then one pointer per chunk, while a change copies only its chunk. A table of
/// whole slots cost a copy of every slot per publish (4,000 at 4 GiB of 1 MiB segments).
#[derive(Clone, Default, Debug)]
pub(crate) struct SegmentTable {
    /// Ascending by id across and within chunks; no chunk is empty.
    chunks: Vec<Arc<Vec<(u32, SegmentBytes)>>>,
}

impl SegmentTable {
    /// The chunk that holds `id`, or where it would go: the last one starting at or below
    /// it, else the first.
    fn chunk_of(&self, id: u32) -> usize {
        self.chunks
            .partition_point(|chunk| chunk[0].0 <= id)
            .saturating_sub(1)
    }

    fn slots(&self) -> impl Iterator<Item = &(u32, SegmentBytes)> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    pub(crate) fn get(&self, id: u32) -> Option<&SegmentBytes> {
        let chunk = self.chunks.get(self.chunk_of(id))?;
        let at = chunk.binary_search_by_key(&id, |(slot, _)| *slot).ok()?;
        Some(&chunk[at].1)
    }

    /// Adds segment `id`, or replaces its bytes.
    fn set(&mut self, id: u32, bytes: SegmentBytes) {
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(vec![(id, bytes)]));
            return;
        }
        let at = self.chunk_of(id);
        let chunk = Arc::make_mut(&mut self.chunks[at]);
        match chunk.binary_search_by_key(&id, |(slot, _)| *slot) {
            Ok(slot) => chunk[slot].1 = bytes,
            Err(slot) => {
                chunk.insert(slot, (id, bytes));
                if chunk.len() > 2 * TABLE_CHUNK_SLOTS {
                    let upper = chunk.split_off(TABLE_CHUNK_SLOTS);
                    self.chunks.insert(at + 1, Arc::new(upper));
                }
            }
        }
    }

    /// Removes the segments `ids` names (those it holds).
    fn remove(&mut self, ids: &[u32]) {
        for &id in ids {
            let at = self.chunk_of(id);
            let Some(chunk) = self.chunks.get_mut(at) else {
                return;
            };
            let Ok(slot) = chunk.binary_search_by_key(&id, |(s, _)| *s) else {
                continue;
            };
            Arc::make_mut(chunk).remove(slot);
            if chunk.is_empty() {
                self.chunks.remove(at);
            }
        }
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
        self.slots()
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
        // Handed to the global queue now: the old table may hold the last reference to a
        // sealed segment's records (a megabyte each), and a deferred destroy waits in this
        // thread's bag until 64 of them fill it, which a load of new keys, whose applies
        // defer nothing else, took 14 segments and more to do (their records stayed in memory:
        // 220 bytes of RSS a key at 50,000 keys of 256-byte values). A publish is rare (a
        // segment opened, sealed, made durable or removed), so the flush costs nothing a put
        // would see.
        guard.flush();
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
        self.own.set(id, bytes);
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
        self.own.remove(&ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dropped segment's buffer serves the next segment of its size, the same memory; other
    /// sizes are not served, buffers over the size bound are not kept, and past the count the
    /// newest are kept.
    #[test]
    fn spare_buffers_serve_segments_of_their_size_and_stay_bounded() {
        let spares = SpareBuffers::new(2, 1 << 20);
        let first = Vec::<u8>::with_capacity(4096);
        let first_ptr = first.as_ptr();
        spares.give(first);
        assert!(spares.take(8192).is_none(), "another size is not served");
        let again = spares.take(4096).expect("the same size is served");
        assert_eq!(again.as_ptr(), first_ptr, "with the same memory");
        assert!(spares.take(4096).is_none(), "once");
        let given: Vec<Vec<u8>> = (0..3).map(|_| Vec::with_capacity(4096)).collect();
        let newest: Vec<*const u8> = given[1..].iter().map(|b| b.as_ptr()).collect();
        for buffer in given {
            spares.give(buffer);
        }
        spares.give(Vec::with_capacity(2 << 20));
        let kept: Vec<*const u8> = spares
            .buffers
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(b, _)| b.as_ptr())
            .collect();
        assert_eq!(kept, newest, "the two newest wait; the large one is freed");
        // Those that waited long enough are freed, and only those.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            spares.release_older_than(Duration::from_millis(10)),
            2 * 4096
        );
        assert!(spares.take(4096).is_none());
        spares.give(Vec::with_capacity(8192));
        assert_eq!(spares.release_older_than(Duration::from_secs(10)), 0);
        assert_eq!(spares.take(8192).map(|b| b.capacity()), Some(8192));
    }

    /// A dropped segment of the store's size leaves its buffer in the process's spares, the
    /// next segment of that size takes that very buffer, and a segment of another size (made
    /// for one large record) leaves none.
    #[test]
    fn a_segment_reuses_a_dropped_segments_buffer() {
        // A size no other test uses, so no other segment takes the spare. The spares are the
        // process's, so other tests' segments dropped in between could push it out: tried a
        // few times, one clean round is enough.
        let capacity = 12_347;
        let spare_ptr = || {
            SPARE_SEGMENTS
                .buffers
                .lock()
                .expect("not poisoned")
                .iter()
                .find(|(b, _)| b.capacity() == capacity)
                .map(|(b, _)| b.as_ptr())
        };
        let reused = (0..10).any(|_| {
            let old = OpenSegment::with_capacity(capacity, true);
            // SAFETY: the only writer, within the capacity; nothing is published.
            unsafe { old.write_at(0, b"old bytes") };
            let old_ptr = old.ptr.as_ptr().cast_const();
            drop(old);
            let kept = spare_ptr() == Some(old_ptr);
            let new = OpenSegment::with_capacity(capacity, true);
            assert_eq!(new.capacity(), capacity);
            // SAFETY: as above; the bytes read back are the ones just written.
            unsafe { new.write_at(0, b"new") };
            assert_eq!(unsafe { new.written(0, 3) }, b"new");
            kept && new.ptr.as_ptr().cast_const() == old_ptr && spare_ptr().is_none()
        });
        assert!(reused, "the dropped segment's buffer is kept, then reused");
        let odd = OpenSegment::with_capacity(capacity, false);
        let odd_ptr = odd.ptr.as_ptr().cast_const();
        drop(odd);
        assert_ne!(
            spare_ptr(),
            Some(odd_ptr),
            "a segment of another size leaves no spare"
        );
    }

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

    /// The table in chunks answers as one ascending list would, through inserts in any
    /// order, replacements and removals that split and empty chunks; a copy shares the
    /// chunks a later change does not touch, and sees none of its changes.
    #[test]
    fn a_chunked_table_holds_what_a_list_would() {
        let bytes = |id: u32| SegmentBytes::Frozen(Bytes::from(id.to_le_bytes().to_vec()));
        let id_of = |b: &SegmentBytes| match b {
            SegmentBytes::Frozen(b) => u32::from_le_bytes(b[..4].try_into().unwrap()),
            _ => unreachable!(),
        };
        let mut table = SegmentTable::default();
        let mut model = std::collections::BTreeMap::new();
        // Ascending appends, as the writer opens segments, then some below and between.
        let ids: Vec<u32> = (100..700)
            .step_by(2)
            .chain((0..40).rev())
            .chain((101..300).step_by(4))
            .collect();
        for &id in &ids {
            table.set(id, bytes(id));
            model.insert(id, ());
        }
        assert!(table.chunks.len() > 4, "inserts split chunks");
        let copy = table.clone();
        // A replacement in the last chunk copies that chunk only.
        table.set(698, bytes(698));
        let shared = copy
            .chunks
            .iter()
            .zip(&table.chunks)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert_eq!(
            shared,
            table.chunks.len() - 1,
            "untouched chunks are shared"
        );
        let removed: Vec<u32> = ids.iter().copied().filter(|id| id % 3 == 0).collect();
        table.remove(&removed);
        table.remove(&[5000, 99]);
        for id in &removed {
            model.remove(id);
        }
        table.set(102, bytes(102));
        model.insert(102, ());
        let listed: Vec<u32> = table.slots().map(|(id, _)| *id).collect();
        assert_eq!(listed, model.keys().copied().collect::<Vec<_>>());
        assert!(table.chunks.iter().all(|c| !c.is_empty()));
        for id in 0..800 {
            assert_eq!(
                table.get(id).map(id_of),
                model.contains_key(&id).then_some(id),
                "{id}"
            );
        }
        assert_eq!(copy.slots().count(), ids.len(), "the copy kept every slot");
        // Every slot removed: no chunk is left.
        let all: Vec<u32> = model.keys().copied().collect();
        table.remove(&all);
        assert!(table.chunks.is_empty());
        assert!(table.get(100).is_none());
    }

    /// A benchmark, not a check, so it is ignored by the suite and run in release (see
    /// BENCHMARKS.md; benches cannot reach this crate-private table): the writer's cost of
    /// one publish with 4,000 to 6,000 segments in the table (4 GiB and more of 1 MiB
    /// segments), a new segment added before each, as a seal adds one.
    ///
    /// `cargo test --release -p keel-kv --lib -- --ignored --nocapture publish_cost`
    #[test]
    #[ignore]
    fn publish_cost_with_thousands_of_segments() {
        const SEGMENTS: u32 = 4000;
        const PUBLISHES: u32 = 2000;
        let frozen = || SegmentBytes::Frozen(Bytes::from(vec![0u8; 16]));
        let mut writer = SegmentsWriter::new(Arc::new(SharedSegments::new()));
        for id in 0..SEGMENTS {
            writer.set(id, frozen());
        }
        let start = std::time::Instant::now();
        for i in 0..PUBLISHES {
            writer.set(SEGMENTS + i, frozen());
            writer.publish();
        }
        println!(
            "publish with {}-{} segments: {:.1} us each",
            SEGMENTS,
            SEGMENTS + PUBLISHES,
            start.elapsed().as_secs_f64() * 1e6 / f64::from(PUBLISHES)
        );
    }

    /// A record taken from the open segment keeps its bytes after the segment is sealed,
    /// replaced in the table and its buffer dropped by the writer.
    #[test]
    fn a_record_read_from_the_open_segment_outlives_it() {
        let open = OpenSegment::with_capacity(64, false);
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
