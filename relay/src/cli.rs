//! The `relay` command line: `run` (the default), `replay`, `status`, `show`, `purge`,
//! `audit`, `retry-failed`, `resend`.

use std::{io::Write as _, process::ExitCode};

use clap::{Parser, Subcommand};
use uuid::Uuid;

use anyhow::Context as _;

use crate::{
    Relay, RunConfig, audit, replay, resend, retry_failed, show, status,
    users_client::{UsersClient, UsersConnection},
    wakeup::Wakeup,
};

#[derive(Debug, Parser)]
#[command(
    name = "relay",
    about = "Delivers the Student outbox to the Users service",
    version,
    // A flag given twice takes its last value, so scripts can override a default set.
    args_override_self = true
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
    /// Users service address (`https://…` for TLS).
    #[arg(
        long,
        env = "USERS_URL",
        default_value = "http://127.0.0.1:50052",
        global = true
    )]
    pub users_url: String,
    /// PEM CA certificate to trust for an `https://` Users URL (default: the system's roots).
    #[arg(long, env = "USERS_TLS_CA", global = true)]
    pub users_ca: Option<std::path::PathBuf>,
    /// Bearer token for Users, when users-svc requires one.
    #[arg(long, env = "USERS_AUTH_TOKEN", hide_env_values = true, global = true)]
    pub users_auth_token: Option<String>,
    /// Most connections to the Student DB for `relay run` (one more is used to LISTEN on
    /// PostgreSQL). A relay mostly waits on Users, so few are enough.
    #[arg(long, env = "RELAY_DB_MAX_CONNECTIONS", default_value_t = 4, global = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub db_max_connections: u32,
    /// How long `done` rows are kept (`relay purge`, and `relay run` on its schedule), and the
    /// client keys of changes that changed nothing. Keep it as long as you may want to
    /// `relay replay` or inspect a delivery; Users' inbox must keep keys longer than the
    /// relays retry them, not this.
    #[arg(long, env = "RELAY_RETAIN_DONE", default_value = "7d", value_parser = humantime::parse_duration, global = true)]
    pub retain_done: std::time::Duration,
    /// Log lines as `text` or `json` (JSON lines carry `trace_id` as a field).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t, global = true)]
    pub log_format: platform::telemetry::LogFormat,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Deliver pending outbox rows until stopped (the default, with default tuning).
    #[command(args_override_self = true)]
    Run(RunConfig),
    /// Deliver the stored intents of done rows again, answered only from Users' inbox.
    Replay(ReplayArgs),
    /// Print outbox row counts per status and the age of the oldest pending row.
    Status,
    /// Print one student's outbox rows (effect, status, attempts, last error, times, key,
    /// result), one block per row, oldest first.
    Show(ShowArgs),
    /// Delete `done` rows older than --retain-done now, in small batches (never a row in any
    /// other status), and the kept keys of changes that changed nothing; prints `purged=N`,
    /// rows and keys together.
    Purge,
    /// Check that the two databases agree, asking Users through its API: every done row's
    /// result is its student's link, every linked user exists, points back and mirrors its
    /// student at its version, no user is shared, every enabled user has a student. One
    /// line per problem, then `checked=N problems=N`; exit 0 clean, 1 on a problem, 2 on
    /// an error.
    Audit,
    /// After the Users DB was restored from an older backup: send a student's delivered
    /// rows again, with their keys, for what Users lost of it (its user, or the changes
    /// after its user's version), as Users is asked first; or every linked student's. Exit
    /// 0 when rows went back (--all: none was refused), 1 when there was nothing to resend
    /// or it was refused, 2 on an error.
    Resend(ResendArgs),
    /// Put failed rows back to pending: rows that ran out of attempts with their key; rows
    /// Users rejected only with --new-key (a new operation). Before giving a new key, Users
    /// is asked (replay-only) about the old one: a user it created is linked instead.
    RetryFailed(RetryFailedArgs),
}

#[derive(Debug, clap::Args)]
pub struct RetryFailedArgs {
    #[command(flatten)]
    pub rows: RetryFailedRows,
    /// Give each row a fresh idempotency key: explicitly a new operation. Required for rows
    /// Users rejected, which would otherwise get the same saved rejection again. A row whose
    /// old key Users did execute is linked to that user and marked done instead; any other
    /// create-user row is linked to its student's only user in Users, re-keyed only if the
    /// student has none, skipped if it has several.
    #[arg(long)]
    pub new_key: bool,
    /// Link this user (its id) to the student of the failed create-user row `--id` names,
    /// and mark the row done: for a row whose student has several users in Users, which
    /// --new-key leaves to the operator. Users is asked first: the user must exist and name that student, and the
    /// row's own key must not have created another one.
    #[arg(long, requires = "id", conflicts_with_all = ["new_key", "all"])]
    pub link_user: Option<Uuid>,
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct RetryFailedRows {
    /// The failed outbox row with this id.
    #[arg(long)]
    pub id: Option<i64>,
    /// Every failed row.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct ResendArgs {
    /// The student whose delivered rows to send again.
    #[arg(long)]
    pub student: Option<Uuid>,
    /// Every linked student Users lost something of: one line per student resent or
    /// refused, then `resent=N refused=N unchanged=N`.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The student whose rows to show.
    #[arg(long)]
    pub student: Uuid,
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
///
/// Only the commands that call Users read its settings (`run`, `replay`, `audit`,
/// `retry-failed`, `resend`, each first thing): `status`, `show` and `purge` need the Student DB
/// alone, and work with a Users CA file that cannot be read.
pub async fn execute(cli: Cli) -> ExitCode {
    let result = match &cli.command {
        None => match RunConfig::from_env() {
            Ok(config) => run(&cli, config).await,
            Err(err) => err.exit(),
        },
        Some(Command::Run(config)) => run(&cli, config.clone()).await,
        Some(Command::Replay(args)) => replay(&cli, &args.selection()).await,
        Some(Command::Status) => status(&cli.database_url).await,
        Some(Command::Show(args)) => show(&cli.database_url, args.student).await,
        Some(Command::Audit) => audit(&cli).await,
        Some(Command::Purge) => purge(&cli.database_url, cli.retain_done).await,
        Some(Command::RetryFailed(args)) => retry(&cli, args).await,
        Some(Command::Resend(args)) => resend_lost(&cli, args.student).await,
    };
    result.unwrap_or_else(|err| fail(&err))
}

fn fail(err: &anyhow::Error) -> ExitCode {
    tracing::error!(error = format!("{err:#}"), "relay failed");
    eprintln!("error: {err:#}");
    ExitCode::from(2)
}

impl Cli {
    /// A client of Users for a one-shot command, with the default call timeout.
    fn users_client(&self) -> anyhow::Result<UsersClient> {
        UsersClient::connect(&self.users_connection()?, RunConfig::default().call_timeout)
    }

    /// How to reach Users, reading the CA file if one is given.
    fn users_connection(&self) -> anyhow::Result<UsersConnection> {
        let ca_pem = self
            .users_ca
            .as_deref()
            .map(|path| {
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
            })
            .transpose()?;
        Ok(UsersConnection {
            url: self.users_url.clone(),
            ca_pem,
            auth_token: self.users_auth_token.clone(),
        })
    }
}

async fn run(cli: &Cli, config: RunConfig) -> anyhow::Result<ExitCode> {
    let users = &cli.users_connection()?;
    config.validate()?;
    let database_url = cli.database_url.as_str();
    let shutdown = platform::shutdown::on_signal()?;
    platform::metrics::serve_if_asked(config.metrics_addr, &shutdown).await?;
    crate::metrics::describe();
    let Some(db) = crate::open_when_ready(database_url, cli.db_max_connections, &shutdown).await
    else {
        return Ok(ExitCode::SUCCESS);
    };
    if config.metrics_addr.is_some() {
        tokio::spawn(crate::metrics::watch_outbox(db.clone(), shutdown.clone()));
    }
    let (purging, retain_done) = (db.clone(), cli.retain_done);
    tokio::spawn(platform::retention::on_schedule(
        "done outbox rows and unchanged keys",
        config.purge_interval,
        shutdown.clone(),
        move || {
            let db = purging.clone();
            async move { purge_past_retention(&db, retain_done).await }
        },
    ));
    let users_url = users.url.clone();
    let users = UsersClient::connect(users, config.call_timeout)?;
    let wakeup = Wakeup::for_database(database_url).await;
    let relay = Relay::new(db, users, config);
    tracing::info!(
        relay = %relay.id,
        %users_url,
        batch_size = relay.config.batch_size,
        concurrency = relay.config.concurrency,
        lease = ?relay.config.lease,
        listen = wakeup.is_listening(),
        "relay running"
    );
    relay.run(wakeup, shutdown).await;
    Ok(ExitCode::SUCCESS)
}

async fn replay(cli: &Cli, selection: &replay::Selection) -> anyhow::Result<ExitCode> {
    let users = cli.users_client()?;
    let db = migrations::open_existing::<migrations::student::Migrator>(&cli.database_url).await?;
    let mut out = std::io::stdout().lock();
    let summary = replay::replay(&db, &users, selection, &mut out).await?;
    out.flush()?;
    Ok(ExitCode::from(summary.exit_code()))
}

async fn status(database_url: &str) -> anyhow::Result<ExitCode> {
    let db = migrations::open_existing::<migrations::student::Migrator>(database_url).await?;
    let report = status::read(&db).await?;
    status::print(&report, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

async fn show(database_url: &str, student: Uuid) -> anyhow::Result<ExitCode> {
    let db = migrations::open_existing::<migrations::student::Migrator>(database_url).await?;
    let rows = show::read(&db, student).await?;
    if rows.is_empty() {
        // The answer is "none" (exit 1), not an error (2): the convention of every
        // one-shot command, as grep's.
        eprintln!("no outbox row for student {student}");
        return Ok(ExitCode::from(1));
    }
    show::print(&rows, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

async fn purge(database_url: &str, retain_done: std::time::Duration) -> anyhow::Result<ExitCode> {
    let db = migrations::open_existing::<migrations::student::Migrator>(database_url).await?;
    let purged = purge_past_retention(&db, retain_done).await?;
    println!("purged={purged}");
    Ok(ExitCode::SUCCESS)
}

/// What `--retain-done` bounds: the `done` outbox rows (each carrying its change's client
/// key, if any) and the client keys of changes that changed nothing. Returns how many of
/// both were deleted.
async fn purge_past_retention(
    db: &sea_orm::DatabaseConnection,
    retain_done: std::time::Duration,
) -> Result<u64, sea_orm::DbErr> {
    let rows = student_store::outbox::purge_done(db, retain_done).await?;
    let keys = student_store::students::purge_unchanged_keys(db, retain_done).await?;
    Ok(rows + keys)
}

async fn audit(cli: &Cli) -> anyhow::Result<ExitCode> {
    let users = cli.users_client()?;
    let db = migrations::open_existing::<migrations::student::Migrator>(&cli.database_url).await?;
    let mut out = std::io::stdout().lock();
    let summary = audit::audit(&db, &users, &mut out).await?;
    out.flush()?;
    Ok(ExitCode::from(summary.exit_code()))
}

async fn resend_lost(cli: &Cli, student: Option<Uuid>) -> anyhow::Result<ExitCode> {
    let users = cli.users_client()?;
    let db = migrations::open_existing::<migrations::student::Migrator>(&cli.database_url).await?;
    let mut out = std::io::stdout().lock();
    let code = match student {
        Some(student) => resend::resend(&db, &users, student, &mut out).await?,
        None => resend::resend_all(&db, &users, &mut out).await?.exit_code(),
    };
    out.flush()?;
    Ok(ExitCode::from(code))
}

async fn retry(cli: &Cli, args: &RetryFailedArgs) -> anyhow::Result<ExitCode> {
    let users = cli.users_client()?;
    let db = migrations::open_existing::<migrations::student::Migrator>(&cli.database_url).await?;
    let selection = match args.rows.id {
        Some(id) => retry_failed::Selection::Id(id),
        None => retry_failed::Selection::All,
    };
    let mut out = std::io::stdout().lock();
    let summary = match (selection, args.link_user) {
        (retry_failed::Selection::Id(id), Some(user_id)) => {
            retry_failed::link_user(&db, &users, id, user_id, &mut out).await?
        }
        _ => {
            let keys = if args.new_key {
                retry_failed::Keys::New
            } else {
                retry_failed::Keys::Keep
            };
            retry_failed::retry_failed(&db, &users, selection, keys, &mut out).await?
        }
    };
    out.flush()?;
    Ok(ExitCode::from(summary.exit_code()))
}
