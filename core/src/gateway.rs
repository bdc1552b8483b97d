//! The JSON gateway on the client port, as etcd 3.4 serves it (grpc-gateway): `POST /v3/...`
//! with a JSON request in proto3's JSON mapping (the .proto field names, int64 as strings,
//! bytes as base64), answered by the same service methods gRPC calls reach.
//!
//! Streaming calls over HTTP/1.1 answer `Transfer-Encoding: chunked`, one line per response,
//! `{"result":{...}}`, and when the call fails grpc-gateway's `{"error":{...}}` object (without
//! a newline) ends the body. `/v3/watch` and `/v3/lease/keepalive` take the request body's JSON
//! objects as the call's request messages, then end its request side as the gateway's
//! `CloseSend` does (a watch stays open after that, as etcd's does, until the client hangs
//! up). `/v3/election/observe` and `/v3/maintenance/snapshot` take the body's one request. All
//! four run through the gRPC dispatcher on an in-process call, so permissions, limits and
//! error texts are the gRPC path's: a bad token is no early 401 there. The call's responses
//! queue in a small bounded channel (one 1 MiB chunk for a snapshot), so memory stays bounded
//! for a slow reader. The stream ends when the call does or when the client hangs up (a
//! watch's watchers are released then).
//!
//! grpc-gateway sends a stream's head with its first line, so a call failing before it answers
//! gets the error's HTTP status. Keel does so for a snapshot (whose first line comes once the
//! database image is written); a watch, keep-alive or observe gets its 200 head at once, since
//! while the head waits nothing would notice a client hanging up (etcd sends nothing yet for
//! an empty-body watch or an election without a leader).
//!
//! Over HTTP/2 the gateway is served on TLS listeners (ALPN h2), as etcd 3.4 serves it there,
//! answers going out within the peer's window (keel-grpc's `all_http_over_h2`). Over
//! plaintext h2c only bodiless GET/HEAD requests reach the HTTP endpoints and a gateway POST
//! is answered as current grpc-go answers a non-gRPC content type (415); etcd 3.4 serves none
//! there either (its grpc-go resets such a stream with PROTOCOL_ERROR).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, StatusCode};
use keel_grpc::{
    Call, CallCounts, CallHead, Code, HttpRequest, HttpResponse, RequestStream, ResponseSink,
    Status,
};
use keel_proto::etcdserverpb as pb;
use keel_proto::v3electionpb as epb;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::service::Api;

/// Whether `path` is one the gateway answers (everything under `/v3/`).
pub fn is_gateway_path(path: &str) -> bool {
    path.starts_with("/v3/")
}

/// The call's gRPC metadata as etcd's grpc-gateway builds it from the HTTP headers:
/// `Grpc-Metadata-<name>: v` becomes `<name>: v`, and `Authorization` stays `authorization`;
/// a plain `token` header is no metadata there, so it is dropped (etcd reads a token from the
/// `token` or the `authorization` metadata). The other headers stay, as the HTTP layer's own.
fn as_grpc_metadata(headers: &mut HeaderMap) {
    const PREFIX: &str = "grpc-metadata-";
    headers.remove(http::HeaderName::from_static("token"));
    let passed: Vec<(http::HeaderName, http::HeaderValue)> = headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.as_str().strip_prefix(PREFIX)?;
            let name = http::HeaderName::from_bytes(name.as_bytes()).ok()?;
            // The verified certificate's user is Keel's own field, set only from the TLS
            // handshake: a client must not name itself through the prefix (etcd's gateway
            // never takes a certificate user at all).
            (name != crate::auth::CERT_USER_HEADER).then(|| (name, value.clone()))
        })
        .collect();
    for (name, value) in passed {
        // `Authorization` itself wins over `Grpc-Metadata-Authorization`.
        headers.entry(name).or_insert(value);
    }
    // And none sent as is (`Api::http` removed that already; this keeps the gateway safe on
    // its own).
    headers.remove(crate::auth::CERT_USER_HEADER);
}

/// Answers one gateway request.
pub async fn serve(api: &Rc<Api>, mut request: HttpRequest) -> HttpResponse {
    as_grpc_metadata(&mut request.headers);
    let path = request.path.split('?').next().unwrap_or("").to_string();
    if request.method != http::Method::POST {
        return HttpResponse::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "Method Not Allowed\n",
        );
    }
    // The streaming calls run through the gRPC dispatcher, which checks the token as each
    // method does on gRPC: a bad token is no early 401 there (etcd answers a watch with a
    // canceled line, a snapshot with its raw auth error, an observe with an empty stream).
    let kind = match path.as_str() {
        "/v3/watch" => Some(Streaming::Watch),
        "/v3/lease/keepalive" => Some(Streaming::LeaseKeepAlive),
        "/v3/election/observe" => Some(Streaming::Observe),
        "/v3/maintenance/snapshot" => Some(Streaming::Snapshot),
        _ => None,
    };
    if let Some(kind) = kind {
        return streaming(api, kind, request.headers, &request.body).await;
    }
    // etcd's gateway passes the `Authorization` header on as the call's token.
    let who = match crate::auth::who(api.shared(), &request.headers).await {
        Ok(who) => who,
        Err(e) => return error(&Status::from(e)),
    };
    let is_admin = || async {
        api.shared()
            .auth()
            .state
            .check_admin(&who)
            .map_err(Status::from)
    };
    let admin_only = matches!(
        path.as_str(),
        "/v3/cluster/member/add"
            | "/v3/cluster/member/remove"
            | "/v3/cluster/member/update"
            | "/v3/cluster/member/promote"
    );
    if admin_only {
        if let Err(status) = is_admin().await {
            return error(&status);
        }
    }
    if matches!(
        path.as_str(),
        "/v3/maintenance/defragment" | "/v3/maintenance/hash"
    ) {
        if let Err(status) =
            crate::auth::api::check_admin_maintenance(api.shared(), &request.headers).await
        {
            return error(&status);
        }
    }
    let body = request.body;
    let api = api.clone();
    let who = &who;
    let unary = Unary {
        body: &body,
        recv_bytes_max: api.shared().limits.grpc_recv_bytes_max,
    };
    if let Some(rest) = path.strip_prefix("/v3/auth/") {
        return auth_call(&api, who, rest, unary).await;
    }
    match path.as_str() {
        "/v3/kv/range" => unary.run(|r| async move { api.range(r, who).await }).await,
        "/v3/kv/put" => unary.run(|r| async move { api.put(r, who).await }).await,
        "/v3/kv/deleterange" => {
            unary
                .run(|r| async move { api.delete_range(r, who).await })
                .await
        }
        "/v3/kv/txn" => unary.run(|r| async move { api.txn(r, who).await }).await,
        "/v3/kv/compaction" => unary.run(|r| async move { api.compact(r).await }).await,
        "/v3/lease/grant" => unary.run(|r| async move { api.lease_grant(r).await }).await,
        "/v3/lease/revoke" | "/v3/kv/lease/revoke" => {
            unary
                .run(|r| async move { api.lease_revoke(r, who).await })
                .await
        }
        "/v3/lease/timetolive" | "/v3/kv/lease/timetolive" => {
            unary
                .run(|r| async move { api.lease_time_to_live(r).await })
                .await
        }
        "/v3/lease/leases" | "/v3/kv/lease/leases" => {
            unary
                .run(|r| async move { api.lease_leases(r).await })
                .await
        }
        "/v3/cluster/member/add" => unary.run(|r| async move { api.member_add(r).await }).await,
        "/v3/cluster/member/remove" => {
            unary
                .run(|r| async move { api.member_remove(r).await })
                .await
        }
        "/v3/cluster/member/update" => {
            unary
                .run(|r| async move { api.member_update(r).await })
                .await
        }
        "/v3/cluster/member/promote" => {
            unary
                .run(|r| async move { api.member_promote(r).await })
                .await
        }
        "/v3/cluster/member/list" => unary.run(|r| async move { api.member_list(r) }).await,
        "/v3/maintenance/alarm" => unary.run(|r| async move { api.alarm(r).await }).await,
        "/v3/maintenance/status" => unary.run(|r| async move { api.status(r) }).await,
        "/v3/maintenance/defragment" => unary.run(|r| async move { api.defragment(r).await }).await,
        // etcd's protos map Hash and HashKV to the same path; grpc-gateway serves Hash there.
        "/v3/maintenance/hash" => unary.run(|r| async move { api.hash(r).await }).await,
        "/v3/maintenance/transfer-leadership" => {
            unary.run(|r| async move { api.move_leader(r).await }).await
        }
        "/v3/lock/lock" => {
            unary
                .run(|r| async move { crate::lock::lock(api.shared(), api.hub(), who, r).await })
                .await
        }
        "/v3/lock/unlock" => {
            unary
                .run(|r| async move { crate::lock::unlock(api.shared(), who, r).await })
                .await
        }
        "/v3/election/campaign" => {
            unary
                .run(
                    |r| async move { crate::lock::campaign(api.shared(), api.hub(), who, r).await },
                )
                .await
        }
        "/v3/election/proclaim" => {
            unary
                .run(|r| async move { crate::lock::proclaim(api.shared(), who, r).await })
                .await
        }
        "/v3/election/leader" => {
            unary
                .run(|r| async move { crate::lock::leader(api.shared(), who, r).await })
                .await
        }
        "/v3/election/resign" => {
            unary
                .run(|r| async move { crate::lock::resign(api.shared(), who, r).await })
                .await
        }
        _ => HttpResponse::not_found(),
    }
}

/// `/v3/auth/...`: etcd's Auth service through the gateway.
async fn auth_call(
    api: &Rc<Api>,
    who: &crate::auth::AuthInfo,
    rest: &str,
    unary: Unary<'_>,
) -> HttpResponse {
    use crate::auth::api as a;
    let api = api.as_ref();
    match rest {
        "enable" => unary.run(|r| a::auth_enable(api, who, r)).await,
        "disable" => unary.run(|r| a::auth_disable(api, who, r)).await,
        "authenticate" => unary.run(|r| a::authenticate(api, who, r)).await,
        "user/add" => unary.run(|r| a::user_add(api, who, r)).await,
        "user/get" => unary.run(|r| a::user_get(api, who, r)).await,
        "user/list" => unary.run(|r| a::user_list(api, who, r)).await,
        "user/delete" => unary.run(|r| a::user_delete(api, who, r)).await,
        "user/changepw" => unary.run(|r| a::user_change_password(api, who, r)).await,
        "user/grant" => unary.run(|r| a::user_grant_role(api, who, r)).await,
        "user/revoke" => unary.run(|r| a::user_revoke_role(api, who, r)).await,
        "role/add" => unary.run(|r| a::role_add(api, who, r)).await,
        "role/get" => unary.run(|r| a::role_get(api, who, r)).await,
        "role/list" => unary.run(|r| a::role_list(api, who, r)).await,
        "role/delete" => unary.run(|r| a::role_delete(api, who, r)).await,
        "role/grant" => unary.run(|r| a::role_grant_permission(api, who, r)).await,
        "role/revoke" => unary.run(|r| a::role_revoke_permission(api, who, r)).await,
        _ => HttpResponse::not_found(),
    }
}

/// A request body read as grpc-gateway's JSON decoder (Go's `json.Decoder`, jsonpb) reads it:
/// the first JSON value only (what follows it is not read); see `from_go_value`.
fn decode_like_go<Req: DeserializeOwned + Default>(body: &[u8]) -> serde_json::Result<Req> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>();
    match values.next() {
        Some(value) => from_go_value(value?),
        None => Ok(Req::default()),
    }
}

/// One JSON value as a request, read as Go's decoder reads it: `null` for any field is that
/// field left out (and a `null` value an empty request), and a field given twice keeps its
/// last value (a JSON object read into a map).
fn from_go_value<Req: DeserializeOwned + Default>(
    mut value: serde_json::Value,
) -> serde_json::Result<Req> {
    fn drop_nulls(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(fields) => {
                fields.retain(|_, v| !v.is_null());
                fields.values_mut().for_each(drop_nulls);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
            _ => {}
        }
    }
    if value.is_null() {
        return Ok(Req::default());
    }
    drop_nulls(&mut value);
    serde_json::from_value(value)
}

/// A unary call's JSON body, and the gRPC receive limit its decoded message must keep to.
#[derive(Clone, Copy)]
struct Unary<'a> {
    body: &'a [u8],
    recv_bytes_max: usize,
}

impl Unary<'_> {
    /// Decodes the JSON request (an empty body is an empty request, and unknown fields are
    /// ignored, as grpc-gateway does), runs the method, and encodes its answer or error.
    async fn run<Req, Resp, F, Fut>(self, method: F) -> HttpResponse
    where
        Req: DeserializeOwned + Default + prost::Message,
        Resp: Serialize,
        F: FnOnce(Req) -> Fut,
        Fut: Future<Output = Result<Resp, Status>>,
    {
        let request = match decode_like_go::<Req>(self.body) {
            Ok(r) => r,
            Err(e) => return error(&Status::new(Code::InvalidArgument, e.to_string())),
        };
        // etcd's gateway hands the decoded request to its gRPC server as a message, which
        // that server refuses over its receive limit (max-request-bytes plus 512 KiB) with
        // grpc-go's ResourceExhausted; below it, a write over max-request-bytes is "request
        // is too large".
        let message_bytes = request.encoded_len();
        if message_bytes > self.recv_bytes_max {
            return error(&Status::message_too_large(
                message_bytes as u64,
                self.recv_bytes_max,
            ));
        }
        match method(request).await {
            Ok(response) => match serde_json::to_vec(&response) {
                Ok(json) => HttpResponse::new(StatusCode::OK, "application/json", json),
                Err(e) => error(&Status::new(Code::Internal, e.to_string())),
            },
            Err(status) => error(&status),
        }
    }
}

/// The streaming calls the gateway serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Streaming {
    /// Bidirectional: the body holds any number of requests.
    Watch,
    LeaseKeepAlive,
    /// Server-streaming: the body holds one request.
    Observe,
    Snapshot,
}

impl Streaming {
    /// The gRPC method the call runs as (through the gRPC dispatcher, so its checks apply).
    fn path(self) -> &'static str {
        match self {
            Streaming::Watch => "/etcdserverpb.Watch/Watch",
            Streaming::LeaseKeepAlive => "/etcdserverpb.Lease/LeaseKeepAlive",
            Streaming::Observe => "/v3electionpb.Election/Observe",
            Streaming::Snapshot => "/etcdserverpb.Maintenance/Snapshot",
        }
    }

    /// Responses the call may queue ahead of the HTTP writer; beyond it the call's sends wait
    /// (and a watch's own bounded queue takes over), so a slow reader holds no more. A
    /// snapshot's responses are 1 MiB chunks of the database: one queued (the channel's slot
    /// per sender) is enough to keep the writer busy while the next chunk is read.
    fn queue_max(self) -> usize {
        match self {
            Streaming::Snapshot => 0,
            _ => STREAM_MESSAGES_MAX,
        }
    }
}

/// Responses a watch, keep-alive or observe call may queue ahead of the HTTP writer.
const STREAM_MESSAGES_MAX: usize = 16;

/// Serves a streaming call. A bidirectional call (watch, keep-alive) takes the body's JSON
/// objects as its request messages (grpc-gateway decodes the body as a sequence of them), then
/// its request side ends, as the gateway's `CloseSend` does. A server-streaming call
/// (observe, snapshot) takes the body's first JSON object, or an empty request for an empty
/// body, as grpc-gateway's generated handlers do. The answer streams one JSON line per
/// response.
async fn streaming(
    api: &Rc<Api>,
    kind: Streaming,
    headers: HeaderMap,
    body: &[u8],
) -> HttpResponse {
    let requests = match kind {
        Streaming::Watch => decode_all::<pb::WatchRequest>(body),
        Streaming::LeaseKeepAlive => decode_all::<pb::LeaseKeepAliveRequest>(body),
        Streaming::Observe => decode_first::<epb::LeaderRequest>(body),
        Streaming::Snapshot => decode_first::<pb::SnapshotRequest>(body),
    };
    let requests = match requests {
        Ok(requests) => requests,
        Err(status) => return error(&status),
    };
    let counts = Rc::new(CallCounts::default());
    let call = Call {
        head: CallHead {
            path: http::uri::PathAndQuery::from_static(kind.path()),
            // The Authorization header is the token, as on the unary gateway calls.
            metadata: headers.into(),
            timeout: None,
        },
        requests: RequestStream::local(requests, counts.clone()),
    };
    let (sender, messages) = futures_channel::mpsc::channel(kind.queue_max());
    // grpc-go's send limit, as the gRPC path has: grpc-gateway is a gRPC client of it.
    let mut sink = ResponseSink::local(
        sender,
        keel_grpc::codec::DEFAULT_MAX_SEND_MESSAGE_BYTES,
        counts,
    );
    let api = api.clone();
    let driver = async move {
        let status = api.dispatch(kind.path(), call, &mut sink).await;
        // `sink` (the sender) drops here, so the lines end after the last response.
        drop(sink);
        status
    };
    let mut lines = Lines {
        driver: Some(Box::pin(driver)),
        messages,
        kind,
        results: 0,
        failure: None,
        failed_with: None,
    };
    if kind != Streaming::Snapshot {
        // Sent at once: a watch or an observe may wait long for its first line, and only a
        // response being written notices a client that hung up meanwhile.
        return HttpResponse::streaming(StatusCode::OK, "application/json", lines);
    }
    // grpc-gateway writes the head with the first line, so a call that fails before
    // answering (a snapshot refused by auth) gets its error's HTTP status. A snapshot's first
    // line comes as soon as the database image is written, so it is awaited here.
    let first = futures_util::StreamExt::next(&mut lines).await;
    let status = match (lines.results, lines.failed_with) {
        (0, Some(code)) => http_status(code),
        _ => StatusCode::OK,
    };
    HttpResponse::streaming(
        status,
        "application/json",
        futures_util::stream::iter(first).chain(lines),
    )
}

/// The request messages in `body`, protobuf-encoded: each JSON object in turn (none for an
/// empty body). A bad one fails the call before it starts, as grpc-gateway's decoder does
/// (code Unknown: the decoder's error is no gRPC status).
fn decode_all<Req>(body: &[u8]) -> Result<Vec<Bytes>, Status>
where
    Req: DeserializeOwned + prost::Message + Default,
{
    serde_json::Deserializer::from_slice(body)
        .into_iter::<serde_json::Value>()
        .map(|value| {
            value
                .and_then(from_go_value::<Req>)
                .map(|r| Bytes::from(r.encode_to_vec()))
                .map_err(|e| Status::new(Code::Unknown, e.to_string()))
        })
        .collect()
}

/// A server-streaming call's one request, protobuf-encoded: the body's first JSON object
/// (what follows it is not read, as grpc-gateway's decoder reads one), or an empty request
/// for an empty body. A bad one is InvalidArgument, answered before the call starts.
fn decode_first<Req>(body: &[u8]) -> Result<Vec<Bytes>, Status>
where
    Req: DeserializeOwned + prost::Message + Default,
{
    let request = decode_like_go::<Req>(body)
        .map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
    Ok(vec![Bytes::from(request.encode_to_vec())])
}

/// A streaming call's body: polls the call itself (nothing else drives it, and dropping this
/// drops the call) and turns each response into a `{"result":...}` line.
struct Lines {
    driver: Option<Pin<Box<dyn Future<Output = Status>>>>,
    messages: futures_channel::mpsc::Receiver<Bytes>,
    kind: Streaming,
    /// `{"result":...}` lines given out so far.
    results: u64,
    /// The call's failure, written as the last line once its responses are out.
    failure: Option<Status>,
    /// The code of the failure once its line is given out.
    failed_with: Option<Code>,
}

impl Stream for Lines {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = &mut *self;
        if let Some(driver) = this.driver.as_mut() {
            if let Poll::Ready(status) = driver.as_mut().poll(cx) {
                this.driver = None;
                if !status.is_ok() {
                    this.failure = Some(status);
                }
            }
        }
        match Pin::new(&mut this.messages).poll_next(cx) {
            Poll::Ready(Some(message)) => {
                this.results += 1;
                Poll::Ready(Some(result_line(this.kind, &message)))
            }
            Poll::Ready(None) => Poll::Ready(this.failure.take().map(|status| {
                this.failed_with = Some(status.code);
                stream_error_line(&status)
            })),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One response as grpc-gateway streams it: `{"result":<response>}` and a newline.
fn result_line(kind: Streaming, message: &[u8]) -> Bytes {
    fn line<M: prost::Message + Default + Serialize>(message: &[u8]) -> Result<Vec<u8>, Status> {
        let response =
            M::decode(message).map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        let mut out = br#"{"result":"#.to_vec();
        serde_json::to_writer(&mut out, &response)
            .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        out.extend_from_slice(b"}\n");
        Ok(out)
    }
    let encoded = match kind {
        Streaming::Watch => line::<pb::WatchResponse>(message),
        Streaming::LeaseKeepAlive => line::<pb::LeaseKeepAliveResponse>(message),
        Streaming::Observe => line::<epb::LeaderResponse>(message),
        Streaming::Snapshot => line::<pb::SnapshotResponse>(message),
    };
    match encoded {
        Ok(line) => Bytes::from(line),
        // Our own message failed to re-decode (never expected): say so in its place, on a
        // line of its own, as more lines may follow.
        Err(status) => {
            let mut line = stream_error_line(&status).to_vec();
            line.push(b'\n');
            Bytes::from(line)
        }
    }
}

/// grpc-gateway v1's error object in a stream (its `internal.StreamError` in proto3 JSON, with
/// the .proto field names): `{"error":{"grpc_code":…,"http_code":…,"message":…,"http_status":…}}`.
/// It ends the stream, and grpc-gateway writes it without the newline that follows results.
fn stream_error_line(status: &Status) -> Bytes {
    let http_code = http_status(status.code);
    // Written by hand to keep Go's field order (serde_json's maps sort their keys).
    let line = format!(
        r#"{{"error":{{"grpc_code":{},"http_code":{},"message":{},"http_status":{}}}}}"#,
        status.code.as_u8(),
        http_code.as_u16(),
        serde_json::Value::String(status.message.clone()),
        serde_json::Value::String(http_code.canonical_reason().unwrap_or("").to_string()),
    );
    Bytes::from(line)
}

/// grpc-gateway's error answer: `{"error":…,"message":…,"code":…}` with the HTTP status its
/// `HTTPStatusFromCode` picks.
fn error(status: &Status) -> HttpResponse {
    let body = format!(
        r#"{{"error":{m},"message":{m},"code":{c}}}"#,
        m = serde_json::Value::String(status.message.clone()),
        c = status.code.as_u8()
    );
    HttpResponse::new(http_status(status.code), "application/json", body)
}

/// grpc-gateway v1's mapping from gRPC codes to HTTP statuses.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Canceled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_as_gos_decoder_reads_them() {
        let read = |body: &str| decode_like_go::<pb::RangeRequest>(body.as_bytes());
        let plain = read(r#"{"key":"YQ==","limit":"2"}"#).expect("valid");
        assert_eq!((&plain.key[..], plain.limit), (&b"a"[..], 2));
        // Nulls are fields left out; a null body is an empty request.
        let nulls = read(r#"{"key":"YQ==","keys_only":null,"limit":null}"#).expect("nulls");
        assert_eq!(
            (&nulls.key[..], nulls.keys_only, nulls.limit),
            (&b"a"[..], false, 0)
        );
        assert_eq!(
            read("null").expect("null body"),
            pb::RangeRequest::default()
        );
        // An empty body, or one of whitespace, is an empty request.
        assert_eq!(read("").expect("empty body"), pb::RangeRequest::default());
        assert_eq!(
            read(" \r\n").expect("blank body"),
            pb::RangeRequest::default()
        );
        // Only the first value is read; a repeated field keeps its last value.
        let first = read(r#"{"key":"YQ=="} trailing"#).expect("first value");
        assert_eq!(&first.key[..], b"a");
        let twice = read(r#"{"key":"YQ==","key":"Yg=="}"#).expect("repeated field");
        assert_eq!(&twice.key[..], b"b");
        assert!(read(r#"{"key":"#).is_err());
        assert!(read(r#"{"limit":true}"#).is_err());
    }

    #[test]
    fn grpc_metadata_comes_from_prefixed_headers_and_authorization() {
        let mut headers = HeaderMap::new();
        headers.insert("token", "plain".parse().unwrap());
        headers.insert("grpc-metadata-token", "prefixed".parse().unwrap());
        headers.insert("authorization", "auth".parse().unwrap());
        headers.insert("grpc-metadata-authorization", "other".parse().unwrap());
        headers.insert("grpc-metadata-hasleader", "true".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        as_grpc_metadata(&mut headers);
        assert_eq!(headers["token"], "prefixed");
        assert_eq!(
            headers["authorization"], "auth",
            "Authorization itself wins"
        );
        assert_eq!(headers["hasleader"], "true");
        assert_eq!(headers["content-type"], "application/json");
        // No client names the certificate user, prefixed or not.
        let mut spoofed = HeaderMap::new();
        spoofed.insert(
            http::HeaderName::from_bytes(
                format!("grpc-metadata-{}", crate::auth::CERT_USER_HEADER).as_bytes(),
            )
            .unwrap(),
            "root".parse().unwrap(),
        );
        as_grpc_metadata(&mut spoofed);
        assert!(spoofed.get(crate::auth::CERT_USER_HEADER).is_none());
        // Without a prefixed token, a plain one is gone.
        let mut plain = HeaderMap::new();
        plain.insert("token", "plain".parse().unwrap());
        as_grpc_metadata(&mut plain);
        assert!(plain.get("token").is_none());
    }

    #[test]
    fn errors_look_like_grpc_gateways() {
        let r = error(&Status::new(
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ));
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            &r.body[..],
            br#"{"error":"etcdserver: key is not provided","message":"etcdserver: key is not provided","code":3}"#
        );
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::PRECONDITION_FAILED
        );
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
    }

    #[test]
    fn stream_errors_look_like_grpc_gateways() {
        let line = stream_error_line(&Status::new(
            Code::NotFound,
            "etcdserver: requested lease not found",
        ));
        assert_eq!(
            &line[..],
            &b"{\"error\":{\"grpc_code\":5,\"http_code\":404,\"message\":\"etcdserver: requested lease not found\",\"http_status\":\"Not Found\"}}"[..]
        );
    }

    #[test]
    fn a_server_streaming_call_takes_the_first_request_or_an_empty_one() {
        let decode = |body: &[u8]| {
            decode_first::<epb::LeaderRequest>(body).map(|messages| {
                assert_eq!(messages.len(), 1);
                <epb::LeaderRequest as prost::Message>::decode(&messages[0][..]).expect("protobuf")
            })
        };
        let first = decode(br#"{"name":"ZWw="} {"name":"b3RoZXI="}"#).expect("a request");
        assert_eq!(&first.name[..], b"el");
        assert_eq!(decode(b"").expect("empty"), epb::LeaderRequest::default());
        let bad = decode(b"{bad").expect_err("bad JSON");
        assert_eq!(bad.code, Code::InvalidArgument);
    }

    /// Polls `lines` to its end (nothing here waits on anything but the futures given).
    fn drain(lines: &mut Lines) -> Vec<Bytes> {
        futures_lite::future::block_on(lines.collect::<Vec<_>>())
    }

    fn lines_of(kind: Streaming, driver: impl Future<Output = Status> + 'static) -> Lines {
        let (_, messages) = futures_channel::mpsc::channel(1);
        Lines {
            driver: Some(Box::pin(driver)),
            messages,
            kind,
            results: 0,
            failure: None,
            failed_with: None,
        }
    }

    #[test]
    fn a_call_that_fails_before_answering_is_one_error_object() {
        let mut lines = lines_of(Streaming::Snapshot, async {
            Status::new(Code::Unknown, "auth: permission denied")
        });
        let out = drain(&mut lines);
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with(br#"{"error":{"grpc_code":2,"http_code":500"#));
        assert!(!out[0].ends_with(b"\n"));
        assert_eq!((lines.results, lines.failed_with), (0, Some(Code::Unknown)));
        // A call that ends cleanly without answering is an empty body.
        let mut lines = lines_of(Streaming::Observe, async { Status::ok() });
        assert!(drain(&mut lines).is_empty());
        assert_eq!(lines.failed_with, None);
    }

    #[test]
    fn a_body_may_hold_several_requests_or_none() {
        let two = decode_all::<pb::WatchRequest>(
            br#"{"create_request":{"key":"YQ=="}} {"progress_request":{}}"#,
        )
        .expect("two requests");
        assert_eq!(two.len(), 2);
        assert!(decode_all::<pb::WatchRequest>(b" \n")
            .expect("none")
            .is_empty());
        let bad = decode_all::<pb::WatchRequest>(b"{bad").expect_err("bad JSON");
        assert_eq!(bad.code, Code::Unknown);
    }
}
