//! Concurrent clients that record histories for the checker: each client runs on its own
//! thread with its own single-threaded tokio runtime (so a client can first move its thread
//! into a member's network namespace), talks to one member through the `etcd-client` crate,
//! and does put / linearizable get / delete / compare-and-swap on a few shared keys. A call
//! that errs or times out is recorded with an unknown outcome. Clients also write unique
//! "acked/" keys and remember which ones were acknowledged, so a test can check that none of
//! them was lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare as EtcdCompare, CompareOp, ConnectOptions, Txn, TxnOp};

use crate::netns;
use crate::porcupine::{Compare, Input, Operation, Output};

/// Most operations one client records, so a stuck test cannot grow a history without bound.
const CLIENT_OPS_MAX: usize = 20_000;

/// Where one client connects and how long it waits for each answer.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub id: usize,
    pub url: String,
    pub netns: Option<String>,
    pub timeout_ms: u64,
}

/// What one client did.
#[derive(Debug, Default)]
pub struct ClientLog {
    pub ops: Vec<Operation>,
    /// Unique keys whose put was acknowledged.
    pub acked_keys: Vec<String>,
    pub failures: usize,
    /// Calls that failed before they reached any server (connection refused): not recorded.
    pub not_sent: usize,
    /// The first few distinct error messages, for test output.
    pub error_samples: Vec<String>,
}

/// How many distinct error messages a client keeps.
const ERROR_SAMPLES_MAX: usize = 4;

/// How long a client waits after a failed call before the next one, so a member that is down
/// does not collect hundreds of unknown-outcome operations (each one widens the search).
const FAILURE_BACKOFF_MS: u64 = 200;

impl ClientLog {
    fn note_error(&mut self, text: String) {
        self.failures += 1;
        if self.error_samples.len() < ERROR_SAMPLES_MAX && !self.error_samples.contains(&text) {
            self.error_samples.push(text);
        }
    }
}

/// Whether a failed call certainly never reached a server: the TCP connection was refused, so
/// no byte of the request was sent and the operation cannot have taken effect.
fn never_sent(error: &etcd_client::Error) -> bool {
    let text = format!("{error:?}");
    text.contains("Connection refused") || text.contains("ConnectionRefused")
}

/// Running clients; [`Workload::finish`] stops them and collects their logs.
pub struct Workload {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<ClientLog>>,
}

impl Workload {
    /// Starts one thread per spec; all time stamps count from `epoch`.
    pub fn start(specs: Vec<ClientSpec>, keys: &[&str], epoch: Instant) -> Workload {
        assert!(!keys.is_empty(), "a workload needs keys");
        let stop = Arc::new(AtomicBool::new(false));
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let threads = specs
            .into_iter()
            .map(|spec| {
                let stop = stop.clone();
                let keys = keys.clone();
                std::thread::Builder::new()
                    .name(format!("client-{}", spec.id))
                    .spawn(move || run_client(spec, keys, epoch, stop))
                    .expect("a client thread starts")
            })
            .collect();
        Workload { stop, threads }
    }

    /// Stops every client after its current call and returns all logs.
    pub fn finish(mut self) -> Vec<ClientLog> {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.threads)
            .into_iter()
            .map(|t| t.join().expect("a client thread does not panic"))
            .collect()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn run_client(
    spec: ClientSpec,
    keys: Vec<String>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> ClientLog {
    if let Some(ns) = &spec.netns {
        netns::enter(ns);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime builds");
    runtime.block_on(client_loop(spec, keys, epoch, stop))
}

/// What a client last saw of a key, to aim its compare-and-swaps at a likely-current version.
#[derive(Clone, Default)]
struct Seen {
    value: Option<Vec<u8>>,
    mod_revision: i64,
}

async fn client_loop(
    spec: ClientSpec,
    keys: Vec<String>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> ClientLog {
    let timeout = Duration::from_millis(spec.timeout_ms);
    let options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    let mut log = ClientLog::default();
    let mut seen = vec![Seen::default(); keys.len()];
    // A seed per client: deterministic choices, different across clients.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (spec.id as u64 + 1).wrapping_mul(0x1000_0000_01b3);
    let mut client: Option<Client> = None;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && log.ops.len() < CLIENT_OPS_MAX {
        if client.is_none() {
            match tokio::time::timeout(
                timeout,
                Client::connect([spec.url.as_str()], Some(options.clone())),
            )
            .await
            {
                Ok(Ok(c)) => client = Some(c),
                _ => {
                    log.note_error("connect failed".to_string());
                    tokio::time::sleep(Duration::from_millis(FAILURE_BACKOFF_MS)).await;
                    continue;
                }
            }
        }
        let c = client.as_mut().expect("connected above");
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        seq += 1;
        let k = (rng >> 8) as usize % keys.len();
        let key = keys[k].clone();
        let value = format!("c{}-{seq}", spec.id).into_bytes();
        let dice = (rng >> 24) % 100;
        if dice < 5 {
            // A unique key outside the checked history: only its acknowledgement matters.
            let unique = format!("acked/c{}/{seq}", spec.id);
            match tokio::time::timeout(timeout, c.put(unique.as_str(), "v", None)).await {
                Ok(Ok(_)) => log.acked_keys.push(unique),
                Ok(Err(e)) => {
                    log.note_error(e.to_string());
                    client = None;
                }
                Err(_) => {
                    log.note_error("client timeout".to_string());
                    client = None;
                }
            }
            continue;
        }
        let input = match dice {
            5..=34 => Input::Put { value },
            35..=64 => Input::Get,
            65..=69 => Input::Delete,
            70..=89 => Input::Cas {
                compare: Compare::ModRevision(seen[k].mod_revision),
                value,
            },
            _ => Input::Cas {
                compare: match &seen[k].value {
                    Some(v) => Compare::Value(v.clone()),
                    None => Compare::ModRevision(0),
                },
                value,
            },
        };
        let call_ns = epoch.elapsed().as_nanos() as u64;
        let result = tokio::time::timeout(timeout, call(c, &key, &input)).await;
        let return_ns = epoch.elapsed().as_nanos() as u64;
        match result {
            Ok(Ok(output)) => {
                if let Output::Get { kv } = &output {
                    seen[k] = match kv {
                        Some((v, r)) => Seen {
                            value: Some(v.clone()),
                            mod_revision: *r,
                        },
                        None => Seen::default(),
                    };
                }
                log.ops.push(Operation::completed(
                    spec.id, &key, input, output, call_ns, return_ns,
                ));
            }
            Ok(Err(e)) if never_sent(&e) => {
                log.note_error(e.to_string());
                log.not_sent += 1;
                client = None;
                tokio::time::sleep(Duration::from_millis(FAILURE_BACKOFF_MS)).await;
            }
            failed => {
                let text = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "client timeout".to_string(),
                };
                log.note_error(text);
                log.ops
                    .push(Operation::unknown(spec.id, &key, input, call_ns));
                // A fresh connection after a failure, as a real client would redial.
                client = None;
                tokio::time::sleep(Duration::from_millis(FAILURE_BACKOFF_MS)).await;
            }
        }
    }
    log
}

async fn call(c: &mut Client, key: &str, input: &Input) -> Result<Output, etcd_client::Error> {
    Ok(match input {
        Input::Put { value } => {
            let r = c.put(key, value.clone(), None).await?;
            Output::Put {
                revision: r.header().map_or(0, |h| h.revision()),
            }
        }
        Input::Get => {
            let r = c.get(key, None).await?;
            Output::Get {
                kv: r
                    .kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            }
        }
        Input::Delete => {
            let r = c.delete(key, None).await?;
            Output::Delete {
                deleted: r.deleted() as u64,
            }
        }
        Input::Cas { compare, value } => {
            let cmp = match compare {
                Compare::ModRevision(r) => EtcdCompare::mod_revision(key, CompareOp::Equal, *r),
                Compare::Value(v) => EtcdCompare::value(key, CompareOp::Equal, v.clone()),
            };
            let txn = Txn::new()
                .when([cmp])
                .and_then([TxnOp::put(key, value.clone(), None)]);
            let r = c.txn(txn).await?;
            Output::Cas {
                succeeded: r.succeeded(),
                revision: r.header().map_or(0, |h| h.revision()),
            }
        }
    })
}

/// Every client's operations in one history.
pub fn history(logs: &[ClientLog]) -> Vec<Operation> {
    logs.iter().flat_map(|l| l.ops.iter().cloned()).collect()
}

/// Completed and failed operation counts, for test output.
pub fn summary(logs: &[ClientLog]) -> String {
    let ops: usize = logs.iter().map(|l| l.ops.len()).sum();
    let failures: usize = logs.iter().map(|l| l.failures).sum();
    let acked: usize = logs.iter().map(|l| l.acked_keys.len()).sum();
    let not_sent: usize = logs.iter().map(|l| l.not_sent).sum();
    let unknown = logs
        .iter()
        .flat_map(|l| l.ops.iter())
        .filter(|op| op.output == Output::Unknown)
        .count();
    let mut samples: Vec<&String> = logs.iter().flat_map(|l| l.error_samples.iter()).collect();
    samples.sort();
    samples.dedup();
    format!(
        "{ops} checked operations ({unknown} with unknown outcome), {failures} failed calls \
         ({not_sent} never sent), {acked} acknowledged unique puts; errors seen: {samples:?}"
    )
}
