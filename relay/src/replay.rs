//! `relay replay`: sends the stored intents of delivered rows to Users again, with their
//! stored keys and `idempotency-replay-only: true`, to show that the inbox answers with the
//! user that is linked. Users can never create anything from a replay, and nothing is
//! written to the Student DB.

use std::io::Write;

use sea_orm::DatabaseConnection;
pub use student_store::outbox::DoneRows as Selection;
use student_store::{
    effect::Effect,
    entity::outbox as outbox_row,
    outbox::{self, DoneRows},
};
use tracing::Instrument as _;

use platform::status::code_name;

use crate::users_client::{Answer, Key, UsersClient, delivery_span, row_trace};

/// Totals of a replay run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplaySummary {
    pub replayed: usize,
    pub matched: usize,
    pub mismatched: usize,
    pub errors: usize,
}

impl ReplaySummary {
    /// The exit code `relay replay` ends with: 0 all matched, 1 a mismatch, 2 an error.
    pub fn exit_code(&self) -> u8 {
        if self.errors > 0 {
            2
        } else if self.mismatched > 0 {
            1
        } else {
            0
        }
    }
}

/// Replays the selected `done` rows, printing one line per delivery and a summary line.
pub async fn replay(
    db: &DatabaseConnection,
    users: &UsersClient,
    selection: &Selection,
    out: &mut impl Write,
) -> anyhow::Result<ReplaySummary> {
    let rows = outbox::done_rows(db, selection).await?;
    let mut summary = ReplaySummary::default();
    if rows.is_empty() && *selection != DoneRows::All {
        writeln!(
            out,
            "no delivered outbox row matches {}",
            describe(selection)
        )?;
        summary.errors += 1;
    }
    let links = outbox::linked_users(db, &rows).await?;
    for row in rows {
        summary.replayed += 1;
        let linked = links.get(&row.aggregate_id).copied();
        match replay_one(users, &row).await {
            Ok(created) => {
                let matches_link = linked == Some(created.user_id);
                writeln!(
                    out,
                    "key={} effect={} student={} user={} from_inbox={} matches_link={}",
                    row.idempotency_key,
                    row.effect_type,
                    row.aggregate_id,
                    created.user_id,
                    created.from_inbox,
                    matches_link
                )?;
                if matches_link {
                    summary.matched += 1;
                } else {
                    summary.mismatched += 1;
                }
            }
            Err(error) => {
                writeln!(
                    out,
                    "key={} effect={} student={} error=\"{}\"",
                    row.idempotency_key, row.effect_type, row.aggregate_id, error
                )?;
                summary.errors += 1;
            }
        }
    }
    writeln!(
        out,
        "replayed={} matched={} mismatched={} errors={}",
        summary.replayed, summary.matched, summary.mismatched, summary.errors
    )?;
    Ok(summary)
}

/// Sends one row's stored intent again, replay-only: Users answers from its inbox or with
/// NOT_FOUND, and never executes.
async fn replay_one(users: &UsersClient, row: &outbox_row::Model) -> Result<Answer, String> {
    let effect = Effect::decode(&row.effect_type, &row.payload).map_err(|err| err.to_string())?;
    let (trace, span) = row_trace(row);
    let exported = delivery_span(row, trace);
    let answered = users
        .deliver(Key::of(row, trace), &effect, None, true)
        .instrument(span)
        .await;
    exported
        .ended(answered)
        .map_err(|status| format!("{}: {}", code_name(status.code()), status.message()))
}

fn describe(selection: &Selection) -> String {
    match selection {
        DoneRows::Student(id) => format!("--student {id}"),
        DoneRows::Key(key) => format!("--key {key}"),
        DoneRows::All => "--all".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_outrank_mismatches_in_the_exit_code() {
        let clean = ReplaySummary {
            replayed: 3,
            matched: 3,
            ..Default::default()
        };
        assert_eq!(clean.exit_code(), 0);
        let mismatch = ReplaySummary {
            replayed: 3,
            matched: 2,
            mismatched: 1,
            errors: 0,
        };
        assert_eq!(mismatch.exit_code(), 1);
        let error = ReplaySummary {
            replayed: 3,
            matched: 1,
            mismatched: 1,
            errors: 1,
        };
        assert_eq!(error.exit_code(), 2);
    }
}
