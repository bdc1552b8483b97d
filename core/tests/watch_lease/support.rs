//! Helpers this suite needs on top of the shared harness: long-running etcdctl processes read
//! line by line, and watch-stream reads with deadlines, so a missing event fails the test
//! instead of hanging it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchResponse, WatchStream};

use crate::common::{require_tool, Server};

/// How long any single expected message may take before the test fails.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(15);

/// An etcdctl process that keeps running (watch, elect, lock), its stdout read line by line.
pub struct LiveEtcdctl {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every line read so far, for failure messages.
    pub seen: Vec<String>,
}

/// Whether the process gets a pipe on stdin (interactive commands) or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdin {
    Piped,
    Closed,
}

impl LiveEtcdctl {
    pub fn start(server: &Server, args: &[&str], stdin: Stdin) -> LiveEtcdctl {
        require_tool("etcdctl");
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", server.endpoint()))
            .arg("--dial-timeout=5s")
            .args(args)
            .stdin(match stdin {
                Stdin::Piped => Stdio::piped(),
                Stdin::Closed => Stdio::null(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl starts");
        let stdout = child.stdout.take().expect("stdout was piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        LiveEtcdctl {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Sends one line on the process's stdin.
    pub fn send_line(&mut self, line: &str) {
        let pipe = self.stdin.as_mut().expect("started with Stdin::Piped");
        writeln!(pipe, "{line}").expect("etcdctl reads its stdin");
        pipe.flush().expect("the pipe flushes");
    }

    /// The next line, or a panic after `STEP_TIMEOUT`.
    pub fn next_line(&mut self) -> String {
        match self.lines.recv_timeout(STEP_TIMEOUT) {
            Ok(line) => {
                self.seen.push(line.clone());
                line
            }
            Err(e) => panic!(
                "etcdctl printed no further line within {STEP_TIMEOUT:?} ({e}); so far: {:?}",
                self.seen
            ),
        }
    }

    /// Reads lines until one satisfies `want`, and returns it.
    pub fn line_where(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            assert!(
                Instant::now() < deadline,
                "no line {what} within {STEP_TIMEOUT:?}; so far: {:?}",
                self.seen
            );
            let line = self.next_line();
            if want(&line) {
                return line;
            }
        }
    }

    /// Asserts the process prints nothing for `quiet`.
    pub fn assert_silent(&mut self, quiet: Duration) {
        if let Ok(line) = self.lines.recv_timeout(quiet) {
            panic!("expected no output, got {line:?} after {:?}", self.seen);
        }
    }

    /// Sends `signal` (SIGTERM lets etcdctl resign and close its session).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, which has not been reaped (we still own `child`).
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill(etcdctl, {signal}) failed");
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("waitpid works") {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "etcdctl did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LiveEtcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next response on a watch stream, or a panic after `STEP_TIMEOUT`.
pub async fn next_response(stream: &mut WatchStream) -> WatchResponse {
    match tokio::time::timeout(STEP_TIMEOUT, stream.message()).await {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => panic!("the watch stream ended"),
        Ok(Err(e)) => panic!("the watch stream failed: {e:?}"),
        Err(_) => panic!("no watch response within {STEP_TIMEOUT:?}"),
    }
}

/// Asserts nothing arrives on the stream for `quiet`.
pub async fn assert_no_response(stream: &mut WatchStream, quiet: Duration) {
    if let Ok(r) = tokio::time::timeout(quiet, stream.message()).await {
        panic!("expected no watch response, got {r:?}");
    }
}

/// The created response of a new watcher; panics on anything else.
pub async fn expect_created(stream: &mut WatchStream) -> WatchResponse {
    let r = next_response(stream).await;
    assert!(
        r.created() && !r.canceled() && r.events().is_empty(),
        "expected a created response, got {r:?}"
    );
    r
}

/// One event reduced to what the tests compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub watch_id: i64,
    pub kind: EventType,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub prev_value: Option<Vec<u8>>,
}

pub fn seen_of(r: &WatchResponse) -> Vec<Seen> {
    r.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("every event carries a kv");
            Seen {
                watch_id: r.watch_id(),
                kind: e.event_type(),
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
                prev_value: e.prev_kv().map(|p| p.value().to_vec()),
            }
        })
        .collect()
}

/// Reads responses until `count` events arrived, checking that no response mixes in a
/// created/canceled flag; returns the events in arrival order.
pub async fn collect_events(stream: &mut WatchStream, count: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    while out.len() < count {
        let r = next_response(stream).await;
        assert!(!r.canceled(), "watch canceled while collecting: {r:?}");
        out.extend(seen_of(&r));
    }
    assert_eq!(out.len(), count, "more events than expected: {out:?}");
    out
}

/// The store's current revision.
pub async fn revision(client: &mut etcd_client::Client) -> i64 {
    client
        .get("\0", None)
        .await
        .expect("a range succeeds")
        .header()
        .expect("a range has a header")
        .revision()
}
