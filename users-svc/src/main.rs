use anyhow::Context as _;
use clap::Parser as _;
use users_svc::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    platform::telemetry::init();
    let config = Config::parse();
    let options = config.server_options()?;
    let auth_tokens = config.auth_tokens()?;
    let shutdown = platform::shutdown::on_signal()?;
    let db = users_svc::open_database(&config.database_url, config.db_max_connections).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(addr = %listener.local_addr()?, tls = options.tls.is_some(), tokens = auth_tokens.as_ref().map_or(0, |t| t.count()), "users-svc listening");
    users_svc::run(listener, db, options, auth_tokens, shutdown).await
}
