//! The relay's reads and writes on the Student DB. Each is one statement or one short
//! transaction, opened and committed here; none is ever held open across a call to Users.
//!
//! Lease and backoff times come from one clock: on PostgreSQL the database's `now()`, so
//! relays on machines with skewed clocks agree; on SQLite (one machine) the application's,
//! bound as values in the stored format, never compared with SQLite's own time functions.

use std::{sync::LazyLock, time::Duration};

use chrono::{DateTime, Utc};
use platform::db::{begin_write, now};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    IdenStatic as _, Iterable as _, QueryFilter, Statement, UpdateMany,
    sea_query::{Expr, ExprTrait},
};
use student_svc::entity::{
    outbox::{self, FailureKind, OutboxStatus},
    students,
};
use uuid::Uuid;

/// Claims up to `limit` due rows for `relay_id`, oldest first, in ONE statement: rows that
/// are `pending` and past their backoff, or `processing` under a lease that has run out
/// (their relay died or stalled). Each claimed row becomes `processing`, leased to this
/// relay until now + `lease`, with one more attempt counted.
///
/// PostgreSQL: `FOR UPDATE SKIP LOCKED`, so concurrent relays never claim the same due row.
/// SQLite: the UPDATE runs under SQLite's single write lock, so it is just as exclusive.
pub async fn claim_batch(
    db: &DatabaseConnection,
    relay_id: &str,
    limit: u32,
    lease: Duration,
) -> Result<Vec<outbox::Model>, DbErr> {
    let backend = db.get_database_backend();
    let statement = match backend {
        DbBackend::Postgres => Statement::from_sql_and_values(
            backend,
            CLAIM_POSTGRES.as_str(),
            [
                relay_id.into(),
                millis(lease).into(),
                i64::from(limit).into(),
            ],
        ),
        _ => {
            let at = now();
            let until = at + lease;
            Statement::from_sql_and_values(
                backend,
                CLAIM_SQLITE.as_str(),
                [
                    relay_id.into(),
                    until.into(),
                    at.into(),
                    at.into(),
                    i64::from(limit).into(),
                ],
            )
        }
    };
    let mut rows = outbox::Entity::find()
        .from_raw_sql(statement)
        .all(db)
        .await?;
    // RETURNING does not promise an order.
    rows.sort_by_key(|row| row.id);
    Ok(rows)
}

/// Why a delivery could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The student is already linked to another user: never overwritten, always reported.
    #[error("student {student_id} is already linked to user {linked}, not {returned}")]
    LinkConflict {
        student_id: Uuid,
        linked: Uuid,
        returned: Uuid,
    },
    #[error("student {0} does not exist")]
    StudentMissing(Uuid),
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// Links the user Users returned to the student and marks the row `done`, in ONE
/// transaction: either the student shows its user and the row is finished, or neither.
///
/// Safe for a relay whose lease ran out while it waited: another relay delivering the same
/// row got the same user id from the inbox, linking the same id again changes nothing, and
/// a row already `done` stays as it is. A *different* user id is refused, never written.
pub async fn record_delivery(
    db: &DatabaseConnection,
    row: &outbox::Model,
    user_id: Uuid,
) -> Result<(), RecordError> {
    let at = now();
    let txn = begin_write(db).await?;
    let linked = students::Entity::update_many()
        .col_expr(students::Column::UserId, Expr::value(user_id))
        .col_expr(students::Column::UpdatedAt, Expr::value(at))
        .filter(students::Column::Id.eq(row.aggregate_id))
        .filter(
            students::Column::UserId
                .is_null()
                .or(students::Column::UserId.eq(user_id)),
        )
        .exec(&txn)
        .await?;
    if linked.rows_affected == 0 {
        let student = students::Entity::find_by_id(row.aggregate_id)
            .one(&txn)
            .await?;
        return Err(match student.and_then(|s| s.user_id) {
            Some(linked) => RecordError::LinkConflict {
                student_id: row.aggregate_id,
                linked,
                returned: user_id,
            },
            None => RecordError::StudentMissing(row.aggregate_id),
        });
    }
    without_lease(outbox::Entity::update_many())
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Done))
        .col_expr(
            outbox::Column::DeliveredUserId,
            Expr::value(user_id.to_string()),
        )
        .col_expr(outbox::Column::ProcessedAt, Expr::value(at))
        .col_expr(
            outbox::Column::LastError,
            Expr::value(Option::<String>::None),
        )
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.ne(OutboxStatus::Done))
        .exec(&txn)
        .await?;
    // Crash point: before this commit the row is still leased and will be delivered again
    // once the lease runs out (Users answers from its inbox); after it, the student is linked.
    txn.commit().await?;
    Ok(())
}

/// Gives a row back as `pending` after a transient failure, not before `delay` from now.
/// Does nothing if this relay no longer holds the row's lease.
pub async fn record_retry(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    error: &str,
    delay: Duration,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let statement = match backend {
        DbBackend::Postgres => Statement::from_sql_and_values(
            backend,
            r#"UPDATE outbox
                  SET status = 'pending', last_error = $1,
                      available_at = now() + $2 * interval '1 millisecond',
                      locked_by = NULL, locked_until = NULL
                WHERE id = $3 AND status = 'processing' AND locked_by = $4"#,
            [
                error.into(),
                millis(delay).into(),
                row.id.into(),
                relay_id.into(),
            ],
        ),
        _ => Statement::from_sql_and_values(
            backend,
            r#"UPDATE outbox
                  SET status = 'pending', last_error = ?, available_at = ?,
                      locked_by = NULL, locked_until = NULL
                WHERE id = ? AND status = 'processing' AND locked_by = ?"#,
            [
                error.into(),
                (now() + delay).into(),
                row.id.into(),
                relay_id.into(),
            ],
        ),
    };
    db.execute_raw(statement).await?;
    Ok(())
}

/// Marks a row `failed` for good. Does nothing if this relay no longer holds its lease (the
/// relay that does will reach the same verdict: a rejection is saved in Users' inbox).
pub async fn record_failure(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    kind: FailureKind,
    error: &str,
) -> Result<(), DbErr> {
    without_lease(outbox::Entity::update_many())
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Failed))
        .col_expr(outbox::Column::FailureKind, Expr::value(kind))
        .col_expr(outbox::Column::LastError, Expr::value(error.to_owned()))
        .col_expr(outbox::Column::ProcessedAt, Expr::value(now()))
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.eq(OutboxStatus::Processing))
        .filter(outbox::Column::LockedBy.eq(relay_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Hands back rows this relay claimed but never sent (it is shutting down): `pending` again,
/// due at once, the claim's attempt uncounted, so another relay takes them immediately.
pub async fn release(db: &DatabaseConnection, ids: &[i64], relay_id: &str) -> Result<u64, DbErr> {
    if ids.is_empty() {
        return Ok(0);
    }
    let released = without_lease(outbox::Entity::update_many())
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Pending))
        .col_expr(
            outbox::Column::Attempts,
            Expr::col(outbox::Column::Attempts).sub(1),
        )
        .col_expr(outbox::Column::AvailableAt, Expr::value(now()))
        .filter(outbox::Column::Id.is_in(ids.iter().copied()))
        .filter(outbox::Column::Status.eq(OutboxStatus::Processing))
        .filter(outbox::Column::LockedBy.eq(relay_id))
        .exec(db)
        .await?;
    Ok(released.rows_affected)
}

/// Adds "no relay holds this row" (`locked_by`, `locked_until` cleared) to an update.
fn without_lease(update: UpdateMany<outbox::Entity>) -> UpdateMany<outbox::Entity> {
    update
        .col_expr(
            outbox::Column::LockedBy,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            outbox::Column::LockedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
}

/// The claim on PostgreSQL: `FOR UPDATE SKIP LOCKED`, lease times from the database clock.
static CLAIM_POSTGRES: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"UPDATE outbox
              SET status = 'processing', locked_by = $1,
                  locked_until = now() + $2 * interval '1 millisecond',
                  attempts = attempts + 1
            WHERE id IN (
                  SELECT id FROM outbox
                   WHERE (status = 'pending' AND available_at <= now())
                      OR (status = 'processing' AND locked_until < now())
                   ORDER BY id
                   LIMIT $3
                     FOR UPDATE SKIP LOCKED)
        RETURNING {}"#,
        outbox_columns()
    )
});

/// The claim on SQLite: one UPDATE under the single write lock, times bound by the caller.
static CLAIM_SQLITE: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"UPDATE outbox
              SET status = 'processing', locked_by = ?, locked_until = ?,
                  attempts = attempts + 1
            WHERE id IN (
                  SELECT id FROM outbox
                   WHERE (status = 'pending' AND available_at <= ?)
                      OR (status = 'processing' AND locked_until < ?)
                   ORDER BY id
                   LIMIT ?)
        RETURNING {}"#,
        outbox_columns()
    )
});

/// The outbox entity's columns, quoted and comma-separated. Named, never `*`: a cached
/// statement must not change shape when the schema gains a column.
fn outbox_columns() -> String {
    outbox::Column::iter()
        .map(|column| format!("\"{}\"", column.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
