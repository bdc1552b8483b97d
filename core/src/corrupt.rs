//! Corruption checks, as etcd 3.4 makes them (etcdserver/corrupt.go): members compare their
//! HashKV at the same revision.
//!
//! - `--experimental-initial-corrupt-check`: before serving clients, a member asks every peer
//!   for its hash at this member's revision; a mismatch at an equal compact revision stops it
//!   from starting.
//! - `--experimental-corrupt-check-time`: the leader periodically hashes its store, asks every
//!   follower for its hash at the same revision, and raises the CORRUPT alarm through raft for
//!   each member that disagrees (which then refuses every write cluster-wide).
//!
//! The comparisons are pure functions (tested below); the tasks around them run on the raft
//! core's executor but hash stores on a thread of their own, so the raft loop never waits for a
//! hash of the whole store.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use keel_kv as kv;
use keel_proto::etcdserverpb as pb;

use crate::error::CoreError;
use crate::peer::{PeerHash, Transport};
use crate::rt;
use crate::shared::Shared;

/// A store's hash at a revision, with the compact revision it was taken under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalHash {
    pub hash: u32,
    pub revision: i64,
    pub compact_revision: i64,
}

/// The peers whose hash disagrees with ours at the same compact revision (etcd's
/// `CheckInitialHashKV`). Peers that could not hash our revision are only logged.
pub fn initial_mismatches(local: LocalHash, peers: &[(u64, PeerHash)]) -> Vec<u64> {
    let mut mismatched = Vec::new();
    for (id, peer) in peers {
        match *peer {
            PeerHash::Hashed {
                hash,
                compact_revision,
                ..
            } if hash != local.hash => {
                if compact_revision == local.compact_revision {
                    mismatched.push(*id);
                } else {
                    tracing::warn!(
                        peer = format!("{id:x}"),
                        local_compact_revision = local.compact_revision,
                        peer_compact_revision = compact_revision,
                        "cannot check the hash: the compact revisions differ"
                    );
                }
            }
            PeerHash::Hashed { .. } => {}
            PeerHash::FutureRevision => tracing::warn!(
                peer = format!("{id:x}"),
                "cannot fetch the hash of a slow peer"
            ),
            PeerHash::Compacted => tracing::warn!(
                peer = format!("{id:x}"),
                "cannot fetch a peer's hash: this member is behind its compaction"
            ),
            PeerHash::Unavailable => tracing::warn!(
                peer = format!("{id:x}"),
                "cannot fetch a peer's hash: it did not answer"
            ),
        }
    }
    mismatched
}

/// The members the leader finds corrupt (etcd's `checkHashKV`): `before` is the leader's hash
/// when it asked, `after` its hash again once a linearizable read completed. The leader itself
/// is corrupt if its own hash moved at an unchanged revision; a follower is if its revision or
/// compact revision is ahead of the leader's, or its hash differs at the same compact revision.
pub fn periodic_mismatches(
    leader: u64,
    before: LocalHash,
    after: LocalHash,
    peers: &[(u64, PeerHash)],
) -> Vec<u64> {
    let mut corrupt = Vec::new();
    if after.hash != before.hash
        && after.revision == before.revision
        && after.compact_revision == before.compact_revision
    {
        tracing::warn!(
            revision = before.revision,
            "this member's hash changed at the same revision"
        );
        corrupt.push(leader);
    }
    for (id, peer) in peers {
        let PeerHash::Hashed {
            hash,
            compact_revision,
            revision,
        } = *peer
        else {
            continue;
        };
        let why = if revision > after.revision {
            Some("the follower's revision is ahead of the leader's")
        } else if compact_revision > after.compact_revision {
            Some("the follower's compact revision is ahead of the leader's")
        } else if compact_revision == before.compact_revision && hash != before.hash {
            Some("the follower's hash differs at the same revision")
        } else {
            None
        };
        if let Some(why) = why {
            tracing::warn!(
                peer = format!("{id:x}"),
                revision = before.revision,
                leader_hash = before.hash,
                peer_hash = hash,
                why,
                "corruption check mismatch"
            );
            if !corrupt.contains(id) {
                corrupt.push(*id);
            }
        }
    }
    corrupt
}

/// This member's HashKV at `revision` (0: current), computed on a thread of its own.
pub async fn local_hash(shared: &Shared, revision: i64) -> Result<LocalHash, kv::KvError> {
    let reader: Arc<kv::Reader> = shared.reader().clone();
    rt::on_thread("keel-hashkv", move || {
        let revision = if revision <= 0 {
            reader.current_revision()
        } else {
            revision
        };
        reader
            .hash_kv(revision)
            .map(|(hash, compact_revision)| LocalHash {
                hash,
                revision,
                compact_revision,
            })
    })
    .await
}

/// Answers a peer's HashKV request without holding up the raft loop.
pub fn answer_peer(
    shared: Arc<Shared>,
    transport: Rc<Transport>,
    from: u64,
    request_id: u64,
    revision: i64,
) {
    rt::spawn_local(async move {
        let reply = match local_hash(&shared, revision).await {
            Ok(h) => PeerHash::Hashed {
                hash: h.hash,
                compact_revision: h.compact_revision,
                revision: shared.reader().current_revision(),
            },
            Err(kv::KvError::FutureRevision) => PeerHash::FutureRevision,
            Err(kv::KvError::Compacted) => PeerHash::Compacted,
            Err(_) => PeerHash::Unavailable,
        };
        transport.send_hash_kv_reply(from, request_id, reply);
    });
}

/// Every other member's hash at `revision`.
async fn peer_hashes(
    shared: &Shared,
    transport: &Transport,
    revision: i64,
    timeout: Duration,
) -> Vec<(u64, PeerHash)> {
    let me = shared.member_id();
    let peers: Vec<u64> = shared
        .members()
        .iter()
        .map(|m| m.id)
        .filter(|id| *id != me)
        .collect();
    let asks = peers
        .iter()
        .map(|id| transport.hash_kv_of(*id, revision, timeout));
    let answers = futures_util::future::join_all(asks).await;
    peers.into_iter().zip(answers).collect()
}

/// The initial check: compares this member's hash with every peer's at this member's revision;
/// an error (stop, do not serve) when any peer disagrees at the same compact revision.
pub async fn initial_check(
    shared: Arc<Shared>,
    transport: Rc<Transport>,
    timeout: Duration,
) -> Result<(), CoreError> {
    let local = local_hash(&shared, 0)
        .await
        .map_err(|e| CoreError::Corrupt(format!("cannot hash this member's store: {e}")))?;
    let peers = peer_hashes(&shared, &transport, local.revision, timeout).await;
    let mismatched = initial_mismatches(local, &peers);
    if mismatched.is_empty() {
        tracing::info!(
            revision = local.revision,
            hash = local.hash,
            peers = peers.len(),
            "initial corruption check passed"
        );
        return Ok(());
    }
    let names: Vec<String> = mismatched.iter().map(|id| format!("{id:x}")).collect();
    Err(CoreError::Corrupt(format!(
        "{:x} found data inconsistency with peers {} at revision {} (local hash {})",
        shared.member_id(),
        names.join(","),
        local.revision,
        local.hash
    )))
}

/// The periodic check, on the leader every `interval`; raises CORRUPT through raft for each
/// member found corrupt. Runs until the member stops.
pub async fn periodic_checks(shared: Arc<Shared>, transport: Rc<Transport>, interval: Duration) {
    let timeout = interval.min(Duration::from_secs(5));
    loop {
        rt::sleep(interval).await;
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        if shared.leader_id.load(Ordering::Acquire) != shared.member_id() {
            continue;
        }
        let Ok(before) = local_hash(&shared, 0).await else {
            continue;
        };
        let peers = peer_hashes(&shared, &transport, before.revision, timeout).await;
        if shared.read_barrier().await.is_err() {
            continue;
        }
        let Ok(after) = local_hash(&shared, 0).await else {
            continue;
        };
        for id in periodic_mismatches(shared.member_id(), before, after, &peers) {
            let raise = pb::InternalRaftRequest {
                alarm: Some(pb::AlarmRequest {
                    action: pb::alarm_request::AlarmAction::Activate as i32,
                    member_id: id,
                    alarm: pb::AlarmType::Corrupt as i32,
                }),
                ..Default::default()
            };
            if let Err(e) = shared.propose(raise).await {
                tracing::warn!(member = format!("{id:x}"), error = %e, "cannot raise CORRUPT");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashed(hash: u32, compact_revision: i64, revision: i64) -> PeerHash {
        PeerHash::Hashed {
            hash,
            compact_revision,
            revision,
        }
    }

    const LOCAL: LocalHash = LocalHash {
        hash: 7,
        revision: 10,
        compact_revision: 4,
    };

    #[test]
    fn initial_check_flags_only_equal_compaction_mismatches() {
        let peers = [
            (1, hashed(7, 4, 10)),
            (2, hashed(8, 4, 10)),
            (3, hashed(9, 5, 10)),
            (4, PeerHash::FutureRevision),
            (5, PeerHash::Unavailable),
        ];
        assert_eq!(initial_mismatches(LOCAL, &peers), vec![2]);
    }

    #[test]
    fn periodic_check_flags_as_etcd() {
        let peers = [
            (1, hashed(7, 4, 10)),
            (2, hashed(8, 4, 10)),
            (3, hashed(7, 4, 11)),
            (4, hashed(7, 5, 10)),
            (5, hashed(9, 3, 9)),
        ];
        assert_eq!(periodic_mismatches(9, LOCAL, LOCAL, &peers), vec![2, 3, 4]);
        let moved = LocalHash { hash: 8, ..LOCAL };
        assert_eq!(periodic_mismatches(9, LOCAL, moved, &[]), vec![9]);
    }
}
