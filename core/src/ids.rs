//! Member and cluster identity, and the file in the data directory that keeps it stable.
//!
//! Ids are derived exactly as etcd 3.4 derives them (etcdserver/api/membership), so the same
//! flags give the same ids as etcd, and every member of a new cluster computes the same ids
//! without talking:
//! - a member's id is the first 8 bytes (big-endian) of the SHA-1 of its sorted peer URLs
//!   concatenated, then the cluster token, then, for a member added at runtime, the decimal Unix
//!   second of the MemberAdd call (with an empty token, as etcd's MemberAdd passes). The time is
//!   why a member removed and added again gets a new id;
//! - the cluster's id is the same digest of the sorted member ids as 8-byte big-endian words.
//!
//! Once written, the identity file wins over flags: a restarted member keeps its ids even if its
//! URLs changed, and a member refuses to start in a data directory that belongs to another
//! cluster.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{Config, InitialMember};
use crate::error::CoreError;

const IDENTITY_FILE: &str = "member.json";

/// The first 8 bytes of the SHA-1 digest, big-endian, as etcd's `binary.BigEndian.Uint64(hash[:8])`.
fn sha1_u64(bytes: &[u8]) -> u64 {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// A member's id, as etcd's `membership.NewMember(name, peerURLs, clusterName, now)`: the sorted
/// peer URLs concatenated (no separator, as etcd), the cluster token, and for a member added at
/// runtime the Unix second it was added (`added_at_unix_s`); bootstrap members have none.
pub fn member_id(peer_urls: &[String], cluster_token: &str, added_at_unix_s: Option<u64>) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut bytes = urls.concat().into_bytes();
    bytes.extend_from_slice(cluster_token.as_bytes());
    if let Some(s) = added_at_unix_s {
        bytes.extend_from_slice(s.to_string().as_bytes());
    }
    sha1_u64(&bytes)
}

/// The id of a bootstrap member (`--initial-cluster`), as etcd's `NewClusterFromURLsMap`.
pub fn initial_member_id(member: &InitialMember, cluster_token: &str) -> u64 {
    member_id(&member.peer_urls, cluster_token, None)
}

/// The cluster's id: from the sorted member ids, as etcd's `RaftCluster.genID`.
pub fn cluster_id(member_ids: &[u64]) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_be_bytes()).collect();
    sha1_u64(&bytes)
}

/// One member as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    #[serde(default)]
    pub is_learner: bool,
}

/// What is written once into the data directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub member_id: u64,
    pub cluster_id: u64,
    pub name: String,
    pub cluster_token: String,
    /// The bootstrap membership (later changes travel through the raft log).
    pub members: Vec<Member>,
}

impl Identity {
    /// The identity a new member computes from its flags.
    pub fn from_config(cfg: &Config) -> Identity {
        let members: Vec<Member> = cfg
            .initial_cluster
            .iter()
            .map(|m| Member {
                id: initial_member_id(m, &cfg.initial_cluster_token),
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                // Client URLs are published through the log once the member runs (MemberAttributes),
                // so every member learns every member's, not only its own.
                client_urls: Vec::new(),
                is_learner: false,
            })
            .collect();
        let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
        let me = members
            .iter()
            .find(|m| m.name == cfg.name)
            .expect("config validation checked our name is listed");
        Identity {
            member_id: me.id,
            // A member joining an existing cluster cannot compute the cluster's id (it was made
            // from the founding members): it learns it from the first peer that contacts it.
            cluster_id: if cfg.initial_cluster_state == crate::config::ClusterState::Existing {
                0
            } else {
                cluster_id(&ids)
            },
            name: cfg.name.clone(),
            cluster_token: cfg.initial_cluster_token.clone(),
            members,
        }
    }

    /// Loads the identity of an existing data directory, or writes the one computed from the
    /// flags into a new one. A data directory of another cluster is refused.
    pub fn load_or_create(cfg: &Config) -> Result<(Identity, Bootstrap), CoreError> {
        let path = cfg.data_dir.join(IDENTITY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let stored: Identity = serde_json::from_slice(&bytes).map_err(|e| {
                    CoreError::Config(format!("{}: unreadable identity: {e}", path.display()))
                })?;
                if stored.name != cfg.name {
                    return Err(CoreError::Config(format!(
                        "data dir {} belongs to member {:?}, not {:?}",
                        cfg.data_dir.display(),
                        stored.name,
                        cfg.name
                    )));
                }
                Ok((stored, Bootstrap::Restart))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let fresh = match cfg.initial_cluster_state {
                    // MemberAdd made this member's id with the time in it: ask the cluster.
                    crate::config::ClusterState::Existing => {
                        let joined = crate::join::learn_identity(cfg)?;
                        Identity {
                            member_id: joined.member_id,
                            cluster_id: joined.cluster_id,
                            name: cfg.name.clone(),
                            cluster_token: cfg.initial_cluster_token.clone(),
                            members: joined.members,
                        }
                    }
                    crate::config::ClusterState::New => Identity::from_config(cfg),
                };
                write_durably(
                    &cfg.data_dir,
                    &path,
                    &serde_json::to_vec_pretty(&fresh).expect("identity serializes"),
                )?;
                Ok((fresh, Bootstrap::New))
            }
            Err(e) => Err(CoreError::DataDir { path, source: e }),
        }
    }
}

impl Identity {
    /// Records the cluster id a joining member learned from its peers.
    pub fn save(&self, data_dir: &Path) -> Result<(), CoreError> {
        let path = data_dir.join(IDENTITY_FILE);
        write_durably(
            data_dir,
            &path,
            &serde_json::to_vec_pretty(self).expect("identity serializes"),
        )
    }
}

/// Whether this start created the data directory's identity or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bootstrap {
    New,
    Restart,
}

/// Writes `bytes` to `path` through a temporary file, fsyncs it, renames it into place and
/// fsyncs the directory, so a crash leaves either the old file or the whole new one.
pub fn write_durably(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), CoreError> {
    write_durably_parts(dir, path, &[bytes])
}

/// As `write_durably`, for a file given as `parts` written one after the other.
pub fn write_durably_parts(dir: &Path, path: &Path, parts: &[&[u8]]) -> Result<(), CoreError> {
    let err = |source| CoreError::DataDir {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    // Paced, so a checkpoint of hundreds of MB never sits dirty in the page cache for the
    // WAL's next fdatasync to wait behind.
    keel_io::pages::write_paced(&mut f, parts).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, url: &str) -> InitialMember {
        InitialMember {
            name: name.into(),
            peer_urls: vec![url.into()],
        }
    }

    #[test]
    fn ids_depend_on_urls_and_token_only() {
        let a = initial_member_id(&member("a", "http://127.0.0.1:2380"), "t");
        assert_eq!(
            a,
            initial_member_id(&member("renamed", "http://127.0.0.1:2380"), "t")
        );
        assert_ne!(
            a,
            initial_member_id(&member("a", "http://127.0.0.1:2380"), "other-token")
        );
        assert_ne!(
            a,
            initial_member_id(&member("a", "http://127.0.0.1:2381"), "t")
        );
        assert_eq!(cluster_id(&[3, 1, 2]), cluster_id(&[1, 2, 3]));
        assert_ne!(cluster_id(&[1, 2]), cluster_id(&[1, 2, 3]));
    }

    /// etcd with no flags (member "default" at http://localhost:2380, token "etcd-cluster")
    /// reports member 8e9e05c52164694d in cluster cdf818194e3a8c32: every etcd user has seen
    /// these two numbers, and Keel with no flags must report the same.
    #[test]
    fn the_default_ids_are_etcds() {
        let id = initial_member_id(&member("default", "http://localhost:2380"), "etcd-cluster");
        assert_eq!(format!("{id:x}"), "8e9e05c52164694d");
        assert_eq!(format!("{:x}", cluster_id(&[id])), "cdf818194e3a8c32");
    }

    /// A member added at runtime mixes in the second of the call, so the same URLs added again
    /// later get another id, as in etcd.
    #[test]
    fn runtime_added_members_mix_in_the_time() {
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        let first = member_id(&urls, "", Some(1_700_000_000));
        assert_ne!(first, member_id(&urls, "", Some(1_700_000_001)));
        assert_ne!(first, member_id(&urls, "", None));
        assert_eq!(first, member_id(&urls, "", Some(1_700_000_000)));
    }
}
