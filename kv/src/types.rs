//! Plain request/response types mirroring etcd's `etcdserverpb` and `mvccpb` messages.
//!
//! keel-kv never sees protobuf types: keel-grpc converts at its boundary. Field names follow etcd's
//! so the conversion is mechanical.

use bytes::Bytes;

/// An MVCC revision: `main` is bumped once per writing txn, `sub` counts the writes inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Revision {
    /// The store-wide revision the write belongs to.
    pub main: i64,
    /// The position of the write inside its txn, from 0.
    pub sub: i64,
}

/// One key's state at one revision, as etcd's `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Bytes,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Bytes,
    pub lease: i64,
}

/// What a write did to one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change, as etcd's `mvccpb.Event`. A DELETE's `kv` has only `key` and `mod_revision` set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// The key's previous state, when it existed (watchers asking for prev_kv forward it).
    pub prev_kv: Option<PrevKv>,
}

/// A key's previous state as a write found it, its value not yet checked. Checking a value
/// reads all of it, and a value in a mapped segment file may have to be faulted in from disk:
/// the raft core, which applies writes, must not wait for that only to fill in answers and
/// watch events. So a write carries the previous version unread, and whoever hands the value
/// out checks it: a watcher that asked for prev_kv, on its shard, with `checked`; a write's
/// answer (`into_answer`) on the shard that serves it.
#[derive(Debug, Clone)]
pub struct PrevKv {
    /// Everything but the value is in the index; the value here is unchecked.
    kv: KeyValue,
    /// The version and its record, which vouches for the value; `None` when the value
    /// needs no check (built by a test or a model).
    unchecked: Option<crate::index::RecordCheck>,
}

impl PrevKv {
    pub(crate) fn unchecked(kv: KeyValue, check: crate::index::RecordCheck) -> PrevKv {
        PrevKv {
            kv,
            unchecked: Some(check),
        }
    }

    /// A previous state whose value needs no check (built by a test or a model).
    pub fn known(kv: KeyValue) -> PrevKv {
        PrevKv {
            kv,
            unchecked: None,
        }
    }

    /// The key, revisions, version and lease: none of them reads the value.
    pub fn key(&self) -> &Bytes {
        &self.kv.key
    }

    pub fn create_revision(&self) -> i64 {
        self.kv.create_revision
    }

    pub fn mod_revision(&self) -> i64 {
        self.kv.mod_revision
    }

    pub fn version(&self) -> i64 {
        self.kv.version
    }

    pub fn lease(&self) -> i64 {
        self.kv.lease
    }

    /// The value's record when it lies in a durable segment's mapped file, whose pages may
    /// be on disk: what a caller has brought in before `checked` reads it.
    pub fn record_on_disk(&self) -> Option<&Bytes> {
        self.unchecked.as_ref()?.record_on_disk()
    }

    /// The whole previous state, its value checked against its record's crc first. A value
    /// that fails the check stops the process, naming the segment file and offset, as every
    /// read does: a member never hands out a value it cannot vouch for.
    pub fn checked(self) -> KeyValue {
        if let Some(check) = &self.unchecked {
            check.check();
        }
        self.kv
    }

    /// The whole previous state for a write's answer, which the raft core builds and a
    /// shard hands out: a value in a durable segment's mapped file is left unread and its
    /// check joins `checks`, to be made where the answer is served (see `Unchecked`); one
    /// in memory is checked here, as it cannot wait for the disk.
    pub(crate) fn into_answer(self, checks: &mut Vec<crate::index::RecordCheck>) -> KeyValue {
        if let Some(check) = self.unchecked {
            check.defer_or_check(checks);
        }
        self.kv
    }
}

/// Equal when the states are, whether or not either value was checked yet.
impl PartialEq for PrevKv {
    fn eq(&self, other: &PrevKv) -> bool {
        self.kv == other.kv
    }
}

impl Eq for PrevKv {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeRequest {
    pub key: Bytes,
    /// Empty: only `key`; "\0": every key >= `key`; otherwise the half-open range [key, range_end).
    pub range_end: Bytes,
    /// 0 = no limit.
    pub limit: i64,
    /// <= 0 = the latest revision.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    /// Carried for the server (it decides whether to do a ReadIndex); the store ignores it.
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    /// The header revision: the store's current revision, whatever revision was read.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// True when `limit` cut the result.
    pub more: bool,
    /// Keys in the range at the read revision, ignoring limit and the min/max filters.
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PutRequest {
    pub key: Bytes,
    pub value: Bytes,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PutResponse {
    pub revision: i64,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRangeRequest {
    pub key: Bytes,
    /// Same forms as `RangeRequest::range_end`.
    pub range_end: Bytes,
    pub prev_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRangeResponse {
    pub revision: i64,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// The compare target together with the operand it is compared to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Bytes),
    Lease(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    pub key: Bytes,
    /// Empty: only `key`; otherwise every key in the range must satisfy the compare.
    pub range_end: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResponse {
    pub revision: i64,
    pub succeeded: bool,
    /// One response per op of the branch taken; inner responses carry only their header revision.
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactionRequest {
    pub revision: i64,
    /// Carried for the server: when set it waits for `Writer::compaction_pending` to clear.
    pub physical: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactionResponse {
    pub revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseGrantRequest {
    /// Must not be 0: the server picks an id before proposing.
    pub id: i64,
    pub ttl_s: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseGrantResponse {
    pub revision: i64,
    pub id: i64,
    pub ttl_s: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRevokeRequest {
    pub id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRevokeResponse {
    pub revision: i64,
}

/// One committed raft entry's operation, as the server hands it to `Writer::apply`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    LeaseGrant(LeaseGrantRequest),
    LeaseRevoke(LeaseRevokeRequest),
}

/// The response to one `Op`, variant for variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResponse {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
}

/// What applying one op produced: the response and the watch events, in revision order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Its values in mapped segment files are read and checked where it is served, not on
    /// the raft core that applies (see `Unchecked`).
    pub response: crate::index::Unchecked<OpResponse>,
    /// Every write's event, or none when `events_cut`.
    pub events: Vec<Event>,
    /// The op wrote more events than `Writer::apply_bounded` was allowed to keep: `events` is
    /// empty, and a watcher must read this revision from history (`Reader::range_events`).
    pub events_cut: bool,
    /// What the op wrote, counted whether or not its events were kept (metrics).
    pub counts: WriteCounts,
}

/// Writes of one applied op, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    pub puts: u64,
    /// Puts that created their key (version 1).
    pub created: u64,
    pub deletes: u64,
}

/// A lease as the table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub id: i64,
    pub ttl_s: i64,
    /// Attached keys, ascending.
    pub keys: Vec<Bytes>,
}

/// Events read back from history for a watcher catching up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBatch {
    /// Events with revisions in [start_rev, next_rev), ordered by (main, sub); never splits a revision.
    pub events: Vec<Event>,
    /// The first revision not covered; the watcher continues from here.
    pub next_rev: i64,
    /// The revision the history was read at (the published one then). A batch whose
    /// `next_rev` is past it holds everything up to it; one cut short to stay within its
    /// bound does not, whatever revision a caller last heard of.
    pub read_rev: i64,
}

impl EventBatch {
    /// Whether the batch holds every event of its range up to the revision it read at.
    pub fn reached_read_rev(&self) -> bool {
        self.next_rev > self.read_rev
    }
}
