//! A watcher's history read (`Reader::range_events_steps`): the events of a key range from a
//! start revision up to the published one, walked in steps and bounded as it goes.

use bytes::Bytes;

use crate::index::{RecordCheck, Unchecked, VersionKind};
use crate::read::walk_histories;
use crate::store::Shared;
use crate::types::{Event, EventBatch, EventKind, KeyValue, PrevKv, Revision};

/// One event read, with the record checks of its value and its previous state's, those on
/// disk: an event dropped by the bound drops them with it, so only what is handed out is read.
type Read = (Revision, Event, [Option<RecordCheck>; 2]);

/// A history read in steps: `step` visits a bounded number of the range's keys at a time,
/// at the revision the read began at, with no epoch held between steps; `finish` cuts and
/// orders what was read.
///
/// The events a key holds are in revision order, but the walk goes in key order, so which
/// revisions a batch of `events_max` keeps is known only at the end. The read still holds
/// no more than about twice that many (or twice the events of one revision that alone holds
/// more, which a batch hands out whole): once it does, it keeps the lowest revisions that a
/// batch would keep of what it has read (`cut_at`), and skips everything at or past the
/// revision cut from then on. No event below that revision can be dropped that way, since
/// events the walk reads later only ever lower a cut, never raise it: the batch is every
/// event of the range in [start, next_rev), whole revisions, as a whole read gives. Before,
/// a catch-up built every event of its range at every batch, and a watcher from the first
/// revision of 100,000 keys (a hundred batches) took 6.9 s, a million keys would take
/// about ten minutes.
pub struct EventSteps {
    start_rev: i64,
    /// The revision read at (the published one at the start).
    read_rev: i64,
    range_end: Bytes,
    /// The next key to visit; None once the walk reached the range's end.
    next_key: Option<Bytes>,
    events_max: usize,
    with_prev: bool,
    /// Events at or past this revision are not kept: those read so far held more than a
    /// batch before it. `read_rev + 1` until a cut (a cut is at a revision read).
    below_rev: i64,
    events: Vec<Read>,
    /// Held events that make the read cut again: twice `events_max`, or twice what a cut
    /// left when one revision alone holds more (so the sorts stay O(n log n) in all).
    cut_when_held: usize,
    keys_visited: usize,
}

impl EventSteps {
    /// A read of [key, range_end) from `start_rev` (at least 1) at `read_rev`.
    pub(crate) fn start(
        start_rev: i64,
        read_rev: i64,
        (key, range_end): (&[u8], &[u8]),
        events_max: usize,
        with_prev: bool,
    ) -> Self {
        assert!(events_max > 0, "a batch must be able to hold an event");
        assert!(start_rev >= 1, "history starts at revision 1");
        EventSteps {
            start_rev,
            read_rev,
            range_end: Bytes::copy_from_slice(range_end),
            next_key: Some(Bytes::copy_from_slice(key)),
            events_max,
            with_prev,
            below_rev: read_rev + 1,
            events: Vec::new(),
            cut_when_held: events_max.saturating_mul(2),
            keys_visited: 0,
        }
    }

    /// Index entries visited so far: what one more read of this range costs to walk.
    pub fn keys_visited(&self) -> usize {
        self.keys_visited
    }

    /// Events held now (at most about twice the batch's bound, see `EventSteps`).
    pub fn events_held(&self) -> usize {
        self.events.len()
    }

    /// The revision the history is read at.
    pub fn read_rev(&self) -> i64 {
        self.read_rev
    }

    /// The first revision the read asks for.
    pub(crate) fn start_rev(&self) -> i64 {
        self.start_rev
    }

    /// Visits at most `keys_max` more keys; true once the walk reached the range's end.
    pub(crate) fn step(&mut self, shared: &Shared, keys_max: usize) -> bool {
        assert!(keys_max > 0, "a step visits at least one key");
        let (start_rev, with_prev) = (self.start_rev, self.with_prev);
        let below_rev = &mut self.below_rev;
        let events = &mut self.events;
        let events_max = self.events_max;
        let cut_when_held = &mut self.cut_when_held;
        self.keys_visited += walk_histories(
            shared,
            &mut self.next_key,
            &self.range_end,
            keys_max,
            |key, versions, guard| {
                let first = versions.partition_point(|v| v.main() < start_rev);
                for i in first..versions.len() {
                    let v = &versions[i];
                    if v.main() >= *below_rev {
                        break;
                    }
                    let mut prev_check = Vec::new();
                    // The key as it stood at the revision before this one, as etcd reads
                    // it: a version of the same txn (a put its delete follows) does not show.
                    let prev_kv = versions[..i]
                        .iter()
                        .rposition(|p| p.main() < v.main())
                        .map(|p| &versions[p])
                        .filter(|p| p.kind() == VersionKind::Put)
                        .map(|p| p.to_prev_kv(key, shared.segments.load(guard)))
                        .map(|p| match with_prev {
                            true => PrevKv::known(p.into_answer(&mut prev_check)),
                            false => p,
                        });
                    let (event, check) = match v.kind() {
                        VersionKind::Put => {
                            let segments = shared.segments.load(guard);
                            let (kv, check) = v.to_key_value_unchecked(key, segments, true);
                            let event = Event {
                                kind: EventKind::Put,
                                kv,
                                prev_kv,
                            };
                            (event, check)
                        }
                        VersionKind::Tombstone => {
                            let event = Event {
                                kind: EventKind::Delete,
                                kv: KeyValue {
                                    key: Bytes::copy_from_slice(key),
                                    mod_revision: v.main(),
                                    ..KeyValue::default()
                                },
                                prev_kv,
                            };
                            (event, None)
                        }
                    };
                    events.push((v.rev(), event, [check, prev_check.pop()]));
                    // Checked at every event, not every key: one key's thousands of
                    // versions are cut as they are read too.
                    if events.len() >= *cut_when_held {
                        if let Some(cut) = cut_at(events, events_max) {
                            *below_rev = cut;
                        }
                        *cut_when_held = events.len().max(events_max).saturating_mul(2);
                    }
                }
            },
        );
        self.next_key.is_none()
    }

    /// The batch of a walk that reached the range's end: the events of [start, next_rev) in
    /// revision order, with the checks of the values it hands out.
    pub(crate) fn finish(mut self) -> Unchecked<EventBatch> {
        assert!(self.next_key.is_none(), "the walk reached the range's end");
        if let Some(cut) = cut_at(&mut self.events, self.events_max) {
            self.below_rev = cut;
        }
        // A watcher asking from the future stays there; otherwise it continues after what
        // we read, or at the cut.
        let next_rev = if self.below_rev <= self.read_rev {
            self.below_rev
        } else {
            (self.read_rev + 1).max(self.start_rev)
        };
        let mut checks = Vec::new();
        let events = self
            .events
            .into_iter()
            .map(|(_, event, [check, prev_check])| {
                checks.extend(check);
                checks.extend(prev_check);
                event
            })
            .collect();
        Unchecked::new(
            EventBatch {
                events,
                next_rev,
                read_rev: self.read_rev,
            },
            checks,
        )
    }
}

/// Orders `events` by revision and, when they are more than `events_max`, keeps only the
/// lowest revisions, whole: those below the revision of the first event past `events_max`,
/// or, when that is the first revision read (one revision alone holds more), the first
/// revision whole. The revision cut at, or None when all stay.
///
/// The cut of a set is never above the cut of any subset of it: both the (events_max+1)-th
/// lowest revision and the second-lowest distinct revision can only fall as events are
/// added. So cutting part way through a walk drops nothing the walk's final cut keeps.
fn cut_at(events: &mut Vec<Read>, events_max: usize) -> Option<i64> {
    events.sort_by_key(|(rev, _, _)| *rev);
    if events.len() <= events_max {
        return None;
    }
    let first_main = events[0].0.main;
    let cut_main = match events[events_max].0.main {
        past if past > first_main => past,
        _ => events.iter().find(|(r, _, _)| r.main > first_main)?.0.main,
    };
    events.retain(|(r, _, _)| r.main < cut_main);
    Some(cut_main)
}
