//! A small gRPC client over HTTP/2 (h2 on tokio), just enough for etcd's API.
//!
//! One `Connection` is one TCP connection; it is cheap to clone and many `Caller`s share it,
//! each with its own request stream per call (HTTP/2 multiplexing). A `Caller` owns reusable
//! encode and decode buffers so the hot path does not allocate per request where it can avoid it.

use std::future::poll_fn;
use std::sync::{Arc, OnceLock};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::uri::{Authority, PathAndQuery, Scheme};
use prost::Message;
use tokio::net::TcpStream;

use crate::Error;

/// The largest gRPC message we accept; a bigger length prefix is a protocol error, so a
/// corrupt prefix cannot make us buffer gigabytes.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// The gRPC length prefix: one compression-flag byte and a big-endian u32 length.
pub const FRAME_PREFIX_BYTES: usize = 5;
/// Receive windows: large enough that a 1000-key range response is not throttled by flow control.
const STREAM_WINDOW_BYTES: u32 = 8 << 20;
const CONNECTION_WINDOW_BYTES: u32 = 64 << 20;

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(STREAM_WINDOW_BYTES <= CONNECTION_WINDOW_BYTES);

/// A gRPC method path; the constants below are the ones the workloads use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Method(pub &'static str);

pub const KV_RANGE: Method = Method("/etcdserverpb.KV/Range");
pub const KV_PUT: Method = Method("/etcdserverpb.KV/Put");
pub const KV_TXN: Method = Method("/etcdserverpb.KV/Txn");
pub const WATCH: Method = Method("/etcdserverpb.Watch/Watch");
pub const LEASE_GRANT: Method = Method("/etcdserverpb.Lease/LeaseGrant");
pub const LEASE_KEEPALIVE: Method = Method("/etcdserverpb.Lease/LeaseKeepAlive");
pub const MAINTENANCE_STATUS: Method = Method("/etcdserverpb.Maintenance/Status");

/// The TLS client configuration for `https://` endpoints, set once from `--cacert` before any
/// connection is made (one trust root for the whole run, as etcdctl's `--cacert`).
static TLS_CLIENT: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();

/// Trusts the PEM certificates in `ca_path` for every `https://` endpoint of this run.
pub fn use_ca_file(ca_path: &std::path::Path) -> Result<(), Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |e: String| Error::InvalidArgument(format!("--cacert {}: {e}", ca_path.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_path).map_err(|e| bad(e.to_string()))? {
        roots
            .add(cert.map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // gRPC needs HTTP/2, and etcd's server only speaks it over TLS when ALPN agrees on "h2".
    config.alpn_protocols = vec![b"h2".to_vec()];
    TLS_CLIENT
        .set(Arc::new(config))
        .map_err(|_| Error::InvalidArgument("--cacert given twice".into()))
}

/// Splits a comma-separated endpoint list into `host:port` strings, accepting an optional
/// `http://` prefix and trailing slash as etcdctl does. An `https://` endpoint keeps its prefix
/// (the connection is then made over TLS, trusting `--cacert`).
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, Error> {
    let mut endpoints = Vec::new();
    for raw in list.split(',') {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with("unix") {
            return Err(Error::InvalidArgument(format!(
                "endpoint {trimmed:?}: only http and https endpoints are supported"
            )));
        }
        let tls = trimmed.starts_with("https://");
        let host_port = trimmed
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        if host_port.parse::<Authority>().is_err() || !host_port.contains(':') {
            return Err(Error::InvalidArgument(format!(
                "endpoint {trimmed:?}: want host:port, http://host:port or https://host:port"
            )));
        }
        endpoints.push(if tls {
            format!("https://{host_port}")
        } else {
            host_port.to_string()
        });
    }
    if endpoints.is_empty() {
        return Err(Error::InvalidArgument("no endpoints given".into()));
    }
    assert!(endpoints.iter().all(|e| !e.is_empty()));
    Ok(endpoints)
}

/// The HTTP/2 handshake over `io`, with the connection driven by a task spawned on the current
/// tokio runtime until every `SendRequest` clone is dropped.
async fn drive<T>(builder: &h2::client::Builder, io: T) -> Result<SendRequest<Bytes>, Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) = builder.handshake::<_, Bytes>(io).await?;
    tokio::spawn(async move {
        // A connection error also fails every open stream, which is where it is reported.
        let _ = connection.await;
    });
    Ok(send)
}

/// One HTTP/2 connection to one endpoint. Clones share the connection.
#[derive(Clone)]
pub struct Connection {
    send: SendRequest<Bytes>,
    authority: Authority,
    scheme: Scheme,
}

impl Connection {
    /// Dials `host_port` and performs the HTTP/2 handshake; the connection is driven by a task
    /// spawned on the current tokio runtime until every clone is dropped.
    /// An `https://` endpoint is dialed over TLS, trusting `use_ca_file`'s roots.
    pub async fn connect(endpoint: &str) -> Result<Connection, Error> {
        let (host_port, tls) = match endpoint.strip_prefix("https://") {
            Some(host_port) => {
                let config = TLS_CLIENT.get().ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "endpoint {endpoint:?}: https endpoints need --cacert"
                    ))
                })?;
                (host_port, Some(config.clone()))
            }
            None => (endpoint, None),
        };
        let authority: Authority = host_port
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("endpoint {host_port:?}")))?;
        let connect_error = |source| Error::Connect {
            endpoint: endpoint.to_string(),
            source,
        };
        let tcp = TcpStream::connect(host_port).await.map_err(connect_error)?;
        // Small request/response pairs: Nagle would add 40 ms stalls.
        tcp.set_nodelay(true)?;
        let mut builder = h2::client::Builder::new();
        builder
            .initial_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES);
        let (send, scheme) = match tls {
            None => (drive(&builder, tcp).await?, Scheme::HTTP),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from(authority.host().to_string())
                    .map_err(|e| Error::InvalidArgument(format!("endpoint {endpoint:?}: {e}")))?;
                let stream = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(connect_error)?;
                (drive(&builder, stream).await?, Scheme::HTTPS)
            }
        };
        Ok(Connection {
            send,
            authority,
            scheme,
        })
    }

    fn request(&self, method: Method) -> http::Request<()> {
        let uri = http::Uri::from_parts({
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(self.scheme.clone());
            parts.authority = Some(self.authority.clone());
            parts.path_and_query = Some(PathAndQuery::from_static(method.0));
            parts
        })
        .expect("scheme, authority and a static absolute path always form a valid URI");
        http::Request::builder()
            .method(http::Method::POST)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(())
            .expect("static method, URI and headers always form a valid request")
    }
}

/// One caller: a connection plus reusable buffers. Each concurrent client owns one.
pub struct Caller {
    connection: Connection,
    tx_buf: BytesMut,
    rx: FrameReader,
}

impl Caller {
    pub fn new(connection: &Connection) -> Caller {
        Caller {
            connection: connection.clone(),
            tx_buf: BytesMut::with_capacity(4096),
            rx: FrameReader::new(),
        }
    }

    /// One unary call. A non-zero `grpc-status` is `Error::Status`.
    pub async fn unary<Req: Message, Resp: Message + Default>(
        &mut self,
        method: Method,
        request: &Req,
    ) -> Result<Resp, Error> {
        let frame = encode_frame(&mut self.tx_buf, request);
        let http_request = self.connection.request(method);
        let send = &mut self.connection.send;
        poll_fn(|cx| send.poll_ready(cx)).await?;
        let (response, mut body_tx) = send.send_request(http_request, false)?;
        body_tx.send_data(frame, true)?;
        let response = response.await?;
        let (parts, mut body) = response.into_parts();
        check_http_status(&parts)?;
        // A "trailers-only" response carries grpc-status in the headers and no body.
        if let Some(status) = parts.headers.get("grpc-status") {
            check_grpc_status(status, parts.headers.get("grpc-message"))?;
            return Err(Error::Protocol(format!(
                "{}: grpc-status 0 without a message",
                method.0
            )));
        }
        self.rx.clear();
        let mut message: Option<Resp> = None;
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            body.flow_control().release_capacity(chunk.len())?;
            self.rx.push(&chunk)?;
            if let Some(frame) = self.rx.next_frame()? {
                if message.is_some() {
                    return Err(Error::Protocol(format!("{}: two messages", method.0)));
                }
                message = Some(Resp::decode(frame)?);
            }
        }
        let trailers = body.trailers().await?;
        check_trailers(trailers.as_ref())?;
        if !self.rx.is_empty() {
            return Err(Error::Protocol(format!("{}: truncated message", method.0)));
        }
        message.ok_or_else(|| Error::Protocol(format!("{}: no message", method.0)))
    }

    /// Opens a bidirectional stream (Watch, LeaseKeepAlive). Nothing is sent yet.
    pub async fn open_stream(&mut self, method: Method) -> Result<GrpcStream, Error> {
        let http_request = self.connection.request(method);
        let send = &mut self.connection.send;
        poll_fn(|cx| send.poll_ready(cx)).await?;
        let (response, tx) = send.send_request(http_request, false)?;
        Ok(GrpcStream {
            tx,
            response: Some(response),
            rx: None,
            reader: FrameReader::new(),
            tx_buf: BytesMut::with_capacity(1024),
        })
    }
}

/// A bidirectional gRPC stream. Send and receive from one task (the bench never needs to
/// split it: watch creates are all sent before the reader starts).
pub struct GrpcStream {
    tx: SendStream<Bytes>,
    response: Option<h2::client::ResponseFuture>,
    rx: Option<RecvStream>,
    reader: FrameReader,
    tx_buf: BytesMut,
}

impl GrpcStream {
    /// Queues one message. The messages the bench sends are tiny and paced by replies, so
    /// h2's send buffer stays bounded by the number of requests in flight.
    pub fn send<M: Message>(&mut self, message: &M) -> Result<(), Error> {
        let frame = encode_frame(&mut self.tx_buf, message);
        self.tx.send_data(frame, false)?;
        Ok(())
    }

    /// The next message, or `None` when the server ended the stream with status OK.
    pub async fn recv<M: Message + Default>(&mut self) -> Result<Option<M>, Error> {
        if let Some(response) = self.response.take() {
            let response = response.await?;
            let (parts, body) = response.into_parts();
            check_http_status(&parts)?;
            if let Some(status) = parts.headers.get("grpc-status") {
                check_grpc_status(status, parts.headers.get("grpc-message"))?;
                return Ok(None);
            }
            self.rx = Some(body);
        }
        let Some(body) = self.rx.as_mut() else {
            return Ok(None);
        };
        loop {
            if let Some(frame) = self.reader.next_frame()? {
                return Ok(Some(M::decode(frame)?));
            }
            match body.data().await {
                Some(chunk) => {
                    let chunk = chunk?;
                    body.flow_control().release_capacity(chunk.len())?;
                    self.reader.push(&chunk)?;
                }
                None => {
                    let trailers = body.trailers().await?;
                    self.rx = None;
                    check_trailers(trailers.as_ref())?;
                    return Ok(None);
                }
            }
        }
    }

    /// Half-closes our side: the server sees end of stream.
    pub fn close(&mut self) -> Result<(), Error> {
        self.tx.send_data(Bytes::new(), true)?;
        Ok(())
    }
}

/// Encodes `message` with its gRPC prefix into `buf` and splits the frame off. Once the
/// previous frame has been sent and dropped, `reserve` reclaims the same allocation.
pub fn encode_frame<M: Message>(buf: &mut BytesMut, message: &M) -> Bytes {
    let len = message.encoded_len();
    assert!(
        len <= FRAME_BYTES_MAX,
        "request of {len} bytes exceeds FRAME_BYTES_MAX"
    );
    buf.clear();
    buf.reserve(FRAME_PREFIX_BYTES + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).expect("bounded by FRAME_BYTES_MAX"));
    message
        .encode(buf)
        .expect("buffer reserved for the encoded length");
    assert_eq!(buf.len(), FRAME_PREFIX_BYTES + len);
    buf.split().freeze()
}

/// Reassembles gRPC frames from HTTP/2 DATA chunks.
pub struct FrameReader {
    buf: BytesMut,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameReader {
    pub fn new() -> FrameReader {
        FrameReader {
            buf: BytesMut::with_capacity(4096),
        }
    }

    pub fn clear(&mut self) {
        self.buf.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Appends a chunk; refuses to buffer more than one maximal frame.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Error> {
        if self.buf.len() + chunk.len() > FRAME_PREFIX_BYTES + FRAME_BYTES_MAX {
            return Err(Error::Protocol(
                "receive buffer would exceed FRAME_BYTES_MAX".into(),
            ));
        }
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    /// The next complete message body, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, Error> {
        if self.buf.len() < FRAME_PREFIX_BYTES {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Error::Protocol(
                "compressed gRPC message (none was negotiated)".into(),
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > FRAME_BYTES_MAX {
            return Err(Error::Protocol(format!(
                "message of {len} bytes exceeds FRAME_BYTES_MAX"
            )));
        }
        if self.buf.len() < FRAME_PREFIX_BYTES + len {
            return Ok(None);
        }
        self.buf.advance(FRAME_PREFIX_BYTES);
        let frame = self.buf.split_to(len).freeze();
        assert_eq!(frame.len(), len);
        Ok(Some(frame))
    }
}

fn check_http_status(parts: &http::response::Parts) -> Result<(), Error> {
    if parts.status != http::StatusCode::OK {
        return Err(Error::Protocol(format!("HTTP status {}", parts.status)));
    }
    Ok(())
}

fn check_trailers(trailers: Option<&http::HeaderMap>) -> Result<(), Error> {
    let trailers =
        trailers.ok_or_else(|| Error::Protocol("stream ended without trailers".into()))?;
    let status = trailers
        .get("grpc-status")
        .ok_or_else(|| Error::Protocol("trailers without grpc-status".into()))?;
    check_grpc_status(status, trailers.get("grpc-message"))
}

fn check_grpc_status(
    status: &http::HeaderValue,
    message: Option<&http::HeaderValue>,
) -> Result<(), Error> {
    let code: u32 = status
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Protocol(format!("bad grpc-status {status:?}")))?;
    if code == 0 {
        return Ok(());
    }
    let message = message
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Err(Error::Status { code, message })
}

/// gRPC percent-encodes grpc-message; decode it so etcd's error strings read as written.
pub fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::etcdserverpb::PutRequest;

    #[test]
    fn endpoints_accept_scheme_and_lists() {
        let parsed = parse_endpoints("http://127.0.0.1:2379/, 10.0.0.1:2380").expect("valid");
        assert_eq!(parsed, vec!["127.0.0.1:2379", "10.0.0.1:2380"]);
        let tls = parse_endpoints("https://127.0.0.1:2379/").expect("valid");
        assert_eq!(tls, vec!["https://127.0.0.1:2379"]);
        assert!(parse_endpoints("").is_err());
        assert!(parse_endpoints("unix://x:1").is_err());
        assert!(parse_endpoints("localhost").is_err());
    }

    #[test]
    fn frames_round_trip_across_chunk_boundaries() {
        let mut buf = BytesMut::new();
        let request = PutRequest {
            key: Bytes::from_static(b"key"),
            value: Bytes::from(vec![7u8; 300]),
            ..Default::default()
        };
        let one = encode_frame(&mut buf, &request);
        let two = encode_frame(&mut buf, &PutRequest::default());
        assert_eq!(one[0], 0);
        assert_eq!(two.len(), FRAME_PREFIX_BYTES);
        let mut wire = one.to_vec();
        wire.extend_from_slice(&two);
        // Feed one byte at a time: every split point must reassemble the same two messages.
        let mut reader = FrameReader::new();
        let mut decoded = Vec::new();
        for byte in wire {
            reader.push(&[byte]).expect("within limit");
            while let Some(frame) = reader.next_frame().expect("well formed") {
                decoded.push(PutRequest::decode(frame).expect("decodes"));
            }
        }
        assert_eq!(decoded, vec![request, PutRequest::default()]);
        assert!(reader.is_empty());
    }

    #[test]
    fn oversized_and_compressed_frames_are_refused() {
        let mut reader = FrameReader::new();
        reader
            .push(&[0, 0xff, 0xff, 0xff, 0xff])
            .expect("prefix fits");
        assert!(matches!(reader.next_frame(), Err(Error::Protocol(_))));
        let mut reader = FrameReader::new();
        reader.push(&[1, 0, 0, 0, 0]).expect("prefix fits");
        assert!(matches!(reader.next_frame(), Err(Error::Protocol(_))));
    }

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(
            percent_decode(b"etcdserver: key is not provided%21"),
            "etcdserver: key is not provided!"
        );
        assert_eq!(percent_decode(b"100%"), "100%");
        let status = http::HeaderValue::from_static("3");
        let message = http::HeaderValue::from_static("bad%20thing");
        match check_grpc_status(&status, Some(&message)) {
            Err(Error::Status { code, message }) => {
                assert_eq!(code, 3);
                assert_eq!(message, "bad thing");
            }
            other => panic!("want status error, got {other:?}"),
        }
    }
}
