//! `migrate`: applies (or inspects) a database's schema without starting a service.

use clap::{Parser, Subcommand, ValueEnum};
use migrations::{STUDENT_LOCK_ID, USERS_LOCK_ID, student, users};
use sea_orm_migration::MigratorTrait;

#[derive(Parser)]
#[command(about = "Apply or inspect the Student DB and Users DB schemas")]
struct Cli {
    #[command(subcommand)]
    database: Database,
}

#[derive(Subcommand)]
enum Database {
    /// The Student DB (`students`, `outbox`, `unchanged_keys`).
    Student {
        #[arg(
            long,
            env = "STUDENT_DATABASE_URL",
            default_value = "sqlite://data/student.db?mode=rwc"
        )]
        database_url: String,
        #[arg(value_enum, default_value_t = Action::Up)]
        action: Action,
    },
    /// The Users DB (`users`, `inbox`).
    Users {
        #[arg(
            long,
            env = "USERS_DATABASE_URL",
            default_value = "sqlite://data/users.db?mode=rwc"
        )]
        database_url: String,
        #[arg(value_enum, default_value_t = Action::Up)]
        action: Action,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Action {
    /// Apply pending migrations.
    Up,
    /// Print which migrations are applied.
    Status,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _log = platform::telemetry::init(platform::telemetry::LogFormat::Text)?;
    match Cli::parse().database {
        Database::Student {
            database_url,
            action,
        } => run::<student::Migrator>(&database_url, action, STUDENT_LOCK_ID).await,
        Database::Users {
            database_url,
            action,
        } => run::<users::Migrator>(&database_url, action, USERS_LOCK_ID).await,
    }
}

async fn run<M: MigratorTrait>(url: &str, action: Action, lock_id: i64) -> anyhow::Result<()> {
    let db = platform::db::connect(url).await?;
    match action {
        Action::Up => migrations::apply::<M>(&db, lock_id).await?,
        Action::Status => M::status(&db).await?,
    }
    Ok(())
}
