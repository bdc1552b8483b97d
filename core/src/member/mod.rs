//! The member's logic as sans-I/O rooms: pieces of the raft core that take time and I/O results
//! as inputs and return decisions as data, so a simulation can drive them exactly as the glommio
//! raft core (`raftcore.rs`) does.
//!
//! - `waiters`: every kind of waiting call, with deadlines, in one type.
//! - `hint`: the keys a committed entry will look up, read from its bytes, for a prefetch.
//! - `lease_clock`: the leader's lease countdowns, on a clock passed in.
//! - `membership`: which membership changes are allowed and the member list each leaves.
//! - `recovery`: the WAL records a Ready becomes, and the replay that rebuilds the raft log.
//! - `machine`: `Member`, which owns raft, the MVCC writer and every room above, and speaks
//!   the Ready protocol with its driver (`raftcore.rs` in production).
//!
//! Architecture invariant: nothing under `member/` reads a clock, touches a file or socket, or
//! spawns a task. Time arrives as milliseconds on the member's monotonic clock (`now_ms`).

mod hint;
pub mod lease_clock;
pub mod machine;
pub mod membership;
pub mod recovery;
pub mod waiters;

pub use lease_clock::LeaseClock;
pub use machine::{
    CheckpointCompletion, CheckpointDone, CheckpointRequest, Effect, InstallHelpers, Member,
    MemberConfig, PagesWanted, PlacedSnapshot, ProposalKind, ReadyIo, Refusal, MEMBER_REMOVED,
};
pub use waiters::Waiters;
