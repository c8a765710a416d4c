//! The delivery loop: read due outbox rows, send each to Users with its stored key, record
//! the answer. Delivery is at-least-once; Users' inbox makes the effect exactly-once.

use futures::StreamExt as _;
use platform::db::now;
use sea_orm::DatabaseConnection;
use student_svc::entity::outbox::{self, CreateUserPayload};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    RunConfig,
    backoff::{exponential_ceiling, retry_delay},
    classify::{Failure, classify, code_name},
    store::{self, RecordError},
    users_client::UsersClient,
};

/// What one [`deliver_batch`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Rows read for delivery.
    pub due: usize,
    /// Rows delivered and linked.
    pub delivered: usize,
    /// Rows put back for a later attempt.
    pub retried: usize,
    /// Rows marked `failed`.
    pub failed: usize,
}

/// The relay: a Student DB, a Users client, and its tuning.
pub struct Relay {
    pub db: DatabaseConnection,
    pub users: UsersClient,
    pub config: RunConfig,
}

impl Relay {
    /// Delivers one batch of due rows, up to `concurrency` at a time, and records each
    /// answer. Tests drive this step directly; [`Relay::run`] loops around it.
    pub async fn deliver_batch(&self) -> anyhow::Result<BatchOutcome> {
        let rows = store::due_rows(&self.db, u64::from(self.config.batch_size)).await?;
        let mut outcome = BatchOutcome {
            due: rows.len(),
            ..BatchOutcome::default()
        };
        let results: Vec<_> = futures::stream::iter(rows)
            .map(|row| self.deliver(row))
            .buffer_unordered(usize::from(self.config.concurrency))
            .collect()
            .await;
        for result in results {
            match result? {
                Delivery::Delivered => outcome.delivered += 1,
                Delivery::Retried => outcome.retried += 1,
                Delivery::Failed => outcome.failed += 1,
            }
        }
        Ok(outcome)
    }

    /// Runs batches until `shutdown` is cancelled: back to back while there is work, every
    /// `poll_interval` when idle, with growing pauses while the database fails.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut consecutive_errors = 0u32;
        while !shutdown.is_cancelled() {
            // The batch runs outside the select!, so shutdown never abandons a half-done
            // transaction; it is noticed between batches.
            let pause = match self.deliver_batch().await {
                Ok(outcome) => {
                    consecutive_errors = 0;
                    if outcome.due == usize::from(self.config.batch_size) {
                        continue;
                    }
                    self.config.poll_interval
                }
                Err(err) => {
                    consecutive_errors += 1;
                    let pause = exponential_ceiling(
                        consecutive_errors,
                        self.config.poll_interval,
                        self.config.backoff_max,
                    );
                    tracing::warn!(error = format!("{err:#}"), retry_in = ?pause, "delivery batch failed");
                    pause
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
        tracing::info!("relay stopped");
    }

    async fn deliver(&self, row: outbox::Model) -> anyhow::Result<Delivery> {
        let payload: CreateUserPayload = match serde_json::from_value(row.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                // No attempt can ever send this row: fail it visibly instead of looping.
                tracing::error!(outbox_id = row.id, error = %err, "unreadable outbox payload");
                store::record_failure(
                    &self.db,
                    &row,
                    "UNREADABLE_PAYLOAD: the stored payload cannot be decoded",
                )
                .await?;
                return Ok(Delivery::Failed);
            }
        };
        let answer = self
            .users
            .create_user(&row.idempotency_key, &payload, false)
            .await;
        let created = match answer {
            Ok(created) => created,
            Err(status) => return self.record_error(&row, &status).await,
        };
        let Ok(user_id) = Uuid::try_parse(&created.user_id) else {
            let status = tonic::Status::internal("Users returned a malformed user_id");
            return self.record_error(&row, &status).await;
        };
        match store::record_delivery(&self.db, &row, user_id).await {
            Ok(()) => {
                tracing::info!(
                    outbox_id = row.id,
                    student_id = %row.aggregate_id,
                    %user_id,
                    from_inbox = created.from_inbox,
                    "delivered and linked"
                );
                Ok(Delivery::Delivered)
            }
            Err(err @ (RecordError::LinkConflict { .. } | RecordError::StudentMissing(_))) => {
                tracing::error!(outbox_id = row.id, error = %err, "cannot link the user");
                store::record_failure(&self.db, &row, &format!("LINK_CONFLICT: {err}")).await?;
                Ok(Delivery::Failed)
            }
            Err(RecordError::Db(err)) => Err(err.into()),
        }
    }

    async fn record_error(
        &self,
        row: &outbox::Model,
        status: &tonic::Status,
    ) -> anyhow::Result<Delivery> {
        let error = format!("{}: {}", code_name(status.code()), status.message());
        match classify(status) {
            Failure::Permanent => {
                tracing::warn!(outbox_id = row.id, student_id = %row.aggregate_id, code = code_name(status.code()), "rejected by Users, marked failed");
                store::record_failure(&self.db, row, &error).await?;
                Ok(Delivery::Failed)
            }
            Failure::Transient => {
                let attempts = u32::try_from(row.attempts).unwrap_or(0).saturating_add(1);
                let delay =
                    retry_delay(attempts, self.config.backoff_base, self.config.backoff_max);
                tracing::warn!(outbox_id = row.id, attempts, code = code_name(status.code()), retry_in = ?delay, "delivery failed, will retry");
                let available_at = now() + chrono::Duration::from_std(delay).unwrap_or_default();
                store::record_retry(&self.db, row, &error, available_at).await?;
                Ok(Delivery::Retried)
            }
        }
    }
}

enum Delivery {
    Delivered,
    Retried,
    Failed,
}
