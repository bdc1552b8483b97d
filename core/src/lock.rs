//! The v3lock and v3election services, built server-side on leases and txns exactly as etcd
//! builds them (clientv3/concurrency's Mutex and Election): a waiter's key is
//! "<name>/<lease in hex>", the oldest key (lowest create revision) under the prefix holds the
//! lock or the leadership, and the others wait for the deletion of the key just older than
//! theirs.
//!
//! Waiting uses the shard's watch hub (`Hub::wait_change`), never polling.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use keel_grpc::{Call, Code, EtcdError, ResponseSink, Status};
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use keel_proto::mvccpb;
use keel_proto::v3electionpb as epb;
use keel_proto::v3lockpb as lpb;

use crate::auth::AuthInfo;
use crate::convert;
use crate::shared::{kv_error, Answer, Shared};
use crate::watch::Hub;

type R<T> = Result<T, Status>;

/// etcd's concurrency.Session default TTL, used when Lock or Campaign names no lease.
const SESSION_TTL_S: i64 = 60;

fn etcd(e: EtcdError) -> Status {
    Status::from(e)
}

/// Errors the election API returns as plain Go errors (gRPC code Unknown), text for text.
fn election_not_leader() -> Status {
    Status::new(Code::Unknown, "election: not leader")
}
fn election_no_leader() -> Status {
    Status::new(Code::Unknown, "election: no leader")
}
fn missing_leader_key() -> Status {
    Status::new(Code::Unknown, "\"leader\" field must be provided")
}

/// The key after every key with this prefix (etcd's GetPrefixRangeEnd).
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end.into();
        }
    }
    Bytes::from_static(b"\0")
}

fn waiter_key(prefix: &[u8], lease: i64) -> Bytes {
    let mut k = prefix.to_vec();
    k.extend_from_slice(format!("{lease:x}").as_bytes());
    k.into()
}

async fn txn(shared: &Shared, who: &AuthInfo, t: pb::TxnRequest) -> R<pb::TxnResponse> {
    // etcd's lock and election servers write through its quota-checked KV server.
    shared
        .check_quota(crate::alarms::txn_cost_bytes(&convert::txn_request(
            t.clone(),
        )))
        .await
        .map_err(etcd)?;
    let out = shared
        .propose_as(
            pb::InternalRaftRequest {
                txn: Some(t),
                ..Default::default()
            },
            who,
        )
        .await
        .map_err(etcd)?;
    match out.response {
        Answer::Op(kv::OpResponse::Txn(r)) => {
            let h = Some(pb::ResponseHeader {
                cluster_id: shared.cluster_id(),
                member_id: shared.member_id(),
                revision: r.revision,
                raft_term: out.raft_term,
            });
            Ok(convert::txn_response(r, h))
        }
        _ => Err(Status::new(
            Code::Internal,
            "keel: mismatched apply response",
        )),
    }
}

/// A linearizable read, as clientv3's default Get.
async fn get(shared: &Shared, who: &AuthInfo, req: kv::RangeRequest) -> R<pb::RangeResponse> {
    shared.read_barrier().await.map_err(etcd)?;
    // etcd's lock and election servers read through its KV server, with the caller's token.
    crate::auth::api::check_read(shared, who, &req.key, &req.range_end)?;
    let r = shared.reader().range(&req).map_err(|e| etcd(kv_error(e)))?;
    let h = shared.header(r.revision);
    Ok(convert::range_response(r, h))
}

/// The oldest (FirstCreate) or newest (LastCreate) key under a prefix.
fn by_create(prefix: &[u8], order: kv::SortOrder, max_create_revision: i64) -> kv::RangeRequest {
    kv::RangeRequest {
        key: Bytes::copy_from_slice(prefix),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order,
        sort_target: kv::SortTarget::Create,
        max_create_revision,
        ..Default::default()
    }
}

fn range_op(r: kv::RangeRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
            key: r.key,
            range_end: r.range_end,
            limit: r.limit,
            sort_order: match r.sort_order {
                kv::SortOrder::Ascend => 1,
                kv::SortOrder::Descend => 2,
                kv::SortOrder::None => 0,
            },
            sort_target: if r.sort_target == kv::SortTarget::Create {
                2
            } else {
                0
            },
            ..Default::default()
        })),
    }
}

fn put_op(key: Bytes, value: Bytes, lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key,
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn create_rev_is(key: Bytes, rev: i64) -> pb::Compare {
    pb::Compare {
        result: pb::compare::CompareResult::Equal as i32,
        target: pb::compare::CompareTarget::Create as i32,
        key,
        target_union: Some(pb::compare::TargetUnion::CreateRevision(rev)),
        range_end: Bytes::new(),
    }
}

fn first_range_kv(resp: &pb::TxnResponse, i: usize) -> Option<mvccpb::KeyValue> {
    match resp.responses.get(i)?.response.as_ref()? {
        pb::response_op::Response::ResponseRange(r) => r.kvs.first().cloned(),
        _ => None,
    }
}

async fn session_lease(shared: &Shared, lease: i64) -> R<i64> {
    if lease != 0 {
        return Ok(lease);
    }
    let id = shared.new_lease_id();
    let grant = pb::LeaseGrantRequest {
        ttl: SESSION_TTL_S,
        id,
    };
    shared
        .check_quota(crate::alarms::LEASE_OVERHEAD_BYTES)
        .await
        .map_err(etcd)?;
    let out = shared
        .propose(pb::InternalRaftRequest {
            lease_grant: Some(grant),
            ..Default::default()
        })
        .await
        .map_err(etcd)?;
    match out.response {
        Answer::Op(kv::OpResponse::LeaseGrant(g)) => Ok(g.id),
        _ => Err(Status::new(
            Code::Internal,
            "keel: mismatched apply response",
        )),
    }
}

/// Waits until `key` is deleted (or recreated, which is the same for a waiter).
async fn wait_delete(
    shared: &Shared,
    who: &AuthInfo,
    hub: &Rc<Hub>,
    key: &Bytes,
    create_rev: i64,
) -> R<()> {
    loop {
        let rev = shared.reader().current_revision();
        let changed = hub.wait_change(key.clone(), &[], rev);
        let r = get(
            shared,
            who,
            kv::RangeRequest {
                key: key.clone(),
                ..Default::default()
            },
        )
        .await?;
        if r.kvs
            .first()
            .is_none_or(|kv| kv.create_revision != create_rev)
        {
            return Ok(());
        }
        let _ = changed.await;
    }
}

/// Waits until no key under `prefix` older than `max_create_rev` remains (etcd's waitDeletes).
async fn wait_deletes(
    shared: &Shared,
    who: &AuthInfo,
    hub: &Rc<Hub>,
    prefix: &[u8],
    max_create_rev: i64,
) -> R<pb::ResponseHeader> {
    loop {
        let r = get(
            shared,
            who,
            by_create(prefix, kv::SortOrder::Descend, max_create_rev),
        )
        .await?;
        match r.kvs.first() {
            None => return Ok(r.header.unwrap_or_default()),
            Some(kv) => wait_delete(shared, who, hub, &kv.key, kv.create_revision).await?,
        }
    }
}

/// Deletes a waiter's key if the call is abandoned (deadline or client gone) before it got
/// the lock, as etcd's Mutex does on a failed wait.
struct AbandonGuard {
    shared: Arc<Shared>,
    who: AuthInfo,
    key: Option<Bytes>,
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let shared = self.shared.clone();
            let who = std::mem::take(&mut self.who);
            crate::rt::spawn_local(async move {
                let del = pb::DeleteRangeRequest {
                    key,
                    ..Default::default()
                };
                let _ = shared
                    .propose_as(
                        pb::InternalRaftRequest {
                            delete_range: Some(del),
                            ..Default::default()
                        },
                        &who,
                    )
                    .await;
            });
        }
    }
}

pub async fn lock(
    shared: &Arc<Shared>,
    hub: &Rc<Hub>,
    who: &AuthInfo,
    r: lpb::LockRequest,
) -> R<lpb::LockResponse> {
    let lease = session_lease(shared, r.lease).await?;
    let mut prefix = r.name.to_vec();
    prefix.push(b'/');
    let my_key = waiter_key(&prefix, lease);
    let t = pb::TxnRequest {
        compare: vec![create_rev_is(my_key.clone(), 0)],
        success: vec![
            put_op(my_key.clone(), Bytes::new(), lease),
            range_op(by_create(&prefix, kv::SortOrder::Ascend, 0)),
        ],
        failure: vec![
            range_op(kv::RangeRequest {
                key: my_key.clone(),
                ..Default::default()
            }),
            range_op(by_create(&prefix, kv::SortOrder::Ascend, 0)),
        ],
    };
    let resp = txn(shared, who, t).await?;
    let header = resp.header.unwrap_or_default();
    let my_rev = if resp.succeeded {
        header.revision
    } else {
        first_range_kv(&resp, 0)
            .map(|kv| kv.create_revision)
            .ok_or_else(|| etcd(EtcdError::KeyNotFound))?
    };
    let owner = first_range_kv(&resp, 1);
    if owner.is_none_or(|kv| kv.create_revision == my_rev) {
        return Ok(lpb::LockResponse {
            header: Some(header),
            key: my_key,
        });
    }
    let mut guard = AbandonGuard {
        shared: shared.clone(),
        who: who.clone(),
        key: Some(my_key.clone()),
    };
    let header = wait_deletes(shared, who, hub, &prefix, my_rev - 1).await?;
    guard.key = None;
    Ok(lpb::LockResponse {
        header: Some(header),
        key: my_key,
    })
}

pub async fn unlock(
    shared: &Arc<Shared>,
    who: &AuthInfo,
    r: lpb::UnlockRequest,
) -> R<lpb::UnlockResponse> {
    let del = pb::DeleteRangeRequest {
        key: r.key,
        ..Default::default()
    };
    let out = shared
        .propose_as(
            pb::InternalRaftRequest {
                delete_range: Some(del),
                ..Default::default()
            },
            who,
        )
        .await
        .map_err(etcd)?;
    match out.response {
        Answer::Op(kv::OpResponse::DeleteRange(d)) => Ok(lpb::UnlockResponse {
            header: shared.header(d.revision),
        }),
        _ => Err(Status::new(
            Code::Internal,
            "keel: mismatched apply response",
        )),
    }
}

fn election_prefix(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(b'/');
    p
}

pub async fn campaign(
    shared: &Arc<Shared>,
    hub: &Rc<Hub>,
    who: &AuthInfo,
    r: epb::CampaignRequest,
) -> R<epb::CampaignResponse> {
    let lease = session_lease(shared, r.lease).await?;
    let prefix = election_prefix(&r.name);
    let key = waiter_key(&prefix, lease);
    let t = pb::TxnRequest {
        compare: vec![create_rev_is(key.clone(), 0)],
        success: vec![put_op(key.clone(), r.value.clone(), lease)],
        failure: vec![range_op(kv::RangeRequest {
            key: key.clone(),
            ..Default::default()
        })],
    };
    let resp = txn(shared, who, t).await?;
    let header = resp.header.unwrap_or_default();
    let mut leader_rev = header.revision;
    let mut guard = AbandonGuard {
        shared: shared.clone(),
        who: who.clone(),
        key: Some(key.clone()),
    };
    if !resp.succeeded {
        let kv = first_range_kv(&resp, 0).ok_or_else(|| etcd(EtcdError::KeyNotFound))?;
        leader_rev = kv.create_revision;
        if kv.value != r.value {
            proclaim_value(shared, who, &key, leader_rev, lease, r.value.clone()).await?;
        }
    }
    wait_deletes(shared, who, hub, &prefix, leader_rev - 1).await?;
    guard.key = None;
    Ok(epb::CampaignResponse {
        header: Some(header),
        leader: Some(epb::LeaderKey {
            name: r.name,
            key,
            rev: leader_rev,
            lease,
        }),
    })
}

async fn proclaim_value(
    shared: &Shared,
    who: &AuthInfo,
    key: &Bytes,
    rev: i64,
    lease: i64,
    value: Bytes,
) -> R<pb::ResponseHeader> {
    let t = pb::TxnRequest {
        compare: vec![create_rev_is(key.clone(), rev)],
        success: vec![put_op(key.clone(), value, lease)],
        failure: vec![],
    };
    let resp = txn(shared, who, t).await?;
    if !resp.succeeded {
        return Err(election_not_leader());
    }
    Ok(resp.header.unwrap_or_default())
}

pub async fn proclaim(
    shared: &Arc<Shared>,
    who: &AuthInfo,
    r: epb::ProclaimRequest,
) -> R<epb::ProclaimResponse> {
    let leader = r.leader.ok_or_else(missing_leader_key)?;
    let header =
        proclaim_value(shared, who, &leader.key, leader.rev, leader.lease, r.value).await?;
    Ok(epb::ProclaimResponse {
        header: Some(header),
    })
}

pub async fn leader(
    shared: &Arc<Shared>,
    who: &AuthInfo,
    r: epb::LeaderRequest,
) -> R<epb::LeaderResponse> {
    let resp = get(
        shared,
        who,
        by_create(&election_prefix(&r.name), kv::SortOrder::Ascend, 0),
    )
    .await?;
    match resp.kvs.into_iter().next() {
        None => Err(election_no_leader()),
        Some(kv) => Ok(epb::LeaderResponse {
            header: resp.header,
            kv: Some(kv),
        }),
    }
}

pub async fn resign(
    shared: &Arc<Shared>,
    who: &AuthInfo,
    r: epb::ResignRequest,
) -> R<epb::ResignResponse> {
    let leader = r.leader.ok_or_else(missing_leader_key)?;
    let t = pb::TxnRequest {
        compare: vec![create_rev_is(leader.key.clone(), leader.rev)],
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestDeleteRange(
                pb::DeleteRangeRequest {
                    key: leader.key,
                    ..Default::default()
                },
            )),
        }],
        failure: vec![],
    };
    let resp = txn(shared, who, t).await?;
    Ok(epb::ResignResponse {
        header: resp.header,
    })
}

/// Streams the election's leader: the current one, every value it proclaims, and each
/// successor, until the client goes away. A read that fails (a bad token, no read permission)
/// ends the stream without an error, as etcd's does: its Observe reads through
/// concurrency.Election.Observe, whose channel just closes when a Get fails.
pub async fn observe(
    shared: &Arc<Shared>,
    hub: &Rc<Hub>,
    call: Call,
    sink: &mut ResponseSink,
) -> Status {
    let Call { head, mut requests } = call;
    let who = match crate::auth::who(shared, &head.metadata).await {
        Ok(who) => who,
        Err(_) => return Status::ok(),
    };
    let req: epb::LeaderRequest = match requests.decode_one().await {
        Ok(r) => r,
        Err(status) => return status,
    };
    let prefix = election_prefix(&req.name);
    let end = prefix_end(&prefix);
    let mut last_sent: Option<(Bytes, i64)> = None;
    loop {
        let rev = shared.reader().current_revision();
        let changed = hub.wait_change(Bytes::copy_from_slice(&prefix), &end, rev);
        let resp = match get(shared, &who, by_create(&prefix, kv::SortOrder::Ascend, 0)).await {
            Ok(r) => r,
            Err(_) => return Status::ok(),
        };
        if let Some(kv) = resp.kvs.first() {
            let seen = (kv.key.clone(), kv.mod_revision);
            if last_sent.as_ref() != Some(&seen) {
                let out = epb::LeaderResponse {
                    header: resp.header,
                    kv: Some(kv.clone()),
                };
                if let Err(status) = sink.send(&out).await {
                    return status;
                }
                last_sent = Some(seen);
            }
        }
        let _ = changed.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_matches_etcds() {
        assert_eq!(prefix_end(b"a/"), Bytes::from_static(b"a0"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff\xff"), Bytes::from_static(b"\0"));
    }

    #[test]
    fn waiter_keys_use_lowercase_hex_leases() {
        assert_eq!(
            waiter_key(b"lock/", 0x694d7e3b1c2aa20a),
            Bytes::from_static(b"lock/694d7e3b1c2aa20a")
        );
    }
}
