//! The end state every scenario must reach, checked row by row on both databases.

use std::collections::HashMap;

use sea_orm::{DatabaseConnection, EntityTrait, PaginatorTrait};
use student_store::{
    effect::CREATE_USER,
    entity::{
        outbox::{self, OutboxStatus},
        students,
    },
};
use users_svc::entity::{
    inbox::{self, SavedOutcome},
    users,
};
use uuid::Uuid;

/// Asserts that exactly `expected` students exist and every effect they decided reached
/// Users exactly once, in order: one user per student (with the student's id), linked to
/// it, showing the student's current names, e-mail and active state at the student's
/// version; every outbox row `done`; one inbox row per outbox key, whose saved answer is the
/// linked user (created, or changed and applied), executed in version order; and nothing
/// else in either database. Returns student id → user id.
pub async fn assert_each_student_linked_exactly_once(
    student_db: &DatabaseConnection,
    users_db: &DatabaseConnection,
    expected: usize,
) -> HashMap<Uuid, Uuid> {
    let students = students::Entity::find()
        .all(student_db)
        .await
        .expect("students");
    let outbox_rows = outbox::Entity::find()
        .all(student_db)
        .await
        .expect("outbox");
    let users = users::Entity::find().all(users_db).await.expect("users");
    let inbox = inbox::Entity::find().all(users_db).await.expect("inbox");
    assert_eq!(students.len(), expected, "students");
    let versions: i64 = students.iter().map(|s| s.version).sum();
    assert_eq!(
        outbox_rows.len() as i64,
        versions,
        "outbox rows: one per student version"
    );
    assert_eq!(
        users.len(),
        expected,
        "users: one per student, no duplicates"
    );
    assert_eq!(inbox.len(), outbox_rows.len(), "inbox rows: one per key");

    let links: HashMap<Uuid, Uuid> = students
        .iter()
        .map(|s| {
            (
                s.id,
                s.user_id
                    .unwrap_or_else(|| panic!("student {} not linked", s.id)),
            )
        })
        .collect();
    let users_by_id: HashMap<Uuid, &users::Model> = users.iter().map(|u| (u.id, u)).collect();
    let inbox_by_key: HashMap<&str, &inbox::Model> = inbox
        .iter()
        .map(|i| (i.idempotency_key.as_str(), i))
        .collect();

    for student in &students {
        let user = users_by_id
            .get(&links[&student.id])
            .unwrap_or_else(|| panic!("linked user of {} missing in Users", student.id));
        assert_eq!(
            (
                user.student_id,
                user.first_name.as_str(),
                user.last_name.as_str(),
                user.email.as_str(),
                user.enabled,
                user.source_version
            ),
            (
                student.id,
                student.first_name.as_str(),
                student.last_name.as_str(),
                student.email.as_str(),
                student.active,
                student.version
            ),
            "Users shows student {} as it is now",
            student.id
        );
        assert_eq!(
            student.synced_version, student.version,
            "student {} synced",
            student.id
        );
    }

    let mut executed_at: HashMap<Uuid, Vec<(i64, chrono::DateTime<chrono::Utc>)>> = HashMap::new();
    for row in &outbox_rows {
        let linked = links[&row.aggregate_id];
        assert_eq!(row.status, OutboxStatus::Done, "outbox row {}", row.id);
        assert_eq!(
            row.result.as_deref(),
            Some(linked.to_string().as_str()),
            "outbox result of row {}",
            row.id
        );
        let entry = inbox_by_key
            .get(row.idempotency_key.as_str())
            .unwrap_or_else(|| panic!("no inbox row for key {}", row.idempotency_key));
        let saved: SavedOutcome =
            serde_json::from_value(entry.result.clone()).expect("saved outcome");
        let expected_answer = if row.effect_type == CREATE_USER {
            SavedOutcome::Created { user_id: linked }
        } else {
            SavedOutcome::Applied {
                user_id: linked,
                applied: true,
            }
        };
        assert_eq!(
            saved, expected_answer,
            "inbox answer for {} ({} v{})",
            row.idempotency_key, row.effect_type, row.aggregate_version
        );
        executed_at
            .entry(row.aggregate_id)
            .or_default()
            .push((row.aggregate_version, entry.created_at));
    }
    for (student, mut executions) in executed_at {
        executions.sort();
        assert!(
            executions.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "student {student}'s effects executed in version order: {executions:?}"
        );
    }
    links
}

/// The one user in the Users DB (a test's only student's).
pub async fn the_only_user(users_db: &DatabaseConnection) -> users::Model {
    users::Entity::find()
        .one(users_db)
        .await
        .expect("users")
        .expect("the student's user")
}

/// The user `id` as stored in the Users DB; fails the test if there is none.
pub async fn stored_user(users_db: &DatabaseConnection, id: Uuid) -> users::Model {
    users::Entity::find_by_id(id)
        .one(users_db)
        .await
        .expect("read the users table")
        .unwrap_or_else(|| panic!("user {id} is stored"))
}

/// Number of users and inbox rows in the Users DB.
pub async fn users_and_inbox_rows(users_db: &DatabaseConnection) -> (u64, u64) {
    (
        users::Entity::find()
            .count(users_db)
            .await
            .expect("count users"),
        inbox::Entity::find()
            .count(users_db)
            .await
            .expect("count inbox"),
    )
}

/// Number of students and outbox rows in the Student DB.
pub async fn students_and_outbox_rows(student_db: &DatabaseConnection) -> (u64, u64) {
    (
        students::Entity::find()
            .count(student_db)
            .await
            .expect("count students"),
        outbox::Entity::find()
            .count(student_db)
            .await
            .expect("count outbox"),
    )
}

/// Asserts that every row of `rows` is done, at its first attempt: nothing about how it got
/// there (a shed call, a call refused whole) cost a retry.
pub fn assert_linked_at_first_attempt(rows: &[outbox::Model]) {
    assert!(
        rows.iter()
            .all(|row| row.status == OutboxStatus::Done && row.attempts == 1),
        "{:?}",
        rows.iter()
            .map(|row| (row.id, row.status, row.attempts))
            .collect::<Vec<_>>()
    );
}
