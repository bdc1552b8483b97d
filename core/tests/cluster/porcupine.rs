//! A Porcupine-style linearizability checker for a key-value history.
//!
//! The model is a map from key to (value, mod revision) with four operations: put, get, delete
//! and a compare-and-swap txn (`If MOD(key) == r Then Put` or `If VALUE(key) == x Then Put`).
//! Every operation touches one key, so the history is split by key and each part is checked on
//! its own (Herlihy & Wing's locality: the whole is linearizable iff every part is).
//!
//! Each part is searched with Wing & Gong's algorithm as refined by Lowe and by Porcupine: walk
//! the call/return events in time order, try to linearize a pending call at the current point,
//! backtrack when a return is reached whose call was not linearized, and memoize every
//! (set of linearized operations, model state) pair already explored so no state is searched
//! twice.
//!
//! An operation whose outcome is unknown (a timeout, a dropped connection) returns at infinity:
//! it may be linearized anywhere after its call, or never, which is the same as "it had no
//! effect". So the search linearizes such an operation only with its effect, and succeeds as
//! soon as every completed operation is linearized. Unknown-outcome reads constrain nothing and
//! are dropped.
//!
//! Architecture invariant: the checker never rejects a history that has a linearization (it is
//! exact up to the search budget; when the budget runs out it answers `Undecided`, never
//! `Illegal`).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::fmt;

/// The return time of an operation whose outcome is unknown: it never returned.
pub const RETURN_NEVER_NS: u64 = u64::MAX;

/// How many search steps one key's history may take before the checker gives up.
pub const SEARCH_STEPS_MAX: u64 = 20_000_000;

/// The condition of a compare-and-swap txn.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Compare {
    /// `mod_revision(key) == r`; 0 means "the key does not exist", as in etcd.
    ModRevision(i64),
    /// `value(key) == x`; false when the key does not exist, as in etcd.
    Value(Vec<u8>),
}

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Put { value: Vec<u8> },
    Get,
    Delete,
    Cas { compare: Compare, value: Vec<u8> },
}

/// What the client saw. `Unknown` means the call failed or timed out: it may or may not have
/// taken effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// `revision` is the response header's revision: the new mod revision of the key.
    Put {
        revision: i64,
    },
    /// The value and mod revision, or `None` when the key does not exist.
    Get {
        kv: Option<(Vec<u8>, i64)>,
    },
    Delete {
        deleted: u64,
    },
    /// `revision` is the header revision; when `succeeded` it is the put's mod revision.
    Cas {
        succeeded: bool,
        revision: i64,
    },
    Unknown,
}

/// One operation of a history.
#[derive(Debug, Clone)]
pub struct Operation {
    pub client: usize,
    pub key: String,
    pub input: Input,
    pub output: Output,
    /// When the call was issued, in nanoseconds since the history began.
    pub call_ns: u64,
    /// When the answer arrived; [`RETURN_NEVER_NS`] when the outcome is unknown.
    pub return_ns: u64,
}

impl Operation {
    /// An operation that completed with `output` between `call_ns` and `return_ns`.
    pub fn completed(
        client: usize,
        key: &str,
        input: Input,
        output: Output,
        call_ns: u64,
        return_ns: u64,
    ) -> Operation {
        assert!(
            output != Output::Unknown,
            "a completed operation has an output"
        );
        assert!(call_ns <= return_ns, "an operation returns after its call");
        assert!(
            return_ns != RETURN_NEVER_NS,
            "a completed operation returns"
        );
        Operation {
            client,
            key: key.to_string(),
            input,
            output,
            call_ns,
            return_ns,
        }
    }

    /// An operation that failed or timed out: pending until infinity.
    pub fn unknown(client: usize, key: &str, input: Input, call_ns: u64) -> Operation {
        Operation {
            client,
            key: key.to_string(),
            input,
            output: Output::Unknown,
            call_ns,
            return_ns: RETURN_NEVER_NS,
        }
    }
}

/// The verdict on a whole history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    Ok,
    /// No linearization exists for this key's operations.
    Illegal {
        key: String,
        operations: usize,
    },
    /// The search budget ran out on this key.
    Undecided {
        key: String,
        operations: usize,
    },
}

/// A key's mod revision as the model knows it: unknown after a put whose outcome was unknown,
/// until a later read reveals it.
type Revision = Option<i64>;

/// The model state of one key: absent, or (value, mod revision).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct KeyState {
    kv: Option<(Vec<u8>, Revision)>,
}

/// Whether a compare holds in a state: the model may not know (an unknown mod revision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Truth {
    Yes,
    No,
    Maybe,
}

fn compare_holds(state: &KeyState, compare: &Compare) -> Truth {
    match (compare, &state.kv) {
        (Compare::ModRevision(r), None) => truth(*r == 0),
        (Compare::ModRevision(r), Some((_, Some(known)))) => truth(known == r),
        // A key that exists has a mod revision above 0, whatever it is.
        (Compare::ModRevision(0), Some((_, None))) => Truth::No,
        (Compare::ModRevision(_), Some((_, None))) => Truth::Maybe,
        (Compare::Value(_), None) => Truth::No,
        (Compare::Value(x), Some((v, _))) => truth(x == v),
    }
}

fn truth(holds: bool) -> Truth {
    if holds {
        Truth::Yes
    } else {
        Truth::No
    }
}

/// A write that produced `revision` must come after the key's current mod revision.
fn revision_advances(state: &KeyState, revision: i64) -> bool {
    match &state.kv {
        Some((_, Some(known))) => revision > *known,
        _ => revision > 0,
    }
}

fn written(value: &[u8], revision: Revision) -> KeyState {
    KeyState {
        kv: Some((value.to_vec(), revision)),
    }
}

const ABSENT: KeyState = KeyState { kv: None };

/// The states the model may be in after `input` answered `output` in `state`; empty when the
/// answer is impossible. An unknown outcome yields only the states where the operation took
/// effect: "no effect" is the search never linearizing it.
fn step(state: &KeyState, input: &Input, output: &Output) -> Vec<KeyState> {
    match (input, output) {
        (Input::Put { value }, Output::Put { revision }) => {
            if revision_advances(state, *revision) {
                vec![written(value, Some(*revision))]
            } else {
                vec![]
            }
        }
        (Input::Put { value }, Output::Unknown) => vec![written(value, None)],
        (Input::Get, Output::Get { kv }) => match (&state.kv, kv) {
            (None, None) => vec![state.clone()],
            (Some((v, known)), Some((seen, seen_rev))) => {
                let revision_matches = known.is_none_or(|k| k == *seen_rev);
                if v == seen && revision_matches {
                    // A read reveals a revision the model did not know.
                    vec![written(v, Some(*seen_rev))]
                } else {
                    vec![]
                }
            }
            _ => vec![],
        },
        (Input::Get, Output::Unknown) => vec![state.clone()],
        (Input::Delete, Output::Delete { deleted }) => {
            if *deleted == u64::from(state.kv.is_some()) {
                vec![ABSENT]
            } else {
                vec![]
            }
        }
        (Input::Delete, Output::Unknown) => vec![ABSENT],
        (
            Input::Cas { compare, value },
            Output::Cas {
                succeeded,
                revision,
            },
        ) => {
            let holds = compare_holds(state, compare);
            match (succeeded, holds) {
                (true, Truth::Yes | Truth::Maybe) if revision_advances(state, *revision) => {
                    vec![written(value, Some(*revision))]
                }
                (false, Truth::No | Truth::Maybe) => vec![state.clone()],
                _ => vec![],
            }
        }
        // A failed compare changes nothing: the same as never linearizing the operation.
        (Input::Cas { compare, value }, Output::Unknown) => match compare_holds(state, compare) {
            Truth::No => vec![],
            Truth::Yes | Truth::Maybe => vec![written(value, None)],
        },
        (input, output) => panic!("output {output:?} does not answer input {input:?}"),
    }
}

/// Checks a whole history: linearizable iff every key's part is.
pub fn check(history: &[Operation]) -> CheckResult {
    let mut by_key: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in history {
        assert!(op.call_ns <= op.return_ns, "return before call: {op:?}");
        let unknown_read = op.input == Input::Get && op.output == Output::Unknown;
        if !unknown_read {
            by_key.entry(op.key.as_str()).or_default().push(op);
        }
    }
    for (key, ops) in by_key {
        match check_key(&ops) {
            Verdict::Linearizable => {}
            Verdict::Illegal => {
                return CheckResult::Illegal {
                    key: key.to_string(),
                    operations: ops.len(),
                }
            }
            Verdict::Undecided => {
                return CheckResult::Undecided {
                    key: key.to_string(),
                    operations: ops.len(),
                }
            }
        }
    }
    CheckResult::Ok
}

enum Verdict {
    Linearizable,
    Illegal,
    Undecided,
}

const NIL: usize = usize::MAX;

/// A call or return event in the doubly linked list the search walks.
#[derive(Debug, Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// The index of the matching event (the return of a call, the call of a return).
    matching: usize,
}

/// The events of `ops` in time order, with each call before a return at the same instant, so
/// operations that touch at an instant count as concurrent (the permissive reading).
fn events_of(ops: &[&Operation]) -> Vec<Event> {
    let mut order: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        order.push((op.call_ns, 0, i));
        order.push((op.return_ns, 1, i));
    }
    order.sort_unstable();
    let mut events: Vec<Event> = order
        .iter()
        .map(|&(_, kind, op)| Event {
            op,
            is_call: kind == 0,
            matching: NIL,
        })
        .collect();
    let mut call_at = vec![NIL; ops.len()];
    for i in 0..events.len() {
        let op = events[i].op;
        if events[i].is_call {
            call_at[op] = i;
        } else {
            let call = call_at[op];
            assert!(call != NIL, "a return follows its call in time order");
            events[i].matching = call;
            events[call].matching = i;
        }
    }
    events
}

/// The linked list over events; slot 0 is the head sentinel, event i lives in slot i + 1.
struct List {
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl List {
    fn new(len: usize) -> List {
        let next = (0..=len)
            .map(|i| if i < len { i + 1 } else { NIL })
            .collect();
        let prev = (0..=len)
            .map(|i| if i == 0 { NIL } else { i - 1 })
            .collect();
        List { next, prev }
    }

    fn unlink(&mut self, slot: usize) {
        let (p, n) = (self.prev[slot], self.next[slot]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, slot: usize) {
        let (p, n) = (self.prev[slot], self.next[slot]);
        self.next[p] = slot;
        if n != NIL {
            self.prev[n] = slot;
        }
    }
}

/// Wing & Gong / Lowe search with memoization over one key's operations.
fn check_key(ops: &[&Operation]) -> Verdict {
    let events = events_of(ops);
    let mut list = List::new(events.len());
    let mut linearized = vec![0u64; ops.len().div_ceil(64)];
    let mut seen: HashSet<(Vec<u64>, KeyState)> = HashSet::new();
    // Each frame: the call slot linearized, the state before it, the alternative taken.
    let mut stack: Vec<(usize, KeyState, usize)> = Vec::new();
    let mut state = ABSENT;
    let mut slot = list.next[0];
    let mut first_alternative = 0;
    let mut steps: u64 = 0;
    // Operations with an unknown outcome need not be linearized at all (see the module doc).
    let completed_total = ops.iter().filter(|op| op.output != Output::Unknown).count();
    let mut completed_linearized = 0;
    while completed_linearized < completed_total {
        steps += 1;
        if steps > SEARCH_STEPS_MAX {
            return Verdict::Undecided;
        }
        assert!(slot != NIL, "the list always ends with a return event");
        let event = events[slot - 1];
        if event.is_call {
            let op = ops[event.op];
            let alternatives = step(&state, &op.input, &op.output);
            let mut taken = false;
            for (k, next_state) in alternatives.into_iter().enumerate().skip(first_alternative) {
                let mut next_linearized = linearized.clone();
                next_linearized[event.op / 64] |= 1 << (event.op % 64);
                if seen.insert((next_linearized.clone(), next_state.clone())) {
                    stack.push((slot, std::mem::replace(&mut state, next_state), k));
                    linearized = next_linearized;
                    if op.output != Output::Unknown {
                        completed_linearized += 1;
                    }
                    // Lift the call and its return out of the list.
                    list.unlink(slot);
                    list.unlink(event.matching + 1);
                    taken = true;
                    break;
                }
            }
            first_alternative = 0;
            slot = if taken { list.next[0] } else { list.next[slot] };
        } else {
            // A return whose call is not linearized yet: undo the last choice.
            let Some((call_slot, previous, k)) = stack.pop() else {
                return Verdict::Illegal;
            };
            let call = events[call_slot - 1];
            linearized[call.op / 64] &= !(1 << (call.op % 64));
            if ops[call.op].output != Output::Unknown {
                completed_linearized -= 1;
            }
            state = previous;
            list.relink(call.matching + 1);
            list.relink(call_slot);
            slot = call_slot;
            first_alternative = k + 1;
        }
    }
    assert!(
        linearized
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum::<usize>()
            >= completed_total,
        "every completed operation was linearized"
    );
    Verdict::Linearizable
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckResult::Ok => write!(f, "linearizable"),
            CheckResult::Illegal { key, operations } => write!(
                f,
                "NOT linearizable: key {key:?} ({operations} operations) has no linearization"
            ),
            CheckResult::Undecided { key, operations } => write!(
                f,
                "undecided: key {key:?} ({operations} operations) exceeded {SEARCH_STEPS_MAX} search steps"
            ),
        }
    }
}

/// The operations on `key`, one per line in call order, for a failure message.
pub fn describe(history: &[Operation], key: &str) -> String {
    let mut ops: Vec<&Operation> = history.iter().filter(|op| op.key == key).collect();
    ops.sort_by_key(|op| op.call_ns);
    ops.iter()
        .map(|op| {
            let end = if op.return_ns == RETURN_NEVER_NS {
                "never".to_string()
            } else {
                format!("{}us", op.return_ns / 1000)
            };
            format!(
                "c{} [{}us..{}] {:?} -> {:?}",
                op.client,
                op.call_ns / 1000,
                end,
                op.input,
                op.output
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(client: usize, key: &str, value: &str, revision: i64, t: (u64, u64)) -> Operation {
        Operation::completed(
            client,
            key,
            Input::Put {
                value: value.into(),
            },
            Output::Put { revision },
            t.0,
            t.1,
        )
    }

    fn get(client: usize, key: &str, kv: Option<(&str, i64)>, t: (u64, u64)) -> Operation {
        Operation::completed(
            client,
            key,
            Input::Get,
            Output::Get {
                kv: kv.map(|(v, r)| (v.as_bytes().to_vec(), r)),
            },
            t.0,
            t.1,
        )
    }

    fn cas_mod(
        client: usize,
        key: &str,
        expect: i64,
        value: &str,
        outcome: (bool, i64),
        t: (u64, u64),
    ) -> Operation {
        Operation::completed(
            client,
            key,
            Input::Cas {
                compare: Compare::ModRevision(expect),
                value: value.into(),
            },
            Output::Cas {
                succeeded: outcome.0,
                revision: outcome.1,
            },
            t.0,
            t.1,
        )
    }

    fn delete(client: usize, key: &str, deleted: u64, t: (u64, u64)) -> Operation {
        Operation::completed(
            client,
            key,
            Input::Delete,
            Output::Delete { deleted },
            t.0,
            t.1,
        )
    }

    #[test]
    fn accepts_a_sequential_history() {
        let h = vec![
            get(0, "x", None, (0, 1)),
            put(0, "x", "a", 2, (2, 3)),
            get(1, "x", Some(("a", 2)), (4, 5)),
            delete(1, "x", 1, (6, 7)),
            get(0, "x", None, (8, 9)),
            delete(0, "x", 0, (10, 11)),
        ];
        assert_eq!(check(&h), CheckResult::Ok);
    }

    #[test]
    fn accepts_a_read_that_overlaps_a_write_seeing_either_value() {
        for seen in [Some(("a", 2)), Some(("b", 3))] {
            let h = vec![
                put(0, "x", "a", 2, (0, 10)),
                put(1, "x", "b", 3, (20, 40)),
                get(2, "x", seen, (30, 50)),
            ];
            assert_eq!(check(&h), CheckResult::Ok, "saw {seen:?}");
        }
    }

    #[test]
    fn accepts_reordering_of_concurrent_operations() {
        // The put of "b" is called after "a"'s but linearizes first: they overlap.
        let h = vec![
            put(0, "x", "a", 3, (0, 100)),
            put(1, "x", "b", 2, (10, 90)),
            get(2, "x", Some(("a", 3)), (110, 120)),
        ];
        assert_eq!(check(&h), CheckResult::Ok);
    }

    #[test]
    fn accepts_unknown_outcomes_taken_or_not() {
        let lost = Operation::unknown(
            0,
            "x",
            Input::Put {
                value: "lost".into(),
            },
            5,
        );
        let applied = Operation::unknown(
            1,
            "y",
            Input::Put {
                value: "late".into(),
            },
            5,
        );
        let h = vec![
            put(2, "x", "a", 2, (0, 1)),
            lost,
            get(2, "x", Some(("a", 2)), (100, 110)),
            applied,
            // The unknown put shows up long after its caller gave up, revision and all.
            get(2, "y", Some(("late", 7)), (200, 210)),
            cas_mod(2, "y", 7, "next", (true, 9), (220, 230)),
        ];
        assert_eq!(check(&h), CheckResult::Ok);
    }

    #[test]
    fn accepts_one_of_two_racing_cas() {
        let h = vec![
            put(0, "x", "a", 5, (0, 1)),
            cas_mod(1, "x", 5, "b", (true, 6), (10, 30)),
            cas_mod(2, "x", 5, "c", (false, 6), (12, 28)),
            get(0, "x", Some(("b", 6)), (40, 41)),
        ];
        assert_eq!(check(&h), CheckResult::Ok);
    }

    #[test]
    fn accepts_create_if_absent_and_value_compare() {
        let h = vec![
            cas_mod(0, "x", 0, "a", (true, 4), (0, 1)),
            cas_mod(1, "x", 0, "b", (false, 4), (2, 3)),
            Operation::completed(
                1,
                "x",
                Input::Cas {
                    compare: Compare::Value("a".into()),
                    value: "c".into(),
                },
                Output::Cas {
                    succeeded: true,
                    revision: 8,
                },
                4,
                5,
            ),
            get(0, "x", Some(("c", 8)), (6, 7)),
        ];
        assert_eq!(check(&h), CheckResult::Ok);
    }

    #[test]
    fn rejects_a_stale_read_after_a_completed_write() {
        let h = vec![
            put(0, "x", "a", 2, (0, 10)),
            put(0, "x", "b", 3, (20, 30)),
            get(1, "x", Some(("a", 2)), (40, 50)),
        ];
        assert!(matches!(check(&h), CheckResult::Illegal { .. }));
    }

    #[test]
    fn rejects_two_cas_succeeding_from_the_same_revision() {
        let h = vec![
            put(0, "x", "a", 5, (0, 1)),
            cas_mod(1, "x", 5, "b", (true, 6), (10, 30)),
            cas_mod(2, "x", 5, "c", (true, 7), (12, 28)),
        ];
        assert_eq!(
            check(&h),
            CheckResult::Illegal {
                key: "x".into(),
                operations: 3
            }
        );
    }

    #[test]
    fn rejects_a_value_nobody_wrote_and_a_wrong_revision() {
        let phantom = vec![
            put(0, "x", "a", 2, (0, 10)),
            get(1, "x", Some(("zzz", 2)), (20, 30)),
        ];
        assert!(matches!(check(&phantom), CheckResult::Illegal { .. }));
        let wrong_revision = vec![
            put(0, "x", "a", 2, (0, 10)),
            get(1, "x", Some(("a", 3)), (20, 30)),
        ];
        assert!(matches!(
            check(&wrong_revision),
            CheckResult::Illegal { .. }
        ));
    }

    #[test]
    fn rejects_reads_that_go_back_in_time_after_an_unknown_write() {
        // The unknown put was observed once, so a later read must not see the value before it.
        let h = vec![
            put(0, "x", "a", 2, (0, 1)),
            Operation::unknown(1, "x", Input::Put { value: "b".into() }, 5),
            get(2, "x", Some(("b", 3)), (10, 20)),
            get(2, "x", Some(("a", 2)), (30, 40)),
        ];
        assert!(matches!(check(&h), CheckResult::Illegal { .. }));
    }

    #[test]
    fn rejects_only_the_bad_key_of_several() {
        let h = vec![
            put(0, "good", "a", 2, (0, 10)),
            get(1, "good", Some(("a", 2)), (20, 30)),
            delete(0, "bad", 1, (0, 10)),
        ];
        assert_eq!(
            check(&h),
            CheckResult::Illegal {
                key: "bad".into(),
                operations: 1
            }
        );
    }

    /// A tiny deterministic generator (xorshift64*), so the randomized test replays by seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Runs a real sequential map, stamps each operation with a linearization point, then
    /// widens every operation into a random interval around its point: always linearizable.
    fn random_linearizable_history(seed: u64, ops_count: usize) -> Vec<Operation> {
        let mut rng = Rng(seed | 1);
        let mut store: BTreeMap<String, (Vec<u8>, i64)> = BTreeMap::new();
        let mut revision = 1;
        let mut history = Vec::new();
        for i in 0..ops_count {
            let point = (i as u64 + 1) * 100;
            let key = format!("k{}", rng.below(2));
            let client = rng.below(5) as usize;
            let call = point - rng.below(250).min(point);
            let ret = point + rng.below(250);
            let current = store.get(&key).cloned();
            let value = format!("v{i}").into_bytes();
            let (input, output) = match rng.below(5) {
                0 | 1 => {
                    revision += 1;
                    store.insert(key.clone(), (value.clone(), revision));
                    (Input::Put { value }, Output::Put { revision })
                }
                2 => (Input::Get, Output::Get { kv: current }),
                3 => {
                    let deleted = u64::from(store.remove(&key).is_some());
                    if deleted == 1 {
                        revision += 1;
                    }
                    (Input::Delete, Output::Delete { deleted })
                }
                _ => {
                    let expect = if rng.below(2) == 0 {
                        current.as_ref().map_or(0, |c| c.1)
                    } else {
                        revision
                    };
                    let succeeded = current.as_ref().map_or(0, |c| c.1) == expect;
                    if succeeded {
                        revision += 1;
                        store.insert(key.clone(), (value.clone(), revision));
                    }
                    (
                        Input::Cas {
                            compare: Compare::ModRevision(expect),
                            value,
                        },
                        Output::Cas {
                            succeeded,
                            revision,
                        },
                    )
                }
            };
            let op = if rng.below(20) == 0 {
                Operation::unknown(client, &key, input, call)
            } else {
                Operation::completed(client, &key, input, output, call, ret)
            };
            history.push(op);
        }
        history
    }

    #[test]
    fn accepts_random_linearizable_histories() {
        for seed in 1..=30u64 {
            let h = random_linearizable_history(seed * 7919, 200);
            let verdict = check(&h);
            assert_eq!(verdict, CheckResult::Ok, "seed {seed}");
        }
    }

    #[test]
    fn rejects_random_histories_with_a_read_from_the_past() {
        // Append a read that returns the oldest value ever written, well after a newer write
        // completed: every seed must be rejected.
        for seed in 1..=10u64 {
            let mut h = random_linearizable_history(seed * 104_729, 100);
            let end = h
                .iter()
                .filter(|op| op.return_ns != RETURN_NEVER_NS)
                .map(|op| op.return_ns)
                .max()
                .expect("some operation completed");
            h.push(put(9, "k0", "first", 1_000_000, (end + 10, end + 20)));
            h.push(put(9, "k0", "second", 1_000_001, (end + 30, end + 40)));
            h.push(get(
                9,
                "k0",
                Some(("first", 1_000_000)),
                (end + 50, end + 60),
            ));
            assert!(
                matches!(check(&h), CheckResult::Illegal { .. }),
                "seed {seed}"
            );
        }
    }
}
