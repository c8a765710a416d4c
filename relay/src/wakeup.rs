//! How an idle relay learns of new rows: PostgreSQL `LISTEN` (student-svc `NOTIFY`s in the
//! CreateStudent transaction), with polling as the fallback and the only way on SQLite.

use std::time::Duration;

use sea_orm::sqlx::postgres::PgListener;
use student_store::OUTBOX_CHANNEL;

/// Waits for the next reason to look for work.
pub enum Wakeup {
    /// Woken by `NOTIFY`, or by the poll interval, whichever comes first.
    Listen(PgListener),
    /// Woken by the poll interval only.
    Poll,
}

impl Wakeup {
    /// LISTENs on PostgreSQL; polls on SQLite, or when LISTEN cannot be set up (logged).
    pub async fn for_database(url: &str) -> Self {
        if platform::db::is_sqlite(url) {
            return Self::Poll;
        }
        let listener = async {
            let mut listener = PgListener::connect(url).await?;
            listener.listen(OUTBOX_CHANNEL).await?;
            Ok::<_, sea_orm::sqlx::Error>(listener)
        };
        match listener.await {
            Ok(listener) => Self::Listen(listener),
            Err(err) => {
                tracing::warn!(error = %err, "cannot LISTEN; polling only");
                Self::Poll
            }
        }
    }

    /// Returns on a notification or after `poll_interval`.
    pub async fn wait(&mut self, poll_interval: Duration) {
        match self {
            Self::Listen(listener) => {
                tokio::select! {
                    received = listener.recv() => {
                        // One batch serves every row notified so far.
                        while listener.next_buffered().is_some() {}
                        if let Err(err) = received {
                            // The listener reconnects on its next recv; until then polling
                            // covers, and this pause keeps a broken connection from spinning.
                            tracing::warn!(error = %err, "LISTEN connection lost");
                            tokio::time::sleep(poll_interval).await;
                        }
                    }
                    () = tokio::time::sleep(poll_interval) => {}
                }
            }
            Self::Poll => tokio::time::sleep(poll_interval).await,
        }
    }
}
