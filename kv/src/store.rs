//! The store: one `Writer` (the raft core applies committed entries through it) and any number of
//! `Reader`s (one per shard) that read the published state without locks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_epoch as epoch;

use crate::error::{KvError, Result};
use crate::history::EventSteps;
use crate::index::{
    for_each_entry_in_range, for_each_in_range, live_at, Index, KeyHistory, RecordCheck, Unchecked,
    Version, VersionKind,
};
use crate::lookup::{Found, KeyLookup};
use crate::read::{
    range_at_unchecked, range_rest_batch, range_split_at, KeyValueShape, RangeGather, RangeRest,
    RangeSplit, RangeSteps, RestWalk,
};
use crate::segments::{MappedSegment, SegmentsWriter, SharedSegments};
use crate::types::{
    Applied, CompactionRequest, CompactionResponse, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, Event, EventBatch, EventKind, KeyValue,
    LeaseGrantRequest, LeaseGrantResponse, LeaseInfo, LeaseRevokeRequest, LeaseRevokeResponse, Op,
    OpResponse, PrevKv, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseOp, Revision, SortTarget, TxnRequest, TxnResponse, WriteCounts,
};
use crate::validate::LEASE_TTL_MAX_S;
use crate::vlog::{DeadSegment, Reclaim, SealedSegment, ValueLog, SEGMENT_BYTES};

/// The revision of an empty store, as in etcd.
pub const REVISION_INITIAL: i64 = 1;

/// The compact revision before any compaction, as etcd's HashKV reports it.
pub const COMPACT_REVISION_NONE: i64 = -1;

/// Captures that may become a delta base remembered by the writer (see
/// `Writer::base_captures`). A server's base is its newest full checkpoint, at most
/// `DELTAS_PER_FULL` (7) captures back; an older one falls back to counting by a walk.
pub(crate) const BASE_CAPTURES_KEPT: usize = 16;
/// What one version costs the index besides its key bytes: the `Version` itself plus its slot
/// in the key's copy-on-write list. The store's size (and so the quota) counts it.
pub const VERSION_INDEX_BYTES: u64 = std::mem::size_of::<Version>() as u64 + 8;
/// What one lease costs, as etcd's quota estimates it (`leaseOverhead`).
pub const LEASE_BYTES: u64 = 64;
/// Scans a hash makes before giving up when every one of them raced a new compaction (each
/// compaction is a raft entry, so three in a row during one scan means a very busy compactor).
pub(crate) const HASH_ATTEMPTS_MAX: usize = 3;

/// Tries of a read-only txn that compactions past its revision keep overtaking.
const TXN_READ_ATTEMPTS_MAX: usize = 3;

// The writer moves to the raft core; readers are shared by every shard.
const _: fn() = || {
    fn send<T: Send>() {}
    fn shared<T: Clone + Send + Sync>() {}
    send::<Writer>();
    shared::<Reader>();
};

/// State every reader sees. Only the writer stores into it.
pub(crate) struct Shared {
    pub(crate) index: Index,
    /// Where each value-log segment's bytes are (versions name their values by segment).
    pub(crate) segments: Arc<SharedSegments>,
    /// The newest revision whose txn is completely applied. Readers never read above it.
    pub(crate) current_rev: AtomicI64,
    /// Reads below it fail with `Compacted`.
    pub(crate) compact_rev: AtomicI64,
    /// `Writer::size_bytes` as of the last apply (or `publish_size`): what the quota counts,
    /// published before the applied entry's answer goes out, so the next write a client
    /// sends after its answer is checked against a size that includes it.
    pub(crate) size_bytes: AtomicU64,
}

/// Entry point: builds a writer and its first reader.
pub struct Store;

impl Store {
    /// An empty store at revision 1.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> (Writer, Reader) {
        Self::with_segment_bytes(SEGMENT_BYTES)
    }

    /// An empty store whose value-log segments hold `segment_bytes` (tests use small ones to exercise
    /// segment rotation and reclaim).
    pub fn with_segment_bytes(segment_bytes: usize) -> (Writer, Reader) {
        Self::with_value_log(ValueLogOptions {
            segment_bytes,
            ..ValueLogOptions::default()
        })
    }

    /// An empty store whose value log is set up as `options` say.
    pub fn with_value_log(options: ValueLogOptions) -> (Writer, Reader) {
        let segment_bytes = options.segment_bytes;
        assert!(segment_bytes > 0, "a segment must hold something");
        let segments = Arc::new(SharedSegments::new());
        let shared = Arc::new(Shared {
            index: Index::new(),
            segments: segments.clone(),
            current_rev: AtomicI64::new(REVISION_INITIAL),
            compact_rev: AtomicI64::new(COMPACT_REVISION_NONE),
            size_bytes: AtomicU64::new(0),
        });
        let writer = Writer {
            shared: shared.clone(),
            vlog: ValueLog::starting_at(
                segment_bytes,
                options.first_segment_id,
                options.on_disk,
                SegmentsWriter::new(segments),
            ),
            unreadable_records: 0,
            last_unreadable_record: None,
            leases: BTreeMap::new(),
            index_bytes: 0,
            applied_index: 0,
            current_rev: REVISION_INITIAL,
            compact_rev: COMPACT_REVISION_NONE,
            compaction: None,
            reclaim: None,
            defragmenting: false,
            tombstones_kept_after: i64::MAX,
            dirty: crate::dirty::DirtyKeys::since(REVISION_INITIAL),
            lookup: crate::lookup::KeyLookup::new(),
            versions_held: 0,
            key_bytes_held: 0,
            live_keys_restored: 0,
            writes: IndexWrites::default(),
            base_captures: std::collections::VecDeque::with_capacity(BASE_CAPTURES_KEPT),
            stepping: None,
        };
        (writer, Reader { shared })
    }

    /// Rebuilds a store from a checkpoint whose values are all inline (one taken with the value
    /// log in memory, or made by `image_from_versions`, or a leader's snapshot); any damage is a
    /// typed error.
    pub fn restore(checkpoint: &[u8]) -> Result<(Writer, Reader)> {
        crate::checkpoint::restore(
            checkpoint,
            None,
            ValueLogOptions::default(),
            &mut crate::checkpoint::no_segment_files,
            crate::checkpoint::RestoreHelpers::NONE,
        )
    }

    /// Rebuilds a store from a checkpoint that may point into durable value-log segments,
    /// which `files` maps; the value log then goes on as `options` say
    /// (`options.first_segment_id` must be above every segment the checkpoint lists). Work
    /// and memory are proportional to the index, not to the values in segments.
    pub fn restore_with_segments(
        checkpoint: &[u8],
        options: ValueLogOptions,
        files: &mut crate::checkpoint::SegmentFiles<'_>,
    ) -> Result<(Writer, Reader)> {
        crate::checkpoint::restore(
            checkpoint,
            None,
            options,
            files,
            crate::checkpoint::RestoreHelpers::NONE,
        )
    }

    /// As `restore_with_segments`, with `helpers` threads building parts of the index beside
    /// the caller's (a server's start and a follower's snapshot install).
    pub fn restore_with_helpers(
        checkpoint: &[u8],
        options: ValueLogOptions,
        files: &mut crate::checkpoint::SegmentFiles<'_>,
        helpers: crate::checkpoint::RestoreHelpers<'_>,
    ) -> Result<(Writer, Reader)> {
        crate::checkpoint::restore(checkpoint, None, options, files, helpers)
    }

    /// As `restore_with_helpers` for a checkpoint that may be a delta: `base` is the full
    /// checkpoint a delta names (`checkpoint_kind` says which), None for a full one.
    pub fn restore_on_base(
        checkpoint: &[u8],
        base: Option<&[u8]>,
        options: ValueLogOptions,
        files: &mut crate::checkpoint::SegmentFiles<'_>,
        helpers: crate::checkpoint::RestoreHelpers<'_>,
    ) -> Result<(Writer, Reader)> {
        crate::checkpoint::restore(checkpoint, base, options, files, helpers)
    }
}

/// How a store keeps its value log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueLogOptions {
    /// The size of one segment.
    pub segment_bytes: usize,
    /// The first segment id the store uses: above every segment file already on disk.
    pub first_segment_id: u32,
    /// Seal full segments for the driver to write and map (the server). Off keeps every value
    /// in memory and hands nothing out (tests, simulations, tools).
    pub on_disk: bool,
}

impl Default for ValueLogOptions {
    fn default() -> Self {
        ValueLogOptions {
            segment_bytes: SEGMENT_BYTES,
            first_segment_id: 0,
            on_disk: false,
        }
    }
}

#[derive(Debug)]
pub(crate) struct LeaseEntry {
    pub(crate) ttl_s: i64,
    pub(crate) keys: BTreeSet<Bytes>,
}

/// Where an in-progress compaction of the index stands.
#[derive(Debug)]
struct CompactionCursor {
    rev: i64,
    /// The next key to compact (None = from the first key).
    next_key: Option<Bytes>,
}

/// Where an in-progress rewrite of one value-log segment stands.
#[derive(Debug)]
struct ReclaimCursor {
    segment: u32,
    next: ReclaimNext,
}

/// How reclaim finds a segment's values, and the next one to look at.
#[derive(Debug)]
enum ReclaimNext {
    /// The segment's own records (in memory or in its file), from this byte offset on.
    Record(usize),
    /// A segment whose records could not be walked to the end (a record that fails its crc
    /// hides where the next one starts): every key of the index, from this one on (None: the
    /// first), so no live value is left behind however the dead ones were damaged.
    Key(Option<Bytes>),
}

/// Whether `compact_step` has more to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionStatus {
    /// Nothing left: every version below the compact revision is gone and no segment needs rewriting.
    Idle,
    /// Call `compact_step` again.
    Pending,
}

/// A value-log record reclaim found damaged: a dead one (a live one is refused when read),
/// since reclaim only walks records to find the live values among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadableRecord {
    pub segment: u32,
    /// The record's byte offset in the segment's file.
    pub offset: u64,
}

/// The single writer. It lives on the raft core; it is `Send` but deliberately not `Clone`.
pub struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) vlog: ValueLog,
    /// Records reclaim could not read (their crc or framing failed), and the last of them:
    /// what the driver tells the operator (reclaim itself goes on by walking the index).
    unreadable_records: u64,
    last_unreadable_record: Option<UnreadableRecord>,
    pub(crate) leases: BTreeMap<i64, LeaseEntry>,
    /// Index bytes of every version still held: each costs its key plus `VERSION_INDEX_BYTES`.
    pub(crate) index_bytes: u64,
    pub(crate) applied_index: u64,
    pub(crate) current_rev: i64,
    pub(crate) compact_rev: i64,
    compaction: Option<CompactionCursor>,
    reclaim: Option<ReclaimCursor>,
    /// Defragment asked for every dead value-log byte back; cleared once none is left.
    defragmenting: bool,
    /// Compaction keeps the tombstone it cuts a key's list at when that tombstone is newer
    /// than this revision: the revision of the full checkpoint that incremental checkpoints
    /// are taken against. A delta holds a key's versions newer than its base, and a restore
    /// puts them after the base's list, so without the tombstone the base's last version
    /// would be the newest below the compact revision and come back. A tombstone at or
    /// below the compact revision changes no read. `i64::MAX` (no base): nothing is kept.
    tombstones_kept_after: i64,
    /// The keys written since the delta base, so a delta reads only their lists.
    pub(crate) dirty: crate::dirty::DirtyKeys,
    /// The writer's own hash lookup of the keys it looked up before (see `lookup`): a put
    /// finds its key's history without a skip-list search.
    lookup: crate::lookup::KeyLookup,
    /// Versions held in the index (what a full checkpoint's size grows with).
    pub(crate) versions_held: u64,
    /// The bytes of the index's keys, each once (what a full checkpoint holds of them).
    pub(crate) key_bytes_held: u64,
    /// Live keys (their newest version a put) when this store was restored from a
    /// checkpoint; 0 for a new one. A member whose store a leader's snapshot replaced starts
    /// its live-key gauge from it, without a pass over millions of keys on the raft core.
    pub(crate) live_keys_restored: u64,
    /// What the writer did to the index since it was built or restored; never falls.
    pub(crate) writes: IndexWrites,
    /// `(revision, writes)` at the latest captures that may become a delta base, oldest
    /// first, at most `BASE_CAPTURES_KEPT`: what bounds a delta's size without a walk of the
    /// index when the dirty set cannot name its keys (see `CheckpointSource`).
    pub(crate) base_captures: std::collections::VecDeque<(i64, IndexWrites)>,
    /// The raft index of the entry being applied in steps (`apply_in_steps`): until it
    /// completes, nothing else may change the store, nor may a checkpoint capture it.
    stepping: Option<u64>,
}

/// Running counts of the writer's changes to the index. Two readings' difference says what
/// was written between them: every version newer than the first reading's revision is among
/// the versions added since, so a delta against a capture holds at most those, of at most as
/// many keys, whose bytes are at most the key bytes added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexWrites {
    pub(crate) versions_added: u64,
    /// The key's bytes of each version added, summed.
    pub(crate) key_bytes_added: u64,
    /// Versions added that created a key (the rest went onto a key's list).
    pub(crate) keys_created: u64,
    /// Versions compaction dropped.
    pub(crate) versions_dropped: u64,
}

impl IndexWrites {
    /// What was written between `earlier` and these counts.
    pub(crate) fn since(&self, earlier: &IndexWrites) -> IndexWrites {
        let less = |now: u64, then: u64| {
            now.checked_sub(then)
                .expect("the writer's counts never fall")
        };
        IndexWrites {
            versions_added: less(self.versions_added, earlier.versions_added),
            key_bytes_added: less(self.key_bytes_added, earlier.key_bytes_added),
            keys_created: less(self.keys_created, earlier.keys_created),
            versions_dropped: less(self.versions_dropped, earlier.versions_dropped),
        }
    }
}

/// A DeleteRange or a lease revoke being applied in steps (`Writer::apply_in_steps`): its
/// write set so far and where it goes on. Its tombstones are at a revision past the published
/// one, so no reader sees any of them until the last step publishes them all at once.
pub struct ApplyInSteps {
    raft_index: u64,
    ctx: TxnCtx,
    what: Stepped,
    rev_before: i64,
}

/// What an entry applied in steps does.
enum Stepped {
    /// A range delete: its request and how far its walk got.
    Delete {
        req: DeleteRangeRequest,
        walk: DeleteWalk,
    },
    /// The revoke of this lease: each step deletes the first keys still attached to it (a
    /// delete detaches its key, so what is left is what the next step takes), the last one
    /// removes the lease.
    Revoke { id: i64 },
    /// A txn that compares a range (`txn_compares_ranges`), or whose chosen ops walk one
    /// (`walks_a_range`): the txn, and how far it got.
    Txn { req: TxnRequest, phase: TxnPhase },
}

/// How far a txn applied in steps got.
enum TxnPhase {
    /// Its compares, some over a range, are being decided.
    Comparing(CompareEval),
    /// Its chosen ops are being applied: the branches its compares chose (taken, and checked,
    /// before the first op: nothing else changes the store until the last, so they stay what
    /// they were), and how far its ops got.
    Applying {
        path: TxnPath,
        progress: TxnProgress,
    },
}

/// How far a txn's chosen ops (`chosen_ops`) have been applied.
#[derive(Default)]
struct TxnProgress {
    /// The next op to apply.
    next: usize,
    /// The walk of the range delete at `next`, if it stopped part way.
    walk: Option<DeleteWalk>,
    /// The walk of the range read at `next`, if it stopped part way (boxed: most txns never
    /// have one, and an entry applied in steps moves between loop turns).
    range: Option<Box<RangeGather>>,
    /// The answers of the ops before `next`, in order.
    responses: Vec<ResponseOp>,
}

impl ApplyInSteps {
    pub fn raft_index(&self) -> u64 {
        self.raft_index
    }
}

/// What `Writer::apply_in_steps` and `Writer::apply_step` leave.
pub enum Progress {
    Done(Result<Applied>),
    More(ApplyInSteps),
}

/// How far one DeleteRange's walk has gone.
struct DeleteWalk {
    /// The next key to visit, or None once the walk reached the range's end.
    next_key: Option<Bytes>,
    deleted: i64,
    prev_kvs: Vec<KeyValue>,
}

impl DeleteWalk {
    fn starting_at(key: Bytes) -> DeleteWalk {
        DeleteWalk {
            next_key: Some(key),
            deleted: 0,
            prev_kvs: Vec::new(),
        }
    }

    /// The answer once the walk reached the range's end.
    fn response(&mut self, ctx: &TxnCtx) -> DeleteRangeResponse {
        assert!(self.next_key.is_none(), "the walk is complete");
        let revision = if self.deleted > 0 || ctx.writes > 0 {
            ctx.begin_rev + 1
        } else {
            ctx.begin_rev
        };
        DeleteRangeResponse {
            revision,
            deleted: self.deleted,
            prev_kvs: std::mem::take(&mut self.prev_kvs),
        }
    }
}

/// Keys a listing of a txn's value reads may still visit, and whether it stopped for want of
/// them (`Reader::records_txn_reads_within`).
struct KeysBudget {
    left: usize,
    cut: bool,
}

impl KeysBudget {
    fn unbounded() -> Self {
        KeysBudget {
            left: usize::MAX,
            cut: false,
        }
    }
}

/// Where a look at the values a request reads puts the records it finds: one list, or,
/// with `chunk` set, lists of at most that many handed on as they fill (a pager thread's
/// listing of a txn that compares millions of values never holds them all).
struct Listed<'f> {
    records: Vec<Bytes>,
    chunk: Option<(usize, &'f mut ChunkSink<'f>)>,
}

/// What takes each chunk of a chunked `Listed`.
type ChunkSink<'f> = dyn FnMut(&[Bytes]) + 'f;

impl Listed<'_> {
    fn whole() -> Self {
        Listed {
            records: Vec::new(),
            chunk: None,
        }
    }

    fn push(&mut self, record: Bytes) {
        self.records.push(record);
    }

    /// Whether a chunked list holds a whole chunk, to be handed on (`flush`).
    fn chunk_full(&self) -> bool {
        matches!(self.chunk, Some((chunk_max, _)) if self.records.len() >= chunk_max)
    }

    /// Hands the chunk on and starts the next (a list that is not chunked keeps growing).
    fn flush(&mut self) {
        if let Some((_, flush)) = self.chunk.as_mut() {
            flush(&self.records);
            self.records.clear();
        }
    }
}

/// A txn's value reads, to be listed on another thread (`Reader::txn_reads_of`).
pub struct TxnReads {
    reader: Reader,
    req: TxnRequest,
}

impl TxnReads {
    /// `Reader::records_txn_reads` of the txn, as the store is now.
    pub fn records(&self) -> Vec<Bytes> {
        self.reader.records_txn_reads(&self.req)
    }

    /// Calls `f` with what `records` lists, in the same order, at most `chunk_max` records
    /// at a time: the memory a listing holds is one chunk, whatever the txn reads.
    pub fn for_each_chunk(&self, chunk_max: usize, mut f: impl FnMut(&[Bytes])) {
        assert!(chunk_max > 0, "a chunk holds records");
        let mut flush = |chunk: &[Bytes]| f(chunk);
        let mut listed = Listed {
            records: Vec::with_capacity(chunk_max),
            chunk: Some((chunk_max, &mut flush)),
        };
        let cur_rev = self.reader.current_revision();
        self.reader.txn_reads(
            &self.req,
            cur_rev,
            &mut listed,
            &mut KeysBudget::unbounded(),
        );
        if !listed.records.is_empty() {
            listed.flush();
        }
    }
}

impl std::fmt::Debug for TxnReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnReads").field("req", &self.req).finish()
    }
}

/// A handle for lock-free reads of the published state. Cheap to clone; one per shard.
#[derive(Clone)]
pub struct Reader {
    pub(crate) shared: Arc<Shared>,
}

/// The write set of one txn being applied: every write gets `main = begin_rev + 1`.
struct TxnCtx {
    begin_rev: i64,
    writes: i64,
    events: Vec<Event>,
    /// At most this many events are kept (`apply_bounded`); past it `events` is emptied and
    /// `events_cut` set, and nothing more is gathered.
    events_max: usize,
    events_cut: bool,
    counts: WriteCounts,
    /// The answer's values in durable segments' mapped files, left unread: the raft core
    /// applies, and must not wait for the disk to fill in an answer a shard serves (the
    /// shard brings their pages in off its own thread and checks them, see `Unchecked`).
    checks: Vec<RecordCheck>,
}

impl TxnCtx {
    fn new(begin_rev: i64, events_max: usize) -> Self {
        TxnCtx {
            begin_rev,
            writes: 0,
            events: Vec::new(),
            events_max,
            events_cut: false,
            counts: WriteCounts::default(),
            checks: Vec::new(),
        }
    }

    /// Counts a write, and says whether its event is kept: not once the apply's events went
    /// past the bound. A write whose event is not kept builds none (with no watchers the
    /// member asks for none at all: building them was a tenth of a put's apply).
    fn note_write(&mut self, kind: EventKind, created: bool) -> bool {
        match kind {
            EventKind::Put => {
                self.counts.puts += 1;
                self.counts.created += u64::from(created);
            }
            EventKind::Delete => self.counts.deletes += 1,
        }
        if self.events_cut {
            return false;
        }
        if self.events.len() == self.events_max {
            // Free what was gathered now: the apply may go on for millions of keys.
            self.events = Vec::new();
            self.events_cut = true;
            return false;
        }
        true
    }

    /// Whether the next write's event would be kept (`note_write` says the same for it).
    fn keeps_next_event(&self) -> bool {
        !self.events_cut && self.events.len() < self.events_max
    }

    /// The revision a read inside the txn sees: its own writes included.
    fn read_rev(&self) -> i64 {
        self.begin_rev + i64::from(self.writes > 0)
    }

    fn next_revision(&self) -> Revision {
        Revision {
            main: self.begin_rev + 1,
            sub: self.writes,
        }
    }
}

/// Which branch each txn (the outer one first, then nested ones in the taken branches, depth first)
/// takes, decided on the state before the txn, as etcd's `compareToPath`.
struct TxnPath {
    succeeded: bool,
    nested: Vec<TxnPath>,
}

impl Writer {
    /// A new reader of this store.
    pub fn reader(&self) -> Reader {
        Reader {
            shared: self.shared.clone(),
        }
    }

    /// The raft index of the last applied entry (0 for an empty store).
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn current_revision(&self) -> i64 {
        self.current_rev
    }

    pub fn compact_revision(&self) -> i64 {
        self.compact_rev
    }

    /// Value-log bytes held (live or awaiting reclaim): the server's "db size".
    pub fn value_log_bytes(&self) -> u64 {
        self.vlog.bytes_total()
    }

    /// Live keys when this store was restored from a checkpoint (0 for a new store); writes
    /// since are not counted.
    pub fn live_keys_restored(&self) -> u64 {
        self.live_keys_restored
    }

    /// How many damaged records reclaim has met since this store was built, and the last one.
    /// Nothing was lost to them (reclaim moved every live value by walking the index), but a
    /// damaged record means a damaged disk or file, which an operator should hear of.
    pub fn unreadable_records(&self) -> (u64, Option<UnreadableRecord>) {
        (self.unreadable_records, self.last_unreadable_record)
    }

    /// Sealed value-log segments to write to disk, oldest first (only with `on_disk`). Write each
    /// to a file, make it durable, map it and hand the mapping to `segment_durable`.
    pub fn take_sealed_segments(&mut self) -> Vec<SealedSegment> {
        self.vlog.take_sealed()
    }

    /// Record bytes sealed and not yet reported durable: the driver stops taking writes while
    /// this is above its bound.
    pub fn sealed_backlog_bytes(&self) -> u64 {
        self.vlog.sealed_backlog_bytes()
    }

    /// Hands what this thread deferred (replaced version lists, segment tables and the sealed
    /// segments' records they hold) to the epoch's global queue, and advances the epoch a step
    /// where no thread pinned earlier holds it back, freeing the bags it passed (what this
    /// call hands over goes about two calls later). A thread's deferred frees otherwise wait
    /// in its own bag until 64 fill it, and are collected only every 128 pins: an idle writer
    /// kept the last segments' records, megabytes, for as long as it stayed idle. The driver
    /// calls it once a raft tick.
    pub fn release_deferred(&self) {
        epoch::pin().flush();
    }

    /// Segment `id` (of `sealed_bytes` record bytes) is durable in `file`, its mapped contents:
    /// readers read its values from `file` from now on, so the memory copy is freed (or its
    /// buffer kept for a later segment) once the last reader drops its slice. A segment that reclaim removed meanwhile is only counted.
    /// No version changes: each names its segment, and the segment table says where that is.
    pub fn segment_durable(&mut self, id: u32, sealed_bytes: u64, file: Bytes) {
        self.vlog.sealed_written(sealed_bytes);
        self.vlog.mark_durable(id, file);
    }

    /// Segments removed since the last call, whose files go once no kept checkpoint refers to
    /// them (only with `on_disk`).
    pub fn take_dead_segments(&mut self) -> Vec<DeadSegment> {
        let died_at_index = self.applied_index;
        std::mem::take(&mut self.vlog.dead)
            .into_iter()
            .map(|id| DeadSegment { id, died_at_index })
            .collect()
    }

    /// The value-log options for a store that replaces this one (a leader's snapshot): the same
    /// settings, with segment ids above every one this store used.
    pub fn successor_value_log(&self) -> ValueLogOptions {
        self.vlog.successor()
    }

    /// Every segment id this store uses or used (the open one is the highest): a store that
    /// replaces this one starts above it.
    pub fn segment_ids(&self) -> Vec<u32> {
        self.vlog.segments.keys().copied().collect()
    }

    /// Value-log bytes still referenced by the index.
    pub fn value_log_bytes_live(&self) -> u64 {
        self.vlog.bytes_live()
    }

    /// Bytes the store holds: every value-log record (header, key and value; live or awaiting
    /// reclaim), which is what the segment files hold on disk, plus the index and the leases,
    /// which the checkpoint holds. Status's dbSize and the quota count this, as etcd counts
    /// its database file.
    pub fn size_bytes(&self) -> u64 {
        self.vlog.record_bytes_total() + self.index_bytes + self.leases.len() as u64 * LEASE_BYTES
    }

    /// Publishes `size_bytes` to readers (`Reader::size_bytes_published`). Every apply does;
    /// the driver calls it after work that changes the size between applies (compaction,
    /// reclaim, segments leaving). Not while an entry is applied in steps: the size then
    /// counts what its steps wrote, which readers must not see before its last step
    /// publishes it.
    pub fn publish_size(&self) {
        if self.stepping.is_some() {
            return;
        }
        self.shared
            .size_bytes
            .store(self.size_bytes(), Ordering::Release);
    }

    /// Bytes still in use: live values' records, the index and the leases (Status's
    /// dbSizeInUse).
    pub fn size_bytes_in_use(&self) -> u64 {
        self.vlog.record_bytes_live() + self.index_bytes + self.leases.len() as u64 * LEASE_BYTES
    }

    /// Accounts one more version of `key` in the index.
    pub(crate) fn index_grew(&mut self, key_bytes: usize) {
        self.index_bytes += key_bytes as u64 + VERSION_INDEX_BYTES;
        self.versions_held += 1;
        self.writes.versions_added += 1;
        self.writes.key_bytes_added += key_bytes as u64;
    }

    /// Records a raft entry that carries no store operation (empty entries, conf changes).
    pub fn apply_empty(&mut self, raft_index: u64) {
        self.assert_not_stepping();
        assert!(
            raft_index > self.applied_index,
            "raft entries are applied once, in index order"
        );
        self.applied_index = raft_index;
    }

    /// Starts loading into the CPU's cache what puts of `keys`, applied next, will read of
    /// the index (see `KeyLookup::prefetch`). Changes nothing: a hint, which a caller gives
    /// for the entries it is about to apply so that their cache misses overlap.
    pub fn prefetch_keys(&self, keys: &[&[u8]]) {
        self.lookup.prefetch(keys);
    }

    /// Applies one committed entry. Deterministic: the same entries give the same state. An error
    /// leaves the state untouched (only the applied index moves) and produces no events.
    pub fn apply(&mut self, raft_index: u64, op: &Op) -> Result<Applied> {
        self.apply_bounded(raft_index, op, usize::MAX)
    }

    /// `apply`, keeping at most `events_max` watch events. An entry that writes more (a
    /// DeleteRange of millions of keys) hands out none and says so (`Applied::events_cut`):
    /// gathering them costs the raft core about as much as the delete itself (300 bytes per
    /// event, the kernel zeroing each new page), and watchers can read that revision from
    /// history instead, on their own shards.
    pub fn apply_bounded(
        &mut self,
        raft_index: u64,
        op: &Op,
        events_max: usize,
    ) -> Result<Applied> {
        self.apply_whole(raft_index, op, events_max, None)
    }

    /// `apply_bounded`, with a txn's compares and checks already evaluated at the current
    /// revision (`txn_path`, as `apply_in_steps` does to choose): they are not run again.
    fn apply_whole<'a>(
        &mut self,
        raft_index: u64,
        op: &'a Op,
        events_max: usize,
        evaluated: Option<Result<(TxnPath, ChosenOps<'a>)>>,
    ) -> Result<Applied> {
        self.assert_not_stepping();
        assert!(
            raft_index > self.applied_index,
            "raft entries are applied once, in index order"
        );
        self.applied_index = raft_index;
        let rev_before = self.current_rev;
        let mut ctx = TxnCtx::new(self.current_rev, events_max);
        let response = match op {
            Op::Put(req) => {
                if req.lease != 0 && !self.leases.contains_key(&req.lease) {
                    return Err(KvError::LeaseNotFound);
                }
                self.check_put(req, ctx.read_rev())?;
                OpResponse::Put(self.put(&mut ctx, req))
            }
            Op::DeleteRange(req) => OpResponse::DeleteRange(self.delete_range(&mut ctx, req)),
            Op::Txn(req) => OpResponse::Txn(self.txn(&mut ctx, req, evaluated)?),
            Op::Compact(req) => OpResponse::Compact(self.compact(req)?),
            Op::LeaseGrant(req) => OpResponse::LeaseGrant(self.lease_grant(req)?),
            Op::LeaseRevoke(req) => OpResponse::LeaseRevoke(self.lease_revoke(&mut ctx, req)?),
        };
        Ok(self.finish_apply(ctx, response, rev_before))
    }

    /// Publishes an applied op's writes and hands out what it produced.
    fn finish_apply(&mut self, ctx: TxnCtx, response: OpResponse, rev_before: i64) -> Applied {
        self.publish(&ctx);
        self.publish_size();
        assert!(self.current_rev == rev_before + i64::from(ctx.writes > 0));
        Applied {
            response: Unchecked::new(response, ctx.checks),
            events: ctx.events,
            events_cut: ctx.events_cut,
            counts: ctx.counts,
        }
    }

    /// `apply_bounded`, but an op that may write without limit (a DeleteRange of a range, or
    /// the revoke of a lease, of millions of keys perhaps) visits at most `keys_max` keys per
    /// call: the caller goes on with `apply_step` until it is `Done`, and may do other work in
    /// between (a raft core sends heartbeats: one apply of a million deletes took 1.2-1.5 s, past an election
    /// timeout, and cost a 3-member cluster its leader). Until then the entry is not applied:
    /// `applied_index` stays before it and no reader sees any of its writes, and nothing else
    /// may change the store (`apply*`, compaction) or capture it for a checkpoint. A txn
    /// whose compares or chosen ops walk a range (a range delete, a range read, a compare of
    /// a range: each about 0.3-0.5 s over a million keys) is applied in steps too, its
    /// compares and ops counting the keys they visit, and at least one each. Every other op
    /// is applied whole, as by `apply_bounded`.
    pub fn apply_in_steps(
        &mut self,
        raft_index: u64,
        op: &Op,
        events_max: usize,
        keys_max: usize,
    ) -> Progress {
        let what = match op {
            Op::DeleteRange(req) if !req.range_end.is_empty() => Stepped::Delete {
                walk: DeleteWalk::starting_at(req.key.clone()),
                req: req.clone(),
            },
            Op::LeaseRevoke(req) if self.leases.contains_key(&req.id) => {
                Stepped::Revoke { id: req.id }
            }
            // Compares of ranges are decided in steps, then the chosen ops applied in steps.
            Op::Txn(req) if txn_compares_ranges(req) => Stepped::Txn {
                req: req.clone(),
                phase: TxnPhase::Comparing(CompareEval::default()),
            },
            Op::Txn(req) if txn_walks_ranges(req) => {
                // A txn refused by its checks, or whose compares chose ops that walk no
                // range, is applied whole (and the refusal answered) as before, without
                // evaluating its compares again.
                match self.txn_path(self.current_rev, req) {
                    Ok((path, ops)) if ops.iter().any(walks_a_range) => Stepped::Txn {
                        req: req.clone(),
                        phase: TxnPhase::Applying {
                            path,
                            progress: TxnProgress::default(),
                        },
                    },
                    evaluated => {
                        return Progress::Done(self.apply_whole(
                            raft_index,
                            op,
                            events_max,
                            Some(evaluated),
                        ))
                    }
                }
            }
            _ => return Progress::Done(self.apply_bounded(raft_index, op, events_max)),
        };
        self.assert_not_stepping();
        assert!(
            raft_index > self.applied_index,
            "raft entries are applied once, in index order"
        );
        self.stepping = Some(raft_index);
        let steps = ApplyInSteps {
            raft_index,
            what,
            ctx: TxnCtx::new(self.current_rev, events_max),
            rev_before: self.current_rev,
        };
        self.apply_step(steps, keys_max)
    }

    /// The next step of an entry `apply_in_steps` began: at most `keys_max` more keys.
    pub fn apply_step(&mut self, mut steps: ApplyInSteps, keys_max: usize) -> Progress {
        assert!(keys_max > 0, "a step visits at least one key");
        assert_eq!(
            self.stepping,
            Some(steps.raft_index),
            "steps continue the entry being applied in steps"
        );
        let response = match &mut steps.what {
            Stepped::Delete { req, walk } => {
                self.delete_range_walk(&mut steps.ctx, req, walk, keys_max);
                if walk.next_key.is_some() {
                    return Progress::More(steps);
                }
                OpResponse::DeleteRange(walk.response(&steps.ctx))
            }
            Stepped::Revoke { id } => {
                let req = LeaseRevokeRequest { id: *id };
                if !self.lease_revoke_keys(&mut steps.ctx, &req, keys_max) {
                    return Progress::More(steps);
                }
                OpResponse::LeaseRevoke(
                    self.lease_revoke(&mut steps.ctx, &req)
                        .expect("the lease is checked before the first step"),
                )
            }
            Stepped::Txn { req, phase } => {
                let mut keys_left = keys_max;
                if let TxnPhase::Comparing(eval) = phase {
                    let begin_rev = steps.ctx.begin_rev;
                    let Some(path) = eval.step(
                        &self.shared,
                        Some(&self.lookup),
                        req,
                        begin_rev,
                        self.compact_rev,
                        &mut keys_left,
                    ) else {
                        return Progress::More(steps);
                    };
                    match self.txn_checks(begin_rev, req, path) {
                        Ok((path, _)) => {
                            *phase = TxnPhase::Applying {
                                path,
                                progress: TxnProgress::default(),
                            }
                        }
                        Err(e) => {
                            // Refused whole, as `apply_whole` refuses a txn: nothing was
                            // written, only the applied index moves.
                            assert_eq!(steps.ctx.writes, 0, "compares write nothing");
                            self.stepping = None;
                            self.applied_index = steps.raft_index;
                            return Progress::Done(Err(e));
                        }
                    }
                    if keys_left == 0 {
                        return Progress::More(steps);
                    }
                }
                let TxnPhase::Applying { path, progress } = phase else {
                    unreachable!("the compares are decided")
                };
                let ops = chosen_ops(req, path);
                if !self.txn_ops(&mut steps.ctx, &ops, progress, keys_left) {
                    return Progress::More(steps);
                }
                OpResponse::Txn(txn_response(req, path, progress, &steps.ctx))
            }
        };
        self.stepping = None;
        self.applied_index = steps.raft_index;
        Progress::Done(Ok(self.finish_apply(steps.ctx, response, steps.rev_before)))
    }

    /// The raft index of the entry being applied in steps, if one is.
    pub fn stepping(&self) -> Option<u64> {
        self.stepping
    }

    pub(crate) fn assert_not_stepping(&self) {
        assert!(
            self.stepping.is_none(),
            "the entry at index {:?} is being applied in steps: nothing else changes the store \
             until it completes",
            self.stepping
        );
    }

    /// Makes a finished txn visible to readers: one revision bump, only if it wrote.
    fn publish(&mut self, ctx: &TxnCtx) {
        if ctx.writes == 0 {
            assert!(ctx.events.is_empty());
            return;
        }
        assert!(ctx.events_cut || ctx.events.len() as i64 == ctx.writes);
        let counted = ctx.counts.puts + ctx.counts.deletes;
        assert!(counted as i64 == ctx.writes, "every write is counted once");
        self.current_rev = ctx.begin_rev + 1;
        self.shared
            .current_rev
            .store(self.current_rev, Ordering::Release);
    }

    fn range(&self, ctx: &mut TxnCtx, req: &RangeRequest) -> RangeResponse {
        range_at_unchecked(&self.shared, req, ctx.read_rev(), self.compact_rev)
            .expect("txn ranges are checked against the compact and current revision before apply")
            .into_parts(&mut ctx.checks)
    }

    /// The apply-time checks of one put: `ignore_*` needs an existing key.
    fn check_put(&self, req: &PutRequest, read_rev: i64) -> Result<()> {
        if (req.ignore_value || req.ignore_lease) && self.latest(&req.key, read_rev).is_none() {
            return Err(KvError::KeyNotFound);
        }
        Ok(())
    }

    /// The key's live state at `rev`, its value unread: a write needs only the metadata, and
    /// reads the value only when its request asks for it.
    fn latest(&self, key: &[u8], rev: i64) -> Option<PrevKv> {
        let found = self.lookup.find(&self.shared.index, key)?;
        let guard = epoch::pin();
        live_at(found.history.load(&guard), rev).map(|v| v.to_prev_kv(found.key, self.vlog.table()))
    }

    fn put(&mut self, ctx: &mut TxnCtx, req: &PutRequest) -> PutResponse {
        // One index lookup per put: the node found here is the one `write_put` appends to.
        let shared = self.shared.clone();
        let entry = self.lookup.find(&shared.index, &req.key);
        let live = entry.as_ref().and_then(|e| {
            let guard = epoch::pin();
            live_at(e.history.load(&guard), ctx.read_rev()).cloned()
        });
        // The previous key-value whole (a copy of its key, its value's record found) only
        // where something reads it: the answer's prev_kv, an ignore_value put, or the write's
        // watch event. A plain put needs only the live version's revisions and lease.
        let needs_prev = req.prev_kv || req.ignore_value || ctx.keeps_next_event();
        let prev = match (&entry, &live) {
            (Some(e), Some(v)) if needs_prev => Some(v.to_prev_kv(e.key, self.vlog.table())),
            _ => None,
        };
        let (value, lease) = match (&live, &prev, req.ignore_value, req.ignore_lease) {
            (Some(v), Some(p), true, true) => (p.clone().checked().value, v.lease),
            (Some(_), Some(p), true, false) => (p.clone().checked().value, req.lease),
            (Some(v), _, false, true) => (req.value.clone(), v.lease),
            (_, _, false, false) => (req.value.clone(), req.lease),
            _ => panic!("ignore_* on a missing key must be rejected before apply"),
        };
        let prev_kv = if req.prev_kv {
            prev.clone().map(|p| p.into_answer(&mut ctx.checks))
        } else {
            None
        };
        self.write_put(ctx, &req.key, entry, &value, lease, live.as_ref(), prev);
        PutResponse {
            revision: ctx.begin_rev + 1,
            prev_kv,
        }
    }

    /// Writes a put of `key`, whose index node (if it has one) is `entry`; `live` is the
    /// key's live version before it, and `prev` that version whole when the put's watch event
    /// is kept (`TxnCtx::keeps_next_event`).
    #[allow(clippy::too_many_arguments)]
    fn write_put(
        &mut self,
        ctx: &mut TxnCtx,
        key: &[u8],
        entry: Option<Found<'_>>,
        value: &[u8],
        lease: i64,
        live: Option<&Version>,
        prev: Option<PrevKv>,
    ) {
        assert!(!key.is_empty(), "empty keys are rejected before apply");
        let keep_event = ctx.note_write(EventKind::Put, live.is_none());
        assert!(
            !keep_event || prev.is_some() == live.is_some(),
            "a kept event's previous key-value was read"
        );
        let event_prev = if keep_event {
            self.event_prev(ctx, entry, prev.as_ref())
        } else {
            None
        };
        let rev = ctx.next_revision();
        let guard = epoch::pin();
        // A copy of the key for the event and the lease, never a clone of the index's own: a
        // clone would give that key a shared header (32 bytes more per key, for as long as it
        // lives), and a slice of the request would pin the whole request buffer.
        let key_bytes = (keep_event || lease != 0).then(|| Bytes::copy_from_slice(key));
        let placed = self.vlog.append(key, rev, value);
        self.index_grew(key.len());
        self.dirty.wrote(key, rev.main, self.shared.index.len());
        let version = Version::put(
            rev,
            live.map_or(rev.main, |v| v.create_revision),
            live.map_or(1, |v| v.version + 1),
            lease,
            placed.value_len,
            placed.segment,
            placed.offset,
        );
        if let Some(v) = live {
            if v.lease != 0 {
                self.detach(v.lease, key);
            }
        }
        if lease != 0 {
            let entry = self
                .leases
                .get_mut(&lease)
                .expect("a put's lease is checked before apply");
            entry
                .keys
                .insert(key_bytes.clone().expect("copied for a lease"));
        }
        // The event takes the copy itself when no lease shares it: the first clone of a
        // Vec-backed Bytes allocates, once per put on the raft core.
        let kv = key_bytes
            .filter(|_| keep_event)
            .map(|key_bytes| version.fresh_key_value(key_bytes, self.vlog.table()));
        match &entry {
            Some(e) => e.history.push(version, &guard),
            None => {
                // Not noted in the lookup: it learns the keys written again (see `lookup`).
                // `get_or_insert`, not `insert`: the same search, and should `find` ever miss a
                // key the index holds, this finds the old node and the assert stops the writer,
                // where `insert` would replace the node and lose the key's history.
                let inserted = self
                    .shared
                    .index
                    .get_or_insert(Box::from(key), KeyHistory::new(vec![version]));
                let versions = inserted.value().load(&guard);
                assert!(
                    versions.len() == 1 && versions[0].rev() == rev,
                    "a put created a key the index already held: the writer's lookup missed it"
                );
                self.key_bytes_held += key.len() as u64;
                self.writes.keys_created += 1;
            }
        }
        ctx.writes += 1;
        if let Some(kv) = kv {
            ctx.events.push(Event {
                kind: EventKind::Put,
                kv,
                prev_kv: event_prev.unwrap_or(prev),
            });
        }
    }

    /// The previous state the watch event of a write of this txn carries, when it is not the
    /// state the write found (`prev`): etcd reads it at the event's revision less one, the
    /// key as it stood before the txn, so an earlier op of the txn that wrote the key does
    /// not show. None when `prev` is that state (the common case: asked only once the txn
    /// wrote something).
    fn event_prev(
        &self,
        ctx: &TxnCtx,
        entry: Option<Found<'_>>,
        prev: Option<&PrevKv>,
    ) -> Option<Option<PrevKv>> {
        let written_in_txn = match prev {
            Some(p) => p.mod_revision() > ctx.begin_rev,
            // Missing: never there, or deleted by an earlier op of this txn.
            None => ctx.writes > 0,
        };
        if !written_in_txn {
            return None;
        }
        let guard = epoch::pin();
        Some(entry.and_then(|e| {
            live_at(e.history.load(&guard), ctx.begin_rev)
                .map(|v| v.to_prev_kv(e.key, self.vlog.table()))
        }))
    }

    fn detach(&mut self, lease: i64, key: &[u8]) {
        // A lease revoked earlier has already forgotten its keys; a put that overwrites such a key
        // cannot happen because revoke deletes them.
        let entry = self
            .leases
            .get_mut(&lease)
            .expect("an attached lease exists until revoked");
        let removed = entry.keys.remove(key);
        assert!(removed, "an attached key is in its lease's key set");
    }

    fn delete_range(&mut self, ctx: &mut TxnCtx, req: &DeleteRangeRequest) -> DeleteRangeResponse {
        let mut walk = DeleteWalk::starting_at(req.key.clone());
        self.delete_range_walk(ctx, req, &mut walk, usize::MAX);
        assert!(walk.next_key.is_none(), "an unbounded walk reaches the end");
        walk.response(ctx)
    }

    /// Walks `req`'s range from `walk.next_key`, writing a tombstone over each live key, and
    /// stops before the key past `keys_max` visited ones (left in `walk.next_key`). Returns
    /// how many keys it visited.
    fn delete_range_walk(
        &mut self,
        ctx: &mut TxnCtx,
        req: &DeleteRangeRequest,
        walk: &mut DeleteWalk,
        keys_max: usize,
    ) -> usize {
        let Some(from) = walk.next_key.take() else {
            return 0;
        };
        let read_rev = ctx.read_rev();
        // One walk that deletes as it goes: it neither looks each key up again nor gathers
        // them first. It visits each key once, and a tombstone changes only its own key's
        // list, so every key the walk reaches is as the delete found it. A walk resumed in a
        // later step starts at the key it stopped before: the keys behind it have tombstones
        // at this delete's revision, which the read revision (its own writes included) sees.
        let shared = self.shared.clone();
        let mut visited = 0usize;
        let mut visit = |this: &mut Self, found: Found<'_>| {
            if visited == keys_max {
                walk.next_key = Some(Bytes::copy_from_slice(found.key));
                return false;
            }
            visited += 1;
            let prev = {
                let guard = epoch::pin();
                let Some(v) = live_at(found.history.load(&guard), read_rev) else {
                    return true;
                };
                v.to_prev_kv(found.key, this.vlog.table())
            };
            if req.prev_kv {
                walk.prev_kvs
                    .push(prev.clone().into_answer(&mut ctx.checks));
            }
            walk.deleted += 1;
            this.write_delete(ctx, found, prev);
            true
        };
        if req.range_end.is_empty() {
            // One key: through the writer's lookup, as a put finds its key.
            if let Some(found) = self.lookup.find(&shared.index, &from) {
                visit(self, found);
            }
        } else {
            for_each_entry_in_range(&shared.index, &from, &req.range_end, |entry| {
                visit(self, Found::of(&entry))
            });
        }
        visited
    }

    /// Writes a tombstone over `prev`, the live version of `entry`'s key.
    fn write_delete(&mut self, ctx: &mut TxnCtx, entry: Found<'_>, prev: PrevKv) {
        let keep_event = ctx.note_write(EventKind::Delete, false);
        let event_prev = if keep_event {
            self.event_prev(ctx, Some(entry), Some(&prev))
        } else {
            None
        };
        let rev = ctx.next_revision();
        let guard = epoch::pin();
        let old = entry.history.load(&guard);
        assert!(
            old.last()
                .is_some_and(|v| v.kind() == VersionKind::Put && v.rev() < rev),
            "only a live key is deleted"
        );
        entry.history.push(Version::tombstone(rev), &guard);
        self.index_grew(entry.key.len());
        self.dirty
            .wrote(entry.key, rev.main, self.shared.index.len());
        if prev.lease() != 0 {
            self.detach(prev.lease(), entry.key);
        }
        ctx.writes += 1;
        if keep_event {
            ctx.events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    // The previous state's copy of the key (never the index's own bytes).
                    key: prev.key().clone(),
                    mod_revision: rev.main,
                    ..KeyValue::default()
                },
                prev_kv: event_prev.unwrap_or(Some(prev)),
            });
        }
    }

    /// Applies a txn whole; `evaluated` is its `txn_path` at `ctx.begin_rev` when the caller
    /// already has it.
    fn txn<'a>(
        &mut self,
        ctx: &mut TxnCtx,
        req: &'a TxnRequest,
        evaluated: Option<Result<(TxnPath, ChosenOps<'a>)>>,
    ) -> Result<TxnResponse> {
        assert!(ctx.writes == 0, "a txn starts its own write set");
        let (path, ops) = match evaluated {
            Some(evaluated) => evaluated?,
            None => self.txn_path(ctx.begin_rev, req)?,
        };
        let mut progress = TxnProgress::default();
        let done = self.txn_ops(ctx, &ops, &mut progress, usize::MAX);
        assert!(done, "an unbounded txn applies all its ops");
        Ok(txn_response(req, &path, &mut progress, ctx))
    }

    /// The branches `req`'s compares choose at `begin_rev` and the ops on them
    /// (`chosen_ops`), once those passed the checks that refuse a txn whole (a put's missing
    /// key or lease, a range's revision).
    fn txn_path<'a>(
        &self,
        begin_rev: i64,
        req: &'a TxnRequest,
    ) -> Result<(TxnPath, ChosenOps<'a>)> {
        let path = compare_path(
            &self.shared,
            Some(&self.lookup),
            req,
            begin_rev,
            self.compact_rev,
        );
        self.txn_checks(begin_rev, req, path)
    }

    /// `txn_path` with the compares already decided: `path`, once its ops passed the checks.
    fn txn_checks<'a>(
        &self,
        begin_rev: i64,
        req: &'a TxnRequest,
        path: TxnPath,
    ) -> Result<(TxnPath, ChosenOps<'a>)> {
        let ops = chosen_ops(req, &path);
        if txn_writes(req) {
            // A put that keeps the key's value or lease needs the key as the txn finds it
            // when the put runs: one an earlier delete of the txn removed is missing too.
            // (etcd checks the state before the txn, and then its apply panics on every
            // member.) The duplicate-key check lets such a txn through when the delete runs
            // to "\0", an end it compares literally.
            let mut deletes: Vec<&DeleteRangeRequest> = Vec::new();
            for op in ops.iter() {
                match op {
                    RequestOp::Put(p) => {
                        if (p.ignore_value || p.ignore_lease)
                            && deletes.iter().any(|d| deletes_key(d, &p.key))
                        {
                            return Err(KvError::KeyNotFound);
                        }
                        self.check_put(p, begin_rev)?;
                        if p.lease != 0 && !self.leases.contains_key(&p.lease) {
                            return Err(KvError::LeaseNotFound);
                        }
                    }
                    RequestOp::DeleteRange(d) => deletes.push(d),
                    _ => {}
                }
            }
        }
        for op in ops.iter() {
            match op {
                RequestOp::Range(r) if r.revision > begin_rev => {
                    return Err(KvError::FutureRevision)
                }
                RequestOp::Range(r) if r.revision > 0 && r.revision < self.compact_rev => {
                    return Err(KvError::Compacted)
                }
                _ => {}
            }
        }
        Ok((path, ops))
    }

    /// Applies a txn's chosen `ops` from `progress.next` on, visiting at most `keys_max` keys:
    /// a range delete or read counts the keys its walk visits (at least one), any other op
    /// one. Returns true once
    /// every op is applied; otherwise `progress` says where the next call goes on.
    fn txn_ops(
        &mut self,
        ctx: &mut TxnCtx,
        ops: &ChosenOps<'_>,
        progress: &mut TxnProgress,
        keys_max: usize,
    ) -> bool {
        let mut keys_left = keys_max;
        while let Some(op) = ops.get(progress.next) {
            if keys_left == 0 {
                return false;
            }
            let resp = match op {
                RequestOp::Range(r) if !r.range_end.is_empty() => {
                    let read_rev = ctx.read_rev();
                    let compact_rev = self.compact_rev;
                    let gather = progress.range.get_or_insert_with(|| {
                        Box::new(RangeGather::start(r, read_rev, compact_rev).expect(
                            "txn ranges are checked against the compact and current revision \
                             before apply",
                        ))
                    });
                    keys_left -= gather.walk(&self.shared, r, keys_left).max(1);
                    if !gather.walked() {
                        return false;
                    }
                    let gather = progress.range.take().expect("the walk just ended");
                    ResponseOp::Range(gather.finish(r).into_parts(&mut ctx.checks))
                }
                RequestOp::Range(r) => {
                    keys_left -= 1;
                    ResponseOp::Range(self.range(ctx, r))
                }
                RequestOp::Put(p) => {
                    keys_left -= 1;
                    ResponseOp::Put(self.put(ctx, p))
                }
                RequestOp::DeleteRange(d) => {
                    let walk = progress
                        .walk
                        .get_or_insert_with(|| DeleteWalk::starting_at(d.key.clone()));
                    // A delete that found no key still costs one, as every op does.
                    keys_left -= self.delete_range_walk(ctx, d, walk, keys_left).max(1);
                    if walk.next_key.is_some() {
                        return false;
                    }
                    let mut walk = progress.walk.take().expect("the walk just ended");
                    ResponseOp::DeleteRange(walk.response(ctx))
                }
                RequestOp::Txn(_) => unreachable!("chosen_ops flattens nested txns"),
            };
            progress.responses.push(resp);
            progress.next += 1;
        }
        true
    }

    fn compact(&mut self, req: &CompactionRequest) -> Result<CompactionResponse> {
        if req.revision <= self.compact_rev {
            return Err(KvError::Compacted);
        }
        if req.revision > self.current_rev {
            return Err(KvError::FutureRevision);
        }
        self.compact_rev = req.revision;
        // Readers check this before and after reading, so they never use a list compaction touched
        // at a revision it no longer covers.
        self.shared
            .compact_rev
            .store(req.revision, Ordering::Release);
        // A newer compaction subsumes one still running: restart the scan with the higher revision.
        self.compaction = Some(CompactionCursor {
            rev: req.revision,
            next_key: None,
        });
        Ok(CompactionResponse {
            revision: self.current_rev,
        })
    }

    /// The full checkpoint that incremental checkpoints are taken against is at `revision`:
    /// from now on compaction removes a deleted key outright only when its tombstone is at or
    /// below it (see `tombstones_kept_after`). Only ever raised: keeping more is always safe.
    pub fn set_delta_base_revision(&mut self, revision: i64) {
        self.tombstones_kept_after = if self.tombstones_kept_after == i64::MAX {
            revision
        } else {
            self.tombstones_kept_after.max(revision)
        };
        self.dirty.rebase(self.tombstones_kept_after);
    }

    /// A checkpoint captured at `revision` may become the base of later deltas once written:
    /// from the capture on, compaction keeps the tombstones newer than it (or than the
    /// current base, if older). Without this, a store with no base yet (just started or
    /// restored) would let compaction remove a key deleted while that first checkpoint is
    /// written, and a delta against it would miss the delete, so the key would come back.
    pub(crate) fn may_become_base(&mut self, revision: i64) {
        self.tombstones_kept_after = self.tombstones_kept_after.min(revision);
    }

    /// The revision `set_delta_base_revision` last set (`i64::MAX`: none).
    pub fn delta_base_revision(&self) -> i64 {
        self.tombstones_kept_after
    }

    /// After a restore, finishes whatever compaction the checkpoint was taken in the middle of.
    pub(crate) fn resume_compaction(&mut self) {
        if self.compact_rev != COMPACT_REVISION_NONE {
            self.compaction = Some(CompactionCursor {
                rev: self.compact_rev,
                next_key: None,
            });
        }
    }

    fn reclaim_mode(&self) -> Reclaim {
        if self.defragmenting {
            Reclaim::Everything
        } else {
            Reclaim::MostlyDead
        }
    }

    /// The mapped file the next compaction step reads, when it is a reclaim of a durable
    /// segment (the walk of its records, or of the index for values still in it): its pages
    /// may be on disk, and the raft core, which runs the steps, must not wait for them, so
    /// its driver has them brought in first. None while the step walks only the index.
    pub fn reclaim_file(&self) -> Option<Bytes> {
        let segment = match &self.reclaim {
            Some(cursor) => cursor.segment,
            None if self.compaction.is_none() => {
                self.vlog.reclaim_candidate(self.reclaim_mode())?
            }
            None => return None,
        };
        self.vlog.durable_file(segment).cloned()
    }

    /// Whether background compaction work remains.
    pub fn compaction_pending(&self) -> bool {
        self.compaction.is_some()
            || self.reclaim.is_some()
            || self.vlog.reclaim_candidate(self.reclaim_mode()).is_some()
    }

    /// Asks the compactor to rewrite every frozen value-log segment that holds a dead byte, not
    /// only mostly dead ones, so the store gives back all the space compaction freed. The work
    /// runs in the same bounded `compact_step`s as compaction (readers and writers go on); it is
    /// done when `compaction_pending` turns false.
    pub fn defragment(&mut self) {
        self.vlog.seal_open_if_dead();
        // Only while there is something to do: a flag left set would make every later segment
        // with one dead byte a rewrite candidate.
        self.defragmenting = self.compaction.is_some()
            || self.reclaim.is_some()
            || self.vlog.reclaim_candidate(Reclaim::Everything).is_some();
    }

    /// Does a bounded amount of compaction: at most `keys_max` index entries, then at most `keys_max`
    /// value rewrites. The server calls it between applies until it returns `Idle`; readers keep
    /// working throughout.
    pub fn compact_step(&mut self, keys_max: usize) -> CompactionStatus {
        assert!(keys_max > 0, "a step must make progress");
        self.assert_not_stepping();
        if let Some(cursor) = self.compaction.take() {
            self.compaction = self.compact_keys(cursor, keys_max);
            return CompactionStatus::Pending;
        }
        if self.reclaim.is_none() {
            self.reclaim = self
                .vlog
                .reclaim_candidate(self.reclaim_mode())
                .map(|segment| ReclaimCursor {
                    segment,
                    next: ReclaimNext::Record(0),
                });
        }
        match self.reclaim.take() {
            Some(cursor) => {
                self.reclaim = self.reclaim_values(cursor, keys_max);
                CompactionStatus::Pending
            }
            None => {
                self.defragmenting = false;
                CompactionStatus::Idle
            }
        }
    }

    fn compact_keys(
        &mut self,
        cursor: CompactionCursor,
        keys_max: usize,
    ) -> Option<CompactionCursor> {
        use std::ops::Bound;
        let guard = epoch::pin();
        let lower = match &cursor.next_key {
            Some(k) => Bound::Included(k.as_ref()),
            None => Bound::Unbounded,
        };
        let mut next_key: Option<Bytes> = None;
        let mut emptied: Vec<Bytes> = Vec::new();
        let shared = self.shared.clone();
        for (visited, entry) in shared
            .index
            .range::<[u8], _>((lower, Bound::Unbounded))
            .enumerate()
        {
            if visited == keys_max {
                next_key = Some(Bytes::copy_from_slice(entry.key()));
                break;
            }
            let versions = entry.value().load(&guard);
            let mut keep_from = compacted_start(versions, cursor.rev);
            let at_or_below = versions.partition_point(|v| v.main() <= cursor.rev);
            if keep_from > 0
                && keep_from == at_or_below
                && versions[keep_from - 1].main() > self.tombstones_kept_after
            {
                // Cut at a tombstone newer than the delta base: keep that one (see
                // `tombstones_kept_after`).
                keep_from -= 1;
            }
            if keep_from == 0 {
                continue;
            }
            for v in &versions[..keep_from] {
                self.vlog
                    .release(v.segment, v.value_len(), v.record_len(entry.key()));
                let version_bytes = entry.key().len() as u64 + VERSION_INDEX_BYTES;
                assert!(self.index_bytes >= version_bytes, "index bytes underflow");
                self.index_bytes -= version_bytes;
                self.versions_held -= 1;
                self.writes.versions_dropped += 1;
            }
            if keep_from == versions.len() {
                emptied.push(Bytes::copy_from_slice(entry.key()));
            } else {
                entry
                    .value()
                    .replace(versions[keep_from..].to_vec(), &guard);
            }
        }
        for key in emptied {
            // Only a key whose history is a tombstone at or below the compact revision is removed:
            // no readable revision can see it.
            self.key_bytes_held = self
                .key_bytes_held
                .checked_sub(key.len() as u64)
                .expect("key bytes underflow");
            self.lookup.remove(&self.shared.index, &key);
        }
        next_key.map(|k| CompactionCursor {
            rev: cursor.rev,
            next_key: Some(k),
        })
    }

    fn reclaim_values(
        &mut self,
        cursor: ReclaimCursor,
        values_max: usize,
    ) -> Option<ReclaimCursor> {
        let segment = cursor.segment;
        assert!(
            segment != self.vlog.open_id(),
            "the open segment is never rewritten"
        );
        let next = match cursor.next {
            ReclaimNext::Record(from) => self.reclaim_by_records(segment, from, values_max),
            ReclaimNext::Key(from) => self.reclaim_by_keys(segment, from, values_max),
        };
        match next {
            Some(next) => Some(ReclaimCursor { segment, next }),
            None => {
                self.vlog.remove_segment(segment);
                None
            }
        }
    }

    /// Rewrites `segment`'s values among the next `values_max` of its records (in memory, or
    /// in its file once durable). A record that cannot be read, or live values left once the
    /// walk ends, hand over to the walk of the index: a damaged dead record never strands a
    /// live one.
    fn reclaim_by_records(
        &mut self,
        segment: u32,
        from: usize,
        values_max: usize,
    ) -> Option<ReclaimNext> {
        let records = self.vlog.frozen_records(segment);
        let end = self.vlog.segments[&segment].record_bytes as usize;
        let mut offset = from;
        for _ in 0..values_max {
            if offset >= end {
                break;
            }
            let Some(record) = crate::vlog::record_at(&records, offset) else {
                self.unreadable_records += 1;
                self.last_unreadable_record = Some(UnreadableRecord {
                    segment,
                    offset: offset as u64,
                });
                return Some(ReclaimNext::Key(None));
            };
            let at = u32::try_from(offset).expect("segments are below 4 GiB");
            self.rewrite_value(segment, record.key, record.rev, Some(at));
            offset += record.record_bytes;
        }
        if offset < end {
            return Some(ReclaimNext::Record(offset));
        }
        (self.vlog.segments[&segment].bytes_live > 0).then_some(ReclaimNext::Key(None))
    }

    /// Rewrites the values in `segment` of up to `keys_max` keys of the index, from `from`.
    fn reclaim_by_keys(
        &mut self,
        segment: u32,
        from: Option<Bytes>,
        keys_max: usize,
    ) -> Option<ReclaimNext> {
        let guard = epoch::pin();
        let mut found: Vec<(Bytes, Revision)> = Vec::new();
        let mut next_key = None;
        let start = match &from {
            Some(k) => std::ops::Bound::Included(k.as_ref()),
            None => std::ops::Bound::Unbounded,
        };
        for (seen, entry) in self
            .shared
            .index
            .range::<[u8], _>((start, std::ops::Bound::Unbounded))
            .enumerate()
        {
            if seen == keys_max {
                next_key = Some(Bytes::copy_from_slice(entry.key()));
                break;
            }
            for v in entry.value().load(&guard) {
                if v.segment == segment {
                    found.push((Bytes::copy_from_slice(entry.key()), v.rev()));
                }
            }
        }
        drop(guard);
        for (key, rev) in &found {
            self.rewrite_value(segment, key, *rev, None);
        }
        next_key.map(|k| ReclaimNext::Key(Some(k)))
    }

    /// Moves `key`'s version `rev` to the open segment when it is still in `segment` (at
    /// `offset`, when the caller read it from there): a version compacted away or moved
    /// already is left alone.
    fn rewrite_value(&mut self, segment: u32, key: &[u8], rev: Revision, offset: Option<u32>) {
        let guard = epoch::pin();
        let Some(entry) = self.shared.index.get(key) else {
            return;
        };
        let versions = entry.value().load(&guard);
        let Ok(pos) = versions.binary_search_by(|v| v.rev().cmp(&rev)) else {
            return;
        };
        let v = &versions[pos];
        if v.segment != segment || offset.is_some_and(|at| at != v.offset) {
            return;
        }
        // Checked: a damaged record is never copied into a new segment as if it were good.
        let value = v.value(key, self.vlog.table());
        let placed = self.vlog.append(key, rev, &value);
        // Same key, same value: the old record was as long as the new one.
        self.vlog.release(segment, v.value_len(), v.record_len(key));
        let mut list = versions.to_vec();
        list[pos].value_len = placed.value_len;
        list[pos].segment = placed.segment;
        list[pos].offset = placed.offset;
        entry.value().replace(list, &guard);
    }

    fn lease_grant(&mut self, req: &LeaseGrantRequest) -> Result<LeaseGrantResponse> {
        assert!(req.id != 0, "the server picks a lease id before proposing");
        if req.ttl_s > LEASE_TTL_MAX_S {
            return Err(KvError::LeaseTtlTooLarge);
        }
        if self.leases.contains_key(&req.id) {
            return Err(KvError::LeaseExists);
        }
        self.leases.insert(
            req.id,
            LeaseEntry {
                ttl_s: req.ttl_s,
                keys: BTreeSet::new(),
            },
        );
        Ok(LeaseGrantResponse {
            revision: self.current_rev,
            id: req.id,
            ttl_s: req.ttl_s,
        })
    }

    fn lease_revoke(
        &mut self,
        ctx: &mut TxnCtx,
        req: &LeaseRevokeRequest,
    ) -> Result<LeaseRevokeResponse> {
        if !self.leases.contains_key(&req.id) {
            return Err(KvError::LeaseNotFound);
        }
        let all_deleted = self.lease_revoke_keys(ctx, req, usize::MAX);
        assert!(all_deleted, "an unbounded revoke deletes every key");
        let entry = self.leases.remove(&req.id).expect("checked above");
        assert!(entry.keys.is_empty(), "revoke detached every key");
        Ok(LeaseRevokeResponse {
            revision: ctx.begin_rev + i64::from(ctx.writes > 0),
        })
    }

    /// Deletes at most `keys_max` of the keys still attached to the lease `req` revokes;
    /// true once none is left.
    fn lease_revoke_keys(
        &mut self,
        ctx: &mut TxnCtx,
        req: &LeaseRevokeRequest,
        keys_max: usize,
    ) -> bool {
        let entry = self
            .leases
            .get(&req.id)
            .expect("the lease is checked first");
        let left = entry.keys.len();
        let keys: Vec<Bytes> = entry.keys.iter().take(keys_max).cloned().collect();
        // Keys ascend (BTreeSet), as etcd sorts them, so every member deletes in the same order.
        let shared = self.shared.clone();
        for key in keys {
            let found = self
                .lookup
                .find(&shared.index, &key)
                .expect("a live key has an index entry");
            let prev = {
                let guard = epoch::pin();
                live_at(found.history.load(&guard), ctx.read_rev())
                    .expect("a key attached to a lease is live")
                    .to_prev_kv(found.key, self.vlog.table())
            };
            assert!(prev.lease() == req.id);
            self.write_delete(ctx, found, prev);
        }
        left <= keys_max
    }

    /// Test-only: flips the first byte of `key`'s newest value in place, outside of any
    /// operation, as a disk or memory fault would. For tests of the corruption checks; a server
    /// calls it only when its test-only knob is set. Returns whether a value was changed.
    #[doc(hidden)]
    pub fn test_only_flip_value(&mut self, key: &[u8]) -> bool {
        let guard = epoch::pin();
        let Some(entry) = self.shared.index.get(key) else {
            return false;
        };
        let mut versions = entry.value().load(&guard).to_vec();
        let Some(last) = versions.last_mut() else {
            return false;
        };
        if last.kind() != VersionKind::Put || last.value_len() == 0 {
            return false;
        }
        // A different value under a valid crc, as if it had been damaged before it was framed:
        // what the members' hash comparison must find (a crc mismatch would stop the member
        // at the first read instead). The damaged copy is a new record of the same revision.
        let mut damaged = last.value(key, self.vlog.table()).to_vec();
        damaged[0] ^= 0x01;
        let placed = self.vlog.append(key, last.rev(), &damaged);
        self.vlog
            .release(last.segment, last.value_len(), last.record_len(key));
        last.segment = placed.segment;
        last.offset = placed.offset;
        entry.value().replace(versions, &guard);
        true
    }

    /// Every lease, ascending by id.
    pub fn leases(&self) -> Vec<LeaseInfo> {
        self.leases
            .iter()
            .map(|(id, e)| lease_info(*id, e))
            .collect()
    }

    /// Every lease's id, ascending, without copying the keys attached to each (`leases` does).
    pub fn lease_ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.leases.keys().copied()
    }

    /// One lease with its attached keys, or None when unknown.
    pub fn lease(&self, id: i64) -> Option<LeaseInfo> {
        self.leases.get(&id).map(|e| lease_info(id, e))
    }
}

fn lease_info(id: i64, e: &LeaseEntry) -> LeaseInfo {
    LeaseInfo {
        id,
        ttl_s: e.ttl_s,
        keys: e.keys.iter().cloned().collect(),
    }
}

/// Index of the first version to keep when compacting at `rev`: the newest version at or below
/// `rev` stays unless it is a tombstone. Applying it to a list compaction already trimmed gives 0,
/// so hashes that skip `versions[..compacted_start]` see the same versions whether or not the
/// background compaction has reached a key yet.
pub(crate) fn compacted_start(versions: &[Version], rev: i64) -> usize {
    let at_or_below = versions.partition_point(|v| v.main() <= rev);
    match at_or_below.checked_sub(1) {
        None => 0,
        Some(i) if versions[i].kind() == VersionKind::Tombstone => at_or_below,
        Some(i) => i,
    }
}

fn txn_writes(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .any(|op| match op {
            RequestOp::Range(_) => false,
            RequestOp::Put(_) | RequestOp::DeleteRange(_) => true,
            RequestOp::Txn(t) => txn_writes(t),
        })
}

/// Which branch each txn takes (see `TxnPath`), comparing against the state at `rev` with
/// `compact_rev` the oldest readable revision.
/// `lookup` is the writer's, on the raft core; readers pass None.
fn compare_path(
    shared: &Shared,
    lookup: Option<&KeyLookup>,
    req: &TxnRequest,
    rev: i64,
    compact_rev: i64,
) -> TxnPath {
    // Unbounded, each compare is decided as it is asked for: nothing to keep between steps
    // (no allocation on a txn's apply).
    let mut keys_left = usize::MAX;
    path_from(req, &mut |compare: &Compare| {
        CompareWalk::starting_at(compare).step(
            shared,
            lookup,
            compare,
            rev,
            compact_rev,
            &mut keys_left,
        )
    })
    .expect("an evaluation without a bound decides every compare")
}

/// The evaluation of a txn's compares (etcd's `compareToPath`) at one revision, in steps: a
/// compare over a range of a million keys visits them all, so in a txn applied in steps it
/// visits at most a step's keys at a time. Compares are decided in the order etcd's
/// evaluation asks for them (a txn's compares until the first that fails, then the nested
/// txns of the branch they chose), so a step replays the results so far to reach the next.
#[derive(Default)]
struct CompareEval {
    results: Vec<bool>,
    /// The walk of the next compare, if it stopped part way.
    walk: Option<CompareWalk>,
}

impl CompareEval {
    /// Goes on deciding compares, visiting at most `*keys_left` keys (each compare costs at
    /// least one); the path, once every compare it needs is decided.
    fn step(
        &mut self,
        shared: &Shared,
        lookup: Option<&KeyLookup>,
        req: &TxnRequest,
        rev: i64,
        compact_rev: i64,
        keys_left: &mut usize,
    ) -> Option<TxnPath> {
        let (results, walk) = (&mut self.results, &mut self.walk);
        let mut asked = 0usize;
        path_from(req, &mut |compare: &Compare| {
            asked += 1;
            if let Some(holds) = results.get(asked - 1) {
                return Some(*holds);
            }
            if *keys_left == 0 {
                return None;
            }
            let holds = walk
                .get_or_insert_with(|| CompareWalk::starting_at(compare))
                .step(shared, lookup, compare, rev, compact_rev, keys_left)?;
            *walk = None;
            results.push(holds);
            Some(holds)
        })
    }
}

/// The path `req`'s compares choose, each decided by `decide` in evaluation order; None as
/// soon as `decide` cannot decide one yet.
fn path_from(
    req: &TxnRequest,
    decide: &mut impl FnMut(&Compare) -> Option<bool>,
) -> Option<TxnPath> {
    let mut succeeded = true;
    for c in &req.compare {
        if !decide(c)? {
            succeeded = false;
            break;
        }
    }
    let ops = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = Vec::new();
    for op in ops {
        if let RequestOp::Txn(t) = op {
            nested.push(path_from(t, decide)?);
        }
    }
    Some(TxnPath { succeeded, nested })
}

/// One compare (etcd's `applyCompare`), over its range in steps: every key in the range must
/// match; a missing key compares as a zero KeyValue, except that VALUE on a missing key is
/// always false. The walk stops at the first key that does not match, and reads a value only
/// when the compare compares values.
struct CompareWalk {
    /// The next key to visit.
    next_key: Option<Bytes>,
    /// Whether a live key was found in the range.
    found: bool,
}

impl CompareWalk {
    fn starting_at(c: &Compare) -> CompareWalk {
        CompareWalk {
            next_key: Some(c.key.clone()),
            found: false,
        }
    }

    /// Visits at most `*keys_left` keys (at least one is counted); the result once decided.
    /// A single key is found through `lookup` where the writer passes its own.
    fn step(
        &mut self,
        shared: &Shared,
        lookup: Option<&KeyLookup>,
        c: &Compare,
        rev: i64,
        compact_rev: i64,
        keys_left: &mut usize,
    ) -> Option<bool> {
        assert!(*keys_left > 0, "a step visits at least one key");
        if rev < compact_rev {
            // A compare that cannot read counts as false.
            *keys_left -= 1;
            return Some(false);
        }
        let from = self
            .next_key
            .take()
            .expect("an undecided compare has a key to visit");
        let budget = *keys_left;
        let guard = epoch::pin();
        let mut visited = 0usize;
        let mut failed = false;
        let visit = |key: &[u8], history: &KeyHistory| {
            if visited == budget {
                self.next_key = Some(Bytes::copy_from_slice(key));
                return false;
            }
            visited += 1;
            if let Some(v) = live_at(history.load(&guard), rev) {
                self.found = true;
                // The table is loaded after the list (see `segments.rs`).
                let ordering = match &c.target {
                    CompareTarget::Value(x) => {
                        let table = shared.segments.load(&guard);
                        v.value_read(key, table).as_ref().cmp(x.as_ref())
                    }
                    CompareTarget::Create(r) => v.create_revision.cmp(r),
                    CompareTarget::Mod(r) => v.main().cmp(r),
                    CompareTarget::Version(r) => v.version.cmp(r),
                    CompareTarget::Lease(r) => v.lease.cmp(r),
                };
                if !compare_result_holds(c.result, ordering) {
                    failed = true;
                    return false;
                }
            }
            true
        };
        match lookup {
            Some(lookup) => lookup.for_each_in_range(&shared.index, &from, &c.range_end, visit),
            None => for_each_in_range(&shared.index, &from, &c.range_end, visit),
        }
        *keys_left -= visited.max(1);
        if failed {
            return Some(false);
        }
        if self.next_key.is_some() {
            return None;
        }
        if !self.found {
            if matches!(c.target, CompareTarget::Value(_)) {
                return Some(false);
            }
            return Some(compare_kv(c, &KeyValue::default()));
        }
        Some(true)
    }
}

/// The ops a txn applies on the branches its compares chose, in the order they apply.
enum ChosenOps<'a> {
    /// The chosen branch, which holds no nested txn: its ops as they are.
    Branch(&'a [RequestOp]),
    /// The chosen branches' ops, nested txns flattened into them.
    Flattened(Vec<&'a RequestOp>),
}

impl<'a> ChosenOps<'a> {
    fn get(&self, i: usize) -> Option<&'a RequestOp> {
        match self {
            ChosenOps::Branch(ops) => ops.get(i),
            ChosenOps::Flattened(ops) => ops.get(i).copied(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'a RequestOp> + '_ {
        (0..).map_while(|i| self.get(i))
    }
}

/// The ops a txn applies on the branches `path` chose. Most txns nest none, and their
/// branch is used as it is: no list is made (an apply of a txn-put makes as few allocations
/// as it can).
fn chosen_ops<'a>(req: &'a TxnRequest, path: &TxnPath) -> ChosenOps<'a> {
    fn push<'a>(req: &'a TxnRequest, path: &TxnPath, out: &mut Vec<&'a RequestOp>) {
        let mut nested = path.nested.iter();
        for op in branch(req, path) {
            match op {
                RequestOp::Txn(t) => push(t, nested.next().expect("one path per nested txn"), out),
                other => out.push(other),
            }
        }
        assert!(nested.next().is_none(), "every nested path is used");
    }
    if path.nested.is_empty() {
        return ChosenOps::Branch(branch(req, path));
    }
    let mut out = Vec::with_capacity(req.success.len().max(req.failure.len()));
    push(req, path, &mut out);
    ChosenOps::Flattened(out)
}

/// The ops of the branch of `req` that `path` chose.
fn branch<'a>(req: &'a TxnRequest, path: &TxnPath) -> &'a [RequestOp] {
    if path.succeeded {
        &req.success
    } else {
        &req.failure
    }
}

/// The answer of a txn whose chosen ops all applied, nested as the request is: the answers in
/// `progress` are those of `chosen_ops`, in order.
fn txn_response(
    req: &TxnRequest,
    path: &TxnPath,
    progress: &mut TxnProgress,
    ctx: &TxnCtx,
) -> TxnResponse {
    fn nest(
        req: &TxnRequest,
        path: &TxnPath,
        answers: &mut std::vec::Drain<'_, ResponseOp>,
    ) -> TxnResponse {
        let mut nested = path.nested.iter();
        let responses = branch(req, path)
            .iter()
            .map(|op| match op {
                // etcd leaves the nested txn's own header revision unset.
                RequestOp::Txn(t) => ResponseOp::Txn(nest(
                    t,
                    nested.next().expect("one path per nested txn"),
                    answers,
                )),
                _ => answers.next().expect("one answer per op"),
            })
            .collect();
        TxnResponse {
            revision: 0,
            succeeded: path.succeeded,
            responses,
        }
    }
    assert!(
        progress.walk.is_none() && progress.range.is_none(),
        "every op applied"
    );
    let mut resp = if path.nested.is_empty() {
        // The answers are the branch's, as they are.
        assert_eq!(progress.responses.len(), branch(req, path).len());
        TxnResponse {
            revision: 0,
            succeeded: path.succeeded,
            responses: std::mem::take(&mut progress.responses),
        }
    } else {
        let mut answers = progress.responses.drain(..);
        let resp = nest(req, path, &mut answers);
        assert!(answers.next().is_none(), "every answer is placed");
        resp
    };
    resp.revision = ctx.begin_rev + i64::from(ctx.writes > 0);
    resp
}

/// Whether `d` deletes `key`, as the store walks its range (an end of "\0" runs to the last
/// key).
fn deletes_key(d: &DeleteRangeRequest, key: &[u8]) -> bool {
    match crate::index::range_end(&d.range_end) {
        crate::index::RangeEnd::Single => d.key.as_ref() == key,
        crate::index::RangeEnd::Unbounded => key >= d.key.as_ref(),
        crate::index::RangeEnd::Before(end) => key >= d.key.as_ref() && key < end,
    }
}

/// Whether any op of `req`, on any branch, walks a range (`walks_a_range`).
fn txn_walks_ranges(req: &TxnRequest) -> bool {
    req.success.iter().chain(&req.failure).any(|op| match op {
        RequestOp::Txn(t) => txn_walks_ranges(t),
        other => walks_a_range(other),
    })
}

/// Whether any compare of `req`, or of a txn nested in it, compares a range.
fn txn_compares_ranges(req: &TxnRequest) -> bool {
    req.compare.iter().any(|c| !c.range_end.is_empty())
        || req.success.iter().chain(&req.failure).any(|op| match op {
            RequestOp::Txn(t) => txn_compares_ranges(t),
            _ => false,
        })
}

/// A range delete, or a read of a range (not of one key).
fn walks_a_range(op: &RequestOp) -> bool {
    match op {
        RequestOp::DeleteRange(d) => !d.range_end.is_empty(),
        RequestOp::Range(r) => !r.range_end.is_empty(),
        _ => false,
    }
}

/// etcd's `isTxnReadonly`: every op of both branches is a range (a nested txn is not, even one
/// that only reads). etcd answers such a txn on the member that received it, without raft.
pub fn txn_is_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .all(|op| matches!(op, RequestOp::Range(_)))
}

/// etcd's `isTxnSerializable`: every op of both branches is a serializable range (so a txn of
/// compares alone is), and a read-only txn needs no read barrier.
pub fn txn_is_serializable(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .all(|op| matches!(op, RequestOp::Range(r) if r.serializable))
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ordering = match &c.target {
        CompareTarget::Value(v) => kv.value.as_ref().cmp(v.as_ref()),
        CompareTarget::Create(r) => kv.create_revision.cmp(r),
        CompareTarget::Mod(r) => kv.mod_revision.cmp(r),
        CompareTarget::Version(r) => kv.version.cmp(r),
        CompareTarget::Lease(r) => kv.lease.cmp(r),
    };
    compare_result_holds(c.result, ordering)
}

fn compare_result_holds(result: CompareResult, ordering: std::cmp::Ordering) -> bool {
    match result {
        CompareResult::Equal => ordering.is_eq(),
        CompareResult::NotEqual => ordering.is_ne(),
        CompareResult::Greater => ordering.is_gt(),
        CompareResult::Less => ordering.is_lt(),
    }
}

/// A read-only txn read by a reader in steps (`Reader::txn_read_steps`).
pub struct TxnReadSteps {
    /// Which try this is (from 1; see `Reader::txn_read_end`).
    attempt: usize,
    /// The revision every compare and range reads at, and the answer's.
    cur_rev: i64,
    compact_rev: i64,
    /// The compares' evaluation, until it chose a branch: a compare over a range of a
    /// million keys visits them all, so it too goes a step's keys at a time.
    comparing: Option<CompareEval>,
    /// The branch the compares chose (meaningless while `comparing`).
    succeeded: bool,
    /// The op of the chosen branch being read (or next to be).
    next_op: usize,
    range: Option<RangeSteps>,
    responses: Vec<ResponseOp>,
    checks: Vec<RecordCheck>,
    /// The error a range's checks or read answered: the txn's answer.
    failed: Option<KvError>,
    /// Ranges whose walk gathered more key-values than this to filter and sort are left
    /// to the caller to finish (`TxnReadSteps::take_walked_range`), on another thread.
    finish_elsewhere_past_kvs: usize,
    /// Such a range, walked: the next op's.
    walked: Option<RangeSteps>,
}

impl TxnReadSteps {
    /// Leaves each range that gathered more than `kvs` key-values to filter and sort to
    /// the caller (`take_walked_range`): a shard sorts a million of them off its executor,
    /// as it does a range's (`RangeSteps::reordered_kvs`).
    pub fn finish_elsewhere_past(&mut self, kvs: usize) {
        self.finish_elsewhere_past_kvs = kvs;
    }

    /// The range a step left to finish, with its request (the op of `req`, the txn the
    /// steps began with): finish it with `Reader::range_steps_finish`, then hand the answer
    /// back with `Reader::txn_read_range_finished` before the next step.
    pub fn take_walked_range(&mut self, req: &TxnRequest) -> Option<(RangeSteps, RangeRequest)> {
        let range = self.walked.take()?;
        let ops = if self.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let RequestOp::Range(r) = &ops[self.next_op] else {
            unreachable!("a read-only txn holds only ranges")
        };
        Some((range, r.clone()))
    }
}

/// How a read-only txn's steps ended (`Reader::txn_read_end`).
pub enum TxnReadEnd {
    Answered(Result<Unchecked<TxnResponse>>),
    /// A compaction passed the revision read at: the steps of the next try.
    Again(Box<TxnReadSteps>),
}

impl Reader {
    /// The store's size (`Writer::size_bytes`) as last published: what the quota counts.
    pub fn size_bytes_published(&self) -> u64 {
        self.shared.size_bytes.load(Ordering::Acquire)
    }

    /// The newest completely applied revision.
    pub fn current_revision(&self) -> i64 {
        self.shared.current_rev.load(Ordering::Acquire)
    }

    pub fn compact_revision(&self) -> i64 {
        self.shared.compact_rev.load(Ordering::Acquire)
    }

    /// A range at the published revision (or an older one), without locks. Values are slices of the
    /// value log, not copies.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse> {
        self.range_unchecked(req).map(Unchecked::check)
    }

    /// `range`, its values not yet read (see `Unchecked`).
    pub fn range_unchecked(&self, req: &RangeRequest) -> Result<Unchecked<RangeResponse>> {
        let cur_rev = self.current_revision();
        let compact_rev = self.compact_revision();
        let answer = range_at_unchecked(&self.shared, req, cur_rev, compact_rev)?;
        self.recheck_compacted(req.revision, cur_rev)?;
        Ok(answer)
    }

    /// `range`, split as `split` says when the range is answered in key order with nothing to
    /// filter (see `RangeSplit`): the rest, if any, is read later with `range_rest`.
    pub fn range_split(
        &self,
        req: &RangeRequest,
        split: RangeSplit<'_>,
    ) -> Result<(RangeResponse, Option<RangeRest>)> {
        self.range_split_unchecked(req, split).map(Unchecked::check)
    }

    /// A read-only txn (`txn_is_read_only`), answered from the published state as etcd
    /// answers one on the member that received it: its compares and ranges all at one
    /// revision, the current one, which the answer's revision is. Its ranges' values are not
    /// read yet (see `Unchecked`); the values it compares are (see `records_txn_reads`).
    pub fn txn_read_only_unchecked(&self, req: &TxnRequest) -> Result<Unchecked<TxnResponse>> {
        let mut steps = self.txn_read_steps(req);
        loop {
            while !self.txn_read_step(&mut steps, req, usize::MAX) {}
            match self.txn_read_end(steps, req) {
                TxnReadEnd::Answered(answer) => return answer,
                TxnReadEnd::Again(again) => steps = *again,
            }
        }
    }

    /// `txn_read_only_unchecked` in steps (`txn_read_step`, then `txn_read_end`), as a shard
    /// reads one: its compares (as the writer's steps decide them, `CompareEval`), then the
    /// ranges of the branch they chose, are walked a bounded number of index entries at a
    /// time, at the revision current at the start, with no epoch held between steps.
    pub fn txn_read_steps(&self, req: &TxnRequest) -> TxnReadSteps {
        self.txn_read_attempt(req, 1)
    }

    fn txn_read_attempt(&self, req: &TxnRequest, attempt: usize) -> TxnReadSteps {
        assert!(
            txn_is_read_only(req),
            "only a read-only txn is answered by a reader"
        );
        let cur_rev = self.current_revision();
        let compact_rev = self.compact_revision();
        TxnReadSteps {
            attempt,
            cur_rev,
            compact_rev,
            comparing: Some(CompareEval::default()),
            succeeded: false,
            next_op: 0,
            range: None,
            responses: Vec::new(),
            checks: Vec::new(),
            failed: None,
            finish_elsewhere_past_kvs: usize::MAX,
            walked: None,
        }
    }

    /// Visits at most `keys_max` more index entries of the ranges of `req` (the txn `steps`
    /// began with); true once every range is read, or one failed, or one is left to the
    /// caller to finish (`TxnReadSteps::take_walked_range`).
    pub fn txn_read_step(
        &self,
        steps: &mut TxnReadSteps,
        req: &TxnRequest,
        keys_max: usize,
    ) -> bool {
        assert!(keys_max > 0, "a step visits at least one key");
        assert!(
            steps.walked.is_none(),
            "a range left to finish elsewhere is handed back before the next step"
        );
        let mut keys_left = keys_max;
        if let Some(eval) = steps.comparing.as_mut() {
            // Each compare costs at least one key (see `CompareWalk::step`).
            let (cur_rev, compact_rev) = (steps.cur_rev, steps.compact_rev);
            let Some(path) = eval.step(
                &self.shared,
                None,
                req,
                cur_rev,
                compact_rev,
                &mut keys_left,
            ) else {
                return false;
            };
            assert!(path.nested.is_empty(), "a read-only txn has no nested txn");
            steps.comparing = None;
            steps.succeeded = path.succeeded;
        }
        let ops = if steps.succeeded {
            &req.success
        } else {
            &req.failure
        };
        loop {
            if steps.failed.is_some() || steps.next_op == ops.len() {
                return true;
            }
            if keys_left == 0 {
                return false;
            }
            let RequestOp::Range(r) = &ops[steps.next_op] else {
                unreachable!("a read-only txn holds only ranges")
            };
            if steps.range.is_none() {
                // etcd's checkRequests (a revision in the future or compacted), which
                // `RangeSteps::start` makes. etcd checks every range before reading any;
                // checking each just before its read answers the same, as a read changes
                // nothing and the first failing check wins either way.
                match RangeSteps::start(r, steps.cur_rev, steps.compact_rev, None) {
                    Ok(range) => steps.range = Some(range),
                    Err(error) => {
                        steps.failed = Some(error);
                        return true;
                    }
                }
            }
            let range = steps.range.as_mut().expect("started above");
            let (walked, visited) = range.step_counted(&self.shared, r, keys_left, &mut |_| {});
            // A range that visits no entry (a missing key) still costs one, as in the
            // writer's steps: a txn of many such ranges is read in several steps too.
            keys_left -= visited.max(1);
            if !walked {
                continue;
            }
            let range = steps.range.take().expect("started above");
            if range.reordered_kvs() > steps.finish_elsewhere_past_kvs {
                steps.walked = Some(range);
                return true;
            }
            // Finished here as the caller finishes one left to it: the compaction recheck
            // after the sort (at the txn's revision, the range's) also covers the sort.
            let answer = self.range_steps_finish(range, r);
            self.txn_read_range_finished(steps, answer);
        }
    }

    /// Hands back the answer of the range `take_walked_range` left to finish
    /// (`range_steps_finish`'s, which rechecked compaction), as the step would have
    /// answered it in place.
    pub fn txn_read_range_finished(
        &self,
        steps: &mut TxnReadSteps,
        answer: Result<Unchecked<(RangeResponse, Option<RangeRest>)>>,
    ) {
        assert!(
            steps.walked.is_none() && steps.failed.is_none(),
            "a range taken to finish, and nothing failed before it"
        );
        match answer {
            Err(error) => steps.failed = Some(error),
            Ok(answer) => {
                let answer = answer.map(|(response, rest)| {
                    assert!(rest.is_none(), "only a split range leaves a rest");
                    response
                });
                steps
                    .responses
                    .push(ResponseOp::Range(answer.into_parts(&mut steps.checks)));
                steps.next_op += 1;
            }
        }
    }

    /// The end of a read-only txn's steps: its answer (or the error a range's checks or read
    /// gave), or, when a compaction passed its revision meanwhile, the steps of another
    /// attempt at the revision now current. etcd reads a txn in one view that no compaction
    /// changes; here one can land meanwhile and cut what a compare saw (a compare that fails
    /// to read counts as false), so such a read is made again at the newer revision.
    /// Compactions past the current revision are rare: after `TXN_READ_ATTEMPTS_MAX` tries
    /// the txn is answered as compacted.
    pub fn txn_read_end(&self, steps: TxnReadSteps, req: &TxnRequest) -> TxnReadEnd {
        assert!(
            steps.comparing.is_none() && steps.walked.is_none(),
            "a txn's steps end once its compares chose a branch and its ranges are answered"
        );
        if self.compact_revision() > steps.cur_rev {
            if steps.attempt < TXN_READ_ATTEMPTS_MAX {
                let mut again = self.txn_read_attempt(req, steps.attempt + 1);
                again.finish_elsewhere_past_kvs = steps.finish_elsewhere_past_kvs;
                return TxnReadEnd::Again(Box::new(again));
            }
            return TxnReadEnd::Answered(Err(KvError::Compacted));
        }
        TxnReadEnd::Answered(match steps.failed {
            Some(error) => Err(error),
            None => {
                let branch = if steps.succeeded {
                    &req.success
                } else {
                    &req.failure
                };
                assert!(
                    steps.next_op == branch.len() && steps.responses.len() == branch.len(),
                    "a txn's steps end once every range of its branch is read"
                );
                Ok(Unchecked::new(
                    TxnResponse {
                        revision: steps.cur_rev,
                        succeeded: steps.succeeded,
                        responses: steps.responses,
                    },
                    steps.checks,
                ))
            }
        })
    }

    /// The records of values in durable segments' mapped files that applying the txn `req`
    /// would read as the store is now: the values its compares compare (every compare, in any
    /// branch), the values its ranges sort by, and the old values its `ignore_value` puts
    /// keep. The raft core needs those bytes to apply, so it cannot leave them to a shard as
    /// it leaves the answer's values; a shard brings their pages in before proposing, so the
    /// raft core almost always finds them in memory (only a write between the two, or the
    /// kernel evicting them, makes it wait).
    pub fn records_txn_reads(&self, req: &TxnRequest) -> Vec<Bytes> {
        self.listed_whole(|r, rev, listed, budget| r.txn_reads(req, rev, listed, budget))
    }

    /// What `list` finds at the current revision, every key visited, in one list.
    fn listed_whole(
        &self,
        list: impl FnOnce(&Self, i64, &mut Listed<'_>, &mut KeysBudget),
    ) -> Vec<Bytes> {
        let mut listed = Listed::whole();
        list(
            self,
            self.current_revision(),
            &mut listed,
            &mut KeysBudget::unbounded(),
        );
        listed.records
    }

    /// `records_txn_reads`, visiting at most `keys_max` keys of the index, and whether that
    /// was all of them: the raft core's look before it applies, which must not walk a compare
    /// of a million keys in one go. When it was not, a pager thread lists the rest
    /// (`txn_reads_of`).
    pub fn records_txn_reads_within(
        &self,
        req: &TxnRequest,
        keys_max: usize,
    ) -> (Vec<Bytes>, bool) {
        let mut listed = Listed::whole();
        let mut budget = KeysBudget {
            left: keys_max,
            cut: false,
        };
        self.txn_reads(req, self.current_revision(), &mut listed, &mut budget);
        (listed.records, !budget.cut)
    }

    /// What `records_txn_reads` of `req` lists, to be listed later on another thread (a
    /// pager's): it reads the store as it is then.
    pub fn txn_reads_of(&self, req: TxnRequest) -> TxnReads {
        TxnReads {
            reader: self.clone(),
            req,
        }
    }

    /// `records_txn_reads` for a put: the old value an `ignore_value` put keeps.
    pub fn records_put_reads(&self, req: &PutRequest) -> Vec<Bytes> {
        self.listed_whole(|r, rev, listed, budget| r.put_reads(req, rev, listed, budget))
    }

    fn range_reads(
        &self,
        req: &RangeRequest,
        cur_rev: i64,
        records: &mut Listed<'_>,
        budget: &mut KeysBudget,
    ) {
        if req.sort_target == SortTarget::Value && !req.count_only {
            let rev = if req.revision > 0 {
                req.revision
            } else {
                cur_rev
            };
            self.records_of(&req.key, &req.range_end, rev, records, budget);
        }
    }

    fn txn_reads(
        &self,
        req: &TxnRequest,
        cur_rev: i64,
        records: &mut Listed<'_>,
        budget: &mut KeysBudget,
    ) {
        for c in &req.compare {
            if matches!(c.target, CompareTarget::Value(_)) {
                self.records_of(&c.key, &c.range_end, cur_rev, records, budget);
            }
        }
        for op in req.success.iter().chain(req.failure.iter()) {
            match op {
                RequestOp::Put(p) => self.put_reads(p, cur_rev, records, budget),
                RequestOp::Range(r) => self.range_reads(r, cur_rev, records, budget),
                RequestOp::Txn(t) => self.txn_reads(t, cur_rev, records, budget),
                _ => {}
            }
        }
    }

    fn put_reads(
        &self,
        req: &PutRequest,
        cur_rev: i64,
        records: &mut Listed<'_>,
        budget: &mut KeysBudget,
    ) {
        if req.ignore_value {
            self.records_of(&req.key, &[], cur_rev, records, budget);
        }
    }

    /// The records in durable segments' mapped files of the values live in [key, range_end)
    /// at `rev`, unread, from the keys `budget` still allows (it marks a walk it cut short).
    fn records_of(
        &self,
        key: &[u8],
        range_end: &[u8],
        rev: i64,
        records: &mut Listed<'_>,
        budget: &mut KeysBudget,
    ) {
        let mut guard = epoch::pin();
        for_each_in_range(&self.shared.index, key, range_end, |key, history| {
            if budget.left == 0 {
                budget.cut = true;
                return false;
            }
            budget.left -= 1;
            let versions = history.load(&guard);
            // The table after the list (see `segments.rs`): every segment it names is in it.
            let segments = self.shared.segments.load(&guard);
            if let Some(record) =
                live_at(versions, rev).and_then(|v| v.record_on_disk(key, segments))
            {
                records.push(record);
            }
            if records.chunk_full() {
                // Handed on with no epoch pinned: the taker may wait on the disk (a pager
                // thread's `fault_in`), and a pin held meanwhile would hold back every
                // deferred free and segment retirement. The walk's entries are counted
                // references, valid unpinned; what the guard loaded is not used past here.
                guard.repin_after(|| records.flush());
            }
            true
        });
    }

    /// The durable segments' mapped files, ascending by id, with their read marks: what the
    /// value cache pages out (core's `value_cache`).
    pub fn mapped_segments(&self) -> Vec<MappedSegment> {
        let guard = epoch::pin();
        self.shared.segments.load(&guard).mapped()
    }

    /// `range_split`, its values not yet read (see `Unchecked`).
    pub fn range_split_unchecked(
        &self,
        req: &RangeRequest,
        split: RangeSplit<'_>,
    ) -> Result<Unchecked<(RangeResponse, Option<RangeRest>)>> {
        let cur_rev = self.current_revision();
        let compact_rev = self.compact_revision();
        let answer = range_split_at(&self.shared, req, cur_rev, compact_rev, Some(split))?;
        self.recheck_compacted(req.revision, cur_rev)?;
        Ok(answer)
    }

    /// `range_unchecked`, or with `kvs_max` given `range_split_unchecked` (`kvs_max` as
    /// `RangeSplit`'s), walked in steps (`range_step`): a shard walking a count of a million
    /// keys lets its other connections, and a shard hosted by the raft core every write, go on
    /// between steps. The steps read at the revision the first saw, which what is written
    /// meanwhile does not change; a compaction past it may cut what they read, and
    /// `range_steps_finish` then answers `Compacted`, as one walk's recheck does. The longer
    /// the walk, the likelier such a compaction lands meanwhile; etcd's read holds its view
    /// and would answer.
    pub fn range_steps(&self, req: &RangeRequest, kvs_max: Option<usize>) -> Result<RangeSteps> {
        RangeSteps::start(
            req,
            self.current_revision(),
            self.compact_revision(),
            kvs_max,
        )
    }

    /// Visits at most `keys_max` more index entries of `req` (the request `steps` began
    /// with); true once the walk reached the range's end. A split's key-values past its first
    /// `kvs_max` that the answer owes are shown to `on_rest`, as `RangeSplit`'s are.
    pub fn range_step(
        &self,
        steps: &mut RangeSteps,
        req: &RangeRequest,
        keys_max: usize,
        on_rest: &mut dyn FnMut(KeyValueShape<'_>),
    ) -> bool {
        steps.step(&self.shared, req, keys_max, on_rest)
    }

    /// The answer of steps that reached the range's end (its values not yet read, see
    /// `Unchecked`), and a split's rest; `Compacted` when a compaction passed the revision
    /// read at while they walked.
    pub fn range_steps_finish(
        &self,
        steps: RangeSteps,
        req: &RangeRequest,
    ) -> Result<Unchecked<(RangeResponse, Option<RangeRest>)>> {
        let cur_rev = steps.current_revision();
        let answer = steps.finish(req);
        self.recheck_compacted(req.revision, cur_rev)?;
        Ok(answer)
    }

    /// The next key-values a split range owes, at least one while any is owed, holding about
    /// `bytes_max` of keys and values. It fails as compacted once a compaction past the
    /// range's revision has cut a key-value the rest owes (see `RangeRest`): the caller has
    /// promised the answer's length and cannot hand out fewer.
    pub fn range_rest(&self, rest: &mut RangeRest, bytes_max: usize) -> Result<Vec<KeyValue>> {
        self.range_rest_unchecked(rest, bytes_max)
            .map(Unchecked::check)
    }

    /// `range_rest`, its values not yet read (see `Unchecked`).
    pub fn range_rest_unchecked(
        &self,
        rest: &mut RangeRest,
        bytes_max: usize,
    ) -> Result<Unchecked<Vec<KeyValue>>> {
        let owed = rest.kvs_left();
        let (kvs, walk) = range_rest_batch(&self.shared, rest, bytes_max);
        if walk == RestWalk::ReachedLast && kvs.unserved().len() < owed {
            // Only a compaction past the revision removes what a read at it saw.
            assert!(
                rest.revision() < self.compact_revision(),
                "a range's rest lost key-values at revision {} with no compaction past it",
                rest.revision()
            );
            return Err(KvError::Compacted);
        }
        Ok(kvs)
    }

    /// A compaction may have started while we read: if it now covers the revision we read at, the
    /// lists we saw may have been trimmed under us, so the read fails as compacted.
    fn recheck_compacted(&self, revision: i64, cur_rev: i64) -> Result<()> {
        let rev = if revision <= 0 { cur_rev } else { revision };
        if rev < self.compact_revision() {
            return Err(KvError::Compacted);
        }
        Ok(())
    }

    /// History for a watcher catching up: events on keys in [key, range_end) with revisions from
    /// `start_rev` up to the published revision, at most `events_max` unless one revision alone has
    /// more (a revision is never split). Previous states stay `PrevKv`s, read by whoever asks.
    pub fn range_events(
        &self,
        start_rev: i64,
        key: &[u8],
        range_end: &[u8],
        events_max: usize,
    ) -> Result<EventBatch> {
        self.range_events_unchecked(start_rev, key, range_end, events_max, false)
            .map(Unchecked::check)
    }

    /// `range_events`, the values of its put events not yet read (see `Unchecked`), and with
    /// `with_prev` those of the previous states too, for a watcher that asks for prev_kv:
    /// then every value the batch hands out is among its checks, and a caller that has their
    /// pages brought in first (core's pager) never faults on them. Without `with_prev`,
    /// previous states stay `PrevKv`s whose values nobody reads.
    pub fn range_events_unchecked(
        &self,
        start_rev: i64,
        key: &[u8],
        range_end: &[u8],
        events_max: usize,
        with_prev: bool,
    ) -> Result<Unchecked<EventBatch>> {
        let mut steps =
            self.range_events_steps(start_rev, key, range_end, events_max, with_prev)?;
        let walked = self.range_events_step(&mut steps, usize::MAX);
        assert!(walked, "one unbounded step walks the whole range");
        self.range_events_finish(steps)
    }

    /// `range_events_unchecked` in steps (`range_events_step`, then `range_events_finish`),
    /// as a shard reads a watcher's history: its keys a bounded number at a time, at the
    /// revision published now, with no epoch held between steps, holding at most about
    /// twice `events_max` events at any time, or twice one revision's that alone holds
    /// more (see `EventSteps`).
    pub fn range_events_steps(
        &self,
        start_rev: i64,
        key: &[u8],
        range_end: &[u8],
        events_max: usize,
        with_prev: bool,
    ) -> Result<EventSteps> {
        let read_rev = self.current_revision();
        let start_rev = start_rev.max(1);
        if start_rev < self.compact_revision() {
            return Err(KvError::Compacted);
        }
        Ok(EventSteps::start(
            start_rev,
            read_rev,
            (key, range_end),
            events_max,
            with_prev,
        ))
    }

    /// Visits at most `keys_max` more keys of `steps`' range; true once it reached the end.
    pub fn range_events_step(&self, steps: &mut EventSteps, keys_max: usize) -> bool {
        steps.step(&self.shared, keys_max)
    }

    /// The batch of a history read whose walk reached its range's end, or compacted when a
    /// compaction passed its start meanwhile: the lists it saw may have been trimmed under it.
    pub fn range_events_finish(&self, steps: EventSteps) -> Result<Unchecked<EventBatch>> {
        self.recheck_compacted(steps.start_rev(), steps.read_rev())?;
        Ok(steps.finish())
    }

    /// The HashKV hash at `revision` (0 = current): CRC-32 (IEEE, as crc32fast computes it) over every
    /// version with `main <= revision` that a compaction at the compact revision keeps, key by key
    /// ascending and revision by revision ascending (see [`hash_version`] for one version's bytes),
    /// then the compact revision. Versions the compaction drops are skipped whether or not the
    /// background compaction has removed them yet (etcd skips them the same way), so members that
    /// applied the same entries answer the same hash at any point of their compaction.
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64)> {
        for _ in 0..HASH_ATTEMPTS_MAX {
            let cur_rev = self.current_revision();
            let compact_rev = self.compact_revision();
            if revision > cur_rev {
                return Err(KvError::FutureRevision);
            }
            let rev = if revision <= 0 { cur_rev } else { revision };
            if rev < compact_rev {
                return Err(KvError::Compacted);
            }
            let guard = epoch::pin();
            let mut hasher = crc32fast::Hasher::new();
            for entry in self.shared.index.iter() {
                let versions = entry.value().load(&guard);
                let kept = &versions[compacted_start(versions, compact_rev)..];
                for v in kept.iter().take_while(|v| v.main() <= rev) {
                    hash_version(
                        &mut hasher,
                        entry.key(),
                        v,
                        self.shared.segments.load(&guard),
                    );
                }
            }
            hasher.update(&compact_rev.to_le_bytes());
            // A compaction that started during the scan may have trimmed lists we read below its
            // revision, so what we hashed mixes two compactions: scan again under the new one.
            if self.compact_revision() == compact_rev {
                return Ok((hasher.finalize(), compact_rev));
            }
        }
        Err(KvError::Compacted)
    }
}

/// One version's bytes in a hash: key length, key, main, sub, kind (1 = put), create revision,
/// version, lease, value length, value; integers little-endian. HashKV and the whole-store hash
/// share it, so the two agree on what a version is.
pub(crate) fn hash_version(
    hasher: &mut crc32fast::Hasher,
    key: &[u8],
    v: &Version,
    segments: &crate::segments::SegmentTable,
) {
    hasher.update(&(key.len() as u64).to_le_bytes());
    hasher.update(key);
    hasher.update(&v.main().to_le_bytes());
    hasher.update(&v.rev().sub.to_le_bytes());
    hasher.update(&[u8::from(v.kind() == VersionKind::Put)]);
    hasher.update(&v.create_revision.to_le_bytes());
    hasher.update(&v.version.to_le_bytes());
    hasher.update(&v.lease.to_le_bytes());
    hasher.update(&(v.value_len() as u64).to_le_bytes());
    hasher.update(&v.value(key, segments));
}
