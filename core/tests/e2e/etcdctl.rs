//! etcdctl 3.4 against keel: every read option, deletes, interactive txns, compaction,
//! endpoint and member commands, leases.

use crate::common::{b64, json_keys, Server};

/// Puts `pairs` in order and returns the revision of each put.
fn put_all(s: &Server, pairs: &[(&str, &str)]) -> Vec<i64> {
    pairs
        .iter()
        .map(|(k, v)| {
            let out = s.etcdctl(&["put", k, v, "-w", "json"]).ok();
            out.json()["header"]["revision"]
                .as_i64()
                .expect("a put answers its revision")
        })
        .collect()
}

#[test]
fn get_with_every_read_option() {
    let s = Server::under_test(&[]);
    let revs = put_all(
        &s,
        &[
            ("a", "1"),
            ("b", "22"),
            ("c", "333"),
            ("foo/1", "x"),
            ("foo/2", "y"),
            ("foo/3", "z"),
        ],
    );
    assert_eq!(
        revs,
        vec![2, 3, 4, 5, 6, 7],
        "a fresh store starts at revision 1 and each put adds one"
    );

    let out = s.etcdctl(&["get", "foo/", "--prefix"]).ok();
    assert_eq!(out.stdout, "foo/1\nx\nfoo/2\ny\nfoo/3\nz\n");

    let out = s.etcdctl(&["get", "c", "--from-key", "--keys-only"]).ok();
    assert_eq!(out.stdout, "c\n\nfoo/1\n\nfoo/2\n\nfoo/3\n\n");

    let v = s
        .etcdctl(&["get", "foo/", "--prefix", "--limit", "2", "-w", "json"])
        .ok()
        .json();
    assert_eq!(json_keys(&v), vec!["foo/1", "foo/2"]);
    assert_eq!(v["more"], true, "the limit cut the answer");
    assert_eq!(v["count"], 3, "count ignores the limit");
    assert_eq!(v["header"]["revision"], 7);

    // Overwrite b, then read it at the revision of the first write.
    put_all(&s, &[("b", "changed")]);
    let v = s
        .etcdctl(&["get", "b", "--rev", "3", "-w", "json"])
        .ok()
        .json();
    assert_eq!(v["kvs"][0]["value"], b64("22"));
    assert_eq!(v["kvs"][0]["mod_revision"], 3);
    let v = s.etcdctl(&["get", "b", "-w", "json"]).ok().json();
    assert_eq!(v["kvs"][0]["value"], b64("changed"));
    assert_eq!(v["kvs"][0]["version"], 2);
    assert_eq!(v["kvs"][0]["create_revision"], 3);
    assert_eq!(v["kvs"][0]["mod_revision"], 8);
    // At revision 4, foo/ did not exist yet.
    let v = s
        .etcdctl(&["get", "foo/", "--prefix", "--rev", "4", "-w", "json"])
        .ok()
        .json();
    assert!(v.get("kvs").is_none(), "{v}");

    let out = s
        .etcdctl(&[
            "get",
            "",
            "--from-key",
            "--sort-by",
            "MODIFY",
            "--order",
            "DESCEND",
            "--keys-only",
        ])
        .ok();
    assert_eq!(out.stdout, "b\n\nfoo/3\n\nfoo/2\n\nfoo/1\n\nc\n\na\n\n");
    let out = s
        .etcdctl(&["get", "a", "c", "--sort-by", "VALUE", "--order", "DESCEND"])
        .ok();
    assert_eq!(
        out.stdout, "b\nchanged\na\n1\n",
        "range [a, c) sorted by value, descending"
    );
    let out = s
        .etcdctl(&[
            "get",
            "",
            "--from-key",
            "--order",
            "DESCEND",
            "--limit",
            "2",
            "--keys-only",
        ])
        .ok();
    assert_eq!(out.stdout, "foo/3\n\nfoo/2\n\n");

    // etcdctl 3.4 has no --count-only (3.5 added it): the flag is refused client-side, and the
    // etcd-client tests cover count_only.
    let out = s.etcdctl(&["get", "", "--from-key", "--count-only"]);
    assert!(out.stderr.contains("unknown flag: --count-only"), "{out:?}");

    let v = s
        .etcdctl(&["get", "foo/", "--prefix", "--keys-only", "-w", "json"])
        .ok()
        .json();
    assert_eq!(json_keys(&v), vec!["foo/1", "foo/2", "foo/3"]);
    assert!(
        v["kvs"][0].get("value").is_none(),
        "keys-only drops values: {v}"
    );

    // Reads never bump the revision.
    let v = s.etcdctl(&["get", "a", "-w", "json"]).ok().json();
    assert_eq!(v["header"]["revision"], 8);
}

#[test]
fn delete_with_prev_kv_and_prefix() {
    let s = Server::under_test(&[]);
    put_all(
        &s,
        &[
            ("k1", "v1"),
            ("p/1", "a"),
            ("p/2", "b"),
            ("p/3", "c"),
            ("q", "z"),
        ],
    );
    let out = s.etcdctl(&["del", "k1", "--prev-kv"]).ok();
    assert_eq!(out.stdout, "1\nk1\nv1\n");
    let v = s
        .etcdctl(&["del", "p/", "--prefix", "--prev-kv", "-w", "json"])
        .ok()
        .json();
    assert_eq!(v["deleted"], 3);
    assert_eq!(
        v["header"]["revision"], 8,
        "one revision for the whole range delete"
    );
    let prev: Vec<String> = v["prev_kvs"]
        .as_array()
        .expect("prev_kvs")
        .iter()
        .map(|kv| crate::common::unb64(kv["value"].as_str().expect("v")))
        .collect();
    assert_eq!(prev, vec!["a", "b", "c"]);
    // Deleting nothing leaves the revision alone.
    let v = s.etcdctl(&["del", "nothing", "-w", "json"]).ok().json();
    assert_eq!(v["header"]["revision"], 8);
    assert!(v.get("deleted").is_none(), "deleted = 0 is omitted: {v}");
    let out = s.etcdctl(&["get", "", "--from-key", "--keys-only"]).ok();
    assert_eq!(out.stdout, "q\n\n");
}

#[test]
fn interactive_txn_takes_both_branches() {
    let s = Server::under_test(&[]);
    put_all(&s, &[("x", "1"), ("y", "2")]);
    let then_branch = "mod(\"x\") > \"0\"\nvalue(\"y\") = \"2\"\n\nput x 10\nget y\ndel y --prev-kv\n\nput x failed\n\n";
    let v = s
        .etcdctl_stdin(&["txn", "-i", "-w", "json"], then_branch)
        .ok()
        .json();
    assert_eq!(v["succeeded"], true);
    assert_eq!(v["header"]["revision"], 4, "one revision for the whole txn");
    let responses = v["responses"].as_array().expect("responses");
    assert_eq!(responses.len(), 3);
    assert_eq!(
        responses[1]["Response"]["ResponseRange"]["kvs"][0]["value"],
        b64("2")
    );
    assert_eq!(
        responses[2]["Response"]["ResponseDeleteRange"]["deleted"],
        1
    );
    assert_eq!(
        responses[0]["Response"]["ResponsePut"]["header"],
        serde_json::json!({"revision": 4})
    );

    let else_branch = "value(\"x\") = \"nope\"\n\nput x never\n\nget x\nput z 3\n\n";
    let out = s.etcdctl_stdin(&["txn", "-i"], else_branch).ok();
    assert!(out.stdout.ends_with("FAILURE\n\nx\n10\n\nOK\n"), "{out:?}");
    // A missing key has mod revision 0: Kubernetes' create relies on it.
    let create = "mod(\"new\") = \"0\"\n\nput new created\n\n\n";
    let out = s.etcdctl_stdin(&["txn", "-i"], create).ok();
    assert!(out.stdout.ends_with("SUCCESS\n\nOK\n"), "{out:?}");
    let out = s.etcdctl(&["get", "", "--from-key"]).ok();
    assert_eq!(out.stdout, "new\ncreated\nx\n10\nz\n3\n");
    // A read-only txn does not bump the revision.
    let v = s
        .etcdctl_stdin(&["txn", "-i", "-w", "json"], "\nget x\n\n\n")
        .ok()
        .json();
    assert_eq!(v["header"]["revision"], 6);

    let out = s.etcdctl_stdin(&["txn", "-i"], "\n\nput a 1\nput a 2\n\n\n");
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("Error: etcdserver: duplicate key given in txn request"),
        "{out:?}"
    );
}

#[test]
fn compaction_then_old_reads_fail_like_etcd() {
    let s = Server::under_test(&[]);
    put_all(&s, &[("k", "1"), ("k", "2"), ("k", "3"), ("k", "4")]);
    let out = s.etcdctl(&["compaction", "4"]).ok();
    assert_eq!(out.stdout, "compacted revision 4\n");
    let out = s.etcdctl(&["get", "k", "--rev", "3"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: mvcc: required revision has been compacted\n"),
        "{out:?}"
    );
    assert!(out.stderr.contains("code = OutOfRange"), "{out:?}");
    // The compacted revision itself is still readable.
    let out = s.etcdctl(&["get", "k", "--rev", "4"]).ok();
    assert_eq!(out.stdout, "k\n3\n");
    let out = s.etcdctl(&["compaction", "3"]);
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: mvcc: required revision has been compacted\n"),
        "{out:?}"
    );
    let out = s.etcdctl(&["compaction", "99"]);
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: mvcc: required revision is a future revision\n"),
        "{out:?}"
    );
    let out = s.etcdctl(&["get", "k", "--rev", "99"]);
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: mvcc: required revision is a future revision\n"),
        "{out:?}"
    );
    let out = s.etcdctl(&["compaction", "5", "--physical"]).ok();
    assert_eq!(out.stdout, "compacted revision 5\n");
    let out = s.etcdctl(&["get", "k"]).ok();
    assert_eq!(out.stdout, "k\n4\n");
}

#[test]
fn endpoint_status_health_and_member_list() {
    let s = Server::under_test(&[]);
    put_all(&s, &[("a", "1")]);
    let v = s.etcdctl(&["endpoint", "status", "-w", "json"]).ok().json();
    let st = &v[0]["Status"];
    assert_eq!(v[0]["Endpoint"], s.endpoint());
    assert_eq!(st["header"]["revision"], 2);
    assert_ne!(st["leader"], 0, "a single member leads itself: {v}");
    assert_eq!(st["leader"], st["header"]["member_id"]);
    assert!(
        st["dbSize"].as_i64().expect("dbSize") > 0,
        "kube-apiserver refuses dbSize 0: {v}"
    );
    assert!(st["raftIndex"].as_u64().expect("raftIndex") >= 2);
    let version = st["version"].as_str().expect("version");
    assert_eq!(version.split('.').count(), 3, "semver: {version}");

    // etcdctl 3.4 prints the health lines on stderr.
    let out = s.etcdctl(&["endpoint", "health"]).ok();
    let healthy = format!("{} is healthy: ", s.endpoint());
    assert!(out.stderr.starts_with(&healthy), "{out:?}");
    let out = s.etcdctl(&["endpoint", "health", "--cluster"]).ok();
    let healthy = format!("{} is healthy: ", s.client_url());
    assert!(
        out.stderr.starts_with(&healthy),
        "--cluster dials the advertised URL: {out:?}"
    );

    let v = s.etcdctl(&["member", "list", "-w", "json"]).ok().json();
    let members = v["members"].as_array().expect("members");
    assert_eq!(members.len(), 1);
    assert_eq!(members[0]["name"], "e2e");
    assert_eq!(
        members[0]["clientURLs"],
        serde_json::json!([s.client_url()])
    );
    assert_eq!(
        members[0]["peerURLs"],
        serde_json::json!([format!("http://127.0.0.1:{}", s.peer_port)])
    );
    assert_eq!(members[0]["ID"], st["header"]["member_id"]);
    let out = s.etcdctl(&["member", "list"]).ok();
    assert!(out.stdout.contains(", started, e2e, "), "{out:?}");
}

#[test]
fn lease_revoke_deletes_attached_keys() {
    let s = Server::under_test(&[]);
    let out = s.etcdctl(&["lease", "grant", "60"]).ok();
    // "lease 694d7a1b2c3d4e5f granted with TTL(60s)"
    let id = out
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("a lease id")
        .to_string();
    assert!(out.stdout.ends_with("granted with TTL(60s)\n"), "{out:?}");
    s.etcdctl(&["put", "leased", "v", "--lease", &id]).ok();
    s.etcdctl(&["put", "leased2", "v", "--lease", &id]).ok();
    s.etcdctl(&["put", "plain", "v"]).ok();
    let v = s.etcdctl(&["get", "leased", "-w", "json"]).ok().json();
    let lease = i64::from_str_radix(&id, 16).ok();
    assert_eq!(v["kvs"][0]["lease"].as_i64(), lease, "lease {id}");
    let out = s.etcdctl(&["lease", "revoke", &id]).ok();
    assert_eq!(out.stdout, format!("lease {id} revoked\n"));
    let v = s
        .etcdctl(&["get", "", "--from-key", "-w", "json"])
        .ok()
        .json();
    assert_eq!(json_keys(&v), vec!["plain"]);
    assert_eq!(
        v["header"]["revision"], 5,
        "the revoke deleted both keys at one revision"
    );
    let out = s.etcdctl(&["lease", "revoke", &id]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .ends_with("Error: failed to revoke lease (etcdserver: requested lease not found)\n"),
        "{out:?}"
    );
    let out = s.etcdctl(&["put", "k", "v", "--lease", &id]);
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: requested lease not found\n"),
        "{out:?}"
    );
}

/// etcdctl 3.4 dials a URL endpoint ("http://host:port") for `endpoint status` and `endpoint
/// hashkv` (and so for `--cluster`, which takes the URLs from the member list) and sends that whole URL as the
/// HTTP/2 :authority. grpc-go's server accepts it; upstream h2 rejects the stream as malformed,
/// so Keel builds with a patched h2 (third_party/README.md). This test pins that patch.
#[test]
fn endpoint_status_with_url_endpoints() {
    let s = Server::under_test(&[]);
    let v = crate::common::etcdctl_at(&s.client_url(), &["endpoint", "status", "-w", "json"], None)
        .ok()
        .json();
    assert_eq!(v[0]["Endpoint"], s.client_url());
    let out = crate::common::etcdctl_at(&s.client_url(), &["endpoint", "hashkv"], None).ok();
    assert!(
        out.stdout.starts_with(&format!("{}, ", s.client_url())),
        "{out:?}"
    );
    let v = s
        .etcdctl(&["endpoint", "status", "--cluster", "-w", "json"])
        .ok()
        .json();
    assert_eq!(v[0]["Endpoint"], s.client_url());
    assert_eq!(v[0]["Status"]["header"]["revision"], 1);
}

/// `etcdctl snapshot save` receives a non-empty stream whose remaining_bytes reaches 0 and a
/// trailing sha256; the file is an etcd 3.4 bbolt database holding every key (the e2e
/// `snapshot` tests restore such files into real etcd).
#[test]
fn snapshot_save_streams_an_etcd_database_with_every_key() {
    let s = Server::keel(&[]);
    let pairs: Vec<(String, String)> = (0..200)
        .map(|i| (format!("snap/{i:03}"), format!("value-{i}")))
        .collect();
    for (k, v) in &pairs {
        s.etcdctl(&["put", k, v]).ok();
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("backup.db");
    let path_text = path.to_str().expect("a UTF-8 temp path");
    let out = s.etcdctl(&["snapshot", "save", path_text]).ok();
    assert!(out.stdout.contains("Snapshot saved at"), "{out:?}");
    keel_core::etcd_snapshot::verify_sha256(&path).expect("the trailing sha256 matches");
    let db = keel_core::etcd_snapshot::open_file(&path).expect("a bbolt database");
    let imported = keel_core::etcd_snapshot::read_db(&db).expect("in etcd's schema");
    assert_eq!(imported.versions.len(), 200);
    assert_eq!(imported.current_rev, 201);
    let seventh = &imported.versions[7];
    assert_eq!(
        (seventh.key.as_ref(), seventh.value.as_ref()),
        (&b"snap/007"[..], &b"value-7"[..])
    );
    let status = s
        .etcdctl(&["snapshot", "status", path_text, "-w", "json"])
        .ok()
        .json();
    assert_eq!(status["revision"], 201);
}

/// A txn that deletes from "a" to the end ("\0", which etcd's duplicate-key check compares
/// literally, so it lets the txn through) and then puts "b" keeping its value: the put
/// finds the key gone. It is refused whole with etcd's "key not found" (etcd 3.4's apply
/// panicked here, on every member), and the server goes on.
#[test]
fn a_txn_keeping_the_value_of_a_key_it_deleted_is_refused() {
    let s = Server::under_test(&[]);
    put_all(&s, &[("a", "1"), ("b", "2")]);
    let out = s.etcdctl_stdin(
        &["txn", "-i"],
        "\ndel a \"\\x00\"\nput b --ignore-value\n\n\n",
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains("Error: etcdserver: key not found"),
        "{out:?}"
    );
    let out = s.etcdctl(&["get", "", "--from-key"]).ok();
    assert_eq!(out.stdout, "a\n1\nb\n2\n", "nothing was deleted");
    s.etcdctl(&["put", "c", "3"]).ok();
}
