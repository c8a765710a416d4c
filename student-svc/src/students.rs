//! The Student use cases. CreateStudent is the one that matters: the student and the
//! intention to create its login user are committed together, or not at all.

use std::collections::HashMap;

use platform::{
    db::{begin_write, is_unique_violation, now},
    failpoint, redact,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait,
    NotSet, QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::{
    entity::{
        outbox::{self, CREATE_USER, CreateUserPayload, OutboxStatus},
        students,
    },
    error::Error,
    new_student::NewStudent,
};

/// The PostgreSQL channel notified when an outbox row commits.
pub const OUTBOX_CHANNEL: &str = "outbox_created";

/// A student with the outbox row that creates its login user (which tells the link state).
#[derive(Debug, Clone, PartialEq)]
pub struct StudentView {
    pub student: students::Model,
    pub create_user: Option<outbox::Model>,
}

/// Creates a student and its `create-user` outbox row in ONE transaction.
///
/// Both rows commit or neither does: once this returns, the intention to create the login
/// user is on disk and the relay will deliver it, whatever crashes afterwards. Users is not
/// called here. With the caller's key, a retry of the same request returns the student
/// created first and writes nothing; the key with other fields is [`Error::KeyReused`].
#[tracing::instrument(skip_all, fields(student_id), err(level = "debug"))]
pub async fn create_student(
    db: &DatabaseConnection,
    new: NewStudent,
) -> Result<StudentView, Error> {
    let request_hash = new.request_hash();
    // The key check runs before any domain rule: a retry must get its student back even
    // though its document number is now, of course, taken (by itself).
    if let Some(view) = replay_client_key(db, &new, &request_hash).await? {
        return Ok(view);
    }
    match insert_student_with_outbox(db, &new, request_hash.clone()).await {
        Ok(view) => {
            tracing::Span::current().record("student_id", tracing::field::display(view.student.id));
            tracing::info!(
                email = %redact::email(&view.student.email),
                document_number = %redact::document_number(&view.student.document_number),
                "student created with pending create-user effect"
            );
            Ok(view)
        }
        Err(Error::Db(err)) if is_unique_violation(&err) => {
            // Either a concurrent request with the same key committed first (a retry: answer
            // with its student) or the document number belongs to another student.
            match replay_client_key(db, &new, &request_hash).await? {
                Some(view) => Ok(view),
                None => Err(Error::DocumentNumberTaken),
            }
        }
        Err(err) => Err(err),
    }
}

/// The one transaction of CreateStudent.
async fn insert_student_with_outbox(
    db: &DatabaseConnection,
    new: &NewStudent,
    request_hash: String,
) -> Result<StudentView, Error> {
    let id = Uuid::now_v7();
    let created_at = now();
    let payload = CreateUserPayload {
        version: CreateUserPayload::VERSION,
        email: new.email.clone(),
        first_name: new.first_name.clone(),
        last_name: new.last_name.clone(),
        document_number: new.document_number.clone(),
        student_id: id,
    };
    let payload = serde_json::to_value(&payload)
        .map_err(|err| sea_orm::DbErr::Custom(format!("cannot encode payload: {err}")))?;

    // On PostgreSQL `available_at` is left to the column's `now()` default: the relays'
    // claims compare it with the database's clock, so it must come from that clock too.
    let available_at = match db.get_database_backend() {
        DbBackend::Postgres => NotSet,
        _ => Set(created_at),
    };

    let txn = begin_write(db).await?;
    let student = students::ActiveModel {
        id: Set(id),
        first_name: Set(new.first_name.clone()),
        last_name: Set(new.last_name.clone()),
        email: Set(new.email.clone()),
        document_number: Set(new.document_number.clone()),
        user_id: Set(None),
        client_key: Set(new.client_key.clone()),
        request_hash: Set(request_hash),
        created_at: Set(created_at),
        updated_at: Set(created_at),
    }
    .insert(&txn)
    .await?;
    let create_user = outbox::ActiveModel {
        aggregate_id: Set(id),
        effect_type: Set(CREATE_USER.to_owned()),
        payload: Set(payload),
        // Generated here, once: every delivery attempt sends this same key, which is what
        // lets Users recognise a redelivery. It never comes from the caller, so no caller
        // can collide with another student's key at Users.
        idempotency_key: Set(Uuid::new_v4().to_string()),
        status: Set(OutboxStatus::Pending),
        attempts: Set(0),
        last_error: Set(None),
        available_at,
        locked_until: Set(None),
        locked_by: Set(None),
        created_at: Set(created_at),
        processed_at: Set(None),
        result: Set(None),
        failure_kind: Set(None),
        ..Default::default()
    }
    .insert(&txn)
    .await?;
    if txn.get_database_backend() == DbBackend::Postgres {
        // Delivered at commit (never for a rolled-back row): relays LISTENing wake at once
        // instead of at their next poll.
        txn.execute_unprepared(&format!("NOTIFY {OUTBOX_CHANNEL}"))
            .await?;
    }
    failpoint::hit(failpoint::points::STUDENT_BEFORE_COMMIT).await;
    // Crash point: before this commit nothing exists; after it, both rows do.
    txn.commit().await?;
    failpoint::hit(failpoint::points::STUDENT_AFTER_COMMIT).await;
    Ok(StudentView {
        student,
        create_user: Some(create_user),
    })
}

/// Answers a CreateStudent retry from the student its key created, if there is one.
async fn replay_client_key(
    db: &DatabaseConnection,
    new: &NewStudent,
    request_hash: &str,
) -> Result<Option<StudentView>, Error> {
    let Some(key) = &new.client_key else {
        return Ok(None);
    };
    let Some(student) = students::Entity::find()
        .filter(students::Column::ClientKey.eq(key.as_str()))
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    if student.request_hash != request_hash {
        return Err(Error::KeyReused);
    }
    Ok(Some(with_link_state(db, student).await?))
}

/// Returns one student.
pub async fn get_student(db: &DatabaseConnection, id: Uuid) -> Result<StudentView, Error> {
    let student = students::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or(Error::NotFound(id))?;
    with_link_state(db, student).await
}

/// One page of students, oldest first (ids are UUIDv7, so id order is creation order).
pub struct StudentPage {
    pub students: Vec<StudentView>,
    /// The id to continue after, when there may be more.
    pub next_after: Option<Uuid>,
}

/// Returns up to `limit` students whose id comes after `after`.
pub async fn list_students(
    db: &DatabaseConnection,
    after: Option<Uuid>,
    limit: u64,
) -> Result<StudentPage, Error> {
    let mut query = students::Entity::find().order_by_asc(students::Column::Id);
    if let Some(after) = after {
        query = query.filter(students::Column::Id.gt(after));
    }
    // One more than asked tells whether another page exists.
    let mut rows = query.limit(limit + 1).all(db).await?;
    let has_more = rows.len() as u64 > limit;
    rows.truncate(limit as usize);
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

async fn with_link_state(
    db: &impl ConnectionTrait,
    student: students::Model,
) -> Result<StudentView, Error> {
    let create_user = create_user_rows(db, &[student.id]).await?.pop();
    Ok(StudentView {
        student,
        create_user,
    })
}

async fn create_user_rows(
    db: &impl ConnectionTrait,
    student_ids: &[Uuid],
) -> Result<Vec<outbox::Model>, Error> {
    if student_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(outbox::Entity::find()
        .filter(outbox::Column::AggregateId.is_in(student_ids.iter().copied()))
        .filter(outbox::Column::EffectType.eq(CREATE_USER))
        .all(db)
        .await?)
}
