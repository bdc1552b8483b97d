//! A reference server for the one-client put: what a put costs on this machine, with this
//! load generator, when the server does nothing between the request and the answer but the
//! disk floor's own 4 KiB O_DIRECT write and fdatasync.
//!
//! The one-client target (issue #15) compares a put's p50 with the disk floor alone, while a
//! put also crosses the loopback network, HTTP/2 and gRPC framing, the load generator's own
//! work, and the wake-ups of the threads that wait for each. This server keeps all of those
//! and drops everything a real server adds: one thread, no raft, no store, the answer written
//! as soon as the sync returns. A real server's p50 over this one's says how far it is from
//! a server that syncs before it answers and does nothing else; this one's p50 over the
//! floor says how much of the target the rest of the path already takes.
//!
//! It serves `/etcdserverpb.KV/Put` only (anything else is answered UNIMPLEMENTED) on one
//! current-thread tokio runtime: each call in a task of its own (so the connection's task
//! goes on reading while a call waits for its body), each sync inline, so a second client
//! would wait for the first's sync, which is what one client's row needs and no more. Not
//! the least work a server could possibly do (h2's general paths, a head built per answer),
//! but none of a store's or a log's.

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use keel_proto::etcdserverpb::{PutResponse, ResponseHeader};

use crate::client::{encode_frame, FrameReader};
use crate::compare::{fdatasync, floor_file, pwrite_block, AlignedBlock, DirectFile};
use crate::compare::{FLOOR_BLOCK_BYTES, FLOOR_FILE_BYTES};
use crate::Error;

/// The one method served.
const PUT_PATH: &str = "/etcdserverpb.KV/Put";
/// Connections served at once; a further one is closed at accept. The row needs one.
const CONNECTIONS_MAX: usize = 8;
/// Calls in flight per connection (HTTP/2's MAX_CONCURRENT_STREAMS). The row needs one.
const STREAMS_PER_CONNECTION_MAX: u32 = 16;

/// A running reference server; `stop` ends it.
pub struct ReferenceServer {
    endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), Error>>>,
    puts: Arc<AtomicU64>,
    /// The first failure of a call (its sync, a malformed request, its answer): the
    /// measurement is void, and `stop` says why.
    failure: Arc<Mutex<Option<String>>>,
}

impl ReferenceServer {
    /// Starts the server on a free port of 127.0.0.1, syncing to a preallocated file in
    /// `dir` (as `measure_disk_floor` does, in the same filesystem as the servers' data).
    pub fn start(dir: &Path) -> Result<ReferenceServer, Error> {
        let file = floor_file(dir, "reference")?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr: SocketAddr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let puts = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let shared = Shared {
            puts: puts.clone(),
            failure: failure.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("reference-server".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(serve(listener, file, shared, stopped))
            })?;
        Ok(ReferenceServer {
            endpoint: format!("127.0.0.1:{}", addr.port()),
            stop: Some(stop),
            thread: Some(thread),
            puts,
            failure,
        })
    }

    /// `host:port`, as keel-bench's `--endpoints` takes it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Stops the server and answers how many puts it made durable, or the first failure of
    /// a call.
    pub fn stop(mut self) -> Result<u64, Error> {
        self.shut_down()?;
        if let Some(reason) = self.failure.lock().expect("not poisoned").take() {
            return Err(Error::Server {
                label: "reference".into(),
                reason,
            });
        }
        Ok(self.puts.load(Ordering::Relaxed))
    }

    fn shut_down(&mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            // The server may have ended already (an error): its result says why.
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| Error::Server {
                label: "reference".into(),
                reason: "its thread panicked".into(),
            })?,
            None => Ok(()),
        }
    }
}

impl Drop for ReferenceServer {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

/// What the calls share with the `ReferenceServer` handle.
#[derive(Clone)]
struct Shared {
    puts: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
}

impl Shared {
    fn fail(&self, what: &str, error: &Error) {
        let mut failure = self.failure.lock().expect("not poisoned");
        failure.get_or_insert_with(|| format!("{what}: {error}"));
    }
}

/// Accepts connections until `stopped`, each served by a task of its own.
async fn serve(
    listener: std::net::TcpListener,
    file: DirectFile,
    shared: Shared,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let disk = Rc::new(Disk {
        file,
        block: AlignedBlock::new(0x5a)?,
        next_block: Cell::new(0),
    });
    let connections = Rc::new(Cell::new(0usize));
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return Ok(()),
                    accepted = listener.accept() => {
                        let (socket, _) = accepted?;
                        if connections.get() >= CONNECTIONS_MAX {
                            // Closed unserved: the client sees the connection fail.
                            continue;
                        }
                        socket.set_nodelay(true)?;
                        connections.set(connections.get() + 1);
                        let (disk, shared, connections) =
                            (disk.clone(), shared.clone(), connections.clone());
                        tokio::task::spawn_local(async move {
                            // A connection's own error (a client gone without a GOAWAY) voids
                            // nothing: a call it cut short is the client's error to report.
                            if let Err(error) = serve_connection(socket, disk, &shared).await {
                                eprintln!("keel-bench: reference server: a connection: {error}");
                            }
                            connections.set(connections.get() - 1);
                        });
                    }
                }
            }
        })
        .await
}

/// The floor's file and block: each put rewrites the next block of the preallocated file.
struct Disk {
    file: DirectFile,
    block: AlignedBlock,
    next_block: Cell<u64>,
}

impl Disk {
    /// The floor's operation, on this thread: the caller waits for the disk, as a server
    /// that answers only what is durable does.
    fn write_durably(&self) -> Result<(), Error> {
        let blocks = (FLOOR_FILE_BYTES / FLOOR_BLOCK_BYTES) as u64;
        let i = self.next_block.get();
        self.next_block.set((i + 1) % blocks);
        pwrite_block(&self.file, &self.block, i as usize * FLOOR_BLOCK_BYTES)?;
        fdatasync(&self.file)
    }
}

/// Accepts the connection's calls, each served by a task of its own: this task goes on
/// polling the connection, which reads the calls' bodies and writes their answers.
async fn serve_connection(
    socket: tokio::net::TcpStream,
    disk: Rc<Disk>,
    shared: &Shared,
) -> Result<(), Error> {
    let mut connection = h2::server::Builder::new()
        .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
        .handshake(socket)
        .await?;
    while let Some(call) = connection.accept().await {
        let (request, respond) = call?;
        let (disk, shared) = (disk.clone(), shared.clone());
        tokio::task::spawn_local(async move {
            serve_call(request, respond, &disk, &shared).await;
        });
    }
    Ok(())
}

/// Answers one call: a put once it is durable, anything else UNIMPLEMENTED. A failure is
/// answered INTERNAL and kept for `ReferenceServer::stop`.
async fn serve_call(
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    disk: &Disk,
    shared: &Shared,
) {
    let (parts, body) = request.into_parts();
    if parts.uri.path() != PUT_PATH {
        // The client may be gone; nothing else is owed to it.
        let _ = answer_status(&mut respond, "12", "unknown method");
        return;
    }
    let answered = async {
        read_one_message(body).await?;
        disk.write_durably()?;
        let revision = shared.puts.fetch_add(1, Ordering::Relaxed) + 1;
        let answer = PutResponse {
            header: Some(ResponseHeader {
                revision: i64::try_from(revision).expect("fewer than 2^63 puts"),
                ..Default::default()
            }),
            prev_kv: None,
        };
        answer_message(&mut respond, encode_frame(&mut BytesMut::new(), &answer))
    }
    .await;
    if let Err(error) = answered {
        shared.fail("a put", &error);
        let _ = answer_status(&mut respond, "13", "the reference server failed a put");
    }
}

/// Reads the request body to its end, which must hold exactly one gRPC message.
async fn read_one_message(mut body: RecvStream) -> Result<(), Error> {
    let mut reader = FrameReader::new();
    let mut messages = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
        reader.push(&chunk)?;
        while reader.next_frame()?.is_some() {
            messages += 1;
        }
    }
    if messages != 1 || !reader.is_empty() {
        return Err(Error::Protocol(format!(
            "a put's request held {messages} whole messages"
        )));
    }
    Ok(())
}

fn grpc_head() -> http::Response<()> {
    http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("a static head")
}

fn answer_message(respond: &mut SendResponse<Bytes>, message: Bytes) -> Result<(), Error> {
    let mut stream = respond.send_response(grpc_head(), false)?;
    stream.send_data(message, false)?;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    stream.send_trailers(trailers)?;
    Ok(())
}

/// A trailers-only answer with a non-OK status.
fn answer_status(
    respond: &mut SendResponse<Bytes>,
    code: &'static str,
    message: &'static str,
) -> Result<(), Error> {
    let mut head = grpc_head();
    head.headers_mut()
        .insert("grpc-status", http::HeaderValue::from_static(code));
    head.headers_mut()
        .insert("grpc-message", http::HeaderValue::from_static(message));
    respond.send_response(head, true)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{self, Caller, Connection};
    use crate::workloads::{self, PutArgs, Target};
    use keel_proto::etcdserverpb::RangeRequest;

    fn put_args(total: u64) -> PutArgs {
        PutArgs {
            lease: 0,
            key_size: 8,
            val_size: 256,
            total,
            key_space_size: 100,
            sequential_keys: true,
            rate: 0.0,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_clients_puts_are_answered_and_each_made_durable_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = ReferenceServer::start(dir.path()).expect("starts");
        let target = Target {
            endpoints: client::parse_endpoints(server.endpoint()).expect("endpoint"),
            conns: 1,
            clients: 1,
        };
        let summary = workloads::put(&target, &put_args(40)).await.expect("puts");
        assert_eq!(summary.total_errors(), 0);
        let class = summary.classes.first().expect("a put class");
        assert_eq!((class.total, class.errors), (40, 0), "every put answered");
        assert!(class.latency_us.p50 > 0);
        // One durable write per answered put, no more (the workload sends no other call).
        assert_eq!(server.stop().expect("stops cleanly"), 40);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_malformed_put_is_answered_internal_and_voids_the_measurement() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = ReferenceServer::start(dir.path()).expect("starts");
        let socket = tokio::net::TcpStream::connect(server.endpoint())
            .await
            .expect("connects");
        let (mut send, connection) = h2::client::handshake(socket).await.expect("h2");
        tokio::spawn(connection);
        let request = http::Request::post(format!("http://{}{PUT_PATH}", server.endpoint()))
            .header("content-type", "application/grpc")
            .body(())
            .expect("a request");
        let (response, mut body) = send.send_request(request, false).expect("sent");
        // A gRPC frame that announces 9 bytes and holds 3.
        body.send_data(Bytes::from_static(b"\0\0\0\0\x09abc"), true)
            .expect("sent");
        let response = response.await.expect("answered");
        let status = response
            .headers()
            .get("grpc-status")
            .expect("trailers-only");
        assert_eq!(status, "13");
        match server.stop() {
            Err(Error::Server { reason, .. }) => assert!(reason.contains("a put"), "{reason}"),
            other => panic!("expected the failure kept, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_method_is_answered_unimplemented() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = ReferenceServer::start(dir.path()).expect("starts");
        let endpoints = client::parse_endpoints(server.endpoint()).expect("endpoint");
        let connection = Connection::connect(&endpoints[0]).await.expect("connects");
        let mut caller = Caller::new(&connection);
        let answer = caller
            .unary::<_, keel_proto::etcdserverpb::RangeResponse>(
                client::KV_RANGE,
                &RangeRequest::default(),
            )
            .await;
        match answer {
            Err(Error::Status { code, .. }) => assert_eq!(code, 12),
            other => panic!("expected UNIMPLEMENTED, got {other:?}"),
        }
        assert_eq!(server.stop().expect("stops cleanly"), 0);
    }
}
