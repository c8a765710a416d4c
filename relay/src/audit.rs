//! `relay audit`: checks that the two databases agree, across the service boundary, asking
//! Users only through its gRPC API (`ListUsers`, and `GetUser` for a linked user that is
//! not among its student's):
//! - every `done` row's result is the user its student is linked to;
//! - no `done` row's student lacks a link;
//! - every linked user exists in Users and points back to its student;
//! - Users holds no other enabled user for a linked student (a second login for one
//!   student, which a change never reaches: the relay names the linked user; disabling it
//!   with DisableUser, naming it, settles the problem);
//! - no two students share a user;
//! - every enabled user Users holds belongs to a student the Student DB has (`ListUsers`
//!   a page at a time): a user left behind by a student restored away with an older
//!   backup, deleted by hand, or by the naive direct flow, holds its document number
//!   against every new student; disabling it settles the problem.
//!
//! One line per problem, then `checked=N problems=N` (N students). Reads only; safe while
//! relays run (see `student_store::audit::students_page` for why no race reports a false
//! problem).

use std::{
    collections::{HashMap, HashSet},
    io::Write,
};

use futures::StreamExt as _;
use sea_orm::DatabaseConnection;
use student_store::audit::{self, AuditedStudent};
use uuid::Uuid;

use crate::users_client::{UsersClient, unless_shed};

/// Students read from the Student DB at a time.
const PAGE: u64 = 500;
/// Users asked for from Users at a time (its most per page).
const USERS_PAGE: i32 = 500;
/// Users calls in flight at once.
const LOOKUPS_IN_FLIGHT: usize = 16;

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
        let held = held_for_linked_students(users, &page).await?;
        for student in &page {
            summary.checked += 1;
            for line in student_problems(student, &held) {
                problem(line, out)?;
            }
        }
    }
    let mut page_token = String::new();
    loop {
        let (page, next) = unless_shed(|| users.users_page(page_token.clone(), USERS_PAGE))
            .await
            .map_err(|status| {
                anyhow::anyhow!(
                    "cannot ask Users for its users: {}: {}",
                    platform::status::code_name(status.code()),
                    status.message()
                )
            })?;
        for line in users_without_student(db, &page).await? {
            problem(line, out)?;
        }
        if next.is_empty() {
            break;
        }
        page_token = next;
    }
    writeln!(
        out,
        "checked={} problems={}",
        summary.checked, summary.problems
    )?;
    Ok(summary)
}

/// A problem for each enabled user of `page` whose student the Student DB does not have.
/// A disabled one is no login and holds no document number: not a problem.
async fn users_without_student(
    db: &DatabaseConnection,
    page: &[proto::users::v1::User],
) -> anyhow::Result<Vec<String>> {
    let enabled = page
        .iter()
        .filter(|user| user.enabled)
        .map(|user| {
            Uuid::parse_str(&user.student_id)
                .map(|student| (user.id.as_str(), student))
                .map_err(|_| {
                    anyhow::anyhow!(
                        "Users listed user {} with a student id that is not a UUID",
                        user.id
                    )
                })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let named: HashSet<Uuid> = enabled.iter().map(|(_, student)| *student).collect();
    let existing = audit::existing_students(db, &named).await?;
    Ok(enabled
        .into_iter()
        .filter(|(_, student)| !existing.contains(student))
        .map(|(user, student)| {
            format!(
                "user {user}: Users holds it, enabled, for student {student}, which the Student \
                 DB does not have"
            )
        })
        .collect())
}

/// What Users holds for one linked student.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// The users Users holds for the student, oldest first, and whether each is enabled.
    users: Vec<(Uuid, bool)>,
    /// When the linked user is not among them: the student Users says it belongs to
    /// (`None`: Users has no such user).
    linked_owner: Option<Option<String>>,
}

/// What Users holds for each linked student of `page` (by student id).
async fn held_for_linked_students(
    users: &UsersClient,
    page: &[AuditedStudent],
) -> anyhow::Result<HashMap<Uuid, Held>> {
    let linked: Vec<(Uuid, Uuid)> = page
        .iter()
        .filter_map(|student| Some((student.id, student.user_id?)))
        .collect();
    futures::stream::iter(linked)
        .map(|(student, link)| async move {
            held_for(users, student, link)
                .await
                .map(|held| (student, held))
        })
        .buffer_unordered(LOOKUPS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// What Users holds for `student`, linked to `link`.
async fn held_for(users: &UsersClient, student: Uuid, link: Uuid) -> anyhow::Result<Held> {
    let asking = |what: String| {
        move |status: tonic::Status| {
            anyhow::anyhow!(
                "cannot ask Users about {what}: {}: {}",
                platform::status::code_name(status.code()),
                status.message()
            )
        }
    };
    let listed = unless_shed(|| users.list_users(student))
        .await
        .map_err(asking(format!("student {student}'s users")))?;
    let users_ids = listed
        .iter()
        .map(|user| Uuid::parse_str(&user.id).map(|id| (id, user.enabled)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            anyhow::anyhow!("Users listed a user of student {student} whose id is not a UUID")
        })?;
    let linked_owner = if users_ids.iter().any(|(id, _)| *id == link) {
        None
    } else {
        let found = unless_shed(|| users.get_user(link))
            .await
            .map_err(asking(format!("user {link}")))?;
        Some(found.map(|user| user.student_id))
    };
    Ok(Held {
        users: users_ids,
        linked_owner,
    })
}

/// The problems of one student, given what Users holds for each linked student.
fn student_problems(student: &AuditedStudent, held: &HashMap<Uuid, Held>) -> Vec<String> {
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
    if let (Some(link), Some(held)) = (student.user_id, held.get(&id)) {
        match &held.linked_owner {
            None => {}
            Some(Some(owner)) => problems.push(format!(
                "student {id}: linked to user {link}, which Users says belongs to student {owner}"
            )),
            Some(None) => problems.push(format!(
                "student {id}: linked to user {link}, which Users does not have"
            )),
        }
        for (other, _) in held
            .users
            .iter()
            .filter(|(user, enabled)| *user != link && *enabled)
        {
            problems.push(format!(
                "student {id}: Users also holds enabled user {other} for it, which it is not \
                 linked to"
            ));
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
        let id = Uuid::from_u128(1);
        let held = |users: &[(Uuid, bool)], linked_owner| {
            HashMap::from([(
                id,
                Held {
                    users: users.to_vec(),
                    linked_owner,
                },
            )])
        };
        let owned = held(&[(user, true)], None);
        assert!(student_problems(&student(Some(user), &[Some(user)]), &owned).is_empty());
        // Not linked yet and nothing done: in flight, not a problem.
        assert!(student_problems(&student(None, &[]), &HashMap::new()).is_empty());

        let problems = student_problems(&student(None, &[Some(user)]), &HashMap::new());
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

        let missing = held(&[], Some(None));
        let problems = student_problems(&student(Some(user), &[Some(user)]), &missing);
        assert_eq!(
            problems,
            [format!(
                "student {id}: linked to user {user}, which Users does not have"
            )]
        );

        let elsewhere = held(&[], Some(Some(Uuid::from_u128(2).to_string())));
        let problems = student_problems(&student(Some(user), &[Some(user)]), &elsewhere);
        assert!(
            problems[0].contains(
                "which Users says belongs to student 00000000-0000-0000-0000-000000000002"
            ),
            "{problems:?}"
        );

        let two = held(&[(other, true), (user, true)], None);
        let problems = student_problems(&student(Some(user), &[Some(user)]), &two);
        assert_eq!(
            problems,
            [format!(
                "student {id}: Users also holds enabled user {other} for it, which it is not \
                 linked to"
            )]
        );
        // A disabled one is no login: not a problem.
        let disabled = held(&[(other, false), (user, true)], None);
        assert!(student_problems(&student(Some(user), &[Some(user)]), &disabled).is_empty());
    }
}
