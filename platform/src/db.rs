//! Opening a database and its write transactions, identically for SQLite and PostgreSQL.

use std::{
    cell::Cell,
    ffi::{c_int, c_void},
    path::Path,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    RuntimeErr, SqlErr, SqliteTransactionMode, TransactionOptions, TransactionTrait,
    sea_query::{CommonTableExpression, Expr, InsertStatement, WithClause},
    sqlx::{
        postgres::PgConnectOptions,
        sqlite::{SqliteJournalMode, SqliteSynchronous},
    },
};

/// How long a SQLite writer waits for the write lock before giving up with SQLITE_BUSY.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a SQLite writer sleeps between two tries for the write lock (see
/// [`wait_for_the_write_lock`]).
const SQLITE_BUSY_PAUSE: Duration = Duration::from_millis(1);

/// A pooled connection idle at least this long is pinged before use: a busy service reuses
/// its connections far more often and never pays for it, while one that sat through a
/// database restart or a dropped connection is tested before a request meets it. (The
/// window HikariCP uses for the same purpose, `aliveBypassWindowMs`.)
const IDLE_BEFORE_PING: Duration = Duration::from_millis(500);

/// Connections a pool opens when its owner does not say: enough for a tool or a test.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// Opens a connection pool for `url` (`sqlite://…` or `postgres://…`) of at most
/// [`DEFAULT_MAX_CONNECTIONS`] connections.
pub async fn connect(url: &str) -> anyhow::Result<DatabaseConnection> {
    connect_with(url, DEFAULT_MAX_CONNECTIONS).await
}

/// Opens a connection pool for `url` (`sqlite://…` or `postgres://…`) of at most
/// `max_connections` connections (each binary's `--db-max-connections`: on PostgreSQL
/// every connection counts against the server's `max_connections`).
///
/// SQLite files are created on first use, with their parent directory, in WAL mode (readers
/// never block the writer) with a busy timeout (writers queue instead of failing) and
/// `synchronous=FULL`: a commit is on disk before it is acknowledged, so an OS crash or a
/// power cut cannot take back a student the client was told exists, or a user a link
/// points to. (`NORMAL` in WAL mode may lose the last commits, and the Student and Users
/// files would lose them independently.)
pub async fn connect_with(url: &str, max_connections: u32) -> anyhow::Result<DatabaseConnection> {
    connect_with_settings(url, max_connections, &[]).await
}

/// [`connect_with`], every PostgreSQL connection of the pool starting with `settings`
/// (run-time parameters, `name = value`, as `SET` would give them; SQLite ignores them).
pub async fn connect_with_settings(
    url: &str,
    max_connections: u32,
    settings: &'static [(&'static str, &'static str)],
) -> anyhow::Result<DatabaseConnection> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(max_connections.max(1))
        .min_connections(1);
    options
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(10))
        // sqlx pings every connection as it goes back to the pool and closes it if broken;
        // pinging it again as it is taken out only catches connections that died while
        // idle. So only those idle for a while are pinged: one round trip less per use of
        // the pool on every busy path (a replay is one statement, so this halves its trips).
        .test_before_acquire_if_idle_for(IDLE_BEFORE_PING)
        .sqlx_logging(false);
    options.map_sqlx_postgres_opts(move |o| match settings {
        [] => named(o),
        _ => named(o).options(settings.iter().copied()),
    });
    if is_sqlite(url) {
        create_parent_dir(url)?;
        // Exported from the start, at 0 (with `--metrics-addr`, whose recorder is installed
        // before the database opens): a counter that first appears at its first pause
        // hides that pause from `rate()`, and so from the alert that reads it.
        metrics::counter!(SQLITE_WRITE_LOCK_WAITS).increment(0);
        // Every connection waits for the write lock in short, equal pauses
        // ([`wait_for_the_write_lock`]), not in SQLite's growing ones.
        options.map_sqlx_sqlite_pool_opts(|pool| {
            pool.after_connect(|connection, _| {
                Box::pin(async move {
                    let mut handle = connection.lock_handle().await?;
                    // SAFETY: the handle is a live connection, locked for this call so that
                    // nothing runs on it meanwhile; the handler takes no argument.
                    unsafe {
                        libsqlite3_sys::sqlite3_busy_handler(
                            handle.as_raw_handle().as_ptr(),
                            Some(wait_for_the_write_lock),
                            std::ptr::null_mut(),
                        );
                    }
                    Ok(())
                })
            })
        });
        // (sea-orm would default a SQLite pool to one connection: a second concurrent
        // transaction would then wait for the pool instead of for SQLite's lock.)
        options.map_sqlx_sqlite_opts(|o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                .foreign_keys(true)
        });
    }
    // Another process creating the same SQLite file (switching it to WAL) holds a lock that
    // the busy timeout does not cover; it is released within moments, so retry briefly.
    let mut pause = Duration::from_millis(50);
    let deadline = tokio::time::Instant::now() + SQLITE_BUSY_TIMEOUT;
    loop {
        match Database::connect(options.clone()).await {
            Err(err) if is_sqlite_busy(&err) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            result => {
                return result.with_context(|| format!("cannot open database {}", redact_url(url)));
            }
        }
    }
}

/// PostgreSQL connection options for `url`, named as [`connect_with`] names them: for a
/// connection a pool does not make (the relay's `LISTEN`).
pub fn postgres_options(url: &str) -> anyhow::Result<PgConnectOptions> {
    let options: PgConnectOptions = url
        .parse()
        .with_context(|| format!("not a PostgreSQL URL: {}", redact_url(url)))?;
    Ok(named(options))
}

/// Every PostgreSQL connection says whose it is: its `application_name` (what
/// `pg_stat_activity` shows) is the program's own name, `student-svc`, `users-svc` or
/// `relay`, unless the URL (`?application_name=…`) or `PGAPPNAME` gives one. Connections
/// count against the server's `max_connections`; this is how an operator sees which
/// binaries hold them (README, "Running on PostgreSQL").
fn named(options: PgConnectOptions) -> PgConnectOptions {
    match program_name() {
        Some(name) if options.get_application_name().is_none() => options.application_name(name),
        _ => options,
    }
}

/// This program's name (its executable's, without a directory or an extension), read once.
pub fn program_name() -> Option<&'static str> {
    static NAME: OnceLock<Option<String>> = OnceLock::new();
    NAME.get_or_init(|| {
        let exe = std::env::current_exe().ok()?;
        Some(exe.file_stem()?.to_string_lossy().into_owned())
    })
    .as_deref()
}

/// Times this process's SQLite writers have paused for the write lock: each pause is one
/// [`SQLITE_BUSY_PAUSE`] while another connection (of this process or another) wrote.
/// Operators read the same count as [`SQLITE_WRITE_LOCK_WAITS`].
pub fn sqlite_lock_waits() -> u64 {
    SQLITE_LOCK_WAITS.load(Ordering::Relaxed)
}

/// The counter of those pauses at `/metrics` (README, "Metrics"): how often writers queue
/// on the one SQLite file, and roughly for how many milliseconds in all.
pub const SQLITE_WRITE_LOCK_WAITS: &str = "sqlite_write_lock_waits_total";

static SQLITE_LOCK_WAITS: AtomicU64 = AtomicU64::new(0);

/// The pause before the next try for SQLite's write lock, after waiting `waited` for it;
/// `None` once the busy timeout is spent (the statement then fails with SQLITE_BUSY).
fn busy_pause(waited: Duration) -> Option<Duration> {
    (waited < SQLITE_BUSY_TIMEOUT).then_some(SQLITE_BUSY_PAUSE)
}

/// When the current wait for the write lock began: now at a statement's first try
/// (`tries` 0), else at that first try, so that the busy timeout counts from it.
fn wait_began(tries: c_int, now: Instant, first_try: Option<Instant>) -> Instant {
    if tries == 0 {
        now
    } else {
        first_try.unwrap_or(now)
    }
}

/// Every SQLite connection's busy handler: while another connection holds the one write
/// lock, try again every millisecond, for up to the busy timeout.
///
/// SQLite's own handler (what `busy_timeout` installs) sleeps longer the more tries a
/// writer has made, up to 100 ms between two of them, and the lock goes to whoever asks
/// first once it is free. student-svc's writer asks again as soon as it has committed, so
/// a relay that had lost a few times slept through dozens of its commits: at 4 in flight
/// one relay thread was seen in 100 ms sleeps for four seconds on end, and rows waited
/// seconds to be linked while the relay sat idle (BENCHMARKS.md, "SQLite's write lock,
/// shared"). With the same short pause for every writer, each gets its turn.
///
/// SQLite calls it on the thread running the statement, which for sqlx is the
/// connection's own, so a thread-local holds when the current wait began.
extern "C" fn wait_for_the_write_lock(_: *mut c_void, tries: c_int) -> c_int {
    thread_local! {
        static WAITING_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    let since = WAITING_SINCE
        .try_with(|since| {
            let began = wait_began(tries, now, since.get());
            since.set(Some(began));
            began
        })
        .unwrap_or(now);
    match busy_pause(now.saturating_duration_since(since)) {
        Some(pause) => {
            SQLITE_LOCK_WAITS.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(SQLITE_WRITE_LOCK_WAITS).increment(1);
            std::thread::sleep(pause);
            1
        }
        None => 0,
    }
}

/// Tells whether `err` is SQLite's "database is locked" (SQLITE_BUSY or an extended form):
/// other writers held SQLite's one write lock for longer than the busy timeout. Nothing of
/// the request was written; sent again later, it may pass.
pub fn is_sqlite_busy(err: &DbErr) -> bool {
    // Only SQLite's codes are numbers to mask: a PostgreSQL SQLSTATE can be all digits too
    // (22021, an invalid byte sequence, is 5 in its low byte).
    database_error(err)
        .filter(|err| {
            err.try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
                .is_some()
        })
        .and_then(|err| err.code()?.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

/// Tells whether PostgreSQL aborted `err`'s transaction in a conflict with a concurrent one:
/// a deadlock (SQLSTATE 40P01) or a serialization failure (40001). Nothing of it stays, and
/// the same request, sent again, may pass. (Two writers that lock the same keys in opposite
/// orders can deadlock: see [`insert_both`].)
pub fn is_transaction_conflict(err: &DbErr) -> bool {
    matches!(database_code(err).as_deref(), Some("40P01" | "40001"))
}

/// Whether the database itself refused what `err` is about (a constraint, a deadlock, a
/// syntax error): the statement or transaction was rolled back and nothing of it is
/// written. An error without the database's answer (a lost connection) may hide a commit.
pub fn is_database_error(err: &DbErr) -> bool {
    database_code(err).is_some()
}

/// The database's own code for `err`: PostgreSQL's SQLSTATE, SQLite's result code.
fn database_code(err: &DbErr) -> Option<String> {
    database_error(err)?.code().map(|code| code.into_owned())
}

/// The database's own answer inside `err`, if it holds one.
fn database_error(err: &DbErr) -> Option<&dyn sea_orm::sqlx::error::DatabaseError> {
    let (DbErr::Conn(runtime) | DbErr::Exec(runtime) | DbErr::Query(runtime)) = err else {
        return None;
    };
    let RuntimeErr::SqlxError(err) = runtime else {
        return None;
    };
    let sea_orm::sqlx::Error::Database(err) = err.as_ref() else {
        return None;
    };
    Some(err.as_ref())
}

/// Begins a transaction that will write.
///
/// On SQLite it starts IMMEDIATE, taking the write lock up front: a deferred transaction
/// that reads and then writes fails with SQLITE_BUSY at the upgrade, which the busy timeout
/// does not retry. On PostgreSQL it is a plain READ COMMITTED transaction.
pub async fn begin_write(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let mut options = TransactionOptions::default();
    if db.get_database_backend() == DbBackend::Sqlite {
        options.sqlite_transaction_mode = Some(SqliteTransactionMode::Immediate);
    }
    db.begin_with_options(options).await
}

/// Tells whether `err` is a unique-constraint violation (the same answer on both backends).
pub fn is_unique_violation(err: &DbErr) -> bool {
    matches!(err.sql_err(), Some(SqlErr::UniqueConstraintViolation(_)))
}

/// Two INSERTs as ONE PostgreSQL statement, `WITH first AS (<first>) <then>`: one round
/// trip instead of BEGIN, both INSERTs and COMMIT, and still one transaction (a statement
/// is its own). PostgreSQL runs a data-modifying `WITH` exactly once though nothing reads
/// it, and a failure of either INSERT (a unique violation) fails both. It promises no order
/// between them (today it runs `then` first and the `WITH` after it), so neither may need
/// the other's row, and the explicit transaction elsewhere locks unique keys in the other
/// order: two writers of the same keys, one each way, can deadlock, and PostgreSQL then
/// aborts one of them (its caller gets ABORTED, see [`is_transaction_conflict`]). SQLite
/// has no `INSERT` inside `WITH`: there, use a transaction.
pub fn insert_both(first: InsertStatement, mut then: InsertStatement) -> InsertStatement {
    then.with_cte(
        WithClause::new()
            .cte(
                CommonTableExpression::new()
                    .query(first)
                    .table_name("first")
                    .to_owned(),
            )
            .to_owned(),
    );
    then
}

/// Tells whether `url` names a SQLite database.
pub fn is_sqlite(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// Returns `url` without its password, fit for logs and error messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _password)) => {
                    format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn create_parent_dir(url: &str) -> anyhow::Result<()> {
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    if path.is_empty() || path == ":memory:" {
        return Ok(());
    }
    if let Some(parent) = Path::new(path)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create directory {}", parent.display()))?;
    }
    Ok(())
}

/// The application's current UTC time at microsecond precision, the finest both backends
/// store, so a timestamp reads back exactly as it was written.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    use chrono::SubsecRound as _;
    (chrono::Utc::now() + crate::failpoint::clock_skew()).trunc_subsecs(6)
}

/// "Now" for a time the relays compare with each other's (`available_at`, leases): on
/// PostgreSQL the database's clock (`CURRENT_TIMESTAMP`), so a host whose clock runs ahead
/// or behind cannot delay or hurry its rows; on SQLite, where every process shares one
/// machine, the application's clock, bound in the format the rows are stored in.
pub fn shared_now(backend: DbBackend) -> Expr {
    match backend {
        DbBackend::Postgres => Expr::current_timestamp(),
        _ => Expr::value(now()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_both_is_one_statement_whose_with_holds_the_first_insert() {
        use sea_orm::sea_query::{PostgresQueryBuilder, Query};
        let insert = |table: &str, value: i32| {
            Query::insert()
                .into_table(table.to_owned())
                .columns(["n".to_owned()])
                .values_panic([value.into()])
                .to_owned()
        };
        assert_eq!(
            insert_both(insert("a", 1), insert("b", 2)).to_string(PostgresQueryBuilder),
            r#"WITH "first" AS (INSERT INTO "a" ("n") VALUES (1)) INSERT INTO "b" ("n") VALUES (2)"#
        );
    }

    #[test]
    fn postgres_connections_are_named_after_the_program_unless_the_url_names_them() {
        let by_url =
            postgres_options("postgres://app@db/student?application_name=relay-3").expect("a URL");
        assert_eq!(by_url.get_application_name(), Some("relay-3"));
        let this_binary = program_name().expect("this test's program");
        assert!(this_binary.starts_with("platform-"), "{this_binary}");
        let program = std::env::var("PGAPPNAME").unwrap_or_else(|_| this_binary.to_owned());
        let unnamed = postgres_options("postgres://app@db/student").expect("a URL");
        assert_eq!(unnamed.get_application_name(), Some(program.as_str()));
    }

    #[test]
    fn a_sqlite_writer_pauses_a_millisecond_between_tries_until_the_busy_timeout() {
        let pause = Duration::from_millis(1);
        assert_eq!(busy_pause(Duration::ZERO), Some(pause));
        assert_eq!(busy_pause(Duration::from_millis(9_999)), Some(pause));
        assert_eq!(busy_pause(SQLITE_BUSY_TIMEOUT), None);
    }

    /// The timeout counts from a statement's first try, not its latest: a writer behind a
    /// lock that is never freed gives up (SQLITE_BUSY, answered DATABASE_BUSY) instead of
    /// waiting forever; the next statement's wait starts afresh.
    #[test]
    fn a_writers_wait_is_timed_from_its_first_try() {
        let first = Instant::now();
        let later = first + SQLITE_BUSY_TIMEOUT;
        assert_eq!(wait_began(0, first, None), first);
        assert_eq!(wait_began(9_000, later, Some(first)), first);
        assert_eq!(
            busy_pause(later.duration_since(wait_began(9_000, later, Some(first)))),
            None,
            "spent"
        );
        assert_eq!(wait_began(0, later, Some(first)), later);
    }

    /// README: timestamps have microsecond precision, no finer (what both backends keep)
    /// and no coarser (link latencies are measured from them).
    #[test]
    fn now_keeps_microseconds() {
        use chrono::Timelike as _;
        let samples: Vec<_> = (0..2_000).map(|_| now()).collect();
        assert!(samples.iter().all(|at| at.nanosecond() % 1_000 == 0));
        assert!(
            samples.iter().any(|at| at.nanosecond() % 1_000_000 != 0),
            "some sample has microseconds below the millisecond"
        );
    }

    /// README ("Storage notes"): SQLite files are created on first start, with the
    /// directories their path names (`./data/` for the defaults).
    #[tokio::test]
    async fn a_sqlite_file_is_created_with_the_directories_its_path_names() {
        use sea_orm::ConnectionTrait as _;
        let root = std::env::temp_dir().join(format!("dirs-{}", uuid::Uuid::new_v4()));
        let path = root.join("new").join("sub").join("s.db");
        let db = connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .expect("open");
        db.execute_unprepared("CREATE TABLE t (n INTEGER)")
            .await
            .expect("a table");
        assert!(path.is_file(), "{} created", path.display());
        std::fs::remove_dir_all(root).expect("clean up");
    }

    /// A writer that finds the lock taken waits in the project's handler (its pauses are
    /// counted) and writes once the lock is free.
    #[tokio::test]
    async fn a_sqlite_writer_waits_for_the_lock_in_the_projects_handler() {
        use sea_orm::ConnectionTrait as _;
        let path = std::env::temp_dir().join(format!("busy-{}.db", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let (holder, writer) = (
            connect(&url).await.expect("open"),
            connect(&url).await.expect("open"),
        );
        holder
            .execute_unprepared("CREATE TABLE t (n INTEGER)")
            .await
            .expect("table");
        let lock = begin_write(&holder).await.expect("the write lock");
        let before = sqlite_lock_waits();
        let write = tokio::spawn(async move {
            let transaction = begin_write(&writer).await?;
            transaction
                .execute_unprepared("INSERT INTO t VALUES (1)")
                .await?;
            transaction.commit().await
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while sqlite_lock_waits() < before + 3 {
            assert!(
                Instant::now() < deadline,
                "the writer never paused in our handler"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(!write.is_finished(), "it waits while the lock is held");
        lock.commit().await.expect("released");
        write
            .await
            .expect("task")
            .expect("written once the lock is free");
        let rows = holder
            .query_one_raw(sea_orm::Statement::from_string(
                DbBackend::Sqlite,
                "SELECT count(*) AS n FROM t",
            ))
            .await
            .expect("count")
            .expect("a row")
            .try_get::<i64>("", "n")
            .expect("n");
        assert_eq!(rows, 1);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn redact_url_hides_the_password_only() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/student"),
            "postgres://app:***@db:5432/student"
        );
        assert_eq!(
            redact_url("postgres://app@db/student"),
            "postgres://app@db/student"
        );
        assert_eq!(
            redact_url("sqlite://data/student.db?mode=rwc"),
            "sqlite://data/student.db?mode=rwc"
        );
    }

    /// The credentials end at the last '@' (the host part never holds one), so a password
    /// containing '@' is hidden whole.
    #[test]
    fn redact_url_hides_a_password_containing_an_at_sign() {
        let redacted = redact_url("postgres://app:p@ss@db:5432/student");
        assert_eq!(redacted, "postgres://app:***@db:5432/student");
        for part in ["p@ss", "ss@", ":p"] {
            assert!(!redacted.contains(part), "{part:?} leaked in {redacted}");
        }
    }

    #[tokio::test]
    async fn sqlite_commits_reach_the_disk_before_they_are_acknowledged() {
        let path = std::env::temp_dir().join(format!("durability-{}.db", uuid::Uuid::new_v4()));
        let db = connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .expect("open");
        let pragma = |name: &str| {
            let statement =
                sea_orm::Statement::from_string(DbBackend::Sqlite, format!("PRAGMA {name}"));
            let db = db.clone();
            async move {
                use sea_orm::ConnectionTrait as _;
                let row = db
                    .query_one_raw(statement)
                    .await
                    .expect("pragma")
                    .expect("a row");
                row.try_get_by_index::<String>(0)
                    .or_else(|_| row.try_get_by_index::<i64>(0).map(|n| n.to_string()))
                    .expect("value")
            }
        };
        // 2 = FULL: the WAL is synced at every commit, not only at checkpoints.
        assert_eq!(pragma("synchronous").await, "2");
        assert_eq!(pragma("journal_mode").await, "wal");
        db.close().await.expect("close");
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    #[test]
    fn sqlite_urls_are_recognised() {
        assert!(is_sqlite("sqlite://data/x.db?mode=rwc"));
        assert!(is_sqlite("sqlite::memory:"));
        assert!(!is_sqlite("postgres://localhost/x"));
    }
}
