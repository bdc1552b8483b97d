//! keel-raft: Raft consensus as a pure, deterministic state machine.
//!
//! Bird's-eye view: [`RawNode`] wraps the core [`Raft`] and speaks the Ready protocol with the
//! server (see `node.rs` for the loop). Inputs are method calls (`tick`, `step`, `propose`,
//! `read_index`, `propose_conf_change`, `transfer_leader`, `campaign`); outputs come out of
//! `ready()` as entries and hard state to persist, messages to send before or after the persist,
//! committed entries to apply and read states to answer. [`Storage`] is the durable log
//! (`MemStorage` in memory, restored by the server from its WAL). Every wire and WAL type has
//! its own compact binary codec (`types.rs`).
//!
//! Features: elections with pre-vote and check-quorum, randomized election timeouts from a
//! seeded PRNG; replication with batching, pipelining and per-follower flow control (probe,
//! replicate, snapshot; an in-flight window in messages and bytes); fast conflict repair with a
//! reject hint; commit counting only current-term entries; batched ReadIndex; leader transfer;
//! snapshots with log compaction; one-at-a-time membership changes with learners; limits on
//! uncommitted bytes, in-flight messages, message size and pending reads.
//!
//! Architecture invariant: raft does no I/O, reads no clock, spawns no thread and never awaits;
//! time is `tick()`, randomness is a PRNG seeded from the `Config`.
//! Architecture invariant: the same inputs in the same order produce the same outputs.
//! Architecture invariant: raft depends on no other keel crate and never sees protobuf.
//! Architecture invariant: a member counts its own vote and its own log toward a quorum only
//! after the server reported them durable (`advance()`).
//! Architecture invariant: a message that vouches for durable state is only in
//! `Ready::persisted_messages`; committed entries handed out are always locally durable.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod log;
mod node;
mod raft;
mod storage;
mod tracker;
mod types;

pub use config::{CheckQuorum, Config, PreVote};
pub use error::{Error, Result};
pub use log::RaftLog;
pub use node::{Durability, RawNode, Ready, Status};
pub use raft::{Raft, ReadState, Role, SnapshotSent, SnapshotStatus, SoftState};
pub use storage::{MemStorage, RaftState, Storage};
pub use tracker::{Inflights, Progress, ProgressState};
pub use types::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, MessageType,
    Snapshot, SnapshotMetadata, DECODE_ENTRIES_MAX, ENTRY_OVERHEAD_BYTES,
};
