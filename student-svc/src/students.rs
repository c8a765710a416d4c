//! The Student use cases. CreateStudent is the one that matters: the student and the
//! intention to create its login user are committed together, or not at all (in
//! [`student_store::students::create`]); this layer decides what a request means.

use platform::{
    db::{is_unique_violation, now},
    redact,
};
use sea_orm::DatabaseConnection;
use student_store::students::{self as store, NewStudentRow, StudentPage, StudentView};
use uuid::Uuid;

use crate::{error::Error, new_student::NewStudent};

/// Creates a student and its `create-user` outbox row in ONE transaction.
///
/// Users is not called here. With the caller's key, a retry of the same request returns
/// the student created first and writes nothing; the key with other fields is
/// [`Error::KeyReused`].
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
    let row = NewStudentRow {
        id: Uuid::now_v7(),
        first_name: new.first_name.clone(),
        last_name: new.last_name.clone(),
        email: new.email.clone(),
        document_number: new.document_number.clone(),
        client_key: new.client_key.clone(),
        request_hash: request_hash.clone(),
        created_at: now(),
    };
    match store::create(db, row).await {
        Ok(view) => {
            tracing::Span::current().record("student_id", tracing::field::display(view.student.id));
            tracing::info!(
                email = %redact::email(&view.student.email),
                document_number = %redact::document_number(&view.student.document_number),
                "student created with pending create-user effect"
            );
            Ok(view)
        }
        Err(err) if is_unique_violation(&err) => {
            // Either a concurrent request with the same key committed first (a retry: answer
            // with its student) or the document number belongs to another student.
            match replay_client_key(db, &new, &request_hash).await? {
                Some(view) => Ok(view),
                None => Err(Error::DocumentNumberTaken),
            }
        }
        Err(err) => Err(err.into()),
    }
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
    let Some(view) = store::find_by_client_key(db, key).await? else {
        return Ok(None);
    };
    if view.student.request_hash != request_hash {
        return Err(Error::KeyReused);
    }
    Ok(Some(view))
}

/// Returns one student.
pub async fn get_student(db: &DatabaseConnection, id: Uuid) -> Result<StudentView, Error> {
    store::find(db, id).await?.ok_or(Error::NotFound(id))
}

/// Returns up to `limit` students whose id comes after `after`, oldest first.
pub async fn list_students(
    db: &DatabaseConnection,
    after: Option<Uuid>,
    limit: u64,
) -> Result<StudentPage, Error> {
    Ok(store::page(db, after, limit).await?)
}
