//! What the Student DB's own rows say: when each `create-user` row was written and when it
//! was done. Link latency comes from these timestamps, not from polling the API under load.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, ConnectionTrait as _, DatabaseConnection, DbBackend, EntityTrait, PaginatorTrait,
    QueryFilter, Statement,
};
use serde::Serialize;
use student_store::{
    effect::CREATE_USER,
    entity::outbox::{self, OutboxStatus},
};

use crate::stats::{Latency, ratio};

/// How the rows written since a moment were delivered.
#[derive(Debug, Clone, Serialize)]
pub struct Links {
    pub rows: usize,
    /// Row written → row done (relay claimed it, Users answered, link committed).
    pub latency: Latency,
    /// Rows done per second, from the first row written to the last one done.
    pub per_second: f64,
}

/// Waits until `expected` create-user rows written since `since` are done, printing
/// progress; fails after `timeout`.
pub async fn wait_until_done(
    db: &DatabaseConnection,
    since: DateTime<Utc>,
    expected: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_print = Instant::now();
    loop {
        let done = outbox::Entity::find()
            .filter(outbox::Column::EffectType.eq(CREATE_USER))
            .filter(outbox::Column::Status.eq(OutboxStatus::Done))
            .filter(outbox::Column::CreatedAt.gte(since))
            .count(db)
            .await? as usize;
        if done >= expected {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {done} of {expected} rows done within {timeout:?}"
        );
        if last_print.elapsed() > Duration::from_secs(2) {
            eprintln!("  … linked {done}/{expected}");
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Link latency and rate of the create-user rows written since `since`, measured from
/// `from` (the first write, or when the relays started for a backlog) to the last done.
pub async fn links(
    db: &DatabaseConnection,
    since: DateTime<Utc>,
    from: Option<DateTime<Utc>>,
) -> anyhow::Result<Links> {
    let rows = outbox::Entity::find()
        .filter(outbox::Column::EffectType.eq(CREATE_USER))
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .filter(outbox::Column::CreatedAt.gte(since))
        .all(db)
        .await?;
    let latencies: Vec<Duration> = rows
        .iter()
        .filter_map(|row| (row.processed_at? - row.created_at).to_std().ok())
        .collect();
    let first = from.or_else(|| rows.iter().map(|row| row.created_at).min());
    let last = rows.iter().filter_map(|row| row.processed_at).max();
    let seconds = match (first, last) {
        (Some(first), Some(last)) => (last - first).to_std().unwrap_or_default().as_secs_f64(),
        _ => 0.0,
    };
    Ok(Links {
        rows: rows.len(),
        latency: Latency::of(latencies),
        per_second: ratio(rows.len() as f64, seconds),
    })
}

/// How many students each CreateStudent transaction wrote on average, since `since`
/// (student-svc's group commit writes waiting requests together): PostgreSQL marks each
/// row with the transaction that wrote it (`xmin`). `None` on SQLite, which keeps no such
/// mark.
pub async fn students_per_commit(
    db: &DatabaseConnection,
    since: DateTime<Utc>,
) -> anyhow::Result<Option<f64>> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT count(*)::float8 / greatest(count(DISTINCT xmin::text), 1) AS mean \
             FROM students WHERE created_at >= $1",
            [since.into()],
        ))
        .await?;
    Ok(row.map(|row| row.try_get::<f64>("", "mean")).transpose()?)
}
