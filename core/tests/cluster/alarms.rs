//! The NOSPACE alarm is cluster state, as in etcd: raised through raft by the member whose
//! store would pass the quota, visible on every member, refusing writes everywhere, and
//! disarmed for all members at once.

use std::time::Duration;

use crate::block_on;
use crate::harness::{Cluster, Net};

const QUOTA_BYTES: usize = 4 * 1024 * 1024;

#[test]
fn nospace_is_raised_through_raft_seen_everywhere_and_disarmed_everywhere() {
    block_on(nospace_scenario());
}

async fn nospace_scenario() {
    let quota = QUOTA_BYTES.to_string();
    let c = Cluster::start(3, Net::Loopback, &["--quota-backend-bytes", &quota]);
    let all = [0, 1, 2];
    c.wait_leader(&all, Duration::from_secs(10));
    let mut client = etcd_client::Client::connect([c.members[1].client_url()], None)
        .await
        .expect("etcd-client connects");
    let value = vec![b'q'; 256 * 1024];
    let mut written = 0;
    let refused = loop {
        match client
            .put(format!("big/{written}"), value.clone(), None)
            .await
        {
            Ok(_) => written += 1,
            Err(e) => break e.to_string(),
        }
        assert!(written < 64, "a 4 MiB quota took {written} puts of 256 KiB");
    };
    assert!(
        refused.contains("etcdserver: mvcc: database space exceeded"),
        "{refused}"
    );
    // The member that refused raised the alarm; every member lists it.
    let raiser = c.member_hex_id(1, 1);
    let raiser_dec = u64::from_str_radix(&raiser, 16).expect("hex id");
    let expected = format!("memberID:{raiser_dec} alarm:NOSPACE");
    for i in all {
        let out = c.etcdctl(i, &["alarm", "list"]).ok();
        assert_eq!(out.stdout.trim(), expected, "member n{i}");
        // And refuses writes, whichever member takes them.
        let put = c.etcdctl(i, &["put", "small", "x"]);
        assert!(
            put.stderr
                .contains("etcdserver: mvcc: database space exceeded"),
            "member n{i} took a put under NOSPACE: {put:?}"
        );
    }
    // Free the space on every member, then disarm once.
    c.etcdctl(0, &["del", "big/", "--prefix"]).ok();
    let rev = c.status(0).expect("status").revision;
    c.etcdctl(0, &["compact", &rev.to_string(), "--physical"])
        .ok();
    for i in all {
        c.etcdctl(i, &["defrag"]).ok();
    }
    let out = c.etcdctl(2, &["alarm", "disarm"]).ok();
    assert_eq!(out.stdout.trim(), expected);
    for i in all {
        let out = c.etcdctl(i, &["alarm", "list"]).ok();
        assert_eq!(out.stdout.trim(), "", "member n{i} still lists an alarm");
        c.etcdctl(i, &["put", &format!("after/{i}"), "v"]).ok();
    }
    for i in 0..6 {
        client
            .put(format!("again/{i}"), value.clone(), None)
            .await
            .unwrap_or_else(|e| panic!("put {i} after disarm: {e}"));
    }
}
