//! The JSON gateway (`POST /v3/...`), differential against etcd 3.4's grpc-gateway: the same
//! requests to a fresh Keel and a fresh etcd must get the same HTTP status and the same JSON,
//! apart from the member and cluster ids. The streaming calls (`/v3/watch`,
//! `/v3/lease/keepalive`) are compared line by line, read as they arrive. One test makes the
//! calls with the real `curl`, as operators do, a watch included (`curl -N`).

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
    // Read as Go's JSON decoder reads a body: nulls are fields left out, only the first value
    // counts, a repeated field keeps its last value.
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"Zm9v","keys_only":null,"limit":null}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"Zm9v"} xyz"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/kv/range",
        r#"{"key":"YQ==","key":"Zm9v"}"#,
        Compare::Body,
    ),
    ("POST", "/v3/kv/range", "null", Compare::Body),
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
    // The server-streaming calls decode their one request before they start: a bad one is a
    // plain 400, not a stream.
    (
        "POST",
        "/v3/election/observe",
        "{bad",
        Compare::StatusAndCode,
    ),
    (
        "POST",
        "/v3/maintenance/snapshot",
        r#"{"bad"#,
        Compare::StatusAndCode,
    ),
    ("POST", "/v3/nope", "{}", Compare::StatusAndCode),
    // A member without peer URLs is refused: added, it would be a voter no one can reach,
    // and this one-member cluster would lose its quorum for good.
    (
        "POST",
        "/v3/cluster/member/add",
        r#"{"peerURLs":[]}"#,
        Compare::Body,
    ),
    ("POST", "/v3/cluster/member/add", "{}", Compare::Body),
    // An op with no request in it refuses the txn, at any depth (etcd's checkRequestOp).
    ("POST", "/v3/kv/txn", r#"{"success":[{}]}"#, Compare::Body),
    (
        "POST",
        "/v3/kv/txn",
        r#"{"success":[{"request_txn":{"failure":[{}]}}]}"#,
        Compare::Body,
    ),
    (
        "POST",
        "/v3/cluster/member/add",
        r#"{"peerURLs":["not a url"],"isLearner":true}"#,
        Compare::Body,
    ),
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
    assert_eq!(ours[13].0, 405);
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
    /// The last chunk came.
    ended: bool,
}

impl LineStream {
    /// Sends `body` to `path` and reads the answer's head, which must be a chunked 200.
    fn open(addr: &str, path: &str, body: &str) -> LineStream {
        let (status, stream) = LineStream::open_as(addr, path, body, None);
        assert_eq!(status, 200);
        stream
    }

    /// Sends `body` to `path` with an optional `Authorization` token; the answer's status and
    /// its lines. The answer must be chunked, whatever its status.
    fn open_as(addr: &str, path: &str, body: &str, token: Option<&str>) -> (u16, LineStream) {
        let mut socket = TcpStream::connect(addr).expect("the server accepts TCP");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set a read timeout");
        let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
        write!(
            socket,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
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
        assert!(head.starts_with("http/1.1 "), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        let status = head[9..12].parse().expect("a status code");
        let stream = LineStream {
            reader,
            pending: Vec::new(),
            ended: false,
        };
        (status, stream)
    }

    /// Every line left, until the body ends.
    fn rest(&mut self) -> Vec<Value> {
        std::iter::from_fn(|| self.next()).collect()
    }

    /// The next JSON line (the last may lack its newline), or None when the body ended.
    fn next(&mut self) -> Option<Value> {
        loop {
            if self.ended {
                return None;
            }
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
                self.ended = true;
                // grpc-gateway writes a stream's error object without the newline.
                if self.pending.is_empty() {
                    return None;
                }
                let line = std::mem::take(&mut self.pending);
                return Some(serde_json::from_slice(&line).expect("the last line is JSON"));
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

/// A gateway snapshot's lines checked against each other: every line but the last carries a
/// chunk of the database with `remaining_bytes` counting down to what is left after it
/// (omitted once 0, as proto3 JSON omits zeros), and the last carries the SHA-256 of the
/// chunks. Returns each line's fields (the header, which etcd 3.4 does not send, aside) and
/// the database.
fn check_snapshot(lines: &[Value]) -> (Vec<Vec<String>>, Vec<u8>) {
    use base64::Engine;
    use sha2::Digest;
    assert!(lines.len() >= 2, "a chunk and the checksum: {lines:?}");
    let blob = |line: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(line["result"]["blob"].as_str().expect("a base64 blob"))
            .expect("the blob is base64")
    };
    let mut db = Vec::new();
    let chunks: Vec<Vec<u8>> = lines[..lines.len() - 1].iter().map(blob).collect();
    let total: usize = chunks.iter().map(Vec::len).sum();
    for (line, chunk) in lines.iter().zip(&chunks) {
        assert!(!chunk.is_empty(), "an empty chunk: {line}");
        db.extend_from_slice(chunk);
        let remaining = line["result"]["remaining_bytes"].as_str().map_or(0, |r| {
            r.parse::<usize>().expect("remaining_bytes is a number")
        });
        assert_eq!(remaining, total - db.len(), "{line}");
    }
    let last = lines.last().expect("a last line");
    assert_eq!(last["result"].get("remaining_bytes"), None, "{last}");
    assert_eq!(blob(last), sha2::Sha256::digest(&db).to_vec());
    let fields = lines
        .iter()
        .map(|line| {
            let result = line["result"].as_object().expect("a result line");
            result.keys().filter(|k| *k != "header").cloned().collect()
        })
        .collect();
    (fields, db)
}

/// `etcdctl snapshot status` of a database the gateway streamed: its revision and key count.
fn snapshot_status(db: &[u8]) -> (i64, i64) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("gateway.db");
    std::fs::write(&path, db).expect("the database is written");
    let out = crate::common::etcdctl_at(
        "127.0.0.1:1",
        &[
            "snapshot",
            "status",
            path.to_str().expect("a UTF-8 path"),
            "-w",
            "json",
        ],
        None,
    )
    .ok();
    let status = out.json();
    (
        status["revision"].as_i64().expect("a revision"),
        status["totalKey"].as_i64().expect("a key count"),
    )
}

#[test]
fn the_json_gateway_streams_a_snapshot_as_etcds() {
    let mut small = Vec::new();
    let mut large = Vec::new();
    for server in [Server::keel(&[]), Server::etcd(&[])] {
        let addr = server.endpoint();
        let (status, _) = http_request(
            &addr,
            "POST",
            "/v3/kv/put",
            r#"{"key":"YQ==","value":"Yg=="}"#,
        );
        assert_eq!(status, 200);
        // A small store: one chunk on both servers (etcd's are 32 KiB, Keel's 1 MiB).
        let lines = LineStream::open(&addr, "/v3/maintenance/snapshot", "{}").rest();
        let (fields, db) = check_snapshot(&lines);
        let (revision, _) = snapshot_status(&db);
        assert_eq!(revision, 2, "the database holds the put");
        small.push(fields);
        // Past a megabyte: several chunks on both, each line bounded by a chunk.
        let value = "eHh4".repeat(100_000);
        for key in ["azE=", "azI=", "azM=", "azQ="] {
            let body = format!(r#"{{"key":"{key}","value":"{value}"}}"#);
            let (status, text) = http_request(&addr, "POST", "/v3/kv/put", &body);
            assert_eq!(status, 200, "{text}");
        }
        let lines = LineStream::open(&addr, "/v3/maintenance/snapshot", "").rest();
        let (fields, db) = check_snapshot(&lines);
        assert!(db.len() > 1_200_000, "{} bytes", db.len());
        assert!(fields.len() > 2, "{fields:?}");
        large.push((
            fields[0].clone(),
            fields.last().cloned(),
            snapshot_status(&db).0,
        ));
    }
    assert_eq!(small[0], vec![vec!["blob".to_string()]; 2], "{small:?}");
    assert_eq!(small[0], small[1], "keel (left) and etcd (right) differ");
    assert_eq!(large[0], large[1], "keel (left) and etcd (right) differ");
    assert_eq!(large[0].2, 6);
}

/// An election observed through the gateway: its leader, a proclaimed value, and the next
/// leader after a resignation, as lines. The leases have fixed ids so the keys match.
fn observe_transcript(server: &Server) -> Vec<Value> {
    let addr = server.endpoint();
    let call = |path: &str, body: &str| {
        let (status, text) = http_request(&addr, "POST", path, body);
        assert_eq!(status, 200, "{path} {body}: {text}");
        serde_json::from_str::<Value>(&text).expect("JSON")
    };
    call("/v3/lease/grant", r#"{"TTL":"60","ID":"77"}"#);
    call("/v3/lease/grant", r#"{"TTL":"60","ID":"78"}"#);
    let first = call(
        "/v3/election/campaign",
        r#"{"name":"ZWw=","lease":"77","value":"djE="}"#,
    );
    let mut observe = LineStream::open(&addr, "/v3/election/observe", r#"{"name":"ZWw="}"#);
    let mut lines = vec![observe.next().expect("the leader")];
    let leader = first["leader"].to_string();
    call(
        "/v3/election/proclaim",
        &format!(r#"{{"leader":{leader},"value":"djI="}}"#),
    );
    lines.push(observe.next().expect("the proclaimed value"));
    call("/v3/election/resign", &format!(r#"{{"leader":{leader}}}"#));
    call(
        "/v3/election/campaign",
        r#"{"name":"ZWw=","lease":"78","value":"djM="}"#,
    );
    lines.push(observe.next().expect("the next leader"));
    lines.into_iter().map(normalize).collect()
}

#[test]
fn the_json_gateway_streams_an_election_observe_as_etcds() {
    let (ours, theirs) = (
        observe_transcript(&Server::keel(&[])),
        observe_transcript(&Server::etcd(&[])),
    );
    let values: Vec<&Value> = ours.iter().map(|l| &l["result"]["kv"]["value"]).collect();
    assert_eq!(values, ["djE=", "djI=", "djM="], "{ours:?}");
    assert_eq!(ours, theirs, "keel (left) and etcd (right) differ");
}

/// What a streamed answer sends within `wait`: the bytes, and whether it ended (the socket
/// closed, or the chunked body's last chunk came) rather than stayed open.
fn first_bytes(addr: &str, path: &str, body: &str, wait: Duration) -> (String, bool) {
    let mut socket = TcpStream::connect(addr).expect("the server accepts TCP");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("set a read timeout");
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("the request is sent");
    let deadline = Instant::now() + wait;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match socket.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&raw).into_owned(), true),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (String::from_utf8_lossy(&raw).into_owned(), true),
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let ended = text.ends_with("\r\n0\r\n\r\n") || text.contains("\r\n\r\n0\r\n\r\n");
    (text, ended)
}

#[test]
fn a_gateway_watch_with_an_empty_body_stays_open_as_etcds() {
    for server in [Server::keel(&[]), Server::etcd(&[])] {
        for body in ["", "{}"] {
            let (text, ended) = first_bytes(
                &server.endpoint(),
                "/v3/watch",
                body,
                Duration::from_secs(2),
            );
            assert!(
                !ended,
                "{:?} body {body:?}: the stream ended: {text:?}",
                server.kind
            );
            // No line either: there is nothing to watch. (etcd's gateway has not even sent
            // the head yet; Keel has.)
            assert!(!text.contains("result"), "{:?}: {text:?}", server.kind);
        }
    }
}

/// Turns auth on with root and a user alice who may `permission` (read, write or readwrite)
/// the prefix `pre/`; alice's token, from the gateway's Authenticate.
fn alice_with_prefix(server: &Server, permission: &str) -> String {
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "pre"],
        &[
            "role",
            "grant-permission",
            "pre",
            "--prefix",
            permission,
            "pre/",
        ],
        &["user", "grant-role", "alice", "pre"],
        &["auth", "enable"],
    ] {
        server.etcdctl(args).ok();
    }
    let (status, text) = http_request(
        &server.endpoint(),
        "POST",
        "/v3/auth/authenticate",
        r#"{"name":"alice","password":"alicepw"}"#,
    );
    assert_eq!(status, 200, "{text}");
    let login: Value = serde_json::from_str(&text).expect("JSON");
    login["token"].as_str().expect("a token").to_string()
}

/// Streaming calls under auth: a watch on a range the user may not read, without a token and
/// with a bad one (each a created-and-canceled line; the stream stays open, so only that line
/// is read), a snapshot by a non-root user (its raw auth error as the HTTP status and an error
/// line), an observe the user may not read (an empty stream), and a permitted watch.
fn refused_transcript(server: &Server) -> Vec<(u16, Vec<Value>)> {
    let alice = alice_with_prefix(server, "readwrite");
    let addr = server.endpoint();
    let secret_watch = r#"{"create_request":{"key":"c2VjcmV0"}}"#;
    let mut answers = Vec::new();
    for (path, body, token, whole) in [
        ("/v3/watch", secret_watch, Some(alice.as_str()), false),
        ("/v3/watch", secret_watch, None, false),
        ("/v3/watch", secret_watch, Some("bogus"), false),
        (
            "/v3/watch",
            r#"{"create_request":{"key":"cHJlL2E="}}"#,
            Some(alice.as_str()),
            false,
        ),
        ("/v3/maintenance/snapshot", "{}", Some(alice.as_str()), true),
        ("/v3/maintenance/snapshot", "{}", None, true),
        ("/v3/maintenance/snapshot", "{}", Some("bogus"), true),
        (
            "/v3/election/observe",
            r#"{"name":"c2VjcmV0"}"#,
            Some(alice.as_str()),
            true,
        ),
        (
            "/v3/election/observe",
            r#"{"name":"cHJl"}"#,
            Some("bogus"),
            true,
        ),
    ] {
        let (status, mut stream) = LineStream::open_as(&addr, path, body, token);
        let lines = if whole {
            stream.rest()
        } else {
            vec![stream.next().expect("a first line")]
        };
        answers.push((status, lines.into_iter().map(normalize).collect()));
    }
    answers
}

#[test]
fn gateway_streams_refused_by_auth_answer_as_etcds() {
    let ours = refused_transcript(&Server::keel(&[]));
    let theirs = refused_transcript(&Server::etcd(&[]));
    assert_eq!(
        ours[0].1[0]["result"]["cancel_reason"],
        "rpc error: code = PermissionDenied desc = etcdserver: permission denied",
        "{ours:?}"
    );
    assert_eq!(ours[3].1[0]["result"]["created"], true, "{ours:?}");
    assert_eq!(ours[4].0, 500, "{ours:?}");
    assert_eq!(ours[7], (200, vec![]), "{ours:?}");
    for (i, (ours, theirs)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(
            ours, theirs,
            "answer {i}: keel (left) and etcd (right) differ"
        );
    }
}

/// A gateway POST over plaintext HTTP/2 (h2c, prior knowledge): the status curl saw (0 for a
/// stream reset without an answer).
fn h2c_post(server: &Server, path: &str, body: &str) -> u32 {
    crate::common::require_tool("curl");
    let out = std::process::Command::new("curl")
        .args(["-s", "--http2-prior-knowledge", "--max-time", "10"])
        .args([
            "-X",
            "POST",
            "-d",
            body,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("http://{}{path}", server.endpoint()))
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn gateway_posts_over_plaintext_http2_are_not_served_as_etcd_serves_none() {
    // etcd 3.4's connection multiplexer gives every h2c connection to grpc-go, which resets a
    // non-gRPC stream (PROTOCOL_ERROR); Keel answers it as current grpc-go does, 415 (which
    // curl may miss: the answer ends the stream before curl's body is all sent, so h2 may
    // reset the rest). Over TLS both serve it (tls.rs).
    let keel = Server::keel(&[]);
    let etcd = Server::etcd(&[]);
    for _ in 0..3 {
        let ours = h2c_post(&keel, "/v3/kv/range", r#"{"key":"YQ=="}"#);
        assert!(ours == 415 || ours == 0, "keel answered {ours}");
        assert_eq!(h2c_post(&etcd, "/v3/kv/range", r#"{"key":"YQ=="}"#), 0);
    }
}

/// One request made with the real `curl`, as an operator types it: (status, body).
fn curl(addr: &str, method: &str, path: &str, body: &str, extra: &[&str]) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-X", method, "-d", body, "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').expect("curl printed the status");
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// The same calls made with curl, and a watch streamed with `curl -N` while another curl
/// writes, give the same answers from Keel as from etcd 3.4.
#[test]
fn curl_gets_the_same_json_from_keel_as_from_etcd() {
    crate::common::require_tool("curl");
    let mut transcripts = Vec::new();
    for server in [Server::keel(&[]), Server::etcd(&[])] {
        let addr = server.endpoint();
        let mut answers: Vec<(u16, Value)> = CALLS
            .iter()
            .map(|(method, path, body, compare)| {
                let (status, text) = curl(&addr, method, path, body, &[]);
                let json = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
                let json = match compare {
                    Compare::Body => normalize(json),
                    Compare::StatusAndCode => json.get("code").cloned().unwrap_or(Value::Null),
                };
                (status, json)
            })
            .collect();
        // etcd 3.4 still answers 3.3's /v3beta/ prefix; /v3alpha/ is gone.
        for path in ["/v3beta/kv/range", "/v3alpha/kv/range"] {
            let (status, text) = curl(&addr, "POST", path, r#"{"key":"Zm9v"}"#, &[]);
            let json = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
            answers.push((status, normalize(json)));
        }
        // A watch streamed by curl -N for two seconds, with a put made meanwhile.
        let watch = std::process::Command::new("curl")
            .args(["-s", "-N", "--max-time", "2", "-X", "POST", "-d"])
            .arg(r#"{"create_request":{"key":"d2F0Y2hlZA=="}}"#)
            .arg(format!("http://{addr}/v3/watch"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("curl runs");
        std::thread::sleep(Duration::from_millis(700));
        let put = curl(
            &addr,
            "POST",
            "/v3/kv/put",
            r#"{"key":"d2F0Y2hlZA==","value":"c2Vlbg=="}"#,
            &[],
        );
        assert_eq!(put.0, 200, "{put:?}");
        let streamed = watch.wait_with_output().expect("curl ends");
        for line in String::from_utf8_lossy(&streamed.stdout).lines() {
            let v: Value = serde_json::from_str(line).expect("a JSON line");
            // The watch id is the server's choice.
            let mut v = normalize(v);
            if let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) {
                result.remove("watch_id");
            }
            answers.push((200, v));
        }
        transcripts.push(answers);
    }
    let (ours, theirs) = (&transcripts[0], &transcripts[1]);
    let beta = &ours[CALLS.len()];
    assert_eq!(beta.0, 200, "/v3beta/ is served: {beta:?}");
    assert!(beta.1["header"]["revision"].is_string(), "{beta:?}");
    assert!(
        ours.iter()
            .any(|(_, v)| v["result"]["events"][0]["kv"]["value"] == "c2Vlbg=="),
        "the watch streamed the put: {ours:?}"
    );
    assert_eq!(
        ours, theirs,
        "Keel (left) and etcd (right) differ under curl"
    );
}

/// Which headers carry a gateway call's token: etcd's grpc-gateway passes `Authorization`
/// on, and `Grpc-Metadata-<name>` as the metadata `<name>` (so `Grpc-Metadata-Token` and
/// `Grpc-Metadata-Authorization` work too), but a plain `token` header is no metadata there.
/// Each header, on a read only the token's user (or root) may make: the same answers from
/// Keel and etcd.
#[test]
fn gateway_tokens_come_from_the_headers_etcd_reads() {
    crate::common::require_tool("curl");
    let mut transcripts = Vec::new();
    for server in [Server::keel(&[]), Server::etcd(&[])] {
        let token = alice_with_prefix(&server, "read");
        let addr = server.endpoint();
        let answers: Vec<(String, u16, Value)> = [
            ("Authorization", token.as_str()),
            ("Grpc-Metadata-Token", &token),
            ("Grpc-Metadata-Authorization", &token),
            ("token", &token),
            // Keel's own field for a verified client certificate's user: no client may set
            // it, through the gateway's metadata prefix or otherwise.
            ("Grpc-Metadata-Keel-Internal-Client-Cert-Cn", "root"),
            ("Keel-Internal-Client-Cert-Cn", "root"),
        ]
        .iter()
        .map(|(header, value)| {
            let (status, text) = curl(
                &addr,
                "POST",
                "/v3/kv/range",
                r#"{"key":"cHJlL2E="}"#,
                &["-H", &format!("{header}: {value}")],
            );
            let json = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
            // The answer's code and message, or for a read that was let in, that it found
            // nothing (the key was never written).
            let summary = match json.get("code") {
                Some(code) => serde_json::json!([code, json["error"]]),
                None => json.get("count").cloned().unwrap_or(Value::Null),
            };
            (header.to_string(), status, summary)
        })
        .collect();
        transcripts.push(answers);
    }
    let (ours, theirs) = (&transcripts[0], &transcripts[1]);
    assert_eq!(ours[1].1, 200, "Grpc-Metadata-Token is let in: {ours:?}");
    assert_eq!(ours[3].1, 400, "a plain token header is not: {ours:?}");
    assert_eq!(ours[4].1, 400, "no one is root by saying so: {ours:?}");
    assert_eq!(ours[5].1, 400, "no one is root by saying so: {ours:?}");
    assert_eq!(ours, theirs, "keel (left) and etcd (right) differ");
}

/// etcd's CORS fields (its `accessController`, `--cors`, default `*`): every HTTP answer on
/// the client port names the origins that may read it, and a preflight (OPTIONS) is answered
/// 200 with those fields. With `--cors` listing an origin, only a request from it is named.
/// The status and the `access-control-*` fields, from Keel and from etcd.
#[test]
fn cors_fields_and_preflights_answer_as_etcds() {
    crate::common::require_tool("curl");
    let cors_fields = |addr: &str, method: &str, path: &str, origin: &str| -> (u16, Vec<String>) {
        let out = std::process::Command::new("curl")
            .args(["-s", "-i", "--max-time", "10", "-X", method])
            .args(["-H", &format!("Origin: {origin}")])
            .args(["-H", "Access-Control-Request-Method: POST"])
            .args(if method == "POST" {
                vec!["-d", r#"{"key":"Zm9v"}"#]
            } else {
                vec![]
            })
            .arg(format!("http://{addr}{path}"))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut fields: Vec<String> = text
            .lines()
            .map(|l| l.trim().to_ascii_lowercase())
            .filter(|l| l.starts_with("access-control-"))
            .collect();
        fields.sort();
        (status, fields)
    };
    let mut transcripts = Vec::new();
    for (keel, etcd) in [
        (Server::keel(&[]), Server::etcd(&[])),
        (
            Server::keel(&["--cors", "http://a.example:8080"]),
            Server::etcd(&["--cors", "http://a.example:8080"]),
        ),
    ] {
        for server in [keel, etcd] {
            let addr = server.endpoint();
            let answers: Vec<(u16, Vec<String>)> = [
                ("OPTIONS", "/v3/kv/range", "http://a.example:8080"),
                ("POST", "/v3/kv/range", "http://a.example:8080"),
                ("POST", "/v3/kv/range", "http://b.example:8080"),
                ("GET", "/health", "http://a.example:8080"),
            ]
            .iter()
            .map(|(method, path, origin)| cors_fields(&addr, method, path, origin))
            .collect();
            transcripts.push(answers);
        }
    }
    let default = &transcripts[0];
    assert_eq!(default[0].0, 200, "a preflight is answered: {default:?}");
    assert!(
        default[0]
            .1
            .contains(&"access-control-allow-origin: *".to_string()),
        "{default:?}"
    );
    let listed = &transcripts[2];
    assert!(
        listed[1]
            .1
            .contains(&"access-control-allow-origin: http://a.example:8080".to_string()),
        "{listed:?}"
    );
    assert!(
        listed[2].1.is_empty(),
        "another origin is not named: {listed:?}"
    );
    assert_eq!(
        transcripts[0], transcripts[1],
        "default --cors: keel (left), etcd (right)"
    );
    assert_eq!(
        transcripts[2], transcripts[3],
        "--cors listed: keel (left), etcd (right)"
    );
}

/// Oversized gateway writes get etcd's answers: a put over `--max-request-bytes` (1.5 MiB by
/// default) is "request is too large" (400, code 3); one whose message is over the gRPC
/// receive limit (2 MiB) is grpc-go's ResourceExhausted with both sizes (429, code 8). Keel
/// used to refuse both bodies as HTTP 413 before reading them.
#[test]
fn oversized_gateway_writes_are_refused_as_etcds() {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let calls: Vec<String> = [1_600_000usize, 2_500_000]
        .iter()
        .map(|size| {
            format!(
                r#"{{"key":"{}","value":"{}"}}"#,
                b64(b"big"),
                b64(&vec![b'v'; *size])
            )
        })
        .collect();
    let mut transcripts = Vec::new();
    for server in [Server::keel(&[]), Server::etcd(&[])] {
        let addr = server.endpoint();
        let answers: Vec<(u16, Value)> = calls
            .iter()
            .map(|body| {
                let (status, text) = http_request(&addr, "POST", "/v3/kv/put", body);
                let json = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
                (status, json)
            })
            .collect();
        transcripts.push(answers);
    }
    let ours = &transcripts[0];
    assert_eq!(ours[0].0, 400, "{:?}", ours[0]);
    assert_eq!(ours[0].1["error"], "etcdserver: request is too large");
    assert_eq!(ours[1].0, 429, "{:?}", ours[1]);
    assert!(
        ours[1].1["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("grpc: received message larger than max (")),
        "{:?}",
        ours[1]
    );
    assert_eq!(
        transcripts[0], transcripts[1],
        "keel (left) and etcd (right) differ"
    );
}
