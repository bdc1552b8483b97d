//! The whole-cluster deterministic simulation: 3 and 5 production `Member`s (raft, keel-kv
//! with values in value-log segments, leases, membership, waiters, checkpoint scheduling:
//! everything but sockets and files) in
//! one thread, on simulated disks (keel-io's `SimStore` under the real WAL), a simulated
//! network and skewed clocks, under a seeded schedule of faults:
//! - crashes that lose unsynced data (torn WAL tails), power loss of every member at once;
//! - pauses longer than the election timeout (SIGSTOP), then resumption;
//! - symmetric and one-way partitions, half of them holding what is sent across them until
//!   they heal (a connection that drops packets but stays open); dropped, duplicated, delayed
//!   and reordered messages;
//! - EIO on WAL writes and on fdatasync, and on value-log segment writes (the member must
//!   stop, and restarts later; after a failed fdatasync its unsynced writes may be lost, as
//!   the kernel may drop them);
//! - value-log segments lost or torn by a crash while being written, and entries that wait
//!   for their values' pages (see world.rs);
//! - a bit flip in a sealed WAL segment (the member must refuse to start, naming the file
//!   and offset) and in the newest checkpoint (it must fall back to the older one);
//! - leadership transfers and compactions, with checkpoints and snapshot installs triggered
//!   by a small snapshot interval;
//! - membership changes as an operator makes them: a learner added (and its process started
//!   with the membership the answer lists), promoted, and voters removed (no operator stops
//!   them: a removed member stops by itself, on applying its removal or, when it missed that,
//!   when a peer it reaches tells it it was removed).
//!
//! Clients issue puts, deletes, compare-and-swap txns and linearizable reads, and every call
//! is recorded (half the prefix deletes go in a txn; half the compare-and-swap txns also
//! compare and read every key, walked in steps); lease clients grant leases and keep them alive through random members.
//! Checked at every step: election safety (one leader per term), state machine safety (every
//! member at the same revision after the same raft index), the watch guarantees on the events
//! every member publishes (ordered, each revision whole, none skipped, the same on every
//! member, prev_kv the key's previous version), and leases (never revoked before their TTL,
//! on the fastest clock, since the last answered keep-alive; a keep-alive sent after the
//! revoke never answered as alive).
//! Checked at the end, once faults heal: liveness (the cluster converges and a write
//! succeeds), no removed member still running, linearizability of the whole history (the porcupine checker of the cluster
//! tests), and HashKV equal on every member.
//!
//! `SEED=n cargo test -p keel-core --test sim` replays seed n (of every test in the binary);
//! `SEEDS=n` runs n seeds per test from `SEED_BASE` (0). A failure prints the command that
//! replays it and the last events of the run (`SIM_TRACE_EVENTS=n` keeps n); `SIM_DEBUG_WAL=1` adds, at every WAL append
//! and crash, how many records a restart would recover.

#[path = "../cluster/porcupine.rs"]
mod porcupine;

mod availability;
mod clients;
mod leases;
mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::Rng;

use clients::{Clients, KEYS};
use keel_core::shared::Query;
use keel_io::SimFaults;
use leases::LeaseClients;
use world::{member_id, Bug, Counts, World, WorldConfig};

/// How long faults are injected, in simulated milliseconds.
const CHAOS_MS: std::ops::Range<u64> = 1_500..4_000;
/// After healing, the cluster must converge within this.
const LIVENESS_MS: u64 = 8_000;
/// Once the cluster converged (the network healed), a member it no longer lists must have
/// stopped by itself within this: the notices its peers sent when they applied its removal
/// arrive once the partition heals, a restarted one is told at its handshakes, and one that
/// missed both is told when it next campaigns (within two election timeouts).
const REMOVED_STOPS_MS: u64 = 1_000;
const CLIENTS: usize = 6;
const LEASE_CLIENTS: usize = 2;

/// What one seed did, for the totals.
#[derive(Debug, Default, Clone, Copy)]
struct Report {
    counts: Counts,
    operations: u64,
    acknowledged_writes: u64,
    compactions: u64,
    leases_granted: u64,
    keepalives: u64,
    shard_renewals: u64,
    leases_expired: u64,
    watch_events_checked: u64,
    simulated_ms: u64,
}

/// A fault that ends at a set time.
enum Healing {
    Restart(usize),
    Unblock { from: usize, to: usize },
    NetworkCalm,
    DiskCalm(usize),
}

fn run_seed(members: usize, seed: u64, bug: Bug) -> Result<Report, String> {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed ^ 0x5eed);
    let snapshot_count = rng.gen_range(20..200);
    let mut world = World::new(WorldConfig::new(members, snapshot_count, bug), seed);
    let mut clients = Clients::new(CLIENTS);
    let mut lease_clients = LeaseClients::new(LEASE_CLIENTS);
    let chaos_ms = rng.gen_range(CHAOS_MS);
    let mut healings: Vec<(u64, Healing)> = Vec::new();
    // A fault starts on average every `fault_every_ms`.
    let fault_every_ms = rng.gen_range(50..400u64);

    while world.now_ms < chaos_ms {
        world.step_ms();
        clients.step(&mut world, true);
        lease_clients.step(&mut world, true);
        let now = world.now_ms;
        healings.retain(|(at, healing)| {
            if *at > now {
                return true;
            }
            heal(&mut world, healing);
            false
        });
        if world.rng.gen_range(0..fault_every_ms) == 0 {
            inject(&mut world, &mut healings);
        }
    }

    // Heal everything, then the cluster must converge and serve again.
    let healed_at = world.now_ms;
    world.heal_network();
    for i in 0..world.nodes.len() {
        world.set_disk_faults(i, SimFaults::default());
        world.nodes[i].paused_until_ms = 0;
        if !world.is_up(i) && !world.nodes[i].removed {
            restart(&mut world, i);
        }
    }
    let acknowledged_before = clients.acknowledged_writes;
    loop {
        world.step_ms();
        clients.step(&mut world, true);
        lease_clients.step(&mut world, true);
        if world.converged() && clients.acknowledged_writes > acknowledged_before + 5 {
            break;
        }
        if world.now_ms > healed_at + LIVENESS_MS {
            return Err(format!(
                "liveness: {} ms after every fault healed the cluster has not converged \
                 (applied: {:?}, leader: {:?}, writes acknowledged since: {})",
                LIVENESS_MS,
                world
                    .nodes
                    .iter()
                    .map(|n| n.run.as_ref().map(|r| r.member.applied_index()))
                    .collect::<Vec<_>>(),
                world.leader(),
                clients.acknowledged_writes - acknowledged_before,
            ) + "\n"
                + &world.trace());
        }
    }
    // A member removed while it could not hear of it must not linger (campaigning, or serving
    // its clients stale data): it stops once a peer tells it.
    let converged_at = world.now_ms;
    loop {
        let lingering = world.lingering_removed();
        if lingering.is_empty() {
            break;
        }
        if world.now_ms > converged_at + REMOVED_STOPS_MS {
            return Err(format!(
                "removed members {lingering:?} still run {REMOVED_STOPS_MS} ms after the \
                 cluster converged (every fault healed at {healed_at} ms)"
            ) + "\n"
                + &world.trace());
        }
        world.step_ms();
        clients.step(&mut world, true);
        lease_clients.step(&mut world, true);
    }
    // Let the calls in flight finish, then read every key through every member.
    let drained_by = world.now_ms + 4 * world::REQUEST_TIMEOUT_MS;
    while clients.busy() && world.now_ms < drained_by {
        world.step_ms();
        clients.step(&mut world, false);
        lease_clients.step(&mut world, false);
    }
    let current: Vec<usize> = (0..world.nodes.len())
        .filter(|&i| !world.nodes[i].removed)
        .collect();
    for member in current {
        for key in 0..KEYS {
            clients.final_read(&mut world, member, key);
        }
    }
    while !world.converged() && world.now_ms < drained_by + LIVENESS_MS {
        world.step_ms();
    }
    world.check_hashes();

    match porcupine::check(&clients.history) {
        porcupine::CheckResult::Ok => {}
        porcupine::CheckResult::Illegal { key, operations } => {
            return Err(format!(
                "linearizability: no linearization of the {operations} operations on {key}:\n{}",
                porcupine::describe(&clients.history, &key)
            ) + "\n"
                + &world.trace());
        }
        porcupine::CheckResult::Undecided { key, operations } => {
            return Err(format!(
                "linearizability undecided for the {operations} operations on {key}"
            ));
        }
    }
    Ok(Report {
        counts: world.counts,
        operations: clients.history.len() as u64,
        acknowledged_writes: clients.acknowledged_writes,
        compactions: clients.compactions,
        leases_granted: lease_clients.granted,
        keepalives: lease_clients.keepalives,
        shard_renewals: lease_clients.shard_renewals,
        leases_expired: lease_clients.expired,
        watch_events_checked: world.events_checked,
        simulated_ms: world.now_ms,
    })
}

fn restart(world: &mut World, i: usize) {
    match world.start(i) {
        Ok(()) => {
            world.counts.restarts += 1;
            world.note(|| format!("m{i} restarted"));
        }
        Err(why) => panic!("m{i} cannot restart: {why}\n{}", world.trace()),
    }
}

fn heal(world: &mut World, healing: &Healing) {
    match *healing {
        Healing::Restart(i) => {
            if !world.is_up(i) && !world.nodes[i].removed {
                world.set_disk_faults(i, SimFaults::default());
                restart(world, i);
            }
        }
        Healing::Unblock { from, to } => {
            world.blocked[from][to] = false;
            world.holding[from][to] = false;
        }
        Healing::NetworkCalm => {
            world.drop_per_million = 0;
            world.dup_per_million = 0;
            world.delay_ms_max = 2;
        }
        Healing::DiskCalm(i) => world.set_disk_faults(i, SimFaults::default()),
    }
}

fn inject(world: &mut World, healings: &mut Vec<(u64, Healing)>) {
    let n = world.nodes.len();
    let now = world.now_ms;
    let i = world.rng.gen_range(0..n);
    match world.rng.gen_range(0..100) {
        0..=24 => {
            // Often a member in the middle of an entry applied in steps, when there is one.
            let stepping = (0..n).find(|&j| {
                world.nodes[j]
                    .run
                    .as_ref()
                    .is_some_and(|run| run.member.applying_in_steps())
            });
            let i = stepping.filter(|_| world.rng.gen_bool(0.5)).unwrap_or(i);
            if world.is_up(i) {
                world.crash(i);
                let down_ms = world.rng.gen_range(10..1_500);
                healings.push((now + down_ms, Healing::Restart(i)));
            }
        }
        25..=27 => {
            // Power loss: every member at once.
            for j in 0..n {
                if world.is_up(j) {
                    world.crash(j);
                }
                let down_ms = world.rng.gen_range(10..500);
                healings.push((now + down_ms, Healing::Restart(j)));
            }
        }
        28..=44 => {
            if world.is_serving(i) {
                let pause_ms = world.rng.gen_range(50..2_500);
                world.nodes[i].paused_until_ms = now + pause_ms;
                world.counts.pauses += 1;
                world.note(|| format!("m{i} paused for {pause_ms} ms"));
            }
        }
        45..=64 => {
            // Isolate one member, both ways or one way.
            let one_way = world.rng.gen_bool(0.3);
            let heal_ms = now + world.rng.gen_range(50..2_000);
            // Half the partitions drop packets on connections that stay open: what is sent
            // meanwhile arrives at once when they heal (see `World::holding`).
            let holds = world.rng.gen_bool(0.5);
            for j in (0..n).filter(|&j| j != i) {
                world.blocked[i][j] = true;
                world.holding[i][j] = holds;
                healings.push((heal_ms, Healing::Unblock { from: i, to: j }));
                if !one_way {
                    world.blocked[j][i] = true;
                    world.holding[j][i] = holds;
                    healings.push((heal_ms, Healing::Unblock { from: j, to: i }));
                }
            }
            world.counts.partitions += 1;
            world.note(|| format!("m{i} partitioned (one way: {one_way}, held: {holds})"));
        }
        65..=74 => {
            world.drop_per_million = world.rng.gen_range(0..300_000);
            world.dup_per_million = world.rng.gen_range(0..100_000);
            world.delay_ms_max = world.rng.gen_range(2..60);
            let calm_at = now + world.rng.gen_range(100..1_500);
            healings.push((calm_at, Healing::NetworkCalm));
            world.note(|| "network degraded".to_string());
        }
        75..=79 => {
            if world.is_up(i) {
                // Writes or fdatasyncs fail for a moment: the member must stop either way.
                let faults = if world.rng.gen_bool(0.5) {
                    SimFaults {
                        write_eio_per_million: 300_000,
                        ..SimFaults::default()
                    }
                } else {
                    SimFaults {
                        fsync_eio_per_million: 300_000,
                        ..SimFaults::default()
                    }
                };
                world.set_disk_faults(i, faults);
                healings.push((now + 30, Healing::DiskCalm(i)));
                healings.push((now + world.rng.gen_range(100..1_000), Healing::Restart(i)));
                world.note(|| format!("m{i}'s disk fails: {faults:?}"));
            }
        }
        80..=84 => flip_sealed_wal_bit(world, i),
        85..=89 => flip_checkpoint_bit(world, i),
        90..=94 => world.change_membership(),
        _ => {
            // Leadership transfer to a random voter.
            if let Some(leader) = world.leader() {
                let to = member_id(world.rng.gen_range(0..n));
                let (tx, _rx) = futures_channel::oneshot::channel();
                world.nodes[leader]
                    .queries
                    .push(Query::TransferLeader { to, reply: tx });
                world.note(|| format!("transfer leadership from m{leader} to {to:x}"));
            }
        }
    }
}

/// While member `i` is down, a bit of a sealed WAL segment rots: the restart must refuse,
/// naming the segment and the offset. The sim then repairs the byte (an operator restoring
/// the member) and the member starts.
fn flip_sealed_wal_bit(world: &mut World, i: usize) {
    if world.is_up(i) || world.nodes[i].removed {
        return;
    }
    // Sealed: every segment before the active one, which is the last holding data (a prepared
    // spare after it is all zeros). A flip in the active segment's tail looks exactly like a
    // torn write, which recovery cuts by design, so only sealed segments rot here.
    let disk = &world.nodes[i].disk;
    let with_data: Vec<u64> = disk
        .segment_seqs()
        .into_iter()
        .filter(|&seq| disk.durable_bytes(seq).iter().any(|b| *b != 0))
        .collect();
    if with_data.len() < 2 {
        return;
    }
    let seq = with_data[world.rng.gen_range(0..with_data.len() - 1)];
    let offset = world.rng.gen_range(0..4096);
    world.nodes[i].disk.corrupt_byte(seq, offset);
    let refused = world.start(i);
    match refused {
        Err(why) => {
            assert!(
                why.contains("corrupt") && why.contains(&format!("{seq:016x}")),
                "m{i} refused a rotten segment without naming it: {why}"
            );
            world.counts.corrupt_refusals += 1;
            world.note(|| format!("m{i} refused to start: {why}"));
        }
        Ok(()) => panic!(
            "m{i} started although sealed segment {seq:016x} rotted at offset {offset}\n{}",
            world.trace()
        ),
    }
    world.nodes[i].disk.corrupt_byte(seq, offset);
}

/// While member `i` is down, its newest checkpoint rots. The restart either skips it and
/// recovers from the older one plus the WAL kept behind it, or, when the WAL needs the rotten
/// one (the WAL was released behind it: a leader's snapshot, say), refuses to start and says
/// why. The sim
/// then restores the file (an operator's repair) and leaves the member down.
fn flip_checkpoint_bit(world: &mut World, i: usize) {
    if world.is_up(i) || world.nodes[i].removed {
        return;
    }
    let Some((&index, bytes)) = world.nodes[i].checkpoints.iter().next_back() else {
        return;
    };
    let original = bytes.clone();
    let mut damaged = bytes.to_vec();
    let at = world.rng.gen_range(0..damaged.len());
    damaged[at] ^= 0x20;
    world.nodes[i].checkpoints.insert(index, damaged.into());
    world.note(|| format!("m{i}'s checkpoint {index} rotted at byte {at}"));
    // Only the checkpoint rotted: an EIO fault left armed by an earlier stop is cleared, as
    // `heal` clears it before any restart, or that EIO (not the rot) would refuse the start.
    world.set_disk_faults(i, SimFaults::default());
    match world.start(i) {
        Ok(()) => world.crash(i),
        Err(why) => {
            assert!(
                why.contains("checkpoint file is missing or damaged"),
                "m{i} refused to start without naming the damaged checkpoint: {why}\n{}",
                world.trace()
            );
            world.counts.corrupt_refusals += 1;
            world.note(|| format!("m{i} refused to start: {why}"));
            world.nodes[i].checkpoints.insert(index, original);
        }
    }
}

impl Clients {
    /// A linearizable read of `key` through `member`, waited for.
    fn final_read(&mut self, world: &mut World, member: usize, key: usize) {
        self.read_through(world, member, key);
        let deadline = world.now_ms + 3 * world::REQUEST_TIMEOUT_MS;
        while self.busy() && world.now_ms < deadline {
            world.step_ms();
            self.step(world, false);
        }
    }
}

fn seeds_from_env(default: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("SEED") {
        return vec![seed.parse().expect("SEED is a number")];
    }
    let count = std::env::var("SEEDS")
        .ok()
        .map(|s| s.parse().expect("SEEDS is a number"))
        .unwrap_or(default);
    let base = std::env::var("SEED_BASE")
        .ok()
        .map(|s| s.parse().expect("SEED_BASE is a number"))
        .unwrap_or(0);
    (base..base + count).collect()
}

/// Runs `seeds`; panics on the first failure with the command that replays it.
fn run_seeds(test: &str, members: usize, seeds: &[u64]) {
    let mut total = Report::default();
    let started = std::time::Instant::now();
    for &seed in seeds {
        let outcome = catch_unwind(AssertUnwindSafe(|| run_seed(members, seed, Bug::None)));
        let report = match outcome {
            Ok(Ok(report)) => report,
            Ok(Err(why)) => panic!(
                "seed {seed} failed: {why}\nreplay: SEED={seed} cargo test -p keel-core --test sim {test}"
            ),
            Err(panic) => {
                eprintln!("seed {seed} panicked; replay: SEED={seed} cargo test -p keel-core --test sim {test}");
                std::panic::resume_unwind(panic)
            }
        };
        add(&mut total, &report);
    }
    eprintln!(
        "{test}: {} seeds of {members} members in {:.1} s: {total:?}",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    // The simulation exercises incremental checkpoints: restarts and snapshot installs of
    // deltas, not only full ones.
    if seeds.len() >= 100 {
        assert!(
            total.counts.deltas > 0
                && total.counts.delta_snapshots_placed > 0
                && total.counts.delta_restarts > 0,
            "no delta checkpoint was written, or none reached a follower: {:?}",
            total.counts
        );
        assert!(
            total.shard_renewals > 0,
            "no keep-alive was renewed on a shard"
        );
        // Prefix deletes span fillers, so entries are applied over several loop turns, and
        // members crash in the middle of one.
        assert!(
            total.counts.apply_step_turns > 0 && total.counts.crashes_mid_apply > 0,
            "no entry was applied in steps, or no member crashed during one: {:?}",
            total.counts
        );
        // Values live in value-log segments: written, torn by crashes, deleted once dead,
        // restored from at starts and streamed with snapshots.
        let c = &total.counts;
        assert!(
            c.segments_durable > 0
                && c.segments_torn > 0
                && c.segment_eio_stops > 0
                && c.segments_deleted > 0
                && c.restores_from_segments > 0
                && c.snapshots_with_segments > 0
                && c.snapshots_placed_as_sent > 0
                && c.snapshots_placed_shifted > 0,
            "a value-log path went unexercised: {c:?}"
        );
        // Value compares wait for the pager on a seeded share of members, and members crash
        // while one waits.
        assert!(
            c.pages_waits > 0 && c.crashes_mid_pages_wait > 0,
            "no entry waited for its values' pages, or no member crashed during a wait: {c:?}"
        );
        // Half the partitions hold what is sent across them and deliver it at the heal.
        assert!(
            c.raft_held_then_delivered > 0,
            "no partition held raft messages until it healed: {c:?}"
        );
        // Snapshot reports come back late, some after their term ended: about one per 100
        // seeds, so only a run of thousands is sure to have one.
        assert!(
            c.snapshot_reports_held > 0,
            "no snapshot report was held back: {c:?}"
        );
        if seeds.len() >= 2000 {
            assert!(
                c.snapshot_reports_after_their_term > 0,
                "no snapshot report came back after its term: {c:?}"
            );
        }
    }
}

fn add(total: &mut Report, r: &Report) {
    let (t, c) = (&mut total.counts, &r.counts);
    t.crashes += c.crashes;
    t.restarts += c.restarts;
    t.pauses += c.pauses;
    t.partitions += c.partitions;
    t.eio_stops += c.eio_stops;
    t.corrupt_refusals += c.corrupt_refusals;
    t.elections += c.elections;
    t.checkpoints += c.checkpoints;
    t.deltas += c.deltas;
    t.delta_snapshots_placed += c.delta_snapshots_placed;
    t.snapshots_placed_as_sent += c.snapshots_placed_as_sent;
    t.snapshots_placed_shifted += c.snapshots_placed_shifted;
    t.delta_restarts += c.delta_restarts;
    t.checkpoints_overtaken += c.checkpoints_overtaken;
    t.checkpoints_cut_short += c.checkpoints_cut_short;
    t.snapshots_sent += c.snapshots_sent;
    t.messages += c.messages;
    t.dropped += c.dropped;
    t.members_added += c.members_added;
    t.members_removed += c.members_removed;
    t.removed_told_by_peer += c.removed_told_by_peer;
    t.removed_applied_own += c.removed_applied_own;
    t.promotions += c.promotions;
    t.apply_step_turns += c.apply_step_turns;
    t.crashes_mid_apply += c.crashes_mid_apply;
    t.segments_durable += c.segments_durable;
    t.segments_torn += c.segments_torn;
    t.segment_eio_stops += c.segment_eio_stops;
    t.segments_deleted += c.segments_deleted;
    t.restores_from_segments += c.restores_from_segments;
    t.snapshots_with_segments += c.snapshots_with_segments;
    t.pages_waits += c.pages_waits;
    t.crashes_mid_pages_wait += c.crashes_mid_pages_wait;
    t.raft_held_then_delivered += c.raft_held_then_delivered;
    t.snapshot_reports_held += c.snapshot_reports_held;
    t.snapshot_reports_after_their_term += c.snapshot_reports_after_their_term;
    total.operations += r.operations;
    total.acknowledged_writes += r.acknowledged_writes;
    total.compactions += r.compactions;
    total.leases_granted += r.leases_granted;
    total.keepalives += r.keepalives;
    total.shard_renewals += r.shard_renewals;
    total.leases_expired += r.leases_expired;
    total.watch_events_checked += r.watch_events_checked;
    total.simulated_ms += r.simulated_ms;
}

/// Whether a deliberately broken driver is caught within `seeds`: returns the first seed that
/// fails.
fn first_failing_seed(members: usize, bug: Bug, seeds: std::ops::Range<u64>) -> Option<u64> {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let found = seeds.clone().find(|&seed| {
        !matches!(
            catch_unwind(AssertUnwindSafe(|| run_seed(members, seed, bug))),
            Ok(Ok(_))
        )
    });
    std::panic::set_hook(quiet);
    found
}

#[test]
fn three_members() {
    run_seeds("three_members", 3, &seeds_from_env(3000));
}

#[test]
fn five_members() {
    run_seeds("five_members", 5, &seeds_from_env(2000));
}

/// The checks can fail: acknowledging a write before its WAL append is durable loses it in a
/// power loss, and the simulation notices.
#[test]
fn the_checks_catch_acknowledging_before_the_wal_is_durable() {
    let seed = first_failing_seed(3, Bug::AckBeforePersist, 0..200);
    eprintln!("ack-before-persist: first caught by seed {seed:?}");
    assert!(seed.is_some(), "200 seeds never caught ack-before-persist");
}

/// The checks can fail: votes and append responses sent before they are durable let a
/// restarted member vote twice or forget what it vouched for.
#[test]
fn the_checks_catch_vouching_before_the_wal_is_durable() {
    let seed = first_failing_seed(3, Bug::SendBeforePersist, 0..200);
    eprintln!("send-before-persist: first caught by seed {seed:?}");
    assert!(seed.is_some(), "200 seeds never caught send-before-persist");
}

/// The checks can fail: shards that renew leases whatever the member's window says (a
/// deposed or cut-off leader's among them) keep leases alive that the cluster revoked.
#[test]
fn the_checks_catch_shards_renewing_leases_without_the_window() {
    let seed = first_failing_seed(3, Bug::ShardRenewsAnywhere, 0..200);
    eprintln!("shard renews anywhere: first caught by seed {seed:?}");
    assert!(
        seed.is_some(),
        "200 seeds never caught shards renewing anywhere"
    );
}

/// The checks can fail: a member that answers linearizable reads from its own store serves
/// stale reads while partitioned away from the leader.
#[test]
fn the_checks_catch_stale_linearizable_reads() {
    let seed = first_failing_seed(3, Bug::LocalLinearizableReads, 0..200);
    eprintln!("local linearizable reads: first caught by seed {seed:?}");
    assert!(
        seed.is_some(),
        "200 seeds never caught local linearizable reads"
    );
}

/// A voter removed while partitioned away (it never sees its removal commit) stops by itself
/// once the partition heals and its peers reach it: etcd's peers answer it 410 Gone, Keel's
/// send the removed notice. Returns when it stopped after the heal, in simulated ms.
fn removed_while_partitioned_stops_after_ms(seed: u64, bug: Bug) -> Result<u64, String> {
    let mut world = World::new(WorldConfig::new(5, 10_000, bug), seed);
    let deadline = |world: &World, ms: u64| world.now_ms + ms;
    let until = deadline(&world, 3_000);
    while world.leader().is_none() && world.now_ms < until {
        world.step_ms();
    }
    let leader = world.leader().ok_or("no leader elected")?;
    let victim = (0..5).find(|&i| i != leader).expect("a follower");
    for j in (0..5).filter(|&j| j != victim) {
        world.blocked[victim][j] = true;
        world.blocked[j][victim] = true;
    }
    let (tx, mut rx) = futures_channel::oneshot::channel();
    world.nodes[leader].queries.push(Query::Member {
        change: keel_core::shared::MemberChange::Remove {
            id: member_id(victim),
        },
        reply: tx,
    });
    let until = deadline(&world, 3_000);
    loop {
        world.step_ms();
        match rx.try_recv() {
            Ok(Some(Ok(_))) => break,
            Ok(Some(Err(e))) => return Err(format!("the removal was refused: {e:?}")),
            Ok(None) | Err(_) if world.now_ms < until => {}
            _ => return Err("the removal was not applied".into()),
        }
    }
    // Partitioned for several election timeouts: it campaigns, unheard.
    let until = deadline(&world, 1_000);
    while world.now_ms < until {
        world.step_ms();
    }
    if !world.is_up(victim) {
        return Err(format!("m{victim} stopped while it could hear no one"));
    }
    world.heal_network();
    let healed_at = world.now_ms;
    while world.is_up(victim) {
        if world.now_ms > healed_at + REMOVED_STOPS_MS {
            return Err(format!(
                "m{victim} still runs {REMOVED_STOPS_MS} ms after the heal\n{}",
                world.trace()
            ));
        }
        world.step_ms();
    }
    let why = world.nodes[victim].why_down.clone().unwrap_or_default();
    if !why.contains("removed") || world.counts.removed_told_by_peer != 1 {
        return Err(format!(
            "m{victim} stopped, but not told it was removed: {why}"
        ));
    }
    // The rest go on without it.
    let until = deadline(&world, 2_000);
    while !world.converged() {
        if world.now_ms > until {
            return Err("the four remaining members did not converge".into());
        }
        world.step_ms();
    }
    Ok(world.now_ms - healed_at)
}

#[test]
fn a_member_removed_while_partitioned_stops_when_a_peer_tells_it() {
    let seeds = seeds_from_env(50);
    let mut stopped_after: Vec<u64> = seeds
        .iter()
        .map(|&seed| {
            removed_while_partitioned_stops_after_ms(seed, Bug::None)
                .unwrap_or_else(|why| panic!("seed {seed}: {why}"))
        })
        .collect();
    stopped_after.sort_unstable();
    eprintln!(
        "a removed member stopped after the heal: median {} ms, worst {} ms",
        stopped_after[stopped_after.len() / 2],
        stopped_after[stopped_after.len() - 1]
    );
}

/// The checks can fail: a peer transport that never tells a removed member so leaves it
/// running after the heal, and both the scenario and the seeded runs notice.
#[test]
fn the_checks_catch_a_removed_member_that_lingers() {
    // Caught because it lingered, not because the removal never happened.
    let outcome = removed_while_partitioned_stops_after_ms(0, Bug::NoRemovedNotice);
    assert!(
        matches!(&outcome, Err(why) if !why.starts_with("the removal was")),
        "a removed member that was never told it was removed went unnoticed: {outcome:?}"
    );
    let seed = first_failing_seed(5, Bug::NoRemovedNotice, 0..200);
    eprintln!("no removed notice: first caught by seed {seed:?}");
    assert!(
        seed.is_some(),
        "200 seeds never caught a lingering removed member"
    );
}

#[test]
fn availability_after_single_member_faults() {
    use availability::*;
    let seeds = seeds_from_env(200);
    let gaps = seeds.iter().map(|&s| leader_kill_gap_ms(3, s)).collect();
    let (median_gap, worst_gap) = describe("writes resume after the leader is killed", gaps);
    // Five members: three or four survivors may split the vote three ways.
    let gaps: Vec<u64> = seeds
        .iter()
        .map(|&s| {
            let gap = leader_kill_gap_ms(5, s);
            if gap > 2 * ELECTION_TIMEOUT_MS {
                eprintln!("seed {s}: writes resumed {gap} ms after the leader of five was killed");
            }
            gap
        })
        .collect();
    let over_two_timeouts_5 = gaps
        .iter()
        .filter(|&&gap| gap > 2 * ELECTION_TIMEOUT_MS)
        .count();
    let (median_gap_5, worst_gap_5) =
        describe("writes resume after the leader of five is killed", gaps);
    let moved_by_restart = seeds
        .iter()
        .filter(|&&s| follower_restart_moves_leader(s, 500))
        .count();
    eprintln!(
        "a follower restart moved leadership in {moved_by_restart} of {} runs",
        seeds.len()
    );
    let moved_by_old_leader = seeds
        .iter()
        .filter(|&&s| restarted_leader_moves_leader(s))
        .count();
    eprintln!(
        "a killed leader's restart moved leadership in {moved_by_old_leader} of {} runs",
        seeds.len()
    );
    let serve = seeds
        .iter()
        .map(|&s| paused_leader_serves_after_ms(s, 3 * ELECTION_TIMEOUT_MS))
        .collect();
    let (_, worst_resume) = describe("a resumed leader serves again", serve);
    let moved_by_starving = seeds
        .iter()
        .filter(|&&s| starved_follower_moves_leader(s, 3 * ELECTION_TIMEOUT_MS / 2))
        .count();
    eprintln!(
        "a starved follower moved leadership in {moved_by_starving} of {} runs",
        seeds.len()
    );
    // Measured before answering calls sent to a dead leader at once: median 180 ms, p90
    // 1,015 ms, worst 1,051 ms (clients waited out the request timeout). Then, with etcd's
    // randomized timeout of [1, 2) timeouts and split votes left to the timeouts: median
    // 185 ms, worst 310 ms. Now detection takes at most one and a half timeouts and a split
    // vote one more tick: writes resume within two timeouts, as the issue asks.
    assert!(
        worst_gap <= 2 * ELECTION_TIMEOUT_MS,
        "writes resumed too late after a leader kill: median {median_gap} ms, worst {worst_gap} ms"
    );
    // Five members: before pre-votes were refused by members backing a candidate, 1 run in
    // 1,000 took longer than two timeouts (seed 916, 256 ms: see RELIABILITY.md).
    assert!(
        over_two_timeouts_5 == 0 && worst_gap_5 <= 2 * ELECTION_TIMEOUT_MS,
        "writes resumed too late after the leader of five was killed: median {median_gap_5} ms, worst {worst_gap_5} ms, {over_two_timeouts_5} runs past two timeouts"
    );
    assert_eq!(moved_by_restart, 0, "a follower's restart moved leadership");
    assert_eq!(
        moved_by_old_leader, 0,
        "a killed leader's restart moved leadership"
    );
    assert_eq!(moved_by_starving, 0, "a starved follower moved leadership");
    assert!(
        worst_resume <= 2 * ELECTION_TIMEOUT_MS,
        "a resumed leader took {worst_resume} ms to serve again"
    );
}
