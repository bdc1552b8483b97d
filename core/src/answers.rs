//! Answers to proposals, from the raft core back to the shards, in batches: one wake-up of a
//! shard per batch of answers, not one per answer.
//!
//! A proposal's answer used to travel in its own one-shot channel. The raft core then woke
//! each waiting call's task across threads: an `Arc` allocated per call, locks in the channel,
//! and a push onto the shard executor's queue of foreign wake-ups, per answer. Under a put load
//! that was about 4 % of the server's CPU (bench/results/flame-put-2026-12-06-1654.*).
//!
//! Now each shard has a `ShardAnswers` queue. The raft core pushes every answer for that
//! shard into it, under a lock nobody holds for long, and wakes the shard's drain task only
//! when the queue was not already due for a drain. The drain task hands each answer to its
//! call's slot in the shard's own `Slots` table and wakes the call's task with a local wake.
//!
//! Calls proposed from a thread without a drain task (tests; the raft core's thread unless it
//! hosts a shard, see `shard::Host`) keep the one-shot channel: `Reply` carries either. The
//! raft core's compactor makes its own one-shot channel either way.
//!
//! Bounds: a shard's queue holds at most one answer per `Reply` the member holds for that
//! shard's proposals, which the proposal mailbox and the member's waiting calls bound (each
//! times out with its request); the slots are the shard's calls in flight (its connections
//! times their concurrent streams). A cancelled call frees its slot at once, while its `Reply`
//! stays with the member until answered. The member drops a `Reply` it cannot answer, and
//! the drop answers `Stopped`, as a one-shot channel's cancellation did. Answers held on the
//! raft core (`hold_answers`) wait in a per-shard buffer of at most `HELD_PER_SHARD_MAX`,
//! queued when it fills or when the hold ends, for at most `HELD_SHARDS_MAX` shards.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures_channel::oneshot;
use futures_util::task::AtomicWaker;
use keel_grpc::EtcdError;

use crate::shared::Unserved;

/// What a proposal's caller gets back.
pub type Answered = Result<Unserved, EtcdError>;

/// A slot in one shard's table: its index, and the generation that distinguishes this call
/// from later ones in the same index (an answer for a call that went away is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotKey {
    index: u32,
    /// 64 bits: never wraps, so a stale reply can never match a later call.
    generation: u64,
}

/// One shard's answers, queued by the raft core and drained on the shard.
pub struct ShardAnswers {
    queued: Mutex<Queued>,
    drain: AtomicWaker,
}

struct Queued {
    answers: Vec<(SlotKey, Answered)>,
    /// A wake of the drain task is owed or on its way: later pushes need not wake it again.
    wake_sent: bool,
}

impl ShardAnswers {
    fn new() -> Arc<ShardAnswers> {
        Arc::new(ShardAnswers {
            queued: Mutex::new(Queued {
                answers: Vec::new(),
                wake_sent: false,
            }),
            drain: AtomicWaker::new(),
        })
    }

    fn push(&self, slot: SlotKey, answer: Answered) {
        let wake = {
            let mut queued = self
                .queued
                .lock()
                .expect("nothing panics while the answer queue is held");
            queued.answers.push((slot, answer));
            !std::mem::replace(&mut queued.wake_sent, true)
        };
        if wake {
            self.drain.wake();
        }
    }

    /// Queues `held` (emptied; its buffer may be swapped for the queue's) under one lock.
    fn push_all(&self, held: &mut Vec<(SlotKey, Answered)>) {
        let wake = {
            let mut queued = self
                .queued
                .lock()
                .expect("nothing panics while the answer queue is held");
            if queued.answers.is_empty() {
                std::mem::swap(&mut queued.answers, held);
            } else {
                queued.answers.append(held);
            }
            !std::mem::replace(&mut queued.wake_sent, true)
        };
        if wake {
            self.drain.wake();
        }
    }

    /// Swaps what is queued into `into` (empty on entry), or registers the drain task to be
    /// woken by the next push.
    fn take_or_register(&self, into: &mut Vec<(SlotKey, Answered)>, cx: &Context<'_>) -> bool {
        debug_assert!(into.is_empty());
        // Registered before looking: a push after the look sees `wake_sent` false and wakes
        // this registration.
        self.drain.register(cx.waker());
        let mut queued = self
            .queued
            .lock()
            .expect("nothing panics while the answer queue is held");
        queued.wake_sent = false;
        if queued.answers.is_empty() {
            return false;
        }
        std::mem::swap(&mut queued.answers, into);
        true
    }
}

/// Answers held for one shard, in the order they were sent.
type HeldForShard = (Arc<ShardAnswers>, Vec<(SlotKey, Answered)>);

/// A shard's held answers are queued once this many wait: one lock for this many answers
/// already saves nearly all of the locking, and the first of them waits for the others'
/// apply only this long (about a microsecond each).
const HELD_PER_SHARD_MAX: usize = 64;

/// Shards one thread may hold answers for: a member's shards are one per CPU it runs on, and
/// each answer's shard is one of them. Past it (never expected), an answer goes on unheld.
const HELD_SHARDS_MAX: usize = 4096;

/// The answers this thread sends while a [`HeldAnswers`] lives, by the shard they go to.
struct Held {
    holding: bool,
    /// One entry per shard answered while holding, kept with its buffer between holds: the
    /// raft core's thread answers the same few shards for as long as it runs.
    by_shard: Vec<HeldForShard>,
}

thread_local! {
    static HELD: RefCell<Held> = const {
        RefCell::new(Held {
            holding: false,
            by_shard: Vec::new(),
        })
    };
}

/// Queues `answer` for its shard, or holds it there while this thread holds its answers.
fn send_to(answers: &Arc<ShardAnswers>, slot: SlotKey, answer: Answered) {
    // The shard's place among the held ones is found first, so an answer not held is not
    // moved through the holding code (an answer is a few hundred bytes). `try_with`: a reply
    // dropped while the thread ends, after its locals, goes straight on.
    let at = HELD
        .try_with(|held| {
            let mut held = held.borrow_mut();
            if !held.holding {
                return None;
            }
            match held
                .by_shard
                .iter()
                .position(|(shard, _)| Arc::ptr_eq(shard, answers))
            {
                Some(at) => Some(at),
                // Past the bound (never expected), the answer goes straight on, unheld.
                None if held.by_shard.len() >= HELD_SHARDS_MAX => None,
                None => {
                    held.by_shard.push((answers.clone(), Vec::new()));
                    Some(held.by_shard.len() - 1)
                }
            }
        })
        .ok()
        .flatten();
    let Some(at) = at else {
        answers.push(slot, answer);
        return;
    };
    let full = HELD.with(|held| {
        let buffer = &mut held.borrow_mut().by_shard[at].1;
        buffer.push((slot, answer));
        // Taken out when full, so that the queue's lock and wake run outside this borrow.
        (buffer.len() >= HELD_PER_SHARD_MAX).then(|| std::mem::take(buffer))
    });
    if let Some(mut full) = full {
        answers.push_all(&mut full);
        // `push_all` swapped in the queue's emptied vector, room and all: keep it for the
        // next answers rather than grow a fresh one from nothing.
        HELD.with(|held| {
            let buffer = &mut held.borrow_mut().by_shard[at].1;
            if buffer.is_empty() {
                *buffer = full;
            }
        });
    }
}

/// While this lives, answers sent on this thread to shards' queues are held, and queued when
/// it drops, each shard's under one lock. The raft core holds them over each step that
/// applies entries: answered one by one, each answer took the queue's lock while the shard's
/// drain took it too, and that lock's traffic between the two CPUs was about 1 % of a put's
/// server CPU. Bounded by what one step answers (its entries, bounded by the raft batch
/// limits, and the calls it refuses); held only within the step, never across an await.
#[must_use = "answers are held only while the guard lives"]
pub struct HeldAnswers {
    /// Not `Send`: the guard releases the answers of the thread that made it.
    _thread: std::marker::PhantomData<*const ()>,
}

/// Holds this thread's answers until the returned guard drops (see [`HeldAnswers`]).
pub fn hold_answers() -> HeldAnswers {
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        assert!(!held.holding, "answers are held once at a time");
        held.holding = true;
    });
    HeldAnswers {
        _thread: std::marker::PhantomData,
    }
}

impl Drop for HeldAnswers {
    fn drop(&mut self) {
        // Taken out, so that the queues' locks and wakes run outside the thread-local's
        // borrow; `holding` is cleared first, so a send meanwhile (none is expected) goes
        // straight on.
        let mut by_shard = HELD.with(|held| {
            let mut held = held.borrow_mut();
            held.holding = false;
            std::mem::take(&mut held.by_shard)
        });
        for (shard, answers) in &mut by_shard {
            if !answers.is_empty() {
                shard.push_all(answers);
            }
        }
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if held.by_shard.is_empty() {
                held.by_shard = by_shard;
            }
        });
    }
}

/// Where a proposal's answer goes. A shard's answer sent while its thread holds answers
/// (`hold_answers`, the raft core over each applying step) waits in that thread's buffer until
/// the hold ends or the buffer fills: the member answers through `send` alike either way.
pub struct Reply(ReplyTo);

enum ReplyTo {
    Oneshot(oneshot::Sender<Answered>),
    Shard {
        answers: Arc<ShardAnswers>,
        slot: SlotKey,
    },
    /// Sent (only between `send` taking it and the drop).
    Done,
}

/// The call a reply was for went away before its answer (its request was cancelled).
#[derive(Debug)]
pub struct CallGone;

impl Reply {
    /// Answers the call. Where the call went away (its request was cancelled) the answer is
    /// dropped; a one-shot reply says so with `CallGone`, a shard's finds out on the shard.
    pub fn send(mut self, answer: Answered) -> Result<(), CallGone> {
        match std::mem::replace(&mut self.0, ReplyTo::Done) {
            ReplyTo::Oneshot(sender) => sender.send(answer).map_err(|_| CallGone),
            ReplyTo::Shard { answers, slot } => {
                send_to(&answers, slot, answer);
                Ok(())
            }
            ReplyTo::Done => unreachable!("a reply is sent once: `send` takes it"),
        }
    }
}

impl Reply {
    /// Drops the reply without answering: for a proposal that never reached the raft core,
    /// whose caller was already told why (no `Stopped` queued for a call that has returned).
    pub fn forget(mut self) {
        self.0 = ReplyTo::Done;
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        // Never answered: the call ends with `Stopped`, as a dropped one-shot sender's
        // cancellation read.
        if let ReplyTo::Shard { answers, slot } = std::mem::replace(&mut self.0, ReplyTo::Done) {
            send_to(&answers, slot, Err(EtcdError::Stopped));
        }
    }
}

impl From<oneshot::Sender<Answered>> for Reply {
    fn from(sender: oneshot::Sender<Answered>) -> Reply {
        Reply(ReplyTo::Oneshot(sender))
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ReplyTo::Oneshot(_) => f.write_str("Reply(oneshot)"),
            ReplyTo::Shard { slot, .. } => write!(f, "Reply(slot {})", slot.index),
            ReplyTo::Done => f.write_str("Reply(done)"),
        }
    }
}

/// A shard's waiting calls.
struct Slots {
    entries: RefCell<Vec<Slot>>,
    /// Indexes of free entries.
    free: RefCell<Vec<u32>>,
    next_generation: Cell<u64>,
}

struct Slot {
    generation: u64,
    state: SlotState,
}

enum SlotState {
    Free,
    Waiting(Option<Waker>),
    Answered(Answered),
}

impl Slots {
    fn take(&self) -> SlotKey {
        let generation = self.next_generation.get();
        self.next_generation.set(generation + 1);
        let mut entries = self.entries.borrow_mut();
        let slot = Slot {
            generation,
            state: SlotState::Waiting(None),
        };
        let index = match self.free.borrow_mut().pop() {
            Some(index) => {
                entries[index as usize] = slot;
                index
            }
            None => {
                entries.push(slot);
                u32::try_from(entries.len() - 1).expect("fewer than 2^32 calls wait on a shard")
            }
        };
        SlotKey { index, generation }
    }

    fn release(&self, key: SlotKey) {
        let mut entries = self.entries.borrow_mut();
        let slot = &mut entries[key.index as usize];
        assert!(
            slot.generation == key.generation && !matches!(slot.state, SlotState::Free),
            "a slot is released once, by its own call"
        );
        slot.state = SlotState::Free;
        self.free.borrow_mut().push(key.index);
    }

    /// Gives the answer to its call, if that call still waits.
    fn answer(&self, key: SlotKey, answer: Answered) {
        let waker = {
            let mut entries = self.entries.borrow_mut();
            let slot = &mut entries[key.index as usize];
            if slot.generation != key.generation {
                // The call went away, and its slot serves another one now.
                return;
            }
            match std::mem::replace(&mut slot.state, SlotState::Answered(answer)) {
                SlotState::Waiting(waker) => waker,
                SlotState::Free => {
                    // The call went away and nobody took the slot since.
                    slot.state = SlotState::Free;
                    return;
                }
                SlotState::Answered(_) => unreachable!("one answer per proposal"),
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn poll(&self, key: SlotKey, cx: &Context<'_>) -> Poll<Answered> {
        let mut entries = self.entries.borrow_mut();
        let slot = &mut entries[key.index as usize];
        assert_eq!(
            slot.generation, key.generation,
            "a waiting call owns its slot"
        );
        match &mut slot.state {
            SlotState::Waiting(waker) => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Answered(_) => {
                let SlotState::Answered(answer) =
                    std::mem::replace(&mut slot.state, SlotState::Free)
                else {
                    unreachable!("matched just above")
                };
                drop(entries);
                self.free.borrow_mut().push(key.index);
                Poll::Ready(answer)
            }
            SlotState::Free => unreachable!("a waiting call's slot is never free"),
        }
    }
}

/// This thread's answer queue and slots, when it runs a drain task (a shard).
struct ThisShard {
    answers: Arc<ShardAnswers>,
    slots: Rc<Slots>,
}

thread_local! {
    static THIS_SHARD: RefCell<Option<ThisShard>> = const { RefCell::new(None) };
}

/// Makes this thread's proposals take their answers in batches, and returns the task that
/// drains them: spawn it on this thread's executor, which must be the one that proposes.
/// None when this thread has its queue already: shards that share an executor (those on the
/// raft core's CPU, `shard::Host`) share its queue, slots and drain task.
pub fn install_on_this_thread() -> Option<impl Future<Output = ()>> {
    if THIS_SHARD.with(|this| this.borrow().is_some()) {
        return None;
    }
    let answers = ShardAnswers::new();
    let slots = Rc::new(Slots {
        entries: RefCell::new(Vec::new()),
        free: RefCell::new(Vec::new()),
        next_generation: Cell::new(0),
    });
    THIS_SHARD.with(|this| {
        let previous = this.replace(Some(ThisShard {
            answers: answers.clone(),
            slots: slots.clone(),
        }));
        assert!(previous.is_none(), "one answer queue per thread");
    });
    Some(drain(answers, slots))
}

async fn drain(answers: Arc<ShardAnswers>, slots: Rc<Slots>) {
    // Swapped with the queue's vector each time: no allocation per batch once both have grown.
    let mut batch = Vec::new();
    loop {
        std::future::poll_fn(|cx| {
            if answers.take_or_register(&mut batch, cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        for (slot, answer) in batch.drain(..) {
            slots.answer(slot, answer);
        }
    }
}

/// A reply for a proposal made on this thread, and the wait for its answer.
pub fn reply_here() -> (Reply, AnswerWait) {
    let batched = THIS_SHARD.with(|this| {
        this.borrow().as_ref().map(|this| {
            let slot = this.slots.take();
            (this.answers.clone(), this.slots.clone(), slot)
        })
    });
    match batched {
        Some((answers, slots, slot)) => (
            Reply(ReplyTo::Shard { answers, slot }),
            AnswerWait(Wait::Slot {
                slots,
                slot,
                done: false,
            }),
        ),
        None => {
            let (sender, receiver) = oneshot::channel();
            (sender.into(), AnswerWait(Wait::Oneshot(receiver)))
        }
    }
}

/// Waits for a proposal's answer; `Stopped` when the member dropped its reply unanswered.
pub struct AnswerWait(Wait);

enum Wait {
    Oneshot(oneshot::Receiver<Answered>),
    Slot {
        slots: Rc<Slots>,
        slot: SlotKey,
        done: bool,
    },
}

impl Future for AnswerWait {
    type Output = Answered;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answered> {
        match &mut self.get_mut().0 {
            Wait::Oneshot(receiver) => Pin::new(receiver)
                .poll(cx)
                .map(|r| r.unwrap_or(Err(EtcdError::Stopped))),
            Wait::Slot { slots, slot, done } => {
                assert!(!*done, "polled after its answer");
                let answer = slots.poll(*slot, cx);
                *done = answer.is_ready();
                answer
            }
        }
    }
}

impl Drop for AnswerWait {
    fn drop(&mut self) {
        if let Wait::Slot {
            slots,
            slot,
            done: false,
        } = &self.0
        {
            // The call went away unanswered (a cancelled request): its answer, when it comes,
            // finds the slot free or another call's, and is dropped.
            slots.release(*slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::{Answer, Outcome};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    fn answered(term: u64) -> Answered {
        Ok(Outcome {
            response: Answer::Alarms(Vec::new()),
            raft_term: term,
        })
    }

    fn term(answer: Poll<Answered>) -> u64 {
        match answer {
            Poll::Ready(Ok(outcome)) => outcome.raft_term,
            Poll::Ready(Err(e)) => panic!("answered {e:?}"),
            Poll::Pending => panic!("not answered yet"),
        }
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker::default());
        (counter.clone(), Waker::from(counter))
    }

    /// Lets the drain task hand on what is queued, and checks that `wait` was answered
    /// `Stopped` (its reply was dropped unanswered).
    fn assert_answered_stopped<F: Future<Output = ()> + ?Sized>(
        drain: &mut Pin<Box<F>>,
        drain_cx: &mut Context<'_>,
        wait: &mut AnswerWait,
        call_cx: &mut Context<'_>,
    ) {
        assert!(drain.as_mut().poll(drain_cx).is_pending());
        assert!(matches!(
            Pin::new(wait).poll(call_cx),
            Poll::Ready(Err(EtcdError::Stopped))
        ));
    }

    /// Answers `reply` with `term` and lets the drain task hand it on.
    fn deliver(
        drain: &mut Pin<Box<impl Future<Output = ()>>>,
        cx: &mut Context<'_>,
        reply: Reply,
        term: u64,
    ) {
        reply.send(answered(term)).expect("queued for the shard");
        assert!(drain.as_mut().poll(cx).is_pending());
    }

    /// This thread's drain task, polled once, and `calls` calls waiting on it (each polled
    /// once), with counting wakers for both.
    struct CallsWaiting {
        drain: Pin<Box<dyn Future<Output = ()>>>,
        drain_wakes: Arc<CountingWaker>,
        drain_waker: Waker,
        calls_woken: Arc<CountingWaker>,
        call_waker: Waker,
        replies: Vec<Reply>,
        waits: Vec<AnswerWait>,
    }

    fn calls_waiting(calls: usize) -> CallsWaiting {
        let mut drain: Pin<Box<dyn Future<Output = ()>>> =
            Box::pin(install_on_this_thread().expect("the first on this thread"));
        let (drain_wakes, drain_waker) = counting();
        assert!(drain
            .as_mut()
            .poll(&mut Context::from_waker(&drain_waker))
            .is_pending());
        let (calls_woken, call_waker) = counting();
        let (replies, mut waits): (Vec<Reply>, Vec<AnswerWait>) =
            (0..calls).map(|_| reply_here()).unzip();
        for wait in &mut waits {
            assert!(Pin::new(wait)
                .poll(&mut Context::from_waker(&call_waker))
                .is_pending());
        }
        CallsWaiting {
            drain,
            drain_wakes,
            drain_waker,
            calls_woken,
            call_waker,
            replies,
            waits,
        }
    }

    /// A batch of answers from another thread wakes the shard's drain task once, and each
    /// waiting call once, with its own answer.
    #[test]
    fn a_batch_of_answers_wakes_the_shard_once() {
        let CallsWaiting {
            mut drain,
            drain_wakes,
            drain_waker,
            calls_woken,
            call_waker,
            replies,
            mut waits,
        } = calls_waiting(100);
        let mut drain_cx = Context::from_waker(&drain_waker);
        let mut call_cx = Context::from_waker(&call_waker);
        // The raft core answers them all in reverse, from its own thread.
        std::thread::spawn(move || {
            for (i, reply) in replies.into_iter().enumerate().rev() {
                reply
                    .send(answered(i as u64))
                    .expect("the shard takes every answer");
            }
        })
        .join()
        .expect("the answering thread");
        assert_eq!(
            drain_wakes.0.load(Ordering::SeqCst),
            1,
            "one wake per batch"
        );
        assert_eq!(
            calls_woken.0.load(Ordering::SeqCst),
            0,
            "calls wait for the drain"
        );

        assert!(drain.as_mut().poll(&mut drain_cx).is_pending());
        assert_eq!(calls_woken.0.load(Ordering::SeqCst), 100, "each call once");
        for (i, wait) in waits.iter_mut().enumerate() {
            assert_eq!(term(Pin::new(wait).poll(&mut call_cx)), i as u64);
        }
        // The next answer wakes the drain task again.
        let (reply, mut wait) = reply_here();
        assert!(Pin::new(&mut wait).poll(&mut call_cx).is_pending());
        reply.send(answered(7)).expect("taken");
        assert_eq!(drain_wakes.0.load(Ordering::SeqCst), 2);
        assert!(drain.as_mut().poll(&mut drain_cx).is_pending());
        assert_eq!(term(Pin::new(&mut wait).poll(&mut call_cx)), 7);
    }

    /// Answers sent while held wait for the guard, then reach the shard in one push and one
    /// wake, in the order they were sent; without a guard, each goes on at once.
    #[test]
    fn held_answers_reach_the_shard_when_the_guard_drops() {
        let CallsWaiting {
            mut drain,
            drain_wakes,
            drain_waker,
            calls_woken,
            call_waker,
            replies,
            mut waits,
        } = calls_waiting(50);
        let mut drain_cx = Context::from_waker(&drain_waker);
        let mut call_cx = Context::from_waker(&call_waker);
        let wakes = drain_wakes.clone();
        let shard = THIS_SHARD.with(|this| this.borrow().as_ref().unwrap().answers.clone());
        let sent_generations: Vec<u64> = replies[..49]
            .iter()
            .rev()
            .map(|reply| match &reply.0 {
                ReplyTo::Shard { slot, .. } => slot.generation,
                _ => unreachable!("a shard's reply"),
            })
            .collect();
        std::thread::spawn(move || {
            let mut replies = replies.into_iter();
            let mut first: Vec<(usize, Reply)> = replies.by_ref().take(49).enumerate().collect();
            // Sent in reverse, so that the order checked below is the sending order.
            first.reverse();
            let held = hold_answers();
            for (i, reply) in first {
                reply.send(answered(i as u64)).expect("held for the shard");
            }
            assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "held, not queued");
            drop(held);
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "one wake for all");
            // All 49 in one push, in the order sent: the queue holds exactly them.
            let queued: Vec<u64> = shard
                .queued
                .lock()
                .unwrap()
                .answers
                .iter()
                .map(|(slot, _)| slot.generation)
                .collect();
            assert_eq!(queued, sent_generations);
            // Not held: queued at once (the drain is already due, so no second wake).
            let last = replies.next().expect("the 50th");
            last.send(answered(49)).expect("queued");
        })
        .join()
        .expect("the answering thread");
        assert!(drain.as_mut().poll(&mut drain_cx).is_pending());
        assert_eq!(calls_woken.0.load(Ordering::SeqCst), 50);
        for (i, wait) in waits.iter_mut().enumerate() {
            assert_eq!(term(Pin::new(wait).poll(&mut call_cx)), i as u64);
        }
        // A reply dropped unanswered while held answers `Stopped` when the guard drops.
        let (reply, mut wait) = reply_here();
        assert!(Pin::new(&mut wait).poll(&mut call_cx).is_pending());
        let held = hold_answers();
        drop(reply);
        assert!(drain.as_mut().poll(&mut drain_cx).is_pending());
        assert!(
            Pin::new(&mut wait).poll(&mut call_cx).is_pending(),
            "still held"
        );
        drop(held);
        assert_answered_stopped(&mut drain, &mut drain_cx, &mut wait, &mut call_cx);
    }

    /// A shard's held answers are queued each time `HELD_PER_SHARD_MAX` wait, before the hold
    /// ends: the first answer of a long step does not wait for the whole step.
    #[test]
    fn held_answers_are_queued_when_a_shards_buffer_fills() {
        // The drain task and the calls stay alive (unpolled) while the answers are sent.
        let CallsWaiting {
            drain: _drain,
            drain_wakes,
            replies,
            waits: _waits,
            ..
        } = calls_waiting(HELD_PER_SHARD_MAX + 1);
        let shard = THIS_SHARD.with(|this| this.borrow().as_ref().unwrap().answers.clone());
        let queued = move || -> Vec<u64> {
            let queued = shard.queued.lock().unwrap();
            queued
                .answers
                .iter()
                .map(|(slot, _)| slot.generation)
                .collect()
        };
        let generation = |reply: &Reply| match &reply.0 {
            ReplyTo::Shard { slot, .. } => slot.generation,
            _ => unreachable!("a shard's reply"),
        };
        // Sent in reverse, so that the order checked is the sending order.
        let sent: Vec<u64> = replies.iter().rev().map(generation).collect();
        let wakes = drain_wakes.clone();
        std::thread::spawn(move || {
            let held = hold_answers();
            for reply in replies.into_iter().rev() {
                reply.send(answered(1)).expect("held");
            }
            assert_eq!(
                queued(),
                sent[..HELD_PER_SHARD_MAX],
                "a full buffer goes at once"
            );
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
            drop(held);
            assert_eq!(queued(), sent, "the rest when the hold ends, after them");
        })
        .join()
        .expect("the answering thread");
    }

    /// A call that went away (its request was cancelled) frees its slot; its answer, arriving
    /// later, is dropped and never reaches the call that took the slot next.
    #[test]
    fn a_late_answer_never_reaches_the_slots_next_call() {
        let mut drain = Box::pin(install_on_this_thread().expect("the first on this thread"));
        let (_, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert!(drain.as_mut().poll(&mut cx).is_pending());

        let (stale_reply, stale_wait) = reply_here();
        drop(stale_wait);
        let (reply, mut wait) = reply_here();
        deliver(&mut drain, &mut cx, stale_reply, 1);
        assert!(
            Pin::new(&mut wait).poll(&mut cx).is_pending(),
            "the stale answer went to nobody"
        );
        deliver(&mut drain, &mut cx, reply, 2);
        assert_eq!(term(Pin::new(&mut wait).poll(&mut cx)), 2);

        // Answered before the call went away: the answer is dropped with the slot.
        let (reply, wait) = reply_here();
        deliver(&mut drain, &mut cx, reply, 3);
        drop(wait);
        let (reply, mut wait) = reply_here();
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        deliver(&mut drain, &mut cx, reply, 4);
        assert_eq!(term(Pin::new(&mut wait).poll(&mut cx)), 4);
    }

    /// A reply the member drops unanswered (it stopped) ends its call with `Stopped`, as a
    /// dropped one-shot sender did.
    #[test]
    fn a_dropped_reply_answers_stopped() {
        let mut drain = Box::pin(install_on_this_thread().expect("the first on this thread"));
        let (_, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let (reply, mut wait) = reply_here();
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        std::thread::spawn(move || drop(reply))
            .join()
            .expect("the dropping thread");
        let mut call_cx = Context::from_waker(&waker);
        assert_answered_stopped(&mut drain, &mut cx, &mut wait, &mut call_cx);
    }

    /// A thread without a drain task (the raft core's compactor, tests) gets a one-shot
    /// channel, answered directly.
    #[test]
    fn a_thread_without_a_drain_task_uses_a_oneshot_channel() {
        let (reply, mut wait) = reply_here();
        assert!(format!("{reply:?}").contains("oneshot"));
        let (_, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        reply.send(answered(5)).expect("the wait is there");
        assert_eq!(term(Pin::new(&mut wait).poll(&mut cx)), 5);
        let (reply, wait) = reply_here();
        drop(reply);
        assert!(matches!(
            futures_lite::future::block_on(wait),
            Err(EtcdError::Stopped)
        ));
    }
}
