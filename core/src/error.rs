//! keel-core's one error enum: what can go wrong running a node (as opposed to answering a
//! request, which keel-grpc's `EtcdError` covers).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on unix socket {}: {source}", path.display())]
    ListenUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("executor: {0}")]
    Executor(String),
    #[error("write-ahead log: {0}")]
    Wal(String),
    #[error("mvcc store: {0}")]
    Store(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("client TLS: {0}")]
    Tls(String),
    #[error("corruption check: {0}")]
    Corrupt(String),
    #[error("snapshot: {0}")]
    Snapshot(String),
}
