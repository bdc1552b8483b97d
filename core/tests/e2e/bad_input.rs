//! Bad input on the client port: etcd's validation errors, size limits at both layers, garbage
//! bytes, truncated and malformed gRPC frames. Every case is checked against a real etcd 3.4 in
//! the same run, and after every case the server must still serve a put and a get.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};
use prost::Message;

use crate::common::{client, grpc_error, Kind, Server};

/// A small --max-request-bytes keeps the oversized requests quick to build and send.
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// etcd's gRPC receive limit is max-request-bytes plus this.
const GRPC_SLACK_BYTES: usize = 512 * 1024;

/// Starts keel and etcd (at once: etcd takes a second to elect itself) with `args`.
fn both(args: &'static [&'static str]) -> (Server, Server) {
    let etcd = std::thread::spawn(move || Server::start(Kind::Etcd, args));
    let keel = Server::keel(args);
    (keel, etcd.join().expect("etcd starts"))
}

/// The server still serves: a put and a get on a fresh connection.
async fn still_serves(server: &Server, tag: &str) {
    let mut c = client(server).await;
    c.put("alive", tag, None)
        .await
        .unwrap_or_else(|e| panic!("{:?} stopped serving after {tag}: {e}", server.kind));
    let r = c.get("alive", None).await.expect("get after bad input");
    assert_eq!(r.kvs()[0].value(), tag.as_bytes());
}

/// What a server answered to one bad request, for comparison across servers.
async fn validation_answers(server: &Server) -> Vec<(String, (String, String))> {
    let mut c = client(server).await;
    let mut answers = Vec::new();
    let put = c.put("", "v", None).await;
    answers.push(("put with an empty key".to_string(), grpc_error(put)));
    still_serves(server, "empty-key").await;
    let get = c.get("", None).await;
    answers.push(("get with an empty key".to_string(), grpc_error(get)));
    let del = c.delete("", None).await;
    answers.push(("delete with an empty key".to_string(), grpc_error(del)));

    let puts = |n: usize| {
        (0..n)
            .map(|i| TxnOp::put(format!("t/{i}"), "v", None))
            .collect::<Vec<_>>()
    };
    let r = c
        .txn(Txn::new().and_then(puts(128)))
        .await
        .expect("128 ops are allowed");
    assert!(r.succeeded());
    let too_many = c.txn(Txn::new().and_then(puts(129))).await;
    answers.push(("txn with 129 success ops".to_string(), grpc_error(too_many)));
    let compares: Vec<Compare> = (0..129)
        .map(|i| Compare::version(format!("t/{i}"), CompareOp::Equal, 1))
        .collect();
    let too_many = c.txn(Txn::new().when(compares)).await;
    answers.push(("txn with 129 compares".to_string(), grpc_error(too_many)));
    still_serves(server, "too-many-ops").await;

    let dup = c
        .txn(Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]))
        .await;
    answers.push(("txn putting one key twice".to_string(), grpc_error(dup)));
    let dup = c
        .txn(Txn::new().or_else([
            TxnOp::delete("d/", Some(DeleteOptions::new().with_prefix())),
            TxnOp::put("d/x", "1", None),
        ]))
        .await;
    answers.push((
        "txn putting inside a deleted range".to_string(),
        grpc_error(dup),
    ));
    let nested = Txn::new().and_then([TxnOp::put("n", "2", None)]);
    let dup = c
        .txn(Txn::new().and_then([TxnOp::put("n", "1", None), TxnOp::txn(nested)]))
        .await;
    answers.push((
        "txn putting one key twice through a nested txn".to_string(),
        grpc_error(dup),
    ));
    let fine = c
        .txn(
            Txn::new()
                .and_then([TxnOp::put("s", "1", None)])
                .or_else([TxnOp::put("s", "2", None)]),
        )
        .await;
    assert!(
        fine.is_ok(),
        "the same key in then and else is fine: {fine:?}"
    );
    still_serves(server, "duplicate-key").await;

    let ignore = c
        .put(
            "k",
            "v",
            Some(etcd_client::PutOptions::new().with_ignore_value()),
        )
        .await;
    answers.push((
        "put with ignore_value and a value".to_string(),
        grpc_error(ignore),
    ));
    let ignore = c
        .put(
            "k",
            "",
            Some(
                etcd_client::PutOptions::new()
                    .with_ignore_lease()
                    .with_lease(5),
            ),
        )
        .await;
    answers.push((
        "put with ignore_lease and a lease".to_string(),
        grpc_error(ignore),
    ));
    still_serves(server, "ignore-flags").await;
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_errors_match_etcd_and_the_server_keeps_serving() {
    let (keel, etcd) = both(&[]);
    let want = validation_answers(&etcd).await;
    let got = validation_answers(&keel).await;
    assert_eq!(
        got, want,
        "keel's answers (left) differ from etcd's (right)"
    );
    // The answers etcd gives, spelled out (COMPAT.md): guards the comparison against a change
    // of the reference.
    let text = |i: usize| want[i].1 .1.as_str();
    assert_eq!(
        want[0].1,
        (
            "InvalidArgument".into(),
            "etcdserver: key is not provided".into()
        )
    );
    assert_eq!(text(3), "etcdserver: too many operations in txn request");
    assert_eq!(text(5), "etcdserver: duplicate key given in txn request");
}

/// Puts values of each size and records what the server answered (Ok or code + message).
async fn size_answers(
    server: &Server,
    sizes: &[usize],
) -> Vec<(usize, Result<(), (String, String)>)> {
    let mut c = client(server).await;
    let mut answers = Vec::new();
    for &size in sizes {
        let result = c.put("big", vec![b'x'; size], None).await;
        let answer = match result {
            Ok(_) => Ok(()),
            Err(e) => Err(grpc_error::<()>(Err(e))),
        };
        answers.push((size, answer));
        still_serves(server, &format!("size-{size}")).await;
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_match_etcd_at_both_limits() {
    const ARGS: &[&str] = &["--max-request-bytes", "65536"];
    let (keel, etcd) = both(ARGS);
    // Around the raft-entry limit (etcd measures the marshalled internal request), then around
    // the gRPC receive limit.
    let mut sizes: Vec<usize> = (0..8).map(|i| MAX_REQUEST_BYTES - 40 + i * 8).collect();
    sizes.extend([
        MAX_REQUEST_BYTES + 1,
        MAX_REQUEST_BYTES + GRPC_SLACK_BYTES - 16,
        MAX_REQUEST_BYTES + GRPC_SLACK_BYTES + 1,
    ]);
    let want = size_answers(&etcd, &sizes).await;
    let got = size_answers(&keel, &sizes).await;
    assert_eq!(
        got, want,
        "keel's answers (left) differ from etcd's (right)"
    );
    let too_large = &want[8].1;
    assert_eq!(
        too_large,
        &Err((
            "InvalidArgument".into(),
            "etcdserver: request is too large".into()
        ))
    );
    let Err((code, message)) = &want[10].1 else {
        panic!("etcd accepted a message over its gRPC limit")
    };
    assert_eq!(code, "ResourceExhausted");
    assert!(
        message.starts_with("grpc: received message larger than max ("),
        "{message}"
    );
    assert!(
        message.ends_with(&format!(" vs. {})", MAX_REQUEST_BYTES + GRPC_SLACK_BYTES)),
        "{message}"
    );
}

/// Writes `junk` on a fresh TCP connection and reads whatever comes back until the server
/// closes or goes quiet.
fn send_junk(server: &Server, junk: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", server.client_port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("set a read timeout");
    // The server may close before reading everything; a broken pipe is an answer too.
    let _ = s.write_all(junk);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_do_not_hurt_the_server() {
    let keel = Server::keel(&[]);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let random: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let cases: [(&str, Vec<u8>); 5] = [
        ("random bytes", random.clone()),
        (
            "a request line with no end",
            b"GET /health HTTP/1.1\r\nHost: x\r\n".repeat(4096),
        ),
        (
            "a bad HTTP/1.1 request",
            b"BREW /pot HTCPCP/1.0\r\n\r\n".to_vec(),
        ),
        (
            "the h2 preface then junk",
            [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &random[..4096]].concat(),
        ),
        ("a truncated h2 preface", b"PRI * HTTP/2.0\r\n".to_vec()),
    ];
    for (what, junk) in cases {
        let answer = send_junk(&keel, &junk);
        assert!(
            answer.len() < 64 * 1024,
            "{what}: a bounded answer, got {} bytes",
            answer.len()
        );
        still_serves(&keel, what).await;
    }
}

/// What the server answered to one raw gRPC call: HTTP status, grpc-status, grpc-message and
/// the response body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawAnswer {
    http_status: u16,
    grpc_status: Option<String>,
    grpc_message: Option<String>,
    body: Vec<u8>,
}

/// How a raw call's request stream ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// END_STREAM with the last DATA frame: a half-closed request.
    EndStream,
    /// RST_STREAM(CANCEL) after the data, without END_STREAM.
    Reset,
}

/// One gRPC call over a minimal h2 client, with `body` sent as is (no gRPC framing added).
async fn raw_call(port: u16, path: &str, body: Bytes, ending: Ending) -> Option<RawAnswer> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (h2, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut h2 = h2.ready().await.expect("h2 ready");
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request head");
    let (response, mut send) = h2
        .send_request(request, false)
        .expect("send the request head");
    match ending {
        // A server may answer (and close the stream) from the headers alone, e.g. for an
        // unknown method, before the body goes out: then the send fails and the answer counts.
        Ending::EndStream => {
            let _ = send.send_data(body, true);
        }
        Ending::Reset => {
            let _ = send.send_data(body, false);
            send.send_reset(h2::Reason::CANCEL);
            return None;
        }
    }
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer in time")
        .ok()?;
    let http_status = response.status().as_u16();
    let head = response.headers().clone();
    let mut recv = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("a data frame");
        let _ = recv.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await.ok().flatten().unwrap_or_default();
    let field = |name: &str| {
        trailers
            .get(name)
            .or_else(|| head.get(name))
            .map(|v| percent_decode(v.to_str().expect("ASCII metadata")))
    };
    Some(RawAnswer {
        http_status,
        grpc_status: field("grpc-status"),
        grpc_message: field("grpc-message"),
        body: data,
    })
}

/// grpc-message is percent-encoded on the wire.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A gRPC length-prefixed message: compressed flag, 4-byte big-endian length, payload.
fn frame(compressed: u8, declared_len: u32, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(compressed);
    b.put_u32(declared_len);
    b.put_slice(payload);
    b.freeze()
}

fn raw_cases() -> Vec<(&'static str, &'static str, Bytes)> {
    let put = keel_proto::etcdserverpb::PutRequest {
        key: "raw".into(),
        value: "v".into(),
        ..Default::default()
    }
    .encode_to_vec();
    vec![
        (
            "a valid put",
            "/etcdserverpb.KV/Put",
            frame(0, put.len() as u32, &put),
        ),
        (
            "a truncated frame",
            "/etcdserverpb.KV/Put",
            frame(0, 100, &put),
        ),
        (
            "a truncated length prefix",
            "/etcdserverpb.KV/Put",
            Bytes::from_static(&[0, 0, 0]),
        ),
        ("no message at all", "/etcdserverpb.KV/Range", Bytes::new()),
        (
            "malformed protobuf",
            "/etcdserverpb.KV/Put",
            frame(0, 6, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
        ),
        (
            "a bad wire type",
            "/etcdserverpb.KV/Range",
            frame(0, 2, &[0x0f, 0x01]),
        ),
        (
            "compressed without an encoding",
            "/etcdserverpb.KV/Put",
            frame(1, put.len() as u32, &put),
        ),
        (
            "two messages for a unary call",
            "/etcdserverpb.KV/Put",
            [
                frame(0, put.len() as u32, &put),
                frame(0, put.len() as u32, &put),
            ]
            .concat()
            .into(),
        ),
        (
            "an unknown method",
            "/etcdserverpb.KV/Nope",
            frame(0, put.len() as u32, &put),
        ),
        (
            "an unknown service",
            "/nope.Nope/Nope",
            frame(0, put.len() as u32, &put),
        ),
    ]
}

/// Cases where keel's answer is known to differ from etcd's (keel-grpc answers Internal where
/// grpc-go answers Unknown with Go's io error text). Both still reject the call; the test fails
/// when one of these starts to match, so the list cannot go stale.
const KNOWN_RAW_DIFFERENCES: [&str; 0] = [];

/// What of a raw answer must match etcd: HTTP status, grpc-status, grpc-message (absent and
/// empty are the same to clients; etcd's protobuf parse detail is its library's own text), and
/// whether a response message came (its bytes carry member-specific ids).
fn comparable(answer: &Option<RawAnswer>) -> Option<(u16, Option<String>, String, bool)> {
    answer.as_ref().map(|a| {
        let message = a.grpc_message.clone().unwrap_or_default();
        let message = match message.split_once("grpc: error unmarshalling request: ") {
            Some((prefix, _)) => format!("{prefix}grpc: error unmarshalling request: <detail>"),
            None => message,
        };
        (
            a.http_status,
            a.grpc_status.clone(),
            message,
            !a.body.is_empty(),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_grpc_frames_match_etcd() {
    let (keel, etcd) = both(&[]);
    let mut report = String::new();
    for (what, path, body) in raw_cases() {
        let want = raw_call(etcd.client_port, path, body.clone(), Ending::EndStream).await;
        let got = raw_call(keel.client_port, path, body.clone(), Ending::EndStream).await;
        let known = KNOWN_RAW_DIFFERENCES.contains(&what);
        let same = comparable(&want) == comparable(&got);
        if known && same {
            report.push_str(&format!(
                "{what}: now matches etcd, remove it from KNOWN_RAW_DIFFERENCES\n"
            ));
        } else if known {
            // Still a rejection with an error status, as etcd's.
            let status = got.as_ref().and_then(|a| a.grpc_status.clone());
            assert!(
                status.is_some_and(|s| s != "0"),
                "{what}: keel must reject the call: {got:?}"
            );
            println!("known difference, {what}:\n  etcd {want:?}\n  keel {got:?}");
        } else if !same {
            report.push_str(&format!("{what}:\n  etcd {want:?}\n  keel {got:?}\n"));
        }
        still_serves(&keel, what).await;
        // A client that gives up halfway: the server drops the call and serves on.
        let half = body.slice(..body.len() / 2);
        let _ = raw_call(keel.client_port, path, half, Ending::Reset).await;
        still_serves(&keel, what).await;
    }
    assert!(
        report.is_empty(),
        "raw gRPC answers differ from etcd 3.4:\n{report}"
    );
}
