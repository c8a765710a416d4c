//! The student side of the Student DB: the transaction that writes a student together with
//! the effect its creation decides, and the reads behind GetStudent and ListStudents.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use platform::{db::begin_write, failpoint};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr,
    EntityTrait, NotSet, QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::{
    OUTBOX_CHANNEL,
    effect::{CREATE_USER, CreateUserPayload, Effect},
    entity::{
        outbox::{self, OutboxStatus},
        students,
    },
};

/// A student with the outbox row that creates its login user (which tells the link state).
#[derive(Debug, Clone, PartialEq)]
pub struct StudentView {
    pub student: students::Model,
    pub create_user: Option<outbox::Model>,
}

/// What a new student is made of, validated by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewStudentRow {
    pub id: Uuid,
    pub first_name: String,
    pub last_name: String,
    pub email: String,
    pub document_number: String,
    /// The caller's CreateStudent key, if any (unique).
    pub client_key: Option<String>,
    /// Fingerprint of the CreateStudent request.
    pub request_hash: String,
    pub created_at: DateTime<Utc>,
}

/// Writes a student and its `create-user` outbox row in ONE transaction.
///
/// Both rows commit or neither does: once this returns, the intention to create the login
/// user is on disk and the relay will deliver it, whatever crashes afterwards. A unique
/// violation (the client key, or the document number) is returned as the database error
/// for the caller to tell apart.
pub async fn create(db: &DatabaseConnection, new: NewStudentRow) -> Result<StudentView, DbErr> {
    let effect = Effect::CreateUser(CreateUserPayload {
        version: CreateUserPayload::VERSION,
        email: new.email.clone(),
        first_name: new.first_name.clone(),
        last_name: new.last_name.clone(),
        document_number: new.document_number.clone(),
        student_id: new.id,
    });
    // On PostgreSQL `available_at` is left to the column's `now()` default: the relays'
    // claims compare it with the database's clock, so it must come from that clock too.
    let available_at = match db.get_database_backend() {
        DbBackend::Postgres => NotSet,
        _ => Set(new.created_at),
    };

    let txn = begin_write(db).await?;
    let student = students::ActiveModel {
        id: Set(new.id),
        first_name: Set(new.first_name),
        last_name: Set(new.last_name),
        email: Set(new.email),
        document_number: Set(new.document_number),
        user_id: Set(None),
        client_key: Set(new.client_key),
        request_hash: Set(new.request_hash),
        created_at: Set(new.created_at),
        updated_at: Set(new.created_at),
    }
    .insert(&txn)
    .await?;
    let create_user = outbox::ActiveModel {
        aggregate_id: Set(new.id),
        effect_type: Set(effect.effect_type().to_owned()),
        payload: Set(effect.payload()),
        // Generated here, once: every delivery attempt sends this same key, which is what
        // lets Users recognise a redelivery. It never comes from the caller, so no caller
        // can collide with another student's key at Users.
        idempotency_key: Set(Uuid::new_v4().to_string()),
        status: Set(OutboxStatus::Pending),
        attempts: Set(0),
        last_error: Set(None),
        error_code: Set(None),
        available_at,
        locked_until: Set(None),
        locked_by: Set(None),
        created_at: Set(new.created_at),
        processed_at: Set(None),
        result: Set(None),
        failure_kind: Set(None),
        ..Default::default()
    }
    .insert(&txn)
    .await?;
    notify_relays(&txn).await?;
    failpoint::hit(failpoint::points::STUDENT_BEFORE_COMMIT).await;
    // Crash point: before this commit nothing exists; after it, both rows do.
    txn.commit().await?;
    failpoint::hit(failpoint::points::STUDENT_AFTER_COMMIT).await;
    Ok(StudentView {
        student,
        create_user: Some(create_user),
    })
}

/// On PostgreSQL, wakes the relays LISTENing on [`OUTBOX_CHANNEL`] when `txn` commits
/// (never for a rolled-back row), so they claim at once instead of at their next poll.
async fn notify_relays(txn: &impl ConnectionTrait) -> Result<(), DbErr> {
    if txn.get_database_backend() == DbBackend::Postgres {
        txn.execute_unprepared(&format!("NOTIFY {OUTBOX_CHANNEL}"))
            .await?;
    }
    Ok(())
}

/// The student whose CreateStudent used `client_key`, if any.
pub async fn find_by_client_key(
    db: &DatabaseConnection,
    client_key: &str,
) -> Result<Option<StudentView>, DbErr> {
    let student = students::Entity::find()
        .filter(students::Column::ClientKey.eq(client_key))
        .one(db)
        .await?;
    match student {
        Some(student) => Ok(Some(with_create_user(db, student).await?)),
        None => Ok(None),
    }
}

/// One student, if it exists.
pub async fn find(db: &DatabaseConnection, id: Uuid) -> Result<Option<StudentView>, DbErr> {
    match students::Entity::find_by_id(id).one(db).await? {
        Some(student) => Ok(Some(with_create_user(db, student).await?)),
        None => Ok(None),
    }
}

/// One page of students, oldest first (ids are UUIDv7, so id order is creation order).
pub struct StudentPage {
    pub students: Vec<StudentView>,
    /// The id to continue after, when there may be more.
    pub next_after: Option<Uuid>,
}

/// Returns up to `limit` students whose id comes after `after`.
pub async fn page(
    db: &DatabaseConnection,
    after: Option<Uuid>,
    limit: u64,
) -> Result<StudentPage, DbErr> {
    let mut query = students::Entity::find().order_by_asc(students::Column::Id);
    if let Some(after) = after {
        query = query.filter(students::Column::Id.gt(after));
    }
    // One more than asked tells whether another page exists.
    let mut rows = query.limit(limit + 1).all(db).await?;
    let has_more = rows.len() as u64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_after = if has_more {
        rows.last().map(|s| s.id)
    } else {
        None
    };

    let ids: Vec<Uuid> = rows.iter().map(|s| s.id).collect();
    let mut effects: HashMap<Uuid, outbox::Model> = create_user_rows(db, &ids)
        .await?
        .into_iter()
        .map(|row| (row.aggregate_id, row))
        .collect();
    let students = rows
        .into_iter()
        .map(|student| StudentView {
            create_user: effects.remove(&student.id),
            student,
        })
        .collect();
    Ok(StudentPage {
        students,
        next_after,
    })
}

async fn with_create_user(
    db: &impl ConnectionTrait,
    student: students::Model,
) -> Result<StudentView, DbErr> {
    let create_user = create_user_rows(db, &[student.id]).await?.pop();
    Ok(StudentView {
        student,
        create_user,
    })
}

async fn create_user_rows(
    db: &impl ConnectionTrait,
    student_ids: &[Uuid],
) -> Result<Vec<outbox::Model>, DbErr> {
    if student_ids.is_empty() {
        return Ok(Vec::new());
    }
    outbox::Entity::find()
        .filter(outbox::Column::AggregateId.is_in(student_ids.iter().copied()))
        .filter(outbox::Column::EffectType.eq(CREATE_USER))
        .all(db)
        .await
}
