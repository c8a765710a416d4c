use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _, parser::ValueSource};
use users_svc::{Command, Config, InboxCommand};

fn main() -> anyhow::Result<ExitCode> {
    let matches = Config::command().get_matches();
    let config = Config::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    // Whether the retention was stated (flag or variable), not taken from the default.
    let retention_stated =
        matches.value_source("inbox_retention") != Some(ValueSource::DefaultValue);
    let runtime =
        platform::runtime::build(config.worker_threads).context("cannot start the runtime");
    if let Some(Command::Inbox { action }) = &config.command {
        return Ok(one_shot(runtime.and_then(|runtime| {
            runtime.block_on(async {
                let _log = platform::telemetry::init(config.log_format)?;
                inbox(&config, action, retention_stated).await
            })
        })));
    }
    runtime?.block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<ExitCode> {
    let _log = platform::telemetry::init(config.log_format)?;
    let spans = platform::otlp::start("users-svc")?;
    let options = config.server_options()?;
    let auth_tokens = config.auth_tokens()?;
    let shutdown = platform::shutdown::on_signal()?;
    platform::metrics::serve_if_asked(config.metrics_addr, &shutdown).await?;
    users_svc::metrics::describe();
    let db = users_svc::open_database(&config.database_url, config.db_max_connections).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(target: platform::telemetry::LISTENING_TARGET, addr = %listener.local_addr()?, tls = options.tls.is_some(), tokens = auth_tokens.as_ref().map_or(0, |t| t.count()), "users-svc listening");
    let served = users_svc::run(listener, db, options, auth_tokens, config.inbox(), shutdown).await;
    spans.stop().await;
    served.map(|()| ExitCode::SUCCESS)
}

/// A one-shot command's exit code, as the relay's: 0 done, 1 the answer is no (set by
/// the command), 2 it could not do its work (its runtime not starting included). The
/// server's errors exit 1, as student-svc's.
fn one_shot(result: anyhow::Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|err| {
        eprintln!("error: {err:#}");
        ExitCode::from(2)
    })
}

async fn inbox(
    config: &Config,
    action: &InboxCommand,
    retention_stated: bool,
) -> anyhow::Result<ExitCode> {
    match action {
        InboxCommand::Show { key } => show_inbox_entry(&config.database_url, key).await,
        // The servers judge a key's age by their own retention: a purge by a shorter one
        // deletes keys they would execute again if delivered late. A shell without the
        // servers' USERS_INBOX_RETENTION would get the default, so it must be stated.
        InboxCommand::Purge if !retention_stated => anyhow::bail!(
            "inbox purge needs the servers' retention: give it with --inbox-retention or \
             USERS_INBOX_RETENTION (the default, 30d, is not assumed: a purge shorter than \
             the servers' deletes keys they would run again)"
        ),
        InboxCommand::Purge => purge_inbox(&config.database_url, config.inbox_retention).await,
    }
}

/// `users-svc inbox show --key KEY`, on a database that already has its schema (a
/// one-shot command never migrates).
async fn show_inbox_entry(database_url: &str, key: &str) -> anyhow::Result<ExitCode> {
    let db = migrations::open_existing::<migrations::users::Migrator>(database_url).await?;
    let mut out = std::io::stdout().lock();
    if users_svc::inspect::show_inbox_entry(&db, key, &mut out).await? {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("no inbox entry for key {key}");
        Ok(ExitCode::from(1))
    }
}

/// `users-svc inbox purge`: deletes the entries older than the retention now.
async fn purge_inbox(
    database_url: &str,
    retention: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let db = migrations::open_existing::<migrations::users::Migrator>(database_url).await?;
    let purged = users_svc::retention::purge_expired(&db, retention).await?;
    println!("purged={purged}");
    Ok(ExitCode::SUCCESS)
}
