//! Availability under single-member faults, measured in simulated time on a calm network:
//! - a killed leader: how long until writes succeed again (goal: within two election
//!   timeouts, every time);
//! - a follower that restarts (its log replayed), or a killed leader that comes back after a
//!   new one took over: leadership must not move (pre-vote and check-quorum);
//! - a leader paused (SIGSTOP) past the election timeout, then resumed: how long until it
//!   serves linearizable reads again;
//! - a starved follower (its raft loop runs only every so often): leadership must not move.

use crate::clients::Clients;
use crate::world::{Bug, World, WorldConfig, ELECTION_TICKS, TICK_MS};

/// One election timeout in simulated milliseconds.
pub const ELECTION_TIMEOUT_MS: u64 = ELECTION_TICKS as u64 * TICK_MS;

fn settled(seed: u64) -> (World, Clients) {
    settled_with(3, seed)
}

fn settled_with(members: usize, seed: u64) -> (World, Clients) {
    let mut world = World::new(WorldConfig::new(members, 100, Bug::None), seed);
    let mut clients = Clients::new(6);
    while world.now_ms < 600 || world.leader().is_none() {
        world.step_ms();
        clients.step(&mut world, true);
        assert!(
            world.now_ms < 5_000,
            "seed {seed}: no leader on a calm network"
        );
    }
    (world, clients)
}

fn run_for(world: &mut World, clients: &mut Clients, ms: u64) {
    let until = world.now_ms + ms;
    while world.now_ms < until {
        world.step_ms();
        clients.step(world, true);
    }
}

fn leader_term(world: &World) -> Option<(usize, u64)> {
    let l = world.leader()?;
    Some((l, world.nodes[l].run.as_ref()?.member.raft_term()))
}

/// Kills the leader of `members` (restarting it 300 ms later); returns the ms until a write
/// is acknowledged again.
pub fn leader_kill_gap_ms(members: usize, seed: u64) -> u64 {
    let (mut world, mut clients) = settled_with(members, seed);
    let leader = world.leader().expect("settled");
    let killed_at = world.now_ms;
    world.crash(leader);
    loop {
        world.step_ms();
        clients.step(&mut world, true);
        if world.now_ms == killed_at + 300 {
            world.start(leader).expect("restarts");
        }
        if clients.last_write_ack_ms > killed_at {
            return clients.last_write_ack_ms - killed_at;
        }
        assert!(
            world.now_ms < killed_at + 10_000,
            "seed {seed}: writes never resumed"
        );
    }
}

/// Kills the leader, waits for a new one, restarts the old leader (its log replayed); returns
/// whether leadership moved again within two seconds of the restart (it must not: the
/// restarted member has an older log and pre-vote keeps it from disrupting).
pub fn restarted_leader_moves_leader(seed: u64) -> bool {
    let (mut world, mut clients) = settled(seed);
    let old = world.leader().expect("settled");
    world.crash(old);
    while leader_term(&world).is_none_or(|(l, _)| l == old) {
        world.step_ms();
        clients.step(&mut world, true);
        assert!(world.now_ms < 20_000, "seed {seed}: no new leader");
    }
    run_for(&mut world, &mut clients, 200);
    let before = leader_term(&world).expect("a new leader");
    world.start(old).expect("restarts");
    run_for(&mut world, &mut clients, 2_000);
    leader_term(&world) != Some(before)
}

/// Restarts a follower after `down_ms`; returns whether leadership moved within a second
/// after.
pub fn follower_restart_moves_leader(seed: u64, down_ms: u64) -> bool {
    let (mut world, mut clients) = settled(seed);
    let before = leader_term(&world).expect("settled");
    let follower = (before.0 + 1) % 3;
    world.crash(follower);
    run_for(&mut world, &mut clients, down_ms);
    world.start(follower).expect("restarts");
    run_for(&mut world, &mut clients, 1_000);
    leader_term(&world) != Some(before)
}

/// Pauses the leader for `pause_ms`; returns the ms from its resumption until it answers a
/// linearizable read again.
pub fn paused_leader_serves_after_ms(seed: u64, pause_ms: u64) -> u64 {
    let (mut world, mut clients) = settled(seed);
    let leader = world.leader().expect("settled");
    world.nodes[leader].paused_until_ms = world.now_ms + pause_ms;
    run_for(&mut world, &mut clients, pause_ms);
    let resumed_at = world.now_ms;
    loop {
        // Client 0 reads through the resumed member whenever it is idle (the others pick
        // members at random, and could leave it unasked for a quarter of a second).
        if clients.idle(0) {
            clients.read_through(&mut world, leader, 0);
        }
        world.step_ms();
        clients.step(&mut world, true);
        if clients.last_read_ms_by_member[leader] > resumed_at {
            return clients.last_read_ms_by_member[leader] - resumed_at;
        }
        assert!(
            world.now_ms < resumed_at + 10_000,
            "seed {seed}: never served again"
        );
    }
}

/// Starves a follower: it runs only one step in `every_ms` for two seconds. Returns whether
/// leadership moved.
pub fn starved_follower_moves_leader(seed: u64, every_ms: u64) -> bool {
    let (mut world, mut clients) = settled(seed);
    let before = leader_term(&world).expect("settled");
    let follower = (before.0 + 2) % 3;
    let until = world.now_ms + 2_000;
    while world.now_ms < until {
        // Paused except one millisecond in `every_ms`: its loop runs late and in bursts.
        world.nodes[follower].paused_until_ms = if world.now_ms % every_ms == 0 {
            0
        } else {
            u64::MAX
        };
        world.step_ms();
        clients.step(&mut world, true);
    }
    world.nodes[follower].paused_until_ms = 0;
    run_for(&mut world, &mut clients, 1_000);
    leader_term(&world) != Some(before)
}

fn percentile(sorted: &[u64], p: usize) -> u64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

pub fn describe(name: &str, mut samples: Vec<u64>) -> (u64, u64) {
    samples.sort_unstable();
    let (median, worst) = (percentile(&samples, 50), *samples.last().expect("samples"));
    eprintln!(
        "{name}: {} runs, median {median} ms, p90 {} ms, worst {worst} ms (election timeout {ELECTION_TIMEOUT_MS} ms)",
        samples.len(),
        percentile(&samples, 90)
    );
    (median, worst)
}
