//! A minimal HTTP/1.1 server for the plain endpoints that share the gRPC port (`/health`,
//! `/version`, `/metrics`, the JSON gateway): a sans-I/O request parser, a response writer, and
//! the connection loop. Requests: keep-alive and `Content-Length` bodies only (no chunked
//! request bodies). Responses: a whole `Content-Length` body, or a streamed body written with
//! `Transfer-Encoding: chunked` (the JSON gateway's watch and keep-alive streams).

use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::{select, Either};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::GrpcError;

/// Bounds on what one HTTP/1.1 request may occupy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http1Limits {
    /// Request line plus headers, including the blank line.
    pub head_bytes_max: usize,
    /// Number of header fields.
    pub header_count_max: usize,
    /// `Content-Length` body.
    pub body_bytes_max: usize,
}

impl Default for Http1Limits {
    fn default() -> Http1Limits {
        Http1Limits {
            head_bytes_max: 16 * 1024,
            header_count_max: 64,
            body_bytes_max: crate::codec::DEFAULT_MAX_RECV_MESSAGE_BYTES,
        }
    }
}

/// One parsed HTTP/1.1 request.
#[derive(Clone, Debug)]
pub struct HttpRequest {
    pub method: Method,
    /// The request target as sent: path plus optional query.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A streamed response body: each item is written (and flushed) as it comes; the body ends
/// when the stream does. Whoever builds one bounds what it buffers (a bounded channel): the
/// server pulls the next item only after the previous one was written.
pub struct BodyStream(pub Pin<Box<dyn Stream<Item = Bytes>>>);

impl std::fmt::Debug for BodyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyStream")
    }
}

/// The answer to one request: the writer adds Content-Length (or Transfer-Encoding) and
/// Connection.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: StatusCode,
    /// Empty: no Content-Type field (an empty body, as Go's server writes one).
    pub content_type: &'static str,
    /// More header fields, written after Content-Type (e.g. CORS's `Access-Control-*`).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The whole body; empty when `stream` is set.
    pub body: Bytes,
    /// A streamed body, sent chunked after the head. Dropped (with whatever produces it) when
    /// the client goes away.
    pub stream: Option<BodyStream>,
}

impl HttpResponse {
    pub fn new(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Self {
        HttpResponse {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
            stream: None,
        }
    }

    /// A response whose body is `stream`'s items, in order, written as they come.
    pub fn streaming(
        status: StatusCode,
        content_type: &'static str,
        stream: impl Stream<Item = Bytes> + 'static,
    ) -> Self {
        HttpResponse {
            status,
            content_type,
            headers: Vec::new(),
            body: Bytes::new(),
            stream: Some(BodyStream(Box::pin(stream))),
        }
    }

    pub fn not_found() -> HttpResponse {
        HttpResponse::new(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n",
        )
    }
}

/// Why a request could not be parsed; each maps to the status we answer before closing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Not HTTP/1.x, or a malformed line or header.
    Malformed(&'static str),
    /// The head is over `head_bytes_max` or has too many headers.
    HeadTooLarge,
    /// `Content-Length` over `body_bytes_max`.
    BodyTooLarge,
    /// Transfer-Encoding (chunked) bodies are not supported.
    TransferEncoding,
}

impl ParseError {
    pub fn status(&self) -> StatusCode {
        match self {
            ParseError::Malformed(_) => StatusCode::BAD_REQUEST,
            ParseError::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ParseError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ParseError::TransferEncoding => StatusCode::NOT_IMPLEMENTED,
        }
    }
}

/// Whether the connection stays open after a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlive {
    Yes,
    No,
}

/// A parsed request head, before its body arrived.
#[derive(Clone, Debug)]
pub struct RequestHead {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub content_length_bytes: usize,
    pub keep_alive: KeepAlive,
    /// Bytes the head occupied in the buffer, including the blank line.
    pub head_bytes: usize,
}

/// Parses a request head from the start of `buffer`. `Ok(None)`: more bytes are needed.
pub fn parse_head(buffer: &[u8], limits: &Http1Limits) -> Result<Option<RequestHead>, ParseError> {
    let Some(end) = find_head_end(buffer) else {
        if buffer.len() > limits.head_bytes_max {
            return Err(ParseError::HeadTooLarge);
        }
        return Ok(None);
    };
    let head_bytes = end + 4;
    if head_bytes > limits.head_bytes_max {
        return Err(ParseError::HeadTooLarge);
    }
    let head = std::str::from_utf8(&buffer[..end])
        .map_err(|_| ParseError::Malformed("head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines
        .next()
        .ok_or(ParseError::Malformed("no request line"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::Malformed("bad request line"));
    };
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| ParseError::Malformed("bad method"))?;
    if !path.starts_with('/') {
        return Err(ParseError::Malformed("bad request target"));
    }
    let mut keep_alive = match version {
        "HTTP/1.1" => KeepAlive::Yes,
        "HTTP/1.0" => KeepAlive::No,
        _ => return Err(ParseError::Malformed("bad version")),
    };
    let mut headers = HeaderMap::new();
    let mut content_length_bytes = 0usize;
    for line in lines {
        if headers.len() >= limits.header_count_max {
            return Err(ParseError::HeadTooLarge);
        }
        let (name, value) = line
            .split_once(':')
            .ok_or(ParseError::Malformed("header without colon"))?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ParseError::Malformed("bad header name"))?;
        let value = HeaderValue::from_str(value.trim())
            .map_err(|_| ParseError::Malformed("bad header value"))?;
        if name == http::header::CONTENT_LENGTH {
            let text = value
                .to_str()
                .map_err(|_| ParseError::Malformed("bad content-length"))?;
            let length: usize = text
                .parse()
                .map_err(|_| ParseError::Malformed("bad content-length"))?;
            if headers.contains_key(http::header::CONTENT_LENGTH) && length != content_length_bytes
            {
                return Err(ParseError::Malformed("conflicting content-length"));
            }
            content_length_bytes = length;
        } else if name == http::header::TRANSFER_ENCODING {
            return Err(ParseError::TransferEncoding);
        } else if name == http::header::CONNECTION {
            let text = value.to_str().unwrap_or("").to_ascii_lowercase();
            if text.contains("close") {
                keep_alive = KeepAlive::No;
            } else if text.contains("keep-alive") {
                keep_alive = KeepAlive::Yes;
            }
        }
        headers.append(name, value);
    }
    if content_length_bytes > limits.body_bytes_max {
        return Err(ParseError::BodyTooLarge);
    }
    assert!(head_bytes <= buffer.len());
    Ok(Some(RequestHead {
        method,
        path: path.to_owned(),
        headers,
        content_length_bytes,
        keep_alive,
        head_bytes,
    }))
}

fn find_head_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(4).position(|window| window == b"\r\n\r\n")
}

/// Serializes a response.
pub fn write_response(response: &HttpResponse, keep_alive: KeepAlive) -> Vec<u8> {
    let reason = response.status.canonical_reason().unwrap_or("Unknown");
    let connection = match keep_alive {
        KeepAlive::Yes => "keep-alive",
        KeepAlive::No => "close",
    };
    let head = format!(
        "HTTP/1.1 {} {}\r\n{}Content-Length: {}\r\nConnection: {}\r\n\r\n",
        response.status.as_u16(),
        reason,
        head_fields(response),
        response.body.len(),
        connection
    );
    let mut out = Vec::with_capacity(head.len() + response.body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&response.body);
    out
}

/// The head of a streamed response. Always `Connection: close`: bytes a client sends while
/// its stream runs are read only to notice that it went away, not kept as a next request.
pub fn write_streaming_head(response: &HttpResponse) -> Vec<u8> {
    let reason = response.status.canonical_reason().unwrap_or("Unknown");
    format!(
        "HTTP/1.1 {} {}\r\n{}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        response.status.as_u16(),
        reason,
        head_fields(response),
    )
    .into_bytes()
}

/// The response's Content-Type (if it has one) and extra fields, each line ended.
fn head_fields(response: &HttpResponse) -> String {
    use std::fmt::Write as _;
    let mut fields = String::new();
    if !response.content_type.is_empty() {
        let _ = write!(fields, "Content-Type: {}\r\n", response.content_type);
    }
    for (name, value) in &response.headers {
        // Header values are visible ASCII (the handler builds them); anything else is dropped
        // rather than written raw into the head.
        if let Ok(value) = value.to_str() {
            let _ = write!(fields, "{name}: {value}\r\n");
        }
    }
    fields
}

/// One chunk of a chunked body. `data` must not be empty: an empty chunk ends the body.
pub fn write_chunk(data: &[u8]) -> Vec<u8> {
    assert!(!data.is_empty(), "an empty chunk would end the body");
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.reserve(data.len() + 2);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The last chunk of a chunked body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes a streamed body chunk by chunk until it ends or the client goes away. The client's
/// side is read meanwhile: end of file or an error there means nobody is listening, and the
/// stream is dropped at once (a watch releases its watchers) instead of when a write fails,
/// which for a quiet watch might be never.
async fn write_stream<IO>(io: &mut IO, mut stream: BodyStream) -> Result<(), GrpcError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    const DISCARD_BYTES: usize = 4 * 1024;
    let mut discard = BytesMut::with_capacity(DISCARD_BYTES);
    loop {
        let next = {
            discard.clear();
            let read = pin!(io.read_buf(&mut discard));
            match select(stream.0.next(), read).await {
                Either::Left((chunk, _)) => Ok(chunk),
                Either::Right((read, _)) => Err(read),
            }
        };
        match next {
            Ok(Some(chunk)) if chunk.is_empty() => {}
            Ok(Some(chunk)) => {
                io.write_all(&write_chunk(&chunk)).await?;
                io.flush().await?;
            }
            Ok(None) => {
                io.write_all(LAST_CHUNK).await?;
                io.flush().await?;
                return Ok(());
            }
            // The client closed (or reset) its side: stop, dropping the stream.
            Err(Ok(0)) | Err(Err(_)) => return Ok(()),
            // Bytes after the request (a pipelined request we will not serve, as we close
            // after the stream): drop them; `discard` stays bounded.
            Err(Ok(_)) => {}
        }
    }
}

/// Reads more bytes into `buffer`, or fails once `read_timeout` passes with nothing read: a
/// client that stops mid-request (or idles between keep-alive requests) must not hold a
/// connection slot forever.
async fn read_more<IO>(
    io: &mut IO,
    buffer: &mut BytesMut,
    read_timeout: Duration,
    sleep: &dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()>>>,
) -> Result<usize, GrpcError>
where
    IO: AsyncRead + Unpin,
{
    let read = pin!(io.read_buf(buffer));
    match select(read, sleep(read_timeout)).await {
        Either::Left((read, _)) => Ok(read?),
        Either::Right(((), _)) => Err(GrpcError::ReadTimeout),
    }
}

/// Serves HTTP/1.1 requests on `io` until the peer closes, asks to close, errs, or sends
/// nothing for `read_timeout`. `initial` holds bytes already read by protocol sniffing.
pub(crate) async fn serve_http1<IO, F, Fut>(
    mut io: IO,
    initial: BytesMut,
    limits: Http1Limits,
    read_timeout: Duration,
    sleep: &dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()>>>,
    handle: F,
) -> Result<(), GrpcError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: Fn(HttpRequest) -> Fut,
    Fut: std::future::Future<Output = HttpResponse>,
{
    const READ_CHUNK_BYTES: usize = 8 * 1024;
    /// A body's buffer grows by at most this much per read.
    const BODY_CHUNK_BYTES: usize = 64 * 1024;
    let mut buffer = initial;
    loop {
        let head = loop {
            match parse_head(&buffer, &limits) {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(error) => {
                    let body = format!("{}\n", error.status());
                    let response =
                        HttpResponse::new(error.status(), "text/plain; charset=utf-8", body);
                    io.write_all(&write_response(&response, KeepAlive::No))
                        .await?;
                    io.flush().await?;
                    return Ok(());
                }
            }
            buffer.reserve(READ_CHUNK_BYTES);
            if read_more(&mut io, &mut buffer, read_timeout, sleep).await? == 0 {
                // The peer closed between requests (or mid-head): nothing to answer.
                return Ok(());
            }
        };
        buffer.advance(head.head_bytes);
        while buffer.len() < head.content_length_bytes {
            // Room for what arrives, not for what the head promises: a client that announces
            // the largest body and sends nothing holds no more than a chunk.
            buffer.reserve((head.content_length_bytes - buffer.len()).min(BODY_CHUNK_BYTES));
            if read_more(&mut io, &mut buffer, read_timeout, sleep).await? == 0 {
                return Ok(());
            }
        }
        let body = buffer.split_to(head.content_length_bytes).freeze();
        assert_eq!(body.len(), head.content_length_bytes);
        let request = HttpRequest {
            method: head.method,
            path: head.path,
            headers: head.headers,
            body,
        };
        let mut response = handle(request).await;
        if let Some(stream) = response.stream.take() {
            io.write_all(&write_streaming_head(&response)).await?;
            io.flush().await?;
            return write_stream(&mut io, stream).await;
        }
        io.write_all(&write_response(&response, head.keep_alive))
            .await?;
        io.flush().await?;
        if head.keep_alive == KeepAlive::No {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Http1Limits {
        Http1Limits {
            head_bytes_max: 256,
            header_count_max: 4,
            body_bytes_max: 10,
        }
    }

    #[test]
    fn parses_a_get_and_waits_for_more_bytes() {
        let request = b"GET /health?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\nNEXT";
        let head = parse_head(request, &limits())
            .expect("valid")
            .expect("complete");
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.path, "/health?x=1");
        assert_eq!(head.headers.get("host").expect("host"), "a");
        assert_eq!(head.keep_alive, KeepAlive::Yes);
        assert_eq!(head.content_length_bytes, 0);
        assert_eq!(&request[head.head_bytes..], b"NEXT");
        for cut in 0..head.head_bytes {
            assert!(parse_head(&request[..cut], &limits())
                .expect("prefix")
                .is_none());
        }
    }

    #[test]
    fn parses_content_length_and_connection_close() {
        let request =
            b"POST /v3/kv/range HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{}\n";
        let head = parse_head(request, &limits())
            .expect("valid")
            .expect("complete");
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.content_length_bytes, 3);
        assert_eq!(head.keep_alive, KeepAlive::No);
        let old = parse_head(b"GET / HTTP/1.0\r\n\r\n", &limits())
            .expect("ok")
            .expect("done");
        assert_eq!(old.keep_alive, KeepAlive::No);
    }

    #[test]
    fn garbage_is_a_bad_request() {
        let cases: &[&[u8]] = &[
            b"\x00\x01\x02\x03\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET /x HTTP/2.0\r\n\r\n",
            b"GET x HTTP/1.1\r\n\r\n",
            b"GET /x HTTP/1.1 extra\r\n\r\n",
            b"GET /x HTTP/1.1\r\nNoColon\r\n\r\n",
            b"GET /x HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
            b"GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"G(T /x HTTP/1.1\r\n\r\n",
        ];
        for case in cases {
            let error = parse_head(case, &limits()).expect_err("garbage");
            assert_eq!(error.status(), StatusCode::BAD_REQUEST, "{case:?}");
        }
    }

    #[test]
    fn oversize_heads_and_bodies_are_refused() {
        let long = vec![b'a'; 300];
        assert_eq!(
            parse_head(&long, &limits()).expect_err("no end"),
            ParseError::HeadTooLarge
        );
        let many = b"GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\ne: 1\r\n\r\n";
        assert_eq!(
            parse_head(many, &limits()).expect_err("5 headers"),
            ParseError::HeadTooLarge
        );
        let big = b"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n";
        assert_eq!(
            parse_head(big, &limits()).expect_err("body"),
            ParseError::BodyTooLarge
        );
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            parse_head(chunked, &limits())
                .expect_err("chunked")
                .status(),
            StatusCode::NOT_IMPLEMENTED
        );
    }

    #[test]
    fn writes_a_response_with_length() {
        let response =
            HttpResponse::new(StatusCode::OK, "application/json", "{\"health\":\"true\"}");
        let bytes = write_response(&response, KeepAlive::Yes);
        let text = String::from_utf8(bytes).expect("utf-8");
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 17\r\n"));
        assert!(text.contains("Connection: keep-alive\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"health\":\"true\"}"));
        let closing = write_response(&HttpResponse::not_found(), KeepAlive::No);
        assert!(String::from_utf8_lossy(&closing).contains("Connection: close\r\n"));
    }

    #[test]
    fn extra_fields_follow_the_content_type_and_an_empty_type_is_left_out() {
        let mut response = HttpResponse::new(StatusCode::OK, "", "");
        response.headers.push((
            http::HeaderName::from_static("access-control-allow-origin"),
            http::HeaderValue::from_static("*"),
        ));
        let text = String::from_utf8(write_response(&response, KeepAlive::Yes)).expect("utf-8");
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\naccess-control-allow-origin: *\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
        );
        let mut streamed = HttpResponse::streaming(
            StatusCode::OK,
            "application/json",
            futures_util::stream::empty(),
        );
        streamed.headers = response.headers.clone();
        let head = String::from_utf8(write_streaming_head(&streamed)).expect("utf-8");
        assert!(
            head.contains("Content-Type: application/json\r\naccess-control-allow-origin: *\r\nTransfer-Encoding: chunked\r\n"),
            "{head}"
        );
    }

    /// Runs `serve_http1` on one end of an in-memory pipe with a handler answering `response`
    /// once, and `client` on the other end.
    fn with_server<C, Fut>(response: HttpResponse, client: C) -> Result<(), GrpcError>
    where
        C: FnOnce(tokio::io::DuplexStream) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let response = std::cell::RefCell::new(Some(response));
        let sleep = |_: Duration| -> Pin<Box<dyn Future<Output = ()>>> {
            Box::pin(futures_lite::future::pending())
        };
        let server = serve_http1(
            server_io,
            BytesMut::new(),
            Http1Limits::default(),
            Duration::from_secs(60),
            &sleep,
            |_request| {
                let response = response.borrow_mut().take().expect("one request");
                async move { response }
            },
        );
        let (served, ()) =
            futures_lite::future::block_on(futures_util::future::join(server, client(client_io)));
        served
    }

    #[test]
    fn streams_a_chunked_body_flushing_each_chunk() {
        let (mut tx, rx) = futures_channel::mpsc::channel::<Bytes>(1);
        let response = HttpResponse::streaming(StatusCode::OK, "application/json", rx);
        let served = with_server(response, |mut client| async move {
            client
                .write_all(b"POST /v3/watch HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
                .await
                .expect("request");
            let mut got = Vec::new();
            // Each chunk arrives before the next is produced: it was flushed on its own.
            for (item, wire) in [
                (&b"{\"a\":1}\n"[..], &b"8\r\n{\"a\":1}\n\r\n"[..]),
                (b"", b""),
                (b"xyz", b"3\r\nxyz\r\n"),
            ] {
                tx.try_send(Bytes::copy_from_slice(item)).expect("room");
                if wire.is_empty() {
                    continue;
                }
                let mut buffer = vec![0u8; 4096];
                while !got.ends_with(wire) {
                    let n = client.read(&mut buffer).await.expect("read");
                    assert!(n > 0, "{:?}", String::from_utf8_lossy(&got));
                    got.extend_from_slice(&buffer[..n]);
                }
            }
            drop(tx);
            client.read_to_end(&mut got).await.expect("rest");
            let text = String::from_utf8(got).expect("utf-8");
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            assert!(
                text.contains("Content-Type: application/json\r\n"),
                "{text}"
            );
            assert!(text.contains("Transfer-Encoding: chunked\r\n"), "{text}");
            assert!(text.contains("Connection: close\r\n"), "{text}");
            assert!(!text.contains("Content-Length"), "{text}");
            assert!(
                text.ends_with("\r\n\r\n8\r\n{\"a\":1}\n\r\n3\r\nxyz\r\n0\r\n\r\n"),
                "{text}"
            );
        });
        served.expect("served");
    }

    #[test]
    fn a_client_that_goes_away_ends_the_stream() {
        let (tx, rx) = futures_channel::mpsc::channel::<Bytes>(1);
        let response = HttpResponse::streaming(StatusCode::OK, "application/json", rx);
        let served = with_server(response, |mut client| async move {
            client
                .write_all(b"POST /v3/watch HTTP/1.1\r\n\r\n")
                .await
                .expect("request");
            let mut buffer = vec![0u8; 4096];
            let mut got = Vec::new();
            while !got.ends_with(b"\r\n\r\n") {
                let n = client.read(&mut buffer).await.expect("read");
                assert!(n > 0);
                got.extend_from_slice(&buffer[..n]);
            }
            // The producer is idle (nothing to write, so no write can fail): only the read
            // side can tell the server that the client left.
            drop(client);
        });
        served.expect("served");
        // The server dropped the body stream, so its producer sees a closed channel.
        assert!(tx.is_closed());
    }

    #[test]
    fn chunks_are_framed_with_hex_lengths() {
        assert_eq!(write_chunk(b"a"), b"1\r\na\r\n");
        assert_eq!(&write_chunk(&[b'x'; 26])[..4], b"1a\r\n");
        assert_eq!(LAST_CHUNK, b"0\r\n\r\n");
    }
}
