//! keel-grpc: Keel's own gRPC server codec over `h2`, service dispatch glue, and THE one
//! mapping from etcd errors to gRPC statuses.
//!
//! Bird's-eye view: the server (keel-core) accepts a TCP connection on a shard's executor,
//! wraps it as a tokio `AsyncRead + AsyncWrite`, and calls [`serve_connection`] with its
//! [`Handler`] and a [`Runtime`] (local spawn + sleep). The first bytes pick the protocol:
//! the HTTP/2 preface starts an h2c server whose streams each become a [`Call`] served by
//! [`Handler::grpc`] in its own local task; anything else is served as HTTP/1.1 by
//! [`Handler::http`] (health, version, metrics, JSON gateway).
//!
//! A service, in outline (see `tests/server.rs` for a complete, compiled one):
//!
//! ```ignore
//! impl Handler for Shard {
//!     async fn grpc(self: Rc<Self>, call: Call, sink: &mut ResponseSink) -> Status {
//!         match call.head.path.path() {
//!             "/etcdserverpb.KV/Range" => {
//!                 unary(call, sink, |request: RangeRequest, head: CallHead| self.range(request, head)).await
//!             }
//!             "/etcdserverpb.Watch/Watch" => self.watch(call, sink).await, // decode() + send() loop
//!             path => Status::unknown_method(path, self.service_known(path)),
//!         }
//!     }
//! }
//! // Per accepted socket (TCP_NODELAY set, or flow-control round trips stall on Nagle):
//! spawn_local(serve_connection(socket.compat(), handler.clone(), config.clone(), runtime.clone()));
//! ```
//!
//! - [`codec`]: sans-I/O message framing (5-byte prefix) and `grpc-timeout` parsing.
//! - [`status`]: [`Code`], [`Status`], `grpc-message` percent-encoding, [`EtcdError`].
//! - [`http1`]: sans-I/O HTTP/1.1 request parser and response writer.
//! - [`server`]: the connection driver, request stream, response sink, `unary` helper.
//!
//! Architecture invariant: this crate owns no runtime, timer, socket or clock; it runs on
//! whatever executor the caller's [`Runtime`] wraps, and every future here is `!Send`-friendly.
//!
//! Architecture invariant: every buffer is bounded: a request stream holds at most one partial
//! message (checked against `max_recv_message_bytes` from its prefix, before buffering), and
//! a response never queues past the peer's flow-control window plus `max_send_buffer_bytes`.
//!
//! Architecture invariant: etcd's error strings appear in exactly one place,
//! [`EtcdError::code_and_message`]; everything else converts through `Status::from`.
//!
//! Architecture invariant: a protocol error, garbage bytes or a panic-free failure on one
//! connection ends only that connection; calls end with a gRPC status, never by hanging.

pub mod codec;
mod error;
pub mod http1;
pub mod server;
pub mod status;

pub use codec::{
    frame_bytes, parse_grpc_timeout, PieceEncode, PieceWait, Whole, PIECE_BYTES_TARGET,
};
pub use error::GrpcError;
pub use http1::{BodyStream, Http1Limits, HttpRequest, HttpResponse};
pub use server::{
    serve_connection, unary, unary_pieces, Call, CallCounts, CallHead, Handler, Metadata,
    RequestStream, ResponseSink, Runtime, ServerConfig, DEFAULT_MAX_CONCURRENT_STREAMS,
    DEFAULT_PREFACE_TIMEOUT, UNARY_AT_ONCE_BYTES_MAX,
};
pub use status::{split_method_path, Code, EtcdError, ServiceKnown, Status};
