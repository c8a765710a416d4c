use anyhow::Context as _;
use clap::Parser as _;
use users_svc::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    platform::telemetry::init();
    let config = Config::parse();
    let options = config.server_options()?;
    let auth_token = config.auth_token()?;
    let shutdown = platform::shutdown::on_signal()?;
    let db = users_svc::open_database(&config.database_url).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(addr = %listener.local_addr()?, tls = options.tls.is_some(), "users-svc listening");
    users_svc::run(listener, db, options, auth_token, shutdown).await
}
