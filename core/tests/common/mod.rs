//! The end-to-end harness: starts the real `keel` binary (or a real etcd 3.4 for the
//! differential test) on free loopback ports with a fresh data directory, waits until it
//! answers, and stops it on drop (SIGTERM, then SIGKILL after a grace period). It can also
//! restart a server on the same data directory and kill it with SIGKILL mid-flight.
//!
//! etcd and etcdctl are required: when either is missing every test that needs it fails with a
//! message that says what to install, because a skipped end-to-end suite looks green in CI.

#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server may take to answer `endpoint health` after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long SIGTERM gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Which server binary a [`Server`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Keel,
    Etcd,
}

/// What a finished command printed and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Panics with everything the command printed unless it exited 0.
    pub fn ok(self) -> Output {
        assert_eq!(self.code, 0, "command failed: {self:?}");
        self
    }

    /// Panics unless the command failed with exit status 1 (etcdctl's for an error the server
    /// answered) and its stderr holds `words`; `what` names the case in the message.
    pub fn refused(self, words: &str, what: impl std::fmt::Debug) -> Output {
        assert!(
            self.code == 1 && self.stderr.contains(words),
            "{what:?}: expected a refusal with {words:?}, got {self:?}"
        );
        self
    }

    /// The stdout parsed as JSON (etcdctl `-w json` prints one document, possibly after the
    /// interactive txn prompts).
    pub fn json(&self) -> serde_json::Value {
        json_of(&self.stdout).unwrap_or_else(|| panic!("no JSON in stdout: {self:?}"))
    }
}

/// The first JSON document in `text`, skipping lines before it (etcdctl's txn prompts).
pub fn json_of(text: &str) -> Option<serde_json::Value> {
    let start = text.find(['{', '['])?;
    serde_json::from_str(text[start..].trim()).ok()
}

/// The CPU member `index` of a cluster on this host pins its raft core to (`--raft-cpu`):
/// the index-th of the CPUs this process may run on, round the list, counted as keel counts
/// them, so the members spread over the CPUs instead of all taking the last one (a single
/// member's default) and starving each other's raft cores. Named explicitly, so a test does
/// not depend on how members that share a host place themselves.
pub fn raft_cpu_of(index: usize) -> usize {
    let cpus = keel_core::rt::process_cpu_list();
    cpus[index % cpus.len()]
}

/// Ports handed out in this process, so two tests running in parallel never get the same one.
static PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago and was not handed out before in this process.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral port");
        let port = listener
            .local_addr()
            .expect("a bound listener has an address")
            .port();
        let mut ports = PORTS
            .lock()
            .expect("no test panics while holding the port set");
        if ports.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// Fails the test with a clear message when `tool` is not on PATH.
pub fn require_tool(tool: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "`{tool}` is not installed or not on PATH: .ci/run installs every tool the tests use \
         (etcd 3.4's etcd and etcdctl: apt-get install etcd-server etcd-client)"
    );
}

/// Runs etcdctl (API v3) against `endpoints`, optionally feeding `stdin`.
pub fn etcdctl_at(endpoints: &str, args: &[&str], stdin: Option<&str>) -> Output {
    require_tool("etcdctl");
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--dial-timeout=5s")
        .arg("--command-timeout=10s")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("etcdctl starts");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin was piped");
        pipe.write_all(input.as_bytes())
            .expect("etcdctl reads its stdin");
    }
    let out = child.wait_with_output().expect("etcdctl finishes");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// One server process with its own ports and data directory.
pub struct Server {
    pub kind: Kind,
    pub client_port: u16,
    pub peer_port: u16,
    /// Where the process runs; the data directory and the logs live below it.
    pub dir: tempfile::TempDir,
    pub data_dir: PathBuf,
    extra_args: Vec<String>,
    /// Environment variables the process starts with (test-only knobs).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    /// How many times the process was started, to name each run's log file.
    launches: u32,
    /// etcdctl's TLS flags (--cacert, --cert, --key) when the client URL is https; None for
    /// a plaintext server.
    pub etcdctl_tls: Option<Vec<String>>,
}

impl Server {
    /// Starts keel with `extra_args` on top of the ports and data directory, and waits until
    /// it answers.
    pub fn keel(extra_args: &[&str]) -> Server {
        Server::start(Kind::Keel, extra_args)
    }

    /// The server the generic tests run against: keel, or real etcd when the environment
    /// variable `KEEL_E2E_TARGET=etcd` is set, to check a test's expectations against etcd.
    pub fn under_test(extra_args: &[&str]) -> Server {
        match std::env::var("KEEL_E2E_TARGET").as_deref() {
            Ok("etcd") => Server::start(Kind::Etcd, extra_args),
            _ => Server::start(Kind::Keel, extra_args),
        }
    }

    /// Starts a real etcd the same way.
    pub fn etcd(extra_args: &[&str]) -> Server {
        Server::start(Kind::Etcd, extra_args)
    }

    pub fn start(kind: Kind, extra_args: &[&str]) -> Server {
        Server::start_with(kind, free_port(), free_port(), extra_args, &[], None, None)
    }

    /// Starts a server on the given client and peer ports (e.g. ones another server just
    /// left), with a fresh data directory.
    pub fn start_on(kind: Kind, client_port: u16, peer_port: u16, extra_args: &[&str]) -> Server {
        Server::start_with(kind, client_port, peer_port, extra_args, &[], None, None)
    }

    /// Starts a server on the given ports with a fresh data directory, without waiting for it
    /// to answer: for a start that must fail ([`Server::wait_exit`], [`Server::log_all`]).
    pub fn launch_on(kind: Kind, client_port: u16, peer_port: u16) -> Server {
        let mut server = Server::unstarted(kind, client_port, peer_port, &[], &[], None, None);
        server.launch();
        server
    }

    /// Starts a server with environment variables set and, optionally, its data directory at
    /// `data_dir` instead of inside its own temp dir (e.g. on a small filesystem a test made).
    pub fn start_in(
        kind: Kind,
        extra_args: &[&str],
        env: &[(&str, &str)],
        data_dir: Option<PathBuf>,
    ) -> Server {
        Server::start_with(
            kind,
            free_port(),
            free_port(),
            extra_args,
            env,
            data_dir,
            None,
        )
    }

    /// Starts a server whose client URL is https, with `extra_args` giving it its
    /// certificates; `etcdctl_tls` are the flags etcdctl needs to reach it (readiness checks
    /// and [`Server::etcdctl`] use them).
    pub fn start_tls(kind: Kind, extra_args: &[&str], etcdctl_tls: &[&str]) -> Server {
        Server::start_with(
            kind,
            free_port(),
            free_port(),
            extra_args,
            &[],
            None,
            Some(etcdctl_tls.iter().map(|s| s.to_string()).collect()),
        )
    }

    pub fn start_with(
        kind: Kind,
        client_port: u16,
        peer_port: u16,
        extra_args: &[&str],
        env: &[(&str, &str)],
        data_dir: Option<PathBuf>,
        etcdctl_tls: Option<Vec<String>>,
    ) -> Server {
        let mut server = Server::unstarted(
            kind,
            client_port,
            peer_port,
            extra_args,
            env,
            data_dir,
            etcdctl_tls,
        );
        server.launch();
        server.wait_ready();
        server
    }

    /// Starts a server on `data_dir` (e.g. a restored snapshot's) whose auth is enabled:
    /// etcdctl's health check (an anonymous Get) fails there, so it is checked as `user`
    /// ("name:password") instead.
    pub fn start_with_auth(
        kind: Kind,
        client_port: u16,
        peer_port: u16,
        data_dir: PathBuf,
        user: &str,
    ) -> Server {
        let mut server =
            Server::unstarted(kind, client_port, peer_port, &[], &[], Some(data_dir), None);
        server.launch();
        server.wait_ready_as(Some(user));
        server
    }

    fn unstarted(
        kind: Kind,
        client_port: u16,
        peer_port: u16,
        extra_args: &[&str],
        env: &[(&str, &str)],
        data_dir: Option<PathBuf>,
        etcdctl_tls: Option<Vec<String>>,
    ) -> Server {
        require_tool("etcdctl");
        if kind == Kind::Etcd {
            require_tool("etcd");
        }
        let dir = tempfile::Builder::new()
            .prefix("keel-e2e-")
            .tempdir()
            .expect("a temp dir");
        let data_dir = data_dir.unwrap_or_else(|| dir.path().join("data"));
        Server {
            kind,
            client_port,
            peer_port,
            dir,
            data_dir,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            launches: 0,
            etcdctl_tls,
        }
    }

    /// "127.0.0.1:port", as etcdctl's --endpoints wants it.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn client_url(&self) -> String {
        let scheme = if self.etcdctl_tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// etcdctl's --endpoints for this server, with the TLS flags it needs in front of `args`.
    fn etcdctl_target(&self, args: &[&str]) -> (String, Vec<String>) {
        match &self.etcdctl_tls {
            None => (
                self.endpoint(),
                args.iter().map(|s| s.to_string()).collect(),
            ),
            Some(tls) => (
                self.client_url(),
                tls.iter()
                    .cloned()
                    .chain(args.iter().map(|s| s.to_string()))
                    .collect(),
            ),
        }
    }

    fn args(&self) -> Vec<String> {
        let client = self.client_url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut args = vec![
            "--name".to_string(),
            "e2e".to_string(),
            "--data-dir".to_string(),
            self.data_dir.display().to_string(),
            "--listen-client-urls".to_string(),
            client.clone(),
            "--advertise-client-urls".to_string(),
            client,
            "--listen-peer-urls".to_string(),
            peer.clone(),
            "--initial-advertise-peer-urls".to_string(),
            peer.clone(),
            "--initial-cluster".to_string(),
            format!("e2e={peer}"),
        ];
        args.extend(self.extra_args.iter().cloned());
        args
    }

    fn program(&self) -> &'static str {
        match self.kind {
            Kind::Keel => env!("CARGO_BIN_EXE_keel"),
            Kind::Etcd => "etcd",
        }
    }

    fn log_path(&self, launch: u32) -> PathBuf {
        self.dir.path().join(format!("server-{launch}.log"))
    }

    fn launch(&mut self) {
        assert!(
            self.child.is_none(),
            "launch while the previous process still runs"
        );
        self.launches += 1;
        let log = std::fs::File::create(self.log_path(self.launches)).expect("the log file opens");
        let log_err = log.try_clone().expect("the log file handle clones");
        let child = Command::new(self.program())
            .args(self.args())
            .current_dir(self.dir.path())
            .env_remove("ETCDCTL_API")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.program()));
        self.child = Some(child);
    }

    /// Everything the current run of the server logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log_path(self.launches)).unwrap_or_default()
    }

    /// The last lines the server logged, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path(self.launches)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Waits until the server accepts TCP and `etcdctl endpoint health` succeeds.
    pub fn wait_ready(&mut self) {
        self.wait_ready_as(None)
    }

    /// [`Server::wait_ready`], with `etcdctl --user` when `user` is given.
    pub fn wait_ready_as(&mut self, user: Option<&str>) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("waitpid works"))
            {
                // Reaped: nothing left for Drop to stop (a SIGTERM to it would fail and turn
                // this panic into an abort that hides the message).
                self.child = None;
                panic!(
                    "{:?} exited with {status} before it answered:\n{}",
                    self.kind,
                    self.log_tail()
                );
            }
            let connects = TcpStream::connect_timeout(
                &format!("127.0.0.1:{}", self.client_port)
                    .parse()
                    .expect("a loopback address"),
                Duration::from_millis(200),
            )
            .is_ok();
            if connects
                && self
                    .etcdctl(
                        &user
                            .map(|u| vec!["--user", u])
                            .unwrap_or_default()
                            .into_iter()
                            .chain(["endpoint", "health", "--command-timeout=2s"])
                            .collect::<Vec<_>>(),
                    )
                    .code
                    == 0
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{:?} did not become healthy in {READY_TIMEOUT:?}:\n{}",
                self.kind,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process id of the running server.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server runs").id()
    }

    /// SIGTERM, then SIGKILL after the grace period; returns how the process ended.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("stop a running server");
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) on a child we spawned and have not reaped, so the pid is still ours.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill({pid}, SIGTERM) failed");
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            if let Some(status) = child.try_wait().expect("waitpid works") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                return child.wait().expect("waitpid after SIGKILL");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` for the process to end by itself; its exit status, or None while
    /// it still runs (it is then left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("wait for a running server");
            if let Some(status) = child.try_wait().expect("waitpid works") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything this run of the server logged.
    pub fn log_all(&self) -> String {
        std::fs::read_to_string(self.log_path(self.launches)).unwrap_or_default()
    }

    /// SIGKILL: no chance to flush or checkpoint anything.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill a running server");
        child.kill().expect("SIGKILL is delivered");
        child.wait().expect("waitpid after SIGKILL");
    }

    /// Starts the server again without waiting for it to be healthy (a raised alarm keeps
    /// `endpoint health` failing); waits only until it accepts TCP.
    pub fn relaunch(&mut self) {
        self.launch();
        let deadline = Instant::now() + READY_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", self.client_port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "no listener:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server again without waiting for anything (for a start that must fail).
    pub fn launch_again(&mut self) {
        self.launch();
    }

    /// Starts the server again on the same data directory and ports, and waits until it answers.
    pub fn restart(&mut self) {
        self.launch();
        self.wait_ready();
    }

    /// Runs etcdctl against this server.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let (endpoints, args) = self.etcdctl_target(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        etcdctl_at(&endpoints, &args, None)
    }

    /// Runs etcdctl against this server with `stdin` fed to it (for `txn -i`).
    pub fn etcdctl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let (endpoints, args) = self.etcdctl_target(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        etcdctl_at(&endpoints, &args, Some(stdin))
    }

    /// One plain HTTP/1.1 GET over a raw TCP connection; returns the status code and body.
    pub fn http_get(&self, path: &str) -> (u16, String) {
        http_get(&format!("127.0.0.1:{}", self.client_port), path)
    }

    pub fn data_path(&self) -> &Path {
        &self.data_dir
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// GET `path` with HTTP/1.1 over a fresh TCP connection (Connection: close).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, "")
}

/// Major page faults (faults that waited for the disk) each of the server's threads took,
/// by thread name (`/proc/PID/task/TID/stat`, field 12).
pub fn major_faults_by_thread(pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc lists threads") {
        let Ok(stat) = std::fs::read_to_string(task.expect("a task").path().join("stat")) else {
            continue; // The thread ended meanwhile.
        };
        // "TID (COMM) STATE ...": the name may hold spaces, the fields after it do not.
        let (open, close) = (stat.find('(').expect("("), stat.rfind(')').expect(")"));
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // Field 12 (majflt), counted from 1 with the state as field 3.
        let majflt = fields[12 - 3].parse().expect("majflt is a number");
        out.push((stat[open + 1..close].to_string(), majflt));
    }
    out
}

/// Major page faults the server's threads whose names start with `prefix` took, in all.
/// Code pages of the binary can fault too when memory is short (a test suite running
/// beside), so tests compare a count before and after and allow a few.
pub fn major_faults_of(pid: u32, prefix: &str) -> u64 {
    major_faults_by_thread(pid)
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(_, majflt)| majflt)
        .sum()
}

/// The value of one series (its name with labels, as /metrics writes it) on a metrics page.
pub fn metric_value(body: &str, series: &str) -> u64 {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("/metrics lacks {series}:\n{body}"))
        .parse()
        .expect("a count")
}

/// One HTTP/1.1 request with `body` (Content-Length) over a fresh TCP connection
/// (Connection: close); returns the status code and body.
pub fn http_request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("the server accepts TCP");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("the request is sent");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status code in {head:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Removes the header fields that differ between two members serving the same data.
pub fn strip_member_fields(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for field in ["cluster_id", "member_id", "raft_term"] {
                map.remove(field);
            }
            for (_, child) in map.iter_mut() {
                strip_member_fields(child);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_member_fields),
        _ => {}
    }
}

/// Standard base64 with padding, as etcdctl's `-w json` prints keys and values.
pub fn b64(bytes: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The keys of a `-w json` range answer, decoded.
pub fn json_keys(v: &serde_json::Value) -> Vec<String> {
    let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
    kvs.iter()
        .map(|kv| unb64(kv["key"].as_str().expect("a key is a base64 string")))
        .collect()
}

/// Decodes standard base64 (the inverse of [`b64`]), for keys and values in `-w json`.
pub fn unb64(text: &str) -> String {
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {text:?}"),
        };
        bits = (bits << 6) | u32::from(v);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    String::from_utf8(out).expect("test keys and values are UTF-8")
}

/// Connects the `etcd-client` crate to `server`.
pub async fn client(server: &Server) -> etcd_client::Client {
    etcd_client::Client::connect([server.client_url()], None)
        .await
        .expect("etcd-client connects")
}

/// The gRPC code (as its name, e.g. "InvalidArgument") and message of a failed call.
pub fn grpc_error<T: std::fmt::Debug>(result: Result<T, etcd_client::Error>) -> (String, String) {
    match result {
        Err(etcd_client::Error::GRpcStatus(status)) => {
            (format!("{:?}", status.code()), status.message().to_string())
        }
        other => panic!("expected a gRPC error status, got {other:?}"),
    }
}

/// Connects to `port`, sends `first_bytes`, and waits for the server to close the connection
/// without answering; returns how long that took. Panics on an answer, or when nothing closes
/// it within `wait_max`.
pub fn closed_silently_after(port: u16, first_bytes: &[u8], wait_max: Duration) -> Duration {
    use std::io::ErrorKind;
    let started = Instant::now();
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(wait_max))
        .expect("set a read timeout");
    tcp.write_all(first_bytes).expect("write");
    let mut buf = [0u8; 64];
    match tcp.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("an answer to {first_bytes:?}: {:?}", &buf[..n]),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("not closed within {wait_max:?}: {e}"),
    }
    started.elapsed()
}

/// A throwaway PKI made with the `openssl` CLI (EC P-256 keys): self-signed CAs, and
/// certificates they issue. The TLS tests build their own certificate sets on it.
pub struct OpensslPki {
    pub dir: tempfile::TempDir,
}

impl OpensslPki {
    /// A PKI under a fresh temporary directory with one self-signed CA per name in `cas`
    /// (`<ca>.pem`, `<ca>.key`).
    pub fn new(prefix: &str, cas: &[&str]) -> OpensslPki {
        require_tool("openssl");
        let pki = OpensslPki {
            dir: tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .expect("a temp dir"),
        };
        for ca in cas {
            pki.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=keel-test-{ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        pki
    }

    pub fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Certificate `name` (`<name>.pem`, `<name>.key`, CN=name) issued by `ca`, with the
    /// openssl `extensions` given (subjectAltName, extendedKeyUsage, ...).
    pub fn issue(&self, ca: &str, name: &str, extensions: &str) {
        std::fs::write(self.path(&format!("{name}.ext")), extensions).expect("write extensions");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

/// One key-value as a line for comparisons and failure messages: key, value and the fields
/// etcd versions it by (create and mod revision, version, lease).
pub fn key_value_line(kv: &etcd_client::KeyValue) -> String {
    format!(
        "{}={} c{} m{} v{} l{}",
        String::from_utf8_lossy(kv.key()),
        String::from_utf8_lossy(kv.value()),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease()
    )
}

/// A small ext4 filesystem on a loop device, unmounted on drop.
pub struct SmallDisk {
    image: PathBuf,
    pub mount: PathBuf,
}

impl SmallDisk {
    pub fn new(dir: &Path, size_mib: u32) -> SmallDisk {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "mounting a loop filesystem needs root (CI runs as root)"
        );
        let image = dir.join("disk.img");
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).expect("mount point");
        let file = std::fs::File::create(&image).expect("disk image");
        file.set_len(u64::from(size_mib) * 1024 * 1024)
            .expect("sizing the image");
        run(
            "mkfs.ext4",
            &["-q", "-F", image.to_str().expect("utf-8 path")],
        );
        run(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().expect("utf-8 path"),
                mount.to_str().expect("utf-8 path"),
            ],
        );
        SmallDisk { image, mount }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} does not run: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
    // SAFETY: statvfs writes into the struct we pass; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut st), 0, "statvfs");
        st.f_bavail * st.f_frsize
    }
}
