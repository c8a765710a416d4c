//! `relay status`: how much of the outbox is where, from the Student DB alone.

use std::io::Write;

use platform::db::now;
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use student_svc::entity::outbox::{self, OutboxStatus};

/// Row counts per status and the age of the oldest undelivered row.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OutboxStatusReport {
    pub pending: i64,
    pub processing: i64,
    pub done: i64,
    pub failed: i64,
    /// Seconds since the oldest `pending` or `processing` row was written; 0 when none.
    pub oldest_pending_age_seconds: i64,
    /// `pending` rows that failed at least once and are waiting to be retried (Users down,
    /// overloaded, or refusing the relay's token: the relay's log says which).
    pub retrying: i64,
}

/// Reads the report from the Student DB.
pub async fn read(db: &DatabaseConnection) -> anyhow::Result<OutboxStatusReport> {
    let counts: Vec<(OutboxStatus, i64)> = outbox::Entity::find()
        .select_only()
        .column(outbox::Column::Status)
        .column_as(outbox::Column::Id.count(), "rows")
        .group_by(outbox::Column::Status)
        .into_tuple()
        .all(db)
        .await?;
    let mut report = OutboxStatusReport::default();
    for (status, rows) in counts {
        match status {
            OutboxStatus::Pending => report.pending = rows,
            OutboxStatus::Processing => report.processing = rows,
            OutboxStatus::Done => report.done = rows,
            OutboxStatus::Failed => report.failed = rows,
        }
    }
    let oldest: Option<outbox::Model> = outbox::Entity::find()
        .filter(outbox::Column::Status.is_in([OutboxStatus::Pending, OutboxStatus::Processing]))
        .order_by_asc(outbox::Column::CreatedAt)
        .order_by_asc(outbox::Column::Id)
        .one(db)
        .await?;
    if let Some(row) = oldest {
        report.oldest_pending_age_seconds = (now() - row.created_at).num_seconds().max(0);
    }
    report.retrying = i64::try_from(
        outbox::Entity::find()
            .filter(outbox::Column::Status.eq(OutboxStatus::Pending))
            .filter(outbox::Column::Attempts.gt(0))
            .count(db)
            .await?,
    )
    .unwrap_or(i64::MAX);
    Ok(report)
}

/// Prints the report as `relay status` does: one `NAME N` line per status (zeros
/// included), then `oldest_pending_age_seconds X`, then `retrying N`.
pub fn print(report: &OutboxStatusReport, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "pending {}", report.pending)?;
    writeln!(out, "processing {}", report.processing)?;
    writeln!(out, "done {}", report.done)?;
    writeln!(out, "failed {}", report.failed)?;
    writeln!(
        out,
        "oldest_pending_age_seconds {}",
        report.oldest_pending_age_seconds
    )?;
    writeln!(out, "retrying {}", report.retrying)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_prints_every_status_even_when_zero() {
        let mut out = Vec::new();
        let report = OutboxStatusReport {
            pending: 2,
            done: 7,
            oldest_pending_age_seconds: 12,
            retrying: 1,
            ..OutboxStatusReport::default()
        };
        print(&report, &mut out).expect("write to memory");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "pending 2\nprocessing 0\ndone 7\nfailed 0\noldest_pending_age_seconds 12\nretrying 1\n"
        );
    }
}
