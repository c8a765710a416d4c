//! `relay show --student ID`: one student's outbox rows, oldest first, one block each, for
//! an operator asking "what happened to this student's effects?". The payload (personal
//! data) is not printed; the key, the state, the last error and the result are.

use std::io::Write;

use chrono::{DateTime, SecondsFormat, Utc};
use platform::trace::TraceContext;
use sea_orm::{ActiveEnum as _, DatabaseConnection};
use student_store::{entity::outbox as outbox_row, outbox};
use uuid::Uuid;

/// Reads `student`'s outbox rows, in the order the relay delivers them.
pub async fn read(
    db: &DatabaseConnection,
    student: Uuid,
) -> anyhow::Result<Vec<outbox_row::Model>> {
    Ok(outbox::rows_of_student(db, student).await?)
}

/// Prints each row as a block of `name value` lines, blocks separated by an empty line;
/// `-` stands for a value that is not set.
pub fn print(rows: &[outbox_row::Model], out: &mut impl Write) -> std::io::Result<()> {
    for (n, row) in rows.iter().enumerate() {
        if n > 0 {
            writeln!(out)?;
        }
        let fields = [
            ("outbox_id", row.id.to_string()),
            ("student", row.aggregate_id.to_string()),
            ("version", row.aggregate_version.to_string()),
            ("effect", row.effect_type.clone()),
            ("status", row.status.to_value()),
            ("attempts", row.attempts.to_string()),
            ("idempotency_key", row.idempotency_key.clone()),
            ("key_issued_at", time(Some(row.key_issued_at()))),
            ("created_at", time(Some(row.created_at))),
            ("available_at", time(Some(row.available_at))),
            ("processed_at", time(row.processed_at)),
            ("locked_by", text(row.locked_by.as_deref())),
            ("locked_until", time(row.locked_until)),
            (
                "failure_kind",
                text(row.failure_kind.map(|kind| kind.to_value()).as_deref()),
            ),
            ("error_code", text(row.error_code.as_deref())),
            ("last_error", text(row.last_error.as_deref())),
            ("result", text(row.result.as_deref())),
            (
                "trace_id",
                text(
                    row.traceparent
                        .as_deref()
                        .and_then(TraceContext::parse)
                        .map(|trace| trace.trace_id())
                        .as_deref(),
                ),
            ),
        ];
        for (name, value) in fields {
            writeln!(out, "{name} {value}")?;
        }
    }
    Ok(())
}

fn time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |at| at.to_rfc3339_opts(SecondsFormat::Micros, true),
    )
}

fn text(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rows::row;

    #[test]
    fn each_row_is_a_block_and_the_payload_is_never_printed() {
        // The second row is held by a relay and was processed before: each time in its
        // own field.
        let mut held = row(9, 2);
        let at = |second| {
            DateTime::parse_from_rfc3339(&format!("2026-12-01T11:00:{second:02}.5Z"))
                .expect("a time")
                .with_timezone(&Utc)
        };
        held.processed_at = Some(at(1));
        held.locked_by = Some("relay-a".into());
        held.locked_until = Some(at(2));
        let mut out = Vec::new();
        print(&[row(7, 1), held], &mut out).expect("write to memory");
        let text = String::from_utf8(out).expect("utf-8");
        let blocks: Vec<&str> = text.split("\n\n").collect();
        assert_eq!(blocks.len(), 2, "{text}");
        assert_eq!(
            blocks[0],
            "outbox_id 7\nstudent 00000000-0000-0000-0000-000000000000\nversion 1\n\
             effect create-user\nstatus failed\nattempts 3\nidempotency_key key-7\n\
             key_issued_at 2026-12-01T10:00:00.123456Z\n\
             created_at 2026-12-01T10:00:00.123456Z\navailable_at 2026-12-01T10:00:00.123456Z\n\
             processed_at -\nlocked_by -\nlocked_until -\nfailure_kind rejected\n\
             error_code DOCUMENT_NUMBER_TAKEN\nlast_error document_number is already used\n\
             result -\ntrace_id -"
        );
        assert!(blocks[1].starts_with("outbox_id 9\n"));
        assert!(
            blocks[1].contains(
                "processed_at 2026-12-01T11:00:01.500000Z\nlocked_by relay-a\n\
                 locked_until 2026-12-01T11:00:02.500000Z\n"
            ),
            "{text}"
        );
        assert!(!text.contains("never@printed"), "{text}");
    }
}
