//! What the Student DB's own rows say: when each `create-user` row was written and when it
//! was done. Link latency comes from these timestamps, not from polling the API under load.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, ConnectionTrait as _, DatabaseConnection, DbBackend, EntityTrait, PaginatorTrait,
    QueryFilter, Select, Statement,
};
use serde::{Deserialize, Serialize};
use student_store::{
    effect::CREATE_USER,
    entity::outbox::{self, OutboxStatus},
};

use users_svc::entity::inbox;

use crate::stats::{Latency, ratio};

/// How the rows written since a moment were delivered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Links {
    pub rows: usize,
    /// Row written → row done (relay claimed it, Users answered, link committed).
    pub latency: Latency,
    /// Rows done per second, from the first row written to the last one done.
    pub per_second: f64,
}

/// One run and its rows: written since `since`, with keys made from `id` (see
/// [`crate::load::key_prefix`]), so other traffic on a running system is left out.
#[derive(Debug, Clone)]
pub struct RunRows {
    /// Unique per run, so runs never collide on document numbers or keys.
    pub id: String,
    pub since: DateTime<Utc>,
}

impl RunRows {
    /// A new run, from now on.
    pub fn start() -> Self {
        Self {
            id: new_run_id(),
            since: platform::db::now(),
        }
    }

    fn key_prefix(&self) -> String {
        crate::load::key_prefix(&self.id)
    }
}

/// A new run's id: eight hex digits, unique per run, so runs never collide on document
/// numbers or keys (a running system may have seen earlier runs).
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// Waits until `expected` create-user rows of `run` are done, printing progress; fails
/// after `timeout`.
pub async fn wait_until_done(
    db: &DatabaseConnection,
    run: &RunRows,
    expected: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_print = Instant::now();
    loop {
        let done = done_rows_of(run).count(db).await? as usize;
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

/// The create-user rows of `run` that are done.
fn done_rows_of(run: &RunRows) -> Select<outbox::Entity> {
    outbox::Entity::find()
        .filter(outbox::Column::EffectType.eq(CREATE_USER))
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .filter(outbox::Column::CreatedAt.gte(run.since))
        .filter(outbox::Column::ClientKey.starts_with(run.key_prefix()))
}

/// Reads the create-user rows of `run` that are done, for [`links`] and [`stages`].
pub async fn done_rows(
    db: &DatabaseConnection,
    run: &RunRows,
) -> anyhow::Result<Vec<outbox::Model>> {
    Ok(done_rows_of(run).all(db).await?)
}

/// Link latency and rate of `rows` (see [`done_rows`]), measured from `from` (the first
/// write, or when the relays started for a backlog) to the last done.
pub fn links(rows: &[outbox::Model], from: Option<DateTime<Utc>>) -> Links {
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
    Links {
        rows: rows.len(),
        latency: Latency::of(latencies),
        per_second: ratio(rows.len() as f64, seconds),
    }
}

/// Where link latency goes, row by row, split at the moment Users saved the user (its
/// inbox row's `created_at`, taken before its transaction commits; one machine, one clock).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stages {
    /// Row written → Users saving the user: CreateStudent's commit, the wake-up, the
    /// claim, the call.
    pub to_users: Latency,
    /// Users saving the user → row done: Users' commit, the answer, the wait for the
    /// finalize (its own commit is not counted: `processed_at` is taken before it).
    pub after_users: Latency,
}

impl std::fmt::Display for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "written → Users saved {}; Users saved → done {}",
            self.to_users, self.after_users
        )
    }
}

/// The two stages of each of `rows` (see [`done_rows`]), matched with the Users inbox row
/// of its idempotency key; Users' rows are read from `since` on.
pub async fn stages(
    rows: &[outbox::Model],
    users: &DatabaseConnection,
    since: DateTime<Utc>,
) -> anyhow::Result<Stages> {
    let saved: HashMap<String, DateTime<Utc>> = inbox::Entity::find()
        .filter(inbox::Column::CreatedAt.gte(since))
        .all(users)
        .await?
        .into_iter()
        .map(|row| (row.idempotency_key, row.created_at))
        .collect();
    let (mut to_users, mut after_users) = (Vec::new(), Vec::new());
    for row in rows {
        if let (Some(saved_at), Some(done_at)) = (saved.get(&row.idempotency_key), row.processed_at)
        {
            to_users.extend((*saved_at - row.created_at).to_std().ok());
            after_users.extend((done_at - *saved_at).to_std().ok());
        }
    }
    Ok(Stages {
        to_users: Latency::of(to_users),
        after_users: Latency::of(after_users),
    })
}

/// How many students each CreateStudent transaction of `run` wrote on average
/// (student-svc's group commit writes waiting requests together): PostgreSQL marks each
/// row with the transaction that wrote it (`xmin`). `None` on SQLite, which keeps no such
/// mark.
pub async fn students_per_commit(
    db: &DatabaseConnection,
    run: &RunRows,
) -> anyhow::Result<Option<f64>> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT count(*)::float8 / greatest(count(DISTINCT xmin::text), 1) AS mean \
             FROM students WHERE created_at >= $1 AND starts_with(client_key, $2)",
            [run.since.into(), run.key_prefix().into()],
        ))
        .await?;
    Ok(row.map(|row| row.try_get::<f64>("", "mean")).transpose()?)
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use uuid::Uuid;

    use super::*;

    fn row(created_ms: i64, done_ms: i64, at: DateTime<Utc>) -> outbox::Model {
        outbox::Model {
            id: created_ms,
            aggregate_id: Uuid::now_v7(),
            aggregate_version: 1,
            effect_type: CREATE_USER.into(),
            payload: serde_json::json!({}),
            idempotency_key: format!("k{created_ms}"),
            status: OutboxStatus::Done,
            attempts: 1,
            last_error: None,
            available_at: at,
            locked_until: None,
            locked_by: None,
            created_at: at + TimeDelta::milliseconds(created_ms),
            processed_at: Some(at + TimeDelta::milliseconds(done_ms)),
            result: None,
            failure_kind: None,
            error_code: None,
            client_key: None,
            request_hash: None,
            key_created_at: None,
            traceparent: None,
        }
    }

    /// Rows done per second count from the first row written (or from `from`, when the
    /// relays started on a backlog) to the last one done.
    #[test]
    fn links_per_second_run_from_the_first_write_to_the_last_done() {
        let at = Utc::now();
        let rows = [
            row(0, 500, at),
            row(1_000, 1_500, at),
            row(2_000, 4_000, at),
        ];
        let links = links(&rows, None);
        assert_eq!(links.rows, 3);
        assert!(
            (links.per_second - 0.75).abs() < 1e-9,
            "{}",
            links.per_second
        );
        assert_eq!(
            (links.latency.p50_ms, links.latency.max_ms),
            (500.0, 2_000.0)
        );
        let from_a_start = super::links(&rows, Some(at - TimeDelta::seconds(1)));
        assert!(
            (from_a_start.per_second - 0.6).abs() < 1e-9,
            "{}",
            from_a_start.per_second
        );
    }
}
