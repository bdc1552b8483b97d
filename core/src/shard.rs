//! A shard: one pinned executor that owns its listeners, connections and call tasks. Every
//! shard binds the same client addresses with SO_REUSEPORT (and SO_REUSEADDR, see
//! `rt::bind_listener`), and the kernel spreads connections across them.
//!
//! A shard serves at most `--max-connections-per-shard` connections at once; one accepted
//! beyond that is closed at once (a gRPC client sees the endpoint unavailable and fails over),
//! and the shard logs it at most once per second.
//!
//! Architecture invariant: a connection and all its streams live on the shard that accepted it;
//! nothing about a connection crosses cores.
//!
//! One thread per core, where the configuration asks for it (`--host-shards-on-raft-cpu`, by
//! default for the members of a local cluster): a shard placed on the raft core's CPU (every
//! member on 1-3 CPUs has one there, see `config::default_placement`) is then not a thread of
//! its own but a task queue in the raft core's executor (`Host`). As a second thread on that
//! CPU it takes turns with the raft core through the kernel: a context switch each way, a
//! cross-thread wake-up for each batch of proposals and of answers, and each thread's own
//! sleeps. In one executor the two hand work over with local wake-ups and sleep together
//! (BENCHMARKS.md, "A shard in the raft core's executor"). The price: glommio never preempts
//! a task, so a request that keeps the shard busy holds the raft core as long. The kernel
//! would have given the raft core its turn within milliseconds; a lone member keeps the
//! thread by default for that reason. Ranges walk the index in steps and let others run in
//! between (`service::range_walked`; a read-only txn's ranges too), and sort large answers on
//! the blocking pool, so a count or a sort of millions of keys no longer does; a compare over
//! a large range, and the sort of a large range inside a txn, still do.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{select, Either};
use keel_grpc::{serve_connection, Runtime, ServerConfig};

use crate::host_whitelist::{HostChecked, HostWhitelist};
use tokio_util::compat::FuturesAsyncReadCompatExt;

use crate::config::{Config, Scheme};
use crate::error::CoreError;
use crate::extra_listeners::{self, MetricsOnly};
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::rt::{self, TcpListener};
use crate::service::Api;
use crate::shared::Shared;
use crate::tls::{self, Acceptor, TlsFiles};
use crate::watch::Hub;

/// keel-grpc's runtime hooks, on glommio.
struct Glommio;

impl Runtime for Glommio {
    fn spawn_local(&self, task: Pin<Box<dyn Future<Output = ()>>>) {
        // Queued, not polled at once: the calls of one read that answer without waiting go
        // out in one write (see `rt::spawn_local_queued`).
        rt::spawn_local_queued(task);
    }
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(rt::sleep(duration))
    }
}

/// Starts one shard per entry of `cpus`, pinned there; returns once every shard has bound every client address (or the
/// first bind error).
///
/// With a `host`, the shards on its CPU go to the raft core's executor through it instead of
/// starting threads of their own.
pub fn start(
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    cpus: &[usize],
    host: Option<Host>,
) -> Result<Vec<rt::Pinned<()>>, CoreError> {
    assert!(!cpus.is_empty(), "a node needs at least one shard");
    let count = cpus.len();
    // --auto-tls writes its certificate once, here, before any shard loads it.
    let tls_files = match &shared.config.client_tls {
        Some(settings) => {
            let hosts = tls_hosts(&shared.config);
            Some(Arc::new(tls::prepare(
                settings,
                &shared.config.data_dir,
                &hosts,
            )?))
        }
        None => None,
    };
    let (bound_tx, bound_rx) = mpsc::channel::<Result<(), CoreError>>();
    let mut handles = Vec::with_capacity(count);
    let mut hosted = Vec::new();
    for (shard, &cpu) in cpus.iter().enumerate() {
        let shared = shared.clone();
        let metrics = metrics.clone();
        let bound_tx = bound_tx.clone();
        let tls_files = tls_files.clone();
        if host.as_ref().is_some_and(|host| host.cpu == cpu) {
            hosted.push(Hosted {
                shard,
                shared,
                metrics,
                tls_files,
                bound: bound_tx,
            });
            continue;
        }
        let sched_batch = shared.config.shard_sched_batch;
        let handle = rt::spawn_pinned(&format!("keel-shard-{shard}"), cpu, move || async move {
            // Wake-ups that do not cut the running thread's turn short (the raft core's, on
            // its CPU): see `rt::batch_scheduling_for_this_thread`.
            if sched_batch {
                if let Err(e) = rt::batch_scheduling_for_this_thread() {
                    tracing::warn!(shard, error = %e, "cannot put a shard thread under SCHED_BATCH");
                }
            }
            run(shard, shared, metrics, tls_files, bound_tx).await;
        })?;
        handles.push(handle);
    }
    let unsent = match host {
        Some(host) if !hosted.is_empty() => host.shards.send(hosted).is_err(),
        _ => false,
    };
    if unsent {
        // The raft core's executor ended before it took them: it failed to start, which the
        // caller hears from the raft core itself.
        return Err(CoreError::Executor(
            "the raft core's executor ended before it took its shards".into(),
        ));
    }
    drop(bound_tx);
    for _ in 0..count {
        match bound_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(CoreError::Executor("a shard exited before binding".into())),
        }
    }
    Ok(handles)
}

/// Where the shards on the raft core's CPU go: `cpu` is the raft core's, and `shards` reaches
/// the task `host_shards` left waiting in its executor.
pub struct Host {
    pub cpu: usize,
    pub shards: futures_channel::oneshot::Sender<Vec<Hosted>>,
}

/// A shard to run in the raft core's executor: what `run` takes.
pub struct Hosted {
    shard: usize,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    tls_files: Option<Arc<TlsFiles>>,
    bound: mpsc::Sender<Result<(), CoreError>>,
}

/// Called on the raft core's executor: runs the shards `start` sends through the other end of
/// `shards`, each in a task queue of its own, so the shard's tasks (and those they spawn) take
/// turns with the raft core's as glommio's queues do, rather than run in the raft core's queue
/// ahead of its own wake-ups. A dropped sender (no shard on this CPU, or a start that failed
/// first) leaves nothing running.
pub fn host_shards(shards: futures_channel::oneshot::Receiver<Vec<Hosted>>) {
    rt::spawn_local(async move {
        let Ok(shards) = shards.await else {
            return;
        };
        for job in shards {
            rt::spawn_local_in_own_queue(
                &format!("keel-shard-{}", job.shard),
                run(job.shard, job.shared, job.metrics, job.tls_files, job.bound),
            );
        }
    });
}

/// The names --auto-tls's certificate is made for: the https listeners' addresses, and
/// localhost (etcd uses the hosts of its client URLs).
fn tls_hosts(config: &Config) -> Vec<String> {
    let mut hosts: Vec<String> = config
        .listen_client
        .iter()
        .filter(|l| l.scheme == Scheme::Https)
        .map(|l| l.addr.ip().to_string())
        .collect();
    hosts.push("localhost".to_string());
    hosts.dedup();
    hosts
}

/// The gRPC server's limits, from the node's configuration and its derived size limits.
fn server_config(config: &Config, limits: &Limits) -> ServerConfig {
    ServerConfig {
        max_recv_message_bytes: limits.grpc_recv_bytes_max,
        http1: keel_grpc::Http1Limits {
            body_bytes_max: limits.http_body_bytes_max,
            ..keel_grpc::Http1Limits::default()
        },
        max_concurrent_streams: config.max_concurrent_streams,
        preface_timeout: Duration::from_millis(config.preface_timeout_ms),
        ..ServerConfig::default()
    }
}

/// How often a shard at its connection limit may say so in the log: a client retrying in a
/// tight loop must not flood it.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Counts a shard's open connections (all its listeners together) against its limit.
struct ConnectionLimit {
    shard: usize,
    max: usize,
    open: Cell<usize>,
    /// Connections refused since the last log line, reported with the next one.
    refused_unlogged: Cell<u64>,
    last_log: Cell<Option<Instant>>,
}

impl ConnectionLimit {
    fn new(shard: usize, max: usize) -> Rc<ConnectionLimit> {
        assert!(max > 0, "a shard must be able to serve a connection");
        Rc::new(ConnectionLimit {
            shard,
            max,
            open: Cell::new(0),
            refused_unlogged: Cell::new(0),
            last_log: Cell::new(None),
        })
    }

    /// A slot for one more connection, released when dropped; `None` at the limit (and the
    /// refusal is counted, and logged when the last log line is old enough).
    fn admit(self: &Rc<Self>, addr: SocketAddr, peer: Option<SocketAddr>) -> Option<Slot> {
        let open = self.open.get();
        assert!(open <= self.max, "more connections open than the limit");
        if open < self.max {
            self.open.set(open + 1);
            return Some(Slot(self.clone()));
        }
        let refused = self.refused_unlogged.get() + 1;
        self.refused_unlogged.set(refused);
        let now = Instant::now();
        let quiet = self
            .last_log
            .get()
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_INTERVAL);
        if quiet {
            self.last_log.set(Some(now));
            self.refused_unlogged.set(0);
            tracing::warn!(
                shard = self.shard,
                %addr,
                peer = ?peer,
                refused,
                max_connections_per_shard = self.max,
                "refusing client connections: shard at its connection limit (--max-connections-per-shard)"
            );
        }
        None
    }
}

/// One admitted connection; gives its place back when the connection ends.
struct Slot(Rc<ConnectionLimit>);

impl Drop for Slot {
    fn drop(&mut self) {
        let open = self.0.open.get();
        assert!(open > 0, "a slot was released twice");
        self.0.open.set(open - 1);
    }
}

async fn run(
    shard: usize,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    tls_files: Option<Arc<TlsFiles>>,
    bound: mpsc::Sender<Result<(), CoreError>>,
) {
    // Each shard loads its own TLS configuration, so a handshake never touches another core.
    let acceptor = match tls_files.map(|files| Acceptor::new((*files).clone())) {
        Some(Ok(a)) => Some(Rc::new(a)),
        Some(Err(e)) => {
            let _ = bound.send(Err(e));
            return;
        }
        None => None,
    };
    let mut listeners = Vec::new();
    let client_count = shared.config.listen_client.len();
    // The metrics listeners (HTTP only) bind beside the client ones, on every shard.
    let all_tcp = shared
        .config
        .listen_client
        .iter()
        .chain(&shared.config.listen_metrics)
        .copied()
        .collect::<Vec<_>>();
    for listener in all_tcp {
        let addr = listener.addr;
        let tls = match listener.scheme {
            Scheme::Http => None,
            Scheme::Https => Some(
                acceptor
                    .clone()
                    .expect("config refuses an https listener without TLS settings"),
            ),
        };
        match rt::bind_listener(addr) {
            Ok(l) => listeners.push((addr, l, tls)),
            Err(source) => {
                let _ = bound.send(Err(CoreError::Listen { addr, source }));
                return;
            }
        }
    }
    // A unix socket cannot be shared between shards: shard 0 serves each one.
    let mut unix_listeners = Vec::new();
    if shard == 0 {
        for spec in &shared.config.listen_client_unix {
            match extra_listeners::bind_unix(&spec.path) {
                Ok(l) => unix_listeners.push((spec.path.clone(), l)),
                Err(e) => {
                    let _ = bound.send(Err(e));
                    return;
                }
            }
        }
    }
    let _ = bound.send(Ok(()));
    // This shard's proposals take their answers in batches, one wake-up per batch.
    if let Some(drain) = crate::answers::install_on_this_thread() {
        rt::spawn_local(drain);
    }
    let hub = Hub::new(shard, shared.clone());
    rt::spawn_local(hub.clone().run());
    let metrics_only = Rc::new(MetricsOnly::new(shared.clone(), metrics.clone()));
    let api = Rc::new(Api::new(shared.clone(), metrics, hub));
    let config = Rc::new(server_config(&shared.config, &shared.limits));
    let limit = ConnectionLimit::new(shard, shared.config.max_connections_per_shard);
    let runtime = Rc::new(Glommio);
    let serving = Rc::new(Serving {
        shard,
        api,
        config,
        limit,
        runtime,
    });
    let mut tasks: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
    // --host-whitelist guards the client listeners' plaintext HTTP, as etcd's does; the
    // metrics listener is not checked there either.
    let host_check = shared
        .config
        .host_whitelist
        .restricts()
        .then(|| Rc::new(shared.config.host_whitelist.clone()));
    for (i, (addr, listener, tls)) in listeners.into_iter().enumerate() {
        if i < client_count {
            let accept = accept_loop(
                serving.clone(),
                serving.api.clone(),
                addr,
                listener,
                tls,
                host_check.clone(),
            );
            tasks.push(Box::pin(rt::spawn_local_handle(accept)));
        } else {
            let accept = accept_loop(
                serving.clone(),
                metrics_only.clone(),
                addr,
                listener,
                tls,
                None,
            );
            tasks.push(Box::pin(rt::spawn_local_handle(accept)));
        }
    }
    for (path, listener) in unix_listeners {
        let limit = serving.limit.clone();
        // A unix peer has no address: the limit's log line names the wildcard instead.
        let admit = move || limit.admit(SocketAddr::from(([0, 0, 0, 0], 0)), None);
        // A unix listener is plaintext: etcd checks its HTTP requests' Host too.
        match &host_check {
            None => {
                let accept = extra_listeners::accept_unix(
                    path,
                    listener,
                    serving.api.clone(),
                    serving.config.clone(),
                    serving.runtime.clone(),
                    admit,
                );
                tasks.push(Box::pin(rt::spawn_local_handle(accept)));
            }
            Some(whitelist) => {
                let checked = Rc::new(HostChecked {
                    inner: serving.api.clone(),
                    whitelist: whitelist.clone(),
                });
                let accept = extra_listeners::accept_unix(
                    path,
                    listener,
                    checked,
                    serving.config.clone(),
                    serving.runtime.clone(),
                    admit,
                );
                tasks.push(Box::pin(rt::spawn_local_handle(accept)));
            }
        }
    }
    for t in tasks {
        t.await;
    }
}

/// What every listener of one shard serves its connections with.
struct Serving {
    shard: usize,
    api: Rc<Api>,
    config: Rc<ServerConfig>,
    limit: Rc<ConnectionLimit>,
    runtime: Rc<Glommio>,
}

/// Accepts on one listener, serving its connections with `handler` (the etcd API, or only the
/// metrics endpoints); `tls` is its acceptor when the listener is https; `host_check` is the
/// `--host-whitelist` its plaintext HTTP requests must match, if it restricts anything.
async fn accept_loop<H: crate::auth::ServesCertUser>(
    serving: Rc<Serving>,
    handler: Rc<H>,
    addr: SocketAddr,
    listener: TcpListener,
    tls: Option<Rc<Acceptor>>,
    host_check: Option<Rc<HostWhitelist>>,
) {
    let Serving {
        shard,
        api: _,
        config,
        limit,
        runtime,
    } = &*serving;
    let api = &handler;
    let shard = *shard;
    // etcd 3.4 serves its JSON gateway over HTTP/2 on TLS listeners only (see
    // `all_http_over_h2`); over plaintext h2c its grpc-go refuses such requests.
    let config = match tls {
        Some(_) => Rc::new(ServerConfig {
            all_http_over_h2: true,
            ..(**config).clone()
        }),
        None => config.clone(),
    };
    loop {
        match listener.accept().await {
            Ok(stream) => {
                let Some(slot) = limit.admit(addr, stream.peer_addr().ok()) else {
                    // Closed before a byte is read: the client sees the connection end before
                    // the server's preface, which grpc-go treats as an unavailable endpoint.
                    drop(stream);
                    continue;
                };
                // Small unary calls must not wait for Nagle's timer.
                let _ = stream.set_nodelay(true);
                let (api, config, runtime) = (api.clone(), config.clone(), runtime.clone());
                let (tls, host_check) = (tls.clone(), host_check.clone());
                rt::spawn_local(async move {
                    let served = match (tls, host_check) {
                        (None, None) => {
                            serve_connection(rt::TcpIo::new(stream), api, config, runtime).await
                        }
                        (None, Some(whitelist)) => {
                            let checked = Rc::new(HostChecked {
                                inner: api,
                                whitelist,
                            });
                            serve_connection(rt::TcpIo::new(stream), checked, config, runtime).await
                        }
                        (Some(acceptor), _) => {
                            let handshake = pin!(acceptor.accept(stream));
                            // A client that connects and never finishes the handshake must not
                            // hold a task, a slot and a socket: the same bound as the preface.
                            let timeout = rt::sleep(config.preface_timeout);
                            match select(handshake, pin!(timeout)).await {
                                Either::Left((Ok(stream), _)) => {
                                    // A verified client certificate names the calls' user
                                    // when they carry no token (etcd's AuthInfoFromTLS).
                                    let cert_user = stream
                                        .get_ref()
                                        .1
                                        .peer_certificates()
                                        .and_then(|certs| certs.first())
                                        .and_then(|c| crate::auth::common_name(c))
                                        .and_then(|user| api.for_cert_user(user));
                                    match cert_user {
                                        Some(conn) => {
                                            let conn = Rc::new(conn);
                                            serve_connection(stream.compat(), conn, config, runtime)
                                                .await
                                        }
                                        None => {
                                            serve_connection(stream.compat(), api, config, runtime)
                                                .await
                                        }
                                    }
                                }
                                Either::Left((Err(e), _)) => {
                                    tracing::debug!(shard, error = %e, "TLS handshake failed");
                                    Ok(())
                                }
                                Either::Right(((), _)) => {
                                    tracing::debug!(
                                        shard,
                                        "TLS handshake timed out (--preface-timeout-ms)"
                                    );
                                    Ok(())
                                }
                            }
                        }
                    };
                    if let Err(e) = served {
                        // Clients reset connections when they exit: normal, so only at debug.
                        tracing::debug!(shard, error = %e, "connection ended with an error");
                    }
                    drop(slot);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(shard, %addr, error = %e, "accept failed");
                rt::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
