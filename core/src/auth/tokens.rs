//! etcd's simple tokens (etcd/auth/simple_token.go): "<16 random letters>.<raft index>". The
//! proposing shard draws the letters, the entry carries them, and every member assigns the same
//! token when it applies the Authenticate entry at that index. A token lives `--auth-token-ttl`
//! seconds after its last use on this member (each use restarts it, as etcd's TTL keeper does),
//! and dies with its user's deletion or password change, with auth disable, and with a restart.
//!
//! The member owns the table; shards read its published copy, and a use restarts the TTL
//! through the entry's atomic deadline, so the request path takes no lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::Rng;

/// etcd's simple-token prefix length and alphabet.
pub const PREFIX_LEN: usize = 16;
const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// Tokens one member keeps. etcd keeps any number; past this the token nearest its expiry goes
/// first, so a client that logs in in a loop cannot grow the table without bound.
pub const TOKENS_MAX: usize = 64 * 1024;

/// One live token.
#[derive(Debug)]
pub struct TokenEntry {
    pub user: String,
    /// `--auth-token-ttl`: each use moves the deadline this far ahead.
    ttl_ms: u64,
    /// On the member's clock (`Shared::uptime_ms`); shards move it forward on each use.
    expires_at_ms: AtomicU64,
}

/// The live tokens of this member.
#[derive(Debug, Clone, Default)]
pub struct TokenTable {
    tokens: HashMap<String, Arc<TokenEntry>>,
}

impl TokenTable {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The user of a live token, restarting its TTL; None for an unknown or expired token.
    pub fn touch(&self, token: &str, now_ms: u64) -> Option<String> {
        let entry = self.tokens.get(token)?;
        let expires_at_ms = entry.expires_at_ms.load(Ordering::Acquire);
        if expires_at_ms <= now_ms {
            return None;
        }
        // The TTL in force is the distance the deadline was set at: keep it.
        entry
            .expires_at_ms
            .fetch_max(now_ms + entry.ttl_ms, Ordering::AcqRel);
        Some(entry.user.clone())
    }

    /// Assigns a token applied from the log.
    pub fn assign(&mut self, token: String, user: &str, now_ms: u64, ttl_ms: u64) {
        assert!(ttl_ms > 0, "a token lives a while");
        if self.tokens.len() >= TOKENS_MAX && !self.tokens.contains_key(&token) {
            let soonest = self
                .tokens
                .iter()
                .min_by_key(|(_, e)| e.expires_at_ms.load(Ordering::Acquire))
                .map(|(t, _)| t.clone());
            if let Some(t) = soonest {
                self.tokens.remove(&t);
            }
        }
        self.tokens.insert(
            token,
            Arc::new(TokenEntry {
                user: user.to_string(),
                ttl_ms,
                expires_at_ms: AtomicU64::new(now_ms + ttl_ms),
            }),
        );
        assert!(self.tokens.len() <= TOKENS_MAX);
    }

    /// Forgets every token of `user` (deleted, or its password changed).
    pub fn invalidate_user(&mut self, user: &str) -> bool {
        let before = self.tokens.len();
        self.tokens.retain(|_, e| e.user != user);
        self.tokens.len() != before
    }

    pub fn clear(&mut self) -> bool {
        let had = !self.tokens.is_empty();
        self.tokens.clear();
        had
    }

    /// Whether some token is past its deadline (what `expire` would drop).
    pub fn any_expired(&self, now_ms: u64) -> bool {
        self.tokens
            .values()
            .any(|e| e.expires_at_ms.load(Ordering::Acquire) <= now_ms)
    }

    /// Drops tokens past their deadline; whether any went.
    pub fn expire(&mut self, now_ms: u64) -> bool {
        let before = self.tokens.len();
        self.tokens
            .retain(|_, e| e.expires_at_ms.load(Ordering::Acquire) > now_ms);
        self.tokens.len() != before
    }
}

/// A fresh random token prefix (etcd's genTokenPrefix).
pub fn new_prefix() -> String {
    let mut rng = rand::thread_rng();
    (0..PREFIX_LEN)
        .map(|_| char::from(LETTERS[rng.gen_range(0..LETTERS.len())]))
        .collect()
}

/// The raft index a simple token names, when it has etcd's shape.
pub fn token_index(token: &str) -> Option<u64> {
    let (prefix, index) = token.split_once('.')?;
    if prefix.contains('.') || index.contains('.') {
        return None;
    }
    index.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_lives_its_ttl_after_its_last_use() {
        let ttl = 300_000;
        let mut t = TokenTable::default();
        t.assign("abc.5".into(), "u", 1_000, ttl);
        assert_eq!(t.touch("abc.5", 1_000 + ttl - 1), Some("u".into()));
        // The use restarted the TTL.
        assert_eq!(t.touch("abc.5", 1_000 + ttl + 10), Some("u".into()));
        assert!(!t.any_expired(1_000 + 2 * ttl - 2));
        assert!(!t.expire(1_000 + 2 * ttl - 2));
        assert!(t.any_expired(1_000 + 3 * ttl));
        assert!(t.expire(1_000 + 3 * ttl));
        assert!(!t.any_expired(u64::MAX));
        assert_eq!(t.touch("abc.5", 0), None);
    }

    /// The member's sweep sees a token due, and a shard that read the clock a moment earlier
    /// renews it through the published copy before the sweep drops it: the token stays.
    #[test]
    fn a_token_renewed_between_the_sweeps_look_and_its_drop_stays() {
        let mut t = TokenTable::default();
        t.assign("abc.5".into(), "u", 0, 10);
        let published = t.clone();
        assert!(t.any_expired(10));
        assert_eq!(published.touch("abc.5", 9), Some("u".into()));
        assert!(!t.expire(10), "renewed in between: kept");
        assert_eq!(t.touch("abc.5", 18), Some("u".into()));
    }

    #[test]
    fn tokens_die_with_their_user_and_the_table_is_bounded() {
        let mut t = TokenTable::default();
        t.assign("a.1".into(), "u", 0, 10);
        t.assign("b.2".into(), "v", 0, 10);
        assert!(t.invalidate_user("u"));
        assert_eq!(t.touch("a.1", 1), None);
        assert_eq!(t.len(), 1);
        for i in 0..TOKENS_MAX + 3 {
            t.assign(format!("x.{i}"), "w", i as u64, 10);
        }
        assert_eq!(t.len(), TOKENS_MAX);
        assert!(t.clear());
        assert!(t.is_empty());
    }

    #[test]
    fn token_shapes() {
        let p = new_prefix();
        assert_eq!(p.len(), PREFIX_LEN);
        assert!(p.bytes().all(|b| b.is_ascii_alphabetic()));
        assert_eq!(token_index(&format!("{p}.42")), Some(42));
        assert_eq!(token_index("nodot"), None);
        assert_eq!(token_index("a.b.3"), None);
        assert_eq!(token_index("a.x"), None);
    }
}
