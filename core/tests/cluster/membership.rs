//! Membership changes: a learner that must catch up by snapshot (the leader's log is compacted
//! by a small --snapshot-count), its promotion, removing a member, and replacing a member that
//! lost its data directory.

use std::time::{Duration, Instant};

use etcd_client::Client;

use crate::block_on;
use crate::common::{free_bytes, SmallDisk};
use crate::harness::{Cluster, Net, Voting};

/// Keys written before the learner joins: several times the snapshot count, so the entries the
/// learner needs are compacted away on the leader.
const KEYS_BEFORE_JOIN: usize = 300;
const SNAPSHOT_COUNT: &str = "50";

/// Puts `count` keys `prefix{i}` through `url`, one after another.
fn put_keys(url: &str, prefix: &str, count: usize) {
    put_sized_keys(url, prefix, count, 0);
}

/// Puts `count` keys `prefix{i}` through `url`, one after another, each value `value-{i}`
/// padded with `pad_bytes` more bytes.
fn put_sized_keys(url: &str, prefix: &str, count: usize, pad_bytes: usize) {
    block_on(async {
        let mut client = Client::connect([url], None)
            .await
            .expect("etcd-client connects");
        for i in 0..count {
            let value = format!("value-{i}{}", "v".repeat(pad_bytes));
            client
                .put(format!("{prefix}{i:04}"), value, None)
                .await
                .unwrap_or_else(|e| panic!("put {prefix}{i} through {url}: {e}"));
        }
    });
}

/// The number a member logged as field `field` on its first line containing `line`, if any
/// (members log JSON lines: `"field":N`).
fn logged_number(log: &str, line: &str, field: &str) -> Option<u64> {
    let found = log.lines().find(|l| l.contains(line))?;
    let key = format!("\"{field}\":");
    let at = found.find(&key)? + key.len();
    let digits: String = found[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Asserts that `learner` caught up through a snapshot streamed with the leader's segment
/// files (at least `segments_min` of them), and returns the bytes its sender streamed.
fn assert_caught_up_by_streamed_snapshot(c: &Cluster, learner: usize, segments_min: u64) -> u64 {
    let learner_log = c.members[learner].log_all();
    assert!(
        learner_log.contains("installed the leader's snapshot"),
        "the learner caught up without a snapshot; its log:\n{}",
        c.members[learner].log_tail()
    );
    let segments = logged_number(&learner_log, "received a snapshot", "segments")
        .unwrap_or_else(|| panic!("the learner logs no snapshot received:\n{learner_log}"));
    assert!(
        segments >= segments_min,
        "the snapshot came with {segments} segment files, expected {segments_min} or more"
    );
    // They are the learner's own value log now.
    let files = std::fs::read_dir(c.members[learner].data_dir.join("vlog"))
        .expect("the learner's value-log directory")
        .count() as u64;
    assert!(
        files >= segments,
        "{files} segment files after receiving {segments}"
    );
    (0..c.members.len())
        .filter(|&i| i != learner)
        .filter_map(|i| logged_number(&c.members[i].log_all(), "sent a snapshot", "bytes"))
        .max()
        .expect("a member logged the snapshot it sent")
}

/// Moves leadership among `voters` to `to` (etcdctl move-leader, sent to the leader) and
/// waits until it leads. A transfer that fails (the transferee's campaign can fall short, as
/// with etcd: move-leader then answers at its deadline) is asked for again, as an operator
/// would, up to three times.
fn move_leader(c: &Cluster, voters: &[usize], to: usize) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let (leading, _, _) = c.wait_leader(voters, Duration::from_secs(10));
        if leading == to {
            return;
        }
        let to_id = c.member_hex_id(leading, to);
        let out = c.etcdctl(leading, &["move-leader", &to_id]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.leader_among(voters).map(|(i, _)| i) != Some(to) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if c.leader_among(voters).map(|(i, _)| i) == Some(to) {
            if !failures.is_empty() {
                eprintln!("note: move-leader to n{to} took a retry: {failures:?}");
            }
            return;
        }
        failures.push(out);
    }
    panic!(
        "move-leader to n{to} did not happen in three tries: {failures:?}\n{}",
        c.log_tails(voters)
    );
}

/// How many snapshot streams member `i` has staged files for (in `snap/incoming`).
fn staged_streams(c: &Cluster, i: usize) -> usize {
    let staging = c.members[i].data_dir.join("snap").join("incoming");
    std::fs::read_dir(&staging)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| std::fs::read_dir(d.path()).is_ok_and(|mut files| files.next().is_some()))
        .count()
}

/// Waits until member `i` has part of a snapshot staged: its stream is under way.
fn wait_half_staged(c: &Cluster, i: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while staged_streams(c, i) == 0 {
        assert!(
            Instant::now() < deadline,
            "the new member never staged a snapshot:\n{}",
            c.members[i].log_tail()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Retries `member promote` until the learner is in sync (etcd refuses to promote before).
fn promote(c: &Cluster, via: usize, hex_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.etcdctl(via, &["member", "promote", hex_id]);
        if out.code == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member promote {hex_id} kept failing: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How long a removed member may take to stop once it can reach a peer: an election timeout
/// before it campaigns, a round trip, and a debug build's stop, on a loaded machine.
const REMOVED_EXIT_WITHIN: Duration = Duration::from_secs(10);

/// Member `i` was removed: it must stop by itself, with etcd's words and exit status 0 (as
/// etcd 3.4: systemd's Restart=on-failure then leaves it down).
pub fn assert_exits_removed(c: &mut Cluster, i: usize) {
    let status = c.members[i]
        .wait_exit(REMOVED_EXIT_WITHIN)
        .unwrap_or_else(|| {
            panic!(
                "removed member {} still runs after {REMOVED_EXIT_WITHIN:?}:\n{}",
                c.members[i].name,
                c.members[i].log_tail()
            )
        });
    let log = c.members[i].log_all();
    assert!(
        status.success(),
        "a removed member exits 0, as etcd does; it exited {status}:\n{}",
        c.members[i].log_tail()
    );
    for words in [
        "the member has been permanently removed from the cluster",
        "data-dir used by this member must be removed",
    ] {
        assert!(
            log.contains(words),
            "the removed member's log lacks {words:?}:\n{}",
            c.members[i].log_tail()
        );
    }
}

/// A member removed while it could not hear of it, stopped (killed, then started again on its
/// data directory) or frozen (SIGSTOP, its connections left open), stops by itself, exit
/// status 0, once it reaches a peer that applied its removal: at its connection's handshake,
/// or on a connection it already had, even a learner that sends nothing. The cluster goes on.
#[test]
fn a_member_removed_while_away_exits_by_itself_when_it_reaches_a_peer() {
    let mut c = Cluster::start(4, Net::Loopback, &[]);
    let all: Vec<usize> = (0..4).collect();
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(20));
    let mut followers = all.iter().copied().filter(|&i| i != leader);
    let (stopped, frozen) = (
        followers.next().expect("a follower"),
        followers.next().expect("another follower"),
    );
    put_keys(&c.members[leader].client_url(), "before/", 10);

    // Stopped: killed, removed meanwhile, started again; its dials are refused.
    let stopped_id = c.member_hex_id(leader, stopped);
    c.kill9(stopped);
    c.remove_member(leader, &stopped_id).ok();
    c.relaunch(stopped);
    let started = Instant::now();
    assert_exits_removed(&mut c, stopped);
    eprintln!(
        "the restarted removed member stopped after {:?}",
        started.elapsed()
    );

    // Frozen: removed while it hears nothing, then thawed; its open connections answer it.
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != stopped).collect();
    let (leader, _, _) = c.wait_leader(&live, Duration::from_secs(20));
    let frozen_id = c.member_hex_id(leader, frozen);
    c.members[frozen].signal(libc::SIGSTOP);
    c.remove_member(leader, &frozen_id).ok();
    // Longer than an election timeout: thawed, it has missed its leader's heartbeats.
    std::thread::sleep(Duration::from_millis(
        2 * crate::harness::ELECTION_TIMEOUT_MS,
    ));
    c.members[frozen].signal(libc::SIGCONT);
    let thawed = Instant::now();
    assert_exits_removed(&mut c, frozen);
    eprintln!(
        "the thawed removed member stopped after {:?}",
        thawed.elapsed()
    );

    // The peers said why, in etcd's words; the two left serve and agree.
    let left: Vec<usize> = live.iter().copied().filter(|&i| i != frozen).collect();
    assert!(
        left.iter().any(|&i| c.members[i]
            .log_all()
            .contains("rejected stream from remote peer because it was removed")),
        "no peer logged refusing a removed member:\n{}",
        c.log_tails(&left)
    );
    let listed = c.member_list(left[0]);
    assert_eq!(listed.len(), 2, "after both removals: {listed:?}");
    let (leader, _, _) = c.wait_leader(&left, Duration::from_secs(20));
    put_keys(&c.members[leader].client_url(), "after/", 10);
    let (_, kvs) = c.wait_converged(&left, Duration::from_secs(30));
    for prefix in ["before/", "after/"] {
        assert_eq!(
            kvs.iter().filter(|(k, _, _)| k.starts_with(prefix)).count(),
            10,
            "keys {prefix}* after the removals"
        );
    }

    // A learner never campaigns, so it sends nothing of its own accord: frozen across its
    // removal, it is told by the notice its peers wrote on its connections meanwhile.
    let learner = c.add_member(leader, "learner", Voting::Learner, None);
    let with_learner: Vec<usize> = left.iter().copied().chain([learner]).collect();
    c.wait_converged(&with_learner, Duration::from_secs(30));
    let learner_id = c.member_hex_id(leader, learner);
    c.members[learner].signal(libc::SIGSTOP);
    c.remove_member(leader, &learner_id).ok();
    std::thread::sleep(Duration::from_millis(
        2 * crate::harness::ELECTION_TIMEOUT_MS,
    ));
    c.members[learner].signal(libc::SIGCONT);
    let thawed = Instant::now();
    assert_exits_removed(&mut c, learner);
    eprintln!(
        "the thawed removed learner stopped after {:?}",
        thawed.elapsed()
    );
    assert_eq!(c.member_list(left[0]).len(), 2, "the learner is gone");
}

/// etcd's strict reconfiguration check, the part that needs peers: with one follower of
/// three down, the leader refuses to remove the other one (the two left would have one
/// reachable voter, no quorum) and to add a voter (a quorum of four needs three), in etcd's
/// words, whether asked itself or through that follower; once the follower is back, the same
/// removal goes through.
#[test]
fn membership_changes_that_would_lose_the_quorum_are_refused_while_a_voter_is_down() {
    let mut c = Cluster::start(3, Net::Loopback, &[]);
    let all: Vec<usize> = (0..3).collect();
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(20));
    let mut followers = all.iter().copied().filter(|&i| i != leader);
    let (down, kept) = (
        followers.next().expect("a follower"),
        followers.next().expect("another follower"),
    );
    put_keys(&c.members[leader].client_url(), "before/", 10);
    let kept_id = c.member_hex_id(leader, kept);
    c.kill9(down);
    // The leader counts a voter reachable for an election timeout after its last answer.
    std::thread::sleep(Duration::from_millis(
        2 * crate::harness::ELECTION_TIMEOUT_MS,
    ));
    const UNHEALTHY: &str = "etcdserver: unhealthy cluster";
    let url = format!("http://127.0.0.1:{}", crate::common::free_port());
    let add = ["member", "add", "extra", "--peer-urls", url.as_str()];
    c.etcdctl(leader, &["member", "remove", &kept_id])
        .refused(UNHEALTHY, "remove through the leader");
    c.etcdctl(leader, &add)
        .refused(UNHEALTHY, "add through the leader");
    // The same calls through the follower that stays: it forwards them, and the leader,
    // which knows which voters answer it, refuses them back.
    c.etcdctl(kept, &["member", "remove", &kept_id])
        .refused(UNHEALTHY, "remove through the follower");
    c.etcdctl(kept, &add)
        .refused(UNHEALTHY, "add through the follower");
    assert_eq!(c.member_list(leader).len(), 3, "nothing was changed");
    put_keys(&c.members[leader].client_url(), "while-down/", 10);

    c.relaunch(down);
    let (_, kvs) = c.wait_converged(&all, Duration::from_secs(30));
    assert!(kvs.iter().any(|(k, _, _)| k.starts_with("while-down/")));
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(20));
    let kept_id = c.member_hex_id(leader, kept);
    let removed = c.remove_member(leader, &kept_id);
    assert_eq!(removed.code, 0, "with every voter back: {removed:?}");
    assert_exits_removed(&mut c, kept);
}

#[test]
fn members_joining_a_store_far_larger_than_a_peer_frame_catch_up_by_a_streamed_snapshot() {
    // 32 MB of values in 1 MiB segments (the default size): the snapshot is thirty times the
    // largest peer frame (a raft message, about 1 MiB), so only its stream can carry it.
    const KEYS: usize = 4000;
    // Heartbeats every 10 ms: a leader that counted a snapshot sent before the receiver had
    // it would probe the learner inside that window and send it all again (see below).
    let mut c = Cluster::start(
        3,
        Net::Loopback,
        &[
            "--snapshot-count",
            "200",
            "--heartbeat-interval",
            "10",
            "--election-timeout",
            "300",
        ],
    );
    put_sized_keys(&c.members[0].client_url(), "big/", KEYS, 8 * 1024);
    // Undisturbed, the learner is sent the snapshot once: the leader counts it sent only once
    // the learner answered that the message is in its raft's inbox (counted when written, it
    // was sent twice, the second time while the first was being installed).
    let first = c.add_member(0, "n3", Voting::Learner, None);
    c.wait_converged(&[0, 1, 2, first], Duration::from_secs(60));
    let sent_bytes = assert_caught_up_by_streamed_snapshot(&c, first, 25);
    assert!(
        sent_bytes > 31 << 20,
        "the snapshot streamed {sent_bytes} bytes; the values alone are 32 MB"
    );
    let to_first = format!("\"to\":\"{}\"", c.member_hex_id(0, first));
    let sends: usize = (0..3)
        .map(|i| {
            c.members[i]
                .log_all()
                .lines()
                .filter(|l| l.contains("sent a snapshot") && l.contains(&to_first))
                .count()
        })
        .sum();
    assert_eq!(sends, 1, "the snapshot went to the learner {sends} times");

    // A voter killed while its stream is half staged starts over: its start deletes the
    // staging, and the leader, whose stream broke, sends the snapshot again.
    let learner = c.add_member(0, "n4", Voting::Voter, None);
    wait_half_staged(&c, learner);
    c.kill9(learner);
    c.relaunch(learner);
    let (_, kvs) = c.wait_converged(&[0, 1, 2, first, learner], Duration::from_secs(60));
    assert_eq!(
        kvs.iter().filter(|(k, _, _)| k.starts_with("big/")).count(),
        KEYS
    );
    assert_caught_up_by_streamed_snapshot(&c, learner, 25);

    // The sender killed mid-stream: the receiver's stream breaks, it deletes what it staged,
    // and the leader elected next sends the snapshot again, whole. The sender is a founding
    // member, whose last checkpoint was taken before n4 joined (see its restart below).
    // etcd keeps one learner at a time: n3, caught up long since, is promoted before n5
    // comes.
    let first_id = c.member_hex_id(0, first);
    promote(&c, 0, &first_id);
    let voters = [0, 1, 2, learner, first];
    let sender = 0;
    move_leader(&c, &voters, sender);
    let via = voters
        .iter()
        .copied()
        .find(|&i| i != sender)
        .expect("five voters");
    let sender_id = c.member_hex_id(via, sender);
    let cut = c.add_member(via, "n5", Voting::Learner, None);
    wait_half_staged(&c, cut);
    c.kill9(sender);
    let alive: Vec<usize> = voters.iter().copied().filter(|&i| i != sender).collect();
    let (next, _, _) = c.wait_leader(&alive, Duration::from_secs(20));
    let mut caught_up = alive.clone();
    caught_up.push(cut);
    c.wait_converged(&caught_up, Duration::from_secs(60));
    assert_caught_up_by_streamed_snapshot(&c, cut, 25);
    let cut_log = c.members[cut].log_all();
    let from = |id: &str| format!("\"from\":\"{id}\"");
    let whole_from = |id: &str| {
        cut_log
            .lines()
            .any(|l| l.contains("received a snapshot") && l.contains(&from(id)))
    };
    if whole_from(&sender_id) {
        // The stream ended in the few milliseconds between the test seeing it half staged
        // and the kill (it takes hundreds): this run did not cut it. Rare, and not a fault.
        eprintln!("note: the snapshot stream finished before its sender's kill; not cut this run");
    } else {
        let broke = cut_log.lines().any(|l| {
            l.contains("a snapshot stream ended unfinished") && l.contains(&from(&sender_id))
        });
        assert!(
            broke,
            "the learner logs no broken stream from the killed sender {sender_id}:\n{}",
            c.members[cut].log_tail()
        );
        let next_id = c.member_hex_id(via, next);
        assert!(
            whole_from(&next_id),
            "the learner got no whole snapshot from the next leader {next_id}:\n{}",
            c.members[cut].log_tail()
        );
    }
    assert_eq!(
        staged_streams(&c, cut),
        0,
        "the broken stream's staging is left on disk"
    );
    // The killed founder restarts while n4 leads. When its recovered state predates n4's
    // addition (its last checkpoint does; whether its WAL's commit index covers the addition
    // varies by run), it answers n4 at the URLs n4's handshake gave; the test below covers
    // that case every run.
    move_leader(&c, &alive, learner);
    c.relaunch(sender);
    caught_up.push(sender);
    c.wait_converged(&caught_up, Duration::from_secs(60));
    let learner_id = c.member_hex_id(learner, learner);

    // A leader holding a snapshot older than its own joining (n4 was caught up by one taken
    // before it was added) sends it to a new learner, whose membership once installed lacks
    // that leader: the learner must still answer it, from the members it learned when it
    // joined. (Before, its answers were dropped and it never caught up; the phase above
    // failed that way whenever n4 happened to win the election.)
    move_leader(&c, &voters, learner);
    // One learner at a time, as etcd: n5 is promoted before n6 comes.
    let cut_id = c.member_hex_id(learner, cut);
    promote(&c, learner, &cut_id);
    let late = c.add_member(learner, "n6", Voting::Learner, None);
    caught_up.push(late);
    c.wait_converged(&caught_up, Duration::from_secs(60));
    assert!(
        c.members[late]
            .log_all()
            .lines()
            .any(|l| l.contains("received a snapshot") && l.contains(&from(&learner_id))),
        "the late learner was not sent n{learner}'s snapshot:\n{}",
        c.members[late].log_tail()
    );

    // Its store reads the values from the segment files it was sent, after a restart too.
    c.kill9(first);
    c.relaunch(first);
    // Serializable reads, from its own store.
    let expected = format!("value-{}{}", KEYS - 1, "v".repeat(8 * 1024));
    wait_serves(&c, first, &format!("big/{}", KEYS - 1), &expected);
}

/// The store-image header of the newest checkpoint file in a member's data directory: its
/// segment id shift (0: none).
fn newest_checkpoint_shift(c: &Cluster, i: usize) -> u32 {
    let snap = c.members[i].data_dir.join("snap");
    let newest = std::fs::read_dir(&snap)
        .expect("the member's snap directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "keel"))
        .max()
        .expect("a checkpoint file");
    let file = std::fs::read(&newest).expect("the checkpoint file");
    let cp = keel_core::checkpoint::decode(&file).expect("a checkpoint file that decodes");
    keel_kv::segment_shift_of(&cp.kv_image).expect("a store image header")
}

/// Reads `key` from member `i`'s own store until it holds `expected` (30 s at most).
fn wait_serves(c: &Cluster, i: usize, key: &str, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = c.etcdctl(i, &["get", key, "--print-value-only", "--consistency=s"]);
        if out.code == 0 && out.stdout.trim() == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "n{i} does not serve {key}: {out:?}\n{}",
            c.members[i].log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_follower_back_from_behind_keeps_the_leaders_segments_under_its_own_ids_and_sends_them_on() {
    // 600 keys of 8 KiB before: several 1 MiB segment files on every member. Then, while the
    // follower is down, more entries than a leader keeps behind its newest checkpoint (5,000,
    // as etcd's catch-up entries), so it comes back through a snapshot, with segment files of
    // its own already on disk.
    const KEYS: usize = 600;
    const KEYS_WHILE_DOWN: usize = 6000;
    let mut c = Cluster::start(3, Net::Loopback, &["--snapshot-count", "200"]);
    put_sized_keys(&c.members[0].client_url(), "before/", KEYS, 8 * 1024);
    c.wait_converged(&[0, 1, 2], Duration::from_secs(60));
    let (leader, _, _) = c.wait_leader(&[0, 1, 2], Duration::from_secs(10));
    let behind = (0..3).find(|&i| i != leader).expect("a follower");
    c.kill9(behind);
    let up: Vec<usize> = (0..3).filter(|&i| i != behind).collect();
    c.wait_leader(&up, Duration::from_secs(10));
    put_sized_keys(
        &c.members[up[0]].client_url(),
        "after/",
        KEYS_WHILE_DOWN,
        1024,
    );
    c.relaunch(behind);
    c.wait_converged(&[0, 1, 2], Duration::from_secs(60));
    let log = c.members[behind].log_all();
    assert!(
        log.contains("installed the leader's snapshot"),
        "n{behind} caught up without a snapshot:\n{}",
        c.members[behind].log_tail()
    );
    // Stored under ids above its own: the file's header says how far they moved.
    let shift = logged_number(&log, "stored the leader's snapshot", "segment_id_shift")
        .expect("the store logs its shift");
    assert!(
        shift > 0,
        "n{behind} had segments of its own, yet no id moved"
    );
    assert_eq!(u64::from(newest_checkpoint_shift(&c, behind)), shift);
    let last = |prefix: &str, keys: usize, pad: usize| {
        (
            format!("{prefix}{:04}", keys - 1),
            format!("value-{}{}", keys - 1, "v".repeat(pad)),
        )
    };
    let (after_key, after_value) = last("after/", KEYS_WHILE_DOWN, 1024);
    let (before_key, before_value) = last("before/", KEYS, 8 * 1024);
    wait_serves(&c, behind, &after_key, &after_value);
    // Restarted, it reads the leader's values through the shift.
    c.kill9(behind);
    c.relaunch(behind);
    c.wait_converged(&[0, 1, 2], Duration::from_secs(60));
    wait_serves(&c, behind, &after_key, &after_value);
    wait_serves(&c, behind, &before_key, &before_value);
    // Leading, it sends that checkpoint to a new member as every build reads it: no shift,
    // the ids written into the archive, naming the files it sends.
    move_leader(&c, &[0, 1, 2], behind);
    assert_eq!(
        u64::from(newest_checkpoint_shift(&c, behind)),
        shift,
        "still its newest checkpoint when it sends"
    );
    let late = c.add_member(behind, "n3", Voting::Learner, None);
    c.wait_converged(&[0, 1, 2, late], Duration::from_secs(60));
    let behind_id = c.member_hex_id(behind, behind);
    assert!(
        c.members[late]
            .log_all()
            .lines()
            .any(|l| l.contains("received a snapshot")
                && l.contains(&format!("\"from\":\"{behind_id}\""))),
        "the new member was not sent n{behind}'s snapshot:\n{}",
        c.members[late].log_tail()
    );
    assert_eq!(newest_checkpoint_shift(&c, late), 0, "a shift went out");
    wait_serves(&c, late, &after_key, &after_value);
    wait_serves(&c, late, &before_key, &before_value);
}

#[test]
fn a_member_restarted_on_state_from_before_a_later_member_joined_follows_it_as_leader() {
    // n2 is down while n3 joins and takes the lead: restarted, n2's membership lacks n3, so
    // it has no address to answer n3 at until it applies n3's addition, which it learns only
    // from n3. It answers at the URLs n3's handshake carries (etcd's X-PeerURLs); before,
    // its answers went nowhere and it stayed behind for good.
    // Adding a voter while one is down is what etcd's strict reconfiguration check refuses
    // ("unhealthy cluster"), and what this case needs: the check is off, as an operator would
    // turn it off to do this.
    let mut c = Cluster::start(3, Net::Loopback, &["--strict-reconfig-check=false"]);
    put_sized_keys(&c.members[0].client_url(), "before/", 10, 16);
    c.wait_converged(&[0, 1, 2], Duration::from_secs(30));
    c.kill9(2);
    // n2 may have led: a member add sent before the other two elect a leader can outlast
    // etcdctl's 5 s deadline (seen once in six runs beside the rest of the suite), as with
    // etcd. It is sent once they have one.
    c.wait_leader(&[0, 1], Duration::from_secs(10));
    let late = c.add_member(0, "n3", Voting::Voter, None);
    let up = [0, 1, late];
    c.wait_converged(&up, Duration::from_secs(30));
    move_leader(&c, &up, late);
    put_sized_keys(&c.members[late].client_url(), "after/", 10, 16);
    c.relaunch(2);
    let (_, kvs) = c.wait_converged(&[0, 1, 2, late], Duration::from_secs(30));
    assert_eq!(kvs.len(), 20);
    let late_id = c.member_hex_id(0, late);
    assert!(
        c.members[2].log_all().lines().any(|l| {
            l.contains("added remote peer from its handshake")
                && l.contains(&format!("\"remote_peer_id\":\"{late_id}\""))
        }),
        "n2 did not learn n3 from its handshake:\n{}",
        c.members[2].log_tail()
    );
}

#[test]
fn learner_catches_up_by_snapshot_then_members_are_promoted_removed_and_replaced() {
    // Small value-log segments: the leader's checkpoints point into its segment files, so the
    // snapshot it sends must carry those files with it (what a large store does).
    let mut c = Cluster::start(
        3,
        Net::Loopback,
        &[
            "--snapshot-count",
            SNAPSHOT_COUNT,
            "--value-log-segment-bytes",
            "4096",
        ],
    );
    put_keys(&c.members[0].client_url(), "before/", KEYS_BEFORE_JOIN);
    let segments = std::fs::read_dir(c.members[0].data_dir.join("vlog"))
        .expect("the value-log directory")
        .count();
    assert!(segments > 1, "300 puts sealed {segments} segments");

    // Add a learner; it must be served a snapshot, the log it needs is gone.
    let learner = c.add_member(0, "n3", Voting::Learner, None);
    let (_, kvs) = c.wait_converged(&[0, 1, 2, learner], Duration::from_secs(30));
    assert_eq!(
        kvs.iter()
            .filter(|(k, _, _)| k.starts_with("before/"))
            .count(),
        KEYS_BEFORE_JOIN
    );
    assert_caught_up_by_streamed_snapshot(&c, learner, 2);
    let listed = c.member_list(0);
    assert_eq!(listed.len(), 4);
    // etcd lists members by id, not in the order they joined.
    assert!(
        listed.windows(2).all(|w| w[0].id < w[1].id),
        "members listed by ascending id: {listed:?}"
    );
    assert_eq!(
        listed.iter().filter(|m| m.is_learner).count(),
        1,
        "exactly the new member is a learner: {listed:?}"
    );

    let learner_id = c.member_hex_id(0, learner);
    promote(&c, 0, &learner_id);
    assert!(
        c.member_list(1).iter().all(|m| !m.is_learner),
        "promotion left a learner"
    );
    // The promoted member serves linearizable reads and writes.
    c.wait_ready(learner);
    c.etcdctl(learner, &["put", "promoted", "yes"]).ok();
    let out = c
        .etcdctl(1, &["get", "promoted", "--print-value-only"])
        .ok();
    assert_eq!(out.stdout.trim(), "yes");

    // Remove a follower: it stops by itself, on applying its removal or, when the leader
    // dropped it before it heard the commit, when a peer tells it.
    let all: Vec<usize> = vec![0, 1, 2, learner];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let removed = [1, 2, 0]
        .into_iter()
        .find(|&i| i != leader)
        .expect("some original member follows");
    let removed_id = c.member_hex_id(leader, removed);
    c.remove_member(leader, &removed_id).ok();
    assert_exits_removed(&mut c, removed);
    let listed = c.member_list(leader);
    assert_eq!(listed.len(), 3, "after remove: {listed:?}");
    assert!(
        listed.iter().all(|m| format!("{:x}", m.id) != removed_id),
        "the removed member is still listed: {listed:?}"
    );
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != removed).collect();
    c.wait_leader(&live, Duration::from_secs(10));
    put_keys(&c.members[learner].client_url(), "after-remove/", 20);

    // Replace a follower whose disk is gone: remove it, wipe it, add it back with the same URLs.
    let (leader, _, _) = c.wait_leader(&live, Duration::from_secs(10));
    let replaced = live
        .iter()
        .copied()
        .find(|&i| i != leader)
        .expect("a follower remains");
    let old_id = c.member_hex_id(leader, replaced);
    c.kill9(replaced);
    std::fs::remove_dir_all(&c.members[replaced].data_dir).expect("wiping the data dir");
    c.remove_member(leader, &old_id).ok();
    let removed_at = std::time::Instant::now();
    // Write enough that a leader's checkpoint covers the removal before the replacement joins
    // and is sent the newest one. Checkpoints are written beside the raft loop and land a
    // little after they are due, so write twice --snapshot-count, not just past it.
    let snapshot_count: usize = SNAPSHOT_COUNT.parse().expect("a number");
    put_keys(
        &c.members[leader].client_url(),
        "while-replacing/",
        2 * snapshot_count,
    );
    // Ids mix in the second of the MemberAdd, as etcd's do: add in a later second than the
    // removal, or the replacement would get the removed id back.
    std::thread::sleep(Duration::from_millis(1_100).saturating_sub(removed_at.elapsed()));
    let name = c.members[replaced].name.clone();
    let again = c.add_member(leader, &name, Voting::Voter, Some(replaced));
    assert_eq!(again, replaced);
    c.wait_ready(replaced);
    let (_, kvs) = c.wait_converged(&live, Duration::from_secs(30));
    for prefix in ["before/", "after-remove/", "while-replacing/", "promoted"] {
        assert!(
            kvs.iter().any(|(k, _, _)| k.starts_with(prefix)),
            "keys {prefix}* missing after the replacement"
        );
    }
    let listed = c.member_list(replaced);
    assert_eq!(listed.len(), 3, "after replace: {listed:?}");
    // As in etcd, the re-added member gets a fresh id (the time of the MemberAdd is hashed in),
    // and it learned that id from its peers when it joined.
    let replacement = listed
        .iter()
        .find(|m| m.peer_urls.contains(&c.members[replaced].peer_url()))
        .expect("the replacement is listed under its old URL");
    assert_ne!(
        format!("{:x}", replacement.id),
        old_id,
        "the replacement has a new id"
    );
    assert!(
        !replacement.is_learner,
        "the replacement was added as a voter"
    );
    assert!(listed.iter().all(|m| !m.is_learner));
}

#[test]
fn a_follower_without_room_for_the_leaders_snapshot_says_why_and_is_unhealthy_until_it_has_room() {
    // The follower's data directory (checkpoints, value log, snapshot staging) is on a small
    // disk of its own; its WAL is not, so its restart needs no room there. While it is down,
    // the others write more entries than a leader keeps behind its newest checkpoint (5,000)
    // and more bytes than the disk has left, so it must come back through a snapshot that it
    // cannot store.
    const KEYS_WHILE_DOWN: usize = 6000;
    const PAD_BYTES: usize = 4096;
    // Left to ordinary users; root (the member) may also fill ext4's 5 % reserve, so it has
    // about 12 MiB, half of what the snapshot's segments need.
    const ROOM_LEFT_BYTES: u64 = 6 << 20;
    let scratch = tempfile::Builder::new()
        .prefix("keel-full-follower-")
        .tempdir()
        .expect("a temp dir");
    let disk = SmallDisk::new(scratch.path(), 128);
    let wal_root = scratch.path().join("wal");
    let mut c = Cluster::start_with(
        3,
        Net::Loopback,
        &["--snapshot-count", "200"],
        "http",
        |i| {
            vec![
                "--wal-dir".to_string(),
                wal_root.join(format!("n{i}")).display().to_string(),
            ]
        },
    );
    put_sized_keys(&c.members[0].client_url(), "before/", 20, 16);
    c.wait_converged(&[0, 1, 2], Duration::from_secs(30));
    let (leader, _, _) = c.wait_leader(&[0, 1, 2], Duration::from_secs(10));
    let behind = (0..3).find(|&i| i != leader).expect("a follower");
    c.kill9(behind);
    let on_disk = disk.mount.join("data");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&c.members[behind].data_dir)
        .arg(&on_disk)
        .status()
        .expect("cp runs");
    assert!(copied.success(), "copying n{behind}'s data directory");
    c.members[behind].data_dir = on_disk;
    let up: Vec<usize> = (0..3).filter(|&i| i != behind).collect();
    c.wait_leader(&up, Duration::from_secs(10));
    put_sized_keys(
        &c.members[up[0]].client_url(),
        "after/",
        KEYS_WHILE_DOWN,
        PAD_BYTES,
    );
    let ballast = disk.mount.join("ballast");
    let free = free_bytes(&disk.mount);
    assert!(free > ROOM_LEFT_BYTES, "the small disk is already full");
    let file = std::fs::File::create(&ballast).expect("ballast");
    // SAFETY: fallocate on a file we own; it only reserves blocks.
    let rc = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            (free - ROOM_LEFT_BYTES) as libc::off_t,
        )
    };
    assert_eq!(rc, 0, "fallocate of the ballast");
    drop(file);

    c.relaunch(behind);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Staged chunk by chunk: whichever step runs out of room says so, with the reason.
    let said_why = |log: &str| {
        log.lines().any(|l| {
            (l.contains("cannot stage a snapshot")
                || l.contains("cannot store a snapshot chunk")
                || l.contains("cannot complete a received snapshot"))
                && l.contains("No space left on device")
        })
    };
    while !said_why(&c.members[behind].log_all()) {
        assert!(
            c.members[behind].wait_exit(Duration::ZERO).is_none(),
            "n{behind} exited instead of waiting for room:\n{}",
            c.members[behind].log_tail()
        );
        assert!(
            Instant::now() < deadline,
            "n{behind} never said it cannot store the snapshot:\n{}",
            c.members[behind].log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Behind for good while the disk is full: never healthy, never ready, yet alive (a
    // restart would not give it room), as etcd's follower stays.
    let addr = format!(
        "{}:{}",
        c.members[behind].host, c.members[behind].client_port
    );
    for _ in 0..5 {
        let (code, body) = crate::common::http_get(&addr, "/health");
        assert_eq!(code, 503, "/health of n{behind} without room: {body}");
        assert!(body.contains("\"health\":\"false\""), "{body}");
        let (code, body) = crate::common::http_get(&addr, "/readyz?verbose");
        assert_eq!(code, 503, "/readyz of n{behind} without room: {body}");
        assert!(body.contains("[-]linearizable_read failed"), "{body}");
        let (code, body) = crate::common::http_get(&addr, "/livez");
        assert_eq!(code, 200, "/livez of n{behind}: {body}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let health = c.etcdctl(behind, &["endpoint", "health"]);
    assert_ne!(
        health.code, 0,
        "etcdctl calls n{behind} healthy: {health:?}"
    );
    // Meanwhile the leader sent the snapshot again ever less often (it reports each failure
    // to raft 1 s, 2 s, 4 s, ... late), not at every heartbeat round: each try reads and
    // sends it whole. Failed streams are then due at about 0, 1, 3, 7, 15 and 31 s; the checks above
    // (each waits a second for a read barrier) saw five here. Without the pause the leader
    // sent it 151 times meanwhile.
    let failed_sends: Vec<u64> = up
        .iter()
        .flat_map(|&i| {
            c.members[i]
                .log_all()
                .lines()
                .filter_map(|l| logged_number(l, "cannot send a snapshot", "failures_in_a_row"))
                .collect::<Vec<_>>()
        })
        .collect();
    eprintln!("snapshot streams that failed while the disk was full: {failed_sends:?}");
    assert!(
        (1..=6).contains(&failed_sends.len()),
        "the leader sent the snapshot {} times without pause: {failed_sends:?}",
        failed_sends.len()
    );

    // Room again: it stores the snapshot on its next try, catches up and is healthy.
    std::fs::remove_file(&ballast).expect("the ballast goes");
    // The next try may be up to 32 s away.
    c.wait_converged(&[0, 1, 2], Duration::from_secs(120));
    let last_key = format!("after/{:04}", KEYS_WHILE_DOWN - 1);
    let last_value = format!("value-{}{}", KEYS_WHILE_DOWN - 1, "v".repeat(PAD_BYTES));
    wait_serves(&c, behind, &last_key, &last_value);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, body) = crate::common::http_get(&addr, "/health");
        if code == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/health of n{behind} once caught up: {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
