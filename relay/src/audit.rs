//! `relay audit`: checks that the two databases agree, across the service boundary, asking
//! Users only through its gRPC API (`ListUsers`, and `GetUser` for a linked user that is
//! not among its student's):
//! - every `done` row's result is the user its student is linked to;
//! - no `done` row's student lacks a link;
//! - every linked user exists in Users and points back to its student;
//! - Users holds no other enabled user for a linked student (a second login for one
//!   student, which a change never reaches: the relay names the linked user; disabling it
//!   with DisableUser, naming it, settles the problem);
//! - a linked user at its student's version mirrors the student (names, e-mail, enabled
//!   while active); no linked user is at a version its student has not reached (the
//!   Student DB went back, say restored from an older backup: Users then ignores the
//!   student's changes until its version passes the user's), nor behind the version the
//!   Student DB recorded Users to have applied (the Users DB went back);
//! - no two students share a user;
//! - every enabled user Users holds belongs to a student the Student DB has (`ListUsers`
//!   a page at a time): a user left behind by a student restored away with an older
//!   backup, deleted by hand, or by the naive direct flow, holds its document number
//!   against every new student; disabling it settles the problem.
//!
//! One line per problem, then `checked=N problems=N` (N students). Reads only; safe while
//! relays run, no race reporting a false problem: done rows are read before links (see
//! `student_store::audit::students_page`); a mirror disagreement is judged again against
//! the student as it is now ([`mirror_problem`]); Users' users are read before the
//! Student DB is asked for their students, which commit before their create-user rows can
//! be delivered. (In `--link-mode direct` a user comes before its student, so an audit
//! during such traffic may name one whose student is saved right after.) A linked user
//! naming a student the DB does not have is reported twice: as another student's, and as
//! a user of no student.

use std::{
    collections::{HashMap, HashSet},
    io::Write,
};

use futures::StreamExt as _;
use proto::users::v1::User;
use sea_orm::DatabaseConnection;
use student_store::audit::{self, AuditedStudent, StudentState};
use uuid::Uuid;

use crate::users_client::{UsersClient, cannot_ask, unless_shed};

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
            if let Some(line) = mirror_problem(db, student, &held).await? {
                problem(line, out)?;
            }
        }
    }
    let mut page_token = String::new();
    loop {
        let (page, next) = unless_shed(|| users.users_page(page_token.clone(), USERS_PAGE))
            .await
            .map_err(|status| anyhow::anyhow!(cannot_ask("for its users", &status)))?;
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
    /// The linked user as Users holds it, when it is among the student's.
    linked: Option<User>,
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
        move |status: tonic::Status| anyhow::anyhow!(cannot_ask(&format!("about {what}"), &status))
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
    let linked = listed
        .iter()
        .find(|user| user.id == link.to_string())
        .cloned();
    let linked_owner = if linked.is_some() {
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
        linked,
    })
}

/// Whether the student's linked user mirrors it. A disagreement seen against the page read
/// earlier is judged again against the student's version and fields as they are now, so a
/// change committed since (which Users may have applied before it was asked) is never
/// reported: a version Users holds existed in the Student DB before Users was asked, and a
/// version's fields never change. The version Users is recorded to have applied stays the
/// page's: read before Users was asked, Users held it then (one recorded later may be one
/// Users applied after it was asked).
async fn mirror_problem(
    db: &DatabaseConnection,
    student: &AuditedStudent,
    held: &HashMap<Uuid, Held>,
) -> anyhow::Result<Option<String>> {
    let (Some(link), Some(user)) = (
        student.user_id,
        held.get(&student.id).and_then(|held| held.linked.as_ref()),
    ) else {
        return Ok(None);
    };
    if mirror_mismatch(student.id, &student.state, link, user).is_none() {
        return Ok(None);
    }
    Ok(audit::state_now(db, student.id).await?.and_then(|now| {
        let now = StudentState {
            synced_version: student.state.synced_version,
            ..now
        };
        mirror_mismatch(student.id, &now, link, user)
    }))
}

/// How `user` (linked to student `id`) fails to mirror the student's `state`, if it does:
/// at a version the student has not reached, behind the version Users is recorded to have
/// applied (Users answered it before the Student DB recorded it), or at the student's
/// version with other fields. Between the two versions is a change still on its way (or
/// failed, which `relay status` shows), not a disagreement. Names fields, never their
/// values.
fn mirror_mismatch(id: Uuid, state: &StudentState, link: Uuid, user: &User) -> Option<String> {
    let version = i64::try_from(user.source_version).unwrap_or(i64::MAX);
    if version < state.synced_version {
        return Some(format!(
            "student {id}: its user {link} in Users is at version {version}, behind version {} \
             that Users applied: the Users DB went back (an older backup restored?), and the \
             student's changes since are not in it",
            state.synced_version
        ));
    }
    if version > state.version {
        return Some(format!(
            "student {id}: its user {link} in Users is at version {version}, ahead of the \
             student's version {}: the Student DB went back (an older backup restored?), and \
             Users ignores the student's changes until its version passes {version}",
            state.version
        ));
    }
    if version < state.version {
        return None;
    }
    let differing: Vec<&str> = [
        ("first_name", user.first_name == state.first_name),
        ("last_name", user.last_name == state.last_name),
        ("email", user.email == state.email),
        ("enabled", user.enabled == state.active),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(field, _)| field)
    .collect();
    (!differing.is_empty()).then(|| {
        format!(
            "student {id}: its user {link} in Users differs from the student at version {}: {}",
            state.version,
            differing.join(", ")
        )
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
            state: state(1),
        }
    }

    fn state(version: i64) -> StudentState {
        StudentState {
            version,
            synced_version: version,
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            email: "ana@example.edu".into(),
            active: true,
        }
    }

    /// Users' copy of `state` at `source_version`.
    fn mirror(state: &StudentState, source_version: u64) -> User {
        User {
            first_name: state.first_name.clone(),
            last_name: state.last_name.clone(),
            email: state.email.clone(),
            enabled: state.active,
            source_version,
            ..User::default()
        }
    }

    #[test]
    fn a_linked_user_mirrors_its_student_at_its_version() {
        let (id, link) = (Uuid::from_u128(1), Uuid::from_u128(7));
        let at_2 = state(2);
        assert_eq!(mirror_mismatch(id, &at_2, link, &mirror(&at_2, 2)), None);
        // Behind the student, but not behind what Users applied: a change on its way.
        let on_its_way = StudentState {
            synced_version: 1,
            ..at_2.clone()
        };
        let older = User {
            first_name: "Old".into(),
            ..mirror(&at_2, 1)
        };
        assert_eq!(mirror_mismatch(id, &on_its_way, link, &older), None);
        assert_eq!(
            mirror_mismatch(id, &at_2, link, &older),
            Some(format!(
                "student {id}: its user {link} in Users is at version 1, behind version 2 that \
                 Users applied: the Users DB went back (an older backup restored?), and the \
                 student's changes since are not in it"
            ))
        );
        assert_eq!(
            mirror_mismatch(id, &at_2, link, &mirror(&at_2, 3)),
            Some(format!(
                "student {id}: its user {link} in Users is at version 3, ahead of the student's \
                 version 2: the Student DB went back (an older backup restored?), and Users \
                 ignores the student's changes until its version passes 3"
            ))
        );
        let renamed = User {
            last_name: "Other".into(),
            email: "other@example.edu".into(),
            ..mirror(&at_2, 2)
        };
        assert_eq!(
            mirror_mismatch(id, &at_2, link, &renamed),
            Some(format!(
                "student {id}: its user {link} in Users differs from the student at version 2: \
                 last_name, email"
            ))
        );
        let deactivated = StudentState {
            active: false,
            ..state(3)
        };
        assert_eq!(
            mirror_mismatch(id, &deactivated, link, &mirror(&at_2, 3)),
            Some(format!(
                "student {id}: its user {link} in Users differs from the student at version 3: \
                 enabled"
            ))
        );
        let first = User {
            first_name: "Eva".into(),
            ..mirror(&at_2, 2)
        };
        assert!(
            mirror_mismatch(id, &at_2, link, &first)
                .is_some_and(|line| line.ends_with(": first_name"))
        );
    }

    /// A rename committed after the page was read, and applied by Users before the audit
    /// asked it, is no problem: the second look judges the user against the student's
    /// version and fields as they are now, not the page's.
    #[tokio::test]
    async fn a_change_committed_after_the_page_was_read_is_no_problem() {
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, sea_query::Expr};
        use student_store::{entity::students, students::NewStudentRow, wake::RelayBell};

        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("student.db").display()
        );
        let db = migrations::open::<migrations::student::Migrator>(&url, 1)
            .await
            .expect("schema");
        let at_1 = state(1);
        let id = Uuid::now_v7();
        student_store::students::create(
            &db,
            &RelayBell::silent(),
            NewStudentRow {
                id,
                first_name: at_1.first_name.clone(),
                last_name: at_1.last_name.clone(),
                email: at_1.email.clone(),
                document_number: "DOC-1".into(),
                client_key: None,
                request_hash: "hash".into(),
                created_at: platform::db::now(),
                traceparent: String::new(),
            },
        )
        .await
        .expect("created");
        let link = Uuid::from_u128(7);
        // The page, read at version 1 (linked, synced).
        let page = AuditedStudent {
            id,
            user_id: Some(link),
            done: Vec::new(),
            state: at_1,
        };
        // Then the rename to version 2 commits, and Users applies it.
        students::Entity::update_many()
            .col_expr(students::Column::FirstName, Expr::value("Eva"))
            .col_expr(students::Column::Version, Expr::value(2))
            .filter(students::Column::Id.eq(id))
            .exec(&db)
            .await
            .expect("rename");
        let at_2 = StudentState {
            first_name: "Eva".into(),
            ..state(2)
        };
        let held = HashMap::from([(
            id,
            Held {
                users: vec![(link, true)],
                linked_owner: None,
                linked: Some(mirror(&at_2, 2)),
            },
        )]);
        assert_eq!(
            mirror_problem(&db, &page, &held).await.expect("judged"),
            None
        );
        // A user really ahead of the student (now too) is reported.
        let ahead = HashMap::from([(
            id,
            Held {
                users: vec![(link, true)],
                linked_owner: None,
                linked: Some(mirror(&at_2, 3)),
            },
        )]);
        let problem = mirror_problem(&db, &page, &ahead).await.expect("judged");
        assert!(
            problem.is_some_and(|line| line.contains("ahead of the student's version 2")),
            "judged against the version now"
        );
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
                    linked: None,
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
