//! Peer TLS (`https://` peer URLs with `--peer-*` certificates), with certificates made by the
//! `openssl` CLI at test time:
//! - a 3-member cluster with mutual TLS between peers serves writes, survives the loss of its
//!   leader and lets it catch up after a restart;
//! - a member whose certificate comes from the wrong CA cannot join, side by side with etcd
//!   3.4 started with the same certificates and flags;
//! - a plaintext peer gets nowhere with a TLS peer listener, while the same bytes are served
//!   on a plaintext one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, raft_cpu_of, require_tool, OpensslPki};
use crate::harness::{Cluster, Net};

/// A throwaway PKI: the cluster's CA, a stranger CA, and peer certificates issued by either.
struct Pki(OpensslPki);

impl std::ops::Deref for Pki {
    type Target = OpensslPki;
    fn deref(&self) -> &OpensslPki {
        &self.0
    }
}

impl Pki {
    fn new() -> Pki {
        Pki(OpensslPki::new("keel-peer-pki-", &["ca", "rogue-ca"]))
    }

    /// A peer certificate `name` from `ca`, for 127.0.0.1, usable by both sides of a peer
    /// connection (etcd's peers dial with their server certificate, and so do Keel's).
    fn issue(&self, ca: &str, name: &str) {
        self.0.issue(
            ca,
            name,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        );
    }

    /// Peer flags for the certificate `name`, trusting (and requiring certificates from) the
    /// cluster's CA, as etcd's documentation sets up peer mTLS.
    fn peer_flags(&self, name: &str) -> Vec<String> {
        let arg = |file: String| self.path(&file).display().to_string();
        vec![
            "--peer-cert-file".into(),
            arg(format!("{name}.pem")),
            "--peer-key-file".into(),
            arg(format!("{name}.key")),
            "--peer-trusted-ca-file".into(),
            arg("ca.pem".into()),
            "--peer-client-cert-auth".into(),
        ]
    }
}

#[test]
fn a_peer_mtls_cluster_serves_writes_and_survives_losing_its_leader() {
    let pki = Pki::new();
    for i in 0..3 {
        pki.issue("ca", &format!("n{i}"));
    }
    let mut c = Cluster::start_with(3, Net::Loopback, &[], "https", |i| {
        pki.peer_flags(&format!("n{i}"))
    });
    let all: Vec<usize> = (0..3).collect();
    assert!(c.members[0].peer_url().starts_with("https://"));
    let (old, before, _) = c.wait_leader(&all, Duration::from_secs(10));
    let put = c.etcdctl(old, &["put", "before", "1"]);
    assert_eq!(put.code, 0, "{put:?}");

    c.kill9(old);
    let survivors: Vec<usize> = all.iter().copied().filter(|&i| i != old).collect();
    let (new, after, _) = c.wait_leader(&survivors, Duration::from_secs(15));
    assert_ne!(new, old);
    assert!(after.raft_term > before.raft_term, "a new election ran");
    for i in 0..20 {
        let put = c.etcdctl(survivors[i % 2], &["put", &format!("after-{i}"), "2"]);
        assert_eq!(put.code, 0, "write {i} after losing the leader: {put:?}");
    }

    c.restart(old);
    let (_, kvs) = c.wait_converged(&all, Duration::from_secs(20));
    let keys: Vec<&str> = kvs.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(
        keys.contains(&"before") && keys.contains(&"after-19"),
        "{keys:?}"
    );
    assert_eq!(kvs.len(), 21, "every write on every member: {keys:?}");
}

#[test]
fn peer_auto_tls_and_an_allowed_hostname_form_clusters() {
    // --peer-auto-tls: self-signed certificates, peers not verified (as in etcd).
    let c = Cluster::start_with(3, Net::Loopback, &["--peer-auto-tls"], "https", |_| {
        Vec::new()
    });
    let put = c.etcdctl(0, &["put", "auto", "tls"]);
    assert_eq!(put.code, 0, "{put:?}");
    let (_, kvs) = c.wait_converged(&[0, 1, 2], Duration::from_secs(20));
    assert_eq!(kvs.len(), 1);
    assert!(c.members[1]
        .data_dir
        .join("fixtures/peer/cert.pem")
        .exists());
    drop(c);
    // --peer-cert-allowed-hostname: every certificate names 127.0.0.1, so every member
    // accepts every other (the refusal of a certificate that does not name it is tls.rs's
    // unit test).
    let pki = Pki::new();
    for i in 0..3 {
        pki.issue("ca", &format!("member{i}"));
    }
    let c = Cluster::start_with(3, Net::Loopback, &[], "https", |i| {
        let mut flags = pki.peer_flags(&format!("member{i}"));
        flags.extend(["--peer-cert-allowed-hostname".into(), "127.0.0.1".into()]);
        flags
    });
    let put = c.etcdctl(2, &["put", "allowed", "hostname"]);
    assert_eq!(put.code, 0, "{put:?}");
    c.wait_converged(&[0, 1, 2], Duration::from_secs(20));
}

/// One process of a hand-built cluster (for clusters that never become ready), killed on drop.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program` (keel or etcd) as member n`index` of `initial_cluster` with https peer
/// URLs.
fn spawn_member(
    program: &str,
    dir: &Path,
    index: usize,
    client_port: u16,
    peer_port: u16,
    initial_cluster: &str,
    tls: &[String],
) -> Process {
    let name = format!("n{index}");
    let log = dir.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log handle");
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("https://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(program);
    cmd.arg("--name")
        .arg(&name)
        .arg("--data-dir")
        .arg(dir.join(format!("{name}.data")))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", initial_cluster])
        .args(["--initial-cluster-state", "new"])
        .args(tls)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    if program.ends_with("keel") {
        cmd.args(["--shards", "1"])
            .args(["--raft-cpu", &raft_cpu_of(index).to_string()]);
    }
    Process {
        child: cmd.spawn().expect("the member starts"),
        log,
    }
}

/// etcdctl against a plaintext client port.
fn etcdctl(port: u16, args: &[&str]) -> crate::common::Output {
    crate::common::etcdctl_at(&format!("127.0.0.1:{port}"), args, None)
}

/// What a 3-member cluster whose third member holds a certificate from the wrong CA did.
struct WrongCaOutcome {
    /// A write through member 0 succeeded.
    good_members_write: bool,
    /// Member 2's serializable read of that key, once the others have it.
    outsider_sees_write: bool,
    /// Member 0's log says it refused member 2's handshake.
    refusal_logged: bool,
}

/// Starts `program` as a 3-member peer-mTLS cluster where n2's certificate comes from a CA the
/// others do not trust (all three trust the cluster CA), and records what happens.
fn wrong_ca_cluster(program: &str, pki: &Pki, refusal: &str) -> WrongCaOutcome {
    let dir = tempfile::Builder::new()
        .prefix("keel-wrong-ca-")
        .tempdir()
        .expect("a temp dir");
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let initial_cluster = (0..3)
        .map(|i| format!("n{i}=https://127.0.0.1:{}", ports[i].1))
        .collect::<Vec<_>>()
        .join(",");
    let members: Vec<Process> = (0..3)
        .map(|i| {
            let cert = if i == 2 {
                "rogue"
            } else {
                ["good0", "good1"][i]
            };
            spawn_member(
                program,
                dir.path(),
                i,
                ports[i].0,
                ports[i].1,
                &initial_cluster,
                &pki.peer_flags(cert),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut good_members_write = false;
    while Instant::now() < deadline && !good_members_write {
        good_members_write = etcdctl(ports[0].0, &["put", "k", "v"]).code == 0;
        if !good_members_write {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Give the outsider time to hear of it, were it able to.
    std::thread::sleep(Duration::from_secs(3));
    let read = etcdctl(
        ports[2].0,
        &["get", "k", "--consistency=s", "--print-value-only"],
    );
    let outsider_sees_write = read.stdout.trim() == "v";
    let log = members[0].log();
    let refusal_line = log.lines().find(|l| l.contains(refusal));
    let refusal_logged = refusal_line.is_some();
    match refusal_line {
        Some(line) => eprintln!("{program} n0 logs: {line}"),
        None => eprintln!("{program} n0's log:\n{log}"),
    }
    WrongCaOutcome {
        good_members_write,
        outsider_sees_write,
        refusal_logged,
    }
}

#[test]
fn a_member_with_a_certificate_from_the_wrong_ca_cannot_join_as_in_etcd() {
    require_tool("etcd");
    require_tool("etcdctl");
    let pki = Pki::new();
    pki.issue("ca", "good0");
    pki.issue("ca", "good1");
    pki.issue("rogue-ca", "rogue");
    // etcd 3.4 logs `rejected connection from "127.0.0.1:…" (error "remote error: tls: bad
    // certificate" | "tls: failed to verify client's certificate: x509: certificate signed by
    // unknown authority …")`.
    let etcd = wrong_ca_cluster("etcd", &pki, "rejected connection from");
    let keel = wrong_ca_cluster(
        env!("CARGO_BIN_EXE_keel"),
        &pki,
        "rejected peer connection: TLS handshake failed",
    );
    for (who, outcome) in [("etcd", &etcd), ("keel", &keel)] {
        assert!(
            outcome.good_members_write,
            "{who}: the two members with good certificates form a quorum and serve writes"
        );
        assert!(
            !outcome.outsider_sees_write,
            "{who}: the member with the stranger's certificate never receives the log"
        );
        assert!(outcome.refusal_logged, "{who}: the refusal is logged");
    }
}

#[test]
fn a_plaintext_peer_gets_nowhere_with_a_tls_peer_listener() {
    let pki = Pki::new();
    pki.issue("ca", "n0");
    // The same 1-member cluster twice: peer port plaintext, then TLS.
    let plain = Cluster::start_with(1, Net::Loopback, &[], "http", |_| Vec::new());
    let tls = Cluster::start_with(1, Net::Loopback, &[], "https", |_| pki.peer_flags("n0"));
    for (c, open_after) in [(&plain, true), (&tls, false)] {
        // A well-formed hello for this member, from a member that does not exist: a plaintext
        // listener reads it and waits for frames; a TLS listener must not read it as one.
        let status = c.status(0).expect("the member answers endpoint status");
        let list = c.etcdctl(0, &["member", "list", "-w", "json"]).ok();
        let cluster_id = list.json()["header"]["cluster_id"]
            .as_u64()
            .expect("a cluster id");
        let mut hello = Vec::new();
        hello.extend_from_slice(&36u32.to_be_bytes());
        hello.extend_from_slice(b"KEELPEER");
        hello.extend_from_slice(&1u32.to_be_bytes());
        hello.extend_from_slice(&cluster_id.to_be_bytes());
        hello.extend_from_slice(&0x1234u64.to_be_bytes());
        hello.extend_from_slice(&status.member_id.to_be_bytes());
        let mut s = TcpStream::connect(("127.0.0.1", c.members[0].peer_port)).expect("connects");
        s.write_all(&hello).expect("the hello is written");
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout set");
        let mut reply = Vec::new();
        let closed = match s.read_to_end(&mut reply) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                    "{e}"
                );
                false
            }
        };
        assert_eq!(
            !closed, open_after,
            "peer scheme {}: closed {closed}, reply {reply:?}",
            c.members[0].peer_scheme
        );
        if !open_after {
            // Nothing but (at most) a TLS alert record comes back.
            assert!(reply.is_empty() || reply[0] == 0x15, "{reply:?}");
            let deadline = Instant::now() + Duration::from_secs(5);
            while !c.members[0]
                .log_all()
                .contains("rejected peer connection: TLS handshake failed")
            {
                assert!(Instant::now() < deadline, "{}", c.members[0].log_tail());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
