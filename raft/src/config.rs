//! Node configuration.

use crate::error::{Error, Result};

/// Whether a node runs a pre-vote round before a real election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreVote {
    /// Ask "would you vote for me?" first; a partitioned node that rejoins cannot bump terms.
    Enabled,
    /// Campaign directly.
    Disabled,
}

/// Whether a leader steps down when it has not heard from a quorum for an election timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckQuorum {
    /// Step down when cut off from the quorum; followers also ignore votes while in a lease.
    Enabled,
    /// Never step down on silence.
    Disabled,
}

/// Configuration of one member.
#[derive(Debug, Clone)]
pub struct Config {
    /// This member's id (non-zero).
    pub id: u64,
    /// Ticks without hearing from a leader before campaigning (randomized in `[n, 1.5n)`; at
    /// Keel's smallest election timeout of 5 ticks that is 5 or 6).
    pub election_tick: usize,
    /// Ticks between leader heartbeats.
    pub heartbeat_tick: usize,
    /// Pre-vote round before elections.
    pub pre_vote: PreVote,
    /// Leader steps down when it loses contact with the quorum.
    pub check_quorum: CheckQuorum,
    /// Entries per append message, in bytes (at least one entry is always sent).
    pub max_size_per_msg_bytes: u64,
    /// Appends in flight per follower, in messages.
    pub max_inflight_msgs: usize,
    /// Appends in flight per follower, in bytes.
    pub max_inflight_bytes: u64,
    /// Proposed but uncommitted entry bytes on the leader; proposals beyond are dropped.
    pub max_uncommitted_entries_bytes: u64,
    /// Committed entries handed out in one Ready, in bytes (at least one).
    pub max_apply_bytes_per_ready: u64,
    /// Read-index requests waiting on the leader.
    pub max_pending_read_index: usize,
    /// Seed of the election-timeout PRNG (mixed with `id`, so members may share it).
    pub seed: u64,
    /// Index the application has already applied (on restart); nothing at or below it is
    /// handed out again. It may exceed the durable commit index (commit-only hard states are
    /// written without sync): only committed entries are ever applied, so it counts as committed.
    pub applied: u64,
}

impl Config {
    /// A configuration with the usual defaults (election 10 ticks, heartbeat 1 tick).
    pub fn new(id: u64) -> Config {
        Config {
            id,
            election_tick: 10,
            heartbeat_tick: 1,
            pre_vote: PreVote::Enabled,
            check_quorum: CheckQuorum::Enabled,
            max_size_per_msg_bytes: 1 << 20,
            max_inflight_msgs: 256,
            max_inflight_bytes: 64 << 20,
            max_uncommitted_entries_bytes: 128 << 20,
            max_apply_bytes_per_ready: 64 << 20,
            max_pending_read_index: 1 << 16,
            seed: 0,
            applied: 0,
        }
    }

    /// Checks the configuration's internal consistency.
    pub fn validate(&self) -> Result<()> {
        if self.id == 0 {
            return Err(Error::InvalidConfig("id must not be zero"));
        }
        if self.heartbeat_tick == 0 {
            return Err(Error::InvalidConfig("heartbeat_tick must be positive"));
        }
        if self.election_tick <= self.heartbeat_tick {
            return Err(Error::InvalidConfig(
                "election_tick must exceed heartbeat_tick",
            ));
        }
        if self.max_inflight_msgs == 0 || self.max_inflight_bytes == 0 {
            return Err(Error::InvalidConfig("in-flight limits must be positive"));
        }
        if self.max_uncommitted_entries_bytes == 0 || self.max_pending_read_index == 0 {
            return Err(Error::InvalidConfig("limits must be positive"));
        }
        Ok(())
    }
}
