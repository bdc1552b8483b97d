//! Auto-compaction with etcd 3.4's semantics (`--auto-compaction-mode periodic|revision`,
//! `--auto-compaction-retention`), as etcd's `etcdserver/api/v3compactor` implements them.
//!
//! Three layers:
//! - [`parse_retention`] reads the flags exactly as etcd's `parseCompactionRetention` does (a bare
//!   integer is hours for periodic and a count for revision; anything else is a Go duration) and
//!   refuses what etcd refuses with etcd's message.
//! - [`Policy`] is the pure schedule: it reads no clock. The driver calls [`Policy::poll`] with
//!   `now_ms`, the current revision and whether this member leads; it answers "compact to R" or
//!   nothing, and hears back through [`Policy::finished`]. It is etcd's compactor goroutine turned
//!   inside out: each of that loop's `clock.After` wake-ups becomes a deadline the policy checks on
//!   a poll, and its blocking `Compact` call becomes the time between `poll` answering a revision
//!   and `finished`.
//! - [`AutoCompactor`] is the driver on the raft core: it polls on every raft tick, proposes the
//!   compaction through raft (the same non-physical `InternalRaftRequest.compaction` a client's
//!   Compact proposes, so every member compacts at the same revision) and feeds the outcome back.
//!
//! Time: the driver polls once per heartbeat tick, so a deadline is seen up to one tick late. A
//! wake-up seen within one poll interval of its deadline is taken as having happened at the
//! deadline (etcd's timer would have fired then), which keeps the schedule on etcd's grid instead
//! of drifting by a tick per wake-up; anything later (a stalled core) is a real delay, and the
//! schedule restarts from then, as etcd's timer does after a pause.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use futures_channel::oneshot;
use keel_grpc::EtcdError;
use keel_proto::etcdserverpb as pb;
use prost::Message;

use crate::shared::{Proposal, Shared, Unserved};

/// etcd's `revInterval`: how often the revision compactor checks the revision.
pub const REVISION_CHECK_INTERVAL_MS: u64 = 5 * 60 * 1000;
/// etcd caps the periodic compactor's compaction interval at an hour (`getCompactInterval`) and
/// samples the revision every tenth of that (`retryDivisor`).
const PERIODIC_INTERVAL_MAX_MS: u64 = 60 * 60 * 1000;
const RETRY_DIVISOR: u64 = 10;
/// A compaction answered within this many polls of its proposal counts as answered at once (as
/// etcd's `Compact` returns within milliseconds on a healthy cluster); later is a real wait.
const PROMPT_ANSWER_POLLS: u64 = 2;

const MS_PER_HOUR: u64 = 60 * 60 * 1000;
const NS_PER_MS: u64 = 1_000_000;

/// What `--auto-compaction-mode` and `--auto-compaction-retention` ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Keep about `period_ms` of history (etcd's periodic mode).
    Periodic { period_ms: u64 },
    /// Keep the last `revisions` revisions, checked every `check_interval_ms` (etcd's revision
    /// mode; etcd checks every 5 minutes).
    Revision {
        revisions: i64,
        check_interval_ms: u64,
    },
}

impl std::fmt::Display for Retention {
    /// As etcd logs the retention: a Go duration, or a revision count.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Retention::Periodic { period_ms } => f.write_str(&go_duration_string(*period_ms)),
            Retention::Revision { revisions, .. } => write!(f, "{revisions} revisions"),
        }
    }
}

/// Reads the two flags as etcd 3.4 does (`embed.parseCompactionRetention`, `Config.Validate`,
/// `v3compactor.New`). `Ok(None)` means auto-compaction is off ("0", "0s", or an empty value).
/// Errors carry etcd's message where etcd refuses the value; two values etcd accepts but cannot
/// mean are refused too: a negative duration (etcd's compactor then compacts in a busy loop) and
/// a duration in revision mode (etcd reads "5m" as 300000000000 revisions).
pub fn parse_retention(
    mode: &str,
    retention: &str,
    revision_check_interval_ms: u64,
) -> Result<Option<Retention>, String> {
    if !matches!(mode, "" | "periodic" | "revision") {
        return Err(format!("unknown auto-compaction-mode {mode:?}"));
    }
    assert!(
        revision_check_interval_ms > 0,
        "the revision check interval is validated before"
    );
    // etcd: an unset retention is "0".
    let retention = if retention.is_empty() { "0" } else { retention };
    if let Some(count) = go_atoi(retention).filter(|n| *n >= 0) {
        return match (mode, count) {
            (_, 0) => Ok(None),
            ("revision", n) => Ok(Some(Retention::Revision {
                revisions: n,
                check_interval_ms: revision_check_interval_ms,
            })),
            ("periodic", hours) => {
                // Go multiplies by time.Hour in int64 nanoseconds and silently wraps; refuse instead.
                let period_ms = u64::try_from(hours)
                    .ok()
                    .filter(|h| {
                        h.checked_mul(MS_PER_HOUR * NS_PER_MS)
                            .is_some_and(|ns| ns <= i64::MAX as u64)
                    })
                    .map(|h| h * MS_PER_HOUR)
                    .ok_or_else(|| {
                        format!(
                            "error parsing CompactionRetention: {retention:?} hours is too long"
                        )
                    })?;
                Ok(Some(Retention::Periodic { period_ms }))
            }
            // etcd's parser leaves a count at 0 when the mode is empty: auto-compaction stays off.
            _ => Ok(None),
        };
    }
    let ns = parse_go_duration(retention)
        .map_err(|e| format!("error parsing CompactionRetention: {e}"))?;
    if ns == 0 {
        return Ok(None);
    }
    if ns < 0 {
        return Err(format!(
            "error parsing CompactionRetention: negative retention {retention:?}"
        ));
    }
    match mode {
        "periodic" => Ok(Some(Retention::Periodic {
            // Milliseconds are the policy's unit; a sub-millisecond retention still compacts.
            period_ms: (ns as u64).div_ceil(NS_PER_MS),
        })),
        "revision" => Err(format!(
            "--auto-compaction-retention {retention:?} is a duration, but --auto-compaction-mode \
             revision takes a revision count (etcd would read it as {ns} revisions)"
        )),
        _ => Err("unsupported compaction mode ".to_string()),
    }
}

/// Go's `strconv.Atoi` on a 64-bit platform: an optional sign, then decimal digits only.
fn go_atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Go's `time.ParseDuration`, in nanoseconds, with Go's error messages:
/// `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, units ns, us, µs, μs, ms, s, m, h.
pub fn parse_go_duration(orig: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", go_quote(orig.as_bytes()));
    let mut s = orig.as_bytes();
    let mut negative = false;
    if let Some((&c, rest)) = s.split_first() {
        if c == b'-' || c == b'+' {
            negative = c == b'-';
            s = rest;
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    const OVERFLOW: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return Err(invalid());
        }
        // The integer part: Go refuses one that overflows 63 bits.
        let int_len = s.iter().take_while(|b| b.is_ascii_digit()).count();
        let mut whole: u64 = 0;
        for &b in &s[..int_len] {
            if whole > OVERFLOW / 10 {
                return Err(invalid());
            }
            whole = whole * 10 + u64::from(b - b'0');
            if whole > OVERFLOW {
                return Err(invalid());
            }
        }
        s = &s[int_len..];
        // The fraction: Go keeps the digits that fit and ignores the rest.
        let mut fraction: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut fraction_len = 0;
        let has_point = s.first() == Some(&b'.');
        if has_point {
            s = &s[1..];
            fraction_len = s.iter().take_while(|b| b.is_ascii_digit()).count();
            let mut overflowed = false;
            for &b in &s[..fraction_len] {
                if overflowed {
                    continue;
                }
                if fraction > (OVERFLOW - 1) / 10 {
                    overflowed = true;
                    continue;
                }
                let next = fraction * 10 + u64::from(b - b'0');
                if next > OVERFLOW {
                    overflowed = true;
                    continue;
                }
                fraction = next;
                scale *= 10.0;
            }
            s = &s[fraction_len..];
        }
        if int_len == 0 && fraction_len == 0 {
            return Err(invalid());
        }
        let unit_len = s
            .iter()
            .take_while(|b| !(**b == b'.' || b.is_ascii_digit()))
            .count();
        if unit_len == 0 {
            return Err(format!(
                "time: missing unit in duration {}",
                go_quote(orig.as_bytes())
            ));
        }
        let unit_name = &s[..unit_len];
        s = &s[unit_len..];
        let unit: u64 = match unit_name {
            b"ns" => 1,
            // "us", "µs" (U+00B5) and "μs" (U+03BC), as UTF-8 bytes.
            b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60 * 1_000_000_000,
            b"h" => 60 * 60 * 1_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    go_quote(unit_name),
                    go_quote(orig.as_bytes())
                ))
            }
        };
        if whole > OVERFLOW / unit {
            return Err(invalid());
        }
        let mut v = whole * unit;
        if fraction > 0 {
            // Go uses float64 here too: nanosecond-exact for fractions of an hour.
            v += (fraction as f64 * (unit as f64 / scale)) as u64;
            if v > OVERFLOW {
                return Err(invalid());
            }
        }
        total += v;
        if total > OVERFLOW {
            return Err(invalid());
        }
    }
    if negative {
        return Ok((total as i128).wrapping_neg() as i64);
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// Go's `time.quote`: printable ASCII as is (with `"` and `\` escaped), other bytes as `\xNN`.
fn go_quote(s: &[u8]) -> String {
    let mut out = String::from("\"");
    for &b in s {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    out
}

/// Go's `Duration.String` for a whole number of milliseconds ("2s", "1m30s", "1h0m0s", "500ms").
pub fn go_duration_string(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest_ms) = (ms / MS_PER_HOUR, ms % MS_PER_HOUR);
    let (minutes, rest_ms) = (rest_ms / 60_000, rest_ms % 60_000);
    let seconds = match rest_ms % 1000 {
        0 => format!("{}s", rest_ms / 1000),
        frac => {
            let text = format!("{}.{frac:03}", rest_ms / 1000);
            format!("{}s", text.trim_end_matches('0'))
        }
    };
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// Whether this member leads the cluster; etcd pauses the compactor on followers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    Leader,
    Follower,
}

impl Leadership {
    /// From the raft core's own flag.
    pub fn of(is_leader: bool) -> Leadership {
        if is_leader {
            Leadership::Leader
        } else {
            Leadership::Follower
        }
    }
}

/// How a proposed compaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied: the store now compacts at the revision.
    Compacted,
    /// "required revision has been compacted": someone compacted at or past it already. etcd
    /// counts this as a success.
    AlreadyCompacted,
    /// Anything else (no leader, timed out, stopping): etcd retries on its next wake-up.
    Failed,
}

impl Outcome {
    fn succeeded(self) -> bool {
        matches!(self, Outcome::Compacted | Outcome::AlreadyCompacted)
    }
}

/// A compaction the policy asked for and has not heard back about.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    revision: i64,
    /// When the wake-up that asked for it happened, on the schedule's grid.
    wake_ms: u64,
    /// When the driver actually polled it out.
    asked_ms: u64,
}

/// The schedule, pure: time and revision come in, "compact to R" comes out.
#[derive(Debug)]
pub struct Policy {
    kind: Kind,
    /// How often the driver promises to poll; lateness up to this much is not a delay.
    poll_interval_ms: u64,
    /// The next wake-up (etcd's `clock.After`).
    wake_ms: u64,
    in_flight: Option<InFlight>,
}

#[derive(Debug)]
enum Kind {
    Periodic(Periodic),
    Revision(Revision),
}

/// etcd's `Periodic`: sample the revision every `retry_ms`, keep `retentions` samples, and once
/// `base_interval_ms` has passed since the last success compact to the oldest sample.
#[derive(Debug)]
struct Periodic {
    period_ms: u64,
    /// `getRetryInterval`: min(period, 1h) / 10, the sampling and retry interval.
    retry_ms: u64,
    /// `getCompactInterval`: min(period, 1h), the interval between compactions after the first.
    compact_interval_ms: u64,
    /// `getRetentions`: period / retry + 1 samples, so `revs[0]` is the revision about a period ago.
    retentions: usize,
    revs: VecDeque<i64>,
    last_success_ms: u64,
    /// The first compaction waits the whole period, later ones `compact_interval_ms`.
    base_interval_ms: u64,
}

/// etcd's `Revision`: every check interval, compact to `current - retention` unless that is not
/// positive or is what the last successful compaction compacted to.
#[derive(Debug)]
struct Revision {
    retention: i64,
    check_interval_ms: u64,
    /// The revision of the last successful compaction (etcd's `prev`).
    previous: i64,
}

impl Policy {
    /// A policy started at `now_ms` with `current_rev` (etcd's `Run()`: the compactor starts
    /// with the server, before raft runs), which the driver polls about every `poll_interval_ms`.
    pub fn new(
        retention: Retention,
        poll_interval_ms: u64,
        now_ms: u64,
        current_rev: i64,
    ) -> Policy {
        assert!(poll_interval_ms > 0, "the driver polls at some interval");
        let kind = match retention {
            Retention::Periodic { period_ms } => {
                assert!(period_ms > 0, "a zero retention disables auto-compaction");
                let capped_ms = period_ms.min(PERIODIC_INTERVAL_MAX_MS);
                // Go's integer division of nanoseconds can reach 0 for tiny periods; a 0 ms
                // interval would make every poll a wake-up, so one millisecond is the floor.
                let retry_ms = (capped_ms / RETRY_DIVISOR).max(1);
                Kind::Periodic(Periodic {
                    period_ms,
                    retry_ms,
                    compact_interval_ms: capped_ms,
                    retentions: (period_ms / retry_ms) as usize + 1,
                    revs: VecDeque::new(),
                    last_success_ms: 0,
                    base_interval_ms: period_ms,
                })
            }
            Retention::Revision {
                revisions,
                check_interval_ms,
            } => {
                assert!(revisions > 0, "a zero retention disables auto-compaction");
                assert!(check_interval_ms > 0, "the check interval is validated");
                Kind::Revision(Revision {
                    retention: revisions,
                    check_interval_ms,
                    previous: 0,
                })
            }
        };
        let mut policy = Policy {
            kind,
            poll_interval_ms,
            wake_ms: now_ms,
            in_flight: None,
        };
        // The periodic loop records its start and samples before its first wait.
        if let Kind::Periodic(p) = &mut policy.kind {
            p.last_success_ms = now_ms;
            p.sample(current_rev);
        }
        policy.wake_ms = now_ms + policy.wake_interval_ms();
        policy
    }

    /// The interval between wake-ups: etcd's retry interval, or the revision check interval.
    pub fn wake_interval_ms(&self) -> u64 {
        match &self.kind {
            Kind::Periodic(p) => p.retry_ms,
            Kind::Revision(r) => r.check_interval_ms,
        }
    }

    /// Called on every driver tick. Returns the revision to compact to when etcd's loop would
    /// call `Compact` now; then nothing more until [`Policy::finished`] reports how it ended.
    pub fn poll(&mut self, now_ms: u64, current_rev: i64, leadership: Leadership) -> Option<i64> {
        let wake_ms = self.wake_ms;
        // etcd's loop is blocked in Compact until the answer comes.
        if self.in_flight.is_some() || now_ms < wake_ms {
            return None;
        }
        let t_ms = if now_ms - wake_ms <= self.poll_interval_ms {
            wake_ms
        } else {
            now_ms
        };
        self.wake_ms = t_ms + self.wake_interval_ms();
        let revision = match &mut self.kind {
            Kind::Periodic(p) => p.wake(t_ms, current_rev, leadership)?,
            Kind::Revision(r) => r.wake(current_rev, leadership)?,
        };
        assert!(revision > 0, "a compaction target is a real revision");
        self.in_flight = Some(InFlight {
            revision,
            wake_ms: t_ms,
            asked_ms: now_ms,
        });
        Some(revision)
    }

    /// How the compaction `poll` asked for ended, seen at `now_ms`.
    pub fn finished(&mut self, now_ms: u64, outcome: Outcome) {
        let f = self
            .in_flight
            .take()
            .expect("finished answers a compaction poll asked for");
        let prompt =
            now_ms.saturating_sub(f.asked_ms) <= PROMPT_ANSWER_POLLS * self.poll_interval_ms;
        // A prompt answer is an instant one on etcd's timeline (its Compact returns within
        // milliseconds); a slow one means etcd's loop would have been blocked until now, and its
        // next wait would start only now.
        let done_ms = if prompt { f.wake_ms } else { now_ms };
        if !prompt {
            self.wake_ms = now_ms + self.wake_interval_ms();
        }
        match &mut self.kind {
            Kind::Periodic(p) => {
                if outcome.succeeded() {
                    p.last_success_ms = done_ms;
                }
            }
            Kind::Revision(r) => {
                if outcome.succeeded() {
                    r.previous = f.revision;
                }
            }
        }
    }

    /// Whether a compaction is proposed and not answered yet.
    pub fn in_flight(&self) -> Option<i64> {
        self.in_flight.map(|f| f.revision)
    }
}

impl Periodic {
    /// The top of etcd's loop: append the revision, keep the newest `retentions` samples.
    fn sample(&mut self, rev: i64) {
        self.revs.push_back(rev);
        if self.revs.len() > self.retentions {
            self.revs.pop_front();
        }
        assert!(self.revs.len() <= self.retentions);
    }

    /// One `clock.After(retryInterval)` firing at `t_ms`.
    fn wake(&mut self, t_ms: u64, current_rev: i64, leadership: Leadership) -> Option<i64> {
        // Paused (a follower) or not due yet: `continue`, which samples at the loop's top.
        if leadership == Leadership::Follower
            || t_ms.saturating_sub(self.last_success_ms) < self.base_interval_ms
        {
            self.sample(current_rev);
            return None;
        }
        if self.base_interval_ms == self.period_ms {
            self.base_interval_ms = self.compact_interval_ms;
        }
        let revision = *self
            .revs
            .front()
            .expect("the loop samples before it first waits");
        // etcd samples again as soon as Compact returns, whatever it returned; on a healthy
        // cluster that is within milliseconds of this wake-up, so sample now.
        self.sample(current_rev);
        Some(revision)
    }
}

impl Revision {
    /// One `clock.After(revInterval)` firing.
    fn wake(&mut self, current_rev: i64, leadership: Leadership) -> Option<i64> {
        if leadership == Leadership::Follower {
            return None;
        }
        let revision = current_rev - self.retention;
        if revision <= 0 || revision == self.previous {
            return None;
        }
        Some(revision)
    }
}

/// The driver on the raft core: polls the policy on every tick, proposes what it asks for
/// through the proposal mailbox (exactly as a client's Compact does), and reports the outcome.
pub struct AutoCompactor {
    /// None when auto-compaction is off.
    policy: Option<Policy>,
    retention: Option<Retention>,
    /// The origin of the policy's millisecond clock.
    epoch: Instant,
    /// The answer to the compaction in flight: `waiting` in the raft core completes it at apply,
    /// or with "request timed out".
    answer: Option<oneshot::Receiver<Result<Unserved, EtcdError>>>,
}

impl AutoCompactor {
    /// Starts the compactor now, at `current_rev`, as etcd starts its compactor when the server
    /// is created; `poll_interval_ms` is how often [`AutoCompactor::tick`] runs (the heartbeat
    /// interval).
    pub fn new(
        retention: Option<Retention>,
        poll_interval_ms: u64,
        now: Instant,
        current_rev: i64,
    ) -> Self {
        AutoCompactor {
            policy: retention.map(|r| Policy::new(r, poll_interval_ms, 0, current_rev)),
            retention,
            epoch: now,
            answer: None,
        }
    }

    /// One raft tick: collect the answer to the compaction in flight, then ask the policy.
    pub fn tick(
        &mut self,
        now: Instant,
        current_rev: i64,
        leadership: Leadership,
        shared: &Shared,
    ) {
        let Some(policy) = self.policy.as_mut() else {
            return;
        };
        let retention = self.retention.expect("a policy has a retention");
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        if let (Some(answer), Some(revision)) = (self.answer.as_mut(), policy.in_flight()) {
            let outcome = match answer.try_recv() {
                Ok(None) => None,
                Ok(Some(Ok(_))) => Some(Outcome::Compacted),
                Ok(Some(Err(EtcdError::Compacted))) => Some(Outcome::AlreadyCompacted),
                Ok(Some(Err(e))) => {
                    tracing::warn!(revision, %retention, error = %e, retry_in_ms = policy.wake_interval_ms(), "failed auto-compaction");
                    Some(Outcome::Failed)
                }
                // The raft core dropped the reply: it is stopping.
                Err(_) => Some(Outcome::Failed),
            };
            if let Some(outcome) = outcome {
                if outcome.succeeded() {
                    tracing::info!(revision, %retention, "finished auto-compaction");
                }
                policy.finished(now_ms, outcome);
                self.answer = None;
            }
        }
        let Some(revision) = policy.poll(now_ms, current_rev, leadership) else {
            return;
        };
        tracing::info!(revision, %retention, "starting auto-compaction");
        match propose(shared, revision) {
            Ok(answer) => self.answer = Some(answer),
            Err(e) => {
                tracing::warn!(revision, %retention, error = %e, retry_in_ms = policy.wake_interval_ms(), "failed auto-compaction");
                policy.finished(now_ms, Outcome::Failed);
            }
        }
    }
}

/// The log entry of a compaction to `revision` under proposal id `id`, as etcd's compactor
/// proposes it: not physical (etcd's compactor does not wait for the compaction to finish).
pub fn compaction_entry(id: u64, revision: i64) -> Bytes {
    let request = pb::InternalRaftRequest {
        header: Some(pb::RequestHeader {
            id,
            ..Default::default()
        }),
        compaction: Some(pb::CompactionRequest {
            revision,
            physical: false,
        }),
        ..Default::default()
    };
    Bytes::from(request.encode_to_vec())
}

/// Queues the compaction behind the client proposals already waiting, with its own proposal id,
/// so it is batched, timed out and answered like any other proposal.
fn propose(
    shared: &Shared,
    revision: i64,
) -> Result<oneshot::Receiver<Result<Unserved, EtcdError>>, EtcdError> {
    let id = shared.next_proposal_id();
    let (reply, answer) = oneshot::channel();
    shared
        .proposals
        .try_send(Proposal {
            data: compaction_entry(id, revision),
            id,
            reply: reply.into(),
        })
        .map_err(|_| EtcdError::TooManyRequests)?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN_MS: u64 = 60 * 1000;
    const HOUR_MS: u64 = 60 * MIN_MS;

    /// Drives a policy the way etcd's tests drive the compactor with a fake clock: time moves
    /// only when the test says so, and each compaction is answered at once.
    struct FakeClock {
        policy: Policy,
        now_ms: u64,
        compactions: Vec<(u64, i64)>,
    }

    impl FakeClock {
        /// Started at time 0 with `rev` as the current revision.
        fn new(retention: Retention, rev: i64) -> Self {
            FakeClock {
                policy: Policy::new(retention, 100, 0, rev),
                now_ms: 0,
                compactions: Vec::new(),
            }
        }

        /// Polls at the current time with `rev` as the current revision.
        fn poll(&mut self, rev: i64, leadership: Leadership, outcome: Outcome) {
            if let Some(r) = self.policy.poll(self.now_ms, rev, leadership) {
                self.compactions.push((self.now_ms, r));
                self.policy.finished(self.now_ms, outcome);
            }
        }

        fn advance(&mut self, ms: u64) {
            self.now_ms += ms;
        }
    }

    /// etcd's fakeRevGetter answers 1, 2, 3, ... on successive calls; the periodic loop calls it
    /// once per wake-up, so at time t the revision it gets is t / retry + 1.
    fn fake_rev(now_ms: u64, retry_ms: u64) -> i64 {
        (now_ms / retry_ms) as i64 + 1
    }

    /// The periodic schedule etcd's TestPeriodicHourly and TestPeriodicMinutes expect: nothing
    /// until the whole retention has passed, then compact to revision 1; after that one
    /// compaction per compact interval (10 samples) to revisions 10, 20, 30, ...
    fn periodic_schedule(period_ms: u64, rounds: usize) {
        let mut c = FakeClock::new(Retention::Periodic { period_ms }, 1);
        let retry_ms = c.policy.wake_interval_ms();
        assert_eq!(retry_ms, period_ms.min(HOUR_MS) / 10);
        let retentions = (period_ms / retry_ms) as usize + 1;
        let poll = |c: &mut FakeClock| {
            let rev = fake_rev(c.now_ms, retry_ms);
            c.poll(rev, Leadership::Leader, Outcome::Compacted);
        };
        // "compaction doesn't happen til 2 hours elapse"
        for _ in 0..retentions {
            c.advance(retry_ms);
            poll(&mut c);
        }
        assert_eq!(c.compactions, vec![(period_ms, 1)]);
        for round in 1..=rounds {
            for _ in 0..10 {
                c.advance(retry_ms);
                poll(&mut c);
            }
            assert_eq!(c.compactions.len(), round + 1, "{:?}", c.compactions);
            assert_eq!(c.compactions[round].1, (round * 10) as i64);
        }
        // Later compactions come every min(period, 1h).
        for pair in c.compactions[1..].windows(2) {
            assert_eq!(pair[1].0 - pair[0].0, period_ms.min(HOUR_MS));
        }
    }

    #[test]
    fn periodic_hourly_as_etcd_test_periodic_hourly() {
        periodic_schedule(2 * HOUR_MS, 3);
    }

    #[test]
    fn periodic_minutes_as_etcd_test_periodic_minutes() {
        periodic_schedule(5 * MIN_MS, 5);
    }

    #[test]
    fn periodic_seconds_compacts_every_period_to_the_revision_a_period_ago() {
        // The e2e test's setting: 2s retention, sampled every 200 ms.
        periodic_schedule(2000, 6);
    }

    /// etcd's TestPeriodicPause: a paused compactor keeps sampling for 3 hours, then compacts at
    /// its first wake-up after resuming, to the revision of hour 2:06.
    #[test]
    fn periodic_pause_as_etcd_test_periodic_pause() {
        let mut c = FakeClock::new(Retention::Periodic { period_ms: HOUR_MS }, 1);
        let retry_ms = c.policy.wake_interval_ms();
        let n = HOUR_MS / retry_ms + 1;
        let poll = |c: &mut FakeClock, leadership| {
            let rev = fake_rev(c.now_ms, retry_ms);
            c.poll(rev, leadership, Outcome::Compacted);
        };
        for _ in 0..n * 3 {
            c.advance(retry_ms);
            poll(&mut c, Leadership::Follower);
        }
        assert!(c.compactions.is_empty(), "{:?}", c.compactions);
        // Resumed: the next wake-up compacts (T = 3h6m).
        poll(&mut c, Leadership::Leader);
        assert!(c.compactions.is_empty());
        c.advance(retry_ms);
        poll(&mut c, Leadership::Leader);
        // etcd's comment says T=3h6m, but its loop advances 3n = 33 retry intervals before
        // resuming, so the compaction comes at 34 x 6 min = 3h24m; the revision is etcd's.
        assert_eq!(
            c.compactions,
            vec![((3 * n + 1) * retry_ms, 1 + 2 * n as i64 + 1)]
        );
    }

    /// etcd's TestRevision: every 5 minutes compact to current - retention; skip when that is
    /// what the last compaction compacted to.
    #[test]
    fn revision_as_etcd_test_revision() {
        let mut c = FakeClock::new(
            Retention::Revision {
                revisions: 10,
                check_interval_ms: REVISION_CHECK_INTERVAL_MS,
            },
            1,
        );
        c.advance(REVISION_CHECK_INTERVAL_MS);
        // Revision 2: 2 - 10 is not positive, nothing happens.
        c.poll(2, Leadership::Leader, Outcome::Compacted);
        assert!(c.compactions.is_empty());
        c.advance(REVISION_CHECK_INTERVAL_MS);
        c.poll(100, Leadership::Leader, Outcome::Compacted);
        assert_eq!(c.compactions, vec![(2 * REVISION_CHECK_INTERVAL_MS, 90)]);
        // Polls between checks do nothing, and the same revision at the next check is skipped.
        c.advance(REVISION_CHECK_INTERVAL_MS / 2);
        c.poll(100, Leadership::Leader, Outcome::Compacted);
        c.advance(REVISION_CHECK_INTERVAL_MS / 2);
        c.poll(100, Leadership::Leader, Outcome::Compacted);
        assert_eq!(c.compactions.len(), 1);
        c.advance(REVISION_CHECK_INTERVAL_MS);
        c.poll(200, Leadership::Leader, Outcome::Compacted);
        assert_eq!(
            c.compactions,
            vec![
                (2 * REVISION_CHECK_INTERVAL_MS, 90),
                (4 * REVISION_CHECK_INTERVAL_MS, 190)
            ]
        );
    }

    /// etcd's TestRevisionPause: paused for 3 hours, then the first check after resuming
    /// compacts (hour 3:05).
    #[test]
    fn revision_pause_as_etcd_test_revision_pause() {
        let mut c = FakeClock::new(
            Retention::Revision {
                revisions: 10,
                check_interval_ms: REVISION_CHECK_INTERVAL_MS,
            },
            100,
        );
        for _ in 0..3 * HOUR_MS / REVISION_CHECK_INTERVAL_MS {
            c.advance(REVISION_CHECK_INTERVAL_MS);
            c.poll(100, Leadership::Follower, Outcome::Compacted);
        }
        assert!(c.compactions.is_empty());
        c.advance(REVISION_CHECK_INTERVAL_MS);
        c.poll(100, Leadership::Leader, Outcome::Compacted);
        assert_eq!(
            c.compactions,
            vec![(3 * HOUR_MS + REVISION_CHECK_INTERVAL_MS, 90)]
        );
    }

    #[test]
    fn a_failed_periodic_compaction_retries_at_the_next_sample_with_the_newer_oldest_revision() {
        let mut c = FakeClock::new(Retention::Periodic { period_ms: 2000 }, 1);
        for _ in 0..10 {
            c.advance(200);
            let rev = fake_rev(c.now_ms, 200);
            c.poll(rev, Leadership::Leader, Outcome::Failed);
        }
        // Failed at 2.0 s (revision 1), so it tries again at the next wake-up with the oldest of
        // the last 11 samples, which is still revision 1 (the window has just filled).
        c.advance(200);
        c.poll(fake_rev(c.now_ms, 200), Leadership::Leader, Outcome::Failed);
        // The window moves on: the third try compacts to revision 2, and succeeds.
        c.advance(200);
        c.poll(
            fake_rev(c.now_ms, 200),
            Leadership::Leader,
            Outcome::Compacted,
        );
        assert_eq!(c.compactions, vec![(2000, 1), (2200, 1), (2400, 2)]);
        // Succeeded at 2.4 s: the next comes a compact interval later, to the oldest of the last
        // 11 samples (taken from 2.2 s, revision 12, to 4.2 s, revision 22).
        for _ in 0..10 {
            c.advance(200);
            c.poll(
                fake_rev(c.now_ms, 200),
                Leadership::Leader,
                Outcome::Compacted,
            );
        }
        assert_eq!(c.compactions.len(), 4);
        assert_eq!(c.compactions.last(), Some(&(4400, 12)));
    }

    #[test]
    fn already_compacted_counts_as_success() {
        let mut c = FakeClock::new(
            Retention::Revision {
                revisions: 10,
                check_interval_ms: 1000,
            },
            50,
        );
        c.advance(1000);
        c.poll(50, Leadership::Leader, Outcome::AlreadyCompacted);
        c.advance(1000);
        // Skipped: 40 is what the last (already compacted) compaction reached.
        c.poll(50, Leadership::Leader, Outcome::AlreadyCompacted);
        assert_eq!(c.compactions, vec![(1000, 40)]);
        // A failure does not count: the same revision is tried again at the next check.
        c.advance(1000);
        c.poll(60, Leadership::Leader, Outcome::Failed);
        c.advance(1000);
        c.poll(60, Leadership::Leader, Outcome::Compacted);
        assert_eq!(c.compactions, vec![(1000, 40), (3000, 50), (4000, 50)]);
    }

    #[test]
    fn nothing_more_is_asked_while_a_compaction_is_unanswered() {
        let mut p = Policy::new(Retention::Periodic { period_ms: 2000 }, 100, 0, 1);
        assert_eq!(p.poll(0, 1, Leadership::Leader), None);
        let mut asked = Vec::new();
        for t in (100..=2000).step_by(100) {
            asked.extend(p.poll(t, 5, Leadership::Leader));
        }
        assert_eq!(asked, vec![1]);
        assert_eq!(p.in_flight(), Some(1));
        for t in (2100..=9000).step_by(100) {
            assert_eq!(p.poll(t, 5, Leadership::Leader), None, "at {t} ms");
        }
        // Answered 7 s late: etcd's loop was blocked all that time; its next wait starts now and
        // the last success is now, so the next compaction is a compact interval from now.
        p.finished(9000, Outcome::Compacted);
        assert_eq!(p.in_flight(), None);
        let mut next = None;
        let mut t = 9000;
        while next.is_none() {
            t += 100;
            next = p.poll(t, 5, Leadership::Leader).map(|r| (t, r));
            assert!(t < 20_000);
        }
        assert_eq!(next, Some((11_000, 5)));
    }

    #[test]
    fn ticks_late_by_less_than_a_poll_keep_the_schedule_on_etcds_grid() {
        // The driver polls every 100 ms, each poll 1 to 60 ms late; the compactions still come
        // every 2000 ms (seen at the first poll after), not 2000 ms plus the lateness of every
        // wake-up in between.
        let mut p = Policy::new(Retention::Periodic { period_ms: 2000 }, 100, 0, 1);
        let mut asked = Vec::new();
        for j in 1..200u64 {
            let t = 100 * j + (j * 37) % 60 + 1;
            if let Some(r) = p.poll(t, j as i64 + 1, Leadership::Leader) {
                asked.push((t, r));
                p.finished(t + 100, Outcome::Compacted);
            }
        }
        assert_eq!(asked.len(), 9, "{asked:?}");
        for (k, (t, r)) in asked.iter().enumerate() {
            let due_ms = 2000 * (k as u64 + 1);
            assert!(
                (due_ms..due_ms + 100).contains(t),
                "compaction {k} at {t} ms"
            );
            // The oldest sample: taken at 0 ms for the first, 2.2 s before the others.
            let sampled_ms = if k == 0 { 0 } else { due_ms - 2200 };
            assert_eq!(*r, (sampled_ms / 100) as i64 + 1, "compaction {k}");
        }
        // A stall of the core is a real delay: one wake-up, and the grid restarts from it.
        let mut p = Policy::new(Retention::Periodic { period_ms: 2000 }, 100, 0, 1);
        assert_eq!(p.poll(5000, 2, Leadership::Leader), Some(1));
        p.finished(5000, Outcome::Compacted);
        assert_eq!(p.poll(5150, 3, Leadership::Leader), None);
        assert_eq!(
            p.poll(5200, 3, Leadership::Leader),
            None,
            "sampled at 5.2 s"
        );
    }

    #[test]
    fn retention_parses_as_etcd_parses_it() {
        let check = REVISION_CHECK_INTERVAL_MS;
        let periodic = |ms| Ok(Some(Retention::Periodic { period_ms: ms }));
        assert_eq!(parse_retention("periodic", "0", check), Ok(None));
        assert_eq!(parse_retention("periodic", "", check), Ok(None));
        assert_eq!(parse_retention("periodic", "0s", check), Ok(None));
        assert_eq!(parse_retention("revision", "0", check), Ok(None));
        // A bare integer is hours in periodic mode.
        assert_eq!(parse_retention("periodic", "1", check), periodic(HOUR_MS));
        assert_eq!(
            parse_retention("periodic", "+2", check),
            periodic(2 * HOUR_MS)
        );
        assert_eq!(
            parse_retention("periodic", "5m", check),
            periodic(5 * MIN_MS)
        );
        assert_eq!(
            parse_retention("periodic", "1h30m", check),
            periodic(90 * MIN_MS)
        );
        assert_eq!(parse_retention("periodic", "2s", check), periodic(2000));
        assert_eq!(
            parse_retention("periodic", "1.5h", check),
            periodic(90 * MIN_MS)
        );
        assert_eq!(parse_retention("periodic", "250us", check), periodic(1));
        assert_eq!(
            parse_retention("revision", "1000", check),
            Ok(Some(Retention::Revision {
                revisions: 1000,
                check_interval_ms: check
            }))
        );
        // etcd's own messages (etcd 3.4.23, checked by running it).
        let err = |mode, value| parse_retention(mode, value, check).expect_err("refused");
        assert_eq!(
            err("periodic", "abc"),
            "error parsing CompactionRetention: time: invalid duration \"abc\""
        );
        assert_eq!(
            err("periodic", "-1"),
            "error parsing CompactionRetention: time: missing unit in duration \"-1\""
        );
        assert_eq!(
            err("periodic", "1.5"),
            "error parsing CompactionRetention: time: missing unit in duration \"1.5\""
        );
        assert_eq!(
            err("revision", "1.5"),
            "error parsing CompactionRetention: time: missing unit in duration \"1.5\""
        );
        assert_eq!(
            err("periodic", "1d"),
            "error parsing CompactionRetention: time: unknown unit \"d\" in duration \"1d\""
        );
        assert_eq!(err("foo", "1"), "unknown auto-compaction-mode \"foo\"");
        assert_eq!(err("", "5m"), "unsupported compaction mode ");
        // etcd accepts these and then misbehaves; Keel refuses them.
        assert!(err("periodic", "-5m").contains("negative"));
        assert!(err("revision", "5m").contains("300000000000 revisions"));
        assert!(err("periodic", "9999999999").contains("too long"));
        // An empty mode with a count leaves etcd's retention at 0: off.
        assert_eq!(parse_retention("", "5", check), Ok(None));
    }

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        let ok = |s: &str| parse_go_duration(s).expect(s);
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("-0"), 0);
        assert_eq!(ok("1ns"), 1);
        assert_eq!(ok("1.5s"), 1_500_000_000);
        assert_eq!(ok(".5s"), 500_000_000);
        assert_eq!(ok("1.s"), 1_000_000_000);
        assert_eq!(ok("1h2m3s4ms5us6ns"), 3_723_004_005_006);
        assert_eq!(ok("3µs"), 3_000);
        assert_eq!(ok("3μs"), 3_000);
        assert_eq!(ok("-1.5h"), -5_400_000_000_000);
        assert_eq!(ok("9223372036854775807ns"), i64::MAX);
        assert_eq!(ok("-9223372036854775808ns"), i64::MIN);
        assert_eq!(ok("1.000000001s"), 1_000_000_001);
        assert_eq!(ok("1.0000000000000000000000001s"), 1_000_000_000);
        let err = |s: &str| parse_go_duration(s).expect_err(s);
        assert_eq!(err(""), "time: invalid duration \"\"");
        assert_eq!(err("-"), "time: invalid duration \"-\"");
        assert_eq!(err("s"), "time: invalid duration \"s\"");
        assert_eq!(err(".s"), "time: invalid duration \".s\"");
        assert_eq!(err("1"), "time: missing unit in duration \"1\"");
        assert_eq!(err("1s2"), "time: missing unit in duration \"1s2\"");
        assert_eq!(err("3x"), "time: unknown unit \"x\" in duration \"3x\"");
        assert_eq!(
            err("3é"),
            "time: unknown unit \"\\xc3\\xa9\" in duration \"3\\xc3\\xa9\""
        );
        assert_eq!(
            err("9223372036854775808ns"),
            "time: invalid duration \"9223372036854775808ns\""
        );
        assert_eq!(err("3000000h"), "time: invalid duration \"3000000h\"");
    }

    #[test]
    fn retention_is_logged_as_etcd_logs_it() {
        assert_eq!(Retention::Periodic { period_ms: 2000 }.to_string(), "2s");
        assert_eq!(Retention::Periodic { period_ms: 1500 }.to_string(), "1.5s");
        assert_eq!(Retention::Periodic { period_ms: 500 }.to_string(), "500ms");
        assert_eq!(
            Retention::Periodic { period_ms: 90_000 }.to_string(),
            "1m30s"
        );
        assert_eq!(
            Retention::Periodic {
                period_ms: 5 * MIN_MS
            }
            .to_string(),
            "5m0s"
        );
        assert_eq!(
            Retention::Periodic { period_ms: HOUR_MS }.to_string(),
            "1h0m0s"
        );
        assert_eq!(
            Retention::Revision {
                revisions: 10,
                check_interval_ms: 1
            }
            .to_string(),
            "10 revisions"
        );
    }
}
