//! The cluster harness: N `keel` members with their own ports and data directories, on
//! loopback or each in its own network namespace ([`Net::Namespaces`]). Members can be killed
//! with SIGKILL, stopped, restarted, added and removed; the harness finds the leader through
//! `etcdctl endpoint status -w json` and waits for one with a deadline.
//!
//! Every etcdctl call runs in the namespace of the member it talks to, because member
//! addresses exist only there.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::common::{free_port, json_of, raft_cpu_of, require_tool, unb64, Output};
use crate::netns::{self, Netns};

/// How long a member may take to answer `endpoint health` once a quorum runs.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long SIGTERM gets before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// The election timeout every member runs with (etcd's default), in milliseconds.
pub const ELECTION_TIMEOUT_MS: u64 = 1000;
/// The heartbeat interval every member runs with (etcd's default), in milliseconds.
pub const HEARTBEAT_INTERVAL_MS: u64 = 100;
/// The ports every member uses inside its own namespace (its address is its own).
const NETNS_CLIENT_PORT: u16 = 2379;
const NETNS_PEER_PORT: u16 = 2380;

/// Where the members live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    Loopback,
    Namespaces,
}

/// Whether a member bootstraps a cluster or joins one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

/// How `member add` adds a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Voting {
    Learner,
    Voter,
}

/// Set (to anything) to keep the members of a cluster that did not converge running for 15
/// minutes before the test fails, printing their pids, namespaces and logs.
pub const HOLD_ON_FAILURE_ENV: &str = "KEEL_TEST_HOLD";

/// One member process.
pub struct Member {
    pub name: String,
    pub host: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    pub netns: Option<String>,
    /// "http" or "https": the scheme of this member's peer URL.
    pub peer_scheme: &'static str,
    initial_cluster: String,
    cluster_state: ClusterState,
    log_dir: PathBuf,
    /// Flags beyond the cluster's own; a test may change them before a restart.
    pub extra_args: Vec<String>,
    /// Environment variables (test-only knobs) for the next launches.
    pub env: Vec<(String, String)>,
    /// The CPU this member pins its raft core to: slot % CPUs, so members on one host do not
    /// all take the last CPU (keel's default) and starve each other's raft cores.
    raft_cpu: usize,
    child: Option<Child>,
    launches: u32,
}

impl Member {
    pub fn client_url(&self) -> String {
        format!("http://{}:{}", self.host, self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("{}://{}:{}", self.peer_scheme, self.host, self.peer_port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn log_path(&self, launch: u32) -> PathBuf {
        self.log_dir.join(format!("{}-{launch}.log", self.name))
    }

    /// The last lines of the current run's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path(self.launches)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// When this run of the member last became leader, from its log's "raft role changed"
    /// lines (keel logs JSON with RFC 3339 UTC timestamps).
    pub fn became_leader_at(&self) -> Option<SystemTime> {
        let text = std::fs::read_to_string(self.log_path(self.launches)).ok()?;
        text.lines()
            .rev()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|v| {
                v["fields"]["message"] == "raft role changed" && v["fields"]["role"] == "Leader"
            })
            .find_map(|v| v["timestamp"].as_str().and_then(parse_utc))
    }

    /// Every log line of every run of this member.
    pub fn log_all(&self) -> String {
        (1..=self.launches)
            .map(|l| std::fs::read_to_string(self.log_path(l)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn launch(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        self.launches += 1;
        let log = File::create(self.log_path(self.launches)).expect("the log file opens");
        let log_err = log.try_clone().expect("the log file handle clones");
        let state = match self.cluster_state {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.client_url())
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--heartbeat-interval")
            .arg(HEARTBEAT_INTERVAL_MS.to_string())
            .arg("--election-timeout")
            .arg(ELECTION_TIMEOUT_MS.to_string())
            .arg("--shards")
            .arg("1")
            .arg("--raft-cpu")
            .arg(self.raft_cpu.to_string())
            .args(&self.extra_args)
            .env_remove("ETCDCTL_API")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = netns::spawn_in(self.netns.as_deref(), &mut cmd)
            .unwrap_or_else(|e| panic!("keel {} does not start: {e}", self.name));
        self.child = Some(child);
    }

    /// Waits up to `timeout` for the process to end by itself; its status, or None while it
    /// still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("wait for a running member");
            if let Some(status) = child.try_wait().expect("waitpid works") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the member runs").id()
    }

    /// Panics with the log when the process has exited.
    fn assert_alive(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait().expect("waitpid works") {
                panic!(
                    "member {} exited with {status}:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
        }
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`]; returns how the process ended.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("stop a running member");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) on a child we spawned and have not reaped, so the pid is still ours.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill({pid}, SIGTERM) failed");
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            if let Some(status) = child.try_wait().expect("waitpid works") {
                return status;
            }
            if Instant::now() >= deadline {
                child.kill().expect("SIGKILL is delivered");
                return child.wait().expect("waitpid after SIGKILL");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to the running process: SIGSTOP freezes it (it hears and says nothing,
    /// as if cut off, while its connections stay open), SIGCONT lets it run on.
    pub fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("signal a running member");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) on a child we spawned and have not reaped, so the pid is still ours.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill a running member");
        child.kill().expect("SIGKILL is delivered");
        child.wait().expect("waitpid after SIGKILL");
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What `endpoint status` says about one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub member_id: u64,
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub revision: i64,
}

/// One row of `member list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub is_learner: bool,
}

/// A key as a serializable read of one member sees it.
pub type Kv = (String, String, i64);

/// Members plus, for partition tests, their private network.
pub struct Cluster {
    // Field order is drop order: processes die before the namespaces they run in go away.
    pub members: Vec<Member>,
    pub netns: Option<Netns>,
    pub dir: tempfile::TempDir,
    net: Net,
    extra_args: Vec<String>,
    peer_scheme: &'static str,
}

impl Cluster {
    /// Starts `count` members named n0.. and waits until each answers `endpoint health`.
    pub fn start(count: usize, net: Net, extra_args: &[&str]) -> Cluster {
        Cluster::start_with(count, net, extra_args, "http", |_| Vec::new())
    }

    /// Like [`Cluster::start`], but first calls `prepare(member, initial_cluster)` for each
    /// member (e.g. to restore a snapshot into its data directory).
    pub fn start_prepared(
        count: usize,
        net: Net,
        extra_args: &[&str],
        prepare: &dyn Fn(&Member, &str),
    ) -> Cluster {
        let mut cluster =
            Cluster::launch_prepared(count, net, extra_args, "http", |_| Vec::new(), prepare);
        for i in 0..count {
            cluster.wait_ready(i);
        }
        cluster
    }

    /// Like [`Cluster::start`], with peer URLs of `peer_scheme` ("http" or "https") and flags
    /// per member (`member_args(i)`, after `extra_args`: e.g. each member's own certificate).
    pub fn start_with(
        count: usize,
        net: Net,
        extra_args: &[&str],
        peer_scheme: &'static str,
        member_args: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let mut cluster = Cluster::launch_with(count, net, extra_args, peer_scheme, member_args);
        for i in 0..count {
            cluster.wait_ready(i);
        }
        cluster
    }

    /// [`Cluster::start_with`] without waiting for the members to be ready (for clusters where
    /// some never will be).
    pub fn launch_with(
        count: usize,
        net: Net,
        extra_args: &[&str],
        peer_scheme: &'static str,
        member_args: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        Cluster::launch_prepared(count, net, extra_args, peer_scheme, member_args, &|_, _| {})
    }

    fn launch_prepared(
        count: usize,
        net: Net,
        extra_args: &[&str],
        peer_scheme: &'static str,
        member_args: impl Fn(usize) -> Vec<String>,
        prepare: &dyn Fn(&Member, &str),
    ) -> Cluster {
        require_tool("etcdctl");
        assert!(count >= 1, "a cluster has members");
        let netns = match net {
            Net::Loopback => None,
            Net::Namespaces => Some(Netns::create(count).unwrap_or_else(|why| {
                panic!(
                    "the partition tests need network namespaces and cannot create them: {why}. \
                     Run the tests as root (CI does) with iproute2 installed."
                )
            })),
        };
        let dir = tempfile::Builder::new()
            .prefix("keel-cluster-")
            .tempdir()
            .expect("a temp dir");
        let mut cluster = Cluster {
            members: Vec::new(),
            netns,
            dir,
            net,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            peer_scheme,
        };
        for i in 0..count {
            let mut member = cluster.new_member(&format!("n{i}"), i);
            member.extra_args.extend(member_args(i));
            cluster.members.push(member);
        }
        let initial_cluster = cluster
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut cluster.members {
            m.initial_cluster = initial_cluster.clone();
            prepare(m, &initial_cluster);
            m.launch();
        }
        cluster
    }

    /// A member description with fresh ports (or its namespace slot) and data directory.
    fn new_member(&self, name: &str, slot: usize) -> Member {
        let (host, client_port, peer_port, ns) = match &self.netns {
            None => ("127.0.0.1".to_string(), free_port(), free_port(), None),
            Some(net) => (
                net.address(slot),
                NETNS_CLIENT_PORT,
                NETNS_PEER_PORT,
                Some(net.member_ns(slot).to_string()),
            ),
        };
        Member {
            name: name.to_string(),
            host,
            client_port,
            peer_port,
            data_dir: self.dir.path().join(format!("{name}.data")),
            netns: ns,
            peer_scheme: self.peer_scheme,
            initial_cluster: String::new(),
            cluster_state: ClusterState::New,
            log_dir: self.dir.path().to_path_buf(),
            extra_args: self.extra_args.clone(),
            env: Vec::new(),
            raft_cpu: raft_cpu_of(slot),
            child: None,
            launches: 0,
        }
    }

    /// Runs etcdctl (API v3) against member `i`'s client URL, inside its namespace.
    pub fn etcdctl(&self, i: usize, args: &[&str]) -> Output {
        let m = &self.members[i];
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            // host:port, not the URL: etcdctl 3.4 sends a URL endpoint as the :authority of
            // Maintenance calls, which keel's h2 rejects (see the report).
            .arg(format!("--endpoints={}:{}", m.host, m.client_port))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = netns::spawn_in(m.netns.as_deref(), &mut cmd).expect("etcdctl starts");
        let out = child.wait_with_output().expect("etcdctl finishes");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Waits until member `i` answers `endpoint health` (a linearizable read: needs a leader).
    pub fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.members[i].assert_alive();
            if self
                .etcdctl(i, &["endpoint", "health", "--command-timeout=2s"])
                .code
                == 0
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "member {} not healthy within {READY_TIMEOUT:?}:\n{}",
                self.members[i].name,
                self.members[i].log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Member `i`'s status, or `None` when it does not answer within a second.
    pub fn status(&self, i: usize) -> Option<Status> {
        if !self.members[i].is_running() {
            return None;
        }
        let out = self.etcdctl(
            i,
            &["endpoint", "status", "-w", "json", "--command-timeout=1s"],
        );
        if out.code != 0 {
            return None;
        }
        let v = json_of(&out.stdout)?;
        let s = &v[0]["Status"];
        Some(Status {
            member_id: s["header"]["member_id"].as_u64()?,
            leader: s["leader"].as_u64()?,
            raft_term: s["raft_term"].as_u64().or(s["raftTerm"].as_u64())?,
            raft_index: s["raftIndex"].as_u64().unwrap_or(0),
            revision: s["header"]["revision"].as_i64().unwrap_or(0),
        })
    }

    /// The member among `among` that calls itself leader with the highest term, if any.
    pub fn leader_among(&self, among: &[usize]) -> Option<(usize, Status)> {
        among
            .iter()
            .filter_map(|&i| self.status(i).map(|s| (i, s)))
            .filter(|(_, s)| s.leader == s.member_id && s.leader != 0)
            .max_by_key(|(_, s)| s.raft_term)
    }

    /// Waits until a member among `among` leads; returns it and how long that took.
    pub fn wait_leader(&self, among: &[usize], timeout: Duration) -> (usize, Status, Duration) {
        let start = Instant::now();
        loop {
            if let Some((i, s)) = self.leader_among(among) {
                return (i, s, start.elapsed());
            }
            assert!(
                start.elapsed() < timeout,
                "no leader among {among:?} within {timeout:?}; logs:\n{}",
                self.log_tails(among)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_tails(&self, among: &[usize]) -> String {
        among
            .iter()
            .map(|&i| {
                format!(
                    "--- {} ---\n{}",
                    self.members[i].name,
                    self.members[i].log_tail()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn kill9(&mut self, i: usize) {
        self.members[i].kill9();
    }

    pub fn stop(&mut self, i: usize) -> std::process::ExitStatus {
        self.members[i].stop()
    }

    /// Starts member `i` again without waiting for it to answer.
    pub fn relaunch(&mut self, i: usize) {
        self.members[i].launch();
    }

    /// Starts member `i` again on its data directory and waits until it answers.
    pub fn restart(&mut self, i: usize) {
        self.members[i].launch();
        self.wait_ready(i);
    }

    /// The members as `member list -w json` run on member `via` reports them.
    pub fn member_list(&self, via: usize) -> Vec<MemberInfo> {
        let out = self.etcdctl(via, &["member", "list", "-w", "json"]).ok();
        let v = out.json();
        v["members"]
            .as_array()
            .expect("member list has members")
            .iter()
            .map(|m| MemberInfo {
                id: m["ID"].as_u64().expect("a member has an ID"),
                name: m["name"].as_str().unwrap_or("").to_string(),
                peer_urls: m["peerURLs"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|u| u.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
                is_learner: m["isLearner"].as_bool().unwrap_or(false),
            })
            .collect()
    }

    /// `member add` through member `via`, then starts the new member with
    /// `--initial-cluster-state existing`. Returns its index. With `reuse` the new member takes
    /// over an old member's name, URLs and (wiped) data directory.
    pub fn add_member(
        &mut self,
        via: usize,
        name: &str,
        voting: Voting,
        reuse: Option<usize>,
    ) -> usize {
        let index = match reuse {
            Some(old) => {
                assert!(
                    !self.members[old].is_running(),
                    "only a stopped member's slot is reused"
                );
                old
            }
            None => {
                assert!(
                    self.net == Net::Loopback,
                    "namespace clusters do not grow (their network is fixed)"
                );
                let m = self.new_member(name, self.members.len());
                self.members.push(m);
                self.members.len() - 1
            }
        };
        let peer_url = self.members[index].peer_url();
        let peer_arg = format!("--peer-urls={peer_url}");
        let mut args = vec!["member", "add", name, peer_arg.as_str()];
        if voting == Voting::Learner {
            args.push("--learner");
        }
        // A leader elected a moment ago has not yet heard from every voter, and etcd's strict
        // reconfiguration check answers "unhealthy cluster" until it has: retry, as an
        // operator would.
        let deadline = Instant::now() + Duration::from_secs(10);
        let out = loop {
            let out = self.etcdctl(via, &args);
            if out.code == 0
                || !out.stderr.contains("etcdserver: unhealthy cluster")
                || Instant::now() > deadline
            {
                break out.ok();
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let initial_cluster = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
            .unwrap_or_else(|| panic!("member add printed no ETCD_INITIAL_CLUSTER: {out:?}"))
            .trim_matches('"')
            .to_string();
        assert!(
            initial_cluster.contains(&format!("{name}={peer_url}")),
            "member add's initial cluster {initial_cluster:?} lacks the new member"
        );
        let m = &mut self.members[index];
        m.name = name.to_string();
        m.initial_cluster = initial_cluster;
        m.cluster_state = ClusterState::Existing;
        m.launch();
        index
    }

    /// `etcdctl member remove ID` through member `via`, retried while the answer is "unhealthy
    /// cluster": a leader elected a moment ago has not yet heard from every voter, and etcd's
    /// strict reconfiguration check refuses until it has, as an operator would retry.
    pub fn remove_member(&self, via: usize, hex_id: &str) -> Output {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.etcdctl(via, &["member", "remove", hex_id]);
            if out.code == 0
                || !out.stderr.contains("etcdserver: unhealthy cluster")
                || Instant::now() > deadline
            {
                return out;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The hex id etcdctl's member commands take, for member `i` (from `member list` on `via`).
    pub fn member_hex_id(&self, via: usize, i: usize) -> String {
        let url = self.members[i].peer_url();
        let info = self
            .member_list(via)
            .into_iter()
            .find(|m| m.peer_urls.contains(&url))
            .unwrap_or_else(|| panic!("member {} is not in the member list", self.members[i].name));
        format!("{:x}", info.id)
    }

    /// Every key member `i` holds, by a serializable read (no leader needed), and the revision.
    pub fn dump(&self, i: usize) -> Option<(i64, Vec<Kv>)> {
        let out = self.etcdctl(i, &["get", "", "--prefix", "--consistency=s", "-w", "json"]);
        if out.code != 0 {
            return None;
        }
        let v = json_of(&out.stdout)?;
        let revision = v["header"]["revision"].as_i64()?;
        let kvs = v["kvs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|kv| {
                (
                    unb64(kv["key"].as_str().unwrap_or("")),
                    unb64(kv["value"].as_str().unwrap_or("")),
                    kv["mod_revision"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        Some((revision, kvs))
    }

    /// Waits until members `among` hold the same keys, values and revision; returns it all.
    pub fn wait_converged(&self, among: &[usize], timeout: Duration) -> (i64, Vec<Kv>) {
        let start = Instant::now();
        loop {
            let dumps: Vec<Option<(i64, Vec<Kv>)>> = among.iter().map(|&i| self.dump(i)).collect();
            if let Some(Some(first)) = dumps.first() {
                if dumps.iter().all(|d| d.as_ref() == Some(first)) {
                    return first.clone();
                }
            }
            let last: Vec<Option<(i64, usize)>> = dumps
                .iter()
                .map(|d| d.as_ref().map(|(rev, kvs)| (*rev, kvs.len())))
                .collect();
            if start.elapsed() >= timeout && std::env::var_os(HOLD_ON_FAILURE_ENV).is_some() {
                // Debugging aid: keep the members running so a person can look at them
                // (gdb, /metrics, their logs) before the test tears them down.
                for &i in among {
                    let m = &self.members[i];
                    let pid = m.child.as_ref().map(|c| c.id());
                    eprintln!(
                        "HOLD n{i} pid={pid:?} netns={:?} url={} log={:?} (revision, keys) = {last:?}",
                        m.netns,
                        m.client_url(),
                        m.log_path(m.launches)
                    );
                }
                std::thread::sleep(Duration::from_secs(900));
            }
            assert!(
                start.elapsed() < timeout,
                "members {among:?} did not converge within {timeout:?}: (revision, keys) = {last:?}\n{}",
                self.log_tails(among)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Parses "2026-11-30T07:49:24.334672Z" (UTC, optional fraction) into a `SystemTime`.
pub fn parse_utc(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (hour, minute, second) = (t.next()??, t.next()??, t.next()??);
    let digits = fraction.len().min(9);
    let nanos = fraction[..digits].parse::<u64>().ok()? * 10u64.pow((9 - digits) as u32);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_log_timestamps() {
        let t = parse_utc("2026-11-30T07:49:24.334672Z").expect("a valid timestamp");
        let since = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970");
        // date -u -d 2026-11-30T07:49:24Z +%s
        assert_eq!(since.as_secs(), 1_796_024_964);
        assert_eq!(since.subsec_micros(), 334_672);
        assert_eq!(
            parse_utc("1970-01-01T00:00:00Z"),
            Some(SystemTime::UNIX_EPOCH)
        );
        assert_eq!(parse_utc("garbage"), None);
    }
}
