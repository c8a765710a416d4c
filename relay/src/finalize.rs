//! Group commit of finished deliveries: rows Users has answered are recorded many to one
//! transaction (two statements for the batch, see `student_store::outbox::record_deliveries`)
//! instead of one transaction each. Every commit is a disk sync (SQLite `FULL`, PostgreSQL's WAL
//! flush); answers that arrive while one batch commits form the next, so the batch grows
//! with the load and a lone answer is recorded at once.

use sea_orm::{DatabaseConnection, DbErr};
use student_store::{
    entity::outbox as outbox_row,
    outbox::{self, Delivered, RecordError},
};
use tokio::sync::{mpsc, oneshot};

/// Most rows recorded in one transaction.
const MAX_BATCH: usize = 64;

/// One answered row waiting to be recorded, and who waits for the result.
struct Pending {
    row: outbox_row::Model,
    delivered: Delivered,
    reply: oneshot::Sender<Result<(), RecordError>>,
}

/// A handle to the task that records answered rows in batches.
#[derive(Clone)]
pub(crate) struct Finalizer {
    queue: mpsc::Sender<Pending>,
}

impl Finalizer {
    /// Starts the recording task for `relay_id`; it ends once every handle is dropped and
    /// the queue is empty.
    pub(crate) fn start(
        db: DatabaseConnection,
        relay_id: String,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, pending) = mpsc::channel(4 * MAX_BATCH);
        let task = tokio::spawn(record_batches(db, relay_id, pending));
        (Self { queue }, task)
    }

    /// Records `row` as delivered, with the rows answered around the same time; returns
    /// once its batch has committed (or failed).
    pub(crate) async fn record(
        &self,
        row: &outbox_row::Model,
        delivered: Delivered,
    ) -> Result<(), RecordError> {
        let (reply, result) = oneshot::channel();
        let pending = Pending {
            row: row.clone(),
            delivered,
            reply,
        };
        if self.queue.send(pending).await.is_err() {
            return Err(stopped());
        }
        result.await.unwrap_or_else(|_| Err(stopped()))
    }
}

async fn record_batches(
    db: DatabaseConnection,
    relay_id: String,
    mut pending: mpsc::Receiver<Pending>,
) {
    while let Some(first) = pending.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match pending.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (deliveries, replies): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|pending| ((pending.row, pending.delivered), pending.reply))
            .unzip();
        match outbox::record_deliveries(&db, &relay_id, &deliveries).await {
            Ok(recorded) => {
                crate::metrics::finalize_batch(recorded.path);
                for (reply, result) in replies.into_iter().zip(recorded.results) {
                    let _ = reply.send(result);
                }
            }
            Err(err) => {
                // Nothing of the batch was recorded: every row keeps its lease and is
                // delivered again once it runs out (Users answers from its inbox).
                let message = err.to_string();
                for reply in replies {
                    let _ = reply.send(Err(RecordError::Db(DbErr::Custom(message.clone()))));
                }
            }
        }
    }
}

fn stopped() -> RecordError {
    RecordError::Db(DbErr::Custom("the relay is stopping".into()))
}
