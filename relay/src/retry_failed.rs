//! `relay retry-failed`: redrives failed rows.
//!
//! A row that ran out of attempts (Users unreachable for too long) goes back to `pending`
//! with its key: Users never executed it, or executed it and will answer from its inbox.
//! A row Users *rejected* would get the same saved rejection for the same key, so it is
//! redriven only with `--new-key`: a fresh key, explicitly a new operation.

use std::io::Write;

use platform::db::now;
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, sea_query::Expr,
};
use student_svc::entity::outbox::{self, FailureKind, OutboxStatus};
use uuid::Uuid;

/// Which failed rows to redrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    Id(i64),
    All,
}

/// Totals of a retry-failed run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetrySummary {
    pub requeued: usize,
    pub skipped: usize,
    pub errors: usize,
}

impl RetrySummary {
    /// 0 when every selected row was requeued, 1 when some were skipped, 2 on an error.
    pub fn exit_code(&self) -> u8 {
        if self.errors > 0 {
            2
        } else if self.skipped > 0 {
            1
        } else {
            0
        }
    }
}

/// Requeues the selected failed rows, printing one line per row and a summary line.
pub async fn retry_failed(
    db: &DatabaseConnection,
    selection: Selection,
    new_key: bool,
    out: &mut impl Write,
) -> anyhow::Result<RetrySummary> {
    let mut query = outbox::Entity::find()
        .filter(outbox::Column::Status.eq(OutboxStatus::Failed))
        .order_by_asc(outbox::Column::Id);
    if let Selection::Id(id) = selection {
        query = query.filter(outbox::Column::Id.eq(id));
    }
    let rows = query.all(db).await?;
    let mut summary = RetrySummary::default();
    if let (Selection::Id(id), true) = (selection, rows.is_empty()) {
        writeln!(out, "no failed outbox row has id {id}")?;
        summary.errors += 1;
    }
    for row in rows {
        let rejected = row.failure_kind != Some(FailureKind::Exhausted);
        if rejected && !new_key {
            writeln!(
                out,
                "id={} key={} skipped: rejected by Users; the same key gets the same answer, use --new-key",
                row.id, row.idempotency_key
            )?;
            summary.skipped += 1;
            continue;
        }
        let key = if new_key {
            Uuid::new_v4().to_string()
        } else {
            row.idempotency_key.clone()
        };
        let requeued = outbox::Entity::update_many()
            .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Pending))
            .col_expr(outbox::Column::IdempotencyKey, Expr::value(key.clone()))
            .col_expr(outbox::Column::Attempts, Expr::value(0))
            .col_expr(outbox::Column::AvailableAt, Expr::value(now()))
            .col_expr(
                outbox::Column::FailureKind,
                Expr::value(Option::<FailureKind>::None),
            )
            .col_expr(
                outbox::Column::ProcessedAt,
                Expr::value(Option::<chrono::DateTime<chrono::Utc>>::None),
            )
            .filter(outbox::Column::Id.eq(row.id))
            .filter(outbox::Column::Status.eq(OutboxStatus::Failed))
            .exec(db)
            .await?;
        if requeued.rows_affected == 1 {
            writeln!(out, "id={} key={key} requeued", row.id)?;
            summary.requeued += 1;
        } else {
            writeln!(out, "id={} changed while retrying; left as it is", row.id)?;
            summary.errors += 1;
        }
    }
    writeln!(
        out,
        "requeued={} skipped={} errors={}",
        summary.requeued, summary.skipped, summary.errors
    )?;
    Ok(summary)
}
