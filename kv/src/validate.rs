//! Checks etcd makes before proposing a request to raft (etcdserver/api/v3rpc/key.go).
//!
//! These are pure functions of the request: they never look at the store, so every shard can run them
//! before a write crosses to the raft core. Errors that depend on state (key not found for
//! `ignore_*`, lease not found, compacted or future revisions) are decided at apply instead.

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::error::{KvError, Result};
use crate::types::{
    DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS_DEFAULT: usize = 128;

/// etcd's `MaxLeaseTTL`: 9,000,000,000 seconds.
pub const LEASE_TTL_MAX_S: i64 = 9_000_000_000;

pub fn validate_range(req: &RangeRequest) -> Result<()> {
    if req.key.is_empty() {
        return Err(KvError::KeyNotProvided);
    }
    Ok(())
}

pub fn validate_put(req: &PutRequest) -> Result<()> {
    if req.key.is_empty() {
        return Err(KvError::KeyNotProvided);
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(KvError::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(KvError::LeaseProvided);
    }
    Ok(())
}

pub fn validate_delete_range(req: &DeleteRangeRequest) -> Result<()> {
    if req.key.is_empty() {
        return Err(KvError::KeyNotProvided);
    }
    Ok(())
}

pub fn validate_lease_grant(req: &LeaseGrantRequest) -> Result<()> {
    if req.ttl_s > LEASE_TTL_MAX_S {
        return Err(KvError::LeaseTtlTooLarge);
    }
    Ok(())
}

/// etcd's `checkTxnRequest` followed by `checkIntervals` on both branches.
pub fn validate_txn(req: &TxnRequest, max_txn_ops: usize) -> Result<()> {
    assert!(max_txn_ops > 0, "max_txn_ops must allow at least one op");
    check_txn_ops(req, max_txn_ops)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    Ok(())
}

fn check_txn_ops(req: &TxnRequest, max_txn_ops: usize) -> Result<()> {
    let ops_count = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if ops_count > max_txn_ops {
        return Err(KvError::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(KvError::KeyNotProvided);
    }
    // etcd hands nested txns what is left of the budget after this level's widest list.
    let nested_ops_max = max_txn_ops - ops_count;
    for op in req.success.iter().chain(req.failure.iter()) {
        match op {
            RequestOp::Range(r) => validate_range(r)?,
            RequestOp::Put(p) => validate_put(p)?,
            RequestOp::DeleteRange(d) => validate_delete_range(d)?,
            RequestOp::Txn(t) => check_txn_ops(t, nested_ops_max)?,
        }
    }
    Ok(())
}

/// A delete interval as etcd's affine string intervals see it: [begin, end), or one point.
struct DeleteInterval {
    begin: Bytes,
    end: Option<Bytes>,
}

impl DeleteInterval {
    fn contains(&self, key: &[u8]) -> bool {
        match &self.end {
            None => self.begin.as_ref() == key,
            // A literal comparison, as etcd's interval tree does: "\0" as an end is not "infinity" here.
            Some(end) => self.begin.as_ref() <= key && key < end.as_ref(),
        }
    }
}

/// etcd's `checkIntervals`: the puts of one branch (nested branches included) must be distinct and
/// outside every delete range of that branch. Then and else of a nested txn may put the same key.
fn check_intervals(ops: &[RequestOp]) -> Result<(BTreeSet<Bytes>, Vec<DeleteInterval>)> {
    let mut dels: Vec<DeleteInterval> = Vec::new();
    for op in ops {
        if let RequestOp::DeleteRange(d) = op {
            dels.push(DeleteInterval {
                begin: d.key.clone(),
                end: (!d.range_end.is_empty()).then(|| d.range_end.clone()),
            });
        }
    }
    let mut puts: BTreeSet<Bytes> = BTreeSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || dels.iter().any(|d| d.contains(k)) {
                return Err(KvError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if puts.contains(k) && !puts_then.contains(k) {
                return Err(KvError::DuplicateKey);
            }
            if dels.iter().any(|d| d.contains(k)) {
                return Err(KvError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || dels.iter().any(|d| d.contains(&p.key)) {
            return Err(KvError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}
