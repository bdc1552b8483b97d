//! A user's merged key permissions, as etcd's range-permission cache keeps them
//! (etcd/auth/range_perm_cache.go): every read and every write interval the user's roles grant,
//! merged into disjoint sorted intervals, so a check is one binary search.
//!
//! etcd's intervals are "bytes-affine": an empty end means "no end" (greater than every key).
//! A permission with an empty range end covers one key (`[key, key\0)`); a range end of "\0"
//! covers every key from `key` on. A request range is permitted when the union of the granted
//! intervals covers all of it (etcd's `IntervalTree.Contains`, where touching intervals are
//! contiguous); a single-key request when some interval holds the key (`Intersects`).

use std::cmp::Ordering;

use keel_proto::authpb;

/// Read or write, as a permission check asks (READWRITE grants both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermType {
    Read,
    Write,
}

/// An interval end: `None` is etcd's empty affine end, past every key.
type End = Option<Vec<u8>>;

/// Compares two ends where `None` is +infinity.
fn cmp_end(a: &End, b: &End) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => a.cmp(b),
    }
}

/// Disjoint, sorted, non-touching intervals `[begin, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct IntervalSet {
    intervals: Vec<(Vec<u8>, End)>,
}

impl IntervalSet {
    fn from_unsorted(mut raw: Vec<(Vec<u8>, End)>) -> IntervalSet {
        raw.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| cmp_end(&a.1, &b.1)));
        let mut merged: Vec<(Vec<u8>, End)> = Vec::with_capacity(raw.len());
        for (begin, end) in raw {
            if let Some(last) = merged.last_mut() {
                // Touching intervals are contiguous too, as in etcd's Contains.
                let touches = match &last.1 {
                    None => true,
                    Some(last_end) => begin.as_slice() <= last_end.as_slice(),
                };
                if touches {
                    if cmp_end(&end, &last.1) == Ordering::Greater {
                        last.1 = end;
                    }
                    continue;
                }
            }
            merged.push((begin, end));
        }
        assert!(
            merged.windows(2).all(|w| w[0]
                .1
                .as_ref()
                .is_some_and(|e| e.as_slice() < w[1].0.as_slice())),
            "merged intervals are disjoint and apart"
        );
        IntervalSet { intervals: merged }
    }

    /// The interval that starts at or before `key`, if any.
    fn candidate(&self, key: &[u8]) -> Option<&(Vec<u8>, End)> {
        let after = self.intervals.partition_point(|(b, _)| b.as_slice() <= key);
        after.checked_sub(1).map(|i| &self.intervals[i])
    }

    /// Some interval holds `key`.
    fn holds(&self, key: &[u8]) -> bool {
        self.candidate(key).is_some_and(|(_, end)| match end {
            None => true,
            Some(end) => key < end.as_slice(),
        })
    }

    /// The intervals cover all of `[begin, end)`.
    fn covers(&self, begin: &[u8], end: &End) -> bool {
        self.candidate(begin)
            .is_some_and(|(_, have)| cmp_end(have, end) != Ordering::Less)
    }
}

/// One user's merged permissions (etcd's `unifiedRangePermissions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangePerms {
    read: IntervalSet,
    write: IntervalSet,
}

impl RangePerms {
    /// Merges the permissions of all of a user's roles.
    pub fn from_perms<'a>(perms: impl IntoIterator<Item = &'a authpb::Permission>) -> RangePerms {
        let mut read = Vec::new();
        let mut write = Vec::new();
        for perm in perms {
            let interval = perm_interval(&perm.key, &perm.range_end);
            match authpb::permission::Type::try_from(perm.perm_type) {
                Ok(authpb::permission::Type::Read) => read.push(interval),
                Ok(authpb::permission::Type::Write) => write.push(interval),
                Ok(authpb::permission::Type::Readwrite) => {
                    read.push(interval.clone());
                    write.push(interval);
                }
                // etcd stores only the three types it knows; anything else grants nothing.
                Err(_) => {}
            }
        }
        RangePerms {
            read: IntervalSet::from_unsorted(read),
            write: IntervalSet::from_unsorted(write),
        }
    }

    /// Whether `[key, range_end)` (one key when `range_end` is empty; every key from `key` on
    /// when it is "\0") is permitted for `perm`.
    pub fn permits(&self, key: &[u8], range_end: &[u8], perm: PermType) -> bool {
        let set = match perm {
            PermType::Read => &self.read,
            PermType::Write => &self.write,
        };
        if range_end.is_empty() {
            return set.holds(key);
        }
        let end = if range_end == b"\0" {
            None
        } else {
            Some(range_end.to_vec())
        };
        set.covers(key, &end)
    }
}

/// A granted permission's interval, as etcd's `getMergedPerms` builds it.
fn perm_interval(key: &[u8], range_end: &[u8]) -> (Vec<u8>, End) {
    if range_end.is_empty() {
        let mut end = key.to_vec();
        end.push(0);
        return (key.to_vec(), Some(end));
    }
    if range_end == b"\0" {
        return (key.to_vec(), None);
    }
    (key.to_vec(), Some(range_end.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(t: authpb::permission::Type, key: &str, end: &str) -> authpb::Permission {
        authpb::Permission {
            perm_type: t as i32,
            key: key.as_bytes().to_vec().into(),
            range_end: end.as_bytes().to_vec().into(),
        }
    }

    use authpb::permission::Type::{Read, Readwrite, Write};

    #[test]
    fn a_single_key_grant_covers_that_key_only() {
        let p = RangePerms::from_perms(&[perm(Read, "foo", "")]);
        assert!(p.permits(b"foo", b"", PermType::Read));
        assert!(!p.permits(b"foo", b"", PermType::Write));
        assert!(!p.permits(b"foo0", b"", PermType::Read));
        assert!(!p.permits(b"fo", b"", PermType::Read));
        // The range [foo, foo\0) is exactly the key.
        assert!(p.permits(b"foo", b"foo\0", PermType::Read));
        assert!(!p.permits(b"foo", b"fop", PermType::Read));
    }

    #[test]
    fn a_prefix_grant_covers_ranges_inside_it() {
        // etcdctl role grant-permission r readwrite foo --prefix: [foo, fop).
        let p = RangePerms::from_perms(&[perm(Readwrite, "foo", "fop")]);
        for t in [PermType::Read, PermType::Write] {
            assert!(p.permits(b"foo", b"", t));
            assert!(p.permits(b"foo/bar", b"", t));
            assert!(p.permits(b"foo", b"fop", t));
            assert!(p.permits(b"foo/a", b"foo/b", t));
            assert!(!p.permits(b"fop", b"", t));
            assert!(!p.permits(b"fo", b"fop", t));
            assert!(!p.permits(b"foo", b"foq", t));
            assert!(
                !p.permits(b"foo", b"\0", t),
                "open-ended is more than the prefix"
            );
        }
    }

    #[test]
    fn open_ended_grants_cover_every_later_key() {
        let p = RangePerms::from_perms(&[perm(Write, "m", "\0")]);
        assert!(p.permits(b"m", b"\0", PermType::Write));
        assert!(p.permits(b"zzz", b"", PermType::Write));
        assert!(p.permits(b"n", b"\0", PermType::Write));
        assert!(!p.permits(b"l", b"\0", PermType::Write));
        assert!(!p.permits(b"l", b"", PermType::Write));
        assert!(!p.permits(b"m", b"", PermType::Read));
    }

    #[test]
    fn adjoining_and_overlapping_grants_merge() {
        let p = RangePerms::from_perms(&[
            perm(Read, "a", "c"),
            perm(Read, "c", "e"),
            perm(Read, "d", "f"),
            perm(Read, "x", ""),
        ]);
        assert!(
            p.permits(b"a", b"f", PermType::Read),
            "[a,c)+[c,e)+[d,f) touch"
        );
        assert!(!p.permits(b"a", b"g", PermType::Read));
        assert!(p.permits(b"x", b"", PermType::Read));
        assert!(!p.permits(b"f", b"x", PermType::Read));
        // A single key next to a range: [x, x\0) and [x\0, y) are contiguous.
        let q = RangePerms::from_perms(&[perm(Write, "x", ""), perm(Write, "x\0", "y")]);
        assert!(q.permits(b"x", b"y", PermType::Write));
    }

    #[test]
    fn no_grants_permit_nothing() {
        let p = RangePerms::from_perms(&[]);
        assert!(!p.permits(b"a", b"", PermType::Read));
        assert!(!p.permits(b"a", b"\0", PermType::Write));
    }
}
