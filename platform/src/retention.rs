//! What the retention purges share: deleting old rows in small batches, on a schedule,
//! and the relay's default retry window, which Users' inbox must outlive.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, DbErr, DeleteMany, EntityTrait,
    sea_query::{Expr, SelectStatement},
};
use tokio_util::sync::CancellationToken;

/// How long a relay with default tuning may keep retrying one row before it fails it:
/// `--max-attempts` (100) times the longest wait, `--backoff-max` (30 s) plus
/// `--call-timeout` (5 s). A relay test holds this to the relay's defaults. An inbox kept
/// for less than this can purge a key its relay is still retrying.
pub const RELAY_DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(100 * (30 + 5));

/// Rows deleted per statement: each batch is one short transaction, so a purge never holds
/// many row locks, or SQLite's write lock, for long.
pub const PURGE_BATCH: u64 = 1_000;

/// Runs `purge_batch` until a batch deletes fewer than [`PURGE_BATCH`] rows; returns how
/// many were deleted in all. Every purge goes through [`purge_older_than`].
async fn purge_all<E, F, Fut>(mut purge_batch: F) -> Result<u64, E>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    let mut purged = 0;
    loop {
        let deleted = purge_batch(PURGE_BATCH).await?;
        purged += deleted;
        if deleted < PURGE_BATCH {
            return Ok(purged);
        }
    }
}

/// Deletes what `batch` finds older than `retention` (`batch(backend, horizon, limit)`:
/// one purge's statement, deleting at most `limit` rows made before `horizon`), batch
/// after batch as [`purge_all`] does; returns how many rows were deleted. The horizon is
/// read once, from [`crate::db::now`].
pub async fn purge_older_than<E: EntityTrait>(
    db: &DatabaseConnection,
    retention: Duration,
    batch: fn(DbBackend, DateTime<Utc>, u64) -> DeleteMany<E>,
) -> Result<u64, DbErr> {
    let horizon = crate::db::now() - retention;
    let backend = db.get_database_backend();
    purge_all(|limit| async move {
        let deleted = batch(backend, horizon, limit).exec(db).await?;
        Ok(deleted.rows_affected)
    })
    .await
}

/// The condition that limits a batch's `DELETE` to the rows `oldest` selects by `key` (the
/// table's primary key). On PostgreSQL it is `key = ANY(ARRAY(oldest))`, so the batch's
/// rows are looked up by primary key whatever the table's size: with `key IN (oldest)` the
/// planner hash-joined the whole table against the batch on any table it thought small
/// enough (it read all 200,000 entries of an inbox to delete 1,000), so a purge cost one
/// read of the table per batch. SQLite looks each row up by key either way.
pub fn batch_of<C: ColumnTrait>(key: C, oldest: SelectStatement, backend: DbBackend) -> Expr {
    match backend {
        DbBackend::Postgres => Expr::cust_with_exprs(
            "$1 = ANY(ARRAY $2)",
            [
                Expr::col(key.as_column_ref()),
                Expr::SubQuery(None, Box::new(oldest.into())),
            ],
        ),
        _ => key.in_subquery(oldest),
    }
}

/// Calls `purge` every `interval` until `shutdown`, logging what it did (`what`: "done
/// outbox rows", "inbox entries").
pub async fn on_schedule<E, F, Fut>(
    what: &'static str,
    interval: Duration,
    shutdown: CancellationToken,
    mut purge: F,
) where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    loop {
        match purge().await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "purged {what} past their retention"),
            Err(err) => tracing::warn!(error = %err, "cannot purge {what}; will try again"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_purge_runs_batches_until_one_is_not_full() {
        let mut batches = vec![PURGE_BATCH, PURGE_BATCH, 3, 99];
        batches.reverse();
        let mut calls = 0;
        let purged = purge_all(|limit| {
            calls += 1;
            assert_eq!(limit, PURGE_BATCH);
            let deleted = batches
                .pop()
                .expect("asked for no more batches than needed");
            async move { Ok::<_, ()>(deleted) }
        })
        .await;
        assert_eq!(purged, Ok(2 * PURGE_BATCH + 3));
        assert_eq!(calls, 3);
    }

    /// A purge that fails (SQLite busy, a PostgreSQL blip) is tried again at the next
    /// interval: one error must not end retention until the next restart.
    #[tokio::test]
    async fn the_schedule_tries_again_after_a_failed_purge_and_stops_when_told() {
        use std::sync::{
            Arc,
            atomic::{AtomicU32, Ordering},
        };
        let calls = Arc::new(AtomicU32::new(0));
        let shutdown = CancellationToken::new();
        let schedule = tokio::spawn(on_schedule(
            "rows",
            Duration::from_millis(10),
            shutdown.clone(),
            {
                let calls = calls.clone();
                move || {
                    let call = calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if call == 0 {
                            Err("database busy")
                        } else {
                            Ok(1)
                        }
                    }
                }
            },
        ));
        // The first purge fails; the schedule goes on to two more.
        tokio::time::timeout(Duration::from_secs(10), async {
            while calls.load(Ordering::SeqCst) < 3 {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("purges after the failed one");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), schedule)
            .await
            .expect("the schedule ends when shut down")
            .expect("the schedule did not panic");
    }
}
