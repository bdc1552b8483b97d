//! The connection driver: protocol sniffing, the h2 server, per-stream call tasks, deadlines,
//! flow control, trailers. Runtime-agnostic: the server supplies a [`Runtime`] to spawn local
//! tasks and sleep, and an I/O object implementing tokio's `AsyncRead + AsyncWrite`.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::{select, Either};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::CONTENT_TYPE;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::codec::{
    encode_message, put_prefix, MessageDecoder, PieceEncode, Whole, DEFAULT_MAX_RECV_MESSAGE_BYTES,
    DEFAULT_MAX_SEND_MESSAGE_BYTES, PIECE_BYTES_TARGET, PREFIX_BYTES,
};
use crate::error::GrpcError;
use crate::http1::{serve_http1, Http1Limits, HttpRequest, HttpResponse};
use crate::status::{Code, Status};

/// The HTTP/2 client connection preface; anything else on the port is served as HTTP/1.1.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Keel's default SETTINGS_MAX_CONCURRENT_STREAMS. etcd 3.4 advertises math.MaxUint32 (no
/// limit); we keep one because every stream is a task with its own receive buffer. grpc-go
/// clients queue calls beyond the advertised limit instead of failing them, so a limit only
/// delays, and 10,000 is far above what one kube-apiserver keeps in flight on a connection
/// (its default --max-requests-inflight 400 plus --max-mutating-requests-inflight 200, plus
/// a few watch streams, which clientv3 multiplexes).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 10_000;

/// Keel's default time a new connection has to send its first bytes. grpc-go's server allows
/// 120 s for its whole handshake; until then a silent client holds a file descriptor and one of
/// its shard's connection slots, so we close it sooner. Real clients send their first bytes
/// right after the TCP handshake.
pub const DEFAULT_PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server's executor provides: local (non-`Send`) task spawning and a timer.
pub trait Runtime: 'static {
    /// Runs `task` to completion on the current thread's executor, detached.
    fn spawn_local(&self, task: Pin<Box<dyn Future<Output = ()>>>);
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()>>>;
}

/// What the server serves. One value (behind `Rc`) serves every connection of a shard.
pub trait Handler: 'static {
    /// Serves one gRPC call. Dispatch on `call.head.path` (e.g. `/etcdserverpb.KV/Range`);
    /// answer unknown paths with [`Status::unknown_method`]. Send responses through `sink`,
    /// then return the final status: the library writes it as trailers (or as a trailers-only
    /// response when nothing was sent). When the call's deadline passes first, this future is
    /// dropped and the call ends with DeadlineExceeded.
    fn grpc<'a>(
        self: Rc<Self>,
        call: Call,
        sink: &'a mut ResponseSink,
    ) -> impl Future<Output = Status> + 'a;

    /// Serves one plain HTTP/1.1 request on the same port. Defaults to 404.
    fn http(self: Rc<Self>, request: HttpRequest) -> impl Future<Output = HttpResponse> + 'static {
        let _ = request;
        async { HttpResponse::not_found() }
    }
}

/// Limits and HTTP/2 settings for every connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest request message accepted (etcd: max-request-bytes + 512 KiB).
    pub max_recv_message_bytes: usize,
    /// Largest response message sent (grpc-go default: i32::MAX).
    pub max_send_message_bytes: usize,
    /// SETTINGS_MAX_CONCURRENT_STREAMS: bounds the call tasks of one connection. h2 refuses a
    /// stream beyond it with RST_STREAM(REFUSED_STREAM) and the connection serves on.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: what a client may send on one stream before we release.
    pub initial_stream_window_bytes: u32,
    /// The connection-level receive window.
    pub initial_connection_window_bytes: u32,
    /// SETTINGS_MAX_FRAME_SIZE we accept (16 KiB to 16 MiB - 1).
    pub max_frame_bytes: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: bounds request metadata.
    pub max_header_list_bytes: u32,
    /// Send data h2 may buffer per stream ahead of the peer's window.
    pub max_send_buffer_bytes: usize,
    /// h2's connection-wide budget for the framing overhead of buffered small DATA frames
    /// (about 256 bytes per frame minus its payload); exceeding it closes the connection with
    /// ENHANCE_YOUR_CALM. Must cover a full window of small messages a handler has not read yet.
    pub data_frame_budget_bytes: usize,
    /// How long a new connection may take to send its first bytes (the HTTP/2 preface or an
    /// HTTP/1.1 request line) before it is closed; on HTTP/1.1 also the longest wait for the
    /// next bytes of a request, or for the next request on a kept-alive connection.
    pub preface_timeout: Duration,
    /// Limits for HTTP/1.1 requests on the same port (a body's limit also bounds a POST's
    /// body over HTTP/2).
    pub http1: Http1Limits,
    /// Whether every non-gRPC request over HTTP/2, whatever its method (the JSON gateway's
    /// POSTs), reaches the HTTP endpoints; otherwise only GET and HEAD do and the rest are
    /// refused as grpc-go refuses them. etcd 3.4 serves them all on its TLS listeners, where
    /// one handler splits requests by content type, but not over plaintext h2c, where its
    /// connection multiplexer hands every HTTP/2 connection to grpc-go.
    pub all_http_over_h2: bool,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            max_recv_message_bytes: DEFAULT_MAX_RECV_MESSAGE_BYTES,
            max_send_message_bytes: DEFAULT_MAX_SEND_MESSAGE_BYTES,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            initial_stream_window_bytes: 1024 * 1024,
            initial_connection_window_bytes: 16 * 1024 * 1024,
            max_frame_bytes: 64 * 1024,
            max_header_list_bytes: 64 * 1024,
            max_send_buffer_bytes: 1024 * 1024,
            data_frame_budget_bytes: 16 * 1024 * 1024,
            preface_timeout: DEFAULT_PREFACE_TIMEOUT,
            http1: Http1Limits::default(),
            all_http_over_h2: false,
        }
    }
}

impl ServerConfig {
    fn check(&self) {
        assert!(self.max_recv_message_bytes > 0);
        assert!(self.max_send_message_bytes > 0);
        assert!(self.max_concurrent_streams > 0);
        assert!((16_384..=16_777_215).contains(&self.max_frame_bytes));
        assert!(self.initial_stream_window_bytes <= i32::MAX as u32);
        assert!(self.initial_connection_window_bytes <= i32::MAX as u32);
        // A unary answer may be queued whole ahead of the window (`send_last_pieces`).
        assert!(self.max_send_buffer_bytes >= UNARY_AT_ONCE_BYTES_MAX);
        assert!(self.data_frame_budget_bytes > 0);
        assert!(!self.preface_timeout.is_zero());
    }
}

/// The request side of one call: what arrived in the HEADERS frame.
#[derive(Clone, Debug)]
pub struct CallHead {
    /// The method path, e.g. `/etcdserverpb.KV/Range` (`path()`): the bytes of the request's
    /// `:path`, shared, not copied out.
    pub path: PathAndQuery,
    /// Request metadata (`hasleader`, `token`, `client-api-version`, ...), HTTP/2 headers as sent.
    pub metadata: Metadata,
    /// The call's time budget from `grpc-timeout`, measured from when the call arrived. The
    /// library enforces it; handlers may use it to bound their own waits.
    pub timeout: Option<Duration>,
}

/// A call's request metadata: its own header map, or the fields of its connection's last
/// head, shared, when the call's head repeated that one (h2's `share_repeated_heads`: a
/// client sends the same head call after call). Reads through `Deref`; `to_mut` copies a
/// shared map before a change.
#[derive(Debug, Clone)]
pub enum Metadata {
    Own(HeaderMap),
    Shared(std::sync::Arc<HeaderMap>),
}

impl Metadata {
    /// The map, to change: a shared one is copied first, so the change is this call's alone.
    pub fn to_mut(&mut self) -> &mut HeaderMap {
        if let Metadata::Shared(shared) = self {
            *self = Metadata::Own(HeaderMap::clone(shared));
        }
        match self {
            Metadata::Own(map) => map,
            Metadata::Shared(_) => unreachable!("copied just above"),
        }
    }
}

impl std::ops::Deref for Metadata {
    type Target = HeaderMap;

    fn deref(&self) -> &HeaderMap {
        match self {
            Metadata::Own(map) => map,
            Metadata::Shared(map) => map,
        }
    }
}

impl From<HeaderMap> for Metadata {
    fn from(map: HeaderMap) -> Metadata {
        Metadata::Own(map)
    }
}

impl Default for Metadata {
    fn default() -> Metadata {
        Metadata::Own(HeaderMap::new())
    }
}

/// One incoming call.
#[derive(Debug)]
pub struct Call {
    pub head: CallHead,
    pub requests: RequestStream,
}

/// What one call moved, message by message (go-grpc-prometheus's `grpc_server_msg_*` and
/// etcd's `etcd_network_client_grpc_*_bytes_total` count the same). Bytes are message bodies,
/// without the 5-byte gRPC prefix, as etcd counts them. Shared by the call's request stream and
/// its response sink (one task, so plain cells).
#[derive(Debug, Default)]
pub struct CallCounts {
    pub messages_received: Cell<u64>,
    pub bytes_received: Cell<u64>,
    pub messages_sent: Cell<u64>,
    pub bytes_sent: Cell<u64>,
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get() + n);
}

/// The request messages of one call, in order, under the receive limit.
#[derive(Debug)]
pub struct RequestStream {
    body: Source,
    decoder: MessageDecoder,
    end: StreamEnd,
    counts: Rc<CallCounts>,
}

/// Where a call's request messages come from.
#[derive(Debug)]
enum Source {
    /// A gRPC call's HTTP/2 stream.
    H2(RecvStream),
    /// An in-process call (the JSON gateway's streaming calls): these messages, then the end.
    Local(std::collections::VecDeque<Bytes>),
}

#[derive(Debug)]
enum StreamEnd {
    Open,
    Ended,
    Failed(Status),
}

impl RequestStream {
    fn new(body: RecvStream, max_message_bytes: usize, counts: Rc<CallCounts>) -> RequestStream {
        RequestStream {
            body: Source::H2(body),
            decoder: MessageDecoder::new(max_message_bytes),
            end: StreamEnd::Open,
            counts,
        }
    }

    /// An in-process call's request side: yields `messages` (bodies without the 5-byte gRPC
    /// prefix), then ends as a client's half-close does.
    pub fn local(messages: Vec<Bytes>, counts: Rc<CallCounts>) -> RequestStream {
        RequestStream {
            body: Source::Local(messages.into()),
            decoder: MessageDecoder::new(usize::MAX),
            end: StreamEnd::Open,
            counts,
        }
    }

    /// The next message body, undecoded. `Ok(None)`: the client half-closed cleanly. An error
    /// is the status the call should end with (and is returned again on later calls).
    ///
    /// Cancel-safe: its only await is h2's `poll_data_releasing`, and a received chunk is
    /// buffered before any other await, so dropping this future (e.g. in a `select`) loses no
    /// bytes.
    pub async fn next_raw(&mut self) -> Result<Option<Bytes>, Status> {
        let body = match &mut self.body {
            Source::H2(body) => body,
            Source::Local(messages) => {
                let message = messages.pop_front();
                if let Some(message) = &message {
                    add(&self.counts.messages_received, 1);
                    add(&self.counts.bytes_received, message.len() as u64);
                }
                return Ok(message);
            }
        };
        loop {
            match &self.end {
                StreamEnd::Failed(status) => return Err(status.clone()),
                StreamEnd::Ended | StreamEnd::Open => {}
            }
            match self.decoder.next_message() {
                Ok(Some(message)) => {
                    add(&self.counts.messages_received, 1);
                    add(&self.counts.bytes_received, message.len() as u64);
                    return Ok(Some(message));
                }
                Ok(None) => {}
                Err(status) => {
                    self.end = StreamEnd::Failed(status.clone());
                    return Err(status);
                }
            }
            if let StreamEnd::Ended = self.end {
                return match self.decoder.end_of_stream_status() {
                    None => Ok(None),
                    Some(status) => {
                        self.end = StreamEnd::Failed(status.clone());
                        Err(status)
                    }
                };
            }
            // Each chunk's window is given back as it is taken (one lock of h2's, not two):
            // its bytes now live in our bounded buffer, and the client may send the rest.
            match poll_fn(|cx| body.poll_data_releasing(cx)).await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(error)) => {
                    let status = status_from_h2(&error);
                    self.end = StreamEnd::Failed(status.clone());
                    return Err(status);
                }
                None => self.end = StreamEnd::Ended,
            }
        }
    }

    /// The next message decoded as `M`. `Ok(None)`: the client half-closed cleanly.
    /// Cancel-safe, like [`RequestStream::next_raw`].
    pub async fn decode<M: prost::Message + Default>(&mut self) -> Result<Option<M>, Status> {
        match self.next_raw().await? {
            None => Ok(None),
            Some(body) => M::decode(body).map(Some).map_err(|error| {
                Status::new(
                    Code::Internal,
                    format!("grpc: error unmarshalling request: {error}"),
                )
            }),
        }
    }

    /// Exactly one request message, as a unary or server-streaming call expects. A stream that
    /// ends before any message gets what etcd 3.4's grpc-go answers: Unknown, "EOF".
    pub async fn decode_one<M: prost::Message + Default>(&mut self) -> Result<M, Status> {
        match self.decode::<M>().await? {
            Some(message) => Ok(message),
            None => Err(Status::new(Code::Unknown, "EOF")),
        }
    }
}

fn status_from_h2(error: &h2::Error) -> Status {
    // A client that reset the stream, sent GOAWAY or dropped the connection canceled the call:
    // grpc-go cancels the call's context on each, and etcd's metrics count it Canceled.
    if error.is_reset() || error.is_go_away() || error.is_io() {
        Status::new(Code::Canceled, "context canceled")
    } else {
        Status::new(Code::Internal, format!("transport: {error}"))
    }
}

/// The largest framed unary answer that `ResponseSink::send_last_pieces` hands to h2 whole,
/// ahead of the peer's flow-control window: a put's, a lease's, a small range's. A quarter of
/// HTTP/2's default 64 KiB stream window, which gRPC clients keep or raise, so such an answer
/// nearly always fits the window at once; larger answers go under flow control.
pub const UNARY_AT_ONCE_BYTES_MAX: usize = 16 * 1024;

/// The response side of one call. Sends the response headers lazily with the first message,
/// and never buffers past the peer's flow-control window plus `max_send_buffer_bytes`.
pub struct ResponseSink {
    /// Shared with the call's cancellation watcher, which polls for a client reset while the
    /// handler runs. Borrowed only inside synchronous sections and single polls, never across
    /// an await, so the two never overlap (they run on one task).
    wire: Rc<RefCell<Wire>>,
    max_send_message_bytes: usize,
    /// Set while a frame is partly written: a send future dropped there (deadline, reset, a
    /// handler's select) leaves a torn message that trailers must not follow.
    frame_torn: bool,
    counts: Rc<CallCounts>,
}

enum Wire {
    /// Nothing sent yet: a final status becomes a trailers-only response.
    Fresh(SendResponse<Bytes>),
    /// Headers sent: the final status goes in trailers.
    Streaming(SendStream<Bytes>),
    /// An in-process call: message bodies (without the 5-byte prefix) go into this bounded
    /// channel; its receiver drives the call and takes the final status from the handler.
    Local(futures_channel::mpsc::Sender<Bytes>),
    Finished,
}

impl Wire {
    fn name(&self) -> &'static str {
        match self {
            Wire::Fresh(_) => "fresh",
            Wire::Streaming(_) => "streaming",
            Wire::Local(_) => "local",
            Wire::Finished => "finished",
        }
    }
}

impl std::fmt::Debug for ResponseSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSink")
            .field("wire", &self.wire.borrow().name())
            .finish()
    }
}

impl ResponseSink {
    fn new(
        respond: SendResponse<Bytes>,
        max_send_message_bytes: usize,
        counts: Rc<CallCounts>,
    ) -> ResponseSink {
        ResponseSink {
            wire: Rc::new(RefCell::new(Wire::Fresh(respond))),
            max_send_message_bytes,
            frame_torn: false,
            counts,
        }
    }

    /// An in-process call's response side: each message's body goes into `messages`, a
    /// bounded channel, so a send waits while the receiver is behind; a closed receiver ends
    /// the call as a client's reset does (Canceled).
    pub fn local(
        messages: futures_channel::mpsc::Sender<Bytes>,
        max_send_message_bytes: usize,
        counts: Rc<CallCounts>,
    ) -> ResponseSink {
        ResponseSink {
            wire: Rc::new(RefCell::new(Wire::Local(messages))),
            max_send_message_bytes,
            frame_torn: false,
            counts,
        }
    }

    /// The call's message and byte counts so far (both directions), for metrics.
    pub fn counts(&self) -> Rc<CallCounts> {
        self.counts.clone()
    }

    /// Encodes and sends one response message, waiting for send capacity.
    /// An error means the call is over (client gone, message over the send limit): return it.
    pub async fn send<M: prost::Message>(&mut self, message: &M) -> Result<(), Status> {
        let frame = encode_message(message, self.max_send_message_bytes)?;
        self.send_frame(frame).await
    }

    /// Sends one already framed message (5-byte prefix included, see `codec::frame_bytes`).
    ///
    /// Not cancel-safe: dropping this future mid-message tears the message, and the call then
    /// ends with RST_STREAM instead of trailers. Do not race it in a `select`; race the
    /// request side ([`RequestStream::decode`] is cancel-safe) or your own event source instead.
    pub async fn send_frame(&mut self, mut frame: Bytes) -> Result<(), Status> {
        assert!(
            frame.len() >= crate::codec::PREFIX_BYTES,
            "a frame has a prefix"
        );
        if self.frame_torn {
            // Only after a failed send: the stream is broken and will be reset.
            return Err(Status::new(Code::Canceled, "context canceled"));
        }
        if matches!(*self.wire.borrow(), Wire::Local(_)) {
            return self
                .send_local(frame.split_off(crate::codec::PREFIX_BYTES))
                .await;
        }
        self.start()?;
        self.frame_torn = true;
        let body_bytes = (frame.len() - crate::codec::PREFIX_BYTES) as u64;
        self.send_under_flow_control(frame).await?;
        self.frame_torn = false;
        add(&self.counts.messages_sent, 1);
        add(&self.counts.bytes_sent, body_bytes);
        Ok(())
    }

    /// Sends several already framed messages (each with its 5-byte prefix) of one stream
    /// together: over h2 they go as one body chunk, so h2 frames, flow-control bookkeeping and
    /// socket writes are paid once for all of them, not once per message (a watch stream
    /// whose many watchers each got a response for the same revision). gRPC lets messages
    /// share DATA frames; each still counts as a message sent. An in-process call takes them
    /// one by one. `frames` is left empty.
    ///
    /// Not cancel-safe, as [`ResponseSink::send_frame`].
    pub async fn send_frames(&mut self, frames: &mut Vec<Bytes>) -> Result<(), Status> {
        if frames.len() <= 1 || matches!(*self.wire.borrow(), Wire::Local(_)) {
            for frame in frames.drain(..) {
                self.send_frame(frame).await?;
            }
            return Ok(());
        }
        let total_bytes: usize = frames.iter().map(|f| f.len()).sum();
        let mut joined = BytesMut::with_capacity(total_bytes);
        for frame in frames.iter() {
            assert!(
                frame.len() >= crate::codec::PREFIX_BYTES,
                "a frame has a prefix"
            );
            joined.extend_from_slice(frame);
        }
        let messages = frames.len() as u64;
        frames.clear();
        if self.frame_torn {
            return Err(Status::new(Code::Canceled, "context canceled"));
        }
        self.start()?;
        self.frame_torn = true;
        self.send_under_flow_control(joined.freeze()).await?;
        self.frame_torn = false;
        add(&self.counts.messages_sent, messages);
        add(
            &self.counts.bytes_sent,
            (total_bytes as u64) - messages * crate::codec::PREFIX_BYTES as u64,
        );
        Ok(())
    }

    /// Encodes and sends one response message piece by piece ([`PieceEncode`]): each piece is
    /// encoded only once the previous one went to h2 within the peer's flow-control window, so
    /// the call holds about one piece ([`PIECE_BYTES_TARGET`]) whatever the message's size. A
    /// message no larger than one piece goes as [`ResponseSink::send`] sends it.
    ///
    /// Not cancel-safe, as [`ResponseSink::send_frame`].
    pub async fn send_pieces<P: PieceEncode>(&mut self, mut message: P) -> Result<(), Status> {
        let length_bytes = message.encoded_len();
        let local = matches!(*self.wire.borrow(), Wire::Local(_));
        if length_bytes <= PIECE_BYTES_TARGET || local {
            // The in-process gateway takes whole messages.
            let frame = self.encode_whole(message, length_bytes).await?;
            return self.send_frame(frame).await;
        }
        if self.frame_torn {
            return Err(Status::new(Code::Canceled, "context canceled"));
        }
        let mut piece = BytesMut::with_capacity(PIECE_BYTES_TARGET + PREFIX_BYTES);
        put_prefix(&mut piece, length_bytes, self.max_send_message_bytes)?;
        self.start()?;
        self.frame_torn = true;
        let mut sent_bytes = 0;
        loop {
            if let Some(wait) = message.prepare() {
                wait.await;
            }
            let more = match message.encode_piece(&mut piece, PIECE_BYTES_TARGET) {
                Ok(more) => more,
                Err(status) => {
                    // Nothing of the message left yet: the status can still go in trailers.
                    if sent_bytes == 0 {
                        self.frame_torn = false;
                    }
                    return Err(status);
                }
            };
            let full = std::mem::replace(
                &mut piece,
                BytesMut::with_capacity(if more { PIECE_BYTES_TARGET } else { 0 }),
            );
            sent_bytes += full.len();
            // A mismatch would tear the stream for every message after this one.
            assert!(
                sent_bytes <= PREFIX_BYTES + length_bytes,
                "a message's pieces outgrew its encoded length"
            );
            self.send_under_flow_control(full.freeze()).await?;
            if !more {
                break;
            }
        }
        assert_eq!(
            sent_bytes,
            PREFIX_BYTES + length_bytes,
            "a message's pieces add up to its encoded length"
        );
        self.frame_torn = false;
        add(&self.counts.messages_sent, 1);
        add(&self.counts.bytes_sent, length_bytes as u64);
        Ok(())
    }

    /// The one message of a call that then ends OK: a unary method's answer. When nothing
    /// was sent yet and the framed message is at most [`UNARY_AT_ONCE_BYTES_MAX`], the
    /// response head, the message and the OK trailers go to h2 in one call (third_party/h2,
    /// KEEL PATCH `send_unary_repeated`), which takes h2's locks and moves the stream's state
    /// once, rather than once per frame plus three flow-control calls. Otherwise the message
    /// goes as [`ResponseSink::send_pieces`] sends it. After an `Ok`, the handler must return
    /// [`Status::ok`]: the trailers may have gone already, and a later send is refused.
    ///
    /// Such a message is queued in h2 whatever the peer's window, as grpc-go (etcd) queues a
    /// small unary answer and returns from the handler: the call is over, and the bytes wait
    /// in h2 until the window opens or the client resets the stream. Sent under flow control,
    /// the call instead waited with them and ended at its deadline. This stays within the
    /// bound that `max_send_buffer_bytes` sets (`ServerConfig::check`).
    ///
    /// Cancel-safe up to the hand-off to h2 (all its waits come before); after the fallback,
    /// not cancel-safe, as [`ResponseSink::send_frame`].
    ///
    /// Not an `async fn`, and the piece-by-piece path boxed: every unary call's task holds
    /// this future, which an `async fn` would make hold `message` twice, and the path for
    /// answers over 16 KiB several times more.
    // Written out by hand on purpose: see above (clippy would make it an `async fn`).
    #[allow(clippy::manual_async_fn)]
    pub fn send_last_pieces<'a, P: PieceEncode + 'a>(
        &'a mut self,
        message: P,
    ) -> impl Future<Output = Result<(), Status>> + 'a {
        async move {
            let length_bytes = message.encoded_len();
            let fresh = matches!(*self.wire.borrow(), Wire::Fresh(_));
            if PREFIX_BYTES + length_bytes > UNARY_AT_ONCE_BYTES_MAX || !fresh || self.frame_torn {
                return Box::pin(self.send_pieces(message)).await;
            }
            let frame = self.encode_whole(message, length_bytes).await?;
            // Only this task sends on the sink, and the reset watcher only polls it, so it is
            // still fresh after the encoding's waits.
            match std::mem::replace(&mut *self.wire.borrow_mut(), Wire::Finished) {
                Wire::Fresh(mut respond) => respond
                    .send_unary_repeated(
                        StatusCode::OK,
                        &GRPC_RESPONSE_HEAD,
                        frame,
                        &GRPC_STATUS_OK,
                    )
                    .map_err(|error| status_from_h2(&error))?,
                other => panic!("a unary answer on a {} response sink", other.name()),
            }
            add(&self.counts.messages_sent, 1);
            add(&self.counts.bytes_sent, length_bytes as u64);
            Ok(())
        }
    }

    /// `message` encoded whole, with its 5-byte prefix; `length_bytes` is its encoded length.
    ///
    /// Not an `async fn`, which would hold `message` twice.
    // Written out by hand on purpose: see above (clippy would make it an `async fn`).
    #[allow(clippy::manual_async_fn)]
    fn encode_whole<'a, P: PieceEncode + 'a>(
        &'a self,
        mut message: P,
        length_bytes: usize,
    ) -> impl Future<Output = Result<Bytes, Status>> + 'a {
        async move {
            let mut frame = BytesMut::with_capacity(PREFIX_BYTES + length_bytes);
            put_prefix(&mut frame, length_bytes, self.max_send_message_bytes)?;
            loop {
                if let Some(wait) = message.prepare() {
                    wait.await;
                }
                if !message.encode_piece(&mut frame, usize::MAX)? {
                    break;
                }
            }
            assert_eq!(
                frame.len(),
                PREFIX_BYTES + length_bytes,
                "a message's pieces add up to its encoded length"
            );
            Ok(frame.freeze())
        }
    }

    /// Hands `frame` to h2 as the peer's flow-control window allows, waiting for capacity, so
    /// h2 never buffers more than the window grants.
    async fn send_under_flow_control(&mut self, mut frame: Bytes) -> Result<(), Status> {
        while !frame.is_empty() {
            let mut capacity_bytes = self.with_stream(|stream| {
                let capacity_bytes = stream.capacity();
                if capacity_bytes == 0 {
                    stream.reserve_capacity(frame.len());
                }
                capacity_bytes
            });
            if capacity_bytes == 0 {
                let polled = poll_fn(|cx| self.with_stream(|stream| stream.poll_capacity(cx)));
                capacity_bytes = match polled.await {
                    Some(Ok(capacity_bytes)) => capacity_bytes,
                    Some(Err(error)) => return Err(status_from_h2(&error)),
                    None => return Err(Status::new(Code::Canceled, "context canceled")),
                };
            }
            let chunk = frame.split_to(capacity_bytes.min(frame.len()));
            self.with_stream(|stream| stream.send_data(chunk, false))
                .map_err(|error| status_from_h2(&error))?;
        }
        Ok(())
    }

    /// `send_frame` for an in-process call: waits for room in the channel, then queues `body`.
    /// Cancel-safe: nothing is queued until the send completes.
    async fn send_local(&mut self, body: Bytes) -> Result<(), Status> {
        let canceled = || Status::new(Code::Canceled, "context canceled");
        let body_bytes = body.len() as u64;
        poll_fn(|cx| match &mut *self.wire.borrow_mut() {
            Wire::Local(sender) => sender.poll_ready(cx).map_err(|_| canceled()),
            _ => Poll::Ready(Err(canceled())),
        })
        .await?;
        match &mut *self.wire.borrow_mut() {
            Wire::Local(sender) => sender.start_send(body).map_err(|_| canceled())?,
            _ => return Err(canceled()),
        }
        add(&self.counts.messages_sent, 1);
        add(&self.counts.bytes_sent, body_bytes);
        Ok(())
    }

    fn with_stream<T>(&self, action: impl FnOnce(&mut SendStream<Bytes>) -> T) -> T {
        match &mut *self.wire.borrow_mut() {
            Wire::Streaming(stream) => action(stream),
            other => panic!("send on a {} response sink", other.name()),
        }
    }

    fn start(&mut self) -> Result<(), Status> {
        let mut wire = self.wire.borrow_mut();
        match std::mem::replace(&mut *wire, Wire::Finished) {
            Wire::Fresh(mut respond) => {
                let stream = respond
                    .send_response_repeated(StatusCode::OK, &GRPC_RESPONSE_HEAD, false)
                    .map_err(|error| status_from_h2(&error))?;
                *wire = Wire::Streaming(stream);
            }
            Wire::Streaming(stream) => *wire = Wire::Streaming(stream),
            Wire::Local(_) => panic!("h2 send on an in-process sink"),
            // Only after `send_last_pieces`, whose answer ended the response.
            Wire::Finished => {
                return Err(Status::new(
                    Code::Internal,
                    "grpc: a message sent after the call's last one",
                ))
            }
        }
        Ok(())
    }

    /// Ends the call with `status`: trailers after a response, or a trailers-only response.
    /// Errors are ignored: they mean the client is gone, and there is no one left to tell.
    fn finish(&mut self, status: &Status) {
        let mut wire = self.wire.borrow_mut();
        match std::mem::replace(&mut *wire, Wire::Finished) {
            // The in-process caller gets the status from the handler itself.
            Wire::Finished | Wire::Local(_) => {}
            Wire::Fresh(mut respond) => {
                let response = grpc_response(StatusCode::OK, Some(status));
                let _ = respond.send_response(response, true);
            }
            Wire::Streaming(mut stream) if self.frame_torn => {
                // No trailers can follow a torn message. A deadline or the client's own reset
                // is a cancel; anything else is the server failing part way (a range whose
                // rest a compaction cut), which INTERNAL_ERROR makes clients report as
                // Internal rather than as a cancel they did not ask for.
                let reason = match status.code {
                    Code::Canceled | Code::DeadlineExceeded => {
                        tracing::debug!(%status, "a response message was torn; resetting the stream");
                        h2::Reason::CANCEL
                    }
                    _ => {
                        tracing::warn!(%status, "a response failed part way; resetting the stream");
                        h2::Reason::INTERNAL_ERROR
                    }
                };
                stream.send_reset(reason);
            }
            Wire::Streaming(mut stream) => {
                let _ = if status.code == Code::Ok && status.message.is_empty() {
                    stream.send_trailers_repeated(&GRPC_STATUS_OK)
                } else {
                    stream.send_trailers(status_headers(status))
                };
            }
        }
        assert!(matches!(*wire, Wire::Finished));
    }

    /// Completes when the client resets the stream or the connection fails.
    fn reset_watcher(&self) -> impl Future<Output = ()> + 'static {
        let wire = self.wire.clone();
        poll_fn(move |cx| {
            let polled = match &mut *wire.borrow_mut() {
                Wire::Fresh(respond) => respond.poll_reset(cx).map(|_| ()),
                Wire::Streaming(stream) => stream.poll_reset(cx).map(|_| ()),
                Wire::Local(_) | Wire::Finished => Poll::Pending,
            };
            polled
        })
    }
}

// Static names: a name made from a `&str` is copied into an allocation of its own, once per
// call (keel_heap_allocations_total counted it).
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
// The same for lookups: a name given as `&str` is parsed again at every `get`.
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The fields of every gRPC response head after `:status`, and the trailers of nearly every
/// call. Sent as h2 `RepeatedFields` (third_party/h2, KEEL PATCH): no `HeaderMap` is built
/// per call, and each connection writes again the HPACK block it wrote for the set last
/// time, while its dynamic table is unchanged: after the first few calls, one index byte a
/// field, as h2's encoder writes them.
static GRPC_RESPONSE_HEAD: h2::RepeatedFields = h2::RepeatedFields::new(&GRPC_RESPONSE_HEAD_FIELDS);
static GRPC_STATUS_OK: h2::RepeatedFields = h2::RepeatedFields::new(&GRPC_STATUS_OK_FIELDS);
// Statics of their own: a static's initializer cannot borrow a temporary that has a
// destructor.
static GRPC_RESPONSE_HEAD_FIELDS: [(HeaderName, HeaderValue); 1] =
    [(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))];
static GRPC_STATUS_OK_FIELDS: [(HeaderName, HeaderValue); 1] =
    [(GRPC_STATUS, HeaderValue::from_static("0"))];

fn status_headers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(2);
    headers.insert(
        GRPC_STATUS,
        HeaderValue::from_static(status.code.as_header_value()),
    );
    if !status.message.is_empty() {
        let value = HeaderValue::try_from(status.encoded_message())
            .expect("percent-encoding leaves printable ASCII only");
        headers.insert(GRPC_MESSAGE, value);
    }
    headers
}

/// A response head; with `status` it is a trailers-only response.
fn grpc_response(http_status: StatusCode, status: Option<&Status>) -> http::Response<()> {
    let mut response = http::Response::new(());
    *response.status_mut() = http_status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    if let Some(status) = status {
        headers.extend(status_headers(status));
    }
    response
}

/// `application/grpc`, optionally followed by `+subtype` or `;parameters`, as grpc-go accepts.
fn is_grpc_content_type(value: &[u8]) -> bool {
    match value.strip_prefix(b"application/grpc") {
        Some(rest) => rest.is_empty() || rest.starts_with(b"+") || rest.starts_with(b";"),
        None => false,
    }
}

/// Serves a unary method: decodes exactly one request, runs `method`, sends its response.
/// Returns the status to hand back from [`Handler::grpc`].
///
/// Not an `async fn`: a forwarding layer would keep its own copy of `call` in the future
/// that every request's task holds.
pub fn unary<'a, Req, Resp, F, Fut>(
    call: Call,
    sink: &'a mut ResponseSink,
    method: F,
) -> impl Future<Output = Status> + 'a
where
    Req: prost::Message + Default + 'a,
    Resp: prost::Message + 'a,
    F: FnOnce(Req, CallHead) -> Fut + 'a,
    Fut: Future<Output = Result<Resp, Status>> + 'a,
{
    unary_pieces(call, sink, |request, head| async move {
        method(request, head).await.map(Whole)
    })
}

/// [`unary`] for a method whose answer may be large: it is sent piece by piece
/// ([`ResponseSink::send_pieces`]).
///
/// Not an `async fn`, for the reason [`unary`] gives: an `async fn` keeps each argument twice
/// in its future (the argument, and the local it is moved into), and `call` is 248 bytes.
pub fn unary_pieces<'a, Req, Resp, F, Fut>(
    call: Call,
    sink: &'a mut ResponseSink,
    method: F,
) -> impl Future<Output = Status> + 'a
where
    Req: prost::Message + Default + 'a,
    Resp: PieceEncode + 'a,
    F: FnOnce(Req, CallHead) -> Fut + 'a,
    Fut: Future<Output = Result<Resp, Status>> + 'a,
{
    let Call { head, mut requests } = call;
    async move {
        let request = match requests.decode_one::<Req>().await {
            Ok(request) => request,
            Err(status) => return status,
        };
        let response = match method(request, head).await {
            Ok(response) => response,
            Err(status) => return status,
        };
        match sink.send_last_pieces(response).await {
            Ok(()) => Status::ok(),
            Err(status) => status,
        }
    }
}

/// Serves one accepted connection until it closes. Sniffs the first bytes: the HTTP/2 preface
/// starts an h2c server for gRPC; anything else is served as HTTP/1.1 by `handler.http`.
///
/// Each gRPC stream runs as its own local task (`runtime.spawn_local`); this future drives the
/// connection itself and must be polled (spawn it) for the calls to progress. An error ends
/// only this connection. Set TCP_NODELAY on the socket first: flow-control round trips
/// (WINDOW_UPDATE) are small frames, and Nagle plus delayed ACKs stall each by ~40 ms
/// (measured: an 8 MiB response took 5.8 s without it, 0.04 s with it).
///
/// Drop this future to close the connection abruptly (no GOAWAY): in-flight call tasks can no
/// longer send, and end when their handler returns or their cancellation fires.
pub async fn serve_connection<IO, H, R>(
    mut io: IO,
    handler: Rc<H>,
    config: Rc<ServerConfig>,
    runtime: Rc<R>,
) -> Result<(), GrpcError>
where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
    H: Handler,
    R: Runtime,
{
    config.check();
    // A client that connects and sends nothing must not hold a task and a socket forever.
    let sniffed = {
        let sniffing = pin!(sniff(&mut io));
        match select(sniffing, runtime.sleep(config.preface_timeout)).await {
            Either::Left((sniffed, _)) => sniffed?,
            Either::Right(((), _)) => return Err(GrpcError::PrefaceTimeout),
        }
    };
    if sniffed.is_empty() {
        return Ok(());
    }
    if !sniffed.starts_with(PREFACE) {
        let http_handler = handler.clone();
        let sleep_runtime = runtime.clone();
        let sleep = move |d: Duration| sleep_runtime.sleep(d);
        return serve_http1(
            io,
            sniffed,
            config.http1,
            config.preface_timeout,
            &sleep,
            move |request| http_handler.clone().http(request),
        )
        .await;
    }
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(config.initial_stream_window_bytes)
        .initial_connection_window_size(config.initial_connection_window_bytes)
        .max_frame_size(config.max_frame_bytes)
        .max_header_list_size(config.max_header_list_bytes)
        .max_concurrent_streams(config.max_concurrent_streams)
        .max_send_buffer_size(config.max_send_buffer_bytes)
        .data_frame_budget(config.data_frame_budget_bytes)
        // `serve_stream` reads a request's fields from its shared head when it has one.
        .share_repeated_heads(true);
    let mut connection = builder
        .handshake::<_, Bytes>(Rewind::new(sniffed.freeze(), io))
        .await?;
    while let Some(accepted) = connection.accept().await {
        let (request, respond) = accepted?;
        serve_stream(request, respond, &handler, &config, &runtime);
    }
    // No new streams (the client said GOAWAY or closed its side), but calls in flight still
    // need the connection driven to flush their responses and trailers.
    poll_fn(|cx| connection.poll_closed(cx)).await?;
    Ok(())
}

/// Reads until the bytes either hold the whole HTTP/2 preface or differ from it. Bytes read
/// past the preface are kept, to be replayed to whichever protocol takes over. Empty: the
/// peer closed without sending anything.
async fn sniff<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<BytesMut> {
    let mut sniffed = BytesMut::with_capacity(PREFACE.len());
    while sniffed.len() < PREFACE.len() && PREFACE.starts_with(&sniffed) {
        if io.read_buf(&mut sniffed).await? == 0 {
            break;
        }
    }
    Ok(sniffed)
}

/// The fields of a call's head that the server itself reads, each the first of its name.
struct CallFields<'a> {
    content_type: Option<&'a HeaderValue>,
    encoding: Option<&'a HeaderValue>,
    timeout: Option<&'a HeaderValue>,
}

impl<'a> CallFields<'a> {
    /// Found in one pass over the fields, the way `HeaderMap::get` finds the first value of a
    /// name. Three `get`s hashed each name and cost a call about 480 instructions; a gRPC
    /// head holds a handful of fields.
    fn of(headers: &'a HeaderMap) -> CallFields<'a> {
        let mut fields = CallFields {
            content_type: None,
            encoding: None,
            timeout: None,
        };
        for (name, value) in headers {
            let slot = if *name == CONTENT_TYPE {
                &mut fields.content_type
            } else if name.as_str() == GRPC_ENCODING.as_str() {
                &mut fields.encoding
            } else if name.as_str() == GRPC_TIMEOUT.as_str() {
                &mut fields.timeout
            } else {
                continue;
            };
            slot.get_or_insert(value);
        }
        fields
    }
}

/// Checks an accepted stream's head and spawns the task that serves it: the gRPC call, raced
/// against its deadline and a client reset, or `serve_http_over_h2`. A head that fails a check
/// is answered here, with no task.
///
/// Not an `async fn`: the checks run before the task is spawned, and only what the call needs
/// from then on goes into the call's task. As the task itself, this held the request and its
/// parts (464 bytes) for the whole call, and spawning copies the whole future, per call.
fn serve_stream<H: Handler, R: Runtime>(
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    handler: &Rc<H>,
    config: &ServerConfig,
    runtime: &Rc<R>,
) {
    let (mut parts, mut body) = request.into_parts();
    let metadata = match body.take_shared_head() {
        Some(shared) => Metadata::Shared(shared),
        None => Metadata::Own(std::mem::take(&mut parts.headers)),
    };
    let fields = CallFields::of(&metadata);
    // Checked as bytes: every call reads it, and only a refused one prints it (then as text,
    // lossily). Made text for every call, it cost each about 170 instructions (callgrind).
    let content_type: &[u8] = fields.content_type.map_or(&[], |value| value.as_bytes());
    // A plain HTTP/2 GET (curl, a health probe, a browser over TLS, where ALPN picks h2) is
    // the HTTP endpoints' business, as etcd's mux routes it: /health and /metrics answer over
    // h2 as they do over HTTP/1.1. So is a JSON gateway POST where the listener serves them
    // (TLS, as etcd 3.4 does; see `all_http_over_h2`).
    let plain_http =
        parts.method == Method::GET || parts.method == Method::HEAD || config.all_http_over_h2;
    if plain_http && !is_grpc_content_type(content_type) {
        // The HTTP path reads the request's own map.
        parts.headers = match metadata {
            Metadata::Own(map) => map,
            Metadata::Shared(shared) => std::sync::Arc::unwrap_or_clone(shared),
        };
        // Its own task, so no gRPC call's task is sized by the HTTP path's larger future.
        runtime.spawn_local(Box::pin(serve_http_over_h2(
            parts,
            body,
            respond,
            handler.clone(),
            config.http1.body_bytes_max,
        )));
        return;
    }
    // grpc-go answers a non-gRPC content type with HTTP 415 and a gRPC status, so both gRPC
    // clients and plain HTTP/2 clients get an explanation.
    if !is_grpc_content_type(content_type) {
        let status = Status::new(
            Code::InvalidArgument,
            format!(
                "invalid gRPC request content-type {:?}",
                String::from_utf8_lossy(content_type)
            ),
        );
        reject(&mut respond, StatusCode::UNSUPPORTED_MEDIA_TYPE, &status);
        return;
    }
    if parts.method != Method::POST {
        let status = Status::new(
            Code::Internal,
            format!("invalid gRPC request method {:?}", parts.method.as_str()),
        );
        reject(&mut respond, StatusCode::METHOD_NOT_ALLOWED, &status);
        return;
    }
    // We install no decompressor; grpc-go answers a compressed call the same way.
    if let Some(encoding) = fields.encoding {
        if encoding != "identity" {
            let status = Status::new(
                Code::Unimplemented,
                format!(
                    "grpc: Decompressor is not installed for grpc-encoding {:?}",
                    String::from_utf8_lossy(encoding.as_bytes())
                ),
            );
            reject(&mut respond, StatusCode::OK, &status);
            return;
        }
    }
    let timeout = match fields.timeout {
        None => None,
        Some(value) => match crate::codec::parse_grpc_timeout(value.as_bytes()) {
            Ok(timeout) => Some(timeout),
            Err(status) => {
                reject(&mut respond, StatusCode::OK, &status);
                return;
            }
        },
    };
    let head = CallHead {
        // h2 accepts no request without `:path`; "/" is only for the type's sake.
        path: parts
            .uri
            .into_parts()
            .path_and_query
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
        metadata,
        timeout,
    };
    let counts = Rc::new(CallCounts::default());
    let requests = RequestStream::new(body, config.max_recv_message_bytes, counts.clone());
    let mut sink = ResponseSink::new(respond, config.max_send_message_bytes, counts);
    let reset = sink.reset_watcher();
    let timer = runtime.clone();
    let cancellation = async move {
        let reset = pin!(reset);
        match timeout {
            None => {
                reset.await;
                Status::new(Code::Canceled, "context canceled")
            }
            Some(timeout) => match select(timer.sleep(timeout), reset).await {
                Either::Left(((), _)) => Status::deadline_exceeded(),
                Either::Right(((), _)) => Status::new(Code::Canceled, "context canceled"),
            },
        }
    };
    let handler = handler.clone();
    runtime.spawn_local(Box::pin(async move {
        // The handler's future is dropped when the deadline passes or the client resets the
        // stream, so a call blocked on something else (a lock, a raft round) stops waiting.
        let status = {
            let call = handler.grpc(Call { head, requests }, &mut sink);
            match select(pin!(call), pin!(cancellation)).await {
                Either::Left((status, _)) => status,
                Either::Right((status, _)) => status,
            }
        };
        sink.finish(&status);
    }));
}

/// Answers a plain HTTP/2 request (a GET or HEAD, or where allowed any, a gateway POST) with the
/// handler's HTTP endpoints. The body is read whole first, up to `body_bytes_max` (as on
/// HTTP/1.1); a larger one is answered 413 without being read further.
async fn serve_http_over_h2<H: Handler>(
    parts: http::request::Parts,
    body: RecvStream,
    mut respond: SendResponse<Bytes>,
    handler: Rc<H>,
    body_bytes_max: usize,
) {
    let head_only = parts.method == Method::HEAD;
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let body = match read_body(body, body_bytes_max).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            let mut response = http::Response::new(());
            *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            let text = format!("{}\n", StatusCode::PAYLOAD_TOO_LARGE);
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            if let Ok(mut send) = respond.send_response(response, false) {
                let _ = send.send_data(Bytes::from(text), true);
            }
            return;
        }
        // The client reset the stream or the connection went: nobody to answer.
        Err(BodyError::Gone) => return,
    };
    let request = HttpRequest {
        method: parts.method,
        path,
        headers: parts.headers,
        body,
    };
    let mut answer = handler.http(request).await;
    let mut response = http::Response::new(());
    *response.status_mut() = answer.status;
    if !answer.content_type.is_empty() {
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
    }
    for (name, value) in answer.headers.drain(..) {
        response.headers_mut().append(name, value);
    }
    if let Some(stream) = answer.stream.take() {
        if let Ok(send) = respond.send_response(response, head_only) {
            if !head_only {
                send_stream_over_h2(send, stream).await;
            }
        }
        return;
    }
    response.headers_mut().insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(answer.body.len()),
    );
    let end_now = head_only || answer.body.is_empty();
    let Ok(send) = respond.send_response(response, end_now) else {
        return;
    };
    if !end_now {
        // Within the peer's window, as a streamed body goes: a gateway answer (a range) may be
        // larger than what h2 should buffer ahead of it.
        let body = answer.body;
        let once = futures_util::stream::once(async move { body });
        send_stream_over_h2(send, crate::http1::BodyStream(Box::pin(once))).await;
    }
}

/// Why a plain HTTP/2 request's body was not read.
enum BodyError {
    TooLarge,
    Gone,
}

/// Reads a request body whole, releasing flow-control capacity as it comes (or the window
/// would stall), and stops at `max` bytes.
async fn read_body(mut body: RecvStream, max: usize) -> Result<Bytes, BodyError> {
    let mut out = BytesMut::new();
    while let Some(data) = poll_fn(|cx| body.poll_data(cx)).await {
        let data = data.map_err(|_| BodyError::Gone)?;
        let _ = body.flow_control().release_capacity(data.len());
        if out.len() + data.len() > max {
            return Err(BodyError::TooLarge);
        }
        out.extend_from_slice(&data);
    }
    Ok(out.freeze())
}

/// Sends a streamed HTTP body as DATA frames, one item at a time within the peer's window (so
/// nothing queues past it), until the body ends or the client resets the stream: the JSON
/// gateway's streaming POSTs where `all_http_over_h2` lets them in.
async fn send_stream_over_h2(mut send: SendStream<Bytes>, mut stream: crate::http1::BodyStream) {
    use futures_util::StreamExt;
    loop {
        // Watch for a reset while waiting too: a quiet stream may not send for a long time.
        let next = {
            let reset = pin!(poll_fn(|cx| send.poll_reset(cx)));
            match select(stream.0.next(), reset).await {
                Either::Left((next, _)) => next,
                Either::Right(_) => return,
            }
        };
        let Some(mut chunk) = next else { break };
        while !chunk.is_empty() {
            send.reserve_capacity(chunk.len());
            let capacity_bytes = match poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(capacity_bytes)) => capacity_bytes,
                // Reset or gone: dropping `stream` ends whatever produced it.
                Some(Err(_)) | None => return,
            };
            let data = chunk.split_to(capacity_bytes.min(chunk.len()));
            if send.send_data(data, false).is_err() {
                return;
            }
        }
    }
    let _ = send.send_data(Bytes::new(), true);
}

/// Ends a stream before the handler runs: an HTTP status plus a trailers-only gRPC status.
fn reject(respond: &mut SendResponse<Bytes>, http_status: StatusCode, status: &Status) {
    assert!(!status.is_ok());
    tracing::debug!(%http_status, %status, "rejecting a gRPC stream before dispatch");
    let _ = respond.send_response(grpc_response(http_status, Some(status)), true);
}

/// An I/O object that first replays bytes already read (the sniffed preface).
struct Rewind<IO> {
    prefix: Bytes,
    inner: IO,
}

impl<IO> Rewind<IO> {
    fn new(prefix: Bytes, inner: IO) -> Rewind<IO> {
        Rewind { prefix, inner }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let copied_bytes = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..copied_bytes]);
            self.prefix.advance(copied_bytes);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change to a call's shared metadata copies it first: the connection's kept head, and
    /// the calls that share it, keep their fields.
    #[test]
    fn changing_shared_metadata_changes_only_this_calls_copy() {
        let mut fields = HeaderMap::new();
        fields.insert("token", HeaderValue::from_static("t"));
        let shared = std::sync::Arc::new(fields);
        let mut metadata = Metadata::Shared(shared.clone());
        assert_eq!(
            metadata.get("token").unwrap(),
            "t",
            "read through the share"
        );
        metadata.to_mut().remove("token");
        assert!(matches!(metadata, Metadata::Own(_)));
        assert!(metadata.get("token").is_none());
        assert_eq!(
            shared.get("token").unwrap(),
            "t",
            "the shared map is untouched"
        );
        let mut own = Metadata::from(HeaderMap::new());
        own.to_mut().insert("a", HeaderValue::from_static("b"));
        assert_eq!(own.get("a").unwrap(), "b");
    }

    #[test]
    fn grpc_content_types_match_grpc_go() {
        for good in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc;charset=x",
        ] {
            assert!(is_grpc_content_type(good.as_bytes()), "{good}");
        }
        for bad in [
            "",
            "application/json",
            "application/grpc-web",
            "text/plain",
            "application/grpcx",
        ] {
            assert!(!is_grpc_content_type(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn status_headers_are_percent_encoded() {
        let headers = status_headers(&Status::new(Code::Internal, "bad\nthing 100%"));
        assert_eq!(headers.get("grpc-status").expect("status"), "13");
        assert_eq!(
            headers.get("grpc-message").expect("message"),
            "bad%0Athing 100%25"
        );
        let ok = status_headers(&Status::ok());
        assert_eq!(ok.get("grpc-status").expect("status"), "0");
        assert!(ok.get("grpc-message").is_none());
        let trailers_only = grpc_response(StatusCode::OK, Some(&Status::new(Code::NotFound, "x")));
        assert_eq!(
            trailers_only.headers().get("grpc-status").expect("status"),
            "5"
        );
        assert_eq!(
            trailers_only.headers().get(CONTENT_TYPE).expect("ct"),
            "application/grpc"
        );
    }

    #[test]
    fn default_config_is_etcds() {
        let config = ServerConfig::default();
        config.check();
        assert_eq!(config.max_recv_message_bytes, 1_572_864 + 524_288);
        assert_eq!(config.max_send_message_bytes, 2_147_483_647);
    }
}
