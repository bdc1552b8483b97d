//! Simulated clients: each issues one call at a time to a member it picks (failing over to
//! another when a member is down, as clientv3 does), puts its calls into the member's
//! mailboxes exactly as a shard does (an encoded `InternalRaftRequest` proposal, or a read
//! that waits for a ReadIndex round and then reads the member's store), and records every call
//! and answer for the linearizability checker. Time in the history is a logical clock that
//! ticks at every call and every answer, so real-time order is exact.

use bytes::Bytes;
use futures_channel::oneshot;
use keel_core::shared::{Answer, Proposal, ReadWait, Unserved};
use keel_grpc::EtcdError;
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use prost::Message as _;
use rand::Rng;

use crate::porcupine::{Compare, Input, Operation, Output};
use crate::world::{World, MAILBOX_PROPOSALS_MAX, REQUEST_TIMEOUT_MS};

/// Keys the workload touches: few, so operations contend.
pub const KEYS: usize = 4;
/// Filler keys under each key ("k1/f0".."k1/f11"), put without waiting and never read: a delete
/// of a key's prefix spans them, so it is applied over several loop turns (the world applies
/// a few keys per step), and the history still sees it as a delete of the key alone.
const FILLERS_PER_KEY: u64 = 12;

enum Waiting {
    Write(oneshot::Receiver<Result<Unserved, EtcdError>>),
    Read(oneshot::Receiver<Result<(), EtcdError>>),
}

struct Call {
    key: usize,
    input: Input,
    call_at: u64,
    member: usize,
    waiting: Waiting,
    /// A client gives up after this (simulated) time and calls the outcome unknown.
    give_up_ms: u64,
}

/// What a client last saw of each key, for its compare-and-swap calls.
#[derive(Clone, Default)]
struct Seen {
    value: Option<Vec<u8>>,
    mod_revision: i64,
}

pub struct Client {
    id: usize,
    call: Option<Call>,
    next_call_ms: u64,
    seen: Vec<Seen>,
    next_value: u64,
}

/// All clients, the shared logical clock and the history.
pub struct Clients {
    clients: Vec<Client>,
    clock: u64,
    next_proposal_id: u64,
    pub history: Vec<Operation>,
    pub acknowledged_writes: u64,
    pub compactions: u64,
    /// When (simulated ms) the last write was acknowledged, and the last read answered, by
    /// member.
    pub last_write_ack_ms: u64,
    pub last_read_ms_by_member: Vec<u64>,
}

pub fn key_name(k: usize) -> String {
    format!("k{k}")
}

impl Clients {
    pub fn new(count: usize) -> Clients {
        Clients {
            clients: (0..count)
                .map(|id| Client {
                    id,
                    call: None,
                    next_call_ms: 0,
                    seen: vec![Seen::default(); KEYS],
                    next_value: 0,
                })
                .collect(),
            clock: 0,
            next_proposal_id: 1,
            history: Vec::new(),
            acknowledged_writes: 0,
            compactions: 0,
            last_write_ack_ms: 0,
            last_read_ms_by_member: vec![0; 8],
        }
    }

    /// The next logical instant, in the history's nanoseconds: strictly increasing, and
    /// `now_ms` microseconds plus a count, so the checker's descriptions read as simulated
    /// milliseconds (before the dot) and events within them.
    fn tick(&mut self, now_ms: u64) -> u64 {
        self.clock = (self.clock + 1_000).max(now_ms * 1_000_000);
        self.clock
    }

    /// Collects answers, then lets idle clients call again (`issue` false: only collect).
    pub fn step(&mut self, world: &mut World, issue: bool) {
        for c in 0..self.clients.len() {
            self.collect(world, c);
            if issue
                && self.clients[c].call.is_none()
                && world.now_ms >= self.clients[c].next_call_ms
            {
                self.issue(world, c);
            }
        }
    }

    /// Whether some call is still waiting for its answer.
    pub fn busy(&self) -> bool {
        self.clients.iter().any(|c| c.call.is_some())
    }

    fn collect(&mut self, world: &mut World, c: usize) {
        let Some(call) = self.clients[c].call.as_mut() else {
            return;
        };
        let timed_out = world.now_ms >= call.give_up_ms;
        let answer = match &mut call.waiting {
            Waiting::Write(rx) => match rx.try_recv() {
                Ok(None) if !timed_out => return,
                Ok(None) | Err(_) => Err(None),
                Ok(Some(Ok(outcome))) => Ok(Some(outcome)),
                Ok(Some(Err(e))) => Err(Some(e)),
            },
            Waiting::Read(rx) => match rx.try_recv() {
                Ok(None) if !timed_out => return,
                Ok(None) | Err(_) => Err(None),
                Ok(Some(Ok(()))) => Ok(None),
                Ok(Some(Err(e))) => Err(Some(e)),
            },
        };
        let call = self.clients[c].call.take().expect("checked");
        let returned_at = self.tick(world.now_ms);
        let key = key_name(call.key);
        let client = &mut self.clients[c];
        client.next_call_ms = world.now_ms + world.rng.gen_range(0..20);
        let output = match answer {
            // Refused before it reached the log: it had no effect, so the history leaves it
            // out (if it did take effect after all, its value appears from nowhere and the
            // checker says so).
            Err(Some(e)) if refused_before_the_log(e) => return,
            Err(_) => None,
            Ok(Some(outcome)) => Some(write_output(&call.input, &key, outcome)),
            Ok(None) => {
                // The read round is done: read the member's store now, as the shard does.
                let Some(run) = world.nodes[call.member].run.as_ref() else {
                    return; // The member died before the shard could read: no answer.
                };
                let resp = run
                    .reader
                    .range(&kv::RangeRequest {
                        key: Bytes::from(key.clone()),
                        ..Default::default()
                    })
                    .expect("a read at the latest revision");
                let kv = resp
                    .kvs
                    .first()
                    .map(|kv| (kv.value.to_vec(), kv.mod_revision));
                Some(Output::Get { kv })
            }
        };
        match output {
            None => {
                // Reads without an answer constrain nothing; writes may have happened.
                if !matches!(call.input, Input::Get) {
                    self.history.push(Operation::unknown(
                        client.id,
                        &key,
                        call.input,
                        call.call_at,
                    ));
                }
            }
            Some(output) => {
                match &output {
                    Output::Get { kv } => {
                        self.last_read_ms_by_member[call.member] = world.now_ms;
                        client.seen[call.key] = Seen {
                            value: kv.as_ref().map(|(v, _)| v.clone()),
                            mod_revision: kv.as_ref().map_or(0, |(_, r)| *r),
                        }
                    }
                    _ => {
                        self.acknowledged_writes += 1;
                        self.last_write_ack_ms = world.now_ms;
                        world.note(|| {
                            format!(
                                "c{c} {:?} on {key} via m{} -> {output:?}",
                                call.input, call.member
                            )
                        });
                    }
                }
                self.history.push(Operation::completed(
                    client.id,
                    &key,
                    call.input,
                    output,
                    call.call_at,
                    returned_at,
                ));
            }
        }
    }

    fn issue(&mut self, world: &mut World, c: usize) {
        let member = world.rng.gen_range(0..world.nodes.len());
        if !world.is_up(member) {
            // Connection refused: nothing was sent; try again soon (maybe elsewhere).
            self.clients[c].next_call_ms = world.now_ms + 5;
            return;
        }
        let key = world.rng.gen_range(0..KEYS);
        let roll = world.rng.gen_range(0..100);
        if roll < 3 {
            self.compact(world, member);
            self.clients[c].next_call_ms = world.now_ms + 20;
            return;
        }
        if roll < 8 {
            self.put_filler(world, member, key);
            self.clients[c].next_call_ms = world.now_ms + 5;
            return;
        }
        let client = &mut self.clients[c];
        client.next_value += 1;
        let value = format!("c{}-{}", client.id, client.next_value).into_bytes();
        let seen = client.seen[key].clone();
        let input = match roll {
            8..=39 => Input::Get,
            40..=69 => Input::Put { value },
            70..=79 => Input::Delete,
            80..=89 => Input::Cas {
                compare: Compare::ModRevision(seen.mod_revision),
                value,
            },
            _ => Input::Cas {
                compare: match seen.value {
                    Some(v) => Compare::Value(v),
                    None => Compare::ModRevision(0),
                },
                value,
            },
        };
        let prefix = matches!(input, Input::Delete) && world.rng.gen_bool(0.5);
        // Half the prefix deletes go in a txn, which is applied in steps as well.
        let delete = match (prefix, prefix && world.rng.gen_bool(0.5)) {
            (false, _) => DeleteForm::Key,
            (true, false) => DeleteForm::Prefix,
            (true, true) => DeleteForm::PrefixInTxn,
        };
        let waiting = match &input {
            Input::Get => {
                let (tx, rx) = oneshot::channel();
                world.nodes[member].reads.push(ReadWait { reply: tx });
                Waiting::Read(rx)
            }
            _ => {
                let id = self.proposal_id(member);
                let data = encode(id, &key_name(key), &input, delete);
                let (tx, rx) = oneshot::channel();
                let node = &mut world.nodes[member];
                if node.proposals.len() >= MAILBOX_PROPOSALS_MAX {
                    let _ = tx.send(Err(EtcdError::TooManyRequests));
                } else {
                    node.proposals.push_back(Proposal {
                        data,
                        id,
                        reply: tx.into(),
                    });
                }
                Waiting::Write(rx)
            }
        };
        let call_at = self.tick(world.now_ms);
        self.clients[c].call = Some(Call {
            key,
            input,
            call_at,
            member,
            waiting,
            give_up_ms: world.now_ms + 3 * REQUEST_TIMEOUT_MS,
        });
    }

    /// A proposal id as member `member`'s shards make them: unique per member (its id in the
    /// high bits, as `Shared::next_proposal_id`), so entries proposed elsewhere never answer
    /// this member's waiters.
    fn proposal_id(&mut self, member: usize) -> u64 {
        self.next_proposal_id += 1;
        (crate::world::member_id(member) << 40) | self.next_proposal_id
    }

    /// Whether client `c` waits for no answer.
    pub fn idle(&self, c: usize) -> bool {
        self.clients[c].call.is_none()
    }

    /// Client 0 reads `key` through `member` (it must be idle).
    pub fn read_through(&mut self, world: &mut World, member: usize, key: usize) {
        assert!(self.clients[0].call.is_none(), "client 0 is busy");
        if !world.is_up(member) {
            return;
        }
        let (tx, rx) = oneshot::channel();
        world.nodes[member].reads.push(ReadWait { reply: tx });
        let call_at = self.tick(world.now_ms);
        self.clients[0].call = Some(Call {
            key,
            input: Input::Get,
            call_at,
            member,
            waiting: Waiting::Read(rx),
            give_up_ms: world.now_ms + 3 * REQUEST_TIMEOUT_MS,
        });
    }

    /// Compacts to a recent revision, as an operator or the auto-compactor would; nobody waits.
    fn compact(&mut self, world: &mut World, member: usize) {
        let Some(run) = world.nodes[member].run.as_ref() else {
            return;
        };
        let revision = run.reader.current_revision() - world.rng.gen_range(0..20);
        if revision <= run.reader.compact_revision() {
            return;
        }
        let id = self.proposal_id(member);
        let (tx, _rx) = oneshot::channel();
        let node = &mut world.nodes[member];
        if node.proposals.len() < MAILBOX_PROPOSALS_MAX {
            node.proposals.push_back(Proposal {
                data: keel_core::compactor::compaction_entry(id, revision),
                id,
                reply: tx.into(),
            });
            self.compactions += 1;
        }
    }
}

impl Clients {
    /// Puts one of `key`'s filler keys, as a client that does not wait for the answer: the
    /// history never sees fillers (no call reads them), only the prefix deletes that span them.
    fn put_filler(&mut self, world: &mut World, member: usize, key: usize) {
        let filler = format!(
            "{}/f{}",
            key_name(key),
            world.rng.gen_range(0..FILLERS_PER_KEY)
        );
        let id = self.proposal_id(member);
        let (tx, _rx) = oneshot::channel();
        let node = &mut world.nodes[member];
        if node.proposals.len() < MAILBOX_PROPOSALS_MAX {
            node.proposals.push_back(Proposal {
                data: encode(
                    id,
                    &filler,
                    &Input::Put {
                        value: b"filler".to_vec(),
                    },
                    DeleteForm::Key,
                ),
                id,
                reply: tx.into(),
            });
        }
    }
}

/// Errors that mean the write never entered the log: raft refused or dropped the proposal
/// (no leader, a leadership transfer, too much uncommitted), here or at the leader.
fn refused_before_the_log(e: EtcdError) -> bool {
    matches!(
        e,
        EtcdError::NoLeader | EtcdError::TooManyRequests | EtcdError::NotLeader
    )
}

/// How a delete is proposed.
#[derive(Clone, Copy)]
enum DeleteForm {
    /// The key alone.
    Key,
    /// The key's prefix (the key, its fillers), asking for the deleted pairs, to tell the
    /// key's own from theirs.
    Prefix,
    /// The same in a txn without compares.
    PrefixInTxn,
}

/// The proposal a shard would make for a write.
fn encode(id: u64, key: &str, input: &Input, delete: DeleteForm) -> Bytes {
    let put = |value: &[u8]| pb::PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value),
        ..Default::default()
    };
    let mut req = pb::InternalRaftRequest {
        header: Some(pb::RequestHeader {
            id,
            ..Default::default()
        }),
        ..Default::default()
    };
    match input {
        Input::Put { value } => req.put = Some(put(value)),
        Input::Delete => {
            let prefix = pb::DeleteRangeRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                range_end: Bytes::from(prefix_end(key)),
                prev_kv: true,
            };
            match delete {
                DeleteForm::Key => {
                    req.delete_range = Some(pb::DeleteRangeRequest {
                        key: Bytes::copy_from_slice(key.as_bytes()),
                        ..Default::default()
                    })
                }
                DeleteForm::Prefix => req.delete_range = Some(prefix),
                DeleteForm::PrefixInTxn => {
                    req.txn = Some(pb::TxnRequest {
                        compare: Vec::new(),
                        success: vec![pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestDeleteRange(prefix)),
                        }],
                        failure: Vec::new(),
                    })
                }
            }
        }
        Input::Cas { compare, value } => {
            let (target, union) = match compare {
                Compare::ModRevision(r) => (
                    pb::compare::CompareTarget::Mod,
                    pb::compare::TargetUnion::ModRevision(*r),
                ),
                Compare::Value(v) => (
                    pb::compare::CompareTarget::Value,
                    pb::compare::TargetUnion::Value(Bytes::copy_from_slice(v)),
                ),
            };
            let mut compare = vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: target as i32,
                key: Bytes::copy_from_slice(key.as_bytes()),
                target_union: Some(union),
                ..Default::default()
            }];
            let mut success = vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(put(value))),
            }];
            if id % 2 == 1 {
                // Half the CAS txns (by id, so the seed's draws stay as they were) first
                // compare every key, a compare that always holds (every create revision is
                // below i64::MAX, and so is an empty range's zero), and read every key after
                // their put: both walk the whole store in steps of `APPLY_KEYS_PER_STEP`
                // keys, across loop turns, crashes and snapshots, and answer as before.
                compare.insert(
                    0,
                    pb::Compare {
                        result: pb::compare::CompareResult::Less as i32,
                        target: pb::compare::CompareTarget::Create as i32,
                        key: Bytes::from_static(b"\0"),
                        range_end: Bytes::from_static(b"\0"),
                        target_union: Some(pb::compare::TargetUnion::CreateRevision(i64::MAX)),
                    },
                );
                success.push(pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                        key: Bytes::from_static(b"\0"),
                        range_end: Bytes::from_static(b"\0"),
                        keys_only: true,
                        ..Default::default()
                    })),
                });
            }
            req.txn = Some(pb::TxnRequest {
                compare,
                success,
                failure: Vec::new(),
            });
        }
        Input::Get => unreachable!("reads are not proposed"),
    }
    Bytes::from(req.encode_to_vec())
}

/// The end of `key`'s prefix range, as etcdctl's `--prefix` makes it.
fn prefix_end(key: &str) -> Vec<u8> {
    let mut end = key.as_bytes().to_vec();
    let last = end.last_mut().expect("keys are not empty");
    assert!(*last < 0xff, "the simulation's keys end below 0xff");
    *last += 1;
    end
}

fn write_output(input: &Input, key: &str, outcome: Unserved) -> Output {
    let Answer::Op(response) = outcome.response else {
        panic!("a key-value write answered with alarms");
    };
    let response = match (input, response.check()) {
        // A prefix delete in a txn answers as the delete it holds.
        (Input::Delete, kv::OpResponse::Txn(mut r)) => match r.responses.pop() {
            Some(kv::ResponseOp::DeleteRange(d)) if r.responses.is_empty() => {
                kv::OpResponse::DeleteRange(d)
            }
            other => panic!("{other:?} does not answer a txn of one delete"),
        },
        (_, response) => response,
    };
    match (input, response) {
        (Input::Put { .. }, kv::OpResponse::Put(r)) => Output::Put {
            revision: r.revision,
        },
        // A prefix delete also removes fillers: its pairs say whether the key was among them.
        (Input::Delete, kv::OpResponse::DeleteRange(r)) if !r.prev_kvs.is_empty() => {
            Output::Delete {
                deleted: r
                    .prev_kvs
                    .iter()
                    .filter(|kv| kv.key == key.as_bytes())
                    .count() as u64,
            }
        }
        (Input::Delete, kv::OpResponse::DeleteRange(r)) => Output::Delete {
            deleted: r.deleted as u64,
        },
        (Input::Cas { .. }, kv::OpResponse::Txn(r)) => {
            if let Some(kv::ResponseOp::Range(read)) = r.responses.get(1) {
                // The read of every key after the put: it sees the put's own write.
                assert!(
                    read.kvs.iter().any(|kv| kv.key == key.as_bytes()),
                    "a txn's read of every key misses {key}, which its put wrote: {read:?}"
                );
                assert_eq!(read.count, read.kvs.len() as i64, "{read:?}");
            }
            Output::Cas {
                succeeded: r.succeeded,
                revision: r.revision,
            }
        }
        (input, response) => panic!("{response:?} does not answer {input:?}"),
    }
}
