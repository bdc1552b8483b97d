//! Lease clients and the lease invariant: a lease never expires before its TTL has passed
//! since the last keep-alive that the cluster answered, measured on the leader's clock (which
//! may run up to `MAX_SKEW_PPM` fast against simulated time).
//!
//! Each lease client grants a lease through raft, attaches a key to it, and keeps it alive
//! through random members (followers forward to the leader) at random intervals, sometimes
//! longer than the TTL (so leases do expire). A member applying the lease's revoke is seen as
//! the lease leaving its store between two steps of the same process; the earliest such
//! moment must be at least TTL (shrunk by the fastest clock) after the last keep-alive that
//! was sent and then answered with the lease's TTL.

use bytes::Bytes;
use futures_channel::oneshot;
use keel_core::shared::{Proposal, Query, Unserved};
use keel_grpc::EtcdError;
use keel_proto::etcdserverpb as pb;
use prost::Message as _;
use rand::Rng;

use crate::world::{member_id, Bug, World, MAILBOX_PROPOSALS_MAX};

/// The fastest a member's clock runs against simulated time (see `World::new`).
pub const MAX_SKEW_PPM: u64 = 50_000;

enum Pending {
    Grant(oneshot::Receiver<Result<Unserved, EtcdError>>),
    KeepAlive {
        sent_ms: u64,
        member: usize,
        rx: oneshot::Receiver<Result<i64, EtcdError>>,
    },
}

struct TrackedLease {
    id: i64,
    ttl_s: i64,
    /// When a keep-alive (or the grant) that the cluster answered was sent: the lease lives
    /// at least TTL from then.
    alive_since_ms: Option<u64>,
    /// Per member: the process incarnation that last had the lease in its store.
    seen_in: Vec<Option<u64>>,
    revoked_at_ms: Option<u64>,
}

pub struct LeaseClient {
    lease: Option<TrackedLease>,
    pending: Option<Pending>,
    next_ms: u64,
}

pub struct LeaseClients {
    clients: Vec<LeaseClient>,
    next_lease_id: i64,
    pub granted: u64,
    pub keepalives: u64,
    /// Keep-alives a shard answered without its raft core.
    pub shard_renewals: u64,
    pub expired: u64,
}

impl LeaseClients {
    pub fn new(count: usize) -> LeaseClients {
        LeaseClients {
            clients: (0..count)
                .map(|_| LeaseClient {
                    lease: None,
                    pending: None,
                    next_ms: 0,
                })
                .collect(),
            next_lease_id: 1,
            granted: 0,
            keepalives: 0,
            shard_renewals: 0,
            expired: 0,
        }
    }

    pub fn step(&mut self, world: &mut World, issue: bool) {
        for c in 0..self.clients.len() {
            self.collect(world, c);
            let client = &self.clients[c];
            if issue && client.pending.is_none() && world.now_ms >= client.next_ms {
                self.issue(world, c);
            }
        }
        self.check(world);
    }

    fn collect(&mut self, world: &mut World, c: usize) {
        let client = &mut self.clients[c];
        let Some(pending) = client.pending.as_mut() else {
            return;
        };
        match pending {
            Pending::Grant(rx) => match rx.try_recv() {
                Ok(None) => return,
                Ok(Some(Ok(_))) => {
                    self.granted += 1;
                }
                // Refused before the log: there is no such lease.
                Ok(Some(Err(
                    EtcdError::NoLeader | EtcdError::TooManyRequests | EtcdError::NotLeader,
                ))) => client.lease = None,
                // Unknown or refused: the lease may exist; it is tracked either way, and
                // expires unkept if it does.
                Ok(Some(Err(_))) | Err(_) => {}
            },
            Pending::KeepAlive {
                sent_ms,
                member,
                rx,
            } => match rx.try_recv() {
                Ok(None) => return,
                Ok(Some(Ok(ttl_s))) => {
                    let lease = client.lease.as_mut().expect("kept alive");
                    if ttl_s > 0 {
                        // An answer may arrive late (the member that forwarded it was paused),
                        // so only a keep-alive sent after the revoke must not be answered alive.
                        assert!(
                            lease.revoked_at_ms.is_none_or(|revoked| *sent_ms < revoked),
                            "lease {:x} was kept alive (TTL {ttl_s}) through m{member}, asked at \
                             {sent_ms} ms, after its revoke was applied at {:?} ms\n{}",
                            lease.id,
                            lease.revoked_at_ms,
                            world.trace()
                        );
                        lease.alive_since_ms = Some(*sent_ms);
                        self.keepalives += 1;
                        let (id, sent, via) = (lease.id, *sent_ms, *member);
                        world.note(|| {
                            format!("lease {id:x} kept alive via m{via} (sent at {sent} ms)")
                        });
                    } else {
                        // The leader knows no such lease (never granted, or revoked): the
                        // client grants a new one.
                        client.lease = None;
                    }
                }
                Ok(Some(Err(_))) | Err(_) => {}
            },
        }
        client.pending = None;
        client.next_ms = world.now_ms + world.rng.gen_range(0..400);
    }

    fn issue(&mut self, world: &mut World, c: usize) {
        let member = world.rng.gen_range(0..world.nodes.len());
        if !world.is_up(member) {
            self.clients[c].next_ms = world.now_ms + 5;
            return;
        }
        let needs_lease = self.clients[c]
            .lease
            .as_ref()
            .is_none_or(|l| l.revoked_at_ms.is_some());
        if needs_lease {
            let id = self.next_lease_id << 8 | c as i64;
            self.next_lease_id += 1;
            let ttl_s = world.rng.gen_range(1..=2);
            let req = pb::InternalRaftRequest {
                header: Some(pb::RequestHeader {
                    id: (member_id(member) << 40) | (1 << 39) | id as u64,
                    ..Default::default()
                }),
                lease_grant: Some(pb::LeaseGrantRequest { ttl: ttl_s, id }),
                ..Default::default()
            };
            let (tx, rx) = oneshot::channel();
            let node = &mut world.nodes[member];
            if node.proposals.len() >= MAILBOX_PROPOSALS_MAX {
                return;
            }
            let header_id = req.header.as_ref().expect("set").id;
            node.proposals.push_back(Proposal {
                data: Bytes::from(req.encode_to_vec()),
                id: header_id,
                reply: tx.into(),
            });
            let n = world.nodes.len();
            self.clients[c].lease = Some(TrackedLease {
                id,
                ttl_s,
                // The grant's own call counts as a keep-alive once answered; until then the
                // lease may only live longer, so the send time is a safe lower bound.
                alive_since_ms: Some(world.now_ms),
                seen_in: vec![None; n],
                revoked_at_ms: None,
            });
            self.clients[c].pending = Some(Pending::Grant(rx));
            return;
        }
        let id = self.clients[c].lease.as_ref().expect("has one").id;
        let (tx, rx) = oneshot::channel();
        // Half the keep-alives go the production way for a leader's shard: renewed on the
        // shard when the member's window allows, else asked of the raft core. The shard runs
        // even while the member is paused (a raft core that stopped turning).
        let on_shard = world.rng.gen_bool(0.5).then(|| {
            let now_ms = world.clock_ms(member);
            let run = world.nodes[member].run.as_ref().expect("up");
            let deadlines = run.member.lease_deadlines();
            if world.config.bug == Bug::ShardRenewsAnywhere {
                // Forced open for this one renewal; the member's next turn sets it again.
                deadlines.set_window(u64::MAX);
            }
            deadlines.renew_here(id, || now_ms)
        });
        if let Some(Some(ttl_s)) = on_shard {
            self.shard_renewals += 1;
            let _ = tx.send(Ok(ttl_s));
        } else {
            world.nodes[member]
                .queries
                .push(Query::KeepAlive { id, reply: tx });
        }
        self.clients[c].pending = Some(Pending::KeepAlive {
            sent_ms: world.now_ms,
            member,
            rx,
        });
    }

    /// A lease that left a member's store (a revoke applied there, by the same process that
    /// had it) must have outlived its TTL since the last answered keep-alive.
    fn check(&mut self, world: &World) {
        for client in &mut self.clients {
            let Some(lease) = client.lease.as_mut() else {
                continue;
            };
            // Members added since the grant start unknown.
            lease.seen_in.resize(world.nodes.len(), None);
            for (i, node) in world.nodes.iter().enumerate() {
                let Some(run) = node.run.as_ref() else {
                    lease.seen_in[i] = None;
                    continue;
                };
                let incarnation = world.incarnation(i);
                let present = run.member.writer().lease(lease.id).is_some();
                if present {
                    lease.seen_in[i] = Some(incarnation);
                    continue;
                }
                if lease.seen_in[i] != Some(incarnation) {
                    continue;
                }
                lease.seen_in[i] = None;
                if lease.revoked_at_ms.is_some() {
                    continue;
                }
                lease.revoked_at_ms = Some(world.now_ms);
                self.expired += 1;
                let id = lease.id;
                world.note(|| format!("lease {id:x} left m{i}'s store"));
                let since = lease.alive_since_ms.expect("set at the grant");
                let ttl_ms = lease.ttl_s as u64 * 1_000;
                let lived_ms = world.now_ms - since;
                let at_least_ms = ttl_ms * 1_000_000 / (1_000_000 + MAX_SKEW_PPM);
                assert!(
                    lived_ms >= at_least_ms,
                    "lease {:x} (TTL {} s) was revoked on m{i} {lived_ms} ms after its last \
                     answered keep-alive was sent (at least {at_least_ms} ms due)\n{}",
                    lease.id,
                    lease.ttl_s,
                    world.trace()
                );
            }
        }
    }
}
