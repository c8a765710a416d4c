//! The `relay` command line: `run` (the default), `replay`, `status`.

use std::{io::Write as _, process::ExitCode};

use clap::{Parser, Subcommand};
use uuid::Uuid;

use crate::{Relay, RunConfig, replay, status, users_client::UsersClient};

#[derive(Debug, Parser)]
#[command(
    name = "relay",
    about = "Delivers the Student outbox to the Users service",
    version
)]
pub struct Cli {
    /// Student DB (the relay works on Student's side).
    #[arg(
        long,
        env = "STUDENT_DATABASE_URL",
        default_value = "sqlite://data/student.db?mode=rwc",
        global = true
    )]
    pub database_url: String,
    /// Users service address.
    #[arg(
        long,
        env = "USERS_URL",
        default_value = "http://127.0.0.1:50052",
        global = true
    )]
    pub users_url: String,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Deliver pending outbox rows until stopped (the default, with default tuning).
    Run(RunConfig),
    /// Deliver the stored intents of done rows again, answered only from Users' inbox.
    Replay(ReplayArgs),
    /// Print outbox row counts per status and the age of the oldest pending row.
    Status,
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct ReplayArgs {
    /// Replay the row of this student.
    #[arg(long)]
    pub student: Option<Uuid>,
    /// Replay the row with this idempotency key.
    #[arg(long)]
    pub key: Option<String>,
    /// Replay every done row.
    #[arg(long)]
    pub all: bool,
}

impl ReplayArgs {
    fn selection(&self) -> replay::Selection {
        match (&self.student, &self.key) {
            (Some(id), _) => replay::Selection::Student(*id),
            (None, Some(key)) => replay::Selection::Key(key.clone()),
            (None, None) => replay::Selection::All,
        }
    }
}

/// Runs the parsed command line and returns the process exit code.
pub async fn execute(cli: Cli) -> ExitCode {
    let result = match cli.command {
        None => run(&cli.database_url, &cli.users_url, RunConfig::default()).await,
        Some(Command::Run(config)) => run(&cli.database_url, &cli.users_url, config).await,
        Some(Command::Replay(args)) => {
            replay(&cli.database_url, &cli.users_url, &args.selection()).await
        }
        Some(Command::Status) => status(&cli.database_url).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "relay failed");
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(database_url: &str, users_url: &str, config: RunConfig) -> anyhow::Result<ExitCode> {
    let shutdown = platform::shutdown::on_signal()?;
    let Some(db) = crate::open_when_ready(database_url, &shutdown).await else {
        return Ok(ExitCode::SUCCESS);
    };
    let users = UsersClient::new(users_url, config.call_timeout)?;
    tracing::info!(
        users_url,
        batch_size = config.batch_size,
        concurrency = config.concurrency,
        "relay running"
    );
    Relay { db, users, config }.run(shutdown).await;
    Ok(ExitCode::SUCCESS)
}

async fn replay(
    database_url: &str,
    users_url: &str,
    selection: &replay::Selection,
) -> anyhow::Result<ExitCode> {
    let db = open_existing(database_url).await?;
    let users = UsersClient::new(users_url, RunConfig::default().call_timeout)?;
    let mut out = std::io::stdout().lock();
    let summary = replay::replay(&db, &users, selection, &mut out).await?;
    out.flush()?;
    Ok(ExitCode::from(summary.exit_code()))
}

async fn status(database_url: &str) -> anyhow::Result<ExitCode> {
    let db = open_existing(database_url).await?;
    let report = status::read(&db).await?;
    status::print(&report, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

/// Opens the Student DB for a one-shot command, which never waits for the schema.
async fn open_existing(database_url: &str) -> anyhow::Result<sea_orm::DatabaseConnection> {
    let db = platform::db::connect(database_url).await?;
    let current = migrations::is_current::<migrations::student::Migrator>(&db)
        .await
        .unwrap_or(false);
    anyhow::ensure!(
        current,
        "the Student DB has no schema yet: start student-svc first"
    );
    Ok(db)
}
