//! Plain HTTP/1.1 on the client port: /health, /livez, /readyz, /version and /metrics, with
//! etcd's bodies so load balancers and probes written for etcd work unchanged.

use std::time::Duration;

use http::StatusCode;
use keel_grpc::{HttpRequest, HttpResponse};

use crate::metrics::Metrics;
use crate::service::{json, ETCD_CLUSTER_VERSION, ETCD_VERSION};
use crate::shared::Shared;

pub async fn serve(shared: &Shared, metrics: &Metrics, request: HttpRequest) -> HttpResponse {
    let (path, query) = request
        .path
        .split_once('?')
        .unwrap_or((request.path.as_str(), ""));
    // Go's mux finds the handler first: an unknown path is 404 whatever the method, and only
    // etcd's own handlers answer other methods with 405.
    const PATHS: [&str; 5] = ["/health", "/livez", "/readyz", "/version", "/metrics"];
    if !PATHS.contains(&path) {
        return HttpResponse::not_found();
    }
    if request.method != http::Method::GET && request.method != http::Method::HEAD {
        return HttpResponse::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "Method Not Allowed\n",
        );
    }
    match path {
        "/health" => {
            let result = health(shared).await;
            metrics.record_health(result.is_ok());
            match result {
                Ok(()) => json(StatusCode::OK, r#"{"health":"true","reason":""}"#.into()),
                Err(reason) => json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({"health": "false", "reason": reason}).to_string(),
                ),
            }
        }
        "/livez" => crate::probes::serve(shared, crate::probes::Probe::Live, query).await,
        "/readyz" => crate::probes::serve(shared, crate::probes::Probe::Ready, query).await,
        "/version" => json(
            StatusCode::OK,
            format!(r#"{{"etcdserver":"{ETCD_VERSION}","etcdcluster":"{ETCD_CLUSTER_VERSION}"}}"#),
        ),
        "/metrics" => HttpResponse::new(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(shared),
        ),
        _ => HttpResponse::not_found(),
    }
}

/// How long /health waits for a linearizable read, as etcd's QGET check waits.
pub const HEALTH_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether this member can serve writes and linearizable reads now, as etcd's /health decides:
/// no alarm raised, a leader known, the raft core turning, and a linearizable read (a ReadIndex
/// round through the raft core) answered within a second. The reason says what failed, in
/// etcd's words where etcd has them.
pub async fn health(shared: &Shared) -> Result<(), String> {
    if let Some(a) = shared.alarms().first() {
        return Err(format!("ALARM {}", crate::alarms::alarm_name(a.alarm)));
    }
    if !shared.has_leader() {
        return Err("RAFT NO LEADER".into());
    }
    let stalled_ms = shared.raft_loop_idle_ms();
    if stalled_ms > raft_stall_ms_max(shared) {
        return Err(format!("RAFT CORE STALLED {stalled_ms}ms"));
    }
    let read = async { Some(shared.read_barrier().await) };
    let timeout = async {
        crate::rt::sleep(HEALTH_READ_TIMEOUT).await;
        None
    };
    match futures_lite::future::or(read, timeout).await {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(format!("QGET ERROR:{}", keel_grpc::Status::from(e).message)),
        None => Err("QGET ERROR:context deadline exceeded".into()),
    }
}

/// The longest the raft core may go without turning its loop before health calls it stalled:
/// it turns at least once per heartbeat when idle, so an election timeout without a turn means
/// nothing commits.
pub fn raft_stall_ms_max(shared: &Shared) -> u64 {
    shared.config.election_timeout_ms.max(1000)
}
