//! The Tokio runtime a service runs on: one thread unless told otherwise.
//!
//! A call to either service is a chain of hand-offs between tasks (the HTTP/2 connection,
//! the request, the group commit's writer, the database connection). On a multi-threaded
//! runtime most of those hand-offs wake another thread, and on a small box shared with
//! the database each wake-up costs a context switch and often an idle core's wake-up. On
//! one thread they are plain function calls. Paired on the 2-core reference machine
//! (BENCHMARKS-JOURNAL.md, "One thread per service"), one thread took a quarter off student-svc's
//! CPU per student and linked more per second; a box with cores to spare for a service
//! can give it more threads (`--worker-threads`), or run more instances of it.

use std::num::NonZeroUsize;

use tokio::runtime::{Builder, Runtime};

/// Builds the runtime for `worker_threads` threads: with 1, every task runs on the thread
/// that calls `block_on` (a current-thread runtime); with more, on that many workers.
pub fn build(worker_threads: NonZeroUsize) -> std::io::Result<Runtime> {
    let mut builder = if worker_threads.get() == 1 {
        Builder::new_current_thread()
    } else {
        let mut builder = Builder::new_multi_thread();
        builder.worker_threads(worker_threads.get());
        builder
    };
    builder.enable_all().build()
}

#[cfg(test)]
mod tests {
    use tokio::runtime::RuntimeFlavor;

    use super::*;

    fn threads(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).expect("not zero")
    }

    #[test]
    fn one_thread_is_a_current_thread_runtime() {
        let runtime = build(threads(1)).expect("runtime");
        assert_eq!(
            runtime.handle().runtime_flavor(),
            RuntimeFlavor::CurrentThread
        );
        let caller = std::thread::current().id();
        let ran_on =
            runtime.block_on(async { tokio::spawn(async { std::thread::current().id() }).await });
        assert_eq!(ran_on.expect("task"), caller);
    }

    #[test]
    fn more_threads_are_that_many_workers() {
        let runtime = build(threads(3)).expect("runtime");
        assert_eq!(
            runtime.handle().runtime_flavor(),
            RuntimeFlavor::MultiThread
        );
        assert_eq!(runtime.metrics().num_workers(), 3);
    }
}
