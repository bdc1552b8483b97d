//! Membership as data: which changes are allowed, and the member list each applied change
//! leaves. Raft's configuration (voters, learners) decides who is in; this list adds what etcd
//! reports about each member (name, peer and client URLs, learner or not).
//!
//! Pure functions over member lists: publishing the list (to shards, to the peer transport) is
//! the driver's business.

use std::collections::BTreeSet;

use bytes::Bytes;
use keel_grpc::EtcdError;
use keel_raft::{ConfChange, ConfChangeType, ConfState};
use serde::{Deserialize, Serialize};

use crate::ids::Member;
use crate::shared::MemberChange;

/// The membership change a ConfChange entry carries, as its context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfChangeContext {
    /// Matches the waiting MemberAdd/Remove/Promote call on the member that proposed it.
    pub request_id: u64,
    pub member: Option<Member>,
}

/// What a membership call turns into, once checked against the current members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A raft configuration change (add, remove, promote).
    ConfChange {
        change_type: ConfChangeType,
        node_id: u64,
        member: Member,
    },
    /// A peer-URL change: not a raft membership change, so it travels as a normal entry,
    /// applied in order with everything else.
    Update { id: u64, peer_urls: Vec<String> },
}

/// Checks a membership call against the current members and the removed ids, as etcd does
/// before proposing.
pub fn plan(
    members: &[Member],
    removed: &BTreeSet<u64>,
    change: &MemberChange,
) -> Result<Plan, EtcdError> {
    let find = |id: u64| members.iter().find(|m| m.id == id).cloned();
    match change {
        MemberChange::Add {
            peer_urls,
            learner,
            added_at_unix_s,
        } => {
            if members
                .iter()
                .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
            {
                return Err(EtcdError::PeerUrlExist);
            }
            // etcd keeps at most one learner (`maxLearners`): a learner is a member being
            // brought up, one at a time.
            if *learner && members.iter().any(|m| m.is_learner) {
                return Err(EtcdError::TooManyLearners);
            }
            // etcd's MemberAdd passes an empty cluster name and the time of the call.
            let id = crate::ids::member_id(peer_urls, "", Some(*added_at_unix_s));
            if find(id).is_some() {
                return Err(EtcdError::MemberExist);
            }
            // The same URLs added again within the second they were removed in hash to the
            // removed id: etcd refuses with ErrIDRemoved, which its API answers as "member not
            // found".
            if removed.contains(&id) {
                return Err(EtcdError::MemberNotFound);
            }
            Ok(Plan::ConfChange {
                change_type: if *learner {
                    ConfChangeType::AddLearnerNode
                } else {
                    ConfChangeType::AddNode
                },
                node_id: id,
                member: Member {
                    id,
                    name: String::new(),
                    peer_urls: peer_urls.clone(),
                    client_urls: Vec::new(),
                    is_learner: *learner,
                },
            })
        }
        MemberChange::Remove { id } => match find(*id) {
            None => Err(EtcdError::MemberNotFound),
            Some(m) => Ok(Plan::ConfChange {
                change_type: ConfChangeType::RemoveNode,
                node_id: *id,
                member: m,
            }),
        },
        MemberChange::Promote { id } => match find(*id) {
            None => Err(EtcdError::MemberNotFound),
            Some(m) if !m.is_learner => Err(EtcdError::MemberNotLearner),
            Some(m) => Ok(Plan::ConfChange {
                change_type: ConfChangeType::AddNode,
                node_id: *id,
                member: Member {
                    is_learner: false,
                    ..m
                },
            }),
        },
        MemberChange::Update { id, peer_urls } => match find(*id) {
            None => Err(EtcdError::MemberNotFound),
            // Two members on one peer URL would each take the other's raft messages.
            Some(_) if peer_urls_taken(members, *id, peer_urls) => Err(EtcdError::PeerUrlExist),
            Some(_) => Ok(Plan::Update {
                id: *id,
                peer_urls: peer_urls.clone(),
            }),
        },
    }
}

/// Whether a member has started: it has published its name (etcd's `Member.IsStarted`).
fn started(m: &Member) -> bool {
    !m.name.is_empty()
}

/// etcd's `IsReadyToAddVotingMember` (`promote: false`) and `IsReadyToPromoteMember`
/// (`promote: true`): with one more voter, the voters that have started still make a quorum.
/// A learner being promoted counts as started, as etcd counts it (raft refuses to promote one
/// that has not caught up, so one that did runs). An add to a
/// one-member cluster passes (etcd's case of restoring a cluster from one member).
pub fn ready_for_one_more_voter(members: &[Member], promote: bool) -> bool {
    let voters = members.iter().filter(|m| !m.is_learner);
    let started_count = voters.clone().filter(|m| started(m)).count() + usize::from(promote);
    let after = voters.count() + 1;
    if !promote && started_count == 1 && after == 2 {
        return true;
    }
    started_count > after / 2
}

/// etcd's `IsReadyToRemoveVotingMember`: without voter `id`, the voters that have started
/// still make a quorum of those left.
pub fn ready_to_remove_voter(members: &[Member], id: u64) -> bool {
    let left: Vec<&Member> = members
        .iter()
        .filter(|m| !m.is_learner && m.id != id)
        .collect();
    left.iter().filter(|m| started(m)).count() > left.len() / 2
}

/// Whether a member other than `id` has one of `peer_urls`.
fn peer_urls_taken(members: &[Member], id: u64, peer_urls: &[String]) -> bool {
    members
        .iter()
        .filter(|m| m.id != id)
        .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
}

/// The ConfChange to propose for a planned change, carrying `request_id` so the proposing
/// member can answer its caller when the entry applies.
pub fn conf_change(
    change_type: ConfChangeType,
    node_id: u64,
    member: Member,
    request_id: u64,
) -> ConfChange {
    let context = serde_json::to_vec(&ConfChangeContext {
        request_id,
        member: Some(member),
    })
    .expect("a member and an id always serialize to JSON");
    ConfChange {
        change_type,
        node_id,
        context: Bytes::from(context),
    }
}

/// The member list after an applied ConfChange, given raft's configuration after it (`cs`),
/// and the change's context when it has one.
pub fn after_conf_change(
    members: &[Member],
    cc: &ConfChange,
    cs: &ConfState,
) -> (Vec<Member>, Option<ConfChangeContext>) {
    let ctx: Option<ConfChangeContext> = serde_json::from_slice(&cc.context).ok();
    let mut members = members.to_vec();
    match cc.change_type {
        ConfChangeType::RemoveNode => members.retain(|m| m.id != cc.node_id),
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
            let learner = cc.change_type == ConfChangeType::AddLearnerNode;
            match members.iter_mut().find(|m| m.id == cc.node_id) {
                Some(m) => m.is_learner = learner,
                None => {
                    let mut m = ctx
                        .as_ref()
                        .and_then(|c| c.member.clone())
                        .unwrap_or_else(|| unnamed(cc.node_id, learner));
                    m.is_learner = learner;
                    members.push(m);
                }
            }
        }
    }
    // Raft's view decides who is in: drop anyone it no longer lists.
    members.retain(|m| cs.voters.contains(&m.id) || cs.learners.contains(&m.id));
    (members, ctx)
}

/// The removed member ids after an applied ConfChange: a removal adds its id (etcd's
/// `members_removed`). An addition takes its id out again, so an id that comes back is let
/// in: MemberAdd hashes the time into new ids, as etcd does, but members added by earlier
/// builds have ids derived from their peer URLs alone, and one replaced on the same URLs
/// comes back under the id it was removed with.
pub fn removed_after_conf_change(removed: &BTreeSet<u64>, cc: &ConfChange) -> BTreeSet<u64> {
    let mut removed = removed.clone();
    match cc.change_type {
        ConfChangeType::RemoveNode => {
            removed.insert(cc.node_id);
        }
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
            removed.remove(&cc.node_id);
        }
    }
    removed
}

/// The member list after an applied attributes or peer-URL entry, and the peer-URL change's
/// outcome (None when the entry carried none). A change checked when it was proposed is
/// checked again here, as etcd's apply does: another change applied in between may have
/// taken its URLs, and every member must leave the same list. (A log written by a build
/// without this check may hold such an update, applied then: replayed now, it is refused, so
/// a member that replays it lists other URLs than a peer that holds it in a checkpoint. Only
/// an update that put two members on one URL, which broke that cluster already, does this.)
pub fn after_member_request(
    members: &[Member],
    attributes: Option<(u64, String, Vec<String>)>,
    update: Option<(u64, Vec<String>)>,
) -> (Vec<Member>, Option<Result<(), EtcdError>>) {
    let mut members = members.to_vec();
    if let Some((id, name, client_urls)) = attributes {
        if let Some(m) = members.iter_mut().find(|m| m.id == id) {
            m.name = name;
            m.client_urls = client_urls;
        }
    }
    let updated = update.map(|(id, peer_urls)| {
        if peer_urls_taken(&members, id, &peer_urls) {
            return Err(EtcdError::PeerUrlExist);
        }
        match members.iter_mut().find(|m| m.id == id) {
            Some(m) => {
                m.peer_urls = peer_urls;
                Ok(())
            }
            None => Err(EtcdError::MemberNotFound),
        }
    });
    (members, updated)
}

/// The member list a bootstrap snapshot (no state, membership in its metadata) stands for:
/// the members raft lists, with what `known` says about them.
pub fn from_conf_state(known: &[Member], cs: &ConfState) -> Vec<Member> {
    cs.voters
        .iter()
        .chain(cs.learners.iter())
        .map(|id| {
            known
                .iter()
                .find(|m| m.id == *id)
                .cloned()
                .unwrap_or_else(|| unnamed(*id, cs.learners.contains(id)))
        })
        .collect()
}

/// Whether the members list already carries this member's name and client URLs.
pub fn attributes_published(
    members: &[Member],
    me: u64,
    name: &str,
    client_urls: &[String],
) -> bool {
    members
        .iter()
        .find(|m| m.id == me)
        .is_some_and(|m| m.name == name && m.client_urls == client_urls)
}

fn unnamed(id: u64, is_learner: bool) -> Member {
    Member {
        id,
        name: String::new(),
        peer_urls: Vec::new(),
        client_urls: Vec::new(),
        is_learner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, url: &str, is_learner: bool) -> Member {
        Member {
            id,
            name: format!("m{id}"),
            peer_urls: vec![url.to_string()],
            client_urls: Vec::new(),
            is_learner,
        }
    }

    fn two() -> Vec<Member> {
        vec![
            member(1, "http://a:2380", false),
            member(2, "http://b:2380", true),
        ]
    }

    #[test]
    fn strict_checks_count_started_voters_as_etcd_does() {
        let named = |id: u64, learner: bool| member(id, &format!("http://m{id}:2380"), learner);
        // Added, never started: no name published yet.
        let unstarted = |id: u64| Member {
            name: String::new(),
            ..member(id, &format!("http://m{id}:2380"), false)
        };
        // One started member: a second voter may be added (a cluster restored from one).
        let one = vec![named(1, false)];
        assert!(ready_for_one_more_voter(&one, false));
        // Two voters, one never started: a third voter would need two of three started.
        let half = vec![named(1, false), unstarted(2)];
        assert!(!ready_for_one_more_voter(&half, false));
        // Three started voters and one that never started: a fifth needs three of five.
        let four = vec![
            named(1, false),
            named(2, false),
            named(3, false),
            unstarted(4),
        ];
        assert!(ready_for_one_more_voter(&four, false));
        // Promotion counts the learner as started: one voter may promote its learner (how
        // a one-member cluster grows), and so may a started voter beside one that never
        // started (two of three), but not beside two (two of four).
        assert!(ready_for_one_more_voter(
            &[named(1, false), named(2, true)],
            true
        ));
        assert!(ready_for_one_more_voter(
            &[named(1, false), unstarted(3), named(2, true)],
            true
        ));
        assert!(!ready_for_one_more_voter(
            &[named(1, false), unstarted(3), unstarted(4), named(2, true)],
            true
        ));
        assert!(ready_for_one_more_voter(
            &[named(1, false), named(3, false), named(2, true)],
            true
        ));
        // Removal: the voters left must have a started quorum.
        assert!(ready_to_remove_voter(&four, 4));
        assert!(ready_to_remove_voter(&four, 1), "2 of 3 left started");
        let two_unstarted = vec![named(1, false), named(2, false), unstarted(3), unstarted(4)];
        assert!(!ready_to_remove_voter(&two_unstarted, 2), "1 of 3 left");
        // Learners never count.
        assert!(ready_to_remove_voter(&[named(1, false), named(2, true)], 2));
    }

    #[test]
    fn plan_refuses_what_etcd_refuses() {
        let ms = two();
        // A second learner: etcd keeps at most one.
        let learner = |url: &str| MemberChange::Add {
            peer_urls: vec![url.into()],
            learner: true,
            added_at_unix_s: 1_700_000_000,
        };
        assert_eq!(
            plan(&ms, &BTreeSet::new(), &learner("http://c:2380")),
            Err(EtcdError::TooManyLearners)
        );
        let voters = vec![member(1, "http://a:2380", false)];
        assert!(plan(&voters, &BTreeSet::new(), &learner("http://c:2380")).is_ok());
        // A peer-URL update onto another member's URL.
        let onto_b = MemberChange::Update {
            id: 1,
            peer_urls: vec!["http://a2:2380".into(), "http://b:2380".into()],
        };
        assert_eq!(
            plan(&ms, &BTreeSet::new(), &onto_b),
            Err(EtcdError::PeerUrlExist)
        );
        let own = MemberChange::Update {
            id: 2,
            peer_urls: vec!["http://b:2380".into(), "http://b2:2380".into()],
        };
        assert!(plan(&ms, &BTreeSet::new(), &own).is_ok());
        let add_taken = MemberChange::Add {
            peer_urls: vec!["http://a:2380".into()],
            learner: false,
            added_at_unix_s: 1_700_000_000,
        };
        assert_eq!(
            plan(&ms, &BTreeSet::new(), &add_taken),
            Err(EtcdError::PeerUrlExist)
        );
        // Re-added within the second of its removal: the same id, refused as etcd refuses it.
        let again = MemberChange::Add {
            peer_urls: vec!["http://c:2380".into()],
            learner: false,
            added_at_unix_s: 1_700_000_000,
        };
        let Ok(Plan::ConfChange { node_id, .. }) = plan(&ms, &BTreeSet::new(), &again) else {
            panic!("a new URL is planned");
        };
        assert_eq!(
            plan(&ms, &BTreeSet::from([node_id]), &again),
            Err(EtcdError::MemberNotFound)
        );
        assert_eq!(
            plan(&ms, &BTreeSet::new(), &MemberChange::Remove { id: 9 }),
            Err(EtcdError::MemberNotFound)
        );
        assert_eq!(
            plan(&ms, &BTreeSet::new(), &MemberChange::Promote { id: 1 }),
            Err(EtcdError::MemberNotLearner)
        );
        let update = MemberChange::Update {
            id: 9,
            peer_urls: vec![],
        };
        assert_eq!(
            plan(&ms, &BTreeSet::new(), &update),
            Err(EtcdError::MemberNotFound)
        );
    }

    #[test]
    fn an_add_applies_with_the_member_its_context_names() {
        // Two voters: a learner is added only where there is none.
        let ms = vec![
            member(1, "http://a:2380", false),
            member(2, "http://b:2380", false),
        ];
        let add = MemberChange::Add {
            peer_urls: vec!["http://c:2380".into()],
            learner: true,
            added_at_unix_s: 1_700_000_000,
        };
        let Ok(Plan::ConfChange {
            change_type,
            node_id,
            member,
        }) = plan(&ms, &BTreeSet::new(), &add)
        else {
            panic!("an add of a new URL is planned as a conf change");
        };
        assert_eq!(change_type, ConfChangeType::AddLearnerNode);
        let cc = conf_change(change_type, node_id, member.clone(), 42);
        let cs = ConfState {
            voters: vec![1, 2],
            learners: vec![node_id],
        };
        let (after, ctx) = after_conf_change(&ms, &cc, &cs);
        assert_eq!(ctx.map(|c| c.request_id), Some(42));
        assert_eq!(after.len(), 3);
        assert_eq!(after[2], member);
    }

    #[test]
    fn promote_and_remove_follow_raft_configuration() {
        let ms = two();
        let Ok(Plan::ConfChange {
            change_type,
            node_id,
            member,
        }) = plan(&ms, &BTreeSet::new(), &MemberChange::Promote { id: 2 })
        else {
            panic!("promoting a learner is a conf change");
        };
        let cc = conf_change(change_type, node_id, member, 1);
        let cs = ConfState {
            voters: vec![1, 2],
            learners: vec![],
        };
        let (after, _) = after_conf_change(&ms, &cc, &cs);
        assert!(after.iter().all(|m| !m.is_learner));
        let remove = conf_change(ConfChangeType::RemoveNode, 1, after[0].clone(), 2);
        let cs = ConfState {
            voters: vec![2],
            learners: vec![],
        };
        let (after, _) = after_conf_change(&after, &remove, &cs);
        assert_eq!(after.iter().map(|m| m.id).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn removals_are_remembered_until_the_id_is_added_again() {
        let remove = conf_change(
            ConfChangeType::RemoveNode,
            2,
            member(2, "http://b:2380", false),
            1,
        );
        let removed = removed_after_conf_change(&BTreeSet::new(), &remove);
        assert_eq!(removed, BTreeSet::from([2]));
        let promote = conf_change(
            ConfChangeType::AddNode,
            1,
            member(1, "http://a:2380", false),
            2,
        );
        assert_eq!(removed_after_conf_change(&removed, &promote), removed);
        // Re-added on the same peer URLs, so under the same id: let in again.
        let again = conf_change(
            ConfChangeType::AddLearnerNode,
            2,
            member(2, "http://b:2380", true),
            3,
        );
        assert!(removed_after_conf_change(&removed, &again).is_empty());
    }

    #[test]
    fn member_requests_set_attributes_and_peer_urls() {
        let ms = two();
        let (after, updated) = after_member_request(
            &ms,
            Some((2, "two".into(), vec!["http://b:2379".into()])),
            Some((1, vec!["http://z:2380".into()])),
        );
        assert_eq!(updated, Some(Ok(())));
        assert!(attributes_published(
            &after,
            2,
            "two",
            &["http://b:2379".to_string()]
        ));
        assert!(!attributes_published(&after, 1, "two", &[]));
        assert_eq!(after[0].peer_urls, vec!["http://z:2380".to_string()]);
        let (_, updated) = after_member_request(&ms, None, Some((9, vec![])));
        assert_eq!(updated, Some(Err(EtcdError::MemberNotFound)));
        // Another member's URL, taken between the proposal and its apply: refused, and the
        // list left as it was on every member.
        let (kept, updated) =
            after_member_request(&ms, None, Some((1, vec!["http://b:2380".into()])));
        assert_eq!(updated, Some(Err(EtcdError::PeerUrlExist)));
        assert_eq!(kept, ms);
        // Its own URLs again, or some of them: fine.
        let (_, updated) = after_member_request(&ms, None, Some((1, vec!["http://a:2380".into()])));
        assert_eq!(updated, Some(Ok(())));
    }

    #[test]
    fn a_bootstrap_snapshot_names_members_raft_lists() {
        let known = vec![member(1, "http://a:2380", false)];
        let cs = ConfState {
            voters: vec![1, 3],
            learners: vec![4],
        };
        let ms = from_conf_state(&known, &cs);
        assert_eq!(ms[0], known[0]);
        assert_eq!((ms[1].id, ms[1].is_learner), (3, false));
        assert_eq!((ms[2].id, ms[2].is_learner), (4, true));
    }
}
