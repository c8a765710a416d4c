//! The inbox's retention: entries older than `--inbox-retention` are deleted, in batches,
//! on a schedule inside the server and by `users-svc inbox purge`.
//!
//! Purging is what makes the horizon guard necessary (see `inbox::Mode::Expired`): once a
//! key's entry is gone, a late delivery of that key would look brand new. Callers that say
//! when they issued a key (`idempotency-key-created-at`) are refused instead of executed
//! twice, provided the clocks of the two sides disagree by far less than the retention.

use std::time::Duration;

use chrono::{DateTime, Utc};
use platform::retention::{batch_of, purge_older_than};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, DbErr, DeleteMany, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, QueryTrait,
};

use crate::entity::inbox;

/// Deletes every inbox entry older than `retention`; returns how many.
pub async fn purge_expired(db: &DatabaseConnection, retention: Duration) -> Result<u64, DbErr> {
    purge_older_than(db, retention, purge_batch).await
}

/// One batch of [`purge_expired`]: the `batch` oldest entries made before `horizon`, found
/// oldest first through `inbox_created_at`, in one short statement.
pub fn purge_batch(
    backend: DbBackend,
    horizon: DateTime<Utc>,
    batch: u64,
) -> DeleteMany<inbox::Entity> {
    let oldest = inbox::Entity::find()
        .select_only()
        .column(inbox::Column::IdempotencyKey)
        .filter(inbox::Column::CreatedAt.lt(horizon))
        .order_by_asc(inbox::Column::CreatedAt)
        .limit(batch)
        .into_query();
    inbox::Entity::delete_many().filter(batch_of(inbox::Column::IdempotencyKey, oldest, backend))
}

/// Warns when the inbox would forget keys a relay with default tuning may still be
/// retrying (short retentions are allowed: tests use seconds).
pub fn warn_if_shorter_than_retries(retention: Duration) {
    let window = platform::retention::RELAY_DEFAULT_RETRY_WINDOW;
    if retention < window {
        tracing::warn!(
            inbox_retention = %humantime::format_duration(retention),
            relay_retry_window = %humantime::format_duration(window),
            "the inbox retention is shorter than a relay's default retry window: late \
             deliveries of purged keys will be refused as DELIVERY_EXPIRED"
        );
    }
}
