//! Model-based property test: random operation sequences against keel-kv and against a plain
//! BTreeMap of version lists, compared after every step (ranges at random revisions, history
//! reads, and hashes of two stores fed the same entries).

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;

use crate::*;

const KEYS: [&[u8]; 6] = [b"a", b"ab", b"b", b"c", b"c\x00", b"d"];

#[derive(Debug, Clone)]
enum MOp {
    Put {
        key: usize,
        value: Vec<u8>,
        lease: bool,
    },
    Delete {
        key: usize,
        end: Option<usize>,
    },
    /// If MOD(key) == mod_revision of the latest write (or 0), put; else delete `other`, or
    /// the range from it to `end`, in a nested txn, and read everything.
    Txn {
        key: usize,
        expect_absent: bool,
        put: usize,
        value: Vec<u8>,
        other: usize,
        end: Option<usize>,
    },
    Compact {
        back: i64,
    },
    Steps {
        keys_max: usize,
    },
    Grant,
    Revoke,
    Restore,
}

fn op_strategy() -> impl Strategy<Value = MOp> {
    let key = 0..KEYS.len();
    let value = proptest::collection::vec(any::<u8>(), 0..200);
    prop_oneof![
        6 => (key.clone(), value.clone(), any::<bool>()).prop_map(|(key, value, lease)| MOp::Put { key, value, lease }),
        2 => (key.clone(), proptest::option::of(0..=KEYS.len())).prop_map(|(key, end)| MOp::Delete { key, end }),
        2 => (key.clone(), any::<bool>(), key.clone(), value, key, proptest::option::of(0..=KEYS.len())).prop_map(|(key, expect_absent, put, value, other, end)| MOp::Txn { key, expect_absent, put, value, other, end }),
        1 => (0i64..8).prop_map(|back| MOp::Compact { back }),
        2 => (1usize..4).prop_map(|keys_max| MOp::Steps { keys_max }),
        1 => Just(MOp::Grant),
        1 => Just(MOp::Revoke),
        1 => Just(MOp::Restore),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct MVersion {
    main: i64,
    /// None = tombstone.
    kv: Option<KeyValue>,
}

#[derive(Default)]
struct Model {
    keys: BTreeMap<Vec<u8>, Vec<MVersion>>,
    rev: i64,
    compact: i64,
    /// The lease id the model grants next; the one granted last is attached by lease puts.
    lease: Option<i64>,
    leases_granted: i64,
}

impl Model {
    fn new() -> Self {
        Model {
            rev: 1,
            compact: -1,
            ..Default::default()
        }
    }

    fn live(&self, key: &[u8], rev: i64) -> Option<&KeyValue> {
        let versions = self.keys.get(key)?;
        versions
            .iter()
            .rev()
            .find(|v| v.main <= rev)
            .and_then(|v| v.kv.as_ref())
    }

    fn put(&mut self, main: i64, key: &[u8], value: &[u8], lease: i64) {
        let prev = self.live(key, main).cloned();
        let kv = KeyValue {
            key: Bytes::copy_from_slice(key),
            create_revision: prev.as_ref().map_or(main, |p| p.create_revision),
            mod_revision: main,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value: Bytes::copy_from_slice(value),
            lease,
        };
        self.keys
            .entry(key.to_vec())
            .or_default()
            .push(MVersion { main, kv: Some(kv) });
    }

    fn delete(&mut self, main: i64, key: &[u8]) -> bool {
        if self.live(key, main).is_none() {
            return false;
        }
        self.keys
            .get_mut(key)
            .expect("live key")
            .push(MVersion { main, kv: None });
        true
    }

    fn in_range(key: &[u8], start: &[u8], end: Option<&[u8]>) -> bool {
        match end {
            None => key == start,
            Some(e) => key >= start && key < e,
        }
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>, rev: i64) -> Vec<KeyValue> {
        self.keys
            .keys()
            .filter(|k| Self::in_range(k, start, end))
            .filter_map(|k| self.live(k, rev).cloned())
            .collect()
    }

    /// Events with main >= start, in (main, sub) order: within a main, writes happened in key order
    /// in every op this test generates.
    fn events(&self, start: i64) -> Vec<(i64, Bytes, Option<KeyValue>, Option<KeyValue>)> {
        let mut out = Vec::new();
        for (k, versions) in &self.keys {
            for (i, v) in versions.iter().enumerate() {
                if v.main >= start {
                    let prev = i.checked_sub(1).and_then(|p| versions[p].kv.clone());
                    out.push((v.main, Bytes::copy_from_slice(k), v.kv.clone(), prev));
                }
            }
        }
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        out
    }
}

struct Harness {
    writer: Writer,
    reader: Reader,
    /// A second store fed the same entries with a different segment size: hashes must match.
    twin: Writer,
    model: Model,
    raft_index: u64,
}

impl Harness {
    fn apply(&mut self, op: Op) -> Result<Applied> {
        self.raft_index += 1;
        // The writer takes an entry that walks a range (a delete, or a txn that compares,
        // reads or deletes one) in steps of 1 to 3 keys; the twin applies it whole.
        // Between steps readers see the state before it, and the entry is not applied yet.
        let keys_max = 1 + (self.raft_index % 3) as usize;
        let all = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..Default::default()
        };
        let before = self.reader.range(&all).expect("latest is readable");
        let applied_before = self.writer.applied_index();
        let mut progress = self
            .writer
            .apply_in_steps(self.raft_index, &op, usize::MAX, keys_max);
        let a = loop {
            match progress {
                crate::Progress::Done(a) => break a,
                crate::Progress::More(steps) => {
                    assert_eq!(self.writer.stepping(), Some(self.raft_index));
                    assert_eq!(self.writer.applied_index(), applied_before);
                    assert_eq!(self.reader.range(&all).expect("readable"), before);
                    progress = self.writer.apply_step(steps, keys_max);
                }
            }
        };
        assert_eq!(self.writer.stepping(), None);
        let b = self.twin.apply(self.raft_index, &op);
        assert_eq!(a, b, "two stores fed the same entries answer the same");
        a
    }

    fn step(&mut self, op: &MOp) {
        let next = self.model.rev + 1;
        match op {
            MOp::Put { key, value, lease } => {
                let lease_id = if *lease {
                    self.model.lease.unwrap_or(0)
                } else {
                    0
                };
                let req = PutRequest {
                    key: Bytes::from_static(KEYS[*key]),
                    value: Bytes::copy_from_slice(value),
                    lease: lease_id,
                    prev_kv: true,
                    ..Default::default()
                };
                let prev = self.model.live(KEYS[*key], self.model.rev).cloned();
                let applied = self.apply(Op::Put(req)).expect("put applies");
                self.model.put(next, KEYS[*key], value, lease_id);
                self.model.rev = next;
                assert_eq!(
                    applied.response.check(),
                    OpResponse::Put(PutResponse {
                        revision: next,
                        prev_kv: prev
                    })
                );
            }
            MOp::Delete { key, end } => {
                let end_key: Option<&[u8]> = end.map(|e| KEYS.get(e).copied().unwrap_or(b"\xff"));
                let victims = self.model.range(KEYS[*key], end_key, self.model.rev);
                let req = DeleteRangeRequest {
                    key: Bytes::from_static(KEYS[*key]),
                    range_end: end_key.map(Bytes::copy_from_slice).unwrap_or_default(),
                    prev_kv: true,
                };
                let applied = self.apply(Op::DeleteRange(req)).expect("delete applies");
                for v in &victims {
                    assert!(self.model.delete(next, &v.key));
                }
                let revision = if victims.is_empty() {
                    self.model.rev
                } else {
                    next
                };
                self.model.rev = revision;
                assert_eq!(
                    applied.response.check(),
                    OpResponse::DeleteRange(DeleteRangeResponse {
                        revision,
                        deleted: victims.len() as i64,
                        prev_kvs: victims
                    })
                );
            }
            MOp::Txn {
                key,
                expect_absent,
                put,
                value,
                other,
                end,
            } => {
                let end_key: Option<&[u8]> = end.map(|e| KEYS.get(e).copied().unwrap_or(b"\xff"));
                let current_mod = self
                    .model
                    .live(KEYS[*key], self.model.rev)
                    .map_or(0, |kv| kv.mod_revision);
                let expected_mod = if *expect_absent { 0 } else { current_mod };
                let victims = self.model.range(KEYS[*other], end_key, self.model.rev);
                // A compare of a range, decided in steps, first: it fails part way through its
                // walk when the last write was to a key in the range (and holds on an empty
                // range, which compares as a zero key-value).
                let range_holds = victims.iter().all(|kv| kv.mod_revision < self.model.rev);
                let req = TxnRequest {
                    compare: vec![
                        Compare {
                            result: CompareResult::Less,
                            target: CompareTarget::Mod(self.model.rev),
                            key: Bytes::from_static(KEYS[*other]),
                            range_end: end_key.map(Bytes::copy_from_slice).unwrap_or_default(),
                        },
                        Compare {
                            result: CompareResult::Equal,
                            target: CompareTarget::Mod(expected_mod),
                            key: Bytes::from_static(KEYS[*key]),
                            range_end: Bytes::new(),
                        },
                    ],
                    success: vec![
                        RequestOp::Put(PutRequest {
                            key: Bytes::from_static(KEYS[*put]),
                            value: Bytes::copy_from_slice(value),
                            ..Default::default()
                        }),
                        RequestOp::Range(RangeRequest {
                            key: Bytes::from_static(b"\0"),
                            range_end: Bytes::from_static(b"\0"),
                            ..Default::default()
                        }),
                    ],
                    // Applied in steps when it deletes a range: the range after the nested
                    // txn reads what the delete left.
                    failure: vec![
                        RequestOp::Txn(TxnRequest {
                            compare: vec![],
                            success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                                key: Bytes::from_static(KEYS[*other]),
                                range_end: end_key.map(Bytes::copy_from_slice).unwrap_or_default(),
                                prev_kv: true,
                            })],
                            failure: vec![],
                        }),
                        RequestOp::Range(RangeRequest {
                            key: Bytes::from_static(b"\0"),
                            range_end: Bytes::from_static(b"\0"),
                            ..Default::default()
                        }),
                    ],
                };
                validate_txn(&req, MAX_TXN_OPS_DEFAULT).expect("a valid txn");
                let applied = self.apply(Op::Txn(req)).expect("txn applies");
                let OpResponse::Txn(resp) = applied.response.check() else {
                    panic!("txn response")
                };
                assert_eq!(resp.succeeded, range_holds && current_mod == expected_mod);
                if resp.succeeded {
                    self.model.put(next, KEYS[*put], value, 0);
                    self.model.rev = next;
                    let ResponseOp::Range(r) = &resp.responses[1] else {
                        panic!("range response")
                    };
                    assert_eq!(
                        r.kvs,
                        self.model.range(b"\0", Some(b"\xff\xff"), next),
                        "a txn reads its own writes"
                    );
                } else {
                    for v in &victims {
                        assert!(self.model.delete(next, &v.key));
                    }
                    if !victims.is_empty() {
                        self.model.rev = next;
                    }
                    let ResponseOp::Txn(nested) = &resp.responses[0] else {
                        panic!("nested txn response")
                    };
                    let ResponseOp::DeleteRange(d) = &nested.responses[0] else {
                        panic!("delete response")
                    };
                    assert_eq!(d.prev_kvs, victims);
                    let ResponseOp::Range(r) = &resp.responses[1] else {
                        panic!("range response")
                    };
                    assert_eq!(
                        r.kvs,
                        self.model.range(b"\0", Some(b"\xff\xff"), self.model.rev),
                        "a txn reads its own deletes"
                    );
                }
                assert_eq!(resp.revision, self.model.rev);
            }
            MOp::Compact { back } => {
                let revision = (self.model.rev - back).max(1);
                let result = self.apply(Op::Compact(CompactionRequest {
                    revision,
                    physical: false,
                }));
                if revision <= self.model.compact {
                    assert_eq!(result, Err(KvError::Compacted));
                } else {
                    result.expect("compaction accepted");
                    self.model.compact = revision;
                }
            }
            MOp::Steps { keys_max } => {
                for _ in 0..4 {
                    self.writer.compact_step(*keys_max);
                    self.twin.compact_step(*keys_max);
                }
            }
            MOp::Grant => {
                self.model.leases_granted += 1;
                let id = self.model.leases_granted;
                self.apply(Op::LeaseGrant(LeaseGrantRequest { id, ttl_s: 10 }))
                    .expect("grant");
                self.model.lease = Some(id);
            }
            MOp::Revoke => {
                let Some(id) = self.model.lease.take() else {
                    return;
                };
                let attached: Vec<Bytes> = self
                    .model
                    .range(b"\0", Some(b"\xff\xff"), self.model.rev)
                    .into_iter()
                    .filter(|kv| kv.lease == id)
                    .map(|kv| kv.key)
                    .collect();
                let applied = self
                    .apply(Op::LeaseRevoke(LeaseRevokeRequest { id }))
                    .expect("revoke");
                for k in &attached {
                    assert!(self.model.delete(next, k));
                }
                if !attached.is_empty() {
                    self.model.rev = next;
                }
                assert_eq!(applied.events.len(), attached.len());
            }
            MOp::Restore => {
                let bytes = self.writer.checkpoint();
                let (writer, reader) = Store::restore(&bytes).expect("own checkpoint restores");
                assert_eq!(writer.applied_index(), self.raft_index);
                self.writer = writer;
                self.reader = reader;
            }
        }
    }

    fn check(&self, rev_pick: u64) {
        let cur = self.model.rev;
        assert_eq!(self.reader.current_revision(), cur);
        assert_eq!(self.reader.compact_revision(), self.model.compact);
        // A random revision in [1, cur].
        let rev = 1 + (rev_pick % cur as u64) as i64;
        let all = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            revision: rev,
            ..Default::default()
        };
        match self.reader.range(&all) {
            Err(KvError::Compacted) => assert!(rev < self.model.compact),
            Err(e) => panic!("unexpected {e}"),
            Ok(r) => {
                assert!(rev >= self.model.compact);
                let expected = self.model.range(b"\0", Some(b"\xff\xff"), rev);
                assert_eq!(r.count, expected.len() as i64);
                assert_eq!(r.kvs, expected, "range at rev {rev}");
            }
        }
        for (i, k) in KEYS.iter().enumerate() {
            let end = KEYS.get(i + 2).copied().unwrap_or(b"\0");
            let req = RangeRequest {
                key: Bytes::from_static(k),
                range_end: Bytes::copy_from_slice(end),
                limit: 2,
                ..Default::default()
            };
            let r = self.reader.range(&req).expect("latest is readable");
            let model_end: &[u8] = if end == b"\0" { b"\xff\xff" } else { end };
            let expected = self.model.range(k, Some(model_end), cur);
            assert_eq!(r.count, expected.len() as i64);
            assert_eq!(r.more, expected.len() > 2);
            assert_eq!(r.kvs, expected.into_iter().take(2).collect::<Vec<_>>());
        }
        let start = (self.model.compact + 1).max(1);
        let batch = self
            .reader
            .range_events(start, b"\0", b"\0", usize::MAX)
            .expect("history above the compact revision");
        let expected = self.model.events(start);
        assert_eq!(batch.events.len(), expected.len());
        for (e, (main, key, kv, prev)) in batch.events.iter().zip(expected) {
            assert_eq!(e.kv.mod_revision, main);
            assert_eq!(e.kv.key, key);
            match kv {
                Some(kv) => assert_eq!((e.kind, &e.kv), (EventKind::Put, &kv)),
                None => assert_eq!(e.kind, EventKind::Delete),
            }
            assert_eq!(e.prev_kv.clone().map(PrevKv::checked), prev);
        }
        if !self.writer.compaction_pending() && !self.twin.compaction_pending() {
            assert_eq!(
                self.reader.hash_kv(0),
                self.twin.reader().hash_kv(0),
                "same entries, same hash"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn matches_model(ops in proptest::collection::vec((op_strategy(), any::<u64>()), 1..80)) {
        let (writer, reader) = Store::with_segment_bytes(256);
        let (twin, _) = Store::with_segment_bytes(4096);
        let mut h = Harness { writer, reader, twin, model: Model::new(), raft_index: 0 };
        for (op, rev_pick) in &ops {
            h.step(op);
            h.check(*rev_pick);
        }
        // Finish compaction and reclaim; the state must not change and both stores must agree.
        while h.writer.compact_step(3) == CompactionStatus::Pending {}
        while h.twin.compact_step(3) == CompactionStatus::Pending {}
        h.check(0);
        prop_assert!(h.writer.value_log_bytes_live() <= h.writer.value_log_bytes());
    }
}
