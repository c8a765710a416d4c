//! `relay audit`: checks that the two databases agree, across the service boundary, asking
//! Users only through its gRPC API (`GetUser`):
//! - every `done` row's result is the user its student is linked to;
//! - no `done` row's student lacks a link;
//! - every linked user exists in Users and points back to its student;
//! - no two students share a user.
//!
//! One line per problem, then `checked=N problems=N` (N students). Reads only; safe while
//! relays run (see `student_store::audit::students_page` for why no race reports a false
//! problem).

use std::{collections::HashMap, io::Write, time::Duration};

use futures::StreamExt as _;
use sea_orm::DatabaseConnection;
use student_store::audit::{self, AuditedStudent};
use tonic::Code;
use uuid::Uuid;

use crate::users_client::UsersClient;

/// Students read from the Student DB at a time.
const PAGE: u64 = 500;
/// `GetUser` calls in flight at once.
const LOOKUPS_IN_FLIGHT: usize = 16;
/// How often one lookup may be shed before the audit gives up (exit 2), and the wait when
/// Users does not say how long.
const MAX_SHED: u32 = 100;
const SHED_WAIT: Duration = Duration::from_millis(200);

/// What an audit found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub checked: u64,
    pub problems: u64,
}

impl Summary {
    /// 0 when clean, 1 when a problem was found (errors exit 2 before a summary exists).
    pub fn exit_code(self) -> u8 {
        u8::from(self.problems > 0)
    }
}

/// Runs the audit, printing each problem and the summary to `out`. An error (a database
/// or Users failing to answer) ends it: the caller reports it and exits 2.
pub async fn audit(
    db: &DatabaseConnection,
    users: &UsersClient,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let mut problem = |line: String, out: &mut dyn Write| -> std::io::Result<()> {
        summary.problems += 1;
        writeln!(out, "{line}")
    };
    for (user, students) in audit::shared_users(db).await? {
        let students: Vec<String> = students.iter().map(Uuid::to_string).collect();
        problem(
            format!(
                "user {user} is linked to {} students: {}",
                students.len(),
                students.join(" ")
            ),
            out,
        )?;
    }
    let mut after = None;
    loop {
        let page = audit::students_page(db, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        let owners = owners_of_linked_users(users, &page).await?;
        for student in &page {
            summary.checked += 1;
            for line in student_problems(student, &owners) {
                problem(line, out)?;
            }
        }
    }
    writeln!(
        out,
        "checked={} problems={}",
        summary.checked, summary.problems
    )?;
    Ok(summary)
}

/// For each linked user of `page`, the student Users says it belongs to (`None`: Users
/// has no such user).
async fn owners_of_linked_users(
    users: &UsersClient,
    page: &[AuditedStudent],
) -> anyhow::Result<HashMap<Uuid, Option<String>>> {
    let linked: Vec<Uuid> = page.iter().filter_map(|student| student.user_id).collect();
    let answers: Vec<(Uuid, Result<Option<String>, tonic::Status>)> = futures::stream::iter(linked)
        .map(|user| async move { (user, owner_of(users, user).await) })
        .buffer_unordered(LOOKUPS_IN_FLIGHT)
        .collect()
        .await;
    answers
        .into_iter()
        .map(|(user, owner)| {
            owner.map(|owner| (user, owner)).map_err(|status| {
                anyhow::anyhow!(
                    "cannot ask Users about user {user}: {}: {}",
                    platform::status::code_name(status.code()),
                    status.message()
                )
            })
        })
        .collect()
}

/// The student Users says `user` belongs to (`None`: no such user). A call Users sheds
/// (over its concurrency limit: not an answer) is asked again after the wait Users asks for.
async fn owner_of(users: &UsersClient, user: Uuid) -> Result<Option<String>, tonic::Status> {
    let mut shed = 0;
    loop {
        match users.get_user(user).await {
            Err(status) if status.code() == Code::ResourceExhausted && shed < MAX_SHED => {
                shed += 1;
                let wait = platform::status::retry_after(&status).unwrap_or(SHED_WAIT);
                tokio::time::sleep(wait).await;
            }
            answer => return answer.map(|found| found.map(|user| user.student_id)),
        }
    }
}

/// The problems of one student, given who Users says owns each linked user.
fn student_problems(
    student: &AuditedStudent,
    owners: &HashMap<Uuid, Option<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let id = student.id;
    for row in &student.done {
        let result = row.result.as_deref().unwrap_or("-");
        match student.user_id {
            None => problems.push(format!(
                "student {id}: outbox row {} ({}) is done with user {result}, but the student is not linked",
                row.id, row.effect_type
            )),
            Some(link) if result != link.to_string() => problems.push(format!(
                "student {id}: outbox row {} ({}) is done with user {result}, but the student is linked to {link}",
                row.id, row.effect_type
            )),
            Some(_) => {}
        }
    }
    if let Some(link) = student.user_id {
        match owners.get(&link) {
            Some(Some(owner)) if *owner == id.to_string() => {}
            Some(Some(owner)) => problems.push(format!(
                "student {id}: linked to user {link}, which Users says belongs to student {owner}"
            )),
            Some(None) | None => problems.push(format!(
                "student {id}: linked to user {link}, which Users does not have"
            )),
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn student(user_id: Option<Uuid>, results: &[Option<Uuid>]) -> AuditedStudent {
        let id = Uuid::from_u128(1);
        AuditedStudent {
            id,
            user_id,
            done: results
                .iter()
                .enumerate()
                .map(|(n, result)| student_store::entity::outbox::Model {
                    id: i64::try_from(n).expect("small") + 1,
                    aggregate_id: id,
                    aggregate_version: 1,
                    effect_type: "create-user".into(),
                    payload: serde_json::json!({}),
                    idempotency_key: format!("k{n}"),
                    status: student_store::entity::outbox::OutboxStatus::Done,
                    attempts: 1,
                    last_error: None,
                    available_at: chrono::Utc::now(),
                    locked_until: None,
                    locked_by: None,
                    created_at: chrono::Utc::now(),
                    processed_at: Some(chrono::Utc::now()),
                    result: result.map(|user| user.to_string()),
                    failure_kind: None,
                    error_code: None,
                    client_key: None,
                    request_hash: None,
                    key_created_at: None,
                    traceparent: None,
                })
                .collect(),
        }
    }

    #[test]
    fn each_disagreement_is_one_problem() {
        let (user, other) = (Uuid::from_u128(7), Uuid::from_u128(8));
        let owned = HashMap::from([(user, Some(Uuid::from_u128(1).to_string()))]);
        assert!(student_problems(&student(Some(user), &[Some(user)]), &owned).is_empty());
        // Not linked yet and nothing done: in flight, not a problem.
        assert!(student_problems(&student(None, &[]), &owned).is_empty());

        let problems = student_problems(&student(None, &[Some(user)]), &owned);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("but the student is not linked"),
            "{problems:?}"
        );

        let problems = student_problems(&student(Some(user), &[Some(other)]), &owned);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains(&format!(
                "is done with user {other}, but the student is linked to {user}"
            )),
            "{problems:?}"
        );

        let missing = HashMap::from([(user, None)]);
        let problems = student_problems(&student(Some(user), &[Some(user)]), &missing);
        assert_eq!(
            problems,
            [format!(
                "student {}: linked to user {user}, which Users does not have",
                Uuid::from_u128(1)
            )]
        );

        let elsewhere = HashMap::from([(user, Some(Uuid::from_u128(2).to_string()))]);
        let problems = student_problems(&student(Some(user), &[Some(user)]), &elsewhere);
        assert!(
            problems[0].contains(
                "which Users says belongs to student 00000000-0000-0000-0000-000000000002"
            ),
            "{problems:?}"
        );
    }
}
