//! Logging for every binary: human-readable lines on stderr (stdout is kept for command
//! output such as `relay status`), filtered by `RUST_LOG` (default `info`).

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; call once, first thing in `main`.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
