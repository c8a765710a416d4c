//! How a relay learns that new rows are due, with polling as the fallback: on PostgreSQL
//! it `LISTEN`s (student-svc `NOTIFY`s after the commit that writes a row); on SQLite,
//! which has no notifications, it watches the database file's `PRAGMA data_version`.
//!
//! The listener or watcher runs on a task of its own and turns each sign of a commit into
//! a permit of a [`Notify`]: one that arrives while the relay is busy is kept, not lost,
//! and the next wait returns at once. Waiting is cancel-safe, so the delivery loop can
//! wait for "a call finished, or a row was notified, or the poll interval passed" in one
//! `select!`.
//!
//! A listener or watcher that is lost (the connection dropped, the database restarting)
//! comes back on its own, retrying with backoff while the poll covers; once it is back it
//! wakes the relay, because rows committed while nobody listened woke nobody. That wake-up
//! comes after it listens again, never before: a row committed in between would wait for
//! the poll. `relay_wakeups_listening` says which state it is in.

use std::{
    str::FromStr as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use platform::failpoint::{self, points};
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

/// The wait before the first try to get a lost listener or watcher back; it doubles after
/// each failed try, up to [`RECOVERY_MAX`].
pub const RECOVERY_BASE: Duration = Duration::from_millis(100);

/// The longest wait between two tries to get a lost listener or watcher back.
pub const RECOVERY_MAX: Duration = Duration::from_secs(5);

/// Wake-ups for one relay.
pub struct Wakeup {
    signal: Signal,
    listener: Option<tokio::task::JoinHandle<()>>,
}

/// What the listener's or watcher's task shares with the relay.
#[derive(Clone)]
struct Signal {
    notified: Arc<Notify>,
    /// Whether commits wake the relay now (false while a lost listener or watcher is
    /// being brought back).
    listening: Arc<AtomicBool>,
}

impl Signal {
    fn new() -> Self {
        Self {
            notified: Arc::new(Notify::new()),
            listening: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Gives the relay a reason to claim.
    fn wake(&self) {
        self.notified.notify_one();
    }

    /// Records whether commits wake the relay now, for [`Wakeup::is_listening`] and
    /// `relay_wakeups_listening`.
    fn set_listening(&self, listening: bool) {
        self.listening.store(listening, Ordering::Relaxed);
        crate::metrics::wakeups_listening(listening);
    }
}

impl Wakeup {
    /// LISTENs on PostgreSQL and watches `data_version` on SQLite, both set up before this
    /// returns. If that fails (logged), the relay polls while a task keeps trying.
    pub async fn for_database(url: &str) -> Self {
        let signal = Signal::new();
        let task = if platform::db::is_sqlite(url) {
            let first = open_watcher(url).await;
            signal.set_listening(first.is_ok());
            tokio::spawn(watch(url.to_owned(), first, signal.clone()))
        } else {
            let first = listen(url).await;
            signal.set_listening(first.is_ok());
            tokio::spawn(forward(url.to_owned(), first, signal.clone()))
        };
        Self {
            signal,
            listener: Some(task),
        }
    }

    /// No wake-ups at all: only the poll interval starts a claim (tests use it to tell the
    /// claim loop's own decisions from wake-ups).
    pub fn poll_only() -> Self {
        Self {
            signal: Signal::new(),
            listener: None,
        }
    }

    /// Tells whether commits wake the relay now (`LISTEN`, or the SQLite watcher), or only
    /// the poll interval does (never set up, or lost and not back yet).
    pub fn is_listening(&self) -> bool {
        self.signal.listening.load(Ordering::Relaxed)
    }

    /// Returns once a row was notified since the last return (at once if one was while
    /// the relay was busy). Cancel-safe.
    pub async fn notified(&self) {
        self.signal.notified.notified().await;
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
/// `pg_stat_activity` as the relay's pool is ([`platform::db::postgres_options`]), and
/// `LISTEN`ing when this returns. Its one-connection pool only reconnects it, as
/// [`PgListener::connect`]'s does.
async fn listen(url: &str) -> anyhow::Result<PgListener> {
    if failpoint::fails(points::RELAY_WAKEUPS_SETUP) {
        anyhow::bail!("fail point {}", points::RELAY_WAKEUPS_SETUP);
    }
    let pool = PoolOptions::<Postgres>::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(platform::db::postgres_options(url)?)
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(OUTBOX_CHANNEL).await?;
    Ok(listener)
}

/// Turns notifications into permits until the relay stops, bringing the listener back
/// whenever it is lost.
async fn forward(url: String, first: anyhow::Result<PgListener>, signal: Signal) {
    let mut listener = match first {
        Ok(listener) => listener,
        Err(err) => {
            tracing::warn!(
                error = format!("{err:#}"),
                "cannot LISTEN; polling until it can"
            );
            listen_again(&url, &signal).await
        }
    };
    loop {
        let received = if failpoint::fails(points::RELAY_WAKEUPS_LOST) {
            Err(sea_orm::sqlx::Error::Protocol(format!(
                "fail point {}",
                points::RELAY_WAKEUPS_LOST
            )))
        } else {
            listener.try_recv().await
        };
        match received {
            Ok(Some(_)) => {
                // Several notifications before the relay looks are one reason to claim.
                while listener.next_buffered().is_some() {}
                signal.wake();
            }
            // The connection was lost, and the listener has connected and LISTENed again
            // before saying so (sqlx's eager reconnect): rows committed in between notified
            // nobody, so the relay claims once now.
            Ok(None) => {
                tracing::warn!("LISTEN connection lost and restored");
                signal.wake();
            }
            // Lost, and connecting again failed (the database restarting, say).
            Err(err) => {
                signal.set_listening(false);
                tracing::warn!(error = %err, "LISTEN connection lost; polling until it is back");
                listener = listen_again(&url, &signal).await;
            }
        }
    }
}

/// Connects and `LISTEN`s, retrying with backoff until it can; then wakes the relay for
/// the rows committed while nobody listened.
async fn listen_again(url: &str, signal: &Signal) -> PgListener {
    let listener = recover("LISTEN", || listen(url)).await;
    signal.set_listening(true);
    signal.wake();
    listener
}

/// Retries `attempt` with capped exponential backoff until it succeeds (each failure
/// logged at debug: the loss was logged once, and `relay_wakeups_listening` shows it).
async fn recover<T, F>(what: &str, mut attempt: impl FnMut() -> F) -> T
where
    F: Future<Output = anyhow::Result<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let wait = crate::backoff::exponential_ceiling(tries, RECOVERY_BASE, RECOVERY_MAX);
        tokio::time::sleep(wait).await;
        match attempt().await {
            Ok(value) => {
                tracing::info!(tries, "{what} back: commits wake the relay again");
                return value;
            }
            Err(err) => tracing::debug!(tries, error = format!("{err:#}"), "{what} still lost"),
        }
    }
}

/// The SQLite watcher's connection, and the `data_version` it starts from (read before
/// this returns, not when the watcher first runs: a commit made after the relay's first
/// claim but before that read would otherwise be taken for the starting point and wake
/// nobody).
async fn open_watcher(url: &str) -> anyhow::Result<(SqliteConnection, i64)> {
    if failpoint::fails(points::RELAY_WAKEUPS_SETUP) {
        anyhow::bail!("fail point {}", points::RELAY_WAKEUPS_SETUP);
    }
    let options = SqliteConnectOptions::from_str(url)?.read_only(true);
    let mut connection = SqliteConnection::connect_with(&options).await?;
    let seen = data_version(&mut connection).await?;
    Ok((connection, seen))
}

/// Turns commits that leave rows pending in the SQLite file into permits until the relay
/// stops, bringing the watcher back whenever it is lost.
///
/// `PRAGMA data_version` on one connection changes whenever another connection has
/// committed a change since it was last read: a student-svc commit, and also the relay's
/// own claims and finalizes (its pool's connections are others too). So a change is only
/// a reason to look: the relay is woken when a row is pending
/// ([`student_store::outbox::ANY_PENDING`], a read, which takes no write lock), and a
/// commit of its own that left nothing pending costs it no claim. The version means
/// something only on the connection that read it, hence one connection held for good.
async fn watch(url: String, first: anyhow::Result<(SqliteConnection, i64)>, signal: Signal) {
    let (mut connection, mut seen) = match first {
        Ok(watcher) => watcher,
        Err(err) => {
            tracing::warn!(
                error = format!("{err:#}"),
                "cannot watch the SQLite file; polling until it can"
            );
            watch_again(&url, &signal).await
        }
    };
    let mut tick = tokio::time::interval(SQLITE_WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let read = if failpoint::fails(points::RELAY_WAKEUPS_LOST) {
            Err(anyhow::anyhow!("fail point {}", points::RELAY_WAKEUPS_LOST))
        } else {
            data_version(&mut connection).await
        };
        match read {
            Ok(version) => {
                let wake = seen != version && any_pending(&mut connection).await;
                seen = version;
                if wake {
                    signal.wake();
                    tick.reset_after(SQLITE_MIN_WAKE_GAP);
                }
            }
            Err(err) => {
                signal.set_listening(false);
                tracing::warn!(
                    error = format!("{err:#}"),
                    "cannot read the SQLite data version; polling until it is back"
                );
                (connection, seen) = watch_again(&url, &signal).await;
            }
        }
    }
}

/// Opens the watcher again, retrying with backoff until it can; then wakes the relay:
/// commits made while nobody watched are behind the new starting version, so only a claim
/// finds their rows.
async fn watch_again(url: &str, signal: &Signal) -> (SqliteConnection, i64) {
    let watcher = recover("the SQLite watcher", || open_watcher(url)).await;
    signal.set_listening(true);
    signal.wake();
    watcher
}

/// The file's `PRAGMA data_version` as `connection` sees it: it changes once another
/// connection has committed.
async fn data_version(connection: &mut SqliteConnection) -> anyhow::Result<i64> {
    Ok(sea_orm::sqlx::query_scalar::<_, i64>("PRAGMA data_version")
        .fetch_one(connection)
        .await?)
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
