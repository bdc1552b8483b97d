//! Checkpoints: the whole store (index, values, leases, applied index, compact revision) as one
//! framed rkyv archive. The server writes it to a file and, on restart, restores it and replays the
//! WAL after `applied_index`.
//!
//! Frame (all integers little-endian):
//! `magic "KEELKVCP" | format u32 | reserved u32 (0) | payload_bytes u64 | key_count u64 |
//!  payload_crc32 u32 | header_crc32 u32 | payload`.
//! rkyv puts its root at the END of the payload, so trailing zero padding could read back as an
//! empty archive: restore insists on the exact length, the crc of the exact bytes, and the key count.
//!
//! An incremental checkpoint (a delta, format 3) holds only the keys that changed since a full
//! checkpoint, its base: its payload starts with the base's applied index (u64) and revision
//! (i64), 16 bytes that keep the archive after them aligned, and the payload crc covers them.
//! Everything else (revisions, leases, segments) is whole in a delta. A delta holds each key's
//! versions newer than the base's revision (a key's list only grows at its end); a restore
//! puts them after the base's list of the key, less what compaction trimmed since, which the
//! restore redoes. Values of the base's versions are where the base points (reclaim may have
//! moved them since: the base's segment files stay while it is kept, and a store restored so
//! reclaims those segments again). A key that compaction
//! removed outright since the base would be missing from both and come back: the writer keeps
//! such a key's tombstone until a newer base (`Writer::set_delta_base_revision`).

use std::collections::BTreeMap;

use bytes::Bytes;
use crossbeam_epoch as epoch;
use rkyv::rancor;

use crate::error::{KvError, Result};
use crate::index::{KeyHistory, Version, VersionKind};
use crate::store::ValueLogOptions;
use crate::store::{compacted_start, hash_version, Reader, Store, Writer};
use crate::types::Revision;
use crate::vlog::{DurableSegment, RECORD_HEADER_BYTES, SEGMENT_NONE};

const MAGIC: [u8; 8] = *b"KEELKVCP";
/// Format 2 adds value-log pointers (`VersionRecord::segment`) and the segments they need.
const FORMAT_VERSION: u32 = 2;
/// Format 1 (every value inline) still loads.
const FORMAT_VERSION_INLINE: u32 = 1;
/// An incremental checkpoint: format 2's archive after a reference to its base.
const FORMAT_VERSION_DELTA: u32 = 3;
/// Set in a header's format field when the header's bytes 12..16 hold a segment id shift: every
/// value-log segment id the archive names is that much higher on disk (see
/// `segment_shift_header`). A build that predates the shift refuses such a file as of an
/// unknown format, rather than read its ids unshifted and point into the wrong segments.
const FORMAT_SEGMENT_SHIFTED: u32 = 0x100;
/// A delta's payload before its archive: the base's applied index and revision.
const DELTA_PREFIX_BYTES: usize = 16;
/// A delta is written only when its archive would be at most this share (1/n) of a full one's:
/// a restore then reads the base and the delta, and a larger delta saves too little.
const DELTA_SHARE_MAX: usize = 4;
/// Bytes before the payload: magic, format, segment id shift (0 unless the format says so),
/// payload length, key count, payload crc32, and the crc32 of the header before it.
pub const HEADER_BYTES: usize = 40;
const _: () = assert!(HEADER_BYTES == 8 + 4 + 4 + 8 + 8 + 4 + 4);

#[derive(rkyv::Archive, rkyv::Serialize)]
struct CheckpointData {
    applied_index: u64,
    current_rev: i64,
    compact_rev: i64,
    keys: Vec<KeyRecord>,
    /// The values kept inline (those not in a durable segment), concatenated in key/revision
    /// order.
    values: Vec<u8>,
    leases: Vec<LeaseRecord>,
    /// The durable value-log segments the versions may point into.
    segments: Vec<SegmentRecord>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct SegmentRecord {
    id: u32,
    /// The segment's record bytes: its file must hold at least these.
    record_bytes: u64,
    /// Value bytes written into it, live or dead (so reclaim still sees the dead ones after a
    /// restart).
    value_bytes: u64,
}

/// Format 1: every value inline. Only read (tests write one to prove such files still load).
#[derive(rkyv::Archive, rkyv::Serialize)]
#[cfg_attr(not(test), allow(dead_code))]
struct CheckpointDataInline {
    applied_index: u64,
    current_rev: i64,
    compact_rev: i64,
    keys: Vec<KeyRecordInline>,
    values: Vec<u8>,
    leases: Vec<LeaseRecord>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct KeyRecordInline {
    key: Vec<u8>,
    versions: Vec<VersionRecordInline>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct VersionRecordInline {
    main: i64,
    sub: i64,
    tombstone: bool,
    create_revision: i64,
    version: i64,
    lease: i64,
    value_offset: u64,
    value_bytes: u64,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct KeyRecord {
    key: Vec<u8>,
    versions: Vec<VersionRecord>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct VersionRecord {
    main: i64,
    sub: i64,
    tombstone: bool,
    create_revision: i64,
    version: i64,
    lease: i64,
    /// `SEGMENT_NONE`: the value is `values[value_offset..][..value_bytes]`. Otherwise the value
    /// is in that segment's record at `value_offset` (after its header and key).
    segment: u32,
    value_offset: u64,
    value_bytes: u64,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct LeaseRecord {
    id: i64,
    ttl_s: i64,
}

/// An archive's key count and the sizes that bound its bytes (see
/// `CheckpointSource::serialize_parts_choosing`).
#[derive(Default)]
struct StreamTotals {
    keys: usize,
    key_bytes: usize,
    versions: usize,
    /// Value bytes the archive holds inline (those not in a segment durable at the capture,
    /// or by the time the count reached them).
    inline_bytes: usize,
}

impl StreamTotals {
    fn count(&mut self, key_bytes: usize, versions: usize, inline_bytes: usize) {
        self.keys += 1;
        self.key_bytes += key_bytes;
        self.versions += versions;
        self.inline_bytes += inline_bytes;
    }

    /// An upper bound on the archive's bytes, as `archived_bytes_max` bounds an owned one's.
    fn archived_bytes_max(&self, leases: usize, segments: usize) -> usize {
        use std::mem::{align_of, size_of};
        self.key_bytes
            + self.keys * (size_of::<ArchivedKeyRecord>() + 2 * ARCHIVE_ALIGN_PAD_MAX)
            + self.versions * size_of::<ArchivedVersionRecord>()
            + self.inline_bytes
            + leases * size_of::<ArchivedLeaseRecord>()
            + segments * size_of::<ArchivedSegmentRecord>()
            + size_of::<ArchivedCheckpointData>()
            + 8 * (ARCHIVE_ALIGN_PAD_MAX + align_of::<ArchivedCheckpointData>())
    }
}

#[cfg(test)]
thread_local! {
    /// Counts of `CheckpointSource::count_totals` on this thread (tests).
    static WALKS_COUNTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The most padding rkyv puts before one archived part to align it.
const ARCHIVE_ALIGN_PAD_MAX: usize = 16;

/// A checkpoint as `serialize_parts` archives it: the same archive as a `CheckpointData`'s,
/// its keys read from the index as they are written.
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(
    as = ArchivedCheckpointData,
    serialize_bounds(__S: rkyv::ser::Allocator + rkyv::ser::Writer)
)]
struct CheckpointStream<'a> {
    applied_index: u64,
    current_rev: i64,
    compact_rev: i64,
    // Without the derive's bounds on these two, the compiler reads their archived types
    // through those bounds, not through the impls below, and cannot see they match.
    #[rkyv(omit_bounds)]
    keys: IndexKeys<'a>,
    #[rkyv(omit_bounds)]
    values: InlineValues<'a>,
    leases: Vec<LeaseRecord>,
    #[rkyv(omit_bounds)]
    segments: SegmentRecords<'a>,
}

/// The index's keys (those with a version at or below the captured revision) as an archived
/// `Vec<KeyRecord>`, in one walk that reads the index as it goes: each key's bytes and version
/// records (and its inline values, into `values`) are written when the walk meets it, and the
/// key records that point at them, which rkyv writes after all of them, are resolved from
/// what the walk kept of each key (`KeyShape`), not from a second walk. At millions of keys a
/// walk of the skip list is seconds of cache misses.
struct IndexKeys<'a> {
    source: &'a CheckpointSource,
    /// A delta's base: only the keys that changed since it are archived.
    base: Option<&'a DeltaBase>,
    /// For a delta, the keys the writer wrote since the base (ascending), when it could
    /// say: only those are read. Otherwise the walk goes over the whole index.
    named: Option<&'a [&'a [u8]]>,
    guard: &'a epoch::Guard,
    /// The keys the archive is expected to hold (an estimate: the list of shapes starts at
    /// this capacity).
    keys_expected: usize,
    values: &'a std::cell::RefCell<Vec<u8>>,
    /// Segments durable by the time the walk met a version in them, not at the capture.
    late: &'a std::cell::RefCell<LateSegments>,
    /// The keys the walk archived, once it is done.
    keys_archived: &'a std::cell::Cell<usize>,
}

/// One walk over the index's kept keys.
struct KeptKeys<'a> {
    keys: &'a IndexKeys<'a>,
    entries: Entries<'a>,
}

/// The index entries a walk visits, ascending: all of them, or those of the named keys.
enum Entries<'a> {
    Index(WalkAhead<'a>),
    Named {
        index: &'a crate::index::Index,
        keys: std::slice::Iter<'a, &'a [u8]>,
    },
}

/// How many keys `WalkAhead` reads ahead of the walk: enough that a key's loads, asked for
/// WALK_AHEAD_KEYS / 2 keys before it is reached, have arrived (each key's work is a few
/// hundred nanoseconds, about a memory load), and few enough that the entries held (each
/// pins its skip-list node) stay in the cache. 8 and 32 were not measured apart.
const WALK_AHEAD_KEYS: usize = 16;

/// The index's entries in order, taken from the skip list `WALK_AHEAD_KEYS` ahead of the
/// walk, with the CPU asked to load each one's key and version chunk as it is taken, and its
/// versions halfway through the window (by when its chunk should have arrived). Each of the
/// three is a separate allocation, so a plain walk waits on three cache misses a key, one
/// after another: at millions of keys, most of a checkpoint's time.
struct WalkAhead<'a> {
    entries: crossbeam_skiplist::map::Iter<'a, crate::index::IndexKey, crate::index::KeyHistory>,
    ahead: std::collections::VecDeque<crate::index::IndexEntry<'a>>,
    guard: &'a epoch::Guard,
}

impl<'a> WalkAhead<'a> {
    fn new(index: &'a crate::index::Index, guard: &'a epoch::Guard) -> Self {
        WalkAhead {
            entries: index.iter(),
            ahead: std::collections::VecDeque::with_capacity(WALK_AHEAD_KEYS),
            guard,
        }
    }
}

impl<'a> Iterator for WalkAhead<'a> {
    type Item = crate::index::IndexEntry<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.ahead.len() < WALK_AHEAD_KEYS {
            let Some(entry) = self.entries.next() else {
                break;
            };
            entry.value().prefetch_chunk(self.guard);
            crate::index::prefetch(entry.key().as_ptr());
            self.ahead.push_back(entry);
        }
        if let Some(halfway) = self.ahead.get(WALK_AHEAD_KEYS / 2) {
            halfway.value().prefetch_versions(self.guard);
        }
        self.ahead.pop_front()
    }
}

impl<'a> Entries<'a> {
    fn of(
        index: &'a crate::index::Index,
        named: Option<&'a [&'a [u8]]>,
        guard: &'a epoch::Guard,
    ) -> Self {
        match named {
            None => Entries::Index(WalkAhead::new(index, guard)),
            Some(keys) => Entries::Named {
                index,
                keys: keys.iter(),
            },
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item =
        crossbeam_skiplist::map::Entry<'a, crate::index::IndexKey, crate::index::KeyHistory>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Entries::Index(entries) => entries.next(),
            // A named key compaction removed since is skipped: it has nothing to archive.
            Entries::Named { index, keys } => keys.find_map(|key| index.get(*key)),
        }
    }
}

impl<'a> Iterator for KeptKeys<'a> {
    type Item = KeptKey<'a>;

    fn next(&mut self) -> Option<KeptKey<'a>> {
        for entry in self.entries.by_ref() {
            let list = entry.value().load(self.keys.guard);
            let kept = &list[..list.partition_point(|v| v.main() <= self.keys.source.revision)];
            let versions = self.keys.base.map_or(kept, |b| b.new_versions(kept));
            if !versions.is_empty() {
                return Some(KeptKey {
                    keys: self.keys,
                    entry,
                    versions,
                });
            }
        }
        None
    }
}

impl<'a> IndexKeys<'a> {
    fn walk(&'a self) -> KeptKeys<'a> {
        KeptKeys {
            keys: self,
            entries: Entries::of(&self.source.reader.shared.index, self.named, self.guard),
        }
    }
}

/// One kept key: its index entry and its versions at or below the captured revision.
struct KeptKey<'a> {
    keys: &'a IndexKeys<'a>,
    entry: crossbeam_skiplist::map::Entry<'a, crate::index::IndexKey, crate::index::KeyHistory>,
    versions: &'a [Version],
}

/// What resolving a key's record needs once its bytes and versions are written: their
/// lengths (u32s, so the walk keeps 16 bytes a key, resolver included).
struct KeyShape {
    key_bytes: u32,
    versions: u32,
}

impl rkyv::Archive for KeyShape {
    type Archived = ArchivedKeyRecord;
    type Resolver = KeyRecordResolver;

    fn resolve(&self, resolver: KeyRecordResolver, out: rkyv::Place<ArchivedKeyRecord>) {
        use rkyv::munge::munge;
        munge!(let ArchivedKeyRecord { key, versions } = out);
        rkyv::vec::ArchivedVec::resolve_from_len(self.key_bytes as usize, resolver.key, key);
        rkyv::vec::ArchivedVec::resolve_from_len(
            self.versions as usize,
            resolver.versions,
            versions,
        );
    }
}

impl KeptKey<'_> {
    /// Writes the key's bytes and its version records (its inline values into `values`):
    /// what its record then points at, and the lengths it must give them.
    fn serialize<S>(
        &self,
        serializer: &mut S,
    ) -> std::result::Result<(KeyRecordResolver, KeyShape), S::Error>
    where
        S: rancor::Fallible + rkyv::ser::Allocator + rkyv::ser::Writer + ?Sized,
    {
        let key = self.entry.key();
        let records: Vec<VersionRecord> = {
            let mut values = self.keys.values.borrow_mut();
            // Loaded after this key's list (read by the walk, under the same guard), so it
            // holds every segment the list names: a table loaded before the walk would miss
            // a segment opened since, into which reclaim may have moved one of these values.
            let table = self
                .keys
                .source
                .reader
                .shared
                .segments
                .load(self.keys.guard);
            let mut late = self.keys.late.borrow_mut();
            self.versions
                .iter()
                .map(|v| {
                    self.keys
                        .source
                        .version_record(key, v, table, &mut values, &mut late)
                })
                .collect()
        };
        let resolver = KeyRecordResolver {
            key: rkyv::vec::ArchivedVec::<u8>::serialize_from_slice(key, serializer)?,
            versions: rkyv::vec::ArchivedVec::<ArchivedVersionRecord>::serialize_from_slice(
                &records, serializer,
            )?,
        };
        let shape = KeyShape {
            key_bytes: u32::try_from(key.len()).expect("a key is under 4 GiB"),
            versions: u32::try_from(records.len()).expect("a key has under 2^32 versions"),
        };
        Ok((resolver, shape))
    }
}

/// Where the archived key records start, and how many there are.
struct IndexKeysResolver {
    records: rkyv::vec::VecResolver,
    len: usize,
}

impl rkyv::Archive for IndexKeys<'_> {
    type Archived = rkyv::vec::ArchivedVec<ArchivedKeyRecord>;
    type Resolver = IndexKeysResolver;

    fn resolve(&self, resolver: IndexKeysResolver, out: rkyv::Place<Self::Archived>) {
        rkyv::vec::ArchivedVec::resolve_from_len(resolver.len, resolver.records, out);
    }
}

impl<S> rkyv::Serialize<S> for IndexKeys<'_>
where
    S: rancor::Fallible + rkyv::ser::Allocator + rkyv::ser::Writer + ?Sized,
{
    fn serialize(&self, serializer: &mut S) -> std::result::Result<IndexKeysResolver, S::Error> {
        use rkyv::ser::WriterExt;
        let mut shapes: Vec<(KeyRecordResolver, KeyShape)> = Vec::with_capacity(self.keys_expected);
        for key in self.walk() {
            shapes.push(key.serialize(serializer)?);
        }
        // As `ArchivedVec::serialize_from_iter` writes the elements after their contents.
        let pos = serializer.align_for::<ArchivedKeyRecord>()?;
        let len = shapes.len();
        for (resolver, shape) in shapes {
            // SAFETY: `align_for` aligned the position for the first record, and each record
            // is a whole `ArchivedKeyRecord`, so every one after it starts aligned too; each
            // resolver and shape come from serializing that key's bytes and versions.
            unsafe {
                serializer.resolve_aligned(&shape, resolver)?;
            }
        }
        self.keys_archived.set(len);
        Ok(IndexKeysResolver {
            records: rkyv::vec::VecResolver::from_pos(pos),
            len,
        })
    }
}

/// The values the walk copied inline, archived after the keys (rkyv writes a struct's
/// fields' contents in order, so they are complete by then).
struct InlineValues<'a>(&'a std::cell::RefCell<Vec<u8>>);

impl rkyv::Archive for InlineValues<'_> {
    type Archived = rkyv::vec::ArchivedVec<u8>;
    type Resolver = rkyv::vec::VecResolver;

    fn resolve(&self, resolver: rkyv::vec::VecResolver, out: rkyv::Place<Self::Archived>) {
        rkyv::vec::ArchivedVec::resolve_from_len(self.0.borrow().len(), resolver, out);
    }
}

impl<S> rkyv::Serialize<S> for InlineValues<'_>
where
    S: rancor::Fallible + rkyv::ser::Allocator + rkyv::ser::Writer + ?Sized,
{
    fn serialize(
        &self,
        serializer: &mut S,
    ) -> std::result::Result<rkyv::vec::VecResolver, S::Error> {
        rkyv::vec::ArchivedVec::<u8>::serialize_from_slice(&self.0.borrow(), serializer)
    }
}

/// The segments that became durable after the capture, by id, which the walk found versions
/// in (reclaim moved them there): the archive points into them rather than holding their
/// values inline. Such a segment is durable before the checkpoint is written, and its file
/// stays as long as the checkpoint does: it dies after the capture, and a dead segment's file
/// goes only once every kept checkpoint was captured after its death.
type LateSegments = BTreeMap<u32, DurableSegment>;

/// The archive's segment list: the segments durable at the capture and those the walk found
/// durable later, archived after the keys (rkyv writes a struct's fields' contents in order,
/// so the walk is done by then).
struct SegmentRecords<'a> {
    captured: &'a [DurableSegment],
    late: &'a std::cell::RefCell<LateSegments>,
}

impl SegmentRecords<'_> {
    fn records(&self) -> Vec<SegmentRecord> {
        let late = self.late.borrow();
        let mut all: Vec<DurableSegment> = self.captured.to_vec();
        all.extend(late.values().copied());
        all.sort_unstable_by_key(|d| d.id);
        all.iter()
            .map(|d| SegmentRecord {
                id: d.id,
                record_bytes: d.record_bytes,
                value_bytes: d.value_bytes,
            })
            .collect()
    }
}

impl rkyv::Archive for SegmentRecords<'_> {
    type Archived = rkyv::vec::ArchivedVec<ArchivedSegmentRecord>;
    type Resolver = rkyv::vec::VecResolver;

    fn resolve(&self, resolver: rkyv::vec::VecResolver, out: rkyv::Place<Self::Archived>) {
        // The late segments are never among the captured ones (see `version_record`).
        let len = self.captured.len() + self.late.borrow().len();
        rkyv::vec::ArchivedVec::resolve_from_len(len, resolver, out);
    }
}

impl<S> rkyv::Serialize<S> for SegmentRecords<'_>
where
    S: rancor::Fallible + rkyv::ser::Allocator + rkyv::ser::Writer + ?Sized,
{
    fn serialize(
        &self,
        serializer: &mut S,
    ) -> std::result::Result<rkyv::vec::VecResolver, S::Error> {
        rkyv::vec::ArchivedVec::<ArchivedSegmentRecord>::serialize_from_slice(
            &self.records(),
            serializer,
        )
    }
}

/// A full checkpoint as a delta taken against it names it: its applied index and revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaBase {
    applied_index: u64,
    revision: i64,
}

impl DeltaBase {
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The versions of a key (those at or below the delta's revision) that the base does not
    /// hold: those newer than it. A key's list only grows at its end, and loses only its
    /// oldest versions to compaction, which a restore redoes, so the base's list and these
    /// make the key's list. A value reclaim moved since is still where the base points (the
    /// base keeps every segment file it names, and a restored store reclaims that segment
    /// again), and one the base holds inline is there.
    fn new_versions<'v>(&self, versions: &'v [Version]) -> &'v [Version] {
        &versions[versions.partition_point(|v| v.main() <= self.revision)..]
    }
}

/// What a checkpoint image is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointKind {
    /// A whole store: a restore needs nothing else, and deltas may be taken against it.
    Full(DeltaBase),
    /// A whole store with every value inline (format 1): no delta is taken against it.
    Inline,
    /// The changes since the full checkpoint this names: a restore needs that one too.
    Delta(DeltaBase),
}

/// What `image` is (see [`CheckpointKind`]). Checks the frame and reads only the archive's
/// header and segment list.
pub fn checkpoint_kind(image: &[u8]) -> Result<CheckpointKind> {
    let payload = validated_payload(image)?;
    if let Some(base) = payload.base {
        return Ok(CheckpointKind::Delta(DeltaBase {
            applied_index: base.applied_index,
            revision: base.revision,
        }));
    }
    if payload.format == FORMAT_VERSION_INLINE {
        return Ok(CheckpointKind::Inline);
    }
    let data = rkyv::access::<ArchivedCheckpointData, rancor::Error>(&payload.aligned)
        .map_err(|_| damaged("archive failed validation"))?;
    Ok(CheckpointKind::Full(DeltaBase {
        applied_index: data.applied_index.to_native(),
        revision: data.current_rev.to_native(),
    }))
}

/// A delta's reference to its base, as its payload starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BaseRef {
    applied_index: u64,
    revision: i64,
}

impl BaseRef {
    fn bytes(self) -> [u8; DELTA_PREFIX_BYTES] {
        let mut out = [0u8; DELTA_PREFIX_BYTES];
        out[..8].copy_from_slice(&self.applied_index.to_le_bytes());
        out[8..].copy_from_slice(&self.revision.to_le_bytes());
        out
    }
}

/// Everything a checkpoint needs, captured on the writer in O(leases); the expensive part,
/// [`CheckpointSource::serialize`], reads the lock-free index and can run on any thread while the
/// writer keeps applying, so a checkpoint never pauses the raft core for long.
pub struct CheckpointSource {
    reader: Reader,
    /// The revision captured: versions above it (applied later) are left out.
    revision: i64,
    compact_rev: i64,
    applied_index: u64,
    leases: Vec<(i64, i64)>,
    /// Durable segments at the capture, `(id, record_bytes)` ascending: versions in them are
    /// written as pointers, as are those in segments durable by the time the archive reaches
    /// them (see `version_record`); every other value inline.
    durable_segments: Vec<DurableSegment>,
    /// The keys written since a delta base, when the writer could name them.
    dirty: Option<crate::dirty::DirtyList>,
    /// The index's keys and versions at the capture: a full checkpoint's size, without a walk.
    keys_held: usize,
    versions_held: u64,
    /// The bytes of the index's keys at the capture, each once.
    key_bytes_held: u64,
    /// Live value bytes in segments not durable at the capture: what a checkpoint may hold
    /// inline.
    undurable_value_bytes: u64,
    /// What the writer wrote since the delta base's capture, when it still knew the base (it
    /// remembers the latest `BASE_CAPTURES_KEPT` captures): bounds a delta without a walk.
    written_since_base: Option<crate::store::IndexWrites>,
}

impl Writer {
    /// Serializes the whole store on the writer's thread: exactly the applied state.
    pub fn checkpoint(&self) -> Vec<u8> {
        self.checkpoint_source()
            .serialize()
            .expect("no compaction can start while the writer is borrowed")
    }

    /// Captures what a checkpoint of the current applied state needs; serialize it elsewhere.
    pub fn checkpoint_source(&self) -> CheckpointSource {
        self.capture(None)
    }

    /// As `checkpoint_source`, for the checkpoints that a server keeps: one that may be a
    /// delta against `base`, and may become the base of later deltas itself. The capture
    /// then also copies the keys written since `base` (O(those keys), on this thread), so a
    /// delta reads only their lists, and from now on compaction keeps what a delta against
    /// this capture needs (see `Writer::set_delta_base_revision`).
    pub fn checkpoint_source_against(&mut self, base: Option<&DeltaBase>) -> CheckpointSource {
        // Every capture at one revision then sees the same counts: none is taken mid-entry.
        self.assert_not_stepping();
        self.may_become_base(self.current_rev);
        if self.base_captures.len() == crate::store::BASE_CAPTURES_KEPT {
            self.base_captures.pop_front();
        }
        self.base_captures
            .push_back((self.current_rev, self.writes));
        let mut source = self.capture(base.and_then(|b| self.dirty.since_base(b.revision)));
        source.written_since_base = base.and_then(|b| {
            self.base_captures
                .iter()
                .find(|(rev, _)| *rev == b.revision)
                .map(|(_, then)| self.writes.since(then))
        });
        source
    }

    fn capture(&self, dirty: Option<crate::dirty::DirtyList>) -> CheckpointSource {
        // Not in the middle of an entry applied in steps: its tombstones are past the image's
        // revision, but the counts captured here (keys, versions held) and the dirty keys a
        // delta reads already include them.
        self.assert_not_stepping();
        let durable_segments = self.vlog.durable_segments();
        CheckpointSource {
            reader: self.reader(),
            revision: self.current_rev,
            compact_rev: self.compact_rev,
            applied_index: self.applied_index,
            leases: self.leases.iter().map(|(id, e)| (*id, e.ttl_s)).collect(),
            durable_segments,
            dirty,
            keys_held: self.shared.index.len(),
            versions_held: self.versions_held,
            key_bytes_held: self.key_bytes_held,
            undurable_value_bytes: self.vlog.undurable_live_bytes(),
            written_since_base: None,
        }
    }
}

impl CheckpointSource {
    /// The raft index the checkpoint covers: replay the WAL after it.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Maintenance.Hash: CRC-32 (IEEE) of the whole captured store, every revision it keeps and not
    /// only those up to one revision as HashKV does. In order: every version with
    /// `main <= revision()` that the compaction at the captured compact revision keeps, key by key
    /// ascending and revision by revision ascending (the bytes HashKV hashes per version), then the
    /// lease count (u64) and each lease's id and TTL ascending by id (a lease's keys are already in
    /// the versions' lease fields), then the revision and the compact revision (i64s, little-endian).
    ///
    /// The applied index is left out, as etcd leaves its consistent index out: entries that change
    /// nothing (empty entries, membership) must not change the hash. Versions a compaction drops are
    /// skipped whether or not the background compaction has removed them yet, so two members that
    /// applied the same entries answer the same hash at any point of their compaction.
    ///
    /// Fails with `Compacted`, like [`CheckpointSource::serialize`], when a newer compaction started
    /// meanwhile (its trimming could have reached lists this scan read); take a new source and retry.
    pub fn hash(&self) -> Result<u32> {
        assert!(
            self.leases.windows(2).all(|w| w[0].0 < w[1].0),
            "leases are captured ascending by id, so every member hashes them in one order"
        );
        let guard = epoch::pin();
        let mut hasher = crc32fast::Hasher::new();
        for entry in WalkAhead::new(&self.reader.shared.index, &guard) {
            let versions = entry.value().load(&guard);
            let kept = &versions[compacted_start(versions, self.compact_rev)..];
            for v in kept.iter().take_while(|v| v.main() <= self.revision) {
                hash_version(
                    &mut hasher,
                    entry.key(),
                    v,
                    self.reader.shared.segments.load(&guard),
                );
            }
        }
        if self.reader.compact_revision() != self.compact_rev {
            return Err(KvError::Compacted);
        }
        hasher.update(&(self.leases.len() as u64).to_le_bytes());
        for (id, ttl_s) in &self.leases {
            hasher.update(&id.to_le_bytes());
            hasher.update(&ttl_s.to_le_bytes());
        }
        hasher.update(&self.revision.to_le_bytes());
        hasher.update(&self.compact_rev.to_le_bytes());
        Ok(hasher.finalize())
    }

    /// Builds the framed archive. Fails with `Compacted` when a compaction newer than the captured
    /// one started meanwhile (its trimming would make the archive disagree with `applied_index`);
    /// take a new source and retry.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        self.serialize_parts().map(|parts| parts.to_vec())
    }

    /// As `serialize`, with the image in its two parts (see [`ImageParts`]). The archive is
    /// written straight from the index into one buffer sized for it: no owned copy of the keys
    /// and their version lists is made (at 4M keys that copy was about 500 MB, held beside the
    /// archive at the peak of every checkpoint).
    pub fn serialize_parts(&self) -> Result<ImageParts> {
        self.serialize_parts_against(None)
    }

    /// This capture as the base of later deltas, were it written in full.
    pub fn delta_base(&self) -> DeltaBase {
        DeltaBase {
            applied_index: self.applied_index,
            revision: self.revision,
        }
    }

    /// As `serialize_parts`, or an incremental checkpoint against `base` (a full checkpoint
    /// at or below this capture) when that is at most `1/DELTA_SHARE_MAX` of the full one's
    /// size: a store whose writes go to a small share of its keys then writes and fsyncs that
    /// share, not the whole index, at each checkpoint. [`ImageParts::delta_of`] says which.
    pub fn serialize_parts_against(&self, base: Option<&DeltaBase>) -> Result<ImageParts> {
        self.serialize_parts_choosing(base, false)
    }

    /// A delta against `base` whatever its size (simulations, which keep few keys, exercise
    /// deltas through it); a full checkpoint only when `base` is this capture's own index.
    pub fn serialize_delta_parts(&self, base: &DeltaBase) -> Result<ImageParts> {
        self.serialize_parts_choosing(Some(base), true)
    }

    fn serialize_parts_choosing(
        &self,
        base: Option<&DeltaBase>,
        always_delta: bool,
    ) -> Result<ImageParts> {
        let base = base.filter(|b| {
            assert!(
                b.applied_index <= self.applied_index && b.revision <= self.revision,
                "a delta's base is older than the delta"
            );
            b.applied_index < self.applied_index
        });
        let guard = epoch::pin();
        // The keys the writer named as written since the base, when it could: a delta reads
        // only their lists, where a walk reads every key's.
        let named: Option<Vec<&[u8]>> = base
            .and_then(|b| self.dirty.as_ref().filter(|d| d.base_rev() <= b.revision))
            .map(|d| d.sorted());
        // The sizes, before the one walk that writes the archive: how many keys it holds and
        // bounds on its bytes, to choose a delta or a full checkpoint and to size the buffer.
        // A full checkpoint's come from the writer's counts at the capture. A delta's are
        // counted over its named keys; or bounded by what the writer wrote since its base;
        // or, when the writer no longer knew that (a base older than the captures it
        // remembers, or from before a restart), or when that bound is too loose to trust a
        // refusal by (keys written more than once, or compacted, since the base), counted by
        // a walk, unless the versions written since, less those compacted, already make the
        // delta too large (`delta_never_small`). Each walk over millions of keys takes
        // seconds.
        let (leases, segments) = (self.leases.len(), self.durable_segments.len());
        let full_max = self.full_totals_max();
        let small_enough = |delta: &StreamTotals| {
            // The full archive holds at least the delta's inline values; most of its own may
            // be pointers, so the comparison leaves the rest out and errs towards a full one.
            let full_min = StreamTotals {
                inline_bytes: delta.inline_bytes,
                ..full_max
            };
            always_delta
                || delta.archived_bytes_max(leases, segments) * DELTA_SHARE_MAX
                    <= full_min.archived_bytes_max(leases, segments)
        };
        let delta = base.map(|b| match (&named, self.written_since_base) {
            (Some(keys), _) => self.count_totals(&guard, Some(keys), b),
            (None, Some(written)) => {
                let bound = self.delta_totals_max(&written);
                let exact =
                    written.keys_created == written.versions_added && written.versions_dropped == 0;
                if exact || small_enough(&bound) || self.delta_never_small(&written) {
                    // When even the least the delta can hold is too large, the bound is
                    // refused below as the count would be, without the walk: where every
                    // key is written between checkpoints, the walk cost 9 % of each one.
                    bound
                } else {
                    self.count_totals(&guard, None, b)
                }
            }
            (None, None) => self.count_totals(&guard, None, b),
        });
        let delta = delta.filter(small_enough);
        let base = base.filter(|_| delta.is_some());
        let named = named.filter(|_| base.is_some());
        let totals = delta.unwrap_or(full_max);
        let values = std::cell::RefCell::new(Vec::with_capacity(totals.inline_bytes));
        let late = std::cell::RefCell::new(LateSegments::new());
        let keys_archived = std::cell::Cell::new(0usize);
        let stream = CheckpointStream {
            applied_index: self.applied_index,
            current_rev: self.revision,
            compact_rev: self.compact_rev,
            keys: IndexKeys {
                source: self,
                base,
                named: named.as_deref(),
                guard: &guard,
                keys_expected: totals.keys,
                values: &values,
                late: &late,
                keys_archived: &keys_archived,
            },
            values: InlineValues(&values),
            leases: self.lease_records(),
            segments: SegmentRecords {
                captured: &self.durable_segments,
                late: &late,
            },
        };
        let bound = totals.archived_bytes_max(stream.leases.len(), self.durable_segments.len());
        let base_ref = base.map(|b| BaseRef {
            applied_index: b.applied_index,
            revision: b.revision,
        });
        // A delta's prefix goes first in the buffer. rkyv places the archive after what the
        // buffer holds, aligning each part to the buffer's start; the prefix is a whole
        // alignment unit, so the archive read from after it is laid out as if on its own.
        let prefix = base_ref.map_or(0, |_| DELTA_PREFIX_BYTES);
        const _: () = assert!(DELTA_PREFIX_BYTES.is_multiple_of(PAYLOAD_ALIGN_BYTES));
        // Capacity the archive does not reach is never touched, so it costs address space,
        // not memory.
        let mut buffer =
            rkyv::util::AlignedVec::<PAYLOAD_ALIGN_BYTES>::with_capacity(prefix + bound);
        if let Some(b) = base_ref {
            buffer.extend_from_slice(&b.bytes());
        }
        let payload = rkyv::api::high::to_bytes_in::<_, rancor::Error>(&stream, buffer)
            .expect("serializing plain data into memory cannot fail");
        if self.reader.compact_revision() != self.compact_rev {
            // A compaction trimmed lists during the walk: the archive is not one state.
            return Err(KvError::Compacted);
        }
        // Reclaim may move a value out of a durable segment between the capture and the walk
        // (into the open segment, in memory): the archive then holds it inline, past the
        // bound by its bytes, and the buffer grew to take them; and the walk may find values
        // in segments that became durable after the capture, each listed once. The values are
        // the same, so the image is still one state. Nothing else may pass the bound: past
        // it, the writer's counts (which the quota and the status's size read too) are wrong.
        let inline_moved = values.borrow().len().saturating_sub(totals.inline_bytes);
        let late_listed = late.borrow().len() * std::mem::size_of::<ArchivedSegmentRecord>();
        assert!(
            payload.len() <= prefix + bound + inline_moved + late_listed + PAYLOAD_ALIGN_BYTES,
            "the archive fits the bound it was sized for, plus the values reclaim moved inline \
             and the segments that became durable"
        );
        let format = if base_ref.is_some() {
            FORMAT_VERSION_DELTA
        } else {
            FORMAT_VERSION
        };
        Ok(ImageParts {
            header: frame_header(format, keys_archived.get() as u64, &payload),
            payload,
            delta_of: base_ref.map(|b| b.applied_index),
        })
    }

    /// Bounds on a full checkpoint's sizes from the writer's counts at the capture, without a
    /// walk: keys created after it are left out and compaction only removes, so the walk finds
    /// at most these keys, their bytes and versions; values inline are those of segments not
    /// durable at the capture (plus any reclaim moves meanwhile, which the bound's check
    /// allows for).
    fn full_totals_max(&self) -> StreamTotals {
        StreamTotals {
            keys: self.keys_held,
            key_bytes: self.key_bytes_held as usize,
            versions: self.versions_held as usize,
            inline_bytes: self.undurable_value_bytes as usize,
        }
    }

    /// Bounds on a delta's sizes when the writer did `written` since its base: at most the
    /// versions added since (every version newer than the base was), of at most as many keys,
    /// whose bytes are at most the key bytes added; none of them more than the full store's.
    /// Exact when each of those versions created a key and compaction dropped none.
    fn delta_totals_max(&self, written: &crate::store::IndexWrites) -> StreamTotals {
        let full = self.full_totals_max();
        let versions = (written.versions_added as usize).min(full.versions);
        StreamTotals {
            keys: versions.min(full.keys),
            key_bytes: (written.key_bytes_added as usize).min(full.key_bytes),
            versions,
            inline_bytes: full.inline_bytes,
        }
    }

    /// Whether a delta against a base the writer did `written` since is too large to write
    /// whatever its exact counts: it holds at least the versions added since, less those
    /// compaction dropped (every version added since is newer than the base, and only
    /// compaction removes one), and `small_enough` refuses a delta whose version records
    /// alone pass `1/DELTA_SHARE_MAX` of the full archive without values (its inline values
    /// count on both sides, and four times on the delta's).
    fn delta_never_small(&self, written: &crate::store::IndexWrites) -> bool {
        let versions_min = written
            .versions_added
            .saturating_sub(written.versions_dropped) as usize;
        let full_without_values_bytes = StreamTotals {
            inline_bytes: 0,
            ..self.full_totals_max()
        }
        .archived_bytes_max(self.leases.len(), self.durable_segments.len());
        versions_min * std::mem::size_of::<ArchivedVersionRecord>() * DELTA_SHARE_MAX
            > full_without_values_bytes
    }

    /// Counts what a delta against `base` holds: each kept key's versions newer than the
    /// base, over the `named` keys only, or the whole index.
    fn count_totals(
        &self,
        guard: &epoch::Guard,
        named: Option<&[&[u8]]>,
        base: &DeltaBase,
    ) -> StreamTotals {
        #[cfg(test)]
        WALKS_COUNTED.with(|walks| walks.set(walks.get() + 1));
        let mut delta = StreamTotals::default();
        for entry in Entries::of(&self.reader.shared.index, named, guard) {
            let list = entry.value().load(guard);
            let kept = &list[..list.partition_point(|v| v.main() <= self.revision)];
            let new = base.new_versions(kept);
            if new.is_empty() {
                continue;
            }
            // Loaded after the list, as the walk loads it (see `KeptKey::serialize`).
            let table = self.reader.shared.segments.load(guard);
            let inline_bytes = new
                .iter()
                .filter(|v| v.segment != SEGMENT_NONE && self.durable(v.segment, table).is_none())
                .map(|v| v.value_len())
                .sum::<usize>();
            delta.count(entry.key().len(), new.len(), inline_bytes);
        }
        delta
    }

    /// How many times this thread counted a delta by `count_totals` (tests).
    #[cfg(test)]
    pub(crate) fn walks_counted() -> u64 {
        WALKS_COUNTED.with(std::cell::Cell::get)
    }

    /// Whether the capture names the keys written since its base (tests).
    #[cfg(test)]
    pub(crate) fn names_keys(&self) -> bool {
        self.dirty.is_some()
    }

    /// The bound a full checkpoint's buffer is sized by (tests).
    #[cfg(test)]
    pub(crate) fn full_archive_bytes_max(&self) -> usize {
        self.full_totals_max()
            .archived_bytes_max(self.leases.len(), self.durable_segments.len())
    }

    /// The versions written since the delta base, when the writer knew (tests).
    #[cfg(test)]
    pub(crate) fn versions_since_base(&self) -> Option<u64> {
        self.written_since_base.map(|w| w.versions_added)
    }

    /// Where a value in `segment` may be pointed at: the segment as the capture listed it
    /// (`late` false), or as `table` lists it when it became durable since (`late` true; a
    /// segment reclaim opened after the capture, or one sealed but not yet written then).
    /// None when its file is not durable yet: the value goes inline.
    fn durable(
        &self,
        segment: u32,
        table: &crate::segments::SegmentTable,
    ) -> Option<(DurableSegment, bool)> {
        match self
            .durable_segments
            .binary_search_by_key(&segment, |d| d.id)
        {
            Ok(at) => Some((self.durable_segments[at], false)),
            Err(_) => table.durable(segment).map(|d| (d, true)),
        }
    }

    /// `v` (of `key`) as the archive records it: a pointer into its segment when that
    /// segment's file is durable (listing it in `late` when it was not at the capture), else
    /// its value copied (checked) to the end of `values`. Pointing into a segment that became
    /// durable after the capture keeps the values reclaim moves meanwhile out of the archive:
    /// right after a large delete and compaction those were most of the live values, and a
    /// checkpoint that held them inline grew past a gigabyte.
    fn version_record(
        &self,
        key: &[u8],
        v: &Version,
        table: &crate::segments::SegmentTable,
        values: &mut Vec<u8>,
        late: &mut LateSegments,
    ) -> VersionRecord {
        let durable = (v.segment != SEGMENT_NONE)
            .then(|| self.durable(v.segment, table))
            .flatten();
        let (segment, value_offset) = if let Some((segment, is_late)) = durable {
            if is_late {
                late.insert(segment.id, segment);
            }
            (v.segment, u64::from(v.offset))
        } else {
            let at = values.len() as u64;
            values.extend_from_slice(&v.value(key, table));
            (SEGMENT_NONE, at)
        };
        VersionRecord {
            main: v.main(),
            sub: v.rev().sub,
            tombstone: v.kind() == VersionKind::Tombstone,
            create_revision: v.create_revision,
            version: v.version,
            lease: v.lease,
            segment,
            value_offset,
            value_bytes: v.value_len() as u64,
        }
    }

    fn lease_records(&self) -> Vec<LeaseRecord> {
        self.leases
            .iter()
            .map(|(id, ttl_s)| LeaseRecord {
                id: *id,
                ttl_s: *ttl_s,
            })
            .collect()
    }

    /// The compact revision captured.
    pub fn compact_revision(&self) -> i64 {
        self.compact_rev
    }

    /// The leases captured, `(id, ttl_s)` ascending by id.
    pub fn leases(&self) -> &[(i64, i64)] {
        &self.leases
    }

    /// Visits every version an export keeps, in revision order: those with
    /// `main <= revision()` that the compaction at the captured compact revision keeps (whether
    /// or not the background compaction has trimmed the rest yet), as etcd's key bucket holds
    /// them. Memory: one 24-byte entry per version and a handle per key, never a value (each
    /// visit shares the value-log slice). Fails with `Compacted` as [`Self::serialize`] does,
    /// before visiting anything; stops at `f`'s first error.
    pub fn for_each_by_revision(
        &self,
        f: &mut dyn FnMut(ExportVersion) -> Result<()>,
    ) -> Result<()> {
        // The pinned guard keeps every list loaded here alive (the writer replaces lists
        // copy-on-write), so the visits read exactly what this pass saw.
        let guard = epoch::pin();
        let mut keys = Vec::new();
        let mut order: Vec<(Revision, u32, u32)> = Vec::new();
        for entry in WalkAhead::new(&self.reader.shared.index, &guard) {
            let versions = entry.value().load(&guard);
            let start = compacted_start(versions, self.compact_rev);
            let kept = &versions[start..];
            let kept = &kept[..kept.partition_point(|v| v.main() <= self.revision)];
            if kept.is_empty() {
                continue;
            }
            let key_index = u32::try_from(keys.len()).expect("fewer than 2^32 keys");
            for (i, v) in kept.iter().enumerate() {
                order.push((v.rev(), key_index, i as u32));
            }
            // A copy: a clone would give the index's key a shared header for good.
            keys.push((Bytes::copy_from_slice(entry.key()), kept));
        }
        if self.reader.compact_revision() != self.compact_rev {
            return Err(KvError::Compacted);
        }
        order.sort_unstable_by_key(|(rev, _, _)| *rev);
        assert!(
            order.windows(2).all(|w| w[0].0 < w[1].0),
            "every version has its own revision"
        );
        for (_, key_index, version_index) in order {
            let (key, versions) = &keys[key_index as usize];
            let v = &versions[version_index as usize];
            f(ExportVersion {
                key: key.clone(),
                rev: v.rev(),
                tombstone: v.kind() == VersionKind::Tombstone,
                create_revision: v.create_revision,
                version: v.version,
                lease: v.lease,
                value: v.value(key, self.reader.shared.segments.load(&guard)),
            })?;
        }
        Ok(())
    }

    /// [`Self::for_each_by_revision`], collected (tests and small stores).
    pub fn versions_by_revision(&self) -> Result<Vec<ExportVersion>> {
        let mut out = Vec::new();
        self.for_each_by_revision(&mut |v| {
            out.push(v);
            Ok(())
        })?;
        Ok(out)
    }
}

/// One version of one key, as an export writes it or an import reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportVersion {
    pub key: Bytes,
    pub rev: Revision,
    pub tombstone: bool,
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
    pub value: Bytes,
}

/// Builds a checkpoint image (what [`Store::restore`] reads) from imported versions in any
/// order, e.g. an etcd snapshot's key bucket. The image is validated by restoring it, so a
/// version list etcd could not have written (a key on an unknown lease, revisions above
/// `current_rev`) is refused here rather than at the member's start.
pub fn image_from_versions(
    applied_index: u64,
    current_rev: i64,
    compact_rev: i64,
    mut leases: Vec<(i64, i64)>,
    mut versions: Vec<ExportVersion>,
) -> Result<Vec<u8>> {
    versions.sort_unstable_by(|a, b| a.key.cmp(&b.key).then(a.rev.cmp(&b.rev)));
    leases.sort_unstable();
    let mut keys: Vec<KeyRecord> = Vec::new();
    // Sized once: growing by doubling would hold two copies of every value at each step.
    let mut values = Vec::with_capacity(versions.iter().map(|v| v.value.len()).sum());
    for v in versions {
        if keys
            .last()
            .is_none_or(|k| k.key.as_slice() != v.key.as_ref())
        {
            keys.push(KeyRecord {
                key: v.key.to_vec(),
                versions: Vec::new(),
            });
        }
        let value_offset = values.len() as u64;
        values.extend_from_slice(&v.value);
        keys.last_mut()
            .expect("pushed above")
            .versions
            .push(VersionRecord {
                main: v.rev.main,
                sub: v.rev.sub,
                tombstone: v.tombstone,
                create_revision: v.create_revision,
                version: v.version,
                lease: v.lease,
                segment: SEGMENT_NONE,
                value_offset,
                value_bytes: v.value.len() as u64,
            });
    }
    let data = CheckpointData {
        applied_index,
        current_rev,
        compact_rev,
        keys,
        values,
        leases: leases
            .into_iter()
            .map(|(id, ttl_s)| LeaseRecord { id, ttl_s })
            .collect(),
        segments: Vec::new(),
    };
    let image = frame(&data);
    // The archive holds a copy of every value: free the first before the check restores a third.
    drop(data);
    let image = image.to_vec();
    restore(
        &image,
        None,
        ValueLogOptions::default(),
        &mut no_segment_files,
        RestoreHelpers::NONE,
    )?;
    Ok(image)
}

/// The framed archive of `data` (see the module's description).
fn frame(data: &CheckpointData) -> ImageParts {
    // The buffer is sized for the whole archive up front: grown by doubling, a 416 MB archive
    // (4M keys) would pass through a 256 MB buffer and a copy into a 512 MB one, both held at
    // once at the peak of every checkpoint.
    let buffer =
        rkyv::util::AlignedVec::<PAYLOAD_ALIGN_BYTES>::with_capacity(archived_bytes_max(data));
    let payload = rkyv::api::high::to_bytes_in::<_, rancor::Error>(data, buffer)
        .expect("serializing plain data into memory cannot fail");
    ImageParts {
        header: frame_header(FORMAT_VERSION, data.keys.len() as u64, &payload),
        payload,
        delta_of: None,
    }
}

/// An upper bound on the bytes of `data`'s archive: each archived part's size plus the most
/// alignment padding it can need.
fn archived_bytes_max(data: &CheckpointData) -> usize {
    use std::mem::{align_of, size_of};
    const ALIGN_PAD_MAX: usize = ARCHIVE_ALIGN_PAD_MAX;
    let version_bytes = size_of::<ArchivedVersionRecord>();
    let keys: usize = data
        .keys
        .iter()
        .map(|k| k.key.len() + k.versions.len() * version_bytes + 2 * ALIGN_PAD_MAX)
        .sum();
    keys + data.keys.len() * size_of::<ArchivedKeyRecord>()
        + data.values.len()
        + data.leases.len() * size_of::<ArchivedLeaseRecord>()
        + data.segments.len() * size_of::<ArchivedSegmentRecord>()
        + size_of::<ArchivedCheckpointData>()
        + 8 * (ALIGN_PAD_MAX + align_of::<ArchivedCheckpointData>())
}

/// A framed checkpoint as its two parts, the header and the archive, which make the image when
/// written one after the other: a multi-GiB image is written from where rkyv put it, never
/// copied into one buffer first.
pub struct ImageParts {
    header: [u8; HEADER_BYTES],
    payload: rkyv::util::AlignedVec<PAYLOAD_ALIGN_BYTES>,
    /// A delta's base: the applied index of the full checkpoint it needs.
    delta_of: Option<u64>,
}

impl ImageParts {
    /// For a delta, the applied index of its base (None: a full checkpoint).
    pub fn delta_of(&self) -> Option<u64> {
        self.delta_of
    }

    /// The parts, in file order.
    pub fn parts(&self) -> [&[u8]; 2] {
        [&self.header, &self.payload]
    }

    /// The image as one buffer (tests, tools, and images small enough not to matter).
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts().concat()
    }
}

/// The header for an archive `payload` of `format`.
fn frame_header(format: u32, key_count: u64, payload: &[u8]) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&format.to_le_bytes());
    out[12..16].copy_from_slice(&0u32.to_le_bytes());
    out[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    out[24..32].copy_from_slice(&key_count.to_le_bytes());
    out[32..36].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let header_crc = crc32fast::hash(&out[..36]);
    out[36..40].copy_from_slice(&header_crc.to_le_bytes());
    out
}

/// The header for an archive `payload` of `format`, then the payload.
#[cfg(test)]
fn frame_payload(format: u32, key_count: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&frame_header(format, key_count, payload));
    out.extend_from_slice(payload);
    out
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn damaged(why: &'static str) -> KvError {
    KvError::CheckpointDamaged(why)
}

/// Where a restore finds the durable value-log segments a checkpoint points into: the file of
/// segment `id` (mapped; its bytes are shared, never copied), or why it cannot be used.
pub type SegmentFiles<'a> = dyn FnMut(u32) -> std::result::Result<Bytes, String> + 'a;

/// For images that must not point into segment files (every value inline).
pub(crate) fn no_segment_files(id: u32) -> std::result::Result<Bytes, String> {
    Err(format!(
        "an inline image refers to value-log segment {id}, which only its own member's disk holds"
    ))
}

/// The value-log segments a checkpoint points into (none for format 1 and inline images):
/// what a restart must keep. Checks the frame and the archive, and reads only the list: no
/// key and no value is restored.
pub fn checkpoint_segments(image: &[u8]) -> Result<Vec<u32>> {
    let Payload {
        format,
        segment_shift,
        aligned,
        ..
    } = validated_payload(image)?;
    if format == FORMAT_VERSION_INLINE {
        return Ok(Vec::new());
    }
    let data = rkyv::access::<ArchivedCheckpointData, rancor::Error>(&aligned)
        .map_err(|_| damaged("archive failed validation"))?;
    let ids: Vec<u32> = durable_segments_of(data, segment_shift)
        .iter()
        .map(|d| d.id)
        .collect();
    if ids.iter().any(|&id| id >= SEGMENT_NONE - 1) {
        return Err(damaged("a segment id out of range or listed twice"));
    }
    Ok(ids)
}

/// rkyv's archive needs this alignment: the archived types hold u64s, and the copy a
/// misaligned payload gets is aligned to it.
pub const PAYLOAD_ALIGN_BYTES: usize = 16;

/// A checkpoint's payload after its frame checked out, where rkyv can read it: the caller's
/// own bytes when they are aligned (a checkpoint file lays its payload out so, and a mapping
/// starts on a page), else an aligned copy.
struct Payload<'a> {
    /// The format without `FORMAT_SEGMENT_SHIFTED`.
    format: u32,
    /// Added to every segment id the archive names (see `shifted_id`).
    segment_shift: u32,
    key_count: u64,
    /// A delta's base (format 3).
    base: Option<BaseRef>,
    /// The archive (after a delta's prefix).
    aligned: AlignedPayload<'a>,
}

enum AlignedPayload<'a> {
    /// The caller's bytes, aligned already: a restart reads a mapped file with no copy of it.
    Borrowed(&'a [u8]),
    Copied(rkyv::util::AlignedVec<PAYLOAD_ALIGN_BYTES>),
}

impl std::ops::Deref for AlignedPayload<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            AlignedPayload::Borrowed(bytes) => bytes,
            AlignedPayload::Copied(copy) => copy,
        }
    }
}

fn aligned_copy(bytes: &[u8]) -> rkyv::util::AlignedVec<PAYLOAD_ALIGN_BYTES> {
    let mut aligned = rkyv::util::AlignedVec::<PAYLOAD_ALIGN_BYTES>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    aligned
}

/// The header of `image`, checked (length, magic, crc), as its format (without the shift
/// flag) and segment id shift.
fn checked_header(image: &[u8]) -> Result<(u32, u32)> {
    if image.len() < HEADER_BYTES {
        return Err(damaged("shorter than the header"));
    }
    if image[..8] != MAGIC {
        return Err(damaged("bad magic"));
    }
    if crc32fast::hash(&image[..36]) != le_u32(image, 36) {
        return Err(damaged("header crc mismatch"));
    }
    header_format(image)
}

fn validated_payload(bytes: &[u8]) -> Result<Payload<'_>> {
    let (format, segment_shift) = checked_header(bytes)?;
    let payload_bytes = le_u64(bytes, 16);
    let key_count = le_u64(bytes, 24);
    if (bytes.len() - HEADER_BYTES) as u64 != payload_bytes {
        return Err(damaged("length does not match the header"));
    }
    let payload = &bytes[HEADER_BYTES..];
    if crc32fast::hash(payload) != le_u32(bytes, 32) {
        return Err(damaged("payload crc mismatch"));
    }
    let (base, payload) = if format == FORMAT_VERSION_DELTA {
        if payload.len() < DELTA_PREFIX_BYTES {
            return Err(damaged("a delta shorter than its base reference"));
        }
        let base = BaseRef {
            applied_index: le_u64(payload, 0),
            revision: le_u64(payload, 8) as i64,
        };
        (Some(base), &payload[DELTA_PREFIX_BYTES..])
    } else {
        (None, payload)
    };
    // A copy of a 4M-key image costs as much memory again, and the kernel's zeroing of it
    // was most of a restart: read the caller's bytes in place where rkyv can.
    let aligned = if (payload.as_ptr() as usize).is_multiple_of(PAYLOAD_ALIGN_BYTES) {
        AlignedPayload::Borrowed(payload)
    } else {
        AlignedPayload::Copied(aligned_copy(payload))
    };
    Ok(Payload {
        format,
        segment_shift,
        key_count,
        base,
        aligned,
    })
}

/// A checked header's format (without the shift flag) and segment id shift.
fn header_format(header: &[u8]) -> Result<(u32, u32)> {
    let field = le_u32(header, 8);
    let format = field & !FORMAT_SEGMENT_SHIFTED;
    if ![FORMAT_VERSION, FORMAT_VERSION_INLINE, FORMAT_VERSION_DELTA].contains(&format) {
        return Err(damaged("unknown format version"));
    }
    let shift = le_u32(header, 12);
    match (field & FORMAT_SEGMENT_SHIFTED != 0, shift) {
        (false, 0) => Ok((format, 0)),
        (false, _) => Err(damaged("a segment id shift in a header that has none")),
        (true, 0) => Err(damaged("a shifted header without its shift")),
        (true, _) if format == FORMAT_VERSION_INLINE => {
            Err(damaged("a segment id shift in an image with no segments"))
        }
        (true, shift) => Ok((format, shift)),
    }
}

/// A segment id as an archive names it, moved up by its header's shift. SEGMENT_NONE (no
/// segment) stays as it is; an id the shift would carry past the id space becomes
/// `SEGMENT_NONE - 1`, which no segment may have, so the restore refuses it as damaged.
fn shifted_id(raw: u32, shift: u32) -> u32 {
    if raw == SEGMENT_NONE {
        return raw;
    }
    match raw.checked_add(shift) {
        Some(id) if id < SEGMENT_NONE - 1 => id,
        _ => SEGMENT_NONE - 1,
    }
}

/// The header that makes `image` name every value-log segment id `shift` higher than it
/// does now, for a file whose other bytes stay as they are. A follower that stores a leader's
/// segment files under ids above its own (`<id + shift>.seg`) writes this over the leader's
/// header: 40 bytes and a sync, where rewriting each id in the archive meant writing the whole
/// index again (416 MB at 4M keys) while the raft loop waited.
///
/// Reads only the header (checked: magic, crc, format). `highest_id` is the highest id the
/// image names now, as `checkpoint_segments` lists them: the caller has it, and an id past the
/// id space is refused here rather than at the restore.
pub fn segment_shift_header(
    image: &[u8],
    shift: u32,
    highest_id: u32,
) -> Result<[u8; HEADER_BYTES]> {
    let (format, old_shift) = checked_header(image)?;
    let header = &image[..HEADER_BYTES];
    if format == FORMAT_VERSION_INLINE {
        return Err(damaged("a segment id shift in an image with no segments"));
    }
    let out_of_range = || damaged("a segment id out of range or listed twice");
    let total = old_shift.checked_add(shift).ok_or_else(out_of_range)?;
    match highest_id.checked_add(shift) {
        Some(id) if id < SEGMENT_NONE - 1 => {}
        _ => return Err(out_of_range()),
    }
    let mut out = [0u8; HEADER_BYTES];
    out.copy_from_slice(header);
    if total != 0 {
        out[8..12].copy_from_slice(&(format | FORMAT_SEGMENT_SHIFTED).to_le_bytes());
        out[12..16].copy_from_slice(&total.to_le_bytes());
    }
    let header_crc = crc32fast::hash(&out[..36]);
    out[36..40].copy_from_slice(&header_crc.to_le_bytes());
    Ok(out)
}

/// The same checkpoint with every value-log segment id raised by `shift`, as a follower keeps a
/// leader's image (`segment_shift_header` over the image, checked whole first; the server
/// writes that header over its staged file instead). An image that points into no segment
/// comes back unchanged. For tests.
#[cfg(test)]
pub(crate) fn renumber_segments(image: &[u8], shift: u32) -> Result<Vec<u8>> {
    let listed = checkpoint_segments(image)?;
    let Some(&highest) = listed.last() else {
        return Ok(image.to_vec());
    };
    if shift == 0 {
        return Ok(image.to_vec());
    }
    let header = segment_shift_header(image, shift, highest)?;
    Ok([&header[..], &image[HEADER_BYTES..]].concat())
}

/// Writes every segment id `image`'s header shifts into the archive itself and leaves no
/// shift, in place; false when it has none (nothing changed): how a checkpoint leaves this
/// member for another. A shifted header is this member's own record of where it stored a
/// leader's segments; a build that predates the shift refuses it, so what goes out is the
/// format every build reads. One pass over the archive, no key or value restored. The
/// archive must lie aligned where it is, as a checkpoint file's does in an aligned buffer.
pub fn remove_segment_shift(image: &mut [u8]) -> Result<bool> {
    use rkyv::munge::munge;
    use rkyv::vec::ArchivedVec;
    let (format, segment_shift, key_count, payload_at) = {
        let Payload {
            format,
            segment_shift,
            key_count,
            base,
            aligned,
        } = validated_payload(&*image)?;
        if matches!(aligned, AlignedPayload::Copied(_)) {
            return Err(damaged("an archive not aligned where it lies"));
        }
        let payload_at = HEADER_BYTES
            + if base.is_some() {
                DELTA_PREFIX_BYTES
            } else {
                0
            };
        (format, segment_shift, key_count, payload_at)
    };
    if segment_shift == 0 {
        return Ok(false);
    }
    let data = rkyv::access_mut::<ArchivedCheckpointData, rancor::Error>(&mut image[payload_at..])
        .map_err(|_| damaged("archive failed validation"))?;
    let raised = |id: u32| -> Result<u32> {
        match shifted_id(id, segment_shift) {
            id if id >= SEGMENT_NONE - 1 => {
                Err(damaged("a segment id out of range or listed twice"))
            }
            id => Ok(id),
        }
    };
    munge!(let ArchivedCheckpointData { keys, segments, .. } = data);
    let mut segments = ArchivedVec::as_slice_seal(segments);
    for i in 0..segments.len() {
        munge!(let ArchivedSegmentRecord { id, .. } = segments.as_mut().index(i));
        let mut id = id;
        *id = raised(id.to_native())?.into();
    }
    let mut keys = ArchivedVec::as_slice_seal(keys);
    for k in 0..keys.len() {
        munge!(let ArchivedKeyRecord { versions, .. } = keys.as_mut().index(k));
        let mut versions = ArchivedVec::as_slice_seal(versions);
        for v in 0..versions.len() {
            munge!(let ArchivedVersionRecord { segment, .. } = versions.as_mut().index(v));
            let mut segment = segment;
            if segment.to_native() != SEGMENT_NONE {
                *segment = raised(segment.to_native())?.into();
            }
        }
    }
    assert!(format == FORMAT_VERSION || format == FORMAT_VERSION_DELTA);
    let header = frame_header(format, key_count, &image[HEADER_BYTES..]);
    image[..HEADER_BYTES].copy_from_slice(&header);
    Ok(true)
}

/// The segment id shift `image`'s header names (0: none), from the header alone (checked:
/// magic, crc, format).
pub fn segment_shift_of(image: &[u8]) -> Result<u32> {
    Ok(checked_header(image)?.1)
}

/// `file`, a checkpoint image at `image` within framing of the caller's, as it goes out to
/// another member: one copy into an aligned buffer (where the archive lies aligned, as the
/// caller's file lays it out), the image's shift written into its archive
/// (`remove_segment_shift`), then `mend` given the whole buffer to fix its own framing (a
/// crc). Everything else stays byte for byte. None when the image has no shift.
pub fn without_segment_shift_in(
    file: &[u8],
    image: std::ops::Range<usize>,
    mend: impl FnOnce(&mut [u8]),
) -> Result<Option<Bytes>> {
    if segment_shift_of(&file[image.clone()])? == 0 {
        return Ok(None);
    }
    let mut copy = aligned_copy(file);
    let removed = remove_segment_shift(&mut copy[image])?;
    assert!(removed, "the header named a shift");
    mend(&mut copy);
    Ok(Some(Bytes::from_owner(copy)))
}

/// One version as either format stores it.
struct VersionFields {
    rev: Revision,
    tombstone: bool,
    create_revision: i64,
    version: i64,
    lease: i64,
    segment: u32,
    value_offset: u64,
    value_bytes: u64,
}

/// Rebuilds a store from `bytes`, and for a delta from `base` too (the full checkpoint it
/// names; a base given for a full checkpoint is refused, as a missing one is for a delta).
pub(crate) fn restore(
    bytes: &[u8],
    base: Option<&[u8]>,
    options: ValueLogOptions,
    files: &mut SegmentFiles<'_>,
    helpers: RestoreHelpers<'_>,
) -> Result<(Writer, Reader)> {
    let Payload {
        format,
        segment_shift,
        key_count,
        base: base_ref,
        aligned,
    } = validated_payload(bytes)?;
    match (base_ref, base) {
        (Some(base_ref), Some(base)) => {
            let delta = DeltaArchive {
                base_ref,
                key_count,
                archive: &aligned,
                segment_shift,
            };
            return restore_delta(delta, base, options, files, helpers);
        }
        (Some(_), None) => return Err(damaged("a delta checkpoint without its base")),
        (None, Some(_)) => return Err(damaged("a base given for a full checkpoint")),
        (None, None) => {}
    }
    // Both formats go through one loader; a macro, because their archived types differ.
    macro_rules! load {
        ($archived:ty, $segments:expr, $segment_of:expr) => {{
            let data = rkyv::access::<$archived, rancor::Error>(&aligned)
                .map_err(|_| damaged("archive failed validation"))?;
            if data.keys.len() as u64 != key_count {
                return Err(damaged("key count does not match the header"));
            }
            let header = Header {
                applied_index: data.applied_index.to_native(),
                current_rev: data.current_rev.to_native(),
                compact_rev: data.compact_rev.to_native(),
                leases: leases_of(&data.leases),
                segments: $segments(data),
                delta_base_revision: data.current_rev.to_native(),
            };
            build(
                header,
                data.values.as_slice(),
                data.keys.as_slice(),
                |record| {
                    let versions = record.versions.iter().map(|v| VersionFields {
                        rev: Revision {
                            main: v.main.to_native(),
                            sub: v.sub.to_native(),
                        },
                        tombstone: v.tombstone,
                        create_revision: v.create_revision.to_native(),
                        version: v.version.to_native(),
                        lease: v.lease.to_native(),
                        segment: $segment_of(v),
                        value_offset: v.value_offset.to_native(),
                        value_bytes: v.value_bytes.to_native(),
                    });
                    (record.key.as_slice(), versions)
                },
                options,
                files,
                helpers,
            )
        }};
    }
    if format == FORMAT_VERSION {
        load!(
            ArchivedCheckpointData,
            |data| durable_segments_of(data, segment_shift),
            |v: &ArchivedVersionRecord| shifted_id(v.segment.to_native(), segment_shift)
        )
    } else {
        load!(
            ArchivedCheckpointDataInline,
            |_: &ArchivedCheckpointDataInline| Vec::new(),
            |_: &ArchivedVersionRecordInline| SEGMENT_NONE
        )
    }
}

/// What a checkpoint holds besides its keys.
struct Header {
    applied_index: u64,
    current_rev: i64,
    compact_rev: i64,
    leases: Vec<(i64, i64)>,
    /// The durable segments versions may point into.
    segments: Vec<DurableSegment>,
    /// The revision of the full checkpoint later deltas are taken against: the restored one's
    /// own, or a delta's base's (see `Writer::set_delta_base_revision`).
    delta_base_revision: i64,
}

fn leases_of(leases: &[ArchivedLeaseRecord]) -> Vec<(i64, i64)> {
    leases
        .iter()
        .map(|l| (l.id.to_native(), l.ttl_s.to_native()))
        .collect()
}

/// The segments an archive lists, under its header's `shift`.
fn durable_segments_of(data: &ArchivedCheckpointData, shift: u32) -> Vec<DurableSegment> {
    data.segments
        .iter()
        .map(|s| DurableSegment {
            id: shifted_id(s.id.to_native(), shift),
            record_bytes: s.record_bytes.to_native(),
            value_bytes: s.value_bytes.to_native(),
        })
        .collect()
}

fn version_fields(
    v: &ArchivedVersionRecord,
    inline_shift: u64,
    segment_shift: u32,
) -> VersionFields {
    let segment = shifted_id(v.segment.to_native(), segment_shift);
    VersionFields {
        rev: Revision {
            main: v.main.to_native(),
            sub: v.sub.to_native(),
        },
        tombstone: v.tombstone,
        create_revision: v.create_revision.to_native(),
        version: v.version.to_native(),
        lease: v.lease.to_native(),
        segment,
        value_offset: v.value_offset.to_native()
            + if segment == SEGMENT_NONE {
                inline_shift
            } else {
                0
            },
        value_bytes: v.value_bytes.to_native(),
    }
}

/// One key of a delta's restore: its record in the base, in the delta, or both.
struct MergedKey<'a> {
    base: Option<&'a ArchivedKeyRecord>,
    delta: Option<&'a ArchivedKeyRecord>,
}

/// A key's base versions, then its delta versions (whose inline values are `inline_shift`
/// bytes further on, after the base's blob). Each file's segment ids move by its own header's shift.
struct JoinedVersions<'a> {
    base: std::slice::Iter<'a, ArchivedVersionRecord>,
    delta: std::slice::Iter<'a, ArchivedVersionRecord>,
    inline_shift: u64,
    base_segment_shift: u32,
    delta_segment_shift: u32,
}

impl Iterator for JoinedVersions<'_> {
    type Item = VersionFields;

    fn next(&mut self) -> Option<VersionFields> {
        match self.base.next() {
            Some(v) => Some(version_fields(v, 0, self.base_segment_shift)),
            None => self
                .delta
                .next()
                .map(|v| version_fields(v, self.inline_shift, self.delta_segment_shift)),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.base.len() + self.delta.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for JoinedVersions<'_> {}

/// A delta's archive, as its frame gave it.
struct DeltaArchive<'a> {
    base_ref: BaseRef,
    key_count: u64,
    archive: &'a [u8],
    segment_shift: u32,
}

/// A delta over its base: the base's keys with the delta's versions after theirs, the delta's
/// revisions, leases and segments, and the base's segments that only the base names (its
/// unchanged keys point into them). The two inline value blobs are read as one, the delta's
/// after the base's; both are small (values of segments not yet durable at a capture).
fn restore_delta(
    delta: DeltaArchive<'_>,
    base: &[u8],
    options: ValueLogOptions,
    files: &mut SegmentFiles<'_>,
    helpers: RestoreHelpers<'_>,
) -> Result<(Writer, Reader)> {
    let DeltaArchive {
        base_ref,
        key_count,
        archive,
        segment_shift,
    } = delta;
    let base_payload = validated_payload(base)?;
    if base_payload.base.is_some() || base_payload.format != FORMAT_VERSION {
        return Err(damaged("a delta's base is not a full checkpoint"));
    }
    let base_data = rkyv::access::<ArchivedCheckpointData, rancor::Error>(&base_payload.aligned)
        .map_err(|_| damaged("archive failed validation"))?;
    let data = rkyv::access::<ArchivedCheckpointData, rancor::Error>(archive)
        .map_err(|_| damaged("archive failed validation"))?;
    if data.keys.len() as u64 != key_count || base_data.keys.len() as u64 != base_payload.key_count
    {
        return Err(damaged("key count does not match the header"));
    }
    if base_data.applied_index.to_native() != base_ref.applied_index
        || base_data.current_rev.to_native() != base_ref.revision
    {
        return Err(damaged(
            "the base checkpoint is not the one the delta names",
        ));
    }
    if data.applied_index.to_native() < base_ref.applied_index
        || data.current_rev.to_native() < base_ref.revision
    {
        return Err(damaged("a delta older than its base"));
    }
    // Each file's ids under its own shift: a member's own delta (no shift) over a leader's base
    // it stored under raised ids names the same segments as that base does.
    let base_segment_shift = base_payload.segment_shift;
    let mut segments: BTreeMap<u32, DurableSegment> =
        durable_segments_of(base_data, base_segment_shift)
            .into_iter()
            .map(|d| (d.id, d))
            .collect();
    // The delta's record of a segment both list is the newer one.
    segments.extend(
        durable_segments_of(data, segment_shift)
            .into_iter()
            .map(|d| (d.id, d)),
    );
    let header = Header {
        applied_index: data.applied_index.to_native(),
        current_rev: data.current_rev.to_native(),
        compact_rev: data.compact_rev.to_native(),
        leases: leases_of(&data.leases),
        segments: segments.into_values().collect(),
        delta_base_revision: base_ref.revision,
    };
    let values = [base_data.values.as_slice(), data.values.as_slice()].concat();
    // The merged key list: each key of either, with the base's versions and the delta's
    // after them where both have it.
    let (old, new) = (base_data.keys.as_slice(), data.keys.as_slice());
    let mut merged: Vec<MergedKey<'_>> = Vec::with_capacity(old.len().max(new.len()));
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        let (o, n) = (old.get(i), new.get(j));
        let (take_old, take_new) = match (o, n) {
            (Some(o), Some(n)) => match o.key.as_slice().cmp(n.key.as_slice()) {
                std::cmp::Ordering::Less => (true, false),
                std::cmp::Ordering::Greater => (false, true),
                std::cmp::Ordering::Equal => (true, true),
            },
            (Some(_), None) => (true, false),
            (None, _) => (false, true),
        };
        merged.push(MergedKey {
            base: o.filter(|_| take_old),
            delta: n.filter(|_| take_new),
        });
        i += usize::from(take_old);
        j += usize::from(take_new);
    }
    let inline_shift = base_data.values.len() as u64;
    build(
        header,
        &values,
        &merged,
        |m: &MergedKey<'_>| {
            let key = m.base.or(m.delta).expect("one of the two has the key");
            let base = m.base.map(|r| r.versions.as_slice()).unwrap_or(&[]);
            let delta = m.delta.map(|r| r.versions.as_slice()).unwrap_or(&[]);
            (
                key.key.as_slice(),
                JoinedVersions {
                    base: base.iter(),
                    delta: delta.iter(),
                    inline_shift,
                    base_segment_shift,
                    delta_segment_shift: segment_shift,
                },
            )
        },
        options,
        files,
        helpers,
    )
}

/// Threads besides the caller's that a restore may use to rebuild the index. A restart's
/// restore is 4M skip-list inserts at 4M keys, most of the start; parts of the key list are
/// built side by side (the skip list takes concurrent inserts of disjoint keys).
#[derive(Clone, Copy)]
pub struct RestoreHelpers<'a> {
    /// Helper threads (0: the caller builds everything).
    pub threads: usize,
    /// Runs first on each helper thread: the server moves it off the caller's pinned CPU,
    /// which a new thread would otherwise share (a thread inherits its creator's affinity).
    pub on_start: &'a (dyn Fn() + Sync),
}

impl RestoreHelpers<'_> {
    /// No helpers: tests, tools and small images.
    pub const NONE: RestoreHelpers<'static> = RestoreHelpers {
        threads: 0,
        on_start: &|| {},
    };
}

/// Below this many keys per part a helper thread costs more than it saves (unit tests split
/// small images, so their parts meet at real boundaries).
const RESTORE_PART_KEYS_MIN: usize = if cfg!(test) { 16 } else { 50_000 };

/// A durable segment as a restore checks values against it: its id and its file's length.
#[derive(Clone, Copy)]
struct SegmentLimit {
    id: u32,
    file_bytes: usize,
}

/// What one part of a restore built besides its index entries: folded into the writer once
/// every part is done.
#[derive(Default)]
struct PartBuilt {
    /// Value bytes and record bytes of the loaded values in each durable segment, by position
    /// in the restore's `SegmentLimit`s.
    loaded: Vec<(u64, u64)>,
    index_bytes: u64,
    versions: u64,
    /// The bytes of the keys the part restored, each once.
    key_bytes: u64,
    /// Keys whose newest version is a put.
    live_keys: u64,
    /// Keys whose newest version is attached to a lease, with that lease.
    lease_keys: Vec<(i64, Bytes)>,
    /// Keys holding values kept inline (not in a durable segment): those go into the value
    /// log, which only the caller's thread may change, so these keys are inserted after the
    /// parts are done. Each comes with its versions and, for each inline value, the version's
    /// position and the value's range in the image's value blob.
    deferred: Vec<DeferredKey>,
}

/// A key with inline values, its versions, and each inline value's version position and range
/// in the image's value blob.
struct DeferredKey {
    key: crate::index::IndexKey,
    versions: Vec<Version>,
    inline: Vec<(usize, std::ops::Range<usize>)>,
}

/// Builds the index entries of `keys` (a part of the checkpoint's key list, each checked
/// against `values`, the durable segments and the known leases) and inserts those that need no
/// value-log append into `index`.
fn build_part<'k, R, V, F>(
    keys: &'k [R],
    view: &F,
    current_rev: i64,
    values_bytes: usize,
    limits: &[SegmentLimit],
    lease_ids: &std::collections::BTreeMap<i64, crate::store::LeaseEntry>,
    index: &crate::index::Index,
) -> Result<PartBuilt>
where
    F: Fn(&'k R) -> (&'k [u8], V),
    V: ExactSizeIterator<Item = VersionFields>,
{
    let mut built = PartBuilt {
        loaded: vec![(0, 0); limits.len()],
        ..PartBuilt::default()
    };
    let mut previous_key: Option<&[u8]> = None;
    for record in keys {
        let (key_slice, record_versions) = view(record);
        if key_slice.is_empty() || previous_key.is_some_and(|p| p >= key_slice) {
            return Err(damaged("keys not strictly ascending"));
        }
        previous_key = Some(key_slice);
        let key = key_slice;
        // Exactly as many as the key has: a list grown by pushes starts at four, and with one
        // version per key the spare three made a restored index about half again as large as
        // the one the writes had built.
        let mut versions: Vec<Version> = Vec::with_capacity(record_versions.len());
        let mut inline = Vec::new();
        for v in record_versions {
            let rev = v.rev;
            if versions.last().is_some_and(|last| last.rev() >= rev) || rev.main > current_rev {
                return Err(damaged("versions not ascending"));
            }
            if !(0..crate::index::SUB_LIMIT).contains(&rev.sub) {
                return Err(damaged("a sub revision out of range"));
            }
            let version = if v.tombstone {
                Version::tombstone(rev)
            } else if v.segment == SEGMENT_NONE {
                let start = v.value_offset;
                let end = start
                    .checked_add(v.value_bytes)
                    .ok_or_else(|| damaged("value range overflows"))?;
                if end > values_bytes as u64 {
                    return Err(damaged("value range outside the value blob"));
                }
                inline.push((versions.len(), start as usize..end as usize));
                // Placed by the caller (see `PartBuilt::deferred`).
                Version::put(
                    rev,
                    v.create_revision,
                    v.version,
                    v.lease,
                    0,
                    SEGMENT_NONE,
                    0,
                )
            } else {
                let at = limits
                    .binary_search_by_key(&v.segment, |l| l.id)
                    .map_err(|_| damaged("a value in a segment the checkpoint does not list"))?;
                let offset = u32::try_from(v.value_offset)
                    .map_err(|_| damaged("a record offset beyond 4 GiB"))?;
                let value_len =
                    u32::try_from(v.value_bytes).map_err(|_| damaged("a value beyond 4 GiB"))?;
                let record = RECORD_HEADER_BYTES + key.len() + v.value_bytes as usize;
                let end = (v.value_offset as usize)
                    .checked_add(record)
                    .ok_or_else(|| damaged("value range overflows"))?;
                if end > limits[at].file_bytes || v.value_bytes == 0 {
                    return Err(damaged("a value outside its segment's file"));
                }
                built.loaded[at].0 += v.value_bytes;
                built.loaded[at].1 +=
                    crate::vlog::record_bytes(key.len(), value_len as usize) as u64;
                Version::put(
                    rev,
                    v.create_revision,
                    v.version,
                    v.lease,
                    value_len,
                    v.segment,
                    offset,
                )
            };
            versions.push(version);
            built.index_bytes += key.len() as u64 + crate::store::VERSION_INDEX_BYTES;
            built.versions += 1;
        }
        let Some(latest) = versions.last() else {
            return Err(damaged("a key without versions"));
        };
        built.key_bytes += key.len() as u64;
        built.live_keys += u64::from(latest.kind() == VersionKind::Put);
        if latest.kind() == VersionKind::Put && latest.lease != 0 {
            if !lease_ids.contains_key(&latest.lease) {
                return Err(damaged("a key attached to an unknown lease"));
            }
            built
                .lease_keys
                .push((latest.lease, Bytes::copy_from_slice(key)));
        }
        if inline.is_empty() {
            index.insert(Box::from(key), KeyHistory::new(versions));
        } else {
            built.deferred.push(DeferredKey {
                key: Box::from(key),
                versions,
                inline,
            });
        }
    }
    Ok(built)
}

fn build<'k, R, V, F>(
    header: Header,
    values: &[u8],
    keys: &'k [R],
    view: F,
    options: ValueLogOptions,
    files: &mut SegmentFiles<'_>,
    helpers: RestoreHelpers<'_>,
) -> Result<(Writer, Reader)>
where
    R: Sync,
    F: Fn(&'k R) -> (&'k [u8], V) + Sync,
    V: ExactSizeIterator<Item = VersionFields>,
{
    let Header {
        applied_index,
        current_rev,
        compact_rev,
        leases,
        segments,
        delta_base_revision,
    } = header;
    if current_rev < crate::store::REVISION_INITIAL || compact_rev > current_rev {
        return Err(damaged("revisions out of order"));
    }
    // The last two ids are never used: SEGMENT_NONE, and the one that would make the next
    // segment SEGMENT_NONE.
    if segments.iter().any(|d| d.id >= SEGMENT_NONE - 1) {
        return Err(damaged("a segment id out of range or listed twice"));
    }
    // New segments start above every listed one, whatever the caller asked.
    let first_segment_id = segments
        .iter()
        .map(|d| d.id + 1)
        .max()
        .unwrap_or(0)
        .max(options.first_segment_id);
    let options = ValueLogOptions {
        first_segment_id,
        ..options
    };
    let (mut writer, reader) = Store::with_value_log(options);
    writer.applied_index = applied_index;
    writer.current_rev = current_rev;
    // Nothing was written since the image: deltas against it (or a later base) can use the
    // writer's own record of what changes next.
    writer.dirty = crate::dirty::DirtyKeys::since(current_rev);
    writer.compact_rev = compact_rev;
    for (id, ttl_s) in leases {
        writer.leases.insert(
            id,
            crate::store::LeaseEntry {
                ttl_s,
                keys: Default::default(),
            },
        );
    }
    // Each durable segment's file, mapped once and kept by the value log; values are slices
    // of it.
    let mut limits = Vec::with_capacity(segments.len());
    for segment in segments {
        let (id, record_bytes) = (segment.id, segment.record_bytes);
        let file = files(id).map_err(|why| KvError::SegmentUnusable { segment: id, why })?;
        if id >= first_segment_id || writer.vlog.durable_file(id).is_some() {
            return Err(damaged("a segment id out of range or listed twice"));
        }
        if (file.len() as u64) < record_bytes {
            return Err(KvError::SegmentUnusable {
                segment: id,
                why: format!(
                    "the file holds {} bytes, the checkpoint needs {record_bytes}",
                    file.len()
                ),
            });
        }
        limits.push(SegmentLimit {
            id,
            file_bytes: file.len(),
        });
        writer.vlog.insert_durable(segment, file);
    }
    limits.sort_unstable_by_key(|l| l.id);
    // One table for all of them, before any version naming them is in the index.
    writer.vlog.publish_table();

    // The key list in parts, one per thread, each built on its own; the parts' order is the
    // keys' order, so the boundaries are checked here.
    let parts_max = keys.len() / RESTORE_PART_KEYS_MIN;
    let parts = (helpers.threads + 1).min(parts_max).max(1);
    let part_keys = keys.len().div_ceil(parts).max(1);
    let chunks: Vec<&'k [R]> = keys.chunks(part_keys).collect();
    for pair in chunks.windows(2) {
        let (last, _) = view(pair[0].last().expect("chunks are not empty"));
        let (first, _) = view(pair[1].first().expect("chunks are not empty"));
        if last >= first {
            return Err(damaged("keys not strictly ascending"));
        }
    }
    let shared = writer.shared.clone();
    let lease_ids = &writer.leases;
    let build_one = |chunk: &'k [R]| {
        build_part(
            chunk,
            &view,
            current_rev,
            values.len(),
            &limits,
            lease_ids,
            &shared.index,
        )
    };
    let built: Vec<Result<PartBuilt>> = match chunks.split_first() {
        None => Vec::new(),
        Some((mine, [])) => vec![build_one(mine)],
        Some((mine, theirs)) => std::thread::scope(|scope| {
            let handles: Vec<_> = theirs
                .iter()
                .map(|&chunk| {
                    let build_one = &build_one;
                    std::thread::Builder::new()
                        .name("kv-restore".into())
                        .spawn_scoped(scope, move || {
                            (helpers.on_start)();
                            build_one(chunk)
                        })
                        .expect("the OS starts a thread")
                })
                .collect();
            let mut built = vec![build_one(mine)];
            built.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a restore part does not panic")),
            );
            built
        }),
    };
    let mut loaded = vec![(0u64, 0u64); limits.len()];
    for part in built {
        let part = part?;
        for (total, (value_bytes, record_bytes)) in loaded.iter_mut().zip(part.loaded) {
            total.0 += value_bytes;
            total.1 += record_bytes;
        }
        writer.index_bytes += part.index_bytes;
        writer.versions_held += part.versions;
        writer.key_bytes_held += part.key_bytes;
        writer.live_keys_restored += part.live_keys;
        for (lease, key) in part.lease_keys {
            writer
                .leases
                .get_mut(&lease)
                .expect("checked by the part")
                .keys
                .insert(key);
        }
        for DeferredKey {
            key,
            mut versions,
            inline,
        } in part.deferred
        {
            for (at, range) in inline {
                let placed = writer.vlog.append(&key, versions[at].rev(), &values[range]);
                versions[at].place(placed.value_len, placed.segment, placed.offset);
            }
            writer.shared.index.insert(key, KeyHistory::new(versions));
        }
    }
    for (limit, (value_bytes, record_bytes)) in limits.iter().zip(loaded) {
        if !writer
            .vlog
            .count_loaded(limit.id, value_bytes, record_bytes)
        {
            return Err(damaged("a segment's live values exceed what it holds"));
        }
    }
    writer
        .shared
        .current_rev
        .store(current_rev, std::sync::atomic::Ordering::Release);
    writer
        .shared
        .compact_rev
        .store(compact_rev, std::sync::atomic::Ordering::Release);
    writer.set_delta_base_revision(delta_base_revision);
    writer.resume_compaction();
    // Before any reader sees the store: a shard's quota check reads it.
    writer.publish_size();
    Ok((writer, reader))
}

#[cfg(test)]
mod format_1 {
    use super::*;

    #[test]
    fn format_1_checkpoints_with_inline_values_still_load() {
        let data = CheckpointDataInline {
            applied_index: 9,
            current_rev: 3,
            compact_rev: 0,
            keys: vec![KeyRecordInline {
                key: b"a".to_vec(),
                versions: vec![
                    VersionRecordInline {
                        main: 2,
                        sub: 0,
                        tombstone: false,
                        create_revision: 2,
                        version: 1,
                        lease: 5,
                        value_offset: 0,
                        value_bytes: 3,
                    },
                    VersionRecordInline {
                        main: 3,
                        sub: 0,
                        tombstone: false,
                        create_revision: 2,
                        version: 2,
                        lease: 5,
                        value_offset: 3,
                        value_bytes: 2,
                    },
                ],
            }],
            values: b"onetw".to_vec(),
            leases: vec![LeaseRecord { id: 5, ttl_s: 60 }],
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&data).unwrap();
        let image = frame_payload(1, 1, &payload);
        let (w, r) = Store::restore(&image).expect("format 1 loads");
        assert_eq!(w.applied_index(), 9);
        assert_eq!(
            r.range(&crate::RangeRequest {
                key: Bytes::from_static(b"a"),
                ..Default::default()
            })
            .unwrap()
            .kvs
            .first()
            .map(|kv| kv.value.clone()),
            Some(Bytes::from_static(b"tw"))
        );
        assert_eq!(w.lease(5).map(|l| l.keys.len()), Some(1));
    }
}

#[cfg(test)]
mod in_parts {
    use super::*;

    /// `keys` keys `k0000`.. of one version each, with `value` inline; then `damage` changes
    /// the records before they are archived.
    fn image(keys: usize, damage: impl FnOnce(&mut Vec<KeyRecord>)) -> Vec<u8> {
        let mut records: Vec<KeyRecord> = (0..keys)
            .map(|k| KeyRecord {
                key: format!("k{k:04}").into_bytes(),
                versions: vec![VersionRecord {
                    main: 2 + k as i64,
                    sub: 0,
                    tombstone: false,
                    create_revision: 2 + k as i64,
                    version: 1,
                    lease: 0,
                    segment: SEGMENT_NONE,
                    value_offset: 0,
                    value_bytes: 3,
                }],
            })
            .collect();
        damage(&mut records);
        let data = CheckpointData {
            applied_index: 9,
            current_rev: 1 + keys as i64,
            compact_rev: 0,
            keys: records,
            values: b"one".to_vec(),
            leases: vec![],
            segments: vec![],
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&data).unwrap();
        frame_payload(FORMAT_VERSION, keys as u64, &payload)
    }

    fn restore_in_parts(image: &[u8]) -> Result<(Writer, Reader)> {
        restore(
            image,
            None,
            ValueLogOptions::default(),
            &mut no_segment_files,
            RestoreHelpers {
                threads: 3,
                on_start: &|| {},
            },
        )
    }

    #[test]
    fn damage_in_any_part_or_at_a_boundary_is_refused() {
        // 64 keys in parts of 16: keys 0-15 on the caller's thread, the rest on helpers.
        let (w, r) = restore_in_parts(&image(64, |_| {})).expect("an undamaged image restores");
        assert_eq!(w.applied_index(), 9);
        assert_eq!(
            r.hash_kv(65).unwrap(),
            Store::restore(&image(64, |_| {}))
                .unwrap()
                .1
                .hash_kv(65)
                .unwrap()
        );
        type Damage = Box<dyn FnOnce(&mut Vec<KeyRecord>)>;
        let cases: Vec<(&str, Damage)> = vec![
            (
                "keys not strictly ascending",
                Box::new(|k| k[40].key = b"k0039".to_vec()),
            ),
            // Key 16 starts the second part: the same as the first part's last key.
            (
                "keys not strictly ascending",
                Box::new(|k| k[16].key = b"k0015".to_vec()),
            ),
            (
                "a key attached to an unknown lease",
                Box::new(|k| k[60].versions[0].lease = 5),
            ),
            (
                "value range outside the value blob",
                Box::new(|k| k[33].versions[0].value_bytes = 4),
            ),
            (
                "versions not ascending",
                Box::new(|k| k[50].versions[0].main = 1000),
            ),
            (
                "a key without versions",
                Box::new(|k| k[63].versions.clear()),
            ),
        ];
        for (why, damage) in cases {
            match restore_in_parts(&image(64, damage)) {
                Err(KvError::CheckpointDamaged(found)) => assert_eq!(found, why),
                other => panic!("{why}: got {:?}", other.map(|_| ())),
            }
        }
    }
}

#[cfg(test)]
mod archive_bound {
    use super::*;

    /// The buffer `frame` sizes up front holds the whole archive, so it never grows (a copy
    /// of a multi-GB buffer at every checkpoint's peak), whatever the keys' lengths.
    #[test]
    fn the_archive_fits_the_buffer_sized_for_it() {
        for keys in [0usize, 1, 7, 300] {
            let records: Vec<KeyRecord> = (0..keys)
                .map(|k| KeyRecord {
                    key: vec![b'k'; 1 + k % 37],
                    versions: (0..1 + k % 4)
                        .map(|v| VersionRecord {
                            main: 2 + v as i64,
                            sub: 0,
                            tombstone: false,
                            create_revision: 2,
                            version: 1 + v as i64,
                            lease: 0,
                            segment: 3,
                            value_offset: 0,
                            value_bytes: 3,
                        })
                        .collect(),
                })
                .collect();
            let data = CheckpointData {
                applied_index: 9,
                current_rev: 10,
                compact_rev: 0,
                keys: records,
                values: vec![1; keys * 3 + 5],
                leases: (0..keys % 5)
                    .map(|i| LeaseRecord {
                        id: i as i64 + 1,
                        ttl_s: 60,
                    })
                    .collect(),
                segments: (0..1 + keys % 3)
                    .map(|i| SegmentRecord {
                        id: i as u32,
                        record_bytes: 10,
                        value_bytes: 3,
                    })
                    .collect(),
            };
            let bound = archived_bytes_max(&data);
            let parts = frame(&data);
            let payload = &parts.parts()[1];
            assert!(
                payload.len() <= bound,
                "{keys} keys: {} > {bound}",
                payload.len()
            );
            assert_eq!(
                parts.payload.capacity(),
                bound,
                "{keys} keys: the buffer grew"
            );
        }
    }
}

#[cfg(test)]
mod streamed {
    use super::*;
    use crate::{DeleteRangeRequest, LeaseGrantRequest, Op, PutRequest};

    /// The owned archive `serialize_parts` used to build: every kept key and version copied
    /// into a `CheckpointData` first.
    fn owned(source: &CheckpointSource) -> Vec<u8> {
        let guard = epoch::pin();
        let table = source.reader.shared.segments.load(&guard);
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut late = LateSegments::new();
        for entry in source.reader.shared.index.iter() {
            let list = entry.value().load(&guard);
            let versions: Vec<VersionRecord> = list
                .iter()
                .take_while(|v| v.main() <= source.revision)
                .map(|v| source.version_record(entry.key(), v, table, &mut values, &mut late))
                .collect();
            if !versions.is_empty() {
                keys.push(KeyRecord {
                    key: entry.key().to_vec(),
                    versions,
                });
            }
        }
        let data = CheckpointData {
            applied_index: source.applied_index,
            current_rev: source.revision,
            compact_rev: source.compact_rev,
            keys,
            values,
            leases: source.lease_records(),
            segments: SegmentRecords {
                captured: &source.durable_segments,
                late: &std::cell::RefCell::new(late),
            }
            .records(),
        };
        frame(&data).to_vec()
    }

    /// The archive written straight from the index is the very archive the owned copy made,
    /// byte for byte: with values inline and in durable segments, tombstones, leases, keys
    /// written after the capture (left out) and none at all.
    #[test]
    fn the_streamed_archive_is_the_owned_one() {
        let (mut w, _r) = Store::with_value_log(ValueLogOptions {
            segment_bytes: 512,
            first_segment_id: 0,
            on_disk: true,
        });
        assert_eq!(
            w.checkpoint_source().serialize().unwrap(),
            owned(&w.checkpoint_source())
        );
        let mut index = 1;
        w.apply(
            index,
            &Op::LeaseGrant(LeaseGrantRequest { id: 3, ttl_s: 9 }),
        )
        .unwrap();
        for round in 0..3u8 {
            for k in 0..40u32 {
                index += 1;
                let op = if round == 2 && k % 6 == 0 {
                    Op::DeleteRange(DeleteRangeRequest {
                        key: Bytes::from(format!("k{k:03}")),
                        ..Default::default()
                    })
                } else {
                    Op::Put(PutRequest {
                        key: Bytes::from(format!("k{k:03}")),
                        value: Bytes::from(vec![round; k as usize % 50]),
                        lease: if k % 5 == 0 { 3 } else { 0 },
                        ..Default::default()
                    })
                };
                w.apply(index, &op).unwrap();
            }
            // Some segments durable (their values become pointers), the last round's not.
            if round < 2 {
                for sealed in w.take_sealed_segments() {
                    let file = Bytes::from(sealed.records.to_vec());
                    w.segment_durable(sealed.id, sealed.bytes, file);
                }
            }
        }
        let source = w.checkpoint_source();
        // Written after the capture: a new key and a new version of an old one.
        for (at, key) in [(index + 1, "later"), (index + 2, "k001")] {
            let op = Op::Put(PutRequest {
                key: Bytes::from(key),
                value: Bytes::from_static(b"x"),
                ..Default::default()
            });
            w.apply(at, &op).unwrap();
        }
        let streamed = source.serialize().unwrap();
        assert_eq!(streamed, owned(&source));
    }
}
