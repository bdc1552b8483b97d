//! `#[ignore]`d benchmarks, run by hand side by side with etcd 3.4:
//!
//! ```text
//! KEEL_BENCH_BIN=target/release/keel \
//!   cargo test -p keel-core --test watch_lease bench_ -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Each starts a fresh keel (the binary in KEEL_BENCH_BIN, a release build) and a fresh etcd on
//! free ports, and prints one line per server and case.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, WatchOptions};

use crate::common::{etcdctl_at, free_port};

/// A benchmark server: keel from KEEL_BENCH_BIN or etcd, killed on drop.
struct BenchServer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl BenchServer {
    fn start(program: &str) -> BenchServer {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(program)
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("server.log")).expect("a log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("{program} does not start: {e}"));
        let endpoint = format!("127.0.0.1:{client}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while etcdctl_at(&endpoint, &["endpoint", "health"], None).code != 0 {
            assert!(Instant::now() < deadline, "{program} never became healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        BenchServer {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self._dir.path().join("server.log"));
            eprintln!("server log:\n{}", log.unwrap_or_default());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn servers() -> Vec<(&'static str, String)> {
    let keel = std::env::var("KEEL_BENCH_BIN")
        .unwrap_or_else(|_| "/work/target-i5/release/keel".to_string());
    vec![("keel", keel), ("etcd", "etcd".to_string())]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    assert!(!sorted.is_empty(), "a percentile of nothing");
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Watch latency: `watchers` watchers on one key (100 per stream, streams spread over 10
/// connections); each of `puts` puts waits until every watcher got its event. Reports the
/// put's own latency (issue -> ack) and the delivery latency (issue -> event received).
async fn watch_latency(url: &str, watchers: usize, puts: usize) -> String {
    const PER_STREAM: usize = 100;
    const CONNECTIONS: usize = 10;
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(Client::connect([url], None).await.expect("connect"));
    }
    let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; puts]));
    let delivered: Arc<Vec<AtomicUsize>> =
        Arc::new((0..puts).map(|_| AtomicUsize::new(0)).collect());
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let streams = watchers.div_ceil(PER_STREAM);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let here = PER_STREAM.min(watchers - s * PER_STREAM);
        let mut c = conns[s % CONNECTIONS].clone();
        let mut stream = c.watch("bench/k", None).await.expect("watch");
        for _ in 1..here {
            stream
                .watch("bench/k", Some(WatchOptions::new()))
                .await
                .expect("watch");
        }
        let mut created = 0;
        while created < here {
            let r = stream.message().await.expect("stream").expect("created");
            assert!(r.created());
            created += 1;
        }
        let (sent, delivered, latencies) = (sent.clone(), delivered.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Ok(Some(r)) = stream.message().await {
                let now = Instant::now();
                for e in r.events() {
                    let i: usize = std::str::from_utf8(e.kv().expect("kv").value())
                        .expect("utf-8")
                        .parse()
                        .expect("a put index");
                    let at = sent.lock().expect("not poisoned")[i].expect("sent before put");
                    mine.push(now - at);
                    delivered[i].fetch_add(1, Ordering::SeqCst);
                }
                if mine.len() >= here * puts {
                    break;
                }
            }
            latencies.lock().expect("not poisoned").extend(mine);
        }));
    }
    let mut writer = conns[0].clone();
    let mut put_lat = Vec::new();
    for i in 0..puts {
        let t0 = Instant::now();
        sent.lock().expect("not poisoned")[i] = Some(t0);
        writer
            .put("bench/k", i.to_string(), None)
            .await
            .expect("put");
        put_lat.push(t0.elapsed());
        let deadline = Instant::now() + Duration::from_secs(30);
        while delivered[i].load(Ordering::SeqCst) < watchers {
            assert!(Instant::now() < deadline, "events lost at put {i}");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    for t in tasks {
        t.await.expect("watch task");
    }
    let mut lat = latencies.lock().expect("not poisoned").clone();
    assert_eq!(lat.len(), watchers * puts);
    lat.sort();
    put_lat.sort();
    format!(
        "watchers={watchers:>5} puts={puts}: put p50 {:?}; delivery p50 {:?} p99 {:?} max {:?}",
        percentile(&put_lat, 0.5),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().expect("non-empty"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --ignored"]
async fn bench_watch_latency() {
    for (name, program) in servers() {
        let server = BenchServer::start(&program);
        for (watchers, puts) in [(1, 200), (1000, 50), (10_000, 20)] {
            let line = watch_latency(&server.url, watchers, puts).await;
            println!("{name}: {line}");
        }
    }
}

/// Keep-alive throughput: `leases` leases, each with its own keep-alive stream, each stream
/// sending one request and waiting for its reply in a loop, for `seconds`.
async fn keepalive_throughput(url: &str, leases: usize, seconds: u64) -> String {
    let c = Client::connect([url], None).await.expect("connect");
    let mut tasks = Vec::new();
    let stop = Instant::now() + Duration::from_secs(seconds);
    for _ in 0..leases {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let id = c.lease_grant(60, None).await.expect("grant").id();
            let (mut keeper, mut replies) = c.lease_keep_alive(id).await.expect("keep alive");
            let mut n = 0u64;
            while Instant::now() < stop {
                keeper.keep_alive().await.expect("request");
                let r = replies.message().await.expect("stream").expect("reply");
                assert_eq!(r.ttl(), 60);
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("keep-alive task");
    }
    format!(
        "leases={leases}: {total} keep-alives in {seconds} s = {:.0}/s",
        total as f64 / seconds as f64
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --ignored"]
async fn bench_lease_keepalive_throughput() {
    for (name, program) in servers() {
        let server = BenchServer::start(&program);
        for leases in [1, 100] {
            let line = keepalive_throughput(&server.url, leases, 5).await;
            println!("{name}: {line}");
        }
    }
}
