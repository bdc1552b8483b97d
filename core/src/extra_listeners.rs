//! The client-side listeners besides the TCP client URLs: unix sockets (`--listen-client-urls
//! unix://path`, served in full on shard 0: a unix socket cannot be shared with SO_REUSEPORT)
//! and etcd's metrics listeners (`--listen-metrics-urls`: /metrics and /health over HTTP/1.1
//! only, never the gRPC API, so a port opened to a scraper gives no access to the data).

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use glommio::net::UnixListener;
use keel_grpc::{
    serve_connection, Call, Handler, HttpRequest, HttpResponse, ResponseSink, Runtime,
    ServerConfig, ServiceKnown, Status,
};
use tokio_util::compat::FuturesAsyncReadCompatExt;

use crate::error::CoreError;
use crate::metrics::Metrics;
use crate::rt;
use crate::shared::Shared;

/// A metrics listener's handler: the HTTP endpoints, and no gRPC service at all.
pub struct MetricsOnly {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
}

impl MetricsOnly {
    pub fn new(shared: Arc<Shared>, metrics: Arc<Metrics>) -> MetricsOnly {
        MetricsOnly { shared, metrics }
    }
}

impl Handler for MetricsOnly {
    async fn grpc(self: Rc<Self>, call: Call, _sink: &mut ResponseSink) -> Status {
        Status::unknown_method(call.head.path.path(), ServiceKnown::No)
    }

    async fn http(self: Rc<Self>, request: HttpRequest) -> HttpResponse {
        crate::http::serve(&self.shared, &self.metrics, request).await
    }
}

/// Binds a unix socket for clients. A socket file left by a previous run is removed first, as
/// etcd's unix listener does; any other file there is an error.
pub fn bind_unix(path: &Path) -> Result<UnixListener, CoreError> {
    let fail = |source: std::io::Error| CoreError::ListenUnix {
        path: path.to_path_buf(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        std::fs::remove_file(path).map_err(fail)?;
    }
    UnixListener::bind(path).map_err(|e| fail(e.into()))
}

/// Serves every connection of one unix listener with `handler`. `admit` is the shard's
/// connection limit: a connection it refuses (None) is closed at once; the slot it grants is
/// held for the connection's life.
pub async fn accept_unix<H: Handler, R: Runtime + 'static, S: 'static>(
    path: PathBuf,
    listener: UnixListener,
    handler: Rc<H>,
    config: Rc<ServerConfig>,
    runtime: Rc<R>,
    admit: impl Fn() -> Option<S>,
) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                let Some(slot) = admit() else {
                    drop(stream);
                    continue;
                };
                let (handler, config, runtime) = (handler.clone(), config.clone(), runtime.clone());
                rt::spawn_local(async move {
                    if let Err(e) =
                        serve_connection(stream.compat(), handler, config, runtime).await
                    {
                        tracing::debug!(error = %e, "unix connection ended with an error");
                    }
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "accept failed");
                rt::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
