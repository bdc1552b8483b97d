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

struct ClientResult {
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
    assert!(!class_names.is_empty());
    assert!(!ops.is_empty(), "a run needs at least one client");
    let clients = ops.len();
    let classes = class_names.len();
    let next = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(workload, total);
    let cpu_start = CpuTimes::now();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for mut op in ops {
        let next = next.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut result = ClientResult {
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
                        report::record_latency(&mut result.histograms[class], sent_at.elapsed())
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
    for task in tasks {
        let result = task.await.expect("client tasks do not panic");
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
    summary
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
