//! `/livez` and `/readyz` with etcd 3.5's meanings and its Kubernetes-style bodies, so the
//! probes written for etcd (kubeadm's, Helm charts') work unchanged.
//!
//! - `/livez`: the process serves (a serializable read of the store answers). It never waits
//!   for the cluster: a member cut off from its peers is alive, and restarting it would not help.
//! - `/readyz`: the member can serve clients: no CORRUPT alarm (`data_corruption`), a
//!   serializable read answers (`serializable_read`), and a linearizable read completes within
//!   a second (`linearizable_read`: a leader is known and the raft core turns).
//!
//! As in etcd, `?verbose` lists every check, `?exclude=<check>` (repeatable) skips one, and a
//! failing probe answers 503 with the list and the reason withheld unless `verbose` was asked.

use http::StatusCode;
use keel_grpc::HttpResponse;
use keel_kv as kv;

use crate::shared::Shared;

/// One named check's result.
struct Check {
    name: &'static str,
    result: Result<(), String>,
}

/// Which probe to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Live,
    Ready,
}

impl Probe {
    fn name(self) -> &'static str {
        match self {
            Probe::Live => "livez",
            Probe::Ready => "readyz",
        }
    }
}

pub async fn serve(shared: &Shared, probe: Probe, query: &str) -> HttpResponse {
    let params: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    let verbose = params.iter().any(|(k, _)| *k == "verbose");
    let excluded = |name: &str| params.iter().any(|(k, v)| *k == "exclude" && *v == name);
    let mut checks = Vec::new();
    if probe == Probe::Ready && !excluded("data_corruption") {
        checks.push(Check {
            name: "data_corruption",
            result: if shared.corrupt.load(std::sync::atomic::Ordering::Acquire) {
                Err("the CORRUPT alarm is raised".into())
            } else {
                Ok(())
            },
        });
    }
    if !excluded("serializable_read") {
        checks.push(Check {
            name: "serializable_read",
            result: serializable_read(shared),
        });
    }
    if probe == Probe::Ready && !excluded("linearizable_read") {
        checks.push(Check {
            name: "linearizable_read",
            result: linearizable_read(shared).await,
        });
    }
    let passed = checks.iter().all(|c| c.result.is_ok());
    let name = probe.name();
    if passed && !verbose {
        return HttpResponse::new(StatusCode::OK, "text/plain; charset=utf-8", "ok");
    }
    let mut body = String::new();
    for c in &checks {
        match &c.result {
            Ok(()) => body.push_str(&format!("[+]{} ok\n", c.name)),
            Err(reason) if verbose => body.push_str(&format!("[-]{} failed: {reason}\n", c.name)),
            Err(_) => body.push_str(&format!("[-]{} failed: reason withheld\n", c.name)),
        }
    }
    for (k, v) in &params {
        if *k == "exclude" {
            body.push_str(&format!("[+]{v} excluded: ok\n"));
        }
    }
    if passed {
        body.push_str(&format!("{name} check passed\n"));
        HttpResponse::new(StatusCode::OK, "text/plain; charset=utf-8", body)
    } else {
        body.push_str(&format!("{name} check failed\n"));
        tracing::warn!(probe = name, checks = %body.replace('\n', "; "), "probe failed");
        HttpResponse::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            body,
        )
    }
}

/// A serializable Range, as etcd's check issues (one key, count only: it reads the index).
fn serializable_read(shared: &Shared) -> Result<(), String> {
    let req = kv::RangeRequest {
        key: bytes::Bytes::from_static(b"health"),
        count_only: true,
        serializable: true,
        ..Default::default()
    };
    shared
        .reader()
        .range(&req)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A linearizable read barrier (a ReadIndex round through the raft core), bounded as /health's.
async fn linearizable_read(shared: &Shared) -> Result<(), String> {
    let read = async { Some(shared.read_barrier().await) };
    let timeout = async {
        crate::rt::sleep(crate::http::HEALTH_READ_TIMEOUT).await;
        None
    };
    match futures_lite::future::or(read, timeout).await {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(keel_grpc::Status::from(e).message),
        None => Err("context deadline exceeded".into()),
    }
}
