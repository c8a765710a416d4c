//! The `loadgen` command line (see the library's documentation and BENCHMARKS.md).

use clap::Parser as _;
use loadgen::suite;

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
