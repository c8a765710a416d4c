//! Turning SIGINT (Ctrl-C) and SIGTERM into one cancellation token that every task watches.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Returns a token that is cancelled on the first SIGINT or SIGTERM.
pub fn on_signal() -> anyhow::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        tracing::info!(signal = name, "shutting down");
        cancel.cancel();
    });
    Ok(token)
}
