//! keel-bench: etcd's benchmark workloads, and a side-by-side comparison harness.
//!
//! Bird's-eye view: `client` is a small gRPC-over-HTTP/2 client (tokio + h2) that keeps many
//! requests in flight over few connections. `load` drives a workload in closed loop (each
//! client sends its next request when the previous one returns) or open loop (`--rate`,
//! latency measured from the intended send time, so queueing behind a slow server is counted).
//! `workloads` holds etcd's tools/benchmark workloads (put, range, txn-put, txn-mixed,
//! watch-latency, lease-keepalive) with the same flags. `report` turns HDR histograms and
//! getrusage into the human summary and the `--json` document. `compare` starts etcd and Keel
//! (or any binary that accepts etcd's flags) on free ports, runs the DESIGN.md "Targets"
//! workloads against each, alternating and repeated, measures the disk's O_DIRECT write +
//! fdatasync floor in the same run, and prints Keel/etcd ratios of throughput, latency and the
//! server's CPU per request (its process CPU clock read around each workload), with the
//! spread over repeats, JSON and an SVG chart. `reference` is the server the one-client row
//! is also read against: HTTP/2 on one thread, each put answered right after the floor's own
//! write and fdatasync, nothing else.
//!
//! Architecture invariant: the bench speaks only the etcd v3 gRPC wire protocol to the server;
//! it never links Keel's server crates, so it measures etcd and Keel through the same path.
//!
//! Architecture invariant: a latency sample is taken from the intended send time (closed loop:
//! the actual send time), never from a time chosen after the server let the client proceed.
//!
//! Architecture invariant: every buffer and queue has a limit (`FRAME_BYTES_MAX`,
//! `KEY_SPACE_BYTES_MAX`, `WATCH_EVENTS_MAX`); exceeding one is an `Error`, not growth.

pub mod client;
pub mod compare;
pub mod load;
pub mod progress;
pub mod reference;
pub mod report;
pub mod workloads;

/// The one error type of this crate: every operating failure (network, server status, bad
/// flags, files) is one of these; programmer errors panic instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("http/2: {0}")]
    H2(#[from] h2::Error),
    #[error("grpc status {code}: {message}")]
    Status { code: u32, message: String },
    #[error("decode: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("server {label}: {reason}")]
    Server { label: String, reason: String },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("chart: {0}")]
    Chart(String),
}
