//! The crate's one error type.

/// Operating errors of the WAL. Programmer errors (bad configuration, misuse) panic instead.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// A storage call failed; `context` names the operation and the file.
    #[error("wal i/o error: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Recovery found an invalid spot followed by valid, acknowledged data: the log is damaged in
    /// the middle, and starting would silently drop acknowledged writes.
    #[error("wal corrupt: {file} at offset {offset}: {reason}")]
    Corrupt {
        file: String,
        offset: u64,
        reason: String,
    },
    /// One record is larger than a batch may be (`WalConfig::batch_bytes_max`).
    #[error("wal record of {record_bytes} bytes exceeds the limit of {record_bytes_max} bytes")]
    RecordTooLarge {
        record_bytes: usize,
        record_bytes_max: usize,
    },
    /// An earlier write failed (or an append was cancelled mid-write), so the state of the tail on
    /// disk is unknown; the WAL accepts nothing more and the process should restart and recover.
    #[error("wal stopped after an earlier failure: {reason}")]
    Stopped { reason: String },
}

impl WalError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        WalError::Io {
            context: context.into(),
            source,
        }
    }
}
