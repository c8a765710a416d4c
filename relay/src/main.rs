use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    platform::telemetry::init();
    relay::cli::execute(relay::cli::Cli::parse()).await
}
