//! The thin layer over glommio and the cross-core plumbing: pinned executors, a bounded
//! multi-producer mailbox that wakes its single consumer on another core, and glommio's
//! implementation of keel-grpc's runtime trait.
//!
//! glommio is pinned (=0.9.0) and has open bugs upstream (#671, #555); everything that names it
//! outside `io` lives here so an upgrade or a swap touches one file.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crossbeam::queue::ArrayQueue;
use futures_util::task::AtomicWaker;

use crate::error::CoreError;

/// Locked memory per executor is 3 x io_memory (three io_uring rings), and `ulimit -l` is small
/// for unprivileged users: keep it at 1 MiB (FIELD-NOTES, glommio).
pub const EXECUTOR_IO_MEMORY_BYTES: usize = 1024 * 1024;

/// Starts a glommio executor on its own thread, pinned to `cpu`, running `main` to completion.
pub fn spawn_pinned<F, Fut, T>(name: &str, cpu: usize, main: F) -> Result<Pinned<T>, CoreError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(cpu))
        .name(name)
        .io_memory(EXECUTOR_IO_MEMORY_BYTES)
        // No spin_before_park: busy-spinning starves the kernel's io_uring fsync workers that
        // share the raft core's CPU (FIELD-NOTES: fdatasync got 4x slower).
        .spawn(main)
        .map_err(|e| {
            CoreError::Executor(format!("cannot start executor {name} on cpu {cpu}: {e}"))
        })?;
    Ok(Pinned(handle))
}

/// A running pinned executor; `join` waits for its main future to finish.
pub struct Pinned<T: Send + 'static>(glommio::ExecutorJoinHandle<T>);

impl<T: Send + 'static> Pinned<T> {
    pub fn join(self) -> Result<T, CoreError> {
        self.0
            .join()
            .map_err(|e| CoreError::Executor(e.to_string()))
    }
}

/// A bounded queue from many threads to one consumer task, which sleeps in its executor until
/// something arrives. The bound is the back-pressure: a full mailbox refuses, and the caller
/// answers "too many requests" as etcd does when proposals pile up.
pub struct Mailbox<T> {
    queue: ArrayQueue<T>,
    waker: AtomicWaker,
    closed: AtomicBool,
}

impl<T> Mailbox<T> {
    pub fn new(capacity: usize) -> Arc<Mailbox<T>> {
        assert!(capacity > 0, "a mailbox needs room for at least one item");
        Arc::new(Mailbox {
            queue: ArrayQueue::new(capacity),
            waker: AtomicWaker::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// Enqueues without waiting; gives the item back when the mailbox is full or closed.
    pub fn try_send(&self, item: T) -> Result<(), T> {
        if self.closed.load(Ordering::Acquire) {
            return Err(item);
        }
        self.queue.push(item)?;
        self.waker.wake();
        Ok(())
    }

    /// Takes what is queued now, without waiting.
    pub fn try_recv(&self) -> Option<T> {
        self.queue.pop()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Waits until at least one item is queued (or the mailbox is closed). Never blocks the
    /// thread: crossbeam's blocking calls inside an executor would stall every task on it.
    pub fn ready(&self) -> MailboxReady<'_, T> {
        MailboxReady { mailbox: self }
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Wakes the consumer without sending, e.g. for a state change it must look at.
    pub fn nudge(&self) {
        self.waker.wake();
    }
}

pub struct MailboxReady<'a, T> {
    mailbox: &'a Mailbox<T>,
}

impl<T> Future for MailboxReady<'_, T> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let m = self.mailbox;
        if !m.queue.is_empty() || m.closed.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        // Register first, then look again: an item pushed between the two checks still wakes us.
        m.waker.register(cx.waker());
        if !m.queue.is_empty() || m.closed.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// Sleeps on the current glommio executor.
pub async fn sleep(d: Duration) {
    glommio::timer::sleep(d).await;
}

/// Spawns a task on the current executor and lets it run detached.
pub fn spawn_local<F: Future<Output = ()> + 'static>(f: F) {
    glommio::spawn_local(f).detach();
}

/// Runs `f` on a new unpinned thread and waits for its result without blocking the executor:
/// for rare CPU-heavy work (hashing a whole store) that must not stall a pinned core.
pub async fn on_thread<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("the OS starts a thread");
    rx.await
        .expect("the thread sends its result before it ends (it does not panic)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_wakes_a_consumer_on_another_executor() {
        let mb: Arc<Mailbox<u64>> = Mailbox::new(4);
        let consumer = {
            let mb = mb.clone();
            spawn_pinned("mb-test", 0, move || async move {
                let mut sum = 0;
                let mut got = 0;
                while got < 100 {
                    mb.ready().await;
                    while let Some(v) = mb.try_recv() {
                        sum += v;
                        got += 1;
                    }
                }
                sum
            })
            .expect("executor starts")
        };
        for i in 0..100u64 {
            let mut item = i;
            loop {
                match mb.try_send(item) {
                    Ok(()) => break,
                    Err(back) => {
                        item = back;
                        std::thread::yield_now();
                    }
                }
            }
        }
        assert_eq!(
            consumer.join().expect("consumer finishes"),
            (0..100).sum::<u64>()
        );
    }

    #[test]
    fn full_mailbox_refuses_and_gives_the_item_back() {
        let mb: Arc<Mailbox<u8>> = Mailbox::new(1);
        assert!(mb.try_send(1).is_ok());
        assert_eq!(mb.try_send(2), Err(2));
        mb.close();
        assert_eq!(mb.try_recv(), Some(1));
        assert_eq!(mb.try_send(3), Err(3));
    }
}
