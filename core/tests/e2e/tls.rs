//! TLS on the client port, side by side with etcd 3.4 started with the same certificates:
//! etcdctl over TLS, a plaintext client refused, client certificate authentication, the
//! etcd-client crate's TLS options, /health over TLS, a certificate swapped on disk, --auto-tls,
//! --client-crl-file and --client-cert-allowed-hostname,
//! and a handshake that never completes.
//!
//! The certificates are made at test time with the `openssl` CLI (EC P-256 keys).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{require_tool, Kind, OpensslPki, Output, Server};

/// A throwaway PKI: two CAs, server and client certificates from each.
struct Pki(OpensslPki);

impl std::ops::Deref for Pki {
    type Target = OpensslPki;
    fn deref(&self) -> &OpensslPki {
        &self.0
    }
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki(OpensslPki::new("keel-pki-", &["ca", "ca2"]));
        for ca in ["ca", "ca2"] {
            // etcd 3.4 dials its own gRPC gateway with the server certificate as a client
            // certificate, so the server's may also serve as a client's.
            pki.issue(
                ca,
                &format!("server-{ca}"),
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
            );
            pki.issue(ca, &format!("client-{ca}"), "extendedKeyUsage=clientAuth\n");
        }
        pki
    }

    /// The server flags for the server certificate from CA 1.
    fn server_flags(&self) -> Vec<String> {
        vec![
            "--cert-file".into(),
            self.arg("server-ca.pem"),
            "--key-file".into(),
            self.arg("server-ca.key"),
        ]
    }

    /// etcdctl's flags: trust CA 1, and present `client` (a name like "client-ca") if given.
    fn etcdctl_flags(&self, client: Option<&str>) -> Vec<String> {
        let mut flags = vec![format!("--cacert={}", self.arg("ca.pem"))];
        if let Some(c) = client {
            flags.push(format!("--cert={}", self.arg(&format!("{c}.pem"))));
            flags.push(format!("--key={}", self.arg(&format!("{c}.key"))));
        }
        flags
    }
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// etcdctl with explicit TLS flags against `server`'s https URL.
fn etcdctl_with(server: &Server, tls: &[String], args: &[&str]) -> Output {
    let all: Vec<&str> = refs(tls).into_iter().chain(args.iter().copied()).collect();
    crate::common::etcdctl_at(&server.client_url(), &all, None)
}

/// curl over TLS; returns the HTTP status (0 when the TLS or TCP layer failed) and the body.
fn curl(url: &str, tls: &[&str]) -> (u32, String) {
    require_tool("curl");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(tls)
        .arg(url)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn start(kind: Kind, pki: &Pki, extra: &[&str], client: Option<&str>) -> Server {
    let mut args = pki.server_flags();
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start_tls(kind, &refs(&args), &refs(&pki.etcdctl_flags(client)))
}

#[test]
fn etcdctl_put_get_health_over_tls_and_plaintext_refused_like_etcd() {
    let pki = Pki::new();
    let mut answers = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = start(kind, &pki, &[], None);
        let put = server.etcdctl(&["put", "tls-key", "tls-value"]).ok();
        let get = server.etcdctl(&["get", "tls-key"]).ok();
        let health = curl(
            &format!("{}/health", server.client_url()),
            &["--cacert", &pki.arg("ca.pem")],
        );
        assert_eq!(health.0, 200, "{kind:?} /health over TLS: {health:?}");
        // curl picks h2 by ALPN above; the HTTP/1.1 endpoints answer over TLS too.
        let health_http1 = curl(
            &format!("{}/health", server.client_url()),
            &["--http1.1", "--cacert", &pki.arg("ca.pem")],
        );
        assert_eq!(health_http1.0, 200, "{kind:?} /health over TLS, HTTP/1.1");
        let health: serde_json::Value =
            serde_json::from_str(&health.1).expect("/health answers JSON");
        // A plaintext gRPC client on the https port: refused.
        let plain = crate::common::etcdctl_at(
            &server.endpoint(),
            &[
                "--dial-timeout=2s",
                "--command-timeout=3s",
                "get",
                "tls-key",
            ],
            None,
        );
        assert_ne!(plain.code, 0, "{kind:?}: plaintext etcdctl got {plain:?}");
        // A TLS client that does not trust the server's CA: refused.
        let untrusted = etcdctl_with(
            &server,
            &[format!("--cacert={}", pki.arg("ca2.pem"))],
            &[
                "--dial-timeout=2s",
                "--command-timeout=3s",
                "get",
                "tls-key",
            ],
        );
        assert_ne!(
            untrusted.code, 0,
            "{kind:?}: untrusted CA got {untrusted:?}"
        );
        // Plain HTTP/1.1 on the https port gets no health answer (etcd says 400, Keel closes).
        let plain_health = curl(
            &format!("http://127.0.0.1:{}/health", server.client_port),
            &[],
        );
        assert_ne!(
            plain_health.0, 200,
            "{kind:?}: plaintext /health {plain_health:?}"
        );
        // etcd 3.4.23 answers {"health":"true"}; Keel adds 3.5's "reason": compare the verdict.
        answers.push((put.stdout, get.stdout, health["health"].clone()));
    }
    assert_eq!(answers[0], answers[1], "Keel against etcd");
    assert_eq!(answers[0].1, "tls-key\ntls-value\n");
}

#[test]
fn client_cert_auth_refuses_clients_without_a_trusted_certificate_like_etcd() {
    let pki = Pki::new();
    let mut answers = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = start(
            kind,
            &pki,
            &[
                "--client-cert-auth",
                "--trusted-ca-file",
                &pki.arg("ca.pem"),
            ],
            Some("client-ca"),
        );
        let put = server.etcdctl(&["put", "k", "v"]).ok();
        let quick = ["--dial-timeout=2s", "--command-timeout=3s", "get", "k"];
        let without = etcdctl_with(&server, &pki.etcdctl_flags(None), &quick);
        assert_ne!(
            without.code, 0,
            "{kind:?}: no client certificate got {without:?}"
        );
        let wrong_ca = etcdctl_with(&server, &pki.etcdctl_flags(Some("client-ca2")), &quick);
        assert_ne!(
            wrong_ca.code, 0,
            "{kind:?}: a certificate from another CA got {wrong_ca:?}"
        );
        let with = server.etcdctl(&["get", "k"]).ok();
        let health_without = curl(
            &format!("{}/health", server.client_url()),
            &["--cacert", &pki.arg("ca.pem")],
        );
        assert_ne!(
            health_without.0, 200,
            "{kind:?}: /health without a certificate"
        );
        let health_with = curl(
            &format!("{}/health", server.client_url()),
            &[
                "--cacert",
                &pki.arg("ca.pem"),
                "--cert",
                &pki.arg("client-ca.pem"),
                "--key",
                &pki.arg("client-ca.key"),
            ],
        );
        assert_eq!(health_with.0, 200, "{kind:?}: /health with a certificate");
        answers.push((put.stdout, with.stdout));
    }
    assert_eq!(answers[0], answers[1], "Keel against etcd");
}

#[test]
fn etcd_client_crate_connects_over_mutual_tls() {
    let pki = Pki::new();
    let keel = start(
        Kind::Keel,
        &pki,
        &[
            "--client-cert-auth",
            "--trusted-ca-file",
            &pki.arg("ca.pem"),
        ],
        Some("client-ca"),
    );
    let read = |name: &str| std::fs::read(pki.path(name)).expect("read a PEM file");
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.pem")))
        .identity(etcd_client::Identity::from_pem(
            read("client-ca.pem"),
            read("client-ca.key"),
        ));
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let options = etcd_client::ConnectOptions::new().with_tls(tls);
        let mut client = etcd_client::Client::connect([keel.client_url()], Some(options))
            .await
            .expect("etcd-client connects over TLS");
        client.put("crate", "over-tls", None).await.expect("put");
        let got = client.get("crate", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), b"over-tls");
        // Without a client certificate the call fails.
        let options = etcd_client::ConnectOptions::new().with_tls(
            etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read("ca.pem"))),
        );
        let refused = match etcd_client::Client::connect([keel.client_url()], Some(options)).await {
            Ok(mut c) => c.get("crate", None).await.is_err(),
            Err(_) => true,
        };
        assert!(refused, "a client without a certificate was served");
    });
}

/// Replaces `path` by `from`'s contents in one rename, as certificate managers do.
fn swap(from: &Path, path: &Path) {
    let tmp = path.with_extension("swap");
    std::fs::copy(from, &tmp).expect("copy the new file");
    std::fs::rename(&tmp, path).expect("rename it into place");
}

#[test]
fn a_certificate_swapped_on_disk_is_served_without_a_restart_like_etcd() {
    let pki = Pki::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let live = tempfile::tempdir().expect("a temp dir");
        let (cert, key) = (
            live.path().join("server.pem"),
            live.path().join("server.key"),
        );
        swap(&pki.path("server-ca.pem"), &cert);
        swap(&pki.path("server-ca.key"), &key);
        let args = [
            "--cert-file".to_string(),
            cert.display().to_string(),
            "--key-file".to_string(),
            key.display().to_string(),
        ];
        let server = Server::start_tls(kind, &refs(&args), &refs(&pki.etcdctl_flags(None)));
        let url = format!("{}/health", server.client_url());
        assert_eq!(curl(&url, &["--cacert", &pki.arg("ca.pem")]).0, 200);
        // Key first, then certificate: between the two renames the pair does not match, and
        // the previous pair must stay in service.
        swap(&pki.path("server-ca2.key"), &key);
        std::thread::sleep(Duration::from_millis(50));
        swap(&pki.path("server-ca2.pem"), &cert);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if curl(&url, &["--cacert", &pki.arg("ca2.pem")]).0 == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{kind:?} still serves the old certificate"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            curl(&url, &["--cacert", &pki.arg("ca.pem")]).0,
            0,
            "{kind:?}: the old CA must no longer verify the server"
        );
        let ca2 = [format!("--cacert={}", pki.arg("ca2.pem"))];
        etcdctl_with(&server, &ca2, &["put", "after-swap", "v"]).ok();
    }
}

#[test]
fn auto_tls_serves_a_self_signed_certificate_from_the_data_dir_like_etcd() {
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = Server::start_tls(
            kind,
            &["--auto-tls"],
            &["--insecure-transport=false", "--insecure-skip-tls-verify"],
        );
        server.etcdctl(&["put", "auto", "tls"]).ok();
        let fixtures = server.data_path().join("fixtures").join("client");
        for file in ["cert.pem", "key.pem"] {
            assert!(
                fixtures.join(file).exists(),
                "{kind:?}: no {file} in {fixtures:?}"
            );
        }
        let health = curl(&format!("{}/health", server.client_url()), &["-k"]);
        assert_eq!(health.0, 200, "{kind:?}: {health:?}");
    }
}

#[test]
fn a_handshake_that_never_completes_is_closed_after_the_preface_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(300);
    const SLACK: Duration = Duration::from_secs(2);
    let pki = Pki::new();
    let keel = start(Kind::Keel, &pki, &["--preface-timeout-ms", "300"], None);
    // Nothing at all, and the first bytes of a TLS record header: neither completes.
    for first_bytes in [&b""[..], &[0x16, 0x03, 0x01, 0x02][..]] {
        let elapsed =
            crate::common::closed_silently_after(keel.client_port, first_bytes, TIMEOUT + SLACK);
        assert!(
            elapsed >= TIMEOUT && elapsed < TIMEOUT + SLACK,
            "{first_bytes:?}: closed after {elapsed:?}"
        );
    }
    // The server still serves a real TLS client afterwards.
    keel.etcdctl(&["put", "still", "serving"]).ok();
}

/// Kills the child on drop, so a failed assertion leaves no server behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn http_and_https_listeners_coexist_on_different_urls() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("a temp dir");
    let (tls_port, plain_port, peer_port) = (
        crate::common::free_port(),
        crate::common::free_port(),
        crate::common::free_port(),
    );
    let https = format!("https://127.0.0.1:{tls_port}");
    let http = format!("http://127.0.0.1:{plain_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut args = vec![
        "--data-dir".to_string(),
        dir.path().join("data").display().to_string(),
        "--listen-client-urls".to_string(),
        format!("{https},{http}"),
        "--advertise-client-urls".to_string(),
        format!("{https},{http}"),
        "--listen-peer-urls".to_string(),
        peer.clone(),
        "--initial-advertise-peer-urls".to_string(),
        peer.clone(),
        "--initial-cluster".to_string(),
        format!("default={peer}"),
    ];
    args.extend(pki.server_flags());
    let log = std::fs::File::create(dir.path().join("keel.log")).expect("a log file");
    let _keel = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(&args)
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .expect("keel starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let tls = pki.etcdctl_flags(None);
    loop {
        let put = crate::common::etcdctl_at(
            &https,
            &[&tls[0][..], "--command-timeout=2s", "put", "both", "ways"],
            None,
        );
        if put.code == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no TLS answer: {put:?}\n{}",
            std::fs::read_to_string(dir.path().join("keel.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let get = crate::common::etcdctl_at(&http, &["get", "both"], None).ok();
    assert_eq!(get.stdout, "both\nways\n");
    assert_eq!(
        crate::common::http_get(&format!("127.0.0.1:{plain_port}"), "/health").0,
        200
    );
    assert_eq!(
        curl(
            &format!("{https}/health"),
            &["--cacert", &pki.arg("ca.pem")]
        )
        .0,
        200
    );
}

#[test]
fn a_revoked_client_certificate_is_refused_with_client_crl_file_like_etcd() {
    let pki = Pki::new();
    pki.issue("ca", "client2-ca", "extendedKeyUsage=clientAuth\n");
    std::fs::write(
        pki.path("ca.cnf"),
        "[ca]\ndefault_ca = ca_default\n[ca_default]\ndatabase = index.txt\n\
         crlnumber = crlnumber\ndefault_md = sha256\ndefault_crl_days = 2\n\
         certificate = ca.pem\nprivate_key = ca.key\n",
    )
    .expect("write the CA config");
    std::fs::write(pki.path("index.txt"), "").expect("an empty CA database");
    std::fs::write(pki.path("crlnumber"), "1000\n").expect("a CRL number");
    pki.openssl(&["ca", "-config", "ca.cnf", "-revoke", "client-ca.pem"]);
    pki.openssl(&["ca", "-config", "ca.cnf", "-gencrl", "-out", "crl.pem"]);
    let crl = pki.arg("crl.pem");
    accepts_one_client_and_refuses_another(
        &pki,
        &["--client-crl-file", &crl],
        "client2-ca",
        "client-ca",
        "a revoked certificate",
    );
}

#[test]
fn client_cert_allowed_hostname_refuses_certificates_for_other_names_like_etcd() {
    let pki = Pki::new();
    pki.issue(
        "ca",
        "client-named",
        "subjectAltName=DNS:client.example\nextendedKeyUsage=clientAuth\n",
    );
    accepts_one_client_and_refuses_another(
        &pki,
        &["--client-cert-allowed-hostname", "client.example"],
        "client-named",
        // Trusted by the CA, but not valid for client.example.
        "client-ca",
        "a certificate for another name",
    );
}

/// With client certificates required (CA 1) and `extra` flags, Keel and etcd both serve the
/// client certificate `accepted` and refuse `refused`.
fn accepts_one_client_and_refuses_another(
    pki: &Pki,
    extra: &[&str],
    accepted: &str,
    refused: &str,
    what: &str,
) {
    let ca = pki.arg("ca.pem");
    let mut flags = vec!["--client-cert-auth", "--trusted-ca-file", &ca];
    flags.extend_from_slice(extra);
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = start(kind, pki, &flags, Some(accepted));
        server.etcdctl(&["put", "k", "ok"]).ok();
        let answer = etcdctl_with(
            &server,
            &pki.etcdctl_flags(Some(refused)),
            &["--dial-timeout=2s", "--command-timeout=3s", "get", "k"],
        );
        assert_ne!(answer.code, 0, "{kind:?}: {what} got {answer:?}");
    }
}

#[test]
fn a_client_certificates_common_name_is_the_auth_user_without_a_token_like_etcd() {
    let pki = Pki::new();
    let mut answers = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        // etcdctl presents client-ca.pem, whose common name is "client-ca".
        let server = start(
            kind,
            &pki,
            &[
                "--client-cert-auth",
                "--trusted-ca-file",
                &pki.arg("ca.pem"),
            ],
            Some("client-ca"),
        );
        for args in [
            &["user", "add", "root:rootpw"][..],
            &["user", "grant-role", "root", "root"],
            &["user", "add", "client-ca:pw"],
            &["role", "add", "r"],
            &["role", "grant-permission", "r", "readwrite", "a"],
            &["user", "grant-role", "client-ca", "r"],
            &["auth", "enable"],
        ] {
            let out = server.etcdctl(args);
            assert_eq!(out.code, 0, "{kind:?} {args:?}: {out:?}");
        }
        let mut transcript = Vec::new();
        for args in [
            &["put", "a", "1"][..],
            &["get", "a"],
            &["get", "b"],
            &["put", "b", "1"],
            &["user", "list"],
            // A token wins over the certificate.
            &["--user", "root:rootpw", "user", "list"],
            &["--user", "root:rootpw", "put", "b", "2"],
        ] {
            let out = server.etcdctl(args);
            let err: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| !l.starts_with("{\"level\""))
                .collect();
            transcript.push(format!("{args:?} -> {} {} {:?}", out.code, out.stdout, err));
        }
        answers.push(transcript);
    }
    assert_eq!(answers[0], answers[1], "Keel against etcd");
    assert!(
        answers[0][2].contains("permission denied"),
        "{:?}",
        answers[0]
    );
    assert!(answers[0][0].contains("OK"), "{:?}", answers[0]);
}

/// One JSON gateway request with curl over TLS, HTTP/2 by ALPN: the HTTP version curl used,
/// the status, and the body's JSON lines (ids and terms removed). A streamed answer is read
/// for `max_secs` (a watch does not end by itself).
fn gateway_h2(
    server: &Server,
    ca: &str,
    method: &str,
    path: &str,
    body: &str,
    max_secs: u32,
) -> (String, u32, Vec<serde_json::Value>) {
    require_tool("curl");
    let out = Command::new("curl")
        .args([
            "-s", "-N", "--http2", "--cacert", ca, "-X", method, "-d", body,
        ])
        .args(["--max-time", &max_secs.to_string()])
        .args(["-w", "\n%{http_version} %{http_code}"])
        .arg(format!("{}{path}", server.client_url()))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (version, status) = tail.split_once(' ').expect("curl's -w line");
    let lines = body
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut v = crate::common::json_of(l).unwrap_or(serde_json::Value::String(l.into()));
            crate::common::strip_member_fields(&mut v);
            v
        })
        .collect();
    (
        version.to_string(),
        status.parse().expect("a status code"),
        lines,
    )
}

#[test]
fn the_json_gateway_answers_over_http2_on_tls_like_etcd() {
    let pki = Pki::new();
    let ca = pki.arg("ca.pem");
    let mut answers = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = start(kind, &pki, &[], None);
        let mut got = Vec::new();
        for (method, path, body) in [
            ("POST", "/v3/kv/put", r#"{"key":"YQ==","value":"Yg=="}"#),
            ("POST", "/v3/kv/range", r#"{"key":"YQ=="}"#),
            ("PUT", "/v3/kv/range", "{}"),
            ("POST", "/v3/lease/keepalive", r#"{"ID":"5"}"#),
        ] {
            got.push(gateway_h2(&server, &ca, method, path, body, 10));
        }
        // A bad request: only the status and code compare (Go's and Rust's parsers word
        // their errors differently).
        let (version, status, lines) = gateway_h2(&server, &ca, "POST", "/v3/kv/range", "{bad", 10);
        got.push((version, status, vec![lines[0]["code"].clone()]));
        // A watch replaying the put, read until curl gives up on the open stream.
        got.push(gateway_h2(
            &server,
            &ca,
            "POST",
            "/v3/watch",
            r#"{"create_request":{"key":"YQ==","start_revision":"1"}}"#,
            2,
        ));
        answers.push(got);
    }
    let ours = &answers[0];
    assert_eq!(ours[1].0, "2", "HTTP/2: {ours:?}");
    assert_eq!(ours[1].2[0]["kvs"][0]["value"], "Yg==", "{ours:?}");
    assert_eq!(ours[2].1, 405, "{ours:?}");
    assert_eq!(ours[5].2.len(), 2, "created and the event: {ours:?}");
    for (i, (ours, theirs)) in answers[0].iter().zip(&answers[1]).enumerate() {
        assert_eq!(
            ours, theirs,
            "answer {i}: keel (left) and etcd (right) differ"
        );
    }
}
