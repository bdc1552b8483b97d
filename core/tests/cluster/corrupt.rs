//! Corruption checks, as etcd 3.4's: a member whose data differs from its peers' refuses to
//! start under `--experimental-initial-corrupt-check`, and the leader's periodic check
//! (`--experimental-corrupt-check-time`) raises the CORRUPT alarm naming it. A test-only knob
//! damages one stored value of a member at start.

use std::time::{Duration, Instant};

use crate::harness::{Cluster, Net};

const FLIP_ENV: &str = "KEEL_TEST_FLIP_VALUE_OF";

#[test]
fn corrupt_members_are_refused_at_start_and_found_by_the_leader() {
    let mut c = Cluster::start(
        3,
        Net::Loopback,
        &["--experimental-corrupt-check-time", "1s"],
    );
    let all = [0, 1, 2];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let follower = (leader + 1) % 3;
    c.etcdctl(leader, &["put", "victim", "good value"]).ok();
    // Writes while the periodic check runs must never look like corruption.
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        c.etcdctl(i % 3, &["put", &format!("k/{i}"), "v"]).ok();
        i += 1;
    }
    c.wait_converged(&all, Duration::from_secs(10));
    let out = c.etcdctl(leader, &["alarm", "list"]).ok();
    assert_eq!(out.stdout.trim(), "", "a false alarm on healthy members");

    // A damaged member started with the initial check refuses to serve.
    assert!(c.stop(follower).success());
    c.members[follower]
        .env
        .push((FLIP_ENV.to_string(), "victim".to_string()));
    c.members[follower]
        .extra_args
        .push("--experimental-initial-corrupt-check".to_string());
    c.relaunch(follower);
    let status = c.members[follower]
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("a corrupt member started:\n{}", c.log_tails(&[follower])));
    assert!(!status.success());
    let log = c.members[follower].log_all();
    assert!(
        log.contains("found data inconsistency with peers"),
        "the log does not say why:\n{log}"
    );

    // Started without the initial check, the leader's periodic check finds it.
    c.members[follower].extra_args.pop();
    // Not `restart`: its readiness probe (`endpoint health`) fails once the alarm is raised.
    c.relaunch(follower);
    let follower_id = u64::from_str_radix(&c.member_hex_id(leader, follower), 16).expect("hex");
    let expected = format!("memberID:{follower_id} alarm:CORRUPT");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.etcdctl(leader, &["alarm", "list"]).ok();
        if out.stdout.trim() == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no CORRUPT alarm for n{follower}: {:?}\n{}",
            out.stdout,
            c.log_tails(&[leader])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every member refuses writes while CORRUPT is raised.
    for i in all {
        // The member just restarted may not listen yet (relaunch does not wait for it: its
        // readiness probe fails under the alarm), nor know the leader: it refuses connections,
        // then answers "no leader", until it does.
        let deadline = Instant::now() + Duration::from_secs(10);
        let put = loop {
            let put = c.etcdctl(i, &["put", "after", "x"]);
            let not_yet = put.stderr.contains("etcdserver: no leader")
                || put.stderr.contains("TransientFailure");
            if !not_yet || Instant::now() > deadline {
                break put;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            put.stderr.contains("etcdserver: corrupt cluster"),
            "member n{i} took a write under CORRUPT: {put:?}"
        );
    }
}
