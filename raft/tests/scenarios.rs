//! Data-driven scenario tests: every `testdata/*.txt` is a script of commands, each followed by
//! `----` and the expected output, blocks separated by a blank line (etcd-io/raft style).
//! `UPDATE_GOLDEN=1 cargo test -p keel-raft --test scenarios` rewrites the files with the
//! actual output so a behaviour change is reviewed as a diff.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use keel_raft::{
    CheckQuorum, ConfChange, ConfChangeType, ConfState, Config, Entry, EntryType, MemStorage,
    Message, MessageType, PreVote, ProgressState, RawNode, Ready, Role, SnapshotSent,
    SnapshotStatus, Storage,
};

struct Block {
    command: String,
    expected: String,
}

fn parse(text: &str, path: &Path) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let command = trimmed.to_string();
        let sep = lines
            .next()
            .unwrap_or_else(|| panic!("{}: `{command}` lacks a ---- line", path.display()));
        assert_eq!(sep.trim(), "----", "{}: after `{command}`", path.display());
        let mut expected = String::new();
        while let Some(l) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            expected.push_str(l);
            expected.push('\n');
            lines.next();
        }
        blocks.push(Block { command, expected });
    }
    blocks
}

struct Node {
    raw: RawNode<MemStorage>,
    conf: ConfState,
    applied: Vec<Entry>,
}

#[derive(Default)]
struct Env {
    nodes: BTreeMap<u64, Node>,
    in_flight: Vec<Message>,
    /// Directed links (from, to) that drop everything.
    cut: BTreeSet<(u64, u64)>,
    /// Directed links (from, to) that keep everything until `release`, as a TCP connection
    /// across a partition that drops packets does, and the messages kept.
    holding: BTreeSet<(u64, u64)>,
    held: Vec<Message>,
    /// While set, snapshot transfer reports wait in `reports` until `report-snapshots`, as a
    /// stream that outlasts a term does.
    hold_reports: bool,
    reports: Vec<(u64, SnapshotSent, SnapshotStatus)>,
    config: Option<Config>,
}

fn fmt_entry(e: &Entry) -> String {
    match e.entry_type {
        EntryType::Normal => format!(
            "{}/{} {:?}",
            e.term,
            e.index,
            String::from_utf8_lossy(&e.data)
        ),
        EntryType::ConfChange => {
            let cc = ConfChange::decode(&e.data).expect("scenario conf changes decode");
            format!("{}/{} conf {}", e.term, e.index, fmt_cc(&cc))
        }
    }
}

fn fmt_cc(cc: &ConfChange) -> String {
    let kind = match cc.change_type {
        ConfChangeType::AddNode => "add",
        ConfChangeType::AddLearnerNode => "add-learner",
        ConfChangeType::RemoveNode => "remove",
    };
    format!("{kind} {}", cc.node_id)
}

fn fmt_entries(ents: &[Entry]) -> String {
    let v: Vec<String> = ents.iter().map(fmt_entry).collect();
    format!("[{}]", v.join(", "))
}

fn fmt_ctx(ctx: &Bytes) -> String {
    if ctx.len() == 8 && ctx.iter().take(4).all(|b| *b == 0) {
        let id = u64::from_be_bytes(ctx.as_ref().try_into().expect("length checked"));
        return format!(" round={id}");
    }
    if ctx.is_empty() {
        String::new()
    } else {
        format!(" ctx={:?}", String::from_utf8_lossy(ctx))
    }
}

fn fmt_msg(m: &Message) -> String {
    let mut s = format!("{}->{} {:?} term={}", m.from, m.to, m.msg_type, m.term);
    match m.msg_type {
        MessageType::Append => {
            let _ = write!(
                s,
                " log={}/{} commit={} entries={}",
                m.log_term,
                m.index,
                m.commit,
                fmt_entries(&m.entries)
            );
        }
        MessageType::AppendResponse => {
            let _ = write!(s, " index={}", m.index);
            if m.reject {
                let _ = write!(s, " reject hint={}/{}", m.reject_hint, m.log_term);
            }
        }
        MessageType::RequestVote | MessageType::RequestPreVote => {
            let _ = write!(s, " log={}/{}", m.log_term, m.index);
            if !m.context.is_empty() {
                let _ = write!(s, " ({})", String::from_utf8_lossy(&m.context));
            }
        }
        MessageType::RequestVoteResponse | MessageType::RequestPreVoteResponse => {
            if m.reject {
                s.push_str(" reject");
            }
        }
        MessageType::Snapshot => {
            let snap = m.snapshot.as_ref().expect("snapshot message");
            let md = &snap.metadata;
            let _ = write!(
                s,
                " snap={}/{} voters={:?} learners={:?}",
                md.term, md.index, md.conf_state.voters, md.conf_state.learners
            );
        }
        MessageType::Heartbeat => {
            let _ = write!(s, " commit={}{}", m.commit, fmt_ctx(&m.context));
        }
        MessageType::HeartbeatResponse => s.push_str(&fmt_ctx(&m.context)),
        MessageType::Propose => {
            let _ = write!(s, " entries={}", fmt_entries(&m.entries));
        }
        MessageType::ReadIndex | MessageType::ReadIndexResponse => {
            let _ = write!(s, " index={}{}", m.index, fmt_ctx(&m.context));
        }
        MessageType::TransferLeader | MessageType::TimeoutNow => {}
    }
    s
}

fn parse_u64(s: &str) -> u64 {
    s.parse()
        .unwrap_or_else(|_| panic!("expected a number, got {s:?}"))
}

impl Env {
    fn node(&mut self, id: u64) -> &mut Node {
        self.nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn add_nodes(&mut self, args: &[&str]) -> String {
        let n = parse_u64(args[0]);
        let mut cfg = Config::new(0);
        cfg.election_tick = 10;
        cfg.heartbeat_tick = 1;
        cfg.max_inflight_msgs = 4;
        cfg.max_size_per_msg_bytes = 1 << 20;
        for kv in &args[1..] {
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("bad option {kv}"));
            match k {
                "pre-vote" => {
                    cfg.pre_vote = if v == "on" {
                        PreVote::Enabled
                    } else {
                        PreVote::Disabled
                    }
                }
                "check-quorum" => {
                    cfg.check_quorum = if v == "on" {
                        CheckQuorum::Enabled
                    } else {
                        CheckQuorum::Disabled
                    }
                }
                "inflight" => cfg.max_inflight_msgs = parse_u64(v) as usize,
                "max-msg-bytes" => cfg.max_size_per_msg_bytes = parse_u64(v),
                "max-uncommitted-bytes" => cfg.max_uncommitted_entries_bytes = parse_u64(v),
                "max-pending-reads" => cfg.max_pending_read_index = parse_u64(v) as usize,
                _ => panic!("unknown option {k}"),
            }
        }
        let base = self.config.get_or_insert(cfg).clone();
        let first = self.nodes.keys().last().copied().unwrap_or(0) + 1;
        let bootstrap = self.nodes.is_empty();
        let ids: Vec<u64> = (first..first + n).collect();
        let mut out = String::new();
        for &id in &ids {
            let storage = if bootstrap {
                MemStorage::new_with_voters(&ids)
            } else {
                MemStorage::new()
            };
            let conf = storage.initial_state().conf_state;
            let config = Config {
                id,
                seed: 1,
                ..base.clone()
            };
            let raw = RawNode::new(&config, storage).expect("valid scenario config");
            let _ = writeln!(
                out,
                "node {id}: voters={:?} learners={:?}",
                conf.voters, conf.learners
            );
            self.nodes.insert(
                id,
                Node {
                    raw,
                    conf,
                    applied: Vec::new(),
                },
            );
        }
        out
    }

    /// Handles one Ready of `id` as the server would: persist, send, advance, apply.
    fn handle_ready(&mut self, id: u64, out: &mut String) {
        let node = self.node(id);
        let rd: Ready = node.raw.ready();
        let _ = writeln!(out, "> {id} handling Ready");
        if let Some(ss) = rd.soft_state {
            let _ = writeln!(out, "  soft: leader={} role={:?}", ss.leader_id, ss.role);
        }
        if let Some(hs) = rd.hard_state {
            let _ = writeln!(
                out,
                "  hard: term={} vote={} commit={}",
                hs.term, hs.vote, hs.commit
            );
        }
        if let Some(s) = &rd.snapshot {
            let _ = writeln!(
                out,
                "  snapshot: {}/{} data={:?}",
                s.metadata.term,
                s.metadata.index,
                String::from_utf8_lossy(&s.data)
            );
        }
        if !rd.entries.is_empty() {
            let _ = writeln!(out, "  entries: {}", fmt_entries(&rd.entries));
        }
        for m in &rd.messages {
            let _ = writeln!(out, "  send: {}", fmt_msg(m));
        }
        for m in &rd.persisted_messages {
            let _ = writeln!(out, "  send after persist: {}", fmt_msg(m));
        }
        if !rd.committed_entries.is_empty() {
            let _ = writeln!(out, "  committed: {}", fmt_entries(&rd.committed_entries));
        }
        for rs in &rd.read_states {
            let _ = writeln!(
                out,
                "  read-state: index={}{}",
                rs.index,
                fmt_ctx(&rs.context)
            );
        }
        node.raw.advance();
        if let Some(s) = &rd.snapshot {
            node.conf = s.metadata.conf_state.clone();
        }
        for e in &rd.committed_entries {
            if e.entry_type == EntryType::ConfChange {
                let cc = ConfChange::decode(&e.data).expect("conf change entries decode");
                node.conf = node.raw.apply_conf_change(&cc);
                node.raw.store_mut().set_conf_state(node.conf.clone());
                let _ = writeln!(
                    out,
                    "  applied conf: voters={:?} learners={:?}",
                    node.conf.voters, node.conf.learners
                );
            }
            node.applied.push(e.clone());
        }
        self.in_flight.extend(rd.messages);
        self.in_flight.extend(rd.persisted_messages);
    }

    fn deliver(&mut self, out: &mut String) {
        let msgs = std::mem::take(&mut self.in_flight);
        let mut by_node: BTreeMap<u64, Vec<Message>> = BTreeMap::new();
        for m in msgs {
            by_node.entry(m.to).or_default().push(m);
        }
        for (to, msgs) in by_node {
            let _ = writeln!(out, "> {to} receiving messages");
            for m in msgs {
                if self.holding.contains(&(m.from, m.to)) {
                    let _ = writeln!(out, "  held: {}", fmt_msg(&m));
                    self.held.push(m);
                    continue;
                }
                let snapshot = SnapshotSent::of(&m);
                let from = m.from;
                if self.cut.contains(&(m.from, m.to)) || !self.nodes.contains_key(&to) {
                    let _ = writeln!(out, "  dropped: {}", fmt_msg(&m));
                    if let Some(sent) = snapshot {
                        self.report_snapshot(from, sent, SnapshotStatus::Failure, out);
                    }
                    continue;
                }
                let _ = writeln!(out, "  {}", fmt_msg(&m));
                if let Err(e) = self.node(to).raw.step(m) {
                    let _ = writeln!(out, "  error: {e}");
                }
                if let Some(sent) = snapshot {
                    self.report_snapshot(from, sent, SnapshotStatus::Finish, out);
                }
            }
        }
    }

    fn stabilize(&mut self, out: &mut String) {
        for _round in 0..1000 {
            let ready: Vec<u64> = self
                .nodes
                .iter()
                .filter(|(_, n)| n.raw.has_ready())
                .map(|(id, _)| *id)
                .collect();
            if ready.is_empty() && self.in_flight.is_empty() {
                return;
            }
            for id in ready {
                self.handle_ready(id, out);
            }
            self.deliver(out);
        }
        panic!("stabilize did not converge");
    }

    fn status(&mut self, id: u64) -> String {
        let node = self.node(id);
        let st = node.raw.status();
        let mut out = format!(
            "{id}: role={:?} leader={} term={} vote={} commit={} applied={} last={}\n",
            st.soft_state.role,
            st.soft_state.leader_id,
            st.hard_state.term,
            st.hard_state.vote,
            st.hard_state.commit,
            st.applied,
            st.last_index
        );
        if st.soft_state.role == Role::Leader {
            let r = node.raw.raft();
            for &p in st
                .conf_state
                .voters
                .iter()
                .chain(st.conf_state.learners.iter())
            {
                if let Some(pr) = r.progress(p) {
                    let learner = if pr.is_learner { " learner" } else { "" };
                    let paused = if pr.is_paused() { " paused" } else { "" };
                    let pending = if pr.state == ProgressState::Snapshot {
                        format!(" pending-snapshot={}", pr.pending_snapshot)
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        out,
                        "  {p}: {:?}{pending} match={} next={} inflight={}{paused}{learner}",
                        pr.state,
                        pr.matched,
                        pr.next_idx,
                        pr.inflights.count()
                    );
                }
            }
        }
        out
    }

    /// The transport's report on a snapshot `from` sent: handed to raft now, or held.
    fn report_snapshot(
        &mut self,
        from: u64,
        sent: SnapshotSent,
        status: SnapshotStatus,
        out: &mut String,
    ) {
        if self.hold_reports {
            let _ = writeln!(
                out,
                "  report held: {from}->{} snap term={} index={} {status:?}",
                sent.to, sent.term, sent.index
            );
            self.reports.push((from, sent, status));
        } else if let Some(n) = self.nodes.get_mut(&from) {
            n.raw.report_snapshot(sent, status);
        }
    }

    fn run(&mut self, command: &str) -> String {
        let parts: Vec<&str> = command.split_whitespace().collect();
        let (cmd, args) = (parts[0], &parts[1..]);
        let id = || parse_u64(args[0]);
        let mut out = String::new();
        match cmd {
            "add-nodes" => out = self.add_nodes(args),
            "campaign" => self.node(id()).raw.campaign(),
            "restart" => {
                // A crash and restart: only the storage (what was persisted) survives; the
                // state machine is durable as of the last applied entry.
                let config = self.config.clone().expect("nodes added first");
                let node = self.node(id());
                let storage = node.raw.store().clone();
                let applied = node.applied.last().map_or(0, |e| e.index);
                let applied = applied.max(storage.snapshot().map_or(0, |s| s.metadata.index));
                let config = Config {
                    id: id(),
                    seed: 1,
                    applied,
                    ..config
                };
                node.raw = RawNode::new(&config, storage).expect("valid restart config");
            }
            "tick" => {
                let n = parse_u64(args[1]);
                for _ in 0..n {
                    self.node(id()).raw.tick();
                }
            }
            "tick-election" | "tick-heartbeat" => {
                let election = self
                    .config
                    .as_ref()
                    .expect("nodes added first")
                    .election_tick;
                for a in args {
                    let node = &mut self.node(parse_u64(a)).raw;
                    let n = if cmd == "tick-heartbeat" {
                        1
                    } else if node.status().soft_state.role == Role::Leader {
                        // Check-quorum looks back one whole timeout, every timeout.
                        2 * election
                    } else {
                        // The longest randomized timeout, and too few ticks to campaign twice.
                        election + election / 2
                    };
                    for _ in 0..n {
                        node.tick();
                    }
                }
            }
            "propose" => {
                if let Err(e) = self
                    .node(id())
                    .raw
                    .propose(Bytes::from(args[1].to_string()))
                {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "propose-batch" => {
                let data = args[1..]
                    .iter()
                    .map(|a| Bytes::from(a.to_string()))
                    .collect();
                if let Err(e) = self.node(id()).raw.propose_batch(data) {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "propose-conf-change" => {
                let change_type = match args[1] {
                    "add" => ConfChangeType::AddNode,
                    "add-learner" => ConfChangeType::AddLearnerNode,
                    "remove" => ConfChangeType::RemoveNode,
                    other => panic!("unknown conf change {other}"),
                };
                let cc = ConfChange {
                    change_type,
                    node_id: parse_u64(args[2]),
                    context: Bytes::new(),
                };
                if let Err(e) = self.node(id()).raw.propose_conf_change(&cc) {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "read-index" => {
                if let Err(e) = self
                    .node(id())
                    .raw
                    .read_index(Bytes::from(args[1].to_string()))
                {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "transfer-leader" => {
                let to = parse_u64(args[1]);
                self.node(id()).raw.transfer_leader(to);
            }
            "partition" => {
                let group: BTreeSet<u64> = args.iter().map(|a| parse_u64(a)).collect();
                let all: Vec<u64> = self.nodes.keys().copied().collect();
                for &a in &all {
                    for &b in &all {
                        if group.contains(&a) != group.contains(&b) {
                            self.cut.insert((a, b));
                        }
                    }
                }
            }
            "cut" => {
                self.cut.insert((id(), parse_u64(args[1])));
            }
            "heal" => self.cut.clear(),
            "hold" => {
                self.holding.insert((id(), parse_u64(args[1])));
            }
            "release" => {
                // Everything kept arrives before what is in flight, in the order it was sent.
                self.holding.clear();
                let mut msgs = std::mem::take(&mut self.held);
                msgs.append(&mut self.in_flight);
                self.in_flight = msgs;
            }
            "hold-reports" => self.hold_reports = true,
            "report-snapshots" => {
                // The oldest `n` held reports reach their senders, in the order they were made.
                let n = parse_u64(args[0]) as usize;
                assert!(
                    n <= self.reports.len(),
                    "report-snapshots {n}: only {} held",
                    self.reports.len()
                );
                let due: Vec<_> = self.reports.drain(..n).collect();
                for (from, sent, status) in due {
                    let _ = writeln!(
                        out,
                        "  report: {from}->{} snap term={} index={} {status:?}",
                        sent.to, sent.term, sent.index
                    );
                    if let Some(node) = self.nodes.get_mut(&from) {
                        node.raw.report_snapshot(sent, status);
                    }
                }
            }
            "process-ready" => {
                for a in args {
                    let id = parse_u64(a);
                    if self.node(id).raw.has_ready() {
                        self.handle_ready(id, &mut out);
                    }
                }
            }
            "deliver-msgs" => self.deliver(&mut out),
            "stabilize" => self.stabilize(&mut out),
            "compact" => {
                let index = parse_u64(args[1]);
                let node = self.node(id());
                let conf = node.conf.clone();
                let data = Bytes::from(format!("snap@{index}"));
                let store = node.raw.store_mut();
                store
                    .create_snapshot(index, conf, data)
                    .expect("snapshot index is applied");
                store.compact(index).expect("compact within the snapshot");
                let _ = writeln!(out, "first index now {}", node.raw.store().first_index());
            }
            "status" => {
                for a in args {
                    out.push_str(&self.status(parse_u64(a)));
                }
            }
            "raft-log" => {
                let store = self.node(id()).raw.store();
                let (lo, hi) = (store.first_index(), store.last_index() + 1);
                let ents = store.entries(lo, hi, u64::MAX).expect("held range");
                let _ = writeln!(out, "first={} {}", lo, fmt_entries(&ents));
            }
            "applied" => {
                let node = self.node(id());
                let _ = writeln!(out, "{}", fmt_entries(&node.applied));
            }
            other => panic!("unknown command {other}"),
        }
        if out.is_empty() {
            out.push_str("ok\n");
        }
        out
    }
}

#[test]
fn scenarios() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let update = std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("testdata directory exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 9,
        "expected the scenario files, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable scenario file");
        // Comments are kept in place: the file is re-walked line by line.
        let mut env = Env::default();
        let mut rewritten = String::new();
        let blocks = parse(&text, &path);
        let mut block_iter = blocks.iter();
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            let t = line.trim();
            if t.is_empty() {
                continue;
            }
            if t.starts_with('#') {
                rewritten.push_str(line);
                rewritten.push('\n');
                continue;
            }
            let block = block_iter.next().expect("parse saw the same commands");
            lines.next(); // ----
            while lines.peek().is_some_and(|l| !l.trim().is_empty()) {
                lines.next();
            }
            let actual = env.run(&block.command);
            if actual != block.expected {
                failures.push(format!(
                    "{}: `{}`\n--- expected\n{}--- actual\n{}",
                    path.display(),
                    block.command,
                    block.expected,
                    actual
                ));
            }
            let _ = write!(rewritten, "{}\n----\n{}\n", block.command, actual);
        }
        if update {
            std::fs::write(&path, rewritten).expect("scenario file writable");
        }
    }
    if !update {
        assert!(
            failures.is_empty(),
            "{} scenario blocks differ:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
