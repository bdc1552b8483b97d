//! The JSON gateway (`POST /v3/...`), differential against etcd 3.4's grpc-gateway: the same
//! requests to a fresh Keel and a fresh etcd must get the same HTTP status and the same JSON,
//! apart from the member and cluster ids.

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
