use std::process::ExitCode;

use clap::Parser as _;

/// One thread: a relay mostly waits on Users and the database, and its tasks (the loop,
/// a delivery per row, the finalizer) hand work to each other all the time. On one
/// thread those hand-offs are plain function calls, not wake-ups of another thread: a
/// quarter less CPU per row and a 7 % faster drain on a 2-core box (BENCHMARKS-JOURNAL.md,
/// "One thread per relay"). One core bounds a relay (README, "One thread per relay", says
/// at how many rows a second); beyond that, run more relays.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = relay::cli::Cli::parse();
    let started = platform::telemetry::init(cli.log_format)
        .and_then(|log| Ok((log, platform::otlp::start("relay")?)));
    let (_log, spans) = match started {
        Ok(started) => started,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::from(2);
        }
    };
    let code = relay::cli::execute(cli).await;
    spans.stop().await;
    code
}
