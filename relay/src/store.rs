//! The relay's reads and writes on the Student DB. Each write is one short transaction,
//! opened and committed here; none is ever held open across a call to Users.

use chrono::{DateTime, Utc};
use platform::db::{begin_write, now};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    sea_query::{Expr, ExprTrait},
};
use student_svc::entity::{
    outbox::{self, OutboxStatus},
    students,
};
use uuid::Uuid;

/// Rows due for delivery: `pending` and past their backoff, oldest first.
pub async fn due_rows(db: &DatabaseConnection, limit: u64) -> Result<Vec<outbox::Model>, DbErr> {
    outbox::Entity::find()
        .filter(outbox::Column::Status.eq(OutboxStatus::Pending))
        .filter(outbox::Column::AvailableAt.lte(now()))
        .order_by_asc(outbox::Column::Id)
        .limit(limit)
        .all(db)
        .await
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
/// Idempotent: recording the same user again changes nothing, so a redelivery that raced
/// an earlier one is harmless. A *different* user id is refused, never written.
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
    outbox::Entity::update_many()
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
    // Crash point: before this commit the row is still pending and will be delivered again
    // (Users answers from its inbox); after it, the student is linked.
    txn.commit().await?;
    Ok(())
}

/// Puts a row back to `pending` after a transient failure, not before `available_at`.
pub async fn record_retry(
    db: &DatabaseConnection,
    row: &outbox::Model,
    error: &str,
    available_at: DateTime<Utc>,
) -> Result<(), DbErr> {
    outbox::Entity::update_many()
        .col_expr(
            outbox::Column::Attempts,
            Expr::col(outbox::Column::Attempts).add(1),
        )
        .col_expr(outbox::Column::LastError, Expr::value(error.to_owned()))
        .col_expr(outbox::Column::AvailableAt, Expr::value(available_at))
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.eq(OutboxStatus::Pending))
        .exec(db)
        .await?;
    Ok(())
}

/// Marks a row `failed` for good: Users rejected it, or it can never be delivered.
pub async fn record_failure(
    db: &DatabaseConnection,
    row: &outbox::Model,
    error: &str,
) -> Result<(), DbErr> {
    outbox::Entity::update_many()
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Failed))
        .col_expr(
            outbox::Column::Attempts,
            Expr::col(outbox::Column::Attempts).add(1),
        )
        .col_expr(outbox::Column::LastError, Expr::value(error.to_owned()))
        .col_expr(outbox::Column::ProcessedAt, Expr::value(now()))
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.eq(OutboxStatus::Pending))
        .exec(db)
        .await?;
    Ok(())
}
