//! The cluster's alarms, kept as etcd keeps them (etcdserver/api/v3alarm): a set of
//! (member, alarm type) pairs changed only by `AlarmRequest` entries applied from the raft log,
//! so every member holds the same set at the same index. The set is persisted in the checkpoint
//! and rebuilt by replaying the log after it.
//!
//! While any NOSPACE alarm is raised, applying a Put, a Txn with a put or a LeaseGrant fails
//! with "database space exceeded"; while any CORRUPT alarm is raised, every write fails with
//! "corrupt cluster" (etcd's capped and corrupt appliers). Both are decided at apply, from the
//! replicated set, so all members answer alike.

use std::collections::BTreeSet;

use keel_grpc::EtcdError;
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use serde::{Deserialize, Serialize};

/// One raised alarm: the member that raised it and its `pb::AlarmType` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AlarmMember {
    pub member_id: u64,
    pub alarm: i32,
}

impl AlarmMember {
    pub fn to_pb(self) -> pb::AlarmMember {
        pb::AlarmMember {
            member_id: self.member_id,
            alarm: self.alarm,
        }
    }
}

/// What an alarm request asks, decoded from `pb::alarm_request::AlarmAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAction {
    Get,
    Activate,
    Deactivate,
}

impl AlarmAction {
    /// None for an action value etcd does not know (etcd's applier answers nothing then).
    pub fn from_pb(action: i32) -> Option<AlarmAction> {
        use pb::alarm_request::AlarmAction as A;
        match A::try_from(action).ok()? {
            A::Get => Some(AlarmAction::Get),
            A::Activate => Some(AlarmAction::Activate),
            A::Deactivate => Some(AlarmAction::Deactivate),
        }
    }
}

const NOSPACE: i32 = pb::AlarmType::Nospace as i32;
const CORRUPT: i32 = pb::AlarmType::Corrupt as i32;
const NONE: i32 = pb::AlarmType::None as i32;

/// The raised alarms, ordered by type then member (etcd lists them from maps; a fixed order
/// keeps members' answers identical).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alarms {
    raised: BTreeSet<(i32, u64)>,
}

impl Alarms {
    pub fn from_list(list: &[AlarmMember]) -> Alarms {
        Alarms {
            raised: list.iter().map(|a| (a.alarm, a.member_id)).collect(),
        }
    }

    /// Every raised alarm.
    pub fn list(&self) -> Vec<AlarmMember> {
        self.get(NONE)
    }

    /// The raised alarms of one type, or all of them for `AlarmType::None` (etcd's `Get`).
    pub fn get(&self, alarm: i32) -> Vec<AlarmMember> {
        self.raised
            .iter()
            .filter(|(t, _)| alarm == NONE || *t == alarm)
            .map(|(t, m)| AlarmMember {
                member_id: *m,
                alarm: *t,
            })
            .collect()
    }

    pub fn nospace(&self) -> bool {
        self.raised.iter().any(|(t, _)| *t == NOSPACE)
    }

    pub fn corrupt(&self) -> bool {
        self.raised.iter().any(|(t, _)| *t == CORRUPT)
    }

    /// Applies one alarm request as etcd's applier does and returns the alarms its response
    /// lists: all of the type for Get; the alarm raised (new or already there) for Activate;
    /// the alarm removed, if it was raised, for Deactivate.
    pub fn apply(&mut self, action: AlarmAction, member_id: u64, alarm: i32) -> Vec<AlarmMember> {
        let this = AlarmMember { member_id, alarm };
        match action {
            AlarmAction::Get => self.get(alarm),
            AlarmAction::Activate => {
                // etcd stores whatever type it is given; an alarm of type NONE would then match
                // every "is any alarm raised" check. Only real alarm types are raised here.
                if alarm == NONE {
                    return Vec::new();
                }
                let raised = self.raised.insert((alarm, member_id));
                if raised {
                    tracing::warn!(
                        alarm = alarm_name(alarm),
                        from = format!("{member_id:x}"),
                        "alarm raised"
                    );
                }
                vec![this]
            }
            AlarmAction::Deactivate => {
                if self.raised.remove(&(alarm, member_id)) {
                    tracing::warn!(
                        alarm = alarm_name(alarm),
                        from = format!("{member_id:x}"),
                        "alarm disarmed"
                    );
                    vec![this]
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// The error applying `op` meets under the raised alarms, if any (etcd's capped applier
    /// under NOSPACE, its corrupt applier under CORRUPT).
    pub fn refusal(&self, op: &kv::Op) -> Option<EtcdError> {
        if self.corrupt() {
            return Some(EtcdError::Corrupt);
        }
        if self.nospace() && op_cost_bytes(op) > 0 {
            return Some(EtcdError::NoSpace);
        }
        None
    }
}

/// etcd's name for an alarm type, for logs and for Status and /health reasons.
pub fn alarm_name(alarm: i32) -> &'static str {
    match pb::AlarmType::try_from(alarm) {
        Ok(pb::AlarmType::Nospace) => "NOSPACE",
        Ok(pb::AlarmType::Corrupt) => "CORRUPT",
        Ok(pb::AlarmType::None) => "NONE",
        Err(_) => "UNKNOWN",
    }
}

/// What etcd's quota estimates a key's metadata costs (`kvOverhead`).
pub const KV_OVERHEAD_BYTES: u64 = 256;
/// What etcd's quota estimates a lease costs (`leaseOverhead`).
pub const LEASE_OVERHEAD_BYTES: u64 = 64;

/// The bytes a write may add to the store, as etcd's quota costs it (`backendQuota.Cost`):
/// a put costs its key and value plus `KV_OVERHEAD_BYTES`; a txn the costlier of its two
/// branches' direct puts; a lease grant `LEASE_OVERHEAD_BYTES`; anything else nothing.
pub fn op_cost_bytes(op: &kv::Op) -> u64 {
    match op {
        kv::Op::Put(p) => put_cost_bytes(p),
        kv::Op::Txn(t) => txn_cost_bytes(t),
        kv::Op::LeaseGrant(_) => LEASE_OVERHEAD_BYTES,
        _ => 0,
    }
}

pub fn put_cost_bytes(p: &kv::PutRequest) -> u64 {
    KV_OVERHEAD_BYTES + p.key.len() as u64 + p.value.len() as u64
}

/// Only a branch's direct puts count, as in etcd (nested txns cost nothing there either).
pub fn txn_cost_bytes(t: &kv::TxnRequest) -> u64 {
    let branch = |ops: &[kv::RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match op {
                kv::RequestOp::Put(p) => put_cost_bytes(p),
                _ => 0,
            })
            .sum()
    };
    branch(&t.success).max(branch(&t.failure))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn activate_and_deactivate_answer_as_etcd() {
        let mut a = Alarms::default();
        assert_eq!(
            a.apply(AlarmAction::Activate, 7, NOSPACE),
            vec![AlarmMember {
                member_id: 7,
                alarm: NOSPACE
            }]
        );
        // Raising it again answers it again and changes nothing.
        assert_eq!(a.apply(AlarmAction::Activate, 7, NOSPACE).len(), 1);
        a.apply(AlarmAction::Activate, 9, CORRUPT);
        assert_eq!(a.list().len(), 2);
        assert_eq!(a.get(NOSPACE).len(), 1);
        assert!(a.nospace() && a.corrupt());
        // Deactivating what is not raised answers nothing.
        assert!(a.apply(AlarmAction::Deactivate, 8, NOSPACE).is_empty());
        assert_eq!(a.apply(AlarmAction::Deactivate, 7, NOSPACE).len(), 1);
        assert!(!a.nospace());
        assert_eq!(a.apply(AlarmAction::Get, 0, NONE).len(), 1);
        assert!(a.apply(AlarmAction::Activate, 1, NONE).is_empty());
        let restored = Alarms::from_list(&a.list());
        assert_eq!(restored, a);
    }

    #[test]
    fn nospace_refuses_only_writes_that_cost() {
        let mut a = Alarms::default();
        let put = kv::Op::Put(kv::PutRequest {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        });
        let delete = kv::Op::DeleteRange(kv::DeleteRangeRequest {
            key: Bytes::from_static(b"k"),
            ..Default::default()
        });
        assert_eq!(op_cost_bytes(&put), KV_OVERHEAD_BYTES + 2);
        assert!(a.refusal(&put).is_none());
        a.apply(AlarmAction::Activate, 1, NOSPACE);
        assert_eq!(a.refusal(&put), Some(EtcdError::NoSpace));
        assert_eq!(a.refusal(&delete), None);
        a.apply(AlarmAction::Activate, 1, CORRUPT);
        assert_eq!(a.refusal(&delete), Some(EtcdError::Corrupt));
    }
}
