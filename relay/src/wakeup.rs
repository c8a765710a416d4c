//! How a relay learns that new rows are due, with polling as the fallback: on PostgreSQL
//! it `LISTEN`s (student-svc `NOTIFY`s after the commit that writes a row); on SQLite,
//! which has no notifications, it watches the database file's `PRAGMA data_version`.
//!
//! The listener or watcher runs on a task of its own and turns each sign of a commit into
//! a permit of a [`Notify`]: one that arrives while the relay is busy is kept, not lost,
//! and the next wait returns at once. Waiting is cancel-safe, so the delivery loop can
//! wait for "a call finished, or a row was notified, or the poll interval passed" in one
//! `select!`.

use std::{str::FromStr as _, sync::Arc, time::Duration};

use sea_orm::sqlx::{
    Connection as _,
    pool::PoolOptions,
    postgres::{PgListener, Postgres},
    sqlite::{SqliteConnectOptions, SqliteConnection},
};
use student_store::OUTBOX_CHANNEL;
use tokio::sync::Notify;

/// How often the SQLite watcher reads `PRAGMA data_version`: a read of the WAL index in
/// shared memory, no disk and no lock, so a new row waits 5 ms on average for its claim
/// instead of half the poll interval.
pub const SQLITE_WATCH_INTERVAL: Duration = Duration::from_millis(10);

/// The least time between two wake-ups from the SQLite watcher. A claim takes SQLite's
/// one write lock, which CreateStudent's commits need too: woken by every commit, a relay
/// under steady load claimed a few rows at a time hundreds of times a second, and
/// student-svc created a third as many students at 4 in flight (BENCHMARKS-JOURNAL.md,
/// "SQLite relays woken by commits"). With at most 25 wake-ups a second, rows that arrive
/// together are claimed together.
pub const SQLITE_MIN_WAKE_GAP: Duration = Duration::from_millis(40);

/// Wake-ups for one relay.
pub struct Wakeup {
    notified: Arc<Notify>,
    listener: Option<tokio::task::JoinHandle<()>>,
}

impl Wakeup {
    /// LISTENs on PostgreSQL and watches `data_version` on SQLite; only polls when
    /// neither can be set up (logged).
    pub async fn for_database(url: &str) -> Self {
        let notified = Arc::new(Notify::new());
        let (task, what) = if platform::db::is_sqlite(url) {
            let watcher = async {
                let options = SqliteConnectOptions::from_str(url)?.read_only(true);
                let connection = SqliteConnection::connect_with(&options).await?;
                Ok(tokio::spawn(watch(connection, notified.clone())))
            };
            (watcher.await, "watch the SQLite file")
        } else {
            let listener = async {
                let mut listener = listen(url).await?;
                listener.listen(OUTBOX_CHANNEL).await?;
                Ok(tokio::spawn(forward(listener, notified.clone())))
            };
            (listener.await, "LISTEN")
        };
        match task {
            Ok(task) => Self {
                notified,
                listener: Some(task),
            },
            Err::<_, anyhow::Error>(err) => {
                tracing::warn!(error = format!("{err:#}"), "cannot {what}; polling only");
                Self::poll_only()
            }
        }
    }

    /// No wake-ups at all: only the poll interval starts a claim (what [`Self::for_database`]
    /// falls back to; tests use it to tell the claim loop's own decisions from wake-ups).
    pub fn poll_only() -> Self {
        Self {
            notified: Arc::new(Notify::new()),
            listener: None,
        }
    }

    /// Tells whether commits wake the relay (`LISTEN`, or the SQLite watcher) or only the
    /// poll interval does.
    pub fn is_listening(&self) -> bool {
        self.listener.is_some()
    }

    /// Returns once a row was notified since the last return (at once if one was while
    /// the relay was busy). Cancel-safe.
    pub async fn notified(&self) {
        self.notified.notified().await;
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

/// A listener on a connection of its own (one more than `--db-max-connections`), named in
/// `pg_stat_activity` as the relay's pool is ([`platform::db::postgres_options`]). Its
/// one-connection pool only reconnects it, as [`PgListener::connect`]'s does.
async fn listen(url: &str) -> anyhow::Result<PgListener> {
    let pool = PoolOptions::<Postgres>::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(platform::db::postgres_options(url)?)
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    Ok(listener)
}

/// Turns notifications into permits until the relay stops.
async fn forward(mut listener: PgListener, notified: Arc<Notify>) {
    loop {
        match listener.recv().await {
            Ok(_) => {
                // Several notifications before the relay looks are one reason to claim.
                while listener.next_buffered().is_some() {}
                notified.notify_one();
            }
            Err(err) => {
                // The listener reconnects on its next recv; meanwhile polling covers, and
                // rows committed during the gap are claimed at the next wake-up. This
                // pause keeps a broken connection from spinning.
                tracing::warn!(error = %err, "LISTEN connection lost");
                notified.notify_one();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Turns commits that leave rows pending in the SQLite file into permits until the relay
/// stops.
///
/// `PRAGMA data_version` on one connection changes whenever another connection has
/// committed a change since it was last read: a student-svc commit, and also the relay's
/// own claims and finalizes (its pool's connections are others too). So a change is only
/// a reason to look: the relay is woken when a row is pending
/// ([`student_store::outbox::ANY_PENDING`], a read, which takes no write lock), and a
/// commit of its own that left nothing pending costs it no claim. The version means
/// something only on the connection that read it, hence one connection held for good; if
/// it fails, polling covers.
async fn watch(mut connection: SqliteConnection, notified: Arc<Notify>) {
    let mut seen: Option<i64> = None;
    let mut tick = tokio::time::interval(SQLITE_WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sea_orm::sqlx::query_scalar::<_, i64>("PRAGMA data_version")
            .fetch_one(&mut connection)
            .await
        {
            Ok(version) => {
                let wake =
                    seen.is_some_and(|seen| seen != version) && any_pending(&mut connection).await;
                seen = Some(version);
                if wake {
                    notified.notify_one();
                    tick.reset_after(SQLITE_MIN_WAKE_GAP);
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the SQLite data version; polling only");
                return;
            }
        }
    }
}

/// Whether a row is pending; on an error, yes (the claim will say).
async fn any_pending(connection: &mut SqliteConnection) -> bool {
    sea_orm::sqlx::query_scalar::<_, bool>(student_store::outbox::ANY_PENDING.as_str())
        .fetch_one(connection)
        .await
        .unwrap_or(true)
}
