//! The `Runtime` the server's tests and benchmarks serve on: glommio, as Keel's shards.
//! Included by path (`#[path]`) from `tests/server.rs` and `benches/unary.rs`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use keel_grpc::Runtime;

pub struct GlommioRuntime;

impl Runtime for GlommioRuntime {
    fn spawn_local(&self, task: Pin<Box<dyn Future<Output = ()>>>) {
        // Behind the running queue, not polled inside the accept: as keel's shards spawn
        // calls (keel-core `rt::spawn_local_queued`), so calls run in the same order.
        let queue = glommio::executor().current_task_queue();
        glommio::spawn_local_into(task, queue)
            .expect("the running task's own queue exists")
            .detach();
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(glommio::timer::sleep(duration))
    }
}
