//! keel-kv: the MVCC store behind Keel's etcd v3 API.
//!
//! Bird's-eye view: the raft core owns the single [`Writer`] and applies every committed entry to it
//! ([`Writer::apply`] with the entry's raft index). Each shard holds a [`Reader`] and serves ranges,
//! watch catch-up ([`Reader::range_events`]) and HashKV from the published state without locks.
//! Requests are plain Rust mirrors of etcd's messages ([`types`]); the pre-raft checks etcd makes are
//! the pure `validate_*` functions ([`validate`]); everything that depends on state is decided at
//! apply. Errors are the one [`KvError`] enum whose messages are etcd's, byte for byte.
//!
//! Storage: values are appended into 1 MiB in-memory value-log segments (`vlog.rs`) and the ordered
//! index (a crossbeam `SkipMap`, `index.rs`) maps each key to an immutable, copy-on-write list of
//! versions `(revision, kind, create, version, lease, value slice)`. Ranges hand out `Bytes` slices
//! of the segments. Compaction ([`Writer::compact_step`]) trims histories and rewrites mostly-dead
//! segments in bounded steps. [`Writer::checkpoint`] / [`Store::restore`] serialize everything as a
//! framed, crc-checked rkyv archive; [`Writer::checkpoint_source`] lets another thread do the
//! serializing while the writer keeps applying.
//!
//! Architecture invariant: keel-kv does no I/O, reads no clock and spawns no thread; it only turns
//! requests into state, responses and events, and bytes into bytes.
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
pub mod error;
mod index;
mod read;
mod store;
pub mod types;
pub mod validate;
mod vlog;

pub use checkpoint::{
    checkpoint_segments, image_from_versions, inline_image, CheckpointSource, ExportVersion,
    SegmentFiles, HEADER_BYTES as CHECKPOINT_HEADER_BYTES,
};
pub use error::{KvError, Result};
pub use store::{
    CompactionStatus, Reader, Store, ValueLogOptions, Writer, COMPACT_REVISION_NONE,
    REVISION_INITIAL,
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
