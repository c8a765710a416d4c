//! Group commit: writes that arrive while a transaction commits are written together in the
//! next one, instead of one transaction each.
//!
//! Every commit is a disk sync (PostgreSQL's WAL flush, SQLite `FULL`) and a round of
//! statement overhead. Under load, callers queue; each writer takes everything queued (up
//! to a limit) and commits it at once, so a batch grows with the load while a lone write,
//! arriving when a writer is free, is committed at once and waits for nobody. The same
//! idea as PostgreSQL's own WAL group commit, one level up.
//!
//! The writers run on tasks of their own: a caller that gives up (its request cancelled)
//! never cancels a batch that holds other callers' writes. Its own write is left out if
//! it is still waiting when its batch is taken, and committed if it is already in one.

use std::{future::Future, panic::AssertUnwindSafe, sync::Arc};

use futures::FutureExt as _;
use tokio::sync::{Mutex, mpsc, oneshot};

/// One write waiting for its batch, and who waits for its outcome.
struct Waiting<I, O> {
    item: I,
    reply: oneshot::Sender<O>,
}

/// A handle to the writers; cheap to clone. They stop once every handle is dropped and
/// the queue is empty.
pub struct GroupCommit<I, O> {
    queue: mpsc::Sender<Waiting<I, O>>,
}

impl<I, O> Clone for GroupCommit<I, O> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> GroupCommit<I, O> {
    /// Starts `writers` tasks (call inside a Tokio runtime), each committing up to
    /// `max_batch` queued items at a time with `commit`, which must give back one outcome
    /// per item, in the items' order.
    pub fn start<F, Fut>(writers: usize, max_batch: usize, commit: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<O>> + Send + 'static,
    {
        let max_batch = max_batch.max(1);
        let (queue, waiting) = mpsc::channel(max_batch * writers.max(1) * 2);
        let waiting = Arc::new(Mutex::new(waiting));
        let commit = Arc::new(commit);
        for _ in 0..writers.max(1) {
            tokio::spawn(write_batches(waiting.clone(), commit.clone(), max_batch));
        }
        Self { queue }
    }

    /// Queues `item` and returns its outcome once its batch has committed (or failed);
    /// `None` if the writers are gone.
    pub async fn submit(&self, item: I) -> Option<O> {
        let (reply, outcome) = oneshot::channel();
        self.queue.send(Waiting { item, reply }).await.ok()?;
        outcome.await.ok()
    }
}

/// One writer: takes what is queued, commits it, answers each caller, again.
async fn write_batches<I, O, F, Fut>(
    waiting: Arc<Mutex<mpsc::Receiver<Waiting<I, O>>>>,
    commit: Arc<F>,
    max_batch: usize,
) where
    F: Fn(Vec<I>) -> Fut,
    Fut: Future<Output = Vec<O>>,
{
    loop {
        // The queue is held only while taking a batch: another writer takes the next one
        // while this one commits.
        let batch = {
            let mut waiting = waiting.lock().await;
            let Some(first) = waiting.recv().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < max_batch {
                match waiting.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            batch
        };
        // A caller that gave up while its write waited (its request cancelled, its
        // deadline passed) is not written: as if it had never been sent.
        let batch: Vec<_> = batch
            .into_iter()
            .filter(|waiting| !waiting.reply.is_closed())
            .collect();
        if batch.is_empty() {
            continue;
        }
        let (items, replies): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|waiting| (waiting.item, waiting.reply))
            .unzip();
        // Should the commit panic (a bug), its callers get no outcome (`submit` gives them
        // `None`; an open transaction rolls back as the panic unwinds) and this writer goes
        // on with the next batch, instead of leaving every later write without a writer.
        let outcomes = match AssertUnwindSafe(commit(items)).catch_unwind().await {
            Ok(outcomes) => outcomes,
            Err(_) => {
                tracing::error!("a group commit panicked; its callers get no answer");
                continue;
            }
        };
        // A caller that gave up during the commit has dropped its receiver; its outcome is
        // simply not read.
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            let _ = reply.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// The batches a test writer took, in order.
    type Batches = Arc<StdMutex<Vec<Vec<u32>>>>;

    /// `writers` writers whose batches each wait for `release` before they commit
    /// (answering each item times ten), and the batches they took.
    fn held_writers(
        writers: usize,
    ) -> (
        GroupCommit<u32, u32>,
        Batches,
        tokio::sync::watch::Sender<bool>,
    ) {
        let batches = Arc::new(StdMutex::new(Vec::new()));
        let (release, held) = tokio::sync::watch::channel(false);
        let seen = batches.clone();
        let writer = GroupCommit::start(writers, 16, move |items: Vec<u32>| {
            let seen = seen.clone();
            let mut held = held.clone();
            async move {
                seen.lock().unwrap().push(items.clone());
                let _ = held.wait_for(|released| *released).await;
                items.into_iter().map(|item| item * 10).collect()
            }
        });
        (writer, batches, release)
    }

    /// Submits `item` on a task of its own.
    fn submit(writer: &GroupCommit<u32, u32>, item: u32) -> tokio::task::JoinHandle<Option<u32>> {
        let writer = writer.clone();
        tokio::spawn(async move { writer.submit(item).await })
    }

    /// Waits until the writer holds its first batch.
    async fn first_batch_taken(batches: &StdMutex<Vec<Vec<u32>>>) {
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    }

    /// Waits until `count` items wait in the queue.
    async fn queued(writer: &GroupCommit<u32, u32>, count: usize) {
        while writer.queue.max_capacity() - writer.queue.capacity() < count {
            tokio::task::yield_now().await;
        }
    }

    /// A lone write, arriving when a writer is free, is committed at once: no timer waits
    /// for company (in paused time, any sleep would show as time passed).
    #[tokio::test(start_paused = true)]
    async fn a_lone_write_waits_for_nobody() {
        let writer = GroupCommit::start(1, 16, |items: Vec<u32>| async move {
            items.into_iter().map(|item| item * 10).collect()
        });
        let started = tokio::time::Instant::now();
        assert_eq!(writer.submit(7).await, Some(70));
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
    }

    /// Items queued while the only writer commits are committed together next.
    #[tokio::test]
    async fn writes_queued_during_a_commit_form_the_next_batch() {
        let (writer, batches, release) = held_writers(1);
        let first = submit(&writer, 1);
        first_batch_taken(&batches).await;
        let others: Vec<_> = (2..=4).map(|item| submit(&writer, item)).collect();
        queued(&writer, 3).await;
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap(), Some(10));
        let mut answers = Vec::new();
        for other in others {
            answers.push(other.await.unwrap());
        }
        assert_eq!(answers, [Some(20), Some(30), Some(40)]);
        let batches = batches.lock().unwrap().clone();
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert_eq!(batches[0], [1]);
        let mut second = batches[1].clone();
        second.sort_unstable();
        assert_eq!(second, [2, 3, 4]);
    }

    /// A write whose caller gave up while it waited is left out of its batch.
    #[tokio::test]
    async fn a_write_whose_caller_gave_up_while_waiting_is_left_out() {
        let (writer, batches, release) = held_writers(1);
        let first = submit(&writer, 1);
        first_batch_taken(&batches).await;
        let given_up = submit(&writer, 2);
        queued(&writer, 1).await;
        given_up.abort();
        let _ = given_up.await;
        let kept = submit(&writer, 3);
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap(), Some(10));
        assert_eq!(kept.await.unwrap(), Some(30));
        assert_eq!(*batches.lock().unwrap(), [vec![1], vec![3]]);
    }

    /// With two writers (student-svc's on PostgreSQL), a write arriving while one batch
    /// commits is taken by the other writer at once, not after that commit.
    #[tokio::test]
    async fn a_second_writer_takes_what_arrives_while_the_first_commits() {
        let (writer, batches, release) = held_writers(2);
        let first = submit(&writer, 1);
        first_batch_taken(&batches).await;
        let second = submit(&writer, 2);
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while batches.lock().unwrap().len() < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the second writer takes a batch while the first is held");
        assert_eq!(*batches.lock().unwrap(), [vec![1], vec![2]]);
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap(), Some(10));
        assert_eq!(second.await.unwrap(), Some(20));
    }

    /// A batch never exceeds its limit.
    #[tokio::test]
    async fn a_batch_holds_at_most_its_limit() {
        let sizes = Arc::new(StdMutex::new(Vec::new()));
        let seen = sizes.clone();
        let writer = GroupCommit::start(1, 2, move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            async move { items }
        });
        let calls: Vec<_> = (0..7)
            .map(|item| {
                let writer = writer.clone();
                tokio::spawn(async move { writer.submit(item).await })
            })
            .collect();
        for (item, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), Some(item as u32));
        }
        assert!(sizes.lock().unwrap().iter().all(|size| *size <= 2));
        assert_eq!(sizes.lock().unwrap().iter().sum::<usize>(), 7);
    }

    /// The only writer (as on SQLite) outlives a commit that panics: that batch's caller
    /// gets no outcome, the next caller its own.
    #[tokio::test]
    async fn a_commit_that_panics_fails_its_batch_and_the_writer_goes_on() {
        let writer = GroupCommit::start(1, 16, |items: Vec<u32>| async move {
            assert!(!items.contains(&0), "a bug in the commit");
            items.into_iter().map(|item| item * 10).collect()
        });
        assert_eq!(writer.submit(0).await, None);
        assert_eq!(writer.submit(1).await, Some(10));
        assert_eq!(writer.submit(2).await, Some(20));
    }
}
