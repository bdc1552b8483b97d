//! The append-only value log: values live in large in-memory segments and the index holds `Bytes`
//! slices of them, so a range read hands out those slices without copying.
//!
//! A segment is one `BytesMut` allocation of `SEGMENT_BYTES`. Appending a value copies it into the
//! spare capacity and splits the written part off as a frozen `Bytes` that shares the allocation, so
//! the open segment never reallocates and readers never see bytes that are still being written.
//! Compaction drops versions (live bytes fall); `reclaim_step` rewrites the live values of a mostly
//! dead frozen segment into the open one. The old allocation is freed when the last `Bytes`
//! pointing into it is dropped, so readers still holding a slice keep working.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};

use crate::types::Revision;

/// Default size of one value-log segment.
pub const SEGMENT_BYTES: usize = 1 << 20;
const _: () = assert!(SEGMENT_BYTES.is_power_of_two() && SEGMENT_BYTES >= 4096);

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

/// Bookkeeping for one segment.
#[derive(Debug, Default)]
pub(crate) struct SegmentStats {
    pub(crate) bytes_total: u64,
    pub(crate) bytes_live: u64,
    /// Every value written into this segment, in write order, so reclaim can find them again.
    pub(crate) refs: Vec<(Bytes, Revision)>,
}

#[derive(Debug)]
pub(crate) struct ValueLog {
    open: BytesMut,
    open_id: u32,
    segment_bytes: usize,
    pub(crate) segments: BTreeMap<u32, SegmentStats>,
    /// The sums of every segment's `bytes_total` and `bytes_live`, kept as they change: the
    /// store's size is read after every applied batch, and summing thousands of segments there
    /// would put an O(segments) loop on the apply path.
    all_bytes_total: u64,
    all_bytes_live: u64,
}

impl ValueLog {
    pub(crate) fn new(segment_bytes: usize) -> Self {
        assert!(segment_bytes > 0);
        let mut segments = BTreeMap::new();
        segments.insert(0, SegmentStats::default());
        ValueLog {
            open: BytesMut::with_capacity(segment_bytes),
            open_id: 0,
            segment_bytes,
            segments,
            all_bytes_total: 0,
            all_bytes_live: 0,
        }
    }

    pub(crate) fn open_id(&self) -> u32 {
        self.open_id
    }

    /// Copies `value` into the log and returns the shared slice and its segment id.
    pub(crate) fn append(&mut self, key: &Bytes, rev: Revision, value: &[u8]) -> (Bytes, u32) {
        if value.is_empty() {
            return (Bytes::new(), SEGMENT_NONE);
        }
        let spare_bytes = self.open.capacity() - self.open.len();
        if value.len() > spare_bytes {
            // Freeze the open segment: a value never straddles two allocations. A value larger than a
            // segment gets a segment of its own size.
            self.open_id = self
                .open_id
                .checked_add(1)
                .expect("fewer than 2^32 segments");
            assert!(self.open_id != SEGMENT_NONE, "segment ids exhausted");
            self.open = BytesMut::with_capacity(self.segment_bytes.max(value.len()));
            self.segments.insert(self.open_id, SegmentStats::default());
        }
        let capacity_before = self.open.capacity();
        self.open.extend_from_slice(value);
        assert!(
            self.open.capacity() == capacity_before,
            "the open segment must never reallocate"
        );
        let slice = self.open.split().freeze();
        assert!(slice.len() == value.len());
        let stats = self
            .segments
            .get_mut(&self.open_id)
            .expect("the open segment has stats");
        stats.bytes_total += value.len() as u64;
        stats.bytes_live += value.len() as u64;
        self.all_bytes_total += value.len() as u64;
        self.all_bytes_live += value.len() as u64;
        stats.refs.push((key.clone(), rev));
        (slice, self.open_id)
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
        self.open_id = self
            .open_id
            .checked_add(1)
            .expect("fewer than 2^32 segments");
        assert!(self.open_id != SEGMENT_NONE, "segment ids exhausted");
        self.open = BytesMut::with_capacity(self.segment_bytes);
        self.segments.insert(self.open_id, SegmentStats::default());
    }

    /// Records that a value left the index (compaction dropped its version).
    pub(crate) fn release(&mut self, segment: u32, value_bytes: usize) {
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
        stats.bytes_live -= value_bytes as u64;
        self.all_bytes_live -= value_bytes as u64;
    }

    /// Drops a rewritten segment: every live value in it has moved to the open segment.
    pub(crate) fn remove_segment(&mut self, segment: u32) {
        assert!(segment != self.open_id, "the open segment is never removed");
        let stats = self
            .segments
            .remove(&segment)
            .expect("a segment under reclaim has stats");
        assert!(stats.bytes_live == 0, "every live value was rewritten");
        self.all_bytes_total -= stats.bytes_total;
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
}
