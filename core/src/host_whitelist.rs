//! etcd's `--host-whitelist`: a defence against DNS rebinding (CVE-2018-5702); and its
//! `--cors` origins (`CorsOrigins`), the other half of etcd's `accessController`.
//!
//! A browser tricked into sending requests to a plaintext etcd sends the attacker's host name
//! in `Host`. etcd 3.4 (embed/serve.go `accessController`) answers such HTTP requests on
//! plaintext client listeners with 421 and a fixed text when the host is not listed; gRPC
//! (HTTP/2, which browsers cannot speak to a plaintext port) and TLS connections are not
//! checked, nor is the metrics listener. We wrap the handler of exactly those connections.

use std::collections::BTreeSet;
use std::future::Future;
use std::rc::Rc;

use http::StatusCode;
use keel_grpc::{Call, Handler, HttpRequest, HttpResponse, ResponseSink, Status};

/// The hosts `--host-whitelist` allows. Empty, or containing `*`, allows every host (etcd's
/// default is `*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostWhitelist {
    hosts: BTreeSet<String>,
}

impl HostWhitelist {
    /// From the flag's comma-separated text, as etcd's `UniqueStringsValue` reads it.
    pub fn parse(text: &str) -> HostWhitelist {
        HostWhitelist {
            hosts: unique_strings(text),
        }
    }

    /// Whether the list restricts anything: only then are connections wrapped.
    pub fn restricts(&self) -> bool {
        !self.hosts.is_empty() && !self.hosts.contains("*")
    }

    /// etcd's `IsHostWhitelisted` of `GetHostname(req)`: the Host header without its port.
    pub fn allows(&self, host_header: &str) -> bool {
        !self.restricts() || self.hosts.contains(host_name(host_header))
    }
}

/// A comma-separated flag's items, trimmed, without empty ones or repeats.
fn unique_strings(text: &str) -> BTreeSet<String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(String::from)
        .collect()
}

/// Go's `net.SplitHostPort(host)`'s host, or the whole header when it has no port (as
/// etcd's `GetHostname` falls back).
fn host_name(header: &str) -> &str {
    if let Some(rest) = header.strip_prefix('[') {
        // "[::1]:2379" → "::1"; "[::1]" alone is not a host:port, so it stays whole.
        return match rest.split_once("]:") {
            Some((h, _)) => h,
            None => header,
        };
    }
    match header.rsplit_once(':') {
        // More than one colon without brackets is not a host:port for Go either.
        Some((h, _)) if !h.contains(':') => h,
        _ => header,
    }
}

/// etcd's `errCVE20185702(host)`, word for word.
fn refusal_text(host: &str) -> String {
    format!(
        "\netcd received your request, but the Host header was unrecognized.\n\n\
         To fix this, choose one of the following options:\n\
         - Enable TLS, then any HTTPS request will be allowed.\n\
         - Add the hostname you want to use to the whitelist in settings.\n  \
         - e.g. etcd --host-whitelist {host:?}\n\n\
         This requirement has been added to help prevent \"DNS Rebinding\" attacks (CVE-2018-5702).\n\n"
    )
}

/// etcd's `--cors`: the origins whose pages may read the client port's HTTP answers (etcd's
/// `AccessController.CORS`). `*` lets every origin; an empty list none. etcd's default is `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsOrigins {
    origins: BTreeSet<String>,
}

impl Default for CorsOrigins {
    fn default() -> Self {
        CorsOrigins::parse("*")
    }
}

impl CorsOrigins {
    /// From the flag's comma-separated text.
    pub fn parse(text: &str) -> CorsOrigins {
        CorsOrigins {
            origins: unique_strings(text),
        }
    }

    /// The `Access-Control-Allow-Origin` etcd's `accessController` writes for a request with
    /// this `Origin`: `*` when every origin may read, the origin itself when it is listed,
    /// none otherwise.
    pub fn allow_origin<'a>(&self, origin: Option<&'a str>) -> Option<&'a str> {
        if self.origins.contains("*") {
            return Some("*");
        }
        origin.filter(|o| self.origins.contains(*o))
    }

    /// The CORS fields etcd adds to an answer (its `addCORSHeader`), for `allow_origin`;
    /// plus `Vary: Origin` when that is one listed origin (etcd leaves it out), so that a
    /// shared cache does not hand one origin's answer to another.
    pub fn fields(allow_origin: &str) -> Vec<(http::HeaderName, http::HeaderValue)> {
        let Ok(origin) = http::HeaderValue::from_str(allow_origin) else {
            return Vec::new();
        };
        let vary = (allow_origin != "*")
            .then(|| (http::header::VARY, http::HeaderValue::from_static("Origin")));
        let mut fields = vec![
            (
                http::header::ACCESS_CONTROL_ALLOW_METHODS,
                http::HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
            ),
            (http::header::ACCESS_CONTROL_ALLOW_ORIGIN, origin),
            (
                http::header::ACCESS_CONTROL_ALLOW_HEADERS,
                http::HeaderValue::from_static("accept, content-type, authorization"),
            ),
        ];
        fields.extend(vary);
        fields
    }
}

/// A plaintext client connection's handler with the Host check in front of HTTP requests.
pub struct HostChecked<H> {
    pub inner: Rc<H>,
    pub whitelist: Rc<HostWhitelist>,
}

impl<H: Handler> Handler for HostChecked<H> {
    fn grpc<'a>(
        self: Rc<Self>,
        call: Call,
        sink: &'a mut ResponseSink,
    ) -> impl Future<Output = Status> + 'a {
        self.inner.clone().grpc(call, sink)
    }

    async fn http(self: Rc<Self>, request: HttpRequest) -> HttpResponse {
        // HTTP/1.1 requires Host; an HTTP/1.0 request without one has the empty host.
        let host = request
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !self.whitelist.allows(&host) {
            let name = host_name(&host).to_string();
            tracing::warn!(
                host = %name,
                "rejecting HTTP request to prevent DNS rebinding attacks"
            );
            // Go's http.Error: text/plain, the text and a newline.
            return HttpResponse::new(
                StatusCode::MISDIRECTED_REQUEST,
                "text/plain; charset=utf-8",
                refusal_text(&name),
            );
        }
        self.inner.clone().http(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_lets_every_origin_listed_ones_or_none_as_etcd() {
        let every = CorsOrigins::default();
        assert_eq!(every.allow_origin(Some("http://a.example")), Some("*"));
        assert_eq!(every.allow_origin(None), Some("*"));
        let listed = CorsOrigins::parse("http://a.example, http://b.example");
        assert_eq!(
            listed.allow_origin(Some("http://b.example")),
            Some("http://b.example")
        );
        assert_eq!(listed.allow_origin(Some("http://evil.example")), None);
        assert_eq!(listed.allow_origin(None), None);
        assert_eq!(CorsOrigins::parse("").allow_origin(Some("x")), None);
        let fields = CorsOrigins::fields("*");
        assert_eq!(fields.len(), 3);
        assert_eq!(fields[1].1, "*");
        let one = CorsOrigins::fields("http://a.example:8080");
        assert_eq!(one[1].1, "http://a.example:8080");
        assert_eq!(
            one.last().map(|f| (&f.0, f.1.to_str().unwrap())),
            Some((&http::header::VARY, "Origin"))
        );
    }

    #[test]
    fn hosts_are_matched_without_their_port_as_etcd_matches_them() {
        let w = HostWhitelist::parse("localhost, example.com,::1");
        assert!(w.restricts());
        assert!(w.allows("localhost:2379"));
        assert!(w.allows("example.com"));
        assert!(w.allows("[::1]:2379"));
        assert!(!w.allows("127.0.0.1:2379"));
        assert!(!w.allows("evil.example:2379"));
        assert!(!w.allows(""));
        for open in ["*", "", "a.example,*"] {
            let w = HostWhitelist::parse(open);
            assert!(!w.restricts() && w.allows("anything:1"), "{open:?}");
        }
    }

    #[test]
    fn the_refusal_is_etcds_text() {
        let text = refusal_text("evil.example");
        assert!(text
            .starts_with("\netcd received your request, but the Host header was unrecognized.\n"));
        assert!(text.contains("  - e.g. etcd --host-whitelist \"evil.example\"\n"));
        assert!(text.ends_with("(CVE-2018-5702).\n\n"));
    }
}
