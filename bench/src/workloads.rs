//! etcd's tools/benchmark workloads, with its flag names and defaults.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_proto::etcdserverpb::{
    compare, request_op, watch_request, Compare, LeaseGrantRequest, LeaseGrantResponse,
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest,
    WatchResponse,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::client::{self, Caller, Connection, GrpcStream};
use crate::load::{self, Op, Schedule};
use crate::progress::Progress;
use crate::report::{self, CpuTimes, CpuUsage, Summary};
use crate::Error;

/// Pre-generated keys are capped so a typo in `--key-space-size` cannot eat the machine.
pub const KEY_SPACE_BYTES_MAX: usize = 1 << 30;
/// watch-latency keeps one (revision, time) pair per delivered event until the end.
pub const WATCH_EVENTS_MAX: u64 = 20_000_000;
/// How long watch-latency waits for one put's event to reach every watcher.
pub const WATCH_DELIVERY_TIMEOUT_MS: u64 = 10_000;
/// etcd's lease-keepalive benchmark grants leases with this TTL.
const LEASE_TTL_S: i64 = 100;

/// Where and how wide: endpoints, HTTP/2 connections, concurrent clients.
#[derive(Clone, Debug)]
pub struct Target {
    pub endpoints: Vec<String>,
    pub conns: usize,
    pub clients: usize,
}

/// Which key of the key space request i writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOrder {
    /// Request i writes key i mod key-space-size.
    Sequential,
    /// Each request writes a uniformly random key of the key space.
    Random,
}

#[derive(Clone, Debug, clap::Args)]
pub struct PutArgs {
    /// Key size of put request
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size of put request
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Total number of put requests
    #[arg(long, default_value_t = 10000)]
    pub total: u64,
    /// Maximum possible keys
    #[arg(long, default_value_t = 1)]
    pub key_space_size: usize,
    /// Use sequential keys
    #[arg(long)]
    pub sequential_keys: bool,
    /// Maximum puts per second, open loop (0 is no limit, closed loop)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Attach every key to this lease (its id in decimal, or in hex as etcdctl prints it,
    /// with 0x), e.g. to revoke a lease holding millions of keys; 0 attaches none
    #[arg(long, default_value = "0", value_parser = parse_lease_id)]
    pub lease: i64,
}

/// A lease id in decimal, or in hex with 0x.
fn parse_lease_id(s: &str) -> Result<i64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?} is not a lease id: {e}"))
}

#[derive(Clone, Debug, clap::Args)]
pub struct RangeArgs {
    /// First key of the range
    pub key: String,
    /// End of the range (exclusive); empty reads one key
    pub end: Option<String>,
    /// Linearizable (l) or serializable (s)
    #[arg(long, default_value = "l")]
    pub consistency: String,
    /// Maximum keys per response (0 is no limit)
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
    /// Return only the count
    #[arg(long)]
    pub count_only: bool,
    /// Return keys without values
    #[arg(long)]
    pub keys_only: bool,
    /// Read every key with KEY as prefix (END must not be given)
    #[arg(long)]
    pub prefix: bool,
    /// Total number of range requests
    #[arg(long, default_value_t = 10000)]
    pub total: u64,
    /// Maximum range requests per second, open loop (0 is no limit)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Instead of KEY [END], each request reads one key of the first N keys `put` writes
    /// (`put --key-space-size N --key-size --put-key-size`), spread over them by request
    /// number: cold reads of a large store (0: read KEY [END])
    #[arg(long, default_value_t = 0)]
    pub random_put_keys: usize,
    /// The key size `put` wrote the keys with, for --random-put-keys
    #[arg(long, default_value_t = 8)]
    pub put_key_size: usize,
}

#[derive(Clone, Debug, clap::Args)]
pub struct TxnPutArgs {
    /// Key size of txn put
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size of txn put
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Number of puts per txn
    #[arg(long, default_value_t = 1)]
    pub txn_ops: usize,
    /// Maximum possible keys
    #[arg(long, default_value_t = 1)]
    pub key_space_size: usize,
    /// Total number of txn requests
    #[arg(long, default_value_t = 10000)]
    pub total: u64,
    /// Maximum txns per second, open loop (0 is no limit)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
}

#[derive(Clone, Debug, clap::Args)]
pub struct TxnCompareArgs {
    /// First key of the compared range (default: every key, from "\0" with END "\0")
    #[arg(long, default_value = "\0")]
    pub key: String,
    /// End of the compared range, exclusive ("\0": every key from KEY on)
    #[arg(long, default_value = "\0")]
    pub end: String,
    /// What each key's compare reads: value, version, create, mod or lease
    #[arg(long, default_value = "value")]
    pub target: String,
    /// Total number of txns
    #[arg(long, default_value_t = 1)]
    pub total: u64,
    /// Maximum txns per second, open loop (0 is no limit)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
}

#[derive(Clone, Debug, clap::Args)]
pub struct TxnMixedArgs {
    /// Key size of mixed txn
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size of mixed txn
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Maximum txns per second, open loop (0 is no limit)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Total number of txn requests
    #[arg(long, default_value_t = 10000)]
    pub total: u64,
    /// Read range end key; by default a full range query limited by --limit
    #[arg(long, default_value = "")]
    pub end_key: String,
    /// Read operation range result limit
    #[arg(long, default_value_t = 1000)]
    pub limit: i64,
    /// Maximum possible keys
    #[arg(long, default_value_t = 1)]
    pub key_space_size: usize,
    /// Linearizable (l) or serializable (s) reads
    #[arg(long, default_value = "l")]
    pub consistency: String,
    /// Read/write ops ratio
    #[arg(long, default_value_t = 1.0)]
    pub rw_ratio: f64,
}

#[derive(Clone, Debug, clap::Args)]
pub struct WatchLatencyArgs {
    /// Number of watch streams (spread over --conns connections)
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Watchers on each stream, all on the same key
    #[arg(long, default_value_t = 10)]
    pub watchers_per_stream: usize,
    /// Total number of puts (etcd's --total)
    #[arg(long, visible_alias = "total", default_value_t = 10000)]
    pub put_total: u64,
    /// Puts per second (0 is as fast as deliveries complete)
    #[arg(long, default_value_t = 100.0)]
    pub put_rate: f64,
    /// Key size of watch response
    #[arg(long, default_value_t = 32)]
    pub key_size: usize,
    /// Value size of watch response
    #[arg(long, default_value_t = 32)]
    pub val_size: usize,
    /// Watch the prefix the put key starts with (a range, as Kubernetes watches) rather than
    /// the key itself
    #[arg(long)]
    pub prefix: bool,
    /// Each watcher watches from its own start key to the end of the key space (etcdctl's
    /// --from-key), all starts before the put key: ranges that overlap without sharing a
    /// boundary, the worst case for an index of elementary intervals
    #[arg(long, conflicts_with = "prefix")]
    pub from_distinct_keys: bool,
}

#[derive(Clone, Debug, clap::Args)]
pub struct LeaseKeepaliveArgs {
    /// Total number of lease keepalive requests
    #[arg(long, default_value_t = 10000)]
    pub total: u64,
    /// Maximum keepalives per second, open loop (0 is no limit)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
}

#[derive(Clone, Debug, clap::Args)]
pub struct LeaseGrantArgs {
    /// Total number of leases to grant
    #[arg(long, default_value_t = 10000)]
    pub total: u64,
    /// TTL of each lease, in seconds
    #[arg(long, default_value_t = 3600)]
    pub ttl: i64,
    /// Maximum grants per second, open loop (0 is no limit)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
}

/// Go's `binary.PutVarint` (zig-zag, then base-128) into `buf`; returns the bytes written.
/// etcd's benchmark writes its keys this way into a zeroed buffer of --key-size bytes.
pub fn put_varint(buf: &mut [u8], value: i64) -> Option<usize> {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    let mut i = 0;
    loop {
        let byte = buf.get_mut(i)?;
        if zigzag < 0x80 {
            *byte = zigzag as u8;
            return Some(i + 1);
        }
        *byte = (zigzag as u8) | 0x80;
        zigzag >>= 7;
        i += 1;
    }
}

/// The keys etcd's benchmark would use for indices `0..count`, each `key_size` bytes.
pub fn key_space(key_size: usize, count: usize) -> Result<Arc<Vec<Bytes>>, Error> {
    if count == 0 {
        return Err(Error::InvalidArgument(
            "expected positive --key-space-size".into(),
        ));
    }
    if key_size.saturating_mul(count) > KEY_SPACE_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "--key-size {key_size} x --key-space-size {count} exceeds {KEY_SPACE_BYTES_MAX} bytes"
        )));
    }
    let mut keys = Vec::with_capacity(count);
    let mut buf = vec![0u8; key_size];
    for i in 0..count {
        buf.fill(0);
        let index = i64::try_from(i).expect("count is bounded by KEY_SPACE_BYTES_MAX");
        if put_varint(&mut buf, index).is_none() {
            return Err(Error::InvalidArgument(format!(
                "--key-size {key_size} cannot hold key index {i}; raise --key-size"
            )));
        }
        keys.push(Bytes::copy_from_slice(&buf));
    }
    assert_eq!(keys.len(), count);
    Ok(Arc::new(keys))
}

/// `len` random bytes, as etcd's mustRandBytes.
pub fn random_bytes(rng: &mut StdRng, len: usize) -> Bytes {
    let mut buf = vec![0u8; len];
    rng.fill_bytes(&mut buf);
    Bytes::from(buf)
}

/// The range end that selects every key with `key` as prefix (etcd's GetPrefixRangeEnd).
pub fn prefix_range_end(key: &[u8]) -> Bytes {
    let mut end = key.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return Bytes::from(end);
        }
        end.pop();
    }
    // Every byte was 0xff: no upper bound, which etcd spells "\0".
    Bytes::from_static(b"\0")
}

/// Serializable reads are answered by the local member; linearizable ones go through consensus.
pub fn parse_consistency(flag: &str) -> Result<bool, Error> {
    match flag {
        "l" => Ok(false),
        "s" => Ok(true),
        other => Err(Error::InvalidArgument(format!(
            "--consistency {other:?}: want l (linearizable) or s (serializable)"
        ))),
    }
}

fn check_rate(rate_per_s: f64) -> Result<Schedule, Error> {
    if !(rate_per_s >= 0.0 && rate_per_s.is_finite()) {
        return Err(Error::InvalidArgument(format!("--rate {rate_per_s}")));
    }
    Ok(Schedule::from_rate(rate_per_s))
}

fn check_target(target: &Target) -> Result<(), Error> {
    if target.clients == 0 || target.conns == 0 || target.endpoints.is_empty() {
        return Err(Error::InvalidArgument(
            "--clients, --conns and --endpoints must be non-empty".into(),
        ));
    }
    Ok(())
}

async fn callers(target: &Target) -> Result<Vec<Caller>, Error> {
    check_target(target)?;
    let connections = load::connect_all(&target.endpoints, target.conns).await?;
    Ok((0..target.clients)
        .map(|i| Caller::new(&connections[i % connections.len()]))
        .collect())
}

struct PutOp {
    caller: Caller,
    keys: Arc<Vec<Bytes>>,
    order: KeyOrder,
    rng: StdRng,
    request: PutRequest,
}

impl Op for PutOp {
    async fn call(&mut self, index: u64) -> (usize, Result<(), Error>) {
        let n = self.keys.len();
        let k = match self.order {
            KeyOrder::Sequential => (index % n as u64) as usize,
            KeyOrder::Random => self.rng.gen_range(0..n),
        };
        self.request.key = self.keys[k].clone();
        let result = self
            .caller
            .unary::<_, PutResponse>(client::KV_PUT, &self.request)
            .await;
        (0, result.map(|_| ()))
    }
}

/// `put`: writes `total` keys of the key space.
pub async fn put(target: &Target, args: &PutArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    let keys = key_space(args.key_size, args.key_space_size)?;
    let mut rng = StdRng::seed_from_u64(0x6b65_656c);
    let value = random_bytes(&mut rng, args.val_size);
    let order = if args.sequential_keys {
        KeyOrder::Sequential
    } else {
        KeyOrder::Random
    };
    let ops: Vec<PutOp> = callers(target)
        .await?
        .into_iter()
        .enumerate()
        .map(|(i, caller)| PutOp {
            caller,
            keys: keys.clone(),
            order,
            rng: StdRng::seed_from_u64(i as u64),
            request: PutRequest {
                value: value.clone(),
                lease: args.lease,
                ..Default::default()
            },
        })
        .collect();
    Ok(load::run_load("put", target.conns, &["put"], ops, args.total, schedule).await)
}

struct RangeOp {
    caller: Caller,
    request: RangeRequest,
    /// With --random-put-keys: the keys one of which each request reads.
    keys: Option<Arc<Vec<Bytes>>>,
}

/// The key request `index` of --random-put-keys reads: a multiplicative hash spreads request
/// numbers over the keys, so neighbouring requests read keys far apart.
fn spread_key(index: u64, keys: usize) -> usize {
    assert!(keys > 0);
    (index.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys as u64) as usize
}

impl Op for RangeOp {
    async fn call(&mut self, index: u64) -> (usize, Result<(), Error>) {
        if let Some(keys) = &self.keys {
            self.request.key = keys[spread_key(index, keys.len())].clone();
        }
        let result = self
            .caller
            .unary::<_, RangeResponse>(client::KV_RANGE, &self.request)
            .await;
        (0, result.map(|_| ()))
    }
}

/// The RangeRequest that `range` sends.
pub fn range_request(args: &RangeArgs) -> Result<RangeRequest, Error> {
    let serializable = parse_consistency(&args.consistency)?;
    if args.key.is_empty() {
        return Err(Error::InvalidArgument("range needs a non-empty KEY".into()));
    }
    let range_end = match (&args.end, args.prefix) {
        (Some(_), true) => {
            return Err(Error::InvalidArgument(
                "give either END or --prefix, not both".into(),
            ))
        }
        (Some(end), false) => Bytes::from(end.clone().into_bytes()),
        (None, true) => prefix_range_end(args.key.as_bytes()),
        (None, false) => Bytes::new(),
    };
    Ok(RangeRequest {
        key: Bytes::from(args.key.clone().into_bytes()),
        range_end,
        limit: args.limit,
        serializable,
        keys_only: args.keys_only,
        count_only: args.count_only,
        ..Default::default()
    })
}

/// `range`: reads KEY [END] `total` times.
pub async fn range(target: &Target, args: &RangeArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    let mut request = range_request(args)?;
    let keys = match args.random_put_keys {
        0 => None,
        n => {
            request.range_end = Bytes::new();
            Some(key_space(args.put_key_size, n)?)
        }
    };
    let ops: Vec<RangeOp> = callers(target)
        .await?
        .into_iter()
        .map(|caller| RangeOp {
            caller,
            request: request.clone(),
            keys: keys.clone(),
        })
        .collect();
    Ok(load::run_load("range", target.conns, &["range"], ops, args.total, schedule).await)
}

struct TxnPutOp {
    caller: Caller,
    keys: Arc<Vec<Bytes>>,
    /// Built once; each call only swaps the keys of its puts.
    request: TxnRequest,
}

impl Op for TxnPutOp {
    async fn call(&mut self, index: u64) -> (usize, Result<(), Error>) {
        let ops = self.request.success.len() as u64;
        let n = self.keys.len() as u64;
        for (j, op) in self.request.success.iter_mut().enumerate() {
            let Some(request_op::Request::RequestPut(put)) = op.request.as_mut() else {
                unreachable!("txn-put builds only puts");
            };
            put.key = self.keys[((index * ops + j as u64) % n) as usize].clone();
        }
        let result = self
            .caller
            .unary::<_, TxnResponse>(client::KV_TXN, &self.request)
            .await;
        (0, result.map(|_| ()))
    }
}

/// `txn-put`: each txn puts `txn_ops` distinct keys.
pub async fn txn_put(target: &Target, args: &TxnPutArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    if args.txn_ops == 0 || args.key_space_size < args.txn_ops {
        return Err(Error::InvalidArgument(format!(
            "--txn-ops {} needs 1 <= txn-ops <= --key-space-size ({}): a txn may not put a key twice",
            args.txn_ops, args.key_space_size
        )));
    }
    let keys = key_space(args.key_size, args.key_space_size)?;
    let value = random_bytes(&mut StdRng::seed_from_u64(1), args.val_size);
    let put = RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            value,
            ..Default::default()
        })),
    };
    let request = TxnRequest {
        success: vec![put; args.txn_ops],
        ..Default::default()
    };
    let ops: Vec<TxnPutOp> = callers(target)
        .await?
        .into_iter()
        .map(|caller| TxnPutOp {
            caller,
            keys: keys.clone(),
            request: request.clone(),
        })
        .collect();
    Ok(load::run_load(
        "txn-put",
        target.conns,
        &["txn-put"],
        ops,
        args.total,
        schedule,
    )
    .await)
}

/// The value no key holds, so that a `value != this` compare holds for every key of the range.
const TXN_COMPARE_ABSENT_VALUE: &[u8] = b"keel-bench txn-compare: no key holds this value";
/// The key each txn-compare txn puts when its compares hold.
const TXN_COMPARE_PUT_KEY: &[u8] = b"keel-bench/txn-compare";

/// The txn-compare request: a compare of every key of the range that holds for each (so the
/// server evaluates all of them, reading what `target` names), then one put.
fn txn_compare_request(args: &TxnCompareArgs) -> Result<TxnRequest, Error> {
    use compare::{CompareResult, CompareTarget, TargetUnion};
    // Each compare is built to hold for every key: NOT_EQUAL to a value no key holds, or a
    // revision, version or lease no key has (-1).
    let (target, union) = match args.target.as_str() {
        "value" => (
            CompareTarget::Value,
            TargetUnion::Value(Bytes::from_static(TXN_COMPARE_ABSENT_VALUE)),
        ),
        "version" => (CompareTarget::Version, TargetUnion::Version(-1)),
        "create" => (CompareTarget::Create, TargetUnion::CreateRevision(-1)),
        "mod" => (CompareTarget::Mod, TargetUnion::ModRevision(-1)),
        "lease" => (CompareTarget::Lease, TargetUnion::Lease(-1)),
        other => {
            return Err(Error::InvalidArgument(format!(
                "--target {other:?}: expected value, version, create, mod or lease"
            )))
        }
    };
    Ok(TxnRequest {
        compare: vec![Compare {
            result: CompareResult::NotEqual as i32,
            target: target as i32,
            key: Bytes::from(args.key.clone().into_bytes()),
            range_end: Bytes::from(args.end.clone().into_bytes()),
            target_union: Some(union),
        }],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: Bytes::from_static(TXN_COMPARE_PUT_KEY),
                value: Bytes::from_static(b"done"),
                ..Default::default()
            })),
        }],
        failure: Vec::new(),
    })
}

struct TxnCompareOp {
    caller: Caller,
    request: TxnRequest,
}

impl Op for TxnCompareOp {
    async fn call(&mut self, _index: u64) -> (usize, Result<(), Error>) {
        let result = self
            .caller
            .unary::<_, TxnResponse>(client::KV_TXN, &self.request)
            .await
            .and_then(|r| match r.succeeded {
                true => Ok(()),
                // Every compare was built to hold: a failed txn means a wrong answer.
                false => Err(Error::Protocol(
                    "a txn-compare txn failed its compares, which hold for every key".into(),
                )),
            });
        (0, result)
    }
}

/// `txn-compare`: each txn compares every key of a range (by default all keys), a compare
/// that holds for each, then puts one key: the cost of a txn that walks a large range.
pub async fn txn_compare(target: &Target, args: &TxnCompareArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    let request = txn_compare_request(args)?;
    let ops: Vec<TxnCompareOp> = callers(target)
        .await?
        .into_iter()
        .map(|caller| TxnCompareOp {
            caller,
            request: request.clone(),
        })
        .collect();
    Ok(load::run_load(
        "txn-compare",
        target.conns,
        &["txn-compare"],
        ops,
        args.total,
        schedule,
    )
    .await)
}

struct TxnMixedOp {
    caller: Caller,
    keys: Arc<Vec<Bytes>>,
    rng: StdRng,
    read_probability: f64,
    read: TxnRequest,
    write: TxnRequest,
}

impl Op for TxnMixedOp {
    async fn call(&mut self, index: u64) -> (usize, Result<(), Error>) {
        let (class, request) = if self.rng.gen::<f64>() < self.read_probability {
            (0, &self.read)
        } else {
            let key = self.keys[(index % self.keys.len() as u64) as usize].clone();
            if let Some(request_op::Request::RequestPut(put)) =
                self.write.success[0].request.as_mut()
            {
                put.key = key;
            }
            (1, &self.write)
        };
        let result = self
            .caller
            .unary::<_, TxnResponse>(client::KV_TXN, request)
            .await;
        (class, result.map(|_| ()))
    }
}

/// `txn-mixed`: txns that either range (class "read") or put one key (class "write").
pub async fn txn_mixed(target: &Target, args: &TxnMixedArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    let serializable = parse_consistency(&args.consistency)?;
    if !(args.rw_ratio >= 0.0 && args.rw_ratio.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "--rw-ratio {}",
            args.rw_ratio
        )));
    }
    let keys = key_space(args.key_size, args.key_space_size)?;
    let value = random_bytes(&mut StdRng::seed_from_u64(2), args.val_size);
    // etcd's OpGet("", WithPrefix()) reads from "\0" to "\0": every key.
    let range_end = if args.end_key.is_empty() {
        Bytes::from_static(b"\0")
    } else {
        Bytes::from(args.end_key.clone().into_bytes())
    };
    let read = TxnRequest {
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end,
                limit: args.limit,
                serializable,
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let write = TxnRequest {
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                value,
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let read_probability = args.rw_ratio / (1.0 + args.rw_ratio);
    let ops: Vec<TxnMixedOp> = callers(target)
        .await?
        .into_iter()
        .enumerate()
        .map(|(i, caller)| TxnMixedOp {
            caller,
            keys: keys.clone(),
            rng: StdRng::seed_from_u64(100 + i as u64),
            read_probability,
            read: read.clone(),
            write: write.clone(),
        })
        .collect();
    Ok(load::run_load(
        "txn-mixed",
        target.conns,
        &["read", "write"],
        ops,
        args.total,
        schedule,
    )
    .await)
}

struct KeepaliveOp {
    stream: GrpcStream,
    request: LeaseKeepAliveRequest,
}

impl Op for KeepaliveOp {
    async fn call(&mut self, _index: u64) -> (usize, Result<(), Error>) {
        let result = async {
            self.stream.send(&self.request)?;
            match self.stream.recv::<LeaseKeepAliveResponse>().await? {
                Some(response) if response.ttl > 0 => Ok(()),
                Some(response) => Err(Error::Protocol(format!(
                    "lease {:x} expired (ttl {})",
                    response.id, response.ttl
                ))),
                None => Err(Error::Protocol("keepalive stream ended".into())),
            }
        }
        .await;
        (0, result)
    }
}

/// `lease-keepalive`: each client grants one lease, then sends keepalives over one stream.
pub async fn lease_keepalive(target: &Target, args: &LeaseKeepaliveArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    let mut ops = Vec::with_capacity(target.clients);
    for mut caller in callers(target).await? {
        let grant: LeaseGrantResponse = caller
            .unary(
                client::LEASE_GRANT,
                &LeaseGrantRequest {
                    ttl: LEASE_TTL_S,
                    id: 0,
                },
            )
            .await?;
        if !grant.error.is_empty() || grant.id == 0 {
            return Err(Error::Protocol(format!(
                "lease grant failed: {:?}",
                grant.error
            )));
        }
        let stream = caller.open_stream(client::LEASE_KEEPALIVE).await?;
        ops.push(KeepaliveOp {
            stream,
            request: LeaseKeepAliveRequest { id: grant.id },
        });
    }
    Ok(load::run_load(
        "lease-keepalive",
        target.conns,
        &["keepalive"],
        ops,
        args.total,
        schedule,
    )
    .await)
}

struct GrantOp {
    caller: Caller,
    request: LeaseGrantRequest,
}

impl Op for GrantOp {
    async fn call(&mut self, _index: u64) -> (usize, Result<(), Error>) {
        let result = self
            .caller
            .unary::<_, LeaseGrantResponse>(client::LEASE_GRANT, &self.request)
            .await
            .and_then(|grant| {
                if grant.error.is_empty() && grant.id != 0 {
                    Ok(())
                } else {
                    Err(Error::Protocol(format!(
                        "lease grant failed: {:?}",
                        grant.error
                    )))
                }
            });
        (0, result)
    }
}

/// `lease-grant`: grants `total` leases (the server picks the ids) and lets them live: the
/// set-up for measuring what many leases cost a server that is otherwise idle
/// (bench/scripts/leases.sh).
pub async fn lease_grant(target: &Target, args: &LeaseGrantArgs) -> Result<Summary, Error> {
    let schedule = check_rate(args.rate)?;
    let ops = callers(target)
        .await?
        .into_iter()
        .map(|caller| GrantOp {
            caller,
            request: LeaseGrantRequest {
                ttl: args.ttl,
                id: 0,
            },
        })
        .collect();
    Ok(load::run_load(
        "lease-grant",
        target.conns,
        &["grant"],
        ops,
        args.total,
        schedule,
    )
    .await)
}

/// Counts deliveries so the put loop can wait for every watcher, as etcd's benchmark does.
struct Deliveries {
    events: AtomicU64,
    notify: tokio::sync::Notify,
}

/// One watch stream's reader: returns (revision, nanoseconds since `t0`) per delivered event.
async fn read_watch_events(
    mut stream: GrpcStream,
    expected_events: u64,
    t0: Instant,
    deliveries: Arc<Deliveries>,
) -> Result<Vec<(i64, u64)>, Error> {
    let mut seen =
        Vec::with_capacity(usize::try_from(expected_events).expect("bounded by WATCH_EVENTS_MAX"));
    while (seen.len() as u64) < expected_events {
        let Some(response) = stream.recv::<WatchResponse>().await? else {
            return Err(Error::Protocol("watch stream ended early".into()));
        };
        if response.canceled {
            return Err(Error::Protocol(format!(
                "watch {} canceled: {}",
                response.watch_id, response.cancel_reason
            )));
        }
        let now_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        for event in &response.events {
            let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            seen.push((revision, now_ns));
        }
        if !response.events.is_empty() {
            deliveries
                .events
                .fetch_add(response.events.len() as u64, Ordering::AcqRel);
            deliveries.notify.notify_waiters();
        }
    }
    assert!(seen.len() as u64 >= expected_events);
    Ok(seen)
}

/// `watch-latency`: `streams` x `watchers_per_stream` watchers on one key (or its prefix).
/// Class "watch" is, per watcher and put, the time from the put's acknowledgement to the event
/// reaching that watcher (etcd's definition; an event that beats the ack counts as zero);
/// class "from-send" is the same measured from the put's (intended) send time; class "put" is
/// the put itself.
/// The next put is sent only after every watcher got the previous one (etcd's behaviour).
pub async fn watch_latency(target: &Target, args: &WatchLatencyArgs) -> Result<Summary, Error> {
    check_target(target)?;
    let schedule = check_rate(args.put_rate)?;
    let watchers = (args.streams as u64).saturating_mul(args.watchers_per_stream as u64);
    if watchers == 0 || args.put_total == 0 {
        return Err(Error::InvalidArgument(
            "--streams, --watchers-per-stream and --put-total must be positive".into(),
        ));
    }
    if watchers.saturating_mul(args.put_total) > WATCH_EVENTS_MAX {
        return Err(Error::InvalidArgument(format!(
            "{watchers} watchers x {} puts exceeds {WATCH_EVENTS_MAX} recorded events",
            args.put_total
        )));
    }
    let mut rng = StdRng::seed_from_u64(3);
    let mut key = random_bytes(&mut rng, args.key_size.max(1));
    if args.from_distinct_keys {
        // After every watcher's start key (0x01, then the watcher's number).
        key = [&[0xff_u8][..], &key].concat().into();
    }
    let value = random_bytes(&mut rng, args.val_size);
    let connections = load::connect_all(&target.endpoints, target.conns).await?;
    let t0 = Instant::now();
    let deliveries = Arc::new(Deliveries {
        events: AtomicU64::new(0),
        notify: tokio::sync::Notify::new(),
    });
    let mut readers = Vec::with_capacity(args.streams);
    for s in 0..args.streams {
        let mut caller = Caller::new(&connections[s % connections.len()]);
        let mut stream = caller.open_stream(client::WATCH).await?;
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: key.clone(),
                    range_end: if args.prefix {
                        prefix_range_end(&key)
                    } else {
                        Bytes::new()
                    },
                    ..Default::default()
                },
            )),
        };
        for j in 0..args.watchers_per_stream {
            if args.from_distinct_keys {
                let number = (s as u64) * args.watchers_per_stream as u64 + j as u64;
                stream.send(&WatchRequest {
                    request_union: Some(watch_request::RequestUnion::CreateRequest(
                        WatchCreateRequest {
                            key: [&[0x01_u8][..], &number.to_be_bytes()].concat().into(),
                            range_end: Bytes::from_static(&[0]),
                            ..Default::default()
                        },
                    )),
                })?;
            } else {
                stream.send(&create)?;
            }
        }
        for _ in 0..args.watchers_per_stream {
            match stream.recv::<WatchResponse>().await? {
                Some(r) if r.created && !r.canceled => {}
                other => {
                    return Err(Error::Protocol(format!(
                        "want a created watch response, got {other:?}"
                    )))
                }
            }
        }
        let expected = args.put_total * args.watchers_per_stream as u64;
        readers.push(tokio::spawn(read_watch_events(
            stream,
            expected,
            t0,
            deliveries.clone(),
        )));
    }
    // To stderr, so --json keeps stdout to the summary: creating many watchers is its own cost.
    eprintln!(
        "watch-latency: {watchers} watchers created in {:.3} s",
        t0.elapsed().as_secs_f64()
    );
    let put_connection: Connection = Connection::connect(&target.endpoints[0]).await?;
    let mut put_caller = Caller::new(&put_connection);
    let put_request = PutRequest {
        key,
        value,
        ..Default::default()
    };
    let mut put_histogram = report::new_histogram();
    // Per put: (revision, sent ns, acknowledged ns), all since t0.
    let mut acks: Vec<(i64, u64, u64)> = Vec::with_capacity(args.put_total as usize);
    let progress = Progress::start("watch-latency", args.put_total);
    let cpu_start = CpuTimes::now();
    let start = Instant::now();
    let mut failure: Option<Error> = None;
    for i in 0..args.put_total {
        let sent_at = match schedule.due_offset(i) {
            Some(offset) => {
                tokio::time::sleep_until((start + offset).into()).await;
                start + offset
            }
            None => Instant::now(),
        };
        let sent_ns = u64::try_from(sent_at.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
        let response: PutResponse = match put_caller.unary(client::KV_PUT, &put_request).await {
            Ok(response) => response,
            Err(error) => {
                failure = Some(error);
                break;
            }
        };
        let ack_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        report::record_latency(&mut put_histogram, sent_at.elapsed());
        let revision = response.header.map_or(0, |h| h.revision);
        acks.push((revision, sent_ns, ack_ns));
        let target_events = (i + 1) * watchers;
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(WATCH_DELIVERY_TIMEOUT_MS);
        loop {
            let notified = deliveries.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let delivered = deliveries.events.load(Ordering::Acquire);
            if delivered >= target_events {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                failure = Some(Error::Timeout(format!(
                    "put {i} (revision {revision}): {delivered} of {target_events} events delivered after {WATCH_DELIVERY_TIMEOUT_MS} ms"
                )));
                break;
            }
        }
        if failure.is_some() {
            break;
        }
        progress.add(1);
    }
    let elapsed = start.elapsed();
    progress.finish();
    if let Some(error) = failure {
        for reader in &readers {
            reader.abort();
        }
        return Err(error);
    }
    let ack_by_revision: std::collections::HashMap<i64, (u64, u64)> = acks
        .iter()
        .map(|&(revision, sent_ns, ack_ns)| (revision, (sent_ns, ack_ns)))
        .collect();
    let mut watch_histogram = report::new_histogram();
    let mut from_send_histogram = report::new_histogram();
    let mut unmatched = 0u64;
    for reader in readers {
        let seen = reader.await.expect("watch readers do not panic")?;
        for (revision, recv_ns) in seen {
            match ack_by_revision.get(&revision) {
                // An event can beat the put's own reply to the client: that counts as zero.
                Some(&(sent_ns, ack_ns)) => {
                    report::record_latency(
                        &mut watch_histogram,
                        Duration::from_nanos(recv_ns.saturating_sub(ack_ns)),
                    );
                    report::record_latency(
                        &mut from_send_histogram,
                        Duration::from_nanos(recv_ns.saturating_sub(sent_ns)),
                    );
                }
                None => unmatched += 1,
            }
        }
    }
    let client_cpu = CpuUsage::between(cpu_start, CpuTimes::now(), elapsed);
    let first_error =
        (unmatched > 0).then(|| format!("{unmatched} events for revisions no put of ours made"));
    let summary = Summary {
        workload: "watch-latency".into(),
        elapsed_s: elapsed.as_secs_f64(),
        clients: args.streams * args.watchers_per_stream,
        conns: target.conns,
        rate_per_s: schedule.rate(),
        classes: vec![
            report::summarize_class("watch", &watch_histogram, unmatched, first_error, elapsed),
            report::summarize_class("put", &put_histogram, 0, None, elapsed),
            report::summarize_class("from-send", &from_send_histogram, unmatched, None, elapsed),
        ],
        client_cpu,
        // Only compare knows the server process; it fills this in.
        server_cpu: None,
    };
    assert_eq!(summary.classes[1].total, args.put_total);
    Ok(summary)
}

/// One Range call on a fresh connection (readiness probes, tests, revision checks).
pub async fn range_once(endpoint: &str, request: &RangeRequest) -> Result<RangeResponse, Error> {
    let connection = Connection::connect(endpoint).await?;
    Caller::new(&connection)
        .unary(client::KV_RANGE, request)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_read_as_etcdctl_prints_them() {
        assert_eq!(
            parse_lease_id("0x1c91a242716eea01"),
            Ok(0x1c91_a242_716e_ea01)
        );
        assert_eq!(parse_lease_id("42"), Ok(42));
        assert!(
            parse_lease_id("1c91a242716eea01").is_err(),
            "hex needs its 0x"
        );
    }

    #[test]
    fn varint_matches_go() {
        // Values from Go's encoding/binary.PutVarint.
        let cases: [(i64, &[u8]); 5] = [
            (0, &[0]),
            (1, &[2]),
            (-1, &[1]),
            (63, &[126]),
            (64, &[128, 1]),
        ];
        for (value, want) in cases {
            let mut buf = [0u8; 10];
            let n = put_varint(&mut buf, value).expect("fits in 10 bytes");
            assert_eq!(&buf[..n], want, "PutVarint({value})");
        }
        assert_eq!(put_varint(&mut [0u8; 1], 64), None, "does not fit");
    }

    #[test]
    fn txn_compare_builds_a_compare_that_holds_for_every_key_of_the_range() {
        use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
        let args = |target: &str| TxnCompareArgs {
            key: "\0".into(),
            end: "\0".into(),
            target: target.into(),
            total: 1,
            rate: 0.0,
        };
        for (name, want) in [
            ("value", CompareTarget::Value),
            ("version", CompareTarget::Version),
            ("create", CompareTarget::Create),
            ("mod", CompareTarget::Mod),
            ("lease", CompareTarget::Lease),
        ] {
            let request = txn_compare_request(&args(name)).expect("a known target");
            assert_eq!(request.compare.len(), 1);
            let c = &request.compare[0];
            assert_eq!(c.target, want as i32, "{name}");
            assert_eq!(c.result, CompareResult::NotEqual as i32);
            assert_eq!((&c.key[..], &c.range_end[..]), (&b"\0"[..], &b"\0"[..]));
            match c.target_union.as_ref().expect("a compared value") {
                TargetUnion::Value(v) => assert_eq!(&v[..], TXN_COMPARE_ABSENT_VALUE),
                TargetUnion::Version(n)
                | TargetUnion::CreateRevision(n)
                | TargetUnion::ModRevision(n)
                | TargetUnion::Lease(n) => assert_eq!(*n, -1, "{name}"),
            }
            assert_eq!(request.success.len(), 1);
            assert!(request.failure.is_empty());
        }
        assert!(txn_compare_request(&args("values")).is_err());
    }

    #[test]
    fn key_space_is_distinct_and_bounded() {
        let keys = key_space(8, 1000).expect("fits");
        assert_eq!(keys.len(), 1000);
        assert!(keys.iter().all(|k| k.len() == 8));
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), 1000);
        assert!(key_space(1, 1000).is_err(), "index 999 needs two bytes");
        assert!(key_space(8, 0).is_err());
        assert!(
            key_space(1 << 20, 1 << 20).is_err(),
            "over KEY_SPACE_BYTES_MAX"
        );
    }

    #[test]
    fn random_put_keys_spread_over_all_keys() {
        let hits: std::collections::HashSet<usize> =
            (0..10_000).map(|i| spread_key(i, 1000)).collect();
        assert_eq!(hits.len(), 1000, "every key is read");
        assert!(
            spread_key(1, 1000).abs_diff(spread_key(2, 1000)) > 1,
            "neighbours are far apart"
        );
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_range_end(b"abc"), Bytes::from_static(b"abd"));
        assert_eq!(prefix_range_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_range_end(b"\xff\xff"), Bytes::from_static(b"\0"));
    }

    #[test]
    fn range_request_follows_flags() {
        let mut args = RangeArgs {
            key: "foo".into(),
            end: None,
            consistency: "s".into(),
            limit: 5,
            count_only: false,
            keys_only: true,
            prefix: true,
            total: 1,
            rate: 0.0,
            random_put_keys: 0,
            put_key_size: 8,
        };
        let request = range_request(&args).expect("valid");
        assert_eq!(request.range_end, Bytes::from_static(b"fop"));
        assert!(request.serializable && request.keys_only && !request.count_only);
        assert_eq!(request.limit, 5);
        args.end = Some("zzz".into());
        assert!(range_request(&args).is_err(), "END and --prefix conflict");
        args.prefix = false;
        args.consistency = "x".into();
        assert!(range_request(&args).is_err(), "bad consistency");
    }
}
