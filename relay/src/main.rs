use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = relay::cli::Cli::parse();
    platform::telemetry::init(cli.log_format);
    relay::cli::execute(cli).await
}
