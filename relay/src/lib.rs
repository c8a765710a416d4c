//! The relay: delivers the Student DB's outbox to the Users service. It reads `pending`
//! rows, calls `CreateUser` with each row's stored idempotency key (never holding a
//! transaction open across the call), then links the returned user to the student and
//! marks the row `done` in one Student-DB transaction. It also replays past deliveries
//! (`relay replay`) and reports the outbox (`relay status`).
//!
//! The relay is part of Student's side: it reads and writes the Student DB and talks to
//! Users only over gRPC.

mod backoff;
pub mod classify;
pub mod cli;
mod config;
mod deliver;
pub mod replay;
pub mod retry_failed;
pub mod status;
pub mod store;
pub mod users_client;
pub mod wakeup;

use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

pub use config::RunConfig;
pub use deliver::{BatchOutcome, Relay};

/// Opens the Student DB once it is reachable and its schema is in place (student-svc
/// applies it), so the relay can start before the database and the service. Logs why it
/// waits, again whenever the reason changes. Returns `None` if `shutdown` came first.
pub async fn open_when_ready(
    url: &str,
    shutdown: &CancellationToken,
) -> Option<DatabaseConnection> {
    let mut last_reason = String::new();
    let mut connection = None;
    loop {
        let reason = match &connection {
            None => match platform::db::connect(url).await {
                Ok(db) => {
                    connection = Some(db);
                    continue;
                }
                // A wrong password or host waits here too: say so, not just "waiting".
                Err(err) => format!("the Student DB is not reachable: {err:#}"),
            },
            Some(db) => match migrations::is_current::<migrations::student::Migrator>(db).await {
                Ok(true) => return connection,
                Ok(false) => "student-svc has not created the Student DB schema yet".to_owned(),
                Err(err) => format!("cannot read the Student DB schema version: {err}"),
            },
        };
        if reason != last_reason {
            tracing::info!(%reason, "waiting for the Student DB");
            last_reason = reason;
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}
