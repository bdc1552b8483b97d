//! Moving a cluster from etcd: three Keel members restored from one etcd 3.4 snapshot with the
//! same flags (`keel snapshot restore`, as `etcdctl snapshot restore` is used) form a working
//! cluster that holds every key with its revisions and the auth store's users and roles, and
//! serves writes on from there.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::Server;
use crate::harness::{Cluster, Net};

#[test]
fn three_members_restored_from_one_etcd_snapshot_form_a_cluster() {
    let etcd = Server::etcd(&[]);
    for round in 0..3 {
        for i in 0..20 {
            etcd.etcdctl(&["put", &format!("k/{i:02}"), &format!("v{round}-{i}")])
                .ok();
        }
    }
    etcd.etcdctl(&["del", "k/05"]).ok();
    etcd.etcdctl(&["compact", "30"]).ok();
    let lease = etcd.etcdctl(&["lease", "grant", "900"]).ok();
    let lease_id = lease
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("etcdctl prints the lease id")
        .to_string();
    etcd.etcdctl(&["put", "leased", "x", "--lease", &lease_id])
        .ok();
    // Users and roles, auth left disabled (so the harness's anonymous checks still work):
    // every member restores them from the file.
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "reader"],
        &[
            "role",
            "grant-permission",
            "reader",
            "--prefix",
            "read",
            "k/",
        ],
        &["user", "grant-role", "alice", "reader"],
    ] {
        etcd.etcdctl(args).ok();
    }
    let want_users = etcd.etcdctl(&["user", "list"]).ok().stdout;
    let want_role = etcd.etcdctl(&["role", "get", "reader"]).ok().stdout;
    let want_alice = etcd.etcdctl(&["user", "get", "alice"]).ok().stdout;
    let want = etcd
        .etcdctl(&["get", "", "--from-key", "-w", "json"])
        .ok()
        .json();
    let want_revision = want["header"]["revision"].as_i64().expect("a revision");
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("etcd.db");
    let file_text = file.to_str().expect("a UTF-8 temp path").to_string();
    etcd.etcdctl(&["snapshot", "save", &file_text]).ok();
    drop(etcd);

    let cluster = Cluster::start_prepared(3, Net::Loopback, &[], &|member, initial_cluster| {
        let out = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["snapshot", "restore", &file_text])
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-advertise-peer-urls", &member.peer_url()])
            .args(["--initial-cluster-token", "restored-token"])
            .stdin(Stdio::null())
            .output()
            .expect("keel snapshot restore runs");
        assert!(out.status.success(), "{out:?}");
    });
    let (leader, status, _) = cluster.wait_leader(&[0, 1, 2], Duration::from_secs(20));
    assert!(status.leader != 0, "{status:?}");
    // Every member holds every key with etcd's revisions and versions.
    for i in 0..3 {
        let got = cluster
            .etcdctl(
                i,
                &["get", "", "--from-key", "--consistency=s", "-w", "json"],
            )
            .ok()
            .json();
        assert_eq!(got["kvs"], want["kvs"], "member {i}");
        assert_eq!(got["header"]["revision"], want_revision, "member {i}");
        let users = cluster.etcdctl(i, &["user", "list"]).ok().stdout;
        assert_eq!(users, want_users, "member {i}");
        let role = cluster.etcdctl(i, &["role", "get", "reader"]).ok().stdout;
        assert_eq!(role, want_role, "member {i}");
        let alice = cluster.etcdctl(i, &["user", "get", "alice"]).ok().stdout;
        assert_eq!(alice, want_alice, "member {i}");
    }
    let leases = cluster.etcdctl(leader, &["lease", "list"]).ok();
    assert!(
        leases.stdout.contains(&lease_id),
        "the lease survives: {leases:?}"
    );
    let members = cluster.member_list(0);
    assert_eq!(members.len(), 3, "{members:?}");
    // The cluster replicates new writes from the restored revision on.
    cluster.etcdctl(1, &["put", "after", "restore"]).ok();
    let (revision, kvs) = cluster.wait_converged(&[0, 1, 2], Duration::from_secs(20));
    assert_eq!(revision, want_revision + 1);
    assert!(kvs.iter().any(|(k, v, _)| k == "after" && v == "restore"));
    let compacted = cluster.etcdctl(2, &["get", "k/00", "--rev", "29"]);
    assert!(
        compacted
            .stderr
            .contains("required revision has been compacted"),
        "{compacted:?}"
    );
}
