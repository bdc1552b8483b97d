//! Replication on a healthy cluster: a write through any member is visible to a linearizable
//! read through every member, immediately.

use std::time::{Duration, Instant};

use crate::common::{json_of, unb64};
use crate::harness::{Cluster, Net};

fn write_everywhere_read_everywhere(count: usize) {
    let mut c = Cluster::start(count, Net::Loopback, &[]);
    let all: Vec<usize> = (0..count).collect();
    let (leader, status, _) = c.wait_leader(&all, Duration::from_secs(10));
    // Every member agrees on who leads.
    for i in 0..count {
        let s = c.status(i).expect("a healthy member answers status");
        assert_eq!(
            s.leader, status.member_id,
            "member {i} follows {:x}, not the leader n{leader}",
            s.leader
        );
    }
    for i in 0..count {
        c.etcdctl(i, &["put", &format!("from/n{i}"), &format!("value-{i}")])
            .ok();
        // Read-your-writes across members: the very next linearizable read elsewhere sees it.
        let other = (i + 1) % count;
        let out = c
            .etcdctl(other, &["get", &format!("from/n{i}"), "--print-value-only"])
            .ok();
        assert_eq!(
            out.stdout.trim(),
            format!("value-{i}"),
            "member {other} missed the write just acknowledged by member {i}"
        );
    }
    for reader in 0..count {
        let out = c
            .etcdctl(reader, &["get", "from/", "--prefix", "-w", "json"])
            .ok();
        let v = json_of(&out.stdout).expect("get -w json prints JSON");
        let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
        let got: Vec<(String, String)> = kvs
            .iter()
            .map(|kv| {
                (
                    unb64(kv["key"].as_str().expect("a key")),
                    unb64(kv["value"].as_str().expect("a value")),
                )
            })
            .collect();
        let want: Vec<(String, String)> = (0..count)
            .map(|i| (format!("from/n{i}"), format!("value-{i}")))
            .collect();
        assert_eq!(got, want, "member {reader} reads a different set of keys");
    }
    c.wait_converged(&all, Duration::from_secs(10));

    // A follower stopped gracefully misses writes, then catches up after a restart.
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let follower = (leader + 1) % count;
    let exit = c.stop(follower);
    assert!(
        exit.success(),
        "SIGTERM should end keel cleanly, got {exit}"
    );
    c.etcdctl(leader, &["put", "while-stopped", "missed"]).ok();
    c.restart(follower);
    let out = c
        .etcdctl(follower, &["get", "while-stopped", "--print-value-only"])
        .ok();
    assert_eq!(
        out.stdout.trim(),
        "missed",
        "the restarted follower serves stale data"
    );

    // Leadership moves on request (etcdctl move-leader, sent to the leader).
    let target = (leader + 2) % count;
    let target_id = format!("{:x}", c.status(target).expect("target answers").member_id);
    c.etcdctl(leader, &["move-leader", &target_id]).ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = c.leader_among(&all).map(|(i, _)| i);
        if now == Some(target) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "move-leader to n{target}: n{now:?} still leads"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.wait_converged(&all, Duration::from_secs(10));
}

#[test]
fn three_members_replicate_writes_from_every_member() {
    write_everywhere_read_everywhere(3);
}

#[test]
fn five_members_replicate_writes_from_every_member() {
    write_everywhere_read_everywhere(5);
}

/// Lease clocks live on the leader: a keep-alive sent to a follower is forwarded to it, and
/// the lease survives well past its TTL while kept alive through followers only.
#[test]
fn keep_alives_through_followers_reach_the_leader() {
    let c = Cluster::start(3, Net::Loopback, &[]);
    let all = [0, 1, 2];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let follower = (leader + 1) % 3;
    let grant = c.etcdctl(follower, &["lease", "grant", "3"]).ok();
    let id = grant
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("`lease <id> granted with TTL(3s)`")
        .to_string();
    c.etcdctl(follower, &["put", "--lease", &id, "kept", "alive"])
        .ok();
    let until = Instant::now() + Duration::from_secs(7);
    let mut through_follower = 0;
    while Instant::now() < until {
        let out = c
            .etcdctl(follower, &["lease", "keep-alive", "--once", &id])
            .ok();
        assert!(
            out.stdout.contains("keepalived with TTL(3)"),
            "a follower must forward keep-alives to the leader: {out:?}"
        );
        through_follower += 1;
        std::thread::sleep(Duration::from_millis(700));
    }
    // The leader answers its own clients' keep-alives on the shard that took them (its raft
    // core is not asked); the follower's all went through its raft core to the leader.
    for _ in 0..5 {
        c.etcdctl(leader, &["lease", "keep-alive", "--once", &id])
            .ok();
    }
    let answered = |i: usize| -> (u64, u64) {
        let addr = c.members[i]
            .client_url()
            .trim_start_matches("http://")
            .to_string();
        let (code, body) = crate::common::http_get(&addr, "/metrics");
        assert_eq!(code, 200);
        let series = |on: &str| {
            let series = format!("keel_lease_keepalives_total{{answered_on=\"{on}\"}}");
            crate::common::metric_value(&body, &series)
        };
        (series("shard"), series("raft_core"))
    };
    assert_eq!(
        answered(follower),
        (0, through_follower),
        "(shard, raft core) on the follower"
    );
    let (on_shard, on_raft_core) = answered(leader);
    assert_eq!(on_shard + on_raft_core, 5, "each keep-alive counted once");
    assert!(
        on_shard >= 1,
        "the leader answered none of its clients' keep-alives on a shard"
    );
    // 7 s past a 3 s TTL: only the forwarded keep-alives kept it.
    let out = c
        .etcdctl(leader, &["get", "kept", "--print-value-only"])
        .ok();
    assert_eq!(
        out.stdout.trim(),
        "alive",
        "the lease expired despite keep-alives"
    );
}

/// The peer series etcd's dashboards plot (traffic per peer, the leader's round trip to each
/// follower) have samples, labelled with the peer's hex id, once members talk.
#[test]
fn peer_metrics_have_samples_in_a_cluster() {
    let mut c = Cluster::start(3, Net::Loopback, &[]);
    let all = [0, 1, 2];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    c.etcdctl(leader, &["put", "k", "v"]).ok();
    // Heartbeats go out every tick; give a few of them time to come back.
    std::thread::sleep(Duration::from_millis(500));
    let addr = c.members[leader]
        .client_url()
        .trim_start_matches("http://")
        .to_string();
    let (code, body) = crate::common::http_get(&addr, "/metrics");
    assert_eq!(code, 200);
    for i in all.into_iter().filter(|&i| i != leader) {
        let id = c.member_hex_id(leader, i);
        for series in [
            format!("etcd_network_peer_sent_bytes_total{{To=\"{id}\"}} "),
            format!("etcd_network_peer_received_bytes_total{{From=\"{id}\"}} "),
            format!("etcd_network_peer_round_trip_time_seconds_count{{To=\"{id}\"}} "),
        ] {
            let value: f64 = body
                .lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .unwrap_or_else(|| panic!("no {series} in\n{body}"))
                .parse()
                .expect("a number");
            assert!(value > 0.0, "{series}{value}");
        }
    }
    assert!(body.contains("\netcd_server_is_leader 1\n"), "{body}");
    for i in all {
        c.stop(i);
    }
}

/// Keys the mass-delete test loads: one apply of their delete took 1.1-1.5 s, past an
/// election timeout.
const MASS_DELETE_KEYS: usize = 1_000_000;
/// The longest a member may spend applying without its loop turning, in the test below: a
/// step of `limits::APPLY_KEYS_PER_STEP` keys takes tens of milliseconds. A bucket bound of
/// `etcd_disk_backend_commit_duration_seconds`.
const APPLY_PAUSE_MAX_S: &str = "0.512";

/// A delete of a million keys costs the cluster neither its leader nor an election: each
/// member applies it in steps, turning its raft loop between them, where one apply had
/// stalled each member past an election timeout (in one run the cluster changed leaders
/// three times; whether it does depends on how the stalls line up, so the test also bounds
/// the longest apply each member timed). The delete is whole when answered, and every
/// member agrees on what is left.
#[test]
fn a_delete_of_many_keys_keeps_the_leader() {
    use etcd_client::{Client, DeleteOptions, GetOptions, Txn, TxnOp};
    let c = Cluster::start(3, Net::Loopback, &[]);
    let all = [0, 1, 2];
    let (leader, before, _) = c.wait_leader(&all, Duration::from_secs(10));
    let url = c.members[leader].client_url();
    let started = Instant::now();
    let loaded_ms = crate::block_on(async {
        let client = Client::connect([url.as_str()], None)
            .await
            .expect("etcd-client connects");
        // Txns of 128 puts (etcd's --max-txn-ops), eight at a time.
        let chunks: Vec<Vec<usize>> = (0..MASS_DELETE_KEYS)
            .collect::<Vec<_>>()
            .chunks(128)
            .map(<[usize]>::to_vec)
            .collect();
        for group in chunks.chunks(8) {
            let mut calls = Vec::new();
            for chunk in group {
                let mut kv = client.kv_client();
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|i| TxnOp::put(format!("mass/{i:07}"), "v", None))
                    .collect();
                calls.push(async move { kv.txn(Txn::new().and_then(ops)).await });
            }
            for r in futures_util::future::join_all(calls).await {
                r.expect("a txn of puts");
            }
        }
        let loaded_ms = started.elapsed().as_millis();
        let mut kv = client.kv_client();
        // Hash (which captures the store on the raft core, as a snapshot does) asked while the
        // delete is half applied waits for it rather than seeing part of it.
        let mut maintenance = client.maintenance_client();
        let (deleted, hash) = tokio::join!(
            kv.delete("mass/", Some(DeleteOptions::new().with_prefix())),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                maintenance.hash().await
            }
        );
        let deleted = deleted.expect("the delete is answered");
        let hash = hash.expect("Hash is answered");
        assert_eq!(
            hash.header().expect("a header").revision(),
            deleted.header().expect("a header").revision(),
            "Hash saw the store after the whole delete"
        );
        assert_eq!(deleted.deleted(), MASS_DELETE_KEYS as i64);
        let left = kv
            .get(
                "mass/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("a count");
        assert_eq!(left.count(), 0, "the delete is whole once answered");
        loaded_ms
    });
    let deleted_ms = started.elapsed().as_millis() - loaded_ms;
    eprintln!("loaded {MASS_DELETE_KEYS} keys in {loaded_ms} ms; deleted them in {deleted_ms} ms");
    let (after_leader, after, _) = c.wait_leader(&all, Duration::from_secs(10));
    assert_eq!(
        (after_leader, after.raft_term),
        (leader, before.raft_term),
        "the leader changed, or an election was held, during the delete\n{}",
        c.log_tails(&all)
    );
    c.wait_converged(&all, Duration::from_secs(30));
    for (i, m) in c.members.iter().enumerate() {
        let addr = m.client_url().trim_start_matches("http://").to_string();
        let (code, body) = crate::common::http_get(&addr, "/metrics");
        assert_eq!(code, 200);
        let series = "etcd_disk_backend_commit_duration_seconds";
        let within = crate::common::metric_value(
            &body,
            &format!("{series}_bucket{{le=\"{APPLY_PAUSE_MAX_S}\"}}"),
        );
        let all_applies = crate::common::metric_value(&body, &format!("{series}_count"));
        assert_eq!(
            within, all_applies,
            "member n{i} applied for longer than {APPLY_PAUSE_MAX_S} s at once"
        );
    }
}

/// A follower applies a txn that compares a value it holds only on disk (its copy came from
/// the leader's appends, and it wrote it with O_DIRECT: no page of it is in memory). Its
/// raft core does not wait for the disk: the pager brings the value in first, so the raft
/// thread takes no major fault for it (a few allowed for code pages), and the compare sees
/// the value.
#[test]
fn followers_bring_compared_values_in_off_the_raft_core() {
    use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
    const KEYS: usize = 64;
    const VALUE_BYTES: usize = 4096;
    // Small segments, so most values are in durable (mapped) segment files soon.
    let c = Cluster::start(3, Net::Loopback, &["--value-log-segment-bytes", "65536"]);
    let all = [0, 1, 2];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let value_of = |i: usize| vec![b'a' + (i % 26) as u8; VALUE_BYTES];
    let url = c.members[leader].client_url();
    let followers: Vec<usize> = all.into_iter().filter(|&i| i != leader).collect();
    let mut faults_before: Vec<u64> = Vec::new();
    crate::block_on(async {
        let mut client = Client::connect([url.as_str()], None)
            .await
            .expect("etcd-client connects");
        for i in 0..KEYS {
            client
                .put(format!("cmp/{i:03}"), value_of(i), None)
                .await
                .expect("put");
        }
        // The value-log writers make the sealed segments durable beside the raft loops.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        faults_before = followers
            .iter()
            .map(|&i| crate::common::major_faults_of(c.members[i].pid(), "keel-raft"))
            .collect();
        for i in 0..KEYS / 2 {
            let key = format!("cmp/{i:03}");
            let txn = Txn::new()
                .when([Compare::value(key.as_str(), CompareOp::Equal, value_of(i))])
                .and_then([TxnOp::put(format!("seen/{i:03}"), "yes", None)]);
            let r = client.txn(txn).await.expect("txn");
            assert!(r.succeeded(), "{key} compared equal");
        }
    });
    c.wait_converged(&all, Duration::from_secs(30));
    for (&i, before) in followers.iter().zip(faults_before) {
        let m = &c.members[i];
        let addr = m.client_url().trim_start_matches("http://").to_string();
        let (code, body) = crate::common::http_get(&addr, "/metrics");
        assert_eq!(code, 200);
        let paged =
            crate::common::metric_value(&body, r#"keel_pager_reads_total{outcome="paged"}"#);
        // 32 compared values: a raft core reading them itself took 35 major faults in all.
        let raft = crate::common::major_faults_of(m.pid(), "keel-raft") - before;
        assert!(
            raft <= 3,
            "follower n{i}'s raft core waited on the disk {raft} times: {:?}",
            crate::common::major_faults_by_thread(m.pid())
        );
        assert!(paged > 0, "follower n{i} handed no read to its pager");
    }
}

/// A peer connection's read deadline (etcd's `ConnReadTimeout`): a dialer that never completes
/// its handshake is hung up on after `PEER_CONN_TIMEOUT`; a dialer whose handshake
/// says it writes link heartbeats is hung up on once it goes silent for
/// `PEER_CONN_TIMEOUT`, and kept while it writes them. (A partition that drops packets but
/// leaves the connection open then ends it, so what the dialer's kernel still holds is not
/// delivered in one burst when the partition heals.)
#[test]
fn a_silent_peer_connection_is_closed_at_its_deadline_and_link_heartbeats_keep_one_open() {
    use keel_core::peer::{encode_hello, Hello, PEER_CONN_TIMEOUT};
    use std::io::{Read, Write};
    let c = Cluster::start(1, Net::Loopback, &[]);
    let status = c.etcdctl(0, &["endpoint", "status", "-w", "json"]).ok();
    let v = json_of(&status.stdout).expect("endpoint status prints JSON");
    let header = &v[0]["Status"]["header"];
    let hello = encode_hello(&Hello {
        cluster_id: header["cluster_id"].as_u64().expect("a cluster id"),
        from: 0x5eed,
        to: header["member_id"].as_u64().expect("a member id"),
        peer_urls: vec!["http://127.0.0.1:9".into()],
    });
    let m = &c.members[0];
    let dial = || {
        let mut s = std::net::TcpStream::connect((m.host.as_str(), m.peer_port))
            .expect("the peer port accepts");
        s.write_all(&hello).expect("the handshake is sent");
        s.set_read_timeout(Some(PEER_CONN_TIMEOUT * 3))
            .expect("a read timeout");
        s
    };
    // A dialer that never sends its handshake, or only its first bytes, is no member: it is
    // hung up on at the same deadline (it held the connection for good before).
    let mute = |first: &[u8]| {
        let mut s = std::net::TcpStream::connect((m.host.as_str(), m.peer_port))
            .expect("the peer port accepts");
        s.write_all(first).expect("the first bytes are sent");
        s.set_read_timeout(Some(PEER_CONN_TIMEOUT * 3))
            .expect("a read timeout");
        s
    };
    let started = Instant::now();
    for mut s in [mute(&[]), mute(&hello[..6])] {
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            // Closed with bytes unread: a reset is a hang-up too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Ok(n) => panic!("the member wrote {n} bytes to a dialer without a handshake"),
            Err(e) => panic!("a dialer without a handshake was not hung up on: {e}"),
        }
    }
    let closed_after = started.elapsed();
    assert!(
        closed_after >= PEER_CONN_TIMEOUT - Duration::from_millis(200)
            && closed_after < PEER_CONN_TIMEOUT * 2,
        "connections without a handshake were closed after {closed_after:?}"
    );
    // Silent after its handshake and one link heartbeat (the deadline starts at a
    // connection's first frame: a snapshot stream's sender lists its files first): closed
    // once the deadline passes, not before.
    let link_heartbeat = [0u8, 0, 0, 1, 8];
    let mut silent = dial();
    silent
        .write_all(&link_heartbeat)
        .expect("a link heartbeat is sent");
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = silent.read(&mut buf).unwrap_or(0);
    let closed_after = started.elapsed();
    assert_eq!(n, 0, "the member wrote to a silent dialer");
    assert!(
        closed_after >= PEER_CONN_TIMEOUT - Duration::from_millis(200)
            && closed_after < PEER_CONN_TIMEOUT * 2,
        "a silent peer connection was closed after {closed_after:?}"
    );
    // A link heartbeat (an empty frame of kind 8) a second keeps another open past it.
    let mut beating = dial();
    let until = Instant::now() + PEER_CONN_TIMEOUT * 2;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(1));
        beating
            .write_all(&link_heartbeat)
            .expect("a connection with link heartbeats stays open");
    }
    beating
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    match beating.read(&mut buf) {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        other => panic!("the member hung up on a dialer that sent link heartbeats: {other:?}"),
    }
}

/// The other side of the read deadline: a member whose connection to a peer has nothing to
/// carry writes a link heartbeat (an empty frame of kind 8) on it well within
/// `PEER_CONN_TIMEOUT`, so the peer does not hang up on a quiet but live connection. The
/// leader of two is killed and a plain listener takes its peer port: the follower, whose
/// election timeout is long, dials it and has nothing to send for seconds.
#[test]
fn a_member_with_nothing_to_send_to_a_peer_writes_link_heartbeats() {
    use keel_core::peer::PEER_CONN_TIMEOUT;
    use std::io::Read;
    let mut c = Cluster::start(
        2,
        Net::Loopback,
        &[
            "--heartbeat-interval",
            "1000",
            "--election-timeout",
            "20000",
        ],
    );
    let (leader, _, _) = c.wait_leader(&[0, 1], Duration::from_secs(30));
    let (host, port) = (c.members[leader].host.clone(), c.members[leader].peer_port);
    c.kill9(leader);
    // The killed process lets go of its port once the kernel has closed its sockets.
    let bound_by = Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match std::net::TcpListener::bind((host.as_str(), port)) {
            Ok(l) => break l,
            Err(_) if Instant::now() < bound_by => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("the dead leader's peer port stays taken: {e}"),
        }
    };
    let (mut conn, _) = listener
        .accept()
        .expect("the follower dials its peer again");
    conn.set_read_timeout(Some(PEER_CONN_TIMEOUT))
        .expect("a read timeout");
    let mut read_frame = || -> Option<Vec<u8>> {
        let mut len = [0u8; 4];
        conn.read_exact(&mut len).ok()?;
        let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
        conn.read_exact(&mut frame).ok()?;
        Some(frame)
    };
    let hello = read_frame().expect("the follower's handshake");
    assert!(hello.starts_with(b"KEELPEER"), "not a handshake: {hello:?}");
    let started = Instant::now();
    loop {
        let frame = read_frame().unwrap_or_else(|| {
            panic!(
                "no link heartbeat within {:?} of the handshake",
                started.elapsed()
            )
        });
        if frame == [8] {
            break;
        }
        assert!(
            started.elapsed() < PEER_CONN_TIMEOUT,
            "frames but no link heartbeat for {:?}",
            started.elapsed()
        );
    }
    assert!(
        started.elapsed() < PEER_CONN_TIMEOUT / 2,
        "the first link heartbeat came {:?} after the handshake",
        started.elapsed()
    );
}
