//! The raft loop's watchdog: a thread beside the raft CPU that watches the loop turn.
//!
//! Health already reports a raft core that stopped turning, but a member whose loop hangs for
//! good (an await that never completes, a task on its executor that never yields) would still
//! linger: it answers serializable reads from its shards and holds its ports, while nothing it
//! is sent commits. The loop therefore says what it is waiting on (`LoopPhase`), and this
//! thread judges each stall by that phase:
//! - a loop idle past its own timer, or stuck in one step of work, can only be a bug (both
//!   have bounds far below the limits here), so the member logs why and exits non-zero, and
//!   its supervisor restarts it; nothing acknowledged is lost, since only fsynced entries were;
//! - a WAL write that has not completed in a minute is a disk that stopped answering, which
//!   ends the member the same way (a batch is at most a few MiB);
//! - writing a received snapshot, restoring the store from it, or finishing a checkpoint
//!   takes time in proportion to the store, so those only warn.
//!
//! Every stall past the election timeout is logged with its phase while it lasts.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::shared::Shared;

/// What the raft loop is doing, as the watchdog sees it.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopPhase {
    /// Before the loop's first turn (recovery is over; the loop is about to start).
    Starting = 0,
    /// Stepping messages, ticking, applying: CPU work between awaits.
    Working = 1,
    /// Waiting for work, or for its next tick (`Shared::raft_loop_wake_by_ms`).
    Idle = 2,
    /// Waiting on a WAL write and its fdatasync.
    WalAppend = 3,
    /// Writing a leader's snapshot as this member's checkpoint.
    PersistSnapshot = 4,
    /// Taking a written checkpoint (its releases run beside the loop).
    FinishCheckpoint = 5,
    /// Restoring a leader's snapshot, stored as this member's checkpoint, into the store that
    /// replaces the member's (seconds at millions of keys).
    RestoreSnapshot = 6,
}

impl LoopPhase {
    pub fn from_u8(v: u8) -> LoopPhase {
        match v {
            1 => LoopPhase::Working,
            2 => LoopPhase::Idle,
            3 => LoopPhase::WalAppend,
            4 => LoopPhase::PersistSnapshot,
            5 => LoopPhase::FinishCheckpoint,
            6 => LoopPhase::RestoreSnapshot,
            _ => LoopPhase::Starting,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LoopPhase::Starting => "starting",
            LoopPhase::Working => "working",
            LoopPhase::Idle => "idle",
            LoopPhase::WalAppend => "wal append",
            LoopPhase::PersistSnapshot => "persisting a snapshot",
            LoopPhase::FinishCheckpoint => "finishing a checkpoint",
            LoopPhase::RestoreSnapshot => "restoring a received snapshot",
        }
    }
}

/// How far past its own timer an idle loop may be before the member gives up: the executor
/// is then not running its tasks (a task that never yields, or a wake-up that was lost).
pub const IDLE_OVERDUE_MS_MAX: u64 = 10_000;
/// The longest one stretch of work between two awaits may take (a Ready's apply is bounded
/// by the batch limits, a compaction step by its own budget: both far below this).
pub const WORKING_MS_MAX: u64 = 30_000;
/// The longest a WAL write and its fdatasync may take (a batch is at most a few MiB).
pub const WAL_APPEND_MS_MAX: u64 = 60_000;
/// A watchdog look that comes this much later than it meant to means the process itself was
/// paused: that look is skipped.
const PAUSE_MS_MIN: u64 = 2_000;
/// How often a stall that goes on is logged again.
const STALL_LOG_EVERY_MS: u64 = 10_000;

/// What the watchdog makes of the loop's state at one look.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Fine,
    /// Not turning for longer than health allows; warn.
    Stalled,
    /// Cannot be a slow step: the member must stop. The text says why.
    Stuck(String),
}

/// One look at the loop: how long since it last turned, how long it has been in its phase,
/// and (for an idle loop) how far past the time it meant to wake.
pub fn judge(
    phase: LoopPhase,
    loop_idle_ms: u64,
    phase_age_ms: u64,
    idle_overdue_ms: u64,
    stall_ms_max: u64,
) -> Verdict {
    if loop_idle_ms <= stall_ms_max {
        return Verdict::Fine;
    }
    match phase {
        LoopPhase::Idle if idle_overdue_ms > IDLE_OVERDUE_MS_MAX => Verdict::Stuck(format!(
            "the raft loop's timer is {idle_overdue_ms} ms overdue: its executor is not running its tasks"
        )),
        LoopPhase::Working if phase_age_ms > WORKING_MS_MAX => Verdict::Stuck(format!(
            "one step of the raft loop has run for {phase_age_ms} ms without finishing or yielding"
        )),
        LoopPhase::WalAppend if phase_age_ms > WAL_APPEND_MS_MAX => Verdict::Stuck(format!(
            "a WAL write and its fdatasync have not completed in {phase_age_ms} ms"
        )),
        _ => Verdict::Stalled,
    }
}

/// Starts the watchdog thread for this member's raft loop; it ends when the member stops.
pub fn start(shared: Arc<Shared>) -> std::io::Result<()> {
    let stall_ms_max = crate::http::raft_stall_ms_max(&shared);
    let every = Duration::from_millis((stall_ms_max / 4).clamp(50, 1000));
    // This thread wakes on a timer whatever the member is doing, keeps off the raft core's
    // CPU, and its own heap is tiny: the allocator's purges are carried out here, not on the
    // raft core or a shard (see `rt::leave_freed_memory_to_the_purger`).
    crate::rt::leave_freed_memory_to_the_purger();
    let raft_cpu = shared.config.raft_cpu;
    crate::rt::spawn_off_cpu("keel-watchdog", raft_cpu, move || {
        let mut last_logged_ms: Option<u64> = None;
        let mut last_look_ms = shared.uptime_ms();
        let mut last_purge_ms = last_look_ms;
        while !shared.stopping.load(Ordering::Acquire) {
            std::thread::sleep(every);
            let purge_due_ms =
                last_purge_ms + crate::rt::FREED_MEMORY_PURGE_EVERY.as_millis() as u64;
            if shared.uptime_ms() >= purge_due_ms {
                // Spare value-log buffers no segment took within a purge period go back too:
                // under writes they are taken within milliseconds, so only an idle member's go.
                keel_kv::release_spare_segment_buffers(crate::rt::FREED_MEMORY_PURGE_EVERY);
                crate::rt::release_freed_memory();
                last_purge_ms = shared.uptime_ms();
            }
            // Read after the purge, which may take tens of milliseconds.
            let now_ms = shared.uptime_ms();
            let slept_ms = now_ms.saturating_sub(last_look_ms);
            last_look_ms = now_ms;
            if slept_ms > PAUSE_MS_MIN.max(4 * every.as_millis() as u64) {
                // This thread overslept: the whole process was paused (SIGSTOP, a frozen VM),
                // not its raft loop alone. Give the loop a look's time to turn first.
                continue;
            }
            let (phase, phase_age_ms, idle_overdue_ms) = shared.raft_loop_phase(now_ms);
            let loop_idle_ms = shared.raft_loop_idle_ms();
            match judge(
                phase,
                loop_idle_ms,
                phase_age_ms,
                idle_overdue_ms,
                stall_ms_max,
            ) {
                Verdict::Fine => last_logged_ms = None,
                Verdict::Stalled => {
                    if last_logged_ms.is_none_or(|at| now_ms >= at + STALL_LOG_EVERY_MS) {
                        last_logged_ms = Some(now_ms);
                        tracing::warn!(
                            phase = phase.name(),
                            stalled_ms = loop_idle_ms,
                            phase_ms = phase_age_ms,
                            expected_ms = stall_ms_max,
                            "the raft loop has not turned for longer than an election timeout"
                        );
                    }
                }
                Verdict::Stuck(why) => {
                    if shared.stopping.load(Ordering::Acquire) {
                        return;
                    }
                    crate::node::stop_stuck(&shared, phase, loop_idle_ms, &why);
                }
            }
        }
    })
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_turns_is_fine_whatever_its_phase() {
        for phase in [
            LoopPhase::Idle,
            LoopPhase::Working,
            LoopPhase::WalAppend,
            LoopPhase::PersistSnapshot,
        ] {
            assert_eq!(judge(phase, 900, 900, 0, 1000), Verdict::Fine);
        }
    }

    #[test]
    fn slow_steps_warn_and_impossible_ones_stop_the_member() {
        // Stalled past health's limit, but within what each phase may take: a warning.
        assert_eq!(
            judge(LoopPhase::WalAppend, 5_000, 5_000, 0, 1000),
            Verdict::Stalled
        );
        assert_eq!(
            judge(LoopPhase::Working, 5_000, 5_000, 0, 1000),
            Verdict::Stalled
        );
        assert_eq!(
            judge(LoopPhase::Idle, 5_000, 5_000, 4_900, 1000),
            Verdict::Stalled
        );
        // Sized by the store: never fatal.
        for phase in [
            LoopPhase::PersistSnapshot,
            LoopPhase::RestoreSnapshot,
            LoopPhase::FinishCheckpoint,
        ] {
            assert_eq!(
                judge(phase, 3_600_000, 3_600_000, 0, 1000),
                Verdict::Stalled
            );
        }
        // Past the bounds: the member cannot go on.
        let stuck = |v: Verdict| matches!(v, Verdict::Stuck(_));
        assert!(stuck(judge(LoopPhase::Idle, 12_000, 12_000, 11_000, 1000)));
        assert!(stuck(judge(LoopPhase::Working, 31_000, 31_000, 0, 1000)));
        assert!(stuck(judge(LoopPhase::WalAppend, 61_000, 61_000, 0, 1000)));
        // An idle loop is judged by its own timer, not by the time since its last turn.
        assert_eq!(
            judge(LoopPhase::Idle, 12_000, 12_000, 9_000, 1000),
            Verdict::Stalled
        );
    }

    #[test]
    fn phases_round_trip_through_their_byte() {
        for phase in [
            LoopPhase::Starting,
            LoopPhase::Working,
            LoopPhase::Idle,
            LoopPhase::WalAppend,
            LoopPhase::PersistSnapshot,
            LoopPhase::FinishCheckpoint,
            LoopPhase::RestoreSnapshot,
        ] {
            assert_eq!(LoopPhase::from_u8(phase as u8), phase);
        }
    }
}
