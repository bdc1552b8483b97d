//! keel-core: the node. See ARCHITECTURE.md for the bird's-eye view.

pub mod config;
pub mod convert;
pub mod error;
pub mod ids;
pub mod raftcore;
pub mod rt;
pub mod shared;
pub mod http;
pub mod metrics;
pub mod service;
pub mod shard;
pub mod node;
pub mod watch;
pub mod lock;
