//! How a relay learns that new rows are due: PostgreSQL `LISTEN` (student-svc `NOTIFY`s in
//! the transaction that writes a row), with polling as the fallback and the only way on
//! SQLite.
//!
//! The listener runs on a task of its own and turns each notification into a permit of a
//! [`Notify`]: a notification that arrives while the relay is busy is kept, not lost, and
//! the next wait returns at once. Waiting is cancel-safe, so the delivery loop can wait
//! for "a call finished, or a row was notified, or the poll interval passed" in one
//! `select!`.

use std::{sync::Arc, time::Duration};

use sea_orm::sqlx::postgres::PgListener;
use student_store::OUTBOX_CHANNEL;
use tokio::sync::Notify;

/// Wake-ups for one relay.
pub struct Wakeup {
    notified: Arc<Notify>,
    listener: Option<tokio::task::JoinHandle<()>>,
}

impl Wakeup {
    /// LISTENs on PostgreSQL; only polls on SQLite, or when LISTEN cannot be set up
    /// (logged).
    pub async fn for_database(url: &str) -> Self {
        let notified = Arc::new(Notify::new());
        if platform::db::is_sqlite(url) {
            return Self {
                notified,
                listener: None,
            };
        }
        let listener = async {
            let mut listener = PgListener::connect(url).await?;
            listener.listen(OUTBOX_CHANNEL).await?;
            Ok::<_, sea_orm::sqlx::Error>(listener)
        };
        match listener.await {
            Ok(listener) => Self {
                listener: Some(tokio::spawn(forward(listener, notified.clone()))),
                notified,
            },
            Err(err) => {
                tracing::warn!(error = %err, "cannot LISTEN; polling only");
                Self {
                    notified,
                    listener: None,
                }
            }
        }
    }

    /// Tells whether notifications arrive (PostgreSQL) or only the poll interval wakes.
    pub fn is_listening(&self) -> bool {
        self.listener.is_some()
    }

    /// Returns once a row was notified since the last return (at once if one was while
    /// the relay was busy). Cancel-safe.
    pub async fn notified(&self) {
        self.notified.notified().await;
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

/// Turns notifications into permits until the relay stops.
async fn forward(mut listener: PgListener, notified: Arc<Notify>) {
    loop {
        match listener.recv().await {
            Ok(_) => {
                // Several notifications before the relay looks are one reason to claim.
                while listener.next_buffered().is_some() {}
                notified.notify_one();
            }
            Err(err) => {
                // The listener reconnects on its next recv; meanwhile polling covers, and
                // rows committed during the gap are claimed at the next wake-up. This
                // pause keeps a broken connection from spinning.
                tracing::warn!(error = %err, "LISTEN connection lost");
                notified.notify_one();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
