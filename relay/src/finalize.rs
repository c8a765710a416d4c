//! Group commit of finished deliveries: rows Users has answered are recorded many to one
//! transaction (one statement for the batch on PostgreSQL, two on SQLite, see
//! `student_store::outbox::record_deliveries`) instead of one transaction each. Every
//! commit is a disk sync (SQLite `FULL`, PostgreSQL's WAL flush); answers that arrive
//! while one batch commits form the next, so the batch grows with the load and a lone
//! answer is recorded at once.

use platform::group_commit::GroupCommit;
use sea_orm::{DatabaseConnection, DbErr};
use student_store::{
    entity::outbox as outbox_row,
    outbox::{self, Delivered, RecordError},
};

/// Most rows recorded in one transaction.
const MAX_BATCH: usize = 64;

/// A handle to the task that records answered rows in batches.
#[derive(Clone)]
pub(crate) struct Finalizer {
    writer: GroupCommit<(outbox_row::Model, Delivered), Result<(), RecordError>>,
}

impl Finalizer {
    /// Starts the recording task for `relay_id`; it ends once every handle is dropped and
    /// the queue is empty.
    pub(crate) fn start(db: DatabaseConnection, relay_id: String) -> Self {
        // One writer: a second would only contend for the same rows' student locks.
        let writer = GroupCommit::start(1, MAX_BATCH, move |deliveries| {
            let (db, relay_id) = (db.clone(), relay_id.clone());
            async move { record_batch(&db, &relay_id, deliveries).await }
        });
        Self { writer }
    }

    /// Records `row` as delivered, with the rows answered around the same time; returns
    /// once its batch has committed (or failed).
    pub(crate) async fn record(
        &self,
        row: &outbox_row::Model,
        delivered: Delivered,
    ) -> Result<(), RecordError> {
        self.writer
            .submit((row.clone(), delivered))
            .await
            .unwrap_or_else(|| Err(stopped()))
    }
}

/// Records one batch in one transaction: each row's own result, in order.
async fn record_batch(
    db: &DatabaseConnection,
    relay_id: &str,
    deliveries: Vec<(outbox_row::Model, Delivered)>,
) -> Vec<Result<(), RecordError>> {
    match outbox::record_deliveries(db, relay_id, &deliveries).await {
        Ok(recorded) => {
            crate::metrics::finalize_batch(recorded.path);
            recorded.results
        }
        Err(err) => {
            // Nothing of the batch was recorded: every row keeps its lease and is
            // delivered again once it runs out (Users answers from its inbox).
            let message = err.to_string();
            deliveries
                .iter()
                .map(|_| Err(RecordError::Db(DbErr::Custom(message.clone()))))
                .collect()
        }
    }
}

fn stopped() -> RecordError {
    RecordError::Db(DbErr::Custom(
        "not recorded: the relay is stopping, or its batch failed".into(),
    ))
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::test_rows::row;

    /// A batch the database refuses records nothing, and every row of it says so: none
    /// may be logged or counted as delivered and linked (each keeps its lease and is
    /// delivered again once it runs out).
    #[tokio::test]
    async fn a_failed_batch_reports_every_row_unrecorded() {
        // No schema: the batch's statement fails.
        let db = platform::db::connect("sqlite::memory:")
            .await
            .expect("connect");
        let deliveries = vec![
            (row(1, 1), Delivered::UserCreated(Uuid::now_v7())),
            (row(2, 1), Delivered::UserCreated(Uuid::now_v7())),
        ];
        let results = record_batch(&db, "relay-test", deliveries).await;
        assert_eq!(results.len(), 2);
        for result in results {
            assert!(matches!(result, Err(RecordError::Db(_))), "{result:?}");
        }
    }
}
