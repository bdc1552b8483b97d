//! Observability: etcd's own Grafana dashboards and alert rules (deploy/monitoring) must find
//! every series they query on a running Keel, and the rule files must pass promtool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{require_tool, Server};

/// Names the dashboards or rules reference that no Keel can expose, each with the reason.
const NOT_APPLICABLE: &[(&str, &str)] = &[
    (
        "up",
        "made by Prometheus itself for every scrape target, never exported by the target",
    ),
    (
        "etcd_http_failed_total",
        "etcd's v2 HTTP API counter; Keel serves only the v3 API (etcd 3.4 itself exports it \
         only once v2 requests arrive, which needs --enable-v2)",
    ),
    (
        "etcd_http_received_total",
        "etcd's v2 HTTP API counter, as etcd_http_failed_total",
    ),
    (
        "etcd_http_successful_duration_seconds_bucket",
        "etcd's v2 HTTP API latency, as etcd_http_failed_total",
    ),
];

/// Series that exist only once a member has peers: a single member declares their family
/// (HELP and TYPE) with no sample, as etcd does. `peer_metrics_have_samples_in_a_cluster`
/// in the cluster tests checks their samples.
const NEEDS_PEERS: &[&str] = &[
    "etcd_network_peer_sent_bytes_total",
    "etcd_network_peer_received_bytes_total",
    "etcd_network_peer_sent_failures_total",
    "etcd_network_peer_round_trip_time_seconds_bucket",
];

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// Every `"expr"` string anywhere in a JSON document (Grafana panels, rendered rule groups).
fn json_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| json_exprs(i, out)),
        _ => {}
    }
}

/// The `expr:` values of a Prometheus rules YAML file: `expr: |` blocks (the lines indented
/// deeper than the key) and one-line `expr: ...` values.
fn yaml_exprs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        if let Some(value) = line.trim_start().strip_prefix("expr:") {
            let value = value.trim();
            if value == "|" || value == ">" {
                let mut block = String::new();
                i += 1;
                while i < lines.len() {
                    let l = lines[i];
                    let li = l.len() - l.trim_start().len();
                    if !l.trim().is_empty() && li <= indent {
                        break;
                    }
                    block.push_str(l.trim());
                    block.push('\n');
                    i += 1;
                }
                out.push(block);
                continue;
            }
            out.push(value.trim_matches('\'').trim_matches('"').to_string());
        }
        i += 1;
    }
    out
}

/// PromQL words that are not metric names.
const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: identifiers that are not functions (followed
/// by `(`), keywords, label names (inside `{...}` or a `by (...)` list), durations or strings.
/// Grafana's template variables (`$var`, `[$__interval]`) are skipped with the text around them.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut after_grouping = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                // A string: skip to its closing quote.
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                // Label matchers or a range/subquery duration: no metric names inside.
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if after_grouping => {
                // `by (job, instance)`: label names.
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                after_grouping = false;
            }
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let lower = word.to_ascii_lowercase();
                if [
                    "by",
                    "without",
                    "on",
                    "ignoring",
                    "group_left",
                    "group_right",
                ]
                .contains(&lower.as_str())
                {
                    after_grouping = true;
                } else if chars.get(j) == Some(&'(') {
                    // A function or an aggregation.
                } else if !PROMQL_WORDS.contains(&lower.as_str()) {
                    names.insert(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // A number or a duration (5m, 0.99, 1e3).
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Every metric name the shipped dashboards and rules reference, with the files they're in.
fn referenced_metrics() -> Vec<(String, String)> {
    let dir = monitoring_dir();
    let mut exprs: Vec<(String, String)> = Vec::new();
    for file in [
        "grafana.json",
        "etcd-mixin/dashboard.json",
        "etcd-mixin/mixin.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).expect("shipped monitoring file");
        let v: serde_json::Value = serde_json::from_str(&text).expect("the file is JSON");
        let mut found = Vec::new();
        json_exprs(&v, &mut found);
        assert!(!found.is_empty(), "{file} has expressions");
        exprs.extend(found.into_iter().map(|e| (file.to_string(), e)));
    }
    let rules = std::fs::read_to_string(dir.join("etcd3_alert.rules.yml")).expect("rules file");
    let found = yaml_exprs(&rules);
    assert!(
        found.len() >= 10,
        "the rules file has its alerts: {found:?}"
    );
    exprs.extend(
        found
            .into_iter()
            .map(|e| ("etcd3_alert.rules.yml".into(), e)),
    );
    let mut out: Vec<(String, String)> = Vec::new();
    for (file, e) in exprs {
        for name in metric_names(&e) {
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, file.clone()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn promql_metric_names_are_extracted_as_promql_reads_them() {
    let names = metric_names(
        "histogram_quantile(0.99, sum(rate(etcd_disk_wal_fsync_duration_seconds_bucket{job=~\".*etcd.*\"}[5m])) by (instance, le)) > 0.5",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["etcd_disk_wal_fsync_duration_seconds_bucket"]
    );
    let names = metric_names(
        "100 * sum(rate(grpc_server_handled_total{grpc_code!=\"OK\"}[5m])) BY (job, grpc_method) / sum(rate(grpc_server_handled_total[$__interval])) without (grpc_code) > 1 and on(job) up == bool 1",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["grpc_server_handled_total", "up"]
    );
}

/// The sample names and the declared families of a Prometheus text exposition.
fn exposition(body: &str) -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let mut samples = BTreeSet::new();
    let mut families = BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().expect("name"), parts.next().expect("type"));
            families.insert((name.to_string(), kind.to_string()));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).expect("a sample has a value");
            samples.insert(line[..end].to_string());
        }
    }
    (samples, families)
}

/// The family a sample name belongs to (a histogram's `_bucket`, `_sum`, `_count`).
fn family_of<'a>(name: &'a str, families: &BTreeSet<(String, String)>) -> Option<&'a str> {
    if families.iter().any(|(f, _)| f == name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        families
            .iter()
            .any(|(f, kind)| f == base && kind == "histogram")
            .then_some(base)
    })
}

#[test]
fn dashboards_and_alerts_find_every_series_they_query() {
    let referenced = referenced_metrics();
    assert!(
        referenced.len() >= 20,
        "the dashboards and rules reference etcd's series: {referenced:?}"
    );
    let mut server = Server::keel(&[]);
    // Traffic so the request-path series have samples: a put, a range, a watch, a txn.
    server.etcdctl(&["put", "k", "v"]).ok();
    server.etcdctl(&["get", "k"]).ok();
    server.etcdctl(&["del", "k"]).ok();
    let (code, body) = server.http_get("/metrics");
    assert_eq!(code, 200);
    let (samples, families) = exposition(&body);
    let mut missing = Vec::new();
    for (name, file) in &referenced {
        if let Some((_, why)) = NOT_APPLICABLE.iter().find(|(n, _)| n == name) {
            assert!(!why.is_empty());
            continue;
        }
        let declared = family_of(name, &families).is_some();
        let sampled = samples.contains(name);
        let ok = if NEEDS_PEERS.contains(&name.as_str()) {
            declared
        } else {
            declared && sampled
        };
        if !ok {
            missing.push(format!("{name} (from {file})"));
        }
    }
    assert!(
        missing.is_empty(),
        "/metrics lacks series etcd's dashboards or alerts query: {missing:#?}\n{body}"
    );
    // Every allow-listed name is still referenced: a stale entry would hide nothing but noise.
    for (name, _) in NOT_APPLICABLE {
        assert!(
            referenced.iter().any(|(n, _)| n == name),
            "{name} is allow-listed but no longer referenced"
        );
    }
    server.stop();
}

/// The values of the series etcd's tools read most, checked against what the test did.
#[test]
fn server_series_count_what_happened() {
    let mut server = Server::keel(&[]);
    for i in 0..3 {
        server.etcdctl(&["put", &format!("k{i}"), "v"]).ok();
    }
    server.etcdctl(&["del", "k0"]).ok();
    server.etcdctl(&["get", "k1"]).ok();
    let (_, body) = server.http_get("/metrics");
    let value = |series: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{body}"))
            .parse()
            .expect("a number")
    };
    assert_eq!(value("etcd_server_has_leader"), 1.0);
    assert_eq!(value("etcd_server_is_leader"), 1.0);
    assert_eq!(value("etcd_server_leader_changes_seen_total"), 1.0);
    assert_eq!(value("etcd_mvcc_put_total"), 3.0);
    assert_eq!(value("etcd_mvcc_delete_total"), 1.0);
    assert_eq!(value("etcd_debugging_mvcc_keys_total"), 2.0);
    assert_eq!(value("etcd_server_proposals_pending"), 0.0);
    assert_eq!(value("etcd_server_proposals_failed_total"), 0.0);
    assert!(value("etcd_server_proposals_committed_total") >= 4.0);
    // Every write waited for one WAL append, each timed.
    assert!(value("etcd_disk_wal_fsync_duration_seconds_count") >= 4.0);
    assert!(value("etcd_disk_wal_fsync_duration_seconds_sum") > 0.0);
    assert!(value("etcd_disk_backend_commit_duration_seconds_count") >= 4.0);
    assert!(value("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"+Inf\"}") >= 4.0);
    let put = "grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"";
    assert_eq!(value(&format!("grpc_server_started_total{{{put}}}")), 3.0);
    assert_eq!(
        value(&format!("grpc_server_msg_received_total{{{put}}}")),
        3.0
    );
    assert_eq!(value(&format!("grpc_server_msg_sent_total{{{put}}}")), 3.0);
    assert_eq!(
        value(&format!(
            "grpc_server_handled_total{{grpc_code=\"OK\",{put}}}"
        )),
        3.0
    );
    assert_eq!(
        value(&format!("grpc_server_handling_seconds_count{{{put}}}")),
        3.0
    );
    // etcdctl put k1 v: a PutRequest of 6 bytes ("\n\x02k1\x12\x01v" is 7; k0..k2 are 2 bytes).
    assert!(value("etcd_network_client_grpc_received_bytes_total") >= 3.0 * 7.0);
    assert!(value("etcd_network_client_grpc_sent_bytes_total") > 0.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_start_time_seconds") > 1.5e9);
    assert!(body.contains(&format!(
        "etcd_server_id{{server_id=\"{}\"}} 1",
        server_id(&server)
    )));
    assert!(body.contains("etcd_server_version{server_version=\"3."));
    assert!(body.contains("etcd_cluster_version{cluster_version=\"3."));
    // /health counts its answers.
    let (code, _) = server.http_get("/health");
    assert_eq!(code, 200);
    let (_, body) = server.http_get("/metrics");
    assert!(body.contains("\netcd_server_health_success 1\n"), "{body}");
    server.stop();
}

/// The member id etcdctl reports, in hex.
fn server_id(server: &Server) -> String {
    let out = server.etcdctl(&["endpoint", "status", "-w", "json"]).ok();
    let v = out.json();
    let id = v[0]["Status"]["header"]["member_id"]
        .as_u64()
        .expect("a member id");
    format!("{id:x}")
}

/// The same families, types and histogram buckets as etcd 3.4 for every series both export.
#[test]
fn types_and_buckets_match_etcd() {
    let mut etcd = Server::etcd(&[]);
    let mut keel = Server::keel(&[]);
    for s in [&etcd, &keel] {
        s.etcdctl(&["put", "a", "b"]).ok();
    }
    let (_, etcd_body) = etcd.http_get("/metrics");
    let (_, keel_body) = keel.http_get("/metrics");
    let (_, etcd_families) = exposition(&etcd_body);
    let (_, keel_families) = exposition(&keel_body);
    let mut compared = 0;
    for (name, kind) in &keel_families {
        let Some((_, etcd_kind)) = etcd_families.iter().find(|(n, _)| n == name) else {
            continue;
        };
        compared += 1;
        assert_eq!(
            kind, etcd_kind,
            "{name}: Keel says {kind}, etcd {etcd_kind}"
        );
        if kind == "histogram" {
            let bounds = |body: &str| -> Vec<String> {
                let prefix = format!("{name}_bucket{{");
                let mut seen = Vec::new();
                for l in body.lines().filter(|l| l.starts_with(&prefix)) {
                    let le = l.split("le=\"").nth(1).expect("le").split('"').next();
                    let le = le.expect("closing quote").to_string();
                    if !seen.contains(&le) {
                        seen.push(le);
                    }
                }
                seen
            };
            assert_eq!(bounds(&keel_body), bounds(&etcd_body), "{name}'s buckets");
        }
    }
    assert!(compared >= 30, "only {compared} families in common");
    for name in [
        "etcd_server_leader_changes_seen_total",
        "etcd_disk_wal_fsync_duration_seconds",
        "etcd_disk_backend_commit_duration_seconds",
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "grpc_server_msg_received_total",
        "etcd_network_peer_round_trip_time_seconds",
    ] {
        assert!(
            keel_families.iter().any(|(n, _)| n == name),
            "Keel lacks {name}"
        );
    }
    etcd.stop();
    keel.stop();
}

#[test]
fn promtool_accepts_the_rules_and_the_mixin_tests_pass() {
    require_tool("promtool");
    let dir = monitoring_dir();
    for file in ["etcd3_alert.rules.yml", "etcd-mixin/mixin.yaml"] {
        let out = Command::new("promtool")
            .args(["check", "rules"])
            .arg(dir.join(file))
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool check rules {file}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new("promtool")
        .args(["test", "rules", "test.yaml"])
        .current_dir(dir.join("etcd-mixin"))
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_rendered_mixin_matches_its_source() {
    require_tool("jsonnet");
    let dir = monitoring_dir().join("etcd-mixin");
    for (expr, file) in [
        (
            "(import \"mixin.libsonnet\").prometheusAlerts",
            "mixin.yaml",
        ),
        (
            "(import \"mixin.libsonnet\").grafanaDashboards[\"etcd.json\"]",
            "dashboard.json",
        ),
    ] {
        let out = Command::new("jsonnet")
            .args(["-e", expr])
            .current_dir(&dir)
            .output()
            .expect("jsonnet runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let shipped = std::fs::read(dir.join(file)).expect("rendered file");
        assert!(
            out.stdout == shipped,
            "{file} is stale: re-render it (see deploy/monitoring/README.md)"
        );
    }
}

/// `keel_heap_allocations_total{thread=...}`: the keel binary counts its heap allocations by
/// thread role (its global allocator is alloc_count's), and a write allocates on the shard
/// that takes it and on the raft core that applies it.
#[test]
fn heap_allocations_are_counted_by_thread_role() {
    let server = crate::common::Server::keel(&[]);
    let read = || {
        let (code, body) = server.http_get("/metrics");
        assert_eq!(code, 200);
        let series = |role: &str| {
            let series = format!("keel_heap_allocations_total{{thread=\"{role}\"}}");
            crate::common::metric_value(&body, &series)
        };
        (series("shard"), series("raft_core"))
    };
    let (shard_before, raft_before) = read();
    const PUTS: u64 = 20;
    for i in 0..PUTS {
        server.etcdctl(&["put", &format!("k{i}"), "v"]).ok();
    }
    let (shard_after, raft_after) = read();
    assert!(
        shard_after >= shard_before + PUTS && raft_after >= raft_before + PUTS,
        "shard {shard_before} -> {shard_after}, raft core {raft_before} -> {raft_after}"
    );
}
