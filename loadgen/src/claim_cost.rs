//! What one claim costs as the `done` history grows: `done` rows first (low ids), then the
//! rows still to deliver, then claims of 64 timed one by one (each released again, so every
//! claim sees the same rows): right after the backlog arrived, with statistics from when
//! only `done` rows existed (as after an outage of Users); then with fresh statistics; then
//! without the claim's index.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};
use serde::Serialize;
use student_store::outbox;

use crate::{
    stats::Latency,
    system::{Backend, Databases},
};

/// Claim times with stale and fresh statistics, and without the `outbox_claimable` index.
#[derive(Debug, Clone, Serialize)]
pub struct ClaimCost {
    pub done_rows: u64,
    pub pending_rows: u64,
    /// Statistics gathered before the due rows were written: the planner believes the
    /// outbox holds nothing to deliver.
    pub after_quiet_spell: Latency,
    pub with_index: Latency,
    pub without_index: Latency,
}

/// Fills a fresh Student DB with `done` done rows, gathers statistics, writes `pending` due
/// rows, then times `claims` claims of 64 before and after statistics are gathered again,
/// and without the index.
pub async fn measure(
    backend: &Backend,
    done: u64,
    pending: u64,
    claims: usize,
) -> anyhow::Result<ClaimCost> {
    let databases = Databases::create(backend).await?;
    let db = migrations::open::<migrations::student::Migrator>(&databases.student_url, 4).await?;
    eprintln!("  writing {done} done and {pending} pending rows …");
    fill(&db, "done", 0, done).await?;
    analyze(&db).await?;
    fill(&db, "pending", done, pending).await?;
    let after_quiet_spell = time_claims(&db, claims).await?;
    analyze(&db).await?;
    let with_index = time_claims(&db, claims).await?;
    db.execute_unprepared("DROP INDEX outbox_claimable").await?;
    analyze(&db).await?;
    let without_index = time_claims(&db, claims).await?;
    db.close().await.ok();
    databases.remove().await;
    Ok(ClaimCost {
        done_rows: done,
        pending_rows: pending,
        after_quiet_spell,
        with_index,
        without_index,
    })
}

async fn time_claims(db: &DatabaseConnection, claims: usize) -> anyhow::Result<Latency> {
    let mut times = Vec::with_capacity(claims);
    for _ in 0..claims {
        let started = Instant::now();
        let rows = outbox::claim_batch(db, "bench", 64, Duration::from_secs(60)).await?;
        times.push(started.elapsed());
        anyhow::ensure!(rows.len() == 64, "only {} rows claimable", rows.len());
        let claims: Vec<outbox::Claim> = rows.iter().map(outbox::Claim::from).collect();
        outbox::release(db, &claims, "bench").await?;
    }
    Ok(Latency::of(times))
}

/// Writes `count` rows of `status` with idempotency keys numbered from `first`.
async fn fill(db: &DatabaseConnection, status: &str, first: u64, count: u64) -> anyhow::Result<()> {
    if count == 0 {
        return Ok(());
    }
    let backend = db.get_database_backend();
    let at = platform::db::now() - chrono::TimeDelta::seconds(1);
    let sql = match backend {
        DbBackend::Postgres => format!(
            "INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
             idempotency_key, status, attempts, available_at, created_at, processed_at) \
             SELECT gen_random_uuid(), 1, 'create-user', '{{\"version\":1}}'::json, \
             'k-' || n, '{status}', 0, $1, $1, $1 \
             FROM generate_series({}, {}) AS n",
            first + 1,
            first + count
        ),
        _ => format!(
            "WITH RECURSIVE seq(n) AS (SELECT {} UNION ALL SELECT n + 1 FROM seq WHERE n < {}) \
             INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
             idempotency_key, status, attempts, available_at, created_at, processed_at) \
             SELECT randomblob(16), 1, 'create-user', '{{\"version\":1}}', \
             'k-' || n, '{status}', 0, ?1, ?1, ?1 FROM seq",
            first + 1,
            first + count
        ),
    };
    db.execute_raw(Statement::from_sql_and_values(backend, sql, [at.into()]))
        .await?;
    Ok(())
}

async fn analyze(db: &DatabaseConnection) -> anyhow::Result<()> {
    db.execute_unprepared("ANALYZE").await?;
    Ok(())
}
