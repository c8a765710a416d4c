use anyhow::Context as _;
use clap::Parser as _;
use student_svc::Config;

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    platform::runtime::build(config.worker_threads)
        .context("cannot start the runtime")?
        .block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let _log = platform::telemetry::init(config.log_format)?;
    let spans = platform::otlp::start("student-svc")?;
    let options = config.server_options()?;
    let link = config.link()?;
    let shutdown = platform::shutdown::on_signal()?;
    platform::metrics::serve_if_asked(config.metrics_addr, &shutdown).await?;
    student_svc::writer::describe();
    let db = student_svc::open_database(&config.database_url, config.db_max_connections).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(target: platform::telemetry::LISTENING_TARGET, addr = %listener.local_addr()?, tls = options.tls.is_some(), link_mode = ?config.link_mode, wake_relays = ?config.wake_relays, "student-svc listening");
    let served = student_svc::run(listener, db, options, link, config.wake_relays, shutdown).await;
    spans.stop().await;
    served
}
