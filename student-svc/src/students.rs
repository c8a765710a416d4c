//! The Student use cases. CreateStudent is the one that matters: the student and the
//! intention to create its login user are committed together, or not at all (in
//! [`student_store::students::create`]); this layer decides what a request means.

use platform::{
    db::{is_unique_violation, now},
    redact,
    trace::TraceContext,
};
use sea_orm::DatabaseConnection;
use student_store::students::{
    self as store, ChangeError, ChangeOutcome, ChangeRequest, NewStudentRow, StudentPage,
    StudentView,
};
use student_store::wake::RelayBell;
use uuid::Uuid;

use crate::{
    api::Link,
    error::Error,
    new_student::{NewStudent, StudentChange},
    writer::StudentWriter,
};

/// Creates a student and its `create-user` outbox row in ONE transaction.
///
/// Users is not called here. With the caller's key, a retry of the same request returns
/// the student created first and writes nothing; the key with other fields is
/// [`Error::KeyReused`].
#[tracing::instrument(skip_all, fields(student_id), err(level = "debug"))]
pub async fn create_student(
    db: &DatabaseConnection,
    writer: &StudentWriter,
    link: &Link,
    new: NewStudent,
    trace: TraceContext,
) -> Result<StudentView, Error> {
    let request_hash = new.request_hash();
    // Names that break Student's rule may still be a retry of a request accepted before
    // the rule: that one gets its student back, any other is refused.
    if let Err(violation) = new.names_follow_students_rule() {
        return match replay_client_key(db, &new, &request_hash).await? {
            Some(view) => Ok(view),
            None => Err(violation.into()),
        };
    }
    // Insert first, look the key up only when that fails: a retry or a reused key is a
    // unique violation (the student's key, the outbox row's key, or the document number,
    // taken by the retry's own student), and the first request pays no extra round trip.
    let row = NewStudentRow {
        id: Uuid::now_v7(),
        first_name: new.first_name.clone(),
        last_name: new.last_name.clone(),
        email: new.email.clone(),
        document_number: new.document_number.clone(),
        client_key: new.client_key.clone(),
        request_hash: request_hash.clone(),
        created_at: now(),
        traceparent: trace.to_string(),
    };
    let created = match link {
        Link::Outbox => writer.create(row).await,
        // The naive flow: Users first, with a fresh key, then the student. Nothing
        // remembers that Users was asked if this process dies or the answer is lost.
        Link::Direct(users) => {
            // A retry is answered from its key before Users is called again.
            if let Some(view) = replay_client_key(db, &new, &request_hash).await? {
                return Ok(view);
            }
            match users.create_user(&new, row.id, trace).await {
                Ok(user_id) => store::create_linked(db, row, user_id).await,
                Err(status) => return Err(Error::Users(status)),
            }
        }
    };
    match created {
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
            // The key was used before (a retry: answer with its student; another request
            // or a change: KeyReused), or the document number belongs to another student.
            // The key is checked first: a retry gets its student back although its
            // document number is now, of course, taken (by itself).
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
        // The key of an UpdateStudent or DeactivateStudent is another request.
        if !store::find_changes_by_client_key(db, key).await?.is_empty() {
            return Err(Error::KeyReused);
        }
        return Ok(None);
    };
    if view.student.request_hash != request_hash {
        return Err(Error::KeyReused);
    }
    Ok(Some(view))
}

/// Changes a student (UpdateStudent, DeactivateStudent): the new version and the effect it
/// decides for Users are committed together (in [`student_store::students::change`]).
///
/// The caller's key is checked first, before any rule: a retry of an accepted change gets
/// the student back, as it is now, even though its `expected_version` is no longer
/// current. A change that changes nothing spends no version and writes no effect, but its
/// key is kept like any other, so its retry is a retry too.
#[tracing::instrument(skip_all, fields(student_id = %change.id), err(level = "debug"))]
pub async fn change_student(
    db: &DatabaseConnection,
    bell: &RelayBell,
    change: StudentChange,
    trace: TraceContext,
) -> Result<StudentView, Error> {
    let request_hash = change.request_hash();
    if let Some(view) = replay_change_key(db, &change, &request_hash).await? {
        return Ok(view);
    }
    // Not a retry: Student's rule for names applies (a retry of a change accepted before
    // the rule was answered just above).
    change.names_follow_students_rule()?;
    let request = ChangeRequest {
        student_id: change.id,
        change: change.change.clone(),
        expected_version: change.expected_version,
        client: change
            .client_key
            .clone()
            .map(|key| (key, request_hash.clone())),
        at: now(),
        traceparent: trace.to_string(),
    };
    let refused = match store::change(db, bell, request).await {
        Ok(ChangeOutcome::Changed(view)) => {
            tracing::info!(
                version = view.student.version,
                active = view.student.active,
                "student changed with pending effect"
            );
            return Ok(view);
        }
        Ok(ChangeOutcome::Unchanged(view)) => return Ok(view),
        Err(ChangeError::NotFound(id)) => return Err(Error::NotFound(id)),
        Err(ChangeError::Db(err)) if !is_unique_violation(&err) => return Err(err.into()),
        Err(ChangeError::VersionMismatch { expected, current }) => {
            Error::VersionMismatch { expected, current }
        }
        Err(ChangeError::Inactive) => Error::Inactive,
        Err(ChangeError::Db(err)) => Error::Db(err),
    };
    // Each of these refusals may be this call's own key at work. A unique violation: only
    // the client key can collide, a concurrent request with it committed first. A student
    // moved past `expected_version`, or inactive: a copy of this very call (a client's
    // retry after a timeout) may have held the student's lock first and committed. The
    // same request gets its answer; another one, KeyReused; none, the refusal.
    replay_change_key(db, &change, &request_hash)
        .await?
        .ok_or(refused)
}

/// Answers a retried change from what its key already did, if anything.
async fn replay_change_key(
    db: &DatabaseConnection,
    change: &StudentChange,
    request_hash: &str,
) -> Result<Option<StudentView>, Error> {
    let Some(key) = &change.client_key else {
        return Ok(None);
    };
    let records = store::find_changes_by_client_key(db, key).await?;
    let this_change = |(student_id, stored_hash): &(Uuid, Option<String>)| {
        *student_id == change.id && stored_hash.as_deref() == Some(request_hash)
    };
    if records.iter().any(this_change) {
        return get_student(db, change.id).await.map(Some);
    }
    if !records.is_empty() {
        return Err(Error::KeyReused);
    }
    // The key of a CreateStudent is another request.
    if store::find_by_client_key(db, key).await?.is_some() {
        return Err(Error::KeyReused);
    }
    Ok(None)
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
