//! Results: HDR histograms in, human summary and JSON out, plus the client's own CPU use.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latencies are recorded in microseconds, up to one hour, with 3 significant digits.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// A fresh latency histogram with the crate's bounds.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, SIGNIFICANT_DIGITS)
        .expect("constant bounds are valid")
}

/// Records one latency, clamped into the histogram's range (a sub-microsecond reply counts as 1 µs).
pub fn record_latency(histogram: &mut Histogram<u64>, latency: Duration) {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(us.clamp(1, LATENCY_US_MAX));
}

/// CPU time this process spent, from getrusage(RUSAGE_SELF).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    pub user_s: f64,
    pub sys_s: f64,
}

impl CpuTimes {
    pub fn now() -> CpuTimes {
        // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is always valid.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            let rc = libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) cannot fail");
            usage
        };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        CpuTimes {
            user_s: seconds(usage.ru_utime),
            sys_s: seconds(usage.ru_stime),
        }
    }
}

/// The client's CPU use over one run, so a client bottleneck is not mistaken for a server one.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuUsage {
    pub user_s: f64,
    pub sys_s: f64,
    /// (user + sys) / wall time, in percent of one core.
    pub pct_of_one_core: f64,
    /// The same divided by the cores this process may use.
    pub pct_of_all_cores: f64,
    pub cores: usize,
}

impl CpuUsage {
    pub fn between(start: CpuTimes, end: CpuTimes, wall: Duration) -> CpuUsage {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(cores >= 1);
        let user_s = (end.user_s - start.user_s).max(0.0);
        let sys_s = (end.sys_s - start.sys_s).max(0.0);
        let wall_s = wall.as_secs_f64().max(1e-9);
        let pct_of_one_core = (user_s + sys_s) / wall_s * 100.0;
        CpuUsage {
            user_s,
            sys_s,
            pct_of_one_core,
            pct_of_all_cores: pct_of_one_core / cores as f64,
            cores,
        }
    }
}

/// The server's CPU time over one run, per request. Only `compare` fills it in: it started the
/// server, so it has the pid whose CPU clock it reads before and after the workload.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerCpu {
    pub user_s: f64,
    pub sys_s: f64,
    /// What the CPU time is divided by: successful requests, or delivered events for watch.
    pub requests: u64,
    /// "request" or "delivered event", so the figure says what it is per.
    pub per: String,
    /// (user + sys) / requests in microseconds; None when nothing succeeded (no honest figure).
    pub us_per_request: Option<f64>,
    /// Heap allocations the server made over the run, from its /metrics: Keel's
    /// `keel_heap_allocations_total` (all threads), Go's `go_memstats_mallocs_total` for etcd.
    /// None where the server exports neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<u64>,
    /// `allocations` / requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations_per_request: Option<f64>,
}

impl ServerCpu {
    pub fn between(start: CpuTimes, end: CpuTimes, requests: u64, per: &str) -> ServerCpu {
        // The total is exact (a process CPU clock), but its split into user and system time
        // follows 10 ms ticks, so over a short run one part can read as going backwards.
        // Clamp the parts, not the total: the total stays the true delta, and the figures of
        // several processes add up to their sum's. (A negative total cannot happen for one
        // live process; it is clamped to 0 so a bad read never shows as a negative cost.)
        let total_s = ((end.user_s + end.sys_s) - (start.user_s + start.sys_s)).max(0.0);
        let user_s = (end.user_s - start.user_s).clamp(0.0, total_s);
        let sys_s = total_s - user_s;
        let us_per_request = (requests > 0).then(|| (user_s + sys_s) * 1e6 / requests as f64);
        ServerCpu {
            user_s,
            sys_s,
            requests,
            per: per.to_string(),
            us_per_request,
            allocations: None,
            allocations_per_request: None,
        }
    }

    /// Adds the heap allocations between two reads of the server's allocation counter.
    pub fn with_allocations(mut self, start: Option<u64>, end: Option<u64>) -> ServerCpu {
        if let (Some(start), Some(end)) = (start, end) {
            let allocations = end.saturating_sub(start);
            self.allocations = Some(allocations);
            self.allocations_per_request =
                (self.requests > 0).then(|| allocations as f64 / self.requests as f64);
        }
        self
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        let p = Percentiles {
            mean: histogram.mean(),
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            max: histogram.max(),
        };
        assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999);
        p
    }
}

/// One class of requests in a run (most workloads have one; txn-mixed has "read" and "write").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassSummary {
    pub name: String,
    /// Requests completed (successes plus errors).
    pub total: u64,
    pub errors: u64,
    /// Successful requests per second of wall time.
    pub throughput_per_s: f64,
    pub latency_us: Percentiles,
    /// The first error seen, to say why `errors` is not zero.
    pub first_error: Option<String>,
}

/// A whole run: what `--json` prints.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub workload: String,
    pub elapsed_s: f64,
    pub clients: usize,
    pub conns: usize,
    /// Requested rate in requests per second (open loop), or None for closed loop.
    pub rate_per_s: Option<f64>,
    pub classes: Vec<ClassSummary>,
    pub client_cpu: CpuUsage,
    /// The server's CPU per request (`compare` only; absent from a plain workload's `--json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu: Option<ServerCpu>,
}

impl Summary {
    pub fn class(&self, name: &str) -> Option<&ClassSummary> {
        self.classes.iter().find(|c| c.name == name)
    }

    pub fn total_errors(&self) -> u64 {
        self.classes.iter().map(|c| c.errors).sum()
    }

    /// The human summary. `Precision::Full` prints every digit, as etcd's `--precise`.
    pub fn to_text(&self, precision: Precision) -> String {
        let ms = |us: f64| match precision {
            Precision::Full => format!("{}", us / 1000.0),
            Precision::Short => format!("{:.3}", us / 1000.0),
        };
        let mut out = String::new();
        let mode = match self.rate_per_s {
            Some(rate) => format!("open loop at {rate} req/s"),
            None => "closed loop".to_string(),
        };
        let _ = writeln!(
            out,
            "{}: {} clients over {} connections, {mode}, {:.3} s",
            self.workload, self.clients, self.conns, self.elapsed_s
        );
        for class in &self.classes {
            let l = &class.latency_us;
            let _ = writeln!(
                out,
                "  {:<8} total {}  errors {}  throughput {:.1} req/s",
                class.name, class.total, class.errors, class.throughput_per_s
            );
            let _ = writeln!(
                out,
                "  {:<8} latency ms: p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {}",
                "",
                ms(l.p50 as f64),
                ms(l.p90 as f64),
                ms(l.p99 as f64),
                ms(l.p999 as f64),
                ms(l.max as f64),
                ms(l.mean)
            );
            if let Some(error) = &class.first_error {
                let _ = writeln!(out, "  {:<8} first error: {error}", "");
            }
        }
        let cpu = &self.client_cpu;
        let _ = writeln!(
            out,
            "  client CPU: user {:.2} s + sys {:.2} s = {:.0}% of one core, {:.0}% of {} cores",
            cpu.user_s, cpu.sys_s, cpu.pct_of_one_core, cpu.pct_of_all_cores, cpu.cores
        );
        if let Some(server) = &self.server_cpu {
            let per = server
                .us_per_request
                .map_or("n/a".to_string(), |us| format!("{us:.1} µs"));
            let _ = writeln!(
                out,
                "  server CPU: user {:.2} s + sys {:.2} s over {} {}s = {per} per {}",
                server.user_s, server.sys_s, server.requests, server.per, server.per
            );
            if let Some(per_request) = server.allocations_per_request {
                let _ = writeln!(
                    out,
                    "  server heap allocations: {per_request:.1} per {}",
                    server.per
                );
            }
        }
        out
    }
}

/// How many digits the human summary prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Short,
    Full,
}

/// The class's summary from its histogram and counters.
pub fn summarize_class(
    name: &str,
    histogram: &Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
) -> ClassSummary {
    let successes = histogram.len();
    let elapsed_s = elapsed.as_secs_f64().max(1e-9);
    ClassSummary {
        name: name.to_string(),
        total: successes + errors,
        errors,
        throughput_per_s: successes as f64 / elapsed_s,
        latency_us: Percentiles::of(histogram),
        first_error,
    }
}

/// The median of `values` (mean of the middle two for an even count); None when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mid = sorted.len() / 2;
    let m = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    };
    assert!(m >= sorted[0] && m <= sorted[sorted.len() - 1]);
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_recorded_distribution() {
        let mut h = new_histogram();
        for us in 1..=1000u64 {
            record_latency(&mut h, Duration::from_micros(us));
        }
        let p = Percentiles::of(&h);
        // Three significant digits: each percentile is within 0.1% of the exact value.
        assert!((499..=501).contains(&p.p50), "{p:?}");
        assert!((899..=901).contains(&p.p90), "{p:?}");
        assert!((989..=991).contains(&p.p99), "{p:?}");
        assert!((998..=1000).contains(&p.p999), "{p:?}");
        assert!((999..=1001).contains(&p.max), "{p:?}");
        record_latency(&mut h, Duration::from_nanos(10));
        assert_eq!(h.min(), 1, "sub-microsecond latencies clamp to 1 µs");
    }

    #[test]
    fn class_summary_counts_errors_but_not_their_latency() {
        let mut h = new_histogram();
        for _ in 0..90 {
            record_latency(&mut h, Duration::from_millis(2));
        }
        let c = summarize_class("put", &h, 10, Some("boom".into()), Duration::from_secs(3));
        assert_eq!(c.total, 100);
        assert_eq!(c.errors, 10);
        assert!((c.throughput_per_s - 30.0).abs() < 1e-9);
        let text = Summary {
            workload: "put".into(),
            classes: vec![c],
            ..Default::default()
        }
        .to_text(Precision::Short);
        assert!(text.contains("p99.9 2.00"), "{text}");
        assert!(text.contains("first error: boom"), "{text}");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn server_cpu_per_request_in_microseconds() {
        let start = CpuTimes {
            user_s: 1.0,
            sys_s: 0.5,
        };
        let end = CpuTimes {
            user_s: 2.5,
            sys_s: 1.0,
        };
        let cpu = ServerCpu::between(start, end, 1000, "request");
        assert!((cpu.user_s - 1.5).abs() < 1e-9 && (cpu.sys_s - 0.5).abs() < 1e-9);
        // 2 s of CPU over 1000 requests is 2000 µs each.
        assert!((cpu.us_per_request.expect("requests > 0") - 2000.0).abs() < 1e-6);
        assert_eq!(
            ServerCpu::between(start, end, 0, "request").us_per_request,
            None
        );
        let text = Summary {
            workload: "watch-latency".into(),
            server_cpu: Some(ServerCpu::between(start, end, 4, "delivered event")),
            ..Default::default()
        }
        .to_text(Precision::Short);
        assert!(
            text.contains("over 4 delivered events = 500000.0 µs per delivered event"),
            "{text}"
        );
        // A split that moved between the reads (user time read lower at the end, as a
        // tick-based split can) keeps the exact total: 0.5 s, all of it system time.
        let moved = ServerCpu::between(
            start,
            CpuTimes {
                user_s: 0.9,
                sys_s: 1.1,
            },
            1000,
            "request",
        );
        assert_eq!(moved.user_s, 0.0);
        assert!((moved.sys_s - 0.5).abs() < 1e-9, "{moved:?}");
        assert!((moved.us_per_request.expect("requests > 0") - 500.0).abs() < 1e-6);
        let json = serde_json::to_string(&Summary::default()).expect("serializes");
        assert!(
            !json.contains("server_cpu"),
            "plain runs keep etcd's JSON shape: {json}"
        );
    }

    #[test]
    fn cpu_usage_measures_busy_work() {
        let start_cpu = CpuTimes::now();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let usage = CpuUsage::between(start_cpu, CpuTimes::now(), start.elapsed());
        // A spinning thread uses most of one core; allow for a shared, noisy machine.
        assert!(usage.pct_of_one_core > 20.0, "{usage:?}");
        assert!(usage.pct_of_all_cores <= usage.pct_of_one_core);
    }
}
