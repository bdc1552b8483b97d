//! keel-core: the node. See ARCHITECTURE.md for the bird's-eye view.

pub mod alarms;
pub mod auth;
pub mod checkpoint;
pub mod compactor;
pub mod config;
pub mod convert;
pub mod corrupt;
pub mod error;
pub mod gateway;
pub mod http;
pub mod ids;
pub mod limits;
pub mod lock;
pub mod member;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod raftcore;
pub mod rt;
pub mod service;
pub mod shard;
pub mod shared;
pub mod tls;
pub mod watch;
