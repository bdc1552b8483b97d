//! The load driver: N clients issue `total` requests between them, closed or open loop.
//!
//! Closed loop (etcd's default): each client sends its next request when its previous one
//! returns, and latency is measured from the send. Open loop (`--rate R`): request i is due at
//! `start + i / R`; a client sleeps until the request is due and latency is measured from that
//! intended time, so time spent waiting for a free client behind a slow server is counted
//! (no coordinated omission).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::client::Connection;
use crate::progress::Progress;
use crate::report::{self, CpuTimes, CpuUsage, Summary};
use crate::Error;

/// When requests are sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    ClosedLoop,
    OpenLoop { rate_per_s: f64 },
}

impl Schedule {
    /// etcd's convention: rate 0 means no limit.
    pub fn from_rate(rate_per_s: f64) -> Schedule {
        assert!(rate_per_s >= 0.0 && rate_per_s.is_finite());
        if rate_per_s == 0.0 {
            Schedule::ClosedLoop
        } else {
            Schedule::OpenLoop { rate_per_s }
        }
    }

    /// When request `index` is due, relative to the start of the run.
    pub fn due_offset(self, index: u64) -> Option<Duration> {
        match self {
            Schedule::ClosedLoop => None,
            Schedule::OpenLoop { rate_per_s } => {
                Some(Duration::from_secs_f64(index as f64 / rate_per_s))
            }
        }
    }

    /// The requested rate, or None for closed loop.
    pub fn rate(self) -> Option<f64> {
        match self {
            Schedule::ClosedLoop => None,
            Schedule::OpenLoop { rate_per_s } => Some(rate_per_s),
        }
    }
}

/// One client's request generator. `call(i)` performs request number `i` (0-based, unique
/// across clients) and says which class (index into the class names) it belongs to.
pub trait Op: Send + 'static {
    fn call(&mut self, index: u64) -> impl Future<Output = (usize, Result<(), Error>)> + Send;
}

/// Opens `conns` connections, spread round-robin over `endpoints`.
pub async fn connect_all(endpoints: &[String], conns: usize) -> Result<Vec<Connection>, Error> {
    if conns == 0 || endpoints.is_empty() {
        return Err(Error::InvalidArgument(
            "need at least one connection and one endpoint".into(),
        ));
    }
    let mut connections = Vec::with_capacity(conns);
    for i in 0..conns {
        connections.push(Connection::connect(&endpoints[i % endpoints.len()]).await?);
    }
    assert_eq!(connections.len(), conns);
    Ok(connections)
}

/// How every run of this process goes beyond its workload's own flags (`--latency-log`,
/// `--warmup`); set once, before any run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Write one line per successful request here: "CLIENT START_US LATENCY_US", START_US
    /// from the run's start. A histogram says how long the slow requests took, not when they
    /// ran or on which client: this says whether a tail is a stall (slow requests together
    /// in time) or unfairness (slow clients).
    pub latency_log: Option<std::path::PathBuf>,
    /// Requests each client sends before the run starts, neither timed nor counted. The
    /// first requests of a run meet cold connections and a load generator still starting
    /// its clients: without a warm-up they are a run's slowest, for any server.
    pub warmup_per_client: u64,
}

static RUN_OPTIONS: std::sync::OnceLock<RunOptions> = std::sync::OnceLock::new();

pub fn set_run_options(options: RunOptions) {
    let set = RUN_OPTIONS.set(options);
    assert!(set.is_ok(), "the run options are set once");
}

/// One successful request, as the latency log writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyRecord {
    pub client: usize,
    pub start_us: u64,
    pub latency_us: u64,
}

pub fn write_latency_log(path: &std::path::Path, records: &[LatencyRecord]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in records {
        writeln!(out, "{} {} {}", r.client, r.start_us, r.latency_us)?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()
}

struct ClientResult {
    /// Filled only when a latency log is asked for; at most one entry per request.
    records: Vec<LatencyRecord>,
    histograms: Vec<Histogram<u64>>,
    errors: Vec<u64>,
    first_errors: Vec<Option<String>>,
}

/// Runs `ops` (one per client) until `total` requests are done and summarizes the run.
pub async fn run_load<O: Op>(
    workload: &str,
    conns: usize,
    class_names: &[&str],
    ops: Vec<O>,
    total: u64,
    schedule: Schedule,
) -> Summary {
    let options = RUN_OPTIONS.get().cloned().unwrap_or_default();
    let ops = warm_up(ops, options.warmup_per_client, total).await;
    let log = options.latency_log.as_deref();
    let (summary, records) = run_load_logged(
        workload,
        conns,
        class_names,
        ops,
        total,
        schedule,
        log.is_some(),
    )
    .await;
    if let Some(path) = log {
        if let Err(error) = write_latency_log(path, &records) {
            eprintln!(
                "keel-bench: cannot write the latency log {}: {error}",
                path.display()
            );
        }
    }
    summary
}

/// Each client sends `per_client` requests, all clients at once, and the run waits for all
/// of them. Their indices follow the run's own (from `total` on), so a workload that names
/// keys by index writes the same kind of keys. Their outcomes are dropped: a server that
/// fails them fails the run's requests too, and those are counted.
async fn warm_up<O: Op>(ops: Vec<O>, per_client: u64, total: u64) -> Vec<O> {
    if per_client == 0 {
        return ops;
    }
    let mut tasks = Vec::with_capacity(ops.len());
    for (client, mut op) in ops.into_iter().enumerate() {
        let first = total + client as u64 * per_client;
        tasks.push(tokio::spawn(async move {
            for index in first..first + per_client {
                let _ = op.call(index).await;
            }
            op
        }));
    }
    let mut warmed = Vec::with_capacity(tasks.len());
    for task in tasks {
        warmed.push(task.await.expect("client tasks do not panic"));
    }
    warmed
}

async fn run_load_logged<O: Op>(
    workload: &str,
    conns: usize,
    class_names: &[&str],
    ops: Vec<O>,
    total: u64,
    schedule: Schedule,
    logging: bool,
) -> (Summary, Vec<LatencyRecord>) {
    assert!(!class_names.is_empty());
    assert!(!ops.is_empty(), "a run needs at least one client");
    let clients = ops.len();
    let classes = class_names.len();
    let next = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(workload, total);
    let cpu_start = CpuTimes::now();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for (client, mut op) in ops.into_iter().enumerate() {
        let next = next.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut result = ClientResult {
                records: Vec::new(),
                histograms: (0..classes).map(|_| report::new_histogram()).collect(),
                errors: vec![0; classes],
                first_errors: vec![None; classes],
            };
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= total {
                    break;
                }
                let sent_at = match schedule.due_offset(index) {
                    Some(offset) => {
                        let due = start + offset;
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    None => Instant::now(),
                };
                let (class, outcome) = op.call(index).await;
                assert!(class < classes, "op returned class {class} of {classes}");
                match outcome {
                    Ok(()) => {
                        let latency = sent_at.elapsed();
                        if logging {
                            result.records.push(LatencyRecord {
                                client,
                                start_us: sent_at.saturating_duration_since(start).as_micros()
                                    as u64,
                                latency_us: latency.as_micros() as u64,
                            });
                        }
                        report::record_latency(&mut result.histograms[class], latency)
                    }
                    Err(error) => {
                        result.errors[class] += 1;
                        if result.first_errors[class].is_none() {
                            result.first_errors[class] = Some(error.to_string());
                        }
                    }
                }
                progress.add(1);
            }
            result
        }));
    }
    let mut histograms: Vec<Histogram<u64>> =
        (0..classes).map(|_| report::new_histogram()).collect();
    let mut errors = vec![0u64; classes];
    let mut first_errors: Vec<Option<String>> = vec![None; classes];
    let mut records = Vec::new();
    for task in tasks {
        let mut result = task.await.expect("client tasks do not panic");
        records.append(&mut result.records);
        for class in 0..classes {
            histograms[class]
                .add(&result.histograms[class])
                .expect("histograms share bounds");
            errors[class] += result.errors[class];
            if first_errors[class].is_none() {
                first_errors[class] = result.first_errors[class].clone();
            }
        }
    }
    let elapsed = start.elapsed();
    let client_cpu = CpuUsage::between(cpu_start, CpuTimes::now(), elapsed);
    progress.finish();
    let summary = Summary {
        workload: workload.to_string(),
        elapsed_s: elapsed.as_secs_f64(),
        clients,
        conns,
        rate_per_s: schedule.rate(),
        classes: class_names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                report::summarize_class(
                    name,
                    &histograms[i],
                    errors[i],
                    first_errors[i].take(),
                    elapsed,
                )
            })
            .collect(),
        client_cpu,
        // Only compare knows the server process; it fills this in.
        server_cpu: None,
    };
    assert_eq!(
        summary.classes.iter().map(|c| c.total).sum::<u64>(),
        total,
        "every request is counted exactly once"
    );
    (summary, records)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sleeps a fixed time per request; class = index parity; every 10th request fails.
    struct FakeOp {
        service: Duration,
    }

    impl Op for FakeOp {
        async fn call(&mut self, index: u64) -> (usize, Result<(), Error>) {
            tokio::time::sleep(self.service).await;
            let outcome = if index % 10 == 9 {
                Err(Error::Timeout(format!("request {index}")))
            } else {
                Ok(())
            };
            ((index % 2) as usize, outcome)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_loop_counts_every_request_once() {
        let ops = (0..4)
            .map(|_| FakeOp {
                service: Duration::from_millis(1),
            })
            .collect();
        let summary = run_load("fake", 1, &["even", "odd"], ops, 200, Schedule::ClosedLoop).await;
        let even = summary.class("even").expect("class exists");
        let odd = summary.class("odd").expect("class exists");
        assert_eq!(even.total + odd.total, 200);
        assert_eq!(even.errors, 0, "9 mod 10 is odd");
        assert_eq!(odd.errors, 20);
        assert!(odd
            .first_error
            .as_deref()
            .is_some_and(|e| e.contains("request")));
        assert!(even.latency_us.p50 >= 1000, "{:?}", even.latency_us);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_measures_from_the_intended_time() {
        // One client, 20 ms service time, asked for 200 req/s: the server can do only 50/s, so
        // requests queue and the latency must grow far beyond the 20 ms service time.
        let ops = vec![FakeOp {
            service: Duration::from_millis(20),
        }];
        let summary = run_load("fake", 1, &["a", "b"], ops, 20, Schedule::from_rate(200.0)).await;
        let a = summary.class("a").expect("class exists");
        assert!(
            a.latency_us.max > 200_000,
            "queueing must show: {:?}",
            a.latency_us
        );
        assert_eq!(summary.rate_per_s, Some(200.0));
        // A rate the server keeps up with paces the run instead: 20 requests at 100/s take ~0.19 s.
        let ops = vec![FakeOp {
            service: Duration::from_millis(1),
        }];
        let summary = run_load("fake", 1, &["a", "b"], ops, 20, Schedule::from_rate(100.0)).await;
        assert!(summary.elapsed_s >= 0.18, "{}", summary.elapsed_s);
        assert!(summary.class("a").expect("class").latency_us.p50 < 15_000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_latency_log_has_one_line_per_successful_request() {
        let ops = (0..3)
            .map(|_| FakeOp {
                service: Duration::from_millis(2),
            })
            .collect();
        let (summary, records) =
            run_load_logged("fake", 1, &["a", "b"], ops, 40, Schedule::ClosedLoop, true).await;
        // Requests 9, 19, 29 and 39 fail and are not logged.
        assert_eq!(records.len(), 36);
        assert_eq!(
            summary
                .classes
                .iter()
                .map(|c| c.total - c.errors)
                .sum::<u64>(),
            36
        );
        assert!(records
            .iter()
            .all(|r| r.client < 3 && r.latency_us >= 2_000));
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log");
        write_latency_log(&path, &records).expect("written");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 36);
        let first: Vec<u64> = text
            .lines()
            .next()
            .expect("a line")
            .split(' ')
            .map(|f| f.parse().expect("a number"))
            .collect();
        let r = records[0];
        assert_eq!(first, vec![r.client as u64, r.start_us, r.latency_us]);
        // Not asked for: nothing kept.
        let ops = vec![FakeOp {
            service: Duration::from_millis(1),
        }];
        let (_, records) =
            run_load_logged("fake", 1, &["a", "b"], ops, 5, Schedule::ClosedLoop, false).await;
        assert!(records.is_empty());
    }

    /// Counts its calls and remembers the indices it was given.
    struct CountingOp {
        indices: Arc<std::sync::Mutex<Vec<u64>>>,
    }

    impl Op for CountingOp {
        async fn call(&mut self, index: u64) -> (usize, Result<(), Error>) {
            self.indices.lock().expect("not poisoned").push(index);
            (0, Ok(()))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_warm_up_sends_its_requests_before_the_run_and_under_other_indices() {
        let indices = Arc::new(std::sync::Mutex::new(Vec::new()));
        let ops = (0..3)
            .map(|_| CountingOp {
                indices: indices.clone(),
            })
            .collect();
        let ops = warm_up(ops, 2, 10).await;
        let mut warm = std::mem::take(&mut *indices.lock().expect("not poisoned"));
        warm.sort_unstable();
        assert_eq!(warm, vec![10, 11, 12, 13, 14, 15]);
        let (summary, _) =
            run_load_logged("fake", 1, &["a"], ops, 10, Schedule::ClosedLoop, false).await;
        assert_eq!(summary.classes[0].total, 10);
        let mut run = std::mem::take(&mut *indices.lock().expect("not poisoned"));
        run.sort_unstable();
        assert_eq!(run, (0..10).collect::<Vec<u64>>());
        // None asked for: the ops come back untouched.
        let ops = warm_up(
            vec![CountingOp {
                indices: indices.clone(),
            }],
            0,
            10,
        )
        .await;
        assert_eq!(ops.len(), 1);
        assert!(indices.lock().expect("not poisoned").is_empty());
    }

    #[test]
    fn schedule_due_times() {
        assert_eq!(Schedule::from_rate(0.0), Schedule::ClosedLoop);
        assert_eq!(Schedule::ClosedLoop.due_offset(5), None);
        assert_eq!(
            Schedule::from_rate(4.0).due_offset(6),
            Some(Duration::from_millis(1500))
        );
    }
}
