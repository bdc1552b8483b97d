//! The leader's lease clock: when each lease expires, and which expired leases already have a
//! revoke in flight.
//!
//! Leases are replicated state (keel-kv's Writer holds them); their countdowns are not. Only the
//! leader's clock counts, as in etcd: a new leader, or a member that starts, restarts every
//! countdown from the full TTL. Time is the member's millisecond clock, passed in.

use std::collections::BTreeMap;

/// How long a leader waits before proposing the revoke of an expired lease again, when the
/// first revoke has not been applied (lost with a leader change, or still in flight).
pub const REVOKE_RETRY_MS: u64 = 1000;

/// Lease countdowns by lease id. `BTreeMap`s so expiry proposes revokes in one order on every run.
#[derive(Debug, Default)]
pub struct LeaseClock {
    /// When each lease expires, on the member's clock.
    deadlines_ms: BTreeMap<i64, u64>,
    /// Leases whose revoke was proposed, and when.
    revoke_proposed_at_ms: BTreeMap<i64, u64>,
}

fn ttl_ms(ttl_s: i64) -> u64 {
    (ttl_s.max(0) as u64).saturating_mul(1000)
}

impl LeaseClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Restarts every countdown from its full TTL (`(lease id, ttl_s)` pairs) and forgets the
    /// revokes in flight: on start and on becoming leader, since the old leader's clock is gone.
    pub fn restart(&mut self, leases: impl IntoIterator<Item = (i64, i64)>, now_ms: u64) {
        self.deadlines_ms = leases
            .into_iter()
            .map(|(id, ttl_s)| (id, now_ms.saturating_add(ttl_ms(ttl_s))))
            .collect();
        self.revoke_proposed_at_ms.clear();
    }

    /// Starts or restarts one lease's countdown (a grant applied, or a keep-alive on the leader).
    pub fn renew(&mut self, id: i64, ttl_s: i64, now_ms: u64) {
        self.deadlines_ms
            .insert(id, now_ms.saturating_add(ttl_ms(ttl_s)));
    }

    /// Forgets a lease whose revoke was applied.
    pub fn forget(&mut self, id: i64) {
        self.deadlines_ms.remove(&id);
        self.revoke_proposed_at_ms.remove(&id);
    }

    /// The leases past their deadline whose revoke is not in flight (or was proposed more than
    /// `REVOKE_RETRY_MS` ago), in id order.
    pub fn expired(&self, now_ms: u64) -> Vec<i64> {
        self.deadlines_ms
            .iter()
            .filter(|(id, deadline_ms)| {
                **deadline_ms <= now_ms
                    && self
                        .revoke_proposed_at_ms
                        .get(id)
                        .is_none_or(|at_ms| now_ms.saturating_sub(*at_ms) > REVOKE_RETRY_MS)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether the lease's countdown ran out by `now_ms` (its revoke is due or in flight).
    /// Such a lease is not renewed: its revoke may already be on its way through the log,
    /// as etcd's lessor refuses to renew an expired lease.
    pub fn has_expired(&self, id: i64, now_ms: u64) -> bool {
        self.deadlines_ms
            .get(&id)
            .is_some_and(|deadline_ms| *deadline_ms <= now_ms)
    }

    /// Notes that the revoke of an expired lease was proposed at `now_ms`.
    pub fn revoke_proposed(&mut self, id: i64, now_ms: u64) {
        assert!(
            self.deadlines_ms.contains_key(&id),
            "revoke proposed for lease {id} without a countdown"
        );
        self.revoke_proposed_at_ms.insert(id, now_ms);
    }

    /// Whole seconds left on a lease's countdown (0 once expired), or None without a countdown.
    pub fn remaining_s(&self, id: i64, now_ms: u64) -> Option<i64> {
        self.deadlines_ms
            .get(&id)
            .map(|deadline_ms| (deadline_ms.saturating_sub(now_ms) / 1000) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_at_its_ttl_and_not_before() {
        let mut clock = LeaseClock::new();
        clock.renew(1, 10, 5_000);
        assert!(clock.expired(14_999).is_empty());
        assert_eq!(clock.remaining_s(1, 5_000), Some(10));
        assert_eq!(clock.remaining_s(1, 14_001), Some(0));
        assert_eq!(clock.expired(15_000), vec![1]);
        assert_eq!(clock.remaining_s(1, 20_000), Some(0));
        assert_eq!(clock.remaining_s(2, 20_000), None);
    }

    #[test]
    fn a_keep_alive_pushes_the_deadline_out() {
        let mut clock = LeaseClock::new();
        clock.renew(1, 2, 0);
        clock.renew(1, 2, 1_500);
        assert!(clock.expired(2_000).is_empty());
        assert_eq!(clock.expired(3_500), vec![1]);
    }

    #[test]
    fn an_expired_lease_is_not_renewable() {
        let mut clock = LeaseClock::new();
        clock.renew(7, 2, 1_000);
        assert!(!clock.has_expired(7, 2_999));
        assert!(clock.has_expired(7, 3_000));
        assert!(
            !clock.has_expired(8, 3_000),
            "no countdown, nothing expired"
        );
    }

    #[test]
    fn a_revoke_in_flight_is_proposed_again_only_after_the_retry_interval() {
        let mut clock = LeaseClock::new();
        clock.renew(7, 1, 0);
        assert_eq!(clock.expired(1_000), vec![7]);
        clock.revoke_proposed(7, 1_000);
        assert!(clock.expired(1_500).is_empty());
        assert!(clock.expired(1_000 + REVOKE_RETRY_MS).is_empty());
        assert_eq!(clock.expired(1_001 + REVOKE_RETRY_MS), vec![7]);
        clock.forget(7);
        assert!(clock.expired(100_000).is_empty());
    }

    #[test]
    fn restart_gives_every_lease_its_full_ttl_and_forgets_revokes() {
        let mut clock = LeaseClock::new();
        clock.renew(1, 1, 0);
        clock.revoke_proposed(1, 1_000);
        clock.restart([(1, 5), (2, -3)], 60_000);
        // A negative TTL counts as zero: expired at once.
        assert_eq!(clock.expired(60_000), vec![2]);
        assert_eq!(clock.expired(65_000), vec![1, 2]);
        assert_eq!(clock.remaining_s(1, 60_000), Some(5));
    }
}
