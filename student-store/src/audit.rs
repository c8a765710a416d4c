//! The Student side of `relay audit`: students in pages with their delivered rows and
//! links, users linked to more than one student, and which of a set of students exist.
//! Reads only.

use std::collections::{HashMap, HashSet};

use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    sea_query::{Expr, ExprTrait},
};
use uuid::Uuid;

use crate::entity::{
    outbox::{self, OutboxStatus},
    students,
};

/// One student as the audit checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditedStudent {
    pub id: Uuid,
    /// The user the student is linked to.
    pub user_id: Option<Uuid>,
    /// Its `done` outbox rows, oldest first.
    pub done: Vec<outbox::Model>,
    /// What its user in Users should show once Users has applied `state.version`.
    pub state: StudentState,
}

/// The fields of a student its user in Users mirrors, at the student's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StudentState {
    pub version: i64,
    /// The highest version Users is recorded to have applied.
    pub synced_version: i64,
    pub first_name: String,
    pub last_name: String,
    pub email: String,
    /// A deactivated student's user is disabled.
    pub active: bool,
}

impl From<&students::Model> for StudentState {
    fn from(student: &students::Model) -> Self {
        Self {
            version: student.version,
            synced_version: student.synced_version,
            first_name: student.first_name.clone(),
            last_name: student.last_name.clone(),
            email: student.email.clone(),
            active: student.active,
        }
    }
}

/// The next `limit` students after `after` (by id), each with its `done` rows.
///
/// The rows are read before the links: a row is marked done in the same transaction that
/// links its student, so every done row read here has its link visible to the read that
/// follows, even while relays keep delivering.
pub async fn students_page(
    db: &DatabaseConnection,
    after: Option<Uuid>,
    limit: u64,
) -> Result<Vec<AuditedStudent>, DbErr> {
    let mut ids = students::Entity::find()
        .select_only()
        .column(students::Column::Id)
        .order_by_asc(students::Column::Id)
        .limit(limit);
    if let Some(after) = after {
        ids = ids.filter(students::Column::Id.gt(after));
    }
    let ids: Vec<Uuid> = ids.into_tuple().all(db).await?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut done: HashMap<Uuid, Vec<outbox::Model>> = HashMap::new();
    let rows = outbox::Entity::find()
        .filter(outbox::Column::AggregateId.is_in(ids.iter().copied()))
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .order_by_asc(outbox::Column::Id)
        .all(db)
        .await?;
    for row in rows {
        done.entry(row.aggregate_id).or_default().push(row);
    }
    let students = students::Entity::find()
        .filter(students::Column::Id.is_in(ids.iter().copied()))
        .order_by_asc(students::Column::Id)
        .all(db)
        .await?;
    Ok(students
        .iter()
        .map(|student| AuditedStudent {
            id: student.id,
            user_id: student.user_id,
            done: done.remove(&student.id).unwrap_or_default(),
            state: StudentState::from(student),
        })
        .collect())
}

/// The ids of the next `limit` linked students after `after` (by id).
pub async fn linked_students_page(
    db: &DatabaseConnection,
    after: Option<Uuid>,
    limit: u64,
) -> Result<Vec<Uuid>, DbErr> {
    let mut ids = students::Entity::find()
        .select_only()
        .column(students::Column::Id)
        .filter(students::Column::UserId.is_not_null())
        .order_by_asc(students::Column::Id)
        .limit(limit);
    if let Some(after) = after {
        ids = ids.filter(students::Column::Id.gt(after));
    }
    ids.into_tuple().all(db).await
}

/// The student `id` as it is now, for a second look at a disagreement found in a page read
/// earlier: a change committed since then may explain it.
pub async fn state_now(db: &DatabaseConnection, id: Uuid) -> Result<Option<StudentState>, DbErr> {
    Ok(students::Entity::find_by_id(id)
        .one(db)
        .await?
        .as_ref()
        .map(StudentState::from))
}

/// Every user linked to more than one student, with those students (by id).
pub async fn shared_users(db: &DatabaseConnection) -> Result<Vec<(Uuid, Vec<Uuid>)>, DbErr> {
    let users: Vec<Uuid> = students::Entity::find()
        .select_only()
        .column(students::Column::UserId)
        .filter(students::Column::UserId.is_not_null())
        .group_by(students::Column::UserId)
        .having(Expr::col(students::Column::Id).count().gt(1))
        .order_by_asc(students::Column::UserId)
        .into_tuple()
        .all(db)
        .await?;
    let mut shared = Vec::with_capacity(users.len());
    for user in users {
        let students: Vec<Uuid> = students::Entity::find()
            .select_only()
            .column(students::Column::Id)
            .filter(students::Column::UserId.eq(user))
            .order_by_asc(students::Column::Id)
            .into_tuple()
            .all(db)
            .await?;
        shared.push((user, students));
    }
    Ok(shared)
}

/// Which of `ids` are students (a page of Users' users names their students; those not
/// here belong to no student of this DB). The services never delete a student, and in the
/// outbox flow a student commits before its create-user row can be delivered, so a user's
/// student exists before the user does (the direct flow creates the user first).
pub async fn existing_students(
    db: &DatabaseConnection,
    ids: &HashSet<Uuid>,
) -> Result<HashSet<Uuid>, DbErr> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let found: Vec<Uuid> = students::Entity::find()
        .select_only()
        .column(students::Column::Id)
        .filter(students::Column::Id.is_in(ids.iter().copied()))
        .into_tuple()
        .all(db)
        .await?;
    Ok(found.into_iter().collect())
}
