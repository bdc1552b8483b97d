//! etcd's snapshot format both ways, against real etcd 3.4 and etcdctl:
//! Keel's Maintenance.Snapshot is read by `etcdctl snapshot status` and restored by
//! `etcdctl snapshot restore` into a data dir a real etcd serves; an etcd snapshot restored by
//! `keel snapshot restore` serves the same answers from Keel; `keel snapshot status` prints
//! what etcdctl prints for both kinds of file; `etcdctl make-mirror` copies etcd into Keel.
//! Users, roles, passwords and the enabled flag cross both ways with the keys.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions};

use crate::common::{etcdctl_at, free_port, Kind, Output, Server};

/// What a server answers about the loaded data: every key now, every lease with its keys,
/// the key space at every revision from the compact revision on, and the watch history after
/// the compact revision.
#[derive(Debug, PartialEq)]
struct Observed {
    kvs_now: serde_json::Value,
    revision: i64,
    leases: Vec<(String, i64, Vec<String>)>,
    kvs_at: Vec<(i64, serde_json::Value)>,
    history: Vec<(i32, String, String, i64, i64, i64, i64)>,
    compacted_error: String,
}

/// Loads several revisions per key, a delete, a compaction, a lease with keys, and writes
/// after the compaction. Returns the compact revision.
fn load(s: &Server) -> i64 {
    for round in 0..3 {
        for key in ["alpha", "beta", "gamma", "dir/one", "dir/two"] {
            s.etcdctl(&["put", key, &format!("{key}-{round}")]).ok();
        }
    }
    s.etcdctl(&["del", "beta"]).ok();
    let compact_rev = revision(s) - 2;
    s.etcdctl(&["compact", &compact_rev.to_string()]).ok();
    let grant = s.etcdctl(&["lease", "grant", "600"]).ok();
    let lease = grant
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("etcdctl prints the lease id")
        .to_string();
    s.etcdctl(&["put", "leased/a", "1", "--lease", &lease]).ok();
    s.etcdctl(&["put", "leased/b", "2", "--lease", &lease]).ok();
    s.etcdctl(&["put", "alpha", "after-compaction"]).ok();
    s.etcdctl(&["put", "beta", "reborn"]).ok();
    s.etcdctl(&["del", "dir/", "--prefix"]).ok();
    s.etcdctl(&["put", "big", &"x".repeat(20_000)]).ok();
    compact_rev
}

fn revision(s: &Server) -> i64 {
    s.etcdctl(&["get", "nothing-here", "-w", "json"])
        .ok()
        .json()["header"]["revision"]
        .as_i64()
        .expect("a header revision")
}

fn kvs(s: &Server, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["get", "", "--from-key", "-w", "json"];
    args.extend_from_slice(extra);
    let v = s.etcdctl(&args).ok().json();
    serde_json::json!({"kvs": v["kvs"], "count": v["count"]})
}

fn observe(s: &Server, compact_rev: i64) -> Observed {
    let revision = revision(s);
    let mut leases = Vec::new();
    let list = s.etcdctl(&["lease", "list"]).ok();
    for id in list.stdout.lines().skip(1) {
        let ttl = s
            .etcdctl(&["lease", "timetolive", id, "--keys", "-w", "json"])
            .ok()
            .json();
        let mut keys: Vec<String> = ttl["keys"]
            .as_array()
            .map(|k| {
                k.iter()
                    .map(|k| crate::common::unb64(k.as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default();
        keys.sort();
        leases.push((
            id.to_string(),
            ttl["granted-ttl"].as_i64().expect("a granted TTL"),
            keys,
        ));
    }
    let kvs_at = (compact_rev..=revision)
        .map(|rev| (rev, kvs(s, &["--rev", &rev.to_string()])))
        .collect();
    let below = s.etcdctl(&["get", "alpha", "--rev", &(compact_rev - 1).to_string()]);
    Observed {
        kvs_now: kvs(s, &[]),
        revision,
        leases,
        kvs_at,
        history: history(s, compact_rev + 1, revision),
        // The last line: etcdctl's message (the lines before it are client logs that name ports).
        compacted_error: below.stderr.trim().lines().last().unwrap_or("").to_string(),
    }
}

/// Every event from `from` to `to` on one watch of the whole key space.
fn history(s: &Server, from: i64, to: i64) -> Vec<(i32, String, String, i64, i64, i64, i64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut c = crate::common::client(s).await;
        let opts = WatchOptions::new()
            .with_all_keys()
            .with_start_revision(from);
        let mut stream = c.watch("", Some(opts)).await.expect("watch");
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while out
            .last()
            .is_none_or(|e: &(i32, String, String, i64, i64, i64, i64)| e.4 < to)
        {
            let msg = tokio::time::timeout_at(deadline, stream.message())
                .await
                .expect("the history arrives in time")
                .expect("the watch stream works")
                .expect("the stream stays open");
            assert!(!msg.canceled(), "watch canceled: {msg:?}");
            for e in msg.events() {
                let kv = e.kv().expect("an event has a key-value");
                out.push((
                    match e.event_type() {
                        EventType::Put => 0,
                        EventType::Delete => 1,
                    },
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.version(),
                    kv.lease(),
                ));
            }
        }
        out
    })
}

/// Compares two observations field by field, printing only what differs (values are long).
fn assert_same(got: &Observed, want: &Observed) {
    let short = |v: String| v.chars().take(3000).collect::<String>();
    assert_eq!(got.revision, want.revision);
    assert!(
        got.kvs_now == want.kvs_now,
        "now: {} vs {}",
        short(format!("{:?}", got.kvs_now)),
        short(format!("{:?}", want.kvs_now))
    );
    assert_eq!(got.leases, want.leases);
    for ((rev, a), (_, b)) in got.kvs_at.iter().zip(&want.kvs_at) {
        assert!(
            a == b,
            "at {rev}: {} vs {}",
            short(format!("{a:?}")),
            short(format!("{b:?}"))
        );
    }
    assert_eq!(got.kvs_at.len(), want.kvs_at.len());
    assert_eq!(got.history.len(), want.history.len(), "history lengths");
    for (a, b) in got.history.iter().zip(&want.history) {
        assert!(
            a == b,
            "history: {} vs {}",
            short(format!("{a:?}")),
            short(format!("{b:?}"))
        );
    }
    assert_eq!(got.compacted_error, want.compacted_error);
}

fn keel_cli(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("keel runs");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `keel snapshot status` prints exactly what `etcdctl snapshot status` prints, in every format.
fn assert_same_status(file: &Path) -> serde_json::Value {
    let path = file.to_str().expect("a UTF-8 temp path");
    for format in ["simple", "json", "table", "fields"] {
        let etcdctl = etcdctl_at(
            "127.0.0.1:1",
            &["snapshot", "status", path, "-w", format],
            None,
        )
        .ok();
        let keel = keel_cli(&["snapshot", "status", path, "-w", format]).ok();
        assert_eq!(keel.stdout, etcdctl.stdout, "-w {format}");
    }
    etcdctl_at(
        "127.0.0.1:1",
        &["snapshot", "status", path, "-w", "json"],
        None,
    )
    .ok()
    .json()
}

/// `snapshot restore FILE` into `data` as the one-member cluster "e2e" at `peer_url`.
fn restore_args(file: &Path, data: &Path, peer_url: &str) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("a UTF-8 temp path").to_string();
    vec![
        "snapshot".into(),
        "restore".into(),
        path(file),
        "--name".into(),
        "e2e".into(),
        "--data-dir".into(),
        path(data),
        "--initial-cluster".into(),
        format!("e2e={peer_url}"),
        "--initial-advertise-peer-urls".into(),
        peer_url.into(),
    ]
}

/// etcdctl's restore (it needs no server: the endpoint is never dialed).
fn etcdctl_restore(file: &Path, data: &Path, peer_url: &str) {
    let args = restore_args(file, data, peer_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    etcdctl_at("127.0.0.1:1", &args, None).ok();
}

/// Keel's restore, with the same arguments as etcdctl's.
fn keel_restore(file: &Path, data: &Path, peer_url: &str) {
    let args = restore_args(file, data, peer_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    keel_cli(&args).ok();
}

fn save(s: &Server, file: &Path) {
    save_as(s, file, None);
}

/// `etcdctl snapshot save`, as `user` ("name:password") when given: with auth enabled only
/// the root role may take a snapshot.
fn save_as(s: &Server, file: &Path, user: Option<&str>) {
    let path = file.to_str().expect("a UTF-8 temp path");
    let mut args = user.map(|u| vec!["--user", u]).unwrap_or_default();
    args.extend_from_slice(&["snapshot", "save", path]);
    let out = s.etcdctl(&args).ok();
    assert!(out.stdout.contains("Snapshot saved at"), "{out:?}");
}

#[test]
fn keel_snapshot_restores_into_a_real_etcd_with_the_same_answers() {
    let keel = Server::keel(&[]);
    let compact_rev = load(&keel);
    let served = observe(&keel, compact_rev);
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("keel.db");
    save(&keel, &file);
    let status = assert_same_status(&file);
    assert_eq!(status["revision"], served.revision, "{status}");
    assert!(
        status["totalKey"].as_i64().expect("a count") > 10,
        "{status}"
    );
    assert_eq!(
        std::fs::metadata(&file).expect("saved").len(),
        status["totalSize"].as_u64().expect("a size") + 32,
        "the database, then its sha256"
    );

    let (client_port, peer_port) = (free_port(), free_port());
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let data = dir.path().join("etcd.data");
    etcdctl_restore(&file, &data, &peer_url);
    let etcd = Server::start_with(
        Kind::Etcd,
        client_port,
        peer_port,
        &[],
        &[],
        Some(data),
        None,
    );
    let restored = observe(&etcd, compact_rev);
    assert_same(&restored, &served);
    assert!(
        restored
            .compacted_error
            .contains("required revision has been compacted"),
        "{}",
        restored.compacted_error
    );
    assert_eq!(restored.leases.len(), 1);
    assert_eq!(restored.leases[0].2, ["leased/a", "leased/b"]);
}

#[test]
fn etcd_snapshot_restores_into_keel_with_the_same_answers() {
    let etcd = Server::etcd(&[]);
    let compact_rev = load(&etcd);
    let served = observe(&etcd, compact_rev);
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("etcd.db");
    save(&etcd, &file);
    assert_same_status(&file);
    drop(etcd);

    let (client_port, peer_port) = (free_port(), free_port());
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let data = dir.path().join("keel.data");
    let restore = |file: &Path, extra: &[&str]| {
        let mut args = vec![
            "snapshot",
            "restore",
            file.to_str().expect("a UTF-8 temp path"),
            "--name",
            "e2e",
            "--data-dir",
            data.to_str().expect("a UTF-8 temp path"),
        ];
        let cluster = format!("e2e={peer_url}");
        args.extend_from_slice(&["--initial-cluster", &cluster]);
        args.extend_from_slice(&["--initial-advertise-peer-urls", &peer_url]);
        args.extend_from_slice(extra);
        keel_cli(&args)
    };
    // A damaged file fails the sha256 check, as in etcdctl; --skip-hash-check skips it.
    let mut damaged = std::fs::read(&file).expect("saved");
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    let damaged_file = dir.path().join("damaged.db");
    std::fs::write(&damaged_file, &damaged).expect("written");
    let refused = restore(&damaged_file, &[]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("expected sha256"), "{refused:?}");
    assert!(!data.exists(), "nothing is left behind");
    restore(&damaged_file, &["--skip-hash-check"]).ok();
    std::fs::remove_dir_all(&data).expect("removed");

    restore(&file, &[]).ok();
    let again = restore(&file, &[]);
    assert!(again.stderr.contains("exists"), "{again:?}");
    let keel = Server::start_with(
        Kind::Keel,
        client_port,
        peer_port,
        &[],
        &[],
        Some(data),
        None,
    );
    let restored = observe(&keel, compact_rev);
    assert_same(&restored, &served);
    assert_eq!(restored.leases[0].2, ["leased/a", "leased/b"]);
    // The restored member writes on from the restored revision.
    keel.etcdctl(&["put", "new", "v"]).ok();
    assert_eq!(revision(&keel), served.revision + 1);
}

#[test]
fn make_mirror_copies_etcd_into_keel() {
    let etcd = Server::etcd(&[]);
    let keel = Server::keel(&[]);
    for i in 0..50 {
        etcd.etcdctl(&["put", &format!("m/{i:02}"), &format!("v{i}")])
            .ok();
    }
    let mut mirror = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoint()))
        .args(["make-mirror", "--prefix", "m/", &keel.endpoint()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl make-mirror starts");
    let values = |s: &Server| {
        let v = s
            .etcdctl(&["get", "m/", "--prefix", "-w", "json"])
            .ok()
            .json();
        v["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| {
                        (
                            crate::common::unb64(kv["key"].as_str().unwrap_or("")),
                            crate::common::unb64(kv["value"].as_str().unwrap_or("")),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let wait_equal = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (want, got) = (values(&etcd), values(&keel));
            if want == got {
                return want;
            }
            assert!(Instant::now() < deadline, "mirror never caught up: {got:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_eq!(wait_equal().len(), 50);
    // Live changes follow: a put and a delete on etcd reach Keel.
    etcd.etcdctl(&["put", "m/new", "live"]).ok();
    etcd.etcdctl(&["del", "m/00"]).ok();
    let now = wait_equal();
    assert!(now.contains(&("m/new".to_string(), "live".to_string())));
    assert_eq!(now.len(), 50);
    mirror.kill().expect("make-mirror stops");
    mirror.wait().expect("make-mirror is reaped");
}

/// Puts `count` keys of `value_bytes` each (and a few values larger than several pages)
/// through the etcd-client crate, which is much faster than one etcdctl process per key.
fn load_many(s: &Server, count: usize, value_bytes: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut c = crate::common::client(s).await;
        for i in 0..count {
            let value = if i % 1000 == 999 {
                vec![b'0' + (i % 10) as u8; 100_000]
            } else {
                vec![b'a' + (i % 26) as u8; value_bytes]
            };
            c.put(format!("many/{i:05}"), value, None)
                .await
                .expect("a put");
        }
    });
}

fn all_kvs(s: &Server) -> serde_json::Value {
    s.etcdctl(&["get", "many/", "--prefix", "-w", "json"])
        .ok()
        .json()["kvs"]
        .clone()
}

/// Databases of a few thousand pages (several branch levels, overflow pages, etcd's freelist):
/// both tools agree on Keel's and etcd's files, and each restores into the other with every key.
#[test]
fn large_snapshots_cross_both_ways() {
    const KEYS: usize = 4000;
    let dir = tempfile::tempdir().expect("a temp dir");
    let keel = Server::keel(&[]);
    load_many(&keel, KEYS, 1000);
    let keel_kvs = all_kvs(&keel);
    let keel_file = dir.path().join("keel.db");
    save(&keel, &keel_file);
    let status = assert_same_status(&keel_file);
    assert!(
        status["totalSize"].as_u64().expect("a size") > 4_000_000,
        "{status}"
    );
    drop(keel);

    let (client_port, peer_port) = (free_port(), free_port());
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd_data = dir.path().join("etcd.data");
    etcdctl_restore(&keel_file, &etcd_data, &peer_url);
    let etcd = Server::start_with(
        Kind::Etcd,
        client_port,
        peer_port,
        &[],
        &[],
        Some(etcd_data),
        None,
    );
    assert!(all_kvs(&etcd) == keel_kvs, "etcd serves Keel's keys");
    // More writes on etcd, then its own snapshot back into Keel.
    load_many(&etcd, KEYS / 2, 700);
    let etcd_kvs = all_kvs(&etcd);
    let etcd_file = dir.path().join("etcd.db");
    save(&etcd, &etcd_file);
    assert_same_status(&etcd_file);
    drop(etcd);

    let (client_port, peer_port) = (free_port(), free_port());
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let keel_data = dir.path().join("keel.data");
    keel_restore(&etcd_file, &keel_data, &peer_url);
    let keel = Server::start_with(
        Kind::Keel,
        client_port,
        peer_port,
        &[],
        &[],
        Some(keel_data),
        None,
    );
    let got = all_kvs(&keel);
    assert_eq!(got.as_array().map(Vec::len), Some(KEYS));
    assert!(got == etcd_kvs, "Keel serves etcd's keys");
}

/// Keys, then users and roles, then auth enabled (etcdctl's `auth enable` adds the root role
/// and grants it to root): alice may read and write `pre/` and read `foo` and `open`
/// onwards, bob may write `w1`..`w9` only, svc has no password.
fn load_auth(s: &Server) {
    for args in [
        &["put", "pre/a", "1"][..],
        &["put", "foo", "bar"],
        &["put", "secret", "s"],
        &["user", "add", "root:rootpw"],
        &["user", "add", "alice:alicepw"],
        &["user", "add", "bob:bobpw"],
        &["user", "add", "--no-password=true", "svc"],
        &["role", "add", "reader"],
        &[
            "role",
            "grant-permission",
            "reader",
            "--prefix",
            "readwrite",
            "pre/",
        ],
        &["role", "grant-permission", "reader", "read", "foo"],
        &[
            "role",
            "grant-permission",
            "reader",
            "read",
            "open",
            "--from-key",
        ],
        &["role", "add", "writer"],
        &["role", "grant-permission", "writer", "write", "w1", "w9"],
        &["user", "grant-role", "alice", "reader"],
        &["user", "grant-role", "bob", "writer"],
        &["user", "grant-role", "svc", "reader"],
        &["auth", "enable"],
    ] {
        s.etcdctl(args).ok();
    }
}

/// What both servers must answer alike about the auth store: its listings, grants allowed
/// and denied, passwords right and wrong, and that auth is enabled (an anonymous call fails).
const AUTH_QUESTIONS: &[&str] = &[
    "--user root:rootpw user list",
    "--user root:rootpw role list",
    "--user root:rootpw user get root",
    "--user root:rootpw user get alice",
    "--user root:rootpw user get svc",
    "--user root:rootpw role get root",
    "--user root:rootpw role get reader",
    "--user root:rootpw role get writer",
    "--user root:rootpw get secret",
    "--user alice:alicepw get pre/ --prefix",
    "--user alice:alicepw get foo",
    "--user alice:alicepw get openx",
    "--user alice:alicepw get secret",
    "--user alice:alicepw put foo x",
    "--user alice:alicepw user list",
    "--user bob:bobpw get pre/a",
    "--user alice:wrong get foo",
    "--user nobody:x get foo",
    "--user svc: get foo",
    "get foo",
    "put foo y",
];

/// Each question with what etcdctl printed and its exit code, without etcdctl's client log
/// lines and the server's address.
fn ask_auth(s: &Server) -> Vec<(&'static str, String)> {
    AUTH_QUESTIONS
        .iter()
        .map(|q| {
            let args: Vec<&str> = q.split_whitespace().collect();
            let out = s.etcdctl(&args);
            let text = format!("{}{}", out.stdout, out.stderr);
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with("{\"level\""))
                .collect();
            let answer = format!("{}\nexit {}", lines.join("\n"), out.code)
                .replace(&s.endpoint(), "ENDPOINT");
            (*q, answer)
        })
        .collect()
}

fn assert_same_answers(got: &[(&str, String)], want: &[(&str, String)]) {
    let differ: Vec<String> = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a != b)
        .map(|((q, a), (_, b))| format!("$ {q}\n--- want\n{b}\n--- got\n{a}"))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    // The questions exercised what they claim.
    let all: String = want.iter().map(|(_, a)| a.as_str()).collect();
    for expected in [
        "etcdserver: permission denied",
        "etcdserver: user name is empty",
        "etcdserver: authentication failed, invalid user ID or password",
        "[pre/, pre0) (prefix pre/)",
        "Roles: reader",
        "pre/a\n1",
    ] {
        assert!(all.contains(expected), "no {expected:?} in {all}");
    }
}

/// The restored store is live, not only readable: a grant used, a password changed.
fn assert_auth_is_live(s: &Server) {
    s.etcdctl(&["--user", "alice:alicepw", "put", "pre/b", "2"])
        .ok();
    s.etcdctl_stdin(
        &[
            "--user",
            "root:rootpw",
            "user",
            "passwd",
            "alice",
            "--interactive=false",
        ],
        "newpw\n",
    )
    .ok();
    let old = s.etcdctl(&["--user", "alice:alicepw", "get", "pre/b"]);
    assert!(
        old.stderr.contains("authentication failed"),
        "the old password no longer works: {old:?}"
    );
    let out = s
        .etcdctl(&[
            "--user",
            "alice:newpw",
            "get",
            "pre/b",
            "--print-value-only",
        ])
        .ok();
    assert_eq!(out.stdout, "2\n");
}

/// One bucket's records, key and value, as stored.
type Records = Vec<(Vec<u8>, Vec<u8>)>;

/// The auth store's buckets in a snapshot file, every record as stored.
fn auth_buckets(file: &Path) -> Vec<(&'static str, Records)> {
    let db = keel_core::etcd_snapshot::open_file(file).expect("a bbolt database");
    ["auth", "authRoles", "authUsers"]
        .into_iter()
        .map(|name| {
            let bucket = db
                .bucket(name.as_bytes())
                .expect("the database reads")
                .unwrap_or_else(|| panic!("no {name} bucket"));
            let mut records = Vec::new();
            db.for_each(&bucket, &mut |k, v| {
                records.push((k.to_vec(), v.expect("a record, not a bucket").to_vec()));
                Ok(())
            })
            .expect("the bucket reads");
            (name, records)
        })
        .collect()
}

fn peer_url_for(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

#[test]
fn keel_auth_restores_into_a_real_etcd_that_enforces_it() {
    let keel = Server::keel(&[]);
    load_auth(&keel);
    let served = ask_auth(&keel);
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("keel.db");
    // Only root may take a snapshot once auth is enabled, on either server.
    let anonymous = keel.etcdctl(&["snapshot", "save", file.to_str().expect("UTF-8")]);
    assert!(
        anonymous.stderr.contains("user name is empty"),
        "{anonymous:?}"
    );
    save_as(&keel, &file, Some("root:rootpw"));
    assert_same_status(&file);
    drop(keel);

    let (client_port, peer_port) = (free_port(), free_port());
    let peer_url = peer_url_for(peer_port);
    let data = dir.path().join("etcd.data");
    etcdctl_restore(&file, &data, &peer_url);
    let etcd = Server::start_with_auth(Kind::Etcd, client_port, peer_port, data, "root:rootpw");
    // Keel's bcrypt hashes check in etcd: every password set in Keel works there.
    assert_same_answers(&ask_auth(&etcd), &served);
    // etcd keeps Keel's records as they are: its own snapshot of them is the same bytes.
    let resaved = dir.path().join("etcd.db");
    save_as(&etcd, &resaved, Some("root:rootpw"));
    assert_eq!(auth_buckets(&resaved), auth_buckets(&file));
    assert_auth_is_live(&etcd);
}

#[test]
fn etcd_auth_restores_into_keel_that_enforces_it() {
    let etcd = Server::etcd(&[]);
    load_auth(&etcd);
    let served = ask_auth(&etcd);
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("etcd.db");
    save_as(&etcd, &file, Some("root:rootpw"));
    assert_same_status(&file);
    drop(etcd);

    let (client_port, peer_port) = (free_port(), free_port());
    let peer_url = peer_url_for(peer_port);
    let data = dir.path().join("keel.data");
    keel_restore(&file, &data, &peer_url);
    let keel = Server::start_with_auth(Kind::Keel, client_port, peer_port, data, "root:rootpw");
    // etcd's bcrypt hashes check in Keel: every password set in etcd works here.
    assert_same_answers(&ask_auth(&keel), &served);
    // Keel lays the auth buckets out as etcd's auth store does: its snapshot of what it
    // restored holds etcd's records byte for byte (flag, revision, users, roles).
    let again = dir.path().join("again.db");
    save_as(&keel, &again, Some("root:rootpw"));
    assert_same_status(&again);
    assert_eq!(auth_buckets(&again), auth_buckets(&file));
    assert_auth_is_live(&keel);
}
