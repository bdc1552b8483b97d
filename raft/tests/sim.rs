//! Deterministic simulation of 3- and 5-member clusters in one thread.
//!
//! A seeded network drops, duplicates, delays and reorders messages and applies symmetric and
//! asymmetric partitions; members crash and restart, losing whatever was not persisted (the
//! persist step of each Ready is scheduled by the simulator); proposals, reads, membership
//! changes, leader transfers and compactions are mixed in. Checked after every step: at most
//! one leader per term, log matching, leader completeness, state-machine safety; after the
//! faults heal, a leader is elected and a proposal commits within a bounded number of ticks.
//!
//! `SEED=n cargo test -p keel-raft --test sim` replays one seed; `SEEDS=n` sets how many
//! seeds each cluster size runs (default below); `TRACE=1` with `SEED=n` prints every persist
//! and crash. Soak: `SEEDS=200000 cargo test -p keel-raft --release --test sim`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use keel_raft::{
    CheckQuorum, ConfChange, ConfChangeType, ConfState, Config, EntryType, HardState, MemStorage,
    Message, PreVote, RawNode, Ready, Role, SnapshotSent, SnapshotStatus, Storage,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Seeds per cluster size in the default (CI) run.
const DEFAULT_SEEDS: u64 = 3000;
const SUBSTEPS_PER_TICK: u64 = 4;
const CHAOS_TICKS: u64 = 150;
/// After healing, a leader must commit a proposal within this many ticks.
const LIVENESS_TICKS_MAX: u64 = 200;
const ELECTION_TICK: usize = 10;

struct SimNode {
    raw: Option<RawNode<MemStorage>>,
    /// Durable state while crashed.
    durable: Option<MemStorage>,
    /// A Ready taken but not yet persisted, with the term of the entry before its first entry.
    pending: Option<(Ready, u64)>,
    down_until: u64,
    removed: bool,
    sm_applied: u64,
    sm_conf: ConfState,
    initial_conf: ConfState,
}

struct Pending {
    deliver_at: u64,
    /// Send order: ties on `deliver_at` are delivered in send order.
    seq: u64,
    bytes: Vec<u8>,
    from: u64,
    to: u64,
    /// A snapshot's transfer is reported when it is delivered or dropped, which may be after
    /// the leader's term ended: raft must then ignore the report.
    snapshot: Option<SnapshotSent>,
}

struct Sim {
    seed: u64,
    rng: StdRng,
    now: u64,
    config: Config,
    nodes: BTreeMap<u64, SimNode>,
    net: Vec<Pending>,
    net_seq: u64,
    cut: BTreeSet<(u64, u64)>,
    drop_pct: u32,
    dup_pct: u32,
    delay_max: u64,
    next_id: u64,
    id_max: u64,
    proposals: u64,
    leaders: BTreeMap<u64, u64>,
    log_entries: HashMap<(u64, u64), (EntryType, Bytes, u64)>,
    applied: BTreeMap<u64, (u64, Bytes)>,
    checked_leaders: BTreeSet<(u64, u64)>,
    stats: Stats,
    /// `TRACE=1` prints every persist and crash (for replaying a failing seed).
    trace: bool,
    reads: u64,
    /// Per read context: the highest commit index anywhere when the read was requested.
    read_floors: HashMap<Bytes, u64>,
    /// Snapshot transfer reports held back, as the transport holds a failed stream's report
    /// (its retry pause, 1-32 s, longer than this sim's hold) or sends one only when the
    /// stream ends: (due, from, sent, status). A report may so come back after its term ended,
    /// which raft must ignore.
    reports: Vec<(u64, u64, SnapshotSent, SnapshotStatus)>,
}

/// What a run exercised, summed over seeds and printed, so a quiet simulator is noticed.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    committed: u64,
    leaders: u64,
    snapshots_installed: u64,
    conf_changes: u64,
    crashes: u64,
    read_states: u64,
    /// Snapshot reports handed to their sender after the term they were sent in.
    reports_after_their_term: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.committed += o.committed;
        self.leaders += o.leaders;
        self.snapshots_installed += o.snapshots_installed;
        self.conf_changes += o.conf_changes;
        self.crashes += o.crashes;
        self.read_states += o.read_states;
        self.reports_after_their_term += o.reports_after_their_term;
    }
}

impl Sim {
    fn new(seed: u64, members: u64) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut config = Config::new(0);
        config.election_tick = ELECTION_TICK;
        config.heartbeat_tick = 1;
        config.pre_vote = if rng.gen_bool(0.7) {
            PreVote::Enabled
        } else {
            PreVote::Disabled
        };
        config.check_quorum = if rng.gen_bool(0.7) {
            CheckQuorum::Enabled
        } else {
            CheckQuorum::Disabled
        };
        config.max_inflight_msgs = rng.gen_range(1..8);
        config.max_size_per_msg_bytes = rng.gen_range(20..300);
        config.max_uncommitted_entries_bytes = 4096;
        config.seed = seed;
        let ids: Vec<u64> = (1..=members).collect();
        let mut sim = Sim {
            seed,
            rng,
            now: 0,
            config,
            nodes: BTreeMap::new(),
            net: Vec::new(),
            net_seq: 0,
            cut: BTreeSet::new(),
            drop_pct: 0,
            dup_pct: 0,
            delay_max: 0,
            next_id: members + 1,
            id_max: members + 3,
            proposals: 0,
            leaders: BTreeMap::new(),
            log_entries: HashMap::new(),
            applied: BTreeMap::new(),
            checked_leaders: BTreeSet::new(),
            stats: Stats::default(),
            trace: std::env::var("TRACE").is_ok_and(|v| v == "1"),
            reads: 0,
            read_floors: HashMap::new(),
            reports: Vec::new(),
        };
        sim.drop_pct = sim.rng.gen_range(0..15);
        sim.dup_pct = sim.rng.gen_range(0..10);
        sim.delay_max = sim.rng.gen_range(1..8);
        for &id in &ids {
            sim.add_node(id, MemStorage::new_with_voters(&ids));
        }
        sim
    }

    fn add_node(&mut self, id: u64, storage: MemStorage) {
        let initial_conf = storage.initial_state().conf_state;
        let sm_applied = storage.snapshot().map_or(0, |s| s.metadata.index);
        let config = Config {
            id,
            ..self.config.clone()
        };
        let raw = RawNode::new(&config, storage).expect("valid sim config");
        self.nodes.insert(
            id,
            SimNode {
                raw: Some(raw),
                durable: None,
                pending: None,
                down_until: 0,
                removed: false,
                sm_applied,
                sm_conf: initial_conf.clone(),
                initial_conf,
            },
        );
    }

    fn fail(&self, what: String) -> ! {
        panic!("sim invariant violated (seed {}): {what}", self.seed);
    }

    /// The highest index known committed by any live member.
    fn max_commit(&self) -> u64 {
        self.nodes
            .values()
            .filter_map(|n| n.raw.as_ref())
            .map(|r| r.raft().raft_log.committed)
            .max()
            .unwrap_or(0)
    }

    fn live_ids(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.raw.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    fn leader(&self) -> Option<u64> {
        self.nodes
            .iter()
            .filter_map(|(id, n)| n.raw.as_ref().map(|r| (id, r.raft())))
            .filter(|(_, r)| r.role == Role::Leader)
            .max_by_key(|(_, r)| r.term)
            .map(|(id, _)| *id)
    }

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            let copies = if self.rng.gen_range(0..100) < self.dup_pct {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let deliver_at = self.now + self.rng.gen_range(0..=self.delay_max);
                let snapshot = SnapshotSent::of(&m);
                self.net_seq += 1;
                self.net.push(Pending {
                    deliver_at,
                    seq: self.net_seq,
                    bytes: bytes.clone(),
                    from: m.from,
                    to: m.to,
                    snapshot,
                });
            }
        }
    }

    fn take_ready(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("live node");
        let raw = node.raw.as_mut().expect("live node");
        let rd = raw.ready();
        let prev_term = match rd.entries.first() {
            Some(e) => raw.raft().raft_log.term(e.index - 1).unwrap_or(u64::MAX),
            None => 0,
        };
        let msgs = rd.messages.clone();
        if self.trace {
            let m: Vec<_> = msgs
                .iter()
                .map(|m| (m.msg_type, m.to, m.term, m.index, m.entries.len()))
                .collect();
            eprintln!("t={} ready {id}: send {m:?}", self.now);
        }
        node.pending = Some((rd, prev_term));
        self.send(msgs);
    }

    fn persist(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("live node");
        let (rd, first_prev_term) = node.pending.take().expect("a pending ready");
        if self.trace {
            eprintln!(
                "t={} persist {id}: hs={:?} ents={:?} committed={:?} snap={:?} msgs={:?}",
                self.now,
                rd.hard_state,
                rd.entries
                    .iter()
                    .map(|e| (e.index, e.term))
                    .collect::<Vec<_>>(),
                rd.committed_entries
                    .iter()
                    .map(|e| (e.index, e.term))
                    .collect::<Vec<_>>(),
                rd.snapshot.as_ref().map(|s| s.metadata.index),
                rd.persisted_messages
                    .iter()
                    .map(|m| (m.msg_type, m.to, m.term, m.index, m.reject))
                    .collect::<Vec<_>>()
            );
        }
        // Log matching: an (index, term) pair names one entry with one predecessor term (by
        // induction, identical prefixes). u64::MAX marks a predecessor term not known here.
        let mut prev = first_prev_term;
        for e in &rd.entries {
            let key = (e.index, e.term);
            match self.log_entries.get(&key) {
                None => {
                    self.log_entries
                        .insert(key, (e.entry_type, e.data.clone(), prev));
                }
                Some((t, d, p)) => {
                    let same_entry = *t == e.entry_type && *d == e.data;
                    let same_prev = *p == prev || *p == u64::MAX || prev == u64::MAX;
                    if !same_entry || !same_prev {
                        let msg = format!("log matching at {}/{}: ({t:?}, {d:?}, prev {p}) vs ({:?}, {:?}, prev {prev})", e.term, e.index, e.entry_type, e.data);
                        self.fail(msg);
                    }
                }
            }
            prev = e.term;
        }
        let node = self.nodes.get_mut(&id).expect("live node");
        let raw = node.raw.as_mut().expect("live node");
        raw.advance();
        self.stats.read_states += rd.read_states.len() as u64;
        if rd.snapshot.is_some() {
            self.stats.snapshots_installed += 1;
        }
        if let Some(s) = &rd.snapshot {
            node.sm_applied = s.metadata.index;
            node.sm_conf = s.metadata.conf_state.clone();
        }
        let mut removed = Vec::new();
        let mut applied = Vec::new();
        for e in &rd.committed_entries {
            if e.index != node.sm_applied + 1 {
                let msg = format!("node {id} applies {} after {}", e.index, node.sm_applied);
                self.fail(msg);
            }
            if e.entry_type == EntryType::ConfChange {
                let cc = ConfChange::decode(&e.data).expect("conf change entries decode");
                node.sm_conf = raw.apply_conf_change(&cc);
                self.stats.conf_changes += 1;
                raw.store_mut().set_conf_state(node.sm_conf.clone());
                if cc.change_type == ConfChangeType::RemoveNode {
                    removed.push(cc.node_id);
                }
            }
            node.sm_applied = e.index;
            applied.push((e.index, e.term, e.data.clone()));
        }
        // Linearizable reads: the read index covers every commit that happened before the
        // request was made.
        for rs in &rd.read_states {
            let floor = self
                .read_floors
                .get(&rs.context)
                .copied()
                .unwrap_or_else(|| {
                    let msg = format!("read state for unknown context {:?}", rs.context);
                    self.fail(msg)
                });
            if rs.index < floor {
                let msg = format!(
                    "read {:?} at {} misses commit {floor}",
                    rs.context, rs.index
                );
                self.fail(msg);
            }
        }
        self.send(rd.persisted_messages);
        for (index, term, data) in applied {
            match self.applied.get(&index) {
                Some((t, d)) if *t != term || *d != data => {
                    let msg =
                        format!("state machine safety at {index}: {t}/{d:?} vs {term}/{data:?}");
                    self.fail(msg)
                }
                Some(_) => {}
                None => {
                    self.stats.committed += 1;
                    self.applied.insert(index, (term, data));
                }
            }
        }
        for r in removed {
            // A removed member shuts down, as etcd's does.
            if let Some(n) = self.nodes.get_mut(&r) {
                n.removed = true;
                n.raw = None;
                n.pending = None;
                n.durable = None;
            }
        }
    }

    fn crash(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("node exists");
        let Some(raw) = node.raw.take() else { return };
        if self.trace {
            eprintln!("t={} crash {id}", self.now);
        }
        // Whatever the pending Ready carried is lost: only the storage is durable. So are the
        // reports its transport still held.
        node.pending = None;
        self.reports.retain(|r| r.1 != id);
        self.stats.crashes += 1;
        node.durable = Some(raw.store().clone());
        node.down_until = self.now + self.rng.gen_range(1..40 * SUBSTEPS_PER_TICK);
    }

    fn restart(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("node exists");
        let Some(mut storage) = node.durable.take() else {
            return;
        };
        let (snap_index, snap_conf) = match storage.snapshot() {
            Ok(s) => (s.metadata.index, s.metadata.conf_state),
            Err(_) => (0, node.initial_conf.clone()),
        };
        // A commit-only hard state is written without sync (Durability::NoSync), so a crash
        // may lose commit progress; the commit index is volatile in Raft, so any loss down to
        // the snapshot must be survivable.
        if self.rng.gen_bool(0.3) {
            let hs = storage.hard_state();
            let commit = self.rng.gen_range(snap_index.min(hs.commit)..=hs.commit);
            storage.set_hard_state(HardState { commit, ..hs });
        }
        // Either the state machine survived the crash (applied index and membership kept), or
        // it is durable only as of the snapshot and the log replays the rest.
        let (applied, conf) = if self.rng.gen_bool(0.5) {
            (node.sm_applied, node.sm_conf.clone())
        } else {
            (snap_index, snap_conf)
        };
        storage.set_conf_state(conf.clone());
        node.sm_applied = applied;
        node.sm_conf = conf;
        let config = Config {
            id,
            applied,
            ..self.config.clone()
        };
        node.raw = Some(RawNode::new(&config, storage).expect("valid sim config"));
    }

    /// The transport's report on a snapshot `from` sent: at once, or held back for up to
    /// three election timeouts (shorter than the transport's retry pause, to keep runs short;
    /// long enough to outlast a term).
    fn report_snapshot(&mut self, from: u64, sent: SnapshotSent, status: SnapshotStatus) {
        if self.nodes.get(&from).is_none_or(|n| n.raw.is_none()) {
            // The sender is down: its transport's tasks went with it.
            return;
        }
        if self.rng.gen_bool(0.5) {
            let held = self
                .rng
                .gen_range(1..3 * ELECTION_TICK as u64 * SUBSTEPS_PER_TICK);
            self.reports.push((self.now + held, from, sent, status));
        } else if let Some(raw) = self.nodes.get_mut(&from).and_then(|n| n.raw.as_mut()) {
            raw.report_snapshot(sent, status);
        }
    }

    fn deliver(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.reports.len() {
            if self.reports[i].0 > now {
                i += 1;
                continue;
            }
            let (_, from, sent, status) = self.reports.swap_remove(i);
            if let Some(raw) = self.nodes.get_mut(&from).and_then(|n| n.raw.as_mut()) {
                if raw.raft().term != sent.term {
                    self.stats.reports_after_their_term += 1;
                }
                raw.report_snapshot(sent, status);
            }
        }
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.net.len() {
            if self.net[i].deliver_at <= now {
                due.push(self.net.swap_remove(i));
            } else {
                i += 1;
            }
        }
        // Reordering comes only from the random delays; equal delivery times keep send order.
        due.sort_by_key(|p| (p.deliver_at, p.seq));
        for p in due {
            let dropped = self.cut.contains(&(p.from, p.to))
                || self.rng.gen_range(0..100) < self.drop_pct
                || self.nodes.get(&p.to).is_none_or(|n| n.raw.is_none());
            if dropped {
                if let Some(sent) = p.snapshot {
                    self.report_snapshot(p.from, sent, SnapshotStatus::Failure);
                } else if self.rng.gen_bool(0.1) {
                    if let Some(raw) = self.nodes.get_mut(&p.from).and_then(|n| n.raw.as_mut()) {
                        raw.report_unreachable(p.to);
                    }
                }
                continue;
            }
            let m = Message::decode(&p.bytes).expect("encoded messages decode");
            let raw = self
                .nodes
                .get_mut(&p.to)
                .and_then(|n| n.raw.as_mut())
                .expect("checked live");
            // Errors are refusals (no leader, limits): expected under faults.
            let _ = raw.step(m);
            if let Some(sent) = p.snapshot {
                self.report_snapshot(p.from, sent, SnapshotStatus::Finish);
            }
        }
    }

    fn check(&mut self) {
        let mut new_leaders = Vec::new();
        for (&id, n) in &self.nodes {
            let Some(raw) = &n.raw else { continue };
            let r = raw.raft();
            if r.role != Role::Leader {
                continue;
            }
            if let Some(&other) = self.leaders.get(&r.term) {
                if other != id {
                    self.fail(format!("two leaders in term {}: {other} and {id}", r.term));
                }
            }
            if !self.checked_leaders.contains(&(id, r.term)) {
                new_leaders.push((id, r.term));
            }
        }
        for (id, term) in new_leaders {
            self.leaders.insert(term, id);
            self.stats.leaders += 1;
            self.checked_leaders.insert((id, term));
            // Leader completeness: every applied (hence committed) entry is in the new log.
            let r = self.nodes[&id].raw.as_ref().expect("live").raft();
            let first = r.raft_log.first_index();
            for (&index, (t, _)) in self.applied.range(first..) {
                if r.raft_log.term(index) != Ok(*t) {
                    for (&nid, n) in &self.nodes {
                        if let Some(raw) = &n.raw {
                            let rr = raw.raft();
                            eprintln!("node {nid}: term {} role {:?} commit {} first {} last {} terms {:?}", rr.term, rr.role, rr.raft_log.committed, rr.raft_log.first_index(), rr.raft_log.last_index(), (index.saturating_sub(3)..=index+3).map(|i| rr.raft_log.term(i)).collect::<Vec<_>>());
                        }
                    }
                    let msg =
                        format!("leader {id} of term {term} lacks committed entry {t}/{index}");
                    self.fail(msg);
                }
            }
        }
    }

    // `is_multiple_of` is newer than the workspace's rust-version (1.85).
    #[allow(unknown_lints, clippy::manual_is_multiple_of)]
    fn substep(&mut self, persist_pct: u32) {
        self.now += 1;
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for &id in &ids {
            let n = &self.nodes[&id];
            if n.raw.is_none() && !n.removed && n.durable.is_some() && n.down_until <= self.now {
                self.restart(id);
            }
        }
        if self.now % SUBSTEPS_PER_TICK == 0 {
            for &id in &ids {
                let skip = self.rng.gen_range(0..100) < 3;
                if let Some(raw) = self.nodes.get_mut(&id).and_then(|n| n.raw.as_mut()) {
                    if !skip {
                        raw.tick();
                    }
                }
            }
        }
        for &id in &ids {
            let Some(n) = self.nodes.get(&id) else {
                continue;
            };
            let Some(raw) = &n.raw else { continue };
            if n.pending.is_some() {
                if self.rng.gen_range(0..100) < persist_pct {
                    self.persist(id);
                }
            } else if raw.has_ready() {
                self.take_ready(id);
                if self.rng.gen_range(0..100) < persist_pct / 2 {
                    self.persist(id);
                }
            }
        }
        self.deliver();
        self.check();
    }

    fn chaos_events(&mut self) {
        let live = self.live_ids();
        if live.is_empty() {
            return;
        }
        let pick = |rng: &mut StdRng, v: &[u64]| v[rng.gen_range(0..v.len())];
        let roll: u32 = self.rng.gen_range(0..1000);
        let leader = self.leader();
        match roll {
            0..=199 => {
                let target = match leader {
                    Some(l) if self.rng.gen_bool(0.8) => l,
                    _ => pick(&mut self.rng, &live),
                };
                self.proposals += 1;
                let data = Bytes::from(format!("p{}", self.proposals));
                let raw = self
                    .nodes
                    .get_mut(&target)
                    .and_then(|n| n.raw.as_mut())
                    .expect("live");
                let _ = raw.propose(data);
            }
            200..=229 => {
                let target = pick(&mut self.rng, &live);
                self.reads += 1;
                let ctx = Bytes::from(format!("r{}", self.reads));
                let floor = self.max_commit();
                self.read_floors.insert(ctx.clone(), floor);
                let raw = self
                    .nodes
                    .get_mut(&target)
                    .and_then(|n| n.raw.as_mut())
                    .expect("live");
                let _ = raw.read_index(ctx);
            }
            230..=235 => {
                let target = pick(&mut self.rng, &live);
                self.crash(target);
            }
            236..=247 => self.change_partition(),
            248..=251 => self.conf_change(leader),
            252..=253 => {
                if let Some(l) = leader {
                    let voters = self.nodes[&l]
                        .raw
                        .as_ref()
                        .expect("live")
                        .status()
                        .conf_state
                        .voters;
                    let to = pick(&mut self.rng, &voters);
                    self.nodes
                        .get_mut(&l)
                        .and_then(|n| n.raw.as_mut())
                        .expect("live")
                        .transfer_leader(to);
                }
            }
            254..=269 => {
                let target = pick(&mut self.rng, &live);
                let node = self.nodes.get_mut(&target).expect("live");
                let applied = node.sm_applied;
                let raw = node.raw.as_mut().expect("live");
                if applied > raw.store().first_index() + 8 {
                    let data = Bytes::from(format!("sm@{applied}"));
                    let store = raw.store_mut();
                    store
                        .create_snapshot(applied, node.sm_conf.clone(), data)
                        .expect("applied is committed");
                    store.compact(applied).expect("within the snapshot");
                }
            }
            _ => {}
        }
    }

    fn change_partition(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.cut.clear();
        match self.rng.gen_range(0..4) {
            0 => {} // healed
            1 => {
                let a = ids[self.rng.gen_range(0..ids.len())];
                for &b in &ids {
                    if a != b {
                        self.cut.insert((a, b));
                        self.cut.insert((b, a));
                    }
                }
            }
            2 => {
                let group: BTreeSet<u64> = ids
                    .iter()
                    .copied()
                    .filter(|_| self.rng.gen_bool(0.5))
                    .collect();
                for &a in &ids {
                    for &b in &ids {
                        if group.contains(&a) != group.contains(&b) {
                            self.cut.insert((a, b));
                        }
                    }
                }
            }
            _ => {
                // Asymmetric: a few one-way links fail.
                for _ in 0..self.rng.gen_range(1..4) {
                    let a = ids[self.rng.gen_range(0..ids.len())];
                    let b = ids[self.rng.gen_range(0..ids.len())];
                    if a != b {
                        self.cut.insert((a, b));
                    }
                }
            }
        }
    }

    fn conf_change(&mut self, leader: Option<u64>) {
        let Some(l) = leader else { return };
        let conf = self.nodes[&l]
            .raw
            .as_ref()
            .expect("live")
            .status()
            .conf_state;
        let (change_type, node_id) = match self.rng.gen_range(0..3) {
            0 if self.next_id <= self.id_max => {
                let id = self.next_id;
                self.next_id += 1;
                self.add_node(id, MemStorage::new());
                (ConfChangeType::AddLearnerNode, id)
            }
            1 if !conf.learners.is_empty() => (
                ConfChangeType::AddNode,
                conf.learners[self.rng.gen_range(0..conf.learners.len())],
            ),
            2 if conf.voters.len() > 3 => (
                ConfChangeType::RemoveNode,
                conf.voters[self.rng.gen_range(0..conf.voters.len())],
            ),
            _ => return,
        };
        let cc = ConfChange {
            change_type,
            node_id,
            context: Bytes::new(),
        };
        let raw = self
            .nodes
            .get_mut(&l)
            .and_then(|n| n.raw.as_mut())
            .expect("live");
        let _ = raw.propose_conf_change(&cc);
    }

    fn run(mut self) -> Stats {
        for _ in 0..CHAOS_TICKS * SUBSTEPS_PER_TICK {
            self.chaos_events();
            self.substep(60);
        }
        // Heal everything, bring every member back, and demand progress.
        self.cut.clear();
        self.drop_pct = 0;
        self.dup_pct = 0;
        // A delay of at most one substep keeps every link FIFO (a healed TCP connection).
        self.delay_max = 1;
        for n in self.nodes.values_mut() {
            n.down_until = 0;
        }
        let mut proposed_at: Option<u64> = None;
        let mut final_n = 0u64;
        for tick in 0..LIVENESS_TICKS_MAX {
            for _ in 0..SUBSTEPS_PER_TICK {
                self.substep(100);
            }
            let Some(l) = self.leader() else { continue };
            let applied_final = self.nodes[&l].raw.as_ref().is_some_and(|_| {
                let lo = self.applied.range(..).rev().take(64);
                lo.into_iter()
                    .any(|(_, (_, d))| d.starts_with(format!("final{}-", self.seed).as_bytes()))
            });
            if applied_final && self.all_voters_caught_up(l) {
                return self.stats;
            }
            if proposed_at.is_none_or(|t| tick >= t + 20) {
                final_n += 1;
                let data = Bytes::from(format!("final{}-{final_n}", self.seed));
                let raw = self
                    .nodes
                    .get_mut(&l)
                    .and_then(|n| n.raw.as_mut())
                    .expect("live leader");
                if raw.propose(data).is_ok() {
                    proposed_at = Some(tick);
                }
            }
        }
        let states: Vec<String> = self
            .nodes
            .iter()
            .map(|(id, n)| match &n.raw {
                Some(r) => format!(
                    "{id}: {:?} first={} progress={:?}",
                    r.status(),
                    r.raft().raft_log.first_index(),
                    (1..=self.id_max)
                        .filter_map(|p| r.raft().progress(p).map(|pr| (
                            p,
                            pr.state,
                            pr.matched,
                            pr.next_idx,
                            pr.probe_sent,
                            pr.pending_snapshot,
                            pr.inflights.count()
                        )))
                        .collect::<Vec<_>>()
                ),
                None => format!("{id}: down (removed={})", n.removed),
            })
            .collect();
        self.fail(format!(
            "no commit within {LIVENESS_TICKS_MAX} ticks after healing:\n{}",
            states.join("\n")
        ));
    }

    fn all_voters_caught_up(&self, leader: u64) -> bool {
        let raw = self.nodes[&leader].raw.as_ref().expect("live leader");
        let commit = raw.raft().raft_log.committed;
        raw.status()
            .conf_state
            .voters
            .iter()
            .all(|v| self.nodes.get(v).is_some_and(|n| n.sm_applied >= commit))
    }
}

fn run_seeds(members: u64, salt: u64) {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => {
            let n = std::env::var("SEEDS")
                .map_or(DEFAULT_SEEDS, |s| s.parse().expect("SEEDS is a number"));
            (0..n).map(|i| i * 2 + salt).collect()
        }
    };
    let start = std::time::Instant::now();
    let mut total = Stats::default();
    for seed in &seeds {
        let seed = *seed;
        match std::panic::catch_unwind(|| Sim::new(seed, members).run()) {
            Ok(stats) => total.add(&stats),
            Err(e) => {
                eprintln!("sim failed: members={members} seed={seed}; replay: SEED={seed} cargo test -p keel-raft --test sim");
                std::panic::resume_unwind(e);
            }
        }
    }
    eprintln!(
        "sim: {} seeds of {members} members in {:?}: {total:?}",
        seeds.len(),
        start.elapsed()
    );
    // A simulator that stopped exercising the protocol would pass vacuously.
    let n = seeds.len() as u64;
    assert!(total.committed >= 20 * n, "too few commits: {total:?}");
    assert!(total.leaders >= n, "too few elections: {total:?}");
    if n >= 100 {
        assert!(
            total.snapshots_installed > 0 && total.conf_changes > 0 && total.crashes > 0,
            "{total:?}"
        );
    }
    // About four in 100 seeds hand a report over after its term.
    if n >= 1000 {
        assert!(total.reports_after_their_term > 0, "{total:?}");
    }
}

#[test]
fn three_members() {
    // Odd seeds run with 3 members, even with 5, so one SEED replays one cluster.
    if std::env::var("SEED").is_ok_and(|s| s.parse::<u64>().is_ok_and(|n| n % 2 == 0)) {
        return;
    }
    run_seeds(3, 1);
}

#[test]
fn five_members() {
    if std::env::var("SEED").is_ok_and(|s| s.parse::<u64>().is_ok_and(|n| n % 2 == 1)) {
        return;
    }
    run_seeds(5, 0);
}
