//! The schemas of the two databases, as sea-orm migrators: [`student::Migrator`] for the
//! Student DB (`students`, `outbox`, `unchanged_keys`) and [`users::Migrator`] for the
//! Users DB (`users`, `inbox`). Each service applies its own migrator on start-up with [`apply`]; the relay
//! only waits for the Student schema with [`is_current`].

use anyhow::Context as _;
use sea_orm_migration::{
    MigratorTrait,
    sea_orm::{
        ConnectionTrait, DatabaseConnection, DbBackend, DbErr, SqliteTransactionMode,
        TransactionOptions, TransactionTrait,
    },
};

pub mod student;
pub mod users;

/// Applies every pending migration of `M` to `db`.
///
/// The migrations run in one transaction that first takes a lock, so replicas that start
/// together on an empty database apply them once, one after the other, instead of both
/// seeing "not applied" and racing to create the same tables: on PostgreSQL an advisory
/// lock, on SQLite the write lock (`BEGIN IMMEDIATE`; the other replica waits in its busy
/// timeout, then finds everything applied).
pub async fn apply<M: MigratorTrait>(db: &DatabaseConnection, lock_id: i64) -> Result<(), DbErr> {
    let mut options = TransactionOptions::default();
    if db.get_database_backend() == DbBackend::Sqlite {
        options.sqlite_transaction_mode = Some(SqliteTransactionMode::Immediate);
    }
    let txn = db.begin_with_options(options).await?;
    if db.get_database_backend() == DbBackend::Postgres {
        // Released at commit or rollback: a crashed migrator never leaves the lock held.
        txn.execute_unprepared(&format!("SELECT pg_advisory_xact_lock({lock_id})"))
            .await?;
    }
    M::up(&txn, None).await?;
    txn.commit().await
}

/// A database schema a service owns: its migrator, a name for messages, and the lock its
/// migrations run under.
pub trait Schema: MigratorTrait {
    /// `Student` or `Users`, as in "the Student DB".
    const NAME: &'static str;
    /// The PostgreSQL advisory lock id its migrations run under.
    const LOCK_ID: i64;
}

impl Schema for student::Migrator {
    const NAME: &'static str = "Student";
    const LOCK_ID: i64 = STUDENT_LOCK_ID;
}

impl Schema for users::Migrator {
    const NAME: &'static str = "Users";
    const LOCK_ID: i64 = USERS_LOCK_ID;
}

/// Opens a service's database (a pool of at most `max_connections`) and brings its schema
/// `S` up to date: how both services start.
pub async fn open<S: Schema>(
    url: &str,
    max_connections: u32,
) -> anyhow::Result<DatabaseConnection> {
    let db = platform::db::connect_with(url, max_connections).await?;
    apply::<S>(&db, S::LOCK_ID)
        .await
        .with_context(|| format!("cannot migrate the {} DB", S::NAME))?;
    Ok(db)
}

/// Opens a database whose schema `S` must already be current, for a one-shot command
/// (`relay status`, `users-svc inbox show`, …): it never migrates, and says which service
/// to start first when the schema is missing or behind.
pub async fn open_existing<S: Schema>(url: &str) -> anyhow::Result<DatabaseConnection> {
    let db = platform::db::connect(url).await?;
    let current = is_current::<S>(&db).await.unwrap_or(false);
    anyhow::ensure!(
        current,
        "the {} DB has no schema yet: start {}-svc first",
        S::NAME,
        S::NAME.to_lowercase()
    );
    Ok(db)
}

/// Tells whether every migration of `M` has been applied, without writing anything.
pub async fn is_current<M: MigratorTrait>(db: &DatabaseConnection) -> Result<bool, DbErr> {
    Ok(M::get_pending_migrations_read_only(db).await?.is_empty())
}

/// Advisory-lock id the Student DB's migrations run under.
pub const STUDENT_LOCK_ID: i64 = 0x5354_5544; // "STUD"
/// Advisory-lock id the Users DB's migrations run under.
pub const USERS_LOCK_ID: i64 = 0x5553_4552; // "USER"
