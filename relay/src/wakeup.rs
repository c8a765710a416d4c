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
//!
//! A `LISTEN` connection can also die without a word: a NAT, a firewall or a load balancer
//! that drops an idle connection, or a host failed over, leaves it half-open, and nothing
//! ever arrives on it again. So a listener that has heard nothing for a while checks that
//! it still hears at all ([`Liveness`]), and one that does not is lost like any other.

use std::{
    str::FromStr as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use platform::failpoint::{self, points};
use sea_orm::sqlx::{
    Connection as _,
    pool::PoolOptions,
    postgres::{PgConnection, PgListener, PgNotification, Postgres},
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

/// The wait before the first try to get lost wake-ups back; it doubles after each failed
/// try, up to [`RECOVERY_MAX`].
pub const RECOVERY_BASE: Duration = Duration::from_millis(100);

/// The longest wait between two tries to get lost wake-ups back; also how long they must
/// stay up before a new loss starts the doubling over.
pub const RECOVERY_MAX: Duration = Duration::from_secs(5);

/// How long the listener waits for a connection when it connects or reconnects (sqlx
/// retries a server that is starting up or refusing connections within this time): past
/// it the loss is reported, `relay_wakeups_listening` drops to 0 and [`Recovery`] takes
/// over. (The `LISTEN` statement itself, on a connection already made, is not bounded.)
const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How the `LISTEN` connection checks that it still hears (PostgreSQL only): after
/// `quiet` with no notification it sends one to itself, on a channel only it listens to,
/// from a short-lived connection of its own, and a listener that has not heard it within
/// `answer_within` is taken as lost and replaced. A relay under load hears commits all the
/// time and never checks; an idle one checks every 30 s, for a connection made and closed.
/// A check that cannot be sent (the server refusing new connections: the listener may be
/// fine) proves nothing, and the listener waits for the next quiet spell.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub quiet: Duration,
    pub answer_within: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            quiet: Duration::from_secs(30),
            answer_within: Duration::from_secs(5),
        }
    }
}

/// Wake-ups for one relay.
pub struct Wakeup {
    signal: Signal,
    /// The listener's or watcher's task; none when polling only.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// What the listener's or watcher's task shares with the relay.
#[derive(Clone)]
struct Signal {
    notified: Arc<Notify>,
    /// Whether commits wake the relay now (false while lost wake-ups are being brought
    /// back).
    listening: Arc<AtomicBool>,
    /// How many times the relay was left polling only ([`Wakeup::losses`]; the process's
    /// relays together count them in `relay_wakeup_losses_total` too).
    losses: Arc<AtomicU64>,
}

impl Signal {
    fn new() -> Self {
        Self {
            notified: Arc::new(Notify::new()),
            listening: Arc::new(AtomicBool::new(false)),
            losses: Arc::new(AtomicU64::new(0)),
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

    /// Records whether the wake-ups were set up at start.
    fn set_up(&self, set_up: bool) {
        if set_up {
            self.set_listening(true);
        } else {
            self.lost();
        }
    }

    /// Records that the relay is left polling only until lost or failed wake-ups are back.
    fn lost(&self) {
        self.losses.fetch_add(1, Ordering::Relaxed);
        crate::metrics::wakeup_lost();
        self.set_listening(false);
    }
}

impl Wakeup {
    /// LISTENs on PostgreSQL and watches `data_version` on SQLite, both set up before this
    /// returns. If that fails (logged), the relay polls while a task keeps trying.
    pub async fn for_database(url: &str) -> Self {
        Self::for_database_with(url, Liveness::default()).await
    }

    /// [`Wakeup::for_database`], with the `LISTEN` connection checked as `liveness` says
    /// (tests shorten it).
    pub async fn for_database_with(url: &str, liveness: Liveness) -> Self {
        let signal = Signal::new();
        let task = if platform::db::is_sqlite(url) {
            let first = unless_failed_at(points::RELAY_WAKEUPS_START, open_watcher(url)).await;
            signal.set_up(first.is_ok());
            tokio::spawn(watch(url.to_owned(), first, signal.clone()))
        } else {
            let listener = Listener {
                url: url.to_owned(),
                liveness,
            };
            let first = unless_failed_at(points::RELAY_WAKEUPS_START, listener.listen()).await;
            signal.set_up(first.is_ok());
            tokio::spawn(listener.forward(first, signal.clone()))
        };
        Self {
            signal,
            task: Some(task),
        }
    }

    /// No wake-ups at all: only the poll interval starts a claim (tests use it to tell the
    /// claim loop's own decisions from wake-ups).
    pub fn poll_only() -> Self {
        Self {
            signal: Signal::new(),
            task: None,
        }
    }

    /// Tells whether commits wake the relay now (`LISTEN`, or the SQLite watcher), or only
    /// the poll interval does (never set up, or lost and not back yet).
    pub fn is_listening(&self) -> bool {
        self.signal.listening.load(Ordering::Relaxed)
    }

    /// How many times the relay was left polling only: wake-ups that could not be set up,
    /// or were lost and not made again at once (a loss sqlx repairs before reporting it
    /// does not count).
    pub fn losses(&self) -> u64 {
        self.signal.losses.load(Ordering::Relaxed)
    }

    /// Returns once a row was notified since the last return (at once if one was while
    /// the relay was busy). Cancel-safe.
    pub async fn notified(&self) {
        self.signal.notified.notified().await;
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Brings lost wake-ups back: tries to set them up again, spaced by capped exponential
/// backoff ([`RECOVERY_BASE`] doubling to [`RECOVERY_MAX`]); once a try works, marks them
/// listening and only then wakes the relay, whose claim finds the rows committed while
/// nobody listened. The spacing keeps growing over losses that follow each other closely
/// (a server that ends the connection right after each `LISTEN` costs a try every 5 s,
/// not a loop) and starts over once the wake-ups have stayed up for [`RECOVERY_MAX`].
struct Recovery {
    /// What is lost, as the log says it.
    what: &'static str,
    /// Waits taken since the wake-ups last stayed up for [`RECOVERY_MAX`].
    streak: u32,
    /// Since when the wake-ups are up (or since the start); none while being brought back.
    up_since: Option<tokio::time::Instant>,
}

impl Recovery {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            streak: 0,
            up_since: Some(tokio::time::Instant::now()),
        }
    }

    /// The wake-ups set up at start, or, if that failed (logged), the ones `set_up` makes
    /// once it works.
    async fn started<T, F>(
        &mut self,
        first: anyhow::Result<T>,
        signal: &Signal,
        set_up: impl FnMut() -> F,
    ) -> T
    where
        F: Future<Output = anyhow::Result<T>>,
    {
        match first {
            Ok(value) => value,
            Err(err) => {
                tracing::warn!(
                    error = format!("{err:#}"),
                    "{} could not be set up; polling until it can",
                    self.what
                );
                self.get_back(signal, set_up).await
            }
        }
    }

    /// Replaces wake-ups lost with `err`: the relay polls until `set_up` works. The lost
    /// ones go first, so the relay never holds two listening connections (the server
    /// side of one gone without a word is ended once the new one listens:
    /// [`Listener::end_lost`]).
    async fn replace<T, F>(
        &mut self,
        lost: T,
        err: &anyhow::Error,
        signal: &Signal,
        set_up: impl FnMut() -> F,
    ) -> T
    where
        F: Future<Output = anyhow::Result<T>>,
    {
        signal.lost();
        tracing::warn!(
            error = format!("{err:#}"),
            "{} is lost; polling until it is back",
            self.what
        );
        drop(lost);
        self.get_back(signal, set_up).await
    }

    /// A loss repaired before it was reported (sqlx's listener reconnects and `LISTEN`s
    /// again before it says the connection was lost): rows committed in between notified
    /// nobody, so the relay claims at once. When losses follow each other closely, the
    /// listener then waits as a try would before it looks again (notifications meanwhile
    /// are kept on its connection), so a server that ends each new connection costs a
    /// reconnect every 5 s, not a loop.
    async fn repaired(&mut self, signal: &Signal) {
        tracing::warn!("{} was lost and is back", self.what);
        signal.wake();
        let steady = self
            .up_since
            .is_some_and(|since| since.elapsed() >= RECOVERY_MAX);
        if steady {
            self.streak = 0;
        } else {
            tokio::time::sleep(self.next_wait()).await;
        }
        self.up_since = Some(tokio::time::Instant::now());
    }

    /// Tries `set_up` until it works; then marks the wake-ups listening and wakes the
    /// relay, in that order.
    async fn get_back<T, F>(&mut self, signal: &Signal, mut set_up: impl FnMut() -> F) -> T
    where
        F: Future<Output = anyhow::Result<T>>,
    {
        let mut last_error = String::new();
        for tries in 1_u32.. {
            tokio::time::sleep(self.next_wait()).await;
            match unless_failed_at(points::RELAY_WAKEUPS_RETRY, set_up()).await {
                Ok(value) => {
                    self.up_since = Some(tokio::time::Instant::now());
                    signal.set_listening(true);
                    signal.wake();
                    tracing::info!(tries, "{} is back: commits wake the relay again", self.what);
                    return value;
                }
                // Logged again only when the reason changes: the gauge says it goes on.
                Err(err) => {
                    let error = format!("{err:#}");
                    if error == last_error {
                        tracing::debug!(tries, error, "{} still lost", self.what);
                    } else {
                        tracing::warn!(tries, error, "{} still lost", self.what);
                        last_error = error;
                    }
                }
            }
        }
        unreachable!("tries until one works")
    }

    /// The wait before the next try: [`RECOVERY_BASE`] at the first after wake-ups that
    /// stayed up for [`RECOVERY_MAX`], doubling with each try or loss after it.
    fn next_wait(&mut self) -> Duration {
        if let Some(since) = self.up_since.take()
            && since.elapsed() >= RECOVERY_MAX
        {
            self.streak = 0;
        }
        self.streak += 1;
        crate::backoff::exponential_ceiling(self.streak, RECOVERY_BASE, RECOVERY_MAX)
    }
}

/// `step`, unless the fail point `name` is armed with `error`: then its error instead.
async fn unless_failed_at<T>(
    name: &str,
    step: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    if failpoint::fails(name) {
        anyhow::bail!("fail point {name}");
    }
    step.await
}

/// What the PostgreSQL listener's task needs to make, and check, its `LISTEN` connections.
#[derive(Clone)]
struct Listener {
    url: String,
    liveness: Liveness,
}

/// A `LISTEN`ing connection, and the channel only it listens to, for its liveness checks
/// (a new name for each: the server side of a lost one may still be there, listening).
struct Listening {
    listener: PgListener,
    probe: String,
}

/// What a listening connection heard.
enum Heard {
    /// A row committed (a notification on [`OUTBOX_CHANNEL`]).
    Commit,
    /// Its own liveness check: the connection still hears.
    Itself,
    /// The connection was lost, then made again and `LISTEN`ing (eager reconnect).
    Repaired,
}

impl Listener {
    /// A listener on a connection of its own (one more than `--db-max-connections`),
    /// named in `pg_stat_activity` as the relay's pool is
    /// ([`platform::db::postgres_options`]), and `LISTEN`ing when this returns. Its
    /// one-connection pool only reconnects it, as [`PgListener::connect`]'s does.
    async fn listen(&self) -> anyhow::Result<Listening> {
        let pool = PoolOptions::<Postgres>::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(LISTEN_CONNECT_TIMEOUT)
            .connect_with(platform::db::postgres_options(&self.url)?)
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        // What [`Listener::forward`] relies on, though it is sqlx's default: a lost
        // connection is made again, and LISTENs again (both channels), before `try_recv`
        // reports the loss as `Ok(None)`.
        listener.eager_reconnect(true);
        // 44 bytes, under PostgreSQL's 63 for a channel name.
        let probe = format!("relay_probe_{}", uuid::Uuid::new_v4().simple());
        // One statement, `LISTEN "outbox_created";LISTEN "<probe>";`, which stays the
        // connection's last in `pg_stat_activity` (see [`Listener::end_lost`]).
        listener
            .listen_all([OUTBOX_CHANNEL, probe.as_str()])
            .await?;
        Ok(Listening { listener, probe })
    }

    /// Turns notifications into permits until the relay stops, bringing the listener back
    /// whenever it is lost.
    async fn forward(self, first: anyhow::Result<Listening>, signal: Signal) {
        let mut recovery = Recovery::new("the LISTEN connection");
        let mut listening = recovery.started(first, &signal, || self.listen()).await;
        loop {
            let heard =
                unless_failed_at(points::RELAY_WAKEUPS_LOST, self.hear(&mut listening)).await;
            match heard {
                Ok(Heard::Commit) => {
                    // Several notifications before the relay looks are one reason to claim.
                    while listening.listener.next_buffered().is_some() {}
                    crate::metrics::woken_by_a_commit();
                    signal.wake();
                }
                Ok(Heard::Itself) => {}
                Ok(Heard::Repaired) => recovery.repaired(&signal).await,
                // Lost and not made again (the server refusing connections, or restarting
                // for longer than LISTEN_CONNECT_TIMEOUT), gone without a word (its check
                // went unheard), or an error on a connection that may be broken: a new
                // listener replaces it.
                Err(err) => {
                    let lost = listening.probe.clone();
                    listening = recovery
                        .replace(listening, &err, &signal, || self.listen())
                        .await;
                    // On a task of its own: the new listener hears meanwhile.
                    let this = self.clone();
                    tokio::spawn(async move { this.end_lost(&lost).await });
                }
            }
        }
    }

    /// The next thing `listening` hears; after a quiet spell, the answer to a liveness
    /// check, or the error that it went unheard ([`Liveness`]). The wait for a
    /// notification is never cancelled while the listener is kept: the check is sent on
    /// another connection while that same wait goes on, and a notification that arrives
    /// meanwhile is returned at once.
    async fn hear(&self, listening: &mut Listening) -> anyhow::Result<Heard> {
        let Listening { listener, probe } = listening;
        let received = listener.try_recv();
        tokio::pin!(received);
        let heard = |received: Option<PgNotification>| match received {
            None => Heard::Repaired,
            Some(notification) if notification.channel() == probe.as_str() => Heard::Itself,
            Some(_) => Heard::Commit,
        };
        loop {
            if let Ok(received) = tokio::time::timeout(self.liveness.quiet, &mut received).await {
                return Ok(heard(received?));
            }
            let sent = tokio::select! {
                received = &mut received => return Ok(heard(received?)),
                sent = self.send_check(probe) => sent,
            };
            match sent {
                Ok(()) => {
                    let answer = self.liveness.answer_within;
                    return match tokio::time::timeout(answer, &mut received).await {
                        Ok(received) => Ok(heard(received?)),
                        Err(_) => Err(anyhow::anyhow!(
                            "a liveness check went unheard for {answer:?}: \
                             the connection is gone without a word"
                        )),
                    };
                }
                Err(err) => tracing::debug!(
                    error = format!("{err:#}"),
                    "cannot check that the LISTEN connection still hears; checking again later"
                ),
            }
        }
    }

    /// Notifies `probe` from a connection made for it and closed.
    async fn send_check(&self, probe: &str) -> anyhow::Result<()> {
        self.on_a_connection_of_its_own(async |connection| {
            sea_orm::sqlx::query("SELECT pg_notify($1, '')")
                .bind(probe)
                .execute(connection)
                .await
        })
        .await
    }

    /// Ends the server's side of the lost listener that listened to `probe`, if it is still
    /// there (best effort, logged). A connection gone without a word is still `LISTEN`ing
    /// on the server, holding one of its `max_connections`, until the server's TCP
    /// keepalive gives up, two hours by default; its last statement named `probe`, which no
    /// other connection's does.
    async fn end_lost(&self, probe: &str) {
        let ended = self
            .on_a_connection_of_its_own(async |connection| {
                sea_orm::sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE usename = current_user AND pid <> pg_backend_pid() \
                     AND position($1 in query) > 0",
                )
                .bind(probe)
                .execute(connection)
                .await
            })
            .await;
        match ended {
            Ok(()) => {}
            Err(err) => tracing::debug!(
                error = format!("{err:#}"),
                "cannot end the lost LISTEN connection's server side; the server will"
            ),
        }
    }

    /// Runs `statement` on a connection made for it and closed, all within
    /// LISTEN_CONNECT_TIMEOUT.
    async fn on_a_connection_of_its_own<T>(
        &self,
        statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sea_orm::sqlx::Error>,
    ) -> anyhow::Result<()> {
        let options = platform::db::postgres_options(&self.url)?;
        tokio::time::timeout(LISTEN_CONNECT_TIMEOUT, async {
            let mut connection = PgConnection::connect_with(&options).await?;
            statement(&mut connection).await?;
            connection.close().await?;
            anyhow::Ok(())
        })
        .await
        .context("timed out")?
    }
}

/// The SQLite watcher's connection, and the `data_version` it starts from (read before
/// this returns, not when the watcher first runs: a commit made after the relay's first
/// claim but before that read would otherwise be taken for the starting point and wake
/// nobody; and when lost wake-ups come back, the commits made meanwhile are behind it, so
/// only the claim [`Recovery`] wakes the relay for finds their rows).
async fn open_watcher(url: &str) -> anyhow::Result<(SqliteConnection, i64)> {
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
    let mut recovery = Recovery::new("the SQLite watcher");
    let (mut connection, mut seen) = recovery
        .started(first, &signal, || open_watcher(&url))
        .await;
    let mut tick = tokio::time::interval(SQLITE_WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let read =
            unless_failed_at(points::RELAY_WAKEUPS_LOST, data_version(&mut connection)).await;
        match read {
            Ok(version) => {
                let wake = seen != version && any_pending(&mut connection).await;
                seen = version;
                if wake {
                    crate::metrics::woken_by_a_commit();
                    signal.wake();
                    tick.reset_after(SQLITE_MIN_WAKE_GAP);
                }
            }
            Err(err) => {
                (connection, seen) = recovery
                    .replace((connection, seen), &err, &signal, || open_watcher(&url))
                    .await;
            }
        }
    }
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

    /// README: a listener that has heard nothing for 30 s checks that it still hears, and
    /// gives the check 5 s (tests use shorter ones of their own).
    #[test]
    fn a_listener_checks_after_30_s_of_quiet_and_waits_5_s_for_its_check() {
        let liveness = Liveness::default();
        assert_eq!(
            (liveness.quiet, liveness.answer_within),
            (Duration::from_secs(30), Duration::from_secs(5))
        );
    }

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

    /// A watcher that cannot tell whether a row is pending (here the file has no outbox
    /// table at all) wakes the relay for a commit anyway: the claim will say.
    #[tokio::test]
    async fn a_commit_wakes_the_relay_when_the_watcher_cannot_read_the_outbox() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("bare.db").display());
        let db = platform::db::connect(&url).await.expect("connect");
        let wakeup = Wakeup::for_database(&url).await;
        assert!(wakeup.is_listening(), "watching the file");
        sea_orm::ConnectionTrait::execute_unprepared(&db, "CREATE TABLE probe (x INTEGER)")
            .await
            .expect("a commit");
        tokio::time::timeout(Duration::from_secs(10), wakeup.notified())
            .await
            .expect("woken though the outbox could not be read");
    }

    /// README: the SQLite watcher wakes the relay at most once per 40 ms however often
    /// commits come, since each claim it causes takes the write lock CreateStudent needs.
    /// (Slowness can only make fewer wake-ups, never more.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_wake_the_sqlite_relay_at_most_once_per_gap() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("bare.db").display());
        let db = platform::db::connect(&url).await.expect("connect");
        sea_orm::ConnectionTrait::execute_unprepared(&db, "CREATE TABLE probe (x INTEGER)")
            .await
            .expect("a table");
        let wakeup = Wakeup::for_database(&url).await;
        assert!(wakeup.is_listening(), "watching the file");
        let window = Duration::from_secs(1);
        let started = std::time::Instant::now();
        let writer = tokio::spawn(async move {
            while started.elapsed() < window {
                sea_orm::ConnectionTrait::execute_unprepared(&db, "INSERT INTO probe VALUES (1)")
                    .await
                    .expect("a commit");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        let mut wakes = 0_u128;
        let _ = tokio::time::timeout(window, async {
            loop {
                wakeup.notified().await;
                wakes += 1;
            }
        })
        .await;
        let elapsed = started.elapsed();
        writer.await.expect("the writer");
        let most = elapsed.as_millis() / SQLITE_MIN_WAKE_GAP.as_millis() + 2;
        assert!(
            (3..=most).contains(&wakes),
            "{wakes} wake-ups in {elapsed:?}, at most {most}"
        );
    }

    /// A set-up that fails `failures` times, then works.
    fn failing(mut failures: u32) -> impl FnMut() -> std::future::Ready<anyhow::Result<()>> {
        move || {
            let fail = failures > 0;
            failures = failures.saturating_sub(1);
            std::future::ready(if fail {
                Err(anyhow::anyhow!("down"))
            } else {
                Ok(())
            })
        }
    }

    /// When the relay is woken, measured from now: at once, or after a wait.
    fn woken_after(signal: &Signal) -> tokio::task::JoinHandle<Duration> {
        let (notified, from) = (signal.notified.clone(), tokio::time::Instant::now());
        tokio::spawn(async move {
            notified.notified().await;
            from.elapsed()
        })
    }

    /// README, "Wake-up": tries wait 0.1 s, doubling to 5 s; the wake-up comes once a try
    /// works; the doubling goes on for a loss within 5 s of their coming back and starts
    /// over after that.
    #[tokio::test(start_paused = true)]
    async fn tries_to_get_wake_ups_back_wait_longer_while_they_keep_failing() {
        let (signal, mut recovery) = (Signal::new(), Recovery::new("test"));
        let woken = woken_after(&signal);
        recovery.get_back(&signal, failing(6)).await;
        // 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5 s: six failed tries, the seventh works.
        let waits: Duration = (0..6)
            .map(|doublings| RECOVERY_BASE * (1 << doublings))
            .sum();
        assert_eq!(woken.await.expect("woken"), waits + RECOVERY_MAX);
        assert!(signal.listening.load(Ordering::Relaxed));

        tokio::time::advance(Duration::from_secs(1)).await;
        let (woken, started) = (woken_after(&signal), tokio::time::Instant::now());
        recovery.get_back(&signal, failing(0)).await;
        assert_eq!(
            started.elapsed(),
            RECOVERY_MAX,
            "lost 1 s after coming back"
        );
        assert_eq!(woken.await.expect("woken"), RECOVERY_MAX);

        tokio::time::advance(RECOVERY_MAX).await;
        let started = tokio::time::Instant::now();
        recovery.get_back(&signal, failing(1)).await;
        assert_eq!(
            started.elapsed(),
            RECOVERY_BASE * 3,
            "up for 5 s: 0.1 s, then 0.2 s"
        );
    }

    /// A loss the listener repaired itself wakes the relay at once; the listener waits
    /// before it looks again only when losses follow each other within 5 s (or come
    /// within 5 s of its start, which counts as coming back), and a steady spell starts
    /// the doubling over.
    #[tokio::test(start_paused = true)]
    async fn a_repaired_loss_wakes_the_relay_at_once_and_pauses_only_when_losses_repeat() {
        let (signal, mut recovery) = (Signal::new(), Recovery::new("test"));
        tokio::time::advance(RECOVERY_MAX).await;
        for pause in [Duration::ZERO, RECOVERY_BASE, RECOVERY_BASE * 2] {
            let (woken, started) = (woken_after(&signal), tokio::time::Instant::now());
            recovery.repaired(&signal).await;
            assert_eq!(woken.await.expect("woken"), Duration::ZERO);
            assert_eq!(started.elapsed(), pause);
        }
        tokio::time::advance(RECOVERY_MAX).await;
        let started = tokio::time::Instant::now();
        recovery.repaired(&signal).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "steady again");
        let started = tokio::time::Instant::now();
        recovery.repaired(&signal).await;
        assert_eq!(
            started.elapsed(),
            RECOVERY_BASE,
            "and the doubling starts over"
        );
    }
}
