//! End-to-end tests: a glommio executor serves a small test handler on 127.0.0.1:0, driven by
//! an h2 client (over a glommio TcpStream + compat), raw std sockets and etcdctl.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::future::{select, Either};
use glommio::net::{TcpListener, TcpStream};
use glommio::{LocalExecutorBuilder, Placement};
use h2::client::SendRequest;
use h2::RecvStream;
use http::{HeaderMap, StatusCode};
use keel_grpc::codec::{encode_message, MessageDecoder};
use keel_grpc::{
    serve_connection, unary, unary_pieces, Call, CallHead, Code, EtcdError, Handler, HttpRequest,
    HttpResponse, Metadata, PieceEncode, ResponseSink, ServerConfig, ServiceKnown, Status,
};
use keel_proto::etcdserverpb::{
    RangeRequest, RangeResponse, ResponseHeader, WatchRequest, WatchResponse,
};
use keel_proto::mvccpb::{Event, KeyValue};
use prost::Message;
use tokio_util::compat::FuturesAsyncReadCompatExt;

static HOLD_DROPPED: AtomicUsize = AtomicUsize::new(0);
/// Calls of `/test.Big/UnaryCounted` whose handler has returned.
static UNARY_COUNTED_DONE: AtomicUsize = AtomicUsize::new(0);
/// Bytes `/test.Big/Pieces` has encoded so far.
static PIECES_ENCODED_BYTES: AtomicUsize = AtomicUsize::new(0);
const PIECES_KV_COUNT: usize = 1024;
const PIECES_VALUE_BYTES: usize = 8 * 1024;

const PREFACE_TIMEOUT: Duration = Duration::from_millis(500);
const MAX_RECV_MESSAGE_BYTES: usize = 256 * 1024;
const BIG_VALUE_BYTES: usize = 1024 * 1024;
const BIG_VALUE_COUNT: usize = 8;

#[path = "support/glommio_runtime.rs"]
mod glommio_runtime;
use glommio_runtime::GlommioRuntime;

struct TestHandler;

const SERVICES: [&str; 4] = [
    "etcdserverpb.KV",
    "etcdserverpb.Watch",
    "test.Slow",
    "test.Big",
];

fn range_response(key: Bytes) -> RangeResponse {
    RangeResponse {
        header: Some(ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 5,
            raft_term: 1,
        }),
        kvs: vec![KeyValue {
            key,
            value: Bytes::from_static(b"bar"),
            create_revision: 4,
            mod_revision: 5,
            version: 2,
            lease: 0,
        }],
        count: 1,
        more: false,
    }
}

async fn range(request: RangeRequest, head: CallHead) -> Result<RangeResponse, Status> {
    if head
        .metadata
        .get("token")
        .is_some_and(|token| token == "bad")
    {
        return Err(EtcdError::InvalidAuthToken.into());
    }
    if head.metadata.contains_key("head-probe") {
        // Says whether the call's fields came shared with its connection's last head.
        let how: &'static [u8] = match head.metadata {
            Metadata::Shared(_) => b"head:shared",
            Metadata::Own(_) => b"head:own",
        };
        return Ok(range_response(Bytes::from_static(how)));
    }
    if request.key.is_empty() {
        return Err(EtcdError::EmptyKey.into());
    }
    if request.key.as_ref() == b"compacted" {
        return Err(EtcdError::Compacted.into());
    }
    Ok(range_response(request.key))
}

/// Bidi: answers each WatchRequest with a WatchResponse echoing its key, ids from 0.
async fn watch(mut call: Call, sink: &mut ResponseSink) -> Status {
    let mut watch_id = 0;
    loop {
        match call.requests.decode::<WatchRequest>().await {
            Ok(Some(request)) => {
                let key = match request.request_union {
                    Some(keel_proto::etcdserverpb::watch_request::RequestUnion::CreateRequest(
                        create,
                    )) => create.key,
                    _ => Bytes::new(),
                };
                // Like etcd: a `created` reply first, then the watch's events.
                // clientv3 dereferences the header of every watch response.
                let header = range_response(Bytes::new()).header;
                let created = WatchResponse {
                    header,
                    watch_id,
                    created: true,
                    ..Default::default()
                };
                let event = WatchResponse {
                    header,
                    watch_id,
                    events: vec![Event {
                        kv: Some(KeyValue {
                            key,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                watch_id += 1;
                // Both in one write, as Keel's watch streams send what queued together.
                let mut frames = [created, event]
                    .iter()
                    .map(|response| encode_message(response, usize::MAX).expect("encode"))
                    .collect::<Vec<_>>();
                if let Err(status) = sink.send_frames(&mut frames).await {
                    return status;
                }
                assert!(frames.is_empty(), "send_frames takes every frame");
            }
            Ok(None) => return Status::ok(),
            Err(status) => return status,
        }
    }
}

/// Server-streaming: one huge message of 8 MiB, then a small one.
async fn download(mut call: Call, sink: &mut ResponseSink) -> Status {
    if let Err(status) = call.requests.decode_one::<RangeRequest>().await {
        return status;
    }
    let big = RangeResponse {
        kvs: (0..BIG_VALUE_COUNT)
            .map(|index| KeyValue {
                key: Bytes::from(format!("k{index}")),
                value: Bytes::from(vec![index as u8; BIG_VALUE_BYTES]),
                ..Default::default()
            })
            .collect(),
        count: BIG_VALUE_COUNT as i64,
        ..Default::default()
    };
    for message in [big, range_response(Bytes::from_static(b"tail"))] {
        if let Err(status) = sink.send(&message).await {
            return status;
        }
    }
    Status::ok()
}

/// One Range answer, then an error whose message is the request's key 100 times over: a
/// status in trailers after a message, with a message longer than HPACK's 7-bit length
/// prefix.
async fn fail_after_one(mut call: Call, sink: &mut ResponseSink) -> Status {
    let request = match call.requests.decode_one::<RangeRequest>().await {
        Ok(request) => request,
        Err(status) => return status,
    };
    if let Err(status) = sink.send(&range_response(request.key.clone())).await {
        return status;
    }
    let message = String::from_utf8_lossy(&request.key).repeat(100);
    Status::new(Code::FailedPrecondition, message)
}

/// A Range answer of `PIECES_KV_COUNT` values, encoded a piece at a time and counted.
struct CountedPieces {
    answer: RangeResponse,
    next: usize,
}

impl PieceEncode for CountedPieces {
    fn encoded_len(&self) -> usize {
        self.answer.encoded_len()
    }

    fn encode_piece(&mut self, buf: &mut BytesMut, target_bytes: usize) -> Result<bool, Status> {
        let before = buf.len();
        while self.next < self.answer.kvs.len() && buf.len() - before < target_bytes {
            prost::encoding::message::encode(2, &self.answer.kvs[self.next], buf);
            self.next += 1;
        }
        if self.next == self.answer.kvs.len() {
            prost::encoding::int64::encode(4, &self.answer.count, buf);
        }
        PIECES_ENCODED_BYTES.fetch_add(buf.len() - before, Ordering::SeqCst);
        Ok(self.next < self.answer.kvs.len())
    }
}

/// `pieces_answer` encoded a piece at a time until piece `fail_at` (from 0), which fails as
/// compacted, as a range whose rest a compaction cut does.
struct FailingPieces {
    answer: RangeResponse,
    next: usize,
    pieces: usize,
    fail_at: usize,
}

impl PieceEncode for FailingPieces {
    fn encoded_len(&self) -> usize {
        self.answer.encoded_len()
    }

    fn encode_piece(&mut self, buf: &mut BytesMut, target_bytes: usize) -> Result<bool, Status> {
        if self.pieces == self.fail_at {
            return Err(EtcdError::Compacted.into());
        }
        self.pieces += 1;
        let before = buf.len();
        while self.next < self.answer.kvs.len() && buf.len() - before < target_bytes {
            prost::encoding::message::encode(2, &self.answer.kvs[self.next], buf);
            self.next += 1;
        }
        Ok(true)
    }
}

fn pieces_answer() -> RangeResponse {
    RangeResponse {
        kvs: (0..PIECES_KV_COUNT)
            .map(|index| KeyValue {
                key: Bytes::from(format!("k{index:04}")),
                value: Bytes::from(vec![index as u8; PIECES_VALUE_BYTES]),
                ..Default::default()
            })
            .collect(),
        count: PIECES_KV_COUNT as i64,
        ..Default::default()
    }
}

impl Handler for TestHandler {
    async fn grpc(self: Rc<Self>, call: Call, sink: &mut ResponseSink) -> Status {
        match call.head.path.path() {
            "/etcdserverpb.KV/Range" => unary(call, sink, range).await,
            "/test.Big/UnaryCounted" => {
                let status = unary(call, sink, range).await;
                UNARY_COUNTED_DONE.fetch_add(1, Ordering::SeqCst);
                status
            }
            "/etcdserverpb.Watch/Watch" => watch(call, sink).await,
            "/test.Big/Download" => download(call, sink).await,
            "/test.Big/FailAfterOne" => fail_after_one(call, sink).await,
            "/test.Big/Pieces" => {
                unary_pieces(call, sink, |_: RangeRequest, _| async {
                    Ok(CountedPieces {
                        answer: pieces_answer(),
                        next: 0,
                    })
                })
                .await
            }
            "/test.Big/FailingPieces" => {
                unary_pieces(call, sink, |request: RangeRequest, _| async move {
                    Ok(FailingPieces {
                        answer: pieces_answer(),
                        next: 0,
                        pieces: 0,
                        fail_at: if request.key.as_ref() == b"first" {
                            0
                        } else {
                            3
                        },
                    })
                })
                .await
            }
            "/test.Slow/Hold" => {
                // Counts the handler futures dropped by a client reset.
                struct Dropped;
                impl Drop for Dropped {
                    fn drop(&mut self) {
                        HOLD_DROPPED.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let _dropped = Dropped;
                glommio::timer::sleep(Duration::from_secs(30)).await;
                Status::ok()
            }
            "/test.Slow/Sleep" => {
                glommio::timer::sleep(Duration::from_secs(30)).await;
                Status::ok()
            }
            path => {
                let service = path
                    .trim_start_matches('/')
                    .rsplit_once('/')
                    .map(|(s, _)| s);
                let known = match service {
                    Some(service) if SERVICES.contains(&service) => ServiceKnown::Yes,
                    _ => ServiceKnown::No,
                };
                Status::unknown_method(path, known)
            }
        }
    }

    async fn http(self: Rc<Self>, request: HttpRequest) -> HttpResponse {
        match (request.method.as_str(), request.path.as_str()) {
            ("GET", "/health") => HttpResponse::new(
                StatusCode::OK,
                "application/json",
                "{\"health\":\"true\",\"reason\":\"\"}",
            ),
            ("POST", "/echo") => {
                HttpResponse::new(StatusCode::OK, "application/json", request.body)
            }
            _ => HttpResponse::not_found(),
        }
    }
}

/// One server for the whole test binary, on its own executor thread.
fn server_addr() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        spawn_server(ServerConfig {
            max_recv_message_bytes: MAX_RECV_MESSAGE_BYTES,
            preface_timeout: PREFACE_TIMEOUT,
            ..ServerConfig::default()
        })
    })
}

/// The largest plain HTTP/2 request body the all-HTTP server takes.
const ALL_HTTP_BODY_BYTES_MAX: usize = 1024;

/// A second server whose HTTP/2 connections pass every non-gRPC request to the HTTP endpoints
/// (as Keel's TLS listeners do), with a small body limit.
fn all_http_server_addr() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        spawn_server(ServerConfig {
            preface_timeout: PREFACE_TIMEOUT,
            all_http_over_h2: true,
            http1: keel_grpc::Http1Limits {
                body_bytes_max: ALL_HTTP_BODY_BYTES_MAX,
                ..Default::default()
            },
            ..ServerConfig::default()
        })
    })
}

/// Starts a server with `config` on its own executor thread, for the rest of the process.
fn spawn_server(config: ServerConfig) -> SocketAddr {
    {
        let (sender, receiver) = std::sync::mpsc::channel();
        let handle = LocalExecutorBuilder::new(Placement::Unbound)
            .name("grpc-test-server")
            .io_memory(1 << 20)
            .spawn(move || async move {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
                sender
                    .send(listener.local_addr().expect("addr"))
                    .expect("send addr");
                let config = Rc::new(config);
                let handler = Rc::new(TestHandler);
                let runtime = Rc::new(GlommioRuntime);
                loop {
                    let stream = match listener.accept().await {
                        Ok(stream) => stream,
                        Err(_) => continue,
                    };
                    // Without TCP_NODELAY, Nagle holds back small frames (WINDOW_UPDATE, PING
                    // acks) behind delayed ACKs: 40 ms stalls per flow-control round trip.
                    stream.set_nodelay(true).expect("nodelay");
                    let connection = serve_connection(
                        stream.compat(),
                        handler.clone(),
                        config.clone(),
                        runtime.clone(),
                    );
                    glommio::spawn_local(async move {
                        let _ = connection.await;
                    })
                    .detach();
                }
            })
            .expect("spawn server executor");
        // The server runs until the test process exits.
        std::mem::forget(handle);
        receiver.recv().expect("server address")
    }
}

/// Runs a client future on a fresh executor, failing the test if it takes over 20 s.
fn run_client<F, Fut, T>(body: F) -> T
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    let executor = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .make()
        .expect("client executor");
    executor.run(async move {
        let work = std::pin::pin!(body());
        match select(
            work,
            Box::pin(glommio::timer::sleep(Duration::from_secs(20))),
        )
        .await
        {
            Either::Left((value, _)) => value,
            Either::Right(_) => panic!("client timed out"),
        }
    })
}

async fn connect() -> SendRequest<Bytes> {
    connect_to(server_addr()).await
}

async fn connect_to(addr: SocketAddr) -> SendRequest<Bytes> {
    connect_with(addr, h2::client::Builder::new()).await
}

async fn connect_with(addr: SocketAddr, mut builder: h2::client::Builder) -> SendRequest<Bytes> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    // A large connection window gives h2's small-DATA-frame budget room for 200 buffered
    // replies; the stream window stays at the 64 KiB default to exercise flow control.
    let (client, connection) = builder
        .initial_connection_window_size(16 * 1024 * 1024)
        .handshake(stream.compat())
        .await
        .expect("handshake");
    glommio::spawn_local(async move {
        let _ = connection.await;
    })
    .detach();
    client.ready().await.expect("ready")
}

fn grpc_request(path: &str, metadata: &[(&str, &str)]) -> http::Request<()> {
    let mut builder = http::Request::builder()
        .method("POST")
        .uri(format!("http://keel{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        builder = builder.header(*name, *value);
    }
    builder.body(()).expect("request")
}

#[derive(Debug)]
struct Reply {
    http_status: StatusCode,
    content_type: Option<http::HeaderValue>,
    messages: Vec<Bytes>,
    code: Code,
    message: String,
}

async fn read_reply(response: h2::client::ResponseFuture) -> Reply {
    let response = response.await.expect("response head");
    let http_status = response.status();
    let headers = response.headers().clone();
    let content_type = headers.get("content-type").cloned();
    let mut body = response.into_body();
    let messages = read_messages(&mut body).await;
    let trailers = if body.is_end_stream() && messages.is_empty() {
        None
    } else {
        body.trailers().await.expect("trailers")
    };
    let status_headers: HeaderMap = trailers.unwrap_or(headers);
    let code = status_headers
        .get("grpc-status")
        .map(|value| Code::from_u8(value.to_str().expect("ascii").parse().expect("number")))
        .expect("grpc-status present");
    let message = status_headers
        .get("grpc-message")
        .map(|value| keel_grpc::status::percent_decode(value.to_str().expect("ascii")))
        .unwrap_or_default();
    Reply {
        http_status,
        content_type,
        messages,
        code,
        message,
    }
}

async fn read_messages(body: &mut RecvStream) -> Vec<Bytes> {
    let mut decoder = MessageDecoder::new(64 * 1024 * 1024);
    let mut messages = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("data");
        decoder.push(&chunk);
        body.flow_control()
            .release_capacity(chunk.len())
            .expect("release");
        while let Some(message) = decoder.next_message().expect("valid frame") {
            messages.push(message);
        }
    }
    messages
}

/// Sends one call with the given raw DATA payload (or none) and reads the whole reply.
async fn call_raw(
    client: &mut SendRequest<Bytes>,
    path: &str,
    metadata: &[(&str, &str)],
    payload: Option<Bytes>,
) -> Reply {
    let request = grpc_request(path, metadata);
    let end_of_stream = payload.is_none();
    let (response, mut stream) = client.send_request(request, end_of_stream).expect("send");
    if let Some(payload) = payload {
        stream.send_data(payload, true).expect("send data");
    }
    read_reply(response).await
}

fn range_request(key: &'static [u8]) -> Bytes {
    let request = RangeRequest {
        key: Bytes::from_static(key),
        ..Default::default()
    };
    encode_message(&request, usize::MAX).expect("encode")
}

#[test]
fn unary_round_trip_with_metadata_and_error_mapping() {
    run_client(|| async {
        let mut client = connect().await;
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[("hasleader", "true")],
            Some(range_request(b"foo")),
        )
        .await;
        assert_eq!(reply.http_status, StatusCode::OK);
        assert_eq!(reply.code, Code::Ok, "{reply:?}");
        assert_eq!(reply.messages.len(), 1);
        let response = RangeResponse::decode(reply.messages[0].clone()).expect("decode");
        assert_eq!(response, range_response(Bytes::from_static(b"foo")));

        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[("token", "bad")],
            Some(range_request(b"foo")),
        )
        .await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::Unauthenticated, "etcdserver: invalid auth token")
        );
        assert!(reply.messages.is_empty());

        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(range_request(b"")),
        )
        .await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::InvalidArgument, "etcdserver: key is not provided")
        );
    });
}

/// gRPC heads and OK trailers go out as h2 `RepeatedFields` (third_party/h2, KEEL PATCH):
/// each connection writes again the HPACK block it wrote for the set last time while its
/// dynamic table is unchanged. They must decode whatever table the client asked for, and a
/// block must never be written again once the table has changed, or again if it changed
/// the table itself: either way the client's table and the server's would differ, and a
/// later field would decode as another. Heads back to back, then rounds that mix in
/// statuses and an HTTP answer that h2 encodes from a `HeaderMap`.
/// `count` Range calls at once on `client`'s connection, each in a task of its own.
fn spawn_ranges(client: &SendRequest<Bytes>, count: usize) -> Vec<glommio::Task<Reply>> {
    (0..count)
        .map(|_| {
            let mut client = client.clone();
            glommio::spawn_local(async move {
                call_raw(
                    &mut client,
                    "/etcdserverpb.KV/Range",
                    &[],
                    Some(range_request(b"k")),
                )
                .await
            })
        })
        .collect()
}

/// A gRPC answer's content type and status, as `context` expects them.
fn assert_grpc_reply(reply: &Reply, code: Code, message: &str, context: &str) {
    assert_eq!(
        (reply.code, reply.message.as_str()),
        (code, message),
        "{context}: {reply:?}"
    );
    assert_eq!(
        reply.content_type.as_ref().map(|v| v.as_bytes()),
        Some(&b"application/grpc"[..]),
        "{context}"
    );
}

#[test]
fn repeated_response_fields_decode_with_any_header_table_size() {
    for table_bytes in [0, 4096, 64 * 1024] {
        run_client(move || async move {
            let mut builder = h2::client::Builder::new();
            builder.header_table_size(table_bytes);
            let mut client = connect_with(server_addr(), builder).await;
            // Calls at once on a fresh connection: heads go out back to back, the first
            // inserting into the table, the next ones finding it there.
            for call in spawn_ranges(&client, 20) {
                let reply = call.await;
                assert_grpc_reply(&reply, Code::Ok, "", &format!("table {table_bytes}"));
            }
            for round in 0..3 {
                let context = format!("table {table_bytes}, round {round}");
                let ok = call_raw(
                    &mut client,
                    "/etcdserverpb.KV/Range",
                    &[],
                    Some(range_request(b"foo")),
                )
                .await;
                assert_grpc_reply(&ok, Code::Ok, "", &context);
                assert_eq!(ok.messages.len(), 1, "{context}");
                // A trailers-only answer: its head carries the status.
                let error = call_raw(
                    &mut client,
                    "/etcdserverpb.KV/Range",
                    &[],
                    Some(range_request(b"")),
                )
                .await;
                assert_grpc_reply(
                    &error,
                    Code::InvalidArgument,
                    "etcdserver: key is not provided",
                    &context,
                );
                // A message, then trailers with an error status, which h2 encodes from a
                // `HeaderMap`: its message needs percent-encoding, and its length is past
                // HPACK's 7-bit prefix.
                let failed = call_raw(
                    &mut client,
                    "/test.Big/FailAfterOne",
                    &[],
                    Some(range_request(b"k%\n")),
                )
                .await;
                assert_eq!(failed.messages.len(), 1, "{context}");
                assert_eq!(
                    (failed.code, failed.message),
                    (Code::FailedPrecondition, "k%\n".repeat(100)),
                    "{context}"
                );
                // A head that h2's own encoder writes, with the dynamic table: had a block
                // above added to the client's table, the two tables would disagree here.
                let (status, content_type, _) = get_health(&mut client).await;
                assert_eq!(
                    (status, content_type),
                    (
                        StatusCode::OK,
                        Some(http::HeaderValue::from_static("application/json"))
                    ),
                    "{context}"
                );
            }
        });
    }
}

fn range_request_of(key_bytes: usize) -> (Vec<u8>, Bytes) {
    let key: Vec<u8> = (0..key_bytes).map(|i| b'a' + (i % 26) as u8).collect();
    let request = RangeRequest {
        key: Bytes::from(key.clone()),
        ..Default::default()
    };
    (key, encode_message(&request, usize::MAX).expect("encode"))
}

/// A client whose streams' windows hold 100 bytes, far less than most answers below.
async fn connect_with_a_100_byte_window() -> SendRequest<Bytes> {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(100);
    connect_with(server_addr(), builder).await
}

/// A unary answer of up to `UNARY_AT_ONCE_BYTES_MAX` goes to h2 in one call, head, message
/// and trailers together, whatever the client's window (`ResponseSink::send_last_pieces`);
/// larger ones go under flow control. Either way an answer must arrive whole, as the window
/// opens, with its trailers after it.
#[test]
fn unary_answers_larger_than_the_clients_window_arrive_whole() {
    run_client(|| async {
        let mut client = connect_with_a_100_byte_window().await;
        // A range answer is its key plus 31 bytes; framed, 36.
        let at_once_key_bytes = keel_grpc::UNARY_AT_ONCE_BYTES_MAX - 36;
        for key_bytes in [
            1,
            99,
            100,
            101,
            at_once_key_bytes,
            at_once_key_bytes + 1,
            20 * 1024,
            200 * 1024,
        ] {
            let (key, payload) = range_request_of(key_bytes);
            let reply = call_raw(&mut client, "/etcdserverpb.KV/Range", &[], Some(payload)).await;
            let context = format!("a {key_bytes}-byte key");
            assert_grpc_reply(&reply, Code::Ok, "", &context);
            assert_eq!(reply.messages.len(), 1, "{context}");
            let answer = RangeResponse::decode(reply.messages[0].clone()).expect("decodes");
            assert_eq!(answer, range_response(Bytes::from(key)), "{context}");
        }
    });
}

/// The handler of a small unary call returns while its answer still waits for the client's
/// window, as grpc-go's does: the answer was handed to h2 whole. (Sent under flow control,
/// the handler would wait until the client read.)
#[test]
fn a_small_unary_answer_does_not_wait_for_the_clients_window() {
    run_client(|| async {
        let mut client = connect_with_a_100_byte_window().await;
        let (key, payload) = range_request_of(4 * 1024);
        let done_before = UNARY_COUNTED_DONE.load(Ordering::SeqCst);
        let (response, mut stream) = client
            .send_request(grpc_request("/test.Big/UnaryCounted", &[]), false)
            .expect("send");
        stream.send_data(payload, true).expect("send data");
        // Nothing is read (so no window is released) until the handler has returned.
        let waited = Instant::now();
        while UNARY_COUNTED_DONE.load(Ordering::SeqCst) == done_before {
            assert!(
                waited.elapsed() < Duration::from_secs(5),
                "the handler still waits for the client's window"
            );
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        let reply = read_reply(response).await;
        assert_grpc_reply(
            &reply,
            Code::Ok,
            "",
            "a 4 KiB answer behind a 100-byte window",
        );
        let answer = RangeResponse::decode(reply.messages[0].clone()).expect("decodes");
        assert_eq!(answer, range_response(Bytes::from(key)));
    });
}

#[test]
fn many_concurrent_unary_calls_on_one_connection() {
    run_client(|| async {
        let client = connect().await;
        for call in spawn_ranges(&client, 200) {
            let reply = call.await;
            assert_eq!(reply.code, Code::Ok);
            assert_eq!(reply.messages.len(), 1);
        }
    });
}

#[test]
fn bidi_stream_echoes_many_messages_in_order() {
    run_client(|| async {
        let mut client = connect().await;
        let (response, mut stream) = client
            .send_request(grpc_request("/etcdserverpb.Watch/Watch", &[]), false)
            .expect("send");
        // Response headers go out with the first response message, so the first request is
        // sent before waiting for them (grpc-go clients do the same).
        let mut response = Some(response);
        let mut body: Option<RecvStream> = None;
        let mut decoder = MessageDecoder::new(1 << 20);
        const MESSAGES: i64 = 500;
        for index in 0..MESSAGES {
            let key = Bytes::from(format!("key-{index}"));
            let request = WatchRequest {
                request_union: Some(
                    keel_proto::etcdserverpb::watch_request::RequestUnion::CreateRequest(
                        keel_proto::etcdserverpb::WatchCreateRequest {
                            key: key.clone(),
                            ..Default::default()
                        },
                    ),
                ),
            };
            stream
                .send_data(encode_message(&request, usize::MAX).expect("encode"), false)
                .expect("send");
            if let Some(response) = response.take() {
                let response = response.await.expect("headers");
                assert_eq!(response.status(), StatusCode::OK);
                body = Some(response.into_body());
            }
            let body = body.as_mut().expect("headers arrived");
            // Each answer arrives before the next request is sent: a true interleaved stream.
            let mut responses = Vec::new();
            let mut chunks = 0;
            while responses.len() < 2 {
                if let Some(message) = decoder.next_message().expect("frame") {
                    responses.push(WatchResponse::decode(message).expect("decode"));
                    continue;
                }
                chunks += 1;
                let chunk = body.data().await.expect("open").expect("data");
                body.flow_control()
                    .release_capacity(chunk.len())
                    .expect("release");
                decoder.push(&chunk);
            }
            // The two messages sent together came in one DATA frame.
            assert_eq!(
                chunks, 1,
                "two messages sent together came in {chunks} DATA frames"
            );
            assert_eq!(responses[0].watch_id, index);
            assert!(responses[0].created);
            assert_eq!(responses[1].watch_id, index);
            assert!(!responses[1].created);
            let kv = responses[1].events[0].kv.as_ref().expect("kv");
            assert_eq!(kv.key, key);
        }
        stream.send_data(Bytes::new(), true).expect("half-close");
        let mut body = body.expect("headers arrived");
        assert!(body.data().await.is_none());
        let trailers = body.trailers().await.expect("trailers").expect("present");
        assert_eq!(trailers.get("grpc-status").expect("status"), "0");
    });
}

#[test]
fn unknown_service_and_method_are_unimplemented() {
    run_client(|| async {
        let mut client = connect().await;
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Nope",
            &[],
            Some(range_request(b"a")),
        )
        .await;
        assert_eq!(reply.http_status, StatusCode::OK);
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (
                Code::Unimplemented,
                "unknown method Nope for service etcdserverpb.KV"
            )
        );
        let reply = call_raw(&mut client, "/foo.Bar/Baz", &[], None).await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::Unimplemented, "unknown service foo.Bar")
        );
    });
}

#[test]
fn malformed_protobuf_is_internal() {
    run_client(|| async {
        let mut client = connect().await;
        let garbage = keel_grpc::frame_bytes(&[0xff, 0xff, 0xff, 0xff]);
        let reply = call_raw(&mut client, "/etcdserverpb.KV/Range", &[], Some(garbage)).await;
        assert_eq!(reply.code, Code::Internal);
        assert!(
            reply
                .message
                .starts_with("grpc: error unmarshalling request: "),
            "{}",
            reply.message
        );
    });
}

#[test]
fn oversized_message_is_resource_exhausted() {
    run_client(|| async {
        let mut client = connect().await;
        let body = vec![0u8; MAX_RECV_MESSAGE_BYTES + 1];
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(keel_grpc::frame_bytes(&body)),
        )
        .await;
        assert_eq!(reply.code, Code::ResourceExhausted);
        assert_eq!(
            reply.message,
            format!(
                "grpc: received message larger than max ({} vs. {})",
                MAX_RECV_MESSAGE_BYTES + 1,
                MAX_RECV_MESSAGE_BYTES
            )
        );
        // The connection survives: the next call works.
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(range_request(b"a")),
        )
        .await;
        assert_eq!(reply.code, Code::Ok);
    });
}

#[test]
fn compressed_flag_without_encoding_is_internal() {
    run_client(|| async {
        let mut client = connect().await;
        let mut frame = BytesMut::from(&range_request(b"a")[..]);
        frame[0] = 1;
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(frame.freeze()),
        )
        .await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (
                Code::Internal,
                "grpc: compressed flag set with identity or empty encoding"
            )
        );
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[("grpc-encoding", "gzip")],
            Some(range_request(b"a")),
        )
        .await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (
                Code::Unimplemented,
                "grpc: Decompressor is not installed for grpc-encoding \"gzip\""
            )
        );
    });
}

#[test]
fn non_grpc_content_type_is_http_415() {
    run_client(|| async {
        let mut client = connect().await;
        let request = http::Request::builder()
            .method("POST")
            .uri("http://keel/etcdserverpb.KV/Range")
            .header("content-type", "application/json")
            .body(())
            .expect("request");
        let (response, _) = client.send_request(request, true).expect("send");
        let reply = read_reply(response).await;
        assert_eq!(reply.http_status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(reply.code, Code::InvalidArgument);
        assert_eq!(
            reply.message,
            "invalid gRPC request content-type \"application/json\""
        );
    });
}

#[test]
fn http2_get_health_is_served_by_the_http_endpoints() {
    run_client(|| async {
        let mut client = connect().await;
        let (status, _, body) = get_health(&mut client).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, b"{\"health\":\"true\",\"reason\":\"\"}");
    });
}

/// A plain HTTP/2 GET of /health: the status, the content type and the body.
async fn get_health(
    client: &mut SendRequest<Bytes>,
) -> (StatusCode, Option<http::HeaderValue>, Vec<u8>) {
    let request = http::Request::builder()
        .method("GET")
        .uri("http://keel/health")
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send");
    let response = response.await.expect("a response");
    let status = response.status();
    let content_type = response.headers().get("content-type").cloned();
    (status, content_type, read_body(response.into_body()).await)
}

/// A plain HTTP/2 answer's whole body.
async fn read_body(mut body: RecvStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body data");
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    bytes
}

/// A plain HTTP/2 POST of `body` to /echo: the status and the answer's body.
async fn post_echo(client: &mut SendRequest<Bytes>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let request = http::Request::builder()
        .method("POST")
        .uri("http://keel/echo")
        .header("content-type", "application/json")
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    send.send_data(body, true).expect("the body is sent");
    let response = response.await.expect("a response");
    let status = response.status();
    (status, read_body(response.into_body()).await)
}

#[test]
fn http2_posts_reach_the_http_endpoints_only_where_configured() {
    run_client(|| async {
        let mut client = connect_to(all_http_server_addr()).await;
        let (status, body) =
            post_echo(&mut client, Bytes::from_static(b"{\"key\":\"YQ==\"}")).await;
        assert_eq!(
            (status, body.as_slice()),
            (StatusCode::OK, &b"{\"key\":\"YQ==\"}"[..])
        );
        // A body past the limit is refused, as on HTTP/1.1, and the connection serves on.
        let big = Bytes::from(vec![b' '; ALL_HTTP_BODY_BYTES_MAX + 1]);
        let (status, _) = post_echo(&mut client, big).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let exact = Bytes::from(vec![b' '; ALL_HTTP_BODY_BYTES_MAX]);
        assert_eq!(post_echo(&mut client, exact).await.0, StatusCode::OK);
        // The default server refuses a non-gRPC POST as grpc-go does.
        let mut client = connect().await;
        let (status, _) = post_echo(&mut client, Bytes::from_static(b"{}")).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    });
}

#[test]
fn half_closed_streams_get_a_status() {
    run_client(|| async {
        let mut client = connect().await;
        // END_STREAM on the HEADERS frame: no message at all.
        let reply = call_raw(&mut client, "/etcdserverpb.KV/Range", &[], None).await;
        assert_eq!(reply.code, Code::Unknown, "{reply:?}");
        assert!(reply.message == "EOF", "{}", reply.message);
        // END_STREAM in the middle of a message prefix, then mid-body.
        for partial in [
            Bytes::from_static(&[0, 0, 0]),
            range_request(b"abc").slice(..7),
        ] {
            let reply = call_raw(&mut client, "/etcdserverpb.KV/Range", &[], Some(partial)).await;
            assert_eq!(
                (reply.code, reply.message.as_str()),
                (Code::Unknown, "unexpected EOF")
            );
        }
        // A bidi stream half-closed after a partial message also ends, with the same status.
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.Watch/Watch",
            &[],
            Some(Bytes::from_static(&[0, 0])),
        )
        .await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::Unknown, "unexpected EOF")
        );
    });
}

#[test]
fn grpc_timeout_expiry_is_deadline_exceeded() {
    run_client(|| async {
        let mut client = connect().await;
        let started = Instant::now();
        let reply = call_raw(
            &mut client,
            "/test.Slow/Sleep",
            &[("grpc-timeout", "100m")],
            Some(range_request(b"a")),
        )
        .await;
        let elapsed = started.elapsed();
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::DeadlineExceeded, "context deadline exceeded")
        );
        assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
        let reply = call_raw(
            &mut client,
            "/test.Slow/Sleep",
            &[("grpc-timeout", "soon")],
            None,
        )
        .await;
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::Internal, "transport: malformed time-out: \"soon\"")
        );
        // A deadline that passes mid-stream, after responses went out, ends in trailers.
        let (response, mut stream) = client
            .send_request(
                grpc_request("/etcdserverpb.Watch/Watch", &[("grpc-timeout", "200m")]),
                false,
            )
            .expect("send");
        let request = WatchRequest {
            request_union: Some(
                keel_proto::etcdserverpb::watch_request::RequestUnion::CreateRequest(
                    keel_proto::etcdserverpb::WatchCreateRequest {
                        key: Bytes::from_static(b"k"),
                        ..Default::default()
                    },
                ),
            ),
        };
        stream
            .send_data(encode_message(&request, usize::MAX).expect("encode"), false)
            .expect("send data");
        let reply = read_reply(response).await;
        assert_eq!(reply.messages.len(), 2);
        assert_eq!(
            (reply.code, reply.message.as_str()),
            (Code::DeadlineExceeded, "context deadline exceeded")
        );
    });
}

#[test]
fn large_response_streams_under_flow_control() {
    run_client(|| async {
        let mut client = connect().await;
        // The h2 client's default 64 KiB stream window forces the server to wait for capacity.
        let reply = call_raw(
            &mut client,
            "/test.Big/Download",
            &[],
            Some(range_request(b"a")),
        )
        .await;
        assert_eq!(reply.code, Code::Ok, "{reply:?}");
        assert_eq!(reply.messages.len(), 2);
        let big = RangeResponse::decode(reply.messages[0].clone()).expect("decode");
        assert_eq!(big.kvs.len(), BIG_VALUE_COUNT);
        for (index, kv) in big.kvs.iter().enumerate() {
            assert_eq!(kv.value.len(), BIG_VALUE_BYTES);
            assert!(kv.value.iter().all(|byte| *byte == index as u8));
        }
        let tail = RangeResponse::decode(reply.messages[1].clone()).expect("decode");
        assert_eq!(tail.kvs[0].key, Bytes::from_static(b"tail"));
    });
}

#[test]
fn a_large_answer_is_encoded_only_as_fast_as_the_client_reads_it() {
    run_client(|| async {
        let mut client = connect().await;
        let (response, mut stream) = client
            .send_request(grpc_request("/test.Big/Pieces", &[]), false)
            .expect("send");
        stream
            .send_data(range_request(b"a"), true)
            .expect("send data");
        let response = response.await.expect("response head");
        // The client reads nothing: the stream's 64 KiB window fills and the server must stop
        // encoding, holding about one piece, not the 8 MiB answer.
        let started = Instant::now();
        while PIECES_ENCODED_BYTES.load(Ordering::SeqCst) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nothing encoded"
            );
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        glommio::timer::sleep(Duration::from_millis(300)).await;
        let encoded_while_stalled = PIECES_ENCODED_BYTES.load(Ordering::SeqCst);
        let whole_bytes = pieces_answer().encoded_len();
        assert!(whole_bytes > 8 << 20);
        let bound_bytes = 64 * 1024 + 2 * keel_grpc::codec::PIECE_BYTES_TARGET + PIECES_VALUE_BYTES;
        assert!(
            encoded_while_stalled <= bound_bytes,
            "encoded {encoded_while_stalled} bytes of {whole_bytes} while the client read nothing \
             (bound {bound_bytes})"
        );
        let mut body = response.into_body();
        let messages = read_messages(&mut body).await;
        let trailers = body.trailers().await.expect("trailers").expect("present");
        assert_eq!(trailers.get("grpc-status").expect("status"), "0");
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].len(), whole_bytes);
        assert_eq!(
            RangeResponse::decode(messages[0].clone()).expect("decodes"),
            pieces_answer()
        );
        assert_eq!(PIECES_ENCODED_BYTES.load(Ordering::SeqCst), whole_bytes);
    });
}

fn read_until_closed(stream: &mut StdTcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return received,
            Ok(count) => received.extend_from_slice(&chunk[..count]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return received,
            Err(error) => panic!("connection was not closed: {error}"),
        }
    }
}

#[test]
fn garbage_closes_only_that_connection() {
    // HTTP/2 preface followed by garbage frames: the server must close the connection.
    let mut broken = StdTcpStream::connect(server_addr()).expect("connect");
    broken
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .expect("preface");
    broken
        .write_all(&[
            0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0xff, 0xff, 0x00, 0x01, 0x02, 0x03,
        ])
        .expect("garbage");
    read_until_closed(&mut broken);
    // Binary garbage without the preface goes to the HTTP/1.1 parser: 400 then close.
    let mut junk = StdTcpStream::connect(server_addr()).expect("connect");
    junk.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n")
        .expect("junk");
    let answer = read_until_closed(&mut junk);
    assert!(
        answer.starts_with(b"HTTP/1.1 400 Bad Request\r\n"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    // A fresh connection still works.
    run_client(|| async {
        let mut client = connect().await;
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(range_request(b"foo")),
        )
        .await;
        assert_eq!(reply.code, Code::Ok);
    });
}

/// One HTTP/2 frame: the 9-byte head, then the payload.
fn h2_frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(9 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    frame.push(kind);
    frame.push(flags);
    frame.extend_from_slice(&stream_id.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An HPACK string literal, not Huffman-coded (7-bit length prefix).
fn hpack_literal(block: &mut Vec<u8>, text: &str) {
    assert!(text.len() < 127);
    block.push(text.len() as u8);
    block.extend_from_slice(text.as_bytes());
}

/// Sends one gRPC call on `stream_id` with `block` as its HPACK header block and a
/// RangeRequest for "cached" as its body, and reads frames until the stream ends. Returns the
/// DATA bytes the server sent on it (empty for a trailers-only error answer). The block goes
/// in a HEADERS frame, or split after `continued_from` bytes into HEADERS and CONTINUATION.
fn raw_call(
    socket: &mut StdTcpStream,
    stream_id: u32,
    block: &[u8],
    continued_from: Option<usize>,
) -> Vec<u8> {
    raw_call_or_goaway(socket, stream_id, block, continued_from)
        .unwrap_or_else(|| panic!("the server ended the connection at stream {stream_id}"))
}

/// `raw_call`, or None when the server ends the connection instead (GOAWAY) before the
/// stream ends.
fn raw_call_or_goaway(
    socket: &mut StdTcpStream,
    stream_id: u32,
    block: &[u8],
    continued_from: Option<usize>,
) -> Option<Vec<u8>> {
    const DATA: u8 = 0;
    const HEADERS: u8 = 1;
    const RST_STREAM: u8 = 3;
    const SETTINGS: u8 = 4;
    const GOAWAY: u8 = 7;
    const CONTINUATION: u8 = 9;
    const END_STREAM: u8 = 0x1;
    const END_HEADERS: u8 = 0x4;
    let mut out = match continued_from {
        None => h2_frame(HEADERS, END_HEADERS, stream_id, block),
        Some(at) => {
            let mut frames = h2_frame(HEADERS, 0, stream_id, &block[..at]);
            frames.extend(h2_frame(CONTINUATION, END_HEADERS, stream_id, &block[at..]));
            frames
        }
    };
    out.extend(h2_frame(
        DATA,
        END_STREAM,
        stream_id,
        &range_request(b"cached"),
    ));
    socket.write_all(&out).expect("send call");
    let mut data = Vec::new();
    loop {
        let mut head = [0u8; 9];
        socket.read_exact(&mut head).expect("frame head");
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        socket.read_exact(&mut payload).expect("frame payload");
        if kind == SETTINGS && flags & 0x1 == 0 {
            socket
                .write_all(&h2_frame(SETTINGS, 0x1, 0, &[]))
                .expect("settings ack");
        }
        if kind == GOAWAY {
            assert!(
                data.is_empty(),
                "stream {stream_id} was answered, then GOAWAY"
            );
            return None;
        }
        if id != stream_id {
            continue;
        }
        assert_ne!(kind, RST_STREAM, "stream {stream_id} was reset");
        if kind == DATA {
            data.extend_from_slice(&payload);
        }
        if (kind == DATA || kind == HEADERS) && flags & END_STREAM != 0 {
            return Some(data);
        }
    }
}

/// A block naming :method POST and :scheme http from the static table, then `path_field`
/// (a :path representation, its first byte given, e.g. 0x44 with incremental indexing), then
/// `content-type: application/grpc` without indexing. `prefix` goes first (a size update).
fn grpc_head_block(prefix: &[u8], path_field: u8, path: &str) -> Vec<u8> {
    let mut block = prefix.to_vec();
    block.extend_from_slice(&[0x83, 0x86, path_field]);
    hpack_literal(&mut block, path);
    block.extend_from_slice(&[0x0f, 0x10]);
    hpack_literal(&mut block, "application/grpc");
    block
}

/// The same fields with :path taken from dynamic table index 62: bytes that change no table.
fn indexed_head_block() -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0xbe, 0x0f, 0x10];
    hpack_literal(&mut block, "application/grpc");
    block
}

/// A raw HTTP/2 connection to the test server: preface and an empty SETTINGS sent.
fn raw_h2_connection() -> StdTcpStream {
    let mut socket = StdTcpStream::connect(server_addr()).expect("connect");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    socket
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .expect("preface");
    socket.write_all(&h2_frame(4, 0, 0, &[])).expect("settings");
    socket
}

/// Whether `raw_call`'s DATA holds the Range answer for the key "cached".
fn answered(data: &[u8]) -> bool {
    data.windows(6).any(|window| window == b"cached")
}

/// h2 (patched) keeps the last request head a connection decoded and serves the same block
/// bytes from it while the HPACK dynamic table is unchanged. The same bytes must still mean
/// what the table says: here the block indexes its :path from the table (index 62), and calls
/// in between put a different :path there. Those calls send their block as HEADERS plus
/// CONTINUATION, a path that does not pass through the kept head, so only the table's change
/// count can tell the kept head stale (a whole block in between would replace it anyway).
#[test]
fn a_repeated_header_block_means_what_the_current_header_table_says() {
    // :path with incremental indexing: it goes to table index 62.
    let path_inserting_block = |path: &str| grpc_head_block(&[], 0x44, path);
    let indexed = indexed_head_block();
    // The same, with a `token: bad` literal that the handler refuses.
    let mut with_bad_token = indexed.clone();
    with_bad_token.push(0x00);
    hpack_literal(&mut with_bad_token, "token");
    hpack_literal(&mut with_bad_token, "bad");

    let mut socket = raw_h2_connection();
    let mut stream_id = 1;
    let mut call_split = |block: &[u8], continued_from: Option<usize>| {
        let data = raw_call(&mut socket, stream_id, block, continued_from);
        stream_id += 2;
        data
    };

    let data = call_split(&path_inserting_block("/etcdserverpb.KV/Range"), None);
    assert!(answered(&data), "a Range call is answered: {data:?}");
    // The token field must come back each time too: the handler refuses it with no DATA.
    for round in 0..4 {
        let data = call_split(&with_bad_token, None);
        assert!(data.is_empty(), "bad token call {round}: {data:?}");
    }
    // Seen once, seen again (kept), then served from what was kept. These
    // stay kept across the next call, whose block does not pass through the kept head.
    for round in 0..4 {
        let data = call_split(&indexed, None);
        assert!(answered(&data), "indexed Range call {round}: {data:?}");
    }
    // Table index 62 becomes another :path: the same indexed bytes now name a method the
    // handler does not know (answered with trailers only).
    let data = call_split(&path_inserting_block("/test.Big/Nope"), Some(2));
    assert!(data.is_empty(), "unknown method: {data:?}");
    for round in 0..3 {
        let data = call_split(&indexed, None);
        assert!(
            data.is_empty(),
            "indexed call {round} after the table changed: {data:?}"
        );
    }
    let data = call_split(&path_inserting_block("/etcdserverpb.KV/Range"), Some(2));
    assert!(answered(&data), "Range again: {data:?}");
    for round in 0..3 {
        let data = call_split(&indexed, None);
        assert!(
            answered(&data),
            "indexed Range call {round}, again: {data:?}"
        );
    }
}

/// A call whose head repeats its connection's last one, from the third on (the second is
/// decoded and kept), gets that head's fields shared (`Metadata::Shared`, h2's
/// `share_repeated_heads`), and reads them as its own; a different head is decoded for its
/// call, and replaces the one kept.
#[test]
fn a_repeated_head_shares_its_fields_and_a_new_one_is_its_own() {
    let probe_block = |value: &str| {
        // :path and the probe as literals without indexing: the bytes change no table.
        let mut block = grpc_head_block(&[], 0x04, "/etcdserverpb.KV/Range");
        block.push(0x00);
        hpack_literal(&mut block, "head-probe");
        hpack_literal(&mut block, value);
        block
    };
    let how = |data: &[u8]| {
        for (needle, what) in [(&b"head:shared"[..], "shared"), (&b"head:own"[..], "own")] {
            if data.windows(needle.len()).any(|w| w == needle) {
                return what;
            }
        }
        panic!("no probe answer in {data:?}")
    };
    let mut socket = raw_h2_connection();
    let mut stream_id = 1;
    let mut call = |block: &[u8]| {
        let data = raw_call(&mut socket, stream_id, block, None);
        stream_id += 2;
        how(&data)
    };
    let (first, second) = (probe_block("1"), probe_block("2"));
    let seen: Vec<&str> = (0..4).map(|_| call(&first)).collect();
    assert_eq!(seen, ["own", "own", "shared", "shared"]);
    assert_eq!(call(&second), "own", "a new head is decoded for its call");
    let seen: Vec<&str> = (0..3).map(|_| call(&first)).collect();
    assert_eq!(
        seen,
        ["own", "own", "shared"],
        "the first head was replaced"
    );
}

/// As above, with the table changed by a size update instead: the client empties its table
/// (a size update to 0 at the start of a block split over HEADERS and CONTINUATION, so the
/// kept head stays), and the kept indexed bytes then name an entry that no longer exists. The
/// server must fail to decode them (a connection error, as HPACK asks), not serve the head it
/// kept from before.
#[test]
fn a_header_table_size_update_makes_a_kept_head_stale() {
    let range_path_inserted = grpc_head_block(&[], 0x44, "/etcdserverpb.KV/Range");
    let indexed = indexed_head_block();
    // Table size 0 (a size update, 0x20, evicting everything), then :path as a literal
    // without indexing (0x04).
    let emptied = grpc_head_block(&[0x20], 0x04, "/etcdserverpb.KV/Range");

    let mut socket = raw_h2_connection();
    let data = raw_call(&mut socket, 1, &range_path_inserted, None);
    assert!(answered(&data), "a Range call is answered: {data:?}");
    for (round, stream_id) in [3, 5, 7].into_iter().enumerate() {
        let data = raw_call(&mut socket, stream_id, &indexed, None);
        assert!(answered(&data), "indexed Range call {round}: {data:?}");
    }
    let data = raw_call(&mut socket, 9, &emptied, Some(1));
    assert!(answered(&data), "a call after the size update: {data:?}");
    let after = raw_call_or_goaway(&mut socket, 11, &indexed, None);
    assert_eq!(
        after, None,
        "index 62 names nothing once the table is empty, so the connection must end"
    );
}

#[test]
fn http1_health_on_the_grpc_port() {
    let mut stream = StdTcpStream::connect(server_addr()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: keel\r\n\r\n")
        .expect("request");
    let expected_body = b"{\"health\":\"true\",\"reason\":\"\"}";
    let mut received = Vec::new();
    let mut chunk = [0u8; 1024];
    while !received.ends_with(expected_body) {
        let count = stream.read(&mut chunk).expect("read");
        assert!(
            count > 0,
            "closed early: {:?}",
            String::from_utf8_lossy(&received)
        );
        received.extend_from_slice(&chunk[..count]);
    }
    let text = String::from_utf8(received).expect("utf-8");
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Content-Type: application/json\r\n"));
    // Keep-alive: a second request on the same connection, which then asks to close.
    stream
        .write_all(b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
        .expect("request");
    let answer = read_until_closed(&mut stream);
    assert!(
        answer.starts_with(b"HTTP/1.1 404 Not Found\r\n"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
}

#[test]
fn etcdctl_reads_a_key_through_our_framing() {
    let Ok(output) = std::process::Command::new("etcdctl")
        .arg("version")
        .output()
    else {
        println!("note: etcdctl is not installed; skipping the etcdctl test");
        return;
    };
    assert!(output.status.success());
    let addr = server_addr();
    let output = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            &format!("--endpoints={addr}"),
            "--command-timeout=10s",
            "get",
            "foo",
            "-w",
            "json",
        ])
        .output()
        .expect("run etcdctl");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Bytes are base64 in etcdctl's JSON: "foo" is Zm9v and "bar" is YmFy.
    assert!(stdout.contains("\"key\":\"Zm9v\""), "{stdout}");
    assert!(stdout.contains("\"value\":\"YmFy\""), "{stdout}");
    assert!(stdout.contains("\"revision\":5"), "{stdout}");
    // A real client decodes our trailers-only errors, code and percent-decoded text.
    let endpoints = format!("--endpoints={addr}");
    let failures = [
        (
            vec!["get", "compacted"],
            "code = OutOfRange desc = etcdserver: mvcc: required revision has been compacted",
        ),
        (
            vec!["put", "foo", "bar"],
            "code = Unimplemented desc = unknown method Put for service etcdserverpb.KV",
        ),
    ];
    for (args, expected) in failures {
        let output = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([endpoints.as_str(), "--command-timeout=10s"])
            .args(&args)
            .output()
            .expect("run etcdctl");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn keepalive_pings_are_answered_without_goaway() {
    run_client(|| async {
        let stream = TcpStream::connect(server_addr()).await.expect("connect");
        let (client, mut connection) = h2::client::handshake(stream.compat())
            .await
            .expect("handshake");
        let mut ping_pong = connection.ping_pong().expect("ping handle");
        glommio::spawn_local(async move {
            let _ = connection.await;
        })
        .detach();
        for _ in 0..5 {
            ping_pong.ping(h2::Ping::opaque()).await.expect("pong");
        }
        let mut client = client.ready().await.expect("ready");
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(range_request(b"a")),
        )
        .await;
        assert_eq!(reply.code, Code::Ok);
    });
}

#[test]
fn client_reset_drops_the_handler() {
    run_client(|| async {
        let mut client = connect().await;
        let (_response, mut stream) = client
            .send_request(grpc_request("/test.Slow/Hold", &[]), false)
            .expect("send");
        stream
            .send_data(range_request(b"a"), false)
            .expect("send data");
        glommio::timer::sleep(Duration::from_millis(100)).await;
        assert_eq!(HOLD_DROPPED.load(Ordering::SeqCst), 0);
        stream.send_reset(h2::Reason::CANCEL);
        let started = Instant::now();
        while HOLD_DROPPED.load(Ordering::SeqCst) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "handler still running"
            );
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        // The connection is still usable.
        let reply = call_raw(
            &mut client,
            "/etcdserverpb.KV/Range",
            &[],
            Some(range_request(b"b")),
        )
        .await;
        assert_eq!(reply.code, Code::Ok);
    });
}

/// Throughput probe, not a CI test: `cargo test -p keel-grpc --test server -- --ignored
/// --nocapture unary_throughput`. Client and server share the machine's cores.
#[test]
#[ignore = "benchmark: run by hand with --ignored"]
fn unary_throughput() {
    const CONNECTIONS: usize = 4;
    const IN_FLIGHT_PER_CONNECTION: usize = 64;
    const RUN: Duration = Duration::from_secs(3);
    let completed = run_client(|| async {
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..CONNECTIONS {
            let client = connect().await;
            for _ in 0..IN_FLIGHT_PER_CONNECTION {
                let mut client = client.clone();
                workers.push(glommio::spawn_local(async move {
                    let mut calls = 0u64;
                    while started.elapsed() < RUN {
                        let reply = call_raw(
                            &mut client,
                            "/etcdserverpb.KV/Range",
                            &[],
                            Some(range_request(b"foo")),
                        )
                        .await;
                        assert_eq!(reply.code, Code::Ok);
                        calls += 1;
                    }
                    calls
                }));
            }
        }
        let mut completed = 0;
        for worker in workers {
            completed += worker.await;
        }
        completed
    });
    println!(
        "unary Range: {completed} calls in {RUN:?} = {:.0} calls/s ({CONNECTIONS} connections x {IN_FLIGHT_PER_CONNECTION} in flight)",
        completed as f64 / RUN.as_secs_f64()
    );
    assert!(completed > 0);
}

/// Reads a body that must end in a reset after a torn message: the bytes before it and the
/// reset's error.
async fn read_until_reset(body: &mut h2::RecvStream) -> (usize, h2::Error) {
    let mut received_bytes = 0;
    loop {
        match body.data().await {
            Some(Ok(chunk)) => {
                received_bytes += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Some(Err(error)) => return (received_bytes, error),
            None => panic!("stream ended cleanly after a torn message"),
        }
    }
}

#[test]
fn deadline_mid_message_resets_instead_of_trailers() {
    run_client(|| async {
        let mut client = connect().await;
        let (response, mut stream) = client
            .send_request(
                grpc_request("/test.Big/Download", &[("grpc-timeout", "100m")]),
                false,
            )
            .expect("send");
        stream
            .send_data(range_request(b"a"), true)
            .expect("send data");
        let response = response.await.expect("headers");
        // Not reading: the 64 KiB stream window stops the 8 MiB message part way.
        glommio::timer::sleep(Duration::from_millis(300)).await;
        let mut body = response.into_body();
        let (received_bytes, error) = read_until_reset(&mut body).await;
        assert_eq!(error.reason(), Some(h2::Reason::CANCEL), "{error}");
        assert!(received_bytes < BIG_VALUE_BYTES * BIG_VALUE_COUNT);
    });
}

#[test]
fn a_message_that_fails_before_any_byte_gets_its_status_and_part_way_a_reset() {
    run_client(|| async {
        let mut client = connect().await;
        // Nothing of the message went out: the status goes in trailers, as etcd's would.
        let (response, mut stream) = client
            .send_request(grpc_request("/test.Big/FailingPieces", &[]), false)
            .expect("send");
        stream
            .send_data(range_request(b"first"), true)
            .expect("send data");
        let response = response.await.expect("headers");
        let headers = response.headers().clone();
        let mut body = response.into_body();
        let messages = read_messages(&mut body).await;
        assert!(messages.is_empty());
        let trailers = body.trailers().await.expect("trailers");
        let status = trailers.as_ref().unwrap_or(&headers);
        assert_eq!(status.get("grpc-status").expect("status"), "11");
        assert_eq!(
            status.get("grpc-message").expect("message"),
            "etcdserver: mvcc: required revision has been compacted"
        );
        // Part of the message went out: no trailers can follow a torn message, and the reset
        // says the server failed (INTERNAL_ERROR, which clients report as Internal), not that
        // the client canceled.
        let (response, mut stream) = client
            .send_request(grpc_request("/test.Big/FailingPieces", &[]), false)
            .expect("send");
        stream
            .send_data(range_request(b"later"), true)
            .expect("send data");
        let mut body = response.await.expect("headers").into_body();
        let (received_bytes, error) = read_until_reset(&mut body).await;
        assert_eq!(error.reason(), Some(h2::Reason::INTERNAL_ERROR), "{error}");
        assert!(received_bytes > 0 && received_bytes < pieces_answer().encoded_len());
    });
}

#[test]
fn silent_connections_are_closed_after_the_preface_timeout() {
    let started = Instant::now();
    let mut silent = StdTcpStream::connect(server_addr()).expect("connect");
    let received = read_until_closed(&mut silent);
    let elapsed = started.elapsed();
    assert!(received.is_empty());
    assert!(elapsed >= PREFACE_TIMEOUT, "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn http1_clients_that_stall_mid_request_or_idle_between_requests_are_closed() {
    // Half a request head: the preface timeout covers the first bytes, the read timeout the
    // rest of the head.
    let started = Instant::now();
    let mut half = StdTcpStream::connect(server_addr()).expect("connect");
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    let received = read_until_closed(&mut half);
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    let elapsed = started.elapsed();
    assert!(elapsed >= PREFACE_TIMEOUT, "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    // A kept-alive connection that answered one request and then idles.
    let started = Instant::now();
    let mut idle = StdTcpStream::connect(server_addr()).expect("connect");
    idle.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let received = read_until_closed(&mut idle);
    assert!(
        received.starts_with(b"HTTP/1.1 "),
        "no answer before the close"
    );
    let elapsed = started.elapsed();
    assert!(elapsed >= PREFACE_TIMEOUT, "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn etcdctl_watch_runs_over_our_bidi_stream() {
    if std::process::Command::new("etcdctl")
        .arg("version")
        .output()
        .is_err()
    {
        println!("note: etcdctl is not installed; skipping the etcdctl watch test");
        return;
    }
    // The test Watch handler answers a create with created=true and a PUT event for the key.
    let mut child = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            &format!("--endpoints={}", server_addr()),
            "watch",
            "watched-key",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn etcdctl");
    let mut stdout = child.stdout.take().expect("stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut chunk = [0u8; 256];
        while let Ok(count) = stdout.read(&mut chunk) {
            if count == 0 {
                break;
            }
            seen.extend_from_slice(&chunk[..count]);
            if String::from_utf8_lossy(&seen).contains("PUT\nwatched-key") {
                break;
            }
        }
        let _ = sender.send(seen);
    });
    let seen = receiver.recv_timeout(Duration::from_secs(10));
    let _ = child.kill();
    let mut stderr = String::new();
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    let _ = child.wait();
    let seen = String::from_utf8_lossy(&seen.expect("etcdctl printed the event")).into_owned();
    assert!(
        seen.contains("PUT\nwatched-key"),
        "stdout: {seen}\nstderr: {stderr}"
    );
}
