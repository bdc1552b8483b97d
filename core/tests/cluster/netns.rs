//! Private networks for partition tests: one network namespace per member, each with a veth
//! pair whose other end sits on a bridge inside a namespace of its own. Members get addresses
//! from 10.77.0.0/24, which exist only inside these namespaces; no route leads outside, so all
//! test traffic stays between them. A partition is a veth end on the bridge brought down.
//!
//! Everything is created by this process and deleted on drop (member namespaces first, which
//! deletes their veth pairs, then the bridge namespace), also when a test panics.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The /24 the members live in; only the namespaces of one [`Netns`] see it.
pub const SUBNET_PREFIX: &str = "10.77.0";
/// The first member's host number inside [`SUBNET_PREFIX`].
const HOST_FIRST: usize = 11;

static NEXT_SET: AtomicUsize = AtomicUsize::new(0);

/// A bridge namespace plus one namespace per member.
pub struct Netns {
    bridge: String,
    members: Vec<String>,
    /// Which namespaces exist so far, so a half-built set is still cleaned up.
    created: Vec<String>,
}

impl Netns {
    /// Builds the namespaces for `count` members, or says why it cannot (not root, no `ip`).
    pub fn create(count: usize) -> Result<Netns, String> {
        assert!(
            (1..=20).contains(&count),
            "a test network holds 1 to 20 members"
        );
        let set = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("keel-i6-{}-{set}", std::process::id());
        let mut net = Netns {
            bridge: format!("{prefix}-br"),
            members: (0..count).map(|i| format!("{prefix}-n{i}")).collect(),
            created: Vec::new(),
        };
        // SAFETY: geteuid(2) has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(format!(
                "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); running as uid {euid}"
            ));
        }
        let bridge = net.bridge.clone();
        net.add_namespace(&bridge)?;
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", "br0", "up"])?;
        // A second bridge: members moved onto it still reach each other, not the rest.
        ip(&["-n", &bridge, "link", "add", "br1", "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", "br1", "up"])?;
        for i in 0..count {
            let ns = net.members[i].clone();
            let veth = format!("v{i}");
            let address = format!("{}/24", net.address(i));
            net.add_namespace(&ns)?;
            ip(&[
                "-n", &bridge, "link", "add", &veth, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", &bridge, "link", "set", &veth, "master", "br0"])?;
            ip(&["-n", &bridge, "link", "set", &veth, "up"])?;
            ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(net)
    }

    fn add_namespace(&mut self, name: &str) -> Result<(), String> {
        ip(&["netns", "add", name])?;
        self.created.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    /// The namespace member `i` and its clients run in.
    pub fn member_ns(&self, i: usize) -> &str {
        &self.members[i]
    }

    /// Member `i`'s address, reachable only from these namespaces.
    pub fn address(&self, i: usize) -> String {
        assert!(i < self.members.len(), "member {i} has no namespace");
        format!("{SUBNET_PREFIX}.{}", HOST_FIRST + i)
    }

    /// Cuts member `i` off from every other member (its bridge port goes down).
    pub fn isolate(&self, i: usize) {
        ip(&["-n", &self.bridge, "link", "set", &format!("v{i}"), "down"])
            .expect("bringing a veth down in our own namespace works");
    }

    /// Reconnects member `i` after [`Netns::isolate`].
    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.bridge, "link", "set", &format!("v{i}"), "up"])
            .expect("bringing a veth up in our own namespace works");
    }

    /// Splits the network in two: `minority` keeps talking among itself on a second bridge,
    /// cut off from everyone else. Links stay up, so packets are dropped silently, as in a
    /// real partition.
    pub fn split(&self, minority: &[usize]) {
        for &i in minority {
            self.attach(i, "br1");
        }
    }

    /// Puts every member back on the main bridge.
    pub fn join_all(&self) {
        for i in 0..self.members.len() {
            self.attach(i, "br0");
        }
    }

    fn attach(&self, i: usize, bridge: &str) {
        ip(&[
            "-n",
            &self.bridge,
            "link",
            "set",
            &format!("v{i}"),
            "master",
            bridge,
        ])
        .expect("moving a veth between our own bridges works");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Member namespaces first: deleting one deletes its veth pair with it.
        for name in self.created.iter().rev() {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Runs `ip args`, returning what it printed on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (apt-get install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn open_ns(name: &str) -> File {
    let path = format!("/run/netns/{name}");
    File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"))
}

/// Spawns `cmd` inside network namespace `ns` (or here when `None`).
pub fn spawn_in(ns: Option<&str>, cmd: &mut Command) -> std::io::Result<Child> {
    let Some(ns) = ns else {
        return cmd.spawn();
    };
    let file = open_ns(ns);
    let fd = file.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls setns(2), which
    // is async-signal-safe; `file` stays open in the parent until spawn returns, so the fd
    // (inherited across fork, closed on exec) is valid in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let child = cmd.spawn();
    drop(file);
    child
}

/// Moves the calling thread into namespace `ns`: every socket it (and the threads it spawns)
/// creates from now on lives there. For client threads only.
pub fn enter(ns: &str) {
    let file = open_ns(ns);
    // SAFETY: setns(2) on a valid namespace fd affects only the calling thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "setns into {ns}: {}",
        std::io::Error::last_os_error()
    );
}
