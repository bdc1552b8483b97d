//! The crate's one error enum: operating errors a caller must handle.

/// Every operating error raft reports. Programmer errors (a broken invariant) panic instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The proposal was refused: no leader known, leadership transfer in progress,
    /// this node is not a member, or a limit (uncommitted bytes, message size) was reached.
    #[error("raft: proposal dropped: {0}")]
    ProposalDropped(&'static str),
    /// A configuration change is already pending (proposed, not yet applied).
    #[error("raft: a configuration change is already pending")]
    ConfChangePending,
    /// The configuration change makes no sense for the current membership.
    #[error("raft: invalid configuration change: {0}")]
    InvalidConfChange(&'static str),
    /// A learner may only be promoted once its log has caught up with the leader's commit.
    #[error("raft: learner {0} has not caught up with the leader")]
    LearnerNotCaughtUp(u64),
    /// The read-index request was refused: no leader known, or too many reads pending.
    #[error("raft: read index dropped: {0}")]
    ReadIndexDropped(&'static str),
    /// The requested index is behind the storage's first index (compacted away).
    #[error("raft: requested index is unavailable due to compaction")]
    Compacted,
    /// The requested index is beyond the storage's last index.
    #[error("raft: requested entry at index is unavailable")]
    Unavailable,
    /// The storage has no snapshot to hand out right now; the leader retries later.
    #[error("raft: snapshot is temporarily unavailable")]
    SnapshotTemporarilyUnavailable,
    /// The configuration is invalid (a programmer or operator error caught at start).
    #[error("raft: invalid config: {0}")]
    InvalidConfig(&'static str),
    /// A message or record could not be decoded.
    #[error("raft: decode error: {0}")]
    Decode(&'static str),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
