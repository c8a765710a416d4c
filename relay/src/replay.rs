//! `relay replay`: sends the stored intents of delivered rows to Users again, with their
//! stored keys and `idempotency-replay-only: true`, to show that the inbox answers with the
//! user that is linked. Users can never create anything from a replay, and nothing is
//! written to the Student DB.

use std::{collections::HashMap, io::Write};

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use student_svc::entity::{
    outbox::{self, CREATE_USER, CreateUserPayload, OutboxStatus},
    students,
};
use uuid::Uuid;

use crate::{classify::code_name, users_client::UsersClient};

/// Which delivered rows to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    Student(Uuid),
    Key(String),
    All,
}

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
    let mut query = outbox::Entity::find()
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .filter(outbox::Column::EffectType.eq(CREATE_USER))
        .order_by_asc(outbox::Column::Id);
    query = match selection {
        Selection::Student(id) => query.filter(outbox::Column::AggregateId.eq(*id)),
        Selection::Key(key) => query.filter(outbox::Column::IdempotencyKey.eq(key.as_str())),
        Selection::All => query,
    };
    let rows = query.all(db).await?;
    let mut summary = ReplaySummary::default();
    if rows.is_empty() && *selection != Selection::All {
        writeln!(
            out,
            "no delivered outbox row matches {}",
            describe(selection)
        )?;
        summary.errors += 1;
    }
    let links = linked_users(db, &rows).await?;
    for row in rows {
        summary.replayed += 1;
        let linked = links.get(&row.aggregate_id).copied();
        let answer = match serde_json::from_value::<CreateUserPayload>(row.payload.clone()) {
            Ok(payload) => users
                .create_user(&row.idempotency_key, &payload, true)
                .await
                .map_err(|status| format!("{}: {}", code_name(status.code()), status.message())),
            Err(err) => Err(format!("unreadable payload: {err}")),
        };
        match answer {
            Ok(created) => {
                let matches_link = linked.is_some_and(|id| id.to_string() == created.user_id);
                writeln!(
                    out,
                    "key={} student={} user={} from_inbox={} matches_link={}",
                    row.idempotency_key,
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
                    "key={} student={} error=\"{}\"",
                    row.idempotency_key, row.aggregate_id, error
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

/// The user each row's student is linked to, read in a few queries rather than one per row.
async fn linked_users(
    db: &DatabaseConnection,
    rows: &[outbox::Model],
) -> anyhow::Result<HashMap<Uuid, Uuid>> {
    // Chunks stay far below every backend's limit on bound parameters.
    const CHUNK: usize = 1_000;
    let mut links = HashMap::with_capacity(rows.len());
    for chunk in rows.chunks(CHUNK) {
        let students = students::Entity::find()
            .filter(students::Column::Id.is_in(chunk.iter().map(|row| row.aggregate_id)))
            .all(db)
            .await?;
        links.extend(
            students
                .into_iter()
                .filter_map(|s| Some((s.id, s.user_id?))),
        );
    }
    Ok(links)
}

fn describe(selection: &Selection) -> String {
    match selection {
        Selection::Student(id) => format!("--student {id}"),
        Selection::Key(key) => format!("--key {key}"),
        Selection::All => "--all".to_owned(),
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
