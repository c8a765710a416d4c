//! Waiting for the Student DB at start-up: the relay may start before the database is
//! reachable and before student-svc has created the schema.

use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

/// Opens the Student DB once it is reachable and its schema is in place (student-svc
/// applies it), so the relay can start before the database and the service. Its
/// connections are set up for claiming ([`student_store::outbox::CLAIMING_SESSION`]).
/// Logs why it waits, again whenever the reason changes. Returns `None` if `shutdown`
/// came first.
pub async fn open_when_ready(
    url: &str,
    max_connections: u32,
    shutdown: &CancellationToken,
) -> Option<DatabaseConnection> {
    let mut last_reason = String::new();
    let mut connection = None;
    loop {
        let reason = match &connection {
            None => match platform::db::connect_with_settings(
                url,
                max_connections,
                student_store::outbox::CLAIMING_SESSION,
            )
            .await
            {
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
