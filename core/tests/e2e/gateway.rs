//! The JSON gateway (`POST /v3/...`), differential against etcd 3.4's grpc-gateway: the same
//! requests to a fresh Keel and a fresh etcd must get the same HTTP status and the same JSON,
//! apart from the member and cluster ids. The streaming calls (`/v3/watch`,
//! `/v3/lease/keepalive`) are compared line by line, read as they arrive.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{http_request, Server};

/// What each call compares: the whole body, or only the HTTP status and the error code (for
/// answers whose text comes from a JSON parser, which differ between Go and Rust).
#[derive(Clone, Copy)]
enum Compare {
    Body,
    StatusAndCode,
}

const CALLS: &[(&str, &str, &str, Compare)] = &[
    (
        "POST",
        "/v3/kv/put",
        r#"{"key":"Zm9v","value":"YmFy"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/put",
        r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
        Compare::Body,
    ),
    ("POST", "/v3/kv/range", r#"{"key":"Zm9v"}"#, Compare::Body),
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"AA==","range_end":"AA==","keys_only":true}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"Zm9v","rangeEnd":"Zm9w","countOnly":true}"#,
        Compare::Body,
    ),
    ("POST", "/v3/kv/range", "{}", Compare::Body),
    ("POST", "/v3/kv/range", "", Compare::Body),
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"Zm9v","unknown_field":1}"#,
        Compare::Body,
    ),
    ("POST", "/v3/kv/range", "{bad", Compare::StatusAndCode),
    ("GET", "/v3/kv/range", "", Compare::Body),
    (
        "POST",
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","target":"VALUE","value":"YmF6"}],"success":[{"request_put":{"key":"YQ==","value":"Yg=="}}],"failure":[{"request_range":{"key":"Zm9v"}}]}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":"NOT_EQUAL","target":"MOD","mod_revision":"3"}],"success":[],"failure":[{"request_range":{"key":"Zm9v"}}]}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/lease/grant",
        r#"{"TTL":"60","ID":"7"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/lease/grant",
        r#"{"TTL":"60","ID":"7"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/put",
        r#"{"key":"bGVhc2Vk","value":"dg==","lease":"7"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/put",
        r#"{"key":"eA==","value":"dg==","lease":"8"}"#,
        Compare::Body,
    ),
    ("POST", "/v3/lease/leases", "{}", Compare::Body),
    (
        "POST",
        "/v3/kv/lease/revoke",
        r#"{"ID":"99"}"#,
        Compare::Body,
    ),
    ("POST", "/v3/lease/revoke", r#"{"ID":"7"}"#, Compare::Body),
    (
        "POST",
        "/v3/kv/deleterange",
        r#"{"key":"Zm9v","prev_kv":true}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/deleterange",
        r#"{"key":"bm9uZQ=="}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/compaction",
        r#"{"revision":"100"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/compaction",
        r#"{"revision":"3"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"Zm9v","revision":"2"}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/maintenance/alarm",
        r#"{"action":"GET"}"#,
        Compare::Body,
    ),
    ("POST", "/v3/maintenance/defragment", "{}", Compare::Body),
    ("POST", "/v3/nope", "{}", Compare::StatusAndCode),
];

/// The answer with what legitimately differs between two servers removed: ids, raft terms.
fn normalize(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for id in ["cluster_id", "member_id", "raft_term"] {
                    map.remove(id);
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

fn transcript(server: &Server) -> Vec<(u16, Value)> {
    let addr = server.endpoint();
    CALLS
        .iter()
        .map(|(method, path, body, compare)| {
            let (status, text) = http_request(&addr, method, path, body);
            let json = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text.clone()));
            let json = match compare {
                Compare::Body => normalize(json),
                Compare::StatusAndCode => json.get("code").cloned().unwrap_or(Value::Null),
            };
            (status, json)
        })
        .collect()
}

#[test]
fn the_json_gateway_answers_as_etcds() {
    let keel = Server::keel(&[]);
    let etcd = Server::etcd(&[]);
    let (ours, theirs) = (transcript(&keel), transcript(&etcd));
    // The transcript is not trivially equal: writes land and reads see them.
    assert_eq!(ours[2].0, 200);
    assert_eq!(ours[2].1["kvs"][0]["value"], "YmF6");
    assert_eq!(ours[2].1["kvs"][0]["version"], "2");
    assert_eq!(ours[5].0, 400);
    assert_eq!(ours[9].0, 405);
    for (i, ((call, ours), theirs)) in CALLS.iter().zip(&ours).zip(&theirs).enumerate() {
        assert_eq!(
            ours, theirs,
            "call {i} {} {} {}: keel (left) and etcd (right) differ",
            call.0, call.1, call.2
        );
    }
}

/// A streamed gateway answer read as it arrives: the chunked body's JSON lines, one at a time.
struct LineStream {
    reader: BufReader<TcpStream>,
    /// Dechunked bytes not yet split into lines.
    pending: Vec<u8>,
}

impl LineStream {
    /// Sends `body` to `path` and reads the answer's head, which must be a chunked 200.
    fn open(addr: &str, path: &str, body: &str) -> LineStream {
        let mut socket = TcpStream::connect(addr).expect("the server accepts TCP");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set a read timeout");
        write!(
            socket,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("the request is sent");
        let mut reader = BufReader::new(socket);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("the head arrives");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line.to_ascii_lowercase());
        }
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        LineStream {
            reader,
            pending: Vec::new(),
        }
    }

    /// The next JSON line, or None when the body ended.
    fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).expect("each line is JSON"));
            }
            let mut size = String::new();
            self.reader.read_line(&mut size).expect("a chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
            let mut data = vec![0u8; size + 2];
            self.reader.read_exact(&mut data).expect("the chunk");
            if size == 0 {
                assert!(self.pending.is_empty(), "a partial last line");
                return None;
            }
            self.pending.extend_from_slice(&data[..size]);
        }
    }
}

/// What a streamed line's comparison ignores: ids and terms, and the lease's id.
fn normalize_line(line: Value) -> Value {
    let mut line = normalize(line);
    if let Some(result) = line.get_mut("result").and_then(Value::as_object_mut) {
        result.remove("ID");
    }
    line
}

/// A watch on foo (its creation line and the event of a put), a keep-alive of a fresh lease
/// and of an unknown one, as lines.
fn streaming_transcript(server: &Server) -> Vec<Value> {
    let addr = server.endpoint();
    let mut lines = Vec::new();
    let mut watch = LineStream::open(&addr, "/v3/watch", r#"{"create_request":{"key":"Zm9v"}}"#);
    lines.push(watch.next().expect("the created line"));
    server.etcdctl(&["put", "foo", "bar"]).ok();
    lines.push(watch.next().expect("the put's event"));
    let (status, granted) = http_request(&addr, "POST", "/v3/lease/grant", r#"{"TTL":"60"}"#);
    assert_eq!(status, 200, "{granted}");
    let granted: Value = serde_json::from_str(&granted).expect("JSON");
    let id = granted["ID"].as_str().expect("a lease id").to_string();
    let keepalive = format!(r#"{{"ID":"{id}"}}"#);
    for body in [keepalive.as_str(), r#"{"ID":"123"}"#] {
        let mut stream = LineStream::open(&addr, "/v3/lease/keepalive", body);
        let mut answered = 0;
        while let Some(line) = stream.next() {
            if line["result"]["ID"].as_str() == Some(&id) {
                assert_eq!(line["result"]["TTL"], "60");
            }
            lines.push(line);
            answered += 1;
        }
        // One request, one answer, then the stream ends (etcd's gateway half-closes it).
        assert_eq!(answered, 1, "{body}");
    }
    lines.into_iter().map(normalize_line).collect()
}

#[test]
fn the_json_gateway_streams_watch_and_keepalive_as_etcds() {
    let keel = Server::keel(&[]);
    let etcd = Server::etcd(&[]);
    let (ours, theirs) = (streaming_transcript(&keel), streaming_transcript(&etcd));
    assert_eq!(ours[0]["result"]["created"], true, "{ours:?}");
    assert_eq!(
        ours[1]["result"]["events"][0]["kv"]["value"], "YmFy",
        "{ours:?}"
    );
    assert_eq!(ours, theirs, "keel (left) and etcd (right) differ");
}

/// The `keel_watchers` gauge from /metrics.
fn watchers(server: &Server) -> u64 {
    let (status, text) = http_request(&server.endpoint(), "GET", "/metrics", "");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix("keel_watchers "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the keel_watchers gauge")
}

#[test]
fn a_gateway_watch_ends_when_its_client_hangs_up() {
    let keel = Server::keel(&[]);
    let mut watch = LineStream::open(
        &keel.endpoint(),
        "/v3/watch",
        r#"{"create_request":{"key":"Zm9v"}}"#,
    );
    assert_eq!(watch.next().expect("created")["result"]["created"], true);
    assert_eq!(watchers(&keel), 1);
    // A quiet watch: nothing is written to it, so only the closed socket can end it.
    drop(watch);
    let deadline = Instant::now() + Duration::from_secs(10);
    while watchers(&keel) != 0 {
        assert!(Instant::now() < deadline, "the watcher outlived its client");
        std::thread::sleep(Duration::from_millis(50));
    }
}
