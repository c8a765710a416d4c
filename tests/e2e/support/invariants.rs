//! The end state every scenario must reach, checked row by row on both databases.

use std::collections::HashMap;

use sea_orm::{DatabaseConnection, EntityTrait, PaginatorTrait};
use student_store::entity::{
    outbox::{self, OutboxStatus},
    students,
};
use users_svc::entity::{
    inbox::{self, SavedOutcome},
    users,
};
use uuid::Uuid;

/// Asserts that exactly `expected` students exist and each was linked exactly once: one
/// user per student (with the student's id), one inbox row per outbox key whose saved
/// answer is the linked user, every outbox row `done` with that user as its result, and
/// nothing else in either database. Returns student id → user id.
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
    assert_eq!(outbox_rows.len(), expected, "outbox rows");
    assert_eq!(
        users.len(),
        expected,
        "users: one per student, no duplicates"
    );
    assert_eq!(inbox.len(), expected, "inbox rows: one per key");

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

    for row in &outbox_rows {
        let linked = links[&row.aggregate_id];
        assert_eq!(row.status, OutboxStatus::Done, "outbox row {}", row.id);
        assert_eq!(
            row.result.as_deref(),
            Some(linked.to_string().as_str()),
            "outbox result of row {}",
            row.id
        );
        let user = users_by_id
            .get(&linked)
            .unwrap_or_else(|| panic!("linked user {linked} missing in Users"));
        assert_eq!(
            user.student_id, row.aggregate_id,
            "user {linked} belongs to its student"
        );
        let entry = inbox_by_key
            .get(row.idempotency_key.as_str())
            .unwrap_or_else(|| panic!("no inbox row for key {}", row.idempotency_key));
        let saved: SavedOutcome =
            serde_json::from_value(entry.result.clone()).expect("saved outcome");
        assert_eq!(
            saved,
            SavedOutcome::Created { user_id: linked },
            "inbox answer for {}",
            row.idempotency_key
        );
    }
    links
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
