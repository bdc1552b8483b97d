//! The crate's one operating-error enum: why a connection ended abnormally.

/// Why `serve_connection` returned early. Every variant ends only that connection.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// Reading or writing the socket failed.
    #[error("connection i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The HTTP/2 layer failed: a bad preface, a protocol error, a GOAWAY we sent.
    #[error("http/2: {0}")]
    H2(#[from] h2::Error),
    /// The client sent nothing within `ServerConfig::preface_timeout`.
    #[error("no preface within the preface timeout")]
    PrefaceTimeout,
    /// An HTTP/1.1 client sent nothing for the preface timeout, mid-request or between
    /// keep-alive requests.
    #[error("no HTTP/1.1 bytes within the read timeout")]
    ReadTimeout,
}
