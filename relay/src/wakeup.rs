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
                let mut connection = SqliteConnection::connect_with(&options).await?;
                // Read before this returns, not when the task first runs: a commit made
                // after the relay's first claim but before the task's first read would
                // otherwise be taken for the starting point and wake nobody.
                let seen = data_version(&mut connection).await?;
                Ok(tokio::spawn(watch(connection, seen, notified.clone())))
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
async fn watch(mut connection: SqliteConnection, mut seen: i64, notified: Arc<Notify>) {
    let mut tick = tokio::time::interval(SQLITE_WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match data_version(&mut connection).await {
            Ok(version) => {
                let wake = seen != version && any_pending(&mut connection).await;
                seen = version;
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

/// The file's `PRAGMA data_version` as `connection` sees it: it changes once another
/// connection has committed.
async fn data_version(connection: &mut SqliteConnection) -> Result<i64, sea_orm::sqlx::Error> {
    sea_orm::sqlx::query_scalar::<_, i64>("PRAGMA data_version")
        .fetch_one(connection)
        .await
}

/// Whether a row is pending; on an error, yes (the claim will say).
async fn any_pending(connection: &mut SqliteConnection) -> bool {
    sea_orm::sqlx::query_scalar::<_, bool>(student_store::outbox::ANY_PENDING.as_str())
        .fetch_one(connection)
        .await
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use student_store::{students, wake::RelayBell};

    use super::*;

    /// A student written now, as student-svc writes one: with its pending create-user row.
    fn new_student() -> students::NewStudentRow {
        students::NewStudentRow {
            id: uuid::Uuid::now_v7(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            email: "ana@example.edu".into(),
            document_number: "DOC-1".into(),
            client_key: None,
            request_hash: "hash".into(),
            created_at: platform::db::now(),
            traceparent: String::new(),
        }
    }

    /// No lost wake-up at start: a row committed after `for_database` returned wakes the
    /// relay even if the watcher's task had not run yet. (A single-threaded runtime, and
    /// the commit made on another thread while this one is blocked, so the task cannot
    /// run before the commit.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_commit_before_the_watchers_first_look_still_wakes_the_relay() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("student.db").display()
        );
        migrations::open::<migrations::student::Migrator>(&url, 1)
            .await
            .expect("schema");
        let wakeup = Wakeup::for_database(&url).await;
        assert!(wakeup.is_listening(), "watching the file");

        let writer_url = url.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the writer");
            runtime.block_on(async {
                let db = platform::db::connect(&writer_url).await.expect("connect");
                let (_, written) =
                    students::create_each(&db, &RelayBell::silent(), vec![new_student()]).await;
                written[0]
                    .as_ref()
                    .expect("a student and its row committed");
            });
        })
        .join()
        .expect("the writer thread");

        tokio::time::timeout(Duration::from_secs(10), wakeup.notified())
            .await
            .expect("the commit woke the relay");
    }
}
