//! The auth store travels in a leader's snapshot: a learner that catches up by snapshot knows
//! the users, roles and permissions created before it joined, and enforces them once auth is
//! enabled.

use std::time::{Duration, Instant};

use etcd_client::Client;

use crate::block_on;
use crate::harness::{Cluster, Net, Voting};

/// Several times the snapshot count, so the learner is served a snapshot.
const KEYS_BEFORE_JOIN: usize = 300;

#[test]
fn a_learner_gets_the_auth_store_in_the_leaders_snapshot() {
    let mut c = Cluster::start(3, Net::Loopback, &["--snapshot-count", "50"]);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "pre"],
        &[
            "role",
            "grant-permission",
            "pre",
            "--prefix",
            "readwrite",
            "pre/",
        ],
        &["user", "grant-role", "alice", "pre"],
    ] {
        c.etcdctl(0, args).ok();
    }
    let url = c.members[0].client_url();
    block_on(async {
        let mut client = Client::connect([url.as_str()], None)
            .await
            .expect("etcd-client connects");
        for i in 0..KEYS_BEFORE_JOIN {
            client
                .put(format!("pre/{i:04}"), "v", None)
                .await
                .expect("put");
        }
        client.put("secret", "s", None).await.expect("put");
    });
    let learner = c.add_member(0, "n3", Voting::Learner, None);
    c.wait_converged(&[0, 1, 2, learner], Duration::from_secs(30));
    assert!(
        c.members[learner]
            .log_all()
            .contains("installed the leader's snapshot"),
        "the learner caught up without a snapshot:\n{}",
        c.members[learner].log_tail()
    );
    c.etcdctl(0, &["auth", "enable"]).ok();
    // The learner serves serializable reads; alice authenticates through the leader.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.etcdctl(
            learner,
            &[
                "--user",
                "alice:alicepw",
                "get",
                "pre/0001",
                "--consistency=s",
            ],
        );
        if out.code == 0 {
            assert_eq!(out.stdout, "pre/0001\nv\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alice cannot read on the learner: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = c.etcdctl(
        learner,
        &[
            "--user",
            "alice:alicepw",
            "get",
            "secret",
            "--consistency=s",
        ],
    );
    assert!(
        out.stderr.contains("etcdserver: permission denied"),
        "the learner enforces the snapshot's permissions: {out:?}"
    );
    let out = c.etcdctl(learner, &["get", "secret", "--consistency=s"]);
    assert!(
        out.stderr.contains("etcdserver: user name is empty"),
        "{out:?}"
    );
}
