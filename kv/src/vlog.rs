//! The append-only value log: values live in large segments, the index names each value by
//! (segment, offset, length), and the segment table (`segments.rs`) says where each segment's
//! bytes are, so a range read hands out slices of them without copying.
//!
//! A segment is written as framed records, one per stored value (see [`RECORD_HEADER_BYTES`]),
//! so a segment file can be checked and walked without the index. While a segment is open it is
//! one allocation (`OpenSegment`): appending copies the record past the published ones, so the
//! open segment never reallocates and readers never see bytes that are still being written.
//!
//! Values on disk (`spill` on, as the server runs it): a segment that fills up is sealed and
//! handed to the driver ([`SealedSegment`], taken with `Writer::take_sealed_segments`), which
//! writes it to a file, makes it durable and maps it; `Writer::segment_durable` then points the
//! table at the mapping, and the in-memory copy is freed once the last reader drops its slice
//! (its buffer, of the configured size, kept a while for a later segment: `segments.rs`).
//! Memory then holds the index, the open segment and the sealed segments not yet durable
//! (bounded by the driver), never the whole data set. With `spill` off (tests, simulations,
//! tools) segments stay in memory and nothing is handed out.
//!
//! Compaction drops versions (live bytes fall); reclaim rewrites the live values of a mostly
//! dead frozen segment into the open one, walking the segment's own records (each names its key
//! and revision). A segment whose file may still be referenced by a checkpoint is reported as
//! dead (`Writer::take_dead_segments`) for the driver to delete once no kept checkpoint needs it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::segments::{
    written_bytes, OpenSegment, ReadMark, SegmentBytes, SegmentTable, SegmentsWriter,
};
use crate::types::Revision;

/// Default size of one value-log segment.
pub const SEGMENT_BYTES: usize = 1 << 20;
const _: () = assert!(SEGMENT_BYTES.is_power_of_two() && SEGMENT_BYTES >= 4096);

/// One record: `crc32 u32 | key_len u32 | value_len u32 | rev_main i64 | rev_sub i64 | key |
/// value`, little-endian; the crc covers everything after itself.
pub const RECORD_HEADER_BYTES: usize = 4 + 4 + 4 + 8 + 8;

/// The bytes one record of this key and value takes in its segment.
pub const fn record_bytes(key_bytes: usize, value_bytes: usize) -> usize {
    RECORD_HEADER_BYTES + key_bytes + value_bytes
}

/// A segment is rewritten once less than this share (in percent) of its bytes are live.
pub const RECLAIM_LIVE_PERCENT_MAX: u64 = 50;
const _: () = assert!(RECLAIM_LIVE_PERCENT_MAX > 0 && RECLAIM_LIVE_PERCENT_MAX < 100);

/// Which frozen segments the compactor rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// Segments mostly dead (the steady state: rewriting costs less than it frees).
    MostlyDead,
    /// Every segment with a dead byte (Defragment asked for all space back).
    Everything,
}

/// The segment id of an empty value: it takes no log space.
pub const SEGMENT_NONE: u32 = u32::MAX;

/// A sealed segment for the driver to write: its records, back to back, make up the file (then
/// zero padding to whatever block size the driver writes in; a record never starts with a zero
/// length key, so the padding reads as the end).
#[derive(Debug)]
pub struct SealedSegment {
    pub id: u32,
    pub records: Bytes,
    /// The records' length: the file's meaningful bytes.
    pub bytes: u64,
}

/// A segment the log no longer uses; its file goes once no kept checkpoint refers to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadSegment {
    pub id: u32,
    /// The applied raft index when it died: a checkpoint taken at or after a later index does
    /// not refer to it.
    pub died_at_index: u64,
}

/// A durable segment as a checkpoint lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurableSegment {
    pub(crate) id: u32,
    /// Record bytes: the file holds at least these.
    pub(crate) record_bytes: u64,
    /// Value bytes ever written into it (live or dead): what reclaim weighs live bytes against.
    pub(crate) value_bytes: u64,
}

/// Bookkeeping for one segment.
#[derive(Debug, Default)]
pub(crate) struct SegmentStats {
    /// Value bytes written into the segment, and those still live: what reclaim weighs.
    pub(crate) bytes_total: u64,
    pub(crate) bytes_live: u64,
    /// Record bytes (header, key, value) still live: with `record_bytes`, what Status and the
    /// quota count, as etcd counts its database file.
    pub(crate) record_bytes_live: u64,
    /// Record bytes written: the next record's offset, and the file's length.
    pub(crate) record_bytes: u64,
    /// Whether the segment's file is durable (the table then points at its mapping).
    pub(crate) durable: bool,
}

/// A record read back from a segment's bytes, its crc checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordAt<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) rev: Revision,
    pub(crate) value_len: u32,
    /// The whole record's length: the next record starts this far on.
    pub(crate) record_bytes: usize,
}

/// The record at `offset` in `segment` (a segment's record bytes), or None where none can be
/// read: past the end, zero padding, lengths that do not fit, or a crc that does not match.
pub(crate) fn record_at(segment: &[u8], offset: usize) -> Option<RecordAt<'_>> {
    let header = segment.get(offset..offset.checked_add(RECORD_HEADER_BYTES)?)?;
    let le32 = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let le64 = |at: usize| i64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let (key_len, value_len) = (le32(4) as usize, le32(8));
    if key_len == 0 {
        return None;
    }
    let len = record_bytes(key_len, value_len as usize);
    let record = segment.get(offset..offset.checked_add(len)?)?;
    if crc32fast::hash(&record[4..]) != le32(0) {
        return None;
    }
    Some(RecordAt {
        key: &record[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key_len],
        rev: Revision {
            main: le64(12),
            sub: le64(20),
        },
        value_len,
        record_bytes: len,
    })
}

/// Where `append` put a value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) value_len: u32,
    pub(crate) segment: u32,
    /// The record's offset in its segment.
    pub(crate) offset: u32,
}

#[derive(Debug)]
pub(crate) struct ValueLog {
    /// The open segment's buffer and the bytes written into it.
    open: Arc<OpenSegment>,
    open_len: usize,
    open_id: u32,
    /// Where every segment's bytes are, for the writer and (once published) for readers.
    table: SegmentsWriter,
    segment_bytes: usize,
    pub(crate) segments: BTreeMap<u32, SegmentStats>,
    /// The sums of every segment's `bytes_total` and `bytes_live`, kept as they change: the
    /// store's size is read after every applied batch, and summing thousands of segments there
    /// would put an O(segments) loop on the apply path.
    all_bytes_total: u64,
    all_bytes_live: u64,
    /// The same for record bytes: the segments' bytes on disk (or bound for it), and those live.
    all_record_bytes: u64,
    all_record_bytes_live: u64,
    /// Whether sealed segments go to disk (see the module's description).
    spill: bool,
    /// Sealed segments the driver has not taken yet.
    sealed: Vec<SealedSegment>,
    /// Record bytes sealed and not yet durable: what the driver bounds.
    sealed_backlog_bytes: u64,
    /// Segments removed whose files the driver deletes later.
    pub(crate) dead: Vec<u32>,
}

impl ValueLog {
    /// A log whose first segment is `first_id`; `spill` hands sealed segments to the driver.
    /// It keeps `table` (whose shared side readers load) in step with its segments.
    pub(crate) fn starting_at(
        segment_bytes: usize,
        first_id: u32,
        spill: bool,
        mut table: SegmentsWriter,
    ) -> Self {
        assert!(segment_bytes > 0);
        assert!(first_id != SEGMENT_NONE, "segment ids exhausted");
        let mut segments = BTreeMap::new();
        segments.insert(first_id, SegmentStats::default());
        let open = OpenSegment::with_capacity(segment_bytes, true);
        table.set(first_id, SegmentBytes::Open(open.clone()));
        table.publish();
        ValueLog {
            open,
            open_len: 0,
            open_id: first_id,
            table,
            segment_bytes,
            segments,
            all_bytes_total: 0,
            all_bytes_live: 0,
            all_record_bytes: 0,
            all_record_bytes_live: 0,
            spill,
            sealed: Vec::new(),
            sealed_backlog_bytes: 0,
            dead: Vec::new(),
        }
    }

    pub(crate) fn open_id(&self) -> u32 {
        self.open_id
    }

    /// The writer's segment table (what readers see once published).
    pub(crate) fn table(&self) -> &SegmentTable {
        self.table.table()
    }

    /// Publishes the segment table: after a batch of `insert_durable`s, before the versions
    /// naming them are.
    pub(crate) fn publish_table(&self) {
        self.table.publish();
    }

    /// Options for a log that replaces this one: same settings, ids above every one used here.
    pub(crate) fn successor(&self) -> crate::store::ValueLogOptions {
        crate::store::ValueLogOptions {
            segment_bytes: self.segment_bytes,
            first_segment_id: self.open_id + 1,
            on_disk: self.spill,
        }
    }

    /// A frozen segment loaded from its durable file (restore): its values are counted live by
    /// `count_loaded`. Readers see it after `publish_table`.
    pub(crate) fn insert_durable(&mut self, segment: DurableSegment, file: Bytes) {
        assert!(
            segment.id < self.open_id,
            "a loaded segment is older than the open one"
        );
        let previous = self.segments.insert(
            segment.id,
            SegmentStats {
                bytes_total: segment.value_bytes,
                record_bytes: segment.record_bytes,
                durable: true,
                ..SegmentStats::default()
            },
        );
        assert!(previous.is_none(), "a segment is loaded once");
        self.table.set(
            segment.id,
            SegmentBytes::Durable(file, ReadMark::default(), segment),
        );
        self.all_bytes_total += segment.value_bytes;
        self.all_record_bytes += segment.record_bytes;
    }

    /// Counts the loaded values of a durable segment (restore): `value_bytes` and
    /// `record_bytes` in all. False when they would exceed what was written into it (a damaged
    /// checkpoint).
    pub(crate) fn count_loaded(&mut self, id: u32, value_bytes: u64, record_bytes: u64) -> bool {
        let stats = self
            .segments
            .get_mut(&id)
            .expect("a loaded value's segment was inserted");
        if stats.bytes_live + value_bytes > stats.bytes_total {
            return false;
        }
        stats.bytes_live += value_bytes;
        stats.record_bytes_live += record_bytes;
        self.all_bytes_live += value_bytes;
        self.all_record_bytes_live += record_bytes;
        true
    }

    /// Copies `value` into the log as a record and returns where it went.
    pub(crate) fn append(&mut self, key: &[u8], rev: Revision, value: &[u8]) -> Placed {
        if value.is_empty() {
            return Placed {
                value_len: 0,
                segment: SEGMENT_NONE,
                offset: 0,
            };
        }
        let len = record_bytes(key.len(), value.len());
        let key_len = u32::try_from(key.len()).expect("keys are bounded far below 4 GiB");
        let value_len = u32::try_from(value.len()).expect("values are bounded far below 4 GiB");
        if len > self.open.capacity() - self.open_len {
            // Seal the open segment: a record never straddles two allocations. A record larger
            // than a segment gets a segment of its own size.
            self.rotate(len);
        }
        let mut header = [0u8; RECORD_HEADER_BYTES];
        header[4..8].copy_from_slice(&key_len.to_le_bytes());
        header[8..12].copy_from_slice(&value_len.to_le_bytes());
        header[12..20].copy_from_slice(&rev.main.to_le_bytes());
        header[20..28].copy_from_slice(&rev.sub.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header[4..]);
        crc.update(key);
        crc.update(value);
        header[..4].copy_from_slice(&crc.finalize().to_le_bytes());
        let start = self.open_len;
        // SAFETY: the writer alone writes, past every published record (`open_len` only grows
        // and no version names these bytes yet), within the capacity checked above.
        unsafe {
            self.open.write_at(start, &header);
            self.open.write_at(start + RECORD_HEADER_BYTES, key);
            self.open
                .write_at(start + RECORD_HEADER_BYTES + key.len(), value);
        }
        self.open_len += len;
        let stats = self
            .segments
            .get_mut(&self.open_id)
            .expect("the open segment has stats");
        assert!(
            stats.record_bytes == start as u64,
            "the open segment's records are its bytes"
        );
        let offset = u32::try_from(start).expect("segments are below 4 GiB");
        stats.bytes_total += value.len() as u64;
        stats.bytes_live += value.len() as u64;
        stats.record_bytes += len as u64;
        stats.record_bytes_live += len as u64;
        self.all_bytes_total += value.len() as u64;
        self.all_bytes_live += value.len() as u64;
        self.all_record_bytes += len as u64;
        self.all_record_bytes_live += len as u64;
        Placed {
            value_len,
            segment: self.open_id,
            offset,
        }
    }

    /// Seals the open segment and opens the next, sized for at least `record_bytes`.
    fn rotate(&mut self, record_bytes: usize) {
        let sealed_id = self.open_id;
        self.open_id = self
            .open_id
            .checked_add(1)
            .expect("fewer than 2^32 segments");
        assert!(self.open_id != SEGMENT_NONE, "segment ids exhausted");
        let next = OpenSegment::with_capacity(
            self.segment_bytes.max(record_bytes),
            record_bytes <= self.segment_bytes,
        );
        let sealed = std::mem::replace(&mut self.open, next.clone());
        let sealed_len = std::mem::replace(&mut self.open_len, 0);
        // SAFETY: the sealed segment's written prefix never changes again: the writer now
        // appends to `next`.
        let frozen = unsafe { written_bytes(&sealed, 0, sealed_len) };
        drop(sealed);
        self.segments.insert(self.open_id, SegmentStats::default());
        self.table
            .set(sealed_id, SegmentBytes::Frozen(frozen.clone()));
        self.table.set(self.open_id, SegmentBytes::Open(next));
        // Segments retired an epoch ago leave in the same update.
        self.table.drain_retired();
        self.table.publish();
        if self.spill && sealed_len > 0 {
            self.sealed_backlog_bytes += sealed_len as u64;
            self.sealed.push(SealedSegment {
                id: sealed_id,
                records: frozen,
                bytes: sealed_len as u64,
            });
        }
    }

    /// Freezes the open segment when it holds dead bytes, so reclaim may rewrite it too (only
    /// frozen segments are rewritten); the next value opens a fresh one.
    pub(crate) fn seal_open_if_dead(&mut self) {
        let stats = self
            .segments
            .get(&self.open_id)
            .expect("the open segment has stats");
        if stats.bytes_live == stats.bytes_total {
            return;
        }
        self.rotate(0);
    }

    /// Sealed segments for the driver to write, oldest first.
    pub(crate) fn take_sealed(&mut self) -> Vec<SealedSegment> {
        std::mem::take(&mut self.sealed)
    }

    pub(crate) fn sealed_backlog_bytes(&self) -> u64 {
        self.sealed_backlog_bytes
    }

    /// Marks a sealed segment durable in `file` (its mapping), which readers then read; false
    /// when reclaim removed it meanwhile.
    pub(crate) fn mark_durable(&mut self, id: u32, file: Bytes) -> bool {
        let file_bytes = file.len() as u64;
        let Some(stats) = self.segments.get_mut(&id) else {
            return false;
        };
        assert!(id != self.open_id, "only a sealed segment becomes durable");
        assert!(!stats.durable, "segment {id} became durable twice");
        assert!(
            file_bytes >= stats.record_bytes,
            "segment {id}'s file holds {file_bytes} bytes, fewer than its {} record bytes",
            stats.record_bytes
        );
        stats.durable = true;
        let sizes = DurableSegment {
            id,
            record_bytes: stats.record_bytes,
            value_bytes: stats.bytes_total,
        };
        self.table
            .set(id, SegmentBytes::Durable(file, ReadMark::default(), sizes));
        self.table.drain_retired();
        self.table.publish();
        true
    }

    /// The mapped file of durable segment `id`, if it is one.
    pub(crate) fn durable_file(&self, id: u32) -> Option<&Bytes> {
        if !self.segments.get(&id).is_some_and(|s| s.durable) {
            return None;
        }
        match self.table().get(id) {
            Some(SegmentBytes::Durable(file, ..)) => Some(file),
            _ => unreachable!("a durable segment's table entry is its file"),
        }
    }

    /// The records of frozen segment `id` (in memory, or its durable file's mapping), up to
    /// the bytes written into it: what reclaim walks.
    pub(crate) fn frozen_records(&self, id: u32) -> Bytes {
        assert!(id != self.open_id, "the open segment is not frozen");
        let end = self.segments[&id].record_bytes as usize;
        match self.table().get(id) {
            Some(SegmentBytes::Frozen(bytes) | SegmentBytes::Durable(bytes, ..)) => {
                bytes.slice(..end.min(bytes.len()))
            }
            _ => unreachable!("a frozen segment's table entry is its bytes"),
        }
    }

    /// The driver finished writing a sealed segment (durable or removed meanwhile).
    pub(crate) fn sealed_written(&mut self, bytes: u64) {
        assert!(self.sealed_backlog_bytes >= bytes, "backlog underflow");
        self.sealed_backlog_bytes -= bytes;
    }

    /// Durable segments, ascending: what a checkpoint may point into.
    pub(crate) fn durable_segments(&self) -> Vec<DurableSegment> {
        self.segments
            .iter()
            .filter(|(_, s)| s.durable)
            .map(|(id, s)| DurableSegment {
                id: *id,
                record_bytes: s.record_bytes,
                value_bytes: s.bytes_total,
            })
            .collect()
    }

    /// Live value bytes in segments whose files are not durable: what a checkpoint taken now
    /// holds inline, at most.
    pub(crate) fn undurable_live_bytes(&self) -> u64 {
        self.segments
            .values()
            .filter(|s| !s.durable)
            .map(|s| s.bytes_live)
            .sum()
    }

    /// Records that a value (of `value_bytes`, in a record of `record_bytes`) left the index
    /// (compaction dropped its version, or reclaim moved it).
    pub(crate) fn release(&mut self, segment: u32, value_bytes: usize, record_bytes: usize) {
        if segment == SEGMENT_NONE {
            return;
        }
        let stats = self
            .segments
            .get_mut(&segment)
            .expect("a live value's segment has stats");
        assert!(
            stats.bytes_live >= value_bytes as u64,
            "live bytes underflow"
        );
        assert!(
            stats.record_bytes_live >= record_bytes as u64,
            "live record bytes underflow"
        );
        stats.bytes_live -= value_bytes as u64;
        stats.record_bytes_live -= record_bytes as u64;
        self.all_bytes_live -= value_bytes as u64;
        self.all_record_bytes_live -= record_bytes as u64;
    }

    /// Drops a rewritten segment: every live value in it has moved to the open segment.
    pub(crate) fn remove_segment(&mut self, segment: u32) {
        assert!(segment != self.open_id, "the open segment is never removed");
        let stats = self
            .segments
            .remove(&segment)
            .expect("a segment under reclaim has stats");
        assert!(stats.bytes_live == 0, "every live value was rewritten");
        assert!(
            stats.record_bytes_live == 0,
            "every live record was rewritten"
        );
        self.all_bytes_total -= stats.bytes_total;
        self.all_record_bytes -= stats.record_bytes;
        // Readers that loaded a list naming it before reclaim replaced that list may still read
        // it: it leaves the table one epoch from now.
        self.table.retire(segment);
        if self.spill {
            self.dead.push(segment);
        }
    }

    /// The oldest frozen segment worth rewriting, if any: at most `RECLAIM_LIVE_PERCENT_MAX`
    /// live normally, and any dead byte at all when `Reclaim::Everything` (defragment).
    pub(crate) fn reclaim_candidate(&self, reclaim: Reclaim) -> Option<u32> {
        self.segments
            .iter()
            .find(|(id, s)| {
                **id != self.open_id
                    && match reclaim {
                        Reclaim::MostlyDead => {
                            s.bytes_live * 100 <= s.bytes_total * RECLAIM_LIVE_PERCENT_MAX
                        }
                        Reclaim::Everything => s.bytes_live < s.bytes_total,
                    }
            })
            .map(|(id, _)| *id)
    }

    /// Bytes held by segments (live or not), for metrics and quota.
    pub(crate) fn bytes_total(&self) -> u64 {
        debug_assert_eq!(
            self.all_bytes_total,
            self.segments.values().map(|s| s.bytes_total).sum::<u64>()
        );
        self.all_bytes_total
    }

    pub(crate) fn bytes_live(&self) -> u64 {
        debug_assert_eq!(
            self.all_bytes_live,
            self.segments.values().map(|s| s.bytes_live).sum::<u64>()
        );
        self.all_bytes_live
    }

    /// Record bytes held by segments, live or not: their files' contents.
    pub(crate) fn record_bytes_total(&self) -> u64 {
        debug_assert_eq!(
            self.all_record_bytes,
            self.segments.values().map(|s| s.record_bytes).sum::<u64>()
        );
        self.all_record_bytes
    }

    /// Record bytes of live values.
    pub(crate) fn record_bytes_live(&self) -> u64 {
        debug_assert_eq!(
            self.all_record_bytes_live,
            self.segments
                .values()
                .map(|s| s.record_bytes_live)
                .sum::<u64>()
        );
        self.all_record_bytes_live
    }
}
