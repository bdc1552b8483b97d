//! Authentication and RBAC, side by side with etcd 3.4: the same etcdctl `user`/`role`/`auth`
//! transcript against a fresh Keel and a fresh etcd must print the same thing, command by
//! command; watches on forbidden ranges, token expiry through the JSON gateway, the
//! etcd-client crate's auth API, and auth state across a restart.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, Permission, PutOptions, RoleRevokePermissionOptions,
    WatchOptions,
};

use crate::common::{grpc_error, Kind, Server};

/// The transcript: etcdctl arguments, one command a line; `--user u:p` makes etcdctl
/// authenticate first; `<<< text` feeds stdin (`\n` for newlines); `''` is an empty argument.
const TRANSCRIPT: &str = r#"
# Before auth: enabling needs a root user.
auth enable
user add root:rootpw
user add alice:alicepw
user add alice:x
user add --no-password=true nopw
role add reader
role add reader
role add ''
role grant-permission reader read foo
role grant-permission reader --prefix readwrite pre/
role grant-permission reader write w1 w9
role grant-permission reader read open --from-key
role grant-permission nosuch read foo
user grant-role alice reader
user grant-role alice nosuch
user grant-role ghost reader
role get reader
user get alice
user list
role list
# etcdctl adds the root role and grants it to root when enable says it is missing.
auth enable
auth enable
role list
--user root:rootpw user list
--user root:rootpw user get root
--user root:rootpw role get root
# Without credentials, with root, with alice's grants.
put foo bar
get foo
--user root:rootpw put foo bar
--user root:rootpw put w5 five
--user alice:alicepw get foo
--user alice:alicepw put foo x
--user alice:alicepw put pre/a 1
--user alice:alicepw get pre/ --prefix
--user alice:alicepw get pre --prefix
--user alice:alicepw put w5 v
--user alice:alicepw get w5
--user alice:alicepw del w5
--user alice:alicepw del w1 w8
--user alice:alicepw del w1 wz
--user alice:alicepw del --prev-kv w1 w8
--user alice:alicepw get open2
--user alice:alicepw get open --from-key
--user alice:alicepw get o --from-key
# Every op of a txn is checked, and compares need read.
--user alice:alicepw txn -i <<< mod("pre/a") > "0"\n\nput pre/b 2\n\nput pre/c 3\n
--user alice:alicepw txn -i <<< mod("pre/a") > "0"\n\nput pre/b 2\nput foo 2\n\n
--user alice:alicepw txn -i <<< mod("secret") > "0"\n\nput pre/b 2\n\n\n
--user alice:alicepw txn -i <<< \nget w5\n\n\n
--user alice:alicepw txn -i <<< \nget foo\nget pre/a\n\n\n
--user alice:wrong get foo
--user bob:x get foo
--user nopw: get foo
--user nopw:x get foo
# Administration needs the root role (reads of oneself and one's own roles excepted).
--user alice:alicepw user list
--user alice:alicepw role list
--user alice:alicepw user get alice
--user alice:alicepw user get root
--user alice:alicepw role get reader
--user alice:alicepw role get root
--user alice:alicepw user add eve:e
--user alice:alicepw auth disable
--user alice:alicepw compaction 1
--user alice:alicepw defrag
--user alice:alicepw alarm list
--user root:rootpw user delete root
--user root:rootpw role delete root
--user root:rootpw user revoke-role root root
--user root:rootpw user revoke-role alice nosuch
--user root:rootpw user revoke-role ghost reader
--user root:rootpw role revoke-permission reader nokey
--user root:rootpw role revoke-permission nosuch foo
--user root:rootpw role revoke-permission reader foo
--user root:rootpw role get reader
--user alice:alicepw get foo
# A new password, revoked and deleted roles, a deleted user.
--user root:rootpw user passwd alice --interactive=false <<< newpw\n
--user alice:alicepw get pre/a
--user alice:newpw get pre/a
--user root:rootpw user revoke-role alice reader
--user alice:newpw get pre/a
--user root:rootpw user grant-role alice reader
--user root:rootpw role delete reader
--user alice:newpw get pre/a
--user root:rootpw user get alice
--user root:rootpw user delete alice
--user root:rootpw user delete alice
--user root:rootpw auth disable
get foo
user list
auth disable
role get root
user delete root
"#;

/// One transcript command: its arguments and stdin.
fn parse_line(line: &str) -> (Vec<String>, Option<String>) {
    let (command, stdin) = match line.split_once(" <<< ") {
        Some((c, input)) => (c, Some(input.replace("\\n", "\n"))),
        None => (line, None),
    };
    let args = command
        .split_whitespace()
        .map(|w| {
            if w == "''" {
                String::new()
            } else {
                w.to_string()
            }
        })
        .collect();
    (args, stdin)
}

/// What a command printed and how it ended, without what differs between two servers:
/// etcdctl's client log lines (timestamps, connection ids) and the server's address.
fn normalized(server: &Server, out: crate::common::Output) -> String {
    let text = format!("{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("{\"level\""))
        .collect();
    format!("{}\nexit {}", lines.join("\n"), out.code).replace(&server.endpoint(), "ENDPOINT")
}

fn run_transcript(server: &Server) -> Vec<(String, String)> {
    run_lines(server, TRANSCRIPT)
}

fn run_lines(server: &Server, transcript: &str) -> Vec<(String, String)> {
    transcript
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (args, stdin) = parse_line(line);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = match &stdin {
                Some(input) => server.etcdctl_stdin(&args, input),
                None => server.etcdctl(&args),
            };
            (line.to_string(), normalized(server, out))
        })
        .collect()
}

#[test]
fn the_etcdctl_auth_transcript_matches_etcd() {
    let keel = Server::keel(&[]);
    let etcd = Server::etcd(&[]);
    let ours = run_transcript(&keel);
    let theirs = run_transcript(&etcd);
    assert_same_transcript(&ours, &theirs);
    // The transcript exercised what it claims: denials, admin refusals, grants.
    let all: String = ours.iter().map(|(_, o)| o.as_str()).collect();
    for expected in [
        "etcdserver: permission denied",
        "etcdserver: user name is empty",
        "etcdserver: authentication failed, invalid user ID or password",
        "etcdserver: invalid auth management",
        "etcdserver: root user does not exist",
        "Authentication Enabled",
        "Authentication Disabled",
        "Password updated",
    ] {
        assert!(all.contains(expected), "no {expected:?} in the transcript");
    }
}

fn assert_same_transcript(ours: &[(String, String)], theirs: &[(String, String)]) {
    assert_eq!(ours.len(), theirs.len());
    let mut mismatches = Vec::new();
    for ((line, got), (_, want)) in ours.iter().zip(theirs) {
        if got != want {
            mismatches.push(format!("$ {line}\n--- etcd\n{want}\n--- keel\n{got}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} commands differ:\n{}",
        mismatches.len(),
        ours.len(),
        mismatches.join("\n\n")
    );
}

/// Sets up root and a user `alice` that may read and write `pre/` only, and enables auth.
fn setup_users(server: &Server) {
    for args in [
        &["user", "add", "root:rootpw"][..],
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
        &["auth", "enable"],
    ] {
        server.etcdctl(args).ok();
    }
}

async fn connect_as(server: &Server, user: &str, password: &str) -> Client {
    Client::connect(
        [server.client_url()],
        Some(ConnectOptions::new().with_user(user, password)),
    )
    .await
    .expect("etcd-client connects and authenticates")
}

/// What a watch on `key` (a prefix when `prefix`) answers first.
async fn first_watch_answer(client: &mut Client, key: &str, prefix: bool) -> (bool, bool, String) {
    let options = prefix.then(|| WatchOptions::new().with_prefix());
    let mut stream = client.watch(key, options).await.expect("watch opens");
    let resp = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an answer within 5 s")
        .expect("the stream stays up")
        .expect("a message");
    (
        resp.created(),
        resp.canceled(),
        resp.cancel_reason().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_on_a_forbidden_range_is_refused_as_etcd_refuses_it() {
    let mut answers = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = Server::start(kind, &[]);
        setup_users(&server);
        let mut alice = connect_as(&server, "alice", "alicepw").await;
        let allowed = first_watch_answer(&mut alice, "pre/", true).await;
        assert_eq!(allowed, (true, false, String::new()), "{kind:?}");
        let denied_key = first_watch_answer(&mut alice, "secret", false).await;
        let denied_prefix = first_watch_answer(&mut alice, "pr", true).await;
        assert_eq!((denied_key.0, denied_key.1), (true, true), "{kind:?}");
        // Without credentials a watch is refused too.
        let mut anonymous = crate::common::client(&server).await;
        let no_user = first_watch_answer(&mut anonymous, "pre/a", false).await;
        answers.push((denied_key, denied_prefix, no_user));
    }
    assert_eq!(
        answers[0], answers[1],
        "keel (left) and etcd (right) differ"
    );
    assert!(answers[0].0 .2.contains("etcdserver: permission denied"));
    assert!(answers[0].2 .2.contains("etcdserver: user name is empty"));
}

/// One gateway call with an optional `Authorization` token; the status and body.
fn gateway(
    server: &Server,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let addr = server.endpoint();
    let mut s = TcpStream::connect(&addr).expect("the server accepts TCP");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("the request is sent");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        // One chunk is all these small answers take (a trailer may follow it).
        let (size, rest) = body.split_once("\r\n").expect("a chunk size line");
        let n = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        &rest[..n]
    } else {
        body
    };
    let json = crate::common::json_of(body).unwrap_or(serde_json::Value::Null);
    (status, json)
}

#[test]
fn simple_tokens_expire_after_the_ttl_unused_on_both_servers() {
    let mut outcomes = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = Server::start(kind, &["--auth-token-ttl", "2"]);
        setup_users(&server);
        let (status, json) = gateway(
            &server,
            "/v3/auth/authenticate",
            r#"{"name":"alice","password":"alicepw"}"#,
            None,
        );
        assert_eq!(status, 200, "{kind:?}: {json}");
        let token = json["token"].as_str().expect("a token").to_string();
        // The simple token's shape: 16 letters, a dot, the raft index.
        let (prefix, index) = token.split_once('.').expect("prefix.index");
        assert!(prefix.len() == 16 && prefix.bytes().all(|b| b.is_ascii_alphabetic()));
        assert!(index.parse::<u64>().is_ok(), "{token}");
        let range = r#"{"key":"cHJlL2E="}"#;
        // Used within the TTL, a token lives on (each use restarts it).
        let mut used = Vec::new();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1200));
            used.push(gateway(&server, "/v3/kv/range", range, Some(&token)).0);
        }
        let denied = gateway(
            &server,
            "/v3/kv/range",
            r#"{"key":"c2VjcmV0"}"#,
            Some(&token),
        );
        // Unused for well past the TTL (etcd sweeps once a second), it is gone.
        std::thread::sleep(Duration::from_millis(4500));
        let (expired_status, expired) = gateway(&server, "/v3/kv/range", range, Some(&token));
        let garbage = gateway(&server, "/v3/kv/range", range, Some("nonsense"));
        outcomes.push((
            used,
            denied.0,
            denied.1["error"].clone(),
            expired_status,
            expired["error"].clone(),
            expired["code"].clone(),
            garbage.0,
            garbage.1["error"].clone(),
        ));
    }
    assert_eq!(
        outcomes[0], outcomes[1],
        "keel (left) and etcd (right) differ"
    );
    let o = &outcomes[0];
    assert_eq!(o.0, vec![200, 200, 200]);
    assert_eq!(o.1, 403);
    assert_eq!(o.3, 401, "an expired token is unauthenticated");
    assert_eq!(o.4, "etcdserver: invalid auth token");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_etcd_client_auth_api_works_against_keel() {
    let server = Server::keel(&[]);
    let mut root = crate::common::client(&server).await;
    let mut auth = root.auth_client();
    auth.role_add("rw").await.expect("role add");
    auth.role_grant_permission("rw", Permission::read_write("app/").with_prefix())
        .await
        .expect("grant");
    auth.role_grant_permission("rw", Permission::read("conf"))
        .await
        .expect("grant");
    auth.user_add("root", "rootpw", None)
        .await
        .expect("user add");
    auth.user_grant_role("root", "root")
        .await
        .expect("root role");
    auth.user_add("app", "apppw", None).await.expect("user add");
    auth.user_grant_role("app", "rw").await.expect("grant role");
    let role = auth.role_get("rw").await.expect("role get");
    assert_eq!(role.permissions().len(), 2);
    assert_eq!(
        auth.user_get("app").await.expect("user get").roles(),
        ["rw"]
    );
    let users = auth.user_list().await.expect("user list");
    assert_eq!(users.users(), ["app", "root"]);
    auth.auth_enable().await.expect("auth enable");

    // The old connection has no credentials now.
    let (code, message) = grpc_error(root.get("app/x", None).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("InvalidArgument", "etcdserver: user name is empty")
    );
    let mut app = connect_as(&server, "app", "apppw").await;
    app.put("app/x", "1", None).await.expect("a permitted put");
    let got = app
        .get("app/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("a permitted range");
    assert_eq!(got.kvs().len(), 1);
    let (code, message) = grpc_error(app.put("conf", "x", None).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("PermissionDenied", "etcdserver: permission denied")
    );
    app.get("conf", None)
        .await
        .expect("read is granted on conf");
    // A lease on a key the user may write can be revoked by it; one on another key cannot.
    let mut admin = connect_as(&server, "root", "rootpw").await;
    let lease = admin.lease_grant(60, None).await.expect("grant").id();
    admin
        .put("elsewhere", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("root puts anywhere");
    let (code, _) = grpc_error(app.lease_revoke(lease).await);
    assert_eq!(code, "PermissionDenied");
    let (code, _) = grpc_error(
        app.put("app/y", "x", Some(PutOptions::new().with_lease(lease)))
            .await,
    );
    assert_eq!(
        code, "PermissionDenied",
        "attaching a lease needs write on its keys"
    );
    // Management needs root.
    let (code, _) = grpc_error(app.auth_client().user_list().await);
    assert_eq!(code, "PermissionDenied");
    let mut admin_auth = admin.auth_client();
    admin_auth
        .role_revoke_permission(
            "rw",
            "app/",
            Some(RoleRevokePermissionOptions::new().with_prefix()),
        )
        .await
        .expect("revoke");
    // The client's token resolves at the new auth revision: the put is now refused.
    let (code, _) = grpc_error(app.put("app/x", "2", None).await);
    assert_eq!(code, "PermissionDenied");
    let (code, message) = grpc_error(admin_auth.user_delete("root").await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("InvalidArgument", "etcdserver: invalid auth management")
    );
    admin_auth.auth_disable().await.expect("auth disable");
    root.put("app/x", "3", None)
        .await
        .expect("without auth anyone writes");
}

#[test]
fn auth_state_survives_a_restart_and_a_checkpoint() {
    // A small snapshot count makes a checkpoint carry part of the auth state; the rest
    // replays from the WAL after it.
    let mut server = Server::keel(&["--snapshot-count", "5"]);
    setup_users(&server);
    for i in 0..8 {
        server
            .etcdctl(&["--user", "root:rootpw", "put", &format!("k{i}"), "v"])
            .ok();
    }
    server
        .etcdctl(&["--user", "root:rootpw", "role", "add", "late"])
        .ok();
    server
        .etcdctl(&[
            "--user",
            "root:rootpw",
            "role",
            "grant-permission",
            "late",
            "read",
            "k1",
        ])
        .ok();
    server
        .etcdctl(&[
            "--user",
            "root:rootpw",
            "user",
            "grant-role",
            "alice",
            "late",
        ])
        .ok();
    assert!(
        server.log_all().contains("checkpoint written"),
        "a checkpoint was written before the restart"
    );
    // A token lives in the member's memory only: a restart forgets it, as etcd's does.
    let (status, json) = gateway(
        &server,
        "/v3/auth/authenticate",
        r#"{"name":"alice","password":"alicepw"}"#,
        None,
    );
    assert_eq!(status, 200, "{json}");
    let token = json["token"].as_str().expect("a token").to_string();
    let pre_a = r#"{"key":"cHJlL2E="}"#;
    assert_eq!(gateway(&server, "/v3/kv/range", pre_a, Some(&token)).0, 200);
    server.stop();
    // With auth enabled, etcdctl's health check (an anonymous Get) fails: wait for TCP only.
    server.relaunch();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let users = loop {
        let out = server.etcdctl(&["--user", "root:rootpw", "user", "list"]);
        if out.code == 0 {
            break out.stdout;
        }
        assert!(std::time::Instant::now() < deadline, "no answer: {out:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(users, "alice\nroot\n");
    let (status, json) = gateway(&server, "/v3/kv/range", pre_a, Some(&token));
    assert_eq!(
        (status, json["error"].as_str()),
        (401, Some("etcdserver: invalid auth token"))
    );
    let out = server.etcdctl(&["get", "k1"]);
    assert!(
        out.stderr.contains("etcdserver: user name is empty"),
        "auth is still enabled: {out:?}"
    );
    let out = server
        .etcdctl(&["--user", "alice:alicepw", "get", "k1"])
        .ok();
    assert_eq!(
        out.stdout, "k1\nv\n",
        "the role granted after the checkpoint"
    );
    let out = server.etcdctl(&["--user", "alice:alicepw", "get", "k2"]);
    assert!(
        out.stderr.contains("etcdserver: permission denied"),
        "{out:?}"
    );
    server
        .etcdctl(&["--user", "alice:alicepw", "put", "pre/x", "1"])
        .ok();
    let out = server
        .etcdctl(&["--user", "root:rootpw", "role", "get", "pre"])
        .ok();
    assert!(out.stdout.contains("[pre/, pre0) (prefix pre/)"), "{out:?}");
}

#[test]
fn locks_take_the_callers_permissions_like_etcd() {
    let mut outcomes = Vec::new();
    for kind in [Kind::Keel, Kind::Etcd] {
        let server = Server::start(kind, &[]);
        setup_users(&server);
        let mut outcome = Vec::new();
        for args in [
            &["--user", "alice:alicepw", "lock", "pre/l", "echo", "held"][..],
            &["--user", "alice:alicepw", "lock", "secret", "echo", "held"],
            &["lock", "pre/l", "echo", "held"],
            &["--user", "root:rootpw", "lock", "secret", "echo", "held"],
        ] {
            let out = server.etcdctl(args);
            // The lock key holds a lease id, which differs: keep the command's output and
            // the error.
            let held = out.stdout.lines().any(|l| l == "held");
            let error = out
                .stderr
                .lines()
                .find(|l| l.starts_with("Error:"))
                .unwrap_or("")
                .to_string();
            outcome.push((out.code, held, error));
        }
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes[0], outcomes[1],
        "keel (left) and etcd (right) differ"
    );
    assert!(outcomes[0][0].1, "alice holds a lock under her prefix");
    assert!(outcomes[0][3].1, "root locks anywhere");
    assert!(!outcomes[0][1].1 && !outcomes[0][2].1);
}

/// The JWT transcript: what etcdctl prints must not depend on the token provider.
const JWT_TRANSCRIPT: &str = r#"
user add root:rootpw
user add alice:alicepw
role add pre
role grant-permission pre --prefix readwrite pre/
user grant-role alice pre
auth enable
put foo bar
--user root:rootpw put foo bar
--user root:rootpw get foo
--user alice:alicepw put pre/a 1
--user alice:alicepw get pre/a
--user alice:alicepw put foo x
--user alice:alicepw get foo
--user alice:wrong get pre/a
--user alice:alicepw user list
--user root:rootpw user list
"#;

/// Logs in through the JSON gateway; the token.
fn authenticate(server: &Server, user: &str, password: &str) -> String {
    let (status, json) = gateway(
        server,
        "/v3/auth/authenticate",
        &format!(r#"{{"name":"{user}","password":"{password}"}}"#),
        None,
    );
    assert_eq!(status, 200, "{json}");
    json["token"].as_str().expect("a token").to_string()
}

/// A range on `pre/a` with `token`: the status and etcd's error text (empty on success).
fn range_pre_a(server: &Server, token: &str) -> (u16, String) {
    let (status, json) = gateway(server, "/v3/kv/range", r#"{"key":"cHJlL2E="}"#, Some(token));
    (status, json["error"].as_str().unwrap_or("").to_string())
}

/// The claims of a JWT token, decoded without checking it.
fn jwt_claims(token: &str) -> serde_json::Value {
    use base64::Engine;
    let claims = token.split('.').nth(1).expect("a JWT has three parts");
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims)
        .expect("base64url claims");
    serde_json::from_slice(&json).expect("JSON claims")
}

#[test]
fn jwt_tokens_work_as_etcds_and_cross_verify() {
    let pki = crate::common::OpensslPki::new("keel-jwt", &[]);
    pki.openssl(&["genrsa", "-out", "rsa.key", "2048"]);
    pki.openssl(&["rsa", "-in", "rsa.key", "-pubout", "-out", "rsa.pub"]);
    // SEC1 ("EC PRIVATE KEY"), as `openssl ecparam -genkey` writes it.
    pki.openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "ec.key",
    ]);
    pki.openssl(&["ec", "-in", "ec.key", "-pubout", "-out", "ec.pub"]);
    let path = |name: &str| pki.path(name).display().to_string();
    for (method, key, ttl_s) in [("RS256", "rsa", 3u64), ("ES256", "ec", 300)] {
        let flag = format!(
            "jwt,pub-key={},priv-key={},sign-method={method},ttl={ttl_s}s",
            path(&format!("{key}.pub")),
            path(&format!("{key}.key"))
        );
        let mut keel = Server::keel(&["--auth-token", &flag]);
        let etcd = Server::etcd(&["--auth-token", &flag]);
        let ours = run_lines(&keel, JWT_TRANSCRIPT);
        let theirs = run_lines(&etcd, JWT_TRANSCRIPT);
        assert_same_transcript(&ours, &theirs);
        let all: String = ours.iter().map(|(_, o)| o.as_str()).collect();
        assert!(all.contains("etcdserver: permission denied"), "{all}");

        // Same claims (the auth revision included), and each server accepts the other's token.
        let keel_token = authenticate(&keel, "alice", "alicepw");
        let etcd_token = authenticate(&etcd, "alice", "alicepw");
        let (ours, theirs) = (jwt_claims(&keel_token), jwt_claims(&etcd_token));
        assert_eq!(ours["username"], "alice", "{method}");
        assert_eq!(ours["revision"], theirs["revision"], "{method}");
        let exp_gap = ours["exp"].as_i64().expect("exp") - theirs["exp"].as_i64().expect("exp");
        assert!(exp_gap.abs() <= 2, "{method}: exp {ours} vs {theirs}");
        for (server, token) in [
            (&keel, &etcd_token),
            (&etcd, &keel_token),
            (&keel, &keel_token),
        ] {
            assert_eq!(range_pre_a(server, token), (200, String::new()), "{method}");
        }
        let garbage = [range_pre_a(&keel, "a.b.c"), range_pre_a(&etcd, "a.b.c")];
        assert_eq!(garbage[0], garbage[1], "{method}");
        assert_eq!(garbage[0], (401, "etcdserver: invalid auth token".into()));

        if ttl_s < 10 {
            // Past its exp the token is invalid on both.
            std::thread::sleep(Duration::from_secs(ttl_s + 1));
            let expired = [
                range_pre_a(&keel, &keel_token),
                range_pre_a(&etcd, &etcd_token),
            ];
            assert_eq!(expired[0], expired[1], "{method}");
            assert_eq!(expired[0], (401, "etcdserver: invalid auth token".into()));
            continue;
        }
        // A JWT token is stateless: it outlives a restart (a simple token does not).
        keel.stop();
        keel.relaunch();
        // With auth enabled, etcdctl's health check (an anonymous Get) fails: wait for a login.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while keel
            .etcdctl(&["--user", "root:rootpw", "user", "list"])
            .code
            != 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "keel answers after a restart"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(range_pre_a(&keel, &keel_token), (200, String::new()));
        // Any auth change makes every token signed before it old, on both (etcd compares the
        // token's revision with the store's).
        for server in [&keel, &etcd] {
            let out = server.etcdctl(&["--user", "root:rootpw", "role", "add", "later"]);
            assert_eq!(out.code, 0, "{}", out.stderr);
        }
        let old = [
            range_pre_a(&keel, &keel_token),
            range_pre_a(&etcd, &etcd_token),
        ];
        assert_eq!(old[0], old[1], "{method}");
        assert_eq!(
            old[0],
            (400, "etcdserver: revision of auth store is old".into())
        );
        let fresh = authenticate(&keel, "alice", "alicepw");
        assert_eq!(range_pre_a(&keel, &fresh), (200, String::new()));
    }
}

#[test]
fn a_bad_jwt_key_stops_the_start_as_etcd_refuses_it() {
    let pki = crate::common::OpensslPki::new("keel-jwt-bad", &[]);
    pki.openssl(&["genrsa", "-out", "rsa.key", "2048"]);
    let key = pki.path("rsa.key").display().to_string();
    let data = tempfile::tempdir().expect("a temp dir");
    for (flag, says) in [
        (
            "jwt,sign-method=RS256".to_string(),
            "auth: missing key data",
        ),
        (
            format!("jwt,priv-key={key},sign-method=XX"),
            "auth: invalid auth options",
        ),
        (
            format!("jwt,priv-key={key},sign-method=RS256,ttl=abc"),
            "auth: invalid auth options",
        ),
        (
            format!("jwt,priv-key={key},sign-method=ES256"),
            "Key is not a valid ECDSA private key",
        ),
        ("bogus".to_string(), "auth: invalid auth options"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["--data-dir", &data.path().join("d").display().to_string()])
            .args(["--auth-token", &flag])
            .output()
            .expect("keel runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: started");
        assert!(stderr.contains(says), "{flag}: {stderr}");
    }
}

#[test]
fn verify_only_and_no_op_providers_refuse_logins_as_etcd_does() {
    let pki = crate::common::OpensslPki::new("keel-jwt-verify", &[]);
    pki.openssl(&["genrsa", "-out", "rsa.key", "2048"]);
    pki.openssl(&["rsa", "-in", "rsa.key", "-pubout", "-out", "rsa.pub"]);
    let verify_only = format!(
        "jwt,pub-key={},sign-method=RS256",
        pki.path("rsa.pub").display()
    );
    for (flag, says) in [
        (
            verify_only.as_str(),
            "auth: token signing attempted with verify-only key",
        ),
        // etcd's no-op provider: no login succeeds, no token is valid.
        (
            "",
            "etcdserver: authentication failed, invalid user ID or password",
        ),
    ] {
        let mut outputs = Vec::new();
        for kind in [Kind::Keel, Kind::Etcd] {
            let server = Server::start(kind, &["--auth-token", flag]);
            setup_users(&server);
            let login = server.etcdctl(&["--user", "root:rootpw", "get", "foo"]);
            let wrong = server.etcdctl(&["--user", "root:wrong", "get", "foo"]);
            outputs.push((
                normalized(&server, login),
                normalized(&server, wrong),
                range_pre_a(&server, "a.b.c"),
            ));
        }
        assert_eq!(
            outputs[0], outputs[1],
            "{flag:?}: keel (left) and etcd (right) differ"
        );
        assert!(outputs[0].0.contains(says), "{flag:?}: {:?}", outputs[0]);
        assert_eq!(outputs[0].2, (401, "etcdserver: invalid auth token".into()));
    }
}
