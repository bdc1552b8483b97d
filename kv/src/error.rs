//! The one error enum of keel-kv.
//!
//! Each variant maps to exactly one etcd gRPC status; the `Display` text is etcd's message byte for
//! byte so the gRPC layer can forward it unchanged.

/// Every operating error keel-kv reports. Programmer errors panic instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// InvalidArgument: an empty key in a range, put, delete or compare.
    #[error("etcdserver: key is not provided")]
    KeyNotProvided,
    /// InvalidArgument: `ignore_value` together with a value.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// InvalidArgument: `ignore_lease` together with a lease.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// InvalidArgument: `ignore_value`/`ignore_lease` on a key that does not exist (decided at apply).
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// InvalidArgument: more than `max_txn_ops` operations in one branch of a txn.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// InvalidArgument: the same key put twice, or put inside a delete range, in one txn branch.
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// OutOfRange: the revision asked for is below the compact revision.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// OutOfRange: the revision asked for is above the current revision.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    /// NotFound: the lease does not exist.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// FailedPrecondition: a lease with this id already exists.
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    /// OutOfRange: a lease TTL above `LEASE_TTL_MAX_S`.
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// A checkpoint failed validation (not an etcd error: the server refuses to start from it).
    #[error("keel-kv: damaged checkpoint: {0}")]
    CheckpointDamaged(&'static str),
    /// A checkpoint refers to a value-log segment that cannot be used (missing, short or
    /// unreadable): not an etcd error, the server refuses to start and names the file.
    #[error("keel-kv: value-log segment {segment}: {why}")]
    SegmentUnusable { segment: u32, why: String },
    /// A bbolt database (an etcd snapshot) that cannot be read or written (not an etcd error:
    /// snapshot tools report it).
    #[error("keel-kv: bbolt: {0}")]
    Bolt(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, KvError>;
