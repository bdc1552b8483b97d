//! What an etcd operator's tooling sees besides the API: the lifecycle lines etcd logs (in
//! etcd's words), unix-socket client URLs, and the HTTP-only metrics listener.

use std::time::Duration;

use crate::common::{etcdctl_at, free_port, http_get, http_request, Kind, Server};

/// Lines operators and tools grep an etcd log for. Each must be in Keel's log and, to prove
/// it is etcd's wording, in etcd 3.4's log under one of its two loggers (capnslog, the
/// default, or zap).
fn lifecycle_phrases(client_addr: &str) -> Vec<String> {
    vec![
        "starting member".into(),
        "listening for peers on".into(),
        "became leader at term".into(),
        "elected leader".into(),
        "published local member to cluster through raft".into(),
        "set the initial cluster version to".into(),
        "enabled capabilities for version".into(),
        "ready to serve client requests".into(),
        format!("serving insecure client requests on {client_addr}, this is strongly discouraged!"),
    ]
}

/// The server's log once the lines logged after readiness had time to land.
fn settled_log(server: &Server, last_phrase: &str) -> String {
    settled_log_with(server, &[last_phrase])
}

/// The server's log once every phrase is in it, or after 5 s. Not only the last: a member's
/// publish of itself lands after its first fdatasync, which a loaded disk can delay past the
/// lines logged when the shards start serving.
fn settled_log_with(server: &Server, phrases: &[&str]) -> String {
    for _ in 0..50 {
        let log = server.log_text();
        if phrases.iter().all(|p| log.contains(p)) {
            return log;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    server.log_text()
}

#[test]
fn lifecycle_lines_are_etcds() {
    let mut keel = Server::keel(&[]);
    let phrases = lifecycle_phrases(&keel.endpoint());
    let wanted: Vec<&str> = phrases.iter().map(String::as_str).collect();
    let keel_log = settled_log_with(&keel, &wanted);
    keel.stop();
    let mut etcd_capnslog = Server::etcd(&[]);
    let capnslog = settled_log(&etcd_capnslog, "strongly discouraged");
    let capnslog_addr = etcd_capnslog.endpoint();
    etcd_capnslog.stop();
    let mut etcd_zap = Server::etcd(&["--logger=zap", "--log-outputs=stderr"]);
    let zap = settled_log(&etcd_zap, "strongly discouraged");
    etcd_zap.stop();
    for phrase in &phrases {
        assert!(
            keel_log.contains(phrase.as_str()),
            "Keel's log lacks {phrase:?}:\n{keel_log}"
        );
        let etcd_phrase = phrase.replace(&keel.endpoint(), &capnslog_addr);
        assert!(
            capnslog.contains(&etcd_phrase) || zap.contains(&etcd_phrase),
            "etcd logs no {etcd_phrase:?}: not etcd's words\n{capnslog}\n{zap}"
        );
    }
}

#[test]
fn etcdctl_reaches_a_unix_socket_as_on_etcd() {
    for kind in [Kind::Keel, Kind::Etcd] {
        let (client, peer) = (free_port(), free_port());
        // A path relative to the server's working directory: etcd reads `unix://host:port` as
        // the file "host:port" (its flag parser insists on that form).
        let urls = format!("http://127.0.0.1:{client},unix://member.sock:1");
        let mut server = Server::start_on(kind, client, peer, &["--listen-client-urls", &urls]);
        let socket = server.dir.path().join("member.sock:1");
        let endpoint = format!("unix://{}", socket.display());
        let put = etcdctl_at(&endpoint, &["put", "over/unix", "yes"], None);
        assert_eq!(put.code, 0, "{kind:?}: {put:?}");
        let get = etcdctl_at(&endpoint, &["get", "over/unix", "--print-value-only"], None).ok();
        assert_eq!(get.stdout.trim(), "yes", "{kind:?}");
        // The TCP listener serves the same store.
        let tcp = server
            .etcdctl(&["get", "over/unix", "--print-value-only"])
            .ok();
        assert_eq!(tcp.stdout.trim(), "yes", "{kind:?}");
        if kind == Kind::Keel {
            let log = server.log_text();
            assert!(
                log.contains("serving insecure client requests on member.sock:1"),
                "{log}"
            );
        }
        server.stop();
    }
}

#[test]
fn the_metrics_listener_serves_metrics_and_health_but_not_the_api() {
    for kind in [Kind::Keel, Kind::Etcd] {
        let metrics_port = free_port();
        let url = format!("http://127.0.0.1:{metrics_port}");
        let mut server = Server::start(kind, &["--listen-metrics-urls", &url]);
        let addr = format!("127.0.0.1:{metrics_port}");
        let (code, body) = http_get(&addr, "/metrics");
        assert_eq!(code, 200, "{kind:?}");
        assert!(
            body.contains("\netcd_server_has_leader 1\n"),
            "{kind:?}: {body}"
        );
        let (code, body) = http_get(&addr, "/health");
        assert_eq!(code, 200, "{kind:?}");
        assert!(body.contains("\"health\":\"true\""), "{kind:?}: {body}");
        let api = etcdctl_at(&addr, &["put", "k", "v"], None);
        assert_ne!(
            api.code, 0,
            "{kind:?}: the metrics port serves no gRPC: {api:?}"
        );
        server.stop();
    }
}

/// `etcdctl member list -w json`: (cluster id, [(member id, name)]), ids in hex.
fn ids_and_names(server: &Server) -> (String, Vec<(String, String)>) {
    let v = server
        .etcdctl(&["member", "list", "-w", "json"])
        .ok()
        .json();
    let members = v["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                format!("{:x}", m["ID"].as_u64().expect("ID")),
                m["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    (
        format!(
            "{:x}",
            v["header"]["cluster_id"].as_u64().expect("cluster_id")
        ),
        members,
    )
}

/// The same `--config-file` given to Keel and to etcd 3.4: both take every setting from it and
/// ignore the command line's other flags and the `ETCD_*` variables, and both derive the same
/// member and cluster ids from it (ids come from the peer URLs and the cluster token, as etcd
/// derives them).
#[test]
fn a_config_file_configures_keel_as_it_configures_etcd_and_gives_etcds_ids() {
    let mut seen = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let (client, peer) = (free_port(), free_port());
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("etcd.conf.yml");
        // The advertised peer URL is not listened on: a one-member cluster never dials itself,
        // and a fixed URL gives both servers the same ids.
        std::fs::write(
            &file,
            format!(
                "# etcd.conf.yml.sample's shape\n\
                 name: 'from-file'\n\
                 data-dir: {data}\n\
                 snapshot-count: 10000\n\
                 heartbeat-interval: 100\n\
                 election-timeout: 1000\n\
                 listen-peer-urls: http://127.0.0.1:{peer}\n\
                 listen-client-urls: http://127.0.0.1:{client}\n\
                 initial-advertise-peer-urls: http://10.11.12.13:2380\n\
                 advertise-client-urls: http://127.0.0.1:{client}\n\
                 initial-cluster: from-file=http://10.11.12.13:2380\n\
                 initial-cluster-token: 'keel-config-file-test'\n\
                 initial-cluster-state: 'new'\n\
                 strict-reconfig-check: false\n\
                 discovery:\n\
                 client-transport-security:\n  cert-file:\n  client-cert-auth: false\n  auto-tls: false\n\
                 auto-compaction-mode: periodic\n\
                 auto-compaction-retention: \"1\"\n\
                 log-outputs: [stderr]\n",
                data = dir.path().join("data").display()
            ),
        )
        .expect("write the config file");
        let file_arg = file.display().to_string();
        // The harness's own flags (--name e2e, its data dir, ...) and ETCD_NAME are ignored.
        let mut server = Server::start_with(
            kind,
            client,
            peer,
            &["--config-file", &file_arg, "--snapshot-count", "5"],
            &[
                ("ETCD_NAME", "from-env"),
                ("ETCD_INITIAL_CLUSTER_TOKEN", "env"),
            ],
            None,
            None,
        );
        server.etcdctl(&["put", "k", "v"]).ok();
        let (cluster, members) = ids_and_names(&server);
        assert_eq!(members.len(), 1, "{kind:?}: {members:?}");
        assert_eq!(members[0].1, "from-file", "{kind:?}");
        assert!(
            dir.path().join("data").is_dir(),
            "{kind:?} uses the file's data dir"
        );
        if kind == Kind::Keel {
            let log = settled_log(&server, "will be ignored if provided");
            assert!(
                log.contains("loaded server configuration, other configuration command line flags and environment variables will be ignored if provided"),
                "{log}"
            );
        }
        server.stop();
        seen.push((cluster, members[0].0.clone()));
    }
    assert_eq!(
        seen[0], seen[1],
        "Keel and etcd derive the same (cluster id, member id) from the same settings"
    );
}

/// A member removed and added again with the same peer URL gets a new id, on Keel as on etcd:
/// the id of a member added at runtime mixes in the time of the call.
#[test]
fn a_member_added_again_gets_a_new_id_as_on_etcd() {
    for kind in [Kind::Keel, Kind::Etcd] {
        let mut server = Server::start(kind, &[]);
        let url = format!("http://127.0.0.1:{}", free_port());
        let add = |server: &Server| -> String {
            let v = server
                .etcdctl(&[
                    "member",
                    "add",
                    "again",
                    "--learner",
                    "--peer-urls",
                    &url,
                    "-w",
                    "json",
                ])
                .ok()
                .json();
            format!(
                "{:x}",
                v["member"]["ID"].as_u64().expect("the added member's ID")
            )
        };
        let first = add(&server);
        server.etcdctl(&["member", "remove", &first]).ok();
        // etcd mixes in whole seconds.
        std::thread::sleep(Duration::from_millis(1_100));
        let second = add(&server);
        assert_ne!(first, second, "{kind:?}: a re-added member gets a new id");
        let (_, members) = ids_and_names(&server);
        assert!(
            members.iter().any(|(id, _)| *id == second)
                && !members.iter().any(|(id, _)| *id == first),
            "{kind:?}: {members:?}"
        );
        server.stop();
    }
}

/// Membership changes etcd refuses before they reach raft: a second learner, and a peer-URL
/// update onto another member's URL (two members on one URL would take each other's raft
/// messages). The same calls, the same answers, on Keel and on etcd.
#[test]
fn a_second_learner_and_a_taken_peer_url_are_refused_as_on_etcd() {
    for kind in [Kind::Keel, Kind::Etcd] {
        let mut server = Server::start(kind, &[]);
        let own_peer_url = format!("http://127.0.0.1:{}", server.peer_port);
        let (first_url, second_url, moved_url) = (
            format!("http://127.0.0.1:{}", free_port()),
            format!("http://127.0.0.1:{}", free_port()),
            format!("http://127.0.0.1:{}", free_port()),
        );
        let learner = |name: &str, url: &str| {
            server.etcdctl(&[
                "member",
                "add",
                name,
                "--learner",
                "--peer-urls",
                url,
                "-w",
                "json",
            ])
        };
        let first = learner("first", &first_url).ok().json();
        let first_id = format!(
            "{:x}",
            first["member"]["ID"]
                .as_u64()
                .expect("the added member's ID")
        );
        learner("second", &second_url)
            .refused("etcdserver: too many learner members in cluster", kind);
        server
            .etcdctl(&["member", "update", &first_id, "--peer-urls", &own_peer_url])
            .refused("etcdserver: Peer URLs already exists", kind);
        if kind == Kind::Keel {
            // Keel refuses an update to no peer URLs, or to one that is not a URL, as etcd
            // refuses such an add. (etcd 3.4 takes an empty list and then panics applying it:
            // "newURLs [] should never fail". The gateway sends them: etcdctl checks URLs
            // itself and sends no empty list.)
            let learner_id = first["member"]["ID"].as_u64().expect("the learner's id");
            for urls in [r#"[]"#, r#"["not a url"]"#] {
                let (status, body) = http_request(
                    &server.endpoint(),
                    "POST",
                    "/v3/cluster/member/update",
                    &format!(r#"{{"ID":"{learner_id}","peerURLs":{urls}}}"#),
                );
                assert_eq!(status, 400, "{urls}: {body}");
                assert!(
                    body.contains("etcdserver: given member URLs are invalid"),
                    "{urls}: {body}"
                );
            }
        }
        server
            .etcdctl(&["member", "update", &first_id, "--peer-urls", &moved_url])
            .ok();
        let listed = server
            .etcdctl(&["member", "list", "-w", "json"])
            .ok()
            .json();
        let urls: Vec<String> = listed["members"]
            .as_array()
            .expect("members")
            .iter()
            .flat_map(|m| m["peerURLs"].as_array().cloned().unwrap_or_default())
            .map(|u| u.as_str().expect("a URL").to_string())
            .collect();
        assert_eq!(urls.len(), 2, "{kind:?}: {listed}");
        assert!(
            urls.contains(&own_peer_url) && urls.contains(&moved_url),
            "{kind:?}: {listed}"
        );
        server.etcdctl(&["member", "remove", &first_id]).ok();
        server.stop();
    }
}

/// etcd's strict reconfiguration check, the part a single member shows: a one-member cluster
/// takes a second voter (etcd's way of restoring a cluster from one member), but not a third
/// while the second has not started, as two of three voters would have to be up. With
/// `--strict-reconfig-check=false` the third is let in. Same answers on Keel and etcd.
#[test]
fn voters_are_not_added_past_a_started_quorum_as_on_etcd() {
    for kind in [Kind::Keel, Kind::Etcd] {
        for strict in [true, false] {
            let flag = format!("--strict-reconfig-check={strict}");
            let mut server = Server::start(kind, &[&flag]);
            let add = |name: &str| {
                let url = format!("http://127.0.0.1:{}", free_port());
                server.etcdctl(&["member", "add", name, "--peer-urls", &url])
            };
            add("second").ok();
            let third = add("third");
            if strict {
                third.refused(
                    "etcdserver: re-configuration failed due to not enough started members",
                    kind,
                );
            } else {
                // Proposed, never committed (two of three voters are down): the call times
                // out instead of being refused.
                assert_ne!(third.code, 0, "{kind:?} {flag}: {third:?}");
                assert!(
                    !third.stderr.contains("not enough started members"),
                    "{kind:?} {flag}: {third:?}"
                );
            }
            server.stop();
        }
    }
}

/// GET /health over HTTP/1.1 with `host` in the Host header: (status, body).
fn get_with_host(addr: &str, host: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status");
    (status, body.to_string())
}

/// `--host-whitelist` refuses plaintext HTTP requests whose Host is not listed with etcd's 421
/// and text (DNS rebinding, CVE-2018-5702), and leaves gRPC alone, as etcd 3.4 does.
#[test]
fn host_whitelist_refuses_unlisted_hosts_as_etcd_does() {
    let mut answers = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let mut server = Server::start(kind, &["--host-whitelist", "127.0.0.1,keel.example"]);
        let addr = server.endpoint();
        server.etcdctl(&["put", "k", "v"]).ok();
        let listed = get_with_host(&addr, &format!("keel.example:{}", server.client_port));
        let also_listed = get_with_host(&addr, &addr);
        let refused = get_with_host(&addr, &format!("evil.example:{}", server.client_port));
        server.stop();
        assert_eq!(listed.0, 200, "{kind:?}: {listed:?}");
        assert_eq!(also_listed.0, 200, "{kind:?}: {also_listed:?}");
        answers.push(refused);
    }
    assert_eq!(answers[0].0, 421, "Keel: {:?}", answers[0]);
    assert_eq!(answers[0], answers[1], "Keel's refusal against etcd's");
}

/// Keel pins its executors by CPU number. Started inside a CPU set that does not hold CPU 0
/// (as `taskset -c N` or a container's cpuset gives it), its shards and raft core go on CPUs
/// of that set: pinned to CPU 0 they would have left the set an operator gave them, or, under
/// a cgroup cpuset, failed to start.
#[test]
fn shards_and_the_raft_core_stay_in_the_cpu_set_keel_is_given() {
    let cpus = keel_core::rt::process_cpu_list();
    let last = *cpus.last().expect("never empty");
    if last == 0 {
        eprintln!("one CPU: no set without CPU 0 to start keel in");
        return;
    }
    let server = keel_on_one_cpu(last, &[]);
    let shards = pinned_threads(server.pid(), "keel-shard");
    let raft = pinned_threads(server.pid(), "keel-raft");
    assert!(
        !shards.is_empty() && !raft.is_empty(),
        "shard and raft threads: {shards:?} {raft:?}"
    );
    for (name, allowed) in shards.iter().chain(&raft) {
        assert_eq!(
            allowed,
            &last.to_string(),
            "{name} left the set: {shards:?} {raft:?}"
        );
    }
    let put = server.etcdctl(&["put", "k", "v"]);
    assert_eq!(put.stdout.trim(), "OK", "{}", put.stderr);
}

/// Shard threads run under SCHED_BATCH (`rt::batch_scheduling_for_this_thread`): their
/// wake-ups do not cut the raft core's turn on a shared CPU short. The raft core's thread
/// stays SCHED_OTHER, so its wake-ups may still preempt a shard. `--shard-sched-batch=false`
/// leaves every thread SCHED_OTHER.
#[test]
fn shard_threads_are_batch_scheduled_and_the_raft_core_is_not() {
    let server = Server::keel(&[]);
    let policies = thread_policies(server.pid());
    let of = |prefix: &str| -> Vec<i32> {
        policies
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, policy)| *policy)
            .collect()
    };
    let (shards, raft) = (of("keel-shard"), of("keel-raft"));
    assert!(!shards.is_empty() && !raft.is_empty(), "{policies:?}");
    // glommio starts each executor's blocking-pool thread, of the same name, before the
    // executor's own code runs: at least one thread a shard is batch-scheduled.
    assert!(
        shards.iter().filter(|&&p| p == libc::SCHED_BATCH).count()
            >= keel_core::config::default_shards(keel_core::rt::process_cpu_list().len()),
        "{policies:?}"
    );
    assert!(raft.iter().all(|&p| p == libc::SCHED_OTHER), "{policies:?}");
    // And none with the flag off.
    let off = Server::keel(&["--shard-sched-batch=false"]);
    let policies = thread_policies(off.pid());
    assert!(
        policies
            .iter()
            .all(|(name, p)| !name.starts_with("keel-") || *p == libc::SCHED_OTHER),
        "{policies:?}"
    );
}

/// Each thread of `pid` by name with its scheduling policy (field 41 of its `stat`).
fn thread_policies(pid: u32) -> Vec<(String, i32)> {
    let mut policies = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the task list reads") {
        let task = task.expect("a task entry").path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
        // The name in parentheses may hold spaces: count fields after its closing one.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        // `after` starts at field 3 (state); the policy is field 41.
        if let Some(policy) = after.split_whitespace().nth(41 - 3) {
            policies.push((
                name.trim().to_string(),
                policy.parse().expect("a policy number"),
            ));
        }
    }
    policies
}

/// With `--host-shards-on-raft-cpu`, a shard placed on the raft core's CPU is a task queue in
/// the raft core's executor, not a thread beside it (`shard::Host`), and so are several, which
/// then share the executor's answer queue. Started in a set of one CPU with two shards, the
/// member has no shard thread at all, so every call (each etcdctl call a new connection) is
/// served by a hosted shard.
#[test]
fn shards_hosted_in_the_raft_cores_executor_serve() {
    let cpu = *keel_core::rt::process_cpu_list()
        .last()
        .expect("never empty");
    let server = keel_on_one_cpu(cpu, &["--shards", "2", "--host-shards-on-raft-cpu"]);
    let shards = pinned_threads(server.pid(), "keel-shard");
    assert!(shards.is_empty(), "shard threads: {shards:?}");
    let raft = pinned_threads(server.pid(), "keel-raft");
    assert_eq!(
        raft.into_values().collect::<Vec<_>>(),
        vec![cpu.to_string()]
    );
    for i in 0..8 {
        let key = format!("hosted/{i}");
        let put = server.etcdctl(&["put", &key, &format!("v{i}")]);
        assert_eq!(put.stdout.trim(), "OK", "put {i}: {}", put.stderr);
        let get = server.etcdctl(&["get", &key, "--print-value-only"]);
        assert_eq!(
            get.stdout.trim(),
            format!("v{i}"),
            "get {i}: {}",
            get.stderr
        );
    }
    let all = server.etcdctl(&["get", "hosted/", "--prefix", "--keys-only"]);
    let keys = all
        .stdout
        .lines()
        .filter(|line| line.starts_with("hosted/"))
        .count();
    assert_eq!(keys, 8, "{}{}", all.stdout, all.stderr);
    // A snapshot's capture is written and read off the executor (`rt::on_thread`).
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("backup.db");
    let out = server
        .etcdctl(&[
            "snapshot",
            "save",
            path.to_str().expect("a UTF-8 temp path"),
        ])
        .ok();
    assert!(out.stdout.contains("Snapshot saved at"), "{}", out.stdout);
    keel_core::etcd_snapshot::verify_sha256(&path).expect("the trailing sha256 matches");
    // ... on the raft core's helper thread, not on the raft core's own blocking pool.
    let helper = pinned_threads(server.pid(), "keel-helper");
    assert!(!helper.is_empty(), "no helper thread took the capture");
}

/// A count over a million keys, on a shard hosted by the raft core on the member's only CPU,
/// walks the index in steps (`limits::READ_KEYS_PER_STEP`), as a range and inside a
/// read-only txn: a put sent while it walks, on another connection, goes through raft and is
/// answered before the count is. Walked in one
/// go, the count held the executor, its other calls and the raft core for all of its 0.2-0.3
/// s (BENCHMARKS.md, "A long walk beside one client's puts"), and the put came after it.
#[test]
fn a_long_count_on_a_hosted_shard_lets_a_put_through_while_it_walks() {
    use etcd_client::{Client, GetOptions, Txn, TxnOp};
    const KEYS: usize = 1_000_000;
    const KEYS_PER_TXN: usize = 10_000;
    let cpu = *keel_core::rt::process_cpu_list()
        .last()
        .expect("never empty");
    let server = keel_on_one_cpu(
        cpu,
        &[
            "--shards",
            "1",
            "--host-shards-on-raft-cpu",
            "--max-txn-ops",
            "10000",
        ],
    );
    let endpoint = server.endpoint();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async move {
        let mut writer = Client::connect([endpoint.as_str()], None)
            .await
            .expect("connects");
        for first in (0..KEYS).step_by(KEYS_PER_TXN) {
            let puts: Vec<TxnOp> = (first..first + KEYS_PER_TXN)
                .map(|i| TxnOp::put(format!("walk/{i:07}"), "v", None))
                .collect();
            writer
                .txn(Txn::new().and_then(puts))
                .await
                .expect("the load's txn");
        }
        // The count as a range, then inside a read-only txn (whose ranges walk in steps too),
        // then a range sorted by value: the values it compares are listed a step's keys on
        // the shard and the rest on a pager thread, its walk takes steps, and its sort runs
        // off the executor.
        for (in_txn, by_value) in [(false, false), (true, false), (false, true)] {
            let mut counter = Client::connect([endpoint.as_str()], None)
                .await
                .expect("connects");
            let count = tokio::spawn(async move {
                let everything = GetOptions::new().with_prefix().with_count_only();
                let count = if by_value {
                    let sorted = GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(1)
                        .with_sort(
                            etcd_client::SortTarget::Value,
                            etcd_client::SortOrder::Descend,
                        );
                    counter
                        .get("walk/", Some(sorted))
                        .await
                        .expect("the sorted range")
                        .count()
                } else if in_txn {
                    let resp = counter
                        .txn(Txn::new().and_then([TxnOp::get("walk/", Some(everything))]))
                        .await
                        .expect("the txn");
                    match &resp.op_responses()[..] {
                        [etcd_client::TxnOpResponse::Get(get)] => get.count(),
                        other => panic!("one range's answer, not {other:?}"),
                    }
                } else {
                    counter
                        .get("walk/", Some(everything))
                        .await
                        .expect("the count")
                        .count()
                };
                (count, std::time::Instant::now())
            });
            // Long enough for the count to reach the member, a tenth of its walk.
            tokio::time::sleep(Duration::from_millis(20)).await;
            // A count already answered would let any put come second: the test would show
            // nothing (a machine this fast needs more keys).
            assert!(
                !count.is_finished(),
                "the count of {KEYS} keys (in a txn: {in_txn}, by value: {by_value}) was answered within 20 ms"
            );
            writer.put("beside", "v", None).await.expect("the put");
            let put_answered = std::time::Instant::now();
            let (count, count_answered) = count.await.expect("the count's task");
            assert_eq!(count, KEYS as i64);
            assert!(
                put_answered < count_answered,
                "the put was answered {:?} after the count (in a txn: {in_txn}, by value: {by_value})",
                put_answered - count_answered
            );
        }
    });
}

/// Starts keel with `args` inside the CPU set {`cpu`}, as `taskset -c CPU` would.
fn keel_on_one_cpu(cpu: usize, args: &'static [&'static str]) -> Server {
    // The child inherits the affinity of the thread that forks it.
    std::thread::spawn(move || {
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
        Server::keel(args)
    })
    .join()
    .expect("keel starts inside the set")
}

/// The CPUs each of `pid`'s threads whose name starts with `prefix` may run on, as
/// `Cpus_allowed_list` spells them, by thread name (glommio gives each executor a helper
/// thread of the same name and pinning).
fn pinned_threads(pid: u32, prefix: &str) -> std::collections::BTreeMap<String, String> {
    let mut pinned = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the task list reads") {
        let task = task.expect("a task entry").path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let name = name.trim();
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        if let Some(list) = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        {
            let list = list.trim().to_string();
            let earlier = pinned.insert(name.to_string(), list.clone());
            assert!(
                earlier.is_none_or(|e| e == list),
                "two {name} threads pinned apart"
            );
        }
    }
    pinned
}

/// Three members of one cluster started on one host with no placement flags, as a newcomer
/// runs a local cluster: each sees from `--initial-cluster` that the others share its host,
/// so they split its CPUs (`config::place`) instead of all pinning their raft cores to the
/// last one. They then serve writes.
#[test]
fn members_sharing_a_host_spread_their_raft_cores_without_flags() {
    let cpus = keel_core::rt::process_cpu_list();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("n{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut children: Vec<std::process::Child> = Vec::new();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let client = format!("http://127.0.0.1:{client}");
        let peer = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join(format!("n{i}.log"))).expect("a log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["--name", &format!("n{i}")])
            .arg("--data-dir")
            .arg(dir.path().join(format!("n{i}.data")))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &cluster])
            .env_remove("KEEL_SHARDS")
            .env_remove("KEEL_RAFT_CPU")
            .env_remove("KEEL_HOST_SHARDS_ON_RAFT_CPU")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("the log handle clones"))
            .stderr(log)
            .spawn()
            .expect("keel starts");
        children.push(child);
    }
    struct Stop(Vec<std::process::Child>);
    impl Drop for Stop {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let children = Stop(children);
    // Each member on its own: two would take a write without the third.
    for (i, (client, _)) in ports.iter().enumerate() {
        let endpoint = format!("127.0.0.1:{client}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let put = etcdctl_at(&endpoint, &["put", &format!("k{i}"), "v"], None);
            if put.code == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "member n{i} never took a write: {}",
                put.stderr
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The startup line is logged once every shard has bound (and so is pinned): wait for it
    // before reading the pins.
    for i in 0..3 {
        let path = dir.path().join(format!("n{i}.log"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let log = loop {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            if log.contains("keel is serving client requests")
                || std::time::Instant::now() > deadline
            {
                break log;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            log.contains("\"members_on_this_host\":3"),
            "member n{i} logs what it placed itself by: {log}"
        );
    }
    let mut raft_cpus = Vec::new();
    let mut shard_cpus = Vec::new();
    for (i, child) in children.0.iter().enumerate() {
        let (raft_cpu, shards) = keel_core::config::place(&cpus, Some((i, 3)), None, 0);
        let raft: Vec<String> = pinned_threads(child.id(), "keel-raft")
            .into_values()
            .collect();
        assert_eq!(raft, vec![raft_cpu.to_string()], "member n{i}'s raft core");
        let mut pinned: Vec<String> = pinned_threads(child.id(), "keel-shard")
            .into_values()
            .collect();
        pinned.sort();
        // A shard on the raft core's CPU runs in its executor: no thread of its own.
        let mut expected: Vec<String> = shards
            .iter()
            .filter(|&&cpu| cpu != raft_cpu)
            .map(|cpu| cpu.to_string())
            .collect();
        expected.sort();
        assert_eq!(pinned, expected, "member n{i}'s shard threads");
        raft_cpus.push(raft_cpu);
        shard_cpus.push(shards);
    }
    // What the placement is for, checked without its own code: the raft cores on as many
    // CPUs as there are, and, where each member has CPUs of its own, no shard on another
    // member's raft core.
    let mut distinct = raft_cpus.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        cpus.len().min(3),
        "raft cores {raft_cpus:?}"
    );
    if cpus.len() >= 3 {
        for (i, shards) in shard_cpus.iter().enumerate() {
            for (j, raft) in raft_cpus.iter().enumerate() {
                assert!(
                    i == j || !shards.contains(raft),
                    "n{i}'s shards {shards:?} on n{j}'s raft core {raft}"
                );
            }
        }
    }
}
