//! Plain HTTP/1.1 on the client port: /health, /livez, /readyz, /version and /metrics, with
//! etcd's bodies so load balancers and probes written for etcd work unchanged.

use std::sync::atomic::Ordering;

use http::StatusCode;
use keel_grpc::{HttpRequest, HttpResponse};

use crate::metrics::Metrics;
use crate::service::{json, ETCD_CLUSTER_VERSION, ETCD_VERSION};
use crate::shared::Shared;

pub fn serve(shared: &Shared, metrics: &Metrics, request: HttpRequest) -> HttpResponse {
    let path = request.path.split('?').next().unwrap_or("");
    if request.method != http::Method::GET && request.method != http::Method::HEAD {
        return HttpResponse::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "Method Not Allowed\n",
        );
    }
    match path {
        "/health" => {
            // etcd: unhealthy without a leader, or with an alarm raised.
            if !shared.has_leader() {
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    r#"{"health":"false","reason":"RAFT NO LEADER"}"#.into(),
                )
            } else if shared.nospace.load(Ordering::Acquire) {
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    r#"{"health":"false","reason":"ALARM NOSPACE"}"#.into(),
                )
            } else {
                json(StatusCode::OK, r#"{"health":"true","reason":""}"#.into())
            }
        }
        "/livez" => HttpResponse::new(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        "/readyz" => {
            if shared.has_leader() {
                HttpResponse::new(StatusCode::OK, "text/plain; charset=utf-8", "ok\n")
            } else {
                HttpResponse::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    "not ready: no leader\n",
                )
            }
        }
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
