//! etcdctl 3.4 against the server: watch (prefix, history replay, prev_kv, interactive), the
//! lease commands, lease expiry seen by a watcher, `lock` contention and `elect`/`elect -l`.
//!
//! etcdctl's `lock` and `elect` are client-side recipes (clientv3/concurrency) built on txns,
//! leases and watches, so they exercise those services the way Go programs use them; the
//! v3lock/v3election gRPC services are covered by the etcd-client tests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{unb64, Server};
use crate::support::{LiveEtcdctl, Stdin};

/// The current revision, read through etcdctl.
fn revision(server: &Server) -> i64 {
    let out = server
        .etcdctl(&["get", "--write-out=json", "revision-probe"])
        .ok();
    out.json()["header"]["revision"]
        .as_i64()
        .expect("a range header has a revision")
}

/// One event of etcdctl's `-w json` watch output, reduced to what the tests compare.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JsonEvent {
    delete: bool,
    key: String,
    value: String,
    mod_revision: i64,
    prev_value: Option<String>,
}

fn json_events(doc: &Value) -> Vec<JsonEvent> {
    doc["Events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let kv = &e["kv"];
            JsonEvent {
                delete: e["type"].as_i64() == Some(1) || e["type"].as_str() == Some("DELETE"),
                key: unb64(kv["key"].as_str().expect("an event has a key")),
                value: kv["value"].as_str().map(unb64).unwrap_or_default(),
                mod_revision: kv["mod_revision"]
                    .as_i64()
                    .expect("a kv has a mod_revision"),
                prev_value: e
                    .get("prev_kv")
                    .and_then(|p| p.get("value"))
                    .and_then(|v| v.as_str())
                    .map(unb64),
            }
        })
        .collect()
}

/// Reads `-w json` watch documents until `count` events arrived; returns them with the
/// number of documents (responses) they came in.
fn read_json_events(watch: &mut LiveEtcdctl, count: usize) -> (Vec<JsonEvent>, usize) {
    let mut events = Vec::new();
    let mut docs = 0;
    while events.len() < count {
        let line = watch.next_line();
        let doc: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("watch printed a non-JSON line {line:?}: {e}"));
        assert_eq!(doc["Canceled"], Value::Bool(false), "watch canceled: {doc}");
        events.extend(json_events(&doc));
        docs += 1;
    }
    assert_eq!(events.len(), count, "more events than expected: {events:?}");
    (events, docs)
}

fn put(server: &Server, key: &str, value: &str) -> i64 {
    let out = server
        .etcdctl(&["put", "--write-out=json", key, value])
        .ok();
    out.json()["header"]["revision"]
        .as_i64()
        .expect("a put header has a revision")
}

fn ev(delete: bool, key: &str, value: &str, rev: i64, prev: Option<&str>) -> JsonEvent {
    JsonEvent {
        delete,
        key: key.to_string(),
        value: value.to_string(),
        mod_revision: rev,
        prev_value: prev.map(str::to_string),
    }
}

#[test]
fn watch_prefix_prev_kv_and_history_replay() {
    let server = Server::under_test(&[]);
    let r1 = put(&server, "pre/a", "1");
    let r2 = put(&server, "pre/a", "2");
    put(&server, "other", "x");
    let start = revision(&server) + 1;
    // Starting at a known revision closes the race between etcdctl's watch creation and the
    // first write: anything written before the watcher exists is replayed from history.
    let mut watch = LiveEtcdctl::start(
        &server,
        &[
            "watch",
            "--prefix",
            "pre/",
            "--prev-kv",
            "--write-out=json",
            &format!("--rev={start}"),
        ],
        Stdin::Closed,
    );
    let r3 = put(&server, "pre/a", "3");
    put(&server, "other", "y");
    let out = server.etcdctl(&["del", "pre/a"]).ok();
    assert_eq!(out.stdout.trim(), "1");
    let r4 = revision(&server);
    let r5 = put(&server, "pre/b", "new");
    let (events, _) = read_json_events(&mut watch, 3);
    assert_eq!(
        events,
        vec![
            ev(false, "pre/a", "3", r3, Some("2")),
            // A delete event's kv has no value; prev_kv carries the deleted value.
            ev(true, "pre/a", "", r4, Some("3")),
            // A created key has no previous version, so no prev_kv.
            ev(false, "pre/b", "new", r5, None),
        ]
    );
    watch.assert_silent(Duration::from_millis(300));

    // History replay from revision 1: every version of the key, in order, nothing else.
    let mut replay = LiveEtcdctl::start(
        &server,
        &["watch", "--rev=1", "--write-out=json", "pre/a"],
        Stdin::Closed,
    );
    let (events, _) = read_json_events(&mut replay, 4);
    assert_eq!(
        events,
        vec![
            ev(false, "pre/a", "1", r1, None),
            ev(false, "pre/a", "2", r2, None),
            ev(false, "pre/a", "3", r3, None),
            ev(true, "pre/a", "", r4, None),
        ]
    );
    replay.assert_silent(Duration::from_millis(300));
}

#[test]
fn watch_simple_output_and_txn_events_in_one_response() {
    let server = Server::under_test(&[]);
    let start = revision(&server) + 1;
    let mut watch = LiveEtcdctl::start(
        &server,
        &["watch", "--prefix", "t/", &format!("--rev={start}")],
        Stdin::Closed,
    );
    server.etcdctl(&["put", "t/k", "v1"]).ok();
    assert_eq!(
        [watch.next_line(), watch.next_line(), watch.next_line()],
        ["PUT", "t/k", "v1"].map(String::from)
    );
    // One txn writes three keys at one revision: etcd delivers them in one response.
    let mut json = LiveEtcdctl::start(
        &server,
        &[
            "watch",
            "--prefix",
            "t/",
            "--write-out=json",
            &format!("--rev={}", start + 1),
        ],
        Stdin::Closed,
    );
    let txn = "\nput t/x 1\nput t/y 2\nput t/z 3\n\n\n";
    server.etcdctl_stdin(&["txn", "-i"], txn).ok();
    let (events, docs) = read_json_events(&mut json, 3);
    assert_eq!(docs, 1, "one revision's events split: {events:?}");
    assert!(events.iter().all(|e| e.mod_revision == start + 1));
    assert_eq!(
        events.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["t/x", "t/y", "t/z"]
    );
}

/// Whether `lines` is `a` and `b` merged, each keeping its own order.
fn is_interleaving(lines: &[String], a: &[&str], b: &[&str]) -> bool {
    if lines.len() != a.len() + b.len() {
        return false;
    }
    // merged[j] after row i: whether the first i + j lines merge a[..i] and b[..j].
    let mut merged = vec![false; b.len() + 1];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            merged[j] = if i == 0 && j == 0 {
                true
            } else {
                let line = lines[i + j - 1].as_str();
                (i > 0 && merged[j] && a[i - 1] == line)
                    || (j > 0 && merged[j - 1] && b[j - 1] == line)
            };
        }
    }
    merged[b.len()]
}

#[test]
fn interleavings_keep_each_watchers_order() {
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (a, b) = (["PUT", "foo", "v2"], ["PUT", "foo", "v1", "foo", "v2"]);
    let seen = owned(&["PUT", "PUT", "foo", "v2", "foo", "v1", "foo", "v2"]);
    assert!(is_interleaving(&seen, &a, &b));
    assert!(is_interleaving(&owned(&[&a[..], &b[..]].concat()), &a, &b));
    let reordered = owned(&["PUT", "PUT", "foo", "v1", "v2", "foo", "foo", "v2"]);
    assert!(!is_interleaving(&reordered, &a, &b));
    assert!(!is_interleaving(&seen[..7], &a, &b));
}

#[test]
fn watch_interactive_progress_and_several_watchers() {
    let server = Server::under_test(&[]);
    let start = revision(&server) + 1;
    let mut watch = LiveEtcdctl::start(&server, &["watch", "-i"], Stdin::Piped);
    watch.send_line(&format!("watch --rev {start} foo"));
    let r1 = put(&server, "foo", "v1");
    assert_eq!(
        [watch.next_line(), watch.next_line(), watch.next_line()],
        ["PUT", "foo", "v1"].map(String::from)
    );
    // Once the watcher is synced, a progress request reports the current revision.
    watch.send_line("progress");
    assert_eq!(watch.next_line(), format!("progress notify: {r1}"));
    // etcdctl 3.4 has no interactive `cancel`: it rejects the line itself and keeps watching.
    watch.send_line("cancel");
    // A second watcher on the same stream, with prev_kv.
    watch.send_line(&format!("watch --prev-kv --rev {} --prefix fo", r1 + 1));
    let r2 = put(&server, "foo", "v2");
    // Each watcher prints the event; the prev_kv watcher prints the previous kv first.
    let lines: Vec<String> = (0..8)
        .map(|_| watch.line_where("of an event", |l| !l.starts_with("Invalid command")))
        .collect();
    // etcdctl prints each watcher from its own goroutine, one line per write, so the two
    // watchers' lines may interleave in any order (CI once saw "PUT PUT foo v2 foo v1 foo v2").
    assert!(
        is_interleaving(
            &lines,
            &["PUT", "foo", "v2"],
            &["PUT", "foo", "v1", "foo", "v2"]
        ),
        "unexpected interactive output: {lines:?}"
    );
    watch.send_line("progress");
    assert_eq!(
        watch.line_where("with progress", |l| l.starts_with("progress")),
        format!("progress notify: {r2}")
    );
}

#[test]
fn lease_commands_and_put_with_lease() {
    let server = Server::under_test(&[]);
    let out = server.etcdctl(&["lease", "grant", "100"]).ok();
    let words: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(
        (words[0], words[2..].join(" ")),
        ("lease", "granted with TTL(100s)".to_string()),
        "{out:?}"
    );
    let id = words[1].to_string();
    server
        .etcdctl(&["put", &format!("--lease={id}"), "lk1", "v"])
        .ok();
    server
        .etcdctl(&["put", &format!("--lease={id}"), "lk2", "v"])
        .ok();
    let ttl = server.etcdctl(&["lease", "timetolive", "--keys", &id]).ok();
    let text = ttl.stdout.trim();
    let prefix = format!("lease {id} granted with TTL(100s), remaining(");
    assert!(text.starts_with(&prefix), "{text:?}");
    assert!(text.ends_with("s), attached keys([lk1 lk2])"), "{text:?}");
    let remaining: i64 = text[prefix.len()..]
        .split('s')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no remaining TTL in {text:?}"));
    assert!((95..=100).contains(&remaining), "{text:?}");

    let ka = server.etcdctl(&["lease", "keep-alive", "--once", &id]).ok();
    assert_eq!(
        ka.stdout.trim(),
        format!("lease {id} keepalived with TTL(100)")
    );
    let list = server.etcdctl(&["lease", "list"]).ok();
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines, ["found 1 leases", id.as_str()]);

    let rev = server.etcdctl(&["lease", "revoke", &id]).ok();
    assert_eq!(rev.stdout.trim(), format!("lease {id} revoked"));
    let get = server.etcdctl(&["get", "--prefix", "lk"]).ok();
    assert_eq!(get.stdout, "", "revoke deletes the attached keys");
    let gone = server.etcdctl(&["lease", "timetolive", &id]).ok();
    assert_eq!(gone.stdout.trim(), format!("lease {id} already expired"));
    let again = server.etcdctl(&["lease", "revoke", &id]);
    assert_ne!(again.code, 0);
    assert!(
        again
            .stderr
            .contains("etcdserver: requested lease not found"),
        "{again:?}"
    );
    let unknown = server.etcdctl(&["put", "--lease=123", "x", "y"]);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown
            .stderr
            .contains("etcdserver: requested lease not found"),
        "{unknown:?}"
    );
    // A TTL below the minimum is raised to it.
    let short = server.etcdctl(&["lease", "grant", "1"]).ok();
    assert!(
        short.stdout.trim().ends_with("granted with TTL(2s)"),
        "{short:?}"
    );
}

#[test]
fn lease_expiry_deletes_keys_at_one_revision_with_delete_events() {
    let server = Server::under_test(&[]);
    let granted_at = Instant::now();
    let out = server.etcdctl(&["lease", "grant", "2"]).ok();
    let id = out
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("a lease id")
        .to_string();
    for (k, v) in [("exp/a", "1"), ("exp/b", "2"), ("exp/c", "3")] {
        server
            .etcdctl(&["put", &format!("--lease={id}"), k, v])
            .ok();
    }
    let start = revision(&server) + 1;
    let mut watch = LiveEtcdctl::start(
        &server,
        &[
            "watch",
            "--prefix",
            "exp/",
            "--prev-kv",
            "--write-out=json",
            &format!("--rev={start}"),
        ],
        Stdin::Closed,
    );
    let (events, docs) = read_json_events(&mut watch, 3);
    let elapsed = granted_at.elapsed();
    assert_eq!(docs, 1, "one revision's deletes split: {events:?}");
    assert_eq!(
        events,
        vec![
            ev(true, "exp/a", "", start, Some("1")),
            ev(true, "exp/b", "", start, Some("2")),
            ev(true, "exp/c", "", start, Some("3")),
        ]
    );
    assert!(
        elapsed >= Duration::from_millis(1500),
        "a 2 s lease expired after {elapsed:?}"
    );
    assert_eq!(server.etcdctl(&["get", "--prefix", "exp/"]).ok().stdout, "");
    let ttl = server.etcdctl(&["lease", "timetolive", &id]).ok();
    assert_eq!(ttl.stdout.trim(), format!("lease {id} already expired"));
}

#[test]
fn lock_serializes_two_contenders() {
    let server = Server::under_test(&[]);
    let log = server.dir.path().join("lock.log");
    let script = |name: &str| {
        format!(
            "echo {name}-start $ETCD_LOCK_KEY >> {p}; sleep 1.5; echo {name}-end >> {p}",
            p = log.display()
        )
    };
    let (sa, sb) = (script("A"), script("B"));
    let mut a = LiveEtcdctl::start(
        &server,
        &["lock", "L", "--", "sh", "-c", &sa],
        Stdin::Closed,
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("A-start")
    {
        assert!(Instant::now() < deadline, "A never got the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut b = LiveEtcdctl::start(
        &server,
        &["lock", "L", "--", "sh", "-c", &sb],
        Stdin::Closed,
    );
    assert_eq!(a.wait_exit(), 0);
    assert_eq!(b.wait_exit(), 0);
    let text = std::fs::read_to_string(&log).expect("the lock log exists");
    let steps: Vec<&str> = text
        .lines()
        .map(|l| l.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(steps, ["A-start", "A-end", "B-start", "B-end"], "{text}");
    let keys: Vec<&str> = text.lines().filter_map(|l| l.split(' ').nth(1)).collect();
    assert!(
        keys.len() == 2 && keys[0] != keys[1] && keys.iter().all(|k| k.starts_with("L/")),
        "lock keys: {keys:?}"
    );
}

#[test]
fn elect_and_observe_leader_changes() {
    let server = Server::under_test(&[]);
    let mut observer = LiveEtcdctl::start(&server, &["elect", "-l", "E"], Stdin::Closed);
    let c1 = LiveEtcdctl::start(&server, &["elect", "E", "cand1"], Stdin::Closed);
    let mut c1 = c1;
    let key1 = c1.next_line();
    assert!(key1.starts_with("E/"), "{key1:?}");
    assert_eq!(c1.next_line(), "cand1");
    assert_eq!(
        [observer.next_line(), observer.next_line()],
        [key1.clone(), "cand1".into()]
    );

    let mut c2 = LiveEtcdctl::start(&server, &["elect", "E", "cand2"], Stdin::Closed);
    c2.assert_silent(Duration::from_millis(800));
    // SIGTERM makes etcdctl resign and close its session; the next candidate takes over.
    c1.signal(libc::SIGTERM);
    let key2 = c2.next_line();
    assert!(key2.starts_with("E/") && key2 != key1, "{key2:?}");
    assert_eq!(c2.next_line(), "cand2");
    assert_eq!(
        [observer.next_line(), observer.next_line()],
        [key2, "cand2".into()]
    );
    let leaders: HashMap<String, usize> = observer.seen.iter().fold(HashMap::new(), |mut m, l| {
        *m.entry(l.clone()).or_default() += 1;
        m
    });
    assert_eq!(leaders.get("cand1"), Some(&1), "{:?}", observer.seen);
}
