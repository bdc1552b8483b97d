//! What an etcd operator's tooling sees besides the API: the lifecycle lines etcd logs (in
//! etcd's words), unix-socket client URLs, and the HTTP-only metrics listener.

use std::time::Duration;

use crate::common::{etcdctl_at, free_port, http_get, Kind, Server};

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
    for _ in 0..50 {
        let log = server.log_text();
        if log.contains(last_phrase) {
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
    let keel_log = settled_log(&keel, phrases.last().expect("phrases"));
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
