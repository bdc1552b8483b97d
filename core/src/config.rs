//! The node's configuration: etcd's flags and `ETCD_*` environment variables, so an existing
//! etcd deployment switches by changing the binary only.
//!
//! Go's flag package accepts `-name x`, `--name x` and `--name=x`; clap only knows the double
//! dash, so [`normalize_go_args`] rewrites single-dash long flags before parsing. etcd flags that
//! only tune etcd internals we do not have are accepted and reported as ignored, because
//! refusing them would break deployments for no safety gain. Flags whose silent omission would
//! weaken security (TLS) are refused.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser};

use crate::compactor::Retention;
use crate::error::CoreError;
use crate::flags_compat::EtcdCompatFlags;
use crate::tls::{Allowed, CertSource, ClientAuth, Side, TlsSettings};

/// etcd's defaults (embed/config.go), kept here so a reader can compare them side by side.
pub const DEFAULT_MAX_TXN_OPS: u32 = 128;
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 1_572_864;
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Quotas above this are clamped by etcd with a warning (8 GiB is its suggested maximum).
pub const QUOTA_BACKEND_BYTES_MAX: u64 = 8 * 1024 * 1024 * 1024;
/// gRPC's receive limit is max-request-bytes plus this slack, as etcd sets it.
pub const GRPC_RECV_SLACK_BYTES: u32 = 512 * 1024;

const _: () =
    assert!(DEFAULT_MAX_REQUEST_BYTES as u64 + (GRPC_RECV_SLACK_BYTES as u64) < u32::MAX as u64);

/// Keel's default for `--max-concurrent-streams` (etcd's is math.MaxUint32); why it differs is
/// written on the constant.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = keel_grpc::DEFAULT_MAX_CONCURRENT_STREAMS;
/// Open client connections one shard serves at once (`--max-connections-per-shard`). etcd has
/// no such limit: it stops at the file-descriptor limit, where accept fails and the kernel's
/// backlog fills, and nothing else gets a descriptor either. A bound below that closes the
/// surplus at once, so clients fail over, and the member keeps descriptors for its WAL, value
/// log and peers. 10,000 per shard: the systemd unit grants 65,536 descriptors, which covers
/// 4 full shards with room to spare (raise LimitNOFILE with more shards), and an idle gRPC
/// connection that has made a call costs 20-40 KiB (measured: RSS over 2,000 and 4,000 such
/// connections; h2's buffers and HPACK tables), so a full shard stays under about 400 MiB.
pub const DEFAULT_MAX_CONNECTIONS_PER_SHARD: usize = 10_000;
/// Watchers one watch stream may hold (`--max-watchers-per-stream`). etcd has no limit; each
/// watcher costs a map entry and an index entry on its shard, and Kubernetes opens one per
/// resource type and watch cache, far below this.
pub const DEFAULT_MAX_WATCHERS_PER_STREAM: usize = 100_000;
/// `--preface-timeout-ms`: see `keel_grpc::DEFAULT_PREFACE_TIMEOUT` for why.
pub const DEFAULT_PREFACE_TIMEOUT_MS: u64 = keel_grpc::DEFAULT_PREFACE_TIMEOUT.as_millis() as u64;

/// Bounds of `--value-log-segment-bytes`: a segment holds at least one 4 KiB block, and record
/// offsets within it fit in 32 bits with room to spare.
pub const VALUE_LOG_SEGMENT_BYTES_MIN: usize = 4096;
pub const VALUE_LOG_SEGMENT_BYTES_MAX: usize = 1 << 30;
#[derive(Parser, Debug, Clone)]
#[command(
    name = "keel",
    version,
    about = "Keel: an etcd v3 compatible, strongly consistent key-value store",
    long_about = None,
    // Go's flag package lets a later flag override an earlier one; so does etcd, so do we.
    args_override_self = true
)]
pub struct Flags {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,

    /// Path to the data directory (default: "<name>.keel").
    #[arg(long = "data-dir", env = "ETCD_DATA_DIR")]
    pub data_dir: Option<String>,

    /// Path to a dedicated WAL directory (default: inside the data directory).
    #[arg(long = "wal-dir", env = "ETCD_WAL_DIR")]
    pub wal_dir: Option<String>,

    /// List of URLs to listen on for client traffic.
    #[arg(
        long = "listen-client-urls",
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://127.0.0.1:2379"
    )]
    pub listen_client_urls: String,

    /// List of this member's client URLs to advertise to the public.
    #[arg(
        long = "advertise-client-urls",
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://127.0.0.1:2379"
    )]
    pub advertise_client_urls: String,

    /// List of URLs to listen on for peer traffic.
    #[arg(
        long = "listen-peer-urls",
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://127.0.0.1:2380"
    )]
    pub listen_peer_urls: String,

    /// List of this member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long = "initial-advertise-peer-urls",
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://127.0.0.1:2380"
    )]
    pub initial_advertise_peer_urls: String,

    /// Initial cluster configuration for bootstrapping ("name=url,name=url").
    #[arg(long = "initial-cluster", env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,

    /// Initial cluster state ('new' or 'existing').
    #[arg(
        long = "initial-cluster-state",
        env = "ETCD_INITIAL_CLUSTER_STATE",
        default_value = "new"
    )]
    pub initial_cluster_state: String,

    /// Initial cluster token for the cluster during bootstrap.
    #[arg(
        long = "initial-cluster-token",
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,

    /// Maximum number of operations permitted in a transaction.
    #[arg(long = "max-txn-ops", env = "ETCD_MAX_TXN_OPS", default_value_t = DEFAULT_MAX_TXN_OPS)]
    pub max_txn_ops: u32,

    /// Maximum client request size in bytes the server will accept.
    #[arg(long = "max-request-bytes", env = "ETCD_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: u32,

    /// Maximum concurrent streams that each client can open at a time (0: no limit, as in etcd).
    #[arg(
        long = "max-concurrent-streams",
        env = "ETCD_MAX_CONCURRENT_STREAMS",
        default_value_t = DEFAULT_MAX_CONCURRENT_STREAMS,
        value_parser = parse_go_uint32
    )]
    pub max_concurrent_streams: u32,

    /// Raise alarms when the store exceeds the given quota. 0 means the default (2 GiB).
    #[arg(
        long = "quota-backend-bytes",
        env = "ETCD_QUOTA_BACKEND_BYTES",
        default_value_t = 0
    )]
    pub quota_backend_bytes: i64,

    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(
        long = "heartbeat-interval",
        env = "ETCD_HEARTBEAT_INTERVAL",
        default_value_t = 100
    )]
    pub heartbeat_interval_ms: u64,

    /// Time (in milliseconds) for an election to timeout.
    #[arg(
        long = "election-timeout",
        env = "ETCD_ELECTION_TIMEOUT",
        default_value_t = 1000
    )]
    pub election_timeout_ms: u64,

    /// Number of committed entries between two MVCC checkpoints (etcd: snapshots).
    #[arg(
        long = "snapshot-count",
        env = "ETCD_SNAPSHOT_COUNT",
        default_value_t = 100_000
    )]
    pub snapshot_count: u64,

    /// Configures log level: debug, info, warn, error, panic or fatal.
    #[arg(long = "log-level", env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Auto compaction retention (periodic: a duration or hours; revision: a count). 0 disables.
    #[arg(
        long = "auto-compaction-retention",
        env = "ETCD_AUTO_COMPACTION_RETENTION",
        // Go's flag package takes "-1" or "-5m" as the value; etcd then refuses it with a
        // message we want to give too, rather than clap's "unexpected argument".
        allow_hyphen_values = true,
        default_value = "0"
    )]
    pub auto_compaction_retention: String,

    /// Interpret 'auto-compaction-retention' as 'periodic' or 'revision'.
    #[arg(
        long = "auto-compaction-mode",
        env = "ETCD_AUTO_COMPACTION_MODE",
        default_value = "periodic"
    )]
    pub auto_compaction_mode: String,

    /// Keel, for tests only: how often revision-mode auto-compaction checks the revision, in
    /// milliseconds. etcd's interval (5 minutes, the default) is not configurable in etcd.
    #[arg(
        long = "revision-compaction-interval-ms",
        env = "KEEL_REVISION_COMPACTION_INTERVAL_MS",
        hide = true,
        default_value_t = crate::compactor::REVISION_CHECK_INTERVAL_MS
    )]
    pub revision_compaction_interval_ms: u64,

    /// Keel: number of client-serving shards, each a pinned core with its own executor (0 =
    /// one per CPU the process may run on, less the raft core's own where there are 4 or
    /// more: measured on 4, 8 and 16 CPUs, writes went faster with the raft core alone;
    /// members of `--initial-cluster` with peer URLs on this host split the CPUs, see
    /// `default_placement`).
    #[arg(long = "shards", env = "KEEL_SHARDS", default_value_t = 0)]
    pub shards: usize,

    /// Keel: which CPU the raft core is pinned to (default: the last one the process may run
    /// on; shards go on the others first). When several members of `--initial-cluster` have
    /// peer URLs on this host (loopback, `localhost` or this host's addresses), each takes a
    /// CPU of its own share instead (`default_placement`), so their raft cores do not all
    /// take the last CPU and starve each other. Given, it moves only the raft core (`place`).
    #[arg(long = "raft-cpu", env = "KEEL_RAFT_CPU")]
    pub raft_cpu: Option<usize>,

    /// Keel: whether the shards placed on the raft core's CPU run in the raft core's executor
    /// (one thread for that CPU) rather than as threads of their own beside it. Default: yes
    /// when several members of `--initial-cluster` share this host (a local cluster), no for a
    /// member alone on its host. Hosted, a shard hands proposals and answers to the raft core
    /// without crossing threads, which costs less CPU a request; but glommio does not preempt
    /// a task, so a request that keeps such a shard busy holds the raft core, and its
    /// heartbeats, for as long. Ranges walk in steps and let the raft core run between them,
    /// and a range sorts large answers off the executor (a count over millions of keys, in a
    /// range or a read-only txn, or a range's sort of them, no longer holds it); a compare
    /// over a large range, and the sort of a large range inside a txn, still do.
    #[arg(long = "host-shards-on-raft-cpu", env = "KEEL_HOST_SHARDS_ON_RAFT_CPU", num_args = 0..=1, default_missing_value = "true")]
    pub host_shards_on_raft_cpu: Option<bool>,

    /// Keel: whether shard threads run under SCHED_BATCH (default true): a shard's wake-up
    /// then does not preempt the thread running on its CPU (the raft core, or a client on a
    /// shared host). Less CPU a request and lower tail latency where threads share CPUs, at
    /// about 0.1 ms more median wait for a request that wakes a shard on a busy CPU
    /// (`rt::batch_scheduling_for_this_thread`).
    #[arg(long = "shard-sched-batch", env = "KEEL_SHARD_SCHED_BATCH", num_args = 0..=1, default_missing_value = "true")]
    pub shard_sched_batch: Option<bool>,

    /// Keel: bytes in one value-log segment file (values go to `<data-dir>/vlog` a segment at
    /// a time: larger segments mean fewer files, smaller ones less memory waiting for disk).
    #[arg(
        long = "value-log-segment-bytes",
        env = "KEEL_VALUE_LOG_SEGMENT_BYTES",
        default_value_t = keel_kv::SEGMENT_BYTES
    )]
    pub value_log_segment_bytes: usize,

    /// Keel: bytes of value-log segment files this member keeps in memory (the page cache of
    /// its mapped segments); past it, the segments least recently read are paged out. 0: no
    /// limit. Default: a quarter of the machine's memory.
    #[arg(long = "value-cache-bytes", env = "KEEL_VALUE_CACHE_BYTES")]
    pub value_cache_bytes: Option<u64>,

    /// Keel: open client connections one shard serves at once; a connection beyond it is
    /// closed as soon as it is accepted.
    #[arg(
        long = "max-connections-per-shard",
        env = "KEEL_MAX_CONNECTIONS_PER_SHARD",
        default_value_t = DEFAULT_MAX_CONNECTIONS_PER_SHARD
    )]
    pub max_connections_per_shard: usize,

    /// Keel: watchers one watch stream may hold; a create beyond it is answered created and
    /// canceled, with a cancel reason.
    #[arg(
        long = "max-watchers-per-stream",
        env = "KEEL_MAX_WATCHERS_PER_STREAM",
        default_value_t = DEFAULT_MAX_WATCHERS_PER_STREAM
    )]
    pub max_watchers_per_stream: usize,

    /// Keel: milliseconds a new client connection has to send its first bytes (the whole
    /// HTTP/2 preface, or the start of an HTTP/1.1 request) before it is closed.
    #[arg(
        long = "preface-timeout-ms",
        env = "KEEL_PREFACE_TIMEOUT_MS",
        default_value_t = DEFAULT_PREFACE_TIMEOUT_MS
    )]
    pub preface_timeout_ms: u64,

    /// Path to the client server TLS cert file (PEM; the leaf first, then its chain).
    #[arg(long = "cert-file", env = "ETCD_CERT_FILE")]
    pub cert_file: Option<String>,
    /// Path to the client server TLS key file (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long = "key-file", env = "ETCD_KEY_FILE")]
    pub key_file: Option<String>,
    /// Path to the client server TLS trusted CA cert file; giving it requires client
    /// certificates signed by it, as etcd does.
    #[arg(long = "trusted-ca-file", env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<String>,
    /// Enable client cert authentication (needs --trusted-ca-file).
    #[arg(long = "client-cert-auth", env = "ETCD_CLIENT_CERT_AUTH", num_args = 0..=1, default_missing_value = "true")]
    pub client_cert_auth: Option<bool>,
    /// Path to the client certificate revocation list file (PEM).
    #[arg(long = "client-crl-file", env = "ETCD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<String>,
    /// Client TLS using generated certificates (written under <data-dir>/fixtures/client).
    #[arg(long = "auto-tls", env = "ETCD_AUTO_TLS", num_args = 0..=1, default_missing_value = "true")]
    pub auto_tls: Option<bool>,
    /// Comma-separated list of supported TLS 1.2 cipher suites (Go's names); TLS 1.3 suites
    /// are always on, as in Go.
    #[arg(long = "cipher-suites", env = "ETCD_CIPHER_SUITES")]
    pub cipher_suites: Option<String>,
    /// Not supported: refused rather than silently accepting any client name.
    #[arg(
        long = "client-cert-allowed-hostname",
        env = "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME",
        hide = true
    )]
    pub client_cert_allowed_hostname: Option<String>,

    /// Path to the peer server TLS cert file; a dialing member presents it as its client
    /// certificate too (give it both serverAuth and clientAuth usages).
    #[arg(long = "peer-cert-file", env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<String>,
    /// Path to the peer server TLS key file.
    #[arg(long = "peer-key-file", env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<String>,
    /// Path to the peer server TLS trusted CA file: peers' certificates are verified against
    /// it on both sides of a connection.
    #[arg(long = "peer-trusted-ca-file", env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<String>,
    /// Path to the peer certificate revocation list file (PEM).
    #[arg(long = "peer-crl-file", env = "ETCD_PEER_CRL_FILE")]
    pub peer_crl_file: Option<String>,
    /// Allowed CommonName for inter-peer authentication.
    #[arg(long = "peer-cert-allowed-cn", env = "ETCD_PEER_CERT_ALLOWED_CN")]
    pub peer_cert_allowed_cn: Option<String>,
    /// Allowed TLS hostname for inter-peer authentication.
    #[arg(
        long = "peer-cert-allowed-hostname",
        env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME"
    )]
    pub peer_cert_allowed_hostname: Option<String>,
    /// Peer TLS using self-generated certificates (under <data-dir>/fixtures/peer); peers are
    /// then not verified, as in etcd.
    #[arg(long = "peer-auto-tls", env = "ETCD_PEER_AUTO_TLS", num_args = 0..=1, default_missing_value = "true")]
    pub peer_auto_tls: Option<bool>,
    /// Enable peer client cert authentication (needs --peer-trusted-ca-file).
    #[arg(long = "peer-client-cert-auth", env = "ETCD_PEER_CLIENT_CERT_AUTH", num_args = 0..=1, default_missing_value = "true")]
    pub peer_client_cert_auth: Option<bool>,

    /// etcd flags that tune internals Keel does not have; accepted so deployments keep working.
    #[arg(long = "enable-v2", env = "ETCD_ENABLE_V2", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub enable_v2: Option<bool>,
    #[arg(long = "enable-pprof", env = "ETCD_ENABLE_PPROF", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub enable_pprof: Option<bool>,
    /// Refuse membership changes that would leave too few started or reachable voters for
    /// a quorum, as etcd does (default true).
    #[arg(long = "strict-reconfig-check", env = "ETCD_STRICT_RECONFIG_CHECK", num_args = 0..=1, default_missing_value = "true")]
    pub strict_reconfig_check: Option<bool>,
    #[arg(long = "pre-vote", env = "ETCD_PRE_VOTE", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub pre_vote: Option<bool>,
    #[arg(long = "logger", env = "ETCD_LOGGER", hide = true)]
    pub logger: Option<String>,
    #[arg(long = "log-outputs", env = "ETCD_LOG_OUTPUTS", hide = true)]
    pub log_outputs: Option<String>,
    #[arg(long = "metrics", env = "ETCD_METRICS", hide = true)]
    pub metrics: Option<String>,
    #[arg(long = "max-snapshots", env = "ETCD_MAX_SNAPSHOTS", hide = true)]
    pub max_snapshots: Option<u64>,
    #[arg(long = "max-wals", env = "ETCD_MAX_WALS", hide = true)]
    pub max_wals: Option<u64>,
    #[arg(
        long = "grpc-keepalive-min-time",
        env = "ETCD_GRPC_KEEPALIVE_MIN_TIME",
        hide = true
    )]
    pub grpc_keepalive_min_time: Option<String>,
    #[arg(
        long = "grpc-keepalive-interval",
        env = "ETCD_GRPC_KEEPALIVE_INTERVAL",
        hide = true
    )]
    pub grpc_keepalive_interval: Option<String>,
    #[arg(
        long = "grpc-keepalive-timeout",
        env = "ETCD_GRPC_KEEPALIVE_TIMEOUT",
        hide = true
    )]
    pub grpc_keepalive_timeout: Option<String>,
    /// Auth token provider: "simple" (the default),
    /// "jwt,sign-method=M,priv-key=PATH,pub-key=PATH,ttl=D", or "" (none: certificates only).
    #[arg(long = "auth-token", env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// Seconds a simple token lives after its last use.
    #[arg(
        long = "auth-token-ttl",
        env = "ETCD_AUTH_TOKEN_TTL",
        default_value_t = 300
    )]
    pub auth_token_ttl: u64,
    /// bcrypt cost for hashing auth passwords (4..=31).
    #[arg(long = "bcrypt-cost", env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,
    #[arg(
        long = "experimental-watch-progress-notify-interval",
        env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL",
        hide = true
    )]
    pub experimental_watch_progress_notify_interval: Option<String>,
    /// Before serving clients, compare this member's data with its peers' and refuse to start
    /// on a mismatch.
    #[arg(
        long = "experimental-initial-corrupt-check",
        env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub experimental_initial_corrupt_check: bool,
    /// How often the leader compares members' data (a Go duration; 0 disables).
    #[arg(
        long = "experimental-corrupt-check-time",
        env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME",
        default_value = "0s"
    )]
    pub experimental_corrupt_check_time: String,

    /// URLs to serve /metrics and /health on, HTTP only (no gRPC), as etcd's metrics listener.
    #[arg(long = "listen-metrics-urls", env = "ETCD_LISTEN_METRICS_URLS")]
    pub listen_metrics_urls: Option<String>,

    /// The rest of etcd 3.4's flags: ignored or refused (see `flags_compat`).
    #[command(flatten)]
    pub etcd_compat: EtcdCompatFlags,
}

/// Whether a new member starts a new cluster or joins one that exists (etcd's
/// `--initial-cluster-state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

/// One member named in `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// The validated configuration the node runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub data_dir: PathBuf,
    pub wal_dir: PathBuf,
    /// Client listeners, each plaintext or TLS by its URL's scheme.
    pub listen_client: Vec<ClientListener>,
    /// Client listeners on unix sockets (`unix://path`, `unixs://path`), served by shard 0.
    pub listen_client_unix: Vec<UnixListenerSpec>,
    /// Listeners serving only /metrics and /health over HTTP/1.1 (`--listen-metrics-urls`).
    pub listen_metrics: Vec<ClientListener>,
    /// TLS for the https client listeners; None when every listener is plaintext.
    pub client_tls: Option<TlsSettings>,
    pub advertise_client_urls: Vec<String>,
    /// Peer listeners, each plaintext or TLS by its URL's scheme.
    pub listen_peer: Vec<ClientListener>,
    /// TLS for https peer listeners and for dialing https peer URLs; None when no peer URL is
    /// https.
    pub peer_tls: Option<TlsSettings>,
    pub initial_advertise_peer_urls: Vec<String>,
    pub initial_cluster: Vec<InitialMember>,
    pub initial_cluster_state: ClusterState,
    pub initial_cluster_token: String,
    pub max_txn_ops: u32,
    pub max_request_bytes: u32,
    pub quota_backend_bytes: u64,
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised on every client connection.
    pub max_concurrent_streams: u32,
    pub max_connections_per_shard: usize,
    pub max_watchers_per_stream: usize,
    pub preface_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_ms: u64,
    pub snapshot_count: u64,
    /// Which auth tokens this member assigns and accepts (`--auth-token`).
    pub auth_token: crate::auth::TokenProvider,
    /// Milliseconds a simple auth token lives after its last use (`--auth-token-ttl`).
    pub auth_token_ttl_ms: u64,
    /// bcrypt cost for auth passwords (`--bcrypt-cost`; etcd's default 10).
    pub bcrypt_cost: u32,
    pub log_level: String,
    /// Auto-compaction's retention and mode; None when off (etcd's default).
    pub auto_compaction: Option<Retention>,
    /// The CPU each client-serving shard is pinned to, one entry per shard (`--shards`,
    /// `--raft-cpu` and the process's CPU set; see `shard_cpus`).
    pub shard_cpus: Vec<usize>,
    pub raft_cpu: usize,
    /// Whether the shards on `raft_cpu` run in the raft core's executor
    /// (`--host-shards-on-raft-cpu`; see `shard::Host`).
    pub host_shards_on_raft_cpu: bool,
    /// Whether shard threads run under SCHED_BATCH (`--shard-sched-batch`).
    pub shard_sched_batch: bool,
    /// Members of `--initial-cluster` whose peer URLs are on this host, this one included (1
    /// when it is alone, or its own URLs are not known to be local): more than one changes the
    /// default placement (`default_placement`).
    pub members_on_this_host: usize,
    /// etcd's `--strict-reconfig-check` (default true): refuse membership changes that would
    /// leave too few started or reachable voters for a quorum.
    pub strict_reconfig_check: bool,
    /// Bytes in one value-log segment (`--value-log-segment-bytes`).
    pub value_log_segment_bytes: usize,
    /// The value cache's limit (`--value-cache-bytes`; 0: none).
    pub value_cache_bytes: u64,
    /// Compare data with the peers before serving (`--experimental-initial-corrupt-check`).
    pub initial_corrupt_check: bool,
    /// How often the leader compares members' data; None when disabled.
    pub corrupt_check_interval: Option<std::time::Duration>,
    /// etcd flags we accept but do not act on, for the startup log.
    pub ignored_flags: Vec<&'static str>,
    /// Configuration the member runs with but an operator should hear about, for the startup log.
    pub warnings: Vec<String>,
    /// The `--config-file` the settings came from, if any.
    pub config_file: Option<PathBuf>,
    /// `--host-whitelist`: the Host headers plaintext HTTP requests may carry.
    pub host_whitelist: crate::host_whitelist::HostWhitelist,
    /// `--cors`: the origins the client port's HTTP answers name in their CORS fields.
    pub cors: crate::host_whitelist::CorsOrigins,
}

impl Config {
    /// Parses the process's own arguments and environment.
    pub fn from_env() -> Result<Config, CoreError> {
        Config::from_args(
            std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        )
    }

    /// Parses `args` (the program name first) and the environment. With `--config-file` (or
    /// `ETCD_CONFIG_FILE`) the file's settings are used instead, and every other flag and
    /// `ETCD_*` variable is ignored, as etcd does (the command line is still parsed first, so
    /// a malformed flag is refused either way, as in etcd).
    pub fn from_args(args: Vec<String>) -> Result<Config, CoreError> {
        let clap_error = |e: clap::Error| match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                e.exit()
            }
            _ => CoreError::Config(e.to_string()),
        };
        let flags = Flags::try_parse_from(normalize_go_args(args)).map_err(clap_error)?;
        let Some(path) = flags
            .etcd_compat
            .config_file
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
        else {
            return Config::from_flags(flags);
        };
        let file = crate::config_file::read(&path, &Flags::command())?;
        let command = Flags::command().mut_args(|a| a.env(None::<&'static str>));
        let matches = command
            .try_get_matches_from(std::iter::once("keel".to_string()).chain(file.args))
            .map_err(|e| CoreError::Config(format!("--config-file {}: {e}", path.display())))?;
        let flags = Flags::from_arg_matches(&matches).map_err(clap_error)?;
        let mut config = Config::from_flags(flags)
            .map_err(|e| CoreError::Config(format!("--config-file {}: {e}", path.display())))?;
        for key in file.ignored_keys {
            config.warnings.push(format!(
                "--config-file {}: {key:?} is not an etcd 3.4 or Keel setting; ignored",
                path.display()
            ));
        }
        config.config_file = Some(path);
        Ok(config)
    }

    pub fn from_flags(f: Flags) -> Result<Config, CoreError> {
        let mut ignored_flags = f.etcd_compat.check()?;
        let (listen_client, listen_client_unix) =
            parse_client_listen_urls("listen-client-urls", &f.listen_client_urls)?;
        let (listen_metrics, metrics_unix) = match f.listen_metrics_urls.as_deref() {
            Some(urls) if !urls.trim().is_empty() => {
                parse_client_listen_urls("listen-metrics-urls", urls)?
            }
            _ => (Vec::new(), Vec::new()),
        };
        if !metrics_unix.is_empty() {
            return Err(CoreError::Config(
                "--listen-metrics-urls: unix sockets are not supported there".into(),
            ));
        }
        let mut warnings = Vec::new();
        let tls_listeners: Vec<ClientListener> = listen_client
            .iter()
            .chain(&listen_metrics)
            .copied()
            .chain(listen_client_unix.iter().map(|u| ClientListener {
                // Only the scheme matters for the TLS checks.
                addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                scheme: u.scheme,
            }))
            .collect();
        let client_tls = client_tls(&f, &tls_listeners, &mut warnings)?;
        let (listen_peer, peer_unix) =
            parse_client_listen_urls("listen-peer-urls", &f.listen_peer_urls)?;
        if !peer_unix.is_empty() {
            return Err(CoreError::Config(
                "--listen-peer-urls: unix sockets are not supported for peers".into(),
            ));
        }
        let advertise_client_urls = split_urls("advertise-client-urls", &f.advertise_client_urls)?;
        let initial_advertise_peer_urls = split_urls(
            "initial-advertise-peer-urls",
            &f.initial_advertise_peer_urls,
        )?;
        let initial_cluster = match &f.initial_cluster {
            Some(s) if !s.is_empty() => parse_initial_cluster(s)?,
            // etcd's default is "<name>=<initial-advertise-peer-urls>": a one-member cluster.
            _ => vec![InitialMember {
                name: f.name.clone(),
                peer_urls: initial_advertise_peer_urls.clone(),
            }],
        };
        let peer_tls = peer_tls(&f, &listen_peer, &initial_cluster, &mut warnings)?;
        if !initial_cluster.iter().any(|m| m.name == f.name) {
            return Err(CoreError::Config(format!(
                "couldn't find local name {:?} in the initial cluster configuration",
                f.name
            )));
        }
        let initial_cluster_state = match f.initial_cluster_state.as_str() {
            "new" => ClusterState::New,
            "existing" => ClusterState::Existing,
            other => {
                return Err(CoreError::Config(format!(
                    "invalid value {other:?} for flag -initial-cluster-state: valid values are \"new\", \"existing\""
                )))
            }
        };
        if f.heartbeat_interval_ms == 0 || f.election_timeout_ms < 5 * f.heartbeat_interval_ms {
            return Err(CoreError::Config(format!(
                "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
                f.election_timeout_ms, f.heartbeat_interval_ms
            )));
        }
        let log_level = if f.etcd_compat.debug_logging() {
            "debug".to_string()
        } else {
            f.log_level.clone()
        };
        if !matches!(
            log_level.as_str(),
            "debug" | "info" | "warn" | "error" | "panic" | "fatal"
        ) {
            return Err(CoreError::Config(format!(
                "unknown log level {:?}",
                f.log_level
            )));
        }
        let quota_backend_bytes = match f.quota_backend_bytes {
            q if q < 0 => {
                return Err(CoreError::Config(
                    "--quota-backend-bytes must not be negative".into(),
                ));
            }
            0 => DEFAULT_QUOTA_BACKEND_BYTES,
            q => (q as u64).min(QUOTA_BACKEND_BYTES_MAX),
        };
        if f.max_txn_ops == 0 || f.max_request_bytes == 0 {
            return Err(CoreError::Config(
                "--max-txn-ops and --max-request-bytes must be positive".into(),
            ));
        }
        let corrupt_check_interval =
            crate::compactor::parse_go_duration(&f.experimental_corrupt_check_time)
                .and_then(|ns| {
                    u64::try_from(ns)
                        .map(std::time::Duration::from_nanos)
                        .map_err(|_| "a negative duration".to_string())
                })
                .map_err(|e| {
                    CoreError::Config(format!("--experimental-corrupt-check-time: {e}"))
                })?;
        // grpc-go reads a limit of 0 as "none" (etcd then advertises nothing); h2 would read it
        // as "refuse every stream", so 0 becomes the largest value SETTINGS can carry.
        let max_concurrent_streams = match f.max_concurrent_streams {
            0 => u32::MAX,
            n => n,
        };
        let positive = [
            (
                "max-connections-per-shard",
                f.max_connections_per_shard as u64,
            ),
            ("max-watchers-per-stream", f.max_watchers_per_stream as u64),
            ("preface-timeout-ms", f.preface_timeout_ms),
        ];
        for (flag, value) in positive {
            if value == 0 {
                return Err(CoreError::Config(format!("--{flag} must be positive")));
            }
        }
        if f.revision_compaction_interval_ms == 0 {
            return Err(CoreError::Config(
                "--revision-compaction-interval-ms must be positive".into(),
            ));
        }
        let auto_compaction = crate::compactor::parse_retention(
            &f.auto_compaction_mode,
            &f.auto_compaction_retention,
            f.revision_compaction_interval_ms,
        )
        .map_err(CoreError::Config)?;
        let cpus = crate::rt::process_cpu_list();
        let local_addresses = addresses_or_warn(interface_addresses(), &mut warnings);
        let on_this_host = members_on_this_host(&initial_cluster, &f.name, |host| {
            host_is_local(host, &local_addresses)
        });
        let (raft_cpu, shard_cpus) = place(&cpus, on_this_host, f.raft_cpu, f.shards);
        if !(VALUE_LOG_SEGMENT_BYTES_MIN..=VALUE_LOG_SEGMENT_BYTES_MAX)
            .contains(&f.value_log_segment_bytes)
        {
            return Err(CoreError::Config(format!(
                "--value-log-segment-bytes {} is outside {VALUE_LOG_SEGMENT_BYTES_MIN}..={VALUE_LOG_SEGMENT_BYTES_MAX}",
                f.value_log_segment_bytes
            )));
        }
        if !cpus.contains(&raft_cpu) {
            return Err(CoreError::Config(format!(
                "--raft-cpu {raft_cpu} is not a CPU this process may run on ({cpus:?})"
            )));
        }
        // An empty value means the default, as etcd's flags read it (`--wal-dir ''`).
        let non_empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty()).map(PathBuf::from);
        let data_dir =
            non_empty(&f.data_dir).unwrap_or_else(|| PathBuf::from(format!("{}.keel", f.name)));
        let wal_dir = non_empty(&f.wal_dir).unwrap_or_else(|| data_dir.join("wal"));
        // glommio's Directory::open fails with EBADF on a relative path (the WAL's directory
        // fsync), so resolve both against the working directory once, here.
        let data_dir = absolute_path("data-dir", data_dir)?;
        let wal_dir = absolute_path("wal-dir", wal_dir)?;
        let ignored: [(&'static str, bool); 12] = [
            (
                "experimental-watch-progress-notify-interval",
                f.experimental_watch_progress_notify_interval.is_some(),
            ),
            ("enable-v2", f.enable_v2.is_some()),
            ("enable-pprof", f.enable_pprof.is_some()),
            ("pre-vote", f.pre_vote.is_some()),
            ("logger", f.logger.is_some()),
            ("log-outputs", f.log_outputs.is_some()),
            ("metrics", f.metrics.is_some()),
            ("max-snapshots", f.max_snapshots.is_some()),
            ("max-wals", f.max_wals.is_some()),
            (
                "grpc-keepalive-min-time",
                f.grpc_keepalive_min_time.is_some(),
            ),
            (
                "grpc-keepalive-interval",
                f.grpc_keepalive_interval.is_some(),
            ),
            ("grpc-keepalive-timeout", f.grpc_keepalive_timeout.is_some()),
        ];
        // etcd's NewTokenProvider: the key files are read and checked now, so a bad key stops
        // the start instead of the first login.
        let (auth_token, token_warnings) =
            crate::auth::TokenProvider::parse(&f.auth_token).map_err(CoreError::Config)?;
        warnings.extend(token_warnings);
        if f.auth_token_ttl == 0 {
            return Err(CoreError::Config(
                "--auth-token-ttl must be positive".into(),
            ));
        }
        let auth_token_ttl_ms = f.auth_token_ttl.saturating_mul(1000);
        // etcd falls back to the default cost for one bcrypt refuses.
        let bcrypt_cost = if (4..=31).contains(&f.bcrypt_cost) {
            f.bcrypt_cost
        } else {
            warnings.push(format!(
                "--bcrypt-cost {} is outside 4..=31: using {}",
                f.bcrypt_cost,
                crate::auth::BCRYPT_COST_DEFAULT
            ));
            crate::auth::BCRYPT_COST_DEFAULT
        };
        for (name, given) in ignored {
            if given {
                ignored_flags.push(name);
            }
        }
        Ok(Config {
            name: f.name,
            data_dir,
            wal_dir,
            listen_client,
            listen_client_unix,
            listen_metrics,
            client_tls,
            advertise_client_urls,
            listen_peer,
            peer_tls,
            initial_advertise_peer_urls,
            initial_cluster,
            initial_cluster_state,
            initial_cluster_token: f.initial_cluster_token,
            max_txn_ops: f.max_txn_ops,
            max_request_bytes: f.max_request_bytes,
            quota_backend_bytes,
            max_concurrent_streams,
            max_connections_per_shard: f.max_connections_per_shard,
            max_watchers_per_stream: f.max_watchers_per_stream,
            preface_timeout_ms: f.preface_timeout_ms,
            heartbeat_interval_ms: f.heartbeat_interval_ms,
            election_timeout_ms: f.election_timeout_ms,
            snapshot_count: f.snapshot_count,
            auth_token,
            auth_token_ttl_ms,
            bcrypt_cost,
            log_level,
            auto_compaction,
            shard_cpus,
            raft_cpu,
            host_shards_on_raft_cpu: f
                .host_shards_on_raft_cpu
                .unwrap_or(on_this_host.is_some_and(|(_, count)| count > 1)),
            shard_sched_batch: f.shard_sched_batch.unwrap_or(true),
            members_on_this_host: on_this_host.map_or(1, |(_, count)| count),
            strict_reconfig_check: f.strict_reconfig_check.unwrap_or(true),
            value_log_segment_bytes: f.value_log_segment_bytes,
            value_cache_bytes: f
                .value_cache_bytes
                .unwrap_or_else(crate::value_cache::default_limit_bytes),
            initial_corrupt_check: f.experimental_initial_corrupt_check,
            corrupt_check_interval: (!corrupt_check_interval.is_zero())
                .then_some(corrupt_check_interval),
            ignored_flags,
            warnings,
            config_file: None,
            host_whitelist: crate::host_whitelist::HostWhitelist::parse(
                f.etcd_compat.host_whitelist.as_deref().unwrap_or("*"),
            ),
            cors: cors_origins(f.etcd_compat.cors.as_deref().unwrap_or("*"))?,
        })
    }
}

/// `path` made absolute against the working directory (without resolving symlinks).
fn absolute_path(flag: &str, path: PathBuf) -> Result<PathBuf, CoreError> {
    std::path::absolute(&path)
        .map_err(|e| CoreError::Config(format!("--{flag} {}: {e}", path.display())))
}

/// Shards by default when the process may run on `cpus` CPUs: one per CPU, less the raft
/// core's own from 4 CPUs up. Measured with `bench/scripts/cpu-scaling.sh` on a 16-CPU machine
/// (BENCHMARKS.md, "Shards and the raft core's CPU"): with the raft core alone on its CPU,
/// puts at 1000 clients ran 1.5-1.7x as fast on 4 CPUs, 1.1-1.9x on 8 and 1.0-1.5x on 16, at
/// about the same CPU per put. The price is on 4 CPUs, where serializable ranges ran
/// 0.7-0.8x as fast; on 8 and 16 reads stayed within the run-to-run spread. On 2 CPUs the
/// second shard doubled reads and still raised puts, so small machines keep one per CPU.
pub fn default_shards(cpus: usize) -> usize {
    if cpus >= 4 {
        cpus - 1
    } else {
        cpus.max(1)
    }
}

/// Where a member's raft core and its shards go when the operator names neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub raft_cpu: usize,
    /// The shards by default (`--shards 0`).
    pub shards: usize,
    /// The CPUs the shards go on, in the order `shard_cpus` takes them.
    pub cpus: Vec<usize>,
}

/// The default placement on the process's `cpus`, given which of the members on this host
/// this one is (`on_this_host`: its index among them and their count; see
/// `members_on_this_host`).
///
/// One member per host: the raft core on the last CPU, and `default_shards` of all of them.
/// Several members of one cluster on one host (a local cluster, a test, a benchmark) would
/// each take every CPU, pin their raft cores to the same last one and starve each other. So
/// k members on N CPUs split them:
/// - k <= N: member i takes the i-th of k contiguous slices (sizes differ by at most one)
///   and places itself there as a lone member on a host of that many CPUs would: the raft
///   core on the slice's last CPU, `default_shards` of the slice (beside the raft core on
///   slices of 1-3 CPUs), so no member's threads share another member's CPUs;
/// - k > N: member i pins its raft core to CPU i % N and takes one shard, on that CPU (more
///   with `--shards`, all there), which runs in the raft core's executor (`shard::Host`, on by
///   default for members sharing a host): each member is one thread, and the members spread
///   round the CPUs. With `--host-shards-on-raft-cpu=false` the shard is a second thread on
///   that CPU.
///
/// Measured on 2 CPUs (BENCHMARKS.md, "members on one host place themselves"): three members
/// placed so cost 2-11 % less CPU per put than the same binary under the single-member
/// defaults, with each shard then on the CPU after its raft core's, a thread of its own.
/// With the shard on the raft core's CPU, in its executor, they cost 21-23 % less again
/// (BENCHMARKS.md, "A shard in the raft core's executor"). The 16-CPU slices are not
/// measured; the nearest measured layout (raft cores on CPUs 0-2, 4 shards each, all on CPUs
/// 0-4) cost 0.21-0.22x etcd's CPU per put against 0.27-0.39x with 15 shards each.
pub fn default_placement(cpus: &[usize], on_this_host: Option<(usize, usize)>) -> Placement {
    assert!(!cpus.is_empty(), "the CPU list is never empty");
    let alone = |cpus: &[usize]| Placement {
        raft_cpu: *cpus.last().expect("a slice is never empty"),
        shards: default_shards(cpus.len()),
        cpus: cpus.to_vec(),
    };
    match on_this_host {
        Some((index, count)) if count > 1 => {
            assert!(index < count, "member {index} of {count} on this host");
            let n = cpus.len();
            if count <= n {
                alone(&cpus[index * n / count..(index + 1) * n / count])
            } else {
                let raft_cpu = cpus[index % n];
                Placement {
                    raft_cpu,
                    shards: 1,
                    cpus: vec![raft_cpu],
                }
            }
        }
        _ => alone(cpus),
    }
}

/// The raft core's CPU and each shard's, from the default placement and the operator's
/// `--raft-cpu` and `--shards` (0: not given). Either flag replaces only its own part: a
/// given raft CPU moves the raft core and leaves the shards on the placement's CPUs (where
/// they come to its CPU only when there are more shards than other CPUs), and a given shard
/// count places that many on them.
pub fn place(
    cpus: &[usize],
    on_this_host: Option<(usize, usize)>,
    raft_cpu_flag: Option<usize>,
    shards_flag: usize,
) -> (usize, Vec<usize>) {
    let placement = default_placement(cpus, on_this_host);
    let raft_cpu = raft_cpu_flag.unwrap_or(placement.raft_cpu);
    let shards = if shards_flag == 0 {
        placement.shards
    } else {
        shards_flag
    };
    (raft_cpu, shard_cpus(&placement.cpus, raft_cpu, shards))
}

/// Which of the members of `initial_cluster` have a peer URL on this host, as (this
/// member's index among them, their count), in the flag's order so that every member of
/// a local cluster computes the same numbering. None when this member's own peer URLs are
/// not known to be local: then nothing can be said of the others either.
pub fn members_on_this_host(
    initial_cluster: &[InitialMember],
    name: &str,
    is_local: impl Fn(&str) -> bool,
) -> Option<(usize, usize)> {
    let local = |m: &InitialMember| {
        m.peer_urls
            .iter()
            .any(|url| url_host_port("initial-cluster", url).is_ok_and(|(host, _)| is_local(&host)))
    };
    let mut index = None;
    let mut count = 0;
    for member in initial_cluster.iter().filter(|m| local(m)) {
        if member.name == name {
            index = Some(count);
        }
        count += 1;
    }
    index.map(|index| (index, count))
}

/// Whether `host` (from a URL) names this host, whose interfaces have `addresses` (see
/// `interface_addresses`): `localhost`, a loopback address, or one of them (an IPv4-mapped
/// IPv6 form counts as its IPv4 address). Other names are not resolved: a startup must not
/// wait on DNS for a placement hint. Scoped IPv6 addresses (`fe80::1%eth0`) do not parse
/// and count as elsewhere. Interfaces are listed, not probed with a bind: with
/// `ip_nonlocal_bind` set (hosts that float a virtual IP) every address binds, and every
/// member of a cluster spread over hosts would take itself for one of several sharing this
/// one.
pub fn host_is_local(host: &str, addresses: &[std::net::IpAddr]) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let Ok(ip) = host.parse::<std::net::IpAddr>() else {
        return false;
    };
    let ip = ip.to_canonical();
    ip.is_loopback() || addresses.contains(&ip)
}

/// This host's addresses for placement, or none (with a warning) when they cannot be listed.
/// Placement is only a hint, so the member still starts; the operator hears that members of
/// this host may then share cores.
fn addresses_or_warn(
    listed: std::io::Result<Vec<std::net::IpAddr>>,
    warnings: &mut Vec<String>,
) -> Vec<std::net::IpAddr> {
    listed.unwrap_or_else(|why| {
        warnings.push(format!(
            "cannot list this host's interface addresses ({why}): only localhost and loopback \
             peer URLs count as members on this host; give --raft-cpu and --shards to place \
             members that share it"
        ));
        Vec::new()
    })
}

/// The addresses of this host's interfaces in this network namespace (`getifaddrs`).
pub fn interface_addresses() -> std::io::Result<Vec<std::net::IpAddr>> {
    /// Frees the list however the walk ends.
    struct List(*mut libc::ifaddrs);
    impl Drop for List {
        fn drop(&mut self) {
            // SAFETY: the list came from a successful getifaddrs and is freed once.
            unsafe { libc::freeifaddrs(self.0) };
        }
    }
    let mut addresses = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list it allocates, freed by `List`.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let list = List(head);
    let mut at = list.0;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, not freed yet.
        let entry = unsafe { &*at };
        if !entry.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points to a sockaddr whose family says which one it is; the
            // reads below are unaligned ones, so they assume nothing of how libc stored it.
            let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin: libc::sockaddr_in =
                    unsafe { std::ptr::read_unaligned(entry.ifa_addr.cast()) };
                // `s_addr` holds the address in network order, as its bytes lie in memory.
                addresses.push(std::net::IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6: libc::sockaddr_in6 =
                    unsafe { std::ptr::read_unaligned(entry.ifa_addr.cast()) };
                addresses.push(std::net::IpAddr::from(sin6.sin6_addr.s6_addr));
            }
        }
        at = entry.ifa_next;
    }
    Ok(addresses)
}

/// The CPU of each of `shards` shards (0: `default_shards`), given the process's CPUs and the
/// raft core's: shards take the other CPUs first, in order, and share the raft core's CPU only
/// when there are more shards than other CPUs, then wrap around.
pub fn shard_cpus(cpus: &[usize], raft_cpu: usize, shards: usize) -> Vec<usize> {
    let shards = if shards == 0 {
        default_shards(cpus.len())
    } else {
        shards
    };
    let order: Vec<usize> = cpus
        .iter()
        .copied()
        .filter(|&cpu| cpu != raft_cpu)
        .chain(std::iter::once(raft_cpu))
        .collect();
    (0..shards)
        .map(|shard| order[shard % order.len()])
        .collect()
}

/// Parses an unsigned 32-bit flag value as etcd does (Go's `strconv.ParseUint(s, 0, 32)`):
/// decimal, or `0x`, `0o`, `0b` and leading-`0` octal prefixes, with single `_` between
/// digits (or right after a prefix, which Go counts as a digit).
pub fn parse_go_uint32(text: &str) -> Result<u32, String> {
    let invalid = || format!("invalid value {text:?}: want an unsigned 32-bit integer");
    let lower = text.to_ascii_lowercase();
    let (digits, radix, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (rest, 16, true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (rest, 8, true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (rest, 2, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (&lower[1..], 8, true)
    } else {
        (lower.as_str(), 10, false)
    };
    let underscores_ok =
        !digits.ends_with('_') && !digits.contains("__") && (prefixed || !digits.starts_with('_'));
    // Rust's from_str_radix takes a leading '+'; ParseUint takes no sign at all.
    if digits.is_empty() || !underscores_ok || digits.contains('+') {
        return Err(invalid());
    }
    u32::from_str_radix(&digits.replace('_', ""), radix).map_err(|_| invalid())
}

/// Rewrites Go-style single-dash long flags (`-name`, `-data-dir=x`) to clap's `--name`.
/// A lone `-`, short flags like `-h`, and values that start with a dash but not with a letter
/// (`-1`, `-5m`: flag names never do) stay as they are.
pub fn normalize_go_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let is_go_long = i > 0
                && a.starts_with('-')
                && !a.starts_with("--")
                && a.len() > 2
                && a[1..].starts_with(|c: char| c.is_ascii_alphabetic());
            if is_go_long {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

/// A URL's scheme: how a listener on it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// One client listener: an address, served plaintext or TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientListener {
    pub addr: SocketAddr,
    pub scheme: Scheme,
}

fn split_urls(flag: &str, s: &str) -> Result<Vec<String>, CoreError> {
    let urls: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect();
    if urls.is_empty() {
        return Err(CoreError::Config(format!(
            "--{flag} must name at least one URL"
        )));
    }
    for u in &urls {
        // Client URLs may name unix sockets, as etcd's do; the peer flags refuse them.
        if unix_socket_url(u).is_some() {
            continue;
        }
        url_scheme_host_port(flag, u)?;
    }
    Ok(urls)
}

/// `--cors`: `*`, or URLs with a host and a port, as etcd's flag takes them (it refuses
/// `http://a.example` at startup: "URL address does not have the form \"host:port\"").
fn cors_origins(text: &str) -> Result<crate::host_whitelist::CorsOrigins, CoreError> {
    for origin in text.split(',').map(str::trim) {
        if !origin.is_empty() && origin != "*" {
            url_host_port("cors", origin)?;
        }
    }
    Ok(crate::host_whitelist::CorsOrigins::parse(text))
}

/// Splits a peer URL "http(s)://host:port" into host and port, refusing schemes we cannot
/// serve or dial.
pub fn url_host_port(flag: &str, url: &str) -> Result<(String, u16), CoreError> {
    let (_, host, port) = url_scheme_host_port(flag, url)?;
    Ok((host, port))
}

/// Splits "http(s)://host:port" into scheme, host and port.
pub fn url_scheme_host_port(flag: &str, url: &str) -> Result<(Scheme, String, u16), CoreError> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("http://") {
        (Scheme::Http, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (Scheme::Https, r)
    } else if url.starts_with("unix://") || url.starts_with("unixs://") {
        return Err(CoreError::Config(format!(
            "--{flag}: {url:?}: unix sockets are not supported yet"
        )));
    } else {
        return Err(CoreError::Config(format!(
            "--{flag}: URL scheme must be http or https, got {url:?}"
        )));
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| CoreError::Config(format!("--{flag}: {url:?} has no port")))?;
    let port: u16 = port
        .parse()
        .map_err(|_| CoreError::Config(format!("--{flag}: bad port in {url:?}")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((scheme, host.to_string(), port))
}

fn resolve(flag: &str, url: &str, host: String, port: u16) -> Result<SocketAddr, CoreError> {
    // "localhost" resolves to both families; etcd binds the first, and so do we.
    let host = if host == "localhost" {
        "127.0.0.1".to_string()
    } else {
        host
    };
    (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| CoreError::Config(format!("--{flag}: cannot resolve {url:?}: {e}")))?
        .next()
        .ok_or_else(|| CoreError::Config(format!("--{flag}: {url:?} resolves to nothing")))
}

/// `--listen-client-urls` and `--listen-peer-urls`: http and https listeners may coexist, on
/// different addresses.
/// A unix socket path from `unix://path` or `unixs://path`, as etcd reads it (the URL's host
/// and path together: `unix://localhost:2379` is the file "localhost:2379" in the working
/// directory, `unix:///run/etcd.sock` an absolute path). None for other schemes.
pub fn unix_socket_url(url: &str) -> Option<(Scheme, PathBuf)> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("unix://") {
        (Scheme::Http, r)
    } else if let Some(r) = url.strip_prefix("unixs://") {
        (Scheme::Https, r)
    } else {
        return None;
    };
    Some((scheme, PathBuf::from(rest)))
}

/// A client listener on a unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixListenerSpec {
    pub path: PathBuf,
    pub scheme: Scheme,
}

fn parse_client_listen_urls(
    flag: &str,
    s: &str,
) -> Result<(Vec<ClientListener>, Vec<UnixListenerSpec>), CoreError> {
    let mut listeners: Vec<ClientListener> = Vec::new();
    let mut unix: Vec<UnixListenerSpec> = Vec::new();
    for url in split_urls(flag, s)? {
        if let Some((scheme, path)) = unix_socket_url(&url) {
            if path.as_os_str().is_empty() {
                return Err(CoreError::Config(format!(
                    "--{flag}: {url:?} names no socket"
                )));
            }
            if scheme == Scheme::Https {
                // TLS over a unix socket is not wired yet; plaintext where TLS was asked for
                // would break the URL's promise.
                return Err(CoreError::Config(format!(
                    "--{flag}: {url:?}: unixs:// (TLS on a unix socket) is not supported yet"
                )));
            }
            if !unix.iter().any(|u| u.path == path) {
                unix.push(UnixListenerSpec { path, scheme });
            }
            continue;
        }
        let (scheme, host, port) = url_scheme_host_port(flag, &url)?;
        let addr = resolve(flag, &url, host, port)?;
        match listeners.iter().find(|l| l.addr == addr) {
            Some(l) if l.scheme != scheme => {
                return Err(CoreError::Config(format!(
                    "--{flag}: {addr} is named both as http and as https"
                )));
            }
            Some(_) => {}
            None => listeners.push(ClientListener { addr, scheme }),
        }
    }
    Ok((listeners, unix))
}

/// The client TLS settings from the flags, checked against the listeners: an https listener
/// needs a certificate (files or --auto-tls), and --client-cert-auth needs a CA to verify with.
fn client_tls(
    f: &Flags,
    listeners: &[ClientListener],
    warnings: &mut Vec<String>,
) -> Result<Option<TlsSettings>, CoreError> {
    let path = |v: &Option<String>| {
        v.as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| absolute_path("tls file", PathBuf::from(s)))
            .transpose()
    };
    let cert_file = path(&f.cert_file)?;
    let key_file = path(&f.key_file)?;
    let trusted_ca_file = path(&f.trusted_ca_file)?;
    let crl_file = path(&f.client_crl_file)?;
    let https = listeners.iter().any(|l| l.scheme == Scheme::Https);
    let certs = match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => {
            if f.auto_tls == Some(true) {
                warnings.push("ignoring --auto-tls: --cert-file and --key-file are given".into());
            }
            Some(CertSource::Files {
                cert_file,
                key_file,
            })
        }
        (None, None) if f.auto_tls == Some(true) => Some(CertSource::SelfSigned),
        (None, None) => None,
        _ => {
            return Err(CoreError::Config(
                "--cert-file and --key-file must be given together".into(),
            ))
        }
    };
    let client_auth = if f.client_cert_auth == Some(true) || trusted_ca_file.is_some() {
        // etcd requires and verifies client certificates as soon as a trusted CA is given,
        // with or without --client-cert-auth.
        ClientAuth::Require
    } else {
        ClientAuth::None
    };
    if client_auth == ClientAuth::Require && trusted_ca_file.is_none() {
        return Err(CoreError::Config(
            "--client-cert-auth needs --trusted-ca-file to verify client certificates with".into(),
        ));
    }
    // etcd's AllowedHostname: a verified client certificate must also be valid for this name
    // (its SANs, as Go's VerifyHostname checks them).
    let allowed = match f
        .client_cert_allowed_hostname
        .as_deref()
        .filter(|h| !h.is_empty())
    {
        Some(host) => {
            if client_auth != ClientAuth::Require {
                warnings.push(
                    "--client-cert-allowed-hostname has no effect without --client-cert-auth: no client certificate is asked for".into(),
                );
            }
            Allowed::Hostname(host.to_string())
        }
        None => Allowed::Any,
    };
    let cipher_suites = match f.cipher_suites.as_deref() {
        Some(s) if !s.is_empty() => {
            crate::tls::parse_cipher_suites(s).map_err(CoreError::Config)?
        }
        _ => Vec::new(),
    };
    let Some(certs) = certs else {
        if https {
            return Err(CoreError::Config(
                "an https:// client URL needs TLS key/cert (--cert-file, --key-file) or --auto-tls"
                    .into(),
            ));
        }
        if client_auth == ClientAuth::Require || crl_file.is_some() || allowed != Allowed::Any {
            return Err(CoreError::Config(
                "client certificate flags need TLS: give --cert-file and --key-file (or --auto-tls) and an https:// client URL".into(),
            ));
        }
        return Ok(None);
    };
    if !https {
        // etcd serves plaintext here too, with the same warning.
        warnings.push(
            "client TLS certificates are given but no --listen-client-urls is https://: serving plaintext only".into(),
        );
    }
    Ok(Some(TlsSettings {
        side: Side::Client,
        certs,
        trusted_ca_file,
        client_auth,
        crl_file,
        cipher_suites,
        allowed,
    }))
}

/// The peer TLS settings from the flags (etcd's `--peer-*`), checked against the peer URLs:
/// an https peer listener needs a certificate, and so does dialing an https peer URL (the
/// dialer presents it as its client certificate), which also needs a CA to verify the peer
/// with unless auto TLS skips verification.
fn peer_tls(
    f: &Flags,
    listeners: &[ClientListener],
    initial_cluster: &[InitialMember],
    warnings: &mut Vec<String>,
) -> Result<Option<TlsSettings>, CoreError> {
    let path = |v: &Option<String>| {
        v.as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| absolute_path("peer tls file", PathBuf::from(s)))
            .transpose()
    };
    let text = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(String::from);
    let trusted_ca_file = path(&f.peer_trusted_ca_file)?;
    let crl_file = path(&f.peer_crl_file)?;
    let listens_https = listeners.iter().any(|l| l.scheme == Scheme::Https);
    let dials_https = initial_cluster
        .iter()
        .flat_map(|m| &m.peer_urls)
        .any(|u| u.starts_with("https://"));
    let certs = match (path(&f.peer_cert_file)?, path(&f.peer_key_file)?) {
        (Some(cert_file), Some(key_file)) => {
            if f.peer_auto_tls == Some(true) {
                warnings.push("ignoring peer auto TLS since certs given".into());
            }
            Some(CertSource::Files {
                cert_file,
                key_file,
            })
        }
        (None, None) if f.peer_auto_tls == Some(true) => Some(CertSource::SelfSigned),
        (None, None) => None,
        _ => {
            return Err(CoreError::Config(
                "--peer-cert-file and --peer-key-file must be given together".into(),
            ))
        }
    };
    // As on the client port, a trusted CA alone already requires peers' certificates.
    let client_auth = if f.peer_client_cert_auth == Some(true) || trusted_ca_file.is_some() {
        ClientAuth::Require
    } else {
        ClientAuth::None
    };
    if client_auth == ClientAuth::Require && trusted_ca_file.is_none() {
        return Err(CoreError::Config(
            "--peer-client-cert-auth needs --peer-trusted-ca-file to verify peer certificates with"
                .into(),
        ));
    }
    let allowed = match (
        text(&f.peer_cert_allowed_cn),
        text(&f.peer_cert_allowed_hostname),
    ) {
        (Some(cn), Some(host)) => {
            return Err(CoreError::Config(format!(
            "AllowedCN and AllowedHostname are mutually exclusive (cn={cn:?}, hostname={host:?})"
        )))
        }
        (Some(cn), None) => Allowed::CommonName(cn),
        (None, Some(host)) => Allowed::Hostname(host),
        (None, None) => Allowed::Any,
    };
    let cipher_suites = match f.cipher_suites.as_deref() {
        Some(s) if !s.is_empty() => {
            crate::tls::parse_cipher_suites(s).map_err(CoreError::Config)?
        }
        _ => Vec::new(),
    };
    let Some(certs) = certs else {
        if listens_https || dials_https {
            return Err(CoreError::Config(
                "an https:// peer URL needs peer TLS key/cert (--peer-cert-file, --peer-key-file) or --peer-auto-tls".into(),
            ));
        }
        if client_auth == ClientAuth::Require || crl_file.is_some() || allowed != Allowed::Any {
            return Err(CoreError::Config(
                "peer certificate flags need peer TLS: give --peer-cert-file and --peer-key-file (or --peer-auto-tls) and https:// peer URLs".into(),
            ));
        }
        return Ok(None);
    };
    if dials_https && certs != CertSource::SelfSigned && trusted_ca_file.is_none() {
        return Err(CoreError::Config(
            "dialing https:// peer URLs needs --peer-trusted-ca-file to verify the peers with (Keel does not fall back to the system's roots)".into(),
        ));
    }
    if !listens_https {
        // etcd ignores the files for an http peer listener, with the same warning.
        warnings.push(
            "peer TLS certificates are given but no --listen-peer-urls is https://: the peer listener serves plaintext".into(),
        );
    }
    Ok(Some(TlsSettings {
        side: Side::Peer,
        certs,
        trusted_ca_file,
        client_auth,
        crl_file,
        cipher_suites,
        allowed,
    }))
}

/// Parses "n1=http://a:2380,n2=http://b:2380,n1=http://c:2380" (a name may repeat to give
/// several URLs, as in etcd).
pub fn parse_initial_cluster(s: &str) -> Result<Vec<InitialMember>, CoreError> {
    let mut members: Vec<InitialMember> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, url) = part.split_once('=').ok_or_else(|| {
            CoreError::Config(format!("--initial-cluster: {part:?} is not name=url"))
        })?;
        url_host_port("initial-cluster", url)?;
        match members.iter_mut().find(|m| m.name == name) {
            Some(m) => m.peer_urls.push(url.to_string()),
            None => members.push(InitialMember {
                name: name.to_string(),
                peer_urls: vec![url.to_string()],
            }),
        }
    }
    if members.is_empty() {
        return Err(CoreError::Config("--initial-cluster is empty".into()));
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_leave_the_raft_core_its_cpu_from_four_cpus_up() {
        assert_eq!(default_shards(1), 1);
        assert_eq!(default_shards(2), 2);
        assert_eq!(default_shards(3), 3);
        assert_eq!(default_shards(4), 3);
        assert_eq!(default_shards(16), 15);
        // Defaults: the raft core on the last CPU, shards on the others.
        assert_eq!(shard_cpus(&[0, 1, 2, 3], 3, 0), vec![0, 1, 2]);
        assert_eq!(shard_cpus(&[0, 1], 1, 0), vec![0, 1]);
        // A cpuset that does not start at 0 (taskset -c 4-7): its own numbers.
        assert_eq!(shard_cpus(&[4, 5, 6, 7], 7, 0), vec![4, 5, 6]);
        // The raft core elsewhere: shards still take the other CPUs first.
        assert_eq!(shard_cpus(&[0, 1, 2, 3], 0, 0), vec![1, 2, 3]);
        // More shards than CPUs: the raft core's CPU last, then around again.
        assert_eq!(shard_cpus(&[0, 1, 2], 0, 5), vec![1, 2, 0, 1, 2]);
        assert_eq!(shard_cpus(&[0, 1, 2, 3], 3, 1), vec![0]);
    }

    fn initial_member(name: &str, urls: &[&str]) -> InitialMember {
        InitialMember {
            name: name.to_string(),
            peer_urls: urls.iter().map(|u| u.to_string()).collect(),
        }
    }

    #[test]
    fn members_on_one_host_are_numbered_in_the_flags_order() {
        let cluster = [
            initial_member("a", &["http://10.0.0.1:2380"]),
            initial_member("b", &["http://127.0.0.1:2381"]),
            initial_member("c", &["http://10.0.0.3:2380", "http://localhost:2382"]),
            initial_member("d", &["http://127.0.0.1:2383"]),
        ];
        // Only loopback names are local here: a, whose one URL is remote, is not counted.
        let is_local = |host: &str| host == "127.0.0.1" || host == "localhost";
        assert_eq!(members_on_this_host(&cluster, "b", is_local), Some((0, 3)));
        assert_eq!(members_on_this_host(&cluster, "c", is_local), Some((1, 3)));
        assert_eq!(members_on_this_host(&cluster, "d", is_local), Some((2, 3)));
        // A member whose own URLs are not local cannot say who shares its host.
        assert_eq!(members_on_this_host(&cluster, "a", is_local), None);
        // Alone on its host.
        let alone = [
            initial_member("a", &["http://127.0.0.1:2380"]),
            initial_member("b", &["http://10.0.0.2:2380"]),
        ];
        assert_eq!(members_on_this_host(&alone, "a", is_local), Some((0, 1)));
    }

    #[test]
    fn unlisted_interfaces_leave_only_loopback_local_and_warn() {
        let mut warnings = Vec::new();
        let listed = addresses_or_warn(
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            &mut warnings,
        );
        assert!(listed.is_empty());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("cannot list this host's interface addresses")
                && warnings[0].contains("--raft-cpu and --shards"),
            "{warnings:?}"
        );
        assert!(host_is_local("127.0.0.1", &listed));
        assert!(!host_is_local("10.0.0.2", &listed));
        let mut none = Vec::new();
        let own = addresses_or_warn(Ok(vec![[10, 0, 0, 2].into()]), &mut none);
        assert!(none.is_empty(), "listed addresses warn of nothing");
        assert!(host_is_local("10.0.0.2", &own));
    }

    #[test]
    fn local_hosts_are_loopback_and_this_hosts_addresses() {
        let own = interface_addresses().expect("this host's interfaces can be listed");
        // Read in the right byte order (127.0.0.1, not 1.0.0.127): `lo` is always listed.
        assert!(
            own.contains(&std::net::IpAddr::from([127, 0, 0, 1])),
            "{own:?}"
        );
        let local = |host: &str| host_is_local(host, &own);
        // The address this host would send from: one of its interfaces' (a UDP connect sends
        // nothing). A host with no route out has none to check.
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        if probe.connect("192.0.2.1:9").is_ok() {
            let out = probe.local_addr().unwrap().ip();
            assert!(local(&out.to_string()), "{out} is this host's");
            assert!(local(&format!("::ffff:{out}")), "its IPv4-mapped form too");
        }
        assert!(local("127.0.0.1"));
        assert!(local("127.0.0.2"));
        assert!(local("::1"));
        assert!(local("::ffff:127.0.0.1"));
        assert!(local("LocalHost"));
        // TEST-NET-1 (RFC 5737) is no interface's address; the unspecified address names none.
        assert!(!local("192.0.2.1"));
        assert!(!local("0.0.0.0"));
        // Names other than localhost are not resolved; scoped addresses do not parse.
        assert!(!local("example.com"));
        assert!(!local("fe80::1%eth0"));
        // Given addresses are what counts, not whether a bind would succeed.
        let listed = [std::net::IpAddr::from([192, 0, 2, 7])];
        assert!(host_is_local("192.0.2.7", &listed));
        assert!(!host_is_local("192.0.2.8", &listed));
    }

    #[test]
    fn members_sharing_a_host_split_its_cpus() {
        let alone = Placement {
            raft_cpu: 1,
            shards: 2,
            cpus: vec![0, 1],
        };
        assert_eq!(default_placement(&[0, 1], None), alone);
        assert_eq!(default_placement(&[0, 1], Some((0, 1))), alone);
        // More members than CPUs: raft cores round the CPUs, each member's shard on its raft
        // core's CPU (in its executor).
        let round = |n: usize, k: usize| -> Vec<(usize, Vec<usize>)> {
            let cpus: Vec<usize> = (0..n).collect();
            (0..k)
                .map(|i| place(&cpus, Some((i, k)), None, 0))
                .collect()
        };
        assert_eq!(
            round(2, 3),
            vec![(0, vec![0]), (1, vec![1]), (0, vec![0])],
            "three members on 2 CPUs, as measured"
        );
        assert_eq!(
            round(3, 4),
            vec![(0, vec![0]), (1, vec![1]), (2, vec![2]), (0, vec![0])]
        );
        assert_eq!(round(3, 5)[4], (1, vec![1]));
        // --shards on such a member: more shards go round from the raft core's CPU.
        assert_eq!(place(&[0, 1], Some((1, 3)), None, 2), (1, vec![1, 1]));
        // Three members on 16 CPUs: slices of 5, 5 and 6, each placed as a host of its size.
        let cpus: Vec<usize> = (0..16).collect();
        let slices: Vec<Placement> = (0..3)
            .map(|i| default_placement(&cpus, Some((i, 3))))
            .collect();
        assert_eq!(
            slices
                .iter()
                .map(|p| (p.raft_cpu, p.shards))
                .collect::<Vec<_>>(),
            vec![(4, 4), (9, 4), (15, 5)]
        );
        assert_eq!(slices[1].cpus, vec![5, 6, 7, 8, 9]);
        // Two members on 2 CPUs: one CPU each, the shard beside the raft core.
        assert_eq!(round(2, 2), vec![(0, vec![0]), (1, vec![1])]);
        // A cpuset's own CPU numbers.
        let set = default_placement(&[4, 5, 6, 7], Some((1, 2)));
        assert_eq!((set.raft_cpu, set.shards, set.cpus), (7, 2, vec![6, 7]));
    }

    /// For every host size up to 64 CPUs and every count of members that fits: the slices
    /// are contiguous, never empty, within one CPU of each other in size, and every thread of
    /// every member is on a CPU of its own slice, so each CPU serves one member.
    #[test]
    fn slices_partition_the_cpus() {
        for n in 1..=64usize {
            let cpus: Vec<usize> = (100..100 + n).collect();
            for k in 2..=n {
                let mut next = 100;
                let mut sizes = Vec::new();
                for i in 0..k {
                    let p = default_placement(&cpus, Some((i, k)));
                    assert_eq!(p.cpus[0], next, "n={n} k={k} i={i}: contiguous");
                    assert!(!p.cpus.is_empty());
                    next = p.cpus[p.cpus.len() - 1] + 1;
                    sizes.push(p.cpus.len());
                    let (raft, shards) = place(&cpus, Some((i, k)), None, 0);
                    assert!(
                        p.cpus.contains(&raft),
                        "n={n} k={k} i={i}: raft core inside"
                    );
                    assert!(
                        shards.iter().all(|cpu| p.cpus.contains(cpu)),
                        "n={n} k={k} i={i}: shards inside {shards:?}"
                    );
                }
                assert_eq!(next, 100 + n, "n={n} k={k}: every CPU used");
                let (low, high) = (sizes.iter().min(), sizes.iter().max());
                assert!(high.unwrap() - low.unwrap() <= 1, "n={n} k={k}: {sizes:?}");
            }
        }
    }

    /// Each flag replaces only its own part of the placement, on a made-up 16-CPU host.
    #[test]
    fn flags_replace_their_own_part_of_the_placement() {
        let cpus: Vec<usize> = (0..16).collect();
        let one = Some((1, 3));
        // No flags: member 1's slice, CPUs 5-9.
        assert_eq!(place(&cpus, one, None, 0), (9, vec![5, 6, 7, 8]));
        // --shards only: that many, still on the slice (round it once more past 5).
        assert_eq!(place(&cpus, one, None, 2), (9, vec![5, 6]));
        assert_eq!(place(&cpus, one, None, 6), (9, vec![5, 6, 7, 8, 9, 5]));
        // --raft-cpu only: the raft core moves; the shards keep the slice, all of it now.
        assert_eq!(place(&cpus, one, Some(1), 0), (1, vec![5, 6, 7, 8]));
        assert_eq!(place(&cpus, one, Some(7), 0), (7, vec![5, 6, 8, 9]));
        // Both.
        assert_eq!(place(&cpus, one, Some(0), 3), (0, vec![5, 6, 7]));
        // Alone on the host: the single-member defaults, and the flags as before.
        assert_eq!(place(&cpus, None, None, 0).1.len(), 15);
        assert_eq!(place(&cpus, None, Some(0), 2), (0, vec![1, 2]));
    }

    #[test]
    fn a_local_cluster_is_placed_without_flags_and_flags_still_win() {
        let cpus = crate::rt::process_cpu_list();
        let cluster = "n0=http://127.0.0.1:2380,n1=http://127.0.0.1:2382,n2=http://127.0.0.1:2384";
        let as_n1 = |more: &[&str]| {
            let mut args = vec![
                "--name",
                "n1",
                "--initial-cluster",
                cluster,
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2382",
            ];
            args.extend_from_slice(more);
            parse(&args).unwrap()
        };
        let c = as_n1(&[]);
        assert_eq!(c.members_on_this_host, 3);
        assert!(
            c.host_shards_on_raft_cpu,
            "a local cluster's shards are hosted"
        );
        assert_eq!(
            (c.raft_cpu, c.shard_cpus),
            place(&cpus, Some((1, 3)), None, 0)
        );
        let threads = as_n1(&["--host-shards-on-raft-cpu=false"]);
        assert!(!threads.host_shards_on_raft_cpu);
        let raft_cpu = cpus[0].to_string();
        let flagged = as_n1(&["--raft-cpu", &raft_cpu, "--shards", "3"]);
        assert_eq!(flagged.raft_cpu, cpus[0]);
        assert_eq!(flagged.shard_cpus.len(), 3);
        // One member: the single-member defaults.
        let single = parse(&[]).unwrap();
        assert_eq!(single.members_on_this_host, 1);
        assert!(
            !single.host_shards_on_raft_cpu,
            "a lone member keeps shard threads"
        );
        assert!(single.shard_sched_batch);
        assert!(
            !parse(&["--shard-sched-batch=false"])
                .unwrap()
                .shard_sched_batch
        );
        assert!(
            parse(&["--host-shards-on-raft-cpu"])
                .unwrap()
                .host_shards_on_raft_cpu
        );
        assert_eq!(single.raft_cpu, *cpus.last().unwrap());
        assert_eq!(single.shard_cpus.len(), default_shards(cpus.len()));
    }

    #[test]
    fn a_raft_cpu_outside_the_process_set_is_refused() {
        let cpus = crate::rt::process_cpu_list();
        let outside = cpus.last().unwrap() + 1;
        let Err(err) = parse(&["--raft-cpu", &outside.to_string()]) else {
            panic!("a CPU the process may not run on was accepted");
        };
        assert!(
            err.to_string().contains(&format!(
                "--raft-cpu {outside} is not a CPU this process may run on"
            )),
            "{err}"
        );
        let inside = parse(&["--raft-cpu", &cpus[0].to_string()]).expect("valid");
        assert_eq!(inside.raft_cpu, cpus[0]);
        assert!(inside.shard_cpus.iter().all(|cpu| cpus.contains(cpu)));
    }

    fn parse(args: &[&str]) -> Result<Config, CoreError> {
        let argv = normalize_go_args(
            std::iter::once("keel".to_string()).chain(args.iter().map(|s| s.to_string())),
        );
        Config::from_flags(
            Flags::try_parse_from(argv).map_err(|e| CoreError::Config(e.to_string()))?,
        )
    }

    #[test]
    fn no_flags_serves_loopback_2379_like_etcd() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!(
            c.listen_client,
            vec![ClientListener {
                addr: "127.0.0.1:2379".parse::<SocketAddr>().expect("addr"),
                scheme: Scheme::Http
            }]
        );
        assert_eq!(c.client_tls, None);
        let cwd = std::env::current_dir().expect("the test has a working directory");
        assert_eq!(c.data_dir, cwd.join("default.keel"));
        assert_eq!(c.wal_dir, cwd.join("default.keel").join("wal"));
        assert_eq!(c.initial_cluster.len(), 1);
        assert_eq!(c.max_txn_ops, 128);
        assert_eq!(c.max_request_bytes, 1_572_864);
        assert_eq!(c.quota_backend_bytes, 2 * 1024 * 1024 * 1024);
    }

    #[test]
    fn go_style_single_dash_flags_are_accepted() {
        let c = parse(&["-name", "n1", "-data-dir=/tmp/x", "--max-txn-ops=7"]).expect("valid");
        assert_eq!(c.name, "n1");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.max_txn_ops, 7);
    }

    #[test]
    fn initial_cluster_must_name_this_member() {
        let err = parse(&[
            "--name",
            "a",
            "--initial-cluster",
            "b=http://127.0.0.1:2380",
        ])
        .expect_err("must fail");
        assert!(
            err.to_string().contains("couldn't find local name"),
            "{err}"
        );
        let c = parse(&[
            "--name",
            "a",
            "--initial-cluster",
            "a=http://127.0.0.1:2380,b=http://127.0.0.1:2480,a=http://127.0.0.2:2380",
        ])
        .expect("valid");
        assert_eq!(c.initial_cluster.len(), 2);
        assert_eq!(c.initial_cluster[0].peer_urls.len(), 2);
    }

    #[test]
    fn https_listeners_need_a_certificate_and_coexist_with_http() {
        let err = parse(&["--listen-client-urls", "https://127.0.0.1:2379"]).expect_err("no cert");
        assert!(err.to_string().contains("--cert-file"), "{err}");
        let c = parse(&[
            "--listen-client-urls",
            "https://127.0.0.1:2379,http://127.0.0.1:2380",
            "--auto-tls",
        ])
        .expect("auto-tls gives the https listener a certificate");
        assert_eq!(c.listen_client[0].scheme, Scheme::Https);
        assert_eq!(c.listen_client[1].scheme, Scheme::Http);
        let tls = c.client_tls.expect("TLS settings");
        assert_eq!(tls.certs, CertSource::SelfSigned);
        assert_eq!(tls.client_auth, ClientAuth::None);
        assert!(parse(&[
            "--listen-client-urls",
            "https://127.0.0.1:2379,http://127.0.0.1:2379",
            "--auto-tls"
        ])
        .is_err());
        assert!(
            parse(&["--cert-file", "c.pem"]).is_err(),
            "a cert without a key"
        );
        let c = parse(&[
            "--listen-client-urls",
            "https://127.0.0.1:2379",
            "--cert-file",
            "c.pem",
            "--key-file",
            "k.pem",
            "--trusted-ca-file",
            "ca.pem",
        ])
        .expect("valid");
        let tls = c.client_tls.expect("TLS settings");
        assert_eq!(
            tls.client_auth,
            ClientAuth::Require,
            "a trusted CA alone requires client certificates, as in etcd"
        );
        assert!(tls.trusted_ca_file.expect("CA").is_absolute());
        let err = parse(&[
            "--auto-tls",
            "--listen-client-urls",
            "https://127.0.0.1:2379",
            "--client-cert-auth",
        ])
        .expect_err("no CA to verify with");
        assert!(err.to_string().contains("--trusted-ca-file"), "{err}");
        assert!(parse(&["--auto-tls", "--cipher-suites", "TLS_RSA_WITH_RC4_128_SHA"]).is_err());
    }

    #[test]
    fn peer_tls_needs_certificates_and_a_ca_to_dial_with() {
        let https_peer = [
            "--listen-peer-urls",
            "https://127.0.0.1:2380",
            "--initial-advertise-peer-urls",
            "https://127.0.0.1:2380",
        ];
        let with = |extra: &[&str]| {
            let args: Vec<&str> = https_peer.iter().chain(extra).copied().collect();
            parse(&args)
        };
        assert!(
            with(&[]).is_err(),
            "an https peer URL without a certificate"
        );
        let files = ["--peer-cert-file", "p.pem", "--peer-key-file", "p.key"];
        assert!(
            with(&files).is_err(),
            "dialing https without a CA to verify"
        );
        let mut args = files.to_vec();
        args.extend([
            "--peer-trusted-ca-file",
            "ca.pem",
            "--peer-cert-allowed-cn",
            "n1",
        ]);
        let c = with(&args).expect("mTLS peers");
        assert_eq!(c.listen_peer[0].scheme, Scheme::Https);
        let tls = c.peer_tls.expect("peer TLS");
        assert_eq!(tls.side, Side::Peer);
        assert_eq!(tls.client_auth, ClientAuth::Require);
        assert_eq!(tls.allowed, Allowed::CommonName("n1".into()));
        let auto = with(&["--peer-auto-tls"]).expect("auto TLS needs no CA");
        assert_eq!(
            auto.peer_tls.expect("peer TLS").certs,
            CertSource::SelfSigned
        );
        args.extend(["--peer-cert-allowed-hostname", "x"]);
        assert!(with(&args).is_err(), "CN and hostname are exclusive");
        for refused in [
            &["--peer-client-cert-auth"][..],
            &["--peer-trusted-ca-file", "ca.pem"],
            &["--peer-cert-allowed-cn", "x"],
            // Without client TLS there is no client certificate to check.
            &["--client-cert-allowed-hostname", "x"],
        ] {
            assert!(parse(refused).is_err(), "{refused:?}");
        }
        let plain = parse(&["--peer-auto-tls"]).expect("plaintext peers with auto TLS");
        assert!(plain
            .warnings
            .iter()
            .any(|w| w.contains("serves plaintext")));
    }

    #[test]
    fn ignored_etcd_flags_are_accepted_and_reported() {
        let c = parse(&[
            "--enable-v2=false",
            "--logger",
            "zap",
            "--metrics=extensive",
        ])
        .expect("valid");
        assert_eq!(c.ignored_flags, vec!["enable-v2", "logger", "metrics"]);
    }

    #[test]
    fn limits_have_defaults_and_follow_their_flags() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!(c.max_concurrent_streams, DEFAULT_MAX_CONCURRENT_STREAMS);
        assert_eq!(
            c.max_connections_per_shard,
            DEFAULT_MAX_CONNECTIONS_PER_SHARD
        );
        assert_eq!(c.max_watchers_per_stream, DEFAULT_MAX_WATCHERS_PER_STREAM);
        assert_eq!(c.preface_timeout_ms, 10_000);
        let c = parse(&[
            "--max-concurrent-streams=7",
            "--max-connections-per-shard",
            "3",
            "-max-watchers-per-stream=2",
            "--preface-timeout-ms=250",
        ])
        .expect("valid");
        assert_eq!(c.max_concurrent_streams, 7);
        assert_eq!(c.max_connections_per_shard, 3);
        assert_eq!(c.max_watchers_per_stream, 2);
        assert_eq!(c.preface_timeout_ms, 250);
        // etcd's default, spelled out, and 0, which grpc-go reads as "no limit".
        let c = parse(&["--max-concurrent-streams", "4294967295"]).expect("valid");
        assert_eq!(c.max_concurrent_streams, u32::MAX);
        let c = parse(&["--max-concurrent-streams", "0"]).expect("valid");
        assert_eq!(c.max_concurrent_streams, u32::MAX);
        assert!(parse(&["--max-concurrent-streams", "4294967296"]).is_err());
        assert!(parse(&["--max-concurrent-streams", "-1"]).is_err());
        assert!(parse(&["--max-connections-per-shard", "0"]).is_err());
        assert!(parse(&["--preface-timeout-ms", "0"]).is_err());
    }

    #[test]
    fn uint32_flags_parse_like_go() {
        for (text, want) in [
            ("0", 0),
            ("100", 100),
            ("0x10", 16),
            ("0X1f", 31),
            ("010", 8),
            ("0o10", 8),
            ("0b101", 5),
            ("0x_ff", 255),
            ("1_000", 1000),
            ("0_10", 8),
            ("4294967295", u32::MAX),
        ] {
            assert_eq!(parse_go_uint32(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "x",
            "_1",
            "1_",
            "1__0",
            "0x_",
            "+1",
            "-1",
            "0x",
            "4294967296",
            "0b2",
            "09",
        ] {
            assert!(parse_go_uint32(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn auto_compaction_flags_are_read_as_etcd_reads_them() {
        assert_eq!(parse(&[]).expect("defaults").auto_compaction, None);
        let c = parse(&["--auto-compaction-retention", "2s"]).expect("valid");
        assert_eq!(
            c.auto_compaction,
            Some(Retention::Periodic { period_ms: 2000 })
        );
        let c = parse(&["--auto-compaction-retention=1"]).expect("valid");
        assert_eq!(
            c.auto_compaction,
            Some(Retention::Periodic {
                period_ms: 3_600_000
            })
        );
        let c = parse(&[
            "-auto-compaction-mode",
            "revision",
            "-auto-compaction-retention",
            "1000",
        ])
        .expect("valid");
        assert_eq!(
            c.auto_compaction,
            Some(Retention::Revision {
                revisions: 1000,
                check_interval_ms: 5 * 60 * 1000
            })
        );
        let c = parse(&[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "10",
            "--revision-compaction-interval-ms",
            "500",
        ])
        .expect("valid");
        assert_eq!(
            c.auto_compaction,
            Some(Retention::Revision {
                revisions: 10,
                check_interval_ms: 500
            })
        );
        let err = parse(&["--auto-compaction-retention", "1d"]).expect_err("refused");
        assert!(
            err.to_string().contains(
                "error parsing CompactionRetention: time: unknown unit \"d\" in duration \"1d\""
            ),
            "{err}"
        );
        let err = parse(&["--auto-compaction-mode", "hourly"]).expect_err("refused");
        assert!(
            err.to_string()
                .contains("unknown auto-compaction-mode \"hourly\""),
            "{err}"
        );
        assert!(parse(&["--revision-compaction-interval-ms", "0"]).is_err());
        // A dash-led value reaches etcd's parser, as with Go's flag package.
        let err = parse(&["--auto-compaction-retention", "-1"]).expect_err("refused");
        assert!(
            err.to_string()
                .contains("time: missing unit in duration \"-1\""),
            "{err}"
        );
        let err = parse(&["-auto-compaction-retention", "-5m"]).expect_err("refused");
        assert!(err.to_string().contains("negative"), "{err}");
    }

    #[test]
    fn election_timeout_must_cover_five_heartbeats() {
        assert!(parse(&["--heartbeat-interval", "100", "--election-timeout", "300"]).is_err());
    }
}
