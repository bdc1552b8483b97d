//! Every workload, briefly, against a real etcd 3.4 started by the test.
//!
//! These tests need `etcd` on PATH (Debian: `apt-get install etcd-server`). Without it they
//! FAIL with that message: a benchmark that was never run against a server proves nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use bytes::Bytes;
use keel_bench::client::{self, Caller, Connection};
use keel_bench::compare::{CompareResult, Server};
use keel_bench::report::Summary;
use keel_bench::workloads;
use keel_proto::etcdserverpb::{PutRequest, PutResponse, RangeRequest};

fn etcd_bin() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "etcd not found on PATH: these tests run the benchmark against a real etcd 3.4; \
                 install it (Debian: apt-get install etcd-server etcd-client)"
            )
        })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A fresh etcd on free ports in a temp dir; killed and removed on drop.
struct Etcd {
    server: Option<Server>,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Server::start(&etcd_bin(), "etcd", dir.path()).expect("etcd starts");
        runtime()
            .block_on(server.wait_ready(Duration::from_secs(30)))
            .expect("etcd answers a Range");
        Etcd {
            server: Some(server),
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        self.server.as_ref().expect("running").endpoint.clone()
    }

    fn revision(&self) -> i64 {
        let response = runtime()
            .block_on(workloads::range_once(
                &self.endpoint(),
                &RangeRequest {
                    key: Bytes::from_static(b"\0"),
                    range_end: Bytes::from_static(b"\0"),
                    count_only: true,
                    ..Default::default()
                },
            ))
            .expect("range all keys");
        response
            .header
            .expect("etcd always sends a header")
            .revision
    }

    fn count_keys(&self) -> i64 {
        runtime()
            .block_on(workloads::range_once(
                &self.endpoint(),
                &RangeRequest {
                    key: Bytes::from_static(b"\0"),
                    range_end: Bytes::from_static(b"\0"),
                    count_only: true,
                    ..Default::default()
                },
            ))
            .expect("range all keys")
            .count
    }

    fn put(&self, key: &str, value: &str) {
        let endpoint = self.endpoint();
        runtime().block_on(async {
            let connection = Connection::connect(&endpoint).await.expect("connect");
            let request = PutRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                value: Bytes::copy_from_slice(value.as_bytes()),
                ..Default::default()
            };
            let _: PutResponse = Caller::new(&connection)
                .unary(client::KV_PUT, &request)
                .await
                .expect("put");
        });
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.stop();
        }
    }
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .args(args)
        .output()
        .expect("keel-bench runs")
}

/// Runs a workload with --json and returns its parsed summary; the run must succeed.
fn bench_json(etcd: &Etcd, args: &[&str]) -> Summary {
    let endpoint = format!("http://{}", etcd.endpoint());
    let mut all = vec!["--endpoints", endpoint.as_str(), "--json"];
    all.extend_from_slice(args);
    let output = bench(&all);
    assert!(
        output.status.success(),
        "keel-bench {all:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).expect("--json prints one Summary")
}

fn assert_complete(summary: &Summary, class: &str, total: u64) {
    let c = summary
        .class(class)
        .unwrap_or_else(|| panic!("class {class} in {summary:?}"));
    assert_eq!(c.total, total, "{summary:?}");
    assert_eq!(c.errors, 0, "{summary:?}");
    assert!(
        c.latency_us.p50 > 0 && c.latency_us.p50 <= c.latency_us.max,
        "{summary:?}"
    );
    assert!(c.throughput_per_s > 0.0);
}

#[test]
fn put_sequential_keys_leave_revision_at_one_plus_total() {
    let etcd = Etcd::start();
    let summary = bench_json(
        &etcd,
        &[
            "--clients",
            "10",
            "--conns",
            "2",
            "put",
            "--total",
            "1000",
            "--sequential-keys",
            "--key-space-size",
            "1000",
            "--val-size",
            "16",
        ],
    );
    assert_complete(&summary, "put", 1000);
    assert_eq!((summary.clients, summary.conns), (10, 2));
    assert!(summary.client_cpu.user_s + summary.client_cpu.sys_s > 0.0);
    assert_eq!(
        etcd.revision(),
        1 + 1000,
        "every put made exactly one revision"
    );
    assert_eq!(
        etcd.count_keys(),
        1000,
        "sequential keys cover the key space"
    );
}

#[test]
fn range_variants_complete_without_errors() {
    let etcd = Etcd::start();
    for i in 0..20 {
        etcd.put(&format!("rk/{i:02}"), "value");
    }
    let revision = etcd.revision();
    for args in [
        &[
            "--clients",
            "4",
            "range",
            "rk/",
            "--prefix",
            "--consistency",
            "s",
            "--total",
            "300",
        ][..],
        &[
            "--clients",
            "4",
            "range",
            "rk/",
            "--prefix",
            "--keys-only",
            "--limit",
            "5",
            "--total",
            "300",
        ][..],
        &["range", "rk/", "rk/10", "--count-only", "--total", "200"][..],
        &[
            "--clients",
            "2",
            "--conns",
            "2",
            "range",
            "rk/05",
            "--total",
            "200",
        ][..],
    ] {
        let summary = bench_json(&etcd, args);
        let total = args[args.len() - 1].parse().expect("last arg is the total");
        assert_complete(&summary, "range", total);
    }
    assert_eq!(etcd.revision(), revision, "reads never bump the revision");
}

#[test]
fn txn_put_and_txn_mixed_complete_their_totals() {
    let etcd = Etcd::start();
    let summary = bench_json(
        &etcd,
        &[
            "--clients",
            "4",
            "txn-put",
            "--txn-ops",
            "4",
            "--key-space-size",
            "100",
            "--total",
            "200",
        ],
    );
    assert_complete(&summary, "txn-put", 200);
    assert_eq!(
        etcd.revision(),
        1 + 200,
        "one revision per txn, whatever its op count"
    );
    assert_eq!(etcd.count_keys(), 100);

    let summary = bench_json(
        &etcd,
        &[
            "--clients",
            "4",
            "txn-mixed",
            "--key-space-size",
            "50",
            "--total",
            "300",
            "--consistency",
            "s",
        ],
    );
    let read = summary.class("read").expect("read class");
    let write = summary.class("write").expect("write class");
    assert_eq!(read.total + write.total, 300);
    assert_eq!(read.errors + write.errors, 0, "{summary:?}");
    assert!(
        read.total > 50 && write.total > 50,
        "rw-ratio 1 splits roughly evenly: {summary:?}"
    );
    assert_eq!(
        etcd.revision() as u64,
        1 + 200 + write.total,
        "each write txn is one revision"
    );
}

#[test]
fn watch_latency_delivers_every_event_to_every_watcher() {
    let etcd = Etcd::start();
    let summary = bench_json(
        &etcd,
        &[
            "--conns",
            "2",
            "watch-latency",
            "--streams",
            "3",
            "--watchers-per-stream",
            "4",
            "--put-total",
            "30",
            "--put-rate",
            "0",
        ],
    );
    assert_complete(&summary, "watch", 30 * 12);
    assert_complete(&summary, "put", 30);
    assert_complete(&summary, "from-send", 30 * 12);
    let (from_ack, from_send) = (
        &summary.classes[0].latency_us,
        &summary.classes[2].latency_us,
    );
    assert!(
        from_send.p50 >= from_ack.p50,
        "sent before acknowledged: {summary:?}"
    );
    assert_eq!(etcd.revision(), 1 + 30);
}

#[test]
fn lease_keepalive_completes_over_streams() {
    let etcd = Etcd::start();
    let summary = bench_json(
        &etcd,
        &["--clients", "3", "lease-keepalive", "--total", "300"],
    );
    assert_complete(&summary, "keepalive", 300);
}

#[test]
fn open_loop_rate_paces_the_run_and_text_output_reads() {
    let etcd = Etcd::start();
    let summary = bench_json(
        &etcd,
        &["--clients", "4", "put", "--total", "100", "--rate", "250"],
    );
    assert_complete(&summary, "put", 100);
    assert_eq!(summary.rate_per_s, Some(250.0));
    // 100 requests due at i/250 s: the last is due at 0.396 s.
    assert!(summary.elapsed_s >= 0.39, "{summary:?}");

    let endpoint = etcd.endpoint();
    let output = bench(&["--endpoints", &endpoint, "put", "--total", "50"]);
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "put: 1 clients over 1 connections, closed loop",
        "total 50  errors 0",
        "p99.9",
        "client CPU",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert!(output.stderr.is_empty(), "no progress bar without a TTY");
}

#[test]
fn unreachable_endpoint_fails_with_a_message() {
    let port = keel_bench::compare::free_port().expect("free port");
    let endpoint = format!("127.0.0.1:{port}");
    let output = bench(&["--endpoints", &endpoint, "put", "--total", "1"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("connect to {endpoint}")),
        "{stderr}"
    );
}

fn compare_args(work: &Path, out: &Path, keel_bin: &Path, label: &str) -> Vec<String> {
    let etcd = etcd_bin();
    [
        "--json",
        "compare",
        "--repeats",
        "1",
        "--etcd-bin",
        &etcd.display().to_string(),
        "--keel-bin",
        &keel_bin.display().to_string(),
        "--keel-label",
        label,
        "--work-dir",
        &work.display().to_string(),
        "--out",
        &out.display().to_string(),
        "--put-total",
        "200",
        "--put-clients",
        "20",
        "--put-conns",
        "4",
        "--latency-total",
        "30",
        "--range-total",
        "200",
        "--range-clients",
        "4",
        "--range-conns",
        "2",
        "--mem-keys",
        "200",
        "--watch-streams",
        "2",
        "--watch-watchers-per-stream",
        "3",
        "--watch-puts",
        "5",
        "--watch-put-rate",
        "0",
        "--floor-ops",
        "20",
        "--txn-put-total",
        "100",
        "--keepalive-total",
        "100",
        "--cluster-put-total",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run_compare(args: &[String]) -> CompareResult {
    let output = Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .args(args)
        .output()
        .expect("keel-bench runs");
    assert!(
        output.status.success(),
        "compare failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("compare --json parses")
}

#[test]
fn compare_etcd_against_etcd_as_stand_in() {
    // The scratch dir lives on the build filesystem: tmpfs would refuse the floor's O_DIRECT.
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("work dir");
    let out = work.path().join("out");
    let result = run_compare(&compare_args(work.path(), &out, &etcd_bin(), "etcd-b"));
    assert_eq!(result.keel_unavailable, None);
    assert_eq!(result.runs.len(), 2);
    assert_eq!(result.runs[0].system, "etcd", "repeat 0 starts with etcd");
    assert_eq!(result.runs[1].system, "etcd-b");
    for run in &result.runs {
        assert_eq!(run.put_throughput.total_errors(), 0);
        assert_eq!(run.memory.keys, 200);
        assert!(run.memory.rss_after_bytes > 0);
        assert_eq!(run.watch.class("watch").expect("watch").total, 5 * 6);
        assert_eq!(run.txn_put.class("txn-put").expect("txn-put").total, 100);
        assert_eq!(
            run.lease_keepalive
                .class("keepalive")
                .expect("keepalive")
                .total,
            100
        );
        // Every workload carries the server's CPU, divided by what that workload delivers.
        for summary in [
            &run.put_throughput,
            &run.put_latency,
            &run.txn_put,
            &run.range_serializable,
            &run.range_linearizable,
            &run.lease_keepalive,
        ] {
            let cpu = summary.server_cpu.as_ref().expect("server CPU measured");
            assert_eq!(cpu.per, "request");
            assert_eq!(
                cpu.requests, summary.classes[0].total,
                "{}",
                summary.workload
            );
            assert!(cpu.us_per_request.is_some_and(|us| us >= 0.0), "{cpu:?}");
        }
        // The three-member cluster took every put, and its CPU is the members' together.
        let cluster = run.cluster_put.as_ref().expect("three-member row measured");
        assert_eq!(cluster.members, 3);
        assert_eq!(cluster.put.classes[0].total, 200);
        assert_eq!(cluster.put.total_errors(), 0);
        let summed = cluster.put.server_cpu.as_ref().expect("CPU measured");
        assert_eq!(summed.requests, 200);
        let summed_us = summed.us_per_request.expect("some puts succeeded");
        assert_eq!(cluster.member_us_per_put.len(), 3);
        assert!(
            cluster.member_us_per_put.iter().all(|us| *us > 0.0),
            "every member works for every put: {cluster:?}"
        );
        let members_us: f64 = cluster.member_us_per_put.iter().sum();
        assert!(
            (members_us - summed_us).abs() < 1e-6 * summed_us.max(1.0),
            "{members_us} against {summed_us}"
        );
        let watch_cpu = run.watch.server_cpu.as_ref().expect("server CPU measured");
        assert_eq!(
            (watch_cpu.requests, watch_cpu.per.as_str()),
            (30, "delivered event")
        );
    }
    let cpu_row = result
        .table
        .iter()
        .find(|r| r.name.contains("server CPU per put (1000 clients)"))
        .expect("server CPU row");
    assert!(cpu_row.ratio.is_some(), "{cpu_row:?}");
    let cluster_row = result
        .table
        .iter()
        .find(|r| r.name.contains("summed over the members"))
        .expect("three-member CPU row");
    assert!(cluster_row.ratio.is_some(), "{cluster_row:?}");
    assert_eq!(result.floors.len(), 1);
    assert!(result.floors[0].latency_us.p50 > 0);
    let put = &result.table[0];
    assert!(
        put.etcd.is_some() && put.keel.is_some() && put.ratio.is_some(),
        "{put:?}"
    );
    let json: CompareResult =
        serde_json::from_slice(&std::fs::read(out.join("compare.json")).expect("json written"))
            .expect("json parses");
    assert_eq!(json.runs.len(), 2);
    let svg = std::fs::read_to_string(out.join("compare.svg")).expect("svg written");
    assert!(svg.contains("etcd-b put 1000c"));
}

#[test]
fn compare_without_keel_reports_etcd_only() {
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("work dir");
    let out = work.path().join("out");
    let missing = work.path().join("no-such-keel");
    let result = run_compare(&compare_args(work.path(), &out, &missing, "keel"));
    let reason = result
        .keel_unavailable
        .as_deref()
        .expect("keel is unavailable");
    assert!(reason.contains("cannot start"), "{reason}");
    assert_eq!(result.runs.len(), 1);
    assert_eq!(result.runs[0].system, "etcd");
    assert!(result.table.iter().all(|row| row.ratio.is_none()));
    assert!(result.table[0].etcd.is_some());
}

/// A CA and a server certificate for 127.0.0.1, made with openssl at test time.
fn make_pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (Debian: apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend_from_slice(&ec);
    ca.extend_from_slice(&[
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=bench-ca",
    ]);
    run(&ca);
    let mut csr = vec!["req", "-new", "-nodes"];
    csr.extend_from_slice(&ec);
    csr.extend_from_slice(&[
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=s",
    ]);
    run(&csr);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext file");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

#[test]
fn https_endpoints_run_over_tls_trusting_cacert() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = make_pki(dir.path());
    let port = keel_bench::compare::free_port().expect("free port");
    let peer_port = keel_bench::compare::free_port().expect("free port");
    let url = format!("https://127.0.0.1:{port}");
    let mut etcd = Command::new(etcd_bin())
        .args(["--data-dir", &dir.path().join("data").display().to_string()])
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer_port}"),
        ])
        .args(["--cert-file", &cert.display().to_string()])
        .args(["--key-file", &key.display().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("etcd starts");
    let ca = ca.display().to_string();
    let args = [
        "--cacert",
        &ca,
        "--endpoints",
        &url,
        "--json",
        "put",
        "--total",
        "100",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let output = loop {
        let output = bench(&args);
        if output.status.success() || std::time::Instant::now() > deadline {
            break output;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Without the CA, the same endpoint is refused up front: https needs a trust root.
    let no_ca = bench(&["--endpoints", &url, "put", "--total", "1"]);
    let _ = etcd.kill();
    let _ = etcd.wait();
    assert!(
        output.status.success(),
        "keel-bench over TLS: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Summary = serde_json::from_slice(&output.stdout).expect("one Summary");
    assert_complete(&summary, "put", 100);
    assert!(!no_ca.status.success());
    let stderr = String::from_utf8_lossy(&no_ca.stderr);
    assert!(stderr.contains("https endpoints need --cacert"), "{stderr}");
}
