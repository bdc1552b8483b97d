//! A minimal HTTP/1.1 server for the plain endpoints that share the gRPC port (`/health`,
//! `/version`, `/metrics`, the JSON gateway): a sans-I/O request parser, a response writer, and
//! the connection loop. Keep-alive and `Content-Length` bodies only; no chunked encoding.

use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::{select, Either};
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

/// The answer to one request: the writer adds Content-Length and Connection.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Bytes,
}

impl HttpResponse {
    pub fn new(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Self {
        HttpResponse {
            status,
            content_type,
            body: body.into(),
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

/// Serializes a response (one allocation).
pub fn write_response(response: &HttpResponse, keep_alive: KeepAlive) -> Vec<u8> {
    let reason = response.status.canonical_reason().unwrap_or("Unknown");
    let connection = match keep_alive {
        KeepAlive::Yes => "keep-alive",
        KeepAlive::No => "close",
    };
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        response.status.as_u16(),
        reason,
        response.content_type,
        response.body.len(),
        connection
    );
    let mut out = Vec::with_capacity(head.len() + response.body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&response.body);
    out
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
            buffer.reserve(head.content_length_bytes - buffer.len());
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
        let response = handle(request).await;
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
}
