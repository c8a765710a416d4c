//! `loadgen`: the tool behind every number in BENCHMARKS.md. It starts the three release
//! binaries itself on fresh databases (SQLite, or PostgreSQL through a maintenance URL),
//! drives CreateStudent, reads link latency from the rows' own timestamps, reads each
//! process's CPU time and peak memory, and measures the database-only ceiling in the same
//! run. `--json PATH` writes everything it printed.

mod ceiling;
mod claim_cost;
mod load;
mod replay_cost;
mod rows;
mod runs;
mod stats;
mod suite;
mod system;
mod targets;

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = suite::Cli::parse();
    let report = suite::execute(&cli).await?;
    if let Some(path) = cli.json.as_ref().filter(|_| !report.is_null()) {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
