//! keel-kv: the MVCC store behind Keel's etcd v3 API.
//!
//! Bird's-eye view: the raft core owns the single [`Writer`] and applies every committed entry to it
//! ([`Writer::apply`] with the entry's raft index). Each shard holds a [`Reader`] and serves ranges,
//! watch catch-up ([`Reader::range_events`]) and HashKV from the published state without locks.
//! Requests are plain Rust mirrors of etcd's messages ([`types`]); the pre-raft checks etcd makes are
//! the pure `validate_*` functions ([`validate`]); everything that depends on state is decided at
//! apply. Errors are the one [`KvError`] enum whose messages are etcd's, byte for byte.
//!
//! Storage: values are appended as crc-framed records into value-log segments (`vlog.rs`) and
//! the ordered index (a crossbeam `SkipMap`, `index.rs`) maps each key to an immutable,
//! copy-on-write list of versions `(revision, kind, create, version, lease, value length,
//! segment, offset)`; the segment table (`segments.rs`) says where each segment's bytes are.
//! Ranges hand out `Bytes` slices of the segments. With the value log on disk
//! ([`ValueLogOptions::on_disk`], as the server runs it) a full segment is sealed and handed to
//! the driver ([`Writer::take_sealed_segments`]), which writes, syncs and maps it; then
//! [`Writer::segment_durable`] points the table at the mapping and the memory copy goes.
//! Compaction ([`Writer::compact_step`]) trims histories and rewrites mostly-dead segments in
//! bounded steps; segments it empties are reported ([`Writer::take_dead_segments`]) for the
//! driver to delete once no kept checkpoint points into them. [`Writer::checkpoint`] /
//! [`Store::restore_with_segments`] serialize the index as a framed, crc-checked rkyv archive
//! whose versions point into durable segments (other values inline), and map those segments
//! back at restore; a leader sends a follower that image together with the segment files it
//! names, and [`segment_shift_header`] gives those files ids above the follower's own: a new
//! header, whose shift the restore adds to every id the archive names.
//! [`Writer::checkpoint_source`] lets another thread do the serializing while the writer keeps
//! applying.
//!
//! Architecture invariant: keel-kv does no I/O, reads no clock and spawns no thread; it only turns
//! requests into state, responses and events, and bytes into bytes. Segment files reach it as
//! `Bytes` its driver mapped.
//!
//! Architecture invariant: there is exactly one writer; it publishes the current revision (an
//! `AtomicI64`) only after a whole txn is applied, and readers never read above it, so no reader sees
//! half a txn.
//!
//! Architecture invariant: `apply` is deterministic: the same entries in the same order give the same
//! state, the same responses, the same events, the same [`Reader::hash_kv`] and the same
//! [`CheckpointSource::hash`] (Maintenance.Hash), whatever point the background compaction reached.
//!
//! Architecture invariant: keel-kv never sees protobuf types; keel-grpc converts at its boundary.

pub mod bbolt;
mod checkpoint;
mod dirty;
pub mod error;
mod history;
mod index;
mod lookup;
mod read;
mod segments;
mod store;
pub mod types;
pub mod validate;
mod vlog;

pub use checkpoint::{
    checkpoint_kind, checkpoint_segments, image_from_versions, remove_segment_shift,
    segment_shift_header, segment_shift_of, without_segment_shift_in, CheckpointKind,
    CheckpointSource, DeltaBase, ExportVersion, ImageParts, RestoreHelpers, SegmentFiles,
    HEADER_BYTES as CHECKPOINT_HEADER_BYTES, PAYLOAD_ALIGN_BYTES as CHECKPOINT_PAYLOAD_ALIGN_BYTES,
};
pub use error::{KvError, Result};
pub use history::EventSteps;
pub use index::Unchecked;
pub use read::{KeyValueShape, RangeRest, RangeSplit, RangeSteps};
pub use segments::{release_spare_segment_buffers, MappedSegment};
pub use store::{
    txn_is_read_only, txn_is_serializable, ApplyInSteps, CompactionStatus, Progress, Reader, Store,
    TxnReadEnd, TxnReadSteps, TxnReads, UnreadableRecord, ValueLogOptions, Writer,
    COMPACT_REVISION_NONE, REVISION_INITIAL,
};
pub use types::*;
pub use validate::{
    validate_delete_range, validate_lease_grant, validate_put, validate_range, validate_txn,
    LEASE_TTL_MAX_S, MAX_TXN_OPS_DEFAULT,
};
pub use vlog::{
    record_bytes, DeadSegment, SealedSegment, RECORD_HEADER_BYTES, SEGMENT_BYTES, SEGMENT_NONE,
};

#[cfg(test)]
mod tests;
