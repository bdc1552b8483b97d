//! `compare`: etcd and Keel side by side on the DESIGN.md "Targets" workloads.
//!
//! Each repeat measures the disk floor, then starts each system in turn (the order alternates
//! between repeats so neither always runs on a warmer machine) with a fresh data directory on
//! free ports, runs every workload against it, and stops it. The table reports medians of the
//! repeats and Keel/etcd ratios. "Keel" is any binary that accepts etcd's flags, so the whole
//! path can be exercised with etcd standing in for Keel; a missing or failing Keel binary is
//! reported and the etcd numbers are still printed.
//!
//! After its single-member workloads, each system also runs as a three-member cluster on
//! 127.0.0.1 (each member with its own data directory and ports, started with etcd's
//! `--initial-cluster` flags), and the put workload spreads its connections over all three
//! client endpoints. The CPU of the three processes is summed per put: issue #15's
//! three-member target.

use std::ffi::CString;
use std::fmt::Write as _;
use std::fs::File;
use std::future::Future;
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use hdrhistogram::Histogram;
use keel_proto::etcdserverpb::{PutRequest, PutResponse, RangeRequest};
use serde::{Deserialize, Serialize};

use crate::client::{self, Caller, Connection};
use crate::report::{self, median, CpuTimes, Percentiles, ServerCpu, Summary};
use crate::workloads::{
    self, LeaseKeepaliveArgs, PutArgs, RangeArgs, Target, TxnPutArgs, WatchLatencyArgs,
};
use crate::Error;

/// The floor's write unit: one 4 KiB block, the WAL's smallest aligned append.
pub const FLOOR_BLOCK_BYTES: usize = 4096;
/// The floor file is preallocated and written once, so the loop rewrites allocated blocks.
pub const FLOOR_FILE_BYTES: usize = 4 << 20;
// Masks instead of `%`: the block size is a power of two, and this keeps clippy and MSRV 1.85 happy.
const _: () = assert!(FLOOR_BLOCK_BYTES.is_power_of_two());
const _: () = assert!(FLOOR_FILE_BYTES & (FLOOR_BLOCK_BYTES - 1) == 0);
const _: () = assert!(
    FLOOR_BLOCK_BYTES & 511 == 0,
    "O_DIRECT needs sector alignment"
);

/// Key and value the range rows read.
const RANGE_KEY: &str = "keel-bench-range";
const VALUE_BYTES: usize = 256;
/// Bounded wait for a stopped server before SIGKILL.
const STOP_TIMEOUT_MS: u64 = 10_000;
const LOG_TAIL_BYTES: usize = 2000;

#[derive(Clone, Debug, clap::Args)]
pub struct CompareArgs {
    /// The etcd binary (Debian's etcd 3.4)
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// The Keel binary (default: `keel` beside this binary); any binary taking etcd's flags works
    #[arg(long)]
    pub keel_bin: Option<PathBuf>,
    /// Name printed for the second system (e.g. "etcd-b" when --keel-bin is etcd itself)
    #[arg(long, default_value = "keel")]
    pub keel_label: String,
    /// Rounds; each round runs both systems, alternating which goes first
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Directory for compare.json and compare.svg
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Directory for data dirs and the disk-floor file (default: the system temp dir)
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Puts in the throughput row
    #[arg(long, default_value_t = 100_000)]
    pub put_total: u64,
    /// Clients in the put throughput row
    #[arg(long, default_value_t = 1000)]
    pub put_clients: usize,
    /// Connections in the put throughput row
    #[arg(long, default_value_t = 100)]
    pub put_conns: usize,
    /// Puts in the one-client latency row
    #[arg(long, default_value_t = 2000)]
    pub latency_total: u64,
    /// Reads in each range row
    #[arg(long, default_value_t = 100_000)]
    pub range_total: u64,
    /// Clients in the range rows
    #[arg(long, default_value_t = 100)]
    pub range_clients: usize,
    /// Connections in the range rows
    #[arg(long, default_value_t = 10)]
    pub range_conns: usize,
    /// Keys stored (256-byte values) before reading RSS for the memory row
    #[arg(long, default_value_t = 100_000)]
    pub mem_keys: usize,
    /// Watch streams in the watch row
    #[arg(long, default_value_t = 100)]
    pub watch_streams: usize,
    /// Watchers per stream in the watch row (default 100 x 100 = 10,000 watchers)
    #[arg(long, default_value_t = 100)]
    pub watch_watchers_per_stream: usize,
    /// Watchers in the watch row watch a prefix of the put key (a range) instead of the key
    #[arg(long)]
    pub watch_prefix: bool,
    /// Puts in the watch row
    #[arg(long, default_value_t = 100)]
    pub watch_puts: u64,
    /// Puts per second in the watch row
    #[arg(long, default_value_t = 10.0)]
    pub watch_put_rate: f64,
    /// Txns (one Put, no compares) in the txn-put row, by the put row's clients and connections
    #[arg(long, default_value_t = 100_000)]
    pub txn_put_total: u64,
    /// LeaseKeepAlive messages in the keep-alive row, by the range rows' clients and connections
    /// (one granted lease and one keep-alive stream per client)
    #[arg(long, default_value_t = 100_000)]
    pub keepalive_total: u64,
    /// 4 KiB write + fdatasync operations for the disk floor
    #[arg(long, default_value_t = 1000)]
    pub floor_ops: u64,
    /// Puts in the three-member row (the put row's clients and connections, spread over the
    /// three members' endpoints); 0 leaves the three-member cluster out
    #[arg(long, default_value_t = 100_000)]
    pub cluster_put_total: u64,
    /// How long a server may take to answer its first Range
    #[arg(long, default_value_t = 30)]
    pub start_timeout_s: u64,
}

/// Memory row: resident bytes of the server process per stored key.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryReport {
    pub keys: usize,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    /// (after - before) / keys: what storing the keys cost, without the empty server's baseline.
    pub bytes_per_key: f64,
}

/// Every workload's result against one server in one repeat.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SystemRun {
    pub system: String,
    pub repeat: u32,
    pub memory: MemoryReport,
    pub put_throughput: Summary,
    pub put_latency: Summary,
    pub range_serializable: Summary,
    pub range_linearizable: Summary,
    pub watch: Summary,
    /// Absent from results written before these rows existed, hence the defaults.
    #[serde(default)]
    pub txn_put: Summary,
    #[serde(default)]
    pub lease_keepalive: Summary,
    /// The put workload against a three-member cluster of the same binary; absent when
    /// `--cluster-put-total` is 0 and from results written before the row existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_put: Option<ClusterPut>,
}

/// The put workload against a cluster: its summary carries the members' CPU summed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClusterPut {
    pub members: usize,
    /// `server_cpu` is the members' user + system time together, per successful put.
    pub put: Summary,
    /// Each member's own CPU per put, in member order (n0, n1, n2): the leader's share and
    /// the followers' can be told apart.
    pub member_us_per_put: Vec<f64>,
}

/// The disk floor of one repeat, and the loopback network's beside it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FloorReport {
    pub repeat: u32,
    pub ops: u64,
    pub latency_us: Percentiles,
    /// One round trip of a put-sized message over loopback TCP between two threads (`ops` of
    /// them): a reference for what a one-client put pays beside its sync. Absent in results
    /// from before it was measured.
    #[serde(default)]
    pub loopback_rtt_us: Option<Percentiles>,
    /// One client's puts (`--latency-total` of them) against `reference::ReferenceServer`:
    /// this load generator and the loopback network, HTTP/2, and the floor's own write and
    /// fdatasync per put, with no other server work. Absent in results from before it was
    /// measured.
    #[serde(default)]
    pub reference_put_us: Option<Percentiles>,
}

/// One line of the ratio table; values are medians over the repeats.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub name: String,
    pub unit: String,
    pub target: String,
    pub etcd: Option<f64>,
    pub keel: Option<f64>,
    /// keel / etcd.
    pub ratio: Option<f64>,
    /// The spread over the repeats: smallest and largest value of each system.
    #[serde(default)]
    pub etcd_spread: Option<(f64, f64)>,
    #[serde(default)]
    pub keel_spread: Option<(f64, f64)>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CompareResult {
    pub started_unix_s: u64,
    pub etcd_bin: String,
    pub keel_bin: String,
    pub keel_label: String,
    /// Why the second system has no numbers, if it has none (or stopped having them).
    pub keel_unavailable: Option<String>,
    pub repeats: u32,
    pub work_dir: String,
    pub floors: Vec<FloorReport>,
    pub runs: Vec<SystemRun>,
    pub table: Vec<Row>,
    /// Files written under --out.
    pub files: Vec<String>,
}

/// Which of the two systems.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Etcd,
    Keel,
}

/// Runs the whole comparison.
pub async fn run(args: &CompareArgs) -> Result<CompareResult, Error> {
    if args.repeats == 0 {
        return Err(Error::InvalidArgument(
            "--repeats must be at least 1".into(),
        ));
    }
    let started_unix_s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let work_root = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work_dir = work_root.join(format!(
        "keel-bench-{}-{started_unix_s}",
        std::process::id()
    ));
    std::fs::create_dir_all(&work_dir)?;
    let keel_bin = match &args.keel_bin {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|dir| dir.join("keel"))
            .unwrap_or_else(|| PathBuf::from("keel")),
    };
    let keel_unavailable = if args.keel_bin.is_none() && !keel_bin.exists() {
        Some(format!("no Keel binary at {}", keel_bin.display()))
    } else {
        None
    };
    let measured = run_repeats(args, &work_dir, &keel_bin, keel_unavailable).await;
    // The scratch directory goes whether or not the runs succeeded.
    let _ = std::fs::remove_dir_all(&work_dir);
    let (floors, runs, keel_unavailable) = measured?;
    let mut result = CompareResult {
        started_unix_s,
        etcd_bin: args.etcd_bin.display().to_string(),
        keel_bin: keel_bin.display().to_string(),
        keel_label: args.keel_label.clone(),
        keel_unavailable,
        repeats: args.repeats,
        work_dir: work_root.display().to_string(),
        table: Vec::new(),
        floors,
        runs,
        files: Vec::new(),
    };
    result.table = table(&result);
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)?;
        let json_path = out.join("compare.json");
        let svg_path = out.join("compare.svg");
        result.files = vec![
            json_path.display().to_string(),
            svg_path.display().to_string(),
        ];
        draw_chart(&result, &svg_path)?;
        std::fs::write(&json_path, serde_json::to_vec_pretty(&result)?)?;
    }
    Ok(result)
}

/// Every repeat: the floor, then each available system. An etcd failure ends the comparison;
/// a Keel failure marks Keel unavailable and the rest runs etcd-only.
async fn run_repeats(
    args: &CompareArgs,
    work_dir: &Path,
    keel_bin: &Path,
    mut keel_unavailable: Option<String>,
) -> Result<(Vec<FloorReport>, Vec<SystemRun>, Option<String>), Error> {
    let mut floors = Vec::new();
    let mut runs = Vec::new();
    for repeat in 0..args.repeats {
        let floor = measure_disk_floor(work_dir, args.floor_ops)?;
        let loopback = measure_loopback_rtt(args.floor_ops)?;
        // A side measurement: without it the repeat's other rows stand, as without the
        // three-member row.
        let reference = match measure_reference_put(work_dir, args.latency_total).await {
            Ok(reference) => Some(reference),
            Err(error) => {
                eprintln!("keel-bench: repeat {repeat}: no reference server row: {error}");
                None
            }
        };
        floors.push(FloorReport {
            repeat,
            ops: args.floor_ops,
            latency_us: Percentiles::of(&floor),
            loopback_rtt_us: Some(Percentiles::of(&loopback)),
            reference_put_us: reference,
        });
        let order = if repeat % 2 == 0 {
            [Side::Etcd, Side::Keel]
        } else {
            [Side::Keel, Side::Etcd]
        };
        for side in order {
            let (bin, label) = match side {
                Side::Etcd => (args.etcd_bin.as_path(), "etcd"),
                Side::Keel if keel_unavailable.is_some() => continue,
                Side::Keel => (keel_bin, args.keel_label.as_str()),
            };
            let dir = work_dir.join(format!("r{repeat}-{}", sanitize(label)));
            match run_system(args, bin, label, repeat, &dir).await {
                Ok(run) => runs.push(run),
                Err(error) if side == Side::Keel => {
                    eprintln!("keel-bench: {label} unavailable: {error}");
                    keel_unavailable = Some(error.to_string());
                }
                Err(error) => return Err(error),
            }
        }
    }
    Ok((floors, runs, keel_unavailable))
}

fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Starts one system, runs every workload against it, stops it.
async fn run_system(
    args: &CompareArgs,
    bin: &Path,
    label: &str,
    repeat: u32,
    dir: &Path,
) -> Result<SystemRun, Error> {
    let mut server = Server::start(bin, label, dir)?;
    let result = run_workloads(args, &mut server, label, repeat).await;
    let stopped = server.stop();
    let _ = std::fs::remove_dir_all(dir);
    let mut run = result?;
    stopped?;
    if args.cluster_put_total > 0 {
        let cluster_dir = dir.join("cluster");
        let cluster = run_cluster_put(args, bin, label, &cluster_dir).await;
        let _ = std::fs::remove_dir_all(dir);
        // A system that serves one member but cannot form a cluster (a stand-in binary, a
        // machine short of ports) keeps its single-member rows; the cluster rows stay empty.
        match cluster {
            Ok(cluster) => run.cluster_put = Some(cluster),
            Err(error) => eprintln!("keel-bench: {label}: no three-member row: {error}"),
        }
    }
    Ok(run)
}

/// Members in the three-member row.
const CLUSTER_MEMBERS: usize = 3;

/// Starts a fresh cluster of `bin`, runs the put workload over all its endpoints, stops it.
async fn run_cluster_put(
    args: &CompareArgs,
    bin: &Path,
    label: &str,
    dir: &Path,
) -> Result<ClusterPut, Error> {
    let mut members = Server::start_cluster(bin, label, dir, CLUSTER_MEMBERS)?;
    let result = cluster_put(args, &mut members, label).await;
    let mut stopped = Ok(());
    for member in members {
        if let Err(error) = member.stop() {
            stopped = Err(error);
        }
    }
    let put = result?;
    stopped?;
    Ok(put)
}

async fn cluster_put(
    args: &CompareArgs,
    members: &mut [Server],
    label: &str,
) -> Result<ClusterPut, Error> {
    for member in members.iter_mut() {
        member
            .wait_ready(Duration::from_secs(args.start_timeout_s))
            .await?;
    }
    let target = Target {
        endpoints: members.iter().map(|m| m.endpoint.clone()).collect(),
        conns: args.put_conns.max(1),
        clients: args.put_clients.max(1),
    };
    let cpu_of_all = |members: &[Server]| -> Result<Vec<CpuTimes>, Error> {
        members.iter().map(Server::cpu_times).collect()
    };
    let before = cpu_of_all(members)?;
    let mut put = workloads::put(
        &target,
        &PutArgs {
            lease: 0,
            key_size: 8,
            val_size: VALUE_BYTES,
            total: args.cluster_put_total,
            key_space_size: args.mem_keys.max(1),
            sequential_keys: true,
            rate: 0.0,
        },
    )
    .await?;
    let after = cpu_of_all(members)?;
    check_errors(label, &put)?;
    let requests = put
        .classes
        .first()
        .map_or(0, |c| c.total.saturating_sub(c.errors));
    let sum = |times: &[CpuTimes]| CpuTimes {
        user_s: times.iter().map(|t| t.user_s).sum(),
        sys_s: times.iter().map(|t| t.sys_s).sum(),
    };
    put.server_cpu = Some(ServerCpu::between(
        sum(&before),
        sum(&after),
        requests,
        "request",
    ));
    let member_us_per_put = before
        .iter()
        .zip(&after)
        .map(|(b, a)| {
            ServerCpu::between(*b, *a, requests, "request")
                .us_per_request
                .unwrap_or(0.0)
        })
        .collect();
    Ok(ClusterPut {
        members: members.len(),
        put,
        member_us_per_put,
    })
}

async fn run_workloads(
    args: &CompareArgs,
    server: &mut Server,
    label: &str,
    repeat: u32,
) -> Result<SystemRun, Error> {
    server
        .wait_ready(Duration::from_secs(args.start_timeout_s))
        .await?;
    let endpoints = vec![server.endpoint.clone()];
    let target = |clients: usize, conns: usize| Target {
        endpoints: endpoints.clone(),
        conns: conns.max(1),
        clients: clients.max(1),
    };
    let put_args = |total: u64| PutArgs {
        lease: 0,
        key_size: 8,
        val_size: VALUE_BYTES,
        total,
        key_space_size: args.mem_keys.max(1),
        sequential_keys: true,
        rate: 0.0,
    };
    let rss_before_bytes = server.rss_bytes()?;
    // Store mem_keys keys once, sequentially, before anything else grows the server.
    let load = workloads::put(
        &target(args.range_clients, args.range_conns),
        &put_args(args.mem_keys as u64),
    )
    .await?;
    check_errors(label, &load)?;
    let rss_after_bytes = server.rss_bytes()?;
    let memory = MemoryReport {
        keys: args.mem_keys,
        rss_before_bytes,
        rss_after_bytes,
        bytes_per_key: rss_after_bytes.saturating_sub(rss_before_bytes) as f64
            / args.mem_keys.max(1) as f64,
    };
    let put_throughput = with_server_cpu(
        server,
        PER_REQUEST,
        workloads::put(
            &target(args.put_clients, args.put_conns),
            &put_args(args.put_total),
        ),
    )
    .await?;
    let put_latency = with_server_cpu(
        server,
        PER_REQUEST,
        workloads::put(&target(1, 1), &put_args(args.latency_total)),
    )
    .await?;
    let txn_put = with_server_cpu(
        server,
        PER_REQUEST,
        workloads::txn_put(
            &target(args.put_clients, args.put_conns),
            &TxnPutArgs {
                key_size: 8,
                val_size: VALUE_BYTES,
                txn_ops: 1,
                key_space_size: args.mem_keys.max(1),
                total: args.txn_put_total,
                rate: 0.0,
            },
        ),
    )
    .await?;
    put_once(&server.endpoint, RANGE_KEY, &[b'v'; VALUE_BYTES]).await?;
    let range_args = |consistency: &str| RangeArgs {
        key: RANGE_KEY.into(),
        end: None,
        consistency: consistency.into(),
        limit: 0,
        count_only: false,
        keys_only: false,
        prefix: false,
        total: args.range_total,
        rate: 0.0,
        random_put_keys: 0,
        put_key_size: 8,
    };
    let range_target = target(args.range_clients, args.range_conns);
    let range_serializable = with_server_cpu(
        server,
        PER_REQUEST,
        workloads::range(&range_target, &range_args("s")),
    )
    .await?;
    let range_linearizable = with_server_cpu(
        server,
        PER_REQUEST,
        workloads::range(&range_target, &range_args("l")),
    )
    .await?;
    let lease_keepalive = with_server_cpu(
        server,
        PER_REQUEST,
        workloads::lease_keepalive(
            &range_target,
            &LeaseKeepaliveArgs {
                total: args.keepalive_total,
                rate: 0.0,
            },
        ),
    )
    .await?;
    // Per delivered event: the server's work in this row is the fan-out to every watcher (the
    // puts that trigger the events are few and are counted in the same CPU time).
    let watch = with_server_cpu(
        server,
        PER_EVENT,
        workloads::watch_latency(
            &target(1, args.watch_streams.clamp(1, 100)),
            &WatchLatencyArgs {
                streams: args.watch_streams,
                watchers_per_stream: args.watch_watchers_per_stream,
                put_total: args.watch_puts,
                put_rate: args.watch_put_rate,
                key_size: 32,
                val_size: 32,
                prefix: args.watch_prefix,
                from_distinct_keys: false,
            },
        ),
    )
    .await?;
    let run = SystemRun {
        system: label.to_string(),
        repeat,
        memory,
        put_throughput,
        put_latency,
        range_serializable,
        range_linearizable,
        watch,
        txn_put,
        lease_keepalive,
        cluster_put: None,
    };
    for summary in [
        &run.put_throughput,
        &run.put_latency,
        &run.range_serializable,
        &run.range_linearizable,
        &run.watch,
        &run.txn_put,
        &run.lease_keepalive,
    ] {
        check_errors(label, summary)?;
    }
    Ok(run)
}

/// What `with_server_cpu` divides by: the workload's first class (its requests), or the watch
/// workload's "watch" class (one sample per event delivered to one watcher).
const PER_REQUEST: (&str, &str) = ("", "request");
const PER_EVENT: (&str, &str) = ("watch", "delivered event");

/// Runs `workload` and records the server's CPU time over it (all threads, user + system),
/// divided by the successful requests of the class `per.0` (the first class when empty).
/// The CPU clock reads sit right around the workload, so connection setup and teardown of the
/// workload's own clients count; nothing else runs against the server meanwhile.
async fn with_server_cpu(
    server: &Server,
    per: (&str, &str),
    workload: impl Future<Output = Result<Summary, Error>>,
) -> Result<Summary, Error> {
    // The counter is read outside the CPU clock reads: a scrape costs the server a little CPU.
    let allocations_before = server.heap_allocations().await;
    let before = server.cpu_times()?;
    let mut summary = workload.await?;
    let after = server.cpu_times()?;
    let allocations_after = server.heap_allocations().await;
    let class = if per.0.is_empty() {
        summary.classes.first()
    } else {
        summary.class(per.0)
    };
    let requests = class.map_or(0, |c| c.total.saturating_sub(c.errors));
    summary.server_cpu = Some(
        ServerCpu::between(before, after, requests, per.1)
            .with_allocations(allocations_before, allocations_after),
    );
    Ok(summary)
}

/// A run with failed requests does not measure what it claims to: refuse it.
fn check_errors(label: &str, summary: &Summary) -> Result<(), Error> {
    if summary.total_errors() == 0 {
        return Ok(());
    }
    let first = summary
        .classes
        .iter()
        .find_map(|c| c.first_error.clone())
        .unwrap_or_default();
    Err(Error::Server {
        label: label.to_string(),
        reason: format!(
            "{}: {} failed requests (first: {first})",
            summary.workload,
            summary.total_errors()
        ),
    })
}

async fn put_once(endpoint: &str, key: &str, value: &[u8]) -> Result<(), Error> {
    let connection = Connection::connect(endpoint).await?;
    let request = PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value),
        ..Default::default()
    };
    let _: PutResponse = Caller::new(&connection)
        .unary(client::KV_PUT, &request)
        .await?;
    Ok(())
}

/// `count` distinct ports nobody listens on right now (see `free_port`).
fn free_ports(count: usize) -> Result<Vec<u16>, Error> {
    let mut ports: Vec<u16> = Vec::with_capacity(count);
    while ports.len() < count {
        let port = free_port()?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

/// A port nobody listens on right now (the kernel picks it; we release it for the server).
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    assert_ne!(port, 0);
    Ok(port)
}

/// A server process started with etcd's flags in a fresh data directory.
pub struct Server {
    label: String,
    child: Option<Child>,
    pub endpoint: String,
    log_path: PathBuf,
}

impl Server {
    /// Starts `bin` with a fresh data dir under `dir` and free client and peer ports.
    pub fn start(bin: &Path, label: &str, dir: &Path) -> Result<Server, Error> {
        let ports = free_ports(2)?;
        Server::spawn(bin, label, dir, ports[0], ports[1], &[])
    }

    /// Starts `members` processes of `bin` as one new cluster on 127.0.0.1 (etcd's
    /// `--initial-cluster` flags, members named n0, n1, ...), each with a fresh data dir under
    /// `dir` and free ports. They elect a leader among themselves: wait for each to be ready.
    pub fn start_cluster(
        bin: &Path,
        label: &str,
        dir: &Path,
        members: usize,
    ) -> Result<Vec<Server>, Error> {
        assert!(members > 0, "a cluster has members");
        let ports = free_ports(2 * members)?;
        let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let initial_cluster = (0..members)
            .map(|i| format!("n{i}={}", peer_url(i)))
            .collect::<Vec<_>>()
            .join(",");
        (0..members)
            .map(|i| {
                let flags = [
                    "--name".to_string(),
                    format!("n{i}"),
                    "--initial-advertise-peer-urls".into(),
                    peer_url(i),
                    "--initial-cluster".into(),
                    initial_cluster.clone(),
                    "--initial-cluster-state".into(),
                    "new".into(),
                ];
                Server::spawn(
                    bin,
                    &format!("{label} n{i}"),
                    &dir.join(format!("n{i}")),
                    ports[2 * i],
                    ports[2 * i + 1],
                    &flags,
                )
            })
            .collect()
    }

    fn spawn(
        bin: &Path,
        label: &str,
        dir: &Path,
        client_port: u16,
        peer_port: u16,
        flags: &[String],
    ) -> Result<Server, Error> {
        std::fs::create_dir_all(dir)?;
        let data_dir = dir.join("data");
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let log_path = dir.join("server.log");
        let log = File::create(&log_path)?;
        let mut command = Command::new(bin);
        // SAFETY: the hook runs between fork and exec and calls only prctl, which is
        // async-signal-safe. It makes the kernel SIGTERM the server if keel-bench dies
        // (even by SIGKILL), so no orphaned server keeps loading the machine.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|error| Error::Server {
                label: label.to_string(),
                reason: format!("cannot start {}: {error}", bin.display()),
            })?;
        Ok(Server {
            label: label.to_string(),
            child: Some(child),
            endpoint: format!("127.0.0.1:{client_port}"),
            log_path,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("a running server has its child")
            .id()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read(&self.log_path).unwrap_or_default();
        let start = log.len().saturating_sub(LOG_TAIL_BYTES);
        String::from_utf8_lossy(&log[start..]).into_owned()
    }

    /// Waits until a linearizable Range succeeds (so a leader exists), or the process exits.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let probe = RangeRequest {
            key: Bytes::from_static(b"keel-bench-ready"),
            ..Default::default()
        };
        let mut last_error = String::from("no attempt yet");
        while Instant::now() < deadline {
            let child = self.child.as_mut().expect("a running server has its child");
            if let Some(status) = child.try_wait()? {
                return Err(Error::Server {
                    label: self.label.clone(),
                    reason: format!(
                        "exited with {status} before answering; log tail:\n{}",
                        self.log_tail()
                    ),
                });
            }
            match tokio::time::timeout(
                Duration::from_secs(2),
                workloads::range_once(&self.endpoint, &probe),
            )
            .await
            {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(error)) => last_error = error.to_string(),
                Err(_) => last_error = "Range probe timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::Server {
            label: self.label.clone(),
            reason: format!(
                "no answer within {} s (last: {last_error}); log tail:\n{}",
                timeout.as_secs(),
                self.log_tail()
            ),
        })
    }

    /// The process's resident set, from /proc/PID/status VmRSS.
    pub fn rss_bytes(&self) -> Result<u64, Error> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        parse_vm_rss_bytes(&status).ok_or_else(|| Error::Server {
            label: self.label.clone(),
            reason: "no VmRSS line in /proc/PID/status".into(),
        })
    }

    /// The process's CPU time so far, all threads (live and exited) together.
    ///
    /// The total comes from the process's CPU clock (clock_getcpuclockid), which counts in
    /// nanoseconds. /proc/PID/stat's utime and stime count in clock ticks (10 ms here), so a
    /// short workload of ~10 ms of server CPU could read as 0 or 20 ms; they only say how the
    /// total splits into user and system time.
    pub fn cpu_times(&self) -> Result<CpuTimes, Error> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))?;
        let (utime, stime) = parse_proc_stat_ticks(&stat).ok_or_else(|| Error::Server {
            label: self.label.clone(),
            reason: format!("cannot parse /proc/PID/stat: {stat:?}"),
        })?;
        let pid = libc::pid_t::try_from(self.pid()).expect("pids fit pid_t");
        let total_s = process_cpu_clock_s(pid).map_err(|error| Error::Server {
            label: self.label.clone(),
            reason: format!("cannot read the process's CPU clock: {error}"),
        })?;
        Ok(split_cpu_total(total_s, utime, stime))
    }

    /// The server's heap allocations so far, from its /metrics page (see
    /// `parse_heap_allocations`); None when the page has no such counter.
    /// A page that cannot be read gives None with a warning: the count is an extra figure,
    /// and a stand-in server may serve no /metrics.
    pub async fn heap_allocations(&self) -> Option<u64> {
        match http_get(&self.endpoint, "/metrics").await {
            Ok(page) => parse_heap_allocations(&page),
            Err(error) => {
                eprintln!(
                    "{}: cannot read /metrics ({error}); no allocation count",
                    self.label
                );
                None
            }
        }
    }

    /// SIGTERM, then SIGKILL after `STOP_TIMEOUT_MS`; reaps the process.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), Error> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(child.id()).expect("pids fit pid_t");
        // SAFETY: kill only sends a signal to the child we started and have not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_millis(STOP_TIMEOUT_MS);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// One plain HTTP/1.1 GET, the whole answer's body (both servers close after `Connection:
/// close`). Bounded in time: a server that stops answering fails the run rather than hang it.
async fn http_get(endpoint: &str, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(endpoint).await?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {endpoint}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 10 s"))??;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "no end of HTTP headers")
    })?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or("").to_string();
        return Err(std::io::Error::other(format!("answered {status:?}")));
    }
    // Neither server chunks /metrics (both send a Content-Length), so the body is as read.
    Ok(body.to_string())
}

/// The heap allocations a metrics page counts: the sum of Keel's
/// `keel_heap_allocations_total{thread=...}` series, or Go's `go_memstats_mallocs_total`
/// (etcd). Both count allocations made, not live objects.
pub fn parse_heap_allocations(page: &str) -> Option<u64> {
    let mut keel: Option<u64> = None;
    for line in page.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        // Prometheus's text format may write a counter as a float (Go does: 1.2e+07).
        let value = || value.parse::<f64>().ok().map(|v| v as u64);
        if series.starts_with("keel_heap_allocations_total{") {
            keel = Some(keel.unwrap_or(0) + value()?);
        } else if series == "go_memstats_mallocs_total" {
            return value();
        }
    }
    keel
}

/// `VmRSS:   123456 kB` → bytes.
pub fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next()? {
        "kB" => Some(value * 1024),
        _ => None,
    }
}

/// utime and stime (fields 14 and 15 of proc(5), in clock ticks) from a /proc/PID/stat line.
/// Field 2, the command name in parentheses, may itself hold spaces and parentheses (a thread
/// can name itself anything), so the fields are counted after the last ')'.
pub fn parse_proc_stat_ticks(stat: &str) -> Option<(u64, u64)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // The first field after the command name is field 3 (state); utime is field 14.
    let mut fields = after_comm.split_whitespace().skip(14 - 3);
    let utime = fields.next()?.parse().ok()?;
    let stime = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// Another process's CPU time (user + system, every thread it ever had) in seconds, from its
/// CPU-time clock: Linux lets any process in the same pid namespace read it.
fn process_cpu_clock_s(pid: libc::pid_t) -> std::io::Result<f64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes one clockid_t into the variable we own.
    let rc = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if rc != 0 {
        // It returns the error number rather than setting errno.
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the variable we own.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(now.tv_sec as f64 + now.tv_nsec as f64 / 1e9)
}

/// The precise total split into user and system time in the proportion of the tick counts.
/// With no tick counted yet the split is unknown, and it is all called user time.
fn split_cpu_total(total_s: f64, utime_ticks: u64, stime_ticks: u64) -> CpuTimes {
    assert!(total_s >= 0.0, "CPU time is never negative: {total_s}");
    let ticks = utime_ticks + stime_ticks;
    let sys_s = if ticks == 0 {
        0.0
    } else {
        total_s * stime_ticks as f64 / ticks as f64
    };
    CpuTimes {
        user_s: total_s - sys_s,
        sys_s,
    }
}

/// An O_DIRECT file descriptor, closed on drop.
pub(crate) struct DirectFile {
    fd: libc::c_int,
    path: CString,
}

impl Drop for DirectFile {
    fn drop(&mut self) {
        // SAFETY: fd is ours and open; the path is a valid C string.
        unsafe {
            libc::close(self.fd);
            libc::unlink(self.path.as_ptr());
        }
    }
}

/// A 4 KiB-aligned 4 KiB buffer from posix_memalign, freed on drop.
pub(crate) struct AlignedBlock {
    ptr: *mut libc::c_void,
}

impl AlignedBlock {
    pub(crate) fn new(fill: u8) -> Result<AlignedBlock, Error> {
        let mut ptr: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: posix_memalign writes ptr only on success; alignment is a power of two.
        let rc = unsafe { libc::posix_memalign(&mut ptr, FLOOR_BLOCK_BYTES, FLOOR_BLOCK_BYTES) };
        if rc != 0 {
            return Err(Error::Io(std::io::Error::from_raw_os_error(rc)));
        }
        assert!(!ptr.is_null() && (ptr as usize) & (FLOOR_BLOCK_BYTES - 1) == 0);
        // SAFETY: ptr points at FLOOR_BLOCK_BYTES bytes we own.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), fill, FLOOR_BLOCK_BYTES) };
        Ok(AlignedBlock { ptr })
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // SAFETY: ptr came from posix_memalign and is freed once.
        unsafe { libc::free(self.ptr) };
    }
}

pub(crate) fn pwrite_block(
    file: &DirectFile,
    block: &AlignedBlock,
    offset: usize,
) -> Result<(), Error> {
    let offset = libc::off_t::try_from(offset).expect("floor file offsets are small");
    // SAFETY: block is FLOOR_BLOCK_BYTES long and aligned; fd is open for writing.
    let written = unsafe { libc::pwrite(file.fd, block.ptr, FLOOR_BLOCK_BYTES, offset) };
    if written < 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    if written as usize != FLOOR_BLOCK_BYTES {
        return Err(Error::Io(std::io::Error::other("short O_DIRECT write")));
    }
    Ok(())
}

pub(crate) fn fdatasync(file: &DirectFile) -> Result<(), Error> {
    // SAFETY: fd is open.
    if unsafe { libc::fdatasync(file.fd) } != 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The disk's own latency for one 4 KiB O_DIRECT pwrite + fdatasync, in `dir`'s filesystem:
/// the physical floor under any durable put. The file is preallocated by writing it fully once.
pub fn measure_disk_floor(dir: &Path, ops: u64) -> Result<Histogram<u64>, Error> {
    if ops == 0 {
        return Err(Error::InvalidArgument(
            "--floor-ops must be positive".into(),
        ));
    }
    let file = floor_file(dir, "floor")?;
    let block = AlignedBlock::new(0xa5)?;
    let blocks = (FLOOR_FILE_BYTES / FLOOR_BLOCK_BYTES) as u64;
    let mut histogram = report::new_histogram();
    for i in 0..ops {
        let offset = ((i % blocks) as usize) * FLOOR_BLOCK_BYTES;
        let start = Instant::now();
        pwrite_block(&file, &block, offset)?;
        fdatasync(&file)?;
        report::record_latency(&mut histogram, start.elapsed());
    }
    assert_eq!(histogram.len(), ops);
    Ok(histogram)
}

/// The floor's file in `dir` (`keel-bench-NAME-PID`), opened O_DIRECT and written once in full
/// (zeros, synced), so that later writes rewrite allocated blocks; removed when dropped.
pub(crate) fn floor_file(dir: &Path, name: &str) -> Result<DirectFile, Error> {
    let path = dir.join(format!("keel-bench-{name}-{}", std::process::id()));
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::InvalidArgument(format!("path {} has a NUL byte", path.display())))?;
    // SAFETY: path is a valid C string; the flags and mode are plain integers.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_DIRECT | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(Error::Io(std::io::Error::new(
            error.kind(),
            format!("open O_DIRECT in {}: {error}", dir.display()),
        )));
    }
    let file = DirectFile { fd, path };
    let zeros = AlignedBlock::new(0)?;
    for offset in (0..FLOOR_FILE_BYTES).step_by(FLOOR_BLOCK_BYTES) {
        pwrite_block(&file, &zeros, offset)?;
    }
    fdatasync(&file)?;
    Ok(file)
}

/// One client's put latency against the reference server (`reference`): `total` puts of the
/// one-client row's shape, each made durable by the floor's write and fdatasync in `dir`
/// before its answer.
pub async fn measure_reference_put(dir: &Path, total: u64) -> Result<Percentiles, Error> {
    let server = crate::reference::ReferenceServer::start(dir)?;
    let target = Target {
        endpoints: crate::client::parse_endpoints(server.endpoint())?,
        conns: 1,
        clients: 1,
    };
    let args = PutArgs {
        lease: 0,
        key_size: 8,
        val_size: VALUE_BYTES,
        total: total.max(1),
        key_space_size: 1,
        sequential_keys: true,
        rate: 0.0,
    };
    let summary = workloads::put(&target, &args).await?;
    check_errors("reference server", &summary)?;
    let durable = server.stop()?;
    let answered = summary.classes.first().map_or(0, |c| c.total);
    if durable != answered {
        return Err(Error::Protocol(format!(
            "the reference server made {durable} puts durable and answered {answered}"
        )));
    }
    Ok(summary
        .classes
        .first()
        .map(|c| c.latency_us.clone())
        .unwrap_or_default())
}

/// Bytes each way in a loopback round trip: about a one-client put's request (an 8-byte key
/// and a 256-byte value, framed by gRPC and HTTP/2).
const LOOPBACK_MESSAGE_BYTES: usize = 300;

/// The loopback network's own round trip: `ops` exchanges of `LOOPBACK_MESSAGE_BYTES` over one
/// TCP connection (TCP_NODELAY, blocking) between this thread and an echo thread, neither
/// pinned, as the load generator's client and the server's threads are not tied to each other.
/// A one-client put crosses it once, beside its WAL write: the disk floor plus this is a
/// reference for the best a server that syncs before it answers can do here. Not a strict
/// bound: both ends block here, each wake-up a scheduler's, where a server may be polling, and
/// the echo is as large as the request, where a put's answer is about 30 bytes.
pub fn measure_loopback_rtt(ops: u64) -> Result<Histogram<u64>, Error> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    // Connected before the echo thread starts (the kernel completes the handshake from the
    // listen backlog), so that a failed connect leaves no thread waiting in accept.
    let mut stream = std::net::TcpStream::connect(listener.local_addr()?)?;
    stream.set_nodelay(true)?;
    let echo = std::thread::Builder::new()
        .name("loopback-echo".into())
        .spawn(move || -> std::io::Result<()> {
            let (mut peer, _) = listener.accept()?;
            peer.set_nodelay(true)?;
            let mut buf = [0u8; LOOPBACK_MESSAGE_BYTES];
            for _ in 0..ops {
                peer.read_exact(&mut buf)?;
                peer.write_all(&buf)?;
            }
            Ok(())
        })?;
    let mut buf = [0x5au8; LOOPBACK_MESSAGE_BYTES];
    let mut histogram = report::new_histogram();
    for _ in 0..ops {
        let start = Instant::now();
        stream.write_all(&buf)?;
        stream.read_exact(&mut buf)?;
        report::record_latency(&mut histogram, start.elapsed());
    }
    echo.join()
        .map_err(|_| Error::InvalidArgument("the loopback echo thread panicked".into()))??;
    assert_eq!(histogram.len(), ops);
    Ok(histogram)
}

/// One system's values of `metric` over its runs (the repeats), in run order.
fn values_of(
    runs: &[SystemRun],
    system: &str,
    metric: impl Fn(&SystemRun) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter(|r| r.system == system)
        .filter_map(metric)
        .collect()
}

/// Medians over one system's runs of `metric`.
fn median_of(
    runs: &[SystemRun],
    system: &str,
    metric: impl Fn(&SystemRun) -> Option<f64>,
) -> Option<f64> {
    median(&values_of(runs, system, metric))
}

/// (smallest, largest) of `values`; None when empty.
fn spread(values: &[f64]) -> Option<(f64, f64)> {
    let min = values.iter().copied().reduce(f64::min)?;
    let max = values.iter().copied().reduce(f64::max)?;
    assert!(min <= max);
    Some((min, max))
}

fn throughput(summary: &Summary) -> Option<f64> {
    summary.classes.first().map(|c| c.throughput_per_s)
}

fn p50(summary: &Summary) -> Option<f64> {
    summary.classes.first().map(|c| c.latency_us.p50 as f64)
}

fn p99(summary: &Summary) -> Option<f64> {
    summary.classes.first().map(|c| c.latency_us.p99 as f64)
}

fn server_us(summary: &Summary) -> Option<f64> {
    summary.server_cpu.as_ref()?.us_per_request
}

fn allocations(summary: &Summary) -> Option<f64> {
    summary.server_cpu.as_ref()?.allocations_per_request
}

/// The ratio table of DESIGN.md's "Targets", plus each workload's server CPU per request
/// beside its throughput and latency. The CPU rows' targets, the loaded put's p99 and the
/// three-member rows are issue #15's.
pub fn table(result: &CompareResult) -> Vec<Row> {
    let runs = &result.runs;
    let etcd = "etcd";
    let keel = result.keel_label.as_str();
    let floors: Vec<f64> = result
        .floors
        .iter()
        .map(|f| f.latency_us.p50 as f64)
        .collect();
    let floor_p50 = median(&floors);
    // Each repeat's p50 of a measurement that results from before it was taken lack.
    let p50s = |of: fn(&FloorReport) -> Option<&Percentiles>| -> Vec<f64> {
        result
            .floors
            .iter()
            .filter_map(|f| of(f).map(|p| p.p50 as f64))
            .collect()
    };
    let loopbacks = p50s(|f| f.loopback_rtt_us.as_ref());
    let loopback_p50 = median(&loopbacks);
    // The sync and one loopback round trip: a reference for the best a server that syncs
    // before it answers can do here (see `measure_loopback_rtt`).
    let path_floor_p50 = floor_p50.zip(loopback_p50).map(|(d, l)| d + l);
    let references = p50s(|f| f.reference_put_us.as_ref());
    let reference_p50 = median(&references);
    let reference_over_floor: Vec<f64> = result
        .floors
        .iter()
        .filter_map(|f| {
            let reference = f.reference_put_us.as_ref()?.p50 as f64;
            let floor = f.latency_us.p50 as f64;
            (floor > 0.0).then(|| reference / floor)
        })
        .collect();
    let row = |name: &str, unit: &str, target: &str, metric: &dyn Fn(&SystemRun) -> Option<f64>| {
        let e = values_of(runs, etcd, metric);
        let k = values_of(runs, keel, metric);
        let (em, km) = (median(&e), median(&k));
        Row {
            name: name.to_string(),
            unit: unit.to_string(),
            target: target.to_string(),
            etcd: em,
            keel: km,
            ratio: match (em, km) {
                (Some(e), Some(k)) if e > 0.0 => Some(k / e),
                _ => None,
            },
            etcd_spread: spread(&e),
            keel_spread: spread(&k),
        }
    };
    let put_p50 = |r: &SystemRun| p50(&r.put_latency);
    let mut rows = vec![
        row(
            "put throughput, 1000 clients/100 conns, 256 B",
            "req/s",
            ">= 5x",
            &|r| throughput(&r.put_throughput),
        ),
        row(
            "  server CPU per put (1000 clients)",
            "us",
            "<= 0.2x",
            &|r| server_us(&r.put_throughput),
        ),
        // Issue #15's latency target under load: half of etcd's p99 or less.
        row("  put latency p99 (1000 clients)", "us", "<= 0.5x", &|r| {
            p99(&r.put_throughput)
        }),
        row("put latency p50, 1 client", "us", "", &put_p50),
        row("  server heap allocations per put", "allocs", "", &|r| {
            allocations(&r.put_throughput)
        }),
        row("  server CPU per put (1 client)", "us", "", &|r| {
            server_us(&r.put_latency)
        }),
        row("put p50 / disk floor p50", "x floor", "keel <= 1.3", &|r| {
            Some(put_p50(r)? / floor_p50.filter(|f| *f > 0.0)?)
        }),
        row(
            "put p50 / (disk floor + loopback round trip) p50",
            "x floor",
            "",
            &|r| Some(put_p50(r)? / path_floor_p50.filter(|f| *f > 0.0)?),
        ),
        row(
            "put p50 / reference server put p50 (1 client)",
            "x ref",
            "",
            &|r| Some(put_p50(r)? / reference_p50.filter(|f| *f > 0.0)?),
        ),
        row(
            "txn-put throughput (1 put, no compares)",
            "req/s",
            "",
            &|r| throughput(&r.txn_put),
        ),
        row("  txn-put latency p50", "us", "", &|r| p50(&r.txn_put)),
        row("  server CPU per txn-put", "us", "<= 0.2x", &|r| {
            server_us(&r.txn_put)
        }),
        row(
            "  server heap allocations per txn-put",
            "allocs",
            "",
            &|r| allocations(&r.txn_put),
        ),
        row("serializable range throughput", "req/s", ">= 5x", &|r| {
            throughput(&r.range_serializable)
        }),
        row(
            "  server CPU per serializable range",
            "us",
            "<= 0.125x",
            &|r| server_us(&r.range_serializable),
        ),
        row(
            "  server heap allocations per serializable range",
            "allocs",
            "",
            &|r| allocations(&r.range_serializable),
        ),
        row("linearizable range throughput", "req/s", "", &|r| {
            throughput(&r.range_linearizable)
        }),
        row(
            "  server CPU per linearizable range",
            "us",
            "<= 0.125x",
            &|r| server_us(&r.range_linearizable),
        ),
        row(
            "  server heap allocations per linearizable range",
            "allocs",
            "",
            &|r| allocations(&r.range_linearizable),
        ),
        row("linearizable / serializable", "x", "keel >= 0.8", &|r| {
            Some(throughput(&r.range_linearizable)? / throughput(&r.range_serializable)?)
        }),
        row(
            "lease keep-alive throughput (stream msgs)",
            "msg/s",
            "",
            &|r| throughput(&r.lease_keepalive),
        ),
        row("  keep-alive latency p50", "us", "", &|r| {
            p50(&r.lease_keepalive)
        }),
        row("  server CPU per keep-alive", "us", "<= 0.2x", &|r| {
            server_us(&r.lease_keepalive)
        }),
        row(
            "  server heap allocations per keep-alive",
            "allocs",
            "",
            &|r| allocations(&r.lease_keepalive),
        ),
        row(
            "three members: put throughput, all endpoints",
            "req/s",
            "",
            &|r| throughput(&r.cluster_put.as_ref()?.put),
        ),
        // Issue #15: the members' CPU summed, a fifth of etcd's or less.
        row(
            "  server CPU per put, summed over the members",
            "us",
            "<= 0.2x",
            &|r| server_us(&r.cluster_put.as_ref()?.put),
        ),
        // Issue #15: three members ahead of etcd by the same factor as one member, so the
        // ratio of the two systems' (three members / one member) is 1 or more.
        row(
            "  put throughput, three members / one member",
            "x",
            ">= 1x",
            &|r| Some(throughput(&r.cluster_put.as_ref()?.put)? / throughput(&r.put_throughput)?),
        ),
        row(
            "memory per stored key (RSS delta)",
            "bytes",
            "<= 0.5x",
            &|r| Some(r.memory.bytes_per_key),
        ),
        row("watch latency p99", "us", "keel < 5000 us", &|r| {
            r.watch.class("watch").map(|c| c.latency_us.p99 as f64)
        }),
        row(
            "  server CPU per delivered watch event",
            "us",
            "<= 0.2x",
            &|r| server_us(&r.watch),
        ),
        row(
            "  server heap allocations per delivered watch event",
            "allocs",
            "",
            &|r| allocations(&r.watch),
        ),
    ];
    rows.push(Row {
        name: "disk floor p50 (4 KiB O_DIRECT write + fdatasync)".into(),
        unit: "us".into(),
        target: String::new(),
        etcd: floor_p50,
        keel: None,
        ratio: None,
        etcd_spread: spread(&floors),
        keel_spread: None,
    });
    rows.push(Row {
        name: "reference server put p50, 1 client (sync only)".into(),
        unit: "us".into(),
        target: String::new(),
        etcd: reference_p50,
        keel: None,
        ratio: None,
        etcd_spread: spread(&references),
        keel_spread: None,
    });
    rows.push(Row {
        name: "  reference server put p50 / disk floor p50".into(),
        unit: "x floor".into(),
        target: String::new(),
        etcd: median(&reference_over_floor),
        keel: None,
        ratio: None,
        etcd_spread: spread(&reference_over_floor),
        keel_spread: None,
    });
    rows.push(Row {
        name: "loopback round trip p50 (300 B each way, TCP)".into(),
        unit: "us".into(),
        target: String::new(),
        etcd: loopback_p50,
        keel: None,
        ratio: None,
        etcd_spread: spread(&loopbacks),
        keel_spread: None,
    });
    assert!(rows.iter().all(|r| !r.name.is_empty()));
    rows
}

fn cell(value: Option<f64>) -> String {
    match value {
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
        None => "n/a".into(),
    }
}

/// "min-max" of a spread, or nothing for a single repeat (its one value is the median).
fn spread_cell(spread: Option<(f64, f64)>) -> String {
    match spread {
        Some((min, max)) if min < max => format!("{}-{}", cell(Some(min)), cell(Some(max))),
        _ => String::new(),
    }
}

/// The human report: header, Keel's availability, and the ratio table.
pub fn to_text(result: &CompareResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "keel-bench compare: etcd ({}) vs {} ({}), {} repeats, work dir {}",
        result.etcd_bin, result.keel_label, result.keel_bin, result.repeats, result.work_dir
    );
    if let Some(reason) = &result.keel_unavailable {
        let _ = writeln!(out, "{} unavailable: {reason}", result.keel_label);
        let _ = writeln!(out, "(etcd-only numbers below; ratios are n/a)");
    }
    let _ = writeln!(
        out,
        "{:<50} {:>7} {:>9} {:>17} {:>9} {:>17} {:>8}  target",
        "row (median of repeats)",
        "unit",
        "etcd",
        "etcd min-max",
        result.keel_label,
        format!("{} min-max", result.keel_label),
        "ratio"
    );
    for row in &result.table {
        let _ = writeln!(
            out,
            "{:<50} {:>7} {:>9} {:>17} {:>9} {:>17} {:>8}  {}",
            row.name,
            row.unit,
            cell(row.etcd),
            spread_cell(row.etcd_spread),
            cell(row.keel),
            spread_cell(row.keel_spread),
            row.ratio.map_or("n/a".into(), |r| format!("{r:.2}x")),
            row.target
        );
    }
    for run in &result.runs {
        let cpu = [&run.put_throughput, &run.range_serializable]
            .iter()
            .map(|s| format!("{} {:.0}%", s.workload, s.client_cpu.pct_of_all_cores))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "  {} repeat {}: client CPU of all cores: {cpu}",
            run.system, run.repeat
        );
        let server = [
            ("put", &run.put_throughput),
            ("put-1c", &run.put_latency),
            ("txn-put", &run.txn_put),
            ("range-s", &run.range_serializable),
            ("range-l", &run.range_linearizable),
            ("keepalive", &run.lease_keepalive),
            ("watch-event", &run.watch),
        ]
        .iter()
        .map(|(name, s)| format!("{name} {}", cell(server_us(s))))
        .collect::<Vec<_>>()
        .join(", ");
        let _ = writeln!(
            out,
            "  {} repeat {}: server CPU us per request: {server}",
            run.system, run.repeat
        );
        if let Some(cluster) = &run.cluster_put {
            let members = cluster
                .member_us_per_put
                .iter()
                .map(|us| cell(Some(*us)))
                .collect::<Vec<_>>()
                .join(" / ");
            let _ = writeln!(
                out,
                "  {} repeat {}: {} members, server CPU us per put: {} summed ({members})",
                run.system,
                run.repeat,
                cluster.members,
                cell(server_us(&cluster.put))
            );
        }
    }
    for file in &result.files {
        let _ = writeln!(out, "wrote {file}");
    }
    out
}

fn chart_error(error: impl std::fmt::Display) -> Error {
    Error::Chart(error.to_string())
}

/// Throughput bars (top) and latency percentiles (bottom, log scale), medians of repeats.
pub fn draw_chart(result: &CompareResult, path: &Path) -> Result<(), Error> {
    use plotters::prelude::*;

    let systems: Vec<&str> = {
        let mut names: Vec<&str> = Vec::new();
        for run in &result.runs {
            if !names.contains(&run.system.as_str()) {
                names.push(&run.system);
            }
        }
        names
    };
    type Pick = fn(&SystemRun) -> &Summary;
    // Watch last: it is the one workload without a throughput bar.
    let workloads: [(&str, Pick); 7] = [
        ("put 1000c", |r| &r.put_throughput),
        ("put 1c", |r| &r.put_latency),
        ("txn-put", |r| &r.txn_put),
        ("range s", |r| &r.range_serializable),
        ("range l", |r| &r.range_linearizable),
        ("keepalive", |r| &r.lease_keepalive),
        ("watch", |r| &r.watch),
    ];
    let groups = workloads.len() - 1;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN];
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_error)?;
    let (upper, lower) = root.split_vertically(420);

    // Top: throughput bars, one group per workload (watch has no throughput meaning: skipped).
    let bars: Vec<(usize, usize, f64)> = workloads[..groups]
        .iter()
        .enumerate()
        .flat_map(|(w, (_, pick))| {
            systems.iter().enumerate().filter_map(move |(s, system)| {
                median_of(&result.runs, system, |r| throughput(pick(r))).map(|t| (w, s, t))
            })
        })
        .collect();
    let y_max = bars.iter().map(|b| b.2).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&upper)
        .caption("throughput (req/s, median of repeats)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..groups as f64, 0f64..y_max)
        .map_err(chart_error)?;
    // Group names are drawn over each group: axis labels would sit between bars.
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .draw()
        .map_err(chart_error)?;
    chart
        .draw_series(
            workloads[..groups]
                .iter()
                .enumerate()
                .map(|(w, (name, _))| {
                    Text::new(
                        name.to_string(),
                        (w as f64 + 0.3, y_max * 0.97),
                        ("sans-serif", 16),
                    )
                }),
        )
        .map_err(chart_error)?;
    let width = 0.8 / systems.len().max(1) as f64;
    for (s, system) in systems.iter().enumerate() {
        let color = colors[s % colors.len()];
        chart
            .draw_series(bars.iter().filter(|b| b.1 == s).map(|&(w, _, t)| {
                let x0 = w as f64 + 0.1 + s as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, t)], color.filled())
            }))
            .map_err(chart_error)?
            .label(*system)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(chart_error)?;

    // Bottom: p50, p90, p99, p99.9 per system and workload, log scale.
    let percentile_names = ["p50", "p90", "p99", "p99.9"];
    // (legend, colour index, points) per system and workload.
    type Line = (String, usize, Vec<(f64, f64)>);
    let mut lines: Vec<Line> = Vec::new();
    for (s, system) in systems.iter().enumerate() {
        for (w, (name, pick)) in workloads.iter().enumerate() {
            let class = |r: &SystemRun| pick(r).classes.first().map(|c| c.latency_us.clone());
            let points: Vec<(f64, f64)> = (0..4)
                .filter_map(|p| {
                    median_of(&result.runs, system, |r| {
                        class(r).map(|l| [l.p50, l.p90, l.p99, l.p999][p] as f64 / 1000.0)
                    })
                    .map(|v| (p as f64, v.max(0.001)))
                })
                .collect();
            if !points.is_empty() {
                lines.push((format!("{system} {name}"), s * workloads.len() + w, points));
            }
        }
    }
    let floor: Vec<(f64, f64)> = (0..4)
        .filter_map(|p| {
            let values: Vec<f64> = result
                .floors
                .iter()
                .map(|f| {
                    [
                        f.latency_us.p50,
                        f.latency_us.p90,
                        f.latency_us.p99,
                        f.latency_us.p999,
                    ][p] as f64
                        / 1000.0
                })
                .collect();
            median(&values).map(|v| (p as f64, v.max(0.001)))
        })
        .collect();
    let all = lines.iter().flat_map(|l| l.2.iter()).chain(floor.iter());
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (lo, hi) = if hi > 0.0 {
        (lo * 0.8, hi * 1.25)
    } else {
        (0.001, 1.0)
    };
    let mut chart = ChartBuilder::on(&lower)
        .caption("latency percentiles (ms, log scale)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..3f64, (lo..hi).log_scale())
        .map_err(chart_error)?;
    chart
        .configure_mesh()
        .x_labels(4)
        .x_label_formatter(&|x| {
            percentile_names
                .get(x.round() as usize)
                .map_or(String::new(), |n| n.to_string())
        })
        .draw()
        .map_err(chart_error)?;
    let palette = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK, YELLOW];
    for (label, index, points) in lines {
        let system_index = index / workloads.len();
        let color = palette[index % palette.len()];
        let style = if system_index == 0 {
            color.stroke_width(2)
        } else {
            color.stroke_width(1)
        };
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(chart_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], style));
    }
    if !floor.is_empty() {
        chart
            .draw_series(LineSeries::new(floor, BLACK.stroke_width(3)))
            .map_err(chart_error)?
            .label("disk floor")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .draw()
        .map_err(chart_error)?;
    root.present().map_err(chart_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_parsed_in_bytes() {
        let status = "Name:\tetcd\nVmPeak:\t 999 kB\nVmRSS:\t   2048 kB\nThreads: 9\n";
        assert_eq!(parse_vm_rss_bytes(status), Some(2048 * 1024));
        assert_eq!(parse_vm_rss_bytes("Name: x\n"), None);
    }

    #[test]
    fn proc_stat_cpu_ticks_are_read_after_the_last_parenthesis() {
        // A real line's shape (proc(5)): pid (comm) state ppid ... utime stime cutime ...
        let plain = "4242 (etcd) S 1 4242 4242 0 -1 4194560 9000 0 3 0 1234 567 0 0 20 0 12 0 \
                     100 2000000 3000 18446744073709551615";
        assert_eq!(parse_proc_stat_ticks(plain), Some((1234, 567)));
        // A command name with spaces and parentheses, including a ") " that looks like the end.
        let odd = "77 (a) b (c) d) R 1 77 77 0 -1 0 0 0 0 0 31 7 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_proc_stat_ticks(odd), Some((31, 7)));
        assert_eq!(parse_proc_stat_ticks("77 (x) R 1 2 3"), None, "too short");
        assert_eq!(parse_proc_stat_ticks("no parenthesis 1 2 3"), None);
        let bad = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 7 0";
        assert_eq!(parse_proc_stat_ticks(bad), None, "not a number");
    }

    #[test]
    fn the_precise_total_splits_as_the_ticks_do() {
        let cpu = split_cpu_total(0.004, 3, 1);
        assert!((cpu.user_s - 0.003).abs() < 1e-12 && (cpu.sys_s - 0.001).abs() < 1e-12);
        // Less than one tick so far: all of it is called user time, none is lost.
        assert_eq!(
            split_cpu_total(0.0042, 0, 0),
            CpuTimes {
                user_s: 0.0042,
                sys_s: 0.0
            }
        );
        let cpu = split_cpu_total(1.5, 0, 7);
        assert_eq!((cpu.user_s, cpu.sys_s), (0.0, 1.5));
    }

    #[test]
    fn server_cpu_times_follow_a_busy_process() {
        // A shell that spins, then sleeps: its CPU time grows, then stops growing.
        let child = Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 30",
            ])
            .spawn()
            .expect("sh runs");
        let server = Server {
            label: "sh".into(),
            child: Some(child),
            endpoint: String::new(),
            log_path: PathBuf::new(),
        };
        let start = server.cpu_times().expect("own child's /proc/PID/stat");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut now = start;
        while now.user_s + now.sys_s < 0.1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            now = server.cpu_times().expect("still running");
        }
        assert!(now.user_s + now.sys_s >= 0.1, "{start:?} -> {now:?}");
        // The precise clock and the tick counts describe the same time: they differ by the
        // ticks' rounding, a few ticks at most, not by a factor.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", server.pid())).expect("stat");
        let (utime, stime) = parse_proc_stat_ticks(&stat).expect("parses");
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let ticks_s = (utime + stime) as f64 / ticks_per_s;
        let clock_s = server.cpu_times().expect("still running");
        let clock_s = clock_s.user_s + clock_s.sys_s;
        assert!(
            (clock_s - ticks_s).abs() < 0.1,
            "clock {clock_s} s, ticks {ticks_s} s"
        );
        let cpu = ServerCpu::between(start, now, 1000, "request");
        assert!(cpu.us_per_request.expect("requests > 0") > 0.0, "{cpu:?}");
        server.stop().expect("stops");
    }

    #[tokio::test]
    async fn with_server_cpu_divides_by_the_chosen_class() {
        let child = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        // A metrics page whose allocation counter rises by 600 between the two reads of each
        // measurement.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = listener.local_addr().expect("bound").to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            for count in [1000, 1600, 5000, 5600] {
                let (mut stream, _) = listener.accept().await.expect("accept");
                let mut head = [0u8; 1024];
                let _ = stream.read(&mut head).await.expect("request");
                let body = format!("go_memstats_mallocs_total {count}\n");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.expect("answer");
            }
        });
        let server = Server {
            label: "sleep".into(),
            child: Some(child),
            endpoint,
            log_path: PathBuf::new(),
        };
        let class = |name: &str, total: u64, errors: u64| report::ClassSummary {
            name: name.into(),
            total,
            errors,
            ..Default::default()
        };
        let watch = Summary {
            classes: vec![class("watch", 500, 0), class("put", 5, 0)],
            ..Default::default()
        };
        let measured = with_server_cpu(&server, PER_EVENT, async { Ok(watch) })
            .await
            .expect("measured");
        let cpu = measured.server_cpu.expect("filled in");
        assert_eq!((cpu.requests, cpu.per.as_str()), (500, "delivered event"));
        assert_eq!(
            (cpu.allocations, cpu.allocations_per_request),
            (Some(600), Some(1.2))
        );
        let put = Summary {
            classes: vec![class("put", 100, 10)],
            ..Default::default()
        };
        let measured = with_server_cpu(&server, PER_REQUEST, async { Ok(put) })
            .await
            .expect("measured");
        let cpu = measured.server_cpu.expect("filled in");
        assert_eq!(cpu.requests, 90, "only successful requests count");
        // A sleeping process uses (next to) no CPU: the figure is small, not made up.
        assert!(
            cpu.us_per_request.expect("requests > 0") < 10_000.0,
            "{cpu:?}"
        );
        server.stop().expect("stops");
    }

    #[test]
    fn disk_floor_writes_and_syncs() {
        // The crate's own directory is on the real filesystem (not tmpfs, which refuses O_DIRECT).
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let histogram =
            measure_disk_floor(dir, 20).expect("O_DIRECT works on the build filesystem");
        assert_eq!(histogram.len(), 20);
        assert!(histogram.min() >= 1);
        let leftover = std::fs::read_dir(dir)
            .expect("readable")
            .filter_map(|e| e.ok())
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("keel-bench-floor")
            });
        assert!(!leftover, "the floor file is removed");
        assert!(measure_disk_floor(dir, 0).is_err());
    }

    #[test]
    fn floors_from_before_the_loopback_was_measured_still_parse() {
        let old = r#"{"repeat":0,"ops":300,"latency_us":{"mean":40.0,"p50":39,"p90":45,"p99":60,"p999":70,"max":80}}"#;
        let floor: FloorReport = serde_json::from_str(old).expect("an old floor parses");
        assert_eq!(floor.latency_us.p50, 39);
        assert_eq!(floor.loopback_rtt_us, None);
        assert_eq!(floor.reference_put_us, None);
    }

    const REFERENCE_ROW: &str = "reference server put p50, 1 client";
    const REFERENCE_OVER_FLOOR_ROW: &str = "reference server put p50 / disk floor";

    /// The table's row whose name holds `part`.
    fn row_named<'a>(rows: &'a [Row], part: &str) -> &'a Row {
        rows.iter()
            .find(|r| r.name.contains(part))
            .unwrap_or_else(|| panic!("no row named like {part:?}"))
    }

    #[test]
    fn the_reference_over_the_floor_pairs_each_repeats_own() {
        let floor = |repeat: u32, floor_p50: u64, reference_p50: u64| FloorReport {
            repeat,
            ops: 1,
            latency_us: Percentiles {
                p50: floor_p50,
                ..Default::default()
            },
            loopback_rtt_us: None,
            reference_put_us: Some(Percentiles {
                p50: reference_p50,
                ..Default::default()
            }),
        };
        // Per repeat 1.5x, 1.2x, 2.0x: median 1.5. The medians' ratio would be 150 / 100.
        let result = CompareResult {
            floors: vec![floor(0, 100, 150), floor(1, 50, 60), floor(2, 200, 400)],
            ..fake_result(Vec::new())
        };
        let rows = table(&result);
        let best = row_named(&rows, REFERENCE_OVER_FLOOR_ROW);
        assert_eq!(best.etcd, Some(1.5));
        assert_eq!(best.etcd_spread, Some((1.2, 2.0)));
        assert_eq!(row_named(&rows, REFERENCE_ROW).etcd, Some(150.0));
    }

    #[test]
    fn loopback_round_trips_are_measured_one_by_one() {
        let histogram = measure_loopback_rtt(50).expect("loopback TCP works");
        assert_eq!(histogram.len(), 50, "one latency per round trip");
    }

    fn fake_run(system: &str, repeat: u32, put_rate: f64, p50_us: u64) -> SystemRun {
        let summary = |rate: f64, p50: u64| Summary {
            workload: "w".into(),
            classes: vec![report::ClassSummary {
                name: "watch".into(),
                throughput_per_s: rate,
                latency_us: Percentiles {
                    p50,
                    p90: p50,
                    p99: p50 * 2,
                    p999: p50 * 3,
                    max: p50 * 4,
                    mean: p50 as f64,
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        SystemRun {
            system: system.into(),
            repeat,
            memory: MemoryReport {
                keys: 10,
                rss_before_bytes: 0,
                rss_after_bytes: 1000,
                bytes_per_key: 100.0,
            },
            put_throughput: summary(put_rate, p50_us),
            put_latency: summary(put_rate, p50_us),
            range_serializable: summary(2.0 * put_rate, p50_us),
            range_linearizable: summary(put_rate, p50_us),
            watch: summary(1.0, p50_us),
            txn_put: summary(put_rate, p50_us),
            lease_keepalive: summary(3.0 * put_rate, p50_us),
            cluster_put: None,
        }
    }

    fn fake_result(runs: Vec<SystemRun>) -> CompareResult {
        CompareResult {
            started_unix_s: 0,
            etcd_bin: "etcd".into(),
            keel_bin: "keel".into(),
            keel_label: "keel".into(),
            keel_unavailable: None,
            repeats: 3,
            work_dir: "/tmp".into(),
            floors: vec![FloorReport {
                repeat: 0,
                ops: 1,
                latency_us: Percentiles {
                    p50: 100,
                    ..Default::default()
                },
                loopback_rtt_us: Some(Percentiles {
                    p50: 50,
                    ..Default::default()
                }),
                reference_put_us: Some(Percentiles {
                    p50: 200,
                    ..Default::default()
                }),
            }],
            runs,
            table: Vec::new(),
            files: Vec::new(),
        }
    }

    #[test]
    fn table_reports_medians_and_ratios() {
        let result = fake_result(vec![
            fake_run("etcd", 0, 100.0, 200),
            fake_run("etcd", 1, 300.0, 400),
            fake_run("etcd", 2, 200.0, 300),
            fake_run("keel", 0, 1000.0, 100),
            fake_run("keel", 1, 900.0, 120),
            fake_run("keel", 2, 5000.0, 110),
        ]);
        let rows = table(&result);
        let put = &rows[0];
        assert_eq!(put.etcd, Some(200.0), "median, not mean");
        assert_eq!(put.keel, Some(1000.0));
        assert_eq!(put.ratio, Some(5.0));
        let floor_ratio = rows
            .iter()
            .find(|r| r.name.contains("floor p50"))
            .expect("row");
        assert_eq!(floor_ratio.etcd, Some(3.0));
        assert_eq!(floor_ratio.keel, Some(1.1));
        // The same p50s over the disk floor plus the loopback round trip (100 + 50 us).
        let path_ratio = rows
            .iter()
            .find(|r| r.name.contains("loopback round trip) p50"))
            .expect("row");
        assert_eq!(path_ratio.etcd, Some(2.0));
        assert_eq!(path_ratio.keel, Some(110.0 / 150.0));
        let loopback = rows
            .iter()
            .find(|r| r.name.starts_with("loopback round trip p50"))
            .expect("row");
        assert_eq!(loopback.etcd, Some(50.0));
        // Over the reference server's one-client put (200 us), which itself is 2x the floor.
        let over_reference = row_named(&rows, "put p50 / reference server");
        assert_eq!(over_reference.etcd, Some(1.5));
        assert_eq!(over_reference.keel, Some(110.0 / 200.0));
        assert_eq!(row_named(&rows, REFERENCE_ROW).etcd, Some(200.0));
        assert_eq!(row_named(&rows, REFERENCE_OVER_FLOOR_ROW).etcd, Some(2.0));
        // The loaded put's p99 (here twice each run's p50), median over the repeats.
        let p99 = rows
            .iter()
            .find(|r| r.name.contains("put latency p99 (1000 clients)"))
            .expect("row");
        assert_eq!((p99.etcd, p99.keel), (Some(600.0), Some(220.0)));
        assert_eq!(p99.target, "<= 0.5x");
        let ls = rows
            .iter()
            .find(|r| r.name.starts_with("linearizable /"))
            .expect("row");
        assert_eq!(ls.keel, Some(0.5));
        let text = to_text(&CompareResult {
            table: rows,
            ..result
        });
        assert!(text.contains("5.00x"), "{text}");
    }

    #[test]
    fn table_reports_the_three_member_rows() {
        // A run with its cluster: `put_rate` puts/s on three members, `us` CPU per put summed
        // over members that cost 50 %, 30 % and 20 % of it.
        let with_cluster = |system: &str, repeat: u32, one_member_rate: f64, rate: f64, us: f64| {
            let mut run = fake_run(system, repeat, one_member_rate, 200);
            let mut put = fake_run(system, repeat, rate, 300).put_throughput;
            put.server_cpu = Some(ServerCpu::between(
                CpuTimes::default(),
                CpuTimes {
                    user_s: us,
                    sys_s: 0.0,
                },
                1_000_000,
                "request",
            ));
            run.cluster_put = Some(ClusterPut {
                members: 3,
                put,
                member_us_per_put: vec![us * 0.5, us * 0.3, us * 0.2],
            });
            run
        };
        let result = fake_result(vec![
            with_cluster("etcd", 0, 100.0, 50.0, 150.0),
            with_cluster("etcd", 1, 120.0, 60.0, 130.0),
            with_cluster("keel", 0, 300.0, 240.0, 30.0),
            with_cluster("keel", 1, 300.0, 240.0, 34.0),
        ]);
        let rows = table(&result);
        let find = |name: &str| {
            rows.iter()
                .find(|r| r.name.contains(name))
                .unwrap_or_else(|| panic!("no row {name}"))
        };
        let throughput = find("three members: put throughput");
        assert_eq!(
            (throughput.etcd, throughput.keel),
            (Some(55.0), Some(240.0))
        );
        let cpu = find("server CPU per put, summed over the members");
        assert_eq!((cpu.etcd, cpu.keel), (Some(140.0), Some(32.0)));
        assert_eq!(cpu.target, "<= 0.2x");
        assert_eq!(cpu.etcd_spread, Some((130.0, 150.0)));
        // etcd keeps half of its one-member rate on three members, Keel 0.8 of it: Keel's lead
        // grows, so the row's ratio is above 1.
        let kept = find("three members / one member");
        assert_eq!((kept.etcd, kept.keel), (Some(0.5), Some(0.8)));
        assert!(
            kept.ratio.is_some_and(|r| (r - 1.6).abs() < 1e-9),
            "{kept:?}"
        );
        let text = to_text(&CompareResult {
            table: rows.clone(),
            ..result
        });
        assert!(
            text.contains("keel repeat 1: 3 members, server CPU us per put: 34.00 summed (17.00 / 10.20 / 6.80)"),
            "{text}"
        );
        // Without the cluster (`--cluster-put-total 0`) the rows stay, with nothing in them.
        let without = table(&fake_result(vec![
            fake_run("etcd", 0, 100.0, 200),
            fake_run("keel", 0, 300.0, 100),
        ]));
        let cpu = without
            .iter()
            .find(|r| r.name.contains("summed over the members"))
            .expect("row");
        assert_eq!((cpu.etcd, cpu.keel, cpu.ratio), (None, None, None));
    }

    #[test]
    fn table_reports_server_cpu_per_request_with_spread() {
        let with_cpu = |system: &str, repeat: u32, us: f64| {
            let mut run = fake_run(system, repeat, 100.0, 200);
            let cpu = ServerCpu {
                user_s: us,
                sys_s: 0.0,
                requests: 1_000_000,
                per: "request".into(),
                us_per_request: Some(us),
                allocations: Some((us * 3e6) as u64),
                allocations_per_request: Some(us * 3.0),
            };
            for summary in [
                &mut run.put_throughput,
                &mut run.put_latency,
                &mut run.txn_put,
                &mut run.range_serializable,
                &mut run.range_linearizable,
                &mut run.lease_keepalive,
                &mut run.watch,
            ] {
                summary.server_cpu = Some(cpu.clone());
            }
            run
        };
        let result = fake_result(vec![
            with_cpu("etcd", 0, 40.0),
            with_cpu("keel", 0, 12.0),
            with_cpu("keel", 1, 8.0),
            with_cpu("etcd", 1, 60.0),
            with_cpu("etcd", 2, 50.0),
            with_cpu("keel", 2, 10.0),
        ]);
        let rows = table(&result);
        let rows_named =
            |what: &str| -> Vec<&Row> { rows.iter().filter(|r| r.name.contains(what)).collect() };
        // The three-member row has its own test (these runs have no cluster).
        let cpu_rows: Vec<&Row> = rows_named("server CPU per")
            .into_iter()
            .filter(|r| !r.name.contains("summed over the members"))
            .collect();
        assert_eq!(cpu_rows.len(), 7, "one per workload");
        for row in &cpu_rows {
            assert_eq!(row.unit, "us");
            // Issue #15's targets: ranges an eighth of etcd's, the rest a fifth; the
            // one-client put's CPU has none.
            let target = match row.name.as_str() {
                name if name.contains("range") => "<= 0.125x",
                name if name.contains("1 client") => "",
                _ => "<= 0.2x",
            };
            assert_eq!(row.target, target, "{}", row.name);
            assert_eq!(
                (row.etcd, row.keel),
                (Some(50.0), Some(10.0)),
                "{}",
                row.name
            );
            assert_eq!(row.ratio, Some(0.2));
            assert_eq!(row.etcd_spread, Some((40.0, 60.0)));
            assert_eq!(row.keel_spread, Some((8.0, 12.0)));
        }
        let allocation_rows = rows_named("server heap allocations per");
        assert_eq!(
            allocation_rows.len(),
            6,
            "one per workload but the 1-client put"
        );
        for row in &allocation_rows {
            assert_eq!(row.unit, "allocs");
            assert_eq!(
                (row.etcd, row.keel, row.ratio),
                (Some(150.0), Some(30.0), Some(0.2))
            );
        }
        // Each workload's CPU row follows its throughput or latency row.
        let position = |name: &str| rows.iter().position(|r| r.name.contains(name));
        assert_eq!(
            position("server CPU per put (1000 clients)"),
            position("put throughput").map(|p| p + 1)
        );
        let text = to_text(&CompareResult {
            table: rows,
            ..result
        });
        assert!(text.contains("40.00-60.00"), "{text}");
        assert!(text.contains("8.00-12.00"), "{text}");
        assert!(text.contains("0.20x"), "{text}");
        assert!(
            text.contains("keel repeat 1: server CPU us per request: put 8.00, put-1c 8.00"),
            "{text}"
        );
        // Results written before these rows existed still load: the new rows read n/a.
        let mut old = serde_json::to_value(with_cpu("etcd", 0, 1.0)).expect("serializes");
        let map = old.as_object_mut().expect("object");
        map.remove("txn_put");
        map.remove("lease_keepalive");
        let old: SystemRun = serde_json::from_value(old).expect("old results parse");
        assert_eq!(server_us(&old.txn_put), None);
    }

    #[test]
    fn heap_allocations_are_read_from_either_servers_metrics() {
        let keel = "# HELP keel_heap_allocations_total x\n\
            # TYPE keel_heap_allocations_total counter\n\
            keel_heap_allocations_total{thread=\"shard\"} 100\n\
            keel_heap_allocations_total{thread=\"raft_core\"} 20\n\
            keel_heap_allocations_total{thread=\"other\"} 3\n\
            keel_heap_allocated_bytes_total{thread=\"shard\"} 999\n";
        assert_eq!(parse_heap_allocations(keel), Some(123));
        let go = "go_memstats_frees_total 5\ngo_memstats_mallocs_total 1.2345678e+07\n";
        assert_eq!(parse_heap_allocations(go), Some(12_345_678));
        assert_eq!(
            parse_heap_allocations("process_cpu_seconds_total 1\n"),
            None
        );

        let cpu = |requests| {
            ServerCpu::between(
                CpuTimes::default(),
                CpuTimes::default(),
                requests,
                "request",
            )
        };
        let with = cpu(40).with_allocations(Some(1000), Some(1500));
        assert_eq!(
            (with.allocations, with.allocations_per_request),
            (Some(500), Some(12.5))
        );
        let nothing_served = cpu(0).with_allocations(Some(1000), Some(1500));
        assert_eq!(nothing_served.allocations_per_request, None);
        let unread = cpu(40).with_allocations(None, Some(1500));
        assert_eq!(
            (unread.allocations, unread.allocations_per_request),
            (None, None)
        );
    }

    #[test]
    fn table_without_keel_has_no_ratios_and_chart_draws() {
        let mut result = fake_result(vec![fake_run("etcd", 0, 100.0, 200)]);
        result.keel_unavailable = Some("no Keel binary at /x/keel".into());
        result.table = table(&result);
        assert!(result
            .table
            .iter()
            .all(|r| r.keel.is_none() && r.ratio.is_none()));
        let text = to_text(&result);
        assert!(text.contains("keel unavailable: no Keel binary"), "{text}");
        let dir = std::env::temp_dir().join(format!("keel-bench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let svg = dir.join("c.svg");
        draw_chart(&result, &svg).expect("chart draws");
        let body = std::fs::read_to_string(&svg).expect("svg written");
        assert!(
            body.starts_with("<svg") && body.contains("etcd put 1000c"),
            "{}",
            &body[..200.min(body.len())]
        );
        // Each throughput group is named once over its bars and once in the latency legend.
        for group in [
            "put 1000c",
            "put 1c",
            "txn-put",
            "range s",
            "range l",
            "keepalive",
        ] {
            assert!(body.matches(group).count() >= 2, "{group} label missing");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
