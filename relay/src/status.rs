//! `relay status`: how much of the outbox is where, from the Student DB alone.

use std::io::Write;

use sea_orm::DatabaseConnection;
use student_store::outbox;
pub use student_store::outbox::OutboxReport;

/// Reads the report from the Student DB, counting `done` rows exactly.
pub async fn read(db: &DatabaseConnection) -> anyhow::Result<OutboxReport> {
    Ok(outbox::report(db, outbox::DoneCount::Exact).await?)
}

/// Prints the report as `relay status` does: one `NAME N` line per status (zeros
/// included), then `oldest_pending_age_seconds X`, `retrying N` and `blocked N`.
pub fn print(report: &OutboxReport, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "pending {}", report.pending)?;
    writeln!(out, "processing {}", report.processing)?;
    writeln!(out, "done {}", report.done)?;
    writeln!(out, "failed {}", report.failed)?;
    writeln!(
        out,
        "oldest_pending_age_seconds {}",
        report.oldest_pending_age_seconds
    )?;
    writeln!(out, "retrying {}", report.retrying)?;
    writeln!(out, "blocked {}", report.blocked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_prints_every_status_even_when_zero() {
        let mut out = Vec::new();
        let report = OutboxReport {
            pending: 2,
            done: 7,
            oldest_pending_age_seconds: 12,
            retrying: 1,
            blocked: 3,
            ..OutboxReport::default()
        };
        print(&report, &mut out).expect("write to memory");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "pending 2\nprocessing 0\ndone 7\nfailed 0\noldest_pending_age_seconds 12\nretrying 1\nblocked 3\n"
        );
    }
}
