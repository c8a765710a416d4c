//! The delivery loop: claim due outbox rows, send each to Users with its stored key, record
//! the answer. Delivery is at-least-once; Users' inbox makes the effect exactly-once.

use futures::StreamExt as _;
use platform::failpoint::{self, points};
use sea_orm::DatabaseConnection;
use student_svc::entity::outbox::{self, CreateUserPayload, FailureKind};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    RunConfig,
    backoff::{exponential_ceiling, retry_delay},
    classify::{Failure, classify, code_name},
    store::{self, RecordError},
    users_client::UsersClient,
    wakeup::Wakeup,
};

/// What one [`Relay::deliver_batch`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows delivered and linked.
    pub delivered: usize,
    /// Rows given back for a later attempt.
    pub retried: usize,
    /// Rows marked `failed`.
    pub failed: usize,
    /// Rows handed back unsent because the relay is shutting down.
    pub released: usize,
}

/// The relay: a Student DB, a Users client, its tuning and its identity in leases.
pub struct Relay {
    pub db: DatabaseConnection,
    pub users: UsersClient,
    pub config: RunConfig,
    /// Written to `locked_by`: which relay holds a row.
    pub id: String,
}

impl Relay {
    /// Creates a relay with a fresh identity (`relay-<pid>-<random>`).
    pub fn new(db: DatabaseConnection, users: UsersClient, config: RunConfig) -> Self {
        let random = Uuid::new_v4().simple().to_string();
        Self {
            db,
            users,
            config,
            id: format!("relay-{}-{}", std::process::id(), &random[..8]),
        }
    }

    /// Claims one batch of due rows and delivers them, up to `concurrency` at a time.
    /// Tests drive this step directly; [`Relay::run`] loops around it.
    pub async fn deliver_batch(&self) -> anyhow::Result<BatchOutcome> {
        self.deliver_batch_until(&CancellationToken::new()).await
    }

    /// Like [`Relay::deliver_batch`]; once `shutdown` is cancelled, rows not yet sent are
    /// released instead, while calls already in flight finish (each within its deadline).
    pub async fn deliver_batch_until(
        &self,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<BatchOutcome> {
        let rows = store::claim_batch(
            &self.db,
            &self.id,
            u32::from(self.config.batch_size),
            self.config.lease,
        )
        .await?;
        let mut outcome = BatchOutcome {
            claimed: rows.len(),
            ..BatchOutcome::default()
        };
        if rows.is_empty() {
            return Ok(outcome);
        }
        failpoint::hit(points::RELAY_AFTER_CLAIM).await;
        let results: Vec<_> = futures::stream::iter(rows)
            .map(|row| async move {
                if shutdown.is_cancelled() {
                    return Ok((Delivery::Unsent, row.id));
                }
                let id = row.id;
                self.deliver(row).await.map(|delivery| (delivery, id))
            })
            .buffer_unordered(usize::from(self.config.concurrency))
            .collect()
            .await;
        let mut unsent = Vec::new();
        let mut first_error = None;
        for result in results {
            match result {
                Ok((Delivery::Delivered, _)) => outcome.delivered += 1,
                Ok((Delivery::Retried, _)) => outcome.retried += 1,
                Ok((Delivery::Failed, _)) => outcome.failed += 1,
                Ok((Delivery::Unsent, id)) => unsent.push(id),
                // A row whose outcome could not be recorded keeps its lease; it is claimed
                // again when the lease runs out.
                Err(err) => first_error = first_error.or(Some(err)),
            }
        }
        if !unsent.is_empty() {
            outcome.released =
                usize::try_from(store::release(&self.db, &unsent, &self.id).await?).unwrap_or(0);
            tracing::info!(
                released = outcome.released,
                "released unsent rows for other relays"
            );
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(outcome),
        }
    }

    /// Runs batches until `shutdown` is cancelled: back to back while there is work; when
    /// idle, until woken (PostgreSQL `NOTIFY`) or the poll interval passes; with growing
    /// pauses while the database fails, so errors never spin.
    pub async fn run(&self, mut wakeup: Wakeup, shutdown: CancellationToken) {
        let mut consecutive_errors = 0u32;
        while !shutdown.is_cancelled() {
            // The batch runs outside the select!, so shutdown never abandons a half-done
            // transaction: it stops new sends and releases what was not sent.
            let pause = match self.deliver_batch_until(&shutdown).await {
                Ok(outcome) => {
                    consecutive_errors = 0;
                    if outcome.claimed == usize::from(self.config.batch_size) {
                        continue;
                    }
                    None
                }
                Err(err) => {
                    consecutive_errors += 1;
                    let pause = exponential_ceiling(
                        consecutive_errors,
                        self.config.poll_interval,
                        self.config.backoff_max,
                    );
                    tracing::warn!(error = format!("{err:#}"), retry_in = ?pause, "delivery batch failed");
                    Some(pause)
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = async {
                    match pause {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => wakeup.wait(self.config.poll_interval).await,
                    }
                } => {}
            }
        }
        tracing::info!(relay = %self.id, "relay stopped");
    }

    async fn deliver(&self, row: outbox::Model) -> anyhow::Result<Delivery> {
        let payload: CreateUserPayload = match serde_json::from_value(row.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                // No attempt can ever send this row: fail it visibly instead of looping. The
                // decode error is not logged: it may quote the payload's personal data.
                tracing::error!(
                    outbox_id = row.id,
                    line = err.line(),
                    column = err.column(),
                    "unreadable outbox payload"
                );
                let reason = "UNREADABLE_PAYLOAD: the stored payload cannot be decoded";
                store::record_failure(&self.db, &row, &self.id, FailureKind::Rejected, reason)
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
        failpoint::hit(points::RELAY_BEFORE_FINALIZE).await;
        match store::record_delivery(&self.db, &row, user_id).await {
            Ok(()) => {
                tracing::info!(
                    outbox_id = row.id,
                    student_id = %row.aggregate_id,
                    %user_id,
                    from_inbox = created.from_inbox,
                    attempts = row.attempts,
                    "delivered and linked"
                );
                Ok(Delivery::Delivered)
            }
            Err(err @ (RecordError::LinkConflict { .. } | RecordError::StudentMissing(_))) => {
                tracing::error!(outbox_id = row.id, error = %err, "cannot link the user");
                let reason = format!("LINK_CONFLICT: {err}");
                store::record_failure(&self.db, &row, &self.id, FailureKind::Rejected, &reason)
                    .await?;
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
        let code = code_name(status.code());
        // A reason and a readable message, never transport internals: the `ErrorInfo`
        // reason when Users gave one (`DOCUMENT_NUMBER_TAKEN: …`), else the code.
        let reason = platform::status::reason(status).unwrap_or_else(|| code.to_owned());
        let error = format!("{reason}: {}", status.message());
        let attempts = u32::try_from(row.attempts).unwrap_or(0);
        match classify(status) {
            Failure::Permanent => {
                tracing::warn!(outbox_id = row.id, student_id = %row.aggregate_id, code, "rejected by Users, marked failed");
                store::record_failure(&self.db, row, &self.id, FailureKind::Rejected, &error)
                    .await?;
                Ok(Delivery::Failed)
            }
            Failure::Transient if attempts >= self.config.max_attempts => {
                tracing::error!(
                    outbox_id = row.id,
                    attempts,
                    code,
                    "attempts exhausted, marked failed"
                );
                let error = format!("EXHAUSTED after {attempts} attempts, last {error}");
                store::record_failure(&self.db, row, &self.id, FailureKind::Exhausted, &error)
                    .await?;
                Ok(Delivery::Failed)
            }
            Failure::Transient => {
                let delay =
                    retry_delay(attempts, self.config.backoff_base, self.config.backoff_max);
                tracing::warn!(outbox_id = row.id, attempts, code, retry_in = ?delay, "delivery failed, will retry");
                store::record_retry(&self.db, row, &self.id, &error, delay).await?;
                Ok(Delivery::Retried)
            }
        }
    }
}

enum Delivery {
    Delivered,
    Retried,
    Failed,
    Unsent,
}
